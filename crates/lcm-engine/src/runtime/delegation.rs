//! DelegationActor: runs sub-agents for `Task`, `Tasks` and `lcm_expand_query`.
//!
//! For each request it applies the scope-reduction guard ([`crate::guard`]; expansion agents
//! are read-only and exempt), creates the sub-agent's own session linked to its parent (so its
//! whole conversation is stored and searchable), and runs the agent loop in a supervised
//! `SubAgentWorker` child with the runtime's tools, under the configured step, token and time
//! limits. Only the final answer goes back to the caller. A worker that panics is started again
//! (up to `runtime.subagent_max_attempts`) in the same session. The actor records the
//! delegation tree's depth and fan-out.
//!
//! The runs in flight (their caller's reply port, child session, attempts and any result not yet
//! delivered) live in a [`DelegationLedger`] of the runtime's shared state, not in the actor: a
//! DelegationActor that crashes (its workers are killed with it) is restarted by the root
//! supervisor, and its successor resumes every run it finds there: a result already received
//! is delivered, a run whose session was being created gets it, and the others start a worker
//! again in the same child session, up to `runtime.subagent_max_attempts` attempts in all.
//! A run that cannot go on (attempts spent, its session unusable, its turns not all stored, the
//! runtime stopping) fails cleanly: its child session gets a last system message starting with
//! [`SUB_AGENT_END_MARKER`], then its caller gets the error. No child session is left
//! without either the sub-agent's answer to its caller or that marker, except while a full
//! disk refuses the marker: it is then retried until the disk takes it or the runtime stops.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use lcm_core::ids::SessionId;
use lcm_core::message::{NewMessage, Role};
use lcm_core::time::Timestamp;
use lcm_llm::chat::{ChatProvider, ChatRequest, ChatResponse, ChatTurn, ToolSpec};
use lcm_llm::provider::ProviderError;
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde_json::Value;
use tokio::sync::mpsc;

use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::{FaultPoint, Faults};
use super::map_pool::{self, MapPoolMsg};
use super::shared::{SharedRef, join_blocking};
use super::subagent_window::{SessionWindow, StoredTurns};
use super::supervision::{ActorKind, Heartbeat};
use super::worker::{OneShotTask, WorkerExit, spawn_worker};
use crate::agent::{AgentLimits, AgentTools, run_agent, turn_to_message};
use crate::guard::{DelegationCaller, DelegationRequest, check_delegation};
use crate::tools::{
    Caller, DelegateKind, DelegateOutcome, DelegateRequest, Delegator, ToolContext, ToolError,
};

/// Observable state of the delegation actor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DelegationStats {
    /// Sub-agents running now.
    pub running: usize,
    /// Sub-agents started since the actor started.
    pub started: u64,
    /// Delegations refused by the scope-reduction guard.
    pub rejected: u64,
    /// Sub-agent workers that crashed.
    pub worker_failures: u64,
    /// Deepest delegation seen (the main agent is 0).
    pub max_depth: u32,
    /// Most sub-agents started by one parent session.
    pub max_fanout: u64,
}

/// The text a failed sub-agent's child session ends with: a system message
/// `"{SUB_AGENT_END_MARKER} <reason>"` written when its run could not answer its caller
/// (its workers crashed too often, the DelegationActor crashed and the run could not be resumed,
/// its turns could not all be stored, the runtime stopped under it). A child session ends
/// either with the turns of a sub-agent that answered its caller or with this marker.
pub const SUB_AGENT_END_MARKER: &str = "[lcm] sub-agent ended without an answer:";

/// Messages of the [`DelegationActor`].
pub(crate) enum DelegationMsg {
    /// Run a sub-agent for `caller`.
    Run {
        caller: Caller,
        request: DelegateRequest,
        reply: RpcReplyPort<Result<DelegateOutcome, ToolError>>,
    },
    /// A worker finished (sent before it stops).
    Finished {
        run: u64,
        result: Result<DelegateOutcome, ToolError>,
    },
    /// Resume the runs a crashed predecessor left in the ledger (sent to itself on start).
    Recover,
    /// Observable state.
    Stats(RpcReplyPort<DelegationStats>),
}

