//! A disk that can be made full or failing, for tests of what a failing disk does to the layers
//! above the store (the runtime's group commit, the HTTP API). Not part of the API: hidden from
//! the docs.
//!
//! [`Store::open_on_faulty_disk`] opens a store as [`Store::open`] does, with one difference:
//! once [`DiskSwitch::fill`] is called, every write, growth and sync of the file fails with
//! `ENOSPC`, as on a full disk; after [`DiskSwitch::fail_writes`] every write, growth and sync
//! fails with `EIO`, as on a failing disk; after [`DiskSwitch::fail_syncs`] only syncs fail
//! with `EIO` (the writes reach the page cache, never the disk). [`DiskSwitch::free`] makes the
//! disk healthy again.

use std::fmt;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use redb::{BackendError, StorageBackend};

use crate::error::Result;
use crate::store::{Store, StoreOptions};

/// `ENOSPC`: no space left on device.
const NO_SPACE: i32 = 28;
/// `EIO`: input/output error.
const IO_ERROR: i32 = 5;

const HEALTHY: u8 = 0;
const FULL: u8 = 1;
const FAILING: u8 = 2;
const FAILING_SYNCS: u8 = 3;

/// Makes the disk of a store opened with [`Store::open_on_faulty_disk`] full, failing or
/// healthy again.
#[derive(Debug, Clone, Default)]
pub struct DiskSwitch(Arc<AtomicU8>);

impl DiskSwitch {
    /// Every write, growth and sync fails with `ENOSPC` from now on.
    pub fn fill(&self) {
        self.0.store(FULL, Ordering::SeqCst);
    }

    /// Every write, growth and sync fails with `EIO` from now on.
    pub fn fail_writes(&self) {
        self.0.store(FAILING, Ordering::SeqCst);
    }

    /// Every sync fails with `EIO` from now on (writes succeed).
    pub fn fail_syncs(&self) {
        self.0.store(FAILING_SYNCS, Ordering::SeqCst);
    }

    /// Writes and syncs succeed again.
    pub fn free(&self) {
        self.0.store(HEALTHY, Ordering::SeqCst);
    }

    /// Whether the disk is full now.
    pub fn is_full(&self) -> bool {
        self.0.load(Ordering::SeqCst) == FULL
    }

    /// The error of a write or growth now, if any.
    fn check(&self) -> io::Result<()> {
        match self.0.load(Ordering::SeqCst) {
            FULL => Err(io::Error::from_raw_os_error(NO_SPACE)),
            FAILING => Err(io::Error::from_raw_os_error(IO_ERROR)),
            _ => Ok(()),
        }
    }

    /// The error of a sync now, if any.
    fn check_sync(&self) -> io::Result<()> {
        match self.0.load(Ordering::SeqCst) {
            FAILING_SYNCS => Err(io::Error::from_raw_os_error(IO_ERROR)),
            _ => self.check(),
        }
    }
}

/// A storage backend whose writes fail while its switch says the disk is full.
struct FaultyDisk<B> {
    inner: B,
    switch: DiskSwitch,
}

impl<B: StorageBackend> StorageBackend for FaultyDisk<B> {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        // Growing needs space; shrinking does not.
        if len > self.inner.len()? {
            self.switch.check()?;
        }
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.switch.check_sync()?;
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.switch.check()?;
        self.inner.write(offset, data)
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

impl<B: fmt::Debug> fmt::Debug for FaultyDisk<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyDisk")
            .field("inner", &self.inner)
            .field("full", &self.switch.is_full())
            .finish()
    }
}

