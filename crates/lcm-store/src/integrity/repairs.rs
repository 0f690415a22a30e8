//! The safe repairs: each [`Repair`] recomputes derived data from the store as it is when it
//! runs, in one write transaction, and returns a [`RepairStep`]: applied (committed, with what
//! changed) or skipped (aborted, with why). None touches a message, an original or a summary's
//! content.

use std::collections::HashSet;

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::summary::{ContextState, NodeRef, SummaryKind};
use redb::{ReadableTable, WriteTransaction};

use super::DerivedIndex;
use super::derived::{Aggregate, Derived};
use super::{Counter, IntegrityReport, Repair, RepairOutcome, RepairReport};
use crate::codec;
use crate::dag::SummaryRecord;
use crate::error::{Result, StoreError};
use crate::message_rows;
use crate::record::RecordView;
use crate::session_runs;
use crate::store::{SessionRecord, Store};
use crate::tables::{self, NODE_MESSAGE, NODE_SUMMARY};

/// What one repair did.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RepairStep {
    /// It changed the store (its transaction is committed).
    Applied {
        /// What changed.
        detail: String,
    },
    /// It changed nothing (its transaction is aborted).
    Skipped {
        /// Why: nothing left to change, it needs the index, or its inputs are broken.
        reason: String,
    },
}

impl RepairStep {
    fn applied(detail: impl Into<String>) -> Result<RepairStep> {
        Ok(RepairStep::Applied {
            detail: detail.into(),
        })
    }

    fn skipped(reason: impl Into<String>) -> Result<RepairStep> {
        Ok(RepairStep::Skipped {
            reason: reason.into(),
        })
    }
}

/// Applies the safe repairs proposed by `report` (each distinct repair once, in the order of
/// [`Repair`]'s variants), each in one write transaction; an index rebuild supersedes a
/// watermark repair. Every repair recomputes from the store as it is when it runs, so a report
/// that is out of date does no harm: a repair with nothing left to change, or whose inputs are
/// themselves broken, is skipped with the reason. [`Repair::Reindex`] needs `index`.
///
/// Errors are I/O or database errors; repairs applied before one stay applied.
pub fn repair(
    store: &Store,
    index: Option<&dyn DerivedIndex>,
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
        let step = match &r {
            Repair::RaiseCounter { counter } => raise_counter(store, *counter)?,
            Repair::RecomputeSessionTotals { session } => {
                recompute_session_totals(store, *session)?
            }
            Repair::RecomputeSummaryFields { summary } => {
                recompute_summary_fields(store, *summary)?
            }
            Repair::RebuildContext { session } => rebuild_context(store, *session)?,
            Repair::SetIndexWatermark { .. } if reindex => {
                RepairStep::skipped("superseded by the index rebuild")?
            }
            Repair::SetIndexWatermark { watermark } => {
                set_index_watermark(store, index, *watermark)?
            }
            Repair::RemoveMark { session, node } => remove_mark(store, *session, *node)?,
            Repair::Reindex => reindex_store(store, index)?,
        };
        match step {
            RepairStep::Applied { detail } => {
                tracing::info!(repair = %r, %detail, "integrity repair applied");
                out.applied.push(RepairOutcome { repair: r, detail });
            }
            RepairStep::Skipped { reason } => out.skipped.push(RepairOutcome {
                repair: r,
                detail: reason,
            }),
        }
    }
    Ok(out)
}

/// Runs `step` in one write transaction: commits it if the step was applied, else aborts it.
/// An error drops (and so aborts) the transaction.
fn in_write_txn(
    store: &Store,
    step: impl FnOnce(&WriteTransaction) -> Result<RepairStep>,
) -> Result<RepairStep> {
    let txn = store.db.begin_write()?;
    let step = step(&txn)?;
    match step {
        RepairStep::Applied { .. } => txn.commit()?,
        RepairStep::Skipped { .. } => txn.abort()?,
    }
    Ok(step)
}

