//! The redb tables and the layout of their keys.
//!
//! All numbers are the numbers behind typed ids (`msg_N` is `N`). Values are records encoded by
//! [`crate::codec`] unless said otherwise.
//!
//! | table | key | value | written |
//! | --- | --- | --- | --- |
//! | `meta` | name | u64 | counters (`next_message`, `next_session`, ...), `schema_version` ([`STORE_SCHEMA`]), `index_watermark` |
//! | `sessions` | session | `SessionRecord` | on create; counters on every append |
//! | `session_keys` | host key | session | on create |
//! | `messages` | first message of the row | one `MessageRecord` (everything but the original), or a pack of the records of consecutive messages (see `message_rows.rs`) | once, never changed |
//! | `originals` | message | raw bytes of the original payload, when the host gave one | once, never changed |
//! | `session_runs` | (session, first seq) | (first message, length): messages `first seq..+length` of the session are ids `first message..+length` | a run is extended while an append's ids continue it, else a new one starts (see `session_runs.rs`) |
//! | `source_keys` | (session, source key) | message | once (idempotent import) |
//!
//! | `summaries` | summary | `SummaryRecord` (kind, depth, content, tokens, range, file ids, level, model) | once |
//! | `summary_sources` | (summary, ordinal) | (node kind byte, number) of each source, in order | once |
//! | `covered_by` | (node kind byte, number) | the summary covering that node | once |
//! | `session_summaries` | (session, summary) | () | once |
//! | `summary_digests` | summary | `Digest`: the span's structure (requests, files, commands, open commitments and errors, what it resolved) | once, with the summary |
//! | `context` | session | `ContextState`: ordered top-level summaries + raw-from seq | replaced atomically with each summary |
//! | `map_jobs` | job | `JobRecord` (spec, status, item counts) | on create; counts on every item transition |
//! | `map_items` | (job, item index) | `ItemRecord` (line, payload, state with lease, attempts, last error) | on create; on every claim and commit |
//! | `map_pending` | (job, item index) | () | exactly the items in state Pending (what `claim` reads, so it never scans finished items) |
//! | `map_running` | (job, item index) | lease expiry, ms since the epoch | exactly the items in state Running |
//! | `files` | file | `FileInfo` (path, kind, sizes, content hash, where the content lives, exploration summary) | once (see `files.rs`) |
//! | `file_hashes` | SHA-256 of the content (of `path:` + the path, for a file part without content) | file | once: the same content is one record |
//! | `message_files` | message | `MessageFiles`: the message's file references, and its tokens as a context shows it | with the message, in its append |
//! | `file_messages` | (file, message) | () | every message that references a file |
//! | `context_marks` | (session, node kind byte, number) | (mark byte, ms since the epoch): a message the agent pinned, or a raw message or top-level summary it set aside (see `marks.rs`) | on `lcm_pin` / `lcm_forget`; removed on unpin / restore |
//! | `read_calls` | (session, tool call id) | path the call reads | with the call's message, so its result (later) links to the path |
//!
//! Messages are keyed by a global, append-ordered number so that "every message after the index
//! watermark" is one range scan; `session_runs` gives each session's ordered view.
//!
//! Schema versions of the store (the `schema_version` meta key; each record also starts with the
//! version of its own encoding: [`crate::record::RECORD_VERSION`] for messages,
//! [`crate::codec::SCHEMA_VERSION`] for the rest): 1 kept each session's list as
//! `session_messages`, one (session, seq) -> message row per message; 2 keeps it as runs; 3
//! writes a batch's messages as packs (several records in one `messages` row); 4 adds the file
//! tables; 5 adds `summary_digests`; 6 stores every message record in lcm's own layout
//! ([`crate::record`]) instead of bincode of the whole message. A writable open of an older
//! store migrates it in one transaction (session lists to runs, records to the current layout,
//! file records registered); a read-only open refuses it with
//! [`crate::StoreError::OlderSchema`], which says to open it writable once.

use redb::TableDefinition;

