//! The API over real HTTP on loopback: sessions, appends (single and batch, idempotent by
//! key), the context in both provider shapes, tools (listing and a call), grep, describe,
//! integrity, metrics, JSON errors for every kind of failure, and a graceful stop that
//! releases the store.

use crate::common::{Setup, serve, start, start_default};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_messages_context_and_tools() {
    let server = start_default().await;

    // Health first.
    let health = server.get("/healthz").await;
    assert_eq!(
        (health.status, &health.body),
        (StatusCode::OK, &json!({"status": "ok"}))
    );
    let ready = server.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK, "{ready:?}");
    assert_eq!(ready.body["status"], "ready");

    // Create, then create again: the same session, 201 then 200.
    let created = server.post("/v1/sessions", &json!({"key": "chat-1"})).await;
    assert_eq!(created.status, StatusCode::CREATED, "{created:?}");
    assert_eq!(created.body["key"], "chat-1");
    assert_eq!(created.body["created"], true);
    let id = created.body["id"].as_str().unwrap().to_owned();
    let again = server.post("/v1/sessions", &json!({"key": "chat-1"})).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["id"], id.as_str());
    assert_eq!(again.body["created"], false);
    server.session("chat-2").await;

    // One message, with a key: stored once, even when sent twice.
    let one = json!({"role": "system", "content": "You are terse.", "key": "s-0"});
    let path = format!("/v1/sessions/{id}/messages");
    let appended = server.post(&path, &one).await;
    assert_eq!(appended.status, StatusCode::CREATED, "{appended:?}");
    assert_eq!(appended.body["inserted"], 1);
    let first_id = appended.body["appended"][0]["id"].clone();
    let retried = server.post(&path, &one).await;
    assert_eq!(retried.body["inserted"], 0);
    assert_eq!(retried.body["appended"][0]["id"], first_id);
    assert_eq!(retried.body["appended"][0]["inserted"], false);

    // A batch as an array, and as {"messages": [...]}; parts, tool calls and results.
    let batch = json!([
        {"role": "user", "content": "Find the invoice INV-4821.", "key": "u-1"},
        {"role": "assistant", "key": "a-1", "parts": [
            {"type": "text", "text": "Searching."},
            {"type": "tool_call", "id": "call_1", "name": "search", "arguments": "{\"q\":\"INV-4821\"}"}
        ]},
        {"role": "tool", "key": "t-1", "parts": [
            {"type": "tool_result", "call_id": "call_1", "content": "INV-4821: 120 EUR, paid"}
        ]}
    ]);
    let answer = server.post(&path, &batch).await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    assert_eq!(answer.body["inserted"], 3);
    let answer = server
        .post(
            &path,
            &json!({"messages": [
                {"role": "assistant", "content": "INV-4821 was paid: 120 EUR.", "key": "a-2"}
            ]}),
        )
        .await;
    assert_eq!(answer.body["inserted"], 1, "{answer:?}");

    // The session, by id and by key; the list.
    let by_id = server.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(by_id.status, StatusCode::OK);
    assert_eq!(by_id.body["message_count"], 5);
    let by_key = server.get("/v1/sessions/chat-1").await;
    assert_eq!(by_key.body["id"], id.as_str());
    let list = server.get("/v1/sessions").await;
    assert_eq!(list.body["sessions"].as_array().unwrap().len(), 2);
    let filtered = server.get("/v1/sessions?prefix=chat-2").await;
    assert_eq!(filtered.body["sessions"].as_array().unwrap().len(), 1);

    // The context in the OpenAI shape: the system prompt, then the messages, the tool call
    // paired with its result.
    let ctx = server
        .get(&format!(
            "/v1/sessions/{id}/context?budget=100000&system=Be%20brief."
        ))
        .await;
    assert_eq!(ctx.status, StatusCode::OK, "{ctx:?}");
    assert_eq!(ctx.body["format"], "openai");
    assert!(ctx.body["tokens"].as_u64().unwrap() > 0);
    // What the context spends its tokens on: five raw messages (the host's system message
    // among them), nothing summarised or left out yet; the system prompt apart.
    let breakdown = &ctx.body["breakdown"];
    assert_eq!(breakdown["messages"]["items"], 5, "{breakdown}");
    assert_eq!(breakdown["messages"]["tokens"], ctx.body["tokens"]);
    assert_eq!(breakdown["summaries"], json!({"items": 0, "tokens": 0}));
    assert_eq!(breakdown["elided"]["items"], 0);
    let system_tokens = ctx.body["system_tokens"].as_u64().unwrap();
    assert!((3..=10).contains(&system_tokens), "{system_tokens}");
    let messages = ctx.body["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "Be brief."})
    );
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "system", "user", "assistant", "tool", "assistant"]
    );
    assert_eq!(messages[3]["tool_calls"][0]["id"], "call_1");
    assert_eq!(messages[4]["tool_call_id"], "call_1");

    // The Anthropic shape: system text apart, tool_use / tool_result blocks.
    let ctx = server
        .get(&format!(
            "/v1/sessions/{id}/context?budget=100000&format=anthropic"
        ))
        .await;
    assert_eq!(ctx.status, StatusCode::OK, "{ctx:?}");
    assert_eq!(ctx.body["format"], "anthropic");
    assert_eq!(ctx.body["system"], "You are terse.");
    let turns = ctx.body["messages"].as_array().unwrap();
    assert_eq!(turns[0]["role"], "user");
    let blocks: Vec<&str> = turns
        .iter()
        .flat_map(|t| t["content"].as_array().unwrap())
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert!(
        blocks.contains(&"tool_use") && blocks.contains(&"tool_result"),
        "{blocks:?}"
    );

    // Tools: both shapes list lcm_grep; a call as the session's main agent finds the invoice.
    let openai = server.get("/v1/tools?format=openai").await;
    let names: Vec<&str> = openai
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"lcm_grep") && names.contains(&"lcm_describe"),
        "{names:?}"
    );
    let anthropic = server.get("/v1/tools?format=anthropic").await;
    assert!(
        anthropic
            .body
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["input_schema"].is_object())
    );
    let found = server
        .post(
            &format!("/v1/sessions/{id}/tools/lcm_grep"),
            &json!({"pattern": "INV-\\d{4}"}),
        )
        .await;
    assert_eq!(found.status, StatusCode::OK, "{found:?}");
    assert_eq!(found.body["hits"], 4, "{found:?}");
    assert_eq!(found.body["searched"]["session"], id.as_str());

    // grep without a session: every session; full text too.
    let grep = server.post("/v1/grep", &json!({"pattern": "paid"})).await;
    assert_eq!(grep.status, StatusCode::OK, "{grep:?}");
    assert_eq!(grep.body["hits"], 2);
    let grep = server
        .post(
            "/v1/grep",
            &json!({"pattern": "invoice", "mode": "full_text", "session": "chat-1"}),
        )
        .await;
    assert_eq!(grep.status, StatusCode::OK, "{grep:?}");
    assert!(grep.body["hits"].as_u64().unwrap() >= 1);

    // describe a message and the session.
    let msg = first_id.as_str().unwrap();
    let described = server.get(&format!("/v1/describe/{msg}")).await;
    assert_eq!(described.status, StatusCode::OK, "{described:?}");
    assert_eq!(described.body["session"], id.as_str());
    let described = server.get(&format!("/v1/describe/{id}")).await;
    assert_eq!(described.body["key"], "chat-1", "{described:?}");

    // Integrity: clean.
    let integrity = server
        .post("/v1/integrity?repair=false", &json!(null))
        .await;
    assert_eq!(integrity.status, StatusCode::OK, "{integrity:?}");
    assert_eq!(integrity.body["clean"], true);

    // Metrics: the store's totals, the actors, and the requests just made.
    let metrics = server.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = metrics.body.as_str().unwrap();
    for series in [
        "lcm_sessions 2",
        "lcm_messages 5",
        "lcm_tokens_stored ",
        "lcm_live_session_actors ",
        "lcm_compactions_started_total ",
        "lcm_compactions_finished_total ",
        "lcm_compactions_failed_total ",
        "lcm_actor_stalls_total ",
        "lcm_map_items{status=\"completed\"} 0",
        "lcm_http_requests_total{route=\"/v1/sessions\",method=\"POST\",status=\"201\"} 2",
        "lcm_http_requests_total{route=\"/v1/sessions/{id}/messages\",method=\"POST\",status=\"201\"} 4",
        "lcm_http_request_duration_seconds_bucket{route=\"/v1/grep\",le=\"+Inf\"} 2",
        "lcm_http_request_duration_seconds_count{route=\"/healthz\"} 1",
    ] {
        assert!(text.contains(series), "missing `{series}` in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_is_counted_and_the_context_stays_in_budget() {
    let (mut setup, tmp, root) = Setup::new();
    setup.config.compaction.fresh_tail = 4;
    setup.config.compaction.leaf_chunk_tokens = 2_000;
    setup.config.compaction.leaf_target_tokens = 200;
    let server = start(setup, tmp, root).await;
    let id = server.session("long").await;
    let messages: Vec<Value> = (0..120)
        .map(|i| json!({
            "role": if i % 2 == 0 { "user" } else { "assistant" },
            "content": format!("turn {i}: the deployment of service {i} needs config key K{i} set to {}", i * 7),
            "key": format!("k{i}"),
        }))
        .collect();
    let answer = server
        .post(&format!("/v1/sessions/{id}/messages"), &json!(messages))
        .await;
    assert_eq!(answer.body["inserted"], 120, "{answer:?}");
    // Above the hard threshold: the call waits for compaction, then fits.
    let ctx = server
        .get(&format!("/v1/sessions/{id}/context?budget=1500"))
        .await;
    assert_eq!(ctx.status, StatusCode::OK, "{ctx:?}");
    assert!(
        ctx.body["tokens"].as_u64().unwrap() <= 1500,
        "{}",
        ctx.body["tokens"]
    );
    assert!(!ctx.body["summaries"].as_array().unwrap().is_empty());
    // Compacted: the summaries and what is left raw share the tokens, and no system prompt.
    let breakdown = &ctx.body["breakdown"];
    let part = |kind: &str, field: &str| breakdown[kind][field].as_u64().unwrap();
    assert_eq!(
        part("summaries", "items"),
        ctx.body["summaries"].as_array().unwrap().len() as u64,
        "{breakdown}"
    );
    assert_eq!(
        ["summaries", "commitments", "messages", "elided"]
            .iter()
            .map(|k| part(k, "tokens"))
            .sum::<u64>(),
        ctx.body["tokens"].as_u64().unwrap(),
        "{breakdown}"
    );
    assert!(part("summaries", "tokens") > 0 && part("messages", "items") < 120);
    assert_eq!(ctx.body["system_tokens"], 0);
    let text = server
        .get("/metrics")
        .await
        .body
        .as_str()
        .unwrap()
        .to_owned();
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
    };
    assert!(value("lcm_compactions_started_total") >= 1);
    assert!(value("lcm_compactions_finished_total") >= 1);
    assert_eq!(value("lcm_compactions_failed_total"), 0);
    // The extractive summariser writes at level 1 (or 3 when a summary would not shrink).
    let written: u64 = (1..=3)
        .map(|level| value(&format!("lcm_summaries_written_total{{level=\"{level}\"}}")))
        .sum();
    assert!(written >= 1, "{text}");
    assert!(
        value("lcm_compaction_context_tokens_after_total")
            < value("lcm_compaction_context_tokens_before_total"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_is_a_json_error_with_the_right_status() {
    let server = start_default().await;
    let id = server.session("s").await;
    let cases: Vec<(Method, String, Option<Value>, StatusCode, &str)> = vec![
        (
            Method::GET,
            "/nope".into(),
            None,
            StatusCode::NOT_FOUND,
            "no_route",
        ),
        (
            Method::DELETE,
            "/v1/sessions".into(),
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            Method::GET,
            "/v1/sessions/ses_999".into(),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/v1/sessions/no-such-key".into(),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sessions/ses_999/messages".into(),
            Some(json!({"role": "user", "content": "x"})),
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/context"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/context?budget=abc"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/context?budget=0"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/context?budget=10&format=xml"),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            format!("/v1/sessions/{id}/tools/nope"),
            Some(json!({})),
            StatusCode::NOT_FOUND,
            "unknown_tool",
        ),
        (
            Method::POST,
            format!("/v1/sessions/{id}/tools/lcm_grep"),
            Some(json!({"pattern": 42})),
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            Method::POST,
            format!("/v1/sessions/{id}/tools/lcm_grep"),
            Some(json!({"pattern": "("})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            "/v1/grep".into(),
            Some(json!({"pattern": "x", "colour": 1})),
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            Method::GET,
            "/v1/describe/xyz_1".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            Method::GET,
            "/v1/describe/msg_12345".into(),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/v1/maps/job_9".into(),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::GET,
            "/v1/maps/nine".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            "/v1/maps/job_9/cancel".into(),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            Some(json!({"key": ""})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            "/v1/sessions".into(),
            Some(json!({"name": "x"})),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            Method::POST,
            format!("/v1/sessions/{id}/messages"),
            Some(json!({"role": "user", "parts": []})),
            StatusCode::BAD_REQUEST,
            "invalid_message",
        ),
        (
            Method::POST,
            "/v1/integrity?repair=maybe".into(),
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
    ];
    let before = server.stats();
    for (method, path, body, status, kind) in cases {
        let body = body.map(|b| b.to_string().into_bytes());
        let answer = server.send(method.clone(), &path, body, None).await;
        assert_eq!(answer.status, status, "{method} {path}: {answer:?}");
        assert_eq!(answer.kind(), kind, "{method} {path}: {answer:?}");
        assert!(!answer.message().is_empty(), "{method} {path}: {answer:?}");
    }
    assert_eq!(
        server.stats(),
        before,
        "a rejected request changed the store"
    );
    // Whatever method a client invents, the metrics' labels stay bounded.
    let brew = Method::from_bytes(b"BREW").unwrap();
    let answer = server.send(brew, "/v1/sessions", None, None).await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    let metrics = server.get("/metrics").await;
    let text = metrics.body.as_str().unwrap();
    assert!(
        text.contains("route=\"/v1/sessions\",method=\"other\",status=\"405\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("route=\"unmatched\",method=\"GET\",status=\"404\"} 1"),
        "{text}"
    );
    assert!(!text.contains("BREW"));
    // A map job needs a model: this runtime has none.
    std::fs::write(server.root.join("in.jsonl"), "{\"a\":1}\n").unwrap();
    let answer = server
        .post(
            "/v1/maps",
            &json!({"input_path": "in.jsonl", "prompt": "p", "output_schema": {"type": "object"}}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{answer:?}");
    assert_eq!(server.job_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_keeps_everything_and_releases_the_store() {
    let server = start_default().await;
    let id = server.session("kept").await;
    let answer = server
        .post(
            &format!("/v1/sessions/{id}/messages"),
            &json!({"role": "user", "content": "remember me", "key": "k"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::CREATED);
    let port = server.addr;
    let runtime = server.runtime.clone();
    let (tmp, data) = server.stop_and_keep().await;
    // Stopped: nothing listens, and the runtime refuses new work.
    assert!(tokio::net::TcpStream::connect(port).await.is_err());
    assert!(runtime.session("x").await.is_err());
    drop(runtime);
    // The same data directory opens again (the store file was released) with the message.
    let (setup, _tmp2, root) = Setup::new();
    let reopened = lcm_engine::runtime::Runtime::open(lcm_engine::runtime::RuntimeOptions::dir(
        &data,
        setup.config,
    ))
    .await
    .expect("reopen");
    let stats = reopened.store().stats().unwrap();
    assert_eq!((stats.sessions, stats.messages), (1, 1));
    reopened
        .shutdown(std::time::Duration::from_secs(5))
        .await
        .unwrap();
    drop((tmp, root));
}

/// The budget invariant over HTTP: a message far over the large-file threshold is shown by its
/// file reference, one over the whole window by a part reference, and the system prompt comes
/// out of the same budget; a budget the system prompt alone exceeds is a 400 `budget_too_small` naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_and_the_system_prompt_stay_within_the_budget() {
    let server = start_default().await;
    let id = server.session("big").await;
    let rows: String = (0..6_000)
        .map(|i| {
            format!(
                "{i},widget-{i},{}.{:02},2026-01-{:02}\n",
                i % 500,
                i % 100,
                1 + i % 28
            )
        })
        .collect();
    let csv = format!("id,name,price,date\n{rows}");
    let long_note = "the rollback plan for the staging cluster needs review ".repeat(700);
    let messages = json!([
        {"role": "user", "content": "Here is the export:", "key": "u0"},
        {"role": "user", "content": csv, "key": "u1"},
        {"role": "user", "content": long_note, "key": "u2"},
    ]);
    let answer = server
        .post(&format!("/v1/sessions/{id}/messages"), &messages)
        .await;
    assert_eq!(answer.body["inserted"], 3, "{answer:?}");

    let system = "You are a careful analyst. ".repeat(20);
    let ctx = server
        .get(&format!(
            "/v1/sessions/{id}/context?budget=4000&system={}",
            system.replace(' ', "%20")
        ))
        .await;
    assert_eq!(ctx.status, StatusCode::OK, "{ctx:?}");
    let tokens = ctx.body["tokens"].as_u64().unwrap();
    let system_tokens = lcm_core::tokens::TokenCounter::new(lcm_core::tokens::Encoding::O200kBase)
        .count_text(&system) as u64;
    assert!(
        tokens + system_tokens <= 4_000,
        "{tokens} + {system_tokens} tokens for a 4000-token window"
    );
    let body = ctx.body["messages"].to_string();
    assert!(body.contains("<lcm_file id=\\\"file_0\\\""), "{body:.3000}");
    assert!(
        body.contains("6000 rows") || body.contains("6,000 rows"),
        "{body:.3000}"
    );
    // The note larger than the window was compacted or shown by a reference, never raw.
    assert!(!body.contains(&long_note[..2_000]), "{body:.3000}");
    assert_eq!(ctx.body["messages"][0]["role"], "system");

    let too_small = server
        .get(&format!(
            "/v1/sessions/{id}/context?budget=100&system={}",
            system.replace(' ', "%20")
        ))
        .await;
    assert_eq!(too_small.status, StatusCode::BAD_REQUEST, "{too_small:?}");
    assert_eq!(too_small.body["error"], "budget_too_small", "{too_small:?}");
    assert!(
        too_small.body["message"]
            .as_str()
            .unwrap()
            .contains("cannot fit in"),
        "{too_small:?}"
    );
}

/// A full disk during a group commit is 507 `insufficient_storage`, a failing disk 503
/// `storage_error` (never 400 `invalid_message`, which would tell the client to change its
/// request); what was acknowledged before stays, and once the disk is healthy again the same
/// daemon (no restart) acknowledges the same requests and its store passes the integrity check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_507_a_failing_disk_503_and_both_recover_without_a_restart() {
    use lcm_engine::runtime::{Runtime, RuntimeOptions};
    use lcm_store::disk_faults::DiskSwitch;
    use lcm_store::{Store, StoreOptions};

    type Fail = fn(&DiskSwitch);
    let modes: [(Fail, StatusCode, &str); 2] = [
        (
            DiskSwitch::fill,
            StatusCode::INSUFFICIENT_STORAGE,
            "insufficient_storage",
        ),
        (
            DiskSwitch::fail_writes,
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_error",
        ),
    ];
    for (fail, status, kind) in modes {
        let (setup, tmp, root) = Setup::new();
        let store_dir = tempfile::tempdir().unwrap();
        let path = store_dir.path().join("lcm.redb");
        let options = || StoreOptions::from_config(&setup.config);
        let disk = DiskSwitch::default();
        let store = Store::open_on_faulty_disk(&path, options(), disk.clone()).unwrap();
        let runtime =
            Runtime::open_on_store(store, RuntimeOptions::in_memory(setup.config.clone()))
                .await
                .unwrap();
        let stored_options = options();
        let mut server = serve(runtime, setup, tmp, root).await;
        let ids = [
            server.session("disk-a").await,
            server.session("disk-b").await,
        ];
        for id in &ids {
            let kept = server
                .post(
                    &format!("/v1/sessions/{id}/messages"),
                    &json!({"role": "user", "content": "acknowledged", "key": "k-0"}),
                )
                .await;
            assert_eq!(kept.status, StatusCode::CREATED, "{kept:?}");
        }

        fail(&disk);
        // Appends to both sessions at once, so that the writer groups them in one commit.
        let server_ref = &server;
        let posts = ids.iter().flat_map(|id| {
            (1..4).map(move |n| async move {
                server_ref
                    .post(
                        &format!("/v1/sessions/{id}/messages"),
                        &json!({"role": "user", "content": "refused by the disk", "key": format!("k-{n}")}),
                    )
                    .await
            })
        });
        let answers = futures_util::future::join_all(posts).await;
        for answer in answers {
            assert_eq!((answer.status, answer.kind()), (status, kind), "{answer:?}");
        }

        // The disk is healthy again: the same requests are acknowledged, once each.
        disk.free();
        for id in &ids {
            for n in 1..4 {
                let answer = server
                    .post(
                        &format!("/v1/sessions/{id}/messages"),
                        &json!({"role": "user", "content": "refused by the disk", "key": format!("k-{n}")}),
                    )
                    .await;
                assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
            }
        }
        let integrity = server.post("/v1/integrity", &json!({})).await;
        assert_eq!(integrity.body["clean"], true, "{integrity:?}");

        let runtime = server.runtime.clone();
        let _ = server.stop().await;
        drop(server);
        runtime
            .shutdown(std::time::Duration::from_secs(5))
            .await
            .ok();
        drop(runtime);
        let store = Store::open(&path, stored_options).unwrap();
        let stats = store.stats().unwrap();
        assert_eq!((stats.sessions, stats.messages), (2, 8), "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_explorer_layout_shows_pins_and_forgotten_items_as_the_context_does() {
    let (mut setup, tmp, root) = Setup::new();
    setup.config.compaction.fresh_tail = 4;
    setup.config.compaction.leaf_chunk_tokens = 2_000;
    setup.config.compaction.leaf_target_tokens = 200;
    let server = start(setup, tmp, root).await;
    let id = server.session("marked").await;
    let messages: Vec<Value> = (0..120)
        .map(|i| json!({
            "role": if i % 2 == 0 { "user" } else { "assistant" },
            "content": format!("turn {i}: the deployment of service {i} needs config key K{i} set to {}", i * 7),
        }))
        .collect();
    let answer = server
        .post(&format!("/v1/sessions/{id}/messages"), &json!(messages))
        .await;
    assert_eq!(answer.body["inserted"], 120, "{answer:?}");
    let compacted = server
        .get(&format!("/v1/sessions/{id}/context?budget=1500"))
        .await;
    assert_eq!(compacted.status, StatusCode::OK, "{compacted:?}");
    let layout_path = format!("/v1/sessions/{id}/layout");
    let layout = || server.get_ok(&layout_path);

    // Unmarked: no pins, nothing forgotten, no pinned block.
    let plain = layout().await;
    assert_eq!(plain["pinned"], json!([]), "{plain}");
    assert_eq!(plain["forgotten"], json!([]));
    assert_eq!(plain["pinned_block"], Value::Null);
    let raw_from = plain["raw_from"].as_u64().unwrap();
    assert!((1..119).contains(&raw_from), "{plain}");
    let top = plain["summaries"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(plain["summaries"][0]["forgotten"], false);

    // Pin a summarised message and a raw one; forget the first summary and a raw message.
    let tool = |name: &'static str, args: Value| {
        let path = format!("/v1/sessions/{id}/tools/{name}");
        let server = &server;
        async move {
            let answer = server.post(&path, &args).await;
            assert_eq!(answer.status, StatusCode::OK, "{name}: {answer:?}");
        }
    };
    let raw_pin = format!("msg_{}", 119);
    let raw_forgotten = format!("msg_{raw_from}");
    tool("lcm_pin", json!({"id": "msg_0"})).await;
    tool("lcm_pin", json!({"id": raw_pin})).await;
    tool("lcm_forget", json!({"id": top})).await;
    tool("lcm_forget", json!({"id": raw_forgotten})).await;

    let marked = layout().await;
    let pinned = marked["pinned"].as_array().unwrap();
    assert_eq!(pinned.len(), 2, "{marked}");
    assert_eq!(
        (&pinned[0]["id"], &pinned[0]["seq"], &pinned[0]["in_block"]),
        (&json!("msg_0"), &json!(0), &json!(true))
    );
    assert_eq!(
        (&pinned[1]["id"], &pinned[1]["in_block"]),
        (&json!(raw_pin), &json!(false))
    );
    let forgotten: Vec<&str> = marked["forgotten"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(forgotten, [raw_forgotten.as_str(), top.as_str()]);
    let first = &marked["summaries"][0];
    assert_eq!(first["forgotten"], true, "{first}");
    assert!(first["shown_tokens"].as_u64() < first["token_count"].as_u64());

    // The sizes are the ones the assembled context spends (lcm_describe's breakdown).
    let described = server.get(&format!("/v1/describe/{id}")).await;
    let breakdown = &described.body["context"]["breakdown"];
    assert_eq!(
        marked["pinned_block"],
        json!({"tokens": breakdown["pinned"]["tokens"], "messages": 1}),
        "{breakdown}"
    );
    let shown: u64 = marked["summaries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["shown_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(shown), breakdown["summaries"]["tokens"].as_u64());
    // The raw tail counts the forgotten message's pointer, as the context does.
    assert_eq!(
        marked["raw_tokens"].as_u64(),
        breakdown["messages"]["tokens"].as_u64(),
        "{marked}"
    );
    assert_ne!(marked["raw_tokens"], plain["raw_tokens"]);

    // The timeline says which messages carry a mark.
    let page = server
        .get(&format!("/v1/sessions/{id}/messages?from=0&limit=500"))
        .await;
    let marks: Vec<(&str, &str)> = page.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| Some((m["id"].as_str()?, m["mark"].as_str()?)))
        .collect();
    assert_eq!(
        marks,
        [
            ("msg_0", "pinned"),
            (raw_forgotten.as_str(), "forgotten"),
            (raw_pin.as_str(), "pinned")
        ]
    );

    // Unpinned and restored: the layout is the one before.
    tool("lcm_pin", json!({"id": "msg_0", "unpin": true})).await;
    tool("lcm_pin", json!({"id": raw_pin, "unpin": true})).await;
    tool("lcm_forget", json!({"id": top, "restore": true})).await;
    tool("lcm_forget", json!({"id": raw_forgotten, "restore": true})).await;
    assert_eq!(layout().await, plain);
}

#[tokio::test]
async fn the_explorer_layout_counts_large_parts_of_the_raw_tail_as_their_references() {
    let (mut setup, tmp, root) = Setup::new();
    setup.config.files.large_file_tokens = 300;
    setup.config.files.exploration_max_tokens = 120;
    let server = start(setup, tmp, root).await;
    let id = server.session("large").await;
    // Two pasted logs of about 1,500 tokens each among short turns; nothing compacted, so the
    // whole session is the raw tail.
    let log = |name: &str| {
        (0..150)
            .map(|i| format!("{name} line {i}: request {i} served in {} ms\n", i * 3 % 97))
            .collect::<String>()
    };
    let messages = json!([
        {"role": "user", "content": "here is the first log"},
        {"role": "user", "content": log("alpha")},
        {"role": "assistant", "content": "the first log is fine"},
        {"role": "user", "content": log("beta")},
        {"role": "assistant", "content": "the second log is fine too"},
    ]);
    let answer = server
        .post(&format!("/v1/sessions/{id}/messages"), &messages)
        .await;
    assert_eq!(answer.body["inserted"], 5, "{answer:?}");
    let layout_path = format!("/v1/sessions/{id}/layout");
    let layout = || server.get_ok(&layout_path);
    let describe_path = format!("/v1/describe/{id}");
    let context_messages = || async {
        let described = server.get_ok(&describe_path).await;
        described["context"]["breakdown"]["messages"]["tokens"].as_u64()
    };

    let plain = layout().await;
    assert_eq!(plain["raw_from"], 0, "{plain}");
    let stored = plain["session"]["token_total"].as_u64().unwrap();
    let raw = plain["raw_tokens"].as_u64().unwrap();
    // The logs are shown as their references: the tail shows far less than is stored.
    assert!(raw * 2 < stored, "raw {raw}, stored {stored}");
    assert_eq!(Some(raw), context_messages().await, "{plain}");

    // A forgotten log shows its pointer, counted as the context counts it.
    let forget = format!("/v1/sessions/{id}/tools/lcm_forget");
    let answer = server.post(&forget, &json!({"id": "msg_1"})).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let marked = layout().await;
    assert_ne!(marked["raw_tokens"], plain["raw_tokens"]);
    assert_eq!(
        marked["raw_tokens"].as_u64(),
        context_messages().await,
        "{marked}"
    );
    // A pinned log is listed with the tokens it shows, the ones its pin counts against the cap.
    let pin = format!("/v1/sessions/{id}/tools/lcm_pin");
    let pinned = server.post(&pin, &json!({"id": "msg_3"})).await;
    assert_eq!(pinned.status, StatusCode::OK, "{pinned:?}");
    let listed = &layout().await["pinned"][0];
    assert_eq!(listed["id"], "msg_3", "{listed}");
    let shown = listed["shown_tokens"].as_u64().expect("shown_tokens");
    assert_eq!(
        Some(shown),
        pinned.body["tokens"].as_u64(),
        "{listed} {pinned:?}"
    );
    assert!(
        shown * 2 < listed["token_count"].as_u64().unwrap(),
        "{listed}"
    );
}
