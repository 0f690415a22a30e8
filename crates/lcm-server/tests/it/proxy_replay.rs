//! End to end: a real Claude Code session (`../shared/data/transcripts/claude-code`, see its
//! README) replayed through the proxy turn by turn, the client resending its growing message
//! list every turn as Claude Code does, with an 8k-token budget.
//!
//! The scripted upstream (lcm-llm's `ScriptedServer` on loopback) answers each turn with the
//! assistant message the session recorded. Checked: every request the upstream receives fits
//! the budget (counted with lcm's token counter over the body as sent); the conversation is
//! stored once (no message twice, however often it was resent); and a detail of an early
//! message, long gone from what the upstream sees, is found again: on a last turn the upstream
//! calls `lcm_grep` for it, and the tool result the proxy sends back holds it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::common::{Setup, start};
use lcm_core::formats::{LineContext, LineOutcome, claude_code};
use lcm_core::tokens::TokenCounter;
use lcm_llm::testing::{ScriptedReply, ScriptedServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

const SESSION_FILE: &str = "258c7280-ae70-4798-800f-63464d01a85d.jsonl";
/// Turns replayed (the session has ~240).
const TURNS: usize = 100;
const BUDGET: u64 = 8_000;
/// Messages counted as "early": the detail searched for comes from them.
const EARLY: usize = 6;

/// The session as the API messages Claude Code sent: user and assistant entries of the main
/// thread, consecutive entries of one role merged into one message (Claude Code writes each
/// content block of a turn as its own entry).
fn conversation(path: &PathBuf) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("transcript");
    let mut out: Vec<Value> = Vec::new();
    for line in text.lines() {
        let entry: Value = serde_json::from_str(line).expect("JSON line");
        let kind = entry["type"].as_str().unwrap_or("");
        if !matches!(kind, "user" | "assistant") || entry["isSidechain"] == true {
            continue;
        }
        let role = entry["message"]["role"].as_str().expect("role").to_owned();
        let blocks = match &entry["message"]["content"] {
            Value::String(text) => vec![json!({"type": "text", "text": text})],
            Value::Array(blocks) => blocks.clone(),
            other => panic!("content {other}"),
        };
        match out.last_mut() {
            Some(last) if last["role"] == role.as_str() => {
                last["content"].as_array_mut().unwrap().extend(blocks);
            }
            _ => out.push(json!({"role": role, "content": blocks})),
        }
    }
    out
}

/// Whether lcm would store this message (it has some content).
fn has_content(message: &Value) -> bool {
    let entry = json!({"type": message["role"], "message": message}).to_string();
    let ctx = LineContext {
        line: 1,
        default_session_key: "replay",
    };
    matches!(
        claude_code::parse_line(entry.as_bytes(), &ctx),
        Ok(LineOutcome::Messages(_))
    )
}

/// The text a message shows (its text blocks, tool inputs and results; not ids or signatures).
fn shown_text(message: &Value) -> String {
    let mut out = Vec::new();
    for block in message["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => out.push(block["text"].as_str().unwrap_or("").to_owned()),
            Some("tool_use") => out.push(block["input"].to_string()),
            Some("tool_result") => match &block["content"] {
                Value::String(text) => out.push(text.clone()),
                Value::Array(items) => out.extend(
                    items
                        .iter()
                        .filter_map(|i| i["text"].as_str().map(str::to_owned)),
                ),
                _ => {}
            },
            _ => {}
        }
    }
    out.join("\n")
}

/// Words of 10+ characters (letters, digits, `_.-`, at least one letter) in `text`.
fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_.-".contains(c)))
        .map(|w| w.trim_matches(|c: char| ".-_".contains(c)))
        .filter(|w| w.len() >= 10 && w.chars().any(|c| c.is_ascii_alphabetic()))
        .map(str::to_owned)
        .collect()
}

