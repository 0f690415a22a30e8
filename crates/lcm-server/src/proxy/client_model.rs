//! Summaries with the client's own model.
//!
//! When `[llm]` is not configured (provider `extractive`, the default), the runtime summarises
//! offline. The proxy sees more: every request names the client's model and carries its
//! credentials for the upstream. So each proxied request registers, for its session, a
//! summariser over that model ([`ClientModelSummarizer`]: lcm-llm's OpenAI or Anthropic client
//! and [`LlmSummarizer`], at the upstream the proxy forwards to, with the client's key), behind
//! a spend guard and the offline fallback ([`GuardedSummarizer`]). The session's compactions
//! then summarise with it until it idles out (`proxy.summarizer_idle_s` without a request of
//! that session; see `lcm_engine::runtime::SessionHandle::refresh_summarizer`).
//!
//! - **Only without `[llm]`.** A configured model always wins: nothing is registered.
//! - **Credentials in memory only.** The key lives in the registered summariser's HTTP client
//!   (headers marked sensitive) and nowhere else: never logged (every `Debug` here redacts it),
//!   never stored, dropped with the registration. OpenAI shape: `Authorization: Bearer KEY`
//!   (not when that header carried lcm's own token); Anthropic shape: `x-api-key` (the client
//!   sends `anthropic-version: 2023-06-01`, the one version lcm-llm speaks). A request without
//!   a credential, a model, or with a model name over 256 bytes registers nothing (its
//!   session's summaries are offline). Redirects are not followed, so the key never goes
//!   anywhere but the configured upstream.
//! - **Spend guard.** At most `proxy.summary_calls_per_window` calls per session within any
//!   `proxy.summary_window_s` seconds (a sliding window) reach the client's model.
//! - **Fallback.** A call the guard refuses, or that fails in any way (error status, timeout,
//!   transport error, malformed answer, no text), is answered by the runtime's offline
//!   summariser instead, so the summary is still written. The summariser's label says which one
//!   ran: `client:<model>` after a call the client's model answered, the offline summariser's
//!   own label otherwise; it is what the summary records as its model.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};
use lcm_core::config::{Config, ProviderKind};
use lcm_core::ids::SessionId;
use lcm_core::tokens::TokenCounter;
use lcm_engine::runtime::SessionHandle;
use lcm_llm::anthropic::AnthropicProvider;
use lcm_llm::http::HttpConfig;
use lcm_llm::openai::OpenAiProvider;
use lcm_llm::provider::{Completion, Provider, ProviderError};
use lcm_llm::summarize::{DETERMINISTIC_MODEL, LlmSummarizer, Summarizer, SummaryCall};
use serde_json::{Map, Value};

use super::shape::Shape;
use crate::metrics::SummaryCallCounters;

/// The prefix of the model label of summaries the client's model wrote (`client:<model>`).
pub const CLIENT_LABEL_PREFIX: &str = "client:";

/// Longest model name the client's summariser is built for.
const MAX_MODEL_BYTES: usize = 256;

/// How often (in admitted calls) the spend guard forgets sessions whose window is empty.
const PRUNE_EVERY: u64 = 1024;

/// The client's credential for its upstream.
enum Credential {
    /// OpenAI shape: `Authorization: Bearer KEY`.
    Bearer(String),
    /// Anthropic shape: `x-api-key: KEY`.
    ApiKey(String),
}

impl Credential {
    fn secret(&self) -> &str {
        match self {
            Credential::Bearer(key) | Credential::ApiKey(key) => key,
        }
    }
}

/// What one proxied request says about the client's model: where it lives, its name, and the
/// client's credential for it.
pub(crate) struct ClientModel {
    shape: Shape,
    /// The upstream's base URL (`proxy.openai_base_url` / `proxy.anthropic_base_url`).
    base_url: String,
    /// The upstream endpoint the proxy forwards to (base URL + `/chat/completions` or
    /// `/messages`).
    endpoint: String,
    model: String,
    credential: Credential,
}

impl std::fmt::Debug for ClientModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientModel")
            .field("shape", &self.shape)
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("credential", &"<redacted>")
            .finish()
    }
}

