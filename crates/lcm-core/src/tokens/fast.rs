//! Exact, fast token counting for o200k_base and cl100k_base over tiktoken-rs's own tables.
//!
//! tiktoken counts in two steps: a pre-tokenizer regex (run by `fancy-regex`, with a look-ahead)
//! cuts the text into pieces, then byte-pair merging encodes each piece on its own. At ingest the
//! regex is most of the cost, and agent transcripts repeat the same pieces (words, indentation,
//! punctuation) over and over. So this module:
//!
//! 1. cuts ASCII text into exactly the pieces tiktoken's pattern produces with a hand-written
//!    scanner (a byte-class table and the pattern's alternatives in order, leftmost-first, with the
//!    look-ahead and `$` resolved by hand);
//! 2. counts each piece through a bounded, process-wide cache (short piece to count, lock-free
//!    reads); a miss byte-pair merges the piece directly on the encoding's rank table (a piece
//!    is one pre-token, so tiktoken's regex has nothing left to do), or, while that table is
//!    still being built in the background and for pieces of 100 bytes or more, hands it to
//!    tiktoken-rs's `encode_ordinary` alone.
//!
//! Non-ASCII symbols that behave exactly like ASCII punctuation (arrows, dashes, quotes, box
//! drawing, emoji: [`SYMBOLS`]) are scanned like it. Where the scanner would have to classify any
//! other non-ASCII character (a letter with an accent, a combining mark, CJK, Unicode spaces), it
//! does not guess: from that piece start it hands tiktoken-rs the
//! text up to the next *safe boundary* (a space preceded by an ASCII non-space character, or the
//! end), which tiktoken then pre-tokenizes itself.
//!
//! Why the pieces add up to tiktoken's count, exactly:
//! - A piece, encoded alone, pre-tokenizes to itself: the alternatives that could match
//!   differently on the shortened text are only those ending in `$` or `(?!\S)`, and those match
//!   only whitespace and would take the whole piece.
//! - A safe boundary is always a piece boundary (no alternative consumes a non-space character and
//!   then a space), and every piece before it is unchanged when the text is cut there, because the
//!   look-ahead and `$` could only differ at the cut, after a non-space character.
//!
//! The property tests in `tokens.rs` and the real-transcript test at the workspace root compare
//! every count with `encode_ordinary(text).len()`.
//!
//! Two bounds keep every input linear and free of panics (tiktoken-rs's regex gives up with an
//! error on a run of about a million spaces): a single piece longer than [`MAX_PIECE`] (64 KiB of
//! one letter class, spaces or punctuation) and a non-ASCII region longer than [`MAX_PIECE`]
//! without a space are counted in slices, which may over-count by a token or so per slice. No
//! ordinary text has such pieces.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};

use tiktoken_rs::CoreBPE;

/// The pre-tokenizer patterns this module reproduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pattern {
    /// o200k_base: case-aware letter runs with contractions, `\p{N}{1,3}`, punctuation runs
    /// absorbing `[\r\n/]*`, `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
    O200k,
    /// cl100k_base: contractions, `[^\r\n\p{L}\p{N}]?+\p{L}++`, `\p{N}{1,3}+`, punctuation runs
    /// absorbing `[\r\n]*`, `\s++$`, `\s*[\r\n]`, `\s+(?!\S)`, `\s`.
    Cl100k,
}

/// Longest piece (or non-ASCII region) handed to tiktoken-rs in one call; longer ones are counted
/// in slices of this size.
pub(super) const MAX_PIECE: usize = 64 * 1024;

/// Byte classes of ASCII (every byte >= 0x80 is [`NON_ASCII`] in the table; [`char_class`] makes
/// the [`SYMBOLS`] PUNCT).
const WS: u8 = 1; // \t \n \v \f \r and space: ASCII members of \s (Unicode White_Space)
const NL: u8 = 2; // \r \n
const UPPER: u8 = 4; // A-Z
const LOWER: u8 = 8; // a-z
const DIGIT: u8 = 16; // 0-9
const PUNCT: u8 = 32; // ASCII that is not \s, \p{L} or \p{N}
const NON_ASCII: u8 = 64;
const LETTER: u8 = UPPER | LOWER;

static CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = if c >= 0x80 {
            NON_ASCII
        } else if c == b'\r' || c == b'\n' {
            WS | NL
        } else if c == b' ' || (c >= 0x09 && c <= 0x0d) {
            WS
        } else if c.is_ascii_uppercase() {
            UPPER
        } else if c.is_ascii_lowercase() {
            LOWER
        } else if c.is_ascii_digit() {
            DIGIT
        } else {
            PUNCT
        };
        b += 1;
    }
    table
};

