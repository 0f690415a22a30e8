//! The three-level escalation: through a real provider over loopback HTTP (level acceptance,
//! request counts, temperatures and prompts per level) and with plain summarisers for the edges.
//! Whatever happens, the result is smaller than the input and at most two calls are made.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{counter, fast_config, transcript};
use async_trait::async_trait;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use lcm_llm::{
    AnthropicProvider, Completion, EscalationLevel, ExtractiveSummarizer, LlmSummarizer,
    OpenAiProvider, Provider, ProviderError, Summarizer, SummaryCall, SummaryOutcome,
    SummaryRequest, summarize_with_escalation,
};

fn summary_request(content: String, target_tokens: u32, depth: u32) -> SummaryRequest {
    let input_tokens = counter().count_text(&content) as u32;
    SummaryRequest {
        content,
        input_tokens,
        target_tokens,
        depth,
        digest: None,
    }
}

fn openai_summarizer(server: &ScriptedServer, max_retries: u32) -> LlmSummarizer {
    let provider = OpenAiProvider::new(fast_config(server).with_max_retries(max_retries)).unwrap();
    LlmSummarizer::new(Arc::new(provider), counter(), "test-model")
}

fn assert_smaller(outcome: &SummaryOutcome, request: &SummaryRequest) {
    assert!(
        outcome.tokens < request.input_tokens,
        "{} tokens is not smaller than {}",
        outcome.tokens,
        request.input_tokens
    );
    assert_eq!(outcome.tokens as usize, counter().count_text(&outcome.text));
}

#[tokio::test]
async fn normal_path_is_accepted_at_level_one() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok(
        "  The importer was made idempotent; msg_41 fixed.  ",
    ));
    let summarizer = openai_summarizer(&server, 3);
    let request = summary_request(transcript(4), 120, 0);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Normal);
    assert_eq!(
        outcome.text,
        "The importer was made idempotent; msg_41 fixed."
    );
    assert_eq!(outcome.model, "test-model");
    assert_eq!(outcome.calls, 1);
    assert!(outcome.errors.is_empty());
    assert_smaller(&outcome, &request);

    let sent = server.requests();
    assert_eq!(sent.len(), 1);
    let body = &sent[0].body;
    assert_eq!(body["temperature"].to_string(), "0.2");
    assert_eq!(body["max_tokens"], 180);
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("untrusted DATA"));
    assert!(system.contains("leaf summary"));
    let user = body["messages"][1]["content"].as_str().unwrap();
    assert!(user.contains("narrative of about 120 tokens"));
    assert!(
        user.contains("crates/lcm-store/src/import.rs"),
        "the content is in the prompt"
    );
}

#[tokio::test]
async fn oversized_outputs_escalate_to_level_three_with_two_requests() {
    let server = ScriptedServer::start().await;
    let content = transcript(12);
    let oversized = format!("{content}\n{content}");
    server.set_default(ScriptedReply::ok(oversized));
    let summarizer = openai_summarizer(&server, 3);
    let request = summary_request(content, 300, 1);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert_eq!(outcome.model, "structured", "the offline summary, no model");
    assert_eq!(outcome.calls, 2);
    assert_eq!(
        server.request_count(),
        2,
        "oversized answers are not retried"
    );
    assert_eq!(outcome.errors.len(), 2);
    assert!(
        outcome.errors[0].starts_with("level 1: output of"),
        "{:?}",
        outcome.errors
    );
    assert!(
        outcome.errors[1].starts_with("level 2: output of"),
        "{:?}",
        outcome.errors
    );
    // The offline summary of the content (at half the target): its facts, not its head.
    assert!(outcome.tokens <= 150, "{}", outcome.tokens);
    assert!(!outcome.text.contains("truncated from"), "{}", outcome.text);
    assert!(outcome.text.contains("msg_41"), "{}", outcome.text);
    assert_smaller(&outcome, &request);

    // Level 2 asked for bullet points at half the target, cooler.
    let sent = server.requests();
    assert_eq!(sent[0].body["temperature"].to_string(), "0.2");
    assert_eq!(sent[1].body["temperature"].to_string(), "0.1");
    let aggressive = sent[1].body["messages"][1]["content"].as_str().unwrap();
    assert!(aggressive.contains("bullet points"));
    assert!(aggressive.contains("at most 150 tokens"));
    let system = sent[1].body["messages"][0]["content"].as_str().unwrap();
    assert!(system.contains("condensed summary"), "depth 1 prompt");
}

#[tokio::test]
async fn provider_errors_at_both_levels_fall_back_to_the_offline_summary() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(500));
    let summarizer = openai_summarizer(&server, 1);
    let request = summary_request(transcript(10), 200, 2);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert_eq!(outcome.calls, 2);
    // Two levels x (1 + max_retries) attempts: bounded.
    assert_eq!(server.request_count(), 4);
    assert!(
        outcome.errors.iter().all(|e| e.contains("provider error")),
        "{:?}",
        outcome.errors
    );
    assert_eq!(outcome.model, "structured");
    assert!(outcome.text.contains("import.rs"), "{}", outcome.text);
    assert_smaller(&outcome, &request);
}

