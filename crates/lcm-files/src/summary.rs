//! The summary every explorer builds: ranked lines, capped to a token budget.
//!
//! An explorer pushes lines in reading order, each with a rank: [`HEAD`] for the first line
//! (what the payload is and how big), then [`KEY`], [`DETAIL`], [`MINOR`] and [`SAMPLE`] for
//! lines that matter less and less. [`Summary::finish`] joins them; when the text is over the
//! cap it drops lines of the highest rank first (the last of them first, so lists keep their
//! beginning), says how many it dropped, and as a last resort cuts the text by tokens with a
//! marker. Section headings ([`Summary::heading`]) go when every line under them went.

use lcm_core::tokens::TokenCounter;

/// The first line: what the payload is and its size. Dropped only by the final cut.
pub(crate) const HEAD: u8 = 0;
/// The structure that makes the summary worth having (columns, tables, definitions, levels).
pub(crate) const KEY: u8 = 1;
/// Secondary structure (nested keys, members, per-column detail).
pub(crate) const DETAIL: u8 = 2;
/// Minor facts (deeper nesting, constants, tail excerpts).
pub(crate) const MINOR: u8 = 3;
/// Sample values and rows: the first to go.
pub(crate) const SAMPLE: u8 = 4;

/// Appended when the text had to be cut inside a line.
const CUT_MARKER: &str = " …[cut]";

#[derive(Debug)]
struct Line {
    text: String,
    rank: u8,
    /// A section heading: dropped when all the lines of its section are.
    heading: bool,
    /// Text appended to the line (sample values, say) that can go on its own, with its rank.
    suffix: Option<(u8, String)>,
}

/// Ranked summary lines under construction.
#[derive(Debug)]
pub(crate) struct Summary {
    lines: Vec<Line>,
}

impl Summary {
    /// A summary whose first line is `head` (rank [`HEAD`]).
    pub(crate) fn new(head: impl Into<String>) -> Self {
        Summary {
            lines: vec![Line {
                text: head.into(),
                rank: HEAD,
                heading: false,
                suffix: None,
            }],
        }
    }

    /// Appends a line of rank `rank`.
    pub(crate) fn push(&mut self, rank: u8, text: impl Into<String>) {
        self.lines.push(Line {
            text: text.into(),
            rank: rank.max(KEY),
            heading: false,
            suffix: None,
        });
    }

    /// Appends a line of rank `rank` followed by `suffix`, which is dropped on its own (as a
    /// line of rank `suffix_rank` would be) before the line is.
    pub(crate) fn push_with(
        &mut self,
        rank: u8,
        text: impl Into<String>,
        suffix_rank: u8,
        suffix: Option<String>,
    ) {
        self.lines.push(Line {
            text: text.into(),
            rank: rank.max(KEY),
            heading: false,
            suffix: suffix
                .filter(|s| !s.is_empty())
                .map(|s| (suffix_rank.max(rank).max(KEY), s)),
        });
    }

    /// Appends a section heading: kept only while some line of its section (the lines up to the
    /// next heading) is kept.
    pub(crate) fn heading(&mut self, rank: u8, text: impl Into<String>) {
        self.lines.push(Line {
            text: text.into(),
            rank: rank.max(KEY),
            heading: true,
            suffix: None,
        });
    }

    /// Inserts a line right after the first one.
    pub(crate) fn insert_after_head(&mut self, rank: u8, text: impl Into<String>) {
        let at = 1.min(self.lines.len());
        self.lines.insert(
            at,
            Line {
                text: text.into(),
                rank: rank.max(KEY),
                heading: false,
                suffix: None,
            },
        );
    }

    /// The first line.
    #[cfg(test)]
    pub(crate) fn head(&self) -> &str {
        self.lines.first().map_or("", |l| l.text.as_str())
    }

    /// The whole text, uncapped.
    #[cfg(test)]
    pub(crate) fn text(&self) -> String {
        let all = vec![(true, true); self.lines.len()];
        self.render(&all)
    }

