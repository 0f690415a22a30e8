//! The circuit breaker over real HTTP: it opens after N consecutive failures, refuses calls
//! without sending a request, lets one probe through after the cooldown, and closes on success
//! or reopens on failure.

use std::time::Duration;

use crate::common::fast_config;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use lcm_llm::{CompletionRequest, OpenAiProvider, Provider, ProviderError};

fn request() -> CompletionRequest {
    CompletionRequest::user("hello there friend", 10)
}

fn provider(server: &ScriptedServer, cooldown: Duration) -> OpenAiProvider {
    let config = fast_config(server)
        .with_max_retries(0)
        .with_circuit(3, cooldown);
    OpenAiProvider::new(config).unwrap()
}

#[tokio::test]
async fn opens_rejects_without_request_then_half_opens_and_closes() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(500));
    let provider = provider(&server, Duration::from_secs(1));
    for _ in 0..3 {
        assert!(matches!(
            provider.complete(&request()).await,
            Err(ProviderError::Server { status: 500, .. })
        ));
    }
    assert_eq!(server.request_count(), 3);

    // Open: refused locally, nothing sent.
    for _ in 0..5 {
        let error = provider.complete(&request()).await.unwrap_err();
        assert!(
            matches!(error, ProviderError::CircuitOpen { .. }),
            "{error:?}"
        );
        assert!(!error.is_retryable());
    }
    assert_eq!(server.request_count(), 3);

    // After the cooldown one probe goes through; it succeeds and the breaker closes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    server.set_default(ScriptedReply::ok("back"));
    assert_eq!(provider.complete(&request()).await.unwrap().text, "back");
    assert_eq!(server.request_count(), 4);
    for _ in 0..3 {
        provider.complete(&request()).await.unwrap();
    }
    assert_eq!(server.request_count(), 7);
}

#[tokio::test]
async fn failed_probe_reopens_for_another_cooldown() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(503));
    let provider = provider(&server, Duration::from_secs(1));
    for _ in 0..3 {
        let _ = provider.complete(&request()).await;
    }
    assert!(matches!(
        provider.complete(&request()).await,
        Err(ProviderError::CircuitOpen { .. })
    ));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // The probe fails: one request, then open again at once.
    assert!(matches!(
        provider.complete(&request()).await,
        Err(ProviderError::Server { status: 503, .. })
    ));
    assert_eq!(server.request_count(), 4);
    assert!(matches!(
        provider.complete(&request()).await,
        Err(ProviderError::CircuitOpen { .. })
    ));
    assert_eq!(server.request_count(), 4);
}

#[tokio::test]
async fn retries_count_toward_the_breaker_and_the_real_error_is_returned() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(500));
    // 3 failures open the breaker; a call with 5 retries stops after the third attempt and
    // reports the server error, not the breaker.
    let config = fast_config(&server)
        .with_max_retries(5)
        .with_circuit(3, Duration::from_secs(60));
    let provider = OpenAiProvider::new(config).unwrap();
    assert!(matches!(
        provider.complete(&request()).await,
        Err(ProviderError::Server { status: 500, .. })
    ));
    assert_eq!(server.request_count(), 3);
    assert!(matches!(
        provider.complete(&request()).await,
        Err(ProviderError::CircuitOpen { .. })
    ));
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn rejected_requests_do_not_open_the_breaker() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(400));
    let provider = provider(&server, Duration::from_secs(60));
    for _ in 0..6 {
        assert!(matches!(
            provider.complete(&request()).await,
            Err(ProviderError::Rejected { status: 400, .. })
        ));
    }
    assert_eq!(server.request_count(), 6);
}

#[tokio::test]
async fn each_provider_has_its_own_breaker() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(500));
    let first = provider(&server, Duration::from_secs(60));
    for _ in 0..3 {
        let _ = first.complete(&request()).await;
    }
    assert!(matches!(
        first.complete(&request()).await,
        Err(ProviderError::CircuitOpen { .. })
    ));
    let second = provider(&server, Duration::from_secs(60));
    server.set_default(ScriptedReply::ok("fine"));
    assert_eq!(second.complete(&request()).await.unwrap().text, "fine");
}
