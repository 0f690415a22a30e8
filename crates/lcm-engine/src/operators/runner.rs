//! [`MapRunner`]: drives one map job to its end with N concurrent attempts claimed from the
//! store.
//!
//! One loop owns the job: it claims as many items as there are free slots (one store
//! transaction), starts one tokio task per claimed item (the [`ItemWorker`] under the job's
//! timeout), waits for attempts to end, and commits every ended attempt that is ready in one
//! store transaction. The store decides what each outcome means (see `lcm_store::map_jobs`):
//! a valid result completes the item; an invalid answer, a timeout or a transient provider
//! error makes it pending again (with the validation error as feedback) until its attempts are
//! used up; a permanent error fails it at once.
//!
//! Provider states that are not the item's fault do not use its attempts: when the provider's
//! circuit breaker is open the item is given back and claiming pauses until the breaker lets a
//! probe through; when the provider refuses the credentials or is misconfigured, the run stops
//! with [`MapError::Provider`], its claimed items are given back, and the job stays running, to
//! be resumed once the provider is fixed.
//!
//! When the [`CancelToken`] fires, the runner stops claiming, aborts its attempts in flight,
//! commits those that had ended, gives the others back (pending, attempts not counted) and
//! returns [`RunEnd::Stopped`]; the job stays as it is (the caller cancels it in the store if
//! that is what it wants). A job cancelled in the store by someone else ends the run once the
//! attempts in flight are in ([`RunEnd::Cancelled`]).
//!
//! Dropping the run future (a crash, as far as the store can tell) aborts the attempts; the
//! items stay running until `Store::resume` (at startup) or their leases expire.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lcm_core::config::MapConfig;
use lcm_core::ids::JobId;
use lcm_core::time::Timestamp;
use lcm_llm::{Provider, ProviderError};
use lcm_store::{
    ClaimedItem, CommitOutcome, FailureKind, ItemFailure, ItemOutcome, ItemReport, JobStatus,
    MapJob, MapProgress, Store,
};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::llm_map::{ItemAttempt, ItemWorker, LlmItemWorker};
use super::{CancelToken, MapError, blocking};

/// How a runner works, beyond what the job says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerOptions {
    /// Who claims (unique per runner: answers are accepted only from the current claim).
    pub owner: String,
    /// How long a claimed item belongs to this runner before another may take it over. Must
    /// exceed the job's timeout.
    pub lease: Duration,
    /// How often to look again for claimable items while none are (items running elsewhere,
    /// or leases not yet expired).
    pub idle_poll: Duration,
    /// Overrides the job's concurrency.
    pub concurrency: Option<u32>,
}

impl RunnerOptions {
    /// Options from the `[map]` configuration, with a fresh owner name.
    pub fn from_config(config: &MapConfig) -> Self {
        RunnerOptions {
            owner: fresh_owner(),
            lease: Duration::from_secs(config.lease_s),
            idle_poll: Duration::from_millis(250),
            concurrency: None,
        }
    }
}

/// An owner name unique to this process and call: `map-<pid>-<start ms>-<n>`.
pub fn fresh_owner() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "map-{}-{}-{}",
        std::process::id(),
        Timestamp::now().millis(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunEnd {
    /// Every item is finished (completed or failed).
    Finished,
    /// The cancel token fired: the run stopped, its unfinished claims were given back.
    Stopped,
    /// The job was cancelled in the store.
    Cancelled,
    /// The job was marked failed in the store.
    Failed,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MapRunReport {
    /// The job.
    pub job: JobId,
    /// How the run ended.
    pub end: RunEnd,
    /// The job's items at the end.
    pub progress: MapProgress,
    /// Attempts this run started.
    pub attempts: u64,
    /// Answers the store refused (duplicates, lost leases).
    pub discarded: u64,
    /// How long the run took.
    pub elapsed: Duration,
}

/// Where a running job is, for progress displays.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgressReport {
    /// The job.
    pub job: JobId,
    /// Its items by state.
    pub progress: MapProgress,
    /// Items finished since this run started.
    pub finished_this_run: u64,
    /// Items finished per second in this run.
    pub rate_per_s: f64,
    /// Time left at that rate, once there is one.
    pub eta: Option<Duration>,
    /// Time since this run started.
    pub elapsed: Duration,
}

type ProgressFn = Box<dyn FnMut(&ProgressReport) + Send>;

/// Where a batch of answers is relative to its commit, for [`MapRunner::with_commit_hook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitStage {
    /// Answers ready, their transaction not yet started.
    Before,
    /// Their transaction committed.
    After,
}

