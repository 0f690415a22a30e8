//! What every checker shares: the store's tables opened in one read snapshot ([`Tables`]),
//! the facts established before the checkers run ([`Facts`]), the state of the session being
//! walked ([`SessionWalk`]) and the [`Findings`] each checker registers its violations in,
//! with the tallies that let the store-wide checkers skip tables the walk fully accounted for.

use std::collections::HashSet;
use std::fmt;

use lcm_core::ids::SessionId;
use redb::{ReadOnlyTable, ReadTransaction, ReadableTable, ReadableTableMetadata};

use super::dag::SumLite;
use super::messages::{self, SessionMessages};
use super::{Counts, MAX_LISTED_VIOLATIONS, Repair, Violation, ViolationKind};
use crate::error::{Result, StoreError};
use crate::message_rows::{self, StoredRecord};
use crate::record::RecordView;
use crate::store::SessionRecord;
use crate::tables::{self, NODE_MESSAGE, NODE_SUMMARY, meta};

/// What a human should do about damage lcm cannot repair safely.
pub(super) const RESTORE: &str = "restore the store from a backup";
pub(super) const RESTORE_KEYS: &str = "restore session_keys from a backup";

/// The store's tables, opened read-only in one snapshot.
pub(super) struct Tables {
    pub(super) meta: ReadOnlyTable<&'static str, u64>,
    pub(super) sessions: ReadOnlyTable<u64, &'static [u8]>,
    pub(super) session_keys: ReadOnlyTable<&'static str, u64>,
    pub(super) messages: ReadOnlyTable<u64, &'static [u8]>,
    pub(super) originals: ReadOnlyTable<u64, &'static [u8]>,
    pub(super) session_runs: ReadOnlyTable<(u64, u64), (u64, u64)>,
    pub(super) source_keys: ReadOnlyTable<(u64, &'static str), u64>,
    pub(super) summaries: ReadOnlyTable<u64, &'static [u8]>,
    pub(super) summary_sources: ReadOnlyTable<(u64, u32), (u8, u64)>,
    pub(super) covered_by: ReadOnlyTable<(u8, u64), u64>,
    pub(super) session_summaries: ReadOnlyTable<(u64, u64), ()>,
    pub(super) context: ReadOnlyTable<u64, &'static [u8]>,
    /// The file tables (`None` in a store of schema 3, which has none).
    pub(super) files: Option<FileTables>,
    /// The summary digests (`None` in a store of schema 4, which has none).
    pub(super) digests: Option<ReadOnlyTable<u64, &'static [u8]>>,
    /// The agent's marks (`None` in a store written before they existed).
    pub(super) marks: Option<ReadOnlyTable<tables::MarkKey, tables::MarkValue>>,
}

/// The file tables of a store that has them.
pub(super) struct FileTables {
    pub(super) files: ReadOnlyTable<u64, &'static [u8]>,
    pub(super) hashes: ReadOnlyTable<&'static [u8], u64>,
    pub(super) message_files: ReadOnlyTable<u64, &'static [u8]>,
    pub(super) file_messages: ReadOnlyTable<(u64, u64), ()>,
}

impl Tables {
    /// Opens every table of the store in `txn`.
    pub(super) fn open(txn: &ReadTransaction) -> Result<Tables> {
        let files = match txn.open_table(tables::FILES) {
            Ok(files) => Some(FileTables {
                files,
                hashes: txn.open_table(tables::FILE_HASHES)?,
                message_files: txn.open_table(tables::MESSAGE_FILES)?,
                file_messages: txn.open_table(tables::FILE_MESSAGES)?,
            }),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let digests = match txn.open_table(tables::SUMMARY_DIGESTS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        let marks = match txn.open_table(tables::CONTEXT_MARKS) {
            Ok(table) => Some(table),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Tables {
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
            files,
            digests,
            marks,
        })
    }
}

/// What the checkers know about the store before any of them runs.
pub(super) struct Facts {
    /// Rows of the store's tables (the report's `checked`).
    pub(super) counts: Counts,
    /// `meta.next_message`.
    pub(super) next_message: u64,
    /// The newest stored message id.
    pub(super) last_message: Option<u64>,
    /// One past the newest message (see [`message_end`]).
    pub(super) end: u64,
    /// Message ids run 0..next_message without a gap (the usual case: no message scan).
    pub(super) dense: bool,
}

impl Facts {
    /// Counts the tables' rows and reads the message counter; damaged message rows found while
    /// counting are registered in `f`.
    pub(super) fn gather(t: &Tables, f: &mut Findings) -> Result<Facts> {
        let counts = Counts {
            sessions: t.sessions.len()?,
            messages: messages::count(t, f)?,
            originals: t.originals.len()?,
            summaries: t.summaries.len()?,
            source_edges: t.summary_sources.len()?,
            cover_edges: t.covered_by.len()?,
            contexts: t.context.len()?,
            files: match &t.files {
                Some(files) => files.files.len()?,
                None => 0,
            },
            index_documents: None,
        };
        let next_message = meta_value(&t.meta, meta::NEXT_MESSAGE)?;
        let last_message = message_rows::last_id(&t.messages)?;
        let end = message_end(&t.meta, &t.messages)?;
        let dense = counts.messages == next_message
            && last_message.is_none_or(|last| last.checked_add(1) == Some(next_message));
        Ok(Facts {
            counts,
            next_message,
            last_message,
            end,
            dense,
        })
    }
}

/// The session being walked: its record, and what the checkers before found in it.
pub(super) struct SessionWalk {
    /// The session's id.
    pub(super) session: u64,
    /// Its record (`None` if it cannot be decoded, which is reported).
    pub(super) record: Option<SessionRecord>,
    /// One past the newest message id (no run reaches past it).
    pub(super) end: u64,
    /// Its messages, as its runs reach them.
    pub(super) msgs: SessionMessages,
    /// The summaries it lists, oldest first.
    pub(super) sums: Vec<SumLite>,
}

impl SessionWalk {
    pub(super) fn new(session: u64, record: Option<SessionRecord>, end: u64) -> SessionWalk {
        SessionWalk {
            session,
            record,
            end,
            msgs: SessionMessages::default(),
            sums: Vec::new(),
        }
    }

    pub(super) fn id(&self) -> SessionId {
        SessionId(self.session)
    }
}

/// Violations and the tallies that reconcile the non-session tables with the session walk.
#[derive(Default)]
pub(super) struct Findings {
    pub(super) violations: Vec<Violation>,
    pub(super) omitted: u64,
    pub(super) skipped: Vec<String>,
    /// `session_runs` rows read by the session walk.
    pub(super) seen_session_runs: u64,
    /// Messages reached through their own (session, seq) entry.
    pub(super) matched_messages: u64,
    /// Originals present for messages that say they have one.
    pub(super) verified_originals: u64,
    /// Source keys that map back to their message.
    pub(super) verified_source_keys: u64,
    /// `session_keys` rows that map back to their session.
    pub(super) verified_session_keys: u64,
    /// `session_summaries` rows read by the session walk.
    pub(super) seen_session_summaries: u64,
    /// Summaries reached through their own session's list.
    pub(super) matched_summaries: u64,
    /// `summary_sources` rows read for those summaries.
    pub(super) seen_source_rows: u64,
    /// `covered_by` rows read for the nodes of the session walk.
    pub(super) seen_cover_edges: u64,
    /// Context rows of existing sessions.
    pub(super) seen_contexts: u64,
    /// Messages already reported as missing or undecodable (not reported again by the scans).
    pub(super) reported_messages: HashSet<u64>,
    /// Summaries already reported as missing or undecodable.
    pub(super) reported_summaries: HashSet<u64>,
    /// Source keys (session, key) already reported.
    pub(super) reported_source_keys: HashSet<(u64, String)>,
    /// Session keys already reported.
    pub(super) reported_session_keys: HashSet<String>,
}

impl Findings {
    /// Registers a violation (only counted past [`MAX_LISTED_VIOLATIONS`]).
    pub(super) fn push(
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
    pub(super) fn decode<T>(
        &mut self,
        decoded: Result<T>,
        subject: impl fmt::Display,
    ) -> Result<Option<T>> {
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

pub(super) fn meta_value(table: &ReadOnlyTable<&'static str, u64>, key: &str) -> Result<u64> {
    Ok(table.get(key)?.map_or(0, |v| v.value()))
}

/// One past the newest message: `next_message`, or past the newest stored id if the counter is
/// behind (reported on its own).
pub(super) fn message_end(
    meta_table: &ReadOnlyTable<&'static str, u64>,
    messages: &ReadOnlyTable<u64, &'static [u8]>,
) -> Result<u64> {
    let next = meta_value(meta_table, meta::NEXT_MESSAGE)?;
    let past_last = message_rows::last_id(messages)?.map_or(0, |l| l.saturating_add(1));
    Ok(next.max(past_last))
}

pub(super) fn last_key<V: redb::Value + 'static>(
    table: &ReadOnlyTable<u64, V>,
) -> Result<Option<u64>> {
    Ok(table.last()?.map(|(k, _)| k.value()))
}

/// Message `id`'s record as the checks read it: `None` if it is not stored; the inner error
/// (the detail of a damaged pack row) is reported like a record that cannot be decoded.
pub(super) fn message_bytes<'t>(
    messages: &'t ReadOnlyTable<u64, &'static [u8]>,
    id: u64,
) -> Result<Option<std::result::Result<StoredRecord<'t>, String>>> {
    match message_rows::get(messages, id) {
        Ok(found) => Ok(found.map(Ok)),
        Err(StoreError::Corrupt { detail, .. }) => Ok(Some(Err(detail))),
        Err(e) => Err(e),
    }
}

/// The view of a record found by [`message_bytes`], validated whole ([`RecordView::validate`]).
pub(super) fn decode_view<'a>(
    stored: &'a std::result::Result<StoredRecord<'_>, String>,
) -> Result<RecordView<'a>> {
    match stored {
        Ok(record) => validated(record.bytes()),
        Err(detail) => Err(StoreError::Corrupt {
            table: "messages",
            detail: detail.clone(),
        }),
    }
}

/// A record read and validated whole: what the integrity check calls decodable.
pub(super) fn validated(bytes: &[u8]) -> Result<RecordView<'_>> {
    let view = RecordView::read(bytes)?;
    view.validate()?;
    Ok(view)
}

