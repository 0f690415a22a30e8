//! The summariser interface and the three-level escalation that makes summarisation converge.
//!
//! # Escalation (LCM paper, section 2.3)
//!
//! | level | strategy | temperature | target |
//! | --- | --- | --- | --- |
//! | 1, [`EscalationLevel::Normal`] | narrative summary, details kept | 0.2 | T |
//! | 2, [`EscalationLevel::Aggressive`] | bullet points only | 0.1 | T / 2 |
//! | 3, [`EscalationLevel::Deterministic`] | head + tail truncation with a marker, no LLM | - | 512 |
//!
//! The first output with fewer tokens than the input is accepted. A level escalates when its
//! summariser fails (provider error, timeout, open circuit), returns no text (empty, or reasoning
//! only), or returns text that is not smaller than the input. Level 3 cannot fail and its output is
//! always smaller than the input, so [`summarize_with_escalation`] always returns a usable
//! summary after at most two summariser calls.

use std::sync::Arc;

use async_trait::async_trait;
use lcm_core::digest::Digest;
use lcm_core::tokens::TokenCounter;
use serde::{Deserialize, Serialize};

use crate::prompts::build_prompt;
use crate::provider::{ChatMessage, Completion, CompletionRequest, Provider, ProviderError};
use crate::truncate::{TRUNCATION_BUDGET_TOKENS, truncate_middle};

/// Temperature of the normal level.
pub const NORMAL_TEMPERATURE: f32 = 0.2;
/// Temperature of the aggressive level.
pub const AGGRESSIVE_TEMPERATURE: f32 = 0.1;
/// The model label of level-3 outcomes.
pub const DETERMINISTIC_MODEL: &str = "deterministic";

/// Which escalation level produced a summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum EscalationLevel {
    /// Level 1: a narrative summary of about the target length.
    Normal = 1,
    /// Level 2: bullet points in half the target length.
    Aggressive = 2,
    /// Level 3: deterministic truncation, no model.
    Deterministic = 3,
}

impl EscalationLevel {
    /// The level's number: 1, 2 or 3.
    pub fn number(self) -> u8 {
        self as u8
    }
}

/// What to summarise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryRequest {
    /// The text to summarise, already stripped of reasoning and binary content by the caller.
    pub content: String,
    /// What the summarised items cost in context now. The summary must cost less than both this
    /// and the content's own token count; 0 means "count the content".
    pub input_tokens: u32,
    /// The size wanted for a normal (level 1) summary.
    pub target_tokens: u32,
    /// The depth of the summary in the DAG: 0 = leaf over messages, 1, 2 and more over summaries.
    pub depth: u32,
    /// The structure of the span, when the engine has it: what the structured summariser
    /// renders (others summarise `content`).
    pub digest: Option<Digest>,
}

/// The summary and how it was obtained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryOutcome {
    /// The summary text (trimmed).
    pub text: String,
    /// Its tokens, counted with the counter given to [`summarize_with_escalation`].
    pub tokens: u32,
    /// The level whose output was accepted.
    pub level: EscalationLevel,
    /// The summariser's model label, or [`DETERMINISTIC_MODEL`] at level 3.
    pub model: String,
    /// How many times the summariser was called (0 to 2; level 3 calls none).
    pub calls: u32,
    /// Why each rejected level was rejected, in order (`level 1: ...`).
    pub errors: Vec<String>,
}

/// One summariser invocation, as the escalation asks for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SummaryCall<'a> {
    /// The text to summarise.
    pub content: &'a str,
    /// The DAG depth (selects the prompt).
    pub depth: u32,
    /// [`EscalationLevel::Normal`] or [`EscalationLevel::Aggressive`].
    pub level: EscalationLevel,
    /// The size wanted, in tokens (already halved at the aggressive level).
    pub target_tokens: u32,
    /// The sampling temperature for this level.
    pub temperature: f32,
    /// The span's structure, when known (see [`SummaryRequest::digest`]).
    pub digest: Option<&'a Digest>,
}

/// Something that shortens text: an LLM behind a [`Provider`], or a deterministic algorithm.
///
/// A summariser does one attempt per call and does not judge its own output: the escalation
/// decides whether the result is acceptable.
#[async_trait]
pub trait Summarizer: Send + Sync {
    /// The label recorded with the summaries it makes (a model name, or `extractive`).
    fn model(&self) -> &str;

    /// Summarises `call.content`. The answer's `text` is the summary; `reasoning` is reported so
    /// that a reasoning-only answer can be recognised.
    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError>;
}

/// A summariser that asks a model through a [`Provider`], with the prompts of
/// [`crate::prompts`].
#[derive(Clone)]
pub struct LlmSummarizer {
    provider: Arc<dyn Provider>,
    counter: TokenCounter,
    model: String,
}

impl std::fmt::Debug for LlmSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmSummarizer")
            .field("provider", &self.provider.name())
            .field("counter", &self.counter)
            .field("model", &self.model)
            .finish()
    }
}

