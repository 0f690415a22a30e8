//! The `lcm` binary end to end: the demo (the README's main job), import, grep, show
//! (including the original byte for byte), sessions, stats, reindex, and its errors.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn lcm(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env_remove("LCM_CONFIG")
        .output()
        .expect("run lcm")
}

fn json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "lcm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is JSON")
}

fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/transcripts/demo-session.jsonl")
}

#[test]
fn demo_imports_twice_and_finds_the_ticket() {
    let tmp = tempfile::tempdir().unwrap();
    let keep = tmp.path().join("demo");
    let out = json(&lcm(
        tmp.path(),
        &["demo", "--json", "--keep-in", keep.to_str().unwrap()],
    ));
    let first = out["first_import"]["imported"].as_u64().unwrap();
    assert!(first >= 15, "{out}");
    assert_eq!(out["second_import"]["imported"], 0);
    assert_eq!(
        out["second_import"]["already_present"].as_u64(),
        Some(first)
    );
    let hits = out["regex"]["page"]["hits"].as_array().unwrap();
    assert!(!hits.is_empty());
    assert!(
        hits.iter()
            .all(|h| h["snippet"].as_str().unwrap().contains("INV-4821"))
    );
    assert_eq!(out["regex"]["page"]["strategy"], "trigram_index");
    assert!(
        !out["full_text"]["page"]["hits"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // The demo compacts the example for a tiny window and nothing is lost.
    let compaction = &out["compaction"];
    assert!(compaction["tokens_after"].as_u64() < compaction["tokens_before"].as_u64());
    assert!(!compaction["passes"].as_array().unwrap().is_empty());
    assert_eq!(out["context"]["reachable_messages"].as_u64(), Some(first));
}

#[test]
fn compact_dag_describe_and_context() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    json(&lcm(
        dir,
        &["import", "--json", example().to_str().unwrap()],
    ));
    // Under the soft threshold nothing happens.
    let idle = json(&lcm(
        dir,
        &["compact", "--json", "ses_0", "--budget", "100000"],
    ));
    assert_eq!(idle["passes"].as_array().unwrap().len(), 0);
    assert_eq!(idle["provider_calls"], 0);
    // Over it, summaries are written and the context shrinks under the hard threshold.
    let report = json(&lcm(
        dir,
        &["compact", "--json", "ses_0", "--budget", "700"],
    ));
    assert!(!report["passes"].as_array().unwrap().is_empty());
    assert!(report["tokens_after"].as_u64().unwrap() <= 630, "{report}");
    let dag = json(&lcm(dir, &["dag", "--json", "ses_0"]));
    let top = dag["context"]["summaries"][0].as_str().unwrap().to_owned();
    let described = json(&lcm(dir, &["describe", "--json", &top]));
    assert_eq!(described["summary"]["id"], top.as_str());
    assert!(described["compression_ratio"].as_f64().unwrap() > 1.0);
    let first_source = described["summary"]["sources"][0]
        .as_str()
        .unwrap()
        .to_owned();
    let message = json(&lcm(dir, &["describe", "--json", &first_source]));
    assert_eq!(message["covered_by"], top.as_str());
    let header = format!("<lcm_summary id=\"{top}\"");
    for format in ["openai", "anthropic"] {
        let ctx = json(&lcm(
            dir,
            &["context", "ses_0", "--budget", "700", "--format", format],
        ));
        assert!(ctx["tokens"].as_u64().unwrap() <= 630);
        let body = ctx["body"].to_string();
        assert!(body.contains(&header.replace('"', "\\\"")), "{body}");
    }
}

#[test]
fn import_grep_show_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let report = json(&lcm(
        dir,
        &["import", "--json", example().to_str().unwrap()],
    ));
    let imported = report["imports"][0]["imported"].as_u64().unwrap();
    assert_eq!(report["indexed"].as_u64(), Some(imported));

    // A regex with a literal, scoped by role, paginated.
    let page = json(&lcm(
        dir,
        &[
            "grep",
            "--json",
            "--role",
            "tool",
            "--limit",
            "1",
            r"passed in \d\.\d+s",
        ],
    ));
    let hits = page["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0]["role"], "tool");
    let cursor = page["next_cursor"].as_str().unwrap();
    let page2 = json(&lcm(
        dir,
        &[
            "grep",
            "--json",
            "--role",
            "tool",
            "--limit",
            "1",
            "--cursor",
            cursor,
            r"passed in \d\.\d+s",
        ],
    ));
    assert_ne!(page2["hits"][0]["message"], hits[0]["message"]);

    // show --original gives the line back byte for byte.
    let id = hits[0]["message"].as_str().unwrap();
    let out = lcm(dir, &["show", "--original", id]);
    assert!(out.status.success());
    let original = &out.stdout[..out.stdout.len() - 1];
    let file = std::fs::read(example()).unwrap();
    assert!(
        file.split(|b| *b == b'\n').any(|line| line == original),
        "the original is not a line of the file"
    );

    let sessions = json(&lcm(dir, &["sessions", "--json"]));
    assert_eq!(sessions.as_array().unwrap().len(), 1);
    assert_eq!(sessions[0]["message_count"].as_u64(), Some(imported));
    let stats = json(&lcm(dir, &["stats", "--json"]));
    assert_eq!(stats["store"]["messages"].as_u64(), Some(imported));
    assert_eq!(stats["index_documents"].as_u64(), Some(imported));

    // Reindex rebuilds the same index.
    let re = json(&lcm(dir, &["reindex", "--json"]));
    assert_eq!(re["indexed"].as_u64(), Some(imported));
    let again = json(&lcm(dir, &["grep", "--json", "INV-4821"]));
    assert!(!again["hits"].as_array().unwrap().is_empty());
}

#[test]
fn errors_are_human_readable_with_a_non_zero_exit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cases: &[(&[&str], &str)] = &[
        (&["grep", "(unclosed"], "invalid regex"),
        (&["show", "msg_12345"], "no message msg_12345"),
        (&["show", "hello"], "not an lcm id"),
        (&["import", "/definitely/not/here.jsonl"], "cannot read"),
        (&["grep", "--session", "nobody", "x"], "no session `nobody`"),
        (&["grep", "--since", "yesterday", "x"], "RFC 3339"),
    ];
    for (args, expected) in cases {
        let out = lcm(dir, args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}
