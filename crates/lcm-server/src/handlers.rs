//! The route handlers. Each one checks what the caller may touch, calls the runtime (or reads
//! the store on the blocking pool) and answers JSON; every failure is an [`ApiError`].

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use lcm_core::ids::JobId;
use lcm_core::message::SessionInfo;
use lcm_engine::operators::MapRequest;
use lcm_engine::tools::ToolFormat;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Principal;
use crate::error::{ApiError, JsonBody, PathParams, QueryParams, RawBody, parse_json};
use crate::messages::parse_messages;
use crate::metrics::Snapshot;
use crate::state::AppState;

/// The OpenAPI document, kept in `docs/openapi.json`.
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// How long `/metrics` and `/readyz` wait for an actor before leaving its part out.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

type ApiResult<T = Json<Value>> = Result<T, ApiError>;

pub(crate) async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub(crate) async fn readyz(State(state): State<AppState>) -> ApiResult {
    if state.shutting_down() {
        return Err(ApiError::unavailable(
            "shutting_down",
            "the server is shutting down",
        ));
    }
    let stats = tokio::time::timeout(PROBE_TIMEOUT, state.runtime().supervisor_stats())
        .await
        .map_err(|_| {
            ApiError::unavailable("unavailable", "the runtime did not answer in time")
        })??;
    Ok(Json(json!({
        "status": "ready",
        "live_sessions": stats.live_sessions,
        "quarantined_sessions": stats.quarantined_sessions,
    })))
}

pub(crate) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

