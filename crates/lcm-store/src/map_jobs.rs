//! Database-backed map jobs (placeholder; filled by the operators work).
