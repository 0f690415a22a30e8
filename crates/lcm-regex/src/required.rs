//! A prefilter on whole texts: what every match of a regex requires of the text it lies in.
//!
//! The `regex` engine prefilters only on literals a match starts with (and, in narrow cases,
//! on a literal inside it). A pattern such as `[A-Z][a-z]+Error` starts with a class, so its
//! lazy DFA steps through every byte of every text (about 0.7 GB/s a core), although few texts
//! hold `Error` at all. Grep asks less of a text than the engine does: only whether it can hold
//! a match at all. [`Required`] answers that from what every match must contain anywhere:
//!
//! - a set of literals one of which every match contains (`Error`; `Error|Exception`), looked
//!   for with the regex engine's own literal searchers (SIMD `memchr`, Teddy);
//! - a run of one class of bytes (`[0-9a-f]{40}`, a git hash: 40 bytes in `[0-9a-f]`), where
//!   the class is rare enough in text: such a run holds every `len`-th byte of the text, so
//!   those alone are looked at first (a table lookup each), and only around one in the class
//!   is the run measured, as the Boyer-Moore searches skip.
//!
//! Where a match's length is bounded (`[0-9a-f]{40}`: 40 bytes; up to `MAX_WINDOW`), a match
//! lies within that many bytes of a place it requires, so only the stretches around those
//! places are searched ([`Required::earliest_end`]): in a pack row of records, whose other
//! fields (tool call ids) may hold such a place, the rest of the row is still passed over.
//!
//! Neither changes a result: what is searched is searched by the regex as before, and what is
//! passed over cannot hold a match (the grep property test checks grep against a naive scan).

use regex_automata::meta::{Cache, Regex};
use regex_automata::util::prefilter::Prefilter;
use regex_automata::{Input, MatchKind, Span};
use regex_syntax::hir::{Hir, HirKind};

use crate::start_classes::{
    ByteSet, DENSE_AFTER, DENSE_SPACING, class_bytes, has_literal, plain_earliest_end,
    typical_share,
};

/// Literals shorter than this narrow too little to be worth a search of their own.
const MIN_LITERAL: usize = 3;
/// At most this many literals in a set (an alternation of words).
const MAX_LITERALS: usize = 16;
/// Runs shorter than this are left to the regex engine: their bytes are looked at too often.
const MIN_RUN: usize = 6;
/// The longest match, in bytes, for which the search goes around places: each place costs a
/// search of up to twice this, so past it one plain search of the text is the safer cost.
const MAX_WINDOW: usize = 1024;
/// The typical share of text in a run's class above which the run is left to the regex engine
/// (lower-case letters, 0.65, would stop the skip at most bytes; `[0-9a-f]`, 0.18, does not).
const MAX_RUN_SHARE: f64 = 0.25;

/// What every match of a regex requires of a text (see the module documentation).
#[derive(Debug, Clone)]
pub struct Required {
    needs: Needs,
    /// The most bytes a match can span, if that is bounded by [`MAX_WINDOW`].
    max_len: Option<usize>,
}

/// What a match holds: literals are looked for only where the regex engine does not look for
/// literals of its own a match starts with, and runs only in patterns without a literal byte,
/// so a pattern requires one or the other.
#[derive(Debug, Clone)]
enum Needs {
    /// One of a set of literals, the shortest of them `shortest` bytes long.
    Literals {
        prefilter: Prefilter,
        shortest: usize,
    },
    /// A run of bytes of one class.
    Run(Run),
}

/// At least `len` bytes in a row, each in `class`.
#[derive(Debug, Clone)]
struct Run {
    class: Box<ByteSet>,
    len: usize,
}

/// Where in a text a match may lie, because it holds something every match requires: a match
/// holding it, or any later place, starts no earlier than `max_len` bytes before `lo`, and a
/// match holding it ends no later than `max_len` bytes after `hi`.
#[derive(Debug, Clone, Copy)]
struct Place {
    lo: usize,
    hi: usize,
    /// Where to look for the next place.
    next: usize,
}

