//! The compaction control loop: zero-cost below the soft threshold; real sessions replayed turn
//! by turn under a 32k budget stay under it, and every message stays reachable exactly once;
//! leaf spans never split a tool call from its result; a misbehaving provider still converges
//! with bounded calls.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use lcm_core::config::CompactionConfig;
use lcm_core::formats::{Format, LineContext, LineOutcome, parse_line};
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::{NodeRef, SummaryKind};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::compaction::SUMMARY_HEADER_TOKENS;
use lcm_engine::{ContextItem, assemble, compact, needs_compaction, render_summary};
use lcm_llm::extractive::ExtractiveSummarizer;
use lcm_llm::http::HttpConfig;
use lcm_llm::openai::OpenAiProvider;
use lcm_llm::summarize::LlmSummarizer;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use lcm_store::{Store, StoreOptions};

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn store() -> Store {
    Store::open_in_memory(StoreOptions { counter: counter() }).unwrap()
}

/// Every message reachable from the context (summaries walked down, then the raw tail).
fn reachable(store: &Store, session: SessionId) -> Vec<MessageId> {
    store.context_messages(session).unwrap()
}

#[tokio::test]
async fn below_the_soft_threshold_nothing_is_summarised() {
    let server = ScriptedServer::start().await;
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "m")).unwrap();
    let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "m");
    let store = store();
    let s = store.create_session("s", None).unwrap();
    for i in 0..50 {
        store
            .append(
                s,
                NewMessage::text(Role::User, format!("short message {i}")),
            )
            .unwrap();
    }
    let tokens = assemble(&store, s).unwrap().tokens;
    let budget = tokens * 2;
    assert!(!needs_compaction(
        tokens,
        budget,
        &CompactionConfig::default()
    ));
    let report = compact(
        &store,
        s,
        budget,
        &CompactionConfig::default(),
        &summarizer,
        |_| {},
    )
    .await
    .unwrap();
    assert!(report.passes.is_empty() && report.reached_goal);
    assert_eq!(
        server.request_count(),
        0,
        "no provider call below the soft threshold"
    );
    assert_eq!(store.summary_count().unwrap(), 0);
}

#[tokio::test]
async fn real_sessions_turn_by_turn_stay_under_a_32k_budget_and_lose_nothing() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/transcripts/claude-code");
    if !dir.is_dir() {
        eprintln!("SKIPPED: {} is absent", dir.display());
        return;
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "jsonl")
                && p.file_stem().is_some_and(|s| s.len() == 36)
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 4);
    let budget = 32_000u64;
    let config = CompactionConfig::default();
    let summarizer = ExtractiveSummarizer::new(counter());
    for file in files {
        let store = store();
        let session = store.create_session("replay", None).unwrap();
        let text = std::fs::read(&file).unwrap();
        let mut appended = 0;
        let mut compactions = 0;
        for (i, line) in text.split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let ctx = LineContext {
                line: i as u64 + 1,
                default_session_key: "x",
            };
            let Ok(LineOutcome::Messages(messages)) = parse_line(Format::ClaudeCode, line, &ctx)
            else {
                continue;
            };
            for m in messages {
                store.append(session, m.message).unwrap();
                appended += 1;
            }
            let tokens = assemble(&store, session).unwrap().tokens;
            if needs_compaction(tokens, budget, &config) {
                let report = compact(&store, session, budget, &config, &summarizer, |_| {})
                    .await
                    .unwrap();
                compactions += 1;
                assert_eq!(
                    report.provider_calls,
                    report.passes.iter().map(|p| p.provider_calls).sum::<u32>()
                );
            }
            let ctx = assemble(&store, session).unwrap();
            assert!(
                ctx.tokens <= budget,
                "{}: {} tokens over the budget after line {}",
                file.display(),
                ctx.tokens,
                i + 1
            );
            // The stored token count of every summary covers its rendering.
            for item in &ctx.items {
                if let ContextItem::Summary { summary, rendered } = item {
                    assert!(
                        counter().count_text(rendered) as u32 <= summary.token_count + 8,
                        "{}",
                        summary.id
                    );
                }
            }
        }
        assert!(compactions > 0, "{}: never compacted", file.display());
        // Every original message is reachable from the context, exactly once, in order.
        let all: Vec<MessageId> = store
            .session_messages(session, 0..u64::MAX)
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(all.len(), appended);
        assert_eq!(reachable(&store, session), all, "{}", file.display());
        // Leaf spans never end between a tool call and its result.
        for s in store.session_summaries(session).unwrap() {
            if s.kind != SummaryKind::Leaf {
                continue;
            }
            let mut open = HashSet::new();
            for source in &s.sources {
                let NodeRef::Message(id) = source else {
                    unreachable!()
                };
                for part in store.message(*id).unwrap().parts {
                    match part {
                        Part::ToolCall { id, .. } => {
                            open.insert(id);
                        }
                        Part::ToolResult { call_id, .. } => {
                            open.remove(&call_id);
                        }
                        _ => {}
                    }
                }
            }
            assert!(
                open.is_empty(),
                "{} splits tool calls {open:?} from their results",
                s.id
            );
        }
        let depths: HashSet<u32> = store
            .session_summaries(session)
            .unwrap()
            .iter()
            .map(|s| s.depth)
            .collect();
        eprintln!(
            "{}: {appended} messages, {compactions} compactions, depths {depths:?}",
            file.display()
        );
    }
}

