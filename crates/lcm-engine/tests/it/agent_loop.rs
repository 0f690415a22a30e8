//! The sub-agent loop against the scripted loopback server, in both API shapes: multi-step tool
//! use, malformed arguments, unknown tools, failing tools, empty replies, and every way a run is
//! stopped (step limit, token limit, deadline, provider failure).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lcm_engine::agent::{
    AgentLimits, AgentOutcome, AgentStop, AgentTools, run_agent, turn_to_message,
};
use lcm_llm::testing::{ApiShape, RecordedRequest, ScriptedReply, ScriptedServer};
use lcm_llm::{AnthropicProvider, ChatProvider, ChatTurn, HttpConfig, OpenAiProvider, ToolSpec};
use serde_json::{Value, json};

/// Adds two integers; records every call it receives.
#[derive(Default)]
struct Calculator {
    calls: Mutex<Vec<(String, Value)>>,
}

impl Calculator {
    fn calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }
}

#[async_trait]
impl AgentTools for Calculator {
    fn specs(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec::new(
                "add",
                "Adds two integers.",
                json!({
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"]
                }),
            ),
            ToolSpec::new("clock", "Says the time.", json!({"type": "object"})),
        ]
    }

    async fn execute(&self, name: &str, arguments: &Value) -> Result<Value, String> {
        self.calls
            .lock()
            .unwrap()
            .push((name.to_owned(), arguments.clone()));
        match name {
            "add" => match (arguments["a"].as_i64(), arguments["b"].as_i64()) {
                (Some(a), Some(b)) => Ok(json!(a + b)),
                _ => Err("a and b must be integers".into()),
            },
            "clock" => Ok(Value::from("noon")),
            other => panic!("the loop ran an unknown tool {other}"),
        }
    }
}

fn provider(shape: ApiShape, server: &ScriptedServer) -> Box<dyn ChatProvider> {
    let config = HttpConfig::new(server.url(), "agent-model")
        .with_api_key("sk-test")
        .with_timeout(Duration::from_secs(5))
        .with_max_retries(2)
        .with_backoff(Duration::from_millis(5), Duration::from_millis(20));
    match shape {
        ApiShape::Anthropic => Box::new(AnthropicProvider::new(config).unwrap()),
        _ => Box::new(OpenAiProvider::new(config).unwrap()),
    }
}

/// The server's id for call `index` of the answer to request `request` (1-based).
fn call_id(shape: ApiShape, request: usize, index: usize) -> String {
    match shape {
        ApiShape::Anthropic => format!("toolu_{request}_{index}"),
        _ => format!("call_{request}_{index}"),
    }
}

/// The tool results a request carries: (call id, content, is_error if the shape says).
fn results_in(shape: ApiShape, request: &RecordedRequest) -> Vec<(String, String, Option<bool>)> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let mut out = Vec::new();
    for message in request.body["messages"].as_array().unwrap() {
        if shape == ApiShape::Anthropic {
            for block in message["content"].as_array().into_iter().flatten() {
                if block["type"] == "tool_result" {
                    out.push((
                        text(&block["tool_use_id"]),
                        text(&block["content"]),
                        block["is_error"].as_bool(),
                    ));
                }
            }
        } else if message["role"] == "tool" {
            out.push((
                text(&message["tool_call_id"]),
                text(&message["content"]),
                None,
            ));
        }
    }
    out
}

struct Run {
    outcome: AgentOutcome,
    observed: Vec<ChatTurn>,
    elapsed: Duration,
}

