//! Store, index and grep benchmarks, each beside the SQLite + FTS5 baseline that other LCM
//! implementations use, on the same generated corpus in the same run.
//!
//! Corpus size: `LCM_BENCH_MESSAGES` (default 1,000,000); `LCM_BENCH_QUICK=1` uses 100,000.
//! Building the corpus is itself measured (large batched ingest) and printed to stderr.
//! Figures and how to read them: docs/PERFORMANCE.md.

#[path = "support/corpus.rs"]
mod corpus;
#[path = "support/real_data.rs"]
mod real_data;
#[path = "support/scratch.rs"]
mod scratch;
#[path = "support/sqlite.rs"]
mod sqlite;

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group};
use lcm::core::config::Config;
use lcm::core::message::NewMessage;
use lcm::search::{DataDir, GrepMode, GrepRequest, Scope, grep};
use lcm::store::import::{ImportOptions, import_file};
use lcm::{Encoding, SessionId, TokenCounter};

use corpus::Words;
use sqlite::Baseline;

const SESSIONS: u64 = 100;
const BUILD_BATCH: u64 = 10_000;
/// Messages appended after the index's last commit for the unindexed-tail grep.
const TAIL: u64 = 1_000;

struct Fixture {
    /// A [`scratch::kept`] directory: the store, its index and the SQLite baseline.
    scratch: PathBuf,
    dir: PathBuf,
    data: DataDir,
    sqlite: Mutex<Baseline>,
    sessions: Vec<SessionId>,
    words: Words,
    n: u64,
}

fn corpus_size() -> u64 {
    if let Ok(n) = std::env::var("LCM_BENCH_MESSAGES") {
        return n.parse().expect("LCM_BENCH_MESSAGES must be a number");
    }
    if std::env::var("LCM_BENCH_QUICK").is_ok_and(|v| v != "0") {
        100_000
    } else {
        1_000_000
    }
}

/// The corpus every group shares, built on first use.
static FIXTURE: OnceLock<Fixture> = OnceLock::new();

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let n = corpus_size();
        let scratch = scratch::kept();
        let dir = scratch.join("lcm");
        let data = DataDir::open(&dir, &Config::default()).expect("open");
        let mut sqlite = Baseline::open(&scratch.join("baseline.sqlite"));
        let sessions: Vec<SessionId> = (0..SESSIONS)
            .map(|i| {
                data.store
                    .create_session(&format!("bench-{i}"), None)
                    .expect("session")
            })
            .collect();
        let words = Words::new(20_000);

        let (mut lcm_time, mut sqlite_time, mut bytes) = (Duration::ZERO, Duration::ZERO, 0u64);
        let mut start = 0;
        while start < n {
            let end = (start + BUILD_BATCH).min(n);
            let batch: Vec<NewMessage> = (start..end).map(|k| corpus::message(&words, k)).collect();
            bytes += batch
                .iter()
                .map(|m| lcm::core::message::search_text(&m.parts).len() as u64)
                .sum::<u64>();
            let session = sessions[(start / BUILD_BATCH % SESSIONS) as usize];
            let t = Instant::now();
            sqlite.insert(session.0 as i64, start as i64, &batch);
            sqlite_time += t.elapsed();
            let t = Instant::now();
            data.store.append_batch(session, batch).expect("append");
            lcm_time += t.elapsed();
            start = end;
        }
        let t = Instant::now();
        data.index.catch_up(&data.store, |_, _| {}).expect("index");
        let index_time = t.elapsed();
        let rate = |d: Duration| n as f64 / d.as_secs_f64();
        eprintln!(
            "corpus: {n} messages, {:.1} MB of text, {} cores",
            bytes as f64 / 1e6,
            std::thread::available_parallelism().map_or(1, |c| c.get())
        );
        eprintln!(
            "build  lcm append (durable, batches of {BUILD_BATCH}): {:>10.0} msg/s",
            rate(lcm_time)
        );
        eprintln!(
            "build  lcm index catch-up:                     {:>10.0} msg/s",
            rate(index_time)
        );
        eprintln!(
            "build  lcm append + index:                     {:>10.0} msg/s",
            rate(lcm_time + index_time)
        );
        eprintln!(
            "build  sqlite insert + fts5 (same batches):    {:>10.0} msg/s",
            rate(sqlite_time)
        );
        let size = |p: &std::path::Path| -> u64 { walk_size(p) };
        eprintln!(
            "disk   lcm store {:.1} MB + index {:.1} MB; sqlite {:.1} MB (with wal)",
            size(&dir.join("lcm.redb")) as f64 / 1e6,
            size(&dir.join("index")) as f64 / 1e6,
            (size(&scratch.join("baseline.sqlite")) + size(&scratch.join("baseline.sqlite-wal")))
                as f64
                / 1e6
        );
        // SQLite with `synchronous=NORMAL` leaves its writes to the kernel; flushed later, they
        // would compete with the syncs of whatever is measured next (lcm's, not SQLite's).
        sync_tree(&scratch);
        Fixture {
            scratch,
            dir,
            data,
            sqlite: Mutex::new(sqlite),
            sessions,
            words,
            n,
        }
    })
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != ".tantivy-writer.lock" {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Makes every file below `dir` durable, so that no write of a benchmark's setup is still
/// waiting for the disk when the measurements start.
fn sync_tree(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            sync_tree(&path);
        } else if let Ok(file) = std::fs::File::open(&path) {
            // A file removed meanwhile (a merge's leftovers) has nothing to sync.
            file.sync_all().expect("sync");
        }
    }
}

