//! A prefilter for regexes without a single literal byte, such as `[A-Z]{3}\s\d{5}`.
//!
//! The `regex` engine finds candidates for a pattern with a literal (`ERR_\d+`) with `memchr`
//! or a SIMD search and runs its DFA only around them. With no literal byte it has no
//! prefilter: its lazy DFA steps through every byte of the text (about 0.7 GB/s per core on
//! the machines of `docs/PERFORMANCE.md`). Many such patterns still start with a few bytes
//! from small classes (`[A-Z]{3}`, `[0-9][0-9]`) that are rare in text. [`StartClasses`]
//! holds those classes, position by position, and finds the offsets where all of them are
//! present eight bytes at a time in ordinary registers (the SWAR range test of "Bit
//! Twiddling Hacks", no `unsafe`); only there does the regex run, anchored.
//!
//! The prefilter only narrows where matches are looked for: [`StartSearch::earliest_end`] gives
//! the same answer as the regex's own search, which the grep property test checks against a
//! naive scan.

use regex_automata::meta::{Cache, Regex};
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Class, Hir, HirKind};

use crate::required::Required;

/// Leading positions looked at, at most: three in a row of two or three ranges each already
/// leave few candidates.
const MAX_POSITIONS: usize = 3;
/// Byte ranges per position, at most.
const MAX_RANGES: usize = 4;
/// The expected share of text offsets that are candidates above which the prefilter is not
/// used: with more, running the regex at each would cost more than its plain scan.
const MAX_CANDIDATE_RATE: f64 = 0.003;

/// Candidates tried in one text before [`StartSearch`] checks how dense they are.
pub const DENSE_AFTER: usize = 16;
/// Candidates closer together than this many bytes on average are too dense to try one by one.
pub const DENSE_SPACING: usize = 64;

/// The byte classes of the first positions of every match of a regex (see the module
/// documentation).
#[derive(Debug, Clone)]
pub struct StartClasses {
    /// One entry per leading position (1..=[`MAX_POSITIONS`]).
    positions: Vec<Position>,
}

/// The bytes allowed at one position: up to [`MAX_RANGES`] inclusive ranges of ASCII bytes,
/// and every byte of 0x80 and above if `high` (a class with non-ASCII members, `\d` say).
#[derive(Debug, Clone, PartialEq)]
struct Position {
    ranges: Vec<(u8, u8)>,
    high: bool,
}

/// A byte repeated in every byte of a word.
const fn splat(b: u8) -> u64 {
    u64::from_ne_bytes([b; 8])
}

impl Position {
    /// The high bit of each byte of `word` that is in this position (exact for every byte: a
    /// byte of 0x80 or more is never in an ASCII range).
    #[inline]
    fn mask(&self, word: u64) -> u64 {
        let low = word & splat(0x7f);
        let ascii = !word & splat(0x80);
        let high = if self.high { word & splat(0x80) } else { 0 };
        self.ranges.iter().fold(high, |mask, &(lo, hi)| {
            // Per byte b < 0x80: (0x80 + hi - b) has its high bit iff b <= hi, and
            // (b + 0x80 - lo) iff b >= lo; neither borrows nor carries into the next byte.
            let below_or_at_hi = splat(0x80 + hi).wrapping_sub(low);
            let at_or_above_lo = low.wrapping_add(splat(0x80 - lo));
            mask | (below_or_at_hi & at_or_above_lo & ascii)
        })
    }

    fn contains(&self, b: u8) -> bool {
        (self.high && b >= 0x80) || self.ranges.iter().any(|&(lo, hi)| lo <= b && b <= hi)
    }
}

impl StartClasses {
    /// The start classes of `hir`, if worth a prefilter: the pattern holds no literal byte (a
    /// literal gives the regex engine a better prefilter of its own), cannot match the empty
    /// string, and its first positions are fixed ASCII classes rare enough in text.
    pub fn of(hir: &Hir) -> Option<StartClasses> {
        if hir.properties().minimum_len().is_none_or(|n| n == 0) || has_literal(hir) {
            return None;
        }
        let mut sets = Vec::new();
        fixed_prefix(hir, &mut sets);
        let positions: Vec<Position> = sets
            .iter()
            .take(MAX_POSITIONS)
            .map_while(position_of)
            .collect();
        let rate: f64 = sets[..positions.len()].iter().map(typical_share).product();
        (!positions.is_empty() && rate <= MAX_CANDIDATE_RATE).then_some(StartClasses { positions })
    }