pub(crate) struct DelegationActor;

/// A delegation in flight.
struct Run {
    caller: Caller,
    request: DelegateRequest,
    /// The child session's key (looked up when the actor crashed while creating it).
    key: String,
    /// The child session, once created.
    session: Option<SessionId>,
    reply: Option<RpcReplyPort<Result<DelegateOutcome, ToolError>>>,
    attempts: u32,
    /// A worker's result not delivered yet (the actor may crash between the two).
    result: Option<Result<DelegateOutcome, ToolError>>,
    /// Held by the task storing an attempt's turns until it has stored the last one: the next
    /// attempt and the end marker wait for it, so they come after every turn of a worker that
    /// was killed.
    turns: Arc<tokio::sync::Mutex<()>>,
}

/// The delegations in flight, in the runtime's shared state so that they outlive a crash of
/// the DelegationActor (see the module docs).
#[derive(Default)]
pub(crate) struct DelegationLedger {
    runs: Mutex<HashMap<u64, Run>>,
    next_run: AtomicU64,
}

impl DelegationLedger {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Run>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn len(&self) -> usize {
        self.lock().len()
    }

    fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Fails every run in flight (the runtime stops): each child session is marked, then each
    /// caller answered.
    pub(crate) async fn fail_all(shared: &SharedRef, reason: &str) {
        let runs: Vec<u64> = shared.delegations.lock().keys().copied().collect();
        for run in runs {
            fail_run(shared, run, reason).await;
        }
    }
}

pub(crate) struct DelegationState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
    /// This incarnation's workers and the run each works for.
    workers: HashMap<ActorId, u64>,
    fanout: HashMap<Option<SessionId>, u64>,
    stats: DelegationStats,
}

