//! A deterministic extractive summariser: no network, no key, no model.
//!
//! The text is cut into units (lines, and sentences within lines). Each unit is scored for the
//! signals a later reader most needs: questions and asks, decisions, errors and failures, file
//! paths, identifiers (snake_case, CamelCase, ids like `msg_12`, hashes), numbers, and open
//! commitments (TODO, "next step", "I'll ..."), with a bonus for the first and the last unit and
//! none for a repeated line. The best units by score per token are kept until the token target is
//! reached, each text once, and are emitted **in their original order**, lines joined by
//! newlines and sentences of one line by spaces.
//!
//! Guarantees: the same input gives the same output; text that fits the target is returned
//! unchanged; otherwise the output has at most `target` tokens (so it is shorter than the input);
//! when no whole unit fits, the head of the best unit is kept.

use std::collections::HashSet;
use std::sync::LazyLock;

use async_trait::async_trait;
use lcm_core::tokens::TokenCounter;
use regex::Regex;

use crate::prompts::SPAN_HEADER;
use crate::provider::{Completion, ProviderError};
use crate::structured::text::{compile, sentences};
use crate::summarize::{Summarizer, SummaryCall};
use crate::truncate::fit_prefix;

/// The extractive summariser (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub struct ExtractiveSummarizer {
    counter: TokenCounter,
}

/// One unit of the text: a sentence, or a line without sentence breaks.
#[derive(Debug)]
struct Unit<'a> {
    text: &'a str,
    line: usize,
    tokens: usize,
    priority: f64,
    /// The message or summary the unit belongs to, when the text is a span rendered by the
    /// engine (its `[msg_N role time]` headers); the unit is emitted as `msg_N: ...`.
    source: Option<&'a str>,
}

/// A line of a summary that already names its message (`msg_4: ...`): under a summary's
/// header it keeps that id rather than taking the summary's.
static CITES_ITS_SOURCE: LazyLock<Regex> = LazyLock::new(|| compile(r"^(?:msg|sum|file)_[0-9]+: "));

/// What the `msg_N: ` before a unit of another source costs, in tokens (about).
const SOURCE_PREFIX_TOKENS: usize = 4;

static ASK: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:please|can you|could you|would you|need to|needs to|must|make sure|how do|how can|why does|why is|what is|where is|let's)\b",
    )
});
static DECISION: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:decided|decide|decision|chose|choose|chosen|agreed|going with|switch(?:ed)? to|instead of|settled on|approved|rejected|opted)\b",
    )
});
/// Words that often, but not always, announce a decision: a small bonus.
static WEAK_DECISION: LazyLock<Regex> =
    LazyLock::new(|| compile(r"(?i)\b(?:will|won't|use|using|prefer|should)\b"));
static ERROR: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:error|errors|errored|fail|fails|failed|failing|failure|failures|exception|panic|panicked|traceback|fatal|crash|crashed|denied|refused|timeout|timed out|broken|bug|cannot|can't|unable|invalid|not found|segfault|assertion|regression|warning)\b",
    )
});
static PATH: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?:~|\.{1,2})?/[\w.-]+(?:/[\w.-]+)+|\b[\w-]+(?:/[\w.-]+)+\.\w{1,8}\b|\b[\w-]+\.(?:rs|py|ts|tsx|js|jsx|mjs|go|java|kt|c|h|cc|cpp|hpp|cs|rb|php|swift|md|toml|json|jsonl|yaml|yml|txt|sh|lock|log|sql|html|css|csv|xml|ini|cfg|conf|proto|gguf)\b",
    )
});
static IDENTIFIER: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+\b|\b[a-z]+(?:[A-Z][a-z0-9]+)+\b|\b[0-9a-f]{7,40}\b|\b[A-Z]{1,5}-?\d{2,}\b|\b\w+::\w+|\b\w+\(\)",
    )
});
static NUMBER: LazyLock<Regex> = LazyLock::new(|| compile(r"\d+(?:[.,:]\d+)*%?"));
static COMMITMENT: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:todo|fixme|next step|next steps|i'll|i will|we'll|we will|let me|going to|plan to|planned to|remaining|follow[- ]up|still need|still needs|pending|in progress|blocked|not yet|later)\b",
    )
});

/// The informativeness of a unit, before the position bonus and the length normalisation.
///
/// Weights: an error or failure 5, a file path 5 (a second one 2 more), an open commitment 4, a
/// question 3 and an ask 2, a decision 3 (a weak decision word 1), each of up to two identifiers
/// 2, each of up to two numbers 1.
fn signal_score(text: &str) -> u32 {
    let mut score = 0;
    if ERROR.is_match(text) {
        score += 5;
    }
    match PATH.find_iter(text).take(2).count() {
        0 => {}
        1 => score += 5,
        _ => score += 7,
    }
    if COMMITMENT.is_match(text) {
        score += 4;
    }
    if text.contains('?') {
        score += 3;
    }
    if ASK.is_match(text) {
        score += 2;
    }
    if DECISION.is_match(text) {
        score += 3;
    } else if WEAK_DECISION.is_match(text) {
        score += 1;
    }
    score += 2 * IDENTIFIER.find_iter(text).take(2).count() as u32;
    score += NUMBER.find_iter(text).take(2).count() as u32;
    score
}

impl ExtractiveSummarizer {
    /// A summariser counting tokens with `counter`.
    pub fn new(counter: TokenCounter) -> Self {
        ExtractiveSummarizer { counter }
    }

