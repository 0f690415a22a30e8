//! File records for the tools: `lcm_describe file_N` and `lcm_read_file` (a record's content
//! by line range, paginated; sub-agents only, as the paper keeps bulk reads out of the main
//! agent's context).
//!
//! Content that exists in a message (a tool result, a paste) is read back from that message,
//! verbatim. Content behind a path alone, or asked for from disk (`source: "disk"`), is read
//! from the filesystem within the configured roots, and only when it is still what the session
//! saw: a vanished or changed file is reported as such, never served in place of what was seen.

use std::path::Path;

use async_trait::async_trait;
use lcm_core::files::FileInfo;
use lcm_core::ids::FileId;
use lcm_core::summary::NodeRef;
use lcm_store::files::content_hash;
use lcm_store::{Store, StoreReader};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Tool, ToolContext, ToolDefinition};
use super::util::{RegionFinder, blocking, parse_args, parse_id, store_err};

const NAME: &str = "lcm_read_file";

/// Lines of a page when the call gives no `limit`.
pub const DEFAULT_READ_LINES: usize = 200;
/// Largest `limit`.
pub const MAX_READ_LINES: usize = 2_000;
/// Largest page in bytes, whatever the line count (a single line may be huge).
const MAX_PAGE_BYTES: usize = 64 * 1024;
/// Files larger than this are not hashed to check them against what was seen.
const MAX_CHECKED_BYTES: u64 = 256 * 1024 * 1024;

/// Messages listed by `lcm_describe file_N`.
const LISTED_MESSAGES: usize = 50;

/// What the file on disk is, compared with the content the session saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskState {
    /// The record has no path (content that only ever existed in a message).
    NoPath,
    /// The path does not exist (or cannot be read) any more.
    Vanished(String),
    /// Same content as seen (byte for byte, or once a `Read` tool's line numbers are removed).
    Unchanged,
    /// Different content: changed since, or only part of it was seen (a read with a range).
    Changed { disk_bytes: u64 },
    /// Too large to check.
    Unchecked { disk_bytes: u64 },
}

impl DiskState {
    fn to_json(&self) -> Value {
        match self {
            DiskState::NoPath => json!({"state": "no_path"}),
            DiskState::Vanished(why) => json!({"state": "vanished", "detail": why}),
            DiskState::Unchanged => json!({"state": "unchanged"}),
            DiskState::Changed { disk_bytes } => json!({
                "state": "changed",
                "disk_bytes": disk_bytes,
                "detail": "the file on disk differs from what the session saw (hash mismatch): \
                           it changed since, or only part of it was read"
            }),
            DiskState::Unchecked { disk_bytes } => {
                json!({"state": "unchecked", "disk_bytes": disk_bytes})
            }
        }
    }
}

/// Compares the file at the record's path with the content the session saw (`seen`).
pub fn disk_state(info: &FileInfo, seen: Option<&str>) -> DiskState {
    let Some(path) = info.path.as_deref() else {
        return DiskState::NoPath;
    };
    let meta = match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => meta,
        Ok(_) => return DiskState::Vanished(format!("{path} is not a regular file")),
        Err(e) => return DiskState::Vanished(format!("{path}: {e}")),
    };
    if meta.len() > MAX_CHECKED_BYTES {
        return DiskState::Unchecked {
            disk_bytes: meta.len(),
        };
    }
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => return DiskState::Vanished(format!("{path}: {e}")),
    };
    let disk_hash = content_hash(&bytes);
    if disk_hash == info.content_hash {
        return DiskState::Unchanged;
    }
    if let Some(seen) = seen
        && let Some(stripped) = lcm_files::strip_line_numbers(seen)
        && (content_hash(stripped.as_bytes()) == disk_hash
            || bytes.strip_suffix(b"\n") == Some(stripped.as_bytes()))
    {
        return DiskState::Unchanged;
    }
    DiskState::Changed {
        disk_bytes: bytes.len() as u64,
    }
}

/// `lcm_describe file_N`: the record, the messages that reference it and where they stand.
pub(crate) fn describe_file(
    store: &Store,
    reader: &StoreReader,
    id: FileId,
    tool: &'static str,
) -> Result<Value, ToolError> {
    let (info, seen) = store.file_explored(reader, id).map_err(store_err(tool))?;
    let messages = reader.file_messages(id).map_err(store_err(tool))?;
    let regions = RegionFinder::new(reader);
    let mut listed = Vec::new();
    for m in messages.iter().take(LISTED_MESSAGES) {
        let covered_by = regions
            .covering(NodeRef::Message(*m))
            .map_err(store_err(tool))?;
        listed.push(json!({"id": m, "covered_by": covered_by}));
    }
    let disk = disk_state(&info, seen.as_deref());
    let mut out = json!({
        "id": info.id,
        "type": "file",
        "session": info.session,
        "path": info.path,
        "kind": info.kind,
        "mime_type": info.mime_type,
        "language": info.language,
        "bytes": info.byte_len,
        "tokens": info.token_count,
        "content_hash": info.content_hash,
        "content_in": info.content_message,
        "seen_at": info.created_at,
        "exploration": info.exploration,
        "referenced_by": listed,
        "references": messages.len(),
        "on_disk": disk.to_json(),
    });
    if messages.len() > LISTED_MESSAGES {
        out["note"] = json!(format!(
            "the first {LISTED_MESSAGES} of {} referencing messages",
            messages.len()
        ));
    }
    Ok(out)
}

