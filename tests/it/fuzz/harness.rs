//! A small mutation fuzzer on stable Rust: no nightly, no sanitizer runtime, no dependency
//! beyond `serde_json` (for the JSON-aware mutations).
//!
//! Each target is a function from bytes to an [`Outcome`] that calls a real parser. The runner
//! executes the target's seeds, then mutated inputs (byte flips, inserts, deletes, truncation,
//! splices of two inputs, dictionary tokens, JSON-aware rewrites: values of other types, huge
//! numbers, deep nesting, invalid UTF-8), keeping in its corpus every input whose outcome is
//! one it had not seen (outcome-guided rather than coverage-guided). It fails on:
//! - a panic, caught with `catch_unwind` on the worker thread, or seen by the panic hook on a
//!   thread the target owns (a tokio task or actor whose panic is turned into an error);
//! - a hang: one execution running longer than the time limit (a watchdog checks);
//! - a property violation the target reports ([`Outcome::Violation`]).
//!
//! Every failing input is written to the failure directory and printed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use lcm::core::rng::SplitMix64;
use serde_json::Value;

/// What one execution of a target gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The input was accepted; the label says how (e.g. `messages:2`).
    Ok(String),
    /// The input was refused with a clean error; the label is the error's kind or text.
    Err(String),
    /// The parser broke a property it promises (e.g. a round trip); the text says how.
    Violation(String),
}

impl Outcome {
    /// A clean error labelled by `text` (normalised, see [`label`]).
    pub fn err(text: impl AsRef<str>) -> Outcome {
        Outcome::Err(label(text.as_ref()))
    }

    /// An accepted input labelled by `text` (normalised, see [`label`]).
    pub fn ok(text: impl AsRef<str>) -> Outcome {
        Outcome::Ok(label(text.as_ref()))
    }

    fn signature(&self) -> String {
        match self {
            Outcome::Ok(label) => format!("ok {label}"),
            Outcome::Err(label) => format!("err {label}"),
            Outcome::Violation(_) => "violation".to_owned(),
        }
    }
}

/// A label from a message: digits and quoted or back-quoted text (which echo the input) are
/// folded away and the length is capped, so that labels name kinds of outcome, not inputs.
pub fn label(text: &str) -> String {
    let mut out = String::new();
    let mut quote: Option<char> = None;
    let mut last_digit = false;
    for c in text.chars() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
                out.push(q);
            }
            continue;
        }
        if c == '`' || c == '"' {
            quote = Some(c);
            out.push(c);
            out.push('…');
            continue;
        }
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('#');
            }
            last_digit = true;
            continue;
        }
        last_digit = false;
        out.push(c);
        if out.len() >= 72 {
            break;
        }
    }
    out
}

/// Most distinct outcome labels a run tells apart.
const MAX_LABELS: usize = 20_000;

/// [`label`] of `message` with the input's text (which error messages quote) taken out first.
pub fn label_without(message: &str, input: &str) -> String {
    if input.trim().is_empty() {
        label(message)
    } else {
        label(&message.replace(input.trim(), "…"))
    }
}

/// A target's function: one call per input.
pub type TargetFn = Box<dyn FnMut(&[u8]) -> Outcome>;

/// A fuzz target: a parser of outside bytes, its seeds and how many executions it gets.
pub struct Target {
    /// Short name (`claude_code_line`).
    pub name: &'static str,
    /// What it calls.
    pub about: &'static str,
    /// The inputs the corpus starts from.
    pub seeds: Vec<Vec<u8>>,
    /// Builds the function on the worker thread (targets with a store or a runtime open it
    /// there).
    pub make: Box<dyn Fn() -> TargetFn + Send + Sync>,
    /// Relative share of a long run's executions.
    pub weight: u64,
    /// Executions of the short run in the normal test suite.
    pub short: u64,
    /// Longest input a mutation may produce.
    pub max_len: usize,
}

/// How to run a target.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Executions, seeds included.
    pub executions: u64,
    /// Seed of the random generator (runs are reproducible per seed).
    pub seed: u64,
    /// Longest one execution may take before it counts as a hang.
    pub time_limit: Duration,
    /// Where failing inputs are written.
    pub failure_dir: PathBuf,
    /// Most inputs kept in the corpus.
    pub max_corpus: usize,
    /// Stop after this many failures (a broken parser fails on most inputs).
    pub max_failures: usize,
}