fn walk_size(p: &std::path::Path) -> u64 {
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => m.len(),
        Ok(m) if m.is_dir() => std::fs::read_dir(p)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| walk_size(&e.path())).sum())
            .unwrap_or(0),
        _ => 0,
    }
}

fn ingest(c: &mut Criterion) {
    let f = fixture();
    let mut group = c.benchmark_group("ingest");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    let mut next = f.n + TAIL;
    group.throughput(Throughput::Elements(1_000));
    // Before each case, whatever the one before left for the disk to write (SQLite `NORMAL`
    // leaves all of it) is written, so that no case pays for another's writes.
    sync_tree(&f.scratch);
    group.bench_function("lcm/append_batch_1000", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batch: Vec<NewMessage> = (next..next + 1_000)
                    .map(|k| corpus::message(&f.words, k))
                    .collect();
                next += 1_000;
                let t = Instant::now();
                f.data
                    .store
                    .append_batch(f.sessions[0], batch)
                    .expect("append");
                total += t.elapsed();
            }
            total
        })
    });
    // The baseline as specified (WAL, synchronous=NORMAL) does not fsync at commit, so a power
    // loss can take its last transactions; lcm's appends are durable on return. The same
    // baseline with synchronous=FULL is the durable equivalent, measured for context. Both run
    // on the fixture's database, as lcm appends to the fixture's store: the same workload.
    let mut sqlite = f.sqlite.lock().expect("sqlite");
    let mut sqlite_next = f.n + TAIL;
    for (name, synchronous) in [
        ("sqlite/insert_batch_1000", "NORMAL"),
        ("sqlite_full/insert_batch_1000", "FULL"),
    ] {
        sqlite.set_synchronous(synchronous);
        sync_tree(&f.scratch);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let batch: Vec<NewMessage> = (sqlite_next..sqlite_next + 1_000)
                        .map(|k| corpus::message(&f.words, k))
                        .collect();
                    let t = Instant::now();
                    sqlite.insert(0, sqlite_next as i64, &batch);
                    total += t.elapsed();
                    sqlite_next += 1_000;
                }
                total
            })
        });
    }
    group.throughput(Throughput::Elements(1));
    sync_tree(&f.scratch);
    group.bench_function("lcm/append_single_durable", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let m = corpus::message(&f.words, next);
                next += 1;
                let t = Instant::now();
                f.data.store.append(f.sessions[1], m).expect("append");
                total += t.elapsed();
            }
            total
        })
    });
    for (name, synchronous) in [
        ("sqlite_normal/insert_single", "NORMAL"),
        ("sqlite_full/insert_single", "FULL"),
    ] {
        sqlite.set_synchronous(synchronous);
        sync_tree(&f.scratch);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let m = [corpus::message(&f.words, sqlite_next)];
                    let t = Instant::now();
                    sqlite.insert(1, sqlite_next as i64, &m);
                    total += t.elapsed();
                    sqlite_next += 1;
                }
                total
            })
        });
    }
    sqlite.set_synchronous("NORMAL");
    group.finish();
}

