//! The real Claude Code sessions of `../shared/data`, replayed turn by turn through the runtime
//! at budgets of 8k and 32k tokens: every context is within its budget; every file the session
//! read gets a file record; after a full compaction every one of them is still named by the
//! context (a summary's file ids, or a raw message's references), and `lcm_describe` on the top
//! summaries lists the session's files. Skips with a message when the data is absent.

use std::collections::BTreeSet;
use std::sync::Arc;

use lcm_core::config::Config;
use lcm_core::ids::FileId;
use lcm_core::message::NewMessage;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::runtime::{Runtime, RuntimeOptions};
use lcm_engine::tools::{Caller, ToolContext, ToolRegistry};
use lcm_engine::{ContextItem, assemble, compact, effective_budget};
use lcm_llm::ExtractiveSummarizer;
use serde_json::{Value, json};

use crate::common::{real_session_messages as sessions, shared_data};

/// Paths of the `Read` calls whose result is not an error.
fn read_paths(messages: &[NewMessage]) -> BTreeSet<String> {
    use lcm_core::message::Part;
    let mut calls = std::collections::HashMap::new();
    let mut paths = BTreeSet::new();
    for m in messages {
        for part in &m.parts {
            match part {
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    if let Some(path) = lcm_core::files::read_call_path(name, arguments) {
                        calls.insert(id.clone(), path);
                    }
                }
                Part::ToolResult {
                    call_id, is_error, ..
                } if !is_error => {
                    if let Some(path) = calls.get(call_id) {
                        paths.insert(path.clone());
                    }
                }
                _ => {}
            }
        }
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_sessions_replayed_stay_in_budget_and_keep_every_file_read_reachable() {
    let Some(data) = shared_data() else {
        return;
    };
    let sessions = sessions(&data);
    assert_eq!(sessions.len(), 4, "expected the four real sessions");
    let counter = TokenCounter::new(Encoding::O200kBase);
    let registry = ToolRegistry::with_builtins();
    for (name, messages) in &sessions {
        let expected_paths = read_paths(messages);
        assert!(expected_paths.len() >= 10, "{name}: {expected_paths:?}");
        for budget in [8_000u64, 32_000] {
            let config = Config::default();
            let limit = effective_budget(budget, config.tokenizer.safety_margin);
            let rt = Runtime::open(
                RuntimeOptions::in_memory(config.clone())
                    .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter))),
            )
            .await
            .unwrap();
            let handle = rt.session(name).await.unwrap();
            let mut largest = 0;
            for m in messages.iter().cloned() {
                handle.append(m).await.unwrap();
                let ctx = handle.context(budget).await.unwrap();
                assert!(
                    ctx.tokens <= limit,
                    "{name} at {budget}: a context of {} tokens",
                    ctx.tokens
                );
                largest = largest.max(ctx.tokens);
            }
            assert!(
                largest > limit / 2,
                "{name}: the budget was never under pressure"
            );

            // Every file read has a record with its path.
            let store = rt.store().clone();
            let session = handle.id();
            let reader = store.reader().unwrap();
            let mut session_files: BTreeSet<FileId> = BTreeSet::new();
            let mut recorded_paths = BTreeSet::new();
            let info = store.session(session).unwrap();
            for m in reader
                .session_messages(session, 0..info.message_count)
                .unwrap()
            {
                if let Some(files) = reader.message_files(m.id).unwrap() {
                    for r in files.refs {
                        session_files.insert(r.file);
                        if let Some(path) = reader.file(r.file).unwrap().path {
                            recorded_paths.insert(path);
                        }
                    }
                }
            }
            let missing: Vec<_> = expected_paths.difference(&recorded_paths).collect();
            assert!(
                missing.is_empty(),
                "{name}: reads without a record: {missing:?}"
            );

            // A full compaction (to a small budget), then every file is named by the context.
            let summarizer = ExtractiveSummarizer::new(counter);
            let mut tight = config.compaction.clone();
            tight.max_passes = 1_000;
            compact(&store, session, 3_000, &tight, &summarizer, |_| {})
                .await
                .unwrap();
            let ctx = assemble(&store, session).unwrap();
            let mut named: BTreeSet<FileId> = BTreeSet::new();
            let mut tops = Vec::new();
            for item in &ctx.items {
                match item {
                    ContextItem::Summary { summary, rendered } => {
                        for f in &summary.file_ids {
                            assert!(rendered.contains(&f.to_string()), "header names {f}");
                        }
                        named.extend(summary.file_ids.iter().copied());
                        tops.push(summary.id);
                    }
                    ContextItem::Message(m) => {
                        if let Some(files) = reader.message_files(m.id).unwrap() {
                            named.extend(files.refs.iter().map(|r| r.file));
                        }
                    }
                    ContextItem::Elided { .. }
                    | ContextItem::Pinned { .. }
                    | ContextItem::Commitments { .. } => {}
                }
            }
            assert!(!tops.is_empty(), "{name}: nothing was compacted");
            let unnamed: Vec<_> = session_files.difference(&named).collect();
            assert!(
                unnamed.is_empty(),
                "{name}: files lost from the context: {unnamed:?}"
            );

            // lcm_describe on the top summaries lists the files under them.
            let tools = ToolContext::new(
                store.clone(),
                None,
                Arc::new(config.clone()),
                Caller::main_agent(Some(session)),
            );
            let mut described: BTreeSet<String> = BTreeSet::new();
            for top in &tops {
                let out = registry
                    .call(&tools, "lcm_describe", json!({"id": top.to_string()}))
                    .await
                    .unwrap();
                if let Some(Value::Array(files)) = out.get("files") {
                    described.extend(files.iter().filter_map(|f| f.as_str().map(str::to_owned)));
                }
            }
            let raw_named: BTreeSet<String> = named
                .iter()
                .filter(|f| !described.contains(&f.to_string()))
                .map(|f| f.to_string())
                .collect();
            // What the summaries do not list is referenced by raw messages still in context.
            for f in &raw_named {
                let in_tail = ctx.items.iter().any(|i| match i {
                    ContextItem::Message(m) => reader
                        .message_files(m.id)
                        .unwrap()
                        .is_some_and(|files| files.refs.iter().any(|r| r.file.to_string() == *f)),
                    _ => false,
                });
                assert!(in_tail, "{name}: {f} neither described nor in the tail");
            }
            // And describing a file names its path and where its content is.
            let first = session_files.iter().next().unwrap();
            let out = registry
                .call(&tools, "lcm_describe", json!({"id": first.to_string()}))
                .await
                .unwrap();
            assert_eq!(out["type"], "file");
            assert!(out["path"].is_string(), "{out}");
            assert!(!out["exploration"].as_str().unwrap().is_empty());
            rt.shutdown(std::time::Duration::from_secs(5))
                .await
                .unwrap();
        }
    }
}
