//! The route table (the one place that lists what the server serves), the router built from
//! it, and the middleware every request goes through: authentication, the request timeout,
//! panic containment, metrics and the request log.
//!
//! The OpenAPI document (`docs/openapi.json`) is checked against [`ROUTES`] by a test, so a
//! route cannot be added or removed without the document following.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use futures_util::FutureExt;

use crate::auth::Principal;
use crate::error::ApiError;
use crate::explorer;
use crate::handlers;
use crate::proxy;
use crate::state::AppState;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token (`/healthz` only).
    Public,
    /// Any valid token (admin or tenant); handlers restrict tenants to their sessions.
    Authenticated,
    /// The admin token only (server-wide routes: maps, integrity, metrics).
    Admin,
}

/// One route of the API.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// The HTTP method, upper case.
    pub method: &'static str,
    /// The path, with `{name}` parameters (the OpenAPI and axum syntax alike).
    pub path: &'static str,
    /// Who may call it.
    pub access: Access,
    /// A response that stays open (server-sent events): exempt from the request timeout.
    pub streaming: bool,
    /// What it does, in a few words.
    pub summary: &'static str,
    handler: fn() -> MethodRouter<AppState>,
}

const fn route(
    method: &'static str,
    path: &'static str,
    access: Access,
    summary: &'static str,
    handler: fn() -> MethodRouter<AppState>,
) -> Route {
    Route {
        method,
        path,
        access,
        streaming: false,
        summary,
        handler,
    }
}

use Access::{Admin, Authenticated, Public};

/// Every route the server serves.
pub const ROUTES: &[Route] = &[
    route("GET", "/healthz", Public, "The process is up.", || {
        get(handlers::healthz)
    }),
    route(
        "GET",
        "/readyz",
        Authenticated,
        "The runtime is up and taking work.",
        || get(handlers::readyz),
    ),
    route(
        "GET",
        "/openapi.json",
        Authenticated,
        "This API's OpenAPI 3.1 document.",
        || get(handlers::openapi),
    ),
    route(
        "GET",
        "/metrics",
        Admin,
        "Prometheus metrics (text exposition format).",
        || get(handlers::metrics),
    ),
    route(
        "POST",
        "/v1/sessions",
        Authenticated,
        "Create a session (or get the one with that key).",
        || post(handlers::create_session),
    ),
    route(
        "GET",
        "/v1/sessions",
        Authenticated,
        "List sessions.",
        || get(handlers::list_sessions),
    ),
    route(
        "GET",
        "/v1/sessions/{id}",
        Authenticated,
        "One session (by id or key).",
        || get(handlers::get_session),
    ),
    route(
        "GET",
        "/v1/sessions/{id}/messages",
        Authenticated,
        "A page of the session's messages by position (`from`, `limit`), for the explorer.",
        || get(explorer::messages_page),
    ),
    route(
        "GET",
        "/v1/sessions/{id}/layout",
        Authenticated,
        "The session's context as it stands, without compacting: summaries and the raw tail.",
        || get(explorer::layout),
    ),
    route(
        "POST",
        "/v1/sessions/{id}/messages",
        Authenticated,
        "Append one message or a batch (durable when answered).",
        || post(handlers::append_messages),
    ),
    route(
        "GET",
        "/v1/sessions/{id}/context",
        Authenticated,
        "The context to send for a budget, in the OpenAI or Anthropic shape.",
        || get(handlers::get_context),
    ),
    route(
        "POST",
        "/v1/sessions/{id}/tools/{name}",
        Authenticated,
        "Call a tool as the session's main agent (body: the arguments).",
        || post(handlers::call_tool),
    ),
    route(
        "GET",
        "/v1/tools",
        Authenticated,
        "The tools' definitions, in the OpenAI or Anthropic shape.",
        || get(handlers::list_tools),
    ),
    route(
        "POST",
        "/v1/grep",
        Authenticated,
        "Search stored messages (lcm_grep's arguments).",
        || post(handlers::grep),
    ),
    route(
        "GET",
        "/v1/describe/{id}",
        Authenticated,
        "What an id (sum_N, msg_N, ses_N) stands for (lcm_describe).",
        || get(handlers::describe),
    ),
    route(
        "GET",
        "/v1/stats",
        Admin,
        "The store's totals and the index's watermark.",
        || get(explorer::stats),
    ),
    route(
        "GET",
        "/ui",
        Public,
        "The web explorer (its page holds no data; it reads this API with the caller's token).",
        || get(explorer::index),
    ),
    route(
        "GET",
        "/ui/{*path}",
        Public,
        "The web explorer at an address (`/ui/sessions/ses_3`), or one of its files.",
        || get(explorer::asset),
    ),
    route("POST", "/v1/maps", Admin, "Start an llm_map job.", || {
        post(handlers::start_map)
    }),
    route("GET", "/v1/maps", Admin, "List map jobs.", || {
        get(handlers::list_maps)
    }),
    route(
        "GET",
        "/v1/maps/{job}",
        Admin,
        "A map job and its progress.",
        || get(handlers::get_map),
    ),
    Route {
        streaming: true,
        ..route(
            "GET",
            "/v1/maps/{job}/events",
            Admin,
            "Server-sent events of a map job's progress, until it ends.",
            || get(handlers::map_events),
        )
    },
    route(
        "POST",
        "/v1/maps/{job}/cancel",
        Admin,
        "Cancel a map job.",
        || post(handlers::cancel_map),
    ),
    route(
        "POST",
        "/v1/integrity",
        Admin,
        "Run the store's integrity check (and the safe repairs with ?repair=true).",
        || post(handlers::integrity),
    ),
    // The proxy: bounded by proxy.timeout_s per upstream wait rather than by the request
    // timeout (an answer may stream for long).
    Route {
        streaming: true,
        ..route(
            "POST",
            "/v1/chat/completions",
            Authenticated,
            "OpenAI-compatible proxy: store the new messages, send lcm's context upstream.",
            || post(proxy::openai_chat),
        )
    },
    route(
        "GET",
        "/v1/models",
        Authenticated,
        "Proxy: the upstream's model list, passed through.",
        || get(proxy::models),
    ),
    Route {
        streaming: true,
        ..route(
            "POST",
            "/v1/messages",
            Authenticated,
            "Anthropic-compatible proxy: store the new messages, send lcm's context upstream.",
            || post(proxy::anthropic_messages),
        )
    },
    route(
        "POST",
        "/v1/messages/count_tokens",
        Authenticated,
        "Proxy: Anthropic's token count of the request as sent, passed through.",
        || post(proxy::anthropic_count_tokens),
    ),
];

