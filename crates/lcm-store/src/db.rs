//! The redb handle behind a [`Store`](crate::Store): writable, or read-only.
//!
//! A writable redb `Database` commits on open and again on close (its recovery flag and its
//! allocator state: four to six fsyncs for one open and close, strace). One-shot readers
//! (`lcm grep`, `show`, `sessions`, `stats`) open the file read-only instead, which writes
//! nothing.
//!
//! After an I/O error (a full disk, a failing write or sync), redb refuses every later operation
//! of that `Database` with `PreviousIo`, reads included, until it is closed and opened again.
//! A writable store opened from a file therefore watches its file's I/O ([`Watched`]) and keeps
//! the way to open it ([`Reopen`]): the first transaction after a failed I/O closes the
//! database and opens it again (redb recovers it from its last durable commit), then runs. While the disk is still full the
//! reopen fails with the disk's error and the next transaction tries again; once space
//! returns, the store works again without a restart. Nothing acknowledged is lost: a commit
//! either was durable before the error or failed with it.

use std::fmt;
use std::io;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

use redb::{
    BackendError, Database, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, StorageBackend,
    StorageError, TransactionError, WriteTransaction,
};

use crate::error::{Result, StoreError};

/// Opens the store's file again (a writable database after an I/O error), with the flag its
/// [`Watched`] backend raises on an I/O error.
pub(crate) type Reopen = Box<dyn Fn() -> Result<(Database, Arc<AtomicBool>)> + Send + Sync>;

/// How long a reopen after an I/O error waits for the failed database's holders.
const REOPEN_PATIENCE: Duration = Duration::from_secs(5);

/// How long an open waits for a file found held before it reports [`StoreError::AlreadyOpen`].
///
/// The lock of a file this process closed a moment ago can outlive the close: a child process
/// forked meanwhile by any thread (an agent host running a tool, a test spawning a binary)
/// shares the closed file's description, and with it the lock, until the child executes its
/// program. An open in that window finds the file held by nobody that is still running.
pub(crate) const OPEN_PATIENCE: Duration = Duration::from_secs(1);

