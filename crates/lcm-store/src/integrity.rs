//! Integrity check and safe repair of the store.
//!
//! [`check`] verifies every invariant the store keeps between its tables (see
//! [`crate::tables`]) in one redb read transaction, so it sees one consistent snapshot even while
//! appends and compactions continue:
//!
//! - **counters**: `next_message`, `next_session`, `next_summary` are past every stored id (a
//!   counter behind would make the next append overwrite a record);
//! - **sessions**: records decode, their key maps back to them in `session_keys`, their parent
//!   exists, and their counters (message count, token total, first and last message times) match
//!   their messages;
//! - **messages**: the runs of each session (`session_runs`) tile its sequence numbers 0, 1,
//!   2, ... without a gap or an overlap, each entry reaching an existing message of that session
//!   with that sequence number; every message below `next_message` exists and is reachable
//!   from its session; originals and source keys agree with the records;
//! - **summary DAG**: every summary is listed under its session, has sources (ordinals 0..n),
//!   the right kind of sources (messages for a leaf, summaries for a condensed summary), all of
//!   its own session, contiguous and in order; its derived fields (sequence range, time range,
//!   descendant messages and tokens, depth) equal what its sources give; every node is the source
//!   of at most one summary and `covered_by` is exactly the reverse of `summary_sources`;
//! - **context**: each session's context lists exactly its uncovered (top-level) summaries,
//!   of that session, in order, followed by the raw tail from `raw_from` = the last one's
//!   `last_seq + 1`, so that every message of the session is reached exactly once;
//! - **index** (when a [`SearchIndex`] is given): the redb copy of the watermark equals the
//!   watermark in the tantivy commit, which is at most the next message id, and the index holds
//!   exactly one document per message below it.
//!
//! The walk is per session (a session's messages and summaries are held in memory while it is
//! checked; the whole store never is) and otherwise streams tables in key order with point
//! lookups: O(n log n) overall. Tables keyed by something other than a session are reconciled by
//! counting: when every row was accounted for by the session walk (the usual case) they are not
//! scanned again; otherwise a second pass finds the stray rows.
//!
//! [`repair`] applies the **safe** repairs a report proposes, each in its own write transaction:
//! they rewrite only derived data (counters, session totals, a summary's derived fields, a
//! context state rebuilt from the DAG, the index and its watermark) and never a message, an
//! original or a summary's content. Violations without a safe repair say what a human should do.
//!
//! The index checks assume no catch-up runs at the same moment: if the index's watermark moves
//! while they run they are skipped (see [`IntegrityReport::skipped`]), but the index reader only
//! reloads at the end of a catch-up, so a check that falls between two batches of a long
//! catch-up can report a document count that is merely behind. Run it when the indexer is idle.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::ControlFlow;

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::summary::{ContextState, SummaryKind};
use lcm_core::time::Timestamp;
use redb::{ReadOnlyTable, ReadableTable, ReadableTableMetadata, WriteTransaction};
use serde::Serialize;

use crate::codec;
use crate::dag::SummaryRecord;
use crate::error::{Result, StoreError};
use crate::index::SearchIndex;
use crate::message_rows::{self, StoredRecord};
use crate::session_runs;
use crate::store::{SessionRecord, Store};
use crate::tables::{self, NODE_MESSAGE, NODE_SUMMARY, meta};
use crate::view::MessageRecordView;

/// At most this many violations are listed in a report; the rest are only counted
/// ([`IntegrityReport::omitted`]), so that a badly damaged store cannot exhaust memory.
pub const MAX_LISTED_VIOLATIONS: usize = 100_000;

// ------------------------------------------------------------------------------------ report

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IntegrityReport {
    /// How much was checked.
    pub checked: Counts,
    /// Every invariant found broken (at most [`MAX_LISTED_VIOLATIONS`]), in the order found.
    pub violations: Vec<Violation>,
    /// Violations found beyond [`MAX_LISTED_VIOLATIONS`] (not listed; repair what is listed and
    /// check again).
    pub omitted: u64,
    /// Checks that could not run, and why (for instance the index checks while the index was
    /// catching up).
    pub skipped: Vec<String>,
    /// How long the check took, in milliseconds.
    pub elapsed_ms: u64,
}

impl IntegrityReport {
    /// Whether no violation was found.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty() && self.omitted == 0
    }

    /// How many listed violations have a safe repair.
    pub fn repairable(&self) -> usize {
        self.violations
            .iter()
            .filter(|v| v.repair.is_some())
            .count()
    }
}

/// Sizes of what a check covered (rows of the store's tables).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Session records.
    pub sessions: u64,
    /// Message records.
    pub messages: u64,
    /// Stored originals.
    pub originals: u64,
    /// Summary records.
    pub summaries: u64,
    /// Source edges (`summary_sources` rows).
    pub source_edges: u64,
    /// Covered-by edges (`covered_by` rows).
    pub cover_edges: u64,
    /// Context states.
    pub contexts: u64,
    /// File records.
    pub files: u64,
    /// Documents in the search index, when an index was checked.
    pub index_documents: Option<u64>,
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub kind: ViolationKind,
    /// What it is about: an id (`msg_12`, `ses_3`, `sum_7`), `index`, or a meta key such as
    /// `meta.next_message`.
    pub subject: String,
    /// What is wrong, with the values found; for violations without a repair, also what a human
    /// should do.
    pub detail: String,
    /// The safe repair that fixes it, if there is one.
    pub repair: Option<Repair>,
}

/// The invariants [`check`] verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ViolationKind {
    /// A record that cannot be decoded (subject: its id). No repair.
    UndecodableRecord,
    /// A `meta` counter is not past the largest id of its table: the next insert would
    /// overwrite a record. Repair: [`Repair::RaiseCounter`].
    CounterBehind,
    /// A message id below `next_message` has no record (subject: the first missing id). No
    /// repair: messages are lost.
    MissingMessage,
    /// A message that its session's message list does not reach (its session does not exist,
    /// or its session's runs have another message or nothing at its place). No repair.
    OrphanMessage,
    /// A `session_runs` entry that points at a message of another session or sequence number,
    /// places two messages at one sequence number, is empty or reaches past the newest message,
    /// or belongs to a session that does not exist (subject: the session). No repair.
    SessionIndexMismatch,
    /// A session's sequence numbers do not run 0, 1, 2, ... without a gap. No repair.
    SessionSeqGap,
    /// A session record's counters (message count, token total, first and last message times)
    /// disagree with its messages. Repair: [`Repair::RecomputeSessionTotals`].
    SessionTotals,
    /// `session_keys` and the session records disagree. No repair.
    SessionKeyMismatch,
    /// A session names a parent session that does not exist. No repair.
    MissingParentSession,
    /// A message's `has_original` flag and the `originals` table disagree. No repair.
    OriginalMismatch,
    /// `source_keys` and the messages' source keys disagree (re-imports could store
    /// duplicates). No repair.
    SourceKeyMismatch,
    /// A summary that its session's summary list does not include. No repair.
    OrphanSummary,
    /// A `session_summaries` entry that points at a missing summary or at a summary of another
    /// session, or that belongs to a session that does not exist (subject: the session). No
    /// repair.
    SessionSummaryMismatch,
    /// A summary without sources. No repair.
    EmptySummary,
    /// A summary's source rows are malformed: ordinals not 0..n, an unknown node kind, or rows
    /// of a summary that does not exist. No repair.
    SourceRows,
    /// A source that does not exist (or is not in its session's lists). No repair.
    MissingSource,
    /// A source that belongs to another session. No repair.
    ForeignSource,
    /// A leaf with summary sources or a condensed summary with message sources. No repair.
    WrongSourceKind,
    /// Sources that are not contiguous and in order (a leaf's messages are not consecutive, or
    /// a condensed summary's children's ranges do not follow each other). No repair.
    NonContiguousSources,
    /// A summary's stored derived fields (sequence range, time range, descendant counts, depth)
    /// differ from what its sources give. Repair: [`Repair::RecomputeSummaryFields`].
    SummaryFields,
    /// A node that is the source of more than one summary (subject: the node). No repair.
    DoubleCover,
    /// A source edge without its `covered_by` back edge (subject: the node). No repair.
    CoverEdgeMissing,
    /// A `covered_by` entry that no source edge backs (subject: the node). No repair.
    CoverEdgeWrong,
    /// A context state that does not list exactly the session's top-level summaries in order
    /// followed by the raw tail. Repair: [`Repair::RebuildContext`] when the DAG itself is sound.
    ContextMismatch,
    /// The redb copy of the index watermark differs from the index's own (the tantivy commit
    /// payload). Repair: [`Repair::SetIndexWatermark`].
    WatermarkMismatch,
    /// The index watermark is past the next message id. Repair: [`Repair::Reindex`].
    WatermarkBeyondEnd,
    /// The index does not hold exactly one document per message below its watermark. Repair:
    /// [`Repair::Reindex`].
    IndexDocCount,
    /// The file tables disagree with each other or with the messages: a reference to a file
    /// record that does not exist, a record whose content message does not exist, a message
    /// reference without its reverse entry (or the other way), a hash pointing nowhere. No
    /// repair (the records are written with their messages; restore from a backup).
    FileRecords,
    /// A summary digest whose summary does not exist (subject: the summary id). No repair
    /// (digests are written with their summaries).
    OrphanDigest,
}

