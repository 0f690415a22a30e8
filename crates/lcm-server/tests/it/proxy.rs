//! The OpenAI- and Anthropic-compatible proxy over real HTTP on loopback: a client talks to
//! the daemon, the daemon to a scripted upstream (lcm-llm's `ScriptedServer`, and below a small
//! streaming one, since the scripted server answers in one piece), and every request the
//! upstream receives is recorded and checked.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{Setup, TestServer, start};
use axum::body::{Body, Bytes};
use lcm_core::message::{Message, Part, Role};
use lcm_core::summary::NodeRef;
use lcm_core::tokens::TokenCounter;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Notify;

const ADMIN: &str = "admin-token-0123456789abcdef";
const TENANT: &str = "tenant-a-token-0123456789";

/// An upstream base URL on a loopback port nothing listens on.
fn unreachable_upstream() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    url
}

/// A daemon whose proxy forwards to `upstream` (both shapes).
async fn daemon(upstream: &str, tweak: impl FnOnce(&mut Setup)) -> TestServer {
    let (mut setup, tmp, root) = Setup::new();
    setup.config.proxy.openai_base_url = upstream.to_owned();
    setup.config.proxy.anthropic_base_url = upstream.to_owned();
    setup.config.proxy.timeout_s = 20;
    tweak(&mut setup);
    start(setup, tmp, root).await
}

/// A proxied call's answer: status, headers, exact bytes.
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    bytes: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn session_key(&self) -> String {
        self.headers["x-lcm-session"].to_str().unwrap().to_owned()
    }
}

async fn call(server: &TestServer, path: &str, body: &[u8], headers: &[(&str, &str)]) -> Reply {
    let request = server
        .client
        .post(format!("{}{path}", server.url))
        .header("content-type", "application/json")
        .body(body.to_vec());
    send(request, headers).await
}

/// `GET path` on the daemon with `headers`.
async fn get(server: &TestServer, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(server.client.get(format!("{}{path}", server.url)), headers).await
}

/// Sends `request` with `headers` added; the whole answer.
async fn send(mut request: reqwest::RequestBuilder, headers: &[(&str, &str)]) -> Reply {
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("body").to_vec();
    Reply {
        status,
        headers,
        bytes,
    }
}

async fn chat(server: &TestServer, body: &Value, headers: &[(&str, &str)]) -> Reply {
    call(
        server,
        "/v1/chat/completions",
        body.to_string().as_bytes(),
        headers,
    )
    .await
}

async fn messages(server: &TestServer, body: &Value, headers: &[(&str, &str)]) -> Reply {
    call(server, "/v1/messages", body.to_string().as_bytes(), headers).await
}

/// The messages stored under session key `key`, in order.
fn stored(server: &TestServer, key: &str) -> Vec<Message> {
    let store = server.runtime.store();
    let id = store
        .session_id_for_key(key)
        .expect("lookup")
        .expect("the session exists");
    store.session_messages(id, 0..u64::MAX).expect("messages")
}

/// (role, text of the text parts) of stored messages.
fn texts(messages: &[Message]) -> Vec<(Role, String)> {
    messages
        .iter()
        .map(|m| {
            let text: Vec<&str> = m
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            (m.role, text.join("\n"))
        })
        .collect()
}

/// An OpenAI completion body with `text`, as a provider sends it.
fn completion(id: &str, text: &str) -> String {
    json!({
        "id": id, "object": "chat.completion", "created": 1_700_000_000, "model": "gpt-test",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    })
    .to_string()
}

