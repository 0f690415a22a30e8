//! Plain text: lines, words, bytes, the longest line, a head excerpt and a tail excerpt (the
//! whole text when it is short).

use crate::summary::{DETAIL, KEY, MINOR, Summary};
use crate::util::{bytes as size, count, countu, plural, truncate};

/// Lines shown whole when the text has at most this many.
const SHORT: usize = 30;
/// Head lines otherwise.
const HEAD: usize = 15;
/// Tail lines otherwise.
const TAIL: usize = 8;

/// The summary of plain text.
pub(crate) fn explore(text: &str, first_line: usize) -> Summary {
    let mut lines = 0usize;
    let mut words = 0u64;
    let mut longest = 0usize;
    let mut blank = 0u64;
    for line in text.lines() {
        lines += 1;
        words += line.split_whitespace().count() as u64;
        longest = longest.max(line.len());
        if line.trim().is_empty() {
            blank += 1;
        }
    }
    let mut s = Summary::new(format!(
        "Text: {} line{}, {} word{}, {}",
        countu(lines),
        plural(lines as u64),
        count(words),
        plural(words),
        size(text.len())
    ));
    if lines > 1 {
        s.push(
            MINOR,
            format!(
                "Longest line {} bytes; {} blank lines",
                countu(longest),
                count(blank)
            ),
        );
    }
    if lines <= SHORT {
        if lines > 0 {
            s.heading(KEY, "Content:");
        }
        for (i, line) in text.lines().enumerate() {
            s.push(
                KEY,
                format!("  {}: {}", first_line + i, truncate(line, 200)),
            );
        }
        return s;
    }
    s.heading(KEY, "Head:");
    for (i, line) in text.lines().take(HEAD).enumerate() {
        s.push(
            KEY,
            format!("  {}: {}", first_line + i, truncate(line, 200)),
        );
    }
    s.heading(DETAIL, "Tail:");
    let tail: Vec<&str> = text.lines().rev().take(TAIL).collect();
    for (k, line) in tail.iter().rev().enumerate() {
        let n = first_line + lines - tail.len() + k;
        s.push(DETAIL, format!("  {n}: {}", truncate(line, 200)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_shown_whole() {
        let t = explore("hello world\nsecond line\n", 1).text();
        assert!(t.starts_with("Text: 2 lines, 4 words, 24 bytes"), "{t}");
        assert!(t.contains("  1: hello world\n  2: second line"), "{t}");
    }

    #[test]
    fn long_text_has_head_and_tail() {
        let text: String = (1..=100).map(|i| format!("line number {i}\n")).collect();
        let t = explore(&text, 1).text();
        assert!(t.starts_with("Text: 100 lines, 300 words"), "{t}");
        assert!(t.contains("  15: line number 15"), "{t}");
        assert!(!t.contains("  16: line number 16"), "{t}");
        assert!(t.contains("  93: line number 93\n"), "{t}");
        assert!(t.contains("  100: line number 100"), "{t}");
    }

    #[test]
    fn empty_text() {
        assert_eq!(explore("", 1).text(), "Text: 0 lines, 0 words, 0 bytes");
    }
}
