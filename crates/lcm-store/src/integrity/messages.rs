//! Messages and the per-session lists that reach them (`session_runs`), with the originals and
//! source keys stored beside them:
//!
//! - [`ViolationKind::SessionIndexMismatch`]: a `session_runs` entry points at a message of
//!   another session or sequence number, places two messages at one sequence number, is empty
//!   or reaches past the newest message, or belongs to a session that does not exist;
//! - [`ViolationKind::SessionSeqGap`]: a session's sequence numbers do not run 0, 1, 2, ...
//!   without a gap;
//! - [`ViolationKind::MissingMessage`]: a message id below `next_message` has no record;
//! - [`ViolationKind::OrphanMessage`]: a message that its session's message list does not
//!   reach;
//! - [`ViolationKind::OriginalMismatch`]: a message's `has_original` flag and the `originals`
//!   table disagree;
//! - [`ViolationKind::SourceKeyMismatch`]: `source_keys` and the messages' source keys
//!   disagree;
//! - [`ViolationKind::UndecodableRecord`] for message records and pack rows.
//!
//! None has a repair. The session walk ([`walk_runs`]) reaches every message of a session
//! through its runs; the store-wide checks ([`stray_runs`], [`stray_messages`],
//! [`stray_originals`], [`stray_source_keys`]) scan a table only when the walk's tally of it
//! differs from its size.

use std::collections::HashMap;

use lcm_core::ids::{MessageId, SessionId};
use lcm_core::time::Timestamp;
use redb::{ReadableTable, ReadableTableMetadata};

use super::ViolationKind;
use super::sessions::report_rows_of_unknown_sessions;
use super::shared::{
    Facts, Findings, RESTORE, SessionWalk, Tables, decode_view, message_bytes, seq_span, validated,
};
use crate::error::Result;
use crate::message_rows;
use crate::record::RecordView;
use crate::session_runs;

/// A message's `parent` when no summary of its session lists it as a source.
pub(super) const NO_PARENT: u64 = u64::MAX;

/// One message of the session being checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct MsgLite {
    pub(super) id: u64,
    pub(super) seq: u64,
    pub(super) at: Timestamp,
    pub(super) tokens: u32,
    /// The summary of this session listing it as a source ([`NO_PARENT`] if none).
    pub(super) parent: u64,
}

/// The messages of the session being checked, in sequence order, findable by id.
#[derive(Default)]
pub(super) struct SessionMessages {
    pub(super) list: Vec<MsgLite>,
    /// Built only when ids do not grow with sequence numbers (a damaged store).
    by_id: Option<HashMap<u64, usize>>,
    /// Every entry of the session's runs reached a message of the session at its place, and the
    /// runs tile its sequence numbers: `list` is all of its messages.
    pub(super) complete: bool,
}

impl SessionMessages {
    /// The position in `list` of message `id`.
    pub(super) fn find(&self, id: u64) -> Option<usize> {
        match &self.by_id {
            Some(map) => map.get(&id).copied(),
            None => self.list.binary_search_by_key(&id, |m| m.id).ok(),
        }
    }
}

/// The number of stored messages, row by row. A row whose layout is damaged (a pack whose
/// records do not fill it exactly) is reported under its first id and counted as one.
pub(super) fn count(t: &Tables, f: &mut Findings) -> Result<u64> {
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

/// Walks the message runs of the session: checks that they tile its sequence numbers, each
/// message they reach, and the originals and source keys of those messages. Leaves the
/// messages found in `walk.msgs`.
pub(super) fn walk_runs(t: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let session = walk.session;
    let end = walk.end;
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
            if view.session().0 != session || view.seq() != seq {
                entries_ok = false;
                f.push(
                    ViolationKind::SessionIndexMismatch,
                    sid,
                    format!(
                        "its message #{seq} is msg_{id}, but msg_{id} is message #{} of ses_{}; restore session_runs from a backup",
                        view.seq(), view.session()
                    ),
                    None,
                );
                continue;
            }
            f.matched_messages += 1;
            check_original(t, f, id, &view)?;
            check_source_key(t, f, session, id, &view)?;
            if list.last().is_some_and(|last| last.id >= id) {
                sorted = false;
            }
            list.push(MsgLite {
                id,
                seq,
                at: view.created_at(),
                tokens: view.token_count(),
                parent: NO_PARENT,
            });
        }
    }
    let by_id = (!sorted).then(|| list.iter().enumerate().map(|(i, m)| (m.id, i)).collect());
    walk.msgs = SessionMessages {
        list,
        by_id,
        complete: entries_ok,
    };
    Ok(())
}