/// Non-ASCII characters that every alternative of both patterns treats exactly like ASCII
/// punctuation: none is in `\s`, `\p{L}`, `\p{N}` or `\p{M}` (a test checks every code point
/// against the regex tables tiktoken-rs's engine uses). Arrows, dashes, quotes, bullets, box
/// drawing, math and technical symbols, dingbats and emoji are common in agent transcripts (tool
/// output, markdown); every other non-ASCII character goes to tiktoken-rs.
pub(super) const SYMBOLS: [(u32, u32); 22] = [
    (0x00A1, 0x00A9),   // ¡ to ©
    (0x00AB, 0x00AC),   // « ¬
    (0x00AE, 0x00B1),   // ® ¯ ° ±
    (0x00B4, 0x00B4),   // ´
    (0x00B6, 0x00B8),   // ¶ · ¸
    (0x00BB, 0x00BB),   // »
    (0x00BF, 0x00BF),   // ¿
    (0x00D7, 0x00D7),   // ×
    (0x00F7, 0x00F7),   // ÷
    (0x2010, 0x2027),   // dashes, quotes, bullets, ellipsis
    (0x2030, 0x205E),   // per mille, primes, angle quotes, ...
    (0x2190, 0x23FF),   // arrows, mathematical operators, technical symbols
    (0x2500, 0x2775),   // box drawing, blocks, shapes, miscellaneous symbols, dingbats
    (0x2794, 0x2BFF),   // dingbats, math, arrows, braille (not the circled numbers before)
    (0x3001, 0x3003),   // 、 。 〃
    (0x3008, 0x3011),   // CJK brackets
    (0xFF01, 0xFF0F),   // fullwidth ! to /
    (0x1F1E6, 0x1F1FF), // regional indicators (flags)
    (0x1F300, 0x1F64F), // pictographs, emoticons
    (0x1F680, 0x1F6FF), // transport and map symbols
    (0x1F900, 0x1F9FF), // supplemental symbols and pictographs
    (0x1FA70, 0x1FAFF), // symbols and pictographs extended-A
];

#[inline]
fn is_symbol(cp: u32) -> bool {
    SYMBOLS
        .iter()
        .take_while(|&&(low, _)| low <= cp)
        .any(|&(_, high)| cp <= high)
}

/// The class of the character starting at byte `i` and its length in bytes: ASCII by the table,
/// a non-ASCII [`SYMBOLS`] character as PUNCT, any other as NON_ASCII; `(0, 0)` past the end.
#[inline]
fn char_class(bytes: &[u8], i: usize) -> (u8, usize) {
    let Some(&lead) = bytes.get(i) else {
        return (0, 0);
    };
    if lead < 0x80 {
        return (CLASS[lead as usize], 1);
    }
    let (len, bits) = match lead {
        0xC0..=0xDF => (2, lead & 0x1F),
        0xE0..=0xEF => (3, lead & 0x0F),
        0xF0..=0xF7 => (4, lead & 0x07),
        _ => return (NON_ASCII, 1), // not a character start (never asked)
    };
    let mut cp = u32::from(bits);
    for k in 1..len {
        cp = (cp << 6) | u32::from(bytes.get(i + k).map_or(0, |b| b & 0x3F));
    }
    (if is_symbol(cp) { PUNCT } else { NON_ASCII }, len)
}

/// Class of the character at `i`, or 0 past the end.
#[inline]
fn class_at(bytes: &[u8], i: usize) -> u8 {
    char_class(bytes, i).0
}

/// What the scanner found at a piece start.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// The piece ends here (exclusive).
    Piece(usize),
    /// The piece depends on a non-ASCII character: let tiktoken-rs pre-tokenize from here.
    NonAscii,
}

/// End of the run of characters of class `mask` starting at `i`.
#[inline]
fn run(bytes: &[u8], mut i: usize, mask: u8) -> usize {
    loop {
        let (class, len) = char_class(bytes, i);
        if class & mask == 0 {
            return i;
        }
        i += len;
    }
}

/// Whether a letter run that stopped at `end` might go on with a non-ASCII letter or mark.
#[inline]
fn stops_at_non_ascii(bytes: &[u8], end: usize) -> bool {
    class_at(bytes, end) == NON_ASCII
}

/// `'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`, case-insensitive, at `i`: its length, or `Err`
/// when a non-ASCII byte is where a letter would be compared (`ſ` case-folds to `s`).
#[inline]
fn contraction(bytes: &[u8], i: usize) -> Result<usize, ()> {
    if bytes.get(i) != Some(&b'\'') {
        return Ok(0);
    }
    let Some(&a) = bytes.get(i + 1) else {
        return Ok(0);
    };
    if a >= 0x80 {
        return Err(());
    }
    let second = |want: u8| -> Result<usize, ()> {
        match bytes.get(i + 2) {
            Some(&b) if b >= 0x80 => Err(()),
            Some(&b) if b.to_ascii_lowercase() == want => Ok(3),
            _ => Ok(0),
        }
    };
    match a.to_ascii_lowercase() {
        b's' | b't' | b'm' | b'd' => Ok(2),
        b'r' | b'v' => second(b'e'),
        b'l' => second(b'l'),
        _ => Ok(0),
    }
}

