//! # lcm-llm
//!
//! Model providers and summarisers.
//!
//! - [`provider`]: the chat-completion abstraction ([`Provider`], [`CompletionRequest`],
//!   [`Completion`], [`ProviderError`]) used by the summarisers and, later, by sub-agents and
//!   `llm_map`.
//! - [`openai`] and [`anthropic`]: clients for the OpenAI Chat Completions and Anthropic Messages
//!   shapes, over one shared HTTP layer ([`http`]) with per-call timeouts, retries with
//!   exponential backoff and full jitter (honouring `Retry-After`) and a circuit breaker.
//! - [`summarize`]: the [`Summarizer`] interface, the LLM-backed [`LlmSummarizer`] and
//!   [`summarize_with_escalation`], the three-level escalation of the LCM paper (normal narrative,
//!   aggressive bullet points, deterministic truncation) that always converges.
//! - [`chat`]: chat with tools ([`ChatProvider`], [`ChatRequest`], [`ChatTurn`], [`ToolSpec`],
//!   [`ToolCall`], [`ChatResponse`]), implemented by both providers over the same HTTP layer;
//!   what sub-agents run on.
//! - [`extractive`]: [`ExtractiveSummarizer`], a deterministic summariser with no network and no
//!   key, which keeps the most informative sentences in their original order.
//! - [`structured`]: [`StructuredSummarizer`], the default offline summariser: it renders the
//!   span's digest (requests, errors, files, commands with outcomes, decisions) and tracks
//!   commitments; spans without agent work fall back to the extractive one.
//! - [`prompts`]: the summarisation prompts, one per DAG depth.
//! - `testing` (feature `test-server`): a scripted loopback HTTP server speaking both API shapes.
//!
//! Architecture invariant: this crate knows nothing of the store, the DAG or compaction policy.
//! It turns text into shorter text (or a prompt into a completion) and reports what happened; the
//! engine decides what to summarise and records the result.

#![warn(missing_docs)]

pub mod anthropic;
pub mod chat;
pub mod extractive;
pub mod from_config;
pub mod http;
pub mod openai;
pub mod prompts;
pub mod provider;
pub mod structured;
pub mod summarize;
#[cfg(feature = "test-server")]
pub mod testing;
mod truncate;

pub use anthropic::AnthropicProvider;
pub use chat::{
    ChatProvider, ChatRequest, ChatResponse, ChatTurn, StopReason, ToolArgumentsError, ToolCall,
    ToolSpec, Usage,
};
pub use extractive::ExtractiveSummarizer;
pub use from_config::summarizer_from_config;
pub use http::HttpConfig;
pub use openai::OpenAiProvider;
pub use provider::{ChatMessage, ChatRole, Completion, CompletionRequest, Provider, ProviderError};
pub use structured::StructuredSummarizer;
pub use summarize::{
    EscalationLevel, LlmSummarizer, Summarizer, SummaryCall, SummaryOutcome, SummaryRequest,
    summarize_with_escalation, summary_defect,
};
pub use truncate::{TRUNCATION_BUDGET_TOKENS, truncate_middle};
