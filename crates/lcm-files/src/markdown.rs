//! Markdown: the heading outline (ATX `#` and setext underlined headings, outside code
//! fences) with levels and line numbers, length in lines and words, code fences counted by
//! language, links and tables counted, the first paragraph as a sample.

use crate::summary::{DETAIL, KEY, MINOR, SAMPLE, Summary};
use crate::util::{bytes as size, count, plural, truncate};

/// Headings listed at most.
const MAX_HEADINGS: usize = 300;

/// An ATX heading: (level, text).
pub(crate) fn atx(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start_matches(' ').len();
    if indent > 3 {
        return None;
    }
    let t = &line[indent..];
    let level = t.len() - t.trim_start_matches('#').len();
    if !(1..=6).contains(&level) {
        return None;
    }
    let rest = &t[level..];
    if !(rest.is_empty() || rest.starts_with(' ') || rest.starts_with('\t')) {
        return None;
    }
    let text = rest.trim().trim_end_matches('#').trim_end();
    Some((level, text))
}

/// An opening or closing code fence: (fence char, length, info string).
fn fence(line: &str) -> Option<(u8, usize, &str)> {
    let t = line.trim_start_matches(' ');
    if line.len() - t.len() > 3 {
        return None;
    }
    let c = *t.as_bytes().first()?;
    if c != b'`' && c != b'~' {
        return None;
    }
    let n = t.len() - t.trim_start_matches(c as char).len();
    (n >= 3).then(|| (c, n, t[n..].trim()))
}

