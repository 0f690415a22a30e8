//! End to end against a real model: every task family at 8K and 32K in both model arms (and
//! the scripted arm on needles), through the configured provider, writing the three reports.
//!
//! Opt-in: runs only when `LCM_LLM_BASE_URL` points at an OpenAI-compatible server (such as
//! `../shared/tools/local-llm`, SmolLM2-135M on 127.0.0.1) and `../shared/data` is present;
//! otherwise it says why and passes. `LCM_LLM_MODEL` names the model (default
//! `smollm2-135m-instruct`). Sized for that model on 2 cores (4,096 tokens per request, ~100
//! prompt tokens/s): a 2,800-token window (the lcm arm's tool definitions take about 1,300 of
//! it), sessions compacted to 800 tokens, 48 output tokens, two questions per task.
//!
//! It asserts structure, never answer quality: the rows (family × length × arm), a model call
//! and tokens for every model row, a Markdown row each, and an SVG that is well-formed XML with
//! one line per family and arm. `--nocapture` prints the table and the wall times.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lcm_core::config::{Config, ProviderKind};
use lcm_eval::model::ModelSettings;
use lcm_eval::report;
use lcm_eval::runner::{self, Arm, Plan, SummarizerChoice};
use lcm_eval::tasks::Family;
use lcm_llm::from_config::clients_from_config;
use regex::Regex;

use crate::tasks::trec_items;

