//! A task's session stored in a data directory and compacted: what the scripted arm and the
//! lcm-agent arm both start from.

use std::sync::Arc;

use lcm_core::config::CompactionConfig;
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{NewMessage, Role};
use lcm_core::summary::NodeRef;
use lcm_core::time::Timestamp;
use lcm_engine::compaction::compact_shared;
use lcm_llm::Summarizer;
use lcm_search::DataDir;

use crate::tasks::{Speaker, Task};
use crate::{EvalError, Result};

/// A task's session in a data directory, after compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTask {
    pub session: SessionId,
    /// The context before and after compaction, in tokens.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// Planted facts now under a summary, of `facts` planted (needle tasks; 0 of 0 otherwise).
    pub facts_compacted: usize,
    pub facts: usize,
}

/// Stores `task`'s turns as a new session of `data` (one message per turn, a second apart),
/// indexes them, and compacts the session with `summarizer` until its context is under the
/// soft threshold of `budget` tokens (or compaction can do no more). Store and index calls run
/// on tokio's blocking pool, as in the runtime.
pub async fn store_and_compact(
    task: &Task,
    data: &DataDir,
    budget: u64,
    summarizer: &dyn Summarizer,
) -> Result<StoredTask> {
    let store = Arc::clone(&data.store);
    let key = format!(
        "eval/{}/{}/{}",
        task.family.as_str(),
        task.seed,
        task.target_tokens
    );
    let messages: Vec<NewMessage> = task
        .turns
        .iter()
        .enumerate()
        .map(|(i, turn)| {
            let role = match turn.speaker {
                Speaker::User => Role::User,
                Speaker::Assistant => Role::Assistant,
            };
            let mut m = NewMessage::text(role, turn.text.clone());
            m.created_at = Timestamp(1_767_225_600_000 + i as i64 * 1_000);
            m
        })
        .collect();
    let index = Arc::clone(&data.index);
    let (session, ids) = blocking({
        let store = Arc::clone(&store);
        let index = Arc::clone(&index);
        move || {
            let session = store.create_session(&key, None)?;
            let appended = store.append_batch(session, messages)?;
            index.catch_up(&store, |_, _| {})?;
            Ok((
                session,
                appended.iter().map(|a| a.id).collect::<Vec<MessageId>>(),
            ))
        }
    })
    .await?;

    let config = CompactionConfig::default();
    let mut tokens_before = None;
    let tokens_after = loop {
        let report = compact_shared(
            Arc::clone(&store),
            session,
            budget,
            &config,
            summarizer,
            &mut (),
        )
        .await
        .map_err(|e| EvalError::Compaction(e.to_string()))?;
        tokens_before.get_or_insert(report.tokens_before);
        if report.reached_goal || report.passes.is_empty() {
            break report.tokens_after;
        }
    };
    let planted: Vec<MessageId> = task
        .planted
        .iter()
        .filter_map(|turn| ids.get(*turn).copied())
        .collect();
    let facts_compacted = blocking(move || {
        index.catch_up(&store, |_, _| {})?;
        let mut compacted = 0;
        for id in planted {
            if store.covering(NodeRef::Message(id))?.is_some() {
                compacted += 1;
            }
        }
        Ok(compacted)
    })
    .await?;
    Ok(StoredTask {
        session,
        tokens_before: tokens_before.unwrap_or(0),
        tokens_after,
        facts_compacted,
        facts: task.planted.len(),
    })
}

/// Runs store and index work on tokio's blocking pool (a panic there is the caller's).
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            Err(e) => Err(EvalError::Runtime(e.to_string())),
        },
    }
}
