//! `lcm import`: transcript files, folders of them, globs and standard input, into the store.
//!
//! The paths given are listed first (folders walked, globs expanded), so one progress bar runs
//! over the bytes of the whole set. Each file is imported on its own: a file that cannot be read
//! or is not a transcript is reported on its line and the others are imported; the command then
//! fails, saying how many were not. `--follow` keeps watching (see [`crate::follow`]).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use lcm_core::formats::Format;
use lcm_store::import::{FilePosition, ImportOptions, ImportReport, import_file, import_file_from};
use serde::Serialize;

use crate::App;
use crate::commands::catch_up_index;
use crate::follow::{Tracked, canonical};
use crate::interrupt::Interrupted;
use crate::output::{bytes_bar, outln, print_json, thousands};

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Files, folders or globs to import (`-`: standard input). A folder is walked recursively
    /// for `*.jsonl` and `*.json` (a Claude Code project folder with its sessions' `subagents/`
    /// transcripts, which become child sessions of their parent); a quoted glob such as
    /// `'~/logs/*.jsonl'` is expanded by lcm.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The format (claude-code, openai, lcm); detected from the first entry when absent.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<Format>,
    /// Put every message into this session instead of the one the transcript names.
    #[arg(long)]
    pub session: Option<String>,
    /// Abort before writing anything if any line of a file cannot be parsed.
    #[arg(long)]
    pub strict: bool,
    /// After importing, keep watching the paths (folders) and import new transcripts and
    /// appended lines as they are written, until Ctrl-C.
    #[arg(long)]
    pub follow: bool,
}

fn parse_format(s: &str) -> Result<Format, String> {
    Format::parse(s)
        .ok_or_else(|| format!("unknown format `{s}`: expected claude-code, openai or lcm"))
}

/// The import options `args` and the configuration ask for.
pub(crate) fn import_options(app: &App, args: &ImportArgs) -> ImportOptions {
    ImportOptions {
        format: args.format,
        session_key: args.session.clone(),
        strict: args.strict,
        batch_size: app.config.import.batch_size,
        max_line_bytes: app.config.import.max_line_bytes,
    }
}

/// One file to import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Source {
    /// The path as reports show it: as given, or under the folder as given.
    pub shown: PathBuf,
    /// The path read (`None`: standard input).
    pub read: Option<PathBuf>,
}

/// A path that could not be imported, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct NotImported {
    pub path: PathBuf,
    pub error: String,
}

/// What the paths given name.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub files: Vec<Source>,
    /// Entries met while walking folders that cannot be imported (unreadable, symlink loops).
    pub problems: Vec<NotImported>,
}

/// Totals over every file of an import.
#[derive(Debug, Default, Serialize)]
struct Totals {
    files: u64,
    imported: u64,
    already_present: u64,
    lines: u64,
    not_imported: u64,
}

