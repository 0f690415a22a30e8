//! `lcm mcp` as a process, driven by a real MCP client (rmcp over the child's stdin and
//! stdout) on a data directory configured with the extractive summariser and no model. With
//! `--session history` the server works in that session: the tools are listed with object
//! schemas; appended messages are found by lcm_grep with their
//! ids and described; lcm_context compacts to fit its budget; lcm_expand_query without a model
//! returns excerpts and says so; llm_map without a model is a clear tool error; bad arguments
//! are tool errors with the schema's message and change nothing; an unknown tool is a protocol
//! error. Closing stdin stops the server cleanly and releases the store. Without `--session`
//! the server works in no session: lcm_grep searches every session, and lcm_append /
//! lcm_context without a `session` are tool errors that store nothing. A raw client checks
//! that stdout carries nothing but JSON-RPC, even with debug logging on.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ErrorCode};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

pub(crate) type Client = RunningService<RoleClient, ()>;

/// The extractive summariser (no model), small compaction spans so a few dozen messages
/// compact, the temporary directory as the only map root, a short shutdown grace.
fn data_dir(tmp: &Path) -> PathBuf {
    let data = tmp.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let config = format!(
        r#"
[llm]
provider = "extractive"

[compaction]
fresh_tail = 4
leaf_chunk_tokens = 400
leaf_target_tokens = 100

[map]
allowed_roots = [{root}]

[server]
shutdown_grace_s = 2
"#,
        root = toml::Value::String(tmp.to_string_lossy().into_owned())
    );
    std::fs::write(data.join("config.toml"), config).unwrap();
    data
}

/// `lcm mcp` on `data`, working in `session` if given.
pub(crate) fn lcm_command(data: &Path, session: Option<&str>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_lcm"));
    cmd.arg("--data-dir")
        .arg(data)
        .arg("mcp")
        .env_remove("LCM_CONFIG")
        .env_remove("LCM_LOG");
    if let Some(session) = session {
        cmd.args(["--session", session]);
    }
    cmd
}

pub(crate) async fn call(client: &Client, name: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{name}: protocol error {e}"))
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text())
        .map(|t| t.text.as_str())
        .collect()
}

/// The JSON answer of a successful call (its structured content, equal to its text).
pub(crate) fn ok(name: &str, result: CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(false), "{name}: {}", text(&result));
    let value = result
        .structured_content
        .clone()
        .expect("structured content");
    let from_text: Value = serde_json::from_str(&text(&result)).expect("the text is JSON");
    assert_eq!(value, from_text);
    value
}

/// The message of a failed call.
fn tool_error(name: &str, result: CallToolResult) -> String {
    assert_eq!(
        result.is_error,
        Some(true),
        "{name} should fail: {}",
        text(&result)
    );
    text(&result)
}

