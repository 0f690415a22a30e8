//! The index side of the trigram scheme of [`crate::trigram`]: a tantivy tokenizer that yields
//! each distinct lowercased character trigram of a text once, except those that start or end
//! with ASCII whitespace ([`crate::trigram::is_indexed`]).
//!
//! Its terms are exactly those of tantivy's `NgramTokenizer::new(3, 3, false)` followed by
//! `LowerCaser` (every window of three characters, each character lowercased on its own, as the
//! query planner assumes) that [`crate::trigram::is_indexed`] keeps, but each only once. The
//! trigram field records which messages hold a term, with no frequencies or positions, so the
//! repeats carried nothing and were most of the indexing time: a 100 KB tool output has 100,000
//! windows and typically a few thousand distinct trigrams.

use rustc_hash::FxHashSet;
use tantivy::tokenizer::{Token, TokenStream, Tokenizer};

use crate::trigram::is_indexed_bytes;

/// Buffers that grew beyond this many entries are dropped after a text, so that one huge message
/// does not pin their memory in every indexing thread.
const KEEP_CAPACITY: usize = 1 << 16;
/// Trigrams of three 7-bit characters.
const ASCII_TRIGRAMS: usize = 1 << 21;

/// Yields the distinct lowercased character trigrams of a text, in order of first appearance.
#[derive(Clone, Default)]
pub struct DistinctTrigramTokenizer {
    /// Trigrams of three ASCII characters seen in the current text, as bits of a 2^21-bit set
    /// indexed by the three lowercased 7-bit characters (allocated at first use: 256 KiB).
    seen_ascii: Vec<u64>,
    /// The bits set in `seen_ascii`, to clear them after the text.
    ascii_set: Vec<u32>,
    /// The other trigrams seen in the current text whose characters each lowercase to one
    /// character, packed as three 21-bit code points.
    seen: FxHashSet<u64>,
    /// The other trigrams seen (a character such as `İ` lowercases to two), as text. They have
    /// more than three characters, so they never equal a packed one.
    seen_long: FxHashSet<String>,
    /// Byte range of the first window of each distinct trigram, in order.
    windows: Vec<(usize, usize)>,
    token: Token,
}

impl Tokenizer for DistinctTrigramTokenizer {
    type TokenStream<'a> = DistinctTrigramStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> DistinctTrigramStream<'a> {
        self.collect(text);
        self.token.reset();
        DistinctTrigramStream {
            text,
            ascii: text.is_ascii(),
            windows: self.windows.iter(),
            token: &mut self.token,
        }
    }
}

impl DistinctTrigramTokenizer {
    /// Fills `windows` with the first window of each distinct trigram of `text`.
    fn collect(&mut self, text: &str) {
        for bit in self.ascii_set.drain(..) {
            self.seen_ascii[(bit / 64) as usize] &= !(1 << (bit % 64));
        }
        if self.ascii_set.capacity() > KEEP_CAPACITY {
            self.ascii_set = Vec::new();
        }
        if self.seen_ascii.is_empty() {
            self.seen_ascii = vec![0; ASCII_TRIGRAMS / 64];
        }
        reset(&mut self.seen);
        reset(&mut self.seen_long);
        if self.windows.capacity() > KEEP_CAPACITY {
            self.windows = Vec::new();
        } else {
            self.windows.clear();
        }
        if text.is_ascii() {
            for (i, w) in text.as_bytes().windows(3).enumerate() {
                if !is_indexed_bytes(w) {
                    continue;
                }
                let (a, b, c) = (
                    w[0].to_ascii_lowercase(),
                    w[1].to_ascii_lowercase(),
                    w[2].to_ascii_lowercase(),
                );
                if self.insert_ascii(a, b, c) {
                    self.windows.push((i, i + 3));
                }
            }
            return;
        }
        // The two characters before the current one: byte offset and single-char lowercase.
        let mut before: [(usize, Option<char>); 2] = [(0, None); 2];
        for (n, (offset, c)) in text.char_indices().enumerate() {
            let lower = single_lowercase(c);
            if n >= 2 {
                let from = before[0].0;
                let to = offset + c.len_utf8();
                if !is_indexed_bytes(&text.as_bytes()[from..to]) {
                    before = [before[1], (offset, lower)];
                    continue;
                }
                let new = match (before[0].1, before[1].1, lower) {
                    (Some(a), Some(b), Some(c)) if a.is_ascii() && b.is_ascii() && c.is_ascii() => {
                        self.insert_ascii(a as u8, b as u8, c as u8)
                    }
                    (Some(a), Some(b), Some(c)) => self
                        .seen
                        .insert(u64::from(a) << 42 | u64::from(b) << 21 | u64::from(c)),
                    _ => {
                        let mut gram = String::with_capacity(16);
                        push_lowercase(&mut gram, &text[from..to]);
                        self.seen_long.insert(gram)
                    }
                };
                if new {
                    self.windows.push((from, to));
                }
            }
            before = [before[1], (offset, lower)];
        }
    }

    /// Records the trigram of three lowercased ASCII bytes; whether it is new in this text.
    fn insert_ascii(&mut self, a: u8, b: u8, c: u8) -> bool {
        let bit = u32::from(a) << 14 | u32::from(b) << 7 | u32::from(c);
        let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
        if self.seen_ascii[word] & mask != 0 {
            return false;
        }
        self.seen_ascii[word] |= mask;
        self.ascii_set.push(bit);
        true
    }
}

/// Clears a set, dropping its memory if one text made it large.
fn reset<T>(set: &mut FxHashSet<T>) {
    if set.capacity() > KEEP_CAPACITY {
        *set = FxHashSet::default();
    } else {
        set.clear();
    }
}

