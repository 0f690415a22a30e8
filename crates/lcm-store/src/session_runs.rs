//! Each session's ordered message list, stored as runs of consecutive ids (`session_runs`).
//!
//! A session's messages have sequence numbers 0, 1, 2, ... and global ids that grow with time,
//! so the messages of one append to one session have consecutive ids. The table keeps one row per
//! **run**: messages whose sequence numbers and ids both go up by one, keyed (session, first
//! sequence number), valued (first id, length). Message `seq` of a run is
//! `first_id + (seq - first_seq)`. An append extends the session's last run while its new ids
//! continue it, so a session appended to on its own keeps a single row, and starts a new run
//! when messages of another session came in between (an interleaved session has a row per
//! message, as schema 1 had for every message).
//!
//! Why runs: an append writes one B-tree row per session instead of one per message (a batch of
//! 1,000 messages spent about 0.4 ms of its 3 ms on those rows), and a session is read by
//! scanning the message table over each run's ids instead of one lookup per message.
//!
//! Schema 1 stored one row per message in `session_messages` ((session, seq) -> id);
//! [`migrate_from_v1`] rewrites that table as runs, entry for entry (even a damaged list).

use std::collections::hash_map::{Entry, HashMap};
use std::ops::Range;

use redb::{
    AccessGuard, ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction,
};

use crate::error::Result;
use crate::tables;

/// Schema 1's per-message list, read only by [`migrate_from_v1`].
const V1_SESSION_MESSAGES: TableDefinition<(u64, u64), u64> =
    TableDefinition::new("session_messages");

/// Messages `first_seq..first_seq + len` of a session are ids `first_id..first_id + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub first_seq: u64,
    pub first_id: u64,
    pub len: u64,
}

/// A row of the table, as redb's iterators give it.
type Row<'a> = std::result::Result<
    (AccessGuard<'a, (u64, u64)>, AccessGuard<'a, (u64, u64)>),
    redb::StorageError,
>;

impl Run {
    fn from_row(row: Row<'_>) -> Result<Run> {
        let (key, value) = row?;
        let (first_id, len) = value.value();
        Ok(Run {
            first_seq: key.value().1,
            first_id,
            len,
        })
    }

    /// One past the last sequence number (saturating: a damaged length cannot overflow).
    pub fn end_seq(&self) -> u64 {
        self.first_seq.saturating_add(self.len)
    }

    /// The id of message `seq`, which must lie in the run.
    pub fn id_of(&self, seq: u64) -> u64 {
        self.first_id.saturating_add(seq - self.first_seq)
    }

    /// The ids of the run's messages with sequence numbers in `seqs` (empty when it has none).
    pub fn ids_within(&self, seqs: &Range<u64>) -> Range<u64> {
        let start = self.first_seq.max(seqs.start);
        let end = self.end_seq().min(seqs.end).max(start);
        self.id_of(start)..self.id_of(end)
    }

    /// The run's (sequence number, id) entries, in order (a damaged length stops at the last
    /// sequence number).
    pub fn entries(self) -> impl Iterator<Item = (u64, u64)> {
        (0..self.len.min(u64::MAX - self.first_seq))
            .map(move |k| (self.first_seq + k, self.first_id.saturating_add(k)))
    }

    /// Whether message `id` as number `seq` would extend this run by one.
    fn continued_by(&self, seq: u64, id: u64) -> bool {
        self.first_seq.checked_add(self.len) == Some(seq)
            && self.first_id.checked_add(self.len) == Some(id)
    }

    fn write(&self, table: &mut Table<'_, (u64, u64), (u64, u64)>, session: u64) -> Result<()> {
        table.insert((session, self.first_seq), (self.first_id, self.len))?;
        Ok(())
    }
}

/// The run of `session` that holds message `seq`, if any.
pub(crate) fn run_at(
    table: &impl ReadableTable<(u64, u64), (u64, u64)>,
    session: u64,
    seq: u64,
) -> Result<Option<Run>> {
    let Some(row) = table.range((session, 0)..=(session, seq))?.next_back() else {
        return Ok(None);
    };
    let run = Run::from_row(row)?;
    Ok((seq < run.end_seq()).then_some(run))
}

