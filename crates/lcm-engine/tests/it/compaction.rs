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

use crate::common;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn store() -> Store {
    Store::open_in_memory(StoreOptions::new(counter())).unwrap()
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
    let Some(data) = common::shared_data() else {
        return;
    };
    let files = common::real_sessions(&data);
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
    // Level 3 wrote the offline summary of each span (no model needed), not a truncation.
    let first = store.session_summaries(s).unwrap().remove(0);
    assert_eq!(first.model, "structured");
    assert!(
        first.content.starts_with("msg_0: message 0:"),
        "{}",
        first.content
    );
    assert!(
        !render_summary(&first).contains("truncated from"),
        "{}",
        first.content
    );
    assert!(first.token_count >= SUMMARY_HEADER_TOKENS);
}

/// A model that loops (what SmolLM2-135M answered in session 42's probe): every answer is
/// refused, and the offline summary of the span keeps what the model lost.
#[tokio::test]
async fn a_model_that_loops_is_refused_and_the_spans_facts_are_kept() {
    let server = ScriptedServer::start().await;
    let looping = "I'm glad to help you with your project! Please share the details of your \
                   project! Please share the details of your project!\n\n"
        .repeat(12);
    server.set_default(ScriptedReply::ok(looping));
    let provider =
        OpenAiProvider::new(HttpConfig::new(server.url(), "m").with_max_retries(0)).unwrap();
    let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "tiny");
    let store = store();
    let s = store.create_session("s", None).unwrap();
    for i in 0..40 {
        let ticket = format!("INV-{}", 4800 + i);
        store
            .append(
                s,
                NewMessage::text(
                    Role::User,
                    format!(
                        "Deploy ticket {ticket} to staging. {}",
                        "Notes. ".repeat(60)
                    ),
                ),
            )
            .unwrap();
        let call = format!("call_{i}");
        store
            .append(
                s,
                NewMessage {
                    parts: vec![Part::ToolCall {
                        id: call.clone(),
                        name: "Bash".into(),
                        arguments: format!(r#"{{"command":"deploy --ticket {ticket} staging"}}"#),
                    }],
                    ..NewMessage::text(Role::Assistant, "")
                },
            )
            .unwrap();
        store
            .append(
                s,
                NewMessage {
                    parts: vec![Part::ToolResult {
                        call_id: call,
                        content: format!("deployed {ticket}: ok"),
                        is_error: false,
                    }],
                    ..NewMessage::text(Role::Tool, "")
                },
            )
            .unwrap();
    }
    let config = CompactionConfig {
        fresh_tail: 4,
        ..CompactionConfig::default()
    };
    let report = compact(&store, s, 6_000, &config, &summarizer, |_| {})
        .await
        .unwrap();
    assert!(report.reached_goal, "{report:?}");
    assert!(server.request_count() >= 2, "the model was asked");
    let summaries = store.session_summaries(s).unwrap();
    assert!(!summaries.is_empty());
    for summary in &summaries {
        assert_eq!((summary.level, summary.model.as_str()), (3, "structured"));
        assert!(
            !summary.content.contains("Please share"),
            "{}",
            summary.content
        );
    }
    // The first leaf names the requests and the commands of its span, in their own words.
    let first = &summaries[0];
    assert!(
        first.content.contains("Deploy ticket INV-4800"),
        "{}",
        first.content
    );
    assert!(
        first.content.contains("deploy --ticket INV-4800"),
        "{}",
        first.content
    );
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

/// Every message of the session, oldest first.
fn all_messages(store: &Store, session: SessionId) -> Vec<MessageId> {
    store
        .session_messages(session, 0..u64::MAX)
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect()
}

/// Panics if a leaf summary of the session ends between a tool call and its result.
fn assert_leaf_spans_closed(store: &Store, session: SessionId) {
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
}

/// A message of about `sentences` x 20 tokens with varied, summarisable text.
fn long_text(tag: usize, sentences: usize) -> String {
    (0..sentences)
        .map(|j| {
            format!(
                "Step {tag}.{j}: we changed src/module_{tag}/part_{j}.rs and fixed error E{j:04} in run {tag}. "
            )
        })
        .collect()
}

/// Prose that opens no commitment (no steps, fixes or errors): the context is summaries and
/// messages only.
fn plain_text(tag: usize, sentences: usize) -> String {
    (0..sentences)
        .map(|j| {
            format!("Note {tag}.{j}: the survey of region {j} counted {tag} birds near the lake. ")
        })
        .collect()
}

/// An assistant message calling tool `id`, and the tool's result.
fn tool_exchange(id: &str, result: String) -> [NewMessage; 2] {
    let mut call = NewMessage::text(Role::Assistant, "Let me look.");
    call.parts.push(Part::ToolCall {
        id: id.to_owned(),
        name: "Bash".into(),
        arguments: r#"{"command":"cat log"}"#.into(),
    });
    let mut result_message = NewMessage::text(Role::Tool, "");
    result_message.parts = vec![Part::ToolResult {
        call_id: id.to_owned(),
        content: result,
        is_error: false,
    }];
    [call, result_message]
}

/// A chunk-limited leaf span too small to pay for its summary header (a short message followed
/// by one larger than `leaf_chunk_tokens`) is extended over the next message, or the next tool
/// exchange whole, instead of being proposed as is; a span large enough stays within the chunk.
#[test]
fn plan_extends_a_leaf_span_too_small_to_pay_for_its_summary() {
    use lcm_engine::compaction::{Pass, plan};
    let config = CompactionConfig {
        fresh_tail: 2,
        leaf_chunk_tokens: 1_000,
        leaf_target_tokens: 300,
        ..CompactionConfig::default()
    };
    let leaf_span = |messages: Vec<NewMessage>| -> (Vec<MessageId>, Vec<MessageId>) {
        let store = store();
        let s = store.create_session("s", None).unwrap();
        for m in messages {
            store.append(s, m).unwrap();
        }
        store
            .append(s, NewMessage::text(Role::User, "tail one"))
            .unwrap();
        store
            .append(s, NewMessage::text(Role::User, "tail two"))
            .unwrap();
        let ctx = assemble(&store, s).unwrap();
        let Some(Pass::Leaf { messages }) = plan(&ctx.items, &config, false, u64::MAX, u64::MAX)
        else {
            panic!("no leaf pass planned");
        };
        (messages, all_messages(&store, s))
    };

    // A short message, then one larger than the chunk: both.
    let (span, all) = leaf_span(vec![
        NewMessage::text(Role::User, "ok, go on"),
        NewMessage::text(Role::Assistant, long_text(1, 60)),
        NewMessage::text(Role::User, "thanks"),
        NewMessage::text(Role::Assistant, long_text(2, 60)),
    ]);
    assert_eq!(span, all[..2]);

    // A short message, then a tool call whose result is larger than the chunk: the exchange
    // whole, never the call without its result.
    let [call, result] = tool_exchange("t1", long_text(3, 60));
    let (span, all) = leaf_span(vec![
        NewMessage::text(Role::User, "check the log"),
        call,
        result,
        NewMessage::text(Role::User, "and now?"),
        NewMessage::text(Role::Assistant, long_text(4, 60)),
    ]);
    assert_eq!(span, all[..3]);

    // Worth a summary but under the leaf target: still extended.
    let (span, all) = leaf_span(vec![
        NewMessage::text(Role::User, long_text(5, 9)),
        NewMessage::text(Role::Assistant, long_text(6, 60)),
        NewMessage::text(Role::User, long_text(7, 60)),
    ]);
    assert_eq!(span, all[..2]);

    // Large enough on its own: the span stays within the chunk.
    let (span, all) = leaf_span(vec![
        NewMessage::text(Role::User, long_text(8, 10)),
        NewMessage::text(Role::User, long_text(9, 10)),
        NewMessage::text(Role::Assistant, long_text(10, 60)),
        NewMessage::text(Role::User, long_text(11, 60)),
    ]);
    assert_eq!(span, all[..2]);
}

/// Regression: short messages alternating with messages (and tool results) larger than
/// `leaf_chunk_tokens` used to end the run at its first pass, the leaf span being only the short
/// message, too small to pay for a summary. Now the run reaches its goal, every pass shrinks
/// what it covers, and every message stays reachable exactly once.
#[tokio::test]
async fn short_messages_before_ones_larger_than_the_chunk_do_not_stop_the_run() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let config = CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 1_000,
        leaf_target_tokens: 300,
        ..CompactionConfig::default()
    };
    let store = store();
    let s = store.create_session("s", None).unwrap();
    for i in 0..12 {
        // A short question, a long answer, then a tool exchange with a long result.
        store
            .append(s, NewMessage::text(Role::User, format!("and step {i}?")))
            .unwrap();
        store
            .append(s, NewMessage::text(Role::Assistant, long_text(i, 60)))
            .unwrap();
        for m in tool_exchange(&format!("call_{i}"), long_text(100 + i, 70)) {
            store.append(s, m).unwrap();
        }
    }
    let messages = store.session_messages(s, 0..u64::MAX).unwrap();
    assert!(
        messages
            .iter()
            .filter(|m| m.token_count > config.leaf_chunk_tokens)
            .count()
            >= 24,
        "test setup: half the messages must be larger than the chunk"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.token_count <= SUMMARY_HEADER_TOKENS),
        "test setup: short messages must be too small to pay for a summary"
    );
    // The goal leaves room for the fresh tail (two long messages) and a few summaries.
    let budget = 10_000;
    let before = assemble(&store, s).unwrap().tokens;
    assert!(before > 4 * budget, "test setup: {before} tokens");
    let report = compact(&store, s, budget, &config, &summarizer, |_| {})
        .await
        .unwrap();
    assert!(report.reached_goal, "{report:?}");
    let goal = (config.soft_threshold * budget as f64) as u64;
    assert!(assemble(&store, s).unwrap().tokens <= goal);
    assert!(report.passes.len() <= config.max_passes);
    assert!(
        report
            .passes
            .iter()
            .all(|p| p.output_tokens < p.input_tokens),
        "{report:?}"
    );
    // Extended spans exceed the chunk.
    assert!(
        report
            .passes
            .iter()
            .any(|p| p.kind == SummaryKind::Leaf && p.input_tokens > config.leaf_chunk_tokens)
    );
    assert_eq!(reachable(&store, s), all_messages(&store, s));
    assert_leaf_spans_closed(&store, s);
}

