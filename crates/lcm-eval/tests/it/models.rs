//! The model arms against a scripted provider on 127.0.0.1 (real HTTP, real redb data
//! directories): the baseline sends the newest turns that fit its window and nothing older;
//! the lcm agent gets lcm's assembled context within its window, its tool calls run against the
//! task's compacted session, and its final text is what is scored; a model arm without a model
//! is refused with a message that says what to configure.

use std::sync::Arc;
use std::time::Duration;

use lcm_core::config::Config;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_eval::agent::{self, OFFERED_TOOLS};
use lcm_eval::baseline::{self, BASELINE_SYSTEM};
use lcm_eval::model::ModelSettings;
use lcm_eval::runner::{self, Arm, Plan, SummarizerChoice};
use lcm_eval::tasks::{Family, needles};
use lcm_llm::StructuredSummarizer;
use lcm_llm::from_config::LlmClients;
use lcm_llm::http::HttpConfig;
use lcm_llm::openai::OpenAiProvider;
use lcm_llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use regex::Regex;
use serde_json::{Value, json};

use crate::tasks::trec_items;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn clients(server: &ScriptedServer) -> LlmClients {
    let http = HttpConfig::new(server.url(), "scripted-model").with_max_retries(0);
    LlmClients::new(Arc::new(OpenAiProvider::new(http).unwrap()))
}

