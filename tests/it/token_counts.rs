//! lcm's fast token counter against tiktoken-rs on every message of the real Claude Code
//! transcripts in ../shared/data: identical counts for o200k_base and cl100k_base, for every part
//! text, every whole message, every string value of every line and every raw line.

use crate::common;

use lcm::core::formats::{Format, LineContext, LineOutcome, parse_line};
use lcm::{Encoding, TokenCounter};
use serde_json::Value;

fn string_values<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| string_values(v, out)),
        Value::Object(fields) => fields.values().for_each(|v| string_values(v, out)),
        _ => {}
    }
}

#[test]
fn fast_counts_equal_tiktoken_on_every_real_message() {
    let Some(data_root) = common::shared_data() else {
        return;
    };
    let dir = data_root.join("transcripts/claude-code");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("transcripts folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 4,
        "expected the real sessions in {}",
        dir.display()
    );
    let counters = [Encoding::O200kBase, Encoding::Cl100kBase].map(TokenCounter::new);

    let (mut messages, mut texts, mut bytes) = (0usize, 0usize, 0usize);
    let mut mismatches = Vec::new();
    let mut check = |text: &str| {
        texts += 1;
        bytes += text.len();
        for counter in &counters {
            let (fast, reference) = (counter.count_text(text), counter.reference_count(text));
            if fast != reference {
                mismatches.push(format!(
                    "{:?}: {fast} vs tiktoken-rs {reference}: {:?}",
                    counter.encoding(),
                    text.chars().take(120).collect::<String>()
                ));
            }
        }
    };
    for file in &files {
        let raw = std::fs::read_to_string(file).expect("read transcript");
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
        let stem = stem.unwrap_or_default();
        for (n, line) in raw.lines().enumerate().filter(|(_, l)| !l.is_empty()) {
            let ctx = LineContext {
                line: n as u64 + 1,
                default_session_key: &stem,
            };
            if let Ok(LineOutcome::Messages(parsed)) =
                parse_line(Format::ClaudeCode, line.as_bytes(), &ctx)
            {
                for m in parsed {
                    messages += 1;
                    let parts = &m.message.parts;
                    for text in parts.iter().filter_map(|p| p.searchable_text()) {
                        check(&text);
                    }
                    check(&lcm::core::message::search_text(parts));
                }
            }
            let entry: Value = serde_json::from_str(line).expect("a JSON line");
            let mut values = Vec::new();
            string_values(&entry, &mut values);
            values.into_iter().for_each(&mut check);
            check(line);
        }
    }
    eprintln!(
        "{} files, {messages} messages, {texts} texts ({:.1} MB) counted with o200k_base and \
         cl100k_base: {} mismatches",
        files.len(),
        bytes as f64 / 1e6,
        mismatches.len()
    );
    assert!(messages > 1_000, "only {messages} messages parsed");
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first ones:\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(10)].join("\n")
    );
}
