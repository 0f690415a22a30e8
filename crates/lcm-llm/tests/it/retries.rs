//! Retries, backoff, Retry-After, timeouts and failure classification, over real HTTP against
//! the scripted loopback server.

use std::time::{Duration, Instant};

use crate::common::fast_config;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use lcm_llm::{AnthropicProvider, CompletionRequest, OpenAiProvider, Provider, ProviderError};

fn request() -> CompletionRequest {
    CompletionRequest::user("Summarise this please.", 50)
}

#[tokio::test]
async fn rate_limit_with_retry_after_then_success() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::rate_limited("1"));
    server.push(ScriptedReply::ok("fine"));
    // backoff_max 2 s: Retry-After is capped at 8 s, so the 1 s wait is honoured as asked.
    let config =
        fast_config(&server).with_backoff(Duration::from_millis(5), Duration::from_secs(2));
    let provider = OpenAiProvider::new(config).unwrap();
    let started = Instant::now();
    let completion = provider.complete(&request()).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(completion.text, "fine");
    assert_eq!(server.request_count(), 2);
    assert!(elapsed >= Duration::from_secs(1), "waited only {elapsed:?}");
    assert!(elapsed < Duration::from_secs(4), "waited {elapsed:?}");
}

#[tokio::test]
async fn retry_after_http_date_and_cap() {
    let server = ScriptedServer::start().await;
    // An hour away: capped at 4 x backoff_max = 160 ms.
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(3600));
    server.push(ScriptedReply::rate_limited(date));
    server.push(ScriptedReply::rate_limited("3600"));
    server.push(ScriptedReply::ok("fine"));
    let provider = AnthropicProvider::new(fast_config(&server)).unwrap();
    let started = Instant::now();
    let completion = provider.complete(&request()).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(completion.text, "fine");
    assert_eq!(server.request_count(), 3);
    assert!(
        elapsed >= Duration::from_millis(300),
        "waited only {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "the cap was not applied: {elapsed:?}"
    );
}

#[tokio::test]
async fn rate_limit_exhausted_reports_retry_after() {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::rate_limited("0"));
    let provider = OpenAiProvider::new(fast_config(&server).with_max_retries(2)).unwrap();
    let error = provider.complete(&request()).await.unwrap_err();
    assert_eq!(
        error,
        ProviderError::RateLimited {
            retry_after: Some(Duration::ZERO)
        }
    );
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn server_errors_exhaust_after_max_retries_plus_one() {
    for max_retries in [0, 1, 3] {
        let server = ScriptedServer::start().await;
        server.set_default(ScriptedReply::status(503));
        let config = fast_config(&server).with_max_retries(max_retries);
        let provider = OpenAiProvider::new(config).unwrap();
        let error = provider.complete(&request()).await.unwrap_err();
        match &error {
            ProviderError::Server { status, body } => {
                assert_eq!(*status, 503);
                assert!(body.contains("scripted status 503"), "{body}");
            }
            other => panic!("expected a server error, got {other:?}"),
        }
        assert!(error.is_retryable());
        assert_eq!(server.request_count(), max_retries as usize + 1);
    }
}

#[tokio::test]
async fn server_error_then_success_is_retried() {
    let server = ScriptedServer::start().await;
    server.push_all([
        ScriptedReply::status(500),
        ScriptedReply::status(502),
        ScriptedReply::ok("ok"),
    ]);
    let provider = AnthropicProvider::new(fast_config(&server)).unwrap();
    assert_eq!(provider.complete(&request()).await.unwrap().text, "ok");
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn long_error_bodies_are_truncated() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::Status {
        code: 500,
        retry_after: None,
        body: Some("x".repeat(5000)),
    });
    let provider = OpenAiProvider::new(fast_config(&server).with_max_retries(0)).unwrap();
    match provider.complete(&request()).await.unwrap_err() {
        ProviderError::Server { body, .. } => assert!(body.chars().count() <= 503),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn timeout_then_retry_succeeds_and_timeout_exhausts() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::delayed(
        Duration::from_secs(3),
        ScriptedReply::ok("late"),
    ));
    server.push(ScriptedReply::ok("on time"));
    let config = fast_config(&server).with_timeout(Duration::from_millis(300));
    let provider = OpenAiProvider::new(config.clone()).unwrap();
    let started = Instant::now();
    assert_eq!(provider.complete(&request()).await.unwrap().text, "on time");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(server.request_count(), 2);

    server.reset();
    server.set_default(ScriptedReply::delayed(
        Duration::from_secs(3),
        ScriptedReply::ok("late"),
    ));
    let provider = OpenAiProvider::new(config.with_max_retries(1)).unwrap();
    let started = Instant::now();
    assert_eq!(
        provider.complete(&request()).await.unwrap_err(),
        ProviderError::Timeout
    );
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(600), "{elapsed:?}");
    // Well under the 3 s the server would have taken.
    assert!(elapsed < Duration::from_millis(2900), "{elapsed:?}");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn garbage_body_is_a_bad_response_not_retried() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::garbage("<html>502 Bad Gateway</html>"));
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    let error = provider.complete(&request()).await.unwrap_err();
    match &error {
        ProviderError::BadResponse(detail) => assert!(detail.contains("Bad Gateway"), "{detail}"),
        other => panic!("expected BadResponse, got {other:?}"),
    }
    assert!(!error.is_retryable());
    assert_eq!(server.request_count(), 1);

    // Valid JSON of the wrong shape is a bad response too, in both shapes.
    server.push(ScriptedReply::garbage("{\"unexpected\": true}"));
    assert!(matches!(
        provider.complete(&request()).await,
        Err(ProviderError::BadResponse(_))
    ));
    let anthropic = AnthropicProvider::new(fast_config(&server)).unwrap();
    server.push(ScriptedReply::garbage(""));
    assert!(matches!(
        anthropic.complete(&request()).await,
        Err(ProviderError::BadResponse(_))
    ));
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::status(401));
    server.push(ScriptedReply::status(400));
    server.push(ScriptedReply::status(404));
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    assert_eq!(
        provider.complete(&request()).await.unwrap_err(),
        ProviderError::Auth { status: 401 }
    );
    assert!(matches!(
        provider.complete(&request()).await.unwrap_err(),
        ProviderError::Rejected { status: 400, .. }
    ));
    assert!(matches!(
        provider.complete(&request()).await.unwrap_err(),
        ProviderError::Rejected { status: 404, .. }
    ));
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn request_timeout_status_is_retried() {
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::status(408));
    server.push(ScriptedReply::ok("ok"));
    let provider = OpenAiProvider::new(fast_config(&server)).unwrap();
    assert_eq!(provider.complete(&request()).await.unwrap().text, "ok");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn connection_refused_is_a_transport_error_after_retries() {
    // Bind and drop a listener to get a port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = lcm_llm::HttpConfig::new(format!("http://127.0.0.1:{port}/v1"), "m")
        .with_api_key("k")
        .with_max_retries(2)
        .with_backoff(Duration::from_millis(5), Duration::from_millis(20));
    let provider = OpenAiProvider::new(config).unwrap();
    let error = provider.complete(&request()).await.unwrap_err();
    assert!(matches!(error, ProviderError::Transport(_)), "{error:?}");
    assert!(error.is_retryable());
}