impl ViolationKind {
    /// The kind's name, as serialized (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            ViolationKind::UndecodableRecord => "undecodable_record",
            ViolationKind::CounterBehind => "counter_behind",
            ViolationKind::MissingMessage => "missing_message",
            ViolationKind::OrphanMessage => "orphan_message",
            ViolationKind::SessionIndexMismatch => "session_index_mismatch",
            ViolationKind::SessionSeqGap => "session_seq_gap",
            ViolationKind::SessionTotals => "session_totals",
            ViolationKind::SessionKeyMismatch => "session_key_mismatch",
            ViolationKind::MissingParentSession => "missing_parent_session",
            ViolationKind::OriginalMismatch => "original_mismatch",
            ViolationKind::SourceKeyMismatch => "source_key_mismatch",
            ViolationKind::OrphanSummary => "orphan_summary",
            ViolationKind::SessionSummaryMismatch => "session_summary_mismatch",
            ViolationKind::EmptySummary => "empty_summary",
            ViolationKind::SourceRows => "source_rows",
            ViolationKind::MissingSource => "missing_source",
            ViolationKind::ForeignSource => "foreign_source",
            ViolationKind::WrongSourceKind => "wrong_source_kind",
            ViolationKind::NonContiguousSources => "non_contiguous_sources",
            ViolationKind::SummaryFields => "summary_fields",
            ViolationKind::DoubleCover => "double_cover",
            ViolationKind::CoverEdgeMissing => "cover_edge_missing",
            ViolationKind::CoverEdgeWrong => "cover_edge_wrong",
            ViolationKind::ContextMismatch => "context_mismatch",
            ViolationKind::WatermarkMismatch => "watermark_mismatch",
            ViolationKind::WatermarkBeyondEnd => "watermark_beyond_end",
            ViolationKind::IndexDocCount => "index_doc_count",
            ViolationKind::FileRecords => "file_records",
            ViolationKind::OrphanDigest => "orphan_digest",
        }
    }
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `meta` counter that allocates ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Counter {
    /// `next_message` (message ids).
    NextMessage,
    /// `next_session` (session ids).
    NextSession,
    /// `next_summary` (summary ids).
    NextSummary,
    /// `next_file` (file record ids).
    NextFile,
}

impl Counter {
    /// The counter's key in the `meta` table.
    pub fn meta_key(self) -> &'static str {
        match self {
            Counter::NextMessage => meta::NEXT_MESSAGE,
            Counter::NextSession => meta::NEXT_SESSION,
            Counter::NextSummary => meta::NEXT_SUMMARY,
            Counter::NextFile => meta::NEXT_FILE,
        }
    }
}

/// A safe repair: it rewrites derived data only, never a message, an original or a summary's
/// content. Variants are declared (and [`repair`] applies them) in dependency order: summary
/// fields before the contexts built from them, the index last.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(tag = "repair", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Repair {
    /// Raise the counter past the largest id of its table.
    RaiseCounter {
        /// Which counter.
        counter: Counter,
    },
    /// Recompute the session record's message count, token total and first and last message
    /// times from its messages (only when every message of the session is present).
    RecomputeSessionTotals {
        /// The session.
        session: SessionId,
    },
    /// Recompute the summary's derived fields (sequence range, time range, descendant counts,
    /// depth) from its sources; its content, kind, token count and model stay as they are.
    RecomputeSummaryFields {
        /// The summary.
        summary: SummaryId,
    },
    /// Rebuild the session's context state from the DAG: its uncovered summaries ordered by
    /// sequence range, then the raw tail after the last one (only when those summaries cover
    /// the start of the session without gap or overlap, so no message becomes unreachable).
    RebuildContext {
        /// The session.
        session: SessionId,
    },
    /// Set the redb copy of the index watermark to the index's own (the value of the tantivy
    /// commit when an index is given to [`repair`], else `watermark`).
    SetIndexWatermark {
        /// The watermark the index had at check time.
        watermark: MessageId,
    },
    /// Rebuild the search index from the store (needs the index).
    Reindex,
}

impl fmt::Display for Repair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Repair::RaiseCounter { counter } => write!(f, "raise_counter {}", counter.meta_key()),
            Repair::RecomputeSessionTotals { session } => {
                write!(f, "recompute_session_totals {session}")
            }
            Repair::RecomputeSummaryFields { summary } => {
                write!(f, "recompute_summary_fields {summary}")
            }
            Repair::RebuildContext { session } => write!(f, "rebuild_context {session}"),
            Repair::SetIndexWatermark { watermark } => {
                write!(f, "set_index_watermark {}", watermark.0)
            }
            Repair::Reindex => f.write_str("reindex"),
        }
    }
}

/// What [`repair`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// Repairs written (each in its own transaction), with what changed.
    pub applied: Vec<RepairOutcome>,
    /// Repairs not applied, with why (nothing to change any more, needs the index, or the data
    /// it would derive from is itself broken).
    pub skipped: Vec<RepairOutcome>,
    /// Listed violations that have no safe repair.
    pub unrepairable: usize,
}

/// One repair and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairOutcome {
    /// The repair.
    pub repair: Repair,
    /// What it changed, or why it was skipped.
    pub detail: String,
}

// ------------------------------------------------------------------------------------ check

const NO_PARENT: u64 = u64::MAX;

/// What a human should do about damage lcm cannot repair safely.
const RESTORE: &str = "restore the store from a backup";
const RESTORE_KEYS: &str = "restore session_keys from a backup";

/// What derived fields a summary (or a message, as a one-message span) has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Derived {
    depth: u32,
    first_seq: u64,
    last_seq: u64,
    earliest: Timestamp,
    latest: Timestamp,
    messages: u64,
    tokens: u64,
}

impl Derived {
    fn message(seq: u64, at: Timestamp, tokens: u32) -> Derived {
        Derived {
            depth: 0,
            first_seq: seq,
            last_seq: seq,
            earliest: at,
            latest: at,
            messages: 1,
            tokens: u64::from(tokens),
        }
    }

    fn stored(r: &SummaryRecord) -> Derived {
        Derived {
            depth: r.depth,
            first_seq: r.first_seq,
            last_seq: r.last_seq,
            earliest: r.earliest_at,
            latest: r.latest_at,
            messages: r.descendant_messages,
            tokens: r.descendant_tokens,
        }
    }

    /// `field: stored X, sources give Y` for every field that differs.
    fn differences(stored: &Derived, computed: &Derived) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}: stored {a}, sources give {b}"));
            }
        };
        cmp(
            "depth",
            stored.depth.to_string(),
            computed.depth.to_string(),
        );
        cmp(
            "first_seq",
            stored.first_seq.to_string(),
            computed.first_seq.to_string(),
        );
        cmp(
            "last_seq",
            stored.last_seq.to_string(),
            computed.last_seq.to_string(),
        );
        cmp(
            "earliest_at",
            stored.earliest.to_string(),
            computed.earliest.to_string(),
        );
        cmp(
            "latest_at",
            stored.latest.to_string(),
            computed.latest.to_string(),
        );
        cmp(
            "descendant_messages",
            stored.messages.to_string(),
            computed.messages.to_string(),
        );
        cmp(
            "descendant_tokens",
            stored.tokens.to_string(),
            computed.tokens.to_string(),
        );
        out
    }
}

/// Aggregates sources, oldest first, the way `apply_summary` does, noting whether each source
/// starts right after the previous one.
#[derive(Debug, Default)]
struct Aggregate {
    total: Option<Derived>,
    contiguous: bool,
}

impl Aggregate {
    fn new() -> Self {
        Aggregate {
            total: None,
            contiguous: true,
        }
    }

    fn add(&mut self, part: Derived) {
        match &mut self.total {
            None => self.total = Some(part),
            Some(t) => {
                if t.last_seq.checked_add(1) != Some(part.first_seq) {
                    self.contiguous = false;
                }
                t.last_seq = part.last_seq;
                t.earliest = t.earliest.min(part.earliest);
                t.latest = t.latest.max(part.latest);
                t.messages += part.messages;
                t.tokens += part.tokens;
                t.depth = t.depth.max(part.depth);
            }
        }
    }

    /// The summary's derived fields: depth 0 for a leaf, one more than its deepest source for
    /// a condensed summary.
    fn finish(self, kind: SummaryKind) -> Option<Derived> {
        self.total.map(|mut t| {
            t.depth = match kind {
                SummaryKind::Leaf => 0,
                SummaryKind::Condensed => t.depth + 1,
            };
            t
        })
    }
}

/// The store's tables, opened read-only in one snapshot.
struct Tables {
    meta: ReadOnlyTable<&'static str, u64>,
    sessions: ReadOnlyTable<u64, &'static [u8]>,
    session_keys: ReadOnlyTable<&'static str, u64>,
    messages: ReadOnlyTable<u64, &'static [u8]>,
    originals: ReadOnlyTable<u64, &'static [u8]>,
    session_runs: ReadOnlyTable<(u64, u64), (u64, u64)>,
    source_keys: ReadOnlyTable<(u64, &'static str), u64>,
    summaries: ReadOnlyTable<u64, &'static [u8]>,
    summary_sources: ReadOnlyTable<(u64, u32), (u8, u64)>,
    covered_by: ReadOnlyTable<(u8, u64), u64>,
    session_summaries: ReadOnlyTable<(u64, u64), ()>,
    context: ReadOnlyTable<u64, &'static [u8]>,
}

/// Violations and the tallies that reconcile the non-session tables with the session walk.
#[derive(Default)]
struct Findings {
    violations: Vec<Violation>,
    omitted: u64,
    skipped: Vec<String>,
    /// `session_runs` rows read by the session walk.
    seen_session_runs: u64,
    /// Messages reached through their own (session, seq) entry.
    matched_messages: u64,
    /// Originals present for messages that say they have one.
    verified_originals: u64,
    /// Source keys that map back to their message.
    verified_source_keys: u64,
    /// `session_keys` rows that map back to their session.
    verified_session_keys: u64,
    /// `session_summaries` rows read by the session walk.
    seen_session_summaries: u64,
    /// Summaries reached through their own session's list.
    matched_summaries: u64,
    /// `summary_sources` rows read for those summaries.
    seen_source_rows: u64,
    /// `covered_by` rows read for the nodes of the session walk.
    seen_cover_edges: u64,
    /// Context rows of existing sessions.
    seen_contexts: u64,
    /// Messages already reported as missing or undecodable (not reported again by the scans).
    reported_messages: HashSet<u64>,
    /// Summaries already reported as missing or undecodable.
    reported_summaries: HashSet<u64>,
    /// Source keys (session, key) already reported.
    reported_source_keys: HashSet<(u64, String)>,
    /// Session keys already reported.
    reported_session_keys: HashSet<String>,
}

impl Findings {
    fn push(
        &mut self,
        kind: ViolationKind,
        subject: impl fmt::Display,
        detail: impl Into<String>,
        repair: Option<Repair>,
    ) {
        if self.violations.len() >= MAX_LISTED_VIOLATIONS {
            self.omitted += 1;
            return;
        }
        self.violations.push(Violation {
            kind,
            subject: subject.to_string(),
            detail: detail.into(),
            repair,
        });
    }

