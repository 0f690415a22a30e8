//! Small shared helpers: number and size formatting, truncation, line counting, timestamps.

/// `12345` as `"12,345"`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// [`count`] for `usize`.
pub(crate) fn countu(n: usize) -> String {
    count(n as u64)
}

/// A byte size for people: "734 bytes", "12.3 KiB", "4.0 MiB", "1.2 GiB".
pub(crate) fn bytes(n: usize) -> String {
    const KIB: f64 = 1024.0;
    let f = n as f64;
    if n < 1024 {
        format!("{n} byte{}", if n == 1 { "" } else { "s" })
    } else if f < KIB * KIB {
        format!("{:.1} KiB", f / KIB)
    } else if f < KIB * KIB * KIB {
        format!("{:.1} MiB", f / (KIB * KIB))
    } else {
        format!("{:.1} GiB", f / (KIB * KIB * KIB))
    }
}

/// `"s"` when `n != 1`.
pub(crate) fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// At most `max_chars` characters of `s`, with "…" when cut.
pub(crate) fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        None => s.to_string(),
        Some((end, _)) => {
            let mut out = s[..end].to_string();
            out.push('…');
            out
        }
    }
}

/// Whitespace runs (newlines included) collapsed to one space, trimmed, at most `max_chars`
/// characters. Reads at most a bounded prefix of `s`, so it is cheap on huge nodes.
pub(crate) fn collapse(s: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0usize;
    let mut pending_space = false;
    for c in s.chars() {
        if c.is_whitespace() {
            pending_space = !out.is_empty();
            continue;
        }
        if pending_space {
            out.push(' ');
            chars += 1;
            pending_space = false;
        }
        if chars >= max_chars {
            out.push('…');
            return out;
        }
        out.push(c);
        chars += 1;
    }
    out
}

/// Lines in `bytes`: newlines, plus one for a last line without a newline.
pub(crate) fn line_count(bytes: &[u8]) -> usize {
    let newlines = bytes.iter().filter(|&&b| b == b'\n').count();
    if bytes.last().is_some_and(|&b| b != b'\n') {
        newlines + 1
    } else {
        newlines
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends at a char boundary.
pub(crate) fn prefix(s: &str, max: usize) -> &str {
    &s[..s.floor_char_boundary(max)]
}

/// [`prefix`], then back to the end of the last complete line when there is one.
pub(crate) fn line_prefix(s: &str, max: usize) -> &str {
    let p = prefix(s, max);
    if p.len() == s.len() {
        return p;
    }
    match p.rfind('\n') {
        Some(i) => &p[..=i],
        None => p,
    }
}

/// First bytes of `bytes` in hex: "89 50 4e 47 …".
pub(crate) fn hex_head(bytes: &[u8], n: usize) -> String {
    let mut out = String::new();
    for (i, b) in bytes.iter().take(n).enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&format!("{b:02x}"));
    }
    if bytes.len() > n {
        out.push_str(" …");
    }
    out
}

fn digits(s: &[u8], at: usize, n: usize) -> bool {
    s.len() >= at + n && s[at..at + n].iter().all(u8::is_ascii_digit)
}

/// A date "YYYY-MM-DD" (or with '/') at the start of `s`, with plausible month and day.
fn date_len(s: &[u8]) -> Option<usize> {
    if !(digits(s, 0, 4) && digits(s, 5, 2) && digits(s, 8, 2)) {
        return None;
    }
    let sep = s[4];
    if !(sep == b'-' || sep == b'/') || s[7] != sep {
        return None;
    }
    let month = (s[5] - b'0') * 10 + (s[6] - b'0');
    let day = (s[8] - b'0') * 10 + (s[9] - b'0');
    ((1..=12).contains(&month) && (1..=31).contains(&day)).then_some(10)
}

/// "HH:MM[:SS[.fff]]" at the start of `s`.
fn time_len(s: &[u8]) -> Option<usize> {
    if !(digits(s, 0, 2) && s.get(2) == Some(&b':') && digits(s, 3, 2)) {
        return None;
    }
    let mut n = 5;
    if s.get(5) == Some(&b':') && digits(s, 6, 2) {
        n = 8;
        if matches!(s.get(8), Some(b'.') | Some(b',')) && digits(s, 9, 1) {
            n = 9;
            while n < s.len() && s[n].is_ascii_digit() && n < 20 {
                n += 1;
            }
        }
    }
    Some(n)
}

