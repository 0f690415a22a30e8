//! Commitments: statements of intent by the agent and requests by the user, and what later
//! resolves them.
//!
//! Detection is by the form of a sentence, not by scores: an assistant sentence whose clause
//! starts with a first-person future ("I'll", "I will", "I'm going to", "let me", "next, I",
//! "now I need to", "TODO:") states an intent; "first A, then B" is two. Questions, offers to
//! the user ("let me know"), states of mind ("let me think", "let me see") and statements about
//! code are not intents.
//!
//! An intent is **fulfilled** by a later tool call that names one of its key terms (a path, an
//! identifier, a content word; a later statement that something is done counts too), or, if it
//! has no key terms ("let me check"), by the next tool call; it is **dropped** by a later
//! statement that gives it up ("instead", "no longer", "skip") naming a key term. A user's
//! request is open until the user speaks again: the turn that answered it ended.

use std::sync::LazyLock;

use regex::Regex;

use super::text::{compile, sentences, shorten_words};

/// Most words of a commitment's text.
const COMMITMENT_WORDS: usize = 24;

static INTENT: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)(?:^|[\s(,;:-])((?:(?:first|next|then|now|finally|after that|afterwards|once (?:that|this)(?: is| has)? \w+),?\s+)?(?:i'll|i will|i'm going to|i am going to|i'm gonna|i need to|i have to|i must|i should|i want to|i plan to|let me|let's|we'll|we will|we need to|we should)\s+\w+.*)",
    )
});
/// Openers that are not commitments: offers, asides, states of mind.
static NOT_INTENT: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)^(?:(?:first|next|then|now|finally),?\s+)?(?:let me know|let me be |let me explain|let me summari[sz]e|let me (?:think|see|recall|reflect)\b|let's (?:see|think)\b|i'll be |i will be |i need to know|i should (?:note|mention|point out|clarify)|i want to (?:note|mention|make sure you)|i'll note|i'll leave (?:it|that|this)|we'll see)",
    )
});
/// A sentence announcing the next step: "Now the token store:", "Commit and close:", "Next,
/// task 5:" (it ends with a colon and starts with a sequencing word or an imperative verb).
static ANNOUNCE: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)^(?:(?:now|next|first|then|finally|also|and now|ok(?:ay)?,? now|good,? now|great,? now)\b,?\s*\S|(?:add|run|commit|close|update|fix|check|create|write|remove|rename|build|test|verify|push|mark|start|wire|move|implement|clean up|mix|compile|format)\b).*:$",
    )
});
static TODO: LazyLock<Regex> =
    LazyLock::new(|| compile(r"(?:^|\s)(?:TODO|FIXME|Next steps?|Remaining):\s*(\S.*)"));
/// Verbs of the work an agent announces (imperative forms).
const ACTION_VERBS: &str = "add|update|run|rerun|re-run|commit|push|close|check|verify|create|write|fix|test|move|continue|do|see|register|remove|rework|implement|install|make|merge|mark|build|compile|read|review|replace|rename|clean|look|extract|start|finish|format|open|launch|pass|use|try|wire|claim|sync|set|change|refactor|modify|delete|restart|investigate|debug|search|find|grep|inspect|confirm|ensure|handle|edit|apply|switch|revert|include|expose|document|examine|explore|understand|figure|address|resolve|simplify|drop|keep|split|extend|hook|call|get|mint|deploy|release|tag|bump|port|migrate|convert|load|save|store|send|reply|answer|report|summari[sz]e|plan|prepare|wrap|lint|patch";

/// A clause opening with an imperative, after an optional sequencing word: "Now add the
/// route", "Close gqc.4", "Next, also update the docs", "Need to add the handler".
static IMPERATIVE: LazyLock<Regex> = LazyLock::new(|| {
    compile(&format!(
        r"(?i)^(?:(?:now|next|then|first|finally|so|ok(?:ay)?|good|great|continuing with \S+)\b[,:]?\s+)?(?:also\s+|just\s+|quickly\s+)?(?:(?:i\s+)?need to\s+)?(?:{ACTION_VERBS})\b\s+\S"
    ))
});
/// Where coordinated actions split: a comma, "and" or "then", then an action verb.
static COORDINATED: LazyLock<Regex> = LazyLock::new(|| {
    compile(&format!(
        r"(?i)(,\s*(?:and\s+)?(?:then\s+)?(?:i'll\s+)?|\s+and\s+(?:then\s+)?(?:i'll\s+)?|\s+then\s+(?:i'll\s+)?)({ACTION_VERBS})\b"
    ))
});
/// A statement that something is done.
static DONE: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:done|finished|completed|fixed|updated|added|created|implemented|ran|pass|passed|passes|passing|works|working|committed|pushed|wrote|removed|renamed|verified|confirmed)\b",
    )
});
/// A statement that gives something up.
static DROP: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:instead|no longer|not needed|isn't needed|unnecessary|skip|skipping|won't|will not|abandon|never ?mind|don't need|not going to)\b",
    )
});
static PATH_OR_IDENT: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"`([^`]{2,80})`|((?:[\w.-]+/)+[\w.-]+)|\b([\w-]+\.[a-z]{1,5})\b|\b([a-z][a-z0-9]*(?:_[a-z0-9]+)+|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[a-z]+(?:[A-Z][a-z0-9]+)+)\b",
    )
});
static WORD: LazyLock<Regex> = LazyLock::new(|| compile(r"[A-Za-z][A-Za-z0-9]{2,}"));