/// The last run of `session` (the one that ends at its message count), if it has messages.
pub(crate) fn last_run(
    table: &impl ReadableTable<(u64, u64), (u64, u64)>,
    session: u64,
) -> Result<Option<Run>> {
    table
        .range((session, 0)..=(session, u64::MAX))?
        .next_back()
        .map(Run::from_row)
        .transpose()
}

/// The runs of `session` in sequence order, from the one holding `seqs.start` (or the first
/// after it) to the last one that starts before `seqs.end`.
pub(crate) fn runs_in<'t>(
    table: &'t impl ReadableTable<(u64, u64), (u64, u64)>,
    session: u64,
    seqs: Range<u64>,
) -> Result<impl Iterator<Item = Result<Run>> + 't> {
    // Runs starting after `seqs.start`; the one holding it (if any) starts at or before it.
    let (first, after) = if seqs.is_empty() {
        (None, 0..0)
    } else {
        (
            run_at(table, session, seqs.start)?,
            seqs.start.saturating_add(1)..seqs.end,
        )
    };
    let rest = table
        .range((session, after.start)..(session, after.end))?
        .map(Run::from_row);
    Ok(first.map(Ok).into_iter().chain(rest))
}

/// Every run of `session`, in sequence order.
pub(crate) fn runs<'t>(
    table: &'t impl ReadableTable<(u64, u64), (u64, u64)>,
    session: u64,
) -> Result<impl Iterator<Item = Result<Run>> + 't> {
    Ok(table
        .range((session, 0)..=(session, u64::MAX))?
        .map(Run::from_row))
}

/// The runs an append transaction is writing: for each session it touched, the run its next
/// message may extend. A run is written when a message breaks it and at [`Self::finish`];
/// a session's last stored run is resumed at its first message in the transaction.
#[derive(Default)]
pub(crate) struct RunWriter {
    open: HashMap<u64, OpenRun>,
}

struct OpenRun {
    run: Run,
    /// Changed since it was read from the table (or new).
    dirty: bool,
}

impl RunWriter {
    /// Records that message `id` is message `seq` of `session`.
    pub fn push(
        &mut self,
        table: &mut Table<'_, (u64, u64), (u64, u64)>,
        session: u64,
        seq: u64,
        id: u64,
    ) -> Result<()> {
        let new = Run {
            first_seq: seq,
            first_id: id,
            len: 1,
        };
        match self.open.entry(session) {
            Entry::Occupied(mut entry) => {
                let open = entry.get_mut();
                if open.run.continued_by(seq, id) {
                    open.run.len += 1;
                    open.dirty = true;
                } else {
                    if open.dirty {
                        open.run.write(table, session)?;
                    }
                    *open = OpenRun {
                        run: new,
                        dirty: true,
                    };
                }
            }
            Entry::Vacant(entry) => {
                let run = match last_run(table, session)? {
                    Some(mut last) if last.continued_by(seq, id) => {
                        last.len += 1;
                        last
                    }
                    _ => new,
                };
                entry.insert(OpenRun { run, dirty: true });
            }
        }
        Ok(())
    }

    /// Writes the runs not written yet.
    pub fn finish(self, table: &mut Table<'_, (u64, u64), (u64, u64)>) -> Result<()> {
        for (session, open) in self.open {
            if open.dirty {
                open.run.write(table, session)?;
            }
        }
        Ok(())
    }
}

/// What [`migrate_from_v1`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Migrated {
    /// Rows of schema 1's `session_messages`.
    pub entries: u64,
    /// Rows of `session_runs` written for them.
    pub runs: u64,
}

