//! What the index directory promises after a crash (docs/RELIABILITY.md, "Power loss"): it is
//! derived data, rebuilt or caught up from the store. Whatever a crash leaves of it (an older
//! commit than the store knows, as when its last commits never reached the disk, or files of
//! its newest commits truncated or gone, as when their unsynced data was lost), reopening the
//! data directory and catching up gives an index whose watermark is the store's end, and
//! full-text search and grep find every stored message; the integrity check, index included,
//! is clean. (SIGKILL during indexing: the crash campaign, which reopens the data directory
//! of every killed child and searches for its acknowledged messages.)

use std::path::{Path, PathBuf};

use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::search::data_dir::INDEX_DIR;
use lcm::store::integrity;
use lcm::{DataDir, GrepMode, GrepRequest, MessageId, Scope};

fn text(n: u64) -> String {
    format!("message {n} about widget zq{n}x and its flaky test")
}

/// A data directory with 6 batches of 50 messages, the index caught up after each; returns the
/// ids and a copy of the index directory as it was after the second batch.
fn build(root: &Path) -> (Vec<MessageId>, PathBuf) {
    let data = root.join("data");
    let dir = DataDir::open(&data, &Config::default()).unwrap();
    let session = dir.store.ensure_session("s").unwrap();
    let mut ids = Vec::new();
    let snapshot = root.join("index-after-batch-2");
    for batch in 0..6u64 {
        let messages = (batch * 50..(batch + 1) * 50)
            .map(|n| NewMessage::text(Role::User, text(n)))
            .collect();
        for r in dir.store.append_batch(session, messages).unwrap() {
            ids.push(r.id);
        }
        dir.index.catch_up(&*dir.store, |_, _| {}).unwrap();
        if batch == 1 {
            // Merges done, the files stop changing: the copy is one commit's directory.
            dir.index.finish_merges().unwrap();
            copy_dir(&data.join(INDEX_DIR), &snapshot);
        }
    }
    dir.index.finish_merges().unwrap();
    (ids, snapshot)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Files under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Reopens the data directory, catches the index up and checks that it covers every message.
fn reopen_and_check(root: &Path, ids: &[MessageId], what: &str) {
    let dir = DataDir::open(root.join("data"), &Config::default())
        .unwrap_or_else(|e| panic!("{what}: the data directory does not reopen: {e}"));
    dir.index.catch_up(&*dir.store, |_, _| {}).unwrap();
    let end = ids.last().unwrap().0 + 1;
    assert_eq!(dir.index.watermark().0, end, "{what}: caught up");
    assert_eq!(
        dir.index.num_docs(),
        ids.len() as u64,
        "{what}: one document each"
    );
    let config = Config::default();
    for (n, id) in ids.iter().enumerate().step_by(7) {
        for mode in [GrepMode::FullText, GrepMode::Regex] {
            let request = GrepRequest {
                pattern: format!("zq{n}x"),
                mode,
                scope: Scope::default(),
                limit: Some(5),
                cursor: None,
            };
            let page = lcm::grep(&*dir.store, &dir.index, &config.search, &request).unwrap();
            assert!(
                page.hits.iter().any(|h| h.message == *id),
                "{what}: {mode:?} search does not find {id}"
            );
        }
    }
    let report = integrity::check(&dir.store, Some(&*dir.index)).unwrap();
    assert!(report.is_clean(), "{what}: {:?}", report.violations);
}

#[test]
fn an_index_older_than_the_store_is_caught_up() {
    let tmp = tempfile::tempdir().unwrap();
    let (ids, snapshot) = build(tmp.path());
    // The index's last four commits never reached the disk: the directory as it was.
    let index = tmp.path().join("data").join(INDEX_DIR);
    std::fs::remove_dir_all(&index).unwrap();
    copy_dir(&snapshot, &index);
    reopen_and_check(tmp.path(), &ids, "rolled back");
}

/// The files of `index` written after `snapshot` (the data of the newest commits, and the
/// commit point itself), relative to `index`, sorted.
fn newer_files(index: &Path, snapshot: &Path) -> Vec<PathBuf> {
    let relative = |root: &Path| -> Vec<PathBuf> {
        files(root)
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
            .collect()
    };
    let old = relative(snapshot);
    relative(index)
        .into_iter()
        .filter(|p| !old.contains(p) || p.ends_with("meta.json"))
        .collect()
}

/// What kind of index file `path` is: its extension (a segment's terms, postings, positions,
/// norms, fast fields, `meta.json`, the trigram segments ...), or its name when it has none.
fn kind(path: &Path) -> String {
    path.extension()
        .or(path.file_name())
        .map(|k| k.to_string_lossy().into_owned())
        .unwrap_or_default()
}

#[test]
fn an_index_whose_newest_files_were_lost_or_truncated_is_rebuilt_or_caught_up() {
    // Each kind of file written after the snapshot, each way a power loss leaves an unsynced
    // file: emptied, cut to half, or deleted. (Segment files are named at random: picking one
    // by position once let a torn positions file through only on some runs.)
    let kinds: std::collections::BTreeSet<String> = {
        let tmp = tempfile::tempdir().unwrap();
        let (_, snapshot) = build(tmp.path());
        let index = tmp.path().join("data").join(INDEX_DIR);
        newer_files(&index, &snapshot)
            .iter()
            .map(|p| kind(p))
            .collect()
    };
    assert!(
        [
            "pos",
            "idx",
            "term",
            "fast",
            "fieldnorm",
            "store",
            "json",
            "tri"
        ]
        .iter()
        .all(|k| kinds.contains(*k)),
        "{kinds:?}"
    );
    for kind_damaged in &kinds {
        for how in ["emptied", "cut to half", "deleted"] {
            let tmp = tempfile::tempdir().unwrap();
            let (ids, snapshot) = build(tmp.path());
            let index = tmp.path().join("data").join(INDEX_DIR);
            let name = newer_files(&index, &snapshot)
                .into_iter()
                .find(|p| kind(p) == *kind_damaged)
                .expect("every build writes the same kinds of file");
            let file = index.join(&name);
            let len = std::fs::metadata(&file).unwrap().len();
            match how {
                "emptied" => std::fs::write(&file, b"").unwrap(),
                "cut to half" => std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .unwrap()
                    .set_len(len / 2)
                    .unwrap(),
                _ => std::fs::remove_file(&file).unwrap(),
            }
            reopen_and_check(tmp.path(), &ids, &format!("{} {how}", name.display()));
        }
    }
}

/// Appends `text(n)` for each `n` of `range` to session "s" and indexes it.
fn append_indexed(dir: &DataDir, range: std::ops::Range<u64>) {
    let session = dir.store.ensure_session("s").unwrap();
    let batch = range
        .map(|n| NewMessage::text(Role::User, text(n)))
        .collect();
    dir.store.append_batch(session, batch).unwrap();
    dir.index.catch_up(&*dir.store, |_, _| {}).unwrap();
}

/// The first five messages `pattern` finds in `mode`, unscoped.
fn found(dir: &DataDir, pattern: String, mode: GrepMode) -> Vec<MessageId> {
    let request = GrepRequest {
        pattern,
        mode,
        scope: Scope::default(),
        limit: Some(5),
        cursor: None,
    };
    lcm::grep(&*dir.store, &dir.index, &Config::default().search, &request)
        .unwrap()
        .hits
        .iter()
        .map(|h| h.message)
        .collect()
}

/// A store restored from a copy older than its index (a backup put back, the index directory
/// left as it was): the index holds messages the store no longer has, under ids the store
/// gives to new messages. Reopening rebuilds it from the store (its watermark cannot be past
/// the store's end), so the new messages are found by full-text search and grep, the ones the
/// restore took away are not, and the integrity check is clean.
#[test]
fn an_index_ahead_of_a_restored_store_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let backup = tmp.path().join("backup.redb");
    let store_file = data.join(lcm::search::data_dir::STORE_FILE);
    {
        let dir = DataDir::open(&data, &Config::default()).unwrap();
        append_indexed(&dir, 0..50);
        drop(dir);
        std::fs::copy(&store_file, &backup).unwrap();
        let dir = DataDir::open(&data, &Config::default()).unwrap();
        append_indexed(&dir, 50..100);
        dir.index.finish_merges().unwrap();
        assert_eq!(dir.index.watermark().0, 100);
    }
    std::fs::copy(&backup, &store_file).unwrap();
    let dir = DataDir::open(&data, &Config::default()).unwrap();
    assert!(
        dir.index.watermark().0 <= 50,
        "the index's watermark is past the restored store's end: {}",
        dir.index.watermark().0
    );
    // New messages take the ids 50.. again, with other words.
    let session = dir.store.ensure_session("s").unwrap();
    let fresh: Vec<MessageId> = dir
        .store
        .append_batch(
            session,
            (0..20)
                .map(|n| NewMessage::text(Role::User, format!("after the restore, note rq{n}y")))
                .collect(),
        )
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(fresh[0].0, 50);
    dir.index.catch_up(&*dir.store, |_, _| {}).unwrap();
    assert_eq!(dir.index.num_docs(), 70);
    let find = |pattern: String, mode| found(&dir, pattern, mode);
    for mode in [GrepMode::FullText, GrepMode::Regex] {
        for (n, id) in fresh.iter().enumerate() {
            assert_eq!(find(format!("rq{n}y"), mode), [*id], "{mode:?}");
        }
        // What the restore took away is gone from the index too.
        assert_eq!(find("zq75x".into(), mode), [], "{mode:?}");
        assert_eq!(find("zq7x".into(), mode), [MessageId(7)], "{mode:?}");
    }
    let report = integrity::check(&dir.store, Some(&*dir.index)).unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
}