#[ractor::async_trait]
impl Actor for DelegationActor {
    type Msg = DelegationMsg;
    type State = DelegationState;
    type Arguments = (SharedRef, Arc<Heartbeat>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (shared, heartbeat): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Runs a crashed predecessor left: resumed before anything else is handled.
        if !shared.delegations.is_empty() {
            let _ = myself.cast(DelegationMsg::Recover);
        }
        Ok(DelegationState {
            shared,
            heartbeat,
            workers: HashMap::new(),
            fanout: HashMap::new(),
            stats: DelegationStats::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _busy = state.heartbeat.busy();
        match message {
            DelegationMsg::Run {
                caller,
                request,
                reply,
            } => start_run(&myself, state, caller, request, reply).await?,
            DelegationMsg::Finished { run, result } => {
                state.workers.retain(|_, r| *r != run);
                let session = {
                    let mut runs = state.shared.delegations.lock();
                    match runs.get_mut(&run) {
                        Some(r) => {
                            r.result = Some(result);
                            r.session
                        }
                        None => return Ok(()),
                    }
                };
                state
                    .shared
                    .faults
                    .hit_async(FaultPoint::DelegationActorBeforeReply, session)
                    .await;
                settle(&state.shared, run).await;
            }
            DelegationMsg::Recover => recover(&myself, state).await,
            DelegationMsg::Stats(reply) => {
                let mut stats = state.stats.clone();
                stats.running = state.shared.delegations.len();
                let _ = reply.send(stats);
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
            Some(WorkerExit::Failed { worker, error }) => (worker, error),
            Some(WorkerExit::Done(_)) | None => return Ok(()),
        };
        let Some(run) = state.workers.remove(&cell.get_id()) else {
            return Ok(());
        };
        state.stats.worker_failures += 1;
        let Some((session, attempts)) = state
            .shared
            .delegations
            .lock()
            .get(&run)
            .filter(|r| r.result.is_none())
            .map(|r| (r.session, r.attempts))
        else {
            return Ok(());
        };
        state.shared.emit(RuntimeEvent::ActorFailed {
            kind: ActorKind::Delegation,
            session,
            error: error.clone(),
        });
        if attempts < state.shared.config.runtime.subagent_max_attempts {
            start_worker(&myself, state, run).await;
        } else {
            fail_run(
                &state.shared,
                run,
                &format!("the sub-agent crashed {attempts} times (last: {error})"),
            )
            .await;
        }
        Ok(())
    }
}

fn tool_name(kind: DelegateKind) -> &'static str {
    match kind {
        DelegateKind::Task => "Task",
        DelegateKind::Expansion => "lcm_expand_query",
    }
}

/// Answers `run`'s caller with its result, if it has one, and forgets the run.
fn deliver(shared: &SharedRef, run: u64) {
    let mut runs = shared.delegations.lock();
    if runs.get(&run).is_some_and(|r| r.result.is_some())
        && let Some(mut r) = runs.remove(&run)
        && let (Some(reply), Some(result)) = (r.reply.take(), r.result.take())
    {
        let _ = reply.send(result);
    }
}

/// Answers `run`'s caller with its worker's result: an answer as it is; a failure (the
/// sub-agent's turns could not all be stored) through [`fail_run`], so that its child session
/// ends with the end marker rather than with whatever turns were stored.
async fn settle(shared: &SharedRef, run: u64) {
    let failure = shared
        .delegations
        .lock()
        .get(&run)
        .and_then(|r| match &r.result {
            Some(Err(ToolError::Failed { message, .. })) => Some(message.clone()),
            Some(Err(other)) => Some(other.to_string()),
            _ => None,
        });
    match failure {
        Some(reason) => fail_run(shared, run, &reason).await,
        None => deliver(shared, run),
    }
}

/// Fails `run` cleanly: its child session (if it was created) gets the end marker, then its
/// caller gets an error naming the session and `reason`.
async fn fail_run(shared: &SharedRef, run: u64, reason: &str) {
    let Some(mut r) = shared.delegations.lock().remove(&run) else {
        return;
    };
    let tool = tool_name(r.request.kind);
    let message = match r.session {
        Some(session) => match mark_ended(shared, session, &r.turns, reason).await {
            Ok(()) => format!("{reason}; its session {session} is marked as ended"),
            Err(RuntimeError::Store(e)) if e.is_storage_failure() => {
                // A full or failing disk: the marker is stored once the disk takes writes again.
                tokio::spawn(mark_when_possible(
                    shared.clone(),
                    session,
                    Arc::clone(&r.turns),
                    reason.to_string(),
                ));
                format!(
                    "{reason}; its session {session} could not be marked as ended yet ({e}): \
                     the marker is stored once the disk accepts writes again"
                )
            }
            Err(e) => format!("{reason}; its session {session} could not be marked: {e}"),
        },
        None => reason.to_string(),
    };
    if let Some(reply) = r.reply.take() {
        let _ = reply.send(Err(ToolError::Failed {
            tool: tool.into(),
            message,
        }));
    }
}

/// How long the end marker waits for a killed worker's last turns to be stored.
const TURNS_DRAIN: Duration = Duration::from_secs(30);

/// Appends the end marker to `session` (through the single writer, durable when it returns),
/// after the turns of its last attempt (`turns`, see [`Run::turns`]).
async fn mark_ended(
    shared: &SharedRef,
    session: SessionId,
    turns: &Arc<tokio::sync::Mutex<()>>,
    reason: &str,
) -> Result<(), RuntimeError> {
    let _stored = tokio::time::timeout(TURNS_DRAIN, Arc::clone(turns).lock_owned()).await;
    let message = NewMessage::text(Role::System, format!("{SUB_AGENT_END_MARKER} {reason}"));
    let s = shared.clone();
    let prepared = join_blocking(
        tokio::task::spawn_blocking(move || s.store.prepare_append(vec![(session, message)])).await,
    )??;
    shared.writer.commit(prepared).await.map(|_| ())
}

/// The first wait before an end marker the store refused is tried again; each failure
/// doubles it, up to [`MARKER_RETRY_LONGEST`].
const MARKER_RETRY_FIRST: Duration = Duration::from_millis(200);
const MARKER_RETRY_LONGEST: Duration = Duration::from_secs(10);

/// Stores an end marker the store refused (a full or failing disk) once it accepts writes
/// again: tried after growing waits until it is stored or the runtime starts closing (then
/// the session is left as a crash would leave it).
async fn mark_when_possible(
    shared: SharedRef,
    session: SessionId,
    turns: Arc<tokio::sync::Mutex<()>>,
    reason: String,
) {
    let mut wait = MARKER_RETRY_FIRST;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shared.closing() => {
                tracing::warn!(%session, "the runtime closed before a sub-agent's end marker could be stored");
                return;
            }
        }
        match mark_ended(&shared, session, &turns, &reason).await {
            Ok(()) => {
                tracing::info!(%session, "a sub-agent's end marker stored once the disk took writes again");
                return;
            }
            Err(RuntimeError::Store(e)) if e.is_storage_failure() => {
                tracing::debug!(%session, error = %e, "the end marker still cannot be stored");
                wait = (wait * 2).min(MARKER_RETRY_LONGEST);
            }
            Err(e) => {
                tracing::warn!(%session, error = %e, "a sub-agent's end marker cannot be stored");
                return;
            }
        }
    }
}

