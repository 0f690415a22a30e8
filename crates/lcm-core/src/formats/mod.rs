//! Parsers of transcript formats into [`NewMessage`]s.
//!
//! Pure functions from bytes to messages: the import driver in `lcm-store` reads files, streams
//! lines through these parsers and appends what they return. Each parser keeps the source entry
//! verbatim as the message's [`Original`](crate::message::Original) and gives it a `source_key`
//! that is stable across re-imports of the same file, which is what makes import idempotent.
//!
//! Formats:
//! - [`claude_code`]: Claude Code session transcripts (JSONL, one entry a line).
//! - [`openai`]: OpenAI Chat Completions `messages` (a JSON array or `{"messages": [...]}`, or
//!   JSONL with one message or one `{"messages": [...]}` conversation a line).
//! - [`lcm`]: lcm's own JSONL message format (one message a line).

pub mod claude_code;
pub mod lcm;
pub mod openai;
mod raw;

use crate::message::NewMessage;

/// A transcript format lcm can import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    ClaudeCode,
    OpenAi,
    Lcm,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::ClaudeCode => "claude_code",
            Format::OpenAi => "openai",
            Format::Lcm => "lcm",
        }
    }

    /// Parses a format name as given on the command line.
    pub fn parse(name: &str) -> Option<Format> {
        match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "claude_code" | "claude" | "cc" => Some(Format::ClaudeCode),
            "openai" | "openai_chat" | "chat" => Some(Format::OpenAi),
            "lcm" | "native" => Some(Format::Lcm),
            _ => None,
        }
    }
}

/// Guesses the format of a transcript from its first line (or the start of a JSON document).
///
/// - Claude Code entries have a string `type` plus `uuid` or `sessionId` (or, for the
///   `file-history-snapshot` / `summary` entries that often open a file, `messageId` or
///   `leafUuid`);
/// - lcm lines have a `role` and a `session` or `parts` field;
/// - OpenAI lines have a `role` (a message) or `messages` (a conversation); a line starting with
///   `[` is an OpenAI document or conversation.
///
/// `None` when the line is not JSON or matches none of these.
pub fn detect(first_line: &[u8]) -> Option<Format> {
    let text = std::str::from_utf8(first_line).ok()?;
    let text = text.trim_start_matches('\u{feff}').trim();
    if text.starts_with('[') {
        return Some(Format::OpenAi);
    }
    let serde_json::Value::Object(entry) = serde_json::from_str(text).ok()? else {
        return None;
    };
    let has = |key: &str| entry.contains_key(key);
    let typed = entry.get("type").is_some_and(serde_json::Value::is_string);
    if typed
        && ["uuid", "sessionId", "messageId", "leafUuid"]
            .into_iter()
            .any(has)
    {
        Some(Format::ClaudeCode)
    } else if has("role") && (has("session") || has("parts")) {
        Some(Format::Lcm)
    } else if has("role") || has("messages") {
        Some(Format::OpenAi)
    } else {
        None
    }
}

/// One message found in a transcript, with the conversation it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedMessage {
    /// The host's key of the conversation (becomes the session key in the store).
    pub session_key: String,
    /// The key of the conversation this one was spawned from (a Claude Code sub-agent's
    /// transcript names its parent session): the store makes the session its child.
    pub parent_session_key: Option<String>,
    pub message: NewMessage,
}

/// What one input line (or one JSON document) yielded.
#[derive(Debug, Clone, PartialEq)]
pub enum LineOutcome {
    /// Zero or more messages (a conversation line can hold many).
    Messages(Vec<ParsedMessage>),
    /// A valid entry that is not a conversation message (progress events, snapshots, ...).
    Skipped { reason: SkipReason },
}

/// Why a valid entry was not imported. The import report counts these by kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum SkipReason {
    /// An entry type that carries no conversation message (`progress`, `file-history-snapshot`).
    NotAMessage { entry_type: String },
    /// A message with no content at all.
    Empty,
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SkipReason::NotAMessage { entry_type } => {
                write!(f, "`{entry_type}` entries are not conversation messages")
            }
            SkipReason::Empty => f.write_str("message has no content"),
        }
    }
}