/// A data directory whose store file was replaced by another store with more messages (the
/// index directory left as it was): the index's ids now stand for other texts, so it would
/// hide the store's own messages from full-text search and grep. The last indexed message's
/// fingerprint does not match the store's: reopening rebuilds the index, and every message of
/// the new store is found, none of the old. Reopening beside its own store keeps the index.
#[test]
fn an_index_beside_a_replaced_store_is_rebuilt() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let other = tmp.path().join("other");
    let config = Config::default();
    {
        let dir = DataDir::open(&data, &config).unwrap();
        append_indexed(&dir, 0..50);
        dir.index.finish_merges().unwrap();
    }
    // Beside its own store the index is kept as it is: nothing to catch up.
    {
        let dir = DataDir::open(&data, &config).unwrap();
        assert_eq!(dir.index.watermark().0, 50);
        assert_eq!(dir.index.catch_up(&*dir.store, |_, _| {}).unwrap(), 0);
    }
    {
        let dir = DataDir::open(&other, &config).unwrap();
        let session = dir.store.ensure_session("t").unwrap();
        let theirs = (0..80)
            .map(|n| NewMessage::text(Role::User, format!("another store's note rq{n}y")))
            .collect();
        dir.store.append_batch(session, theirs).unwrap();
    }
    let store_file = lcm::search::data_dir::STORE_FILE;
    std::fs::copy(other.join(store_file), data.join(store_file)).unwrap();
    let dir = DataDir::open(&data, &config).unwrap();
    assert_eq!(
        dir.index.watermark().0,
        0,
        "the index of the replaced store is rebuilt"
    );
    dir.index.catch_up(&*dir.store, |_, _| {}).unwrap();
    assert_eq!(dir.index.num_docs(), 80);
    let find = |pattern: String, mode| found(&dir, pattern, mode);
    for mode in [GrepMode::FullText, GrepMode::Regex] {
        for n in [0u64, 7, 49, 50, 79] {
            assert_eq!(find(format!("rq{n}y"), mode), [MessageId(n)], "{mode:?}");
        }
        assert_eq!(find("zq7x".into(), mode), [], "{mode:?}");
    }
    let report = integrity::check(&dir.store, Some(&*dir.index)).unwrap();
    assert!(report.is_clean(), "{:?}", report.violations);
}
