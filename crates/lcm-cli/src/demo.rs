//! `lcm demo`: the end-to-end main job on a fresh machine.
//!
//! Imports the example Claude Code transcript shipped with lcm (embedded in the binary, so the
//! command works from any directory), imports it a second time to show that import is
//! idempotent, runs a regex grep and a ranked full-text grep, then compacts the session for a
//! deliberately tiny window (the example is short) and prints the summary DAG and the assembled
//! context.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use clap::Args;
use lcm_core::config::CompactionConfig;
use lcm_core::summary::NodeRef;
use lcm_engine::{assemble, compact};
use lcm_search::{GrepMode, GrepRequest, Scope};
use lcm_store::import::{ImportOptions, import_file};

use crate::App;
use crate::commands::catch_up_index;
use crate::output::outln;
use crate::output::print_json;

/// The example transcript (a synthetic Claude Code session written for lcm).
const EXAMPLE: &str = include_str!("../../../examples/transcripts/demo-session.jsonl");
const EXAMPLE_NAME: &str = "demo-session.jsonl";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Regex to grep for after importing.
    #[arg(long, default_value = r"INV-\d{4}")]
    pub regex: String,
    /// Words to rank by after importing.
    #[arg(long, default_value = "timeout page size")]
    pub words: String,
    /// Keep the data in this directory instead of a fresh temporary one.
    #[arg(long)]
    pub keep_in: Option<PathBuf>,
    /// The window the example is compacted for, in tokens (the example holds about 1,000).
    #[arg(long, default_value_t = 700)]
    pub budget: u64,
}

/// Compaction settings scaled down to a 22-message example (the defaults are for real
/// sessions: a 32-message fresh tail and 20,000-token leaf spans).
fn demo_compaction() -> CompactionConfig {
    CompactionConfig {
        fresh_tail: 6,
        leaf_chunk_tokens: 450,
        leaf_target_tokens: 60,
        condensed_fanout: 2,
        condensed_target_tokens: 80,
        ..CompactionConfig::default()
    }
}

pub fn run(app: &App, args: &DemoArgs) -> Result<()> {
    let dir = match &args.keep_in {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("lcm-demo-{}", std::process::id())),
    };
    let app = app.on_data_dir(dir.clone());
    let data = app.open()?;
    let example = dir.join(EXAMPLE_NAME);
    std::fs::write(&example, EXAMPLE)
        .with_context(|| format!("cannot write {}", example.display()))?;

    let options = ImportOptions::default();
    let first = import_file(&data.store, &example, &options, |_, _| {})?;
    let second = import_file(&data.store, &example, &options, |_, _| {})?;
    ensure!(
        second.imported == 0 && second.already_present == first.imported,
        "the second import should add nothing (added {})",
        second.imported
    );
    catch_up_index(&app, &data)?;

    let search = |pattern: &str, mode| {
        lcm_search::grep(
            &data.store,
            &data.index,
            &app.config.search,
            &GrepRequest {
                pattern: pattern.to_owned(),
                mode,
                scope: Scope::default(),
                limit: Some(5),
                cursor: None,
            },
        )
    };
    let regex_page = search(&args.regex, GrepMode::Regex)?;
    let words_page = search(&args.words, GrepMode::FullText)?;

    let session = first
        .sessions
        .first()
        .map(|s| s.id)
        .context("the example holds no session")?;
    let summarizer = lcm_llm::summarizer_from_config(&app.config.llm, data.store.counter())?;
    let report = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(compact(
            &data.store,
            session,
            args.budget,
            &demo_compaction(),
            summarizer.as_ref(),
            |_| {},
        ))?;
    let context = assemble(&data.store, session)?;
    // Every message is still reachable: from the context's summaries down to messages, then the
    // raw tail.
    let reachable = data.store.context_messages(session)?.len() as u64;
    ensure!(
        reachable == data.store.session(session)?.message_count,
        "a message is not reachable from the context"
    );

    if app.json {
        print_json(
            &app,
            &serde_json::json!({
                "data_dir": dir,
                "first_import": first,
                "second_import": second,
                "regex": { "pattern": args.regex, "page": regex_page },
                "full_text": { "query": args.words, "page": words_page },
                "compaction": report,
                "context": { "tokens": context.tokens, "state": context.state, "reachable_messages": reachable },
            }),
        )?;
    } else {
        outln!(app, "data directory: {}", dir.display())?;
        outln!(
            app,
            "imported {}: {} messages in {} session(s); {} entries skipped (not messages)",
            EXAMPLE_NAME,
            first.imported,
            first.sessions.len(),
            first.skipped.values().sum::<u64>()
        )?;
        outln!(
            app,
            "imported it again: {} new, {} already present (import is idempotent)",
            second.imported,
            second.already_present
        )?;
        outln!(
            app,
            "\nlcm grep '{}'  ({:?})",
            args.regex,
            regex_page.strategy
        )?;
        for hit in &regex_page.hits {
            outln!(
                app,
                "  {} {} {:<9} {}",
                hit.message,
                hit.created_at,
                hit.role.as_str(),
                hit.snippet
            )?;
        }
        outln!(app, "\nlcm grep --mode full-text '{}'", args.words)?;
        for hit in &words_page.hits {
            outln!(
                app,
                "  {} score {:.2} {:<9} {}",
                hit.message,
                hit.score.unwrap_or(0.0),
                hit.role.as_str(),
                hit.snippet
            )?;
        }
        outln!(
            app,
            "\nlcm compact {session} --budget {}: {} -> {} tokens, {} summaries, {} provider calls ({})",
            args.budget,
            report.tokens_before,
            report.tokens_after,
            report.passes.len(),
            report.provider_calls,
            summarizer.model()
        )?;
        outln!(app, "lcm dag {session}:")?;
        for id in &context.state.summaries {
            print_tree(&app, &data, *id, 1)?;
        }
        outln!(
            app,
            "  raw tail: {} messages",
            data.store.session(session)?.message_count - context.state.raw_from
        )?;
        outln!(
            app,
            "lcm context {session}: {} items, {} tokens; all {reachable} messages reachable through the DAG",
            context.items.len(),
            context.tokens
        )?;
        outln!(
            app,
            "\nTry: lcm --data-dir {} show {}",
            dir.display(),
            regex_page
                .hits
                .first()
                .map_or_else(|| "msg_0".to_owned(), |h| h.message.to_string())
        )?;
    }
    Ok(())
}

fn print_tree(
    app: &App,
    data: &lcm_search::DataDir,
    id: lcm_core::ids::SummaryId,
    indent: usize,
) -> Result<()> {
    let s = data.store.summary(id)?;
    outln!(
        app,
        "{}{} {} depth {}: {} tokens for {} messages",
        "  ".repeat(indent),
        s.id,
        s.kind.as_str(),
        s.depth,
        s.token_count,
        s.descendant_messages
    )?;
    for source in &s.sources {
        if let NodeRef::Summary(child) = source {
            print_tree(app, data, *child, indent + 1)?;
        }
    }
    Ok(())
}
