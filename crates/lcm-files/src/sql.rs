//! SQL dumps: the tables (from CREATE TABLE, with their columns), the rows each table receives
//! (INSERT value tuples counted, PostgreSQL `COPY … FROM stdin` data lines counted), and the
//! other statements by kind. One quote-, comment- and dollar-quote-aware pass splits the
//! statements; nothing is kept but the per-table tallies. `parse_create_table` is shared with
//! the SQLite explorer (whose schema is CREATE statements too).

use std::collections::HashMap;

use crate::summary::{DETAIL, KEY, MINOR, Summary};
use crate::util::{bytes as size, collapse, count, countu, plural, truncate};

/// Tables listed at most.
const MAX_TABLES: usize = 300;

/// A table as declared by CREATE TABLE.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct TableDef {
    pub(crate) name: String,
    /// (column name, declaration after the name: type and constraints).
    pub(crate) columns: Vec<(String, String)>,
    /// Table constraints (PRIMARY KEY (...), FOREIGN KEY ..., UNIQUE ...).
    pub(crate) constraints: Vec<String>,
    /// `CREATE TABLE … AS SELECT` (no column list).
    pub(crate) as_select: bool,
}

impl TableDef {
    /// "id INTEGER PRIMARY KEY, name TEXT NOT NULL" (at most `max_chars`).
    pub(crate) fn columns_text(&self, max_chars: usize) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|(n, d)| {
                if d.is_empty() {
                    n.clone()
                } else {
                    format!("{n} {d}")
                }
            })
            .collect();
        truncate(&cols.join(", "), max_chars)
    }
}

/// Skips whitespace and comments from `i`.
fn skip_space(b: &[u8], mut i: usize) -> usize {
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if b[i..].starts_with(b"--") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i = match find(b, i + 2, b"*/") {
                Some(j) => j + 2,
                None => b.len(),
            };
        } else {
            return i;
        }
    }
}

fn find(b: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    if from >= b.len() || needle.is_empty() {
        return None;
    }
    b[from..]
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| from + p)
}

/// The bare word at `i` (letters, digits, '_'), upper-cased (its first 40 characters), and
/// the index after it.
fn word(b: &[u8], i: usize) -> (String, usize) {
    let mut j = i;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
        j += 1;
    }
    let shown = &b[i.min(j)..j.min(i + 40)];
    (String::from_utf8_lossy(shown).to_ascii_uppercase(), j)
}

/// A possibly quoted, possibly qualified identifier at `i`: its unquoted text and the index
/// after it.
fn identifier(s: &str, i: usize) -> Option<(String, usize)> {
    let b = s.as_bytes();
    let mut parts = Vec::new();
    let mut j = i;
    loop {
        let (part, next) = match b.get(j)? {
            b'"' | b'`' | b'[' => {
                let close = match b[j] {
                    b'[' => b']',
                    c => c,
                };
                let end = b[j + 1..].iter().position(|&c| c == close)? + j + 1;
                (s.get(j + 1..end)?.to_string(), end + 1)
            }
            c if c.is_ascii_alphanumeric() || *c == b'_' || *c == b'$' || *c >= 0x80 => {
                let mut k = j;
                while k < b.len()
                    && (b[k].is_ascii_alphanumeric()
                        || b[k] == b'_'
                        || b[k] == b'$'
                        || b[k] >= 0x80)
                {
                    k += 1;
                }
                (s.get(j..k)?.to_string(), k)
            }
            _ => return None,
        };
        parts.push(part);
        j = next;
        if b.get(j) == Some(&b'.') {
            j += 1;
        } else {
            break;
        }
    }
    Some((truncate(&parts.join("."), 80), j))
}

/// Index just after the parenthesised group opening at `i` (quote-aware), or the end.
fn matching_paren(b: &[u8], i: usize) -> usize {
    let mut depth = 0usize;
    let mut j = i;
    while j < b.len() {
        match b[j] {
            b'(' => depth += 1,
            b')' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            q @ (b'\'' | b'"' | b'`') => j = skip_quoted(b, j, q, true),
            _ => {}
        }
        j += 1;
    }
    b.len()
}

/// The index of the closing quote of the string opening at `i` (or the last index).
fn skip_quoted(b: &[u8], i: usize, q: u8, backslash: bool) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        if backslash && b[j] == b'\\' && q == b'\'' {
            j += 2;
            continue;
        }
        if b[j] == q {
            if b.get(j + 1) == Some(&q) {
                j += 2;
                continue;
            }
            return j;
        }
        j += 1;
    }
    b.len().saturating_sub(1)
}

