//! Logs: line count, the time span (first and last timestamp: ISO-8601, syslog, common log
//! format), level counts (FATAL/CRITICAL/ERROR/WARN/INFO/DEBUG/TRACE: the first level word of
//! a line, any case), the first error lines with their numbers, and the most repeated lines
//! collapsed to templates (timestamps, numbers and hex ids replaced) with their counts. One
//! pass; the template table is capped at [`MAX_TEMPLATES`] entries.

use std::collections::HashMap;

use crate::summary::{DETAIL, KEY, MINOR, SAMPLE, Summary};
use crate::util::{
    LEVELS, bytes as size, count, find_timestamp, level_of, plural, prefix, truncate,
};

/// Distinct templates tracked; lines of templates first seen after that are not grouped.
const MAX_TEMPLATES: usize = 20_000;
/// Error lines quoted.
const MAX_ERRORS: usize = 5;
/// Repeated templates listed.
const MAX_REPEATED: usize = 10;

/// A line with its variable parts replaced: `<ts> INFO served <n> in <n>ms id=<hex>`.
pub(crate) fn template(line: &str) -> String {
    let line = prefix(line, 300);
    let mut out = String::with_capacity(line.len().min(200));
    let mut rest = line;
    if let Some((start, end)) = find_timestamp(line).filter(|(s, _)| *s <= 2) {
        out.push_str(&line[..start]);
        out.push_str("<ts>");
        rest = &line[end..];
    }
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphanumeric() {
            let start = i;
            while i < b.len() && b[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let word = &rest[start..i];
            let wb = word.as_bytes();
            let has_digit = wb.iter().any(u8::is_ascii_digit);
            if wb.iter().all(u8::is_ascii_digit) {
                out.push_str("<n>");
            } else if (wb.len() >= 6 && has_digit && wb.iter().all(u8::is_ascii_hexdigit))
                || (wb.len() > 2
                    && (word.starts_with("0x") || word.starts_with("0X"))
                    && wb[2..].iter().all(u8::is_ascii_hexdigit))
            {
                out.push_str("<hex>");
            } else if has_digit {
                // user123 -> user<n>
                let mut k = 0;
                while k < wb.len() {
                    if wb[k].is_ascii_digit() {
                        while k < wb.len() && wb[k].is_ascii_digit() {
                            k += 1;
                        }
                        out.push_str("<n>");
                    } else {
                        out.push(wb[k] as char);
                        k += 1;
                    }
                }
            } else {
                out.push_str(word);
            }
        } else {
            // Copy one (possibly multi-byte) character.
            let ch_len = rest[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&rest[i..i + ch_len]);
            i += ch_len;
        }
        if out.len() > 200 {
            break;
        }
    }
    truncate(out.trim_end(), 160)
}

