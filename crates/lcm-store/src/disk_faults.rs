//! A disk that can be made full, for tests of what a failing disk does to the layers above the
//! store (the runtime's group commit, the HTTP API). Not part of the API: hidden from the docs.
//!
//! [`Store::open_on_faulty_disk`] opens a store as [`Store::open`] does, with one difference:
//! once [`DiskSwitch::fill`] is called, every write, growth and sync of the file fails with
//! `ENOSPC`, as on a full disk, until [`DiskSwitch::free`].

use std::fmt;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::{BackendError, StorageBackend};

use crate::error::Result;
use crate::store::{Store, StoreOptions};

/// `ENOSPC`: no space left on device.
const NO_SPACE: i32 = 28;

/// Makes the disk of a store opened with [`Store::open_on_faulty_disk`] full or free again.
#[derive(Debug, Clone, Default)]
pub struct DiskSwitch(Arc<AtomicBool>);

impl DiskSwitch {
    /// Every write, growth and sync fails from now on.
    pub fn fill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Writes succeed again.
    pub fn free(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Whether the disk is full now.
    pub fn is_full(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn check(&self) -> io::Result<()> {
        if self.is_full() {
            Err(io::Error::from_raw_os_error(NO_SPACE))
        } else {
            Ok(())
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
        self.switch.check()?;
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
        Store::open_with(path.as_ref(), options, |inner| FaultyDisk { inner, switch })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::message::{NewMessage, Role};
    use lcm_core::tokens::{Encoding, TokenCounter};

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