    /// The first offset at or after `from` where every leading position's byte is in its class
    /// (a match can start nowhere else), if any.
    pub fn find(&self, hay: &[u8], from: usize) -> Option<usize> {
        let (first, rest) = self.positions.split_first()?;
        // Of a word's eight start offsets, those whose every position lies in the word.
        let step = 8 - rest.len();
        let mut at = from;
        while let Some(bytes) = hay.get(at..at + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            let word = u64::from_le_bytes(word);
            let starts = first.mask(word);
            if starts == 0 {
                at += 8;
                continue;
            }
            // Position p of a start at byte j is byte j + p: shifted down onto j (the top p
            // bytes, whose positions lie past the word, become zero).
            let candidates = rest.iter().zip(1..).fold(starts, |c, (position, p)| {
                c & (position.mask(word) >> (8 * p))
            });
            if candidates != 0 {
                return Some(at + candidates.trailing_zeros() as usize / 8);
            }
            at += step;
        }
        (at..hay.len()).find(|&start| self.starts_at(hay, start))
    }

    /// Whether every leading position's byte at `start` is in its class.
    fn starts_at(&self, hay: &[u8], start: usize) -> bool {
        self.positions
            .iter()
            .enumerate()
            .all(|(p, position)| hay.get(start + p).is_some_and(|&b| position.contains(b)))
    }
}

/// Searches for the earliest end of a match, narrowed by a pattern's [`StartClasses`] while
/// that pays. One per scanning thread: it learns from the texts it searches. Where candidates
/// are dense (a text in capitals), trying each costs more than the plain search, so the
/// prefilter is used in turns: on for `PROBE_BYTES` of text, then, if the candidates of those
/// bytes were dense, off for `OFF_BYTES`; and within one text it hands over to the plain
/// search as soon as the candidates it met are dense. Before any of that, what every match
/// requires ([`Required`]) passes over texts that cannot hold a match, or, for a pattern of
/// bounded length, narrows the search to the stretches around what it requires.
#[derive(Debug, Clone)]
pub struct StartSearch<'r> {
    classes: Option<&'r StartClasses>,
    required: Option<&'r Required>,
    /// Whether the prefilter is in use for the current stretch of text.
    on: bool,
    /// Candidates tried and bytes searched in the current stretch.
    tried: usize,
    searched: usize,
}

/// Bytes searched with the prefilter before its candidates' density is judged.
const PROBE_BYTES: usize = 64 << 10;
/// Bytes searched without it after a dense stretch, before it is probed again.
const OFF_BYTES: usize = 1 << 20;

impl<'r> StartSearch<'r> {
    pub fn new(classes: Option<&'r StartClasses>, required: Option<&'r Required>) -> Self {
        StartSearch {
            classes,
            required,
            on: true,
            tried: 0,
            searched: 0,
        }
    }

    /// The end of the earliest match of `regex` in `hay` at or after `from`, as the regex's
    /// own search with `earliest` reports it.
    pub fn earliest_end(
        &mut self,
        regex: &Regex,
        cache: &mut Cache,
        hay: &[u8],
        from: usize,
    ) -> Option<usize> {
        if let Some(required) = self.required {
            if required.is_bounded() {
                return required.earliest_end(regex, cache, hay, from);
            }
            if !required.may_match(hay.get(from..).unwrap_or_default()) {
                return None;
            }
        }
        let Some(classes) = self.classes else {
            return plain_earliest_end(regex, cache, hay, from);
        };
        self.searched += hay.len().saturating_sub(from);
        if !self.on {
            if self.searched >= OFF_BYTES {
                (self.on, self.tried, self.searched) = (true, 0, 0);
            }
            return plain_earliest_end(regex, cache, hay, from);
        }
        let end = self.narrowed(classes, regex, cache, hay, from);
        if self.searched >= PROBE_BYTES {
            self.on = self.tried * DENSE_SPACING <= self.searched;
            (self.tried, self.searched) = (0, 0);
        }
        end
    }