/// Over the hard threshold with no raw span left, a lone summary too small to be worth
/// re-summarising used to end the run; now the next run of summaries is condensed instead.
#[tokio::test]
async fn a_tiny_lone_summary_does_not_stop_a_run_over_the_hard_threshold() {
    use lcm_core::summary::NewSummary;
    use lcm_engine::compaction::summary_tokens;
    use lcm_store::ApplyOutcome;
    let store = store();
    let s = store.create_session("s", None).unwrap();
    for i in 0..5 {
        store
            .append(s, NewMessage::text(Role::User, long_text(i, 40)))
            .unwrap();
    }
    for text in ["tail one", "tail two"] {
        store.append(s, NewMessage::text(Role::User, text)).unwrap();
    }
    let ids = all_messages(&store, s);
    let apply = |kind: SummaryKind, depth: u32, content: String, sources: Vec<NodeRef>| {
        let new = NewSummary {
            session: s,
            kind,
            depth,
            token_count: summary_tokens(counter(), &content),
            content,
            sources,
            level: 1,
            model: "test".into(),
            digest: None,
        };
        match store.apply_summary(new, Vec::new()).unwrap() {
            ApplyOutcome::Applied { summary, .. } => summary.id,
            ApplyOutcome::Stale { reason } => panic!("{reason}"),
        }
    };
    // Context: [tiny depth 1] [depth 0] [depth 0] + the two tail messages.
    let tiny = apply(
        SummaryKind::Leaf,
        0,
        "ok".into(),
        vec![NodeRef::Message(ids[0])],
    );
    apply(
        SummaryKind::Condensed,
        1,
        "ok".into(),
        vec![NodeRef::Summary(tiny)],
    );
    for pair in [[1, 2], [3, 4]] {
        apply(
            SummaryKind::Leaf,
            0,
            long_text(pair[0], 25),
            pair.iter().map(|i| NodeRef::Message(ids[*i])).collect(),
        );
    }
    let before = assemble(&store, s).unwrap().tokens;
    let budget = 1_000;
    let config = CompactionConfig {
        fresh_tail: 2,
        ..CompactionConfig::default()
    };
    let hard = (config.hard_threshold * budget as f64) as u64;
    assert!(before > hard, "test setup: {before} tokens");
    let report = compact(
        &store,
        s,
        budget,
        &config,
        &ExtractiveSummarizer::new(counter()),
        |_| {},
    )
    .await
    .unwrap();
    // Under the hard threshold the run may stop short of its goal (partial runs of summaries
    // are only condensed over it), but not before getting there.
    assert!(!report.passes.is_empty(), "{report:?}");
    assert!(report.tokens_after <= hard, "{report:?}");
    assert_eq!(reachable(&store, s), ids);
}

