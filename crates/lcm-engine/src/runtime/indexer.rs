//! IndexerActor: keeps the tantivy index caught up with the store, and the vector index when
//! an embedding model is configured.
//!
//! Sessions tell it when they appended; it catches up at most every `runtime.index_interval_ms`
//! (tantivy commits are heavy: one per interval serves every append in it). The index is a
//! cache of the store: a restarted indexer simply catches up from the watermark, and grep
//! scans the unindexed tail meanwhile, so search stays complete.
//!
//! Embedding is slow (a model runs over every message), so it is done one batch
//! (`embeddings.index_batch` messages) per actor message, each followed by the next while the
//! vector index is behind: a flush or a shutdown waits for one batch at most, and no single
//! message runs long enough to look stuck. A model that cannot be loaded is reported once and
//! leaves search by meaning off until the next append.

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
    /// Embed the next batch of messages into the vector index.
    Embed,
}

pub(crate) struct IndexerActor;

pub(crate) struct IndexerState {
    shared: SharedRef,
    heartbeat: Arc<Heartbeat>,
    scheduled: bool,
    /// An `Embed` message is on its way.
    embedding: bool,
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
            embedding: false,
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
                start_embedding(&myself, state);
            }
            IndexerMsg::Flush(reply) => {
                let result = catch_up(&state.shared).await;
                let _ = reply.send(result);
                start_embedding(&myself, state);
            }
            IndexerMsg::Embed => {
                state.embedding = false;
                if embed_batch(&state.shared).await? {
                    start_embedding(&myself, state);
                }
            }
        }
        Ok(())
    }
}

/// Queues the next batch of embeddings, if a model is configured and none is queued.
fn start_embedding(myself: &ActorRef<IndexerMsg>, state: &mut IndexerState) {
    if state.shared.index.semantic().is_some() && !state.embedding {
        state.embedding = myself.cast(IndexerMsg::Embed).is_ok();
    }
}

/// Embeds one batch; whether the vector index is still behind the store. A model that cannot
/// be loaded (or fails) is logged, not a crash of the indexer: search by meaning says what is
/// wrong when asked, and everything else goes on.
async fn embed_batch(shared: &SharedRef) -> Result<bool, RuntimeError> {
    let s = shared.clone();
    let outcome = join_blocking(
        tokio::task::spawn_blocking(move || -> lcm_store::Result<(u64, bool)> {
            let Some(semantic) = s.index.semantic() else {
                return Ok((0, false));
            };
            let embedded = semantic.catch_up_until(&s.store, |_, _| {}, || true)?;
            let behind = semantic.is_behind(&s.store)?;
            Ok((embedded, behind))
        })
        .await,
    )?;
    match outcome {
        Ok((embedded, behind)) => {
            if embedded > 0 {
                tracing::debug!(embedded, behind, "vector index caught up by a batch");
            }
            Ok(behind)
        }
        Err(e) => {
            tracing::warn!(error = %e, "embedding stopped; search by meaning covers what was embedded before");
            Ok(false)
        }
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
