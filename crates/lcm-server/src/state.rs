//! What every handler shares: the runtime, the tokens, the counters, the limits.

use std::sync::Arc;
use std::time::Duration;

use lcm_core::config::{Config, ProviderKind};
use lcm_core::ids::{AnyId, SessionId};
use lcm_core::message::SessionInfo;
use lcm_engine::runtime::Runtime;
use lcm_engine::tools::{Caller, ToolContext, ToolRegistry};
use lcm_store::{Store, StoreError};
use tokio::sync::watch;

use crate::auth::{Auth, Principal};
use crate::error::{ApiError, join_error};
use crate::metrics::Metrics;

/// The server's shared state (cheap to clone).
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub runtime: Runtime,
    /// The built-in read-only tools, for the routes that search or describe without a session
    /// (`/v1/grep`, `/v1/describe`).
    pub tools: ToolRegistry,
    /// The configuration, shared with those tools.
    pub config: Arc<Config>,
    pub auth: Auth,
    pub metrics: Metrics,
    /// The proxy's upstream HTTP clients.
    pub upstream: crate::proxy::Upstream,
    /// The proxy's summaries with the client's model: spend guard and counters.
    pub client_summaries: crate::proxy::ClientSummaries,
    /// `true` once shutdown began: event streams end, readiness fails.
    pub shutdown: watch::Receiver<bool>,
}

impl AppState {
    pub(crate) fn new(runtime: Runtime, auth: Auth, shutdown: watch::Receiver<bool>) -> AppState {
        let config = Arc::new(runtime.config().clone());
        let metrics = Metrics::new(config.llm.provider != ProviderKind::Extractive);
        let client_summaries =
            crate::proxy::ClientSummaries::new(&config, metrics.client_summary_calls());
        AppState {
            inner: Arc::new(Inner {
                runtime,
                tools: ToolRegistry::with_builtins(),
                config,
                auth,
                metrics,
                upstream: crate::proxy::Upstream::new(),
                client_summaries,
                shutdown,
            }),
        }
    }

    pub(crate) fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    pub(crate) fn store(&self) -> Arc<Store> {
        Arc::clone(self.inner.runtime.store())
    }

    pub(crate) fn max_body_bytes(&self) -> u64 {
        self.inner.config.server.max_body_bytes
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.inner.config.server.request_timeout_s)
    }

    pub(crate) fn shutting_down(&self) -> bool {
        *self.inner.shutdown.borrow()
    }

    /// Runs a blocking store read on tokio's blocking pool.
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let store = self.store();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(join_error)?
    }

    /// The session `name` (`ses_N` or a session key) if it exists and `principal` may see it.
    pub(crate) async fn visible_session(
        &self,
        principal: &Principal,
        name: &str,
    ) -> Result<SessionInfo, ApiError> {
        let absent = || ApiError::not_found(format!("no session `{name}` in the store"));
        let lookup = name.to_owned();
        let info = self
            .blocking(move |store| {
                let id = match lookup.parse::<SessionId>() {
                    Ok(id) => Some(id),
                    Err(_) => store.session_id_for_key(&lookup)?,
                };
                match id.map(|id| store.session(id)) {
                    None | Some(Err(StoreError::SessionNotFound(_))) => Ok(None),
                    Some(Ok(info)) => Ok(Some(info)),
                    Some(Err(e)) => Err(e.into()),
                }
            })
            .await?
            .ok_or_else(absent)?;
        // Another tenant's session is reported exactly like a missing one.
        principal.check_session(&info).map_err(|_| absent())?;
        Ok(info)
    }

    /// Checks that the session an id belongs to is visible to `principal` (for tenants; the
    /// admin sees everything). Unknown ids pass: the tool reports them.
    pub(crate) async fn check_id_owner(
        &self,
        principal: &Principal,
        id: &str,
    ) -> Result<(), ApiError> {
        if !principal.is_tenant() {
            return Ok(());
        }
        let Ok(id) = id.trim().parse::<AnyId>() else {
            return Ok(());
        };
        let owner = self
            .blocking(move |store| {
                let session = match id {
                    AnyId::Session(s) => Some(s),
                    AnyId::Message(m) => store.message(m).ok().map(|m| m.session),
                    AnyId::Summary(s) => store.summary(s).ok().map(|s| s.session),
                    AnyId::File(_) | AnyId::Job(_) => None,
                };
                Ok(session.and_then(|s| store.session(s).ok()))
            })
            .await?;
        match (owner, id) {
            // Reported like a missing id (naming neither the owner nor its session).
            (Some(info), _) => principal
                .check_session(&info)
                .map_err(|_| ApiError::not_found(format!("no {id} in the store"))),
            (None, AnyId::Job(_)) => Err(ApiError::forbidden(
                "map jobs are server-wide: they need the admin token",
            )),
            (None, _) => Ok(()),
        }
    }

    /// A tool context with no session (the main agent of nothing: searches every session).
    pub(crate) fn sessionless_tool_context(&self) -> ToolContext {
        ToolContext::new(
            self.store(),
            Some(Arc::clone(self.inner.runtime.index())),
            Arc::clone(&self.inner.config),
            Caller::main_agent(None),
        )
    }
}
