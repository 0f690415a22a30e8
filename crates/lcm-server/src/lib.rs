//! # lcm-server
//!
//! The lcm daemon: a multi-session HTTP API (JSON) over the actor runtime
//! ([`lcm_engine::runtime::Runtime`]), for agents that are not written in Rust. `lcm serve`
//! runs it; a Rust host can embed it too:
//!
//! ```no_run
//! use lcm_core::config::Config;
//! use lcm_engine::runtime::{Runtime, RuntimeOptions};
//! use lcm_server::{Server, ServerOptions, shutdown_signal};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let runtime = Runtime::open(RuntimeOptions::dir("./lcm-data", Config::default())).await?;
//! let server = Server::bind(runtime, ServerOptions::default()).await?;
//! println!("listening on http://{}", server.local_addr());
//! server.run(shutdown_signal()).await?; // until SIGTERM / SIGINT, then a graceful stop
//! # Ok(())
//! # }
//! ```
//!
//! - Routes: [`ROUTES`] (the one list; `docs/openapi.json` is checked against it) and
//!   `docs/SERVER.md`.
//! - Security: loopback by default; bound elsewhere, every route but `/healthz` needs
//!   `Authorization: Bearer <token>` (generated on first start when none is configured); tenant
//!   tokens reach only the sessions whose key starts with their prefix; bodies are limited
//!   (`server.max_body_bytes`); map paths stay inside `map.allowed_roots` (the runtime checks).
//! - Errors are JSON, `{"error": kind, "message": text}`, with a status saying whose fault it is.
//! - Proxy: `POST /v1/chat/completions` and `POST /v1/messages` speak the OpenAI and Anthropic
//!   APIs: each request's new messages are stored, the message list is replaced by lcm's context
//!   for `proxy.context_budget_tokens`, the lcm tools are offered and run, and the request goes
//!   on to the configured upstream with the client's own key (`docs/SERVER.md`, "Proxy").
//! - Shutdown: stop accepting, let in-flight requests finish (`server.shutdown_grace_s`), end
//!   event streams, then shut the runtime down.
//!
//! **Architecture invariant:** the server holds no state of its own beyond counters: every
//! request goes through the runtime (writes through session handles) or reads the store, so
//! the daemon keeps every guarantee the runtime gives.

mod auth;
mod error;
mod events;
mod explorer;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod handlers;
mod messages;
mod metrics;
mod proxy;
mod routes;
mod state;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use lcm_engine::runtime::{Runtime, RuntimeEvent};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

pub use auth::{Principal, TokenError, TokenSource, generate as new_token};
pub use error::ApiError;
pub use handlers::OPENAPI;
pub use proxy::{
    BUDGET_HEADER, CLIENT_LABEL_PREFIX, SESSION_HEADER, SUMMARIZER_HEADER, TOKEN_HEADER,
};
pub use routes::{Access, ROUTES, Route, find as find_route};

use auth::{Auth, resolve_admin_token};
use state::AppState;

/// The environment variable whose value overrides `server.token`.
pub const TOKEN_ENV: &str = "LCM_SERVER_TOKEN";

/// The token file's name inside the data directory.
pub const TOKEN_FILE: &str = "server-token";

/// How to start a server (everything else comes from the runtime's `[server]` configuration).
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Listen here instead of `server.bind`.
    pub bind: Option<SocketAddr>,
    /// Where a generated admin token is kept (`<data-dir>/server-token`); `None`: a generated
    /// token lives only as long as the process.
    pub token_file: Option<PathBuf>,
    /// A token that overrides `server.token` (the value of `LCM_SERVER_TOKEN`).
    pub env_token: Option<String>,
}

