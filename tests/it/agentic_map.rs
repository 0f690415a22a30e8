//! `agentic_map` through the runtime: each item runs a sub-agent (DelegationActor) driven by a
//! scripted tool-calling model on loopback (OpenAI shape), with the file tools and the LCM
//! tools. Shows: item agents read files; a read-only job's write attempt is refused and nothing
//! is written (while a `read_only: false` job may write); a nested agentic_map over a strictly
//! smaller input runs (and one over an input as large as its parent's is refused); an item
//! whose agent never gives a valid answer fails alone while every other item completes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lcm::core::config::Config;
use lcm::core::tokens::{Encoding, TokenCounter};
use lcm::engine::runtime::{Runtime, RuntimeOptions};
use lcm::llm::extractive::ExtractiveSummarizer;
use lcm::llm::from_config::LlmClients;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use serde_json::{Value, json};

/// The sub-agent's task: its first user message.
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

/// The item an agentic_map item agent was given (the JSON after "The item (JSON):").
fn item_of(task: &str) -> Value {
    let Some(start) = task.find("The item (JSON):\n") else {
        return Value::Null;
    };
    let rest = &task[start + "The item (JSON):\n".len()..];
    let line = rest.lines().next().unwrap_or_default();
    serde_json::from_str(line).unwrap_or(Value::Null)
}

/// The tool results the agent got so far, oldest first.
fn tool_results(req: &RecordedRequest) -> Vec<String> {
    req.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn call(name: &str, args: Value) -> ScriptedReply {
    ScriptedReply::tool_calls([(name.to_string(), args.to_string())])
}

fn answer(value: Value) -> ScriptedReply {
    ScriptedReply::ok(value.to_string())
}

fn child_schema() -> Value {
    json!({"type": "object", "required": ["doubled"], "properties": {"doubled": {"type": "integer"}}})
}

/// The scripted model; `dir` is the allowed root holding the files.
fn model(dir: &Path, req: &RecordedRequest) -> ScriptedReply {
    let task = task_of(req);
    let item = item_of(&task);
    let results = tool_results(req);
    let id = item["id"].clone();
    if task.starts_with("CHILD") {
        let n = item["n"].as_i64().unwrap_or(0);
        return answer(json!({"doubled": n * 2}));
    }
    match item["op"].as_str().unwrap_or_default() {
        "read" => match results.last() {
            None => call(
                "read_file",
                json!({"path": dir.join(item["file"].as_str().unwrap_or_default())}),
            ),
            Some(result) => {
                let read: Value = serde_json::from_str(result).unwrap_or(Value::Null);
                let first = read["content"]
                    .as_str()
                    .unwrap_or("unreadable")
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string();
                answer(json!({"id": id, "first_line": first}))
            }
        },
        "write" => match results.last() {
            None => call(
                "write_file",
                json!({"path": dir.join(item["file"].as_str().unwrap_or_default()), "content": "written by an item agent"}),
            ),
            Some(result) => answer(json!({"id": id, "write_result": result})),
        },
        // Never a valid answer: the item fails once its attempts are used up.
        "fail" => ScriptedReply::ok("I would rather not answer in JSON."),
        "nest" | "nest_same" => match results.last() {
            None => {
                let input = if item["op"] == "nest" {
                    "sub.jsonl"
                } else {
                    "items.jsonl"
                };
                call(
                    "agentic_map",
                    json!({
                        "input_path": dir.join(input),
                        "output_path": dir.join(format!("nested-{id}.out.jsonl")),
                        "prompt": "CHILD: double n.",
                        "output_schema": child_schema(),
                        "concurrency": 2,
                    }),
                )
            }
            Some(result) => answer(json!({"id": id, "nested": result})),
        },
        _ => answer(json!({"id": id})),
    }
}

async fn runtime(server: &ScriptedServer, root: &Path) -> Runtime {
    let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).expect("client");
    let mut config = Config::default();
    config.runtime.subagent_max_steps = 6;
    config.runtime.restart_backoff_ms = 5;
    config.map.allowed_roots = vec![root.to_path_buf()];
    config.map.max_attempts = 2;
    config.map.timeout_s = 60;
    let counter = TokenCounter::new(Encoding::O200kBase);
    Runtime::open(
        RuntimeOptions::in_memory(config)
            .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter)))
            .with_llm(LlmClients::new(Arc::new(provider))),
    )
    .await
    .expect("runtime")
}

fn write_jsonl(path: &Path, items: &[Value]) {
    let text: String = items.iter().map(|i| format!("{i}\n")).collect();
    std::fs::write(path, text).expect("write input");
}

fn read_output(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("output")
        .lines()
        .map(|l| serde_json::from_str(l).expect("output line is JSON"))
        .collect()
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    server: ScriptedServer,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().canonicalize().expect("canonical root");
    std::fs::create_dir(root.join("notes")).expect("notes dir");
    std::fs::write(root.join("notes/a.txt"), "alpha first line\nmore").expect("a.txt");
    std::fs::write(root.join("notes/b.txt"), "beta first line\n").expect("b.txt");
    write_jsonl(
        &root.join("sub.jsonl"),
        &[json!({"n": 10}), json!({"n": 21})],
    );
    let server = ScriptedServer::start().await;
    let model_root = root.clone();
    server.set_default(ScriptedReply::from_fn(move |req| model(&model_root, req)));
    Fixture {
        _dir: dir,
        root,
        server,
    }
}

