//! Exactly-once map jobs under crashes: a child process runs a 2,000-item `llm_map` job through
//! the runtime and is killed with SIGKILL at random moments, several times per seed; each
//! restart resumes the job where it stopped (the map pool resumes running jobs on start). In
//! the end every item has exactly one committed result, none lost and none duplicated in the
//! output, and the store passes the integrity check.
//!
//! The model is a scripted OpenAI-shaped server on loopback in this (parent) process, answering
//! each item from its own content.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::common::test_name;
use lcm::core::config::Config;
use lcm::core::rng::SplitMix64;
use lcm::engine::operators::MapRequest;
use lcm::engine::runtime::{Runtime, RuntimeOptions};
use lcm::llm::from_config::LlmClients;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use lcm::store::{ItemState, JobStatus};
use serde_json::{Value, json};

const DIR_ENV: &str = "LCM_MAP_CRASH_DIR";
const URL_ENV: &str = "LCM_MAP_CRASH_URL";
const TEST_NAME: &str = "map_jobs_survive_sigkill_exactly_once";
const ITEMS: u64 = 2_000;

fn config(dir: &Path) -> Config {
    let mut config = Config::default();
    config.map.allowed_roots = vec![dir.to_path_buf()];
    config.map.concurrency = 16;
    config.runtime.index_interval_ms = 50;
    config
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "upper": {"type": "string"}},
        "required": ["id", "upper"],
        "additionalProperties": false
    })
}

/// The child: open the runtime on the data dir, start the job unless one is running (the pool
/// resumes it by itself), wait for it, print DONE.
fn child(dir: &str, url: &str) {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    tokio.block_on(async {
        let dir = Path::new(dir);
        let provider = OpenAiProvider::new(HttpConfig::new(url, "scripted")).expect("provider");
        let rt = Runtime::open(
            RuntimeOptions::dir(dir.join("data"), config(dir))
                .with_llm(LlmClients::new(Arc::new(provider))),
        )
        .await
        .expect("runtime");
        let store = Arc::clone(rt.store());
        let jobs = store.jobs().expect("jobs");
        let job = match jobs
            .iter()
            .find(|j| matches!(j.status, JobStatus::Running | JobStatus::Completed))
        {
            Some(job) => job.id,
            None => {
                // A job killed while its items were being written is dropped and made again.
                for j in &jobs {
                    store.delete_job(j.id).expect("delete a partial job");
                }
                let mut request =
                    MapRequest::llm(dir.join("items.jsonl"), "Upper-case the word.", schema());
                request.output_path = Some(dir.join("items.out.jsonl"));
                rt.llm_map(request).await.expect("start").id
            }
        };
        let summary = rt.map_wait(job).await.expect("wait");
        println!("DONE {} {}", summary.completed, summary.failed);
        rt.shutdown(Duration::from_secs(5)).await.expect("shutdown");
    });
}

fn item_of(request: &RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    serde_json::from_str(line).ok()
}

fn answers() -> ScriptedReply {
    ScriptedReply::from_fn(|request| match item_of(request) {
        Some(item) => ScriptedReply::ok(
            json!({
                "id": item["id"],
                "upper": item["word"].as_str().unwrap_or_default().to_uppercase()
            })
            .to_string(),
        ),
        None => ScriptedReply::status(400),
    })
}

#[test]
fn map_jobs_survive_sigkill_exactly_once() {
    if let (Ok(dir), Ok(url)) = (std::env::var(DIR_ENV), std::env::var(URL_ENV)) {
        child(&dir, &url);
        return;
    }
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = tokio.block_on(ScriptedServer::start());
    server.set_default(answers());
    // Slow enough that the job outlasts the first kills (2,000 items x 15 ms / 16 at once, about
    // 1.9 s of answers) on a fast, idle machine too; kills land 150-1,050 ms into each run.
    server.set_latency(Duration::from_millis(15));
    let exe = std::env::current_exe().unwrap();
    let test = test_name(module_path!(), TEST_NAME);
    for seed in [11u64, 23, 57] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let items: Vec<String> = (0..ITEMS)
            .map(|i| json!({"id": i, "word": format!("w{i}x")}).to_string())
            .collect();
        std::fs::write(dir.join("items.jsonl"), items.join("\n")).unwrap();
        let mut rng = SplitMix64::new(seed);
        let mut kills = 0;
        let mut mid_job_kills = 0;
        let mut finished = false;
        for _ in 0..40 {
            let mut child = Command::new(&exe)
                .args([&test, "--exact", "--nocapture", "--test-threads=1"])
                .env(DIR_ENV, dir)
                .env(URL_ENV, server.url())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // Kill at a random moment for the first few runs, then let it finish.
            if kills < 5 {
                let wait_ms = 150 + rng.next_u64() % 900;
                std::thread::sleep(Duration::from_millis(wait_ms));
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap(); // SIGKILL
                    child.wait().unwrap();
                    kills += 1;
                    let done = completed_so_far(dir);
                    if done > 0 && done < ITEMS {
                        mid_job_kills += 1;
                    }
                    continue;
                }
            }
            let out = child.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "child failed: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(stdout.contains("DONE 2000 0"), "{stdout}");
            finished = true;
            break;
        }
        assert!(finished, "seed {seed}: the job never finished");
        assert!(
            mid_job_kills >= 1,
            "seed {seed}: no kill landed mid-job ({kills} kills)"
        );
        verify(dir, &tokio);
    }
}

