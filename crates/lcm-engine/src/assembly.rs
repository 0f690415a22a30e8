//! Context assembly: from a session's context state to the messages a provider receives.
//!
//! The context is: optional system content, then the top-level summaries in order (each
//! rendered as a user message that carries, added by the engine whatever the summariser wrote,
//! its id, kind, depth, time range, what it covers and its files), then every raw message from
//! the frontier on. Assembly reads stored token counts and adds them, so its cost grows with the
//! items in the context, not with the history. The same state always renders to the same bytes,
//! and the rendered prefix only changes when a compaction swaps a summary in, so providers'
//! prompt caches keep hitting between compactions.
//!
//! Tool pairing: a tool result is only sent right after the assistant message that made the
//! call, and a call only with its result. A call or result whose partner is not in the context
//! (compaction never splits them, but a transcript may hold a dangling one) is rendered as plain
//! text instead, so a provider never sees an orphan.

use std::collections::HashSet;

use lcm_core::ids::SessionId;
use lcm_core::message::{Message, Part, Role};
use lcm_core::summary::{ContextState, NodeRef, Summary, SummaryKind};
use lcm_store::{Store, StoreError};
use serde_json::{Value, json};

/// One item of an assembled context.
#[derive(Debug, Clone, PartialEq)]
pub enum ContextItem {
    /// A top-level summary and its rendered text.
    Summary { summary: Summary, rendered: String },
    /// A raw message.
    Message(Message),
}

impl ContextItem {
    /// Stored tokens of this item.
    pub fn tokens(&self) -> u64 {
        match self {
            ContextItem::Summary { summary, .. } => u64::from(summary.token_count),
            ContextItem::Message(m) => u64::from(m.token_count),
        }
    }
}

/// A session's context, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledContext {
    pub session: SessionId,
    pub state: ContextState,
    pub items: Vec<ContextItem>,
    /// Sum of the items' stored token counts.
    pub tokens: u64,
}

/// Reads a session's context (one read snapshot of the store).
pub fn assemble(store: &Store, session: SessionId) -> Result<AssembledContext, StoreError> {
    let reader = store.reader()?;
    let state = reader.context(session)?;
    let mut items = Vec::with_capacity(state.summaries.len() + 32);
    for id in &state.summaries {
        let summary = reader.summary(*id)?;
        let rendered = render_summary(&summary);
        items.push(ContextItem::Summary { summary, rendered });
    }
    for m in reader.session_messages(session, state.raw_from..u64::MAX)? {
        items.push(ContextItem::Message(m));
    }
    let tokens = items.iter().map(ContextItem::tokens).sum();
    Ok(AssembledContext {
        session,
        state,
        items,
        tokens,
    })
}