impl LlmSummarizer {
    /// A summariser over `provider`, labelling its summaries `model`.
    pub fn new(
        provider: Arc<dyn Provider>,
        counter: TokenCounter,
        model: impl Into<String>,
    ) -> Self {
        LlmSummarizer {
            provider,
            counter,
            model: model.into(),
        }
    }

    /// The generation limit sent for a target: one and a half times the target (a summary a
    /// little over target is still useful), at least 32.
    pub fn max_tokens_for(target_tokens: u32) -> u32 {
        target_tokens.saturating_add(target_tokens / 2).max(32)
    }
}

#[async_trait]
impl Summarizer for LlmSummarizer {
    fn model(&self) -> &str {
        &self.model
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        let prompt = build_prompt(call.depth, call.level, call.target_tokens, call.content);
        tracing::debug!(
            provider = self.provider.name(),
            level = call.level.number(),
            depth = call.depth,
            target_tokens = call.target_tokens,
            prompt_tokens = self.counter.count_text(&prompt.user),
            "summarising"
        );
        let request = CompletionRequest {
            system: Some(prompt.system),
            messages: vec![ChatMessage::user(prompt.user)],
            temperature: call.temperature,
            max_tokens: Self::max_tokens_for(call.target_tokens),
            model: None,
            response_schema: None,
        };
        self.provider.complete(&request).await
    }
}

fn count(counter: &TokenCounter, text: &str) -> u32 {
    u32::try_from(counter.count_text(text)).unwrap_or(u32::MAX)
}

/// Summarises `request` with the three-level escalation (see the module documentation).
///
/// Never fails and never loops: at most two summariser calls, then deterministic truncation to
/// 512 tokens (to half the input when the input is under 1,024 tokens, so that the result is
/// always smaller). The accepted text always has fewer tokens than the input, except for empty
/// content, which gives an empty level-3 summary.
pub async fn summarize_with_escalation(
    summarizer: &dyn Summarizer,
    counter: TokenCounter,
    request: &SummaryRequest,
) -> SummaryOutcome {
    let content_tokens = count(&counter, &request.content);
    let input = match request.input_tokens {
        0 => content_tokens,
        given => given.min(content_tokens),
    };
    let mut errors = Vec::new();
    let mut calls = 0;
    if input == 0 {
        errors.push("empty content: nothing to summarise".to_owned());
    } else {
        let target = request.target_tokens.max(1);
        let levels = [
            (EscalationLevel::Normal, target, NORMAL_TEMPERATURE),
            (
                EscalationLevel::Aggressive,
                (target / 2).max(1),
                AGGRESSIVE_TEMPERATURE,
            ),
        ];
        for (level, target_tokens, temperature) in levels {
            let call = SummaryCall {
                content: &request.content,
                depth: request.depth,
                level,
                target_tokens,
                temperature,
                digest: request.digest.as_ref(),
            };
            calls += 1;
            let rejection = match summarizer.summarize(&call).await {
                Err(error) => format!("provider error: {error}"),
                Ok(completion) => {
                    let text = completion.text.trim();
                    if text.is_empty() {
                        if completion.is_reasoning_only() {
                            "reasoning only, no summary text".to_owned()
                        } else {
                            "empty output".to_owned()
                        }
                    } else {
                        let tokens = count(&counter, text);
                        if tokens < input {
                            return SummaryOutcome {
                                text: text.to_owned(),
                                tokens,
                                level,
                                model: summarizer.model().to_owned(),
                                calls,
                                errors,
                            };
                        }
                        format!(
                            "output of {tokens} tokens is not smaller than the input of {input}"
                        )
                    }
                }
            };
            tracing::info!(
                level = level.number(),
                model = summarizer.model(),
                reason = %rejection,
                "summary rejected; escalating"
            );
            errors.push(format!("level {}: {rejection}", level.number()));
        }
    }
    let budget = TRUNCATION_BUDGET_TOKENS.min(input / 2);
    let text = truncate_middle(&counter, &request.content, budget);
    SummaryOutcome {
        tokens: count(&counter, &text),
        text,
        level: EscalationLevel::Deterministic,
        model: DETERMINISTIC_MODEL.to_owned(),
        calls,
        errors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_numbered() {
        assert_eq!(EscalationLevel::Normal.number(), 1);
        assert_eq!(EscalationLevel::Aggressive.number(), 2);
        assert_eq!(EscalationLevel::Deterministic.number(), 3);
    }

    #[test]
    fn max_tokens() {
        assert_eq!(LlmSummarizer::max_tokens_for(1200), 1800);
        assert_eq!(LlmSummarizer::max_tokens_for(4), 32);
    }

    #[test]
    fn summarizer_is_object_safe() {
        fn assert_send_sync<T: Send + Sync + ?Sized>() {}
        assert_send_sync::<dyn Summarizer>();
        assert_send_sync::<LlmSummarizer>();
    }
}