/// The message texts of the four real Claude Code sessions (each part's searchable text, as
/// import counts them), if present.
fn real_message_texts() -> Option<Vec<String>> {
    let files = real_data::transcript_files(false).ok()?;
    let texts: Vec<String> = real_data::transcript_messages(&files)
        .ok()?
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| p.searchable_text().map(|t| t.into_owned()))
        .collect();
    (!texts.is_empty()).then_some(texts)
}

/// Token counting: lcm's counter (`count_text`: exact pre-tokenizer and piece cache in front of
/// tiktoken-rs) beside tiktoken-rs's own `encode_ordinary` on the same input, which it must equal.
/// The piece cache is process-wide, so criterion's repeated iterations run warm; the first pass
/// over each input (cold for cl100k_base, which nothing else in the run uses) goes to stderr.
fn tokens(c: &mut Criterion) {
    let f = fixture();
    let mut text = String::new();
    let mut k = 0;
    while text.len() < 1 << 20 {
        text.push_str(&lcm::core::message::search_text(
            &corpus::message(&f.words, k).parts,
        ));
        text.push('\n');
        k += 1;
    }
    let mut inputs = vec![("1MiB", vec![text])];
    match real_message_texts() {
        Some(texts) => inputs.push(("claude_code_4_sessions", texts)),
        None => eprintln!("SKIPPED token counting on real transcripts: ../shared/data is absent"),
    }
    let mut group = c.benchmark_group("tokens");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    for (name, texts) in &inputs {
        let bytes: usize = texts.iter().map(String::len).sum();
        group.throughput(Throughput::Bytes(bytes as u64));
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let counter = TokenCounter::new(encoding);
            let t = Instant::now();
            let fast: usize = texts.iter().map(|t| counter.count_text(t)).sum();
            let first = t.elapsed();
            let t = Instant::now();
            let exact: usize = texts.iter().map(|t| counter.reference_count(t)).sum();
            let reference = t.elapsed();
            assert_eq!(fast, exact, "{name} {}", encoding.as_str());
            eprintln!(
                "tokens/{name}/{}: {exact} tokens; first pass {:.1} MB/s, tiktoken-rs {:.1} MB/s",
                encoding.as_str(),
                bytes as f64 / first.as_secs_f64() / 1e6,
                bytes as f64 / reference.as_secs_f64() / 1e6,
            );
            group.bench_function(format!("count_{name}/{}", encoding.as_str()), |b| {
                b.iter(|| {
                    std::hint::black_box(texts)
                        .iter()
                        .map(|t| counter.count_text(t))
                        .sum::<usize>()
                })
            });
            group.bench_function(format!("tiktoken_rs_{name}/{}", encoding.as_str()), |b| {
                b.iter(|| {
                    std::hint::black_box(texts)
                        .iter()
                        .map(|t| counter.reference_count(t))
                        .sum::<usize>()
                })
            });
        }
    }
    group.finish();
}

fn import(c: &mut Criterion) {
    let files = match real_data::transcript_files(false) {
        Ok(files) => files,
        Err(why) => {
            eprintln!("SKIPPED import benchmark: {why}");
            return;
        }
    };
    let bytes: u64 = files.iter().map(|p| walk_size(p)).sum();
    let mut group = c.benchmark_group("import");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function("lcm/claude_code_4_sessions", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let tmp = tempfile::tempdir().expect("tmp");
                let data = DataDir::open(tmp.path(), &Config::default()).expect("open");
                let t = Instant::now();
                // As `lcm import` does: each file is indexed while the next one is parsed.
                for file in &files {
                    import_file(&data.store, file, &ImportOptions::default(), |_, _| {})
                        .expect("import");
                    data.index.feed(&data.store).expect("feed");
                }
                data.index.catch_up(&data.store, |_, _| {}).expect("index");
                total += t.elapsed();
            }
            total
        })
    });
    group.bench_function("sqlite/claude_code_4_sessions", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let tmp = tempfile::tempdir().expect("tmp");
                let mut sqlite = Baseline::open(&tmp.path().join("b.sqlite"));
                let t = Instant::now();
                for (conv, file) in files.iter().enumerate() {
                    // The same parser feeds both stores: the difference is storage and indexing.
                    let text = std::fs::read(file).expect("read");
                    let mut messages = Vec::new();
                    for (i, line) in text.split(|b| *b == b'\n').enumerate() {
                        if line.is_empty() {
                            continue;
                        }
                        let ctx = lcm::core::formats::LineContext {
                            line: i as u64 + 1,
                            default_session_key: "x",
                        };
                        if let Ok(lcm::core::formats::LineOutcome::Messages(ms)) =
                            lcm::core::formats::parse_line(
                                lcm::core::formats::Format::ClaudeCode,
                                line,
                                &ctx,
                            )
                        {
                            messages.extend(ms.into_iter().map(|m| m.message));
                        }
                    }
                    sqlite.insert(conv as i64, 0, &messages);
                }
                total += t.elapsed();
            }
            total
        })
    });
    group.finish();
}