/// Session count, and the history session's message count, through lcm_sessions.
async fn counts(client: &Client) -> (u64, u64) {
    let listed = ok(
        "lcm_sessions",
        call(client, "lcm_sessions", json!({})).await,
    );
    let history = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == "history")
        .map_or(0, |s| s["message_count"].as_u64().unwrap());
    (listed["total"].as_u64().unwrap(), history)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_lists_and_calls_the_tools() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(tmp.path());
    let (transport, stderr) = TokioChildProcess::builder(lcm_command(&data, Some("history")))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lcm mcp");
    let mut stderr = stderr.expect("stderr");
    let client: Client = ().serve(transport).await.expect("initialize");
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("lcm")
    );
    assert!(
        info.instructions
            .as_deref()
            .is_some_and(|i| i.contains("`history`"))
    );

    // The runtime's tools for a main agent, then the session tools; each with an object schema.
    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    for expected in [
        "lcm_grep",
        "lcm_describe",
        "lcm_expand_query",
        "Task",
        "Tasks",
        "llm_map",
        "agentic_map",
        "lcm_sessions",
        "lcm_append",
        "lcm_context",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    assert!(
        !names.contains(&"lcm_expand"),
        "lcm_expand is for sub-agents"
    );
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    // Every tool the instructions name is one the server lists.
    let instructions = info.instructions.as_deref().unwrap_or_default();
    let named: Vec<&str> = instructions
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("lcm_"))
        .collect();
    assert!(named.contains(&"lcm_pin"), "{instructions}");
    for tool in named {
        assert!(
            names.contains(&tool),
            "the instructions name {tool}: {names:?}"
        );
    }
    for tool in &tools {
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            tool.name
        );
        assert!(tool.description.as_deref().is_some_and(|d| d.len() > 20));
    }

    // With a working session, lcm_append and lcm_context default to it.
    let append = tools.iter().find(|t| t.name == "lcm_append").unwrap();
    assert_eq!(
        append.input_schema.get("required"),
        Some(&json!(["messages"]))
    );

    // The server's session exists (created at start), empty.
    assert_eq!(counts(&client).await, (1, 0));

    // Append a history whose first message holds the ticket; again: nothing new.
    let mut messages = vec![json!({
        "role": "user",
        "content": "Please file the outage under TICKET-4821 for the record.",
        "key": "t0"
    })];
    for i in 1..80 {
        messages.push(json!({
            "role": if i % 2 == 0 { "user" } else { "assistant" },
            "content": format!("turn {i}: we discussed the rollout of service s{} and its canary", i % 5),
            "key": format!("t{i}"),
        }));
    }
    let appended = ok(
        "lcm_append",
        call(&client, "lcm_append", json!({ "messages": messages })).await,
    );
    assert_eq!(appended["key"], "history");
    assert_eq!(appended["inserted"], 80);
    assert_eq!(appended["message_count"], 80);
    let ticket_id = appended["appended"][0]["id"].as_str().unwrap().to_owned();
    assert!(ticket_id.starts_with("msg_"), "{appended}");
    let again = ok(
        "lcm_append",
        call(&client, "lcm_append", json!({ "messages": &messages[..3] })).await,
    );
    assert_eq!(again["inserted"], 0);
    assert_eq!(again["appended"][0]["id"], ticket_id.as_str());

    // lcm_grep finds the ticket in exactly that message.
    let found = ok(
        "lcm_grep",
        call(&client, "lcm_grep", json!({"pattern": "TICKET-\\d+"})).await,
    );
    let hits: Vec<&Value> = found["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["hits"].as_array().unwrap())
        .collect();
    assert_eq!(hits.len(), 1, "{found}");
    assert_eq!(hits[0]["id"], ticket_id.as_str());

    // lcm_context with a small budget compacts (above the hard threshold the turn waits) and
    // stays within the budget.
    let context = ok(
        "lcm_context",
        call(&client, "lcm_context", json!({"budget": 900})).await,
    );
    assert!(context["tokens"].as_u64().unwrap() <= 900, "{context}");
    assert!(
        !context["summaries"].as_array().unwrap().is_empty(),
        "{context}"
    );
    assert_eq!(context["format"], "openai");
    let rendered = context["messages"].as_array().unwrap();
    assert!(!rendered.is_empty());
    assert!(
        rendered
            .iter()
            .any(|m| m["content"].to_string().contains("<lcm_summary"))
    );
    let anthropic = ok(
        "lcm_context",
        call(
            &client,
            "lcm_context",
            json!({"session": "history", "budget": 900, "format": "anthropic", "system": "Be brief."}),
        )
        .await,
    );
    assert_eq!(anthropic["system"], "Be brief.");
    assert!(anthropic["tokens"].as_u64().unwrap() <= 900);
    // The breakdown names the summaries the context lists, and the system prompt's tokens come
    // out of the same 900.
    let breakdown = &anthropic["breakdown"];
    assert_eq!(
        breakdown["summaries"]["items"].as_u64().unwrap(),
        anthropic["summaries"].as_array().unwrap().len() as u64,
        "{breakdown}"
    );
    let system_tokens = anthropic["system_tokens"].as_u64().unwrap();
    assert!(system_tokens > 0);
    assert!(anthropic["tokens"].as_u64().unwrap() + system_tokens <= 900);

    // lcm_describe the grep hit: the verbatim content, now covered by a summary.
    let described = ok(
        "lcm_describe",
        call(&client, "lcm_describe", json!({"id": ticket_id})).await,
    );
    assert_eq!(described["id"], ticket_id.as_str());
    assert!(
        described["content"]
            .as_str()
            .unwrap()
            .contains("TICKET-4821")
    );
    assert!(
        described["covered_by"]
            .as_str()
            .is_some_and(|s| s.starts_with("sum_")),
        "{described}"
    );

    // lcm_expand_query without a model: the verbatim excerpts, and a note saying why.
    let expanded = ok(
        "lcm_expand_query",
        call(
            &client,
            "lcm_expand_query",
            json!({"query": "outage ticket", "prompt": "Which ticket?", "max_tokens": 500}),
        )
        .await,
    );
    assert!(expanded["answer"].is_null(), "{expanded}");
    assert!(expanded["note"].as_str().unwrap().contains("no model"));
    assert!(
        expanded["excerpts"].to_string().contains("TICKET-4821"),
        "{expanded}"
    );

    // llm_map without a model: a tool error that says what to configure; nothing stored.
    let before = counts(&client).await;
    let input = tmp.path().join("items.jsonl");
    std::fs::write(&input, "{\"q\": \"a\"}\n{\"q\": \"b\"}\n").unwrap();
    let refused = tool_error(
        "llm_map",
        call(
            &client,
            "llm_map",
            json!({
                "input_path": input,
                "prompt": "Classify the question.",
                "output_schema": {"type": "object", "properties": {"label": {"type": "string"}}}
            }),
        )
        .await,
    );
    assert!(refused.contains("llm_map"), "{refused}");
    assert!(refused.contains("need an LLM"), "{refused}");
    assert_eq!(counts(&client).await, before);

    // Bad arguments: the schema's message, as a tool result; nothing stored changes.
    let bad = tool_error(
        "lcm_grep",
        call(&client, "lcm_grep", json!({"pattern": 42})).await,
    );
    assert!(bad.contains("invalid arguments for lcm_grep"), "{bad}");
    assert!(bad.contains("at /pattern"), "{bad}");
    let bad = tool_error(
        "lcm_append",
        call(
            &client,
            "lcm_append",
            json!({"session": "brand-new", "messages": [
                {"role": "user", "content": "fine", "key": "n1"},
                {"role": "robot", "content": "x"}
            ]}),
        )
        .await,
    );
    assert!(bad.contains("invalid arguments for lcm_append"), "{bad}");
    assert!(bad.contains("at /messages/1/role"), "{bad}");
    let bad = tool_error(
        "lcm_append",
        call(
            &client,
            "lcm_append",
            json!({"messages": [
                {"role": "user", "content": "fine"},
                {"role": "user", "content": "both", "parts": []}
            ]}),
        )
        .await,
    );
    assert!(bad.contains("at /messages/1"), "{bad}");
    let bad = tool_error(
        "lcm_context",
        call(&client, "lcm_context", json!({"format": "openai"})).await,
    );
    assert!(bad.contains("budget"), "{bad}");
    let missing = tool_error(
        "lcm_context",
        call(
            &client,
            "lcm_context",
            json!({"session": "nobody", "budget": 100}),
        )
        .await,
    );
    assert!(missing.contains("no session `nobody`"), "{missing}");
    assert_eq!(counts(&client).await, before);

    // A tool that is not listed is a protocol error (invalid params), not a tool result.
    match client
        .call_tool(CallToolRequestParams::new("lcm_expand"))
        .await
    {
        Err(ServiceError::McpError(e)) => {
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
            assert!(e.message.contains("no tool named `lcm_expand`"), "{e:?}");
        }
        other => panic!("expected a protocol error, got {other:?}"),
    }

    // Closing stdin stops the server: the runtime shuts down and the store is released.
    client.cancel().await.expect("close");
    let mut log = String::new();
    tokio::time::timeout(Duration::from_secs(30), stderr.read_to_string(&mut log))
        .await
        .expect("lcm mcp exits")
        .unwrap();
    assert!(
        log.contains("lcm mcp: stopped (the client closed the connection)"),
        "{log}"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(&data)
        .args(["sessions", "--json"])
        .env_remove("LCM_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sessions: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(sessions.to_string().contains("\"history\""), "{sessions}");
    assert!(!sessions.to_string().contains("brand-new"), "{sessions}");
}

