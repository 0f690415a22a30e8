//! SessionActor: one per live session; serialises the session's appends and context requests
//! and runs the per-turn threshold policy.
//!
//! - **Append**: tokenises on the blocking pool, then commits through the group writer; the
//!   reply is sent after the commit is durable.
//! - **Context**: asks the assembler for the current context. Below the soft threshold it
//!   answers at once and does nothing else (zero-cost continuity). Between soft and hard it asks
//!   the compactor for a compaction (one at a time per session) and answers at once: summaries
//!   are swapped in atomically when ready. Above the hard threshold the request waits (without
//!   blocking the actor: appends keep flowing) until a compaction brings the context back
//!   under the hard threshold, or cannot. A context that the last compaction could do nothing
//!   for (the same tokens, for the same budget) is answered at once without asking again, so a
//!   host polling an unchanged session costs no compaction runs or summariser calls.
//!
//! The actor's state is a cache of the store: a restarted actor starts from what redb holds,
//! and a compaction it was waiting for is asked for again by the next context request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm_core::config::Thresholds;
use lcm_core::ids::SessionId;
use lcm_core::message::NewMessage;
use lcm_store::Appended;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::assembler::AssemblerMsg;
use super::compactor::{CompactJob, CompactionOutcome, CompactorMsg};
use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::FaultPoint;
use super::indexer::IndexerMsg;
use super::shared::{Shared, SharedRef, ask_service, join_blocking};
use super::supervision::{ActorKind, Heartbeat};
use crate::assembly::AssembledContext;
use crate::compaction::effective_budget;

/// Rounds of compaction a context request above the hard threshold waits for before it is
/// answered with what there is.
const MAX_WAIT_ROUNDS: u32 = 3;

/// Messages of the [`SessionActor`].
pub(crate) enum SessionMsg {
    /// Append messages (one transaction); answered once durable.
    Append {
        messages: Vec<NewMessage>,
        reply: RpcReplyPort<Result<Vec<Appended>, RuntimeError>>,
    },
    /// The context for a model whose window is `budget` tokens.
    Context {
        budget: u64,
        reply: RpcReplyPort<Result<AssembledContext, RuntimeError>>,
    },
    /// The compactor's answer to a request.
    CompactionDone(CompactionOutcome),
    /// The compactor was restarted: a request in flight is asked for again.
    CompactorRestarted,
    /// Stop if idle.
    IdleTick,
    /// Observable state.
    Stats(RpcReplyPort<SessionStats>),
}

/// Observable state of a session actor (for tests and stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStats {
    pub session: SessionId,
    /// A compaction was asked for and has not answered.
    pub compacting: bool,
    /// Context requests waiting for a compaction (above the hard threshold).
    pub waiting: usize,
    /// Compactions asked for by this actor.
    pub compactions_requested: u64,
}

pub(crate) struct SessionActor;

pub(crate) struct SessionArgs {
    pub(crate) shared: SharedRef,
    pub(crate) session: SessionId,
    pub(crate) heartbeat: Arc<Heartbeat>,
}

struct Waiter {
    budget: u64,
    rounds: u32,
    reply: RpcReplyPort<Result<AssembledContext, RuntimeError>>,
}

struct InFlight {
    ticket: u64,
    budget: u64,
}