/// Regression on a real Claude Code session (258c7280: a few tool results larger than the chunk
/// after short messages): with 6k-token leaf chunks the run used to stop after 11 passes at
/// 145k -> 105k tokens; it must reach its goal under a 32k window, losing nothing.
#[tokio::test]
async fn real_session_with_6k_leaf_chunks_reaches_the_goal() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
        "../../../shared/data/transcripts/claude-code/258c7280-ae70-4798-800f-63464d01a85d.jsonl",
    );
    if !file.is_file() {
        eprintln!("SKIPPED: {} is absent", file.display());
        return;
    }
    let store = store();
    let session = store.create_session("replay", None).unwrap();
    let text = std::fs::read(&file).unwrap();
    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let ctx = LineContext {
            line: i as u64 + 1,
            default_session_key: "x",
        };
        if let Ok(LineOutcome::Messages(messages)) = parse_line(Format::ClaudeCode, line, &ctx) {
            for m in messages {
                store.append(session, m.message).unwrap();
            }
        }
    }
    let config = CompactionConfig {
        leaf_chunk_tokens: 6_000,
        ..CompactionConfig::default()
    };
    let budget = lcm_engine::effective_budget(32_000, 0.05);
    let before = assemble(&store, session).unwrap().tokens;
    assert!(before > 100_000, "{before} tokens");
    let report = compact(
        &store,
        session,
        budget,
        &config,
        &ExtractiveSummarizer::new(counter()),
        |_| {},
    )
    .await
    .unwrap();
    eprintln!(
        "{}: {} -> {} tokens in {} passes",
        file.display(),
        report.tokens_before,
        report.tokens_after,
        report.passes.len()
    );
    assert!(report.reached_goal, "{report:?}");
    assert!(report.passes.len() <= config.max_passes);
    assert!(
        report
            .passes
            .iter()
            .all(|p| p.output_tokens < p.input_tokens)
    );
    assert_eq!(reachable(&store, session), all_messages(&store, session));
    assert_leaf_spans_closed(&store, session);
}