/// One failing input.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `panic`, `hang` or `violation`.
    pub kind: &'static str,
    /// The panic's message, the time taken or the property broken.
    pub message: String,
    /// Where the input was written.
    pub file: Option<PathBuf>,
    /// The input, lossily as text (at most 2 KiB of it).
    pub preview: String,
}

/// What a run of one target did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub name: String,
    pub executions: u64,
    pub seeds: usize,
    pub corpus: usize,
    /// Executions per outcome kind (`ok`, `err`), and distinct outcome labels.
    pub ok: u64,
    pub err: u64,
    pub distinct_outcomes: usize,
    /// The most frequent outcome labels with their counts.
    pub top_outcomes: Vec<(String, u64)>,
    pub panics: u64,
    pub hangs: u64,
    pub violations: u64,
    pub failures: Vec<Failure>,
    pub elapsed: Duration,
    /// The slowest execution.
    pub slowest: Duration,
}

impl Report {
    /// No panic, no hang, no violation.
    pub fn clean(&self) -> bool {
        self.panics == 0 && self.hangs == 0 && self.violations == 0
    }

    /// The report as JSON (for the campaign's summary file).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "target": self.name,
            "executions": self.executions,
            "seeds": self.seeds,
            "corpus": self.corpus,
            "ok": self.ok,
            "err": self.err,
            "distinct_outcomes": self.distinct_outcomes,
            "top_outcomes": self.top_outcomes.iter().map(|(l, n)| serde_json::json!([l, n])).collect::<Vec<_>>(),
            "panics": self.panics,
            "hangs": self.hangs,
            "violations": self.violations,
            "failures": self.failures.iter().map(|f| serde_json::json!({
                "kind": f.kind, "message": f.message,
                "file": f.file.as_ref().map(|p| p.display().to_string()),
                "preview": f.preview,
            })).collect::<Vec<_>>(),
            "seconds": self.elapsed.as_secs_f64(),
            "slowest_ms": self.slowest.as_secs_f64() * 1000.0,
        })
    }
}

// ----------------------------------------------------------------------------- randomness

/// The mutations' random source (SplitMix64, lcm's one deterministic generator).
#[derive(Debug, Clone)]
pub struct Rng(SplitMix64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed ^ 0x9e37_79b9_7f4a_7c15))
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.index(n)
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// A stable hash of bytes (FNV-1a), for choices a target derives from its input.
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

// ----------------------------------------------------------------------------- mutations

/// Tokens worth inserting anywhere: JSON syntax, escapes, edge numbers, odd text.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b"\\",
    b":",
    b",",
    b"\n",
    b"\r\n",
    b"\t",
    b" ",
    b"\0",
    b"null",
    b"true",
    b"false",
    b"0",
    b"-0",
    b"-1",
    b"1e999",
    b"-1e999",
    b"1.5e-400",
    b"18446744073709551615",
    b"18446744073709551616",
    b"9223372036854775807",
    b"-9223372036854775808",
    b"-9223372036854775809",
    b"253402300800000",
    b"8210266876799999",
    b"\"\"",
    b"{}",
    b"[]",
    b"\\u0000",
    b"\\ud800",
    b"\\udc00x",
    b"\\uD83D\\uDE00",
    b"\\\"",
    "é".as_bytes(),
    "漢".as_bytes(),
    "🎉".as_bytes(),
    "\u{feff}".as_bytes(),
    "\u{2028}".as_bytes(),
    b"\xff",
    b"\xc3",
    b"\xe6\xbc",
    b"\xf0\x9f\x8e",
    b"\xed\xa0\x80",
    b"%",
    b"/",
    b"..",
    b"data:",
    b"data:image/png;base64,",
    b"2026-02-10T21:11:56.846Z",
    b"2026-02-10",
    b"+10000-01-01T00:00:00Z",
    b"msg_",
    b"ses_",
    b"sum_",
    b"file_",
    b"job_",
    b"\n\n",
    b"data: ",
    b"event: ",
    b": comment\n",
    b"[DONE]",
    b"=",
    b"'",
    b"'''",
    b"\"\"\"",
    b"#",
    b"[[",
    b"]]",
    b"nan",
    b"inf",
    b"-inf",
];

