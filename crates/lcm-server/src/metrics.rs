//! `GET /metrics`: the Prometheus text exposition format (version 0.0.4), written by hand.
//!
//! Two sources: what the server counts itself (HTTP requests by route, method and status, a
//! latency histogram per route, and the runtime's events: compactions started / finished /
//! failed, summaries written by escalation level and by summariser, context tokens before and
//! after compactions, actor failures, map jobs finished; the proxy's upstream requests,
//! upstream errors, lcm tool calls, stored messages and summary calls to the client's model),
//! and what is read at scrape time (the store's totals, the supervisor's live sessions and
//! restarts, the compactor's queue, map items by status).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lcm_engine::runtime::{CompactorStats, RuntimeEvent, SupervisorStats};
use lcm_store::{MapJob, StoreStats};

/// Upper bounds of the latency histogram's buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Default)]
struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when written).
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| seconds <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

#[derive(Default)]
struct Http {
    /// (route, method, status) -> requests.
    requests: BTreeMap<(String, String, u16), u64>,
    /// route -> latency.
    latency: BTreeMap<String, Histogram>,
}

/// What the server counts between scrapes.
#[derive(Default)]
pub(crate) struct Metrics {
    http: Mutex<Http>,
    compactions_started: AtomicU64,
    compactions_finished: AtomicU64,
    compactions_failed: AtomicU64,
    actor_failures: AtomicU64,
    actor_restarts: AtomicU64,
    map_jobs_finished: AtomicU64,
    /// Summaries written by compactions at escalation levels 1, 2 and 3.
    summaries_by_level: [AtomicU64; 3],
    /// Context tokens before and after each finished compaction, summed.
    compaction_tokens_before: AtomicU64,
    compaction_tokens_after: AtomicU64,
    events_missed: AtomicU64,
    proxy: Mutex<Proxy>,
    proxy_stored: AtomicU64,
    /// Whether `[llm]` is configured (its summaries are `configured`, else `offline`).
    configured_llm: bool,
    /// Summaries written, by summariser (indexed like [`SUMMARIZERS`]).
    summaries_by_summarizer: [AtomicU64; SUMMARIZERS.len()],
    /// Summary calls meant for the client's model, by outcome (shared with the summarisers).
    client_summary_calls: Arc<SummaryCallCounters>,
}

/// Which summariser wrote a summary (the `summarizer` label of
/// `lcm_summaries_by_summarizer_total`): the client's model through the proxy, the offline
/// summariser standing in for a model (the proxy's spend guard or a failed call, or escalation
/// level 3 after a model's answers were refused), the offline summariser as the runtime's own
/// (no `[llm]`), the configured `[llm]` model, or no summariser at all (deterministic
/// truncation, the last resort of escalation level 3).
pub(crate) const SUMMARIZERS: [&str; 5] = [
    "client_model",
    "offline_fallback",
    "offline",
    "configured",
    "truncation",
];

/// The [`SUMMARIZERS`] index of a summary written at escalation `level` with model label
/// `model`, by a session's own summariser (`by_session`) or the runtime's.
pub(crate) fn summarizer_index(
    level: u8,
    model: &str,
    by_session: bool,
    configured_llm: bool,
) -> usize {
    if model == lcm_llm::summarize::DETERMINISTIC_MODEL {
        4
    } else if level >= 3 {
        // Escalation's offline summary, standing in for a summariser whose answers it refused.
        1
    } else if by_session && model.starts_with(crate::proxy::CLIENT_LABEL_PREFIX) {
        0
    } else if by_session {
        1
    } else if configured_llm {
        3
    } else {
        2
    }
}

/// Calls the proxy's summarisers meant for the client's model, by what came of them.
#[derive(Default)]
pub(crate) struct SummaryCallCounters {
    /// The client's model answered with a summary.
    pub(crate) ok: AtomicU64,
    /// The call failed (error status, timeout, transport, malformed or empty answer): the
    /// offline summariser ran instead.
    pub(crate) failed: AtomicU64,
    /// The spend guard refused the call: the offline summariser ran instead.
    pub(crate) refused: AtomicU64,
}

