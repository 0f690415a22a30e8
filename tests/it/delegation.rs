//! Delegation through the runtime: Task, Tasks and lcm_expand_query with sub-agents driven by a
//! scripted tool-calling model on loopback (OpenAI shape). The scope-reduction guard stops a
//! chain that hands its whole task down at the first nested level, lets a narrowing chain run
//! to the bottom, and parallel Tasks run concurrently. A question about an early, compacted
//! detail is answered through lcm_expand_query; without a model, it returns the verbatim
//! excerpts instead.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::core::tokens::{Encoding, TokenCounter};
use lcm::engine::runtime::{
    ActorKind, Fault, FaultPoint, Runtime, RuntimeOptions, SUB_AGENT_END_MARKER,
};
use lcm::llm::extractive::ExtractiveSummarizer;
use lcm::llm::from_config::LlmClients;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use serde_json::{Value, json};

/// The task a sub-agent was given: the first user message.
fn task_of(req: &RecordedRequest) -> String {
    req.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// The content of the last message if it is a tool result.
fn last_tool_result(req: &RecordedRequest) -> Option<String> {
    let last = req.body["messages"].as_array()?.last()?;
    (last["role"] == "tool").then(|| last["content"].as_str().unwrap_or_default().to_string())
}

fn call(name: &str, args: Value) -> ScriptedReply {
    ScriptedReply::tool_calls([(name.to_string(), args.to_string())])
}

/// The scripted model. Behaviour is chosen by the sub-agent's task:
/// - `GREEDY ...`: tries to delegate its whole task, then does the work itself;
/// - `CHAIN n ...`: delegates a narrower part (`CHAIN n-1`) until 0, then answers;
/// - `SLEEP x`: answers `done x` (the server's latency makes it slow);
/// - anything else (expansion agents): expands the first `sum_N` of its task, then answers
///   with the ticket number it read and the message id it came from.
fn model(req: &RecordedRequest) -> ScriptedReply {
    let task = task_of(req);
    let result = last_tool_result(req);
    if let Some(rest) = task.strip_prefix("GREEDY ") {
        return match result {
            None => call(
                "Task",
                json!({"prompt": task, "delegated_scope": rest, "kept_work": "write the final report"}),
            ),
            Some(r) => ScriptedReply::ok(format!("did it myself after: {r}")),
        };
    }
    if let Some(rest) = task.strip_prefix("CHAIN ") {
        let n: u32 = rest
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or(0);
        if n == 0 {
            return ScriptedReply::ok("bottom reached");
        }
        return match result {
            None => call(
                "Task",
                json!({
                    "prompt": format!("CHAIN {} subtopic{} details", n - 1, n - 1),
                    "delegated_scope": format!("subtopic{} details only", n - 1),
                    "kept_work": format!("checking subtopic{n} conclusions myself"),
                }),
            ),
            Some(r) => ScriptedReply::ok(format!("level {n} done: {r}")),
        };
    }
    if let Some(x) = task.strip_prefix("SLEEP ") {
        return ScriptedReply::ok(format!("done {x}"));
    }
    match result {
        None => {
            let summary = task
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .find(|w| w.starts_with("sum_"))
                .unwrap_or("sum_0")
                .to_string();
            call("lcm_expand", json!({"summary_id": summary}))
        }
        Some(r) => {
            let expanded: Value = serde_json::from_str(&r).unwrap_or(Value::Null);
            let hit = expanded["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|i| i["content"].as_str().is_some_and(|c| c.contains("TICKET-")));
            match hit {
                Some(item) => {
                    let content = item["content"].as_str().unwrap_or_default();
                    let start = content.find("TICKET-").unwrap_or(0);
                    let ticket: String = content[start..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '-')
                        .collect();
                    ScriptedReply::ok(format!(
                        "The ticket was {ticket} (see {}).",
                        item["id"].as_str().unwrap_or_default()
                    ))
                }
                None => ScriptedReply::ok("not found"),
            }
        }
    }
}

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

async fn runtime_with_model(server: &ScriptedServer) -> Runtime {
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).unwrap();
    let mut config = Config::default();
    config.runtime.subagent_max_steps = 8;
    config.runtime.restart_backoff_ms = 5;
    config.compaction.fresh_tail = 4;
    config.compaction.leaf_chunk_tokens = 400;
    config.compaction.leaf_target_tokens = 100;
    Runtime::open(
        RuntimeOptions::in_memory(config)
            .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter())))
            .with_llm(LlmClients::new(Arc::new(provider))),
    )
    .await
    .expect("runtime")
}

