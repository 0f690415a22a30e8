//! OpenAI Chat Completions messages.
//!
//! Accepted inputs:
//! - JSONL ([`parse_line`]) where each line is one message (`{"role": ..., "content": ...}`, in
//!   the session `ctx.default_session_key`, source key `line:{n}`), or one conversation
//!   (`{"messages": [...], "id"?: ...}` or a bare array of messages, in the session
//!   `{default_session_key}#{id}` (the line number when there is no `id`), source keys
//!   `{line}:{message_index}`);
//! - a JSON document ([`parse_document`]): an array of messages or `{"messages": [...]}` (one
//!   conversation in the session `default_session_key`, source keys `0:{message_index}`), or an
//!   array of `{"messages": [...]}` conversations (sessions `{default_session_key}#{id}`, the
//!   conversation's index when it has no `id`; source keys `{conversation_index}:{message_index}`).
//!
//! Roles: `system` and `developer` -> [`Role::System`], `user`, `assistant`, and `tool` and
//! (legacy) `function` -> [`Role::Tool`].
//!
//! Parts, in this order: `reasoning_content` / `reasoning` (strings) -> [`Part::Reasoning`];
//! `content` as a string -> [`Part::Text`], or as a list of parts: `text` and `refusal` ->
//! [`Part::Text`], `image_url` -> [`Part::Binary`] (the media type and decoded size of a
//! `data:` URL; `image/url` and the URL's length for a link), `input_audio` -> [`Part::Binary`]
//! (`audio/{format}`), `file` with inline `file_data` -> [`Part::Binary`], anything else ->
//! [`Part::Opaque`]; `refusal` -> [`Part::Text`]; `tool_calls` -> [`Part::ToolCall`] with the
//! `arguments` string verbatim (legacy `function_call` too, its id being the function's name).
//! A `tool` message is one [`Part::ToolResult`] for its `tool_call_id` (a `function` message's
//! `name`), whose content is the text of `content` (text parts joined with `\n`; other parts
//! follow as their own parts). Empty texts add no part; a message without any part is skipped.
//!
//! Chat Completions messages carry no time: every message is dated at the epoch
//! (`Timestamp(0)`), never at the time of import, so that importing the same file twice gives
//! the same messages.

use serde_json::value::RawValue;

use super::raw::{self, Kind, Obj};
use super::{LineContext, LineOutcome, ParseError, ParsedMessage, SkipReason, utf8_line};
use crate::message::{NewMessage, Original, Part, Role, SourceFormat};
use crate::time::Timestamp;

/// Parses one line of an OpenAI JSONL file: a message, or a conversation of many.
pub fn parse_line(bytes: &[u8], ctx: &LineContext<'_>) -> Result<LineOutcome, ParseError> {
    let line = ctx.line;
    let text = utf8_line(bytes, line)?;
    let root = raw::raw_line(text, line)?;
    let conversation = match raw::kind(root) {
        Kind::Array => Conversation {
            session_key: format!("{}#{line}", ctx.default_session_key),
            messages: raw::as_array(root).unwrap_or_default(),
            path: String::new(),
        },
        Kind::Object => {
            let entry = Obj::parse(root, String::new(), line, "an OpenAI message")?;
            if entry.has("messages") && !entry.has("role") {
                let id = conversation_id(&entry)?.unwrap_or_else(|| line.to_string());
                Conversation {
                    session_key: format!("{}#{id}", ctx.default_session_key),
                    messages: required_messages(&entry)?,
                    path: "messages".to_owned(),
                }
            } else {
                // One message: its original is the whole line, byte for byte.
                let Some((role, parts)) = message(&entry)? else {
                    return Ok(LineOutcome::Skipped {
                        reason: SkipReason::Empty,
                    });
                };
                return Ok(LineOutcome::Messages(vec![parsed(
                    ctx.default_session_key.to_owned(),
                    role,
                    parts,
                    bytes.to_vec(),
                    format!("line:{line}"),
                )]));
            }
        }
        other => {
            return Err(raw::invalid(
                line,
                format!(
                    "an OpenAI line must be a message, a {{\"messages\": [...]}} conversation or \
                     an array of messages, found {}",
                    other.described()
                ),
            ));
        }
    };
    // In a conversation line each message's original is its own text within the line, byte
    // for byte (not the whole conversation once per message).
    let messages =
        conversation.parse(&line.to_string(), |_| line, |m| m.get().as_bytes().to_vec())?;
    Ok(if messages.is_empty() {
        LineOutcome::Skipped {
            reason: SkipReason::Empty,
        }
    } else {
        LineOutcome::Messages(messages)
    })
}

