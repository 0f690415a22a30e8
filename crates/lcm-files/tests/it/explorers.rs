//! End-to-end tests of `lcm_files::explore` on generated samples of every kind, on the real
//! Claude Code transcripts in `<repo>/../shared/data/transcripts/claude-code` (skipped with a
//! message when absent), and on arbitrary input (property tests).

use std::collections::BTreeMap;
use std::path::PathBuf;

use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_files::{Exploration, ExploreInput, FileKind, detect, explore, strip_line_numbers};
use proptest::prelude::*;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn run(path: Option<&str>, bytes: &[u8], max_tokens: usize) -> Exploration {
    let e = explore(
        &ExploreInput {
            path,
            mime_type: None,
            bytes,
        },
        &counter(),
        max_tokens,
    );
    let tokens = counter().count_text(&e.summary);
    assert!(
        tokens <= max_tokens,
        "summary of {path:?} is {tokens} tokens, over the cap {max_tokens}:\n{}",
        e.summary
    );
    e
}

// ---------------------------------------------------------------------------------------------
// Generated samples

#[test]
fn csv_12000_rows_names_every_column_and_counts_exactly() {
    let mut csv = String::from("id,name,price,date,category,in_stock,notes\n");
    for i in 0..12_000u32 {
        // Prices from 0.50 to 999.99; one note with an embedded newline and a comma.
        let price = if i == 0 {
            "0.50".to_string()
        } else if i == 11_999 {
            "999.99".to_string()
        } else {
            format!("{}.{:02}", 1 + i % 900, i % 100)
        };
        let notes = if i == 7 {
            "\"multi-line, quoted\nnote\"".to_string()
        } else {
            String::new()
        };
        csv.push_str(&format!(
            "{},Product {},{price},2023-{:02}-{:02},{},{},{notes}\n",
            i + 1,
            i + 1,
            1 + i % 12,
            1 + i % 28,
            ["tools", "garden", "kitchen", "toys"][(i % 4) as usize],
            i % 3 != 0
        ));
    }
    let e = run(Some("exports/products.csv"), csv.as_bytes(), 600);
    assert_eq!(e.kind, FileKind::Csv);
    assert_eq!(e.mime_type, "text/csv");
    let s = &e.summary;
    assert!(s.starts_with("CSV: 12,000 rows × 7 columns"), "{s}");
    for col in [
        "id", "name", "price", "date", "category", "in_stock", "notes",
    ] {
        assert!(s.contains(col), "column {col} missing:\n{s}");
    }
    assert!(s.contains("3. price: float, range 0.50..999.99"), "{s}");
    assert!(s.contains("1. id: integer, range 1..12000"), "{s}");
    assert!(s.contains("4. date: date, 2023-01-01..2023-12-28"), "{s}");
    assert!(
        s.contains("5. category: text, 4 distinct: garden (3,000), kitchen (3,000), tools (3,000), toys (3,000)"),
        "{s}"
    );
    assert!(
        s.contains("6. in_stock: boolean, 2 distinct: true (8,000), false (4,000)"),
        "{s}"
    );
    assert!(s.contains("7. notes: text, 11,999 empty"), "{s}");

    // Under a tight cap the column list survives and the samples go first.
    let tight = run(Some("exports/products.csv"), csv.as_bytes(), 80);
    assert!(
        tight.summary.starts_with("CSV: 12,000 rows × 7 columns"),
        "{}",
        tight.summary
    );
    assert!(
        tight
            .summary
            .contains("Columns: id, name, price, date, category, in_stock, notes"),
        "{}",
        tight.summary
    );
    assert!(!tight.summary.contains("Sample rows"), "{}", tight.summary);
}

#[test]
fn tsv_without_extension_is_sniffed() {
    let mut tsv = String::from("user\tscore\n");
    for i in 0..50 {
        tsv.push_str(&format!("u{i}\t{}\n", i * 2));
    }
    let e = run(None, tsv.as_bytes(), 300);
    assert_eq!(e.kind, FileKind::Tsv);
    assert!(
        e.summary.starts_with("TSV: 50 rows × 2 columns"),
        "{}",
        e.summary
    );
    assert!(
        e.summary.contains("2. score: integer, range 0..98"),
        "{}",
        e.summary
    );
}

