//! The lcm-agent arm: the model as an lcm agent. The task's session is stored in a data
//! directory of its own and compacted (as for the scripted arm, with the summariser chosen);
//! then a [`Runtime`] is opened on that directory with the configured model, and each question
//! is put to the session's main agent through the engine's agent loop ([`run_agent`]): what the
//! model sees is the context lcm assembles for its window (summaries, then the newest messages),
//! fitted again at each step beside the question, the agent's own turns and the tools'
//! definitions, and it is offered lcm's tools ([`OFFERED_TOOLS`]) through the runtime's
//! registry, as sub-agents are. Its final text is the answer; a model that ignores tools simply
//! answers at its first turn.
//!
//! The question and the agent's turns are not stored in the task's session, so every question
//! sees the same context.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lcm_core::config::Config;
use lcm_core::tokens::TokenCounter;
use lcm_engine::assembly::system_prompt_tokens;
use lcm_engine::runtime::{Runtime, RuntimeOptions, context_turns};
use lcm_engine::{
    AgentLimits, AgentStop, AgentTools, AssembledContext, ConversationWindow, effective_budget,
    run_agent,
};
use lcm_llm::from_config::LlmClients;
use lcm_llm::{ChatTurn, Summarizer, ToolSpec};
use lcm_search::DataDir;
use serde_json::Value;

use crate::model::{Cost, ModelAnswer, ModelRun, ModelSettings, chat_turn_tokens};
use crate::stored::{StoredTask, blocking, store_and_compact};
use crate::tasks::Task;
use crate::{EvalError, Result};

/// The tools the agent is offered: lcm's retrieval tools for a main agent (`lcm_expand` itself
/// is for sub-agents: `lcm_expand_query` runs one) and `llm_map`.
pub const OFFERED_TOOLS: [&str; 4] = ["lcm_grep", "lcm_describe", "lcm_expand_query", "llm_map"];

/// The agent's instructions.
pub const AGENT_SYSTEM: &str = "You are an agent whose memory is managed by lcm. The \
conversation below is your context: its older parts were compacted into summaries (ids sum_N) \
over the original messages (ids msg_N), which are all kept. To find what the summaries leave \
out, search the messages with lcm_grep, read one with lcm_describe, or have lcm_expand_query \
read under the summaries for you. Then reply with the answer only, in the form the question \
asks for, without explanation.";

/// How long the runtime is given to stop after a task.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// One task run by the lcm arm: the answers, and the compaction they started from.
#[derive(Debug, Clone, PartialEq)]
pub struct LcmRun {
    pub run: ModelRun,
    pub stored: StoredTask,
}

/// Runs `task` in the lcm arm, in the data directory `dir` (created; it must not hold this task
/// already): stores and compacts its session to `budget` tokens with `summarizer`, opens a
/// runtime there with the model `llm` (the same summariser for any later compaction, sub-agents
/// fitted to the window), and asks the questions `settings` says. A provider failure ends the
/// run with [`EvalError::Model`]; an agent stopped by a limit scores 0 for that question.
pub async fn run(
    task: &Task,
    dir: &Path,
    config: &Config,
    llm: &LlmClients,
    summarizer: Arc<dyn Summarizer>,
    budget: u64,
    settings: &ModelSettings,
) -> Result<LcmRun> {
    let started = Instant::now();
    let stored = {
        let data = blocking({
            let (dir, config) = (dir.to_path_buf(), config.clone());
            move || Ok(DataDir::open(dir, &config)?)
        })
        .await?;
        store_and_compact(task, &data, budget, summarizer.as_ref()).await?
    };
    let mut config = config.clone();
    config.runtime.subagent_context_tokens = settings.window;
    config.runtime.subagent_max_steps = settings.max_turns;
    let runtime = Runtime::open(
        RuntimeOptions::dir(dir, config)
            .with_llm(llm.clone())
            .with_summarizer(summarizer),
    )
    .await
    .map_err(|e| EvalError::Runtime(e.to_string()))?;
    let answers = ask(&runtime, task, &stored, llm, settings).await;
    let stopped = runtime.shutdown(SHUTDOWN_GRACE).await;
    let answers = answers?;
    stopped.map_err(|e| EvalError::Runtime(e.to_string()))?;
    Ok(LcmRun {
        run: ModelRun::new(answers, started.elapsed().as_millis() as u64),
        stored,
    })
}