    /// Summarises `text` into at most `target_tokens` tokens (see the module documentation).
    pub fn summarize_text(&self, text: &str, target_tokens: u32) -> String {
        let target = target_tokens as usize;
        if self.counter.count_text(text) <= target {
            return text.to_owned();
        }
        if target == 0 {
            return String::new();
        }
        let mut units = self.units(text);
        if units.is_empty() {
            // Only whitespace, yet over the target: keep what fits.
            return text[..fit_prefix(&self.counter, text, target)].to_owned();
        }

        // Best first: priority, then fewer tokens, then earlier.
        let mut order: Vec<usize> = (0..units.len()).collect();
        order.sort_by(|&a, &b| {
            units[b]
                .priority
                .total_cmp(&units[a].priority)
                .then(units[a].tokens.cmp(&units[b].tokens))
                .then(a.cmp(&b))
        });
        let mut chosen = vec![false; units.len()];
        let mut kept: HashSet<&str> = HashSet::new();
        let mut used = 0usize;
        for &index in &order {
            let prefix = units[index].source.map_or(0, |_| SOURCE_PREFIX_TOKENS);
            let cost = units[index].tokens + 1 + prefix;
            // A unit said once is said: its copies would only fill the room another needs.
            if used + cost <= target && kept.insert(units[index].text) {
                chosen[index] = true;
                used += cost;
            }
        }

        // Token counts do not add up exactly across joins: verify, and drop the weakest until the
        // result fits (rarely more than once).
        let mut dropping = order.iter().rev().copied();
        loop {
            if !chosen.iter().any(|&c| c) {
                break;
            }
            let summary = assemble(&units, &chosen);
            if self.counter.count_text(&summary) <= target {
                return summary;
            }
            match dropping.find(|&index| chosen[index]) {
                Some(index) => chosen[index] = false,
                None => break,
            }
        }

        // No whole unit fits: the head of the best one.
        let best = units.swap_remove(order[0]).text;
        best[..fit_prefix(&self.counter, best, target)].to_owned()
    }

    fn units<'a>(&self, text: &'a str) -> Vec<Unit<'a>> {
        let mut units = Vec::new();
        let mut seen = HashSet::new();
        let mut source = None;
        for (line_number, line) in text.lines().enumerate() {
            // A span's header is no content: it names the source of the lines after it, which
            // are kept as `msg_N: ...` (headers kept as units crowded out what they head).
            if let Some(header) = SPAN_HEADER.captures(line) {
                source = header.get(1).map(|id| id.as_str());
                continue;
            }
            for sentence in sentences(line) {
                let score = if seen.insert(sentence) {
                    signal_score(sentence)
                } else {
                    0
                };
                units.push(Unit {
                    text: sentence,
                    line: line_number,
                    tokens: self.counter.count_text(sentence),
                    priority: f64::from(score),
                    source,
                });
            }
        }
        let last = units.len().saturating_sub(1);
        for (index, unit) in units.iter_mut().enumerate() {
            let mut score = unit.priority;
            if index == 0 || index == last {
                score += 2.0;
            }
            if unit.tokens < 4 {
                score -= 1.0;
            }
            // Score per token, softened: a long unit must carry more signal to win.
            unit.priority = score / ((unit.tokens + 4) as f64).sqrt();
        }
        units
    }
}

/// Joins the chosen units in their original order, each source's first line after `msg_N: `.
fn assemble(units: &[Unit<'_>], chosen: &[bool]) -> String {
    let mut out = String::new();
    let mut previous_line = None;
    let mut previous_source = None;
    for (unit, _) in units.iter().zip(chosen).filter(|(_, c)| **c) {
        match previous_line {
            None => {}
            Some(line) if line == unit.line => out.push(' '),
            Some(_) => out.push('\n'),
        }
        let new_line = previous_line != Some(unit.line);
        // A line citing its own message names no source for the lines after it.
        let cites_its_own = new_line && CITES_ITS_SOURCE.is_match(unit.text);
        if let Some(source) = unit.source
            && new_line
            && unit.source != previous_source
            && !cites_its_own
        {
            out.push_str(source);
            out.push_str(": ");
        }
        out.push_str(unit.text);
        previous_line = Some(unit.line);
        if new_line {
            previous_source = if cites_its_own { None } else { unit.source };
        }
    }
    out
}

#[async_trait]
impl Summarizer for ExtractiveSummarizer {
    fn model(&self) -> &str {
        "extractive"
    }

    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        Ok(Completion {
            text: self.summarize_text(call.content, call.target_tokens),
            ..Completion::default()
        })
    }

    fn is_offline(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_compile_and_match() {
        assert!(ERROR.is_match("thread 'main' panicked at src/lib.rs"));
        assert!(PATH.is_match("edited src/main.rs today"));
        assert!(PATH.is_match("see /etc/ssl/certs"));
        assert!(PATH.is_match("Cargo.toml"));
        assert!(!PATH.is_match("and/or"));
        assert!(IDENTIFIER.is_match("call summarize_with_escalation"));
        assert!(IDENTIFIER.is_match("the TokenCounter type"));
        assert!(IDENTIFIER.is_match("see msg_12"));
        assert!(IDENTIFIER.is_match("commit 3f9a2c1"));
        assert!(COMMITMENT.is_match("TODO: wire it"));
        assert!(DECISION.is_match("We decided to keep redb"));
        assert!(IDENTIFIER.is_match("error E0308 here"));
        assert!(NUMBER.is_match("E0308"));
    }
}
