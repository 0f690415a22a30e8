//! The redb handle behind a [`Store`](crate::Store): writable, or read-only.
//!
//! A writable redb `Database` commits on open and again on close (its recovery flag and its
//! allocator state: four to six fsyncs for one open and close, strace). One-shot readers
//! (`lcm grep`, `show`, `sessions`, `stats`) open the file read-only instead, which writes
//! nothing.

use redb::{Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, WriteTransaction};

use crate::error::{Result, StoreError};

/// An open store file.
pub(crate) enum Db {
    Writable(Database),
    ReadOnly(ReadOnlyDatabase),
}

impl Db {
    /// A read snapshot.
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction> {
        Ok(match self {
            Db::Writable(db) => db.begin_read()?,
            Db::ReadOnly(db) => db.begin_read()?,
        })
    }

    /// The one write transaction; refused on a read-only store, before anything is written.
    pub(crate) fn begin_write(&self) -> Result<WriteTransaction> {
        match self {
            Db::Writable(db) => Ok(db.begin_write()?),
            Db::ReadOnly(_) => Err(StoreError::ReadOnly),
        }
    }

    /// Compacts the file until nothing more can be moved; refused on a read-only store.
    pub(crate) fn compact(&mut self) -> Result<()> {
        match self {
            Db::Writable(db) => {
                while db.compact()? {}
                Ok(())
            }
            Db::ReadOnly(_) => Err(StoreError::ReadOnly),
        }
    }

    pub(crate) fn is_read_only(&self) -> bool {
        matches!(self, Db::ReadOnly(_))
    }
}
