//! Chat with tools: the request and response model of a tool-using conversation, and the
//! [`ChatProvider`] trait both HTTP providers implement.
//!
//! A conversation is a list of [`ChatTurn`]s: system instructions, user text, assistant turns
//! (text and/or [`ToolCall`]s) and tool results. A [`ChatRequest`] carries the turns and the
//! [`ToolSpec`]s the model may call; a [`ChatResponse`] carries the model's text, its tool calls,
//! why it stopped and what it cost.
//!
//! # Wire shapes
//!
//! - **OpenAI Chat Completions** ([`openai_chat_body`], [`parse_openai_chat`]): tools are
//!   `tools: [{"type": "function", "function": {name, description, parameters}}]`; an assistant
//!   turn with calls is `{"role": "assistant", "content": text|null, "tool_calls": [{id, "type":
//!   "function", "function": {name, arguments}}]}` with `arguments` a JSON *string*; a tool result
//!   is `{"role": "tool", "tool_call_id", "content"}` (the shape has no error flag, so an error
//!   result should say it is one in its text, as the agent loop's do). System turns stay in place
//!   as `system` messages.
//! - **Anthropic Messages** ([`anthropic_chat_body`], [`parse_anthropic_chat`]): tools are
//!   `tools: [{name, description, input_schema}]`; calls are `tool_use` blocks with an `input`
//!   object; results are `tool_result` blocks (`tool_use_id`, `content`, `is_error`) in a user
//!   message. Consecutive turns that map to the same role are merged into one message (the API
//!   requires alternation), so several results of one assistant turn travel together. System turns
//!   are appended to the top-level `system` field.
//!
//! # Tool arguments
//!
//! A [`ToolCall`] keeps its arguments as the raw text the model produced
//! ([`ToolCall::arguments`]), because a model may produce text that is not JSON and the caller must
//! be able to quote it back; [`ToolCall::parse_arguments`] reads them as a JSON object. In the
//! Anthropic shape `input` is normally an object and is kept as its JSON text; an `input` that is
//! a string (some compatible proxies send one) is taken as the raw argument text.
//!
//! Both providers send chat requests through the same HTTP layer as completions
//! ([`crate::http`]): the same timeouts, retries, `Retry-After` handling and circuit breaker.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::anthropic::AnthropicProvider;
use crate::openai::{OpenAiProvider, json_temperature};
use crate::provider::ProviderError;

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The tool's name, as the model calls it.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// The JSON Schema of the arguments (an object schema).
    pub parameters: Value,
}

impl ToolSpec {
    /// A tool named `name`, described by `description`, taking arguments matching `parameters`.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id of the call; its result must name it.
    pub id: String,
    /// The tool called.
    pub name: String,
    /// The arguments exactly as the model wrote them (normally a JSON object, but possibly not
    /// JSON at all; see [`ToolCall::parse_arguments`]).
    pub arguments: String,
}

/// Why a tool call's arguments could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolArgumentsError {
    /// The arguments are not JSON.
    #[error("the arguments are not valid JSON ({0})")]
    NotJson(String),
    /// The arguments are JSON but not an object.
    #[error("the arguments must be a JSON object, got {0}")]
    NotAnObject(&'static str),
}

impl ToolCall {
    /// A call `id` of tool `name` with raw `arguments`.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The arguments as a JSON object. Empty (or all-whitespace) arguments read as `{}`, since
    /// some servers send `""` for a call of a tool without parameters.
    pub fn parse_arguments(&self) -> Result<Value, ToolArgumentsError> {
        if self.arguments.trim().is_empty() {
            return Ok(Value::Object(serde_json::Map::new()));
        }
        let value: Value = serde_json::from_str(&self.arguments)
            .map_err(|e| ToolArgumentsError::NotJson(e.to_string()))?;
        match value {
            Value::Object(_) => Ok(value),
            other => Err(ToolArgumentsError::NotAnObject(json_kind(&other))),
        }
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One turn of a tool-using conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatTurn {
    /// Instructions to the model.
    System(String),
    /// The user (or the engine speaking for it).
    User(String),
    /// The model: text, tool calls, or both.
    Assistant {
        /// The text, if the model wrote any.
        text: Option<String>,
        /// The tools it called, in order.
        tool_calls: Vec<ToolCall>,
    },
    /// The result of the tool call `call_id`.
    ToolResult {
        /// The id of the call answered.
        call_id: String,
        /// What the tool returned (or what went wrong).
        content: String,
        /// True when `content` describes a failure.
        is_error: bool,
    },
}

impl ChatTurn {
    /// An assistant turn with only `text`.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        ChatTurn::Assistant {
            text: Some(text.into()),
            tool_calls: Vec::new(),
        }
    }

