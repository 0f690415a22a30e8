//! Importing transcripts into the store.
//!
//! Files are streamed line by line (never loaded whole, except a JSON document in OpenAI's array
//! form, which is one value) and appended in batches of `batch_size` messages, one transaction
//! each. Import is idempotent: every message carries a source key stable across re-imports, and
//! the store skips keys it already holds, so importing the same file twice adds nothing.
//!
//! Lines that are not conversation messages (progress events, snapshots) are skipped and counted
//! by reason. Lines that cannot be parsed (invalid UTF-8, malformed JSON, wrong shape) are
//! reported with their line numbers; in strict mode any such line aborts the import before
//! anything is written.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use lcm_core::formats::{self, Format, LineContext, LineOutcome, ParseError, ParsedMessage};
use lcm_core::ids::SessionId;
use lcm_core::message::NewMessage;
use serde::Serialize;

use crate::error::StoreError;
use crate::pipeline::OrderedPipeline;
use crate::store::Store;

/// How many parse errors a report lists in full (all are counted).
const MAX_LISTED_ERRORS: usize = 50;

/// Why an import failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot tell the format of {path}: its first entry is not a Claude Code, OpenAI or lcm message (pass the format explicitly)"
    )]
    UnknownFormat { path: PathBuf },
    #[error("{path} is empty: nothing to import")]
    Empty { path: PathBuf },
    #[error("{path}: {error} (strict mode: nothing was imported)")]
    Strict { path: PathBuf, error: ParseError },
    #[error("{path}: {error}")]
    Document { path: PathBuf, error: ParseError },
    #[error(
        "{path}: line {line} is longer than import.max_line_bytes ({max} bytes): it was not read into memory and nothing was imported"
    )]
    LineTooLong {
        path: PathBuf,
        line: u64,
        max: usize,
    },
    #[error(
        "{path} is one JSON document of {bytes} bytes, more than import.max_line_bytes ({max}): nothing was imported"
    )]
    DocumentTooLarge {
        path: PathBuf,
        bytes: u64,
        max: usize,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Options of one import.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The format, or `None` to detect it from the first entry.
    pub format: Option<Format>,
    /// Puts every message into this session instead of the one the transcript names.
    pub session_key: Option<String>,
    /// Abort before writing anything if any line cannot be parsed.
    pub strict: bool,
    /// Messages per transaction.
    pub batch_size: usize,
    /// Longest line (or JSON document) read: a longer one is never held in memory; it is
    /// passed over in small reads and reported as a bad line (strict mode: nothing imported).
    pub max_line_bytes: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        let config = lcm_core::config::ImportConfig::default();
        ImportOptions {
            format: None,
            session_key: None,
            strict: false,
            batch_size: config.batch_size,
            max_line_bytes: config.max_line_bytes,
        }
    }
}

/// What an import did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImportReport {
    pub path: PathBuf,
    pub format: Option<Format>,
    pub bytes: u64,
    pub lines: u64,
    /// Messages newly stored.
    pub imported: u64,
    /// Messages already in the store from an earlier import (not stored again).
    pub already_present: u64,
    /// Valid entries that are not messages, by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Lines that could not be parsed.
    pub error_count: u64,
    /// The first of those errors, in full.
    pub errors: Vec<String>,
    /// Per session: its id, key and the messages newly stored in it.
    pub sessions: Vec<ImportedSession>,
}

/// One session touched by an import.
#[derive(Debug, Clone, Serialize)]
pub struct ImportedSession {
    pub id: SessionId,
    pub key: String,
    pub imported: u64,
    pub already_present: u64,
}

/// How far a file has been imported: the byte offset just after the last line read, that
/// line's number, and the format found. A file that grows (a live transcript) is imported on
/// from there with [`import_file_from`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilePosition {
    pub offset: u64,
    pub line: u64,
    pub format: Option<Format>,
}

/// Imports one file. `progress` is called with (bytes read, file size).
pub fn import_file(
    store: &Store,
    path: &Path,
    options: &ImportOptions,
    progress: impl FnMut(u64, u64),
) -> Result<ImportReport, ImportError> {
    import_range(
        store,
        path,
        options,
        FilePosition::default(),
        false,
        progress,
    )
    .map(|(r, _)| r)
}

