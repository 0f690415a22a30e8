//! MapWorkerPool: runs map jobs (`llm_map`) from the store, exactly once per item, and resumes
//! them after a crash or a restart.
//!
//! Each running job gets one `MapJobWorker` child, which drives a
//! [`MapRunner`](crate::operators::MapRunner): concurrent attempts that claim items from redb
//! with leases and commit each answer once. The pool supervises the job workers: a worker that
//! panics gives its claims back (`Store::release`) and the job is started again with a new owner
//! after a backoff, so completed items are never redone and no answer is committed twice. When
//! the pool starts (with the runtime, or after its own restart) it resumes every job the store
//! says is running: no worker of an earlier pool survives it.

use std::collections::HashMap;
use std::sync::Arc;

use lcm_core::ids::JobId;
use lcm_llm::provider::Provider;
use lcm_store::{JobStatus, MapJob};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::{FaultPoint, Faults};
use super::shared::{Shared, join_blocking};
use super::supervision::{ActorKind, Heartbeat, backoff};
use crate::operators::llm_map::{ItemAttempt, ItemWorker, LlmItemWorker};
use crate::operators::runner::{CommitStage, MapRunner, RunEnd, RunnerOptions};
use crate::operators::{CancelToken, MapRequest, MapSummary, create_map_job, write_output};

/// Messages of the [`MapWorkerPool`].
pub(crate) enum MapPoolMsg {
    /// Create a job from a request (validated first) and run it.
    Start {
        request: Box<MapRequest>,
        reply: RpcReplyPort<Result<MapJob, RuntimeError>>,
    },
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
    Ended {
        job: JobId,
        result: Result<MapSummary, String>,
    },
}

pub(crate) struct MapWorkerPool;

struct RunningJob {
    worker: Option<ActorId>,
    owner: String,
    cancel: CancelToken,
    attempts: u32,
    waiters: Vec<RpcReplyPort<Result<MapSummary, RuntimeError>>>,
    /// Set once the worker reported, so its normal stop is not a failure.
    ended: bool,
}

pub(crate) struct MapPoolState {
    shared: Arc<Shared>,
    heartbeat: Arc<Heartbeat>,
    jobs: HashMap<JobId, RunningJob>,
    workers: HashMap<ActorId, JobId>,
}

const WORKER_DONE: &str = "done";

#[ractor::async_trait]
impl Actor for MapWorkerPool {
    type Msg = MapPoolMsg;
    type State = MapPoolState;
    type Arguments = (Arc<Shared>, Arc<Heartbeat>);

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
        };
        // No worker outlives its pool: every running item goes back to pending and every
        // running job starts again.
        let store = Arc::clone(&state.shared.store);
        let resumed =
            join_blocking(tokio::task::spawn_blocking(move || store.resume_all()).await)??;
        if state.shared.llm.is_some() {
            for (job, _) in resumed {
                start_job(&myself, &mut state, job).await;
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
            MapPoolMsg::Start { request, reply } => {
                if state.shared.llm.is_none() {
                    let _ = reply.send(Err(no_provider()));
                    return Ok(());
                }
                let store = Arc::clone(&state.shared.store);
                let config = state.shared.config.map.clone();
                match create_map_job(store, &config, &request).await {
                    Ok(job) => {
                        start_job(&myself, state, job.id).await;
                        let _ = reply.send(Ok(job));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(RuntimeError::Invalid(e.to_string())));
                    }
                }
            }
            MapPoolMsg::Resume { job, reply } => {
                if state.shared.llm.is_none() {
                    let _ = reply.send(Err(no_provider()));
                    return Ok(());
                }
                if state.jobs.contains_key(&job) {
                    let _ = reply.send(Ok(()));
                    return Ok(());
                }
                let store = Arc::clone(&state.shared.store);
                let resumed =
                    join_blocking(tokio::task::spawn_blocking(move || store.resume(job)).await)?;
                match resumed {
                    Ok(_) => {
                        start_job(&myself, state, job).await;
                        let _ = reply.send(Ok(()));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e.into()));
                    }
                }
            }
            MapPoolMsg::Cancel { job, reply } => {
                let store = Arc::clone(&state.shared.store);
                let cancelled =
                    join_blocking(tokio::task::spawn_blocking(move || store.cancel(job)).await)?;
                if let Some(running) = state.jobs.get(&job) {
                    running.cancel.cancel();
                }
                let _ = reply.send(cancelled.map(|_| ()).map_err(RuntimeError::from));
            }
            MapPoolMsg::Wait { job, reply } => match state.jobs.get_mut(&job) {
                Some(running) => running.waiters.push(reply),
                None => {
                    // Not running: summarise what the store holds.
                    let _ = reply.send(summary_of_stored(&state.shared, job).await?);
                }
            },
            MapPoolMsg::Restart(job) => {
                if state.jobs.get(&job).is_some_and(|j| j.worker.is_none()) {
                    start_job(&myself, state, job).await;
                }
            }
            MapPoolMsg::Ended { job, result } => {
                if let Some(mut running) = state.jobs.remove(&job) {
                    running.ended = true;
                    if let Some(id) = running.worker.take() {
                        state.workers.remove(&id);
                    }
                    if let Ok(summary) = &result {
                        state.shared.emit(RuntimeEvent::MapFinished {
                            job,
                            completed: summary.completed,
                            failed: summary.failed,
                        });
                    }
                    for w in running.waiters {
                        let _ = w.send(result.clone().map_err(RuntimeError::Tool));
                    }
                }
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
        let (cell, error) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, error.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                if reason.as_deref() == Some(WORKER_DONE) {
                    state.workers.remove(&cell.get_id());
                    return Ok(());
                }
                (cell, reason.unwrap_or_else(|| "killed".into()))
            }
            _ => return Ok(()),
        };
        let Some(job) = state.workers.remove(&cell.get_id()) else {
            return Ok(());
        };
        let Some(running) = state.jobs.get_mut(&job) else {
            return Ok(());
        };
        running.worker = None;
        if running.ended {
            return Ok(());
        }
        state.shared.emit(RuntimeEvent::ActorFailed {
            kind: ActorKind::MapWorkerPool,
            session: None,
            error: error.clone(),
        });
        // Give the dead worker's claims back now instead of waiting for their leases.
        let store = Arc::clone(&state.shared.store);
        let owner = running.owner.clone();
        join_blocking(tokio::task::spawn_blocking(move || store.release(job, &owner)).await)??;
        let config = &state.shared.config.runtime;
        if running.attempts > config.max_restarts {
            if let Some(running) = state.jobs.remove(&job) {
                let message = format!(
                    "the worker of {job} failed {} times (last: {error}); the job stays running in the store: `lcm map resume {job}` runs it again",
                    running.attempts
                );
                for w in running.waiters {
                    let _ = w.send(Err(RuntimeError::Tool(message.clone())));
                }
            }
            return Ok(());
        }
        let delay = backoff(running.attempts, config);
        let pool = myself.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = pool.cast(MapPoolMsg::Restart(job));
        });
        Ok(())
    }
}

