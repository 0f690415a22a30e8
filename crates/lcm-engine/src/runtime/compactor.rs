//! CompactorActor: runs compactions off the sessions' path, a bounded number at a time.
//!
//! Each compaction runs in its own `CompactionWorker` child (one per job), so the compactor
//! itself only schedules: it queues jobs beyond `runtime.max_concurrent_compactions`, keeps one
//! job per session, forwards each result to the session's current actor, and supervises the
//! workers. A worker that panics or is killed as stuck is retried with backoff up to
//! `runtime.compaction_max_attempts` times. Nothing is ever half-applied: each pass of a
//! compaction is one redb transaction that is refused if its span changed.
//!
//! The compactor's own crash loses only what it can rebuild: its queue and its workers (killed
//! with it; a pass they were committing either committed or did not). The root supervisor
//! restarts it and tells every live session (`CompactorRestarted`), and each session with a
//! request in flight sends it again, so the context requests waiting on it are answered.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm_core::ids::SessionId;
use lcm_core::summary::NewSummary;
use lcm_llm::provider::{Completion, ProviderError};
use lcm_llm::summarize::{Summarizer, SummaryCall};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::events::RuntimeEvent;
use super::faults::{FaultPoint, Faults};
use super::indexer::IndexerMsg;
use super::session::SessionMsg;
use super::shared::SharedRef;
use super::supervision::{ActorKind, Heartbeat, backoff};
use super::worker::{OneShotTask, WorkerExit, spawn_worker};
use crate::compaction::{CompactionObserver, CompactionReport, PassReport, compact_shared};

/// A compaction requested by a session.
#[derive(Clone)]
pub(crate) struct CompactJob {
    pub(crate) session: SessionId,
    pub(crate) budget: u64,
    /// The session's id for this request (stale answers are ignored by the session).
    pub(crate) ticket: u64,
    pub(crate) reply_to: ActorRef<SessionMsg>,
}

/// What a compaction came to, as sent back to the session.
#[derive(Debug, Clone)]
pub(crate) struct CompactionOutcome {
    pub(crate) ticket: u64,
    pub(crate) attempts: u32,
    pub(crate) result: Result<CompactionReport, String>,
}

/// Observable state of the compactor (for tests and stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactorStats {
    /// Compactions running now.
    pub running: usize,
    /// Compactions waiting for a free slot.
    pub queued: usize,
    /// Compactions finished since the compactor started.
    pub finished: u64,
    /// Worker attempts that crashed or stalled.
    pub worker_failures: u64,
}

/// Messages of the [`CompactorActor`].
pub(crate) enum CompactorMsg {
    /// Compact a session (replaces the session's queued or running request's reply address).
    Compact(CompactJob),
    /// A worker finished its run (sent by the worker before it stops).
    Finished {
        session: SessionId,
        result: Result<CompactionReport, String>,
    },
    /// Start a job again after a failed attempt (sent after the backoff delay).
    Retry(SessionId),
    /// Look for stuck workers.
    Heartbeat,
    /// Observable state.
    Stats(RpcReplyPort<CompactorStats>),
    /// Stop taking queued jobs (shutdown): running ones finish. Answered once none runs (at
    /// once if none does), so shutdown awaits the answer instead of polling.
    Drain(RpcReplyPort<()>),
}

pub(crate) struct CompactorActor;

struct Job {
    job: CompactJob,
    attempts: u32,
    worker: Option<(ActorId, Arc<Heartbeat>, ractor::ActorCell)>,
    /// Set once the worker reported, so its normal termination is not a failure.
    finished: bool,
}

