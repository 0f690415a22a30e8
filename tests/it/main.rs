//! The integration tests of the `lcm` facade and binary, as modules of one test binary: one
//! link instead of one per file. A file's tests run alone with its module's name as the filter,
//! e.g. `cargo test -p lcm --test it import_huge_line::`.

mod common;

mod agentic_map;
mod bad_input;
mod cli;
mod compaction_crash;
mod config;
mod crash_campaign;
#[cfg(unix)]
mod daemon_cli;
mod delegation;
mod durability;
mod embed_server;
#[cfg(unix)]
mod explorer;
#[cfg(unix)]
mod follow;
#[cfg(unix)]
mod full_disk;
mod fuzz;
mod grep_property;
mod import_folders;
mod import_huge_line;
mod index_crash;
mod layering;
mod map_crash;
mod map_runtime;
mod mcp;
mod read_only;
mod real_transcripts;
mod runtime_concurrency;
mod semantic;
#[cfg(unix)]
mod serve;
mod supervision;
mod token_counts;
mod trec_local_model;
mod vacuum;