    /// A successful tool result.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatTurn::ToolResult {
            call_id: call_id.into(),
            content: content.into(),
            is_error: false,
        }
    }

    /// A failed tool result.
    pub fn tool_error(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        ChatTurn::ToolResult {
            call_id: call_id.into(),
            content: content.into(),
            is_error: true,
        }
    }
}

/// A request for one model turn, with tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The system prompt, if any (sent before any `System` turn).
    pub system: Option<String>,
    /// The conversation, oldest first.
    pub turns: Vec<ChatTurn>,
    /// The tools the model may call (none: the `tools` field is not sent).
    pub tools: Vec<ToolSpec>,
    /// Most tokens the model may generate in this turn.
    pub max_tokens: u32,
    /// Sampling temperature.
    pub temperature: f32,
}

impl ChatRequest {
    /// A request with `system`, `turns` and `tools`, at temperature 0.
    pub fn new(
        system: Option<String>,
        turns: Vec<ChatTurn>,
        tools: Vec<ToolSpec>,
        max_tokens: u32,
    ) -> Self {
        ChatRequest {
            system,
            turns,
            tools,
            max_tokens,
            temperature: 0.0,
        }
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished its turn (`stop` / `end_turn`).
    EndTurn,
    /// It wants tool results (`tool_calls` / `tool_use`).
    ToolUse,
    /// It hit the output limit (`length` / `max_tokens`).
    MaxTokens,
    /// Anything else, as the provider said it.
    Other(String),
}

/// Tokens a call (or a sum of calls) consumed, as providers report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens (for Anthropic, including cache reads and cache writes).
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// The model's turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// Its text, if any (`None` when empty).
    pub text: Option<String>,
    /// The tools it called, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub stop: StopReason,
    /// What the call consumed (zeros when the provider did not say).
    pub usage: Usage,
    /// The model that answered (as the provider reports it, else the configured one).
    pub model: String,
}

impl ChatResponse {
    /// The assistant turn this response adds to a conversation.
    pub fn to_turn(&self) -> ChatTurn {
        ChatTurn::Assistant {
            text: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
        }
    }
}

/// A model backend that can chat with tools.
///
/// Implementations own their retries, timeouts and circuit breaking, exactly as for
/// [`crate::Provider::complete`]. The trait is object-safe.
#[async_trait]
pub trait ChatProvider: Send + Sync {
    /// Asks the model for its next turn.
    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError>;

    /// The configured model.
    fn model(&self) -> &str;
}

#[async_trait]
impl ChatProvider for OpenAiProvider {
    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let body = openai_chat_body(OpenAiProvider::model(self), request)?;
        let answer = self.post(&body).await?;
        parse_openai_chat(&answer, OpenAiProvider::model(self))
    }

    fn model(&self) -> &str {
        OpenAiProvider::model(self)
    }
}

#[async_trait]
impl ChatProvider for AnthropicProvider {
    async fn chat(&self, request: &ChatRequest) -> Result<ChatResponse, ProviderError> {
        let body = anthropic_chat_body(AnthropicProvider::model(self), request)?;
        let answer = self.post(&body).await?;
        parse_anthropic_chat(&answer, AnthropicProvider::model(self))
    }

    fn model(&self) -> &str {
        AnthropicProvider::model(self)
    }
}

