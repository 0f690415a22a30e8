//! The integration tests of lcm-llm, as modules of one test binary: one link instead of one
//! per file. A file's tests run alone with its module's name as the filter, e.g.
//! `cargo test -p lcm-llm --test it retries::`.

mod common;

mod anthropic;
mod circuit;
mod escalation;
mod extractive;
mod openai;
mod real_local_model;
mod retries;
mod tool_calling;