    /// Decodes a record, reporting a corrupt one as [`ViolationKind::UndecodableRecord`]
    /// (`None`); other errors (a newer schema) end the check.
    fn decode<T>(&mut self, decoded: Result<T>, subject: impl fmt::Display) -> Result<Option<T>> {
        match decoded {
            Ok(v) => Ok(Some(v)),
            Err(StoreError::Corrupt { table, detail }) => {
                self.push(
                    ViolationKind::UndecodableRecord,
                    subject,
                    format!("its `{table}` record cannot be decoded ({detail}); {RESTORE}"),
                    None,
                );
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// One message of the session being checked.
#[derive(Debug, Clone, Copy)]
struct MsgLite {
    id: u64,
    seq: u64,
    at: Timestamp,
    tokens: u32,
    /// The summary of this session listing it as a source ([`NO_PARENT`] if none).
    parent: u64,
}

/// The messages of the session being checked, in sequence order, findable by id.
struct SessionMessages {
    list: Vec<MsgLite>,
    /// Built only when ids do not grow with sequence numbers (a damaged store).
    by_id: Option<HashMap<u64, usize>>,
}

impl SessionMessages {
    fn find(&self, id: u64) -> Option<usize> {
        match &self.by_id {
            Some(map) => map.get(&id).copied(),
            None => self.list.binary_search_by_key(&id, |m| m.id).ok(),
        }
    }
}

/// One summary of the session being checked.
struct SumLite {
    id: u64,
    kind: SummaryKind,
    stored: Derived,
    sources: Vec<(u8, u64)>,
    /// Ordinals ran 0..n.
    rows_ok: bool,
    /// Derived fields recomputed from the sources (`None` when the sources are broken).
    computed: Option<Derived>,
    /// The summary of this session listing it as a source.
    parent: Option<u64>,
}

/// Checks every invariant of the store (and of the index, when given) and reports what is
/// broken, with the safe repair for each violation that has one. Reads the store in one read
/// transaction; the index checks read the index and the store's watermark after it. Errors are
/// I/O or database errors (and records of a newer schema), not violations.
pub fn check(store: &Store, index: Option<&SearchIndex>) -> Result<IntegrityReport> {
    let started = std::time::Instant::now();
    let txn = store.db.begin_read()?;
    let t = Tables {
        meta: txn.open_table(tables::META)?,
        sessions: txn.open_table(tables::SESSIONS)?,
        session_keys: txn.open_table(tables::SESSION_KEYS)?,
        messages: txn.open_table(tables::MESSAGES)?,
        originals: txn.open_table(tables::ORIGINALS)?,
        session_runs: txn.open_table(tables::SESSION_RUNS)?,
        source_keys: txn.open_table(tables::SOURCE_KEYS)?,
        summaries: txn.open_table(tables::SUMMARIES)?,
        summary_sources: txn.open_table(tables::SUMMARY_SOURCES)?,
        covered_by: txn.open_table(tables::COVERED_BY)?,
        session_summaries: txn.open_table(tables::SESSION_SUMMARIES)?,
        context: txn.open_table(tables::CONTEXT)?,
    };
    let mut f = Findings::default();
    let counts = Counts {
        sessions: t.sessions.len()?,
        messages: count_messages(&t, &mut f)?,
        originals: t.originals.len()?,
        summaries: t.summaries.len()?,
        source_edges: t.summary_sources.len()?,
        cover_edges: t.covered_by.len()?,
        contexts: t.context.len()?,
        files: 0,
        index_documents: None,
    };

    let next_message = meta_value(&t.meta, meta::NEXT_MESSAGE)?;
    let last_message = message_rows::last_id(&t.messages)?;
    check_counter(
        &mut f,
        &t.meta,
        last_message,
        Counter::NextMessage,
        "message",
    )?;
    check_counter(
        &mut f,
        &t.meta,
        last_key(&t.sessions)?,
        Counter::NextSession,
        "session",
    )?;
    check_counter(
        &mut f,
        &t.meta,
        last_key(&t.summaries)?,
        Counter::NextSummary,
        "summary",
    )?;

    let end = message_end(&t.meta, &t.messages)?;
    for entry in t.sessions.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let record: Option<SessionRecord> =
            f.decode(codec::decode("sessions", bytes.value()), SessionId(id))?;
        check_session(&t, &mut f, id, record.as_ref(), end)?;
    }

    // Message ids run 0..next_message without a gap (the usual case: nothing to scan).
    let dense = counts.messages == next_message
        && last_message.is_none_or(|last| last.checked_add(1) == Some(next_message));
    reconcile(&t, &mut f, &counts, next_message, dense)?;

    let mut counts = counts;
    counts.files = check_files(&txn, &t, &mut f)?;
    check_digests(&txn, &t, &mut f)?;
    let stored_watermark = meta_value(&t.meta, meta::INDEX_WATERMARK)?;
    drop(t);
    drop(txn);
    match index {
        Some(index) => {
            counts.index_documents = Some(check_index(store, index, dense, &mut f)?);
        }
        None => {
            if stored_watermark > end {
                f.push(
                    ViolationKind::WatermarkBeyondEnd,
                    format!("meta.{}", meta::INDEX_WATERMARK),
                    format!(
                        "the index watermark {stored_watermark} is past the next message id {end}: the index claims messages that do not exist and would never index the next ones"
                    ),
                    Some(Repair::Reindex),
                );
            }
        }
    }

    let report = IntegrityReport {
        checked: counts,
        violations: f.violations,
        omitted: f.omitted,
        skipped: f.skipped,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    tracing::debug!(
        violations = report.violations.len() as u64 + report.omitted,
        elapsed_ms = report.elapsed_ms,
        "integrity check done"
    );
    Ok(report)
}

/// Every summary digest belongs to a summary and decodes. A store of schema 4 has no digest
/// table: nothing to check.
fn check_digests(txn: &redb::ReadTransaction, t: &Tables, f: &mut Findings) -> Result<()> {
    let digests = match txn.open_table(tables::SUMMARY_DIGESTS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    for entry in digests.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let decoded: Result<lcm_core::digest::Digest> =
            codec::decode("summary_digests", bytes.value());
        if f.decode(decoded, format!("sum_{id}"))?.is_none() {
            continue;
        }
        if t.summaries.get(id)?.is_none() {
            f.push(
                ViolationKind::OrphanDigest,
                format!("sum_{id}"),
                "a digest is stored for this summary, which does not exist",
                None,
            );
        }
    }
    Ok(())
}

/// The file tables against each other and the messages (see [`ViolationKind::FileRecords`]);
/// the number of file records. A store of schema 3 has no file tables: nothing to check.
fn check_files(txn: &redb::ReadTransaction, t: &Tables, f: &mut Findings) -> Result<u64> {
    use lcm_core::files::{FileInfo, MessageFiles};
    let files = match txn.open_table(tables::FILES) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let hashes = txn.open_table(tables::FILE_HASHES)?;
    let message_files = txn.open_table(tables::MESSAGE_FILES)?;
    let file_messages = txn.open_table(tables::FILE_MESSAGES)?;
    let bad = |f: &mut Findings, subject: String, detail: String| {
        f.push(ViolationKind::FileRecords, subject, detail, None);
    };
    check_counter(f, &t.meta, last_key(&files)?, Counter::NextFile, "file")?;
    for entry in files.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let Some(info): Option<FileInfo> =
            f.decode(codec::decode("files", bytes.value()), format!("file_{id}"))?
        else {
            continue;
        };
        if info.id.0 != id {
            bad(
                f,
                format!("file_{id}"),
                format!("its record says it is {}", info.id),
            );
        }
        if let Some(message) = info.content_message
            && message_rows::get(&t.messages, message.0)?.is_none()
        {
            bad(
                f,
                format!("file_{id}"),
                format!("its content is said to be in {message}, which does not exist"),
            );
        }
    }
    for entry in hashes.iter()? {
        let (_, id) = entry?;
        let id = id.value();
        if files.get(id)?.is_none() {
            bad(
                f,
                format!("file_{id}"),
                "a content hash points at this missing record".into(),
            );
        }
    }
    for entry in message_files.iter()? {
        let (message, bytes) = entry?;
        let message = message.value();
        let Some(refs): Option<MessageFiles> = f.decode(
            codec::decode("message_files", bytes.value()),
            format!("msg_{message}"),
        )?
        else {
            continue;
        };
        if message_rows::get(&t.messages, message)?.is_none() {
            bad(
                f,
                format!("msg_{message}"),
                "has file references but no message record".into(),
            );
        }
        for r in &refs.refs {
            if files.get(r.file.0)?.is_none() {
                bad(
                    f,
                    format!("msg_{message}"),
                    format!("references missing {}", r.file),
                );
            }
            if file_messages.get((r.file.0, message))?.is_none() {
                bad(
                    f,
                    format!("msg_{message}"),
                    format!("references {} without the reverse entry", r.file),
                );
            }
        }
    }
    for entry in file_messages.iter()? {
        let (key, _) = entry?;
        let (file, message) = key.value();
        let listed = match message_files.get(message)? {
            Some(bytes) => codec::decode::<MessageFiles>("message_files", bytes.value())
                .is_ok_and(|refs| refs.refs.iter().any(|r| r.file.0 == file)),
            None => false,
        };
        if !listed {
            bad(
                f,
                format!("file_{file}"),
                format!("lists msg_{message} as referencing it, which it does not"),
            );
        }
    }
    Ok(files.len()?)
}

fn meta_value(table: &ReadOnlyTable<&'static str, u64>, key: &str) -> Result<u64> {
    Ok(table.get(key)?.map_or(0, |v| v.value()))
}

/// One past the newest message: `next_message`, or past the newest stored id if the counter is
/// behind (reported on its own).
fn message_end(
    meta_table: &ReadOnlyTable<&'static str, u64>,
    messages: &ReadOnlyTable<u64, &'static [u8]>,
) -> Result<u64> {
    let next = meta_value(meta_table, meta::NEXT_MESSAGE)?;
    let past_last = message_rows::last_id(messages)?.map_or(0, |l| l.saturating_add(1));
    Ok(next.max(past_last))
}

fn last_key<V: redb::Value + 'static>(table: &ReadOnlyTable<u64, V>) -> Result<Option<u64>> {
    Ok(table.last()?.map(|(k, _)| k.value()))
}

/// Reports `counter` if it is not past `last`, the newest stored id it counts.
fn check_counter(
    f: &mut Findings,
    meta_table: &ReadOnlyTable<&'static str, u64>,
    last: Option<u64>,
    counter: Counter,
    what: &str,
) -> Result<()> {
    let next = meta_value(meta_table, counter.meta_key())?;
    if let Some(last) = last
        && last >= next
    {
        f.push(
            ViolationKind::CounterBehind,
            format!("meta.{}", counter.meta_key()),
            format!(
                "the counter is {next} but {what} {last} exists: the next new {what} would overwrite a stored one"
            ),
            Some(Repair::RaiseCounter { counter }),
        );
    }
    Ok(())
}

/// Everything about one session: its messages, its summaries and their edges, its context.
fn check_session(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    record: Option<&SessionRecord>,
    end: u64,
) -> Result<()> {
    let sid = SessionId(session);
    if let Some(record) = record {
        match t.session_keys.get(record.key.as_str())? {
            Some(v) if v.value() == session => f.verified_session_keys += 1,
            found => {
                let detail = match found {
                    Some(v) => format!(
                        "session_keys maps its key `{}` to ses_{}",
                        record.key,
                        v.value()
                    ),
                    None => format!("its key `{}` is missing from session_keys", record.key),
                };
                f.reported_session_keys.insert(record.key.clone());
                f.push(
                    ViolationKind::SessionKeyMismatch,
                    sid,
                    format!(
                        "{detail}: lookups by key find the wrong session or none; {RESTORE_KEYS}"
                    ),
                    None,
                );
            }
        }
        if let Some(parent) = record.parent
            && t.sessions.get(parent)?.is_none()
        {
            f.push(
                ViolationKind::MissingParentSession,
                sid,
                format!("its parent ses_{parent} does not exist; {RESTORE}"),
                None,
            );
        }
    }

    let mut msgs = session_messages(t, f, session, record, end)?;
    let mut sums = session_summaries(t, f, session)?;
    link_summaries(t, f, session, &mut msgs, &mut sums)?;
    check_cover_edges(t, f, &msgs, &sums)?;
    check_context(t, f, session, &msgs, &sums)
}

/// Walks the message runs of the session; checks that they tile its sequence numbers, each
/// message they reach, the originals and source keys of those messages, and the session
/// record's counters. `end` is one past the newest message id (no run reaches past it).
fn session_messages(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    record: Option<&SessionRecord>,
    end: u64,
) -> Result<SessionMessages> {
    let sid = SessionId(session);
    let mut list: Vec<MsgLite> = Vec::new();
    let mut sorted = true;
    let mut entries_ok = true;
    let mut expected_seq = 0u64;
    for run in session_runs::runs(&t.session_runs, session)? {
        let mut run = run?;
        f.seen_session_runs += 1;
        if run.len == 0 {
            entries_ok = false;
            f.push(
                ViolationKind::SessionIndexMismatch,
                sid,
                format!(
                    "its message list has an empty run at #{}: harmless alone, but not written by lcm; restore session_runs from a backup",
                    run.first_seq
                ),
                None,
            );
            continue;
        }
        let reach = run.first_id.checked_add(run.len).filter(|&e| e <= end);
        if reach.is_none() {
            entries_ok = false;
            f.push(
                ViolationKind::SessionIndexMismatch,
                sid,
                format!(
                    "its run at #{} claims {} messages from msg_{}, past the newest message (next id {end}); restore session_runs from a backup",
                    run.first_seq, run.len, run.first_id
                ),
                None,
            );
            run.len = end.saturating_sub(run.first_id);
        }
        // Entries of this run already placed by an earlier run are not walked twice.
        let mut skip = 0;
        if run.first_seq < expected_seq {
            entries_ok = false;
            skip = (expected_seq - run.first_seq).min(run.len);
            f.push(
                ViolationKind::SessionIndexMismatch,
                sid,
                format!(
                    "its message list places two messages at {}; restore session_runs from a backup",
                    seq_span(run.first_seq, run.first_seq + skip)
                ),
                None,
            );
        } else if run.first_seq > expected_seq {
            if entries_ok {
                f.push(
                    ViolationKind::SessionSeqGap,
                    sid,
                    format!(
                        "its message list has no entry for {} (the next entry is #{}): those messages are unreachable; {RESTORE}",
                        seq_span(expected_seq, run.first_seq),
                        run.first_seq
                    ),
                    None,
                );
            }
            entries_ok = false;
        }
        expected_seq = expected_seq.max(run.end_seq());
        // `entries` stops at the last sequence number: a damaged key cannot overflow the walk.
        for (seq, id) in run
            .entries()
            .skip(usize::try_from(skip).unwrap_or(usize::MAX))
        {
            let Some(stored) = message_bytes(&t.messages, id)? else {
                entries_ok = false;
                if f.reported_messages.insert(id) {
                    f.push(
                    ViolationKind::MissingMessage,
                    MessageId(id),
                    format!(
                        "message #{seq} of {sid} is msg_{id}, which is not stored: it is lost; {RESTORE}"
                    ),
                    None,
                );
                }
                continue;
            };
            let view = match decode_view(&stored) {
                Ok(view) => view,
                Err(e) => {
                    entries_ok = false;
                    if f.reported_messages.insert(id) {
                        f.decode(Err::<(), _>(e), MessageId(id))?;
                    }
                    continue;
                }
            };
            if view.session != session || view.seq != seq {
                entries_ok = false;
                f.push(
                ViolationKind::SessionIndexMismatch,
                sid,
                format!(
                    "its message #{seq} is msg_{id}, but msg_{id} is message #{} of ses_{}; restore session_runs from a backup",
                    view.seq, view.session
                ),
                None,
            );
                continue;
            }
            f.matched_messages += 1;
            let has_original = t.originals.get(id)?.is_some();
            if has_original != view.has_original {
                let detail = if view.has_original {
                    "its record says the host gave an original, but none is stored: it is lost"
                } else {
                    "an original is stored although its record says the host gave none \
                 (`lcm show` renders the record instead): harmless"
                };
                f.push(
                    ViolationKind::OriginalMismatch,
                    MessageId(id),
                    format!("{detail}; {RESTORE}"),
                    None,
                );
            } else if has_original {
                f.verified_originals += 1;
            }
            if let Some(source_key) = view.source_key {
                match t.source_keys.get((session, source_key))? {
                    Some(v) if v.value() == id => f.verified_source_keys += 1,
                    found => {
                        let detail = match found {
                            Some(v) => format!("maps to msg_{}", v.value()),
                            None => "is missing from source_keys".to_owned(),
                        };
                        f.reported_source_keys
                            .insert((session, source_key.to_owned()));
                        f.push(
                        ViolationKind::SourceKeyMismatch,
                        MessageId(id),
                        format!(
                            "its source key `{source_key}` {detail}: importing its transcript again would store it twice; restore source_keys from a backup"
                        ),
                        None,
                    );
                    }
                }
            }
            if list.last().is_some_and(|last| last.id >= id) {
                sorted = false;
            }
            list.push(MsgLite {
                id,
                seq,
                at: view.created_at,
                tokens: view.token_count,
                parent: NO_PARENT,
            });
        }
    }

    if let Some(record) = record
        && entries_ok
    {
        let tokens: u64 = list.iter().map(|m| u64::from(m.tokens)).sum();
        let first = list.first().map(|m| m.at);
        let last = list.last().map(|m| m.at);
        let mut diffs = Vec::new();
        if record.message_count != list.len() as u64 {
            diffs.push(format!(
                "message_count: stored {}, messages give {}",
                record.message_count,
                list.len()
            ));
        }
        if record.token_total != tokens {
            diffs.push(format!(
                "token_total: stored {}, messages give {tokens}",
                record.token_total
            ));
        }
        if record.first_message_at != first {
            diffs.push(format!(
                "first_message_at: stored {}, messages give {}",
                show_time(record.first_message_at),
                show_time(first)
            ));
        }
        if record.last_message_at != last {
            diffs.push(format!(
                "last_message_at: stored {}, messages give {}",
                show_time(record.last_message_at),
                show_time(last)
            ));
        }
        if !diffs.is_empty() {
            f.push(
                ViolationKind::SessionTotals,
                sid,
                diffs.join("; "),
                Some(Repair::RecomputeSessionTotals { session: sid }),
            );
        }
    }

    let by_id = (!sorted).then(|| list.iter().enumerate().map(|(i, m)| (m.id, i)).collect());
    Ok(SessionMessages { list, by_id })
}

/// `#a` or `#a..#b` for the sequence numbers `from..to` (exclusive).
fn seq_span(from: u64, to: u64) -> String {
    if to <= from.saturating_add(1) {
        format!("#{from}")
    } else {
        format!("#{from}..#{}", to - 1)
    }
}

fn show_time(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

/// Reads the summaries the session lists, with their source rows.
fn session_summaries(t: &Tables, f: &mut Findings, session: u64) -> Result<Vec<SumLite>> {
    let sid = SessionId(session);
    let mut out = Vec::new();
    for entry in t
        .session_summaries
        .range((session, 0)..=(session, u64::MAX))?
    {
        let (key, _) = entry?;
        let id = key.value().1;
        f.seen_session_summaries += 1;
        let Some(bytes) = t.summaries.get(id)? else {
            f.reported_summaries.insert(id);
            f.push(
                ViolationKind::SessionSummaryMismatch,
                sid,
                format!(
                    "it lists sum_{id}, which is not stored: that summary is lost (the messages it covered are not); {RESTORE}"
                ),
                None,
            );
            continue;
        };
        let decoded = codec::decode::<SummaryRecord>("summaries", bytes.value());
        let record = match decoded {
            Ok(r) => r,
            Err(e) => {
                if f.reported_summaries.insert(id) {
                    f.decode(Err::<(), _>(e), SummaryId(id))?;
                }
                continue;
            }
        };
        if record.session != session {
            f.push(
                ViolationKind::SessionSummaryMismatch,
                sid,
                format!(
                    "it lists sum_{id}, a summary of ses_{}; restore session_summaries from a backup",
                    record.session
                ),
                None,
            );
            continue;
        }
        f.matched_summaries += 1;
        let mut sources = Vec::new();
        let mut rows_ok = true;
        for row in t.summary_sources.range((id, 0)..=(id, u32::MAX))? {
            let (key, node) = row?;
            f.seen_source_rows += 1;
            if key.value().1 as usize != sources.len() {
                rows_ok = false;
            }
            sources.push(node.value());
        }
        if !rows_ok {
            f.push(
                ViolationKind::SourceRows,
                SummaryId(id),
                format!(
                    "its source ordinals do not run 0, 1, 2, ...: a source edge is lost; {RESTORE}"
                ),
                None,
            );
        }
        out.push(SumLite {
            id,
            kind: record.kind,
            stored: Derived::stored(&record),
            sources,
            rows_ok,
            computed: None,
            parent: None,
        });
    }
    Ok(out)
}

/// Resolves every summary's sources (oldest summary first: sources are older than what they
/// feed), records each node's parent, and compares the derived fields with the sources'.
fn link_summaries(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    msgs: &mut SessionMessages,
    sums: &mut [SumLite],
) -> Result<()> {
    for i in 0..sums.len() {
        let id = sums[i].id;
        let sum_id = SummaryId(id);
        if sums[i].sources.is_empty() {
            f.push(
                ViolationKind::EmptySummary,
                sum_id,
                format!("it has no sources: what it summarises is unknown; {RESTORE}"),
                None,
            );
            continue;
        }
        let kind = sums[i].kind;
        let mut ok = sums[i].rows_ok;
        let mut agg = Aggregate::new();
        let mut wrong_kind = false;
        let sources = std::mem::take(&mut sums[i].sources);
        for &(node_kind, n) in &sources {
            let expected = match kind {
                SummaryKind::Leaf => NODE_MESSAGE,
                SummaryKind::Condensed => NODE_SUMMARY,
            };
            if node_kind != expected {
                ok = false;
                if !wrong_kind {
                    wrong_kind = true;
                    let detail = match node_kind {
                        NODE_MESSAGE => {
                            format!("it is a condensed summary with a message source (msg_{n})")
                        }
                        NODE_SUMMARY => {
                            format!("it is a leaf summary with a summary source (sum_{n})")
                        }
                        other => format!("a source has the unknown node kind {other}"),
                    };
                    f.push(
                        if matches!(node_kind, NODE_MESSAGE | NODE_SUMMARY) {
                            ViolationKind::WrongSourceKind
                        } else {
                            ViolationKind::SourceRows
                        },
                        sum_id,
                        format!("{detail}; {RESTORE}"),
                        None,
                    );
                }
                continue;
            }
            if node_kind == NODE_MESSAGE {
                let Some(at) = msgs.find(n) else {
                    ok = false;
                    report_missing_message_source(t, f, session, id, n)?;
                    continue;
                };
                let m = &mut msgs.list[at];
                if m.parent != NO_PARENT {
                    f.push(
                        ViolationKind::DoubleCover,
                        MessageId(n),
                        format!(
                            "it is a source of both sum_{} and sum_{id}: it would be in the context twice; {RESTORE}",
                            m.parent
                        ),
                        None,
                    );
                    ok = false;
                    continue;
                }
                m.parent = id;
                agg.add(Derived::message(m.seq, m.at, m.tokens));
            } else {
                let found = sums[..i].binary_search_by_key(&n, |s| s.id);
                let Ok(child) = found else {
                    ok = false;
                    report_missing_summary_source(t, f, session, id, n, sums)?;
                    continue;
                };
                if let Some(other) = sums[child].parent {
                    f.push(
                        ViolationKind::DoubleCover,
                        SummaryId(n),
                        format!("it is a source of both sum_{other} and sum_{id}; {RESTORE}"),
                        None,
                    );
                    ok = false;
                    continue;
                }
                sums[child].parent = Some(id);
                match sums[child].computed {
                    Some(d) => agg.add(d),
                    // Broken itself (reported): nothing to compare against.
                    None => ok = false,
                }
            }
        }
        sums[i].sources = sources;
        if !agg.contiguous {
            f.push(
                ViolationKind::NonContiguousSources,
                sum_id,
                match kind {
                    SummaryKind::Leaf => "its messages are not consecutive, in order",
                    SummaryKind::Condensed => {
                        "its sources' sequence ranges do not follow each other, in order"
                    }
                }
                .to_owned()
                    + ": the context would skip or repeat messages; "
                    + RESTORE,
                None,
            );
            continue;
        }
        if !ok {
            continue;
        }
        let Some(computed) = agg.finish(kind) else {
            continue;
        };
        sums[i].computed = Some(computed);
        let diffs = Derived::differences(&sums[i].stored, &computed);
        if !diffs.is_empty() {
            f.push(
                ViolationKind::SummaryFields,
                sum_id,
                diffs.join("; "),
                Some(Repair::RecomputeSummaryFields { summary: sum_id }),
            );
        }
    }
    Ok(())
}

/// Message `id` in the pass over every stored message (when the session walk did not account
/// for all of them), with its record as its row holds it: reports it if it cannot be decoded
/// or is unreachable from its session.
fn check_stray_message(t: &Tables, f: &mut Findings, id: u64, record: Result<&[u8]>) -> Result<()> {
    if f.reported_messages.contains(&id) {
        return Ok(());
    }
    let view = match record
        .and_then(|bytes| codec::decode_borrowed::<MessageRecordView<'_>>("messages", bytes))
    {
        Ok(v) => v,
        Err(e) => {
            f.reported_messages.insert(id);
            f.decode(Err::<(), _>(e), MessageId(id))?;
            return Ok(());
        }
    };
    let entry = session_runs::run_at(&t.session_runs, view.session, view.seq)?
        .map(|run| run.id_of(view.seq));
    if entry == Some(id) && t.sessions.get(view.session)?.is_some() {
        return Ok(());
    }
    let detail = if t.sessions.get(view.session)?.is_none() {
        format!("it belongs to ses_{}, which does not exist", view.session)
    } else {
        match entry {
            Some(other) => format!(
                "it is message #{} of ses_{}, but that place holds msg_{other}",
                view.seq, view.session
            ),
            None => format!(
                "it is message #{} of ses_{}, but the session's message list has no entry there",
                view.seq, view.session
            ),
        }
    };
    f.push(
        ViolationKind::OrphanMessage,
        MessageId(id),
        format!("{detail}: it is stored but unreachable from its session; {RESTORE}"),
        None,
    );
    Ok(())
}

/// The number of stored messages, row by row. A row whose layout is damaged (a pack whose
/// records do not fill it exactly) is reported under its first id and counted as one.
fn count_messages(t: &Tables, f: &mut Findings) -> Result<u64> {
    let mut n = 0u64;
    message_rows::rows(&t.messages, |first, row| {
        match row.and_then(|row| row.validate().map(|()| row.len())) {
            Ok(len) => n += len,
            Err(e) => {
                n += 1;
                if f.reported_messages.insert(first) {
                    f.decode(Err::<(), _>(e), MessageId(first))?;
                }
            }
        }
        Ok(())
    })?;
    Ok(n)
}

/// Message `id`'s record as the checks read it: `None` if it is not stored; the inner error
/// (the detail of a damaged pack row) is reported like a record that cannot be decoded.
fn message_bytes<'t>(
    messages: &'t ReadOnlyTable<u64, &'static [u8]>,
    id: u64,
) -> Result<Option<std::result::Result<StoredRecord<'t>, String>>> {
    match message_rows::get(messages, id) {
        Ok(found) => Ok(found.map(Ok)),
        Err(StoreError::Corrupt { detail, .. }) => Ok(Some(Err(detail))),
        Err(e) => Err(e),
    }
}

/// The view of a record found by [`message_bytes`].
fn decode_view<'a>(
    stored: &'a std::result::Result<StoredRecord<'_>, String>,
) -> Result<MessageRecordView<'a>> {
    match stored {
        Ok(record) => codec::decode_borrowed("messages", record.bytes()),
        Err(detail) => Err(corrupt_message(detail.clone())),
    }
}

fn corrupt_message(detail: String) -> StoreError {
    StoreError::Corrupt {
        table: "messages",
        detail,
    }
}

fn report_missing_message_source(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    summary: u64,
    n: u64,
) -> Result<()> {
    let sum_id = SummaryId(summary);
    let Some(stored) = message_bytes(&t.messages, n)? else {
        f.push(
            ViolationKind::MissingSource,
            sum_id,
            format!("its source msg_{n} is not stored: the message is lost; {RESTORE}"),
            None,
        );
        return Ok(());
    };
    let other = decode_view(&stored).ok().map(|v| v.session);
    match other {
        Some(other) if other != session => f.push(
            ViolationKind::ForeignSource,
            sum_id,
            format!(
                "its source msg_{n} belongs to ses_{other}, not ses_{session}; {RESTORE}"
            ),
            None,
        ),
        _ => f.push(
            ViolationKind::MissingSource,
            sum_id,
            format!(
                "its source msg_{n} is not in the message list of ses_{session} (see the other violations about msg_{n})"
            ),
            None,
        ),
    }
    Ok(())
}

fn report_missing_summary_source(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    summary: u64,
    n: u64,
    sums: &[SumLite],
) -> Result<()> {
    let sum_id = SummaryId(summary);
    if sums.binary_search_by_key(&n, |s| s.id).is_ok() {
        f.push(
            ViolationKind::NonContiguousSources,
            sum_id,
            format!(
                "its source sum_{n} is not older than it: the DAG has a cycle or is out of order; {RESTORE}"
            ),
            None,
        );
        return Ok(());
    }
    let Some(bytes) = t.summaries.get(n)? else {
        f.push(
            ViolationKind::MissingSource,
            sum_id,
            format!("its source sum_{n} is not stored (its messages are); {RESTORE}"),
            None,
        );
        return Ok(());
    };
    let other = codec::decode::<SummaryRecord>("summaries", bytes.value())
        .ok()
        .map(|r| r.session);
    match other {
        Some(other) if other != session => f.push(
            ViolationKind::ForeignSource,
            sum_id,
            format!(
                "its source sum_{n} belongs to ses_{other}, not ses_{session}; {RESTORE}"
            ),
            None,
        ),
        _ => f.push(
            ViolationKind::MissingSource,
            sum_id,
            format!(
                "its source sum_{n} is not in the summary list of ses_{session} (see the other violations about sum_{n})"
            ),
            None,
        ),
    }
    Ok(())
}

/// `covered_by` of every node of the session agrees with the source edges found.
fn check_cover_edges(
    t: &Tables,
    f: &mut Findings,
    msgs: &SessionMessages,
    sums: &[SumLite],
) -> Result<()> {
    let nodes = msgs
        .list
        .iter()
        .map(|m| {
            (
                (NODE_MESSAGE, m.id),
                (m.parent != NO_PARENT).then_some(m.parent),
            )
        })
        .chain(sums.iter().map(|s| ((NODE_SUMMARY, s.id), s.parent)));
    for (key, parent) in nodes {
        let subject = node_name(key);
        let edge = t.covered_by.get(key)?.map(|v| v.value());
        if edge.is_some() {
            f.seen_cover_edges += 1;
        }
        match (edge, parent) {
            (None, None) => {}
            (Some(c), Some(p)) if c == p => {}
            (None, Some(p)) => f.push(
                ViolationKind::CoverEdgeMissing,
                subject,
                format!(
                    "it is a source of sum_{p} but covered_by has no entry for it: lineage lookups miss sum_{p}; restore covered_by from a backup"
                ),
                None,
            ),
            (Some(c), parent) => f.push(
                ViolationKind::CoverEdgeWrong,
                subject,
                match parent {
                    Some(p) => format!(
                        "covered_by says sum_{c}, but it is a source of sum_{p}; restore covered_by from a backup"
                    ),
                    None => format!(
                        "covered_by says sum_{c}, but no summary of its session lists it as a source; {RESTORE}"
                    ),
                },
                None,
            ),
        }
    }
    Ok(())
}

fn node_name((kind, n): (u8, u64)) -> String {
    match kind {
        NODE_MESSAGE => MessageId(n).to_string(),
        NODE_SUMMARY => SummaryId(n).to_string(),
        other => format!("node({other}, {n})"),
    }
}

/// The context lists exactly the uncovered summaries in order, then the raw tail after them.
fn check_context(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    msgs: &SessionMessages,
    sums: &[SumLite],
) -> Result<()> {
    let sid = SessionId(session);
    let stored = match t.context.get(session)? {
        Some(bytes) => {
            f.seen_contexts += 1;
            match codec::decode::<ContextState>("context", bytes.value()) {
                Ok(state) => Some(state),
                Err(StoreError::Corrupt { detail, .. }) => {
                    f.push(
                        ViolationKind::ContextMismatch,
                        sid,
                        format!("its context state cannot be decoded ({detail})"),
                        rebuilt_context(msgs, sums)
                            .map(|_| Repair::RebuildContext { session: sid }),
                    );
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    let state = stored.unwrap_or_default();
    let rebuilt = rebuilt_context(msgs, sums);

    // What is wrong with the stored state, if anything (the first problem found).
    let mut problem: Option<String> = None;
    let mut next_seq = 0u64;
    let mut seen = HashSet::new();
    let mut checkable = true;
    for s in &state.summaries {
        let Ok(at) = sums.binary_search_by_key(&s.0, |x| x.id) else {
            problem = Some(format!("it lists {s}, which is not a summary of {sid}"));
            break;
        };
        if !seen.insert(s.0) {
            problem = Some(format!("it lists {s} twice"));
            break;
        }
        if let Some(p) = sums[at].parent {
            problem = Some(format!(
                "it lists {s}, which is covered by sum_{p} (not top-level)"
            ));
            break;
        }
        let Some(d) = sums[at].computed else {
            // Broken summary (reported): ranges cannot be compared.
            checkable = false;
            continue;
        };
        if checkable && d.first_seq != next_seq {
            problem = Some(format!(
                "{s} starts at message #{}, but the context so far reaches #{next_seq}: messages would be {}",
                d.first_seq,
                if d.first_seq > next_seq {
                    "skipped"
                } else {
                    "repeated"
                }
            ));
            break;
        }
        next_seq = d.last_seq.saturating_add(1);
    }
    if problem.is_none() && checkable {
        if state.raw_from > next_seq {
            problem = Some(format!(
                "its raw tail starts at message #{} but its summaries end before #{next_seq}: messages {} are skipped",
                state.raw_from,
                seq_span(next_seq, state.raw_from)
            ));
        } else if state.raw_from < next_seq {
            problem = Some(format!(
                "its raw tail starts at message #{} but its summaries reach #{}: messages {} are in the context twice",
                state.raw_from,
                next_seq - 1,
                seq_span(state.raw_from, next_seq)
            ));
        } else if state.raw_from > msgs.list.len() as u64 {
            problem = Some(format!(
                "its raw tail starts at message #{}, past the session's {} messages",
                state.raw_from,
                msgs.list.len()
            ));
        }
    }
    if problem.is_none()
        && let Some(extra) = sums
            .iter()
            .find(|s| s.parent.is_none() && s.computed.is_some() && !seen.contains(&s.id))
    {
        problem = Some(format!(
            "sum_{} is top-level (no summary covers it) but the context does not list it",
            extra.id
        ));
    }
    if problem.is_none()
        && let Some((ids, raw_from)) = &rebuilt
        && (ids != &state.summaries || *raw_from != state.raw_from)
    {
        problem = Some("it differs from the DAG's top-level summaries".to_owned());
    }
    let Some(problem) = problem else {
        return Ok(());
    };
    let shown = |ids: &[SummaryId], raw_from: u64| {
        let list: Vec<String> = ids.iter().map(ToString::to_string).collect();
        format!("[{}] + raw from #{raw_from}", list.join(", "))
    };
    let detail = match &rebuilt {
        Some((ids, raw_from)) => format!(
            "{problem}: the context is {}, the DAG gives {}",
            shown(&state.summaries, state.raw_from),
            shown(ids, *raw_from)
        ),
        None => format!(
            "{problem}; the DAG's top-level summaries do not cover the session's start without gap or overlap, so the context cannot be rebuilt from them: fix the summary violations first, or restore the store from a backup"
        ),
    };
    f.push(
        ViolationKind::ContextMismatch,
        sid,
        detail,
        rebuilt.map(|_| Repair::RebuildContext { session: sid }),
    );
    Ok(())
}

/// The context the DAG gives (uncovered summaries by sequence range, raw tail after them), if
/// they cover the session's start without gap or overlap and every one of them is sound.
fn rebuilt_context(msgs: &SessionMessages, sums: &[SumLite]) -> Option<(Vec<SummaryId>, u64)> {
    let mut tops: Vec<(Derived, u64)> = Vec::new();
    for s in sums.iter().filter(|s| s.parent.is_none()) {
        tops.push((s.computed?, s.id));
    }
    tops.sort_by_key(|(d, id)| (d.first_seq, *id));
    let mut next = 0u64;
    for (d, _) in &tops {
        if d.first_seq != next {
            return None;
        }
        next = d.last_seq.checked_add(1)?;
    }
    if next > msgs.list.len() as u64 {
        return None;
    }
    Some((
        tops.into_iter().map(|(_, id)| SummaryId(id)).collect(),
        next,
    ))
}

/// Finds the rows the session walk did not account for, table by table (a scan runs only when
/// a table's size and the walk's tally differ).
fn reconcile(
    t: &Tables,
    f: &mut Findings,
    counts: &Counts,
    next_message: u64,
    dense: bool,
) -> Result<()> {
    // session_runs rows of sessions that do not exist.
    if f.seen_session_runs != t.session_runs.len()? {
        let sessions = t.session_runs.iter()?.map(|entry| Ok(entry?.0.value().0));
        report_rows_of_unknown_sessions(
            t,
            f,
            sessions,
            ViolationKind::SessionIndexMismatch,
            "message list",
        )?;
    }

    // Messages: ids 0..next_message, each reached through its own (session, seq) entry.
    if !dense || f.matched_messages != counts.messages {
        let mut expected = 0u64;
        message_rows::rows(&t.messages, |first, row| {
            if first > expected {
                report_missing_range(f, expected, first);
            }
            // A pack whose records are damaged is still walked message by message (its layout
            // was reported when counting); one whose header is unreadable is not: its messages
            // cannot be told apart, so it is reported under its first id.
            let row = match row {
                Ok(row) => row,
                Err(e) => {
                    expected = first.saturating_add(1);
                    if f.reported_messages.insert(first) {
                        f.decode(Err::<(), _>(e), MessageId(first))?;
                    }
                    return Ok(());
                }
            };
            expected = first.saturating_add(row.len());
            for i in 0..row.len() {
                check_stray_message(t, f, first + i, row.record(i as usize))?;
            }
            Ok(())
        })?;
        if next_message > expected {
            report_missing_range(f, expected, next_message);
        }
    }

    // Originals of messages that do not exist.
    if f.verified_originals != counts.originals {
        for entry in t.originals.iter()? {
            let (key, _) = entry?;
            let id = key.value();
            if message_bytes(&t.messages, id)?.is_none() && !f.reported_messages.contains(&id) {
                f.push(
                    ViolationKind::OriginalMismatch,
                    MessageId(id),
                    format!("an original is stored for a message that does not exist; {RESTORE}"),
                    None,
                );
            }
        }
    }

    // Source keys that map to a message without that key.
    if f.verified_source_keys != t.source_keys.len()? {
        for entry in t.source_keys.iter()? {
            let (key, value) = entry?;
            let (s, source_key) = key.value();
            let id = value.value();
            if f.reported_source_keys.contains(&(s, source_key.to_owned())) {
                continue;
            }
            let problem = match message_bytes(&t.messages, id)? {
                None => Some("which does not exist".to_owned()),
                Some(stored) => {
                    match decode_view(&stored) {
                        Ok(v) if v.session == s && v.source_key == Some(source_key) => None,
                        Ok(v) => Some(format!(
                            "a message of ses_{} with {}",
                            v.session,
                            v.source_key.map_or_else(
                                || "no source key".to_owned(),
                                |k| format!("source key `{k}`")
                            )
                        )),
                        // Reported by the walk or the message scan.
                        Err(_) => None,
                    }
                }
            };
            if let Some(problem) = problem {
                f.push(
                    ViolationKind::SourceKeyMismatch,
                    SessionId(s),
                    format!(
                        "source key `{source_key}` maps to msg_{id}, {problem}: imports would skip a message that was never stored; restore source_keys from a backup"
                    ),
                    None,
                );
            }
        }
    }

    // Session keys that name a missing session or a session with another key.
    if f.verified_session_keys != t.session_keys.len()? {
        for entry in t.session_keys.iter()? {
            let (key, value) = entry?;
            let key = key.value();
            let s = value.value();
            if f.reported_session_keys.contains(key) {
                continue;
            }
            let problem = match t.sessions.get(s)? {
                None => Some("which does not exist".to_owned()),
                Some(bytes) => match codec::decode::<SessionRecord>("sessions", bytes.value()) {
                    Ok(r) if r.key == key => None,
                    Ok(r) => Some(format!("whose key is `{}`", r.key)),
                    Err(_) => None,
                },
            };
            if let Some(problem) = problem {
                f.push(
                    ViolationKind::SessionKeyMismatch,
                    SessionId(s),
                    format!("session_keys maps `{key}` to ses_{s}, {problem}; {RESTORE_KEYS}"),
                    None,
                );
            }
        }
    }

    // session_summaries rows of sessions that do not exist.
    if f.seen_session_summaries != t.session_summaries.len()? {
        let sessions = t
            .session_summaries
            .iter()?
            .map(|entry| Ok(entry?.0.value().0));
        report_rows_of_unknown_sessions(
            t,
            f,
            sessions,
            ViolationKind::SessionSummaryMismatch,
            "summary list",
        )?;
    }

    // Summaries not listed under their session.
    if f.matched_summaries != counts.summaries {
        for entry in t.summaries.iter()? {
            let (key, bytes) = entry?;
            let id = key.value();
            if f.reported_summaries.contains(&id) {
                continue;
            }
            let record = match codec::decode::<SummaryRecord>("summaries", bytes.value()) {
                Ok(r) => r,
                Err(e) => {
                    f.reported_summaries.insert(id);
                    f.decode(Err::<(), _>(e), SummaryId(id))?;
                    continue;
                }
            };
            let session_exists = t.sessions.get(record.session)?.is_some();
            let listed = t.session_summaries.get((record.session, id))?.is_some();
            if session_exists && listed {
                continue;
            }
            f.push(
                ViolationKind::OrphanSummary,
                SummaryId(id),
                if session_exists {
                    format!(
                        "it belongs to ses_{} but the session's summary list does not include it: it is invisible to the session; restore session_summaries from a backup",
                        record.session
                    )
                } else {
                    format!("it belongs to ses_{}, which does not exist; {RESTORE}", record.session)
                },
                None,
            );
        }
    }

    // Source rows of summaries that do not exist.
    if f.seen_source_rows != counts.source_edges {
        let mut current: Option<(u64, u64, bool)> = None;
        let flush = |f: &mut Findings, (id, n, missing): (u64, u64, bool)| {
            if missing && !f.reported_summaries.contains(&id) {
                f.push(
                    ViolationKind::SourceRows,
                    SummaryId(id),
                    format!("it is not stored but has {n} source rows; {RESTORE}"),
                    None,
                );
            }
        };
        for entry in t.summary_sources.iter()? {
            let (key, _) = entry?;
            let id = key.value().0;
            match &mut current {
                Some((cur, n, _)) if *cur == id => *n += 1,
                _ => {
                    if let Some(done) = current.take() {
                        flush(f, done);
                    }
                    current = Some((id, 1, t.summaries.get(id)?.is_none()));
                }
            }
        }
        if let Some(done) = current {
            flush(f, done);
        }
    }

    // covered_by rows of nodes that do not exist.
    if f.seen_cover_edges != counts.cover_edges {
        for entry in t.covered_by.iter()? {
            let (key, value) = entry?;
            let (kind, n) = key.value();
            let exists = match kind {
                NODE_MESSAGE => {
                    message_bytes(&t.messages, n)?.is_some() || f.reported_messages.contains(&n)
                }
                NODE_SUMMARY => t.summaries.get(n)?.is_some() || f.reported_summaries.contains(&n),
                _ => false,
            };
            if !exists {
                f.push(
                    ViolationKind::CoverEdgeWrong,
                    node_name((kind, n)),
                    format!(
                        "covered_by has an entry (to sum_{}) for a node that does not exist; {RESTORE}",
                        value.value()
                    ),
                    None,
                );
            }
        }
    }

    // Contexts of sessions that do not exist.
    if f.seen_contexts != counts.contexts {
        for entry in t.context.iter()? {
            let (key, _) = entry?;
            let s = key.value();
            if t.sessions.get(s)?.is_none() {
                f.push(
                    ViolationKind::ContextMismatch,
                    SessionId(s),
                    format!(
                        "a context state is stored for a session that does not exist; {RESTORE}"
                    ),
                    None,
                );
            }
        }
    }
    Ok(())
}

/// Reports the rows of a per-session table whose session does not exist, one finding per such
/// session with its number of rows. `row_sessions` gives each row's session in key order (the
/// rows of one session together).
fn report_rows_of_unknown_sessions(
    t: &Tables,
    f: &mut Findings,
    row_sessions: impl Iterator<Item = Result<u64>>,
    kind: ViolationKind,
    what: &str,
) -> Result<()> {
    let report = |f: &mut Findings, s: u64, n: u64| {
        f.push(
            kind,
            SessionId(s),
            format!("its {what} has {n} rows but the session does not exist; {RESTORE}"),
            None,
        );
    };
    // The session of the current run of rows, and how many rows it has if it does not exist.
    let mut current: Option<(u64, Option<u64>)> = None;
    for s in row_sessions {
        let s = s?;
        match &mut current {
            Some((cur, stray)) if *cur == s => {
                if let Some(n) = stray {
                    *n += 1;
                }
            }
            _ => {
                if let Some((cur, Some(n))) = current.take() {
                    report(f, cur, n);
                }
                let missing = t.sessions.get(s)?.is_none();
                current = Some((s, missing.then_some(1)));
            }
        }
    }
    if let Some((cur, Some(n))) = current {
        report(f, cur, n);
    }
    Ok(())
}

/// Reports message ids `from..to` as missing (one violation per gap), unless each was reported.
fn report_missing_range(f: &mut Findings, from: u64, to: u64) {
    let n = to - from;
    if n <= f.reported_messages.len() as u64
        && (from..to).all(|id| f.reported_messages.contains(&id))
    {
        return;
    }
    let detail = if n == 1 {
        format!("msg_{from} is below next_message but not stored: it is lost; {RESTORE}")
    } else {
        format!(
            "msg_{from}..msg_{} ({n} messages) are below next_message but not stored: they are lost; {RESTORE}",
            to - 1
        )
    };
    f.push(ViolationKind::MissingMessage, MessageId(from), detail, None);
}

/// Compares the index with the store: watermarks, and one document per message below the
/// watermark. Returns the number of documents.
fn check_index(store: &Store, index: &SearchIndex, dense: bool, f: &mut Findings) -> Result<u64> {
    let before = index.watermark();
    let (stored, next) = {
        let txn = store.db.begin_read()?;
        let meta_table = txn.open_table(tables::META)?;
        let messages = txn.open_table(tables::MESSAGES)?;
        (
            MessageId(meta_value(&meta_table, meta::INDEX_WATERMARK)?),
            MessageId(message_end(&meta_table, &messages)?),
        )
    };
    let docs = index.num_docs();
    let after = index.watermark();
    if before != after {
        f.skipped.push(format!(
            "index: the watermark moved from {} to {} during the check (indexing in progress); check again when the index is idle",
            before.0, after.0
        ));
        return Ok(docs);
    }
    let watermark = after;
    if watermark > next {
        f.push(
            ViolationKind::WatermarkBeyondEnd,
            "index",
            format!(
                "the index watermark {} is past the next message id {}: the index claims messages that do not exist and would never index the next ones",
                watermark.0, next.0
            ),
            Some(Repair::Reindex),
        );
        return Ok(docs);
    }
    if stored != watermark {
        f.push(
            ViolationKind::WatermarkMismatch,
            format!("meta.{}", meta::INDEX_WATERMARK),
            format!(
                "the store records watermark {}, the index's commit says {}",
                stored.0, watermark.0
            ),
            Some(Repair::SetIndexWatermark { watermark }),
        );
    }
    let below = if dense {
        watermark.0
    } else {
        let txn = store.db.begin_read()?;
        let messages = txn.open_table(tables::MESSAGES)?;
        let mut n = 0u64;
        // Counts every message below the watermark (nothing breaks the walk).
        let _all = message_rows::for_each(&messages, 0..watermark.0, |_, _| {
            n += 1;
            Ok(ControlFlow::Continue(()))
        })?;
        n
    };
    if docs != below {
        f.push(
            ViolationKind::IndexDocCount,
            "index",
            format!(
                "the index holds {docs} documents, but {below} messages are below its watermark {}: searches would {} messages",
                watermark.0,
                if docs < below { "miss" } else { "return stale or duplicate" }
            ),
            Some(Repair::Reindex),
        );
    }
    Ok(docs)
}

// ----------------------------------------------------------------------------------- repair

/// Applies the safe repairs proposed by `report` (each distinct repair once, in the order of
/// [`Repair`]'s variants), each in one write transaction; an index rebuild supersedes a
/// watermark repair. Every repair recomputes from the store as it is when it runs, so a report
/// that is out of date does no harm: a repair with nothing left to change, or whose inputs are
/// themselves broken, is skipped with the reason. [`Repair::Reindex`] needs `index`.
///
/// Errors are I/O or database errors; repairs applied before one stay applied.
pub fn repair(
    store: &Store,
    index: Option<&SearchIndex>,
    report: &IntegrityReport,
) -> Result<RepairReport> {
    let mut repairs: Vec<Repair> = report
        .violations
        .iter()
        .filter_map(|v| v.repair.clone())
        .collect();
    repairs.sort();
    repairs.dedup();
    let reindex = repairs.contains(&Repair::Reindex);
    let mut out = RepairReport {
        unrepairable: report.violations.len() - report.repairable(),
        ..RepairReport::default()
    };
    for r in repairs {
        let result = match &r {
            Repair::RaiseCounter { counter } => raise_counter(store, *counter)?,
            Repair::RecomputeSessionTotals { session } => {
                recompute_session_totals(store, *session)?
            }
            Repair::RecomputeSummaryFields { summary } => {
                recompute_summary_fields(store, *summary)?
            }
            Repair::RebuildContext { session } => rebuild_context(store, *session)?,
            Repair::SetIndexWatermark { .. } if reindex => {
                Err("superseded by the index rebuild".to_owned())
            }
            Repair::SetIndexWatermark { watermark } => {
                let target = index.map_or(*watermark, SearchIndex::watermark);
                let current = store.index_watermark()?;
                if current == target {
                    Err(format!("the store already records watermark {}", target.0))
                } else {
                    store.set_index_watermark(target)?;
                    Ok(format!("watermark {} -> {}", current.0, target.0))
                }
            }
            Repair::Reindex => match index {
                Some(index) => {
                    let n = index.rebuild(store, |_, _| {})?;
                    Ok(format!("reindexed {n} messages"))
                }
                None => Err(
                    "needs the search index (`lcm doctor --repair` opens it, or run `lcm reindex`)"
                        .to_owned(),
                ),
            },
        };
        match result {
            Ok(detail) => {
                tracing::info!(repair = %r, %detail, "integrity repair applied");
                out.applied.push(RepairOutcome { repair: r, detail });
            }
            Err(detail) => out.skipped.push(RepairOutcome { repair: r, detail }),
        }
    }
    Ok(out)
}

/// `Ok(Ok(what changed))`, `Ok(Err(why skipped))`, or a database error.
type Step = Result<std::result::Result<String, String>>;

/// Commits `txn` if `result` says something changed, else aborts it.
fn finish(txn: WriteTransaction, result: std::result::Result<String, String>) -> Step {
    if result.is_ok() {
        txn.commit()?;
    } else {
        txn.abort()?;
    }
    Ok(result)
}

/// The largest key of a table keyed by id, in a write transaction.
fn last_written_key(
    txn: &WriteTransaction,
    table: redb::TableDefinition<u64, &'static [u8]>,
) -> Result<Option<u64>> {
    Ok(txn.open_table(table)?.last()?.map(|(k, _)| k.value()))
}

fn raise_counter(store: &Store, counter: Counter) -> Step {
    let txn = store.db.begin_write()?;
    let result = {
        let last = match counter {
            Counter::NextMessage => message_rows::last_id(&txn.open_table(tables::MESSAGES)?)?,
            Counter::NextSession => last_written_key(&txn, tables::SESSIONS)?,
            Counter::NextSummary => last_written_key(&txn, tables::SUMMARIES)?,
            Counter::NextFile => last_written_key(&txn, tables::FILES)?,
        };
        let mut meta_table = txn.open_table(tables::META)?;
        let current = meta_table.get(counter.meta_key())?.map_or(0, |v| v.value());
        match last {
            Some(last) if last >= current => {
                let to = last.saturating_add(1);
                meta_table.insert(counter.meta_key(), to)?;
                Ok(format!("{} {current} -> {to}", counter.meta_key()))
            }
            _ => Err(format!(
                "{} ({current}) is already past every id",
                counter.meta_key()
            )),
        }
    };
    finish(txn, result)
}

fn recompute_session_totals(store: &Store, session: SessionId) -> Step {
    let txn = store.db.begin_write()?;
    let result = 'r: {
        let mut sessions = txn.open_table(tables::SESSIONS)?;
        let Some(bytes) = sessions.get(session.0)? else {
            break 'r Err(format!("{session} does not exist"));
        };
        let mut record: SessionRecord = match codec::decode("sessions", bytes.value()) {
            Ok(r) => r,
            Err(StoreError::Corrupt { detail, .. }) => {
                break 'r Err(format!("its record cannot be decoded ({detail})"));
            }
            Err(e) => return Err(e),
        };
        drop(bytes);
        let index = txn.open_table(tables::SESSION_RUNS)?;
        let messages = txn.open_table(tables::MESSAGES)?;
        let (mut count, mut tokens, mut first, mut last) = (0u64, 0u64, None, None);
        for run in session_runs::runs(&index, session.0)? {
            for (seq, id) in run?.entries() {
                let view = message_rows::get(&messages, id)
                    .ok()
                    .flatten()
                    .and_then(|stored| {
                        codec::decode_borrowed::<MessageRecordView<'_>>("messages", stored.bytes())
                            .ok()
                            .map(|v| (v.session, v.seq, v.created_at, v.token_count))
                    });
                match view {
                    Some((s, q, at, t)) if s == session.0 && q == seq && seq == count => {
                        count += 1;
                        tokens += u64::from(t);
                        first.get_or_insert(at);
                        last = Some(at);
                    }
                    _ => {
                        break 'r Err(format!(
                            "message #{seq} of {session} is missing or misplaced: totals are left as recorded"
                        ));
                    }
                }
            }
        }
        let before = (
            record.message_count,
            record.token_total,
            record.first_message_at,
            record.last_message_at,
        );
        if before == (count, tokens, first, last) {
            break 'r Err("the totals already match the messages".to_owned());
        }
        record.message_count = count;
        record.token_total = tokens;
        record.first_message_at = first;
        record.last_message_at = last;
        sessions.insert(session.0, codec::encode(&record).as_slice())?;
        Ok(format!(
            "message_count {} -> {count}, token_total {} -> {tokens}",
            before.0, before.1
        ))
    };
    finish(txn, result)
}

fn recompute_summary_fields(store: &Store, summary: SummaryId) -> Step {
    let txn = store.db.begin_write()?;
    let result = 'r: {
        let mut summaries = txn.open_table(tables::SUMMARIES)?;
        let Some(bytes) = summaries.get(summary.0)? else {
            break 'r Err(format!("{summary} does not exist"));
        };
        let mut record: SummaryRecord = match codec::decode("summaries", bytes.value()) {
            Ok(r) => r,
            Err(StoreError::Corrupt { detail, .. }) => {
                break 'r Err(format!("its record cannot be decoded ({detail})"));
            }
            Err(e) => return Err(e),
        };
        drop(bytes);
        let sources = txn.open_table(tables::SUMMARY_SOURCES)?;
        let messages = txn.open_table(tables::MESSAGES)?;
        let mut agg = Aggregate::new();
        for (ordinal, row) in sources
            .range((summary.0, 0)..=(summary.0, u32::MAX))?
            .enumerate()
        {
            let (key, node) = row?;
            let (kind, n) = node.value();
            if key.value().1 as usize != ordinal {
                break 'r Err("its source rows have a gap".to_owned());
            }
            let part = match (record.kind, kind) {
                (SummaryKind::Leaf, NODE_MESSAGE) => {
                    let view = message_rows::get(&messages, n)
                        .ok()
                        .flatten()
                        .and_then(|stored| {
                            codec::decode_borrowed::<MessageRecordView<'_>>(
                                "messages",
                                stored.bytes(),
                            )
                            .ok()
                            .map(|v| (v.session, v.seq, v.created_at, v.token_count))
                        });
                    match view {
                        Some((s, seq, at, tokens)) if s == record.session => {
                            Derived::message(seq, at, tokens)
                        }
                        _ => break 'r Err(format!("its source msg_{n} is missing or foreign")),
                    }
                }
                (SummaryKind::Condensed, NODE_SUMMARY) => {
                    let child = summaries.get(n)?.and_then(|bytes| {
                        codec::decode::<SummaryRecord>("summaries", bytes.value()).ok()
                    });
                    match child {
                        Some(c) if c.session == record.session && n < summary.0 => {
                            Derived::stored(&c)
                        }
                        _ => break 'r Err(format!("its source sum_{n} is missing or foreign")),
                    }
                }
                _ => break 'r Err("its sources are of the wrong kind".to_owned()),
            };
            agg.add(part);
        }
        if !agg.contiguous {
            break 'r Err("its sources are not contiguous".to_owned());
        }
        let Some(d) = agg.finish(record.kind) else {
            break 'r Err("it has no sources".to_owned());
        };
        let diffs = Derived::differences(&Derived::stored(&record), &d);
        if diffs.is_empty() {
            break 'r Err("its derived fields already match its sources".to_owned());
        }
        record.depth = d.depth;
        record.first_seq = d.first_seq;
        record.last_seq = d.last_seq;
        record.earliest_at = d.earliest;
        record.latest_at = d.latest;
        record.descendant_messages = d.messages;
        record.descendant_tokens = d.tokens;
        summaries.insert(summary.0, codec::encode(&record).as_slice())?;
        Ok(diffs
            .join("; ")
            .replace("stored ", "")
            .replace(", sources give ", " -> "))
    };
    finish(txn, result)
}

