//! SQLite database files, read from their bytes (no SQLite library, no file): the header (page
//! size, page count, text encoding, WAL mode), the schema (page 1's b-tree holds
//! `sqlite_schema`: type, name, table, root page and CREATE statement of every object, with
//! overflow pages followed), each table's columns (from its CREATE statement), and each
//! table's row count, by walking its b-tree and adding up the cells of its leaf pages.
//!
//! Every read is bounds-checked and every walk keeps a visited set, so a truncated or corrupt
//! file yields what could be read plus a note, never a panic or a loop. The walk reads page
//! headers only, one visit per page: linear in the file size.

use std::collections::HashSet;

use crate::sql::parse_create_table;
use crate::summary::{DETAIL, KEY, MINOR, Summary};
use crate::util::{bytes as size, count, countu, plural, truncate};

/// Largest schema record assembled (CREATE statements are far smaller).
const MAX_RECORD: usize = 4 * 1024 * 1024;

struct Db<'a> {
    b: &'a [u8],
    page_size: usize,
    usable: usize,
    encoding: u32,
    /// Pages fully present in the bytes.
    pages_present: u32,
}

/// A SQLite varint at `at`: its value and length.
fn varint(b: &[u8], at: usize) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for i in 0..9 {
        let c = *b.get(at + i)?;
        if i == 8 {
            v = (v << 8) | u64::from(c);
            return Some((v, 9));
        }
        v = (v << 7) | u64::from(c & 0x7f);
        if c & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

fn be16(b: &[u8], at: usize) -> Option<usize> {
    let s = b.get(at..at + 2)?;
    Some(usize::from(u16::from_be_bytes([s[0], s[1]])))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at + 4)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// A value of a record.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Blob(usize),
}

/// Why a walk stopped short.
#[derive(Debug, Default)]
struct Walk {
    missing_pages: u64,
    bad_pages: u64,
}

impl Walk {
    fn complete(&self) -> bool {
        self.missing_pages == 0 && self.bad_pages == 0
    }
}

impl<'a> Db<'a> {
    fn open(b: &'a [u8]) -> Result<Self, String> {
        if !b.starts_with(b"SQLite format 3\0") {
            return Err("not a SQLite database (bad header)".into());
        }
        let raw = be16(b, 16).ok_or("header truncated")?;
        let page_size = if raw == 1 { 65_536 } else { raw };
        if !(512..=65_536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(format!("invalid page size {raw}"));
        }
        let reserved = usize::from(*b.get(20).ok_or("header truncated")?);
        let usable = page_size - reserved;
        if usable < 480 {
            return Err(format!("invalid reserved space {reserved}"));
        }
        let encoding = be32(b, 56).unwrap_or(1);
        let pages_present = u32::try_from(b.len() / page_size).unwrap_or(u32::MAX);
        Ok(Db {
            b,
            page_size,
            usable,
            encoding,
            pages_present,
        })
    }

