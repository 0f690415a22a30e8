//! A client for the Anthropic Messages API.
//!
//! # Endpoint rule
//!
//! Requests go to `{base_url}/v1/messages`, unless `base_url` (without trailing slashes) already
//! ends in `/v1`, in which case they go to `{base_url}/messages`. So both
//! `https://api.anthropic.com` (Anthropic's documented base) and `http://127.0.0.1:8089/v1` (the
//! shape OpenAI-style configurations use, and the local test model's) work.
//!
//! Headers: `x-api-key` (omitted when there is no key), `anthropic-version: 2023-06-01`.
//! The system prompt (and any `System` messages of the request, in order) goes in the top-level
//! `system` field; the other messages go in `messages`. The answer's text blocks are joined into
//! the text and its `thinking` blocks into the reasoning; usage is `usage.input_tokens` /
//! `usage.output_tokens`, the finish reason `stop_reason`.

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::http::{HttpClient, HttpConfig};
use crate::openai::{json_temperature, usage_field};
use crate::provider::{ChatRole, Completion, CompletionRequest, Provider, ProviderError};

/// The `anthropic-version` header value sent.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// An Anthropic Messages provider.
pub struct AnthropicProvider {
    http: HttpClient,
    url: String,
}

impl std::fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("url", &self.url)
            .field("config", self.http.config())
            .finish()
    }
}

/// The Messages endpoint for `base_url` (see the module documentation).
pub fn messages_endpoint(base_url: &str) -> String {
    let base = base_url.trim_end_matches('/');
    if base.ends_with("/v1") {
        format!("{base}/messages")
    } else {
        format!("{base}/v1/messages")
    }
}

impl AnthropicProvider {
    /// Anthropic's own API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";
    /// The environment variable read for the key (after `LCM_LLM_API_KEY`) when the
    /// configuration has none.
    pub const API_KEY_ENV: &'static str = "ANTHROPIC_API_KEY";

    /// A provider for `config`. Fails only on a bad configuration (URL scheme, zero timeout,
    /// empty model) or when the HTTP client cannot be built.
    pub fn new(config: HttpConfig) -> Result<Self, ProviderError> {
        let url = messages_endpoint(&config.base_url);
        let http = HttpClient::new(config, "anthropic", Self::API_KEY_ENV)?;
        Ok(AnthropicProvider { http, url })
    }

    /// Sends requests to exactly `endpoint` instead of the one the endpoint rule derives from
    /// the base URL (for a caller that already knows the full URL, such as the proxy, whose
    /// upstream is its base URL + `/messages`).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.url = endpoint.into();
        self
    }

    /// The endpoint requests go to.
    pub fn endpoint(&self) -> &str {
        &self.url
    }

    /// The configured model.
    pub fn model(&self) -> &str {
        &self.http.config().model
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &CompletionRequest) -> Result<Value, ProviderError> {
        let mut system: Vec<&str> = request.system.iter().map(String::as_str).collect();
        let mut messages = Vec::with_capacity(request.messages.len());
        for message in &request.messages {
            match message.role {
                ChatRole::System => system.push(&message.content),
                role => messages.push(json!({ "role": role.as_str(), "content": message.content })),
            }
        }
        let mut body = json!({
            "model": request.model.as_deref().unwrap_or(self.model()),
            "max_tokens": request.max_tokens,
            "messages": messages,
            "temperature": json_temperature(request.temperature)?,
        });
        if !system.is_empty() {
            body["system"] = Value::from(system.join("\n\n"));
        }
        Ok(body)
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
    }

    async fn complete(&self, request: &CompletionRequest) -> Result<Completion, ProviderError> {
        let body = self.request_body(request)?;
        let answer = self.post(&body).await?;
        parse_response(&answer)
    }
}

impl AnthropicProvider {
    /// POSTs `body` to the endpoint with the version and key headers, through the shared HTTP
    /// layer (timeouts, retries, circuit breaker); used by completions and by tool-using chat.
    pub(crate) async fn post(&self, body: &Value) -> Result<Value, ProviderError> {
        let mut headers = vec![("anthropic-version", ANTHROPIC_VERSION.to_owned())];
        if let Some(key) = self.http.api_key() {
            headers.push(("x-api-key", key.to_owned()));
        }
        self.http.post_json(&self.url, &headers, body).await
    }
}

/// Parses a Messages answer.
pub fn parse_response(answer: &Value) -> Result<Completion, ProviderError> {
    if answer.get("type").and_then(Value::as_str) == Some("error") {
        return Err(ProviderError::BadResponse(format!(
            "the answer is an error object: {}",
            answer.get("error").unwrap_or(&Value::Null)
        )));
    }
    let blocks = answer
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ProviderError::BadResponse("the answer has no content array".into()))?;
    let mut text = String::new();
    let mut thinking: Vec<&str> = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking") => {
                if let Some(thought) = block.get("thinking").and_then(Value::as_str) {
                    thinking.push(thought);
                }
            }
            // tool_use, redacted_thinking and future block types carry no text for us.
            _ => {}
        }
    }
    let usage = answer.get("usage").cloned().unwrap_or(Value::Null);
    Ok(Completion {
        text,
        reasoning: (!thinking.is_empty()).then(|| thinking.join("\n")),
        finish_reason: answer
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input_tokens: usage_field(&usage, "input_tokens"),
        output_tokens: usage_field(&usage, "output_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_rule() {
        assert_eq!(
            messages_endpoint("https://api.anthropic.com"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            messages_endpoint("https://api.anthropic.com/"),
            "https://api.anthropic.com/v1/messages"
        );
        assert_eq!(
            messages_endpoint("http://127.0.0.1:8089/v1/"),
            "http://127.0.0.1:8089/v1/messages"
        );
        assert_eq!(
            messages_endpoint("http://proxy/anthropic"),
            "http://proxy/anthropic/v1/messages"
        );
    }

    #[test]
    fn parses_blocks() {
        let answer = json!({
            "type": "message",
            "content": [
                {"type": "thinking", "thinking": "let me see"},
                {"type": "text", "text": "Hello, "},
                {"type": "text", "text": "world"}
            ],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 4}
        });
        let completion = parse_response(&answer).unwrap();
        assert_eq!(completion.text, "Hello, world");
        assert_eq!(completion.reasoning.as_deref(), Some("let me see"));
        assert_eq!(completion.finish_reason.as_deref(), Some("end_turn"));
        assert_eq!(
            (completion.input_tokens, completion.output_tokens),
            (Some(10), Some(4))
        );
    }

    #[test]
    fn rejects_wrong_shapes() {
        for bad in [
            json!({}),
            json!({"content": "x"}),
            json!({"type": "error", "error": {"type": "x"}}),
        ] {
            assert!(matches!(
                parse_response(&bad),
                Err(ProviderError::BadResponse(_))
            ));
        }
    }
}
