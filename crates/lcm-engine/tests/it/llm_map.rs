//! `llm_map` end to end against the scripted provider server: valid output in input order;
//! an invalid schema refused before any request; invalid answers retried with the error fed
//! back, then failed; 429 / 500 / timeouts retried; bad input lines as failed items; paths
//! outside the allowed roots refused; cancellation; and resume after a crash without
//! re-requesting finished items.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lcm_core::config::MapConfig;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::operators::runner::{MapRunner, RunEnd, RunnerOptions};
use lcm_engine::operators::{
    CancelToken, MapError, MapRequest, ProgressReport, create_map_job, run_llm_map,
};
use lcm_llm::Provider;
use lcm_llm::http::HttpConfig;
use lcm_llm::openai::OpenAiProvider;
use lcm_llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use lcm_store::{ItemState, JobStatus, Store, StoreOptions};
use serde_json::{Value, json};

fn options() -> StoreOptions {
    StoreOptions::new(TokenCounter::new(Encoding::O200kBase))
}

/// A provider on `server` with `retries` HTTP retries (fast backoff) and no circuit breaker.
fn provider(server: &ScriptedServer, retries: u32) -> Arc<dyn Provider> {
    let config = HttpConfig::new(server.url(), "map-model")
        .with_max_retries(retries)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
        .with_circuit(0, Duration::from_secs(1));
    Arc::new(OpenAiProvider::new(config).unwrap())
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: Arc<Store>,
    db: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    let db = dir.path().join("lcm.redb");
    let store = Arc::new(Store::open(&db, options()).unwrap());
    Fixture {
        _dir: dir,
        root,
        store,
        db,
    }
}

fn config(root: &Path) -> MapConfig {
    MapConfig {
        concurrency: 4,
        max_attempts: 3,
        timeout_s: 10,
        lease_s: 30,
        allowed_roots: vec![root.to_path_buf()],
        max_item_bytes: 1 << 20,
    }
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "upper": {"type": "string"}},
        "required": ["id", "upper"],
        "additionalProperties": false
    })
}

/// `n` items `{"id": i, "word": "wi"}`, one per line.
fn write_items(root: &Path, name: &str, n: u64) -> PathBuf {
    let path = root.join(name);
    let text: String = (0..n)
        .map(|i| format!("{}\n", json!({"id": i, "word": format!("w{i}")})))
        .collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// The item a request is about (the line after `Item (JSON):`).
fn item_of(request: &RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    serde_json::from_str(line).ok()
}

fn item_id(request: &RecordedRequest) -> Option<u64> {
    item_of(request)?.get("id")?.as_u64()
}

/// The right answer for an item.
fn answer(item: &Value) -> String {
    json!({
        "id": item["id"],
        "upper": item["word"].as_str().unwrap_or_default().to_uppercase()
    })
    .to_string()
}

/// Answers every item correctly.
fn correct() -> ScriptedReply {
    ScriptedReply::from_fn(|request| match item_of(request) {
        Some(item) => ScriptedReply::ok(answer(&item)),
        None => ScriptedReply::status(400),
    })
}

fn read_output(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn requests_per_item(server: &ScriptedServer) -> HashMap<u64, Vec<String>> {
    let mut out: HashMap<u64, Vec<String>> = HashMap::new();
    for request in server.requests() {
        if let Some(id) = item_id(&request) {
            out.entry(id)
                .or_default()
                .push(request.last_user_text().unwrap_or_default());
        }
    }
    out
}

#[tokio::test]
async fn results_are_valid_and_in_input_order() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    // Even items answer later, so answers arrive out of order.
    server.set_default(ScriptedReply::from_fn(|request| match item_of(request) {
        Some(item) => {
            let delay = if item["id"].as_u64().unwrap_or(0) % 2 == 0 {
                30
            } else {
                0
            };
            ScriptedReply::delayed(
                Duration::from_millis(delay),
                ScriptedReply::ok(answer(&item)),
            )
        }
        None => ScriptedReply::status(400),
    }));
    let input = write_items(&f.root, "items.jsonl", 30);
    let mut config = config(&f.root);
    config.concurrency = 8;
    let request = MapRequest::llm(&input, "Upper-case the word.", schema());
    let reports: Arc<Mutex<Vec<ProgressReport>>> = Arc::default();
    let seen = Arc::clone(&reports);
    let summary = run_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        &config,
        &request,
        &CancelToken::new(),
        move |report| seen.lock().unwrap().push(report.clone()),
    )
    .await
    .unwrap();

    assert_eq!(summary.status, JobStatus::Completed);
    assert_eq!(
        (summary.total, summary.completed, summary.failed),
        (30, 30, 0)
    );
    assert_eq!(summary.output_path, f.root.join("items.out.jsonl"));
    assert_eq!(summary.examples.len(), 3);
    assert!(summary.failures.is_empty());
    assert_eq!(server.request_count(), 30, "one request per item");

    let validator = lcm_engine::operators::validate_schema(&schema()).unwrap();
    let lines = read_output(&summary.output_path);
    assert_eq!(lines.len(), 30);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], json!(i), "input order");
        assert_eq!(line["line"], json!(i + 1));
        assert_eq!(line["ok"], json!(true));
        assert_eq!(line["attempts"], json!(1));
        assert_eq!(line["result"], json!({"id": i, "upper": format!("W{i}")}));
        validator.check(&line["result"]).unwrap();
    }
    // No temporary file is left beside the output.
    let names: Vec<String> = std::fs::read_dir(&f.root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");

    // The request asks for JSON only and carries the schema, the task and the item.
    let first = &server.requests()[0];
    let system = first.body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("JSON") && system.contains("\"required\""),
        "{system}"
    );
    assert!(
        first
            .last_user_text()
            .unwrap()
            .contains("Upper-case the word.")
    );

    let reports = reports.lock().unwrap();
    let last = reports.last().unwrap();
    assert_eq!(last.progress.completed, 30);
    assert_eq!(last.finished_this_run, 30);
    assert!(last.rate_per_s > 0.0);
    assert_eq!(last.eta, Some(Duration::ZERO));
    assert!(
        reports.len() >= 2,
        "a report at the start and after commits"
    );
}