fn escape(word: &str) -> String {
    word.replace('.', "\\.")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_claude_code_session_replays_within_the_budget_and_early_details_are_found() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/transcripts/claude-code");
    let path = dir.join(SESSION_FILE);
    if !path.is_file() {
        eprintln!(
            "SKIPPED: {} is absent (the real Claude Code transcripts of ../shared/data); this test needs it",
            path.display()
        );
        return;
    }
    let started = Instant::now();
    let messages = conversation(&path);
    // A turn: the client sends everything up to a user message; the recorded reply follows.
    let turns: Vec<usize> = (0..messages.len() - 1)
        .filter(|&i| messages[i]["role"] == "user" && messages[i + 1]["role"] == "assistant")
        .take(TURNS + 1)
        .collect();
    assert_eq!(turns.len(), TURNS + 1, "the session is long enough");
    let (replayed, last) = turns.split_at(TURNS);
    let last = last[0];

    let upstream = ScriptedServer::start().await;
    let (mut setup, tmp, root) = Setup::new();
    setup.config.proxy.anthropic_base_url = upstream.url();
    setup.config.proxy.context_budget_tokens = BUDGET;
    // The upstream replays recorded answers in order: compactions summarise offline here, not
    // with the client's model at the same upstream (tests/it/proxy_client_model.rs covers that).
    setup.config.proxy.summary_calls_per_window = 0;
    let server = start(setup, tmp, root).await;
    let counter = TokenCounter::new(server.runtime.config().tokenizer.encoding());

    let request = |upto: usize| {
        json!({
            "model": "claude-replay",
            "max_tokens": 4096,
            "system": [{"type": "text", "text": "You are Claude Code, replayed through lcm.", "cache_control": {"type": "ephemeral"}}],
            "tools": [
                {"name": "Bash", "description": "Run a shell command.", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
                {"name": "Read", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}
            ],
            "messages": messages[..=upto],
        })
    };
    let send = |body: Value| {
        let client = server.client.clone();
        let url = format!("{}/v1/messages", server.url);
        async move {
            let response = client
                .post(url)
                .header("x-api-key", "sk-ant-replay")
                .header("anthropic-version", "2023-06-01")
                .body(body.to_string())
                .send()
                .await
                .expect("request");
            let status = response.status();
            let key = response
                .headers()
                .get("x-lcm-session")
                .map(|v| v.to_str().unwrap().to_owned());
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, key, body)
        }
    };

    let mut key: Option<String> = None;
    for &i in replayed {
        let reply = &messages[i + 1];
        let calls_tools = reply["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["type"] == "tool_use");
        upstream.push(ScriptedReply::garbage(
            json!({
                "id": format!("msg_replay_{i}"), "type": "message", "role": "assistant",
                "model": "claude-replay", "content": reply["content"],
                "stop_reason": if calls_tools { "tool_use" } else { "end_turn" },
                "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 1}
            })
            .to_string(),
        ));
        let (status, session, body) = send(request(i)).await;
        assert_eq!(status, StatusCode::OK, "turn at message {i}: {body}");
        assert_eq!(
            body["content"], reply["content"],
            "the recorded reply comes back"
        );
        match &key {
            None => key = session,
            Some(key) => assert_eq!(session.as_ref(), Some(key), "one session throughout"),
        }
    }
    let key = key.expect("a session key");
    assert!(key.starts_with("proxy:anthropic:"), "{key}");

    // The last turn: the model searches for a detail of an early message.
    let early: Vec<String> = messages[..EARLY]
        .iter()
        .flat_map(|m| words(&shown_text(m)))
        .collect();
    let later = serde_json::to_string(&messages[EARLY..=last]).unwrap();
    let candidates: Vec<String> = early
        .into_iter()
        .filter(|w| !later.contains(w.as_str()))
        .collect();
    assert!(
        !candidates.is_empty(),
        "the early messages hold a distinctive word"
    );
    let chosen: Arc<Mutex<Option<String>>> = Arc::default();
    let pick = Arc::clone(&chosen);
    upstream.push(ScriptedReply::from_fn(move |request| {
        // A detail the model no longer sees verbatim.
        let word = candidates
            .iter()
            .find(|w| !request.raw_body.contains(w.as_str()))
            .unwrap_or(&candidates[0])
            .clone();
        let arguments = json!({"pattern": escape(&word)}).to_string();
        *pick.lock().unwrap() = Some(word);
        ScriptedReply::tool_calls_with_text("Let me look that up.", [("lcm_grep", arguments)])
    }));
    upstream.push(ScriptedReply::ok("Found it in the early output."));
    let before = upstream.request_count();
    let (status, _, body) = send(request(last)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["content"],
        json!([{"type": "text", "text": "Found it in the early output."}])
    );
    let word = chosen
        .lock()
        .unwrap()
        .clone()
        .expect("the upstream searched");

    let requests = upstream.requests();
    // Every request fits the budget, counted over the body as the upstream received it.
    let mut largest = 0;
    for (n, request) in requests.iter().enumerate() {
        let tokens = counter.count_text(&request.raw_body) as u64;
        largest = largest.max(tokens);
        assert!(
            tokens <= BUDGET,
            "request {n} carried {tokens} tokens (budget {BUDGET})"
        );
        assert_eq!(request.header("x-api-key"), Some("sk-ant-replay"));
    }
    // ... and the budget is used: the context is not cut to nothing.
    assert!(
        largest > BUDGET / 2,
        "the largest request carried {largest} tokens"
    );
    assert_eq!(requests.len(), before + 2, "one lcm tool round");
    let asked = &requests[before];
    assert!(
        !asked.raw_body.contains(&word),
        "`{word}` is no longer in the context the upstream sees"
    );
    let answered = requests[before + 1].body["messages"].as_array().unwrap();
    let results = answered.last().unwrap();
    assert_eq!(results["role"], "user");
    assert_eq!(results["content"][0]["type"], "tool_result");
    let found = results["content"][0]["content"].as_str().unwrap();
    assert!(
        found.contains(&word),
        "lcm_grep found `{word}` in the stored history: {found}"
    );

    // Stored once: every message the client sent with content, its last answer, nothing twice.
    let store = server.runtime.store();
    let id = store.session_id_for_key(&key).unwrap().unwrap();
    let stored = store.session_messages(id, 0..u64::MAX).unwrap();
    let expected = messages[..=last].iter().filter(|m| has_content(m)).count() + 1;
    assert_eq!(stored.len(), expected);
    // The history was compacted into summaries along the way (the runtime's own policy).
    let summaries = store.context(id).unwrap().summaries.len();
    assert!(summaries > 0, "no summaries");
    eprintln!(
        "replayed {} turns ({} upstream requests, {} messages stored, {summaries} summaries in the context, largest request {largest} tokens) in {:.1} s; found `{word}`",
        TURNS + 1,
        requests.len(),
        stored.len(),
        started.elapsed().as_secs_f64()
    );
}
