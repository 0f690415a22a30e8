//! The messages sent upstream, within the budget.
//!
//! The context the runtime assembled for the budget (summaries, then the raw tail) is rendered
//! in the request's shape, with one refinement: the newest messages that the client still holds
//! are sent as the client sent them (its own JSON: images, `cache_control` markers, thinking
//! blocks and their signatures intact), starting at a message that does not answer tool calls.
//! Everything older is rendered by the engine (`AssembledContext::to_openai` /
//! `to_anthropic`). Stored messages newer than the client's newest (an answer it asks for
//! again) are left out: a request ends where the client's list ends.
//!
//! The whole request body, as sent, is then counted with the configured tokenizer (images and
//! other binary payloads count as [`BINARY_PART_TOKENS`] each, not as their base64 text). While
//! it is over the budget: messages larger than a share of the budget are shortened first (a
//! quarter; half for the newest), keeping their head and tail and saying which message holds
//! the full text; then the oldest items are left out of this request (they stay in the store,
//! and `lcm_grep` finds them); the newest message is never left out, only shortened.

use lcm_core::message::Part;
use lcm_core::tokens::{BINARY_PART_TOKENS, TokenCounter};
use lcm_engine::assembly::{AssembledContext, ContextItem};
use lcm_llm::truncate_middle;
use serde_json::{Map, Value, json};

use super::conversation::{ClientMessage, fingerprint};
use super::shape::{Shape, anthropic_blocks, dedupe_tool_ids};

/// Tokens a message costs in the JSON body beyond its stored count (role, keys, quotes).
const MESSAGE_JSON_TOKENS: u64 = 8;
/// Fewest tokens a shortened message keeps.
const MIN_ITEM_TOKENS: u64 = 64;
/// Most rounds of the fitting loop.
const MAX_STEPS: usize = 64;
/// Stored messages after the client's newest one that are left out of the request (see
/// [`Plan::new`]); the newest is looked for among this many.
const NEWEST_SLACK: usize = 16;

/// One item of the context, and the client's own copy of it when it is sent as such.
#[derive(Debug, Clone)]
struct Unit {
    item: ContextItem,
    /// The client's copy and the empty messages right after it.
    verbatim: Option<Vec<Value>>,
    /// The client's copy answers tool calls (never the first message sent as the client's).
    answers_calls: bool,
    /// Estimated tokens in the body.
    tokens: u64,
}

/// The context of one turn, being fitted to the budget.
pub(crate) struct Plan {
    shape: Shape,
    counter: TokenCounter,
    template: AssembledContext,
    units: Vec<Unit>,
    /// `units[boundary..]` are sent as the client sent them.
    boundary: usize,
}

/// The request cannot fit: what is fixed (system prompt, tools, tool rounds, the newest message
/// at its smallest) alone takes `tokens`.
#[derive(Debug)]
pub(crate) struct TooSmall {
    pub tokens: u64,
}

impl Plan {
    /// The plan for `context`, whose newest messages are matched against the client's.
    pub(crate) fn new(
        shape: Shape,
        counter: TokenCounter,
        context: AssembledContext,
        client: &[ClientMessage],
    ) -> Plan {
        let AssembledContext {
            session,
            state,
            items,
            tokens,
        } = context;
        let template = AssembledContext {
            session,
            state,
            items: Vec::new(),
            tokens,
        };
        let mut units: Vec<Unit> = items
            .into_iter()
            .map(|item| Unit {
                tokens: item.tokens() + MESSAGE_JSON_TOKENS,
                item,
                verbatim: None,
                answers_calls: false,
            })
            .collect();
        let with_parts: Vec<usize> = client
            .iter()
            .enumerate()
            .filter(|(_, m)| m.parsed.is_some())
            .map(|(i, _)| i)
            .collect();
        // Stored messages after the client's newest one are messages it no longer has (an
        // answer it is asking again for, one it never received): this request ends where the
        // client's list ends.
        if let Some(&newest) = with_parts.last() {
            let newest = client[newest].fp;
            let lowest = units.len().saturating_sub(NEWEST_SLACK);
            if let Some(end) = (lowest..units.len()).rev().find(|&i| {
                matches!(&units[i].item, ContextItem::Message(m) if fingerprint(m.role, &m.parts) == newest)
            }) {
                units.truncate(end + 1);
            }
        }
        let (mut p, mut q) = (units.len(), with_parts.len());
        while p > 0 && q > 0 {
            let theirs = &client[with_parts[q - 1]];
            let unit = &mut units[p - 1];
            let ContextItem::Message(ours) = &unit.item else {
                break;
            };
            if fingerprint(ours.role, &ours.parts) != theirs.fp {
                break;
            }
            let end = with_parts.get(q).copied().unwrap_or(client.len());
            let raw: Vec<Value> = client[with_parts[q - 1]..end]
                .iter()
                .map(|m| m.raw.clone())
                .collect();
            unit.tokens = raw.iter().map(|m| measure(&counter, m) + 2).sum::<u64>();
            unit.verbatim = Some(raw);
            unit.answers_calls = theirs.answers_calls;
            p -= 1;
            q -= 1;
        }
        let mut plan = Plan {
            shape,
            counter,
            template,
            units,
            boundary: p,
        };
        plan.normalize();
        plan
    }

