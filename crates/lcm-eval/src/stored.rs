//! A task's session stored in a data directory and compacted: what the scripted arm and the
//! lcm-agent arm both start from.

use std::sync::Arc;

use lcm_core::config::CompactionConfig;
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{NewMessage, Role};
use lcm_core::summary::NodeRef;
use lcm_core::time::Timestamp;
use lcm_engine::compact;
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
/// soft threshold of `budget` tokens (or compaction can do no more).
pub async fn store_and_compact(
    task: &Task,
    data: &DataDir,
    budget: u64,
    summarizer: &dyn Summarizer,
) -> Result<StoredTask> {
    let store = Arc::clone(&data.store);
    let session = store.create_session(
        &format!(
            "eval/{}/{}/{}",
            task.family.as_str(),
            task.seed,
            task.target_tokens
        ),
        None,
    )?;
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
    let appended = store.append_batch(session, messages)?;
    let ids: Vec<MessageId> = appended.iter().map(|a| a.id).collect();
    data.index.catch_up(&store, |_, _| {})?;

    let config = CompactionConfig::default();
    let mut tokens_before = None;
    let tokens_after = loop {
        let report = compact(&store, session, budget, &config, summarizer, |_| {})
            .await
            .map_err(|e| EvalError::Compaction(e.to_string()))?;
        tokens_before.get_or_insert(report.tokens_before);
        if report.reached_goal || report.passes.is_empty() {
            break report.tokens_after;
        }
    };
    data.index.catch_up(&store, |_, _| {})?;
    let mut facts_compacted = 0;
    for turn in &task.planted {
        let Some(id) = ids.get(*turn) else {
            continue;
        };
        if store.covering(NodeRef::Message(*id))?.is_some() {
            facts_compacted += 1;
        }
    }
    Ok(StoredTask {
        session,
        tokens_before: tokens_before.unwrap_or(0),
        tokens_after,
        facts_compacted,
        facts: task.planted.len(),
    })
}
