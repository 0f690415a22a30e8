//! Server-sent events of a streamed answer: a parser, and accumulators that rebuild the
//! assistant's message from the events of either shape (to store it, and to see whether it
//! calls an lcm tool). The events themselves reach the client byte for byte; nothing here
//! rewrites them.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::shape::Shape;

/// Splits a byte stream into events (`event:` name and `data:` lines, ended by a blank line).
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    line: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; calls `on_event(event name, data)` for each complete event.
    pub(crate) fn feed(&mut self, bytes: &[u8], on_event: &mut impl FnMut(Option<&str>, &str)) {
        for &b in bytes {
            if b == b'\n' {
                let mut line = std::mem::take(&mut self.line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.line_done(&line, on_event);
            } else {
                self.line.push(b);
            }
        }
    }

    /// Ends the stream: an event not yet ended by a blank line is dispatched.
    pub(crate) fn finish(&mut self, on_event: &mut impl FnMut(Option<&str>, &str)) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, on_event);
        }
        self.line_done(&[], on_event);
    }

    fn line_done(&mut self, line: &[u8], on_event: &mut impl FnMut(Option<&str>, &str)) {
        if line.is_empty() {
            if self.has_data {
                on_event(self.event.as_deref(), &self.data);
            }
            self.event = None;
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line.first() == Some(&b':') {
            return; // a comment
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
    }
}

/// Rebuilds the assistant message of a streamed answer.
#[derive(Debug)]
pub(crate) struct Accumulator {
    shape: Shape,
    parser: SseParser,
    state: State,
}

#[derive(Debug, Default)]
struct State {
    /// The stream reported an error (or a chunk was not JSON): the answer is not stored.
    failed: bool,
    /// Some event was understood.
    seen: bool,
    // OpenAI
    content: String,
    reasoning: String,
    refusal: String,
    has_content: bool,
    calls: BTreeMap<u64, OpenAiCall>,
    // Anthropic
    blocks: BTreeMap<u64, Block>,
}

#[derive(Debug, Default)]
struct OpenAiCall {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

#[derive(Debug)]
struct Block {
    start: Value,
    text: String,
    thinking: String,
    signature: String,
    json: String,
}

impl Accumulator {
    pub(crate) fn new(shape: Shape) -> Accumulator {
        Accumulator {
            shape,
            parser: SseParser::default(),
            state: State::default(),
        }
    }

    /// Feeds a chunk of the stream.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        let shape = self.shape;
        let state = &mut self.state;
        self.parser
            .feed(bytes, &mut |event, data| state.event(shape, event, data));
    }

    /// Ends the stream; the assistant message, unless the stream failed or said nothing.
    pub(crate) fn finish(mut self) -> Option<Value> {
        let shape = self.shape;
        let state = &mut self.state;
        self.parser
            .finish(&mut |event, data| state.event(shape, event, data));
        if self.state.failed || !self.state.seen {
            return None;
        }
        Some(match shape {
            Shape::OpenAi => self.state.openai_message(),
            Shape::Anthropic => self.state.anthropic_message(),
        })
    }
}

impl State {
    fn event(&mut self, shape: Shape, event: Option<&str>, data: &str) {
        let data = data.trim();
        if data == "[DONE]" {
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(data) else {
            self.failed = true;
            return;
        };
        if event == Some("error") || value.get("error").is_some_and(|e| !e.is_null()) {
            self.failed = true;
            return;
        }
        match shape {
            Shape::OpenAi => self.openai_chunk(&value),
            Shape::Anthropic => self.anthropic_event(&value),
        }
    }

    fn openai_chunk(&mut self, chunk: &Value) {
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            return; // a usage-only chunk
        };
        for choice in choices {
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            self.seen = true;
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.content.push_str(text);
                self.has_content = true;
            }
            for field in ["reasoning_content", "reasoning"] {
                if let Some(text) = delta.get(field).and_then(Value::as_str) {
                    self.reasoning.push_str(text);
                }
            }
            if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
                self.refusal.push_str(text);
            }
            let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) else {
                continue;
            };
            for (position, call) in calls.iter().enumerate() {
                let index = call
                    .get("index")
                    .and_then(Value::as_u64)
                    .unwrap_or(position as u64);
                let entry = self.calls.entry(index).or_default();
                if let Some(id) = call.get("id").and_then(Value::as_str) {
                    entry.id = id.to_owned();
                }
                if let Some(kind) = call.get("type").and_then(Value::as_str) {
                    entry.kind = kind.to_owned();
                }
                if let Some(function) = call.get("function") {
                    if let Some(name) = function.get("name").and_then(Value::as_str) {
                        entry.name.push_str(name);
                    }
                    if let Some(arguments) = function.get("arguments").and_then(Value::as_str) {
                        entry.arguments.push_str(arguments);
                    }
                }
            }
        }
    }

    fn openai_message(&self) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert(
            "content".into(),
            if self.has_content {
                json!(self.content)
            } else {
                Value::Null
            },
        );
        if !self.reasoning.is_empty() {
            message.insert("reasoning_content".into(), json!(self.reasoning));
        }
        if !self.refusal.is_empty() {
            message.insert("refusal".into(), json!(self.refusal));
        }
        if !self.calls.is_empty() {
            let calls: Vec<Value> = self
                .calls
                .values()
                .map(|call| {
                    let kind = if call.kind.is_empty() {
                        "function"
                    } else {
                        call.kind.as_str()
                    };
                    json!({"id": call.id, "type": kind, "function": {"name": call.name, "arguments": call.arguments}})
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        Value::Object(message)
    }

    fn anthropic_event(&mut self, event: &Value) {
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => self.seen = true,
            Some("content_block_start") => {
                self.seen = true;
                let start = event.get("content_block").cloned().unwrap_or(json!({}));
                self.blocks.insert(
                    index,
                    Block {
                        start,
                        text: String::new(),
                        thinking: String::new(),
                        signature: String::new(),
                        json: String::new(),
                    },
                );
            }
            Some("content_block_delta") => {
                let (Some(block), Some(delta)) = (self.blocks.get_mut(&index), event.get("delta"))
                else {
                    return;
                };
                let text = |field: &str| delta.get(field).and_then(Value::as_str).unwrap_or("");
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => block.text.push_str(text("text")),
                    Some("thinking_delta") => block.thinking.push_str(text("thinking")),
                    Some("signature_delta") => block.signature.push_str(text("signature")),
                    Some("input_json_delta") => block.json.push_str(text("partial_json")),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn anthropic_message(&self) -> Value {
        let content: Vec<Value> = self
            .blocks
            .values()
            .map(|block| {
                let mut out = block.start.clone();
                let kind = out.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "text" => {
                        let start = out.get("text").and_then(Value::as_str).unwrap_or("");
                        out["text"] = json!(format!("{start}{}", block.text));
                    }
                    "thinking" => {
                        let start = out.get("thinking").and_then(Value::as_str).unwrap_or("");
                        out["thinking"] = json!(format!("{start}{}", block.thinking));
                        if !block.signature.is_empty() {
                            out["signature"] = json!(block.signature);
                        }
                    }
                    "tool_use" | "server_tool_use" if !block.json.trim().is_empty() => {
                        out["input"] = serde_json::from_str(&block.json)
                            .unwrap_or_else(|_| json!({"arguments": block.json}));
                    }
                    _ => {}
                }
                out
            })
            .collect();
        json!({"role": "assistant", "content": content})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks() {
        let mut events = Vec::new();
        let mut parser = SseParser::default();
        let stream =
            "event: a\ndata: {\"x\":\r\ndata: 1}\n\n: comment\n\ndata: [DONE]\n\ndata: tail";
        for chunk in stream.as_bytes().chunks(3) {
            parser.feed(chunk, &mut |e, d| {
                events.push((e.map(str::to_owned), d.to_owned()))
            });
        }
        parser.finish(&mut |e, d| events.push((e.map(str::to_owned), d.to_owned())));
        assert_eq!(
            events,
            vec![
                (Some("a".into()), "{\"x\":\n1}".into()),
                (None, "[DONE]".into()),
                (None, "tail".into()),
            ]
        );
    }

    #[test]
    fn openai_stream_rebuilds_the_message() {
        let mut acc = Accumulator::new(Shape::OpenAi);
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"lcm_grep","arguments":"{\"pat"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"tern\":\"x\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        ];
        for chunk in chunks {
            acc.feed(format!("data: {chunk}\n\n").as_bytes());
        }
        acc.feed(b"data: [DONE]\n\n");
        let message = acc.finish().unwrap();
        assert_eq!(message["content"], "Hello");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "lcm_grep");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"pattern\":\"x\"}"
        );
    }

    #[test]
    fn anthropic_stream_rebuilds_the_message() {
        let mut acc = Accumulator::new(Shape::Anthropic);
        let events = [
            (
                "message_start",
                r#"{"type":"message_start","message":{"id":"m","content":[]}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hi"}}"#,
            ),
            (
                "content_block_start",
                r#"{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t1","name":"lcm_grep","input":{}}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"pattern\": "}}"#,
            ),
            (
                "content_block_delta",
                r#"{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"x\"}"}}"#,
            ),
            (
                "message_delta",
                r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"}}"#,
            ),
            ("message_stop", r#"{"type":"message_stop"}"#),
        ];
        for (name, data) in events {
            acc.feed(format!("event: {name}\ndata: {data}\n\n").as_bytes());
        }
        let message = acc.finish().unwrap();
        assert_eq!(
            message,
            json!({"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "text", "text": "Hi"},
                {"type": "tool_use", "id": "t1", "name": "lcm_grep", "input": {"pattern": "x"}},
            ]})
        );
        let mut failed = Accumulator::new(Shape::Anthropic);
        failed.feed(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n");
        assert!(failed.finish().is_none());
    }
}
