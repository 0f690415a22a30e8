//! What a payload is: by the path's extension, then the declared MIME type, then the content.
//!
//! Content sniffing reads at most [`SNIFF_BYTES`] from the start, so detection costs the same on
//! a 1 KiB and a 1 GiB payload.

use crate::FileKind;
use crate::binary::{self, Magic};
use crate::util::{find_timestamp, level_of, line_prefix};

/// How much of the content sniffing reads.
pub(crate) const SNIFF_BYTES: usize = 64 * 1024;

/// The result of detection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Detected {
    pub(crate) kind: FileKind,
    pub(crate) mime: String,
    pub(crate) language: Option<&'static str>,
}

impl Detected {
    fn new(kind: FileKind, mime: &str, language: Option<&'static str>) -> Self {
        Detected {
            kind,
            mime: mime.to_string(),
            language,
        }
    }
}

/// A programming language: its name, MIME type and whether a tree-sitter grammar is built in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lang {
    pub(crate) name: &'static str,
    pub(crate) mime: &'static str,
}

const fn lang(name: &'static str, mime: &'static str) -> Lang {
    Lang { name, mime }
}

/// Code by extension (lower case).
fn code_by_extension(ext: &str) -> Option<Lang> {
    Some(match ext {
        "rs" => lang("rust", "text/x-rust"),
        "py" | "pyi" | "pyw" => lang("python", "text/x-python"),
        "ts" | "mts" | "cts" => lang("typescript", "text/x-typescript"),
        "tsx" => lang("tsx", "text/x-tsx"),
        "js" | "mjs" | "cjs" | "jsx" => lang("javascript", "text/javascript"),
        "go" => lang("go", "text/x-go"),
        "ex" | "exs" => lang("elixir", "text/x-elixir"),
        "c" | "h" => lang("c", "text/x-c"),
        "cc" | "cpp" | "cxx" | "hpp" | "hh" | "hxx" => lang("cpp", "text/x-c++"),
        "java" => lang("java", "text/x-java"),
        "kt" | "kts" => lang("kotlin", "text/x-kotlin"),
        "scala" => lang("scala", "text/x-scala"),
        "rb" => lang("ruby", "text/x-ruby"),
        "php" => lang("php", "application/x-php"),
        "cs" => lang("csharp", "text/x-csharp"),
        "swift" => lang("swift", "text/x-swift"),
        "lua" => lang("lua", "text/x-lua"),
        "sh" | "bash" | "zsh" | "fish" => lang("shell", "text/x-shellscript"),
        "ps1" => lang("powershell", "text/x-powershell"),
        "erl" | "hrl" => lang("erlang", "text/x-erlang"),
        "hs" => lang("haskell", "text/x-haskell"),
        "ml" | "mli" => lang("ocaml", "text/x-ocaml"),
        "clj" | "cljs" => lang("clojure", "text/x-clojure"),
        "dart" => lang("dart", "text/x-dart"),
        "zig" => lang("zig", "text/x-zig"),
        "r" => lang("r", "text/x-r"),
        "vue" => lang("vue", "text/x-vue"),
        "svelte" => lang("svelte", "text/x-svelte"),
        "html" | "htm" => lang("html", "text/html"),
        "heex" | "eex" | "leex" => lang("heex", "text/x-heex"),
        "css" => lang("css", "text/css"),
        "scss" | "sass" => lang("scss", "text/x-scss"),
        _ => return None,
    })
}

/// Code by MIME type.
fn code_by_mime(mime: &str) -> Option<Lang> {
    Some(match mime {
        "text/x-rust" | "text/rust" => lang("rust", "text/x-rust"),
        "text/x-python" | "text/x-script.python" | "application/x-python" => {
            lang("python", "text/x-python")
        }
        "text/x-typescript" | "application/typescript" | "text/typescript" => {
            lang("typescript", "text/x-typescript")
        }
        "text/x-tsx" => lang("tsx", "text/x-tsx"),
        "text/javascript" | "application/javascript" | "application/x-javascript" | "text/jsx" => {
            lang("javascript", "text/javascript")
        }
        "text/x-go" => lang("go", "text/x-go"),
        "text/x-elixir" => lang("elixir", "text/x-elixir"),
        "text/x-shellscript" | "application/x-sh" => lang("shell", "text/x-shellscript"),
        _ => return None,
    })
}