fn tool_names(request_body: &Value) -> Vec<String> {
    request_body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| {
                    t["function"]["name"]
                        .as_str()
                        .or_else(|| t["name"].as_str())
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_answers_pass_through_unchanged_and_are_stored() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    let body = completion("chatcmpl-1", "Hello! How can I help?");
    upstream.push(ScriptedReply::garbage(body.clone()));
    let request = json!({
        "model": "gpt-test", "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi there."}
        ]
    });
    let reply = chat(
        &server,
        &request,
        &[("authorization", "Bearer sk-upstream-key")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    // Byte for byte what the upstream sent.
    assert_eq!(reply.bytes, body.as_bytes());
    assert_eq!(reply.headers["content-type"], "application/json");

    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    // The client's key goes upstream as it came; lcm's headers do not.
    assert_eq!(sent.header("authorization"), Some("Bearer sk-upstream-key"));
    assert!(sent.headers.keys().all(|h| !h.starts_with("x-lcm-")));
    // Everything but the messages and the tools is the client's.
    assert_eq!(sent.body["model"], "gpt-test");
    assert_eq!(sent.body["temperature"], 0.2);
    assert_eq!(
        sent.body["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi there."}
        ])
    );
    // No tool_choice: the model may choose, so the lcm tools are offered.
    assert_eq!(
        tool_names(&sent.body),
        ["lcm_grep", "lcm_describe", "lcm_expand_query"]
    );

    // The user's message and the answer are stored; the system prompt is not.
    let key = reply.session_key();
    assert!(key.starts_with("proxy:openai:"), "{key}");
    assert_eq!(
        texts(&stored(&server, &key)),
        [
            (Role::User, "Hi there.".to_owned()),
            (Role::Assistant, "Hello! How can I help?".to_owned())
        ]
    );
    assert!(
        reply.headers["x-lcm-session-id"]
            .to_str()
            .unwrap()
            .starts_with("ses_")
    );

    // With tool_choice "none" nothing is added.
    upstream.push(ScriptedReply::garbage(completion("chatcmpl-2", "Sure.")));
    let mut request = request.clone();
    request["tool_choice"] = json!("none");
    request["messages"].as_array_mut().unwrap().extend([
        json!({"role": "assistant", "content": "Hello! How can I help?"}),
        json!({"role": "user", "content": "Thanks."}),
    ]);
    let reply = chat(&server, &request, &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(upstream.requests()[1].body.get("tools").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resent_conversations_are_stored_once() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    let mut history = vec![json!({"role": "system", "content": "Be helpful."})];
    let mut key = String::new();
    for turn in 1..=3 {
        history.push(json!({"role": "user", "content": format!("Question {turn}?")}));
        let answer = format!("Answer {turn}.");
        upstream.push(ScriptedReply::ok(answer.clone()));
        let reply = chat(&server, &json!({"model": "m", "messages": history}), &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(reply.json()["choices"][0]["message"]["content"], answer);
        if turn > 1 {
            assert_eq!(reply.session_key(), key, "one conversation, one session");
        }
        key = reply.session_key();
        history.push(json!({"role": "assistant", "content": answer}));
    }
    // A retry of the last request (the client never saw the answer) stores nothing new, nor
    // does the same answer again.
    history.pop();
    upstream.push(ScriptedReply::ok("Answer 3."));
    let reply = chat(&server, &json!({"model": "m", "messages": history}), &[]).await;
    assert_eq!(reply.status, StatusCode::OK);
    let expected: Vec<(Role, String)> = (1..=3)
        .flat_map(|turn| {
            [
                (Role::User, format!("Question {turn}?")),
                (Role::Assistant, format!("Answer {turn}.")),
            ]
        })
        .collect();
    assert_eq!(texts(&stored(&server, &key)), expected);
    // The upstream saw the whole conversation each turn (it is small): the last request
    // carried all five earlier messages, the system prompt first.
    let last = upstream.requests().pop().unwrap();
    let sent = last.body["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 6);
    assert_eq!(sent[0]["role"], "system");

    // A client that truncates its own list (keeps the last three messages) is still
    // recognised by its session key, and only its new message is stored.
    let mut truncated: Vec<Value> = history[history.len() - 1..].to_vec();
    truncated.insert(0, json!({"role": "assistant", "content": "Answer 2."}));
    truncated.push(json!({"role": "assistant", "content": "Answer 3."}));
    truncated.push(json!({"role": "user", "content": "Question 4?"}));
    upstream.push(ScriptedReply::ok("Answer 4."));
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": truncated}),
        &[("x-lcm-session", &key)],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let all = texts(&stored(&server, &key));
    assert_eq!(all.len(), 8, "{all:?}");
    assert_eq!(all[6], (Role::User, "Question 4?".to_owned()));
    assert_eq!(all[7], (Role::Assistant, "Answer 4.".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lcm_tool_calls_run_inside_the_proxy() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    let session = [("x-lcm-session", "tool-demo")];
    let mut history = vec![
        json!({"role": "user", "content": "Remember: the staging deploy code is ZEBRA-7781."}),
    ];
    upstream.push(ScriptedReply::ok("Noted."));
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": history}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    history.push(json!({"role": "assistant", "content": "Noted."}));
    history.push(json!({"role": "user", "content": "What was the deploy code?"}));

    // The model searches first, then answers.
    upstream.push(ScriptedReply::tool_calls([(
        "lcm_grep",
        r#"{"pattern": "ZEBRA-\\d+"}"#,
    )]));
    let final_body = completion("chatcmpl-final", "The deploy code is ZEBRA-7781.");
    upstream.push(ScriptedReply::garbage(final_body.clone()));
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": history, "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
        ]}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    // The client sees only the final answer, as the upstream sent it.
    assert_eq!(reply.bytes, final_body.as_bytes());

    let requests = upstream.requests();
    assert_eq!(requests.len(), 3);
    let first = &requests[1].body;
    assert_eq!(
        tool_names(first),
        [
            "get_weather",
            "lcm_grep",
            "lcm_describe",
            "lcm_expand_query"
        ]
    );
    let second = requests[2].body["messages"].as_array().unwrap();
    let call = &second[second.len() - 2];
    assert_eq!(call["role"], "assistant");
    assert_eq!(call["tool_calls"][0]["function"]["name"], "lcm_grep");
    let result = &second[second.len() - 1];
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], call["tool_calls"][0]["id"]);
    let content = result["content"].as_str().unwrap();
    assert!(content.contains("ZEBRA-7781"), "{content}");
    assert!(content.contains("msg_"), "{content}");

    // The proxy's own rounds are not stored: the conversation is what the client saw.
    assert_eq!(
        texts(&stored(&server, "tool-demo")),
        [
            (
                Role::User,
                "Remember: the staging deploy code is ZEBRA-7781.".to_owned()
            ),
            (Role::Assistant, "Noted.".to_owned()),
            (Role::User, "What was the deploy code?".to_owned()),
            (Role::Assistant, "The deploy code is ZEBRA-7781.".to_owned()),
        ]
    );

    // A call to the client's own tool comes back to the client unchanged.
    history.push(json!({"role": "assistant", "content": "The deploy code is ZEBRA-7781."}));
    history.push(json!({"role": "user", "content": "Weather in Oslo?"}));
    upstream.push(ScriptedReply::tool_calls([(
        "get_weather",
        r#"{"city":"Oslo"}"#,
    )]));
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": history}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(upstream.request_count(), 4);
    let answer = reply.json();
    assert_eq!(answer["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    let all = stored(&server, "tool-demo");
    let calls = all.last().map_or(0, |m| {
        m.parts
            .iter()
            .filter(|p| matches!(p, Part::ToolCall { .. }))
            .count()
    });
    assert_eq!(calls, 1, "the client tool call is stored as the answer");

    // The proxy counts what it did.
    let metrics = server.get("/metrics").await;
    let text = metrics.body.as_str().unwrap_or_default();
    assert!(
        text.contains("lcm_proxy_upstream_requests_total{shape=\"openai\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("lcm_proxy_tool_calls_total{tool=\"lcm_grep\"} 1"),
        "{text}"
    );
}

/// With `proxy.inject_context_tools`, the model is offered `lcm_pin` and `lcm_forget` too, and
/// a pin it makes is written in the request's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_tools_are_offered_when_asked_for_and_pin_in_the_session() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |setup| {
        setup.config.proxy.inject_context_tools = true;
    })
    .await;
    let session = [("x-lcm-session", "pin-demo")];
    let mut history = vec![json!({"role": "user", "content": "The deploy code is ZEBRA-7781."})];
    upstream.push(ScriptedReply::ok("Noted."));
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": history}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let first = stored(&server, "pin-demo")[0].id;
    history.push(json!({"role": "assistant", "content": "Noted."}));
    history.push(json!({"role": "user", "content": "Keep that code in view."}));
    upstream.push(ScriptedReply::tool_calls([(
        "lcm_pin",
        format!(r#"{{"id": "{first}"}}"#).as_str(),
    )]));
    upstream.push(ScriptedReply::ok("Pinned."));
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": history}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());

    let requests = upstream.requests();
    assert_eq!(
        tool_names(&requests[1].body),
        [
            "lcm_grep",
            "lcm_describe",
            "lcm_expand_query",
            "lcm_pin",
            "lcm_forget"
        ]
    );
    let messages = requests[2].body["messages"].as_array().unwrap();
    let result: Value =
        serde_json::from_str(messages[messages.len() - 1]["content"].as_str().unwrap()).unwrap();
    assert_eq!(result["pinned"], true, "{result}");
    let store = server.runtime.store();
    let id = store.session_id_for_key("pin-demo").unwrap().unwrap();
    assert_eq!(result["session"], json!(id));
    let marks = store.marks(id).unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].node, NodeRef::Message(first));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_shape_both_ways() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    let anthropic_headers = [
        ("x-api-key", "sk-ant-upstream"),
        ("anthropic-version", "2023-06-01"),
    ];
    upstream.push(ScriptedReply::ok("The build runs on port 4012."));
    let mut history = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Which port does the build use?", "cache_control": {"type": "ephemeral"}}
    ]})];
    let request = |history: &Vec<Value>| json!({"model": "claude-test", "max_tokens": 512, "system": "You are a build assistant.", "messages": history});
    let reply = messages(&server, &request(&history), &anthropic_headers).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let answer = reply.json();
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["content"][0]["text"], "The build runs on port 4012.");
    let sent = &upstream.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-upstream"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.body["system"], "You are a build assistant.");
    assert_eq!(sent.body["max_tokens"], 512);
    // The client's message is sent as it came (its cache_control marker intact).
    assert_eq!(sent.body["messages"], json!(history));
    let tools = sent.body["tools"].as_array().unwrap();
    assert!(
        tools.iter().all(|t| t.get("input_schema").is_some()),
        "{tools:?}"
    );

    // An lcm tool round in the Anthropic shape.
    history.push(json!({"role": "assistant", "content": [{"type": "text", "text": "The build runs on port 4012."}]}));
    history.push(json!({"role": "user", "content": "Remind me of the port?"}));
    upstream.push(ScriptedReply::tool_calls_with_text(
        "Let me check.",
        [("lcm_grep", r#"{"pattern": "port \\d+"}"#)],
    ));
    upstream.push(ScriptedReply::ok("Port 4012."));
    let reply = messages(&server, &request(&history), &anthropic_headers).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.json()["content"],
        json!([{"type": "text", "text": "Port 4012."}])
    );
    let requests = upstream.requests();
    assert_eq!(requests.len(), 3);
    let second = requests[2].body["messages"].as_array().unwrap();
    let call = &second[second.len() - 2];
    assert_eq!(call["role"], "assistant");
    assert_eq!(call["content"][0]["text"], "Let me check.");
    assert_eq!(call["content"][1]["type"], "tool_use");
    let result = &second[second.len() - 1]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], call["content"][1]["id"]);
    assert!(
        result["content"].as_str().unwrap().contains("port 4012"),
        "{result}"
    );
    // The stored conversation: three user-visible turns and the final answer; once each.
    let key = reply.session_key();
    assert!(key.starts_with("proxy:anthropic:"), "{key}");
    assert_eq!(
        texts(&stored(&server, &key)),
        [
            (Role::User, "Which port does the build use?".to_owned()),
            (Role::Assistant, "The build runs on port 4012.".to_owned()),
            (Role::User, "Remind me of the port?".to_owned()),
            (Role::Assistant, "Port 4012.".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_come_back_with_a_clear_body() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    let request = json!({"model": "m", "messages": [{"role": "user", "content": "Hello?"}]});

    // A rate limit: status, body and Retry-After as the upstream sent them.
    upstream.push(ScriptedReply::rate_limited("7"));
    let reply = chat(&server, &request, &[]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.headers["retry-after"], "7");
    assert_eq!(reply.json()["error"]["type"], "rate_limit_exceeded");
    assert_eq!(reply.json()["error"]["message"], "scripted status 429");

    // A 500 with no body: the client is told what happened, in its API's error shape.
    upstream.push(ScriptedReply::Status {
        code: 500,
        retry_after: None,
        body: Some(String::new()),
    });
    let reply = chat(&server, &request, &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        message.contains("500") && message.contains("empty body"),
        "{message}"
    );

    // The retried message was stored once, whatever the upstream answered.
    let key = reply.session_key();
    assert_eq!(
        texts(&stored(&server, &key)),
        [(Role::User, "Hello?".to_owned())]
    );
    let metrics = server.get("/metrics").await;
    let text = metrics.body.as_str().unwrap_or_default();
    for series in [
        "lcm_proxy_upstream_errors_total{shape=\"openai\",kind=\"4xx\"} 1",
        "lcm_proxy_upstream_errors_total{shape=\"openai\",kind=\"5xx\"} 1",
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }

    // An upstream nobody listens on: 502, with the URL, in the Anthropic shape for /v1/messages.
    let url = unreachable_upstream();
    let dead = daemon(&url, |_| {}).await;
    let reply = messages(
        &dead,
        &json!({"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY);
    let error = reply.json();
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "upstream_transport");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("{}/messages", &url["http://".len()..])),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_and_store_nothing() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |setup| {
        setup.config.server.max_body_bytes = 4096;
    })
    .await;
    let before = server.stats();
    let cases: [(&str, &[u8], &str); 5] = [
        ("/v1/chat/completions", b"{\"messages\": [{\"role\": \"user\", ", "malformed_json"),
        ("/v1/chat/completions", b"{\"model\": \"m\"}", "invalid_request"),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}]}"#,
            "invalid_message",
        ),
        ("/v1/messages", b"not json", "malformed_json"),
        (
            "/v1/messages",
            br#"{"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}"#,
            "invalid_message",
        ),
    ];
    for (path, body, kind) in cases {
        let reply = call(&server, path, body, &[]).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{path} {}",
            reply.text()
        );
        assert_eq!(reply.json()["error"], kind, "{}", reply.text());
        assert!(
            reply.json()["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    // Over server.max_body_bytes: 413.
    let large = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(8192)}]});
    let reply = chat(&server, &large, &[]).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(reply.json()["error"], "payload_too_large");
    assert_eq!(server.stats(), before, "nothing stored");
    assert_eq!(upstream.request_count(), 0, "nothing forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_upstream_stay_within_the_budget() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |setup| {
        setup.config.compaction.fresh_tail = 4;
    })
    .await;
    let counter = TokenCounter::new(server.runtime.config().tokenizer.encoding());
    let big = |n: usize| {
        (0..n)
            .map(|i| format!("Line {i} of the build log: step {i} compiled module_{i} in {i}ms."))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut history = vec![
        json!({"role": "system", "content": "You read logs."}),
        json!({"role": "user", "content": format!("Here is the log:\n{}", big(400))}),
    ];
    for turn in 0..4 {
        upstream.push(ScriptedReply::ok(format!("Read part {turn}.")));
        let reply = chat(
            &server,
            &json!({"model": "m", "messages": history}),
            &[("x-lcm-session", "budget-demo"), ("x-lcm-budget", "2000")],
        )
        .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        history.push(json!({"role": "assistant", "content": format!("Read part {turn}.")}));
        history.push(json!({"role": "user", "content": format!("More:\n{}", big(3 + turn))}));
    }
    for request in upstream.requests() {
        let tokens = counter.count_text(&request.raw_body);
        assert!(tokens <= 2000, "{tokens} tokens sent upstream");
        // The system prompt is kept and the newest message is there.
        let sent = request.body["messages"].as_array().unwrap();
        assert_eq!(
            sent[0],
            json!({"role": "system", "content": "You read logs."})
        );
        assert_eq!(sent.last().unwrap()["role"], "user");
    }
    // The newest turn is there verbatim, and every earlier one is either raw or under a summary
    // the request carries (at a context budget this small, compaction above the hard
    // threshold may summarise all but the newest two messages).
    let last = upstream.requests().pop().unwrap();
    let sent = last.body["messages"].as_array().unwrap();
    assert_eq!(sent[sent.len() - 2]["content"], "Read part 2.");
    let sent_text = serde_json::to_string(sent).unwrap();
    for turn in 0..2 {
        let raw = sent
            .iter()
            .any(|m| m["content"] == format!("Read part {turn}."));
        assert!(
            raw || sent_text.contains("<lcm_summary"),
            "turn {turn}: {sent:?}"
        );
    }
    // The first message, larger than the whole budget, was compacted (the fresh tail yields in
    // tokens) or shortened for the request, and says where the rest is.
    let first = upstream.requests()[0].body["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        first.contains("the full text is msg_") || first.starts_with("<lcm_summary id=\"sum_"),
        "{first}"
    );
    // Nothing was lost in the store.
    let all = stored(&server, "budget-demo");
    assert_eq!(all.len(), 8);
    assert!(texts(&all)[0].1.contains("Line 399 of the build log"));
    // A budget that cannot hold even the tools is refused before anything is stored or
    // forwarded.
    let count = upstream.request_count();
    let before = server.stats();
    let reply = chat(
        &server,
        &json!({"model": "m", "messages": history}),
        &[("x-lcm-session", "budget-demo"), ("x-lcm-budget", "1024")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(reply.json()["error"], "budget_too_small");
    assert_eq!(upstream.request_count(), count);
    assert_eq!(server.stats(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_lcms_token_is_required_and_never_forwarded() {
    let upstream = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |setup| {
        setup.bind = "0.0.0.0:0".parse().unwrap();
        setup.config.server.token = Some(ADMIN.into());
        setup
            .config
            .server
            .tenants
            .insert(TENANT.into(), "team-a/".into());
    })
    .await;
    let request = json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]});
    let before = server.stats();
    let reply = chat(
        &server,
        &request,
        &[("authorization", "Bearer sk-upstream")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(server.stats(), before);
    assert_eq!(upstream.request_count(), 0);

    // lcm's token in Authorization: accepted, and not sent upstream.
    upstream.push(ScriptedReply::ok("Hello."));
    let admin = format!("Bearer {ADMIN}");
    let reply = chat(&server, &request, &[("authorization", &admin)]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(upstream.requests()[0].header("authorization"), None);

    // lcm's token in x-lcm-token: the client's own Authorization goes upstream.
    upstream.push(ScriptedReply::ok("Hello."));
    let reply = chat(
        &server,
        &request,
        &[
            ("authorization", "Bearer sk-upstream"),
            ("x-lcm-token", ADMIN),
        ],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let sent = &upstream.requests()[1];
    assert_eq!(sent.header("authorization"), Some("Bearer sk-upstream"));
    assert_eq!(sent.header("x-lcm-token"), None);

    // A tenant's conversations get its prefix, and it is offered only the tools it may call.
    upstream.push(ScriptedReply::ok("Hello."));
    let reply = chat(
        &server,
        &request,
        &[("x-lcm-token", TENANT), ("x-lcm-session", "chat-1")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.session_key(), "team-a/chat-1");
    assert_eq!(
        tool_names(&upstream.requests()[2].body),
        ["lcm_grep", "lcm_describe"]
    );
    assert_eq!(stored(&server, "team-a/chat-1").len(), 2);
}

// ---------------------------------------------------------------------------------------------
// Streaming

/// One piece of a scripted stream.
#[derive(Clone)]
enum Piece {
    /// Bytes sent as one chunk.
    Chunk(String),
    /// Waits until the test opens the gate.
    Gate(Arc<Notify>),
}

/// A loopback upstream that streams scripted server-sent events chunk by chunk
/// (`text/event-stream`) and records every request body.
struct StreamingUpstream {
    addr: SocketAddr,
    script: Arc<Mutex<VecDeque<Vec<Piece>>>>,
    requests: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StreamingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StreamingUpstream {
    async fn start() -> StreamingUpstream {
        let script: Arc<Mutex<VecDeque<Vec<Piece>>>> = Arc::default();
        let requests: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (s, r) = (Arc::clone(&script), Arc::clone(&requests));
        let handler = move |body: Bytes| {
            let (script, requests) = (Arc::clone(&s), Arc::clone(&r));
            async move {
                requests
                    .lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                let pieces = script.lock().unwrap().pop_front().unwrap_or_default();
                let stream =
                    futures_util::stream::unfold(pieces.into_iter(), |mut pieces| async move {
                        loop {
                            match pieces.next()? {
                                Piece::Chunk(text) => {
                                    return Some((
                                        Ok::<_, std::io::Error>(Bytes::from(text)),
                                        pieces,
                                    ));
                                }
                                Piece::Gate(gate) => gate.notified().await,
                            }
                        }
                    });
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .header("x-request-id", "req-stream-1")
                    .body(Body::from_stream(stream))
                    .unwrap()
            }
        };
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(handler.clone()))
            .route("/v1/messages", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        StreamingUpstream {
            addr,
            script,
            requests,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn push(&self, pieces: Vec<Piece>) {
        self.script.lock().unwrap().push_back(pieces);
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

fn chunks(pieces: &[Piece]) -> String {
    pieces
        .iter()
        .filter_map(|p| match p {
            Piece::Chunk(text) => Some(text.as_str()),
            Piece::Gate(_) => None,
        })
        .collect()
}

fn openai_text_stream(text: &[&str]) -> Vec<Piece> {
    let chunk = |delta: Value, finish: Value| {
        Piece::Chunk(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        ))
    };
    let mut pieces = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    for piece in text {
        pieces.push(chunk(json!({"content": piece}), Value::Null));
    }
    pieces.push(chunk(json!({}), json!("stop")));
    pieces.push(Piece::Chunk("data: [DONE]\n\n".into()));
    pieces
}

fn openai_tool_stream(name: &str, arguments: &str) -> Vec<Piece> {
    let (head, tail) = arguments.split_at(arguments.len() / 2);
    let chunk = |delta: Value, finish: Value| {
        Piece::Chunk(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-t", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        ))
    };
    vec![
        chunk(json!({"role": "assistant", "content": null}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_s1", "type": "function", "function": {"name": name, "arguments": head}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": tail}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        Piece::Chunk("data: [DONE]\n\n".into()),
    ]
}

fn anthropic_text_stream(text: &[&str]) -> Vec<Piece> {
    let event = |name: &str, data: Value| Piece::Chunk(format!("event: {name}\ndata: {data}\n\n"));
    let mut pieces = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_s", "type": "message", "role": "assistant", "model": "c", "content": [], "stop_reason": null, "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event("ping", json!({"type": "ping"})),
    ];
    for piece in text {
        pieces.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}),
        ));
    }
    pieces.extend([
        event("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 4}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ]);
    pieces
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_as_they_come() {
    let upstream = StreamingUpstream::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    // tool_choice "none": no lcm tools, so events stream through as they arrive. The upstream
    // holds the rest of its answer until the client has seen the first events.
    let gate = Arc::new(Notify::new());
    let mut pieces = openai_text_stream(&["Hello", " world", "!"]);
    pieces.insert(2, Piece::Gate(Arc::clone(&gate)));
    let expected = chunks(&pieces);
    upstream.push(pieces);
    let request = json!({"model": "m", "stream": true, "tool_choice": "none",
                         "messages": [{"role": "user", "content": "Greet me."}]});
    let mut response = server
        .client
        .post(format!("{}/v1/chat/completions", server.url))
        .body(request.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert_eq!(response.headers()["x-request-id"], "req-stream-1");
    let key = response.headers()["x-lcm-session"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut received = Vec::new();
    while !String::from_utf8_lossy(&received).contains("Hello") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("the first events arrive before the upstream finished")
            .unwrap()
            .expect("more");
        received.extend_from_slice(&chunk);
    }
    gate.notify_one();
    while let Some(chunk) = response.chunk().await.unwrap() {
        received.extend_from_slice(&chunk);
    }
    // Byte for byte what the upstream streamed.
    assert_eq!(String::from_utf8(received).unwrap(), expected);
    // The answer, rebuilt from the events, was stored before the stream ended.
    assert_eq!(
        texts(&stored(&server, &key)),
        [
            (Role::User, "Greet me.".to_owned()),
            (Role::Assistant, "Hello world!".to_owned())
        ]
    );

    // The Anthropic shape: the same.
    let pieces = anthropic_text_stream(&["Bonjour", " !"]);
    let expected = chunks(&pieces);
    upstream.push(pieces);
    let reply = messages(
        &server,
        &json!({"model": "c", "max_tokens": 50, "stream": true, "tool_choice": {"type": "none"},
                "messages": [{"role": "user", "content": "Salut"}]}),
        &[],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.text(), expected);
    assert_eq!(
        texts(&stored(&server, &reply.session_key())),
        [
            (Role::User, "Salut".to_owned()),
            (Role::Assistant, "Bonjour !".to_owned())
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_lcm_tool_rounds_never_reach_the_client() {
    let upstream = StreamingUpstream::start().await;
    let server = daemon(&upstream.url(), |_| {}).await;
    let session = [("x-lcm-session", "stream-tools")];
    // An earlier turn holds the fact.
    upstream.push(openai_text_stream(&["Noted."]));
    let mut history =
        vec![json!({"role": "user", "content": "The vault combination is 31-07-1984."})];
    let reply = chat(
        &server,
        &json!({"model": "m", "stream": true, "messages": history}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    history.push(json!({"role": "assistant", "content": "Noted."}));
    history.push(json!({"role": "user", "content": "What is the combination?"}));

    // The model streams an lcm_grep call, then (asked again with the result) the answer.
    upstream.push(openai_tool_stream(
        "lcm_grep",
        r#"{"pattern": "combination is [0-9-]+"}"#,
    ));
    let answer = openai_text_stream(&["It is ", "31-07-1984."]);
    let expected = chunks(&answer);
    upstream.push(answer);
    let reply = chat(
        &server,
        &json!({"model": "m", "stream": true, "messages": history}),
        &session,
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    // Exactly the final round's events.
    assert_eq!(reply.text(), expected);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 3);
    let second = requests[2]["messages"].as_array().unwrap();
    let result = second.last().unwrap();
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], "call_s1");
    assert!(
        result["content"].as_str().unwrap().contains("31-07-1984"),
        "{result}"
    );
    assert_eq!(
        texts(&stored(&server, "stream-tools")).last().unwrap(),
        &(Role::Assistant, "It is 31-07-1984.".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_lists_pass_through_with_the_clients_credentials() {
    let upstream = ScriptedServer::start().await;
    let anthropic_base = format!("{}/anthropic/v1", upstream.root_url());
    let server = daemon(&upstream.url(), |setup| {
        setup.bind = "0.0.0.0:0".parse().unwrap();
        setup.config.server.token = Some(ADMIN.into());
        setup.config.proxy.anthropic_base_url = anthropic_base.clone();
    })
    .await;

    // Beyond loopback lcm's token is required: nothing reaches the upstream without it.
    let reply = get(&server, "/v1/models", &[("authorization", "Bearer sk-up")]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(upstream.request_count(), 0);

    // OpenAI's shape: the client's key goes upstream, lcm's token does not; the list comes back.
    let reply = get(
        &server,
        "/v1/models",
        &[("authorization", "Bearer sk-up"), ("x-lcm-token", ADMIN)],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["data"][0]["id"], "scripted-model");
    let sent = &upstream.requests()[0];
    assert_eq!(sent.method, "GET");
    assert_eq!(sent.path, "/v1/models");
    assert_eq!(sent.header("authorization"), Some("Bearer sk-up"));
    assert_eq!(sent.header("x-lcm-token"), None);

    // Anthropic's clients send anthropic-version: their upstream, their key.
    let reply = get(
        &server,
        "/v1/models",
        &[
            ("x-api-key", "sk-ant"),
            ("anthropic-version", "2023-06-01"),
            ("x-lcm-token", ADMIN),
        ],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let sent = &upstream.requests()[1];
    assert_eq!(sent.path, "/anthropic/v1/models");
    assert_eq!(sent.header("x-api-key"), Some("sk-ant"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_token_counts_pass_through_unchanged_and_store_nothing() {
    let upstream = ScriptedServer::start().await;
    let anthropic_base = format!("{}/anthropic/v1", upstream.root_url());
    let server = daemon(&upstream.url(), |setup| {
        setup.config.proxy.anthropic_base_url = anthropic_base.clone();
    })
    .await;
    let body = json!({
        "model": "claude-test",
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": "How many tokens is this question?"},
            {"role": "assistant", "content": "A few."},
            {"role": "user", "content": "Exactly?"}
        ]
    });
    let raw = serde_json::to_vec_pretty(&body).unwrap();
    let reply = call(
        &server,
        "/v1/messages/count_tokens",
        &raw,
        &[("x-api-key", "sk-ant"), ("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.json()["input_tokens"],
        body["messages"].to_string().len()
    );
    let sent = &upstream.requests()[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/anthropic/v1/messages/count_tokens");
    assert_eq!(
        sent.raw_body.as_bytes(),
        raw.as_slice(),
        "the body goes as sent"
    );
    assert_eq!(sent.header("x-api-key"), Some("sk-ant"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert!(
        server.runtime.store().sessions().unwrap().is_empty(),
        "counting stores nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_gives_a_clear_token_count_error() {
    let server = daemon(&unreachable_upstream(), |_| {}).await;
    let reply = call(
        &server,
        "/v1/messages/count_tokens",
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    // In Anthropic's error shape, naming the call that failed.
    assert_eq!(reply.json()["type"], "error", "{}", reply.text());
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("POST") && message.contains("/v1/messages/count_tokens"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_gives_a_clear_model_list_error() {
    let server = daemon(&unreachable_upstream(), |_| {}).await;
    let reply = get(&server, "/v1/models", &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("GET") && message.contains("/v1/models"),
        "{message}"
    );
}