/// Values a JSON mutation puts in place of another.
fn odd_value(rng: &mut Rng, dict: &[Vec<u8>]) -> Value {
    match rng.below(20) {
        0 => Value::Null,
        1 => Value::Bool(rng.one_in(2)),
        2 => Value::from(0),
        3 => Value::from(-1),
        4 => Value::from(u64::MAX),
        5 => Value::from(i64::MIN),
        6 => serde_json::Number::from_f64(1e308).map_or(Value::Null, Value::Number),
        7 => Value::from(rng.next() as i64),
        8 => Value::from(""),
        9 => Value::from("x".repeat(rng.below(20_000))),
        10 => Value::from("\u{0}\u{1b}[1m\"\\é漢🎉\u{feff}"),
        11 => Value::Array(Vec::new()),
        12 => Value::Object(serde_json::Map::new()),
        13 => {
            let mut v = Value::from(1);
            for _ in 0..rng.below(140) {
                v = if rng.one_in(2) {
                    Value::Array(vec![v])
                } else {
                    let mut m = serde_json::Map::new();
                    m.insert("a".into(), v);
                    Value::Object(m)
                };
            }
            v
        }
        14 => Value::from(253_402_300_800_000_i64 + rng.below(1 << 40) as i64),
        15 => Value::from("2026-02-10T21:11:56.846Z"),
        _ => {
            let word = dict.get(rng.below(dict.len())).cloned().unwrap_or_default();
            let text = String::from_utf8_lossy(&word).into_owned();
            serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
        }
    }
}

/// Dictionary words found in the seeds: object keys and short string values, as JSON strings.
pub fn dictionary(seeds: &[Vec<u8>]) -> Vec<Vec<u8>> {
    fn walk(value: &Value, out: &mut HashSet<String>) {
        if out.len() >= 4000 {
            return;
        }
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    out.insert(Value::from(k.as_str()).to_string());
                    walk(v, out);
                }
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            Value::String(s) if s.len() <= 40 => {
                out.insert(Value::from(s.as_str()).to_string());
            }
            _ => {}
        }
    }
    let mut words = HashSet::new();
    for seed in seeds {
        for line in seed.split(|&b| b == b'\n') {
            if let Ok(value) = serde_json::from_slice::<Value>(line) {
                walk(&value, &mut words);
            }
        }
    }
    let mut words: Vec<Vec<u8>> = words.into_iter().map(String::into_bytes).collect();
    words.sort();
    words
}

/// Every node of a JSON value, as paths of indices.
fn paths(value: &Value, path: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    if out.len() >= 4096 {
        return;
    }
    out.push(path.clone());
    let children: Vec<&Value> = match value {
        Value::Object(map) => map.values().collect(),
        Value::Array(items) => items.iter().collect(),
        _ => return,
    };
    for (i, child) in children.into_iter().enumerate() {
        path.push(i);
        paths(child, path, out);
        path.pop();
    }
}

fn node_mut<'a>(value: &'a mut Value, path: &[usize]) -> Option<&'a mut Value> {
    let mut node = value;
    for &i in path {
        node = match node {
            Value::Object(map) => map.values_mut().nth(i)?,
            Value::Array(items) => items.get_mut(i)?,
            _ => return None,
        };
    }
    Some(node)
}

