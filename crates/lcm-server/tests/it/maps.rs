//! Map jobs over HTTP against the scripted model on loopback: a job started with
//! `POST /v1/maps` is followed to its end through server-sent events (the job record, then
//! `map_progress` events, `map_finished`, the final record, and the stream closes); progress
//! and metrics agree with the store; a cancelled job ends its stream too.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, Setup, TestServer, start};
use lcm_engine::tools::{Tool, ToolContext, ToolDefinition, ToolError};
use lcm_llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "upper": {"type": "string"}},
        "required": ["id", "upper"],
        "additionalProperties": false
    })
}

/// A host tool that takes a second to answer.
struct SlowTool;

#[async_trait::async_trait]
impl Tool for SlowTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new("slow", "Sleeps a second.", json!({"type": "object"}))
    }

    async fn call(&self, _ctx: &ToolContext, _args: Value) -> Result<Value, ToolError> {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(json!({"slept_ms": 1000}))
    }
}

/// The item a request is about (the line after `Item (JSON):`).
fn item_of(request: &RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    serde_json::from_str(line).ok()
}

/// Answers each item correctly after `delay`.
fn answer_after(delay: Duration) -> ScriptedReply {
    ScriptedReply::from_fn(move |request| match item_of(request) {
        Some(item) => {
            let upper = item["word"].as_str().unwrap_or_default().to_uppercase();
            let answer = json!({"id": item["id"], "upper": upper}).to_string();
            ScriptedReply::delayed(delay, ScriptedReply::ok(answer))
        }
        None => ScriptedReply::status(400),
    })
}

async fn daemon(upstream: &ScriptedServer, items: u64) -> TestServer {
    daemon_with(upstream, items, Vec::new()).await
}

async fn daemon_with(
    upstream: &ScriptedServer,
    items: u64,
    tools: Vec<Arc<dyn Tool>>,
) -> TestServer {
    let (mut setup, tmp, root) = Setup::new();
    setup.llm = Some(common::llm(upstream));
    setup.tools = tools;
    let text: String = (0..items)
        .map(|i| format!("{}\n", json!({"id": i, "word": format!("w{i}")})))
        .collect();
    std::fs::write(root.join("items.jsonl"), text).unwrap();
    start(setup, tmp, root).await
}

