//! Which conversation a proxied request belongs to, and which of its messages are new.
//!
//! Clients of chat APIs resend the whole message list every turn. The proxy compares what a
//! request carries with what the session already holds and stores only the messages it has not
//! seen, so a conversation is stored once however often it is resent.
//!
//! Messages are compared by a [`fingerprint`] of their lcm form: the role and the parts, with
//! reasoning left out (clients often drop it when they send a turn back), texts trimmed and tool
//! arguments compared as canonical JSON (key order and spacing do not matter), so the answer the
//! proxy stored from the upstream matches the copy the client sends back next turn.
//!
//! [`already_stored`] finds the newest stored message that the request still carries (an
//! "anchor") and checks it against the messages before it; everything the request carries after
//! the anchor is new. It tolerates stored messages the client does not send back (an answer it
//! never received, a regenerated one) and a client that truncates its own list (dropping old
//! messages, even replacing them by a summary of its own).

use std::collections::HashMap;
use std::fmt::Write as _;

use lcm_core::formats::{LineContext, LineOutcome, ParseError, claude_code, openai};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::time::Timestamp;
use serde_json::Value;

use super::shape::Shape;

/// FNV-1a, 64 bits: a stable hash (the same in every process and version), for fingerprints
/// and session keys.
#[derive(Clone, Copy)]
pub(crate) struct Fnv(u64);

impl Fnv {
    pub(crate) fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// A string, length first (so that "ab" + "c" and "a" + "bc" differ).
    pub(crate) fn str(&mut self, text: &str) {
        self.u64(text.len() as u64);
        self.bytes(text.as_bytes());
    }

    pub(crate) fn u64(&mut self, value: u64) {
        self.bytes(&value.to_le_bytes());
    }

    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// The fingerprint of a message: equal for the copies of one message that the proxy stores and
/// that a client sends back (see the module documentation).
pub(crate) fn fingerprint(role: Role, parts: &[Part]) -> u64 {
    let mut h = Fnv::new();
    h.str(role.as_str());
    for part in parts {
        match part {
            Part::Reasoning { .. } => {}
            Part::Text { text } => {
                let text = text.trim();
                if !text.is_empty() {
                    h.str("text");
                    h.str(text);
                }
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                h.str("call");
                h.str(id);
                h.str(name);
                h.str(&canonical_json_text(arguments));
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                h.str("result");
                h.str(call_id);
                h.str(content.trim());
                h.u64(u64::from(*is_error));
            }
            Part::File { path, .. } => {
                h.str("file");
                h.str(path);
            }
            Part::Binary {
                media_type,
                byte_len,
            } => {
                h.str("binary");
                h.str(media_type);
                h.u64(*byte_len);
            }
            // Redacted thinking is reasoning too.
            Part::Opaque { kind, .. } if kind.contains("thinking") => {}
            Part::Opaque { kind, json } => {
                h.str("opaque");
                h.str(kind);
                h.str(&canonical_json_text(json));
            }
        }
    }
    h.finish()
}

/// JSON text with object keys sorted and no spaces; text that is not JSON, trimmed.
pub(crate) fn canonical_json_text(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(value) => canonical_json(&value),
        Err(_) => text.trim().to_owned(),
    }
}

/// `value` as JSON text with object keys sorted and no spaces.
pub(crate) fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// One message of a client's request (after the leading system messages).
#[derive(Debug, Clone)]
pub(crate) struct ClientMessage {
    /// The message as the client sent it.
    pub raw: Value,
    /// Its lcm form, `None` when it carries nothing to store (an empty text, no parts).
    pub parsed: Option<NewMessage>,
    /// [`fingerprint`] of `parsed`.
    pub fp: u64,
    /// It answers tool calls (an OpenAI `tool` message, an Anthropic user message with
    /// `tool_result` blocks): the client's messages are never sent from one of these on, since
    /// the calls it answers would be missing.
    pub answers_calls: bool,
}