/// Lower-case extension of the file name in `path`, if any.
pub(crate) fn extension(path: &str) -> Option<String> {
    let name = path.rsplit(['/', '\\']).next().unwrap_or(path);
    let (stem, ext) = name.rsplit_once('.')?;
    if stem.is_empty() || ext.is_empty() || ext.len() > 10 {
        return None;
    }
    Some(ext.to_ascii_lowercase())
}

/// What the extension says, before looking at the content.
fn by_extension(ext: &str) -> Option<Detected> {
    use FileKind::*;
    Some(match ext {
        "json" | "geojson" | "har" | "ipynb" | "webmanifest" => {
            Detected::new(Json, "application/json", None)
        }
        "jsonl" | "ndjson" => Detected::new(JsonLines, "application/x-ndjson", None),
        "csv" => Detected::new(Csv, "text/csv", None),
        "tsv" | "tab" => Detected::new(Tsv, "text/tab-separated-values", None),
        "sql" => Detected::new(SqlDump, "application/sql", None),
        "sqlite" | "sqlite3" | "db" | "db3" => {
            Detected::new(Sqlite, "application/vnd.sqlite3", None)
        }
        "log" => Detected::new(Log, "text/x-log", None),
        "md" | "markdown" | "mdx" | "mkd" => Detected::new(Markdown, "text/markdown", None),
        "png" => Detected::new(Image, "image/png", None),
        "jpg" | "jpeg" => Detected::new(Image, "image/jpeg", None),
        "gif" => Detected::new(Image, "image/gif", None),
        "webp" => Detected::new(Image, "image/webp", None),
        "bmp" => Detected::new(Image, "image/bmp", None),
        "yaml" | "yml" => Detected::new(Text, "application/yaml", None),
        "toml" => Detected::new(Text, "application/toml", None),
        "xml" => Detected::new(Text, "application/xml", None),
        "svg" => Detected::new(Text, "image/svg+xml", None),
        "ini" | "cfg" | "conf" | "env" | "properties" => Detected::new(Text, "text/plain", None),
        "rst" | "adoc" => Detected::new(Text, "text/plain", None),
        "pdf" => Detected::new(Binary, "application/pdf", None),
        "zip" | "jar" | "docx" | "xlsx" | "pptx" | "whl" => {
            Detected::new(Binary, "application/zip", None)
        }
        "gz" | "tgz" => Detected::new(Binary, "application/gzip", None),
        _ => {
            let l = code_by_extension(ext)?;
            Detected::new(Code, l.mime, Some(l.name))
        }
    })
}

/// What a declared MIME type says.
fn by_mime(mime: &str) -> Option<Detected> {
    use FileKind::*;
    let m = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    Some(match m.as_str() {
        "application/json" | "text/json" => Detected::new(Json, "application/json", None),
        "application/x-ndjson"
        | "application/jsonl"
        | "application/jsonlines"
        | "application/x-jsonlines" => Detected::new(JsonLines, "application/x-ndjson", None),
        "text/csv" | "application/csv" => Detected::new(Csv, "text/csv", None),
        "text/tab-separated-values" => Detected::new(Tsv, "text/tab-separated-values", None),
        "application/sql" | "text/x-sql" => Detected::new(SqlDump, "application/sql", None),
        "application/vnd.sqlite3" | "application/x-sqlite3" => {
            Detected::new(Sqlite, "application/vnd.sqlite3", None)
        }
        "text/markdown" | "text/x-markdown" => Detected::new(Markdown, "text/markdown", None),
        "text/x-log" => Detected::new(Log, "text/x-log", None),
        m if m.ends_with("+json") => Detected::new(Json, "application/json", None),
        m if m.starts_with("image/") && m != "image/svg+xml" => Detected::new(Image, m, None),
        m => {
            let l = code_by_mime(m)?;
            Detected::new(Code, l.mime, Some(l.name))
        }
    })
}