/// `\p{N}{1,3}` at `i` (a digit): its end.
#[inline]
fn digits(bytes: &[u8], i: usize) -> Next {
    let mut end = i + 1;
    while end < i + 3 && end < bytes.len() {
        match class_at(bytes, end) {
            DIGIT => end += 1,
            NON_ASCII => return Next::NonAscii,
            _ => break,
        }
    }
    Next::Piece(end)
}

/// `[^\s\p{L}\p{N}]+` at `i` (a PUNCT byte) followed by `tail*` (`[\r\n/]` or `[\r\n]`).
#[inline]
fn punctuation(bytes: &[u8], i: usize, with_slash: bool) -> Next {
    let end = run(bytes, i, PUNCT);
    if stops_at_non_ascii(bytes, end) {
        return Next::NonAscii;
    }
    let mut end = end;
    while let Some(&b) = bytes.get(end) {
        if b == b'\r' || b == b'\n' || (with_slash && b == b'/') {
            end += 1;
        } else {
            break;
        }
    }
    Next::Piece(end)
}

/// The piece of `bytes` starting at `i` (< len) under `pattern`.
fn next_piece(pattern: Pattern, bytes: &[u8], i: usize) -> Next {
    let (c, len) = char_class(bytes, i);
    if c == NON_ASCII {
        return Next::NonAscii;
    }
    if pattern == Pattern::Cl100k && bytes[i] == b'\'' {
        // '(?i:[sdmt]|ll|ve|re)
        match contraction(bytes, i) {
            Err(()) => return Next::NonAscii,
            Ok(0) => {}
            Ok(len) => return Next::Piece(i + len),
        }
    }
    // The letter alternatives, with their optional `[^\r\n\p{L}\p{N}]` prefix.
    let mut start = i;
    if c & (PUNCT | WS) != 0 && c & NL == 0 {
        let d = class_at(bytes, i + len);
        if d == NON_ASCII {
            return Next::NonAscii;
        }
        if d & LETTER != 0 {
            start = i + len;
        }
    }
    if class_at(bytes, start) & LETTER != 0 {
        return letters(pattern, bytes, start);
    }
    if c == DIGIT {
        return digits(bytes, i);
    }
    // ` ?[^\s\p{L}\p{N}]+` then `[\r\n/]*` (o200k) or `[\r\n]*` (cl100k).
    let with_slash = pattern == Pattern::O200k;
    if c == PUNCT {
        return punctuation(bytes, i, with_slash);
    }
    if bytes[i] == b' ' {
        match class_at(bytes, i + 1) {
            NON_ASCII => return Next::NonAscii,
            PUNCT => return punctuation(bytes, i + 1, with_slash),
            _ => {}
        }
    }
    whitespace(pattern, bytes, i)
}

/// A letter piece whose letters start at `start` (the prefix, if any, is before it).
#[inline]
fn letters(pattern: Pattern, bytes: &[u8], start: usize) -> Next {
    let end = match pattern {
        // [\p{Lu}..]*[\p{Ll}..]+ or [\p{Lu}..]+[\p{Ll}..]*: upper run, then lower run.
        Pattern::O200k => {
            let upper_end = run(bytes, start, UPPER);
            if stops_at_non_ascii(bytes, upper_end) {
                return Next::NonAscii;
            }
            let lower_end = run(bytes, upper_end, LOWER);
            if stops_at_non_ascii(bytes, lower_end) {
                return Next::NonAscii;
            }
            match contraction(bytes, lower_end) {
                Err(()) => return Next::NonAscii,
                Ok(len) => lower_end + len,
            }
        }
        // \p{L}++
        Pattern::Cl100k => {
            let end = run(bytes, start, LETTER);
            if stops_at_non_ascii(bytes, end) {
                return Next::NonAscii;
            }
            end
        }
    };
    Next::Piece(end)
}

/// A piece starting with whitespace at `i` that no earlier alternative took.
#[inline]
fn whitespace(pattern: Pattern, bytes: &[u8], i: usize) -> Next {
    let end = run(bytes, i, WS);
    if stops_at_non_ascii(bytes, end) {
        // Unicode spaces (NBSP, U+3000, ...) may continue the run.
        return Next::NonAscii;
    }
    let last_newline = bytes[i..end]
        .iter()
        .rposition(|&b| b == b'\r' || b == b'\n')
        .map(|k| i + k);
    let at_end = end == bytes.len();
    match pattern {
        Pattern::O200k => {
            // \s*[\r\n]+ | \s+(?!\S) | \s+
            if let Some(k) = last_newline {
                return Next::Piece(k + 1);
            }
            if at_end {
                return Next::Piece(end);
            }
        }
        Pattern::Cl100k => {
            // \s++$ | \s*[\r\n] | \s+(?!\S) | \s
            if at_end {
                return Next::Piece(end);
            }
            if let Some(k) = last_newline {
                return Next::Piece(k + 1);
            }
        }
    }
    // Followed by a non-space: all but the last whitespace character (which joins the next
    // piece), or that single character.
    Next::Piece(if end - 1 > i { end - 1 } else { i + 1 })
}

