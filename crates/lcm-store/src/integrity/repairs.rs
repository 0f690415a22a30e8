//! The safe repairs: each [`Repair`] recomputes derived data from the store as it is when it
//! runs, in one write transaction, committed if it changed something and aborted if not. None
//! touches a message, an original or a summary's content.

use std::collections::HashSet;

use lcm_core::ids::{SessionId, SummaryId};
use lcm_core::summary::{ContextState, SummaryKind};
use redb::{ReadableTable, WriteTransaction};

use super::derived::{Aggregate, Derived};
use super::{Counter, IntegrityReport, Repair, RepairOutcome, RepairReport};
use crate::codec;
use crate::dag::SummaryRecord;
use crate::error::{Result, StoreError};
use crate::index::SearchIndex;
use crate::message_rows;
use crate::session_runs;
use crate::store::{SessionRecord, Store};
use crate::tables::{self, NODE_MESSAGE, NODE_SUMMARY};
use crate::view::MessageRecordView;

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