async fn scripted() -> ScriptedServer {
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::from_fn(model));
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegating_the_whole_task_is_stopped_at_the_first_nested_level() {
    let server = scripted().await;
    let rt = runtime_with_model(&server).await;
    let main = rt.session("main").await.unwrap();
    let out = main
        .call_tool("Task", json!({"prompt": "GREEDY audit the billing module"}))
        .await
        .expect("the root's Task runs");
    let answer = out["answer"].as_str().unwrap_or_default();
    assert!(answer.starts_with("did it myself"), "{out}");
    assert!(answer.contains("Do this work directly"), "{answer}");
    let stats = rt.delegation_stats().await.unwrap();
    assert_eq!(stats.started, 1, "{stats:?}");
    assert_eq!(stats.rejected, 1, "{stats:?}");
    assert_eq!(stats.max_depth, 1, "{stats:?}");
    // The sub-agent's conversation is its own session, linked to the main one.
    let child: lcm::core::ids::SessionId = serde_json::from_value(out["session"].clone()).unwrap();
    let info = rt.store().session(child).unwrap();
    assert_eq!(info.parent, Some(main.id()));
    assert!(info.message_count >= 4, "{info:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrowing_chain_runs_to_the_bottom() {
    let server = scripted().await;
    let rt = runtime_with_model(&server).await;
    let main = rt.session("main").await.unwrap();
    let out = main
        .call_tool("Task", json!({"prompt": "CHAIN 3 the billing audit"}))
        .await
        .expect("chain");
    let answer = out["answer"].as_str().unwrap_or_default();
    // Each level answers with what its sub-agent returned (the Task tool's JSON result).
    assert!(answer.starts_with("level 3 done: "), "{answer}");
    let (l2, l1, bottom) = (
        answer.find("level 2 done"),
        answer.find("level 1 done"),
        answer.find("bottom reached"),
    );
    assert!(l2 < l1 && l1 < bottom && l2.is_some(), "{answer}");
    let stats = rt.delegation_stats().await.unwrap();
    assert_eq!(stats.rejected, 0, "{stats:?}");
    assert_eq!(stats.started, 4, "{stats:?}");
    assert_eq!(stats.max_depth, 4, "{stats:?}");
    assert_eq!(stats.max_fanout, 1, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_tasks_run_concurrently() {
    let server = scripted().await;
    let latency = Duration::from_millis(400);
    server.set_latency(latency);
    let rt = runtime_with_model(&server).await;
    let main = rt.session("main").await.unwrap();
    let started = Instant::now();
    let out = main
        .call_tool(
            "Tasks",
            json!({"tasks": [{"prompt": "SLEEP a"}, {"prompt": "SLEEP b"}, {"prompt": "SLEEP c"}, {"prompt": "SLEEP d"}]}),
        )
        .await
        .expect("tasks");
    let elapsed = started.elapsed();
    let answers: Vec<&str> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["answer"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(answers, ["done a", "done b", "done c", "done d"], "{out}");
    // Sequential would take 4 x 400 ms; concurrent takes about one call.
    assert!(elapsed >= latency, "{elapsed:?}");
    assert!(elapsed < latency * 5 / 2, "{elapsed:?} is not concurrent");
    assert_eq!(rt.delegation_stats().await.unwrap().max_fanout, 4);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A conversation whose early turns mention a ticket number, compacted so that the ticket is
/// only in summaries' sources.
async fn compacted_history(rt: &Runtime) -> lcm::engine::runtime::SessionHandle {
    let s = rt.session("history").await.unwrap();
    s.append(
        NewMessage::text(
            Role::User,
            "Please file the outage under TICKET-4821 for the record.",
        )
        .with_source_key("t0"),
    )
    .await
    .unwrap();
    for i in 1..80 {
        let role = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        s.append(
            NewMessage::text(
                role,
                format!(
                    "turn {i}: we discussed the rollout of service s{} and its canary",
                    i % 5
                ),
            )
            .with_source_key(format!("t{i}")),
        )
        .await
        .unwrap();
    }
    // Compaction runs in the background above the soft threshold, and the turn waits above
    // the hard one: a small budget forces it.
    let ctx = s.context(900).await.unwrap();
    assert!(ctx.tokens <= 900);
    assert!(!rt.store().session_summaries(s.id()).unwrap().is_empty());
    rt.flush_index().await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_detail_is_answered_through_lcm_expand_query() {
    let server = scripted().await;
    let rt = runtime_with_model(&server).await;
    let s = compacted_history(&rt).await;
    // The main agent may not expand; it is told to use lcm_expand_query.
    let err = s
        .call_tool("lcm_expand", json!({"summary_id": "sum_0"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("lcm_expand_query"), "{err}");
    let out = s
        .call_tool(
            "lcm_expand_query",
            json!({"query": "outage ticket", "prompt": "Which ticket was the outage filed under?"}),
        )
        .await
        .expect("expand query");
    let answer = out["answer"].as_str().unwrap_or_default();
    assert!(answer.contains("TICKET-4821"), "{out}");
    assert!(!out["cited_ids"].as_array().unwrap().is_empty(), "{out}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_expand_query_returns_excerpts_and_task_says_why() {
    let mut config = Config::default();
    config.compaction.fresh_tail = 4;
    config.compaction.leaf_chunk_tokens = 400;
    config.compaction.leaf_target_tokens = 100;
    let rt = Runtime::open(
        RuntimeOptions::in_memory(config)
            .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter()))),
    )
    .await
    .unwrap();
    let s = compacted_history(&rt).await;
    let before = rt.store().stats().unwrap();
    let out = s
        .call_tool(
            "lcm_expand_query",
            json!({"query": "outage ticket", "prompt": "Which ticket?", "max_tokens": 500}),
        )
        .await
        .expect("excerpts");
    assert!(out["answer"].is_null());
    assert!(out["note"].as_str().unwrap().contains("no model"));
    let text = out["excerpts"].to_string();
    assert!(text.contains("TICKET-4821"), "{out}");
    let err = s
        .call_tool("Task", json!({"prompt": "do something"}))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no model is configured"), "{err}");
    assert_eq!(rt.store().stats().unwrap().sessions, before.sessions);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agent_that_crashes_mid_call_is_run_again() {
    let server = scripted().await;
    let rt = runtime_with_model(&server).await;
    rt.faults()
        .arm(FaultPoint::DelegationMidLlmCall, Fault::Panic, 0, 1);
    let main = rt.session("main").await.unwrap();
    let out = main
        .call_tool("Task", json!({"prompt": "SLEEP once"}))
        .await
        .expect("the task survives its worker's crash");
    assert_eq!(out["answer"], "done once");
    assert_eq!(rt.faults().fired(FaultPoint::DelegationMidLlmCall), 1);
    let stats = rt.delegation_stats().await.unwrap();
    assert_eq!(stats.worker_failures, 1, "{stats:?}");
    let outcome = rt.check_integrity(false).await.unwrap();
    assert!(outcome.report.is_clean(), "{:?}", outcome.report.violations);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// How a child session of `parent` ended: `Ok(answer)` when its last message is the
/// sub-agent's final answer (an assistant turn), `Err(marker)` when it is the end marker.
/// Panics on anything else: a half-made session (no message, or a last turn that is neither).
fn child_endings(rt: &Runtime, parent: lcm::core::ids::SessionId) -> Vec<Result<String, String>> {
    let store = rt.store();
    let mut endings = Vec::new();
    for info in store.sessions().unwrap() {
        if info.parent != Some(parent) {
            continue;
        }
        let messages = store.session_messages(info.id, 0..u64::MAX).unwrap();
        let last = messages
            .last()
            .unwrap_or_else(|| panic!("child session {} has no message at all", info.id));
        let text = last.search_text().into_owned();
        match last.role {
            Role::System if text.starts_with(SUB_AGENT_END_MARKER) => endings.push(Err(text)),
            Role::Assistant => endings.push(Ok(text)),
            other => panic!("child session {} ends half-made: {other:?} {text}", info.id),
        }
    }
    endings
}

fn delegation_restarts(stats: &lcm::engine::runtime::SupervisorStats) -> u64 {
    stats
        .restarts
        .iter()
        .find(|(k, _)| *k == ActorKind::Delegation)
        .map_or(0, |(_, n)| *n)
}

/// The DelegationActor itself panics while starting the third of four parallel sub-agents, two
/// of them in flight (their workers die with it). The restarted actor resumes the runs it finds
/// in the ledger in their own child sessions, the request still in the dead actor's mailbox is
/// sent again, and every caller gets its answer: four child sessions, each ending with its
/// answer, none half-made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_delegation_actor_crashing_with_sub_agents_in_flight_resumes_them() {
    let server = scripted().await;
    server.set_latency(Duration::from_millis(300));
    let rt = runtime_with_model(&server).await;
    rt.faults()
        .arm(FaultPoint::DelegationActorBeforeWorker, Fault::Panic, 2, 1);
    let main = rt.session("main").await.unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        main.call_tool(
            "Tasks",
            json!({"tasks": [{"prompt": "SLEEP a"}, {"prompt": "SLEEP b"}, {"prompt": "SLEEP c"}, {"prompt": "SLEEP d"}]}),
        ),
    )
    .await
    .expect("no caller hangs")
    .expect("tasks");
    let answers: Vec<&str> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["answer"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(answers, ["done a", "done b", "done c", "done d"], "{out}");
    assert_eq!(
        rt.faults().fired(FaultPoint::DelegationActorBeforeWorker),
        1
    );
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(delegation_restarts(&stats), 1, "{stats:?}");
    let mut endings = child_endings(&rt, main.id());
    endings.sort();
    assert_eq!(
        endings,
        ["done a", "done b", "done c", "done d"].map(|a| Ok(a.to_string())),
        "one session per task, each ending with its answer"
    );
    assert_eq!(rt.delegation_stats().await.unwrap().running, 0);
    let outcome = rt.check_integrity(false).await.unwrap();
    assert!(outcome.report.is_clean(), "{:?}", outcome.report.violations);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The DelegationActor panics after a sub-agent answered, before its caller got the answer:
/// the restarted actor delivers the answer it finds in the ledger; the sub-agent is not run
/// again (one model call).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_actor_crash_before_the_reply_still_delivers_the_answer() {
    let server = scripted().await;
    let rt = runtime_with_model(&server).await;
    rt.faults()
        .arm(FaultPoint::DelegationActorBeforeReply, Fault::Panic, 0, 1);
    let main = rt.session("main").await.unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        main.call_tool("Task", json!({"prompt": "SLEEP once"})),
    )
    .await
    .expect("no caller hangs")
    .expect("the answer survives the crash");
    assert_eq!(out["answer"], "done once");
    assert_eq!(rt.faults().fired(FaultPoint::DelegationActorBeforeReply), 1);
    assert_eq!(server.request_count(), 1, "the sub-agent ran once");
    assert_eq!(
        delegation_restarts(&rt.supervisor_stats().await.unwrap()),
        1
    );
    assert_eq!(child_endings(&rt, main.id()), [Ok("done once".to_string())]);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A run that cannot be resumed (its one attempt was in flight when the DelegationActor
/// crashed) fails cleanly: its child session ends with the end marker, its caller gets an error
/// naming the session; the run whose start crashed the actor is resumed and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_that_cannot_be_resumed_fails_with_its_session_marked() {
    let server = scripted().await;
    server.set_latency(Duration::from_millis(800));
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).unwrap();
    let mut config = Config::default();
    config.runtime.subagent_max_steps = 8;
    config.runtime.restart_backoff_ms = 5;
    config.runtime.subagent_max_attempts = 1;
    let rt = Runtime::open(
        RuntimeOptions::in_memory(config)
            .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter())))
            .with_llm(LlmClients::new(Arc::new(provider))),
    )
    .await
    .unwrap();
    // The second run's start crashes the actor while the first one's model call is in flight.
    rt.faults()
        .arm(FaultPoint::DelegationActorBeforeWorker, Fault::Panic, 1, 1);
    let main = rt.session("main").await.unwrap();
    let first = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let main = rt.session("main").await.unwrap();
            main.call_tool("Task", json!({"prompt": "SLEEP a"})).await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.delegation_stats().await.unwrap().running == 0 {
        assert!(
            Instant::now() < deadline,
            "the first sub-agent never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = tokio::time::timeout(
        Duration::from_secs(60),
        main.call_tool("Task", json!({"prompt": "SLEEP b"})),
    )
    .await
    .expect("no caller hangs")
    .expect("the run that crashed the actor is resumed");
    assert_eq!(second["answer"], "done b");
    let first = tokio::time::timeout(Duration::from_secs(60), first)
        .await
        .expect("no caller hangs")
        .unwrap();
    let err = first
        .expect_err("its only attempt died with the actor")
        .to_string();
    assert!(err.contains("marked as ended"), "{err}");
    assert!(err.contains("delegation actor crashed"), "{err}");
    let mut endings = child_endings(&rt, main.id());
    endings.sort();
    assert_eq!(endings.len(), 2, "{endings:?}");
    assert_eq!(endings[0], Ok("done b".to_string()));
    let marker = endings[1].clone().unwrap_err();
    assert!(marker.contains("delegation actor crashed"), "{marker}");
    let outcome = rt.check_integrity(false).await.unwrap();
    assert!(outcome.report.is_clean(), "{:?}", outcome.report.violations);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The runtime shutting down under a sub-agent ends it cleanly: its caller gets an error and
/// its child session ends with the end marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_under_a_sub_agent_marks_its_session() {
    let server = scripted().await;
    server.set_latency(Duration::from_secs(3));
    let rt = runtime_with_model(&server).await;
    let main = rt.session("main").await.unwrap();
    let running = {
        let rt = rt.clone();
        tokio::spawn(async move {
            let main = rt.session("main").await.unwrap();
            main.call_tool("Task", json!({"prompt": "SLEEP z"})).await
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.delegation_stats().await.unwrap().running == 0 {
        assert!(Instant::now() < deadline, "the sub-agent never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("no caller hangs")
        .unwrap()
        .expect_err("the runtime stopped under it")
        .to_string();
    assert!(err.contains("runtime stopped"), "{err}");
    let endings = child_endings(&rt, main.id());
    assert_eq!(endings.len(), 1, "{endings:?}");
    let marker = endings[0].clone().unwrap_err();
    assert!(marker.contains("runtime stopped"), "{marker}");
}

/// Sub-agents are LCM-managed: a sub-agent that reads eight large pages of a file sends, at
/// every step, its session's context fitted to `runtime.subagent_context_tokens` (large results
/// by their file references, older steps compacted), never the whole growing conversation;
/// its session still holds every result verbatim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_agents_requests_stay_within_its_context_window() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.log");
    let lines: Vec<String> = (0..16_000)
        .map(|i| {
            format!(
                "2026-03-01T10:00:{:02}Z INFO request {i} served by worker {} in {}ms",
                i % 60,
                i % 7,
                i % 97
            )
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).unwrap();
    let server = ScriptedServer::start().await;
    let steps = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&steps);
    let file = path.to_str().unwrap().to_owned();
    server.set_default(ScriptedReply::from_fn(move |_req| {
        let step = counted.fetch_add(1, Ordering::SeqCst);
        if step < 8 {
            call(
                "read_file",
                json!({"path": file, "offset": step * 2_000, "limit": 2_000}),
            )
        } else {
            ScriptedReply::ok("read all eight pages")
        }
    }));
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).unwrap();
    let mut config = Config::default();
    config.runtime.subagent_max_steps = 12;
    config.runtime.subagent_context_tokens = 6_000;
    config.map.allowed_roots = vec![dir.path().to_path_buf()];
    config.compaction.leaf_chunk_tokens = 2_000;
    config.compaction.leaf_target_tokens = 200;
    let rt = Runtime::open(
        RuntimeOptions::in_memory(config)
            .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter())))
            .with_llm(LlmClients::new(Arc::new(provider))),
    )
    .await
    .expect("runtime");
    let main = rt.session("main").await.unwrap();
    let out = main
        .call_tool("Task", json!({"prompt": "Read big.log page by page."}))
        .await
        .expect("task");
    assert_eq!(out["answer"], "read all eight pages", "{out}");
    let requests = server.requests();
    assert_eq!(requests.len(), 9);
    let counter = counter();
    let mut largest = 0;
    for (i, request) in requests.iter().enumerate() {
        let messages = request.body["messages"].as_array().unwrap();
        let tokens: usize = messages
            .iter()
            .map(|m| {
                let content = m["content"].as_str().map_or(0, |c| counter.count_text(c));
                let calls = m["tool_calls"].as_array().map_or(0, |calls| {
                    calls
                        .iter()
                        .map(|c| counter.count_text(&c["function"].to_string()))
                        .sum()
                });
                content + calls + 4
            })
            .sum();
        assert!(tokens <= 6_000, "request {i}: {tokens} tokens of messages");
        largest = largest.max(tokens);
        assert_eq!(
            messages[0]["role"], "system",
            "request {i} keeps the system prompt"
        );
    }
    // Without the window the last request would carry eight pages of 2,000 lines.
    assert!(largest > 1_000, "{largest}");
    // The sub-agent's session holds every page verbatim.
    let session: lcm::SessionId = out["session"].as_str().unwrap().parse().unwrap();
    let stored = rt.store().session_messages(session, 0..u64::MAX).unwrap();
    let results: Vec<String> = stored
        .iter()
        .flat_map(|m| m.parts.iter())
        .filter_map(|p| match p {
            lcm::core::message::Part::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 8);
    assert!(
        results[7].contains("request 15999 served"),
        "{:.200}",
        results[7]
    );
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A runtime on a store whose disk fills while a sub-agent thinks (it answers all the same),
/// with the scripted model's server and the store's directory.
async fn runtime_whose_disk_fills_under_a_sub_agent() -> (
    Runtime,
    lcm::store::disk_faults::DiskSwitch,
    ScriptedServer,
    tempfile::TempDir,
) {
    use lcm::store::disk_faults::DiskSwitch;
    use lcm::store::{Store, StoreOptions};

    let server = ScriptedServer::start().await;
    let disk = DiskSwitch::default();
    let filled = disk.clone();
    // The disk fills while the sub-agent thinks; it answers all the same.
    server.set_default(ScriptedReply::from_fn(move |_| {
        filled.fill();
        ScriptedReply::ok("done")
    }));
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open_on_faulty_disk(
        tmp.path().join("lcm.redb"),
        StoreOptions::new(counter()),
        disk.clone(),
    )
    .unwrap();
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).unwrap();
    let rt = Runtime::open_on_store(
        store,
        RuntimeOptions::in_memory(Config::default())
            .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter())))
            .with_llm(LlmClients::new(Arc::new(provider))),
    )
    .await
    .unwrap();
    (rt, disk, server, tmp)
}

/// The role and text of the last message of `parent`'s (one) child session in `store`.
fn last_of_child(store: &lcm::store::Store, parent: lcm::core::ids::SessionId) -> (Role, String) {
    let child = store
        .sessions()
        .unwrap()
        .into_iter()
        .find(|s| s.parent == Some(parent))
        .expect("the child session was created before the disk filled");
    let messages = store.session_messages(child.id, 0..u64::MAX).unwrap();
    let last = messages.last().expect("the task's prompt");
    (last.role, last.search_text().into_owned())
}

/// Regression (found by the crash campaign's power-loss trials): a sub-agent whose turns could
/// not be stored (the disk failed under it) was reported done, its answer acknowledged with a
/// session that holds none of the turns it rests on. Its Task now fails, and its child
/// session gets the end marker once the disk takes writes again (on the full disk it cannot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_whose_turns_cannot_be_stored_fails() {
    let (rt, disk, _server, _tmp) = runtime_whose_disk_fills_under_a_sub_agent().await;
    let main = rt.session("main").await.unwrap();
    let out = main
        .call_tool("Task", json!({"prompt": "answer at once"}))
        .await;
    assert!(disk.is_full(), "the model was asked");
    let error = out.expect_err("a delegation whose turns were not stored is not done");
    assert!(error.to_string().contains("could not"), "{error}");
    assert!(
        error
            .to_string()
            .contains("once the disk accepts writes again"),
        "{error}"
    );
    // The marker could not be stored (the message says so); once the disk is free, it is.
    let child_last = || last_of_child(rt.store(), main.id());
    disk.free();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !child_last().1.starts_with(SUB_AGENT_END_MARKER) {
        assert!(
            Instant::now() < deadline,
            "no end marker 20 s after the disk was freed: {:?}",
            child_last()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let endings = child_endings(&rt, main.id());
    assert_eq!(endings.len(), 1, "{endings:?}");
    let marker = endings[0].clone().unwrap_err();
    assert!(marker.contains("could not"), "{marker}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// An end marker still waiting for the disk when the runtime stops is given up (the session is
/// left as a crash would leave it): its retries do not keep the store open after shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_marker_waiting_for_a_full_disk_does_not_outlive_the_runtime() {
    let (rt, disk, _server, tmp) = runtime_whose_disk_fills_under_a_sub_agent().await;
    let main = rt.session("main").await.unwrap();
    let error = main
        .call_tool("Task", json!({"prompt": "answer at once"}))
        .await
        .expect_err("a delegation whose turns were not stored is not done");
    assert!(
        error
            .to_string()
            .contains("once the disk accepts writes again"),
        "{error}"
    );
    assert!(disk.is_full());
    let parent = main.id();
    // Shutdown waits at most 5 s for every holder of the runtime's shared state to let go: a
    // retry that kept its hold would make it take all of them.
    let stopping = Instant::now();
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(5), "shutdown waited {took:?}");
    drop(main);
    drop(rt);
    disk.free();
    let reopened = lcm::store::Store::open(
        tmp.path().join("lcm.redb"),
        lcm::store::StoreOptions::new(counter()),
    )
    .unwrap();
    // The retry gave up with the runtime: the child session ends as a crash leaves it.
    let (_, last) = last_of_child(&reopened, parent);
    assert!(!last.starts_with(SUB_AGENT_END_MARKER), "{last}");
}