/// Parses `CREATE [TEMP] TABLE [IF NOT EXISTS] name (columns…)`.
pub(crate) fn parse_create_table(stmt: &str) -> Option<TableDef> {
    let b = stmt.as_bytes();
    let mut i = skip_space(b, 0);
    let (w, next) = word(b, i);
    if w != "CREATE" {
        return None;
    }
    i = next;
    loop {
        i = skip_space(b, i);
        let (w, next) = word(b, i);
        match w.as_str() {
            "OR" | "REPLACE" | "TEMP" | "TEMPORARY" | "UNLOGGED" | "GLOBAL" | "LOCAL"
            | "VIRTUAL" => i = next,
            "TABLE" => {
                i = next;
                break;
            }
            _ => return None,
        }
    }
    i = skip_space(b, i);
    let (w, next) = word(b, i);
    if w == "IF" {
        // IF NOT EXISTS
        i = skip_space(b, next);
        let (_, next) = word(b, i);
        i = skip_space(b, next);
        let (_, next) = word(b, i);
        i = skip_space(b, next);
    }
    let (name, after) = identifier(stmt, i)?;
    let mut def = TableDef {
        name,
        ..TableDef::default()
    };
    let i = skip_space(b, after);
    if b.get(i) != Some(&b'(') {
        let (w, _) = word(b, i);
        def.as_select = w == "AS";
        // CREATE VIRTUAL TABLE x USING fts5(...): the module arguments are not columns.
        return Some(def);
    }
    let end = matching_paren(b, i);
    let body = without_comments(stmt.get(i + 1..end.saturating_sub(1)).unwrap_or(""));
    for item in split_top_level(&body) {
        let item = collapse(item, 300);
        if item.is_empty() {
            continue;
        }
        let (first, _) = word(item.as_bytes(), 0);
        if matches!(
            first.as_str(),
            "CONSTRAINT"
                | "PRIMARY"
                | "FOREIGN"
                | "UNIQUE"
                | "CHECK"
                | "KEY"
                | "INDEX"
                | "FULLTEXT"
                | "SPATIAL"
                | "EXCLUDE"
                | "LIKE"
        ) {
            def.constraints.push(truncate(&item, 120));
            continue;
        }
        match identifier(&item, 0) {
            Some((col, after)) => {
                let decl = item.get(after..).unwrap_or("").trim();
                def.columns.push((col, truncate(decl, 60)));
            }
            None => def.constraints.push(truncate(&item, 120)),
        }
        if def.columns.len() >= 2_000 {
            break;
        }
    }
    Some(def)
}

/// `body` without `-- …` and `/* … */` comments (outside quotes).
fn without_comments(body: &str) -> String {
    let b = body.as_bytes();
    let mut out = String::with_capacity(body.len());
    let mut start = 0usize;
    let mut j = 0usize;
    while j < b.len() {
        match b[j] {
            q @ (b'\'' | b'"' | b'`') => j = skip_quoted(b, j, q, false),
            b'-' if b.get(j + 1) == Some(&b'-') => {
                out.push_str(body.get(start..j).unwrap_or(""));
                while j < b.len() && b[j] != b'\n' {
                    j += 1;
                }
                start = j;
                continue;
            }
            b'/' if b.get(j + 1) == Some(&b'*') => {
                out.push_str(body.get(start..j).unwrap_or(""));
                j = find(b, j + 2, b"*/").map_or(b.len(), |k| k + 2);
                out.push(' ');
                start = j;
                continue;
            }
            _ => {}
        }
        j += 1;
    }
    out.push_str(body.get(start..).unwrap_or(""));
    out
}

/// Splits at commas outside parentheses and quotes.
fn split_top_level(body: &str) -> Vec<&str> {
    let b = body.as_bytes();
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0usize;
    let mut j = 0usize;
    while j < b.len() {
        match b[j] {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            q @ (b'\'' | b'"' | b'`') => j = skip_quoted(b, j, q, false),
            b',' if depth == 0 => {
                out.push(body.get(start..j).unwrap_or(""));
                start = j + 1;
            }
            _ => {}
        }
        j += 1;
    }
    out.push(body.get(start..).unwrap_or(""));
    out
}