/// The message's `has_original` flag agrees with the `originals` table.
fn check_original(t: &Tables, f: &mut Findings, id: u64, view: &RecordView<'_>) -> Result<()> {
    let has_original = t.originals.get(id)?.is_some();
    if has_original != view.has_original() {
        let detail = if view.has_original() {
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
    Ok(())
}

/// The message's source key, if it has one, maps back to it in `source_keys`.
fn check_source_key(
    t: &Tables,
    f: &mut Findings,
    session: u64,
    id: u64,
    view: &RecordView<'_>,
) -> Result<()> {
    let Some(source_key) = view.source_key()? else {
        return Ok(());
    };
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
    Ok(())
}

/// `session_runs` rows of sessions that do not exist.
pub(super) fn stray_runs(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    if f.seen_session_runs == t.session_runs.len()? {
        return Ok(());
    }
    let sessions = t.session_runs.iter()?.map(|entry| Ok(entry?.0.value().0));
    report_rows_of_unknown_sessions(
        t,
        f,
        sessions,
        ViolationKind::SessionIndexMismatch,
        "message list",
    )
}

/// Messages: ids 0..next_message, each reached through its own (session, seq) entry.
pub(super) fn stray_messages(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    if facts.dense && f.matched_messages == facts.counts.messages {
        return Ok(());
    }
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
    if facts.next_message > expected {
        report_missing_range(f, expected, facts.next_message);
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
    let view = match record.and_then(validated) {
        Ok(v) => v,
        Err(e) => {
            f.reported_messages.insert(id);
            f.decode(Err::<(), _>(e), MessageId(id))?;
            return Ok(());
        }
    };
    let (session, seq) = (view.session().0, view.seq());
    let entry = session_runs::run_at(&t.session_runs, session, seq)?.map(|run| run.id_of(seq));
    if entry == Some(id) && t.sessions.get(session)?.is_some() {
        return Ok(());
    }
    let detail = if t.sessions.get(session)?.is_none() {
        format!("it belongs to ses_{session}, which does not exist")
    } else {
        match entry {
            Some(other) => {
                format!("it is message #{seq} of ses_{session}, but that place holds msg_{other}")
            }
            None => format!(
                "it is message #{seq} of ses_{session}, but the session's message list has no entry there"
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

/// Originals of messages that do not exist.
pub(super) fn stray_originals(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    if f.verified_originals == facts.counts.originals {
        return Ok(());
    }
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
    Ok(())
}

/// Source keys that map to a message without that key.
pub(super) fn stray_source_keys(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    if f.verified_source_keys == t.source_keys.len()? {
        return Ok(());
    }
    for entry in t.source_keys.iter()? {
        let (key, value) = entry?;
        let (s, source_key) = key.value();
        let id = value.value();
        if f.reported_source_keys.contains(&(s, source_key.to_owned())) {
            continue;
        }
        let problem = match message_bytes(&t.messages, id)? {
            None => Some("which does not exist".to_owned()),
            Some(stored) => match decode_view(&stored) {
                Ok(v) if v.session().0 == s && v.source_key()? == Some(source_key) => None,
                Ok(v) => Some(format!(
                    "a message of ses_{} with {}",
                    v.session(),
                    v.source_key()?.map_or_else(
                        || "no source key".to_owned(),
                        |k| format!("source key `{k}`")
                    )
                )),
                // Reported by the walk or the message scan.
                Err(_) => None,
            },
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
    Ok(())
}