/// Imports the complete lines of `path` after `from` (the position an earlier call returned, or
/// the start), and returns where it stopped: after the last line that ends with a newline. A
/// last line still being written is left for the next call, so a transcript can be followed
/// while its writer appends to it. Line numbers go on from `from`, so the messages' source keys
/// are those a whole-file import gives them (importing on never duplicates a message).
/// An OpenAI messages document (one JSON value) is imported whole once it parses.
pub fn import_file_from(
    store: &Store,
    path: &Path,
    options: &ImportOptions,
    from: FilePosition,
    progress: impl FnMut(u64, u64),
) -> Result<(ImportReport, FilePosition), ImportError> {
    import_range(store, path, options, from, true, progress)
}

fn import_range(
    store: &Store,
    path: &Path,
    options: &ImportOptions,
    from: FilePosition,
    complete_only: bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<(ImportReport, FilePosition), ImportError> {
    let io = |source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    let reading = Reading {
        from,
        complete_only,
        max_line: options.max_line_bytes,
    };
    let default_key = options.session_key.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "import".to_owned(), |s| s.to_string_lossy().into_owned())
    });
    let max_line = options.max_line_bytes;
    let (format, document) = match from.format {
        Some(format) if from.offset > 0 => (format, false),
        _ => match sniff(path, options.format, &reading)? {
            Some(found) => found,
            // Nothing complete to read yet.
            None if complete_only => {
                return Ok((
                    ImportReport {
                        path: path.to_path_buf(),
                        bytes: size,
                        ..ImportReport::default()
                    },
                    from,
                ));
            }
            None => {
                return Err(ImportError::Empty {
                    path: path.to_path_buf(),
                });
            }
        },
    };
    let mut report = ImportReport {
        path: path.to_path_buf(),
        format: Some(format),
        bytes: size,
        ..ImportReport::default()
    };
    let mut sink = Sink::new(store, options, &mut report);

    if document {
        if size > max_line as u64 {
            return Err(ImportError::DocumentTooLarge {
                path: path.to_path_buf(),
                bytes: size,
                max: max_line,
            });
        }
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        File::open(path)
            .map_err(io)?
            .read_to_end(&mut bytes)
            .map_err(io)?;
        let messages = formats::openai::parse_document(&bytes, &default_key).map_err(|error| {
            ImportError::Document {
                path: path.to_path_buf(),
                error,
            }
        })?;
        sink.report.lines = bytes.iter().filter(|b| **b == b'\n').count() as u64 + 1;
        for m in messages {
            sink.push(m)?;
        }
        sink.finish()?;
        progress(size, size);
        let lines = report.lines;
        return Ok((
            report,
            FilePosition {
                offset: size,
                line: lines,
                format: Some(format),
            },
        ));
    }

    if options.strict {
        // A first pass that writes nothing: any bad line aborts here.
        for_each_line(path, &reading, |line_no, line| {
            let bytes = line.text(path, line_no, max_line)?;
            let ctx = LineContext {
                line: line_no,
                default_session_key: &default_key,
            };
            formats::parse_line(format, bytes, &ctx)
                .map(|_| ())
                .map_err(|error| ImportError::Strict {
                    path: path.to_path_buf(),
                    error,
                })
        })?;
    }

    // Lines are parsed in chunks on every core (parsing is pure), and their outcomes handled
    // here in file order, so reports and batches are what a line-by-line import would make.
    let mut read = from.offset;
    let threads = lcm_core::cores::cores();
    let end = for_each_run_of_lines(path, PARSE_RUN_BYTES, &reading, |run| {
        let default_key = default_key.clone();
        let pipeline = OrderedPipeline::new(run, move |chunk: LineChunk| {
            chunk.parse(format, &default_key)
        });
        pipeline.run(threads, |parsed| {
            for (line_no, len, outcome) in parsed {
                read += len as u64 + 1;
                sink.report.lines = line_no;
                match outcome {
                    Ok(LineOutcome::Messages(messages)) => {
                        for m in messages {
                            sink.push(m)?;
                        }
                    }
                    Ok(LineOutcome::Skipped { reason }) => {
                        *sink.report.skipped.entry(reason.to_string()).or_default() += 1;
                    }
                    Err(error) => {
                        sink.report.error_count += 1;
                        if sink.report.errors.len() < MAX_LISTED_ERRORS {
                            sink.report.errors.push(error.to_string());
                        }
                    }
                }
                if line_no.is_multiple_of(1024) {
                    progress(read.min(size), size);
                }
            }
            Ok(())
        })
    })?;
    sink.finish()?;
    progress(size, size);
    report.lines = report.lines.max(end.line);
    Ok((
        report,
        FilePosition {
            offset: end.offset,
            line: end.line,
            format: Some(format),
        },
    ))
}

