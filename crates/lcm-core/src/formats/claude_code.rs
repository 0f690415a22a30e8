//! Claude Code session transcripts (`~/.claude/projects/<project>/<session>.jsonl`).
//!
//! One JSON entry a line. Entries of `type` `user` and `assistant` carry an Anthropic Messages
//! API message in `message` (`role`, and `content` as a string or a list of content blocks);
//! `system` entries with a string `content` are system notices (local command output, compaction
//! markers). Every other type (`progress`, `file-history-snapshot`, `queue-operation`, `system`
//! entries without content, ...) is skipped as [`SkipReason::NotAMessage`].
//!
//! Mapping of content blocks to [`Part`]s:
//! - `text` -> [`Part::Text`], `thinking` -> [`Part::Reasoning`] (the text verbatim, never
//!   trimmed; an empty text adds no part);
//! - `tool_use` -> [`Part::ToolCall`] with the `input` as compact JSON text (keys in the order
//!   written);
//! - `tool_result` -> [`Part::ToolResult`]; when its `content` is a list, its `text` blocks are
//!   joined with `\n` and its other blocks (images, ...) follow as their own parts;
//! - `image`, `document` -> [`Part::Binary`] (media type and decoded size of the payload);
//! - anything else (`redacted_thinking`, `server_tool_use`, ...) -> [`Part::Opaque`].
//!
//! A message whose content is only `tool_result` blocks has the role [`Role::Tool`]. Each
//! message's session is `claude-code:{sessionId}`, or `claude-code:{sessionId}/agent-{agentId}`
//! for a sub-agent's entries (`isSidechain: true` with an `agentId`, as found in
//! `<session>/subagents/agent-<id>.jsonl`); its `source_key` is the entry's `uuid` (or
//! `line:{n}` for an entry without one) and its time the entry's `timestamp`.

use super::raw::{self, Kind, Obj};
use super::{LineContext, LineOutcome, ParseError, ParsedMessage, SkipReason, utf8_line};
use crate::message::{NewMessage, Original, Part, Role, SourceFormat};
use crate::time::Timestamp;

/// Parses one line of a Claude Code transcript.
pub fn parse_line(bytes: &[u8], ctx: &LineContext<'_>) -> Result<LineOutcome, ParseError> {
    let line = ctx.line;
    let text = utf8_line(bytes, line)?;
    let root = raw::raw_line(text, line)?;
    let entry = Obj::parse(root, String::new(), line, "a Claude Code entry")?;
    let entry_type = entry.req_string("type")?;
    let (role, parts) = match entry_type.as_str() {
        "user" | "assistant" => message_parts(&entry)?,
        "system" => match entry.get("content") {
            None => return Ok(not_a_message(entry_type)),
            Some(content) => {
                let text = raw::as_string(content).map_err(|p| entry.error("content", &p))?;
                (
                    Role::System,
                    text_part(text, Text::Plain).into_iter().collect(),
                )
            }
        },
        _ => return Ok(not_a_message(entry_type)),
    };
    if parts.is_empty() {
        return Ok(LineOutcome::Skipped {
            reason: SkipReason::Empty,
        });
    }
    let message = NewMessage {
        role,
        parts,
        created_at: created_at(&entry)?,
        original: Some(Original {
            format: SourceFormat::ClaudeCode,
            bytes: bytes.to_vec(),
        }),
        source_key: Some(match entry.string("uuid")? {
            Some(uuid) => uuid,
            None => format!("line:{line}"),
        }),
    };
    let (session_key, parent_session_key) = session_keys(&entry, ctx)?;
    Ok(LineOutcome::Messages(vec![ParsedMessage {
        session_key,
        parent_session_key,
        message,
    }]))
}

fn not_a_message(entry_type: String) -> LineOutcome {
    LineOutcome::Skipped {
        reason: SkipReason::NotAMessage { entry_type },
    }
}

/// `claude-code:{sessionId}[/agent-{agentId}]` (a sub-agent's session with its parent's key),
/// or the context's default without a session id.
fn session_keys(
    entry: &Obj<'_>,
    ctx: &LineContext<'_>,
) -> Result<(String, Option<String>), ParseError> {
    let Some(session) = entry.string("sessionId")? else {
        return Ok((ctx.default_session_key.to_owned(), None));
    };
    let sidechain = entry.bool("isSidechain")?.unwrap_or(false);
    let parent = format!("claude-code:{session}");
    Ok(match entry.string("agentId")? {
        Some(agent) if sidechain => (format!("{parent}/agent-{agent}"), Some(parent)),
        _ => (parent, None),
    })
}

