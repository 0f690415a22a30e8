//! The delegation tools (paper appendix C.1 and C.3): `Task`, `Tasks` and `lcm_expand_query`.
//!
//! They run sub-agents through a [`Delegator`] (the runtime's DelegationActor), which enforces
//! the scope-reduction guard ([`crate::guard`]) and the time and token limits, and stores each
//! sub-agent's conversation as its own session, linked to its parent. Only the final answer
//! comes back to the caller.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lcm_core::ids::SessionId;
use serde::Serialize;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Caller, Tool, ToolContext, ToolDefinition};
use super::{LcmExpand, LcmGrep};

/// What a sub-agent is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DelegateKind {
    /// A `Task` / `Tasks` sub-agent with its own context.
    Task,
    /// A read-only exploration agent answering a question from the history
    /// (`lcm_expand_query`): it may expand summaries but never spawns further agents.
    Expansion,
}

/// A request for one sub-agent.
#[derive(Debug, Clone)]
pub struct DelegateRequest {
    pub kind: DelegateKind,
    /// What the sub-agent is asked to do.
    pub prompt: String,
    /// The slice of the caller's work handed off (required for nested Task calls).
    pub delegated_scope: Option<String>,
    /// What the caller keeps doing itself (required for nested Task calls).
    pub kept_work: Option<String>,
    /// A read-only agent: no tools that change anything, no further delegation.
    pub read_only: bool,
    /// Part of a parallel `Tasks` call (exempt from the guard).
    pub parallel: bool,
    /// Overrides the configured step limit.
    pub max_steps: Option<u32>,
    /// For `agentic_map` item agents: the byte size of the map's input (maps they start must
    /// be smaller).
    pub map_input_limit: Option<u64>,
}

/// What a sub-agent came back with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DelegateOutcome {
    /// The sub-agent's own session (its whole conversation is stored there).
    pub session: SessionId,
    /// Its final answer, if it gave one.
    pub answer: Option<String>,
    /// Why it stopped: `final_answer`, `step_limit`, `token_limit`, `deadline`, ...
    pub stop: String,
    pub steps: u32,
    pub tokens: u64,
    /// Its delegation depth (the main agent is 0).
    pub depth: u32,
}

/// Runs sub-agents (implemented by the runtime).
#[async_trait]
pub trait Delegator: Send + Sync + fmt::Debug {
    /// Runs one sub-agent for `caller` and waits for its answer. A refused delegation (the
    /// scope-reduction guard) is a [`ToolError::NotPermitted`] whose message tells the model
    /// to do the work itself.
    async fn delegate(
        &self,
        caller: &Caller,
        request: DelegateRequest,
    ) -> Result<DelegateOutcome, ToolError>;

    /// Whether a model is configured (without one, sub-agents cannot run).
    fn has_model(&self) -> bool;

    /// Runs a map job (`llm_map`, `agentic_map`) started by `caller` and waits for its summary.
    async fn run_map(
        &self,
        caller: &Caller,
        request: crate::operators::MapRequest,
    ) -> Result<crate::operators::MapSummary, ToolError> {
        let _ = (caller, request);
        Err(ToolError::Unsupported {
            tool: "llm_map".into(),
            message: "map operators run inside the lcm runtime".into(),
        })
    }

    /// The tools sub-agents get (the runtime's registry), if the delegator has one.
    fn registry(&self) -> Option<&super::ToolRegistry> {
        None
    }
}

fn delegator<'a>(ctx: &'a ToolContext, tool: &str) -> Result<&'a Arc<dyn Delegator>, ToolError> {
    ctx.delegator
        .as_ref()
        .ok_or_else(|| ToolError::Unsupported {
            tool: tool.into(),
            message:
                "sub-agents run inside the lcm runtime (Runtime / lcm serve); this caller has none"
                    .into(),
        })
}

