//! File records through the tools: `lcm_describe file_N` (the record, its messages, and whether
//! the file on disk is still what was seen), `lcm_read_file` (pages of the content as seen; from
//! disk only while unchanged; sub-agents only), and bad input: a file that changed or vanished
//! since it was seen, a binary blob, an unknown id. Nothing stored changes.

use std::sync::Arc;

use lcm_core::config::Config;
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::tools::{Caller, ToolContext, ToolError, ToolRegistry};
use lcm_store::{FileRules, Store, StoreOptions};
use serde_json::{Value, json};

fn store() -> Store {
    Store::open_in_memory(StoreOptions {
        counter: TokenCounter::new(Encoding::O200kBase),
        files: FileRules {
            large_file_tokens: 2_000,
            exploration_max_tokens: 300,
        },
        cache_bytes: StoreOptions::DEFAULT_CACHE_BYTES,
    })
    .unwrap()
}

fn message(role: Role, part: Part) -> NewMessage {
    NewMessage {
        parts: vec![part],
        ..NewMessage::text(role, "")
    }
}

/// `text` as Claude Code's `Read` shows it: `cat -n` numbering with an arrow.
fn numbered(text: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(i, line)| format!("{:>6}\u{2192}{line}\n", i + 1))
        .collect()
}

/// A session that read `path` (its content as it is now) and pasted a binary blob.
fn session(store: &Store, path: &str) -> lcm_core::ids::SessionId {
    let s = store.create_session("files", None).unwrap();
    let content = std::fs::read_to_string(path).unwrap();
    store
        .append(
            s,
            message(
                Role::Assistant,
                Part::ToolCall {
                    id: "r1".into(),
                    name: "Read".into(),
                    arguments: json!({"file_path": path}).to_string(),
                },
            ),
        )
        .unwrap();
    store
        .append(
            s,
            message(
                Role::Tool,
                Part::ToolResult {
                    call_id: "r1".into(),
                    content: numbered(&content),
                    is_error: false,
                },
            ),
        )
        .unwrap();
    s
}

fn contexts(store: Store, root: &std::path::Path) -> (ToolContext, ToolContext) {
    let mut config = Config::default();
    config.map.allowed_roots = vec![root.to_path_buf()];
    let main = ToolContext::new(
        Arc::new(store),
        None,
        Arc::new(config),
        Caller::main_agent(None),
    );
    let sub = main.with_caller(Caller::sub_agent(None, 1));
    (main, sub)
}

fn snapshot(store: &Store) -> String {
    let reader = store.reader().unwrap();
    format!(
        "{:?} {}",
        store.stats().unwrap(),
        reader.file_count().unwrap()
    )
}

