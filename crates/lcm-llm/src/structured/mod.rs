//! The structured offline summariser: summaries built from what the messages *are*.
//!
//! A coding agent's transcript is mostly tool traffic. Scoring its sentences (the extractive
//! summariser) keeps file paths, numbered source lines and log lines, and loses the user's
//! request, what was decided and what failed. This summariser renders the span's [`Digest`](lcm_core::digest::Digest)
//! instead, in sections: the user's requests in their own words, unresolved errors, files
//! edited / written / read (with their `file_N` records), commands with their outcome line
//! (exit status, test counts, the first error line), decisions and findings, other tools.
//! Condensed summaries render the merged digest of their children (commands grouped, files in
//! their latest state, errors resolved later gone), so depth adds abstraction.
//!
//! Spans without agent work (a conversation: no commands, files or tools) fall back to the
//! extractive summariser over the text, as do calls without a digest. Deterministic, within the
//! escalation's token targets.
//!
//! - [`extract`](mod@extract): messages to a digest, with the open items (commitments, errors) it carries
//!   and resolves;
//! - [`commitments`](mod@commitments): intent detection and what fulfils or drops a commitment;
//! - [`commands`](mod@commands): command labels, keys and outcome lines;
//! - [`render`](mod@render): a digest to text within a target.

pub mod commands;
pub mod commitments;
pub mod extract;
pub mod render;
pub(crate) mod text;

use async_trait::async_trait;
use lcm_core::tokens::TokenCounter;

use crate::extractive::ExtractiveSummarizer;
use crate::provider::{Completion, ProviderError};
use crate::summarize::{Summarizer, SummaryCall};

pub use extract::{extract, is_user_words, resolutions};
pub use render::{commitments_section, render};

/// The model label of structured summaries.
pub const STRUCTURED_MODEL: &str = "structured";

/// The structured offline summariser (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct StructuredSummarizer {
    counter: TokenCounter,
    extractive: ExtractiveSummarizer,
}

impl StructuredSummarizer {
    /// A summariser counting tokens with `counter`.
    pub fn new(counter: TokenCounter) -> Self {
        StructuredSummarizer {
            counter,
            extractive: ExtractiveSummarizer::new(counter),
        }
    }

    /// The summary of one call: the digest rendered when the span was agent work, else the
    /// extractive summary of the text.
    pub fn summarize_call(&self, call: &SummaryCall<'_>) -> String {
        if let Some(digest) = call.digest.filter(|d| d.is_agent_work()) {
            let text = render(digest, call.depth, call.target_tokens, &self.counter);
            if !text.is_empty() {
                return text;
            }
        }
        self.extractive
            .summarize_text(call.content, call.target_tokens)
    }
}

#[async_trait]
impl Summarizer for StructuredSummarizer {
    fn model(&self) -> &str {
        STRUCTURED_MODEL
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        Ok(Completion {
            text: self.summarize_call(call),
            ..Completion::default()
        })
    }

    fn is_offline(&self) -> bool {
        true
    }
}
