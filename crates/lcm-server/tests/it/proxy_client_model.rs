//! Summaries with the client's model: without `[llm]`, a proxied session's compactions
//! summarise with the model and credentials of its requests, at the proxy's upstream, behind a
//! spend guard and with the offline summariser as fallback. Real components throughout: the
//! daemon over loopback HTTP, lcm-llm's scripted upstream recording every request, and every
//! log line of the process captured (at TRACE) to check that no key is ever logged.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::{Setup, TestServer, start};
use lcm_core::config::{Config, ProviderKind};
use lcm_core::summary::Summary;
use lcm_engine::runtime::{Runtime, RuntimeOptions};
use lcm_llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The start of the summarisation prompts' system prompt (what tells a summary call apart from
/// the conversation's own calls at the upstream).
const SUMMARY_PROMPT: &str = "You write summaries of an AI coding agent";

// ---------------------------------------------------------------------------------------------
// Every log line of the process, at every level.

static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once) a TRACE subscriber for the whole process (every thread, `log` records too)
/// writing into a buffer. The tests of the binary's other modules log into it too, running
/// alongside: harmless, since the checks below look for this module's own keys (which no other
/// test uses) and for lines the proxy always logs, and no other test installs a subscriber.
fn capture_logs() {
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Capture(Arc::clone(&buffer));
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init()
            .expect("the test's log subscriber is the process's");
        buffer
    });
}

