//! Search by meaning (issue 25): the vector index alone, and semantic / hybrid grep end to end.
//!
//! **The vector index** (`vectors/*`): synthetic 384-dimension unit vectors with cluster
//! structure (1,000 random centres, each point its centre plus gaussian noise of the same norm,
//! so points of one cluster have a cosine of about 0.5 and of two clusters about 0); queries
//! are new points of the same kind. Printed to stderr: build rate, disk and memory per
//! million entries, recall@10 of the two-pass search and of the exact int8 scan against exact
//! f32 brute force (what quantisation and the first pass lose), p50/p99 of a loop of queries
//! per oversample factor. Criterion measures the default search and the exact scan.
//!
//! **Grep by meaning** (`meaning/*`): the generated agent corpus of `benches/store.rs` in a real
//! data directory (store, tantivy index), its vector index filled with synthetic vectors under
//! the real model's id (embedding a million messages with the model would take hours on two
//! cores; search cost does not depend on what the vectors mean), and queries of corpus words
//! through `grep`: each semantic or hybrid query embeds its text with the real model
//! (all-MiniLM-L6-v2, `../shared/tools/embed-model/setup.sh`, or the model of
//! `LCM_EMBED_MODEL_DIR`, the synthetic vectors then as wide as its), searches and renders a
//! page of 10 hits; hybrid's lift by neighbouring turns is also timed alone. Without the model this
//! part says so and measures nothing.
//!
//! **Real embeddings** (`real`): what the lists keep on vectors of real text rather than
//! clusters: about 26,000 texts of `../shared/data` (transcript lines, TREC questions, LoCoMo
//! turns) embedded by the model (kept in `LCM_BENCH_DIR` between runs), lists trained on all of
//! them, and the LoCoMo and TREC test questions as queries; recall@10 of the exact f32 top ten
//! by how many lists the first pass reads. Without the model or the data it says so.
//!
//! Sizes: `LCM_BENCH_VECTORS` (comma-separated, default `100000,1000000`); `LCM_BENCH_QUICK=1`
//! uses 100,000 only. `LCM_BENCH_GROUPS=vectors`, `=real` or `=meaning` runs one part.
//! Figures and how to read them: docs/PERFORMANCE.md, "Search by meaning at scale".

#[path = "support/corpus.rs"]
mod corpus;
#[path = "support/groups.rs"]
mod groups;
#[path = "support/real_data.rs"]
mod real_data;
#[path = "support/scratch.rs"]
mod scratch;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use groups::wanted;
use lcm::core::config::Config;
use lcm::core::message::search_text;
use lcm::core::rng::SplitMix64;
use lcm::search::semantic::VECTORS_DIR;
use lcm::search::vectors::{
    OVERSAMPLE, Opened, VectorEntry, VectorFilter, VectorIndex, oversample_for,
};
use lcm::search::{DataDir, Fused, GrepMode, GrepRequest, Scope, grep, lifted_by_neighbours};
use lcm::{MessageId, SessionId};

const DIM: usize = 384;
const CENTRES: usize = 1_000;
const SESSIONS: u64 = 100;
const QUERIES: usize = 200;
const K: usize = 10;
const COMMIT_EVERY: usize = 100_000;
const MODEL: &str = "synthetic-384";
const OVERSAMPLES: [usize; 6] = [4, 8, 16, 32, 64, 128];
/// Messages appended per batch while the corpus is built.
const BUILD_BATCH: u64 = 10_000;

fn sizes() -> Vec<usize> {
    if let Ok(s) = std::env::var("LCM_BENCH_VECTORS") {
        return s
            .split(',')
            .map(|n| n.trim().parse().expect("LCM_BENCH_VECTORS: numbers"))
            .collect();
    }
    if std::env::var("LCM_BENCH_QUICK").is_ok_and(|v| v != "0") {
        vec![100_000]
    } else {
        vec![100_000, 1_000_000]
    }
}

/// A gaussian sample (Box-Muller).
fn gaussian(rng: &mut SplitMix64) -> f32 {
    let (u, v) = (rng.uniform(), rng.uniform());
    ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
}

fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

/// Clustered unit vectors of `dim` components (see the module doc).
struct Points {
    centres: Vec<Vec<f32>>,
    dim: usize,
}

