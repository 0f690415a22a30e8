//! MapWorkerPool: runs map jobs (`llm_map`, `agentic_map`) from the store, exactly once per
//! item, and resumes them after a crash or a restart.
//!
//! Each running job gets one `MapJobWorker` child, which drives a
//! [`MapRunner`](crate::operators::MapRunner): concurrent attempts that claim items from redb
//! with leases and commit each answer once. An `llm_map` item is one stateless provider call; an
//! `agentic_map` item is one sub-agent run through the DelegationActor, as a child of the
//! caller that started the job (a job resumed by a later runtime has lost its caller: its
//! item agents then run as children of no session, at depth 1). The pool supervises the job workers: a worker that
//! panics gives its claims back (`Store::release`) and the job is started again with a new owner
//! after a backoff, so completed items are never redone and no answer is committed twice. When
//! the pool starts (with the runtime, or after its own restart) it resumes every job the store
//! says is running: no worker of an earlier pool survives it.
//!
//! When the runtime shuts down it drains the pool: every job's run stops (answers already in
//! are committed, claims in flight are given back, the job stays running in the store) and the
//! next runtime on the same store resumes it. Waiters are told the runtime is shutting down.
//!
//! The pool's own handlers stay short: creating a job (streaming its input into the store) and
//! writing the output of a job that is not running happen in tasks of their own, so a large
//! input never holds up waits, cancellations and the ends of other jobs.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use lcm_core::ids::JobId;
use lcm_llm::provider::Provider;
use lcm_store::{JobStatus, MapJob, MapKind};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::delegation::RuntimeDelegator;
use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::{FaultPoint, Faults};
use super::shared::{Shared, SharedRef, join_blocking};
use super::supervision::{ActorKind, Heartbeat, RestartHistory, backoff};
use super::worker::{OneShotTask, WorkerExit, spawn_worker};
use crate::operators::agentic::AgenticItemWorker;
use crate::operators::llm_map::{ItemAttempt, ItemWorker, LlmItemWorker};
use crate::operators::runner::{CommitStage, MapRunner, RunEnd, RunnerOptions};
use crate::operators::{
    CancelToken, MapRequest, MapSummary, create_map_job, validate_schema, write_output,
};
use crate::tools::Caller;

/// Messages of the [`MapWorkerPool`].
pub(crate) enum MapPoolMsg {
    /// Create a job from a request (validated first) and run it.
    Start {
        request: Box<MapRequest>,
        /// Who starts it: the parent of an `agentic_map` job's item agents.
        caller: Box<Caller>,
        reply: RpcReplyPort<Result<MapJob, RuntimeError>>,
    },
    /// Run a job just created by a `Start` (its creation runs outside the pool).
    Created { job: JobId, caller: Box<Caller> },
    /// Run a job the store holds (after `lcm map resume`, or one left running).
    Resume {
        job: JobId,
        reply: RpcReplyPort<Result<(), RuntimeError>>,
    },
    /// Stop a job: attempts in flight are abandoned, the job is marked cancelled.
    Cancel {
        job: JobId,
        reply: RpcReplyPort<Result<(), RuntimeError>>,
    },
    /// Answer when the job's run ends, with its summary.
    Wait {
        job: JobId,
        reply: RpcReplyPort<Result<MapSummary, RuntimeError>>,
    },
    /// Start a job's worker again (after a failed one, once its backoff passed).
    Restart(JobId),
    /// A job worker's run ended (sent by the worker before it stops).
    Ended { job: JobId, end: JobEnd },
    /// The runtime is shutting down: stop every job's run (the jobs stay running in the store,
    /// to be resumed by the next runtime), start nothing more, answer once every run ended.
    Drain(RpcReplyPort<()>),
}

/// How a job worker's run ended.
pub(crate) enum JobEnd {
    /// The job is over (completed, cancelled or failed) and its output written.
    Summary(MapSummary),
    /// The run stopped while the job is still running in the store (the pool was draining).
    Stopped,
    /// The run could not go on (the provider refuses the job, the store failed); the job stays
    /// running in the store.
    Failed(String),
}

pub(crate) struct MapWorkerPool;