/// The largest key of a table keyed by id, in a write transaction.
fn last_written_key(
    txn: &WriteTransaction,
    table: redb::TableDefinition<u64, &'static [u8]>,
) -> Result<Option<u64>> {
    Ok(txn.open_table(table)?.last()?.map(|(k, _)| k.value()))
}

fn raise_counter(store: &Store, counter: Counter) -> Result<RepairStep> {
    in_write_txn(store, |txn| {
        let last = match counter {
            Counter::NextMessage => message_rows::last_id(&txn.open_table(tables::MESSAGES)?)?,
            Counter::NextSession => last_written_key(txn, tables::SESSIONS)?,
            Counter::NextSummary => last_written_key(txn, tables::SUMMARIES)?,
            Counter::NextFile => last_written_key(txn, tables::FILES)?,
        };
        let mut meta_table = txn.open_table(tables::META)?;
        let current = meta_table.get(counter.meta_key())?.map_or(0, |v| v.value());
        match last {
            Some(last) if last >= current => {
                let to = last.saturating_add(1);
                meta_table.insert(counter.meta_key(), to)?;
                RepairStep::applied(format!("{} {current} -> {to}", counter.meta_key()))
            }
            _ => RepairStep::skipped(format!(
                "{} ({current}) is already past every id",
                counter.meta_key()
            )),
        }
    })
}

/// A message's session, sequence number, time and token count, if it is stored and decodes.
fn message_facts(
    messages: &impl ReadableTable<u64, &'static [u8]>,
    id: u64,
) -> Option<(u64, u64, lcm_core::time::Timestamp, u32)> {
    message_rows::get(messages, id)
        .ok()
        .flatten()
        .and_then(|stored| {
            RecordView::read(stored.bytes())
                .ok()
                .map(|v| (v.session().0, v.seq(), v.created_at(), v.token_count()))
        })
}