/// A fresh id for a call the provider sent without one (unique within the process).
fn synthesized_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("call_lcm_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

fn non_empty(text: String) -> Option<String> {
    (!text.trim().is_empty()).then_some(text)
}

fn usage_u64(usage: &Value, field: &str) -> u64 {
    usage.get(field).and_then(Value::as_u64).unwrap_or(0)
}

fn answered_model(answer: &Value, fallback: &str) -> String {
    answer
        .get("model")
        .and_then(Value::as_str)
        .filter(|model| !model.is_empty())
        .unwrap_or(fallback)
        .to_owned()
}

/// The OpenAI Chat Completions body for `request`, with `model`.
pub fn openai_chat_body(model: &str, request: &ChatRequest) -> Result<Value, ProviderError> {
    let mut messages = Vec::with_capacity(request.turns.len() + 1);
    if let Some(system) = &request.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for turn in &request.turns {
        match turn {
            ChatTurn::System(text) => messages.push(json!({"role": "system", "content": text})),
            ChatTurn::User(text) => messages.push(json!({"role": "user", "content": text})),
            ChatTurn::Assistant { text, tool_calls } => {
                let content = text
                    .as_deref()
                    .filter(|text| !text.is_empty())
                    .map_or(Value::Null, Value::from);
                if content.is_null() && tool_calls.is_empty() {
                    // Nothing was said: an empty assistant message helps no one.
                    continue;
                }
                let mut message = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    let calls: Vec<Value> = tool_calls
                        .iter()
                        .map(|call| {
                            json!({
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}
                            })
                        })
                        .collect();
                    message["tool_calls"] = Value::Array(calls);
                }
                messages.push(message);
            }
            ChatTurn::ToolResult {
                call_id, content, ..
            } => {
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}))
            }
        }
    }
    let mut body = json!({
        "model": model,
        "messages": messages,
        "temperature": json_temperature(request.temperature)?,
        "max_tokens": request.max_tokens,
    });
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    }
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    Ok(body)
}

/// Parses a Chat Completions answer into a [`ChatResponse`]; `model` is reported when the answer
/// names none.
pub fn parse_openai_chat(answer: &Value, model: &str) -> Result<ChatResponse, ProviderError> {
    // Text, errors and usage are read exactly as for plain completions.
    let completion = crate::openai::parse_response(answer)?;
    let choice = answer
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
        .ok_or_else(|| ProviderError::BadResponse("the answer has no choices[0]".into()))?;
    let message = &choice["message"];
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(index, call)| openai_tool_call(index, call))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ProviderError::BadResponse(format!(
                "choices[0].message.tool_calls is not an array: {}",
                crate::provider::truncate_body(&other.to_string())
            )));
        }
    };
    let stop = match completion.finish_reason.as_deref() {
        Some("stop") => StopReason::EndTurn,
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some("length") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_owned()),
        None if tool_calls.is_empty() => StopReason::EndTurn,
        None => StopReason::ToolUse,
    };
    // A refusal (OpenAI's `message.refusal`) comes without content; it is the model's answer.
    let text = non_empty(completion.text).or_else(|| {
        message
            .get("refusal")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .and_then(non_empty)
    });
    let usage = answer.get("usage").unwrap_or(&Value::Null);
    Ok(ChatResponse {
        text,
        tool_calls,
        stop,
        usage: Usage {
            input_tokens: usage_u64(usage, "prompt_tokens"),
            output_tokens: usage_u64(usage, "completion_tokens"),
        },
        model: answered_model(answer, model),
    })
}

fn openai_tool_call(index: usize, call: &Value) -> Result<ToolCall, ProviderError> {
    let function = call
        .get("function")
        .filter(|f| f.is_object())
        .ok_or_else(|| {
            ProviderError::BadResponse(format!("tool_calls[{index}] has no function object"))
        })?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ProviderError::BadResponse(format!("tool_calls[{index}] has no name")))?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(raw)) => raw.clone(),
        // Some compatible servers send the object itself.
        Some(other) => other.to_string(),
    };
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(synthesized_call_id, str::to_owned);
    Ok(ToolCall::new(id, name, arguments))
}