    /// Messages sent as the client's own copies (for tests and logs).
    pub(crate) fn verbatim_count(&self) -> usize {
        self.units.len() - self.boundary
    }

    /// Moves the boundary past messages that cannot start the client's part.
    fn normalize(&mut self) {
        while self.boundary < self.units.len() {
            let unit = &self.units[self.boundary];
            if unit.verbatim.is_some() && !unit.answers_calls {
                break;
            }
            self.boundary += 1;
        }
    }

    /// The first `n` units are rendered by the engine.
    fn demote(&mut self, n: usize) {
        self.boundary = self.boundary.max(n.min(self.units.len()));
        self.normalize();
    }

    fn drop_front(&mut self, n: usize) {
        self.units.drain(..n);
        self.boundary = self.boundary.saturating_sub(n);
        self.normalize();
    }

    /// The `messages` of the body: `leading` (the client's leading system messages, OpenAI),
    /// the context, then `rounds` (the tool rounds the proxy ran); and, for Anthropic, system
    /// text the engine found in stored messages.
    fn messages(&self, leading: &[Value], rounds: &[Value]) -> (Vec<Value>, Option<String>) {
        let mut context = self.template.clone();
        context.items = self.units[..self.boundary]
            .iter()
            .map(|u| u.item.clone())
            .collect();
        let verbatim = self.units[self.boundary..]
            .iter()
            .flat_map(|u| u.verbatim.iter().flatten().cloned());
        match self.shape {
            Shape::OpenAi => {
                let mut out = leading.to_vec();
                out.extend(context.to_openai(None));
                out.extend(verbatim);
                dedupe_tool_ids(self.shape, &mut out);
                out.extend(rounds.iter().cloned());
                (out, None)
            }
            Shape::Anthropic => {
                let rendered = context.to_anthropic(None);
                let system = rendered
                    .get("system")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let mut out: Vec<Value> = rendered
                    .get("messages")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for message in verbatim {
                    push_anthropic(&mut out, message);
                }
                if out
                    .first()
                    .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                {
                    out.insert(
                        0,
                        json!({"role": "user", "content": "(conversation continues)"}),
                    );
                }
                dedupe_tool_ids(self.shape, &mut out);
                out.extend(rounds.iter().cloned());
                (out, system)
            }
        }
    }

    /// The request body: `base` (the client's body with its tools set) with `messages` (and,
    /// for Anthropic, `system`) filled in.
    pub(crate) fn body(
        &self,
        base: &Map<String, Value>,
        leading: &[Value],
        rounds: &[Value],
    ) -> Value {
        let (messages, engine_system) = self.messages(leading, rounds);
        let mut body = base.clone();
        body.insert("messages".into(), Value::Array(messages));
        if let Some(text) = engine_system {
            let system = match body.remove("system") {
                None | Some(Value::Null) => Value::String(text),
                Some(Value::String(s)) if s.is_empty() => Value::String(text),
                Some(Value::String(s)) => Value::String(format!("{s}\n\n{text}")),
                Some(Value::Array(mut blocks)) => {
                    blocks.push(json!({"type": "text", "text": text}));
                    Value::Array(blocks)
                }
                Some(other) => other,
            };
            body.insert("system".into(), system);
        }
        Value::Object(body)
    }

    /// Shrinks the plan until `render(plan)` measures at most `budget` tokens; the body and its
    /// count.
    pub(crate) fn fit(
        &mut self,
        budget: u64,
        render: impl Fn(&Plan) -> Value,
    ) -> Result<(Value, u64), TooSmall> {
        let mut capped = false;
        let mut tokens = 0;
        for _ in 0..MAX_STEPS {
            let body = render(self);
            tokens = measure(&self.counter, &body);
            if tokens <= budget {
                return Ok((body, tokens));
            }
            let excess = tokens - budget;
            if !capped {
                capped = true;
                if self.cap(budget) {
                    continue;
                }
            }
            if self.units.len() > 1 {
                let (mut n, mut freed) = (0, 0);
                while n + 1 < self.units.len() && freed < excess {
                    freed += self.units[n].tokens;
                    n += 1;
                }
                self.drop_front(n);
            } else if !self.units.is_empty() {
                self.demote(1);
                let target = self.units[0].tokens.saturating_sub(excess + 32);
                if target < MIN_ITEM_TOKENS || !self.shorten(0, target) {
                    return Err(TooSmall { tokens });
                }
            } else {
                return Err(TooSmall { tokens });
            }
        }
        Err(TooSmall { tokens })
    }

