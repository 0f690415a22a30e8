//! [`run_agent`]: the loop itself.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use lcm_llm::{ChatProvider, ChatRequest, ChatTurn, ToolCall, ToolSpec, Usage};
use serde_json::Value;
use tokio::time::Instant;

/// The tools a sub-agent may call.
///
/// Kept minimal on purpose: the engine's tool registry is adapted to it.
#[async_trait]
pub trait AgentTools: Send + Sync {
    /// The tools offered to the model (read once per run).
    fn specs(&self) -> Vec<ToolSpec>;

    /// Runs tool `name` with `arguments` (always a JSON object). `Err` carries a message for the
    /// model; it goes back as an error result and the loop goes on.
    async fn execute(&self, name: &str, arguments: &Value) -> Result<Value, String>;
}

/// What a run sends the model at each step. Without one, the whole conversation so far; the
/// runtime's sub-agents send a bounded view instead: their session, assembled, compacted and
/// fitted to a budget like any LCM context (`runtime/delegation.rs`).
#[async_trait]
pub trait ConversationWindow: Send + Sync {
    /// The turns to send, given every turn so far (the system prompt first, if any). `Err`
    /// ends the run ([`AgentStop::ContextFailed`]) with the message.
    async fn view(&self, turns: &[ChatTurn]) -> Result<Vec<ChatTurn>, String>;
}

/// What bounds one run, and the sampling settings of its requests.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentLimits {
    /// Most provider calls (model turns) the run may make.
    pub max_steps: u32,
    /// The run stops once the providers' reported usage (input + output, summed over its calls)
    /// reaches this, unless the model has just answered.
    pub max_total_tokens: u64,
    /// When the run must be over. Provider calls and tool executions are cut off at this
    /// instant.
    pub deadline: Option<Instant>,
    /// Most tokens the model may generate per turn.
    pub max_output_tokens: u32,
    /// Sampling temperature of every request.
    pub temperature: f32,
}

impl Default for AgentLimits {
    /// 20 steps, 200,000 tokens, no deadline, 4,096 output tokens per turn, temperature 0.
    fn default() -> Self {
        AgentLimits {
            max_steps: 20,
            max_total_tokens: 200_000,
            deadline: None,
            max_output_tokens: 4096,
            temperature: 0.0,
        }
    }
}

impl AgentLimits {
    /// These limits with a deadline `timeout` from now.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.deadline = Some(Instant::now() + timeout);
        self
    }
}

/// Why a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentStop {
    /// The model answered in text, without calling tools.
    FinalAnswer,
    /// The model still wanted tools after `max_steps` turns.
    StepLimit,
    /// The reported usage reached `max_total_tokens` while the model still wanted tools.
    TokenLimit,
    /// The deadline passed.
    Deadline,
    /// The provider failed (after its own retries); the reason, as it said it.
    ProviderFailed(String),
    /// The model replied with neither text nor tool calls twice in a row (the first time it is
    /// asked again).
    EmptyAnswer,
    /// The conversation window could not give a view to send (see [`ConversationWindow`]).
    ContextFailed(String),
}

impl AgentStop {
    /// How the run stopped, as a caller reads it: `final_answer`, `step_limit`, `token_limit`,
    /// `deadline`, `provider_failed: <reason>`, ...
    pub fn name(&self) -> String {
        match self {
            AgentStop::FinalAnswer => "final_answer".into(),
            AgentStop::StepLimit => "step_limit".into(),
            AgentStop::TokenLimit => "token_limit".into(),
            AgentStop::Deadline => "deadline".into(),
            AgentStop::ProviderFailed(reason) => format!("provider_failed: {reason}"),
            other => format!("{other:?}").to_lowercase(),
        }
    }
}

/// How a run went.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentOutcome {
    /// The model's final answer (only when `stop` is [`AgentStop::FinalAnswer`]).
    pub answer: Option<String>,
    /// Why the run ended.
    pub stop: AgentStop,
    /// Provider calls that returned a turn.
    pub steps: u32,
    /// The usage the provider reported, summed over the run.
    pub usage: Usage,
    /// The whole conversation, in order: the system prompt (if any), the task, then every
    /// assistant turn and tool result (the same turns the observer saw).
    pub turns: Vec<ChatTurn>,
}

/// Longest stretch of malformed arguments quoted back to the model, in characters.
const MAX_QUOTED_ARGUMENTS: usize = 1000;

/// What the model is told when it replies with nothing.
const EMPTY_REPLY_NUDGE: &str =
    "Your last reply was empty. Answer the task in text, or call one of the tools.";

