//! The HTTP layer both provider shapes share: configuration, per-attempt timeouts, retries with
//! exponential backoff and full jitter, `Retry-After`, and a circuit breaker.
//!
//! # Retry policy
//!
//! One call makes at most `1 + max_retries` attempts. An attempt that fails with a timeout, a
//! transport error, 408, 429 or a 5xx status is retried; any other failure (401/403, other 4xx,
//! an unparseable 2xx body) is returned at once. Between attempts the client waits:
//!
//! - the server's `Retry-After` (delta-seconds or an HTTP date) when it sent one, capped at
//!   `4 x backoff_max` so a hostile or confused server cannot park us for an hour;
//! - otherwise "full jitter": a uniformly random wait in `[0, min(backoff_max, backoff_base x
//!   2^attempt)]`, which spreads the retries of many concurrent callers.
//!
//! # Circuit breaker
//!
//! One breaker per client (so per provider instance, shared by all its concurrent calls) counts
//! consecutive failed attempts (timeouts, transport errors, 429, 5xx, auth failures, unparseable
//! bodies; a rejected 4xx request shows the provider is up and counts as a success). After
//! `circuit_failures` of them it opens: calls fail with [`ProviderError::CircuitOpen`] without
//! sending anything until `circuit_cooldown` has passed. Then exactly one call is let through as
//! a probe (half-open): its success closes the breaker, its failure opens it for another cooldown.
//! `circuit_failures = 0` disables the breaker. Time is `tokio::time`, so tests can pause it.

use std::error::Error as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, Once};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use tokio::time::Instant;

use crate::provider::{ProviderError, truncate_body};

/// Settings of one provider client.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// Where the API lives, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8089/v1`.
    /// Each provider documents how it appends its endpoint path.
    pub base_url: String,
    /// The API key. When `None`, the provider reads it from the environment
    /// (`LCM_LLM_API_KEY`, then `OPENAI_API_KEY` or `ANTHROPIC_API_KEY`); when none is set either,
    /// no key is sent (local servers need none).
    pub api_key: Option<String>,
    /// The model requests use unless a request names another.
    pub model: String,
    /// Longest one HTTP attempt may take, from sending the request to reading the whole answer.
    pub timeout: Duration,
    /// Retries after the first attempt (so at most `1 + max_retries` requests per call).
    pub max_retries: u32,
    /// First backoff step; it doubles per retry.
    pub backoff_base: Duration,
    /// Largest backoff step (and a quarter of the longest `Retry-After` honoured).
    pub backoff_max: Duration,
    /// Consecutive failed attempts that open the circuit breaker (0 disables it).
    pub circuit_failures: u32,
    /// How long an open breaker refuses calls before letting one probe through.
    pub circuit_cooldown: Duration,
    /// Whether redirects are followed (the default). Off, a 3xx answer is a failed call: a
    /// client whose key is not the operator's (the proxy's callers) never sends it elsewhere.
    pub follow_redirects: bool,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("circuit_failures", &self.circuit_failures)
            .field("circuit_cooldown", &self.circuit_cooldown)
            .field("follow_redirects", &self.follow_redirects)
            .finish()
    }
}

impl HttpConfig {
    /// Default per-attempt timeout: 60 s.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
    /// Default retries: 3.
    pub const DEFAULT_MAX_RETRIES: u32 = 3;
    /// Default first backoff step: 500 ms.
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_millis(500);
    /// Default largest backoff step: 8 s.
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(8);
    /// Default failures that open the breaker: 5.
    pub const DEFAULT_CIRCUIT_FAILURES: u32 = 5;
    /// Default breaker cooldown: 30 s.
    pub const DEFAULT_CIRCUIT_COOLDOWN: Duration = Duration::from_secs(30);