pub fn import(app: &App, args: &ImportArgs) -> Result<()> {
    // Ctrl-C or SIGTERM stops the import after the file in hand, with the store closed cleanly.
    let interrupt = app.interrupt()?;
    let data = app.open()?;
    let options = import_options(app, args);
    let listing = list(app, &args.paths, args.follow)?;
    let roots = if args.follow {
        crate::follow::roots(app, &args.paths, &listing)?
    } else {
        Vec::new()
    };
    let mut followed = HashMap::new();
    // `-`: standard input, kept in a temporary file for the importer (which reads a file twice:
    // to detect the format, then to import). Through a daemon the CLI made that file.
    let mut stdin_copy = None;
    let mut reads: Vec<(PathBuf, u64)> = Vec::with_capacity(listing.files.len());
    for source in &listing.files {
        let read = match (&source.read, &app.stdin_file) {
            (Some(path), _) | (None, Some(path)) => path.clone(),
            (None, None) => {
                let (folder, path) = stdin_to_file(&data.path)?;
                stdin_copy = Some(folder);
                path
            }
        };
        let size = std::fs::metadata(&read).map_or(0, |m| m.len());
        reads.push((read, size));
    }
    let total_bytes: u64 = reads.iter().map(|(_, size)| size).sum();
    let bar = bytes_bar(app, "importing", total_bytes);
    let mut reports: Vec<ImportReport> = Vec::new();
    let mut not_imported = listing.problems.clone();
    for problem in &listing.problems {
        if !app.json {
            outln!(
                app,
                "{}: not imported: {}",
                problem.path.display(),
                problem.error
            )?;
        }
    }
    let mut done_bytes = 0u64;
    for (n, (source, (read, size))) in listing.files.iter().zip(&reads).enumerate() {
        if interrupt.requested() {
            bar.finish_and_clear();
            let rest: Vec<PathBuf> = listing.files[n..].iter().map(|s| s.shown.clone()).collect();
            return Err(import_interrupted(app, reports, &rest));
        }
        bar.set_message(file_name(&source.shown));
        let progress = |done: u64, _| bar.set_position(done_bytes + done.min(*size));
        let result = if args.follow {
            // Complete lines only, and where the read stopped, to go on from there.
            import_file_from(
                &data.store,
                read,
                &options,
                FilePosition::default(),
                progress,
            )
            .map(|(report, at)| {
                followed.insert(canonical(read), Tracked::new(read, at));
                report
            })
        } else {
            import_file(&data.store, read, &options, progress)
        };
        done_bytes += size;
        bar.set_position(done_bytes);
        match result {
            Ok(mut report) => {
                report.path = source.shown.clone();
                // The index's threads tokenise this file while the next one is parsed.
                data.index.feed(&data.store)?;
                if !app.json {
                    print_import_report(app, &report)?;
                }
                reports.push(report);
            }
            Err(error) if args.strict => {
                bar.finish_and_clear();
                return Err(error.into());
            }
            Err(error) => {
                let problem = NotImported {
                    path: source.shown.clone(),
                    error: crate::report(&error.into()),
                };
                if !app.json {
                    outln!(
                        app,
                        "{}: not imported: {}",
                        problem.path.display(),
                        problem.error
                    )?;
                }
                not_imported.push(problem);
            }
        }
    }
    bar.finish_and_clear();
    drop(stdin_copy);
    if interrupt.requested() {
        return Err(import_interrupted(app, reports, &[]));
    }
    let totals = Totals {
        files: reports.len() as u64,
        imported: reports.iter().map(|r| r.imported).sum(),
        already_present: reports.iter().map(|r| r.already_present).sum(),
        lines: reports.iter().map(|r| r.lines).sum(),
        not_imported: not_imported.len() as u64,
    };
    let indexed = catch_up_index(app, &data)?;
    if app.json {
        print_json(
            app,
            &serde_json::json!({
                "imports": reports,
                "not_imported": not_imported,
                "total": totals,
                "indexed": indexed,
            }),
        )?;
    } else {
        if reports.len() + not_imported.len() > 1 {
            outln!(
                app,
                "total: {} files, {} new messages, {} already present, {} lines{}",
                thousands(totals.files),
                thousands(totals.imported),
                thousands(totals.already_present),
                thousands(totals.lines),
                if totals.not_imported > 0 {
                    format!("; {} not imported", thousands(totals.not_imported))
                } else {
                    String::new()
                }
            )?;
        }
        if indexed > 0 {
            outln!(app, "indexed {} new messages", thousands(indexed))?;
        }
    }
    if args.follow {
        // Following holds the data directory for long: the CLI's other commands run through
        // this process meanwhile, as through a daemon.
        let _control = if app.in_a_daemon() {
            None
        } else {
            Some(crate::control::Control::start(
                data.clone(),
                app.config.clone(),
                "lcm import --follow",
            )?)
        };
        // Files that could not be imported are tried again when they change.
        return crate::follow::follow(app, &data, &options, &roots, followed);
    }
    if !not_imported.is_empty() {
        bail!(
            "{} of {} files could not be imported (each is named above); the others were",
            not_imported.len(),
            not_imported.len() + reports.len()
        );
    }
    Ok(())
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| "stdin".to_owned(), |n| n.to_string_lossy().into_owned())
}

/// Standard input copied to the file `stdin` (so messages without a session of their own go to
/// the session `stdin`, at every import alike) in a temporary folder of the data directory,
/// deleted with the returned guard.
pub(crate) fn stdin_to_file(dir: &Path) -> Result<(tempfile::TempDir, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
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

/// Whether `path` is a transcript by its name: `*.jsonl` or `*.json`.
pub(crate) fn is_transcript_name(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e == "jsonl" || e == "json")
}

/// Whether a file name is hidden (`.name`), which folder walks skip.
fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.to_string_lossy().starts_with('.')
}

/// The files the paths given name: each file as given (`-` for standard input), a folder
/// replaced by the `*.jsonl` and `*.json` files under it (recursively, in path order, hidden
/// entries skipped, symbolic links followed once), a glob the shell did not expand replaced by
/// what it matches. A path that does not exist, a glob that matches nothing and a folder without
/// transcripts are errors that stop the command before anything is imported (with `follow`,
/// an empty folder or glob is fine: its transcripts are awaited); entries inside folders that
/// cannot be read are listed as problems and the rest goes on.
pub(crate) fn list(app: &App, given: &[PathBuf], follow: bool) -> Result<Listing> {
    let mut listing = Listing::default();
    let mut walked = HashSet::new();
    for path in given {
        if path.as_os_str() == "-" {
            if listing.files.iter().any(|f| f.read.is_none()) {
                bail!("`-` (standard input) is given twice");
            }
            listing.files.push(Source {
                shown: path.clone(),
                read: None,
            });
            continue;
        }
        let resolved = app.cwd.join(path);
        if std::fs::symlink_metadata(&resolved).is_err() && is_glob(path) {
            let pattern = resolved.to_string_lossy().into_owned();
            let matches: Vec<PathBuf> = glob::glob(&pattern)
                .with_context(|| format!("{} is not a valid glob", path.display()))?
                .filter_map(Result::ok)
                .collect();
            if matches.is_empty() && !follow {
                bail!("nothing matches {}", path.display());
            }
            for found in matches {
                let shown = shown_under(app, path, &found);
                add(&mut listing, &mut walked, &shown, &found, !follow)?;
            }
            continue;
        }
        add(&mut listing, &mut walked, path, &resolved, !follow)?;
    }
    Ok(listing)
}