/// The entry's `timestamp`, or the epoch when it has none.
fn created_at(entry: &Obj<'_>) -> Result<Timestamp, ParseError> {
    match entry.string("timestamp")? {
        None => Ok(Timestamp(0)),
        Some(text) => Timestamp::parse(&text).map_err(|e| entry.error("timestamp", &e.to_string())),
    }
}

/// The role and parts of a `user` or `assistant` entry.
fn message_parts(entry: &Obj<'_>) -> Result<(Role, Vec<Part>), ParseError> {
    let message = entry.req_object("message")?;
    let role = match message.req_string("role")?.as_str() {
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => {
            return Err(message.error(
                "role",
                &format!("is the unknown role `{other}` (expected `user` or `assistant`)"),
            ));
        }
    };
    let Some(content) = message.get("content") else {
        return Err(message.error(
            "content",
            if message.has("content") {
                "must be a string or an array of content blocks, found null"
            } else {
                "is missing"
            },
        ));
    };
    let mut parts = Vec::new();
    match raw::kind(content) {
        Kind::String => {
            let text = raw::as_string(content).map_err(|p| message.error("content", &p))?;
            parts.extend(text_part(text, Text::Plain));
            Ok((role, parts))
        }
        Kind::Array => {
            let blocks = raw::as_array(content).unwrap_or_default();
            let mut only_tool_results = !blocks.is_empty();
            for (i, block) in blocks.into_iter().enumerate() {
                let block = message.element("content", i, block)?;
                only_tool_results &= content_block(&block, &mut parts)?;
            }
            Ok((if only_tool_results { Role::Tool } else { role }, parts))
        }
        other => Err(message.error(
            "content",
            &format!(
                "must be a string or an array of content blocks, found {}",
                other.described()
            ),
        )),
    }
}

#[derive(Clone, Copy)]
enum Text {
    Plain,
    Reasoning,
}

/// A text part, or none for an empty text. The text is kept exactly as given.
fn text_part(text: String, kind: Text) -> Option<Part> {
    if text.is_empty() {
        return None;
    }
    Some(match kind {
        Text::Plain => Part::Text { text },
        Text::Reasoning => Part::Reasoning { text },
    })
}

/// Adds the parts of one content block; says whether it was a `tool_result`.
fn content_block(block: &Obj<'_>, parts: &mut Vec<Part>) -> Result<bool, ParseError> {
    let block_type = block.req_string("type")?;
    match block_type.as_str() {
        "text" => parts.extend(text_part(block.req_string("text")?, Text::Plain)),
        "thinking" => parts.extend(text_part(block.req_string("thinking")?, Text::Reasoning)),
        "tool_use" => {
            let Some(input) = block.get("input") else {
                return Err(block.error("input", "is missing"));
            };
            parts.push(Part::ToolCall {
                id: block.req_string("id")?,
                name: block.req_string("name")?,
                arguments: raw::compact(input),
            });
        }
        "tool_result" => {
            tool_result(block, parts)?;
            return Ok(true);
        }
        "image" | "document" => parts.push(binary(block, &block_type)?),
        _ => parts.push(opaque(block_type, block)),
    }
    Ok(false)
}

/// A `tool_result` block: the result's text, then any non-text blocks of its content.
fn tool_result(block: &Obj<'_>, parts: &mut Vec<Part>) -> Result<(), ParseError> {
    let call_id = block.req_string("tool_use_id")?;
    let is_error = block.bool("is_error")?.unwrap_or(false);
    let mut extra = Vec::new();
    let content = match block.get("content") {
        None => String::new(),
        Some(content) => match raw::kind(content) {
            Kind::String => raw::as_string(content).map_err(|p| block.error("content", &p))?,
            Kind::Array => {
                let mut texts = Vec::new();
                let items = raw::as_array(content).unwrap_or_default();
                for (i, item) in items.into_iter().enumerate() {
                    let item = block.element("content", i, item)?;
                    let item_type = item.req_string("type")?;
                    match item_type.as_str() {
                        "text" => texts.push(item.req_string("text")?),
                        "image" | "document" => extra.push(binary(&item, &item_type)?),
                        _ => extra.push(opaque(item_type, &item)),
                    }
                }
                texts.join("\n")
            }
            other => {
                return Err(block.error(
                    "content",
                    &format!(
                        "must be a string or an array of content blocks, found {}",
                        other.described()
                    ),
                ));
            }
        },
    };
    parts.push(Part::ToolResult {
        call_id,
        content,
        is_error,
    });
    parts.extend(extra);
    Ok(())
}