/// Called around every commit of answers (the runtime's fault injection uses it).
pub type CommitHook = Arc<dyn Fn(CommitStage) + Send + Sync>;

/// Drives one job to its end (see the module documentation).
pub struct MapRunner {
    store: Arc<Store>,
    job: MapJob,
    worker: Arc<dyn ItemWorker>,
    options: RunnerOptions,
    on_progress: Option<ProgressFn>,
    commit_hook: Option<CommitHook>,
}

impl std::fmt::Debug for MapRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapRunner")
            .field("job", &self.job.id)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Where the run loop is, for one iteration.
struct RunState {
    started: Instant,
    initial_done: u64,
    attempts: u64,
    discarded: u64,
    /// Claiming waits until then (the provider's circuit breaker is open).
    paused_until: Option<Instant>,
    /// A provider error that stops the run.
    fatal: Option<ProviderError>,
}

impl MapRunner {
    /// A runner for `job` (as read from the store) doing each attempt with `worker`.
    pub fn new(
        store: Arc<Store>,
        job: MapJob,
        worker: Arc<dyn ItemWorker>,
        options: RunnerOptions,
    ) -> Self {
        MapRunner {
            store,
            job,
            worker,
            options,
            on_progress: None,
            commit_hook: None,
        }
    }

    /// Calls `hook` just before and just after each commit of answers.
    pub fn with_commit_hook(mut self, hook: CommitHook) -> Self {
        self.commit_hook = Some(hook);
        self
    }

    /// A runner for the `llm_map` job `job`: reads it, compiles its schema, and asks `provider`.
    pub async fn for_llm_map(
        store: Arc<Store>,
        provider: Arc<dyn Provider>,
        job: JobId,
        options: RunnerOptions,
    ) -> Result<Self, MapError> {
        let record = blocking(&store, move |s| s.job(job)).await?;
        let worker = Arc::new(LlmItemWorker::for_job(provider, &record)?);
        Ok(MapRunner::new(store, record, worker, options))
    }

    /// Calls `f` at the start and after every batch of commits.
    pub fn on_progress(mut self, f: impl FnMut(&ProgressReport) + Send + 'static) -> Self {
        self.on_progress = Some(Box::new(f));
        self
    }

    /// The job as it was when the runner was made.
    pub fn job(&self) -> &MapJob {
        &self.job
    }

    fn report(&mut self, state: &RunState, progress: MapProgress) {
        let Some(callback) = self.on_progress.as_mut() else {
            return;
        };
        let elapsed = state.started.elapsed();
        let finished = progress.done().saturating_sub(state.initial_done);
        let seconds = elapsed.as_secs_f64();
        let rate = if seconds > 0.0 {
            finished as f64 / seconds
        } else {
            0.0
        };
        let remaining = progress.pending + progress.running;
        let eta = (rate > 0.0)
            .then(|| Duration::try_from_secs_f64(remaining as f64 / rate).ok())
            .flatten();
        callback(&ProgressReport {
            job: self.job.id,
            progress,
            finished_this_run: finished,
            rate_per_s: rate,
            eta,
            elapsed,
        });
    }

    fn run_report(&self, state: &RunState, end: RunEnd, progress: MapProgress) -> MapRunReport {
        MapRunReport {
            job: self.job.id,
            end,
            progress,
            attempts: state.attempts,
            discarded: state.discarded,
            elapsed: state.started.elapsed(),
        }
    }

