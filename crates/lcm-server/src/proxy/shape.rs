//! What differs between the two API shapes the proxy speaks: OpenAI Chat Completions and
//! Anthropic Messages (requests, answers, tool calls, errors).

use lcm_engine::tools::ToolFormat;
use serde_json::{Map, Value, json};

/// The API shape of a proxied request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `POST /v1/chat/completions`.
    OpenAi,
    /// `POST /v1/messages`.
    Anthropic,
}

/// A tool call found in an answer.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub id: String,
    pub name: String,
    /// The arguments, or why they are not a JSON object.
    pub args: Result<Value, String>,
}

impl Shape {
    /// `openai` or `anthropic`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Shape::OpenAi => "openai",
            Shape::Anthropic => "anthropic",
        }
    }

    /// The tool definitions' format.
    pub(crate) fn tool_format(self) -> ToolFormat {
        match self {
            Shape::OpenAi => ToolFormat::OpenAi,
            Shape::Anthropic => ToolFormat::Anthropic,
        }
    }

    /// The endpoint appended to the upstream base URL.
    pub(crate) fn endpoint(self) -> &'static str {
        match self {
            Shape::OpenAi => "/chat/completions",
            Shape::Anthropic => "/messages",
        }
    }

    /// The name of a tool definition of this shape.
    pub(crate) fn tool_name(self, tool: &Value) -> Option<&str> {
        match self {
            Shape::OpenAi => tool
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| tool.get("custom").and_then(|c| c.get("name")))
                .or_else(|| tool.get("name"))
                .and_then(Value::as_str),
            Shape::Anthropic => tool.get("name").and_then(Value::as_str),
        }
    }

    /// Whether a request's `tool_choice` leaves the model free to choose its tools (absent or
    /// `auto`): only then does the proxy add the lcm tools.
    pub(crate) fn model_chooses_tools(self, tool_choice: Option<&Value>) -> bool {
        match (self, tool_choice) {
            (_, None | Some(Value::Null)) => true,
            (Shape::OpenAi, Some(Value::String(choice))) => choice == "auto",
            (Shape::Anthropic, Some(choice)) => {
                choice.get("type").and_then(Value::as_str) == Some("auto")
            }
            _ => false,
        }
    }

    /// The `tool_choice` that forbids tool calls.
    pub(crate) fn no_tools_choice(self) -> Value {
        match self {
            Shape::OpenAi => json!("none"),
            Shape::Anthropic => json!({"type": "none"}),
        }
    }

    /// The assistant message of a (non-streamed) answer, in this shape's message form.
    pub(crate) fn answer_message(self, answer: &Value) -> Option<Value> {
        match self {
            Shape::OpenAi => answer
                .get("choices")?
                .as_array()?
                .iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)?
                .get("message")
                .cloned(),
            Shape::Anthropic => {
                let content = answer.get("content")?.as_array()?;
                Some(json!({"role": "assistant", "content": content}))
            }
        }
    }

    /// The tool calls of an assistant message.
    pub(crate) fn calls(self, message: &Value) -> Vec<Call> {
        match self {
            Shape::OpenAi => message
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .filter_map(|call| {
                            let function = call.get("function")?;
                            let arguments = function
                                .get("arguments")
                                .and_then(Value::as_str)
                                .unwrap_or("");
                            let args = if arguments.trim().is_empty() {
                                Ok(json!({}))
                            } else {
                                serde_json::from_str::<Value>(arguments)
                                    .map_err(|e| format!("the arguments are not JSON: {e}"))
                            };
                            Some(Call {
                                id: call.get("id")?.as_str()?.to_owned(),
                                name: function.get("name")?.as_str()?.to_owned(),
                                args,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default(),
            Shape::Anthropic => message
                .get("content")
                .and_then(Value::as_array)
                .map(|blocks| {
                    blocks
                        .iter()
                        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
                        .filter_map(|block| {
                            let input = block.get("input").cloned().unwrap_or(json!({}));
                            let args = match input {
                                Value::Object(_) => Ok(input),
                                other => Err(format!("the input is not an object: {other}")),
                            };
                            Some(Call {
                                id: block.get("id")?.as_str()?.to_owned(),
                                name: block.get("name")?.as_str()?.to_owned(),
                                args,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The messages of one round of tool calls the proxy ran: the assistant's message that made
    /// them, then their results (`(call id, content, is_error)`, one per call, in order).
    pub(crate) fn round_messages(
        self,
        assistant: &Value,
        results: &[(String, String, bool)],
    ) -> Vec<Value> {
        match self {
            Shape::OpenAi => {
                let mut message = Map::new();
                message.insert("role".into(), json!("assistant"));
                message.insert(
                    "content".into(),
                    assistant.get("content").cloned().unwrap_or(Value::Null),
                );
                if let Some(calls) = assistant.get("tool_calls") {
                    message.insert("tool_calls".into(), calls.clone());
                }
                let mut out = vec![Value::Object(message)];
                out.extend(results.iter().map(|(id, content, _)| {
                    json!({"role": "tool", "tool_call_id": id, "content": content})
                }));
                out
            }
            Shape::Anthropic => {
                let content = assistant.get("content").cloned().unwrap_or(json!([]));
                let blocks: Vec<Value> = results
                    .iter()
                    .map(|(id, content, is_error)| {
                        let mut block =
                            json!({"type": "tool_result", "tool_use_id": id, "content": content});
                        if *is_error {
                            block["is_error"] = json!(true);
                        }
                        block
                    })
                    .collect();
                vec![
                    json!({"role": "assistant", "content": content}),
                    json!({"role": "user", "content": blocks}),
                ]
            }
        }
    }

    /// An error body in this shape (for failures the upstream did not describe itself).
    pub(crate) fn error_body(self, kind: &str, message: &str) -> Value {
        match self {
            Shape::OpenAi => json!({"error": {"message": message, "type": kind, "code": kind}}),
            Shape::Anthropic => {
                json!({"type": "error", "error": {"type": kind, "message": message}})
            }
        }
    }
}

/// The content of an Anthropic message as a list of blocks (a string becomes one text block).
pub(crate) fn anthropic_blocks(content: &Value) -> Vec<Value> {
    match content {
        Value::Array(blocks) => blocks.clone(),
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        Value::Null => Vec::new(),
        other => vec![other.clone()],
    }
}

/// Drops a repeated tool call (same id as an earlier one) and a repeated result for one call
/// (providers refuse both), which a client that changes the messages it sends back could
/// otherwise cause (its copy and the proxy's both stored).
pub(crate) fn dedupe_tool_ids(shape: Shape, messages: &mut Vec<Value>) {
    let mut calls = std::collections::HashSet::new();
    let mut results = std::collections::HashSet::new();
    match shape {
        Shape::OpenAi => {
            messages.retain_mut(|message| {
                if let Some(id) = message.get("tool_call_id").and_then(Value::as_str) {
                    return results.insert(id.to_owned());
                }
                if let Some(list) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    list.retain(|call| {
                        call.get("id")
                            .and_then(Value::as_str)
                            .is_none_or(|id| calls.insert(id.to_owned()))
                    });
                    if list.is_empty() {
                        if let Some(fields) = message.as_object_mut() {
                            fields.remove("tool_calls");
                        }
                        return message.get("content").is_some_and(|c| !c.is_null());
                    }
                }
                true
            });
        }
        Shape::Anthropic => {
            messages.retain_mut(|message| {
                let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
                    return true;
                };
                blocks.retain(|block| match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => block
                        .get("id")
                        .and_then(Value::as_str)
                        .is_none_or(|id| calls.insert(id.to_owned())),
                    Some("tool_result") => block
                        .get("tool_use_id")
                        .and_then(Value::as_str)
                        .is_none_or(|id| results.insert(id.to_owned())),
                    _ => true,
                });
                !blocks.is_empty()
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_choice_rule() {
        let openai = Shape::OpenAi;
        assert!(openai.model_chooses_tools(None));
        assert!(openai.model_chooses_tools(Some(&json!("auto"))));
        assert!(!openai.model_chooses_tools(Some(&json!("none"))));
        assert!(!openai.model_chooses_tools(Some(&json!("required"))));
        assert!(!openai.model_chooses_tools(Some(
            &json!({"type": "function", "function": {"name": "f"}})
        )));
        let anthropic = Shape::Anthropic;
        assert!(anthropic.model_chooses_tools(Some(
            &json!({"type": "auto", "disable_parallel_tool_use": true})
        )));
        assert!(!anthropic.model_chooses_tools(Some(&json!({"type": "any"}))));
        assert!(!anthropic.model_chooses_tools(Some(&json!({"type": "none"}))));
    }

    #[test]
    fn calls_in_both_shapes() {
        let message = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "lcm_grep", "arguments": "{\"pattern\": \"x\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]});
        let calls = Shape::OpenAi.calls(&message);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].args.as_ref().unwrap()["pattern"], "x");
        assert!(calls[1].args.is_err());
        let message = json!({"role": "assistant", "content": [
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "t1", "name": "lcm_grep", "input": {"pattern": "x"}}]});
        let calls = Shape::Anthropic.calls(&message);
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].id, "t1");
    }

    #[test]
    fn repeated_tool_ids_are_dropped() {
        let mut messages = vec![
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "a"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "a"}),
            json!({"role": "user", "content": "next"}),
        ];
        dedupe_tool_ids(Shape::OpenAi, &mut messages);
        assert_eq!(messages.len(), 3);
        let mut messages = vec![
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}, {"type": "tool_use", "id": "t1"}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]}),
        ];
        dedupe_tool_ids(Shape::Anthropic, &mut messages);
        assert_eq!(messages[0]["content"].as_array().unwrap().len(), 1);
    }
}
