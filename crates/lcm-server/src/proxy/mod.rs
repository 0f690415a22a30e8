//! The OpenAI- and Anthropic-compatible proxy: `POST /v1/chat/completions` and
//! `POST /v1/messages` (with `GET /v1/models` and `POST /v1/messages/count_tokens` passed
//! through unchanged).
//!
//! A client points its base URL at the daemon and talks to it as to its provider. For each
//! request the proxy:
//!
//! 1. identifies the conversation: the `x-lcm-session` header (a session key), else a stable
//!    hash of its prefix (the system prompt and the first user message); a tenant's keys get
//!    its prefix;
//! 2. stores the messages the session does not hold yet (clients resend the whole list each
//!    turn; see `conversation.rs`) in one `append_batch`, with source keys derived from the
//!    request so that a retried request stores nothing twice;
//! 3. replaces the message list with lcm's context for the budget (`proxy.context_budget_tokens`
//!    or `x-lcm-budget`, counted over the whole body; see `fit.rs`), keeping the client's system
//!    prompt and sending its newest messages as it sent them;
//! 4. adds the lcm tools (`lcm_grep`, `lcm_describe`, `lcm_expand_query`; a tenant gets the
//!    first two) when the model may choose its tools (`tool_choice` absent or `auto`), unless
//!    the client already has a tool of that name;
//! 5. forwards the request with the client's own credentials; when the answer calls an lcm
//!    tool, runs the calls itself, appends the call and its results and asks again (at most
//!    `proxy.max_tool_rounds` rounds, then once more with `tool_choice` "none"); calls to the
//!    client's tools made in the same answer are answered "not run" so the model can make them
//!    again. An answer that calls no lcm tool is returned as the upstream sent it (status,
//!    headers, bytes) and stored in the session.
//!
//! Streaming: without lcm tools in the request, the upstream's events are streamed to the
//! client as they come (and the answer is rebuilt from them and stored when the stream ends).
//! With lcm tools, each round's stream is read to its end before anything is sent, since any
//! part of it may turn out to be an lcm tool call; a round without one is then replayed to the
//! client byte for byte, and a round with one never reaches it.
//!
//! The proxy's own tool rounds are not stored (they are searches of what is stored); the
//! client's system prompt is not stored either (it is sent with every request).
//!
//! Summaries: without `[llm]`, each request also registers the client's model (with its
//! credentials, in memory only) as its session's summariser, behind a spend guard and with the
//! offline summariser as fallback (`client_model.rs`). Answers say which summariser wrote the
//! session's most recent summary (`x-lcm-summarizer`).

mod client_model;
mod conversation;
mod fit;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
mod shape;
mod sse;
mod upstream;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lcm_core::config::{MIN_PROXY_BUDGET_TOKENS, ProviderKind};
use lcm_core::ids::SessionId;
use lcm_core::message::NewMessage;
use lcm_core::tokens::TokenCounter;
use lcm_engine::runtime::SessionHandle;
use lcm_llm::truncate_middle;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use crate::auth::Principal;
use crate::error::{ApiError, RawBody, parse_json};
use crate::state::AppState;
pub(crate) use client_model::ClientSummaries;
pub use client_model::{CLIENT_LABEL_PREFIX, SUMMARIZER_HEADER};
use client_model::{ClientModel, summarizer_header};
use conversation::{
    ClientMessage, STORED_WINDOW, already_stored, answer_key, derived_key, fingerprint,
    message_key, parse_client_message, prompt_text, request_fingerprint,
};
use fit::{Plan, TooSmall, measure};
use shape::{Call, Shape};
use sse::Accumulator;
pub(crate) use upstream::Upstream;
use upstream::{UpstreamError, answer_headers, forward_headers, next_chunk, read_all};

/// The header naming the conversation's session key.
pub const SESSION_HEADER: &str = "x-lcm-session";
/// The header lowering (or raising) the budget of one request.
pub const BUDGET_HEADER: &str = "x-lcm-budget";
/// The header carrying lcm's own token on the proxy routes when `Authorization` carries the
/// upstream's key.
pub const TOKEN_HEADER: &str = "x-lcm-token";
/// The answer header with the session's id (`ses_N`).
const SESSION_ID_HEADER: &str = "x-lcm-session-id";

