//! Integrity check of the store (placeholder; filled by the integrity work).
