//! File records: registered in the append that brings a file read or a large payload, one per
//! distinct content, linked to their messages and propagated through the summary DAG; the
//! messages themselves stay byte for byte as given.

use lcm_core::files::{FileRef, render_file_reference, shown_part};
use lcm_core::ids::{FileId, MessageId};
use lcm_core::message::{NewMessage, Original, Part, Role, SourceFormat};
use lcm_core::summary::{NewSummary, NodeRef, SummaryKind};
use lcm_core::time::Timestamp;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_store::{ApplyOutcome, FileRules, Store, StoreError, StoreOptions};

use crate::common::SummaryRec;

const LARGE: u32 = 2_000;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

/// A counter and file rules whose large-file threshold a test's payloads pass easily.
fn options() -> StoreOptions {
    StoreOptions {
        counter: counter(),
        files: FileRules {
            large_file_tokens: LARGE,
            exploration_max_tokens: 300,
        },
        cache_bytes: StoreOptions::DEFAULT_CACHE_BYTES,
    }
}

fn store() -> Store {
    Store::open_in_memory(options()).unwrap()
}

fn msg(role: Role, parts: Vec<Part>) -> NewMessage {
    NewMessage {
        role,
        parts,
        created_at: Timestamp(1_000),
        original: None,
        source_key: None,
    }
}

fn read_call(id: &str, path: &str) -> Part {
    Part::ToolCall {
        id: id.into(),
        name: "Read".into(),
        arguments: serde_json::json!({ "file_path": path }).to_string(),
    }
}

fn result(id: &str, content: &str) -> Part {
    Part::ToolResult {
        call_id: id.into(),
        content: content.into(),
        is_error: false,
    }
}

/// A CSV of `rows` rows (about 12 tokens a row).
fn csv(rows: usize) -> String {
    let mut out = String::from("id,name,price,date\n");
    for i in 0..rows {
        out.push_str(&format!(
            "{i},item-{i},{}.{:02},2026-03-{:02}\n",
            i % 997,
            i % 100,
            1 + i % 28
        ));
    }
    out
}

#[test]
fn a_large_tool_result_becomes_a_file_record_and_the_message_stays_verbatim() {
    let store = store();
    let s = store.create_session("big", None).unwrap();
    let payload = csv(2_000);
    let original = serde_json::json!({"role": "tool", "content": payload}).to_string();
    let call = store
        .append(
            s,
            msg(Role::Assistant, vec![read_call("c1", "/data/sales.csv")]),
        )
        .unwrap();
    let mut m = msg(Role::Tool, vec![result("c1", &payload)]);
    m.original = Some(Original {
        format: SourceFormat::OpenAiChat,
        bytes: original.clone().into_bytes(),
    });
    let id = store.append(s, m).unwrap().id;

    let reader = store.reader().unwrap();
    let stored = reader.message(id).unwrap();
    assert!(stored.token_count > LARGE, "the payload is large");
    // Counted part by part for its file record, the message's count is the usual one.
    assert_eq!(
        stored.token_count,
        counter().count_message(Role::Tool, &stored.parts)
    );
    assert_eq!(stored.parts, vec![result("c1", &payload)], "parts verbatim");
    assert_eq!(store.original(id).unwrap().bytes, original.as_bytes());

    let files = reader.message_files(id).unwrap().expect("file refs");
    assert_eq!(files.refs.len(), 1);
    let FileRef { part, file, inline } = files.refs[0];
    assert_eq!((part, inline), (0, false), "shown as a reference");
    let info = reader.file(file).unwrap();
    assert_eq!(info.path.as_deref(), Some("/data/sales.csv"));
    assert_eq!(info.kind, "csv");
    assert_eq!(info.byte_len, payload.len() as u64);
    assert_eq!(
        info.token_count as usize,
        counter().count_text(&payload),
        "exact token count of the content"
    );
    assert_eq!(
        info.content_hash,
        lcm_store::files::content_hash(payload.as_bytes())
    );
    assert_eq!(info.content_message, Some(id));
    assert!(info.exploration.contains("2000") || info.exploration.contains("2,000"));
    assert!(info.exploration.contains("price"), "{}", info.exploration);
    // The context pays the reference, counted exactly as a message with the shown part.
    let shown = shown_part(&stored.parts[0], render_file_reference(&info));
    assert_eq!(
        files.context_tokens,
        counter().count_message(Role::Tool, &[shown])
    );
    assert!(files.context_tokens < 800, "{}", files.context_tokens);
    assert_eq!(reader.file_messages(file).unwrap(), vec![id]);
    assert_eq!(
        reader.file_content(&info).unwrap().as_deref(),
        Some(payload.as_str())
    );
    // The call's own message has no file refs (it only names the path).
    assert!(reader.message_files(call.id).unwrap().is_none());
}

