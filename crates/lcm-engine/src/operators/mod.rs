//! The map operators (placeholder).