/// Rows in an INSERT statement: the table and the number of value tuples (`None` for INSERT …
/// SELECT and the like).
fn parse_insert(stmt: &str, backslash: bool) -> Option<(String, Option<u64>)> {
    let b = stmt.as_bytes();
    let mut i = skip_space(b, 0);
    let (w, next) = word(b, i);
    if w != "INSERT" && w != "REPLACE" {
        return None;
    }
    i = next;
    loop {
        i = skip_space(b, i);
        let (w, next) = word(b, i);
        match w.as_str() {
            "INTO" => {
                i = next;
                break;
            }
            "OR" | "IGNORE" | "REPLACE" | "ROLLBACK" | "ABORT" | "FAIL" | "LOW_PRIORITY"
            | "DELAYED" | "HIGH_PRIORITY" => i = next,
            _ => return None,
        }
    }
    i = skip_space(b, i);
    let (table, after) = identifier(stmt, i)?;
    i = skip_space(b, after);
    // AS alias (PostgreSQL)
    let (w, next) = word(b, i);
    if w == "AS" {
        i = skip_space(b, next);
        let (_, next) = word(b, i);
        i = skip_space(b, next);
    }
    if b.get(i) == Some(&b'(') {
        i = skip_space(b, matching_paren(b, i));
    }
    let (w, next) = word(b, i);
    if w != "VALUES" && w != "VALUE" {
        return Some((table, None));
    }
    // Count the parenthesised groups at depth 0 after VALUES.
    let mut tuples = 0u64;
    let mut depth = 0usize;
    let mut j = next;
    while j < b.len() {
        match b[j] {
            b'(' => {
                if depth == 0 {
                    tuples += 1;
                }
                depth += 1;
            }
            b')' => depth = depth.saturating_sub(1),
            q @ (b'\'' | b'"' | b'`') => j = skip_quoted(b, j, q, backslash),
            // ON CONFLICT / ON DUPLICATE KEY / RETURNING end the tuples.
            b'O' | b'o' | b'R' | b'r' if depth == 0 => {
                let (w, _) = word(b, j);
                if w == "ON" || w == "RETURNING" {
                    break;
                }
            }
            _ => {}
        }
        j += 1;
    }
    Some((table, Some(tuples)))
}

/// The statement kind for the tally of other statements: "CREATE INDEX", "SET", "BEGIN".
fn statement_kind(stmt: &str) -> Option<String> {
    let b = stmt.as_bytes();
    let i = skip_space(b, 0);
    let (first, next) = word(b, i);
    if first.is_empty() {
        return None;
    }
    if matches!(first.as_str(), "CREATE" | "DROP" | "ALTER") {
        let mut j = skip_space(b, next);
        loop {
            let (w, n) = word(b, j);
            match w.as_str() {
                "OR" | "REPLACE" | "UNIQUE" | "TEMP" | "TEMPORARY" | "IF" | "NOT" | "EXISTS" => {
                    j = skip_space(b, n)
                }
                "" => return Some(first),
                _ => return Some(format!("{first} {w}")),
            }
        }
    }
    Some(first)
}

#[derive(Default)]
struct Tally {
    tables: Vec<TableDef>,
    rows: HashMap<String, u64>,
    insert_order: Vec<String>,
    insert_statements: u64,
    insert_select: u64,
    other: HashMap<String, u64>,
    statements: u64,
}

fn key(name: &str) -> String {
    name.to_lowercase()
}

impl Tally {
    fn statement(&mut self, stmt: &str, backslash: bool) {
        let Some(kind) = statement_kind(stmt) else {
            return; // empty, or only comments
        };
        self.statements += 1;
        if kind == "CREATE TABLE"
            && let Some(def) = parse_create_table(stmt)
        {
            if self.tables.len() < 10_000 {
                self.tables.push(def);
            }
            return;
        }
        if (kind == "INSERT" || kind == "REPLACE")
            && let Some((table, tuples)) = parse_insert(stmt, backslash)
        {
            self.insert_statements += 1;
            let k = key(&table);
            if !self.rows.contains_key(&k) && self.rows.len() < 10_000 {
                self.insert_order.push(table);
                self.rows.insert(k.clone(), 0);
            }
            match tuples {
                Some(n) => {
                    if let Some(r) = self.rows.get_mut(&k) {
                        *r += n;
                    }
                }
                None => self.insert_select += 1,
            }
            return;
        }
        if self.other.len() < 200 || self.other.contains_key(&kind) {
            *self.other.entry(kind).or_insert(0) += 1;
        }
    }