#[tokio::test]
async fn describe_and_read_a_file_record_then_see_it_change_and_vanish() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.py");
    let lines: Vec<String> = (0..450).map(|i| format!("value_{i} = {i}")).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let path_text = path.to_str().unwrap().to_owned();
    let store = store();
    session(&store, &path_text);
    let (main, sub) = contexts(store, dir.path());
    let registry = ToolRegistry::with_builtins();

    let described = registry
        .call(&main, "lcm_describe", json!({"id": "file_0"}))
        .await
        .unwrap();
    assert_eq!(described["type"], "file");
    assert_eq!(described["path"], path_text.as_str());
    assert_eq!(described["kind"], "code");
    assert_eq!(described["language"], "python");
    assert_eq!(described["referenced_by"][0]["id"], "msg_1");
    assert_eq!(described["content_in"], "msg_1");
    assert_eq!(
        described["on_disk"]["state"], "unchanged",
        "line numbers removed, the read matches the file: {described}"
    );

    // The main agent may not read; a sub-agent reads pages of the content as seen.
    let refused = registry
        .call(&main, "lcm_read_file", json!({"id": "file_0"}))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, ToolError::NotPermitted { .. }),
        "{refused}"
    );
    let page = registry
        .call(
            &sub,
            "lcm_read_file",
            json!({"id": "file_0", "offset": 200, "limit": 100}),
        )
        .await
        .unwrap();
    assert_eq!(
        (page["from_line"].clone(), page["to_line"].clone()),
        (json!(200), json!(299))
    );
    assert_eq!(page["lines"], 450);
    assert_eq!(page["next_offset"], 300);
    assert!(
        page["content"]
            .as_str()
            .unwrap()
            .contains("value_199 = 199")
    );
    let last = registry
        .call(
            &sub,
            "lcm_read_file",
            json!({"id": "file_0", "offset": 401}),
        )
        .await
        .unwrap();
    assert!(last.get("next_offset").is_none(), "{last}");
    let from_disk = registry
        .call(
            &sub,
            "lcm_read_file",
            json!({"id": "file_0", "source": "disk", "limit": 1}),
        )
        .await
        .unwrap();
    assert_eq!(from_disk["source"], "disk");
    assert!(
        from_disk["content"]
            .as_str()
            .unwrap()
            .contains("value_0 = 0")
    );
    let past_end = registry
        .call(
            &sub,
            "lcm_read_file",
            json!({"id": "file_0", "offset": 451}),
        )
        .await
        .unwrap_err();
    assert!(past_end.to_string().contains("past its end"), "{past_end}");

    // The file changes: reported, and never served from disk in place of what was seen.
    let before = snapshot(&sub.store);
    std::fs::write(&path, "something else entirely\n").unwrap();
    let described = registry
        .call(&main, "lcm_describe", json!({"id": "file_0"}))
        .await
        .unwrap();
    assert_eq!(described["on_disk"]["state"], "changed", "{described}");
    let refused = registry
        .call(
            &sub,
            "lcm_read_file",
            json!({"id": "file_0", "source": "disk"}),
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("not what the session saw"),
        "{refused}"
    );
    // What was seen is still served as seen.
    let seen = registry
        .call(&sub, "lcm_read_file", json!({"id": "file_0", "limit": 1}))
        .await
        .unwrap();
    assert!(
        seen["content"].as_str().unwrap().contains("value_0 = 0"),
        "{seen}"
    );

    // The file vanishes.
    std::fs::remove_file(&path).unwrap();
    let described = registry
        .call(&main, "lcm_describe", json!({"id": "file_0"}))
        .await
        .unwrap();
    assert_eq!(described["on_disk"]["state"], "vanished", "{described}");
    let refused = registry
        .call(
            &sub,
            "lcm_read_file",
            json!({"id": "file_0", "source": "disk"}),
        )
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("vanished"), "{refused}");
    assert_eq!(snapshot(&sub.store), before, "reads changed nothing");

    // Unknown and malformed ids are clear errors.
    let unknown = registry
        .call(&main, "lcm_describe", json!({"id": "file_9"}))
        .await
        .unwrap_err();
    assert!(unknown.to_string().contains("file_9"), "{unknown}");
    let wrong = registry
        .call(&sub, "lcm_read_file", json!({"id": "sum_1"}))
        .await
        .unwrap_err();
    assert!(wrong.to_string().contains("file"), "{wrong}");
}

#[tokio::test]
async fn a_binary_blob_and_a_huge_output_become_references_with_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let store = store();
    let s = store.create_session("blobs", None).unwrap();
    // A tool's raw output of bytes that are not text (as a lossy string: what a host gives).
    let blob: Vec<u8> = (0..40_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let lossy = String::from_utf8_lossy(&blob).into_owned();
    let log: String = (0..4_000)
        .map(|i| {
            if i % 1_000 == 999 {
                format!(
                    "2026-03-01T10:{:02}:00Z ERROR worker {i} crashed: out of memory\n",
                    i / 100
                )
            } else {
                format!(
                    "2026-03-01T10:{:02}:00Z INFO worker {i} finished\n",
                    i / 100
                )
            }
        })
        .collect();
    for (i, content) in [lossy, log].into_iter().enumerate() {
        store
            .append(
                s,
                message(
                    Role::Assistant,
                    Part::ToolCall {
                        id: format!("b{i}"),
                        name: "Bash".into(),
                        arguments: json!({"command": "./run.sh"}).to_string(),
                    },
                ),
            )
            .unwrap();
        store
            .append(
                s,
                message(
                    Role::Tool,
                    Part::ToolResult {
                        call_id: format!("b{i}"),
                        content,
                        is_error: false,
                    },
                ),
            )
            .unwrap();
    }
    let ctx = lcm_engine::assemble(&store, s).unwrap();
    let shown = serde_json::to_string(&ctx.to_openai(None)).unwrap();
    assert!(
        shown.contains("<lcm_file id=\\\"file_0\\\""),
        "{shown:.2000}"
    );
    assert!(
        shown.contains("<lcm_file id=\\\"file_1\\\" kind=\\\"log\\\""),
        "{shown:.3000}"
    );
    assert!(
        shown.contains("worker 999 crashed"),
        "the log's first error is named"
    );
    assert!(ctx.tokens < 3_000, "{} tokens", ctx.tokens);
    let (main, _) = contexts(store, dir.path());
    let registry = ToolRegistry::with_builtins();
    let blob = registry
        .call(&main, "lcm_describe", json!({"id": "file_0"}))
        .await
        .unwrap();
    assert_eq!(blob["on_disk"]["state"], "no_path");
    assert!(blob["path"].is_null());
    let kind = blob["kind"].as_str().unwrap();
    assert!(["binary", "text"].contains(&kind), "{blob}");
    let _: Value = blob;
}
