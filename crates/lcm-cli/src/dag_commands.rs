//! Commands over the summary DAG and the active context: compact, context, dag, describe.

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use lcm_core::ids::{AnyId, SessionId};
use lcm_core::summary::{NodeRef, Summary};
use lcm_engine::{assemble, compact, effective_budget, needs_compaction};
use lcm_search::DataDir;

use crate::App;
use crate::commands::resolve_session;
use crate::output::outln;
use crate::output::{count_bar, print_json, thousands};

/// Token budget used when none is given (a 32k-token window).
const DEFAULT_BUDGET: u64 = 32_000;

#[derive(Debug, Args)]
pub struct CompactArgs {
    /// The session (`ses_N` or its key).
    pub session: String,
    /// The context window to compact for, in tokens (the configured safety margin is kept
    /// free).
    #[arg(long, default_value_t = DEFAULT_BUDGET)]
    pub budget: u64,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Shape {
    Openai,
    Anthropic,
}

#[derive(Debug, Args)]
pub struct ContextArgs {
    /// The session (`ses_N` or its key).
    pub session: String,
    /// The context window, in tokens; the context is compacted first if it is above the soft
    /// threshold of this budget.
    #[arg(long, default_value_t = DEFAULT_BUDGET)]
    pub budget: u64,
    /// Provider shape of the printed messages.
    #[arg(long, value_enum, default_value = "openai")]
    pub format: Shape,
}

#[derive(Debug, Args)]
pub struct SessionArg {
    /// The session (`ses_N` or its key).
    pub session: String,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// `sum_N`, `msg_N` or `file_N`.
    pub id: String,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Compacts `session` for `budget` with the configured summariser, with a progress bar.
fn run_compaction(
    app: &App,
    data: &DataDir,
    session: SessionId,
    budget: u64,
) -> Result<lcm_engine::CompactionReport> {
    let summarizer = lcm_llm::summarizer_from_config(&app.config.llm, data.store.counter())
        .context("cannot set up the summariser (see [llm] in the configuration)")?;
    // Work against the window less the safety margin for tokenizers that are not public.
    let budget = effective_budget(budget, app.config.tokenizer.safety_margin);
    let before = assemble(&data.store, session)?.tokens;
    let goal = app.config.compaction.thresholds(budget).soft;
    let bar = count_bar(app, "compacting", before.saturating_sub(goal));
    let report = runtime()?.block_on(compact(
        &data.store,
        session,
        budget,
        &app.config.compaction,
        summarizer.as_ref(),
        |pass| {
            bar.inc(u64::from(
                pass.input_tokens.saturating_sub(pass.output_tokens),
            ));
        },
    ));
    bar.finish_and_clear();
    Ok(report?)
}

pub fn compact_cmd(app: &App, args: &CompactArgs) -> Result<()> {
    let data = app.open()?;
    let session = resolve_session(&data, &args.session)?;
    let report = run_compaction(app, &data, session, args.budget)?;
    if app.json {
        return print_json(app, &report);
    }
    outln!(
        app,
        "{session}: {} -> {} tokens (budget {}, goal {:.0}%): {} summaries written, {} provider calls{}",
        thousands(report.tokens_before),
        thousands(report.tokens_after),
        thousands(args.budget),
        app.config.compaction.soft_threshold * 100.0,
        report.passes.len(),
        report.provider_calls,
        if report.reached_goal {
            ""
        } else {
            " (goal not reached: the fresh tail alone is too large)"
        }
    )?;
    for p in &report.passes {
        outln!(
            app,
            "  {} {} depth {} over {} sources: {} -> {} tokens (level {})",
            p.summary,
            p.kind.as_str(),
            p.depth,
            p.sources,
            p.input_tokens,
            p.output_tokens,
            p.level
        )?;
    }
    Ok(())
}

pub fn context_cmd(app: &App, args: &ContextArgs) -> Result<()> {
    let data = app.open()?;
    let session = resolve_session(&data, &args.session)?;
    let tokens = assemble(&data.store, session)?.tokens;
    let budget = effective_budget(args.budget, app.config.tokenizer.safety_margin);
    if needs_compaction(tokens, budget, &app.config.compaction) {
        run_compaction(app, &data, session, args.budget)?;
    }
    // The budget invariant: whatever compaction could do, the printed context fits.
    let ctx = assemble(&data.store, session)?.fit(budget, 0, data.store.counter())?;
    let body = match args.format {
        Shape::Openai => serde_json::json!({ "messages": ctx.to_openai(None) }),
        Shape::Anthropic => ctx.to_anthropic(None),
    };
    print_json(
        app,
        &serde_json::json!({
            "session": session,
            "budget": args.budget,
            "tokens": ctx.tokens,
            "breakdown": ctx.breakdown(),
            "summaries": ctx.state.summaries,
            "raw_from_seq": ctx.state.raw_from,
            "body": body,
        }),
    )
}

pub fn dag_cmd(app: &App, args: &SessionArg) -> Result<()> {
    let data = app.open_read_only()?;
    let session = resolve_session(&data, &args.session)?;
    let ctx = assemble(&data.store, session)?;
    if app.json {
        let summaries = data.store.session_summaries(session)?;
        return print_json(
            app,
            &serde_json::json!({ "context": ctx.state, "summaries": summaries }),
        );
    }
    let info = data.store.session(session)?;
    outln!(
        app,
        "{session} `{}`: {} messages, {} tokens stored, {} tokens in context",
        info.key,
        thousands(info.message_count),
        thousands(info.token_total),
        thousands(ctx.tokens)
    )?;
    for id in &ctx.state.summaries {
        print_tree(app, &data, &data.store.summary(*id)?, 1)?;
    }
    let tail = info.message_count.saturating_sub(ctx.state.raw_from);
    outln!(
        app,
        "  raw tail: #{}.. ({tail} messages)",
        ctx.state.raw_from
    )?;
    Ok(())
}

fn print_tree(app: &App, data: &DataDir, s: &Summary, indent: usize) -> Result<()> {
    outln!(
        app,
        "{}{} {} depth {} {} tokens, covers #{}..#{} ({} messages, {} tokens){}",
        "  ".repeat(indent),
        s.id,
        s.kind.as_str(),
        s.depth,
        s.token_count,
        s.first_seq,
        s.last_seq,
        s.descendant_messages,
        thousands(s.descendant_tokens),
        if s.level == 1 {
            String::new()
        } else {
            format!(" [level {}]", s.level)
        }
    )?;
    for source in &s.sources {
        if let NodeRef::Summary(child) = source {
            print_tree(app, data, &data.store.summary(*child)?, indent + 1)?;
        }
    }
    Ok(())
}

pub fn describe_cmd(app: &App, args: &DescribeArgs) -> Result<()> {
    let id: AnyId = args.id.parse()?;
    let data = app.open_read_only()?;
    match id {
        AnyId::Summary(id) => {
            let s = data.store.summary(id)?;
            let parent = data.store.covering(NodeRef::Summary(id))?;
            let ratio = s.descendant_tokens as f64 / f64::from(s.token_count.max(1));
            if app.json {
                return print_json(
                    app,
                    &serde_json::json!({
                        "summary": s, "covered_by": parent, "compression_ratio": ratio,
                    }),
                );
            }
            outln!(
                app,
                "{} {} depth {}, {} tokens, {} .. {}",
                s.id,
                s.kind.as_str(),
                s.depth,
                s.token_count,
                s.earliest_at,
                s.latest_at
            )?;
            outln!(
                app,
                "  covers #{}..#{}: {} messages, {} tokens (compression {ratio:.1}x); level {}, model {}",
                s.first_seq,
                s.last_seq,
                s.descendant_messages,
                thousands(s.descendant_tokens),
                s.level,
                s.model
            )?;
            outln!(
                app,
                "  covered by: {}",
                parent.map_or_else(|| "nothing (top level)".to_owned(), |p| p.to_string())
            )?;
            let sources: Vec<String> = s.sources.iter().map(NodeRef::to_string).collect();
            outln!(app, "  sources: {}", sources.join(", "))?;
            if !s.file_ids.is_empty() {
                let files: Vec<String> = s.file_ids.iter().map(ToString::to_string).collect();
                outln!(app, "  files under it: {}", files.join(", "))?;
            }
            outln!(app, "\n{}", s.content)?;
            Ok(())
        }
        AnyId::Message(id) => {
            let m = data.store.message(id)?;
            let covering = data.store.covering(NodeRef::Message(id))?;
            if app.json {
                return print_json(
                    app,
                    &serde_json::json!({ "message": m, "covered_by": covering }),
                );
            }
            outln!(
                app,
                "{} in {} #{}: {} at {}, {} tokens, covered by {}",
                m.id,
                m.session,
                m.seq,
                m.role,
                m.created_at,
                m.token_count,
                covering.map_or_else(|| "nothing (raw in context)".to_owned(), |c| c.to_string())
            )?;
            outln!(app, "{}", m.search_text())?;
            Ok(())
        }
        AnyId::File(id) => {
            let reader = data.store.reader()?;
            let (info, seen) = data.store.file_explored(&reader, id)?;
            let messages = reader.file_messages(id)?;
            let disk = lcm_engine::tools::disk_state(&info, seen.as_deref());
            if app.json {
                return print_json(
                    app,
                    &serde_json::json!({
                        "file": info, "referenced_by": messages, "on_disk": format!("{disk:?}"),
                    }),
                );
            }
            outln!(
                app,
                "{} {} ({}{}), {} bytes, {} tokens, first seen in {} at {}",
                info.id,
                info.path
                    .as_deref()
                    .unwrap_or("(no path: content of a message)"),
                info.kind,
                info.language
                    .as_deref()
                    .map(|l| format!(", {l}"))
                    .unwrap_or_default(),
                thousands(info.byte_len),
                thousands(u64::from(info.token_count)),
                info.content_message
                    .map_or_else(|| "no message".to_owned(), |m| m.to_string()),
                info.created_at
            )?;
            let listed: Vec<String> = messages.iter().map(ToString::to_string).collect();
            outln!(app, "  referenced by: {}", listed.join(", "))?;
            outln!(app, "  sha256 {}; on disk: {disk:?}", info.content_hash)?;
            outln!(app, "\n{}", info.exploration)?;
            Ok(())
        }
        other => {
            bail!("{other}: describe takes a summary (sum_N), a message (msg_N) or a file (file_N)")
        }
    }
}
