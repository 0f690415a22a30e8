//! # lcm-mcp
//!
//! lcm's MCP server: the runtime's tools over the Model Context Protocol, on the official Rust
//! SDK (`rmcp`), for MCP clients (Claude Desktop, Claude Code, IDE agents) that launch
//! `lcm mcp` as a child process and talk JSON-RPC over its stdin and stdout.
//!
//! - The tools listed are the runtime's tools for a main agent
//!   ([`Runtime::tool_definitions`]: `lcm_grep`, `lcm_describe`, `lcm_expand_query`, `Task`,
//!   `Tasks`, `llm_map`, `agentic_map`, the file tools, `lcm_pin`, `lcm_forget` and the host's
//!   own), with their names,
//!   descriptions and JSON Schemas unchanged, followed by three MCP-only session tools
//!   ([`session_tools`]: `lcm_sessions`, `lcm_append`, `lcm_context`).
//! - By default the server works in no session: a runtime tool runs as a main agent outside
//!   any session through [`Runtime::call_tool`], so `lcm_grep` searches every session unless
//!   given one, sub-agents and map jobs are children of no session, and `lcm_append` /
//!   `lcm_context` require their `session` argument (in their schemas).
//! - Given a session ([`McpOptions::session_key`]; created at start if absent), the server
//!   works in it: a runtime tool runs as that session's main agent through
//!   [`SessionHandle::call_tool`], exactly like the HTTP API's tool route, so `lcm_grep`
//!   searches that session unless told `session: "all"` or another one, and `lcm_append` /
//!   `lcm_context` default to it.
//! - Every call's arguments are validated against the tool's schema before it runs. A failing
//!   call (bad arguments, an unknown id, no model configured) is an MCP tool result with
//!   `isError: true` whose text is the error written for the model; only a call to a tool that
//!   is not listed is a protocol error (`-32602`, invalid params).
//! - [`serve`] runs until the client closes the stream (or a stop signal) and then shuts the
//!   runtime down gracefully. Nothing but the protocol is written to stdout: logs go to stderr.
//!
//! Architecture invariant: this crate is an interface over `lcm-engine`'s runtime, like
//! `lcm-server`; it holds no state of its own and reaches the store only through the runtime.

mod session_tools;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm_core::ids::SessionId;
use lcm_engine::runtime::{Runtime, RuntimeError, SessionHandle};
use lcm_engine::tools::{Caller, ToolContext, ToolError, ToolFormat, ToolRegistry};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{QuitReason, RequestContext, RoleServer, ServerInitializeError, ServiceExt};
use rmcp::transport::IntoTransport;
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};

pub use session_tools::{
    DEFAULT_SESSIONS_LIMIT, LcmAppend, LcmContext, LcmSessions, MAX_APPEND_BATCH,
    MAX_SESSIONS_LIMIT, session_tools,
};

/// How to run the server.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// The key of the session the server works in, if any: runtime tools run as its main
    /// agent, and `lcm_append` / `lcm_context` default to it; created at start if absent.
    /// `None` (the default): runtime tools run as a main agent outside any session
    /// (`lcm_grep` searches every session) and `lcm_append` / `lcm_context` require `session`.
    pub session_key: Option<String>,
    /// Grace period of the runtime's shutdown when the client goes away (running compactions
    /// get this long to finish).
    pub shutdown_grace: Duration,
}