/// Closes the client's connection and waits for `lcm mcp` to stop cleanly.
pub(crate) async fn close(client: Client, mut stderr: tokio::process::ChildStderr) {
    client.cancel().await.expect("close");
    let mut log = String::new();
    tokio::time::timeout(Duration::from_secs(30), stderr.read_to_string(&mut log))
        .await
        .expect("lcm mcp exits")
        .unwrap();
    assert!(
        log.contains("lcm mcp: stopped (the client closed the connection)"),
        "{log}"
    );
}

/// The sessions of lcm_grep's hits (their groups' sessions), sorted and deduplicated.
fn hit_sessions(found: &Value) -> Vec<String> {
    let mut sessions: Vec<String> = found["groups"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["hits"].as_array().unwrap().is_empty())
        .map(|g| g["session"].as_str().unwrap().to_owned())
        .collect();
    sessions.sort_unstable();
    sessions.dedup();
    sessions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_session_the_tools_run_outside_any_session() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(tmp.path());
    let (transport, stderr) = TokioChildProcess::builder(lcm_command(&data, None))
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lcm mcp");
    let stderr = stderr.expect("stderr");
    let client: Client = ().serve(transport).await.expect("initialize");
    let instructions = client
        .peer_info()
        .and_then(|i| i.instructions.clone())
        .expect("instructions");
    assert!(
        instructions.contains("no particular session"),
        "{instructions}"
    );
    assert!(instructions.contains("every session"), "{instructions}");

    // lcm_append and lcm_context require `session` in their schemas.
    let tools = client.list_all_tools().await.expect("tools/list");
    for name in ["lcm_append", "lcm_context"] {
        let tool = tools.iter().find(|t| t.name == name).expect(name);
        let required = tool.input_schema.get("required").expect("required");
        assert!(
            required.as_array().unwrap().contains(&json!("session")),
            "{name}: {required}"
        );
    }

    // No session was created at start; there is no current session.
    let listed = ok(
        "lcm_sessions",
        call(&client, "lcm_sessions", json!({})).await,
    );
    assert_eq!(listed["total"], 0, "{listed}");
    assert!(listed["current"].is_null(), "{listed}");

    // Appends to two sessions, by key.
    let mut ids = Vec::new();
    for (session, text) in [
        ("alpha", "the deploy of ORBIT-7 failed on the canary"),
        ("beta", "ORBIT-7 was rolled back by the on-call"),
    ] {
        let appended = ok(
            "lcm_append",
            call(
                &client,
                "lcm_append",
                json!({"session": session, "messages": [
                    {"role": "user", "content": text, "key": "m1"},
                    {"role": "assistant", "content": "noted", "key": "m2"}
                ]}),
            )
            .await,
        );
        assert_eq!(appended["key"], session);
        assert_eq!(appended["inserted"], 2);
        ids.push(appended["session"].as_str().unwrap().to_owned());
    }
    let mut both = ids.clone();
    both.sort_unstable();

    // lcm_grep without `session` searches every session: hits in both.
    let found = ok(
        "lcm_grep",
        call(&client, "lcm_grep", json!({"pattern": "ORBIT-\\d+"})).await,
    );
    assert_eq!(found["searched"]["session"], "all", "{found}");
    assert_eq!(hit_sessions(&found), both, "{found}");
    // With a session: that session only.
    let found = ok(
        "lcm_grep",
        call(
            &client,
            "lcm_grep",
            json!({"pattern": "ORBIT-\\d+", "session": "beta"}),
        )
        .await,
    );
    assert_eq!(hit_sessions(&found), vec![ids[1].clone()], "{found}");

    // lcm_append / lcm_context without `session`: a tool error naming it; nothing stored.
    let refused = tool_error(
        "lcm_append",
        call(
            &client,
            "lcm_append",
            json!({"messages": [{"role": "user", "content": "ORBIT-9 lost", "key": "x"}]}),
        )
        .await,
    );
    assert!(
        refused.contains("invalid arguments for lcm_append"),
        "{refused}"
    );
    assert!(
        refused.contains("\"session\" is a required property"),
        "{refused}"
    );
    let refused = tool_error(
        "lcm_context",
        call(&client, "lcm_context", json!({"budget": 900})).await,
    );
    assert!(
        refused.contains("\"session\" is a required property"),
        "{refused}"
    );
    let listed = ok(
        "lcm_sessions",
        call(&client, "lcm_sessions", json!({})).await,
    );
    assert_eq!(listed["total"], 2, "{listed}");
    for session in listed["sessions"].as_array().unwrap() {
        assert_eq!(session["message_count"], 2, "{listed}");
    }
    let found = ok(
        "lcm_grep",
        call(&client, "lcm_grep", json!({"pattern": "ORBIT-9"})).await,
    );
    assert_eq!(found["note"], "no matches", "{found}");

    // With `session`, lcm_context works as before.
    let context = ok(
        "lcm_context",
        call(
            &client,
            "lcm_context",
            json!({"session": "alpha", "budget": 900}),
        )
        .await,
    );
    assert_eq!(context["session"], ids[0].as_str(), "{context}");
    assert_eq!(
        context["messages"].as_array().unwrap().len(),
        2,
        "{context}"
    );

    close(client, stderr).await;
}

