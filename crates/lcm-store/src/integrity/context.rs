//! Context states:
//!
//! - [`ViolationKind::ContextMismatch`]: a context state that does not list exactly the
//!   session's top-level summaries in order followed by the raw tail from `raw_from` = the last
//!   one's `last_seq + 1` (so that every message of the session is reached exactly once), that
//!   cannot be decoded, or that belongs to a session that does not exist. Repair:
//!   [`Repair::RebuildContext`] when the DAG itself is sound ([`rebuilt_context`] gives a
//!   context).
//!
//! [`context_state`] runs last in each session, on what the message and DAG checkers found;
//! [`stray_contexts`] scans the table only when some context row was not reached by the walk.

use std::collections::HashSet;

use lcm_core::ids::{SessionId, SummaryId};
use lcm_core::summary::ContextState;
use redb::ReadableTable;

use super::dag::SumLite;
use super::derived::Derived;
use super::messages::SessionMessages;
use super::shared::{Facts, Findings, RESTORE, SessionWalk, Tables, seq_span};
use super::{Repair, ViolationKind};
use crate::codec;
use crate::error::{Result, StoreError};

/// The context lists exactly the uncovered summaries in order, then the raw tail after them.
pub(super) fn context_state(t: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let session = walk.session;
    let (msgs, sums) = (&walk.msgs, walk.sums.as_slice());
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
    let Some(problem) = problem(&state, sid, msgs, sums, rebuilt.as_ref()) else {
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

/// What is wrong with the stored state, if anything (the first problem found).
fn problem(
    state: &ContextState,
    sid: SessionId,
    msgs: &SessionMessages,
    sums: &[SumLite],
    rebuilt: Option<&(Vec<SummaryId>, u64)>,
) -> Option<String> {
    let mut next_seq = 0u64;
    let mut seen = HashSet::new();
    let mut checkable = true;
    for s in &state.summaries {
        let Ok(at) = sums.binary_search_by_key(&s.0, |x| x.id) else {
            return Some(format!("it lists {s}, which is not a summary of {sid}"));
        };
        if !seen.insert(s.0) {
            return Some(format!("it lists {s} twice"));
        }
        if let Some(p) = sums[at].parent {
            return Some(format!(
                "it lists {s}, which is covered by sum_{p} (not top-level)"
            ));
        }
        let Some(d) = sums[at].computed else {
            // Broken summary (reported): ranges cannot be compared.
            checkable = false;
            continue;
        };
        if checkable && d.first_seq != next_seq {
            return Some(format!(
                "{s} starts at message #{}, but the context so far reaches #{next_seq}: messages would be {}",
                d.first_seq,
                if d.first_seq > next_seq {
                    "skipped"
                } else {
                    "repeated"
                }
            ));
        }
        next_seq = d.last_seq.saturating_add(1);
    }
    if checkable {
        if state.raw_from > next_seq {
            return Some(format!(
                "its raw tail starts at message #{} but its summaries end before #{next_seq}: messages {} are skipped",
                state.raw_from,
                seq_span(next_seq, state.raw_from)
            ));
        } else if state.raw_from < next_seq {
            return Some(format!(
                "its raw tail starts at message #{} but its summaries reach #{}: messages {} are in the context twice",
                state.raw_from,
                next_seq - 1,
                seq_span(state.raw_from, next_seq)
            ));
        } else if state.raw_from > msgs.list.len() as u64 {
            return Some(format!(
                "its raw tail starts at message #{}, past the session's {} messages",
                state.raw_from,
                msgs.list.len()
            ));
        }
    }
    if let Some(extra) = sums
        .iter()
        .find(|s| s.parent.is_none() && s.computed.is_some() && !seen.contains(&s.id))
    {
        return Some(format!(
            "sum_{} is top-level (no summary covers it) but the context does not list it",
            extra.id
        ));
    }
    if let Some((ids, raw_from)) = rebuilt
        && (ids != &state.summaries || *raw_from != state.raw_from)
    {
        return Some("it differs from the DAG's top-level summaries".to_owned());
    }
    None
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

/// Contexts of sessions that do not exist.
pub(super) fn stray_contexts(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    if f.seen_contexts == facts.counts.contexts {
        return Ok(());
    }
    for entry in t.context.iter()? {
        let (key, _) = entry?;
        let s = key.value();
        if t.sessions.get(s)?.is_none() {
            f.push(
                ViolationKind::ContextMismatch,
                SessionId(s),
                format!("a context state is stored for a session that does not exist; {RESTORE}"),
                None,
            );
        }
    }
    Ok(())
}
