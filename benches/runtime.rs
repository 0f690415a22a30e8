//! Actor-runtime benchmarks.
//!
//! - **Zero-cost continuity**: a turn (append + context) of a session below the soft threshold
//!   through the runtime, against the same two calls on the store directly (both durable, on
//!   disk, in one run, so the ratio is meaningful).
//! - **Turns per second** across 1, 10 and 100 concurrent sessions, and the **p50 / p99 latency**
//!   of append and of context through the actors (printed as a table, not by criterion).
//! - **Memory** per idle and per active session, for short and long histories (RSS deltas).
//! - **A session that compacts all the time**, growing to 30,000 messages (the soak's shape:
//!   small leaves, a 2,000-token window, a context every 10 appends): context and compaction
//!   latency per 5,000 messages, which must not grow with the history.
//!
//! `LCM_BENCH_QUICK=1` shortens the latency, memory and growth runs; `LCM_BENCH_GROUPS`
//! (`continuity`, `latency`, `memory`, `growth`, comma-separated) runs some parts only.
//! `LCM_BENCH_DIR` chooses where the temporary stores go.

#[path = "support/groups.rs"]
mod groups;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::core::rng::work_words;
use lcm::engine::assemble;
use lcm::engine::runtime::{Runtime, RuntimeOptions};
use lcm::llm::ExtractiveSummarizer;
use lcm::store::{Store, StoreOptions};
use lcm::{Encoding, TokenCounter};

use groups::wanted;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn quick() -> bool {
    std::env::var_os("LCM_BENCH_QUICK").is_some()
}

fn temp_dir() -> tempfile::TempDir {
    match std::env::var_os("LCM_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir).expect("temp dir"),
        None => tempfile::tempdir().expect("temp dir"),
    }
}

