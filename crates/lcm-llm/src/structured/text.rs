//! Text helpers shared by the offline summarisers: fixed patterns, sentences, shortening.

use regex::Regex;

/// Compiles one of the crate's fixed patterns.
pub(crate) fn compile(pattern: &str) -> Regex {
    match Regex::new(pattern) {
        Ok(regex) => regex,
        // The patterns are constants covered by the tests; this cannot happen at run time.
        Err(error) => panic!("invalid built-in pattern {pattern:?}: {error}"),
    }
}

/// Cuts a line into sentences: after `.`, `!` or `?` followed by whitespace.
pub(crate) fn sentences(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        loop {
            if rest.is_empty() {
                return None;
            }
            let bytes = rest.as_bytes();
            let cut = (0..bytes.len().saturating_sub(1))
                .find(|&i| {
                    matches!(bytes[i], b'.' | b'!' | b'?') && bytes[i + 1].is_ascii_whitespace()
                })
                .map_or(rest.len(), |i| i + 1);
            let (sentence, tail) = rest.split_at(cut);
            rest = tail;
            let sentence = sentence.trim();
            if !sentence.is_empty() {
                return Some(sentence);
            }
        }
    })
}

/// `text` with at most `max` characters: cut at a character boundary, with `…` when cut.
pub(crate) fn shorten_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max.saturating_sub(1)) {
        Some((cut, _)) if text.chars().count() > max => {
            let mut out = text[..cut].trim_end().to_owned();
            out.push('…');
            out
        }
        _ => text.to_owned(),
    }
}

/// `text` with whitespace collapsed and at most `max` words, with `…` when cut.
pub(crate) fn shorten_words(text: &str, max: usize) -> String {
    let mut words = text.split_whitespace();
    let mut out = String::new();
    for word in words.by_ref().take(max) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    if words.next().is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_split() {
        let parts: Vec<_> = sentences("One. Two! Three? four.rs stays. ").collect();
        assert_eq!(parts, ["One.", "Two!", "Three?", "four.rs stays."]);
    }

    #[test]
    fn shortening() {
        assert_eq!(shorten_chars("abcdef", 4), "abc…");
        assert_eq!(shorten_chars("abc", 4), "abc");
        assert_eq!(shorten_chars("ééééé", 3), "éé…");
        assert_eq!(shorten_words(" a  b\nc d ", 3), "a b c…");
        assert_eq!(shorten_words("a b", 3), "a b");
    }
}
