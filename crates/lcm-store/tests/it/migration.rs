//! A store written by the previous schema (5, message records as bincode of the whole message)
//! opens, migrates to lcm's own record layout and reads exactly as a store written today.
//!
//! `tests/fixtures/schema5/lcm.redb` was written by lcm at commit bf48fd2 (the last build of
//! schema 5): `lcm import examples/transcripts/demo-session.jsonl`, `lcm compact ses_0
//! --budget 700`, an import of `fixture-lcm.jsonl` that failed on its empty last message (the
//! session stays, empty), the same file without that line, `lcm compact ses_1 --budget 300`,
//! `lcm vacuum`. Every part variant, an original per message, packed rows, two summaries.

use std::path::{Path, PathBuf};

use lcm_core::config::Config;
use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_search::{DataDir, GrepMode, GrepRequest, Scope, grep};
use lcm_store::import::{ImportOptions, import_file};
use lcm_store::{Store, StoreError, integrity};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schema5")
}

/// The fixture copied into a fresh data directory.
fn data_dir_with_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixture_dir().join("lcm.redb"),
        dir.path().join(lcm_search::data_dir::STORE_FILE),
    )
    .unwrap();
    dir
}

/// The fixture's inputs imported today, in the same order.
fn written_today(config: &Config) -> (tempfile::TempDir, DataDir) {
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::open(dir.path(), config).unwrap();
    let demo =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/transcripts/demo-session.jsonl");
    for file in [demo, fixture_dir().join("fixture-lcm.jsonl")] {
        import_file(&data.store, &file, &ImportOptions::default(), |_, _| {}).unwrap();
    }
    (dir, data)
}

/// The options the data directory opens the store with.
fn options(config: &Config) -> lcm_store::StoreOptions {
    lcm_store::StoreOptions::from_config(config)
}

fn part_kind(part: &lcm_core::message::Part) -> &'static str {
    use lcm_core::message::Part;
    match part {
        Part::Text { .. } => "text",
        Part::Reasoning { .. } => "reasoning",
        Part::ToolCall { .. } => "tool_call",
        Part::ToolResult { .. } => "tool_result",
        Part::File { .. } => "file",
        Part::Binary { .. } => "binary",
        Part::Opaque { .. } => "opaque",
    }
}

#[test]
fn a_read_only_open_of_a_schema_5_store_says_what_to_do_and_writes_nothing() {
    let dir = data_dir_with_fixture();
    let path = dir.path().join(lcm_search::data_dir::STORE_FILE);
    let before = std::fs::read(&path).unwrap();
    let config = Config::default();
    let err = Store::open_read_only(&path, options(&config))
        .map(|_| ())
        .expect_err("an older schema needs a writable open");
    assert!(
        matches!(
            err,
            StoreError::OlderSchema {
                found: 5,
                current: 6,
                ..
            }
        ),
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("schema 5"), "{message}");
    assert!(message.contains("writable open upgrades it"), "{message}");
    assert!(std::fs::read(&path).unwrap() == before, "nothing written");
}

#[test]
fn a_schema_5_store_migrates_and_reads_as_a_store_written_today() {
    let config = Config::default();
    let dir = data_dir_with_fixture();
    let migrated = DataDir::open(dir.path(), &config).unwrap();
    let (_today_dir, today) = written_today(&config);

    // Every invariant holds, the index (rebuilt beside it) included.
    let report = integrity::check(&migrated.store, Some(migrated.index.as_ref())).unwrap();
    assert!(report.is_clean(), "{report:#?}");

    // Every message, and its original, as today's code writes them.
    let sessions: Vec<SessionId> = today
        .store
        .sessions()
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(sessions, vec![SessionId(0), SessionId(1)]);
    let (old, new) = (
        migrated.store.reader().unwrap(),
        today.store.reader().unwrap(),
    );
    let mut compared = 0;
    for session in sessions {
        let want = new.session_messages(session, 0..u64::MAX).unwrap();
        let got = old.session_messages(session, 0..u64::MAX).unwrap();
        assert_eq!(got, want, "{session}");
        for m in &want {
            assert_eq!(
                old.original(m.id).unwrap(),
                new.original(m.id).unwrap(),
                "{}",
                m.id
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 29);
    let kinds: std::collections::BTreeSet<&str> = old
        .session_messages(SessionId(1), 0..u64::MAX)
        .unwrap()
        .iter()
        .flat_map(|m| m.parts.iter().map(part_kind))
        .collect();
    assert_eq!(
        kinds.len(),
        7,
        "every part variant is in the fixture: {kinds:?}"
    );

    // The summaries and their sources survive as they were.
    for (id, session, sources) in [(0, 0, 20), (1, 1, 4)] {
        let summary = migrated.store.summary(SummaryId(id)).unwrap();
        assert_eq!(summary.session, SessionId(session));
        assert_eq!(summary.sources.len(), sources);
    }

    // Search finds what it found before the migration.
    let request = GrepRequest {
        pattern: "cannot find".into(),
        mode: GrepMode::Regex,
        scope: Scope::default(),
        limit: None,
        cursor: None,
    };
    let page = grep(&migrated.store, &migrated.index, &config.search, &request).unwrap();
    let hits: Vec<MessageId> = page.hits.iter().map(|h| h.message).collect();
    assert_eq!(hits, vec![MessageId(27)]);

    // It takes appends, and a read-only open now reads it.
    let next = migrated
        .store
        .append(
            SessionId(1),
            lcm_core::message::NewMessage::text(lcm_core::message::Role::User, "after"),
        )
        .unwrap();
    assert_eq!(next.id, MessageId(29));
    drop(migrated);
    let path = dir.path().join(lcm_search::data_dir::STORE_FILE);
    let reopened = Store::open_read_only(&path, options(&config)).unwrap();
    assert_eq!(
        reopened.message(MessageId(29)).unwrap().search_text(),
        "after"
    );
}