    /// Runs the job until every item is finished, the job is cancelled or failed in the store,
    /// or `cancel` fires (see the module documentation).
    pub async fn run(mut self, cancel: &CancelToken) -> Result<MapRunReport, MapError> {
        let id = self.job.id;
        let concurrency = self
            .options
            .concurrency
            .unwrap_or(self.job.concurrency)
            .max(1) as usize;
        let timeout = self.job.timeout();
        let mut state = RunState {
            started: Instant::now(),
            initial_done: self.job.progress.done(),
            attempts: 0,
            discarded: 0,
            paused_until: None,
            fatal: None,
        };
        let mut tasks: JoinSet<ItemAttempt> = JoinSet::new();
        let mut in_flight: HashMap<tokio::task::Id, ClaimedItem> = HashMap::new();
        let progress = self.job.progress;
        self.report(&state, progress);

        loop {
            if cancel.is_cancelled() || state.fatal.is_some() {
                return self.stop(&mut state, tasks, in_flight).await;
            }
            let now = Instant::now();
            let paused = state.paused_until.is_some_and(|until| now < until);
            let free = concurrency.saturating_sub(tasks.len());
            if free > 0 && !paused {
                let owner = self.options.owner.clone();
                let lease = self.options.lease;
                let claimed = blocking(&self.store, move |s| {
                    s.claim(id, &owner, Timestamp::now(), lease, free)
                })
                .await?;
                for item in claimed {
                    let worker = Arc::clone(&self.worker);
                    let payload = item.payload.clone();
                    let feedback = item.feedback.clone();
                    let handle = tasks.spawn(async move {
                        let attempt = worker.attempt(&payload, feedback.as_deref());
                        match tokio::time::timeout(timeout, attempt).await {
                            Ok(attempt) => attempt,
                            Err(_) => ItemAttempt::TimedOut(timeout),
                        }
                    });
                    in_flight.insert(handle.id(), item);
                    state.attempts += 1;
                }
            }

            if tasks.is_empty() {
                let job = blocking(&self.store, move |s| s.job(id)).await?;
                let end = match job.status {
                    JobStatus::Completed => Some(RunEnd::Finished),
                    JobStatus::Cancelled => Some(RunEnd::Cancelled),
                    JobStatus::Failed => Some(RunEnd::Failed),
                    JobStatus::Running => None,
                    JobStatus::Preparing => {
                        return Err(MapError::InvalidRequest(format!(
                            "{id} is still being created"
                        )));
                    }
                };
                if let Some(end) = end {
                    self.report(&state, job.progress);
                    return Ok(self.run_report(&state, end, job.progress));
                }
                // Items are running under other claims, or claiming is paused: look again later.
                let wait = match state.paused_until {
                    Some(until) if until > now => until - now,
                    _ => self.options.idle_poll,
                };
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }

            let mut ended = Vec::new();
            let slots_free = tasks.len() < concurrency && !paused;
            tokio::select! {
                _ = cancel.cancelled() => continue,
                joined = tasks.join_next_with_id() => {
                    if let Some(joined) = joined {
                        ended.push(joined);
                    }
                }
                // A free slot: look for claimable items again (e.g. expired leases).
                _ = tokio::time::sleep(self.options.idle_poll), if slots_free => continue,
            }
            while let Some(joined) = tasks.try_join_next_with_id() {
                ended.push(joined);
            }
            let reports = ended
                .into_iter()
                .filter_map(|joined| ended_attempt(joined, &mut in_flight, &mut state))
                .collect();
            self.commit(&mut state, reports).await?;
        }
    }

