//! The long crash campaign (docs/RELIABILITY.md, "Crash campaign"): N trials of SIGKILL and of
//! simulated power loss at random moments during mixed workloads (appends through the runtime,
//! imports, compactions with the extractive and a scripted HTTP summariser, map jobs, sub-agent
//! delegations, all at once), each followed by a reopen, the integrity check and the workload's
//! own invariant. Prints a table per workload and kind and writes a JSON summary.
//!
//! ```sh
//! cargo run --profile bench --example crash_campaign -- --trials 200 --seed 20261127
//! cargo run --profile bench --example crash_campaign -- --workload map --trials 30
//! ```
//!
//! Options: `--trials N` (default 200), `--seed N`, `--workload NAME` (repeatable; default
//! all: appends, imports, compact_extractive, compact_http, map, delegation, mixed), `--out
//! FILE` (the JSON summary; default `$TMPDIR/lcm-crash-campaign.json`). The imports read the
//! real Claude Code sessions of `../shared/data/transcripts/claude-code` (or
//! `LCM_CRASH_TRANSCRIPTS`) at run time, and generated files without them.
//!
//! The SIGKILL trials' children are this binary run again (the environment tells it what to
//! play). Exits with status 1 when any trial broke a promise.

#[allow(dead_code)]
#[path = "../tests/it/crash_campaign/campaign.rs"]
mod campaign;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use campaign::Workload;

struct Args {
    trials: usize,
    seed: u64,
    workloads: Vec<Workload>,
    out: PathBuf,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        trials: 200,
        seed: 20_261_127,
        workloads: Vec::new(),
        out: std::env::temp_dir().join("lcm-crash-campaign.json"),
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let mut value = || {
            given
                .next()
                .with_context(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--trials" => args.trials = value()?.parse().context("--trials")?,
            "--seed" => args.seed = value()?.parse().context("--seed")?,
            "--workload" => {
                let name = value()?;
                args.workloads.push(
                    Workload::parse(&name).with_context(|| format!("no workload named {name}"))?,
                );
            }
            "--out" => args.out = PathBuf::from(value()?),
            other => bail!("unknown option {other} (see the top of examples/crash_campaign.rs)"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    if campaign::run_child_if_asked() {
        return Ok(());
    }
    let args = parse_args()?;
    let real = campaign::real_transcripts();
    match &real {
        Some(dir) => eprintln!("imports: slices of the sessions in {}", dir.display()),
        None => eprintln!("imports: the real transcripts are absent; generated files instead"),
    }
    let exe = std::env::current_exe().context("this binary's path")?;
    let child = move || Command::new(&exe);
    let mut plan = campaign::plan(args.trials, args.seed);
    if !args.workloads.is_empty() {
        for (i, trial) in plan.iter_mut().enumerate() {
            trial.workload = args.workloads[i % args.workloads.len()];
        }
    }
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio")?;
    let started = Instant::now();
    let total = plan.len();
    let outcomes = tokio.block_on(async {
        let server = campaign::start_server().await;
        let mut outcomes = Vec::new();
        for (i, trial) in plan.into_iter().enumerate() {
            let outcome = campaign::run_trial(trial, &server, real.as_deref(), &child).await;
            let acked: u64 = outcome.acked.values().sum();
            eprintln!(
                "[{}/{total}] {:<18} {:<21} crash at {:>5} ms, {:>5} acks checked, {:>5.1} s{}",
                i + 1,
                trial.workload.name(),
                trial.kind.name(),
                outcome.crashed_after.as_millis(),
                acked,
                outcome.elapsed.as_secs_f64(),
                if outcome.violations.is_empty() {
                    String::new()
                } else {
                    format!("  FAILED: {:?}", outcome.violations)
                }
            );
            outcomes.push(outcome);
        }
        outcomes
    });
    let elapsed = started.elapsed();
    println!("{}", campaign::table(&outcomes));
    let summary = campaign::summary_json(&outcomes, args.seed, elapsed);
    println!(
        "{} trials, {} failed, in {:.0} s; summary in {}",
        outcomes.len(),
        summary["failed_trials"],
        elapsed.as_secs_f64(),
        args.out.display()
    );
    std::fs::write(&args.out, serde_json::to_string_pretty(&summary)? + "\n")
        .with_context(|| format!("writing {}", args.out.display()))?;
    if outcomes.iter().any(|o| !o.violations.is_empty()) {
        std::process::exit(1);
    }
    Ok(())
}