/// The lcm tools the proxy adds for the admin (and on an open loopback daemon).
const LCM_TOOLS: [&str; 3] = ["lcm_grep", "lcm_describe", "lcm_expand_query"];
/// Added to [`LCM_TOOLS`] with `proxy.inject_context_tools`: the model shapes its context.
const CONTEXT_TOOLS: [&str; 2] = ["lcm_pin", "lcm_forget"];
/// The lcm tools a tenant gets (their reach is checked against its sessions).
const TENANT_TOOLS: [&str; 2] = ["lcm_grep", "lcm_describe"];
/// Longest session key.
const MAX_KEY_BYTES: usize = 1024;
/// Fewest tokens left for the context once the system prompt and the tools are counted.
const MIN_CONTEXT_TOKENS: u64 = 256;
/// Most lcm tool calls run in one round (more are answered "not run").
const MAX_CALLS_PER_ROUND: usize = 8;

/// `POST /v1/chat/completions`.
pub(crate) async fn openai_chat(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    proxy(state, principal, headers, body, Shape::OpenAi).await
}

/// `POST /v1/messages`.
pub(crate) async fn anthropic_messages(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    proxy(state, principal, headers, body, Shape::Anthropic).await
}

/// `GET /v1/models`: the upstream's model list, passed through as it came (clients list the
/// models before they chat). Anthropic's upstream when the request carries `anthropic-version`
/// (as Anthropic's clients send), OpenAI's otherwise; the client's credentials go along as on
/// the other proxy routes.
pub(crate) async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let shape = if headers.contains_key("anthropic-version") {
        Shape::Anthropic
    } else {
        Shape::OpenAi
    };
    pass_through(&state, shape, "/models", &headers, None).await
}

/// `POST /v1/messages/count_tokens`: Anthropic's count of a request's input tokens, passed
/// through to the Anthropic upstream as the client sent it (its body and credentials). It
/// counts the client's messages, not lcm's context (`/v1/messages` assembles that per call),
/// and stores nothing.
pub(crate) async fn anthropic_count_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    pass_through(
        &state,
        Shape::Anthropic,
        "/messages/count_tokens",
        &headers,
        Some(body.to_vec()),
    )
    .await
}

/// Sends the client's request to `endpoint` of `shape`'s upstream (a GET, or a POST of `body`)
/// with the client's credentials, and returns the answer (status, headers, body) as the
/// upstream sent it; an unreachable upstream or a timeout is an error in the request's shape.
async fn pass_through(
    state: &AppState,
    shape: Shape,
    endpoint: &str,
    headers: &HeaderMap,
    body: Option<Vec<u8>>,
) -> Response {
    let config = &state.inner.config.proxy;
    let url = upstream_url(config, shape, endpoint);
    let strip_authorization = state.inner.auth.enabled() && !headers.contains_key(TOKEN_HEADER);
    let forward = forward_headers(headers, strip_authorization);
    let timeout = Duration::from_secs(config.timeout_s);
    let upstream = &state.inner.upstream;
    let method = if body.is_some() { "POST" } else { "GET" };
    let sent = match body {
        Some(body) => upstream.post(&url, forward, body, timeout).await,
        None => upstream.get(&url, forward, timeout).await,
    };
    let answer = match sent {
        Ok(mut response) => read_all(&mut response, timeout)
            .await
            .map(|body| (response.status(), answer_headers(response.headers()), body)),
        Err(error) => Err(error),
    };
    match answer {
        Ok((status, headers, body)) => {
            if !status.is_success() {
                state
                    .inner
                    .metrics
                    .record_upstream_error(shape.name(), status_class(status));
            }
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            response
        }
        Err(error) => unreachable(state, shape, method, &url, &error, None),
    }
}

/// The upstream URL of `endpoint` (`/chat/completions`, `/messages`, `/models`) for `shape`.
fn upstream_url(config: &lcm_core::config::ProxyConfig, shape: Shape, endpoint: &str) -> String {
    let base_url = match shape {
        Shape::OpenAi => &config.openai_base_url,
        Shape::Anthropic => &config.anthropic_base_url,
    };
    format!("{}{endpoint}", base_url.trim().trim_end_matches('/'))
}

