//! Bad input gets a clear error and changes nothing stored: malformed JSON lines, invalid UTF-8,
//! an invalid regex, an unknown id, a missing file, a foreign cursor, an empty message.

use crate::common;

use std::io::Write;

use lcm::core::message::{NewMessage, Role};
use lcm::search::{GrepMode, GrepRequest, Scope, grep};
use lcm::store::StoreError;
use lcm::store::import::{ImportError, ImportOptions, import_file};
use lcm::{DataDir, MessageId, SessionId};

/// Everything observable about the store's contents.
fn snapshot(data: &DataDir) -> String {
    let stats = data.store.stats().unwrap();
    let sessions = data.store.sessions().unwrap();
    let next = data.store.next_message_id().unwrap();
    format!(
        "{} {} {} {next} {}",
        stats.sessions,
        stats.messages,
        stats.tokens,
        serde_json::to_string(&sessions).unwrap()
    )
}

fn seeded() -> (tempfile::TempDir, DataDir) {
    let (tmp, data) = common::temp_data_dir();
    let s = data.store.create_session("existing", None).unwrap();
    data.store
        .append(
            s,
            NewMessage::text(Role::User, "a stored message about redb"),
        )
        .unwrap();
    (tmp, data)
}

fn write_file(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(bytes)
        .unwrap();
    path
}

const GOOD: &str = r#"{"session":"imp","role":"user","content":"hello there"}"#;

#[test]
fn malformed_and_non_utf8_lines_are_reported_by_line_and_strict_mode_stores_nothing() {
    let (tmp, data) = seeded();
    let mut bytes = Vec::new();
    bytes.extend_from_slice(GOOD.as_bytes());
    bytes.extend_from_slice(b"\n{\"session\":\"imp\",\"role\":\"user\",\"content\":\"trunc\n");
    bytes.extend_from_slice(
        b"{\"session\":\"imp\",\"role\":\"user\",\"content\":\"bad \xff\xfe\"}\n",
    );
    bytes.extend_from_slice(GOOD.replace("hello", "again").as_bytes());
    let path = write_file(tmp.path(), "bad.jsonl", &bytes);

    let before = snapshot(&data);
    let strict = ImportOptions {
        strict: true,
        ..ImportOptions::default()
    };
    let err = import_file(&data.store, &path, &strict, |_, _| {}).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ImportError::Strict { .. }), "{message}");
    assert!(
        message.contains("line 2") && message.contains("malformed JSON"),
        "{message}"
    );
    assert!(message.contains("nothing was imported"), "{message}");
    assert_eq!(snapshot(&data), before, "strict import changed the store");

    // Lenient: the good lines are stored, the bad ones reported with line numbers and reasons.
    let report = import_file(&data.store, &path, &ImportOptions::default(), |_, _| {}).unwrap();
    assert_eq!(report.imported, 2);
    assert_eq!(report.error_count, 2);
    assert!(
        report.errors[0].contains("line 2: malformed JSON"),
        "{:?}",
        report.errors
    );
    assert!(
        report.errors[1].contains("line 3: invalid UTF-8"),
        "{:?}",
        report.errors
    );
}

#[test]
fn missing_empty_and_unrecognised_files_are_clear_errors() {
    let (tmp, data) = seeded();
    let before = snapshot(&data);
    let err = import_file(
        &data.store,
        &tmp.path().join("nope.jsonl"),
        &ImportOptions::default(),
        |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(err, ImportError::Io { .. }));
    assert!(err.to_string().contains("nope.jsonl"), "{err}");

    let empty = write_file(tmp.path(), "empty.jsonl", b"\n\n");
    let err = import_file(&data.store, &empty, &ImportOptions::default(), |_, _| {}).unwrap_err();
    assert!(matches!(err, ImportError::Empty { .. }), "{err}");

    let odd = write_file(tmp.path(), "odd.jsonl", b"{\"hello\": 1}\n");
    let err = import_file(&data.store, &odd, &ImportOptions::default(), |_, _| {}).unwrap_err();
    assert!(matches!(err, ImportError::UnknownFormat { .. }), "{err}");
    assert_eq!(snapshot(&data), before);
}

