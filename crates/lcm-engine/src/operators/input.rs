//! Where a map's files may be, and the streaming JSONL reader.
//!
//! # Paths
//!
//! Input and output files must lie inside one of the configured roots (`[map] allowed_roots`;
//! none configured means the working directory). Paths are checked after canonicalisation, so
//! `..` segments and symlinks are resolved first: `root/../etc/passwd` and a symlink in a root
//! pointing outside it are both refused. A relative path is taken relative to the first root.
//! The output file's directory must exist; an existing output file is replaced atomically
//! (never followed if it is a symlink: symlinks are refused as outputs).
//!
//! # Lines
//!
//! The input is read one line at a time through a `BufReader`, never whole. Every non-blank
//! line is one item, numbered from 0 in file order; the item keeps its 1-based line number.
//! - A blank (empty or whitespace-only) line is skipped: it is not an item (a trailing newline
//!   or a separating blank line is common and means nothing).
//! - A line longer than the limit becomes a failed item "line N is over the limit of M bytes";
//!   it is skipped to its end without being held in memory.
//! - A line that is not UTF-8, or not exactly one JSON value, becomes a failed item saying so
//!   (with serde_json's error: line and column).
//! - A UTF-8 byte order mark at the start of the file is ignored; a `\r` before the newline too.
//!
//! An I/O error while reading ends the iteration with that error (job creation then deletes
//! the half-written job).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Component, Path, PathBuf};

use lcm_store::{ItemContent, ItemInput};

use super::MapError;