async fn proxy(
    state: AppState,
    principal: Principal,
    headers: HeaderMap,
    body: Bytes,
    shape: Shape,
) -> Response {
    match turn(&state, &principal, &headers, &body, shape).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

/// A client's request, parsed.
struct ClientRequest {
    /// The body without `messages`.
    base: Map<String, Value>,
    /// OpenAI: the leading `system` / `developer` messages (the system prompt), sent as they are.
    leading: Vec<Value>,
    /// The other messages.
    messages: Vec<ClientMessage>,
    stream: bool,
    /// The system prompt's text (part of the conversation's identity).
    system_text: String,
}

#[derive(Deserialize)]
struct RawMessages<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

fn parse_request(shape: Shape, body: &[u8]) -> Result<ClientRequest, ApiError> {
    let value: Value = parse_json(body)?;
    let Value::Object(mut base) = value else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let values = match base.remove("messages") {
        Some(Value::Array(values)) => values,
        Some(_) => {
            return Err(ApiError::bad_request(
                "`messages` must be an array of messages",
            ));
        }
        None => return Err(ApiError::bad_request("`messages` is missing")),
    };
    let raw: RawMessages<'_> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("`messages` is unreadable: {e}")))?;
    if values.is_empty() || raw.messages.len() != values.len() {
        return Err(ApiError::bad_request("`messages` holds no message"));
    }
    let stream = match base.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err(ApiError::bad_request("`stream` must be true or false")),
    };
    let mut leading = Vec::new();
    let mut messages = Vec::with_capacity(values.len());
    for (i, (raw, value)) in raw.messages.iter().zip(values).enumerate() {
        let role = value.get("role").and_then(Value::as_str);
        if shape == Shape::OpenAi
            && messages.is_empty()
            && matches!(role, Some("system" | "developer"))
        {
            leading.push(value);
            continue;
        }
        let message = parse_client_message(shape, raw.get(), value).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_message",
                format!("messages[{i}]: {e}"),
            )
        })?;
        messages.push(message);
    }
    if messages.iter().all(|m| m.parsed.is_none()) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_message",
            "`messages` holds no message with content besides the system prompt",
        ));
    }
    let system_text = match shape {
        Shape::OpenAi => leading
            .iter()
            .map(prompt_text)
            .collect::<Vec<_>>()
            .join("\n"),
        Shape::Anthropic => base.get("system").map(prompt_text).unwrap_or_default(),
    };
    Ok(ClientRequest {
        base,
        leading,
        messages,
        stream,
        system_text,
    })
}

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim()))
            .map_err(|_| ApiError::bad_request(format!("the {name} header must be ASCII text"))),
    }
}

fn budget_for(headers: &HeaderMap, default: u64) -> Result<u64, ApiError> {
    let Some(text) = header_text(headers, BUDGET_HEADER)? else {
        return Ok(default);
    };
    match text.parse::<u64>() {
        Ok(budget) if budget >= MIN_PROXY_BUDGET_TOKENS => Ok(budget),
        _ => Err(ApiError::bad_request(format!(
            "{BUDGET_HEADER} must be a number of tokens, at least {MIN_PROXY_BUDGET_TOKENS}, got {text:?}"
        ))),
    }
}

/// The session key: the header's, else `derived`; a tenant's key gets its prefix.
fn session_key(
    principal: &Principal,
    headers: &HeaderMap,
    derived: String,
) -> Result<String, ApiError> {
    let key = match header_text(headers, SESSION_HEADER)? {
        Some("") => {
            return Err(ApiError::bad_request(format!(
                "{SESSION_HEADER} must not be empty"
            )));
        }
        Some(key) if key.len() > MAX_KEY_BYTES => {
            return Err(ApiError::bad_request(format!(
                "{SESSION_HEADER} is {} bytes; at most {MAX_KEY_BYTES}",
                key.len()
            )));
        }
        Some(key) => key.to_owned(),
        None => derived,
    };
    let key = match principal {
        Principal::Tenant { prefix } if !key.starts_with(&**prefix) => format!("{prefix}{key}"),
        _ => key,
    };
    principal.check_new_key(&key)?;
    Ok(key)
}