impl Required {
    /// What every match of `hir` requires, if that is anything the engine does not already
    /// look for itself.
    pub fn of(hir: &Hir) -> Option<Required> {
        // A fast prefilter on the literals a match starts with is what the engine runs first
        // anyway: a second search for literals would only repeat it.
        let engine_prefilters =
            Prefilter::from_hir_prefix(MatchKind::LeftmostFirst, hir).is_some_and(|p| p.is_fast());
        let literals = literal_cover(hir)
            .filter(|set| !engine_prefilters && shortest(set) >= MIN_LITERAL)
            .and_then(|set| {
                Some(Needs::Literals {
                    prefilter: Prefilter::new(MatchKind::LeftmostFirst, &set)?,
                    shortest: shortest(&set),
                })
            });
        // A pattern with a literal byte anywhere may have the engine search for it (inside a
        // match, too: `[0-9a-f]{8}-[0-9a-f]{4}` looks for `-`), faster than a run is found.
        let run = || {
            (!has_literal(hir))
                .then(|| required_run(hir))
                .flatten()
                .filter(|run| run.len >= MIN_RUN)
                .filter(|run| typical_share(&run.class) <= MAX_RUN_SHARE)
                .map(Needs::Run)
        };
        let needs = literals.or_else(run)?;
        Some(Required {
            needs,
            max_len: hir
                .properties()
                .maximum_len()
                .filter(|&len| len <= MAX_WINDOW),
        })
    }

    /// Whether a match's length is bounded, so that [`Self::earliest_end`] applies.
    pub fn is_bounded(&self) -> bool {
        self.max_len.is_some()
    }

    /// Whether `hay` may hold a match (`false`: it certainly holds none).
    pub fn may_match(&self, hay: &[u8]) -> bool {
        self.next_place(hay, 0).is_some()
    }

    /// The end of the earliest match of `regex` in `hay` at or after `from`, as the regex's own
    /// search with `earliest` reports it, for a pattern of bounded length: searched only
    /// around the places every match requires, nearest first.
    ///
    /// Why that is exact: a match holds such a place, so it lies in the stretch around it
    /// (`Place`). If the stretch around the first place holds a match, every match ending no
    /// later holds a place too, none before the first, so it lies in that stretch and the
    /// earliest end found there is the earliest of all. If the stretch holds none, no match
    /// holds that place, and the next one is tried. Where places are dense, one plain search
    /// from the current stretch's start is cheaper (and exact: a match starting earlier would
    /// hold an earlier place).
    pub fn earliest_end(
        &self,
        regex: &Regex,
        cache: &mut Cache,
        hay: &[u8],
        from: usize,
    ) -> Option<usize> {
        let max_len = self.max_len?;
        let mut at = from;
        let mut tried = 0;
        while let Some(place) = self.next_place(hay, at) {
            tried += 1;
            let lo = place.lo.saturating_sub(max_len).max(from);
            if tried > DENSE_AFTER && place.next - from < tried * DENSE_SPACING {
                return plain_earliest_end(regex, cache, hay, lo);
            }
            let hi = place.hi.saturating_add(max_len).min(hay.len());
            let input = Input::new(hay).range(lo..hi).earliest(true);
            if let Some(m) = regex.search_half_with(cache, &input) {
                return Some(m.offset());
            }
            at = place.next;
        }
        None
    }

    /// The first place at or after `at` that a match requires: a literal's occurrence, or a
    /// long enough run of the run's class.
    fn next_place(&self, hay: &[u8], at: usize) -> Option<Place> {
        match &self.needs {
            Needs::Literals {
                prefilter,
                shortest,
            } => {
                let found = prefilter.find(hay, Span::from(at..hay.len()))?;
                // A match holding this occurrence or a later one (which may be shorter, and
                // end sooner: `cde` inside `abcdefghij`) ends at least the shortest literal's
                // length past this one's start.
                Some(Place {
                    lo: found.start + shortest,
                    hi: found.start,
                    next: found.start + 1,
                })
            }
            Needs::Run(run) => {
                let (start, end) = run.next(hay, at)?;
                // A match holds `len` bytes of the run: it starts at most `max_len` before the
                // first `len` end, and ends at most `max_len` after the last `len` start.
                Some(Place {
                    lo: start + run.len,
                    hi: end - run.len,
                    next: end,
                })
            }
        }
    }
}