fn messages(request: &RecordedRequest) -> Vec<Value> {
    request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Tokens of a request's messages as lcm counts them (text and the per-message overhead).
fn request_tokens(request: &RecordedRequest) -> u64 {
    messages(request)
        .iter()
        .map(|m| {
            let mut text = m["content"].as_str().unwrap_or_default().to_owned();
            for call in m["tool_calls"].as_array().into_iter().flatten() {
                text.push_str(call["function"]["name"].as_str().unwrap_or_default());
                text.push_str(call["function"]["arguments"].as_str().unwrap_or_default());
            }
            counter().count_text(&text) as u64 + 4
        })
        .sum()
}

fn settings(window: u64, max_output_tokens: u32, questions: usize) -> ModelSettings {
    ModelSettings {
        window,
        max_output_tokens,
        questions: Some(questions),
        max_turns: 4,
        question_timeout: Duration::from_secs(60),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_baseline_sends_the_newest_turns_that_fit_and_the_question() {
    let Some(items) = trec_items() else {
        return;
    };
    let task = needles::generate(&items, 3, 8_192, counter());
    let server = ScriptedServer::start().await;
    let expected = task.questions[0].answer.text();
    server.push(ScriptedReply::ok(expected.clone()));
    server.push(ScriptedReply::ok("I do not know"));
    let settings = settings(1_500, 32, 2);
    let run = baseline::run(&task, clients(&server).chat.as_ref(), &settings, counter())
        .await
        .unwrap();

    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one call per question");
    assert_eq!(run.calls, 2);
    assert!(run.tokens > 0, "the provider's usage is recorded");
    assert_eq!(run.answers[0].score, 1.0);
    assert_eq!(run.answers[1].score, 0.0);
    assert_eq!(run.score, 0.5);
    for (request, question) in requests.iter().zip(&task.questions) {
        let sent = messages(request);
        assert_eq!(sent[0]["role"], "system");
        assert_eq!(sent[0]["content"], BASELINE_SYSTEM);
        assert_eq!(sent.last().unwrap()["content"], question.text.as_str());
        assert_eq!(request.body["max_tokens"], 32);
        assert!(request.body.get("tools").is_none());
        // The session's turns sent are its newest, in order, up to its last.
        let context: Vec<&str> = sent[1..sent.len() - 1]
            .iter()
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        let first = task.turns.len() - context.len();
        let newest: Vec<&str> = task.turns[first..]
            .iter()
            .map(|t| t.text.as_str())
            .collect();
        assert_eq!(context, newest);
        // Within the window with the answer's room, and no room for one more turn.
        let tokens = request_tokens(request);
        assert!(tokens <= 1_500 - 32, "{tokens} tokens sent");
        let older = counter().count_text(&task.turns[first - 1].text) as u64 + 4;
        assert!(tokens + older > 1_500 - 32, "a turn that fits was cut");
    }
}

/// A scripted model that does what an agent should: greps for the locker's code, describes the
/// first hit, and answers with the code it read.
fn retrieving_model(locker: String) -> ScriptedReply {
    ScriptedReply::from_fn(move |request| {
        let tool_results: Vec<Value> = messages(request)
            .into_iter()
            .filter(|m| m["role"] == "tool")
            .collect();
        match tool_results.len() {
            0 => ScriptedReply::tool_calls([(
                "lcm_grep",
                json!({ "pattern": format!("access code of locker {locker} is") }).to_string(),
            )]),
            1 => {
                let found: Value =
                    serde_json::from_str(tool_results[0]["content"].as_str().unwrap_or_default())
                        .unwrap_or_default();
                let id = found["groups"][0]["hits"][0]["id"]
                    .as_str()
                    .unwrap_or("none")
                    .to_owned();
                ScriptedReply::tool_calls([("lcm_describe", json!({ "id": id }).to_string())])
            }
            _ => {
                let read = tool_results[1]["content"].as_str().unwrap_or_default();
                let code = Regex::new(r"is ([A-Z]{2}-\d{4})")
                    .unwrap()
                    .captures(read)
                    .map_or("not found".to_owned(), |c| c[1].to_owned());
                ScriptedReply::ok(code)
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lcm_agent_answers_from_its_context_and_its_tool_calls() {
    let Some(items) = trec_items() else {
        return;
    };
    let task = needles::generate(&items, 5, 8_192, counter());
    let question = &task.questions[0];
    assert_eq!(question.kind, "single_fact");
    let locker = Regex::new(r"locker (\d+)")
        .unwrap()
        .captures(&question.text)
        .unwrap()[1]
        .to_owned();
    let server = ScriptedServer::start().await;
    server.set_default(retrieving_model(locker));
    let dir = tempfile::tempdir().unwrap();
    // The window holds the context compacted to 1,500 tokens, the system prompt, the tools'
    // definitions and the question with a few hundred tokens to spare, so a tool's description
    // growing by a sentence does not push the context out of it.
    let window = 3_400;
    let settings = settings(window, 64, 1);
    let run = agent::run(
        &task,
        &dir.path().join("lcm"),
        &Config::default(),
        &clients(&server),
        Arc::new(StructuredSummarizer::new(counter())),
        1_500,
        &settings,
    )
    .await
    .unwrap();

    // The session was compacted: every planted fact is under a summary.
    assert_eq!(run.stored.facts_compacted, run.stored.facts);
    assert!(run.stored.tokens_after < run.stored.tokens_before);
    let answer = &run.run.answers[0];
    assert_eq!(answer.given, question.answer.text(), "{answer:?}");
    assert_eq!(run.run.score, 1.0);
    assert_eq!((answer.calls, answer.tool_calls), (3, 2));
    assert_eq!(answer.stop, "final_answer");
    assert!(answer.tokens > 0 && answer.context_tokens > 0);

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let offered: Vec<&str> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered.len(), OFFERED_TOOLS.len(), "{offered:?}");
    assert!(
        OFFERED_TOOLS.iter().all(|t| offered.contains(t)),
        "{offered:?}"
    );
    let first = messages(&requests[0]);
    assert_eq!(first[0]["content"], agent::AGENT_SYSTEM);
    assert_eq!(first.last().unwrap()["content"], question.text.as_str());
    // lcm's context: summaries first, within the window at every step.
    assert!(
        first[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("<lcm_summary")
    );
    for request in &requests {
        let tokens = request_tokens(request);
        assert!(tokens <= window - 64, "{tokens} tokens sent");
    }
    // The grep ran against the stored session and the describe read the planted message.
    let last = messages(&requests[2]);
    let described = last.last().unwrap()["content"].as_str().unwrap();
    assert!(
        described.contains(&format!("is {}", question.answer.text())),
        "{described}"
    );
}

fn plan(families: Vec<Family>, arms: Vec<Arm>) -> Plan {
    Plan {
        families,
        lengths: vec![8_192],
        arms,
        seed: 1,
        tasks: 1,
        budget: 1_000,
        model: settings(2_000, 64, 1),
        summarizer: SummarizerChoice::Offline,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_that_cannot_run_are_refused_with_what_to_change() {
    for arm in [Arm::Baseline, Arm::Lcm] {
        let error = plan(vec![Family::Needles], vec![arm])
            .check(None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("the {} arm needs a model", arm.as_str()))
                && error.contains("[llm]"),
            "{error}"
        );
        // The runner checks before it generates anything.
        let dir = tempfile::tempdir().unwrap();
        let ran = runner::run(
            &plan(vec![Family::Needles], vec![arm]),
            &[],
            &Config::default(),
            None,
            dir.path(),
            |_| {},
        )
        .await;
        assert!(ran.is_err_and(|e| e.to_string().contains("[llm]")));
    }
    let error = plan(vec![Family::Aggregation], vec![Arm::Scripted])
        .check(None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("needle tasks only"), "{error}");

    let server = ScriptedServer::start().await;
    let llm = clients(&server);
    let mut small = plan(vec![Family::Needles], vec![Arm::Baseline]);
    small.model.window = 200;
    let error = small.check(Some(&llm)).unwrap_err().to_string();
    assert!(error.contains("--window 320"), "{error}");
    assert!(
        plan(vec![Family::Needles], vec![Arm::Lcm])
            .check(Some(&llm))
            .is_ok()
    );
    assert_eq!(server.request_count(), 0);
}