/// What the proxy counts.
#[derive(Default)]
struct Proxy {
    /// shape -> requests sent upstream.
    upstream_calls: BTreeMap<&'static str, u64>,
    /// (shape, kind: 4xx, 5xx, other, timeout, transport) -> failed upstream requests.
    upstream_errors: BTreeMap<(&'static str, &'static str), u64>,
    /// lcm tool -> calls the proxy ran for the model.
    tool_calls: BTreeMap<String, u64>,
}

/// What is read from the runtime at scrape time (each part optional: a scrape still answers
/// when one source is unavailable).
#[derive(Default)]
pub(crate) struct Snapshot {
    pub store: Option<StoreStats>,
    pub supervisor: Option<SupervisorStats>,
    pub compactor: Option<CompactorStats>,
    pub jobs: Option<Vec<MapJob>>,
}

impl Metrics {
    /// Counters for a daemon whose `[llm]` is configured or not (`configured_llm`).
    pub(crate) fn new(configured_llm: bool) -> Metrics {
        Metrics {
            configured_llm,
            ..Metrics::default()
        }
    }

    /// The counters of summary calls meant for the client's model (the proxy's summarisers
    /// count into them).
    pub(crate) fn client_summary_calls(&self) -> Arc<SummaryCallCounters> {
        Arc::clone(&self.client_summary_calls)
    }

    /// Counts one answered request.
    pub(crate) fn record_request(&self, route: &str, method: &str, status: u16, took: Duration) {
        let mut http = self.http.lock().unwrap_or_else(|p| p.into_inner());
        *http
            .requests
            .entry((route.to_owned(), method.to_owned(), status))
            .or_default() += 1;
        http.latency
            .entry(route.to_owned())
            .or_default()
            .observe(took.as_secs_f64());
    }