    /// The summary text, at most `max_tokens` tokens by `counter`.
    pub(crate) fn finish(self, counter: &TokenCounter, max_tokens: usize) -> String {
        if max_tokens == 0 {
            return String::new();
        }
        let n = self.lines.len();
        // kept[i] = (line kept, suffix kept)
        let mut kept = vec![(true, true); n];
        let full = self.render(&kept);
        if counter.count_text(&full) <= max_tokens {
            return full;
        }
        // Droppable units: (line, is_suffix). Order: highest rank first, within a rank the last
        // line first, a line's suffix before the line.
        let mut units: Vec<(u8, usize, bool, usize)> = Vec::new(); // (rank, line, suffix, cost)
        for (i, line) in self.lines.iter().enumerate() {
            if let Some((rank, text)) = &line.suffix {
                units.push((*rank, i, true, counter.count_text(text)));
            }
            if i > 0 && !line.heading {
                units.push((line.rank, i, false, counter.count_text(&line.text) + 1));
            }
        }
        units.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
        let mut estimate = counter.count_text(&full);
        // The "[… N lines omitted …]" note, once a line goes.
        let marker_cost = 14;
        let mut any_line_dropped = false;
        let mut next = 0;
        let drop_unit = |kept: &mut Vec<(bool, bool)>, unit: &(u8, usize, bool, usize)| {
            let (_, line, is_suffix, _) = *unit;
            if is_suffix {
                kept[line].1 = false;
            } else {
                kept[line] = (false, false);
            }
        };
        // Approximate pass: drop by estimated cost.
        while next < units.len()
            && estimate + if any_line_dropped { marker_cost } else { 0 } > max_tokens
        {
            let unit = units[next];
            if kept[unit.1].0 && (!unit.2 || kept[unit.1].1) {
                estimate = estimate.saturating_sub(unit.3);
            }
            any_line_dropped |= !unit.2;
            drop_unit(&mut kept, &unit);
            next += 1;
        }
        // Exact passes: count the candidate text and keep dropping while it is over.
        let mut rounds = 0;
        loop {
            let text = self.render(&kept);
            if counter.count_text(&text) <= max_tokens {
                return self.restore(kept, &units[..next], text, counter, max_tokens);
            }
            if next >= units.len() || rounds > 64 {
                return cut_to_tokens(&text, counter, max_tokens);
            }
            // Drop a few more units per round when far over.
            let batch = 1 + (units.len() - next) / 16;
            for _ in 0..batch {
                if next < units.len() {
                    let unit = units[next];
                    drop_unit(&mut kept, &unit);
                    next += 1;
                }
            }
            rounds += 1;
        }
    }

    /// After the estimate over-dropped: puts back the most important dropped units (the last
    /// dropped first) while the text still fits, for a few tries.
    fn restore(
        &self,
        mut kept: Vec<(bool, bool)>,
        dropped: &[(u8, usize, bool, usize)],
        mut text: String,
        counter: &TokenCounter,
        max_tokens: usize,
    ) -> String {
        for unit in dropped.iter().rev().take(6) {
            let (_, line, is_suffix, _) = *unit;
            let before = kept[line];
            if is_suffix {
                if !kept[line].0 {
                    break; // its line is gone too; restoring stops at the first miss
                }
                kept[line].1 = true;
            } else {
                kept[line].0 = true;
            }
            let candidate = self.render(&kept);
            if counter.count_text(&candidate) <= max_tokens {
                text = candidate;
            } else {
                kept[line] = before;
                break;
            }
        }
        text
    }

    /// The kept lines (with their kept suffixes), without orphaned headings, plus a note of how
    /// many lines went.
    fn render(&self, kept: &[(bool, bool)]) -> String {
        let mut keep: Vec<bool> = kept.iter().map(|k| k.0).collect();
        // A heading goes when no line of its section stays.
        for i in 0..self.lines.len() {
            if !self.lines[i].heading || !keep[i] {
                continue;
            }
            let mut any = false;
            for (line, &k) in self.lines[i + 1..].iter().zip(&keep[i + 1..]) {
                if line.heading || line.rank == HEAD {
                    break;
                }
                if k {
                    any = true;
                    break;
                }
            }
            if !any {
                keep[i] = false;
            }
        }
        let dropped = keep.iter().filter(|k| !**k).count();
        let mut out = String::new();
        let mut first = true;
        for (i, line) in self.lines.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if !first {
                out.push('\n');
            }
            first = false;
            out.push_str(&line.text);
            if let (Some((_, suffix)), true) = (&line.suffix, kept[i].1) {
                out.push_str(suffix);
            }
        }
        if dropped > 0 {
            out.push_str(&format!(
                "\n[… {dropped} line{} omitted to fit the token cap]",
                if dropped == 1 { "" } else { "s" }
            ));
        }
        out
    }
}