/// The end of the segment starting at the piece boundary `i`, and whether the segment is one
/// piece (`false`: a region tiktoken-rs pre-tokenizes itself).
#[inline]
fn next_segment(pattern: Pattern, bytes: &[u8], i: usize) -> (usize, bool) {
    match next_piece(pattern, bytes, i) {
        Next::Piece(end) => (end, true),
        Next::NonAscii => (safe_boundary(bytes, i), false),
    }
}

/// The first safe boundary after `i`: a space preceded by an ASCII non-space byte, or the end.
fn safe_boundary(bytes: &[u8], i: usize) -> usize {
    let mut k = i + 1;
    while k < bytes.len() {
        if bytes[k] == b' ' && CLASS[bytes[k - 1] as usize] & (WS | NON_ASCII) == 0 {
            return k;
        }
        k += 1;
    }
    bytes.len()
}

/// Longest piece kept in the cache (it is stored with its length and count in 32 bytes).
const CACHED_PIECE_MAX: usize = 30;
/// Slots of the cache of one encoding: 64 Ki slots of 40 bytes, 2.5 MiB, allocated on first use.
const CACHE_SLOTS_LOG2: u32 = 16;

/// One cache entry: the piece zero-padded to 30 bytes, then its length, then its count, as four
/// little-endian words, guarded by a sequence number (odd while a writer fills the slot).
struct Slot {
    seq: AtomicU32,
    words: [AtomicU64; 4],
}

/// Bytes 0..=30 of a slot's last word: everything but the count.
const KEY_MASK: u64 = (1 << 56) - 1;

/// A process-wide, bounded map from short pieces to their token counts, shared by every thread
/// (ingest counts on short-lived scoped threads, which a thread-local cache would start cold):
/// direct-mapped, a collision replaces the older entry, and reads take no lock (a seqlock per
/// slot: a reader that races a writer sees a miss, never a torn entry).
struct PieceCache {
    slots: Box<[Slot]>,
}

impl PieceCache {
    fn new() -> Self {
        PieceCache {
            slots: (0..1usize << CACHE_SLOTS_LOG2)
                .map(|_| Slot {
                    seq: AtomicU32::new(0),
                    words: [const { AtomicU64::new(0) }; 4],
                })
                .collect(),
        }
    }

    /// The key words of `piece` (2..=CACHED_PIECE_MAX bytes), count byte zero.
    #[inline]
    fn key(piece: &[u8]) -> [u64; 4] {
        let mut words = [0u64; 4];
        let mut chunks = piece.chunks_exact(8);
        for (word, chunk) in words.iter_mut().zip(&mut chunks) {
            *word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
        }
        let full = piece.len() / 8;
        for (k, &b) in chunks.remainder().iter().enumerate() {
            words[full] |= u64::from(b) << (8 * k);
        }
        words[3] |= (piece.len() as u64) << 48;
        words
    }

    #[inline]
    fn slot(&self, key: &[u64; 4]) -> &Slot {
        const K: u64 = 0xf135_7aea_2e62_a9c5;
        let hash =
            ((key[0] ^ key[1].rotate_left(17)).wrapping_mul(K) ^ key[2] ^ key[3].rotate_left(29))
                .wrapping_mul(K);
        &self.slots[(hash >> (64 - CACHE_SLOTS_LOG2)) as usize]
    }

    #[inline]
    fn get(&self, key: &[u64; 4]) -> Option<usize> {
        let slot = self.slot(key);
        let before = slot.seq.load(Ordering::Acquire);
        if before & 1 == 1 {
            return None;
        }
        let words = [
            slot.words[0].load(Ordering::Relaxed),
            slot.words[1].load(Ordering::Relaxed),
            slot.words[2].load(Ordering::Relaxed),
            slot.words[3].load(Ordering::Relaxed),
        ];
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != before {
            return None;
        }
        let same = words[0] == key[0]
            && words[1] == key[1]
            && words[2] == key[2]
            && words[3] & KEY_MASK == key[3];
        same.then_some((words[3] >> 56) as usize)
    }

    #[inline]
    fn insert(&self, key: &[u64; 4], count: usize) {
        // A piece of at most 30 bytes has at most 30 tokens.
        let Ok(count) = u8::try_from(count) else {
            return;
        };
        let slot = self.slot(key);
        let before = slot.seq.load(Ordering::Relaxed);
        if before & 1 == 1
            || slot
                .seq
                .compare_exchange(
                    before,
                    before.wrapping_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return; // another writer holds the slot: caching is optional
        }
        fence(Ordering::Release);
        slot.words[0].store(key[0], Ordering::Relaxed);
        slot.words[1].store(key[1], Ordering::Relaxed);
        slot.words[2].store(key[2], Ordering::Relaxed);
        slot.words[3].store(key[3] | u64::from(count) << 56, Ordering::Relaxed);
        slot.seq.store(before.wrapping_add(2), Ordering::Release);
    }
}