/// The lcm tools added to a request: their names and definitions.
#[derive(Default)]
struct Injected {
    names: Vec<String>,
    definitions: Vec<Value>,
}

fn injected_tools(
    state: &AppState,
    principal: &Principal,
    shape: Shape,
    base: &Map<String, Value>,
) -> Injected {
    if !state.inner.config.proxy.inject_tools || !shape.model_chooses_tools(base.get("tool_choice"))
    {
        return Injected::default();
    }
    let allowed: Vec<&str> = if principal.is_tenant() {
        TENANT_TOOLS.to_vec()
    } else if state.inner.config.proxy.inject_context_tools {
        LCM_TOOLS.iter().chain(&CONTEXT_TOOLS).copied().collect()
    } else {
        LCM_TOOLS.to_vec()
    };
    let theirs: HashSet<&str> = base
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| tools.iter().filter_map(|t| shape.tool_name(t)).collect())
        .unwrap_or_default();
    let mut out = Injected::default();
    if let Value::Array(definitions) = state.runtime().tool_definitions(shape.tool_format()) {
        for definition in definitions {
            let Some(name) = shape.tool_name(&definition).map(str::to_owned) else {
                continue;
            };
            if allowed.contains(&name.as_str()) && !theirs.contains(name.as_str()) {
                out.names.push(name);
                out.definitions.push(definition);
            }
        }
    }
    out
}

fn too_small(budget: u64, tokens: u64) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "budget_too_small",
        format!(
            "the request cannot be sent within {budget} tokens: the system prompt, the tools and the newest message alone take about {tokens}; raise proxy.context_budget_tokens (or send a larger {BUDGET_HEADER})"
        ),
    )
}

/// What the proxy says about the session in its answers.
#[derive(Clone)]
struct SessionTags {
    key: String,
    id: String,
    /// The summariser of the session's most recent summary ([`SUMMARIZER_HEADER`]), if any.
    summarizer: Option<&'static str>,
}

impl SessionTags {
    fn apply(&self, headers: &mut HeaderMap) {
        if let Ok(value) = HeaderValue::from_str(&self.key) {
            headers.insert(SESSION_HEADER, value);
        }
        if let Ok(value) = HeaderValue::from_str(&self.id) {
            headers.insert(SESSION_ID_HEADER, value);
        }
        if let Some(summarizer) = self.summarizer {
            headers.insert(SUMMARIZER_HEADER, HeaderValue::from_static(summarizer));
        }
    }
}

/// Which summariser wrote `session`'s most recent summary (the newest is always at the top
/// of its context, never under a later one), as [`SUMMARIZER_HEADER`] says it; `None` before
/// its first summary (or when the store cannot say).
async fn latest_summarizer(state: &AppState, session: SessionId) -> Option<&'static str> {
    let configured = state.inner.config.llm.provider != ProviderKind::Extractive;
    let found = state
        .blocking(move |store| {
            let context = store.context(session)?;
            let Some(newest) = context.summaries.iter().max().copied() else {
                return Ok(None);
            };
            let summary = store.summary(newest)?;
            Ok(Some(summarizer_header(
                summary.level,
                &summary.model,
                configured,
            )))
        })
        .await;
    match found {
        Ok(found) => found,
        Err(error) => {
            tracing::debug!(%session, error = %error.message, "proxy: the newest summary is unreadable");
            None
        }
    }
}