#[test]
fn the_same_content_twice_is_one_record_referenced_twice() {
    let store = store();
    let s = store.create_session("twice", None).unwrap();
    let payload = csv(1_500);
    let ids: Vec<MessageId> = store
        .append_batch(
            s,
            vec![
                msg(
                    Role::User,
                    vec![Part::Text {
                        text: payload.clone(),
                    }],
                ),
                msg(
                    Role::User,
                    vec![Part::Text {
                        text: "again:".into(),
                    }],
                ),
                msg(
                    Role::User,
                    vec![Part::Text {
                        text: payload.clone(),
                    }],
                ),
            ],
        )
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    let reader = store.reader().unwrap();
    let first = reader.message_files(ids[0]).unwrap().unwrap().refs[0].file;
    let second = reader.message_files(ids[2]).unwrap().unwrap().refs[0].file;
    assert_eq!(first, second);
    assert_eq!(reader.file_count().unwrap(), 1);
    assert_eq!(reader.file_messages(first).unwrap(), vec![ids[0], ids[2]]);
    assert_eq!(
        reader.file(first).unwrap().path,
        None,
        "a paste has no path"
    );
}

#[test]
fn small_file_reads_get_inline_records_and_other_tools_get_none() {
    let store = store();
    let s = store.create_session("reads", None).unwrap();
    // The call and its result in separate appends, as a live agent writes them.
    store
        .append(
            s,
            msg(
                Role::Assistant,
                vec![
                    read_call("r1", "/src/lib.rs"),
                    Part::ToolCall {
                        id: "b1".into(),
                        name: "Bash".into(),
                        arguments: r#"{"command":"ls -la"}"#.into(),
                    },
                ],
            ),
        )
        .unwrap();
    let code = "pub fn answer() -> u32 {\n    42\n}\n";
    let read = store
        .append(
            s,
            msg(
                Role::Tool,
                vec![result("r1", code), result("b1", "total 0")],
            ),
        )
        .unwrap()
        .id;
    // An error result of a read is not a file's content.
    store
        .append(
            s,
            msg(Role::Assistant, vec![read_call("r2", "/missing.rs")]),
        )
        .unwrap();
    let failed = store
        .append(
            s,
            msg(
                Role::Tool,
                vec![Part::ToolResult {
                    call_id: "r2".into(),
                    content: "File does not exist.".into(),
                    is_error: true,
                }],
            ),
        )
        .unwrap()
        .id;
    let reader = store.reader().unwrap();
    let files = reader.message_files(read).unwrap().unwrap();
    assert_eq!(files.refs.len(), 1, "only the read: {files:?}");
    assert!(files.refs[0].inline, "a small read stays in the context");
    assert_eq!(
        files.context_tokens,
        reader.message(read).unwrap().token_count,
        "inline references change nothing in the context"
    );
    let info = reader.file(files.refs[0].file).unwrap();
    assert_eq!(info.path.as_deref(), Some("/src/lib.rs"));
    assert_eq!(info.kind, "code");
    assert_eq!(info.language.as_deref(), Some("rust"));
    assert_eq!(info.token_count as usize, counter().count_text(code));
    // A small read's summary is computed when asked for (no context shows it by reference).
    assert!(info.exploration.is_empty());
    let (explored, seen) = store.file_explored(&reader, info.id).unwrap();
    assert!(
        explored.exploration.contains("answer"),
        "{}",
        explored.exploration
    );
    assert_eq!(seen.as_deref(), Some(code));
    assert!(reader.message_files(failed).unwrap().is_none());
}