#[test]
fn json_key_structure() {
    let mut orders = Vec::new();
    for i in 0..40 {
        let coupon = if i % 4 == 0 {
            r#","coupon":"SAVE10""#
        } else {
            ""
        };
        orders.push(format!(
            r#"{{"id":{i},"total":{}.5,"items":[{{"sku":"A{i}","qty":{}}}],"status":"{}"{coupon}}}"#,
            i * 3,
            1 + i % 3,
            if i % 2 == 0 { "paid" } else { "open" }
        ));
    }
    let json = format!(
        r#"{{"customer": {{"name": "Ada", "address": {{"city": "London", "zip": null}}}}, "orders": [{}], "version": 2}}"#,
        orders.join(",")
    );
    let e = run(Some("data/customer.json"), json.as_bytes(), 800);
    assert_eq!(e.kind, FileKind::Json);
    let s = &e.summary;
    assert!(s.starts_with("JSON: object with 3 keys"), "{s}");
    assert!(s.contains("  customer: object"), "{s}");
    assert!(s.contains("    name: string; e.g. \"Ada\""), "{s}");
    assert!(s.contains("    address: object"), "{s}");
    assert!(s.contains("      city: string"), "{s}");
    assert!(s.contains("      zip: null"), "{s}");
    assert!(s.contains("  orders: array[40] of object"), "{s}");
    assert!(s.contains("    id: integer, 0..39"), "{s}");
    assert!(s.contains("    total: float, 0.5..117.5"), "{s}");
    assert!(s.contains("    items: array[1] of object"), "{s}");
    assert!(s.contains("      sku: string"), "{s}");
    assert!(
        s.contains("    status: string; values: \"open\" (20), \"paid\" (20)"),
        "{s}"
    );
    assert!(s.contains("    coupon: string (in 10 of 40)"), "{s}");
    assert!(s.contains("  version: integer"), "{s}");
}

#[test]
fn jsonl_counts_every_line() {
    let mut jsonl = String::new();
    for i in 0..3_000 {
        jsonl.push_str(&format!(
            r#"{{"seq":{i},"role":"{}"}}"#,
            ["user", "assistant"][i % 2]
        ));
        jsonl.push('\n');
    }
    jsonl.push_str("{oops\n");
    let e = run(Some("events.ndjson"), jsonl.as_bytes(), 400);
    assert_eq!(e.kind, FileKind::JsonLines);
    assert!(
        e.summary.starts_with("JSON Lines: 3,000 records"),
        "{}",
        e.summary
    );
    assert!(e.summary.contains("1 invalid line"), "{}", e.summary);
    assert!(e.summary.contains("Invalid line 3001"), "{}", e.summary);
    assert!(e.summary.contains("seq: integer, 0..2999"), "{}", e.summary);
}

const RUST_SRC: &str = r#"//! A small service.
use std::sync::Arc;
use tokio::sync::Mutex;

pub struct Service {
    name: String,
    hits: Arc<Mutex<u64>>,
}

pub enum Reply { Ok(String), NotFound, Failed { code: u16 } }

pub trait Handler: Send {
    fn handle(&self, req: &Request) -> Reply;
}

impl Service {
    pub fn new(name: impl Into<String>) -> Self {
        Service { name: name.into(), hits: Arc::default() }
    }

    pub async fn serve(&self, port: u16) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn parse_port(text: &str) -> Option<u16> {
    text.parse().ok()
}
"#;

const PYTHON_SRC: &str = r#"import json
from pathlib import Path

DEFAULT_LIMIT = 100

class Repository:
    """Stores things."""

    def __init__(self, root: Path, limit: int = DEFAULT_LIMIT) -> None:
        self.root = root

