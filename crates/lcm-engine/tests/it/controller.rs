//! The per-turn policy: below the soft threshold nothing is summarised; between soft and hard
//! the turn is not blocked while a compaction runs in the background; above hard the turn waits
//! until the context is back under it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm_core::config::CompactionConfig;
use lcm_core::message::{NewMessage, Role};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::ContextController;
use lcm_llm::http::HttpConfig;
use lcm_llm::openai::OpenAiProvider;
use lcm_llm::summarize::LlmSummarizer;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use lcm_store::{Store, StoreOptions};

use crate::common::intent_message;

const LATENCY: Duration = Duration::from_millis(400);

async fn setup() -> (
    ScriptedServer,
    ContextController,
    Arc<Store>,
    lcm_core::ids::SessionId,
) {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::ok(
        "Short summary: kept src/retry.rs and error E7.",
    ));
    server.set_latency(LATENCY);
    let counter = TokenCounter::new(Encoding::O200kBase);
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "m")).unwrap();
    let summarizer = Arc::new(LlmSummarizer::new(Arc::new(provider), counter, "m"));
    let store = Arc::new(Store::open_in_memory(StoreOptions::new(counter)).unwrap());
    let session = store.create_session("s", None).unwrap();
    let config = CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 3_000,
        max_passes: 4,
        ..CompactionConfig::default()
    };
    let controller = ContextController::new(Arc::clone(&store), summarizer, config);
    (server, controller, store, session)
}

fn fill(store: &Store, session: lcm_core::ids::SessionId, messages: usize) -> u64 {
    for i in 0..messages {
        let text = format!(
            "turn {i}: {}",
            "we changed the retry policy in src/retry.rs. ".repeat(10)
        );
        store
            .append(session, NewMessage::text(Role::User, text))
            .unwrap();
    }
    store.session(session).unwrap().token_total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_soft_nothing_runs() {
    let (server, controller, store, s) = setup().await;
    let tokens = fill(&store, s, 10);
    let ctx = controller.context_for_turn(s, tokens * 2).await.unwrap();
    assert_eq!(ctx.tokens, tokens);
    assert!(!controller.is_compacting(s));
    assert_eq!(server.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_soft_and_hard_the_turn_is_not_blocked() {
    let (server, controller, store, s) = setup().await;
    let tokens = fill(&store, s, 40);
    // tokens sit at 80% of the budget: over soft (75%), under hard (90%).
    let budget = tokens * 100 / 80;
    let started = Instant::now();
    let ctx = controller.context_for_turn(s, budget).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(
        ctx.tokens, tokens,
        "the current context is returned as it is"
    );
    assert!(
        elapsed < LATENCY,
        "the turn waited {elapsed:?} for the summariser"
    );
    assert!(controller.is_compacting(s));
    // The compaction finishes in the background and the next turn sees the smaller context.
    let report = controller.wait(s).await.unwrap().expect("a compaction ran");
    assert!(!report.passes.is_empty());
    assert!(server.request_count() > 0);
    let next = controller.context_for_turn(s, budget).await.unwrap();
    assert!(
        next.tokens < tokens && next.tokens * 100 <= budget * 75,
        "{} of {budget}",
        next.tokens
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_hard_the_turn_waits_until_under_it() {
    let (_server, controller, store, s) = setup().await;
    let tokens = fill(&store, s, 40);
    let budget = tokens * 100 / 120; // 120% of the budget
    let started = Instant::now();
    let ctx = controller.context_for_turn(s, budget).await.unwrap();
    assert!(
        started.elapsed() >= LATENCY,
        "the turn did not wait for the compaction"
    );
    assert!(
        ctx.tokens * 100 <= budget * 90,
        "{} of {budget}",
        ctx.tokens
    );
    assert!(!controller.is_compacting(s));
}

/// A context that compaction can do nothing more for (a window of a few hundred tokens, a
/// lone summary carrying its span's open commitments, which a summary of it carries again) is
/// returned without another compaction, so without the summariser call that would write and
/// discard the same summary, until the session changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_compaction_cannot_help_is_not_compacted_again_until_it_changes() {
    let (server, controller, store, s) = setup().await;
    server.set_latency(Duration::ZERO);
    let intents = |from: usize, to: usize| {
        for i in from..to {
            store.append(s, intent_message(i)).unwrap();
        }
    };
    intents(0, 14);
    let budget = 400;
    // Until the turns settle: the same number of summariser calls twice in a row.
    let mut calls = usize::MAX;
    for _ in 0..30 {
        let ctx = controller.context_for_turn(s, budget).await.unwrap();
        assert!(ctx.tokens <= budget, "{} > {budget}", ctx.tokens);
        controller.wait(s).await.unwrap();
        let now = server.request_count();
        if now == calls {
            break;
        }
        calls = now;
    }
    for _ in 0..5 {
        let ctx = controller.context_for_turn(s, budget).await.unwrap();
        assert!(ctx.tokens <= budget, "{} > {budget}", ctx.tokens);
        controller.wait(s).await.unwrap();
    }
    assert_eq!(server.request_count(), calls);
    // New messages change the context: compaction runs again and summarises them.
    intents(14, 20);
    controller.context_for_turn(s, budget).await.unwrap();
    controller.wait(s).await.unwrap();
    assert!(server.request_count() > calls);
}
