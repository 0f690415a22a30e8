//! # lcm-store
//!
//! The ground truth of lcm and what is derived from it:
//! - [`store`]: the immutable store on redb (sessions, messages, originals). Durable on return,
//!   append-only, atomic batches.
//! - [`index`]: the search index (tantivy for BM25 words, trigram segments for regex), derived
//!   from the store, rebuildable from it, with a watermark.
//! - [`mod@grep`]: regex and full-text search over both, complete and exact.
//! - [`files`]: file records (large payloads and file reads), registered in the append that
//!   brings them.
//! - [`import`]: importing transcripts (Claude Code, OpenAI, lcm JSONL), idempotently.
//! - [`integrity`]: the check of every invariant between the tables (and the index), and the
//!   safe repairs of derived data.
//! - [`map_jobs`]: database-backed map jobs (`llm_map` / `agentic_map`): atomic claims with
//!   leases, exactly-once commits, resume after a crash.
//!
//! Architecture invariant: this crate knows nothing of actors, providers or compaction policy.
//! The engine talks to storage only through the API here, so a second backend can come later
//! without touching the engine.

mod coalesced_file;
pub mod codec;
mod cores;
pub mod dag;
pub mod data_dir;
mod db;
#[doc(hidden)]
pub mod disk_faults;
pub mod error;
pub mod files;
pub mod grep;
pub mod import;
pub mod index;
pub mod integrity;
pub mod map_jobs;
mod message_rows;
mod pipeline;
mod required;
mod session_runs;
mod start_classes;
pub mod store;
pub mod tables;
pub mod trigram;
mod trigram_index;
mod trigram_keys;
mod view;
pub mod word_tokens;

pub use dag::ApplyOutcome;
pub use data_dir::DataDir;
pub use error::{Result, StoreError};
pub use files::FileRules;
pub use grep::{GrepHit, GrepMode, GrepPage, GrepRequest, Scope, Strategy, grep};
pub use index::SearchIndex;
pub use integrity::{IntegrityReport, Repair, RepairReport, Violation, ViolationKind};
pub use map_jobs::{
    ClaimedItem, CommitOutcome, FailureKind, ItemContent, ItemFailure, ItemInput, ItemOutcome,
    ItemReport, ItemState, JobStatus, MapItem, MapItems, MapJob, MapJobSpec, MapKind, MapProgress,
};
pub use store::{Appended, PreparedAppend, Store, StoreOptions, StoreReader, StoreStats};