/// A JSON-aware mutation of `input` (one JSON document or JSON lines); `None` when it is not
/// JSON.
fn mutate_json(rng: &mut Rng, input: &[u8], dict: &[Vec<u8>]) -> Option<Vec<u8>> {
    // JSON lines: mutate one line.
    let lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    let (line_index, text) = if lines.len() > 1 {
        let i = rng.below(lines.len());
        (Some(i), lines[i])
    } else {
        (None, input)
    };
    let mut value: Value = serde_json::from_slice(text).ok()?;
    let mut all = Vec::new();
    paths(&value, &mut Vec::new(), &mut all);
    let path = all.get(rng.below(all.len()))?.clone();
    let other = all.get(rng.below(all.len())).cloned();
    let donor = other.and_then(|p| node_mut(&mut value, &p).map(|v| v.clone()));
    let node = node_mut(&mut value, &path)?;
    match rng.below(8) {
        0 | 1 => *node = odd_value(rng, dict),
        2 => {
            if let Some(donor) = donor {
                *node = donor;
            }
        }
        3 => match node {
            Value::Object(map) if !map.is_empty() => {
                let key = map
                    .keys()
                    .nth(rng.below(map.len()))
                    .cloned()
                    .unwrap_or_default();
                map.remove(&key);
            }
            Value::Array(items) if !items.is_empty() => {
                items.remove(rng.below(items.len()));
            }
            other => *other = odd_value(rng, dict),
        },
        4 => match node {
            Value::Object(map) => {
                let key = dict.get(rng.below(dict.len())).map_or_else(
                    || "x".to_owned(),
                    |w| {
                        serde_json::from_slice::<String>(w)
                            .unwrap_or_else(|_| String::from_utf8_lossy(w).into_owned())
                    },
                );
                map.insert(key, odd_value(rng, dict));
            }
            Value::Array(items) => {
                let copy = items
                    .get(rng.below(items.len()))
                    .cloned()
                    .unwrap_or(Value::Null);
                let most = if rng.one_in(8) { 300 } else { 3 };
                for _ in 0..=rng.below(most) {
                    items.push(copy.clone());
                }
            }
            other => *other = odd_value(rng, dict),
        },
        5 => {
            let inner = std::mem::take(node);
            *node = if rng.one_in(2) {
                Value::Array(vec![inner])
            } else {
                Value::String(inner.to_string())
            };
        }
        6 => {
            if let Value::String(s) = node {
                let mut bytes = std::mem::take(s).into_bytes();
                let at = rng.below(bytes.len() + 1);
                let token = TOKENS[rng.below(TOKENS.len())];
                bytes.splice(at..at, token.iter().copied());
                *s = String::from_utf8_lossy(&bytes).into_owned();
            } else {
                *node = odd_value(rng, dict);
            }
        }
        _ => {
            if let Some(donor) = dict.get(rng.below(dict.len()))
                && let Ok(text) = serde_json::from_slice::<Value>(donor)
            {
                *node = text;
            }
        }
    }
    let mut out = serde_json::to_vec(&value).ok()?;
    if let Some(i) = line_index {
        let mut joined = Vec::with_capacity(input.len() + out.len());
        for (j, line) in lines.iter().enumerate() {
            if j > 0 {
                joined.push(b'\n');
            }
            if j == i {
                joined.append(&mut out);
            } else {
                joined.extend_from_slice(line);
            }
        }
        out = joined;
    }
    Some(out)
}

/// Mutates `input` in place: one to four stacked mutations, `other` for splices.
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8], dict: &[Vec<u8>], max_len: usize) {
    for _ in 0..=rng.below(4) {
        let len = input.len();
        match rng.below(14) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                input.drain(at..at + n);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(256));
                let chunk = input[at..at + n].to_vec();
                let to = rng.below(len + 1);
                input.splice(to..to, chunk);
            }
            5 if len > 0 => input.truncate(rng.below(len)),
            6 | 7 => {
                let at = rng.below(len + 1);
                let token = TOKENS[rng.below(TOKENS.len())];
                input.splice(at..at, token.iter().copied());
            }
            8 if !dict.is_empty() => {
                let at = rng.below(len + 1);
                let word = &dict[rng.below(dict.len())];
                input.splice(at..at, word.iter().copied());
            }
            9 if !other.is_empty() => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            10..=12 => {
                if let Some(out) = mutate_json(rng, input, dict) {
                    *input = out;
                }
            }
            _ => {
                // Replace a run of digits with an edge number.
                let from = rng.below(len.max(1));
                if let Some(start) = (from..len).find(|&i| input[i].is_ascii_digit()) {
                    let end = (start..len)
                        .find(|&i| !input[i].is_ascii_digit())
                        .unwrap_or(len);
                    let numbers: [&[u8]; 6] = [
                        b"0",
                        b"18446744073709551616",
                        b"9223372036854775807",
                        b"99999999999999999999999",
                        b"253402300800000",
                        b"-1",
                    ];
                    input.splice(start..end, numbers[rng.below(6)].iter().copied());
                }
            }
        }
    }
    input.truncate(max_len);
}

