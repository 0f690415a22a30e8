//! File records: what lcm knows of a file (or a large payload) a session has seen.
//!
//! The paper's large-file stage (section 2.2): a payload past `large_file_tokens` is kept
//! verbatim in its message, but the context carries a compact **reference** instead of it: the
//! file's id, its path, kind and size, and an exploration summary. File reads of any size get a
//! record too, so that summaries can name every file under them ("the model keeps awareness of
//! every file it has seen"). This module is the vocabulary: the record, how a message refers to
//! records, which tool calls read a file, and the reference text the context shows.

use serde::Serialize;

use crate::ids::{FileId, MessageId, SessionId, SummaryId};
use crate::message::Part;
use crate::time::Timestamp;

/// A file record as stored: one per distinct content (the same content seen twice is one
/// record, referenced twice).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode)]
pub struct FileInfo {
    pub id: FileId,
    /// The session in which the content was first seen.
    pub session: SessionId,
    /// The file's path when the content came from a file (a read tool call, a file part).
    pub path: Option<String>,
    /// Detected kind: `csv`, `json`, `code`, `log`, ... (see `lcm_files::FileKind`).
    pub kind: String,
    pub mime_type: String,
    /// For source code, its language.
    pub language: Option<String>,
    /// Size of the content as seen, in bytes and tokens.
    pub byte_len: u64,
    pub token_count: u32,
    /// SHA-256 of the content as seen, lowercase hex.
    pub content_hash: String,
    /// Where the content lives: this message's part (`None` for a file part that carried only a
    /// path: the content is on the filesystem alone).
    pub content_message: Option<MessageId>,
    pub content_part: u32,
    /// The type-aware exploration summary.
    pub exploration: String,
    /// Tokens of [`render_file_reference`] of this record: what the context pays in place of
    /// the payload.
    pub reference_tokens: u32,
    pub created_at: Timestamp,
}

/// How one part of a message refers to a file record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode)]
pub struct FileRef {
    /// Index of the part in the message.
    pub part: u32,
    pub file: FileId,
    /// `true`: the part is small enough to stay in the context as it is (a file read under the
    /// threshold); `false`: the context shows the file's reference instead of the part.
    pub inline: bool,
}

/// The file references of one message, and what the message costs in a context once its large
/// parts are replaced by references.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode)]
pub struct MessageFiles {
    pub refs: Vec<FileRef>,
    /// Tokens of the message as a context shows it (equal to its stored count when every
    /// reference is inline).
    pub context_tokens: u32,
}

impl MessageFiles {
    /// The reference of part `index`, if that part is shown as a reference.
    pub fn replaced(&self, index: usize) -> Option<FileId> {
        self.refs
            .iter()
            .find(|r| !r.inline && r.part as usize == index)
            .map(|r| r.file)
    }
}

/// The path a tool call reads, when it is a file read: Claude Code's `Read` (`file_path`),
/// the common `read_file` / `view` / `open_file` shapes of other agents (`path`, `file_path`,
/// `filename`), `str_replace_editor`'s `view` command, and a shell command that is a plain
/// `cat PATH`. `None` for anything else.
pub fn read_call_path(name: &str, arguments: &str) -> Option<String> {
    const READS: [&str; 9] = [
        "read",
        "read_file",
        "readfile",
        "view",
        "view_file",
        "open_file",
        "cat",
        "fs_read",
        "read_text_file",
    ];
    const EDITORS: [&str; 3] = [
        "str_replace_editor",
        "str_replace_based_edit_tool",
        "text_editor",
    ];
    const SHELLS: [&str; 5] = ["bash", "shell", "exec", "run_command", "execute_command"];
    const PATH_KEYS: [&str; 4] = ["file_path", "path", "filename", "file"];
    let is = |names: &[&str]| names.iter().any(|n| n.eq_ignore_ascii_case(name));
    // The name decides first: most tool calls are not reads, and need no JSON parse.
    let (read, editor, shell) = (is(&READS), is(&EDITORS), is(&SHELLS));
    if !(read || editor || shell) {
        return None;
    }
    let args: serde_json::Value = serde_json::from_str(arguments).ok()?;
    let string_arg = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| args.get(*k).and_then(|v| v.as_str()))
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
    };
    if read {
        string_arg(&PATH_KEYS)
    } else if editor {
        (args.get("command").and_then(|c| c.as_str()) == Some("view"))
            .then(|| string_arg(&PATH_KEYS))
            .flatten()
    } else {
        cat_path(&string_arg(&["command", "cmd"])?)
    }
}

