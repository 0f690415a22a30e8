//! `lcm mcp`: lcm's tools for an MCP client (Claude Desktop, Claude Code, ...), over stdio.
//! Opens the runtime on the data directory like `lcm serve` and serves the Model Context
//! Protocol (`lcm_mcp`; the tools and the client configuration are in docs/MCP.md) on stdin and
//! stdout until the client closes stdin (or SIGTERM / Ctrl-C), then shuts the runtime down
//! gracefully. stdout carries the protocol only: logs and notices go to stderr.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use lcm_engine::runtime::{Runtime, RuntimeOptions};
use lcm_mcp::{McpOptions, Stopped};
use lcm_server::shutdown_signal;

use crate::App;
use crate::control::Holding;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The key of a session to work in (created if absent): the tools run as its main agent,
    /// so lcm_grep searches it unless told `session: "all"`; lcm_append and lcm_context
    /// default to it. Without it, the tools run outside any session: lcm_grep searches every
    /// session, and lcm_append and lcm_context need their `session` argument.
    #[arg(long, value_name = "KEY")]
    pub session: Option<String>,
}

/// `lcm mcp [--session KEY]`.
pub fn mcp(app: &App, args: &McpArgs) -> Result<()> {
    crate::ignore_sigpipe();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lcm-mcp")
        .build()
        .context("cannot start the async runtime")?;
    let outcome = runtime.block_on(run(app, args));
    // A read of stdin in progress cannot be cancelled (it runs on a blocking thread): do not
    // wait for it once the runtime is shut down.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome
}

async fn run(app: &App, args: &McpArgs) -> Result<()> {
    let runtime = Runtime::open(RuntimeOptions::dir(&app.data_dir, app.config.clone()))
        .await
        .with_context(|| format!("cannot open the data directory {}", app.data_dir.display()))?;
    // The CLI on this data directory runs its commands through this process meanwhile, and
    // the [watch] paths are followed.
    let holding = Holding::start(app, &runtime, "lcm mcp")?;
    let options = McpOptions {
        session_key: args.session.clone(),
        shutdown_grace: Duration::from_secs(app.config.server.shutdown_grace_s),
    };
    let working = match &options.session_key {
        Some(key) => format!("session `{key}`"),
        None => "no working session".to_owned(),
    };
    // Before saying it serves: from then on SIGTERM / SIGINT stop it gracefully.
    let stop = holding.stop_on(shutdown_signal());
    eprintln!(
        "lcm mcp: serving MCP on stdin/stdout (data: {}, {working}); closing stdin stops it",
        app.data_dir.display(),
    );
    let stopped = lcm_mcp::serve_stdio(runtime, &options, stop).await;
    holding.stop();
    let stopped = stopped?;
    let why = match stopped {
        Stopped::Closed => "the client closed the connection",
        _ => "signal",
    };
    eprintln!("lcm mcp: stopped ({why})");
    Ok(())
}
