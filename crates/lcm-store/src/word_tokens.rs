//! The analyzer of the index's `words` field: tantivy's `en_stem` (simple tokenizer, tokens
//! over 40 bytes removed, lowercased, English Snowball stemmer), with each word's stem
//! remembered.
//!
//! Stemming was about a seventh of the index's CPU time on real transcripts, and the same few
//! thousand words make up most of any text, so each indexing thread keeps the stems it has
//! computed (up to [`MAX_CACHED_STEMS`] words, then it starts over). The terms are exactly
//! tantivy's `en_stem` terms, with the same positions and offsets (property-tested), so an
//! index written with either reads with the other; the analyzer is registered under tantivy's
//! name, `en_stem`, which is what the schema names.

use rustc_hash::FxHashMap;
use tantivy::tokenizer::{
    Language, LowerCaser, RawTokenizer, RemoveLongFilter, SimpleTokenizer, Stemmer, TextAnalyzer,
    Token, TokenFilter, TokenStream, Tokenizer,
};

/// Words whose stems one analyzer keeps; a text that brings more starts the cache over.
pub const MAX_CACHED_STEMS: usize = 100_000;

/// The `words` analyzer: `en_stem`'s chain with [`CachedEnglishStemmer`] as its last filter.
pub fn words_analyzer() -> TextAnalyzer {
    TextAnalyzer::builder(SimpleTokenizer::default())
        .filter(RemoveLongFilter::limit(40))
        .filter(LowerCaser)
        .filter(CachedEnglishStemmer)
        .build()
}

/// tantivy's English [`Stemmer`] filter, with the stem of every word it has seen remembered.
#[derive(Clone, Copy, Debug, Default)]
pub struct CachedEnglishStemmer;

impl TokenFilter for CachedEnglishStemmer {
    type Tokenizer<T: Tokenizer> = CachedStemFilter<T>;

    fn transform<T: Tokenizer>(self, inner: T) -> CachedStemFilter<T> {
        CachedStemFilter {
            inner,
            stems: FxHashMap::default(),
            stemmer: TextAnalyzer::builder(RawTokenizer::default())
                .filter(Stemmer::new(Language::English))
                .build(),
        }
    }
}

/// See [`CachedEnglishStemmer`]. Cloned per indexing thread, each with its own cache.
#[derive(Clone)]
pub struct CachedStemFilter<T> {
    inner: T,
    /// Lowercased word -> its stem.
    stems: FxHashMap<String, String>,
    /// tantivy's stemmer applied to one whole word, for the words not cached yet.
    stemmer: TextAnalyzer,
}

impl<T: Tokenizer> Tokenizer for CachedStemFilter<T> {
    type TokenStream<'a> = CachedStemStream<'a, T::TokenStream<'a>>;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> Self::TokenStream<'a> {
        if self.stems.len() > MAX_CACHED_STEMS {
            self.stems = FxHashMap::default();
        }
        CachedStemStream {
            tail: self.inner.token_stream(text),
            stems: &mut self.stems,
            stemmer: &mut self.stemmer,
        }
    }
}

pub struct CachedStemStream<'a, S> {
    tail: S,
    stems: &'a mut FxHashMap<String, String>,
    stemmer: &'a mut TextAnalyzer,
}

impl<S: TokenStream> TokenStream for CachedStemStream<'_, S> {
    fn advance(&mut self) -> bool {
        if !self.tail.advance() {
            return false;
        }
        let token = self.tail.token_mut();
        if let Some(stem) = self.stems.get(token.text.as_str()) {
            token.text.clear();
            token.text.push_str(stem);
            return true;
        }
        let stem = {
            let mut stemmed = self.stemmer.token_stream(&token.text);
            // The raw tokenizer yields the whole word as one token, which the stemmer replaces.
            if stemmed.advance() {
                stemmed.token().text.clone()
            } else {
                token.text.clone()
            }
        };
        self.stems
            .insert(std::mem::replace(&mut token.text, stem.clone()), stem);
        true
    }

    fn token(&self) -> &Token {
        self.tail.token()
    }

    fn token_mut(&mut self) -> &mut Token {
        self.tail.token_mut()
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
        check(&[
            text.to_owned(),
            text.to_owned(),
            "running connected".to_owned(),
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
        let mut filter = CachedEnglishStemmer.transform(SimpleTokenizer::default());
        let words: String = (0..MAX_CACHED_STEMS + 10)
            .map(|i| format!("w{i}ing "))
            .collect();
        let mut stream = filter.token_stream(&words);
        while stream.advance() {}
        assert!(filter.stems.len() > MAX_CACHED_STEMS);
        let mut stream = filter.token_stream("walking");
        assert!(stream.advance());
        assert_eq!(stream.token().text, "walk");
        assert_eq!(filter.stems.len(), 1);
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
