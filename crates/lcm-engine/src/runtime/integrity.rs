//! IntegrityActor: checks the store's invariants on a schedule and on demand, and applies the
//! safe repairs when asked (see `lcm_store::integrity` for the checks and repairs themselves).

use std::sync::Arc;
use std::time::Duration;

use lcm_store::integrity::{IntegrityReport, RepairReport, check, repair};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::FaultPoint;
use super::shared::{SharedRef, join_blocking};
use super::supervision::Heartbeat;

/// The result of an integrity check run by the runtime.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IntegrityOutcome {
    /// What the check found (before any repair).
    pub report: IntegrityReport,
    /// What was repaired, when repairs were asked for.
    pub repaired: Option<RepairReport>,
    /// The check after the repairs, when repairs were asked for.
    pub after: Option<IntegrityReport>,
}

/// Messages of the [`IntegrityActor`].
pub(crate) enum IntegrityMsg {
    /// Check now (and repair what is safe to repair if `repair`).
    Check {
        repair: bool,
        reply: RpcReplyPort<Result<IntegrityOutcome, RuntimeError>>,
    },
    /// The scheduled background check.
    Scheduled,
}

pub(crate) struct IntegrityActor;

pub(crate) struct IntegrityState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

#[ractor::async_trait]
impl Actor for IntegrityActor {
    type Msg = IntegrityMsg;
    type State = IntegrityState;
    type Arguments = (SharedRef, Arc<Heartbeat>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (shared, heartbeat): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let interval = shared.config.runtime.integrity_interval_s;
        let ticker = (interval > 0).then(|| {
            myself.send_interval(Duration::from_secs(interval), || IntegrityMsg::Scheduled)
        });
        Ok(IntegrityState {
            shared,
            heartbeat,
            ticker,
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
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _busy = state.heartbeat.busy();
        match message {
            IntegrityMsg::Check { repair, reply } => {
                let outcome = run(&state.shared, repair).await?;
                let _ = reply.send(outcome);
            }
            IntegrityMsg::Scheduled => {
                if let Ok(outcome) = run(&state.shared, false).await?
                    && !outcome.report.violations.is_empty()
                {
                    tracing::warn!(
                        violations = outcome.report.violations.len(),
                        "integrity check found violations; run `lcm doctor --repair`"
                    );
                }
            }
        }
        Ok(())
    }
}

/// Runs a check (and repairs) on the blocking pool. The outer error is a panic or
/// cancellation of the actor itself; the inner one a store error reported to the caller.
async fn run(
    shared: &SharedRef,
    with_repair: bool,
) -> Result<Result<IntegrityOutcome, RuntimeError>, RuntimeError> {
    let s = shared.clone();
    let outcome = join_blocking(
        tokio::task::spawn_blocking(move || -> Result<IntegrityOutcome, RuntimeError> {
            let report = check(&s.store, Some(&*s.index))?;
            s.faults.hit(FaultPoint::IntegrityMidCheck, None);
            if !with_repair || report.violations.is_empty() {
                return Ok(IntegrityOutcome {
                    report,
                    repaired: None,
                    after: None,
                });
            }
            let repaired = repair(&s.store, Some(&*s.index), &report)?;
            let after = check(&s.store, Some(&*s.index))?;
            Ok(IntegrityOutcome {
                report,
                repaired: Some(repaired),
                after: Some(after),
            })
        })
        .await,
    )?;
    if let Ok(o) = &outcome {
        shared.emit(RuntimeEvent::IntegrityChecked {
            violations: o.report.violations.len(),
            repaired: o.after.as_ref().map_or(0, |a| {
                o.report.violations.len().saturating_sub(a.violations.len())
            }),
        });
    }
    Ok(outcome)
}