async fn turn(
    state: &AppState,
    principal: &Principal,
    headers: &HeaderMap,
    body: &[u8],
    shape: Shape,
) -> Result<Response, ApiError> {
    let config = &state.inner.config.proxy;
    let request = parse_request(shape, body)?;
    let budget = budget_for(headers, config.context_budget_tokens)?;
    let derived = derived_key(shape, &request.system_text, &request.messages);
    let key = session_key(principal, headers, derived)?;
    // The tools and the system prompt, counted first: a budget they exhaust is refused before
    // anything is stored.
    let injected = injected_tools(state, principal, shape, &request.base);
    let mut base = request.base.clone();
    if !injected.definitions.is_empty() {
        let mut tools = match base.remove("tools") {
            Some(Value::Array(tools)) => tools,
            _ => Vec::new(),
        };
        tools.extend(injected.definitions.iter().cloned());
        base.insert("tools".into(), Value::Array(tools));
    }
    let counter = TokenCounter::new(state.inner.config.tokenizer.encoding());
    let mut bare = base.clone();
    bare.insert("messages".into(), Value::Array(request.leading.clone()));
    let fixed = measure(&counter, &Value::Object(bare));
    let room = budget.saturating_sub(fixed);
    if room < MIN_CONTEXT_TOKENS {
        return Err(too_small(budget, fixed + MIN_CONTEXT_TOKENS));
    }
    let handle = Arc::new(state.runtime().session(&key).await?);
    let session = handle.id();
    let mut tags = SessionTags {
        key,
        id: session.to_string(),
        summarizer: None,
    };
    // lcm's own token came in Authorization unless it came in x-lcm-token: never forward it.
    let strip_authorization = state.inner.auth.enabled() && !headers.contains_key(TOKEN_HEADER);
    // Without [llm], the client's model summarises this session (before anything below may
    // start a compaction).
    let client_summaries = &state.inner.client_summaries;
    if client_summaries.enabled()
        && let Some(client) = ClientModel::from_request(
            shape,
            &state.inner.config,
            &request.base,
            headers,
            strip_authorization,
        )
    {
        client_summaries.register(
            &handle,
            client,
            &state.inner.config,
            state.runtime().summarizer(),
        );
    }

    // Store what the session does not hold yet.
    let sent: Vec<u64> = request
        .messages
        .iter()
        .filter(|m| m.parsed.is_some())
        .map(|m| m.fp)
        .collect();
    let stored = state
        .blocking(move |store| {
            let count = store.session(session)?.message_count;
            let from = count.saturating_sub(STORED_WINDOW as u64);
            Ok(store
                .session_messages(session, from..count)?
                .iter()
                .map(|m| fingerprint(m.role, &m.parts))
                .collect::<Vec<u64>>())
        })
        .await?;
    let known = already_stored(&stored, &sent);
    let request_fp = request_fingerprint(shape, &request.messages);
    let new: Vec<NewMessage> = request
        .messages
        .iter()
        .filter_map(|m| m.parsed.as_ref())
        .enumerate()
        .skip(known)
        .map(|(i, m)| {
            let mut m = m.clone();
            m.source_key = Some(message_key(request_fp, i));
            m
        })
        .collect();
    if !new.is_empty() {
        let appended = handle.append_batch(new).await?;
        let inserted = appended.iter().filter(|a| a.inserted).count();
        state.inner.metrics.record_proxy_stored(inserted as u64);
    }

    // The context for what is left of the budget.
    let context = handle.context(room).await?;
    let mut plan = Plan::new(shape, counter, context, &request.messages);

    let url = upstream_url(config, shape, shape.endpoint());
    let forward = forward_headers(headers, strip_authorization);
    let timeout = Duration::from_secs(config.timeout_s);
    let injecting = !injected.names.is_empty();
    let metrics = &state.inner.metrics;
    let mut rounds: Vec<Value> = Vec::new();
    let mut round = 0;
    loop {
        let last_round = injecting && round >= config.max_tool_rounds;
        let mut round_base = base.clone();
        if last_round {
            round_base.insert("tool_choice".into(), shape.no_tools_choice());
        }
        let (upstream_body, tokens) = plan
            .fit(budget, |plan| {
                plan.body(&round_base, &request.leading, &rounds)
            })
            .map_err(|TooSmall { tokens }| too_small(budget, tokens))?;
        tracing::debug!(
            shape = shape.name(),
            session = %session,
            round,
            tokens,
            budget,
            verbatim = plan.verbatim_count(),
            "proxy: forwarding"
        );
        let bytes = serde_json::to_vec(&upstream_body)
            .map_err(|e| ApiError::internal(format!("cannot encode the upstream request: {e}")))?;
        metrics.record_upstream_call(shape.name());
        let sent = state
            .inner
            .upstream
            .post(&url, forward.clone(), bytes, timeout)
            .await;
        // Read once the upstream answered: a compaction may have finished meanwhile.
        tags.summarizer = latest_summarizer(state, session).await;
        let mut response = match sent {
            Ok(response) => response,
            Err(error) => return Ok(unreachable(state, shape, "POST", &url, &error, Some(&tags))),
        };
        let status = response.status();
        let upstream_headers = response.headers().clone();
        if !status.is_success() {
            metrics.record_upstream_error(shape.name(), status_class(status));
            let body = read_all(&mut response, timeout).await.unwrap_or_default();
            return Ok(upstream_error(
                shape,
                status,
                &upstream_headers,
                body,
                &tags,
            ));
        }
        if request.stream && !injecting {
            return Ok(stream_through(StreamThrough {
                state: state.clone(),
                handle: Arc::clone(&handle),
                shape,
                request_fp,
                response,
                timeout,
                tags: tags.clone(),
            }));
        }
        let body = match read_all(&mut response, timeout).await {
            Ok(body) => body,
            Err(error) => return Ok(unreachable(state, shape, "POST", &url, &error, Some(&tags))),
        };
        let streamed = request.stream.then(|| {
            let mut accumulator = Accumulator::new(shape);
            accumulator.feed(&body);
            accumulator.finish()
        });
        // (An upstream that ignores `stream` answers with JSON.)
        let message = streamed.flatten().or_else(|| {
            serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|answer| shape.answer_message(&answer))
        });
        if let Some(message) = &message
            && injecting
            && !last_round
        {
            let calls = shape.calls(message);
            if calls.iter().any(|c| injected.names.contains(&c.name)) {
                let results = run_tools(state, principal, &handle, &injected, calls, budget).await;
                rounds.extend(shape.round_messages(message, &results));
                round += 1;
                continue;
            }
        }
        if let Some(message) = &message {
            store_answer(state, &handle, shape, request_fp, message).await;
        }
        let mut answer = Response::new(Body::from(body));
        *answer.status_mut() = status;
        *answer.headers_mut() = answer_headers(&upstream_headers);
        tags.apply(answer.headers_mut());
        return Ok(answer);
    }
}

