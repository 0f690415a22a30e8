//! Load benchmark of the daemon over real HTTP on loopback: 100 concurrent clients, each with a
//! session of its own, 1,000 appends (one message per request, with a source key) and 100
//! context assemblies each, with compactions running (extractive summariser). Prints the
//! throughput and the p50/p99 latency of appends and of assemblies, then checks that nothing
//! failed, every message is stored, and the store passes the integrity check.
//!
//! `cargo bench -p lcm-server --bench load`; `LCM_LOAD_CLIENTS`, `LCM_LOAD_APPENDS`,
//! `LCM_LOAD_ASSEMBLIES` and `LCM_LOAD_BUDGET` change the shape. Figures: docs/PERFORMANCE.md.

// The integration tests' helpers, of which the benchmark uses a part.
#[path = "../tests/it/common/mod.rs"]
#[allow(dead_code)]
mod common;

use std::time::Duration;

use common::load::{LoadReport, LoadShape, run};
use common::{Setup, start};
use serde_json::json;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    // `cargo bench` passes `--bench`; a filter that is not ours means another bench was asked.
    if std::env::args()
        .skip(1)
        .any(|a| !a.starts_with("--") && a != "load")
    {
        return;
    }
    let shape = LoadShape {
        clients: env("LCM_LOAD_CLIENTS", 100),
        appends: env("LCM_LOAD_APPENDS", 1_000),
        assemblies: env("LCM_LOAD_ASSEMBLIES", 100),
        budget: env("LCM_LOAD_BUDGET", 8_000) as u64,
        first_turn: 0,
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    tokio.block_on(async {
        let (setup, tmp, root) = Setup::new();
        let mut server = start(setup, tmp, root).await;
        println!(
            "load: {} clients x {} appends + {} assemblies (budget {}), {} cores",
            shape.clients,
            shape.appends,
            shape.assemblies,
            shape.budget,
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        let report = run(&server, shape).await;
        let p = LoadReport::percentile;
        println!(
            "{} requests in {:.1} s: {:.0} requests/s ({:.0} appends/s)",
            report.appends.len() + report.assemblies.len(),
            report.elapsed.as_secs_f64(),
            report.requests_per_s(),
            report.appends.len() as f64 / report.elapsed.as_secs_f64()
        );
        println!(
            "append   p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
            ms(p(&report.appends, 50.0)),
            ms(p(&report.appends, 99.0)),
            ms(p(&report.appends, 100.0))
        );
        println!(
            "assemble p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (largest context {} tokens)",
            ms(p(&report.assemblies, 50.0)),
            ms(p(&report.assemblies, 99.0)),
            ms(p(&report.assemblies, 100.0)),
            report.max_context_tokens
        );
        let stats = server.runtime.store().stats().expect("stats");
        let summaries = server.runtime.store().summary_count().expect("summaries");
        let integrity = server.post("/v1/integrity", &json!({})).await;
        println!(
            "errors {}; stored {} messages in {} sessions, {} summaries; integrity clean: {}",
            report.errors.len(),
            stats.messages,
            stats.sessions,
            summaries,
            integrity.body["clean"]
        );
        for error in report.errors.iter().take(10) {
            println!("  {error}");
        }
        assert!(report.errors.is_empty(), "requests failed");
        assert_eq!(stats.messages, (shape.clients * shape.appends) as u64);
        assert_eq!(integrity.body["clean"], true, "{integrity:?}");
        server.stop().await.expect("clean stop");
    });
}
