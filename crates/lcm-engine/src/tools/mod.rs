//! The tool registry and the retrieval tools (placeholder).
