//! The retrieval tools on the four real Claude Code sessions of `../shared/data`: each session is
//! imported, compacted for a small budget with the extractive summariser and indexed; then, for
//! 800 strings sampled deterministically from the original messages (200 per session),
//! `lcm_grep` finds the message they come from and reports the summary covering it, and
//! `lcm_expand` (as a sub-agent) from that summary returns text containing the string verbatim.
//! Skips with a message when the data is absent.

use std::sync::Arc;
use std::time::Instant;

use lcm_core::config::{CompactionConfig, Config};
use lcm_core::ids::{MessageId, SummaryId};
use lcm_core::message::Part;
use lcm_core::rng::SplitMix64;
use lcm_core::summary::NodeRef;
use lcm_core::tokens::TokenCounter;
use lcm_engine::compact;
use lcm_engine::tools::{Caller, ToolContext, ToolRegistry};
use lcm_llm::ExtractiveSummarizer;
use lcm_search::SearchIndex;
use lcm_store::import::{ImportOptions, import_file};
use lcm_store::{Store, StoreOptions};
use serde_json::{Value, json};

use crate::common::{real_sessions, shared_data};

/// Strings sampled per session.
const SAMPLES_PER_SESSION: usize = 200;
/// The window the sessions are compacted for: small, so that nearly every message ends up under
/// a summary, several levels deep (condensed fanout 2).
const BUDGET: u64 = 8_000;

/// `regex::escape`: a backslash before each regex meta character.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A window of 20-40 characters of `text` with enough letters and digits to be distinctive.
fn sample_window(rng: &mut SplitMix64, text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() < 40 {
        return None;
    }
    for _ in 0..8 {
        let len = 20 + rng.index(21);
        let start = rng.index(chars.len() - len);
        let window: String = chars[start..start + len].iter().collect();
        if window.chars().filter(|c| c.is_alphanumeric()).count() >= 14 {
            return Some(window);
        }
    }
    None
}

/// The samples of one session: (message, string).
fn samples(
    store: &Store,
    session: lcm_core::ids::SessionId,
    seed: u64,
) -> Vec<(MessageId, String)> {
    let messages = store.session_messages(session, 0..u64::MAX).unwrap();
    let mut rng = SplitMix64::new(seed);
    let mut out = Vec::new();
    let mut tries = 0;
    while out.len() < SAMPLES_PER_SESSION && tries < 100_000 {
        tries += 1;
        let m = &messages[rng.index(messages.len())];
        let texts: Vec<&str> = m
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                Part::ToolResult { content, .. } => Some(content.as_str()),
                _ => None,
            })
            .collect();
        if texts.is_empty() {
            continue;
        }
        let text = texts[rng.index(texts.len())];
        if let Some(window) = sample_window(&mut rng, text) {
            out.push((m.id, window));
        }
    }
    assert_eq!(out.len(), SAMPLES_PER_SESSION, "not enough text to sample");
    out
}

async fn call(registry: &ToolRegistry, ctx: &ToolContext, name: &str, args: Value) -> Value {
    registry
        .call(ctx, name, args.clone())
        .await
        .unwrap_or_else(|e| panic!("{name} {args}: {e}"))
}