impl Points {
    fn new(dim: usize) -> Points {
        let mut rng = SplitMix64::new(25);
        Points {
            centres: (0..CENTRES)
                .map(|_| unit((0..dim).map(|_| gaussian(&mut rng)).collect()))
                .collect(),
            dim,
        }
    }

    fn point(&self, rng: &mut SplitMix64) -> Vec<f32> {
        let noise = 1.0 / (self.dim as f32).sqrt();
        let c = &self.centres[(rng.next_u64() % CENTRES as u64) as usize];
        unit(c.iter().map(|x| x + noise * gaussian(rng)).collect())
    }

    /// `n` points, flat (`n × dim`), generated on both cores.
    fn flat(&self, n: usize, seed: u64) -> Vec<f32> {
        let half = n / 2;
        let part = |seed: u64, count: usize| {
            let mut rng = SplitMix64::new(seed);
            let mut out = Vec::with_capacity(count * self.dim);
            for _ in 0..count {
                out.extend(self.point(&mut rng));
            }
            out
        };
        let (mut a, b) = std::thread::scope(|s| {
            let h = s.spawn(|| part(seed, half));
            let b = part(seed + 1, n - half);
            (h.join().expect("generator"), b)
        });
        a.extend(b);
        a
    }
}

/// The ids of the `K` points nearest `q` by f32 dot product (both cores).
fn truth(flat: &[f32], q: &[f32]) -> Vec<u64> {
    let n = flat.len() / DIM;
    let top_of = |range: std::ops::Range<usize>| {
        let mut scored: Vec<(f32, u64)> = range
            .map(|i| {
                let p = &flat[i * DIM..(i + 1) * DIM];
                (p.iter().zip(q).map(|(a, b)| a * b).sum::<f32>(), i as u64)
            })
            .collect();
        let k = K.min(scored.len());
        scored.select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
        scored.truncate(k);
        scored
    };
    let mut all = std::thread::scope(|s| {
        let h = s.spawn(|| top_of(n / 2..n));
        let mut a = top_of(0..n / 2);
        a.extend(h.join().expect("truth"));
        a
    });
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    all.truncate(K);
    all.into_iter().map(|(_, i)| i).collect()
}

/// Resident anonymous memory of this process, in bytes (Linux; 0 elsewhere).
fn rss_anon() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Median and 99th percentile, in ms.
fn percentiles(mut times: Vec<Duration>) -> (f64, f64) {
    times.sort();
    let at = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    (at(0.50), at(0.99))
}

/// The share of each query's `want` that a search of `k` with `oversample` first-pass
/// candidates a hit returns, and the search's p50 and p99 in ms.
fn kept(
    index: &VectorIndex,
    queries: &[Vec<f32>],
    want: &[Vec<u64>],
    k: usize,
    oversample: usize,
) -> (f64, f64, f64) {
    let all = VectorFilter::default();
    let mut found = 0;
    let mut times = Vec::with_capacity(queries.len());
    for (q, want) in queries.iter().zip(want) {
        let t = Instant::now();
        let hits = index.search_with(q, k, &all, oversample);
        times.push(t.elapsed());
        found += hits.iter().filter(|h| want.contains(&h.message)).count();
    }
    let wanted: usize = want.iter().map(Vec::len).sum();
    let (p50, p99) = percentiles(times);
    (found as f64 / wanted as f64, p50, p99)
}

/// Each query's exact int8 best `k` (every entry rescored).
fn exact_int8(index: &VectorIndex, queries: &[Vec<f32>], k: usize) -> Vec<Vec<u64>> {
    let all = VectorFilter::default();
    let hits = |q: &Vec<f32>| {
        index
            .search_exact(q, k, &all)
            .iter()
            .map(|h| h.message)
            .collect()
    };
    queries.iter().map(hits).collect()
}

fn per_million(bytes: u64, n: usize) -> f64 {
    bytes as f64 / n as f64 * 1e6 / 1e6
}

// ---------------------------------------------------------------------------------------------
// The vector index alone

struct IndexFixture {
    index: VectorIndex,
    queries: Vec<Vec<f32>>,
}

fn entry(i: usize) -> VectorEntry {
    VectorEntry {
        message: i as u64,
        session: i as u64 % SESSIONS,
        created_at: i as i64,
        role: (i % 4) as u8,
        chunk: (0, 100),
    }
}

