//! The analyzer of the index's `words` field: tantivy's `en_stem` (simple tokenizer, tokens
//! of 40 bytes or more removed, lowercased, English Snowball stemmer) in one pass, with each
//! word's stem remembered.
//!
//! The chain of four was about a sixth of the indexing threads' CPU time, three copies of every
//! word and a stem lookup each. Here a word is found by a byte scan (ASCII fast path), looked up
//! as it stands in the text, and only its stem is copied into the token; a word not seen yet is
//! lowercased and stemmed exactly as tantivy does it. The same few thousand words make up most
//! of any text, so each indexing thread keeps the stems it has computed (up to
//! [`MAX_CACHED_STEMS`] words, then it starts over). The terms are exactly tantivy's `en_stem`
//! terms, with the same positions and offsets (property-tested), so an index written with either
//! reads with the other; the analyzer is registered under tantivy's name, `en_stem`, which is
//! what the schema names.

use rustc_hash::FxHashMap;
use tantivy::tokenizer::{
    Language, RawTokenizer, Stemmer, TextAnalyzer, Token, TokenStream, Tokenizer,
};

/// Words whose stems one analyzer keeps; a text that brings more starts the cache over.
pub const MAX_CACHED_STEMS: usize = 100_000;

/// Words of this many bytes or more are not indexed (`en_stem`'s `RemoveLongFilter::limit`).
const MAX_WORD_BYTES: usize = 40;

/// The `words` analyzer.
pub fn words_analyzer() -> TextAnalyzer {
    TextAnalyzer::from(StemmedWords::default())
}

/// The tokenizer of [`words_analyzer`]. Cloned per indexing thread, each with its own cache.
#[derive(Clone)]
pub struct StemmedWords {
    token: Token,
    /// A word as it appears in a text -> its lowercased stem.
    stems: FxHashMap<Box<str>, Box<str>>,
    /// tantivy's stemmer applied to one whole lowercased word, for the words not cached yet.
    stemmer: TextAnalyzer,
    /// Scratch for lowercasing.
    lowered: String,
}

impl Default for StemmedWords {
    fn default() -> Self {
        StemmedWords {
            token: Token::default(),
            stems: FxHashMap::default(),
            stemmer: TextAnalyzer::builder(RawTokenizer::default())
                .filter(Stemmer::new(Language::English))
                .build(),
            lowered: String::new(),
        }
    }
}

impl Tokenizer for StemmedWords {
    type TokenStream<'a> = StemmedWordStream<'a>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> StemmedWordStream<'a> {
        if self.stems.len() > MAX_CACHED_STEMS {
            self.stems = FxHashMap::default();
        }
        self.token.reset();
        StemmedWordStream {
            text,
            at: 0,
            token: &mut self.token,
            stems: &mut self.stems,
            stemmer: &mut self.stemmer,
            lowered: &mut self.lowered,
        }
    }
}

/// See [`StemmedWords`].
pub struct StemmedWordStream<'a> {
    text: &'a str,
    /// Where the search for the next word starts (always a char boundary).
    at: usize,
    token: &'a mut Token,
    stems: &'a mut FxHashMap<Box<str>, Box<str>>,
    stemmer: &'a mut TextAnalyzer,
    lowered: &'a mut String,
}

/// Whether the char at byte `at` of `text` (a char boundary) is part of a word, as tantivy's
/// simple tokenizer decides (`char::is_alphanumeric`), and its length in bytes.
fn word_char(text: &str, at: usize) -> (bool, usize) {
    match text.as_bytes()[at] {
        b if b.is_ascii() => (b.is_ascii_alphanumeric(), 1),
        _ => text[at..]
            .chars()
            .next()
            .map_or((false, 1), |c| (c.is_alphanumeric(), c.len_utf8())),
    }
}

/// `word` lowercased into `out` as tantivy's `LowerCaser` does it (char by char, so a final
/// sigma stays `σ`).
fn lowercase_into(word: &str, out: &mut String) {
    out.clear();
    if word.is_ascii() {
        out.push_str(word);
        out.make_ascii_lowercase();
    } else {
        for c in word.chars() {
            out.extend(c.to_lowercase());
        }
    }
}

