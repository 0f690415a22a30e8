//! Chat with tools over real HTTP against the scripted loopback server, in both API shapes:
//! request bodies (tools, assistant tool calls, tool results), response parsing (text, calls,
//! stop reason, usage), call ids round-tripping, malformed arguments, retries and bad answers.

use crate::common::{KEY, MODEL, fast_config};
use lcm_llm::testing::{ApiShape, ScriptedReply, ScriptedServer};
use lcm_llm::{
    AnthropicProvider, ChatProvider, ChatRequest, ChatTurn, OpenAiProvider, ProviderError,
    StopReason, ToolArgumentsError, ToolCall, ToolSpec,
};
use serde_json::{Value, json};

const SHAPES: [ApiShape; 2] = [ApiShape::OpenAi, ApiShape::Anthropic];

fn provider(shape: ApiShape, server: &ScriptedServer) -> Box<dyn ChatProvider> {
    let config = fast_config(server);
    match shape {
        ApiShape::Anthropic => Box::new(AnthropicProvider::new(config).unwrap()),
        _ => Box::new(OpenAiProvider::new(config).unwrap()),
    }
}

fn add_spec() -> ToolSpec {
    ToolSpec::new(
        "add",
        "Adds two integers.",
        json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"]
        }),
    )
}

fn first_request(task: &str) -> ChatRequest {
    ChatRequest::new(
        Some("You add numbers with the tool.".into()),
        vec![ChatTurn::User(task.into())],
        vec![add_spec()],
        256,
    )
}

/// A conversation with a full round of tool use in it: two calls (one with broken arguments),
/// their results (one an error), then a follow-up question.
fn history_request() -> ChatRequest {
    ChatRequest {
        system: Some("Be exact.".into()),
        turns: vec![
            ChatTurn::User("What is 2 + 3, and 4 + 5?".into()),
            ChatTurn::Assistant {
                text: Some("I will add them.".into()),
                tool_calls: vec![
                    ToolCall::new("call_a", "add", r#"{"a":2,"b":3}"#),
                    ToolCall::new("call_b", "add", r#"{"a":4,"b":"#),
                ],
            },
            ChatTurn::tool_result("call_a", "5"),
            ChatTurn::tool_error("call_b", "error: the arguments are not valid JSON"),
            ChatTurn::User("Try the second one again.".into()),
        ],
        tools: vec![add_spec()],
        max_tokens: 99,
        temperature: 0.5,
    }
}

#[tokio::test]
async fn openai_request_body_has_the_chat_completions_tool_shape() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok("ok"));
    let provider = provider(ApiShape::OpenAi, &server);
    provider.chat(&history_request()).await.unwrap();

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let body = &sent.body;
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["max_tokens"], 99);
    assert_eq!(body["temperature"], json!(0.5));
    assert_eq!(
        body["tools"],
        json!([{
            "type": "function",
            "function": {
                "name": "add",
                "description": "Adds two integers.",
                "parameters": add_spec().parameters,
            }
        }])
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "Be exact."},
            {"role": "user", "content": "What is 2 + 3, and 4 + 5?"},
            {"role": "assistant", "content": "I will add them.", "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}},
                {"id": "call_b", "type": "function", "function": {"name": "add", "arguments": "{\"a\":4,\"b\":"}}
            ]},
            {"role": "tool", "tool_call_id": "call_a", "content": "5"},
            {"role": "tool", "tool_call_id": "call_b", "content": "error: the arguments are not valid JSON"},
            {"role": "user", "content": "Try the second one again."}
        ])
    );
}

#[tokio::test]
async fn anthropic_request_body_has_the_messages_tool_shape() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok("ok"));
    let provider = provider(ApiShape::Anthropic, &server);
    provider.chat(&history_request()).await.unwrap();

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    let body = &sent.body;
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["max_tokens"], 99);
    assert_eq!(body["system"], "Be exact.");
    assert_eq!(
        body["tools"],
        json!([{
            "name": "add",
            "description": "Adds two integers.",
            "input_schema": add_spec().parameters,
        }])
    );
    assert_eq!(
        body["messages"],
        json!([
            {"role": "user", "content": [{"type": "text", "text": "What is 2 + 3, and 4 + 5?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "I will add them."},
                {"type": "tool_use", "id": "call_a", "name": "add", "input": {"a": 2, "b": 3}},
                // Anthropic requires an object: unparseable arguments travel wrapped.
                {"type": "tool_use", "id": "call_b", "name": "add", "input": {"arguments": "{\"a\":4,\"b\":"}}
            ]},
            // Both results and the follow-up share one user message (roles must alternate).
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "5", "is_error": false},
                {"type": "tool_result", "tool_use_id": "call_b", "content": "error: the arguments are not valid JSON", "is_error": true},
                {"type": "text", "text": "Try the second one again."}
            ]}
        ])
    );
}

