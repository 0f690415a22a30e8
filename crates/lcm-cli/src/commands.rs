//! The commands that work on a data directory.

use anyhow::{Context, Result, bail};
use clap::Args;
use lcm_core::ids::{AnyId, MessageId, SessionId, SummaryId};
use lcm_core::message::{Part, Role};
use lcm_core::time::Timestamp;
use lcm_search::grep::{Unembedded, not_embedded_note};
use lcm_search::vectors::VectorIndex;
use lcm_search::{DataDir, GrepRequest, Scope};

use crate::interrupt::Interrupted;
use crate::output::outln;
use crate::output::{count_bar, print_json, spinner, thousands};
use crate::{App, Mode};

/// Brings the index up to date with the store, with a progress bar, and then the embeddings
/// when a model is configured (Ctrl-C stops those after their current batch; the next import,
/// `lcm reindex` or `lcm serve` goes on from there).
pub fn catch_up_index(app: &App, data: &DataDir) -> Result<u64> {
    let pending = data.store.next_message_id()?.0 - data.index.watermark().0;
    let mut indexed = 0;
    if pending > 0 {
        let bar = count_bar(app, "indexing", pending);
        let result = data.index.catch_up(&data.store, |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        indexed = result?;
    }
    if let Some(semantic) = data.index.semantic() {
        let interrupt = app.interrupt()?;
        let behind = semantic.messages_not_embedded(&data.store)?;
        if behind > 0 {
            let bar = count_bar(app, "embedding", behind);
            let result = semantic.catch_up_until(
                &data.store,
                |done, total| {
                    bar.set_length(total);
                    bar.set_position(done);
                },
                || interrupt.requested(),
            );
            bar.finish_and_clear();
            result?;
        }
    }
    Ok(indexed)
}

#[derive(Debug, Args)]
pub struct GrepArgs {
    /// A regex (Rust syntax) or, with --mode full-text, words to rank by.
    pub pattern: String,
    #[arg(long, value_enum, default_value = "regex")]
    pub mode: Mode,
    /// Regex mode: match letters whatever their case (the pattern as `(?i)PATTERN`).
    #[arg(short = 'i', long)]
    pub ignore_case: bool,
    /// Regex mode: the pattern is a literal string, its `.`, `(`, `*` and the rest matched as
    /// they are.
    #[arg(short = 'F', long)]
    pub fixed_strings: bool,
    /// Only this session (`ses_N` or its key).
    #[arg(long)]
    pub session: Option<String>,
    /// Only these roles (repeatable): system, user, assistant, tool.
    #[arg(long = "role", value_parser = parse_role)]
    pub roles: Vec<Role>,
    /// Only messages created at or after this time (RFC 3339 or YYYY-MM-DD).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<Timestamp>,
    /// Only messages created before this time.
    #[arg(long, value_parser = parse_time)]
    pub before: Option<Timestamp>,
    /// Hits per page.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Continue from a previous page's cursor.
    #[arg(long)]
    pub cursor: Option<String>,
}

impl GrepArgs {
    /// The pattern as the search takes it: escaped for `--fixed-strings`, behind `(?i)` for
    /// `--ignore-case`. Both are regex options: the other modes match words whatever their
    /// case, and a literal is what they read anyway.
    pub fn regex_pattern(&self) -> Result<String> {
        if (self.ignore_case || self.fixed_strings) && self.mode != Mode::Regex {
            bail!(
                "--ignore-case and --fixed-strings apply to regex mode only: full-text and \
                 meaning searches take words, whatever their case"
            );
        }
        let pattern = if self.fixed_strings {
            regex::escape(&self.pattern)
        } else {
            self.pattern.clone()
        };
        Ok(if self.ignore_case {
            format!("(?i){pattern}")
        } else {
            pattern
        })
    }
}

fn parse_role(s: &str) -> Result<Role, String> {
    Role::parse(s)
        .ok_or_else(|| format!("unknown role `{s}`: expected system, user, assistant or tool"))
}

fn parse_time(s: &str) -> Result<Timestamp, String> {
    Timestamp::parse(s).map_err(|e| e.to_string())
}

/// A session given as `ses_N` or as its key.
pub fn resolve_session(data: &DataDir, given: &str) -> Result<SessionId> {
    if let Ok(id) = given.parse::<SessionId>() {
        data.store.session(id)?;
        return Ok(id);
    }
    data.store.session_id_for_key(given)?.with_context(|| {
        format!("no session `{given}` (give ses_N or a session key; see `lcm sessions`)")
    })
}

pub fn grep(app: &App, args: &GrepArgs) -> Result<()> {
    let data = app.open_read_only()?;
    let session = args
        .session
        .as_deref()
        .map(|s| resolve_session(&data, s))
        .transpose()?;
    let request = GrepRequest {
        pattern: args.regex_pattern()?,
        mode: args.mode.grep_mode(),
        scope: Scope {
            session,
            roles: args.roles.clone(),
            since: args.since,
            before: args.before,
        },
        limit: args.limit,
        cursor: args.cursor.clone(),
    };
    let page = lcm_search::grep(&data.store, &data.index, &app.config.search, &request)?;
    if app.json {
        return print_json(app, &page);
    }
    if page.hits.is_empty() {
        outln!(app, "no matches")?;
    }
    for hit in &page.hits {
        outln!(
            app,
            "{} {} #{} {} {}",
            hit.message,
            hit.session,
            hit.seq,
            hit.role,
            hit.created_at
        )?;
        outln!(app, "    {}", hit.snippet)?;
    }
    if let Some(cursor) = &page.next_cursor {
        outln!(app, "more: --cursor {cursor}")?;
    }
    if let Some(note) = not_embedded_note(page.not_embedded, request.mode, Unembedded::Messages) {
        outln!(app, "note: {note}")?;
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// `msg_N` or `ses_N`.
    pub id: String,
    /// For a message: print the original payload byte for byte instead.
    #[arg(long)]
    pub original: bool,
}

pub fn show(app: &App, args: &ShowArgs) -> Result<()> {
    let id: AnyId = args.id.parse()?;
    let data = app.open_read_only()?;
    match id {
        AnyId::Message(id) => {
            if args.original {
                let original = data.store.original(id)?;
                app.out.write_bytes(&original.bytes)?;
                app.out.write_bytes(b"\n")?;
                return Ok(());
            }
            let m = data.store.message(id)?;
            if app.json {
                return print_json(app, &m);
            }
            outln!(
                app,
                "{} in {} #{}: {} at {}, {} tokens, from {}",
                m.id,
                m.session,
                m.seq,
                m.role,
                m.created_at,
                m.token_count,
                m.source.as_str()
            )?;
            for part in &m.parts {
                print_part(app, part)?;
            }
            if let Some(files) = data.store.reader()?.message_files(id)? {
                for r in &files.refs {
                    let shown = if r.inline {
                        "in contexts as it is"
                    } else {
                        "in contexts by its reference"
                    };
                    outln!(app, "  part {} is {} ({shown})", r.part, r.file)?;
                }
            }
            Ok(())
        }
        AnyId::Session(id) => {
            let s = data.store.session(id)?;
            if app.json {
                return print_json(app, &s);
            }
            outln!(app, "{} `{}`", s.id, s.key)?;
            outln!(app, "  created      {}", s.created_at)?;
            if let Some(parent) = s.parent {
                outln!(app, "  parent       {parent}")?;
            }
            outln!(app, "  messages     {}", thousands(s.message_count))?;
            outln!(app, "  tokens       {}", thousands(s.token_total))?;
            if let (Some(first), Some(last)) = (s.first_message_at, s.last_message_at) {
                outln!(app, "  time range   {first} .. {last}")?;
            }
            Ok(())
        }
        other => bail!("{other}: only messages (msg_N) and sessions (ses_N) are stored so far"),
    }
}

fn print_part(app: &App, part: &Part) -> Result<()> {
    match part {
        Part::Text { text } => outln!(app, "[text]\n{text}"),
        Part::Reasoning { text } => outln!(app, "[reasoning]\n{text}"),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => outln!(app, "[tool call {id}] {name} {arguments}"),
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => outln!(
            app,
            "[tool result {call_id}{}]\n{content}",
            if *is_error { ", error" } else { "" }
        ),
        Part::File { path, mime_type } => {
            outln!(app, "[file] {path} {}", mime_type.as_deref().unwrap_or(""))
        }
        Part::Binary {
            media_type,
            byte_len,
        } => outln!(app, "[binary] {media_type}, {byte_len} bytes"),
        Part::Opaque { kind, json } => outln!(app, "[{kind}] {json}"),
    }?;
    Ok(())
}

pub fn sessions(app: &App) -> Result<()> {
    let data = app.open_read_only()?;
    let sessions = data.store.sessions()?;
    if app.json {
        return print_json(app, &sessions);
    }
    if sessions.is_empty() {
        outln!(app, "no sessions (import a transcript: lcm import FILE)")?;
    }
    for s in &sessions {
        outln!(
            app,
            "{:<8} {:>8} msgs {:>10} tokens  {}",
            s.id.to_string(),
            thousands(s.message_count),
            thousands(s.token_total),
            s.key
        )?;
    }
    Ok(())
}

pub fn stats(app: &App) -> Result<()> {
    let data = app.open_read_only()?;
    let stats = data.store.stats()?;
    let docs = data.index.num_docs();
    // The vector indexes as their files say (no model is loaded for this).
    let vectors_dir = data.path.join(lcm_search::semantic::VECTORS_DIR);
    let vectors = VectorIndex::summary(&vectors_dir)?;
    let summary_vectors =
        VectorIndex::summary(&vectors_dir.join(lcm_search::semantic::SUMMARIES_DIR))?;
    if app.json {
        return print_json(
            app,
            &serde_json::json!({
                "store": stats,
                "index_documents": docs,
                "vectors": { "messages": vectors, "summaries": summary_vectors },
                "data_dir": app.data_dir,
            }),
        );
    }
    outln!(app, "data dir      {}", app.data_dir.display())?;
    outln!(app, "sessions      {}", thousands(stats.sessions))?;
    outln!(app, "messages      {}", thousands(stats.messages))?;
    outln!(app, "tokens        {}", thousands(stats.tokens))?;
    outln!(
        app,
        "indexed       {} (watermark {})",
        thousands(docs),
        stats.index_watermark
    )?;
    if let Some(v) = &vectors {
        outln!(
            app,
            "embedded      {} chunks (watermark {}; {}; {})",
            thousands(v.entries),
            MessageId(v.watermark),
            match v.lists {
                Some(lists) => format!("{} lists", thousands(lists as u64)),
                None => "no lists yet".to_owned(),
            },
            v.model_id
        )?;
    }
    if let Some(v) = &summary_vectors {
        outln!(
            app,
            "  summaries   {} chunks (watermark {})",
            thousands(v.entries),
            SummaryId(v.watermark)
        )?;
    }
    if let Some(bytes) = stats.file_bytes {
        outln!(
            app,
            "store file    {:.1} MiB",
            bytes as f64 / (1024.0 * 1024.0)
        )?;
    }
    Ok(())
}

pub fn vacuum(app: &App) -> Result<()> {
    let mut data = app.open()?;
    let store = std::sync::Arc::get_mut(&mut data.store)
        .context("the store is in use elsewhere in this process")?;
    let spinner = spinner(app, "vacuuming the store");
    let sizes = store.vacuum();
    spinner.finish_and_clear();
    let (before, _) = sizes?;
    // Closing the store writes its allocator state: measure the file once it is closed.
    let file = data.path.join(lcm_search::data_dir::STORE_FILE);
    drop(data);
    let after = std::fs::metadata(&file)
        .with_context(|| format!("cannot read {}", file.display()))?
        .len();
    if app.json {
        return print_json(
            app,
            &serde_json::json!({ "bytes_before": before, "bytes_after": after }),
        );
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    outln!(
        app,
        "store file {:.1} MiB -> {:.1} MiB ({:.1} MiB freed)",
        mib(before),
        mib(after),
        mib(before.saturating_sub(after))
    )?;
    Ok(())
}

pub fn reindex(app: &App) -> Result<()> {
    // Ctrl-C or SIGTERM stops the rebuild at its next commit, with the store closed cleanly.
    let interrupt = app.interrupt()?;
    let data = app.open()?;
    let total = data.store.next_message_id()?.0;
    let bar = count_bar(app, "reindexing", total);
    let indexed = data.index.rebuild_until(
        &data.store,
        |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        },
        || interrupt.requested(),
    );
    bar.finish_and_clear();
    let indexed = indexed?;
    if indexed < total {
        if app.json {
            print_json(
                app,
                &serde_json::json!({ "indexed": indexed, "interrupted": true }),
            )?;
        }
        return Err(Interrupted(format!(
            "the index covers the first {} of {} messages; grep scans the rest, and the next \
             import, `lcm serve` or `lcm reindex` indexes them",
            thousands(indexed),
            thousands(total)
        ))
        .into());
    }
    // The embeddings, when a model is configured, are rebuilt after the words.
    let mut embedded = None;
    if let Some(semantic) = data.index.semantic() {
        let bar = count_bar(app, "embedding", total);
        let result = semantic.rebuild_until(
            &data.store,
            |done, total| {
                bar.set_length(total);
                bar.set_position(done);
            },
            || interrupt.requested(),
        );
        bar.finish_and_clear();
        let done = result?;
        if done < total {
            if app.json {
                print_json(
                    app,
                    &serde_json::json!({
                        "indexed": indexed, "embedded": done, "interrupted": true
                    }),
                )?;
            }
            return Err(Interrupted(format!(
                "the vector index covers the first {} of {} messages; the next import, \
                 `lcm serve` or `lcm reindex` embeds the rest",
                thousands(done),
                thousands(total)
            ))
            .into());
        }
        embedded = Some(done);
    }
    if app.json {
        return print_json(
            app,
            &match embedded {
                Some(embedded) => serde_json::json!({ "indexed": indexed, "embedded": embedded }),
                None => serde_json::json!({ "indexed": indexed }),
            },
        );
    }
    outln!(app, "reindexed {} messages", thousands(indexed))?;
    if let Some(embedded) = embedded {
        outln!(app, "embedded {} messages", thousands(embedded))?;
    }
    Ok(())
}