/// Puts each question to the session's main agent.
async fn ask(
    runtime: &Runtime,
    task: &Task,
    stored: &StoredTask,
    llm: &LlmClients,
    settings: &ModelSettings,
) -> Result<Vec<ModelAnswer>> {
    let counter = runtime.store().counter();
    let session = runtime
        .session_by_id(stored.session)
        .await
        .map_err(|e| EvalError::Runtime(e.to_string()))?;
    let tools = Offered(session.agent_tools());
    // The tools' definitions travel with every request: their room is kept too.
    let specs = serde_json::to_string(&tools.specs()).unwrap_or_default();
    let budget = effective_budget(settings.window, runtime.config().tokenizer.safety_margin)
        .saturating_sub(u64::from(settings.max_output_tokens))
        .saturating_sub(counter.count_text(&specs) as u64);
    let mut answers = Vec::new();
    for question in settings.questions(task) {
        let context = session
            .context(settings.window)
            .await
            .map_err(|e| EvalError::Runtime(e.to_string()))?;
        let window = Fitted {
            context,
            budget,
            counter,
        };
        let context_tokens = window.context_tokens(&question.text)?;
        let limits = AgentLimits {
            max_steps: settings.max_turns,
            max_output_tokens: settings.max_output_tokens,
            ..AgentLimits::default()
        }
        .with_timeout(settings.question_timeout);
        let mut tool_calls = 0u64;
        let mut observer = |turn: &ChatTurn| {
            if let ChatTurn::Assistant { tool_calls: c, .. } = turn {
                tool_calls += c.len() as u64;
            }
        };
        let outcome = run_agent(
            llm.chat.as_ref(),
            &tools,
            Some(AGENT_SYSTEM),
            question.text.clone(),
            limits,
            &mut observer,
            Some(&window),
        )
        .await;
        if let AgentStop::ProviderFailed(reason) = &outcome.stop {
            return Err(EvalError::Model(reason.clone()));
        }
        answers.push(ModelAnswer::scored(
            question,
            outcome.answer.unwrap_or_default(),
            Cost {
                calls: u64::from(outcome.steps),
                tool_calls,
                tokens: outcome.usage.total(),
                context_tokens,
            },
            outcome.stop.name(),
        ));
    }
    Ok(answers)
}

/// The runtime's tools for the session's main agent, restricted to [`OFFERED_TOOLS`] (the agent
/// loop refuses a call of any other).
struct Offered<T>(T);

#[async_trait]
impl<T: AgentTools> AgentTools for Offered<T> {
    fn specs(&self) -> Vec<ToolSpec> {
        self.0
            .specs()
            .into_iter()
            .filter(|spec| OFFERED_TOOLS.contains(&spec.name.as_str()))
            .collect()
    }

    async fn execute(&self, name: &str, arguments: &Value) -> std::result::Result<Value, String> {
        self.0.execute(name, arguments).await
    }
}

/// What each step sends: the system prompt, the session's assembled context fitted to what the
/// question and the agent's own turns leave of the window, then those turns.
struct Fitted {
    context: AssembledContext,
    /// The window less the safety margin, the answer's room and the tools' definitions.
    budget: u64,
    counter: TokenCounter,
}

impl Fitted {
    /// Tokens of the session's context beside the system prompt and `question` alone (what the
    /// first request holds of the task).
    fn context_tokens(&self, question: &str) -> Result<u64> {
        let reserved = system_prompt_tokens(self.counter, AGENT_SYSTEM)
            + chat_turn_tokens(self.counter, &ChatTurn::User(question.to_owned()));
        self.context
            .clone()
            .fit(self.budget, reserved, self.counter)
            .map(|c| c.tokens)
            .map_err(|e| {
                EvalError::Invalid(format!(
                    "the window cannot hold the context lcm assembled beside the question: {e}; \
                     raise --window or lower --budget"
                ))
            })
    }
}

#[async_trait]
impl ConversationWindow for Fitted {
    async fn view(&self, turns: &[ChatTurn]) -> std::result::Result<Vec<ChatTurn>, String> {
        let (system, own) = match turns.split_first() {
            Some((ChatTurn::System(system), rest)) => (Some(system), rest),
            _ => (None, turns),
        };
        let reserved = system.map_or(0, |s| system_prompt_tokens(self.counter, s))
            + own
                .iter()
                .map(|t| chat_turn_tokens(self.counter, t))
                .sum::<u64>();
        let context = self
            .context
            .clone()
            .fit(self.budget, reserved, self.counter)
            .map_err(|e| format!("the agent's turns leave no room for the context: {e}"))?;
        let mut out = Vec::with_capacity(context.items.len() + turns.len());
        out.extend(system.cloned().map(ChatTurn::System));
        out.extend(context_turns(&context));
        out.extend(own.iter().cloned());
        Ok(out)
    }
}
