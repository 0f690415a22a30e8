//! Opt-in: summarise through the escalation against a real model (the tiny local model of
//! `shared/tools/local-llm`, or any server speaking both shapes). Runs only when
//! `LCM_LLM_BASE_URL` is set (for example `http://127.0.0.1:8089/v1`); prints SKIPPED otherwise.

use std::sync::Arc;
use std::time::Duration;

use crate::common::counter;
use lcm_llm::{
    AnthropicProvider, EscalationLevel, HttpConfig, LlmSummarizer, OpenAiProvider, Provider,
    SummaryRequest, summarize_with_escalation, summary_defect,
};

const PARAGRAPH: &str = "The agent was asked to make the importer idempotent. It read \
crates/lcm-store/src/import.rs and saw that source keys were never checked before appending, so \
importing the same transcript twice stored every message twice. It decided to look up each source \
key in the session_sources table before writing a batch, changed append_batch accordingly, and \
ran cargo test -p lcm-store: 41 tests passed, but import_twice_is_idempotent failed once with \
error: duplicate message msg_41 because a batch contained the same key twice. It deduplicated keys \
inside the batch as well, and all 42 tests passed. Next step: add a property test for re-import \
after a crash and rerun the durability suite.";

/// Prints the SKIPPED line where a normal `cargo test` run shows it: the harness captures
/// `print!`/`eprint!` and the stderr handle, but not a freshly opened `/dev/stderr`.
fn skipped(reason: &str) {
    use std::io::Write as _;
    let line = format!("SKIPPED real_local_model: {reason}");
    match std::fs::OpenOptions::new().write(true).open("/dev/stderr") {
        Ok(mut stderr) => {
            let _ = writeln!(stderr, "{line}");
        }
        Err(_) => eprintln!("{line}"),
    }
}

#[tokio::test]
async fn real_local_model() {
    let Ok(base_url) = std::env::var("LCM_LLM_BASE_URL") else {
        skipped("LCM_LLM_BASE_URL is not set (see shared/tools/local-llm)");
        return;
    };
    let model = std::env::var("LCM_LLM_MODEL").unwrap_or_else(|_| "smollm2-135m-instruct".into());
    let config = HttpConfig::new(base_url, model.clone())
        .with_timeout(Duration::from_secs(120))
        .with_max_retries(1);
    let providers: Vec<Arc<dyn Provider>> = vec![
        Arc::new(OpenAiProvider::new(config.clone()).unwrap()),
        Arc::new(AnthropicProvider::new(config).unwrap()),
    ];
    let counter = counter();
    // The paragraph, and a span of a conversation as the engine renders it (the tiny model
    // tends to continue such a transcript, or to loop, rather than summarise it).
    let conversation: String = (0..6)
        .map(|i| {
            format!(
                "[msg_{} user 2026-11-29T11:4{i}:00Z]\nMy name is Ada and I deploy ticket \
                 INV-48{i:02} to staging. Please acknowledge briefly.\n\n[msg_{} assistant \
                 2026-11-29T11:4{i}:01Z]\nI'm glad to help with your project!\n\n",
                2 * i,
                2 * i + 1
            )
        })
        .collect();
    let contents = [PARAGRAPH.to_owned(), conversation];
    for (provider, content) in providers
        .into_iter()
        .flat_map(|p| contents.iter().map(move |c| (Arc::clone(&p), c)))
    {
        let input_tokens = counter.count_text(content) as u32;
        let name = provider.name().to_owned();
        let summarizer = LlmSummarizer::new(provider, counter, model.clone());
        let request = SummaryRequest {
            content: content.clone(),
            input_tokens,
            target_tokens: 50,
            depth: 0,
            digest: None,
        };
        let started = std::time::Instant::now();
        let outcome = summarize_with_escalation(&summarizer, counter, &request).await;
        println!(
            "{name}: level {} after {} call(s) in {:.1} s, {} -> {} tokens, errors {:?}\n{}",
            outcome.level.number(),
            outcome.calls,
            started.elapsed().as_secs_f64(),
            input_tokens,
            outcome.tokens,
            outcome.errors,
            outcome.text
        );
        assert!(outcome.tokens < input_tokens);
        assert!(outcome.calls <= 2);
        assert!(!outcome.text.trim().is_empty());
        // Whatever the model wrote, what a model level accepted is no looping or invented text.
        if outcome.level != EscalationLevel::Deterministic {
            assert_eq!(summary_defect(&outcome.text, content), None);
        }
    }
}
