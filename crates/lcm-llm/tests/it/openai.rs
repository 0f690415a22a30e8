//! The OpenAI-compatible client against the scripted loopback server: request shape (model,
//! temperature, max_tokens, system placement, bearer auth) and response parsing.

use crate::common::{KEY, MODEL, fast_config};
use lcm_llm::testing::{ApiShape, ScriptedReply, ScriptedServer};
use lcm_llm::{ChatMessage, CompletionRequest, OpenAiProvider, Provider, ProviderError};

fn request() -> CompletionRequest {
    CompletionRequest {
        system: Some("You are terse.".into()),
        messages: vec![
            ChatMessage::user("Say hi."),
            ChatMessage::assistant("Hi."),
            ChatMessage::user("Again."),
        ],
        temperature: 0.2,
        max_tokens: 77,
        model: None,
        response_schema: None,
    }
}

#[tokio::test]
async fn normal_path_request_and_response() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok("Hello there."));
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    assert_eq!(
        provider.endpoint(),
        format!("{}/chat/completions", server.url())
    );

    let completion = provider.complete(&request()).await.unwrap();
    assert_eq!(completion.text, "Hello there.");
    assert_eq!(completion.reasoning, None);
    assert_eq!(completion.finish_reason.as_deref(), Some("stop"));
    assert!(completion.input_tokens.is_some() && completion.output_tokens == Some(2));

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(sent.method, "POST");
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.shape(), ApiShape::OpenAi);
    assert_eq!(
        sent.header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(sent.header("x-api-key"), None);
    assert!(
        sent.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
    let body = &sent.body;
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["temperature"].as_f64(), Some(0.2));
    assert_eq!(body["temperature"].to_string(), "0.2");
    assert_eq!(body["max_tokens"], 77);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[0]["content"], "You are terse.");
    assert_eq!(messages[1]["role"], "user");
    assert_eq!(messages[2]["role"], "assistant");
    assert_eq!(messages[3]["content"], "Again.");
    assert!(body.get("system").is_none());
}

#[tokio::test]
async fn reasoning_and_model_override() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok_with_reasoning("42", "six times seven"));
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    let mut req = CompletionRequest::user("What is 6 x 7?", 10);
    req.model = Some("other-model".into());
    let completion = provider.complete(&req).await.unwrap();
    assert_eq!(completion.text, "42");
    assert_eq!(completion.reasoning.as_deref(), Some("six times seven"));
    let sent = &server.requests()[0];
    assert_eq!(sent.body["model"], "other-model");
    assert_eq!(sent.body["messages"].as_array().unwrap().len(), 1);
    assert_eq!(sent.body["temperature"].to_string(), "0.0");
}

#[tokio::test]
async fn empty_output_is_an_empty_completion() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::Empty);
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    let completion = provider.complete(&request()).await.unwrap();
    assert_eq!(completion.text, "");
    assert!(!completion.is_reasoning_only());
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn trailing_slash_and_bad_config() {
    let server = ScriptedServer::start().await;
    let mut config = fast_config(&server);
    config.base_url.push('/');
    let provider = OpenAiProvider::new(config).unwrap();
    provider.complete(&request()).await.unwrap();
    assert_eq!(server.requests()[0].path, "/v1/chat/completions");

    let bad = OpenAiProvider::new(lcm_llm::HttpConfig::new("localhost:1/v1", MODEL));
    assert!(matches!(bad, Err(ProviderError::Config(_))));
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    let mut nan = request();
    nan.temperature = f32::NAN;
    assert!(matches!(
        provider.complete(&nan).await,
        Err(ProviderError::Config(_))
    ));
}

#[tokio::test]
async fn usable_as_a_shared_trait_object() {
    let server = ScriptedServer::start().await;
    let provider: std::sync::Arc<dyn Provider> =
        std::sync::Arc::new(OpenAiProvider::new(fast_config(&server)).unwrap());
    assert_eq!(provider.name(), "openai");
    let mut tasks = Vec::new();
    for i in 0..8 {
        let provider = provider.clone();
        tasks.push(tokio::spawn(async move {
            provider
                .complete(&CompletionRequest::user(
                    format!("one two three four item {i}"),
                    10,
                ))
                .await
        }));
    }
    for task in tasks {
        let completion = task.await.unwrap().unwrap();
        assert!(
            completion.text.starts_with("Summary: "),
            "{}",
            completion.text
        );
    }
    assert_eq!(server.request_count(), 8);
}

#[tokio::test]
async fn a_response_schema_is_sent_as_a_structured_output_unless_turned_off() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::ok("{\"label\": \"NUM\"}"));
    server.push(ScriptedReply::ok("{\"label\": \"NUM\"}"));
    let schema =
        serde_json::json!({"type": "object", "properties": {"label": {"enum": ["NUM", "LOC"]}}});
    let mut with_schema = request();
    with_schema.response_schema = Some(schema.clone());

    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    provider.complete(&with_schema).await.unwrap();
    let sent = &server.requests()[0].body;
    assert_eq!(sent["response_format"]["type"], "json_schema");
    assert_eq!(sent["response_format"]["json_schema"]["schema"], schema);
    assert_eq!(sent["response_format"]["json_schema"]["strict"], false);

    // A server that refuses the field: not sent.
    let plain = OpenAiProvider::new(fast_config(&server))
        .unwrap()
        .with_structured_output(false);
    plain.complete(&with_schema).await.unwrap();
    assert!(server.requests()[1].body.get("response_format").is_none());
    // Without a schema nothing is added.
    assert!(
        provider
            .request_body(&request())
            .unwrap()
            .get("response_format")
            .is_none()
    );
}
