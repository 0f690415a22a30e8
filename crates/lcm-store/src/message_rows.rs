//! The rows of the `messages` table: one message's record, or a **pack** of the records of
//! consecutive messages.
//!
//! A row is keyed by the id of its first message. A plain row is one record as
//! [`crate::record`] writes it (its first byte is the record's layout version, a small number).
//! A batched append writes its messages in packs instead, so that reading a run of messages
//! walks one row per pack rather than one per message: in redb every row of a range costs a
//! cursor step and a page guard (about 70 ns, the larger part of a scan), and every inserted row
//! a leaf rebuild. A pack holds the messages with ids `key..key + n`:
//!
//! ```text
//! PACK_TAG (1 byte) | n (u16 LE, 2..=PACK_MAX_MESSAGES) | end of each record (n × u32 LE,
//! from the start of the records) | the n records, one after another
//! ```
//!
//! Each record in a pack is byte for byte the plain row the message would have had. Packs are
//! written once, like plain rows, and never changed. A pack is closed before it would pass
//! [`PACK_MAX_BYTES`], so that it fits in a 16 KiB redb page: redb gives a row larger than a
//! page a power-of-two run of pages, and a pack just over a size boundary would waste most of
//! the next one. A message larger than that is written as a plain row.
//!
//! Every reader of the table goes through this module ([`get`], [`RecordCursor`], [`for_each`],
//! [`for_each_in_rows`], [`rows`], [`last_id`]); nothing else parses a row.

use std::ops::{ControlFlow, Range};

use redb::{AccessGuard, ReadableTable};

use crate::error::{Result, StoreError};
use crate::record_source::{InRow, Step};

/// First byte of a pack (a plain row starts with a record schema version, far below it).
pub(crate) const PACK_TAG: u8 = 0xFE;
const _: () = assert!(
    crate::codec::SCHEMA_VERSION < PACK_TAG && crate::record::RECORD_VERSION < PACK_TAG,
    "a record's version byte must never read as a pack"
);
/// Most messages in one pack.
pub(crate) const PACK_MAX_MESSAGES: usize = 64;
/// Most bytes of a pack's value: 16 KiB less room for redb's leaf header and the row's key.
pub(crate) const PACK_MAX_BYTES: usize = 16 * 1024 - 128;
/// Bytes before a pack's end offsets: the tag and the count.
const PACK_HEADER: usize = 3;

/// The records of one row.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Row<'a> {
    One(&'a [u8]),
    /// The whole row and its number of messages (at least 2; the header is checked).
    Pack {
        bytes: &'a [u8],
        n: usize,
    },
}

impl<'a> Row<'a> {
    /// Reads a row's layout (the records themselves are decoded by their readers).
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Row<'a>> {
        if bytes.first() != Some(&PACK_TAG) {
            return Ok(Row::One(bytes));
        }
        let n = match bytes.get(1..PACK_HEADER) {
            Some(&[lo, hi]) => usize::from(u16::from_le_bytes([lo, hi])),
            _ => return Err(corrupt("a pack row shorter than its header".into())),
        };
        if n < 2 {
            return Err(corrupt(format!("a pack row of {n} messages")));
        }
        if bytes.len() < PACK_HEADER + 4 * n {
            return Err(corrupt(format!(
                "a pack row of {n} messages is only {} bytes",
                bytes.len()
            )));
        }
        Ok(Row::Pack { bytes, n })
    }

    /// How many messages the row holds.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Row::One(_) => 1,
            Row::Pack { n, .. } => *n as u64,
        }
    }

    /// Where the record of the row's `i`-th message (`i < len`) lies in the row.
    fn span(&self, i: usize) -> Result<Range<usize>> {
        match *self {
            Row::One(bytes) => Ok(0..bytes.len()),
            Row::Pack { bytes, n } => {
                let records = PACK_HEADER + 4 * n;
                let end_of = |j: usize| -> usize {
                    let at = PACK_HEADER + 4 * j;
                    let b = &bytes[at..at + 4];
                    records + u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize
                };
                let start = if i == 0 { records } else { end_of(i - 1) };
                let end = end_of(i);
                if start > end || end > bytes.len() {
                    return Err(corrupt(format!(
                        "record {i} of a pack of {n} lies at {start}..{end} of a {}-byte row",
                        bytes.len()
                    )));
                }
                Ok(start..end)
            }
        }
    }

    /// The record of the row's `i`-th message (`i < len`).
    pub(crate) fn record(&self, i: usize) -> Result<&'a [u8]> {
        let span = self.span(i)?;
        Ok(match *self {
            Row::One(bytes) | Row::Pack { bytes, .. } => &bytes[span],
        })
    }

    /// Checks every record's place (what [`Self::record`] checks one at a time), and that the
    /// records fill the row exactly.
    pub(crate) fn validate(&self) -> Result<()> {
        let Row::Pack { bytes, n } = *self else {
            return Ok(());
        };
        for i in 0..n {
            self.span(i)?;
        }
        let last = self.span(n - 1)?.end;
        if last != bytes.len() {
            return Err(corrupt(format!(
                "a pack's records end at {last} of a {}-byte row",
                bytes.len()
            )));
        }
        Ok(())
    }
}

fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt {
        table: "messages",
        detail,
    }
}

/// The stored record of one message, borrowed from its row.
pub(crate) struct StoredRecord<'t> {
    row: RowGuard<'t>,
    span: Range<usize>,
}

impl StoredRecord<'_> {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.row.value()[self.span.clone()]
    }
}

/// A row as redb lends it.
type RowGuard<'t> = AccessGuard<'t, &'static [u8]>;

/// The row holding message `id`, if any: its first id and its guard.
fn row_of<'t, T: ReadableTable<u64, &'static [u8]>>(
    table: &'t T,
    id: u64,
) -> Result<Option<(u64, RowGuard<'t>)>> {
    let Some(entry) = table.range(..=id)?.next_back() else {
        return Ok(None);
    };
    let (key, row) = entry?;
    let first = key.value();
    let len = Row::parse(row.value())?.len();
    Ok((id - first < len).then_some((first, row)))
}

/// The record of message `id`, if it is stored.
pub(crate) fn get<T: ReadableTable<u64, &'static [u8]>>(
    table: &T,
    id: u64,
) -> Result<Option<StoredRecord<'_>>> {
    let Some((first, row)) = row_of(table, id)? else {
        return Ok(None);
    };
    let span = Row::parse(row.value())?.span((id - first) as usize)?;
    Ok(Some(StoredRecord { row, span }))
}

/// Point reads of many messages in ascending id order: the row last read is kept, so the
/// messages of one pack cost one lookup.
pub(crate) struct RecordCursor<'t, T> {
    table: &'t T,
    row: Option<(u64, RowGuard<'t>)>,
}

impl<'t, T: ReadableTable<u64, &'static [u8]>> RecordCursor<'t, T> {
    pub(crate) fn new(table: &'t T) -> Self {
        RecordCursor { table, row: None }
    }

    /// The record of message `id`, if stored (borrowed until the next call).
    pub(crate) fn get(&mut self, id: u64) -> Result<Option<&[u8]>> {
        let cached = match &self.row {
            Some((first, row)) => id >= *first && id - first < Row::parse(row.value())?.len(),
            None => false,
        };
        if !cached {
            self.row = row_of(self.table, id)?;
        }
        match &self.row {
            Some((first, row)) => Ok(Some(
                Row::parse(row.value())?.record((id - first) as usize)?,
            )),
            None => Ok(None),
        }
    }
}

/// Visits the record of every stored message with an id in `ids`, in id order, until `visit`
/// breaks (which this returns).
pub(crate) fn for_each<T: ReadableTable<u64, &'static [u8]>>(
    table: &T,
    ids: Range<u64>,
    mut visit: impl FnMut(u64, &[u8]) -> Result<ControlFlow<()>>,
) -> Result<ControlFlow<()>> {
    for_each_in_rows(table, ids, |r| {
        Ok(match visit(r.id, r.record)? {
            ControlFlow::Continue(()) => Step::Next,
            ControlFlow::Break(()) => Step::Stop,
        })
    })
}

/// [`for_each`], with each record's row; the visitor may skip the rest of a row.
pub(crate) fn for_each_in_rows<T: ReadableTable<u64, &'static [u8]>>(
    table: &T,
    ids: Range<u64>,
    mut visit: impl FnMut(InRow<'_>) -> Result<Step>,
) -> Result<ControlFlow<()>> {
    if ids.is_empty() {
        return Ok(ControlFlow::Continue(()));
    }
    // The first message may sit inside a pack that starts before it.
    let from = match row_of(table, ids.start)? {
        Some((first, _)) => first,
        None => ids.start,
    };
    for entry in table.range(from..ids.end)? {
        let (key, guard) = entry?;
        let first = key.value();
        let bytes = guard.value();
        let row = Row::parse(bytes)?;
        let skip = ids.start.saturating_sub(first);
        // Past the row's last message within `ids`.
        let end = row.len().min(ids.end.saturating_sub(first));
        for i in skip..end {
            let span = row.span(i as usize)?;
            let record = InRow {
                id: first + i,
                record: &bytes[span.clone()],
                rest: end - i,
                row_first: first,
                row: bytes,
                span,
            };
            match visit(record)? {
                Step::Next => {}
                Step::SkipRow => break,
                Step::Stop => return Ok(ControlFlow::Break(())),
            }
        }
    }
    Ok(ControlFlow::Continue(()))
}

