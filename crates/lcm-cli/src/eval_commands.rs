//! `lcm eval`: evaluations of lcm on data sets (see the `lcm-eval` crate).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use lcm_eval::{locomo, recall};
use lcm_search::{DataDir, GrepMode};

use crate::output::out;
use crate::output::{count_bar, print_json, spinner};
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
    }
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
