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
use lcm_core::ids::MessageId;
use lcm_core::message::Message;
use lcm_core::message::search_text;
use lcm_core::summary::{ContextMark, ContextState, MarkedNode, NodeRef, Summary};
use lcm_engine::assembly::{forgotten_message, forgotten_summary};
use lcm_engine::{ContextItem, pinned_block, shown_message};
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

/// What the layout route reads in one store snapshot.
struct LayoutRead {
    context: ContextState,
    summaries: Vec<Summary>,
    /// The session's summaries, in the context or not.
    all: u64,
    marks: Vec<MarkedNode>,
    /// The pinned messages, in the marks' order, with the tokens each shows in a context
    /// (large parts as their file references).
    pinned: Vec<(Message, u64)>,
    /// The pinned block's tokens and messages.
    block: Option<(u64, Vec<MessageId>)>,
    /// Tokens the raw tail's file references save (large parts shown as references).
    file_savings: u64,
    /// The tokens the forgotten raw messages would show unmarked, and their pointers'.
    forgotten_unmarked: u64,
    forgotten_shown: u64,
}

/// `GET /v1/sessions/{id}/layout`: what the session's context holds now, without compacting:
/// the top-level summaries with their sizes and coverage (a forgotten one with the pointer's
/// size), the pinned block, the raw tail's size, and the agent's marks (`lcm_pin`,
/// `lcm_forget`).
pub(crate) async fn layout(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> ApiResult {
    let info = state.visible_session(&principal, &id).await?;
    let session = info.id;
    let LayoutRead {
        context,
        summaries,
        all,
        marks,
        pinned,
        block,
        file_savings,
        forgotten_unmarked,
        forgotten_shown,
    } = state
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
            let marks = reader.marks(session)?;
            let large = store.file_rules().large_file_tokens;
            let file_savings =
                reader.file_reference_savings(session, context.raw_from..u64::MAX)?;
            let mut pinned = Vec::new();
            let mut pinned_shown = Vec::new();
            // A forgotten raw message shows its pointer (longer than a short message).
            let (mut forgotten_unmarked, mut forgotten_shown) = (0u64, 0u64);
            for m in &marks {
                match (m.mark, m.node) {
                    (ContextMark::Pinned, NodeRef::Message(id)) => {
                        pinned_shown.push(reader.shown_tokens(id)?);
                        pinned.push(reader.message(id)?);
                    }
                    (ContextMark::Forgotten, NodeRef::Message(id)) => {
                        let message = shown_message(&reader, reader.message(id)?, large)?;
                        forgotten_unmarked += u64::from(message.token_count);
                        let pointer = forgotten_message(message, store.counter());
                        forgotten_shown += u64::from(pointer.token_count);
                    }
                    _ => {}
                }
            }
            let block =
                match pinned_block(&reader, session, &context, &pinned, large, store.counter())? {
                    Some(ContextItem::Pinned {
                        tokens, messages, ..
                    }) => Some((tokens, messages)),
                    _ => None,
                };
            Ok(LayoutRead {
                context,
                summaries,
                all,
                marks,
                pinned: pinned.into_iter().zip(pinned_shown).collect(),
                block,
                file_savings,
                forgotten_unmarked,
                forgotten_shown,
            })
        })
        .await?;
    let forgotten = |node: NodeRef| {
        marks
            .iter()
            .any(|m| m.node == node && m.mark == ContextMark::Forgotten)
    };
    let counter = state.store().counter();
    let covered: u64 = summaries.iter().map(|s| s.descendant_tokens).sum();
    let top: Vec<Value> = summaries
        .iter()
        .map(|s| {
            let forgotten = forgotten(NodeRef::Summary(s.id));
            // What the context spends on it: the pointer when forgotten.
            let shown_tokens = if forgotten {
                let mut pointer = s.clone();
                forgotten_summary(&mut pointer, counter);
                pointer.token_count
            } else {
                s.token_count
            };
            json!({
                "id": s.id,
                "kind": s.kind.as_str(),
                "depth": s.depth,
                "token_count": s.token_count,
                "shown_tokens": shown_tokens,
                "forgotten": forgotten,
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
    let at = |node: NodeRef| marks.iter().find(|m| m.node == node).map(|m| m.at);
    let pinned: Vec<Value> = pinned
        .iter()
        .map(|(m, shown_tokens)| {
            json!({
                "id": m.id,
                "session": m.session,
                "seq": m.seq,
                "role": m.role,
                "token_count": m.token_count,
                "shown_tokens": shown_tokens,
                "at": at(NodeRef::Message(m.id)),
                // Shown where it is while raw; in the pinned block once summarised.
                "in_block": block.as_ref().is_some_and(|(_, ids)| ids.contains(&m.id)),
            })
        })
        .collect();
    let forgotten: Vec<Value> = marks
        .iter()
        .filter(|m| m.mark == ContextMark::Forgotten)
        .map(|m| json!({"id": m.node.to_string(), "at": m.at}))
        .collect();
    Ok(Json(json!({
        "session": info,
        "summaries": top,
        "summary_count": all,
        "pinned_block": block.map(|(tokens, ids)| json!({"tokens": tokens, "messages": ids.len()})),
        "raw_from": context.raw_from,
        "raw_messages": info.message_count.saturating_sub(context.raw_from),
        // As the context shows the tail: large parts as references, forgotten messages as
        // pointers.
        "raw_tokens": (info.token_total.saturating_sub(covered) + forgotten_shown)
            .saturating_sub(file_savings + forgotten_unmarked),
        "pinned": pinned,
        "forgotten": forgotten,
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
/// order, each with its role, time, tokens, the start of its text, the tools it calls and the
/// agent's mark on it in this session (`pinned`, `forgotten`, or null).
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
    let (messages, marks) = state
        .blocking(move |store| {
            if from >= end {
                return Ok((Vec::new(), Vec::new()));
            }
            let reader = store.reader()?;
            Ok((
                reader.session_messages(session, from..end)?,
                reader.marks(session)?,
            ))
        })
        .await?;
    let mark = |id: MessageId| {
        marks
            .iter()
            .find(|m| m.node == NodeRef::Message(id))
            .map(|m| m.mark.as_str())
    };
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
                "mark": mark(m.id),
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
