//! What the two model arms share: their settings, what they record per question and per task,
//! and how lcm counts the tokens of a chat turn.

use std::time::Duration;

use lcm_core::tokens::{MESSAGE_OVERHEAD_TOKENS, TokenCounter};
use lcm_llm::ChatTurn;
use serde::Serialize;

use crate::tasks::{Question, Task};

/// How a model arm runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSettings {
    /// The context window the model is given, in tokens as lcm counts them (o200k_base, the
    /// per-message overhead included): what one request may hold, the answer's room included.
    pub window: u64,
    /// Most tokens the model may generate per call (kept free in the window).
    pub max_output_tokens: u32,
    /// Questions asked per task (the first ones), or every question.
    pub questions: Option<usize>,
    /// Most model turns per question (the lcm arm; the baseline makes one call).
    pub max_turns: u32,
    /// Time allowed per question, model calls and tools included.
    pub question_timeout: Duration,
}

impl Default for ModelSettings {
    /// A 32K window, 256 output tokens, every question, 8 turns, 10 minutes a question.
    fn default() -> Self {
        ModelSettings {
            window: 32 << 10,
            max_output_tokens: 256,
            questions: None,
            max_turns: 8,
            question_timeout: Duration::from_secs(600),
        }
    }
}

impl ModelSettings {
    /// The questions of `task` these settings ask.
    pub fn questions<'t>(&self, task: &'t Task) -> &'t [Question] {
        let n = self
            .questions
            .unwrap_or(task.questions.len())
            .min(task.questions.len());
        &task.questions[..n]
    }
}

/// One question answered by a model arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelAnswer {
    /// The question's kind (`count`, `single_fact`, ...).
    pub kind: String,
    pub question: String,
    pub expected: String,
    /// The model's final text (empty when it gave none).
    pub given: String,
    pub score: f64,
    /// Model calls made for this question.
    pub calls: u64,
    /// Tool calls the model made (the lcm arm).
    pub tool_calls: u64,
    /// Tokens the provider reported (input + output, over every call).
    pub tokens: u64,
    /// Tokens of the task's session in the first request, as lcm counts them.
    pub context_tokens: u64,
    /// Why the model stopped (`final_answer`, `step_limit`, ...).
    pub stop: String,
}

/// What answering one question cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    /// Model calls.
    pub calls: u64,
    /// Tool calls the model made.
    pub tool_calls: u64,
    /// Tokens the provider reported (input + output, over every call).
    pub tokens: u64,
    /// Tokens of the task's session in the first request, as lcm counts them.
    pub context_tokens: u64,
}

impl ModelAnswer {
    /// `given` as the answer to `question`, scored by the question's scorer.
    pub fn scored(question: &Question, given: String, cost: Cost, stop: String) -> ModelAnswer {
        ModelAnswer {
            kind: question.kind.clone(),
            question: question.text.clone(),
            expected: question.answer.text(),
            score: question.answer.score(&given),
            given,
            calls: cost.calls,
            tool_calls: cost.tool_calls,
            tokens: cost.tokens,
            context_tokens: cost.context_tokens,
            stop,
        }
    }
}

/// One task run by a model arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRun {
    /// Mean score over the questions asked.
    pub score: f64,
    pub answers: Vec<ModelAnswer>,
    /// Model calls, over every question.
    pub calls: u64,
    /// Tokens the provider reported, over every question.
    pub tokens: u64,
    pub wall_ms: u64,
}

impl ModelRun {
    /// The run of `answers`, which took `wall_ms`.
    pub fn new(answers: Vec<ModelAnswer>, wall_ms: u64) -> ModelRun {
        ModelRun {
            score: answers.iter().map(|a| a.score).sum::<f64>() / answers.len().max(1) as f64,
            calls: answers.iter().map(|a| a.calls).sum(),
            tokens: answers.iter().map(|a| a.tokens).sum(),
            answers,
            wall_ms,
        }
    }
}

/// Tokens of a chat turn as lcm counts a message: its text (for an assistant turn, its text and
/// each call's name and arguments) and the per-message overhead.
pub fn chat_turn_tokens(counter: TokenCounter, turn: &ChatTurn) -> u64 {
    let text = match turn {
        ChatTurn::System(text) | ChatTurn::User(text) => counter.count_text(text),
        ChatTurn::Assistant { text, tool_calls } => {
            text.as_deref().map_or(0, |t| counter.count_text(t))
                + tool_calls
                    .iter()
                    .map(|c| counter.count_text(&c.name) + counter.count_text(&c.arguments))
                    .sum::<usize>()
        }
        ChatTurn::ToolResult { content, .. } => counter.count_text(content),
    };
    text as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS)
}