/// Runs a sub-agent on `task` until it answers or a limit stops it.
///
/// Each step sends the conversation to `provider` with `tools.specs()`. When the reply calls
/// tools, each call is handled in order and its result appended:
/// - a tool that is not offered gets an error result listing the tools that are;
/// - arguments that are not a JSON object get an error result quoting the parse error and the
///   arguments received, and the tool is not run;
/// - otherwise the tool runs; its `Ok` value is the result (a string as is, any other JSON as
///   compact JSON text), its `Err` message an error result.
///
/// A reply with text and no calls is the final answer. An empty reply is answered once with a
/// request to answer or call a tool. The limits are checked before every provider call, and
/// after a reply that calls tools (the calls are not run if a limit is reached then); the
/// deadline also bounds every provider call and tool execution while it runs. Nothing the
/// provider sends makes this panic; provider failures end the run with
/// [`AgentStop::ProviderFailed`].
///
/// `observer` is called with every turn as it is added to the conversation, starting with the
/// system prompt (as [`ChatTurn::System`]) and the task (as [`ChatTurn::User`]). It must be
/// `Send` so that the run can be spawned on a multi-threaded runtime. `window`, when given,
/// chooses what each request sends (the whole conversation otherwise).
pub async fn run_agent(
    provider: &dyn ChatProvider,
    tools: &dyn AgentTools,
    system: Option<&str>,
    task: String,
    limits: AgentLimits,
    observer: &mut (dyn FnMut(&ChatTurn) + Send),
    window: Option<&dyn ConversationWindow>,
) -> AgentOutcome {
    let specs = tools.specs();
    let mut run = Run {
        request: ChatRequest {
            system: None,
            turns: Vec::new(),
            tools: specs,
            max_tokens: limits.max_output_tokens,
            temperature: limits.temperature,
        },
        observer,
        steps: 0,
        usage: Usage::default(),
    };
    if let Some(system) = system {
        run.push(ChatTurn::System(system.to_owned()));
    }
    run.push(ChatTurn::User(task));
    let mut nudged = false;

    loop {
        if run.steps >= limits.max_steps {
            return run.finish(AgentStop::StepLimit, None);
        }
        if run.usage.total() >= limits.max_total_tokens {
            return run.finish(AgentStop::TokenLimit, None);
        }
        let windowed;
        let request = match window {
            None => &run.request,
            Some(window) => match within(limits.deadline, window.view(&run.request.turns)).await {
                None => return run.finish(AgentStop::Deadline, None),
                Some(Err(error)) => return run.finish(AgentStop::ContextFailed(error), None),
                Some(Ok(turns)) => {
                    windowed = ChatRequest {
                        system: run.request.system.clone(),
                        turns,
                        tools: run.request.tools.clone(),
                        max_tokens: run.request.max_tokens,
                        temperature: run.request.temperature,
                    };
                    &windowed
                }
            },
        };
        let response = match within(limits.deadline, provider.chat(request)).await {
            None => return run.finish(AgentStop::Deadline, None),
            Some(Err(error)) => {
                tracing::debug!(step = run.steps + 1, %error, "sub-agent provider call failed");
                return run.finish(AgentStop::ProviderFailed(error.to_string()), None);
            }
            Some(Ok(response)) => response,
        };
        run.steps += 1;
        run.usage += response.usage;
        tracing::debug!(
            step = run.steps,
            calls = response.tool_calls.len(),
            tokens = run.usage.total(),
            "sub-agent turn"
        );

        if response.tool_calls.is_empty() {
            match response.text {
                Some(text) => {
                    run.push(ChatTurn::assistant_text(text.clone()));
                    return run.finish(AgentStop::FinalAnswer, Some(text));
                }
                None if nudged => return run.finish(AgentStop::EmptyAnswer, None),
                None => {
                    // An empty assistant message is refused by some APIs: ask again instead.
                    nudged = true;
                    run.push(ChatTurn::User(EMPTY_REPLY_NUDGE.to_owned()));
                    continue;
                }
            }
        }
        nudged = false;
        let calls = response.tool_calls;
        run.push(ChatTurn::Assistant {
            text: response.text,
            tool_calls: calls.clone(),
        });
        if run.steps >= limits.max_steps {
            return run.finish(AgentStop::StepLimit, None);
        }
        if run.usage.total() >= limits.max_total_tokens {
            return run.finish(AgentStop::TokenLimit, None);
        }
        for call in &calls {
            let Some(result) = within(
                limits.deadline,
                handle_call(tools, &run.request.tools, call),
            )
            .await
            else {
                return run.finish(AgentStop::Deadline, None);
            };
            run.push(result);
        }
    }
}

/// The state of one run.
struct Run<'a> {
    request: ChatRequest,
    observer: &'a mut (dyn FnMut(&ChatTurn) + Send),
    steps: u32,
    usage: Usage,
}