#[tokio::test]
async fn a_provider_that_always_fails_still_converges_with_bounded_calls() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::garbage("not json"));
    let provider =
        OpenAiProvider::new(HttpConfig::new(server.url(), "m").with_max_retries(0)).unwrap();
    let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "m");
    let store = store();
    let s = store.create_session("s", None).unwrap();
    for i in 0..120 {
        let text = format!("message {i}: {}", "lorem ipsum dolor sit amet ".repeat(40));
        store
            .append(
                s,
                NewMessage::text(
                    if i % 2 == 0 {
                        Role::User
                    } else {
                        Role::Assistant
                    },
                    text,
                ),
            )
            .unwrap();
    }
    let budget = 8_000;
    let config = CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 3_000,
        ..CompactionConfig::default()
    };
    let report = compact(&store, s, budget, &config, &summarizer, |_| {})
        .await
        .unwrap();
    assert!(report.reached_goal, "{report:?}");
    assert!(report.passes.iter().all(|p| p.level == 3));
    assert!(report.provider_calls <= 2 * report.passes.len() as u32);
    // The circuit breaker opens after five failures: later calls fail fast without a request.
    assert!(server.request_count() as u32 <= report.provider_calls);
    assert!(server.request_count() >= 5);
    let ctx = assemble(&store, s).unwrap();
    assert!(ctx.tokens <= (config.soft_threshold * budget as f64) as u64);
    // Level-3 summaries say what was cut.
    let first = store.session_summaries(s).unwrap().remove(0);
    assert!(
        render_summary(&first).contains("truncated from"),
        "{}",
        first.content
    );
    assert!(first.token_count >= SUMMARY_HEADER_TOKENS);
}

#[tokio::test]
async fn every_run_ends_under_the_hard_threshold_when_the_last_two_messages_fit() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let config = CompactionConfig::default();
    for (messages, budget) in [
        (10usize, 600u64),
        (22, 700),
        (60, 900),
        (200, 1_500),
        (200, 700),
    ] {
        let store = store();
        let s = store.create_session("s", None).unwrap();
        for i in 0..messages {
            let text = format!(
                "turn {i}: we decided to keep file src/module_{i}.rs and fix error E{i:04} next. {}",
                "Some narrative detail follows here. ".repeat(3 + i % 5)
            );
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            store.append(s, NewMessage::text(role, text)).unwrap();
        }
        let last_two: u64 = store
            .session_messages(s, (messages as u64 - 2)..u64::MAX)
            .unwrap()
            .iter()
            .map(|m| u64::from(m.token_count))
            .sum();
        let hard = (config.hard_threshold * budget as f64) as u64;
        assert!(
            last_two < hard,
            "test setup: the last two messages must fit"
        );
        let report = compact(&store, s, budget, &config, &summarizer, |_| {})
            .await
            .unwrap();
        let tokens = assemble(&store, s).unwrap().tokens;
        assert!(
            tokens <= hard,
            "{messages} messages, budget {budget}: {tokens} > {hard}: {report:?}"
        );
        assert_eq!(reachable(&store, s).len(), messages);
        assert!(report.passes.len() <= config.max_passes);
    }
}