#[tokio::test]
async fn an_invalid_schema_is_rejected_before_any_request() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    let input = write_items(&f.root, "items.jsonl", 3);
    for bad in [
        json!({"type": "nope"}),
        json!({"properties": 3}),
        json!("object"),
    ] {
        let request = MapRequest::llm(&input, "Do it.", bad.clone());
        let err = run_llm_map(
            Arc::clone(&f.store),
            provider(&server, 0),
            &config(&f.root),
            &request,
            &CancelToken::new(),
            |_| {},
        )
        .await
        .unwrap_err();
        assert!(matches!(err, MapError::InvalidSchema(_)), "{bad}: {err}");
        assert!(
            err.to_string().starts_with("invalid output schema"),
            "{err}"
        );
    }
    assert_eq!(server.request_count(), 0);
    assert!(f.store.jobs().unwrap().is_empty(), "no job was created");
}

#[tokio::test]
async fn invalid_answers_are_retried_with_the_error_fed_back_then_failed() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::from_fn(|request| {
        let Some(item) = item_of(request) else {
            return ScriptedReply::status(400);
        };
        let retry = request
            .last_user_text()
            .is_some_and(|t| t.contains("previous answer for this item was rejected"));
        match item["id"].as_u64() {
            // Never JSON.
            Some(1) => ScriptedReply::ok("I cannot answer that."),
            // Missing a required property, then right once told.
            Some(2) if !retry => ScriptedReply::ok(json!({"id": 2}).to_string()),
            // Right, but wrapped in prose and a fence.
            Some(3) => ScriptedReply::ok(format!(
                "Here you go:\n```json\n{}\n```\nAnything else?",
                answer(&item)
            )),
            _ => ScriptedReply::ok(answer(&item)),
        }
    }));
    let input = write_items(&f.root, "items.jsonl", 5);
    let request = MapRequest::llm(&input, "Upper-case the word.", schema());
    let summary = run_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        &config(&f.root),
        &request,
        &CancelToken::new(),
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!((summary.completed, summary.failed), (4, 1));

    let per_item = requests_per_item(&server);
    let bad = &per_item[&1];
    assert_eq!(bad.len(), 3, "max_attempts requests");
    assert!(!bad[0].contains("rejected"));
    for retry in &bad[1..] {
        assert!(
            retry
                .contains("rejected: the answer is not JSON (it began: \"I cannot answer that.\")"),
            "{retry}"
        );
    }
    let fixed = &per_item[&2];
    assert_eq!(fixed.len(), 2);
    assert!(
        fixed[1].contains("does not match the output schema") && fixed[1].contains("upper"),
        "{}",
        fixed[1]
    );
    assert_eq!(per_item[&3].len(), 1, "fenced JSON is accepted");

    let lines = read_output(&summary.output_path);
    assert_eq!(lines[1]["ok"], json!(false));
    assert_eq!(lines[1]["attempts"], json!(3));
    assert!(lines[1]["error"].as_str().unwrap().contains("not JSON"));
    assert_eq!(lines[2]["ok"], json!(true));
    assert_eq!(lines[2]["attempts"], json!(2));
    assert_eq!(lines[3]["result"], json!({"id": 3, "upper": "W3"}));
    assert_eq!(summary.failures.len(), 1);
    assert_eq!(summary.failures[0].index, 1);
}

