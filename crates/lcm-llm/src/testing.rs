//! A scripted loopback HTTP server that speaks both provider shapes, for tests (feature
//! `test-server`).
//!
//! The server binds `127.0.0.1:0`, answers `POST .../chat/completions` in the OpenAI shape and
//! `POST .../messages` in the Anthropic shape (so `/v1/chat/completions`, `/chat/completions`,
//! `/v1/messages` and `/messages` all work), and replies from a script: a queue of
//! [`ScriptedReply`]s consumed one per request, then a default reply ([`ScriptedReply::Echo`]
//! unless changed). It records every request (method, path, headers, JSON body) for assertions.
//! `GET .../models` lists one model, `scripted-model`; `POST .../messages/count_tokens` answers
//! `{"input_tokens": N}`, N the length of the request's `messages` as JSON.
//!
//! ```no_run
//! # async fn demo() {
//! use lcm_llm::testing::{ScriptedReply, ScriptedServer};
//! let server = ScriptedServer::start().await;
//! server.push(ScriptedReply::status(503));
//! server.push(ScriptedReply::ok("a summary"));
//! let base_url = server.url(); // http://127.0.0.1:PORT/v1
//! // ... call a provider configured with base_url ...
//! assert_eq!(server.requests().len(), 2);
//! # }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScriptedReply {
    /// 200 with a well-formed completion carrying `text` (and `reasoning` as
    /// `reasoning_content` / a `thinking` block).
    Ok {
        /// The answer text.
        text: String,
        /// The reasoning, if any.
        reasoning: Option<String>,
    },
    /// An error status with the shape's error JSON (or `body` when given) and an optional
    /// `retry-after` header (seconds or an HTTP date, sent as given).
    Status {
        /// The HTTP status.
        code: u16,
        /// The `retry-after` header value.
        retry_after: Option<String>,
        /// The body; `None` sends the shape's error JSON.
        body: Option<String>,
    },
    /// Waits `duration`, then answers `then`.
    Delay {
        /// How long to wait before answering.
        duration: Duration,
        /// The answer after the wait.
        then: Box<ScriptedReply>,
    },
    /// 200 with `content-type: application/json` and this body, which need not be JSON.
    Garbage(String),
    /// 200 with a well-formed completion with no text at all (`content: ""` in the OpenAI
    /// shape, an empty `content` array in the Anthropic shape).
    Empty,
    /// 200 with `Summary: ` and the first quarter (at most 64 words) of the last user message.
    /// When that message fences its content between lines of `=====`, only the fenced part is
    /// echoed. The default reply.
    Echo,
    /// 200 with tool calls (`tool_calls` with `finish_reason: "tool_calls"` in the OpenAI shape,
    /// `tool_use` blocks with `stop_reason: "tool_use"` in the Anthropic shape), optionally
    /// preceded by `text`. Each call is `(name, arguments)`, the arguments as raw text: sent as
    /// the `function.arguments` string in the OpenAI shape; in the Anthropic shape parsed into
    /// the `input` object, or, when they are not JSON, sent as an `input` *string* (which the
    /// client reads as malformed arguments). Call ids are `call_<request>_<index>` (OpenAI) and
    /// `toolu_<request>_<index>` (Anthropic), `<request>` counting requests from 1.
    ToolCalls {
        /// Text before the calls, if any.
        text: Option<String>,
        /// `(tool name, raw arguments)`, in order.
        calls: Vec<(String, String)>,
    },
    /// The reply a function computes from the request (for answers that depend on what was
    /// asked, e.g. per item of a map job under concurrency). It may return any other reply,
    /// including a delay.
    Dynamic(Responder),
}

/// The function behind [`ScriptedReply::Dynamic`]. Two responders are equal when they are the
/// same function object.
#[derive(Clone)]
pub struct Responder(Arc<dyn Fn(&RecordedRequest) -> ScriptedReply + Send + Sync>);

