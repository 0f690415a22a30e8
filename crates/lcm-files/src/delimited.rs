//! CSV and TSV: the delimiter, the header columns, the exact row count (the csv crate's parser,
//! so a quoted field with embedded newlines is one row), each column's inferred type (integer,
//! float, boolean, date, datetime, text, empty) with its numeric or date range and, for
//! low-cardinality columns, the distinct values; three sample rows. One pass, one reused
//! record, per-column state of fixed size: memory does not grow with the input.

use crate::detect::sniff_delimiter;
use crate::summary::{DETAIL, KEY, MINOR, SAMPLE, Summary};
use crate::util::{DateKind, bytes as size, count, countu, iso_date_kind, plural, truncate};

/// Distinct values tracked per column before the column counts as high-cardinality.
const MAX_DISTINCT: usize = 12;
/// Columns described one per line at most (the rest are named only).
const MAX_COLUMN_LINES: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cell {
    Empty,
    Integer,
    Float,
    Boolean,
    Date,
    DateTime,
    Text,
}

fn classify(v: &str) -> Cell {
    let t = v.trim();
    if t.is_empty() {
        return Cell::Empty;
    }
    let b = t.as_bytes();
    let digits = b
        .strip_prefix(b"-")
        .or_else(|| b.strip_prefix(b"+"))
        .unwrap_or(b);
    if !digits.is_empty() && digits.iter().all(u8::is_ascii_digit) {
        return Cell::Integer;
    }
    if t.eq_ignore_ascii_case("true") || t.eq_ignore_ascii_case("false") {
        return Cell::Boolean;
    }
    if b[0].is_ascii_digit() || matches!(b[0], b'-' | b'+' | b'.') {
        if t.bytes().any(|c| c.is_ascii_digit()) && t.parse::<f64>().is_ok_and(f64::is_finite) {
            return Cell::Float;
        }
        match iso_date_kind(t) {
            Some(DateKind::Date) => return Cell::Date,
            Some(DateKind::DateTime) => return Cell::DateTime,
            None => {}
        }
    }
    Cell::Text
}

#[derive(Debug, Default)]
struct Column {
    counts: [u64; 7],
    min: Option<(f64, String)>,
    max: Option<(f64, String)>,
    min_date: Option<String>,
    max_date: Option<String>,
    distinct: Vec<(String, u64)>,
    distinct_overflow: bool,
    max_len: usize,
}

impl Column {
    fn add(&mut self, v: &str) {
        let cell = classify(v);
        self.counts[cell as usize] += 1;
        let t = v.trim();
        self.max_len = self.max_len.max(t.chars().count().min(1 << 20));
        match cell {
            Cell::Integer | Cell::Float => {
                if let Ok(x) = t.parse::<f64>() {
                    if self.min.as_ref().is_none_or(|m| x < m.0) {
                        self.min = Some((x, truncate(t, 40)));
                    }
                    if self.max.as_ref().is_none_or(|m| x > m.0) {
                        self.max = Some((x, truncate(t, 40)));
                    }
                }
            }
            Cell::Date | Cell::DateTime => {
                if self.min_date.as_deref().is_none_or(|m| t < m) {
                    self.min_date = Some(t.to_string());
                }
                if self.max_date.as_deref().is_none_or(|m| t > m) {
                    self.max_date = Some(t.to_string());
                }
            }
            _ => {}
        }
        if !self.distinct_overflow && cell != Cell::Empty {
            if let Some(e) = self.distinct.iter_mut().find(|e| e.0 == t) {
                e.1 += 1;
            } else if self.distinct.len() < MAX_DISTINCT && t.len() <= 64 {
                self.distinct.push((t.to_string(), 1));
            } else {
                self.distinct_overflow = true;
                self.distinct = Vec::new();
            }
        }
    }