    /// Page `n` (1-based), when fully present.
    fn page(&self, n: u32) -> Option<&'a [u8]> {
        if n == 0 {
            return None;
        }
        let start = (n as usize - 1).checked_mul(self.page_size)?;
        self.b.get(start..start.checked_add(self.page_size)?)
    }

    fn text(&self, raw: &[u8]) -> String {
        match self.encoding {
            2 | 3 => {
                let units: Vec<u16> = raw
                    .chunks_exact(2)
                    .map(|c| {
                        if self.encoding == 2 {
                            u16::from_le_bytes([c[0], c[1]])
                        } else {
                            u16::from_be_bytes([c[0], c[1]])
                        }
                    })
                    .collect();
                String::from_utf16_lossy(&units)
            }
            _ => String::from_utf8_lossy(raw).into_owned(),
        }
    }

    /// The payload of the table-leaf cell at `cell` on `page`, overflow pages followed.
    fn leaf_payload(&self, page: &[u8], cell: usize) -> Option<Vec<u8>> {
        let (p, n1) = varint(page, cell)?;
        let (_rowid, n2) = varint(page, cell + n1)?;
        let p = usize::try_from(p).ok()?.min(MAX_RECORD);
        let start = cell + n1 + n2;
        let u = self.usable;
        let x = u - 35;
        let local = if p <= x {
            p
        } else {
            let m = ((u - 12) * 32 / 255) - 23;
            let k = m + ((p - m) % (u - 4));
            if k <= x { k } else { m }
        };
        let mut out = page.get(start..start + local)?.to_vec();
        if local < p {
            let mut next = be32(page, start + local)?;
            let mut seen = HashSet::new();
            while out.len() < p && next != 0 && seen.insert(next) {
                let ov = self.page(next)?;
                let take = (p - out.len()).min(u - 4);
                out.extend_from_slice(ov.get(4..4 + take)?);
                next = be32(ov, 0)?;
            }
        }
        Some(out)
    }

    /// The values of a record.
    fn record(&self, rec: &[u8]) -> Option<Vec<Value>> {
        let (header_len, n) = varint(rec, 0)?;
        let header_len = usize::try_from(header_len).ok()?;
        let mut types = Vec::new();
        let mut at = n;
        while at < header_len.min(rec.len()) && types.len() < 64 {
            let (t, n) = varint(rec, at)?;
            types.push(t);
            at += n;
        }
        let mut body = header_len;
        let mut values = Vec::with_capacity(types.len());
        for t in types {
            let int = |len: usize| -> Option<i64> {
                let s = rec.get(body..body + len)?;
                let mut v: i64 = if s.first().is_some_and(|&c| c & 0x80 != 0) {
                    -1
                } else {
                    0
                };
                for &c in s {
                    v = (v << 8) | i64::from(c);
                }
                Some(v)
            };
            let (value, len) = match t {
                0 => (Value::Null, 0),
                1 => (Value::Int(int(1)?), 1),
                2 => (Value::Int(int(2)?), 2),
                3 => (Value::Int(int(3)?), 3),
                4 => (Value::Int(int(4)?), 4),
                5 => (Value::Int(int(6)?), 6),
                6 => (Value::Int(int(8)?), 8),
                7 => {
                    let s = rec.get(body..body + 8)?;
                    let mut a = [0u8; 8];
                    a.copy_from_slice(s);
                    (Value::Float(f64::from_be_bytes(a)), 8)
                }
                8 => (Value::Int(0), 0),
                9 => (Value::Int(1), 0),
                t if t >= 12 && t % 2 == 0 => {
                    let len = usize::try_from((t - 12) / 2).ok()?;
                    (Value::Blob(len), len)
                }
                t if t >= 13 => {
                    let len = usize::try_from((t - 13) / 2).ok()?;
                    (Value::Text(self.text(rec.get(body..body + len)?)), len)
                }
                _ => return None,
            };
            values.push(value);
            body += len;
        }
        Some(values)
    }

    /// Visits the b-tree rooted at `root`: calls `leaf_cell(page, cell_offset)` for each cell of
    /// each table-leaf page; returns the number of entries (table-leaf cells, or index cells).
    fn walk(
        &self,
        root: u32,
        visited: &mut HashSet<u32>,
        walk: &mut Walk,
        mut leaf_cell: impl FnMut(&[u8], usize),
    ) -> u64 {
        let mut entries = 0u64;
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            if !visited.insert(n) {
                walk.bad_pages += 1; // a page reached twice: corrupt
                continue;
            }
            let Some(page) = self.page(n) else {
                walk.missing_pages += 1;
                continue;
            };
            let h = if n == 1 { 100 } else { 0 };
            let Some(&kind) = page.get(h) else {
                walk.bad_pages += 1;
                continue;
            };
            let cells = be16(page, h + 3).unwrap_or(0);
            let header = if kind == 0x02 || kind == 0x05 { 12 } else { 8 };
            let pointers = h + header;
            match kind {
                0x0d => {
                    entries += cells as u64;
                    for c in 0..cells {
                        if let Some(off) = be16(page, pointers + 2 * c)
                            && off < page.len()
                        {
                            leaf_cell(page, off);
                        }
                    }
                }
                0x0a => entries += cells as u64,
                0x05 | 0x02 => {
                    if kind == 0x02 {
                        entries += cells as u64;
                    }
                    if let Some(right) = be32(page, h + 8) {
                        stack.push(right);
                    }
                    for c in (0..cells).rev() {
                        if let Some(child) =
                            be16(page, pointers + 2 * c).and_then(|off| be32(page, off))
                        {
                            stack.push(child);
                        }
                    }
                }
                _ => walk.bad_pages += 1,
            }
            if visited.len() > self.pages_present as usize + 1 {
                break;
            }
        }
        entries
    }
}

