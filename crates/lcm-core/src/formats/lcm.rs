//! lcm's own JSONL message format: one message a line.
//!
//! ```text
//! {"session":"ses_3","role":"user","created_at":"2026-02-10T21:11:56.846Z","key":"u-1","parts":[{"type":"text","text":"hi"}]}
//! {"role":"assistant","content":"hello"}
//! ```
//!
//! Fields:
//! - `role` (required): `system`, `user`, `assistant` or `tool`;
//! - `parts`: the message's [`Part`]s as serde writes them, tagged by `type`:
//!   `{"type":"text","text":..}`, `{"type":"reasoning","text":..}`,
//!   `{"type":"tool_call","id":..,"name":..,"arguments":..}`,
//!   `{"type":"tool_result","call_id":..,"content":..,"is_error"?:true}`,
//!   `{"type":"file","path":..,"mime_type"?:..}`, `{"type":"binary","media_type":..,"byte_len":..}`,
//!   `{"type":"opaque","kind":..,"json":..}`;
//! - `content`: shorthand for `"parts":[{"type":"text","text":content}]` (exactly one of `parts`
//!   and `content` must be given; `"parts":[]` is a message without parts);
//! - `session` (optional): the session key; without it, the importer's default
//!   (`LineContext::default_session_key`);
//! - `created_at` (optional): RFC 3339 (`2026-02-10T21:11:56.846Z`), a date (`2026-02-10`), or
//!   milliseconds since the epoch as a number; without it, the epoch;
//! - `key` (optional): the message's source key, unique within its session (re-importing a line
//!   whose key is already stored adds nothing); without it, `line:{n}`.
//!
//! Any other field is an error, so that a typo is never silently dropped. [`to_line`] writes
//! this format (always with `session`, `role`, `created_at` and `parts`), and [`parse_line`]
//! gives back what it wrote.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::raw;
use super::{LineContext, LineOutcome, ParseError, ParsedMessage, utf8_line};
use crate::message::{NewMessage, Original, Part, Role, SourceFormat};
use crate::time::Timestamp;

/// One line of the format, as read.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    #[serde(default)]
    session: Option<String>,
    role: Role,
    #[serde(default)]
    created_at: Option<Value>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    parts: Option<Vec<Part>>,
    #[serde(default)]
    content: Option<String>,
}

/// One line of the format, as written.
#[derive(Serialize)]
struct EntryOut<'a> {
    session: &'a str,
    role: Role,
    created_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    parts: &'a [Part],
}

/// The fields of [`Entry`], for error messages.
const FIELDS: [&str; 6] = ["session", "role", "created_at", "key", "parts", "content"];

/// Parses one message in lcm's format sent live (the HTTP API, MCP) rather than imported: the
/// importer's rules and error messages, except that a message without `key` gets no source key
/// (sent twice, it is stored twice) and one without `created_at` is dated now.
/// `default_session_key` is the session a message without `session` belongs to.
pub fn parse_live_message(text: &str, default_session_key: &str) -> Result<NewMessage, String> {
    /// The fields whose absence is treated differently from the importer (null counts as
    /// absent).
    #[derive(Deserialize)]
    struct Given {
        #[serde(default)]
        key: Option<Value>,
        #[serde(default)]
        created_at: Option<Value>,
    }
    let ctx = LineContext {
        line: 1,
        default_session_key,
    };
    let outcome = parse_line(text.as_bytes(), &ctx).map_err(|e| match e {
        ParseError::InvalidUtf8 { byte_offset, .. } => {
            format!("invalid UTF-8 at byte {byte_offset}")
        }
        ParseError::MalformedJson { detail, .. } => format!("malformed JSON: {detail}"),
        ParseError::InvalidEntry { detail, .. } => detail,
    })?;
    let mut message = match outcome {
        LineOutcome::Messages(mut found) if found.len() == 1 => found.remove(0).message,
        _ => return Err("not a message".into()),
    };
    let given: Given = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if given.key.is_none() {
        message.source_key = None;
    }
    if given.created_at.is_none() {
        message.created_at = Timestamp::now();
    }
    Ok(message)
}

