//! A load generator for the daemon: N concurrent clients, each with a session of its own,
//! appending messages one request at a time (each with a source key) and asking for the
//! assembled context at regular intervals, over real HTTP on loopback. Used by the load test
//! (`tests/it/load.rs`, small), the load benchmark (`benches/load.rs`, 100 x 1,000) and the
//! soak (`benches/soak.rs`, rounds of it against an `lcm serve` process for 30 minutes).

use std::time::{Duration, Instant};

use lcm_core::rng::work_words;
use reqwest::Method;
use serde_json::json;

use super::TestServer;

/// The shape of a load run.
#[derive(Debug, Clone, Copy)]
pub struct LoadShape {
    /// Concurrent clients, one session each.
    pub clients: usize,
    /// Appends per client (one message per request).
    pub appends: usize,
    /// Context assemblies per client, spread evenly over its appends.
    pub assemblies: usize,
    /// The budget of each assembly, tokens.
    pub budget: u64,
    /// The turn number of each client's first append (0 for a fresh run; a later round of the
    /// same sessions starts past the turns already sent, so its source keys are new).
    pub first_turn: usize,
}

/// Where a load run sends its requests.
#[derive(Debug, Clone)]
pub struct LoadTarget {
    /// The daemon's base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The bearer token, if the daemon wants one.
    pub token: Option<String>,
    /// The HTTP client (its connection pool is shared by every client of the run).
    pub http: reqwest::Client,
}

/// What a load run measured.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Wall time of the whole run (all clients).
    pub elapsed: Duration,
    /// Latency of each successful append request.
    pub appends: Vec<Duration>,
    /// Latency of each successful context request.
    pub assemblies: Vec<Duration>,
    /// The most tokens any assembled context held.
    pub max_context_tokens: u64,
    /// Every failed request: what it was and what came back.
    pub errors: Vec<String>,
}

// The figures the benchmark prints; the test checks what was stored, not how fast.
#[allow(dead_code)]
impl LoadReport {
    /// The `p`-th percentile (0..=100) of `samples`.
    pub fn percentile(samples: &[Duration], p: f64) -> Duration {
        if samples.is_empty() {
            return Duration::ZERO;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        sorted[rank.min(sorted.len() - 1)]
    }

    /// Requests per second over the whole run.
    pub fn requests_per_s(&self) -> f64 {
        (self.appends.len() + self.assemblies.len()) as f64 / self.elapsed.as_secs_f64()
    }
}

/// A message of plausible size and vocabulary (about 40 tokens), different on every turn.
pub fn message_text(client: usize, turn: usize) -> String {
    let seed = ((client as u64) << 32) | turn as u64;
    format!(
        "client {client} turn {turn}: {} ref LOAD-{client}-{turn}.",
        work_words(seed, 24)
    )
}

/// The key of a load client's session.
pub fn session_key(client: usize) -> String {
    format!("load-{client}")
}

/// Runs `shape` against `server`; every client's requests run one after another, the clients
/// at once.
pub async fn run(server: &TestServer, shape: LoadShape) -> LoadReport {
    let target = LoadTarget {
        url: server.url.clone(),
        token: server.token.clone(),
        http: server.client.clone(),
    };
    run_at(&target, shape).await
}

/// Runs `shape` against the daemon at `target` (see [`run`]).
pub async fn run_at(target: &LoadTarget, shape: LoadShape) -> LoadReport {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..shape.clients {
        let url = target.url.clone();
        let token = target.token.clone();
        let http = target.http.clone();
        tasks.spawn(async move { one_client(&http, &url, token.as_deref(), client, shape).await });
    }
    let mut report = LoadReport::default();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(client) => {
                report.appends.extend(client.appends);
                report.assemblies.extend(client.assemblies);
                report.max_context_tokens =
                    report.max_context_tokens.max(client.max_context_tokens);
                report.errors.extend(client.errors);
            }
            Err(e) => report.errors.push(format!("a client task failed: {e}")),
        }
    }
    report.elapsed = started.elapsed();
    report
}

async fn one_client(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    client: usize,
    shape: LoadShape,
) -> LoadReport {
    let mut report = LoadReport::default();
    let key = session_key(client);
    let send = |method: Method, path: String, body: Option<String>| {
        let mut request = http.request(method, format!("{url}{path}"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        request.send()
    };
    // A later round appends to the session its first round created.
    if shape.first_turn == 0 {
        let created = send(
            Method::POST,
            "/v1/sessions".into(),
            Some(json!({ "key": key }).to_string()),
        )
        .await;
        if let Err(e) = created.and_then(|r| r.error_for_status()) {
            report
                .errors
                .push(format!("{key}: creating the session: {e}"));
            return report;
        }
    }
    // An assembly after every `every` appends (none when no assembly is asked for).
    let every = shape
        .appends
        .checked_div(shape.assemblies)
        .map_or(usize::MAX, |n| n.max(1));
    let mut assembled = 0;
    for turn in shape.first_turn..shape.first_turn + shape.appends {
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        let body =
            json!({"role": role, "content": message_text(client, turn), "key": format!("t{turn}")});
        let t = Instant::now();
        let answer = send(
            Method::POST,
            format!("/v1/sessions/{key}/messages"),
            Some(body.to_string()),
        )
        .await;
        match answer {
            Ok(r) if r.status().is_success() => {
                let _ = r.bytes().await;
                report.appends.push(t.elapsed());
            }
            Ok(r) => report
                .errors
                .push(format!("{key} append {turn}: status {}", r.status())),
            Err(e) => report.errors.push(format!("{key} append {turn}: {e}")),
        }
        if (turn - shape.first_turn + 1).is_multiple_of(every) && assembled < shape.assemblies {
            assembled += 1;
            let t = Instant::now();
            let answer = send(
                Method::GET,
                format!("/v1/sessions/{key}/context?budget={}", shape.budget),
                None,
            )
            .await;
            match answer {
                Ok(r) if r.status().is_success() => match r.json::<serde_json::Value>().await {
                    Ok(body) => {
                        report.assemblies.push(t.elapsed());
                        let tokens = body["tokens"].as_u64().unwrap_or(u64::MAX);
                        report.max_context_tokens = report.max_context_tokens.max(tokens);
                    }
                    Err(e) => report.errors.push(format!("{key} context: body: {e}")),
                },
                Ok(r) => report
                    .errors
                    .push(format!("{key} context: status {}", r.status())),
                Err(e) => report.errors.push(format!("{key} context: {e}")),
            }
        }
    }
    report
}
