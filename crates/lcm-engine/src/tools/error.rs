//! [`ToolError`]: what a tool call can fail with, worded for the model that made the call.

use lcm_store::StoreError;
use serde_json::{Value, json};

/// Why a tool call (or a registration) failed.
///
/// The agent loop sends [`Display`](std::fmt::Display) of this error back to the model as the
/// tool's result, so every message says what was wrong and what to do instead.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// No tool of that name is registered.
    #[error("there is no tool named `{name}`; the available tools are: {}", available.join(", "))]
    UnknownTool {
        name: String,
        available: Vec<String>,
    },
    /// The arguments do not match the tool's JSON Schema (each error names its JSON pointer).
    #[error("{}", invalid_arguments_message(tool, errors))]
    InvalidArguments { tool: String, errors: Vec<String> },
    /// The arguments are well-formed but the request cannot be answered as asked (a bad regex,
    /// a cursor from another search, contradictory options).
    #[error("{tool}: {message}")]
    InvalidRequest { tool: String, message: String },
    /// An id the call names does not exist.
    #[error("{tool}: {message}")]
    NotFound {
        tool: String,
        id: String,
        message: String,
    },
    /// The caller may not use this tool (e.g. `lcm_expand` from the main agent).
    #[error("{tool} is not available to you: {reason}")]
    NotPermitted { tool: String, reason: String },
    /// The request is valid but this build cannot answer it yet.
    #[error("{tool}: {message}")]
    Unsupported { tool: String, message: String },
    /// Registration: a tool with this name is already registered.
    #[error("a tool named `{name}` is already registered; tool names must be unique")]
    DuplicateTool { name: String },
    /// Registration: the tool's definition is unusable (bad name, schema that does not compile).
    #[error("tool `{name}` has an invalid definition: {reason}")]
    InvalidDefinition { name: String, reason: String },
    /// The tool failed for a reason outside the caller's control (storage, a crashed task).
    #[error("{tool} failed: {message}")]
    Failed { tool: String, message: String },
}

fn invalid_arguments_message(tool: &str, errors: &[String]) -> String {
    let mut out = format!("invalid arguments for {tool}:");
    for e in errors {
        out.push_str("\n  - ");
        out.push_str(e);
    }
    out.push_str("\nCorrect the arguments to match the tool's parameter schema and call it again.");
    out
}

impl ToolError {
    /// A short machine-readable name of the variant (`invalid_arguments`, `not_found`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            ToolError::UnknownTool { .. } => "unknown_tool",
            ToolError::InvalidArguments { .. } => "invalid_arguments",
            ToolError::InvalidRequest { .. } => "invalid_request",
            ToolError::NotFound { .. } => "not_found",
            ToolError::NotPermitted { .. } => "not_permitted",
            ToolError::Unsupported { .. } => "unsupported",
            ToolError::DuplicateTool { .. } => "duplicate_tool",
            ToolError::InvalidDefinition { .. } => "invalid_definition",
            ToolError::Failed { .. } => "failed",
        }
    }

    /// `{"error": kind, "message": text}`: a tool result a host can send back as is.
    pub fn to_json(&self) -> Value {
        json!({ "error": self.kind(), "message": self.to_string() })
    }

    /// A failure of `tool` for a reason outside the caller's control (for host tools too).
    pub fn failed(tool: impl Into<String>, error: impl std::fmt::Display) -> Self {
        ToolError::Failed {
            tool: tool.into(),
            message: error.to_string(),
        }
    }

    /// An [`InvalidArguments`](ToolError::InvalidArguments) with one error.
    pub fn invalid_argument(tool: impl Into<String>, error: impl Into<String>) -> Self {
        ToolError::InvalidArguments {
            tool: tool.into(),
            errors: vec![error.into()],
        }
    }

    /// Maps a store error to the tool error the model should see.
    pub fn from_store(tool: &str, error: StoreError) -> Self {
        let tool = tool.to_owned();
        let not_found = |id: String, error: &StoreError| ToolError::NotFound {
            tool: tool.clone(),
            id,
            message: format!(
                "{error}; use ids exactly as they appear in your context or in lcm_grep results"
            ),
        };
        match &error {
            StoreError::MessageNotFound(id) => not_found(id.to_string(), &error),
            StoreError::SummaryNotFound(id) => not_found(id.to_string(), &error),
            StoreError::SessionNotFound(id) => not_found(id.to_string(), &error),
            StoreError::FileNotFound(id) => not_found(id.to_string(), &error),
            StoreError::SessionKeyNotFound(key) => not_found(key.clone(), &error),
            StoreError::InvalidQuery(_) | StoreError::InvalidCursor(_) | StoreError::Refused(_) => {
                ToolError::InvalidRequest {
                    tool,
                    message: error.to_string(),
                }
            }
            _ => ToolError::Failed {
                tool,
                message: error.to_string(),
            },
        }
    }
}