    def load(self, key: str) -> dict:
        return json.loads((self.root / key).read_text())

def open_repository(path: str) -> Repository:
    return Repository(Path(path))
"#;

const TS_SRC: &str = r#"import express from "express";
import type { Request, Response } from "express";

export interface User {
  id: number;
  name: string;
  greet(other: User): string;
}

export type UserId = User["id"];

export class UserService {
  private users = new Map<UserId, User>();
  find(id: UserId): User | undefined {
    return this.users.get(id);
  }
}

export async function listUsers(req: Request, res: Response): Promise<void> {
  res.json([]);
}

export const router = express.Router();
"#;

#[test]
fn rust_python_typescript_definitions_with_signatures() {
    let e = run(Some("src/service.rs"), RUST_SRC.as_bytes(), 800);
    assert_eq!(
        (e.kind, e.language.as_deref()),
        (FileKind::Code, Some("rust"))
    );
    assert_eq!(e.mime_type, "text/x-rust");
    let s = &e.summary;
    for expected in [
        "Imports (2): std::sync::Arc; tokio::sync::Mutex",
        "L5 pub struct Service { name: String, hits: Arc<Mutex<u64>> }",
        "L10 pub enum Reply { Ok(..), NotFound, Failed { .. } }",
        "L12 pub trait Handler: Send",
        "    L13 fn handle(&self, req: &Request) -> Reply",
        "L16 impl Service",
        "    L17 pub fn new(name: impl Into<String>) -> Self",
        "    L21 pub async fn serve(&self, port: u16) -> std::io::Result<()>",
        "L26 pub fn parse_port(text: &str) -> Option<u16>",
    ] {
        assert!(s.contains(expected), "missing {expected:?} in:\n{s}");
    }

    let e = run(Some("repo/store.py"), PYTHON_SRC.as_bytes(), 800);
    assert_eq!(
        (e.kind, e.language.as_deref()),
        (FileKind::Code, Some("python"))
    );
    let s = &e.summary;
    for expected in [
        "Imports (2): import json; from pathlib import Path",
        "L4 DEFAULT_LIMIT = 100",
        "L6 class Repository",
        "    L9 def __init__(self, root: Path, limit: int = DEFAULT_LIMIT) -> None",
        "    L12 def load(self, key: str) -> dict",
        "L15 def open_repository(path: str) -> Repository",
    ] {
        assert!(s.contains(expected), "missing {expected:?} in:\n{s}");
    }

    let e = run(Some("web/users.ts"), TS_SRC.as_bytes(), 800);
    assert_eq!(
        (e.kind, e.language.as_deref()),
        (FileKind::Code, Some("typescript"))
    );
    let s = &e.summary;
    for expected in [
        "Imports (2): express from \"express\"; type { Request, Response } from \"express\"",
        "L4 export interface User",
        "    L7 greet(other: User): string",
        "L10 export type UserId = User[\"id\"]",
        "L12 export class UserService",
        "    L14 find(id: UserId): User | undefined",
        "L19 export async function listUsers(req: Request, res: Response): Promise<void>",
        "L23 export const router = express.Router()",
    ] {
        assert!(s.contains(expected), "missing {expected:?} in:\n{s}");
    }
}

#[test]
fn log_with_three_errors_among_ten_thousand_lines() {
    let error_at = [1_234usize, 5_000, 9_999]; // 1-based line numbers
    let mut log = String::new();
    let mut warns = 0;
    for n in 1..=10_000usize {
        let ts = format!(
            "2024-06-01T{:02}:{:02}:{:02}.000Z",
            n / 3600,
            n / 60 % 60,
            n % 60
        );
        if error_at.contains(&n) {
            log.push_str(&format!("{ts} ERROR db: connection {n} refused\n"));
        } else if n % 100 == 0 {
            warns += 1;
            log.push_str(&format!("{ts} WARN slow query took {}ms\n", n % 977));
        } else {
            log.push_str(&format!(
                "{ts} INFO request id={n} served in {}ms\n",
                n % 37
            ));
        }
    }
    let e = run(Some("/var/log/app.log"), log.as_bytes(), 600);
    assert_eq!(e.kind, FileKind::Log);
    let s = &e.summary;
    assert!(s.starts_with("Log: 10,000 lines"), "{s}");
    assert!(
        s.contains("2024-06-01T00:00:01.000Z … 2024-06-01T02:46:40.000Z"),
        "{s}"
    );
    let info = 10_000 - 3 - warns;
    assert!(
        s.contains(&format!(
            "Levels: ERROR 3, WARN {warns}, INFO {}",
            fmt_thousands(info)
        )),
        "{s}"
    );
    for n in error_at {
        assert!(
            s.contains(&format!("L{n}: "))
                && s.contains(&format!("ERROR db: connection {n} refused")),
            "error line {n} missing:\n{s}"
        );
    }
    assert!(s.contains("INFO request id=<n> served in <n>ms"), "{s}");

    // Without the extension, the content says it is a log.
    let e = run(None, log.as_bytes(), 600);
    assert_eq!(e.kind, FileKind::Log);
}

fn fmt_thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn sqlite_file_tables_columns_and_row_counts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.db");
    {
        let db = rusqlite::Connection::open(&path).unwrap();
        db.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT);
             CREATE TABLE orders (id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id), total REAL, note TEXT);
             CREATE TABLE kv (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID;
             CREATE INDEX idx_orders_user ON orders(user_id);
             CREATE VIEW big_orders AS SELECT * FROM orders WHERE total > 100;",
        )
        .unwrap();
        // A table whose CREATE statement is longer than a page: its schema record overflows.
        let cols: Vec<String> = (0..400)
            .map(|i| format!("column_number_{i} TEXT"))
            .collect();
        db.execute_batch(&format!("CREATE TABLE wide ({});", cols.join(", ")))
            .unwrap();
        let tx = db.unchecked_transaction().unwrap();
        for i in 0..1_000 {
            tx.execute(
                "INSERT INTO users (name, email) VALUES (?1, ?2)",
                (format!("user {i}"), format!("u{i}@example.com")),
            )
            .unwrap();
        }
        for i in 0..5_000u32 {
            tx.execute(
                "INSERT INTO orders (user_id, total, note) VALUES (?1, ?2, ?3)",
                (
                    i % 1_000 + 1,
                    f64::from(i) * 0.75,
                    "x".repeat((i % 300) as usize),
                ),
            )
            .unwrap();
        }
        for i in 0..250 {
            tx.execute(
                "INSERT INTO kv (k, v) VALUES (?1, ?2)",
                (format!("key-{i:04}"), vec![7u8; 100]),
            )
            .unwrap();
        }
        tx.execute("INSERT INTO wide (column_number_0) VALUES ('a')", ())
            .unwrap();
        tx.execute("INSERT INTO wide (column_number_0) VALUES ('b')", ())
            .unwrap();
        tx.commit().unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    // No path: the magic bytes say SQLite.
    let e = run(None, &bytes, 1_500);
    assert_eq!(e.kind, FileKind::Sqlite);
    assert_eq!(e.mime_type, "application/vnd.sqlite3");
    let s = &e.summary;
    assert!(
        s.starts_with("SQLite database: 4 tables, 6,252 rows"),
        "{s}"
    );
    assert!(s.contains("Page size 4,096"), "{s}");
    assert!(
        s.contains("  users (1,000 rows): id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT"),
        "{s}"
    );
    assert!(
        s.contains("  orders (5,000 rows): id INTEGER PRIMARY KEY, user_id INTEGER REFERENCES users(id), total REAL, note TEXT"),
        "{s}"
    );
    assert!(
        s.contains("  kv (250 rows): k TEXT PRIMARY KEY, v BLOB"),
        "{s}"
    );
    assert!(
        s.contains("  wide (2 rows): column_number_0 TEXT, column_number_1 TEXT"),
        "{s}"
    );
    assert!(s.contains("Indexes (1): idx_orders_user on orders"), "{s}");
    assert!(s.contains("Views (1): big_orders"), "{s}");

    // A truncated copy: what can be read, and a note; never a panic.
    let half = &bytes[..bytes.len() / 2];
    let e = run(Some("shop.db"), half, 1_500);
    assert_eq!(e.kind, FileKind::Sqlite);
    assert!(e.summary.contains("File truncated"), "{}", e.summary);
    // Every prefix length and some corruption: no panic.
    for len in (0..bytes.len().min(20_000)).step_by(97) {
        let _ = run(Some("shop.db"), &bytes[..len], 300);
    }
    let mut corrupt = bytes.clone();
    for i in (100..corrupt.len()).step_by(53) {
        corrupt[i] ^= 0x5a;
    }
    let _ = run(Some("shop.db"), &corrupt, 300);
}