/// `PATH` of a shell command that is exactly `cat PATH` (one operand, no options, pipes or
/// redirections).
fn cat_path(command: &str) -> Option<String> {
    let rest = command.trim().strip_prefix("cat ")?.trim();
    if rest.is_empty()
        || rest.starts_with('-')
        || rest
            .chars()
            .any(|c| matches!(c, '|' | '>' | '<' | ';' | '&' | '$' | '`' | '*' | '\n'))
    {
        return None;
    }
    let unquoted = match (rest.chars().next(), rest.chars().last()) {
        (Some(q @ ('"' | '\'')), Some(end)) if end == q && rest.len() >= 2 => {
            &rest[1..rest.len() - 1]
        }
        _ => rest,
    };
    if unquoted.contains(char::is_whitespace) && unquoted.len() == rest.len() {
        return None;
    }
    Some(unquoted.to_owned())
}

/// The text a context shows in place of a payload registered as `file`: the id, path, kind
/// and sizes the engine writes (never a model), then the exploration summary. It names no
/// message, so every reference to one record costs the same tokens.
pub fn render_file_reference(file: &FileInfo) -> String {
    let path = file
        .path
        .as_deref()
        .map(|p| format!(" path=\"{}\"", p.replace('"', "'")))
        .unwrap_or_default();
    let language = file
        .language
        .as_deref()
        .map(|l| format!(" language=\"{l}\""))
        .unwrap_or_default();
    format!(
        "<lcm_file id=\"{}\"{path} kind=\"{}\" mime=\"{}\"{language} bytes=\"{}\" tokens=\"{}\">\n{}\n</lcm_file>\n(Not loaded into this context. lcm_describe {} gives the details; a sub-agent can read it by line range with lcm_read_file.)",
        file.id,
        file.kind,
        file.mime_type,
        file.byte_len,
        file.token_count,
        file.exploration.trim_end(),
        file.id,
    )
}

/// A part as contexts show it in place of its payload (a file reference, or a part reference):
/// `reference` as its text, keeping what pairs it (a call's id and name, a result's call id and
/// error flag). Token counts of shown messages are counted on exactly this.
pub fn shown_part(part: &Part, reference: String) -> Part {
    match part {
        Part::ToolResult {
            call_id, is_error, ..
        } => Part::ToolResult {
            call_id: call_id.clone(),
            content: reference,
            is_error: *is_error,
        },
        Part::ToolCall { id, name, .. } => Part::ToolCall {
            id: id.clone(),
            name: name.clone(),
            arguments: reference,
        },
        _ => Part::Text { text: reference },
    }
}

/// A context's stand-in for a part too large for it that has no file record (below the large-
/// file threshold, but larger than the budget allows): where the part lives, and how to reach it.
pub fn render_part_reference(message: MessageId, part: usize, tokens: u64, head: &str) -> String {
    format!(
        "<lcm_elided message=\"{message}\" part=\"{part}\" tokens=\"{tokens}\">\n{head}\n</lcm_elided>\n(Too large for this context; stored verbatim in {message}: lcm_describe {message}, or a sub-agent reads it with lcm_expand.)"
    )
}

/// A context's stand-in for raw messages it has no room for and no summary covers yet (the
/// budget's last resort, when compaction has not run or cannot keep up).
pub fn render_elided_span(
    session: SessionId,
    first: MessageId,
    last: MessageId,
    messages: u64,
    tokens: u64,
) -> String {
    format!(
        "<lcm_elided session=\"{session}\" from=\"{first}\" to=\"{last}\" messages=\"{messages}\" tokens=\"{tokens}\"/>\n(Older messages not shown: no room in this context and not summarised yet. lcm_grep finds anything in them; lcm_describe {first} starts reading.)"
    )
}

