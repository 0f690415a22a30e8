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
//! - **context marks**: each names an existing session and a node it may carry (a pin an
//!   existing message, a forget a node of that session); repair: remove the mark;
//! - **index** (when a [`DerivedIndex`] is given): the redb copy of the watermark equals the
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
//!
//! # Layout
//!
//! Each group of invariants has its own checker module, and each checker registers what it
//! finds in a shared `Findings`, reading the tables through a shared `Tables` (both in
//! `shared`). [`check`] runs them in a fixed order, so that a report lists its violations in
//! the same order from one run to the next:
//!
//! 1. `counters`: the id counters, before anything else;
//! 2. per session, in key order: `sessions` (its key and parent), `messages` (its runs, the
//!    messages they reach, their originals and source keys), `sessions` again (its totals),
//!    `dag` (its summaries, their sources, derived fields and cover edges, using `derived`),
//!    `context` (its context state);
//! 3. the store-wide scans of rows the walk did not account for (`messages`, `sessions`,
//!    `dag`, `context`), then `files`, `digests` and `marks`;
//! 4. `index`, after the read transaction is closed.
//!
//! [`repair`] and the typed step each repair returns are in `repairs`.

use std::fmt;

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::summary::NodeRef;
use redb::ReadableTable;
use serde::Serialize;

use crate::codec;
use crate::error::Result;
use crate::store::Store;
use crate::tables::meta;

mod context;
mod counters;
mod dag;
mod derived;
mod digests;
mod files;
mod index;
mod marks;
mod messages;
mod repairs;
mod sessions;
mod shared;