/// Everything logged so far.
fn logs() -> String {
    let buffer = LOGS.get().expect("capture_logs ran");
    String::from_utf8_lossy(&buffer.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

// ---------------------------------------------------------------------------------------------
// A daemon, an upstream, a conversation.

/// A daemon whose proxy forwards to `upstream`, scaled so that a few turns of a conversation
/// under a 2,000-token budget compact, and without the lcm tools (every call upstream is then
/// either a turn or a summary).
async fn daemon(upstream: &str, tweak: impl FnOnce(&mut Config)) -> TestServer {
    let (mut setup, tmp, root) = Setup::new();
    let config = &mut setup.config;
    config.proxy.openai_base_url = upstream.to_owned();
    config.proxy.anthropic_base_url = upstream.to_owned();
    config.proxy.timeout_s = 20;
    config.proxy.inject_tools = false;
    config.compaction.fresh_tail = 2;
    config.compaction.leaf_chunk_tokens = 400;
    config.compaction.leaf_target_tokens = 100;
    config.compaction.condensed_target_tokens = 150;
    config.runtime.heartbeat_ms = 50;
    // A failed call falls back at once.
    config.llm.max_retries = 0;
    config.llm.timeout_s = 10;
    tweak(config);
    start(setup, tmp, root).await
}

fn is_summary_call(request: &RecordedRequest) -> bool {
    let system = request
        .body
        .get("system")
        .or_else(|| request.body["messages"].get(0).map(|m| &m["content"]));
    system
        .and_then(Value::as_str)
        .is_some_and(|s| s.starts_with(SUMMARY_PROMPT))
}

fn summary_calls(upstream: &ScriptedServer) -> Vec<RecordedRequest> {
    upstream
        .requests()
        .into_iter()
        .filter(is_summary_call)
        .collect()
}

/// The upstream's answers: `summary` for summary calls, and for a turn `Noted: ` and the first
/// two words of its last user message.
fn respond(
    upstream: &ScriptedServer,
    summary: impl Fn(&RecordedRequest) -> ScriptedReply + Send + Sync + 'static,
) {
    upstream.set_default(ScriptedReply::from_fn(move |request| {
        if is_summary_call(request) {
            summary(request)
        } else {
            let text = request.last_user_text().unwrap_or_default();
            let head: Vec<&str> = text.split_whitespace().take(2).collect();
            ScriptedReply::ok(format!("Noted: {}.", head.join(" ")))
        }
    }));
}

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    OpenAi,
    Anthropic,
}

/// One client conversation through the proxy: its messages so far and its headers.
struct Conversation {
    shape: Shape,
    model: &'static str,
    headers: Vec<(&'static str, String)>,
    messages: Vec<Value>,
    turns: usize,
}

/// A user message of about 200 tokens, distinct per turn.
fn user_text(turn: usize) -> String {
    let lines: Vec<String> = (0..12)
        .map(|i| format!("step {i} of job {turn} copied shard_{turn}_{i} in {i}ms"))
        .collect();
    format!("Turn {turn}: here is the build log.\n{}", lines.join("\n"))
}

/// The answer's text in either shape.
fn answer_text(shape: Shape, answer: &Value) -> String {
    match shape {
        Shape::OpenAi => answer["choices"][0]["message"]["content"].as_str(),
        Shape::Anthropic => answer["content"][0]["text"].as_str(),
    }
    .unwrap_or_default()
    .to_owned()
}

impl Conversation {
    fn new(shape: Shape, session: &str, credentials: &[(&'static str, &str)]) -> Conversation {
        let mut headers = vec![
            ("x-lcm-session", session.to_owned()),
            ("x-lcm-budget", "2000".to_owned()),
        ];
        headers.extend(credentials.iter().map(|(n, v)| (*n, (*v).to_owned())));
        Conversation {
            shape,
            model: match shape {
                Shape::OpenAi => "gpt-client-test",
                Shape::Anthropic => "claude-client-test",
            },
            headers,
            messages: Vec::new(),
            turns: 0,
        }
    }

    /// Sends the next turn (the whole conversation, as clients do); the answer.
    async fn turn(&mut self, server: &TestServer) -> (StatusCode, reqwest::header::HeaderMap) {
        self.messages
            .push(json!({"role": "user", "content": user_text(self.turns)}));
        self.turns += 1;
        let (path, body) = match self.shape {
            Shape::OpenAi => {
                let mut messages = vec![json!({"role": "system", "content": "You read logs."})];
                messages.extend(self.messages.iter().cloned());
                (
                    "/v1/chat/completions",
                    json!({"model": self.model, "messages": messages}),
                )
            }
            Shape::Anthropic => (
                "/v1/messages",
                json!({"model": self.model, "max_tokens": 256, "system": "You read logs.",
                       "messages": self.messages}),
            ),
        };
        let mut request = server
            .client
            .post(format!("{}{path}", server.url))
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        let headers = response.headers().clone();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, StatusCode::OK, "{answer}");
        self.messages
            .push(json!({"role": "assistant", "content": answer_text(self.shape, &answer)}));
        (status, headers)
    }
}

/// Waits until no compaction runs or waits.
async fn settle(server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = server.runtime.compactor_stats().await.expect("stats");
        if stats.running == 0 && stats.queued == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "compactions never settled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Turns (each followed by its compactions) until the session holds at least `summaries`
/// summaries; the headers of the last answer.
async fn converse_until(
    server: &TestServer,
    conversation: &mut Conversation,
    key: &str,
    summaries: usize,
) -> reqwest::header::HeaderMap {
    for _ in 0..40 {
        let (_, headers) = conversation.turn(server).await;
        settle(server).await;
        if session_summaries(server, key).len() >= summaries {
            return headers;
        }
    }
    panic!(
        "fewer than {summaries} summaries after 40 turns: {:?}",
        session_summaries(server, key)
    );
}

fn session_summaries(server: &TestServer, key: &str) -> Vec<Summary> {
    let store = server.runtime.store();
    match store.session_id_for_key(key).expect("lookup") {
        Some(id) => store.session_summaries(id).expect("summaries"),
        None => Vec::new(),
    }
}

fn labels(summaries: &[Summary]) -> Vec<&str> {
    summaries.iter().map(|s| s.model.as_str()).collect()
}

/// The value of series `series` (name with labels, as written) in the daemon's metrics.
async fn metric(server: &TestServer, series: &str) -> u64 {
    let answer = server.get("/metrics").await;
    assert_eq!(answer.status, StatusCode::OK);
    let text = answer.body.as_str().expect("text").to_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Waits until `series` reaches `value` (events are counted as they arrive); its value then.
async fn metric_reaches(server: &TestServer, series: &str, value: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = metric(server, series).await;
        if now >= value || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn summarizer_header(headers: &reqwest::header::HeaderMap) -> Option<&str> {
    headers
        .get(lcm_server::SUMMARIZER_HEADER)
        .map(|v| v.to_str().expect("ASCII"))
}

/// Every file under `dir` that holds `needle`, and how many files were read.
fn files_holding(dir: &Path, needle: &[u8]) -> (Vec<String>, usize) {
    let mut found = Vec::new();
    let mut read = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read dir") {
                stack.push(entry.expect("entry").path());
            }
        } else {
            let bytes = std::fs::read(&path).expect("read file");
            read += 1;
            if bytes.windows(needle.len()).any(|w| w == needle) {
                found.push(path.display().to_string());
            }
        }
    }
    (found, read)
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compactions_summarise_with_the_clients_model_and_key_which_is_never_logged_or_stored() {
    capture_logs();
    const KEY: &str = "sk-client-key-0penai-7f3a9c1e5b2d";
    let upstream = ScriptedServer::start().await;
    respond(&upstream, |_| ScriptedReply::Echo);
    let mut server = daemon(&upstream.url(), |_| {}).await;
    let bearer = format!("Bearer {KEY}");
    let mut conversation = Conversation::new(
        Shape::OpenAi,
        "client-model-openai",
        &[("authorization", &bearer)],
    );
    // Before any compaction: no summariser to name.
    let (_, first) = conversation.turn(&server).await;
    assert_eq!(summarizer_header(&first), None);
    assert_eq!(server.runtime.session_summarizer_count(), 1);

    converse_until(&server, &mut conversation, "client-model-openai", 3).await;
    let summaries = session_summaries(&server, "client-model-openai");
    // Every summary came from the client's model...
    assert!(
        labels(&summaries)
            .iter()
            .all(|l| *l == "client:gpt-client-test"),
        "{:?}",
        labels(&summaries)
    );
    // ...through the proxy's upstream, with the client's model and key.
    let calls = summary_calls(&upstream);
    assert_eq!(calls.len(), summaries.len(), "one call per summary");
    for call in &calls {
        assert_eq!(call.path, "/v1/chat/completions");
        assert_eq!(call.body["model"], "gpt-client-test");
        assert_eq!(call.header("authorization"), Some(bearer.as_str()));
    }
    // The answers say so (read once the upstream answered), and so do the metrics.
    let (_, headers) = conversation.turn(&server).await;
    assert_eq!(summarizer_header(&headers), Some("client-model"));
    settle(&server).await;
    let written = session_summaries(&server, "client-model-openai").len() as u64;
    let ok_calls = summary_calls(&upstream).len() as u64;
    assert_eq!(
        metric_reaches(
            &server,
            "lcm_summaries_by_summarizer_total{summarizer=\"client_model\"}",
            written
        )
        .await,
        written
    );
    assert_eq!(
        metric(
            &server,
            "lcm_proxy_client_summary_calls_total{outcome=\"ok\"}"
        )
        .await,
        ok_calls
    );
    assert_eq!(
        metric(
            &server,
            "lcm_summaries_by_summarizer_total{summarizer=\"offline_fallback\"}"
        )
        .await,
        0
    );

    // The key is in no log line (and the capture works: the proxy's own lines are there).
    let logged = logs();
    assert!(logged.contains("proxy: forwarding"), "logs are captured");
    assert!(logged.contains("summarising"), "summary calls are logged");
    assert!(!logged.contains(KEY), "the client's key was logged");
    assert!(
        !logged.contains(&KEY[3..20]),
        "part of the client's key was logged"
    );

    // Nor in anything stored: every file of the data directory, the redb file included (which
    // does hold the conversation's text, so the scan would see the key if it were there).
    let data = server.data.clone();
    server.stop().await.expect("clean stop");
    let (holding_key, read) = files_holding(&data, KEY.as_bytes());
    assert!(
        read >= 2,
        "the redb file and the index were read ({read} files)"
    );
    assert_eq!(holding_key, Vec::<String>::new());
    let (holding_text, _) = files_holding(&data, b"shard_0_11");
    assert!(
        holding_text.iter().any(|f| f.ends_with("lcm.redb")),
        "{holding_text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn anthropic_clients_summaries_use_their_x_api_key() {
    capture_logs();
    const KEY: &str = "sk-ant-client-key-93be04d1a6f2";
    let upstream = ScriptedServer::start().await;
    respond(&upstream, |_| ScriptedReply::Echo);
    let server = daemon(&upstream.url(), |_| {}).await;
    let mut conversation = Conversation::new(
        Shape::Anthropic,
        "client-model-anthropic",
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
    );
    converse_until(&server, &mut conversation, "client-model-anthropic", 1).await;
    let summaries = session_summaries(&server, "client-model-anthropic");
    assert!(
        labels(&summaries)
            .iter()
            .all(|l| *l == "client:claude-client-test"),
        "{:?}",
        labels(&summaries)
    );
    let calls = summary_calls(&upstream);
    assert!(!calls.is_empty());
    for call in &calls {
        // The proxy's Anthropic upstream is its base URL + /messages.
        assert_eq!(call.path, "/v1/messages");
        assert_eq!(call.body["model"], "claude-client-test");
        assert_eq!(call.header("x-api-key"), Some(KEY));
        assert_eq!(call.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(call.header("authorization"), None);
    }
    // The compaction that wrote the newest summary may have run after that turn's answer: the
    // next answer names it.
    let (_, next) = conversation.turn(&server).await;
    assert_eq!(summarizer_header(&next), Some("client-model"));
    assert!(!logs().contains(KEY), "the client's key was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_spend_guard_stops_calls_and_the_offline_summariser_takes_over() {
    capture_logs();
    let upstream = ScriptedServer::start().await;
    respond(&upstream, |_| ScriptedReply::Echo);
    let server = daemon(&upstream.url(), |config| {
        config.proxy.summary_calls_per_window = 2;
        config.proxy.summary_window_s = 3600;
    })
    .await;
    let mut conversation = Conversation::new(
        Shape::OpenAi,
        "guarded",
        &[("authorization", "Bearer sk-guarded-0123456789")],
    );
    converse_until(&server, &mut conversation, "guarded", 5).await;
    // Exactly two calls reached the client's model; every later summary is the offline one's.
    let calls = summary_calls(&upstream);
    assert_eq!(calls.len(), 2, "the third call never reached the upstream");
    let summaries = session_summaries(&server, "guarded");
    let offline = server.runtime.summarizer().model().to_owned();
    assert_eq!(
        labels(&summaries),
        [
            vec!["client:gpt-client-test"; 2],
            vec![offline.as_str(); summaries.len() - 2]
        ]
        .concat()
    );
    let (_, headers) = conversation.turn(&server).await;
    assert_eq!(summarizer_header(&headers), Some("offline"));
    settle(&server).await;
    assert_eq!(summary_calls(&upstream).len(), 2);
    let fallbacks = session_summaries(&server, "guarded").len() as u64 - 2;
    assert_eq!(
        metric_reaches(
            &server,
            "lcm_summaries_by_summarizer_total{summarizer=\"offline_fallback\"}",
            fallbacks
        )
        .await,
        fallbacks
    );
    assert_eq!(
        metric(
            &server,
            "lcm_summaries_by_summarizer_total{summarizer=\"client_model\"}"
        )
        .await,
        2
    );
    assert!(
        metric(
            &server,
            "lcm_proxy_client_summary_calls_total{outcome=\"refused\"}"
        )
        .await
            >= fallbacks
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_upstream_falls_back_to_offline_summaries() {
    capture_logs();
    let upstream = ScriptedServer::start().await;
    // Summary calls fail in turn with a 500, a 200 that is not JSON, and a 200 with no text.
    let failures = AtomicUsize::new(0);
    respond(&upstream, move |_| {
        match failures.fetch_add(1, Ordering::SeqCst) % 3 {
            0 => ScriptedReply::status(500),
            1 => ScriptedReply::garbage("<html>upstream trouble</html>"),
            _ => ScriptedReply::Empty,
        }
    });
    let server = daemon(&upstream.url(), |_| {}).await;
    let mut conversation = Conversation::new(
        Shape::OpenAi,
        "failing",
        &[("authorization", "Bearer sk-failing-0123456789")],
    );
    converse_until(&server, &mut conversation, "failing", 3).await;
    let summaries = session_summaries(&server, "failing");
    let offline = server.runtime.summarizer().model().to_owned();
    assert!(
        labels(&summaries).iter().all(|l| *l == offline),
        "{:?}",
        labels(&summaries)
    );
    // Each summary's call went to the client's model first (and failed).
    let calls = summary_calls(&upstream).len() as u64;
    assert!(calls >= summaries.len() as u64, "{calls} calls");
    let (_, headers) = conversation.turn(&server).await;
    assert_eq!(summarizer_header(&headers), Some("offline"));
    settle(&server).await;
    let written = session_summaries(&server, "failing").len() as u64;
    let calls = summary_calls(&upstream).len() as u64;
    assert_eq!(
        metric_reaches(
            &server,
            "lcm_summaries_by_summarizer_total{summarizer=\"offline_fallback\"}",
            written
        )
        .await,
        written
    );
    // Every call that reached the upstream failed (and calls the circuit breaker kept from
    // it, after five failures in a row, failed too).
    assert!(
        metric(
            &server,
            "lcm_proxy_client_summary_calls_total{outcome=\"failed\"}"
        )
        .await
            >= calls.max(written)
    );
    for series in [
        "lcm_summaries_by_summarizer_total{summarizer=\"client_model\"}",
        "lcm_proxy_client_summary_calls_total{outcome=\"ok\"}",
    ] {
        assert_eq!(metric(&server, series).await, 0, "{series}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_sessions_summariser_is_dropped() {
    capture_logs();
    let upstream = ScriptedServer::start().await;
    respond(&upstream, |_| ScriptedReply::Echo);
    let server = daemon(&upstream.url(), |config| {
        config.proxy.summarizer_idle_s = 2;
    })
    .await;
    let mut conversation = Conversation::new(
        Shape::OpenAi,
        "idle",
        &[("authorization", "Bearer sk-idle-0123456789")],
    );
    let handle = server.runtime.session("idle").await.expect("session");
    assert!(!handle.has_summarizer());
    // Requests keep it: refreshed every 700 ms, it outlives its two-second idle time (each
    // check comes 700 ms after the last request).
    let first = Instant::now();
    for _ in 0..4 {
        conversation.turn(&server).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(handle.has_summarizer());
    }
    assert!(first.elapsed() > Duration::from_secs(2));
    // Without requests it goes.
    settle(&server).await;
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert!(!handle.has_summarizer());
    assert_eq!(server.runtime.session_summarizer_count(), 0);
    // The session's next compaction (its messages appended through the HTTP API, not the
    // proxy) is the offline summariser's, and calls nobody upstream.
    let calls = summary_calls(&upstream).len();
    let before = session_summaries(&server, "idle").len();
    let messages: Vec<Value> = (100..110)
        .map(|t| json!({"role": "user", "content": user_text(t), "key": format!("api-{t}")}))
        .collect();
    let answer = server
        .post("/v1/sessions/idle/messages", &Value::Array(messages))
        .await;
    assert!(answer.status.is_success(), "{answer:?}");
    let answer = server.get("/v1/sessions/idle/context?budget=1500").await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    settle(&server).await;
    let summaries = session_summaries(&server, "idle");
    assert!(summaries.len() > before, "a compaction ran");
    // Offline: the runtime's summariser, or the escalation's deterministic level 3.
    let offline = server.runtime.summarizer().model();
    assert!(
        summaries[before..]
            .iter()
            .all(|s| s.model == offline || s.model == lcm_llm::summarize::DETERMINISTIC_MODEL),
        "{:?}",
        labels(&summaries)
    );
    assert_eq!(summary_calls(&upstream).len(), calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_configured_llm_wins_over_the_clients_model() {
    capture_logs();
    let upstream = ScriptedServer::start().await;
    respond(&upstream, |_| ScriptedReply::Echo);
    let configured = ScriptedServer::start().await;
    let server = daemon(&upstream.url(), |config| {
        config.llm.provider = ProviderKind::Openai;
        config.llm.base_url = configured.url();
        config.llm.model = "configured-model".into();
    })
    .await;
    let mut conversation = Conversation::new(
        Shape::OpenAi,
        "configured",
        &[("authorization", "Bearer sk-configured-0123456789")],
    );
    converse_until(&server, &mut conversation, "configured", 1).await;
    assert_eq!(server.runtime.session_summarizer_count(), 0);
    assert!(summary_calls(&upstream).is_empty());
    let calls: Vec<RecordedRequest> = configured
        .requests()
        .into_iter()
        .filter(is_summary_call)
        .collect();
    assert!(!calls.is_empty());
    assert!(calls.iter().all(|c| c.body["model"] == "configured-model"));
    assert!(
        labels(&session_summaries(&server, "configured"))
            .iter()
            .all(|l| *l == "configured-model")
    );
    let (_, headers) = conversation.turn(&server).await;
    assert_eq!(summarizer_header(&headers), Some("configured"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_summary_settings_are_refused_with_a_clear_error() {
    for (text, expected) in [
        (
            "[proxy]\nsummary_calls_per_window = 100001\n",
            "proxy.summary_calls_per_window must be between 0",
        ),
        (
            "[proxy]\nsummary_window_s = 0\n",
            "proxy.summary_window_s must be between 1 and 86400",
        ),
        (
            "[proxy]\nsummarizer_idle_s = 86401\n",
            "proxy.summarizer_idle_s must be between 1 and 86400",
        ),
        ("[proxy]\nsummarizer_idle_s = -1\n", "summarizer_idle_s"),
        ("[proxy]\nsummary_calls = 3\n", "summary_calls"),
    ] {
        let error = Config::from_toml(text).expect_err(text).to_string();
        assert!(error.contains(expected), "{text}: {error}");
    }
    // The runtime (and so `lcm serve`) refuses them too.
    let mut config = Config::default();
    config.proxy.summary_window_s = 0;
    let error = Runtime::open(RuntimeOptions::in_memory(config))
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("proxy.summary_window_s"), "{error}");
    // 0 calls is valid: the client's model is never used.
    let config = Config::from_toml("[proxy]\nsummary_calls_per_window = 0\n").expect("valid");
    assert_eq!(config.proxy.summary_calls_per_window, 0);
}