/// Resumes the runs a crashed predecessor left in the ledger (see the module docs).
async fn recover(myself: &ActorRef<DelegationMsg>, state: &mut DelegationState) {
    let shared = state.shared.clone();
    let runs: Vec<u64> = shared.delegations.lock().keys().copied().collect();
    let max_attempts = shared.config.runtime.subagent_max_attempts;
    for run in runs {
        let Some((session, key, parent, attempts, answered)) =
            shared.delegations.lock().get(&run).map(|r| {
                (
                    r.session,
                    r.key.clone(),
                    r.caller.session,
                    r.attempts,
                    r.result.is_some(),
                )
            })
        else {
            continue;
        };
        if answered {
            settle(&shared, run).await;
            continue;
        }
        if session.is_none() {
            // The predecessor crashed while creating the session: it exists or it does not.
            let store = Arc::clone(&shared.store);
            let found =
                tokio::task::spawn_blocking(move || match store.session_id_for_key(&key)? {
                    Some(id) => Ok(id),
                    None => store.create_session(&key, parent),
                })
                .await;
            match found {
                Ok(Ok(id)) => {
                    if let Some(r) = shared.delegations.lock().get_mut(&run) {
                        r.session = Some(id);
                    }
                }
                Ok(Err(e)) => {
                    fail_run(
                        &shared,
                        run,
                        &format!("its session could not be created: {e}"),
                    )
                    .await;
                    continue;
                }
                Err(e) => {
                    fail_run(
                        &shared,
                        run,
                        &format!("its session could not be created: {e}"),
                    )
                    .await;
                    continue;
                }
            }
        }
        if attempts >= max_attempts {
            fail_run(
                &shared,
                run,
                &format!(
                    "the delegation actor crashed while the sub-agent ran, after {attempts} attempts"
                ),
            )
            .await;
        } else {
            start_worker(myself, state, run).await;
        }
    }
}