impl Responder {
    /// The reply to `request`.
    pub fn reply(&self, request: &RecordedRequest) -> ScriptedReply {
        (self.0)(request)
    }
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Responder(..)")
    }
}

impl PartialEq for Responder {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Responder {}

impl ScriptedReply {
    /// A successful answer with `text`.
    pub fn ok(text: impl Into<String>) -> Self {
        ScriptedReply::Ok {
            text: text.into(),
            reasoning: None,
        }
    }

    /// A successful answer with `text` and `reasoning`.
    pub fn ok_with_reasoning(text: impl Into<String>, reasoning: impl Into<String>) -> Self {
        ScriptedReply::Ok {
            text: text.into(),
            reasoning: Some(reasoning.into()),
        }
    }

    /// A successful answer with reasoning and no text.
    pub fn reasoning_only(reasoning: impl Into<String>) -> Self {
        Self::ok_with_reasoning("", reasoning)
    }

    /// An error status with the shape's error JSON.
    pub fn status(code: u16) -> Self {
        ScriptedReply::Status {
            code,
            retry_after: None,
            body: None,
        }
    }

    /// A 429 with `retry-after: <retry_after>` (seconds, or an HTTP date).
    pub fn rate_limited(retry_after: impl Into<String>) -> Self {
        ScriptedReply::Status {
            code: 429,
            retry_after: Some(retry_after.into()),
            body: None,
        }
    }

    /// `then`, after `duration`.
    pub fn delayed(duration: Duration, then: ScriptedReply) -> Self {
        ScriptedReply::Delay {
            duration,
            then: Box::new(then),
        }
    }

    /// A 200 whose body is `body` (not JSON, typically).
    pub fn garbage(body: impl Into<String>) -> Self {
        ScriptedReply::Garbage(body.into())
    }

    /// A reply computed from each request by `respond` (see [`ScriptedReply::Dynamic`]).
    pub fn from_fn(
        respond: impl Fn(&RecordedRequest) -> ScriptedReply + Send + Sync + 'static,
    ) -> Self {
        ScriptedReply::Dynamic(Responder(Arc::new(respond)))
    }

    /// A turn of tool calls `(name, raw arguments)` without text (see
    /// [`ScriptedReply::ToolCalls`]).
    pub fn tool_calls<N: Into<String>, A: Into<String>>(
        calls: impl IntoIterator<Item = (N, A)>,
    ) -> Self {
        ScriptedReply::ToolCalls {
            text: None,
            calls: calls
                .into_iter()
                .map(|(name, arguments)| (name.into(), arguments.into()))
                .collect(),
        }
    }

    /// A turn of `text` followed by tool calls `(name, raw arguments)`.
    pub fn tool_calls_with_text<N: Into<String>, A: Into<String>>(
        text: impl Into<String>,
        calls: impl IntoIterator<Item = (N, A)>,
    ) -> Self {
        ScriptedReply::ToolCalls {
            text: Some(text.into()),
            calls: calls
                .into_iter()
                .map(|(name, arguments)| (name.into(), arguments.into()))
                .collect(),
        }
    }
}

/// The API shape of a request, chosen by its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiShape {
    /// `.../chat/completions`.
    OpenAi,
    /// `.../messages`.
    Anthropic,
    /// Any other path (answered 404).
    Unknown,
}

impl ApiShape {
    fn of(path: &str) -> Self {
        if path.ends_with("/chat/completions") {
            ApiShape::OpenAi
        } else if path.ends_with("/messages") {
            ApiShape::Anthropic
        } else {
            ApiShape::Unknown
        }
    }
}

/// A request the server received.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// The HTTP method.
    pub method: String,
    /// The path (without the query).
    pub path: String,
    /// The headers, names lowercased (the last value wins for repeated names).
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`Value::Null` when it is not JSON).
    pub body: Value,
    /// The body as text (lossy UTF-8).
    pub raw_body: String,
}

impl RecordedRequest {
    /// The value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// The API shape, by path.
    pub fn shape(&self) -> ApiShape {
        ApiShape::of(&self.path)
    }