impl ServerOptions {
    /// Options for a daemon over the data directory `data_dir`: the token file inside it and
    /// the token from `LCM_SERVER_TOKEN`, if set.
    pub fn for_data_dir(data_dir: impl Into<PathBuf>) -> ServerOptions {
        ServerOptions {
            bind: None,
            token_file: Some(data_dir.into().join(TOKEN_FILE)),
            env_token: std::env::var(TOKEN_ENV).ok(),
        }
    }
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The `[server]` configuration is unusable.
    #[error(transparent)]
    Config(#[from] lcm_core::config::ConfigError),
    /// The admin token could not be settled.
    #[error(transparent)]
    Token(#[from] TokenError),
    /// Binding or serving failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the server failed: {0}")]
    Serve(std::io::Error),
    /// The runtime failed to shut down.
    #[error("runtime shutdown: {0}")]
    Runtime(#[from] lcm_engine::runtime::RuntimeError),
}

/// A bound server, not yet serving (its address and token are known).
pub struct Server {
    listener: TcpListener,
    state: AppState,
    runtime: Runtime,
    local_addr: SocketAddr,
    token: Option<String>,
    token_source: TokenSource,
    shutdown: watch::Sender<bool>,
    grace: Duration,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .field("token_source", &self.token_source)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Settles the token and binds the listener (port 0 picks a free port: see
    /// [`Server::local_addr`]).
    pub async fn bind(runtime: Runtime, options: ServerOptions) -> Result<Server, ServerError> {
        let config = runtime.config().server.clone();
        let addr = match options.bind {
            Some(addr) => addr,
            None => config.bind_addr()?,
        };
        let (token, token_source) = resolve_admin_token(
            &config,
            addr,
            options.env_token.as_deref(),
            options.token_file.as_deref(),
        )?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| ServerError::Bind { addr, source })?;
        let auth = Auth::new(token.clone(), &config);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let state = AppState::new(runtime.clone(), auth, shutdown_rx);
        Ok(Server {
            listener,
            state,
            runtime,
            local_addr,
            token,
            token_source,
            shutdown,
            grace: Duration::from_secs(config.shutdown_grace_s),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin token in force (`None`: the API is open, which only happens on loopback).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Where the admin token came from; [`TokenSource::Generated`] means it is new and should
    /// be shown to the operator once.
    pub fn token_source(&self) -> &TokenSource {
        &self.token_source
    }

    /// Serves until `signal` completes, then stops gracefully: no new connections, in-flight
    /// requests get `server.shutdown_grace_s` to finish (event streams end at once), then the
    /// runtime shuts down with the same grace for running compactions.
    pub async fn run(
        self,
        signal: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        let Server {
            listener,
            state,
            runtime,
            shutdown,
            grace,
            ..
        } = self;
        let events = tokio::spawn(count_events(state.clone(), runtime.subscribe()));
        let app = routes::router(state);
        let mut stopping = shutdown.subscribe();
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopping.wait_for(|closing| *closing).await;
        });
        let mut serving = tokio::spawn(async move { serve.await });
        let early = tokio::select! {
            () = signal => None,
            result = &mut serving => Some(result),
        };
        tracing::info!("lcm-server: shutting down");
        let _ = shutdown.send(true);
        let result = match early {
            Some(result) => result,
            None => match tokio::time::timeout(grace, &mut serving).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!(
                        grace_s = grace.as_secs(),
                        "in-flight requests did not finish within the grace period; abandoning them"
                    );
                    serving.abort();
                    Ok(Ok(()))
                }
            },
        };
        events.abort();
        let shutdown_result = runtime.shutdown(grace).await;
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ServerError::Serve(e)),
            Err(e) => {
                return Err(ServerError::Serve(std::io::Error::other(e.to_string())));
            }
        }
        shutdown_result?;
        tracing::info!("lcm-server: stopped");
        Ok(())
    }
}

/// Counts the runtime's events for `/metrics`.
async fn count_events(state: AppState, mut events: broadcast::Receiver<RuntimeEvent>) {
    loop {
        match events.recv().await {
            Ok(event) => state.inner.metrics.record_event(&event),
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                state.inner.metrics.record_missed(missed)
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// A future that completes on SIGTERM or SIGINT (Ctrl-C); on other platforms, on Ctrl-C. On
/// Unix the handlers are installed when this is called (inside a tokio runtime), so call it
/// before announcing that the server listens.
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // Registered now, not when the future is first polled: a signal arriving right after
        // the caller announced it is listening must stop it gracefully, not kill it.
        let term = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = interrupt.recv() => {}
                    }
                }
                (Ok(mut only), Err(_)) | (Err(_), Ok(mut only)) => {
                    only.recv().await;
                }
                // No signal handling: never complete from here.
                (Err(_), Err(_)) => std::future::pending::<()>().await,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
