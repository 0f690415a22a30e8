//! Type-aware exploration summaries of large payloads.
//!
//! When an agent's message carries a large payload (a tool result with a 12,000-row CSV, a file
//! read, a log dump), lcm stores the message verbatim, but the model's context carries only a
//! reference with an *exploration summary* of the content: schema and shape for structured
//! formats, structural analysis (signatures, classes) for code, levels and errors for logs.
//! This crate builds those summaries; the store calls [`explore`] when a message is appended.
//!
//! # Purity
//!
//! [`explore`] and [`detect()`] are pure functions of their input: no file or network I/O, no
//! clock, no randomness, no global state (beyond `lcm-core`'s process-wide token tables), so
//! the same bytes always give the same summary and a summary can be recomputed from the stored
//! message at any time. Every explorer is a single linear pass (or a bounded number of them)
//! with bounded memory: explorers keep fixed-size tallies, not copies of the input; JSON above
//! 64 MiB and code above 512 KiB are explored from a prefix, with a note (code whose first
//! 32 KiB are mostly syntax errors only from those: tree-sitter's error recovery is slow). No
//! input makes them panic: invalid UTF-8, empty or one-byte input, deeply nested JSON,
//! truncated or corrupt SQLite files all give a summary.
//!
//! # What lives where
//!
//! - `lib.rs`: the public API ([`FileKind`], [`ExploreInput`], [`Exploration`], [`detect()`],
//!   [`explore`], [`strip_line_numbers`]) and the dispatch to the explorers.
//! - `detect.rs`: detection by extension, then declared MIME type, then content sniffing
//!   (magic bytes, UTF-8 validity, JSON/JSONL/CSV/log/SQL/Markdown heuristics, shebangs) over a
//!   64 KiB prefix.
//! - `summary.rs`: ranked summary lines and the token cap: the least important lines (samples,
//!   then minor detail) are dropped first, the first line (kind and size) is kept, and a final
//!   cut by tokens adds a marker.
//! - One module per kind: `json.rs` (streaming schema inference, shared with `jsonl.rs`),
//!   `delimited.rs` (CSV/TSV with the `csv` crate), `sql.rs` (SQL dumps), `sqlite.rs` (SQLite
//!   files read from their b-trees), `code.rs` (tree-sitter outlines), `log.rs`, `markdown.rs`,
//!   `text.rs`, `binary.rs` (images and other binary formats).
//! - `util.rs`: number and size formatting, truncation, timestamp and log-level recognition.

#![warn(missing_docs)]

mod binary;
mod code;
mod delimited;
mod detect;
mod json;
mod jsonl;
mod log;
mod markdown;
mod sql;
mod sqlite;
mod summary;
mod text;
mod util;

use lcm_core::tokens::TokenCounter;

/// What a payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// One JSON document.
    Json,
    /// JSON Lines / NDJSON: one JSON value per line.
    JsonLines,
    /// Comma- (or semicolon-) separated values.
    Csv,
    /// Tab-separated values.
    Tsv,
    /// SQL statements (a dump: CREATE TABLE, INSERT, COPY, ...).
    SqlDump,
    /// A SQLite database file.
    Sqlite,
    /// Source code (see [`Exploration::language`]).
    Code,
    /// A log: timestamped and/or levelled lines.
    Log,
    /// Markdown.
    Markdown,
    /// Any other text.
    Text,
    /// An image (PNG, JPEG, GIF, WebP, BMP, ICO, TIFF).
    Image,
    /// Any other binary data.
    Binary,
}

impl FileKind {
    /// The kind's short name: "json", "jsonl", "csv", "tsv", "sql", "sqlite", "code", "log",
    /// "markdown", "text", "image", "binary".
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Json => "json",
            FileKind::JsonLines => "jsonl",
            FileKind::Csv => "csv",
            FileKind::Tsv => "tsv",
            FileKind::SqlDump => "sql",
            FileKind::Sqlite => "sqlite",
            FileKind::Code => "code",
            FileKind::Log => "log",
            FileKind::Markdown => "markdown",
            FileKind::Text => "text",
            FileKind::Image => "image",
            FileKind::Binary => "binary",
        }
    }
}