fn text(args: &Value, key: &str) -> Option<String> {
    args.get(key)
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn task_request(args: &Value, parallel: bool) -> DelegateRequest {
    DelegateRequest {
        kind: DelegateKind::Task,
        prompt: text(args, "prompt").unwrap_or_default(),
        delegated_scope: text(args, "delegated_scope"),
        kept_work: text(args, "kept_work"),
        read_only: args
            .get("read_only")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        parallel,
        max_steps: args
            .get("max_steps")
            .and_then(Value::as_u64)
            .map(|n| n as u32),
        map_input_limit: None,
    }
}

fn task_properties() -> Value {
    json!({
        "prompt": {"type": "string", "minLength": 1, "description": "The task for the sub-agent, self-contained: it does not see your context."},
        "delegated_scope": {"type": "string", "description": "The specific slice of your work you hand off. Required when you are yourself a sub-agent."},
        "kept_work": {"type": "string", "description": "The work you keep doing yourself. Required when you are yourself a sub-agent; if you would keep nothing, do the work directly instead."},
        "read_only": {"type": "boolean", "description": "An exploration agent that changes nothing and spawns no sub-agents (exempt from the scope rule).", "default": false},
        "max_steps": {"type": "integer", "minimum": 1, "maximum": 200, "description": "Most tool-calling steps the sub-agent may take."}
    })
}

/// `Task(prompt, delegated_scope, kept_work, read_only)`: one sub-agent.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskTool;

#[async_trait]
impl Tool for TaskTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "Task",
            "Run a sub-agent on a task in its own context; only its final answer comes back. A sub-agent that delegates must name the part it hands off (delegated_scope) and the part it keeps (kept_work).",
            json!({
                "type": "object",
                "properties": task_properties(),
                "required": ["prompt"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        !caller.read_only
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        if ctx.caller.read_only {
            return Err(ToolError::NotPermitted {
                tool: "Task".into(),
                reason: "a read-only exploration agent cannot spawn sub-agents; answer with what you found".into(),
            });
        }
        let outcome = delegator(ctx, "Task")?
            .delegate(&ctx.caller, task_request(&args, false))
            .await?;
        Ok(json!(outcome))
    }
}

/// `Tasks(tasks[])`: several independent sub-agents at once (sibling decomposition: exempt from
/// the scope rule).
#[derive(Debug, Clone, Copy, Default)]
pub struct TasksTool;

#[async_trait]
impl Tool for TasksTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "Tasks",
            "Run two or more independent sub-agents in parallel; their final answers come back together, in order.",
            json!({
                "type": "object",
                "properties": {
                    "tasks": {
                        "type": "array",
                        "minItems": 2,
                        "maxItems": 16,
                        "items": {
                            "type": "object",
                            "properties": task_properties(),
                            "required": ["prompt"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": ["tasks"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        !caller.read_only
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        if ctx.caller.read_only {
            return Err(ToolError::NotPermitted {
                tool: "Tasks".into(),
                reason: "a read-only exploration agent cannot spawn sub-agents".into(),
            });
        }
        let delegator = Arc::clone(delegator(ctx, "Tasks")?);
        let tasks = args
            .get("tasks")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut running = tokio::task::JoinSet::new();
        for (i, task) in tasks.iter().enumerate() {
            let delegator = Arc::clone(&delegator);
            let caller = ctx.caller.clone();
            let request = task_request(task, true);
            running.spawn(async move { (i, delegator.delegate(&caller, request).await) });
        }
        let mut results: Vec<Value> = vec![Value::Null; tasks.len()];
        while let Some(joined) = running.join_next().await {
            let (i, outcome) = joined.map_err(|e| ToolError::failed("Tasks", e))?;
            results[i] = match outcome {
                Ok(o) => json!(o),
                Err(e) => json!({"error": e.to_string()}),
            };
        }
        Ok(json!({ "results": results }))
    }
}

/// Default answer size of `lcm_expand_query`.
pub const DEFAULT_EXPAND_QUERY_TOKENS: u64 = 2_000;

/// `lcm_expand_query(query | summary_ids, prompt, max_tokens)`: answers a question from the
/// compacted history through a read-only sub-agent that expands the relevant summaries.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmExpandQuery;

#[async_trait]
impl Tool for LcmExpandQuery {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "lcm_expand_query",
            "Answer a question from earlier in the conversation that summaries no longer show in detail: finds the relevant summaries (by `query`, or the given `summary_ids`), has a sub-agent read the original messages under them, and returns a focused answer with the ids it cited.",
            json!({
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "description": "Words to find the relevant part of the history (full-text search)."},
                    "summary_ids": {"type": "array", "items": {"type": "string", "pattern": "^sum_[0-9]+$"}, "maxItems": 20, "description": "Summaries to expand, instead of or besides the query."},
                    "prompt": {"type": "string", "minLength": 1, "description": "The question to answer from those messages."},
                    "max_tokens": {"type": "integer", "minimum": 100, "maximum": 20000, "default": DEFAULT_EXPAND_QUERY_TOKENS}
                },
                "required": ["prompt"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const TOOL: &str = "lcm_expand_query";
        let prompt = text(&args, "prompt").unwrap_or_default();
        let max_tokens = args
            .get("max_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(DEFAULT_EXPAND_QUERY_TOKENS);
        let mut summaries: Vec<String> = args
            .get("summary_ids")
            .and_then(Value::as_array)
            .map(|ids| {
                ids.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let query = text(&args, "query");
        if let Some(query) = &query {
            for id in relevant_summaries(ctx, query).await? {
                if !summaries.contains(&id) {
                    summaries.push(id);
                }
            }
        }
        if summaries.is_empty() && query.is_none() {
            return Err(ToolError::invalid_argument(
                TOOL,
                "give `query` or `summary_ids` to say which part of the history to read",
            ));
        }
        if let Some(delegator) = ctx.delegator.as_ref().filter(|d| d.has_model()) {
            let task = format!(
                "{prompt}\n\nRead the original messages of the conversation to answer. Relevant summaries: {}. Use lcm_expand on them (and lcm_grep / lcm_describe to find more), then answer concisely in at most {max_tokens} tokens, citing the message and summary ids (msg_N, sum_N) your answer rests on.",
                if summaries.is_empty() {
                    "none found by the query; search with lcm_grep".to_string()
                } else {
                    summaries.join(", ")
                }
            );
            let outcome = delegator
                .delegate(
                    &ctx.caller,
                    DelegateRequest {
                        kind: DelegateKind::Expansion,
                        prompt: task,
                        delegated_scope: None,
                        kept_work: None,
                        read_only: true,
                        parallel: false,
                        max_steps: None,
                        map_input_limit: None,
                    },
                )
                .await?;
            let cited = outcome.answer.as_deref().map(cited_ids).unwrap_or_default();
            return Ok(json!({
                "answer": outcome.answer,
                "cited_ids": cited,
                "summaries": summaries,
                "sub_agent_session": outcome.session,
                "stop": outcome.stop,
            }));
        }
        // No model: the best-matching excerpts, verbatim, within max_tokens.
        let reader = ctx.with_caller(Caller::sub_agent(ctx.caller.session, ctx.caller.depth + 1));
        let mut excerpts = Vec::new();
        let mut used = 0u64;
        for id in &summaries {
            if used >= max_tokens {
                break;
            }
            let page = LcmExpand
                .call(
                    &reader,
                    json!({"summary_id": id, "token_cap": (max_tokens - used).max(100)}),
                )
                .await?;
            used += page.get("tokens").and_then(Value::as_u64).unwrap_or(0);
            for item in page
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                excerpts.push(json!({
                    "id": item.get("id"),
                    "at": item.get("at"),
                    "role": item.get("role"),
                    "content": item.get("content"),
                }));
            }
        }
        Ok(json!({
            "answer": null,
            "note": "no model is configured for sub-agents, so this is not an answer: these are the original messages under the best-matching summaries, within max_tokens",
            "summaries": summaries,
            "excerpts": excerpts,
            "tokens": used,
        }))
    }
}

/// The summaries standing for the best hits of `query` (most hits first): hybrid when an
/// embedding model is configured (words and meaning), else full text, else (no index) regex.
async fn relevant_summaries(ctx: &ToolContext, query: &str) -> Result<Vec<String>, ToolError> {
    let mode = match &ctx.index {
        Some(index) if index.semantic().is_some() => "hybrid",
        Some(_) => "full_text",
        None => "regex",
    };
    let pattern = if ctx.index.is_some() {
        query.to_string()
    } else {
        regex_escape_words(query)
    };
    let search = |mode: &'static str| {
        LcmGrep.call(
            ctx,
            json!({"pattern": pattern, "mode": mode, "scope": "messages", "limit": 50}),
        )
    };
    let page = match search(mode).await {
        Ok(page) => page,
        // A model that cannot be loaded leaves the words: the expansion still works.
        Err(e) if mode == "hybrid" => {
            tracing::warn!(error = %e, "hybrid search failed; lcm_expand_query falls back to full text");
            search("full_text").await?
        }
        Err(e) => return Err(e),
    };
    let mut counts: Vec<(String, usize)> = Vec::new();
    for group in page
        .get("groups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let region = group.get("region").and_then(Value::as_str).unwrap_or("");
        if !region.starts_with("sum_") {
            continue; // Still raw in the context: the caller sees it already.
        }
        let hits = group
            .get("hits")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        match counts.iter_mut().find(|(id, _)| id == region) {
            Some((_, n)) => *n += hits,
            None => counts.push((region.to_string(), hits)),
        }
    }
    counts.sort_by_key(|(_, hits)| std::cmp::Reverse(*hits));
    Ok(counts.into_iter().take(8).map(|(id, _)| id).collect())
}

/// A regex matching any of the query's words (when there is no index for full text).
fn regex_escape_words(query: &str) -> String {
    let words: Vec<String> = query
        .split_whitespace()
        .map(|w| {
            w.chars()
                .map(|c| {
                    if c.is_alphanumeric() {
                        c.to_string()
                    } else {
                        format!("\\{c}")
                    }
                })
                .collect()
        })
        .collect();
    format!("(?i){}", words.join("|"))
}

/// The `msg_N` / `sum_N` ids mentioned in a text, in first-mention order.
pub fn cited_ids(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 4 < bytes.len() {
        if !text.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let prefix = &text[i..];
        if (prefix.starts_with("msg_") || prefix.starts_with("sum_"))
            && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric())
        {
            let digits: String = prefix[4..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if !digits.is_empty() {
                let id = format!("{}{digits}", &prefix[..4]);
                if !out.contains(&id) {
                    out.push(id);
                }
                i += 4 + digits.len();
                continue;
            }
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cited_ids_are_found_once_in_order() {
        assert_eq!(
            cited_ids("see msg_12 and sum_3, also msg_12; not xmsg_4 nor msg_ — é msg_7"),
            vec![
                "msg_12".to_string(),
                "sum_3".to_string(),
                "msg_7".to_string()
            ]
        );
    }

    #[test]
    fn word_regex_escapes_punctuation() {
        assert_eq!(regex_escape_words("page-size 1000"), "(?i)page\\-size|1000");
    }
}
