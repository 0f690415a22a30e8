//! Rewrites the message records of a store of schema 5 or older (layout 1: bincode of the whole
//! message) in lcm's own layout ([`crate::record`], schema 6), in the transaction of the open
//! that migrates the store.
//!
//! Each old row (a plain record or a pack) is read, its records decoded with the derived
//! decoder of the old layout and encoded again, and the row replaced by the rows of the new
//! records (packed again: a record's size changes, so a pack may split). Nothing else changes:
//! ids, sequence numbers, texts, token counts, originals and source keys are carried over as
//! they are.

use lcm_core::ids::SessionId;
use lcm_core::message::{Part, Role, SourceFormat};
use lcm_core::time::Timestamp;
use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::codec;
use crate::error::Result;
use crate::message_rows::{PackWriter, Row};
use crate::record::{self, RecordFields};
use crate::tables;

/// A message record as layout 1 stored it (bincode 2, standard configuration, after one version
/// byte), read only by [`migrate_records`].
#[derive(Debug, Clone, bincode::Encode, bincode::Decode)]
pub(crate) struct MessageRecordV1 {
    pub session: u64,
    pub seq: u64,
    pub role: Role,
    pub created_at: Timestamp,
    pub token_count: u32,
    pub source: SourceFormat,
    pub parts: Vec<Part>,
    pub source_key: Option<String>,
    pub has_original: bool,
}

/// What [`migrate_records`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Migrated {
    pub messages: u64,
    pub rows_before: u64,
    pub rows_after: u64,
}

/// Rewrites every message record of layout 1 in the current layout.
pub(crate) fn migrate_records(txn: &WriteTransaction) -> Result<Migrated> {
    let mut table = txn.open_table(tables::MESSAGES)?;
    let mut keys = Vec::new();
    for row in table.iter()? {
        keys.push(row?.0.value());
    }
    let mut done = Migrated {
        messages: 0,
        rows_before: keys.len() as u64,
        rows_after: 0,
    };
    let mut writer = PackWriter::default();
    let mut encoded = Vec::new();
    for key in keys {
        // The old row is copied out before it is replaced.
        let old = match table.remove(key)? {
            Some(guard) => guard.value().to_vec(),
            None => continue,
        };
        let row = Row::parse(&old)?;
        for i in 0..row.len() as usize {
            let id = key + i as u64;
            let old_record = row.record(i)?;
            // A record already in the current layout is kept (the migration is idempotent).
            if old_record.first() == Some(&record::RECORD_VERSION) {
                writer.push(&mut table, id, old_record)?;
                continue;
            }
            let v1: MessageRecordV1 = codec::decode("messages", old_record)?;
            record::encode(
                &RecordFields {
                    session: SessionId(v1.session),
                    seq: v1.seq,
                    role: v1.role,
                    created_at: v1.created_at,
                    token_count: v1.token_count,
                    source: v1.source,
                    has_original: v1.has_original,
                    parts: &v1.parts,
                    source_key: v1.source_key.as_deref(),
                },
                &mut encoded,
            )?;
            writer.push(&mut table, id, &encoded)?;
        }
        // Rows never span two old rows: ids may have gaps between them.
        writer.flush(&mut table)?;
        done.messages += row.len();
    }
    done.rows_after = table.len()?;
    Ok(done)
}

/// Rewrites every message record of the store in layout 1, as schema 5 and older stored them
/// (the inverse of [`migrate_records`], one record per row): for the migration's tests only.
#[cfg(test)]
pub(crate) fn write_layout_1(txn: &WriteTransaction) -> Result<u64> {
    use crate::record::RecordView;
    let mut table = txn.open_table(tables::MESSAGES)?;
    let mut keys = Vec::new();
    for row in table.iter()? {
        keys.push(row?.0.value());
    }
    let mut written = 0;
    for key in keys {
        let old = match table.remove(key)? {
            Some(guard) => guard.value().to_vec(),
            None => continue,
        };
        let row = Row::parse(&old)?;
        for i in 0..row.len() as usize {
            let view = RecordView::read(row.record(i)?)?;
            let v1 = MessageRecordV1 {
                session: view.session().0,
                seq: view.seq(),
                role: view.role(),
                created_at: view.created_at(),
                token_count: view.token_count(),
                source: view.source(),
                parts: view.parts()?,
                source_key: view.source_key()?.map(str::to_owned),
                has_original: view.has_original(),
            };
            table.insert(key + i as u64, codec::encode(&v1).as_slice())?;
            written += 1;
        }
    }
    Ok(written)
}
