//! Token counting, exactly as tiktoken-rs counts.
//!
//! Counting happens once, at ingest; the count is stored with the message and assembly only adds
//! stored numbers. Tokenizer tables are loaded once per process (tiktoken-rs singletons: loading
//! one costs 0.1-1 s) and shared by every counter.
//!
//! o200k_base and cl100k_base (the encodings of current models) are counted by the `fast`
//! submodule: an exact hand-written pre-tokenizer for ASCII text and a process-wide cache of piece
//! counts in front of tiktoken-rs's own encoder. It is several times faster than
//! `encode_ordinary` on agent transcripts and equal to it (property tests here and in `fast`,
//! every message of the real transcripts in `tests/it/token_counts.rs`). p50k_base and r50k_base go
//! through tiktoken-rs directly.

mod fast;

use serde::{Deserialize, Serialize};
use tiktoken_rs::CoreBPE;

use crate::message::{Part, Role};

/// A BPE encoding tiktoken-rs ships.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
    P50kBase,
    R50kBase,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::P50kBase => "p50k_base",
            Encoding::R50kBase => "r50k_base",
        }
    }

    /// The pattern `fast` reproduces exactly for this encoding, if any.
    fn fast_pattern(self) -> Option<fast::Pattern> {
        match self {
            Encoding::O200kBase => Some(fast::Pattern::O200k),
            Encoding::Cl100kBase => Some(fast::Pattern::Cl100k),
            Encoding::P50kBase | Encoding::R50kBase => None,
        }
    }

    pub(crate) fn bpe(self) -> &'static CoreBPE {
        match self {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
            Encoding::P50kBase => tiktoken_rs::p50k_base_singleton(),
            Encoding::R50kBase => tiktoken_rs::r50k_base_singleton(),
        }
    }
}

/// Tokens a chat message costs beyond its content (role and delimiters), as in OpenAI's
/// published accounting for chat formats.
pub const MESSAGE_OVERHEAD_TOKENS: u32 = 4;

/// Tokens charged for an image or other binary part whose size the provider decides.
pub const BINARY_PART_TOKENS: u32 = 1_600;

/// Longest run of text handed to tiktoken-rs at once for p50k_base and r50k_base. A megabyte of
/// base64 or of one repeated character would cost tiktoken-rs's regex a long backtrack (or fail);
/// cutting such runs costs at most one extra token per cut.
const MAX_RUN_WITHOUT_SPACE: usize = 1_024;
/// Length of the pieces long text is counted in (cut only at exact pre-token boundaries).
const CHUNK_BYTES: usize = 16 * 1024;

/// Counts tokens with one encoding. Cheap to copy; the tables are process-wide.
#[derive(Clone, Copy)]
pub struct TokenCounter {
    encoding: Encoding,
    fast: Option<fast::Pattern>,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("encoding", &self.encoding)
            .finish()
    }
}

impl TokenCounter {
    /// A counter for `encoding`. Cheap: the encoding's table (about 150 ms to load) is loaded
    /// at the first count that needs it, once per process, so a process that only reads (`lcm
    /// grep`) never loads it.
    pub fn new(encoding: Encoding) -> Self {
        TokenCounter {
            encoding,
            fast: encoding.fast_pattern(),
        }
    }

    /// The encoding's tiktoken-rs table, loaded on first use.
    fn bpe(&self) -> &'static CoreBPE {
        self.encoding.bpe()
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Tokens in `text`: `encode_ordinary(text).len()` of tiktoken-rs.
    ///
    /// o200k_base and cl100k_base: exact, except that a single pre-token longer than 64 KiB (one
    /// letter class, spaces or punctuation repeated that long), or 64 KiB of non-ASCII text without
    /// an ASCII space, is counted in 64 KiB slices (a token or so more per slice); the cost is
    /// linear and nothing panics. p50k_base and r50k_base: text is counted in pieces cut just
    /// before a space that follows a non-space character, which is always a pre-token boundary,
    /// and a run of more than 1 KiB without a space (base64, minified code) is cut every 1 KiB,
    /// which may over-count by a token per cut.
    pub fn count_text(&self, text: &str) -> usize {
        if let Some(pattern) = self.fast {
            return fast::count(pattern, self.encoding, text);
        }
        if text.len() <= MAX_RUN_WITHOUT_SPACE {
            return self.bpe().encode_ordinary(text).len();
        }
        split_for_counting(text)
            .map(|piece| self.bpe().encode_ordinary(piece).len())
            .sum()
    }

    /// tiktoken-rs's own count, `encode_ordinary(text).len()`, in one call: the reference
    /// [`count_text`](Self::count_text) is tested against. Slower, and it panics inside
    /// tiktoken-rs on pathological input (a run of about a million spaces): for tests and
    /// benchmarks, not for ingest.
    pub fn reference_count(&self, text: &str) -> usize {
        self.bpe().encode_ordinary(text).len()
    }

    /// Tokens a message with these parts costs in a model's context: the per-message overhead
    /// and each part's [`count_part`](Self::count_part).
    pub fn count_message(&self, _role: Role, parts: &[Part]) -> u32 {
        let total = u64::from(MESSAGE_OVERHEAD_TOKENS)
            + parts.iter().map(|p| self.count_part(p)).sum::<u64>();
        u32::try_from(total).unwrap_or(u32::MAX)
    }