/// The summary of a log.
pub(crate) fn explore(text: &str, first_line: usize) -> Summary {
    let mut lines = 0u64;
    let mut levels = [0u64; LEVELS.len()];
    let mut no_level = 0u64;
    let mut first_ts: Option<String> = None;
    let mut errors: Vec<(usize, String)> = Vec::new();
    let mut error_count = 0u64;
    let mut templates: HashMap<String, (u64, usize)> = HashMap::new();
    let mut untracked = 0u64;
    for (i, line) in text.lines().enumerate() {
        lines += 1;
        if line.trim().is_empty() {
            continue;
        }
        if first_ts.is_none()
            && let Some((s, e)) = find_timestamp(line)
        {
            first_ts = Some(line[s..e].to_string());
        }
        match level_of(line, false) {
            Some(l) => {
                levels[l] += 1;
                if l <= 2 {
                    error_count += 1;
                    if errors.len() < MAX_ERRORS {
                        errors.push((first_line + i, truncate(line.trim_end(), 240)));
                    }
                }
            }
            None => no_level += 1,
        }
        let t = template(line);
        if let Some(e) = templates.get_mut(&t) {
            e.0 += 1;
        } else if templates.len() < MAX_TEMPLATES {
            templates.insert(t, (1, first_line + i));
        } else {
            untracked += 1;
        }
    }
    // The last timestamp: from the end, over at most the last 10,000 lines.
    let last_ts = text
        .lines()
        .rev()
        .take(10_000)
        .find_map(|l| find_timestamp(l).map(|(s, e)| l[s..e].to_string()));

    let mut head = format!(
        "Log: {} line{}, {}",
        count(lines),
        plural(lines),
        size(text.len())
    );
    match (&first_ts, &last_ts) {
        (Some(a), Some(b)) if a != b => head.push_str(&format!(", {a} … {b}")),
        (Some(a), _) => head.push_str(&format!(", at {a}")),
        _ => {}
    }
    let mut s = Summary::new(head);
    let level_list: Vec<String> = LEVELS
        .iter()
        .zip(levels)
        .filter(|(_, n)| *n > 0)
        .map(|(l, n)| format!("{l} {}", count(n)))
        .collect();
    if level_list.is_empty() {
        s.push(KEY, "Levels: no level words found");
    } else {
        s.push(
            KEY,
            format!(
                "Levels: {}; {} line{} without a level",
                level_list.join(", "),
                count(no_level),
                plural(no_level)
            ),
        );
    }
    if !errors.is_empty() {
        let more = if error_count > errors.len() as u64 {
            format!(" (first {} of {})", errors.len(), count(error_count))
        } else {
            String::new()
        };
        s.heading(KEY, format!("Error lines{more}:"));
        for (n, line) in &errors {
            s.push(KEY, format!("  L{n}: {line}"));
        }
    }
    let mut repeated: Vec<(&String, &(u64, usize))> =
        templates.iter().filter(|(_, v)| v.0 > 1).collect();
    repeated.sort_by(|a, b| b.1.0.cmp(&a.1.0).then(a.1.1.cmp(&b.1.1)));
    if !repeated.is_empty() {
        s.heading(
            DETAIL,
            format!(
                "Most repeated lines ({} distinct templates; numbers, hex ids and timestamps replaced):",
                count(templates.len() as u64)
            ),
        );
        for (i, (t, (n, first))) in repeated.iter().take(MAX_REPEATED).enumerate() {
            let rank = if i < 3 { DETAIL } else { MINOR };
            s.push(rank, format!("  ×{} (first L{first}) {t}", count(*n)));
        }
    }
    if untracked > 0 {
        s.push(
            MINOR,
            format!(
                "{} lines past the first {MAX_TEMPLATES} templates were not grouped.",
                count(untracked)
            ),
        );
    }
    let tail: Vec<&str> = text
        .lines()
        .rev()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect();
    if lines > 10 && !tail.is_empty() {
        s.heading(SAMPLE, "Last lines:");
        for l in tail.iter().rev() {
            s.push(SAMPLE, format!("  {}", truncate(l, 200)));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_replace_variable_parts() {
        assert_eq!(
            template("2024-01-05T10:00:00Z INFO request 12345 served in 37ms id=deadbeef42"),
            "<ts> INFO request <n> served in <n>ms id=<hex>"
        );
        assert_eq!(
            template("[2024-01-05 10:00:00] user42 0xFF"),
            "[<ts>] user<n> <hex>"
        );
        assert_eq!(template("héllo wörld 5"), "héllo wörld <n>");
    }

    #[test]
    fn levels_errors_span_and_repeats() {
        let mut text = String::new();
        for i in 0..1000 {
            let level = match i {
                10 | 500 => "ERROR",
                20 => "warning",
                _ => "INFO",
            };
            text.push_str(&format!(
                "2024-03-01T10:{:02}:{:02}Z {level} handled request {i} in {}ms\n",
                i / 60 % 60,
                i % 60,
                i % 7
            ));
        }
        let t = explore(&text, 1).text();
        assert!(
            t.starts_with("Log: 1,000 lines, ")
                && t.contains("2024-03-01T10:00:00Z … 2024-03-01T10:16:39Z"),
            "{t}"
        );
        assert!(
            t.contains("Levels: ERROR 2, WARN 1, INFO 997; 0 lines without a level"),
            "{t}"
        );
        assert!(
            t.contains("  L11: 2024-03-01T10:00:10Z ERROR handled request 10 in 3ms"),
            "{t}"
        );
        assert!(t.contains("  L501: "), "{t}");
        assert!(
            t.contains("×997 (first L1) <ts> INFO handled request <n> in <n>ms"),
            "{t}"
        );
    }

    #[test]
    fn syslog_span_and_no_levels() {
        let t = explore("Jan  5 10:00:00 host a\nJan  5 11:00:00 host b\n", 1).text();
        assert!(t.contains("Jan  5 10:00:00 … Jan  5 11:00:00"), "{t}");
        assert!(t.contains("no level words"), "{t}");
    }
}
