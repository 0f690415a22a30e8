//! From a regular expression to the trigrams any match must contain.
//!
//! The search index holds, per message, the set of lowercased character trigrams of its text.
//! This module turns a regex into a boolean query over those trigrams that every message with a
//! match satisfies (the converse need not hold: candidates are verified against the stored text).
//! It is a simplified form of the analysis Russ Cox describes for Google Code Search: each part
//! of the regex yields either a small set of exact strings it can match, or a query, and
//! concatenations join exact sets until they grow too large.
//!
//! Case: the index lowercases each trigram character by character (tantivy's `LowerCaser`), and
//! so does this module. A character whose lowercase is not exactly one character (`İ`) is treated
//! as unknown, never as a literal, so both sides always agree on what a trigram is.
//!
//! Whitespace: trigrams that start or end with an ASCII whitespace character are not indexed
//! ([`is_indexed`]). They were a fifth of the distinct trigrams of real transcripts (every word
//! boundary makes two, and indentation makes runs of them) and narrow little: the word they
//! touch has trigrams of its own. A trigram with whitespace only in the middle (`x y`) is kept:
//! it ties two short tokens together (`i += 1`, `a b`). The planner leaves the others out of its
//! queries, so a literal such as ` a ` constrains nothing and is scanned for.

use std::collections::BTreeSet;

use regex_syntax::hir::{Class, Hir, HirKind};

/// A boolean query over trigrams. `All` matches every message (no constraint).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TrigramQuery {
    All,
    Gram(String),
    And(Vec<TrigramQuery>),
    Or(Vec<TrigramQuery>),
}

impl TrigramQuery {
    /// Whether the query constrains anything (if not, grep must scan).
    pub fn is_all(&self) -> bool {
        matches!(self, TrigramQuery::All)
    }

    fn and(parts: Vec<TrigramQuery>) -> TrigramQuery {
        let mut flat = BTreeSet::new();
        for part in parts {
            match part {
                TrigramQuery::All => {}
                TrigramQuery::And(inner) => flat.extend(inner),
                other => {
                    flat.insert(other);
                }
            }
        }
        match flat.len() {
            0 => TrigramQuery::All,
            1 => flat.into_iter().next().unwrap_or(TrigramQuery::All),
            _ => TrigramQuery::And(flat.into_iter().collect()),
        }
    }

    fn or(parts: Vec<TrigramQuery>) -> TrigramQuery {
        let mut flat = BTreeSet::new();
        for part in parts {
            match part {
                TrigramQuery::All => return TrigramQuery::All,
                TrigramQuery::Or(inner) => flat.extend(inner),
                other => {
                    flat.insert(other);
                }
            }
        }
        match flat.len() {
            0 => TrigramQuery::All,
            1 => flat.into_iter().next().unwrap_or(TrigramQuery::All),
            _ => TrigramQuery::Or(flat.into_iter().collect()),
        }
    }
}

/// Largest set of exact strings tracked for one part of a regex.
const MAX_EXACT_SET: usize = 64;
/// Largest class expanded into single characters.
const MAX_CLASS_CHARS: usize = 16;
/// Longest exact string tracked; longer ones are turned into a query.
const MAX_EXACT_LEN: usize = 64;

/// What a piece of regex can match: a small set of exact (lowercased) strings, or only a query.
#[derive(Debug, Clone)]
struct Info {
    exact: Option<BTreeSet<String>>,
    query: TrigramQuery,
}

impl Info {
    fn exact(set: BTreeSet<String>) -> Info {
        Info {
            exact: Some(set),
            query: TrigramQuery::All,
        }
    }

    fn empty_string() -> Info {
        Info::exact(BTreeSet::from([String::new()]))
    }

    fn anything() -> Info {
        Info {
            exact: None,
            query: TrigramQuery::All,
        }
    }

    fn into_query(self) -> TrigramQuery {
        match self.exact {
            Some(set) => query_of_set(&set),
            None => self.query,
        }
    }
}

/// The trigram query for a parsed regex.
pub fn plan(hir: &Hir) -> TrigramQuery {
    analyze(hir).into_query()
}

/// The trigram query for a pattern (with the `regex` crate's default syntax).
pub fn plan_pattern(pattern: &str) -> Result<TrigramQuery, Box<regex_syntax::Error>> {
    let hir = regex_syntax::Parser::new()
        .parse(pattern)
        .map_err(Box::new)?;
    Ok(plan(&hir))
}