/// The text of a summary as the model sees it: a header the engine writes (never the model),
/// then the summary's content.
pub fn render_summary(s: &Summary) -> String {
    let covers = match s.kind {
        SummaryKind::Leaf => format!(
            "{}..{} ({} messages)",
            first_id(&s.sources),
            last_id(&s.sources),
            s.descendant_messages
        ),
        SummaryKind::Condensed => format!(
            "{} ({} summaries over {} messages)",
            s.sources
                .iter()
                .map(NodeRef::to_string)
                .collect::<Vec<_>>()
                .join(","),
            s.sources.len(),
            s.descendant_messages
        ),
    };
    let files = if s.file_ids.is_empty() {
        String::new()
    } else {
        format!(
            " files=\"{}\"",
            s.file_ids
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    format!(
        "<lcm_summary id=\"{}\" kind=\"{}\" depth=\"{}\" from=\"{}\" to=\"{}\" covers=\"{}\"{}>\n{}\n</lcm_summary>\n(Expand {} with lcm_expand_query or lcm_describe for the exact messages.)",
        s.id,
        s.kind.as_str(),
        s.depth,
        s.earliest_at,
        s.latest_at,
        covers,
        files,
        s.content.trim_end(),
        s.id
    )
}

fn first_id(sources: &[NodeRef]) -> String {
    sources.first().map_or_else(String::new, NodeRef::to_string)
}

fn last_id(sources: &[NodeRef]) -> String {
    sources.last().map_or_else(String::new, NodeRef::to_string)
}

/// Call ids that have both a call and a result in the context.
fn paired_calls(items: &[ContextItem]) -> HashSet<&str> {
    let mut calls = HashSet::new();
    let mut results = HashSet::new();
    for item in items {
        if let ContextItem::Message(m) = item {
            for part in &m.parts {
                match part {
                    Part::ToolCall { id, .. } => {
                        calls.insert(id.as_str());
                    }
                    Part::ToolResult { call_id, .. } => {
                        results.insert(call_id.as_str());
                    }
                    _ => {}
                }
            }
        }
    }
    calls.intersection(&results).copied().collect()
}

/// Text a part contributes when it is not sent structurally.
fn part_as_text(part: &Part) -> Option<String> {
    match part {
        Part::Text { text } => Some(text.clone()),
        // Reasoning stays in the store; providers do not take it back as input.
        Part::Reasoning { .. } => None,
        Part::ToolCall {
            id,
            name,
            arguments,
        } => Some(format!("[tool call {id}: {name} {arguments}]")),
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => Some(format!(
            "[tool result for {call_id}{}]\n{content}",
            if *is_error { " (error)" } else { "" }
        )),
        Part::File { path, .. } => Some(format!("[file {path}]")),
        Part::Binary {
            media_type,
            byte_len,
        } => Some(format!(
            "[{media_type}, {byte_len} bytes, kept in the store]"
        )),
        Part::Opaque { kind, json } => Some(format!("[{kind}] {json}")),
    }
}

impl AssembledContext {
    /// The context as an OpenAI Chat Completions `messages` array.
    pub fn to_openai(&self, system: Option<&str>) -> Vec<Value> {
        let paired = paired_calls(&self.items);
        let mut out = Vec::with_capacity(self.items.len() + 1);
        if let Some(system) = system {
            out.push(json!({"role": "system", "content": system}));
        }
        for item in &self.items {
            match item {
                ContextItem::Summary { rendered, .. } => {
                    out.push(json!({"role": "user", "content": rendered}));
                }
                ContextItem::Message(m) => openai_message(m, &paired, &mut out),
            }
        }
        out
    }

    /// The context as an Anthropic Messages request body's `system` and `messages`.
    /// Consecutive messages of one role are merged (the API requires alternation), and the
    /// first message is a user message.
    pub fn to_anthropic(&self, system: Option<&str>) -> Value {
        let paired = paired_calls(&self.items);
        let mut system_text: Vec<String> = system.map(str::to_owned).into_iter().collect();
        let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
        let mut push = |role: &'static str, blocks: Vec<Value>| {
            if blocks.is_empty() {
                return;
            }
            match turns.last_mut() {
                Some((last, existing)) if *last == role => existing.extend(blocks),
                _ => turns.push((role, blocks)),
            }
        };
        for item in &self.items {
            match item {
                ContextItem::Summary { rendered, .. } => {
                    push("user", vec![json!({"type": "text", "text": rendered})]);
                }
                ContextItem::Message(m) => {
                    if m.role == Role::System {
                        system_text.extend(m.parts.iter().filter_map(part_as_text));
                        continue;
                    }
                    let mut blocks = Vec::new();
                    for part in &m.parts {
                        match part {
                            Part::ToolCall {
                                id,
                                name,
                                arguments,
                            } if paired.contains(id.as_str()) => {
                                let input: Value = serde_json::from_str(arguments)
                                    .unwrap_or_else(|_| json!({"arguments": arguments}));
                                blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
                            }
                            Part::ToolResult {
                                call_id,
                                content,
                                is_error,
                            } if paired.contains(call_id.as_str()) => {
                                blocks.push(json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}));
                            }
                            other => {
                                // The API refuses whitespace-only text blocks (transcripts
                                // have them, e.g. Claude Code's "\n\n" between blocks).
                                if let Some(text) = part_as_text(other)
                                    && !text.trim().is_empty()
                                {
                                    blocks.push(json!({"type": "text", "text": text}));
                                }
                            }
                        }
                    }
                    let role = if m.role == Role::Assistant {
                        "assistant"
                    } else {
                        "user"
                    };
                    push(role, blocks);
                }
            }
        }
        if turns.first().is_some_and(|(role, _)| *role == "assistant") {
            turns.insert(
                0,
                (
                    "user",
                    vec![json!({"type": "text", "text": "(conversation continues)"})],
                ),
            );
        }
        let messages: Vec<Value> = turns
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let mut body = json!({ "messages": messages });
        if !system_text.is_empty() {
            body["system"] = Value::String(system_text.join("\n\n"));
        }
        body
    }
}

fn openai_message(m: &Message, paired: &HashSet<&str>, out: &mut Vec<Value>) {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for part in &m.parts {
        match part {
            Part::ToolCall {
                id,
                name,
                arguments,
            } if paired.contains(id.as_str()) => {
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
            }
            Part::ToolResult {
                call_id, content, ..
            } if paired.contains(call_id.as_str()) => {
                results.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
            }
            other => text.extend(part_as_text(other)),
        }
    }
    if m.role == Role::Assistant {
        // Transcripts often store one assistant turn as several entries (text, then each tool
        // call): merge them, since every tool call of an assistant message must be answered
        // before the next assistant message.
        let merge = out.last().is_some_and(|last| last["role"] == "assistant");
        if merge && let Some(last) = out.last_mut() {
            if !text.is_empty() {
                let joined = match last["content"].as_str() {
                    Some(existing) => format!("{existing}\n{}", text.join("\n")),
                    None => text.join("\n"),
                };
                last["content"] = Value::String(joined);
            }
            if !calls.is_empty() {
                match last["tool_calls"].as_array_mut() {
                    Some(existing) => existing.extend(calls),
                    None => last["tool_calls"] = Value::Array(calls),
                }
            }
        } else if !text.is_empty() || !calls.is_empty() {
            let mut message = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text.join("\n")) }});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            out.push(message);
        }
        out.extend(results);
        return;
    }
    // Results first: they must directly follow the assistant message that made the calls.
    out.extend(results);
    if !text.is_empty() {
        let role = if m.role == Role::System {
            "system"
        } else {
            "user"
        };
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
}