    /// The text of the last `user` message of the body, in either shape.
    pub fn last_user_text(&self) -> Option<String> {
        last_user_text(&self.body)
    }
}

#[derive(Debug)]
struct Shared {
    script: Mutex<VecDeque<ScriptedReply>>,
    default: Mutex<ScriptedReply>,
    latency: Mutex<Duration>,
    requests: Mutex<Vec<RecordedRequest>>,
    received: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The scripted server. Stops (and drops its open connections) when dropped.
#[derive(Debug)]
pub struct ScriptedServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ScriptedServer {
    /// Starts a server on `127.0.0.1` with an ephemeral port, on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// When the loopback port cannot be bound (use [`ScriptedServer::try_start`] to handle it).
    pub async fn start() -> Self {
        match Self::try_start().await {
            Ok(server) => server,
            Err(error) => panic!("cannot bind the scripted test server on 127.0.0.1: {error}"),
        }
    }

    /// Starts a server, or says why the port could not be bound.
    pub async fn try_start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            script: Mutex::new(VecDeque::new()),
            default: Mutex::new(ScriptedReply::Echo),
            latency: Mutex::new(Duration::ZERO),
            requests: Mutex::new(Vec::new()),
            received: Notify::new(),
        });
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(ScriptedServer { addr, shared, task })
    }

    /// The base URL with the version segment: `http://127.0.0.1:PORT/v1` (what both providers
    /// accept: OpenAI appends `/chat/completions`, Anthropic `/messages`).
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The base URL without a path: `http://127.0.0.1:PORT`.
    pub fn root_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues `reply` for a coming request.
    pub fn push(&self, reply: ScriptedReply) {
        lock(&self.shared.script).push_back(reply);
    }

    /// Queues several replies, in order.
    pub fn push_all(&self, replies: impl IntoIterator<Item = ScriptedReply>) {
        lock(&self.shared.script).extend(replies);
    }

    /// Sets the reply used when the queue is empty (initially [`ScriptedReply::Echo`]).
    pub fn set_default(&self, reply: ScriptedReply) {
        *lock(&self.shared.default) = reply;
    }

    /// Adds `latency` before every answer (initially none).
    pub fn set_latency(&self, latency: Duration) {
        *lock(&self.shared.latency) = latency;
    }

    /// Replies still queued.
    pub fn pending(&self) -> usize {
        lock(&self.shared.script).len()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests were received so far.
    pub fn request_count(&self) -> usize {
        lock(&self.shared.requests).len()
    }

    /// Forgets the recorded requests and the queued replies (the default and latency stay).
    pub fn reset(&self) {
        lock(&self.shared.requests).clear();
        lock(&self.shared.script).clear();
    }

    /// Waits until at least `count` requests were received, or `timeout` passes; returns whether
    /// they were.
    pub async fn wait_for_requests(&self, count: usize, timeout: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.shared.received.notified();
                if self.request_count() >= count {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Connections live in the set, so aborting this task closes them all.
    let mut connections = JoinSet::new();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _peer)) => stream,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        connections.spawn(async move {
            let service = service_fn(move |request| handle(Arc::clone(&shared), request));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        while connections.try_join_next().is_some() {}
    }
}

async fn handle(
    shared: Arc<Shared>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let headers = request
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let bytes = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let raw_body = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let recorded = RecordedRequest {
        method,
        path,
        headers,
        body,
        raw_body,
    };
    let shape = recorded.shape();
    let model = recorded
        .body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("scripted-model")
        .to_owned();
    let user_text = recorded.last_user_text().unwrap_or_default();
    let number = {
        let mut requests = lock(&shared.requests);
        requests.push(recorded.clone());
        requests.len()
    };
    shared.received.notify_waiters();

    // Model listing, in the shape both APIs share closely enough for a client to read its ids.
    if recorded.method == "GET" && recorded.path.ends_with("/models") {
        let body =
            r#"{"object":"list","data":[{"id":"scripted-model","object":"model","type":"model"}]}"#;
        return Ok(respond(200, None, body.into()));
    }
    // Anthropic's token counting: one "token" per byte of the request's `messages` as JSON, so
    // a test can tell the body arrived whole.
    if recorded.method == "POST" && recorded.path.ends_with("/messages/count_tokens") {
        let counted = recorded
            .body
            .get("messages")
            .map_or(0, |m| m.to_string().len());
        let body = format!("{{\"input_tokens\":{counted}}}");
        return Ok(respond(200, None, body));
    }
    if shape == ApiShape::Unknown {
        return Ok(respond(404, None, "{\"error\":\"unknown path\"}".into()));
    }
    let latency = *lock(&shared.latency);
    let mut reply = lock(&shared.script)
        .pop_front()
        .unwrap_or_else(|| lock(&shared.default).clone());
    let mut wait = latency;
    let reply = loop {
        reply = match reply {
            ScriptedReply::Delay { duration, then } => {
                wait += duration;
                *then
            }
            ScriptedReply::Dynamic(responder) => responder.reply(&recorded),
            other => break other,
        };
    };
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    let ctx = ReplyContext {
        shape,
        model: &model,
        number,
        user_text: &user_text,
    };
    Ok(ctx.render(reply))
}

struct ReplyContext<'a> {
    shape: ApiShape,
    model: &'a str,
    number: usize,
    user_text: &'a str,
}

