//! `lcm map run|status|cancel|resume`: `llm_map` jobs from the command line.
//!
//! `run` and `resume` open the supervised runtime on the data directory (its MapWorkerPool runs
//! the job, and resumes every other job left running there), follow the job's progress events
//! with a progress bar, and print the job's summary. `status` and `cancel` work on the store
//! directly: they never start a model call.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use lcm_core::ids::JobId;
use lcm_engine::operators::{MapRequest, MapSummary, write_output};
use lcm_engine::runtime::{Runtime, RuntimeEvent, RuntimeOptions};
use lcm_store::{JobStatus, MapJob, Store};
use serde_json::Value;
use tokio::sync::broadcast;

use crate::App;
use crate::output::{Bar, count_bar, print_json, thousands};
use crate::output::{out, outln};

/// How long a stopping runtime gives running work to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct MapArgs {
    #[command(subcommand)]
    pub command: MapCommand,
}

#[derive(Debug, Subcommand)]
pub enum MapCommand {
    /// Apply a prompt to every item of a JSONL file with the configured model ([llm]); one
    /// schema-valid JSON result per item, written to a JSONL file in input order.
    Run(RunArgs),
    /// A job's progress (or every job's, without JOB), from the store.
    Status(StatusArgs),
    /// Cancel a job: nothing more is run; the output holds what was done.
    Cancel(JobArg),
    /// Run a job again from where it stopped (finished items are not redone).
    Resume(JobArg),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The JSONL input, one item a line (inside [map] allowed_roots; by default the working
    /// directory).
    pub input: PathBuf,
    /// The instruction applied to each item.
    #[arg(long)]
    pub prompt: String,
    /// The JSON Schema every result must satisfy: JSON text, or @FILE.
    #[arg(long)]
    pub schema: String,
    /// The output JSONL; default `<input stem>.out.jsonl` beside the input.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Items processed at once (default: [map] concurrency).
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Attempts per item (default: [map] max_attempts).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// The model, when not [llm] model.
    #[arg(long)]
    pub model: Option<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The job (`job_N`); every job when absent.
    pub job: Option<String>,
}

#[derive(Debug, Args)]
pub struct JobArg {
    /// The job (`job_N`).
    pub job: String,
}

/// Runs `lcm map ...`.
pub fn map_cmd(app: &App, args: &MapArgs) -> Result<()> {
    match &args.command {
        MapCommand::Run(args) => run(app, args),
        MapCommand::Status(args) => status(app, args),
        MapCommand::Cancel(args) => cancel(app, args),
        MapCommand::Resume(args) => resume(app, args),
    }
}

fn parse_job(given: &str) -> Result<JobId> {
    JobId::from_str(given.trim()).with_context(|| format!("`{given}` is not a job id (job_N)"))
}

/// `--schema`: JSON text, or `@FILE` holding it.
fn read_schema(given: &str) -> Result<Value> {
    let (text, source) = match given.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the schema file {path}"))?,
            path.to_owned(),
        ),
        None => (given.to_owned(), "--schema".to_owned()),
    };
    serde_json::from_str(&text).with_context(|| format!("{source} is not JSON"))
}

/// A multi-threaded tokio runtime (the lcm runtime runs store work on its blocking pool).
fn tokio() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

async fn open_runtime(app: &App) -> Result<Runtime> {
    Runtime::open(RuntimeOptions::dir(&app.data_dir, app.config.clone()))
        .await
        .with_context(|| {
            format!(
                "cannot start the runtime on the data directory {}",
                app.data_dir.display()
            )
        })
}

/// Opens the runtime, runs `work` with it, and shuts the runtime down whatever happened (a
/// job still running stays running in the store, to be resumed).
fn with_runtime<F, Fut>(app: &App, work: F) -> Result<()>
where
    F: FnOnce(Runtime) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    tokio()?.block_on(async {
        let runtime = open_runtime(app).await?;
        let result = work(runtime.clone()).await;
        let stopped = runtime.shutdown(SHUTDOWN_GRACE).await;
        result?;
        stopped.context("the runtime did not shut down cleanly")
    })
}

/// `lcm map run INPUT --prompt P --schema S`.
fn run(app: &App, args: &RunArgs) -> Result<()> {
    let schema = read_schema(&args.schema)?;
    let mut request = MapRequest::llm(&args.input, &args.prompt, schema);
    request.output_path = args.output.clone();
    request.concurrency = args.concurrency;
    request.max_attempts = args.max_attempts;
    request.model = args.model.clone();
    with_runtime(app, |runtime| async move {
        // Subscribed before the job starts, so no progress is missed.
        let events = runtime.subscribe();
        let job = runtime.llm_map(request).await?;
        if !app.quiet {
            app.out.note(&format!(
                "{}: {} items from {} (output: {})",
                job.id,
                thousands(job.progress.total),
                job.input_path.display(),
                job.output_path.display()
            ))?;
        }
        follow(app, &runtime, &job, events).await
    })
}

/// `lcm map resume JOB`.
fn resume(app: &App, args: &JobArg) -> Result<()> {
    let id = parse_job(&args.job)?;
    with_runtime(app, |runtime| async move {
        let events = runtime.subscribe();
        runtime.map_resume(id).await?;
        let job = runtime.store().job(id)?;
        if !app.quiet && !job.status.is_terminal() {
            let p = job.progress;
            app.out.note(&format!(
                "{id}: resumed with {} of {} items left",
                thousands(p.pending + p.running),
                thousands(p.total)
            ))?;
        }
        follow(app, &runtime, &job, events).await
    })
}

