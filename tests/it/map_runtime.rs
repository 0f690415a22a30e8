//! `llm_map` through the runtime (the MapWorkerPool actor) against the scripted provider on
//! loopback: a 300-item job at concurrency 16 (every result valid, in input order); a panic at
//! each of the pool's fault points during such a job (the job completes, every item has exactly
//! one committed result, the pool restarts its job worker, the store passes the integrity
//! check); a job resumed automatically by a runtime reopened on the same data directory after a
//! shutdown mid-job (items finished before are never requested again); cancellation; and the
//! clear refusal of a runtime without a model.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lcm::core::config::Config;
use lcm::core::ids::JobId;
use lcm::engine::operators::{MapRequest, validate_schema};
use lcm::engine::runtime::{
    ActorKind, Fault, FaultPoint, Runtime, RuntimeError, RuntimeEvent, RuntimeOptions,
};
use lcm::llm::from_config::LlmClients;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use lcm::store::{ItemContent, ItemState, JobStatus, MapJob};
use serde_json::{Value, json};

const ITEMS: u64 = 300;

fn config(root: &Path) -> Config {
    let mut config = Config::default();
    config.map.concurrency = 16;
    // Retried mid-call panics count as attempts: leave room so no item fails.
    config.map.max_attempts = 8;
    config.map.timeout_s = 10;
    config.map.lease_s = 30;
    config.map.allowed_roots = vec![root.to_path_buf()];
    config.runtime.heartbeat_ms = 50;
    config.runtime.restart_backoff_ms = 5;
    config.runtime.restart_backoff_max_ms = 50;
    config.runtime.max_restarts = 50;
    config.runtime.integrity_interval_s = 0;
    config
}

/// The model on `server`: no HTTP retries (items are retried by the runner) and no breaker.
fn llm(server: &ScriptedServer) -> LlmClients {
    let http = HttpConfig::new(server.url(), "map-model")
        .with_max_retries(0)
        .with_circuit(0, Duration::from_secs(1));
    LlmClients::new(Arc::new(OpenAiProvider::new(http).expect("provider")))
}

struct Fixture {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    data: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    let data = tmp.path().join("data");
    Fixture {
        _tmp: tmp,
        root,
        data,
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

/// The right result for an item.
fn expected(item: &Value) -> Value {
    json!({
        "id": item["id"],
        "upper": item["word"].as_str().unwrap_or_default().to_uppercase()
    })
}

/// Answers every item correctly after `delay`.
fn correct_after(delay: Duration) -> ScriptedReply {
    ScriptedReply::from_fn(move |request| match item_of(request) {
        Some(item) => ScriptedReply::delayed(delay, ScriptedReply::ok(expected(&item).to_string())),
        None => ScriptedReply::status(400),
    })
}

/// Requests received per item id.
fn requests_per_item(server: &ScriptedServer) -> HashMap<u64, usize> {
    let mut out = HashMap::new();
    for request in server.requests() {
        if let Some(id) = item_of(&request).and_then(|item| item["id"].as_u64()) {
            *out.entry(id).or_default() += 1;
        }
    }
    out
}

async fn open(options: RuntimeOptions) -> Runtime {
    Runtime::open(options).await.expect("runtime opens")
}

/// Every event of `rt` from now on, collected by a background task.
fn collect_events(rt: &Runtime) -> Arc<Mutex<Vec<RuntimeEvent>>> {
    let events: Arc<Mutex<Vec<RuntimeEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let mut receiver = rt.subscribe();
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match receiver.recv().await {
                Ok(event) => sink.lock().unwrap().push(event),
                Err(RecvError::Lagged(n)) => panic!("the event collector missed {n} events"),
                Err(RecvError::Closed) => break,
            }
        }
    });
    events
}

fn pool_failures(events: &[RuntimeEvent]) -> usize {
    events
        .iter()
        .filter(|e| {
            matches!(
                e,
                RuntimeEvent::ActorFailed {
                    kind: ActorKind::MapWorkerPool,
                    ..
                }
            )
        })
        .count()
}

