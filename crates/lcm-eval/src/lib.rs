//! # lcm-eval
//!
//! Evaluations of lcm, run by `lcm eval`.
//! - [`locomo`]: the LoCoMo format (long conversations between two speakers, questions with
//!   the dialogue turns that hold their answers), read into lcm messages.
//! - [`recall`]: recall of those evidence turns by each search mode (`lcm eval recall`):
//!   recall@1/5/10 and MRR, overall and per question category.
//! - [`tasks`]: procedurally generated tasks with exact answers (`lcm eval run`): aggregation
//!   over hidden TREC labels, needles after compaction; [`trec`] reads the TREC set and
//!   `lcm_core::rng` is the generators' deterministic random source.
//! - The arms that answer them: [`scripted`] (no model: lcm's tools and a fixed policy),
//!   [`baseline`] (the model alone, its input truncated to its window) and [`agent`] (the model
//!   as an lcm agent), with what the model arms share in [`model`]; [`stored`] stores and
//!   compacts a task's session; [`runner`] runs a plan of families, lengths and arms;
//!   [`report`]: results as JSON, a Markdown table and an SVG plot.
//!
//! Architecture invariant: an evaluation imports its data into a data directory of its own
//! and searches it through the same `lcm-search` entry point the tools use, so what it
//! measures is what an agent gets.

pub mod agent;
pub mod baseline;
pub mod locomo;
pub mod model;
pub mod recall;
pub mod report;
pub mod runner;
pub mod scripted;
pub mod stored;
pub mod tasks;
pub mod trec;

/// What can go wrong in an evaluation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// The input file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The input is not in the expected format; `at` says where.
    #[error("{origin}: {at}: {detail}")]
    Format {
        origin: String,
        at: String,
        detail: String,
    },
    /// The store or the index failed.
    #[error(transparent)]
    Store(#[from] lcm_store::StoreError),
    /// Compaction of a task's session failed.
    #[error("compaction failed: {0}")]
    Compaction(String),
    /// A tool call of the scripted arm failed.
    #[error("a tool call failed: {0}")]
    Tool(String),
    /// The model failed (after the provider's own retries), or did not answer in time.
    #[error("the model failed: {0}")]
    Model(String),
    /// The runtime of the lcm arm failed to start, answer or stop.
    #[error("the lcm runtime failed: {0}")]
    Runtime(String),
    /// The evaluation asked for cannot run as given; the message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// A report could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// The result type of this crate.
pub type Result<T> = std::result::Result<T, EvalError>;