async fn run(
    shape: ApiShape,
    server: &ScriptedServer,
    tools: &Calculator,
    limits: AgentLimits,
) -> Run {
    let provider = provider(shape, server);
    let mut observed = Vec::new();
    let mut observer = |turn: &ChatTurn| observed.push(turn.clone());
    let started = Instant::now();
    let outcome = run_agent(
        provider.as_ref(),
        tools,
        Some("You are a careful calculator."),
        "What is 2 + 3 + 4?".into(),
        limits,
        &mut observer,
        None,
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(observed, outcome.turns, "the observer saw every turn");
    Run {
        outcome,
        observed,
        elapsed,
    }
}

/// Generates one test per API shape from `async fn $name(shape: ApiShape)`.
macro_rules! both_shapes {
    ($($name:ident),* $(,)?) => {
        mod openai {
            $(#[tokio::test] async fn $name() { super::$name(lcm_llm::testing::ApiShape::OpenAi).await })*
        }
        mod anthropic {
            $(#[tokio::test] async fn $name() { super::$name(lcm_llm::testing::ApiShape::Anthropic).await })*
        }
    };
}

both_shapes!(
    multi_step_tool_use_reaches_the_final_answer,
    malformed_arguments_go_back_to_the_model_and_it_recovers,
    unknown_tool_gets_an_error_listing_the_tools,
    failing_tool_and_several_calls_in_one_turn,
    empty_reply_is_nudged_once_then_stops,
    step_limit_stops_a_model_that_never_answers,
    deadline_cuts_a_slow_provider_call,
    token_limit_stops_before_running_more_tools,
    provider_failure_after_retries_is_reported,
);

async fn multi_step_tool_use_reaches_the_final_answer(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::tool_calls([("add", r#"{"a":2,"b":3}"#)]));
    server.push(ScriptedReply::tool_calls_with_text(
        "Now the rest.",
        [("add", r#"{"a":5,"b":4}"#)],
    ));
    server.push(ScriptedReply::ok("2 + 3 + 4 = 9."));
    let tools = Calculator::default();
    let run = run(shape, &server, &tools, AgentLimits::default()).await;
    let outcome = &run.outcome;

    assert_eq!(outcome.stop, AgentStop::FinalAnswer);
    assert_eq!(outcome.answer.as_deref(), Some("2 + 3 + 4 = 9."));
    assert_eq!(outcome.steps, 3);
    assert!(outcome.usage.output_tokens > 0 && outcome.usage.input_tokens > 0);
    // The tool saw the model's arguments, parsed.
    assert_eq!(
        tools.calls(),
        vec![
            ("add".into(), json!({"a": 2, "b": 3})),
            ("add".into(), json!({"a": 5, "b": 4}))
        ]
    );
    // Each request carries the results so far, under the provider's call ids.
    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    assert!(results_in(shape, &requests[0]).is_empty());
    let second = results_in(shape, &requests[1]);
    assert_eq!(second.len(), 1);
    assert_eq!(
        (second[0].0.as_str(), second[0].1.as_str()),
        (call_id(shape, 1, 0).as_str(), "5")
    );
    assert_ne!(second[0].2, Some(true));
    let third = results_in(shape, &requests[2]);
    assert_eq!(third.len(), 2);
    assert_eq!(
        (third[1].0.as_str(), third[1].1.as_str()),
        (call_id(shape, 2, 0).as_str(), "9")
    );
    // Tools are offered on every request, in the shape's own form.
    for request in &requests {
        let tools = request.body["tools"].as_array().unwrap();
        assert_eq!(tools.len(), 2);
    }

    // The whole history, in order, storable message by message.
    let kinds: Vec<&str> = run
        .observed
        .iter()
        .map(|turn| match turn {
            ChatTurn::System(_) => "system",
            ChatTurn::User(_) => "user",
            ChatTurn::Assistant { .. } => "assistant",
            ChatTurn::ToolResult { .. } => "result",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "system",
            "user",
            "assistant",
            "result",
            "assistant",
            "result",
            "assistant"
        ]
    );
    for turn in &run.observed {
        assert!(!turn_to_message(turn).parts.is_empty());
    }
}

async fn malformed_arguments_go_back_to_the_model_and_it_recovers(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::tool_calls([("add", r#"{"a": 2, "b": "#)]));
    server.push(ScriptedReply::tool_calls([("add", r#"{"a":2,"b":3}"#)]));
    server.push(ScriptedReply::ok("5, then 9."));
    let tools = Calculator::default();
    let run = run(shape, &server, &tools, AgentLimits::default()).await;

    assert_eq!(run.outcome.stop, AgentStop::FinalAnswer);
    assert_eq!(run.outcome.steps, 3);
    // The broken call never reached the tool.
    assert_eq!(tools.calls(), vec![("add".into(), json!({"a": 2, "b": 3}))]);
    let requests = server.requests();
    let results = results_in(shape, &requests[1]);
    assert_eq!(results.len(), 1);
    let (id, content, is_error) = &results[0];
    assert_eq!(id, &call_id(shape, 1, 0));
    assert!(content.starts_with("error: "), "{content}");
    assert!(content.contains("not valid JSON"), "{content}");
    assert!(
        content.contains("EOF while parsing"),
        "the parse error is quoted: {content}"
    );
    assert!(
        content.contains(r#"{"a": 2, "b": "#),
        "the arguments are quoted: {content}"
    );
    if shape == ApiShape::Anthropic {
        assert_eq!(*is_error, Some(true));
    }
    // The error result is in the history with its flag.
    assert!(run.outcome.turns.iter().any(
        |turn| matches!(turn, ChatTurn::ToolResult { is_error: true, content, .. } if content.contains("not valid JSON"))
    ));
    // The raw arguments are kept in the history too, for the store.
    assert!(run.outcome.turns.iter().any(|turn| matches!(
        turn,
        ChatTurn::Assistant { tool_calls, .. } if tool_calls.iter().any(|c| c.arguments == r#"{"a": 2, "b": "#)
    )));
}

async fn unknown_tool_gets_an_error_listing_the_tools(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::tool_calls([(
        "multiply",
        r#"{"a":2,"b":3}"#,
    )]));
    server.push(ScriptedReply::ok("I cannot multiply."));
    let tools = Calculator::default();
    let run = run(shape, &server, &tools, AgentLimits::default()).await;

    assert_eq!(run.outcome.stop, AgentStop::FinalAnswer);
    assert!(tools.calls().is_empty());
    let results = results_in(shape, &server.requests()[1]);
    let content = &results[0].1;
    assert!(content.contains(r#"no tool named "multiply""#), "{content}");
    assert!(content.contains("Available tools: add, clock"), "{content}");
}

async fn failing_tool_and_several_calls_in_one_turn(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::tool_calls([
        ("add", r#"{"a":"two","b":3}"#),
        ("clock", ""),
        ("add", r#"{"a":1,"b":1}"#),
    ]));
    server.push(ScriptedReply::ok("done"));
    let tools = Calculator::default();
    let run = run(shape, &server, &tools, AgentLimits::default()).await;

    assert_eq!(run.outcome.stop, AgentStop::FinalAnswer);
    // Every call ran, in order; empty arguments read as {}.
    let names: Vec<String> = tools.calls().into_iter().map(|(name, _)| name).collect();
    assert_eq!(names, ["add", "clock", "add"]);
    assert_eq!(tools.calls()[1].1, json!({}));
    let results = results_in(shape, &server.requests()[1]);
    let contents: Vec<&str> = results.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(contents, ["error: a and b must be integers", "noon", "2"]);
    let ids: Vec<String> = results.iter().map(|r| r.0.clone()).collect();
    assert_eq!(
        ids,
        (0..3).map(|i| call_id(shape, 1, i)).collect::<Vec<_>>()
    );
    if shape == ApiShape::Anthropic {
        let flags: Vec<Option<bool>> = results.iter().map(|r| r.2).collect();
        assert_eq!(flags, [Some(true), Some(false), Some(false)]);
        // All three results travel in one user message.
        let messages = server.requests()[1].body["messages"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(messages.len(), 3);
    }
}

async fn empty_reply_is_nudged_once_then_stops(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::Empty);
    server.push(ScriptedReply::ok("Nine."));
    let tools = Calculator::default();
    let recovered = run(shape, &server, &tools, AgentLimits::default()).await;
    assert_eq!(recovered.outcome.stop, AgentStop::FinalAnswer);
    assert_eq!(recovered.outcome.answer.as_deref(), Some("Nine."));
    assert_eq!(recovered.outcome.steps, 2);
    assert!(
        server.requests()[1]
            .last_user_text()
            .unwrap()
            .contains("Your last reply was empty")
    );

    server.reset();
    server.set_default(ScriptedReply::Empty);
    let stuck = run(shape, &server, &tools, AgentLimits::default()).await;
    assert_eq!(stuck.outcome.stop, AgentStop::EmptyAnswer);
    assert_eq!(stuck.outcome.answer, None);
    assert_eq!(stuck.outcome.steps, 2);
}

async fn step_limit_stops_a_model_that_never_answers(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::tool_calls([("add", r#"{"a":1,"b":1}"#)]));
    let tools = Calculator::default();
    let limits = AgentLimits {
        max_steps: 3,
        ..AgentLimits::default()
    };
    let run = run(shape, &server, &tools, limits).await;

    assert_eq!(run.outcome.stop, AgentStop::StepLimit);
    assert_eq!(run.outcome.answer, None);
    assert_eq!(run.outcome.steps, 3);
    assert_eq!(server.request_count(), 3);
    // The calls of the last turn were not run: nobody would read their results.
    assert_eq!(tools.calls().len(), 2);
}

async fn deadline_cuts_a_slow_provider_call(shape: ApiShape) {
    // Slow from the first call on: a 200 ms deadline against 2 s of latency; no step completes.
    let server = ScriptedServer::start().await;
    server.set_latency(Duration::from_secs(2));
    let tools = Calculator::default();
    let limits = AgentLimits::default().with_timeout(Duration::from_millis(200));
    let slow = run(shape, &server, &tools, limits).await;
    assert_eq!(slow.outcome.stop, AgentStop::Deadline);
    assert_eq!(slow.outcome.answer, None);
    assert_eq!(slow.outcome.steps, 0);
    // Not before the deadline, and without waiting for the server's answer.
    assert!(tokio::time::Instant::now() >= limits.deadline.unwrap());
    assert!(
        slow.elapsed < Duration::from_millis(1500),
        "{:?}",
        slow.elapsed
    );

    // The first call answers at once and its tool runs; the second takes 5 s, far past the
    // 1 s deadline (generous, so that a loaded machine still finishes step 1 in time).
    server.reset();
    server.set_latency(Duration::ZERO);
    server.push(ScriptedReply::tool_calls([("add", r#"{"a":2,"b":3}"#)]));
    server.push(ScriptedReply::delayed(
        Duration::from_secs(5),
        ScriptedReply::ok("too late"),
    ));
    let limits = AgentLimits::default().with_timeout(Duration::from_secs(1));
    let later = self::run(shape, &server, &tools, limits).await;
    assert_eq!(later.outcome.stop, AgentStop::Deadline);
    assert_eq!(later.outcome.steps, 1);
    assert_eq!(tools.calls().len(), 1);
    assert_eq!(server.request_count(), 2);
    assert!(tokio::time::Instant::now() >= limits.deadline.unwrap());
    assert!(
        later.elapsed < Duration::from_secs(4),
        "{:?}",
        later.elapsed
    );

    // A deadline already past: no request at all.
    server.reset();
    let limits = AgentLimits {
        deadline: Some(tokio::time::Instant::now()),
        ..AgentLimits::default()
    };
    let past = self::run(shape, &server, &tools, limits).await;
    assert_eq!(past.outcome.stop, AgentStop::Deadline);
    assert_eq!(server.request_count(), 0);
}

async fn token_limit_stops_before_running_more_tools(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    // Every turn reports at least 41 output tokens (40 words of text and the arguments).
    let musing = "hmm ".repeat(40);
    server.set_default(ScriptedReply::tool_calls_with_text(
        musing.trim(),
        [("add", r#"{"a":1,"b":1}"#)],
    ));
    let tools = Calculator::default();
    let limits = AgentLimits {
        max_steps: 50,
        max_total_tokens: 100,
        ..AgentLimits::default()
    };
    let run = run(shape, &server, &tools, limits).await;

    assert_eq!(run.outcome.stop, AgentStop::TokenLimit);
    assert!(run.outcome.usage.total() >= 100, "{:?}", run.outcome.usage);
    assert!(run.outcome.usage.output_tokens >= 41 * u64::from(run.outcome.steps));
    // Not before it had to: the scripted server reports 41 output tokens a turn and at most 7
    // prompt tokens (the words of the last user text), so two turns stay under 100 and the
    // third crosses it.
    assert_eq!(run.outcome.steps, 3);
    // The last turn's calls were not run.
    assert_eq!(tools.calls().len() as u32, run.outcome.steps - 1);
}

async fn provider_failure_after_retries_is_reported(shape: ApiShape) {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(500));
    let tools = Calculator::default();
    let run = run(shape, &server, &tools, AgentLimits::default()).await;

    match &run.outcome.stop {
        AgentStop::ProviderFailed(reason) => {
            assert!(reason.contains("500"), "{reason}");
            assert!(reason.contains("scripted status 500"), "{reason}");
        }
        other => panic!("expected ProviderFailed, got {other:?}"),
    }
    assert_eq!(run.outcome.steps, 0);
    // One attempt and two retries.
    assert_eq!(server.request_count(), 3);
    // The history still holds what was sent.
    assert_eq!(run.outcome.turns.len(), 2);
}