fn search(c: &mut Criterion) {
    let f = fixture();
    let config = lcm::core::config::SearchConfig::default();
    let request = |pattern: &str, mode| GrepRequest {
        pattern: pattern.to_owned(),
        mode,
        scope: Scope::default(),
        limit: Some(20),
        cursor: None,
    };
    let cases = [
        ("regex_rare_literal", r"ERR_12\d\d", GrepMode::Regex),
        (
            "regex_no_literal_full_scan",
            r"[A-Z]{3}_\d{5}",
            GrepMode::Regex,
        ),
        // Can match a space or a newline (the bytes that join a message's fields), so a scan
        // cannot judge a pack of records by its bytes as a whole: message by message.
        (
            "regex_no_literal_spaces_full_scan",
            r"[A-Z]{3}\s\d{5}",
            GrepMode::Regex,
        ),
        ("full_text_two_words", "timeout module", GrepMode::FullText),
        // A common word: most messages are candidates, and the first page of hits is among
        // the first few dozen (the baseline's scan stops as early).
        ("regex_common_word", "timeout", GrepMode::Regex),
        // Candidates as dense, hits rare: verifying them one by one would cost more than a
        // scan.
        (
            "regex_common_word_rare_match",
            r"timeout\d{5}",
            GrepMode::Regex,
        ),
        // No literal and frequent matches: both sides scan, and stop at the page's end.
        ("regex_no_literal_frequent", r"\d{6}", GrepMode::Regex),
        // A git hash: no literal, a long run of one class (none in the corpus: a full scan).
        ("regex_hex_run_full_scan", r"[0-9a-f]{40}", GrepMode::Regex),
        // A literal inside the match that the regex engine does not look for itself (its
        // trigrams, case folded, are in a third of the messages; `Error` is in none).
        ("regex_inner_literal", r"[A-Z][a-z]+Error", GrepMode::Regex),
    ];
    // Grep is measured on an index that has caught up with the store (as the runtime keeps it).
    f.data
        .index
        .catch_up(&f.data.store, |_, _| {})
        .expect("index");
    let mut group = c.benchmark_group("grep");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    // One case: its first page printed, then lcm and the baseline measured. Returns the page.
    let bench_case = |group: &mut BenchmarkGroup<'_, WallTime>, name: &str, pattern: &str, mode| {
        let page = grep(
            &f.data.store,
            &f.data.index,
            &config,
            &request(pattern, mode),
        )
        .expect("grep");
        eprintln!(
            "grep {name}: {} hits on the first page ({:?}, {} examined)",
            page.hits.len(),
            page.strategy,
            page.messages_examined
        );
        group.bench_function(format!("lcm/{name}"), |b| {
            b.iter(|| {
                grep(
                    &f.data.store,
                    &f.data.index,
                    &config,
                    &request(pattern, mode),
                )
                .expect("grep")
            })
        });
        let sqlite = f.sqlite.lock().expect("sqlite");
        // The baseline has regex and FTS5; the cases here use no other mode.
        let baseline = match mode {
            GrepMode::Regex => sqlite.regex(pattern, 20),
            _ => sqlite.full_text(pattern, 20),
        };
        eprintln!("grep {name}: sqlite {} hits", baseline.len());
        if let (Some(ours), Some(theirs)) = (page.hits.first(), baseline.first()) {
            eprintln!(
                "grep {name}: first hits: lcm msg_{} (ses_{} #{}) {:?}; sqlite {} (conversation {} #{}) {:?}",
                ours.message.0,
                ours.session.0,
                ours.seq,
                ours.snippet,
                theirs.id,
                theirs.conversation,
                theirs.seq,
                theirs.snippet
            );
        }
        if mode == GrepMode::Regex {
            // Both give the oldest matches first: the same messages (SQLite's ids count from 1,
            // lcm's from 0, over the same corpus), with the same role and time.
            let ours: Vec<(i64, &str, i64)> = page
                .hits
                .iter()
                .map(|h| (h.message.0 as i64 + 1, h.role.as_str(), h.created_at.0))
                .collect();
            let theirs: Vec<(i64, &str, i64)> = baseline
                .iter()
                .map(|h| (h.id, h.role.as_str(), h.created_at))
                .collect();
            assert_eq!(ours, theirs, "{name}: lcm and the baseline disagree");
        }
        group.bench_function(format!("sqlite/{name}"), |b| {
            b.iter(|| match mode {
                GrepMode::Regex => sqlite.regex(pattern, 20),
                _ => sqlite.full_text(pattern, 20),
            })
        });
        page
    };
    for (name, pattern, mode) in cases {
        bench_case(&mut group, name, pattern, mode);
    }
    // A live store: the messages appended since the index's last commit are scanned by every
    // grep (a daemon's usual state between catch-ups). 1,000 of them, added to SQLite too, and
    // a literal that no message holds, so both sides look at everything.
    let tail: Vec<NewMessage> = (f.n..f.n + TAIL)
        .map(|k| corpus::message(&f.words, k))
        .collect();
    f.sqlite
        .lock()
        .expect("sqlite")
        .insert(f.sessions[0].0 as i64, f.n as i64, &tail);
    f.data
        .store
        .append_batch(f.sessions[0], tail)
        .expect("append");
    let name = format!("regex_no_hit_unindexed_tail_{TAIL}");
    let page = bench_case(&mut group, &name, r"ERR_99999", GrepMode::Regex);
    assert!(page.hits.is_empty());
    // What follows measures a store whose index has caught up.
    f.data
        .index
        .catch_up(&f.data.store, |_, _| {})
        .expect("index");
    group.finish();
}