/// The `lcm_read_file` tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmReadFile;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    id: String,
    offset: Option<usize>,
    limit: Option<usize>,
    source: Option<String>,
}

#[async_trait]
impl Tool for LcmReadFile {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            NAME,
            "Read a file record (file_N) by line range, as the session saw it: a page of \
             numbered lines and `next_offset` for the next page. source \"disk\" reads the file \
             at its path instead, only if it is unchanged since it was seen.",
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "minLength": 1, "maxLength": 64, "description": "A file id (file_N)."},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read, from 1 (default 1)."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_LINES, "description": "Most lines to read (default 200)."},
                    "source": {"type": "string", "enum": ["seen", "disk"], "description": "`seen` (default): the content as the session saw it; `disk`: the file at its path, refused if it changed."}
                },
                "required": ["id"],
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &super::registry::Caller) -> bool {
        caller.is_sub_agent
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        if !ctx.caller.is_sub_agent {
            return Err(ToolError::NotPermitted {
                tool: NAME.into(),
                reason: "reading large files would flood the main context, so only sub-agents \
                         may call lcm_read_file. Use lcm_describe file_N for its summary, or \
                         delegate the reading with lcm_expand_query or Task."
                    .into(),
            });
        }
        let args: Args = parse_args(NAME, args)?;
        let ctx = ctx.clone();
        blocking(NAME, move || read(&ctx, args)).await
    }
}

fn read(ctx: &ToolContext, args: Args) -> Result<Value, ToolError> {
    let id: FileId = parse_id(NAME, "/id", args.id.trim())?;
    let reader = ctx.store.reader().map_err(store_err(NAME))?;
    let info = reader.file(id).map_err(store_err(NAME))?;
    let seen = reader.file_content(&info).map_err(store_err(NAME))?;
    let from_disk = args.source.as_deref() == Some("disk") || seen.is_none();
    let text = if from_disk {
        read_from_disk(ctx, &info, seen.as_deref())?
    } else {
        seen.unwrap_or_default()
    };
    let offset = args.offset.unwrap_or(1).max(1);
    let limit = args.limit.unwrap_or(DEFAULT_READ_LINES).min(MAX_READ_LINES);
    let mut page = String::new();
    let mut last = offset - 1;
    let mut total = 0usize;
    for (i, line) in text.lines().enumerate() {
        total = i + 1;
        let number = i + 1;
        if number < offset || number >= offset + limit {
            continue;
        }
        if page.len() + line.len() > MAX_PAGE_BYTES && number > offset {
            continue;
        }
        let shown: &str = if line.len() > MAX_PAGE_BYTES {
            &line[..line.floor_char_boundary(MAX_PAGE_BYTES)]
        } else {
            line
        };
        page.push_str(&format!("{number:>6}\t{shown}\n"));
        last = number;
    }
    if offset > total.max(1) {
        return Err(ToolError::invalid_argument(
            NAME,
            format!("at /offset: {id} has {total} lines, offset {offset} is past its end"),
        ));
    }
    let mut out = json!({
        "id": id,
        "path": info.path,
        "source": if from_disk { "disk" } else { "seen" },
        "lines": total,
        "from_line": offset,
        "to_line": last,
        "content": page,
    });
    if last < total {
        out["next_offset"] = json!(last + 1);
    }
    Ok(out)
}

/// The file at the record's path, if it lies within the configured roots and is what the
/// session saw.
fn read_from_disk(
    ctx: &ToolContext,
    info: &FileInfo,
    seen: Option<&str>,
) -> Result<String, ToolError> {
    let Some(path) = info.path.as_deref() else {
        return Err(ToolError::Unsupported {
            tool: NAME.into(),
            message: format!(
                "{} has no path: its content only exists in the conversation (read it without source \"disk\")",
                info.id
            ),
        });
    };
    let state = disk_state(info, seen);
    if let DiskState::Vanished(detail) = &state {
        return Err(ToolError::Unsupported {
            tool: NAME.into(),
            message: format!("{} vanished: {detail}", info.id),
        });
    }
    super::files::check_within_roots(ctx, NAME, Path::new(path))?;
    match state {
        DiskState::Unchanged => {}
        // A record of a path alone has no hash to compare with: the file is what it is.
        _ if info.content_message.is_none() => {}
        other => {
            return Err(ToolError::Unsupported {
                tool: NAME.into(),
                message: format!(
                    "{} at {path} is not what the session saw ({}); read it as seen (no source \"disk\"), or read the file itself with your file tools",
                    info.id,
                    other.to_json()
                ),
            });
        }
    }
    let bytes = std::fs::read(path).map_err(|e| ToolError::Unsupported {
        tool: NAME.into(),
        message: format!("cannot read {path}: {e}"),
    })?;
    String::from_utf8(bytes).map_err(|_| ToolError::Unsupported {
        tool: NAME.into(),
        message: format!(
            "{path} is not UTF-8 text ({}: {}); lcm_describe {} has its summary",
            info.kind, info.mime_type, info.id
        ),
    })
}