fn analyze(hir: &Hir) -> Info {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Info::empty_string(),
        HirKind::Literal(lit) => match std::str::from_utf8(&lit.0) {
            Ok(text) => literal_info(text),
            Err(_) => Info::anything(),
        },
        HirKind::Class(class) => class_info(class),
        HirKind::Capture(capture) => analyze(&capture.sub),
        HirKind::Repetition(rep) => {
            let sub = analyze(&rep.sub);
            match (rep.min, rep.max) {
                (0, Some(1)) => match sub.exact {
                    Some(mut set) if set.len() < MAX_EXACT_SET => {
                        set.insert(String::new());
                        Info::exact(set)
                    }
                    _ => Info::anything(),
                },
                (0, _) => Info::anything(),
                (min, Some(max)) if min == max && min <= 3 && sub.exact.is_some() => {
                    let mut acc = Info::empty_string();
                    for _ in 0..min {
                        acc = concat(vec![acc, sub.clone()]);
                    }
                    acc
                }
                _ => Info {
                    exact: None,
                    query: sub.into_query(),
                },
            }
        }
        HirKind::Concat(subs) => concat(subs.iter().map(analyze).collect()),
        HirKind::Alternation(subs) => {
            let infos: Vec<Info> = subs.iter().map(analyze).collect();
            if infos.iter().all(|i| i.exact.is_some()) {
                let mut union = BTreeSet::new();
                for info in &infos {
                    if let Some(set) = &info.exact {
                        union.extend(set.iter().cloned());
                    }
                }
                if union.len() <= MAX_EXACT_SET {
                    return Info::exact(union);
                }
            }
            Info {
                exact: None,
                query: TrigramQuery::or(infos.into_iter().map(Info::into_query).collect()),
            }
        }
    }
}

/// A literal string: exact if every character lowercases to one character; otherwise the
/// runs between unknown characters are kept as a query.
fn literal_info(text: &str) -> Info {
    let mut pieces: Vec<Info> = Vec::new();
    let mut run = String::new();
    for c in text.chars() {
        match lower_char(c) {
            Some(lc) => run.push(lc),
            None => {
                pieces.push(Info::exact(BTreeSet::from([std::mem::take(&mut run)])));
                pieces.push(Info::anything());
            }
        }
    }
    pieces.push(Info::exact(BTreeSet::from([run])));
    if pieces.len() == 1 {
        return pieces.pop().unwrap_or_else(Info::empty_string);
    }
    concat(pieces)
}

/// The lowercase of `c` if it is exactly one character.
fn lower_char(c: char) -> Option<char> {
    let mut lower = c.to_lowercase();
    let first = lower.next()?;
    lower.next().is_none().then_some(first)
}

fn class_info(class: &Class) -> Info {
    let Class::Unicode(class) = class else {
        return Info::anything();
    };
    let mut size = 0usize;
    for range in class.iter() {
        size += (range.end() as usize) - (range.start() as usize) + 1;
        if size > MAX_CLASS_CHARS * 4 {
            return Info::anything();
        }
    }
    let mut set = BTreeSet::new();
    for range in class.iter() {
        for c in range.start()..=range.end() {
            match lower_char(c) {
                Some(lc) => {
                    set.insert(lc.to_string());
                }
                None => return Info::anything(),
            }
        }
    }
    if set.len() > MAX_CLASS_CHARS {
        return Info::anything();
    }
    Info::exact(set)
}

fn concat(infos: Vec<Info>) -> Info {
    let mut queries = Vec::new();
    let mut current: BTreeSet<String> = BTreeSet::from([String::new()]);
    let mut all_exact = true;
    let mut flushed = false;
    for info in infos {
        match info.exact {
            Some(set) => {
                let product = cross(&current, &set);
                if product.len() > MAX_EXACT_SET || product.iter().any(|s| s.len() > MAX_EXACT_LEN)
                {
                    queries.push(query_of_set(&current));
                    current = set;
                    flushed = true;
                } else {
                    current = product;
                }
            }
            None => {
                all_exact = false;
                queries.push(query_of_set(&current));
                queries.push(info.query);
                current = BTreeSet::from([String::new()]);
            }
        }
    }
    if all_exact && !flushed {
        return Info::exact(current);
    }
    queries.push(query_of_set(&current));
    Info {
        exact: None,
        query: TrigramQuery::and(queries),
    }
}

fn cross(left: &BTreeSet<String>, right: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for l in left {
        for r in right {
            out.insert(format!("{l}{r}"));
            if out.len() > MAX_EXACT_SET {
                return out;
            }
        }
    }
    out
}

/// Any of the strings: OR over strings of AND over each string's trigrams. A string shorter
/// than three characters constrains nothing, so the whole set then constrains nothing.
fn query_of_set(set: &BTreeSet<String>) -> TrigramQuery {
    let mut alternatives = Vec::with_capacity(set.len());
    for s in set {
        let grams = trigrams(s);
        if grams.is_empty() {
            return TrigramQuery::All;
        }
        alternatives.push(TrigramQuery::and(
            grams.into_iter().map(TrigramQuery::Gram).collect(),
        ));
    }
    TrigramQuery::or(alternatives)
}