/// Visits every row in key order: its first id and its layout (integrity checks, counts).
pub(crate) fn rows<T: ReadableTable<u64, &'static [u8]>>(
    table: &T,
    mut visit: impl FnMut(u64, Result<Row<'_>>) -> Result<()>,
) -> Result<()> {
    for entry in table.iter()? {
        let (key, row) = entry?;
        visit(key.value(), Row::parse(row.value()))?;
    }
    Ok(())
}

/// The id of the newest stored message, if any.
pub(crate) fn last_id<T: ReadableTable<u64, &'static [u8]>>(table: &T) -> Result<Option<u64>> {
    let Some((key, row)) = table.last()? else {
        return Ok(None);
    };
    let len = Row::parse(row.value())?.len();
    Ok(Some(key.value().saturating_add(len - 1)))
}

/// Writes an append's records as rows: consecutive messages are gathered into packs, each
/// written when it is full (or at [`Self::flush`]).
#[derive(Default)]
pub(crate) struct PackWriter {
    /// Id of the first gathered message.
    first: u64,
    /// End of each gathered record in `records`.
    ends: Vec<u32>,
    records: Vec<u8>,
    /// The row being written (reused).
    row: Vec<u8>,
}

impl PackWriter {
    /// Adds the record of message `id` ([`crate::record`]). Ids must follow each other within
    /// one writer.
    pub(crate) fn push(
        &mut self,
        table: &mut redb::Table<'_, u64, &'static [u8]>,
        id: u64,
        record: &[u8],
    ) -> Result<()> {
        let len = record.len();
        let packed = PACK_HEADER + 4 * (self.ends.len() + 1) + self.records.len() + len;
        if !self.ends.is_empty()
            && (self.ends.len() == PACK_MAX_MESSAGES || packed > PACK_MAX_BYTES)
        {
            self.flush(table)?;
        }
        if self.ends.is_empty() {
            self.first = id;
        }
        debug_assert_eq!(
            self.first + self.ends.len() as u64,
            id,
            "ids follow each other"
        );
        self.records.extend_from_slice(record);
        let end = u32::try_from(self.records.len()).map_err(|_| {
            StoreError::InvalidMessage(format!("a message record of {len} bytes is too large"))
        })?;
        self.ends.push(end);
        Ok(())
    }

    /// Writes what is gathered: a plain row for one message, a pack for more.
    pub(crate) fn flush(&mut self, table: &mut redb::Table<'_, u64, &'static [u8]>) -> Result<()> {
        match self.ends.len() {
            0 => return Ok(()),
            1 => {
                table.insert(self.first, self.records.as_slice())?;
            }
            n => {
                self.row.clear();
                self.row.push(PACK_TAG);
                let count = u16::try_from(n).unwrap_or(u16::MAX);
                self.row.extend_from_slice(&count.to_le_bytes());
                for end in &self.ends {
                    self.row.extend_from_slice(&end.to_le_bytes());
                }
                self.row.extend_from_slice(&self.records);
                table.insert(self.first, self.row.as_slice())?;
            }
        }
        self.ends.clear();
        self.records.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("messages");

    fn record(id: u64, len: usize) -> Vec<u8> {
        let mut r = vec![1u8];
        r.extend((0..len).map(|i| (id as usize * 31 + i) as u8));
        r
    }

    /// Messages `0..lens.len()` written through one writer, with records of these lengths.
    fn written(lens: &[usize]) -> Database {
        let db = Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(T).unwrap();
            let mut w = PackWriter::default();
            for (id, &len) in lens.iter().enumerate() {
                let r = record(id as u64, len);
                w.push(&mut table, id as u64, &r).unwrap();
            }
            w.flush(&mut table).unwrap();
        }
        txn.commit().unwrap();
        db
    }