fn status_class(status: StatusCode) -> &'static str {
    if status.is_server_error() {
        "5xx"
    } else if status.is_client_error() {
        "4xx"
    } else {
        "other"
    }
}

/// The upstream could not be reached or stopped answering: 502 (or 504 for a timeout) with an
/// error in the request's shape.
fn unreachable(
    state: &AppState,
    shape: Shape,
    method: &str,
    url: &str,
    error: &UpstreamError,
    tags: Option<&SessionTags>,
) -> Response {
    let (status, kind) = match error {
        UpstreamError::Timeout => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
        UpstreamError::Transport(_) => (StatusCode::BAD_GATEWAY, "transport"),
    };
    state
        .inner
        .metrics
        .record_upstream_error(shape.name(), kind);
    tracing::warn!(shape = shape.name(), %url, %error, "proxy: upstream failed");
    let body = shape.error_body(
        &format!("upstream_{kind}"),
        &format!("lcm proxy: {method} {url}: {error}"),
    );
    let mut response = (status, axum::Json(body)).into_response();
    if let Some(tags) = tags {
        tags.apply(response.headers_mut());
    }
    response
}

/// An upstream error status, passed through with its body (or, when it sent none, one in the
/// request's shape saying so).
fn upstream_error(
    shape: Shape,
    status: StatusCode,
    upstream_headers: &HeaderMap,
    body: Bytes,
    tags: &SessionTags,
) -> Response {
    let mut response = if body.iter().all(u8::is_ascii_whitespace) {
        let body = shape.error_body(
            "upstream_error",
            &format!("lcm proxy: the upstream answered {status} with an empty body"),
        );
        (status, axum::Json(body)).into_response()
    } else {
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        *response.headers_mut() = answer_headers(upstream_headers);
        response
    };
    tags.apply(response.headers_mut());
    response
}