/// Whether `bytes` are text: no NUL and valid UTF-8 in the sniffed prefix (a character cut at
/// the very end of the prefix is fine).
pub(crate) fn looks_textual(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(SNIFF_BYTES)];
    if head.contains(&0) {
        return false;
    }
    match std::str::from_utf8(head) {
        Ok(_) => true,
        // error_len() None: an incomplete character at the end of the prefix.
        Err(e) => e.error_len().is_none() && head.len() - e.valid_up_to() < 4,
    }
}

/// The valid UTF-8 prefix of the sniffed head.
fn head_text(bytes: &[u8]) -> &str {
    let head = &bytes[..bytes.len().min(SNIFF_BYTES)];
    match std::str::from_utf8(head) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or(""),
    }
}

/// Detection on content that is already free of line-number prefixes.
pub(crate) fn detect_raw(path: Option<&str>, mime: Option<&str>, bytes: &[u8]) -> Detected {
    let textual = looks_textual(bytes);
    // "MZ…", "ID3…", "GIF89a…" can start a text file too: such signatures need binary content.
    let magic = binary::magic(bytes).filter(|m| !(m.weak() && textual));
    let from_content = || sniff(bytes, magic, textual);

    if let Some(d) = path.and_then(extension).and_then(|e| by_extension(&e)) {
        return reconcile(d, magic, textual, bytes, from_content);
    }
    if let Some(d) = mime.and_then(by_mime) {
        return reconcile(d, magic, textual, bytes, from_content);
    }
    from_content()
}

/// A kind claimed by the path or MIME type, checked against the content where the content
/// decides (binary formats need their magic; text kinds need text).
fn reconcile(
    claimed: Detected,
    magic: Option<Magic>,
    textual: bool,
    bytes: &[u8],
    from_content: impl Fn() -> Detected,
) -> Detected {
    use FileKind::*;
    match claimed.kind {
        Sqlite => match magic {
            Some(Magic::Sqlite) => claimed,
            _ => from_content(),
        },
        // The content says which image or binary format (or that it is text after all).
        Image | Binary => from_content(),
        _ => {
            if !textual || magic.is_some() {
                return from_content();
            }
            if claimed.kind == Json && bytes.len() > 1 && sniff_jsonl(head_text(bytes)) {
                // A ".json" file holding one JSON value per line.
                return Detected::new(JsonLines, "application/x-ndjson", None);
            }
            claimed
        }
    }
}

/// Detection by content alone.
fn sniff(bytes: &[u8], magic: Option<Magic>, textual: bool) -> Detected {
    use FileKind::*;
    if let Some(m) = magic {
        if m == Magic::Sqlite {
            return Detected::new(Sqlite, "application/vnd.sqlite3", None);
        }
        if m.is_image() {
            return Detected::new(Image, m.mime(), None);
        }
        return Detected::new(Binary, m.mime(), None);
    }
    if !textual {
        return Detected::new(Binary, "application/octet-stream", None);
    }
    let text = head_text(bytes);
    let whole = text.len() == bytes.len();
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Detected::new(Text, "text/plain", None);
    }
    if let Some(lang) = shebang(trimmed) {
        return Detected::new(Code, lang.mime, Some(lang.name));
    }
    if sniff_jsonl(text) {
        return Detected::new(JsonLines, "application/x-ndjson", None);
    }
    let starts_json = trimmed.starts_with('{') || trimmed.starts_with('[');
    if starts_json && json_prefix_ok(trimmed, whole) {
        return Detected::new(Json, "application/json", None);
    }
    if let Some(delim) = sniff_delimiter(text, whole) {
        return if delim == b'\t' {
            Detected::new(Tsv, "text/tab-separated-values", None)
        } else {
            Detected::new(Csv, "text/csv", None)
        };
    }
    if sniff_log(text) {
        return Detected::new(Log, "text/x-log", None);
    }
    if starts_json && trimmed.starts_with("{\"") {
        return Detected::new(Json, "application/json", None);
    }
    if sniff_sql(trimmed) {
        return Detected::new(SqlDump, "application/sql", None);
    }
    if sniff_markdown(text) {
        return Detected::new(Markdown, "text/markdown", None);
    }
    if starts_json && (trimmed.starts_with("[[") || trimmed.starts_with("[{")) {
        return Detected::new(Json, "application/json", None);
    }
    Detected::new(Text, "text/plain", None)
}