fn no_provider() -> RuntimeError {
    RuntimeError::Invalid(
        "map operators need an LLM: set [llm] provider to \"openai\" or \"anthropic\" (the extractive summariser cannot answer items)".into(),
    )
}

/// The summary of a job that is not running, from the store and its output file.
async fn summary_of_stored(
    shared: &Arc<Shared>,
    job: JobId,
) -> Result<Result<MapSummary, RuntimeError>, RuntimeError> {
    let store = Arc::clone(&shared.store);
    join_blocking(
        tokio::task::spawn_blocking(move || {
            let record = store.job(job)?;
            write_output(&store, job, &record.output_path)
                .map_err(|e| RuntimeError::Tool(e.to_string()))
        })
        .await,
    )
}

/// Starts (or restarts) a job's worker.
async fn start_job(myself: &ActorRef<MapPoolMsg>, state: &mut MapPoolState, job: JobId) {
    let Some(llm) = state.shared.llm.clone() else {
        return;
    };
    let options = RunnerOptions::from_config(&state.shared.config.map);
    let entry = state.jobs.entry(job).or_insert_with(|| RunningJob {
        worker: None,
        owner: String::new(),
        cancel: CancelToken::new(),
        attempts: 0,
        waiters: Vec::new(),
        ended: false,
    });
    entry.attempts += 1;
    entry.owner = options.owner.clone();
    let args = JobWorkerArgs {
        shared: Arc::clone(&state.shared),
        job,
        provider: llm.provider,
        options,
        cancel: entry.cancel.clone(),
        pool: myself.clone(),
    };
    match MapJobWorker::spawn_linked(None, MapJobWorker, args, myself.get_cell()).await {
        Ok((worker, _)) => {
            entry.worker = Some(worker.get_id());
            state.workers.insert(worker.get_id(), job);
            let _ = worker.cast(JobWorkerMsg::Run);
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

struct MapJobWorker;

struct JobWorkerArgs {
    shared: Arc<Shared>,
    job: JobId,
    provider: Arc<dyn Provider>,
    options: RunnerOptions,
    cancel: CancelToken,
    pool: ActorRef<MapPoolMsg>,
}

enum JobWorkerMsg {
    Run,
}

#[ractor::async_trait]
impl Actor for MapJobWorker {
    type Msg = JobWorkerMsg;
    type State = JobWorkerArgs;
    type Arguments = JobWorkerArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        JobWorkerMsg::Run: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let result = run_job(state).await;
        let _ = state.pool.cast(MapPoolMsg::Ended {
            job: state.job,
            result,
        });
        myself.stop(Some(WORKER_DONE.into()));
        Ok(())
    }
}

async fn run_job(state: &JobWorkerArgs) -> Result<MapSummary, String> {
    let shared = &state.shared;
    let job = state.job;
    let store = Arc::clone(&shared.store);
    let record = join_blocking(tokio::task::spawn_blocking(move || store.job(job)).await)
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    if record.status != JobStatus::Running {
        return summarise(shared, job, &record).await;
    }
    let worker =
        LlmItemWorker::for_job(Arc::clone(&state.provider), &record).map_err(|e| e.to_string())?;
    let worker = Arc::new(FaultyItemWorker {
        inner: worker,
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
        let store = Arc::clone(&shared.store);
        let _ = join_blocking(tokio::task::spawn_blocking(move || store.cancel(job)).await);
    }
    summarise(shared, job, &record).await
}

async fn summarise(
    shared: &Arc<Shared>,
    job: JobId,
    record: &MapJob,
) -> Result<MapSummary, String> {
    let store = Arc::clone(&shared.store);
    let path = record.output_path.clone();
    join_blocking(tokio::task::spawn_blocking(move || write_output(&store, job, &path)).await)
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The item worker with the mid-call fault point in front of it.
struct FaultyItemWorker {
    inner: LlmItemWorker,
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