/// Runs the lcm tool calls of an answer; one `(call id, content, is_error)` per call, in order
/// (calls to the client's tools are answered "not run").
async fn run_tools(
    state: &AppState,
    principal: &Principal,
    handle: &SessionHandle,
    injected: &Injected,
    calls: Vec<Call>,
    budget: u64,
) -> Vec<(String, String, bool)> {
    let counter = TokenCounter::new(state.inner.config.tokenizer.encoding());
    // A result takes at most an eighth of the budget.
    let cap = (budget / 8).max(300);
    let mut out = Vec::with_capacity(calls.len());
    let mut ran = 0;
    for call in calls {
        if !injected.names.contains(&call.name) {
            out.push((
                call.id,
                format!(
                    "Not run: this answer also called lcm tools, which ran first. Call `{}` again if you still need it.",
                    call.name
                ),
                true,
            ));
            continue;
        }
        if ran == MAX_CALLS_PER_ROUND {
            out.push((
                call.id,
                format!("Not run: at most {MAX_CALLS_PER_ROUND} lcm tool calls run per answer."),
                true,
            ));
            continue;
        }
        ran += 1;
        state.inner.metrics.record_proxy_tool_call(&call.name);
        let (content, is_error) = match call.args {
            Err(message) => (
                json!({"error": "invalid_arguments", "message": message}).to_string(),
                true,
            ),
            Ok(mut args) => {
                // Results sized for the budget unless the model asked for a size.
                if matches!(call.name.as_str(), "lcm_grep" | "lcm_describe")
                    && let Some(fields) = args.as_object_mut()
                    && !fields.contains_key("max_tokens")
                {
                    fields.insert("max_tokens".into(), json!((cap * 3 / 4).clamp(300, 4000)));
                }
                match check_reach(state, principal, &args).await {
                    Err(message) => (
                        json!({"error": "not_permitted", "message": message}).to_string(),
                        true,
                    ),
                    Ok(()) => match handle.call_tool(&call.name, args).await {
                        Ok(value) => (value.to_string(), false),
                        Err(error) => (error.to_json().to_string(), true),
                    },
                }
            }
        };
        let keep = u32::try_from(cap).unwrap_or(u32::MAX);
        out.push((call.id, truncate_middle(&counter, &content, keep), is_error));
    }
    out
}

/// For a tenant: refuses tool arguments reaching beyond its sessions.
async fn check_reach(state: &AppState, principal: &Principal, args: &Value) -> Result<(), String> {
    if !principal.is_tenant() {
        return Ok(());
    }
    match args.get("session").and_then(Value::as_str) {
        None | Some("current") => {}
        Some("all") => {
            return Err("`session: all` reaches every tenant's sessions; name one of yours".into());
        }
        Some(name) => {
            state
                .visible_session(principal, name)
                .await
                .map_err(|e| e.message)?;
        }
    }
    for field in ["summary_id", "id"] {
        if let Some(id) = args.get(field).and_then(Value::as_str) {
            state
                .check_id_owner(principal, id)
                .await
                .map_err(|e| e.message)?;
        }
    }
    Ok(())
}

/// Stores the assistant's answer (a failure is logged: the client still gets its answer, and
/// the copy it sends back next turn is stored then).
async fn store_answer(
    state: &AppState,
    handle: &SessionHandle,
    shape: Shape,
    request_fp: u64,
    message: &Value,
) {
    let text = message.to_string();
    let parsed = match parse_client_message(shape, &text, message.clone()) {
        Ok(ClientMessage {
            parsed: Some(parsed),
            fp,
            ..
        }) => Some((parsed, fp)),
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(shape = shape.name(), %error, "proxy: the answer is not a message lcm can store");
            None
        }
    };
    let Some((mut message, fp)) = parsed else {
        return;
    };
    message.source_key = Some(answer_key(request_fp, fp));
    match handle.append(message).await {
        Ok(appended) => {
            if appended.inserted {
                state.inner.metrics.record_proxy_stored(1);
            }
        }
        Err(error) => {
            tracing::warn!(session = %handle.id(), %error, "proxy: storing the answer failed")
        }
    }
}

/// A streamed answer passed through as it comes.
struct StreamThrough {
    state: AppState,
    handle: Arc<SessionHandle>,
    shape: Shape,
    request_fp: u64,
    response: reqwest::Response,
    timeout: Duration,
    tags: SessionTags,
}

