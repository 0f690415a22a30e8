//! The baseline arm: the model alone. Each question is one chat call through the configured
//! provider, with as much of the task's session as fits the model's window: the newest turns,
//! counted with lcm's token counts, beside the instructions, the question and the room kept for
//! the answer. Whatever is older is cut, as a model without lcm would lose it.

use std::time::Instant;

use lcm_core::tokens::TokenCounter;
use lcm_engine::assembly::system_prompt_tokens;
use lcm_llm::{ChatProvider, ChatRequest, ChatTurn, StopReason};

use crate::model::{Cost, ModelAnswer, ModelRun, ModelSettings};
use crate::tasks::{Speaker, Task, Turn, turn_tokens};
use crate::{EvalError, Result};

/// The baseline's instructions to the model.
pub const BASELINE_SYSTEM: &str = "You answer a question about the conversation you are given. \
Reply with the answer only, in the form the question asks for, without explanation.";

/// The newest of `turns` whose tokens (lcm's count, overhead included) add up to at most
/// `room`: the index of the first turn kept, and the tokens kept.
pub fn newest_fitting(turns: &[Turn], room: u64, counter: TokenCounter) -> (usize, u64) {
    let mut first = turns.len();
    let mut tokens = 0;
    for (i, turn) in turns.iter().enumerate().rev() {
        let t = turn_tokens(counter, &turn.text);
        if tokens + t > room {
            break;
        }
        tokens += t;
        first = i;
    }
    (first, tokens)
}

/// Asks `task`'s questions (as many as `settings` says) of the model behind `chat`, one call
/// each, with the session truncated to `settings.window`. A provider failure (after its own
/// retries) ends the run with [`EvalError::Model`].
pub async fn run(
    task: &Task,
    chat: &dyn ChatProvider,
    settings: &ModelSettings,
    counter: TokenCounter,
) -> Result<ModelRun> {
    let started = Instant::now();
    let system_tokens = system_prompt_tokens(counter, BASELINE_SYSTEM);
    let mut answers = Vec::new();
    for question in settings.questions(task) {
        let fixed = system_tokens
            + turn_tokens(counter, &question.text)
            + u64::from(settings.max_output_tokens);
        let Some(room) = settings.window.checked_sub(fixed) else {
            return Err(EvalError::Invalid(format!(
                "a window of {} tokens cannot hold the instructions, the question and {} tokens \
                 of answer ({fixed} tokens): raise --window",
                settings.window, settings.max_output_tokens
            )));
        };
        let (first, context_tokens) = newest_fitting(&task.turns, room, counter);
        let mut turns: Vec<ChatTurn> = task.turns[first..]
            .iter()
            .map(|turn| match turn.speaker {
                Speaker::User => ChatTurn::User(turn.text.clone()),
                Speaker::Assistant => ChatTurn::assistant_text(turn.text.clone()),
            })
            .collect();
        turns.push(ChatTurn::User(question.text.clone()));
        let request = ChatRequest::new(
            Some(BASELINE_SYSTEM.to_owned()),
            turns,
            Vec::new(),
            settings.max_output_tokens,
        );
        let response = tokio::time::timeout(settings.question_timeout, chat.chat(&request))
            .await
            .map_err(|_| {
                EvalError::Model(format!(
                    "no answer within {} s",
                    settings.question_timeout.as_secs()
                ))
            })?
            .map_err(|e| EvalError::Model(e.to_string()))?;
        let stop = match &response.stop {
            StopReason::EndTurn => "end_turn".to_owned(),
            StopReason::MaxTokens => "max_tokens".to_owned(),
            StopReason::ToolUse => "tool_use".to_owned(),
            StopReason::Other(other) => other.clone(),
        };
        answers.push(ModelAnswer::scored(
            question,
            response.text.unwrap_or_default(),
            Cost {
                calls: 1,
                tool_calls: 0,
                tokens: response.usage.total(),
                context_tokens,
            },
            stop,
        ));
    }
    Ok(ModelRun::new(answers, started.elapsed().as_millis() as u64))
}
