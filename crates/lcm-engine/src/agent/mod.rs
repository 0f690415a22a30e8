//! The sub-agent loop (placeholder).
