//! The `agentic_map` item worker: each attempt runs a sub-agent (through a [`Delegator`]) with
//! the item, the job's prompt and the output schema, and validates its final answer like an
//! `llm_map` answer. Items are parallel work (sibling decomposition), so the scope-reduction
//! guard does not apply; nested maps inside an item must run over strictly smaller inputs.

use std::sync::Arc;

use async_trait::async_trait;
use lcm_llm::provider::ProviderError;

use super::llm_map::{ItemAttempt, ItemWorker, OutputValidator, check_answer};
use crate::tools::{Caller, DelegateKind, DelegateRequest, Delegator, ToolError};

/// Runs one sub-agent per attempt.
pub struct AgenticItemWorker {
    delegator: Arc<dyn Delegator>,
    /// Who started the job (its sub-agents are children of this caller's session).
    caller: Caller,
    prompt: String,
    validator: OutputValidator,
    read_only: bool,
    /// Size of the job's input in bytes: nested maps must be smaller.
    input_bytes: u64,
}

impl AgenticItemWorker {
    /// A worker for a job with this prompt and schema.
    pub fn new(
        delegator: Arc<dyn Delegator>,
        caller: Caller,
        prompt: String,
        validator: OutputValidator,
        read_only: bool,
        input_bytes: u64,
    ) -> Self {
        AgenticItemWorker {
            delegator,
            caller,
            prompt,
            validator,
            read_only,
            input_bytes,
        }
    }
}

#[async_trait]
impl ItemWorker for AgenticItemWorker {
    async fn attempt(&self, payload: &str, feedback: Option<&str>) -> ItemAttempt {
        let mut task = format!(
            "{}\n\nThe item (JSON):\n{payload}\n\nWhen you are done, reply with exactly one JSON value matching this JSON Schema, and nothing else:\n{}",
            self.prompt,
            self.validator.schema_text()
        );
        if let Some(error) = feedback {
            task.push_str(&format!(
                "\n\nYour previous answer for this item was rejected: {error}"
            ));
        }
        let request = DelegateRequest {
            kind: DelegateKind::Task,
            prompt: task,
            delegated_scope: None,
            kept_work: None,
            read_only: self.read_only,
            parallel: true,
            max_steps: None,
            map_input_limit: Some(self.input_bytes),
        };
        match self.delegator.delegate(&self.caller, request).await {
            Ok(outcome) => match outcome.answer {
                Some(answer) => match check_answer(&answer, &self.validator) {
                    Ok(value) => ItemAttempt::Valid(value),
                    Err(error) => ItemAttempt::Invalid { error },
                },
                None => ItemAttempt::Invalid {
                    error: format!("the item's agent gave no final answer ({})", outcome.stop),
                },
            },
            Err(ToolError::NotPermitted { reason, .. }) => {
                ItemAttempt::Provider(ProviderError::Rejected {
                    status: 403,
                    body: reason,
                })
            }
            Err(e) => ItemAttempt::Provider(ProviderError::BadResponse(format!(
                "the item's sub-agent failed: {e}"
            ))),
        }
    }
}