#[tokio::test]
async fn timeouts_escalate() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::delayed(
        Duration::from_secs(3),
        ScriptedReply::ok("late"),
    ));
    let provider = OpenAiProvider::new(
        fast_config(&server)
            .with_max_retries(0)
            .with_timeout(Duration::from_millis(200)),
    )
    .unwrap();
    let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "slow");
    let request = summary_request(transcript(3), 100, 0);
    let started = std::time::Instant::now();
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert!(started.elapsed() < Duration::from_millis(2900));
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert!(
        outcome.errors[0].contains("did not answer in time"),
        "{:?}",
        outcome.errors
    );
    assert_smaller(&outcome, &request);
}

#[tokio::test]
async fn reasoning_only_and_empty_outputs_escalate() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::reasoning_only(
        "I should summarise this carefully...",
    ));
    server.push(ScriptedReply::ok("- importer idempotent\n- msg_41 fixed"));
    let provider = AnthropicProvider::new(fast_config(&server)).unwrap();
    let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "claude-test");
    let request = summary_request(transcript(5), 200, 0);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Aggressive);
    assert_eq!(outcome.calls, 2);
    assert_eq!(outcome.errors, ["level 1: reasoning only, no summary text"]);
    assert_eq!(outcome.text, "- importer idempotent\n- msg_41 fixed");
    assert_eq!(server.requests()[1].body["temperature"].to_string(), "0.1");
    assert!(
        server.requests()[1].body["system"]
            .as_str()
            .unwrap()
            .contains("untrusted")
    );
    assert_smaller(&outcome, &request);

    server.reset();
    server.push(ScriptedReply::Empty);
    server.push(ScriptedReply::ok("   "));
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert_eq!(
        outcome.errors,
        ["level 1: empty output", "level 2: empty output"]
    );
    assert_smaller(&outcome, &request);
}

#[tokio::test]
async fn garbage_and_open_circuit_escalate_without_hanging() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::garbage("not json"));
    let provider =
        OpenAiProvider::new(fast_config(&server).with_circuit(1, Duration::from_secs(60))).unwrap();
    let summarizer = LlmSummarizer::new(Arc::new(provider), counter(), "m");
    let request = summary_request(transcript(3), 100, 0);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert!(
        outcome.errors[0].contains("unparseable"),
        "{:?}",
        outcome.errors
    );
    assert!(
        outcome.errors[1].contains("circuit breaker open"),
        "{:?}",
        outcome.errors
    );
    assert_eq!(server.request_count(), 1);
    assert_smaller(&outcome, &request);
}

/// A summariser that answers from a fixed function of the call, for edge cases.
struct Fixed<F>(F);

