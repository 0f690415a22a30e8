//! The Anthropic Messages client against the scripted loopback server: endpoint rule, headers
//! (`x-api-key`, `anthropic-version`), top-level `system`, text and thinking blocks.

use crate::common::{KEY, MODEL, fast_config};
use lcm_llm::testing::{ApiShape, ScriptedReply, ScriptedServer};
use lcm_llm::{AnthropicProvider, ChatMessage, CompletionRequest, HttpConfig, Provider};

#[tokio::test]
async fn normal_path_request_and_response() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok_with_reasoning("Done.", "considering"));
    let provider = AnthropicProvider::new(fast_config(&server)).unwrap();
    // The base URL ends in /v1: requests go to {base}/messages.
    assert_eq!(provider.endpoint(), format!("{}/messages", server.url()));

    let request = CompletionRequest {
        system: Some("Be brief.".into()),
        messages: vec![
            ChatMessage::system("Also: be exact."),
            ChatMessage::user("Summarise."),
        ],
        temperature: 0.1,
        max_tokens: 300,
        model: None,
        response_schema: None,
    };
    let completion = provider.complete(&request).await.unwrap();
    assert_eq!(completion.text, "Done.");
    assert_eq!(completion.reasoning.as_deref(), Some("considering"));
    assert_eq!(completion.finish_reason.as_deref(), Some("end_turn"));
    assert_eq!(completion.output_tokens, Some(1));

    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.shape(), ApiShape::Anthropic);
    assert_eq!(sent.header("x-api-key"), Some(KEY));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(sent.header("authorization"), None);
    let body = &sent.body;
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["max_tokens"], 300);
    assert_eq!(body["temperature"].to_string(), "0.1");
    assert_eq!(body["system"], "Be brief.\n\nAlso: be exact.");
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        1,
        "system messages move to the top-level field"
    );
    assert_eq!(messages[0]["role"], "user");
    assert_eq!(messages[0]["content"], "Summarise.");
}

#[tokio::test]
async fn root_base_url_gets_v1_messages() {
    let server = ScriptedServer::start().await;
    let config = HttpConfig {
        base_url: server.root_url(),
        ..fast_config(&server)
    };
    let provider = AnthropicProvider::new(config).unwrap();
    assert_eq!(
        provider.endpoint(),
        format!("{}/v1/messages", server.root_url())
    );
    let completion = provider
        .complete(&CompletionRequest::user("alpha beta gamma delta", 20))
        .await
        .unwrap();
    assert_eq!(completion.text, "Summary: alpha");
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert!(
        sent.body.get("system").is_none(),
        "no system prompt, no field"
    );
}

#[tokio::test]
async fn empty_and_reasoning_only_outputs() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::Empty);
    server.push(ScriptedReply::reasoning_only("hmm"));
    let provider = AnthropicProvider::new(fast_config(&server)).unwrap();
    let empty = provider
        .complete(&CompletionRequest::user("x", 5))
        .await
        .unwrap();
    assert_eq!(empty.text, "");
    assert_eq!(empty.reasoning, None);
    let thinking = provider
        .complete(&CompletionRequest::user("x", 5))
        .await
        .unwrap();
    assert!(thinking.is_reasoning_only());
    assert_eq!(provider.name(), "anthropic");
}