    #[test]
    fn every_message_reads_back_by_id_range_and_cursor() {
        // Small records (packs of 64), one too large for a pack, small ones again.
        let mut lens = vec![100; 150];
        lens.push(PACK_MAX_BYTES + 10);
        lens.extend([3000; 20]);
        lens.push(0);
        let db = written(&lens);
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(T).unwrap();
        let n = lens.len() as u64;
        let mut row_sizes = Vec::new();
        rows(&table, |first, row| {
            let row = row?;
            row.validate()?;
            row_sizes.push((first, row.len()));
            Ok(())
        })
        .unwrap();
        // Packs close at 64 messages or before PACK_MAX_BYTES (five records of 3,001 bytes
        // fit, six do not); the large record stands alone; the last, of one byte, still fits.
        assert_eq!(
            row_sizes,
            [
                (0, 64),
                (64, 64),
                (128, 22),
                (150, 1),
                (151, 5),
                (156, 5),
                (161, 5),
                (166, 6)
            ]
        );
        assert_eq!(row_sizes.iter().map(|r| r.1).sum::<u64>(), n);
        assert_eq!(last_id(&table).unwrap(), Some(n - 1));

        for id in 0..n {
            let got = get(&table, id).unwrap().unwrap();
            assert_eq!(got.bytes(), record(id, lens[id as usize]), "msg {id}");
        }
        assert!(get(&table, n).unwrap().is_none());

        let mut cursor = RecordCursor::new(&table);
        for id in (0..n + 3).step_by(3) {
            let got = cursor.get(id).unwrap().map(<[u8]>::to_vec);
            assert_eq!(
                got,
                (id < n).then(|| record(id, lens[id as usize])),
                "msg {id}"
            );
        }

        for ids in [0..n, 5..70, 63..65, 64..64, 150..151, 149..152, 170..400] {
            let mut seen = Vec::new();
            let flow = for_each(&table, ids.clone(), |id, bytes| {
                assert_eq!(bytes, record(id, lens[id as usize]));
                seen.push(id);
                Ok(ControlFlow::Continue(()))
            })
            .unwrap();
            assert!(flow.is_continue());
            let expected: Vec<u64> = (ids.start..ids.end.min(n)).collect();
            assert_eq!(seen, expected, "{ids:?}");
        }
        // A break stops the walk, inside a pack.
        let mut seen = 0;
        let flow = for_each(&table, 10..100, |_, _| {
            seen += 1;
            Ok(if seen == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })
        .unwrap();
        assert!(flow.is_break());
        assert_eq!(seen, 3);

        // Skipping rows: each row's first message within the range says how many follow.
        let mut firsts = Vec::new();
        let flow = for_each_in_rows(&table, 100..160, |r| {
            firsts.push((r.id, r.rest, r.row_first));
            Ok(Step::SkipRow)
        })
        .unwrap();
        assert!(flow.is_continue());
        assert_eq!(
            firsts,
            [
                (100, 28, 64),
                (128, 22, 128),
                (150, 1, 150),
                (151, 5, 151),
                (156, 4, 156)
            ]
        );
    }

    #[test]
    fn a_single_message_is_a_plain_record() {
        let db = written(&[40]);
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(T).unwrap();
        let row = table.get(0).unwrap().unwrap();
        assert_eq!(row.value(), record(0, 40));
        assert!(matches!(Row::parse(row.value()).unwrap(), Row::One(_)));
    }

    #[test]
    fn damaged_packs_are_reported_not_misread() {
        let mut pack = vec![PACK_TAG, 2, 0];
        pack.extend(3u32.to_le_bytes());
        pack.extend(5u32.to_le_bytes());
        pack.extend([1, 9, 9, 1, 8]);
        let row = Row::parse(&pack).unwrap();
        row.validate().unwrap();
        assert_eq!(row.record(0).unwrap(), &[1, 9, 9]);
        assert_eq!(row.record(1).unwrap(), &[1, 8]);

        let corrupt = |bytes: &[u8]| match Row::parse(bytes).and_then(|r| r.validate()) {
            Err(StoreError::Corrupt { table, .. }) => assert_eq!(table, "messages"),
            other => panic!("{other:?}"),
        };
        corrupt(&pack[..2]); // header cut
        corrupt(&pack[..8]); // end offsets cut
        corrupt(&[PACK_TAG, 1, 0, 0, 0, 0, 0]); // a pack of one
        let mut past = pack.clone();
        past[7] = 50; // second record ends past the row
        corrupt(&past);
        assert!(Row::parse(&past).unwrap().record(1).is_err());
        let mut short = pack.clone();
        short.push(0); // a byte no record holds
        corrupt(&short);
        let mut backwards = pack.clone();
        backwards[3] = 6; // first record ends after the second
        corrupt(&backwards);
    }
}
