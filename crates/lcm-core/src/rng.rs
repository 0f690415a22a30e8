//! A small deterministic generator (SplitMix64): the one random source of lcm's task
//! generators (lcm-eval), fault injection, test data and benchmark corpora. The same seed gives
//! the same numbers on every machine and in every version of lcm, which general-purpose
//! generators do not promise across their releases.

/// SplitMix64 (Steele, Lea and Flood), seeded with any `u64`.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0; 0 for `n` = 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for test data, and never a division by zero.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// A number in `range` (inclusive of its start, exclusive of its end).
    pub fn in_range(&mut self, range: std::ops::Range<u64>) -> u64 {
        range.start + self.below(range.end.saturating_sub(range.start))
    }

    /// An index into a slice of `len` items.
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// True or false, evenly.
    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// A number in `(0, 1]` (never 0: a logarithm of it is finite), from the top 53 bits.
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.index(i + 1));
        }
    }
}

/// The vocabulary of [`work_words`]: an engineering conversation's.
const WORK_WORDS: [&str; 16] = [
    "deploy",
    "ticket",
    "staging",
    "migration",
    "rollback",
    "latency",
    "cache",
    "index",
    "schema",
    "retry",
    "budget",
    "summary",
    "session",
    "worker",
    "lease",
    "commit",
];

/// `words` words of an engineering conversation's vocabulary in an order `seed` picks: the text
/// of load generators, soaks and tests that need messages of a plausible size (about one token
/// a word) that differ from seed to seed.
pub fn work_words(seed: u64, words: usize) -> String {
    let mut rng = SplitMix64::new(seed);
    let mut text = String::with_capacity(words * 8);
    for k in 0..words {
        if k > 0 {
            text.push(' ');
        }
        text.push_str(WORK_WORDS[rng.index(WORK_WORDS.len())]);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_numbers_and_others_differ() {
        let take = |seed| {
            let mut r = SplitMix64::new(seed);
            (0..8).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(take(7), take(7));
        assert_ne!(take(7), take(8));
        // The published first output of SplitMix64 seeded with 0.
        assert_eq!(take(0)[0], 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_stays_in_range_and_reaches_both_ends() {
        let mut r = SplitMix64::new(1);
        let seen: std::collections::BTreeSet<u64> = (0..1000).map(|_| r.below(5)).collect();
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 4]);
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn uniform_is_in_the_half_open_unit_interval() {
        let mut r = SplitMix64::new(3);
        let xs: Vec<f64> = (0..10_000).map(|_| r.uniform()).collect();
        assert!(xs.iter().all(|&x| x > 0.0 && x <= 1.0));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        let heads = (0..10_000).filter(|_| r.coin()).count();
        assert!((4_700..5_300).contains(&heads), "{heads}");
    }

    #[test]
    fn work_words_are_as_many_as_asked_and_differ_by_seed() {
        let text = work_words(3, 24);
        assert_eq!(text.split(' ').count(), 24);
        assert!(text.split(' ').all(|w| WORK_WORDS.contains(&w)));
        assert_eq!(text, work_words(3, 24));
        assert_ne!(text, work_words(4, 24));
        assert_eq!(work_words(3, 0), "");
    }
}