#[test]
fn invalid_regex_foreign_cursor_and_bad_limits_are_rejected() {
    let (_tmp, data) = seeded();
    let config = lcm::core::config::SearchConfig::default();
    let request = |pattern: &str, cursor: Option<String>, limit| GrepRequest {
        pattern: pattern.into(),
        mode: GrepMode::Regex,
        scope: Scope::default(),
        limit,
        cursor,
    };
    let err = grep(
        &data.store,
        &data.index,
        &config,
        &request("(unclosed", None, None),
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::InvalidQuery(_)));
    assert!(err.to_string().contains("invalid regex"), "{err}");

    let err = grep(
        &data.store,
        &data.index,
        &config,
        &request("redb", Some("garbage".into()), None),
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::InvalidCursor(_)), "{err}");

    // A cursor of one search used with another.
    for i in 0..3 {
        let s = data.store.ensure_session("existing").unwrap();
        data.store
            .append(s, NewMessage::text(Role::User, format!("redb again {i}")))
            .unwrap();
    }
    let page = grep(
        &data.store,
        &data.index,
        &config,
        &request("redb", None, Some(1)),
    )
    .unwrap();
    let cursor = page.next_cursor.expect("more pages");
    let err = grep(
        &data.store,
        &data.index,
        &config,
        &request("again", Some(cursor), Some(1)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("different search"), "{err}");

    let err = grep(
        &data.store,
        &data.index,
        &config,
        &request("redb", None, Some(0)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
    let err = grep(&data.store, &data.index, &config, &request("", None, None)).unwrap_err();
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn unknown_ids_and_invalid_messages_change_nothing() {
    let (_tmp, data) = seeded();
    let before = snapshot(&data);
    let err = data.store.message(MessageId(999)).unwrap_err();
    assert!(matches!(err, StoreError::MessageNotFound(MessageId(999))));
    assert_eq!(err.to_string(), "no message msg_999 in the store");
    assert!(matches!(
        data.store.session(SessionId(42)),
        Err(StoreError::SessionNotFound(_))
    ));
    assert!("msg_x".parse::<MessageId>().is_err());

    // Appending to a missing session, or an empty message, stores nothing.
    let err = data
        .store
        .append(SessionId(42), NewMessage::text(Role::User, "x"))
        .unwrap_err();
    assert!(matches!(err, StoreError::SessionNotFound(_)), "{err}");
    let s = data.store.ensure_session("existing").unwrap();
    let mut empty = NewMessage::text(Role::User, "x");
    empty.parts.clear();
    let batch = vec![NewMessage::text(Role::User, "fine"), empty];
    let err = data.store.append_batch(s, batch).unwrap_err();
    assert!(err.to_string().contains("message 1 of the batch"), "{err}");
    assert!(matches!(
        data.store.create_session("existing", None),
        Err(StoreError::SessionExists(_))
    ));
    assert_eq!(snapshot(&data), before);
}

#[test]
fn a_line_over_the_length_limit_is_never_read_whole_and_is_reported() {
    let (tmp, data) = seeded();
    let huge = format!(
        r#"{{"session":"imp","role":"tool","content":"{}"}}"#,
        "x".repeat(20_000)
    );
    let text = format!("{GOOD}\n{huge}\n{}\n", GOOD.replace("hello", "again"));
    let path = write_file(tmp.path(), "long.jsonl", text.as_bytes());
    let limited = |strict| ImportOptions {
        strict,
        max_line_bytes: 4_096,
        ..ImportOptions::default()
    };

    let before = snapshot(&data);
    let err = import_file(&data.store, &path, &limited(true), |_, _| {}).unwrap_err();
    assert!(
        matches!(
            err,
            ImportError::LineTooLong {
                line: 2,
                max: 4_096,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("nothing was imported"), "{err}");
    assert_eq!(snapshot(&data), before, "strict import changed the store");

    let report = import_file(&data.store, &path, &limited(false), |_, _| {}).unwrap();
    assert_eq!((report.imported, report.error_count), (2, 1));
    assert!(
        report.errors[0].starts_with("line 2: longer than import.max_line_bytes (4096 bytes)"),
        "{:?}",
        report.errors
    );
    // The same file with room for the line imports all three.
    let roomy = ImportOptions {
        max_line_bytes: 64 * 1024,
        ..ImportOptions::default()
    };
    let again = import_file(&data.store, &path, &roomy, |_, _| {}).unwrap();
    assert_eq!((again.imported, again.already_present), (1, 2));

    // A one-document OpenAI file over the limit is refused before it is read.
    let document = format!("[\n{GOOD},\n{huge}\n]\n");
    let path = write_file(tmp.path(), "doc.json", document.as_bytes());
    let before = snapshot(&data);
    let err = import_file(&data.store, &path, &limited(false), |_, _| {}).unwrap_err();
    assert!(matches!(err, ImportError::DocumentTooLarge { .. }), "{err}");
    assert_eq!(snapshot(&data), before);
}