/// Parses a whole JSON document: an array of messages, `{"messages": [...]}`, or an array of
/// such conversations (see the [module docs](self) for session and source keys).
///
/// Errors name the line of the document where the problem is: where serde_json found malformed
/// JSON, or where the offending message starts. Messages with no content are left out.
///
/// Each message's original is the text of its element in the document with the whitespace
/// between tokens removed (so that it fits on one line): key order, number spelling and string
/// escapes are kept, but a pretty-printed document cannot be given back byte for byte, only
/// message by message in this compact form.
pub fn parse_document(
    bytes: &[u8],
    default_session_key: &str,
) -> Result<Vec<ParsedMessage>, ParseError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let valid = bytes.get(..e.valid_up_to()).unwrap_or_default();
        let line_start = valid.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        ParseError::InvalidUtf8 {
            line: 1 + valid.iter().filter(|&&b| b == b'\n').count() as u64,
            byte_offset: e.valid_up_to() - line_start,
        }
    })?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let root = serde_json::from_str::<&RawValue>(text).map_err(|e| ParseError::MalformedJson {
        line: e.line().max(1) as u64,
        detail: e.to_string(),
    })?;
    let line_of = |raw: &RawValue| raw::line_of(text, raw.get());
    let original = |raw: &RawValue| raw::compact(raw).into_bytes();
    match raw::kind(root) {
        Kind::Object => {
            let document = Obj::parse(root, String::new(), 1, "an OpenAI document")?;
            if !document.has("messages") {
                return Err(document.error(
                    "messages",
                    "is missing: expected an array of messages or {\"messages\": [...]}",
                ));
            }
            let conversation = Conversation {
                session_key: default_session_key.to_owned(),
                messages: required_messages(&document)?,
                path: "messages".to_owned(),
            };
            conversation.parse("0", line_of, original)
        }
        Kind::Array => {
            let elements = raw::as_array(root).unwrap_or_default();
            let conversations = !elements.is_empty()
                && elements.iter().all(|e| {
                    Obj::parse(e, String::new(), 1, "")
                        .is_ok_and(|o| o.has("messages") && !o.has("role"))
                });
            if !conversations {
                let conversation = Conversation {
                    session_key: default_session_key.to_owned(),
                    messages: elements,
                    path: String::new(),
                };
                return conversation.parse("0", line_of, original);
            }
            let mut all = Vec::new();
            for (index, element) in elements.into_iter().enumerate() {
                let path = format!("[{index}]");
                let what = format!("`{path}`");
                let entry = Obj::parse(element, path.clone(), line_of(element), &what)?;
                let id = conversation_id(&entry)?.unwrap_or_else(|| index.to_string());
                let conversation = Conversation {
                    session_key: format!("{default_session_key}#{id}"),
                    messages: required_messages(&entry)?,
                    path: format!("{path}.messages"),
                };
                all.extend(conversation.parse(&index.to_string(), line_of, original)?);
            }
            Ok(all)
        }
        other => Err(raw::invalid(
            1,
            format!(
                "an OpenAI document must be an array of messages or {{\"messages\": [...]}}, \
                 found {}",
                other.described()
            ),
        )),
    }
}

/// A conversation's messages, before parsing.
struct Conversation<'a> {
    session_key: String,
    messages: Vec<&'a RawValue>,
    /// Where the messages are, for errors (`messages`, `[2].messages`, or `` for a bare array).
    path: String,
}

impl<'a> Conversation<'a> {
    /// Parses every message; source keys are `{prefix}:{index}`.
    fn parse(
        self,
        prefix: &str,
        line_of: impl Fn(&RawValue) -> u64,
        original: impl Fn(&RawValue) -> Vec<u8>,
    ) -> Result<Vec<ParsedMessage>, ParseError> {
        let mut out = Vec::with_capacity(self.messages.len());
        for (index, raw) in self.messages.into_iter().enumerate() {
            let path = format!("{}[{index}]", self.path);
            let what = format!("`{path}`");
            let entry = Obj::parse(raw, path, line_of(raw), &what)?;
            if let Some((role, parts)) = message(&entry)? {
                out.push(parsed(
                    self.session_key.clone(),
                    role,
                    parts,
                    original(raw),
                    format!("{prefix}:{index}"),
                ));
            }
        }
        Ok(out)
    }
}

