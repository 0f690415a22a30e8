//! The trigrams of a text as the trigram index ([`crate::trigram_index`]) keys them: each
//! distinct lowercased character trigram once, packed into a number, except those that start or
//! end with ASCII whitespace ([`lcm_regex::trigram::is_indexed`]) and those holding a character
//! whose lowercase is not exactly one character (`İ`), which the query planner never asks for.
//!
//! A key is the three lowercased characters packed 21 bits each ([`pack`]); the planner's grams
//! are keyed by the same function ([`gram_key`]), so both sides agree by construction. Each
//! character is lowercased on its own (tantivy's `LowerCaser`: no final-sigma rule), as the
//! planner assumes. The index records which messages hold a key, not how often, so a text's
//! repeats are dropped here: a 100 KB tool output has 100,000 windows and typically a few
//! thousand distinct trigrams.

use rustc_hash::FxHashSet;

use lcm_regex::trigram::is_edge_space;

/// Buffers that grew beyond this many entries are dropped after a text, so that one huge message
/// does not pin their memory.
const KEEP_CAPACITY: usize = 1 << 16;
/// Trigrams of three 7-bit characters.
pub(crate) const ASCII_TRIGRAMS: usize = 1 << 21;
/// Stands for a character that is in no trigram key (its lowercase is not one character).
const NO_GRAM: u32 = u32::MAX;

/// Three lowercased characters as one key: 21 bits each (every `char` fits), first one highest,
/// so keys sort as their characters do.
#[inline]
pub(crate) fn pack(a: u32, b: u32, c: u32) -> u64 {
    u64::from(a) << 42 | u64::from(b) << 21 | u64::from(c)
}

/// The key of a planner gram (three lowercased characters); `None` for anything else.
pub(crate) fn gram_key(gram: &str) -> Option<u64> {
    let mut chars = gram.chars();
    let (a, b, c) = (chars.next()?, chars.next()?, chars.next()?);
    chars
        .next()
        .is_none()
        .then(|| pack(a.into(), b.into(), c.into()))
}

/// The index of an all-ASCII key in a table of [`ASCII_TRIGRAMS`] entries, if it is one.
#[inline]
pub(crate) fn ascii_slot(key: u64) -> Option<usize> {
    let (a, b, c) = (key >> 42, (key >> 21) & 0x1f_ffff, key & 0x1f_ffff);
    (a < 128 && b < 128 && c < 128).then_some((a << 14 | b << 7 | c) as usize)
}

/// Collects the distinct trigram keys of one text at a time, reusing its buffers.
#[derive(Clone, Default)]
pub(crate) struct DistinctTrigrams {
    /// Trigrams of three ASCII characters seen in the current text, as bits of a 2^21-bit set
    /// indexed by the three lowercased 7-bit characters (allocated at first use: 256 KiB).
    seen_ascii: Vec<u64>,
    /// The bits set in `seen_ascii`, to clear them after the text.
    ascii_set: Vec<u32>,
    /// The other trigrams seen in the current text.
    seen: FxHashSet<u64>,
    /// The distinct keys of the current text, in order of first appearance.
    keys: Vec<u64>,
}

impl DistinctTrigrams {
    /// The distinct keys of `text`, in order of first appearance.
    pub(crate) fn keys(&mut self, text: &str) -> &[u64] {
        for bit in self.ascii_set.drain(..) {
            self.seen_ascii[(bit / 64) as usize] &= !(1 << (bit % 64));
        }
        if self.ascii_set.capacity() > KEEP_CAPACITY {
            self.ascii_set = Vec::new();
        }
        if self.seen_ascii.is_empty() {
            self.seen_ascii = vec![0; ASCII_TRIGRAMS / 64];
        }
        if self.seen.capacity() > KEEP_CAPACITY {
            self.seen = FxHashSet::default();
        } else {
            self.seen.clear();
        }
        if self.keys.capacity() > KEEP_CAPACITY {
            self.keys = Vec::new();
        } else {
            self.keys.clear();
        }
        // The two characters before the current one: lowercased code ([`NO_GRAM`] for a
        // character whose lowercase is not one character: never in a planner gram) and whether
        // it is whitespace no trigram may start with. ASCII bytes (two thirds of the text of real
        // transcripts, most of it in messages that also hold other characters) are decoded by
        // hand.
        let ((mut first, mut second), mut first_space, mut second_space) =
            ((NO_GRAM, NO_GRAM), false, false);
        let bytes = text.as_bytes();
        let mut at = 0;
        while at < bytes.len() {
            let (code, width, space) = match bytes[at] {
                byte if byte.is_ascii() => {
                    (u32::from(byte.to_ascii_lowercase()), 1, is_edge_space(byte))
                }
                _ => text[at..].chars().next().map_or((NO_GRAM, 1, false), |c| {
                    let code = single_lowercase(c).map_or(NO_GRAM, u32::from);
                    (code, c.len_utf8(), false)
                }),
            };
            // `first` is NO_GRAM until two characters were seen.
            if first != NO_GRAM && second != NO_GRAM && code != NO_GRAM && !first_space && !space {
                if first < 128 && second < 128 && code < 128 {
                    self.insert_ascii(first << 14 | second << 7 | code);
                } else {
                    let key = pack(first, second, code);
                    if self.seen.insert(key) {
                        self.keys.push(key);
                    }
                }
            }
            (first, second, first_space, second_space) = (second, code, second_space, space);
            at += width;
        }
        &self.keys
    }

