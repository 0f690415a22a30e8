//! The root supervisor: starts the singleton actors and one actor per live session, restarts
//! them with backoff when they fail, kills the ones that are stuck, and refuses a session that
//! keeps failing without affecting the others.
//!
//! Restart policy by kind:
//! - **singletons** (compactor, assembler, indexer, integrity): restarted after a backoff that
//!   doubles per failure within `runtime.restart_window_s`; past `runtime.max_restarts` the
//!   runtime gives up and stops (a host sees `ShuttingDown` and the `ActorFailed` events).
//!   After the compactor restarts, every session is told, so requests it lost are sent again.
//! - **sessions**: restarted lazily, on the session's next call (after the same backoff); a
//!   session past the restart limit is quarantined until the runtime restarts.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm_core::ids::SessionId;
use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};

use super::assembler::AssemblerActor;
use super::compactor::CompactorActor;
use super::delegation::{DelegationActor, DelegationLedger};
use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::indexer::IndexerActor;
use super::integrity::IntegrityActor;
use super::map_pool::MapWorkerPool;
use super::session::{STOP_IDLE, SessionActor, SessionArgs, SessionMsg};
use super::shared::{Shared, SharedRef, join_blocking};
use super::supervision::{ActorKind, Heartbeat, RestartHistory, backoff};

/// Messages of the root supervisor.
pub(crate) enum RootMsg {
    /// The actor of `session`, started if needed.
    Session {
        session: SessionId,
        reply: RpcReplyPort<Result<ActorRef<SessionMsg>, RuntimeError>>,
    },
    /// Start a singleton again (sent after its backoff delay).
    Respawn(ActorKind),
    /// Look for stuck actors.
    Heartbeat,
    /// Observable state.
    Stats(RpcReplyPort<SupervisorStats>),
    /// Stop restarting anything and starting sessions; answer with the live session actors.
    BeginShutdown(RpcReplyPort<Vec<ActorRef<SessionMsg>>>),
}

/// Observable state of the root supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SupervisorStats {
    /// Session actors alive now.
    pub live_sessions: usize,
    /// Sessions refused after too many failures.
    pub quarantined_sessions: usize,
    /// Restarts so far, by actor kind.
    pub restarts: Vec<(ActorKind, u64)>,
    /// Actors killed as stuck.
    pub stalls: u64,
}

pub(crate) struct RootActor;

struct Member {
    kind: ActorKind,
    session: Option<SessionId>,
    heartbeat: Arc<Heartbeat>,
    cell: ActorCell,
}

