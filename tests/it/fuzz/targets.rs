//! The fuzz targets: every parser of lcm that takes outside bytes, each called as its caller
//! calls it, with the properties it promises checked where that is cheap.
//!
//! Seeds: handwritten inputs (here and under `tests/fuzz_seeds/`), the project's own
//! `config/default.toml` and demo transcript, and lines of the real transcripts under
//! `../shared/data/transcripts` (read at run time, never copied; skipped with a message when
//! absent), from which the seeds of the other formats are derived (lcm lines, OpenAI messages,
//! proxy request bodies, upstream streams).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use lcm::core::config::Config;
use lcm::core::formats::{self, Format, LineContext, LineOutcome, ParseError, ParsedMessage};
use lcm::core::ids::{AnyId, FileId, JobId, MessageId, SessionId, SummaryId};
use lcm::core::message::{NewMessage, Role};
use lcm::core::time::Timestamp;
use lcm::server::fuzzing::{self as server, ProxyShape};
use serde_json::{Value, json};

use super::harness::{Outcome, Target, TargetFn, hash, label_without, thread_name};

/// The repository's root (seeds under `tests/fuzz_seeds`, `config/default.toml`).
fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/data/transcripts/claude-code` beside the repository, if present.
fn shared_transcripts() -> Option<PathBuf> {
    let dir = repo().join("../shared/data/transcripts/claude-code");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "fuzz: {} is absent: the targets start from their handwritten seeds only",
            dir.display()
        );
        None
    }
}

/// The handwritten seed files of `kind` (`tests/fuzz_seeds/<kind>/*`).
fn seed_files(kind: &str) -> Vec<Vec<u8>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("tests/fuzz_seeds").join(kind))
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|path| std::fs::read(path).ok())
        .collect()
}

fn jsonl_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            jsonl_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "jsonl") {
            out.push(path);
        }
    }
}

/// Longest seed line taken from the real transcripts.
const MAX_SEED_LINE: usize = 48 * 1024;

/// A sample of the real Claude Code lines: a few of each kind of entry (type and content
/// block kinds), at most 400, none longer than [`MAX_SEED_LINE`].
fn claude_lines() -> &'static [Vec<u8>] {
    static LINES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let mut lines = Vec::new();
        let demo = repo().join("examples/transcripts/demo-session.jsonl");
        let mut files = vec![demo];
        if let Some(dir) = shared_transcripts() {
            let mut found = Vec::new();
            jsonl_files(&dir, &mut found);
            found.sort();
            files.extend(found);
        }
        let mut per_kind: std::collections::HashMap<String, usize> = Default::default();
        for file in files {
            let Ok(text) = std::fs::read(&file) else {
                continue;
            };
            for line in text.split(|&b| b == b'\n') {
                if line.is_empty() || line.len() > MAX_SEED_LINE || lines.len() >= 400 {
                    continue;
                }
                let Ok(value) = serde_json::from_slice::<Value>(line) else {
                    continue;
                };
                let mut kind = value["type"].as_str().unwrap_or("?").to_owned();
                match &value["message"]["content"] {
                    Value::String(_) => kind.push_str(":string"),
                    Value::Array(blocks) => {
                        for block in blocks {
                            kind.push(':');
                            kind.push_str(block["type"].as_str().unwrap_or("?"));
                        }
                    }
                    _ => {}
                }
                let n = per_kind.entry(kind).or_default();
                if *n < 4 {
                    *n += 1;
                    lines.push(line.to_vec());
                }
            }
        }
        lines
    })
}

/// The Anthropic messages (`message` of the Claude Code entries) among the seed lines.
fn anthropic_messages() -> &'static [Value] {
    static MESSAGES: OnceLock<Vec<Value>> = OnceLock::new();
    MESSAGES.get_or_init(|| {
        claude_lines()
            .iter()
            .filter_map(|line| serde_json::from_slice::<Value>(line).ok())
            .filter(|v| matches!(v["type"].as_str(), Some("user" | "assistant")))
            .map(|v| {
                let mut message = v["message"].clone();
                if let Some(m) = message.as_object_mut() {
                    m.retain(|k, _| k == "role" || k == "content");
                }
                message
            })
            .filter(|m| m["role"].is_string())
            .collect()
    })
}

/// An Anthropic message as OpenAI Chat Completions messages.
fn to_openai(message: &Value) -> Vec<Value> {
    let role = message["role"].as_str().unwrap_or("user");
    let Some(blocks) = message["content"].as_array() else {
        return vec![json!({"role": role, "content": message["content"]})];
    };
    let mut out = Vec::new();
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => text.push(json!({"type": "text", "text": block["text"]})),
            Some("tool_use") => calls.push(json!({
                "id": block["id"], "type": "function",
                "function": {"name": block["name"], "arguments": block["input"].to_string()},
            })),
            Some("tool_result") => out.push(json!({
                "role": "tool", "tool_call_id": block["tool_use_id"],
                "content": match &block["content"] { Value::String(s) => json!(s), other => other.clone() },
            })),
            _ => {}
        }
    }
    if !text.is_empty() || !calls.is_empty() {
        let mut m = json!({"role": role, "content": text});
        if !calls.is_empty() {
            m["tool_calls"] = Value::Array(calls);
        }
        out.push(m);
    }
    out
}

fn lines_of(values: impl IntoIterator<Item = Value>) -> Vec<Vec<u8>> {
    values
        .into_iter()
        .map(|v| v.to_string().into_bytes())
        .collect()
}

fn texts(items: &[&str]) -> Vec<Vec<u8>> {
    items.iter().map(|s| s.as_bytes().to_vec()).collect()
}

// ----------------------------------------------------------------------------- properties

fn ctx(line: u64) -> LineContext<'static> {
    LineContext {
        line,
        default_session_key: "fuzz",
    }
}

fn error_label(error: &ParseError) -> String {
    match error {
        ParseError::InvalidUtf8 { .. } => "invalid_utf8".to_owned(),
        ParseError::MalformedJson { .. } => "malformed_json".to_owned(),
        ParseError::InvalidEntry { detail, .. } => format!("invalid: {detail}"),
    }
}

/// What lcm promises of every parsed message: exported as an lcm line (`lcm export`) and read
/// back, it is the same message (role, parts, time, source key).
fn round_trips(found: &[ParsedMessage]) -> Result<(), String> {
    for parsed in found {
        let message = &parsed.message;
        let line = formats::lcm::to_line(&parsed.session_key, message);
        let again = match formats::lcm::parse_line(line.as_bytes(), &ctx(1)) {
            Ok(LineOutcome::Messages(mut again)) if again.len() == 1 => again.remove(0),
            other => {
                return Err(format!(
                    "the lcm export of a parsed message does not read back: {other:?}\n  line: {line}"
                ));
            }
        };
        let back = &again.message;
        let same = back.role == message.role
            && back.parts == message.parts
            && back.created_at == message.created_at
            && (message.source_key.is_none() || back.source_key == message.source_key)
            && again.session_key == parsed.session_key;
        if !same {
            return Err(format!(
                "the lcm export of a parsed message reads back different\n  before: {message:?}\n  after: {back:?}"
            ));
        }
    }
    Ok(())
}

/// The outcome of a line parser, with the round trip and the error's line checked.
fn line_outcome(result: Result<LineOutcome, ParseError>, line: u64) -> Outcome {
    match result {
        Ok(LineOutcome::Messages(found)) => match round_trips(&found) {
            Ok(()) => Outcome::ok(format!("messages:{}", found.len().min(3))),
            Err(why) => Outcome::Violation(why),
        },
        Ok(LineOutcome::Skipped { reason }) => Outcome::ok(format!("skipped: {reason}")),
        Err(error) if error.line() != line => Outcome::Violation(format!(
            "the error names line {} for line {line}: {error}",
            error.line()
        )),
        Err(error) => Outcome::err(error_label(&error)),
    }
}

fn stateless(f: fn(&[u8]) -> Outcome) -> Box<dyn Fn() -> TargetFn + Send + Sync> {
    Box::new(move || Box::new(f))
}

// ----------------------------------------------------------------------------- targets

fn claude_code_line(bytes: &[u8]) -> Outcome {
    let _ = formats::detect(bytes);
    line_outcome(formats::claude_code::parse_line(bytes, &ctx(7)), 7)
}

fn openai_line(bytes: &[u8]) -> Outcome {
    let _ = formats::detect(bytes);
    line_outcome(formats::openai::parse_line(bytes, &ctx(3)), 3)
}

fn openai_document(bytes: &[u8]) -> Outcome {
    match formats::openai::parse_document(bytes, "fuzz") {
        Ok(found) => match round_trips(&found) {
            Ok(()) => Outcome::ok(format!("messages:{}", found.len().min(3))),
            Err(why) => Outcome::Violation(why),
        },
        Err(error) => Outcome::err(error_label(&error)),
    }
}

fn lcm_line(bytes: &[u8]) -> Outcome {
    let outcome = line_outcome(formats::lcm::parse_line(bytes, &ctx(5)), 5);
    if let Outcome::Violation(_) = outcome {
        return outcome;
    }
    // The same text sent live (HTTP API, MCP): accepted exactly when the importer accepts it.
    if let Ok(text) = std::str::from_utf8(bytes) {
        let live = formats::lcm::parse_live_message(text, "fuzz");
        if live.is_ok() != matches!(outcome, Outcome::Ok(_)) {
            return Outcome::Violation(format!(
                "the live parser and the importer disagree: live {live:?}, import {outcome:?}"
            ));
        }
    }
    outcome
}

fn api_messages(bytes: &[u8]) -> Outcome {
    match server::api_messages(bytes) {
        Ok(messages) if messages.is_empty() => {
            Outcome::Violation("a body was accepted with no message".into())
        }
        Ok(messages) => Outcome::ok(format!("messages:{}", messages.len().min(3))),
        Err(error) => Outcome::err(error),
    }
}

fn proxy_request(shape: ProxyShape, bytes: &[u8]) -> Outcome {
    match server::proxy_request(shape, bytes) {
        Ok(parsed) if parsed.derived_key.is_empty() => {
            Outcome::Violation("the derived session key is empty".into())
        }
        Ok(parsed) => Outcome::ok(format!(
            "stored:{} tools:{} model:{}",
            parsed.stored.min(3),
            parsed.model_chooses_tools,
            parsed.client_model
        )),
        Err(error) => Outcome::err(error),
    }
}

fn proxy_openai_request(bytes: &[u8]) -> Outcome {
    proxy_request(ProxyShape::OpenAi, bytes)
}

fn proxy_anthropic_request(bytes: &[u8]) -> Outcome {
    proxy_request(ProxyShape::Anthropic, bytes)
}

/// A streamed answer: rebuilt the same however it is split into chunks; then read as the
/// proxy reads an answer (tool calls, a tool round, storing).
fn stream(shape: ProxyShape, bytes: &[u8]) -> Outcome {
    let whole = server::stream_answer(shape, &[bytes]);
    let h = hash(bytes) as usize;
    let len = bytes.len();
    let (a, b) = if len == 0 {
        (0, 0)
    } else {
        let a = h % (len + 1);
        let b = a + (h >> 20) % (len - a + 1);
        (a, b)
    };
    let split = server::stream_answer(shape, &[&bytes[..a], &bytes[a..b], &bytes[b..]]);
    if whole != split {
        return Outcome::Violation(format!(
            "the stream rebuilds differently when split at {a} and {b}: {whole:?} vs {split:?}"
        ));
    }
    match whole {
        None => Outcome::ok("no message"),
        Some(message) => {
            // What the rebuilt message holds: its fields, or its blocks' types.
            let mut shape_of: Vec<&str> = match message["content"].as_array() {
                Some(blocks) => blocks
                    .iter()
                    .map(|b| b["type"].as_str().unwrap_or("?"))
                    .collect(),
                None => message
                    .as_object()
                    .map(|m| m.keys().map(String::as_str).collect())
                    .unwrap_or_default(),
            };
            shape_of.dedup();
            shape_of.truncate(4);
            let shape_of = shape_of.join(",");
            match server::answer_message(shape, &message) {
                Ok(calls) => Outcome::ok(format!("calls:{} {shape_of}", calls.min(3))),
                Err(error) => Outcome::err(format!("{error} {shape_of}")),
            }
        }
    }
}

fn sse_openai(bytes: &[u8]) -> Outcome {
    stream(ProxyShape::OpenAi, bytes)
}

fn sse_anthropic(bytes: &[u8]) -> Outcome {
    stream(ProxyShape::Anthropic, bytes)
}

fn upstream_json(bytes: &[u8]) -> Outcome {
    let mut labels = Vec::new();
    for shape in [ProxyShape::OpenAi, ProxyShape::Anthropic] {
        labels.push(match server::json_answer(shape, bytes) {
            None => "none".to_owned(),
            Some(message) => match server::answer_message(shape, &message) {
                Ok(calls) => format!("calls:{}", calls.min(3)),
                Err(error) => format!("err: {error}"),
            },
        });
    }
    Outcome::ok(labels.join(" / "))
}

fn config_toml(bytes: &[u8]) -> Outcome {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Outcome::err("not UTF-8");
    };
    match Config::from_toml(text) {
        // TOML errors quote the offending line: label them by their first and last lines.
        Err(error) => {
            let text = error.to_string();
            let mut lines = text.lines().filter(|l| !l.trim().is_empty());
            let first = lines.next().unwrap_or_default();
            Outcome::err(format!("{first} {}", lines.next_back().unwrap_or_default()))
        }
        Ok(config) => {
            // What the CLI and the daemon derive from it at start.
            let _ = config.tokenizer.encoding();
            let _ = config.server.bind_addr();
            // Written back (`lcm config`), it reads back the same.
            let written = match toml::to_string(&config) {
                Ok(written) => written,
                Err(e) => {
                    return Outcome::Violation(format!("a valid config does not serialise: {e}"));
                }
            };
            match Config::from_toml(&written) {
                Ok(again) if again == config => Outcome::ok("valid"),
                other => Outcome::Violation(format!(
                    "a valid config written back does not read back the same: {other:?}\n  written: {written}"
                )),
            }
        }
    }
}

/// The fingerprint the cursor target decodes against (seeds are issued for it).
const CURSOR_PRINT: u64 = 0x0123_4567_89ab_cdef;

fn cursors(bytes: &[u8]) -> Outcome {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Outcome::err("not UTF-8");
    };
    type Decode = fn(&str, u64) -> Result<String, String>;
    let decoders: [(&str, Decode); 3] = [
        ("grep", lcm::search::fuzzing::grep_cursor),
        ("lcm_grep", lcm::engine::tools::fuzzing::grep_tool_cursor),
        ("lcm_expand", lcm::engine::tools::fuzzing::expand_cursor),
    ];
    let mut labels = Vec::new();
    for (name, decode) in decoders {
        match decode(text, CURSOR_PRINT) {
            Ok(canonical) => {
                // A cursor that decodes, issued again, decodes to the same place.
                if decode(&canonical, CURSOR_PRINT).as_ref() != Ok(&canonical) {
                    return Outcome::Violation(format!(
                        "{name}: cursor {text:?} decodes, but its canonical form {canonical:?} does not decode to itself"
                    ));
                }
                labels.push(format!("{name} ok"));
            }
            Err(error) => labels.push(format!("{name} err {}", label_without(&error, text))),
        }
    }
    Outcome::Ok(labels.join(" / "))
}

fn ids(bytes: &[u8]) -> Outcome {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Outcome::err("not UTF-8");
    };
    fn typed<T>(text: &str) -> Result<(), String>
    where
        T: std::str::FromStr<Err = lcm::core::IdError>
            + std::fmt::Display
            + PartialEq
            + std::fmt::Debug,
    {
        if let Ok(id) = text.parse::<T>() {
            let printed = id.to_string();
            if printed.parse::<T>().as_ref() != Ok(&id) {
                return Err(format!(
                    "{text:?} parses to {id:?}, which prints as {printed:?} and does not parse back"
                ));
            }
        }
        Ok(())
    }
    let checks = [
        typed::<MessageId>(text),
        typed::<SessionId>(text),
        typed::<SummaryId>(text),
        typed::<FileId>(text),
        typed::<JobId>(text),
    ];
    if let Some(Err(why)) = checks.into_iter().find(Result::is_err) {
        return Outcome::Violation(why);
    }
    let _ = Format::parse(text);
    if let Ok(t) = Timestamp::parse(text) {
        let printed = t.to_string();
        if !printed.starts_with('@') && Timestamp::parse(&printed) != Ok(t) {
            return Outcome::Violation(format!(
                "timestamp {text:?} prints as {printed:?}, which does not parse back to it"
            ));
        }
    }
    match text.parse::<AnyId>() {
        Ok(id) => {
            let printed = match id {
                AnyId::Message(i) => i.to_string(),
                AnyId::Session(i) => i.to_string(),
                AnyId::Summary(i) => i.to_string(),
                AnyId::File(i) => i.to_string(),
                AnyId::Job(i) => i.to_string(),
            };
            if printed.parse::<AnyId>().ok() != Some(id) {
                return Outcome::Violation(format!(
                    "{text:?} parses, its print {printed:?} does not"
                ));
            }
            Outcome::ok("id")
        }
        Err(error) => Outcome::Err(label_without(&error.to_string(), text)),
    }
}

// ----------------------------------------------------------------------------- targets with a store

/// A store with a few sessions, tool calls and summaries (for the tool and MCP targets).
fn filled_store(store: &lcm::Store, runtime: &tokio::runtime::Runtime) {
    let session = store.ensure_session("fuzz").expect("session");
    let other = store.ensure_session("other").expect("session");
    for n in 0..40u64 {
        let text = format!(
            "turn {n}: decided to change src/file_{n}.rs; error E{n:05} seen in the parser. {}",
            "More narrative text to summarise. ".repeat((n % 5 + 1) as usize)
        );
        let role = if n % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        store
            .append(session, NewMessage::text(role, text.clone()))
            .expect("append");
        if n % 10 == 0 {
            store
                .append(other, NewMessage::text(Role::User, text))
                .expect("append");
        }
    }
    let config = lcm::core::config::CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 300,
        leaf_target_tokens: 80,
        condensed_fanout: 3,
        condensed_target_tokens: 120,
        ..Default::default()
    };
    let summarizer = lcm::llm::ExtractiveSummarizer::new(store.counter());
    runtime
        .block_on(lcm::engine::compact(
            store,
            session,
            800,
            &config,
            &summarizer,
            |_| {},
        ))
        .expect("compact");
}

fn tokio_runtime(target: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(thread_name(target))
        .build()
        .expect("tokio runtime")
}

/// `name\narguments`: the tool's name on the first line, its arguments after.
fn split_call(bytes: &[u8]) -> (String, &[u8]) {
    match bytes.iter().position(|&b| b == b'\n') {
        Some(i) => (
            String::from_utf8_lossy(&bytes[..i]).into_owned(),
            &bytes[i + 1..],
        ),
        None => (String::new(), bytes),
    }
}

/// Whether a tool's error reports a panic that something caught (a blocking task's).
fn hides_panic(message: &str) -> bool {
    message.contains("panicked") || message.contains("task ended")
}

fn tool_args_target() -> TargetFn {
    let runtime = tokio_runtime("tool_args");
    let roots = tempfile::tempdir().expect("temp dir");
    let store = lcm::Store::open_in_memory(lcm::store::StoreOptions::new(lcm::TokenCounter::new(
        Config::default().tokenizer.encoding(),
    )))
    .expect("store");
    filled_store(&store, &runtime);
    let mut config = Config::default();
    config.map.allowed_roots = vec![roots.path().to_path_buf()];
    let registry = lcm::engine::ToolRegistry::with_builtins();
    let ctx = lcm::engine::ToolContext::new(
        Arc::new(store),
        None,
        Arc::new(config),
        lcm::engine::Caller::sub_agent(Some(SessionId(1)), 1),
    );
    Box::new(move |bytes: &[u8]| {
        let _keep = &roots;
        let (name, args) = split_call(bytes);
        let args = String::from_utf8_lossy(args);
        match runtime.block_on(registry.call_json(&ctx, &name, &args)) {
            Ok(_) => Outcome::ok(format!("{name} ok")),
            Err(error) if hides_panic(&error.to_string()) => {
                Outcome::Violation(format!("the tool panicked: {error}"))
            }
            Err(error) => Outcome::err(format!("{} {}", error.kind(), error)),
        }
    })
}

fn mcp_target() -> TargetFn {
    let runtime = tokio_runtime("mcp_tools");
    let roots = tempfile::tempdir().expect("temp dir");
    let mut config = Config::default();
    config.map.allowed_roots = vec![roots.path().to_path_buf()];
    let (lcm_runtime, server) = runtime.block_on(async {
        let lcm_runtime = lcm::engine::runtime::Runtime::open(
            lcm::engine::runtime::RuntimeOptions::in_memory(config),
        )
        .await
        .expect("runtime");
        let server = lcm::mcp::McpServer::open(&lcm_runtime, Some("fuzz"))
            .await
            .expect("mcp server");
        (lcm_runtime, server)
    });
    Box::new(move |bytes: &[u8]| {
        let _keep = (&roots, &lcm_runtime);
        let (name, args) = split_call(bytes);
        // MCP carries the arguments as a JSON object, or none.
        let args = match serde_json::from_slice::<Value>(args) {
            Ok(Value::Object(map)) => Value::Object(map),
            Ok(_) | Err(_) => Value::Null,
        };
        match runtime.block_on(server.call(&name, args)) {
            None => Outcome::err("no such tool"),
            Some(Ok(_)) => Outcome::ok(format!("{name} ok")),
            Some(Err(error)) if hides_panic(&error.to_string()) => {
                Outcome::Violation(format!("the tool panicked: {error}"))
            }
            Some(Err(error)) => Outcome::err(format!("{} {}", error.kind(), error)),
        }
    })
}

fn import_target() -> TargetFn {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = lcm::store::StoreOptions::new(lcm::TokenCounter::new(
        Config::default().tokenizer.encoding(),
    ));
    let mut store = lcm::Store::open_in_memory(options).expect("store");
    let mut runs = 0u64;
    Box::new(move |bytes: &[u8]| {
        runs += 1;
        if runs.is_multiple_of(500) {
            match lcm::Store::open_in_memory(options) {
                Ok(fresh) => store = fresh,
                Err(e) => return Outcome::Violation(format!("cannot open a store: {e}")),
            }
        }
        let path = dir.path().join(format!("t{}.jsonl", runs % 7));
        if let Err(e) = std::fs::write(&path, bytes) {
            return Outcome::Violation(format!("cannot write the input: {e}"));
        }
        let h = hash(bytes);
        let import = lcm::store::import::ImportOptions {
            format: [
                None,
                Some(Format::ClaudeCode),
                Some(Format::OpenAi),
                Some(Format::Lcm),
            ][(h % 4) as usize],
            strict: h & 4 != 0,
            max_line_bytes: if h & 8 != 0 { 1024 } else { 1 << 20 },
            batch_size: 1 + (h >> 8) as usize % 64,
            ..Default::default()
        };
        let first = lcm::store::import::import_file(&store, &path, &import, |_, _| {});
        match first {
            Err(error) => Outcome::err(error.to_string()),
            Ok(report) => {
                // Import is idempotent: the same file again stores nothing.
                match lcm::store::import::import_file(&store, &path, &import, |_, _| {}) {
                    Ok(again) if again.imported == 0 => Outcome::ok(format!(
                        "imported:{} errors:{}",
                        report.imported.min(3),
                        report.error_count.min(3)
                    )),
                    other => Outcome::Violation(format!(
                        "importing the same file twice stored more: first {} messages, then {:?}",
                        report.imported,
                        other.map(|r| r.imported)
                    )),
                }
            }
        }
    })
}

// ----------------------------------------------------------------------------- seeds

fn lcm_seed_lines() -> Vec<Vec<u8>> {
    static LINES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    LINES.get_or_init(lcm_lines_uncached).clone()
}

fn lcm_lines_uncached() -> Vec<Vec<u8>> {
    let mut out = seed_files("lcm");
    for (i, line) in claude_lines().iter().enumerate() {
        if let Ok(LineOutcome::Messages(found)) =
            formats::claude_code::parse_line(line, &ctx(i as u64 + 1))
        {
            for parsed in found {
                out.push(formats::lcm::to_line("fuzz", &parsed.message).into_bytes());
            }
        }
    }
    out
}

fn openai_messages() -> Vec<Value> {
    anthropic_messages().iter().flat_map(to_openai).collect()
}

fn sse_seeds(shape: ProxyShape) -> Vec<Vec<u8>> {
    let mut out = seed_files(match shape {
        ProxyShape::OpenAi => "sse_openai",
        ProxyShape::Anthropic => "sse_anthropic",
    });
    let assistant: Vec<&Value> = anthropic_messages()
        .iter()
        .filter(|m| m["role"] == "assistant")
        .take(60)
        .collect();
    for message in assistant {
        let Some(blocks) = message["content"].as_array() else {
            continue;
        };
        let mut events = String::new();
        let mut push = |name: Option<&str>, data: Value| {
            if let Some(name) = name {
                events.push_str(&format!("event: {name}\n"));
            }
            events.push_str(&format!("data: {data}\n\n"));
        };
        match shape {
            ProxyShape::Anthropic => {
                push(
                    Some("message_start"),
                    json!({"type": "message_start", "message": {"id": "msg", "role": "assistant", "content": []}}),
                );
                for (i, block) in blocks.iter().enumerate() {
                    let kind = block["type"].as_str().unwrap_or("text");
                    let (start, delta) = match kind {
                        "thinking" => (
                            json!({"type": "thinking", "thinking": ""}),
                            json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                        ),
                        "tool_use" => (
                            json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                            json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                        ),
                        _ => (
                            json!({"type": "text", "text": ""}),
                            json!({"type": "text_delta", "text": block["text"]}),
                        ),
                    };
                    push(
                        Some("content_block_start"),
                        json!({"type": "content_block_start", "index": i, "content_block": start}),
                    );
                    push(
                        Some("content_block_delta"),
                        json!({"type": "content_block_delta", "index": i, "delta": delta}),
                    );
                    push(
                        Some("content_block_stop"),
                        json!({"type": "content_block_stop", "index": i}),
                    );
                }
                push(
                    Some("message_delta"),
                    json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
                );
                push(Some("message_stop"), json!({"type": "message_stop"}));
            }
            ProxyShape::OpenAi => {
                for m in to_openai(message) {
                    if let Some(parts) = m["content"].as_array() {
                        for part in parts {
                            push(
                                None,
                                json!({"choices": [{"index": 0, "delta": {"content": part["text"]}}]}),
                            );
                        }
                    }
                    if let Some(calls) = m["tool_calls"].as_array() {
                        for (i, call) in calls.iter().enumerate() {
                            push(
                                None,
                                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": i, "id": call["id"], "type": "function", "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]}}]}),
                            );
                        }
                    }
                }
                events.push_str("data: [DONE]\n\n");
            }
        }
        out.push(events.into_bytes());
    }
    out
}

fn request_seeds(shape: ProxyShape) -> Vec<Vec<u8>> {
    let mut out = seed_files(match shape {
        ProxyShape::OpenAi => "proxy_openai",
        ProxyShape::Anthropic => "proxy_anthropic",
    });
    let messages = anthropic_messages();
    for window in messages.chunks(6).take(60) {
        let body = match shape {
            ProxyShape::Anthropic => json!({
                "model": "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are helpful.",
                "messages": window, "stream": true,
            }),
            ProxyShape::OpenAi => {
                let mut list = vec![json!({"role": "system", "content": "You are helpful."})];
                list.extend(window.iter().flat_map(to_openai));
                json!({"model": "gpt-4o", "messages": list, "tool_choice": "auto"})
            }
        };
        out.push(body.to_string().into_bytes());
    }
    out
}

fn api_seeds() -> Vec<Vec<u8>> {
    let mut out = seed_files("api_messages");
    let lines = lcm_seed_lines();
    for group in lines.chunks(5).take(60) {
        let messages: Vec<Value> = group
            .iter()
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        out.push(json!({ "messages": messages }).to_string().into_bytes());
        if let Some(first) = group.first() {
            out.push(first.clone());
        }
    }
    out
}

fn tool_seeds(mcp: bool) -> Vec<Vec<u8>> {
    let print = format!("{CURSOR_PRINT:016x}");
    let mut calls = vec![
        (
            "lcm_grep",
            json!({"pattern": "error E000\\d+", "mode": "regex"}),
        ),
        (
            "lcm_grep",
            json!({"pattern": "parser", "mode": "full_text", "limit": 2}),
        ),
        (
            "lcm_grep",
            json!({"pattern": "file", "session": "all", "since": "2026-01-01"}),
        ),
        (
            "lcm_grep",
            json!({"pattern": "x", "cursor": format!("lg1.{print}.m.1.a3.{print}")}),
        ),
        ("lcm_describe", json!({"id": "sum_1"})),
        ("lcm_describe", json!({"id": "msg_3"})),
        ("lcm_describe", json!({"id": "ses_1"})),
        ("lcm_expand", json!({"summary_id": "sum_1", "max_depth": 2})),
        (
            "lcm_expand",
            json!({"ids": ["sum_1", "sum_2"], "token_cap": 500}),
        ),
        (
            "lcm_expand",
            json!({"summary_id": "sum_1", "cursor": format!("le1.{print}.0.msg_2.10")}),
        ),
        ("lcm_read_file", json!({"id": "file_1"})),
        (
            "lcm_expand_query",
            json!({"ids": ["sum_1"], "prompt": "what failed?"}),
        ),
        ("Task", json!({"prompt": "look", "description": "d"})),
        ("lcm_pin", json!({"id": "msg_3"})),
        ("lcm_pin", json!({"id": "msg_3", "unpin": true})),
        ("lcm_forget", json!({"id": "sum_1"})),
        ("lcm_forget", json!({"id": "msg_2", "restore": true})),
    ];
    if mcp {
        calls.extend([
            ("lcm_sessions", json!({})),
            ("lcm_append", json!({"messages": [{"role": "user", "content": "hi", "key": "k1"}]})),
            ("lcm_append", json!({"messages": [{"role": "assistant", "parts": [{"type": "text", "text": "hello"}]}], "session": "other"})),
            ("lcm_context", json!({"budget_tokens": 2000, "format": "openai"})),
            ("lcm_context", json!({"format": "anthropic", "session": "ses_1"})),
            ("read_file", json!({"path": "notes.txt"})),
            ("list_dir", json!({"path": "."})),
            ("write_file", json!({"path": "out.txt", "content": "x"})),
            ("llm_map", json!({"input_path": "in.jsonl", "output_path": "out.jsonl", "prompt": "p"})),
        ]);
    }
    let mut out: Vec<Vec<u8>> = calls
        .into_iter()
        .map(|(name, args)| format!("{name}\n{args}").into_bytes())
        .collect();
    out.extend(seed_files(if mcp { "mcp_tools" } else { "tool_args" }));
    out
}

fn cursor_seeds() -> Vec<Vec<u8>> {
    let print = format!("{CURSOR_PRINT:016x}");
    let mut out: Vec<Vec<u8>> = Vec::new();
    for n in [0u64, 1, 42, u64::MAX] {
        for cursor in lcm::search::fuzzing::issued_grep_cursors(n, CURSOR_PRINT) {
            out.push(cursor.clone().into_bytes());
            out.push(format!("lg1.{print}.m.{n}.{cursor}").into_bytes());
        }
        out.push(format!("lg1.{print}.s.{n}").into_bytes());
        out.push(format!("lg1.{print}.x.{n}").into_bytes());
        out.push(format!("lg1.{print}.m.{n}.-").into_bytes());
        out.push(format!("le1.{print}.{n}.sum_{n}.{n}").into_bytes());
        out.push(format!("le1.{print}.0.msg_{n}.0").into_bytes());
    }
    out.extend(texts(&["", ".", "a.", "r1.0", "lg1", "le1...."]));
    out
}

fn id_seeds() -> Vec<Vec<u8>> {
    texts(&[
        "msg_12",
        "ses_1",
        "sum_3",
        "file_4",
        "job_5",
        " msg_0 ",
        "msg_18446744073709551615",
        "msg_",
        "msg_-1",
        "msg_+1",
        "msg_01",
        "MSG_1",
        "2026-02-10T21:11:56.846Z",
        "2026-02-10",
        "2026-02-10T22:11:56.846+01:00",
        "claude_code",
        "openai",
        "lcm",
        "native",
    ])
}

fn config_seeds() -> Vec<Vec<u8>> {
    let mut out = seed_files("config");
    if let Ok(text) = std::fs::read(repo().join("config/default.toml")) {
        out.push(text);
    }
    out.extend(texts(&[
        "",
        "[search]\ndefault_limit = 20\nmax_limit = 200\n",
        "[tokenizer]\nmodel = \"gpt-4o\"\nsafety_margin = 0.1\n[tokenizer.model_families]\n\"x\" = \"cl100k_base\"\n",
        "[server]\nbind = \"127.0.0.1:7431\"\n[proxy]\ncontext_budget_tokens = 64000\n",
        "[map]\nallowed_roots = [\"/tmp\"]\nconcurrency = 4\n",
    ]));
    out
}

fn import_seeds() -> Vec<Vec<u8>> {
    let mut out = seed_files("import");
    let lines = claude_lines();
    for group in lines.chunks(8).take(40) {
        out.push(group.join(&b'\n'));
    }
    let lcm = lcm_seed_lines();
    for group in lcm.chunks(8).take(20) {
        out.push(group.join(&b'\n'));
    }
    let openai = openai_messages();
    for group in openai.chunks(6).take(20) {
        out.push(Value::Array(group.to_vec()).to_string().into_bytes());
        out.push(lines_of(group.to_vec()).join(&b'\n'));
    }
    out
}

/// Every target, in the order runs list them.
pub fn all() -> Vec<Target> {
    let claude: Vec<Vec<u8>> = seed_files("claude_code")
        .into_iter()
        .chain(claude_lines().iter().cloned())
        .collect();
    let openai_lines: Vec<Vec<u8>> = seed_files("openai")
        .into_iter()
        .chain(lines_of(openai_messages()))
        .collect();
    let openai_docs: Vec<Vec<u8>> = seed_files("openai")
        .into_iter()
        .chain(
            openai_messages()
                .chunks(5)
                .take(60)
                .enumerate()
                .map(|(i, c)| {
                    if i % 2 == 0 {
                        Value::Array(c.to_vec())
                    } else {
                        json!({"messages": c})
                    }
                })
                .map(|v| serde_json::to_vec_pretty(&v).unwrap_or_default()),
        )
        .collect();
    let upstream_seeds: Vec<Vec<u8>> = seed_files("upstream_json")
        .into_iter()
        .chain(
            anthropic_messages()
                .iter()
                .filter(|m| m["role"] == "assistant")
                .take(40)
                .flat_map(|m| {
                    let openai = to_openai(m).into_iter().next().unwrap_or(Value::Null);
                    [
                        json!({"id": "msg", "type": "message", "role": "assistant", "content": m["content"], "stop_reason": "end_turn"}),
                        json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": openai, "finish_reason": "stop"}]}),
                    ]
                })
                .map(|v| v.to_string().into_bytes()),
        )
        .collect();
    let target = |name, about, seeds, make, weight, short, max_len| Target {
        name,
        about,
        seeds,
        make,
        weight,
        short,
        max_len,
    };
    vec![
        target(
            "claude_code_line",
            "lcm_core::formats::claude_code::parse_line (+ detect), round trip through the lcm format",
            claude,
            stateless(claude_code_line),
            12,
            20_000,
            128 << 10,
        ),
        target(
            "openai_line",
            "lcm_core::formats::openai::parse_line (+ detect), round trip",
            openai_lines,
            stateless(openai_line),
            10,
            20_000,
            64 << 10,
        ),
        target(
            "openai_document",
            "lcm_core::formats::openai::parse_document, round trip",
            openai_docs,
            stateless(openai_document),
            8,
            10_000,
            128 << 10,
        ),
        target(
            "lcm_line",
            "lcm_core::formats::lcm::parse_line and parse_live_message, round trip",
            lcm_seed_lines(),
            stateless(lcm_line),
            10,
            20_000,
            64 << 10,
        ),
        target(
            "import_file",
            "lcm_store::import::import_file of a whole file into a store, twice (idempotence)",
            import_seeds(),
            Box::new(import_target),
            1,
            1_000,
            64 << 10,
        ),
        target(
            "api_messages",
            "POST /v1/sessions/{id}/messages body (lcm_server messages::parse_messages)",
            api_seeds(),
            stateless(api_messages),
            10,
            20_000,
            128 << 10,
        ),
        target(
            "proxy_openai_request",
            "POST /v1/chat/completions body (lcm_server proxy parse_request, derived key, client model, token count)",
            request_seeds(ProxyShape::OpenAi),
            stateless(proxy_openai_request),
            6,
            5_000,
            128 << 10,
        ),
        target(
            "proxy_anthropic_request",
            "POST /v1/messages body (lcm_server proxy parse_request, derived key, client model, token count)",
            request_seeds(ProxyShape::Anthropic),
            stateless(proxy_anthropic_request),
            6,
            5_000,
            128 << 10,
        ),
        target(
            "sse_openai",
            "the upstream's OpenAI event stream (proxy sse::Accumulator), split anywhere; calls and storing of the answer",
            sse_seeds(ProxyShape::OpenAi),
            stateless(sse_openai),
            8,
            20_000,
            64 << 10,
        ),
        target(
            "sse_anthropic",
            "the upstream's Anthropic event stream (proxy sse::Accumulator), split anywhere; calls and storing of the answer",
            sse_seeds(ProxyShape::Anthropic),
            stateless(sse_anthropic),
            8,
            20_000,
            64 << 10,
        ),
        target(
            "upstream_json",
            "the upstream's JSON answer in both shapes (Shape::answer_message, calls, storing)",
            upstream_seeds,
            stateless(upstream_json),
            6,
            20_000,
            64 << 10,
        ),
        target(
            "tool_args",
            "ToolRegistry::call_json of the built-in tools over a store with summaries (schema validation, argument parsing, the tool)",
            tool_seeds(false),
            Box::new(tool_args_target),
            4,
            2_000,
            16 << 10,
        ),
        target(
            "mcp_tools",
            "McpServer::call over an in-memory runtime (session tools: lcm_append's messages, lcm_context; runtime tools)",
            tool_seeds(true),
            Box::new(mcp_target),
            4,
            1_000,
            16 << 10,
        ),
        target(
            "config_toml",
            "Config::from_toml (+ validate, encoding, bind_addr), written back and read again",
            config_seeds(),
            stateless(config_toml),
            6,
            5_000,
            32 << 10,
        ),
        target(
            "cursors",
            "grep's cursor, lcm_grep's and lcm_expand's cursors: decode, canonical re-encoding",
            cursor_seeds(),
            stateless(cursors),
            6,
            50_000,
            512,
        ),
        target(
            "ids",
            "MessageId/SessionId/SummaryId/FileId/JobId/AnyId::from_str, Timestamp::parse, Format::parse; print and parse back",
            id_seeds(),
            stateless(ids),
            6,
            50_000,
            512,
        ),
    ]
}
