//! `lcm eval`: evaluations of lcm on data sets (see the `lcm-eval` crate).

use std::path::PathBuf;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use lcm_eval::model::ModelSettings;
use lcm_eval::report::{self, RunResult};
use lcm_eval::runner::{self, Arm, Plan, SummarizerChoice};
use lcm_eval::tasks::{self, Family, Task};
use lcm_eval::{locomo, recall, trec};
use lcm_llm::from_config::clients_from_config;
use lcm_search::{DataDir, GrepMode};

use crate::output::{count_bar, print_json, spinner};
use crate::output::{out, outln};
use crate::{App, Mode};

#[derive(Debug, Args)]
pub struct EvalArgs {
    #[command(subcommand)]
    pub command: EvalCommand,
}

#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Recall of the evidence turns of a LoCoMo-format file's questions by each search mode:
    /// recall@1/5/10 and MRR, overall and per question category.
    Recall(RecallArgs),
    /// Generates tasks from a seed at each context length and runs them with each arm; writes
    /// results.json, results.md (a table) and results.svg (score against length) to `--out`.
    Run(RunArgs),
    /// Merges result files of `lcm eval run` into one report (results.json, .md and .svg).
    Report(ReportArgs),
    /// Prints one generated task as JSON: its session's turns and its questions with answers.
    Generate(GenerateArgs),
}

/// A task family on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FamilyArg {
    /// Questions about hidden TREC labels over a long record (OOLONG trec_coarse style).
    Aggregation,
    /// Facts planted in a long session, asked about after it is compacted.
    Needles,
}

impl FamilyArg {
    fn family(self) -> Family {
        match self {
            FamilyArg::Aggregation => Family::Aggregation,
            FamilyArg::Needles => Family::Needles,
        }
    }
}

/// Who answers the questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ArmArg {
    /// No model: lcm's tools and a fixed policy (needle tasks), which must score 100%.
    Scripted,
    /// The configured model alone, the task's input truncated to --window (newest part kept).
    Baseline,
    /// The configured model as an lcm agent: the context lcm assembles for --window, lcm's
    /// tools and llm_map offered.
    Lcm,
}

impl ArmArg {
    fn arm(self) -> Arm {
        match self {
            ArmArg::Scripted => Arm::Scripted,
            ArmArg::Baseline => Arm::Baseline,
            ArmArg::Lcm => Arm::Lcm,
        }
    }
}

/// What compacts the lcm arm's sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SummarizerArg {
    /// The offline structured summariser: no model calls.
    Offline,
    /// The configured model.
    Model,
}

/// What a task is generated from.
#[derive(Debug, Args)]
pub struct TaskArgs {
    /// The TREC question set (`TREC.train`, `COARSE:fine question` lines): the records of
    /// aggregation tasks and the small talk of needle tasks.
    #[arg(long)]
    pub trec: PathBuf,
    /// The first seed; tasks use seeds from it on.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub task: TaskArgs,
    /// A task family (repeatable). Default: needles.
    #[arg(long = "family", value_enum)]
    pub families: Vec<FamilyArg>,
    /// A context length in tokens, such as 8k, 32k, 1m (repeatable; k = 1,024). Default: 8k
    /// and 32k.
    #[arg(long = "length", value_parser = parse_length)]
    pub lengths: Vec<u64>,
    /// An arm (repeatable). Default: scripted. The model arms (baseline, lcm) use the model of
    /// the configuration's [llm] section.
    #[arg(long = "arm", value_enum)]
    pub arms: Vec<ArmArg>,
    /// Tasks per family and length (seeds `--seed`, `--seed` + 1, ...).
    #[arg(long, default_value_t = 1)]
    pub tasks: u64,
    /// The budget sessions are compacted to before the scripted and lcm arms answer, in tokens.
    #[arg(long, default_value_t = 4_000)]
    pub budget: u64,
    /// The model's context window for the model arms, in tokens as lcm counts them (8k, 32k,
    /// or a number): one request, the answer's room included.
    #[arg(long, value_parser = parse_window, default_value = "32k")]
    pub window: u64,
    /// Most tokens the model may generate per call.
    #[arg(long, default_value_t = 256)]
    pub max_output: u32,
    /// Questions asked per task by the model arms (the first N). Default: all.
    #[arg(long)]
    pub questions: Option<usize>,
    /// Most model turns per question in the lcm arm.
    #[arg(long, default_value_t = 8)]
    pub turns: u32,
    /// What compacts the lcm arm's sessions.
    #[arg(long, value_enum, default_value = "offline")]
    pub summarizer: SummarizerArg,
    /// Seconds allowed per question of a model arm.
    #[arg(long, default_value_t = 600)]
    pub question_timeout: u64,
    /// Where the reports go.
    #[arg(long, default_value = "lcm-eval-results")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Result files (results.json of `lcm eval run`).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where the merged reports go.
    #[arg(long, default_value = "lcm-eval-results")]
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub task: TaskArgs,
    #[arg(long, value_enum)]
    pub family: FamilyArg,
    /// The context length in tokens (8k, 32k, 1m, or a number).
    #[arg(long, value_parser = parse_length)]
    pub length: u64,
}

