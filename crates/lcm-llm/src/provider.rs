//! The chat-completion abstraction every model backend implements.
//!
//! A [`Provider`] turns a [`CompletionRequest`] (an optional system prompt and a list of chat
//! messages) into a [`Completion`] (text, optional reasoning, usage). Implementations own their
//! retries, timeouts and circuit breaking; callers see one `complete` call that either answers or
//! fails with a [`ProviderError`] saying why. The trait is object-safe: the engine holds providers
//! as `Arc<dyn Provider>`.

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Longest error body kept in a [`ProviderError::Server`] or [`ProviderError::Rejected`], in
/// characters.
pub const MAX_ERROR_BODY_CHARS: usize = 500;

/// Who speaks a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// Instructions to the model (sent in the provider's system slot where it has one).
    System,
    /// The user (or the engine speaking for it).
    User,
    /// The model.
    Assistant,
}

impl ChatRole {
    /// The role's name in both API shapes: `system`, `user` or `assistant`.
    pub fn as_str(self) -> &'static str {
        match self {
            ChatRole::System => "system",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        }
    }
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who says it.
    pub role: ChatRole,
    /// What is said (plain text).
    pub content: String,
}

impl ChatMessage {
    /// A message from `role` saying `content`.
    pub fn new(role: ChatRole, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(ChatRole::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(ChatRole::User, content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(ChatRole::Assistant, content)
    }
}

/// A request for one completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The system prompt, if any. OpenAI-shaped providers send it as a leading `system` message,
    /// Anthropic-shaped ones as the top-level `system` field.
    pub system: Option<String>,
    /// The conversation, oldest first. `System` messages in it are kept in place for OpenAI and
    /// appended to the top-level system prompt for Anthropic (which has no system role).
    pub messages: Vec<ChatMessage>,
    /// Sampling temperature.
    pub temperature: f32,
    /// Most tokens the model may generate.
    pub max_tokens: u32,
    /// A model that overrides the provider's configured one for this request.
    pub model: Option<String>,
    /// A JSON Schema the answer must satisfy. OpenAI-shaped providers send it as a structured
    /// output (`response_format` of type `json_schema`), which servers that support it enforce
    /// while decoding; providers without such a feature ignore it (the caller validates the
    /// answer either way).
    pub response_schema: Option<serde_json::Value>,
}

impl CompletionRequest {
    /// A request with one user message, no system prompt, temperature 0 and `max_tokens`.
    pub fn user(content: impl Into<String>, max_tokens: u32) -> Self {
        CompletionRequest {
            system: None,
            messages: vec![ChatMessage::user(content)],
            temperature: 0.0,
            max_tokens,
            model: None,
            response_schema: None,
        }
    }
}

/// A model's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Completion {
    /// The answer text (text blocks joined); empty when the model produced none.
    pub text: String,
    /// Reasoning the provider returned separately (`reasoning_content` / `reasoning` in the
    /// OpenAI shape, `thinking` blocks in the Anthropic shape).
    pub reasoning: Option<String>,
    /// Why generation stopped, as the provider says it (`stop`, `length`, `end_turn`, ...).
    pub finish_reason: Option<String>,
    /// Prompt tokens the provider reported.
    pub input_tokens: Option<u32>,
    /// Generated tokens the provider reported.
    pub output_tokens: Option<u32>,
}

impl Completion {
    /// True when the answer has no text but some reasoning: the model thought and said nothing.
    pub fn is_reasoning_only(&self) -> bool {
        self.text.trim().is_empty()
            && self
                .reasoning
                .as_deref()
                .is_some_and(|reasoning| !reasoning.trim().is_empty())
    }
}

/// Why a provider call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The call (one HTTP attempt, or the last of its retries) took longer than the configured
    /// timeout, or the server answered 408.
    #[error("the provider did not answer in time")]
    Timeout,
    /// The provider answered 429 (after the retries, if any, were used up).
    #[error("rate limited by the provider{}", retry_after_suffix(.retry_after))]
    RateLimited {
        /// How long the provider asked us to wait (`Retry-After`), if it said.
        retry_after: Option<Duration>,
    },
    /// The provider answered with a 5xx status.
    #[error("provider server error {status}: {body}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// The start of the response body (at most [`MAX_ERROR_BODY_CHARS`] characters).
        body: String,
    },
    /// The provider refused the credentials (401 or 403).
    #[error("the provider refused the credentials (HTTP {status}); check the API key")]
    Auth {
        /// The HTTP status.
        status: u16,
    },
    /// The provider refused the request with another 4xx status (bad request, unknown model,
    /// context too long, ...). Retrying the same request cannot help.
    #[error("the provider rejected the request (HTTP {status}): {body}")]
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The start of the response body (at most [`MAX_ERROR_BODY_CHARS`] characters).
        body: String,
    },
    /// The provider answered 2xx with a body that is not the expected JSON.
    #[error("unparseable provider response: {0}")]
    BadResponse(String),
    /// The circuit breaker is open after repeated failures: no request was sent.
    #[error("circuit breaker open after repeated provider failures; no request was sent")]
    CircuitOpen {
        /// When the breaker lets one probe request through again.
        until: tokio::time::Instant,
    },
    /// The request could not be sent or its answer not read (connection refused, reset, DNS,
    /// TLS).
    #[error("transport error: {0}")]
    Transport(String),
    /// The provider is misconfigured (bad base URL, TLS initialisation failed, ...).
    #[error("provider configuration error: {0}")]
    Config(String),
}