fn parsed(
    session_key: String,
    role: Role,
    parts: Vec<Part>,
    original: Vec<u8>,
    source_key: String,
) -> ParsedMessage {
    ParsedMessage {
        session_key,
        parent_session_key: None,
        message: NewMessage {
            role,
            parts,
            // Chat Completions messages carry no time: the epoch keeps re-imports identical.
            created_at: Timestamp(0),
            original: Some(Original {
                format: SourceFormat::OpenAiChat,
                bytes: original,
            }),
            source_key: Some(source_key),
        },
    }
}

/// A conversation's `id` (a string, or a number as written), if it has one.
fn conversation_id(entry: &Obj<'_>) -> Result<Option<String>, ParseError> {
    match entry.get("id") {
        None => Ok(None),
        Some(id) => match raw::kind(id) {
            Kind::String => entry.string("id"),
            Kind::Number => Ok(Some(id.get().to_owned())),
            other => Err(entry.error(
                "id",
                &format!("must be a string or a number, found {}", other.described()),
            )),
        },
    }
}

/// The `messages` array of a conversation, which must be there.
fn required_messages<'a>(entry: &Obj<'a>) -> Result<Vec<&'a RawValue>, ParseError> {
    entry
        .array("messages")?
        .ok_or_else(|| entry.error("messages", "must be an array, found null"))
}

/// A message's role and parts; `None` when it has no content at all.
fn message(entry: &Obj<'_>) -> Result<Option<(Role, Vec<Part>)>, ParseError> {
    let role_name = entry.req_string("role")?;
    let role = match role_name.as_str() {
        "system" | "developer" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        "tool" | "function" => Role::Tool,
        other => {
            return Err(entry.error(
                "role",
                &format!(
                    "is the unknown role `{other}` (expected system, developer, user, \
                     assistant, tool or function)"
                ),
            ));
        }
    };
    let mut parts = Vec::new();
    for key in ["reasoning_content", "reasoning"] {
        match entry.get(key) {
            None => {}
            Some(value) if raw::kind(value) == Kind::String => {
                let text = raw::as_string(value).map_err(|p| entry.error(key, &p))?;
                push_text(&mut parts, text, true);
            }
            // Structured reasoning (some providers' extension) is kept whole.
            Some(value) => parts.push(Part::Opaque {
                kind: key.to_owned(),
                json: raw::compact(value),
            }),
        }
    }
    if role == Role::Tool {
        let call_id = match entry.string("tool_call_id")? {
            Some(id) => id,
            None if role_name == "function" => entry.req_string("name")?,
            None => return Err(entry.error("tool_call_id", "is missing")),
        };
        let mut extra = Vec::new();
        let mut texts = Vec::new();
        if let Some(content) = entry.get("content") {
            match raw::kind(content) {
                Kind::String => {
                    texts.push(raw::as_string(content).map_err(|p| entry.error("content", &p))?);
                }
                _ => {
                    for (i, item) in content_parts(entry)?.into_iter().enumerate() {
                        let item = entry.element("content", i, item)?;
                        match item.req_string("type")?.as_str() {
                            "text" => texts.push(item.req_string("text")?),
                            _ => content_part(&item, &mut extra)?,
                        }
                    }
                }
            }
        }
        parts.push(Part::ToolResult {
            call_id,
            content: texts.join("\n"),
            is_error: false,
        });
        parts.extend(extra);
        return Ok(Some((role, parts)));
    }
    if let Some(content) = entry.get("content") {
        if raw::kind(content) == Kind::String {
            let text = raw::as_string(content).map_err(|p| entry.error("content", &p))?;
            push_text(&mut parts, text, false);
        } else {
            for (i, item) in content_parts(entry)?.into_iter().enumerate() {
                content_part(&entry.element("content", i, item)?, &mut parts)?;
            }
        }
    }
    if let Some(refusal) = entry.string("refusal")? {
        push_text(&mut parts, refusal, false);
    }
    for (i, call) in entry
        .array("tool_calls")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        tool_call(&entry.element("tool_calls", i, call)?, &mut parts)?;
    }
    if let Some(call) = entry.object("function_call")? {
        let name = call.req_string("name")?;
        parts.push(Part::ToolCall {
            id: name.clone(),
            name,
            arguments: arguments(&call)?,
        });
    }
    if let Some(audio) = entry.get("audio") {
        parts.push(Part::Opaque {
            kind: "audio".to_owned(),
            json: raw::compact(audio),
        });
    }
    Ok((!parts.is_empty()).then_some((role, parts)))
}