    fn copy_rows(&mut self, table: &str, n: u64) {
        let k = key(table);
        if !self.rows.contains_key(&k) {
            self.insert_order.push(table.to_string());
        }
        *self.rows.entry(k).or_insert(0) += n;
    }
}

/// `COPY table [(cols)] FROM stdin`: the table.
fn copy_from_stdin(stmt: &str) -> Option<String> {
    let b = stmt.as_bytes();
    let i = skip_space(b, 0);
    let (w, next) = word(b, i);
    if w != "COPY" {
        return None;
    }
    let (table, _) = identifier(stmt, skip_space(b, next))?;
    let upper = collapse(stmt, 4000).to_ascii_uppercase();
    upper.contains("FROM STDIN").then_some(table)
}

/// The summary of a SQL dump.
pub(crate) fn explore(text: &str) -> Summary {
    let b = text.as_bytes();
    // MySQL dumps escape quotes with backslashes; standard SQL doubles them.
    let head = crate::util::prefix(text, 64 * 1024);
    let backslash = head.contains('`') || head.contains("/*!") || head.contains("ENGINE=");
    let mut tally = Tally::default();
    let mut start = 0usize;
    let mut i = 0usize;
    while i < b.len() {
        match b[i] {
            b'\'' => i = skip_quoted(b, i, b'\'', backslash),
            b'"' => i = skip_quoted(b, i, b'"', false),
            b'`' => i = skip_quoted(b, i, b'`', false),
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = match find(b, i + 2, b"*/") {
                    Some(j) => j + 1,
                    None => b.len(),
                };
            }
            b'$' => {
                // Dollar quoting: $$ … $$ or $tag$ … $tag$.
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                if b.get(j) == Some(&b'$') && !(i > 0 && b[i - 1].is_ascii_alphanumeric()) {
                    let tag = &b[i..=j];
                    i = match find(b, j + 1, tag) {
                        Some(k) => k + tag.len() - 1,
                        None => b.len(),
                    };
                }
            }
            b';' => {
                let stmt = text.get(start..i).unwrap_or("");
                tally.statement(stmt, backslash);
                start = i + 1;
                if let Some(table) = copy_from_stdin(stmt) {
                    // Data lines up to "\." follow.
                    let mut j = match b[start..].iter().position(|&c| c == b'\n') {
                        Some(p) => start + p + 1,
                        None => b.len(),
                    };
                    let mut rows = 0u64;
                    while j < b.len() {
                        let end = b[j..]
                            .iter()
                            .position(|&c| c == b'\n')
                            .map_or(b.len(), |p| j + p);
                        let line = &b[j..end];
                        let line = line.strip_suffix(b"\r").unwrap_or(line);
                        j = (end + 1).min(b.len());
                        if line == b"\\." {
                            break;
                        }
                        rows += 1;
                    }
                    tally.copy_rows(&table, rows);
                    start = j;
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    if start < b.len() {
        tally.statement(text.get(start..).unwrap_or(""), backslash);
    }

    let total_rows: u64 = tally.rows.values().sum();
    let mut s = Summary::new(format!(
        "SQL dump: {} table{} created, {} row{} inserted, {} statement{}, {}",
        countu(tally.tables.len()),
        plural(tally.tables.len() as u64),
        count(total_rows),
        plural(total_rows),
        count(tally.statements),
        plural(tally.statements),
        size(text.len())
    ));
    if !tally.tables.is_empty() {
        s.heading(KEY, "Tables:");
    }
    for def in tally.tables.iter().take(MAX_TABLES) {
        let rows = tally.rows.get(&key(&def.name)).copied();
        let rows_text = match rows {
            Some(n) => format!("{} row{}", count(n), plural(n)),
            None => "no rows inserted".to_string(),
        };
        let body = if def.as_select {
            "created AS SELECT".to_string()
        } else {
            def.columns_text(600)
        };
        let constraints = (!def.constraints.is_empty())
            .then(|| format!("; {}", truncate(&def.constraints.join("; "), 300)));
        s.push_with(
            KEY,
            format!("  {} ({rows_text}): {body}", def.name),
            DETAIL,
            constraints,
        );
    }
    if tally.tables.len() > MAX_TABLES {
        s.push(
            MINOR,
            format!(
                "  … {} more tables",
                countu(tally.tables.len() - MAX_TABLES)
            ),
        );
    }
    let created: std::collections::HashSet<String> =
        tally.tables.iter().map(|t| key(&t.name)).collect();
    let others: Vec<String> = tally
        .insert_order
        .iter()
        .filter(|t| !created.contains(&key(t)))
        .take(100)
        .map(|t| {
            format!(
                "{t} {}",
                count(tally.rows.get(&key(t)).copied().unwrap_or(0))
            )
        })
        .collect();
    if !others.is_empty() {
        s.push(
            KEY,
            format!("Rows into tables not created here: {}", others.join(", ")),
        );
    }
    if tally.insert_statements > 0 {
        s.push(
            DETAIL,
            format!(
                "INSERT statements: {}{}",
                count(tally.insert_statements),
                if tally.insert_select > 0 {
                    format!(" ({} without a VALUES list)", count(tally.insert_select))
                } else {
                    String::new()
                }
            ),
        );
    }
    if !tally.other.is_empty() {
        let mut other: Vec<(&String, &u64)> = tally.other.iter().collect();
        other.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let list: Vec<String> = other
            .iter()
            .take(30)
            .map(|(k, n)| format!("{k} {}", count(**n)))
            .collect();
        s.push(DETAIL, format!("Other statements: {}", list.join(", ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_columns_and_rows() {
        let dump = "-- a dump; with a semicolon in a comment\n\
            CREATE TABLE users (\n  id INTEGER PRIMARY KEY,\n  name TEXT NOT NULL, -- the name\n  email VARCHAR(255),\n  PRIMARY KEY (id)\n);\n\
            CREATE TABLE IF NOT EXISTS \"orders\" (id INT, user_id INT REFERENCES users(id), total NUMERIC(10,2));\n\
            INSERT INTO users VALUES (1, 'Ann; O''Brien', 'a@x'), (2, 'Bob (the builder)', NULL);\n\
            INSERT INTO users (id, name) VALUES (3, 'Cy');\n\
            INSERT INTO \"orders\" VALUES (1, 1, 9.99);\n\
            CREATE INDEX idx ON users(name);\n\
            BEGIN; COMMIT;\n";
        let t = explore(dump).text();
        assert!(
            t.starts_with("SQL dump: 2 tables created, 4 rows inserted, 8 statements"),
            "{t}"
        );
        assert!(
            t.contains("  users (3 rows): id INTEGER PRIMARY KEY, name TEXT NOT NULL, email VARCHAR(255); PRIMARY KEY (id)"),
            "{t}"
        );
        assert!(
            t.contains(
                "  orders (1 row): id INT, user_id INT REFERENCES users(id), total NUMERIC(10,2)"
            ),
            "{t}"
        );
        assert!(t.contains("CREATE INDEX 1"), "{t}");
        assert!(t.contains("BEGIN 1"), "{t}");
    }

    #[test]
    fn mysql_escapes_and_copy_blocks() {
        let dump = "CREATE TABLE `t` (`a` int) ENGINE=InnoDB;\n\
            INSERT INTO `t` VALUES (1,'it\\'s (x)'),(2,'b');\n\
            COPY public.items (id, name) FROM stdin;\n1\tone\n2\ttwo\n3\tthree\n\\.\n\
            CREATE FUNCTION f() RETURNS int AS $$ SELECT 1; $$ LANGUAGE sql;\n";
        let t = explore(dump).text();
        assert!(t.contains("  t (2 rows): a int"), "{t}");
        assert!(
            t.contains("Rows into tables not created here: public.items 3"),
            "{t}"
        );
        assert!(t.contains("CREATE FUNCTION 1"), "{t}");
    }

    #[test]
    fn parses_create_table_variants() {
        let d = parse_create_table("CREATE TABLE sqlite_sequence(name,seq)").unwrap();
        assert_eq!(
            d.columns,
            vec![("name".into(), "".into()), ("seq".into(), "".into())]
        );
        let d = parse_create_table("create temp table if not exists [x y] (a text)").unwrap();
        assert_eq!(d.name, "x y");
        assert!(
            parse_create_table("CREATE TABLE t AS SELECT 1")
                .unwrap()
                .as_select
        );
        assert!(parse_create_table("CREATE INDEX i ON t(a)").is_none());
        assert!(parse_create_table("CREATE TABLE").is_none());
    }

    #[test]
    fn unterminated_input_does_not_panic() {
        for t in [
            "INSERT INTO t VALUES ('abc",
            "CREATE TABLE t (a",
            "/* x",
            "$$",
            "COPY t FROM stdin;",
        ] {
            let _ = explore(t);
        }
    }
}
