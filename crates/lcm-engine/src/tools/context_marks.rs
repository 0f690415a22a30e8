//! `lcm_pin` and `lcm_forget`: the agent shapes its own context (what users of LCM systems ask
//! for: keep what matters from being compacted, set aside what no longer does).
//!
//! Both write one mark in the store (`lcm_store::marks`), in one transaction that checks it; the
//! next assembly shows it. Neither deletes anything: a forgotten item stays in the store, in
//! the DAG and in search, and its pointer says how to read it or bring it back. Only the main
//! agent of a session may change its context: sub-agents and read-only agents are refused.

use async_trait::async_trait;
use lcm_core::ids::{AnyId, SessionId};
use lcm_core::summary::{ContextMark, NodeRef};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Caller, Tool, ToolContext, ToolDefinition};
use super::util::{blocking, parse_args, store_err};

const PIN: &str = "lcm_pin";
const FORGET: &str = "lcm_forget";

/// The `lcm_pin` tool. Main agent only.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmPin;

/// The `lcm_forget` tool. Main agent only.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmForget;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PinArgs {
    id: String,
    #[serde(default)]
    unpin: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgetArgs {
    id: String,
    #[serde(default)]
    restore: bool,
}

#[async_trait]
impl Tool for LcmPin {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            PIN,
            "Pin a message so that it stays in your context verbatim: once compaction has \
             summarised it, it is shown in a pinned block after the summaries. For what you \
             must keep exact (a specification, a user's constraints, a key result). The \
             pinned messages of a session share a token cap (compaction.pinned_max_tokens); a \
             pin past it is refused. With unpin: true, releases a pin. A message of another \
             session may be pinned too, bringing it into this context.",
            json!({
                "type": "object",
                "properties": {
                    "id": {
                        "type": "string", "minLength": 1, "maxLength": 64,
                        "description": "The message to pin (msg_N)."
                    },
                    "unpin": {
                        "type": "boolean",
                        "description": "Release the pin instead (default false)."
                    }
                },
                "required": ["id"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        may_change_context(caller)
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        permitted(PIN, &ctx.caller)?;
        let args: PinArgs = parse_args(PIN, args)?;
        let ctx = ctx.clone();
        blocking(PIN, move || pin(&ctx, &args)).await
    }
}

#[async_trait]
impl Tool for LcmForget {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            FORGET,
            "Set aside an item of your context that you no longer need: a message of the \
             recent history (msg_N) or a summary (sum_N) is shown as a short pointer naming it \
             until you restore it (restore: true). Nothing is deleted: lcm_describe and \
             lcm_grep still reach it, and compaction summarises it as its pointer. Only what \
             your context shows now can be forgotten.",
            json!({
                "type": "object",
                "properties": {
                    "id": {
                        "type": "string", "minLength": 1, "maxLength": 64,
                        "description": "A message of the recent history (msg_N) or a summary of the context (sum_N)."
                    },
                    "restore": {
                        "type": "boolean",
                        "description": "Show the item again instead (default false)."
                    }
                },
                "required": ["id"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        may_change_context(caller)
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        permitted(FORGET, &ctx.caller)?;
        let args: ForgetArgs = parse_args(FORGET, args)?;
        let ctx = ctx.clone();
        blocking(FORGET, move || forget(&ctx, &args)).await
    }
}

/// Only a session's main agent shapes its context.
fn may_change_context(caller: &Caller) -> bool {
    !caller.is_sub_agent && !caller.read_only
}

fn permitted(tool: &str, caller: &Caller) -> Result<(), ToolError> {
    if may_change_context(caller) {
        return Ok(());
    }
    Err(ToolError::NotPermitted {
        tool: tool.into(),
        reason: "only the main agent of a session changes what its context shows; a \
                 sub-agent reads with lcm_describe and lcm_expand"
            .into(),
    })
}

/// The node `id` names (a message, or for `lcm_forget` a summary) and its own session.
fn node_of(
    ctx: &ToolContext,
    tool: &'static str,
    id: &str,
    summaries: bool,
) -> Result<(NodeRef, SessionId), ToolError> {
    let parsed: AnyId = id
        .trim()
        .parse()
        .map_err(|e| ToolError::invalid_argument(tool, format!("at /id: {e}")))?;
    let reader = ctx.store.reader().map_err(store_err(tool))?;
    match parsed {
        AnyId::Message(id) => {
            let m = reader.message(id).map_err(store_err(tool))?;
            Ok((NodeRef::Message(id), m.session))
        }
        AnyId::Summary(id) if summaries => {
            let s = reader.summary(id).map_err(store_err(tool))?;
            Ok((NodeRef::Summary(id), s.session))
        }
        other => Err(ToolError::invalid_argument(
            tool,
            format!(
                "at /id: {other} cannot be {}: give {}",
                if summaries { "forgotten" } else { "pinned" },
                if summaries {
                    "a message (msg_N) or a summary (sum_N)"
                } else {
                    "a message (msg_N)"
                }
            ),
        )),
    }
}

fn pin(ctx: &ToolContext, args: &PinArgs) -> Result<Value, ToolError> {
    let (node, own) = node_of(ctx, PIN, &args.id, false)?;
    let NodeRef::Message(message) = node else {
        unreachable!("node_of gives messages only when summaries are not asked for");
    };
    let session = ctx.caller.session.unwrap_or(own);
    if args.unpin {
        let released = ctx
            .store
            .clear_mark(session, node, ContextMark::Pinned)
            .map_err(store_err(PIN))?;
        if !released {
            return Err(ToolError::InvalidRequest {
                tool: PIN.into(),
                message: format!("{message} is not pinned in {session}"),
            });
        }
        return Ok(json!({"id": message, "session": session, "pinned": false}));
    }
    let cap = u64::from(ctx.config.compaction.pinned_max_tokens);
    let pinned = ctx
        .store
        .pin(session, message, cap)
        .map_err(store_err(PIN))?;
    Ok(json!({
        "id": message,
        "session": session,
        "pinned": true,
        "tokens": pinned.tokens,
        "pinned_tokens": pinned.total_tokens,
        "pinned_max_tokens": cap,
        "was_forgotten": pinned.before == Some(ContextMark::Forgotten),
    }))
}

fn forget(ctx: &ToolContext, args: &ForgetArgs) -> Result<Value, ToolError> {
    let (node, own) = node_of(ctx, FORGET, &args.id, true)?;
    let session = ctx.caller.session.unwrap_or(own);
    if args.restore {
        let restored = ctx
            .store
            .clear_mark(session, node, ContextMark::Forgotten)
            .map_err(store_err(FORGET))?;
        if !restored {
            return Err(ToolError::InvalidRequest {
                tool: FORGET.into(),
                message: format!("{node} is not forgotten in {session}"),
            });
        }
        return Ok(json!({"id": node.to_string(), "session": session, "forgotten": false}));
    }
    let before = ctx.store.forget(session, node).map_err(store_err(FORGET))?;
    Ok(json!({
        "id": node.to_string(),
        "session": session,
        "forgotten": true,
        "was_pinned": before == Some(ContextMark::Pinned),
    }))
}