fn refused(path: &Path, reason: impl Into<String>) -> MapError {
    MapError::Path {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The roots files must lie in: the configured ones, canonicalised (roots that do not exist
/// are dropped), or the working directory when none is configured.
pub fn effective_roots(configured: &[PathBuf]) -> Result<Vec<PathBuf>, MapError> {
    if configured.is_empty() {
        let cwd = std::env::current_dir().map_err(|source| MapError::Io {
            path: PathBuf::from("."),
            source,
        })?;
        let cwd = cwd.canonicalize().map_err(|source| MapError::Io {
            path: cwd.clone(),
            source,
        })?;
        return Ok(vec![cwd]);
    }
    let mut roots = Vec::with_capacity(configured.len());
    for root in configured {
        match root.canonicalize() {
            Ok(root) => roots.push(root),
            Err(error) => {
                tracing::warn!(root = %root.display(), %error, "map.allowed_roots: ignoring a root that cannot be resolved");
            }
        }
    }
    if roots.is_empty() {
        return Err(MapError::InvalidRequest(
            "none of the configured map.allowed_roots exists".into(),
        ));
    }
    Ok(roots)
}

fn absolute(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, MapError> {
    if path.as_os_str().is_empty() {
        return Err(refused(path, "the path is empty"));
    }
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    match roots.first() {
        Some(root) => Ok(root.join(path)),
        None => Err(refused(path, "no allowed roots are configured")),
    }
}

fn check_inside(given: &Path, canonical: &Path, roots: &[PathBuf]) -> Result<(), MapError> {
    if roots.iter().any(|root| canonical.starts_with(root)) {
        return Ok(());
    }
    let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Err(refused(
        given,
        format!(
            "resolves to {}, which is outside the allowed roots ({}); see map.allowed_roots",
            canonical.display(),
            roots.join(", ")
        ),
    ))
}

/// The canonical path of an existing input file inside `roots` (which must be canonical, see
/// [`effective_roots`]); refuses anything else with a clear error.
pub fn resolve_input(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, MapError> {
    let joined = absolute(path, roots)?;
    let canonical = joined.canonicalize().map_err(|e| {
        refused(
            path,
            match e.kind() {
                std::io::ErrorKind::NotFound => "no such file".to_owned(),
                _ => format!("cannot be resolved: {e}"),
            },
        )
    })?;
    check_inside(path, &canonical, roots)?;
    if !canonical.is_file() {
        return Err(refused(path, "is not a regular file"));
    }
    Ok(canonical)
}

/// The output path inside `roots`: its directory must exist and resolve inside a root, its
/// name must be a plain file name, and an existing file there must be a regular file (not a
/// symlink or a directory).
pub fn resolve_output(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, MapError> {
    let joined = absolute(path, roots)?;
    let name = match joined.components().next_back() {
        Some(Component::Normal(name)) => name.to_owned(),
        _ => return Err(refused(path, "does not end in a file name")),
    };
    let parent = joined.parent().unwrap_or(Path::new("/"));
    let parent = parent.canonicalize().map_err(|e| {
        refused(
            path,
            format!("its directory {} cannot be resolved: {e}", parent.display()),
        )
    })?;
    let canonical = parent.join(name);
    check_inside(path, &canonical, roots)?;
    match std::fs::symlink_metadata(&canonical) {
        Ok(meta) if meta.file_type().is_symlink() => {
            return Err(refused(path, "is a symlink; give the real path"));
        }
        Ok(meta) if !meta.is_file() => return Err(refused(path, "exists and is not a file")),
        _ => {}
    }
    Ok(canonical)
}

/// The default output path for `input`: `<input stem>.out.jsonl` beside it.
pub fn default_output_path(input: &Path) -> PathBuf {
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "map".into());
    input.with_file_name(format!("{stem}.out.jsonl"))
}

/// Opens a JSONL file for [`JsonlItems`].
pub fn open_jsonl(
    path: &Path,
    max_item_bytes: usize,
) -> Result<JsonlItems<BufReader<File>>, MapError> {
    let file = File::open(path).map_err(|source| MapError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(JsonlItems::new(
        BufReader::with_capacity(64 * 1024, file),
        max_item_bytes,
    ))
}

/// The items of a JSONL stream, one line at a time (see the module documentation).
#[derive(Debug)]
pub struct JsonlItems<R> {
    reader: R,
    max: usize,
    line: u64,
    buf: Vec<u8>,
    done: bool,
}

impl<R: BufRead> JsonlItems<R> {
    /// Reads `reader`, refusing lines over `max_item_bytes` bytes.
    pub fn new(reader: R, max_item_bytes: usize) -> Self {
        JsonlItems {
            reader,
            max: max_item_bytes,
            line: 0,
            buf: Vec::new(),
            done: false,
        }
    }

    /// Reads the next line into `buf` (without its newline), keeping at most `max` bytes:
    /// `None` at the end, else whether the line was over the limit.
    fn read_line(&mut self) -> std::io::Result<Option<bool>> {
        self.buf.clear();
        let mut over = false;
        let mut any = false;
        loop {
            let available = match self.reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                return Ok(any.then_some(over));
            }
            any = true;
            let (chunk, used, end) = match available.iter().position(|&b| b == b'\n') {
                Some(i) => (&available[..i], i + 1, true),
                None => (available, available.len(), false),
            };
            if !over {
                if self.buf.len() + chunk.len() > self.max {
                    over = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            self.reader.consume(used);
            if end {
                return Ok(Some(over));
            }
        }
    }
}

impl<R: BufRead> Iterator for JsonlItems<R> {
    type Item = std::io::Result<ItemInput>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            let over = match self.read_line() {
                Ok(Some(over)) => over,
                Ok(None) => {
                    self.done = true;
                    return None;
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            };
            self.line += 1;
            let line = self.line;
            let invalid = |message: String| {
                Some(Ok(ItemInput {
                    line,
                    content: ItemContent::Invalid(message),
                }))
            };
            if over {
                return invalid(format!(
                    "line {line} is over the limit of {} bytes (map.max_item_bytes)",
                    self.max
                ));
            }
            let mut bytes = self.buf.as_slice();
            if line == 1 {
                bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
            }
            let Ok(text) = std::str::from_utf8(bytes) else {
                return invalid(format!("line {line} is not valid UTF-8"));
            };
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(text) {
                return invalid(format!("line {line} is not one JSON value: {e}"));
            }
            return Some(Ok(ItemInput {
                line,
                content: ItemContent::Json(text.to_owned()),
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &[u8], max: usize) -> Vec<ItemInput> {
        JsonlItems::new(std::io::BufReader::with_capacity(4, text), max)
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn lines_become_items_or_failures() {
        let items = read(
            b"\xEF\xBB\xBF{\"a\":1}\r\n\n   \n[1,2]\nnot json\n\"0123456789abcdef\"\n\xff\xfe\n1 2\n42",
            12,
        );
        let got: Vec<(u64, String)> = items
            .into_iter()
            .map(|i| {
                (
                    i.line,
                    match i.content {
                        ItemContent::Json(t) => format!("ok {t}"),
                        ItemContent::Invalid(e) => format!("bad {e}"),
                    },
                )
            })
            .collect();
        assert_eq!(got[0], (1, "ok {\"a\":1}".into()));
        assert_eq!(got[1], (4, "ok [1,2]".into()));
        assert!(
            got[2].1.starts_with("bad line 5 is not one JSON value"),
            "{got:?}"
        );
        assert_eq!(
            got[3],
            (
                6,
                "bad line 6 is over the limit of 12 bytes (map.max_item_bytes)".into()
            )
        );
        assert_eq!(got[4], (7, "bad line 7 is not valid UTF-8".into()));
        assert!(got[5].1.contains("line 8 is not one JSON value"), "{got:?}");
        assert_eq!(got[6], (9, "ok 42".into()));
        assert_eq!(got.len(), 7);
    }

    #[test]
    fn default_output_is_beside_the_input() {
        assert_eq!(
            default_output_path(Path::new("/d/items.jsonl")),
            Path::new("/d/items.out.jsonl")
        );
    }
}
