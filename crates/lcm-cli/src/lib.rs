//! # lcm-cli
//!
//! The `lcm` command line. Every command opens a data directory (the store and its index),
//! does one thing, and prints either a human-readable report or, with `--json`, one JSON value
//! for scripts. Errors go to stderr with a non-zero exit code.

mod commands;
mod control;
mod dag_commands;
mod demo;
mod doctor;
mod eval_commands;
mod follow;
mod import_commands;
mod interrupt;
mod map_commands;
mod mcp;
mod output;
mod serve;
mod tool_commands;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use lcm_core::config::Config;

/// Lossless Context Management: unbounded, lossless memory for LLM agents.
#[derive(Debug, Parser)]
#[command(name = "lcm", version, about, long_about = LONG_ABOUT)]
pub struct Cli {
    /// Data directory (store and index). Default: the platform data directory + `lcm`.
    #[arg(long, global = true, env = "LCM_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Configuration file (TOML; see config/default.toml). Default: config.toml in the data
    /// directory if it exists, else built-in defaults.
    #[arg(long, global = true, env = "LCM_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print one JSON value instead of a human-readable report.
    #[arg(long, global = true)]
    pub json: bool,
    /// No progress bars.
    #[arg(long, short, global = true)]
    pub quiet: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// What `lcm --help` says before the commands.
const LONG_ABOUT: &str = "\
Lossless Context Management: unbounded, lossless memory for LLM agents.

lcm keeps every message of an agent's conversations in one data directory (a redb store and a \
search index beside it) and gives the agent a bounded context that never loses anything: \
older turns are compacted into a DAG of summaries that the agent can search and expand back \
to the verbatim messages.

History in:   import (transcript files), serve (the HTTP API and the OpenAI / Anthropic proxy), \
mcp (tools for an MCP client)
Find:         grep (regex, full text, semantic, hybrid), show, sessions, describe, dag, tool
Context:      context, compact
Care:         stats, doctor, reindex, vacuum
Batch:        map (llm_map jobs), eval
Shell:        completions (bash, zsh, fish), demo (a first look on an example transcript)";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Import transcripts (Claude Code JSONL, OpenAI messages JSON/JSONL, lcm JSONL).
    Import(import_commands::ImportArgs),
    /// Search every stored message: regex (exact, complete), full text (ranked), or by
    /// meaning (semantic, hybrid; with an embedding model).
    Grep(commands::GrepArgs),
    /// Show a message (`msg_N`) or a session (`ses_N`).
    Show(commands::ShowArgs),
    /// List sessions with message counts and token totals.
    Sessions,
    /// Totals over the store and the index.
    Stats,
    /// Rebuild the search index from the store.
    Reindex,
    /// Rewrite the store file without its free pages (like SQLite's VACUUM); nothing stored
    /// changes.
    Vacuum,
    /// Run the compaction control loop on a session now.
    Compact(dag_commands::CompactArgs),
    /// Print a session's assembled context (compacting first if it is over the soft threshold).
    Context(dag_commands::ContextArgs),
    /// Print a session's summary DAG as a tree.
    Dag(dag_commands::SessionArg),
    /// Describe a summary or a message: metadata, lineage, content.
    Describe(dag_commands::DescribeArgs),
    /// Import the example transcript shipped with lcm into a fresh data directory and grep it.
    Demo(demo::DemoArgs),
    /// Check the store's integrity (and the index's); with --repair, apply the safe repairs.
    Doctor(doctor::DoctorArgs),
    /// Call one of the model's tools (lcm_grep, lcm_describe, lcm_pin, ...: `lcm tools` lists
    /// them) with JSON arguments.
    Tool(tool_commands::ToolArgs),
    /// Print the tools' definitions (JSON Schemas) in the OpenAI or Anthropic shape.
    Tools(tool_commands::ToolsArgs),
    /// Run the daemon: the HTTP API over the runtime (see docs/SERVER.md) until SIGTERM / Ctrl-C.
    Serve(serve::ServeArgs),
    /// Map jobs (llm_map): run one prompt over every item of a JSONL file; status, cancel, resume.
    Map(map_commands::MapArgs),
    /// Serve the tools to an MCP client over stdin/stdout (see docs/MCP.md) until stdin closes.
    Mcp(mcp::McpArgs),
    /// Evaluations: `lcm eval recall FILE` measures how often search finds the turns that
    /// answer a LoCoMo question.
    Eval(eval_commands::EvalArgs),
    /// Print a shell completion script: `lcm completions bash > ~/.local/share/bash-completion/completions/lcm`.
    Completions(CompletionsArgs),
}

/// Arguments of `lcm completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