/// `content` that is not a string: it must be an array of parts.
fn content_parts<'a>(entry: &Obj<'a>) -> Result<Vec<&'a RawValue>, ParseError> {
    match entry.get("content") {
        None => Ok(Vec::new()),
        Some(content) => raw::as_array(content).ok_or_else(|| {
            entry.error(
                "content",
                &format!(
                    "must be a string, an array of content parts or null, found {}",
                    raw::kind(content).described()
                ),
            )
        }),
    }
}

fn push_text(parts: &mut Vec<Part>, text: String, reasoning: bool) {
    if text.is_empty() {
        return;
    }
    parts.push(if reasoning {
        Part::Reasoning { text }
    } else {
        Part::Text { text }
    });
}

/// One part of a `content` array.
fn content_part(item: &Obj<'_>, parts: &mut Vec<Part>) -> Result<(), ParseError> {
    let part_type = item.req_string("type")?;
    match part_type.as_str() {
        "text" => push_text(parts, item.req_string("text")?, false),
        "refusal" => push_text(parts, item.req_string("refusal")?, false),
        "image_url" => {
            // `{"url": ...}`, or (older clients) the URL itself.
            let url = match item.get("image_url").map(raw::kind) {
                Some(Kind::String) => item.req_string("image_url")?,
                _ => item.req_object("image_url")?.req_string("url")?,
            };
            parts.push(match raw::data_url(&url) {
                Some((media_type, byte_len)) => Part::Binary {
                    media_type,
                    byte_len,
                },
                None => Part::Binary {
                    media_type: "image/url".to_owned(),
                    byte_len: url.len() as u64,
                },
            });
        }
        "input_audio" => {
            let audio = item.req_object("input_audio")?;
            let format = audio.string("format")?;
            parts.push(Part::Binary {
                media_type: format!("audio/{}", format.as_deref().unwrap_or("unknown")),
                byte_len: raw::base64_decoded_len(&audio.string("data")?.unwrap_or_default()),
            });
        }
        "file" => {
            let file = item.req_object("file")?;
            match file.string("file_data")? {
                Some(data) => parts.push(match raw::data_url(&data) {
                    Some((media_type, byte_len)) => Part::Binary {
                        media_type,
                        byte_len,
                    },
                    None => Part::Binary {
                        media_type: "application/octet-stream".to_owned(),
                        byte_len: raw::base64_decoded_len(&data),
                    },
                }),
                // A reference to an uploaded file (`file_id`): kept as it is.
                None => parts.push(Part::Opaque {
                    kind: part_type,
                    json: raw::compact(item.raw()),
                }),
            }
        }
        _ => parts.push(Part::Opaque {
            kind: part_type,
            json: raw::compact(item.raw()),
        }),
    }
    Ok(())
}

/// One entry of an assistant's `tool_calls`.
fn tool_call(call: &Obj<'_>, parts: &mut Vec<Part>) -> Result<(), ParseError> {
    let call_type = call
        .string("type")?
        .unwrap_or_else(|| "function".to_owned());
    match call_type.as_str() {
        "function" => {
            let function = call.req_object("function")?;
            parts.push(Part::ToolCall {
                id: call.req_string("id")?,
                name: function.req_string("name")?,
                arguments: arguments(&function)?,
            });
        }
        "custom" => {
            let custom = call.req_object("custom")?;
            parts.push(Part::ToolCall {
                id: call.req_string("id")?,
                name: custom.req_string("name")?,
                arguments: custom.string("input")?.unwrap_or_default(),
            });
        }
        _ => parts.push(Part::Opaque {
            kind: call_type,
            json: raw::compact(call.raw()),
        }),
    }
    Ok(())
}

