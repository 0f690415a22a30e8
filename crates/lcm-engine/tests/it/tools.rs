//! The tool registry and the retrieval tools on a real store (redb in a temp dir) and a real
//! tantivy index: definitions export in both provider shapes; arguments that break the schema
//! come back as `InvalidArguments` naming each JSON pointer and nothing runs; `lcm_grep` groups
//! hits by the summary standing for them now, restricts to a summary's subtree, searches
//! summaries, pages without overlap or gap and stays within its token bound; `lcm_describe`
//! describes every kind of id and refuses bad ones clearly; `lcm_expand` is refused to the main
//! agent, returns the verbatim messages within its token cap and continues exactly where it
//! stopped.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use lcm_core::config::{CompactionConfig, Config};
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::{NodeRef, SummaryKind};
use lcm_core::time::Timestamp;
use lcm_core::tokens::TokenCounter;
use lcm_engine::tools::{
    Caller, Tool, ToolContext, ToolDefinition, ToolError, ToolFormat, ToolRegistry,
};
use lcm_engine::{assemble, compact};
use lcm_llm::ExtractiveSummarizer;
use lcm_search::SearchIndex;
use lcm_store::{Store, StoreOptions};
use serde_json::{Value, json};

const WORDS: [&str; 12] = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima",
];

struct Fixture {
    _tmp: tempfile::TempDir,
    store: Arc<Store>,
    index: Arc<SearchIndex>,
    config: Arc<Config>,
    session: SessionId,
    registry: ToolRegistry,
    /// Messages appended after the index caught up (found by scanning above the watermark).
    late: Vec<MessageId>,
}

impl Fixture {
    fn ctx(&self, caller: Caller) -> ToolContext {
        ToolContext::new(
            self.store.clone(),
            Some(self.index.clone()),
            self.config.clone(),
            caller,
        )
    }

    fn main(&self) -> ToolContext {
        self.ctx(Caller::main_agent(Some(self.session)))
    }

    fn sub(&self) -> ToolContext {
        self.ctx(Caller::sub_agent(Some(self.session), 1))
    }

    async fn call(&self, ctx: &ToolContext, name: &str, args: Value) -> Result<Value, ToolError> {
        self.registry.call(ctx, name, args).await
    }

    async fn grep(&self, args: Value) -> Value {
        self.call(&self.main(), "lcm_grep", args.clone())
            .await
            .unwrap_or_else(|e| panic!("lcm_grep {args}: {e}"))
    }

    async fn expand(&self, args: Value) -> Value {
        self.call(&self.sub(), "lcm_expand", args.clone())
            .await
            .unwrap_or_else(|e| panic!("lcm_expand {args}: {e}"))
    }

    fn counter(&self) -> TokenCounter {
        self.store.counter()
    }
}

fn message_text(i: usize) -> String {
    let a = WORDS[i % WORDS.len()];
    let b = WORDS[(i * 7 + 3) % WORDS.len()];
    format!(
        "turn {i}: marker-{i:03} the {a} service talks to {b}; we measured latency {} ms and \
         decided to keep the {a} cache warm. Notes on {b}: the retry budget is {} and the page \
         size stays at {} rows until the next review of {a} and {b}.",
        17 * i + 3,
        i % 5 + 1,
        100 + i
    )
}

/// 90 messages (with tool calls and results), compacted into leaves and condensed summaries,
/// indexed; then two more messages above the index's watermark.
async fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let config = Config::default();
    let counter = TokenCounter::new(config.tokenizer.encoding());
    let store = Store::open(tmp.path().join("lcm.redb"), StoreOptions::new(counter)).unwrap();
    let session = store.create_session("conversation", None).unwrap();
    let mut t = Timestamp::parse("2026-01-05T09:00:00Z").unwrap();
    for i in 0..90 {
        t = Timestamp(t.0 + 60_000);
        let mut message = if i % 2 == 0 {
            NewMessage::text(Role::User, message_text(i))
        } else {
            NewMessage::text(Role::Assistant, message_text(i))
        };
        message.created_at = t;
        if i % 10 == 5 {
            message.parts.push(Part::ToolCall {
                id: format!("call_{i}"),
                name: "read_file".into(),
                arguments: format!("{{\"path\":\"src/module_{i}.rs\"}}"),
            });
        }
        store.append(session, message).unwrap();
        if i % 10 == 5 {
            let mut result = NewMessage::text(Role::Tool, "");
            result.parts = vec![Part::ToolResult {
                call_id: format!("call_{i}"),
                content: format!("fn module_{i}() {{ /* tool output marker-{i:03}-result */ }}"),
                is_error: false,
            }];
            result.created_at = t;
            store.append(session, result).unwrap();
        }
    }
    let compaction = CompactionConfig {
        fresh_tail: 8,
        leaf_chunk_tokens: 900,
        leaf_target_tokens: 60,
        condensed_fanout: 2,
        condensed_target_tokens: 80,
        ..CompactionConfig::default()
    };
    let summarizer = ExtractiveSummarizer::new(counter);
    let report = compact(&store, session, 3_000, &compaction, &summarizer, |_| {})
        .await
        .unwrap();
    assert!(!report.passes.is_empty());
    let index = SearchIndex::open(tmp.path().join("index"), &store, &config.search).unwrap();
    index.catch_up(&store, |_, _| {}).unwrap();
    let mut late = Vec::new();
    for i in 0..2 {
        t = Timestamp(t.0 + 60_000);
        let mut m = NewMessage::text(
            Role::User,
            format!("late {i}: marker-late-{i} about alpha and the page size"),
        );
        m.created_at = t;
        late.push(store.append(session, m).unwrap().id);
    }
    let summaries = store.session_summaries(session).unwrap();
    assert!(
        summaries.iter().any(|s| s.kind == SummaryKind::Condensed),
        "the fixture needs a condensed summary: {:?}",
        summaries
            .iter()
            .map(|s| (s.id, s.depth))
            .collect::<Vec<_>>()
    );
    Fixture {
        _tmp: tmp,
        store: Arc::new(store),
        index: Arc::new(index),
        config: Arc::new(config),
        session,
        registry: ToolRegistry::with_builtins(),
        late,
    }
}

