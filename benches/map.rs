//! Map operator benchmarks.
//!
//! - **Throughput against a slow model**: 5,000 items, a scripted OpenAI-shaped server on
//!   loopback answering each call after 100 ms, concurrency 16: the ideal is 160 items/s (the
//!   goal: within 10% of it). Printed as a table (one run takes about 31 s).
//! - **Engine overhead per item** (criterion): a job whose item worker answers instantly (no
//!   HTTP), so the time per item is only the engine's: claims, leases, validation, the durable
//!   batch commits, progress.
//!
//! `LCM_BENCH_QUICK=1` runs 1,000 items against the slow model instead of 5,000.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lcm::core::config::MapConfig;
use lcm::engine::operators::llm_map::{ItemAttempt, ItemWorker};
use lcm::engine::operators::{
    CancelToken, MapRequest, MapRunner, RunnerOptions, create_map_job, run_llm_map,
};
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use lcm::store::{Store, StoreOptions};
use lcm::{Encoding, TokenCounter};
use serde_json::{Value, json};

fn temp_dir() -> tempfile::TempDir {
    match std::env::var_os("LCM_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).expect("temp dir"),
        None => tempfile::tempdir().expect("temp dir"),
    }
}

fn store(dir: &std::path::Path) -> Arc<Store> {
    Arc::new(
        Store::open(
            dir.join("lcm.redb"),
            StoreOptions::new(TokenCounter::new(Encoding::O200kBase)),
        )
        .expect("store"),
    )
}

fn write_items(dir: &std::path::Path, n: u64) -> std::path::PathBuf {
    let path = dir.join("items.jsonl");
    let lines: Vec<String> = (0..n)
        .map(|i| json!({"id": i, "word": format!("w{i}")}).to_string())
        .collect();
    std::fs::write(&path, lines.join("\n")).expect("items");
    path
}

fn schema() -> Value {
    json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})
}

fn map_config(dir: &std::path::Path) -> MapConfig {
    MapConfig {
        allowed_roots: vec![dir.to_path_buf()],
        concurrency: 16,
        ..MapConfig::default()
    }
}

fn item_id(request: &RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    let item: Value = serde_json::from_str(line).ok()?;
    Some(item["id"].clone())
}

fn throughput_against_a_slow_model(_c: &mut Criterion) {
    let items: u64 = if std::env::var_os("LCM_BENCH_QUICK").is_some() {
        1_000
    } else {
        5_000
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let dir = temp_dir();
    let input = write_items(dir.path(), items);
    let (elapsed, summary, requests) = tokio.block_on(async {
        let server = ScriptedServer::start().await;
        server.set_default(ScriptedReply::from_fn(|r| match item_id(r) {
            Some(id) => ScriptedReply::ok(json!({ "id": id }).to_string()),
            None => ScriptedReply::status(400),
        }));
        server.set_latency(Duration::from_millis(100));
        let provider = Arc::new(
            OpenAiProvider::new(HttpConfig::new(server.url(), "scripted")).expect("provider"),
        );
        let store = store(dir.path());
        let config = map_config(dir.path());
        let request = MapRequest::llm(&input, "Echo the id.", schema());
        let started = Instant::now();
        let summary = run_llm_map(
            store,
            provider,
            &config,
            &request,
            &CancelToken::new(),
            |_| {},
        )
        .await
        .expect("map");
        (started.elapsed(), summary, server.request_count())
    });
    let rate = items as f64 / elapsed.as_secs_f64();
    println!(
        "\nllm_map, {items} items, 100 ms per call, concurrency 16: {:.1} s, {rate:.1} items/s = {:.1}% of the ideal 160/s; {} completed, {} failed, {requests} requests",
        elapsed.as_secs_f64(),
        100.0 * rate / 160.0,
        summary.completed,
        summary.failed
    );
}

/// Answers instantly: the time per item is the engine's alone.
struct Instant0;

#[async_trait]
impl ItemWorker for Instant0 {
    async fn attempt(&self, payload: &str, _feedback: Option<&str>) -> ItemAttempt {
        let item: Value = serde_json::from_str(payload).unwrap_or(Value::Null);
        ItemAttempt::Valid(json!({ "id": item["id"] }))
    }
}

fn engine_overhead_per_item(c: &mut Criterion) {
    const ITEMS: u64 = 2_000;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let dir = temp_dir();
    let input = write_items(dir.path(), ITEMS);
    let store = store(dir.path());
    let config = map_config(dir.path());
    let mut group = c.benchmark_group("map_engine");
    group.sample_size(10);
    group.throughput(Throughput::Elements(ITEMS));
    group.bench_function("2000_items_instant_worker_concurrency_16", |b| {
        b.iter(|| {
            tokio.block_on(async {
                let request = MapRequest::llm(&input, "Echo the id.", schema());
                let job = create_map_job(Arc::clone(&store), &config, &request)
                    .await
                    .expect("job");
                let runner = MapRunner::new(
                    Arc::clone(&store),
                    job,
                    Arc::new(Instant0),
                    RunnerOptions::from_config(&config),
                );
                let report = runner.run(&CancelToken::new()).await.expect("run");
                assert_eq!(report.progress.completed, ITEMS);
            })
        })
    });
    group.finish();
}

criterion_group!(
    benches,
    engine_overhead_per_item,
    throughput_against_a_slow_model
);
criterion_main!(benches);
