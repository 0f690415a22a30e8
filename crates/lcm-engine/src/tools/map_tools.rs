//! The operator tools (paper appendix C.2): `llm_map` and `agentic_map`. One call processes a
//! whole JSONL file outside the model's context; the engine iterates, runs items concurrently,
//! validates each result against the caller's JSON Schema, retries, and returns a compact
//! summary (counts, output path, a few examples, the failures), never the whole output.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use lcm_store::MapKind;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Caller, Tool, ToolContext, ToolDefinition};
use crate::operators::MapRequest;
use crate::operators::input::{effective_roots, resolve_input};

fn properties(agentic: bool) -> Value {
    let mut p = json!({
        "input_path": {"type": "string", "minLength": 1, "description": "JSONL file, one item per line, inside the allowed directories."},
        "prompt": {"type": "string", "minLength": 1, "description": "What to do with each item."},
        "output_schema": {"type": "object", "description": "JSON Schema every item's result must match."},
        "output_path": {"type": "string", "description": "Where the JSONL results go (default: <input>.out.jsonl beside the input)."},
        "concurrency": {"type": "integer", "minimum": 1, "maximum": 256},
        "max_attempts": {"type": "integer", "minimum": 1, "maximum": 10},
        "timeout_s": {"type": "integer", "minimum": 1, "maximum": 86400},
        "model": {"type": "string"}
    });
    if agentic {
        p["read_only"] = json!({"type": "boolean", "default": true, "description": "Item agents may read files but not write them."});
    }
    p
}

fn request(kind: MapKind, args: &Value) -> MapRequest {
    let s = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
    let n = |k: &str| args.get(k).and_then(Value::as_u64);
    MapRequest {
        kind,
        input_path: PathBuf::from(s("input_path").unwrap_or_default()),
        prompt: s("prompt").unwrap_or_default(),
        output_schema: args.get("output_schema").cloned().unwrap_or(Value::Null),
        output_path: s("output_path").map(PathBuf::from),
        concurrency: n("concurrency").map(|v| v as u32),
        max_attempts: n("max_attempts").map(|v| v as u32),
        timeout: n("timeout_s").map(Duration::from_secs),
        model: s("model"),
        read_only: args
            .get("read_only")
            .and_then(Value::as_bool)
            .unwrap_or(true),
    }
}

/// Size of the input file in bytes (resolved inside the allowed roots).
fn input_bytes(ctx: &ToolContext, tool: &str, path: &std::path::Path) -> Result<u64, ToolError> {
    let refused = |reason: String| ToolError::NotPermitted {
        tool: tool.into(),
        reason,
    };
    let roots =
        effective_roots(&ctx.config.map.allowed_roots).map_err(|e| refused(e.to_string()))?;
    let path = resolve_input(path, &roots).map_err(|e| refused(e.to_string()))?;
    std::fs::metadata(&path)
        .map(|m| m.len())
        .map_err(|e| ToolError::failed(tool, e))
}

async fn run(
    ctx: &ToolContext,
    tool: &'static str,
    request: MapRequest,
) -> Result<Value, ToolError> {
    let delegator = ctx
        .delegator
        .as_ref()
        .ok_or_else(|| ToolError::Unsupported {
            tool: tool.into(),
            message: "map operators run inside the lcm runtime; this caller has none".into(),
        })?;
    // Nested maps (from an agentic_map item) must run over strictly smaller inputs, so that
    // nesting always terminates.
    if let Some(limit) = ctx.caller.map_input_limit {
        let ctx2 = ctx.clone();
        let path = request.input_path.clone();
        let bytes = tokio::task::spawn_blocking(move || input_bytes(&ctx2, tool, &path))
            .await
            .map_err(|e| ToolError::failed(tool, e))??;
        if bytes >= limit {
            return Err(ToolError::NotPermitted {
                tool: tool.into(),
                reason: format!(
                    "a map started from inside an agentic_map item must run over a strictly smaller input than its parent's ({bytes} bytes given, the parent's input has {limit}); process the item directly instead"
                ),
            });
        }
    }
    let summary = delegator.run_map(&ctx.caller, request).await?;
    Ok(json!(summary))
}

/// `llm_map(input_path, prompt, output_schema, ...)`: one stateless model call per item.
#[derive(Debug, Clone, Copy, Default)]
pub struct LlmMapTool;

#[async_trait]
impl Tool for LlmMapTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "llm_map",
            "Process every item of a JSONL file with one independent model call each (no tools), outside your context: results are validated against output_schema, retried with the validation error, and written to a JSONL file in input order. Returns counts, the output path, a few examples and the failures.",
            json!({
                "type": "object",
                "properties": properties(false),
                "required": ["input_path", "prompt", "output_schema"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        run(ctx, "llm_map", request(MapKind::Llm, &args)).await
    }
}

/// `agentic_map(input_path, prompt, output_schema, read_only, ...)`: a full sub-agent per item.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgenticMapTool;

#[async_trait]
impl Tool for AgenticMapTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "agentic_map",
            "Like llm_map, but each item is handled by a sub-agent with tools (file reads; writes only if read_only is false; the lcm tools, including agentic_map over strictly smaller inputs). Results are validated against output_schema and written to a JSONL file in input order.",
            json!({
                "type": "object",
                "properties": properties(true),
                "required": ["input_path", "prompt", "output_schema"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        // Read-only exploration agents (expansion) spawn nothing.
        !(caller.read_only && caller.map_input_limit.is_none())
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        let mut request = request(MapKind::Agentic, &args);
        // An item agent that is read-only cannot start writers below it.
        if ctx.caller.read_only {
            request.read_only = true;
        }
        run(ctx, "agentic_map", request).await
    }
}
