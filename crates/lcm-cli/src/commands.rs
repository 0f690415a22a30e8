//! The commands that work on a data directory.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use lcm_core::formats::Format;
use lcm_core::ids::{AnyId, SessionId};
use lcm_core::message::{Part, Role};
use lcm_core::time::Timestamp;
use lcm_search::{DataDir, GrepRequest, Scope};
use lcm_store::import::{ImportOptions, ImportReport, import_file};

use crate::interrupt::{Interrupt, Interrupted};
use crate::output::{bytes_bar, count_bar, print_json, spinner, thousands};
use crate::{App, Mode};

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Files or folders to import (`-`: standard input); a folder is walked recursively for
    /// `*.jsonl` and `*.json` (a Claude Code project folder with its sessions' `subagents/`
    /// transcripts, which become child sessions of their parent).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The format (claude-code, openai, lcm); detected from the first entry when absent.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<Format>,
    /// Put every message into this session instead of the one the transcript names.
    #[arg(long)]
    pub session: Option<String>,
    /// Abort before writing anything if any line cannot be parsed.
    #[arg(long)]
    pub strict: bool,
}

fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s)
        .ok_or_else(|| format!("unknown format `{s}`: expected claude-code, openai or lcm"))
}

pub fn import(app: &App, args: &ImportArgs) -> Result<()> {
    // Ctrl-C or SIGTERM stops the import after the file in hand, with the store closed cleanly.
    let interrupt = Interrupt::install()?;
    let data = app.open()?;
    let options = ImportOptions {
        format: args.format,
        session_key: args.session.clone(),
        strict: args.strict,
        batch_size: app.config.import.batch_size,
        max_line_bytes: app.config.import.max_line_bytes,
    };
    let paths = transcript_files(&args.paths)?;
    let mut reports = Vec::new();
    for (n, path) in paths.iter().enumerate() {
        if interrupt.requested() {
            return Err(import_interrupted(app, reports, &paths[n..]));
        }
        // `-`: standard input, kept in a temporary file for the importer (which reads a file
        // twice: to detect the format, then to import).
        let stdin_copy = if path.as_os_str() == "-" {
            Some(stdin_to_file(&data.path)?)
        } else {
            None
        };
        let source = stdin_copy
            .as_ref()
            .map_or(path.as_path(), |(_, p)| p.as_path());
        let size = std::fs::metadata(source)
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        let name = path
            .file_name()
            .map_or_else(|| "stdin".to_owned(), |n| n.to_string_lossy().into_owned());
        let bar = bytes_bar(app.quiet, &name, size);
        let report = import_file(&data.store, source, &options, |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        let mut report = report?;
        report.path = path.clone();
        // The index's threads tokenise this file while the next one is parsed.
        data.index.feed(&data.store)?;
        if !app.json {
            print_import_report(&report);
        }
        reports.push(report);
    }
    if interrupt.requested() {
        return Err(import_interrupted(app, reports, &[]));
    }
    let indexed = catch_up_index(app, &data)?;
    if app.json {
        print_json(&serde_json::json!({ "imports": reports, "indexed": indexed }))?;
    } else if indexed > 0 {
        println!("indexed {} new messages", thousands(indexed));
    }
    Ok(())
}

/// Standard input copied to the file `stdin` (so messages without a session of their own go to
/// the session `stdin`, at every import alike) in a temporary folder of the data directory,
/// deleted with the returned guard.
fn stdin_to_file(dir: &std::path::Path) -> Result<(tempfile::TempDir, PathBuf)> {
    let folder = tempfile::Builder::new()
        .prefix(".import-stdin-")
        .tempdir_in(dir)
        .with_context(|| format!("cannot create a temporary folder in {}", dir.display()))?;
    let path = folder.path().join("stdin");
    let mut file = std::fs::File::create(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    std::io::copy(&mut std::io::stdin().lock(), &mut file).context("reading standard input")?;
    Ok((folder, path))
}

/// The files to import: each path as given (`-` for standard input), a folder replaced by the `*.jsonl` and `*.json`
/// files under it (recursively, in path order, hidden entries skipped). A folder without any is
/// an error naming it.
fn transcript_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) -> Result<()> {
        let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read the folder {}", dir.display()))?
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("cannot read the folder {}", dir.display()))?;
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let kind = entry
                .file_type()
                .with_context(|| format!("cannot read {}", path.display()))?;
            if kind.is_dir() {
                walk(&path, out)?;
            } else if path
                .extension()
                .is_some_and(|e| e == "jsonl" || e == "json")
            {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let before = files.len();
            walk(path, &mut files)?;
            if files.len() == before {
                anyhow::bail!(
                    "no transcripts (*.jsonl, *.json) in the folder {}",
                    path.display()
                );
            }
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// The error of an import stopped by a signal: every file in `reports` is stored whole, those
/// of `not_imported` were not started. With `--json` the reports still go to stdout. The index
/// is left to catch up later (the next import, `lcm reindex` or the daemon); grep scans the
/// messages it has not indexed, so they are found meanwhile.
fn import_interrupted(
    app: &App,
    reports: Vec<ImportReport>,
    not_imported: &[PathBuf],
) -> anyhow::Error {
    if app.json {
        let printed = print_json(&serde_json::json!({
            "imports": reports,
            "interrupted": true,
            "not_imported": not_imported,
        }));
        if let Err(e) = printed {
            return e;
        }
    }
    let rest = match not_imported.len() {
        0 => "; the index catches up at the next import or `lcm reindex`".to_owned(),
        1 => " and did not start 1 file; the same command imports it \
              (what is stored already is skipped)"
            .to_owned(),
        n => format!(
            " and did not start {n} files; the same command imports them \
             (what is stored already is skipped)"
        ),
    };
    Interrupted(format!("imported {} file(s) whole{rest}", reports.len())).into()
}

fn print_import_report(r: &ImportReport) {
    println!(
        "{}: {} new messages, {} already present, {} lines ({})",
        r.path.display(),
        thousands(r.imported),
        thousands(r.already_present),
        thousands(r.lines),
        r.format.map_or("?", Format::as_str),
    );
    for s in &r.sessions {
        println!(
            "  {} {}: {} new, {} already present",
            s.id, s.key, s.imported, s.already_present
        );
    }
    for (reason, count) in &r.skipped {
        println!("  skipped {count}: {reason}");
    }
    if r.error_count > 0 {
        println!("  {} lines could not be read:", r.error_count);
        for e in &r.errors {
            println!("    {e}");
        }
        if r.error_count as usize > r.errors.len() {
            println!("    … and {} more", r.error_count as usize - r.errors.len());
        }
    }
}

/// Brings the index up to date with the store, with a progress bar, and then the embeddings
/// when a model is configured (Ctrl-C stops those after their current batch; the next import,
/// `lcm reindex` or `lcm serve` goes on from there).
pub fn catch_up_index(app: &App, data: &DataDir) -> Result<u64> {
    let pending = data.store.next_message_id()?.0 - data.index.watermark().0;
    let mut indexed = 0;
    if pending > 0 {
        let bar = count_bar(app.quiet, "indexing", pending);
        let result = data.index.catch_up(&data.store, |done, total| {
            bar.set_length(total);
            bar.set_position(done);
        });
        bar.finish_and_clear();
        indexed = result?;
    }
    if let Some(semantic) = data.index.semantic() {
        let interrupt = Interrupt::install()?;
        let behind = data.store.next_message_id()?.0 - semantic.watermark()?.0;
        if behind > 0 {
            let bar = count_bar(app.quiet, "embedding", behind);
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
        pattern: args.pattern.clone(),
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
        return print_json(&page);
    }
    if page.hits.is_empty() {
        println!("no matches");
    }
    for hit in &page.hits {
        println!(
            "{} {} #{} {} {}",
            hit.message, hit.session, hit.seq, hit.role, hit.created_at
        );
        println!("    {}", hit.snippet);
    }
    if let Some(cursor) = &page.next_cursor {
        println!("more: --cursor {cursor}");
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
                use std::io::Write;
                let original = data.store.original(id)?;
                let mut out = std::io::stdout().lock();
                out.write_all(&original.bytes)?;
                out.write_all(b"\n")?;
                return Ok(());
            }
            let m = data.store.message(id)?;
            if app.json {
                return print_json(&m);
            }
            println!(
                "{} in {} #{}: {} at {}, {} tokens, from {}",
                m.id,
                m.session,
                m.seq,
                m.role,
                m.created_at,
                m.token_count,
                m.source.as_str()
            );
            for part in &m.parts {
                print_part(part);
            }
            if let Some(files) = data.store.reader()?.message_files(id)? {
                for r in &files.refs {
                    let shown = if r.inline {
                        "in contexts as it is"
                    } else {
                        "in contexts by its reference"
                    };
                    println!("  part {} is {} ({shown})", r.part, r.file);
                }
            }
            Ok(())
        }
        AnyId::Session(id) => {
            let s = data.store.session(id)?;
            if app.json {
                return print_json(&s);
            }
            println!("{} `{}`", s.id, s.key);
            println!("  created      {}", s.created_at);
            if let Some(parent) = s.parent {
                println!("  parent       {parent}");
            }
            println!("  messages     {}", thousands(s.message_count));
            println!("  tokens       {}", thousands(s.token_total));
            if let (Some(first), Some(last)) = (s.first_message_at, s.last_message_at) {
                println!("  time range   {first} .. {last}");
            }
            Ok(())
        }
        other => bail!("{other}: only messages (msg_N) and sessions (ses_N) are stored so far"),
    }
}

fn print_part(part: &Part) {
    match part {
        Part::Text { text } => println!("[text]\n{text}"),
        Part::Reasoning { text } => println!("[reasoning]\n{text}"),
        Part::ToolCall {
            id,
            name,
            arguments,
        } => println!("[tool call {id}] {name} {arguments}"),
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => println!(
            "[tool result {call_id}{}]\n{content}",
            if *is_error { ", error" } else { "" }
        ),
        Part::File { path, mime_type } => {
            println!("[file] {path} {}", mime_type.as_deref().unwrap_or(""))
        }
        Part::Binary {
            media_type,
            byte_len,
        } => println!("[binary] {media_type}, {byte_len} bytes"),
        Part::Opaque { kind, json } => println!("[{kind}] {json}"),
    }
}

pub fn sessions(app: &App) -> Result<()> {
    let data = app.open_read_only()?;
    let sessions = data.store.sessions()?;
    if app.json {
        return print_json(&sessions);
    }
    if sessions.is_empty() {
        println!("no sessions (import a transcript: lcm import FILE)");
    }
    for s in &sessions {
        println!(
            "{:<8} {:>8} msgs {:>10} tokens  {}",
            s.id.to_string(),
            thousands(s.message_count),
            thousands(s.token_total),
            s.key
        );
    }
    Ok(())
}

pub fn stats(app: &App) -> Result<()> {
    let data = app.open_read_only()?;
    let stats = data.store.stats()?;
    let docs = data.index.num_docs();
    if app.json {
        return print_json(
            &serde_json::json!({ "store": stats, "index_documents": docs, "data_dir": data.path }),
        );
    }
    println!("data dir      {}", data.path.display());
    println!("sessions      {}", thousands(stats.sessions));
    println!("messages      {}", thousands(stats.messages));
    println!("tokens        {}", thousands(stats.tokens));
    println!(
        "indexed       {} (watermark {})",
        thousands(docs),
        stats.index_watermark
    );
    if let Some(bytes) = stats.file_bytes {
        println!("store file    {:.1} MiB", bytes as f64 / (1024.0 * 1024.0));
    }
    Ok(())
}

pub fn vacuum(app: &App) -> Result<()> {
    let mut data = app.open()?;
    let spinner = spinner(app.quiet, "vacuuming the store");
    let sizes = data.store.vacuum();
    spinner.finish_and_clear();
    let (before, _) = sizes?;
    // Closing the store writes its allocator state: measure the file once it is closed.
    let file = data.path.join(lcm_search::data_dir::STORE_FILE);
    drop(data);
    let after = std::fs::metadata(&file)
        .with_context(|| format!("cannot read {}", file.display()))?
        .len();
    if app.json {
        return print_json(&serde_json::json!({ "bytes_before": before, "bytes_after": after }));
    }
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "store file {:.1} MiB -> {:.1} MiB ({:.1} MiB freed)",
        mib(before),
        mib(after),
        mib(before.saturating_sub(after))
    );
    Ok(())
}

pub fn reindex(app: &App) -> Result<()> {
    // Ctrl-C or SIGTERM stops the rebuild at its next commit, with the store closed cleanly.
    let interrupt = Interrupt::install()?;
    let data = app.open()?;
    let total = data.store.next_message_id()?.0;
    let bar = count_bar(app.quiet, "reindexing", total);
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
            print_json(&serde_json::json!({ "indexed": indexed, "interrupted": true }))?;
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
        let bar = count_bar(app.quiet, "embedding", total);
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
                print_json(&serde_json::json!({
                    "indexed": indexed, "embedded": done, "interrupted": true
                }))?;
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
        return print_json(&match embedded {
            Some(embedded) => serde_json::json!({ "indexed": indexed, "embedded": embedded }),
            None => serde_json::json!({ "indexed": indexed }),
        });
    }
    println!("reindexed {} messages", thousands(indexed));
    if let Some(embedded) = embedded {
        println!("embedded {} messages", thousands(embedded));
    }
    Ok(())
}