/// Routes whose `Authorization` header may carry the upstream's key, lcm's own token then
/// coming in `x-lcm-token`.
fn upstream_credentials(route: &Route) -> bool {
    matches!(
        route.path,
        "/v1/chat/completions" | "/v1/messages" | "/v1/messages/count_tokens" | "/v1/models"
    )
}

/// The route serving `method` on the matched `path`, if any.
pub fn find(method: &str, path: &str) -> Option<&'static Route> {
    ROUTES
        .iter()
        .find(|r| r.path == path && r.method.eq_ignore_ascii_case(method))
}

/// The application: every route of [`ROUTES`], the JSON fallbacks and the middleware.
pub(crate) fn router(state: AppState) -> Router {
    let mut by_path: BTreeMap<&'static str, MethodRouter<AppState>> = BTreeMap::new();
    for route in ROUTES {
        let handler = (route.handler)();
        let merged = match by_path.remove(route.path) {
            Some(existing) => existing.merge(handler),
            None => handler,
        };
        by_path.insert(route.path, merged);
    }
    let mut router = Router::new();
    for (path, methods) in by_path {
        router = router.route(path, methods.fallback(method_not_allowed));
    }
    let limit = usize::try_from(state.max_body_bytes()).unwrap_or(usize::MAX);
    router
        .fallback(no_route)
        .layer(from_fn_with_state(state.clone(), middleware))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn no_route() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        "no such route: see GET /openapi.json for the routes of this API",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method: see GET /openapi.json",
    )
}

/// Authentication, timeout, panic containment, metrics and the request log, for every request.
async fn middleware(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().as_str().to_owned();
    let matched = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned());
    let route = matched.as_deref().and_then(|path| find(&method, path));
    let label = matched.clone().unwrap_or_else(|| "unmatched".to_owned());
    let access = route.map_or(Access::Authenticated, |r| r.access);
    // On the proxy routes, lcm's token may come in `x-lcm-token` (Authorization then carries
    // the upstream's key).
    let lcm_token = route
        .filter(|r| upstream_credentials(r))
        .and_then(|_| req.headers().get(proxy::TOKEN_HEADER))
        .map(|token| {
            let mut headers = axum::http::HeaderMap::new();
            let value = format!("Bearer {}", token.to_str().unwrap_or_default());
            if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
                headers.insert(axum::http::header::AUTHORIZATION, value);
            }
            headers
        });
    let credentials = lcm_token.as_ref().unwrap_or(req.headers());
    let principal = match access {
        Access::Public => Ok(Principal::Public),
        Access::Authenticated => state.inner.auth.authenticate(credentials),
        Access::Admin => state
            .inner
            .auth
            .authenticate(credentials)
            .and_then(|p| p.require_admin().map(|()| p)),
    };
    let response = match principal {
        Err(error) => error.into_response(),
        Ok(principal) => {
            req.extensions_mut().insert(principal);
            let run = AssertUnwindSafe(next.run(req)).catch_unwind();
            let outcome = if route.is_some_and(|r| r.streaming) {
                Ok(run.await)
            } else {
                tokio::time::timeout(state.request_timeout(), run).await
            };
            match outcome {
                Ok(Ok(response)) => response,
                Ok(Err(_panic)) => {
                    tracing::error!(%method, route = %label, "a request handler panicked");
                    ApiError::internal("the request failed inside the server (a handler panicked); nothing stored was left half-written").into_response()
                }
                Err(_elapsed) => ApiError::unavailable(
                    "timeout",
                    format!(
                        "the request took longer than server.request_timeout_s ({} s)",
                        state.request_timeout().as_secs()
                    ),
                )
                .into_response(),
            }
        }
    };
    let took = started.elapsed();
    let status = response.status().as_u16();
    // Labels stay bounded whatever clients send: route templates, standard methods.
    let method_label = match method.as_str() {
        "GET" | "POST" | "PUT" | "PATCH" | "DELETE" | "HEAD" | "OPTIONS" => method.as_str(),
        _ => "other",
    };
    state
        .inner
        .metrics
        .record_request(&label, method_label, status, took);
    let latency_ms = took.as_secs_f64() * 1000.0;
    if status >= 500 {
        tracing::warn!(%method, route = %label, status, latency_ms, "request failed");
    } else {
        tracing::info!(%method, route = %label, status, latency_ms, "request");
    }
    response
}