/// Reads stdout lines until the JSON-RPC response with `id`; every line must be JSON-RPC.
fn response(stdout: &mut impl BufRead, id: u64) -> Value {
    loop {
        let mut line = String::new();
        assert!(stdout.read_line(&mut line).unwrap() > 0, "stdout ended");
        let message: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        assert_eq!(message["jsonrpc"], "2.0", "{line}");
        if message["id"] == id {
            return message;
        }
    }
}

#[test]
fn stdout_carries_only_the_protocol_and_closing_stdin_stops_the_server() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(tmp.path());
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(&data)
        .arg("mcp")
        .env_remove("LCM_CONFIG")
        .env("LCM_LOG", "debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lcm mcp");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    // Drain stderr meanwhile (debug logging is verbose).
    let mut stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut log = String::new();
        stderr.read_to_string(&mut log).unwrap();
        log
    });
    let mut send = move |message: Value| {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    };
    send(json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw-test-client", "version": "0"}
        }
    }));
    let init = response(&mut stdout, 1);
    assert_eq!(init["result"]["serverInfo"]["name"], "lcm", "{init}");
    assert!(
        init["result"]["capabilities"]["tools"].is_object(),
        "{init}"
    );
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}));
    let listed = response(&mut stdout, 2);
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"lcm_grep") && names.contains(&"lcm_append"),
        "{names:?}"
    );
    send(json!({
        "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "lcm_grep", "arguments": {"pattern": "x", "mode": "nonsense"}}
    }));
    let failed = response(&mut stdout, 3);
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    assert!(
        failed["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("at /mode"),
        "{failed}"
    );
    send(json!({
        "jsonrpc": "2.0", "id": 4, "method": "tools/call",
        "params": {"name": "no_such_tool", "arguments": {}}
    }));
    let unknown = response(&mut stdout, 4);
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    // End of input (the closure owns stdin): the server stops by itself, exit 0, and stdout
    // had nothing else.
    drop(send);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "lcm mcp did not stop at the end of stdin"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    for line in rest.lines() {
        let message: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"));
        assert_eq!(message["jsonrpc"], "2.0");
    }
    let log = log.join().unwrap();
    assert!(status.success(), "exit {status:?}: {log}");
    assert!(
        log.contains("MCP server ready"),
        "the debug log goes to stderr: {log}"
    );
    assert!(
        log.contains("lcm mcp: stopped (the client closed the connection)"),
        "{log}"
    );
}