impl Run {
    /// The first stretch of `hay` from `at` on that is all in the class, at least `len` long
    /// and as long as it goes (cut at `at`), as (start, end).
    ///
    /// `len` bytes in a row hold one of every `len`-th byte, so only those are looked at
    /// until one is in the class; the stretch around it is measured, and if it is too short,
    /// the next run can only start after its end, so looking resumes `len` bytes past that.
    fn next(&self, hay: &[u8], at: usize) -> Option<(usize, usize)> {
        let in_class = |b: u8| self.class[usize::from(b)];
        let mut probe = at.checked_add(self.len - 1)?;
        while let Some(&b) = hay.get(probe) {
            if !in_class(b) {
                probe += self.len;
                continue;
            }
            let start = at
                + hay[at..probe]
                    .iter()
                    .rposition(|&b| !in_class(b))
                    .map_or(0, |k| k + 1);
            let end = probe
                + hay[probe..]
                    .iter()
                    .position(|&b| !in_class(b))
                    .unwrap_or(hay.len() - probe);
            if end - start >= self.len {
                return Some((start, end));
            }
            probe = end + self.len;
        }
        None
    }
}

/// Literals one of which every match of `hir` contains, as bytes (case as written), if there
/// is such a set of at most [`MAX_LITERALS`]: of those found, the one whose shortest literal is
/// longest.
fn literal_cover(hir: &Hir) -> Option<Vec<Vec<u8>>> {
    match hir.kind() {
        HirKind::Literal(literal) => Some(vec![literal.0.to_vec()]),
        HirKind::Capture(capture) => literal_cover(&capture.sub),
        HirKind::Repetition(rep) if rep.min >= 1 => literal_cover(&rep.sub),
        HirKind::Concat(subs) => subs
            .iter()
            .filter_map(literal_cover)
            .max_by_key(|set| (shortest(set), std::cmp::Reverse(set.len()))),
        HirKind::Alternation(branches) => {
            let mut set = Vec::new();
            for branch in branches {
                set.extend(literal_cover(branch)?);
            }
            set.sort_unstable();
            set.dedup();
            (set.len() <= MAX_LITERALS).then_some(set)
        }
        HirKind::Empty | HirKind::Look(_) | HirKind::Class(_) | HirKind::Repetition(_) => None,
    }
}

fn shortest(set: &[Vec<u8>]) -> usize {
    set.iter().map(Vec::len).min().unwrap_or(0)
}

/// A class of which every match of `hir` holds a run, and the longest such run, if there is
/// one.
fn required_run(hir: &Hir) -> Option<Run> {
    match hir.kind() {
        HirKind::Repetition(rep) if rep.min >= 1 => match rep.sub.kind() {
            // Each character of a class is one or more bytes, every one of them in the class's
            // bytes (an ASCII member, or a byte of a longer character): a run of `min`
            // characters is a run of at least `min` such bytes.
            HirKind::Class(class) => Some(Run {
                class: Box::new(class_bytes(class)),
                len: usize::try_from(rep.min).ok()?,
            }),
            _ => required_run(&rep.sub),
        },
        HirKind::Capture(capture) => required_run(&capture.sub),
        HirKind::Concat(subs) => subs
            .iter()
            .filter_map(required_run)
            .max_by_key(|run| run.len),
        HirKind::Empty
        | HirKind::Literal(_)
        | HirKind::Class(_)
        | HirKind::Look(_)
        | HirKind::Repetition(_)
        | HirKind::Alternation(_) => None,
    }
}

#[cfg(test)]
impl Required {
    fn literals(&self) -> Option<&Prefilter> {
        match &self.needs {
            Needs::Literals { prefilter, .. } => Some(prefilter),
            Needs::Run(_) => None,
        }
    }

