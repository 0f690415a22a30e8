//! The `lcm` binary end to end: the demo (the README's main job), import, grep, show
//! (including the original byte for byte), sessions, stats, reindex, and its errors.

use crate::common::{self, json, lcm};

use std::path::Path;
use std::process::Command;

use serde_json::Value;

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
        // The top summary leads the breakdown's summaries; the tallies add up to the total.
        let breakdown = &ctx["breakdown"];
        assert!(
            breakdown["summaries"]["items"].as_u64().unwrap() >= 1,
            "{breakdown}"
        );
        let tallied: u64 = ["summaries", "pinned", "commitments", "messages", "elided"]
            .iter()
            .map(|k| breakdown[k]["tokens"].as_u64().unwrap())
            .sum();
        assert_eq!(Some(tallied), ctx["tokens"].as_u64(), "{breakdown}");
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

    // Vacuum reports the file's sizes; everything reads the same after.
    let vacuum = json(&lcm(dir, &["vacuum", "--json"]));
    let before = vacuum["bytes_before"].as_u64().unwrap();
    let after = vacuum["bytes_after"].as_u64().unwrap();
    assert!(after <= before && after > 0, "{vacuum}");
    assert_eq!(
        std::fs::metadata(dir.join("lcm.redb")).unwrap().len(),
        after
    );
    let after_vacuum = json(&lcm(dir, &["grep", "--json", "INV-4821"]));
    assert_eq!(after_vacuum["hits"], again["hits"]);
    let stats = json(&lcm(dir, &["stats", "--json"]));
    assert_eq!(stats["store"]["messages"].as_u64(), Some(imported));
}

#[test]
fn grep_ignores_case_and_takes_fixed_strings_in_regex_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    assert!(
        lcm(dir, &["import", example().to_str().unwrap()])
            .status
            .success()
    );
    let hits = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["grep", "--json"];
        all.extend_from_slice(args);
        json(&lcm(dir, &all))["hits"].as_array().unwrap().clone()
    };
    let ids = |hits: &[Value]| -> Vec<String> {
        hits.iter()
            .map(|h| h["message"].as_str().unwrap().to_string())
            .collect()
    };

    // Case: the ticket as written, and in lower case with and without --ignore-case.
    let exact = hits(&["INV-4821"]);
    assert!(!exact.is_empty());
    assert!(hits(&["inv-4821"]).is_empty());
    assert_eq!(ids(&hits(&["-i", "inv-4821"])), ids(&exact));
    assert_eq!(ids(&hits(&["--ignore-case", "inv-4821"])), ids(&exact));

    // A literal with regex syntax in it: refused as a regex, found as a fixed string, and the
    // hit's text holds it as written.
    let out = lcm(dir, &["grep", "insertions(+)"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid regex"));
    let fixed = hits(&["-F", "insertions(+)"]);
    assert!(!fixed.is_empty());
    for hit in &fixed {
        let shown = lcm(dir, &["show", hit["message"].as_str().unwrap()]);
        assert!(String::from_utf8_lossy(&shown.stdout).contains("insertions(+)"));
    }
    // `fetch_page(cursor)` is also a valid regex, which matches other text (a group, no
    // parentheses): only the fixed string finds the call.
    assert!(hits(&["fetch_page(cursor)"]).is_empty());
    assert!(!hits(&["--fixed-strings", "fetch_page(cursor)"]).is_empty());
    // Both at once.
    assert_eq!(
        ids(&hits(&["-i", "-F", "FETCH_PAGE(CURSOR)"])),
        ids(&hits(&["-F", "fetch_page(cursor)"]))
    );

    // Other modes refuse them, saying why; nothing else changes.
    let out = lcm(dir, &["grep", "--mode", "full-text", "-i", "timeout"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("regex mode only"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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

#[test]
fn doctor_checks_compacted_data_and_repairs_a_counter() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    json(&lcm(
        dir,
        &["import", "--json", example().to_str().unwrap()],
    ));
    json(&lcm(
        dir,
        &["compact", "--json", "ses_0", "--budget", "700"],
    ));
    let clean = json(&lcm(dir, &["doctor", "--json"]));
    assert_eq!(
        clean["check"]["violations"],
        serde_json::json!([]),
        "{clean}"
    );
    assert!(clean["check"]["checked"]["summaries"].as_u64() > Some(0));
    assert_eq!(clean["repair"], Value::Null);

    // Damage: the message counter behind the stored messages (a raw write, lcm not running).
    lcm::store::damage::set_counter(&dir.join("lcm.redb"), "next_message", 0).unwrap();
    let broken = lcm(dir, &["doctor"]);
    assert!(!broken.status.success());
    let stdout = String::from_utf8_lossy(&broken.stdout);
    assert!(stdout.contains("counter_behind"), "{stdout}");
    assert!(stdout.contains("lcm doctor --repair"), "{stdout}");
    assert!(String::from_utf8_lossy(&broken.stderr).contains("1 integrity violation remains"));

    let fixed = json(&lcm(dir, &["doctor", "--repair", "--json"]));
    assert_eq!(fixed["check"]["violations"][0]["kind"], "counter_behind");
    assert_eq!(
        fixed["check"]["violations"][0]["repair"],
        serde_json::json!({"repair": "raise_counter", "counter": "next_message"})
    );
    assert_eq!(fixed["repair"]["applied"].as_array().unwrap().len(), 1);
    assert_eq!(fixed["after"]["violations"], serde_json::json!([]));
    assert!(lcm(dir, &["doctor"]).status.success());
}

#[test]
fn tools_print_their_definitions_in_both_shapes() {
    let tmp = tempfile::tempdir().unwrap();
    let anthropic = json(&lcm(tmp.path(), &["tools", "--format", "anthropic"]));
    let names: Vec<&str> = anthropic
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "lcm_grep",
            "lcm_describe",
            "lcm_expand",
            "lcm_read_file",
            "lcm_expand_query",
            "Task",
            "Tasks",
            "lcm_pin",
            "lcm_forget"
        ]
    );
    assert!(
        anthropic
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["input_schema"]["type"] == "object")
    );
    let openai = json(&lcm(
        tmp.path(),
        &["tools", "--format", "openai", "--main-agent"],
    ));
    let names: Vec<&str> = openai
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "lcm_grep",
            "lcm_describe",
            "lcm_expand_query",
            "Task",
            "Tasks",
            "lcm_pin",
            "lcm_forget"
        ],
        "lcm_expand is for sub-agents"
    );
    assert!(
        openai
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["type"] == "function")
    );
}