fn build_index(n: usize) -> IndexFixture {
    let points = Points::new(DIM);
    let t = Instant::now();
    let flat = points.flat(n, 1);
    let mut rng = SplitMix64::new(7);
    let queries: Vec<Vec<f32>> = (0..QUERIES).map(|_| points.point(&mut rng)).collect();
    eprintln!(
        "vectors {n}: generated in {:.1} s ({} cores)",
        t.elapsed().as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |c| c.get())
    );
    let tmp = scratch::kept();
    let dir = tmp.join("vectors");
    let (mut index, opened) = VectorIndex::open(&dir, DIM, MODEL, true).expect("open");
    assert_eq!(opened, Opened::New);
    let t = Instant::now();
    for i in 0..n {
        index
            .push(entry(i), flat[i * DIM..(i + 1) * DIM].to_vec())
            .expect("push");
        if (i + 1) % COMMIT_EVERY == 0 || i + 1 == n {
            index.commit(i as u64 + 1, None).expect("commit");
            // As the catch-up does after each commit.
            index.update_lists().expect("lists");
        }
    }
    eprintln!(
        "vectors {n}: build (commit every {COMMIT_EVERY}): {:.0} entries/s",
        n as f64 / t.elapsed().as_secs_f64()
    );
    let disk = index.disk_bytes();
    drop(index);
    let before = rss_anon();
    let t = Instant::now();
    let (index, opened) = VectorIndex::open(&dir, DIM, MODEL, false).expect("reopen");
    let open_time = t.elapsed();
    assert_eq!(opened, Opened::Existing);
    eprintln!(
        "vectors {n}: open {:.0} ms; disk {:.1} MB per million entries; in memory {:.1} MB per \
         million (anonymous memory grew {:.1} MB; the int8 vectors are mapped)",
        open_time.as_secs_f64() * 1e3,
        per_million(disk, n),
        per_million(index.memory_bytes(), n),
        rss_anon().saturating_sub(before) as f64 / 1e6,
    );

    let t = Instant::now();
    let truths: Vec<Vec<u64>> = queries.iter().map(|q| truth(&flat, q)).collect();
    eprintln!(
        "vectors {n}: f32 brute force {:.1} ms a query",
        t.elapsed().as_secs_f64() * 1e3 / QUERIES as f64
    );
    drop(flat);
    let all = VectorFilter::default();
    let measure = |oversample: usize| kept(&index, &queries, &truths, K, oversample);
    // A first pass pages in what the searches read.
    let _ = measure(OVERSAMPLE);
    for oversample in OVERSAMPLES {
        let (recall, p50, p99) = measure(oversample);
        let default = if oversample == OVERSAMPLE {
            " (default)"
        } else {
            ""
        };
        eprintln!(
            "vectors {n}: two passes, oversample {oversample:>3}{default}: recall@10 {recall:.3}, \
             p50 {p50:.2} ms, p99 {p99:.2} ms"
        );
    }
    // Hybrid search asks the vectors for a pool of 100 (lcm::search::hybrid::POOL).
    let pool_of_100 = |index: &VectorIndex| {
        let times = queries
            .iter()
            .map(|q| {
                let t = Instant::now();
                index.search(q, 100, &all);
                t.elapsed()
            })
            .collect();
        percentiles(times)
    };
    let (p50, p99) = pool_of_100(&index);
    eprintln!("vectors {n}: two passes, the best 100: p50 {p50:.2} ms, p99 {p99:.2} ms");
    // How much of the exact int8 top 100 the two passes keep, by oversample.
    let exact_100 = exact_int8(&index, &queries, 100);
    for oversample in [16, 32, 64, OVERSAMPLE] {
        let (share, p50, p99) = kept(&index, &queries, &exact_100, 100, oversample);
        eprintln!(
            "vectors {n}: the best 100, oversample {oversample:>3}: {share:.3} of the exact int8 \
             top 100, p50 {p50:.2} ms, p99 {p99:.2} ms"
        );
    }
    if index.has_lists() {
        let mut flat_index = VectorIndex::open(&dir, DIM, MODEL, false)
            .expect("reopen")
            .0;
        flat_index.forget_lists();
        let (recall, p50, p99) = kept(&flat_index, &queries, &truths, K, oversample_for(K));
        eprintln!(
            "vectors {n}: two passes without lists (every code read): recall@10 {recall:.3}, \
             p50 {p50:.2} ms, p99 {p99:.2} ms"
        );
        let (p50, p99) = pool_of_100(&flat_index);
        eprintln!("vectors {n}: without lists, the best 100: p50 {p50:.2} ms, p99 {p99:.2} ms");
    }
    let (recall, p50, p99) = measure(usize::MAX);
    eprintln!(
        "vectors {n}: exact int8 scan: recall@10 {recall:.3}, p50 {p50:.2} ms, p99 {p99:.2} ms"
    );
    let session = VectorFilter {
        session: Some(7),
        ..VectorFilter::default()
    };
    let mut times = Vec::new();
    for q in &queries {
        let t = Instant::now();
        index.search(q, K, &session);
        times.push(t.elapsed());
    }
    let (p50, p99) = percentiles(times);
    eprintln!("vectors {n}: one session of {SESSIONS} in scope: p50 {p50:.2} ms, p99 {p99:.2} ms");
    IndexFixture { index, queries }
}