/// A shebang naming an interpreter we know.
fn shebang(text: &str) -> Option<Lang> {
    let first = text.lines().next()?;
    let rest = first.strip_prefix("#!")?;
    let mut words = rest.split_whitespace();
    let mut prog = words.next()?.rsplit('/').next()?;
    if prog == "env" {
        prog = words.find(|w| !w.starts_with('-'))?;
    }
    let base = prog.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    Some(match base {
        "python" | "pypy" => lang("python", "text/x-python"),
        "node" | "nodejs" | "bun" => lang("javascript", "text/javascript"),
        "deno" | "ts-node" | "tsx" => lang("typescript", "text/x-typescript"),
        "sh" | "bash" | "zsh" | "dash" | "ksh" | "fish" => lang("shell", "text/x-shellscript"),
        "ruby" => lang("ruby", "text/x-ruby"),
        "perl" => lang("perl", "text/x-perl"),
        "elixir" => lang("elixir", "text/x-elixir"),
        "php" => lang("php", "application/x-php"),
        _ => return None,
    })
}

/// The first value in `text` parses as JSON up to where the text ends (a cut at the sniff
/// limit is fine) and nothing but whitespace follows it.
fn json_prefix_ok(text: &str, whole: bool) -> bool {
    use serde::de::IgnoredAny;
    let mut de = serde_json::Deserializer::from_str(text);
    match serde::Deserialize::deserialize(&mut de) {
        Ok(IgnoredAny) => de.end().is_ok(),
        Err(e) => e.is_eof() && !whole,
    }
}

/// At least two of the first lines, and at least 80% of them, are JSON objects or arrays.
pub(crate) fn sniff_jsonl(text: &str) -> bool {
    use serde::de::IgnoredAny;
    let mut lines = 0usize;
    let mut good = 0usize;
    let complete = line_prefix(text, text.len());
    for line in complete.lines().filter(|l| !l.trim().is_empty()).take(20) {
        let t = line.trim();
        lines += 1;
        if (t.starts_with('{') || t.starts_with('['))
            && serde_json::from_str::<IgnoredAny>(t).is_ok()
        {
            good += 1;
        }
    }
    // The last sniffed line may be cut by the sniff limit.
    good >= 2 && good * 5 >= (lines - usize::from(lines > good)) * 4
}

/// A delimiter (',', '\t' or ';') that splits the first records into the same number (at least
/// two) of fields, over at least three records; `None` for prose.
pub(crate) fn sniff_delimiter(text: &str, whole: bool) -> Option<u8> {
    let sample = if whole {
        text
    } else {
        line_prefix(text, text.len())
    };
    let mut best: Option<(u8, usize)> = None;
    for delim in [b',', b'\t', b';'] {
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(delim)
            .has_headers(false)
            .flexible(true)
            .from_reader(sample.as_bytes());
        let mut record = csv::ByteRecord::new();
        let mut counts = Vec::new();
        let mut field_bytes = 0usize;
        let mut fields = 0usize;
        while counts.len() < 30 {
            match reader.read_byte_record(&mut record) {
                Ok(true) => {
                    if record.len() == 1 && record.get(0).is_some_and(<[u8]>::is_empty) {
                        continue; // blank line
                    }
                    counts.push(record.len());
                    fields += record.len();
                    field_bytes += record.iter().map(<[u8]>::len).sum::<usize>();
                }
                _ => break,
            }
        }
        if counts.len() < 3 {
            continue;
        }
        let n = counts[0];
        if n < 2 || !counts.iter().all(|&c| c == n) {
            continue;
        }
        // Prose with commas has long "fields".
        if fields == 0 || field_bytes / fields > 48 {
            continue;
        }
        if best.is_none_or(|(_, m)| n > m) {
            best = Some((delim, n));
        }
    }
    best.map(|(d, _)| d)
}

/// Most of the first lines start with a timestamp or carry an upper-case level word.
fn sniff_log(text: &str) -> bool {
    let mut lines = 0usize;
    let mut hits = 0usize;
    for line in text.lines().filter(|l| !l.trim().is_empty()).take(200) {
        lines += 1;
        let stamped = find_timestamp(line).is_some_and(|(start, _)| start <= 2);
        if stamped || level_of(line, true).is_some() {
            hits += 1;
        }
    }
    lines >= 2 && hits * 2 >= lines
}

