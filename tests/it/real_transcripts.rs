//! The four real Claude Code sessions from ../shared/data: imported, every message's text and
//! original come back unchanged, re-import adds nothing, and grep finds known strings.

use crate::common;

use std::collections::HashMap;

use lcm::MessageId;
use lcm::core::message::Part;
use lcm::search::{GrepMode, GrepRequest, Scope, grep};
use lcm::store::import::{ImportOptions, import_file};
use serde_json::Value;

/// The texts a Claude Code entry carries, extracted independently of lcm's parser.
fn entry_texts(entry: &Value) -> Option<Vec<String>> {
    let kind = entry.get("type")?.as_str()?;
    if kind == "system" {
        return entry.get("content")?.as_str().map(|s| vec![s.to_owned()]);
    }
    if kind != "user" && kind != "assistant" {
        return None;
    }
    let content = entry.get("message")?.get("content")?;
    let mut texts = Vec::new();
    match content {
        Value::String(s) if !s.is_empty() => texts.push(s.clone()),
        Value::String(_) => {}
        Value::Array(blocks) => {
            for block in blocks {
                match block.get("type").and_then(Value::as_str) {
                    // An empty text or thinking block carries nothing and adds no part.
                    Some("text") => texts.extend(
                        block["text"]
                            .as_str()
                            .filter(|t| !t.is_empty())
                            .map(str::to_owned),
                    ),
                    Some("thinking") => texts.extend(
                        block["thinking"]
                            .as_str()
                            .filter(|t| !t.is_empty())
                            .map(str::to_owned),
                    ),
                    Some("tool_use") => texts.push(block["name"].as_str()?.to_owned()),
                    Some("tool_result") => match &block["content"] {
                        Value::String(s) => texts.push(s.clone()),
                        Value::Array(inner) => {
                            let joined: Vec<&str> = inner
                                .iter()
                                .filter(|b| b["type"] == "text")
                                .filter_map(|b| b["text"].as_str())
                                .collect();
                            texts.push(joined.join("\n"));
                        }
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        _ => return None,
    }
    // A tool result may be empty (a command with no output) and still is a message.
    (!texts.is_empty()).then_some(texts)
}

fn part_texts(parts: &[Part]) -> Vec<String> {
    parts
        .iter()
        .filter_map(|p| match p {
            Part::Text { text } | Part::Reasoning { text } => Some(text.clone()),
            Part::ToolCall { name, .. } => Some(name.clone()),
            Part::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn real_sessions_round_trip_and_are_greppable() {
    let Some(data_root) = common::shared_data() else {
        return;
    };
    let files = common::real_sessions(&data_root);
    assert_eq!(files.len(), 4, "expected the four real sessions");
    let (_tmp, data) = common::temp_data_dir();
    let mut rng = lcm::core::rng::SplitMix64::new(7);

    for file in &files {
        let raw = std::fs::read(file).unwrap();
        let report = import_file(&data.store, file, &ImportOptions::default(), |_, _| {}).unwrap();
        assert_eq!(report.error_count, 0, "{:?}", report.errors);

        // Every line that carries a message, by an independent reading of the file.
        let mut expected: HashMap<&[u8], Vec<String>> = HashMap::new();
        for line in raw.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let entry: Value = serde_json::from_slice(line).unwrap();
            if let Some(texts) = entry_texts(&entry) {
                expected.insert(line, texts);
            }
        }
        assert_eq!(
            report.imported as usize,
            expected.len(),
            "{}",
            file.display()
        );

        // Every stored message: its original is one of those lines byte for byte, and its
        // texts are exactly that line's texts.
        let reader = data.store.reader().unwrap();
        let mut seen = 0;
        for s in &report.sessions {
            let messages = reader.session_messages(s.id, 0..u64::MAX).unwrap();
            for m in &messages {
                let original = reader.original(m.id).unwrap();
                let texts = expected
                    .get(original.bytes.as_slice())
                    .unwrap_or_else(|| panic!("{}: original is not a line of the file", m.id));
                assert_eq!(&part_texts(&m.parts), texts, "{}", m.id);
                assert!(m.token_count > 0);
                seen += 1;
            }
        }
        assert_eq!(seen, expected.len());

        // Importing again adds nothing.
        let again = import_file(&data.store, file, &ImportOptions::default(), |_, _| {}).unwrap();
        assert_eq!(again.imported, 0);
        assert_eq!(again.already_present, report.imported);

        data.index.catch_up(&data.store, |_, _| {}).unwrap();

        // Grep finds known strings: 25 substrings sampled from the session's texts.
        let session = report.sessions[0].id;
        let messages = reader.session_messages(session, 0..u64::MAX).unwrap();
        let mut checked = 0;
        while checked < 25 {
            let m = &messages[rng.below(messages.len() as u64) as usize];
            let text = m.search_text();
            let chars: Vec<char> = text.chars().collect();
            if chars.len() < 16 {
                continue;
            }
            let start = rng.below((chars.len() - 12) as u64) as usize;
            let needle: String = chars[start..start + 12].iter().collect();
            if needle.trim().len() < 6 {
                continue;
            }
            assert!(
                finds(&data, session, &regex::escape(&needle), m.id),
                "regex grep missed {needle:?} in {}",
                m.id
            );
            checked += 1;
        }
    }
}

/// Whether a regex grep in `session` reports `target`, following cursors.
fn finds(data: &lcm::DataDir, session: lcm::SessionId, pattern: &str, target: MessageId) -> bool {
    let config = lcm::core::config::SearchConfig::default();
    let mut cursor = None;
    loop {
        let page = grep(
            &data.store,
            &data.index,
            &config,
            &GrepRequest {
                pattern: pattern.to_owned(),
                mode: GrepMode::Regex,
                scope: Scope {
                    session: Some(session),
                    ..Scope::default()
                },
                limit: Some(200),
                cursor,
            },
        )
        .unwrap();
        if page.hits.iter().any(|h| h.message == target) {
            return true;
        }
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return false,
        }
    }
}

#[test]
fn full_text_ranks_a_known_phrase_from_a_real_session() {
    let Some(data_root) = common::shared_data() else {
        return;
    };
    let file = data_root.join("transcripts/claude-code/short.jsonl");
    let (_tmp, data) = common::temp_data_dir();
    import_file(&data.store, &file, &ImportOptions::default(), |_, _| {}).unwrap();
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    let page = grep(
        &data.store,
        &data.index,
        &lcm::core::config::SearchConfig::default(),
        &GrepRequest {
            pattern: "phoenix server start".into(),
            mode: GrepMode::FullText,
            scope: Scope::default(),
            limit: Some(5),
            cursor: None,
        },
    )
    .unwrap();
    assert!(!page.hits.is_empty());
    let top = data.store.message(page.hits[0].message).unwrap();
    let text = top.search_text().to_lowercase();
    assert!(
        text.contains("phoenix") || text.contains("server"),
        "{text}"
    );
    assert!(page.hits.windows(2).all(|w| w[0].score >= w[1].score));
}
