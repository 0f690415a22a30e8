//! # lcm-engine
//!
//! What turns the store into managed context:
//! - [`assembly`]: renders a session's context state (top-level summaries, then the raw tail)
//!   into provider-ready messages in the OpenAI Chat Completions or Anthropic Messages shape,
//!   deterministically, with tool calls and results always paired.
//!
//! - [`compaction`]: the control loop: soft/hard thresholds, fresh tail, leaf and condensed
//!   passes with three-level escalation, each applied atomically if its span is unchanged.
//!
//! - [`controller`]: the per-turn policy: nothing below the soft threshold, a background
//!   compaction between soft and hard, waiting above hard.
//!
//! - [`agent`]: the sub-agent loop: tool calls against a [`lcm_llm::ChatProvider`] under step,
//!   token and deadline limits, every turn handed to an observer for storage.
//!
//! - [`tools`]: the tool registry (schemas exported in the OpenAI or Anthropic shape, arguments
//!   validated before every call) and the retrieval tools `lcm_grep`, `lcm_describe`,
//!   `lcm_expand`.
//!
//! Next (see the issues): the supervised actors.
//!
//! Architecture invariant: the engine reaches storage only through `lcm-store`'s API.

pub mod agent;
pub mod assembly;
pub mod commitments;
pub mod compaction;
pub mod controller;
pub mod guard;
pub mod operators;
pub mod runtime;
pub mod tools;

pub use agent::{
    AgentLimits, AgentOutcome, AgentStop, AgentTools, ConversationWindow, run_agent,
    turn_to_message,
};
pub use assembly::{
    AssembledContext, BudgetError, ContextBreakdown, ContextItem, Tally, assemble, pinned_block,
    render_summary, shown_message,
};
pub use compaction::{CompactionReport, compact, effective_budget, needs_compaction};
pub use controller::ContextController;
pub use tools::{Caller, Tool, ToolContext, ToolDefinition, ToolError, ToolFormat, ToolRegistry};