/// History arriving in rounds, each compacted under a budget that holds only a summary or two
/// (an import compacted as it goes): when no two summaries of one depth stand side by side,
/// the run merges neighbours of different depths instead of re-summarising a lone summary one
/// level deeper, which used to build a chain of summaries each covering exactly what the one
/// below it covered. Nothing is lost, and the last run's report is the context's real size.
#[tokio::test]
async fn rounds_under_a_small_budget_merge_neighbours_instead_of_chaining() {
    let store = store();
    let s = store.create_session("s", None).unwrap();
    let config = CompactionConfig {
        fresh_tail: 4,
        ..CompactionConfig::default()
    };
    let budget = 3_000;
    let summarizer = ExtractiveSummarizer::new(counter());
    for round in 0..12 {
        for i in 0..30 {
            store
                .append(
                    s,
                    NewMessage::text(Role::Assistant, plain_text(round * 100 + i, 8)),
                )
                .unwrap();
        }
        loop {
            let report = compact(&store, s, budget, &config, &summarizer, |_| {})
                .await
                .unwrap();
            assert_eq!(
                report.tokens_after,
                assemble(&store, s).unwrap().tokens,
                "round {round}: the report measures the context as it stands"
            );
            if report.reached_goal || report.passes.is_empty() {
                let items: Vec<(bool, u64)> = assemble(&store, s)
                    .unwrap()
                    .items
                    .iter()
                    .map(|i| (matches!(i, ContextItem::Summary { .. }), i.tokens()))
                    .collect();
                assert!(report.reached_goal, "round {round}: {report:?} {items:?}");
                break;
            }
        }
    }
    let summaries = store.session_summaries(s).unwrap();
    let lone: Vec<_> = summaries
        .iter()
        .filter(|m| m.kind == SummaryKind::Condensed && m.sources.len() == 1)
        .map(|m| (m.id, m.depth))
        .collect();
    assert!(lone.is_empty(), "lone re-summarisations: {lone:?}");
    let deepest = summaries.iter().map(|m| m.depth).max().unwrap_or(0);
    assert!(deepest <= 12, "a DAG {deepest} levels deep after 12 rounds");
    assert_eq!(reachable(&store, s), all_messages(&store, s));
}