#[test]
fn sql_dump() {
    let mut dump = String::from(
        "-- dump\nCREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT);\nCREATE TABLE books (id INTEGER, author_id INTEGER, title TEXT, PRIMARY KEY (id));\n",
    );
    for i in 0..100 {
        dump.push_str(&format!(
            "INSERT INTO authors VALUES ({i}, 'Author; {i}');\n"
        ));
    }
    dump.push_str("INSERT INTO books VALUES (1, 1, 'A (1)'), (2, 1, 'B'), (3, 2, 'It''s');\n");
    dump.push_str("CREATE INDEX books_author ON books(author_id);\n");
    let e = run(Some("backup.sql"), dump.as_bytes(), 500);
    assert_eq!(e.kind, FileKind::SqlDump);
    let s = &e.summary;
    assert!(
        s.starts_with("SQL dump: 2 tables created, 103 rows inserted, 104 statements"),
        "{s}"
    );
    assert!(
        s.contains("  authors (100 rows): id INTEGER PRIMARY KEY, name TEXT"),
        "{s}"
    );
    assert!(
        s.contains("  books (3 rows): id INTEGER, author_id INTEGER, title TEXT; PRIMARY KEY (id)"),
        "{s}"
    );
    assert!(s.contains("CREATE INDEX 1"), "{s}");
}

#[test]
fn markdown_outline() {
    let md = "# Guide\n\nWelcome.\n\n## Setup\n\n```bash\nmake\n```\n\n## Usage\n\n### Flags\n";
    let e = run(Some("README.md"), md.as_bytes(), 300);
    assert_eq!(e.kind, FileKind::Markdown);
    assert!(e.summary.contains("  # Guide (L1)"), "{}", e.summary);
    assert!(e.summary.contains("    ## Setup (L5)"), "{}", e.summary);
    assert!(e.summary.contains("      ### Flags (L13)"), "{}", e.summary);
    assert!(e.summary.contains("1 code block"), "{}", e.summary);
}