/// Reads a server-sent event stream to its end (or `limit`): (event name, JSON data) pairs.
async fn read_events(
    server: &TestServer,
    path: &str,
    limit: Duration,
) -> (Vec<(String, Value)>, bool) {
    let mut response = server
        .client
        .get(format!("{}{path}", server.url))
        .send()
        .await
        .expect("events");
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut buffer = String::new();
    let deadline = tokio::time::Instant::now() + limit;
    let mut ended = false;
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => buffer.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Ok(None)) => {
                ended = true;
                break;
            }
            Ok(Err(e)) => panic!("stream failed: {e}"),
            Err(_) => break,
        }
    }
    let events = buffer
        .split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            Some((name?, serde_json::from_str(&data).ok()?))
        })
        .collect();
    (events, ended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_follow_a_map_job_to_its_end() {
    let upstream = ScriptedServer::start().await;
    upstream.set_default(answer_after(Duration::from_millis(60)));
    let server = daemon(&upstream, 24).await;

    let started = server
        .post(
            "/v1/maps",
            &json!({"input_path": "items.jsonl", "prompt": "Upper-case the word.", "output_schema": schema(), "concurrency": 2}),
        )
        .await;
    assert_eq!(started.status, StatusCode::CREATED, "{started:?}");
    let job = started.body["id"].as_str().unwrap().to_owned();
    assert_eq!(started.body["progress"]["total"], 24);

    let (events, ended) = read_events(
        &server,
        &format!("/v1/maps/{job}/events"),
        Duration::from_secs(60),
    )
    .await;
    assert!(ended, "the stream did not end: {events:?}");
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"job"), "{names:?}");
    assert!(names.contains(&"map_progress"), "{names:?}");
    assert_eq!(
        names.iter().filter(|n| **n == "map_finished").count(),
        1,
        "{names:?}"
    );
    let (last, record) = events.last().unwrap();
    assert_eq!(last, "job");
    assert_eq!(record["status"], "completed");
    assert_eq!(record["progress"]["completed"], 24);
    for (name, data) in &events {
        if name.starts_with("map_") {
            assert_eq!(data["job"], job.as_str(), "{data}");
            assert_eq!(data["event"], name.as_str());
        }
    }
    let finished = &events.iter().find(|(n, _)| n == "map_finished").unwrap().1;
    assert_eq!(
        (finished["completed"].clone(), finished["failed"].clone()),
        (json!(24), json!(0))
    );

    // The job record and the list agree; the output file is there.
    let record = server.get(&format!("/v1/maps/{job}")).await;
    assert_eq!(record.body["status"], "completed");
    let list = server.get("/v1/maps").await;
    assert_eq!(list.body["jobs"].as_array().unwrap().len(), 1);
    let output = std::fs::read_to_string(server.root.join("items.out.jsonl")).unwrap();
    assert_eq!(output.lines().count(), 24);
    // A finished job's stream sends its record and closes at once.
    let (events, ended) = read_events(
        &server,
        &format!("/v1/maps/{job}/events"),
        Duration::from_secs(10),
    )
    .await;
    assert!(ended);
    assert_eq!(events.len(), 1);

    let metrics = server.get("/metrics").await;
    let text = metrics.body.as_str().unwrap();
    for series in [
        "lcm_map_items{status=\"completed\"} 24",
        "lcm_map_items{status=\"failed\"} 0",
        "lcm_map_jobs{status=\"completed\"} 1",
        "lcm_map_jobs_finished_total 1",
    ] {
        assert!(text.contains(series), "missing `{series}` in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_job_ends_its_event_stream() {
    let upstream = ScriptedServer::start().await;
    upstream.set_default(answer_after(Duration::from_secs(3)));
    let server = daemon(&upstream, 50).await;
    let started = server
        .post(
            "/v1/maps",
            &json!({"input_path": "items.jsonl", "prompt": "Upper-case the word.", "output_schema": schema(), "concurrency": 1}),
        )
        .await;
    assert_eq!(started.status, StatusCode::CREATED, "{started:?}");
    let job = started.body["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/maps/{job}/events");
    let reader = {
        let client = server.client.clone();
        let url = format!("{}{path}", server.url);
        tokio::spawn(async move {
            let mut response = client.get(url).send().await.expect("events");
            let mut text = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            text
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled = server
        .post(&format!("/v1/maps/{job}/cancel"), &json!(null))
        .await;
    assert_eq!(cancelled.status, StatusCode::OK, "{cancelled:?}");
    assert_eq!(cancelled.body["status"], "cancelled");
    let text = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("the stream ended")
        .unwrap();
    assert!(text.contains("\"status\":\"cancelled\""), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_finishes_in_flight_requests_and_ends_event_streams() {
    let upstream = ScriptedServer::start().await;
    upstream.set_default(answer_after(Duration::from_millis(150)));
    let mut server = daemon_with(&upstream, 6, vec![Arc::new(SlowTool)]).await;
    std::fs::write(
        server.root.join("long.jsonl"),
        (0..200)
            .map(|i| format!("{}\n", json!({"id": i, "word": "x"})))
            .collect::<String>(),
    )
    .unwrap();
    let session = server.session("agent").await;
    // A long map job, followed by an event stream.
    let long = server
        .post(
            "/v1/maps",
            &json!({"input_path": "long.jsonl", "prompt": "Upper-case the word.", "output_schema": schema(), "concurrency": 1}),
        )
        .await;
    assert_eq!(long.status, StatusCode::CREATED, "{long:?}");
    let long_job = long.body["id"].as_str().unwrap().to_owned();
    let stream = {
        let client = server.client.clone();
        let url = format!("{}/v1/maps/{long_job}/events", server.url);
        tokio::spawn(async move {
            let mut response = client.get(url).send().await.expect("events");
            let mut text = String::new();
            while let Ok(Some(chunk)) = response.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            text
        })
    };
    // A request that takes a second: a host tool that sleeps.
    let in_flight = {
        let client = server.client.clone();
        let url = format!("{}/v1/sessions/{session}/tools/slow", server.url);
        tokio::spawn(async move {
            let response = client.post(url).body("{}").send().await.expect("tool call");
            let status = response.status();
            (status, response.json::<Value>().await.expect("json"))
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let addr = server.addr;
    let started = std::time::Instant::now();
    server.stop().await.expect("a clean stop");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // The request in flight was answered in full.
    let (status, answer) = in_flight.await.unwrap();
    assert_eq!(
        (status, answer),
        (StatusCode::OK, json!({"slept_ms": 1000}))
    );
    // The event stream was told and closed.
    let text = tokio::time::timeout(Duration::from_secs(5), stream)
        .await
        .expect("stream closed")
        .unwrap();
    assert!(text.contains("event: shutdown"), "{text}");
    // Nothing listens any more; the long job stays in the store, to be resumed.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    let job = server
        .runtime
        .store()
        .job(long_job.parse().unwrap())
        .unwrap();
    assert!(!job.status.is_terminal(), "{job:?}");
}