/// Works out the format (from the options or the first entry) and whether the file is one JSON
/// document rather than JSON lines; `None` when there is no entry to read.
fn sniff(
    path: &Path,
    format: Option<Format>,
    reading: &Reading,
) -> Result<Option<(Format, bool)>, ImportError> {
    let mut first: Option<Vec<u8>> = None;
    let max_line = reading.max_line;
    for_each_line(path, reading, |line_no, line| {
        let bytes = line.text(path, line_no, max_line)?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        first = Some(bytes.to_vec());
        Err(ImportError::Empty {
            path: PathBuf::new(),
        }) // stop reading; not an error
    })
    .map(|_| ())
    .or_else(|e| match e {
        ImportError::Empty { .. } => Ok(()),
        other => Err(other),
    })?;
    let Some(first) = first else {
        return Ok(None);
    };
    let trimmed = first.trim_ascii();
    // An array, or a pretty-printed object, is one JSON document (OpenAI's messages array).
    let document = trimmed.starts_with(b"[") || trimmed == b"{";
    let format = match format {
        Some(f) => f,
        None if document => Format::OpenAi,
        None => formats::detect(&first).ok_or_else(|| ImportError::UnknownFormat {
            path: path.to_path_buf(),
        })?,
    };
    Ok(Some((format, document && format == Format::OpenAi)))
}

/// One line of a file, as [`for_each_line`] reads it.
enum Line<'a> {
    /// The line's bytes, without the newline.
    Text(&'a [u8]),
    /// A line longer than the limit: not read into memory.
    TooLong,
}

impl<'a> Line<'a> {
    /// The line's bytes, or the error of a line over the limit (where a bad line is fatal).
    fn text(self, path: &Path, line: u64, max: usize) -> Result<&'a [u8], ImportError> {
        match self {
            Line::Text(bytes) => Ok(bytes),
            Line::TooLong => Err(ImportError::LineTooLong {
                path: path.to_path_buf(),
                line,
                max,
            }),
        }
    }
}

/// Where and how a file is read: from a position, and whether a last line without its newline
/// is left unread (a line still being written).
struct Reading {
    from: FilePosition,
    complete_only: bool,
    max_line: usize,
}

/// Calls `visit` with (1-based line number, line) for each non-blank line after
/// `reading.from`, and returns the position after the last line read. A line longer than
/// `max_line` bytes is never held whole: the rest of it is read in small pieces and dropped,
/// and `visit` gets [`Line::TooLong`], so memory stays bounded whatever the file holds.
fn for_each_line(
    path: &Path,
    reading: &Reading,
    mut visit: impl FnMut(u64, Line<'_>) -> Result<(), ImportError>,
) -> Result<FilePosition, ImportError> {
    use std::io::{Seek, SeekFrom};
    let io = |source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let max_line = reading.max_line;
    let mut file = File::open(path).map_err(io)?;
    if reading.from.offset > 0 {
        file.seek(SeekFrom::Start(reading.from.offset))
            .map_err(io)?;
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(64 * 1024);
    let mut at = reading.from;
    let limit = u64::try_from(max_line)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    loop {
        line.clear();
        let n = (&mut reader)
            .take(limit)
            .read_until(b'\n', &mut line)
            .map_err(io)?;
        if n == 0 {
            return Ok(at);
        }
        let line_no = at.line + 1;
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if line.len() > max_line {
            line.clear();
            let (skipped, ended) = skip_rest_of_line(&mut reader).map_err(io)?;
            if reading.complete_only && !ended {
                return Ok(at);
            }
            at.line = line_no;
            at.offset += (n + skipped) as u64;
            visit(line_no, Line::TooLong)?;
            continue;
        } else if reading.complete_only {
            // The last line, still being written: read it once it is whole.
            return Ok(at);
        }
        at.line = line_no;
        at.offset += n as u64;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        visit(line_no, Line::Text(&line))?;
    }
}

/// Reads past the next newline (or to the end) without keeping what it reads: the bytes read,
/// and whether a newline ended them.
fn skip_rest_of_line(reader: &mut impl BufRead) -> std::io::Result<(usize, bool)> {
    let mut skipped = 0;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok((skipped, false));
        }
        match buffer.iter().position(|b| *b == b'\n') {
            Some(at) => {
                reader.consume(at + 1);
                return Ok((skipped + at + 1, true));
            }
            None => {
                let len = buffer.len();
                skipped += len;
                reader.consume(len);
            }
        }
    }
}