/// A zone suffix "Z", "+02:00", "+0200", " UTC" at the start of `s`.
fn zone_len(s: &[u8]) -> usize {
    match s.first() {
        Some(b'Z') => 1,
        Some(b'+') | Some(b'-') => {
            if digits(s, 1, 2) && s.get(3) == Some(&b':') && digits(s, 4, 2) {
                6
            } else if digits(s, 1, 4) {
                5
            } else {
                0
            }
        }
        Some(b' ') if s.get(1..4) == Some(b"UTC") => 4,
        _ => 0,
    }
}

/// What a date-like value is, for CSV column types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DateKind {
    Date,
    DateTime,
}

/// `s` (whole) is an ISO-8601 date or date-time.
pub(crate) fn iso_date_kind(s: &str) -> Option<DateKind> {
    let b = s.as_bytes();
    let d = date_len(b)?;
    if b.len() == d {
        return Some(DateKind::Date);
    }
    if !matches!(b[d], b'T' | b' ') {
        return None;
    }
    let t = time_len(&b[d + 1..])?;
    let end = d + 1 + t;
    let z = zone_len(&b[end..]);
    (end + z == b.len()).then_some(DateKind::DateTime)
}

const MONTHS: [&[u8]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Length of a timestamp at the start of `s`: ISO-8601 date-time ("2024-01-05T10:00:00Z",
/// "2024-01-05 10:00:00,123"), syslog ("Jan  5 10:00:00"), or common log format
/// ("05/Jan/2024:10:00:00 +0000").
pub(crate) fn timestamp_len(s: &[u8]) -> Option<usize> {
    // ISO date + time.
    if let Some(d) = date_len(s) {
        if matches!(s.get(d), Some(b'T') | Some(b' '))
            && let Some(t) = time_len(&s[d + 1..])
        {
            let end = d + 1 + t;
            return Some(end + zone_len(&s[end..]));
        }
        return None;
    }
    // Syslog: "Mon dd HH:MM:SS".
    if s.len() >= 15 && MONTHS.contains(&&s[..3]) && s[3] == b' ' {
        let day_at = if s[4] == b' ' { 5 } else { 4 };
        let mut i = day_at;
        while i < s.len() && i < day_at + 2 && s[i].is_ascii_digit() {
            i += 1;
        }
        if i > day_at
            && s.get(i) == Some(&b' ')
            && let Some(t) = time_len(&s[i + 1..])
        {
            return Some(i + 1 + t);
        }
        return None;
    }
    // Common log format: "dd/Mon/yyyy:HH:MM:SS +zzzz".
    if s.len() >= 20
        && digits(s, 0, 2)
        && s[2] == b'/'
        && MONTHS.contains(&&s[3..6])
        && s[6] == b'/'
        && digits(s, 7, 4)
        && s[11] == b':'
        && let Some(t) = time_len(&s[12..])
    {
        let end = 12 + t;
        let z = if s.get(end) == Some(&b' ') {
            let z = zone_len(&s[end + 1..]);
            if z > 0 { z + 1 } else { 0 }
        } else {
            0
        };
        return Some(end + z);
    }
    None
}

/// The first timestamp in the first 64 bytes of `line`: `(start, end)` byte offsets.
pub(crate) fn find_timestamp(line: &str) -> Option<(usize, usize)> {
    let b = line.as_bytes();
    let limit = b.len().min(64);
    for i in 0..limit {
        let c = b[i];
        let boundary = i == 0 || !b[i - 1].is_ascii_alphanumeric();
        if !boundary || !(c.is_ascii_digit() || c.is_ascii_uppercase()) {
            continue;
        }
        if let Some(n) = timestamp_len(&b[i..]) {
            let end = i + n;
            if line.is_char_boundary(end) {
                return Some((i, end));
            }
        }
    }
    None
}

/// Log levels, in the order they are reported.
pub(crate) const LEVELS: [&str; 7] = [
    "FATAL", "CRITICAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE",
];

/// The index in [`LEVELS`] of the first level word (whole word, any case) in the first 200
/// bytes of `line`; "WARNING" counts as WARN, "ERR" as ERROR, "CRIT" as CRITICAL, "PANIC" as
/// FATAL.
pub(crate) fn level_of(line: &str, uppercase_only: bool) -> Option<usize> {
    let b = line.as_bytes();
    let limit = b.len().min(200);
    let mut i = 0;
    while i < limit {
        if !b[i].is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_alphabetic() {
            i += 1;
        }
        // A word glued to digits or '_' is an identifier, not a level.
        let glued = (start > 0 && (b[start - 1].is_ascii_alphanumeric() || b[start - 1] == b'_'))
            || (i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_'));
        let len = i - start;
        if glued || !(3..=8).contains(&len) {
            continue;
        }
        let word = &b[start..i];
        if uppercase_only && !word.iter().all(u8::is_ascii_uppercase) {
            continue;
        }
        let mut upper = [0u8; 8];
        for (k, c) in word.iter().enumerate() {
            upper[k] = c.to_ascii_uppercase();
        }
        let found = match &upper[..len] {
            b"FATAL" | b"PANIC" => Some(0),
            b"CRITICAL" | b"CRIT" => Some(1),
            b"ERROR" | b"ERR" => Some(2),
            b"WARN" | b"WARNING" => Some(3),
            b"INFO" => Some(4),
            b"DEBUG" => Some(5),
            b"TRACE" => Some(6),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_counts_and_sizes() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(12_000), "12,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(bytes(1), "1 byte");
        assert_eq!(bytes(734), "734 bytes");
        assert_eq!(bytes(12_595), "12.3 KiB");
        assert_eq!(bytes(4 * 1024 * 1024), "4.0 MiB");
    }

    #[test]
    fn truncates_and_collapses() {
        assert_eq!(truncate("héllo", 3), "hél…");
        assert_eq!(truncate("abc", 3), "abc");
        assert_eq!(
            collapse("  fn  main(\n  a: u32)  ", 100),
            "fn main( a: u32)"
        );
        assert_eq!(collapse("abcdef", 3), "abc…");
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(line_prefix("ab\ncd\nef", 7), "ab\ncd\n");
    }

    #[test]
    fn counts_lines() {
        assert_eq!(line_count(b""), 0);
        assert_eq!(line_count(b"a"), 1);
        assert_eq!(line_count(b"a\n"), 1);
        assert_eq!(line_count(b"a\nb"), 2);
    }

    #[test]
    fn recognises_timestamps() {
        assert_eq!(timestamp_len(b"2024-01-05T10:00:00Z rest"), Some(20));
        assert_eq!(timestamp_len(b"2024-01-05 10:00:00,123 INFO"), Some(23));
        assert_eq!(timestamp_len(b"2024-01-05T10:00:00.5+02:00"), Some(27));
        assert_eq!(timestamp_len(b"Jan  5 10:00:00 host sshd"), Some(15));
        assert_eq!(timestamp_len(b"Dec 25 23:59:59 x"), Some(15));
        assert_eq!(timestamp_len(b"05/Jan/2024:10:00:00 +0000]"), Some(26));
        assert_eq!(timestamp_len(b"2024-13-05T10:00:00"), None);
        assert_eq!(timestamp_len(b"hello"), None);
        assert_eq!(find_timestamp("[2024-01-05 10:00:00] x"), Some((1, 20)));
        assert_eq!(find_timestamp("no time here"), None);
        assert_eq!(iso_date_kind("2024-02-29"), Some(DateKind::Date));
        assert_eq!(
            iso_date_kind("2024-02-29T01:02:03Z"),
            Some(DateKind::DateTime)
        );
        assert_eq!(iso_date_kind("2024-02-29x"), None);
    }

    #[test]
    fn finds_level_words() {
        assert_eq!(level_of("2024 [ERROR] boom", false), Some(2));
        assert_eq!(level_of("warning: disk", false), Some(3));
        assert_eq!(level_of("info: no error here", false), Some(4));
        assert_eq!(level_of("ERROR_CODE=5 is not a level", false), None);
        assert_eq!(level_of("the information", false), None);
        assert_eq!(level_of("Error happened", true), None);
    }
}