/// Output format of `--format`-style choices shared by commands.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    Regex,
    FullText,
    Semantic,
    Hybrid,
}

impl Mode {
    /// The search mode it names.
    pub fn grep_mode(self) -> lcm_search::GrepMode {
        match self {
            Mode::Regex => lcm_search::GrepMode::Regex,
            Mode::FullText => lcm_search::GrepMode::FullText,
            Mode::Semantic => lcm_search::GrepMode::Semantic,
            Mode::Hybrid => lcm_search::GrepMode::Hybrid,
        }
    }
}

/// Runs the CLI with the process arguments; the process exit code.
pub fn run() -> ExitCode {
    restore_sigpipe();
    limit_malloc_arenas();
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = Cli::parse_from(&args);
    init_tracing();
    match execute(cli, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", report(&error));
            if let Some(remote) = error.downcast_ref::<control::RemoteError>() {
                ExitCode::from(remote.code)
            } else if error.is::<interrupt::Interrupted>() {
                ExitCode::from(interrupt::INTERRUPTED_EXIT_CODE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The error and its causes, joined by `: `, each said once: a cause whose text the message
/// before it already contains (errors that embed their source, as the store's do) is skipped.
pub(crate) fn report(error: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut previous = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !out.is_empty() {
            if previous.contains(&text) {
                continue;
            }
            out.push_str(": ");
        }
        out.push_str(&text);
        previous = text;
    }
    if disk_full(error) {
        out.push_str(DISK_FULL_HINT);
    }
    out
}

/// What a full disk's error goes on with (the store reopens its file once space is back).
const DISK_FULL_HINT: &str = "; the disk is full: free some space and run the command again (what was stored before is kept; an import goes on without duplicates)";

/// Whether `error` comes from a full disk (`ENOSPC`, a quota).
fn disk_full(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        if let Some(store) = cause.downcast_ref::<lcm_store::StoreError>() {
            return store.is_disk_full();
        }
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return lcm_store::error::io_error_is_disk_full(io);
        }
        let text = cause.to_string();
        text.contains("(os error 28)") || text.contains("(os error 122)")
    })
}

/// `lcm grep x | head` should end quietly when `head` closes the pipe, as other Unix tools do;
/// Rust ignores SIGPIPE by default, which turns a closed pipe into a panic in `println!`.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting the disposition of SIGPIPE to its default before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// glibc's allocator gives threads up to eight arenas per core and returns freed memory inside
/// an arena to the system rarely, so a daemon whose threads take turns on the store grows by
/// fragments of freed pages for hours (docs/RELIABILITY.md, Soak). One arena per core keeps
/// the parallel import's threads apart and the memory close to what is in use. An explicit
/// `MALLOC_ARENA_MAX` in the environment wins.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only changes the allocator's parameters; called before any thread
        // starts. It cannot fail for M_ARENA_MAX with a positive value.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
}