fn retry_after_suffix(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(wait) => format!(" (retry after {:.1} s)", wait.as_secs_f64()),
        None => String::new(),
    }
}

impl ProviderError {
    /// True for failures that may go away if the same request is sent again: timeouts, rate
    /// limits, 5xx answers and transport errors. Auth failures, rejected requests, unparseable
    /// answers, an open circuit and configuration errors are not retried.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ProviderError::Timeout
                | ProviderError::RateLimited { .. }
                | ProviderError::Server { .. }
                | ProviderError::Transport(_)
        )
    }

    /// A short stable name of the variant (`timeout`, `rate_limited`, ...), for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ProviderError::Timeout => "timeout",
            ProviderError::RateLimited { .. } => "rate_limited",
            ProviderError::Server { .. } => "server",
            ProviderError::Auth { .. } => "auth",
            ProviderError::Rejected { .. } => "rejected",
            ProviderError::BadResponse(_) => "bad_response",
            ProviderError::CircuitOpen { .. } => "circuit_open",
            ProviderError::Transport(_) => "transport",
            ProviderError::Config(_) => "config",
        }
    }
}

/// Keeps at most [`MAX_ERROR_BODY_CHARS`] characters of an error body, marking the cut.
pub(crate) fn truncate_body(body: &str) -> String {
    let body = body.trim();
    match body.char_indices().nth(MAX_ERROR_BODY_CHARS) {
        Some((cut, _)) => format!("{}...", &body[..cut]),
        None => body.to_owned(),
    }
}

/// A chat-completion backend.
///
/// Implementations are cheap to share (`Arc<dyn Provider>`) and safe to call concurrently.
/// `complete` makes at most `1 + max_retries` HTTP requests (see [`crate::HttpConfig`]) and
/// returns within about `(1 + max_retries) x (timeout + backoff_max x 4)`.
#[async_trait]
pub trait Provider: Send + Sync {
    /// A short name for logs (`openai`, `anthropic`, ...).
    fn name(&self) -> &str;

    /// Asks the model for one completion.
    async fn complete(&self, request: &CompletionRequest) -> Result<Completion, ProviderError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_truncated_to_500_chars() {
        let long = "é".repeat(2000);
        let cut = truncate_body(&long);
        assert_eq!(cut.chars().count(), MAX_ERROR_BODY_CHARS + 3);
        assert_eq!(truncate_body("short"), "short");
    }

    #[test]
    fn retryable_kinds() {
        assert!(ProviderError::Timeout.is_retryable());
        assert!(ProviderError::RateLimited { retry_after: None }.is_retryable());
        assert!(
            ProviderError::Server {
                status: 503,
                body: String::new()
            }
            .is_retryable()
        );
        assert!(ProviderError::Transport("reset".into()).is_retryable());
        assert!(!ProviderError::Auth { status: 401 }.is_retryable());
        assert!(!ProviderError::BadResponse("x".into()).is_retryable());
        assert!(!ProviderError::Config("x".into()).is_retryable());
        assert!(
            !ProviderError::Rejected {
                status: 400,
                body: String::new()
            }
            .is_retryable()
        );
    }

    #[test]
    fn provider_is_object_safe() {
        fn assert_send_sync<T: Send + Sync + ?Sized>() {}
        assert_send_sync::<dyn Provider>();
        assert_send_sync::<ProviderError>();
    }

    #[test]
    fn reasoning_only() {
        let mut completion = Completion {
            reasoning: Some("thinking".into()),
            ..Completion::default()
        };
        assert!(completion.is_reasoning_only());
        completion.text = "answer".into();
        assert!(!completion.is_reasoning_only());
    }
}