impl ClientModel {
    /// The client's model of a request of `shape` (its body without `messages` is `base`),
    /// or `None` when the request names no usable model or carries no credential of its own
    /// (`strip_authorization`: `Authorization` carried lcm's token, not the client's key).
    pub(crate) fn from_request(
        shape: Shape,
        config: &Config,
        base: &Map<String, Value>,
        headers: &HeaderMap,
        strip_authorization: bool,
    ) -> Option<ClientModel> {
        let model = base.get("model")?.as_str()?.trim();
        if model.is_empty()
            || model.len() > MAX_MODEL_BYTES
            || model.chars().any(|c| c.is_control())
        {
            return None;
        }
        let credential = match shape {
            Shape::OpenAi if !strip_authorization => {
                let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
                let (scheme, key) = value.split_once(' ')?;
                let key = key.trim();
                (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty())
                    .then(|| Credential::Bearer(key.to_owned()))?
            }
            Shape::OpenAi => return None,
            Shape::Anthropic => {
                let key = headers.get("x-api-key")?.to_str().ok()?.trim();
                (!key.is_empty()).then(|| Credential::ApiKey(key.to_owned()))?
            }
        };
        let base_url = match shape {
            Shape::OpenAi => &config.proxy.openai_base_url,
            Shape::Anthropic => &config.proxy.anthropic_base_url,
        }
        .trim()
        .trim_end_matches('/')
        .to_owned();
        Some(ClientModel {
            shape,
            endpoint: format!("{base_url}{}", shape.endpoint()),
            base_url,
            model: model.to_owned(),
            credential,
        })
    }

    /// A fingerprint of what a summariser is built from (shape, model, credential), keyed by
    /// `keys` (random per process): equal for requests a registered summariser serves as is.
    fn tag(&self, keys: &RandomState) -> u64 {
        keys.hash_one((self.shape.name(), &self.model, self.credential.secret()))
    }
}

/// A summariser over the client's model, at the upstream the proxy forwards to, with the
/// client's credentials; labelled `client:<model>`. Built per session from one request (see
/// the module documentation); its `Debug` never shows the key.
pub(crate) struct ClientModelSummarizer {
    inner: LlmSummarizer,
    label: String,
    endpoint: String,
}

impl std::fmt::Debug for ClientModelSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientModelSummarizer")
            .field("label", &self.label)
            .field("endpoint", &self.endpoint)
            .field("credential", &"<redacted>")
            .finish()
    }
}

impl ClientModelSummarizer {
    /// The summariser for `client`, with the timeout and retries of `config.llm`
    /// (`llm.timeout_s`, `llm.max_retries`) and no redirects followed.
    pub(crate) fn new(
        client: ClientModel,
        config: &Config,
        counter: TokenCounter,
    ) -> Result<ClientModelSummarizer, ProviderError> {
        let ClientModel {
            shape,
            base_url,
            endpoint,
            model,
            credential,
        } = client;
        let http = HttpConfig::new(base_url, model.clone())
            .with_api_key(credential.secret())
            .with_timeout(Duration::from_secs(config.llm.timeout_s.max(1)))
            .with_max_retries(config.llm.max_retries)
            .with_redirects(false);
        let provider: Arc<dyn Provider> = match shape {
            Shape::OpenAi => Arc::new(OpenAiProvider::new(http)?),
            Shape::Anthropic => {
                Arc::new(AnthropicProvider::new(http)?.with_endpoint(endpoint.clone()))
            }
        };
        let label = format!("{CLIENT_LABEL_PREFIX}{model}");
        Ok(ClientModelSummarizer {
            inner: LlmSummarizer::new(provider, counter, label.clone()),
            label,
            endpoint,
        })
    }
}

#[async_trait::async_trait]
impl Summarizer for ClientModelSummarizer {
    fn model(&self) -> &str {
        &self.label
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        self.inner.summarize(call).await
    }
}

/// At most `limit` calls per session within any `window` (a sliding window of call times).
pub(crate) struct SpendGuard {
    limit: u32,
    window: Duration,
    calls: Mutex<HashMap<SessionId, VecDeque<Instant>>>,
    admitted: AtomicU64,
}

impl SpendGuard {
    pub(crate) fn new(limit: u32, window: Duration) -> SpendGuard {
        SpendGuard {
            limit,
            window,
            calls: Mutex::new(HashMap::new()),
            admitted: AtomicU64::new(0),
        }
    }