#[test]
fn file_ids_propagate_from_messages_to_leaves_to_condensed_summaries() {
    let store = store();
    let s = store.create_session("dag", None).unwrap();
    let mut ids = Vec::new();
    for i in 0..4 {
        let call = format!("c{i}");
        let path = format!("/p/file{i}.py");
        ids.push(
            store
                .append(s, msg(Role::Assistant, vec![read_call(&call, &path)]))
                .unwrap()
                .id,
        );
        ids.push(
            store
                .append(
                    s,
                    msg(
                        Role::Tool,
                        vec![result(&call, &format!("def f{i}(x):\n    return x\n"))],
                    ),
                )
                .unwrap()
                .id,
        );
    }
    let leaf = |sources: &[MessageId]| NewSummary {
        session: s,
        kind: SummaryKind::Leaf,
        depth: 0,
        content: "read some files".into(),
        token_count: 10,
        sources: sources.iter().map(|m| NodeRef::Message(*m)).collect(),
        level: 3,
        model: "test".into(),
        digest: None,
    };
    let apply = |new: NewSummary| match store.apply_summary(new, Vec::new()).unwrap() {
        ApplyOutcome::Applied { summary, .. } => summary,
        other => panic!("{other:?}"),
    };
    let a = apply(leaf(&ids[..4]));
    let b = apply(leaf(&ids[4..]));
    assert_eq!(a.file_ids, vec![FileId(0), FileId(1)]);
    assert_eq!(b.file_ids, vec![FileId(2), FileId(3)]);
    let top = apply(NewSummary {
        session: s,
        kind: SummaryKind::Condensed,
        depth: 1,
        content: "files".into(),
        token_count: 5,
        sources: vec![NodeRef::Summary(a.id), NodeRef::Summary(b.id)],
        level: 3,
        model: "test".into(),
        digest: None,
    });
    assert_eq!(
        top.file_ids,
        vec![FileId(0), FileId(1), FileId(2), FileId(3)],
        "the top summary names every file under it"
    );
}

#[test]
fn unknown_file_ids_are_clear_errors() {
    let store = store();
    let reader = store.reader().unwrap();
    match reader.file(FileId(9)) {
        Err(StoreError::FileNotFound(id)) => assert_eq!(id, FileId(9)),
        other => panic!("{other:?}"),
    }
    assert!(reader.file_messages(FileId(9)).unwrap().is_empty());
}

#[test]
fn file_records_survive_a_reopen_and_a_rejected_batch_registers_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lcm.redb");
    let options = options();
    let payload = csv(1_000);
    {
        let store = Store::open(&path, options).unwrap();
        let s = store.create_session("persist", None).unwrap();
        store
            .append(
                s,
                msg(
                    Role::User,
                    vec![Part::Text {
                        text: payload.clone(),
                    }],
                ),
            )
            .unwrap();
        // A batch with an invalid message is refused whole: no record from its large part.
        let refused = store.append_batch(
            s,
            vec![
                msg(Role::User, vec![Part::Text { text: csv(1_200) }]),
                msg(Role::User, vec![]),
            ],
        );
        assert!(matches!(refused, Err(StoreError::InvalidMessage(_))));
        assert_eq!(store.reader().unwrap().file_count().unwrap(), 1);
    }
    let store = Store::open(&path, options).unwrap();
    let reader = store.reader().unwrap();
    assert_eq!(reader.file_count().unwrap(), 1);
    let info = reader.file(FileId(0)).unwrap();
    assert_eq!(info.byte_len, payload.len() as u64);
}