/// Pages through `lcm_grep` until the hit for `target` shows up: (hit, its group).
async fn grep_for(
    registry: &ToolRegistry,
    ctx: &ToolContext,
    pattern: &str,
    target: MessageId,
) -> Option<(Value, Value)> {
    let mut args = json!({"pattern": pattern, "limit": 50, "max_tokens": 32000});
    for _ in 0..200 {
        let page = call(registry, ctx, "lcm_grep", args.clone()).await;
        for group in page["groups"].as_array().unwrap() {
            for hit in group["hits"].as_array().unwrap() {
                if hit["id"] == target.to_string() {
                    return Some((hit.clone(), group.clone()));
                }
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => args["cursor"] = json!(c),
            None => return None,
        }
    }
    None
}

/// Pages through `lcm_expand` of `summary` until `target`'s content (pieces joined) contains
/// `needle`; the number of pages read.
async fn expand_finds(
    registry: &ToolRegistry,
    ctx: &ToolContext,
    summary: SummaryId,
    target: MessageId,
    needle: &str,
    token_cap: usize,
) -> Option<usize> {
    let mut args = json!({"summary_id": summary, "token_cap": token_cap});
    let mut content = String::new();
    for page_number in 1..=2_000 {
        let page = call(registry, ctx, "lcm_expand", args.clone()).await;
        assert!(page["tokens"].as_u64().unwrap() <= token_cap as u64);
        for item in page["items"].as_array().unwrap() {
            if item["id"] == target.to_string() {
                content.push_str(item["content"].as_str().unwrap());
                if content.contains(needle) {
                    return Some(page_number);
                }
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => args["cursor"] = json!(c),
            None => return None,
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_strings_are_found_by_grep_and_recovered_verbatim_by_expand() {
    let Some(data) = shared_data() else {
        return;
    };
    let files = real_sessions(&data);
    assert_eq!(files.len(), 4, "expected the four real sessions");
    let registry = ToolRegistry::with_builtins();
    let config = Arc::new(Config::default());
    let compaction = CompactionConfig {
        condensed_fanout: 2,
        max_passes: 1_000,
        ..CompactionConfig::default()
    };
    let mut total = 0;
    for (file_number, file) in files.iter().enumerate() {
        let started = Instant::now();
        let tmp = tempfile::tempdir().unwrap();
        let counter = TokenCounter::new(config.tokenizer.encoding());
        let store = Store::open(tmp.path().join("lcm.redb"), StoreOptions::new(counter)).unwrap();
        let report = import_file(&store, file, &ImportOptions::default(), |_, _| {}).unwrap();
        let session = report
            .sessions
            .iter()
            .max_by_key(|s| s.imported)
            .map(|s| s.id)
            .unwrap();
        let summarizer = ExtractiveSummarizer::new(counter);
        let compacted = compact(&store, session, BUDGET, &compaction, &summarizer, |_| {})
            .await
            .unwrap();
        let index = SearchIndex::open(tmp.path().join("index"), &store, &config.search).unwrap();
        index.catch_up(&store, |_, _| {}).unwrap();
        let store = Arc::new(store);
        let main = ToolContext::new(
            store.clone(),
            Some(Arc::new(index)),
            config.clone(),
            Caller::main_agent(Some(session)),
        );
        let sub = main.with_caller(Caller::sub_agent(Some(session), 1));
        let setup = started.elapsed();

        let mut covered = 0;
        let mut from_region = 0;
        for (i, (message, needle)) in samples(&store, session, 0x5eed + file_number as u64)
            .into_iter()
            .enumerate()
        {
            let pattern = escape(&needle);
            let (hit, group) = grep_for(&registry, &main, &pattern, message)
                .await
                .unwrap_or_else(|| panic!("{}: `{needle}` of {message} not found", file.display()));
            let direct = store.covering(NodeRef::Message(message)).unwrap();
            match direct {
                None => {
                    assert_eq!(group["region"], "raw_tail", "{message}");
                    assert!(hit.get("covered_by").is_none());
                }
                Some(leaf) => {
                    covered += 1;
                    assert_eq!(hit["covered_by"], leaf.to_string(), "{message}");
                    let mut top = leaf;
                    while let Some(up) = store.covering(NodeRef::Summary(top)).unwrap() {
                        top = up;
                    }
                    assert_eq!(group["region"], top.to_string(), "{message}");
                    // The covering summary, expanded, gives the string back verbatim.
                    assert!(
                        expand_finds(&registry, &sub, leaf, message, &needle, 20_000)
                            .await
                            .is_some(),
                        "{}: expanding {leaf} does not give back `{needle}` of {message}",
                        file.display()
                    );
                    // Now and then from the region (the summary in the context), page by page.
                    if i % 8 == 0 && top != leaf {
                        from_region += 1;
                        assert!(
                            expand_finds(&registry, &sub, top, message, &needle, 60_000)
                                .await
                                .is_some(),
                            "{}: expanding {top} does not give back `{needle}` of {message}",
                            file.display()
                        );
                    }
                }
            }
            total += 1;
        }
        assert!(
            covered * 2 > SAMPLES_PER_SESSION,
            "{}: most samples should be under a summary ({covered})",
            file.display()
        );
        let depth = store
            .session_summaries(session)
            .unwrap()
            .iter()
            .map(|s| s.depth)
            .max()
            .unwrap_or(0);
        assert!(depth >= 1, "{}: no condensed summary", file.display());
        eprintln!(
            "{}: {} messages, {} summaries up to depth {depth} ({} passes), {covered}/{SAMPLES_PER_SESSION} samples covered, {from_region} also found from their region; setup {:.1?}, total {:.1?}",
            file.file_name().unwrap().to_string_lossy(),
            report.imported,
            store.summary_count().unwrap(),
            compacted.passes.len(),
            setup,
            started.elapsed()
        );
    }
    assert_eq!(total, 4 * SAMPLES_PER_SESSION);
}