// ----------------------------------------------------------------------------- panics

static HOOK: Once = Once::new();

/// Panics seen by the hook on threads named `lcm-fuzz:<target>`, per target.
static THREAD_PANICS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// The thread name prefix of a target's threads (its worker, and the tokio threads it builds):
/// a panic on one of them counts against the target even if something catches it.
pub fn thread_name(target: &str) -> String {
    format!("lcm-fuzz:{target}")
}

fn install_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some(target) = std::thread::current()
                .name()
                .and_then(|n| n.strip_prefix("lcm-fuzz:"))
                && let Ok(mut counts) = THREAD_PANICS.lock()
            {
                *counts.entry(target.to_owned()).or_default() += 1;
            }
            previous(info);
        }));
    });
}

fn thread_panics(target: &str) -> u64 {
    THREAD_PANICS
        .lock()
        .map(|counts| counts.get(target).copied().unwrap_or(0))
        .unwrap_or(0)
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

// ----------------------------------------------------------------------------- running

/// What the watchdog sees of the worker.
struct Slot {
    /// Milliseconds since the run started at which the current execution started, plus one;
    /// zero between executions.
    started: AtomicU64,
    input: Mutex<Vec<u8>>,
    executions: AtomicU64,
    stop: AtomicBool,
}

fn save(dir: &Path, target: &str, kind: &str, input: &[u8]) -> Option<PathBuf> {
    std::fs::create_dir_all(dir).ok()?;
    let path = dir.join(format!("{target}-{kind}-{:016x}.bin", hash(input)));
    std::fs::write(&path, input).ok()?;
    Some(path)
}

fn failure(dir: &Path, target: &str, kind: &'static str, message: String, input: &[u8]) -> Failure {
    let file = save(dir, target, kind, input);
    let preview: String = String::from_utf8_lossy(&input[..input.len().min(2048)]).into_owned();
    eprintln!(
        "FUZZ FAILURE [{target}] {kind}: {message}\n  input ({} bytes){}: {preview:?}",
        input.len(),
        file.as_ref()
            .map(|p| format!(", saved to {}", p.display()))
            .unwrap_or_default()
    );
    Failure {
        kind,
        message,
        file,
        preview,
    }
}

/// The worker: seeds, then mutations, until `executions` or a stop.
fn work(target: &Target, options: &RunOptions, slot: &Slot, epoch: Instant) -> Report {
    let mut run = (target.make)();
    let mut rng = Rng::new(options.seed ^ hash(target.name.as_bytes()));
    let dict = dictionary(&target.seeds);
    let mut corpus: Vec<Vec<u8>> = target.seeds.clone();
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut report = Report {
        name: target.name.to_owned(),
        seeds: target.seeds.len(),
        ..Report::default()
    };
    let started = Instant::now();
    let mut input = Vec::new();
    let mut n = 0u64;
    while n < options.executions && !slot.stop.load(Ordering::Relaxed) {
        input.clear();
        let from_seed = (n as usize) < target.seeds.len();
        if from_seed {
            input.extend_from_slice(&target.seeds[n as usize]);
        } else {
            input.extend_from_slice(&corpus[rng.below(corpus.len())]);
            let other = &corpus[rng.below(corpus.len())];
            mutate(&mut rng, &mut input, other, &dict, target.max_len);
        }
        if let Ok(mut shared) = slot.input.lock() {
            shared.clear();
            shared.extend_from_slice(&input);
        }
        let before = thread_panics(target.name);
        let t0 = Instant::now();
        slot.started
            .store(epoch.elapsed().as_millis() as u64 + 1, Ordering::Release);
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&input)));
        slot.started.store(0, Ordering::Release);
        report.slowest = report.slowest.max(t0.elapsed());
        n += 1;
        slot.executions.store(n, Ordering::Relaxed);
        let dir = &options.failure_dir;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(payload) => {
                report.panics += 1;
                let message = panic_message(payload.as_ref());
                report
                    .failures
                    .push(failure(dir, target.name, "panic", message, &input));
                // The target's state may be broken: build it again.
                run = (target.make)();
                if report.failures.len() >= options.max_failures {
                    break;
                }
                continue;
            }
        };
        if thread_panics(target.name) > before {
            report.panics += 1;
            report.failures.push(failure(
                dir,
                target.name,
                "panic",
                "a thread of the target panicked (the panic was caught and turned into an error)"
                    .into(),
                &input,
            ));
        }
        if let Outcome::Violation(message) = &outcome {
            report.violations += 1;
            report.failures.push(failure(
                dir,
                target.name,
                "violation",
                message.clone(),
                &input,
            ));
        }
        if report.failures.len() >= options.max_failures {
            break;
        }
        match &outcome {
            Outcome::Ok(_) => report.ok += 1,
            Outcome::Err(_) => report.err += 1,
            Outcome::Violation(_) => {}
        }
        let signature = outcome.signature();
        let new = if let Some(count) = seen.get_mut(&signature) {
            *count += 1;
            false
        } else if seen.len() >= MAX_LABELS {
            // Past this many labels, new ones are counted together (they echo inputs).
            *seen.entry("(more labels)".to_owned()).or_insert(0) += 1;
            false
        } else {
            seen.insert(signature, 1);
            true
        };
        if new && !from_seed && !input.is_empty() {
            if corpus.len() < options.max_corpus {
                corpus.push(input.clone());
            } else if corpus.len() > target.seeds.len() {
                // The seeds stay: replace an input found by mutation.
                let i = target.seeds.len() + rng.below(corpus.len() - target.seeds.len());
                corpus[i] = input.clone();
            }
        }
    }
    report.executions = n;
    report.corpus = corpus.len();
    report.distinct_outcomes = seen.len();
    let mut top: Vec<(String, u64)> = seen.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(12);
    report.top_outcomes = top;
    report.elapsed = started.elapsed();
    report
}

