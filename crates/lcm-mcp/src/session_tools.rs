//! The MCP-only session tools: what an MCP client needs to use lcm as its memory and that the
//! runtime's tool registry (written for models inside a conversation) does not offer:
//!
//! - `lcm_sessions`: the sessions in the store with their message counts and token totals;
//! - `lcm_append`: append messages to a session (by key, created if absent, or `ses_N`);
//! - `lcm_context`: a session's assembled context for a token budget.
//!
//! When the server works in a session (`lcm mcp --session KEY`), `lcm_append` and `lcm_context`
//! default to it; when it works in none (the default), their `session` argument is required by
//! their schemas, so a call without one is refused before anything runs.
//!
//! They are ordinary [`Tool`]s in a [`ToolRegistry`] of their own, so their arguments are
//! validated against their JSON Schemas exactly like the runtime's tools, and their errors are
//! the same [`ToolError`]s. They reach the store only through the runtime: appends through the
//! session's handle (one transaction, durable on return), contexts through the session actor
//! (which compacts when the budget asks for it), listings as store reads on the blocking pool.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use lcm_core::formats::lcm::parse_live_message;
use lcm_core::ids::SessionId;
use lcm_core::message::{NewMessage, SessionInfo};
use lcm_engine::runtime::{Runtime, RuntimeError, SessionHandle};
use lcm_engine::tools::{Tool, ToolContext, ToolDefinition, ToolError, ToolFormat, ToolRegistry};
use lcm_store::StoreError;
use serde_json::{Value, json};

/// Sessions listed when `lcm_sessions` gives no `limit`.
pub const DEFAULT_SESSIONS_LIMIT: u64 = 100;
/// Most sessions one `lcm_sessions` call lists.
pub const MAX_SESSIONS_LIMIT: u64 = 1_000;
/// Most messages one `lcm_append` call stores.
pub const MAX_APPEND_BATCH: u64 = 10_000;
/// Longest session key `lcm_append` accepts (the HTTP API's limit too).
pub const MAX_KEY_BYTES: u64 = 1_024;

/// The three session tools, in the order they are listed. `working_session`: whether the
/// server works in a session (the caller of their [`ToolContext`] is that session's main
/// agent), which `lcm_append` and `lcm_context` then default to; without one their `session`
/// argument is required.
pub fn session_tools(runtime: &Runtime, working_session: bool) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(LcmSessions),
        Arc::new(LcmAppend {
            runtime: runtime.clone(),
            working_session,
        }),
        Arc::new(LcmContext {
            runtime: runtime.clone(),
            working_session,
        }),
    ]
}

/// A registry holding the session tools.
pub(crate) fn registry(
    runtime: &Runtime,
    working_session: bool,
) -> Result<ToolRegistry, ToolError> {
    let mut registry = ToolRegistry::new();
    for tool in session_tools(runtime, working_session) {
        registry.register(tool)?;
    }
    Ok(registry)
}

/// `lcm_sessions`: the sessions in the store, with counts and token totals.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmSessions;