    /// Whether `session` may make one more call now (and counts it if so).
    pub(crate) fn admit(&self, session: SessionId) -> bool {
        if self.limit == 0 {
            return false;
        }
        let now = Instant::now();
        let window = self.window;
        let recent = |times: &mut VecDeque<Instant>| {
            while times
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) >= window)
            {
                times.pop_front();
            }
        };
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if self.admitted.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1 {
            calls.retain(|_, times| {
                recent(times);
                !times.is_empty()
            });
        }
        let times = calls.entry(session).or_default();
        recent(times);
        if times.len() < self.limit as usize {
            times.push_back(now);
            true
        } else {
            false
        }
    }
}

/// The summariser the proxy registers for a session: the client's model behind the spend
/// guard, with the runtime's (offline) summariser answering every call the guard refuses or
/// the client's model fails. Its label is the client's (`client:<model>`) after a call the
/// client's model answered and the fallback's otherwise, so the label the escalation records
/// with a summary (read right after the call that produced it; a session's calls never
/// overlap: one compaction runs per session) names the summariser that wrote it.
pub(crate) struct GuardedSummarizer {
    client: ClientModelSummarizer,
    fallback: Arc<dyn Summarizer>,
    guard: Arc<SpendGuard>,
    counters: Arc<SummaryCallCounters>,
    session: SessionId,
    /// Whether the last call was answered by the client's model.
    last_client: AtomicBool,
}

impl std::fmt::Debug for GuardedSummarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedSummarizer")
            .field("client", &self.client)
            .field("fallback", &self.fallback.model())
            .field("session", &self.session)
            .finish()
    }
}

#[async_trait::async_trait]
impl Summarizer for GuardedSummarizer {
    fn model(&self) -> &str {
        if self.last_client.load(Ordering::Acquire) {
            self.client.model()
        } else {
            self.fallback.model()
        }
    }

    fn is_offline(&self) -> bool {
        !self.last_client.load(Ordering::Acquire) && self.fallback.is_offline()
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        if self.guard.admit(self.session) {
            // Only the error's kind is logged: an upstream's error text is not ours to copy.
            let reason = match self.client.summarize(call).await {
                Ok(completion) if !completion.text.trim().is_empty() => {
                    self.counters.ok.fetch_add(1, Ordering::Relaxed);
                    self.last_client.store(true, Ordering::Release);
                    return Ok(completion);
                }
                Ok(completion) if completion.is_reasoning_only() => "reasoning_only",
                Ok(_) => "empty",
                Err(error) => error.kind(),
            };
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                session = %self.session,
                model = self.client.model(),
                reason,
                "proxy: the client's model did not summarise; the offline summariser does"
            );
        } else {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                session = %self.session,
                "proxy: summary call budget of the window spent; the offline summariser does"
            );
        }
        self.last_client.store(false, Ordering::Release);
        self.fallback.summarize(call).await
    }
}

/// The proxy's side of client-model summaries (one per daemon): the spend guard, the call
/// counters, and the key of the registration fingerprints.
pub(crate) struct ClientSummaries {
    /// Whether proxied sessions get a client-model summariser (`[llm]` not configured and
    /// `proxy.summary_calls_per_window` above 0).
    enabled: bool,
    idle: Duration,
    guard: Arc<SpendGuard>,
    counters: Arc<SummaryCallCounters>,
    keys: RandomState,
}