fn open(c: &mut Criterion) {
    let f = fixture();
    let mut group = c.benchmark_group("open");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    // redb allows one open handle per file in a process: open a copy of the data directory,
    // taken once the index's background merges have finished (they delete files).
    f.data.index.finish_merges().expect("merges");
    let copy = f.dir.with_extension("copy");
    copy_dir(&f.dir, &copy);
    sync_tree(&copy);
    // What `lcm grep` does (a read-only open writes nothing), and what a daemon does once at
    // start (a writable redb open commits on open and on close: four to six fsyncs).
    for (name, read_only) in [
        ("lcm/open_read_only_then_grep", true),
        ("lcm/open_writable_then_grep", false),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                let config = Config::default();
                let data = if read_only {
                    DataDir::open_read_only(&copy, &config)
                } else {
                    DataDir::open(&copy, &config)
                }
                .expect("open");
                let page = grep(
                    &data.store,
                    &data.index,
                    &config.search,
                    &GrepRequest {
                        pattern: "ERR_12".into(),
                        mode: GrepMode::Regex,
                        scope: Scope::default(),
                        limit: Some(1),
                        cursor: None,
                    },
                )
                .expect("grep");
                std::hint::black_box(page);
            })
        });
    }
    let sqlite_path = f.dir.parent().expect("parent").join("baseline.sqlite");
    group.bench_function("sqlite/open_then_query", |b| {
        b.iter(|| {
            let baseline = Baseline::open(&sqlite_path);
            std::hint::black_box(baseline.count());
        })
    });
    group.finish();
}

// Grep and open run before ingest: the ingest benchmarks append to the fixture for a fixed time,
// and lcm appends several times more messages than SQLite in that time, which would leave the
// two searching corpora of different sizes.
criterion_group!(benches, tokens, import, search, open, ingest);

// `criterion_main!`, with the fixture's directory removed at the end.
fn main() {
    let _cleanup = scratch::RemoveKeptOnExit;
    benches();
    Criterion::default().configure_from_args().final_summary();
}