/// Starts with SQL statements a dump has.
fn sniff_sql(text: &str) -> bool {
    let mut statements = 0usize;
    let mut lines = 0usize;
    for line in text.lines().take(200) {
        let t = line.trim_start();
        if t.is_empty() || t.starts_with("--") {
            continue;
        }
        lines += 1;
        let upper: String = t.chars().take(16).collect::<String>().to_ascii_uppercase();
        if [
            "CREATE TABLE",
            "INSERT INTO",
            "CREATE INDEX",
            "DROP TABLE",
            "ALTER TABLE",
            "COPY ",
        ]
        .iter()
        .any(|k| upper.starts_with(k))
        {
            statements += 1;
        }
    }
    statements >= 2 || (statements == 1 && lines <= 3)
}

/// ATX headings (at most three spaces of indentation) or code fences.
fn sniff_markdown(text: &str) -> bool {
    let mut headings = 0usize;
    let mut fences = 0usize;
    let mut lists = 0usize;
    for line in text.lines().take(500) {
        let indent = line.len() - line.trim_start_matches(' ').len();
        if indent > 3 {
            continue;
        }
        let t = line.trim_start();
        if t.starts_with("```") || t.starts_with("~~~") {
            fences += 1;
        } else if crate::markdown::atx(line).is_some_and(|(_, text)| !text.is_empty()) {
            headings += 1;
        } else if t.starts_with("- ") || t.starts_with("* ") {
            lists += 1;
        }
    }
    fences >= 2 || headings >= 2 || (headings == 1 && (fences > 0 || lists > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(path: Option<&str>, bytes: &[u8]) -> (FileKind, String, Option<&'static str>) {
        let d = detect_raw(path, None, bytes);
        (d.kind, d.mime, d.language)
    }

    #[test]
    fn extension_first() {
        assert_eq!(d(Some("src/main.rs"), b"fn main() {}").0, FileKind::Code);
        assert_eq!(d(Some("src/main.rs"), b"fn main() {}").2, Some("rust"));
        assert_eq!(d(Some("a/b.PY"), b"x = 1").2, Some("python"));
        assert_eq!(d(Some("x.tsx"), b"").2, Some("tsx"));
        assert_eq!(d(Some("data.csv"), b"a\n1\n").0, FileKind::Csv);
        assert_eq!(d(Some("notes.md"), b"hi").0, FileKind::Markdown);
        assert_eq!(d(Some("x.json"), b"{}").1, "application/json");
        assert_eq!(d(Some("Makefile"), b"all:\n\techo").0, FileKind::Text);
    }

    #[test]
    fn binary_content_beats_a_text_extension() {
        assert_eq!(d(Some("x.csv"), b"a,b\x00c").0, FileKind::Binary);
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10\0\0\0\x10\x08\x06\0\0\0";
        assert_eq!(d(Some("x.json"), png).0, FileKind::Image);
        // A ".png" that is text is sniffed.
        assert_eq!(d(Some("x.png"), b"hello").0, FileKind::Text);
        // A ".db" that is not SQLite.
        assert_eq!(d(Some("x.db"), b"{\"a\": 1}").0, FileKind::Json);
    }

    #[test]
    fn mime_when_no_extension() {
        let r = detect_raw(None, Some("text/csv; charset=utf-8"), b"a,b\n1,2");
        assert_eq!(r.kind, FileKind::Csv);
        let r = detect_raw(None, Some("application/vnd.api+json"), b"{}");
        assert_eq!(r.kind, FileKind::Json);
        let r = detect_raw(Some("x.rs"), Some("text/csv"), b"fn a() {}");
        assert_eq!(r.kind, FileKind::Code, "extension wins over MIME");
    }

    #[test]
    fn sniffs_content() {
        assert_eq!(d(None, b"{\"a\": [1, 2]}").0, FileKind::Json);
        assert_eq!(d(None, b"  [1, 2, 3]\n").0, FileKind::Json);
        assert_eq!(
            d(None, b"{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n").0,
            FileKind::JsonLines
        );
        assert_eq!(d(None, b"id,name\n1,a\n2,b\n3,c\n").0, FileKind::Csv);
        assert_eq!(d(None, b"id\tname\n1\ta\n2\tb\n").0, FileKind::Tsv);
        assert_eq!(
            d(
                None,
                b"2024-01-01T00:00:00Z INFO start\n2024-01-01T00:00:01Z ERROR boom\n"
            )
            .0,
            FileKind::Log
        );
        assert_eq!(
            d(
                None,
                b"[2024-01-01 00:00:00] INFO a\n[2024-01-01 00:00:01] WARN b\n"
            )
            .0,
            FileKind::Log
        );
        assert_eq!(
            d(None, b"# Title\n\nSome text.\n\n## Part\n").0,
            FileKind::Markdown
        );
        assert_eq!(
            d(None, b"#!/usr/bin/env python3\nprint(1)\n"),
            (FileKind::Code, "text/x-python".into(), Some("python"))
        );
        assert_eq!(
            d(
                None,
                b"CREATE TABLE t (a INT);\nINSERT INTO t VALUES (1);\n"
            )
            .0,
            FileKind::SqlDump
        );
        assert_eq!(d(None, b"Hello, world. This is prose.\n").0, FileKind::Text);
        assert_eq!(d(None, b"").0, FileKind::Text);
        assert_eq!(d(None, b"\xff\xfe\x00").0, FileKind::Binary);
        assert_eq!(d(None, b"SQLite format 3\0rest").0, FileKind::Sqlite);
        assert_eq!(d(None, b"%PDF-1.7\n...").1, "application/pdf");
    }

    #[test]
    fn text_that_starts_like_a_weak_signature_stays_text() {
        let text = b"MZ is not an executable here. This is a long enough line of text to be seen as prose.\n";
        assert_eq!(d(None, text).0, FileKind::Text);
        assert_eq!(
            d(Some("notes.txt"), b"ID3 tags explained\n").0,
            FileKind::Text
        );
        assert_eq!(d(None, b"GIF89a is an image format\n").0, FileKind::Text);
        // With binary content the signature counts.
        let mut gif = b"GIF89a\x20\x03\x58\x02\xf7\0\0".to_vec();
        gif.extend_from_slice(&[0xff; 16]);
        assert_eq!(d(None, &gif).0, FileKind::Image);
    }

    #[test]
    fn indented_hashes_are_not_headings() {
        let out =
            "==> app\nCompiling 3 files\n         # type: dynamic()\n         # from: lib/x.ex:1\n";
        assert_eq!(d(None, out.as_bytes()).0, FileKind::Text);
    }

    #[test]
    fn prose_with_commas_is_not_csv() {
        let prose = "Well, this is a sentence, with commas, that goes on for a while and keeps going.\n\
                     And here, another one, equally long, with a similar number of commas in it.\n\
                     Finally, a third, to make three lines, all with commas, nothing tabular.\n";
        assert_eq!(d(None, prose.as_bytes()).0, FileKind::Text);
    }

    #[test]
    fn truncated_json_prefix_still_counts_as_json() {
        let mut big = String::from("{\"items\": [");
        while big.len() < SNIFF_BYTES + 100 {
            big.push_str("{\"k\": \"some value here\"},");
        }
        assert_eq!(d(None, big.as_bytes()).0, FileKind::Json);
        // The same text that ends there is broken JSON: not sniffed as a parse success, but it
        // still starts with {" so it is JSON (malformed).
        assert_eq!(d(None, b"{\"a\": ").0, FileKind::Json);
    }

    #[test]
    fn dot_json_with_lines_is_jsonl() {
        assert_eq!(
            d(Some("x.json"), b"{\"a\":1}\n{\"a\":2}\n").0,
            FileKind::JsonLines
        );
    }

    #[test]
    fn extensions() {
        assert_eq!(extension("/a/b/c.tar.gz").as_deref(), Some("gz"));
        assert_eq!(extension(".bashrc"), None);
        assert_eq!(extension("dir.d/file"), None);
        assert_eq!(extension("C:\\x\\y.RS").as_deref(), Some("rs"));
    }
}
