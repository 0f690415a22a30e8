//! The tool registry and the retrieval tools the model calls (paper appendix C.1).
//!
//! - [`ToolRegistry`] holds the tools by name, exports their definitions in the OpenAI or
//!   Anthropic shape, and validates every call's arguments against the tool's JSON Schema
//!   (compiled once, at registration) before running it. Hosts register their own tools beside
//!   the built-in ones.
//! - [`LcmGrep`] (`lcm_grep`): regex or full-text search over the whole verbatim history, hits
//!   grouped by the summary that currently stands for them in the context, paginated and
//!   bounded in tokens.
//! - [`LcmDescribe`] (`lcm_describe`): what a summary, message or session id stands for,
//!   without expanding it.
//! - [`LcmExpand`] (`lcm_expand`): the content under summaries, down to the verbatim messages,
//!   in token-capped pages; sub-agents only.
//! - [`LcmReadFile`] (`lcm_read_file`): a file record's content by line range, as the session
//!   saw it (or from disk when unchanged); sub-agents only. `lcm_describe file_N` describes
//!   a record.
//! - [`LcmPin`] (`lcm_pin`) and [`LcmForget`] (`lcm_forget`): the main agent keeps a message
//!   in view verbatim past compaction, or sets an item of its context aside behind a pointer
//!   (one mark in the store each; nothing is deleted).
//!
//! The retrieval tools are read-only; `lcm_pin` and `lcm_forget` write only their mark. Store reads are blocking (redb), so each call runs them on
//! tokio's blocking pool. Errors are [`ToolError`]s whose text is written for the model.

mod context_marks;
mod delegation;
mod describe;
mod error;
mod expand;
mod file_records;
mod files;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod grep_tool;
mod map_tools;
mod registry;
mod util;

use std::sync::Arc;

pub use context_marks::{LcmForget, LcmPin};
pub use delegation::{
    DEFAULT_EXPAND_QUERY_TOKENS, DelegateKind, DelegateOutcome, DelegateRequest, Delegator,
    LcmExpandQuery, TaskTool, TasksTool, cited_ids,
};
pub use describe::{
    DEFAULT_DESCRIBE_MAX_TOKENS, DEFAULT_MANIFEST_LIMIT, LcmDescribe, MAX_MANIFEST_LIMIT,
};
pub use error::ToolError;
pub use expand::{DEFAULT_EXPAND_TOKEN_CAP, EXPAND_TOKEN_CAP_RANGE, LcmExpand};
pub use file_records::{DEFAULT_READ_LINES, DiskState, LcmReadFile, disk_state};
pub use files::{ListDir, ReadFile, WriteFile};
pub use grep_tool::{DEFAULT_GREP_MAX_TOKENS, GREP_MAX_TOKENS_RANGE, LcmGrep};
pub use map_tools::{AgenticMapTool, LlmMapTool};
pub use registry::{Caller, Tool, ToolContext, ToolDefinition, ToolFormat, ToolRegistry};

/// The built-in tools, in the order they are registered and listed.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(LcmGrep),
        Arc::new(LcmDescribe),
        Arc::new(LcmExpand),
        Arc::new(LcmReadFile),
        Arc::new(LcmExpandQuery),
        Arc::new(TaskTool),
        Arc::new(TasksTool),
        Arc::new(LcmPin),
        Arc::new(LcmForget),
    ]
}