/// A whole imported history (many runs of `max_passes` passes, planned on a context patched
/// pass after pass rather than read again) ends exactly where a fresh assembly says, under the
/// goal, every message reachable once and no tool call cut from its result.
#[tokio::test]
async fn a_long_history_compacted_in_many_runs_ends_measured_and_whole() {
    let store = store();
    let s = store.create_session("s", None).unwrap();
    let mut batch = Vec::new();
    for i in 0..1_500 {
        if i % 5 == 0 {
            batch.extend(tool_exchange(&format!("call_{i}"), long_text(i, 3)));
        } else {
            batch.push(NewMessage::text(Role::User, long_text(i, 2)));
        }
    }
    store.append_batch(s, batch).unwrap();
    let config = CompactionConfig {
        leaf_chunk_tokens: 2_000,
        max_passes: 8,
        ..CompactionConfig::default()
    };
    let budget = 16_000;
    let summarizer = ExtractiveSummarizer::new(counter());
    let mut runs = 0;
    loop {
        runs += 1;
        let report = compact(&store, s, budget, &config, &summarizer, |_| {})
            .await
            .unwrap();
        assert!(report.passes.len() <= config.max_passes);
        assert_eq!(report.tokens_after, assemble(&store, s).unwrap().tokens);
        if report.reached_goal {
            break;
        }
        assert!(!report.passes.is_empty(), "{report:?}");
    }
    assert!(
        runs > 5,
        "the history took {runs} runs: not the case under test"
    );
    assert!(!needs_compaction(
        assemble(&store, s).unwrap().tokens,
        budget,
        &config
    ));
    assert_eq!(reachable(&store, s), all_messages(&store, s));
    assert_leaf_spans_closed(&store, s);
}