pub(crate) struct RootState {
    shared: SharedRef,
    sessions: HashMap<SessionId, ActorRef<SessionMsg>>,
    members: HashMap<ActorId, Member>,
    session_failures: HashMap<SessionId, RestartHistory>,
    quarantined: HashSet<SessionId>,
    service_failures: HashMap<ActorKind, RestartHistory>,
    restarts: HashMap<ActorKind, u64>,
    stalls: u64,
    shutting_down: bool,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

const SINGLETONS: [ActorKind; 6] = [
    ActorKind::Assembler,
    ActorKind::Indexer,
    ActorKind::Compactor,
    ActorKind::Integrity,
    ActorKind::MapWorkerPool,
    ActorKind::Delegation,
];

#[ractor::async_trait]
impl Actor for RootActor {
    type Msg = RootMsg;
    type State = RootState;
    type Arguments = SharedRef;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        shared: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let period = Duration::from_millis(shared.config.runtime.heartbeat_ms);
        let mut state = RootState {
            shared,
            sessions: HashMap::new(),
            members: HashMap::new(),
            session_failures: HashMap::new(),
            quarantined: HashSet::new(),
            service_failures: HashMap::new(),
            restarts: HashMap::new(),
            stalls: 0,
            shutting_down: false,
            ticker: None,
        };
        for kind in SINGLETONS {
            spawn_singleton(&myself, &mut state, kind).await?;
        }
        state.ticker = Some(myself.send_interval(period, || RootMsg::Heartbeat));
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(t) = state.ticker.take() {
            t.abort();
        }
        // Sub-agents in flight end with the runtime: their sessions marked, their callers told.
        DelegationLedger::fail_all(&state.shared, "the runtime stopped while the sub-agent ran")
            .await;
        let services = &state.shared.services;
        services.assembler.set(None);
        services.compactor.set(None);
        services.indexer.set(None);
        services.integrity.set(None);
        services.map_pool.set(None);
        services.delegation.set(None);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            RootMsg::Session { session, reply } => {
                let result = session_actor(&myself, state, session).await;
                let _ = reply.send(result);
            }
            RootMsg::Respawn(kind) => {
                if !state.shutting_down {
                    if let Err(error) = spawn_singleton(&myself, state, kind).await {
                        // Could not even start: count it as another failure.
                        on_singleton_failure(&myself, state, kind, error.to_string());
                    } else if kind == ActorKind::Compactor {
                        for actor in state.sessions.values() {
                            let _ = actor.cast(SessionMsg::CompactorRestarted);
                        }
                    }
                }
            }
            RootMsg::Heartbeat => {
                let config = &state.shared.config.runtime;
                for member in state.members.values() {
                    if let Some(busy) = member.heartbeat.stalled(config) {
                        state.stalls += 1;
                        state.shared.emit(RuntimeEvent::ActorStalled {
                            kind: member.kind,
                            session: member.session,
                            busy_ms: busy.as_millis() as u64,
                        });
                        member.cell.kill();
                    }
                }
            }
            RootMsg::Stats(reply) => {
                let mut restarts: Vec<(ActorKind, u64)> =
                    state.restarts.iter().map(|(k, n)| (*k, *n)).collect();
                restarts.sort_by_key(|(k, _)| format!("{k}"));
                let _ = reply.send(SupervisorStats {
                    live_sessions: state.sessions.len(),
                    quarantined_sessions: state.quarantined.len(),
                    restarts,
                    stalls: state.stalls,
                });
            }
            RootMsg::BeginShutdown(reply) => {
                state.shutting_down = true;
                let _ = reply.send(state.sessions.values().cloned().collect());
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
        // Never ractor's default here: it would stop the whole runtime on any child's exit.
        let (cell, failure) = match event {
            SupervisionEvent::ActorFailed(cell, error) => (cell, Some(error.to_string())),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                let expected = state.shutting_down || reason.as_deref() == Some(STOP_IDLE);
                let failure = (!expected)
                    .then(|| reason.unwrap_or_else(|| "stopped without a reason (killed)".into()));
                (cell, failure)
            }
            _ => return Ok(()),
        };
        let Some(member) = state.members.remove(&cell.get_id()) else {
            return Ok(());
        };
        match member.session {
            Some(session) => {
                if state
                    .sessions
                    .get(&session)
                    .is_some_and(|a| a.get_id() == cell.get_id())
                {
                    state.sessions.remove(&session);
                }
                match failure {
                    None => state.shared.emit(RuntimeEvent::SessionStopped {
                        session,
                        reason: if state.shutting_down {
                            "shutdown".into()
                        } else {
                            STOP_IDLE.into()
                        },
                    }),
                    Some(error) => on_session_failure(state, session, error),
                }
            }
            None => {
                if let Some(error) = failure {
                    on_singleton_failure(&myself, state, member.kind, error);
                }
            }
        }
        Ok(())
    }
}

fn on_session_failure(state: &mut RootState, session: SessionId, error: String) {
    state.shared.emit(RuntimeEvent::ActorFailed {
        kind: ActorKind::Session,
        session: Some(session),
        error,
    });
    *state.restarts.entry(ActorKind::Session).or_default() += 1;
    let failures = state
        .session_failures
        .entry(session)
        .or_default()
        .record(Instant::now(), &state.shared.config.runtime);
    if failures > state.shared.config.runtime.max_restarts {
        state.quarantined.insert(session);
        state
            .shared
            .emit(RuntimeEvent::SessionQuarantined { session, failures });
    }
}

fn on_singleton_failure(
    myself: &ActorRef<RootMsg>,
    state: &mut RootState,
    kind: ActorKind,
    error: String,
) {
    state.shared.emit(RuntimeEvent::ActorFailed {
        kind,
        session: None,
        error,
    });
    clear_service(&state.shared, kind);
    if state.shutting_down {
        return;
    }
    let config = &state.shared.config.runtime;
    let failures = state
        .service_failures
        .entry(kind)
        .or_default()
        .record(Instant::now(), config);
    if failures > config.max_restarts {
        tracing::error!(%kind, failures, "actor keeps failing; stopping the runtime");
        state.shared.set_closing();
        myself.stop(Some(format!("the {kind} actor failed {failures} times")));
        return;
    }
    let delay = backoff(failures, config);
    let restarts = state.restarts.entry(kind).or_default();
    *restarts += 1;
    state.shared.emit(RuntimeEvent::ActorRestarted {
        kind,
        restarts: *restarts,
        delay_ms: delay.as_millis() as u64,
    });
    myself.send_after(delay, move || RootMsg::Respawn(kind));
}