fn read_output(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The output file and the store agree that each of the `n` items has exactly one result, the
/// right one, in input order. Returns the attempts of each item.
fn verify_results(rt: &Runtime, job: &MapJob, n: u64) -> Vec<u64> {
    let validator = validate_schema(&schema()).unwrap();
    let lines = read_output(&job.output_path);
    assert_eq!(lines.len() as u64, n, "one output line per item");
    let mut attempts = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], json!(i), "input order");
        assert_eq!(line["line"], json!(i + 1));
        assert_eq!(line["ok"], json!(true), "{line}");
        validator.check(&line["result"]).unwrap();
        assert_eq!(line["result"], json!({"id": i, "upper": format!("W{i}")}));
        attempts.push(line["attempts"].as_u64().unwrap());
    }
    // The store: every item completed once, with the result of its own payload.
    let mut seen = BTreeSet::new();
    for item in rt.store().items_in_order(job.id).unwrap() {
        let item = item.unwrap();
        assert!(seen.insert(item.index), "item {} listed twice", item.index);
        let ItemContent::Json(payload) = &item.payload else {
            panic!("item {} has no JSON payload", item.index);
        };
        let payload: Value = serde_json::from_str(payload).unwrap();
        let ItemState::Completed { result } = &item.state else {
            panic!("item {} is not completed: {:?}", item.index, item.state);
        };
        let result: Value = serde_json::from_str(result).unwrap();
        assert_eq!(result, expected(&payload), "item {}", item.index);
    }
    assert_eq!(seen, (0..n).collect::<BTreeSet<_>>());
    let progress = rt.store().progress(job.id).unwrap();
    assert_eq!(
        (progress.total, progress.completed, progress.failed),
        (n, n, 0),
        "the job's counters count each result once"
    );
    assert_eq!((progress.pending, progress.running), (0, 0));
    attempts
}

async fn assert_integrity(rt: &Runtime) {
    let outcome = rt.check_integrity(false).await.expect("integrity check");
    assert!(
        outcome.report.violations.is_empty(),
        "{:#?}",
        outcome.report.violations
    );
}

fn request(input: &Path) -> MapRequest {
    let mut request = MapRequest::llm(input, "Upper-case the word.", schema());
    request.concurrency = Some(16);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_of_300_items_completes_in_order_through_the_runtime() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct_after(Duration::from_millis(5)));
    let input = write_items(&f.root, "items.jsonl", ITEMS);
    let rt = open(RuntimeOptions::in_memory(config(&f.root)).with_llm(llm(&server))).await;
    let events = collect_events(&rt);

    let job = rt.llm_map(request(&input)).await.expect("job starts");
    assert_eq!(job.status, JobStatus::Running);
    assert_eq!(job.progress.total, ITEMS);
    assert_eq!(job.concurrency, 16);
    let summary = rt.map_wait(job.id).await.expect("job ends");

    assert_eq!(summary.status, JobStatus::Completed);
    assert_eq!(
        (
            summary.total,
            summary.completed,
            summary.failed,
            summary.not_run
        ),
        (ITEMS, ITEMS, 0, 0)
    );
    assert_eq!(summary.output_path, f.root.join("items.out.jsonl"));
    let attempts = verify_results(&rt, &job, ITEMS);
    assert!(attempts.iter().all(|a| *a == 1), "one attempt per item");
    assert_eq!(server.request_count() as u64, ITEMS, "one request per item");
    // Waiting again gives the same summary from the store.
    assert_eq!(rt.map_wait(job.id).await.unwrap(), summary);

    let events = events.lock().unwrap().clone();
    let progress: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            RuntimeEvent::MapProgress {
                job: j, completed, ..
            } if *j == job.id => Some(*completed),
            _ => None,
        })
        .collect();
    assert!(progress.len() > 2, "progress is reported as answers commit");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    assert!(events.iter().any(|e| matches!(
        e,
        RuntimeEvent::MapFinished { job: j, completed: ITEMS, failed: 0 } if *j == job.id
    )));
    assert_eq!(pool_failures(&events), 0);
    assert_integrity(&rt).await;
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

fn restarts(stats: &lcm::engine::runtime::SupervisorStats, kind: ActorKind) -> u64 {
    stats
        .restarts
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}

