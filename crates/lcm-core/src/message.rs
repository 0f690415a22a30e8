//! The conversation model: sessions, messages, and the typed parts a message is made of.
//!
//! A message keeps two views of itself: typed [`Part`]s, which the engine reads (search,
//! summarising, assembly), and its original payload ([`Original`]), kept verbatim so that the
//! exact message a host gave can be given back byte for byte. The typed view never replaces the
//! original; it is what the rest of lcm understands of it.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::ids::{MessageId, SessionId};
use crate::time::Timestamp;

/// Who said it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    /// Every role, in a fixed order (used for small numeric codes in the index).
    pub const ALL: [Role; 4] = [Role::System, Role::User, Role::Assistant, Role::Tool];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// A small stable number for this role (index fields, compact keys).
    pub fn code(self) -> u64 {
        match self {
            Role::System => 0,
            Role::User => 1,
            Role::Assistant => 2,
            Role::Tool => 3,
        }
    }

    /// Parses `system`, `user`, `assistant` or `tool` (any case).
    pub fn parse(input: &str) -> Option<Role> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str().eq_ignore_ascii_case(input.trim()))
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One typed piece of a message.
///
/// Binary payloads (images, documents as base64) are not copied here: a [`Part::Binary`] records
/// what it was and how big, and the bytes stay in the message's [`Original`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text the model sees.
    Text { text: String },
    /// Reasoning / thinking the model produced (stripped before summarising).
    Reasoning { text: String },
    /// A tool call: its id, the tool's name and the arguments as JSON text.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    /// The result of the tool call `call_id`.
    ToolResult {
        call_id: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
    /// A reference to a file on disk.
    File {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime_type: Option<String>,
    },
    /// An image or other binary payload; the bytes themselves live only in the original.
    Binary { media_type: String, byte_len: u64 },
    /// Anything else, kept as JSON so nothing is lost.
    Opaque { kind: String, json: String },
}

impl Part {
    /// The fields of this part that the searchable text holds ([`write_search_text`]).
    pub fn search_fields(&self) -> SearchFields<'_> {
        match self {
            Part::Text { text } | Part::Reasoning { text } => SearchFields::One(text),
            Part::ToolCall {
                name, arguments, ..
            } => SearchFields::Call { name, arguments },
            Part::ToolResult { content, .. } => SearchFields::One(content),
            Part::File { path, .. } => SearchFields::One(path),
            Part::Binary { .. } => SearchFields::None,
            Part::Opaque { json, .. } => SearchFields::One(json),
        }
    }

    /// The text of this part that search and summaries see, if it has any: its
    /// [`search_fields`](Self::search_fields) as the searchable text holds them.
    pub fn searchable_text(&self) -> Option<Cow<'_, str>> {
        match self.search_fields() {
            SearchFields::None => None,
            SearchFields::One(text) => Some(Cow::Borrowed(text)),
            SearchFields::Call { name, arguments } => {
                Some(Cow::Owned([name, CALL_SEPARATOR, arguments].concat()))
            }
        }
    }
}

/// What a part contributes to the searchable text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchFields<'a> {
    /// Nothing (binary payloads).
    None,
    /// One field as it is.
    One(&'a str),
    /// A tool call: its name and arguments, joined by [`CALL_SEPARATOR`].
    Call { name: &'a str, arguments: &'a str },
}

/// Joins the texts of a message's parts in its searchable text.
pub const PART_SEPARATOR: &str = "\n";
/// Joins a tool call's name and arguments in its searchable text.
pub const CALL_SEPARATOR: &str = " ";

/// Where [`write_search_text`] writes: a `String`, or the bytes of a record being encoded.
pub trait TextSink {
    fn push_text(&mut self, text: &str);
    /// Bytes written so far.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl TextSink for String {
    fn push_text(&mut self, text: &str) {
        self.push_str(text);
    }
    fn len(&self) -> usize {
        String::len(self)
    }
}

impl TextSink for Vec<u8> {
    fn push_text(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

/// Where one part's fields landed in a searchable text written by [`write_search_text`]
/// (byte ranges of the text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldSpans {
    None,
    One(std::ops::Range<usize>),
    Call {
        name: std::ops::Range<usize>,
        arguments: std::ops::Range<usize>,
    },
}

/// Appends the searchable text of `parts` to `out` and tells `placed` where each part's fields
/// landed (in order, one call per part, binary parts included).
///
/// This is the one definition of a message's searchable text: the texts of its parts in order,
/// joined by [`PART_SEPARATOR`], a tool call as its name and arguments joined by
/// [`CALL_SEPARATOR`], binary parts contributing nothing. The store keeps this text as one
/// contiguous blob of each message record, which the index tokenises, regex grep verifies
/// against and snippets are cut from, so the three can never disagree.
pub fn write_search_text<S: TextSink>(
    parts: &[Part],
    out: &mut S,
    mut placed: impl FnMut(FieldSpans),
) {
    let mut any = false;
    for part in parts {
        let fields = part.search_fields();
        if !matches!(fields, SearchFields::None) {
            if any {
                out.push_text(PART_SEPARATOR);
            }
            any = true;
        }
        let field = |out: &mut S, text: &str| {
            let from = out.len();
            out.push_text(text);
            from..out.len()
        };
        let spans = match fields {
            SearchFields::None => FieldSpans::None,
            SearchFields::One(text) => FieldSpans::One(field(out, text)),
            SearchFields::Call { name, arguments } => {
                let name = field(out, name);
                out.push_text(CALL_SEPARATOR);
                FieldSpans::Call {
                    name,
                    arguments: field(out, arguments),
                }
            }
        };
        placed(spans);
    }
}

/// The searchable text of a list of parts ([`write_search_text`]), borrowed when one part
/// holds all of it.
pub fn search_text(parts: &[Part]) -> Cow<'_, str> {
    let mut with_text = parts
        .iter()
        .filter(|p| !matches!(p.search_fields(), SearchFields::None));
    match (with_text.next(), with_text.next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(part), None) => match part.search_fields() {
            SearchFields::One(text) => Cow::Borrowed(text),
            _ => Cow::Owned(
                part.searchable_text()
                    .map(Cow::into_owned)
                    .unwrap_or_default(),
            ),
        },
        _ => {
            let mut joined = String::new();
            write_search_text(parts, &mut joined, |_| {});
            Cow::Owned(joined)
        }
    }
}