fn index_fixtures() -> &'static Vec<(usize, IndexFixture)> {
    static FIXTURES: OnceLock<Vec<(usize, IndexFixture)>> = OnceLock::new();
    FIXTURES.get_or_init(|| sizes().into_iter().map(|n| (n, build_index(n))).collect())
}

fn vector_index(c: &mut Criterion) {
    if !wanted("vectors") {
        return;
    }
    let mut group = c.benchmark_group("vectors");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    let all = VectorFilter::default();
    for (n, f) in index_fixtures() {
        let mut next = 0;
        group.bench_function(BenchmarkId::new("two_passes", n), |b| {
            b.iter(|| {
                next = (next + 1) % f.queries.len();
                f.index.search(&f.queries[next], K, &all)
            })
        });
        group.bench_function(BenchmarkId::new("best_100", n), |b| {
            b.iter(|| {
                next = (next + 1) % f.queries.len();
                f.index.search(&f.queries[next], 100, &all)
            })
        });
        group.bench_function(BenchmarkId::new("exact", n), |b| {
            b.iter(|| {
                next = (next + 1) % f.queries.len();
                f.index.search_exact(&f.queries[next], K, &all)
            })
        });
    }
    group.finish();
}

// ---------------------------------------------------------------------------------------------
// Real embeddings

