//! Errors as the API answers them: a status code and `{"error": kind, "message": text}`.
//!
//! Every failure a request can meet becomes an [`ApiError`]: the runtime's, the store's and the
//! tools' errors (each mapped to the status that says whose fault it is), and axum's own
//! rejections (a body over the limit, malformed JSON, a bad query string), whose default answers
//! are plain text.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use lcm_core::ids::IdError;
use lcm_engine::compaction::CompactionError;
use lcm_engine::runtime::RuntimeError;
use lcm_engine::tools::ToolError;
use lcm_store::StoreError;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::state::AppState;

/// A failed request: its status, a machine-readable kind and a message for a person.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A short snake_case name of what went wrong (`not_found`, `malformed_json`, ...).
    pub kind: &'static str,
    /// What was wrong and, where it helps, what to do instead.
    pub message: String,
    /// Seconds after which a retry may succeed (sent as `Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error with `status`, `kind` and `message`.
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400: the request itself is wrong.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// 404: what the request names does not exist (or is not the caller's to see).
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 403: the caller's token does not allow this.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// 503: the server cannot take this now.
    pub fn unavailable(kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, kind, message)
    }

    /// The JSON body of this error.
    pub fn body(&self) -> serde_json::Value {
        json!({ "error": self.kind, "message": self.message })
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"lcm\""),
            );
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> ApiError {
        let message = error.to_string();
        match error {
            StoreError::MessageNotFound(_)
            | StoreError::SummaryNotFound(_)
            | StoreError::SessionNotFound(_)
            | StoreError::SessionKeyNotFound(_)
            | StoreError::JobNotFound(_) => ApiError::not_found(message),
            StoreError::SessionExists(_) | StoreError::InvalidJob(_) | StoreError::Refused(_) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
            }
            StoreError::InvalidMessage(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_message", message)
            }
            StoreError::InvalidQuery(_) | StoreError::InvalidCursor(_) => {
                ApiError::bad_request(message)
            }
            // The disk is full: 507, and the same request may succeed once space is freed.
            ref e if e.is_disk_full() => ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "insufficient_storage",
                message,
            ),
            // The disk, the database or the index failed, not the request: 503, the same
            // request may succeed later.
            ref e if e.is_storage_failure() => ApiError::unavailable("storage_error", message),
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "storage_error", message),
        }
    }
}

impl From<RuntimeError> for ApiError {
    fn from(error: RuntimeError) -> ApiError {
        let message = error.to_string();
        match error {
            RuntimeError::Store(store) => store.into(),
            RuntimeError::Compaction(CompactionError::Store(store)) => store.into(),
            RuntimeError::Invalid(_) => ApiError::bad_request(message),
            // The same answer as the proxy's for a budget nothing fits in.
            RuntimeError::Budget(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "budget_too_small", message)
            }
            RuntimeError::SessionQuarantined { .. } => {
                ApiError::unavailable("session_quarantined", message)
            }
            RuntimeError::Unacknowledged { .. } => ApiError::unavailable("unacknowledged", message),
            RuntimeError::Unavailable { .. } => ApiError::unavailable("unavailable", message),
            RuntimeError::Restarting { retry_after, .. } => ApiError {
                retry_after: Some(retry_after.as_secs().max(1)),
                ..ApiError::unavailable("restarting", message)
            },
            RuntimeError::Timeout { .. } => ApiError::unavailable("timeout", message),
            RuntimeError::ShuttingDown => ApiError::unavailable("shutting_down", message),
            RuntimeError::Compaction(_) => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "compaction_failed",
                message,
            ),
            _ => ApiError::internal(message),
        }
    }
}

impl From<ToolError> for ApiError {
    fn from(error: ToolError) -> ApiError {
        let status = match &error {
            ToolError::UnknownTool { .. } | ToolError::NotFound { .. } => StatusCode::NOT_FOUND,
            ToolError::InvalidArguments { .. } | ToolError::InvalidRequest { .. } => {
                StatusCode::BAD_REQUEST
            }
            ToolError::NotPermitted { .. } => StatusCode::FORBIDDEN,
            ToolError::Unsupported { .. } => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, error.kind(), error.to_string())
    }
}

impl From<IdError> for ApiError {
    fn from(error: IdError) -> ApiError {
        ApiError::bad_request(error.to_string())
    }
}

/// A blocking task that did not finish (it panicked or was cancelled).
pub(crate) fn join_error(error: tokio::task::JoinError) -> ApiError {
    ApiError::internal(format!("a storage task failed: {error}"))
}

/// Parses a JSON request body into `T`, with errors that say where the JSON is wrong.
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            "the request body is empty: expected a JSON document",
        ));
    }
    serde_json::from_slice(body).map_err(json_error)
}

/// A serde_json error as a 400: `malformed_json` for syntax, `invalid_request` for shape.
pub(crate) fn json_error(error: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match error.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the request body is not valid JSON: {error}"),
        ),
        Category::Data => ApiError::bad_request(format!("invalid request body: {error}")),
    }
}

/// The request body as bytes, refused with 413 past `server.max_body_bytes`.
pub(crate) async fn body_bytes(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state)
        .await
        .map_err(|rejection| body_rejection(rejection, state.max_body_bytes()))
}

fn body_rejection(rejection: BytesRejection, limit: u64) -> ApiError {
    if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the request body is larger than {limit} bytes (server.max_body_bytes); send fewer messages per request"
            ),
        )
    } else {
        ApiError::new(
            rejection.status(),
            "invalid_body",
            format!("could not read the request body: {}", rejection.body_text()),
        )
    }
}

/// A JSON request body (any JSON content type, or none: `curl -d` works as is).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        let value = parse_json(&bytes)?;
        // serde would also read a struct from an array: only an object is a request here.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        Ok(JsonBody(value))
    }
}

/// The raw request body, size-checked (for bodies parsed with their exact bytes kept).
pub struct RawBody(pub Bytes);

impl FromRequest<AppState> for RawBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        body_bytes(req, state).await.map(RawBody)
    }
}

/// Query-string parameters, refused with a JSON 400 when they do not parse.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| QueryParams(q.0))
            .map_err(|rejection: QueryRejection| {
                ApiError::bad_request(format!("invalid query string: {}", rejection.body_text()))
            })
    }
}

/// Path parameters, refused with a JSON 400 when they do not decode.
pub struct PathParams<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| PathParams(p.0))
            .map_err(|rejection: PathRejection| {
                ApiError::bad_request(format!("invalid path: {}", rejection.body_text()))
            })
    }
}