    /// Records the trigram of three lowercased ASCII bytes, given as their 21-bit slot (7 bits
    /// each, first one highest), if it is new in this text.
    #[inline]
    fn insert_ascii(&mut self, bit: u32) {
        let (word, mask) = ((bit / 64) as usize, 1u64 << (bit % 64));
        if self.seen_ascii[word] & mask != 0 {
            return;
        }
        self.seen_ascii[word] |= mask;
        self.ascii_set.push(bit);
        self.keys.push(pack(bit >> 14, bit >> 7 & 0x7f, bit & 0x7f));
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

/// `n` pseudo-random CJK characters from `seed`: almost every trigram distinct (tests).
#[cfg(test)]
pub(crate) fn random_cjk(n: usize, seed: u32) -> String {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            char::from_u32(0x4e00 + (state >> 16) % 20_000).unwrap_or('x')
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;
    use tantivy::tokenizer::{LowerCaser, NgramTokenizer, TextAnalyzer};

    fn distinct(text: &str) -> Vec<String> {
        DistinctTrigrams::default()
            .keys(text)
            .iter()
            .map(|&key| unpack(key))
            .collect()
    }

    fn unpack(key: u64) -> String {
        [key >> 42, (key >> 21) & 0x1f_ffff, key & 0x1f_ffff]
            .into_iter()
            .map(|c| char::from_u32(c as u32).unwrap())
            .collect()
    }

    /// What the planner can ask for: every window of three characters, lowercased by tantivy's
    /// own `LowerCaser`, that is still three characters and is indexed.
    fn every_window(text: &str) -> Vec<String> {
        let mut analyzer = TextAnalyzer::builder(NgramTokenizer::new(3, 3, false).unwrap())
            .filter(LowerCaser)
            .build();
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            let gram = &stream.token().text;
            if gram.chars().count() == 3 && lcm_regex::trigram::is_indexed(gram) {
                out.push(gram.clone());
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
        // `İ` lowercases to two characters: no gram holds it.
        assert_eq!(distinct("xİy"), Vec::<String>::new());
        assert_eq!(distinct("abİcd"), Vec::<String>::new());
        assert_eq!(
            gram_key("abc"),
            Some(pack('a'.into(), 'b'.into(), 'c'.into()))
        );
        assert_eq!(gram_key("ab"), None);
        assert_eq!(gram_key("abcd"), None);
    }

    #[test]
    fn large_texts_release_their_buffers() {
        let mut trigrams = DistinctTrigrams::default();
        let big = random_cjk(200_000, 1);
        assert!(trigrams.keys(&big).len() > KEEP_CAPACITY);
        assert_eq!(trigrams.keys("small").len(), 3);
        assert!(trigrams.seen.capacity() <= KEEP_CAPACITY);
        assert!(trigrams.ascii_set.capacity() <= KEEP_CAPACITY);
        assert!(trigrams.keys.capacity() <= KEEP_CAPACITY);
    }

    #[test]
    fn ascii_slots_only_for_ascii_keys() {
        let key = pack('a'.into(), 'b'.into(), 'c'.into());
        assert_eq!(ascii_slot(key), Some((97 << 14) | (98 << 7) | 99));
        assert_eq!(ascii_slot(pack('a'.into(), 'é'.into(), 'c'.into())), None);
        assert_eq!(ascii_slot(pack(0x7f, 0x7f, 0x7f)), Some(ASCII_TRIGRAMS - 1));
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
