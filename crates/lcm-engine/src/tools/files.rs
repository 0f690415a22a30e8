//! File tools for agents (agentic_map items, Task sub-agents): `read_file`, `list_dir` and
//! `write_file`, confined to the configured roots (`map.allowed_roots`; the working directory
//! when none is set). `write_file` is refused to read-only agents and never offered to them.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Caller, Tool, ToolContext, ToolDefinition};
use crate::operators::input::{effective_roots, resolve_input, resolve_output};

/// Most lines `read_file` returns at once.
pub const MAX_READ_LINES: u64 = 2_000;
/// Most bytes `read_file` returns at once.
pub const MAX_READ_BYTES: usize = 256 * 1024;
/// Most entries `list_dir` returns.
pub const MAX_LIST_ENTRIES: usize = 1_000;
/// Largest file `write_file` writes.
pub const MAX_WRITE_BYTES: usize = 4 * 1024 * 1024;

fn roots(ctx: &ToolContext, tool: &str) -> Result<Vec<PathBuf>, ToolError> {
    effective_roots(&ctx.config.map.allowed_roots).map_err(|e| ToolError::NotPermitted {
        tool: tool.into(),
        reason: e.to_string(),
    })
}

/// `path` resolved (`..` and symlinks) if it lies inside the allowed roots.
pub(crate) fn check_within_roots(
    ctx: &ToolContext,
    tool: &str,
    path: &std::path::Path,
) -> Result<PathBuf, ToolError> {
    let roots = roots(ctx, tool)?;
    resolve_input(path, &roots).map_err(|e| ToolError::NotPermitted {
        tool: tool.into(),
        reason: e.to_string(),
    })
}

fn path_arg(args: &Value) -> PathBuf {
    PathBuf::from(args.get("path").and_then(Value::as_str).unwrap_or_default())
}

async fn blocking<T: Send + 'static>(
    tool: &'static str,
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::failed(tool, e))?
}

/// `read_file(path, offset, limit)`: lines of a text file inside the allowed roots.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFile;

#[async_trait]
impl Tool for ReadFile {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "read_file",
            "Read lines of a text file inside the allowed directories: `offset` is the first line (from 0), `limit` the number of lines (at most 2000). Says when more lines follow.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "offset": {"type": "integer", "minimum": 0, "default": 0},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_LINES, "default": MAX_READ_LINES}
                },
                "required": ["path"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const TOOL: &str = "read_file";
        let roots = roots(ctx, TOOL)?;
        let given = path_arg(&args);
        let offset = args.get("offset").and_then(Value::as_u64).unwrap_or(0);
        let limit = args
            .get("limit")
            .and_then(Value::as_u64)
            .unwrap_or(MAX_READ_LINES);
        blocking(TOOL, move || {
            let path = resolve_input(&given, &roots).map_err(|e| ToolError::NotPermitted {
                tool: TOOL.into(),
                reason: e.to_string(),
            })?;
            let file = std::fs::File::open(&path).map_err(|e| ToolError::failed(TOOL, e))?;
            let mut lines = Vec::new();
            let mut bytes = 0usize;
            let mut more = false;
            for (i, line) in BufReader::new(file).lines().enumerate() {
                let i = i as u64;
                if i < offset {
                    continue;
                }
                let line = line.map_err(|e| {
                    ToolError::failed(TOOL, format!("line {i} is not UTF-8 text: {e}"))
                })?;
                if i >= offset + limit || bytes + line.len() > MAX_READ_BYTES {
                    more = true;
                    break;
                }
                bytes += line.len() + 1;
                lines.push(line);
            }
            Ok(json!({
                "path": path.display().to_string(),
                "offset": offset,
                "lines": lines.len(),
                "content": lines.join("\n"),
                "more": more,
            }))
        })
        .await
    }
}

/// `list_dir(path)`: the entries of a directory inside the allowed roots.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListDir;

#[async_trait]
impl Tool for ListDir {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "list_dir",
            "List a directory inside the allowed directories: names, whether each is a file or a directory, and file sizes in bytes (at most 1000 entries, sorted by name).",
            json!({
                "type": "object",
                "properties": {"path": {"type": "string", "minLength": 1}},
                "required": ["path"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const TOOL: &str = "list_dir";
        let roots = roots(ctx, TOOL)?;
        let given = path_arg(&args);
        blocking(TOOL, move || {
            let joined = if given.is_absolute() {
                given.clone()
            } else {
                roots.first().map(|r| r.join(&given)).unwrap_or_default()
            };
            let dir = joined.canonicalize().map_err(|e| ToolError::NotFound {
                tool: TOOL.into(),
                id: given.display().to_string(),
                message: format!("cannot be resolved: {e}"),
            })?;
            if !roots.iter().any(|r| dir.starts_with(r)) || !dir.is_dir() {
                return Err(ToolError::NotPermitted {
                    tool: TOOL.into(),
                    reason: format!(
                        "{} is not a directory inside the allowed roots",
                        given.display()
                    ),
                });
            }
            let mut entries: Vec<(String, bool, u64)> = std::fs::read_dir(&dir)
                .map_err(|e| ToolError::failed(TOOL, e))?
                .filter_map(Result::ok)
                .map(|e| {
                    let meta = e.metadata().ok();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        meta.as_ref().is_some_and(|m| m.is_dir()),
                        meta.map_or(0, |m| m.len()),
                    )
                })
                .collect();
            entries.sort();
            let truncated = entries.len() > MAX_LIST_ENTRIES;
            entries.truncate(MAX_LIST_ENTRIES);
            Ok(json!({
                "path": dir.display().to_string(),
                "entries": entries.iter().map(|(name, is_dir, size)| if *is_dir {
                    json!({"name": name, "type": "dir"})
                } else {
                    json!({"name": name, "type": "file", "bytes": size})
                }).collect::<Vec<_>>(),
                "truncated": truncated,
            }))
        })
        .await
    }
}

/// `write_file(path, content)`: creates or replaces a file inside the allowed roots; refused to
/// read-only agents.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFile;

#[async_trait]
impl Tool for WriteFile {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "write_file",
            "Create or replace a text file inside the allowed directories (its directory must exist). Not available to read-only agents.",
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1},
                    "content": {"type": "string", "maxLength": MAX_WRITE_BYTES}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        !caller.read_only
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        const TOOL: &str = "write_file";
        if ctx.caller.read_only {
            return Err(ToolError::NotPermitted {
                tool: TOOL.into(),
                reason: "this agent is read-only: it may read files but not write them".into(),
            });
        }
        let roots = roots(ctx, TOOL)?;
        let given = path_arg(&args);
        let content = args
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        blocking(TOOL, move || {
            let path = resolve_output(&given, &roots).map_err(|e| ToolError::NotPermitted {
                tool: TOOL.into(),
                reason: e.to_string(),
            })?;
            std::fs::write(&path, content.as_bytes()).map_err(|e| ToolError::failed(TOOL, e))?;
            Ok(json!({"path": path.display().to_string(), "bytes": content.len()}))
        })
        .await
    }
}