/// `8k` = 8,192, `1m` = 1,048,576, or a plain number of tokens (at least 1,024).
fn parse_length(text: &str) -> std::result::Result<u64, String> {
    parse_tokens(text, "a task needs at least 1,024 tokens")
}

/// A model's window: as [`parse_length`].
fn parse_window(text: &str) -> std::result::Result<u64, String> {
    parse_tokens(
        text,
        "a window needs at least 1,024 tokens for the context, the question and the answer",
    )
}

/// `8k` = 8,192, `1m` = 1,048,576, or a plain number of tokens; under 1,024 is refused with
/// `too_short`.
fn parse_tokens(text: &str, too_short: &str) -> std::result::Result<u64, String> {
    let lower = text.trim().to_ascii_lowercase();
    let (digits, unit) = match lower.strip_suffix('k') {
        Some(d) => (d, 1u64 << 10),
        None => match lower.strip_suffix('m') {
            Some(d) => (d, 1 << 20),
            None => (lower.as_str(), 1),
        },
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not a length (examples: 8k, 32k, 1m, 20000)"))?;
    let tokens = n.saturating_mul(unit);
    if tokens < 1_024 {
        return Err(format!("`{text}` is too short: {too_short}"));
    }
    Ok(tokens)
}

#[derive(Debug, Args)]
pub struct RecallArgs {
    /// LoCoMo-format JSON files (conversations with `qa` and `evidence`: `locomo10.json`, or
    /// the multimodal-dialog release's file per conversation), measured together.
    #[arg(value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,
    /// A search mode to measure (repeatable). Default: full-text, and semantic and hybrid when
    /// an embedding model is configured (`[embeddings] model_dir`).
    #[arg(long = "mode", value_enum)]
    pub modes: Vec<Mode>,
    /// Also report recall@K (repeatable; 1, 5 and 10 are always reported), to see how deep the
    /// evidence lies: at most `search.max_limit`. MRR stays within the first 10 hits.
    #[arg(long = "at", value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub at: Vec<u64>,
    /// Import into this data directory and keep it (a second run reuses it). Default: a
    /// temporary directory, removed afterwards; the data directory of `--data-dir` is never
    /// touched.
    #[arg(long)]
    pub keep: Option<PathBuf>,
}

pub fn eval_cmd(app: &App, args: &EvalArgs) -> Result<()> {
    match &args.command {
        EvalCommand::Recall(args) => recall_cmd(app, args),
        EvalCommand::Run(args) => run_cmd(app, args),
        EvalCommand::Report(args) => report_cmd(app, args),
        EvalCommand::Generate(args) => generate_cmd(app, args),
    }
}

fn generate(items: &[trec::Item], family: Family, seed: u64, length: u64, app: &App) -> Task {
    let counter = lcm_core::tokens::TokenCounter::new(app.config.tokenizer.encoding());
    tasks::generate(family, items, seed, length, counter)
}

fn generate_cmd(app: &App, args: &GenerateArgs) -> Result<()> {
    let items = trec::load(&args.task.trec)?;
    let task = generate(
        &items,
        args.family.family(),
        args.task.seed,
        args.length,
        app,
    );
    print_json(app, &task)
}

fn run_cmd(app: &App, args: &RunArgs) -> Result<()> {
    let plan = Plan {
        families: if args.families.is_empty() {
            vec![Family::Needles]
        } else {
            args.families.iter().map(|f| f.family()).collect()
        },
        lengths: if args.lengths.is_empty() {
            vec![8 << 10, 32 << 10]
        } else {
            args.lengths.clone()
        },
        arms: if args.arms.is_empty() {
            vec![Arm::Scripted]
        } else {
            args.arms.iter().map(|a| a.arm()).collect()
        },
        seed: args.task.seed,
        tasks: args.tasks,
        budget: args.budget,
        model: ModelSettings {
            window: args.window,
            max_output_tokens: args.max_output,
            questions: args.questions,
            max_turns: args.turns,
            question_timeout: Duration::from_secs(args.question_timeout.max(1)),
        },
        summarizer: match args.summarizer {
            SummarizerArg::Offline => SummarizerChoice::Offline,
            SummarizerArg::Model => SummarizerChoice::Model,
        },
    };
    let llm = if plan.arms.iter().any(|a| a.needs_model()) {
        clients_from_config(&app.config.llm)
            .context("cannot build the configured model's client")?
    } else {
        None
    };
    plan.check(llm.as_ref())?;
    let items = trec::load(&args.task.trec)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let dir = tempfile::Builder::new()
        .prefix("lcm-eval-")
        .tempdir()
        .context("cannot create a temporary data directory")?;
    let total = plan.families.len() as u64
        * plan.lengths.len() as u64
        * plan.tasks
        * plan.arms.len() as u64;
    let bar = count_bar(app, "tasks", total);
    let results = runtime.block_on(runner::run(
        &plan,
        &items,
        &app.config,
        llm.as_ref(),
        dir.path(),
        |_| bar.inc(1),
    ));
    bar.finish_and_clear();
    write_reports(app, &args.out, &results?)
}

fn report_cmd(app: &App, args: &ReportArgs) -> Result<()> {
    let results = report::read_json(&args.files)?;
    write_reports(app, &args.out, &results)
}

fn write_reports(app: &App, out_dir: &std::path::Path, results: &[RunResult]) -> Result<()> {
    let paths = report::write_all(out_dir, results)?;
    if app.json {
        return print_json(app, &results);
    }
    out!(app, "{}", report::markdown(results))?;
    for path in paths {
        outln!(app, "wrote {}", path.display())?;
    }
    Ok(())
}

fn recall_cmd(app: &App, args: &RecallArgs) -> Result<()> {
    let modes: Vec<GrepMode> = if args.modes.is_empty() {
        if app.config.embeddings.model_dir.is_some() {
            vec![GrepMode::FullText, GrepMode::Semantic, GrepMode::Hybrid]
        } else {
            vec![GrepMode::FullText]
        }
    } else {
        args.modes.iter().map(|m| m.grep_mode()).collect()
    };
    if modes.contains(&GrepMode::Regex) {
        bail!(
            "recall is measured for ranked search (--mode full-text, semantic or hybrid), not regex"
        );
    }
    // Checked before anything is imported.
    let at = args
        .at
        .iter()
        .map(|&k| usize::try_from(k).unwrap_or(usize::MAX));
    let ks = recall::cut_offs(
        &recall::KS.into_iter().chain(at).collect::<Vec<_>>(),
        &app.config.search,
    )?;
    let conversations = locomo::load_all(&args.files)?;
    let temporary;
    let dir = match &args.keep {
        Some(dir) => dir.clone(),
        None => {
            temporary = tempfile::Builder::new()
                .prefix("lcm-eval-")
                .tempdir()
                .context("cannot create a temporary data directory")?;
            temporary.path().join("lcm")
        }
    };
    let data = DataDir::open(&dir, &app.config)
        .with_context(|| format!("cannot open the data directory {}", dir.display()))?;
    let importing = spinner(app, "importing");
    let embedding = count_bar(app, "embedding", 0);
    let imported = recall::import(&data, &conversations, |done, total| {
        importing.finish_and_clear();
        embedding.set_length(total);
        embedding.set_position(done);
    });
    importing.finish_and_clear();
    embedding.finish_and_clear();
    let imported = imported?;
    let questions: usize = conversations.iter().map(|c| c.questions.len()).sum();
    let bar = count_bar(app, "searching", (questions * modes.len()) as u64);
    let report = recall::evaluate(
        &data,
        &app.config.search,
        &conversations,
        &imported,
        &modes,
        &ks,
        |done, _| bar.set_position(done as u64),
    );
    bar.finish_and_clear();
    let report = report?;
    if app.json {
        print_json(app, &report)
    } else {
        out!(app, "{}", report.to_table())?;
        Ok(())
    }
}
