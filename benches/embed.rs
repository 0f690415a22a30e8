//! Sentence embeddings in process (`lcm-embed`, all-MiniLM-L6-v2 on the CPU, or the model of
//! `LCM_EMBED_MODEL_DIR`, named in the benchmarks' ids): throughput on the
//! first 512 text messages (all there are, if fewer) of the real Claude Code sessions, each cut to what the model reads
//! (its first chunk: at most 254 word pieces), embedded in batches of 32, alone and as the
//! vector index's catch-up embeds them (followed by the head of the message before).
//!
//! Needs `../shared/tools/embed-model/setup.sh` (the model) and `../shared/data/transcripts`;
//! without either it says so and measures nothing. Before criterion runs, one timed pass per
//! thread count prints messages/s, MB/s, the CPU time it took (the thread limit at work) and the
//! resident memory of the loaded model to stderr. A second group embeds one short query at a
//! time (what a semantic or hybrid search does first), with 2 threads and with 1; a third, one
//! message of 48, 96 or 192 word pieces alone (the catch-up in a live session). The `rerank`
//! group scores one query against 50 passages with the cross-encoder of
//! `tests/models/ms-marco-MiniLM-L-12-v2.sh` (what a hybrid search with `reranker_dir` adds):
//! 50 LoCoMo turns (short) and 50 of the transcripts' messages (long, cut at 512 pieces).
//! Figures: docs/PERFORMANCE.md.

#[path = "support/real_data.rs"]
mod real_data;

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lcm::search::semantic::{CONTEXT_TOKENS, first_chunk_text};
use lcm_embed::{EmbedOptions, Embedder, RerankOptions, Reranker};

/// Messages embedded per iteration.
const MESSAGES: usize = 512;
/// Fewer text messages than this in the data set: nothing is measured.
const AT_LEAST: usize = 256;
/// Texts per forward pass (the configuration's default).
const BATCH: usize = 32;

/// The first `MESSAGES` (at least `AT_LEAST`) messages with text (their text parts, joined) of
/// the four real Claude Code sessions, in file order, or why there are none.
fn real_texts() -> Result<Vec<String>, String> {
    use lcm::core::message::Part;
    let messages = real_data::transcript_messages(&real_data::transcript_files(false)?)?;
    let texts: Vec<String> = messages
        .iter()
        .filter_map(|m| {
            let text: Vec<&str> = m
                .parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text } if !text.trim().is_empty() => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            (!text.is_empty()).then(|| text.join("\n"))
        })
        .take(MESSAGES)
        .collect();
    if texts.len() < AT_LEAST {
        return Err(format!(
            "the transcripts have {} text messages, fewer than {AT_LEAST}",
            texts.len()
        ));
    }
    Ok(texts)
}

/// Resident memory of this process, in MiB (Linux), 0 elsewhere.
fn rss_mib() -> f64 {
    proc_status_kib("VmRSS:") / 1024.0
}

fn proc_status_kib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0.0)
}

/// CPU time (user + system) this process has used, from /proc (Linux: 100 ticks a second).
fn cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after_name = &s[s.rfind(')')? + 1..];
            let fields: Vec<&str> = after_name.split_whitespace().collect();
            // utime and stime: fields 14 and 15 of stat(5); 11 and 12 after the name.
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn load(dir: &Path, threads: usize) -> Embedder {
    let options = EmbedOptions {
        batch_size: BATCH,
        threads,
        ..EmbedOptions::default()
    };
    Embedder::load(dir, options).expect("load the model")
}

/// One timed embedding of `inputs`, its rates and CPU time to stderr.
fn timed_pass(name: &str, model: &Embedder, inputs: &[&str], bytes: usize) {
    let (wall, cpu) = (Instant::now(), cpu_time());
    let vectors = model.embed(inputs).expect("embed");
    let (wall, cpu) = (wall.elapsed(), cpu_time() - cpu);
    assert_eq!(vectors.len(), inputs.len());
    eprintln!(
        "embed/{name}: {:.1} messages/s, {:.3} MB/s; CPU time {:.2} s in {:.2} s ({:.2} cores busy)",
        inputs.len() as f64 / wall.as_secs_f64(),
        bytes as f64 / 1e6 / wall.as_secs_f64(),
        cpu.as_secs_f64(),
        wall.as_secs_f64(),
        cpu.as_secs_f64() / wall.as_secs_f64(),
    );
}

