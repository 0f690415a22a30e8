//! `lcm eval`: evaluations of lcm on data sets (see the `lcm-eval` crate).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use lcm_eval::report::{self, RunResult};
use lcm_eval::tasks::{Family, Task, aggregation, needles};
use lcm_eval::{locomo, recall, scripted, trec};
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
    /// An arm (repeatable). Default: scripted.
    #[arg(long = "arm", value_enum)]
    pub arms: Vec<ArmArg>,
    /// Tasks per family and length (seeds `--seed`, `--seed` + 1, ...).
    #[arg(long, default_value_t = 1)]
    pub tasks: u64,
    /// The budget sessions are compacted to before the scripted arm answers, in tokens.
    #[arg(long, default_value_t = 4_000)]
    pub budget: u64,
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
        return Err(format!(
            "`{text}` is too short: a task needs at least 1,024 tokens"
        ));
    }
    Ok(tokens)
}

#[derive(Debug, Args)]
pub struct RecallArgs {
    /// A LoCoMo-format JSON file (conversations with `qa` and `evidence`).
    pub file: PathBuf,
    /// A search mode to measure (repeatable). Default: full-text, and semantic and hybrid when
    /// an embedding model is configured (`[embeddings] model_dir`).
    #[arg(long = "mode", value_enum)]
    pub modes: Vec<Mode>,
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
    match family {
        Family::Aggregation => aggregation::generate(items, seed, length, counter),
        Family::Needles => needles::generate(items, seed, length, counter),
    }
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
    let families: Vec<Family> = if args.families.is_empty() {
        vec![Family::Needles]
    } else {
        args.families.iter().map(|f| f.family()).collect()
    };
    let lengths = if args.lengths.is_empty() {
        vec![8 << 10, 32 << 10]
    } else {
        args.lengths.clone()
    };
    let arms = if args.arms.is_empty() {
        vec![ArmArg::Scripted]
    } else {
        args.arms.clone()
    };
    if arms.contains(&ArmArg::Scripted) && families.contains(&Family::Aggregation) {
        bail!(
            "the scripted arm answers needle tasks only: aggregation questions need a model to \
             judge each record (run --family needles)"
        );
    }
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
    let data = DataDir::open(dir.path().join("lcm"), &app.config)
        .context("cannot open a data directory for the tasks")?;
    let total = families.len() as u64 * lengths.len() as u64 * args.tasks * arms.len() as u64;
    let bar = count_bar(app, "tasks", total);
    let mut results = Vec::new();
    for family in &families {
        for length in &lengths {
            for k in 0..args.tasks {
                let seed = args.task.seed + k;
                let task = generate(&items, *family, seed, *length, app);
                for _arm in &arms {
                    let run = runtime.block_on(scripted::run(&task, &data, args.budget))?;
                    if run.facts_compacted < run.facts {
                        bail!(
                            "{} of {} planted facts are still raw after compaction to {} tokens: \
                             use a smaller --budget",
                            run.facts - run.facts_compacted,
                            run.facts,
                            args.budget
                        );
                    }
                    results.push(RunResult {
                        seed,
                        family: *family,
                        length: *length,
                        arm: "scripted".into(),
                        score: run.score,
                        questions: run.answers.len(),
                        tokens_spent: run.tokens_read,
                        calls: u64::from(run.calls),
                        wall_ms: run.wall_ms,
                    });
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    write_reports(app, &args.out, &results)
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
    let conversations = locomo::load(&args.file)?;
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
