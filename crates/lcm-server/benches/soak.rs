//! Soak of the daemon: an `lcm serve` process (the `bench` profile's binary) under the load
//! generator of `benches/load.rs` for a long time (default 30 minutes), with compactions
//! summarising through a scripted model on loopback (`lcm_llm::testing::ScriptedServer`, the
//! OpenAI shape) and an `llm_map` job started every minute. It samples the daemon's resident
//! memory (`VmRSS` of `/proc/PID/status`) every few seconds and prints, per interval, the
//! requests served, the errors, the append and assembly latency percentiles and the RSS; at the
//! end it checks that no request failed, every acknowledged append is stored, every map job
//! completed, the store passes the daemon's integrity check, the daemon stops cleanly, and
//! `lcm doctor` finds nothing wrong. Figures: docs/RELIABILITY.md, "Soak".
//!
//! ```sh
//! cargo build --profile bench --bin lcm
//! nice cargo bench -p lcm-server --bench soak                      # 30 minutes
//! LCM_SOAK_SECS=60 cargo bench -p lcm-server --bench soak          # one minute
//! ```
//!
//! `LCM_SOAK_SECS` (1800), `LCM_SOAK_INTERVAL_SECS` (60, the reporting interval),
//! `LCM_SOAK_SAMPLE_SECS` (5, RSS sampling), `LCM_SOAK_CLIENTS` (8), `LCM_SOAK_ROUND` (appends
//! per client per round, 100), `LCM_SOAK_RATE` (150 appends per second at most, rounds are
//! spaced to keep to it; 0: as fast as the daemon answers), `LCM_SOAK_MAP_ITEMS` (40 per job),
//! `LCM_SOAK_MODEL_MS` (10, the scripted model's latency), `LCM_SOAK_CACHE_MIB` (256, the
//! store's page cache, `[storage] cache_mib`) change the shape; `LCM_BIN` names the
//! binary to run (default: the `lcm` of the profile's output directory, `target/release/lcm`
//! for the `bench` profile). `LCM_SOAK_EMBED_MODEL=DIR` (a sentence-transformers directory,
//! e.g. from `../shared/tools/embed-model`) turns the embeddings on, with the vector index's
//! lists from `LCM_SOAK_LISTS_FROM` (1,000) chunks: the background embedding, its lists and
//! their retraining run under the load, and the end checks include the vector index (`lcm
//! doctor` checks it against the store).

// The integration tests' helpers, of which the soak uses the load generator.
#[path = "../tests/it/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::load::{LoadReport, LoadShape, LoadTarget, run_at, session_key};
use lcm_llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use serde_json::{Value, json};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The daemon's binary: `$LCM_BIN`, else `lcm` in the profile directory this benchmark runs
/// from (`target/release/deps/soak-*` → `target/release/lcm`: the `bench` profile writes to
/// `target/release`).
fn daemon_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("LCM_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("the benchmark's own path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps");
    profile_dir.join("lcm")
}

/// The resident set of a process, KiB: all of it, and its anonymous part (the heap and redb's
/// page cache; the rest is mapped files: the binary, the index segments).
#[derive(Clone, Copy, Default)]
struct Resident {
    total: u64,
    anon: u64,
}

/// What `/proc/PID/status` says of `pid`'s resident set; `None` once it has exited.
fn resident(pid: u32) -> Option<Resident> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some(Resident {
        total: field("VmRSS:")?,
        anon: field("RssAnon:")?,
    })
}

/// The item a map request is about (the line after `Item (JSON):`).
fn item_of(request: &RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    serde_json::from_str(line).ok()
}

/// The scripted model: a map item gets its correct answer, anything else (a summary) the echo.
fn model(latency: Duration) -> ScriptedReply {
    ScriptedReply::from_fn(move |request| {
        let reply = match item_of(request) {
            Some(item) => {
                let upper = item["word"].as_str().unwrap_or_default().to_uppercase();
                ScriptedReply::ok(json!({"id": item["id"], "upper": upper}).to_string())
            }
            None => ScriptedReply::Echo,
        };
        ScriptedReply::delayed(latency, reply)
    })
}