/// A payload to explore.
#[derive(Debug, Clone, Copy)]
pub struct ExploreInput<'a> {
    /// Where the content came from, when known (a file path): used for detection by extension.
    pub path: Option<&'a str>,
    /// A MIME type the host declared, when known.
    pub mime_type: Option<&'a str>,
    /// The content.
    pub bytes: &'a [u8],
}

/// The result of [`explore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exploration {
    /// What the payload is.
    pub kind: FileKind,
    /// Detected MIME type ("text/csv", "application/json", "text/x-rust", "image/png",
    /// "application/octet-stream", ...).
    pub mime_type: String,
    /// For code: "rust", "python", "typescript", "tsx", "javascript", "go", "elixir", ... (the
    /// first seven have a tree-sitter grammar built in; the others get a head excerpt).
    pub language: Option<String>,
    /// The exploration summary: plain text, at most `max_tokens` tokens by the counter given
    /// to [`explore`].
    pub summary: String,
}

/// Detects what `input` is: its kind, MIME type and, for code, language.
///
/// The path's extension decides first, then the declared MIME type, then the content (magic
/// bytes; invalid UTF-8 or NUL bytes make it binary; then JSON, JSON Lines, CSV/TSV, log, SQL,
/// Markdown and shebang heuristics over the first 64 KiB). A binary format that the extension
/// or MIME type names must have its magic bytes, and text kinds need text, or the content
/// decides. Line-numbered `Read` output is recognised through its numbering (see
/// [`strip_line_numbers`]).
pub fn detect(input: &ExploreInput) -> (FileKind, String, Option<String>) {
    let prepared = prepare(input.bytes);
    let d = detect::detect_raw(input.path, input.mime_type, prepared.bytes());
    (d.kind, d.mime, d.language.map(str::to_string))
}

/// Explores `input`: detects its kind (as [`detect()`]) and summarises it in at most
/// `max_tokens` tokens by `counter` (an empty summary when `max_tokens` is 0).
///
/// UTF-8 input that is a line-numbered listing (Claude Code's `Read` output) is explored
/// without its numbering, so the summary describes the file; line numbers in the summary are
/// then the file's.
pub fn explore(input: &ExploreInput, counter: &TokenCounter, max_tokens: usize) -> Exploration {
    let prepared = prepare(input.bytes);
    let bytes = prepared.bytes();
    let d = detect::detect_raw(input.path, input.mime_type, bytes);
    let first_line = prepared.first_line();
    let text = || String::from_utf8_lossy(bytes);
    let mut summary = match d.kind {
        FileKind::Json => json::explore(&text(), first_line),
        FileKind::JsonLines => jsonl::explore(&text(), first_line),
        FileKind::Csv => delimited::explore(&text(), false),
        FileKind::Tsv => delimited::explore(&text(), true),
        FileKind::SqlDump => sql::explore(&text()),
        FileKind::Sqlite => sqlite::explore(bytes),
        FileKind::Code => code::explore(&text(), d.language.unwrap_or("unknown"), first_line),
        FileKind::Log => log::explore(&text(), first_line),
        FileKind::Markdown => markdown::explore(&text(), first_line),
        FileKind::Text => text::explore(&text(), first_line),
        FileKind::Image => binary::explore_image(bytes),
        FileKind::Binary => binary::explore_binary(bytes),
    };
    if let Prepared::Stripped { first, last, .. } = &prepared {
        summary.insert_after_head(
            summary::KEY,
            format!("From a line-numbered listing of lines {first}–{last} (numbers stripped)."),
        );
    }
    Exploration {
        kind: d.kind,
        mime_type: d.mime,
        language: d.language.map(str::to_string),
        summary: summary.finish(counter, max_tokens),
    }
}

