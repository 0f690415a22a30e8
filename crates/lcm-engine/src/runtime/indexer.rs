//! IndexerActor: keeps the tantivy index caught up with the store.
//!
//! Sessions tell it when they appended; it catches up at most every `runtime.index_interval_ms`
//! (tantivy commits are heavy: one per interval serves every append in it). The index is a
//! cache of the store: a restarted indexer simply catches up from the watermark, and grep
//! scans the unindexed tail meanwhile, so search stays complete.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::FaultPoint;
use super::shared::{SharedRef, join_blocking};
use super::supervision::Heartbeat;

/// Messages of the [`IndexerActor`].
pub(crate) enum IndexerMsg {
    /// New messages were stored.
    Dirty,
    /// Catch up now (scheduled after `Dirty`).
    CatchUp,
    /// Catch up now and answer with the number of messages indexed.
    Flush(RpcReplyPort<Result<u64, RuntimeError>>),
}

pub(crate) struct IndexerActor;

pub(crate) struct IndexerState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
    scheduled: bool,
}

#[ractor::async_trait]
impl Actor for IndexerActor {
    type Msg = IndexerMsg;
    type State = IndexerState;
    type Arguments = (SharedRef, Arc<Heartbeat>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (shared, heartbeat): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Whatever was appended while no indexer ran is caught up right away.
        let _ = myself.cast(IndexerMsg::CatchUp);
        Ok(IndexerState {
            shared,
            heartbeat,
            scheduled: true,
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
            IndexerMsg::Dirty => {
                if !state.scheduled {
                    state.scheduled = true;
                    let delay =
                        Duration::from_millis(state.shared.config.runtime.index_interval_ms);
                    myself.send_after(delay, || IndexerMsg::CatchUp);
                }
            }
            IndexerMsg::CatchUp => {
                state.scheduled = false;
                catch_up(&state.shared).await?;
            }
            IndexerMsg::Flush(reply) => {
                let result = catch_up(&state.shared).await;
                let _ = reply.send(result);
            }
        }
        Ok(())
    }
}

async fn catch_up(shared: &SharedRef) -> Result<u64, RuntimeError> {
    let s = shared.clone();
    let indexed = join_blocking(
        tokio::task::spawn_blocking(move || {
            s.faults.hit(FaultPoint::IndexerBeforeCommit, None);
            s.index.catch_up(&s.store, |_, _| {})
        })
        .await,
    )??;
    if indexed > 0 {
        shared.emit(RuntimeEvent::IndexCaughtUp {
            indexed,
            watermark: shared.index.watermark().0,
        });
    }
    Ok(indexed)
}