impl ClientSummaries {
    pub(crate) fn new(config: &Config, counters: Arc<SummaryCallCounters>) -> ClientSummaries {
        let proxy = &config.proxy;
        ClientSummaries {
            enabled: config.llm.provider == ProviderKind::Extractive
                && proxy.summary_calls_per_window > 0,
            idle: Duration::from_secs(proxy.summarizer_idle_s),
            guard: Arc::new(SpendGuard::new(
                proxy.summary_calls_per_window,
                Duration::from_secs(proxy.summary_window_s),
            )),
            counters,
            keys: RandomState::new(),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Registers (or refreshes) `client` as the summariser of `handle`'s session, falling back
    /// to `fallback`. A summariser that cannot be built is logged and left out (the session's
    /// summaries stay offline).
    pub(crate) fn register(
        &self,
        handle: &SessionHandle,
        client: ClientModel,
        config: &Config,
        fallback: &Arc<dyn Summarizer>,
    ) {
        if !self.enabled {
            return;
        }
        let tag = client.tag(&self.keys);
        let model = client.model.clone();
        let built = handle.refresh_summarizer(tag, self.idle, || {
            let counter = TokenCounter::new(config.tokenizer.encoding());
            let client = ClientModelSummarizer::new(client, config, counter)?;
            Ok::<Arc<dyn Summarizer>, ProviderError>(Arc::new(GuardedSummarizer {
                client,
                fallback: Arc::clone(fallback),
                guard: Arc::clone(&self.guard),
                counters: Arc::clone(&self.counters),
                session: handle.id(),
                last_client: AtomicBool::new(false),
            }))
        });
        match built {
            Ok(true) => {
                tracing::debug!(session = %handle.id(), %model, "proxy: the client's model summarises this session")
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(
                session = %handle.id(),
                %model,
                kind = error.kind(),
                "proxy: cannot summarise with the client's model; summaries stay offline"
            ),
        }
    }
}

/// The header naming the summariser of the session's most recent summary.
pub const SUMMARIZER_HEADER: &str = "x-lcm-summarizer";

/// The [`SUMMARIZER_HEADER`] value for a summary written at escalation `level` with model label
/// `model`: `client-model` (the client's model), `configured` (the `[llm]` model), `offline`
/// (the offline summariser, also when it stood in for the client's model or for a model whose
/// answers escalation refused), or `truncation` (not even the offline summary was smaller:
/// deterministic truncation).
pub(crate) fn summarizer_header(level: u8, model: &str, configured_llm: bool) -> &'static str {
    if model == DETERMINISTIC_MODEL {
        "truncation"
    } else if level >= 3 {
        "offline"
    } else if model.starts_with(CLIENT_LABEL_PREFIX) {
        "client-model"
    } else if configured_llm {
        "configured"
    } else {
        "offline"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;
    use lcm_llm::extractive::ExtractiveSummarizer;
    use lcm_llm::summarize::EscalationLevel;
    use serde_json::json;

    const KEY: &str = "sk-client-secret-0123456789";

    fn base(model: Value) -> Map<String, Value> {
        let Value::Object(base) = json!({ "model": model }) else {
            unreachable!()
        };
        base
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn credentials_and_models_come_from_the_request() {
        let config = Config::default();
        let bearer = headers(&[("authorization", &format!("Bearer {KEY}"))]);
        let client = ClientModel::from_request(
            Shape::OpenAi,
            &config,
            &base(json!("gpt-x")),
            &bearer,
            false,
        )
        .expect("a client model");
        assert_eq!(
            client.endpoint,
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(client.credential.secret(), KEY);
        let shown = format!("{client:?}");
        assert!(!shown.contains(KEY) && shown.contains("gpt-x"), "{shown}");
        // Authorization carrying lcm's token is not the client's key.
        assert!(
            ClientModel::from_request(Shape::OpenAi, &config, &base(json!("m")), &bearer, true)
                .is_none()
        );
        for model in [json!(""), json!(7), json!("x".repeat(257)), json!("a\nb")] {
            assert!(
                ClientModel::from_request(Shape::OpenAi, &config, &base(model), &bearer, false)
                    .is_none()
            );
        }
        let basic = headers(&[("authorization", "Basic abc")]);
        assert!(
            ClientModel::from_request(Shape::OpenAi, &config, &base(json!("m")), &basic, false)
                .is_none()
        );
        let anthropic = headers(&[("x-api-key", KEY), ("authorization", "Bearer other")]);
        let client = ClientModel::from_request(
            Shape::Anthropic,
            &config,
            &base(json!("claude-x")),
            &anthropic,
            true,
        )
        .expect("a client model");
        assert_eq!(client.endpoint, "https://api.anthropic.com/v1/messages");
        assert_eq!(client.credential.secret(), KEY);
        assert!(
            ClientModel::from_request(Shape::Anthropic, &config, &base(json!("c")), &bearer, false)
                .is_none(),
            "Anthropic needs x-api-key"
        );
        // The tag tells credentials apart.
        let keys = RandomState::new();
        let other = headers(&[("x-api-key", "sk-another")]);
        let tag = |h: &HeaderMap| {
            ClientModel::from_request(Shape::Anthropic, &config, &base(json!("c")), h, false)
                .unwrap()
                .tag(&keys)
        };
        assert_ne!(tag(&anthropic), tag(&other));
        assert_eq!(tag(&other), tag(&other));
        let summarizer = ClientModelSummarizer::new(
            ClientModel::from_request(
                Shape::Anthropic,
                &config,
                &base(json!("c")),
                &anthropic,
                false,
            )
            .unwrap(),
            &config,
            TokenCounter::new(Encoding::O200kBase),
        )
        .unwrap();
        assert_eq!(summarizer.model(), "client:c");
        assert!(!format!("{summarizer:?}").contains(KEY));
    }

    #[test]
    fn the_spend_guard_counts_per_session_in_a_sliding_window() {
        let guard = SpendGuard::new(2, Duration::from_millis(100));
        let (a, b) = (SessionId(1), SessionId(2));
        assert!(guard.admit(a));
        assert!(guard.admit(a));
        assert!(!guard.admit(a));
        assert!(guard.admit(b), "sessions are counted apart");
        std::thread::sleep(Duration::from_millis(120));
        assert!(guard.admit(a));
        assert!(!SpendGuard::new(0, Duration::from_secs(1)).admit(a));
    }

    /// A summariser that fails every call.
    struct Failing;

    #[async_trait::async_trait]
    impl Summarizer for Failing {
        fn model(&self) -> &str {
            "failing"
        }
        async fn summarize(&self, _: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
            Err(ProviderError::Timeout)
        }
    }

    #[tokio::test]
    async fn a_refused_or_failed_call_is_answered_offline_and_labelled_so() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let config = Config::default();
        // The client's model at a closed loopback port: every call fails at once.
        let mut config_closed = config.clone();
        config_closed.proxy.openai_base_url = "http://127.0.0.1:9/v1".into();
        config_closed.llm.max_retries = 0;
        let client = ClientModel::from_request(
            Shape::OpenAi,
            &config_closed,
            &base(json!("gpt-x")),
            &headers(&[("authorization", &format!("Bearer {KEY}"))]),
            false,
        )
        .unwrap();
        let counters = Arc::new(SummaryCallCounters::default());
        let offline: Arc<dyn Summarizer> = Arc::new(ExtractiveSummarizer::new(counter));
        let guarded = GuardedSummarizer {
            client: ClientModelSummarizer::new(client, &config_closed, counter).unwrap(),
            fallback: Arc::clone(&offline),
            guard: Arc::new(SpendGuard::new(1, Duration::from_secs(60))),
            counters: Arc::clone(&counters),
            session: SessionId(3),
            last_client: AtomicBool::new(true),
        };
        let content = "The deploy of INV-4821 to staging failed twice with a timeout. \
                       It was retried with a longer deadline and then passed. "
            .repeat(8);
        let call = SummaryCall {
            content: &content,
            depth: 0,
            level: EscalationLevel::Normal,
            target_tokens: 40,
            temperature: 0.2,
            digest: None,
        };
        let expected = offline.summarize(&call).await.unwrap();
        // First call: admitted, fails (nothing listens), answered offline.
        assert_eq!(guarded.summarize(&call).await.unwrap(), expected);
        assert_eq!(guarded.model(), offline.model());
        // Second call: refused by the guard, answered offline.
        assert_eq!(guarded.summarize(&call).await.unwrap(), expected);
        assert_eq!(counters.failed.load(Ordering::Relaxed), 1);
        assert_eq!(counters.refused.load(Ordering::Relaxed), 1);
        assert_eq!(counters.ok.load(Ordering::Relaxed), 0);
        assert!(!format!("{guarded:?}").contains(KEY));
        // A fallback that fails too reports its own error.
        let failing = GuardedSummarizer {
            fallback: Arc::new(Failing),
            ..guarded
        };
        assert_eq!(
            failing.summarize(&call).await.unwrap_err(),
            ProviderError::Timeout
        );
    }

    #[test]
    fn header_values() {
        assert_eq!(summarizer_header(1, "client:gpt-x", false), "client-model");
        assert_eq!(summarizer_header(2, "extractive", false), "offline");
        assert_eq!(summarizer_header(1, "gpt-4o", true), "configured");
        assert_eq!(summarizer_header(3, "deterministic", false), "truncation");
        assert_eq!(summarizer_header(3, "structured", true), "offline");
    }
}