fn clear_service(shared: &Shared, kind: ActorKind) {
    let s = &shared.services;
    match kind {
        ActorKind::Assembler => s.assembler.set(None),
        ActorKind::Compactor => s.compactor.set(None),
        ActorKind::Indexer => s.indexer.set(None),
        ActorKind::Integrity => s.integrity.set(None),
        ActorKind::MapWorkerPool => s.map_pool.set(None),
        ActorKind::Delegation => s.delegation.set(None),
        _ => {}
    }
}

async fn spawn_singleton(
    myself: &ActorRef<RootMsg>,
    state: &mut RootState,
    kind: ActorKind,
) -> Result<(), ActorProcessingErr> {
    let shared = state.shared.clone();
    let heartbeat = Heartbeat::new();
    let args = (shared.clone(), Arc::clone(&heartbeat));
    let supervisor = myself.get_cell();
    let cell = match kind {
        ActorKind::Assembler => {
            let (a, _) =
                AssemblerActor::spawn_linked(None, AssemblerActor, args, supervisor).await?;
            shared.services.assembler.set(Some(a.clone()));
            a.get_cell()
        }
        ActorKind::Compactor => {
            let (a, _) =
                CompactorActor::spawn_linked(None, CompactorActor, args, supervisor).await?;
            shared.services.compactor.set(Some(a.clone()));
            a.get_cell()
        }
        ActorKind::Indexer => {
            let (a, _) = IndexerActor::spawn_linked(None, IndexerActor, args, supervisor).await?;
            shared.services.indexer.set(Some(a.clone()));
            a.get_cell()
        }
        ActorKind::Integrity => {
            let (a, _) =
                IntegrityActor::spawn_linked(None, IntegrityActor, args, supervisor).await?;
            shared.services.integrity.set(Some(a.clone()));
            a.get_cell()
        }
        ActorKind::MapWorkerPool => {
            let (a, _) = MapWorkerPool::spawn_linked(None, MapWorkerPool, args, supervisor).await?;
            shared.services.map_pool.set(Some(a.clone()));
            a.get_cell()
        }
        ActorKind::Delegation => {
            let (a, _) =
                DelegationActor::spawn_linked(None, DelegationActor, args, supervisor).await?;
            shared.services.delegation.set(Some(a.clone()));
            a.get_cell()
        }
        other => return Err(format!("{other} is not a singleton").into()),
    };
    state.members.insert(
        cell.get_id(),
        Member {
            kind,
            session: None,
            heartbeat,
            cell,
        },
    );
    Ok(())
}

async fn session_actor(
    myself: &ActorRef<RootMsg>,
    state: &mut RootState,
    session: SessionId,
) -> Result<ActorRef<SessionMsg>, RuntimeError> {
    if state.shutting_down || state.shared.is_closing() {
        return Err(RuntimeError::ShuttingDown);
    }
    if let Some(actor) = state.sessions.get(&session)
        && matches!(
            actor.get_status(),
            ractor::ActorStatus::Running | ractor::ActorStatus::Starting
        )
    {
        return Ok(actor.clone());
    }
    if state.quarantined.contains(&session) {
        let failures = state
            .session_failures
            .get(&session)
            .map_or(0, |h| h.total as u32);
        return Err(RuntimeError::SessionQuarantined { session, failures });
    }
    // Restart backoff: a session that just failed starts again only after its delay (the
    // caller waits it out; the root never sleeps).
    if let Some(history) = state.session_failures.get(&session) {
        let now = Instant::now();
        let ready = history.ready_at(now, &state.shared.config.runtime);
        if ready > now {
            return Err(RuntimeError::Restarting {
                kind: ActorKind::Session,
                retry_after: ready - now,
            });
        }
    }
    // The session must exist in the store (the truth); an actor is never made up for it.
    let store = Arc::clone(&state.shared.store);
    join_blocking(tokio::task::spawn_blocking(move || store.session(session)).await)??;
    let heartbeat = Heartbeat::new();
    let args = SessionArgs {
        shared: state.shared.clone(),
        session,
        heartbeat: Arc::clone(&heartbeat),
    };
    let (actor, _) = SessionActor::spawn_linked(None, SessionActor, args, myself.get_cell())
        .await
        .map_err(|e| RuntimeError::Unavailable {
            kind: ActorKind::Session,
            detail: e.to_string(),
        })?;
    state.members.insert(
        actor.get_id(),
        Member {
            kind: ActorKind::Session,
            session: Some(session),
            heartbeat,
            cell: actor.get_cell(),
        },
    );
    state.sessions.insert(session, actor.clone());
    Ok(actor)
}
