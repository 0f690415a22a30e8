//! Sub-agents are LCM-managed too: what a sub-agent's model receives at each step is its own
//! session (where every turn is stored as it happens), assembled, compacted when it passes the
//! soft threshold, and fitted to `runtime.subagent_context_tokens` like any other context,
//! instead of an in-memory list that grows until a usage cap. Nothing is lost: the session
//! keeps every turn verbatim, and the sub-agent's `lcm_grep` / `lcm_describe` reach them.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use lcm_core::ids::SessionId;
use lcm_core::message::{Message, Part, Role};
use lcm_llm::chat::{ChatTurn, ToolCall};
use tokio::sync::Notify;

use super::shared::SharedRef;
use crate::agent::ConversationWindow;
use crate::assembly::{AssembledContext, ContextItem, assemble, system_prompt_tokens};
use crate::compaction::{compact_shared, effective_budget, needs_compaction};

/// How far the storing of a sub-agent's turns has got: the window waits for every turn of a
/// step to be in the session before it assembles.
#[derive(Debug, Default)]
pub(crate) struct StoredTurns {
    count: AtomicUsize,
    failed: AtomicBool,
    changed: Notify,
}

impl StoredTurns {
    /// One more turn handled (`stored`: whether it reached the session).
    pub(crate) fn handled(&self, stored: bool) {
        if !stored {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Whether a turn handled so far could not be stored.
    pub(crate) fn any_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    async fn wait_for(&self, turns: usize) {
        loop {
            let changed = self.changed.notified();
            if self.count.load(Ordering::SeqCst) >= turns {
                return;
            }
            changed.await;
        }
    }
}

/// The window of one sub-agent run over its session.
pub(crate) struct SessionWindow {
    pub(crate) shared: SharedRef,
    pub(crate) session: SessionId,
    pub(crate) stored: Arc<StoredTurns>,
}

#[async_trait]
impl ConversationWindow for SessionWindow {
    async fn view(&self, turns: &[ChatTurn]) -> Result<Vec<ChatTurn>, String> {
        self.stored.wait_for(turns.len()).await;
        if self.stored.failed.load(Ordering::SeqCst) {
            return Err(format!(
                "a turn of the sub-agent could not be stored in {}",
                self.session
            ));
        }
        let config = &self.shared.config;
        let counter = self.shared.store.counter();
        let system = match turns.first() {
            Some(ChatTurn::System(text)) => Some(text.clone()),
            _ => None,
        };
        let system_tokens = system
            .as_deref()
            .map_or(0, |s| system_prompt_tokens(counter, s));
        let budget = effective_budget(
            config.runtime.subagent_context_tokens,
            config.tokenizer.safety_margin,
        );
        let room = budget.saturating_sub(system_tokens);
        let mut context = self.assemble().await?;
        if needs_compaction(context.tokens, room, &config.compaction) {
            compact_shared(
                Arc::clone(&self.shared.store),
                self.session,
                room,
                &config.compaction,
                self.shared.summarizer.as_ref(),
                &mut (),
            )
            .await
            .map_err(|e| format!("compacting the sub-agent's session: {e}"))?;
            context = self.assemble().await?;
        }
        let context = context
            .fit(budget, system_tokens, counter)
            .map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(context.items.len() + 1);
        out.extend(system.map(ChatTurn::System));
        out.extend(context_turns(&context));
        Ok(out)
    }
}

impl SessionWindow {
    async fn assemble(&self) -> Result<AssembledContext, String> {
        let store = Arc::clone(&self.shared.store);
        let session = self.session;
        tokio::task::spawn_blocking(move || assemble(&store, session))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

/// A context as the turns of a chat request: summaries and markers as user turns, messages as
/// their turns (the stored system prompt is left out: the run sends its own first). A result
/// whose call is not in the context becomes user text, so a provider never sees an orphan.
pub fn context_turns(context: &AssembledContext) -> Vec<ChatTurn> {
    let calls: HashSet<&str> = context
        .items
        .iter()
        .filter_map(|i| match i {
            ContextItem::Message(m) => Some(m),
            _ => None,
        })
        .flat_map(|m| m.parts.iter())
        .filter_map(|p| match p {
            Part::ToolCall { id, .. } => Some(id.as_str()),
            _ => None,
        })
        .collect();
    let mut out = Vec::with_capacity(context.items.len());
    for item in &context.items {
        match item {
            ContextItem::Summary { rendered, .. } => out.push(ChatTurn::User(rendered.clone())),
            ContextItem::Elided { text, .. }
            | ContextItem::Pinned { text, .. }
            | ContextItem::Commitments { text, .. } => out.push(ChatTurn::User(text.clone())),
            ContextItem::Message(m) => message_turns(m, &calls, &mut out),
        }
    }
    out
}

fn message_turns(m: &Message, calls: &HashSet<&str>, out: &mut Vec<ChatTurn>) {
    let text = |parts: &[Part]| {
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .filter(|t| !t.is_empty())
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    };
    match m.role {
        Role::System => {}
        Role::User => out.extend(text(&m.parts).map(ChatTurn::User)),
        Role::Assistant => {
            let tool_calls: Vec<ToolCall> = m
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::ToolCall {
                        id,
                        name,
                        arguments,
                    } => Some(ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: arguments.clone(),
                    }),
                    _ => None,
                })
                .collect();
            let text = text(&m.parts);
            if text.is_some() || !tool_calls.is_empty() {
                out.push(ChatTurn::Assistant { text, tool_calls });
            }
        }
        Role::Tool => {
            for part in &m.parts {
                if let Part::ToolResult {
                    call_id,
                    content,
                    is_error,
                } = part
                {
                    if calls.contains(call_id.as_str()) {
                        out.push(ChatTurn::ToolResult {
                            call_id: call_id.clone(),
                            content: content.clone(),
                            is_error: *is_error,
                        });
                    } else {
                        out.push(ChatTurn::User(format!(
                            "[tool result for {call_id}]\n{content}"
                        )));
                    }
                }
            }
        }
    }
}