pub(crate) struct CompactorState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
    jobs: HashMap<SessionId, Job>,
    queue: VecDeque<SessionId>,
    workers: HashMap<ActorId, SessionId>,
    finished: u64,
    worker_failures: u64,
    draining: bool,
    /// Who waits for the drain to end (see [`CompactorMsg::Drain`]).
    drained: Vec<RpcReplyPort<()>>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl CompactorState {
    fn running(&self) -> usize {
        self.workers.len()
    }

    /// Answers the drain's waiters once no compaction runs. Called after every message and
    /// supervision event, since any of them may end the last running worker.
    fn answer_drained(&mut self) {
        if self.draining && self.running() == 0 {
            for waiter in self.drained.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

#[ractor::async_trait]
impl Actor for CompactorActor {
    type Msg = CompactorMsg;
    type State = CompactorState;
    type Arguments = (SharedRef, Arc<Heartbeat>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (shared, heartbeat): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let period = Duration::from_millis(shared.config.runtime.heartbeat_ms);
        let ticker = myself.send_interval(period, || CompactorMsg::Heartbeat);
        Ok(CompactorState {
            shared,
            heartbeat,
            jobs: HashMap::new(),
            queue: VecDeque::new(),
            workers: HashMap::new(),
            finished: 0,
            worker_failures: 0,
            draining: false,
            drained: Vec::new(),
            ticker: Some(ticker),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _busy = state.heartbeat.busy();
        match message {
            CompactorMsg::Compact(job) => {
                let session = job.session;
                match state.jobs.get_mut(&session) {
                    // One compaction per session: a new request only updates where the result
                    // goes (the session actor may have restarted).
                    Some(existing) => existing.job = job,
                    None => {
                        state.jobs.insert(
                            session,
                            Job {
                                job,
                                attempts: 0,
                                worker: None,
                                finished: false,
                            },
                        );
                        state.queue.push_back(session);
                    }
                }
                state
                    .shared
                    .faults
                    .hit_async(FaultPoint::CompactorActorOnRequest, Some(session))
                    .await;
                start_queued(&myself, state).await;
            }
            CompactorMsg::Finished { session, result } => {
                if let Some(job) = state.jobs.get_mut(&session) {
                    job.finished = true;
                    if let Some((id, _, _)) = job.worker.take() {
                        state.workers.remove(&id);
                    }
                }
                // New summaries are embedded by the indexer (when a model is configured).
                if result.is_ok()
                    && let Some(indexer) = state.shared.services.indexer.get()
                {
                    let _ = indexer.cast(IndexerMsg::Dirty);
                }
                state
                    .shared
                    .faults
                    .hit_async(FaultPoint::CompactorActorOnFinished, Some(session))
                    .await;
                if let Some(job) = state.jobs.remove(&session) {
                    state.finished += 1;
                    reply(&job, result);
                }
                start_queued(&myself, state).await;
            }
            CompactorMsg::Retry(session) => {
                if state.jobs.contains_key(&session) && !state.queue.contains(&session) {
                    state.queue.push_front(session);
                }
                start_queued(&myself, state).await;
            }
            CompactorMsg::Heartbeat => {
                // Idle session summarisers (and the credentials they hold) go on this tick too.
                state.shared.session_summarizers.sweep();
                for job in state.jobs.values() {
                    if let Some((_, hb, cell)) = &job.worker
                        && let Some(busy) = hb.stalled(&state.shared.config.runtime)
                    {
                        state.shared.emit(RuntimeEvent::ActorStalled {
                            kind: ActorKind::CompactionWorker,
                            session: Some(job.job.session),
                            busy_ms: busy.as_millis() as u64,
                        });
                        cell.kill();
                    }
                }
            }
            CompactorMsg::Stats(reply) => {
                let _ = reply.send(CompactorStats {
                    running: state.running(),
                    queued: state.queue.len(),
                    finished: state.finished,
                    worker_failures: state.worker_failures,
                });
            }
            CompactorMsg::Drain(reply) => {
                state.draining = true;
                state.drained.push(reply);
            }
        }
        state.answer_drained();
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // Never the default (which stops the supervisor): a worker's end is handled here.
        on_worker_exit(&myself, event, state).await;
        state.answer_drained();
        Ok(())
    }
}

/// A compaction worker stopped (`event`): frees its slot, and retries its job after a failure.
async fn on_worker_exit(
    myself: &ActorRef<CompactorMsg>,
    event: SupervisionEvent,
    state: &mut CompactorState,
) {
    let (cell, error) = match WorkerExit::of(event) {
        Some(WorkerExit::Done(cell)) => {
            // A normal end: its `Finished` message (sent before stopping) carries the
            // result; supervision events may overtake it, so only free the slot here.
            if let Some(session) = state.workers.remove(&cell.get_id())
                && let Some(job) = state.jobs.get_mut(&session)
            {
                job.worker = None;
                job.finished = true;
            }
            start_queued(myself, state).await;
            return;
        }
        Some(WorkerExit::Failed { worker, error }) => (worker, error),
        None => return,
    };
    let Some(session) = state.workers.remove(&cell.get_id()) else {
        return; // A worker that already reported.
    };
    let Some(job) = state.jobs.get_mut(&session) else {
        return;
    };
    job.worker = None;
    if job.finished {
        return;
    }
    state.worker_failures += 1;
    state.shared.emit(RuntimeEvent::ActorFailed {
        kind: ActorKind::CompactionWorker,
        session: Some(session),
        error: error.clone(),
    });
    let config = &state.shared.config.runtime;
    if job.attempts >= config.compaction_max_attempts || state.draining {
        if let Some(job) = state.jobs.remove(&session) {
            reply(&job, Err(format!("compaction worker failed: {error}")));
        }
    } else {
        let delay = backoff(job.attempts, config);
        myself.send_after(delay, move || CompactorMsg::Retry(session));
    }
    start_queued(myself, state).await;
}

fn reply(job: &Job, result: Result<CompactionReport, String>) {
    let _ = job
        .job
        .reply_to
        .cast(SessionMsg::CompactionDone(CompactionOutcome {
            ticket: job.job.ticket,
            attempts: job.attempts,
            result,
        }));
}

/// Starts queued jobs while slots are free.
async fn start_queued(myself: &ActorRef<CompactorMsg>, state: &mut CompactorState) {
    let limit = state.shared.config.runtime.max_concurrent_compactions;
    while !state.draining && state.running() < limit {
        let Some(session) = state.queue.pop_front() else {
            return;
        };
        let Some(job) = state.jobs.get_mut(&session) else {
            continue;
        };
        job.attempts += 1;
        let heartbeat = Heartbeat::new();
        let task = CompactionTask {
            shared: state.shared.clone(),
            session,
            budget: job.job.budget,
            compactor: myself.clone(),
            heartbeat: Arc::clone(&heartbeat),
        };
        match spawn_worker(task, myself.get_cell()).await {
            Ok(worker) => {
                state.workers.insert(worker.get_id(), session);
                job.worker = Some((worker.get_id(), heartbeat, worker.get_cell()));
            }
            Err(error) => {
                if let Some(job) = state.jobs.remove(&session) {
                    reply(
                        &job,
                        Err(format!("could not start a compaction worker: {error}")),
                    );
                }
            }
        }
    }
}

/// One compaction run, in a worker of its own (see [`super::worker`]).
struct CompactionTask {
    shared: SharedRef,
    session: SessionId,
    budget: u64,
    compactor: ActorRef<CompactorMsg>,
    heartbeat: Arc<Heartbeat>,
}

#[async_trait::async_trait]
impl OneShotTask for CompactionTask {
    type Outcome = Result<CompactionReport, String>;

    async fn run(&mut self) -> Self::Outcome {
        let _busy = self.heartbeat.busy();
        let shared = &self.shared;
        // The session's own summariser when a host registered one, else the runtime's: looked
        // up once, so the whole run uses one.
        let (inner, by_session) = shared.summarizer_for(self.session);
        let summarizer = FaultySummarizer {
            inner,
            faults: Arc::clone(&shared.faults),
            session: self.session,
        };
        let mut observer = WorkerObserver {
            shared: shared.clone(),
            session: self.session,
            by_session,
            model: None,
        };
        let started = Instant::now();
        let result = compact_shared(
            Arc::clone(&shared.store),
            self.session,
            self.budget,
            &shared.config.compaction,
            &summarizer,
            &mut observer,
        )
        .await
        .map_err(|e| e.to_string());
        tracing::debug!(session = %self.session, elapsed_ms = started.elapsed().as_millis() as u64, ok = result.is_ok(), "compaction run ended");
        result
    }

    fn report(&self, result: Self::Outcome) {
        let _ = self.compactor.cast(CompactorMsg::Finished {
            session: self.session,
            result,
        });
    }
}

/// Fault points around a compaction's commits, and the event of each summary written.
struct WorkerObserver {
    shared: SharedRef,
    session: SessionId,
    /// Whether the run summarises with the session's own summariser.
    by_session: bool,
    /// The model label of the summary being applied.
    model: Option<String>,
}

impl CompactionObserver for WorkerObserver {
    fn before_apply(&mut self, summary: &NewSummary) {
        self.model = Some(summary.model.clone());
        self.shared
            .faults
            .hit(FaultPoint::CompactorBeforeCommit, Some(self.session));
    }

    fn after_apply(&mut self, pass: &PassReport) {
        self.shared.emit(RuntimeEvent::SummaryWritten {
            session: self.session,
            summary: pass.summary,
            level: pass.level,
            model: self.model.take().unwrap_or_default(),
            session_summarizer: self.by_session,
        });
        self.shared
            .faults
            .hit(FaultPoint::CompactorAfterCommit, Some(self.session));
    }
}

/// The session's summariser (its own, or the runtime's) with the mid-call fault point in front
/// of it.
struct FaultySummarizer {
    inner: Arc<dyn Summarizer>,
    faults: Arc<Faults>,
    session: SessionId,
}

#[async_trait::async_trait]
impl Summarizer for FaultySummarizer {
    fn model(&self) -> &str {
        self.inner.model()
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        self.faults
            .hit_async(FaultPoint::CompactorMidLlmCall, Some(self.session))
            .await;
        self.inner.summarize(call).await
    }

    fn is_offline(&self) -> bool {
        self.inner.is_offline()
    }
}