    /// [`Self::earliest_end`] with the prefilter.
    fn narrowed(
        &mut self,
        classes: &StartClasses,
        regex: &Regex,
        cache: &mut Cache,
        hay: &[u8],
        from: usize,
    ) -> Option<usize> {
        // Each candidate's earliest end, anchored there. A later start may end sooner (another
        // branch of the pattern), so candidates are tried up to the best end found; one at or
        // past it cannot end before it (no match is empty).
        let mut best: Option<usize> = None;
        let mut at = from;
        let mut tried = 0;
        while let Some(candidate) = classes.find(hay, at) {
            if best.is_some_and(|end| candidate >= end) {
                break;
            }
            tried += 1;
            self.tried += 1;
            if tried > DENSE_AFTER && candidate - from < tried * DENSE_SPACING {
                // Candidates everywhere in this text: one plain search from here is cheaper
                // than an anchored one at each. Every match starting earlier was tried.
                let rest = plain_earliest_end(regex, cache, hay, candidate);
                return best.into_iter().chain(rest).min();
            }
            let input = Input::new(hay)
                .range(candidate..)
                .anchored(Anchored::Yes)
                .earliest(true);
            if let Some(m) = regex.search_half_with(cache, &input) {
                best = Some(best.map_or(m.offset(), |end| end.min(m.offset())));
            }
            at = candidate + 1;
        }
        best
    }
}

/// The regex's own search for the earliest end of a match in `hay` at or after `from`.
pub fn plain_earliest_end(
    regex: &Regex,
    cache: &mut Cache,
    hay: &[u8],
    from: usize,
) -> Option<usize> {
    let input = Input::new(hay).range(from..).earliest(true);
    regex.search_half_with(cache, &input).map(|m| m.offset())
}

/// Whether `hir` has a literal anywhere.
pub fn has_literal(hir: &Hir) -> bool {
    match hir.kind() {
        HirKind::Literal(_) => true,
        HirKind::Empty | HirKind::Look(_) | HirKind::Class(_) => false,
        HirKind::Repetition(rep) => has_literal(&rep.sub),
        HirKind::Capture(capture) => has_literal(&capture.sub),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => subs.iter().any(has_literal),
    }
}

/// A set of bytes.
pub type ByteSet = [bool; 256];

/// Pushes onto `out` the sets of bytes that the first positions of every match of `hir` hold,
/// as far as they are fixed (at most [`MAX_POSITIONS`] in all); returns whether every match
/// of `hir` is exactly that long, so that what follows it fixes the next positions.
fn fixed_prefix(hir: &Hir, out: &mut Vec<ByteSet>) -> bool {
    if out.len() >= MAX_POSITIONS {
        return false;
    }
    match hir.kind() {
        // Zero-width: transparent.
        HirKind::Empty | HirKind::Look(_) => true,
        // Patterns with a literal are refused before (`has_literal`).
        HirKind::Literal(_) => false,
        HirKind::Class(class) => {
            out.push(class_bytes(class));
            // A class of ASCII characters is one byte; any other spans a varying number, so
            // the positions after it are unknown.
            !matches!(class, Class::Unicode(class) if has_wider_characters(class))
        }
        HirKind::Capture(capture) => fixed_prefix(&capture.sub, out),
        HirKind::Concat(subs) => subs.iter().all(|sub| fixed_prefix(sub, out)),
        HirKind::Repetition(rep) => {
            if rep.min == 0 {
                return false;
            }
            if let HirKind::Class(Class::Unicode(class)) = rep.sub.kind()
                && has_wider_characters(class)
            {
                // Every byte of the first `min` characters of such a class is an ASCII member
                // or a byte of a longer character: the first `min` bytes are, whatever the
                // widths. Past them, nothing is known.
                let set = unicode_class_bytes(class);
                let room = MAX_POSITIONS - out.len();
                out.extend(std::iter::repeat_n(set, room.min(rep.min as usize)));
                return false;
            }
            for _ in 0..rep.min {
                if !fixed_prefix(&rep.sub, out) {
                    return false;
                }
            }
            rep.max == Some(rep.min)
        }
        HirKind::Alternation(branches) => {
            // Position by position, the union of the branches' sets, as far as every branch
            // fixes it.
            let mut each = Vec::with_capacity(branches.len());
            let mut all_complete = true;
            for branch in branches {
                let mut sets = Vec::new();
                all_complete &= fixed_prefix(branch, &mut sets);
                each.push(sets);
            }
            let shortest = each.iter().map(Vec::len).min().unwrap_or(0);
            let same_length = each.iter().all(|sets| sets.len() == shortest);
            for p in 0..shortest {
                let mut union = [false; 256];
                for sets in &each {
                    for (u, &s) in union.iter_mut().zip(sets[p].iter()) {
                        *u |= s;
                    }
                }
                out.push(union);
            }
            all_complete && same_length
        }
    }
}

