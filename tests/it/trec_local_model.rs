//! A real end-to-end llm_map run on the TREC question set (OOLONG's trec_coarse source):
//! classify questions into the six coarse labels with an enum schema against a real model.
//!
//! Opt-in: runs only when `LCM_LLM_BASE_URL` points at an OpenAI-compatible server (for
//! instance `../shared/tools/local-llm/`, SmolLM2-135M on 127.0.0.1) and `../shared/data` is
//! present; otherwise it says why and passes. `LCM_LLM_MODEL` names the model (default
//! `smollm2-135m`), `LCM_TREC_LIMIT` the number of test questions (default 100, at most 500).
//!
//! What it proves is the machinery with a real model: every output is schema-valid (an
//! invalid answer is retried with the validation error, then recorded as a failed item), the
//! per-label counts are aggregated by a plain program from the output file, and the accuracy
//! against the gold labels is reported. A 135M-parameter model scores low; that is expected.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm::core::config::Config;
use lcm::engine::operators::MapRequest;
use lcm::engine::runtime::{Runtime, RuntimeOptions};
use lcm::llm::from_config::LlmClients;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use serde_json::{Value, json};

const LABELS: [&str; 6] = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trec_coarse_classification_with_a_real_model() {
    let Ok(base_url) = std::env::var("LCM_LLM_BASE_URL") else {
        eprintln!("SKIPPED: set LCM_LLM_BASE_URL to an OpenAI-compatible server to run this test");
        return;
    };
    let Some(data) = common::shared_data() else {
        return;
    };
    let model = std::env::var("LCM_LLM_MODEL").unwrap_or_else(|_| "smollm2-135m".into());
    let limit: usize = std::env::var("LCM_TREC_LIMIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
        .min(500);

    // TREC is ISO-8859-1: every byte is the code point of the same value.
    let raw = std::fs::read(data.join("trec/TREC.test")).expect("TREC.test");
    let text: String = raw.iter().map(|&b| b as char).collect();
    let mut gold = Vec::new();
    let mut lines = Vec::new();
    for (i, line) in text.lines().take(limit).enumerate() {
        let (label, question) = line.split_once(' ').expect("`COARSE:fine question`");
        let coarse = label.split(':').next().unwrap_or_default().to_string();
        gold.push(coarse);
        lines.push(json!({"id": i, "question": question}).to_string());
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("trec.jsonl");
    std::fs::write(&input, lines.join("\n")).unwrap();

    let mut config = Config::default();
    config.map.allowed_roots = vec![dir.path().to_path_buf()];
    config.map.concurrency = 4;
    let provider = OpenAiProvider::new(
        HttpConfig::new(base_url, model).with_timeout(Duration::from_secs(120)),
    )
    .expect("provider");
    let rt = Runtime::open(
        RuntimeOptions::in_memory(config).with_llm(LlmClients::new(Arc::new(provider))),
    )
    .await
    .expect("runtime");
    let schema = json!({
        "type": "object",
        "properties": {"label": {"type": "string", "enum": LABELS}},
        "required": ["label"],
        "additionalProperties": false
    });
    let prompt = "Classify the question by the kind of answer it expects. Labels: ABBR (abbreviation), DESC (description or definition), ENTY (entity: thing, animal, food, ...), HUM (human or group), LOC (location), NUM (number, date, amount). Answer as {\"label\": \"<LABEL>\"}.";
    let started = Instant::now();
    let job = rt
        .llm_map(MapRequest::llm(&input, prompt, schema.clone()))
        .await
        .expect("job");
    let summary = rt.map_wait(job.id).await.expect("summary");
    eprintln!("{summary} in {:.1} s", started.elapsed().as_secs_f64());

    // Aggregate with a plain program over the output file.
    let validator = jsonschema::validator_for(&schema).unwrap();
    let output = std::fs::read_to_string(&summary.output_path).expect("output");
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    let (mut correct, mut answered) = (0u64, 0u64);
    for line in output.lines() {
        let row: Value = serde_json::from_str(line).unwrap();
        if row["ok"] != true {
            continue;
        }
        let result = &row["result"];
        assert!(validator.is_valid(result), "not schema-valid: {row}");
        let label = result["label"].as_str().unwrap().to_string();
        let index = row["index"].as_u64().unwrap() as usize;
        answered += 1;
        if gold[index] == label {
            correct += 1;
        }
        *counts.entry(label).or_default() += 1;
    }
    assert_eq!(
        output.lines().count(),
        limit,
        "one output line per question"
    );
    assert_eq!(answered, summary.completed);
    let mut gold_counts: BTreeMap<&str, u64> = BTreeMap::new();
    for label in &gold {
        *gold_counts.entry(label.as_str()).or_default() += 1;
    }
    eprintln!("per-label counts: {counts:?}");
    eprintln!("gold label counts: {gold_counts:?}");
    eprintln!(
        "accuracy: {correct}/{limit} = {:.1}% ({} failed after retries)",
        100.0 * correct as f64 / limit as f64,
        summary.failed
    );
    rt.shutdown(Duration::from_secs(10)).await.unwrap();
}
