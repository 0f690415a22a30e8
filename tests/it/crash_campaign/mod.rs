//! The short crash campaign of the normal suite (docs/RELIABILITY.md, "Crash campaign"): 20
//! trials of SIGKILL and simulated power loss over every workload, each followed by a reopen,
//! the integrity check and the workload's invariant. The long campaign is
//! `examples/crash_campaign.rs`, run by its own command; both run the trials of
//! `campaign.rs`. `LCM_CRASH_TRIALS=N` and `LCM_CRASH_SEED=S` change the short run.
//!
//! The SIGKILL trials' children are this test binary run again with this test's name: the
//! environment tells the test to play the child's part.

// The long run (examples/crash_campaign.rs) uses what the short one does not.
#[allow(dead_code)]
pub mod campaign;

use std::process::Command;
use std::time::Instant;

use crate::common;

const TEST_NAME: &str = "short_crash_campaign_loses_nothing_acknowledged";

#[test]
fn short_crash_campaign_loses_nothing_acknowledged() {
    if campaign::run_child_if_asked() {
        return;
    }
    let trials = std::env::var("LCM_CRASH_TRIALS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let seed = std::env::var("LCM_CRASH_SEED")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_261_127);
    let real = campaign::real_transcripts();
    if real.is_none() {
        eprintln!("the real transcripts are absent: the imports use generated files");
    }
    let exe = std::env::current_exe().unwrap();
    let test = common::test_name(module_path!(), TEST_NAME);
    let child = move || {
        let mut command = Command::new(&exe);
        command.args(["--exact", &test, "--nocapture", "--test-threads=1"]);
        command
    };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let outcomes = tokio.block_on(async {
        let server = campaign::start_server().await;
        let mut outcomes = Vec::new();
        for trial in campaign::plan(trials, seed) {
            outcomes.push(campaign::run_trial(trial, &server, real.as_deref(), &child).await);
        }
        outcomes
    });
    eprintln!(
        "{}{} trials in {:.1} s",
        campaign::table(&outcomes),
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|o| !o.violations.is_empty())
        .collect();
    assert!(failed.is_empty(), "failed trials: {failed:#?}");
    // Each kind crashed something real: acknowledgements were checked in every kind.
    for kind in [
        campaign::Kind::Sigkill,
        campaign::Kind::PowerLossSynced,
        campaign::Kind::PowerLossReordered,
    ] {
        let checked: u64 = outcomes
            .iter()
            .filter(|o| o.trial.kind == kind)
            .map(|o| o.acked.values().sum::<u64>())
            .sum();
        assert!(
            checked > 0,
            "{kind:?}: nothing acknowledged before the crashes"
        );
    }
    // The compaction workloads' pins and forgets were made, and checked after their crashes.
    let marks: u64 = outcomes.iter().filter_map(|o| o.acked.get("marks")).sum();
    assert!(marks > 0, "no mark was acknowledged before the crashes");
}