    /// Commits ended attempts in one transaction and reports progress.
    async fn commit(
        &mut self,
        state: &mut RunState,
        reports: Vec<ItemReport>,
    ) -> Result<(), MapError> {
        if reports.is_empty() {
            return Ok(());
        }
        let id = self.job.id;
        if let Some(hook) = &self.commit_hook {
            hook(CommitStage::Before);
        }
        let (outcomes, progress) = blocking(&self.store, move |s| {
            let outcomes = s.commit_batch(id, &reports)?;
            Ok((outcomes, s.progress(id)?))
        })
        .await?;
        if let Some(hook) = &self.commit_hook {
            hook(CommitStage::After);
        }
        let discarded = outcomes
            .iter()
            .filter(|o| **o != CommitOutcome::Committed)
            .count();
        if discarded > 0 {
            tracing::debug!(job = %id, discarded, "map answers discarded (duplicate or lease lost)");
        }
        state.discarded += discarded as u64;
        self.report(state, progress);
        Ok(())
    }

    /// Stops: aborts the attempts in flight, commits those that had ended, gives the rest back.
    async fn stop(
        mut self,
        state: &mut RunState,
        mut tasks: JoinSet<ItemAttempt>,
        mut in_flight: HashMap<tokio::task::Id, ClaimedItem>,
    ) -> Result<MapRunReport, MapError> {
        tasks.abort_all();
        let mut reports = Vec::new();
        while let Some(joined) = tasks.join_next_with_id().await {
            if matches!(&joined, Err(e) if e.is_cancelled()) {
                continue;
            }
            if let Some(report) = ended_attempt(joined, &mut in_flight, state) {
                reports.push(report);
            }
        }
        self.commit(state, reports).await?;
        let id = self.job.id;
        let owner = self.options.owner.clone();
        let progress = blocking(&self.store, move |s| {
            s.release(id, &owner)?;
            s.progress(id)
        })
        .await?;
        self.report(state, progress);
        if let Some(error) = state.fatal.take() {
            return Err(MapError::Provider(error));
        }
        Ok(self.run_report(state, RunEnd::Stopped, progress))
    }
}

/// The store report for an ended attempt task (`None` for a task this runner does not know).
fn ended_attempt(
    joined: Result<(tokio::task::Id, ItemAttempt), tokio::task::JoinError>,
    in_flight: &mut HashMap<tokio::task::Id, ClaimedItem>,
    state: &mut RunState,
) -> Option<ItemReport> {
    let (task, outcome) = match joined {
        Ok((task, attempt)) => (task, outcome_of(attempt, state)),
        Err(error) => {
            let outcome = if error.is_panic() {
                ItemOutcome::Failed(ItemFailure::new(
                    FailureKind::Transient,
                    "the worker panicked during this attempt",
                ))
            } else {
                ItemOutcome::Released
            };
            (error.id(), outcome)
        }
    };
    let item = in_flight.remove(&task)?;
    Some(ItemReport {
        index: item.index,
        owner: item.owner,
        attempt: item.attempt,
        outcome,
    })
}

/// What an attempt means for its item (and for the run: pauses and fatal errors).
fn outcome_of(attempt: ItemAttempt, state: &mut RunState) -> ItemOutcome {
    let failed = |kind, message: String| ItemOutcome::Failed(ItemFailure::new(kind, message));
    match attempt {
        ItemAttempt::Valid(value) => ItemOutcome::Completed(value.to_string()),
        ItemAttempt::Invalid { error } => failed(FailureKind::InvalidOutput, error),
        ItemAttempt::TimedOut(after) => failed(
            FailureKind::Transient,
            format!("the attempt timed out after {:.1} s", after.as_secs_f64()),
        ),
        ItemAttempt::Provider(error) => match error {
            ProviderError::CircuitOpen { until } => {
                state.paused_until = Some(state.paused_until.map_or(until, |p| p.max(until)));
                ItemOutcome::Released
            }
            ProviderError::Auth { .. } | ProviderError::Config(_) => {
                state.fatal.get_or_insert(error);
                ItemOutcome::Released
            }
            ProviderError::Rejected { .. } => failed(FailureKind::Permanent, error.to_string()),
            other => failed(FailureKind::Transient, other.to_string()),
        },
    }
}