/// Which format a message's original payload is in.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// lcm's own JSONL message format (see `formats::lcm`).
    Lcm,
    /// One entry (line) of a Claude Code session transcript.
    ClaudeCode,
    /// One message of an OpenAI Chat Completions `messages` array.
    OpenAiChat,
}

impl SourceFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceFormat::Lcm => "lcm",
            SourceFormat::ClaudeCode => "claude_code",
            SourceFormat::OpenAiChat => "openai_chat",
        }
    }
}

/// A message's original payload, byte for byte as the host gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Original {
    pub format: SourceFormat,
    pub bytes: Vec<u8>,
}

/// A message to be stored: everything but what the store assigns (id, sequence, token count).
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    pub role: Role,
    pub parts: Vec<Part>,
    pub created_at: Timestamp,
    /// The payload as received. When `None`, the store keeps the message in lcm's own JSON
    /// format, so that every stored message has an original to give back.
    pub original: Option<Original>,
    /// A key unique within the session for the source entry (a transcript's uuid, say). Appending
    /// a message whose key is already stored in that session adds nothing: this is what makes
    /// imports idempotent.
    pub source_key: Option<String>,
}

impl NewMessage {
    /// A message with a single text part, created now.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        NewMessage {
            role,
            parts: vec![Part::Text { text: text.into() }],
            created_at: Timestamp::now(),
            original: None,
            source_key: None,
        }
    }

    /// The same message with a host key: appending a message whose key is already stored in
    /// the session adds nothing, which makes retries and re-imports idempotent.
    pub fn with_source_key(mut self, key: impl Into<String>) -> Self {
        self.source_key = Some(key.into());
        self
    }
}

/// A stored message, as read back from the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub id: MessageId,
    pub session: SessionId,
    /// Position in its session, from 0, without gaps.
    pub seq: u64,
    pub role: Role,
    pub created_at: Timestamp,
    /// Tokens counted once at ingest with the store's tokenizer (see [`crate::tokens`]).
    pub token_count: u32,
    pub parts: Vec<Part>,
    pub source: SourceFormat,
}

impl Message {
    /// See [`search_text`].
    pub fn search_text(&self) -> Cow<'_, str> {
        search_text(&self.parts)
    }
}

/// What the store knows about a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionInfo {
    pub id: SessionId,
    /// The host's name for the conversation (a transcript's session id, a daemon's key).
    pub key: String,
    pub created_at: Timestamp,
    /// The session that spawned this one (sub-agents), if any.
    pub parent: Option<SessionId>,
    pub message_count: u64,
    pub token_total: u64,
    pub first_message_at: Option<Timestamp>,
    pub last_message_at: Option<Timestamp>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_text_joins_parts_and_skips_binary() {
        let parts = vec![
            Part::Text {
                text: "hello".into(),
            },
            Part::Binary {
                media_type: "image/png".into(),
                byte_len: 10,
            },
            Part::ToolCall {
                id: "t1".into(),
                name: "Bash".into(),
                arguments: r#"{"command":"ls"}"#.into(),
            },
        ];
        assert_eq!(search_text(&parts), "hello\nBash {\"command\":\"ls\"}");
        assert!(matches!(search_text(&parts[..1]), Cow::Borrowed("hello")));
        assert_eq!(search_text(&[]), "");
    }

    #[test]
    fn parts_serialise_with_a_type_tag() {
        let part = Part::ToolResult {
            call_id: "t1".into(),
            content: "ok".into(),
            is_error: false,
        };
        let json = serde_json::to_string(&part).unwrap();
        assert_eq!(
            json,
            r#"{"type":"tool_result","call_id":"t1","content":"ok"}"#
        );
        assert_eq!(serde_json::from_str::<Part>(&json).unwrap(), part);
    }

    #[test]
    fn roles_parse_case_insensitively() {
        assert_eq!(Role::parse("Assistant"), Some(Role::Assistant));
        assert_eq!(Role::parse("robot"), None);
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
    }
}