/// Lines parsed by one thread at a time.
const PARSE_CHUNK_LINES: usize = 64;
/// Bytes of lines read ahead and parsed as one run (bounds an import's memory).
const PARSE_RUN_BYTES: usize = 8 << 20;

/// Consecutive non-blank lines of a file: their bytes, and each line's number and range
/// (`None` for a line over the length limit, which was not read).
#[derive(Default)]
struct LineChunk {
    bytes: Vec<u8>,
    lines: Vec<(u64, Option<std::ops::Range<usize>>)>,
    /// The limit lines were read with (for the error of a longer one).
    max_line: usize,
}

/// What parsing one line gave: its number, its length, the outcome.
type ParsedLine = (u64, usize, Result<LineOutcome, ParseError>);

impl LineChunk {
    fn parse(&self, format: Format, default_key: &str) -> Vec<ParsedLine> {
        self.lines
            .iter()
            .map(|(line_no, range)| {
                let Some(range) = range else {
                    let error = ParseError::InvalidEntry {
                        line: *line_no,
                        detail: format!(
                            "longer than import.max_line_bytes ({} bytes): not read into memory, nothing stored from it",
                            self.max_line
                        ),
                    };
                    return (*line_no, 0, Err(error));
                };
                let ctx = LineContext {
                    line: *line_no,
                    default_session_key: default_key,
                };
                let bytes = &self.bytes[range.clone()];
                (
                    *line_no,
                    bytes.len(),
                    formats::parse_line(format, bytes, &ctx),
                )
            })
            .collect()
    }
}

/// Calls `visit` with runs of [`LineChunk`]s (about `run_limit` bytes of lines each, the last
/// one shorter), in file order, skipping blank lines as [`for_each_line`] does.
fn for_each_run_of_lines(
    path: &Path,
    run_limit: usize,
    reading: &Reading,
    mut visit: impl FnMut(Vec<LineChunk>) -> Result<(), ImportError>,
) -> Result<FilePosition, ImportError> {
    let max_line = reading.max_line;
    let mut run: Vec<LineChunk> = Vec::new();
    let new_chunk = || LineChunk {
        max_line,
        ..LineChunk::default()
    };
    let mut chunk = new_chunk();
    let mut run_bytes = 0;
    let end = for_each_line(path, reading, |line_no, line| {
        match line {
            Line::Text(bytes) => {
                let start = chunk.bytes.len();
                chunk.bytes.extend_from_slice(bytes);
                chunk.lines.push((line_no, Some(start..chunk.bytes.len())));
                run_bytes += bytes.len();
            }
            Line::TooLong => chunk.lines.push((line_no, None)),
        }
        if chunk.lines.len() >= PARSE_CHUNK_LINES || run_bytes >= run_limit {
            run.push(std::mem::replace(&mut chunk, new_chunk()));
        }
        if run_bytes >= run_limit {
            run_bytes = 0;
            visit(std::mem::take(&mut run))?;
        }
        Ok(())
    })?;
    if !chunk.lines.is_empty() {
        run.push(chunk);
    }
    if !run.is_empty() {
        visit(run)?;
    }
    Ok(end)
}

/// Collects parsed messages into batches and appends them.
struct Sink<'a> {
    store: &'a Store,
    options: &'a ImportOptions,
    report: &'a mut ImportReport,
    batch: Vec<(SessionId, NewMessage)>,
    sessions: HashMap<String, SessionId>,
    per_session: BTreeMap<SessionId, (String, u64, u64)>,
}

impl<'a> Sink<'a> {
    fn new(store: &'a Store, options: &'a ImportOptions, report: &'a mut ImportReport) -> Self {
        Sink {
            store,
            options,
            report,
            batch: Vec::new(),
            sessions: HashMap::new(),
            per_session: BTreeMap::new(),
        }
    }