async fn start_run(
    myself: &ActorRef<DelegationMsg>,
    state: &mut DelegationState,
    caller: Caller,
    request: DelegateRequest,
    reply: RpcReplyPort<Result<DelegateOutcome, ToolError>>,
) -> Result<(), ActorProcessingErr> {
    let tool = tool_name(request.kind);
    if request.kind == DelegateKind::Task {
        let verdict = check_delegation(
            &DelegationCaller {
                depth: caller.depth,
                task: caller.task.clone().unwrap_or_default(),
                scope: caller.scope.clone(),
            },
            &DelegationRequest {
                prompt: request.prompt.clone(),
                delegated_scope: request.delegated_scope.clone(),
                kept_work: request.kept_work.clone(),
                read_only: request.read_only,
                parallel: request.parallel,
            },
        );
        if let Err(rejection) = verdict {
            state.stats.rejected += 1;
            let _ = reply.send(Err(ToolError::NotPermitted {
                tool: tool.into(),
                reason: rejection.to_string(),
            }));
            return Ok(());
        }
    }
    if state.shared.llm.is_none() {
        let _ = reply.send(Err(ToolError::Unsupported {
            tool: tool.into(),
            message: "no model is configured for sub-agents: set [llm] provider to \"openai\" or \"anthropic\"".into(),
        }));
        return Ok(());
    }
    let run = state
        .shared
        .delegations
        .next_run
        .fetch_add(1, Ordering::Relaxed)
        + 1;
    let parent = caller.session;
    let key = format!(
        "{}/{}-{}-{run}",
        parent.map_or_else(|| "root".to_string(), |p| p.to_string()),
        match request.kind {
            DelegateKind::Task => "task",
            DelegateKind::Expansion => "expansion",
        },
        Timestamp::now().millis()
    );
    let depth = caller.depth + 1;
    // In the ledger before the session exists: a crash from here on leaves a run to resume.
    state.shared.delegations.lock().insert(
        run,
        Run {
            caller,
            request,
            key: key.clone(),
            session: None,
            reply: Some(reply),
            attempts: 0,
            result: None,
            turns: Arc::new(tokio::sync::Mutex::new(())),
        },
    );
    let store = Arc::clone(&state.shared.store);
    let session = join_blocking(
        tokio::task::spawn_blocking(move || store.create_session(&key, parent)).await,
    )?;
    let session = match session {
        Ok(s) => s,
        Err(e) => {
            if let Some(mut r) = state.shared.delegations.lock().remove(&run)
                && let Some(reply) = r.reply.take()
            {
                let _ = reply.send(Err(ToolError::failed(tool, e)));
            }
            return Ok(());
        }
    };
    if let Some(r) = state.shared.delegations.lock().get_mut(&run) {
        r.session = Some(session);
    }
    state.stats.started += 1;
    state.stats.max_depth = state.stats.max_depth.max(depth);
    let fanout = state.fanout.entry(parent).or_default();
    *fanout += 1;
    state.stats.max_fanout = state.stats.max_fanout.max(*fanout);
    state
        .shared
        .faults
        .hit_async(FaultPoint::DelegationActorBeforeWorker, Some(session))
        .await;
    start_worker(myself, state, run).await;
    Ok(())
}

async fn start_worker(myself: &ActorRef<DelegationMsg>, state: &mut DelegationState, run: u64) {
    let Some(llm) = state.shared.llm.clone() else {
        return;
    };
    let task = {
        let mut runs = state.shared.delegations.lock();
        let Some(r) = runs.get_mut(&run) else {
            return;
        };
        let Some(session) = r.session else {
            return;
        };
        r.attempts += 1;
        SubAgentRun {
            shared: state.shared.clone(),
            run,
            session,
            caller: r.caller.clone(),
            request: r.request.clone(),
            chat: llm.chat,
            delegation: myself.clone(),
            turns: Arc::clone(&r.turns),
        }
    };
    match spawn_worker(task, myself.get_cell()).await {
        Ok(worker) => {
            state.workers.insert(worker.get_id(), run);
        }
        Err(e) => {
            fail_run(
                &state.shared,
                run,
                &format!("could not start a sub-agent worker: {e}"),
            )
            .await;
        }
    }
}

/// One sub-agent's run, in a worker of its own (see [`super::worker`]).
struct SubAgentRun {
    shared: SharedRef,
    run: u64,
    session: SessionId,
    caller: Caller,
    request: DelegateRequest,
    chat: Arc<dyn ChatProvider>,
    delegation: ActorRef<DelegationMsg>,
    /// See [`Run::turns`].
    turns: Arc<tokio::sync::Mutex<()>>,
}