/// Parses one message of a client's list (`raw_text` is its exact JSON text, `value` the same
/// parsed) into its lcm form; the error says what is wrong with it.
pub(crate) fn parse_client_message(
    shape: Shape,
    raw_text: &str,
    value: Value,
) -> Result<ClientMessage, String> {
    let outcome = match shape {
        Shape::OpenAi => openai::parse_line(raw_text.as_bytes(), &line_context()),
        Shape::Anthropic => {
            let role = match value.get("role").and_then(Value::as_str) {
                Some(role @ ("user" | "assistant")) => role,
                Some(other) => {
                    return Err(format!(
                        "`role` is `{other}`; Anthropic messages are `user` or `assistant` (the system prompt goes in `system`)"
                    ));
                }
                None => return Err("`role` is missing or not a string".into()),
            };
            // An Anthropic message is the `message` of a Claude Code transcript entry: parse it
            // as one, which keeps it verbatim inside the entry as the original.
            let entry = format!("{{\"type\":\"{role}\",\"message\":{raw_text}}}");
            claude_code::parse_line(entry.as_bytes(), &line_context())
        }
    }
    .map_err(|e| match e {
        ParseError::InvalidUtf8 { byte_offset, .. } => format!("invalid UTF-8 at byte {byte_offset}"),
        ParseError::MalformedJson { detail, .. } => format!("malformed JSON: {detail}"),
        ParseError::InvalidEntry { detail, .. } => detail,
    })?;
    let parsed = match outcome {
        LineOutcome::Messages(mut found) if found.len() == 1 => {
            let mut message = found.remove(0).message;
            message.created_at = Timestamp::now();
            message.source_key = None;
            Some(message)
        }
        LineOutcome::Messages(_) => return Err("not one message".into()),
        LineOutcome::Skipped { .. } => None,
    };
    let fp = parsed.as_ref().map_or(0, |m| fingerprint(m.role, &m.parts));
    let answers_calls = match shape {
        Shape::OpenAi => matches!(
            value.get("role").and_then(Value::as_str),
            Some("tool" | "function")
        ),
        Shape::Anthropic => value
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| {
                blocks
                    .iter()
                    .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            }),
    };
    Ok(ClientMessage {
        raw: value,
        parsed,
        fp,
        answers_calls,
    })
}

fn line_context() -> LineContext<'static> {
    LineContext {
        line: 1,
        default_session_key: "proxy",
    }
}

/// The text of a system prompt, for the session key: a string, or the `text` of its parts or
/// blocks (so that `cache_control` markers moving between turns do not change it).
pub(crate) fn prompt_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(items) => items
            .iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text.as_str()),
                other => other.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Object(_) => value
            .get("content")
            .map(prompt_text)
            .or_else(|| value.get("text").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The session key of a conversation identified by its prefix: the system prompt's text and the
/// first user message (the first message when there is no user message).
pub(crate) fn derived_key(shape: Shape, system: &str, messages: &[ClientMessage]) -> String {
    let first = messages
        .iter()
        .filter_map(|m| m.parsed.as_ref().map(|p| (p.role, m.fp)))
        .find(|(role, _)| *role == Role::User)
        .or_else(|| {
            messages
                .iter()
                .find_map(|m| m.parsed.as_ref().map(|p| (p.role, m.fp)))
        })
        .map_or(0, |(_, fp)| fp);
    let mut h = Fnv::new();
    h.str("lcm-proxy/1");
    h.str(shape.name());
    h.str(system.trim());
    h.u64(first);
    format!("proxy:{}:{:016x}", shape.name(), h.finish())
}

/// A hash of the whole request's messages: identical requests (a retry) give identical source
/// keys, so the store adds nothing the second time.
pub(crate) fn request_fingerprint(shape: Shape, messages: &[ClientMessage]) -> u64 {
    let mut h = Fnv::new();
    h.str(shape.name());
    for m in messages.iter().filter(|m| m.parsed.is_some()) {
        h.u64(m.fp);
    }
    h.finish()
}

/// The source key of the `index`-th message of a request with fingerprint `request`.
pub(crate) fn message_key(request: u64, index: usize) -> String {
    let mut key = String::with_capacity(32);
    let _ = write!(key, "px:{request:016x}:{index}");
    key
}

/// The source key of the answer `answer` (its fingerprint) to a request.
pub(crate) fn answer_key(request: u64, answer: u64) -> String {
    format!("px:{request:016x}:answer:{answer:016x}")
}

/// Stored positions (from the newest) tried as the anchor: stored messages the client may not
/// send back (answers it did not get, regenerated ones).
const ANCHOR_SLACK: usize = 16;
/// Stored messages the client does not send back that may sit between two it does.
const GAP: usize = 8;
/// Messages matched in order that confirm an anchor.
const EVIDENCE: usize = 4;
/// Candidate positions in the request tried per anchor.
const MAX_CANDIDATES: usize = 16;
/// Leading messages of a request the session may not hold (a client's own summary of what it
/// truncated).
const UNKNOWN_LEAD: usize = 2;

/// How many stored messages [`already_stored`] may look at: the newest this many.
pub(crate) const STORED_WINDOW: usize = ANCHOR_SLACK + (EVIDENCE + 1) * (GAP + 1) + 16;

/// How many of `sent` (a request's fingerprints, oldest first) the session already holds, given
/// `stored` (the fingerprints of its newest messages, oldest first): the new messages are
/// `sent[k..]`.
pub(crate) fn already_stored(stored: &[u64], sent: &[u64]) -> usize {
    let mut positions: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, fp) in sent.iter().enumerate() {
        positions.entry(*fp).or_default().push(i);
    }
    let newest = stored.len();
    for j in (newest.saturating_sub(ANCHOR_SLACK)..newest).rev() {
        let Some(candidates) = positions.get(&stored[j]) else {
            continue;
        };
        for &i in candidates.iter().rev().take(MAX_CANDIDATES) {
            if confirms(stored, sent, i, j) {
                return i + 1;
            }
        }
    }
    0
}