/// One row of `sqlite_schema`.
#[derive(Debug)]
struct Object {
    kind: String,
    name: String,
    table: String,
    root: u32,
    sql: String,
}

/// The summary of a SQLite database file.
pub(crate) fn explore(b: &[u8]) -> Summary {
    let db = match Db::open(b) {
        Ok(db) => db,
        Err(why) => {
            let mut s = Summary::new(format!("SQLite database: unreadable, {}", size(b.len())));
            s.push(KEY, why);
            return s;
        }
    };
    let header_pages = be32(b, 28).unwrap_or(0);
    let valid_for = be32(b, 92).unwrap_or(0);
    let change = be32(b, 24).unwrap_or(1);
    let page_count = if header_pages > 0 && valid_for == change {
        header_pages
    } else {
        db.pages_present
    };
    let wal = b.get(18) == Some(&2) && b.get(19) == Some(&2);
    let freelist = be32(b, 36).unwrap_or(0);

    let mut visited = HashSet::new();
    let mut schema_walk = Walk::default();
    let mut objects = Vec::new();
    db.walk(1, &mut visited, &mut schema_walk, |page, cell| {
        if objects.len() >= 10_000 {
            return;
        }
        let Some(values) = db.leaf_payload(page, cell).and_then(|p| db.record(&p)) else {
            return;
        };
        let text = |i: usize| match values.get(i) {
            Some(Value::Text(t)) => t.clone(),
            _ => String::new(),
        };
        let root = match values.get(3) {
            Some(Value::Int(r)) => u32::try_from(*r).unwrap_or(0),
            _ => 0,
        };
        objects.push(Object {
            kind: truncate(&text(0), 20),
            name: truncate(&text(1), 80),
            table: truncate(&text(2), 80),
            root,
            sql: text(4),
        });
    });

    let tables: Vec<&Object> = objects.iter().filter(|o| o.kind == "table").collect();
    let mut counted = Vec::new();
    let mut rows_total = 0u64;
    let mut incomplete = false;
    for t in &tables {
        if t.root == 0 {
            counted.push((None, Walk::default()));
            continue;
        }
        let mut w = Walk::default();
        let n = db.walk(t.root, &mut visited, &mut w, |_, _| {});
        rows_total += n;
        incomplete |= !w.complete();
        counted.push((Some(n), w));
    }
    let user_tables = tables
        .iter()
        .filter(|t| !t.name.starts_with("sqlite_"))
        .count();
    let mut s = Summary::new(format!(
        "SQLite database: {} table{}, {}{} row{}, {}",
        countu(user_tables),
        plural(user_tables as u64),
        if incomplete { "at least " } else { "" },
        count(rows_total),
        plural(rows_total),
        size(b.len())
    ));
    let mut facts = format!(
        "Page size {}, {} page{}",
        countu(db.page_size),
        count(u64::from(page_count)),
        plural(u64::from(page_count))
    );
    if freelist > 0 {
        facts.push_str(&format!(", {} free", count(u64::from(freelist))));
    }
    facts.push_str(match db.encoding {
        2 => ", UTF-16le text",
        3 => ", UTF-16be text",
        _ => ", UTF-8 text",
    });
    if wal {
        facts.push_str(", WAL mode (recent changes may be in the -wal file, not here)");
    }
    s.push(KEY, facts);
    if db.pages_present < page_count {
        s.push(
            KEY,
            format!(
                "File truncated: {} of {} pages present; counts cover the pages present.",
                count(u64::from(db.pages_present)),
                count(u64::from(page_count))
            ),
        );
    }
    if !schema_walk.complete() {
        s.push(
            KEY,
            "Schema b-tree damaged or truncated: the list below may be incomplete.",
        );
    }
    if !tables.is_empty() {
        s.heading(KEY, "Tables:");
    }
    // User tables first, then SQLite's own.
    let mut order: Vec<usize> = (0..tables.len()).collect();
    order.sort_by_key(|&i| tables[i].name.starts_with("sqlite_"));
    for i in order.into_iter().take(500) {
        let t = tables[i];
        let (rows, w) = &counted[i];
        let rows_text = match rows {
            Some(n) if w.complete() => format!("{} row{}", count(*n), plural(*n)),
            Some(n) => format!(
                "at least {} rows, {} pages unreadable",
                count(*n),
                count(w.missing_pages + w.bad_pages)
            ),
            None => "rows not counted (no root page)".into(),
        };
        let def = parse_create_table(&t.sql);
        let cols = match &def {
            Some(d) if d.as_select => "created AS SELECT".to_string(),
            Some(d) if !d.columns.is_empty() => d.columns_text(600),
            _ => truncate(&crate::util::collapse(&t.sql, 300), 300),
        };
        let rank = if t.name.starts_with("sqlite_") {
            MINOR
        } else {
            KEY
        };
        let constraints = def
            .as_ref()
            .filter(|d| !d.constraints.is_empty())
            .map(|d| format!("; {}", truncate(&d.constraints.join("; "), 300)));
        s.push_with(
            rank,
            format!("  {} ({rows_text}): {cols}", t.name),
            DETAIL,
            constraints,
        );
    }
    for (kind, label) in [
        ("index", "Indexes"),
        ("view", "Views"),
        ("trigger", "Triggers"),
    ] {
        let list: Vec<String> = objects
            .iter()
            .filter(|o| o.kind == kind)
            .filter(|o| !(kind == "index" && o.name.starts_with("sqlite_autoindex")))
            .take(100)
            .map(|o| {
                if kind == "view" {
                    o.name.clone()
                } else {
                    format!("{} on {}", o.name, o.table)
                }
            })
            .collect();
        if !list.is_empty() {
            s.push(
                DETAIL,
                format!(
                    "{label} ({}): {}",
                    list.len(),
                    truncate(&list.join(", "), 1000)
                ),
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        assert_eq!(varint(&[0x05], 0), Some((5, 1)));
        assert_eq!(varint(&[0x81, 0x00], 0), Some((128, 2)));
        assert_eq!(varint(&[0xff; 9], 0).map(|v| v.1), Some(9));
        assert_eq!(varint(&[0x81], 0), None);
    }

    #[test]
    fn garbage_after_the_magic_does_not_panic() {
        let mut b = b"SQLite format 3\0".to_vec();
        for fill in [0u8, 0xff, 0x0d, 0x05] {
            for len in [16usize, 17, 50, 100, 120, 600, 4096] {
                let mut x = b.clone();
                x.resize(len, fill);
                let _ = explore(&x);
            }
        }
        // Page size 512, page 1 an interior page pointing at itself.
        b.resize(1024, 0);
        b[16] = 2;
        b[17] = 0;
        b[100] = 0x05;
        b[108..112].copy_from_slice(&1u32.to_be_bytes());
        let s = explore(&b).text();
        assert!(s.contains("damaged"), "{s}");
    }
}
