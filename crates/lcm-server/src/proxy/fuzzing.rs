//! The proxy's parsers of outside bytes, for the fuzz harness (re-exported by
//! [`crate::fuzzing`]).

use axum::http::{HeaderMap, HeaderValue, header};
use lcm_core::config::Config;
use lcm_core::tokens::TokenCounter;
use serde_json::Value;

use super::client_model::ClientModel;
use super::conversation::{derived_key, parse_client_message, request_fingerprint};
use super::fit::measure;
use super::parse_request;
use super::shape::{Shape, dedupe_tool_ids};
use super::sse::Accumulator;

/// The API shape of a proxied request or answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyShape {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

impl From<ProxyShape> for Shape {
    fn from(shape: ProxyShape) -> Shape {
        match shape {
            ProxyShape::OpenAi => Shape::OpenAi,
            ProxyShape::Anthropic => Shape::Anthropic,
        }
    }
}

/// What the proxy made of a client's request body before it reaches the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRequest {
    /// The session key derived from the system prompt and the first messages.
    pub derived_key: String,
    /// The request's fingerprint (source keys of the messages it stores).
    pub fingerprint: u64,
    /// Messages with content to store.
    pub stored: usize,
    /// Whether the model may choose its tools (the lcm tools are then added).
    pub model_chooses_tools: bool,
    /// Whether the request names a model the proxy could summarise with.
    pub client_model: bool,
    /// Tokens of the request's body without its messages.
    pub fixed_tokens: u64,
}

/// Parses a client's request body as `POST /v1/chat/completions` (OpenAI) or
/// `POST /v1/messages` (Anthropic) does before it stores anything: the body, each message,
/// the derived session key, the tool choice, the client's model, the token count of the rest.
/// `Err` holds the error's kind and message, as the client would get them.
pub fn proxy_request(shape: ProxyShape, body: &[u8]) -> Result<ParsedRequest, String> {
    let shape = Shape::from(shape);
    let request = parse_request(shape, body).map_err(|e| format!("{}: {}", e.kind, e.message))?;
    let key = derived_key(shape, &request.system_text, &request.messages);
    let fingerprint = request_fingerprint(shape, &request.messages);
    let chooses = shape.model_chooses_tools(request.base.get("tool_choice"));
    let _names: Vec<&str> = request
        .base
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| tools.iter().filter_map(|t| shape.tool_name(t)).collect())
        .unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer sk-fuzz"),
    );
    headers.insert("x-api-key", HeaderValue::from_static("sk-fuzz"));
    let client =
        ClientModel::from_request(shape, &Config::default(), &request.base, &headers, false);
    let counter = TokenCounter::new(Config::default().tokenizer.encoding());
    let mut bare = request.base.clone();
    bare.insert("messages".into(), Value::Array(request.leading.clone()));
    let fixed_tokens = measure(&counter, &Value::Object(bare));
    let mut raw: Vec<Value> = request.messages.iter().map(|m| m.raw.clone()).collect();
    dedupe_tool_ids(shape, &mut raw);
    Ok(ParsedRequest {
        derived_key: key,
        fingerprint,
        stored: request
            .messages
            .iter()
            .filter(|m| m.parsed.is_some())
            .count(),
        model_chooses_tools: chooses,
        client_model: client.is_some(),
        fixed_tokens,
    })
}

/// Rebuilds the assistant's message from an upstream's streamed answer (server-sent events)
/// given in `chunks`, as the proxy does; `None` when the stream failed or said nothing.
pub fn stream_answer(shape: ProxyShape, chunks: &[&[u8]]) -> Option<Value> {
    let mut accumulator = Accumulator::new(shape.into());
    for chunk in chunks {
        accumulator.feed(chunk);
    }
    accumulator.finish()
}

/// The assistant's message of an upstream's (non-streamed) JSON answer, as the proxy reads it.
pub fn json_answer(shape: ProxyShape, body: &[u8]) -> Option<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|answer| Shape::from(shape).answer_message(&answer))
}

/// What the proxy does with an upstream's assistant message: its tool calls (with their
/// arguments parsed), the messages of a tool round answering them, and its lcm form for
/// storing. `Ok` holds the number of calls; `Err` why the message cannot be stored.
pub fn answer_message(shape: ProxyShape, message: &Value) -> Result<usize, String> {
    let shape = Shape::from(shape);
    let calls = shape.calls(message);
    let results: Vec<(String, String, bool)> = calls
        .iter()
        .map(|call| {
            let content = match &call.args {
                Ok(args) => args.to_string(),
                Err(why) => why.clone(),
            };
            (call.id.clone(), content, call.args.is_err())
        })
        .collect();
    let _round = shape.round_messages(message, &results);
    parse_client_message(shape, &message.to_string(), message.clone())?;
    Ok(calls.len())
}