/// `#a` or `#a..#b` for the sequence numbers `from..to` (exclusive).
pub(super) fn seq_span(from: u64, to: u64) -> String {
    if to <= from.saturating_add(1) {
        format!("#{from}")
    } else {
        format!("#{from}..#{}", to - 1)
    }
}

/// A DAG node's name: `msg_N`, `sum_N`, or `node(kind, N)` for an unknown kind.
pub(super) fn node_name((kind, n): (u8, u64)) -> String {
    match kind {
        NODE_MESSAGE => lcm_core::ids::MessageId(n).to_string(),
        NODE_SUMMARY => lcm_core::ids::SummaryId(n).to_string(),
        other => format!("node({other}, {n})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_names_one_number_or_the_first_and_last() {
        assert_eq!(seq_span(3, 4), "#3");
        assert_eq!(seq_span(3, 3), "#3");
        assert_eq!(seq_span(3, 6), "#3..#5");
        assert_eq!(seq_span(u64::MAX, u64::MAX), format!("#{}", u64::MAX));
    }

    #[test]
    fn nodes_are_named_like_their_ids() {
        assert_eq!(node_name((NODE_MESSAGE, 4)), "msg_4");
        assert_eq!(node_name((NODE_SUMMARY, 4)), "sum_4");
        assert_eq!(node_name((9, 4)), "node(9, 4)");
    }

    #[test]
    fn past_the_limit_violations_are_only_counted() {
        let mut f = Findings::default();
        for i in 0..=MAX_LISTED_VIOLATIONS {
            f.push(ViolationKind::MissingMessage, i, "lost", None);
        }
        assert_eq!(f.violations.len(), MAX_LISTED_VIOLATIONS);
        assert_eq!(f.omitted, 1);
    }

    #[test]
    fn a_corrupt_record_is_a_violation_and_other_errors_end_the_check() {
        let mut f = Findings::default();
        let corrupt = Err::<(), _>(StoreError::Corrupt {
            table: "sessions",
            detail: "truncated".into(),
        });
        assert_eq!(f.decode(corrupt, "ses_1").expect("reported"), None);
        assert_eq!(f.violations[0].kind, ViolationKind::UndecodableRecord);
        assert_eq!(
            f.violations[0].detail,
            format!("its `sessions` record cannot be decoded (truncated); {RESTORE}")
        );
        assert_eq!(f.decode(Ok(5), "ses_2").expect("decoded"), Some(5));
    }
}
