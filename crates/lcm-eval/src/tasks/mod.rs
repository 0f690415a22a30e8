//! Procedurally generated tasks (`lcm eval`): each is made from a seed and a target context
//! length, with its ground truth computed exactly while it is generated, so a model cannot have
//! memorised it and its score needs no judge.
//!
//! - [`aggregation`]: questions about the distribution of hidden labels over a long record
//!   of TREC questions with users and dates, in the style of OOLONG's trec_coarse;
//! - [`needles`]: facts planted at chosen depths of a long session (single facts, facts updated
//!   later, two-hop chains), asked about after the session is compacted.

pub mod aggregation;
pub mod needles;

use serde::{Deserialize, Serialize};

/// A family of tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    Aggregation,
    Needles,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 2] = [Family::Aggregation, Family::Needles];

    /// The family's name in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Aggregation => "aggregation",
            Family::Needles => "needles",
        }
    }
}

/// Who says a turn of a generated session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Speaker {
    User,
    Assistant,
}

/// One turn of a generated session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    pub speaker: Speaker,
    pub text: String,
}

/// The exact answer to a question, and how a given answer is scored against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Answer {
    /// A label or a fixed phrase: exact match, ignoring case, spaces and a final full stop.
    Label(String),
    /// A count: 0.75 to the power of the distance to the given number (OOLONG's scoring).
    Count(u64),
    /// A value planted in the session (a code, a room): exact match as for labels.
    Text(String),
}

impl Answer {
    /// The score of `given` (a model's or a policy's answer) in `[0, 1]`.
    pub fn score(&self, given: &str) -> f64 {
        match self {
            Answer::Label(want) | Answer::Text(want) => {
                if normalise(given) == normalise(want) {
                    1.0
                } else {
                    0.0
                }
            }
            Answer::Count(want) => match first_number(given) {
                Some(n) => 0.75f64.powf(n.abs_diff(*want) as f64),
                None => 0.0,
            },
        }
    }

    /// The answer as text (what a perfect answer says).
    pub fn text(&self) -> String {
        match self {
            Answer::Label(s) | Answer::Text(s) => s.clone(),
            Answer::Count(n) => n.to_string(),
        }
    }
}

/// Lower case, single spaces, no surrounding quotes or final full stop.
fn normalise(s: &str) -> String {
    let words: Vec<&str> = s.split_whitespace().collect();
    words
        .join(" ")
        .trim_matches(|c| c == '"' || c == '\'' || c == '`')
        .trim_end_matches('.')
        .to_lowercase()
}

/// The first whole number in `s`.
fn first_number(s: &str) -> Option<u64> {
    let start = s.find(|c: char| c.is_ascii_digit())?;
    let digits: String = s[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// One question of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    /// What the question asks (for reports: `count`, `most_common`, `single_fact`, ...).
    pub kind: String,
    pub text: String,
    pub answer: Answer,
}

/// A generated task: a session and questions about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub family: Family,
    pub seed: u64,
    /// The context length asked for, in tokens (o200k_base).
    pub target_tokens: u64,
    /// The session's length as generated, in tokens: at most `target_tokens`.
    pub tokens: u64,
    pub turns: Vec<Turn>,
    pub questions: Vec<Question>,
    /// For needle tasks: the turns holding each planted fact (what must be compacted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub planted: Vec<usize>,
}

/// Generates the task of `family` over `items` (the TREC set) from `seed`, of at most
/// `target_tokens` as `counter` counts them.
pub fn generate(
    family: Family,
    items: &[crate::trec::Item],
    seed: u64,
    target_tokens: u64,
    counter: lcm_core::tokens::TokenCounter,
) -> Task {
    match family {
        Family::Aggregation => aggregation::generate(items, seed, target_tokens, counter),
        Family::Needles => needles::generate(items, seed, target_tokens, counter),
    }
}

/// Tokens of one turn as lcm counts a message (its text and the per-message overhead).
pub(crate) fn turn_tokens(counter: lcm_core::tokens::TokenCounter, text: &str) -> u64 {
    counter.count_text(text) as u64 + u64::from(lcm_core::tokens::MESSAGE_OVERHEAD_TOKENS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_score_as_oolong_does() {
        let label = Answer::Label("numeric value".into());
        assert_eq!(label.score("  Numeric   Value. "), 1.0);
        assert_eq!(label.score("location"), 0.0);
        let count = Answer::Count(10);
        assert_eq!(count.score("10"), 1.0);
        assert_eq!(count.score("There are 12 of them"), 0.75f64.powi(2));
        assert_eq!(count.score("none"), 0.0);
        assert_eq!(Answer::Text("QX-4821".into()).score("`qx-4821`"), 1.0);
    }
}