/// The answer streams to the client chunk by chunk; the answer rebuilt from its events is
/// stored before the stream ends (so a client that saw the end knows it is stored). A client
/// that goes away ends the upstream stream too, and nothing is stored.
fn stream_through(through: StreamThrough) -> Response {
    struct Tee {
        through: StreamThrough,
        accumulator: Option<Accumulator>,
        done: bool,
    }
    let status = through.response.status();
    let mut headers = answer_headers(through.response.headers());
    through.tags.apply(&mut headers);
    let shape = through.shape;
    let tee = Tee {
        through,
        accumulator: Some(Accumulator::new(shape)),
        done: false,
    };
    let stream = futures_util::stream::unfold(tee, |mut tee| async move {
        if tee.done {
            return None;
        }
        let t = &mut tee.through;
        match next_chunk(&mut t.response, t.timeout).await {
            Ok(Some(bytes)) => {
                if let Some(accumulator) = &mut tee.accumulator {
                    accumulator.feed(&bytes);
                }
                Some((Ok(bytes), tee))
            }
            Ok(None) => {
                if let Some(message) = tee.accumulator.take().and_then(Accumulator::finish) {
                    store_answer(&t.state, &t.handle, t.shape, t.request_fp, &message).await;
                }
                None
            }
            Err(error) => {
                let kind = match error {
                    UpstreamError::Timeout => "timeout",
                    UpstreamError::Transport(_) => "transport",
                };
                t.state
                    .inner
                    .metrics
                    .record_upstream_error(t.shape.name(), kind);
                tracing::warn!(shape = t.shape.name(), %error, "proxy: the upstream stream broke off");
                tee.done = true;
                Some((Err(std::io::Error::other(error.to_string())), tee))
            }
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    if !response.headers().contains_key(header::CONTENT_TYPE) {
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_before_anything_is_stored() {
        for (body, expected) in [
            (&b"{\"messages\": ["[..], "not valid JSON"),
            (b"[]", "must be a JSON object"),
            (b"{}", "`messages` is missing"),
            (b"{\"messages\": {}}", "must be an array"),
            (b"{\"messages\": []}", "holds no message"),
            (
                b"{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}]}",
                "no message with content",
            ),
            (
                b"{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}",
                "messages[0]",
            ),
            (
                b"{\"stream\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
                "`stream`",
            ),
        ] {
            let err = parse_request(Shape::OpenAi, body).err().expect("refused");
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert!(err.message.contains(expected), "{}", err.message);
        }
        let request = parse_request(
            Shape::OpenAi,
            br#"{"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}, {"role": "system", "content": "later"}]}"#,
        )
        .unwrap();
        assert_eq!(request.leading.len(), 1);
        assert_eq!(request.messages.len(), 2);
        assert_eq!(request.system_text, "be brief");
        assert!(!request.base.contains_key("messages"));
    }

    #[test]
    fn session_keys() {
        let mut headers = HeaderMap::new();
        let admin = Principal::Admin;
        assert_eq!(session_key(&admin, &headers, "d".into()).unwrap(), "d");
        let tenant = Principal::Tenant {
            prefix: "team-a/".into(),
        };
        assert_eq!(
            session_key(&tenant, &headers, "d".into()).unwrap(),
            "team-a/d"
        );
        headers.insert(SESSION_HEADER, "team-a/chat".parse().unwrap());
        assert_eq!(
            session_key(&tenant, &headers, "d".into()).unwrap(),
            "team-a/chat"
        );
        headers.insert(SESSION_HEADER, "chat".parse().unwrap());
        assert_eq!(
            session_key(&tenant, &headers, "d".into()).unwrap(),
            "team-a/chat"
        );
        assert_eq!(session_key(&admin, &headers, "d".into()).unwrap(), "chat");
        headers.insert(BUDGET_HEADER, "12".parse().unwrap());
        assert!(budget_for(&headers, 5000).is_err());
        headers.insert(BUDGET_HEADER, "9000".parse().unwrap());
        assert_eq!(budget_for(&headers, 5000).unwrap(), 9000);
    }
}
