//! A generated corpus that looks like agent sessions: user asks, assistant prose, tool calls
//! with JSON arguments, tool results with code and logs. Deterministic (SplitMix64), so both
//! stores get byte-identical input in every run.

use lcm::core::message::{NewMessage, Part, Role};
use lcm::core::time::Timestamp;

pub use lcm::core::rng::SplitMix64;

const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "qua", "dri", "fen", "gol", "hux",
    "jet", "bor", "cel", "dun", "ep", "fro", "gri", "ish", "kel", "mor", "nap", "osk", "pil",
];
const COMMON: &[&str] = &[
    "the", "a", "to", "of", "and", "in", "is", "it", "that", "for", "on", "with", "this", "file",
    "test", "error", "function", "run", "check", "fix", "build", "value", "return", "config",
    "server", "request", "timeout", "page", "update", "module",
];

/// A vocabulary of invented words, drawn with a skewed (Zipf-like) distribution.
pub struct Words {
    words: Vec<String>,
}

impl Words {
    pub fn new(n: usize) -> Words {
        let mut rng = SplitMix64::new(99);
        let words = (0..n)
            .map(|_| {
                let k = 2 + rng.below(3) as usize;
                (0..k)
                    .map(|_| SYLLABLES[rng.below(SYLLABLES.len() as u64) as usize])
                    .collect()
            })
            .collect();
        Words { words }
    }

    pub fn pick<'a>(&'a self, rng: &mut SplitMix64) -> &'a str {
        if rng.below(2) == 0 {
            return COMMON[rng.below(COMMON.len() as u64) as usize];
        }
        // Skewed: small ranks much more often.
        let r = rng.below(1 << 20) as f64 / f64::from(1 << 20);
        let rank = ((self.words.len() as f64).powf(r) as usize).saturating_sub(1);
        &self.words[rank.min(self.words.len() - 1)]
    }

    fn sentence(&self, rng: &mut SplitMix64, words: usize) -> String {
        let mut s = String::new();
        for i in 0..words {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(self.pick(rng));
        }
        s.push('.');
        s
    }
}

/// Message `n` of the corpus (a pure function of `n`).
pub fn message(words: &Words, n: u64) -> NewMessage {
    let mut rng = SplitMix64::new(n.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x1234);
    let created_at = Timestamp(1_767_225_600_000 + n as i64 * 1_000);
    let kind = n % 4;
    let (role, parts) = match kind {
        0 => {
            let len = 8 + rng.below(30) as usize;
            (
                Role::User,
                vec![Part::Text {
                    text: words.sentence(&mut rng, len),
                }],
            )
        }
        1 => {
            let len = 10 + rng.below(40) as usize;
            let mut text = words.sentence(&mut rng, len);
            if rng.below(50) == 0 {
                text.push_str(&format!(
                    " See ERR_{} in src/{}.rs:{}.",
                    1000 + rng.below(9000),
                    words.pick(&mut rng),
                    rng.below(900)
                ));
            }
            (Role::Assistant, vec![Part::Text { text }])
        }
        2 => (
            Role::Assistant,
            vec![Part::ToolCall {
                id: format!("toolu_{n:08x}"),
                name: ["Bash", "Read", "Edit", "Grep"][rng.below(4) as usize].to_owned(),
                arguments: format!(
                    "{{\"command\":\"cargo test -p {} -- {}\",\"timeout\":{}}}",
                    words.pick(&mut rng),
                    words.pick(&mut rng),
                    rng.below(120_000)
                ),
            }],
        ),
        _ => {
            let lines = 3 + rng.below(20);
            let mut content = String::new();
            for i in 0..lines {
                content.push_str(&format!(
                    "{:>4} | {} {} = {}({});\n",
                    i,
                    words.pick(&mut rng),
                    words.pick(&mut rng),
                    words.pick(&mut rng),
                    rng.below(100_000)
                ));
            }
            (
                Role::Tool,
                vec![Part::ToolResult {
                    call_id: format!("toolu_{:08x}", n - 1),
                    content,
                    is_error: rng.below(20) == 0,
                }],
            )
        }
    };
    NewMessage {
        role,
        parts,
        created_at,
        original: None,
        source_key: None,
    }
}