/// A function's `arguments`: the JSON string verbatim (or, from producers that send an object,
/// that object as compact JSON).
fn arguments(function: &Obj<'_>) -> Result<String, ParseError> {
    match function.get("arguments") {
        None => Ok(String::new()),
        Some(args) if raw::kind(args) == Kind::String => {
            raw::as_string(args).map_err(|p| function.error("arguments", &p))
        }
        Some(args) => Ok(raw::compact(args)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(line: u64) -> LineContext<'static> {
        LineContext {
            line,
            default_session_key: "chat",
        }
    }

    fn messages(text: &str, line: u64) -> Vec<ParsedMessage> {
        match parse_line(text.as_bytes(), &ctx(line)).unwrap() {
            LineOutcome::Messages(messages) => messages,
            other => panic!("expected messages, got {other:?}"),
        }
    }

    fn one(text: &str) -> NewMessage {
        let mut found = messages(text, 5);
        assert_eq!(found.len(), 1);
        let parsed = found.remove(0);
        assert_eq!(parsed.session_key, "chat");
        parsed.message
    }

    fn text(text: &str) -> Part {
        Part::Text { text: text.into() }
    }

    #[test]
    fn a_message_line_keeps_its_bytes_and_text() {
        let line = r#"{"role": "user", "content": "hi\n\n\u001b[1m \u00e9 \"x\""}"#;
        let m = one(line);
        assert_eq!(m.role, Role::User);
        assert_eq!(m.parts, vec![text("hi\n\n\u{1b}[1m é \"x\"")]);
        assert_eq!(m.created_at, Timestamp(0));
        assert_eq!(m.source_key.as_deref(), Some("line:5"));
        let original = m.original.unwrap();
        assert_eq!(original.format, SourceFormat::OpenAiChat);
        assert_eq!(original.bytes, line.as_bytes());
    }

    #[test]
    fn roles_map() {
        for (name, role) in [
            ("system", Role::System),
            ("developer", Role::System),
            ("user", Role::User),
            ("assistant", Role::Assistant),
        ] {
            let line = format!(r#"{{"role":"{name}","content":"x"}}"#);
            assert_eq!(one(&line).role, role, "{name}");
        }
        let tool = one(r#"{"role":"tool","tool_call_id":"call_1","content":"42"}"#);
        assert_eq!(tool.role, Role::Tool);
        assert_eq!(
            tool.parts,
            vec![Part::ToolResult {
                call_id: "call_1".into(),
                content: "42".into(),
                is_error: false
            }]
        );
        let function = one(r#"{"role":"function","name":"get_weather","content":"sunny"}"#);
        assert_eq!(function.role, Role::Tool);
        assert_eq!(
            function.parts,
            vec![Part::ToolResult {
                call_id: "get_weather".into(),
                content: "sunny".into(),
                is_error: false
            }]
        );
    }

    #[test]
    fn assistant_tool_calls_reasoning_and_refusal() {
        let line = r#"{"role":"assistant","reasoning_content":"think","content":null,"refusal":"no","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"b\": 1, \"a\": 2}"}},{"id":"call_2","type":"custom","custom":{"name":"g","input":"raw"}}],"function_call":{"name":"h","arguments":"{}"}}"#;
        let m = one(line);
        assert_eq!(m.role, Role::Assistant);
        assert_eq!(
            m.parts,
            vec![
                Part::Reasoning {
                    text: "think".into()
                },
                text("no"),
                Part::ToolCall {
                    id: "call_1".into(),
                    name: "f".into(),
                    arguments: r#"{"b": 1, "a": 2}"#.into(),
                },
                Part::ToolCall {
                    id: "call_2".into(),
                    name: "g".into(),
                    arguments: "raw".into(),
                },
                Part::ToolCall {
                    id: "h".into(),
                    name: "h".into(),
                    arguments: "{}".into(),
                },
            ]
        );
        let reasoning = one(r#"{"role":"assistant","reasoning":"hmm","content":"done"}"#);
        assert_eq!(
            reasoning.parts,
            vec![Part::Reasoning { text: "hmm".into() }, text("done")]
        );
    }

    #[test]
    fn content_parts_map() {
        let line = r#"{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,aGVsbG8="}},{"type":"image_url","image_url":{"url":"https://x.test/a.png","detail":"low"}},{"type":"input_audio","input_audio":{"data":"aGk=","format":"wav"}},{"type":"file","file":{"file_data":"data:application/pdf;base64,AAAA","filename":"a.pdf"}},{"type":"file","file":{"file_id":"file-1"}},{"type":"video","x":1}]}"#;
        let m = one(line);
        assert_eq!(
            m.parts,
            vec![
                text("look"),
                Part::Binary {
                    media_type: "image/png".into(),
                    byte_len: 5
                },
                Part::Binary {
                    media_type: "image/url".into(),
                    byte_len: 20
                },
                Part::Binary {
                    media_type: "audio/wav".into(),
                    byte_len: 2
                },
                Part::Binary {
                    media_type: "application/pdf".into(),
                    byte_len: 3
                },
                Part::Opaque {
                    kind: "file".into(),
                    json: r#"{"type":"file","file":{"file_id":"file-1"}}"#.into()
                },
                Part::Opaque {
                    kind: "video".into(),
                    json: r#"{"type":"video","x":1}"#.into()
                },
            ]
        );
    }

    #[test]
    fn tool_messages_join_text_parts() {
        let m = one(
            r#"{"role":"tool","tool_call_id":"c","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}"#,
        );
        assert_eq!(
            m.parts,
            vec![Part::ToolResult {
                call_id: "c".into(),
                content: "a\nb".into(),
                is_error: false
            }]
        );
    }

    #[test]
    fn empty_messages_are_skipped() {
        for line in [
            r#"{"role":"assistant","content":null}"#,
            r#"{"role":"user","content":""}"#,
            r#"{"role":"user","content":[]}"#,
            r#"{"messages":[]}"#,
        ] {
            assert_eq!(
                parse_line(line.as_bytes(), &ctx(1)).unwrap(),
                LineOutcome::Skipped {
                    reason: SkipReason::Empty
                },
                "{line}"
            );
        }
    }

    #[test]
    fn conversation_lines_use_their_id_or_line() {
        let line = r#"{"id":"conv-7","messages":[{"role":"system","content":"be brief"}, {"role":"assistant","content":null},{"role":"user","content":"hi"}],"model":"gpt"}"#;
        let found = messages(line, 3);
        assert_eq!(found.len(), 2);
        assert!(found.iter().all(|m| m.session_key == "chat#conv-7"));
        assert_eq!(found[0].message.source_key.as_deref(), Some("3:0"));
        // The empty message 1 is left out but keeps its index.
        assert_eq!(found[1].message.source_key.as_deref(), Some("3:2"));
        assert_eq!(
            found[0].message.original.as_ref().unwrap().bytes,
            br#"{"role":"system","content":"be brief"}"#
        );
        assert_eq!(
            found[1].message.original.as_ref().unwrap().bytes,
            br#"{"role":"user","content":"hi"}"#
        );

        let found = messages(r#"{"messages":[{"role":"user","content":"a"}]}"#, 8);
        assert_eq!(found[0].session_key, "chat#8");
        assert_eq!(found[0].message.source_key.as_deref(), Some("8:0"));
        let found = messages(r#"{"id":12,"messages":[{"role":"user","content":"a"}]}"#, 8);
        assert_eq!(found[0].session_key, "chat#12");
        let found = messages(
            r#"[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]"#,
            4,
        );
        assert_eq!(found.len(), 2);
        assert_eq!(found[1].session_key, "chat#4");
        assert_eq!(found[1].message.source_key.as_deref(), Some("4:1"));
    }

    #[test]
    fn documents_in_each_shape() {
        let doc = "[\n  {\"role\": \"user\",\n   \"content\": \"hi  there\"},\n  {\"role\": \"assistant\", \"content\": \"yo\"}\n]\n";
        let found = parse_document(doc.as_bytes(), "file").unwrap();
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].session_key, "file");
        assert_eq!(found[0].message.source_key.as_deref(), Some("0:0"));
        assert_eq!(found[1].message.source_key.as_deref(), Some("0:1"));
        assert_eq!(found[0].message.parts, vec![text("hi  there")]);
        assert_eq!(
            found[0].message.original.as_ref().unwrap().bytes,
            br#"{"role":"user","content":"hi  there"}"#
        );
        assert_eq!(found[1].message.created_at, Timestamp(0));

        let doc = "\u{feff}{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}";
        let found = parse_document(doc.as_bytes(), "file").unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].session_key, "file");

        let doc = r#"[{"id":"a","messages":[{"role":"user","content":"x"}]},{"messages":[{"role":"user","content":"y"},{"role":"assistant","content":"z"}]}]"#;
        let found = parse_document(doc.as_bytes(), "file").unwrap();
        let keys: Vec<_> = found
            .iter()
            .map(|m| {
                (
                    m.session_key.as_str(),
                    m.message.source_key.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            keys,
            vec![("file#a", "0:0"), ("file#1", "1:0"), ("file#1", "1:1")]
        );
    }

    #[test]
    fn document_errors_name_the_line() {
        let doc = "[\n  {\"role\": \"user\", \"content\": \"a\"},\n  {\"role\": \"robot\", \"content\": \"b\"}\n]";
        let err = parse_document(doc.as_bytes(), "f").unwrap_err();
        assert!(
            matches!(err, ParseError::InvalidEntry { line: 3, .. }),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("`[1].role` is the unknown role `robot`"),
            "{err}"
        );

        let doc = "[\n  {\"role\": \"user\",\n  \"content\": \"a\"\n";
        let err = parse_document(doc.as_bytes(), "f").unwrap_err();
        assert!(matches!(err, ParseError::MalformedJson { .. }), "{err}");
        assert!(err.line() >= 3, "{err}");

        let err =
            parse_document(b"[\n{\"role\":\"user\",\"content\":\"\xff\xfe\"}]", "f").unwrap_err();
        assert_eq!(
            err,
            ParseError::InvalidUtf8 {
                line: 2,
                byte_offset: 26
            }
        );

        let err = parse_document(b"42", "f").unwrap_err();
        assert!(
            matches!(err, ParseError::InvalidEntry { line: 1, .. }),
            "{err}"
        );
        let err = parse_document(br#"{"model":"x"}"#, "f").unwrap_err();
        assert!(err.to_string().contains("`messages` is missing"), "{err}");
        let err = parse_document(br#"{"messages":{}}"#, "f").unwrap_err();
        assert!(
            err.to_string()
                .contains("`messages` must be an array, found an object"),
            "{err}"
        );
    }

    #[test]
    fn line_errors_name_the_line_and_field() {
        let err = parse_line(b"\xff\xfe", &ctx(6)).unwrap_err();
        assert_eq!(
            err,
            ParseError::InvalidUtf8 {
                line: 6,
                byte_offset: 0
            }
        );
        let err = parse_line(br#"{"role":"user","content":"#, &ctx(6)).unwrap_err();
        assert!(
            matches!(err, ParseError::MalformedJson { line: 6, .. }),
            "{err}"
        );

        let cases = [
            ("42", "an OpenAI line must be a message"),
            ("\"hi\"", "found a string"),
            (r#"{"content":"x"}"#, "`role` is missing"),
            (
                r#"{"role":1,"content":"x"}"#,
                "`role` must be a string, found a number",
            ),
            (
                r#"{"role":"robot","content":"x"}"#,
                "`role` is the unknown role `robot`",
            ),
            (
                r#"{"role":"user","content":5}"#,
                "`content` must be a string, an array of content parts or null, found a number",
            ),
            (
                r#"{"role":"user","content":[{"text":"x"}]}"#,
                "`content[0].type` is missing",
            ),
            (
                r#"{"role":"user","content":[{"type":"text","text":false}]}"#,
                "`content[0].text` must be a string, found a boolean",
            ),
            (
                r#"{"role":"tool","content":"x"}"#,
                "`tool_call_id` is missing",
            ),
            (
                r#"{"role":"assistant","tool_calls":[{"id":"c","type":"function"}]}"#,
                "`tool_calls[0].function` is missing",
            ),
            (
                r#"{"role":"assistant","tool_calls":{}}"#,
                "`tool_calls` must be an array, found an object",
            ),
            (
                r#"{"messages":[{"role":"user","content":"x"},{"role":"bot"}]}"#,
                "`messages[1].role` is the unknown role `bot`",
            ),
            (
                r#"{"messages":5}"#,
                "`messages` must be an array, found a number",
            ),
            (
                r#"{"id":[],"messages":[]}"#,
                "`id` must be a string or a number",
            ),
        ];
        for (line, expected) in cases {
            let err = parse_line(line.as_bytes(), &ctx(6)).unwrap_err();
            assert!(
                matches!(err, ParseError::InvalidEntry { line: 6, .. }),
                "{line}: {err}"
            );
            let text = err.to_string();
            assert!(text.starts_with("line 6: "), "{text}");
            assert!(
                text.contains(expected),
                "{line}: `{text}` lacks `{expected}`"
            );
        }
    }
}