static O200K_CACHE: OnceLock<PieceCache> = OnceLock::new();
static CL100K_CACHE: OnceLock<PieceCache> = OnceLock::new();

/// Tokens of `text` under `pattern`, whose ranks are `encoding`'s; equal to
/// `encoding.bpe().encode_ordinary(text).len()` (see the module documentation for the two
/// bounds). The table is fetched only on a cache miss: a count served from the cache never loads
/// it.
pub(super) fn count(pattern: Pattern, encoding: super::Encoding, text: &str) -> usize {
    let cache = match pattern {
        Pattern::O200k => &O200K_CACHE,
        Pattern::Cl100k => &CL100K_CACHE,
    }
    .get_or_init(PieceCache::new);
    let bytes = text.as_bytes();
    let mut total = 0;
    let mut i = 0;
    while i < bytes.len() {
        let (end, one_piece) = next_segment(pattern, bytes, i);
        // Both kinds of end are character boundaries: ASCII pieces end before an ASCII byte or at
        // the end, safe boundaries before a space.
        let piece = &text[i..end];
        // A piece the scanner cut is one pre-token: byte-pair merge it directly. A region
        // tiktoken-rs pre-tokenizes itself goes through `encode_ordinary`.
        let count_uncached = || {
            let direct = one_piece && piece.len() < DIRECT_MERGE_MAX;
            match direct.then(|| ranks_if_built(encoding)).flatten() {
                Some(ranks) => merge_len(ranks, piece.as_bytes()),
                None => encode_len(encoding.bpe(), piece),
            }
        };
        total += match piece.len() {
            // Every single byte is a token of these encodings.
            1 => 1,
            len if len <= CACHED_PIECE_MAX => {
                let key = PieceCache::key(piece.as_bytes());
                cache.get(&key).unwrap_or_else(|| {
                    let counted = count_uncached();
                    cache.insert(&key, counted);
                    counted
                })
            }
            _ => count_uncached(),
        };
        i = end;
    }
    total
}

/// Longest piece counted by [`merge_len`]: tiktoken-rs's `byte_pair_split` rescans the whole
/// piece after every merge (quadratic), which `encode_ordinary` also does below 100 bytes and
/// replaces with a heap above.
const DIRECT_MERGE_MAX: usize = 100;

/// An encoding's ordinary tokens, bytes to rank. `CoreBPE` does not lend its own map, so this one
/// is rebuilt from its decoder (o200k_base: about 1.6 MB of token bytes in one allocation kept
/// for the life of the process, plus the map).
type Ranks = rustc_hash::FxHashMap<&'static [u8], Rank>;
type Rank = tiktoken_rs::Rank;

/// One table per [`super::Encoding`], by its declaration order, and whether its build started.
static RANKS: [OnceLock<Ranks>; 4] = [const { OnceLock::new() }; 4];
static RANKS_STARTED: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];

/// Ranks past the largest ordinary or special token of o200k_base and cl100k_base (200,018).
const RANK_LIMIT: Rank = 1 << 18;

/// The encoding's rank table if it is built; otherwise starts building it on a thread of its
/// own (about 60 ms, which would otherwise fall on the first append) and returns `None`: the
/// caller counts through `encode_ordinary` meanwhile, with the same result.
fn ranks_if_built(encoding: super::Encoding) -> Option<&'static Ranks> {
    let slot = &RANKS[encoding as usize];
    if let Some(ranks) = slot.get() {
        return Some(ranks);
    }
    if !RANKS_STARTED[encoding as usize].swap(true, Ordering::AcqRel) {
        let spawned = std::thread::Builder::new()
            .name("lcm-token-ranks".into())
            .spawn(move || ranks(encoding));
        if spawned.is_err() {
            // No thread to be had: try again on a later miss.
            RANKS_STARTED[encoding as usize].store(false, Ordering::Release);
        }
    }
    None
}

/// The encoding's rank table, built on the calling thread if no other thread has built it.
fn ranks(encoding: super::Encoding) -> &'static Ranks {
    RANKS[encoding as usize].get_or_init(|| {
        let bpe = encoding.bpe();
        let special = bpe.special_tokens();
        let mut bytes = Vec::with_capacity(2 << 20);
        let mut tokens: Vec<(usize, usize, Rank)> = Vec::with_capacity(1 << 18);
        for rank in 0..RANK_LIMIT {
            // Ranks without a token (the gap before the special tokens) fail to decode.
            let Ok(token) = bpe.decode_bytes(&[rank]) else {
                continue;
            };
            if std::str::from_utf8(&token).is_ok_and(|t| special.contains(t)) {
                continue;
            }
            tokens.push((bytes.len(), token.len(), rank));
            bytes.extend_from_slice(&token);
        }
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let mut ranks = Ranks::with_capacity_and_hasher(tokens.len(), Default::default());
        for (start, len, rank) in tokens {
            ranks.insert(&bytes[start..start + len], rank);
        }
        ranks
    })
}