    /// A configuration for `base_url` and `model` with every other setting at its default and
    /// the key taken from the environment.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        HttpConfig {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            timeout: Self::DEFAULT_TIMEOUT,
            max_retries: Self::DEFAULT_MAX_RETRIES,
            backoff_base: Self::DEFAULT_BACKOFF_BASE,
            backoff_max: Self::DEFAULT_BACKOFF_MAX,
            circuit_failures: Self::DEFAULT_CIRCUIT_FAILURES,
            circuit_cooldown: Self::DEFAULT_CIRCUIT_COOLDOWN,
            follow_redirects: true,
        }
    }

    /// Sets the API key (instead of reading it from the environment).
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the per-attempt timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the number of retries after the first attempt.
    pub fn with_max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    /// Sets the first and the largest backoff step.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Sets the circuit breaker's failure threshold (0 disables it) and cooldown.
    pub fn with_circuit(mut self, failures: u32, cooldown: Duration) -> Self {
        self.circuit_failures = failures;
        self.circuit_cooldown = cooldown;
        self
    }

    /// Whether redirects are followed (see [`HttpConfig::follow_redirects`]).
    pub fn with_redirects(mut self, follow: bool) -> Self {
        self.follow_redirects = follow;
        self
    }

    /// The base URL without trailing slashes.
    pub fn base_url_trimmed(&self) -> &str {
        self.base_url.trim_end_matches('/')
    }

    /// Longest `Retry-After` honoured: `4 x backoff_max`.
    pub fn retry_after_cap(&self) -> Duration {
        self.backoff_max.saturating_mul(4)
    }

    fn validate(&self) -> Result<(), ProviderError> {
        let base = self.base_url_trimmed();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(ProviderError::Config(format!(
                "base_url must start with http:// or https://, got {:?}",
                self.base_url
            )));
        }
        if self.timeout.is_zero() {
            return Err(ProviderError::Config("timeout must be above zero".into()));
        }
        if self.model.trim().is_empty() {
            return Err(ProviderError::Config("model must not be empty".into()));
        }
        Ok(())
    }
}

/// The environment variable every provider reads its key from first.
pub const LCM_API_KEY_ENV: &str = "LCM_LLM_API_KEY";

/// The key from the configuration, else from the first non-empty variable of
/// [`LCM_API_KEY_ENV`] and `provider_env`.
fn resolve_api_key(configured: Option<&str>, provider_env: &str) -> Option<String> {
    if let Some(key) = configured {
        return Some(key.to_owned());
    }
    [LCM_API_KEY_ENV, provider_env]
        .iter()
        .filter_map(|name| std::env::var(name).ok())
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty())
}