impl Store {
    /// Opens the store at `path` as [`Store::open`] does, on a disk `switch` can make full.
    pub fn open_on_faulty_disk(
        path: impl AsRef<Path>,
        options: StoreOptions,
        switch: DiskSwitch,
    ) -> Result<Store> {
        Store::open_with(path.as_ref(), options, move |inner| FaultyDisk {
            inner,
            switch: switch.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StoreError;
    use lcm_core::ids::SessionId;
    use lcm_core::message::{NewMessage, Role};
    use lcm_core::tokens::{Encoding, TokenCounter};

    /// The texts of `session`'s messages, in order.
    fn texts(store: &Store, session: SessionId) -> Vec<String> {
        store
            .session_messages(session, 0..10)
            .unwrap()
            .iter()
            .map(|m| m.search_text().into_owned())
            .collect()
    }

    /// A store on a healthy faulty disk at `path` with one session holding "kept".
    fn store_with_one_message(path: &Path) -> (Store, SessionId) {
        let options = StoreOptions::new(TokenCounter::new(Encoding::O200kBase));
        let store = Store::open_on_faulty_disk(path, options, DiskSwitch::default()).unwrap();
        let session = store.create_session("s", None).unwrap();
        store
            .append(session, NewMessage::text(Role::User, "kept"))
            .unwrap();
        (store, session)
    }

    /// After a full or failing disk fails a commit (redb then refuses the database until it is
    /// opened again), the same store handle works again once the disk is healthy: it reopens
    /// its file, keeps every message acknowledged before, and passes the integrity check.
    #[test]
    fn the_same_store_works_again_once_the_disk_is_healthy() {
        type Fail = fn(&DiskSwitch);
        let modes: [(&str, Fail, bool); 3] = [
            ("full", DiskSwitch::fill, true),
            ("failing writes", DiskSwitch::fail_writes, false),
            ("failing syncs", DiskSwitch::fail_syncs, false),
        ];
        for (mode, fail, full) in modes {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("lcm.redb");
            let options = || StoreOptions::new(TokenCounter::new(Encoding::O200kBase));
            let switch = DiskSwitch::default();
            let store = Store::open_on_faulty_disk(&path, options(), switch.clone()).unwrap();
            let session = store.create_session("s", None).unwrap();
            store
                .append(session, NewMessage::text(Role::User, "kept"))
                .unwrap();
            fail(&switch);
            let error = store
                .append(session, NewMessage::text(Role::User, "refused"))
                .expect_err(mode);
            assert!(error.is_storage_failure(), "{mode}: {error}");
            assert_eq!(error.is_disk_full(), full, "{mode}: {error}");
            // Still failing: the store tries to reopen and says why it cannot.
            let again = store
                .append(session, NewMessage::text(Role::User, "refused again"))
                .expect_err(mode);
            assert!(again.is_storage_failure(), "{mode}: {again}");
            switch.free();
            store
                .append(session, NewMessage::text(Role::User, "after"))
                .unwrap_or_else(|e| panic!("{mode}: the store works again: {e}"));
            // Every acknowledged message, in order. A commit whose writes reached the file but
            // whose sync failed was never acknowledged, and a disk may still have kept it (as
            // a real one may after a failed fsync): only then may it be found.
            let check = |found: Vec<String>, when: &str| {
                let acknowledged: Vec<&String> =
                    found.iter().filter(|t| !t.starts_with("refused")).collect();
                assert_eq!(acknowledged, ["kept", "after"], "{mode} {when}: {found:?}");
                if mode != "failing syncs" {
                    assert_eq!(found.len(), 2, "{mode} {when}: {found:?}");
                }
            };
            check(texts(&store, session), "after the failure");
            let report = crate::integrity::check(&store, None).unwrap();
            assert!(report.is_clean(), "{mode}: {:?}", report.violations);
            drop(store);
            let store = Store::open(&path, options()).unwrap();
            check(texts(&store, session), "after reopening");
        }
    }

    /// A write transaction of the failed database may still be running when another thread
    /// opens the file again (redb closes a database only once its write transaction ends, and
    /// until then the file stays locked). The reopen waits for it instead of reporting the
    /// store as open in another process, and the other thread's append is stored.
    #[test]
    fn a_reopen_waits_for_a_write_transaction_of_the_failed_database() {
        let dir = tempfile::tempdir().unwrap();
        let (store, session) = store_with_one_message(&dir.path().join("lcm.redb"));
        let held = store.db.begin_write().unwrap();
        // What a failed write of another transaction leaves: the flag raised while this one
        // still runs.
        store.db.raise_failed_for_test();
        let appended = std::thread::scope(|scope| {
            let append =
                scope.spawn(|| store.append(session, NewMessage::text(Role::User, "after")));
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(held);
            append.join().unwrap()
        });
        appended.unwrap_or_else(|e| panic!("the append waits for the reopen: {e}"));
        assert_eq!(texts(&store, session), ["kept", "after"]);
    }

    /// A file still held when the reopen gives up is a failure of the store's storage (the
    /// HTTP API's 503), not "open in another process": the holder is this process's own
    /// failed database, which the caller cannot stop. Nothing is stored, and the store works
    /// once the holder lets go.
    #[test]
    fn a_file_still_held_after_the_reopens_deadline_is_a_storage_failure() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, session) = store_with_one_message(&dir.path().join("lcm.redb"));
        store
            .db
            .set_reopen_patience(std::time::Duration::from_millis(300));
        let held = store.db.begin_write().unwrap();
        store.db.raise_failed_for_test();
        let error = store
            .append(session, NewMessage::text(Role::User, "refused"))
            .expect_err("the file is held past the deadline");
        assert!(error.is_storage_failure(), "{error}");
        assert!(!matches!(error, StoreError::AlreadyOpen(_)), "{error}");
        assert!(error.to_string().contains("still held"), "{error}");
        drop(held);
        store
            .append(session, NewMessage::text(Role::User, "after"))
            .unwrap();
        assert_eq!(texts(&store, session), ["kept", "after"]);
    }

    #[test]
    fn a_full_disk_fails_the_commit_and_keeps_what_was_committed_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let options = || StoreOptions::new(TokenCounter::new(Encoding::O200kBase));
        let switch = DiskSwitch::default();
        {
            let store = Store::open_on_faulty_disk(&path, options(), switch.clone()).unwrap();
            let session = store.create_session("s", None).unwrap();
            store
                .append(session, NewMessage::text(Role::User, "kept"))
                .unwrap();
            switch.fill();
            let failed = store.append(session, NewMessage::text(Role::User, "lost"));
            assert!(failed.is_err(), "a full disk fails the append");
        }
        let store = Store::open(&path, options()).unwrap();
        let session = store.session_id_for_key("s").unwrap().unwrap();
        let messages = store.session_messages(session, 0..10).unwrap();
        assert_eq!(messages.len(), 1, "the acknowledged message, and only it");
        assert!(messages[0].search_text().contains("kept"));
    }
}