/// Claude Code's `Read` tool returns file text as `cat -n` output: each line prefixed by its
/// right-aligned line number and '→' (U+2192) (older versions: a tab). Returns the text without
/// the prefixes when EVERY non-empty line has one, else `None`.
///
/// The numbers must be consecutive (a listing may start at any line: a read with an offset).
/// With the tab form, the number must be right-aligned in six columns as `cat -n` does, so that
/// a TSV file whose first column counts rows is not mistaken for a listing.
pub fn strip_line_numbers(text: &str) -> Option<String> {
    strip_numbered(text).map(|(s, _, _)| s)
}

/// [`strip_line_numbers`] plus the first and last line numbers.
fn strip_numbered(text: &str) -> Option<(String, u64, u64)> {
    // Cheap rejection before allocating.
    let first_line = text.lines().find(|l| !l.is_empty())?;
    numbered_prefix(first_line)?;
    let mut out = String::with_capacity(text.len());
    let mut expected: Option<u64> = None;
    let mut first = 0u64;
    // The last line with content: a listing of a file that ends with a newline numbers the
    // empty line after it too.
    let mut last = 0u64;
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if line.is_empty() {
            continue;
        }
        let (n, rest) = numbered_prefix(line)?;
        match expected {
            Some(e) if e != n => return None,
            None => first = n,
            _ => {}
        }
        expected = Some(n.checked_add(1)?);
        if !rest.is_empty() || last == 0 {
            last = n;
        }
        out.push_str(rest);
    }
    expected?;
    Some((out, first, last))
}

/// `"    12→text"` → `(12, "text")`; `"    12\ttext"` (six columns) → `(12, "text")`.
fn numbered_prefix(line: &str) -> Option<(u64, &str)> {
    let b = line.as_bytes();
    let spaces = b.iter().take_while(|&&c| c == b' ').count();
    let digits = b[spaces..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits == 0 || digits > 12 {
        return None;
    }
    let n: u64 = line[spaces..spaces + digits].parse().ok()?;
    let rest = &line[spaces + digits..];
    if let Some(r) = rest.strip_prefix('→') {
        return Some((n, r));
    }
    if let Some(r) = rest.strip_prefix('\t')
        && (spaces + digits == 6 || (spaces == 0 && digits > 6))
    {
        return Some((n, r));
    }
    None
}

/// Claude Code appends `<system-reminder>…</system-reminder>` blocks to some `Read` results;
/// they are not part of the file. Returns the text without trailing ones.
fn without_trailing_reminders(text: &str) -> &str {
    let mut t = text;
    for _ in 0..8 {
        let trimmed = t.trim_end();
        if !trimmed.ends_with("</system-reminder>") {
            break;
        }
        match trimmed.rfind("<system-reminder>") {
            Some(at) => t = &trimmed[..at],
            None => break,
        }
    }
    // Keep the listing's own final newline, drop the blank lines before the reminder.
    if t.len() < text.len() {
        let kept = t.trim_end_matches(['\n', '\r']);
        return &t[..(kept.len() + 1).min(t.len())];
    }
    t
}

/// The content to detect and explore: the input, or its text without line numbers.
enum Prepared<'a> {
    Raw(&'a [u8]),
    Stripped { text: String, first: u64, last: u64 },
}

impl Prepared<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Prepared::Raw(b) => b,
            Prepared::Stripped { text, .. } => text.as_bytes(),
        }
    }

    /// The file's line number of the first line of [`bytes`](Self::bytes).
    fn first_line(&self) -> usize {
        match self {
            Prepared::Raw(_) => 1,
            Prepared::Stripped { first, .. } => usize::try_from(*first).unwrap_or(1),
        }
    }
}

