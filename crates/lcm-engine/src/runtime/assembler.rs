//! AssemblerActor: reads a session's context state and renders it into context items.
//!
//! It owns nothing persistent. Each request runs on the blocking pool (redb reads), so one
//! actor serves many sessions at once; a panic in an assembly is sent back to the actor, which
//! fails with it, so the supervisor sees and restarts it (the callers of the lost requests get
//! no answer and retry against the restarted actor).

use std::sync::Arc;

use lcm_core::ids::SessionId;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::error::RuntimeError;
use super::faults::FaultPoint;
use super::shared::SharedRef;
use super::supervision::Heartbeat;
use crate::assembly::{AssembledContext, assemble};

/// Messages of the [`AssemblerActor`].
pub(crate) enum AssemblerMsg {
    /// Assemble `session`'s current context.
    Assemble {
        session: SessionId,
        reply: RpcReplyPort<Result<AssembledContext, RuntimeError>>,
    },
    /// An assembly task panicked: the actor fails with this message.
    Crashed(String),
}

pub(crate) struct AssemblerActor;

pub(crate) struct AssemblerState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
}

#[ractor::async_trait]
impl Actor for AssemblerActor {
    type Msg = AssemblerMsg;
    type State = AssemblerState;
    type Arguments = (SharedRef, Arc<Heartbeat>);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (shared, heartbeat): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(AssemblerState { shared, heartbeat })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let _busy = state.heartbeat.busy();
        match message {
            AssemblerMsg::Assemble { session, reply } => {
                let shared = state.shared.clone();
                tokio::task::spawn_blocking(move || {
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        shared
                            .faults
                            .hit(FaultPoint::AssemblerMidAssembly, Some(session));
                        assemble(&shared.store, session)
                    }));
                    match run {
                        Ok(result) => {
                            let _ = reply.send(result.map_err(RuntimeError::from));
                        }
                        Err(panic) => {
                            // Dropping `reply` tells the caller the request was lost.
                            drop(reply);
                            let _ = myself.cast(AssemblerMsg::Crashed(panic_message(&panic)));
                        }
                    }
                });
                Ok(())
            }
            AssemblerMsg::Crashed(message) => Err(format!("assembly panicked: {message}").into()),
        }
    }
}

/// The text of a panic payload.
pub(crate) fn panic_message(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}