/// A store written before schema 4 (no file tables, summaries without file ids) reads as it is,
/// with no records; its first writable open registers the records its messages would have had
/// and fills in the summaries' file ids, in the same transaction.
#[test]
fn a_store_written_before_file_records_gets_them_at_its_first_writable_open() {
    use lcm_store::tables;
    use redb::{ReadableDatabase, ReadableTable};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lcm.redb");
    let options = options();
    let (ids, expected, leaf) = {
        let store = Store::open(&path, options).unwrap();
        let s = store.create_session("old", None).unwrap();
        let ids = vec![
            store
                .append(
                    s,
                    msg(Role::Assistant, vec![read_call("r1", "/src/lib.rs")]),
                )
                .unwrap()
                .id,
            store
                .append(s, msg(Role::Tool, vec![result("r1", "fn main() {}\n")]))
                .unwrap()
                .id,
            store
                .append(s, msg(Role::User, vec![Part::Text { text: csv(1_000) }]))
                .unwrap()
                .id,
        ];
        let reader = store.reader().unwrap();
        let expected: Vec<_> = ids
            .iter()
            .map(|id| reader.message_files(*id).unwrap())
            .collect();
        let leaf = match store
            .apply_summary(
                NewSummary {
                    session: s,
                    kind: SummaryKind::Leaf,
                    depth: 0,
                    content: "read and pasted".into(),
                    token_count: 10,
                    sources: ids.iter().map(|m| NodeRef::Message(*m)).collect(),
                    level: 3,
                    model: "test".into(),
                    digest: None,
                },
                Vec::new(),
            )
            .unwrap()
        {
            ApplyOutcome::Applied { summary, .. } => summary,
            other => panic!("{other:?}"),
        };
        assert_eq!(leaf.file_ids, vec![FileId(0), FileId(1)]);
        (ids, expected, leaf)
    };
    // Make it a schema-3 store: no file tables, no file counter, a summary without file ids.
    {
        let db = redb::Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.delete_table(tables::FILES).unwrap();
        txn.delete_table(tables::FILE_HASHES).unwrap();
        txn.delete_table(tables::MESSAGE_FILES).unwrap();
        txn.delete_table(tables::FILE_MESSAGES).unwrap();
        txn.delete_table(tables::READ_CALLS).unwrap();
        {
            let mut meta = txn.open_table(tables::META).unwrap();
            meta.remove(tables::meta::NEXT_FILE).unwrap();
            meta.insert(tables::meta::SCHEMA_VERSION, 3).unwrap();
            let mut summaries = txn.open_table(tables::SUMMARIES).unwrap();
            let bytes = summaries.get(leaf.id.0).unwrap().unwrap().value().to_vec();
            let mut record: SummaryRec = lcm_store::codec::decode("summaries", &bytes).unwrap();
            record.file_ids.clear();
            summaries
                .insert(leaf.id.0, lcm_store::codec::encode(&record).as_slice())
                .unwrap();
        }
        txn.commit().unwrap();
        let read = db.begin_read().unwrap();
        assert!(
            read.open_table(tables::FILES).is_err(),
            "no file table any more"
        );
    }
    // Since schema 6 (lcm's own record layout) an older store is only read once migrated: a
    // read-only open says so.
    match Store::open_read_only(&path, options) {
        Err(lcm_store::StoreError::OlderSchema { found: 3, .. }) => {}
        other => panic!("{:?}", other.map(|_| "opened")),
    }
    let store = Store::open(&path, options).unwrap();
    let reader = store.reader().unwrap();
    assert_eq!(reader.file_count().unwrap(), 2);
    let backfilled: Vec<_> = ids
        .iter()
        .map(|id| reader.message_files(*id).unwrap())
        .collect();
    assert_eq!(backfilled, expected, "the same references as appends made");
    assert_eq!(
        reader.file(FileId(0)).unwrap().path.as_deref(),
        Some("/src/lib.rs")
    );
    assert_eq!(
        store.summary(leaf.id).unwrap().file_ids,
        vec![FileId(0), FileId(1)]
    );
    // New appends go on numbering file records after the backfilled ones.
    let s = store.session(leaf.session).unwrap().id;
    let next = store
        .append(s, msg(Role::User, vec![Part::Text { text: csv(1_100) }]))
        .unwrap()
        .id;
    let refs = store
        .reader()
        .unwrap()
        .message_files(next)
        .unwrap()
        .unwrap();
    assert_eq!(refs.refs[0].file, FileId(2));
}

#[test]
fn a_sessions_file_references_are_read_by_sequence_across_interleaved_sessions() {
    let store = store();
    let a = store.create_session("a", None).unwrap();
    let b = store.create_session("b", None).unwrap();
    // The two sessions take turns, so each one's ids come in runs of one; every third message
    // of each carries a large payload.
    let mut large = [Vec::new(), Vec::new()];
    for i in 0..12usize {
        for (k, s) in [a, b].into_iter().enumerate() {
            let text = if i % 3 == 1 {
                csv(400 + i * 10 + k)
            } else {
                format!("turn {i}")
            };
            let id = store
                .append(s, msg(Role::User, vec![Part::Text { text }]))
                .unwrap()
                .id;
            if i % 3 == 1 {
                large[k].push((i as u64, id));
            }
        }
    }
    let reader = store.reader().unwrap();
    let ids = |refs: Vec<(MessageId, lcm_core::files::MessageFiles)>| {
        refs.into_iter().map(|(id, _)| id).collect::<Vec<_>>()
    };
    for (k, s) in [a, b].into_iter().enumerate() {
        let all: Vec<MessageId> = large[k].iter().map(|(_, id)| *id).collect();
        assert_eq!(
            ids(reader.session_message_files(s, 0..u64::MAX).unwrap()),
            all
        );
        // From the fifth message on: the large ones at positions 7 and 10.
        let later: Vec<MessageId> = large[k]
            .iter()
            .filter(|(seq, _)| *seq >= 5)
            .map(|(_, id)| *id)
            .collect();
        assert_eq!(later.len(), 2);
        assert_eq!(
            ids(reader.session_message_files(s, 5..u64::MAX).unwrap()),
            later
        );
        assert_eq!(ids(reader.session_message_files(s, 5..7).unwrap()), []);
        let files = reader.session_message_files(s, 4..5).unwrap();
        assert_eq!(ids(files.clone()), [large[k][1].1]);
        assert_eq!(
            Some(&files[0].1),
            reader.message_files(large[k][1].1).unwrap().as_ref()
        );
    }
    // An unknown session is an error, not an empty answer.
    assert!(matches!(
        reader.session_message_files(lcm_core::ids::SessionId(99), 0..u64::MAX),
        Err(StoreError::SessionNotFound(_))
    ));
}
