//! # lcm-store
//!
//! The ground truth of lcm, on redb:
//! - [`store`]: sessions, messages and originals. Durable on return, append-only, atomic
//!   batches; each message one [`record`] in lcm's own layout.
//! - [`dag`]: the summary DAG and each session's context state, changed in one transaction.
//! - [`marks`]: the agent's marks on its context (pinned messages, forgotten items), each
//!   changed in one transaction that checks it.
//! - [`files`]: file records (large payloads and file reads), registered in the append that
//!   brings them.
//! - [`map_jobs`]: database-backed map jobs (`llm_map` / `agentic_map`): atomic claims with
//!   leases, exactly-once commits, resume after a crash.
//! - [`import`]: importing transcripts (Claude Code, OpenAI, lcm JSONL), idempotently.
//! - [`integrity`]: one checker per invariant between the tables (and, through
//!   [`integrity::DerivedIndex`], the search index's agreement with them), and the safe
//!   repairs of derived data.
//! - [`record_source`]: the record source, the seam the derived search (the `lcm-search`
//!   crate) reads the truth through and a second backend implements ([`RecordSource`],
//!   [`RecordReader`]).
//!
//! Architecture invariant: this crate knows nothing of actors, providers, compaction policy or
//! how search is done, and names no index engine (tantivy is `lcm-search`'s; an index failure
//! reaches callers as [`StoreError::Index`]). Nothing above it names redb (checked by the
//! facade's `layering` test): the engine, the daemon and the search read and write through the
//! API here, and the search reads messages only through [`RecordSource`], so a second backend
//! can replace redb without touching them.

mod coalesced_file;
pub mod codec;
pub mod dag;
#[doc(hidden)]
pub mod damage;
mod db;
#[doc(hidden)]
pub mod disk_faults;
pub mod error;
pub mod files;
pub mod import;
pub mod integrity;
pub mod map_jobs;
pub mod marks;
mod message_rows;
mod pipeline;
#[doc(hidden)]
pub mod power_loss;
pub mod record;
mod record_migration;
pub mod record_source;
mod session_runs;
pub mod store;
pub mod tables;

/// What the derived search (the `lcm-search` crate: index, grep) reads of the stored messages,
/// in one place: the [`record_source`] traits and the record layout ([`record::RecordView`])
/// their records are in.
pub mod records {
    pub use crate::record::RecordView;
    pub use crate::record_source::{InRow, RecordReader, RecordSource, Step};
}

pub use dag::ApplyOutcome;
pub use error::{Result, StoreError};
pub use files::FileRules;
pub use integrity::{IntegrityReport, Repair, RepairReport, Violation, ViolationKind};
pub use map_jobs::{
    ClaimedItem, CommitOutcome, FailureKind, ItemContent, ItemFailure, ItemInput, ItemOutcome,
    ItemReport, ItemState, JobStatus, MapItem, MapItems, MapJob, MapJobSpec, MapKind, MapProgress,
};
pub use marks::Pinned;
pub use record_source::{RecordReader, RecordSource};
pub use store::{Appended, PreparedAppend, Store, StoreOptions, StoreReader, StoreStats};