/// Rewrites schema 1's `session_messages` ((session, seq) -> id, one row per message) as
/// `session_runs` in `txn` and deletes it. Every entry, even of a damaged list (gaps, ids out
/// of order), is kept: only entries whose sequence number and id both follow the previous
/// entry's by one are joined into a run, so the runs expand back to exactly the old rows.
pub(crate) fn migrate_from_v1(txn: &WriteTransaction) -> Result<Migrated> {
    let mut entries = 0;
    let runs = {
        let old = txn.open_table(V1_SESSION_MESSAGES)?;
        let mut table = txn.open_table(tables::SESSION_RUNS)?;
        // Rows come in (session, seq) order: the append path's writer joins them into runs.
        let mut writer = RunWriter::default();
        for row in old.iter()? {
            let (key, id) = row?;
            let (session, seq) = key.value();
            writer.push(&mut table, session, seq, id.value())?;
            entries += 1;
        }
        writer.finish(&mut table)?;
        table.len()?
    };
    txn.delete_table(V1_SESSION_MESSAGES)?;
    Ok(Migrated { entries, runs })
}

/// Writes `entries` ((session, seq) -> id) as schema 1 stored them, replacing `session_runs`:
/// for the migration's tests only.
#[cfg(test)]
pub(crate) fn write_v1(txn: &WriteTransaction, entries: &[((u64, u64), u64)]) -> Result<()> {
    {
        let mut old = txn.open_table(V1_SESSION_MESSAGES)?;
        for &(key, id) in entries {
            old.insert(key, id)?;
        }
    }
    txn.delete_table(tables::SESSION_RUNS)?;
    Ok(())
}

/// Every ((session, seq), id) entry the runs of `table` hold, in key order: for tests only.
#[cfg(test)]
pub(crate) fn every_entry(
    table: &impl ReadableTable<(u64, u64), (u64, u64)>,
) -> Vec<((u64, u64), u64)> {
    let mut entries = Vec::new();
    for row in table.iter().unwrap() {
        let session = row.as_ref().unwrap().0.value().0;
        let run = Run::from_row(row).unwrap();
        entries.extend(run.entries().map(|(seq, id)| ((session, seq), id)));
    }
    entries
}