/// A context's stand-in for top-level summaries it has no room for: their ids and how many
/// messages they cover.
pub fn render_elided_summaries(summaries: &[SummaryId], messages: u64) -> String {
    let ids: Vec<String> = summaries.iter().map(SummaryId::to_string).collect();
    format!(
        "<lcm_elided summaries=\"{}\" messages=\"{messages}\"/>\n(Older summaries not shown: no room in this context. lcm_describe any of them reads it.)",
        ids.join(",")
    )
}

/// A context's stand-in for a node the agent set aside with `lcm_forget` (`what` says what
/// it is: "user message", "leaf summary over msg_1..msg_40"): its id and the tokens it holds.
pub fn render_forgotten(node: &str, what: &str, tokens: u64) -> String {
    format!(
        "<lcm_forgotten id=\"{node}\" tokens=\"{tokens}\">{what}</lcm_forgotten>\n(Set aside with lcm_forget; lcm_describe {node} reads it, lcm_forget with restore brings it back.)"
    )
}

/// A context's stand-in for the pinned messages it has no room for: their ids.
pub fn render_elided_pins(messages: &[MessageId], tokens: u64) -> String {
    let ids: Vec<String> = messages.iter().map(MessageId::to_string).collect();
    format!(
        "<lcm_elided pinned=\"{}\" tokens=\"{tokens}\"/>\n(Pinned messages not shown: no room in this context. lcm_describe any of them reads it.)",
        ids.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_calls_of_common_agents_give_their_path() {
        assert_eq!(
            read_call_path("Read", r#"{"file_path":"/src/main.rs","limit":20}"#).as_deref(),
            Some("/src/main.rs")
        );
        assert_eq!(
            read_call_path("read_file", r#"{"path":"a/b.csv"}"#).as_deref(),
            Some("a/b.csv")
        );
        assert_eq!(
            read_call_path("str_replace_editor", r#"{"command":"view","path":"/x.py"}"#).as_deref(),
            Some("/x.py")
        );
        assert_eq!(
            read_call_path("Bash", r#"{"command":"cat /var/log/app.log"}"#).as_deref(),
            Some("/var/log/app.log")
        );
        assert_eq!(
            read_call_path("Bash", r#"{"command":"cat 'my file.txt'"}"#).as_deref(),
            Some("my file.txt")
        );
    }

    #[test]
    fn other_calls_are_not_file_reads() {
        for (name, args) in [
            ("Write", r#"{"file_path":"/a"}"#),
            ("Edit", r#"{"file_path":"/a","old_string":"x"}"#),
            (
                "str_replace_editor",
                r#"{"command":"create","path":"/x.py"}"#,
            ),
            ("Bash", r#"{"command":"cat a b"}"#),
            ("Bash", r#"{"command":"cat a | grep x"}"#),
            ("Bash", r#"{"command":"cat -n a"}"#),
            ("Bash", r#"{"command":"ls"}"#),
            ("Read", "not json"),
            ("Read", r#"{"file_path":"  "}"#),
        ] {
            assert_eq!(read_call_path(name, args), None, "{name} {args}");
        }
    }

    #[test]
    fn a_reference_names_the_file_and_carries_its_exploration() {
        let file = FileInfo {
            id: FileId(3),
            session: SessionId(1),
            path: Some("/data/sales.csv".into()),
            kind: "csv".into(),
            mime_type: "text/csv".into(),
            language: None,
            byte_len: 1_000_000,
            token_count: 226_000,
            content_hash: "ab".repeat(32),
            content_message: Some(MessageId(42)),
            content_part: 0,
            exploration: "CSV, 12000 rows\ncolumns: id, price\n".into(),
            reference_tokens: 0,
            created_at: Timestamp(0),
        };
        let text = render_file_reference(&file);
        assert!(text.starts_with("<lcm_file id=\"file_3\" path=\"/data/sales.csv\" kind=\"csv\""));
        assert!(text.contains("tokens=\"226000\""));
        assert!(text.contains("CSV, 12000 rows\ncolumns: id, price\n</lcm_file>"));
        assert!(!text.contains("msg_42"), "a reference names no message");
    }
}