pub use self::repairs::repair;
use self::shared::{Facts, Findings, SessionWalk, Tables, meta_value};

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
    /// A mark on a context (`context_marks`) that names a missing session or node, a pin on a
    /// summary, or a forget of another session's node (subject: session and node). Repair:
    /// [`Repair::RemoveMark`].
    ContextMarks,
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
            ViolationKind::ContextMarks => "context_marks",
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
    /// Remove the agent's mark on `node` in `session`'s context (a mark is a request about
    /// what the context shows, not content).
    RemoveMark {
        /// The session.
        session: SessionId,
        /// The marked node.
        node: NodeRef,
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
            Repair::RemoveMark { session, node } => write!(f, "remove_mark {session} {node}"),
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

/// A checker of invariants over whole tables: it registers what it finds in [`Findings`].
type StoreChecker = fn(&Tables, &Facts, &mut Findings) -> Result<()>;

/// A checker of one session's invariants: it registers what it finds in [`Findings`] and may
/// leave what it read in the [`SessionWalk`] for the checkers after it.
type SessionChecker = fn(&Tables, &mut Findings, &mut SessionWalk) -> Result<()>;

/// Before the session walk.
const BEFORE_WALK: [StoreChecker; 1] = [counters::check];

/// On each session, in this order: each may use what the ones before it left in the walk.
const PER_SESSION: [SessionChecker; 7] = [
    sessions::key_and_parent,
    messages::walk_runs,
    sessions::totals,
    dag::read_summaries,
    dag::link_sources,
    dag::cover_edges,
    context::context_state,
];

/// After the session walk: the rows the walk did not account for (each scan runs only when a
/// table's size and the walk's tally of it differ), then the tables not keyed by session.
const AFTER_WALK: [StoreChecker; 13] = [
    messages::stray_runs,
    messages::stray_messages,
    messages::stray_originals,
    messages::stray_source_keys,
    sessions::stray_session_keys,
    dag::stray_session_summaries,
    dag::stray_summaries,
    dag::stray_source_rows,
    dag::stray_cover_edges,
    context::stray_contexts,
    files::check,
    digests::check,
    marks::check,
];

/// What the check and the repairs need of the search index derived from the store (the
/// `lcm-search` crate's `SearchIndex` implements it): the store does not know how search is
/// done, only that an index claims the messages below its watermark.
pub trait DerivedIndex {
    /// Messages below this id are in the index (its last commit).
    fn watermark(&self) -> MessageId;
    /// Documents the index holds (one per indexed message).
    fn num_docs(&self) -> u64;
    /// Rebuilds the index from the store; the number of messages indexed.
    fn rebuild_from(&self, store: &Store) -> Result<u64>;
}

/// Checks every invariant of the store (and of the index, when given) and reports what is
/// broken, with the safe repair for each violation that has one. Reads the store in one read
/// transaction; the index checks read the index and the store's watermark after it. Errors are
/// I/O or database errors (and records of a newer schema), not violations.
pub fn check(store: &Store, index: Option<&dyn DerivedIndex>) -> Result<IntegrityReport> {
    let started = std::time::Instant::now();
    let txn = store.db.begin_read()?;
    let t = Tables::open(&txn)?;
    let mut f = Findings::default();
    let facts = Facts::gather(&t, &mut f)?;
    for checker in BEFORE_WALK {
        checker(&t, &facts, &mut f)?;
    }
    for entry in t.sessions.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let record = f.decode(codec::decode("sessions", bytes.value()), SessionId(id))?;
        let mut walk = SessionWalk::new(id, record, facts.end);
        for checker in PER_SESSION {
            checker(&t, &mut f, &mut walk)?;
        }
    }
    for checker in AFTER_WALK {
        checker(&t, &facts, &mut f)?;
    }
    let stored_watermark = meta_value(&t.meta, meta::INDEX_WATERMARK)?;
    drop(t);
    drop(txn);
    let mut counts = facts.counts;
    counts.index_documents = index::check(
        store,
        index,
        stored_watermark,
        facts.end,
        facts.dense,
        &mut f,
    )?;

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

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [ViolationKind; 30] = [
        ViolationKind::UndecodableRecord,
        ViolationKind::CounterBehind,
        ViolationKind::MissingMessage,
        ViolationKind::OrphanMessage,
        ViolationKind::SessionIndexMismatch,
        ViolationKind::SessionSeqGap,
        ViolationKind::SessionTotals,
        ViolationKind::SessionKeyMismatch,
        ViolationKind::MissingParentSession,
        ViolationKind::OriginalMismatch,
        ViolationKind::SourceKeyMismatch,
        ViolationKind::OrphanSummary,
        ViolationKind::SessionSummaryMismatch,
        ViolationKind::EmptySummary,
        ViolationKind::SourceRows,
        ViolationKind::MissingSource,
        ViolationKind::ForeignSource,
        ViolationKind::WrongSourceKind,
        ViolationKind::NonContiguousSources,
        ViolationKind::SummaryFields,
        ViolationKind::DoubleCover,
        ViolationKind::CoverEdgeMissing,
        ViolationKind::CoverEdgeWrong,
        ViolationKind::ContextMismatch,
        ViolationKind::WatermarkMismatch,
        ViolationKind::WatermarkBeyondEnd,
        ViolationKind::IndexDocCount,
        ViolationKind::FileRecords,
        ViolationKind::OrphanDigest,
        ViolationKind::ContextMarks,
    ];

    #[test]
    fn a_kind_displays_as_it_serializes() {
        for kind in KINDS {
            let json = serde_json::to_value(kind).expect("serialize");
            assert_eq!(json, serde_json::Value::from(kind.as_str()));
            assert_eq!(kind.to_string(), kind.as_str());
        }
    }

    #[test]
    fn repairs_display_and_serialize_with_their_subject() {
        let r = Repair::RaiseCounter {
            counter: Counter::NextFile,
        };
        assert_eq!(r.to_string(), "raise_counter next_file");
        assert_eq!(
            serde_json::to_value(&r).expect("serialize"),
            serde_json::json!({"repair": "raise_counter", "counter": "next_file"})
        );
        let r = Repair::RecomputeSummaryFields {
            summary: SummaryId(3),
        };
        assert_eq!(r.to_string(), "recompute_summary_fields sum_3");
        assert_eq!(
            Repair::SetIndexWatermark {
                watermark: MessageId(9)
            }
            .to_string(),
            "set_index_watermark 9"
        );
        assert_eq!(Repair::Reindex.to_string(), "reindex");
        let r = Repair::RemoveMark {
            session: SessionId(2),
            node: NodeRef::Message(MessageId(7)),
        };
        assert_eq!(r.to_string(), "remove_mark ses_2 msg_7");
        assert_eq!(
            serde_json::to_value(&r).expect("serialize"),
            serde_json::json!({"repair": "remove_mark", "session": "ses_2", "node": "msg_7"})
        );
    }

    #[test]
    fn repairs_sort_in_dependency_order() {
        let mut repairs = [
            Repair::Reindex,
            Repair::RebuildContext {
                session: SessionId(0),
            },
            Repair::RecomputeSummaryFields {
                summary: SummaryId(1),
            },
            Repair::RaiseCounter {
                counter: Counter::NextMessage,
            },
        ];
        repairs.sort();
        let names: Vec<String> = repairs
            .iter()
            .map(|r| r.to_string().split(' ').next().unwrap_or("").to_owned())
            .collect();
        assert_eq!(
            names,
            [
                "raise_counter",
                "recompute_summary_fields",
                "rebuild_context",
                "reindex"
            ]
        );
    }
}