/// Words that say nothing about *what* is to be done.
const STOP: &[&str] = &[
    "the",
    "and",
    "for",
    "with",
    "that",
    "this",
    "these",
    "those",
    "then",
    "than",
    "now",
    "next",
    "first",
    "finally",
    "after",
    "let",
    "lets",
    "will",
    "ill",
    "going",
    "gonna",
    "need",
    "needs",
    "have",
    "must",
    "should",
    "want",
    "plan",
    "also",
    "just",
    "quickly",
    "again",
    "into",
    "from",
    "onto",
    "about",
    "what",
    "which",
    "where",
    "there",
    "here",
    "how",
    "why",
    "when",
    "all",
    "any",
    "some",
    "more",
    "other",
    "its",
    "it's",
    "our",
    "your",
    "their",
    "them",
    "they",
    "you",
    "can",
    "could",
    "would",
    "make",
    "sure",
    "check",
    "look",
    "see",
    "take",
    "get",
    "got",
    "find",
    "understand",
    "verify",
    "review",
    "examine",
    "explore",
    "investigate",
    "start",
    "begin",
    "continue",
    "proceed",
    "try",
    "use",
    "using",
    "run",
    "runs",
    "read",
    "write",
    "update",
    "fix",
    "add",
    "create",
    "implement",
    "change",
    "modify",
    "work",
    "working",
    "do",
    "does",
    "doing",
    "done",
    "thing",
    "things",
    "file",
    "files",
    "code",
    "current",
    "currently",
    "actually",
    "properly",
    "correctly",
    "right",
    "now",
    "way",
    "issue",
    "problem",
    "one",
    "two",
    "new",
    "existing",
    "same",
    "each",
    "every",
    "both",
    "back",
    "out",
    "over",
    "up",
    "down",
    "off",
    "are",
    "was",
    "were",
    "been",
    "being",
    "has",
    "had",
    "not",
    "but",
    "per",
    "via",
    "well",
    "good",
    "better",
    "full",
    "whole",
    "rest",
    "remaining",
    "step",
    "steps",
    "task",
    "tasks",
    "part",
    "parts",
    "things",
    "stuff",
    "details",
    "detail",
    "changes",
    "let's",
    "we'll",
    "i'll",
    "i'm",
    "approach",
    "implementation",
    "everything",
    "something",
];

/// What an intent is about: terms a later action or statement must name to fulfil it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyTerms {
    /// Paths, file names, identifiers, quoted code: the base names, lowercased.
    pub strong: Vec<String>,
    /// Content words, lowercased and stemmed.
    pub words: Vec<String>,
}

impl KeyTerms {
    /// The key terms of a commitment's text.
    pub fn of(text: &str) -> KeyTerms {
        let mut terms = KeyTerms::default();
        for caps in PATH_OR_IDENT.captures_iter(text) {
            if let Some(m) = caps.iter().skip(1).flatten().next() {
                let term = m.as_str().trim().to_lowercase();
                let base = term
                    .trim_end_matches('/')
                    .rsplit('/')
                    .next()
                    .unwrap_or(&term)
                    .to_owned();
                if base.len() >= 3 && !terms.strong.contains(&base) {
                    terms.strong.push(base);
                }
            }
        }
        for word in WORD.find_iter(text) {
            let lower = word.as_str().to_lowercase();
            if STOP.contains(&lower.as_str()) {
                continue;
            }
            let stem = stem(&lower);
            if stem.len() >= 3 && !terms.words.contains(&stem) {
                terms.words.push(stem);
            }
        }
        terms
    }

    /// Whether there is no term at all ("let me check").
    pub fn is_empty(&self) -> bool {
        self.strong.is_empty() && self.words.is_empty()
    }