    /// Shortens every message over its share of the budget (a quarter; half for the newest).
    /// Whether anything changed.
    fn cap(&mut self, budget: u64) -> bool {
        let share = |i: usize, len: usize| {
            if i + 1 == len {
                (budget / 2).max(MIN_ITEM_TOKENS)
            } else {
                (budget / 4).max(MIN_ITEM_TOKENS)
            }
        };
        let len = self.units.len();
        let Some(last_big) = (0..len)
            .rev()
            .find(|&i| self.units[i].tokens > share(i, len))
        else {
            return false;
        };
        self.demote(last_big + 1);
        let mut changed = false;
        for i in 0..=last_big {
            if self.units[i].tokens > share(i, len) {
                changed |= self.shorten(i, share(i, len));
            }
        }
        changed
    }

    /// Shortens unit `i` (rendered by the engine) to about `target` tokens; whether it changed.
    fn shorten(&mut self, i: usize, target: u64) -> bool {
        let counter = self.counter;
        let unit = &mut self.units[i];
        let before = unit.tokens;
        unit.verbatim = None;
        match &mut unit.item {
            ContextItem::Summary { rendered, .. }
            | ContextItem::Elided { text: rendered, .. }
            | ContextItem::Pinned { text: rendered, .. }
            | ContextItem::Commitments { text: rendered, .. } => {
                let budget = u32::try_from(target).unwrap_or(u32::MAX);
                *rendered = truncate_middle(&counter, rendered, budget);
                unit.tokens = counter.count_text(rendered) as u64 + MESSAGE_JSON_TOKENS;
            }
            ContextItem::Message(message) => {
                let id = message.id;
                let sizes: Vec<u64> = message
                    .parts
                    .iter()
                    .map(|p| {
                        p.searchable_text()
                            .map_or(0, |t| counter.count_text(&t) as u64)
                    })
                    .collect();
                let total: u64 = sizes.iter().sum::<u64>().max(1);
                let note = format!(
                    "\n[lcm: shortened to fit this request; the full text is {id} (lcm_describe {id})]"
                );
                let parts = std::mem::take(&mut message.parts);
                for (part, size) in parts.into_iter().zip(sizes) {
                    let share = (target * size / total).max(32);
                    let keep = u32::try_from(share).unwrap_or(u32::MAX);
                    let fits = size <= share;
                    let part = match part {
                        Part::Reasoning { .. } => continue,
                        part if fits => part,
                        Part::Text { text } => Part::Text {
                            text: truncate_middle(&counter, &text, keep) + &note,
                        },
                        Part::ToolResult {
                            call_id,
                            content,
                            is_error,
                        } => Part::ToolResult {
                            call_id,
                            content: truncate_middle(&counter, &content, keep) + &note,
                            is_error,
                        },
                        // Arguments cut short are no longer JSON: the call becomes text (and
                        // its result, now unpaired, is rendered as text too).
                        Part::ToolCall {
                            id: call_id,
                            name,
                            arguments,
                        } => Part::Text {
                            text: format!(
                                "[tool call {call_id}: {name} {}]{note}",
                                truncate_middle(&counter, &arguments, keep)
                            ),
                        },
                        Part::Opaque { kind, json } => Part::Text {
                            text: format!(
                                "[{kind}] {}{note}",
                                truncate_middle(&counter, &json, keep)
                            ),
                        },
                        other => other,
                    };
                    message.parts.push(part);
                }
                if message.parts.is_empty() {
                    message.parts.push(Part::Text {
                        text: note.trim().to_owned(),
                    });
                }
                message.token_count = counter.count_message(message.role, &message.parts);
                unit.tokens = u64::from(message.token_count) + MESSAGE_JSON_TOKENS;
            }
        }
        unit.tokens < before
    }
}

/// Appends an Anthropic message, merging it into the last one when both have the same role.
fn push_anthropic(out: &mut Vec<Value>, message: Value) {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(last) = out.last_mut()
        && role.is_some()
        && last.get("role").and_then(Value::as_str) == role.as_deref()
    {
        let mut blocks = anthropic_blocks(last.get("content").unwrap_or(&Value::Null));
        blocks.extend(anthropic_blocks(
            message.get("content").unwrap_or(&Value::Null),
        ));
        last["content"] = Value::Array(blocks);
        return;
    }
    out.push(message);
}