impl ReplyContext<'_> {
    fn render(&self, reply: ScriptedReply) -> Response<Full<Bytes>> {
        match reply {
            ScriptedReply::Ok { text, reasoning } => self.completion(&text, reasoning.as_deref()),
            ScriptedReply::Empty => self.completion("", None),
            ScriptedReply::Echo => self.completion(&echo(self.user_text), None),
            ScriptedReply::ToolCalls { text, calls } => self.tool_calls(text.as_deref(), &calls),
            ScriptedReply::Garbage(body) => respond(200, None, body),
            ScriptedReply::Status {
                code,
                retry_after,
                body,
            } => {
                let body = body.unwrap_or_else(|| self.error_body(code));
                respond(code, retry_after, body)
            }
            // Delays and dynamic replies were resolved by the caller.
            ScriptedReply::Delay { then, .. } => self.render(*then),
            ScriptedReply::Dynamic(responder) => {
                self.completion(&format!("unresolved dynamic reply {responder:?}"), None)
            }
        }
    }

    fn completion(&self, text: &str, reasoning: Option<&str>) -> Response<Full<Bytes>> {
        let prompt_tokens = self.user_text.split_whitespace().count();
        let completion_tokens = text.split_whitespace().count();
        let body = match self.shape {
            ApiShape::Anthropic => {
                let mut content = Vec::new();
                if let Some(reasoning) = reasoning {
                    content.push(
                        json!({"type": "thinking", "thinking": reasoning, "signature": "scripted"}),
                    );
                }
                if !text.is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
                json!({
                    "id": format!("msg_scripted_{}", self.number),
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": content,
                    "stop_reason": "end_turn",
                    "stop_sequence": null,
                    "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
                })
            }
            _ => {
                let mut message = json!({"role": "assistant", "content": text});
                if let Some(reasoning) = reasoning {
                    message["reasoning_content"] = Value::from(reasoning);
                }
                json!({
                    "id": format!("chatcmpl-scripted-{}", self.number),
                    "object": "chat.completion",
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens
                    }
                })
            }
        };
        respond(200, None, body.to_string())
    }

    fn tool_calls(&self, text: Option<&str>, calls: &[(String, String)]) -> Response<Full<Bytes>> {
        let prompt_tokens = self.user_text.split_whitespace().count();
        let completion_tokens = text.unwrap_or("").split_whitespace().count()
            + calls
                .iter()
                .map(|(_, arguments)| arguments.split_whitespace().count().max(1))
                .sum::<usize>();
        let body = match self.shape {
            ApiShape::Anthropic => {
                let mut content = Vec::new();
                if let Some(text) = text.filter(|text| !text.is_empty()) {
                    content.push(json!({"type": "text", "text": text}));
                }
                for (index, (name, arguments)) in calls.iter().enumerate() {
                    let input = serde_json::from_str::<Value>(arguments)
                        .unwrap_or_else(|_| Value::from(arguments.as_str()));
                    content.push(json!({
                        "type": "tool_use",
                        "id": format!("toolu_{}_{index}", self.number),
                        "name": name,
                        "input": input,
                    }));
                }
                json!({
                    "id": format!("msg_scripted_{}", self.number),
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": content,
                    "stop_reason": "tool_use",
                    "stop_sequence": null,
                    "usage": {"input_tokens": prompt_tokens, "output_tokens": completion_tokens}
                })
            }
            _ => {
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .enumerate()
                    .map(|(index, (name, arguments))| {
                        json!({
                            "id": format!("call_{}_{index}", self.number),
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        })
                    })
                    .collect();
                let content = text.map_or(Value::Null, Value::from);
                json!({
                    "id": format!("chatcmpl-scripted-{}", self.number),
                    "object": "chat.completion",
                    "model": self.model,
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": content, "tool_calls": tool_calls},
                        "finish_reason": "tool_calls"
                    }],
                    "usage": {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens
                    }
                })
            }
        };
        respond(200, None, body.to_string())
    }

    fn error_body(&self, code: u16) -> String {
        let message = format!("scripted status {code}");
        let body = match self.shape {
            ApiShape::Anthropic => {
                let kind = match code {
                    429 => "rate_limit_error",
                    401 => "authentication_error",
                    403 => "permission_error",
                    529 => "overloaded_error",
                    500..=599 => "api_error",
                    _ => "invalid_request_error",
                };
                json!({"type": "error", "error": {"type": kind, "message": message}})
            }
            _ => {
                let kind = match code {
                    429 => "rate_limit_exceeded",
                    401 | 403 => "authentication_error",
                    500..=599 => "server_error",
                    _ => "invalid_request_error",
                };
                json!({"error": {"message": message, "type": kind, "param": null, "code": null}})
            }
        };
        body.to_string()
    }
}

