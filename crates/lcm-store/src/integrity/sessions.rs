//! Session records, their keys and their totals:
//!
//! - [`ViolationKind::SessionKeyMismatch`]: `session_keys` and the session records disagree
//!   (no repair);
//! - [`ViolationKind::MissingParentSession`]: a session names a parent session that does not
//!   exist (no repair);
//! - [`ViolationKind::SessionTotals`]: a session record's counters (message count, token
//!   total, first and last message times) disagree with its messages (repair:
//!   [`Repair::RecomputeSessionTotals`]);
//! - [`ViolationKind::UndecodableRecord`] for session records (reported by the walk itself,
//!   which decodes each record before the session checkers run).
//!
//! The runs that list a session's messages are checked with the messages (see
//! [`super::messages`]).

use lcm_core::ids::SessionId;
use lcm_core::time::Timestamp;
use redb::{ReadableTable, ReadableTableMetadata};

use super::shared::{Facts, Findings, RESTORE, RESTORE_KEYS, SessionWalk, Tables};
use super::{Repair, ViolationKind};
use crate::codec;
use crate::error::Result;
use crate::store::SessionRecord;

/// The session's key maps back to it in `session_keys`, and its parent exists.
pub(super) fn key_and_parent(t: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let session = walk.session;
    let sid = walk.id();
    let Some(record) = &walk.record else {
        return Ok(());
    };
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
                format!("{detail}: lookups by key find the wrong session or none; {RESTORE_KEYS}"),
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
    Ok(())
}

/// The session record's counters equal what its messages give (only when the walk reached
/// every message of the session).
pub(super) fn totals(_: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let sid = walk.id();
    let (Some(record), true) = (&walk.record, walk.msgs.complete) else {
        return Ok(());
    };
    let list = &walk.msgs.list;
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
    Ok(())
}

fn show_time(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

/// Session keys that name a missing session or a session with another key.
pub(super) fn stray_session_keys(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    if f.verified_session_keys == t.session_keys.len()? {
        return Ok(());
    }
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
    Ok(())
}

/// Reports the rows of a per-session table whose session does not exist, one finding per such
/// session with its number of rows. `row_sessions` gives each row's session in key order (the
/// rows of one session together).
pub(super) fn report_rows_of_unknown_sessions(
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