fn recompute_session_totals(store: &Store, session: SessionId) -> Result<RepairStep> {
    in_write_txn(store, |txn| {
        let mut sessions = txn.open_table(tables::SESSIONS)?;
        let Some(bytes) = sessions.get(session.0)? else {
            return RepairStep::skipped(format!("{session} does not exist"));
        };
        let mut record: SessionRecord = match codec::decode("sessions", bytes.value()) {
            Ok(r) => r,
            Err(StoreError::Corrupt { detail, .. }) => {
                return RepairStep::skipped(format!("its record cannot be decoded ({detail})"));
            }
            Err(e) => return Err(e),
        };
        drop(bytes);
        let index = txn.open_table(tables::SESSION_RUNS)?;
        let messages = txn.open_table(tables::MESSAGES)?;
        let (mut count, mut tokens, mut first, mut last) = (0u64, 0u64, None, None);
        for run in session_runs::runs(&index, session.0)? {
            for (seq, id) in run?.entries() {
                match message_facts(&messages, id) {
                    Some((s, q, at, t)) if s == session.0 && q == seq && seq == count => {
                        count += 1;
                        tokens += u64::from(t);
                        first.get_or_insert(at);
                        last = Some(at);
                    }
                    _ => {
                        return RepairStep::skipped(format!(
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
            return RepairStep::skipped("the totals already match the messages");
        }
        record.message_count = count;
        record.token_total = tokens;
        record.first_message_at = first;
        record.last_message_at = last;
        sessions.insert(session.0, codec::encode(&record).as_slice())?;
        RepairStep::applied(format!(
            "message_count {} -> {count}, token_total {} -> {tokens}",
            before.0, before.1
        ))
    })
}

fn recompute_summary_fields(store: &Store, summary: SummaryId) -> Result<RepairStep> {
    in_write_txn(store, |txn| {
        let mut summaries = txn.open_table(tables::SUMMARIES)?;
        let Some(bytes) = summaries.get(summary.0)? else {
            return RepairStep::skipped(format!("{summary} does not exist"));
        };
        let mut record: SummaryRecord = match codec::decode("summaries", bytes.value()) {
            Ok(r) => r,
            Err(StoreError::Corrupt { detail, .. }) => {
                return RepairStep::skipped(format!("its record cannot be decoded ({detail})"));
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
                return RepairStep::skipped("its source rows have a gap");
            }
            let part = match (record.kind, kind) {
                (SummaryKind::Leaf, NODE_MESSAGE) => match message_facts(&messages, n) {
                    Some((s, seq, at, tokens)) if s == record.session => {
                        Derived::message(seq, at, tokens)
                    }
                    _ => {
                        return RepairStep::skipped(format!(
                            "its source msg_{n} is missing or foreign"
                        ));
                    }
                },
                (SummaryKind::Condensed, NODE_SUMMARY) => {
                    let child = summaries.get(n)?.and_then(|bytes| {
                        codec::decode::<SummaryRecord>("summaries", bytes.value()).ok()
                    });
                    match child {
                        Some(c) if c.session == record.session && n < summary.0 => {
                            Derived::stored(&c)
                        }
                        _ => {
                            return RepairStep::skipped(format!(
                                "its source sum_{n} is missing or foreign"
                            ));
                        }
                    }
                }
                _ => return RepairStep::skipped("its sources are of the wrong kind"),
            };
            agg.add(part);
        }
        if !agg.contiguous {
            return RepairStep::skipped("its sources are not contiguous");
        }
        let Some(d) = agg.finish(record.kind) else {
            return RepairStep::skipped("it has no sources");
        };
        let diffs = Derived::differences(&Derived::stored(&record), &d);
        if diffs.is_empty() {
            return RepairStep::skipped("its derived fields already match its sources");
        }
        d.write_to(&mut record);
        summaries.insert(summary.0, codec::encode(&record).as_slice())?;
        RepairStep::applied(
            diffs
                .join("; ")
                .replace("stored ", "")
                .replace(", sources give ", " -> "),
        )
    })
}

fn rebuild_context(store: &Store, session: SessionId) -> Result<RepairStep> {
    in_write_txn(store, |txn| {
        if txn.open_table(tables::SESSIONS)?.get(session.0)?.is_none() {
            return RepairStep::skipped(format!("{session} does not exist"));
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
                return RepairStep::skipped(format!("sum_{id} is missing or foreign"));
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
                return RepairStep::skipped(format!(
                    "the top-level summaries leave a gap or overlap at sum_{id}: rebuilding would lose messages"
                ));
            }
            raw_from = last.saturating_add(1);
        }
        let count = session_runs::last_run(&txn.open_table(tables::SESSION_RUNS)?, session.0)?
            .map_or(0, |run| run.end_seq());
        if raw_from > count {
            return RepairStep::skipped(format!(
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
            return RepairStep::skipped("the context already matches the DAG");
        }
        let state = ContextState {
            summaries: ids,
            raw_from,
            version: old.as_ref().map_or(1, |o| o.version + 1),
        };
        context.insert(session.0, codec::encode(&state).as_slice())?;
        RepairStep::applied(format!(
            "context now {} top-level summaries + raw from #{raw_from} (version {})",
            state.summaries.len(),
            state.version
        ))
    })
}

/// Sets the store's copy of the watermark to the index's (or to `watermark`, the index's at
/// check time, without an index).
fn set_index_watermark(
    store: &Store,
    index: Option<&dyn DerivedIndex>,
    watermark: MessageId,
) -> Result<RepairStep> {
    let target = index.map_or(watermark, |index| index.watermark());
    let current = store.index_watermark()?;
    if current == target {
        return RepairStep::skipped(format!("the store already records watermark {}", target.0));
    }
    store.set_index_watermark(target)?;
    RepairStep::applied(format!("watermark {} -> {}", current.0, target.0))
}

/// Rebuilds the index from the store (skipped without an index).
fn reindex_store(store: &Store, index: Option<&dyn DerivedIndex>) -> Result<RepairStep> {
    match index {
        Some(index) => {
            let n = index.rebuild_from(store)?;
            RepairStep::applied(format!("reindexed {n} messages"))
        }
        None => RepairStep::skipped(
            "needs the search index (`lcm doctor --repair` opens it, or run `lcm reindex`)",
        ),
    }
}

fn remove_mark(store: &Store, session: SessionId, node: NodeRef) -> Result<RepairStep> {
    in_write_txn(store, |txn| {
        let (kind, number) = crate::dag::node_key(node);
        let key = (session.0, kind, number);
        let removed = txn
            .open_table(tables::CONTEXT_MARKS)?
            .remove(key)?
            .is_some();
        if removed {
            Ok(RepairStep::Applied {
                detail: format!("removed the mark on {node} in {session}"),
            })
        } else {
            RepairStep::skipped("the mark is gone already")
        }
    })
}

#[cfg(test)]
mod tests {
    use lcm_core::tokens::{Encoding, TokenCounter};

    use super::*;
    use crate::store::StoreOptions;

    fn store() -> Store {
        Store::open_in_memory(StoreOptions::new(TokenCounter::new(Encoding::O200kBase)))
            .expect("store")
    }

    fn meta_value(store: &Store, key: &str) -> Option<u64> {
        let txn = store.db.begin_read().expect("read");
        let table = txn.open_table(tables::META).expect("meta");
        table.get(key).expect("get").map(|v| v.value())
    }

    /// Writes `value` under a test key in a repair transaction that ends with `step`.
    fn write_then(store: &Store, value: u64, step: RepairStep) -> RepairStep {
        in_write_txn(store, |txn| {
            txn.open_table(tables::META)?
                .insert("integrity_test", value)?;
            Ok(step)
        })
        .expect("step")
    }

    #[test]
    fn an_applied_step_commits_and_a_skipped_step_aborts() {
        let store = store();
        let skipped = RepairStep::Skipped {
            reason: "nothing to do".into(),
        };
        assert_eq!(write_then(&store, 1, skipped.clone()), skipped);
        assert_eq!(meta_value(&store, "integrity_test"), None);
        let applied = RepairStep::Applied {
            detail: "changed".into(),
        };
        assert_eq!(write_then(&store, 2, applied.clone()), applied);
        assert_eq!(meta_value(&store, "integrity_test"), Some(2));
    }

    #[test]
    fn a_counter_is_raised_once() {
        let store = store();
        store.create_session("a", None).expect("session");
        let session = store.create_session("b", None).expect("session");
        {
            let txn = store.db.begin_write().expect("write");
            txn.open_table(tables::META)
                .expect("meta")
                .insert(tables::meta::NEXT_SESSION, 0)
                .expect("insert");
            txn.commit().expect("commit");
        }
        assert_eq!(
            raise_counter(&store, Counter::NextSession).expect("repair"),
            RepairStep::Applied {
                detail: format!("next_session 0 -> {}", session.0 + 1)
            }
        );
        assert_eq!(
            raise_counter(&store, Counter::NextSession).expect("repair"),
            RepairStep::Skipped {
                reason: format!("next_session ({}) is already past every id", session.0 + 1)
            }
        );
    }

    #[test]
    fn repairs_of_what_does_not_exist_or_needs_the_index_are_skipped() {
        let store = store();
        let skipped = |step: Result<RepairStep>| match step.expect("repair") {
            RepairStep::Skipped { reason } => reason,
            applied @ RepairStep::Applied { .. } => panic!("applied: {applied:?}"),
        };
        assert_eq!(
            skipped(recompute_session_totals(&store, SessionId(7))),
            "ses_7 does not exist"
        );
        assert_eq!(
            skipped(recompute_summary_fields(&store, SummaryId(7))),
            "sum_7 does not exist"
        );
        assert_eq!(
            skipped(rebuild_context(&store, SessionId(7))),
            "ses_7 does not exist"
        );
        assert!(skipped(reindex_store(&store, None)).starts_with("needs the search index"));
    }
}
