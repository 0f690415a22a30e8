//! Aggregation tasks in the style of OOLONG's trec_coarse: a long record of questions from the
//! TREC set, each with a date and a user, whose categories (the set's coarse labels) are hidden;
//! questions about how the categories are distributed, overall, for one user or in a date range.
//! Counts are scored 0.75^|error|, labels by exact match, as OOLONG does.

use chrono::{Days, NaiveDate};
use lcm_core::tokens::TokenCounter;

use super::{Answer, Family, Question, Speaker, Task, Turn, turn_tokens};
use crate::trec::{Item, LABEL_NAMES};
use lcm_core::rng::SplitMix64;

/// Records per turn of the generated session.
const RECORDS_PER_TURN: usize = 10;
/// Users in one task.
const USERS: usize = 8;
/// Dates are spread over this many days from [`first_day`].
const DAYS: u64 = 730;

fn first_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(2023, 1, 1).unwrap_or_default()
}

/// One line of the record: when, who, and which TREC question (its label stays hidden).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub date: NaiveDate,
    pub user: u32,
    pub item: usize,
}

/// The line a record is written as.
pub fn record_line(record: &Record, items: &[Item]) -> String {
    format!(
        "Date: {} || User: {} || Instance: {}",
        record.date.format("%b %d, %Y"),
        record.user,
        items[record.item].text
    )
}

/// What the session opens with: the task, without the labels.
pub const PREAMBLE: &str = "Below is a record of questions people asked, one per line, each \
with its date and the id of the user who asked it. Every question belongs to one of six \
categories: abbreviation, description and abstract concept, entity, human being, location, \
numeric value. The categories are not written down: judge each question yourself.";

/// Generates an aggregation task over `items` (the TREC set) of at most `target_tokens`.
pub fn generate(items: &[Item], seed: u64, target_tokens: u64, counter: TokenCounter) -> Task {
    let mut rng = SplitMix64::new(seed ^ 0xA66E_6A7E);
    let mut users: Vec<u32> = Vec::with_capacity(USERS);
    while users.len() < USERS {
        let user = rng.in_range(10_000..100_000) as u32;
        if !users.contains(&user) {
            users.push(user);
        }
    }
    let mut turns = vec![Turn {
        speaker: Speaker::User,
        text: PREAMBLE.to_owned(),
    }];
    let mut tokens = turn_tokens(counter, PREAMBLE);
    let mut records: Vec<Record> = Vec::new();
    let mut lines: Vec<String> = Vec::new();
    loop {
        let record = Record {
            date: first_day() + Days::new(rng.below(DAYS)),
            user: users[rng.index(users.len())],
            item: rng.index(items.len()),
        };
        let line = record_line(&record, items);
        lines.push(line);
        let text = lines.join("\n");
        let size = turn_tokens(counter, &text);
        if tokens + size > target_tokens {
            lines.pop();
            break;
        }
        records.push(record);
        if lines.len() == RECORDS_PER_TURN {
            tokens += size;
            turns.push(Turn {
                speaker: Speaker::User,
                text,
            });
            lines.clear();
        }
    }
    if !lines.is_empty() {
        let text = lines.join("\n");
        tokens += turn_tokens(counter, &text);
        turns.push(Turn {
            speaker: Speaker::User,
            text,
        });
    }
    let questions = questions(&mut rng, items, &records, &users);
    Task {
        family: Family::Aggregation,
        seed,
        target_tokens,
        tokens,
        turns,
        questions,
        planted: Vec::new(),
    }
}

/// How many records of each label `keep` admits.
fn counts(items: &[Item], records: &[Record], keep: impl Fn(&Record) -> bool) -> [u64; 6] {
    let mut counts = [0u64; 6];
    for r in records.iter().filter(|r| keep(r)) {
        counts[items[r.item].label] += 1;
    }
    counts
}

/// The label that is strictly the most (`most`) or least common, if one is.
fn extreme(counts: &[u64; 6], most: bool) -> Option<usize> {
    let best = if most {
        counts.iter().max()
    } else {
        counts.iter().min()
    }?;
    let at: Vec<usize> = (0..6).filter(|i| counts[*i] == *best).collect();
    (at.len() == 1).then(|| at[0])
}

fn questions(
    rng: &mut SplitMix64,
    items: &[Item],
    records: &[Record],
    users: &[u32],
) -> Vec<Question> {
    let all = counts(items, records, |_| true);
    let name = |label: usize| LABEL_NAMES[label].to_owned();
    let mut out = Vec::new();
    let label = rng.index(6);
    out.push(Question {
        kind: "count".into(),
        text: format!(
            "How many of the questions in the record belong to the category '{}'? Answer with a number.",
            name(label)
        ),
        answer: Answer::Count(all[label]),
    });
    for (most, kind, word) in [
        (true, "most_common", "most"),
        (false, "least_common", "fewest"),
    ] {
        if let Some(label) = extreme(&all, most) {
            out.push(Question {
                kind: kind.into(),
                text: format!(
                    "Which category do the {word} questions in the record belong to? Answer with the category's name only."
                ),
                answer: Answer::Label(name(label)),
            });
        }
    }
    let a = rng.index(6);
    let b = (a + 1 + rng.index(5)) % 6;
    let relation = match all[a].cmp(&all[b]) {
        std::cmp::Ordering::Greater => "more common than",
        std::cmp::Ordering::Less => "less common than",
        std::cmp::Ordering::Equal => "same frequency as",
    };
    out.push(Question {
        kind: "comparison".into(),
        text: format!(
            "Is the category '{}' more common than, less common than, or the same frequency as the category '{}' in the record? Answer with one of: more common than, less common than, same frequency as.",
            name(a),
            name(b)
        ),
        answer: Answer::Label(relation.into()),
    });
    let user = users[rng.index(users.len())];
    let label = rng.index(6);
    out.push(Question {
        kind: "count_for_user".into(),
        text: format!(
            "How many questions asked by user {user} belong to the category '{}'? Answer with a number.",
            name(label)
        ),
        answer: Answer::Count(counts(items, records, |r| r.user == user)[label]),
    });
    let from = first_day() + Days::new(rng.below(DAYS / 2));
    let to = from + Days::new(30 + rng.below(DAYS / 2));
    let label = rng.index(6);
    out.push(Question {
        kind: "count_in_dates".into(),
        text: format!(
            "How many questions asked from {} to {} (both days included) belong to the category '{}'? Answer with a number.",
            from.format("%b %d, %Y"),
            to.format("%b %d, %Y"),
            name(label)
        ),
        answer: Answer::Count(
            counts(items, records, |r| r.date >= from && r.date <= to)[label],
        ),
    });
    out
}