fn embed(c: &mut Criterion) {
    let (dir, texts) = match (real_data::model_dir(), real_texts()) {
        (Ok(dir), Ok(texts)) => (dir, texts),
        (Err(why), _) | (_, Err(why)) => {
            eprintln!("SKIPPED embedding throughput: {why}");
            return;
        }
    };
    let before = rss_mib();
    let model = load(&dir, 0);
    let loaded = rss_mib();
    // What the model reads of each message: its first chunk (the rest would be other chunks).
    let inputs = real_data::first_chunks(&model, &texts);
    let bytes: usize = inputs.iter().map(|t| t.len()).sum();
    let whole: usize = texts.iter().map(String::len).sum();
    eprintln!(
        "{} messages: {:.1} KB as read by the model ({:.1} KB whole), {} cut to their first chunk",
        inputs.len(),
        bytes as f64 / 1e3,
        whole as f64 / 1e3,
        texts
            .iter()
            .zip(&inputs)
            .filter(|(t, i)| t.len() != i.len())
            .count(),
    );

    // What the catch-up embeds: each first chunk followed by the head of the message before it.
    let with_context: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(i, chunk)| {
            let before = i.checked_sub(1).map_or("", |b| texts[b].as_str());
            let head = model.head(before, CONTEXT_TOKENS).expect("head");
            first_chunk_text(chunk, head)
        })
        .collect();
    let with_context: Vec<&str> = with_context.iter().map(String::as_str).collect();
    let context_bytes: usize = with_context.iter().map(|t| t.len()).sum();

    // Benchmark ids name the model (its directory's name: "minilm_l6" kept for
    // all-MiniLM-L6-v2, so earlier runs compare).
    let label = match model.model_id().split('@').next().unwrap_or("model") {
        "all-MiniLM-L6-v2" => "minilm_l6".to_string(),
        other => other.to_string(),
    };
    let mut models = vec![(format!("threads_{}", model.threads()), model)];
    let (name, model) = &models[0];
    timed_pass(name, model, &inputs, bytes);
    timed_pass(
        &format!("{name}/with_context"),
        model,
        &with_context,
        context_bytes,
    );
    eprintln!(
        "resident memory: {before:.1} MiB before loading, {loaded:.1} MiB with the model loaded, \
         {:.1} MiB after a pass (peak {:.1} MiB)",
        rss_mib(),
        proc_status_kib("VmHWM:") / 1024.0
    );
    let one = load(&dir, 1);
    timed_pass("threads_1", &one, &inputs, bytes);
    models.push(("threads_1".into(), one));

    let mut group = c.benchmark_group("embed");
    group
        .sample_size(10)
        .throughput(Throughput::Bytes(bytes as u64));
    for (name, model) in &models {
        group.bench_function(
            format!("{label}/{}_messages_batch_{BATCH}/{name}", inputs.len()),
            |b| b.iter(|| model.embed(&inputs).expect("embed")),
        );
    }
    // The same messages as the catch-up embeds them (bytes: the messages' own, as above).
    let (name, model) = &models[0];
    group.bench_function(
        format!(
            "{label}/{}_messages_with_context_batch_{BATCH}/{name}",
            inputs.len()
        ),
        |b| b.iter(|| model.embed(&with_context).expect("embed")),
    );
    group.finish();

    // A search embeds its query alone: a few words, one forward pass of about 10 pieces.
    let mut group = c.benchmark_group("embed_query");
    group.sample_size(50);
    for (name, model) in &models {
        let mut n = 0u64;
        group.bench_function(format!("{label}/{name}"), |b| {
            b.iter(|| {
                n += 1;
                let query = format!("flaky migration test of module m{}", n % 97);
                model.embed(&[&query]).expect("embed")
            })
        });
    }
    group.finish();

    // A message embedded alone, as the catch-up does when messages come one at a time (a live
    // session): one forward pass of `pieces` word pieces (plus the two the model adds), cut
    // from the real messages.
    let all = texts.join("\n");
    let mut group = c.benchmark_group("embed_one");
    group.sample_size(20);
    let (name, model) = &models[0];
    for pieces in [48, 96, 192] {
        let text = model.head(&all, pieces).expect("head");
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(format!("{label}/{pieces}_pieces/{name}"), |b| {
            b.iter(|| model.embed(&[text]).expect("embed"))
        });
    }
    group.finish();
}

/// Passages a hybrid search's reranker reads (the configuration's default `rerank_depth`).
const RERANKED: usize = 50;

fn rerank(c: &mut Criterion) {
    let (dir, (turns, questions), texts) =
        match (real_data::reranker_dir(), real_data::locomo(), real_texts()) {
            (Ok(dir), Ok(locomo), Ok(texts)) => (dir, locomo, texts),
            (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
                eprintln!("SKIPPED reranking: {why}");
                return;
            }
        };
    let model = Reranker::load(&dir, RerankOptions::default()).expect("load the reranker");
    let turns: Vec<&str> = turns.iter().take(RERANKED).map(String::as_str).collect();
    let messages: Vec<&str> = texts.iter().take(RERANKED).map(String::as_str).collect();
    let mut group = c.benchmark_group("rerank");
    group.sample_size(10);
    let mut n = 0;
    group.bench_function(format!("locomo_{RERANKED}_turns"), |b| {
        b.iter(|| {
            n += 1;
            model
                .score(&questions[n % questions.len()], &turns)
                .expect("rerank")
        })
    });
    group.bench_function(format!("transcripts_{RERANKED}_messages"), |b| {
        b.iter(|| {
            model
                .score("why did the migration test fail?", &messages)
                .expect("rerank")
        })
    });
    group.finish();
}

criterion_group!(benches, embed, rerank);
criterion_main!(benches);