#[test]
fn tool_calls_grep_describe_and_expand_on_the_demo_data() {
    let tmp = tempfile::tempdir().unwrap();
    let keep = tmp.path().join("demo");
    json(&lcm(
        tmp.path(),
        &["demo", "--json", "--keep-in", keep.to_str().unwrap()],
    ));
    let found = json(&lcm(
        &keep,
        &[
            "tool",
            "lcm_grep",
            "--session",
            "ses_0",
            "--args",
            r#"{"pattern": "INV-\\d{4}"}"#,
        ],
    ));
    let groups = found["groups"].as_array().unwrap();
    assert!(!groups.is_empty(), "{found}");
    let region = groups[0]["region"].as_str().unwrap().to_owned();
    assert!(region.starts_with("sum_"), "{found}");
    assert!(
        groups[0]["hits"][0]["snippet"]
            .as_str()
            .unwrap()
            .contains("INV-4821")
    );

    let described = json(&lcm(
        &keep,
        &[
            "tool",
            "lcm_describe",
            "--args",
            &format!(r#"{{"id": "{region}"}}"#),
        ],
    ));
    assert_eq!(described["type"], "summary");
    assert!(described["manifest"]["total"].as_u64().unwrap() > 0);

    // The main agent may not expand; a sub-agent may, and gets the verbatim messages.
    let args = format!(r#"{{"summary_id": "{region}"}}"#);
    let refused = lcm(&keep, &["tool", "lcm_expand", "--args", &args]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("lcm_expand_query"), "{stderr}");
    let expanded = json(&lcm(
        &keep,
        &["tool", "lcm_expand", "--sub-agent", "--args", &args],
    ));
    assert!(
        expanded
            .to_string()
            .contains("Keep the ticket number INV-4821"),
        "{expanded}"
    );

    // Arguments that break the schema: each error with its JSON pointer, non-zero exit.
    let bad = lcm(
        &keep,
        &[
            "tool",
            "lcm_grep",
            "--args",
            r#"{"pattern": "x", "mode": "fuzzy"}"#,
        ],
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("invalid arguments for lcm_grep"),
        "{stderr}"
    );
    assert!(stderr.contains("at /mode"), "{stderr}");
    let unknown = lcm(&keep, &["tool", "lcm_nope"]);
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("lcm_grep, lcm_describe, lcm_expand")
    );
}

/// `lcm tool lcm_pin` / `lcm_forget` write their mark in the data directory, and `lcm context`
/// shows it: the pinned message verbatim in its block, the forgotten summary as a pointer.
#[test]
fn pin_and_forget_through_the_cli_change_what_lcm_context_shows() {
    let tmp = tempfile::tempdir().unwrap();
    let keep = tmp.path().join("demo");
    json(&lcm(
        tmp.path(),
        &["demo", "--json", "--keep-in", keep.to_str().unwrap()],
    ));
    let context = || json(&lcm(&keep, &["context", "ses_0", "--budget", "100000"]));
    let before = context();
    let top = before["summaries"][0].as_str().unwrap().to_owned();
    // The session's first message, under the top summary (down through condensed ones).
    let mut first = top.clone();
    while first.starts_with("sum_") {
        let described = json(&lcm(&keep, &["describe", "--json", &first]));
        first = described["summary"]["sources"][0]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let message = json(&lcm(&keep, &["show", "--json", &first]));
    let text = message["parts"][0]["text"].as_str().unwrap().to_owned();

    let pinned = json(&lcm(
        &keep,
        &[
            "tool",
            "lcm_pin",
            "--args",
            &format!(r#"{{"id": "{first}"}}"#),
        ],
    ));
    assert_eq!(pinned["session"], "ses_0", "{pinned}");
    let forgotten = json(&lcm(
        &keep,
        &[
            "tool",
            "lcm_forget",
            "--args",
            &format!(r#"{{"id": "{top}"}}"#),
        ],
    ));
    assert_eq!(forgotten["forgotten"], true, "{forgotten}");
    let after = context();
    assert_eq!(after["breakdown"]["pinned"]["items"], 1, "{after}");
    let body = after["body"].to_string();
    assert!(
        body.contains(&format!("<message id=\\\"{first}\\\"")),
        "{body}"
    );
    let head: String = text.lines().next().unwrap().chars().take(40).collect();
    let escaped = serde_json::to_string(&head).unwrap();
    assert!(
        body.contains(&escaped[1..escaped.len() - 1]),
        "{head}: {body}"
    );
    assert!(
        body.contains(&format!("<lcm_forgotten id=\\\"{top}\\\"")),
        "{body}"
    );
    assert!(
        after["breakdown"]["summaries"]["tokens"].as_u64()
            < before["breakdown"]["summaries"]["tokens"].as_u64()
    );
    // A summarised message cannot be forgotten (its summary stands for it): refused, and the
    // context is unchanged.
    let refused = lcm(
        &keep,
        &[
            "tool",
            "lcm_forget",
            "--args",
            &format!(r#"{{"id": "{first}"}}"#),
        ],
    );
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("is summarised"), "{stderr}");
    assert_eq!(context(), after);
    assert!(lcm(&keep, &["doctor"]).status.success());
}

/// The item a scripted request is about (the line after `Item (JSON):`).
fn map_item_of(request: &lcm::llm::testing::RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    serde_json::from_str(line).ok()
}

#[test]
fn map_run_status_cancel_and_resume() {
    use lcm::llm::testing::{ScriptedReply, ScriptedServer};
    use serde_json::json;

    // The model: a scripted OpenAI-shaped server on loopback, answering each item.
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = tokio.block_on(ScriptedServer::start());
    server.set_default(ScriptedReply::from_fn(|request| match map_item_of(request) {
        Some(item) => ScriptedReply::ok(
            json!({"id": item["id"], "upper": item["word"].as_str().unwrap_or_default().to_uppercase()})
                .to_string(),
        ),
        None => ScriptedReply::status(400),
    }));

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("work");
    std::fs::create_dir(&root).unwrap();
    let root = root.canonicalize().unwrap();
    let data = tmp.path().join("data");
    let config = tmp.path().join("lcm.toml");
    let config_text = format!(
        "[llm]\nprovider = \"openai\"\nbase_url = {:?}\nmodel = \"scripted\"\nmax_retries = 0\n\n[map]\nallowed_roots = [{:?}]\nconcurrency = 8\n",
        server.url(),
        root.to_str().unwrap()
    );
    std::fs::write(&config, config_text).unwrap();
    let config = config.to_str().unwrap().to_owned();
    let items: String = (0..40)
        .map(|i| format!("{}\n", json!({"id": i, "word": format!("w{i}")})))
        .collect();
    std::fs::write(root.join("items.jsonl"), items).unwrap();
    let schema = root.join("schema.json");
    std::fs::write(
        &schema,
        json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}, "upper": {"type": "string"}},
            "required": ["id", "upper"]
        })
        .to_string(),
    )
    .unwrap();
    let schema_arg = format!("@{}", schema.display());

    // Run: the summary, and the output file in input order.
    let summary = json(&lcm(
        &data,
        &[
            "--config",
            &config,
            "map",
            "run",
            "items.jsonl",
            "--prompt",
            "Upper-case the word.",
            "--schema",
            &schema_arg,
            "--json",
        ],
    ));
    assert_eq!(summary["job"], "job_0", "{summary}");
    assert_eq!(summary["status"], "completed", "{summary}");
    assert_eq!(summary["completed"], 40);
    assert_eq!(summary["failed"], 0);
    assert_eq!(server.request_count(), 40);
    let output = std::fs::read_to_string(root.join("items.out.jsonl")).unwrap();
    let lines: Vec<Value> = output
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 40);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i);
        assert_eq!(line["result"], json!({"id": i, "upper": format!("W{i}")}));
    }

    // Status from the store, one job or all of them.
    let status = json(&lcm(
        &data,
        &["--config", &config, "map", "status", "job_0", "--json"],
    ));
    assert_eq!(status["status"], "completed");
    assert_eq!(status["progress"]["completed"], 40);
    let all = json(&lcm(
        &data,
        &["--config", &config, "map", "status", "--json"],
    ));
    assert_eq!(all.as_array().map(Vec::len), Some(1));
    let text = lcm(&data, &["--config", &config, "map", "status", "job_0"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("40 of 40 items done"));

    // A finished job: cancel changes nothing, resume asks the model nothing.
    let cancelled = lcm(&data, &["--config", &config, "map", "cancel", "job_0"]);
    assert!(cancelled.status.success());
    assert!(String::from_utf8_lossy(&cancelled.stdout).contains("already completed"));
    let resumed = json(&lcm(
        &data,
        &["--config", &config, "map", "resume", "job_0", "--json"],
    ));
    assert_eq!(resumed["status"], "completed");
    assert_eq!(server.request_count(), 40);

    // A job left running (created, never run): cancel writes what was done; resume refuses.
    tokio.block_on(async {
        let opened =
            lcm::search::DataDir::open(&data, &lcm::core::config::Config::default()).unwrap();
        let map = lcm::core::config::MapConfig {
            allowed_roots: vec![root.clone()],
            ..Default::default()
        };
        let mut request = lcm::engine::operators::MapRequest::llm(
            root.join("items.jsonl"),
            "Upper-case the word.",
            json!({"type": "object"}),
        );
        request.output_path = Some(root.join("second.out.jsonl"));
        let job = lcm::engine::operators::create_map_job(opened.store, &map, &request)
            .await
            .unwrap();
        assert_eq!(job.id.to_string(), "job_1");
    });
    let cancelled = json(&lcm(
        &data,
        &["--config", &config, "map", "cancel", "job_1", "--json"],
    ));
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["not_run"], 40);
    let second = std::fs::read_to_string(root.join("second.out.jsonl")).unwrap();
    assert_eq!(second.lines().count(), 40);
    let refused = lcm(&data, &["--config", &config, "map", "resume", "job_1"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cancelled"));
    assert_eq!(server.request_count(), 40, "a cancelled job asks nothing");

    // Errors: unknown jobs, malformed ids, no model configured (nothing stored then).
    let unknown = lcm(&data, &["--config", &config, "map", "status", "job_9"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no map job job_9"));
    let unknown = lcm(&data, &["--config", &config, "map", "cancel", "job_9"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no map job job_9"));
    let malformed = lcm(&data, &["--config", &config, "map", "status", "nine"]);
    assert!(String::from_utf8_lossy(&malformed.stderr).contains("not a job id"));
    let offline = lcm(
        &data,
        &[
            "map",
            "run",
            root.join("items.jsonl").to_str().unwrap(),
            "--prompt",
            "p",
            "--schema",
            "{}",
        ],
    );
    assert!(!offline.status.success());
    assert!(
        String::from_utf8_lossy(&offline.stderr).contains("[llm] provider"),
        "{}",
        String::from_utf8_lossy(&offline.stderr)
    );
    let all = json(&lcm(
        &data,
        &["--config", &config, "map", "status", "--json"],
    ));
    assert_eq!(all.as_array().map(Vec::len), Some(2), "nothing more stored");
}

/// Ctrl-C during `lcm import` of many files: the file in hand is finished, the rest are not
/// started, the store is closed cleanly (a read-only open needs no recovery), every imported
/// file is stored whole, the exit code is 130, and the same command then imports the rest.
#[cfg(unix)]
#[test]
fn an_interrupted_import_stops_between_files_and_closes_the_store() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    const FILES: usize = 1_000;
    const PER_FILE: usize = 5;
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let files: Vec<std::path::PathBuf> = (0..FILES)
        .map(|i| {
            let path = tmp.path().join(format!("t{i:04}.jsonl"));
            let lines: String = (0..PER_FILE)
                .map(|j| {
                    format!(
                        "{}\n",
                        serde_json::json!({
                            "session": format!("file-{i}"),
                            "role": if j % 2 == 0 { "user" } else { "assistant" },
                            "created_at": "2026-11-26T08:00:00Z",
                            "key": format!("m{j}"),
                            "content": format!("message {j} of file {i}"),
                        })
                    )
                })
                .collect();
            std::fs::write(&path, lines).unwrap();
            path
        })
        .collect();
    let import = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lcm"));
        command
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["import", "--quiet", "--format", "lcm"])
            .args(&files)
            .env_remove("LCM_CONFIG");
        command
    };

    let mut child = import()
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut printed = String::new();
    // The first file's report: the import is under way, its signal handler installed.
    while !printed.contains("new messages") {
        assert_ne!(stdout.read_line(&mut printed).unwrap(), 0, "{printed}");
    }
    common::send_sigint(child.id());
    std::io::Read::read_to_string(&mut stdout, &mut printed).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted: imported"), "{stderr}");
    assert!(stderr.contains("did not start"), "{stderr}");

    // Every report printed is one file stored whole; the others were not started.
    let reported = printed.matches("5 new messages").count();
    assert!(
        (1..FILES).contains(&reported),
        "{reported} files reported:\n{printed}"
    );
    // Closed cleanly: a read-only open, which refuses a store that needs recovery, succeeds.
    let store =
        common::open_closed_store(&data_dir).expect("the interrupted import closed the store");
    let sessions = store.sessions().unwrap();
    assert_eq!(sessions.len(), reported, "{printed}");
    assert!(
        sessions.iter().all(|s| s.message_count == PER_FILE as u64),
        "{sessions:?}"
    );
    drop(store);

    // The same command imports the rest and skips what is stored.
    let again = import().arg("--json").output().unwrap();
    let report = json(&again);
    let imported: u64 = report["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["imported"].as_u64().unwrap())
        .sum();
    assert_eq!(imported, ((FILES - reported) * PER_FILE) as u64);
    let store = common::open_closed_store(&data_dir).unwrap();
    assert_eq!(store.stats().unwrap().messages, (FILES * PER_FILE) as u64);
}

/// Ctrl-C during `lcm reindex`: the rebuild ends at its next commit, the store is closed
/// cleanly, the index covers a prefix of the messages (its watermark), grep still finds a
/// message past it, and the exit code is 130.
#[cfg(unix)]
#[test]
fn an_interrupted_reindex_ends_at_a_commit_and_grep_stays_complete() {
    const MESSAGES: usize = 4_000;
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let transcript = tmp.path().join("t.jsonl");
    let lines: String = (0..MESSAGES)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({
                    "session": "s",
                    "role": "user",
                    "key": format!("m{i}"),
                    "content": format!("reindexed message marker{i:05} of the test"),
                })
            )
        })
        .collect();
    std::fs::write(&transcript, lines).unwrap();
    // A commit every 20 messages: the rebuild takes many commits, each a chance to stop.
    let config = tmp.path().join("config.toml");
    std::fs::write(&config, "[search]\nindex_batch = 20\n").unwrap();
    let run = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lcm"));
        command
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--config")
            .arg(&config)
            .args(args);
        command
    };
    let imported = json(
        &run(&["import", "--json", transcript.to_str().unwrap()])
            .output()
            .unwrap(),
    );
    assert_eq!(imported["indexed"].as_u64(), Some(MESSAGES as u64));

    let meta = data_dir.join("index/meta.json");
    let before = std::fs::read(&meta).unwrap();
    let child = run(&["reindex", "--quiet"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The rebuild's first commit (every document deleted) rewrites tantivy's meta.json; the
    // signal handler was installed before it.
    let waited = std::time::Instant::now();
    while std::fs::read(&meta).is_ok_and(|now| now == before) {
        assert!(
            waited.elapsed().as_secs() < 60,
            "the rebuild never committed"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    common::send_sigint(child.id());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("the index covers the first"), "{stderr}");

    // Closed cleanly, and the watermark is a commit's: a multiple of 20, short of the end.
    let store =
        common::open_closed_store(&data_dir).expect("the interrupted reindex closed the store");
    let watermark = store.stats().unwrap().index_watermark.0;
    assert!(watermark < MESSAGES as u64, "{watermark}");
    assert_eq!(watermark % 20, 0, "{watermark}");
    drop(store);
    // The last message, past the watermark, is found (by the scan of what is not indexed).
    let page = json(
        &run(&["grep", "--json", &format!("marker{:05}", MESSAGES - 1)])
            .output()
            .unwrap(),
    );
    assert_eq!(page["hits"].as_array().unwrap().len(), 1, "{page}");
}

/// The issue's case: a session whose newest messages hold a 12,000-row CSV read by a tool
/// (about 226k tokens). `lcm context` for a 32,000-token window gives a context under it that
/// names the file, its columns and its 12,000 rows; `lcm describe file_N` shows the exploration
/// summary; the message is still byte for byte what was imported.
#[test]
fn a_twelve_thousand_row_csv_read_fits_a_32k_context_by_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut csv = String::from("order_id,customer,region,product,quantity,unit_price,order_date\n");
    for i in 0..12_000 {
        csv.push_str(&format!(
            "{},customer-{:05},{},product-{:03},{},{}.{:02},2026-{:02}-{:02}\n",
            100_000 + i,
            i * 7 % 10_000,
            ["north", "south", "east", "west"][i % 4],
            i % 250,
            1 + i % 9,
            5 + i % 200,
            i % 100,
            1 + i % 12,
            1 + i % 28
        ));
    }
    let lines = [
        serde_json::json!({"session": "sales", "role": "user", "key": "u1",
            "content": "Load /data/sales.csv and tell me the best region."}),
        serde_json::json!({"session": "sales", "role": "assistant", "key": "a1", "parts": [
            {"type": "tool_call", "id": "call_1", "name": "Read",
             "arguments": "{\"file_path\":\"/data/sales.csv\"}"}]}),
        serde_json::json!({"session": "sales", "role": "tool", "key": "t1", "parts": [
            {"type": "tool_result", "call_id": "call_1", "content": csv}]}),
    ];
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let path = dir.join("sales.jsonl");
    std::fs::write(&path, text.join("\n") + "\n").unwrap();
    let data = dir.join("data");
    json(&lcm(&data, &["import", "--json", path.to_str().unwrap()]));

    let ctx = json(&lcm(
        &data,
        &["context", "--json", "sales", "--budget", "32000"],
    ));
    let tokens = ctx["tokens"].as_u64().unwrap();
    assert!(tokens < 32_000, "a context of {tokens} tokens");
    let body = ctx["body"].to_string();
    assert!(body.contains("file_0"), "names the file record");
    assert!(body.contains("/data/sales.csv"));
    for column in ["order_id", "customer", "region", "unit_price", "order_date"] {
        assert!(body.contains(column), "names column {column}");
    }
    assert!(
        body.contains("12000 rows") || body.contains("12,000 rows"),
        "says 12,000 rows: {body:.2000}"
    );
    assert!(
        !body.contains("customer-09999"),
        "the payload itself is not in the context"
    );

    let described = json(&lcm(&data, &["describe", "--json", "file_0"]));
    let exploration = described["file"]["exploration"].as_str().unwrap();
    assert!(exploration.contains("unit_price"), "{exploration}");
    assert_eq!(described["file"]["kind"], "csv");
    assert_eq!(described["file"]["path"], "/data/sales.csv");
    assert_eq!(described["referenced_by"], serde_json::json!(["msg_2"]));
    let human = lcm(&data, &["describe", "file_0"]);
    assert!(human.status.success());
    assert!(String::from_utf8_lossy(&human.stdout).contains("/data/sales.csv"));

    let shown = lcm(&data, &["show", "msg_2"]);
    assert!(shown.status.success());
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains("part 0 is file_0 (in contexts by its reference)"),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );
    // Lossless: the message is byte for byte the imported line.
    let out = lcm(&data, &["show", "--original", "msg_2"]);
    assert!(out.status.success());
    assert_eq!(&out.stdout[..out.stdout.len() - 1], text[2].as_bytes());
}