/// Regression (session 41): under a window so small that one summary of about its minimal size
/// stays over the hard threshold, each pass re-summarised that lone summary one level deeper
/// at the same size (the structured summariser writes a condensed summary from its sources'
/// digest: the first request kept whatever the target), so a single run wrote `max_passes`
/// (64) summaries of 166 tokens in a chain, and every later run as many again. Now a lone
/// summary is only summarised again while that can save tokens, a summary that would not
/// save enough is not applied, and runs after the first write nothing.
#[tokio::test]
async fn a_lone_summary_at_its_floor_is_not_summarised_again_and_again() {
    use lcm_llm::structured::StructuredSummarizer;
    use lcm_store::import::{ImportOptions, import_file};
    let store = store();
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/transcripts/demo-session.jsonl");
    let imported = import_file(&store, &demo, &ImportOptions::default(), |_, _| {}).unwrap();
    assert!(imported.imported >= 20, "{imported:?}");
    let s = store.sessions().unwrap()[0].id;
    let summarizer = StructuredSummarizer::new(counter());
    let config = CompactionConfig::default();
    // The demo's own compaction first (a 2,000-token window), then a 300-token one, thrice.
    compact(&store, s, 2_000, &config, &summarizer, |_| {})
        .await
        .unwrap();
    let mut reports = Vec::new();
    for _ in 0..3 {
        reports.push(
            compact(&store, s, 300, &config, &summarizer, |_| {})
                .await
                .unwrap(),
        );
    }
    let summaries = store.session_summaries(s).unwrap();
    let shape: Vec<_> = summaries
        .iter()
        .map(|x| (x.id, x.depth, x.sources.len(), x.token_count))
        .collect();
    assert!(summaries.len() <= 8, "{shape:?}: {reports:?}");
    // A lone summary summarised again saved at least 32 tokens on its source.
    let tokens = |id: NodeRef| {
        summaries
            .iter()
            .find(|x| NodeRef::Summary(x.id) == id)
            .map(|x| x.token_count)
    };
    for x in &summaries {
        if x.kind == SummaryKind::Condensed && x.sources.len() == 1 {
            let source = tokens(x.sources[0]).unwrap();
            assert!(
                x.token_count + 32 <= source,
                "{} ({} tokens) re-summarises {:?} ({source} tokens)",
                x.id,
                x.token_count,
                x.sources[0]
            );
        }
    }
    // Every pass applied saved tokens; the later runs found nothing worth doing.
    for report in &reports {
        assert!(
            report
                .passes
                .iter()
                .all(|p| p.output_tokens < p.input_tokens),
            "{report:?}"
        );
    }
    assert!(
        reports[1].passes.is_empty() && reports[2].passes.is_empty(),
        "{reports:?}"
    );
    assert!(reports.iter().all(|r| r.unproductive <= 1), "{reports:?}");
    // Nothing lost, and the context still fits the window (the rest is left out of it).
    assert_eq!(reachable(&store, s), all_messages(&store, s));
    let fitted = assemble(&store, s).unwrap().fit(300, 0, counter()).unwrap();
    assert!(fitted.tokens <= 300);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 24, ..Default::default() })]

    /// Whatever the session and however small the window, compaction with the default
    /// summariser only applies passes that shrink what they replace (a lone summary summarised
    /// again by at least 32 tokens), stops at the first that would not, and a run with nothing
    /// new to compact writes nothing: runs converge instead of chaining summaries.
    #[test]
    fn compaction_runs_converge_whatever_the_window(
        turns in proptest::collection::vec((0usize..4, 1usize..12), 2..30),
        budget in 200u64..3_000,
    ) {
        use lcm_llm::structured::StructuredSummarizer;
        let store = store();
        let s = store.create_session("s", None).unwrap();
        for (i, (shape, size)) in turns.iter().enumerate() {
            let message = match shape {
                0 => NewMessage::text(Role::User, format!("Please fix module {i} next. {}", plain_text(i, *size))),
                1 => NewMessage::text(Role::Assistant, format!("I'll run the tests after this. {}", long_text(i, *size))),
                2 => NewMessage::text(Role::Assistant, plain_text(i, *size)),
                _ => NewMessage::text(Role::User, long_text(i, *size)),
            };
            store.append(s, message).unwrap();
        }
        let config = CompactionConfig::default();
        let summarizer = StructuredSummarizer::new(counter());
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut reports = Vec::new();
        for _ in 0..3 {
            reports.push(
                runtime
                    .block_on(compact(&store, s, budget, &config, &summarizer, |_| {}))
                    .unwrap(),
            );
        }
        for report in &reports {
            proptest::prop_assert!(report.unproductive <= 1, "{report:?}");
            for pass in &report.passes {
                let lone = pass.kind == SummaryKind::Condensed && pass.sources == 1;
                let saved = pass.input_tokens.saturating_sub(pass.output_tokens);
                proptest::prop_assert!(
                    saved >= if lone { 32 } else { 1 },
                    "{pass:?} in {report:?}"
                );
            }
        }
        proptest::prop_assert!(reports[2].passes.is_empty(), "{reports:?}");
        proptest::prop_assert_eq!(reachable(&store, s), all_messages(&store, s));
    }
}
