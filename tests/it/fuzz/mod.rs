//! Short fuzz runs of every parser that takes outside bytes (docs/RELIABILITY.md, "Fuzzing"):
//! each target's seeds and a few thousand mutations of them, in the normal suite. The long
//! campaign is `examples/fuzz.rs`, run by its own command.
//!
//! A failing run names the target, the kind of failure and the input (also written under the
//! test target's temporary directory). `LCM_FUZZ_EXECUTIONS=N` runs N executions per target.

// The long run (examples/fuzz.rs) reads fields the short runs do not.
#[allow(dead_code)]
pub mod harness;
pub mod targets;

use std::sync::Arc;
use std::time::Duration;

use harness::{Outcome, Report, RunOptions, Target};

fn options(executions: u64) -> RunOptions {
    RunOptions {
        executions,
        seed: 0x5eed,
        // Debug builds: generous, a hang is an execution that never ends.
        time_limit: Duration::from_secs(20),
        failure_dir: std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures"),
        max_corpus: 2_000,
        max_failures: 5,
    }
}

fn short_run(name: &str) -> Report {
    let target = targets::all()
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no fuzz target named {name}"));
    let executions = std::env::var("LCM_FUZZ_EXECUTIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(target.short);
    let report = harness::run(Arc::new(target), &options(executions));
    eprintln!(
        "fuzz {name}: {} executions in {:.1}s, {} outcomes, corpus {}: {:?}",
        report.executions,
        report.elapsed.as_secs_f64(),
        report.distinct_outcomes,
        report.corpus,
        report.top_outcomes
    );
    assert!(
        report.clean(),
        "fuzz target {name}: {} panics, {} hangs, {} violations: {:#?}",
        report.panics,
        report.hangs,
        report.violations,
        report.failures
    );
    assert_eq!(
        report.executions, executions,
        "fuzz target {name} stopped early"
    );
    // Mutations reach both sides of the parser: inputs it accepts and inputs it refuses.
    assert!(
        report.distinct_outcomes >= 2,
        "fuzz target {name} saw only {:?}",
        report.top_outcomes
    );
    report
}

macro_rules! short_runs {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                short_run(stringify!($name));
            }
        )*

        #[test]
        fn every_target_has_a_short_run() {
            let listed = [$(stringify!($name)),*];
            let names: Vec<&str> = targets::all().iter().map(|t| t.name).collect();
            assert_eq!(names, listed, "add the new fuzz target to short_runs!");
        }
    };
}

short_runs!(
    claude_code_line,
    openai_line,
    openai_document,
    lcm_line,
    import_file,
    api_messages,
    proxy_openai_request,
    proxy_anthropic_request,
    sse_openai,
    sse_anthropic,
    upstream_json,
    tool_args,
    mcp_tools,
    config_toml,
    cursors,
    ids,
);

fn toy(name: &'static str, seeds: &[&str], f: fn(&[u8]) -> Outcome) -> Arc<Target> {
    Arc::new(Target {
        name,
        about: "a test of the harness",
        seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        make: Box::new(move || Box::new(f)),
        weight: 1,
        short: 100,
        max_len: 64,
    })
}

#[test]
fn the_harness_catches_panics_hangs_and_violations() {
    let panics = harness::run(
        toy("toy_panic", &["fine", "boom"], |b| {
            assert!(b != b"boom", "the toy parser broke");
            Outcome::ok("fine")
        }),
        &options(50),
    );
    // The seed panics; mutations that leave it as it was panic again.
    assert!(panics.panics >= 1, "{panics:?}");
    let saved = panics.failures[0]
        .file
        .as_ref()
        .expect("the input is saved");
    assert_eq!(std::fs::read(saved).expect("saved input"), b"boom");
    assert!(panics.failures[0].message.contains("the toy parser broke"));

    let mut quick = options(50);
    quick.time_limit = Duration::from_millis(300);
    let hangs = harness::run(
        toy("toy_hang", &["fine", "slow"], |b| {
            if b == b"slow" {
                std::thread::sleep(Duration::from_secs(3));
            }
            Outcome::ok("fine")
        }),
        &quick,
    );
    assert_eq!(hangs.hangs, 1, "{hangs:?}");
    assert_eq!(hangs.failures[0].kind, "hang");

    let violations = harness::run(
        toy("toy_violation", &["fine", "odd"], |b| {
            if b == b"odd" {
                Outcome::Violation("odd is not fine".into())
            } else {
                Outcome::ok("fine")
            }
        }),
        &options(2),
    );
    assert_eq!((violations.violations, violations.executions), (1, 2));
}

#[test]
fn mutations_stay_within_the_limit_and_labels_fold_inputs() {
    let mut rng = harness::Rng::new(1);
    let seeds = vec![br#"{"role":"user","content":"hi","n":[1,2,{"a":null}]}"#.to_vec()];
    let dict = harness::dictionary(&seeds);
    assert!(dict.contains(&br#""role""#.to_vec()), "{dict:?}");
    let mut changed = 0;
    for _ in 0..2_000 {
        let mut input = seeds[0].clone();
        harness::mutate(&mut rng, &mut input, &seeds[0], &dict, 40);
        assert!(input.len() <= 40);
        changed += usize::from(input != seeds[0][..40.min(seeds[0].len())]);
    }
    assert!(
        changed > 1_500,
        "only {changed} of 2000 mutations changed the input"
    );
    assert_eq!(
        harness::label("line 12: `foo` is not \"bar\" at 3"),
        "line #: `…` is not \"…\" at #"
    );
}
