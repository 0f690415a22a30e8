//! The TREC question-classification set (Li and Roth; the data behind OOLONG's trec_coarse):
//! one question per line, `COARSE:fine question`, in ISO-8859-1.

use std::path::Path;

use crate::{EvalError, Result};

/// The coarse labels, in the set's spelling.
pub const LABELS: [&str; 6] = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"];

/// What each coarse label means, as the questions of the aggregation tasks name it.
pub const LABEL_NAMES: [&str; 6] = [
    "abbreviation",
    "description and abstract concept",
    "entity",
    "human being",
    "location",
    "numeric value",
];

/// One question of the set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// Index into [`LABELS`].
    pub label: usize,
    pub text: String,
}

/// Reads a TREC file.
pub fn load(path: &Path) -> Result<Vec<Item>> {
    let bytes = std::fs::read(path).map_err(|source| EvalError::Read {
        path: path.display().to_string(),
        source,
    })?;
    // ISO-8859-1: every byte is the code point of the same value.
    let text: String = bytes.iter().map(|&b| char::from(b)).collect();
    parse(&text, &path.display().to_string())
}

/// Parses the lines of a TREC file (`origin` names it in errors).
pub fn parse(text: &str, origin: &str) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |detail: String| EvalError::Format {
            origin: origin.to_owned(),
            at: format!("line {}", n + 1),
            detail,
        };
        let (labels, question) = line
            .split_once(' ')
            .ok_or_else(|| bad("expected `COARSE:fine question`".into()))?;
        let coarse = labels.split(':').next().unwrap_or_default();
        let label = LABELS
            .iter()
            .position(|l| *l == coarse)
            .ok_or_else(|| bad(format!("unknown coarse label `{coarse}`")))?;
        items.push(Item {
            label,
            text: question.trim().to_owned(),
        });
    }
    if items.is_empty() {
        return Err(EvalError::Format {
            origin: origin.to_owned(),
            at: "the whole file".into(),
            detail: "no questions".into(),
        });
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_and_bad_ones_say_where() {
        let items = parse(
            "DESC:manner How did serfdom develop ?\n\nNUM:date When was Ozzy born ?\n",
            "t",
        )
        .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(LABELS[items[1].label], "NUM");
        assert_eq!(items[0].text, "How did serfdom develop ?");
        let err = parse("DESC:x fine\nWHAT:x no\n", "t").unwrap_err();
        assert_eq!(err.to_string(), "t: line 2: unknown coarse label `WHAT`");
        assert!(parse("", "t").is_err());
    }
}