/// Parses one line of lcm's JSONL format.
pub fn parse_line(bytes: &[u8], ctx: &LineContext<'_>) -> Result<LineOutcome, ParseError> {
    let line = ctx.line;
    let text = utf8_line(bytes, line)?;
    let entry: Entry = match serde_json::from_str(text) {
        Ok(entry) => entry,
        Err(e) if e.is_data() => return Err(raw::invalid(line, explain(text, e))),
        Err(e) => {
            return Err(ParseError::MalformedJson {
                line,
                detail: e.to_string(),
            });
        }
    };
    let parts = match (entry.parts, entry.content) {
        (Some(parts), None) => parts,
        (None, Some(text)) => vec![Part::Text { text }],
        (Some(_), Some(_)) => {
            return Err(raw::invalid(
                line,
                "`parts` and `content` are exclusive: give one of them",
            ));
        }
        (None, None) => {
            return Err(raw::invalid(
                line,
                "an lcm message needs `parts` (a list of parts) or `content` (a text)",
            ));
        }
    };
    let created_at = match entry.created_at {
        None | Some(Value::Null) => Timestamp(0),
        Some(value) => timestamp(&value).ok_or_else(|| {
            raw::invalid(
                line,
                format!(
                    "`created_at` {value} is not a timestamp: expected RFC 3339 \
                     (2026-02-10T21:11:56.846Z), a date (2026-02-10) or milliseconds since the \
                     epoch"
                ),
            )
        })?,
    };
    Ok(LineOutcome::Messages(vec![ParsedMessage {
        session_key: entry
            .session
            .unwrap_or_else(|| ctx.default_session_key.to_owned()),
        parent_session_key: None,
        message: NewMessage {
            role: entry.role,
            parts,
            created_at,
            original: Some(Original {
                format: SourceFormat::Lcm,
                bytes: bytes.to_vec(),
            }),
            source_key: Some(entry.key.unwrap_or_else(|| format!("line:{line}"))),
        },
    }]))
}

/// `created_at` as text (`Timestamp::parse`, which reads every form `Timestamp` displays) or
/// as a number of milliseconds.
fn timestamp(value: &Value) -> Option<Timestamp> {
    match value {
        Value::String(text) => Timestamp::parse(text).ok(),
        Value::Number(n) => n.as_i64().map(Timestamp),
        _ => None,
    }
}

/// Names the field behind a serde data error (serde's own message rarely does).
fn explain(text: &str, error: serde_json::Error) -> String {
    let fields = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(fields)) => fields,
        Ok(other) => {
            return format!(
                "an lcm line must be a JSON object, found {}",
                raw::value_kind(&other).described()
            );
        }
        Err(_) => return format!("invalid lcm message: {error}"),
    };
    for (name, value) in &fields {
        let problem = match name.as_str() {
            "session" | "key" | "content" => check::<Option<String>>(value),
            "role" => check::<Role>(value),
            "parts" => match value {
                Value::Array(items) => {
                    let bad = items
                        .iter()
                        .enumerate()
                        .find_map(|(i, item)| Some((i, check::<Part>(item)?)));
                    if let Some((i, problem)) = bad {
                        return format!("`parts[{i}]` {problem}");
                    }
                    None
                }
                other => check::<Vec<Part>>(other),
            },
            "created_at" => None,
            _ => Some(format!(
                "is not a field of an lcm message (expected one of {})",
                FIELDS.join(", ")
            )),
        };
        if let Some(problem) = problem {
            return format!("`{name}` {problem}");
        }
    }
    if !fields.contains_key("role") {
        return "`role` is missing".to_owned();
    }
    format!("invalid lcm message: {error}")
}

/// Why `value` is not a `T`, if it is not.
fn check<T: serde::de::DeserializeOwned>(value: &Value) -> Option<String> {
    T::deserialize(value)
        .err()
        .map(|e| format!("is invalid: {e}"))
}