pub(crate) async fn metrics(State(state): State<AppState>) -> ApiResult<Response> {
    let runtime = state.runtime();
    let (store, jobs) = state
        .blocking(|store| Ok((store.stats().ok(), store.jobs().ok())))
        .await?;
    let supervisor = tokio::time::timeout(PROBE_TIMEOUT, runtime.supervisor_stats())
        .await
        .ok()
        .and_then(Result::ok);
    let compactor = tokio::time::timeout(PROBE_TIMEOUT, runtime.compactor_stats())
        .await
        .ok()
        .and_then(Result::ok);
    let text = state.inner.metrics.render(&Snapshot {
        store,
        supervisor,
        compactor,
        jobs,
    });
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

// ---------------------------------------------------------------------------------------------
// Sessions and messages

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSession {
    key: String,
}

/// Longest session key the API accepts.
const MAX_KEY_BYTES: usize = 1024;

pub(crate) async fn create_session(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(body): JsonBody<CreateSession>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let key = body.key;
    if key.trim().is_empty() {
        return Err(ApiError::bad_request("`key` must not be empty"));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::bad_request(format!(
            "`key` is {} bytes; at most {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    principal.check_new_key(&key)?;
    let probe = key.clone();
    let existed = state
        .blocking(move |store| Ok(store.session_id_for_key(&probe)?.is_some()))
        .await?;
    let handle = state.runtime().session(&key).await?;
    let id = handle.id();
    let info = state.blocking(move |store| Ok(store.session(id)?)).await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(session_json(&info, !existed))))
}

fn session_json(info: &SessionInfo, created: bool) -> Value {
    let mut value = json!(info);
    value["created"] = json!(created);
    value
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListSessions {
    /// Only the sessions whose key starts with this.
    #[serde(default)]
    prefix: Option<String>,
    /// Also each session's context: how many summaries stand in it and where its raw tail
    /// starts (what the explorer's list shows).
    #[serde(default)]
    context: bool,
}

pub(crate) async fn list_sessions(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    QueryParams(query): QueryParams<ListSessions>,
) -> ApiResult {
    let with_context = query.context;
    let sessions = state
        .blocking(move |store| {
            let sessions = store.sessions()?;
            let contexts = if with_context {
                let reader = store.reader()?;
                sessions
                    .iter()
                    .map(|s| reader.context(s.id).map(Some))
                    .collect::<Result<Vec<_>, _>>()?
            } else {
                vec![None; sessions.len()]
            };
            Ok(sessions.into_iter().zip(contexts).collect::<Vec<_>>())
        })
        .await?;
    let sessions: Vec<Value> = sessions
        .iter()
        .filter(|(s, _)| principal.may_see(&s.key))
        .filter(|(s, _)| query.prefix.as_deref().is_none_or(|p| s.key.starts_with(p)))
        .map(|(s, context)| {
            let mut value = json!(s);
            if let Some(c) = context {
                value["context"] = json!({
                    "summaries": c.summaries.len(),
                    "raw_from": c.raw_from,
                });
            }
            value
        })
        .collect();
    Ok(Json(json!({ "sessions": sessions })))
}

pub(crate) async fn get_session(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
) -> ApiResult {
    let info = state.visible_session(&principal, &id).await?;
    Ok(Json(json!(info)))
}

pub(crate) async fn append_messages(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
    RawBody(body): RawBody,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let info = state.visible_session(&principal, &id).await?;
    let messages = parse_messages(&body, &info)?;
    let handle = state.runtime().session_by_id(info.id).await?;
    let appended = handle.append_batch(messages).await?;
    let inserted = appended.iter().filter(|a| a.inserted).count();
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "session": info.id,
            "appended": appended,
            "inserted": inserted,
        })),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ContextQuery {
    /// The model's window, in tokens.
    budget: u64,
    /// `openai` (default) or `anthropic`.
    #[serde(default)]
    format: Option<String>,
    /// A system prompt to put first.
    #[serde(default)]
    system: Option<String>,
}

fn tool_format(format: Option<&str>) -> Result<ToolFormat, ApiError> {
    match format {
        None => Ok(ToolFormat::OpenAi),
        Some(text) => ToolFormat::from_str(text).map_err(|_| {
            ApiError::bad_request(format!(
                "format must be `openai` or `anthropic`, got `{text}`"
            ))
        }),
    }
}

pub(crate) async fn get_context(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
    QueryParams(query): QueryParams<ContextQuery>,
) -> ApiResult {
    let format = tool_format(query.format.as_deref())?;
    if query.budget == 0 {
        return Err(ApiError::bad_request("budget must be at least 1 token"));
    }
    let info = state.visible_session(&principal, &id).await?;
    let handle = state.runtime().session_by_id(info.id).await?;
    let context = handle.context(query.budget).await?;
    let system = query.system.as_deref();
    let context =
        lcm_engine::runtime::fit_with_system(state.runtime(), context, query.budget, system)?;
    let counter = state.runtime().store().counter();
    let out = context.to_response(query.budget, format, system, counter);
    Ok(Json(out))
}

// ---------------------------------------------------------------------------------------------
// Tools, grep, describe

/// Tools a tenant token may call: their reach can be checked against the tenant's sessions.
const TENANT_TOOLS: [&str; 2] = ["lcm_grep", "lcm_describe"];

pub(crate) async fn call_tool(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams((id, name)): PathParams<(String, String)>,
    RawBody(body): RawBody,
) -> ApiResult {
    let info = state.visible_session(&principal, &id).await?;
    let args: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        parse_json(&body)?
    };
    if principal.is_tenant() {
        if !TENANT_TOOLS.contains(&name.as_str()) {
            return Err(ApiError::forbidden(format!(
                "a tenant token may call {} only; `{name}` needs the admin token",
                TENANT_TOOLS.join(" and ")
            )));
        }
        check_tenant_reach(&state, &principal, &args, Some(&info)).await?;
    }
    let handle = state.runtime().session_by_id(info.id).await?;
    Ok(Json(handle.call_tool(&name, args).await?))
}