/// Why an input line could not be parsed. Always names the line and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("line {line}: invalid UTF-8 at byte {byte_offset}")]
    InvalidUtf8 { line: u64, byte_offset: usize },
    #[error("line {line}: malformed JSON: {detail}")]
    MalformedJson { line: u64, detail: String },
    #[error("line {line}: {detail}")]
    InvalidEntry { line: u64, detail: String },
}

impl ParseError {
    /// The 1-based line number the error is about.
    pub fn line(&self) -> u64 {
        match self {
            ParseError::InvalidUtf8 { line, .. }
            | ParseError::MalformedJson { line, .. }
            | ParseError::InvalidEntry { line, .. } => *line,
        }
    }
}

/// Context a parser needs besides the line itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineContext<'a> {
    /// 1-based line number in the file (for errors, and as a stable key where entries have no id).
    pub line: u64,
    /// A name for the conversation when the format carries none (the file stem, say).
    pub default_session_key: &'a str,
}

/// Parses one line of a JSONL file in `format`.
pub fn parse_line(
    format: Format,
    bytes: &[u8],
    ctx: &LineContext<'_>,
) -> Result<LineOutcome, ParseError> {
    match format {
        Format::ClaudeCode => claude_code::parse_line(bytes, ctx),
        Format::OpenAi => openai::parse_line(bytes, ctx),
        Format::Lcm => lcm::parse_line(bytes, ctx),
    }
}

/// Checks a line is UTF-8, reporting where it is not.
pub fn utf8_line(bytes: &[u8], line: u64) -> Result<&str, ParseError> {
    std::str::from_utf8(bytes).map_err(|e| ParseError::InvalidUtf8 {
        line,
        byte_offset: e.valid_up_to(),
    })
}

/// Parses a line as JSON, reporting where it is not.
pub fn json_line(text: &str, line: u64) -> Result<serde_json::Value, ParseError> {
    serde_json::from_str(text).map_err(|e| ParseError::MalformedJson {
        line,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detect_recognises_each_format() {
        let claude = [
            r#"{"type":"file-history-snapshot","messageId":"7d48","snapshot":{},"isSnapshotUpdate":false}"#,
            r#"{"parentUuid":null,"isSidechain":false,"sessionId":"5560","type":"progress","uuid":"3579"}"#,
            r#"{"type":"queue-operation","operation":"enqueue","timestamp":"2026-02-10T21:11:56.846Z","sessionId":"d6e0"}"#,
            r#"{"type":"summary","summary":"Fixing the server","leafUuid":"abc"}"#,
        ];
        for line in claude {
            assert_eq!(detect(line.as_bytes()), Some(Format::ClaudeCode), "{line}");
        }
        let lcm = [
            r#"{"session":"s","role":"user","created_at":"2026-02-10T21:11:56.846Z","parts":[{"type":"text","text":"hi"}]}"#,
            r#"{"role":"assistant","parts":[]}"#,
            r#"{"session":"s","role":"user","content":"hi"}"#,
        ];
        for line in lcm {
            assert_eq!(detect(line.as_bytes()), Some(Format::Lcm), "{line}");
        }
        let openai = [
            r#"{"role":"user","content":"hi"}"#,
            r#"{"role":"assistant","content":null,"tool_calls":[]}"#,
            r#"{"id":"c1","messages":[{"role":"user","content":"hi"}]}"#,
            r#"[{"role":"user","content":"hi"}]"#,
            "  [",
            "\u{feff}[",
        ];
        for line in openai {
            assert_eq!(detect(line.as_bytes()), Some(Format::OpenAi), "{line}");
        }
        for line in [
            &b""[..],
            b"hello",
            b"{",
            b"42",
            b"{\"a\":1}",
            b"\xff\xfe",
            b"{\"type\":\"x\"}",
        ] {
            assert_eq!(detect(line), None, "{}", String::from_utf8_lossy(line));
        }
    }
}