struct RunningJob {
    worker: Option<ActorId>,
    owner: String,
    /// Who started the job (the main agent of no session for a resumed job).
    caller: Caller,
    cancel: CancelToken,
    /// The job worker's failures, for the backoff and the restart limit (within
    /// `runtime.restart_window_s`, like the root's restarts).
    failures: RestartHistory,
    waiters: Vec<RpcReplyPort<Result<MapSummary, RuntimeError>>>,
}

pub(crate) struct MapPoolState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
    jobs: HashMap<JobId, RunningJob>,
    workers: HashMap<ActorId, JobId>,
    /// Set by `Drain`: nothing starts or restarts any more.
    draining: bool,
    /// Answered once every run ended after a `Drain`.
    drained: Vec<RpcReplyPort<()>>,
}

#[ractor::async_trait]
impl Actor for MapWorkerPool {
    type Msg = MapPoolMsg;
    type State = MapPoolState;
    type Arguments = (SharedRef, Arc<Heartbeat>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (shared, heartbeat): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = MapPoolState {
            shared,
            heartbeat,
            jobs: HashMap::new(),
            workers: HashMap::new(),
            draining: false,
            drained: Vec::new(),
        };
        // No worker outlives its pool: every running item goes back to pending and every
        // running job starts again.
        let store = Arc::clone(&state.shared.store);
        let resumed =
            join_blocking(tokio::task::spawn_blocking(move || store.resume_all()).await)??;
        if state.shared.llm.is_some() {
            for (job, _) in resumed {
                start_job(&myself, &mut state, job, Caller::main_agent(None)).await;
            }
        } else if !resumed.is_empty() {
            tracing::warn!(
                jobs = resumed.len(),
                "map jobs are waiting to resume but no LLM provider is configured"
            );
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _busy = state.heartbeat.busy();
        match message {
            MapPoolMsg::Start {
                request,
                caller,
                reply,
            } => {
                if state.shared.llm.is_none() {
                    let _ = reply.send(Err(no_provider()));
                    return Ok(());
                }
                if state.draining {
                    let _ = reply.send(Err(RuntimeError::ShuttingDown));
                    return Ok(());
                }
                // Reading a large input takes a while: do it outside the pool's handler.
                let shared = state.shared.clone();
                let pool = myself.clone();
                tokio::spawn(async move {
                    let config = shared.config.map.clone();
                    match create_map_job(Arc::clone(&shared.store), &config, &request).await {
                        Ok(job) => {
                            // Sent before the reply, so the caller's next message (a wait, a
                            // cancel) finds the job running. Should the pool have been
                            // restarted meanwhile, the new one runs it: it is in the slot, or
                            // it resumed the job itself at its start.
                            let current = shared.services.map_pool.get().unwrap_or(pool);
                            let _ = current.cast(MapPoolMsg::Created {
                                job: job.id,
                                caller,
                            });
                            let _ = reply.send(Ok(job));
                        }
                        Err(e) => {
                            let _ = reply.send(Err(RuntimeError::Invalid(e.to_string())));
                        }
                    }
                });
            }
            MapPoolMsg::Created { job, caller } => {
                // While draining the job is left to the next runtime, which resumes it.
                if !state.draining && !state.jobs.contains_key(&job) {
                    start_job(&myself, state, job, *caller).await;
                }
            }
            MapPoolMsg::Resume { job, reply } => {
                if state.shared.llm.is_none() {
                    let _ = reply.send(Err(no_provider()));
                    return Ok(());
                }
                if state.draining {
                    let _ = reply.send(Err(RuntimeError::ShuttingDown));
                    return Ok(());
                }
                if state.jobs.contains_key(&job) {
                    let _ = reply.send(Ok(()));
                    return Ok(());
                }
                let store = Arc::clone(&state.shared.store);
                let resumed = join_blocking(
                    tokio::task::spawn_blocking(move || resumable(&store, job)).await,
                )?;
                match resumed {
                    Ok(true) => {
                        start_job(&myself, state, job, Caller::main_agent(None)).await;
                        let _ = reply.send(Ok(()));
                    }
                    // Completed: nothing left to run (`map_wait` gives its summary).
                    Ok(false) => {
                        let _ = reply.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            MapPoolMsg::Cancel { job, reply } => {
                let store = Arc::clone(&state.shared.store);
                let cancelled =
                    join_blocking(tokio::task::spawn_blocking(move || store.cancel(job)).await)?;
                // The run stops once the store says cancelled: it then reports the summary.
                if cancelled.is_ok()
                    && let Some(running) = state.jobs.get(&job)
                {
                    running.cancel.cancel();
                }
                let _ = reply.send(cancelled.map(|_| ()).map_err(RuntimeError::from));
            }
            MapPoolMsg::Wait { job, reply } => match state.jobs.get_mut(&job) {
                Some(running) => running.waiters.push(reply),
                None => {
                    // Not running: summarise what the store holds (writing the output file
                    // takes a while for a large job: not in the pool's handler).
                    let shared = state.shared.clone();
                    tokio::spawn(async move {
                        let summary = summary_of_stored(&shared, job).await;
                        let _ = reply.send(summary);
                    });
                }
            },
            MapPoolMsg::Restart(job) => {
                if !state.draining
                    && let Some(running) = state.jobs.get(&job)
                    && running.worker.is_none()
                {
                    let caller = running.caller.clone();
                    start_job(&myself, state, job, caller).await;
                }
            }
            MapPoolMsg::Ended { job, end } => {
                state.shared.faults.hit(FaultPoint::MapPoolOnEnded, None);
                if let Some(mut running) = state.jobs.remove(&job) {
                    if let Some(id) = running.worker.take() {
                        state.workers.remove(&id);
                    }
                    if let JobEnd::Summary(summary) = &end {
                        state.shared.emit(RuntimeEvent::MapFinished {
                            job,
                            completed: summary.completed,
                            failed: summary.failed,
                        });
                    }
                    for w in running.waiters {
                        let _ = w.send(answer(job, &end, state.draining));
                    }
                }
                check_drained(state);
            }
            MapPoolMsg::Drain(reply) => {
                state.draining = true;
                state.drained.push(reply);
                // Jobs waiting out a restart backoff just stay running in the store.
                let idle: Vec<JobId> = state
                    .jobs
                    .iter()
                    .filter(|(_, j)| j.worker.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                for job in idle {
                    if let Some(running) = state.jobs.remove(&job) {
                        for w in running.waiters {
                            let _ = w.send(Err(RuntimeError::ShuttingDown));
                        }
                    }
                }
                // The others stop; each reports `Ended` with `JobEnd::Stopped`.
                for running in state.jobs.values() {
                    running.cancel.cancel();
                }
                check_drained(state);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, error) = match WorkerExit::of(event) {
            Some(WorkerExit::Done(cell)) => {
                state.workers.remove(&cell.get_id());
                return Ok(());
            }
            Some(WorkerExit::Failed { worker, error }) => (worker, error),
            None => return Ok(()),
        };
        let Some(job) = state.workers.remove(&cell.get_id()) else {
            return Ok(());
        };
        // A worker that reported its end is not restarted (it stops right after reporting).
        let Some(running) = state.jobs.get_mut(&job) else {
            return Ok(());
        };
        running.worker = None;
        state.shared.emit(RuntimeEvent::ActorFailed {
            kind: ActorKind::MapWorkerPool,
            session: None,
            error: format!("the worker of {job}: {error}"),
        });
        // Give the dead worker's claims back now instead of waiting for their leases. Should
        // that fail, the leases expire and the next worker takes the items over then.
        let store = Arc::clone(&state.shared.store);
        let owner = running.owner.clone();
        let released =
            join_blocking(tokio::task::spawn_blocking(move || store.release(job, &owner)).await)?;
        if let Err(e) = released {
            tracing::warn!(%job, error = %e, "could not give a failed map worker's items back; they are retried when their leases expire");
        }
        if state.draining {
            // Not restarted: the next runtime resumes the job.
            if let Some(running) = state.jobs.remove(&job) {
                for w in running.waiters {
                    let _ = w.send(Err(RuntimeError::ShuttingDown));
                }
            }
            check_drained(state);
            return Ok(());
        }
        let Some(running) = state.jobs.get_mut(&job) else {
            return Ok(());
        };
        let config = &state.shared.config.runtime;
        let failures = running.failures.record(Instant::now(), config);
        if failures > config.max_restarts {
            if let Some(running) = state.jobs.remove(&job) {
                let message = format!(
                    "the worker of {job} failed {failures} times within {} s (last: {error}); the job stays running in the store: `lcm map resume {job}` runs it again",
                    config.restart_window_s
                );
                for w in running.waiters {
                    let _ = w.send(Err(RuntimeError::Tool(message.clone())));
                }
            }
            return Ok(());
        }
        let delay = backoff(failures, config);
        let pool = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = pool.cast(MapPoolMsg::Restart(job));
        });
        Ok(())
    }
}

/// Sends one RPC to the current map pool (waiting, within the call timeout, for one to be up).
/// The answer itself is not bounded by the call timeout: map jobs run long.
pub(crate) async fn call<T: Send + 'static>(
    shared: &Shared,
    build: impl FnOnce(RpcReplyPort<T>) -> MapPoolMsg,
) -> Result<T, RuntimeError> {
    call_once(shared, build, None)
        .await?
        .map_err(|_| RuntimeError::Unavailable {
            kind: ActorKind::MapWorkerPool,
            detail: "it stopped".into(),
        })
}

/// One RPC to the current map pool (not `stopped`, a pool seen to stop: its successor), as
/// [`call`]; `Err` with the pool's id when it stopped before it answered.
async fn call_once<T: Send + 'static>(
    shared: &Shared,
    build: impl FnOnce(RpcReplyPort<T>) -> MapPoolMsg,
    stopped: Option<ActorId>,
) -> Result<Result<T, ActorId>, RuntimeError> {
    let deadline = Instant::now() + shared.call_timeout();
    let slot = &shared.services.map_pool;
    let kind = ActorKind::MapWorkerPool;
    let pool = match stopped {
        None => slot.wait(kind, shared, deadline).await?,
        Some(stopped) => slot.wait_successor(kind, shared, deadline, stopped).await?,
    };
    Ok(match pool.call(build, None).await {
        Ok(ractor::rpc::CallResult::Success(value)) => Ok(value),
        _ => Err(pool.get_id()),
    })
}

/// Restarts of the pool a [`wait`] rides out before it gives up.
const MAX_REATTACH: u32 = 5;

/// Waits for the end of `job`'s run, as [`call`] with [`MapPoolMsg::Wait`], but rides out
/// restarts of the pool: a pool that stops before answering (a crash) drops its waiters, and the
/// pool its supervisor starts again resumes every running job from the store, so the wait is
/// sent again to the new pool (a job that ended meanwhile is summarised from the store). A
/// runtime shutting down, or a pool that keeps failing, ends the wait with an error.
pub(crate) async fn wait(
    shared: &Shared,
    job: JobId,
) -> Result<Result<MapSummary, RuntimeError>, RuntimeError> {
    let mut attempt = 0;
    let mut stopped = None;
    loop {
        match call_once(shared, |reply| MapPoolMsg::Wait { job, reply }, stopped).await? {
            Ok(answer) => return Ok(answer),
            Err(_) if shared.is_closing() => return Err(RuntimeError::ShuttingDown),
            Err(pool) if attempt < MAX_REATTACH => {
                attempt += 1;
                stopped = Some(pool);
                tracing::warn!(%job, attempt, "map worker pool stopped during a wait; waiting on its successor");
            }
            Err(_) => {
                return Err(RuntimeError::Unavailable {
                    kind: ActorKind::MapWorkerPool,
                    detail: format!("it stopped {} times while {job} ran", attempt + 1),
                });
            }
        }
    }
}

/// What a waiter of `job` is told when its run ended with `end`.
fn answer(job: JobId, end: &JobEnd, draining: bool) -> Result<MapSummary, RuntimeError> {
    match end {
        JobEnd::Summary(summary) => Ok(summary.clone()),
        JobEnd::Stopped if draining => Err(RuntimeError::ShuttingDown),
        JobEnd::Stopped => Err(RuntimeError::Tool(format!(
            "the run of {job} stopped before the job finished; it stays running in the store: `lcm map resume {job}` runs it again"
        ))),
        JobEnd::Failed(error) => Err(RuntimeError::Tool(error.clone())),
    }
}

/// Answers the drain requests once no run is left.
fn check_drained(state: &mut MapPoolState) {
    if state.draining && state.jobs.is_empty() {
        for reply in state.drained.drain(..) {
            let _ = reply.send(());
        }
    }
}

fn no_provider() -> RuntimeError {
    RuntimeError::Invalid(
        "map operators need an LLM: set [llm] provider to \"openai\" or \"anthropic\" (the extractive summariser cannot answer items)".into(),
    )
}

/// The summary of a job that is not running, from the store and its output file.
async fn summary_of_stored(shared: &Shared, job: JobId) -> Result<MapSummary, RuntimeError> {
    let store = Arc::clone(&shared.store);
    let written = tokio::task::spawn_blocking(move || {
        let record = store.job(job)?;
        write_output(&store, job, &record.output_path)
            .map_err(|e| RuntimeError::Tool(e.to_string()))
    })
    .await;
    written.unwrap_or_else(|e| {
        Err(RuntimeError::Tool(format!(
            "writing the output of {job} failed: {e}"
        )))
    })
}

/// Whether `job` can run again: `true` once its interrupted items are pending again, `false`
/// when it completed (nothing to run). A cancelled or failed job is refused: it stays as it is.
fn resumable(store: &lcm_store::Store, job: JobId) -> Result<bool, RuntimeError> {
    let record = store.job(job)?;
    match record.status {
        JobStatus::Completed => Ok(false),
        JobStatus::Cancelled => Err(RuntimeError::Invalid(format!(
            "{job} was cancelled; a cancelled job is not resumed (start a new one)"
        ))),
        JobStatus::Failed => Err(RuntimeError::Invalid(format!(
            "{job} failed ({}); a failed job is not resumed (start a new one)",
            record.error.as_deref().unwrap_or("no reason recorded")
        ))),
        JobStatus::Preparing | JobStatus::Running => {
            store.resume(job)?;
            Ok(true)
        }
    }
}

/// Starts (or restarts) a job's worker; `caller` started the job.
async fn start_job(
    myself: &ActorRef<MapPoolMsg>,
    state: &mut MapPoolState,
    job: JobId,
    caller: Caller,
) {
    let Some(llm) = state.shared.llm.clone() else {
        return;
    };
    let options = RunnerOptions::from_config(&state.shared.config.map);
    let entry = state.jobs.entry(job).or_insert_with(|| RunningJob {
        worker: None,
        owner: String::new(),
        caller: caller.clone(),
        cancel: CancelToken::new(),
        failures: RestartHistory::default(),
        waiters: Vec::new(),
    });
    entry.owner = options.owner.clone();
    let task = JobRun {
        shared: state.shared.clone(),
        job,
        provider: llm.provider,
        caller,
        options,
        cancel: entry.cancel.clone(),
        pool: myself.clone(),
    };
    match spawn_worker(task, myself.get_cell()).await {
        Ok(worker) => {
            entry.worker = Some(worker.get_id());
            state.workers.insert(worker.get_id(), job);
        }
        Err(e) => {
            if let Some(running) = state.jobs.remove(&job) {
                for w in running.waiters {
                    let _ = w.send(Err(RuntimeError::Tool(format!(
                        "could not start a worker for {job}: {e}"
                    ))));
                }
            }
        }
    }
}

/// One run of a map job, in a worker of its own (see [`super::worker`]).
struct JobRun {
    shared: SharedRef,
    job: JobId,
    provider: Arc<dyn Provider>,
    caller: Caller,
    options: RunnerOptions,
    cancel: CancelToken,
    pool: ActorRef<MapPoolMsg>,
}

#[async_trait::async_trait]
impl OneShotTask for JobRun {
    type Outcome = JobEnd;

    async fn run(&mut self) -> JobEnd {
        match run_job(self).await {
            Ok(end) => end,
            Err(error) => JobEnd::Failed(error),
        }
    }

    fn report(&self, end: JobEnd) {
        let _ = self.pool.cast(MapPoolMsg::Ended { job: self.job, end });
    }
}

async fn run_job(state: &JobRun) -> Result<JobEnd, String> {
    let shared = &state.shared;
    let job = state.job;
    let store = Arc::clone(&shared.store);
    let record = join_blocking(tokio::task::spawn_blocking(move || store.job(job)).await)
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    if record.status != JobStatus::Running {
        return summarise(shared, job, &record).await.map(JobEnd::Summary);
    }
    let worker = Arc::new(FaultyItemWorker {
        inner: item_worker(state, &record).await?,
        faults: Arc::clone(&shared.faults),
    });
    let faults = Arc::clone(&shared.faults);
    let events = shared.events.clone();
    let runner = MapRunner::new(
        Arc::clone(&shared.store),
        record.clone(),
        worker,
        state.options.clone(),
    )
    .with_commit_hook(Arc::new(move |stage| match stage {
        CommitStage::Before => faults.hit(FaultPoint::MapWorkerBeforeCommit, None),
        CommitStage::After => faults.hit(FaultPoint::MapWorkerAfterCommit, None),
    }))
    .on_progress(move |p| {
        let _ = events.send(RuntimeEvent::MapProgress {
            job: p.job,
            total: p.progress.total,
            completed: p.progress.completed,
            failed: p.progress.failed,
            running: p.progress.running,
            rate_per_s: p.rate_per_s,
            eta_s: p.eta.map(|d| d.as_secs_f64()),
        });
    });
    let report = runner.run(&state.cancel).await.map_err(|e| e.to_string())?;
    if report.end == RunEnd::Stopped {
        // Stopped by the token: a cancellation (the pool cancelled the job in the store
        // first) or the pool draining (the job stays running, for the next runtime).
        let store = Arc::clone(&shared.store);
        let now = join_blocking(tokio::task::spawn_blocking(move || store.job(job)).await)
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if now.status == JobStatus::Running {
            return Ok(JobEnd::Stopped);
        }
    }
    summarise(shared, job, &record).await.map(JobEnd::Summary)
}

/// The worker of one item of `record`: a provider call (`llm_map`) or a sub-agent
/// (`agentic_map`).
async fn item_worker(state: &JobRun, record: &MapJob) -> Result<Arc<dyn ItemWorker>, String> {
    match record.kind {
        MapKind::Llm => LlmItemWorker::for_job(Arc::clone(&state.provider), record)
            .map(|w| Arc::new(w) as Arc<dyn ItemWorker>)
            .map_err(|e| e.to_string()),
        MapKind::Agentic => {
            let schema: serde_json::Value = serde_json::from_str(&record.output_schema)
                .map_err(|e| format!("the stored schema of {} is not JSON: {e}", record.id))?;
            let validator = validate_schema(&schema).map_err(|e| e.to_string())?;
            // Nested maps started by an item must run over strictly smaller inputs.
            let path = record.input_path.clone();
            let input_bytes = tokio::task::spawn_blocking(move || std::fs::metadata(&path))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("{}: {e}", record.input_path.display()))?
                .len();
            let delegator = Arc::new(RuntimeDelegator {
                shared: state.shared.clone(),
            });
            Ok(Arc::new(AgenticItemWorker::new(
                delegator,
                state.caller.clone(),
                record.prompt.clone(),
                validator,
                record.read_only,
                input_bytes,
            )))
        }
    }
}

async fn summarise(shared: &Shared, job: JobId, record: &MapJob) -> Result<MapSummary, String> {
    let store = Arc::clone(&shared.store);
    let path = record.output_path.clone();
    join_blocking(tokio::task::spawn_blocking(move || write_output(&store, job, &path)).await)
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The item worker with the mid-call fault point in front of it.
struct FaultyItemWorker {
    inner: Arc<dyn ItemWorker>,
    faults: Arc<Faults>,
}

#[async_trait::async_trait]
impl ItemWorker for FaultyItemWorker {
    async fn attempt(&self, payload: &str, feedback: Option<&str>) -> ItemAttempt {
        self.faults
            .hit_async(FaultPoint::MapWorkerMidLlmCall, None)
            .await;
        self.inner.attempt(payload, feedback).await
    }
}