    /// Whether `haystack` (lowercased) names one of the terms.
    pub fn named_in(&self, haystack_lower: &str) -> bool {
        self.strong
            .iter()
            .any(|t| haystack_lower.contains(t.as_str()))
            || self
                .words
                .iter()
                .any(|w| contains_word_prefix(haystack_lower, w))
    }
}

/// A crude stem: no plural `s`, at most five letters (`tests` -> `test`, `migrations` ->
/// `migra`, `formatting` -> `forma`).
fn stem(word: &str) -> String {
    let word = match word.strip_suffix("ies") {
        Some(stem) => stem,
        None => word
            .strip_suffix('s')
            .filter(|w| !w.ends_with('s'))
            .unwrap_or(word),
    };
    word.chars().take(5).collect()
}

/// Whether `haystack` holds a word starting with `prefix`.
fn contains_word_prefix(haystack: &str, prefix: &str) -> bool {
    haystack.match_indices(prefix).any(|(at, _)| {
        at == 0
            || !haystack[..at]
                .chars()
                .next_back()
                .is_some_and(char::is_alphanumeric)
    })
}

/// The intents stated in an assistant's text, in order, each shortened.
pub fn intents(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in text.lines() {
        let line = line.trim().trim_start_matches(['-', '*', '#', '>', ' ']);
        if let Some(caps) = TODO.captures(line) {
            if let Some(m) = caps.get(1) {
                found.push(shorten_words(m.as_str(), COMMITMENT_WORDS));
            }
            continue;
        }
        for sentence in sentences(line) {
            if sentence.ends_with('?') {
                continue;
            }
            // "Now gqc.6 — close the session": each side of a dash is its own clause.
            for clause in sentence.split(" — ").flat_map(|c| c.split(" – ")) {
                if let Some(intent) = intent_clause(clause.trim()) {
                    for part in coordinated(intent.trim_end_matches([':', '.', '!'])) {
                        if part.split_whitespace().count() >= 2 {
                            found.push(shorten_words(part, COMMITMENT_WORDS));
                        }
                    }
                }
            }
        }
    }
    found
}

/// The part of a clause that states an intent, if it does: from a first-person future on,
/// or the whole clause when it opens with an imperative ("Now add the route", "Close the
/// bead") or announces the next step with a colon.
fn intent_clause(clause: &str) -> Option<&str> {
    if let Some(m) = INTENT.captures(clause).and_then(|c| c.get(1)) {
        let from = m.as_str().trim();
        return (!NOT_INTENT.is_match(from)).then_some(from);
    }
    if IMPERATIVE.is_match(clause) || ANNOUNCE.is_match(clause) {
        return Some(clause);
    }
    None
}

/// Splits coordinated actions ("close the bead, commit and push") into one intent per verb:
/// at a comma, "and" or "then" followed by an action verb.
fn coordinated(clause: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    for caps in COORDINATED.captures_iter(clause) {
        let (Some(joint), Some(verb)) = (caps.get(1), caps.get(2)) else {
            continue;
        };
        // "Next, I'll run": a lone sequencing word is not an action of its own.
        if clause[start..joint.start()].split_whitespace().count() >= 2 {
            parts.push(clause[start..joint.start()].trim());
            start = verb.start();
        }
    }
    parts.push(clause[start..].trim());
    parts
}

/// Whether an intent is about the agent's very next step ("let me check the config", "now add
/// the route", "run the tests:"), rather than later work ("after that I'll update the docs",
/// "next, I'll commit").
pub fn is_immediate(intent: &str) -> bool {
    static LATER: LazyLock<Regex> = LazyLock::new(|| {
        compile(r"(?i)\b(?:after|afterwards|later|once|when|then|next time|eventually|finally)\b")
    });
    static NOW: LazyLock<Regex> = LazyLock::new(|| {
        compile(
            r"(?i)^(?:(?:ok(?:ay)?|good|great|now|first|so),?\s+)*(?:let me|let's|i'll now|now i'll|i will now)\b",
        )
    });
    !LATER.is_match(intent) && (NOW.is_match(intent) || IMPERATIVE.is_match(intent))
}

/// Whether a later statement says the work of `terms` is done.
pub fn states_done(statement: &str, terms: &KeyTerms) -> bool {
    Statement::new(statement).states_done(terms)
}

/// Whether a later statement gives up the work of `terms`.
pub fn states_dropped(statement: &str, terms: &KeyTerms) -> bool {
    Statement::new(statement).states_dropped(terms)
}