#[async_trait]
impl OneShotTask for SubAgentRun {
    type Outcome = Result<DelegateOutcome, ToolError>;

    async fn run(&mut self) -> Self::Outcome {
        run_sub_agent(self).await
    }

    fn report(&self, result: Self::Outcome) {
        let _ = self.delegation.cast(DelegationMsg::Finished {
            run: self.run,
            result,
        });
    }
}

const TASK_SYSTEM: &str = "You are a sub-agent with your own context. Work on the task you are given with the tools available, then reply with your final answer only: the parent agent sees nothing but that answer.";

const EXPANSION_SYSTEM: &str = "You are a read-only exploration agent over a long conversation whose older parts were compacted into summaries (ids sum_N) over the original messages (ids msg_N). Use lcm_expand, lcm_describe and lcm_grep to read the original messages, then answer the question concisely, citing the ids your answer rests on.";

async fn run_sub_agent(state: &SubAgentRun) -> Result<DelegateOutcome, ToolError> {
    let shared = &state.shared;
    let config = &shared.config.runtime;
    let depth = state.caller.depth + 1;
    let read_only = state.request.read_only || state.request.kind == DelegateKind::Expansion;
    let caller = Caller {
        session: Some(state.session),
        is_sub_agent: true,
        depth,
        task: Some(state.request.prompt.clone()),
        scope: state.request.delegated_scope.clone(),
        read_only,
        map_input_limit: state.request.map_input_limit,
    };
    let tools = RegistryTools::new(shared, caller);
    let chat = FaultyChat {
        inner: Arc::clone(&state.chat),
        faults: Arc::clone(&shared.faults),
        session: state.session,
    };
    let limits = AgentLimits {
        max_steps: state.request.max_steps.unwrap_or(config.subagent_max_steps),
        max_total_tokens: config.subagent_max_tokens,
        ..AgentLimits::default()
    }
    .with_timeout(Duration::from_secs(config.subagent_timeout_s));

    // The sub-agent's turns are stored in its session as they happen, in order; each step's
    // request is that session's context (the window waits for the turns to be stored).
    let (tx, mut rx) = mpsc::unbounded_channel::<ChatTurn>();
    let writer_shared = shared.clone();
    let session = state.session;
    let stored = Arc::new(StoredTurns::default());
    let storing_progress = Arc::clone(&stored);
    // After the turns of an earlier attempt (killed with its worker) are all stored; held until
    // this attempt's last turn is.
    let turns_guard = Arc::clone(&state.turns).lock_owned().await;
    let storing = tokio::spawn(async move {
        let _turns_guard = turns_guard;
        while let Some(turn) = rx.recv().await {
            let message = turn_to_message(&turn);
            let s = writer_shared.clone();
            let prepared = tokio::task::spawn_blocking(move || {
                s.store.prepare_append(vec![(session, message)])
            })
            .await;
            let ok = match prepared {
                Ok(Ok(prepared)) => match writer_shared.writer.commit(prepared).await {
                    Ok(_) => true,
                    Err(e) => {
                        tracing::warn!(%session, error = %e, "a sub-agent turn could not be stored");
                        false
                    }
                },
                _ => false,
            };
            storing_progress.handled(ok);
        }
    });
    let window = SessionWindow {
        shared: shared.clone(),
        session,
        stored: Arc::clone(&stored),
    };
    let system = match state.request.kind {
        DelegateKind::Task => TASK_SYSTEM,
        DelegateKind::Expansion => EXPANSION_SYSTEM,
    };
    let mut observer = move |turn: &ChatTurn| {
        let _ = tx.send(turn.clone());
    };
    let outcome = run_agent(
        &chat,
        &tools,
        Some(system),
        state.request.prompt.clone(),
        limits,
        &mut observer,
        Some(&window),
    )
    .await;
    drop(observer);
    let _ = storing.await;
    // The answer stands on the turns in the sub-agent's session: a delegation whose turns did
    // not all reach it (the disk failed) is not reported as done.
    if stored.any_failed() {
        return Err(ToolError::failed(
            tool_name(state.request.kind),
            format!("the sub-agent's turns could not all be stored in {session}"),
        ));
    }
    Ok(DelegateOutcome {
        session: state.session,
        answer: outcome.answer,
        stop: outcome.stop.name(),
        steps: outcome.steps,
        tokens: outcome.usage.total(),
        depth,
    })
}