/// The summary of a Markdown document.
pub(crate) fn explore(text: &str, first_line: usize) -> Summary {
    let mut lines = 0u64;
    let mut words = 0u64;
    let mut headings: Vec<(usize, usize, String)> = Vec::new(); // (level, line, text)
    let mut heading_count = 0u64;
    let mut fences: Vec<(String, u64)> = Vec::new();
    let mut fence_count = 0u64;
    let mut open: Option<(u8, usize)> = None;
    let mut links = 0u64;
    let mut images = 0u64;
    let mut table_rows = 0u64;
    let mut tables = 0u64;
    let mut prev_table = false;
    let mut prev_paragraph: Option<(usize, &str)> = None;
    let mut intro: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        lines += 1;
        words += line.split_whitespace().count() as u64;
        if let Some((c, n)) = open {
            if let Some((c2, n2, info)) = fence(line)
                && c2 == c
                && n2 >= n
                && info.is_empty()
            {
                open = None;
            }
            continue;
        }
        if let Some((c, n, info)) = fence(line) {
            open = Some((c, n));
            fence_count += 1;
            let lang = info.split_whitespace().next().unwrap_or("").to_string();
            let lang = if lang.is_empty() {
                "unlabelled".to_string()
            } else {
                truncate(&lang, 20)
            };
            if let Some(f) = fences.iter_mut().find(|f| f.0 == lang) {
                f.1 += 1;
            } else if fences.len() < 30 {
                fences.push((lang, 1));
            }
            prev_paragraph = None;
            continue;
        }
        if let Some((level, t)) = atx(line) {
            heading_count += 1;
            if headings.len() < MAX_HEADINGS {
                headings.push((level, first_line + i, truncate(t, 120)));
            }
            prev_paragraph = None;
            continue;
        }
        let trimmed = line.trim();
        // Setext: a paragraph line underlined with === (h1) or --- (h2).
        if let Some((pl, ptext)) = prev_paragraph {
            let is_eq = !trimmed.is_empty() && trimmed.bytes().all(|b| b == b'=');
            let is_dash = trimmed.len() >= 2 && trimmed.bytes().all(|b| b == b'-');
            if is_eq || is_dash {
                heading_count += 1;
                if headings.len() < MAX_HEADINGS {
                    headings.push((if is_eq { 1 } else { 2 }, pl, truncate(ptext.trim(), 120)));
                }
                prev_paragraph = None;
                continue;
            }
        }
        links += trimmed.matches("](").count() as u64;
        images += trimmed.matches("![").count() as u64;
        let is_table = trimmed.starts_with('|') && trimmed.len() > 1;
        if is_table {
            table_rows += 1;
            if !prev_table {
                tables += 1;
            }
        }
        prev_table = is_table;
        let is_text = !trimmed.is_empty()
            && !trimmed.starts_with(['-', '*', '>', '|', '<'])
            && !trimmed.starts_with(|c: char| c.is_ascii_digit());
        prev_paragraph = is_text.then_some((first_line + i, line));
        if intro.is_none() && is_text {
            intro = Some(truncate(trimmed, 300));
        }
    }
    links = links.saturating_sub(images);
    let mut head = format!(
        "Markdown: {} line{}, {} word{}, {}",
        count(lines),
        plural(lines),
        count(words),
        plural(words),
        size(text.len())
    );
    head.push_str(&format!(
        "; {} heading{}, {} code block{}",
        count(heading_count),
        plural(heading_count),
        count(fence_count),
        plural(fence_count)
    ));
    let mut s = Summary::new(head);
    if !headings.is_empty() {
        s.heading(KEY, "Outline:");
        let min_level = headings.iter().map(|h| h.0).min().unwrap_or(1);
        for (level, line, t) in &headings {
            let rank = match level - min_level {
                0 | 1 => KEY,
                2 => DETAIL,
                _ => MINOR,
            };
            s.push(
                rank,
                format!(
                    "{}{} {t} (L{line})",
                    "  ".repeat(level - min_level + 1),
                    "#".repeat(*level)
                ),
            );
        }
        if heading_count > headings.len() as u64 {
            s.push(
                MINOR,
                format!(
                    "  … {} more headings",
                    count(heading_count - headings.len() as u64)
                ),
            );
        }
    }
    if !fences.is_empty() {
        let list: Vec<String> = fences
            .iter()
            .map(|(l, n)| format!("{l} {}", count(*n)))
            .collect();
        s.push(
            DETAIL,
            format!("Code blocks by language: {}", list.join(", ")),
        );
    }
    if open.is_some() {
        s.push(DETAIL, "The last code block is not closed.");
    }
    if links + images + tables > 0 {
        s.push(
            MINOR,
            format!(
                "Links {}, images {}, tables {} ({} rows)",
                count(links),
                count(images),
                count(tables),
                count(table_rows)
            ),
        );
    }
    if let Some(intro) = intro {
        s.push(SAMPLE, format!("First paragraph: {intro}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outline_fences_and_counts() {
        let md = "# Title\n\nIntro text here.\n\n## Install\n\n```sh\n# not a heading\ncargo build\n```\n\n### Details ###\n\nSetext Two\n----------\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nSee [docs](http://x) and ![img](y.png).\n\n```\nplain\n```\n";
        let t = explore(md, 1).text();
        assert!(t.contains("; 4 headings, 2 code blocks"), "{t}");
        assert!(t.contains("  # Title (L1)"), "{t}");
        assert!(t.contains("    ## Install (L5)"), "{t}");
        assert!(t.contains("      ### Details (L12)"), "{t}");
        assert!(t.contains("    ## Setext Two (L14)"), "{t}");
        assert!(!t.contains("not a heading"), "{t}");
        assert!(
            t.contains("Code blocks by language: sh 1, unlabelled 1"),
            "{t}"
        );
        assert!(t.contains("Links 1, images 1, tables 1 (3 rows)"), "{t}");
        assert!(t.contains("First paragraph: Intro text here."), "{t}");
    }

    #[test]
    fn not_headings() {
        assert_eq!(atx("#hashtag"), None);
        assert_eq!(atx("    # code"), None);
        assert_eq!(atx("####### seven"), None);
        assert_eq!(atx("## Two ##"), Some((2, "Two")));
    }
}