/// Writes `msg` as one line of lcm's format (without a trailing newline). `session_key` becomes
/// the line's `session`; `parse_line` gives back the same role, parts, time and source key
/// (a message without a source key gets `line:{n}` when read back).
pub fn to_line(session_key: &str, msg: &NewMessage) -> String {
    let entry = EntryOut {
        session: session_key,
        role: msg.role,
        created_at: msg.created_at,
        key: msg.source_key.as_deref(),
        parts: &msg.parts,
    };
    match serde_json::to_string(&entry) {
        Ok(line) => line,
        // Serialising strings, enums and timestamps cannot fail; should it ever, the line stays
        // valid and says what happened instead of panicking.
        Err(e) => format!(
            r#"{{"session":{},"role":"{}","parts":[{{"type":"opaque","kind":"lcm_serialisation_error","json":{}}}]}}"#,
            Value::from(session_key),
            msg.role.as_str(),
            Value::from(e.to_string()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(line: u64) -> LineContext<'static> {
        LineContext {
            line,
            default_session_key: "default",
        }
    }

    fn one(text: &str, line: u64) -> ParsedMessage {
        match parse_line(text.as_bytes(), &ctx(line)).unwrap() {
            LineOutcome::Messages(mut found) => {
                assert_eq!(found.len(), 1);
                found.remove(0)
            }
            other => panic!("expected a message, got {other:?}"),
        }
    }

    fn every_part() -> Vec<Part> {
        vec![
            Part::Text {
                text: "\n\n".into(),
            },
            Part::Text {
                text: "esc \u{1b}[1m \"q\" \\ é 漢字 🎉 \u{0}".into(),
            },
            Part::Reasoning { text: "hmm".into() },
            Part::ToolCall {
                id: "t1".into(),
                name: "Bash".into(),
                arguments: r#"{"command":"ls"}"#.into(),
            },
            Part::ToolResult {
                call_id: "t1".into(),
                content: "a\nb".into(),
                is_error: true,
            },
            Part::ToolResult {
                call_id: "t2".into(),
                content: String::new(),
                is_error: false,
            },
            Part::File {
                path: "/tmp/x.rs".into(),
                mime_type: Some("text/x-rust".into()),
            },
            Part::File {
                path: "y".into(),
                mime_type: None,
            },
            Part::Binary {
                media_type: "image/png".into(),
                byte_len: 1234,
            },
            Part::Opaque {
                kind: "video".into(),
                json: r#"{"type":"video"}"#.into(),
            },
        ]
    }

    #[test]
    fn to_line_round_trips() {
        for (role, created_at) in [
            (
                Role::User,
                Timestamp::parse("2026-02-10T21:11:56.846Z").unwrap(),
            ),
            (Role::Tool, Timestamp(0)),
            (Role::System, Timestamp(-5)),
            (Role::Assistant, Timestamp(i64::MAX)),
            // Found by fuzzing: after year 9999 the line said `+10000-01-01T00:00:00.000Z`,
            // which did not read back.
            (Role::User, Timestamp(253_402_300_800_000)),
            (Role::User, Timestamp(-62_167_219_200_001)),
        ] {
            let msg = NewMessage {
                role,
                parts: every_part(),
                created_at,
                original: None,
                source_key: Some("u-1".into()),
            };
            let line = to_line("ses_3", &msg);
            assert!(!line.contains('\n'));
            let parsed = one(&line, 4);
            assert_eq!(parsed.session_key, "ses_3");
            let back = parsed.message;
            assert_eq!(back.role, msg.role);
            assert_eq!(back.parts, msg.parts);
            assert_eq!(back.created_at, msg.created_at, "{line}");
            assert_eq!(back.source_key, msg.source_key);
            let original = back.original.unwrap();
            assert_eq!(original.format, SourceFormat::Lcm);
            assert_eq!(original.bytes, line.as_bytes());
        }
    }

    #[test]
    fn to_line_writes_the_documented_shape() {
        let msg = NewMessage {
            role: Role::User,
            parts: vec![Part::Text { text: "hi".into() }],
            created_at: Timestamp::parse("2026-02-10T21:11:56.846Z").unwrap(),
            original: None,
            source_key: None,
        };
        assert_eq!(
            to_line("s", &msg),
            r#"{"session":"s","role":"user","created_at":"2026-02-10T21:11:56.846Z","parts":[{"type":"text","text":"hi"}]}"#
        );
        // Without a key, the line number is the source key.
        let parsed = one(&to_line("s", &msg), 9);
        assert_eq!(parsed.message.source_key.as_deref(), Some("line:9"));
        // An empty message survives the round trip.
        let empty = NewMessage {
            parts: Vec::new(),
            ..msg
        };
        assert_eq!(one(&to_line("s", &empty), 1).message.parts, Vec::new());
    }

    #[test]
    fn content_shorthand_and_defaults() {
        let line = r#"{"role":"assistant","content":"hello\n\n"}"#;
        let parsed = one(line, 2);
        assert_eq!(parsed.session_key, "default");
        assert_eq!(
            parsed.message.parts,
            vec![Part::Text {
                text: "hello\n\n".into()
            }]
        );
        assert_eq!(parsed.message.created_at, Timestamp(0));
        assert_eq!(parsed.message.source_key.as_deref(), Some("line:2"));
        assert_eq!(parsed.message.original.unwrap().bytes, line.as_bytes());

        let dated = one(
            r#"{"role":"user","content":"x","created_at":1770757916846}"#,
            1,
        );
        assert_eq!(
            dated.message.created_at,
            Timestamp::parse("2026-02-10T21:11:56.846Z").unwrap()
        );
        let day = one(
            r#"{"role":"user","content":"x","created_at":"2026-02-10"}"#,
            1,
        );
        assert_eq!(
            day.message.created_at,
            Timestamp::parse("2026-02-10T00:00:00Z").unwrap()
        );
    }

    #[test]
    fn bad_lines_are_reported() {
        let err = parse_line(b"{\"role\":\"user\",\"content\":\"\xff\xfe\"}", &ctx(3)).unwrap_err();
        assert_eq!(
            err,
            ParseError::InvalidUtf8 {
                line: 3,
                byte_offset: 26
            }
        );
        let err = parse_line(br#"{"role":"user","con"#, &ctx(3)).unwrap_err();
        assert!(
            matches!(err, ParseError::MalformedJson { line: 3, .. }),
            "{err}"
        );
        assert!(
            err.to_string().starts_with("line 3: malformed JSON"),
            "{err}"
        );

        let cases = [
            ("42", "an lcm line must be a JSON object, found a number"),
            ("[]", "an lcm line must be a JSON object, found an array"),
            (r#"{"content":"x"}"#, "`role` is missing"),
            (
                r#"{"role":"robot","content":"x"}"#,
                "`role` is invalid: unknown variant `robot`",
            ),
            (
                r#"{"role":"user","content":5}"#,
                "`content` is invalid: invalid type: integer `5`",
            ),
            (
                r#"{"role":"user","session":true,"content":"x"}"#,
                "`session` is invalid",
            ),
            (r#"{"role":"user","parts":"x"}"#, "`parts` is invalid"),
            (
                r#"{"role":"user","parts":[{"type":"text","text":"a"},{"type":"video"}]}"#,
                "`parts[1]` is invalid: unknown variant `video`",
            ),
            (
                r#"{"role":"user","parts":[{"type":"text"}]}"#,
                "`parts[0]` is invalid: missing field `text`",
            ),
            (
                r#"{"role":"user","content":"x","colour":"red"}"#,
                "`colour` is not a field of an lcm message",
            ),
            (
                r#"{"role":"user","content":"x","created_at":"yesterday"}"#,
                "`created_at` \"yesterday\" is not a timestamp",
            ),
            (r#"{"role":"user"}"#, "needs `parts`"),
            (r#"{"role":"user","content":"x","parts":[]}"#, "exclusive"),
        ];
        for (line, expected) in cases {
            let err = parse_line(line.as_bytes(), &ctx(7)).unwrap_err();
            assert!(
                matches!(err, ParseError::InvalidEntry { line: 7, .. }),
                "{line}: {err}"
            );
            let text = err.to_string();
            assert!(text.starts_with("line 7: "), "{text}");
            assert!(
                text.contains(expected),
                "{line}: `{text}` lacks `{expected}`"
            );
        }
    }
}