#[tokio::test]
async fn rate_limits_server_errors_and_timeouts_are_retried() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    let seen: Arc<Mutex<HashMap<u64, u32>>> = Arc::default();
    let counts = Arc::clone(&seen);
    server.set_default(ScriptedReply::from_fn(move |request| {
        let Some(item) = item_of(request) else {
            return ScriptedReply::status(400);
        };
        let id = item["id"].as_u64().unwrap_or(0);
        let n = {
            let mut counts = counts.lock().unwrap();
            let n = counts.entry(id).or_insert(0);
            *n += 1;
            *n
        };
        let ok = ScriptedReply::ok(answer(&item));
        match (id, n) {
            (0, 1) => ScriptedReply::rate_limited("0"),
            (1, 1) => ScriptedReply::status(500),
            (2, 1 | 2) => ScriptedReply::status(503),
            (3, _) => ScriptedReply::status(500),
            (4, 1) => ScriptedReply::delayed(Duration::from_secs(3), ok),
            (5, 1) => ScriptedReply::status(400),
            // A body that is not a Chat Completions answer at all.
            (6, 1) => ScriptedReply::garbage("<html>502 Bad Gateway</html>"),
            _ => ok,
        }
    }));
    let input = write_items(&f.root, "items.jsonl", 8);
    let mut request = MapRequest::llm(&input, "Upper-case the word.", schema());
    request.timeout = Some(Duration::from_millis(500));
    // No HTTP retries: every retry here is the map's own.
    let summary = run_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        &config(&f.root),
        &request,
        &CancelToken::new(),
        |_| {},
    )
    .await
    .unwrap();
    let lines = read_output(&summary.output_path);
    let attempts: Vec<(bool, u64)> = lines
        .iter()
        .map(|l| (l["ok"].as_bool().unwrap(), l["attempts"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        attempts,
        [
            (true, 1 + 1), // 429 once
            (true, 1 + 1), // 500 once
            (true, 2 + 1), // 503 twice
            (false, 3),    // 500 always: failed after max_attempts
            (true, 1 + 1), // timed out once
            (false, 1),    // 400: permanent, not retried
            (true, 1 + 1), // garbage body once
            (true, 1),
        ]
    );
    assert!(
        lines[3]["error"].as_str().unwrap().contains("500"),
        "{}",
        lines[3]
    );
    assert!(
        lines[5]["error"].as_str().unwrap().contains("400"),
        "{}",
        lines[5]
    );
    let item4 = f.store.item(summary.job, 4).unwrap();
    assert!(
        item4.last_error.as_deref().unwrap().contains("timed out"),
        "{item4:?}"
    );
    // Transient errors are not fed back to the model as its mistake.
    assert!(
        requests_per_item(&server)[&1]
            .iter()
            .all(|t| !t.contains("rejected"))
    );

    // With HTTP retries, the provider absorbs a 500 within one map attempt.
    let server = ScriptedServer::start().await;
    server.push(ScriptedReply::status(500));
    server.set_default(correct());
    let input = write_items(&f.root, "one.jsonl", 1);
    let summary = run_llm_map(
        Arc::clone(&f.store),
        provider(&server, 2),
        &config(&f.root),
        &MapRequest::llm(&input, "Upper-case the word.", schema()),
        &CancelToken::new(),
        |_| {},
    )
    .await
    .unwrap();
    assert_eq!(summary.completed, 1);
    assert_eq!(server.request_count(), 2);
    assert_eq!(read_output(&summary.output_path)[0]["attempts"], json!(1));
}

#[tokio::test]
async fn a_bad_input_line_becomes_one_failed_item() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct());
    let input = f.root.join("mixed.jsonl");
    let long = json!({"id": 9, "word": "x".repeat(200)}).to_string();
    std::fs::write(
        &input,
        format!(
            "{}\nnot json at all\n\n{}\n{long}\n{}",
            json!({"id": 0, "word": "a"}),
            json!({"id": 1, "word": "b"}),
            json!({"id": 2, "word": "c"}),
        ),
    )
    .unwrap();
    let mut config = config(&f.root);
    config.max_item_bytes = 64;
    let summary = run_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        &config,
        &MapRequest::llm(&input, "Upper-case the word.", schema()),
        &CancelToken::new(),
        |_| {},
    )
    .await
    .unwrap();
    // The blank line is not an item.
    assert_eq!(
        (summary.total, summary.completed, summary.failed),
        (5, 3, 2)
    );
    assert_eq!(server.request_count(), 3, "bad lines are never sent");
    let lines = read_output(&summary.output_path);
    let shape: Vec<(u64, u64, bool)> = lines
        .iter()
        .map(|l| {
            (
                l["index"].as_u64().unwrap(),
                l["line"].as_u64().unwrap(),
                l["ok"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [
            (0, 1, true),
            (1, 2, false),
            (2, 4, true),
            (3, 5, false),
            (4, 6, true)
        ]
    );
    assert!(
        lines[1]["error"]
            .as_str()
            .unwrap()
            .starts_with("line 2 is not one JSON value"),
        "{}",
        lines[1]
    );
    assert_eq!(
        lines[3]["error"],
        json!("line 5 is over the limit of 64 bytes (map.max_item_bytes)")
    );
    assert_eq!(lines[1]["attempts"], json!(0));
    assert_eq!(
        summary
            .failures
            .iter()
            .map(|e| (e.index, e.line))
            .collect::<Vec<_>>(),
        [(1, 2), (3, 5)]
    );
}

#[tokio::test]
async fn paths_outside_the_allowed_roots_are_refused() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    let outside_dir = f.root.parent().unwrap().join("outside");
    std::fs::create_dir(&outside_dir).unwrap();
    let outside = write_items(&outside_dir, "secret.jsonl", 2);
    let inside = write_items(&f.root, "items.jsonl", 2);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, f.root.join("link.jsonl")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside_dir, f.root.join("linkdir")).unwrap();

    let mut cases: Vec<(MapRequest, &str)> = vec![
        (
            MapRequest::llm(&outside, "p", schema()),
            "outside the allowed roots",
        ),
        (
            MapRequest::llm(f.root.join("../outside/secret.jsonl"), "p", schema()),
            "outside the allowed roots",
        ),
        (
            MapRequest::llm("../outside/secret.jsonl", "p", schema()),
            "outside the allowed roots",
        ),
        (
            MapRequest::llm(f.root.join("missing.jsonl"), "p", schema()),
            "no such file",
        ),
        (
            MapRequest::llm(&f.root, "p", schema()),
            "not a regular file",
        ),
        (
            MapRequest {
                output_path: Some(outside_dir.join("out.jsonl")),
                ..MapRequest::llm(&inside, "p", schema())
            },
            "outside the allowed roots",
        ),
        (
            MapRequest {
                output_path: Some(inside.clone()),
                ..MapRequest::llm(&inside, "p", schema())
            },
            "overwrite the input",
        ),
    ];
    #[cfg(unix)]
    {
        cases.push((
            MapRequest::llm("link.jsonl", "p", schema()),
            "outside the allowed roots",
        ));
        cases.push((
            MapRequest {
                output_path: Some(f.root.join("linkdir/out.jsonl")),
                ..MapRequest::llm(&inside, "p", schema())
            },
            "outside the allowed roots",
        ));
        cases.push((
            MapRequest {
                output_path: Some(f.root.join("link.jsonl")),
                ..MapRequest::llm(&inside, "p", schema())
            },
            "symlink",
        ));
    }
    for (request, expected) in cases {
        let err = create_map_job(Arc::clone(&f.store), &config(&f.root), &request)
            .await
            .unwrap_err();
        assert!(matches!(err, MapError::Path { .. }), "{request:?}: {err}");
        assert!(err.to_string().contains(expected), "{request:?}: {err}");
    }
    assert_eq!(server.request_count(), 0);
    assert!(f.store.jobs().unwrap().is_empty());

    // A relative path inside the root is fine.
    let job = create_map_job(
        Arc::clone(&f.store),
        &config(&f.root),
        &MapRequest::llm("items.jsonl", "p", schema()),
    )
    .await
    .unwrap();
    assert_eq!(job.input_path, inside);
    assert_eq!(job.progress.total, 2);
}