/// Runs a 300-item job with `times` panics armed at `point` after `skip` hits, checks that it
/// completes with exactly one committed result per item; returns what the checks need.
async fn job_under_faults(
    point: FaultPoint,
    skip: u32,
    times: u32,
) -> (Runtime, ScriptedServer, Vec<u64>, usize, Fixture) {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct_after(Duration::from_millis(5)));
    let input = write_items(&f.root, "items.jsonl", ITEMS);
    let rt = open(RuntimeOptions::in_memory(config(&f.root)).with_llm(llm(&server))).await;
    let events = collect_events(&rt);
    rt.faults().arm(point, Fault::Panic, skip, times);

    let job = rt.llm_map(request(&input)).await.expect("job starts");
    let summary = tokio::time::timeout(Duration::from_secs(20), rt.map_wait(job.id))
        .await
        .expect("the job ends in time")
        .expect("the job ends");
    assert_eq!(rt.faults().fired(point), times, "{point} fired as armed");
    assert_eq!(summary.status, JobStatus::Completed, "{summary}");
    assert_eq!((summary.completed, summary.failed), (ITEMS, 0), "{summary}");
    let attempts = verify_results(&rt, &job, ITEMS);
    // The pool itself never failed: only its job worker did (or nothing, mid-call).
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(restarts(&stats, ActorKind::MapWorkerPool), 0, "{stats:?}");
    assert_integrity(&rt).await;
    let failures = pool_failures(&events.lock().unwrap());
    (rt, server, attempts, failures, f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_panic_mid_llm_call_is_a_retried_item_failure() {
    let times = 6;
    let (rt, server, attempts, failures, _f) =
        job_under_faults(FaultPoint::MapWorkerMidLlmCall, 20, times).await;
    // Each panic cost its item one attempt (and no request: it came before the call); the
    // job worker itself never failed.
    let extra: u64 = attempts.iter().map(|a| a - 1).sum();
    assert_eq!(extra, u64::from(times), "{attempts:?}");
    assert_eq!(server.request_count() as u64, ITEMS);
    assert_eq!(failures, 0, "a mid-call panic does not kill the job worker");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_worker_panicking_before_a_commit_is_restarted() {
    let times = 3;
    let (rt, server, attempts, failures, _f) =
        job_under_faults(FaultPoint::MapWorkerBeforeCommit, 5, times).await;
    assert_eq!(failures, times as usize, "one worker failure per panic");
    // The lost answers were asked for again; their claims were given back without counting.
    assert!(server.request_count() as u64 > ITEMS);
    assert!(attempts.iter().all(|a| *a == 1), "{attempts:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_worker_panicking_after_a_commit_is_restarted() {
    let times = 3;
    let (rt, server, attempts, failures, _f) =
        job_under_faults(FaultPoint::MapWorkerAfterCommit, 5, times).await;
    assert_eq!(failures, times as usize, "one worker failure per panic");
    assert!(server.request_count() as u64 >= ITEMS);
    assert!(attempts.iter().all(|a| *a == 1), "{attempts:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// Reopens a runtime on a data directory just released by another one.
async fn reopen(options: RuntimeOptions) -> Runtime {
    Runtime::open(options).await.expect("the runtime reopens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_rides_out_a_restart_of_the_map_worker_pool() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct_after(Duration::from_millis(5)));
    let n = 40;
    let input = write_items(&f.root, "pool.jsonl", n);
    let rt = open(RuntimeOptions::in_memory(config(&f.root)).with_llm(llm(&server))).await;
    let events = collect_events(&rt);
    // The pool itself panics when the job's run ends, before it answers its waiters: they
    // are dropped with the pool, and the wait must follow the job to the restarted pool.
    rt.faults()
        .arm(FaultPoint::MapPoolOnEnded, Fault::Panic, 0, 1);

    let job = rt.llm_map(request(&input)).await.expect("job starts");
    let summary = tokio::time::timeout(Duration::from_secs(20), rt.map_wait(job.id))
        .await
        .expect("the wait ends in time")
        .expect("the wait follows the job across the restart");
    assert_eq!(rt.faults().fired(FaultPoint::MapPoolOnEnded), 1);
    assert_eq!(summary.status, JobStatus::Completed, "{summary}");
    assert_eq!((summary.completed, summary.failed), (n, 0), "{summary}");
    verify_results(&rt, &job, n);
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(restarts(&stats, ActorKind::MapWorkerPool), 1, "{stats:?}");
    assert_eq!(pool_failures(&events.lock().unwrap()), 1);
    // The restarted pool serves new jobs.
    let again = write_items(&f.root, "again.jsonl", 5);
    let next = rt.llm_map(request(&again)).await.expect("a new job starts");
    let summary = rt.map_wait(next.id).await.expect("the new job ends");
    assert_eq!(summary.completed, 5);
    assert_integrity(&rt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_resumes_after_a_restart_without_asking_for_finished_items_again() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct_after(Duration::from_millis(40)));
    let n = 80;
    let input = write_items(&f.root, "slow.jsonl", n);
    let options = RuntimeOptions::dir(&f.data, config(&f.root)).with_llm(llm(&server));
    let rt = open(options.clone()).await;
    let mut req = request(&input);
    req.concurrency = Some(4);
    let job = rt.llm_map(req).await.expect("job starts");
    let waiter = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.map_wait(job.id).await })
    };

    // Shut down mid-job, once a quarter of the items are done.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.store().progress(job.id).unwrap().completed < n / 4 {
        assert!(Instant::now() < deadline, "the job makes no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
    let waited = waiter.await.unwrap();
    assert!(
        matches!(waited, Err(RuntimeError::ShuttingDown)),
        "a wait cut short by the shutdown says so: {waited:?}"
    );
    let finished_before: BTreeSet<u64> = rt
        .store()
        .items_in_order(job.id)
        .unwrap()
        .map(|item| item.unwrap())
        .filter(|item| matches!(item.state, ItemState::Completed { .. }))
        .map(|item| item.index)
        .collect();
    let stopped = rt.store().job(job.id).unwrap();
    assert_eq!(
        stopped.status,
        JobStatus::Running,
        "a shutdown does not cancel"
    );
    assert!((n / 4..n).contains(&(finished_before.len() as u64)));
    assert_eq!(
        Arc::strong_count(rt.store()),
        1,
        "after a shutdown nothing but the runtime holds the store"
    );
    drop(rt);

    // The pool of the new runtime resumes the job by itself.
    let rt = reopen(options).await;
    let summary = tokio::time::timeout(Duration::from_secs(20), rt.map_wait(job.id))
        .await
        .expect("the resumed job ends in time")
        .expect("the resumed job ends");
    assert_eq!(summary.status, JobStatus::Completed, "{summary}");
    verify_results(&rt, &stopped, n);
    let requests = requests_per_item(&server);
    for index in 0..n {
        let count = requests.get(&index).copied().unwrap_or(0);
        if finished_before.contains(&index) {
            assert_eq!(count, 1, "item {index} was finished before the shutdown");
        } else {
            // At most one request cut short by the shutdown, and one after it.
            assert!((1..=2).contains(&count), "item {index}: {count} requests");
        }
    }
    assert_integrity(&rt).await;
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_is_cancelled_through_the_runtime() {
    let f = fixture();
    let server = ScriptedServer::start().await;
    server.set_default(correct_after(Duration::from_millis(30)));
    let n = 100;
    let input = write_items(&f.root, "cancel.jsonl", n);
    let rt = open(RuntimeOptions::in_memory(config(&f.root)).with_llm(llm(&server))).await;
    let events = collect_events(&rt);
    let mut req = request(&input);
    req.concurrency = Some(4);
    let job = rt.llm_map(req).await.expect("job starts");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.store().progress(job.id).unwrap().completed < 8 {
        assert!(Instant::now() < deadline, "the job makes no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    rt.map_cancel(job.id).await.expect("cancel");
    let summary = rt.map_wait(job.id).await.expect("the cancelled job ends");
    assert_eq!(summary.status, JobStatus::Cancelled, "{summary}");
    assert!(summary.completed >= 8 && summary.completed < n, "{summary}");
    assert_eq!(summary.completed + summary.failed + summary.not_run, n);
    let lines = read_output(&summary.output_path);
    assert_eq!(lines.len() as u64, n);
    let not_run = lines.iter().filter(|l| l["ok"] == json!(false)).count() as u64;
    assert_eq!(not_run, summary.not_run);
    assert!(
        lines
            .iter()
            .filter(|l| l["ok"] == json!(false))
            .all(|l| l["error"].as_str().unwrap().contains("cancelled")),
        "{lines:?}"
    );
    // Nothing is asked for any more.
    let asked = server.request_count();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(server.request_count(), asked);
    assert!(events.lock().unwrap().iter().any(|e| matches!(
        e,
        RuntimeEvent::MapFinished { job: j, .. } if *j == job.id
    )));

    // A cancelled job stays cancelled: resuming it says so; cancelling again changes nothing.
    let err = rt.map_resume(job.id).await.unwrap_err();
    assert!(err.to_string().contains("cancelled"), "{err}");
    rt.map_cancel(job.id)
        .await
        .expect("cancelling again is harmless");
    assert_eq!(rt.store().job(job.id).unwrap().status, JobStatus::Cancelled);
    // Unknown jobs are errors.
    let unknown = JobId(999);
    assert!(rt.map_cancel(unknown).await.is_err());
    assert!(rt.map_wait(unknown).await.is_err());
    assert!(rt.map_resume(unknown).await.is_err());
    assert_integrity(&rt).await;
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_model_map_jobs_are_refused_and_nothing_is_stored() {
    let f = fixture();
    let input = write_items(&f.root, "items.jsonl", 5);
    // The default configuration: the offline extractive summariser, no model.
    let mut config = Config::default();
    config.map.allowed_roots = vec![f.root.clone()];
    let rt = open(RuntimeOptions::in_memory(config)).await;
    let err = rt.llm_map(request(&input)).await.unwrap_err();
    assert!(matches!(err, RuntimeError::Invalid(_)), "{err:?}");
    assert!(err.to_string().contains("[llm] provider"), "{err}");
    assert!(rt.store().jobs().unwrap().is_empty(), "nothing stored");
    assert!(!f.root.join("items.out.jsonl").exists());
    let err = rt.map_resume(JobId(0)).await.unwrap_err();
    assert!(err.to_string().contains("[llm] provider"), "{err}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}
