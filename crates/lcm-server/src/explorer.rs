//! The web explorer: its page and scripts (embedded in the binary, served at `/ui`), and the
//! read-only routes it needs beyond the rest of the API: a session's context as it stands
//! (without compacting), a page of a session's messages, and the store's totals.
//!
//! The page holds no data: everything it shows comes from the JSON API with the caller's token,
//! so it is public like `/healthz`, and the API's authentication and tenant rules apply to
//! every request it makes.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use lcm_core::message::search_text;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Principal;
use crate::error::{ApiError, PathParams, QueryParams};
use crate::state::AppState;

type ApiResult<T = Json<Value>> = Result<T, ApiError>;

/// The explorer's files, as built into the binary: (path under `/ui/assets/`, content type,
/// content).
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../ui/app.js"),
    ),
    (
        "style.css",
        "text/css; charset=utf-8",
        include_str!("../ui/style.css"),
    ),
];

/// The page every `/ui` address loads; the script draws the view the address names.
const INDEX: &str = include_str!("../ui/index.html");

/// Same-origin only: the page loads its own script and style and talks to its own API.
const CSP: &str = "default-src 'self'; img-src 'self' data:; style-src 'self'; \
                   script-src 'self'; connect-src 'self'; frame-ancestors 'none'";

fn page(status: StatusCode, content_type: &str, body: &'static str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// `GET /ui`: the explorer's page.
pub(crate) async fn index() -> Response {
    page(StatusCode::OK, "text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{*path}`: a file of the explorer under `assets/`, else the page (the script reads
/// the address: `/ui/sessions/ses_3`, `/ui/summaries/sum_12`, ...).
pub(crate) async fn asset(PathParams(path): PathParams<String>) -> Response {
    match path.strip_prefix("assets/") {
        Some(name) => match ASSETS.iter().find(|(n, _, _)| *n == name) {
            Some((_, content_type, body)) => page(StatusCode::OK, content_type, body),
            None => ApiError::not_found(format!("no explorer file `{name}`")).into_response(),
        },
        None => page(StatusCode::OK, "text/html; charset=utf-8", INDEX),
    }
}

/// `GET /v1/sessions/{id}/layout`: what the session's context holds now, without compacting:
/// the top-level summaries with their sizes and coverage, and the raw tail's size.
pub(crate) async fn layout(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> ApiResult {
    let info = state.visible_session(&principal, &id).await?;
    let session = info.id;
    let (context, summaries, all) = state
        .blocking(move |store| {
            let reader = store.reader()?;
            let context = reader.context(session)?;
            let summaries = context
                .summaries
                .iter()
                .map(|id| reader.summary(*id))
                .collect::<Result<Vec<_>, _>>()?;
            // Counted, not read: a session may have thousands of summaries.
            let all = store.session_summary_count(session)?;
            Ok((context, summaries, all))
        })
        .await?;
    let covered: u64 = summaries.iter().map(|s| s.descendant_tokens).sum();
    let top: Vec<Value> = summaries
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "kind": s.kind.as_str(),
                "depth": s.depth,
                "token_count": s.token_count,
                "descendant_messages": s.descendant_messages,
                "descendant_tokens": s.descendant_tokens,
                "first_seq": s.first_seq,
                "last_seq": s.last_seq,
                "earliest_at": s.earliest_at,
                "latest_at": s.latest_at,
                "files": s.file_ids.len(),
            })
        })
        .collect();
    Ok(Json(json!({
        "session": info,
        "summaries": top,
        "summary_count": all,
        "raw_from": context.raw_from,
        "raw_messages": info.message_count.saturating_sub(context.raw_from),
        "raw_tokens": info.token_total.saturating_sub(covered),
    })))
}

/// `GET /v1/sessions/{id}/messages` query: a page of the session's messages by position.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagesQuery {
    /// The first position (`seq`) of the page.
    #[serde(default)]
    from: u64,
    /// Messages in the page (default 50, at most 500).
    #[serde(default)]
    limit: Option<u64>,
}

/// Characters of a message's text a page shows (the whole message is `GET /v1/describe`).
const PREVIEW_CHARS: usize = 400;

/// `GET /v1/sessions/{id}/messages?from=SEQ&limit=N`: a page of the session's messages in
/// order, each with its role, time, tokens, the start of its text and the tools it calls.
pub(crate) async fn messages_page(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
    QueryParams(query): QueryParams<MessagesQuery>,
) -> ApiResult {
    let limit = query.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "`limit` must be between 1 and 500, got {limit}"
        )));
    }
    let info = state.visible_session(&principal, &id).await?;
    let (session, from) = (info.id, query.from);
    let end = from.saturating_add(limit).min(info.message_count);
    let messages = state
        .blocking(move |store| {
            if from >= end {
                return Ok(Vec::new());
            }
            Ok(store.session_messages(session, from..end)?)
        })
        .await?;
    let page: Vec<Value> = messages
        .iter()
        .map(|m| {
            let text = search_text(&m.parts);
            let cut = text
                .char_indices()
                .nth(PREVIEW_CHARS)
                .map_or(text.len(), |(at, _)| at);
            let tools: Vec<&str> = m
                .parts
                .iter()
                .filter_map(|p| match p {
                    lcm_core::message::Part::ToolCall { name, .. } => Some(name.as_str()),
                    _ => None,
                })
                .collect();
            json!({
                "id": m.id,
                "seq": m.seq,
                "role": m.role,
                "created_at": m.created_at,
                "token_count": m.token_count,
                "text": &text[..cut],
                "truncated": cut < text.len(),
                "tool_calls": tools,
            })
        })
        .collect();
    Ok(Json(json!({
        "session": session,
        "from": from,
        "messages": page,
        "next": (end < info.message_count).then_some(end),
        "message_count": info.message_count,
    })))
}

/// `GET /v1/stats`: the store's totals and how far the index has caught up.
pub(crate) async fn stats(State(state): State<AppState>) -> ApiResult {
    let index = std::sync::Arc::clone(state.runtime().index());
    let (stats, next) = state
        .blocking(|store| Ok((store.stats()?, store.next_message_id()?)))
        .await?;
    Ok(Json(json!({
        "store": stats,
        "next_message": next,
        "index_documents": index.num_docs(),
        "index_watermark": index.watermark(),
    })))
}
