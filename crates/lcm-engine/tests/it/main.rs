//! The integration tests of lcm-engine, as modules of one test binary: one link instead of one
//! per file. A file's tests run alone with its module's name as the filter, e.g.
//! `cargo test -p lcm-engine --test it summary_quality::`.
//!
//! The data files stay in `tests/data/` (read through `CARGO_MANIFEST_DIR`).

mod common;

mod agent_loop;
mod assembly;
mod budget;
mod commitments;
mod commitments_labelled;
mod compaction;
mod context_marks;
mod controller;
mod file_records;
mod file_tools;
mod files_real_sessions;
mod llm_map;
mod runtime;
mod summary_quality;
mod tools;
mod tools_real_sessions;