/// The indexed character trigrams of an already lowercased string (see [`is_indexed`]).
pub fn trigrams(s: &str) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars
        .windows(3)
        .map(|w| w.iter().collect::<String>())
        .filter(|gram| is_indexed(gram))
        .collect()
}

/// Whether the index holds this (lowercased) trigram: only if it neither starts nor ends with
/// ASCII whitespace (space, tab, line feed, vertical tab, form feed, carriage return: the ASCII
/// members of `\s`). The index's tokenizer and the planner both decide with this.
pub fn is_indexed(gram: &str) -> bool {
    is_indexed_bytes(gram.as_bytes())
}

/// [`is_indexed`] on the bytes of a trigram's window. A window's first byte starts its first
/// character and its last byte ends its last one, so ASCII whitespace there is the character
/// itself (`u8::is_ascii_whitespace` would leave out the vertical tab, which `\s` includes).
#[inline]
pub fn is_indexed_bytes(window: &[u8]) -> bool {
    let edge = |b: &u8| is_edge_space(*b);
    !(window.first().is_some_and(edge) || window.last().is_some_and(edge))
}

/// The ASCII whitespace no indexed trigram starts or ends with (as `\s` counts it).
#[inline]
pub fn is_edge_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grams(q: &TrigramQuery) -> BTreeSet<String> {
        match q {
            TrigramQuery::All => BTreeSet::new(),
            TrigramQuery::Gram(g) => BTreeSet::from([g.clone()]),
            TrigramQuery::And(v) | TrigramQuery::Or(v) => v.iter().flat_map(grams).collect(),
        }
    }

    #[test]
    fn literal_needs_all_its_trigrams() {
        let q = plan_pattern("Hello").unwrap();
        assert_eq!(
            q,
            TrigramQuery::And(vec![
                TrigramQuery::Gram("ell".into()),
                TrigramQuery::Gram("hel".into()),
                TrigramQuery::Gram("llo".into()),
            ])
        );
    }

    #[test]
    fn case_insensitive_literal_collapses_to_lowercase() {
        assert_eq!(
            plan_pattern("(?i)hello").unwrap(),
            plan_pattern("hello").unwrap()
        );
    }

    #[test]
    fn no_literal_means_scan() {
        for p in [".*", "\\w+", "a.b", "[a-z]{2,}", "ab", "(foo)?"] {
            assert!(plan_pattern(p).unwrap().is_all(), "{p}");
        }
    }

    #[test]
    fn alternation_and_optional_parts() {
        let q = plan_pattern("colou?r").unwrap();
        assert!(matches!(q, TrigramQuery::Or(_)), "{q:?}");
        assert!(grams(&q).contains("col"));
        let q = plan_pattern("foo|barbaz").unwrap();
        assert!(matches!(q, TrigramQuery::Or(_)), "{q:?}");
        assert!(plan_pattern("foo|b").unwrap().is_all());
    }

    #[test]
    fn wildcards_split_literals() {
        let q = plan_pattern("error:.*timeout").unwrap();
        let g = grams(&q);
        assert!(g.contains("err") && g.contains("out"), "{q:?}");
        assert!(matches!(q, TrigramQuery::And(_)));
    }

    #[test]
    fn trigrams_starting_or_ending_with_whitespace_are_left_out() {
        assert_eq!(
            grams(&plan_pattern("foo bar").unwrap()),
            BTreeSet::from(["foo".to_owned(), "o b".to_owned(), "bar".to_owned()])
        );
        assert_eq!(
            grams(&plan_pattern(r"i \+= 1").unwrap()),
            BTreeSet::from(["i +".to_owned(), "= 1".to_owned()])
        );
        for p in [" a ", "ab  cd", "x\n\ny", "a\t\tb"] {
            assert!(plan_pattern(p).unwrap().is_all(), "{p:?}");
        }
        assert!(is_indexed("a_b") && is_indexed("a b") && is_indexed("é\u{a0}x"));
        assert!(!is_indexed(" ab") && !is_indexed("\u{b}ab") && !is_indexed("ab\r"));
    }

    #[test]
    fn characters_with_long_lowercase_are_unknown() {
        // 'İ' lowercases to two characters: never part of a trigram.
        let g = grams(&plan_pattern("abİcde").unwrap());
        assert!(g.contains("cde"));
        assert!(g.iter().all(|t| !t.contains('i')), "{g:?}");
    }
}