fn message(i: u64) -> NewMessage {
    let role = if i.is_multiple_of(2) {
        Role::User
    } else {
        Role::Assistant
    };
    NewMessage::text(
        role,
        format!(
            "turn {i}: the build of module m{} passed; next, review the flaky test t{i}",
            i % 17
        ),
    )
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

async fn open_runtime(dir: &std::path::Path, config: Config) -> Runtime {
    let summarizer = Arc::new(ExtractiveSummarizer::new(counter()));
    Runtime::open(RuntimeOptions::dir(dir, config).with_summarizer(summarizer))
        .await
        .expect("runtime")
}

/// A budget far above any context here: every turn stays below the soft threshold.
const HUGE_BUDGET: u64 = 100_000_000;

fn zero_cost_continuity(c: &mut Criterion) {
    if !wanted("continuity") {
        return;
    }
    let mut group = c.benchmark_group("turn_below_soft_threshold");
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(8));

    // Direct: the store's append (durable) and assembly, on the calling thread.
    let dir = temp_dir();
    let store =
        Store::open(dir.path().join("lcm.redb"), StoreOptions::new(counter())).expect("store");
    let session = store.create_session("direct", None).expect("session");
    for i in 0..50 {
        store.append(session, message(i)).expect("append");
    }
    let mut i = 50;
    group.bench_function("store_direct", |b| {
        b.iter(|| {
            store.append(session, message(i)).expect("append");
            i += 1;
            let ctx = assemble(&store, session).expect("assemble");
            std::hint::black_box(ctx.tokens);
        })
    });
    drop(store);

    // Through the runtime: session actor, group writer, assembler actor.
    let rt_dir = temp_dir();
    let tokio = tokio_runtime();
    let rt = tokio.block_on(open_runtime(rt_dir.path(), Config::default()));
    let handle = tokio.block_on(rt.session("actors")).expect("session");
    tokio.block_on(async {
        for i in 0..50 {
            handle.append(message(i)).await.expect("append");
        }
    });
    let mut i = 50;
    group.bench_function("runtime_actors", |b| {
        b.iter(|| {
            tokio.block_on(async {
                handle.append(message(i)).await.expect("append");
                i += 1;
                let ctx = handle.context(HUGE_BUDGET).await.expect("context");
                std::hint::black_box(ctx.tokens);
            })
        })
    });
    group.finish();
    let stats = tokio.block_on(handle.stats()).expect("stats");
    assert_eq!(stats.compactions_requested, 0, "no compaction below soft");
    tokio
        .block_on(rt.shutdown(Duration::from_secs(10)))
        .expect("shutdown");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// Turns per second and latency percentiles for `sessions` concurrent sessions.
fn throughput_and_latency(_c: &mut Criterion) {
    if !wanted("latency") {
        return;
    }
    let tokio = tokio_runtime();
    let turns_per_session: u64 = if quick() { 100 } else { 300 };
    println!(
        "\nruntime turns (append + context, durable, below soft), {turns_per_session} turns per session"
    );
    println!("| sessions | turns/s | append p50 | append p99 | context p50 | context p99 |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for sessions in [1u64, 10, 100] {
        let dir = temp_dir();
        let rt = tokio.block_on(open_runtime(dir.path(), Config::default()));
        let started = Instant::now();
        let (mut appends, mut contexts) = tokio.block_on(async {
            let mut tasks = Vec::new();
            for k in 0..sessions {
                let rt = rt.clone();
                tasks.push(tokio::spawn(async move {
                    let s = rt.session(&format!("s{k}")).await.expect("session");
                    let mut a = Vec::new();
                    let mut c = Vec::new();
                    for i in 0..turns_per_session {
                        let t = Instant::now();
                        s.append(message(i)).await.expect("append");
                        a.push(t.elapsed());
                        let t = Instant::now();
                        let ctx = s.context(HUGE_BUDGET).await.expect("context");
                        c.push(t.elapsed());
                        std::hint::black_box(ctx.tokens);
                    }
                    (a, c)
                }));
            }
            let mut a = Vec::new();
            let mut c = Vec::new();
            for t in tasks {
                let (x, y) = t.await.expect("task");
                a.extend(x);
                c.extend(y);
            }
            (a, c)
        });
        let elapsed = started.elapsed();
        appends.sort();
        contexts.sort();
        let turns = sessions * turns_per_session;
        println!(
            "| {sessions} | {:.0} | {:?} | {:?} | {:?} | {:?} |",
            turns as f64 / elapsed.as_secs_f64(),
            percentile(&appends, 0.5),
            percentile(&appends, 0.99),
            percentile(&contexts, 0.5),
            percentile(&contexts, 0.99),
        );
        tokio
            .block_on(rt.shutdown(Duration::from_secs(10)))
            .expect("shutdown");
    }
}

/// The system allocator, counting the bytes live at any moment (RSS is too coarse: the
/// allocator reuses pages freed while the store was filled).
struct CountingAlloc;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

fn live_bytes() -> i64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Memory of live session actors: heap growth when `n` sessions become active (one context
/// call each, whose result is dropped), for short and long histories, and after they idle out.
fn memory_per_session(_c: &mut Criterion) {
    if !wanted("memory") {
        return;
    }
    let tokio = tokio_runtime();
    let n: u64 = if quick() { 200 } else { 1_000 };
    println!("\nmemory per session actor ({n} sessions)");
    println!(
        "| history per session | heap per active session | idle (actors stopped), handles held | idle, handles dropped |"
    );
    println!("| --- | --- | --- | --- |");
    for history in [10u64, 1_000] {
        let dir = temp_dir();
        let mut config = Config::default();
        config.runtime.idle_timeout_s = 1;
        let rt = tokio.block_on(open_runtime(dir.path(), config));
        // Fill the store directly (fast), so that only actor memory is measured below.
        let store = Arc::clone(rt.store());
        let sessions: Vec<_> = (0..n)
            .map(|k| {
                let id = store
                    .create_session(&format!("m{k}"), None)
                    .expect("session");
                let batch: Vec<NewMessage> = (0..history).map(message).collect();
                store.append_batch(id, batch).expect("append");
                id
            })
            .collect();
        let handles: Vec<_> = sessions
            .iter()
            .map(|id| tokio.block_on(rt.session_by_id(*id)).expect("handle"))
            .collect();
        // Warm the shared caches (tokenizer, redb pages) with one session first.
        tokio
            .block_on(handles[0].context(HUGE_BUDGET))
            .expect("context");
        let before = live_bytes();
        tokio.block_on(async {
            for h in &handles[1..] {
                h.context(HUGE_BUDGET).await.expect("context");
            }
        });
        let active = (live_bytes() - before) / (n as i64 - 1);
        // Let them idle out (idle_timeout_s = 1), then measure again.
        std::thread::sleep(Duration::from_millis(2_500));
        let live = tokio
            .block_on(rt.supervisor_stats())
            .expect("stats")
            .live_sessions;
        let idle = (live_bytes() - before) / (n as i64 - 1);
        // A held handle keeps its stopped actor's cell until its next call; a dropped one
        // leaves nothing.
        let first = handles.into_iter().next();
        let dropped = (live_bytes() - before) / (n as i64 - 1);
        println!(
            "| {history} messages | {:.1} KiB | {:.1} KiB ({live} actors left) | {:.2} KiB |",
            active as f64 / 1024.0,
            idle as f64 / 1024.0,
            dropped as f64 / 1024.0
        );
        drop(first);
        tokio
            .block_on(rt.shutdown(Duration::from_secs(10)))
            .expect("shutdown");
    }
}

/// The soak's message text (`crates/lcm-server/tests/it/common/load.rs`): about 40 tokens,
/// no two alike.
fn load_text(turn: u64) -> String {
    format!("turn {turn}: {} ref LOAD-{turn}.", work_words(turn, 24))
}

/// One session under the soak's shape, in process: whatever the history, a context request
/// costs the same (it waits for at most one compaction of a bounded context).
fn compacting_session_growth(_c: &mut Criterion) {
    if !wanted("growth") {
        return;
    }
    let total: u64 = if quick() { 10_000 } else { 30_000 };
    let every = 5_000;
    let tokio = tokio_runtime();
    let dir = temp_dir();
    let mut config = Config::default();
    config.compaction.fresh_tail = 8;
    config.compaction.leaf_chunk_tokens = 600;
    config.compaction.leaf_target_tokens = 120;
    let rt = tokio.block_on(open_runtime(dir.path(), config));
    let mut events = rt.subscribe();
    let compactions = Arc::new(std::sync::Mutex::new(Vec::<Duration>::new()));
    let recorder = {
        let compactions = compactions.clone();
        tokio.spawn(async move {
            use lcm::engine::runtime::RuntimeEvent;
            let mut started = None;
            while let Ok(event) = events.recv().await {
                match event {
                    RuntimeEvent::CompactionStarted { .. } => started = Some(Instant::now()),
                    RuntimeEvent::CompactionFinished { .. } => {
                        if let Some(at) = started.take() {
                            compactions.lock().expect("lock").push(at.elapsed());
                        }
                    }
                    _ => {}
                }
            }
        })
    };
    println!(
        "\none session compacting all the time (600-token leaves, 2,000-token window, a context every 10 appends)"
    );
    println!(
        "| messages | summaries | append p50 | context p50 | context p99 | context max | compactions | compaction p50 | compaction max |"
    );
    println!("| ---: | ---: | --- | --- | --- | --- | ---: | --- | --- |");
    let session = tokio.block_on(rt.session("growing")).expect("session");
    let (mut appends, mut contexts) = (Vec::new(), Vec::new());
    for turn in 0..total {
        let role = if turn.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        };
        tokio.block_on(async {
            let t = Instant::now();
            session
                .append(NewMessage::text(role, load_text(turn)))
                .await
                .expect("append");
            appends.push(t.elapsed());
            if (turn + 1).is_multiple_of(10) {
                let t = Instant::now();
                let ctx = session.context(2_000).await.expect("context");
                contexts.push(t.elapsed());
                std::hint::black_box(ctx.tokens);
            }
        });
        if (turn + 1).is_multiple_of(every) {
            let mut done = std::mem::take(&mut *compactions.lock().expect("lock"));
            appends.sort();
            contexts.sort();
            done.sort();
            let summaries = rt
                .store()
                .session_summary_count(session.id())
                .expect("summaries");
            println!(
                "| {} | {summaries} | {:?} | {:?} | {:?} | {:?} | {} | {:?} | {:?} |",
                turn + 1,
                percentile(&appends, 0.5),
                percentile(&contexts, 0.5),
                percentile(&contexts, 0.99),
                contexts.last().copied().unwrap_or_default(),
                done.len(),
                percentile(&done, 0.5),
                done.last().copied().unwrap_or_default(),
            );
            appends.clear();
            contexts.clear();
        }
    }
    recorder.abort();
    tokio
        .block_on(rt.shutdown(Duration::from_secs(10)))
        .expect("shutdown");
}

criterion_group!(
    benches,
    zero_cost_continuity,
    throughput_and_latency,
    memory_per_session,
    compacting_session_growth
);
criterion_main!(benches);