/// A later statement read once for the words of completion and of giving up, then checked
/// against any number of open commitments ([`states_done`], [`states_dropped`]): a message is
/// searched once, not once per commitment still open (there may be thousands).
#[derive(Debug, Clone)]
pub struct Statement {
    /// The statement in lower case, read only when it says something is done or dropped.
    lower: Option<String>,
    done: bool,
    dropped: bool,
}

impl Statement {
    /// Reads `statement`.
    pub fn new(statement: &str) -> Self {
        let done = DONE.is_match(statement);
        let dropped = DROP.is_match(statement);
        Statement {
            lower: (done || dropped).then(|| statement.to_lowercase()),
            done,
            dropped,
        }
    }

    /// Whether it says the work of `terms` is done.
    pub fn states_done(&self, terms: &KeyTerms) -> bool {
        self.done && self.names(terms)
    }

    /// Whether it gives up the work of `terms`.
    pub fn states_dropped(&self, terms: &KeyTerms) -> bool {
        self.dropped && self.names(terms)
    }

    fn names(&self, terms: &KeyTerms) -> bool {
        !terms.is_empty() && self.lower.as_deref().is_some_and(|l| terms.named_in(l))
    }
}

/// Whether a user's text asks the user to be left alone with the work: "never mind", "stop".
pub fn user_drops(text: &str) -> bool {
    static CANCEL: LazyLock<Regex> = LazyLock::new(|| {
        compile(r"(?i)^\s*(?:never ?mind|forget (?:it|that|about)|stop\b|cancel\b|don't bother)")
    });
    CANCEL.is_match(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intents_are_found_by_form() {
        assert_eq!(
            intents("Let me check the config."),
            ["Let me check the config"]
        );
        assert_eq!(
            intents("Good. Next, I'll run the tests and then I'll update README.md."),
            ["Next, I'll run the tests", "update README.md"]
        );
        assert_eq!(intents("TODO: wire the proxy"), ["wire the proxy"]);
        assert!(intents("Let me know if you want more.").is_empty());
        // States of mind promise no work: nothing would ever fulfil them in a conversation.
        assert!(intents("Let me think about the schema for a moment.").is_empty());
        assert!(intents("Hmm, let me see.").is_empty());
        assert!(intents("Let's think this through.").is_empty());
        assert_eq!(
            intents("Let me think. Then I'll update the schema."),
            ["Then I'll update the schema"]
        );
        assert!(intents("Should I also run the tests?").is_empty());
        assert_eq!(intents("Now the token store:"), ["Now the token store"]);
        assert_eq!(intents("Commit and close:"), ["Commit and close"]);
        assert!(intents("Here is the summary:").is_empty());
        assert!(intents("The function will return None.").is_empty());
        assert!(intents("I've updated the docs.").is_empty());
        assert_eq!(
            intents("The build passes, so now I need to commit the change."),
            ["now I need to commit the change"]
        );
    }

    #[test]
    fn key_terms_and_matching() {
        let terms = KeyTerms::of("Let me run the tests in `crates/lcm-core` for parse_line");
        assert!(terms.strong.contains(&"lcm-core".to_owned()));
        assert!(terms.strong.contains(&"parse_line".to_owned()));
        assert!(terms.words.contains(&"test".to_owned()));
        assert!(terms.named_in("cargo test -p x"));
        assert!(!terms.named_in("git status"));
        assert!(KeyTerms::of("Let me check.").is_empty());
        assert!(states_done(
            "All tests pass now.",
            &KeyTerms::of("run the tests")
        ));
        assert!(!states_done(
            "All tests pass now.",
            &KeyTerms::of("update the docs")
        ));
        assert!(states_dropped(
            "We don't need the migration any more, skipping it.",
            &KeyTerms::of("I'll write the migration")
        ));
        assert!(user_drops("never mind, leave it"));
        assert!(!user_drops("please stop the server when done"));
    }

    #[test]
    fn immediate_intents() {
        assert!(is_immediate("Let me check the others too"));
        assert!(is_immediate("Now add the route"));
        assert!(!is_immediate("After that I'll update CHANGELOG.md"));
        assert!(!is_immediate("I'll update the docs once the tests pass"));
        assert!(!is_immediate("Next, I'll commit"));
    }

    #[test]
    fn stems() {
        assert_eq!(stem("tests"), "test");
        assert_eq!(stem("migrations"), "migra");
        assert_eq!(stem("class"), "class");
        assert_eq!(stem("entries"), "entr");
        assert!(contains_word_prefix("mix format --check", "forma"));
        assert!(!contains_word_prefix("reformat", "forma"));
    }
}