#[async_trait]
impl Tool for LcmSessions {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "lcm_sessions",
            "List the sessions (conversations) lcm stores, oldest first: id (ses_N), key, parent \
             session (for sub-agents), message count, token total, time of the first and last \
             message. `current` is the session this MCP server works in (the default of \
             lcm_grep, lcm_append and lcm_context), null when it works in none (lcm_grep then \
             searches every session). Use a session's id or key as the `session` argument of \
             the other tools.",
            json!({
                "type": "object",
                "properties": {
                    "prefix": {
                        "type": "string",
                        "description": "Only the sessions whose key starts with this."
                    },
                    "offset": {
                        "type": "integer", "minimum": 0,
                        "description": "Skip this many matching sessions (paging; default 0)."
                    },
                    "limit": {
                        "type": "integer", "minimum": 1, "maximum": MAX_SESSIONS_LIMIT,
                        "description": "Most sessions to list (default 100)."
                    }
                },
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const NAME: &str = "lcm_sessions";
        let prefix = args
            .get("prefix")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let offset = usize_arg(&args, "offset", 0);
        let limit = usize_arg(&args, "limit", DEFAULT_SESSIONS_LIMIT);
        let store = Arc::clone(&ctx.store);
        let sessions = blocking(NAME, move || store.sessions()).await?;
        let matching: Vec<&SessionInfo> = sessions
            .iter()
            .filter(|s| prefix.as_deref().is_none_or(|p| s.key.starts_with(p)))
            .collect();
        let page: Vec<&SessionInfo> = matching.iter().skip(offset).take(limit).copied().collect();
        let next = offset.saturating_add(page.len());
        Ok(json!({
            "sessions": page,
            "total": matching.len(),
            "next_offset": (next < matching.len()).then_some(next),
            "current": ctx.caller.session,
        }))
    }
}

/// `lcm_append`: appends messages to a session in one transaction.
#[derive(Clone)]
pub struct LcmAppend {
    runtime: Runtime,
    /// Whether `session` defaults to the server's session (else it is required).
    working_session: bool,
}

#[async_trait]
impl Tool for LcmAppend {
    fn definition(&self) -> ToolDefinition {
        let (session, required) = session_param(
            self.working_session,
            "A session key (the session is created if absent) or an existing session id (ses_N).",
            "messages",
        );
        ToolDefinition::new(
            "lcm_append",
            "Store messages in a session, verbatim, in one transaction: they are durable and \
             searchable (lcm_grep) when the call returns. Give each message a `key` (your own \
             id for it, unique in the session): a key already stored adds nothing, so a \
             repeated call is safe. Returns each message's id (msg_N) and whether it was new.",
            json!({
                "type": "object",
                "properties": {
                    "session": {
                        "type": "string", "minLength": 1, "maxLength": MAX_KEY_BYTES,
                        "description": session
                    },
                    "messages": {
                        "type": "array", "minItems": 1, "maxItems": MAX_APPEND_BATCH,
                        "description": "The messages, oldest first.",
                        "items": {
                            "type": "object",
                            "properties": {
                                "role": {"enum": ["system", "user", "assistant", "tool"]},
                                "content": {
                                    "type": "string",
                                    "description": "The text (shorthand for one text part). Give exactly one of content and parts."
                                },
                                "parts": {
                                    "type": "array",
                                    "items": {"type": "object", "required": ["type"]},
                                    "description": "Typed parts: {\"type\":\"text\",\"text\":..}, {\"type\":\"tool_call\",\"id\":..,\"name\":..,\"arguments\":..}, {\"type\":\"tool_result\",\"call_id\":..,\"content\":..}, {\"type\":\"reasoning\",\"text\":..}, ..."
                                },
                                "key": {
                                    "type": "string", "minLength": 1,
                                    "description": "Your id for the message, unique in the session (makes retries safe)."
                                },
                                "created_at": {
                                    "type": ["string", "integer"],
                                    "description": "RFC 3339 time or milliseconds since the epoch (default: now)."
                                }
                            },
                            "required": ["role"],
                            "additionalProperties": false
                        }
                    }
                },
                "required": required,
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const NAME: &str = "lcm_append";
        // Every message is checked before anything is stored.
        let items = args
            .get("messages")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut messages = Vec::with_capacity(items.len());
        let mut errors = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match parse_message(item) {
                Ok(message) => messages.push(message),
                Err(e) => errors.push(format!("at /messages/{i}: {e}")),
            }
        }
        if !errors.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool: NAME.into(),
                errors,
            });
        }
        let handle = match args.get("session").and_then(Value::as_str) {
            None => default_session(NAME, &self.runtime, ctx).await?,
            Some(name) => match name.parse::<SessionId>() {
                Ok(id) => self.runtime.session_by_id(id).await,
                Err(_) if name.trim().is_empty() => {
                    return Err(ToolError::invalid_argument(
                        NAME,
                        "at /session: a session key must not be blank",
                    ));
                }
                Err(_) => self.runtime.session(name).await,
            }
            .map_err(|e| runtime_error(NAME, e))?,
        };
        let appended = handle
            .append_batch(messages)
            .await
            .map_err(|e| runtime_error(NAME, e))?;
        let inserted = appended.iter().filter(|a| a.inserted).count();
        let store = Arc::clone(&ctx.store);
        let id = handle.id();
        let info = blocking(NAME, move || store.session(id)).await?;
        Ok(json!({
            "session": info.id,
            "key": info.key,
            "appended": appended,
            "inserted": inserted,
            "message_count": info.message_count,
            "token_total": info.token_total,
        }))
    }
}