impl Default for McpOptions {
    fn default() -> Self {
        McpOptions {
            session_key: None,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Why the server could not start or stopped with a failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The runtime refused (opening the session, shutting down).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A tool definition cannot be offered over MCP (a clash of names, a schema that is not an
    /// object).
    #[error("cannot offer the tools over MCP: {0}")]
    Tools(String),
    /// The MCP connection failed (initialisation, the transport, the service task).
    #[error("MCP connection: {0}")]
    Connection(String),
}

/// How a [`serve`] ended (each is a clean stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopped {
    /// The client closed the connection (stdin reached its end).
    Closed,
    /// The stop future completed (SIGTERM, Ctrl-C).
    Stopped,
}

/// The MCP server: an [`rmcp::ServerHandler`] over a [`Runtime`]. Cheap to clone.
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

struct Inner {
    /// The runtime (runtime tools run through it when there is no `agent`).
    runtime: Runtime,
    /// The session the server works in, if any.
    agent: Option<SessionHandle>,
    /// The names of the runtime's tools listed (calls go to `agent`, else to `runtime`).
    runtime_tools: HashSet<String>,
    /// The MCP-only session tools.
    session_tools: ToolRegistry,
    /// The context the session tools run in: the main agent of `agent` (of no session without
    /// one).
    ctx: ToolContext,
    /// Everything listed, in order: the runtime's tools, then the session tools.
    tools: Vec<Tool>,
    instructions: String,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("session", &self.session())
            .field("tools", &self.tool_names())
            .finish()
    }
}

impl McpServer {
    /// A server over `runtime` working in session `session_key` (created if absent), or in no
    /// session when it is `None`.
    pub async fn open(runtime: &Runtime, session_key: Option<&str>) -> Result<McpServer, McpError> {
        let agent = match session_key {
            Some(key) => Some(runtime.session(key).await?),
            None => None,
        };
        let session_tools = session_tools::registry(runtime, agent.is_some())
            .map_err(|e| McpError::Tools(e.to_string()))?;
        let listed = runtime.tool_definitions(ToolFormat::Anthropic);
        let mut tools = Vec::new();
        let mut runtime_tools = HashSet::new();
        for definition in listed.as_array().into_iter().flatten() {
            let tool = mcp_tool(definition)?;
            runtime_tools.insert(tool.name.to_string());
            tools.push(tool);
        }
        for definition in session_tools.definitions() {
            if runtime_tools.contains(&definition.name) {
                return Err(McpError::Tools(format!(
                    "the runtime has a tool named `{}`, which is also an MCP session tool",
                    definition.name
                )));
            }
            tools.push(mcp_tool(&definition.to_anthropic())?);
        }
        let ctx = ToolContext::new(
            Arc::clone(runtime.store()),
            Some(Arc::clone(runtime.index())),
            Arc::new(runtime.config().clone()),
            Caller::main_agent(agent.as_ref().map(SessionHandle::id)),
        );
        let working = match (session_key, &agent) {
            (Some(key), Some(agent)) => format!(
                "This server works in session `{key}` ({}): lcm_grep searches it unless given \
                 `session: \"all\"` or another session; lcm_append and lcm_context default to it.",
                agent.id()
            ),
            _ => "This server works in no particular session: lcm_grep searches every session \
                  unless given `session` (a session id ses_N or key); lcm_append and \
                  lcm_context need `session` (a key, or an id from lcm_sessions)."
                .to_owned(),
        };
        let instructions = format!(
            "lcm keeps every message of its sessions verbatim and gives a model a bounded \
             context (summaries of older messages, then the recent ones). {working} \
             lcm_sessions lists the sessions; lcm_grep, lcm_describe and lcm_expand_query \
             recall details from the whole history; lcm_pin keeps a message in a context past \
             compaction and lcm_forget sets an item of it aside as a pointer until restored."
        );
        Ok(McpServer {
            inner: Arc::new(Inner {
                runtime: runtime.clone(),
                agent,
                runtime_tools,
                session_tools,
                ctx,
                tools,
                instructions,
            }),
        })
    }

    /// The id of the session the server works in, if any.
    pub fn session(&self) -> Option<SessionId> {
        self.inner.agent.as_ref().map(SessionHandle::id)
    }

    /// The tools listed to clients, in order.
    pub fn tools(&self) -> &[Tool] {
        &self.inner.tools
    }

    /// The listed tools' names, in order.
    pub fn tool_names(&self) -> Vec<&str> {
        self.inner.tools.iter().map(|t| t.name.as_ref()).collect()
    }

    /// Calls the listed tool `name` (arguments validated against its schema first); `None` if
    /// no tool of that name is listed.
    pub async fn call(&self, name: &str, args: Value) -> Option<Result<Value, ToolError>> {
        let inner = &self.inner;
        if inner.session_tools.get(name).is_some() {
            Some(inner.session_tools.call(&inner.ctx, name, args).await)
        } else if inner.runtime_tools.contains(name) {
            Some(match &inner.agent {
                Some(agent) => agent.call_tool(name, args).await,
                None => inner.runtime.call_tool(name, args).await,
            })
        } else {
            None
        }
    }
}

/// A tool definition in the Anthropic shape (`{name, description, input_schema}`) as an MCP
/// tool.
fn mcp_tool(definition: &Value) -> Result<Tool, McpError> {
    let name = definition
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| McpError::Tools(format!("a tool definition has no name: {definition}")))?;
    let description = definition
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let schema = definition
        .get("input_schema")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            McpError::Tools(format!("the input schema of `{name}` is not a JSON object"))
        })?;
    Ok(Tool::new(
        name.to_owned(),
        description.to_owned(),
        Arc::new(schema.clone()),
    ))
}