/// Tokens of one pre-token of 2..[`DIRECT_MERGE_MAX`] bytes, as tiktoken's byte-pair merge
/// (`_byte_pair_merge`, ported) makes them, without the pre-tokenizer regex `encode_ordinary`
/// runs first: repeatedly merge the adjacent pair whose merged bytes have the lowest rank,
/// leftmost on ties, until no merged pair is a token.
fn merge_len(ranks: &Ranks, piece: &[u8]) -> usize {
    if piece.len() < 2 || ranks.contains_key(piece) {
        // Every single byte is a token; an empty piece has none.
        return piece.len().min(1);
    }
    let rank = |start: usize, end: usize| ranks.get(&piece[start..end]).copied();
    // parts[k] = (start of part k, rank of part k merged with part k + 1); two sentinels.
    let mut parts = [(0usize, Rank::MAX); DIRECT_MERGE_MAX + 1];
    let n = piece.len();
    for (i, part) in parts.iter_mut().enumerate().take(n - 1) {
        *part = (i, rank(i, i + 2).unwrap_or(Rank::MAX));
    }
    parts[n - 1] = (n - 1, Rank::MAX);
    parts[n] = (n, Rank::MAX);
    let mut len = n + 1;
    // The rank of parts k and k + 1 merged once part k + 1 has absorbed k + 2.
    let merged = |parts: &[(usize, Rank)], len: usize, k: usize| {
        if k + 3 < len {
            rank(parts[k].0, parts[k + 3].0).unwrap_or(Rank::MAX)
        } else {
            Rank::MAX
        }
    };
    loop {
        let Some((i, _)) = parts[..len - 1]
            .iter()
            .enumerate()
            .filter(|(_, p)| p.1 != Rank::MAX)
            .min_by_key(|(k, p)| (p.1, *k))
        else {
            return len - 1;
        };
        if i > 0 {
            parts[i - 1].1 = merged(&parts, len, i - 1);
        }
        parts[i].1 = merged(&parts, len, i);
        parts.copy_within(i + 2..len, i + 1);
        len -= 1;
    }
}