/// Waits for `job` with a progress bar fed by its progress events, then prints its summary. On
/// Ctrl-C the job stops where it is (it stays running in the store) and the command says how to
/// go on.
async fn follow(
    app: &App,
    runtime: &Runtime,
    job: &MapJob,
    events: broadcast::Receiver<RuntimeEvent>,
) -> Result<()> {
    let bar = count_bar(app, &job.id.to_string(), job.progress.total);
    bar.set_position(job.progress.done());
    let progress = tokio::spawn(show_progress(events, job.id, bar.clone()));
    let summary = tokio::select! {
        summary = runtime.map_wait(job.id) => Some(summary),
        _ = tokio::signal::ctrl_c() => None,
    };
    progress.abort();
    bar.finish_and_clear();
    let Some(summary) = summary else {
        bail!(
            "interrupted: {0} stays running in the store; `lcm map resume {0}` goes on from where it stopped",
            job.id
        );
    };
    print_summary(app, &summary?)
}

async fn show_progress(mut events: broadcast::Receiver<RuntimeEvent>, job: JobId, bar: Bar) {
    loop {
        match events.recv().await {
            Ok(RuntimeEvent::MapProgress {
                job: j,
                total,
                completed,
                failed,
                ..
            }) if j == job => {
                bar.set_length(total);
                bar.set_position(completed + failed);
                if failed > 0 {
                    bar.set_message(format!("{job} ({failed} failed)"));
                }
            }
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
}

fn print_summary(app: &App, summary: &MapSummary) -> Result<()> {
    if app.json {
        return print_json(app, summary);
    }
    out!(app, "{summary}")?;
    Ok(())
}

/// `lcm map status [JOB]`.
fn status(app: &App, args: &StatusArgs) -> Result<()> {
    let data = app.open()?;
    let Some(given) = &args.job else {
        let jobs = data.store.jobs()?;
        if app.json {
            return print_json(app, &jobs);
        }
        if jobs.is_empty() {
            outln!(app, "no map jobs")?;
        }
        for job in &jobs {
            let p = job.progress;
            outln!(
                app,
                "{:<8} {:<10} {:>9}/{:<9} {:>7} failed  {}",
                job.id.to_string(),
                job.status.as_str(),
                thousands(p.done()),
                thousands(p.total),
                thousands(p.failed),
                job.input_path.display()
            )?;
        }
        return Ok(());
    };
    let job = data.store.job(parse_job(given)?)?;
    if app.json {
        return print_json(app, &job);
    }
    print_job(app, &job)?;
    Ok(())
}

fn print_job(app: &App, job: &MapJob) -> Result<()> {
    let p = job.progress;
    let percent = if p.total == 0 {
        100.0
    } else {
        p.done() as f64 * 100.0 / p.total as f64
    };
    outln!(
        app,
        "{} ({:?} map) {}: {} of {} items done ({percent:.1}%)",
        job.id,
        job.kind,
        job.status,
        thousands(p.done()),
        thousands(p.total)
    )?;
    outln!(
        app,
        "  completed {}, failed {}, pending {}, running {}",
        thousands(p.completed),
        thousands(p.failed),
        thousands(p.pending),
        thousands(p.running)
    )?;
    outln!(app, "  input:  {}", job.input_path.display())?;
    outln!(app, "  output: {}", job.output_path.display())?;
    let prompt = job.prompt.lines().next().unwrap_or_default();
    outln!(app, "  prompt: {prompt}")?;
    outln!(
        app,
        "  created {}{}",
        job.created_at,
        job.finished_at
            .map_or_else(String::new, |t| format!(", finished {t}"))
    )?;
    if let Some(error) = &job.error {
        outln!(app, "  error: {error}")?;
    }
    if job.status == JobStatus::Running {
        outln!(
            app,
            "  (`lcm map resume {}` runs it; so does any runtime opened on this data directory)",
            job.id
        )?;
    }
    Ok(())
}

/// `lcm map cancel JOB`: in the store (no runtime, so no other job starts running meanwhile),
/// then the output is written with what was done.
fn cancel(app: &App, args: &JobArg) -> Result<()> {
    let id = parse_job(&args.job)?;
    let data = app.open()?;
    let store = &data.store;
    let before = store.job(id)?;
    if before.status.is_terminal() {
        if app.json {
            return print_json(app, &before);
        }
        outln!(app, "{id} is already {}; nothing to cancel", before.status)?;
        return Ok(());
    }
    let job = cancel_in_store(store, &before)?;
    let summary = write_output(store, id, &job.output_path)
        .with_context(|| format!("{id} is cancelled, but its output could not be written"))?;
    print_summary(app, &summary)
}

fn cancel_in_store(store: &Store, job: &MapJob) -> Result<MapJob> {
    // No worker can hold this store's items (the store is open here): claims left by a process
    // that died go back to pending, so the cancelled job lists them as not run.
    if job.status == JobStatus::Running {
        store.resume(job.id)?;
    }
    Ok(store.cancel(job.id)?)
}