/// A data directory written by the previous schema (lcm-store's committed fixture) is migrated
/// by the first command that opens it, and `lcm doctor` then finds nothing wrong.
#[test]
fn a_store_of_the_previous_schema_is_migrated_and_passes_doctor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("crates/lcm-store/tests/fixtures/schema5/lcm.redb"),
        dir.join("lcm.redb"),
    )
    .unwrap();
    let report = json(&lcm(dir, &["doctor", "--json"]));
    assert_eq!(
        report["check"]["violations"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(
        report["check"]["checked"]["messages"].as_u64(),
        Some(29),
        "{report}"
    );
    assert_eq!(
        report["check"]["checked"]["summaries"].as_u64(),
        Some(2),
        "{report}"
    );
    let found = json(&lcm(dir, &["grep", "--json", "cannot find"]));
    assert_eq!(found["hits"][0]["message"], "msg_27", "{found}");
}

#[test]
fn eval_recall_scores_a_locomo_file_without_touching_the_data_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("tiny-locomo.json");
    std::fs::write(
        &file,
        r#"[{"sample_id": "tiny",
             "conversation": {"speaker_a": "Ann", "speaker_b": "Bo",
               "session_1_date_time": "9:00 am on 1 May, 2023",
               "session_1": [
                 {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a greyhound called Pixel."},
                 {"speaker": "Bo", "dia_id": "D1:2", "text": "I started learning the cello."}]},
             "qa": [{"question": "Which instrument, the cello?", "evidence": ["D1:2"], "category": 4},
                    {"question": "Which zeppelin?", "evidence": ["D1:1"], "category": 5}]}]"#,
    )
    .unwrap();
    let data_dir = tmp.path().join("data");
    let keep = tmp.path().join("kept");
    let out = json(&lcm(
        &data_dir,
        &[
            "eval",
            "recall",
            file.to_str().unwrap(),
            "--json",
            "-q",
            "--keep",
            keep.to_str().unwrap(),
        ],
    ));
    let mode = &out["modes"][0];
    assert_eq!(mode["mode"], "full_text");
    assert_eq!(mode["overall"]["questions"], 2);
    // The cello question finds its turn first; the zeppelin one finds nothing.
    assert_eq!(mode["overall"]["recall_at"][0], 0.5);
    assert_eq!(mode["overall"]["mrr"], 0.5);
    assert_eq!(mode["categories"]["4"]["recall_at"][0], 1.0);
    assert!(!data_dir.exists(), "the --data-dir is not the evaluation's");
    assert!(keep.join("lcm.redb").exists());

    // The table, and the errors of a missing file and of regex.
    let table = lcm(&data_dir, &["eval", "recall", file.to_str().unwrap(), "-q"]);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("| full_text | 2 | all | 0.500 |"), "{text}");
    let missing = lcm(&data_dir, &["eval", "recall", "/nonexistent/x.json"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read /nonexistent/x.json"));
    let regex = lcm(
        &data_dir,
        &["eval", "recall", file.to_str().unwrap(), "--mode", "regex"],
    );
    assert!(!regex.status.success());
    assert!(String::from_utf8_lossy(&regex.stderr).contains("not regex"));

    // Several files are measured together: here a second conversation as the multimodal-dialog
    // release ships one (its body at the top level, its id the file's name).
    let second = tmp.path().join("27.json");
    std::fs::write(
        &second,
        r#"{"speaker_a": "Cy", "speaker_b": "Di",
            "session_1": [{"speaker": "Cy", "dia_id": "D1:1", "text": "My kayak is called Heron."}],
            "qa": [{"question": "What is the kayak called?", "evidence": ["D1:01"], "category": 4}]}"#,
    )
    .unwrap();
    let both = json(&lcm(
        &data_dir,
        &[
            "eval",
            "recall",
            file.to_str().unwrap(),
            second.to_str().unwrap(),
            "--json",
            "-q",
        ],
    ));
    let mode = &both["modes"][0];
    assert_eq!(mode["overall"]["questions"], 3, "{both}");
    // The kayak question finds its turn (its evidence written `D1:01`) first.
    assert!((mode["overall"]["recall_at"][0].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-9);
    // A deeper cut-off is added to the usual three; one past a search's page is refused
    // before anything is imported, as is 0.
    let deeper = json(&lcm(
        &data_dir,
        &[
            "eval",
            "recall",
            file.to_str().unwrap(),
            "--at",
            "20",
            "--json",
            "-q",
        ],
    ));
    assert_eq!(deeper["ks"], serde_json::json!([1, 5, 10, 20]), "{deeper}");
    let at = &deeper["modes"][0]["overall"]["recall_at"];
    assert_eq!(at.as_array().unwrap().len(), 4);
    assert!(at[3].as_f64().unwrap() >= at[2].as_f64().unwrap());
    let kept = tmp.path().join("never");
    for bad in ["0", "100000"] {
        let refused = lcm(
            &data_dir,
            &[
                "eval",
                "recall",
                file.to_str().unwrap(),
                "--at",
                bad,
                "--keep",
                kept.to_str().unwrap(),
            ],
        );
        assert!(!refused.status.success(), "--at {bad}");
        assert!(!kept.exists(), "nothing is imported for --at {bad}");
    }
    let refused = lcm(
        &data_dir,
        &["eval", "recall", file.to_str().unwrap(), "--at", "100000"],
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("search.max_limit"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // The same file twice would import one conversation twice: refused, saying why.
    let twice = lcm(
        &data_dir,
        &[
            "eval",
            "recall",
            file.to_str().unwrap(),
            file.to_str().unwrap(),
        ],
    );
    assert!(!twice.status.success());
    assert!(
        String::from_utf8_lossy(&twice.stderr).contains("already used in"),
        "{}",
        String::from_utf8_lossy(&twice.stderr)
    );
    assert!(!data_dir.exists(), "the --data-dir is not the evaluation's");
}

/// `lcm eval run` generates needle tasks from the TREC set, compacts each session, answers with
/// the scripted arm (100%, the lossless guarantee) and writes the three reports; `lcm eval
/// report` merges result files; `lcm eval generate` is deterministic; bad input says why.
#[test]
fn eval_run_writes_the_three_reports_and_report_merges_them() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let trec = shared.join("trec/TREC.train");
    let tmp = tempfile::tempdir().unwrap();
    let data_dir = tmp.path().join("data");
    let out = tmp.path().join("out");
    let run = |seed: &str, out: &Path| {
        lcm(
            &data_dir,
            &[
                "eval",
                "run",
                "--trec",
                trec.to_str().unwrap(),
                "--family",
                "needles",
                "--length",
                "8k",
                "--length",
                "16k",
                "--seed",
                seed,
                "-q",
                "--out",
                out.to_str().unwrap(),
            ],
        )
    };
    let first = run("5", &out);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let table = String::from_utf8_lossy(&first.stdout);
    assert!(
        table.contains("| needles | scripted | 8K | 1 | 1.000 |"),
        "{table}"
    );
    assert!(
        table.contains("| needles | scripted | 16K | 1 | 1.000 |"),
        "{table}"
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["score"], 1.0, "{r}");
        assert!(r["calls"].as_u64().unwrap() >= 6, "{r}");
        assert_eq!(r["arm"], "scripted");
    }
    let svg = std::fs::read_to_string(out.join("results.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline") && svg.contains(">16K<"));
    assert!(
        std::fs::read_to_string(out.join("results.md"))
            .unwrap()
            .contains("| needles |")
    );
    assert!(!data_dir.exists(), "the --data-dir is not the evaluation's");

    // A second run merged with the first: two tasks per length.
    let other = tmp.path().join("other");
    assert!(run("6", &other).status.success());
    let merged = tmp.path().join("merged");
    let report = lcm(
        &data_dir,
        &[
            "eval",
            "report",
            out.join("results.json").to_str().unwrap(),
            other.join("results.json").to_str().unwrap(),
            "--out",
            merged.to_str().unwrap(),
        ],
    );
    assert!(report.status.success());
    assert!(
        String::from_utf8_lossy(&report.stdout).contains("| needles | scripted | 8K | 2 | 1.000 |")
    );

    // The same seed gives the same task.
    let generate = || {
        lcm(
            &data_dir,
            &[
                "eval",
                "generate",
                "--trec",
                trec.to_str().unwrap(),
                "--family",
                "aggregation",
                "--length",
                "4k",
                "--seed",
                "3",
            ],
        )
        .stdout
    };
    let task: Value = serde_json::from_slice(&generate()).unwrap();
    assert_eq!(task["family"], "aggregation");
    assert!(task["tokens"].as_u64().unwrap() <= 4_096);
    assert_eq!(generate(), generate());

    // Bad input: a length that is not one, an arm that cannot answer a family, a missing set,
    // a model arm without a model, a window too small, a result file that is not one (and nothing is written over the merged reports).
    let not_results = tmp.path().join("not-results.json");
    std::fs::write(&not_results, r#"{"score": 1}"#).unwrap();
    let merged_before = std::fs::read(merged.join("results.json")).unwrap();
    for (args, says) in [
        (
            vec!["eval", "run", "--trec", "x", "--length", "8x"],
            "is not a length",
        ),
        (
            vec![
                "eval",
                "run",
                "--trec",
                trec.to_str().unwrap(),
                "--family",
                "aggregation",
            ],
            "needle tasks only",
        ),
        (
            vec!["eval", "run", "--trec", "/nonexistent/TREC"],
            "cannot read /nonexistent/TREC",
        ),
        // A model arm without a model configured ([llm] is the offline default here).
        (
            vec![
                "eval",
                "run",
                "--trec",
                trec.to_str().unwrap(),
                "--arm",
                "baseline",
            ],
            "the baseline arm needs a model, and none is configured: set [llm]",
        ),
        (
            vec![
                "eval", "run", "--trec", "x", "--arm", "lcm", "--window", "900",
            ],
            "a window needs at least 1,024 tokens",
        ),
        (
            vec![
                "eval",
                "report",
                not_results.to_str().unwrap(),
                "--out",
                merged.to_str().unwrap(),
            ],
            "not an lcm eval result file",
        ),
    ] {
        let failed = lcm(&data_dir, &args);
        assert!(!failed.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&failed.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    assert_eq!(
        std::fs::read(merged.join("results.json")).unwrap(),
        merged_before
    );
}

/// `lcm --help` describes the whole tool, every command in its first screen; `lcm completions`
/// prints a script for each shell (without a data directory or a readable configuration), and
/// an unknown shell is a usage error naming the ones there are.
#[test]
fn help_describes_the_whole_tool_and_completions_cover_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("never-created");
    let help = lcm(&data, &["--help"]);
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let first = help.lines().next().unwrap();
    assert!(first.contains("Lossless Context Management"), "{first}");
    let commands = [
        "import",
        "grep",
        "show",
        "sessions",
        "stats",
        "reindex",
        "vacuum",
        "compact",
        "context",
        "dag",
        "describe",
        "demo",
        "doctor",
        "tool",
        "tools",
        "serve",
        "map",
        "mcp",
        "eval",
        "completions",
    ];
    // The overview names every command (the list clap prints below it does too).
    let overview = &help[..help.find("Usage:").unwrap()];
    for command in commands {
        let word = |line: &str| line.split([' ', ',', '(', ')']).any(|w| w == command);
        assert!(
            overview.lines().any(word),
            "`{command}` missing from the overview:\n{overview}"
        );
    }

    // `lcm tool --help` names every tool the registry has.
    let tool_help = lcm(&data, &["tool", "--help"]);
    assert!(tool_help.status.success());
    let tool_help = String::from_utf8(tool_help.stdout).unwrap();
    for definition in lcm::engine::ToolRegistry::with_builtins().definitions() {
        let named = tool_help
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .any(|w| w == definition.name);
        assert!(
            named,
            "`{}` missing from lcm tool --help:\n{tool_help}",
            definition.name
        );
    }

    for (shell, marker) in [
        ("bash", "complete -F _lcm"),
        ("zsh", "#compdef lcm"),
        ("fish", "complete -c lcm"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_lcm"))
            .args(["completions", shell])
            .env("LCM_CONFIG", tmp.path().join("no-such-config.toml"))
            .env("LCM_DATA_DIR", &data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains(marker), "{shell}: {script}");
        for command in commands {
            assert!(
                script.contains(command),
                "{shell}: `{command}` not completed"
            );
        }
        assert!(script.contains("--data-dir"), "{shell}");
    }
    // The bash script loads in bash and completes a command name.
    if Path::new("/bin/bash").exists() {
        let script = tmp.path().join("lcm.bash");
        let out = Command::new(env!("CARGO_BIN_EXE_lcm"))
            .args(["completions", "bash"])
            .output()
            .unwrap();
        std::fs::write(&script, &out.stdout).unwrap();
        let probe = format!(
            "source {} && complete -p lcm && COMP_WORDS=(lcm gre) && COMP_CWORD=1 && \
             COMP_LINE='lcm gre' && COMP_POINT=7 && _lcm lcm gre lcm && echo \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("/bin/bash")
            .args(["--norc", "--noprofile", "-c", &probe])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "bash: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(said.contains("-F _lcm lcm"), "{said}");
        assert_eq!(said.lines().last(), Some("grep"), "{said}");
    } else {
        eprintln!("SKIPPED: /bin/bash is absent; the bash completion script was not loaded");
    }
    let bad = lcm(&data, &["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("tcsh") && stderr.contains("bash") && stderr.contains("zsh"),
        "{stderr}"
    );
    assert!(!data.exists(), "no data directory is created");
}

/// Every `*.jsonl` / `*.json` file under `dir`, recursively (the test's own walk).
fn transcripts_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(transcripts_under(&path));
        } else if path
            .extension()
            .is_some_and(|e| e == "jsonl" || e == "json")
        {
            out.push(path);
        }
    }
    out
}

/// `lcm import FOLDER` imports every transcript under the real Claude Code folder, each
/// sub-agent's transcript (`<session>/subagents/agent-*.jsonl`) as a child session of its
/// parent; again, nothing is added; a folder without transcripts is an error that stores
/// nothing.
#[test]
fn import_takes_a_folder_and_makes_sub_agents_child_sessions() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let folder = shared.join("transcripts/claude-code");
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("lcm");
    let folder_arg = folder.to_str().unwrap();
    let first = json(&lcm(&data, &["import", "--json", "-q", folder_arg]));
    let imports = first["imports"].as_array().unwrap();
    let mut expected: Vec<String> = transcripts_under(&folder)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let mut imported: Vec<String> = imports
        .iter()
        .map(|r| r["path"].as_str().unwrap().to_owned())
        .collect();
    expected.sort();
    imported.sort();
    assert_eq!(imported, expected);
    assert!(imports.iter().all(|r| r["error_count"] == 0), "{first}");
    let stored: u64 = imports
        .iter()
        .map(|r| r["imported"].as_u64().unwrap())
        .sum();
    assert!(stored > 1000, "{stored}");

    let sessions = json(&lcm(&data, &["sessions", "--json"]));
    let sessions = sessions.as_array().unwrap();
    let id_of = |key: &str| {
        sessions
            .iter()
            .find(|s| s["key"] == key)
            .map(|s| s["id"].clone())
            .unwrap_or_else(|| panic!("no session {key}"))
    };
    let agents: Vec<&Value> = sessions
        .iter()
        .filter(|s| s["key"].as_str().unwrap().contains("/agent-"))
        .collect();
    // Every sub-agent file of the folder is a session of its own, the child of its parent.
    let agent_files = expected
        .iter()
        .filter(|p| p.contains("/subagents/"))
        .count();
    assert_eq!(agents.len(), agent_files);
    for agent in &agents {
        let key = agent["key"].as_str().unwrap();
        let parent_key = key.split("/agent-").next().unwrap();
        assert_eq!(agent["parent"], id_of(parent_key), "{agent}");
    }
    assert!(
        sessions
            .iter()
            .filter(|s| !s["key"].as_str().unwrap().contains("/agent-"))
            .all(|s| s["parent"].is_null())
    );

    let again = json(&lcm(&data, &["import", "--json", "-q", folder_arg]));
    assert!(
        again["imports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["imported"] == 0),
        "{again}"
    );

    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(empty.join("nested")).unwrap();
    std::fs::write(empty.join("nested/notes.txt"), "not a transcript").unwrap();
    let out = lcm(&data, &["import", empty.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no transcripts") && stderr.contains("empty"),
        "{stderr}"
    );
    let after = json(&lcm(&data, &["sessions", "--json"]));
    assert_eq!(after.as_array().unwrap().len(), sessions.len());
}

/// `lcm import -` reads standard input: the same messages as importing the file, and the same
/// input again adds nothing; nothing is left behind in the data directory.
#[test]
fn import_reads_standard_input() {
    use std::io::Write;
    use std::process::Stdio;
    let tmp = tempfile::tempdir().unwrap();
    let (by_file, by_stdin) = (tmp.path().join("file"), tmp.path().join("stdin"));
    let file = json(&lcm(
        &by_file,
        &["import", "--json", "-q", example().to_str().unwrap()],
    ));
    let bytes = std::fs::read(example()).unwrap();
    let from_stdin = |data: &Path| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_lcm"))
            .arg("--data-dir")
            .arg(data)
            .args(["import", "--json", "-q", "-"])
            .env_remove("LCM_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        json(&child.wait_with_output().unwrap())
    };
    let first = from_stdin(&by_stdin);
    let report = &first["imports"][0];
    assert_eq!(report["path"], "-");
    assert_eq!(report["imported"], file["imports"][0]["imported"]);
    assert!(report["imported"].as_u64().unwrap() > 0);
    let again = from_stdin(&by_stdin);
    assert_eq!(again["imports"][0]["imported"], 0);
    assert_eq!(
        again["imports"][0]["already_present"], report["imported"],
        "{again}"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&by_stdin)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".import-stdin"))
        .collect();
    assert!(leftovers.is_empty());
}