/// `encode_ordinary(piece).len()`, in slices of [`MAX_PIECE`] for longer pieces.
fn encode_len(bpe: &CoreBPE, piece: &str) -> usize {
    let mut rest = piece;
    let mut total = 0;
    while rest.len() > MAX_PIECE {
        let cut = rest.floor_char_boundary(MAX_PIECE);
        let (slice, tail) = rest.split_at(cut);
        total += bpe.encode_ordinary(slice).len();
        rest = tail;
    }
    total + bpe.encode_ordinary(rest).len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tests::{code_line, fragment};
    use proptest::prelude::*;

    /// tiktoken-rs's cl100k_base pattern (it exports only o200k_base's as a constant).
    const CL100K_PAT: &str = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";

    fn tiktoken_regex(pattern: Pattern) -> fancy_regex::Regex {
        let source = match pattern {
            Pattern::O200k => tiktoken_rs::O200K_BASE_PAT_STR,
            Pattern::Cl100k => CL100K_PAT,
        };
        fancy_regex::Regex::new(source).expect("tiktoken's pattern")
    }

    /// tiktoken's pre-tokenization of `text`, as (start, end) pairs.
    fn tiktoken_pieces(regex: &fancy_regex::Regex, text: &str) -> Vec<(usize, usize)> {
        regex
            .find_iter(text)
            .map(|m| {
                let m = m.expect("no backtrack limit on test inputs");
                (m.start(), m.end())
            })
            .collect()
    }

    fn segments(pattern: Pattern, text: &str) -> Vec<(usize, usize, bool)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let (end, piece) = next_segment(pattern, text.as_bytes(), i);
            out.push((i, end, piece));
            i = end;
        }
        out
    }

    fn pieces(pattern: Pattern, text: &str) -> Vec<&str> {
        segments(pattern, text)
            .into_iter()
            .map(|(start, end, _)| &text[start..end])
            .collect()
    }

    /// The scanner's pieces are tiktoken's pieces; a non-ASCII region ends on a tiktoken boundary
    /// and pre-tokenizes alone as it does in place; every piece pre-tokenizes alone to itself.
    fn check_segmentation(pattern: Pattern, text: &str) -> Result<(), TestCaseError> {
        let regex = tiktoken_regex(pattern);
        let reference = tiktoken_pieces(&regex, text);
        let mut at = 0; // index into `reference`
        for (start, end, piece) in segments(pattern, text) {
            prop_assert!(at < reference.len() && reference[at].0 == start);
            let first = at;
            while at < reference.len() && reference[at].1 < end {
                at += 1;
            }
            prop_assert!(
                at < reference.len() && reference[at].1 == end,
                "{:?}: segment {:?} does not end on a tiktoken boundary",
                pattern,
                &text[start..end]
            );
            if piece {
                prop_assert_eq!(first, at, "{:?}: {:?}", pattern, &text[start..end]);
            } else {
                let alone: Vec<(usize, usize)> = tiktoken_pieces(&regex, &text[start..end])
                    .into_iter()
                    .map(|(s, e)| (s + start, e + start))
                    .collect();
                prop_assert_eq!(&alone[..], &reference[first..=at]);
            }
            at += 1;
        }
        prop_assert_eq!(at, reference.len());
        for &(start, end) in &reference {
            let alone = tiktoken_pieces(&regex, &text[start..end]);
            prop_assert_eq!(alone, vec![(0, end - start)], "{:?}", &text[start..end]);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn segmentation_matches_tiktoken_on_mixed_fragments(fragments in proptest::collection::vec(fragment(), 0..40)) {
            let text = fragments.concat();
            check_segmentation(Pattern::O200k, &text)?;
            check_segmentation(Pattern::Cl100k, &text)?;
        }

        #[test]
        fn segmentation_matches_tiktoken_on_code(lines in proptest::collection::vec(code_line(), 0..40)) {
            let text = lines.concat();
            check_segmentation(Pattern::O200k, &text)?;
            check_segmentation(Pattern::Cl100k, &text)?;
        }

        #[test]
        fn segmentation_matches_tiktoken_on_ascii(text in "[\\x00-\\x7f]{0,300}") {
            check_segmentation(Pattern::O200k, &text)?;
            check_segmentation(Pattern::Cl100k, &text)?;
        }
    }

    /// Every piece the scanner cuts (2 to 99 bytes) merges to as many tokens as tiktoken-rs's
    /// `encode_ordinary` gives it, with either encoding's rank table.
    fn check_direct_merge(text: &str) -> Result<(), TestCaseError> {
        for (pattern, encoding) in [
            (Pattern::O200k, crate::tokens::Encoding::O200kBase),
            (Pattern::Cl100k, crate::tokens::Encoding::Cl100kBase),
        ] {
            let table = ranks(encoding);
            for (start, end, piece) in segments(pattern, text) {
                let bytes = &text.as_bytes()[start..end];
                if piece && (2..DIRECT_MERGE_MAX).contains(&bytes.len()) {
                    prop_assert_eq!(
                        merge_len(table, bytes),
                        encoding.bpe().encode_ordinary(&text[start..end]).len(),
                        "{:?}: {:?}",
                        pattern,
                        &text[start..end]
                    );
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn direct_merge_equals_tiktoken_on_mixed_fragments(fragments in proptest::collection::vec(fragment(), 0..40)) {
            check_direct_merge(&fragments.concat())?;
        }

        #[test]
        fn direct_merge_equals_tiktoken_on_code(lines in proptest::collection::vec(code_line(), 0..40)) {
            check_direct_merge(&lines.concat())?;
        }

        #[test]
        fn direct_merge_equals_tiktoken_on_long_words(text in "[a-zA-Z0-9_]{2,99}( [a-z]{30,99})?") {
            check_direct_merge(&text)?;
        }
    }

    #[test]
    fn rank_tables_hold_every_ordinary_token_and_no_special_one() {
        for (encoding, ordinary) in [
            (crate::tokens::Encoding::O200kBase, 199_998),
            (crate::tokens::Encoding::Cl100kBase, 100_256),
        ] {
            let table = ranks(encoding);
            assert_eq!(table.len(), ordinary, "{}", encoding.as_str());
            for special in encoding.bpe().special_tokens() {
                assert!(!table.contains_key(special.as_bytes()), "{special}");
            }
            // Every entry decodes back to its own bytes.
            for (&bytes, &rank) in table.iter().step_by(97) {
                assert_eq!(
                    encoding.bpe().decode_bytes(&[rank]).ok().as_deref(),
                    Some(bytes)
                );
            }
        }
    }

    #[test]
    fn merging_is_total_on_the_shortest_pieces() {
        let table = ranks(crate::tokens::Encoding::O200kBase);
        assert_eq!(merge_len(table, b""), 0);
        assert_eq!(merge_len(table, b"x"), 1);
        let bpe = crate::tokens::Encoding::O200kBase.bpe();
        for piece in ["xq", "zz", "the", "Qx"] {
            assert_eq!(
                merge_len(table, piece.as_bytes()),
                bpe.encode_ordinary(piece).len()
            );
        }
    }

    #[test]
    fn counting_before_the_rank_table_is_built_is_exact_too() {
        // Whatever state the table's background build is in, counts equal tiktoken-rs's.
        let text = "identifier_with_many_parts_x9 0x7f3a9c ERR_4411 ==> zzqqxx\n";
        let counter = crate::tokens::TokenCounter::new(crate::tokens::Encoding::O200kBase);
        assert_eq!(counter.count_text(text), counter.reference_count(text));
        let _ = ranks(crate::tokens::Encoding::O200kBase);
        let again = format!("{text} other_identifier_{}", 77);
        assert_eq!(counter.count_text(&again), counter.reference_count(&again));
    }

    #[test]
    fn every_symbol_is_punctuation_for_tiktokens_regex_engine() {
        let punctuation = fancy_regex::Regex::new(r"^[^\s\p{L}\p{N}\p{M}]$").expect("regex");
        let mut checked = 0;
        for &(low, high) in &SYMBOLS {
            for cp in low..=high {
                let c = char::from_u32(cp).expect("no surrogates in SYMBOLS");
                let mut buf = [0u8; 4];
                let text = c.encode_utf8(&mut buf);
                assert!(
                    punctuation.is_match(text).expect("match"),
                    "U+{cp:04X} is not punctuation for the regex tables in use"
                );
                assert_eq!(char_class(text.as_bytes(), 0), (PUNCT, text.len()));
                checked += 1;
            }
        }
        assert!(checked > 3_000, "{checked}");
        for outside in [
            'é', 'ª', '²', '\u{a0}', '\u{3000}', '\u{301}', '\u{fe0f}', '❶', '日',
        ] {
            let mut buf = [0u8; 4];
            let text = outside.encode_utf8(&mut buf);
            assert_eq!(char_class(text.as_bytes(), 0).0, NON_ASCII, "{outside:?}");
        }
    }

    #[test]
    fn the_shared_cache_stays_exact_under_concurrent_writers() {
        // Many distinct short pieces (more than the cache has slots) counted on four threads at
        // once, so that slots are overwritten while others read them.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut word = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = 2 + (state % 9) as usize;
            (0..len)
                .map(|k| (b'a' + ((state >> (k * 5)) % 26) as u8) as char)
                .collect::<String>()
        };
        let texts: Vec<String> = (0..400)
            .map(|_| (0..400).map(|_| word()).collect::<Vec<_>>().join(" "))
            .collect();
        let bpe = tiktoken_rs::o200k_base_singleton();
        let expected: Vec<usize> = texts.iter().map(|t| bpe.encode_ordinary(t).len()).collect();
        std::thread::scope(|scope| {
            for offset in 0..4 {
                let (texts, expected) = (&texts, &expected);
                scope.spawn(move || {
                    for round in 0..3 {
                        for k in 0..texts.len() {
                            let k = (k * 7 + offset * 100 + round) % texts.len();
                            assert_eq!(
                                count(
                                    Pattern::O200k,
                                    crate::tokens::Encoding::O200kBase,
                                    &texts[k]
                                ),
                                expected[k]
                            );
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn o200k_pieces_follow_the_pattern() {
        let p = Pattern::O200k;
        assert_eq!(pieces(p, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(p, "HelloWorld"), ["Hello", "World"]);
        assert_eq!(pieces(p, "DON'T don't"), ["DON'T", " don't"]);
        assert_eq!(pieces(p, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(p, "x\n\n  y"), ["x", "\n\n", " ", " y"]);
        assert_eq!(pieces(p, "12345"), ["123", "45"]);
        assert_eq!(pieces(p, "a //b\n/"), ["a", " //", "b", "\n", "/"]);
        assert_eq!(pieces(p, ";\n//x"), [";\n//", "x"]);
        assert_eq!(
            pieces(p, "(foo) \tbar  "),
            ["(foo", ")", " ", "\tbar", "  "]
        );
        assert_eq!(pieces(p, "a\n  "), ["a", "\n", "  "]);
    }

    #[test]
    fn cl100k_pieces_follow_the_pattern() {
        let p = Pattern::Cl100k;
        assert_eq!(pieces(p, "HelloWorld it's"), ["HelloWorld", " it", "'s"]);
        assert_eq!(pieces(p, "'sam 'LL"), ["'s", "am", " '", "LL"]);
        assert_eq!(pieces(p, "a\n  "), ["a", "\n  "]);
        assert_eq!(pieces(p, "!\n\nx"), ["!\n\n", "x"]);
        assert_eq!(pieces(p, ";\n//x"), [";\n", "//", "x"]);
    }

    #[test]
    fn non_ascii_goes_to_tiktoken_up_to_a_safe_boundary() {
        let p = Pattern::O200k;
        assert_eq!(pieces(p, "a café au lait"), ["a", " café au", " lait"]);
        assert_eq!(pieces(p, "x é y z"), ["x", " é y", " z"]);
        assert_eq!(pieces(p, "日本語"), ["日本語"]);
        // Symbols are scanned like ASCII punctuation.
        assert_eq!(pieces(p, "a → b — c"), ["a", " →", " b", " —", " c"]);
        assert_eq!(pieces(p, "    42→fn x"), ["   ", " ", "42", "→fn", " x"]);
        assert_eq!(pieces(p, "├── src/ ✓"), ["├──", " src", "/", " ✓"]);
    }
}