/// The Anthropic Messages body for `request`, with `model`.
pub fn anthropic_chat_body(model: &str, request: &ChatRequest) -> Result<Value, ProviderError> {
    let mut system: Vec<&str> = request.system.iter().map(String::as_str).collect();
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::with_capacity(request.turns.len());
    let mut push = |role: &'static str, blocks: Vec<Value>| {
        if blocks.is_empty() {
            return;
        }
        match messages.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => messages.push((role, blocks)),
        }
    };
    for turn in &request.turns {
        match turn {
            ChatTurn::System(text) => system.push(text),
            ChatTurn::User(text) => push("user", vec![json!({"type": "text", "text": text})]),
            ChatTurn::Assistant { text, tool_calls } => {
                let mut blocks = Vec::with_capacity(tool_calls.len() + 1);
                if let Some(text) = text.as_deref().filter(|text| !text.is_empty()) {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in tool_calls {
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": call.id,
                        "name": call.name,
                        "input": anthropic_input(call),
                    }));
                }
                push("assistant", blocks);
            }
            ChatTurn::ToolResult {
                call_id,
                content,
                is_error,
            } => push(
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": call_id,
                    "content": content,
                    "is_error": is_error,
                })],
            ),
        }
    }
    let messages: Vec<Value> = messages
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut body = json!({
        "model": model,
        "max_tokens": request.max_tokens,
        "messages": messages,
        "temperature": json_temperature(request.temperature)?,
    });
    if !system.is_empty() {
        body["system"] = Value::from(system.join("\n\n"));
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    Ok(body)
}

/// A call's `input` for the Anthropic shape, which requires an object: the parsed arguments, or
/// (when they are not a JSON object) the raw text wrapped as `{"arguments": raw}`, as assembly
/// does.
fn anthropic_input(call: &ToolCall) -> Value {
    call.parse_arguments()
        .unwrap_or_else(|_| json!({"arguments": call.arguments}))
}