/// Whether `sent[i]` being `stored[j]` is consistent with the messages before them.
fn confirms(stored: &[u64], sent: &[u64], i: usize, j: usize) -> bool {
    let mut matched = 1;
    let (mut a, mut b) = (i, j);
    loop {
        if a == 0 || b == 0 || matched >= EVIDENCE {
            return true;
        }
        let want = sent[a - 1];
        if stored[b - 1] == want {
            matched += 1;
            a -= 1;
            b -= 1;
            continue;
        }
        // Stored messages the client does not send back: skip a few.
        let lowest = (b - 1).saturating_sub(GAP);
        match (lowest..b - 1).rev().find(|&x| stored[x] == want) {
            Some(x) => b = x + 1,
            // The client's first messages may be its own (a summary of what it dropped).
            None => return a <= UNKNOWN_LEAD,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fps(text: &str) -> Vec<u64> {
        text.bytes().map(u64::from).collect()
    }

    fn new_part(stored: &str, sent: &str) -> String {
        let k = already_stored(&fps(stored), &fps(sent));
        sent[k..].to_owned()
    }

    #[test]
    fn only_the_unseen_suffix_is_new() {
        // First turn, a full resend, a retry, a regenerated answer.
        assert_eq!(new_part("", "u"), "u");
        assert_eq!(new_part("ua", "uav"), "v");
        assert_eq!(new_part("uav", "uav"), "");
        assert_eq!(new_part("uavb", "uav"), "");
        // Repeated identical turns ("continue" / "ok").
        assert_eq!(new_part("cococo", "cococoX"), "X");
        assert_eq!(new_part("cococo", "cocococ"), "c");
        // The client changed an answer when sending it back: its copy was stored as new once,
        // and later turns align across the proxy's own copy.
        assert_eq!(new_part("uaAvb", "uAvbw"), "w");
        // The client truncated its list, possibly starting with a summary of its own.
        assert_eq!(new_part("abcdefghij", "fghijK"), "K");
        assert_eq!(new_part("abcdefghij", "SfghijK"), "K");
        assert_eq!(new_part("abcdefghij", "SjK"), "K");
        // A new message equal to an old one is still new.
        assert_eq!(new_part("xyzwvq", "xyzwvqx"), "x");
        // A different conversation under the same key: everything is new.
        assert_eq!(new_part("abcdef", "PQRS"), "PQRS");
        // The session holds only the end of what the client sends.
        assert_eq!(new_part("defg", "abcdefgH"), "H");
    }

    #[test]
    fn fingerprints_ignore_reasoning_spacing_and_key_order() {
        let call = |args: &str| Part::ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: args.into(),
        };
        let a = fingerprint(
            Role::Assistant,
            &[
                Part::Reasoning { text: "hm".into() },
                Part::Text {
                    text: " hello\n".into(),
                },
                call(r#"{"b": 1, "a": [1, 2.50]}"#),
            ],
        );
        let b = fingerprint(
            Role::Assistant,
            &[
                Part::Text {
                    text: "hello".into(),
                },
                call(r#"{"a":[1,2.5],"b":1}"#),
            ],
        );
        assert_eq!(a, b);
        let c = fingerprint(
            Role::User,
            &[
                Part::Text {
                    text: "hello".into(),
                },
                call(r#"{"a":[1,2.5],"b":1}"#),
            ],
        );
        assert_ne!(a, c);
    }

    #[test]
    fn messages_parse_in_both_shapes() {
        let text = r#"{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}"#;
        let m = parse_client_message(Shape::Anthropic, text, serde_json::from_str(text).unwrap())
            .unwrap();
        let parsed = m.parsed.unwrap();
        assert_eq!(parsed.role, Role::User);
        assert_eq!(parsed.parts, vec![Part::Text { text: "hi".into() }]);
        assert!(!m.answers_calls);
        let original = String::from_utf8(parsed.original.unwrap().bytes).unwrap();
        assert!(original.contains(text), "{original}");

        let text = r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"}]}"#;
        let m = parse_client_message(Shape::Anthropic, text, serde_json::from_str(text).unwrap())
            .unwrap();
        assert!(m.answers_calls);
        assert_eq!(m.parsed.unwrap().role, Role::Tool);

        let text = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}],"refusal":null}"#;
        let m =
            parse_client_message(Shape::OpenAi, text, serde_json::from_str(text).unwrap()).unwrap();
        let parsed = m.parsed.unwrap();
        assert_eq!(parsed.role, Role::Assistant);
        assert_eq!(parsed.original.unwrap().bytes, text.as_bytes());

        let empty = r#"{"role":"assistant","content":""}"#;
        let m = parse_client_message(Shape::OpenAi, empty, serde_json::from_str(empty).unwrap())
            .unwrap();
        assert!(m.parsed.is_none());

        let bad = r#"{"role":"robot","content":"x"}"#;
        assert!(
            parse_client_message(Shape::OpenAi, bad, serde_json::from_str(bad).unwrap()).is_err()
        );
        assert!(
            parse_client_message(Shape::Anthropic, bad, serde_json::from_str(bad).unwrap())
                .unwrap_err()
                .contains("robot")
        );
    }
}