pub(crate) struct SessionState {
    shared: SharedRef,
    session: SessionId,
    heartbeat: Arc<Heartbeat>,
    compaction: Option<InFlight>,
    /// The context's tokens and the budget of the last compaction that could do nothing:
    /// while a context request finds both unchanged, no compaction is asked for again (it
    /// would plan the same nothing, or write and discard the same summary).
    stuck: Option<(u64, u64)>,
    next_ticket: u64,
    compactions_requested: u64,
    waiters: Vec<Waiter>,
    last_activity: Instant,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

#[ractor::async_trait]
impl Actor for SessionActor {
    type Msg = SessionMsg;
    type State = SessionState;
    type Arguments = SessionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let idle = Duration::from_secs(args.shared.config.runtime.idle_timeout_s.max(1));
        let period = (idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
        let ticker = myself.send_interval(period, || SessionMsg::IdleTick);
        args.shared.emit(RuntimeEvent::SessionStarted {
            session: args.session,
        });
        Ok(SessionState {
            shared: args.shared,
            session: args.session,
            heartbeat: args.heartbeat,
            compaction: None,
            stuck: None,
            next_ticket: 0,
            compactions_requested: 0,
            waiters: Vec::new(),
            last_activity: Instant::now(),
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
            SessionMsg::Append { messages, reply } => {
                state.last_activity = Instant::now();
                let result = append(state, messages).await?;
                let _ = reply.send(result);
            }
            SessionMsg::Context { budget, reply } => {
                state.last_activity = Instant::now();
                context(&myself, state, budget, reply).await?;
            }
            SessionMsg::CompactionDone(outcome) => {
                state.last_activity = Instant::now();
                compaction_done(&myself, state, outcome).await?;
            }
            SessionMsg::CompactorRestarted => {
                if let Some(inflight) = &state.compaction {
                    let (ticket, budget) = (inflight.ticket, inflight.budget);
                    send_compaction(&myself, state, ticket, budget);
                }
            }
            SessionMsg::IdleTick => {
                let idle = Duration::from_secs(state.shared.config.runtime.idle_timeout_s);
                if state.compaction.is_none()
                    && state.waiters.is_empty()
                    && state.last_activity.elapsed() >= idle
                {
                    myself.stop(Some(STOP_IDLE.into()));
                }
            }
            SessionMsg::Stats(reply) => {
                let _ = reply.send(SessionStats {
                    session: state.session,
                    compacting: state.compaction.is_some(),
                    waiting: state.waiters.len(),
                    compactions_requested: state.compactions_requested,
                });
            }
        }
        Ok(())
    }
}

/// Stop reason of a session actor that idled out (not a failure).
pub(crate) const STOP_IDLE: &str = "idle";

async fn append(
    state: &mut SessionState,
    messages: Vec<NewMessage>,
) -> Result<Result<Vec<Appended>, RuntimeError>, ActorProcessingErr> {
    let shared = state.shared.clone();
    let session = state.session;
    // Tokenise here, in parallel with other sessions; only the commit is serialised.
    let prepared = join_blocking(
        tokio::task::spawn_blocking(move || {
            shared
                .store
                .prepare_append(messages.into_iter().map(|m| (session, m)).collect())
        })
        .await,
    )?;
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => return Ok(Err(e.into())),
    };
    state
        .shared
        .faults
        .hit_async(FaultPoint::SessionBeforeCommit, Some(state.session))
        .await;
    let result = state.shared.writer.commit(prepared).await;
    if result.is_ok() {
        state
            .shared
            .faults
            .hit_async(FaultPoint::SessionAfterCommit, Some(state.session))
            .await;
        if let Some(indexer) = state.shared.services.indexer.get() {
            let _ = indexer.cast(IndexerMsg::Dirty);
        }
    }
    Ok(result)
}

/// Asks the assembler for the session's context, waiting out an assembler restart.
async fn assemble(state: &SessionState) -> Result<AssembledContext, RuntimeError> {
    let shared = &state.shared;
    let session = state.session;
    let slot = &shared.services.assembler;
    ask_service(shared, slot, ActorKind::Assembler, |reply| {
        AssemblerMsg::Assemble { session, reply }
    })
    .await?
}

/// The thresholds of a model window of `budget` tokens (less the safety margin).
fn thresholds(shared: &Shared, budget: u64) -> Thresholds {
    let budget = effective_budget(budget, shared.config.tokenizer.safety_margin);
    shared.config.compaction.thresholds(budget)
}

async fn context(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    budget: u64,
    reply: RpcReplyPort<Result<AssembledContext, RuntimeError>>,
) -> Result<(), ActorProcessingErr> {
    if budget == 0 {
        let _ = reply.send(Err(RuntimeError::Invalid("budget must be positive".into())));
        return Ok(());
    }
    let ctx = match assemble(state).await {
        Ok(ctx) => ctx,
        Err(e) => {
            let _ = reply.send(Err(e));
            return Ok(());
        }
    };
    let t = thresholds(&state.shared, budget);
    // Below the soft threshold, or as it was when the last compaction could do nothing.
    if !t.above_soft(ctx.tokens) || state.stuck == Some((ctx.tokens, budget)) {
        let _ = reply.send(fitted(&state.shared, ctx, budget));
        return Ok(());
    }
    request_compaction(myself, state, budget, ctx.tokens);
    if !t.above_hard(ctx.tokens) {
        let _ = reply.send(fitted(&state.shared, ctx, budget));
    } else {
        state.waiters.push(Waiter {
            budget,
            rounds: 0,
            reply,
        });
    }
    Ok(())
}

/// The context fitted to the caller's window less the safety margin: whatever compaction did,
/// what a host gets is within its budget (the budget invariant, `AssembledContext::fit`).
fn fitted(
    shared: &Shared,
    ctx: AssembledContext,
    budget: u64,
) -> Result<AssembledContext, RuntimeError> {
    let budget = effective_budget(budget, shared.config.tokenizer.safety_margin);
    Ok(ctx.fit(budget, 0, shared.store.counter())?)
}

/// Asks the compactor for a compaction unless one is in flight.
fn request_compaction(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    budget: u64,
    tokens: u64,
) {
    if state.compaction.is_some() {
        return;
    }
    state.next_ticket += 1;
    let ticket = state.next_ticket;
    state.compaction = Some(InFlight { ticket, budget });
    state.compactions_requested += 1;
    state.shared.emit(RuntimeEvent::CompactionStarted {
        session: state.session,
        budget,
        tokens,
    });
    send_compaction(myself, state, ticket, budget);
}

fn send_compaction(myself: &ActorRef<SessionMsg>, state: &SessionState, ticket: u64, budget: u64) {
    let job = CompactJob {
        session: state.session,
        budget: effective_budget(budget, state.shared.config.tokenizer.safety_margin),
        ticket,
        reply_to: myself.clone(),
    };
    // If the compactor is restarting, the root tells every session when it is back
    // (`CompactorRestarted`) and the request is sent again then.
    if let Some(compactor) = state.shared.services.compactor.get() {
        let _ = compactor.cast(CompactorMsg::Compact(job));
    }
}

async fn compaction_done(
    myself: &ActorRef<SessionMsg>,
    state: &mut SessionState,
    outcome: CompactionOutcome,
) -> Result<(), ActorProcessingErr> {
    if state
        .compaction
        .as_ref()
        .is_none_or(|c| c.ticket != outcome.ticket)
    {
        return Ok(()); // An answer to a request this actor no longer waits for.
    }
    let budget = state.compaction.take().map_or(0, |c| c.budget);
    let progressed = match &outcome.result {
        Ok(report) => {
            state.stuck = report
                .passes
                .is_empty()
                .then_some((report.tokens_after, budget));
            state.shared.emit(RuntimeEvent::CompactionFinished {
                session: state.session,
                passes: report.passes.len(),
                tokens_before: report.tokens_before,
                tokens_after: report.tokens_after,
                provider_calls: report.provider_calls,
                attempts: outcome.attempts,
                summaries_by_level: report.summaries_by_level(),
            });
            !report.passes.is_empty()
        }
        Err(error) => {
            state.stuck = None;
            state.shared.emit(RuntimeEvent::CompactionFailed {
                session: state.session,
                attempts: outcome.attempts,
                error: error.clone(),
            });
            false
        }
    };
    if state.waiters.is_empty() {
        return Ok(());
    }
    let ctx = match assemble(state).await {
        Ok(ctx) => ctx,
        Err(e) => {
            let message = e.to_string();
            for w in state.waiters.drain(..) {
                let _ = w.reply.send(Err(RuntimeError::Unavailable {
                    kind: ActorKind::Assembler,
                    detail: message.clone(),
                }));
            }
            return Ok(());
        }
    };
    let mut still_waiting = Vec::new();
    for mut w in std::mem::take(&mut state.waiters) {
        let t = thresholds(&state.shared, w.budget);
        w.rounds += 1;
        if !t.above_hard(ctx.tokens) || !progressed || w.rounds >= MAX_WAIT_ROUNDS {
            let _ = w.reply.send(fitted(&state.shared, ctx.clone(), w.budget));
        } else {
            still_waiting.push(w);
        }
    }
    if let Some(budget) = still_waiting.iter().map(|w| w.budget).min() {
        state.waiters = still_waiting;
        request_compaction(myself, state, budget, ctx.tokens);
    }
    Ok(())
}
