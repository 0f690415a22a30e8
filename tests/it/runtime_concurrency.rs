//! Many sessions driven concurrently through the runtime's public API while compactions run:
//! 200 sessions x 500 turns with the extractive summariser, and 200 sessions with a real HTTP
//! summariser (the scripted loopback provider, with latency). Every session ends consistent:
//! every message stored once and reachable exactly once, under budget after every turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm::core::config::Config;
use lcm::core::ids::SessionId;
use lcm::core::message::{NewMessage, Role};
use lcm::core::tokens::{Encoding, TokenCounter};
use lcm::engine::runtime::{Runtime, RuntimeOptions};
use lcm::llm::extractive::ExtractiveSummarizer;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::summarize::{LlmSummarizer, Summarizer};
use lcm::llm::testing::{ScriptedReply, ScriptedServer};

const BUDGET: u64 = 3_000;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn config() -> Config {
    let mut config = Config::default();
    config.compaction.fresh_tail = 8;
    config.compaction.leaf_chunk_tokens = 800;
    config.compaction.leaf_target_tokens = 150;
    config.compaction.condensed_target_tokens = 200;
    config.runtime.index_interval_ms = 200;
    config.runtime.max_concurrent_compactions = 16;
    config
}

fn message(session: usize, turn: usize) -> NewMessage {
    let role = if turn.is_multiple_of(2) {
        Role::User
    } else {
        Role::Assistant
    };
    NewMessage::text(
        role,
        format!(
            "s{session} t{turn}: reviewed module m{} and its test suite; the flaky case \
             c{turn} passes after the fix",
            turn % 13
        ),
    )
    .with_source_key(format!("t{turn}"))
}

/// Runs `sessions` x `turns` concurrently; returns the session ids and the largest context.
async fn drive(rt: &Runtime, sessions: usize, turns: usize) -> (Vec<SessionId>, u64) {
    let mut tasks = Vec::new();
    for k in 0..sessions {
        let rt = rt.clone();
        tasks.push(tokio::spawn(async move {
            let s = rt.session(&format!("c{k}")).await.expect("session");
            let mut largest = 0;
            for t in 0..turns {
                s.append(message(k, t)).await.expect("append");
                let ctx = s.context(BUDGET).await.expect("context");
                assert!(ctx.tokens <= BUDGET, "{} > {BUDGET}", ctx.tokens);
                largest = largest.max(ctx.tokens);
            }
            (s.id(), largest)
        }));
    }
    let mut ids = Vec::new();
    let mut largest = 0;
    for t in tasks {
        let (id, l) = t.await.expect("session task");
        ids.push(id);
        largest = largest.max(l);
    }
    (ids, largest)
}

async fn check(rt: &Runtime, ids: &[SessionId], turns: usize) {
    for id in ids {
        let info = rt.store().session(*id).unwrap();
        assert_eq!(info.message_count, turns as u64);
        let reached = rt.store().context_messages(*id).unwrap();
        let stored: Vec<_> = rt
            .store()
            .session_messages(*id, 0..u64::MAX)
            .unwrap()
            .into_iter()
            .map(|m| m.id)
            .collect();
        assert_eq!(
            reached, stored,
            "{id}: every message reachable exactly once"
        );
        assert!(
            !rt.store().session_summaries(*id).unwrap().is_empty(),
            "{id} was compacted"
        );
    }
    let outcome = rt.check_integrity(false).await.unwrap();
    assert!(
        outcome.report.violations.is_empty(),
        "{:#?}",
        outcome.report.violations
    );
}

async fn open(summarizer: Arc<dyn Summarizer>) -> Runtime {
    Runtime::open(RuntimeOptions::in_memory(config()).with_summarizer(summarizer))
        .await
        .expect("runtime")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sessions_by_five_hundred_turns_with_the_extractive_summariser() {
    let rt = open(Arc::new(ExtractiveSummarizer::new(counter()))).await;
    let started = Instant::now();
    let (ids, largest) = drive(&rt, 200, 500).await;
    eprintln!(
        "200 x 500 turns in {:?}; largest context {largest} tokens; {:?}",
        started.elapsed(),
        rt.compactor_stats().await.unwrap()
    );
    check(&rt, &ids, 500).await;
    rt.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sessions_with_a_loopback_http_summariser_with_latency() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::ok(
        "The span reviewed modules and fixed flaky test cases; all pass now.",
    ));
    server.set_latency(Duration::from_millis(20));
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).unwrap();
    let summarizer = Arc::new(LlmSummarizer::new(
        Arc::new(provider),
        counter(),
        "scripted",
    ));
    let rt = open(summarizer).await;
    let started = Instant::now();
    let (ids, _) = drive(&rt, 200, 150).await;
    eprintln!(
        "200 x 150 turns over HTTP in {:?}; {} summariser requests",
        started.elapsed(),
        server.request_count()
    );
    assert!(server.request_count() > 0);
    check(&rt, &ids, 150).await;
    rt.shutdown(Duration::from_secs(10)).await.unwrap();
}