    /// Tokens one part costs in a message: its searchable text's, or [`BINARY_PART_TOKENS`]
    /// for a binary payload.
    pub fn count_part(&self, part: &Part) -> u64 {
        match part {
            Part::Binary { .. } => u64::from(BINARY_PART_TOKENS),
            other => other
                .searchable_text()
                .map_or(0, |text| self.count_text(&text) as u64),
        }
    }
}

/// Cuts `text` into pieces whose token counts add up to the count of the whole (see
/// [`TokenCounter::count_text`]).
fn split_for_counting(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = next_cut(rest);
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

/// Where to end the next piece of `text`: the last exact boundary within [`CHUNK_BYTES`], or a
/// forced cut when a run without spaces exceeds [`MAX_RUN_WITHOUT_SPACE`].
fn next_cut(text: &str) -> usize {
    if text.len() <= CHUNK_BYTES {
        // Still bound the longest space-free run in this final piece.
        return forced_cut(text).unwrap_or(text.len());
    }
    if let Some(cut) = forced_cut(&text[..text.floor_char_boundary(CHUNK_BYTES)]) {
        return cut;
    }
    // The last " " preceded by a non-whitespace character, at or before CHUNK_BYTES.
    let bytes = text.as_bytes();
    let mut i = CHUNK_BYTES;
    while i > 1 {
        if bytes[i] == b' ' && !bytes[i - 1].is_ascii_whitespace() {
            return i;
        }
        i -= 1;
    }
    text.floor_char_boundary(CHUNK_BYTES)
}

/// If `text` holds a run of more than MAX_RUN_WITHOUT_SPACE bytes without ASCII whitespace, the
/// position to cut it at (the run's end if it ends within the limit is not a cut).
fn forced_cut(text: &str) -> Option<usize> {
    let mut run_start = 0;
    for (i, b) in text.bytes().enumerate() {
        if b.is_ascii_whitespace() {
            run_start = i + 1;
        } else if i - run_start >= MAX_RUN_WITHOUT_SPACE {
            let cut = text.floor_char_boundary(i);
            // A cut at the start would make no progress; a multi-byte char is at most 4 bytes.
            return Some(if cut == 0 {
                text.ceil_char_boundary(1)
            } else {
                cut
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts_known_strings() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        assert_eq!(counter.count_text(""), 0);
        assert_eq!(counter.count_text("hello world"), 2);
        let cl = TokenCounter::new(Encoding::Cl100kBase);
        assert_eq!(cl.count_text("hello world"), 2);
    }

    #[test]
    fn long_ordinary_text_is_counted_exactly() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let text =
            "The quick brown fox, id msg_1042, jumps over 3 lazy dogs.\n  Then: `cargo test`! "
                .repeat(2_000);
        let direct = counter.bpe().encode_ordinary(&text).len();
        assert_eq!(counter.count_text(&text), direct);
    }

    #[test]
    fn pathological_runs_stay_cheap_and_close() {
        for encoding in [Encoding::P50kBase, Encoding::O200kBase] {
            let counter = TokenCounter::new(encoding);
            // One 200 KB pre-token: one long backtrack for tiktoken-rs's regex.
            let text = "a".repeat(200_000);
            let counted = counter.count_text(&text);
            let exact = counter.reference_count(&text);
            assert!(
                counted >= exact && counted <= exact + 200,
                "{counted} vs {exact}"
            );
        }
        let pieces = split_for_counting(&"a".repeat(200_000)).count();
        assert!(pieces >= 195, "{pieces}");
    }

    #[test]
    fn a_million_spaces_do_not_panic() {
        // tiktoken-rs's regex gives up (and `encode_ordinary` panics) on this input.
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let counter = TokenCounter::new(encoding);
            let text = format!("a{}b", " ".repeat(1_000_000));
            let counted = counter.count_text(&text);
            assert!((7_000..9_000).contains(&counted), "{counted}");
        }
    }

    #[test]
    fn fast_counts_equal_tiktoken_on_known_texts() {
        let texts = [
            "",
            "hello world",
            "Hello, World! It's DON'T they'RE we'Ve I'm you'll he'd",
            "  fn main() {\n    println!(\"{}\", x);\n}\n\n\n",
            "a\n  ",
            "a  \t \n\r\n x\x0b\x0cy",
            "camelCaseAndPascalCase HTTPServer iOS XMLHttpRequest",
            "1234567 3.14159 0x1f 2026-11-23T10:00:00Z",
            "path/to/file.rs:12:5 // comment\n/* block */",
            "café naïve Ærø straße İstanbul ſtop 'ſ K",
            "日本語のテキスト、中文字符。 한국어 텍스트",
            "emoji 😀🎉 👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
            "\u{a0}nbsp\u{3000}ideographic\u{2028}sep\u{85}nel",
            "e\u{301} combining a\u{308}",
            "—dash – “quoted” ‘single’ … → ✓",
            "\u{0}\u{1}\u{7f} controls",
            "   ",
            "x   ",
            "\n",
        ];
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let counter = TokenCounter::new(encoding);
            for text in texts {
                assert_eq!(
                    counter.count_text(text),
                    counter.reference_count(text),
                    "{encoding:?} {text:?}"
                );
            }
        }
    }

    /// Fragments that exercise every alternative of the patterns and the seams between them.
    pub(super) fn fragment() -> impl Strategy<Value = String> {
        let long_run = (
            proptest::sample::select(vec![
                "a", "A", "aB", " ", "\n", "\t", " \n", "=", "-/", "7", "é", "日", "😀", "'s",
            ]),
            1..3_000usize,
        )
            .prop_map(|(unit, n)| unit.repeat(n));
        prop_oneof![
            4 => "[a-z]{1,12}",
            2 => "[A-Z][a-z]{0,10}",
            1 => "[A-Z]{1,8}",
            2 => "[a-zA-Z]{1,20}",
            2 => "[0-9]{1,7}",
            4 => "[ \t\n\r\x0b\x0c]{1,6}",
            2 => " {1,40}",
            2 => "['][sStTmMdDrRvVlLeEx]{1,3}",
            3 => "[!-/:-@\\[-`{-~]{1,6}",
            1 => "[\x00-\x08\x0e-\x1f\x7f]{1,3}",
            2 => "[àéîõüßçñÅ]{1,4}",
            1 => "[ſKİı]",
            1 => "[\u{a0}\u{3000}\u{2028}\u{85}\u{1680}]{1,3}",
            2 => "[日本語中文字漢한국어]{1,8}",
            2 => "[😀🎉🚀👍🏽\u{200d}]{1,3}",
            2 => "[—–→✓…“”’·]{1,2}",
            3 => "[─│└├┌┐┘┤┬┴┼═║→←↑↓⇒✓✗✅❌•·…—–“”‘’«»©®°±×÷¿¡❤⭐]{1,4}",
            2 => proptest::sample::select(fast::SYMBOLS.to_vec())
                .prop_flat_map(|(low, high)| low..=high)
                .prop_filter_map("a char", char::from_u32)
                .prop_map(String::from),
            1 => "[\u{fe0f}\u{200d}\u{1f3fb}-\u{1f3ff}]",
            1 => "[\u{300}-\u{36f}]{1,2}",
            2 => any::<char>().prop_map(String::from),
            1 => long_run,
        ]
    }

    /// Code-like lines: indentation, identifiers, calls, literals, comments.
    pub(super) fn code_line() -> impl Strategy<Value = String> {
        (
            0..12usize,
            "[a-z_][a-zA-Z0-9_]{0,15}",
            "[A-Z][a-zA-Z]{0,10}",
            "[0-9]{1,6}",
            proptest::sample::select(vec![
                "(", ")", "{", "}", "[", "]", ";", ",", "::", "->", "=>", "&&", "||", "!=", "==",
                "+=", "<", ">", ".", "\"", "'", "#", "//", "/*", "*/", "`",
            ]),
        )
            .prop_map(|(indent, ident, ty, num, punct)| {
                format!(
                    "{}let {ident}: {ty} = {ty}::new({num}){punct} // {ident}'s\n",
                    " ".repeat(indent * 2)
                )
            })
    }

    fn assert_equal_counts(text: &str) -> Result<(), TestCaseError> {
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let counter = TokenCounter::new(encoding);
            prop_assert_eq!(
                counter.count_text(text),
                counter.reference_count(text),
                "{:?} {:?}",
                encoding,
                text
            );
        }
        Ok(())
    }

    #[test]
    fn message_count_includes_overhead_and_binary_parts() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let parts = vec![
            Part::Text {
                text: "hello world".into(),
            },
            Part::Binary {
                media_type: "image/png".into(),
                byte_len: 1,
            },
        ];
        assert_eq!(
            counter.count_message(Role::User, &parts),
            MESSAGE_OVERHEAD_TOKENS + 2 + BINARY_PART_TOKENS
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn fast_counts_equal_tiktoken_on_mixed_fragments(fragments in proptest::collection::vec(fragment(), 0..40)) {
            assert_equal_counts(&fragments.concat())?;
        }

        #[test]
        fn fast_counts_equal_tiktoken_on_arbitrary_unicode(text in any::<String>()) {
            assert_equal_counts(&text)?;
        }

        #[test]
        fn fast_counts_equal_tiktoken_on_code(lines in proptest::collection::vec(code_line(), 0..60)) {
            assert_equal_counts(&lines.concat())?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn pieces_cover_the_text_exactly(text in "[a-zé \n.,0-9]{0,3000}") {
            let joined: String = split_for_counting(&text).collect();
            prop_assert_eq!(&joined, &text);
        }

        #[test]
        fn counting_in_pieces_matches_counting_whole(words in proptest::collection::vec("[A-Za-z0-9_.,:é!?]{1,12}", 0..3000)) {
            let counter = TokenCounter::new(Encoding::P50kBase);
            let text = words.join(" ");
            prop_assert_eq!(counter.count_text(&text), counter.bpe().encode_ordinary(&text).len());
        }
    }
}
