//! The long fuzz campaign (docs/RELIABILITY.md, "Fuzzing"): every parser of lcm that takes
//! outside bytes, under the mutation fuzzer of `tests/it/fuzz/harness.rs`, for a total number
//! of executions shared among the targets by weight. Prints per target the executions, the
//! distinct outcomes, the time, the panics and the hangs, and writes a JSON summary.
//!
//! ```sh
//! cargo run --profile bench --example fuzz -- --executions 10000000
//! cargo run --profile bench --example fuzz -- --target ids --target cursors --executions 1000000
//! ```
//!
//! Options: `--executions N` (total, default 1,000,000), `--target NAME` (repeatable; default
//! all), `--jobs N` (targets run at once, default the number of cores), `--seed N`,
//! `--time-limit-ms N` (one execution; longer is a hang, default 5000), `--out DIR` (failing
//! inputs and `summary.json`; default `$TMPDIR/lcm-fuzz`), `--list`.
//!
//! Exits with status 1 when any target panicked, hung or broke a property.

// The short runs (tests/it/fuzz) read fields the long run does not.
#[allow(dead_code)]
#[path = "../tests/it/fuzz/harness.rs"]
mod harness;
#[path = "../tests/it/fuzz/targets.rs"]
mod targets;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use harness::{Report, RunOptions, Target};

struct Args {
    executions: u64,
    targets: Vec<String>,
    jobs: usize,
    seed: u64,
    time_limit: Duration,
    out: PathBuf,
    list: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        executions: 1_000_000,
        targets: Vec::new(),
        jobs: std::thread::available_parallelism().map_or(1, usize::from),
        seed: 0x5eed,
        time_limit: Duration::from_millis(5_000),
        out: std::env::temp_dir().join("lcm-fuzz"),
        list: false,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || {
            given
                .next()
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--executions" => args.executions = value()?.replace('_', "").parse()?,
            "--target" => args.targets.push(value()?),
            "--jobs" => args.jobs = value()?.parse::<usize>()?.max(1),
            "--seed" => args.seed = value()?.parse()?,
            "--time-limit-ms" => args.time_limit = Duration::from_millis(value()?.parse()?),
            "--out" => args.out = PathBuf::from(value()?),
            "--list" => args.list = true,
            other => {
                bail!("unknown option {other} (see the comment at the top of examples/fuzz.rs)")
            }
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let mut all = targets::all();
    if args.list {
        for t in &all {
            println!(
                "{:<24} weight {:>2}, {} seeds: {}",
                t.name,
                t.weight,
                t.seeds.len(),
                t.about
            );
        }
        return Ok(());
    }
    if !args.targets.is_empty() {
        for name in &args.targets {
            if !all.iter().any(|t| t.name == name) {
                bail!("no target named {name} (--list lists them)");
            }
        }
        all.retain(|t| args.targets.iter().any(|n| n == t.name));
    }
    let total_weight: u64 = all.iter().map(|t| t.weight).sum::<u64>().max(1);
    let queue: VecDeque<(Arc<Target>, RunOptions)> = all
        .into_iter()
        .map(|t| {
            let options = RunOptions {
                executions: (args.executions * t.weight / total_weight).max(t.seeds.len() as u64),
                seed: args.seed,
                time_limit: args.time_limit,
                failure_dir: args.out.join("failures"),
                max_corpus: 4_000,
                max_failures: 5,
            };
            (Arc::new(t), options)
        })
        .collect();
    println!(
        "fuzzing {} targets, {} executions in total, {} at once, seed {}",
        queue.len(),
        args.executions,
        args.jobs,
        args.seed
    );
    let started = Instant::now();
    let queue = Arc::new(Mutex::new(queue));
    let reports = Arc::new(Mutex::new(Vec::<Report>::new()));
    let workers: Vec<_> = (0..args.jobs)
        .map(|_| {
            let (queue, reports) = (Arc::clone(&queue), Arc::clone(&reports));
            std::thread::spawn(move || {
                loop {
                    let Some((target, options)) = queue.lock().ok().and_then(|mut q| q.pop_front())
                    else {
                        return;
                    };
                    let report = harness::run(target, &options);
                    println!(
                        "{:<24} {:>10} executions {:>8.1}s {:>9.0}/s {:>5} outcomes  panics {} hangs {} violations {}",
                        report.name,
                        report.executions,
                        report.elapsed.as_secs_f64(),
                        report.executions as f64 / report.elapsed.as_secs_f64().max(1e-9),
                        report.distinct_outcomes,
                        report.panics,
                        report.hangs,
                        report.violations
                    );
                    if let Ok(mut reports) = reports.lock() {
                        reports.push(report);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
    let mut reports = reports.lock().map(|r| r.clone()).unwrap_or_default();
    reports.sort_by(|a, b| a.name.cmp(&b.name));
    let executions: u64 = reports.iter().map(|r| r.executions).sum();
    let clean = reports.iter().all(Report::clean);
    let panics: u64 = reports.iter().map(|r| r.panics).sum();
    let hangs: u64 = reports.iter().map(|r| r.hangs).sum();
    let violations: u64 = reports.iter().map(|r| r.violations).sum();
    let elapsed = started.elapsed();
    let summary = serde_json::json!({
        "executions": executions,
        "seconds": elapsed.as_secs_f64(),
        "jobs": args.jobs,
        "seed": args.seed,
        "time_limit_ms": args.time_limit.as_millis() as u64,
        "panics": panics,
        "hangs": hangs,
        "violations": violations,
        "targets": reports.iter().map(Report::to_json).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary)?)?;
    println!(
        "total: {executions} executions in {:.1}s; panics {panics}, hangs {hangs}, violations {violations}; summary in {}",
        elapsed.as_secs_f64(),
        path.display()
    );
    if !clean {
        std::process::exit(1);
    }
    Ok(())
}