fn prepare(bytes: &[u8]) -> Prepared<'_> {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Prepared::Raw(bytes);
    };
    let stripped: Option<(String, u64, u64)> = strip_numbered(text).or_else(|| {
        let t = without_trailing_reminders(text);
        if t.len() < text.len() {
            strip_numbered(t)
        } else {
            None
        }
    });
    match stripped {
        Some((text, first, last)) => Prepared::Stripped { text, first, last },
        None => Prepared::Raw(bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;

    fn counter() -> TokenCounter {
        TokenCounter::new(Encoding::O200kBase)
    }

    fn input<'a>(path: Option<&'a str>, bytes: &'a [u8]) -> ExploreInput<'a> {
        ExploreInput {
            path,
            mime_type: None,
            bytes,
        }
    }

    #[test]
    fn strips_arrow_and_tab_numbering() {
        assert_eq!(
            strip_line_numbers("     1→fn main() {\n     2→}\n").as_deref(),
            Some("fn main() {\n}\n")
        );
        assert_eq!(
            strip_line_numbers("   260→a\n   261→\n   262→b").as_deref(),
            Some("a\n\nb")
        );
        assert_eq!(
            strip_line_numbers("     1\tx\n     2\ty").as_deref(),
            Some("x\ny")
        );
        // Not consecutive, not all lines, not six columns for the tab form, empty.
        assert_eq!(strip_line_numbers("     1→a\n     3→b"), None);
        assert_eq!(strip_line_numbers("     1→a\nplain"), None);
        assert_eq!(strip_line_numbers("1\tx\n2\ty\n"), None);
        assert_eq!(strip_line_numbers(""), None);
        assert_eq!(strip_line_numbers("\n\n"), None);
        assert_eq!(strip_line_numbers("1234567\tx").as_deref(), Some("x"));
    }

    #[test]
    fn explore_strips_numbering_and_reports_file_lines() {
        let listing = "    10→pub fn alpha(x: u32) -> u32 {\n    11→    x\n    12→}\n";
        let e = explore(
            &input(Some("src/lib.rs"), listing.as_bytes()),
            &counter(),
            500,
        );
        assert_eq!(e.kind, FileKind::Code);
        assert_eq!(e.language.as_deref(), Some("rust"));
        assert!(
            e.summary.contains("L10 pub fn alpha(x: u32) -> u32"),
            "{}",
            e.summary
        );
        assert!(e.summary.contains("lines 10–12"), "{}", e.summary);
        assert!(!e.summary.contains('→'), "{}", e.summary);
    }

    #[test]
    fn trailing_system_reminder_is_not_part_of_the_file() {
        let listing = "     1→{\"a\": 1}\n\n<system-reminder>\nWhenever you read a file...\n</system-reminder>\n";
        let e = explore(&input(Some("x.json"), listing.as_bytes()), &counter(), 500);
        assert_eq!(e.kind, FileKind::Json);
        assert!(
            e.summary.starts_with("JSON: object with 1 key"),
            "{}",
            e.summary
        );
    }

    #[test]
    fn detect_matches_explore() {
        let bytes = b"id,name\n1,a\n2,b\n3,c\n";
        let (k, m, l) = detect(&input(None, bytes));
        let e = explore(&input(None, bytes), &counter(), 300);
        assert_eq!(
            (k, m.as_str(), l),
            (e.kind, e.mime_type.as_str(), e.language.clone())
        );
        assert_eq!(k.as_str(), "csv");
    }

    #[test]
    fn kind_names() {
        let all = [
            (FileKind::Json, "json"),
            (FileKind::JsonLines, "jsonl"),
            (FileKind::Csv, "csv"),
            (FileKind::Tsv, "tsv"),
            (FileKind::SqlDump, "sql"),
            (FileKind::Sqlite, "sqlite"),
            (FileKind::Code, "code"),
            (FileKind::Log, "log"),
            (FileKind::Markdown, "markdown"),
            (FileKind::Text, "text"),
            (FileKind::Image, "image"),
            (FileKind::Binary, "binary"),
        ];
        for (k, s) in all {
            assert_eq!(k.as_str(), s);
        }
    }
}