    fn run(&self) -> Option<&Run> {
        match &self.needs {
            Needs::Run(run) => Some(run),
            Needs::Literals { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn required(pattern: &str) -> Option<Required> {
        Required::of(&regex_syntax::parse(pattern).unwrap())
    }

    fn cover(pattern: &str) -> Option<Vec<String>> {
        literal_cover(&regex_syntax::parse(pattern).unwrap()).map(|set| {
            set.into_iter()
                .map(|l| String::from_utf8(l).unwrap())
                .collect()
        })
    }

    #[test]
    fn literals_come_from_anywhere_in_a_match() {
        assert_eq!(cover("[A-Z][a-z]+Error"), Some(vec!["Error".into()]));
        assert_eq!(
            cover(r"\w+(?:Error|Exception)\b"),
            Some(vec!["Error".into(), "Exception".into()])
        );
        // The longest of several required literals.
        assert_eq!(cover(r"ab\d+timeout"), Some(vec!["timeout".into()]));
        // A branch without a literal, or a part that may be absent, requires nothing.
        assert_eq!(cover(r"\w+(?:Error|\d+)"), None);
        assert_eq!(cover(r"[a-z]+(?:Error)?"), None);
        assert_eq!(cover(r"[a-z]+(?:Error)*"), None);
        assert_eq!(cover(r"(?:Error){2,}"), Some(vec!["Error".into()]));
    }

    #[test]
    fn a_literal_the_engine_starts_with_or_a_short_one_is_left_to_the_engine() {
        assert!(required("Error[A-Z]+").is_none());
        assert!(required("(?:Error|Exception)[0-9]").is_none());
        assert!(required("[a-z]+ab").is_none());
        // Case-insensitive letters are classes, not literals.
        assert!(required("(?i)[a-z]+error").is_none());
        assert!(required("[A-Z][a-z]+Error").is_some());
    }

    #[test]
    fn runs_of_a_rare_class_are_required() {
        let hash = required("[0-9a-f]{40}").unwrap();
        assert!(hash.literals().is_none());
        assert!(hash.may_match(b"commit 3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a39 on main"));
        assert!(!hash.may_match(b"a facade of deadbeef cafe in a decade of fed beds"));
        assert!(!hash.may_match(b"3f2a9c1e8b7d6a5f4e3d2c1b0a9f8e7d6c5b4a3 is one short"));
        // The longest run of a concatenation.
        assert_eq!(
            required(r"\b\d{6}\s[0-9a-f]{12}")
                .unwrap()
                .run()
                .unwrap()
                .len,
            12
        );
        // Short runs, runs of common classes, runs in only one branch or that may be absent
        // are not.
        assert!(required("[0-9a-f]{5}").is_none());
        assert!(required("[a-z]{40}").is_none());
        assert!(required(r"\w{40}").is_none());
        assert!(required("[0-9a-f]{40}|x").is_none());
        // A literal byte anywhere leaves the search to the engine, which looks for it.
        assert!(required("[0-9a-f]{8}-[0-9a-f]{4}").is_none());
        assert!(required("(?:[0-9a-f]{40})?").is_none());
    }

    #[test]
    fn a_run_is_found_wherever_it_starts_and_cut_at_the_start_of_the_search() {
        let run = required(r"\d{6}").unwrap().run().unwrap().clone();
        for lead in 0..14 {
            let hay = format!("{}1234567 and 12 3", "x".repeat(lead));
            assert_eq!(run.next(hay.as_bytes(), 0), Some((lead, lead + 7)), "{hay}");
        }
        // From inside a run, only the part after the start counts.
        assert_eq!(run.next(b"x12345678 x", 2), Some((2, 9)));
        assert_eq!(run.next(b"x12345678 x", 4), None);
        // A run too short is stepped over, and a later one found.
        assert_eq!(run.next(b"12345 123456789 123456", 0), Some((6, 15)));
        assert_eq!(run.next(b"12345", 0), None);
        assert_eq!(run.next(b"", 0), None);
    }

    #[test]
    fn only_bounded_patterns_are_searched_around_places() {
        assert!(required("[0-9a-f]{40}").unwrap().is_bounded());
        assert!(required(".{0,30}Error").unwrap().is_bounded());
        assert!(!required("[A-Z][a-z]+Error").unwrap().is_bounded());
        // Bounded, but by more than a window is worth: a gate on the whole text.
        assert!(!required(".{0,5000}Error").unwrap().is_bounded());
    }

    #[test]
    fn a_text_without_any_of_the_literals_cannot_match() {
        let words = required(r"\w+(?:Error|Exception)").unwrap();
        assert!(words.may_match(b"raised a TypeError here"));
        assert!(words.may_match(b"an Exception"));
        assert!(!words.may_match(b"an error, an exception, an ERROR"));
        assert!(!words.may_match(b""));
    }

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(
                &[
                    "Error",
                    "error",
                    "Err",
                    "0123456789",
                    "abcdef",
                    "xabcdef",
                    "deadbeef",
                    "x",
                    " ",
                    "\n",
                    "é",
                    "ΣΦ",
                    "_",
                    "-",
                    "Exception",
                    "A",
                ][..],
            ),
            0..24,
        )
        .prop_map(|pieces| pieces.concat())
    }

    fn pattern() -> impl Strategy<Value = &'static str> {
        prop::sample::select(
            &[
                // Unbounded: a gate on the whole text.
                "[A-Z][a-z]+Error",
                r"\w+(?:Error|Exception)",
                "[0-9a-f]{16,}",
                r"\d{15,}",
                // Bounded: searched around what they require.
                "[0-9a-f]{15}",
                r"\b[0-9a-f]{6,20}\b",
                r"\d{6}",
                r"[0-9A-F]{2}\s\d{7}",
                r".{15}Error",
                r"(?:[a-f]|\d){15}",
                "[a-z]{2}Err[a-z]",
                r"[A-Z]?(?:rror|xception)\b",
                "(?:abcdef|[a-z]{3}cde)",
            ][..],
        )
    }