/// The lowercase of `c` if it is exactly one character.
fn single_lowercase(c: char) -> Option<char> {
    if c.is_ascii() {
        return Some(c.to_ascii_lowercase());
    }
    let mut lower = c.to_lowercase();
    let first = lower.next()?;
    lower.next().is_none().then_some(first)
}

/// Appends `text` lowercased character by character (tantivy's `LowerCaser`: no final-sigma
/// rule, unlike `str::to_lowercase`).
fn push_lowercase(out: &mut String, text: &str) {
    for c in text.chars() {
        out.extend(c.to_lowercase());
    }
}

/// The token stream of [`DistinctTrigramTokenizer`].
pub struct DistinctTrigramStream<'a> {
    text: &'a str,
    ascii: bool,
    windows: std::slice::Iter<'a, (usize, usize)>,
    token: &'a mut Token,
}

impl TokenStream for DistinctTrigramStream<'_> {
    fn advance(&mut self) -> bool {
        let Some(&(from, to)) = self.windows.next() else {
            return false;
        };
        self.token.offset_from = from;
        self.token.offset_to = to;
        self.token.position = 0;
        self.token.text.clear();
        let window = &self.text[from..to];
        if self.ascii || window.is_ascii() {
            self.token.text.push_str(window);
            self.token.text.make_ascii_lowercase();
        } else {
            push_lowercase(&mut self.token.text, window);
        }
        true
    }

    fn token(&self) -> &Token {
        self.token
    }

    fn token_mut(&mut self) -> &mut Token {
        self.token
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use tantivy::tokenizer::{LowerCaser, NgramTokenizer, TextAnalyzer};

    fn distinct(text: &str) -> Vec<String> {
        let mut tokenizer = DistinctTrigramTokenizer::default();
        let mut stream = tokenizer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            out.push(stream.token().text.clone());
        }
        out
    }

    /// What the index produced before: every window, lowercased by tantivy.
    fn every_window(text: &str) -> Vec<String> {
        let mut analyzer = TextAnalyzer::builder(NgramTokenizer::new(3, 3, false).unwrap())
            .filter(LowerCaser)
            .build();
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            if crate::trigram::is_indexed(&stream.token().text) {
                out.push(stream.token().text.clone());
            }
        }
        out
    }

    fn check(text: &str) {
        let ours = distinct(text);
        let set: BTreeSet<&String> = ours.iter().collect();
        assert_eq!(
            set.len(),
            ours.len(),
            "repeated trigram in {text:?}: {ours:?}"
        );
        let theirs: BTreeSet<String> = every_window(text).into_iter().collect();
        assert_eq!(
            set,
            theirs.iter().collect::<BTreeSet<_>>(),
            "terms of {text:?}"
        );
    }

    #[test]
    fn each_trigram_once_lowercased() {
        assert_eq!(distinct("abcABCabc"), ["abc", "bca", "cab"]);
        assert_eq!(distinct("ab"), Vec::<String>::new());
        assert_eq!(distinct(""), Vec::<String>::new());
        assert_eq!(distinct("ÀÉÎ àéî"), ["àéî", "î à"]);
        assert_eq!(distinct("ab cd\tef\u{b}gh"), ["b c", "d\te", "f\u{b}g"]);
        assert_eq!(distinct("Abc abcd\nbcd"), ["abc", "c a", "bcd", "d\nb"]);
        assert_eq!(distinct("x    y"), Vec::<String>::new());
    }

    #[test]
    fn characters_with_long_lowercase_match_tantivy() {
        // İ lowercases to two characters; Σ has a final form that LowerCaser does not apply.
        for text in [
            "İİİ aİb İx",
            "ΣΑΣ σας",
            "ẞtraße",
            "ǅemal ǆ",
            "日本語のテキスト 🦀🦀🦀",
            // The Kelvin sign lowercases to ASCII `k`: one term with the `kab` of ASCII text.
            "\u{212A}ab kab KAB",
        ] {
            check(text);
        }
        assert_eq!(distinct("xİy"), ["xi\u{307}y"]);
    }

    #[test]
    fn large_texts_release_their_buffers() {
        let mut tokenizer = DistinctTrigramTokenizer::default();
        let big: String = (0..200_000u32)
            .map(|i| char::from_u32(0x4e00 + i % 20_000).unwrap_or('x'))
            .collect();
        let mut stream = tokenizer.token_stream(&big);
        while stream.advance() {}
        let mut stream = tokenizer.token_stream("small");
        let mut n = 0;
        while stream.advance() {
            n += 1;
        }
        assert_eq!(n, 3);
        assert!(tokenizer.seen.capacity() <= KEEP_CAPACITY);
        assert!(tokenizer.ascii_set.capacity() <= KEEP_CAPACITY);
        assert!(tokenizer.windows.capacity() <= KEEP_CAPACITY);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn same_terms_as_ngrams_then_lowercaser(
            text in proptest::collection::vec(
                prop_oneof![
                    Just('a'), Just('B'), Just('c'), Just(' '), Just('\n'), Just('_'),
                    Just('İ'), Just('Σ'), Just('ς'), Just('ẞ'), Just('ǅ'), Just('é'),
                    Just('É'), Just('日'), Just('🦀'), Just('\u{307}'),
                    any::<char>(),
                ],
                0..40,
            ).prop_map(|chars| chars.into_iter().collect::<String>()),
        ) {
            check(&text);
        }

        #[test]
        fn same_terms_on_ascii(text in "[a-cA-C _\\n\\t\\r\\x0b\\x0c]{0,60}") {
            check(&text);
        }
    }
}