/// Tokens of `value` as sent (its compact JSON text), with each binary payload (base64 images,
/// audio, files) counted as [`BINARY_PART_TOKENS`] rather than as its text.
pub(crate) fn measure(counter: &TokenCounter, value: &Value) -> u64 {
    if !has_binary(value) {
        return counter.count_text(&value.to_string()) as u64;
    }
    let mut copy = value.clone();
    let payloads = strip_binary(&mut copy);
    counter.count_text(&copy.to_string()) as u64 + payloads * u64::from(BINARY_PART_TOKENS)
}

/// A binary payload's field, if `object` is a content part carrying one.
fn payload_field(object: &Map<String, Value>) -> Option<(&'static str, &'static str)> {
    match object.get("type").and_then(Value::as_str)? {
        "image" | "document" => Some(("source", "data")),
        "image_url" => Some(("image_url", "url")),
        "input_audio" => Some(("input_audio", "data")),
        "file" => Some(("file", "file_data")),
        _ => None,
    }
}

fn is_payload(object: &Map<String, Value>) -> bool {
    payload_field(object).is_some_and(|(outer, inner)| {
        object
            .get(outer)
            .and_then(|o| o.get(inner))
            .and_then(Value::as_str)
            .is_some_and(|data| data.len() > 256 && (inner != "url" || data.starts_with("data:")))
    })
}

fn has_binary(value: &Value) -> bool {
    match value {
        Value::Object(object) => is_payload(object) || object.values().any(has_binary),
        Value::Array(items) => items.iter().any(has_binary),
        _ => false,
    }
}

fn strip_binary(value: &mut Value) -> u64 {
    match value {
        Value::Object(object) => {
            if is_payload(object)
                && let Some((outer, inner)) = payload_field(object)
                && let Some(slot) = object.get_mut(outer).and_then(|o| o.get_mut(inner))
            {
                *slot = Value::String(String::new());
                return 1;
            }
            object.values_mut().map(strip_binary).sum()
        }
        Value::Array(items) => items.iter_mut().map(strip_binary).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::ids::{MessageId, SessionId};
    use lcm_core::message::{Message, Role, SourceFormat};
    use lcm_core::summary::ContextState;
    use lcm_core::time::Timestamp;
    use lcm_core::tokens::Encoding;

    use crate::proxy::conversation::parse_client_message;

    fn stored(seq: u64, role: Role, parts: Vec<Part>, counter: &TokenCounter) -> ContextItem {
        ContextItem::Message(Message {
            id: MessageId(seq),
            session: SessionId(0),
            seq,
            role,
            created_at: Timestamp(0),
            token_count: counter.count_message(role, &parts),
            parts,
            source: SourceFormat::OpenAiChat,
        })
    }

    fn text(text: &str) -> Part {
        Part::Text { text: text.into() }
    }

    fn context(items: Vec<ContextItem>) -> AssembledContext {
        let tokens = items.iter().map(ContextItem::tokens).sum();
        AssembledContext {
            session: SessionId(0),
            state: ContextState::default(),
            items,
            tokens,
        }
    }

    fn client(raw: &str) -> ClientMessage {
        parse_client_message(Shape::OpenAi, raw, serde_json::from_str(raw).unwrap()).unwrap()
    }

    #[test]
    fn the_clients_newest_messages_are_sent_as_they_are_and_the_budget_holds() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let old = "word ".repeat(3000);
        let items = vec![
            stored(0, Role::User, vec![text(&old)], &counter),
            stored(1, Role::Assistant, vec![text("noted")], &counter),
            stored(2, Role::User, vec![text("and now?")], &counter),
        ];
        let sent = [
            client(r#"{"role":"assistant","content":"noted"}"#),
            client(r#"{"role":"user","content":"and now?","name":"kept-field"}"#),
        ];
        let mut plan = Plan::new(Shape::OpenAi, counter, context(items), &sent);
        assert_eq!(plan.verbatim_count(), 2);
        let base = Map::new();
        let (body, tokens) = plan.fit(1500, |plan| plan.body(&base, &[], &[])).unwrap();
        assert!(tokens <= 1500, "{tokens}");
        assert_eq!(measure(&counter, &body), tokens);
        let messages = body["messages"].as_array().unwrap();
        // The client's own copy, with its extra field, is what is sent.
        assert_eq!(messages.last().unwrap()["name"], "kept-field");
        // The old, large message was shortened, not dropped, and says where the rest is.
        assert!(
            messages[0]["content"]
                .as_str()
                .unwrap()
                .contains("the full text is msg_0"),
            "{body}"
        );
    }

    #[test]
    fn binary_payloads_count_as_a_fixed_cost() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let data = "QUJD".repeat(100_000);
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}]}]});
        let tokens = measure(&counter, &body);
        assert!(tokens > u64::from(BINARY_PART_TOKENS));
        assert!(tokens < u64::from(BINARY_PART_TOKENS) + 100, "{tokens}");
    }
}