impl TokenStream for StemmedWordStream<'_> {
    fn advance(&mut self) -> bool {
        let len = self.text.len();
        loop {
            // As tantivy's simple tokenizer, every word takes a position, kept or not.
            self.token.position = self.token.position.wrapping_add(1);
            let mut start = self.at;
            while start < len {
                let (in_word, width) = word_char(self.text, start);
                if in_word {
                    break;
                }
                start += width;
            }
            if start >= len {
                self.at = len;
                return false;
            }
            let mut end = start;
            while end < len {
                let (in_word, width) = word_char(self.text, end);
                if !in_word {
                    break;
                }
                end += width;
            }
            self.at = end;
            if end - start >= MAX_WORD_BYTES {
                continue;
            }
            let word = &self.text[start..end];
            self.token.offset_from = start;
            self.token.offset_to = end;
            self.token.text.clear();
            match self.stems.get(word) {
                Some(stem) => self.token.text.push_str(stem),
                None => {
                    lowercase_into(word, self.lowered);
                    let mut stemmed = self.stemmer.token_stream(self.lowered);
                    // The raw tokenizer yields the whole word as one token, which the stemmer
                    // replaces.
                    let stem = if stemmed.advance() {
                        stemmed.token().text.as_str()
                    } else {
                        self.lowered.as_str()
                    };
                    self.token.text.push_str(stem);
                    self.stems.insert(word.into(), stem.into());
                }
            }
            return true;
        }
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

    fn tokens(analyzer: &mut TextAnalyzer, text: &str) -> Vec<Token> {
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            out.push(stream.token().clone());
        }
        out
    }

    use tantivy::tokenizer::{LowerCaser, RemoveLongFilter, SimpleTokenizer};

    fn tantivy_en_stem() -> TextAnalyzer {
        TextAnalyzer::builder(SimpleTokenizer::default())
            .filter(RemoveLongFilter::limit(40))
            .filter(LowerCaser)
            .filter(Stemmer::new(Language::English))
            .build()
    }

    /// The same analyzer over several texts in a row (so later texts hit the cache) gives
    /// tantivy's tokens for each: text, position, offsets.
    fn check(texts: &[String]) {
        let mut ours = words_analyzer();
        let mut theirs = tantivy_en_stem();
        for text in texts {
            assert_eq!(
                tokens(&mut ours, text),
                tokens(&mut theirs, text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn stems_as_tantivy_does_cached_or_not() {
        let text = "Running runners ran; the RUNNING Runner's connections CONNECTED İstanbul \
                    straße naïve café 日本語 x2 v1.2.3 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let edges = format!(
            "{} {} {} {}ΣΑΣ end",
            "a".repeat(39),
            "b".repeat(40),
            "é".repeat(20),
            "ü".repeat(19)
        );
        check(&[
            text.to_owned(),
            text.to_owned(),
            "running connected".to_owned(),
            edges.clone(),
            edges,
            String::new(),
            " ,;".to_owned(),
        ]);
        let mut ours = words_analyzer();
        let stems: Vec<String> = tokens(&mut ours, "Running connections")
            .into_iter()
            .map(|t| t.text)
            .collect();
        assert_eq!(stems, ["run", "connect"]);
    }

    #[test]
    fn the_cache_starts_over_beyond_its_bound() {
        let mut tokenizer = StemmedWords::default();
        let words: String = (0..MAX_CACHED_STEMS + 10)
            .map(|i| format!("w{i}ing "))
            .collect();
        let mut stream = tokenizer.token_stream(&words);
        while stream.advance() {}
        assert!(tokenizer.stems.len() > MAX_CACHED_STEMS);
        let mut stream = tokenizer.token_stream("Walking");
        assert!(stream.advance());
        assert_eq!(stream.token().text, "walk");
        assert_eq!(tokenizer.stems.len(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn same_tokens_as_tantivy_en_stem(
            texts in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![
                        Just("running".to_owned()), Just("Runs".to_owned()),
                        Just("connection".to_owned()), Just("CONNECTED".to_owned()),
                        Just("generously".to_owned()), Just("i".to_owned()),
                        Just("the".to_owned()), Just("İ".to_owned()), Just("ß".to_owned()),
                        Just("ΣΑΣ".to_owned()), Just("日本".to_owned()), Just("x_1".to_owned()),
                        Just("42".to_owned()), Just(" ".to_owned()), Just(", ".to_owned()),
                        Just("\n".to_owned()), Just("'s".to_owned()), Just("-".to_owned()),
                        "[a-zA-Z]{1,50}", "\\PC{1,8}",
                    ],
                    0..30,
                ).prop_map(|pieces| pieces.concat()),
                1..5,
            ),
        ) {
            check(&texts);
        }
    }
}