#[test]
fn png_header_gives_dimensions() {
    let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR".to_vec();
    png.extend_from_slice(&1920u32.to_be_bytes());
    png.extend_from_slice(&1080u32.to_be_bytes());
    png.extend_from_slice(&[8, 2, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
    png.extend_from_slice(&[0u8; 1000]);
    let e = run(Some("screenshot.png"), &png, 100);
    assert_eq!(e.kind, FileKind::Image);
    assert_eq!(e.mime_type, "image/png");
    assert!(
        e.summary
            .starts_with("Image: PNG 1920×1080 (8-bit RGB), 1.0 KiB"),
        "{}",
        e.summary
    );
    // Named .jpg but a PNG inside: the content decides.
    let e = run(Some("photo.jpg"), &png, 100);
    assert_eq!(e.mime_type, "image/png");
}

#[test]
fn invalid_utf8_and_random_bytes_are_binary() {
    let bytes: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let e = run(None, &bytes, 200);
    assert_eq!(e.kind, FileKind::Binary);
    assert_eq!(e.mime_type, "application/octet-stream");
    assert!(
        e.summary
            .starts_with("Binary: unrecognised binary data, 4.0 KiB"),
        "{}",
        e.summary
    );
    assert!(e.summary.contains("First bytes: "), "{}", e.summary);
    // Invalid UTF-8 in a ".txt".
    let e = run(Some("notes.txt"), b"caf\xe9 \xff\xfe au lait", 200);
    assert_eq!(e.kind, FileKind::Binary);
    assert!(e.summary.contains("15 bytes"), "{}", e.summary);
    // A gzip stream.
    let e = run(
        Some("x.gz"),
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03abc\x00\x00\x00\x00\x03\x00\x00\x00",
        200,
    );
    assert_eq!(
        (e.kind, e.mime_type.as_str()),
        (FileKind::Binary, "application/gzip")
    );
}

#[test]
fn empty_and_tiny_inputs() {
    let e = run(None, b"", 100);
    assert_eq!(e.kind, FileKind::Text);
    assert!(e.summary.starts_with("Text: 0 lines"), "{}", e.summary);
    for path in [
        None,
        Some("a.json"),
        Some("a.csv"),
        Some("a.rs"),
        Some("a.db"),
        Some("a.png"),
    ] {
        for bytes in [&b""[..], b"x", b"{", b"\xff", b"\n", b"\0"] {
            let e = run(path, bytes, 50);
            assert!(!e.summary.is_empty(), "{path:?} {bytes:?}");
        }
    }
    let e = run(None, b"x", 0);
    assert_eq!(e.summary, "");
}

#[test]
fn exploration_is_deterministic() {
    let inputs: [(&str, &[u8]); 3] = [
        ("a.ts", TS_SRC.as_bytes()),
        ("b.json", br#"{"a":[1,2,{"b":"c"}],"d":null}"#),
        ("c.py", PYTHON_SRC.as_bytes()),
    ];
    for (path, bytes) in inputs {
        let a = run(Some(path), bytes, 200);
        let b = run(Some(path), bytes, 200);
        assert_eq!(a, b);
    }
}

#[test]
fn detect_agrees_with_explore_and_mime_is_used() {
    let input = ExploreInput {
        path: None,
        mime_type: Some("application/json"),
        bytes: b"[1,2,3]",
    };
    let (kind, mime, lang) = detect(&input);
    assert_eq!(
        (kind, mime.as_str(), lang),
        (FileKind::Json, "application/json", None)
    );
    let e = explore(&input, &counter(), 100);
    assert_eq!(e.kind, kind);
}

// ---------------------------------------------------------------------------------------------
// Real Claude Code transcripts

fn transcripts_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/transcripts/claude-code")
}

/// One successful `Read` tool result.
struct Read {
    file_path: String,
    /// The tool result as the model saw it (line-numbered).
    result: String,
    /// The raw file text (`toolUseResult.file.content`) and its first line number.
    raw: String,
    start_line: usize,
    whole_file: bool,
}

fn tool_result_text(content: &serde_json::Value) -> String {
    match content {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(|t| t.as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn load_reads(dir: &std::path::Path) -> Vec<Read> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    let mut reads = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut paths: BTreeMap<String, String> = BTreeMap::new();
        for line in text.lines() {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(blocks) = entry.pointer("/message/content").and_then(|c| c.as_array()) else {
                continue;
            };
            for b in blocks {
                match b.get("type").and_then(|t| t.as_str()) {
                    Some("tool_use") if b.get("name").and_then(|n| n.as_str()) == Some("Read") => {
                        if let (Some(id), Some(p)) = (
                            b.get("id").and_then(|i| i.as_str()),
                            b.pointer("/input/file_path").and_then(|p| p.as_str()),
                        ) {
                            paths.insert(id.to_string(), p.to_string());
                        }
                    }
                    Some("tool_result") => {
                        let Some(path) = b
                            .get("tool_use_id")
                            .and_then(|i| i.as_str())
                            .and_then(|id| paths.get(id))
                        else {
                            continue;
                        };
                        let Some(file) = entry.pointer("/toolUseResult/file") else {
                            continue; // an error result ("File does not exist.")
                        };
                        let raw = file.get("content").and_then(|c| c.as_str()).unwrap_or("");
                        let start = file.get("startLine").and_then(|v| v.as_u64()).unwrap_or(1);
                        let num = file.get("numLines").and_then(|v| v.as_u64()).unwrap_or(0);
                        let total = file.get("totalLines").and_then(|v| v.as_u64()).unwrap_or(0);
                        reads.push(Read {
                            file_path: path.clone(),
                            result: tool_result_text(
                                b.get("content").unwrap_or(&serde_json::Value::Null),
                            ),
                            raw: raw.to_string(),
                            start_line: start as usize,
                            whole_file: start == 1 && num >= total,
                        });
                    }
                    _ => {}
                }
            }
        }
    }
    reads
}

/// A line of the raw file starts a definition as the grammar would see it.
fn has_definition_line(raw: &str, language: &str) -> bool {
    let starts: &[&str] = match language {
        "elixir" => &[
            "defmodule ",
            "def ",
            "defp ",
            "config ",
            "test ",
            "describe ",
        ],
        "javascript" | "typescript" | "tsx" => &[
            "function ",
            "class ",
            "const ",
            "let ",
            "var ",
            "export ",
            "module.exports",
            "async function ",
        ],
        "rust" => &[
            "fn ", "pub ", "struct ", "enum ", "impl ", "trait ", "mod ", "const ",
        ],
        "python" => &["def ", "class ", "async def "],
        _ => return false,
    };
    raw.lines().any(|l| starts.iter().any(|s| l.starts_with(s)))
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn real_claude_code_read_results() {
    let dir = transcripts_dir();
    if !dir.is_dir() {
        eprintln!(
            "SKIPPED real_claude_code_read_results: no transcripts at {} (the shared data folder is absent)",
            dir.display()
        );
        return;
    }
    let reads = load_reads(&dir);
    assert!(
        reads.len() >= 100,
        "expected the ~40 Read results per transcript, found {}",
        reads.len()
    );
    let cap = 700;
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let mut definitions_checked = 0usize;
    let mut code_files = 0usize;
    for read in &reads {
        let ext = read
            .file_path
            .rsplit('.')
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        let e = run(Some(&read.file_path), read.result.as_bytes(), cap);
        *by_kind
            .entry(format!(
                "{}{}",
                e.kind.as_str(),
                e.language
                    .as_deref()
                    .map(|l| format!("/{l}"))
                    .unwrap_or_default()
            ))
            .or_default() += 1;
        let ctx = || {
            format!(
                "{} (start line {}):\n{}",
                read.file_path, read.start_line, e.summary
            )
        };

        // The numbering is stripped: the tool result without it is the raw file text.
        if !read.raw.is_empty() {
            assert!(!e.summary.contains('→'), "numbering leaked into {}", ctx());
        }
        let expected_language = match ext.as_str() {
            "rs" => Some("rust"),
            "py" => Some("python"),
            "ts" => Some("typescript"),
            "tsx" => Some("tsx"),
            "js" | "mjs" | "cjs" => Some("javascript"),
            "ex" | "exs" => Some("elixir"),
            _ => None,
        };
        match ext.as_str() {
            "json" => assert_eq!(e.kind, FileKind::Json, "{}", ctx()),
            "jsonl" => assert_eq!(e.kind, FileKind::JsonLines, "{}", ctx()),
            "md" => assert_eq!(e.kind, FileKind::Markdown, "{}", ctx()),
            "sh" => assert_eq!(
                (e.kind, e.language.as_deref()),
                (FileKind::Code, Some("shell")),
                "{}",
                ctx()
            ),
            _ => {}
        }
        let Some(language) = expected_language else {
            continue;
        };
        assert_eq!(e.kind, FileKind::Code, "{}", ctx());
        assert_eq!(e.language.as_deref(), Some(language), "{}", ctx());
        code_files += 1;

        // Every listed definition "L<n> <signature>" is on line n of the file: the file's line,
        // whitespace collapsed, starts the signature (or, for a decorated definition, is in it).
        let raw_lines: Vec<&str> = read.raw.lines().collect();
        let mut listed = 0;
        for line in e.summary.lines() {
            let t = line.trim_start();
            let Some(rest) = t.strip_prefix('L') else {
                continue;
            };
            let Some((num, sig)) = rest.split_once(' ') else {
                continue;
            };
            let Ok(n) = num.parse::<usize>() else {
                continue;
            };
            if !line.starts_with("  ") {
                continue;
            }
            listed += 1;
            let file_line = n
                .checked_sub(read.start_line)
                .and_then(|i| raw_lines.get(i))
                .unwrap_or_else(|| panic!("L{n} is outside the read lines: {}", ctx()));
            let file_line = collapse(file_line);
            let sig = collapse(sig);
            let probe: String = file_line.chars().take(12).collect();
            let sig_start: String = sig.chars().take(12).collect();
            assert!(
                !probe.is_empty() && (sig.contains(&probe) || file_line.starts_with(&sig_start)),
                "definition L{n} {sig:?} does not match the file's line {file_line:?} in {}",
                ctx()
            );
            definitions_checked += 1;
        }
        if read.whole_file && has_definition_line(&read.raw, language) {
            assert!(listed > 0, "no definition listed for {}", ctx());
        }
    }
    eprintln!(
        "explored {} real Read results: {by_kind:?}; {code_files} code files, {definitions_checked} listed definitions checked against the file text",
        reads.len()
    );
    assert!(code_files >= 50, "{code_files}");
    assert!(definitions_checked >= 200, "{definitions_checked}");
    // Every real read strips to the raw file text.
    let stripped = reads
        .iter()
        .filter(|r| !r.raw.is_empty())
        .filter(|r| strip_line_numbers(&r.result).is_some_and(|s| s.trim_end() == r.raw.trim_end()))
        .count();
    let with_raw = reads.iter().filter(|r| !r.raw.is_empty()).count();
    assert!(
        stripped * 100 >= with_raw * 95,
        "only {stripped} of {with_raw} Read results strip to their raw text"
    );
}

// ---------------------------------------------------------------------------------------------
// Damaged and pathological input

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Valid samples of every kind, mutated (bytes flipped, cut, repeated, removed, duplicated)
/// a few thousand times with a fixed seed: no panic, no summary over its cap.
#[test]
fn mutated_samples_never_panic_nor_exceed_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("x.db");
    {
        let db = rusqlite::Connection::open(&db_path).unwrap();
        db.execute_batch(
            "CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT); CREATE TABLE u (x, y, z); CREATE INDEX i ON t(b);",
        )
        .unwrap();
        for i in 0..300 {
            db.execute(
                "INSERT INTO t (b) VALUES (?1)",
                (format!("value {i} {}", "x".repeat(i % 50)),),
            )
            .unwrap();
        }
    }
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\x01\0\0\0\x01\0\x08\x06\0\0\0".to_vec();
    png.extend_from_slice(&[0u8; 64]);
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("a.db", std::fs::read(&db_path).unwrap()),
        ("a.json", br#"{"a":[1,2,{"b":"c","d":[true,null,1.5e3]}],"e":{"f":{"g":"h"}}}"#.to_vec()),
        ("a.jsonl", b"{\"a\":1}\n{\"a\":\"x\",\"b\":[1]}\n[1,2]\n".to_vec()),
        ("a.csv", b"id,name,price\n1,\"a,b\",2.5\n2,\"multi\nline\",3\n3,c,\n".to_vec()),
        (
            "a.sql",
            b"CREATE TABLE t (a INT, b TEXT, PRIMARY KEY (a));\nINSERT INTO t VALUES (1,'x''y'),(2,'(z)');\nCOPY t (a) FROM stdin;\n1\n2\n\\.\nCREATE FUNCTION f() AS $$ select 1; $$;\n".to_vec(),
        ),
        ("a.rs", RUST_SRC.as_bytes().to_vec()),
        ("a.py", PYTHON_SRC.as_bytes().to_vec()),
        ("a.ts", TS_SRC.as_bytes().to_vec()),
        (
            "a.ex",
            b"defmodule A do\n  use B\n  def f(a) when a > 1, do: 1\n  def f(_), do: 2\n  test \"x\" do\n  end\nend\n".to_vec(),
        ),
        (
            "a.go",
            b"package main\nimport \"fmt\"\ntype S struct { A int }\ntype I interface { M() error }\nfunc (s *S) F(a int) error { return nil }\n".to_vec(),
        ),
        (
            "a.log",
            b"2024-01-01T00:00:00Z INFO a 1\nJan  5 10:00:00 host ERROR b\n[05/Jan/2024:10:00:00 +0000] WARN c\n".to_vec(),
        ),
        ("a.md", b"# T\n\n```rust\ncode\n```\nSetext\n---\n| a | b |\n[l](x) ![i](y)\n".to_vec()),
        ("a.png", png),
        ("a.txt", "     1\u{2192}numbered\n     2\u{2192}listing\n".as_bytes().to_vec()),
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..3_000 {
        let (seed_path, seed) = &seeds[(xorshift(&mut state) % seeds.len() as u64) as usize];
        let mut b = seed.clone();
        for _ in 0..1 + xorshift(&mut state) % 8 {
            let r = xorshift(&mut state);
            if b.is_empty() {
                b.push(r as u8);
                continue;
            }
            let at = (xorshift(&mut state) % b.len() as u64) as usize;
            match r % 6 {
                0 => b[at] = xorshift(&mut state) as u8,
                1 => b[at] ^= 1 << (r % 8),
                2 => b.truncate(at),
                3 => {
                    let c = b[at];
                    b.splice(at..at, std::iter::repeat_n(c, (r % 40) as usize));
                }
                4 => {
                    b.remove(at);
                }
                _ => {
                    let chunk: Vec<u8> = b[at..(at + (r as usize % 30)).min(b.len())].to_vec();
                    b.splice(at..at, chunk);
                }
            }
        }
        let path = if xorshift(&mut state).is_multiple_of(3) {
            PATHS[(xorshift(&mut state) % PATHS.len() as u64) as usize]
        } else {
            Some(*seed_path)
        };
        let cap = (xorshift(&mut state) % 400) as usize;
        let _ = run(path, &b, cap);
    }
}

/// One-line megabytes, deep nesting and garbage under every extension: a summary within the
/// cap (these once cost seconds: a 10 MB "word" carried into a summary line).
#[test]
fn pathological_inputs_under_every_extension() {
    let mut state = 7u64;
    let charset = b"(){}[]<>;:,.'\"`/\\*+-=!?&|^%$#@ \n\tabcxyz0129_";
    let garbage: String = (0..100_000)
        .map(|_| charset[(xorshift(&mut state) % charset.len() as u64) as usize] as char)
        .collect();
    let inputs = [
        "a".repeat(1_000_000),
        format!("{}{}", "(".repeat(50_000), ")".repeat(50_000)),
        format!("{}{}", "[".repeat(50_000), "]".repeat(50_000)),
        "{\"a\":".repeat(20_000),
        garbage,
    ];
    for text in &inputs {
        for path in PATHS
            .iter()
            .chain(&[Some("a.go"), Some("a.ex"), Some("a.md"), Some("a.txt")])
        {
            let e = run(*path, text.as_bytes(), 300);
            assert!(!e.summary.is_empty());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests: never a panic, never over the cap.

const PATHS: [Option<&str>; 12] = [
    None,
    Some("a.json"),
    Some("a.jsonl"),
    Some("a.csv"),
    Some("a.tsv"),
    Some("a.sql"),
    Some("a.db"),
    Some("a.rs"),
    Some("a.py"),
    Some("a.ts"),
    Some("a.log"),
    Some("a.png"),
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn arbitrary_bytes_never_panic_nor_exceed_the_cap(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
        path in proptest::sample::select(PATHS.to_vec()),
        cap in 0usize..300,
    ) {
        let _ = run(path, &bytes, cap);
    }

    #[test]
    fn arbitrary_strings_never_panic_nor_exceed_the_cap(
        text in ".{0,600}",
        path in proptest::sample::select(PATHS.to_vec()),
        cap in 0usize..300,
    ) {
        let _ = run(path, text.as_bytes(), cap);
    }

    #[test]
    fn structured_looking_strings_never_panic(
        text in "[\\[\\]{}:,\"0-9a-zA-Z \\n\\t;'()-]{0,800}",
        path in proptest::sample::select(PATHS.to_vec()),
        cap in 1usize..200,
    ) {
        let _ = run(path, text.as_bytes(), cap);
    }

    #[test]
    fn numbered_listings_round_trip(lines in proptest::collection::vec("[^\\n]{0,40}", 1..30), start in 1u64..5000) {
        let listing: String = lines
            .iter()
            .enumerate()
            .map(|(i, l)| format!("{:>6}→{l}\n", start + i as u64))
            .collect();
        let expected: String = lines.iter().map(|l| format!("{l}\n")).collect();
        prop_assert_eq!(strip_line_numbers(&listing), Some(expected));
    }
}

/// Real source files nobody wrote for this test: this repository's own Rust (always present)
/// and the Python standard library's `json/decoder.py` when the machine has it. Every listed
/// top-level definition named here is one the file really has.
#[test]
fn real_rust_and_python_sources_give_their_top_level_definitions() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let ids = repo.join("crates/lcm-core/src/ids.rs");
    let text = std::fs::read(&ids).unwrap();
    let e = run(ids.to_str(), &text, 800);
    assert_eq!(
        (e.kind, e.language.as_deref()),
        (FileKind::Code, Some("rust"))
    );
    for name in ["IdError", "AnyId", "known_prefix"] {
        assert!(
            e.summary.contains(name),
            "ids.rs: {name} missing in\n{}",
            e.summary
        );
    }
    let store = repo.join("crates/lcm-store/src/store.rs");
    let text = std::fs::read(&store).unwrap();
    let e = run(store.to_str(), &text, 800);
    for name in ["SessionRecord", "StoreOptions", "Store"] {
        assert!(
            e.summary.contains(name),
            "store.rs: {name} missing in\n{}",
            e.summary
        );
    }
    let python = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|d| d.ok().map(|d| d.path().join("json/decoder.py")))
        .find(|p| p.is_file());
    let Some(python) = python else {
        eprintln!("SKIPPED the Python half: no /usr/lib/python3*/json/decoder.py on this machine");
        return;
    };
    let text = std::fs::read(&python).unwrap();
    let e = run(python.to_str(), &text, 800);
    assert_eq!(
        (e.kind, e.language.as_deref()),
        (FileKind::Code, Some("python"))
    );
    for name in [
        "JSONDecoder",
        "JSONDecodeError",
        "def decode",
        "py_scanstring",
    ] {
        let bare = name.trim_start_matches("def ");
        assert!(
            e.summary.contains(bare),
            "decoder.py: {name} missing in\n{}",
            e.summary
        );
    }
}

/// A real JSON document nobody wrote for this test: the LoCoMo development set of
/// `../shared/data` (5 conversations, each with `qa`, `conversation`, ... keys). Its summary
/// gives the top-level array of 5 objects and their key structure. Skips without the data.
#[test]
fn real_json_document_gives_its_key_structure() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/locomo-dev/locomo-dev.json");
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("SKIPPED: {} is absent", path.display());
        return;
    };
    let e = run(path.to_str(), &bytes, 1_500);
    assert_eq!(e.kind, FileKind::Json, "{}", e.summary);
    for key in [
        "qa",
        "conversation",
        "session_summary",
        "question",
        "evidence",
    ] {
        assert!(e.summary.contains(key), "{key} missing in\n{}", e.summary);
    }
    assert!(e.summary.contains('5'), "the array's length: {}", e.summary);
}
