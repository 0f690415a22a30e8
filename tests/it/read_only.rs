//! Read-only opens (`lcm grep`, `show`, `sessions`, `stats`): they read what a writable open
//! reads, write nothing to the data directory (not even on open or close), refuse every write
//! with a clear error, and fall back to a writable open for a store that needs recovery.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lcm::DataDir;
use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::search::{GrepMode, GrepRequest, Scope, grep};
use lcm::store::{Store, StoreError};

/// Every file under `dir` with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.insert(path.display().to_string(), std::fs::read(&path).unwrap());
        }
    }
    out
}

/// A closed data directory (`<tmp>/data`) with two messages (one unindexed) in session `s`.
fn seeded() -> (tempfile::TempDir, PathBuf) {
    let (tmp, data) = common::temp_data_dir();
    let s = data.store.create_session("s", None).unwrap();
    data.store
        .append(s, NewMessage::text(Role::User, "indexed: the redb file"))
        .unwrap();
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    data.store
        .append(
            s,
            NewMessage::text(Role::Assistant, "unindexed: the redb tail"),
        )
        .unwrap();
    data.index.finish_merges().unwrap();
    drop(data);
    let dir = tmp.path().join("data");
    (tmp, dir)
}

fn request(pattern: &str) -> GrepRequest {
    GrepRequest {
        pattern: pattern.into(),
        mode: GrepMode::Regex,
        scope: Scope::default(),
        limit: None,
        cursor: None,
    }
}

#[test]
fn a_read_only_open_reads_everything_and_writes_no_byte() {
    let (_tmp, dir) = seeded();
    let before = files(dir.as_path());
    {
        let data = DataDir::open_read_only(dir.as_path(), &Config::default()).unwrap();
        assert!(data.store.is_read_only());
        let sessions = data.store.sessions().unwrap();
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0].message_count, 2);
        let page = grep(
            &data.store,
            &data.index,
            &Config::default().search,
            &request("redb (file|tail)"),
        )
        .unwrap();
        // One hit from the index, one from the scan of the unindexed tail.
        assert_eq!(page.hits.len(), 2, "{page:?}");
        let first = data.store.message(page.hits[0].message).unwrap();
        assert_eq!(first.search_text(), "indexed: the redb file");
    }
    assert_eq!(
        files(dir.as_path()),
        before,
        "a read-only open changed a file"
    );
}

#[test]
fn writes_through_a_read_only_store_are_refused_and_change_nothing() {
    let (_tmp, dir) = seeded();
    let before = files(dir.as_path());
    {
        let data = DataDir::open_read_only(dir.as_path(), &Config::default()).unwrap();
        let s = data.store.sessions().unwrap()[0].id;
        let err = data
            .store
            .append(s, NewMessage::text(Role::User, "not stored"))
            .unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly), "{err}");
        assert!(err.to_string().contains("read-only"), "{err}");
        let err = data.store.create_session("other", None).unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly), "{err}");
        let err = data.index.catch_up(&data.store, |_, _| {}).unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly), "{err}");
        let err = data.index.rebuild(&data.store, |_, _| {}).unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly), "{err}");
        assert_eq!(data.store.stats().unwrap().messages, 2);
    }
    assert_eq!(files(dir.as_path()), before);
}

#[test]
fn a_missing_store_is_a_clear_error_read_only_and_created_by_the_data_dir_fallback() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("absent.redb");
    let err = Store::open_read_only(&path, common::store_options()).unwrap_err();
    assert!(
        matches!(&err, StoreError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{err}"
    );
    assert!(err.to_string().contains("absent.redb"), "{err}");
    assert!(!path.exists());

    // A data directory with no store yet is opened writable (as `lcm sessions` on a fresh
    // machine): an empty store, not an error.
    let data = DataDir::open_read_only(tmp.path().join("fresh"), &Config::default()).unwrap();
    assert!(!data.store.is_read_only());
    assert!(data.store.sessions().unwrap().is_empty());
}

#[test]
fn a_store_that_needs_recovery_is_refused_read_only_and_recovered_by_the_fallback() {
    let (_tmp, dir) = seeded();
    // A copy taken while a writable handle is open carries redb's "needs recovery" flag, as the
    // file of a crashed process does.
    let crashed = tempfile::tempdir().unwrap();
    {
        let data = DataDir::open(dir.as_path(), &Config::default()).unwrap();
        std::fs::copy(
            dir.as_path().join("lcm.redb"),
            crashed.path().join("lcm.redb"),
        )
        .unwrap();
        drop(data);
    }
    let err = Store::open_read_only(crashed.path().join("lcm.redb"), common::store_options())
        .unwrap_err();
    assert!(matches!(err, StoreError::NeedsRecovery(_)), "{err}");
    assert!(err.to_string().contains("recovery"), "{err}");

    let data = DataDir::open_read_only(crashed.path(), &Config::default()).unwrap();
    assert!(!data.store.is_read_only());
    assert_eq!(data.store.stats().unwrap().messages, 2);
    // The index was not copied: grep scans and still finds both messages.
    let page = grep(
        &data.store,
        &data.index,
        &Config::default().search,
        &request("redb"),
    )
    .unwrap();
    assert_eq!(page.hits.len(), 2);
}

#[test]
fn a_read_only_open_of_a_store_without_index_scans_and_creates_no_index() {
    let (_tmp, dir) = seeded();
    std::fs::remove_dir_all(dir.as_path().join("index")).unwrap();
    let before = files(dir.as_path());
    {
        let data = DataDir::open_read_only(dir.as_path(), &Config::default()).unwrap();
        assert!(data.store.is_read_only());
        let page = grep(
            &data.store,
            &data.index,
            &Config::default().search,
            &request(r"redb \w+"),
        )
        .unwrap();
        assert_eq!(page.hits.len(), 2);
    }
    assert!(!dir.as_path().join("index").exists());
    assert_eq!(files(dir.as_path()), before);
}

#[test]
fn a_store_held_by_another_handle_is_a_clear_error_for_both_opens() {
    let (_tmp, dir) = seeded();
    let holder = DataDir::open(dir.as_path(), &Config::default()).unwrap();
    for read_only in [true, false] {
        let err = if read_only {
            DataDir::open_read_only(dir.as_path(), &Config::default())
        } else {
            DataDir::open(dir.as_path(), &Config::default())
        }
        .unwrap_err();
        assert!(matches!(err, StoreError::AlreadyOpen(_)), "{err}");
        assert!(err.to_string().contains("lcm serve"), "{err}");
    }
    assert_eq!(holder.store.stats().unwrap().messages, 2);
    drop(holder);
    // Nor can a writer open under a reader: a reindex would cut files (the vector index's)
    // that the reader has mapped.
    let reader = DataDir::open_read_only(dir.as_path(), &Config::default()).unwrap();
    let err = DataDir::open(dir.as_path(), &Config::default()).unwrap_err();
    assert!(matches!(err, StoreError::AlreadyOpen(_)), "{err}");
    assert_eq!(reader.store.stats().unwrap().messages, 2);
}