/// `found` as reports show it: relative when the glob given was.
fn shown_under(app: &App, given: &Path, found: &Path) -> PathBuf {
    if given.is_relative() {
        found.strip_prefix(&app.cwd).unwrap_or(found).to_path_buf()
    } else {
        found.to_path_buf()
    }
}

/// Whether a path given has glob wildcards (`*`, `?`, `[`).
pub(crate) fn is_glob(path: &Path) -> bool {
    path.to_string_lossy().contains(['*', '?', '['])
}

/// Adds the file or folder at `resolved` (shown as `shown`); a folder without transcripts is
/// an error when `must_hold`.
fn add(
    listing: &mut Listing,
    walked: &mut HashSet<PathBuf>,
    shown: &Path,
    resolved: &Path,
    must_hold: bool,
) -> Result<()> {
    let metadata =
        std::fs::metadata(resolved).with_context(|| format!("cannot read {}", shown.display()))?;
    if metadata.is_dir() {
        let before = listing.files.len() + listing.problems.len();
        walk(listing, walked, shown, resolved)?;
        if must_hold && listing.files.len() + listing.problems.len() == before {
            bail!(
                "no transcripts (*.jsonl, *.json) in the folder {}",
                shown.display()
            );
        }
    } else {
        listing.files.push(Source {
            shown: shown.to_path_buf(),
            read: Some(resolved.to_path_buf()),
        });
    }
    Ok(())
}

fn walk(
    listing: &mut Listing,
    walked: &mut HashSet<PathBuf>,
    shown: &Path,
    dir: &Path,
) -> Result<()> {
    let problem = |listing: &mut Listing, path: &Path, error: String| {
        listing.problems.push(NotImported {
            path: path.to_path_buf(),
            error,
        });
    };
    // A folder reached twice (a symbolic link to a folder above it, or to one walked already)
    // is walked once.
    let canonical = canonical(dir);
    if !walked.insert(canonical.clone()) {
        problem(
            listing,
            shown,
            format!(
                "a symbolic link loop: it leads to {}, which is walked already",
                canonical.display()
            ),
        );
        return Ok(());
    }
    let entries = match std::fs::read_dir(dir).and_then(|d| d.collect::<std::io::Result<Vec<_>>>())
    {
        Ok(entries) => entries,
        Err(error) => {
            problem(listing, shown, format!("cannot read the folder: {error}"));
            return Ok(());
        }
    };
    let mut entries: Vec<std::fs::DirEntry> = entries;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        if is_hidden(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        let shown = shown.join(entry.file_name());
        // Follows symbolic links: a link to a folder is walked, a dangling or looping one is a
        // problem of its own.
        let metadata = match std::fs::metadata(&path) {
            Ok(metadata) => metadata,
            Err(error) => {
                if is_transcript_name(&path) || entry.file_type().is_ok_and(|t| t.is_symlink()) {
                    problem(listing, &shown, format!("cannot read: {error}"));
                }
                continue;
            }
        };
        if metadata.is_dir() {
            walk(listing, walked, &shown, &path)?;
        } else if is_transcript_name(&path) {
            listing.files.push(Source {
                shown,
                read: Some(path),
            });
        }
    }
    Ok(())
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
        let printed = print_json(
            app,
            &serde_json::json!({
                "imports": reports,
                "interrupted": true,
                "not_started": not_imported,
            }),
        );
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

/// The lines of one file's report.
pub(crate) fn print_import_report(app: &App, r: &ImportReport) -> Result<()> {
    outln!(
        app,
        "{}: {} new messages, {} already present, {} lines ({})",
        r.path.display(),
        thousands(r.imported),
        thousands(r.already_present),
        thousands(r.lines),
        r.format.map_or("?", Format::as_str),
    )?;
    for s in &r.sessions {
        outln!(
            app,
            "  {} {}: {} new, {} already present",
            s.id,
            s.key,
            s.imported,
            s.already_present
        )?;
    }
    for (reason, count) in &r.skipped {
        outln!(app, "  skipped {count}: {reason}")?;
    }
    if r.error_count > 0 {
        outln!(app, "  {} lines could not be read:", r.error_count)?;
        for e in &r.errors {
            outln!(app, "    {e}")?;
        }
        if r.error_count as usize > r.errors.len() {
            outln!(
                app,
                "    … and {} more",
                r.error_count as usize - r.errors.len()
            )?;
        }
    }
    Ok(())
}