/// Whether `class` has members longer than one byte.
fn has_wider_characters(class: &regex_syntax::hir::ClassUnicode) -> bool {
    class.ranges().iter().any(|r| !r.end().is_ascii())
}

/// The bytes of `class`'s members: for a class of characters, the bytes a character can start
/// with, and every byte of 0x80 and above when it has non-ASCII members (the bytes of a longer
/// character).
pub fn class_bytes(class: &Class) -> ByteSet {
    match class {
        Class::Unicode(class) => unicode_class_bytes(class),
        Class::Bytes(class) => {
            let mut set = [false; 256];
            for range in class.ranges() {
                for b in range.start()..=range.end() {
                    set[usize::from(b)] = true;
                }
            }
            set
        }
    }
}

/// [`class_bytes`] of a class of characters.
fn unicode_class_bytes(class: &regex_syntax::hir::ClassUnicode) -> ByteSet {
    let mut set = [false; 256];
    for range in class.ranges() {
        if range.start().is_ascii() {
            let end = if range.end().is_ascii() {
                range.end() as u8
            } else {
                0x7f
            };
            for b in range.start() as u8..=end {
                set[usize::from(b)] = true;
            }
        }
        if !range.end().is_ascii() {
            for b in &mut set[0x80..] {
                *b = true;
            }
        }
    }
    set
}

/// `set` as a [`Position`]: at most [`MAX_RANGES`] ranges of ASCII bytes, plus every byte of
/// 0x80 and above if it has them all; `None` if it is neither.
fn position_of(set: &ByteSet) -> Option<Position> {
    let high = set[0x80..].iter().all(|&b| b);
    if !high && set[0x80..].iter().any(|&b| b) {
        return None;
    }
    let mut ranges: Vec<(u8, u8)> = Vec::new();
    for b in 0..0x80u8 {
        if !set[usize::from(b)] {
            continue;
        }
        match ranges.last_mut() {
            Some((_, hi)) if *hi + 1 == b => *hi = b,
            _ => ranges.push((b, b)),
        }
    }
    ((!ranges.is_empty() || high) && ranges.len() <= MAX_RANGES)
        .then_some(Position { ranges, high })
}

/// A rough share of the bytes of English prose and code in `set`: lower-case letters and spaces
/// are common, capitals and digits rare.
pub fn typical_share(set: &ByteSet) -> f64 {
    // Non-ASCII bytes: box drawing, arrows, emoji and accents in mostly English transcripts.
    let high = if set[0x80..].iter().any(|&b| b) {
        HIGH_SHARE
    } else {
        0.0
    };
    high + (0..0x80u8)
        .filter(|&b| set[usize::from(b)])
        .map(byte_share)
        .sum::<f64>()
}

/// The share of all bytes of 0x80 and above together.
const HIGH_SHARE: f64 = 0.01;

