//! Helpers shared by the engine's integration tests.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// OpenAI: every tool message answers a call of the closest preceding assistant message, and
/// every call of an assistant message is answered before the next non-tool message.
pub fn assert_openai_pairing(messages: &[Value]) {
    let mut open: HashSet<String> = HashSet::new();
    for m in messages {
        match m["role"].as_str().unwrap() {
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap();
                assert!(
                    open.remove(id),
                    "tool result {id} answers no open call: {messages:#?}"
                );
            }
            role => {
                assert!(
                    open.is_empty(),
                    "calls {open:?} unanswered before a {role} message"
                );
                if let Some(calls) = m["tool_calls"].as_array() {
                    for c in calls {
                        open.insert(c["id"].as_str().unwrap().to_owned());
                    }
                }
            }
        }
    }
    assert!(open.is_empty(), "calls {open:?} never answered");
}

/// Anthropic: roles alternate starting with user; each tool_result answers a tool_use of the
/// assistant turn just before.
pub fn assert_anthropic_pairing(body: &Value) {
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(
        messages.first().map(|m| m["role"].clone()),
        Some(Value::from("user"))
    );
    let mut previous_uses: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            assert_ne!(m["role"], messages[i - 1]["role"], "roles must alternate");
        }
        let blocks = m["content"].as_array().unwrap();
        let mut uses = HashSet::new();
        for b in blocks {
            match b["type"].as_str().unwrap() {
                "tool_use" => {
                    uses.insert(b["id"].as_str().unwrap().to_owned());
                }
                "tool_result" => {
                    let id = b["tool_use_id"].as_str().unwrap();
                    assert!(
                        previous_uses.contains(id),
                        "tool_result {id} without tool_use"
                    );
                }
                _ => {}
            }
        }
        previous_uses = uses;
    }
}

/// `../shared/data` beside the repository, if present.
pub fn shared_data() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (it holds the real transcripts); this test needs it",
            dir.display()
        );
        None
    }
}

/// The four long real Claude Code sessions.
pub fn real_sessions(data: &Path) -> Vec<PathBuf> {
    let dir = data.join("transcripts/claude-code");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension().is_some_and(|e| e == "jsonl")
                        && p.file_stem().is_some_and(|s| s.len() == 36)
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The long real sessions, as the messages a host would append, in order.
pub fn real_session_messages(data: &Path) -> Vec<(String, Vec<lcm_core::message::NewMessage>)> {
    real_sessions(data)
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let mut messages = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let ctx = lcm_core::formats::LineContext {
                    line: i as u64 + 1,
                    default_session_key: "replay",
                };
                if let Ok(lcm_core::formats::LineOutcome::Messages(parsed)) =
                    lcm_core::formats::parse_line(
                        lcm_core::formats::Format::ClaudeCode,
                        line.as_bytes(),
                        &ctx,
                    )
                {
                    messages.extend(parsed.into_iter().map(|p| p.message));
                }
            }
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                messages,
            )
        })
        .collect()
}

/// The summaries above a node, the one covering it first, up to the top.
pub fn summaries_above(
    store: &lcm_store::Store,
    node: lcm_core::summary::NodeRef,
) -> Vec<lcm_core::ids::SummaryId> {
    let mut out = Vec::new();
    let mut at = node;
    while let Some(parent) = store.covering(at).unwrap() {
        out.push(parent);
        at = lcm_core::summary::NodeRef::Summary(parent);
    }
    out
}

/// An assistant turn stating an intent (an open commitment until something fulfils it) about
/// module `i`, of about 70 tokens.
pub fn intent_message(i: usize) -> lcm_core::message::NewMessage {
    let text = format!(
        "I'll rewrite src/retry_{i}.rs next and then run the suite for module {i}. {}",
        "The retry policy changed in this step. ".repeat(6)
    );
    lcm_core::message::NewMessage::text(lcm_core::message::Role::Assistant, text)
}
