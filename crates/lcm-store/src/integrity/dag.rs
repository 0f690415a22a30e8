//! The summary DAG: summaries, their sources, the cover edges back from the sources, and the
//! fields derived from the sources:
//!
//! - [`ViolationKind::OrphanSummary`]: a summary that its session's summary list does not
//!   include;
//! - [`ViolationKind::SessionSummaryMismatch`]: a `session_summaries` entry that points at a
//!   missing summary or at a summary of another session, or that belongs to a session that
//!   does not exist;
//! - [`ViolationKind::EmptySummary`]: a summary without sources;
//! - [`ViolationKind::SourceRows`]: a summary's source rows are malformed (ordinals not 0..n,
//!   an unknown node kind, or rows of a summary that does not exist);
//! - [`ViolationKind::MissingSource`]: a source that does not exist (or is not in its
//!   session's lists);
//! - [`ViolationKind::ForeignSource`]: a source that belongs to another session;
//! - [`ViolationKind::WrongSourceKind`]: a leaf with summary sources or a condensed summary
//!   with message sources;
//! - [`ViolationKind::NonContiguousSources`]: sources that are not contiguous and in order;
//! - [`ViolationKind::SummaryFields`]: a summary's stored derived fields differ from what its
//!   sources give (repair: [`Repair::RecomputeSummaryFields`]);
//! - [`ViolationKind::DoubleCover`]: a node that is the source of more than one summary;
//! - [`ViolationKind::CoverEdgeMissing`]: a source edge without its `covered_by` back edge;
//! - [`ViolationKind::CoverEdgeWrong`]: a `covered_by` entry that no source edge backs;
//! - [`ViolationKind::UndecodableRecord`] for summary records.
//!
//! Only [`ViolationKind::SummaryFields`] has a repair. Per session, [`read_summaries`],
//! [`link_sources`] and [`cover_edges`] run in that order (each needs what the one before
//! found); the store-wide checks ([`stray_session_summaries`], [`stray_summaries`],
//! [`stray_source_rows`], [`stray_cover_edges`]) scan a table only when the walk's tally of it
//! differs from its size.

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::summary::SummaryKind;
use redb::{ReadableTable, ReadableTableMetadata};

use super::derived::{Aggregate, Derived};
use super::messages::NO_PARENT;
use super::sessions::report_rows_of_unknown_sessions;
use super::shared::{
    Facts, Findings, RESTORE, SessionWalk, Tables, decode_view, message_bytes, node_name,
};
use super::{Repair, ViolationKind};
use crate::codec;
use crate::dag::SummaryRecord;
use crate::error::Result;
use crate::tables::{NODE_MESSAGE, NODE_SUMMARY};

/// One summary of the session being checked.
pub(super) struct SumLite {
    pub(super) id: u64,
    kind: SummaryKind,
    stored: Derived,
    sources: Vec<(u8, u64)>,
    /// Ordinals ran 0..n.
    rows_ok: bool,
    /// Derived fields recomputed from the sources (`None` when the sources are broken).
    pub(super) computed: Option<Derived>,
    /// The summary of this session listing it as a source.
    pub(super) parent: Option<u64>,
}

/// Reads the summaries the session lists, with their source rows, into `walk.sums`.
pub(super) fn read_summaries(t: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let session = walk.session;
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
    walk.sums = out;
    Ok(())
}

/// Resolves every summary's sources (oldest summary first: sources are older than what they
/// feed), records each node's parent, and compares the derived fields with the sources'.
pub(super) fn link_sources(t: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let session = walk.session;
    let msgs = &mut walk.msgs;
    let sums = &mut walk.sums;
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
                    report_wrong_kind(f, sum_id, node_kind, n);
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

/// A source of the wrong kind for the summary (or of no known kind).
fn report_wrong_kind(f: &mut Findings, sum_id: SummaryId, node_kind: u8, n: u64) {
    let detail = match node_kind {
        NODE_MESSAGE => format!("it is a condensed summary with a message source (msg_{n})"),
        NODE_SUMMARY => format!("it is a leaf summary with a summary source (sum_{n})"),
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
    let other = decode_view(&stored).ok().map(|v| v.session().0);
    match other {
        Some(other) if other != session => f.push(
            ViolationKind::ForeignSource,
            sum_id,
            format!("its source msg_{n} belongs to ses_{other}, not ses_{session}; {RESTORE}"),
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
            format!("its source sum_{n} belongs to ses_{other}, not ses_{session}; {RESTORE}"),
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
pub(super) fn cover_edges(t: &Tables, f: &mut Findings, walk: &mut SessionWalk) -> Result<()> {
    let nodes = walk
        .msgs
        .list
        .iter()
        .map(|m| {
            (
                (NODE_MESSAGE, m.id),
                (m.parent != NO_PARENT).then_some(m.parent),
            )
        })
        .chain(walk.sums.iter().map(|s| ((NODE_SUMMARY, s.id), s.parent)));
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

/// `session_summaries` rows of sessions that do not exist.
pub(super) fn stray_session_summaries(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    if f.seen_session_summaries == t.session_summaries.len()? {
        return Ok(());
    }
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
    )
}

/// Summaries not listed under their session.
pub(super) fn stray_summaries(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    if f.matched_summaries == facts.counts.summaries {
        return Ok(());
    }
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
                format!(
                    "it belongs to ses_{}, which does not exist; {RESTORE}",
                    record.session
                )
            },
            None,
        );
    }
    Ok(())
}

/// Source rows of summaries that do not exist.
pub(super) fn stray_source_rows(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    if f.seen_source_rows == facts.counts.source_edges {
        return Ok(());
    }
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
    Ok(())
}

/// `covered_by` rows of nodes that do not exist.
pub(super) fn stray_cover_edges(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    if f.seen_cover_edges == facts.counts.cover_edges {
        return Ok(());
    }
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
    Ok(())
}
