//! Token counting with tiktoken-rs.
//!
//! Counting happens once, at ingest; the count is stored with the message and assembly only adds
//! stored numbers. Tokenizer tables are loaded once per process (tiktoken-rs singletons: loading
//! one costs 0.1-1 s) and shared by every counter.

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

    fn bpe(self) -> &'static CoreBPE {
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

/// Longest run of text handed to the BPE at once. Byte-pair merging is quadratic in the length
/// of a single pre-token, so a megabyte of base64 or of one repeated letter would stall ingest for
/// minutes; cutting such runs costs at most one extra token per cut.
const MAX_RUN_WITHOUT_SPACE: usize = 1_024;
/// Length of the pieces long text is counted in (cut only at exact pre-token boundaries).
const CHUNK_BYTES: usize = 16 * 1024;

/// Counts tokens with one encoding. Cheap to copy; the tables are process-wide.
#[derive(Clone, Copy)]
pub struct TokenCounter {
    encoding: Encoding,
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("encoding", &self.encoding)
            .finish()
    }
}

impl TokenCounter {
    /// A counter for `encoding` (loads its table on first use in the process).
    pub fn new(encoding: Encoding) -> Self {
        TokenCounter {
            encoding,
            bpe: encoding.bpe(),
        }
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Tokens in `text`.
    ///
    /// Exact for ordinary text. Text is counted in pieces cut just before a space that follows a
    /// non-space character, which is always a pre-token boundary of the tiktoken encodings, so
    /// the pieces add up to the whole. A run of more than 1 KiB without a space (base64, minified
    /// code) is cut every 1 KiB, which may over-count by a token per cut and keeps the cost linear.
    pub fn count_text(&self, text: &str) -> usize {
        if text.len() <= MAX_RUN_WITHOUT_SPACE {
            return self.bpe.encode_ordinary(text).len();
        }
        split_for_counting(text)
            .map(|piece| self.bpe.encode_ordinary(piece).len())
            .sum()
    }

    /// Tokens a message with these parts costs in a model's context.
    pub fn count_message(&self, _role: Role, parts: &[Part]) -> u32 {
        let mut total = u64::from(MESSAGE_OVERHEAD_TOKENS);
        for part in parts {
            total += match part {
                Part::Binary { .. } => u64::from(BINARY_PART_TOKENS),
                other => other
                    .searchable_text()
                    .map_or(0, |text| self.count_text(&text) as u64),
            };
        }
        u32::try_from(total).unwrap_or(u32::MAX)
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
    if let Some(cut) = forced_cut(&text[..floor_char_boundary(text, CHUNK_BYTES)]) {
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
    floor_char_boundary(text, CHUNK_BYTES)
}

/// If `text` holds a run of more than MAX_RUN_WITHOUT_SPACE bytes without ASCII whitespace, the
/// position to cut it at (the run's end if it ends within the limit is not a cut).
fn forced_cut(text: &str) -> Option<usize> {
    let mut run_start = 0;
    for (i, b) in text.bytes().enumerate() {
        if b.is_ascii_whitespace() {
            run_start = i + 1;
        } else if i - run_start >= MAX_RUN_WITHOUT_SPACE {
            let cut = floor_char_boundary(text, i);
            // A cut at the start would make no progress; a multi-byte char is at most 4 bytes.
            return Some(if cut == 0 {
                ceil_char_boundary(text, 1)
            } else {
                cut
            });
        }
    }
    None
}

fn floor_char_boundary(text: &str, mut index: usize) -> usize {
    while index > 0 && !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

fn ceil_char_boundary(text: &str, mut index: usize) -> usize {
    while index < text.len() && !text.is_char_boundary(index) {
        index += 1;
    }
    index
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
        let direct = counter.bpe.encode_ordinary(&text).len();
        assert_eq!(counter.count_text(&text), direct);
    }

    #[test]
    fn pathological_runs_stay_cheap_and_close() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        // One 200 KB pre-token: quadratic without the cut.
        let text = "a".repeat(200_000);
        let counted = counter.count_text(&text);
        assert!(counted > 0);
        let pieces = split_for_counting(&text).count();
        assert!(pieces >= 195, "{pieces}");
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
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn pieces_cover_the_text_exactly(text in "[a-zé \n.,0-9]{0,3000}") {
            let joined: String = split_for_counting(&text).collect();
            prop_assert_eq!(&joined, &text);
        }

        #[test]
        fn counting_in_pieces_matches_counting_whole(words in proptest::collection::vec("[A-Za-z0-9_.,:é!?]{1,12}", 0..3000)) {
            let counter = TokenCounter::new(Encoding::O200kBase);
            let text = words.join(" ");
            prop_assert_eq!(counter.count_text(&text), counter.bpe.encode_ordinary(&text).len());
        }
    }
}