fn map_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "upper": {"type": "string"}},
        "required": ["id", "upper"],
        "additionalProperties": false
    })
}

/// Kills the daemon when dropped (a failed soak leaves no process behind).
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One interval's figures.
#[derive(Default)]
struct Interval {
    appends: Vec<Duration>,
    assemblies: Vec<Duration>,
    errors: Vec<String>,
}

async fn request(
    target: &LoadTarget,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let mut req = target
        .http
        .request(method.clone(), format!("{}{path}", target.url));
    if let Some(token) = &target.token {
        req = req.bearer_auth(token);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    let answer = req
        .send()
        .await
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let status = answer.status();
    let text = answer.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(format!("{method} {path}: {status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("{method} {path}: body: {e}"))
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours means another bench was asked.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && a != "soak")
    {
        return;
    }
    let total = Duration::from_secs(env("LCM_SOAK_SECS", 1800));
    let interval = Duration::from_secs(env("LCM_SOAK_INTERVAL_SECS", 60).max(1));
    let sample = Duration::from_secs(env("LCM_SOAK_SAMPLE_SECS", 5).max(1));
    let clients = env("LCM_SOAK_CLIENTS", 8) as usize;
    let round = env("LCM_SOAK_ROUND", 100) as usize;
    let map_items = env("LCM_SOAK_MAP_ITEMS", 40);
    let model_latency = Duration::from_millis(env("LCM_SOAK_MODEL_MS", 10));
    // The store's page cache, MiB: smaller than the default 1 GiB so that the cache is full
    // a few minutes in and the rest of the run shows whether anything else grows.
    let cache_mib = env("LCM_SOAK_CACHE_MIB", 256);
    let rate = env("LCM_SOAK_RATE", 150);
    let binary = daemon_binary();
    assert!(
        binary.is_file(),
        "no daemon binary at {}: run `cargo build --profile bench --bin lcm` first (or set LCM_BIN)",
        binary.display()
    );

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    tokio.block_on(async move {
        let upstream = ScriptedServer::start().await;
        upstream.set_default(model(model_latency));
        let tmp = tempfile::tempdir().expect("temporary directory");
        let data = tmp.path().join("data");
        let root = tmp.path().join("root");
        std::fs::create_dir_all(&data).expect("data directory");
        std::fs::create_dir_all(&root).expect("map root");
        let root = root.canonicalize().expect("canonical root");
        let items: String = (0..map_items)
            .map(|i| format!("{}\n", json!({"id": i, "word": format!("w{i}")})))
            .collect();
        std::fs::write(root.join("items.jsonl"), items).expect("map input");
        let embeddings = match std::env::var_os("LCM_SOAK_EMBED_MODEL") {
            Some(model) => format!(
                "\n[embeddings]\nmodel_dir = {:?}\nlists_from = {}\n",
                PathBuf::from(model).display().to_string(),
                env("LCM_SOAK_LISTS_FROM", 1_000)
            ),
            None => String::new(),
        };
        // Small compaction chunks: every session compacts many times during the soak.
        let config = format!(
            "[llm]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"soak-model\"\n\n\
             [compaction]\nfresh_tail = 8\nleaf_chunk_tokens = 600\nleaf_target_tokens = 120\n\n\
             [map]\nallowed_roots = [\"{}\"]\n\n\
             [storage]\ncache_mib = {cache_mib}\n{embeddings}",
            upstream.url(),
            root.display()
        );
        std::fs::write(data.join("config.toml"), config).expect("config");

        let mut command = Command::new(&binary);
        if !embeddings.is_empty() {
            // The vector index says when it trains its lists (at info).
            command.env("LCM_LOG", "warn,lcm_search=info");
        }
        let child = command
            .arg("--data-dir")
            .arg(&data)
            .args(["serve", "--bind", "127.0.0.1:0"])
            .env_remove("LCM_CONFIG")
            .env_remove("LCM_SERVER_TOKEN")
            .env("LCM_LLM_API_KEY", "soak-key")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lcm serve");
        let mut daemon = Daemon(child);
        let pid = daemon.0.id();
        let mut stderr = BufReader::new(daemon.0.stderr.take().expect("stderr"));
        let mut port = None;
        let mut early = Vec::new();
        while port.is_none() {
            let mut line = String::new();
            let n = stderr.read_line(&mut line).expect("daemon stderr");
            assert!(n > 0, "lcm serve ended before listening: {early:?}");
            if let Some(rest) = line.split("listening on http://").nth(1) {
                port = rest
                    .split_whitespace()
                    .next()
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| p.parse::<u16>().ok());
            }
            early.push(line);
        }
        let port = port.expect("port");
        // The rest of the daemon's log, kept for the end (a pipe nobody reads would block it).
        let log = Arc::new(Mutex::new(Vec::<String>::new()));
        let log_writer = Arc::clone(&log);
        let log_thread = std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if let Ok(mut log) = log_writer.lock() {
                    log.push(line);
                }
            }
        });

        let target = LoadTarget {
            url: format!("http://127.0.0.1:{port}"),
            token: None,
            http: common::client(),
        };
        println!(
            "soak: lcm serve (pid {pid}, {}) for {} s, {clients} clients x {round} appends per \
             round, at most {rate} appends/s, a map job of {map_items} items every interval, \
             model latency {} ms, page cache {cache_mib} MiB, {} cores",
            binary.display(),
            total.as_secs(),
            model_latency.as_millis(),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );

        // RSS sampler.
        let started = Instant::now();
        let samples = Arc::new(Mutex::new(Vec::<(Duration, Resident)>::new()));
        let sampler = {
            let samples = Arc::clone(&samples);
            tokio::spawn(async move {
                while let Some(now) = resident(pid) {
                    if let Ok(mut s) = samples.lock() {
                        s.push((started.elapsed(), now));
                    }
                    tokio::time::sleep(sample).await;
                }
            })
        };

        let intervals = (total.as_secs_f64() / interval.as_secs_f64()).ceil() as usize;
        let mut table: Vec<Interval> = (0..intervals.max(1)).map(|_| Interval::default()).collect();
        let mut jobs: Vec<String> = Vec::new();
        let mut next_map = Duration::ZERO;
        let mut first_turn = 0;
        let mut acked = 0usize;
        println!(
            "{:>5} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "t s",
            "requests",
            "errors",
            "app p50",
            "app p99",
            "app max",
            "ctx p50",
            "ctx p99",
            "RSS MiB",
            "anon MiB"
        );
        let mut reported = 0;
        while started.elapsed() < total {
            if started.elapsed() >= next_map {
                next_map += interval;
                match request(
                    &target,
                    reqwest::Method::POST,
                    "/v1/maps",
                    Some(json!({
                        "input_path": root.join("items.jsonl"),
                        "output_path": root.join(format!("out-{}.jsonl", jobs.len())),
                        "prompt": "Upper-case the word.",
                        "output_schema": map_schema(),
                        "concurrency": 2
                    })),
                )
                .await
                {
                    Ok(job) => jobs.push(job["id"].as_str().unwrap_or_default().to_owned()),
                    Err(e) => {
                        let k = ((started.elapsed().as_secs_f64() / interval.as_secs_f64())
                            as usize)
                            .min(table.len() - 1);
                        table[k].errors.push(e);
                    }
                }
            }
            let shape = LoadShape {
                clients,
                appends: round,
                assemblies: round / 10,
                budget: 2_000,
                first_turn,
            };
            let round_started = Instant::now();
            let report: LoadReport = run_at(&target, shape).await;
            first_turn += round;
            // Keep to the rate: the next round waits for its time.
            if rate > 0 {
                let due = Duration::from_secs_f64((clients * round) as f64 / rate as f64);
                let left = total.saturating_sub(started.elapsed());
                tokio::time::sleep(due.saturating_sub(round_started.elapsed()).min(left)).await;
            }
            acked += report.appends.len();
            let k = ((started.elapsed().as_secs_f64() / interval.as_secs_f64()) as usize)
                .min(table.len() - 1);
            table[k].appends.extend(report.appends);
            table[k].assemblies.extend(report.assemblies);
            table[k].errors.extend(report.errors);
            // Print each interval once the load has moved past it.
            while reported < k {
                print_interval(reported, &table[reported], &samples, interval);
                reported += 1;
            }
        }
        for (i, row) in table.iter().enumerate().skip(reported) {
            print_interval(i, row, &samples, interval);
        }

        // The map jobs run to their end.
        let mut map_errors = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(300);
        for job in &jobs {
            loop {
                match request(&target, reqwest::Method::GET, &format!("/v1/maps/{job}"), None)
                    .await
                {
                    Ok(record) if record["status"] == "completed" => {
                        if record["progress"]["completed"] != map_items {
                            map_errors.push(format!("{job}: {}", record["progress"]));
                        }
                        break;
                    }
                    Ok(record) if record["status"] == "running" || record["status"] == "preparing" => {
                        if Instant::now() > deadline {
                            map_errors.push(format!("{job}: still {}", record["status"]));
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Ok(record) => {
                        map_errors.push(format!("{job}: {}", record["status"]));
                        break;
                    }
                    Err(e) => {
                        map_errors.push(e);
                        break;
                    }
                }
            }
        }

        // Every acknowledged append is stored.
        let mut stored = 0u64;
        let mut count_errors = Vec::new();
        for client in 0..clients {
            match request(
                &target,
                reqwest::Method::GET,
                &format!("/v1/sessions/{}", session_key(client)),
                None,
            )
            .await
            {
                Ok(session) => stored += session["message_count"].as_u64().unwrap_or(0),
                Err(e) => count_errors.push(e),
            }
        }
        let integrity = request(&target, reqwest::Method::POST, "/v1/integrity", Some(json!({})))
            .await
            .unwrap_or_else(|e| json!({"error": e}));
        let store = request(&target, reqwest::Method::GET, "/v1/stats", None)
            .await
            .map(|s| s["store"].clone())
            .unwrap_or(Value::Null);
        // Every model call that is not a map item's is a summary's (compaction through HTTP).
        let summary_calls = upstream
            .request_count()
            .saturating_sub(jobs.len() * map_items as usize);
        sampler.abort();

        // SIGTERM: the daemon stops cleanly.
        let killed = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill");
        assert!(killed.success());
        let stop_deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = daemon.0.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < stop_deadline, "lcm serve did not stop on SIGTERM");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let _ = log_thread.join();
        let doctor = Command::new(&binary)
            .arg("--data-dir")
            .arg(&data)
            .arg("doctor")
            .env_remove("LCM_CONFIG")
            .output()
            .expect("lcm doctor");

        let samples = samples.lock().map(|s| s.clone()).unwrap_or_default();
        let total_errors: usize = table.iter().map(|r| r.errors.len()).sum();
        let all_appends: Vec<Duration> = table.iter().flat_map(|r| r.appends.clone()).collect();
        let all_ctx: Vec<Duration> = table.iter().flat_map(|r| r.assemblies.clone()).collect();
        let p = LoadReport::percentile;
        println!(
            "whole run: {} appends, {} assemblies in {:.0} s ({:.0} requests/s); append p50 {:.2} \
             ms p99 {:.2} ms; assembly p50 {:.2} ms p99 {:.2} ms",
            all_appends.len(),
            all_ctx.len(),
            started.elapsed().as_secs_f64(),
            (all_appends.len() + all_ctx.len()) as f64 / started.elapsed().as_secs_f64(),
            ms(p(&all_appends, 50.0)),
            ms(p(&all_appends, 99.0)),
            ms(p(&all_ctx, 50.0)),
            ms(p(&all_ctx, 99.0)),
        );
        let warm = samples
            .iter()
            .find(|(t, _)| *t >= interval.min(total / 4))
            .or(samples.first());
        let mib = |kib: u64| kib as f64 / 1024.0;
        let at = |s: Option<&(Duration, Resident)>| s.map(|s| s.1).unwrap_or_default();
        println!(
            "RSS (anonymous part in brackets): first {:.1} ({:.1}) MiB, after warm-up ({} s) \
             {:.1} ({:.1}) MiB, last {:.1} ({:.1}) MiB, max {:.1} MiB ({} samples)",
            mib(at(samples.first()).total),
            mib(at(samples.first()).anon),
            warm.map_or(0, |s| s.0.as_secs()),
            mib(at(warm).total),
            mib(at(warm).anon),
            mib(at(samples.last()).total),
            mib(at(samples.last()).anon),
            mib(samples.iter().map(|s| s.1.total).max().unwrap_or(0)),
            samples.len()
        );
        println!(
            "errors {total_errors}; map jobs {} (failed {}); acknowledged appends {acked}, stored \
             {stored}; summariser calls {summary_calls}; store {store}; integrity clean: {}; daemon exit: {status}; lcm doctor \
             exit: {}",
            jobs.len(),
            map_errors.len(),
            integrity["clean"],
            doctor.status
        );
        for error in table
            .iter()
            .flat_map(|r| r.errors.iter())
            .chain(&map_errors)
            .chain(&count_errors)
            .take(10)
        {
            println!("  {error}");
        }
        let doctor_out = String::from_utf8_lossy(&doctor.stdout);
        println!("lcm doctor: {}", doctor_out.lines().take(6).collect::<Vec<_>>().join(" | "));
        if !embeddings.is_empty() {
            let stats = Command::new(&binary)
                .arg("--data-dir")
                .arg(&data)
                .args(["stats", "--json"])
                .env_remove("LCM_CONFIG")
                .output()
                .expect("lcm stats");
            let stats: Value = serde_json::from_slice(&stats.stdout).unwrap_or(Value::Null);
            let training = |line: &&String| line.contains("training the vector index's lists");
            let trainings = log
                .lock()
                .map(|l| l.iter().filter(training).count())
                .unwrap_or(0);
            println!(
                "vectors: {} (lists trained {trainings} times during the run)",
                stats["vectors"]
            );
        }
        if !status.success() {
            let log = log.lock().map(|l| l.join("\n")).unwrap_or_default();
            println!("daemon log:\n{log}");
        }
        assert_eq!(total_errors, 0, "requests failed");
        assert!(map_errors.is_empty(), "map jobs: {map_errors:?}");
        assert!(count_errors.is_empty(), "{count_errors:?}");
        assert_eq!(stored, acked as u64, "acknowledged appends missing");
        assert_eq!(integrity["clean"], true, "{integrity}");
        assert!(status.success(), "the daemon exited with {status}");
        assert!(
            doctor.status.success(),
            "lcm doctor: {doctor_out}{}",
            String::from_utf8_lossy(&doctor.stderr)
        );
    });
}

fn print_interval(
    k: usize,
    row: &Interval,
    samples: &Mutex<Vec<(Duration, Resident)>>,
    interval: Duration,
) {
    let p = LoadReport::percentile;
    let end = interval * (k as u32 + 1);
    // The last RSS sample of the interval.
    let rss = samples
        .lock()
        .ok()
        .and_then(|s| s.iter().rev().find(|(t, _)| *t <= end).map(|s| s.1))
        .unwrap_or_default();
    println!(
        "{:>5} {:>8} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.1} {:>9.1}",
        end.as_secs(),
        row.appends.len() + row.assemblies.len(),
        row.errors.len(),
        ms(p(&row.appends, 50.0)),
        ms(p(&row.appends, 99.0)),
        ms(p(&row.appends, 100.0)),
        ms(p(&row.assemblies, 50.0)),
        ms(p(&row.assemblies, 99.0)),
        rss.total as f64 / 1024.0,
        rss.anon as f64 / 1024.0
    );
}