fn parent_schema() -> Value {
    json!({"type": "object", "required": ["id"], "properties": {"id": {"type": "integer"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn item_agents_use_tools_nest_smaller_maps_and_fail_alone() {
    let fx = fixture().await;
    let items = [
        json!({"id": 1, "op": "read", "file": "notes/a.txt"}),
        json!({"id": 2, "op": "write", "file": "notes/out.txt"}),
        json!({"id": 3, "op": "fail"}),
        json!({"id": 4, "op": "nest"}),
        json!({"id": 5, "op": "nest_same"}),
        json!({"id": 6, "op": "read", "file": "notes/b.txt"}),
    ];
    write_jsonl(&fx.root.join("items.jsonl"), &items);
    let rt = runtime(&fx.server, &fx.root).await;
    let main = rt.session("main").await.expect("session");

    let summary = main
        .call_tool(
            "agentic_map",
            json!({
                "input_path": fx.root.join("items.jsonl"),
                "prompt": "PARENT: process the item with your tools.",
                "output_schema": parent_schema(),
                "concurrency": 3,
            }),
        )
        .await
        .expect("the job runs to its end");
    assert_eq!(summary["total"], 6, "{summary}");
    assert_eq!(summary["completed"], 5, "{summary}");
    assert_eq!(summary["failed"], 1, "{summary}");

    let output_path = PathBuf::from(summary["output_path"].as_str().expect("output path"));
    let out = read_output(&output_path);
    assert_eq!(out.len(), 6);
    for (i, line) in out.iter().enumerate() {
        assert_eq!(line["index"], i as u64, "output in input order: {line}");
    }
    // Item agents read the files through read_file.
    assert_eq!(out[0]["ok"], true, "{}", out[0]);
    assert_eq!(out[0]["result"]["first_line"], "alpha first line");
    assert_eq!(out[5]["result"]["first_line"], "beta first line");

    // Read-only (the default): the write was refused and nothing was written.
    let write_result = out[1]["result"]["write_result"]
        .as_str()
        .unwrap_or_default();
    assert!(write_result.contains("write_file"), "{write_result}");
    assert!(write_result.starts_with("error"), "{write_result}");
    assert!(!fx.root.join("notes/out.txt").exists());

    // Failure isolation: the item that never answered in JSON failed after its attempts; the
    // others completed.
    assert_eq!(out[2]["ok"], false, "{}", out[2]);
    assert_eq!(out[2]["attempts"], 2, "{}", out[2]);
    assert!(
        out[2]["error"].to_string().contains("JSON"),
        "the failure says why: {}",
        out[2]
    );

    // The nested map over a smaller input ran both of its items, as children of the item agent.
    let nested: Value =
        serde_json::from_str(out[3]["result"]["nested"].as_str().unwrap_or_default())
            .expect("the nested map's summary");
    assert_eq!(nested["completed"], 2, "{nested}");
    let nested_out = read_output(&fx.root.join("nested-4.out.jsonl"));
    let doubled: Vec<i64> = nested_out
        .iter()
        .map(|l| l["result"]["doubled"].as_i64().unwrap_or(-1))
        .collect();
    assert_eq!(doubled, vec![20, 42]);

    // A nested map over an input as large as its parent's is refused, with the reason.
    let refused = out[4]["result"]["nested"].as_str().unwrap_or_default();
    assert!(refused.contains("strictly smaller"), "{refused}");
    assert!(!fx.root.join("nested-5.out.jsonl").exists());

    // Every item agent's conversation is a session of its own in the store, linked to the
    // session of the agent that started the map (the main agent, or the nesting item agent).
    let sessions = rt.store().sessions().expect("sessions");
    let children: Vec<_> = sessions
        .iter()
        .filter(|s| s.parent == Some(main.id()))
        .collect();
    // 6 items, the failing one twice (two attempts).
    assert_eq!(children.len(), 7, "{children:?}");
    let grandchildren = sessions
        .iter()
        .filter(|s| s.parent.is_some_and(|p| children.iter().any(|c| c.id == p)))
        .count();
    assert_eq!(grandchildren, 2, "the nested map's two item agents");
    let outcome = rt.check_integrity(false).await.expect("integrity");
    assert!(outcome.report.is_clean(), "{:?}", outcome.report);
    rt.shutdown(Duration::from_secs(10))
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_that_is_not_read_only_may_write_inside_the_roots() {
    let fx = fixture().await;
    write_jsonl(
        &fx.root.join("items.jsonl"),
        &[json!({"id": 1, "op": "write", "file": "notes/out.txt"})],
    );
    let rt = runtime(&fx.server, &fx.root).await;
    let main = rt.session("main").await.expect("session");
    let summary = main
        .call_tool(
            "agentic_map",
            json!({
                "input_path": fx.root.join("items.jsonl"),
                "prompt": "PARENT: process the item with your tools.",
                "output_schema": parent_schema(),
                "read_only": false,
            }),
        )
        .await
        .expect("the job runs");
    assert_eq!(summary["completed"], 1, "{summary}");
    let written = std::fs::read_to_string(fx.root.join("notes/out.txt")).expect("written");
    assert_eq!(written, "written by an item agent");
    rt.shutdown(Duration::from_secs(10))
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_outside_the_allowed_roots_is_refused_before_any_call() {
    let fx = fixture().await;
    let rt = runtime(&fx.server, &fx.root).await;
    let main = rt.session("main").await.expect("session");
    let error = main
        .call_tool(
            "agentic_map",
            json!({
                "input_path": "/etc/hostname",
                "prompt": "PARENT: anything.",
                "output_schema": parent_schema(),
            }),
        )
        .await
        .expect_err("outside the roots");
    assert!(error.to_string().contains("allowed"), "{error}");
    assert_eq!(fx.server.request_count(), 0);
    assert!(rt.store().jobs().expect("jobs").is_empty());
    rt.shutdown(Duration::from_secs(10))
        .await
        .expect("shutdown");
}