#[async_trait]
impl<F> Summarizer for Fixed<F>
where
    F: Fn(&SummaryCall<'_>) -> Result<Completion, ProviderError> + Send + Sync,
{
    fn model(&self) -> &str {
        "fixed"
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        (self.0)(call)
    }
}

fn echo_content(call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
    Ok(Completion {
        text: format!("{} and more", call.content),
        ..Completion::default()
    })
}

#[tokio::test]
async fn result_is_always_smaller_than_the_input() {
    let inputs = [
        "ok".to_owned(),
        "A short line about msg_3.".to_owned(),
        transcript(1),
        transcript(5),
        transcript(9),
        transcript(40),
        "x".repeat(10_000),
        "漢字とかなが混ざった文章。".repeat(300),
    ];
    for content in inputs {
        let request = summary_request(content, 1200, 0);
        let outcome = summarize_with_escalation(&Fixed(echo_content), counter(), &request).await;
        assert_eq!(outcome.level, EscalationLevel::Deterministic);
        assert_eq!(outcome.calls, 2);
        assert_smaller(&outcome, &request);
        assert!(outcome.tokens <= 512);
        // The offline summary where it is smaller, else the head and tail with a marker.
        match outcome.model.as_str() {
            "structured" => assert!(!outcome.text.contains("truncated from")),
            "deterministic" if request.input_tokens >= 1024 => {
                assert!(outcome.text.contains("truncated from"), "{}", outcome.text);
            }
            "deterministic" => {}
            other => panic!("level 3 by {other}"),
        }
    }
}

/// An offline summariser answering [`echo_content`]: level 3 does not ask one a third time.
struct OfflineEcho;

#[async_trait]
impl Summarizer for OfflineEcho {
    fn model(&self) -> &str {
        "offline-echo"
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        echo_content(call)
    }

    fn is_offline(&self) -> bool {
        true
    }
}

#[tokio::test]
async fn the_offline_summariser_refused_twice_leaves_truncation() {
    let request = summary_request(transcript(40), 1200, 0);
    let outcome = summarize_with_escalation(&OfflineEcho, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert_eq!(outcome.model, "deterministic");
    assert!(outcome.text.contains("truncated from"), "{}", outcome.text);
    assert!(outcome.text.starts_with("Round 0."));
    assert!(outcome.tokens <= 512);
    assert_smaller(&outcome, &request);
}

/// What SmolLM2-135M wrote as summaries through the proxy (session 42's probe): the same
/// sentences until its token limit, and a continuation of the transcript with messages that
/// were not in its span.
const LOOPING: &str = "I'm glad to help you with your project! Please share the details of your project! Please share the details of your project!";

fn looping_answer(lines: usize) -> String {
    vec![LOOPING; lines].join("\n\n")
}

#[tokio::test]
async fn a_model_that_repeats_itself_is_refused_and_the_offline_summary_kept() {
    let server = ScriptedServer::start().await;
    // One sentence over and over on one line, then the same line again and again.
    server.push(ScriptedReply::ok(format!("{LOOPING} {LOOPING} {LOOPING}")));
    server.push(ScriptedReply::ok(looping_answer(6)));
    let summarizer = openai_summarizer(&server, 0);
    let request = summary_request(transcript(12), 400, 1);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert_eq!(outcome.model, "structured");
    assert_eq!(outcome.calls, 2);
    assert!(
        outcome.errors[0].starts_with("level 1: repeats itself")
            && outcome.errors[0].contains("four-word sequences"),
        "{:?}",
        outcome.errors
    );
    assert!(
        outcome.errors[1].starts_with("level 2: repeats itself: 5 of its 6 lines"),
        "{:?}",
        outcome.errors
    );
    assert!(outcome.text.contains("msg_41"), "{}", outcome.text);
    assert_smaller(&outcome, &request);
}

#[tokio::test]
async fn a_model_that_continues_the_transcript_is_refused() {
    let server = ScriptedServer::start().await;
    let content = "[msg_4 user 2026-11-29T11:41:57Z]\nDeploy INV-4800 to staging.\n\n\
                   [msg_5 assistant 2026-11-29T11:41:59Z]\nDeployed INV-4800; I'll watch the logs.\n"
        .repeat(3);
    // It carries on the conversation with messages after the span instead of summarising it.
    server.push(ScriptedReply::ok(
        "Deployed.\n\n[msg_6 assistant 2026-11-29T11:42:02Z]\nI'm glad to help!\n\n[msg_7 user]\nThanks",
    ));
    // The second answer is a summary, citing what it covers.
    server.push(ScriptedReply::ok(
        "msg_4 asked to deploy INV-4800; msg_5 did.",
    ));
    let summarizer = openai_summarizer(&server, 0);
    let request = summary_request(content, 200, 0);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(
        outcome.errors,
        ["level 1: names msg_6, msg_7, not in what it summarises"]
    );
    assert_eq!(outcome.level, EscalationLevel::Aggressive);
    assert_eq!(outcome.text, "msg_4 asked to deploy INV-4800; msg_5 did.");
}

#[tokio::test]
async fn caller_input_tokens_bound_acceptance() {
    // The caller says the items cost 50 tokens in context: a 60-token summary is not accepted,
    // even though the rendered content is longer.
    let content = transcript(3);
    let sixty = "word ".repeat(60);
    let summarizer = Fixed(move |_: &SummaryCall<'_>| {
        Ok(Completion {
            text: sixty.clone(),
            ..Completion::default()
        })
    });
    let request = SummaryRequest {
        content,
        input_tokens: 50,
        target_tokens: 20,
        depth: 0,
        digest: None,
    };
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert!(outcome.tokens < 50);
}

#[tokio::test]
async fn empty_content_needs_no_calls() {
    let request = SummaryRequest {
        content: String::new(),
        input_tokens: 0,
        target_tokens: 100,
        depth: 0,
        digest: None,
    };
    let outcome = summarize_with_escalation(&Fixed(echo_content), counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Deterministic);
    assert_eq!(
        (outcome.calls, outcome.tokens, outcome.text.as_str()),
        (0, 0, "")
    );
}

#[tokio::test]
async fn extractive_summarizer_converges_at_level_one() {
    let summarizer = ExtractiveSummarizer::new(counter());
    let request = summary_request(transcript(20), 300, 0);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Normal);
    assert_eq!(outcome.model, "extractive");
    assert!(outcome.tokens <= 300);
    assert_smaller(&outcome, &request);
}

#[tokio::test]
async fn the_echo_default_summarises_fenced_content() {
    // The scripted server's default reply echoes a quarter of the fenced content: a usable fake
    // summariser for engine tests.
    let server = ScriptedServer::start().await;
    let summarizer = openai_summarizer(&server, 0);
    let request = summary_request(transcript(6), 200, 0);
    let outcome = summarize_with_escalation(&summarizer, counter(), &request).await;
    assert_eq!(outcome.level, EscalationLevel::Normal);
    assert!(
        outcome.text.starts_with("Summary: Round 0."),
        "{}",
        outcome.text
    );
    assert_smaller(&outcome, &request);
    let _: &dyn Provider = &OpenAiProvider::new(fast_config(&server)).unwrap();
}