#[tokio::test]
async fn cancellation_stops_claiming() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct());
    server.set_latency(Duration::from_millis(300));
    let input = write_items(&f.root, "items.jsonl", 40);
    let mut config = config(&f.root);
    config.concurrency = 2;

    // The runner alone: it stops, and gives its unfinished items back.
    let job = create_map_job(
        Arc::clone(&f.store),
        &config,
        &MapRequest::llm(&input, "Upper-case the word.", schema()),
    )
    .await
    .unwrap();
    let cancel = CancelToken::new();
    let runner = MapRunner::for_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        job.id,
        RunnerOptions::from_config(&config),
    )
    .await
    .unwrap();
    let token = cancel.clone();
    let run = tokio::spawn(async move { runner.run(&token).await });
    assert!(server.wait_for_requests(2, Duration::from_secs(5)).await);
    cancel.cancel();
    let report = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("the runner stops promptly")
        .unwrap()
        .unwrap();
    assert_eq!(report.end, RunEnd::Stopped);
    let sent = server.request_count();
    assert!(sent <= 4, "{sent} requests");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        server.request_count(),
        sent,
        "nothing is claimed after the cancel"
    );
    let progress = f.store.progress(job.id).unwrap();
    assert_eq!(progress.running, 0, "claims were given back");
    assert_eq!(progress.pending + progress.completed, 40);
    assert_eq!(
        f.store.job(job.id).unwrap().status,
        JobStatus::Running,
        "resumable"
    );
    for item in f.store.items_in_order(job.id).unwrap() {
        let item = item.unwrap();
        if item.state == ItemState::Pending {
            assert_eq!(item.attempts, 0, "aborted attempts do not count");
        }
    }

    // The whole operation: cancelling cancels the job and writes what was done.
    server.reset();
    let cancel = CancelToken::new();
    let token = cancel.clone();
    let store = Arc::clone(&f.store);
    let provider = provider(&server, 0);
    let request = MapRequest::llm(&input, "Upper-case the word.", schema());
    let config2 = config.clone();
    let run = tokio::spawn(async move {
        run_llm_map(store, provider, &config2, &request, &token, |_| {}).await
    });
    assert!(server.wait_for_requests(1, Duration::from_secs(5)).await);
    cancel.cancel();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.status, JobStatus::Cancelled);
    assert!(summary.not_run >= 36, "{summary:?}");
    let lines = read_output(&summary.output_path);
    assert_eq!(lines.len(), 40);
    assert!(
        lines[39]["error"]
            .as_str()
            .unwrap()
            .contains("the job was cancelled")
    );
}