impl Run<'_> {
    fn push(&mut self, turn: ChatTurn) {
        (self.observer)(&turn);
        self.request.turns.push(turn);
    }

    fn finish(self, stop: AgentStop, answer: Option<String>) -> AgentOutcome {
        tracing::debug!(
            ?stop,
            steps = self.steps,
            tokens = self.usage.total(),
            "sub-agent done"
        );
        AgentOutcome {
            answer,
            stop,
            steps: self.steps,
            usage: self.usage,
            turns: self.request.turns,
        }
    }
}

/// `future`'s output, or `None` when `deadline` passes first (or has passed already).
async fn within<F: Future>(deadline: Option<Instant>, future: F) -> Option<F::Output> {
    match deadline {
        None => Some(future.await),
        Some(deadline) if Instant::now() >= deadline => None,
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
    }
}

/// Runs one call, or explains to the model why it was not run; always a result turn.
async fn handle_call(tools: &dyn AgentTools, specs: &[ToolSpec], call: &ToolCall) -> ChatTurn {
    if !specs.iter().any(|spec| spec.name == call.name) {
        let available = if specs.is_empty() {
            "none".to_owned()
        } else {
            specs
                .iter()
                .map(|spec| spec.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        return ChatTurn::tool_error(
            &call.id,
            format!(
                "error: there is no tool named {:?}. Available tools: {available}.",
                call.name
            ),
        );
    }
    let arguments = match call.parse_arguments() {
        Ok(arguments) => arguments,
        Err(error) => {
            return ChatTurn::tool_error(
                &call.id,
                format!(
                    "error: the tool {name:?} was not run: {error}. The arguments received were: \
                     {received}. Call {name:?} again with a JSON object matching its parameters.",
                    name = call.name,
                    received = quote(&call.arguments),
                ),
            );
        }
    };
    match tools.execute(&call.name, &arguments).await {
        Ok(Value::String(text)) => ChatTurn::tool_result(&call.id, text),
        Ok(value) => ChatTurn::tool_result(&call.id, value.to_string()),
        Err(message)
            if message
                .trim_start()
                .to_ascii_lowercase()
                .starts_with("error") =>
        {
            ChatTurn::tool_error(&call.id, message)
        }
        Err(message) => ChatTurn::tool_error(&call.id, format!("error: {message}")),
    }
}

/// `text` for quoting in an error message, cut at [`MAX_QUOTED_ARGUMENTS`] characters.
fn quote(text: &str) -> String {
    match text.char_indices().nth(MAX_QUOTED_ARGUMENTS) {
        Some((cut, _)) => format!("{}... (cut)", &text[..cut]),
        None if text.is_empty() => "(nothing)".to_owned(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoTools;

    #[async_trait]
    impl AgentTools for NoTools {
        fn specs(&self) -> Vec<ToolSpec> {
            vec![ToolSpec::new(
                "echo",
                "Echoes.",
                serde_json::json!({"type": "object"}),
            )]
        }

        async fn execute(&self, _name: &str, arguments: &Value) -> Result<Value, String> {
            Ok(arguments.clone())
        }
    }

    #[test]
    fn quoting_cuts_long_arguments() {
        assert_eq!(quote(""), "(nothing)");
        assert_eq!(quote("{x"), "{x");
        let long = "é".repeat(3000);
        assert!(quote(&long).chars().count() < 1100);
    }

    #[tokio::test]
    async fn calls_are_checked_before_they_run() {
        let specs = NoTools.specs();
        let unknown = handle_call(&NoTools, &specs, &ToolCall::new("1", "nope", "{}")).await;
        assert!(
            matches!(&unknown, ChatTurn::ToolResult { content, is_error: true, .. } if content.contains("Available tools: echo"))
        );
        let bad = handle_call(&NoTools, &specs, &ToolCall::new("2", "echo", "[1]")).await;
        assert!(
            matches!(&bad, ChatTurn::ToolResult { content, is_error: true, .. } if content.contains("must be a JSON object"))
        );
        let ok = handle_call(&NoTools, &specs, &ToolCall::new("3", "echo", r#"{"a":1}"#)).await;
        assert_eq!(ok, ChatTurn::tool_result("3", r#"{"a":1}"#));
    }

    #[test]
    fn run_agent_future_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        struct Never;
        #[async_trait]
        impl ChatProvider for Never {
            async fn chat(
                &self,
                _: &ChatRequest,
            ) -> Result<lcm_llm::ChatResponse, lcm_llm::ProviderError> {
                Err(lcm_llm::ProviderError::Timeout)
            }
            fn model(&self) -> &str {
                "never"
            }
        }
        let mut observer = |_: &ChatTurn| {};
        let future = run_agent(
            &Never,
            &NoTools,
            None,
            "task".into(),
            AgentLimits::default(),
            &mut observer,
            None,
        );
        assert_send(&future);
    }
}
