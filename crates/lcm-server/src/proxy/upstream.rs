//! The HTTP side of the proxy: the upstream client (reqwest on rustls with the ring provider,
//! the stack of `lcm-llm`'s providers), which request headers go upstream and which answer
//! headers come back.
//!
//! The client's credentials (`Authorization`, `x-api-key`) go upstream as they came, marked
//! sensitive (never printed by the HTTP stack), and are neither logged nor stored; when lcm's
//! own token came in `Authorization`, that header is not forwarded.

use std::sync::Once;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Why the upstream could not be reached or did not answer.
#[derive(Debug)]
pub(crate) enum UpstreamError {
    /// No answer (or no next chunk) within `proxy.timeout_s`.
    Timeout,
    /// Connecting, sending or reading failed.
    Transport(String),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Timeout => f.write_str("the upstream did not answer in time"),
            UpstreamError::Transport(detail) => write!(f, "the upstream failed: {detail}"),
        }
    }
}

/// The upstream HTTP clients (one that never uses a system proxy, for loopback upstreams).
pub(crate) struct Upstream {
    clients: Result<(reqwest::Client, reqwest::Client), String>,
}

/// Installs rustls's ring provider as the process default once (reqwest is built without a
/// provider of its own), as `lcm-llm` does.
fn ensure_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

impl Upstream {
    pub(crate) fn new() -> Upstream {
        ensure_crypto_provider();
        let build = |direct: bool| {
            let mut builder = reqwest::Client::builder()
                .user_agent(concat!("lcm-proxy/", env!("CARGO_PKG_VERSION")))
                .pool_idle_timeout(Duration::from_secs(30))
                // A redirect goes back to the client as it came (a POST is never replayed
                // elsewhere with the client's key).
                .redirect(reqwest::redirect::Policy::none());
            if direct {
                builder = builder.no_proxy();
            }
            builder
                .build()
                .map_err(|e| format!("cannot build the upstream HTTP client: {e}"))
        };
        Upstream {
            clients: build(false).and_then(|normal| Ok((normal, build(true)?))),
        }
    }

    /// POSTs `body` to `url` with `headers`; the answer's head, within `timeout`.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<reqwest::Response, UpstreamError> {
        self.send(reqwest::Method::POST, url, headers, Some(body), timeout)
            .await
    }

    /// GETs `url` with `headers`; the answer's head, within `timeout`.
    pub(crate) async fn get(
        &self,
        url: &str,
        headers: HeaderMap,
        timeout: Duration,
    ) -> Result<reqwest::Response, UpstreamError> {
        self.send(reqwest::Method::GET, url, headers, None, timeout)
            .await
    }

    async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        headers: HeaderMap,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<reqwest::Response, UpstreamError> {
        let (normal, direct) = self
            .clients
            .as_ref()
            .map_err(|e| UpstreamError::Transport(e.clone()))?;
        let client = if is_loopback(url) { direct } else { normal };
        let mut request = client.request(method, url).headers(headers);
        if let Some(body) = body {
            request = request.body(body);
        }
        match tokio::time::timeout(timeout, request.send()).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) if e.is_timeout() => Err(UpstreamError::Timeout),
            Ok(Err(e)) => Err(UpstreamError::Transport(error_chain(&e))),
            Err(_) => Err(UpstreamError::Timeout),
        }
    }
}

/// The next chunk of an answer's body (`None` at its end), within `timeout`.
pub(crate) async fn next_chunk(
    response: &mut reqwest::Response,
    timeout: Duration,
) -> Result<Option<Bytes>, UpstreamError> {
    match tokio::time::timeout(timeout, response.chunk()).await {
        Ok(Ok(chunk)) => Ok(chunk),
        Ok(Err(e)) if e.is_timeout() => Err(UpstreamError::Timeout),
        Ok(Err(e)) => Err(UpstreamError::Transport(error_chain(&e))),
        Err(_) => Err(UpstreamError::Timeout),
    }
}

/// The whole body of an answer.
pub(crate) async fn read_all(
    response: &mut reqwest::Response,
    timeout: Duration,
) -> Result<Bytes, UpstreamError> {
    let mut body = Vec::new();
    while let Some(chunk) = next_chunk(response, timeout).await? {
        body.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(body))
}

fn error_chain(error: &reqwest::Error) -> String {
    use std::error::Error as _;
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Whether `url` names a loopback host (never reached through a system proxy).
fn is_loopback(url: &str) -> bool {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or("");
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or(""),
        None => authority.split(':').next().unwrap_or(""),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Headers that describe one hop, not the message: never forwarded either way.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// The headers sent upstream: the client's, but for hop-by-hop headers, the body's framing
/// (recomputed), `accept-encoding` (answers are read uncompressed), lcm's own `x-lcm-*`
/// headers, and `Authorization` when it carried lcm's token (`strip_authorization`).
pub(crate) fn forward_headers(client: &HeaderMap, strip_authorization: bool) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len() + 1);
    for (name, value) in client {
        let skip = hop_by_hop(name)
            || matches!(
                name.as_str(),
                "host" | "content-length" | "content-type" | "accept-encoding" | "expect"
            )
            || name.as_str().starts_with("x-lcm-")
            || (strip_authorization && name == header::AUTHORIZATION);
        if skip {
            continue;
        }
        let mut value = value.clone();
        if name == header::AUTHORIZATION || name.as_str() == "x-api-key" {
            value.set_sensitive(true);
        }
        out.append(name.clone(), value);
    }
    out.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    out
}

/// The upstream answer's headers that go back to the client (all but hop-by-hop headers and
/// the body's length, which the server sets).
pub(crate) fn answer_headers(upstream: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(upstream.len());
    for (name, value) in upstream {
        if hop_by_hop(name) || name == header::CONTENT_LENGTH {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_pass_and_lcm_headers_do_not() {
        let mut client = HeaderMap::new();
        client.insert(header::AUTHORIZATION, "Bearer sk-upstream".parse().unwrap());
        client.insert("x-api-key", "key".parse().unwrap());
        client.insert("x-lcm-session", "s".parse().unwrap());
        client.insert("x-lcm-token", "t".parse().unwrap());
        client.insert(header::CONNECTION, "keep-alive".parse().unwrap());
        client.insert(header::ACCEPT_ENCODING, "gzip".parse().unwrap());
        client.insert("anthropic-version", "2023-06-01".parse().unwrap());
        let out = forward_headers(&client, false);
        assert_eq!(out[header::AUTHORIZATION], "Bearer sk-upstream");
        assert!(out[header::AUTHORIZATION].is_sensitive());
        assert!(out["x-api-key"].is_sensitive());
        assert_eq!(out["anthropic-version"], "2023-06-01");
        assert_eq!(out[header::CONTENT_TYPE], "application/json");
        for gone in [
            "x-lcm-session",
            "x-lcm-token",
            "connection",
            "accept-encoding",
        ] {
            assert!(!out.contains_key(gone), "{gone}");
        }
        let out = forward_headers(&client, true);
        assert!(!out.contains_key(header::AUTHORIZATION));
    }

    #[test]
    fn loopback_urls() {
        assert!(is_loopback("http://127.0.0.1:9/v1/messages"));
        assert!(is_loopback("http://localhost/v1"));
        assert!(is_loopback("http://[::1]:80/v1"));
        assert!(!is_loopback("https://api.anthropic.com/v1/messages"));
    }
}