fn rebuild_context(store: &Store, session: SessionId) -> Step {
    let txn = store.db.begin_write()?;
    let result = 'r: {
        if txn.open_table(tables::SESSIONS)?.get(session.0)?.is_none() {
            break 'r Err(format!("{session} does not exist"));
        }
        let list = txn.open_table(tables::SESSION_SUMMARIES)?;
        let summaries = txn.open_table(tables::SUMMARIES)?;
        let sources = txn.open_table(tables::SUMMARY_SOURCES)?;
        // Every summary of the session with its range, and which of them are sources.
        let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
        let mut covered: HashSet<u64> = HashSet::new();
        for entry in list.range((session.0, 0)..=(session.0, u64::MAX))? {
            let (key, _) = entry?;
            let id = key.value().1;
            let record = summaries
                .get(id)?
                .and_then(|bytes| codec::decode::<SummaryRecord>("summaries", bytes.value()).ok());
            let Some(record) = record.filter(|r| r.session == session.0) else {
                break 'r Err(format!("sum_{id} is missing or foreign"));
            };
            ranges.push((record.first_seq, record.last_seq, id));
            for row in sources.range((id, 0)..=(id, u32::MAX))? {
                let (_, node) = row?;
                if let (NODE_SUMMARY, child) = node.value() {
                    covered.insert(child);
                }
            }
        }
        let mut tops: Vec<(u64, u64, u64)> = ranges
            .into_iter()
            .filter(|(_, _, id)| !covered.contains(id))
            .collect();
        tops.sort_unstable();
        let mut raw_from = 0u64;
        for &(first, last, id) in &tops {
            if first != raw_from {
                break 'r Err(format!(
                    "the top-level summaries leave a gap or overlap at sum_{id}: rebuilding would lose messages"
                ));
            }
            raw_from = last.saturating_add(1);
        }
        let count = session_runs::last_run(&txn.open_table(tables::SESSION_RUNS)?, session.0)?
            .map_or(0, |run| run.end_seq());
        if raw_from > count {
            break 'r Err(format!(
                "the summaries reach message #{raw_from}, past the session's {count} messages"
            ));
        }
        let ids: Vec<SummaryId> = tops.iter().map(|&(_, _, id)| SummaryId(id)).collect();
        let mut context = txn.open_table(tables::CONTEXT)?;
        let old: Option<ContextState> = context
            .get(session.0)?
            .and_then(|bytes| codec::decode("context", bytes.value()).ok());
        if let Some(old) = &old
            && old.summaries == ids
            && old.raw_from == raw_from
        {
            break 'r Err("the context already matches the DAG".to_owned());
        }
        let state = ContextState {
            summaries: ids,
            raw_from,
            version: old.as_ref().map_or(1, |o| o.version + 1),
        };
        context.insert(session.0, codec::encode(&state).as_slice())?;
        Ok(format!(
            "context now {} top-level summaries + raw from #{raw_from} (version {})",
            state.summaries.len(),
            state.version
        ))
    };
    finish(txn, result)
}