/// Items completed so far, read from the store file of the killed child.
fn completed_so_far(dir: &Path) -> u64 {
    let path = dir.join("data").join(lcm::search::data_dir::STORE_FILE);
    let Ok(store) = lcm::store::Store::open(
        &path,
        lcm::store::StoreOptions::new(lcm::TokenCounter::new(lcm::Encoding::O200kBase)),
    ) else {
        return 0;
    };
    store
        .jobs()
        .ok()
        .and_then(|jobs| jobs.first().map(|j| j.progress.completed))
        .unwrap_or(0)
}

/// One committed result per item, the output complete and in order, the store consistent.
fn verify(dir: &Path, tokio: &tokio::runtime::Runtime) {
    let rt = tokio
        .block_on(Runtime::open(RuntimeOptions::dir(
            dir.join("data"),
            config(dir),
        )))
        .unwrap();
    let store = rt.store();
    let jobs = store.jobs().unwrap();
    let job = jobs
        .iter()
        .find(|j| j.status == JobStatus::Completed)
        .expect("a completed job");
    assert_eq!(job.progress.completed, ITEMS);
    let mut seen = 0;
    for item in store.items_in_order(job.id).unwrap() {
        let item = item.unwrap();
        assert_eq!(item.index, seen);
        match &item.state {
            ItemState::Completed { result } => {
                let value: Value = serde_json::from_str(result).unwrap();
                assert_eq!(value["id"], seen);
                assert_eq!(value["upper"], format!("W{seen}X"));
            }
            other => panic!("item {seen} is {other:?}"),
        }
        seen += 1;
    }
    assert_eq!(seen, ITEMS);
    let output = std::fs::read_to_string(dir.join("items.out.jsonl")).unwrap();
    let mut indices = HashSet::new();
    for (i, line) in output.lines().enumerate() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["index"], i as u64, "output in input order");
        assert_eq!(v["ok"], true);
        assert!(indices.insert(i), "no duplicate lines");
    }
    assert_eq!(indices.len() as u64, ITEMS);
    let outcome = tokio.block_on(rt.check_integrity(false)).unwrap();
    assert!(outcome.report.is_clean(), "{:?}", outcome.report.violations);
    tokio.block_on(rt.shutdown(Duration::from_secs(5))).unwrap();
}

/// The output file is derived from the store (docs/RELIABILITY.md, "Power loss"): written to a
/// temporary file, synced and renamed, so a crash leaves the old file or none, and written
/// again from the committed items whenever the job is waited for. After a crash that lost or
/// tore it (a power loss before the rename or the directory reached the disk), `map_wait` on
/// the reopened runtime gives the whole output again: every item exactly once, in order.
#[test]
fn a_lost_or_torn_output_file_is_written_again_from_the_store() {
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = tokio.block_on(ScriptedServer::start());
    server.set_default(answers());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    const SMALL: u64 = 200;
    let items: Vec<String> = (0..SMALL)
        .map(|i| json!({"id": i, "word": format!("w{i}x")}).to_string())
        .collect();
    std::fs::write(dir.join("items.jsonl"), items.join("\n")).unwrap();
    let output = dir.join("items.out.jsonl");
    let open = || {
        let provider = OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).unwrap();
        tokio
            .block_on(Runtime::open(
                RuntimeOptions::dir(dir.join("data"), config(dir))
                    .with_llm(LlmClients::new(Arc::new(provider))),
            ))
            .unwrap()
    };
    let rt = open();
    let mut request = MapRequest::llm(dir.join("items.jsonl"), "Upper-case the word.", schema());
    request.output_path = Some(output.clone());
    let job = tokio.block_on(rt.llm_map(request)).unwrap().id;
    let summary = tokio.block_on(rt.map_wait(job)).unwrap();
    assert_eq!(summary.completed, SMALL);
    tokio.block_on(rt.shutdown(Duration::from_secs(5))).unwrap();
    drop(rt);
    let whole = std::fs::read_to_string(&output).unwrap();
    let check = |what: &str| {
        let text = std::fs::read_to_string(&output).unwrap();
        assert_eq!(text, whole, "{what}: the output is written again, the same");
        for (i, line) in text.lines().enumerate() {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["index"], i as u64, "{what}");
            assert_eq!(v["result"]["upper"], format!("W{i}X"), "{what}");
        }
        assert_eq!(text.lines().count() as u64, SMALL, "{what}");
    };
    for damage in ["torn", "lost"] {
        match damage {
            "torn" => std::fs::write(&output, &whole[..whole.len() / 2]).unwrap(),
            _ => std::fs::remove_file(&output).unwrap(),
        }
        let rt = open();
        let summary = tokio.block_on(rt.map_wait(job)).unwrap();
        assert_eq!((summary.completed, summary.failed), (SMALL, 0), "{damage}");
        check(damage);
        tokio.block_on(rt.shutdown(Duration::from_secs(5))).unwrap();
    }
}
