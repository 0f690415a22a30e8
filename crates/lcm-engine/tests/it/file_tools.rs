//! File tools: confined to the allowed roots, writes refused to read-only agents (and not
//! offered to them), clear errors for traversal and missing files, nothing written on refusal.

use std::path::Path;
use std::sync::Arc;

use lcm_core::config::Config;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::tools::{Caller, ListDir, ReadFile, Tool, ToolContext, ToolError, WriteFile};
use lcm_store::{Store, StoreOptions};
use serde_json::json;

fn context(root: &Path, caller: Caller) -> ToolContext {
    let store =
        Store::open_in_memory(StoreOptions::new(TokenCounter::new(Encoding::O200kBase))).unwrap();
    let mut config = Config::default();
    config.map.allowed_roots = vec![root.to_path_buf()];
    ToolContext::new(Arc::new(store), None, Arc::new(config), caller)
}

fn writer() -> Caller {
    Caller::sub_agent(None, 1)
}

fn reader() -> Caller {
    Caller {
        read_only: true,
        ..Caller::sub_agent(None, 1)
    }
}

#[tokio::test]
async fn read_and_list_inside_the_roots() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (0..10).map(|i| format!("line {i}")).collect();
    std::fs::write(dir.path().join("notes.txt"), lines.join("\n")).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let ctx = context(dir.path(), reader());

    let out = ReadFile
        .call(&ctx, json!({"path": "notes.txt", "offset": 2, "limit": 3}))
        .await
        .unwrap();
    assert_eq!(out["content"], "line 2\nline 3\nline 4");
    assert_eq!(out["more"], true);
    let out = ReadFile
        .call(&ctx, json!({"path": "notes.txt", "offset": 8}))
        .await
        .unwrap();
    assert_eq!(out["content"], "line 8\nline 9");
    assert_eq!(out["more"], false);

    let out = ListDir.call(&ctx, json!({"path": "."})).await.unwrap();
    assert_eq!(
        out["entries"],
        json!([{"name": "notes.txt", "type": "file", "bytes": lines.join("\n").len()}, {"name": "sub", "type": "dir"}])
    );
}

#[tokio::test]
async fn paths_outside_the_roots_are_refused() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(outer.path().join("secret.txt"), "s3cret").unwrap();
    std::os::unix::fs::symlink(outer.path().join("secret.txt"), root.join("link.txt")).unwrap();
    let ctx = context(&root, writer());
    for path in ["../secret.txt", "link.txt", "/etc/passwd"] {
        let err = ReadFile
            .call(&ctx, json!({"path": path}))
            .await
            .unwrap_err();
        assert!(
            matches!(err, ToolError::NotPermitted { .. }),
            "{path}: {err}"
        );
        assert!(!err.to_string().contains("s3cret"));
    }
    let err = ListDir.call(&ctx, json!({"path": ".."})).await.unwrap_err();
    assert!(matches!(err, ToolError::NotPermitted { .. }), "{err}");
    let err = WriteFile
        .call(&ctx, json!({"path": "../escape.txt", "content": "x"}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::NotPermitted { .. }), "{err}");
    assert!(!outer.path().join("escape.txt").exists());
    let err = ReadFile
        .call(&ctx, json!({"path": "missing.txt"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no such file"), "{err}");
}

#[tokio::test]
async fn writes_are_refused_to_read_only_agents_and_allowed_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let read_only = context(dir.path(), reader());
    assert!(!WriteFile.offered_to(&read_only.caller));
    let err = WriteFile
        .call(&read_only, json!({"path": "out.txt", "content": "hello"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("read-only"), "{err}");
    assert!(!dir.path().join("out.txt").exists());

    let ctx = context(dir.path(), writer());
    assert!(WriteFile.offered_to(&ctx.caller));
    let out = WriteFile
        .call(&ctx, json!({"path": "out.txt", "content": "hello"}))
        .await
        .unwrap();
    assert_eq!(out["bytes"], 5);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "hello"
    );
}