/// The longest prefix of `text` (cut at a char boundary) that, with [`CUT_MARKER`], is at most
/// `max_tokens` tokens; without the marker when even the marker does not fit.
pub(crate) fn cut_to_tokens(text: &str, counter: &TokenCounter, max_tokens: usize) -> String {
    if text.len() <= max_tokens.saturating_mul(64) && counter.count_text(text) <= max_tokens {
        return text.to_string();
    }
    let marker = if counter.count_text(CUT_MARKER) < max_tokens {
        CUT_MARKER
    } else {
        ""
    };
    // No token is longer than 64 bytes in practice: a longer prefix cannot fit, and cutting
    // here first keeps the search below from counting megabytes.
    let text = crate::util::prefix(text, max_tokens.saturating_mul(64));
    // Char boundaries of text; binary search the longest prefix that fits.
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(text.len()))
        .collect();
    let fits = |end: usize| {
        let mut candidate = String::with_capacity(end + marker.len());
        candidate.push_str(&text[..end]);
        candidate.push_str(marker);
        counter.count_text(&candidate) <= max_tokens
    };
    // Most texts are a few tokens per word: start from a bound that is surely short enough to
    // avoid counting megabytes.
    let mut lo = 0usize; // index into bounds, fits (the empty prefix, or marker only, may not)
    let mut hi = bounds.len() - 1; // does not fit
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(bounds[mid]) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Token counts are not perfectly monotonic in the prefix: step back until it really fits.
    while lo > 0 && !fits(bounds[lo]) {
        lo -= 1;
    }
    let end = bounds[lo];
    let mut out = text[..end].trim_end().to_string();
    if !marker.is_empty() && fits(out.len()) {
        out.push_str(marker);
    }
    if counter.count_text(&out) > max_tokens {
        return String::new();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;

    fn counter() -> TokenCounter {
        TokenCounter::new(Encoding::O200kBase)
    }

    #[test]
    fn small_summary_is_returned_whole() {
        let mut s = Summary::new("CSV: 3 rows");
        s.push(KEY, "Columns: a, b");
        s.push(SAMPLE, "1,2");
        assert_eq!(
            s.finish(&counter(), 1000),
            "CSV: 3 rows\nColumns: a, b\n1,2"
        );
    }

    #[test]
    fn samples_go_before_key_lines_and_head_stays() {
        let mut s = Summary::new("HEAD LINE");
        s.push(KEY, "key structure line");
        s.heading(SAMPLE, "Samples:");
        for i in 0..200 {
            s.push(
                SAMPLE,
                format!("sample value number {i} with some padding words"),
            );
        }
        let out = s.finish(&counter(), 60);
        assert!(out.starts_with("HEAD LINE\nkey structure line"), "{out}");
        assert!(out.contains("omitted to fit the token cap"), "{out}");
        assert!(counter().count_text(&out) <= 60);
        // Samples are dropped from the end: the first ones stay.
        assert!(out.contains("sample value number 0 "), "{out}");
        assert!(!out.contains("number 199"), "{out}");
    }

    #[test]
    fn suffixes_go_before_their_lines() {
        let mut s = Summary::new("HEAD");
        for i in 0..20 {
            s.push_with(
                KEY,
                format!("column_{i}: integer"),
                SAMPLE,
                Some(format!(" e.g. {}", "123456 ".repeat(10))),
            );
        }
        let out = s.finish(&counter(), 150);
        assert!(counter().count_text(&out) <= 150, "{out}");
        // Every column line survives; their samples went first.
        for i in 0..20 {
            assert!(out.contains(&format!("column_{i}: integer")), "{out}");
        }
        assert!(!out.contains("column_19: integer e.g."), "{out}");
    }

    #[test]
    fn orphaned_heading_goes_with_its_section() {
        let mut s = Summary::new("HEAD");
        s.push(KEY, "important ".repeat(5));
        s.heading(SAMPLE, "Samples:");
        s.push(SAMPLE, "x ".repeat(200));
        let out = s.finish(&counter(), 30);
        assert!(!out.contains("Samples:"), "{out}");
        assert!(out.contains("important"));
    }

    #[test]
    fn huge_head_is_cut_with_marker() {
        let s = Summary::new("word ".repeat(5000));
        let out = s.finish(&counter(), 50);
        assert!(counter().count_text(&out) <= 50);
        assert!(out.ends_with("…[cut]"), "{out}");
        assert!(out.starts_with("word word"));
    }

    #[test]
    fn zero_and_tiny_caps() {
        let s = Summary::new("something long enough to need cutting here");
        assert_eq!(s.finish(&counter(), 0), "");
        let s = Summary::new("something long enough to need cutting here");
        let out = s.finish(&counter(), 2);
        assert!(counter().count_text(&out) <= 2, "{out:?}");
    }
}