#[test]
fn the_safety_margin_is_kept_free() {
    use lcm_engine::effective_budget;
    assert_eq!(effective_budget(32_000, 0.05), 30_400);
    assert_eq!(effective_budget(32_000, 0.0), 32_000);
    // Out-of-range margins are clamped (the configuration rejects them anyway).
    assert_eq!(effective_budget(1_000, 0.9), 500);
}

/// Compaction converges under the hard threshold, with bounded provider calls, whatever the
/// provider does: answers normally, answers too long, rate-limits with Retry-After, fails with
/// 500s, times out, sends garbage, sends nothing, or only reasons.
#[tokio::test]
async fn compaction_converges_for_every_provider_behaviour() {
    use std::time::Duration;
    let long = "word ".repeat(5_000);
    let cases: Vec<(&str, Vec<ScriptedReply>, ScriptedReply)> = vec![
        (
            "normal",
            vec![],
            ScriptedReply::ok("Decided: keep src/lib.rs; error E1 fixed."),
        ),
        ("oversized", vec![], ScriptedReply::ok(long.clone())),
        (
            "429 then fine",
            vec![ScriptedReply::rate_limited("1")],
            ScriptedReply::ok("Short summary after a rate limit."),
        ),
        ("500s", vec![], ScriptedReply::status(500)),
        (
            "timeouts",
            vec![],
            ScriptedReply::delayed(Duration::from_secs(2), ScriptedReply::ok("too late")),
        ),
        (
            "garbage",
            vec![],
            ScriptedReply::garbage("<html>oops</html>"),
        ),
        ("empty", vec![], ScriptedReply::Empty),
        (
            "reasoning only",
            vec![],
            ScriptedReply::reasoning_only("thinking..."),
        ),
    ];
    for (name, script, default) in cases {
        let server = ScriptedServer::start().await;
        server.set_default(default);
        for reply in script {
            server.push(reply);
        }
        let http = HttpConfig::new(server.url(), "m")
            .with_max_retries(1)
            .with_timeout(Duration::from_millis(300));
        let provider = OpenAiProvider::new(http).unwrap();
        let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "m");
        let store = store();
        let s = store.create_session("s", None).unwrap();
        for i in 0..40 {
            let text = format!(
                "message {i}: {}",
                "we changed the retry policy and the file src/retry.rs. ".repeat(20)
            );
            store.append(s, NewMessage::text(Role::User, text)).unwrap();
        }
        let budget = 6_000;
        let config = CompactionConfig {
            fresh_tail: 4,
            leaf_chunk_tokens: 2_500,
            ..CompactionConfig::default()
        };
        let report = compact(&store, s, budget, &config, &summarizer, |_| {})
            .await
            .unwrap();
        let tokens = assemble(&store, s).unwrap().tokens;
        let hard = (config.hard_threshold * budget as f64) as u64;
        assert!(tokens <= hard, "{name}: {tokens} > {hard}: {report:?}");
        assert!(report.reached_goal, "{name}: {report:?}");
        // At most two summariser calls per pass, and each call makes at most max_retries + 1
        // requests.
        assert!(
            report.provider_calls <= 2 * report.passes.len() as u32,
            "{name}"
        );
        assert!(
            server.request_count() as u32 <= 2 * report.provider_calls,
            "{name}"
        );
        assert_eq!(reachable(&store, s).len(), 40, "{name}");
        let levels: Vec<u8> = report.passes.iter().map(|p| p.level).collect();
        match name {
            "normal" | "429 then fine" => {
                assert!(levels.iter().all(|l| *l == 1), "{name}: {levels:?}")
            }
            "oversized" => assert!(levels.iter().all(|l| *l == 3), "{name}: {levels:?}"),
            _ => assert!(levels.iter().all(|l| *l == 3), "{name}: {levels:?}"),
        }
    }
}