/// A tool's answer as an MCP result: the JSON as text, and as structured content when it is an
/// object.
fn success(value: Value) -> CallToolResult {
    if value.is_object() {
        CallToolResult::structured(value)
    } else {
        CallToolResult::success(vec![ContentBlock::text(value.to_string())])
    }
}

/// A tool's error as an MCP result with `isError`: the message written for the model as text,
/// `{"error": kind, "message": ...}` as structured content.
fn failure(error: &ToolError) -> CallToolResult {
    let mut result = CallToolResult::error(vec![ContentBlock::text(error.to_string())]);
    result.structured_content = Some(error.to_json());
    result
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("lcm", env!("CARGO_PKG_VERSION")))
            .with_instructions(self.inner.instructions.clone())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.inner.tools.clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.as_ref();
        let args = request.arguments.map_or(Value::Null, Value::Object);
        let started = Instant::now();
        let Some(outcome) = self.call(name, args).await else {
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no tool named `{name}`; the tools are: {}",
                    self.tool_names().join(", ")
                ),
                Some(json!({ "tool": name })),
            ));
        };
        let elapsed_ms = started.elapsed().as_millis();
        Ok(match outcome {
            Ok(value) => {
                tracing::debug!(tool = name, elapsed_ms, "tool call answered");
                success(value)
            }
            Err(error) => {
                tracing::debug!(
                    tool = name,
                    elapsed_ms,
                    error = error.kind(),
                    "tool call failed"
                );
                failure(&error)
            }
        }
        .into())
    }
}

/// Serves MCP on `transport` until the client closes it or `stop` completes, then shuts the
/// runtime down (running compactions get `options.shutdown_grace`). The runtime is shut down
/// whatever happened, also when the server could not start.
pub async fn serve<T, E, A>(
    runtime: Runtime,
    options: &McpOptions,
    transport: T,
    stop: impl Future<Output = ()>,
) -> Result<Stopped, McpError>
where
    T: IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let served = serve_until(&runtime, options, transport, stop).await;
    let shutdown = runtime.shutdown(options.shutdown_grace).await;
    let stopped = served?;
    shutdown?;
    Ok(stopped)
}

/// [`serve`] on the process's stdin and stdout.
pub async fn serve_stdio(
    runtime: Runtime,
    options: &McpOptions,
    stop: impl Future<Output = ()>,
) -> Result<Stopped, McpError> {
    serve(runtime, options, rmcp::transport::stdio(), stop).await
}

async fn serve_until<T, E, A>(
    runtime: &Runtime,
    options: &McpOptions,
    transport: T,
    stop: impl Future<Output = ()>,
) -> Result<Stopped, McpError>
where
    T: IntoTransport<RoleServer, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let server = McpServer::open(runtime, options.session_key.as_deref()).await?;
    tracing::info!(
        session = %server.session().map_or_else(|| "none".to_owned(), |s| s.to_string()),
        tools = server.inner.tools.len(),
        "MCP server ready"
    );
    let mut stop = std::pin::pin!(stop);
    let service = tokio::select! {
        started = server.serve(transport) => match started {
            Ok(service) => service,
            // The client went away before initialising: a clean end all the same.
            Err(ServerInitializeError::ConnectionClosed(_)) => return Ok(Stopped::Closed),
            Err(e) => return Err(McpError::Connection(e.to_string())),
        },
        () = &mut stop => return Ok(Stopped::Stopped),
    };
    let cancel = service.cancellation_token();
    let waiting = service.waiting();
    let mut waiting = std::pin::pin!(waiting);
    let (quit, stopped) = tokio::select! {
        quit = &mut waiting => (quit, Stopped::Closed),
        () = &mut stop => {
            cancel.cancel();
            (waiting.await, Stopped::Stopped)
        }
    };
    match quit {
        Ok(QuitReason::JoinError(e)) | Err(e) => Err(McpError::Connection(format!(
            "the MCP service task failed: {e}"
        ))),
        Ok(_) => Ok(stopped),
    }
}