/// The tool context for `caller`: the runtime's store, index, configuration and delegator.
pub(crate) fn tool_context(shared: &SharedRef, caller: Caller) -> ToolContext {
    ToolContext::new(
        Arc::clone(&shared.store),
        Some(Arc::clone(&shared.index)),
        Arc::clone(&shared.config),
        caller,
    )
    .with_delegator(Arc::new(RuntimeDelegator {
        shared: shared.clone(),
    }))
}

/// The runtime's tools as the agent loop ([`run_agent`]) sees them: the registry (built-ins,
/// `llm_map`, the host's tools) offered to and called with one caller's context. Sub-agents run
/// on it; [`super::SessionHandle::agent_tools`] gives a session's main agent the same.
pub struct RegistryTools {
    ctx: ToolContext,
}

impl RegistryTools {
    /// The tools as `caller` is offered and calls them in the runtime `shared`.
    pub(crate) fn new(shared: &SharedRef, caller: Caller) -> RegistryTools {
        RegistryTools {
            ctx: tool_context(shared, caller),
        }
    }
}

#[async_trait]
impl AgentTools for RegistryTools {
    fn specs(&self) -> Vec<ToolSpec> {
        registry_of(&self.ctx)
            .definitions_for(&self.ctx.caller)
            .into_iter()
            .map(|d| ToolSpec::new(d.name, d.description, d.parameters))
            .collect()
    }

    async fn execute(&self, name: &str, arguments: &Value) -> Result<Value, String> {
        registry_of(&self.ctx)
            .call(&self.ctx, name, arguments.clone())
            .await
            .map_err(|e| e.to_string())
    }
}

fn registry_of(ctx: &ToolContext) -> &crate::tools::ToolRegistry {
    // The delegator of a runtime context always is a RuntimeDelegator (see `tool_context`).
    match ctx.delegator.as_ref().and_then(|d| d.registry()) {
        Some(registry) => registry,
        None => empty_registry(),
    }
}

fn empty_registry() -> &'static crate::tools::ToolRegistry {
    static EMPTY: std::sync::OnceLock<crate::tools::ToolRegistry> = std::sync::OnceLock::new();
    EMPTY.get_or_init(crate::tools::ToolRegistry::new)
}

/// How many times a delegation is sent to a DelegationActor that drops it unrecorded.
const DELEGATE_SEND_ATTEMPTS: u32 = 3;

/// The runtime as a [`Delegator`]: sends runs to the DelegationActor.
#[derive(Clone)]
pub(crate) struct RuntimeDelegator {
    pub(crate) shared: SharedRef,
}

impl std::fmt::Debug for RuntimeDelegator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RuntimeDelegator")
    }
}