    /// Counts one runtime event.
    pub(crate) fn record_event(&self, event: &RuntimeEvent) {
        if let RuntimeEvent::SummaryWritten {
            level,
            model,
            session_summarizer,
            ..
        } = event
        {
            let index = summarizer_index(*level, model, *session_summarizer, self.configured_llm);
            self.summaries_by_summarizer[index].fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let RuntimeEvent::CompactionFinished {
            summaries_by_level,
            tokens_before,
            tokens_after,
            ..
        } = event
        {
            for (counter, n) in self.summaries_by_level.iter().zip(summaries_by_level) {
                counter.fetch_add(u64::from(*n), Ordering::Relaxed);
            }
            self.compaction_tokens_before
                .fetch_add(*tokens_before, Ordering::Relaxed);
            self.compaction_tokens_after
                .fetch_add(*tokens_after, Ordering::Relaxed);
        }
        let counter = match event {
            RuntimeEvent::CompactionStarted { .. } => &self.compactions_started,
            RuntimeEvent::CompactionFinished { .. } => &self.compactions_finished,
            RuntimeEvent::CompactionFailed { .. } => &self.compactions_failed,
            RuntimeEvent::ActorFailed { .. } => &self.actor_failures,
            RuntimeEvent::ActorRestarted { .. } => &self.actor_restarts,
            RuntimeEvent::MapFinished { .. } => &self.map_jobs_finished,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn proxy(&self) -> std::sync::MutexGuard<'_, Proxy> {
        self.proxy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts one request the proxy sent upstream.
    pub(crate) fn record_upstream_call(&self, shape: &'static str) {
        *self.proxy().upstream_calls.entry(shape).or_default() += 1;
    }

    /// Counts one failed upstream request (`kind`: 4xx, 5xx, other, timeout, transport).
    pub(crate) fn record_upstream_error(&self, shape: &'static str, kind: &'static str) {
        *self
            .proxy()
            .upstream_errors
            .entry((shape, kind))
            .or_default() += 1;
    }

    /// Counts one lcm tool call the proxy ran for the model.
    pub(crate) fn record_proxy_tool_call(&self, tool: &str) {
        *self.proxy().tool_calls.entry(tool.to_owned()).or_default() += 1;
    }

    /// Counts messages the proxy stored.
    pub(crate) fn record_proxy_stored(&self, messages: u64) {
        self.proxy_stored.fetch_add(messages, Ordering::Relaxed);
    }

    /// Counts events the server's subscription missed (it lagged behind the runtime).
    pub(crate) fn record_missed(&self, missed: u64) {
        self.events_missed.fetch_add(missed, Ordering::Relaxed);
    }

    /// The exposition text.
    pub(crate) fn render(&self, snapshot: &Snapshot) -> String {
        let mut out = String::with_capacity(4096);
        if let Some(stats) = &snapshot.store {
            gauge(&mut out, "lcm_sessions", "Sessions stored.", stats.sessions);
            gauge(&mut out, "lcm_messages", "Messages stored.", stats.messages);
            gauge(
                &mut out,
                "lcm_tokens_stored",
                "Tokens of every stored message (counted once at ingest).",
                stats.tokens,
            );
            gauge(
                &mut out,
                "lcm_index_watermark",
                "Messages below this number are in the search index.",
                stats.index_watermark.get(),
            );
        }
        if let Some(stats) = &snapshot.supervisor {
            gauge(
                &mut out,
                "lcm_live_session_actors",
                "Session actors alive now.",
                stats.live_sessions as u64,
            );
            gauge(
                &mut out,
                "lcm_quarantined_sessions",
                "Sessions refused after failing too often.",
                stats.quarantined_sessions as u64,
            );
            header(
                &mut out,
                "lcm_actor_restarts_total",
                "Actor restarts since the runtime started, by actor kind.",
                "counter",
            );
            for (kind, restarts) in &stats.restarts {
                let _ = writeln!(
                    out,
                    "lcm_actor_restarts_total{{kind=\"{}\"}} {restarts}",
                    escape(&kind.to_string())
                );
            }
            counter(
                &mut out,
                "lcm_actor_stalls_total",
                "Actors killed as stuck.",
                stats.stalls,
            );
        }
        if let Some(stats) = &snapshot.compactor {
            gauge(
                &mut out,
                "lcm_compactions_running",
                "Compactions running now.",
                stats.running as u64,
            );
            gauge(
                &mut out,
                "lcm_compactions_queued",
                "Compactions waiting for a slot.",
                stats.queued as u64,
            );
        }
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        counter(
            &mut out,
            "lcm_compactions_started_total",
            "Compactions started (runtime events seen by this server).",
            load(&self.compactions_started),
        );
        counter(
            &mut out,
            "lcm_compactions_finished_total",
            "Compactions finished.",
            load(&self.compactions_finished),
        );
        counter(
            &mut out,
            "lcm_compactions_failed_total",
            "Compactions failed after their attempts.",
            load(&self.compactions_failed),
        );
        header(
            &mut out,
            "lcm_summaries_written_total",
            "Summaries compactions wrote, by escalation level (1 normal, 2 aggressive, 3 no model: the offline summary or truncation).",
            "counter",
        );
        for (level, n) in self.summaries_by_level.iter().enumerate() {
            let _ = writeln!(
                out,
                "lcm_summaries_written_total{{level=\"{}\"}} {}",
                level + 1,
                load(n)
            );
        }
        header(
            &mut out,
            "lcm_summaries_by_summarizer_total",
            "Summaries compactions wrote, by summariser (client_model: the client's model through the proxy; offline_fallback: the offline summariser standing in for a model that failed, was refused by the spend guard or wrote no usable summary; offline: the offline summariser; configured: the [llm] model; truncation: not even the offline summary was smaller).",
            "counter",
        );
        for (name, n) in SUMMARIZERS.iter().zip(&self.summaries_by_summarizer) {
            let _ = writeln!(
                out,
                "lcm_summaries_by_summarizer_total{{summarizer=\"{name}\"}} {}",
                load(n)
            );
        }
        counter(
            &mut out,
            "lcm_compaction_context_tokens_before_total",
            "Context tokens when finished compactions started, summed (compare with _after_total).",
            load(&self.compaction_tokens_before),
        );
        counter(
            &mut out,
            "lcm_compaction_context_tokens_after_total",
            "Context tokens after finished compactions, summed.",
            load(&self.compaction_tokens_after),
        );
        counter(
            &mut out,
            "lcm_actor_failures_total",
            "Actor failures (panics, errors, stalls).",
            load(&self.actor_failures),
        );
        counter(
            &mut out,
            "lcm_actor_restart_events_total",
            "Actor restarts (runtime events seen by this server).",
            load(&self.actor_restarts),
        );
        counter(
            &mut out,
            "lcm_map_jobs_finished_total",
            "Map job runs that ended.",
            load(&self.map_jobs_finished),
        );
        counter(
            &mut out,
            "lcm_runtime_events_missed_total",
            "Runtime events the server's subscription missed (counters above may be low by that much).",
            load(&self.events_missed),
        );
        if let Some(jobs) = &snapshot.jobs {
            let mut items = [0u64; 4];
            let mut by_status: BTreeMap<&str, u64> = BTreeMap::new();
            for job in jobs {
                let p = &job.progress;
                items[0] += p.pending;
                items[1] += p.running;
                items[2] += p.completed;
                items[3] += p.failed;
                *by_status.entry(job.status.as_str()).or_default() += 1;
            }
            header(
                &mut out,
                "lcm_map_items",
                "Items of every map job, by status.",
                "gauge",
            );
            for (status, n) in ["pending", "running", "completed", "failed"]
                .iter()
                .zip(items)
            {
                let _ = writeln!(out, "lcm_map_items{{status=\"{status}\"}} {n}");
            }
            header(&mut out, "lcm_map_jobs", "Map jobs, by status.", "gauge");
            for status in ["preparing", "running", "completed", "cancelled", "failed"] {
                let n = by_status.get(status).copied().unwrap_or(0);
                let _ = writeln!(out, "lcm_map_jobs{{status=\"{status}\"}} {n}");
            }
        }
        self.render_proxy(&mut out);
        self.render_http(&mut out);
        out
    }

    fn render_proxy(&self, out: &mut String) {
        counter(
            out,
            "lcm_proxy_messages_stored_total",
            "Messages the proxy stored (new client messages and upstream answers).",
            self.proxy_stored.load(Ordering::Relaxed),
        );
        header(
            out,
            "lcm_proxy_client_summary_calls_total",
            "Summary calls meant for the client's model, by outcome (ok; failed or refused by the spend guard: the offline summariser ran instead).",
            "counter",
        );
        let calls = &self.client_summary_calls;
        for (outcome, n) in [
            ("ok", &calls.ok),
            ("failed", &calls.failed),
            ("refused", &calls.refused),
        ] {
            let _ = writeln!(
                out,
                "lcm_proxy_client_summary_calls_total{{outcome=\"{outcome}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let proxy = self.proxy();
        header(
            out,
            "lcm_proxy_upstream_requests_total",
            "Requests the proxy sent upstream, by API shape.",
            "counter",
        );
        for (shape, n) in &proxy.upstream_calls {
            let _ = writeln!(
                out,
                "lcm_proxy_upstream_requests_total{{shape=\"{shape}\"}} {n}"
            );
        }
        header(
            out,
            "lcm_proxy_upstream_errors_total",
            "Upstream requests that failed (an error status, a timeout, a transport error), by API shape and kind.",
            "counter",
        );
        for ((shape, kind), n) in &proxy.upstream_errors {
            let _ = writeln!(
                out,
                "lcm_proxy_upstream_errors_total{{shape=\"{shape}\",kind=\"{kind}\"}} {n}"
            );
        }
        header(
            out,
            "lcm_proxy_tool_calls_total",
            "lcm tool calls the proxy ran for the model, by tool.",
            "counter",
        );
        for (tool, n) in &proxy.tool_calls {
            let _ = writeln!(
                out,
                "lcm_proxy_tool_calls_total{{tool=\"{}\"}} {n}",
                escape(tool)
            );
        }
    }

    fn render_http(&self, out: &mut String) {
        let http = self.http.lock().unwrap_or_else(|p| p.into_inner());
        header(
            out,
            "lcm_http_requests_total",
            "HTTP requests answered, by route, method and status.",
            "counter",
        );
        for ((route, method, status), n) in &http.requests {
            let _ = writeln!(
                out,
                "lcm_http_requests_total{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {n}",
                escape(route),
                escape(method)
            );
        }
        header(
            out,
            "lcm_http_request_duration_seconds",
            "Time to answer a request (to the response head; event streams count until they open), by route.",
            "histogram",
        );
        for (route, h) in &http.latency {
            let route = escape(route);
            let mut cumulative = 0;
            for (bound, n) in LATENCY_BUCKETS.iter().zip(h.buckets) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "lcm_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "lcm_http_request_duration_seconds_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "lcm_http_request_duration_seconds_sum{{route=\"{route}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "lcm_http_request_duration_seconds_count{{route=\"{route}\"}} {}",
                h.count
            );
        }
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name} {value}");
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_labels_escaped() {
        let metrics = Metrics::default();
        metrics.record_request("/a", "GET", 200, Duration::from_millis(2));
        metrics.record_request("/a", "GET", 200, Duration::from_millis(200));
        metrics.record_request("/a", "GET", 404, Duration::from_secs(100));
        metrics.record_request("x\"y", "GET", 200, Duration::from_millis(1));
        let text = metrics.render(&Snapshot::default());
        assert!(
            text.contains("lcm_http_requests_total{route=\"/a\",method=\"GET\",status=\"200\"} 2")
        );
        assert!(
            text.contains("lcm_http_request_duration_seconds_bucket{route=\"/a\",le=\"0.005\"} 1")
        );
        assert!(
            text.contains("lcm_http_request_duration_seconds_bucket{route=\"/a\",le=\"0.25\"} 2")
        );
        assert!(
            text.contains("lcm_http_request_duration_seconds_bucket{route=\"/a\",le=\"60\"} 2")
        );
        assert!(
            text.contains("lcm_http_request_duration_seconds_bucket{route=\"/a\",le=\"+Inf\"} 3")
        );
        assert!(text.contains("lcm_http_request_duration_seconds_count{route=\"/a\"} 3"));
        assert!(text.contains("route=\"x\\\"y\""));
    }

    #[test]
    fn summaries_are_counted_by_summarizer() {
        let written = |level, model: &str, session_summarizer| RuntimeEvent::SummaryWritten {
            session: lcm_core::ids::SessionId(1),
            summary: lcm_core::ids::SummaryId(1),
            level,
            model: model.into(),
            session_summarizer,
        };
        let metrics = Metrics::new(false);
        for event in [
            written(1, "client:gpt-test", true),
            written(2, "client:gpt-test", true),
            written(1, "extractive", true),
            written(1, "extractive", false),
            written(3, "deterministic", true),
        ] {
            metrics.record_event(&event);
        }
        metrics
            .client_summary_calls()
            .refused
            .fetch_add(2, Ordering::Relaxed);
        let text = metrics.render(&Snapshot::default());
        for line in [
            "lcm_summaries_by_summarizer_total{summarizer=\"client_model\"} 2",
            "lcm_summaries_by_summarizer_total{summarizer=\"offline_fallback\"} 1",
            "lcm_summaries_by_summarizer_total{summarizer=\"offline\"} 1",
            "lcm_summaries_by_summarizer_total{summarizer=\"configured\"} 0",
            "lcm_summaries_by_summarizer_total{summarizer=\"truncation\"} 1",
            "lcm_proxy_client_summary_calls_total{outcome=\"refused\"} 2",
            "lcm_proxy_client_summary_calls_total{outcome=\"ok\"} 0",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        let configured = Metrics::new(true);
        configured.record_event(&written(1, "gpt-4o", false));
        // Escalation refused the model's answers: level 3's offline summary stands in for it.
        configured.record_event(&written(3, "structured", false));
        let text = configured.render(&Snapshot::default());
        assert!(text.contains("lcm_summaries_by_summarizer_total{summarizer=\"configured\"} 1"));
        assert!(
            text.contains("lcm_summaries_by_summarizer_total{summarizer=\"offline_fallback\"} 1")
        );
        assert!(text.contains("lcm_summaries_by_summarizer_total{summarizer=\"truncation\"} 0"));
    }
}
