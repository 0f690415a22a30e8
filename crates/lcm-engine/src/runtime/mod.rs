//! The supervised actor runtime (placeholder).