const LENGTHS: [u64; 2] = [8 << 10, 32 << 10];
/// Questions per task of the model arms.
const QUESTIONS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_and_arm_against_the_local_model() {
    let Ok(base_url) = std::env::var("LCM_LLM_BASE_URL") else {
        eprintln!(
            "SKIPPED: LCM_LLM_BASE_URL is not set; start a model with \
             `export \"$(../shared/tools/local-llm/start.sh)\"` to run this test"
        );
        return;
    };
    let Some(items) = trec_items() else {
        return;
    };
    let mut config = Config::default();
    config.llm.provider = ProviderKind::Openai;
    config.llm.base_url = base_url;
    config.llm.model =
        std::env::var("LCM_LLM_MODEL").unwrap_or_else(|_| "smollm2-135m-instruct".into());
    config.llm.timeout_s = 300;
    config.llm.max_retries = 1;
    let llm = clients_from_config(&config.llm)
        .expect("the configured client")
        .expect("a model client for provider openai");

    let work = tempfile::tempdir().unwrap();
    let model = ModelSettings {
        window: 2_800,
        max_output_tokens: 48,
        questions: Some(QUESTIONS),
        max_turns: 2,
        question_timeout: Duration::from_secs(600),
    };
    let plan = |families: Vec<Family>, arms: Vec<Arm>| Plan {
        families,
        lengths: LENGTHS.to_vec(),
        arms,
        seed: 1,
        tasks: 1,
        budget: 800,
        model,
        summarizer: SummarizerChoice::Offline,
    };
    let started = Instant::now();
    let mut results = runner::run(
        &plan(Family::ALL.to_vec(), vec![Arm::Baseline, Arm::Lcm]),
        &items,
        &config,
        Some(&llm),
        &work.path().join("model"),
        |r| {
            eprintln!(
                "{} {} {}: score {:.3}, {} calls, {} tokens, {:.1} s",
                r.family.as_str(),
                report::length_label(r.length),
                r.arm,
                r.score,
                r.calls,
                r.tokens_spent,
                r.wall_ms as f64 / 1000.0
            )
        },
    )
    .await
    .expect("the model arms run");
    results.extend(
        runner::run(
            &plan(vec![Family::Needles], vec![Arm::Scripted]),
            &items,
            &config,
            Some(&llm),
            &work.path().join("scripted"),
            |_| {},
        )
        .await
        .expect("the scripted arm runs"),
    );
    let out = work.path().join("reports");
    let [json_path, md_path, svg_path] = report::write_all(&out, &results).unwrap();
    eprintln!(
        "{} runs in {:.1} s\n{}",
        results.len(),
        started.elapsed().as_secs_f64(),
        report::markdown(&results)
    );

    // results.json: one row per family, length and arm, as written.
    let read = report::read_json(&[&json_path]).unwrap();
    assert_eq!(read, results);
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(raw.as_array().map(Vec::len), Some(10));
    let rows: BTreeSet<(Family, u64, String)> = read
        .iter()
        .map(|r| (r.family, r.length, r.arm.clone()))
        .collect();
    let mut expected = BTreeSet::new();
    for family in Family::ALL {
        for length in LENGTHS {
            for arm in ["baseline", "lcm"] {
                expected.insert((family, length, arm.to_owned()));
            }
        }
    }
    for length in LENGTHS {
        expected.insert((Family::Needles, length, "scripted".to_owned()));
    }
    assert_eq!(rows, expected);
    for r in &read {
        assert!((0.0..=1.0).contains(&r.score), "{r:?}");
        if r.arm == "scripted" {
            assert_eq!((r.questions, r.score), (6, 1.0), "{r:?}");
        } else {
            assert_eq!(r.questions, QUESTIONS, "{r:?}");
            assert!(r.calls > 0 && r.tokens_spent > 0, "{r:?}");
        }
    }

    // results.md: the header, its rule and a row per family, arm and length.
    let md = std::fs::read_to_string(&md_path).unwrap();
    let table_rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
    assert_eq!(table_rows.len(), 2 + 10, "{md}");
    for r in &read {
        let row = format!(
            "| {} | {} | {} |",
            r.family.as_str(),
            r.arm,
            report::length_label(r.length)
        );
        assert!(md.contains(&row), "{row} missing from\n{md}");
    }

    // results.svg: well-formed XML, one line per family and arm.
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    check_well_formed(&svg);
    let series: BTreeSet<String> = Regex::new(r#"<polyline [^>]*data-series="([^"]+)""#)
        .unwrap()
        .captures_iter(&svg)
        .map(|c| c[1].to_owned())
        .collect();
    let lines = svg.matches("<polyline").count();
    let want: BTreeSet<String> = [
        "aggregation · baseline",
        "aggregation · lcm",
        "needles · baseline",
        "needles · lcm",
        "needles · scripted",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!((lines, series), (want.len(), want));
}

/// Fails unless `xml` is well-formed: one root element, every tag closed in order, attributes
/// quoted, no stray `<` or `&` in text (no XML parser is in the dependency tree).
fn check_well_formed(xml: &str) {
    let tag = Regex::new(r#"^<(/?)([A-Za-z][\w:.-]*)((?:\s+[\w:.-]+="[^"<]*")*)\s*(/?)>"#).unwrap();
    let entity = Regex::new(r"^&(amp|lt|gt|quot|apos|#\d+|#x[0-9a-fA-F]+);").unwrap();
    let mut open: Vec<String> = Vec::new();
    let mut roots = 0;
    let mut rest = xml.trim();
    while !rest.is_empty() {
        if rest.starts_with("<!--") {
            let end = rest.find("-->").expect("an unclosed comment");
            rest = &rest[end + 3..];
        } else if rest.starts_with('<') {
            let c = tag
                .captures(rest)
                .unwrap_or_else(|| panic!("a malformed tag at {:?}", &rest[..rest.len().min(80)]));
            let name = c[2].to_owned();
            if &c[1] == "/" {
                assert_eq!(
                    open.pop().as_deref(),
                    Some(name.as_str()),
                    "a misnested </{name}>"
                );
            } else {
                if open.is_empty() {
                    roots += 1;
                }
                if &c[4] != "/" {
                    open.push(name);
                }
            }
            rest = &rest[c[0].len()..];
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            assert!(
                !open.is_empty() || text.trim().is_empty(),
                "text outside the root"
            );
            for (i, _) in text.match_indices('&') {
                assert!(entity.is_match(&text[i..]), "a bare & in {text:?}");
            }
            rest = &rest[end..];
        }
    }
    assert!(open.is_empty(), "unclosed elements: {open:?}");
    assert_eq!(roots, 1, "one root element");
}

#[test]
fn the_well_formedness_check_fails_on_broken_xml() {
    check_well_formed(r#"<svg a="1"><g><text>a &amp; b</text><line x="2"/></g></svg>"#);
    for broken in [
        "<svg><g></svg></g>",
        "<svg><text>a & b</text></svg>",
        "<svg a=1></svg>",
        "<svg></svg><svg></svg>",
        "<svg>",
    ] {
        assert!(
            std::panic::catch_unwind(|| check_well_formed(broken)).is_err(),
            "{broken}"
        );
    }
}