/// For a daemon: a client that goes away mid-answer makes the write fail (EPIPE) instead of
/// killing the process (`lcm` restores SIGPIPE's default for pipelines such as
/// `lcm grep | head`), so the daemon goes on and shuts down cleanly.
pub(crate) fn ignore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: changing SIGPIPE's disposition before the async runtime's threads start.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LCM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Where a command can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Placement {
    /// Needs no data directory, or one of its own (completions, tools, demo, eval).
    Elsewhere(&'static str),
    /// On the data directory: here, or inside the daemon that holds it.
    HereOrDaemon,
    /// Only with the store to itself: a daemon holding it must stop first.
    StoreAlone(&'static str),
}

/// Where `command` can run.
pub(crate) fn placement(command: &Command) -> Placement {
    use Placement::{Elsewhere, HereOrDaemon, StoreAlone};
    match command {
        Command::Completions(_) => Elsewhere("lcm completions"),
        Command::Tools(_) => Elsewhere("lcm tools"),
        Command::Demo(_) => Elsewhere("lcm demo"),
        Command::Eval(_) => Elsewhere("lcm eval"),
        Command::Import(_)
        | Command::Grep(_)
        | Command::Show(_)
        | Command::Sessions
        | Command::Stats
        | Command::Compact(_)
        | Command::Context(_)
        | Command::Dag(_)
        | Command::Describe(_)
        | Command::Tool(_) => HereOrDaemon,
        Command::Doctor(args) if !args.repair => HereOrDaemon,
        Command::Doctor(_) => StoreAlone("lcm doctor --repair"),
        Command::Map(args) => match args.command {
            map_commands::MapCommand::Status(_) => HereOrDaemon,
            map_commands::MapCommand::Run(_) => StoreAlone("lcm map run"),
            map_commands::MapCommand::Cancel(_) => StoreAlone("lcm map cancel"),
            map_commands::MapCommand::Resume(_) => StoreAlone("lcm map resume"),
        },
        Command::Reindex => StoreAlone("lcm reindex"),
        Command::Vacuum => StoreAlone("lcm vacuum"),
        Command::Serve(_) => StoreAlone("lcm serve"),
        Command::Mcp(_) => StoreAlone("lcm mcp"),
    }
}

/// Runs one parsed command; `args` are the process arguments it was parsed from (sent to a
/// daemon that holds the data directory, which then runs the command).
pub fn execute(cli: Cli, args: &[OsString]) -> Result<()> {
    // Needs neither a data directory nor a configuration.
    if let Command::Completions(args) = &cli.command {
        return completions(args);
    }
    let app = App::new(&cli)?;
    let placement = placement(&cli.command);
    if !matches!(placement, Placement::Elsewhere(_))
        && let Some(daemon) = control::find(&app.data_dir)?
    {
        if let Placement::StoreAlone(what) = placement {
            bail!(
                "{what} needs the store to itself, and {} (pid {}) holds {}: stop the daemon \
                 first (SIGTERM or Ctrl-C stops it cleanly)",
                daemon.advert.program,
                daemon.advert.pid,
                app.data_dir.display()
            );
        }
        return through_daemon(&app, &cli, daemon, args);
    }
    dispatch(&app, &cli.command)
}

/// Runs the command in the daemon of `daemon` (see [`control`]).
fn through_daemon(
    app: &App,
    cli: &Cli,
    daemon: control::Connected,
    args: &[OsString],
) -> Result<()> {
    let args = args
        .iter()
        .skip(1)
        .map(|a| {
            a.to_str().map(str::to_owned).with_context(|| {
                format!("the argument {a:?} is not UTF-8, which a daemon cannot be sent")
            })
        })
        .collect::<Result<Vec<String>>>()?;
    // `lcm import -`: the daemon reads standard input from a file this process fills.
    let stdin_copy = match &cli.command {
        Command::Import(import) if import.paths.iter().any(|p| p.as_os_str() == "-") => Some(
            import_commands::stdin_to_file(&app.cwd.join(&app.data_dir))?,
        ),
        _ => None,
    };
    control::run_remote(
        daemon,
        &app.data_dir,
        args,
        stdin_copy.as_ref().map(|(_, p)| p.clone()),
    )
}

/// Runs `command` with `app` (here, or inside a daemon for a CLI).
pub(crate) fn dispatch(ctx: &App, command: &Command) -> Result<()> {
    match command {
        Command::Import(args) => import_commands::import(ctx, args),
        Command::Grep(args) => commands::grep(ctx, args),
        Command::Show(args) => commands::show(ctx, args),
        Command::Sessions => commands::sessions(ctx),
        Command::Stats => commands::stats(ctx),
        Command::Reindex => commands::reindex(ctx),
        Command::Vacuum => commands::vacuum(ctx),
        Command::Compact(args) => dag_commands::compact_cmd(ctx, args),
        Command::Context(args) => dag_commands::context_cmd(ctx, args),
        Command::Dag(args) => dag_commands::dag_cmd(ctx, args),
        Command::Describe(args) => dag_commands::describe_cmd(ctx, args),
        Command::Demo(args) => demo::run(ctx, args),
        Command::Doctor(args) => doctor::doctor(ctx, args),
        Command::Tool(args) => tool_commands::tool_cmd(ctx, args),
        Command::Tools(args) => tool_commands::tools_cmd(ctx, args),
        Command::Serve(args) => serve::serve(ctx, args),
        Command::Map(args) => map_commands::map_cmd(ctx, args),
        Command::Mcp(args) => mcp::mcp(ctx, args),
        Command::Eval(args) => eval_commands::eval_cmd(ctx, args),
        Command::Completions(args) => completions(args),
    }
}

/// Writes the completion script of `args.shell` to stdout.
fn completions(args: &CompletionsArgs) -> Result<()> {
    use clap::CommandFactory;
    use std::io::Write;
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "lcm", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)
        .and_then(|()| out.flush())
        .context("writing the completion script")
}

/// What every command needs: where the data is, the configuration, how to print. A command
/// run by a daemon for a CLI gets the daemon's open data directory, configuration and a
/// connection to print to; a command run here opens the directory itself.
pub(crate) struct App {
    pub data_dir: PathBuf,
    pub config: Config,
    pub json: bool,
    pub quiet: bool,
    /// Where relative paths given on the command line start (the CLI's, through a daemon).
    pub cwd: PathBuf,
    /// Where the command's output goes.
    pub out: output::Output,
    /// The data directory already open (inside a daemon).
    held: Option<lcm_search::DataDir>,
    /// `lcm import -` through a daemon: the CLI's standard input, copied into this file.
    pub stdin_file: Option<PathBuf>,
    /// Inside a daemon: raised when the CLI cancels or goes away. Here: signals (installed when
    /// a command asks).
    interrupt: Option<interrupt::Interrupt>,
}

impl App {
    fn new(cli: &Cli) -> Result<Self> {
        let data_dir = match &cli.data_dir {
            Some(dir) => dir.clone(),
            None => default_data_dir()?,
        };
        let config_path = cli.config.clone().or_else(|| {
            let candidate = data_dir.join("config.toml");
            candidate.exists().then_some(candidate)
        });
        let config = match config_path {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read configuration {}", path.display()))?;
                Config::from_toml(&text).with_context(|| format!("in {}", path.display()))?
            }
            None => Config::default(),
        };
        let data_dir = match (&cli.data_dir, &config.storage.data_dir) {
            (None, Some(configured)) => configured.clone(),
            _ => data_dir,
        };
        Ok(App {
            data_dir,
            config,
            json: cli.json,
            quiet: cli.quiet || cli.json,
            cwd: std::env::current_dir().context("cannot read the working directory")?,
            out: output::Output::local(),
            held: None,
            stdin_file: None,
            interrupt: None,
        })
    }

    /// An app inside a daemon, over its open data directory: commands run for a CLI
    /// ([`control`]) and the `[watch]` follower. Quiet until told otherwise.
    pub(crate) fn in_daemon(
        data: lcm_search::DataDir,
        config: Config,
        out: output::Output,
        interrupt: interrupt::Interrupt,
        cwd: PathBuf,
    ) -> App {
        App {
            data_dir: data.path.clone(),
            config,
            json: false,
            quiet: true,
            cwd,
            out,
            held: Some(data),
            stdin_file: None,
            interrupt: Some(interrupt),
        }
    }

    /// The same settings on another data directory, run here (`lcm demo`).
    pub fn on_data_dir(&self, data_dir: PathBuf) -> App {
        App {
            data_dir,
            config: self.config.clone(),
            json: self.json,
            quiet: self.quiet,
            cwd: self.cwd.clone(),
            out: output::Output::local(),
            held: None,
            stdin_file: None,
            interrupt: None,
        }
    }

    /// Whether the command runs inside a daemon (on its open data directory).
    pub fn in_a_daemon(&self) -> bool {
        self.held.is_some()
    }

    /// What stops a long command early: Ctrl-C or SIGTERM here (caught from now on), the CLI's
    /// cancel inside a daemon.
    pub fn interrupt(&self) -> Result<interrupt::Interrupt> {
        match &self.interrupt {
            Some(interrupt) => Ok(interrupt.clone()),
            None => interrupt::Interrupt::install(),
        }
    }

    /// Opens the data directory for reading and writing (inside a daemon: the daemon's).
    pub fn open(&self) -> Result<lcm_search::DataDir> {
        if let Some(held) = &self.held {
            return Ok(held.clone());
        }
        lcm_search::DataDir::open(&self.data_dir, &self.config)
            .with_context(|| format!("cannot open the data directory {}", self.data_dir.display()))
    }

    /// Opens the data directory for a command that only reads: nothing is written (no fsync on
    /// open or close); see [`lcm_search::DataDir::open_read_only`].
    pub fn open_read_only(&self) -> Result<lcm_search::DataDir> {
        if let Some(held) = &self.held {
            return Ok(held.clone());
        }
        lcm_search::DataDir::open_read_only(&self.data_dir, &self.config)
            .with_context(|| format!("cannot open the data directory {}", self.data_dir.display()))
    }
}

fn default_data_dir() -> Result<PathBuf> {
    dirs::data_dir()
        .map(|d| d.join("lcm"))
        .context("no platform data directory; pass --data-dir or set LCM_DATA_DIR")
}

#[cfg(test)]
mod tests {
    use super::report;
    use anyhow::Context;

    #[test]
    fn an_error_report_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let store = lcm_store::StoreError::Io {
            path: "/x/lcm.redb".into(),
            source: io,
        };
        let error = Err::<(), _>(store)
            .context("cannot open the data directory /x")
            .unwrap_err();
        let text = report(&error);
        assert_eq!(
            text,
            "cannot open the data directory /x: I/O error on /x/lcm.redb: no such file"
        );
        assert_eq!(text.matches("no such file").count(), 1);

        // Causes that do not repeat each other are all kept.
        let error = Err::<(), _>(anyhow::anyhow!("inner"))
            .context("middle")
            .context("outer")
            .unwrap_err();
        assert_eq!(report(&error), "outer: middle: inner");
    }
}
