//! A client for OpenAI-compatible Chat Completions APIs.
//!
//! `POST {base_url}/chat/completions` with `Authorization: Bearer <key>` (omitted when there is
//! no key, for local servers). The base URL includes the version segment, as OpenAI's SDKs expect:
//! `https://api.openai.com/v1`, `http://127.0.0.1:8089/v1`.
//!
//! The request carries `model`, `messages` (the system prompt first, as a `system` message),
//! `temperature` and `max_tokens`. The answer's text is `choices[0].message.content` (a string,
//! or an array of text parts as some compatible servers send), its reasoning
//! `choices[0].message.reasoning_content` or `.reasoning` when present, and its usage
//! `usage.prompt_tokens` / `usage.completion_tokens`.

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::http::{HttpClient, HttpConfig};
use crate::provider::{Completion, CompletionRequest, Provider, ProviderError};

/// An OpenAI-compatible Chat Completions provider.
pub struct OpenAiProvider {
    http: HttpClient,
    url: String,
    structured_output: bool,
}

impl std::fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("url", &self.url)
            .field("config", self.http.config())
            .finish()
    }
}

impl OpenAiProvider {
    /// OpenAI's own API.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";
    /// The environment variable read for the key (after `LCM_LLM_API_KEY`) when the
    /// configuration has none.
    pub const API_KEY_ENV: &'static str = "OPENAI_API_KEY";

    /// A provider for `config`. Fails only on a bad configuration (URL scheme, zero timeout,
    /// empty model) or when the HTTP client cannot be built.
    pub fn new(config: HttpConfig) -> Result<Self, ProviderError> {
        let url = format!("{}/chat/completions", config.base_url_trimmed());
        let http = HttpClient::new(config, "openai", Self::API_KEY_ENV)?;
        Ok(OpenAiProvider {
            http,
            url,
            structured_output: true,
        })
    }

    /// Whether a request's `response_schema` is sent as `response_format` (the default), or
    /// left out for a server that refuses the field.
    pub fn with_structured_output(mut self, enabled: bool) -> Self {
        self.structured_output = enabled;
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
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if let Some(system) = &request.system {
            messages.push(json!({ "role": "system", "content": system }));
        }
        for message in &request.messages {
            messages.push(json!({ "role": message.role.as_str(), "content": message.content }));
        }
        let mut body = json!({
            "model": request.model.as_deref().unwrap_or(self.model()),
            "messages": messages,
            "temperature": json_temperature(request.temperature)?,
            "max_tokens": request.max_tokens,
        });
        if let Some(schema) = request
            .response_schema
            .as_ref()
            .filter(|_| self.structured_output)
        {
            // Not `strict`: OpenAI's strict mode accepts only a subset of JSON Schema, and the
            // caller validates the answer against the full schema anyway.
            body["response_format"] = json!({
                "type": "json_schema",
                "json_schema": {"name": "result", "schema": schema, "strict": false},
            });
        }
        Ok(body)
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    async fn complete(&self, request: &CompletionRequest) -> Result<Completion, ProviderError> {
        let body = self.request_body(request)?;
        let answer = self.post(&body).await?;
        parse_response(&answer)
    }
}

impl OpenAiProvider {
    /// POSTs `body` to the endpoint with the auth header, through the shared HTTP layer
    /// (timeouts, retries, circuit breaker); used by completions and by tool-using chat.
    pub(crate) async fn post(&self, body: &Value) -> Result<Value, ProviderError> {
        let mut headers = vec![];
        if let Some(key) = self.http.api_key() {
            headers.push(("authorization", format!("Bearer {key}")));
        }
        self.http.post_json(&self.url, &headers, body).await
    }
}

/// A temperature as JSON, printed the way it was written (`0.2`, not `0.20000000298023224`).
pub(crate) fn json_temperature(temperature: f32) -> Result<Value, ProviderError> {
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ProviderError::Config(format!(
            "temperature must be a finite number >= 0, got {temperature}"
        )));
    }
    let shortest: f64 = temperature
        .to_string()
        .parse()
        .unwrap_or(f64::from(temperature));
    Ok(Value::from(shortest))
}

/// Reads a u32 token count, if present and representable.
pub(crate) fn usage_field(value: &Value, field: &str) -> Option<u32> {
    value
        .get(field)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
}

/// Parses a Chat Completions answer.
pub fn parse_response(answer: &Value) -> Result<Completion, ProviderError> {
    if let Some(error) = answer.get("error").filter(|e| !e.is_null()) {
        return Err(ProviderError::BadResponse(format!(
            "the answer is an error object: {error}"
        )));
    }
    let choice = answer
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or_else(|| ProviderError::BadResponse("the answer has no choices[0]".into()))?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or_else(|| ProviderError::BadResponse("choices[0] has no message object".into()))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part {
                Value::String(text) => Some(text.as_str()),
                other => other.get("text").and_then(Value::as_str),
            })
            .collect::<Vec<_>>()
            .join(""),
        Some(other) => {
            return Err(ProviderError::BadResponse(format!(
                "choices[0].message.content is neither text nor parts: {other}"
            )));
        }
    };
    let reasoning = ["reasoning_content", "reasoning"]
        .iter()
        .filter_map(|field| message.get(*field).and_then(Value::as_str))
        .find(|reasoning| !reasoning.is_empty())
        .map(str::to_owned);
    let usage = answer.get("usage").cloned().unwrap_or(Value::Null);
    Ok(Completion {
        text,
        reasoning,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
        input_tokens: usage_field(&usage, "prompt_tokens"),
        output_tokens: usage_field(&usage, "completion_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperatures_print_as_written() {
        assert_eq!(json_temperature(0.2).unwrap().to_string(), "0.2");
        assert_eq!(json_temperature(0.1).unwrap().to_string(), "0.1");
        assert_eq!(json_temperature(0.0).unwrap().to_string(), "0.0");
        assert!(json_temperature(f32::NAN).is_err());
    }

    #[test]
    fn parses_content_reasoning_and_usage() {
        let answer = json!({
            "choices": [{
                "message": {"role": "assistant", "content": "hi", "reasoning_content": "hmm"},
                "finish_reason": "stop"
            }],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3}
        });
        let completion = parse_response(&answer).unwrap();
        assert_eq!(completion.text, "hi");
        assert_eq!(completion.reasoning.as_deref(), Some("hmm"));
        assert_eq!(completion.finish_reason.as_deref(), Some("stop"));
        assert_eq!(completion.input_tokens, Some(12));
        assert_eq!(completion.output_tokens, Some(3));
    }

    #[test]
    fn parses_parts_and_null_content() {
        let parts = json!({"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]});
        assert_eq!(parse_response(&parts).unwrap().text, "ab");
        let null = json!({"choices": [{"message": {"content": null, "reasoning": "r"}}]});
        let completion = parse_response(&null).unwrap();
        assert!(completion.is_reasoning_only());
    }

    #[test]
    fn rejects_wrong_shapes() {
        for bad in [
            json!({}),
            json!({"choices": []}),
            json!({"choices": [{}]}),
            json!({"error": {"message": "x"}}),
        ] {
            assert!(matches!(
                parse_response(&bad),
                Err(ProviderError::BadResponse(_))
            ));
        }
    }
}