#[tokio::test]
async fn tool_calls_parse_and_their_ids_round_trip_in_both_shapes() {
    for shape in SHAPES {
        let server = ScriptedServer::start().await;
        server.push(ScriptedReply::tool_calls_with_text(
            "Adding both.",
            [("add", r#"{"a":2,"b":3}"#), ("add", r#"{"a":4,"b":5}"#)],
        ));
        server.push(ScriptedReply::ok("5 and 9."));
        let provider = provider(shape, &server);
        let mut request = first_request("What is 2 + 3, and 4 + 5?");

        let response = provider.chat(&request).await.unwrap();
        let prefix = if shape == ApiShape::Anthropic {
            "toolu"
        } else {
            "call"
        };
        assert_eq!(response.stop, StopReason::ToolUse, "{shape:?}");
        assert_eq!(response.text.as_deref(), Some("Adding both."), "{shape:?}");
        assert_eq!(response.model, MODEL);
        assert!(response.usage.output_tokens > 0, "{shape:?}");
        assert_eq!(
            response.tool_calls,
            vec![
                ToolCall::new(format!("{prefix}_1_0"), "add", r#"{"a":2,"b":3}"#),
                ToolCall::new(format!("{prefix}_1_1"), "add", r#"{"a":4,"b":5}"#),
            ],
            "{shape:?}"
        );
        assert_eq!(
            response.tool_calls[1].parse_arguments(),
            Ok(json!({"a": 4, "b": 5}))
        );

        // Answer with the results, quoting the provider's ids.
        request.turns.push(response.to_turn());
        request
            .turns
            .push(ChatTurn::tool_result(&response.tool_calls[0].id, "5"));
        request
            .turns
            .push(ChatTurn::tool_result(&response.tool_calls[1].id, "9"));
        let last = provider.chat(&request).await.unwrap();
        assert_eq!(last.text.as_deref(), Some("5 and 9."));
        assert_eq!(last.stop, StopReason::EndTurn);
        assert!(last.tool_calls.is_empty());

        let second = &server.requests()[1].body;
        let (call_ids, result_ids) = ids_in_body(shape, second);
        assert_eq!(call_ids, [format!("{prefix}_1_0"), format!("{prefix}_1_1")]);
        assert_eq!(result_ids, call_ids, "{shape:?}");
    }
}

/// The ids of the assistant's calls and of the results, in the order the body carries them.
fn ids_in_body(shape: ApiShape, body: &Value) -> (Vec<String>, Vec<String>) {
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    for message in body["messages"].as_array().unwrap() {
        if shape == ApiShape::Anthropic {
            for block in message["content"].as_array().into_iter().flatten() {
                match block["type"].as_str() {
                    Some("tool_use") => calls.push(text(&block["id"])),
                    Some("tool_result") => results.push(text(&block["tool_use_id"])),
                    _ => {}
                }
            }
        } else {
            for call in message["tool_calls"].as_array().into_iter().flatten() {
                calls.push(text(&call["id"]));
            }
            if message["role"] == "tool" {
                results.push(text(&message["tool_call_id"]));
            }
        }
    }
    (calls, results)
}

#[tokio::test]
async fn malformed_arguments_are_kept_raw_and_reported_in_both_shapes() {
    for shape in SHAPES {
        let server = ScriptedServer::start().await;
        server.push(ScriptedReply::tool_calls([("add", r#"{"a": 1, "b": "#)]));
        let provider = provider(shape, &server);
        let response = provider.chat(&first_request("1 + ?")).await.unwrap();
        assert_eq!(response.tool_calls.len(), 1, "{shape:?}");
        let call = &response.tool_calls[0];
        assert_eq!(call.arguments, r#"{"a": 1, "b": "#, "{shape:?}");
        match call.parse_arguments() {
            Err(ToolArgumentsError::NotJson(reason)) => {
                assert!(reason.contains("EOF"), "{shape:?}: {reason}")
            }
            other => panic!("{shape:?}: expected a JSON error, got {other:?}"),
        }
        assert_eq!(response.text, None);
    }
}

#[tokio::test]
async fn server_error_then_tool_calls_is_retried_in_both_shapes() {
    for shape in SHAPES {
        let server = ScriptedServer::start().await;
        server.push(ScriptedReply::status(500));
        server.push(ScriptedReply::tool_calls([("add", r#"{"a":1,"b":1}"#)]));
        let provider = provider(shape, &server);
        let response = provider.chat(&first_request("1 + 1")).await.unwrap();
        assert_eq!(server.request_count(), 2, "{shape:?}");
        assert_eq!(response.tool_calls[0].name, "add");
        // The retry sent the same body, tools included.
        let requests = server.requests();
        assert_eq!(requests[0].body, requests[1].body);
        assert!(requests[1].body["tools"].is_array());
    }
}

#[tokio::test]
async fn garbage_and_broken_answers_are_clear_errors_in_both_shapes() {
    for shape in SHAPES {
        let server = ScriptedServer::start().await;
        server.push(ScriptedReply::garbage("<html>oops</html>"));
        let provider = provider(shape, &server);
        match provider.chat(&first_request("x")).await {
            Err(ProviderError::BadResponse(reason)) => {
                assert!(reason.contains("not JSON"), "{reason}");
                assert!(reason.contains("<html>oops</html>"), "{reason}");
            }
            other => panic!("{shape:?}: expected BadResponse, got {other:?}"),
        }
        // A bad answer is not retried.
        assert_eq!(server.request_count(), 1);

        // JSON, but a tool call with no name.
        let nameless = match shape {
            ApiShape::Anthropic => json!({
                "type": "message",
                "content": [{"type": "tool_use", "id": "toolu_x", "input": {}}],
                "stop_reason": "tool_use"
            }),
            _ => json!({
                "choices": [{
                    "message": {"role": "assistant", "content": null,
                                "tool_calls": [{"id": "call_x", "type": "function", "function": {"arguments": "{}"}}]},
                    "finish_reason": "tool_calls"
                }]
            }),
        };
        server.push(ScriptedReply::garbage(nameless.to_string()));
        match provider.chat(&first_request("x")).await {
            Err(ProviderError::BadResponse(reason)) => {
                assert!(reason.contains("no name"), "{shape:?}: {reason}")
            }
            other => panic!("{shape:?}: expected BadResponse, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn plain_text_answer_is_an_end_turn_with_no_calls_in_both_shapes() {
    for shape in SHAPES {
        let server = ScriptedServer::start().await;
        server.push(ScriptedReply::ok("Two."));
        let provider = provider(shape, &server);
        let response = provider.chat(&first_request("1 + 1")).await.unwrap();
        assert_eq!(response.text.as_deref(), Some("Two."));
        assert!(response.tool_calls.is_empty());
        assert_eq!(response.stop, StopReason::EndTurn);
        assert_eq!(provider.model(), MODEL);

        // An empty answer has no text at all.
        server.push(ScriptedReply::Empty);
        let empty = provider.chat(&first_request("1 + 1")).await.unwrap();
        assert_eq!(empty.text, None, "{shape:?}");
        assert!(empty.tool_calls.is_empty());
    }
}

#[tokio::test]
async fn requests_without_tools_send_no_tools_field() {
    for shape in SHAPES {
        let server = ScriptedServer::start().await;
        server.push(ScriptedReply::ok("fine"));
        let provider = provider(shape, &server);
        let request = ChatRequest::new(None, vec![ChatTurn::User("hi".into())], vec![], 10);
        provider.chat(&request).await.unwrap();
        let body = &server.requests()[0].body;
        assert!(body.get("tools").is_none(), "{shape:?}: {body}");
        assert!(body.get("system").is_none(), "{shape:?}: {body}");
    }
}