/// Parses a Messages answer into a [`ChatResponse`]; `model` is reported when the answer names
/// none.
pub fn parse_anthropic_chat(answer: &Value, model: &str) -> Result<ChatResponse, ProviderError> {
    // Text, errors and usage are read exactly as for plain completions.
    let completion = crate::anthropic::parse_response(answer)?;
    let blocks = answer
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| ProviderError::BadResponse("the answer has no content array".into()))?;
    let mut tool_calls = Vec::new();
    for (index, block) in blocks.iter().enumerate() {
        if block.get("type").and_then(Value::as_str) != Some("tool_use") {
            continue;
        }
        let name = block.get("name").and_then(Value::as_str).ok_or_else(|| {
            ProviderError::BadResponse(format!("content[{index}] (tool_use) has no name"))
        })?;
        let arguments = match block.get("input") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(raw)) => raw.clone(),
            Some(other) => other.to_string(),
        };
        let id = block
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(synthesized_call_id, str::to_owned);
        tool_calls.push(ToolCall::new(id, name, arguments));
    }
    let stop = match completion.finish_reason.as_deref() {
        Some("end_turn") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some(other) => StopReason::Other(other.to_owned()),
        None if tool_calls.is_empty() => StopReason::EndTurn,
        None => StopReason::ToolUse,
    };
    let usage = answer.get("usage").unwrap_or(&Value::Null);
    let input_tokens = [
        "input_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    ]
    .iter()
    .fold(0u64, |sum, field| {
        sum.saturating_add(usage_u64(usage, field))
    });
    Ok(ChatResponse {
        text: non_empty(completion.text),
        tool_calls,
        stop,
        usage: Usage {
            input_tokens,
            output_tokens: usage_u64(usage, "output_tokens"),
        },
        model: answered_model(answer, model),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> ChatRequest {
        ChatRequest::new(
            Some("Be brief.".into()),
            vec![
                ChatTurn::User("Add 1 and 2.".into()),
                ChatTurn::Assistant {
                    text: Some("Adding.".into()),
                    tool_calls: vec![
                        ToolCall::new("c1", "add", r#"{"a":1,"b":2}"#),
                        ToolCall::new("c2", "add", "{oops"),
                    ],
                },
                ChatTurn::tool_result("c1", "3"),
                ChatTurn::tool_error("c2", "error: bad arguments"),
                ChatTurn::System("Late instruction.".into()),
                ChatTurn::User("Thanks.".into()),
            ],
            vec![ToolSpec::new("add", "Adds.", json!({"type": "object"}))],
            100,
        )
    }

    #[test]
    fn arguments_parse_as_objects() {
        assert_eq!(
            ToolCall::new("i", "t", r#"{"x":1}"#).parse_arguments(),
            Ok(json!({"x": 1}))
        );
        assert_eq!(
            ToolCall::new("i", "t", "  ").parse_arguments(),
            Ok(json!({}))
        );
        assert!(matches!(
            ToolCall::new("i", "t", "{oops").parse_arguments(),
            Err(ToolArgumentsError::NotJson(_))
        ));
        assert_eq!(
            ToolCall::new("i", "t", "[1]").parse_arguments(),
            Err(ToolArgumentsError::NotAnObject("an array"))
        );
    }

    #[test]
    fn openai_body_shape() {
        let body = openai_chat_body("m", &request()).unwrap();
        let messages = body["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "tool",
                "tool",
                "system",
                "user"
            ]
        );
        assert_eq!(
            messages[2]["tool_calls"][1]["function"]["arguments"],
            "{oops"
        );
        assert_eq!(messages[4]["tool_call_id"], "c2");
        assert_eq!(body["tools"][0]["function"]["name"], "add");
        let no_tools = ChatRequest::new(None, vec![ChatTurn::User("x".into())], vec![], 5);
        assert!(
            openai_chat_body("m", &no_tools)
                .unwrap()
                .get("tools")
                .is_none()
        );
    }

    #[test]
    fn anthropic_body_merges_results_and_wraps_bad_input() {
        let body = anthropic_chat_body("m", &request()).unwrap();
        assert_eq!(body["system"], "Be brief.\n\nLate instruction.");
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["content"][1]["input"], json!({"a": 1, "b": 2}));
        assert_eq!(
            messages[1]["content"][2]["input"],
            json!({"arguments": "{oops"})
        );
        let results = messages[2]["content"].as_array().unwrap();
        assert_eq!(results.len(), 3);
        assert_eq!(results[1]["is_error"], true);
        assert_eq!(results[2]["type"], "text");
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
    }

    #[test]
    fn parses_openai_tool_calls_and_quirks() {
        let answer = json!({
            "model": "served",
            "choices": [{
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{\"x\":1}"}},
                    {"type": "function", "function": {"name": "b", "arguments": {"y": 2}}}
                ]},
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}
        });
        let response = parse_openai_chat(&answer, "configured").unwrap();
        assert_eq!(response.text, None);
        assert_eq!(response.stop, StopReason::ToolUse);
        assert_eq!(response.model, "served");
        assert_eq!(response.usage.total(), 10);
        assert_eq!(
            response.tool_calls[0],
            ToolCall::new("call_1", "a", "{\"x\":1}")
        );
        assert!(response.tool_calls[1].id.starts_with("call_lcm_"));
        assert_eq!(response.tool_calls[1].arguments, r#"{"y":2}"#);

        let broken = json!({"choices": [{"message": {"tool_calls": [{"id": "x"}]}}]});
        assert!(matches!(
            parse_openai_chat(&broken, "m"),
            Err(ProviderError::BadResponse(_))
        ));
        let refusal = json!({"choices": [{"message": {"content": null, "refusal": "No."}, "finish_reason": "stop"}]});
        assert_eq!(
            parse_openai_chat(&refusal, "m").unwrap().text.as_deref(),
            Some("No.")
        );
        let not_array = json!({"choices": [{"message": {"tool_calls": "x"}}]});
        assert!(parse_openai_chat(&not_array, "m").is_err());
    }

    #[test]
    fn parses_anthropic_tool_use() {
        let answer = json!({
            "type": "message",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "a", "input": {"x": 1}},
                {"type": "tool_use", "id": "toolu_2", "name": "b", "input": "{not json"}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 5, "cache_read_input_tokens": 10, "output_tokens": 2}
        });
        let response = parse_anthropic_chat(&answer, "configured").unwrap();
        assert_eq!(response.text.as_deref(), Some("Let me look."));
        assert_eq!(response.model, "configured");
        assert_eq!(response.stop, StopReason::ToolUse);
        assert_eq!(response.usage.input_tokens, 15);
        assert_eq!(response.tool_calls[0].arguments, r#"{"x":1}"#);
        assert_eq!(response.tool_calls[1].arguments, "{not json");
        let nameless = json!({"content": [{"type": "tool_use", "id": "t", "input": {}}]});
        assert!(parse_anthropic_chat(&nameless, "m").is_err());
    }

    #[test]
    fn chat_provider_is_object_safe() {
        fn assert_send_sync<T: Send + Sync + ?Sized>() {}
        assert_send_sync::<dyn ChatProvider>();
    }
}