    /// The column type: the narrowest one every non-empty value fits.
    fn kind(&self) -> &'static str {
        let c = &self.counts;
        let non_empty: u64 = c[1..].iter().sum();
        if non_empty == 0 {
            return "empty";
        }
        let only = |cells: &[Cell]| cells.iter().map(|&x| c[x as usize]).sum::<u64>() == non_empty;
        if only(&[Cell::Integer]) {
            "integer"
        } else if only(&[Cell::Integer, Cell::Float]) {
            "float"
        } else if only(&[Cell::Boolean]) {
            "boolean"
        } else if only(&[Cell::Date]) {
            "date"
        } else if only(&[Cell::Date, Cell::DateTime]) {
            "datetime"
        } else {
            "text"
        }
    }

    fn describe(&self, rows: u64) -> String {
        let kind = self.kind();
        let mut out = kind.to_string();
        match kind {
            "integer" | "float" => {
                if let (Some(min), Some(max)) = (&self.min, &self.max) {
                    out.push_str(&format!(", range {}..{}", min.1, max.1));
                }
            }
            "date" | "datetime" => {
                if let (Some(min), Some(max)) = (&self.min_date, &self.max_date) {
                    out.push_str(&format!(", {min}..{max}"));
                }
            }
            "text" => {
                // A mostly numeric column with a few odd values says so.
                let numeric =
                    self.counts[Cell::Integer as usize] + self.counts[Cell::Float as usize];
                let non_empty: u64 = self.counts[1..].iter().sum();
                if numeric * 10 >= non_empty * 9 {
                    out.push_str(&format!(" ({}% numeric)", numeric * 100 / non_empty.max(1)));
                }
            }
            _ => {}
        }
        let empty = self.counts[Cell::Empty as usize];
        if empty > 0 {
            out.push_str(&format!(", {} empty", count(empty)));
        }
        let non_empty = rows.saturating_sub(empty);
        if !self.distinct_overflow
            && !self.distinct.is_empty()
            && kind != "integer"
            && kind != "float"
        {
            if (self.distinct.len() as u64) * 2 <= non_empty {
                let mut d: Vec<&(String, u64)> = self.distinct.iter().collect();
                d.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                let list: Vec<String> = d
                    .iter()
                    .map(|(v, n)| format!("{} ({})", truncate(v, 30), count(*n)))
                    .collect();
                out.push_str(&format!(
                    ", {} distinct: {}",
                    self.distinct.len(),
                    list.join(", ")
                ));
            }
        } else if kind == "text" && self.distinct_overflow {
            out.push_str(&format!(
                ", many distinct, longest {} chars",
                countu(self.max_len)
            ));
        }
        out
    }
}

/// The delimiter to use: '\t' for TSV; else the sniffed one, or the one that splits most of
/// the first records into the same number (at least two) of fields; ',' by default.
fn delimiter(text: &str, tsv: bool) -> u8 {
    if tsv {
        return b'\t';
    }
    let head = crate::util::line_prefix(text, 64 * 1024);
    if let Some(d) = sniff_delimiter(head, head.len() == text.len()) {
        return d;
    }
    let mut best: Option<(u8, usize, usize)> = None; // (delimiter, share %, fields)
    for delim in [b',', b';', b'\t', b'|'] {
        let mut reader = csv::ReaderBuilder::new()
            .delimiter(delim)
            .has_headers(false)
            .flexible(true)
            .from_reader(head.as_bytes());
        let mut record = csv::ByteRecord::new();
        let mut counts: Vec<usize> = Vec::new();
        while counts.len() < 50 && matches!(reader.read_byte_record(&mut record), Ok(true)) {
            counts.push(record.len());
        }
        let Some(&mode) = counts
            .iter()
            .max_by_key(|&&c| (counts.iter().filter(|&&x| x == c).count(), c))
        else {
            continue;
        };
        let share = counts.iter().filter(|&&c| c == mode).count() * 100 / counts.len();
        if mode >= 2 && share >= 60 && best.is_none_or(|(_, s, f)| (share, mode) > (s, f)) {
            best = Some((delim, share, mode));
        }
    }
    best.map_or(b',', |(d, _, _)| d)
}