/// Rewrites the store file at `path` as schema 1 wrote it (its runs as per-message rows,
/// `schema_version` 1): for the migration's tests only. Returns the number of rows.
#[cfg(test)]
pub(crate) fn rewrite_as_v1(path: &std::path::Path) -> usize {
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    let entries = every_entry(&txn.open_table(tables::SESSION_RUNS).unwrap());
    write_v1(&txn, &entries).unwrap();
    crate::record_migration::write_layout_1(&txn).unwrap();
    txn.open_table(tables::META)
        .unwrap()
        .insert(tables::meta::SCHEMA_VERSION, 1)
        .unwrap();
    txn.commit().unwrap();
    entries.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use redb::{Database, ReadableDatabase};

    /// A database with an empty `session_runs` table.
    fn db() -> Database {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(tables::SESSION_RUNS).unwrap();
        txn.commit().unwrap();
        db
    }

    /// Every (session, seq) -> id the runs of `db` hold, in key order.
    fn expanded(db: &Database) -> Vec<((u64, u64), u64)> {
        let txn = db.begin_read().unwrap();
        every_entry(&txn.open_table(tables::SESSION_RUNS).unwrap())
    }

    fn rows(db: &Database) -> u64 {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(tables::SESSION_RUNS).unwrap();
        redb::ReadableTableMetadata::len(&table).unwrap()
    }

    /// Appends messages to sessions in the order given, `batch` per transaction, the way the
    /// store does (ids global, sequence numbers per session); returns the expected entries.
    fn append(db: &Database, sessions: &[u64], batch: usize) -> Vec<((u64, u64), u64)> {
        let mut counts: HashMap<u64, u64> = HashMap::new();
        let mut entries = Vec::new();
        for (chunk_no, chunk) in sessions.chunks(batch.max(1)).enumerate() {
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(tables::SESSION_RUNS).unwrap();
                let mut writer = RunWriter::default();
                for (k, &session) in chunk.iter().enumerate() {
                    let id = (chunk_no * batch.max(1) + k) as u64;
                    let seq = counts.entry(session).or_insert(0);
                    writer.push(&mut table, session, *seq, id).unwrap();
                    entries.push(((session, *seq), id));
                    *seq += 1;
                }
                writer.finish(&mut table).unwrap();
            }
            txn.commit().unwrap();
        }
        entries.sort_unstable();
        entries
    }

    #[test]
    fn a_session_appended_to_alone_keeps_one_run() {
        let db = db();
        let entries = append(&db, &[4; 100], 7);
        assert_eq!(expanded(&db), entries);
        assert_eq!(rows(&db), 1);
    }

    #[test]
    fn interleaved_sessions_start_a_run_at_every_switch() {
        let db = db();
        // a a b a b b | b a (batch of 6, then 2): a's runs #0-1, #2, #3; b's #0, #1-3.
        let entries = append(&db, &[1, 1, 2, 1, 2, 2, 2, 1], 6);
        assert_eq!(expanded(&db), entries);
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(tables::SESSION_RUNS).unwrap();
        let a: Vec<Run> = runs(&table, 1).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(
            a.iter()
                .map(|r| (r.first_seq, r.first_id, r.len))
                .collect::<Vec<_>>(),
            vec![(0, 0, 2), (2, 3, 1), (3, 7, 1)]
        );
        let b: Vec<Run> = runs(&table, 2).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(
            b.iter()
                .map(|r| (r.first_seq, r.first_id, r.len))
                .collect::<Vec<_>>(),
            vec![(0, 2, 1), (1, 4, 3)]
        );
        assert_eq!(run_at(&table, 2, 2).unwrap().map(|r| r.id_of(2)), Some(5));
        assert_eq!(run_at(&table, 2, 4).unwrap(), None);
        assert_eq!(run_at(&table, 3, 0).unwrap(), None);
        let middle: Vec<u64> = runs_in(&table, 2, 2..3)
            .unwrap()
            .map(|r| r.unwrap().first_seq)
            .collect();
        assert_eq!(middle, vec![1]);
        assert_eq!(runs_in(&table, 2, 3..3).unwrap().count(), 0);
    }

    proptest! {
        #[test]
        fn runs_hold_every_entry_and_find_each(
            sessions in proptest::collection::vec(0u64..4, 0..300),
            batch in 1usize..40,
        ) {
            let db = db();
            let entries = append(&db, &sessions, batch);
            prop_assert_eq!(expanded(&db), entries.clone());
            let txn = db.begin_read().unwrap();
            let table = txn.open_table(tables::SESSION_RUNS).unwrap();
            for &((session, seq), id) in &entries {
                let run = run_at(&table, session, seq).unwrap();
                prop_assert_eq!(run.map(|r| r.id_of(seq)), Some(id));
            }
            // No two rows of a session could be one run.
            for session in 0..4 {
                let all: Vec<Run> = runs(&table, session).unwrap().map(|r| r.unwrap()).collect();
                for pair in all.windows(2) {
                    prop_assert!(!pair[0].continued_by(pair[1].first_seq, pair[1].first_id));
                }
            }
        }

        #[test]
        fn migration_keeps_every_v1_entry_even_of_a_damaged_list(
            v1_rows in proptest::collection::btree_map((0u64..3, 0u64..40), 0u64..60, 0..120),
        ) {
            let db = db();
            let v1: Vec<((u64, u64), u64)> = v1_rows.into_iter().collect();
            let txn = db.begin_write().unwrap();
            write_v1(&txn, &v1).unwrap();
            txn.commit().unwrap();

            let txn = db.begin_write().unwrap();
            let done = migrate_from_v1(&txn).unwrap();
            txn.commit().unwrap();
            prop_assert_eq!(done.entries, v1.len() as u64);
            prop_assert_eq!(done.runs, rows(&db));
            prop_assert_eq!(expanded(&db), v1);
            let txn = db.begin_read().unwrap();
            let gone = txn.open_table(V1_SESSION_MESSAGES);
            prop_assert!(matches!(gone, Err(redb::TableError::TableDoesNotExist(_))));
        }
    }
}
