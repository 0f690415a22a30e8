//! The runtime's error type.

use std::time::Duration;

use lcm_core::ids::SessionId;
use lcm_store::StoreError;

use super::supervision::ActorKind;
use crate::compaction::CompactionError;

/// Why a runtime call failed. The message says what happened and, where it matters, whether
/// the call may be retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The store refused or failed (unknown ids, invalid messages, I/O).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A compaction could not run.
    #[error(transparent)]
    Compaction(#[from] CompactionError),
    /// The session's actor crashed too often within the restart window; it is refused until
    /// the runtime restarts (other sessions are unaffected).
    #[error(
        "session {session} is refused: its actor failed {failures} times within the restart window"
    )]
    SessionQuarantined { session: SessionId, failures: u32 },
    /// An append without a source key reached a session actor that died before answering: it
    /// may or may not be stored. Give messages a `source_key` to make appends safely retryable
    /// (the runtime then retries them itself).
    #[error(
        "the append to {session} was not acknowledged (its actor died); it may or may not be stored: set `source_key` on messages to make retries safe"
    )]
    Unacknowledged { session: SessionId },
    /// An actor needed by the call is unavailable.
    #[error("the {kind} actor is unavailable: {detail}")]
    Unavailable { kind: ActorKind, detail: String },
    /// The actor is waiting out its restart backoff; retry after the delay.
    #[error("the {kind} actor is restarting; retry in {retry_after:?}")]
    Restarting {
        kind: ActorKind,
        retry_after: Duration,
    },
    /// No answer within `runtime.call_timeout_s`.
    #[error("the {kind} actor did not answer within {timeout:?}")]
    Timeout { kind: ActorKind, timeout: Duration },
    /// The runtime is shutting down and takes no new work.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// The context cannot be made to fit the budget asked for.
    #[error(transparent)]
    Budget(#[from] crate::assembly::BudgetError),
    /// Bad input from the host.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// The runtime could not start.
    #[error("could not start the runtime: {0}")]
    Start(String),
    /// A tool call failed (the message is written for the model).
    #[error("{0}")]
    Tool(String),
}