    proptest! {
        /// The prefilter never turns away a text the regex matches, and the search around what
        /// a match requires finds the earliest end the regex's own search finds, wherever the
        /// search starts (aligned words are counted from there).
        #[test]
        fn the_prefilter_changes_no_answer(pattern in pattern(), hay in text(), from in 0usize..40) {
            let regex = Regex::new(pattern).unwrap();
            let mut cache = regex.create_cache();
            let required = required(pattern).expect("the patterns all require something");
            let hay = hay.as_bytes();
            let from = from.min(hay.len());
            let plain = plain_earliest_end(&regex, &mut cache, hay, from);
            if plain.is_some() {
                prop_assert!(required.may_match(&hay[from..]));
            }
            if required.is_bounded() {
                prop_assert_eq!(required.earliest_end(&regex, &mut cache, hay, from), plain);
            }
        }
    }

    /// Of two literals, a shorter one found inside a longer one starts later but ends sooner:
    /// a match holding it may start before the stretch around the longer one does.
    #[test]
    fn a_match_holding_a_shorter_literal_inside_a_longer_one_is_found() {
        let pattern = "(?:abcdefghij|[a-z]{3}cde)";
        let regex = Regex::new(pattern).unwrap();
        let mut cache = regex.create_cache();
        let required = required(pattern).unwrap();
        assert!(required.is_bounded());
        let hay = b"xyabcdefghij";
        let plain = plain_earliest_end(&regex, &mut cache, hay, 0);
        assert_eq!(plain, Some(7));
        assert_eq!(required.earliest_end(&regex, &mut cache, hay, 0), plain);
    }

    #[test]
    fn dense_places_give_way_to_one_plain_search() {
        // Places every 8 or 9 bytes whose stretches hold no match, then a match far on: the
        // search hands over to a plain one after `DENSE_AFTER` places, and finds the same end.
        for (pattern, filler, tail) in [
            (r"\d{6}[A-Z]", "1234567 ", "id 1234567Q end"),
            (r"[A-Z]\d{2}Error", "a1Error. ", "then Q42Error here"),
        ] {
            let regex = Regex::new(pattern).unwrap();
            let mut cache = regex.create_cache();
            let required = required(pattern).unwrap();
            assert!(required.is_bounded());
            let hay = format!("{}{tail}", filler.repeat(40));
            let plain = plain_earliest_end(&regex, &mut cache, hay.as_bytes(), 3);
            assert!(plain.is_some());
            assert_eq!(
                required.earliest_end(&regex, &mut cache, hay.as_bytes(), 3),
                plain
            );
        }
    }
}