pub const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
pub const SESSIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("sessions");
pub const SESSION_KEYS: TableDefinition<&str, u64> = TableDefinition::new("session_keys");
pub const MESSAGES: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");
pub const ORIGINALS: TableDefinition<u64, &[u8]> = TableDefinition::new("originals");
/// (session, first seq) -> (first message, length): see `session_runs.rs`.
pub const SESSION_RUNS: TableDefinition<(u64, u64), (u64, u64)> =
    TableDefinition::new("session_runs");
pub const SOURCE_KEYS: TableDefinition<(u64, &str), u64> = TableDefinition::new("source_keys");
pub const SUMMARIES: TableDefinition<u64, &[u8]> = TableDefinition::new("summaries");
/// (summary, ordinal) -> source node as (kind byte, number): [`NODE_MESSAGE`] or [`NODE_SUMMARY`].
pub const SUMMARY_SOURCES: TableDefinition<(u64, u32), (u8, u64)> =
    TableDefinition::new("summary_sources");
/// Source node -> the summary that covers it (at most one: a message is covered by one leaf, a
/// summary by at most one condensed summary).
pub const COVERED_BY: TableDefinition<(u8, u64), u64> = TableDefinition::new("covered_by");
/// (session, summary) for every summary of a session, in creation order.
pub const SESSION_SUMMARIES: TableDefinition<(u64, u64), ()> =
    TableDefinition::new("session_summaries");
pub const SUMMARY_DIGESTS: TableDefinition<u64, &[u8]> = TableDefinition::new("summary_digests");
pub const CONTEXT: TableDefinition<u64, &[u8]> = TableDefinition::new("context");
/// File records (`file_N`), see `files.rs`.
pub const FILES: TableDefinition<u64, &[u8]> = TableDefinition::new("files");
/// Content hash -> file: one record per distinct content.
pub const FILE_HASHES: TableDefinition<&[u8], u64> = TableDefinition::new("file_hashes");
/// Message -> its file references (only messages that have some).
pub const MESSAGE_FILES: TableDefinition<u64, &[u8]> = TableDefinition::new("message_files");
/// (file, message) for every message referencing a file.
pub const FILE_MESSAGES: TableDefinition<(u64, u64), ()> = TableDefinition::new("file_messages");
/// (session, tool call id) -> the path a file-reading call reads.
pub const READ_CALLS: TableDefinition<(u64, &str), &str> = TableDefinition::new("read_calls");
/// (session, node kind byte, number) -> (mark byte, ms since the epoch): the agent's marks on
/// its context ([`lcm_core::summary::ContextMark`], see `marks.rs`).
pub const CONTEXT_MARKS: TableDefinition<MarkKey, MarkValue> =
    TableDefinition::new("context_marks");
/// A `context_marks` key: (session, node kind byte, number).
pub type MarkKey = (u64, u8, u64);
/// A `context_marks` value: (mark byte, ms since the epoch).
pub type MarkValue = (u8, i64);
/// Map jobs (`llm_map` / `agentic_map`), see [`crate::map_jobs`].
pub const MAP_JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("map_jobs");
/// (job, item index) -> item record.
pub const MAP_ITEMS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("map_items");
/// (job, item index) of every pending item: the claim queue, in index order.
pub const MAP_PENDING: TableDefinition<(u64, u64), ()> = TableDefinition::new("map_pending");
/// (job, item index) -> lease expiry (ms since the epoch) of every running item.
pub const MAP_RUNNING: TableDefinition<(u64, u64), i64> = TableDefinition::new("map_running");

/// The layout version this build writes (the `schema_version` meta key): 6, session lists as
/// runs, messages in packs of records in lcm's own layout, file records, and summary digests.
pub const STORE_SCHEMA: u64 = 6;

/// Node kind byte in keys: messages 0, summaries 1.
pub const NODE_MESSAGE: u8 = 0;
pub const NODE_SUMMARY: u8 = 1;

/// Keys of the `meta` table.
pub mod meta {
    pub const SCHEMA_VERSION: &str = "schema_version";
    pub const NEXT_MESSAGE: &str = "next_message";
    pub const NEXT_SESSION: &str = "next_session";
    pub const NEXT_SUMMARY: &str = "next_summary";
    pub const NEXT_JOB: &str = "next_job";
    pub const NEXT_FILE: &str = "next_file";
    /// Every message with a number below this is in the search index.
    pub const INDEX_WATERMARK: &str = "index_watermark";
}
