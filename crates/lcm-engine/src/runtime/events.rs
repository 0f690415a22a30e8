//! Events a host can subscribe to ([`crate::runtime::Runtime::subscribe`]).

use lcm_core::ids::{JobId, SessionId, SummaryId};
use serde::Serialize;

use super::supervision::ActorKind;

/// Something the runtime did or suffered. Delivered on a broadcast channel: a slow subscriber
/// misses old events (it is told how many) rather than slowing the runtime.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RuntimeEvent {
    /// A session actor started (first use, or again after idling or a crash).
    SessionStarted { session: SessionId },
    /// A session actor stopped (`reason`: idle, shutdown).
    SessionStopped { session: SessionId, reason: String },
    /// A compaction of `session` was requested (the context is above the soft threshold).
    CompactionStarted {
        session: SessionId,
        budget: u64,
        tokens: u64,
    },
    /// A compaction run ended.
    CompactionFinished {
        session: SessionId,
        passes: usize,
        tokens_before: u64,
        tokens_after: u64,
        provider_calls: u32,
        attempts: u32,
        /// Summaries written at each escalation level: `[normal, aggressive, deterministic
        /// truncation]` (paper section 2.1, levels 1 to 3).
        summaries_by_level: [u32; 3],
    },
    /// A compaction wrote a summary (one per pass applied, before its run's
    /// `CompactionFinished`).
    SummaryWritten {
        session: SessionId,
        summary: SummaryId,
        /// The escalation level that produced it (1 normal, 2 aggressive, 3 deterministic
        /// truncation).
        level: u8,
        /// The model label recorded with it (the summariser's label after its last call, or
        /// `deterministic` at level 3).
        model: String,
        /// Whether the run summarised with the session's own summariser (one a host registered
        /// with [`crate::runtime::SessionHandle::set_summarizer`]) rather than the runtime's.
        session_summarizer: bool,
    },
    /// A compaction failed after its attempts; the context is unchanged since the last applied
    /// pass (every pass is atomic).
    CompactionFailed {
        session: SessionId,
        attempts: u32,
        error: String,
    },
    /// An actor failed (panicked, returned an error, or was killed as stuck).
    ActorFailed {
        kind: ActorKind,
        session: Option<SessionId>,
        error: String,
    },
    /// An actor was restarted after `delay_ms`.
    ActorRestarted {
        kind: ActorKind,
        restarts: u64,
        delay_ms: u64,
    },
    /// An actor was busy with one message past `runtime.stall_timeout_s` and was killed.
    ActorStalled {
        kind: ActorKind,
        session: Option<SessionId>,
        busy_ms: u64,
    },
    /// A session failed too often and is refused until the runtime restarts.
    SessionQuarantined { session: SessionId, failures: u32 },
    /// The search index caught up with the store.
    IndexCaughtUp { indexed: u64, watermark: u64 },
    /// A map job made progress (after each batch of committed answers).
    MapProgress {
        job: JobId,
        total: u64,
        completed: u64,
        failed: u64,
        running: u64,
        rate_per_s: f64,
        eta_s: Option<f64>,
    },
    /// A map job's run ended and its output was written.
    MapFinished {
        job: JobId,
        completed: u64,
        failed: u64,
    },
    /// An integrity check ran.
    IntegrityChecked { violations: usize, repaired: usize },
}
