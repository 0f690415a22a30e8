//! Pieces every supervisor of the runtime shares: actor kinds, restart histories with
//! exponential backoff, and heartbeats for stall detection.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lcm_core::config::RuntimeConfig;
use serde::Serialize;

/// The kinds of actors in the runtime (see docs/ARCHITECTURE.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// The root supervisor.
    Runtime,
    /// One per live session.
    Session,
    /// Schedules compactions and supervises their workers.
    Compactor,
    /// One per running compaction (a child of the compactor).
    CompactionWorker,
    /// Renders context states.
    Assembler,
    /// Keeps the search index caught up with the store.
    Indexer,
    /// Checks the store's invariants.
    Integrity,
    /// Runs map jobs.
    MapWorkerPool,
    /// Runs sub-agents.
    Delegation,
}

impl fmt::Display for ActorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ActorKind::Runtime => "runtime",
            ActorKind::Session => "session",
            ActorKind::Compactor => "compactor",
            ActorKind::CompactionWorker => "compaction worker",
            ActorKind::Assembler => "assembler",
            ActorKind::Indexer => "indexer",
            ActorKind::Integrity => "integrity",
            ActorKind::MapWorkerPool => "map worker pool",
            ActorKind::Delegation => "delegation",
        })
    }
}

/// Recent restarts of one actor, for backoff and the restart limit.
#[derive(Debug, Default)]
pub(crate) struct RestartHistory {
    recent: VecDeque<Instant>,
    pub(crate) total: u64,
}

impl RestartHistory {
    /// Records a failure at `now`; returns the failures within the window (this one included).
    pub(crate) fn record(&mut self, now: Instant, config: &RuntimeConfig) -> u32 {
        let window = Duration::from_secs(config.restart_window_s);
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        self.total += 1;
        self.recent.len() as u32
    }

    /// When the actor may start again after its latest failure (`now` if it never failed).
    pub(crate) fn ready_at(&self, now: Instant, config: &RuntimeConfig) -> Instant {
        match self.recent.back() {
            Some(last) => *last + backoff(self.recent.len() as u32, config),
            None => now,
        }
    }
}

/// The delay before the `failures`-th restart within the window: the base delay doubling per
/// failure, capped.
pub(crate) fn backoff(failures: u32, config: &RuntimeConfig) -> Duration {
    let exp = failures.saturating_sub(1).min(20);
    let ms = config
        .restart_backoff_ms
        .saturating_mul(1u64 << exp)
        .min(config.restart_backoff_max_ms);
    Duration::from_millis(ms)
}

/// Whether an actor is working, and since when: the supervisor kills an actor that stays busy
/// with one message longer than the stall timeout.
#[derive(Debug)]
pub(crate) struct Heartbeat {
    epoch: Instant,
    /// Milliseconds since `epoch` + 1 when the current message started; 0 when idle.
    busy_since: AtomicU64,
}

impl Heartbeat {
    pub(crate) fn new() -> Arc<Heartbeat> {
        Arc::new(Heartbeat {
            epoch: Instant::now(),
            busy_since: AtomicU64::new(0),
        })
    }

    /// Marks the actor busy until the guard drops.
    pub(crate) fn busy(self: &Arc<Self>) -> BusyGuard {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        self.busy_since.store(now, Ordering::Relaxed);
        BusyGuard(Arc::clone(self))
    }

    /// How long the actor has been busy with its current message, if it is.
    pub(crate) fn busy_for(&self) -> Option<Duration> {
        match self.busy_since.load(Ordering::Relaxed) {
            0 => None,
            since => {
                let now = self.epoch.elapsed().as_millis() as u64 + 1;
                Some(Duration::from_millis(now.saturating_sub(since)))
            }
        }
    }

    /// Whether the actor is stuck according to `config` (never when stall detection is off).
    pub(crate) fn stalled(&self, config: &RuntimeConfig) -> Option<Duration> {
        if config.stall_timeout_s == 0 {
            return None;
        }
        self.busy_for()
            .filter(|d| *d > Duration::from_secs(config.stall_timeout_s))
    }
}

/// Clears the busy mark when dropped (also on panic).
pub(crate) struct BusyGuard(Arc<Heartbeat>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy_since.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let config = RuntimeConfig {
            restart_backoff_ms: 100,
            restart_backoff_max_ms: 1_000,
            ..RuntimeConfig::default()
        };
        assert_eq!(backoff(1, &config), Duration::from_millis(100));
        assert_eq!(backoff(2, &config), Duration::from_millis(200));
        assert_eq!(backoff(4, &config), Duration::from_millis(800));
        assert_eq!(backoff(5, &config), Duration::from_millis(1_000));
        assert_eq!(backoff(60, &config), Duration::from_millis(1_000));
    }

    #[test]
    fn restart_history_forgets_failures_outside_the_window() {
        let config = RuntimeConfig {
            restart_window_s: 10,
            ..RuntimeConfig::default()
        };
        let mut h = RestartHistory::default();
        let t0 = Instant::now();
        assert_eq!(h.record(t0, &config), 1);
        assert_eq!(h.record(t0 + Duration::from_secs(1), &config), 2);
        assert_eq!(h.record(t0 + Duration::from_secs(30), &config), 1);
        assert_eq!(h.total, 3);
    }

    #[test]
    fn heartbeat_reports_busy_time_until_the_guard_drops() {
        let hb = Heartbeat::new();
        assert!(hb.busy_for().is_none());
        {
            let _g = hb.busy();
            std::thread::sleep(Duration::from_millis(5));
            assert!(hb.busy_for().is_some_and(|d| d >= Duration::from_millis(4)));
        }
        assert!(hb.busy_for().is_none());
    }
}