/// Installs rustls's ring provider as the process default once (unless the application already
/// installed one), since reqwest is built without a provider of its own.
fn ensure_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Losing a race with another installer is fine: a provider is installed either way.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// True when `base_url` names a loopback host, which is never reached through a proxy.
fn is_loopback(base_url: &str) -> bool {
    let rest = base_url
        .strip_prefix("http://")
        .or_else(|| base_url.strip_prefix("https://"))
        .unwrap_or(base_url);
    let authority = rest.split('/').next().unwrap_or("");
    let host = if let Some(bracketed) = authority.strip_prefix('[') {
        bracketed.split(']').next().unwrap_or("")
    } else {
        authority.split(':').next().unwrap_or("")
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The HTTP client one provider uses: reqwest, its configuration, its key and its breaker.
pub(crate) struct HttpClient {
    client: reqwest::Client,
    config: HttpConfig,
    api_key: Option<String>,
    breaker: CircuitBreaker,
    provider: &'static str,
}

impl HttpClient {
    /// A client for `config`, reading the key from `provider_env` when the configuration has none.
    pub(crate) fn new(
        config: HttpConfig,
        provider: &'static str,
        provider_env: &str,
    ) -> Result<Self, ProviderError> {
        config.validate()?;
        ensure_crypto_provider();
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("lcm/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(30));
        if is_loopback(config.base_url_trimmed()) {
            builder = builder.no_proxy();
        }
        if !config.follow_redirects {
            builder = builder.redirect(reqwest::redirect::Policy::none());
        }
        let client = builder
            .build()
            .map_err(|e| ProviderError::Config(format!("cannot build the HTTP client: {e}")))?;
        let api_key = resolve_api_key(config.api_key.as_deref(), provider_env);
        let breaker = CircuitBreaker::new(config.circuit_failures, config.circuit_cooldown);
        Ok(HttpClient {
            client,
            config,
            api_key,
            breaker,
            provider,
        })
    }

    pub(crate) fn config(&self) -> &HttpConfig {
        &self.config
    }

    pub(crate) fn api_key(&self) -> Option<&str> {
        self.api_key.as_deref()
    }

    /// POSTs `body` as JSON to `url` with `headers`, retrying and circuit breaking as the module
    /// describes, and returns the answer's JSON.
    pub(crate) async fn post_json(
        &self,
        url: &str,
        headers: &[(&'static str, String)],
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, ProviderError> {
        let headers = build_headers(headers)?;
        let mut last_error: Option<ProviderError> = None;
        for attempt in 0..=self.config.max_retries {
            let permit = match self.breaker.admit() {
                Ok(permit) => permit,
                Err(until) => {
                    // Mid-call, the real failure that opened the breaker says more.
                    return Err(last_error.unwrap_or(ProviderError::CircuitOpen { until }));
                }
            };
            let failure = match self.attempt(url, &headers, body).await {
                Ok(value) => {
                    permit.record(true);
                    return Ok(value);
                }
                Err(failure) => failure,
            };
            permit.record(!counts_as_failure(&failure.error));
            let retryable = failure.error.is_retryable();
            if !retryable || attempt == self.config.max_retries {
                if retryable {
                    tracing::warn!(
                        provider = self.provider,
                        attempts = attempt + 1,
                        error = %failure.error,
                        "provider call failed; retries exhausted"
                    );
                }
                return Err(failure.error);
            }
            let wait = match failure.retry_after {
                Some(asked) => asked.min(self.config.retry_after_cap()),
                None => backoff_delay(attempt, self.config.backoff_base, self.config.backoff_max),
            };
            tracing::debug!(
                provider = self.provider,
                attempt = attempt + 1,
                error = %failure.error,
                wait_ms = wait.as_millis() as u64,
                "provider call failed; retrying"
            );
            last_error = Some(failure.error);
            tokio::time::sleep(wait).await;
        }
        // The loop always returns; this only satisfies the type checker.
        Err(last_error.unwrap_or(ProviderError::Timeout))
    }

    /// One HTTP attempt under the configured timeout.
    async fn attempt(
        &self,
        url: &str,
        headers: &HeaderMap,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, Failure> {
        let request = self.client.post(url).headers(headers.clone()).json(body);
        let exchange = async {
            let response = request.send().await.map_err(transport_error)?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| parse_retry_after(value, SystemTime::now()));
            let bytes = response.bytes().await.map_err(transport_error)?;
            Ok::<_, ProviderError>((status, retry_after, bytes))
        };
        let (status, retry_after, bytes) =
            match tokio::time::timeout(self.config.timeout, exchange).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => {
                    return Err(Failure {
                        error,
                        retry_after: None,
                    });
                }
                Err(_elapsed) => {
                    return Err(Failure {
                        error: ProviderError::Timeout,
                        retry_after: None,
                    });
                }
            };
        classify(status, retry_after, &bytes)
    }
}

/// A failed attempt and the wait the server asked for, if any.
struct Failure {
    error: ProviderError,
    retry_after: Option<Duration>,
}

fn build_headers(headers: &[(&'static str, String)]) -> Result<HeaderMap, ProviderError> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let mut value = HeaderValue::from_str(value).map_err(|_| {
            ProviderError::Config(format!(
                "the value of header {name} is not a valid header value"
            ))
        })?;
        if matches!(*name, "authorization" | "x-api-key") {
            value.set_sensitive(true);
        }
        map.insert(HeaderName::from_static(name), value);
    }
    Ok(map)
}

fn transport_error(error: reqwest::Error) -> ProviderError {
    if error.is_timeout() {
        return ProviderError::Timeout;
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    ProviderError::Transport(text)
}

/// Turns a status and body into the answer's JSON or a classified failure.
fn classify(
    status: u16,
    retry_after: Option<Duration>,
    bytes: &[u8],
) -> Result<serde_json::Value, Failure> {
    let body_text = || truncate_body(&String::from_utf8_lossy(bytes));
    let error = match status {
        200..=299 => {
            return serde_json::from_slice(bytes).map_err(|e| Failure {
                error: ProviderError::BadResponse(format!(
                    "HTTP {status} with a body that is not JSON ({e}): {:?}",
                    body_text()
                )),
                retry_after: None,
            });
        }
        401 | 403 => ProviderError::Auth { status },
        408 => ProviderError::Timeout,
        429 => ProviderError::RateLimited { retry_after },
        500..=599 => ProviderError::Server {
            status,
            body: body_text(),
        },
        _ => ProviderError::Rejected {
            status,
            body: body_text(),
        },
    };
    Err(Failure { error, retry_after })
}

/// Whether an attempt's failure counts against the circuit breaker: every failure that says the
/// provider is unhealthy or unusable. A rejected request (other 4xx) shows it is up.
fn counts_as_failure(error: &ProviderError) -> bool {
    !matches!(
        error,
        ProviderError::Rejected { .. } | ProviderError::Config(_)
    )
}

/// Parses a `Retry-After` value: delta-seconds (integer, or decimal as some servers send) or an
/// HTTP date, relative to `now`. A date in the past means "now" (zero).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0)
            .then(|| Duration::try_from_secs_f64(seconds).ok())
            .flatten();
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The full-jitter wait before retry `attempt + 1`: uniform in
/// `[0, min(max, base x 2^attempt)]`.
pub fn backoff_delay(attempt: u32, base: Duration, max: Duration) -> Duration {
    let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
    let ceiling = base.saturating_mul(factor).min(max);
    let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    Duration::from_nanos(next_random() % nanos.saturating_add(1))
}

/// A small process-wide PRNG (SplitMix64) for jitter; seeded from the clock, never cryptographic.
fn next_random() -> u64 {
    static SEED: LazyLock<u64> = LazyLock::new(|| {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5EED);
        nanos ^ u64::from(std::process::id()).rotate_left(32)
    });
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut z = SEED.wrapping_add(
        COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The breaker's mutable state.
#[derive(Debug, Default)]
struct BreakerState {
    consecutive_failures: u32,
    /// Set while open; once it has passed, one probe may go.
    open_until: Option<Instant>,
    probe_in_flight: bool,
}

/// A consecutive-failure circuit breaker (see the module documentation).
#[derive(Debug)]
pub(crate) struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<BreakerState>,
}

impl CircuitBreaker {
    pub(crate) fn new(threshold: u32, cooldown: Duration) -> Self {
        CircuitBreaker {
            threshold,
            cooldown,
            state: Mutex::new(BreakerState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BreakerState> {
        // The state stays consistent under a panic (plain field writes): ignore poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lets an attempt through, or says until when the breaker refuses.
    pub(crate) fn admit(&self) -> Result<Permit<'_>, Instant> {
        if self.threshold == 0 {
            return Ok(Permit::new(self, false));
        }
        let mut state = self.lock();
        match state.open_until {
            None => Ok(Permit::new(self, false)),
            Some(until) if Instant::now() < until || state.probe_in_flight => Err(until),
            Some(_) => {
                state.probe_in_flight = true;
                Ok(Permit::new(self, true))
            }
        }
    }

    fn record(&self, probe: bool, success: bool) {
        if self.threshold == 0 {
            return;
        }
        let mut state = self.lock();
        if probe {
            state.probe_in_flight = false;
        }
        if success {
            state.consecutive_failures = 0;
            state.open_until = None;
            return;
        }
        state.consecutive_failures = state.consecutive_failures.saturating_add(1);
        if probe || state.consecutive_failures >= self.threshold {
            if state.open_until.is_none() || probe {
                tracing::warn!(
                    failures = state.consecutive_failures,
                    cooldown_ms = self.cooldown.as_millis() as u64,
                    "provider circuit breaker opened"
                );
            }
            state.open_until = Some(Instant::now() + self.cooldown);
        }
    }

    /// True while the breaker refuses calls (open and cooling down, or its probe is in flight).
    #[cfg(test)]
    fn is_open(&self) -> bool {
        let state = self.lock();
        state
            .open_until
            .is_some_and(|until| Instant::now() < until || state.probe_in_flight)
    }
}

/// Permission for one attempt; reports its outcome to the breaker. Dropped unreported (the call
/// was cancelled), a probe frees its slot so that the next call can probe.
pub(crate) struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    probe: bool,
    reported: bool,
}

impl<'a> Permit<'a> {
    fn new(breaker: &'a CircuitBreaker, probe: bool) -> Self {
        Permit {
            breaker,
            probe,
            reported: false,
        }
    }

    /// Reports the attempt's outcome.
    pub(crate) fn record(mut self, success: bool) {
        self.reported = true;
        self.breaker.record(self.probe, success);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.reported && self.probe {
            self.breaker.lock().probe_in_flight = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after(" 1.5 ", now),
            Some(Duration::from_millis(1500))
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(3));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(3)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-3", now), None);
    }

    #[test]
    fn backoff_is_bounded_and_grows() {
        let base = Duration::from_millis(500);
        let max = Duration::from_secs(8);
        for attempt in 0..40 {
            let ceiling = base.saturating_mul(1u32 << attempt.min(31)).min(max);
            for _ in 0..50 {
                assert!(backoff_delay(attempt, base, max) <= ceiling);
            }
        }
        // Full jitter: some waits at attempt 3 exceed the first step.
        assert!((0..200).any(|_| backoff_delay(3, base, max) > base));
        assert_eq!(backoff_delay(5, Duration::ZERO, max), Duration::ZERO);
    }

    #[test]
    fn loopback_detection() {
        assert!(is_loopback("http://127.0.0.1:8089/v1"));
        assert!(is_loopback("http://localhost/v1"));
        assert!(is_loopback("http://[::1]:80"));
        assert!(!is_loopback("https://api.openai.com/v1"));
    }

    #[test]
    fn config_debug_redacts_key() {
        let config = HttpConfig::new("http://x", "m").with_api_key("sk-secret");
        assert!(!format!("{config:?}").contains("sk-secret"));
    }

    #[test]
    fn config_validation() {
        assert!(HttpConfig::new("ftp://x", "m").validate().is_err());
        assert!(HttpConfig::new("http://x", " ").validate().is_err());
        assert!(
            HttpConfig::new("http://x", "m")
                .with_timeout(Duration::ZERO)
                .validate()
                .is_err()
        );
        assert!(HttpConfig::new("https://x/", "m").validate().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_opens_half_opens_and_closes() {
        let breaker = CircuitBreaker::new(3, Duration::from_secs(30));
        for _ in 0..2 {
            breaker.admit().expect("closed").record(false);
        }
        assert!(!breaker.is_open());
        breaker.admit().expect("closed").record(false);
        assert!(breaker.is_open());
        assert!(breaker.admit().is_err());

        tokio::time::advance(Duration::from_secs(29)).await;
        assert!(breaker.admit().is_err());
        tokio::time::advance(Duration::from_secs(2)).await;
        // Half-open: one probe, and nobody else while it is in flight.
        let probe = breaker.admit().expect("probe");
        assert!(breaker.admit().is_err());
        // The probe fails: open for another cooldown.
        probe.record(false);
        assert!(breaker.admit().is_err());
        tokio::time::advance(Duration::from_secs(31)).await;
        breaker.admit().expect("probe").record(true);
        assert!(!breaker.is_open());
        // Closed again, with a fresh count.
        breaker.admit().expect("closed").record(false);
        assert!(!breaker.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_probe_frees_the_slot() {
        let breaker = CircuitBreaker::new(1, Duration::from_secs(1));
        breaker.admit().expect("closed").record(false);
        tokio::time::advance(Duration::from_secs(2)).await;
        drop(breaker.admit().expect("probe"));
        assert!(breaker.admit().is_ok());
    }

    #[test]
    fn disabled_breaker_never_opens() {
        let breaker = CircuitBreaker::new(0, Duration::from_secs(1));
        for _ in 0..100 {
            breaker.admit().expect("disabled").record(false);
        }
    }

    #[test]
    fn classification() {
        let err = |status, body: &str| classify(status, None, body.as_bytes()).unwrap_err().error;
        assert_eq!(err(401, ""), ProviderError::Auth { status: 401 });
        assert_eq!(err(408, ""), ProviderError::Timeout);
        assert!(matches!(err(429, ""), ProviderError::RateLimited { .. }));
        assert!(matches!(
            err(503, "x"),
            ProviderError::Server { status: 503, .. }
        ));
        assert!(matches!(
            err(400, "x"),
            ProviderError::Rejected { status: 400, .. }
        ));
        assert!(matches!(err(200, "<html>"), ProviderError::BadResponse(_)));
        assert!(classify(200, None, br#"{"ok":true}"#).is_ok());
    }
}