/// Real texts and real queries for the lists: what the model makes of them, not clusters.
struct RealSet {
    model: PathBuf,
    corpus: Vec<String>,
    /// Named query sets.
    queries: Vec<(&'static str, Vec<String>)>,
}

/// The corpus: the distinct lines of at least 24 bytes of the Claude Code transcripts (their
/// sub-agents' too: prose, tool calls, tool output), the TREC training questions and the
/// LoCoMo turns; the queries: the LoCoMo questions and the TREC test questions.
fn real_set() -> Result<RealSet, String> {
    let model = real_data::model_dir()?;
    let messages = real_data::transcript_messages(&real_data::transcript_files(true)?)?;
    let (turns, questions) = real_data::locomo()?;
    let mut seen = std::collections::HashSet::new();
    let corpus = real_data::transcript_lines(&messages, 24)
        .into_iter()
        .chain(real_data::trec_questions("TREC.train")?)
        .chain(turns)
        .filter(|t| seen.insert(t.clone()))
        .collect();
    let queries = vec![
        ("LoCoMo questions", questions),
        (
            "TREC test questions",
            real_data::trec_questions("TREC.test")?,
        ),
    ];
    Ok(RealSet {
        model,
        corpus,
        queries,
    })
}

/// The embeddings of `texts` (each cut to its first chunk, as the index embeds a message),
/// kept in `LCM_BENCH_DIR` between runs when it is set (embedding takes minutes).
fn embedded(model: &lcm_embed::Embedder, texts: &[String]) -> Vec<Vec<f32>> {
    use std::hash::{Hash, Hasher};
    let mut key = std::collections::hash_map::DefaultHasher::new();
    (model.model_id(), texts).hash(&mut key);
    let cache = std::env::var_os("LCM_BENCH_DIR")
        .map(|d| PathBuf::from(d).join(format!("real-embeddings-{:016x}.f32", key.finish())));
    let dim = model.dimension();
    if let Some(bytes) = cache.as_ref().and_then(|c| std::fs::read(c).ok())
        && bytes.len() == texts.len() * dim * 4
    {
        let flat: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        return flat.chunks(dim).map(<[f32]>::to_vec).collect();
    }
    let t = Instant::now();
    let inputs = real_data::first_chunks(model, texts);
    let mut vectors = Vec::with_capacity(texts.len());
    for batch in inputs.chunks(1024) {
        vectors.extend(model.embed(batch).expect("embed"));
    }
    eprintln!(
        "real: embedded {} texts in {:.0} s",
        texts.len(),
        t.elapsed().as_secs_f64()
    );
    if let Some(cache) = cache {
        let bytes: Vec<u8> = vectors
            .iter()
            .flatten()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        std::fs::write(&cache, bytes).expect("write the embeddings cache");
    }
    vectors
}

/// Lists on real embeddings: how much of the exact top ten (f32, brute force) the two passes
/// keep with lists and without, and how much of the exact int8 best hundred. The corpus is
/// small beside a million, so the lists are trained on all of it (`set_lists_from`), and the
/// index searches them as it would from 200,000 entries on (a quarter of the lists read).
fn real_embeddings(_: &mut Criterion) {
    if !wanted("real") {
        return;
    }
    let set = match real_set() {
        Ok(set) => set,
        Err(why) => {
            eprintln!("SKIPPED real embeddings: {why}");
            return;
        }
    };
    let options = lcm_embed::EmbedOptions::default();
    let model = lcm_embed::Embedder::load(&set.model, options).expect("load the model");
    assert_eq!(model.dimension(), DIM);
    let corpus = embedded(&model, &set.corpus);
    let n = corpus.len();
    let tmp = scratch::kept();
    let dir = tmp.join("vectors");
    let (mut index, _) = VectorIndex::open(&dir, DIM, model.model_id(), true).expect("open");
    index.set_lists_from(n);
    for (i, v) in corpus.iter().enumerate() {
        index.push(entry(i), v.clone()).expect("push");
    }
    index.commit(n as u64, None).expect("commit");
    assert!(
        index.update_lists().expect("lists"),
        "lists trained at {n} entries"
    );
    let mut every_code = VectorIndex::open(&dir, DIM, model.model_id(), false)
        .expect("reopen")
        .0;
    every_code.forget_lists();
    let flat: Vec<f32> = corpus.concat();
    eprintln!(
        "real: {n} texts ({} cores); lists of {:.0} entries on average",
        std::thread::available_parallelism().map_or(1, |c| c.get()),
        n as f64 / (n as f64).sqrt().round()
    );
    for (name, texts) in &set.queries {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let queries = model.embed(&refs).expect("embed the queries");
        let truths: Vec<Vec<u64>> = queries.iter().map(|q| truth(&flat, q)).collect();
        let exact_100 = exact_int8(&index, &queries, 100);
        for (how, index) in [("lists", &index), ("every code", &every_code)] {
            let (recall, p50, _) = kept(index, &queries, &truths, K, oversample_for(K));
            let (share, _, _) = kept(index, &queries, &exact_100, 100, oversample_for(100));
            eprintln!(
                "real: {} {name}, two passes ({how}): recall@10 {recall:.3} (p50 {p50:.2} ms); \
                 best 100: {share:.3} of the exact int8 best 100",
                queries.len()
            );
        }
        let count = index.list_count().unwrap_or(0);
        for probes in [count / 16, count / 8, count / 2] {
            let mut index = VectorIndex::open(&dir, DIM, model.model_id(), false)
                .expect("reopen")
                .0;
            index.set_list_probes(Some(probes));
            let (recall, p50, _) = kept(&index, &queries, &truths, K, oversample_for(K));
            let (share, _, _) = kept(&index, &queries, &exact_100, 100, oversample_for(100));
            eprintln!(
                "real: {} {name}, two passes, {probes} of {count} lists read: recall@10 \
                 {recall:.3} (p50 {p50:.2} ms); best 100: {share:.3} of the exact int8 best 100",
                queries.len()
            );
        }
        let (recall, p50, _) = kept(&index, &queries, &truths, K, usize::MAX);
        eprintln!(
            "real: {} {name}, exact int8: recall@10 {recall:.3} (p50 {p50:.2} ms)",
            queries.len()
        );
    }
    drift(&model, &corpus, &set.queries, &tmp.join("drift"));
}

/// Lists trained on the first quarter of the corpus (transcript lines only), then the rest
/// joins them (the TREC questions and the LoCoMo turns the queries look for): what lists
/// trained months ago make of what an agent does now, against the lists trained anew once the
/// index has grown fourfold (as the catch-up does).
fn drift(
    model: &lcm_embed::Embedder,
    corpus: &[Vec<f32>],
    query_sets: &[(&'static str, Vec<String>)],
    dir: &Path,
) {
    let n = corpus.len();
    let (mut index, _) = VectorIndex::open(dir, DIM, model.model_id(), true).expect("open");
    index.set_lists_from(n / 4);
    for (i, v) in corpus.iter().enumerate() {
        index.push(entry(i), v.clone()).expect("push");
        if i + 1 == n / 4 {
            index.commit((i + 1) as u64, None).expect("commit");
            assert!(index.update_lists().expect("lists"));
        }
    }
    index.commit(n as u64, None).expect("commit");
    assert!(index.lists_due(), "grown fourfold");
    let stale_count = index.list_count().unwrap_or(0);
    let t = Instant::now();
    let trained = index.train_lists();
    let trained_in = t.elapsed();
    let mut fresh = VectorIndex::open(dir, DIM, model.model_id(), true)
        .expect("reopen")
        .0;
    fresh.install_lists(trained).expect("install");
    let flat: Vec<f32> = corpus.concat();
    eprintln!(
        "real, drift: lists trained on the first {} of {n} texts ({stale_count} lists, the longest {} entries), then anew on all ({} lists, the longest {}; {:.1} s)",
        n / 4,
        index.longest_list().unwrap_or(0),
        fresh.list_count().unwrap_or(0),
        fresh.longest_list().unwrap_or(0),
        trained_in.as_secs_f64()
    );
    for (name, texts) in query_sets {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let queries = model.embed(&refs).expect("embed the queries");
        let truths: Vec<Vec<u64>> = queries.iter().map(|q| truth(&flat, q)).collect();
        for (how, index) in [
            ("trained on the first quarter", &index),
            ("trained anew", &fresh),
        ] {
            let (recall, p50, _) = kept(index, &queries, &truths, K, oversample_for(K));
            eprintln!(
                "real, drift: {} {name}, lists {how}: recall@10 {recall:.3} (p50 {p50:.2} ms)",
                queries.len()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Grep by meaning, end to end

struct GrepFixture {
    data: DataDir,
    config: Config,
    queries: Vec<String>,
    sessions: Vec<SessionId>,
}

fn build_data_dir(n: usize, model: &Path) -> GrepFixture {
    let tmp = scratch::kept();
    let dir = tmp.join("lcm");
    let words = corpus::Words::new(20_000);
    let mut lengths: Vec<(u64, u64, i64, u8, u32)> = Vec::with_capacity(n);
    let sessions: Vec<SessionId>;
    let last: Option<u64>;
    {
        let data = DataDir::open(&dir, &Config::default()).expect("open");
        sessions = (0..SESSIONS)
            .map(|i| {
                data.store
                    .create_session(&format!("bench-{i}"), None)
                    .expect("session")
            })
            .collect();
        let t = Instant::now();
        let mut start = 0;
        while start < n as u64 {
            let end = (start + BUILD_BATCH).min(n as u64);
            let batch: Vec<_> = (start..end).map(|k| corpus::message(&words, k)).collect();
            let session = sessions[(start / BUILD_BATCH % SESSIONS) as usize];
            let shapes: Vec<(i64, u8, u32)> = batch
                .iter()
                .map(|m| {
                    (
                        m.created_at.0,
                        m.role.code() as u8,
                        search_text(&m.parts).len() as u32,
                    )
                })
                .collect();
            let appended = data.store.append_batch(session, batch).expect("append");
            for (a, (at, role, len)) in appended.iter().zip(shapes) {
                lengths.push((a.id.0, session.0, at, role, len));
            }
            start = end;
        }
        data.index.catch_up(&data.store, |_, _| {}).expect("index");
        eprintln!(
            "meaning {n}: store and words index built in {:.0} s",
            t.elapsed().as_secs_f64()
        );
        // The last message's fingerprint, as a catch-up records it: searches check it.
        let reader = data.store.reader().expect("reader");
        last = (n as u64).checked_sub(1).and_then(|id| {
            lcm::search::lineage::stored_message_fingerprint(&reader, MessageId(id))
                .expect("fingerprint")
        });
    }
    // The vectors: one per message (the corpus's messages are shorter than a chunk).
    let embedder = lcm_embed::Embedder::load(model, lcm_embed::EmbedOptions::default())
        .expect("load the model");
    let (mut vectors, opened) = VectorIndex::open(
        &dir.join(VECTORS_DIR),
        embedder.dimension(),
        &lcm::search::semantic::messages_index_id(&embedder),
        true,
    )
    .expect("open vectors");
    assert_eq!(opened, Opened::New);
    // As wide as the model's vectors (384 for all-MiniLM-L6-v2, 768 for all-mpnet-base-v2).
    let points = Points::new(embedder.dimension());
    let mut rng = SplitMix64::new(11);
    let t = Instant::now();
    for (i, &(message, session, created_at, role, len)) in lengths.iter().enumerate() {
        let entry = VectorEntry {
            message,
            session,
            created_at,
            role,
            chunk: (0, len),
        };
        vectors.push(entry, points.point(&mut rng)).expect("push");
        if (i + 1) % COMMIT_EVERY == 0 {
            vectors.commit(message + 1, None).expect("commit");
            // As the catch-up does after each commit: lists from 200,000 entries, anew at
            // 800,000.
            vectors.update_lists().expect("lists");
        }
    }
    let end = lengths.last().map_or(0, |l| l.0 + 1);
    vectors.commit(end, last).expect("commit");
    vectors.update_lists().expect("lists");
    eprintln!(
        "meaning {n}: synthetic vectors written in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    drop(vectors);
    drop(embedder);

    let mut config = Config::default();
    config.embeddings.model_dir = Some(model.to_path_buf());
    let data = DataDir::open(&dir, &config).expect("reopen with the model");
    let semantic = data.index.semantic().expect("semantic configured");
    assert_eq!(
        semantic.watermark().expect("watermark").0,
        data.store.next_message_id().expect("next").0,
        "the synthetic vectors cover every message: no catch-up runs in the measurements"
    );
    // Questions of three to five corpus words.
    let mut pick = SplitMix64::new(5);
    let queries = (0..QUERIES)
        .map(|_| {
            let len = 3 + pick.below(3) as usize;
            (0..len)
                .map(|_| words.pick(&mut pick).to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    GrepFixture {
        data,
        config,
        queries,
        sessions,
    }
}

fn run(f: &GrepFixture, mode: GrepMode, query: &str, scope: Scope) -> usize {
    let page = grep(
        &f.data.store,
        &f.data.index,
        &f.config.search,
        &GrepRequest {
            pattern: query.to_string(),
            mode,
            scope,
            limit: Some(K),
            cursor: None,
        },
    )
    .expect("grep");
    page.hits.len()
}

fn grep_fixtures() -> &'static Vec<(usize, GrepFixture)> {
    static FIXTURES: OnceLock<Vec<(usize, GrepFixture)>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let model = match real_data::model_dir() {
            Ok(model) => model,
            Err(why) => {
                eprintln!("SKIPPED grep by meaning: no embedding model ({why})");
                return Vec::new();
            }
        };
        sizes()
            .into_iter()
            .map(|n| {
                let f = build_data_dir(n, &model);
                let one_session = Scope {
                    session: Some(f.sessions[7]),
                    ..Scope::default()
                };
                let modes = [
                    ("full_text", GrepMode::FullText, Scope::default()),
                    ("semantic", GrepMode::Semantic, Scope::default()),
                    ("hybrid", GrepMode::Hybrid, Scope::default()),
                    ("hybrid, one session", GrepMode::Hybrid, one_session),
                ];
                // The first query loads the model: not measured.
                run(&f, GrepMode::Semantic, "warm up", Scope::default());
                for (name, mode, scope) in modes {
                    let mut times = Vec::with_capacity(QUERIES);
                    let mut hits = 0;
                    for q in &f.queries {
                        let t = Instant::now();
                        hits += run(&f, mode, q, scope.clone());
                        times.push(t.elapsed());
                    }
                    let (p50, p99) = percentiles(times);
                    eprintln!(
                        "meaning {n}: {name:<20} p50 {p50:6.2} ms, p99 {p99:6.2} ms \
                         ({:.1} hits a query)",
                        hits as f64 / QUERIES as f64
                    );
                }
                // Hybrid's lift by neighbouring turns, alone: a pool of 200 candidates
                // anywhere in the store (each a row lookup of its own, the worst case).
                let mut rng = SplitMix64::new(11);
                let stored = f.data.store.next_message_id().expect("next id").0;
                let mut times = Vec::with_capacity(QUERIES);
                for _ in 0..QUERIES {
                    let mut pool: Vec<Fused<MessageId>> = (0..2 * lcm::search::HYBRID_POOL)
                        .map(|_| Fused {
                            id: MessageId(rng.below(stored)),
                            score: rng.uniform() as f32,
                            by_words: true,
                            chunk: None,
                        })
                        .collect();
                    let t = Instant::now();
                    let reader = f.data.store.reader().expect("reader");
                    lifted_by_neighbours(&reader, &mut pool).expect("lift");
                    times.push(t.elapsed());
                }
                let (p50, p99) = percentiles(times);
                eprintln!(
                    "meaning {n}: of hybrid, lifting 200 candidates by their neighbours: \
                     p50 {p50:.3} ms, p99 {p99:.3} ms"
                );
                // Every search by meaning first checks that the vectors are the store's.
                let semantic = f.data.index.semantic().expect("semantic");
                let mut times = Vec::with_capacity(QUERIES);
                for _ in 0..QUERIES {
                    let t = Instant::now();
                    let stale = semantic.stale_for(&f.data.store).expect("check");
                    times.push(t.elapsed());
                    assert_eq!(stale, None);
                }
                let (p50, p99) = percentiles(times);
                eprintln!(
                    "meaning {n}: of which checking the vectors are the store's: \
                     p50 {p50:.3} ms, p99 {p99:.3} ms"
                );
                let embedder = semantic.embedder().expect("model");
                let mut times = Vec::with_capacity(QUERIES);
                for q in &f.queries {
                    let t = Instant::now();
                    embedder.embed(&[q.as_str()]).expect("embed");
                    times.push(t.elapsed());
                }
                let (p50, p99) = percentiles(times);
                eprintln!(
                    "meaning {n}: of which embedding the query ({} threads): p50 {p50:.2} ms, \
                     p99 {p99:.2} ms",
                    embedder.threads()
                );
                let one = lcm_embed::Embedder::load(
                    &model,
                    lcm_embed::EmbedOptions {
                        threads: 1,
                        ..lcm_embed::EmbedOptions::default()
                    },
                )
                .expect("load the model");
                let mut times = Vec::with_capacity(QUERIES);
                for q in &f.queries {
                    let t = Instant::now();
                    one.embed(&[q.as_str()]).expect("embed");
                    times.push(t.elapsed());
                }
                let (p50, p99) = percentiles(times);
                eprintln!(
                    "meaning {n}: embedding the query on 1 thread: p50 {p50:.2} ms, p99 {p99:.2} ms"
                );
                (n, f)
            })
            .collect()
    })
}

fn grep_by_meaning(c: &mut Criterion) {
    if !wanted("meaning") {
        return;
    }
    let mut group = c.benchmark_group("meaning");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (n, f) in grep_fixtures() {
        for (name, mode) in [
            ("full_text", GrepMode::FullText),
            ("semantic", GrepMode::Semantic),
            ("hybrid", GrepMode::Hybrid),
        ] {
            let mut next = 0;
            group.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter(|| {
                    next = (next + 1) % f.queries.len();
                    run(f, mode, &f.queries[next], Scope::default())
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, vector_index, real_embeddings, grep_by_meaning);
// `criterion_main!`, with the fixtures' directories removed at the end.
fn main() {
    let _cleanup = scratch::RemoveKeptOnExit;
    benches();
    Criterion::default().configure_from_args().final_summary();
}
