//! The output of a map: one JSONL line per item in input order, written atomically, and the
//! compact summary a tool returns instead of the output itself.
//!
//! Each line is `{"index": i, "line": n, "ok": true, "result": <JSON>, "attempts": a}` or
//! `{"index": i, "line": n, "ok": false, "error": "...", "attempts": a}`: `index` counts items
//! from 0 in input order, `line` is the item's 1-based line in the input file (they differ when
//! the input has blank lines), `attempts` is how many attempts the item took. Items a cancelled
//! or failed job never finished are `ok: false` with an error saying so.
//!
//! The file is written to a temporary file in the same directory, synced, then renamed over the
//! output path, so a reader sees the old file or the whole new one, never a part.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use lcm_core::ids::JobId;
use lcm_store::{ItemState, JobStatus, MapJob, Store};
use serde::Serialize;
use serde_json::value::RawValue;

use super::MapError;

/// Results quoted in a summary.
pub const SUMMARY_EXAMPLES: usize = 3;
/// Failures listed in a summary.
pub const SUMMARY_FAILURES: usize = 10;
/// Characters kept of each quoted result or error.
const QUOTE_CHARS: usize = 300;

/// A result quoted in a summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExampleResult {
    /// The item's index.
    pub index: u64,
    /// Its result, JSON text (cut at 300 characters, marked with `...`).
    pub result: String,
}

/// A failure listed in a summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemError {
    /// The item's index.
    pub index: u64,
    /// Its line in the input file.
    pub line: u64,
    /// Why it failed (cut at 300 characters).
    pub error: String,
}

/// What a map did, small enough for a model's context: counts, where the output is, a few
/// results and the first failures. Never the output itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapSummary {
    /// The job.
    pub job: JobId,
    /// Its status when the output was written.
    pub status: JobStatus,
    /// Items in the input.
    pub total: u64,
    /// Items with a result.
    pub completed: u64,
    /// Items that failed.
    pub failed: u64,
    /// Items never finished (the job was cancelled or failed, or is still running).
    pub not_run: u64,
    /// The output file.
    pub output_path: PathBuf,
    /// The first few results.
    pub examples: Vec<ExampleResult>,
    /// The first failures.
    pub failures: Vec<ItemError>,
}

impl std::fmt::Display for MapSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {} items, {} completed, {} failed",
            self.job, self.status, self.total, self.completed, self.failed
        )?;
        if self.not_run > 0 {
            write!(f, ", {} not run", self.not_run)?;
        }
        writeln!(f, "; output: {}", self.output_path.display())?;
        for example in &self.examples {
            writeln!(f, "  item {}: {}", example.index, example.result)?;
        }
        if !self.failures.is_empty() {
            writeln!(f, "failures:")?;
            for failure in &self.failures {
                writeln!(
                    f,
                    "  item {} (line {}): {}",
                    failure.index, failure.line, failure.error
                )?;
            }
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct OutputLine<'a> {
    index: u64,
    line: u64,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    attempts: u32,
}

fn quote(text: &str) -> String {
    match text.char_indices().nth(QUOTE_CHARS) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

fn not_run_reason(job: &MapJob) -> String {
    match job.status {
        JobStatus::Cancelled => "not run: the job was cancelled before this item finished".into(),
        JobStatus::Failed => format!(
            "not run: the job failed ({})",
            job.error.as_deref().unwrap_or("no reason recorded")
        ),
        _ => "not finished yet: the job is still running".into(),
    }
}

/// Writes the output of `job` to `path` (see the module documentation) and returns its
/// summary. Blocking (redb reads, file I/O): call it from a blocking context.
pub fn write_output(store: &Store, job: JobId, path: &Path) -> Result<MapSummary, MapError> {
    let record = store.job(job)?;
    let temp = temp_path(path)?;
    let result = write_to(store, &record, &temp, path);
    match result {
        Ok(summary) => {
            if let Err(source) = std::fs::rename(&temp, path) {
                let _ = std::fs::remove_file(&temp);
                return Err(MapError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
            sync_dir(path);
            Ok(summary)
        }
        Err(error) => {
            let _ = std::fs::remove_file(&temp);
            Err(error)
        }
    }
}

fn temp_path(path: &Path) -> Result<PathBuf, MapError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| MapError::Path {
        path: path.to_path_buf(),
        reason: "does not end in a file name".into(),
    })?;
    Ok(path.with_file_name(format!(
        ".{}.{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )))
}

/// Makes the rename durable (best effort: not every platform can sync a directory).
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(dir) = File::open(dir)
    {
        let _ = dir.sync_all();
    }
}

fn write_to(store: &Store, job: &MapJob, temp: &Path, path: &Path) -> Result<MapSummary, MapError> {
    let io = |source| MapError::Io {
        path: temp.to_path_buf(),
        source,
    };
    let file = File::create(temp).map_err(io)?;
    let mut out = BufWriter::with_capacity(256 * 1024, file);
    let mut summary = MapSummary {
        job: job.id,
        status: job.status,
        total: 0,
        completed: 0,
        failed: 0,
        not_run: 0,
        output_path: path.to_path_buf(),
        examples: Vec::new(),
        failures: Vec::new(),
    };
    let not_run = not_run_reason(job);
    for item in store.items_in_order(job.id)? {
        let item = item?;
        summary.total += 1;
        let (ok, result, error): (bool, Option<&RawValue>, Option<&str>) = match &item.state {
            ItemState::Completed { result } => {
                let raw: &RawValue = serde_json::from_str(result).map_err(|e| {
                    MapError::Store(lcm_store::StoreError::Corrupt {
                        table: "map_items",
                        detail: format!(
                            "the result of item {} of {} is not JSON: {e}",
                            item.index, job.id
                        ),
                    })
                })?;
                summary.completed += 1;
                if summary.examples.len() < SUMMARY_EXAMPLES {
                    summary.examples.push(ExampleResult {
                        index: item.index,
                        result: quote(raw.get()),
                    });
                }
                (true, Some(raw), None)
            }
            ItemState::Failed { error } => {
                summary.failed += 1;
                if summary.failures.len() < SUMMARY_FAILURES {
                    summary.failures.push(ItemError {
                        index: item.index,
                        line: item.line,
                        error: quote(error),
                    });
                }
                (false, None, Some(error.as_str()))
            }
            ItemState::Pending | ItemState::Running { .. } => {
                summary.not_run += 1;
                (false, None, Some(not_run.as_str()))
            }
        };
        let line = OutputLine {
            index: item.index,
            line: item.line,
            ok,
            result,
            error,
            attempts: item.attempts,
        };
        serde_json::to_writer(&mut out, &line).map_err(|e| io(e.into()))?;
        out.write_all(b"\n").map_err(io)?;
    }
    let file = out.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    Ok(summary)
}