#[tokio::test]
async fn the_provider_refusing_the_key_stops_the_run_and_keeps_the_job() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(ScriptedReply::status(401));
    let input = write_items(&f.root, "items.jsonl", 6);
    let config = config(&f.root);
    let job = create_map_job(
        Arc::clone(&f.store),
        &config,
        &MapRequest::llm(&input, "Upper-case the word.", schema()),
    )
    .await
    .unwrap();
    let runner = MapRunner::for_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        job.id,
        RunnerOptions::from_config(&config),
    )
    .await
    .unwrap();
    let err = runner.run(&CancelToken::new()).await.unwrap_err();
    assert!(matches!(err, MapError::Provider(_)), "{err}");
    assert!(err.to_string().contains("credentials"), "{err}");
    let after = f.store.job(job.id).unwrap();
    assert_eq!(after.status, JobStatus::Running);
    assert_eq!(after.progress.pending, 6);
    assert!(
        f.store
            .items_in_order(job.id)
            .unwrap()
            .all(|i| i.unwrap().attempts == 0),
        "no attempt was used up"
    );
}

#[tokio::test]
async fn a_job_resumes_after_a_crash_without_rerunning_finished_items() {
    let f = fixture();
    // The resumed run talks to a second server: a request the crashed run had already sent may
    // reach the first server after the crash, so only the second one counts what resuming asks.
    let server = ScriptedServer::start().await;
    let after_crash = ScriptedServer::start().await;
    for s in [&server, &after_crash] {
        s.set_default(ScriptedReply::from_fn(|request| match item_of(request) {
            Some(item) => {
                ScriptedReply::delayed(Duration::from_millis(60), ScriptedReply::ok(answer(&item)))
            }
            None => ScriptedReply::status(400),
        }));
    }
    let n = 24;
    let input = write_items(&f.root, "items.jsonl", n);
    let config = config(&f.root);
    let job = create_map_job(
        Arc::clone(&f.store),
        &config,
        &MapRequest::llm(&input, "Upper-case the word.", schema()),
    )
    .await
    .unwrap()
    .id;

    // Phase 1: run until some items are done, then "crash": drop the run mid-flight.
    let runner = MapRunner::for_llm_map(
        Arc::clone(&f.store),
        provider(&server, 0),
        job,
        RunnerOptions::from_config(&config),
    )
    .await
    .unwrap();
    let cancel = CancelToken::new();
    {
        let run = runner.run(&cancel);
        tokio::pin!(run);
        loop {
            tokio::select! {
                result = &mut run => panic!("the job finished before the crash: {result:?}"),
                _ = tokio::time::sleep(Duration::from_millis(10)) => {
                    if f.store.progress(job).unwrap().completed >= 6 {
                        break;
                    }
                }
            }
        }
    }
    // Reopen the store as a restarted process would, once nothing of the dropped run holds it
    // (a blocking store call of the run may still be finishing).
    let Fixture {
        _dir,
        root,
        store,
        db,
    } = f;
    let mut shared = Some(store);
    let mut waited = 0;
    let crashed = loop {
        match Arc::try_unwrap(shared.take().unwrap()) {
            Ok(store) => break store,
            Err(still_shared) => {
                assert!(waited < 500, "the store is still shared");
                shared = Some(still_shared);
                waited += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let before = crashed.progress(job).unwrap();
    assert!(before.completed >= 6 && before.completed < n, "{before:?}");
    let finished_before: BTreeSet<u64> = crashed
        .items_in_order(job)
        .unwrap()
        .filter_map(|i| {
            let i = i.unwrap();
            matches!(i.state, ItemState::Completed { .. }).then_some(i.index)
        })
        .collect();
    drop(crashed);
    let store = Arc::new(Store::open(&db, options()).unwrap());
    let resumed = store.resume_all().unwrap();
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0], (job, before.running as usize));

    let config = MapConfig {
        allowed_roots: vec![root.clone()],
        ..config
    };
    let runner = MapRunner::for_llm_map(
        Arc::clone(&store),
        provider(&after_crash, 0),
        job,
        RunnerOptions::from_config(&config),
    )
    .await
    .unwrap();
    let report = runner.run(&CancelToken::new()).await.unwrap();
    assert_eq!(report.end, RunEnd::Finished);
    assert_eq!(report.progress.completed, n);
    assert_eq!(report.attempts, n - finished_before.len() as u64);

    let path = store.job(job).unwrap().output_path;
    let summary = lcm_engine::operators::write_output(&store, job, &path).unwrap();
    assert_eq!(summary.completed, n);
    let lines = read_output(&path);
    assert_eq!(lines.len() as u64, n, "exactly one result per item");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], json!(i));
        assert_eq!(line["result"], json!({"id": i, "upper": format!("W{i}")}));
    }
    let before_crash = requests_per_item(&server);
    let after = requests_per_item(&after_crash);
    for index in 0..n {
        let asked_after = after.get(&index).map_or(0, Vec::len);
        if finished_before.contains(&index) {
            assert_eq!(
                before_crash[&index].len(),
                1,
                "item {index} was answered once before the crash"
            );
            assert_eq!(
                asked_after, 0,
                "item {index} was finished before the crash and must not be requested again"
            );
        } else {
            // At most one request before the crash (in flight) and exactly one after.
            let asked_before = before_crash.get(&index).map_or(0, Vec::len);
            assert!(
                asked_before <= 1,
                "item {index}: {asked_before} requests before the crash"
            );
            assert_eq!(asked_after, 1, "item {index}");
        }
    }
}
