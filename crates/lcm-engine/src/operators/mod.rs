//! The map operators (`llm_map`, and the shared machinery `agentic_map` will use; paper section
//! 3.1 and appendix C.2), as plain library code without actors.
//!
//! A map applies one prompt to every item of a JSONL file and writes one JSON result per item,
//! validated against a JSON Schema, to a JSONL output file. The pieces:
//!
//! - [`input`]: where files may be ([`input::resolve_input`] / [`input::resolve_output`] inside
//!   the configured roots, `..` and symlinks resolved first) and the streaming JSONL reader
//!   ([`input::JsonlItems`]): one line at a time, oversized, non-UTF-8 and non-JSON lines become
//!   failed items, blank lines are skipped.
//! - [`llm_map`]: the per-item work: [`llm_map::validate_schema`] (before anything runs),
//!   [`llm_map::run_item`] (one stateless provider call, the answer's JSON extracted and
//!   validated), the [`llm_map::ItemWorker`] trait a runner drives, and
//!   [`llm_map::create_map_job`] (validate, resolve, stream the input into the store).
//! - [`runner`]: [`runner::MapRunner`], which drives a job to its end with N concurrent tasks
//!   claiming from the store (leases, retries with feedback, batched commits, progress,
//!   cancellation). The `MapWorkerPool` actor wraps it.
//! - [`output`]: [`output::write_output`], the output JSONL in input order, written atomically,
//!   and the compact [`output::MapSummary`] a tool returns instead of the output itself.
//!
//! Execution is exactly-once per item through the store (see `lcm_store::map_jobs`): a crash at
//! any point loses at most the attempts in flight, and [`runner::MapRunner`] on a resumed job
//! runs only the items without a result.
//!
//! Store calls are blocking redb work; everything async here runs them on tokio's blocking
//! pool.

pub mod agentic;
pub mod input;
pub mod llm_map;
pub mod output;
pub mod runner;

use std::path::PathBuf;
use std::sync::Arc;

use lcm_llm::ProviderError;
use lcm_store::{Store, StoreError};
use tokio::sync::watch;

pub use input::{JsonlItems, resolve_input, resolve_output};
pub use llm_map::{
    ItemAttempt, ItemWorker, LlmItemWorker, MapRequest, OutputValidator, create_map_job, run_item,
    run_llm_map, validate_schema,
};
pub use output::{MapSummary, write_output};
pub use runner::{MapRunReport, MapRunner, ProgressReport, RunEnd, RunnerOptions};

/// Why a map operation could not be done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// The output schema is not a valid JSON Schema (checked before any provider call).
    #[error("invalid output schema: {0}")]
    InvalidSchema(String),
    /// The request makes no sense (empty prompt, zero concurrency, ...).
    #[error("invalid map request: {0}")]
    InvalidRequest(String),
    /// A path is outside the allowed roots, missing, or not the right kind of file.
    #[error("{path}: {reason}")]
    Path {
        /// The path as given.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider failed in a way no retry of an item can fix (credentials, configuration):
    /// the run stopped, its claimed items were given back, the job can be resumed.
    #[error("the provider cannot serve this job: {0}")]
    Provider(ProviderError),
    /// A background task ended abnormally.
    #[error("a background task failed: {0}")]
    Task(String),
}

/// A cancellation flag shared by clones: [`CancelToken::cancel`] once, every holder sees it.
#[derive(Debug, Clone)]
pub struct CancelToken(Arc<watch::Sender<bool>>);

impl Default for CancelToken {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelToken {
    /// A token not cancelled yet.
    pub fn new() -> Self {
        CancelToken(Arc::new(watch::channel(false).0))
    }

    /// Cancels (idempotent).
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once the token is cancelled (at once if it already is).
    pub async fn cancelled(&self) {
        let mut receiver = self.0.subscribe();
        // The sender lives in `self`, so the channel cannot close while we wait.
        let _ = receiver.wait_for(|cancelled| *cancelled).await;
    }
}

/// Runs a blocking store call on tokio's blocking pool. A panic in it is resumed here.
pub(crate) async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, MapError> {
    let store = Arc::clone(store);
    match tokio::task::spawn_blocking(move || f(&store)).await {
        Ok(result) => result.map_err(MapError::from),
        Err(e) => match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => Err(MapError::Task(e.to_string())),
        },
    }
}

/// Runs blocking work (files, store) on tokio's blocking pool. A panic in it is resumed here.
pub(crate) async fn blocking_map<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MapError> + Send + 'static,
) -> Result<T, MapError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => Err(MapError::Task(e.to_string())),
        },
    }
}