/// `lcm_context`: what to send a model for a session's next turn, within a budget.
#[derive(Clone)]
pub struct LcmContext {
    runtime: Runtime,
    /// Whether `session` defaults to the server's session (else it is required).
    working_session: bool,
}

#[async_trait]
impl Tool for LcmContext {
    fn definition(&self) -> ToolDefinition {
        let (session, required) = session_param(
            self.working_session,
            "The session id (ses_N) or key.",
            "budget",
        );
        ToolDefinition::new(
            "lcm_context",
            "A session's context for a model whose window is `budget` tokens: the summaries \
             standing for older messages (their ids can be expanded with lcm_expand_query or \
             described with lcm_describe), then the recent messages verbatim, rendered as \
             OpenAI or Anthropic messages, always within the budget (minus a safety margin). \
             When the session is over the budget's soft threshold this compacts it first.",
            json!({
                "type": "object",
                "properties": {
                    "session": {
                        "type": "string", "minLength": 1,
                        "description": session
                    },
                    "budget": {
                        "type": "integer", "minimum": 1,
                        "description": "The model's context window, in tokens."
                    },
                    "format": {
                        "enum": ["openai", "anthropic"],
                        "description": "The shape of the messages (default openai)."
                    },
                    "system": {
                        "type": "string",
                        "description": "A system prompt to put first."
                    }
                },
                "required": required,
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const NAME: &str = "lcm_context";
        let budget = args.get("budget").and_then(Value::as_u64).unwrap_or(1);
        let format = match args.get("format").and_then(Value::as_str) {
            None => ToolFormat::OpenAi,
            Some(text) => ToolFormat::from_str(text)
                .map_err(|e| ToolError::invalid_argument(NAME, format!("at /format: {e}")))?,
        };
        let handle = match args.get("session").and_then(Value::as_str) {
            None => default_session(NAME, &self.runtime, ctx).await?,
            Some(name) => {
                let info = existing_session(NAME, ctx, name).await?;
                self.runtime
                    .session_by_id(info.id)
                    .await
                    .map_err(|e| runtime_error(NAME, e))?
            }
        };
        let context = handle
            .context(budget)
            .await
            .map_err(|e| runtime_error(NAME, e))?;
        let system = args.get("system").and_then(Value::as_str);
        let context = lcm_engine::runtime::fit_with_system(&self.runtime, context, budget, system)
            .map_err(|e| runtime_error(NAME, e))?;
        let counter = self.runtime.store().counter();
        let out = context.to_response(budget, format, system, counter);
        Ok(out)
    }
}

/// The description of a `session` parameter and the tool's required parameters: with a working
/// session, `session` defaults to it; without one, it is required.
fn session_param(working_session: bool, what: &str, required: &str) -> (String, Value) {
    if working_session {
        (
            format!("{what} Default: the session this server works in."),
            json!([required]),
        )
    } else {
        (
            format!("{what} Required: this server works in no session of its own."),
            json!(["session", required]),
        )
    }
}

/// One `lcm_append` message: the lcm format's live-message rules (no `key`: no source key, so
/// the message is stored again if sent again; no `created_at`: now).
fn parse_message(item: &Value) -> Result<NewMessage, String> {
    parse_live_message(&item.to_string(), "mcp")
}

/// The handle of the session this server works in (the caller's session).
async fn default_session(
    tool: &str,
    runtime: &Runtime,
    ctx: &ToolContext,
) -> Result<SessionHandle, ToolError> {
    let id = ctx.caller.session.ok_or_else(|| {
        ToolError::invalid_argument(
            tool,
            "at /session: this MCP server works in no session of its own (it was started \
             without --session), so give the session: a key or an id (ses_N)",
        )
    })?;
    runtime
        .session_by_id(id)
        .await
        .map_err(|e| runtime_error(tool, e))
}

/// The stored session `name` (`ses_N` or a key); a missing one is [`ToolError::NotFound`].
async fn existing_session(
    tool: &'static str,
    ctx: &ToolContext,
    name: &str,
) -> Result<SessionInfo, ToolError> {
    let store = Arc::clone(&ctx.store);
    let lookup = name.to_owned();
    let found = blocking(tool, move || {
        let id = match lookup.parse::<SessionId>() {
            Ok(id) => Some(id),
            Err(_) => store.session_id_for_key(&lookup)?,
        };
        id.map(|id| store.session(id)).transpose()
    })
    .await?;
    found.ok_or_else(|| ToolError::NotFound {
        tool: tool.into(),
        id: name.into(),
        message: format!("no session `{name}` in the store; lcm_sessions lists them"),
    })
}

/// A runtime failure as the tool error the model should see.
fn runtime_error(tool: &str, error: RuntimeError) -> ToolError {
    match error {
        RuntimeError::Store(e) => ToolError::from_store(tool, e),
        RuntimeError::Invalid(message) => ToolError::InvalidRequest {
            tool: tool.into(),
            message,
        },
        RuntimeError::Budget(e) => ToolError::InvalidRequest {
            tool: tool.into(),
            message: e.to_string(),
        },
        other => ToolError::failed(tool, other),
    }
}

/// Runs a store read on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    tool: &'static str,
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::failed(tool, e))?
        .map_err(|e| ToolError::from_store(tool, e))
}

/// An integer argument the schema bounded, as a `usize`.
fn usize_arg(args: &Value, name: &str, default: u64) -> usize {
    let value = args.get(name).and_then(Value::as_u64).unwrap_or(default);
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::message::{Part, Role};
    use lcm_core::time::Timestamp;

    #[test]
    fn messages_parse_with_the_mcp_defaults() {
        let m = parse_message(&json!({"role": "user", "content": "hi", "key": "k1"})).unwrap();
        assert_eq!(m.role, Role::User);
        assert_eq!(m.source_key.as_deref(), Some("k1"));
        assert!(m.created_at.millis() > 0);
        let m = parse_message(&json!({
            "role": "assistant",
            "parts": [{"type": "text", "text": "b"}],
            "created_at": 5
        }))
        .unwrap();
        assert_eq!(m.source_key, None);
        assert_eq!(m.created_at, Timestamp(5));
        assert_eq!(m.parts, vec![Part::Text { text: "b".into() }]);
    }

    #[test]
    fn bad_messages_say_what_is_wrong() {
        let both = parse_message(&json!({"role": "user", "content": "a", "parts": []}));
        assert!(both.is_err_and(|e| e.contains("content")));
        let neither = parse_message(&json!({"role": "user"})).unwrap_err();
        assert!(neither.contains("parts"), "{neither}");
    }

    #[test]
    fn session_is_required_without_a_working_session() {
        let (text, required) = session_param(true, "A session.", "budget");
        assert!(text.contains("Default"), "{text}");
        assert_eq!(required, json!(["budget"]));
        let (text, required) = session_param(false, "A session.", "budget");
        assert!(!text.contains("Default"), "{text}");
        assert_eq!(required, json!(["session", "budget"]));
    }

    #[test]
    fn the_definitions_register() {
        let mut registry = ToolRegistry::new();
        registry.register(Arc::new(LcmSessions)).unwrap();
        assert!(
            registry
                .validate("lcm_sessions", &json!({"limit": 0}))
                .is_err()
        );
        assert!(registry.validate("lcm_sessions", &json!({})).is_ok());
    }
}