    fn push(&mut self, parsed: ParsedMessage) -> Result<(), ImportError> {
        // `--session` puts everything in one session: no parent then.
        let (key, parent) = match &self.options.session_key {
            Some(key) => (key.clone(), None),
            None => (parsed.session_key, parsed.parent_session_key),
        };
        let session = match self.sessions.get(&key) {
            Some(id) => *id,
            None => {
                // Made durable by the append of this message's batch (`flush`). A sub-agent's
                // session is made the child of its parent's (created empty if not yet there).
                let parent = match parent {
                    Some(parent) => Some(self.store.ensure_session_for_append(&parent)?),
                    None => None,
                };
                let id = self.store.ensure_child_session_for_append(&key, parent)?;
                self.sessions.insert(key.clone(), id);
                self.per_session.entry(id).or_insert((key, 0, 0));
                id
            }
        };
        self.batch.push((session, parsed.message));
        if self.batch.len() >= self.options.batch_size.max(1) {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ImportError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::take(&mut self.batch);
        let sessions: Vec<SessionId> = batch.iter().map(|(s, _)| *s).collect();
        let results = self.store.append_mixed(batch)?;
        for (session, result) in sessions.into_iter().zip(results) {
            let entry = self.per_session.entry(session).or_default();
            if result.inserted {
                self.report.imported += 1;
                entry.1 += 1;
            } else {
                self.report.already_present += 1;
                entry.2 += 1;
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<(), ImportError> {
        self.flush()?;
        self.report.sessions = std::mem::take(&mut self.per_session)
            .into_iter()
            .map(|(id, (key, imported, already_present))| ImportedSession {
                id,
                key,
                imported,
                already_present,
            })
            .collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreOptions;

    fn line(k: usize) -> String {
        format!(
            r#"{{"session":"s{}","role":"user","key":"k{k}","content":"message {k}"}}"#,
            k % 3
        )
    }

    /// Every non-blank line comes out once, in order, with its number, whatever the run size.
    #[test]
    fn runs_of_chunks_hold_every_non_blank_line_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines.jsonl");
        let mut text = String::new();
        let mut expected = Vec::new();
        for k in 0..1_000 {
            if k % 97 == 5 {
                text.push_str("   \n");
                continue;
            }
            text.push_str(&line(k));
            text.push('\n');
            expected.push((k as u64 + 1, line(k)));
        }
        std::fs::write(&path, &text).unwrap();
        for run_limit in [1, 500, 10_000, usize::MAX] {
            let mut seen = Vec::new();
            let mut runs = 0;
            for_each_run_of_lines(
                &path,
                run_limit,
                &Reading {
                    from: FilePosition::default(),
                    complete_only: false,
                    max_line: usize::MAX,
                },
                |run| {
                    runs += 1;
                    for chunk in run {
                        assert!(chunk.lines.len() <= PARSE_CHUNK_LINES);
                        for (no, range) in &chunk.lines {
                            let range = range.clone().expect("no line over the limit");
                            let text = String::from_utf8(chunk.bytes[range].to_vec()).unwrap();
                            seen.push((*no, text));
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(seen, expected, "run limit {run_limit}");
            assert!(runs >= 1);
            if run_limit == 1 {
                assert_eq!(runs, expected.len(), "a run per line past the limit");
            }
        }
    }

    /// An import of many chunks (parsed on several threads) stores the messages in file order
    /// per session and reports bad lines in line order with their numbers.
    #[test]
    fn a_many_chunk_import_keeps_file_order_and_reports_lines_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.jsonl");
        let mut text = String::new();
        let mut bad_lines = Vec::new();
        for k in 0..3_000 {
            if k % 250 == 17 {
                text.push_str("{\"session\":\"s0\",\"role\":\"user\",\"content\":\"trunc\n");
                bad_lines.push(k + 1);
                continue;
            }
            text.push_str(&line(k));
            text.push('\n');
        }
        std::fs::write(&path, &text).unwrap();
        let options = StoreOptions::new(lcm_core::tokens::TokenCounter::new(
            lcm_core::tokens::Encoding::O200kBase,
        ));
        let store = Store::open(dir.path().join("store.redb"), options).unwrap();
        let options = ImportOptions {
            batch_size: 700,
            ..ImportOptions::default()
        };
        let report = import_file(&store, &path, &options, |_, _| {}).unwrap();
        assert_eq!(report.imported, 3_000 - bad_lines.len() as u64);
        assert_eq!(report.lines, 3_000);
        assert_eq!(report.error_count, bad_lines.len() as u64);
        let reported: Vec<String> = report.errors.clone();
        for (error, line_no) in reported.iter().zip(&bad_lines) {
            assert!(
                error.contains(&format!("line {line_no}:")),
                "{error} (expected line {line_no})"
            );
        }
        for session in 0..3 {
            let id = store
                .session_id_for_key(&format!("s{session}"))
                .unwrap()
                .unwrap();
            let texts: Vec<String> = store
                .session_messages(id, 0..u64::MAX)
                .unwrap()
                .into_iter()
                .map(|m| lcm_core::message::search_text(&m.parts).into_owned())
                .collect();
            let expected: Vec<String> = (0..3_000)
                .filter(|k| k % 3 == session && k % 250 != 17)
                .map(|k| format!("message {k}"))
                .collect();
            assert_eq!(texts, expected, "session s{session}");
        }
    }

    /// A growing file imported piece by piece stores what a whole-file import stores, with the
    /// same line-based keys (lines without a key of their own), never a half-written line, and
    /// nothing twice.
    #[test]
    fn importing_a_growing_file_on_from_a_position_equals_one_import() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("live.jsonl");
        let counter = || {
            StoreOptions::new(lcm_core::tokens::TokenCounter::new(
                lcm_core::tokens::Encoding::O200kBase,
            ))
        };
        let unkeyed =
            |k: usize| format!(r#"{{"session":"live","role":"user","content":"line {k}"}}"#) + "\n";
        let store = Store::open(dir.path().join("followed.redb"), counter()).unwrap();
        let options = ImportOptions::default();
        let append = |text: &str| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap();
            f.write_all(text.as_bytes()).unwrap();
        };

        // Nothing complete yet: nothing read, the position stays.
        let third = unkeyed(3);
        append(&third[..10]);
        let (report, at) =
            import_file_from(&store, &path, &options, FilePosition::default(), |_, _| {}).unwrap();
        assert_eq!((report.imported, at), (0, FilePosition::default()));
        std::fs::remove_file(&path).unwrap();

        append(&(unkeyed(1) + "\n" + &unkeyed(2)));
        append(&third[..10]);
        let (report, at) =
            import_file_from(&store, &path, &options, FilePosition::default(), |_, _| {}).unwrap();
        assert_eq!(report.imported, 2);
        assert_eq!(at.line, 3, "the blank line counts");
        let read = (unkeyed(1).len() + 1 + unkeyed(2).len()) as u64;
        assert_eq!(at.offset, read, "the half line is left for later");
        // Again from there, before the writer goes on: nothing.
        let (report, same) = import_file_from(&store, &path, &options, at, |_, _| {}).unwrap();
        assert_eq!((report.imported, same), (0, at));
        append(&third[10..]);
        append(&unkeyed(4));
        let (report, at) = import_file_from(&store, &path, &options, at, |_, _| {}).unwrap();
        assert_eq!(report.imported, 2);
        assert_eq!(at.offset, std::fs::metadata(&path).unwrap().len());
        assert_eq!(at.line, 5);

        // The same file imported whole elsewhere: the same messages; and into the followed
        // store again: nothing new (the keys are the same).
        let whole = Store::open(dir.path().join("whole.redb"), counter()).unwrap();
        let report = import_file(&whole, &path, &options, |_, _| {}).unwrap();
        assert_eq!(report.imported, 4);
        let again = import_file(&store, &path, &options, |_, _| {}).unwrap();
        assert_eq!((again.imported, again.already_present), (0, 4));
        let texts = |store: &Store| {
            let id = store.session_id_for_key("live").unwrap().unwrap();
            store
                .session_messages(id, 0..u64::MAX)
                .unwrap()
                .into_iter()
                .map(|m| lcm_core::message::search_text(&m.parts).into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(texts(&store), texts(&whole));
        assert_eq!(texts(&store), ["line 1", "line 2", "line 3", "line 4"]);
    }
}
