//! `Store::vacuum` (`lcm vacuum`): the store file loses its free pages, nothing stored changes,
//! and a read-only store refuses it with nothing changed.

use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::search::DataDir;
use lcm::store::StoreError;
use lcm::store::integrity::check;
use lcm::{MessageId, SessionId};

/// Messages appended to many sessions in turn, in several batches: inserts in the middle of the
/// session index split its pages, and every commit frees the pages it copied.
fn fragmented(dir: &std::path::Path) -> Vec<(SessionId, String)> {
    let data = DataDir::open(dir, &Config::default()).unwrap();
    let sessions: Vec<SessionId> = (0..20)
        .map(|i| data.store.create_session(&format!("s{i}"), None).unwrap())
        .collect();
    let mut written = Vec::new();
    for round in 0..30 {
        for (k, &session) in sessions.iter().enumerate() {
            let batch: Vec<NewMessage> = (0..10)
                .map(|i| {
                    let text = format!("round {round} session {k} message {i} {}", "x".repeat(300));
                    written.push((session, text.clone()));
                    NewMessage::text(Role::User, text)
                })
                .collect();
            data.store.append_batch(session, batch).unwrap();
        }
    }
    written
}

#[test]
fn vacuum_shrinks_the_file_and_changes_nothing_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let written = fragmented(tmp.path());
    let mut data = DataDir::open(tmp.path(), &Config::default()).unwrap();
    let stats = data.store.stats().unwrap();
    let sessions = data.store.sessions().unwrap();

    let file_size = || {
        std::fs::metadata(tmp.path().join("lcm.redb"))
            .unwrap()
            .len()
    };
    let size_before = file_size();
    let (before, after) = std::sync::Arc::get_mut(&mut data.store)
        .unwrap()
        .vacuum()
        .unwrap();
    assert_eq!(before, size_before);
    assert!(after < before, "{before} -> {after} bytes");
    assert_eq!(file_size(), after);

    assert_eq!(data.store.stats().unwrap().messages, stats.messages);
    assert_eq!(data.store.sessions().unwrap(), sessions);
    for (id, (session, text)) in written.iter().enumerate() {
        let m = data.store.message(MessageId(id as u64)).unwrap();
        assert_eq!(m.session, *session);
        assert_eq!(m.search_text(), text.as_str());
    }
    let report = check(&data.store, None).unwrap();
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    // Still writable after, and again after reopening.
    let s = sessions[0].id;
    data.store
        .append(s, NewMessage::text(Role::User, "after vacuum"))
        .unwrap();
    drop(data);
    let data = DataDir::open(tmp.path(), &Config::default()).unwrap();
    assert_eq!(data.store.stats().unwrap().messages, stats.messages + 1);
}

#[test]
fn a_read_only_store_refuses_vacuum_and_keeps_every_byte() {
    let tmp = tempfile::tempdir().unwrap();
    fragmented(tmp.path());
    let file = tmp.path().join("lcm.redb");
    let bytes = std::fs::read(&file).unwrap();
    {
        let mut data = DataDir::open_read_only(tmp.path(), &Config::default()).unwrap();
        let err = std::sync::Arc::get_mut(&mut data.store)
            .unwrap()
            .vacuum()
            .unwrap_err();
        assert!(matches!(err, StoreError::ReadOnly), "{err}");
    }
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
}