#[async_trait]
impl Delegator for RuntimeDelegator {
    async fn delegate(
        &self,
        caller: &Caller,
        request: DelegateRequest,
    ) -> Result<DelegateOutcome, ToolError> {
        let tool = tool_name(request.kind);
        let shared = &self.shared;
        // A run the actor records is answered even if the actor crashes (the ledger keeps its
        // reply port). A request dropped unanswered was never recorded (it was still in the
        // mailbox of an actor that crashed): nothing of it exists, so it is sent again to the
        // restarted actor, a bounded number of times.
        let mut last_error = String::new();
        // The actor seen to stop: until its supervisor has handled the stop the slot still
        // holds it, so the next attempt waits for its successor (not three tries at the dead
        // one in a row while a busy machine restarts it).
        let mut stopped: Option<ractor::ActorId> = None;
        for _ in 0..DELEGATE_SEND_ATTEMPTS {
            let deadline = std::time::Instant::now() + shared.call_timeout();
            let slot = &shared.services.delegation;
            let actor = match stopped {
                None => slot.wait(ActorKind::Delegation, shared, deadline).await,
                Some(id) => {
                    slot.wait_successor(ActorKind::Delegation, shared, deadline, id)
                        .await
                }
            }
            .map_err(|e| ToolError::failed(tool, e))?;
            let caller = caller.clone();
            let request = request.clone();
            // A sub-agent is bounded by its own deadline, not by the call timeout.
            match actor
                .call(
                    move |reply| DelegationMsg::Run {
                        caller,
                        request,
                        reply,
                    },
                    None,
                )
                .await
            {
                Ok(ractor::rpc::CallResult::Success(result)) => return result,
                Ok(ractor::rpc::CallResult::SenderError) => {
                    last_error = "it stopped before answering".into();
                    stopped = Some(actor.get_id());
                }
                Ok(ractor::rpc::CallResult::Timeout) => last_error = "no answer in time".into(),
                Err(_) => {
                    last_error = "it was not running".into();
                    stopped = Some(actor.get_id());
                }
            }
        }
        Err(ToolError::failed(
            tool,
            format!(
                "the delegation actor stopped {DELEGATE_SEND_ATTEMPTS} times before taking the sub-agent's run (last: {last_error}); no sub-agent session was created"
            ),
        ))
    }

    fn has_model(&self) -> bool {
        self.shared.llm.is_some()
    }

    async fn run_map(
        &self,
        caller: &Caller,
        request: crate::operators::MapRequest,
    ) -> Result<crate::operators::MapSummary, ToolError> {
        let tool = match request.kind {
            lcm_store::MapKind::Llm => "llm_map",
            lcm_store::MapKind::Agentic => "agentic_map",
        };
        let shared = &self.shared;
        let request = Box::new(request);
        let caller = Box::new(caller.clone());
        let job = map_pool::call(shared, move |reply| MapPoolMsg::Start {
            request,
            caller,
            reply,
        })
        .await
        .map_err(|e| ToolError::failed(tool, e))?
        .map_err(|e| map_refusal(tool, e))?;
        match map_pool::wait(shared, job.id).await {
            Ok(summary) => summary.map_err(|e| ToolError::failed(tool, e)),
            Err(RuntimeError::Unavailable { .. }) => Err(ToolError::failed(
                tool,
                format!(
                    "the map worker pool stopped while {} ran; the job stays in the store: `lcm map resume {}` runs it again",
                    job.id, job.id
                ),
            )),
            Err(e) => Err(ToolError::failed(tool, e)),
        }
    }

    fn registry(&self) -> Option<&crate::tools::ToolRegistry> {
        Some(&self.shared.tools)
    }
}

/// A map the pool refused to start: a bad request is the caller's to fix.
fn map_refusal(tool: &str, error: RuntimeError) -> ToolError {
    match error {
        RuntimeError::Invalid(message) => ToolError::InvalidRequest {
            tool: tool.into(),
            message,
        },
        other => ToolError::failed(tool, other),
    }
}

/// The chat provider with the mid-call fault point in front of it.
struct FaultyChat {
    inner: Arc<dyn ChatProvider>,
    faults: Arc<Faults>,
    session: SessionId,
}

#[async_trait]
impl ChatProvider for FaultyChat {
    async fn chat(&self, req: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        self.faults
            .hit_async(FaultPoint::DelegationMidLlmCall, Some(self.session))
            .await;
        self.inner.chat(req).await
    }

    fn model(&self) -> &str {
        self.inner.model()
    }
}
