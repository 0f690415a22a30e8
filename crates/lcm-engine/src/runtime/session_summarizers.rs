//! Per-session summarisers: a host may have one session's compactions summarised by a
//! summariser of its own (the proxy registers one over the client's model and credentials)
//! instead of the runtime's default.
//!
//! An entry lives while its host keeps refreshing it: one not refreshed for its idle time is
//! dropped, and with it whatever it holds (credentials included). Expiry is checked lazily, on
//! every access to the entry (a lookup by a compaction, a refresh, a count), and by a sweep of
//! every entry on the compactor's heartbeat (`runtime.heartbeat_ms`, at most once a second),
//! so an idle entry is gone within about a second of expiring even when nothing asks for it.
//! Shutdown drops every entry.
//!
//! A compaction run looks its session's summariser up once, when it starts: a run already
//! under way when its entry is refreshed, replaced or expires finishes with the summariser it
//! started with. Nothing here is ever stored or logged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lcm_core::ids::SessionId;
use lcm_llm::summarize::Summarizer;

/// Shortest time between two sweeps of every entry.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Entry {
    summarizer: Arc<dyn Summarizer>,
    /// What the registrant says the summariser was built from (`None`: never matches).
    tag: Option<u64>,
    idle: Duration,
    refreshed: Instant,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.refreshed) >= self.idle
    }
}

/// The registry (one per runtime, in `Shared`).
pub(crate) struct SessionSummarizers {
    entries: Mutex<HashMap<SessionId, Entry>>,
    last_sweep: Mutex<Instant>,
}

impl Default for SessionSummarizers {
    fn default() -> Self {
        SessionSummarizers {
            entries: Mutex::new(HashMap::new()),
            last_sweep: Mutex::new(Instant::now()),
        }
    }
}

impl SessionSummarizers {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionId, Entry>> {
        // Plain inserts and removals: the map stays consistent under a panic.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The live summariser of `session`, if any (an expired entry is dropped).
    pub(crate) fn get(&self, session: SessionId) -> Option<Arc<dyn Summarizer>> {
        let now = Instant::now();
        let mut entries = self.lock();
        match entries.get(&session) {
            Some(entry) if !entry.expired(now) => Some(Arc::clone(&entry.summarizer)),
            Some(_) => {
                let gone = entries.remove(&session);
                drop(entries);
                drop(gone);
                None
            }
            None => None,
        }
    }

    /// Registers `summarizer` for `session` (replacing any entry), its idle clock starting now.
    pub(crate) fn set(
        &self,
        session: SessionId,
        summarizer: Arc<dyn Summarizer>,
        tag: Option<u64>,
        idle: Duration,
    ) {
        let entry = Entry {
            summarizer,
            tag,
            idle,
            refreshed: Instant::now(),
        };
        let replaced = self.lock().insert(session, entry);
        drop(replaced);
    }

    /// Restarts the idle clock of `session`'s entry (with `idle` as its new idle time) if it is
    /// live and was registered with `tag`; whether it was. An expired entry is dropped.
    pub(crate) fn refresh(&self, session: SessionId, tag: u64, idle: Duration) -> bool {
        let now = Instant::now();
        let mut entries = self.lock();
        let Some(entry) = entries.get_mut(&session) else {
            return false;
        };
        if entry.expired(now) {
            let gone = entries.remove(&session);
            drop(entries);
            drop(gone);
            return false;
        }
        if entry.tag != Some(tag) {
            return false;
        }
        entry.refreshed = now;
        entry.idle = idle;
        true
    }

    /// Drops `session`'s entry; whether a live one was there.
    pub(crate) fn remove(&self, session: SessionId) -> bool {
        let now = Instant::now();
        let gone = self.lock().remove(&session);
        gone.is_some_and(|entry| !entry.expired(now))
    }

    /// Live entries (expired ones are dropped first).
    pub(crate) fn len(&self) -> usize {
        self.sweep_now();
        self.lock().len()
    }

    /// Drops expired entries, at most once per [`SWEEP_EVERY`]; how many it dropped.
    pub(crate) fn sweep(&self) -> usize {
        {
            let mut last = self.last_sweep.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() < SWEEP_EVERY {
                return 0;
            }
            *last = Instant::now();
        }
        self.sweep_now()
    }

    fn sweep_now(&self) -> usize {
        let now = Instant::now();
        let mut gone = Vec::new();
        {
            let mut entries = self.lock();
            entries.retain(|_, entry| {
                if entry.expired(now) {
                    gone.push(Arc::clone(&entry.summarizer));
                    false
                } else {
                    true
                }
            });
        }
        let dropped = gone.len();
        if dropped > 0 {
            tracing::debug!(dropped, "idle session summarisers dropped");
        }
        dropped
    }

    /// Drops every entry (shutdown).
    pub(crate) fn clear(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::{Encoding, TokenCounter};
    use lcm_llm::extractive::ExtractiveSummarizer;

    fn summarizer() -> Arc<dyn Summarizer> {
        Arc::new(ExtractiveSummarizer::new(TokenCounter::new(
            Encoding::O200kBase,
        )))
    }

    #[test]
    fn entries_expire_unless_refreshed_with_their_tag() {
        let registry = SessionSummarizers::default();
        let (a, b) = (SessionId(1), SessionId(2));
        let idle = Duration::from_millis(80);
        registry.set(a, summarizer(), Some(7), idle);
        registry.set(b, summarizer(), None, idle);
        assert!(registry.get(a).is_some());
        assert_eq!(registry.len(), 2);
        // Another tag does not refresh; an untagged entry never matches.
        assert!(!registry.refresh(a, 8, idle));
        assert!(!registry.refresh(b, 7, idle));
        std::thread::sleep(Duration::from_millis(50));
        assert!(registry.refresh(a, 7, idle));
        std::thread::sleep(Duration::from_millis(50));
        // a was refreshed 50 ms ago; b was registered 100 ms ago.
        assert!(registry.get(a).is_some());
        assert!(registry.get(b).is_none());
        assert_eq!(registry.len(), 1);
        std::thread::sleep(Duration::from_millis(90));
        assert_eq!(registry.len(), 0);
        assert!(!registry.refresh(a, 7, idle));
        registry.set(a, summarizer(), Some(7), Duration::from_secs(60));
        assert!(registry.remove(a));
        assert!(!registry.remove(a));
        registry.set(a, summarizer(), Some(7), Duration::from_secs(60));
        registry.clear();
        assert!(registry.get(a).is_none());
    }
}
