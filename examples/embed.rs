//! Embedding lcm in an agent host: open a runtime, feed it a conversation turn by turn, and
//! send the model what `context` returns. Run it with `cargo run --example embed`.
//!
//! The budget is tiny on purpose, so that compaction happens within a few dozen turns; the
//! events show it running in the background, and the final context shows the summaries that
//! replaced the oldest turns (with the ids to expand them) followed by the fresh tail.

use std::time::Duration;

use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::engine::runtime::{Runtime, RuntimeEvent, RuntimeOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let mut config = Config::default();
    // Scaled down for a short demo; the defaults suit real models' windows.
    config.compaction.fresh_tail = 6;
    config.compaction.leaf_chunk_tokens = 400;
    config.compaction.leaf_target_tokens = 100;

    // The extractive summariser is the default: no network, no key.
    let runtime = Runtime::open(RuntimeOptions::dir(dir.path(), config)).await?;
    let mut events = runtime.subscribe();
    let session = runtime.session("demo-conversation").await?;

    let budget = 1_200; // the model's context window, in tokens
    for turn in 0..60u32 {
        let (role, text) = if turn.is_multiple_of(2) {
            (
                Role::User,
                format!(
                    "Question {turn}: how do we roll out service s{} safely?",
                    turn % 5
                ),
            )
        } else {
            (
                Role::Assistant,
                format!(
                    "Answer {turn}: canary 5% of s{} traffic, watch p99 latency and error budget for 30 minutes, then widen.",
                    turn % 5
                ),
            )
        };
        // A source key makes the append idempotent, so the runtime can retry it safely.
        session
            .append(NewMessage::text(role, text).with_source_key(format!("turn-{turn}")))
            .await?;
        // What to send to the model for this turn: always under the budget.
        let context = session.context(budget).await?;
        assert!(context.tokens <= budget);
    }

    while let Ok(event) = events.try_recv() {
        if let RuntimeEvent::CompactionFinished {
            passes,
            tokens_before,
            tokens_after,
            ..
        } = event
        {
            println!("compaction: {passes} passes, {tokens_before} -> {tokens_after} tokens");
        }
    }
    let context = session.context(budget).await?;
    println!(
        "\nfinal context: {} items, {} tokens",
        context.items.len(),
        context.tokens
    );
    for message in context.to_openai(None).iter().take(3) {
        let text = message["content"].as_str().unwrap_or_default();
        println!(
            "  {}: {}",
            message["role"],
            text.lines().next().unwrap_or_default()
        );
    }
    runtime.shutdown(Duration::from_secs(10)).await?;
    Ok(())
}
