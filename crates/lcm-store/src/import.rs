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
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            format: None,
            session_key: None,
            strict: false,
            batch_size: 5_000,
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

/// Imports one file. `progress` is called with (bytes read, file size).
pub fn import_file(
    store: &Store,
    path: &Path,
    options: &ImportOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<ImportReport, ImportError> {
    let io = |source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    let default_key = options.session_key.clone().unwrap_or_else(|| {
        path.file_stem()
            .map_or_else(|| "import".to_owned(), |s| s.to_string_lossy().into_owned())
    });
    let (format, document) = sniff(path, options.format)?;
    let mut report = ImportReport {
        path: path.to_path_buf(),
        format: Some(format),
        bytes: size,
        ..ImportReport::default()
    };
    let mut sink = Sink::new(store, options, &mut report);

    if document {
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
        return Ok(report);
    }

    if options.strict {
        // A first pass that writes nothing: any bad line aborts here.
        for_each_line(path, |line_no, bytes| {
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

    let mut read = 0u64;
    for_each_line(path, |line_no, bytes| {
        read += bytes.len() as u64 + 1;
        sink.report.lines = line_no;
        let ctx = LineContext {
            line: line_no,
            default_session_key: &default_key,
        };
        match formats::parse_line(format, bytes, &ctx) {
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
        Ok(())
    })?;
    sink.finish()?;
    progress(size, size);
    Ok(report)
}

/// Works out the format (from the options or the first entry) and whether the file is one JSON
/// document rather than JSON lines.
fn sniff(path: &Path, format: Option<Format>) -> Result<(Format, bool), ImportError> {
    let mut first: Option<Vec<u8>> = None;
    for_each_line(path, |_, bytes| {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        first = Some(bytes.to_vec());
        Err(ImportError::Empty {
            path: PathBuf::new(),
        }) // stop reading; not an error
    })
    .or_else(|e| match e {
        ImportError::Empty { .. } => Ok(()),
        other => Err(other),
    })?;
    let Some(first) = first else {
        return Err(ImportError::Empty {
            path: path.to_path_buf(),
        });
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
    Ok((format, document && format == Format::OpenAi))
}

/// Calls `visit` with (1-based line number, line bytes without the newline) for each line.
fn for_each_line(
    path: &Path,
    mut visit: impl FnMut(u64, &[u8]) -> Result<(), ImportError>,
) -> Result<(), ImportError> {
    let io = |source| ImportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path).map_err(io)?);
    let mut line = Vec::with_capacity(64 * 1024);
    let mut line_no = 0u64;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        line_no += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        visit(line_no, &line)?;
    }
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
        let key = self
            .options
            .session_key
            .clone()
            .unwrap_or(parsed.session_key);
        let session = match self.sessions.get(&key) {
            Some(id) => *id,
            None => {
                let id = self.store.ensure_session(&key)?;
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
