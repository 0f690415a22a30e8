//! Token-exact truncation: the deterministic last resort of the escalation, and the fallback of
//! the extractive summariser when no whole sentence fits.

use lcm_core::tokens::TokenCounter;

/// The size of a level-3 (deterministic) summary, in tokens, as in the LCM paper.
pub const TRUNCATION_BUDGET_TOKENS: u32 = 512;

/// Fewest content tokens worth a truncation marker; below that only the head is kept.
const MIN_CONTENT_WITH_MARKER: usize = 8;

/// Keeps the head and the tail of `text` with a marker between them saying how much was cut,
/// in at most `budget` tokens (counted with `counter`, marker included). Text that already fits
/// is returned unchanged. When the budget is too small for the marker, only the head is kept.
///
/// The marker reads `[... truncated from N tokens to B: M tokens cut from the middle ...]`.
pub fn truncate_middle(counter: &TokenCounter, text: &str, budget: u32) -> String {
    let budget = budget as usize;
    let total = counter.count_text(text);
    if total <= budget {
        return text.to_owned();
    }
    // The marker's size with the largest numbers it can carry.
    let marker_tokens = counter.count_text(&marker(total, budget, total)) + 2;
    let mut content_budget = budget.saturating_sub(marker_tokens);
    for _ in 0..4 {
        if content_budget < MIN_CONTENT_WITH_MARKER {
            break;
        }
        let head_budget = content_budget.div_ceil(2);
        let tail_budget = content_budget - head_budget;
        let head_end = fit_prefix(counter, text, head_budget);
        let tail_start = fit_suffix(counter, text, tail_budget).max(head_end);
        let head = text[..head_end].trim_end();
        let tail = text[tail_start..].trim_start();
        let kept = counter.count_text(head) + counter.count_text(tail);
        let cut = total.saturating_sub(kept);
        let result = format!("{head}{}{tail}", marker(total, budget, cut));
        let used = counter.count_text(&result);
        if used <= budget {
            return result;
        }
        content_budget = content_budget.saturating_sub(used - budget + 1);
    }
    text[..fit_prefix(counter, text, budget)].to_owned()
}

fn marker(total: usize, budget: usize, cut: usize) -> String {
    format!(
        "\n\n[... truncated from {total} tokens to {budget}: {cut} tokens cut from the middle ...]\n\n"
    )
}

/// The end of a prefix of `text` of at most `max_tokens` tokens, as long as a search finds,
/// preferring to end at whitespace. Costs O(prefix x log) tokenisation, not O(text).
pub(crate) fn fit_prefix(counter: &TokenCounter, text: &str, max_tokens: usize) -> usize {
    if max_tokens == 0 || text.is_empty() {
        return 0;
    }
    let fits = |end: usize| counter.count_text(&text[..end]) <= max_tokens;
    // Every token covers at least one byte, so `max_tokens` bytes always fit.
    let mut lo = text.floor_char_boundary(max_tokens);
    // Grow until a prefix does not fit (or the whole text does).
    let mut hi = lo;
    loop {
        if hi == text.len() {
            if fits(hi) {
                return hi;
            }
            break;
        }
        let next = text.ceil_char_boundary(hi.saturating_mul(2).max(hi + 1));
        if fits(next) {
            lo = next;
            hi = next;
        } else {
            hi = next;
            break;
        }
    }
    // Invariant: `lo` fits, `hi` does not.
    while hi - lo > 1 {
        let mid = text.floor_char_boundary(lo + (hi - lo) / 2);
        if mid <= lo {
            break;
        }
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    prefer_whitespace_end(text, lo)
}

/// The start of a suffix of `text` of at most `max_tokens` tokens (see [`fit_prefix`]).
pub(crate) fn fit_suffix(counter: &TokenCounter, text: &str, max_tokens: usize) -> usize {
    let len = text.len();
    if max_tokens == 0 || text.is_empty() {
        return len;
    }
    let fits = |start: usize| counter.count_text(&text[start..]) <= max_tokens;
    // Suffix lengths: `lo` fits, `hi` does not.
    let mut lo = len - text.ceil_char_boundary(len.saturating_sub(max_tokens));
    let mut hi = lo;
    loop {
        if hi == len {
            if fits(0) {
                return 0;
            }
            break;
        }
        let next =
            len - text.floor_char_boundary(len.saturating_sub(hi.saturating_mul(2).max(hi + 1)));
        if fits(len - next) {
            lo = next;
            hi = next;
        } else {
            hi = next;
            break;
        }
    }
    while hi - lo > 1 {
        let mid = len - text.ceil_char_boundary(len - (lo + (hi - lo) / 2));
        if mid <= lo {
            break;
        }
        if fits(len - mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    prefer_whitespace_start(text, len - lo)
}

/// Moves a prefix end back to just after the last whitespace within 64 bytes, so that a word is
/// not cut in two (a shorter prefix has at most as many tokens in practice).
fn prefer_whitespace_end(text: &str, end: usize) -> usize {
    if end == text.len() {
        return end;
    }
    let window_start = text.floor_char_boundary(end.saturating_sub(64));
    match text[window_start..end].rfind(char::is_whitespace) {
        Some(offset) if window_start + offset > 0 => window_start + offset,
        _ => end,
    }
}

/// Moves a suffix start forward to the first whitespace within 64 bytes.
fn prefer_whitespace_start(text: &str, start: usize) -> usize {
    if start == 0 {
        return start;
    }
    let window_end = text.ceil_char_boundary(start.saturating_add(64));
    match text[start..window_end].find(char::is_whitespace) {
        Some(offset) => start + offset,
        None => start,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;

    fn counter() -> TokenCounter {
        TokenCounter::new(Encoding::O200kBase)
    }

    fn sample(words: usize) -> String {
        (0..words)
            .map(|i| format!("word{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn prefix_and_suffix_fit() {
        let counter = counter();
        let text = format!("{} é漢字 {}", sample(3000), sample(50));
        for max in [0, 1, 5, 17, 100, 513, 4000] {
            let end = fit_prefix(&counter, &text, max);
            assert!(counter.count_text(&text[..end]) <= max, "prefix {max}");
            let start = fit_suffix(&counter, &text, max);
            assert!(counter.count_text(&text[start..]) <= max, "suffix {max}");
            if max >= 100 {
                assert!(
                    counter.count_text(&text[..end]) + 20 >= max.min(counter.count_text(&text))
                );
            }
        }
        assert_eq!(fit_prefix(&counter, "short", 100), 5);
        assert_eq!(fit_suffix(&counter, "short", 100), 0);
    }

    #[test]
    fn middle_truncation_keeps_head_tail_and_says_so() {
        let counter = counter();
        let text = format!("HEAD-START {} TAIL-END", sample(5000));
        let out = truncate_middle(&counter, &text, 512);
        assert!(counter.count_text(&out) <= 512);
        assert!(out.starts_with("HEAD-START"));
        assert!(out.ends_with("TAIL-END"));
        assert!(out.contains("truncated from"), "{out}");
        assert!(out.contains("tokens cut from the middle"));
    }

    #[test]
    fn tiny_budgets() {
        let counter = counter();
        let text = sample(200);
        assert_eq!(truncate_middle(&counter, &text, 0), "");
        let out = truncate_middle(&counter, &text, 10);
        assert!(counter.count_text(&out) <= 10);
        assert!(!out.contains("truncated"));
        assert_eq!(truncate_middle(&counter, "fits", 10), "fits");
    }
}