/// A host tool that counts its calls.
struct Echo {
    calls: AtomicUsize,
}

#[async_trait]
impl Tool for Echo {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            "echo",
            "Echo the text back.",
            json!({
                "type": "object",
                "properties": {"text": {"type": "string"}, "times": {"type": "integer", "minimum": 1}},
                "required": ["text"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, _ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(json!({ "echo": args["text"] }))
    }
}

struct Named(&'static str, Value);

#[async_trait]
impl Tool for Named {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(self.0, "test", self.1.clone())
    }

    async fn call(&self, _ctx: &ToolContext, _args: Value) -> Result<Value, ToolError> {
        Ok(Value::Null)
    }
}

/// Every hit of a grep page, in page order: (id, group region).
fn hits_of(page: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for group in page["groups"].as_array().unwrap() {
        for hit in group["hits"].as_array().unwrap() {
            out.push((
                hit["id"].as_str().unwrap().to_owned(),
                group["region"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

/// All hits of a search, page after page (ids in the order the pages gave them).
async fn all_pages(fx: &Fixture, mut args: Value) -> (Vec<String>, usize) {
    let mut ids = Vec::new();
    let mut pages = 0;
    loop {
        let page = fx.grep(args.clone()).await;
        pages += 1;
        assert!(pages < 500, "runaway pagination");
        // Within a page, hits keep their order inside each group; pages are compared as sets
        // plus "no duplicates", and regex pages are checked for global order separately.
        ids.extend(hits_of(&page).into_iter().map(|(id, _)| id));
        match page["next_cursor"].as_str() {
            Some(c) => args["cursor"] = json!(c),
            None => break,
        }
    }
    (ids, pages)
}

fn assert_no_duplicates(ids: &[String]) {
    let set: HashSet<&String> = ids.iter().collect();
    assert_eq!(set.len(), ids.len(), "a hit was repeated: {ids:?}");
}

#[tokio::test]
async fn definitions_export_in_both_provider_shapes() {
    let registry = ToolRegistry::with_builtins();
    assert_eq!(
        registry.names(),
        vec![
            "lcm_grep",
            "lcm_describe",
            "lcm_expand",
            "lcm_read_file",
            "lcm_expand_query",
            "Task",
            "Tasks",
            "lcm_pin",
            "lcm_forget"
        ]
    );
    let openai = registry.export(ToolFormat::OpenAi);
    let anthropic = registry.export(ToolFormat::Anthropic);
    for (i, def) in registry.definitions().iter().enumerate() {
        let o = &openai[i];
        assert_eq!(o["type"], "function");
        assert_eq!(o["function"]["name"], def.name.as_str());
        assert_eq!(o["function"]["description"], def.description.as_str());
        assert_eq!(o["function"]["parameters"], def.parameters);
        assert_eq!(o["function"]["parameters"]["type"], "object");
        let a = &anthropic[i];
        assert_eq!(a["name"], def.name.as_str());
        assert_eq!(a["description"], def.description.as_str());
        assert_eq!(a["input_schema"], def.parameters);
        assert_eq!(a.as_object().unwrap().len(), 3);
        // Every schema is strict about unknown arguments and compiles as a JSON Schema.
        assert_eq!(def.parameters["additionalProperties"], false);
        assert!(jsonschema::validator_for(&def.parameters).is_ok());
        assert!(
            def.description.len() > 80,
            "{}: describe the tool",
            def.name
        );
    }
    // The main agent is not offered lcm_expand; sub-agents are.
    let main: Vec<String> = registry
        .definitions_for(&Caller::main_agent(None))
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(
        main,
        vec![
            "lcm_grep",
            "lcm_describe",
            "lcm_expand_query",
            "Task",
            "Tasks",
            "lcm_pin",
            "lcm_forget"
        ]
    );
    let sub = registry.export_for(ToolFormat::Anthropic, &Caller::sub_agent(None, 1));
    assert_eq!(sub.as_array().unwrap().len(), 7);
    // A read-only exploration agent is offered no delegation tools.
    let explorer = Caller {
        read_only: true,
        ..Caller::sub_agent(None, 1)
    };
    let names: Vec<String> = registry
        .definitions_for(&explorer)
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(
        names,
        vec![
            "lcm_grep",
            "lcm_describe",
            "lcm_expand",
            "lcm_read_file",
            "lcm_expand_query"
        ]
    );
    assert_eq!("OpenAI".parse::<ToolFormat>(), Ok(ToolFormat::OpenAi));
    assert_eq!("anthropic".parse::<ToolFormat>(), Ok(ToolFormat::Anthropic));
    assert!("gemini".parse::<ToolFormat>().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_run_concurrently_on_spawned_tasks() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<ToolRegistry>();
    assert_send_sync::<ToolContext>();
    assert_send_sync::<ToolError>();
    let fx = fixture().await;
    let registry = Arc::new(ToolRegistry::with_builtins());
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let registry = registry.clone();
            let ctx = fx.sub();
            tokio::spawn(async move {
                let pattern = format!("marker-0{i}[0-9]");
                registry
                    .call(&ctx, "lcm_grep", json!({"pattern": pattern}))
                    .await
            })
        })
        .collect();
    for (i, task) in tasks.into_iter().enumerate() {
        let page = task.await.unwrap().unwrap();
        // marker-0i0..marker-0i9 and the tool results among them.
        let hits = page["hits"].as_u64().unwrap();
        assert!((10..=11).contains(&hits), "{i}: {hits}");
    }
}

#[tokio::test]
async fn registration_rejects_duplicates_and_unusable_definitions() {
    let mut registry = ToolRegistry::with_builtins();
    let echo = Arc::new(Echo {
        calls: AtomicUsize::new(0),
    });
    registry.register(echo.clone()).unwrap();
    let err = registry.register(echo).unwrap_err();
    assert!(matches!(err, ToolError::DuplicateTool { ref name } if name == "echo"));
    assert!(err.to_string().contains("already registered"), "{err}");
    let err = registry
        .register(Arc::new(Named("lcm_grep", json!({"type": "object"}))))
        .unwrap_err();
    assert!(matches!(err, ToolError::DuplicateTool { .. }), "{err}");

    for (name, schema, why) in [
        ("bad name", json!({"type": "object"}), "tool name"),
        ("", json!({"type": "object"}), "tool name"),
        ("arr", json!({"type": "array"}), "\"type\": \"object\""),
        (
            "broken",
            json!({"type": "object", "properties": {"x": {"type": "nonsense"}}}),
            "does not compile",
        ),
    ] {
        let err = registry
            .register(Arc::new(Named(name, schema)))
            .unwrap_err();
        assert!(
            matches!(err, ToolError::InvalidDefinition { .. }),
            "{name}: {err}"
        );
        assert!(err.to_string().contains(why), "{name}: {err}");
    }
    assert_eq!(
        registry.names(),
        vec![
            "lcm_grep",
            "lcm_describe",
            "lcm_expand",
            "lcm_read_file",
            "lcm_expand_query",
            "Task",
            "Tasks",
            "lcm_pin",
            "lcm_forget",
            "echo"
        ]
    );
}

#[tokio::test]
async fn invalid_arguments_name_each_pointer_and_nothing_runs() {
    let fx = fixture().await;
    let mut registry = ToolRegistry::with_builtins();
    let echo = Arc::new(Echo {
        calls: AtomicUsize::new(0),
    });
    registry.register(echo.clone()).unwrap();
    let ctx = fx.sub();
    let before = (
        fx.store.stats().unwrap(),
        fx.store.summary_count().unwrap(),
        fx.store.context(fx.session).unwrap(),
    );

    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "lcm_grep",
            json!({}),
            vec![
                "at the arguments object",
                "\"pattern\" is a required property",
            ],
        ),
        (
            "lcm_grep",
            json!({"pattern": 5}),
            vec!["at /pattern", "5 is not of type \"string\""],
        ),
        (
            "lcm_grep",
            json!({"pattern": "x", "mode": "fuzzy"}),
            vec!["at /mode", "fuzzy"],
        ),
        (
            "lcm_grep",
            json!({"pattern": "x", "scope": "everything"}),
            vec!["at /scope"],
        ),
        (
            "lcm_grep",
            json!({"pattern": "x", "limit": 0}),
            vec!["at /limit"],
        ),
        (
            "lcm_grep",
            json!({"pattern": "x", "summary_id": "msg_3"}),
            vec!["at /summary_id"],
        ),
        (
            "lcm_grep",
            json!({"pattern": "x", "maxTokens": 10}),
            vec!["maxTokens"],
        ),
        ("lcm_describe", json!({"id": ["sum_1"]}), vec!["at /id"]),
        (
            "lcm_expand",
            json!({"summary_id": "sum_1", "max_depth": "2"}),
            vec!["at /max_depth"],
        ),
        ("lcm_expand", json!({"ids": []}), vec!["at /ids"]),
        ("lcm_expand", json!({"ids": ["ses_1"]}), vec!["at /ids/0"]),
        (
            "echo",
            json!({"text": 1, "times": 0}),
            vec!["at /text", "at /times"],
        ),
        ("echo", json!("just text"), vec!["at the arguments object"]),
    ];
    for (tool, args, expected) in cases {
        let err = registry.call(&ctx, tool, args.clone()).await.unwrap_err();
        let ToolError::InvalidArguments { tool: t, errors } = &err else {
            panic!("{tool} {args}: expected InvalidArguments, got {err:?}");
        };
        assert_eq!(t, tool);
        assert!(!errors.is_empty());
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("invalid arguments for {tool}:")),
            "{message}"
        );
        for e in expected {
            assert!(
                message.contains(e),
                "{tool} {args}: `{e}` missing from:\n{message}"
            );
        }
        assert_eq!(err.kind(), "invalid_arguments");
        assert_eq!(err.to_json()["error"], "invalid_arguments");
    }
    // Both errors of one call are listed, one per line.
    let err = registry
        .call(&ctx, "echo", json!({"text": 1, "times": 0}))
        .await
        .unwrap_err();
    assert!(matches!(&err, ToolError::InvalidArguments { errors, .. } if errors.len() == 2));
    // Neither summary_id nor ids: checked by the tool, reported the same way.
    let err = registry
        .call(&ctx, "lcm_expand", json!({}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidArguments { .. }), "{err}");
    // Arguments as text (OpenAI's wire shape) that are not JSON.
    let err = registry
        .call_json(&ctx, "echo", "{\"text\": ")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    // Unknown tools list what exists.
    let err = registry
        .call(&ctx, "lcm_grepp", json!({}))
        .await
        .unwrap_err();
    let ToolError::UnknownTool { name, available } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(name, "lcm_grepp");
    assert!(available.contains(&"lcm_grep".to_owned()));
    assert!(
        err.to_string().contains(
            "lcm_grep, lcm_describe, lcm_expand, lcm_read_file, lcm_expand_query, Task, Tasks, lcm_pin, lcm_forget, echo"
        ),
        "{err}"
    );

    // Nothing ran and nothing changed.
    assert_eq!(echo.calls.load(Ordering::SeqCst), 0);
    let after = (
        fx.store.stats().unwrap(),
        fx.store.summary_count().unwrap(),
        fx.store.context(fx.session).unwrap(),
    );
    assert_eq!(before, after);

    // Valid arguments reach the host tool (null counts as {} and is then refused for `text`).
    let out = registry
        .call(&ctx, "echo", json!({"text": "hi"}))
        .await
        .unwrap();
    assert_eq!(out, json!({"echo": "hi"}));
    let out = registry
        .call_json(&ctx, "echo", "{\"text\":\"yo\"}")
        .await
        .unwrap();
    assert_eq!(out, json!({"echo": "yo"}));
    assert!(registry.call(&ctx, "echo", Value::Null).await.is_err());
    assert_eq!(echo.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn grep_groups_hits_by_the_summary_standing_for_them_now() {
    let fx = fixture().await;
    let state = fx.store.context(fx.session).unwrap();
    let page = fx
        .grep(json!({"pattern": r"marker-\d{3}\b|marker-late"}))
        .await;
    assert_eq!(page["searched"]["session"], fx.session.to_string());
    let hits = hits_of(&page);
    assert_eq!(hits.len(), 20, "default limit");
    let mut all = Vec::new();
    let mut args =
        json!({"pattern": r"marker-0[0-9]{2}\b|marker-late", "limit": 200, "max_tokens": 32000});
    loop {
        let page = fx.grep(args.clone()).await;
        for group in page["groups"].as_array().unwrap() {
            for hit in group["hits"].as_array().unwrap() {
                all.push((group.clone(), hit.clone()));
            }
        }
        match page["next_cursor"].as_str() {
            Some(c) => args["cursor"] = json!(c),
            None => break,
        }
    }
    // 90 turns + 9 tool results + 2 late messages.
    assert_eq!(all.len(), 101);
    let mut raw = 0;
    for (group, hit) in &all {
        let id: MessageId = hit["id"].as_str().unwrap().parse().unwrap();
        let m = fx.store.message(id).unwrap();
        assert_eq!(hit["role"], m.role.as_str());
        assert_eq!(hit["at"], m.created_at.to_string());
        assert_eq!(hit["seq"], m.seq);
        assert!(
            m.search_text().contains(
                hit["snippet"]
                    .as_str()
                    .unwrap()
                    .trim_matches('…')
                    .split('…')
                    .next()
                    .unwrap()
            )
        );
        let direct = fx.store.covering(NodeRef::Message(id)).unwrap();
        match direct {
            None => {
                raw += 1;
                assert_eq!(group["region"], "raw_tail");
                assert!(hit.get("covered_by").is_none());
                assert!(m.seq >= state.raw_from);
            }
            Some(leaf) => {
                assert_eq!(hit["covered_by"], leaf.to_string());
                // The region is the top of the covered_by chain, a summary of the context.
                let mut top = leaf;
                while let Some(up) = fx.store.covering(NodeRef::Summary(top)).unwrap() {
                    top = up;
                }
                assert!(state.summaries.contains(&top));
                assert_eq!(group["region"], top.to_string());
                let s = fx.store.summary(top).unwrap();
                assert_eq!(group["kind"], s.kind.as_str());
                assert_eq!(group["depth"], s.depth);
                assert!(s.first_seq <= m.seq && m.seq <= s.last_seq);
            }
        }
    }
    assert!(
        raw >= 8 + fx.late.len(),
        "the fresh tail and the late messages are raw"
    );
    assert!(raw < all.len() / 2);
    // The late messages (above the index's watermark) are found too.
    for id in &fx.late {
        assert!(all.iter().any(|(_, h)| h["id"] == id.to_string()));
    }
    // Regex hits come oldest first across pages.
    let ids: Vec<u64> = all
        .iter()
        .map(|(_, h)| h["id"].as_str().unwrap()[4..].parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test]
async fn grep_restricted_to_a_summary_stays_in_its_subtree() {
    let fx = fixture().await;
    let summaries = fx.store.session_summaries(fx.session).unwrap();
    for s in summaries.iter().filter(|s| s.depth <= 1).take(4) {
        for mode in ["regex", "full_text"] {
            let pattern = if mode == "regex" {
                r"marker-\d{3}"
            } else {
                "marker"
            };
            let (ids, _) = all_pages(
                &fx,
                json!({"pattern": pattern, "mode": mode, "summary_id": s.id, "limit": 3}),
            )
            .await;
            assert_no_duplicates(&ids);
            let expected: HashSet<String> = fx
                .store
                .session_messages(s.session, s.first_seq..s.last_seq + 1)
                .unwrap()
                .into_iter()
                .filter(|m| m.search_text().contains("marker"))
                .map(|m| m.id.to_string())
                .collect();
            let got: HashSet<String> = ids.iter().cloned().collect();
            assert_eq!(got, expected, "{} {mode}", s.id);
        }
    }
    let err = fx
        .call(
            &fx.main(),
            "lcm_grep",
            json!({"pattern": "x", "summary_id": "sum_99999"}),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("sum_99999"), "{err}");
}

#[tokio::test]
async fn grep_pages_continue_without_overlap_or_gap() {
    let fx = fixture().await;
    for (mode, pattern, scope) in [
        ("regex", r"marker-\d", "messages"),
        ("full_text", "alpha cache", "messages"),
        ("regex", r"marker-\d|alpha", "both"),
        ("full_text", "alpha bravo", "both"),
    ] {
        let base = json!({"pattern": pattern, "mode": mode, "scope": scope});
        let mut whole_args = base.clone();
        whole_args["limit"] = json!(200);
        whole_args["max_tokens"] = json!(32000);
        let whole = fx.grep(whole_args).await;
        assert!(
            whole["next_cursor"].is_null(),
            "{mode} {pattern}: one page holds all"
        );
        let whole: Vec<String> = hits_of(&whole).into_iter().map(|(id, _)| id).collect();
        assert!(whole.len() > 20, "{mode} {pattern}: {}", whole.len());
        for (limit, max_tokens) in [(7, 32000), (200, 400), (13, 700)] {
            let mut args = base.clone();
            args["limit"] = json!(limit);
            args["max_tokens"] = json!(max_tokens);
            let (ids, pages) = all_pages(&fx, args).await;
            assert_no_duplicates(&ids);
            let a: HashSet<&String> = ids.iter().collect();
            let b: HashSet<&String> = whole.iter().collect();
            assert_eq!(
                a, b,
                "{mode} {pattern} limit {limit} max_tokens {max_tokens}"
            );
            assert!(pages > 1);
        }
    }
    // A cursor of one search is refused by another.
    let page = fx.grep(json!({"pattern": "marker", "limit": 2})).await;
    let cursor = page["next_cursor"].as_str().unwrap();
    let err = fx
        .call(
            &fx.main(),
            "lcm_grep",
            json!({"pattern": "alpha", "limit": 2, "cursor": cursor}),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("different search"), "{err}");
    let err = fx
        .call(
            &fx.main(),
            "lcm_grep",
            json!({"pattern": "marker", "cursor": "garbage"}),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("invalid cursor"), "{err}");
    // A bad regex is a request error that says why.
    let err = fx
        .call(&fx.main(), "lcm_grep", json!({"pattern": "(unclosed"}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("regex"), "{err}");
}

#[tokio::test]
async fn grep_output_stays_within_max_tokens() {
    let fx = fixture().await;
    for max_tokens in [300, 600, 1_000, 2_500] {
        let page = fx
            .grep(json!({"pattern": "marker", "limit": 200, "max_tokens": max_tokens}))
            .await;
        let tokens = fx.counter().count_text(&page.to_string());
        assert!(tokens <= max_tokens, "{tokens} > {max_tokens}");
        assert!(page["hits"].as_u64().unwrap() >= 1);
        assert!(
            page["truncated"].as_str().unwrap().contains("max_tokens"),
            "{page}"
        );
        assert!(page["next_cursor"].is_string());
    }
    // The default bound (4000) holds for the largest page.
    let page = fx.grep(json!({"pattern": "a", "limit": 200})).await;
    assert!(fx.counter().count_text(&page.to_string()) <= 4_000);
}

#[tokio::test]
async fn grep_searches_summaries_with_the_same_semantics() {
    let fx = fixture().await;
    let summaries = fx.store.session_summaries(fx.session).unwrap();
    let page = fx
        .grep(json!({"pattern": "marker", "scope": "summaries", "limit": 200, "max_tokens": 32000}))
        .await;
    let hits = hits_of(&page);
    let expected: Vec<String> = summaries
        .iter()
        .filter(|s| s.content.contains("marker"))
        .map(|s| s.id.to_string())
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(
        hits.iter()
            .map(|(id, _)| id.clone())
            .collect::<HashSet<_>>(),
        expected.iter().cloned().collect::<HashSet<_>>()
    );
    for group in page["groups"].as_array().unwrap() {
        for hit in group["hits"].as_array().unwrap() {
            assert_eq!(hit["type"], "summary");
        }
    }
    // Both: summaries first, then messages.
    let page = fx
        .grep(json!({"pattern": "marker", "scope": "both", "limit": 200, "max_tokens": 32000}))
        .await;
    let types: Vec<String> = page["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["hits"].as_array().unwrap().clone())
        .map(|h| h["type"].as_str().unwrap().to_owned())
        .collect();
    assert!(types.contains(&"summary".to_owned()) && types.contains(&"message".to_owned()));
    // Full text on summaries is stemmed like message search ("markers" finds "marker").
    let page = fx
        .grep(json!({"pattern": "markers", "mode": "full_text", "scope": "summaries", "limit": 200, "max_tokens": 32000}))
        .await;
    assert_eq!(hits_of(&page).len(), expected.len());
}

#[tokio::test]
async fn grep_without_an_index_scans_regex_and_refuses_full_text() {
    let fx = fixture().await;
    let ctx = ToolContext::new(
        fx.store.clone(),
        None,
        fx.config.clone(),
        Caller::main_agent(Some(fx.session)),
    );
    let mut args = json!({"pattern": r"marker-\d{3}\b", "limit": 9});
    let mut ids = Vec::new();
    loop {
        let page = fx
            .registry
            .call(&ctx, "lcm_grep", args.clone())
            .await
            .unwrap();
        ids.extend(hits_of(&page).into_iter().map(|(id, _)| id));
        match page["next_cursor"].as_str() {
            Some(c) => args["cursor"] = json!(c),
            None => break,
        }
    }
    assert_no_duplicates(&ids);
    assert_eq!(ids.len(), 99);
    let err = fx
        .registry
        .call(
            &ctx,
            "lcm_grep",
            json!({"pattern": "alpha", "mode": "full_text"}),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("regex"), "{err}");
}

#[tokio::test]
async fn describe_summaries_messages_sessions_and_refuses_bad_ids_clearly() {
    let fx = fixture().await;
    let ctx = fx.main();
    let state = fx.store.context(fx.session).unwrap();
    let top = fx
        .store
        .summary(
            *state
                .summaries
                .iter()
                .find(|id| fx.store.summary(**id).unwrap().kind == SummaryKind::Condensed)
                .unwrap(),
        )
        .unwrap();
    let d = fx
        .call(&ctx, "lcm_describe", json!({"id": top.id}))
        .await
        .unwrap();
    assert_eq!(d["type"], "summary");
    assert_eq!(d["kind"], "condensed");
    assert_eq!(d["depth"], top.depth);
    assert_eq!(d["token_count"], top.token_count);
    assert_eq!(d["content"], top.content.as_str());
    assert_eq!(d["in_context"], true);
    assert!(d["covered_by"].is_null());
    assert_eq!(d["from"], top.earliest_at.to_string());
    assert_eq!(d["to"], top.latest_at.to_string());
    let ratio = top.descendant_tokens as f64 / f64::from(top.token_count);
    assert!((d["compression_ratio"].as_f64().unwrap() - ratio).abs() < 0.06);
    assert_eq!(
        d["sources"],
        json!(
            top.sources
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
        )
    );
    assert_eq!(d["covers"]["messages"], top.descendant_messages);
    let below = d["covers"]["summaries"].as_u64().unwrap();
    assert!(below >= 2);
    assert_eq!(
        d["manifest"]["total"].as_u64().unwrap(),
        below + top.descendant_messages
    );
    let nodes = d["manifest"]["nodes"].as_array().unwrap();
    assert_eq!(nodes[0]["id"], top.sources[0].to_string());
    assert_eq!(nodes[0]["parent"], top.id.to_string());
    // The manifest is bounded and says so.
    let d = fx
        .call(
            &ctx,
            "lcm_describe",
            json!({"id": top.id, "manifest_limit": 3}),
        )
        .await
        .unwrap();
    assert_eq!(d["manifest"]["nodes"].as_array().unwrap().len(), 3);
    assert!(d["manifest"]["note"].as_str().unwrap().contains("first 3"));

    // A child summary names its parent and its region.
    let NodeRef::Summary(child) = top.sources[0] else {
        panic!("condensed sources are summaries")
    };
    let d = fx
        .call(&ctx, "lcm_describe", json!({"id": child}))
        .await
        .unwrap();
    assert_eq!(d["covered_by"], top.id.to_string());
    assert_eq!(d["in_context"], false);
    assert_eq!(d["region"], top.id.to_string());

    // A covered message: role, parts, covering summary, content.
    let leaf = fx
        .store
        .session_summaries(fx.session)
        .unwrap()
        .into_iter()
        .find(|s| s.kind == SummaryKind::Leaf)
        .unwrap();
    let NodeRef::Message(mid) = leaf.sources[0] else {
        panic!()
    };
    let m = fx.store.message(mid).unwrap();
    let d = fx
        .call(&ctx, "lcm_describe", json!({"id": mid}))
        .await
        .unwrap();
    assert_eq!(d["type"], "message");
    assert_eq!(d["role"], m.role.as_str());
    assert_eq!(d["token_count"], m.token_count);
    assert_eq!(d["covered_by"], leaf.id.to_string());
    assert_eq!(d["parts"][0]["type"], "text");
    assert!(d["content"].as_str().unwrap().contains(&message_text(0)));
    // A raw message: region raw_tail; a small max_tokens cuts its content and says so.
    let d = fx
        .call(
            &ctx,
            "lcm_describe",
            json!({"id": fx.late[0], "max_tokens": 100}),
        )
        .await
        .unwrap();
    assert_eq!(d["region"], "raw_tail");
    assert!(d["covered_by"].is_null());
    // A session: its context.
    let d = fx
        .call(&ctx, "lcm_describe", json!({"id": fx.session}))
        .await
        .unwrap();
    assert_eq!(d["context"]["raw_from_seq"], state.raw_from);
    assert_eq!(
        d["context"]["summaries"],
        json!(
            state
                .summaries
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
        )
    );
    // And what it spends its tokens on: each top-level summary, each raw message, the total.
    let breakdown = &d["context"]["breakdown"];
    assert_eq!(breakdown["summaries"]["items"], state.summaries.len());
    assert_eq!(breakdown["messages"]["items"], d["context"]["raw_messages"]);
    assert_eq!(breakdown["elided"]["items"], 0, "nothing is fitted here");
    let stored = assemble(&fx.store, fx.session).unwrap();
    assert_eq!(d["context"]["tokens"], stored.tokens);
    assert_eq!(
        breakdown["summaries"]["tokens"].as_u64().unwrap()
            + breakdown["commitments"]["tokens"].as_u64().unwrap()
            + breakdown["messages"]["tokens"].as_u64().unwrap(),
        stored.tokens
    );

    // A file read of the fixture is a file record; an unknown one is a clear error.
    let file = fx
        .call(&ctx, "lcm_describe", json!({"id": "file_0"}))
        .await
        .unwrap();
    assert_eq!(file["type"], "file");
    assert!(file["path"].is_string(), "{file}");
    let err = fx
        .call(&ctx, "lcm_describe", json!({"id": "file_999"}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("file_999"), "{err}");
    // Unknown and malformed ids.
    for (id, expect) in [
        ("sum_424242", "no summary sum_424242"),
        ("msg_424242", "no message msg_424242"),
        ("ses_424242", "no session ses_424242"),
        ("hello", "not an lcm id"),
        ("sum_x", "no valid number"),
    ] {
        let err = fx
            .call(&ctx, "lcm_describe", json!({"id": id}))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(expect), "{id}: {err}");
    }
}

#[tokio::test]
async fn expand_is_refused_to_the_main_agent() {
    let fx = fixture().await;
    let id = fx.store.context(fx.session).unwrap().summaries[0];
    let err = fx
        .call(&fx.main(), "lcm_expand", json!({"summary_id": id}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::NotPermitted { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("lcm_expand_query"), "{message}");
    assert!(message.contains("sub-agent"), "{message}");
    // A sub-agent may.
    assert!(
        fx.call(&fx.sub(), "lcm_expand", json!({"summary_id": id}))
            .await
            .is_ok()
    );
}

/// The message items of an expansion, pieces joined: (id, content) in order.
fn join_messages(items: &[Value]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for item in items {
        if item["type"] != "message" {
            continue;
        }
        let id = item["id"].as_str().unwrap().to_owned();
        let content = item["content"].as_str().unwrap();
        let continues = item["part"]["from_byte"].as_u64().unwrap_or(0) > 0;
        match out.last_mut() {
            Some((last, text)) if continues && *last == id => text.push_str(content),
            _ => {
                assert!(!continues, "{id} continues a piece that was not shown");
                out.push((id, content.to_owned()));
            }
        }
    }
    out
}

/// Every page of an expansion.
async fn expand_all(fx: &Fixture, mut args: Value) -> (Vec<Value>, usize) {
    let cap = args["token_cap"].as_u64().unwrap_or(8_000);
    let mut items = Vec::new();
    let mut pages = 0;
    loop {
        let page = fx.expand(args.clone()).await;
        pages += 1;
        assert!(pages < 1_000);
        assert!(page["tokens"].as_u64().unwrap() <= cap, "{page}");
        assert!(
            !page["items"].as_array().unwrap().is_empty(),
            "a page always progresses"
        );
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(page["complete"], false);
                args["cursor"] = json!(c);
            }
            None => {
                assert_eq!(page["complete"], true);
                break;
            }
        }
    }
    (items, pages)
}

#[tokio::test]
async fn expand_returns_the_verbatim_messages_within_the_cap_and_continues_exactly() {
    let fx = fixture().await;
    let state = fx.store.context(fx.session).unwrap();
    let top = fx.store.summary(state.summaries[0]).unwrap();
    let expected: Vec<_> = fx
        .store
        .session_messages(fx.session, top.first_seq..top.last_seq + 1)
        .unwrap();

    let (whole, pages) = expand_all(&fx, json!({"summary_id": top.id, "token_cap": 100_000})).await;
    assert_eq!(pages, 1);
    let whole_messages = join_messages(&whole);
    assert_eq!(
        whole_messages
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|m| m.id.to_string())
            .collect::<Vec<_>>(),
        "every message under the summary, oldest first"
    );
    for ((_, content), m) in whole_messages.iter().zip(&expected) {
        for part in &m.parts {
            match part {
                Part::Text { text } => assert!(content.contains(text.as_str())),
                Part::ToolCall { arguments, .. } => assert!(content.contains(arguments.as_str())),
                Part::ToolResult { content: c, .. } => assert!(content.contains(c.as_str())),
                _ => {}
            }
        }
    }
    // Child summaries come before what they cover, with their text.
    let summaries: Vec<&Value> = whole.iter().filter(|i| i["type"] == "summary").collect();
    assert!(!summaries.is_empty());
    for s in &summaries {
        let id = s["id"].as_str().unwrap().parse().unwrap();
        assert_eq!(s["content"], fx.store.summary(id).unwrap().content.as_str());
    }

    // Small caps: the same content, split over pages, nothing repeated or lost.
    for cap in [100usize, 350, 1_000] {
        let (items, pages) = expand_all(&fx, json!({"summary_id": top.id, "token_cap": cap})).await;
        assert!(pages > 1);
        assert_eq!(join_messages(&items), whole_messages, "cap {cap}");
        let ids: Vec<&str> = items
            .iter()
            .filter(|i| i["type"] == "summary")
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        let whole_ids: Vec<&str> = summaries
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        // Summaries may be split into pieces too; their first pieces come in the same order.
        let mut firsts = ids.clone();
        firsts.dedup();
        assert_eq!(firsts, whole_ids, "cap {cap}");
    }

    // One large message is split by bytes and joined back exactly; ids can be messages.
    let big_text = (0..2_000).map(|i| format!("word{i} ")).collect::<String>();
    let big = fx
        .store
        .append(
            fx.session,
            NewMessage::text(Role::Assistant, big_text.clone()),
        )
        .unwrap()
        .id;
    let (items, pages) = expand_all(&fx, json!({"ids": [big], "token_cap": 500})).await;
    assert!(pages >= 4, "{pages}");
    assert_eq!(join_messages(&items), vec![(big.to_string(), big_text)]);

    // Several ids in order.
    let (items, _) = expand_all(
        &fx,
        json!({"ids": [state.summaries.last().unwrap(), fx.late[0]], "token_cap": 100_000}),
    )
    .await;
    let last = join_messages(&items).pop().unwrap();
    assert_eq!(last.0, fx.late[0].to_string());

    // A cursor from another expansion is refused.
    let page = fx
        .expand(json!({"summary_id": top.id, "token_cap": 100}))
        .await;
    let cursor = page["next_cursor"].as_str().unwrap();
    let err = fx
        .call(
            &fx.sub(),
            "lcm_expand",
            json!({"ids": [top.id, fx.late[0]], "cursor": cursor}),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("different expansion"), "{err}");
}

#[tokio::test]
async fn expand_max_depth_stops_at_child_summaries() {
    let fx = fixture().await;
    let state = fx.store.context(fx.session).unwrap();
    let top = state
        .summaries
        .iter()
        .map(|id| fx.store.summary(*id).unwrap())
        .find(|s| s.depth >= 1)
        .unwrap();
    let page = fx
        .expand(json!({"summary_id": top.id, "max_depth": 1, "token_cap": 100_000}))
        .await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), top.sources.len());
    for (item, source) in items.iter().zip(&top.sources) {
        assert_eq!(item["type"], "summary");
        assert_eq!(item["id"], source.to_string());
        assert_eq!(item["expanded"], false);
        assert!(item["note"].as_str().unwrap().contains("expand"));
    }
    assert_eq!(page["complete"], true);
}