/// The share of one ASCII byte.
fn byte_share(b: u8) -> f64 {
    match b {
        b'a'..=b'z' => 0.025,
        b' ' => 0.15,
        b'\n' | b'\t' => 0.02,
        b'A'..=b'Z' => 0.002,
        b'0'..=b'9' => 0.003,
        0x21..=0x7e => 0.003,
        _ => 0.0001,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn classes(pattern: &str) -> Option<StartClasses> {
        StartClasses::of(&regex_syntax::parse(pattern).unwrap())
    }

    /// `pattern`'s regex and start classes (which it must have).
    fn compiled(pattern: &str) -> (Regex, StartClasses) {
        let regex = Regex::new(pattern).unwrap();
        (regex, classes(pattern).expect("start classes"))
    }

    fn ranges(pattern: &str) -> Vec<Vec<(u8, u8)>> {
        classes(pattern)
            .map(|c| c.positions.into_iter().map(|p| p.ranges).collect())
            .unwrap_or_default()
    }

    /// Which positions also take every byte of 0x80 and above.
    fn high(pattern: &str) -> Vec<bool> {
        classes(pattern)
            .map(|c| c.positions.into_iter().map(|p| p.high).collect())
            .unwrap_or_default()
    }

    #[test]
    fn rare_leading_classes_are_taken_and_the_rest_left_to_the_regex() {
        assert_eq!(ranges(r"[A-Z]{3}\s\d{5}"), vec![vec![(b'A', b'Z')]; 3]);
        assert_eq!(
            ranges(r"\b[A-Z][0-9A-F]+"),
            vec![vec![(b'A', b'Z')], vec![(b'0', b'9'), (b'A', b'F')]]
        );
        assert_eq!(
            ranges(r"(?:[A-Z]{2}|[0-9]{2})[A-Z]"),
            vec![
                vec![(b'0', b'9'), (b'A', b'Z')],
                vec![(b'0', b'9'), (b'A', b'Z')],
                vec![(b'A', b'Z')]
            ]
        );
        // A literal: the regex engine has a better prefilter.
        assert!(classes(r"[A-Z]{3}_\d{5}").is_none());
        // Common classes, an optional start, an empty match: none.
        assert!(classes(r"[a-z]{3}").is_none());
        assert!(classes(r"[A-Z]").is_none());
        assert!(classes(r"[A-Z]?[A-Z]{3}").is_none());
        assert!(classes(r"[A-Z]*").is_none());
    }

    #[test]
    fn a_class_with_wider_characters_takes_every_high_byte_and_ends_what_is_known() {
        // Unicode `\d`: ASCII digits or any byte of a longer digit, for as many bytes as the
        // pattern has digits at least.
        assert_eq!(ranges(r"\d{5}"), vec![vec![(b'0', b'9')]; 3]);
        assert_eq!(high(r"\d{5}"), vec![true; 3]);
        assert_eq!(
            ranges(r"[A-Z]{2}\d\d"),
            vec![vec![(b'A', b'Z')], vec![(b'A', b'Z')], vec![(b'0', b'9')]]
        );
        assert_eq!(high(r"[A-Z]{2}\d\d"), vec![false, false, true]);
        // After one such character the next byte may still be part of it: `[A-Z]` is not
        // taken, and one digit position alone is too common.
        assert!(classes(r"\d[A-Z]{2}").is_none());
        assert!(classes(r"(?-u:\d)[A-Z]{2}").is_some());
    }

    #[test]
    fn the_word_mask_is_exact_for_every_byte() {
        for high in [false, true] {
            let position = Position {
                ranges: vec![(0, 3), (b'A', b'Z'), (0x7d, 0x7f)],
                high,
            };
            check_every_byte(&position);
        }
    }

    fn check_every_byte(position: &Position) {
        for b in 0..=255u8 {
            let word = u64::from_le_bytes([b'a', b, 0xff, b, 0x80, b, b'z', b]);
            let expected = (0..8).fold(0u64, |m, k| {
                let byte = word.to_le_bytes()[k];
                if position.contains(byte) {
                    m | 0x80 << (8 * k)
                } else {
                    m
                }
            });
            assert_eq!(position.mask(word), expected, "byte {b:#x}");
        }
    }

    #[test]
    fn earliest_end_takes_the_soonest_end_of_any_branch() {
        // From the first candidate (`AA`) the match runs to the `Z`; the later `BB` ends
        // sooner, as the regex's own search says.
        let pattern = r"[A-Z][A-Z][^YZ]*[YZ]|[A-Z][A-Z][0-9]";
        let (regex, start) = compiled(pattern);
        let hay = b"xx AA then BB1 and Z";
        let mut cache = regex.create_cache();
        let plain = StartSearch::new(None, None).earliest_end(&regex, &mut cache, hay, 0);
        assert_eq!(plain, Some(14));
        assert_eq!(
            StartSearch::new(Some(&start), None).earliest_end(&regex, &mut cache, hay, 0),
            plain
        );
    }

    #[test]
    fn dense_candidates_hand_over_to_the_plain_search() {
        // Capitals everywhere: past the first candidates, one plain search finds the match.
        let pattern = r"[A-Z]{3}\s[0-9]{2}";
        let (regex, start) = compiled(pattern);
        let mut hay = b"ABCDEFGH".repeat(40);
        hay.extend_from_slice(b" XYZ 42");
        let mut cache = regex.create_cache();
        let mut search = StartSearch::new(Some(&start), None);
        assert_eq!(
            search.earliest_end(&regex, &mut cache, &hay, 0),
            Some(hay.len())
        );
        assert_eq!(
            search.earliest_end(&regex, &mut cache, &hay[..320], 0),
            None
        );
    }

    #[test]
    fn a_dense_stretch_turns_the_prefilter_off_for_a_while_and_then_on_again() {
        let pattern = r"[A-Z]{3}\s[0-9]{2}";
        let (regex, start) = compiled(pattern);
        let mut cache = regex.create_cache();
        let mut search = StartSearch::new(Some(&start), None);
        let capitals = b"HTTP GET STATUS OK ".repeat(10);
        let mut texts = 0;
        while search.on {
            assert_eq!(search.earliest_end(&regex, &mut cache, &capitals, 0), None);
            texts += 1;
        }
        assert!(
            texts * capitals.len() >= PROBE_BYTES,
            "judged after a full probe"
        );
        // Off: the plain search, with the same answers.
        let mut hit = capitals.clone();
        hit.extend_from_slice(b"XYZ 42");
        assert_eq!(
            search.earliest_end(&regex, &mut cache, &hit, 0),
            Some(hit.len())
        );
        while !search.on {
            assert_eq!(search.earliest_end(&regex, &mut cache, &capitals, 0), None);
        }
        assert_eq!((search.tried, search.searched), (0, 0), "a new probe");
    }

    #[test]
    fn sparse_candidates_keep_the_prefilter_on() {
        let pattern = r"[A-Z]{3}\s[0-9]{2}";
        let (regex, start) = compiled(pattern);
        let mut cache = regex.create_cache();
        let mut search = StartSearch::new(Some(&start), None);
        let prose = b"the request came back fine and the ABC cache was cold, ok. ".repeat(20);
        for _ in 0..2 * PROBE_BYTES / prose.len() {
            assert_eq!(search.earliest_end(&regex, &mut cache, &prose, 0), None);
            assert!(search.on);
        }
    }

    proptest! {
        #[test]
        fn find_agrees_with_a_byte_by_byte_check(
            hay in prop::collection::vec(prop::sample::select(&b"aAZ09 _\n\xc3\xa9Q"[..]), 0..80),
            from in 0usize..80,
        ) {
            let start = StartClasses {
                positions: vec![
                    Position { ranges: vec![(b'A', b'Z')], high: false },
                    Position { ranges: vec![(b'0', b'9'), (b'A', b'Z')], high: true },
                    Position { ranges: vec![(b'Z', b'Z'), (b'0', b'0')], high: false },
                ],
            };
            let from = from.min(hay.len());
            let expected = (from..hay.len()).find(|&s| start.starts_at(&hay, s));
            prop_assert_eq!(start.find(&hay, from), expected);
        }

        #[test]
        fn earliest_end_agrees_with_the_regex(
            // 0xd9 0xa3 is U+0663, an Arabic-Indic digit three: `\d` but not ASCII.
            hay in prop::collection::vec(prop::sample::select(&b"aAB12 _\nZ\xd9\xa3"[..]), 0..120),
            pattern in prop::sample::select(&[
                r"[A-Z]{2}[0-9]",
                r"\d{3}",
                r"[A-Z]\d{2}[A-Z]",
                r"\b[A-Z][0-9]{2}",
                r"[A-Z]{2}\s|[A-Z]{3}[0-9]",
                r"[A-Z][A-Z][^YZ]*[YZ]|[A-Z][A-Z][0-9]",
            ][..]),
            from in 0usize..120,
        ) {
            let regex = Regex::new(pattern).unwrap();
            let start = classes(pattern);
            prop_assert!(start.is_some(), "{pattern} has start classes");
            let from = from.min(hay.len());
            let mut cache = regex.create_cache();
            prop_assert_eq!(
                StartSearch::new(start.as_ref(), None).earliest_end(&regex, &mut cache, &hay, from),
                StartSearch::new(None, None).earliest_end(&regex, &mut cache, &hay, from)
            );
        }
    }
}