fn respond(code: u16, retry_after: Option<String>, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    if let Some(value) = retry_after
        .as_deref()
        .and_then(|v| hyper::header::HeaderValue::from_str(v).ok())
    {
        headers.insert(hyper::header::RETRY_AFTER, value);
    }
    response
}

/// The text of the last user message in either shape.
fn last_user_text(body: &Value) -> Option<String> {
    let message = body
        .get("messages")?
        .as_array()?
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    match message.get("content")? {
        Value::String(text) => Some(text.clone()),
        Value::Array(blocks) => Some(
            blocks
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        _ => None,
    }
}

/// `Summary: ` and the first quarter (at most 64 words) of the fenced part of `text`, or of all
/// of it.
fn echo(text: &str) -> String {
    let fenced: Vec<&str> = text
        .lines()
        .skip_while(|line| !is_fence(line))
        .skip(1)
        .take_while(|line| !is_fence(line))
        .collect();
    let source = if fenced.is_empty() {
        text.to_owned()
    } else {
        fenced.join("\n")
    };
    let words: Vec<&str> = source.split_whitespace().collect();
    let keep = (words.len() / 4).clamp(1, 64).min(words.len());
    format!("Summary: {}", words[..keep].join(" "))
}

fn is_fence(line: &str) -> bool {
    let line = line.trim();
    line.len() >= 10 && line.starts_with("=====") && line.ends_with("=====")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_prefers_fenced_content() {
        let text = "Instructions here.\n\n=====UNTRUSTED CONTENT=====\none two three four five six seven eight\n=====UNTRUSTED CONTENT=====\nReminder.";
        assert_eq!(echo(text), "Summary: one two");
        assert_eq!(echo("a b c d e f g h"), "Summary: a b");
        assert_eq!(echo(""), "Summary: ");
    }
}