/// Calls `open` until it stops failing with [`StoreError::AlreadyOpen`] or `deadline` passes,
/// and returns its last result.
pub(crate) fn retry_while_held<T>(
    deadline: Instant,
    mut open: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut pause = Duration::from_millis(1);
    loop {
        match open() {
            Err(StoreError::AlreadyOpen(_)) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// An open store file.
pub(crate) enum Db {
    Writable(Writable),
    ReadOnly(ReadOnlyDatabase),
}

/// A writable database, opened again after an I/O error when it knows how (see the module
/// docs). `None` while a reopen failed (the next transaction tries again).
pub(crate) struct Writable {
    db: RwLock<Option<Handle>>,
    reopen: Option<Reopen>,
    /// How long a reopen waits for the failed database to let go of the file.
    patience: Duration,
}

/// A database and whether an I/O of its file failed (then redb refuses it from then on).
#[derive(Clone)]
struct Handle {
    db: Arc<Database>,
    failed: Arc<AtomicBool>,
}

impl Writable {
    /// `db`, whose backend raises `failed` on an I/O error, opened again by `reopen` after one
    /// (never, in memory).
    pub(crate) fn new(db: Database, failed: Arc<AtomicBool>, reopen: Option<Reopen>) -> Writable {
        Writable {
            db: RwLock::new(Some(Handle {
                db: Arc::new(db),
                failed,
            })),
            reopen,
            patience: REOPEN_PATIENCE,
        }
    }

    /// The database now (the lock is not held while a transaction begins: `begin_write` waits
    /// for the previous write transaction).
    fn current(&self) -> Option<Handle> {
        self.db.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Option<Handle>> {
        self.db.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `begin` on the database; after an I/O error of its file (or while no database is
    /// open after a failed reopen), opens the file again first.
    fn begin<T>(&self, begin: impl Fn(&Database) -> Result<T, TransactionError>) -> Result<T> {
        if let Some(handle) = self.current()
            && (self.reopen.is_none() || !handle.failed.load(Ordering::Acquire))
        {
            match begin(&handle.db) {
                Err(TransactionError::Storage(StorageError::PreviousIo))
                    if self.reopen.is_some() => {}
                other => return other.map_err(StoreError::from),
            }
        }
        self.reopen()?;
        match self.current() {
            Some(handle) => begin(&handle.db).map_err(StoreError::from),
            None => Err(StoreError::CommitFailed {
                detail: "the store could not be opened again after an I/O error".into(),
                disk_full: false,
            }),
        }
    }

    /// Closes the database whose file failed and opens the file again (unless another thread
    /// already did).
    fn reopen(&self) -> Result<()> {
        let Some(reopen) = &self.reopen else {
            return Err(StoreError::Database(redb::Error::PreviousIo));
        };
        let mut slot = self.write();
        // Another thread may have reopened it meanwhile.
        if slot
            .as_ref()
            .is_some_and(|h| !h.failed.load(Ordering::Acquire))
        {
            return Ok(());
        }
        // Closed first: the file's lock must be free for the new handle. Threads beginning a
        // transaction hold the old handle for a moment.
        let deadline = Instant::now() + self.patience;
        if let Some(old) = slot.take() {
            let db = old.db;
            while Arc::strong_count(&db) > 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(db);
        }
        tracing::warn!("reopening the store after an I/O error");
        // redb closes a database only once its write transaction ends: one begun before the
        // failure keeps the file locked until it fails or is dropped, and the open meanwhile
        // finds the file "already open".
        let (db, failed) = match retry_while_held(deadline, reopen) {
            // The holder is most likely this process's own failed database, which the
            // caller cannot stop: a failure of the storage, not a conflict to resolve.
            Err(StoreError::AlreadyOpen(path)) => {
                return Err(StoreError::CommitFailed {
                    detail: format!(
                        "the store {path} could not be opened again after an I/O error: its file is still held (by a transaction of the failed database, or another process)"
                    ),
                    disk_full: false,
                });
            }
            other => other?,
        };
        *slot = Some(Handle {
            db: Arc::new(db),
            failed,
        });
        Ok(())
    }
}

/// The store file's backend with a flag raised on any failed I/O: redb refuses a database
/// after one, and the store then opens the file again (see the module docs).
pub(crate) struct Watched<B> {
    pub(crate) inner: B,
    pub(crate) failed: Arc<AtomicBool>,
}

impl<B> Watched<B> {
    fn watch<T>(&self, result: io::Result<T>) -> io::Result<T> {
        if result.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        result
    }
}

impl<B: fmt::Debug> fmt::Debug for Watched<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("inner", &self.inner)
            .field("failed", &self.failed.load(Ordering::Relaxed))
            .finish()
    }
}

impl<B: StorageBackend> StorageBackend for Watched<B> {
    fn len(&self) -> io::Result<u64> {
        self.watch(self.inner.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.watch(self.inner.read(offset, out))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.watch(self.inner.set_len(len))
    }

    fn sync_data(&self) -> io::Result<()> {
        self.watch(self.inner.sync_data())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.watch(self.inner.write(offset, data))
    }

    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }

    fn try_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> std::result::Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

impl Db {
    /// A read snapshot.
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction> {
        match self {
            Db::Writable(db) => db.begin(Database::begin_read),
            Db::ReadOnly(db) => Ok(db.begin_read()?),
        }
    }

    /// The one write transaction; refused on a read-only store, before anything is written.
    pub(crate) fn begin_write(&self) -> Result<WriteTransaction> {
        match self {
            Db::Writable(db) => db.begin(Database::begin_write),
            Db::ReadOnly(_) => Err(StoreError::ReadOnly),
        }
    }

    /// Compacts the file until nothing more can be moved; refused on a read-only store.
    pub(crate) fn compact(&mut self) -> Result<()> {
        match self {
            Db::Writable(w) => {
                // Through a transaction first: a database refused by an earlier I/O error is
                // opened again.
                drop(w.begin(Database::begin_read)?);
                let mut guard = w.write();
                let Some(db) = guard.as_mut().and_then(|h| Arc::get_mut(&mut h.db)) else {
                    return Err(StoreError::Database(redb::Error::PreviousIo));
                };
                while db.compact()? {}
                Ok(())
            }
            Db::ReadOnly(_) => Err(StoreError::ReadOnly),
        }
    }

    pub(crate) fn is_read_only(&self) -> bool {
        matches!(self, Db::ReadOnly(_))
    }

    /// Marks the writable database as failed, as an I/O error of its file does.
    #[cfg(test)]
    pub(crate) fn raise_failed_for_test(&self) {
        if let Db::Writable(w) = self
            && let Some(handle) = w.current()
        {
            handle.failed.store(true, Ordering::Release);
        }
    }

    /// How long a reopen waits for the failed database's holders (5 s otherwise).
    #[cfg(test)]
    pub(crate) fn set_reopen_patience(&mut self, patience: Duration) {
        if let Db::Writable(w) = self {
            w.patience = patience;
        }
    }
}
