//! `lcm serve`: the daemon. Opens the runtime on the data directory and serves the HTTP API
//! (`lcm_server`; routes and auth in docs/SERVER.md) until SIGTERM or SIGINT, then stops
//! gracefully: in-flight requests finish, running compactions get the grace period, the store
//! is closed cleanly. Meanwhile the CLI runs its commands on the same data directory through
//! it (`crate::control`).

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Args;
use lcm_engine::runtime::{Runtime, RuntimeOptions};
use lcm_server::{Server, ServerOptions, TokenSource, shutdown_signal};

use crate::App;
use crate::control::Holding;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, IP:PORT (default: server.bind, 127.0.0.1:7878). Anything but a
    /// loopback address requires a bearer token.
    #[arg(long)]
    pub bind: Option<SocketAddr>,
}

/// `lcm serve [--bind ADDR]`.
pub fn serve(app: &App, args: &ServeArgs) -> Result<()> {
    // A CLI that goes away mid-answer must not end the daemon.
    crate::ignore_sigpipe();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("lcm-serve")
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(run(app, args))
}

async fn run(app: &App, args: &ServeArgs) -> Result<()> {
    let runtime = Runtime::open(RuntimeOptions::dir(&app.data_dir, app.config.clone()))
        .await
        .with_context(|| format!("cannot open the data directory {}", app.data_dir.display()))?;
    let options = ServerOptions {
        bind: args.bind,
        ..ServerOptions::for_data_dir(&app.data_dir)
    };
    let server = match Server::bind(runtime.clone(), options).await {
        Ok(server) => server,
        Err(error) => {
            // Release the store cleanly before reporting.
            let _ = runtime.shutdown(std::time::Duration::from_secs(5)).await;
            return Err(error.into());
        }
    };
    // The CLI on this data directory runs its commands through this daemon from now on, and
    // the [watch] paths are followed.
    let holding = Holding::start(app, &runtime, "lcm serve")?;
    drop(runtime);
    // Before saying it listens: from then on SIGTERM / SIGINT stop it gracefully (and the CLI
    // commands it runs are interrupted first).
    let stop = holding.stop_on(shutdown_signal());
    let addr = server.local_addr();
    match (server.token_source(), server.token()) {
        (TokenSource::Generated(path), Some(token)) => {
            let kept = path.as_ref().map_or_else(
                || "not kept: set server.token or LCM_SERVER_TOKEN to keep one".to_owned(),
                |p| format!("kept in {} (mode 0600)", p.display()),
            );
            eprintln!("lcm serve: generated a bearer token ({kept}); it is shown only now:");
            eprintln!("  {token}");
        }
        (TokenSource::File(path), _) => {
            eprintln!(
                "lcm serve: bearer token required (the one in {})",
                path.display()
            );
        }
        (TokenSource::Configured, _) => eprintln!("lcm serve: bearer token required"),
        _ => {}
    }
    eprintln!(
        "lcm serve: listening on http://{addr} (data: {}); SIGTERM or Ctrl-C stops it",
        app.data_dir.display()
    );
    let served = server.run(stop).await;
    holding.stop();
    served?;
    eprintln!("lcm serve: stopped");
    Ok(())
}