/// For a tenant: refuses tool arguments that reach beyond its sessions (`session`,
/// `summary_id` and `id` arguments).
async fn check_tenant_reach(
    state: &AppState,
    principal: &Principal,
    args: &Value,
    current: Option<&SessionInfo>,
) -> Result<(), ApiError> {
    if !principal.is_tenant() {
        return Ok(());
    }
    match args.get("session").and_then(Value::as_str) {
        None | Some("current") if current.is_some() => {}
        None | Some("current") => {
            return Err(ApiError::bad_request(
                "with a tenant token, `session` must name one of your sessions (ses_N or its key)",
            ));
        }
        Some("all") => {
            return Err(ApiError::forbidden(
                "`session: all` searches every tenant's sessions; a tenant token must name one of its own",
            ));
        }
        Some(name) => {
            state.visible_session(principal, name).await?;
        }
    }
    for field in ["summary_id", "id"] {
        if let Some(id) = args.get(field).and_then(Value::as_str) {
            state.check_id_owner(principal, id).await?;
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsQuery {
    #[serde(default)]
    format: Option<String>,
}

pub(crate) async fn list_tools(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<ToolsQuery>,
) -> ApiResult {
    let format = tool_format(query.format.as_deref())?;
    Ok(Json(state.runtime().tool_definitions(format)))
}

pub(crate) async fn grep(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    JsonBody(args): JsonBody<Value>,
) -> ApiResult {
    check_tenant_reach(&state, &principal, &args, None).await?;
    let ctx = state.sessionless_tool_context();
    Ok(Json(state.inner.tools.call(&ctx, "lcm_grep", args).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DescribeQuery {
    #[serde(default)]
    manifest_limit: Option<u64>,
    #[serde(default)]
    max_tokens: Option<u64>,
}

pub(crate) async fn describe(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    PathParams(id): PathParams<String>,
    QueryParams(query): QueryParams<DescribeQuery>,
) -> ApiResult {
    state.check_id_owner(&principal, &id).await?;
    let mut args = json!({ "id": id });
    if let Some(n) = query.manifest_limit {
        args["manifest_limit"] = json!(n);
    }
    if let Some(n) = query.max_tokens {
        args["max_tokens"] = json!(n);
    }
    let ctx = state.sessionless_tool_context();
    Ok(Json(
        state.inner.tools.call(&ctx, "lcm_describe", args).await?,
    ))
}

// ---------------------------------------------------------------------------------------------
// Map jobs

/// `POST /v1/maps`: the `llm_map` tool's arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartMap {
    input_path: PathBuf,
    prompt: String,
    output_schema: Value,
    #[serde(default)]
    output_path: Option<PathBuf>,
    #[serde(default)]
    concurrency: Option<u32>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    timeout_s: Option<u64>,
    #[serde(default)]
    model: Option<String>,
}

fn in_range(name: &str, value: Option<u64>, range: std::ops::RangeInclusive<u64>) -> ApiResult<()> {
    match value {
        Some(v) if !range.contains(&v) => Err(ApiError::bad_request(format!(
            "`{name}` must be between {} and {}, got {v}",
            range.start(),
            range.end()
        ))),
        _ => Ok(()),
    }
}

pub(crate) async fn start_map(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<StartMap>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    in_range("concurrency", body.concurrency.map(u64::from), 1..=256)?;
    in_range("max_attempts", body.max_attempts.map(u64::from), 1..=10)?;
    in_range("timeout_s", body.timeout_s, 1..=86_400)?;
    let mut request = MapRequest::llm(body.input_path, body.prompt, body.output_schema);
    request.output_path = body.output_path;
    request.concurrency = body.concurrency;
    request.max_attempts = body.max_attempts;
    request.timeout = body.timeout_s.map(Duration::from_secs);
    request.model = body.model;
    // The runtime checks the schema, then that both paths resolve (`..` and symlinks
    // followed) inside `map.allowed_roots`, before anything is written.
    let job = state.runtime().llm_map(request).await?;
    Ok((StatusCode::CREATED, Json(json!(job))))
}

pub(crate) async fn list_maps(State(state): State<AppState>) -> ApiResult {
    let jobs = state.blocking(|store| Ok(store.jobs()?)).await?;
    Ok(Json(json!({ "jobs": jobs })))
}

pub(crate) fn parse_job(text: &str) -> Result<JobId, ApiError> {
    Ok(text.parse::<JobId>()?)
}

pub(crate) async fn get_map(
    State(state): State<AppState>,
    PathParams(job): PathParams<String>,
) -> ApiResult {
    let job = parse_job(&job)?;
    let record = state.blocking(move |store| Ok(store.job(job)?)).await?;
    Ok(Json(json!(record)))
}

pub(crate) use crate::events::map_events;

pub(crate) async fn cancel_map(
    State(state): State<AppState>,
    PathParams(job): PathParams<String>,
) -> ApiResult {
    let job = parse_job(&job)?;
    // 404 for an unknown job before asking the pool.
    state.blocking(move |store| Ok(store.job(job)?)).await?;
    state.runtime().map_cancel(job).await?;
    let record = state.blocking(move |store| Ok(store.job(job)?)).await?;
    Ok(Json(json!(record)))
}

// ---------------------------------------------------------------------------------------------
// Integrity

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IntegrityQuery {
    #[serde(default)]
    repair: bool,
}

pub(crate) async fn integrity(
    State(state): State<AppState>,
    QueryParams(query): QueryParams<IntegrityQuery>,
) -> ApiResult {
    let outcome = state.runtime().check_integrity(query.repair).await?;
    let clean = outcome
        .after
        .as_ref()
        .map_or(outcome.report.is_clean(), |after| after.is_clean());
    let mut value = json!(outcome);
    value["clean"] = json!(clean);
    Ok(Json(value))
}