/// An `image` or `document` block: what its `source` holds and how big it is.
fn binary(block: &Obj<'_>, block_type: &str) -> Result<Part, ParseError> {
    let source = block.req_object("source")?;
    let source_type = source.string("type")?.unwrap_or_default();
    let data = source.string("data")?;
    let url = source.string("url")?;
    let media_type = match source.string("media_type")? {
        Some(media_type) => media_type,
        None if url.is_some() => format!("{block_type}/url"),
        None if source_type == "text" => "text/plain".to_owned(),
        None => "application/octet-stream".to_owned(),
    };
    let byte_len = match (data, url) {
        (Some(data), _) if source_type == "base64" => raw::base64_decoded_len(&data),
        (Some(data), _) => data.len() as u64,
        (None, Some(url)) => url.len() as u64,
        (None, None) => 0,
    };
    Ok(Part::Binary {
        media_type,
        byte_len,
    })
}

/// A block lcm has no type for, kept as compact JSON.
fn opaque(kind: String, block: &Obj<'_>) -> Part {
    Part::Opaque {
        kind,
        json: raw::compact(block.raw()),
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

    fn parse(text: &str) -> Result<LineOutcome, ParseError> {
        parse_line(text.as_bytes(), &ctx(3))
    }

    /// The single message a line yields.
    fn one(text: &str) -> ParsedMessage {
        match parse(text).unwrap() {
            LineOutcome::Messages(mut messages) => {
                assert_eq!(messages.len(), 1);
                messages.remove(0)
            }
            other => panic!("expected a message, got {other:?}"),
        }
    }

    fn entry(entry_type: &str, role: &str, content: &str) -> String {
        format!(
            r#"{{"parentUuid":null,"isSidechain":false,"sessionId":"s-1","type":"{entry_type}","message":{{"role":"{role}","content":{content}}},"uuid":"u-1","timestamp":"2026-02-10T21:11:56.846Z"}}"#
        )
    }

    #[test]
    fn user_string_content_is_one_text_part_with_the_entry_metadata() {
        let line = entry("user", "user", r#""mix phx.server doesnt seem to start""#);
        let parsed = one(&line);
        assert_eq!(parsed.session_key, "claude-code:s-1");
        let m = parsed.message;
        assert_eq!(m.role, Role::User);
        assert_eq!(
            m.parts,
            vec![Part::Text {
                text: "mix phx.server doesnt seem to start".into()
            }]
        );
        assert_eq!(m.source_key.as_deref(), Some("u-1"));
        assert_eq!(
            m.created_at,
            Timestamp::parse("2026-02-10T21:11:56.846Z").unwrap()
        );
        let original = m.original.unwrap();
        assert_eq!(original.format, SourceFormat::ClaudeCode);
        assert_eq!(original.bytes, line.as_bytes());
    }

    #[test]
    fn texts_are_kept_verbatim() {
        let line = entry(
            "assistant",
            "assistant",
            r#"[{"type":"text","text":"\n\n"},{"type":"text","text":"caf\u00e9 \u001b[1mbold\u001b[22m \"q\" \\ 漢字 🎉"}]"#,
        );
        let m = one(&line).message;
        assert_eq!(m.role, Role::Assistant);
        assert_eq!(
            m.parts,
            vec![
                Part::Text {
                    text: "\n\n".into()
                },
                Part::Text {
                    text: "café \u{1b}[1mbold\u{1b}[22m \"q\" \\ 漢字 🎉".into()
                },
            ]
        );
        assert_eq!(m.original.unwrap().bytes, line.as_bytes());
    }

    #[test]
    fn thinking_and_tool_use_blocks() {
        let line = entry(
            "assistant",
            "assistant",
            r#"[{"type":"thinking","thinking":"Let me check.","signature":"EsMC"},{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"ls -la","timeout":30000,"a":[1, 2.50]},"caller":{"type":"direct"}}]"#,
        );
        let m = one(&line).message;
        assert_eq!(m.role, Role::Assistant);
        assert_eq!(
            m.parts,
            vec![
                Part::Reasoning {
                    text: "Let me check.".into()
                },
                Part::ToolCall {
                    id: "toolu_1".into(),
                    name: "Bash".into(),
                    // Compact, in the order written, numbers as spelt.
                    arguments: r#"{"command":"ls -la","timeout":30000,"a":[1,2.50]}"#.into(),
                },
            ]
        );
    }

    #[test]
    fn tool_results_make_a_tool_message() {
        let line = entry(
            "user",
            "user",
            r#"[{"type":"tool_result","content":"rejected","is_error":true,"tool_use_id":"toolu_1"}]"#,
        );
        let m = one(&line).message;
        assert_eq!(m.role, Role::Tool);
        assert_eq!(
            m.parts,
            vec![Part::ToolResult {
                call_id: "toolu_1".into(),
                content: "rejected".into(),
                is_error: true,
            }]
        );
    }

    #[test]
    fn tool_result_lists_join_texts_and_keep_images_as_binary_parts() {
        let line = entry(
            "user",
            "user",
            r#"[{"type":"tool_result","tool_use_id":"toolu_2","content":[{"type":"text","text":"first"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"aGVsbG8="}},{"type":"text","text":"second"}]}]"#,
        );
        let m = one(&line).message;
        assert_eq!(m.role, Role::Tool);
        assert_eq!(
            m.parts,
            vec![
                Part::ToolResult {
                    call_id: "toolu_2".into(),
                    content: "first\nsecond".into(),
                    is_error: false,
                },
                Part::Binary {
                    media_type: "image/png".into(),
                    byte_len: 5,
                },
            ]
        );
    }

    #[test]
    fn a_tool_result_beside_text_keeps_the_message_role() {
        let line = entry(
            "user",
            "user",
            r#"[{"type":"tool_result","tool_use_id":"t","content":"ok"},{"type":"text","text":"and also"}]"#,
        );
        assert_eq!(one(&line).message.role, Role::User);
    }

    #[test]
    fn images_documents_and_unknown_blocks() {
        let line = entry(
            "user",
            "user",
            r#"[{"type":"image","source":{"type":"base64","media_type":"image/jpeg","data":"AAAAAAAA"}},{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"aGk="}},{"type":"image","source":{"type":"url","url":"https://x.test/a.png"}},{"type":"redacted_thinking","data":"xyz"}]"#,
        );
        let m = one(&line).message;
        assert_eq!(
            m.parts,
            vec![
                Part::Binary {
                    media_type: "image/jpeg".into(),
                    byte_len: 6,
                },
                Part::Binary {
                    media_type: "application/pdf".into(),
                    byte_len: 2,
                },
                Part::Binary {
                    media_type: "image/url".into(),
                    byte_len: 20,
                },
                Part::Opaque {
                    kind: "redacted_thinking".into(),
                    json: r#"{"type":"redacted_thinking","data":"xyz"}"#.into(),
                },
            ]
        );
    }

    #[test]
    fn system_entries_with_content_are_system_messages() {
        let line = r#"{"isSidechain":false,"sessionId":"s-1","type":"system","subtype":"local_command","content":"<local-command-stdout>Kept model as \u001b[1mDefault\u001b[22m</local-command-stdout>","level":"info","timestamp":"2026-02-10T21:16:12.381Z","uuid":"u-9"}"#;
        let m = one(line).message;
        assert_eq!(m.role, Role::System);
        assert_eq!(
            m.parts,
            vec![Part::Text {
                text: "<local-command-stdout>Kept model as \u{1b}[1mDefault\u{1b}[22m</local-command-stdout>"
                    .into()
            }]
        );
        assert_eq!(m.source_key.as_deref(), Some("u-9"));
    }

    #[test]
    fn other_entries_are_skipped_by_type() {
        let cases = [
            (
                r#"{"type":"file-history-snapshot","messageId":"m","snapshot":{},"isSnapshotUpdate":false}"#,
                "file-history-snapshot",
            ),
            (
                r#"{"type":"progress","sessionId":"s","data":{"type":"hook_progress"},"uuid":"u"}"#,
                "progress",
            ),
            (
                r#"{"type":"system","subtype":"turn_duration","durationMs":5,"uuid":"u"}"#,
                "system",
            ),
            (
                r#"{"type":"queue-operation","operation":"enqueue","content":"x"}"#,
                "queue-operation",
            ),
        ];
        for (line, entry_type) in cases {
            assert_eq!(
                parse(line).unwrap(),
                LineOutcome::Skipped {
                    reason: SkipReason::NotAMessage {
                        entry_type: entry_type.into()
                    }
                },
                "{line}"
            );
        }
    }

    #[test]
    fn empty_messages_are_skipped_as_empty() {
        for content in [r#""""#, "[]", r#"[{"type":"text","text":""}]"#] {
            let line = entry("user", "user", content);
            assert_eq!(
                parse(&line).unwrap(),
                LineOutcome::Skipped {
                    reason: SkipReason::Empty
                },
                "{content}"
            );
        }
        let system = r#"{"type":"system","content":"","uuid":"u"}"#;
        assert_eq!(
            parse(system).unwrap(),
            LineOutcome::Skipped {
                reason: SkipReason::Empty
            }
        );
    }

    #[test]
    fn sub_agent_entries_get_their_own_session() {
        let line = r#"{"parentUuid":null,"isSidechain":true,"sessionId":"258c","agentId":"a881341","type":"user","message":{"role":"user","content":"go"},"uuid":"u"}"#;
        let parsed = one(line);
        assert_eq!(parsed.session_key, "claude-code:258c/agent-a881341");
        assert_eq!(
            parsed.parent_session_key.as_deref(),
            Some("claude-code:258c")
        );
        // An agentId on a main-chain entry does not split the session.
        let line = r#"{"isSidechain":false,"sessionId":"258c","agentId":"a1","type":"user","message":{"role":"user","content":"go"},"uuid":"u"}"#;
        let parsed = one(line);
        assert_eq!(parsed.session_key, "claude-code:258c");
        assert_eq!(parsed.parent_session_key, None);
    }

    #[test]
    fn missing_session_uuid_and_timestamp_fall_back() {
        let line = r#"{"type":"user","message":{"role":"user","content":"hi"}}"#;
        let parsed = one(line);
        assert_eq!(parsed.session_key, "default");
        assert_eq!(parsed.message.source_key.as_deref(), Some("line:3"));
        assert_eq!(parsed.message.created_at, Timestamp(0));
    }

    #[test]
    fn invalid_utf8_is_reported_with_line_and_offset() {
        let err = parse_line(b"{\"type\":\"\xff\xfe\"}", &ctx(12)).unwrap_err();
        assert_eq!(
            err,
            ParseError::InvalidUtf8 {
                line: 12,
                byte_offset: 9
            }
        );
        assert!(
            err.to_string().starts_with("line 12: invalid UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn truncated_json_is_malformed() {
        let err = parse_line(br#"{"type":"user","message":{"role""#, &ctx(4)).unwrap_err();
        assert!(
            matches!(err, ParseError::MalformedJson { line: 4, .. }),
            "{err}"
        );
        assert!(
            err.to_string().starts_with("line 4: malformed JSON"),
            "{err}"
        );
    }

    #[test]
    fn wrong_shapes_are_invalid_entries_naming_the_field() {
        let cases = [
            (
                "42",
                "a Claude Code entry must be a JSON object, found a number",
            ),
            (r#"{"uuid":"u"}"#, "`type` is missing"),
            (r#"{"type":7}"#, "`type` must be a string, found a number"),
            (r#"{"type":"user"}"#, "`message` is missing"),
            (
                r#"{"type":"user","message":{"content":"x"}}"#,
                "`message.role` is missing",
            ),
            (
                r#"{"type":"user","message":{"role":"robot","content":"x"}}"#,
                "`message.role` is the unknown role `robot`",
            ),
            (
                r#"{"type":"user","message":{"role":"user"}}"#,
                "`message.content` is missing",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":null}}"#,
                "`message.content` must be a string or an array of content blocks, found null",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":5}}"#,
                "`message.content` must be a string or an array of content blocks, found a number",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":["x"]}}"#,
                "`message.content[0]` must be a JSON object, found a string",
            ),
            (
                r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"text"}]}}"#,
                "`message.content[0].text` is missing",
            ),
            (
                r#"{"type":"assistant","message":{"role":"assistant","content":[{"type":"tool_use","id":"t","input":{}}]}}"#,
                "`message.content[0].name` is missing",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":3}]}}"#,
                "`message.content[0].content` must be a string or an array",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","is_error":"yes"}]}}"#,
                "`message.content[0].is_error` must be a boolean, found a string",
            ),
            (
                r#"{"type":"user","message":{"role":"user","content":"x"},"timestamp":"yesterday"}"#,
                "`timestamp` `yesterday` is not a timestamp",
            ),
            (
                r#"{"type":"system","content":["x"]}"#,
                "`content` must be a string, found an array",
            ),
        ];
        for (line, expected) in cases {
            let err = parse_line(line.as_bytes(), &ctx(9)).unwrap_err();
            assert!(
                matches!(err, ParseError::InvalidEntry { line: 9, .. }),
                "{line}: {err}"
            );
            let text = err.to_string();
            assert!(text.starts_with("line 9: "), "{text}");
            assert!(
                text.contains(expected),
                "{line}: `{text}` lacks `{expected}`"
            );
        }
    }

    const DATA_DIR: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/transcripts/claude-code"
    );

    /// Every line of a real transcript, parsed.
    fn parse_file(path: &std::path::Path) -> Vec<LineOutcome> {
        let bytes = std::fs::read(path).unwrap();
        let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
        if lines.last().is_some_and(|l| l.is_empty()) {
            lines.pop();
        }
        lines
            .iter()
            .enumerate()
            .map(|(i, line)| {
                let ctx = LineContext {
                    line: i as u64 + 1,
                    default_session_key: "file",
                };
                let outcome =
                    parse_line(line, &ctx).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                if let LineOutcome::Messages(messages) = &outcome {
                    for m in messages {
                        let original = m.message.original.as_ref().unwrap();
                        assert_eq!(original.bytes, *line);
                    }
                }
                outcome
            })
            .collect()
    }

    #[test]
    fn the_short_sample_transcript_parses() {
        let path = std::path::Path::new(DATA_DIR).join("short.jsonl");
        if !path.exists() {
            eprintln!("skipping: {} not found", path.display());
            return;
        }
        let mut counts = std::collections::BTreeMap::new();
        let mut tool_uses = std::collections::HashSet::new();
        let mut keys = std::collections::HashSet::new();
        for outcome in parse_file(&path) {
            let LineOutcome::Messages(messages) = outcome else {
                continue;
            };
            for parsed in messages {
                assert!(parsed.session_key.starts_with("claude-code:"));
                assert!(keys.insert(parsed.message.source_key.clone().unwrap()));
                *counts.entry(parsed.message.role).or_insert(0) += 1;
                for part in &parsed.message.parts {
                    match part {
                        Part::ToolCall { id, .. } => {
                            tool_uses.insert(id.clone());
                        }
                        Part::ToolResult { call_id, .. } => {
                            assert!(tool_uses.contains(call_id), "result for unknown {call_id}");
                        }
                        _ => {}
                    }
                }
            }
        }
        for role in [Role::User, Role::Assistant, Role::Tool] {
            assert!(
                counts.get(&role).copied().unwrap_or(0) > 0,
                "{role}: {counts:?}"
            );
        }
        assert!(!tool_uses.is_empty());
    }

    #[test]
    fn every_sample_transcript_parses() {
        let dir = std::path::Path::new(DATA_DIR);
        if !dir.exists() {
            eprintln!("skipping: {} not found", dir.display());
            return;
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                for sub in std::fs::read_dir(path.join("subagents"))
                    .into_iter()
                    .flatten()
                {
                    files.push(sub.unwrap().path());
                }
            } else if path.extension().is_some_and(|e| e == "jsonl") {
                files.push(path);
            }
        }
        let mut messages = 0;
        for path in &files {
            let is_subagent = path.components().any(|c| c.as_os_str() == "subagents");
            for outcome in parse_file(path) {
                if let LineOutcome::Messages(found) = outcome {
                    for parsed in found {
                        messages += 1;
                        assert_eq!(
                            parsed.session_key.contains("/agent-"),
                            is_subagent,
                            "{}: {}",
                            path.display(),
                            parsed.session_key
                        );
                    }
                }
            }
        }
        assert!(messages > 0);
    }
}