fn delimiter_name(d: u8) -> &'static str {
    match d {
        b'\t' => "tab",
        b',' => "','",
        b';' => "';'",
        b'|' => "'|'",
        _ => "other",
    }
}

/// Whether the first record is a header: every field is non-empty text (not a number, date or
/// boolean), and at least one field is.
fn is_header(fields: &[String]) -> bool {
    !fields.is_empty() && fields.iter().all(|f| classify(f) == Cell::Text)
}

/// The summary of a CSV (`tsv == false`) or TSV payload.
pub(crate) fn explore(text: &str, tsv: bool) -> Summary {
    let delim = delimiter(text, tsv);
    let mut reader = csv::ReaderBuilder::new()
        .delimiter(delim)
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    // The text is a &str and delimiters are ASCII, so every field is valid UTF-8.
    let mut record = csv::StringRecord::new();
    let mut first: Option<Vec<String>> = None;
    let mut columns: Vec<Column> = Vec::new();
    let mut samples: Vec<String> = Vec::new();
    let mut rows = 0u64;
    let mut ragged = 0u64;
    let mut header_width = 0usize;
    let mut error: Option<String> = None;
    let mut has_header = false;
    let sep = (delim as char).to_string();
    loop {
        match reader.read_record(&mut record) {
            Ok(true) => {}
            Ok(false) => break,
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
        // A blank line is not a row.
        if record.len() == 1 && record.get(0).is_some_and(str::is_empty) {
            continue;
        }
        if first.is_none() {
            let fields: Vec<String> = record.iter().map(str::to_string).collect();
            has_header = is_header(&fields);
            header_width = fields.len();
            columns = (0..fields.len()).map(|_| Column::default()).collect();
            first = Some(fields);
            if has_header {
                continue;
            }
        }
        rows += 1;
        if record.len() != header_width {
            ragged += 1;
        }
        for (i, v) in record.iter().enumerate() {
            if i >= columns.len() {
                if columns.len() >= 10_000 {
                    break;
                }
                columns.push(Column::default());
            }
            columns[i].add(v);
        }
        if samples.len() < 3 {
            let line: Vec<&str> = record.iter().collect();
            samples.push(truncate(&line.join(&sep), 200));
        }
    }
    let kind = if tsv || delim == b'\t' { "TSV" } else { "CSV" };
    let mut s = Summary::new(format!(
        "{kind}: {} row{} × {} column{}, {}",
        count(rows),
        plural(rows),
        countu(columns.len()),
        plural(columns.len() as u64),
        size(text.len())
    ));
    s.push(
        KEY,
        format!(
            "Delimiter {}; {}",
            delimiter_name(delim),
            if has_header {
                "first row is the header (not counted as a row)"
            } else {
                "no header row detected (columns are numbered)"
            }
        ),
    );
    if let Some(e) = &error {
        s.push(KEY, format!("Parse stopped early: {}", truncate(e, 160)));
    }
    if ragged > 0 {
        s.push(
            KEY,
            format!(
                "{} row{} with a field count other than {}",
                count(ragged),
                plural(ragged),
                header_width
            ),
        );
    }
    let names: Vec<String> = (0..columns.len())
        .map(|i| {
            first
                .as_ref()
                .filter(|_| has_header)
                .and_then(|f| f.get(i))
                .map_or_else(|| format!("column {}", i + 1), |n| truncate(n.trim(), 60))
        })
        .collect();
    if columns.len() > 1 {
        s.push(
            KEY,
            format!("Columns: {}", truncate(&names.join(", "), 4000)),
        );
    }
    s.heading(DETAIL, "Column types:");
    for (i, (name, col)) in names
        .iter()
        .zip(&columns)
        .enumerate()
        .take(MAX_COLUMN_LINES)
    {
        let rank = if columns.len() == 1 { KEY } else { DETAIL };
        s.push(rank, format!("  {}. {name}: {}", i + 1, col.describe(rows)));
    }
    if columns.len() > MAX_COLUMN_LINES {
        s.push(
            MINOR,
            format!(
                "  … {} more columns",
                countu(columns.len() - MAX_COLUMN_LINES)
            ),
        );
    }
    if !samples.is_empty() {
        s.heading(SAMPLE, "Sample rows:");
        for row in samples {
            s.push(SAMPLE, format!("  {row}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_ranges_and_counts() {
        let mut text = String::from("id,name,price,date,active,category\n");
        for i in 1..=500 {
            text.push_str(&format!(
                "{i},item {i},{}.{:02},2024-01-{:02},{},{}\n",
                i % 100,
                i % 97,
                (i % 28) + 1,
                i % 2 == 0,
                ["a", "b", "c"][i % 3]
            ));
        }
        let t = explore(&text, false).text();
        assert!(t.starts_with("CSV: 500 rows × 6 columns"), "{t}");
        assert!(
            t.contains("Columns: id, name, price, date, active, category"),
            "{t}"
        );
        assert!(t.contains("1. id: integer, range 1..500"), "{t}");
        assert!(t.contains("2. name: text, many distinct"), "{t}");
        assert!(t.contains("3. price: float, range 0.03..99.14"), "{t}");
        assert!(t.contains("4. date: date, 2024-01-01..2024-01-28"), "{t}");
        assert!(
            t.contains("5. active: boolean, 2 distinct: false (250), true (250)"),
            "{t}"
        );
        assert!(
            t.contains("6. category: text, 3 distinct: b (167), c (167), a (166)"),
            "{t}"
        );
        assert!(t.contains("  1,item 1,1.01,2024-01-02,false,b"), "{t}");
    }

    #[test]
    fn quoted_newlines_are_one_row() {
        let text = "a,b\n1,\"line one\nline two\"\n2,\"x\"\n";
        let t = explore(text, false).text();
        assert!(t.starts_with("CSV: 2 rows × 2 columns"), "{t}");
    }

    #[test]
    fn tsv_and_no_header() {
        let t = explore("1\t2\n3\t4\n", true).text();
        assert!(t.starts_with("TSV: 2 rows × 2 columns"), "{t}");
        assert!(t.contains("no header row detected"), "{t}");
        assert!(t.contains("1. column 1: integer, range 1..3"), "{t}");
    }

    #[test]
    fn semicolon_and_ragged_rows() {
        let t = explore("a;b;c\n1;2;3\n4;5\n6;7;8\n", false).text();
        assert!(t.contains("Delimiter ';'"), "{t}");
        assert!(t.contains("1 row with a field count other than 3"), "{t}");
    }

    #[test]
    fn empty_and_mixed() {
        let t = explore("", false).text();
        assert!(t.starts_with("CSV: 0 rows × 0 columns"), "{t}");
        let t = explore("x,y\n1,\n2.5,\nabc,\n", false).text();
        assert!(t.contains("1. x: text"), "{t}");
        assert!(t.contains("2. y: empty, 3 empty"), "{t}");
    }

    #[test]
    fn classify_cells() {
        assert_eq!(classify("42"), Cell::Integer);
        assert_eq!(classify("-7"), Cell::Integer);
        assert_eq!(classify("3.14"), Cell::Float);
        assert_eq!(classify("1e5"), Cell::Float);
        assert_eq!(classify("inf"), Cell::Text);
        assert_eq!(classify("TRUE"), Cell::Boolean);
        assert_eq!(classify("2024-05-01"), Cell::Date);
        assert_eq!(classify("2024-05-01 10:00:00"), Cell::DateTime);
        assert_eq!(classify(" "), Cell::Empty);
        assert_eq!(classify("hello"), Cell::Text);
    }
}