/// Runs `target` on a worker thread of its own while this thread watches for hangs. A hang
/// ends the run at once (the stuck worker is left behind) with the input saved.
pub fn run(target: Arc<Target>, options: &RunOptions) -> Report {
    install_hook();
    let slot = Arc::new(Slot {
        started: AtomicU64::new(0),
        input: Mutex::new(Vec::new()),
        executions: AtomicU64::new(0),
        stop: AtomicBool::new(false),
    });
    let epoch = Instant::now();
    let worker = {
        let (target, options, slot) = (Arc::clone(&target), options.clone(), Arc::clone(&slot));
        std::thread::Builder::new()
            .name(thread_name(target.name))
            .stack_size(16 << 20)
            .spawn(move || work(&target, &options, &slot, epoch))
    };
    let worker = match worker {
        Ok(worker) => worker,
        Err(e) => {
            return Report {
                name: target.name.to_owned(),
                failures: vec![Failure {
                    kind: "panic",
                    message: format!("cannot start the worker thread: {e}"),
                    file: None,
                    preview: String::new(),
                }],
                panics: 1,
                ..Report::default()
            };
        }
    };
    loop {
        std::thread::sleep(Duration::from_millis(20));
        if worker.is_finished() {
            return worker.join().unwrap_or_else(|payload| Report {
                name: target.name.to_owned(),
                panics: 1,
                failures: vec![Failure {
                    kind: "panic",
                    message: format!(
                        "the worker itself panicked: {}",
                        panic_message(payload.as_ref())
                    ),
                    file: None,
                    preview: String::new(),
                }],
                ..Report::default()
            });
        }
        let started = slot.started.load(Ordering::Acquire);
        if started == 0 {
            continue;
        }
        let running =
            Duration::from_millis((epoch.elapsed().as_millis() as u64 + 1).saturating_sub(started));
        if running > options.time_limit {
            slot.stop.store(true, Ordering::Relaxed);
            let input = slot.input.lock().map(|i| i.clone()).unwrap_or_default();
            let hang = failure(
                &options.failure_dir,
                target.name,
                "hang",
                format!(
                    "one execution ran for more than {:?} (the worker is left behind)",
                    options.time_limit
                ),
                &input,
            );
            return Report {
                name: target.name.to_owned(),
                executions: slot.executions.load(Ordering::Relaxed),
                seeds: target.seeds.len(),
                hangs: 1,
                failures: vec![hang],
                elapsed: epoch.elapsed(),
                ..Report::default()
            };
        }
    }
}
