//! Engine benchmarks: context assembly against history length (a session of 100,000 and of
//! 1,000,000 messages with a deep DAG: assembly should not depend on history), the engine
//! overhead of one compaction pass with a summariser that answers instantly, the extractive
//! summariser's throughput, and the structured summariser's (digest and rendering) on agent
//! work beside the extractive one on the same span. `LCM_BENCH_QUICK=1` runs the 100,000 case only.

#[path = "support/corpus.rs"]
mod corpus;

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lcm::core::config::CompactionConfig;
use lcm::core::digest::OpenItems;
use lcm::core::message::NewMessage;
use lcm::core::summary::{ContextMark, NewSummary, NodeRef, SummaryKind};
use lcm::engine::{assemble, compact};
use lcm::llm::structured::{extract, render};
use lcm::llm::summarize::{Summarizer, SummaryCall};
use lcm::llm::{Completion, ExtractiveSummarizer, ProviderError, StructuredSummarizer};
use lcm::store::{ApplyOutcome, Store, StoreOptions};
use lcm::{Encoding, SessionId, TokenCounter};
use std::time::Instant;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

/// Appends `n` generated messages to `session`, in batches of 10,000.
fn append_corpus(store: &Store, session: SessionId, n: u64) {
    let words = corpus::Words::new(20_000);
    let mut k = 0;
    while k < n {
        let end = (k + 10_000).min(n);
        let batch: Vec<NewMessage> = (k..end).map(|i| corpus::message(&words, i)).collect();
        store.append_batch(session, batch).expect("append");
        k = end;
    }
}

/// A store holding one session of `n` messages, compacted into a deep DAG by fabricated
/// summaries (leaves of 100 messages, condensed 4 by 4 up to depth 5), leaving a raw tail of 32.
fn session_with_dag(dir: &std::path::Path, n: u64) -> (Store, SessionId) {
    let store = Store::open(dir.join("lcm.redb"), StoreOptions::new(counter())).expect("open");
    let session = store.create_session("bench", None).expect("session");
    append_corpus(&store, session, n);
    let ids: Vec<_> = store
        .session_messages(session, 0..n.saturating_sub(32))
        .expect("messages")
        .into_iter()
        .map(|m| m.id)
        .collect();
    let fabricate = |kind, depth, sources: Vec<NodeRef>| NewSummary {
        session,
        kind,
        depth,
        content: "A fabricated summary of the span, about as long as a short leaf summary."
            .repeat(20),
        token_count: 300,
        sources,
        level: 1,
        model: "bench".into(),
        digest: None,
    };
    for chunk in ids.chunks(100) {
        if chunk.len() < 100 {
            break;
        }
        let sources = chunk.iter().map(|id| NodeRef::Message(*id)).collect();
        let ApplyOutcome::Applied { .. } = store
            .apply_summary(fabricate(SummaryKind::Leaf, 0, sources), vec![])
            .expect("leaf")
        else {
            panic!("stale leaf");
        };
        // Condense greedily: while 4 summaries of one depth lead the same-depth run at the end.
        loop {
            let ctx = store.context(session).expect("context");
            let tail: Vec<_> = ctx.summaries.iter().rev().take(4).copied().collect();
            if tail.len() < 4 {
                break;
            }
            let depths: Vec<u32> = tail
                .iter()
                .map(|id| store.summary(*id).expect("summary").depth)
                .collect();
            if depths.iter().any(|d| *d != depths[0]) || depths[0] >= 5 {
                break;
            }
            let sources = tail.iter().rev().map(|id| NodeRef::Summary(*id)).collect();
            store
                .apply_summary(
                    fabricate(SummaryKind::Condensed, depths[0] + 1, sources),
                    vec![],
                )
                .expect("condensed");
        }
    }
    (store, session)
}

/// Appends to `session` a read of a small file and two large tool results (CSV, about 40k tokens
/// each): the tail then holds file records shown by reference.
fn append_file_tail(store: &Store, session: SessionId) {
    use lcm::core::message::{Part, Role};
    let csv = |seed: usize| {
        let mut out = String::from("id,name,price,date\n");
        for i in 0..3_500 {
            out.push_str(&format!(
                "{i},item-{seed}-{i},{}.{:02},2026-03-{:02}\n",
                i % 997,
                i % 100,
                1 + i % 28
            ));
        }
        out
    };
    let call = |id: &str, path: &str| NewMessage {
        role: Role::Assistant,
        parts: vec![Part::ToolCall {
            id: id.into(),
            name: "Read".into(),
            arguments: format!(r#"{{"file_path":"{path}"}}"#),
        }],
        ..NewMessage::text(Role::Assistant, "")
    };
    let result = |id: &str, content: String| NewMessage {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: id.into(),
            content,
            is_error: false,
        }],
        ..NewMessage::text(Role::Tool, "")
    };
    store
        .append_batch(
            session,
            vec![
                call("f1", "/src/lib.rs"),
                result("f1", "pub fn answer() -> u32 {\n    42\n}\n".into()),
                call("f2", "/data/a.csv"),
                result("f2", csv(1)),
                call("f3", "/data/b.csv"),
                result("f3", csv(2)),
            ],
        )
        .expect("append the file tail");
}

fn assembly(c: &mut Criterion) {
    let quick = std::env::var("LCM_BENCH_QUICK").is_ok_and(|v| v != "0");
    let sizes: &[u64] = if quick {
        &[100_000]
    } else {
        &[100_000, 1_000_000]
    };
    let mut group = c.benchmark_group("assembly");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    for &n in sizes {
        let tmp =
            tempfile::tempdir_in(std::env::var("LCM_BENCH_DIR").unwrap_or_else(|_| ".".into()))
                .expect("tmp");
        let t = Instant::now();
        let (store, session) = session_with_dag(tmp.path(), n);
        let ctx = assemble(&store, session).expect("assemble");
        let depth = ctx
            .items
            .iter()
            .filter_map(|i| match i {
                lcm::engine::ContextItem::Summary { summary, .. } => Some(summary.depth),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        eprintln!(
            "assembly fixture: {n} messages, {} items in context ({} tokens), max depth {depth}, built in {:.0?}",
            ctx.items.len(),
            ctx.tokens,
            t.elapsed()
        );
        group.bench_function(format!("assemble/{n}_messages"), |b| {
            b.iter(|| assemble(&store, session).expect("assemble"))
        });
        group.bench_function(format!("assemble_and_render_openai/{n}_messages"), |b| {
            b.iter(|| assemble(&store, session).expect("assemble").to_openai(None))
        });
        // The same context with the agent's marks: three summarised messages pinned (shown
        // in the pinned block) and four raw ones forgotten (shown as pointers).
        let count = store.session(session).expect("session").message_count;
        let reader = store.reader().expect("reader");
        let pinned = reader.session_messages(session, 0..3).expect("messages");
        let forgotten = reader
            .session_messages(session, count - 4..count)
            .expect("messages");
        drop(reader);
        for m in &pinned {
            store.pin(session, m.id, 100_000).expect("pin");
        }
        for m in &forgotten {
            store
                .forget(session, NodeRef::Message(m.id))
                .expect("forget");
        }
        group.bench_function(format!("assemble_with_marks/{n}_messages"), |b| {
            b.iter(|| assemble(&store, session).expect("assemble"))
        });
        for m in &pinned {
            store
                .clear_mark(session, NodeRef::Message(m.id), ContextMark::Pinned)
                .expect("unpin");
        }
        for m in &forgotten {
            store
                .clear_mark(session, NodeRef::Message(m.id), ContextMark::Forgotten)
                .expect("restore");
        }
        // The same session with large payloads in its tail: two tool results of about 40k
        // tokens each (file records, shown by reference) and a small file read.
        append_file_tail(&store, session);
        let ctx = assemble(&store, session).expect("assemble");
        eprintln!(
            "with file references: {} items in context ({} tokens)",
            ctx.items.len(),
            ctx.tokens
        );
        group.bench_function(format!("assemble_with_file_refs/{n}_messages"), |b| {
            b.iter(|| assemble(&store, session).expect("assemble"))
        });
        group.bench_function(
            format!("assemble_and_fit_32k_with_file_refs/{n}_messages"),
            |b| {
                b.iter(|| {
                    assemble(&store, session)
                        .expect("assemble")
                        .fit(32_000, 0, counter())
                        .expect("fits")
                })
            },
        );
    }
    group.finish();
}

/// A summariser that answers at once with a fixed short text: what remains of a compaction
/// pass is the engine's own work.
struct InstantSummarizer;

#[async_trait::async_trait]
impl Summarizer for InstantSummarizer {
    fn model(&self) -> &str {
        "instant"
    }
    async fn summarize(&self, _call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        Ok(Completion {
            text: "The span was summarised; decisions and paths kept.".into(),
            reasoning: None,
            finish_reason: None,
            input_tokens: None,
            output_tokens: None,
        })
    }
}

fn compaction_overhead(c: &mut Criterion) {
    // One leaf pass over 40 messages of about 100 tokens, summarised extractively to a small
    // target: the figure is the engine's cost (reads, rendering, the apply transaction with its
    // fsync) plus the extractive summariser, with no provider at all.
    let mut group = c.benchmark_group("compaction");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(5));
    let words = corpus::Words::new(20_000);
    let summarizer = ExtractiveSummarizer::new(counter());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let config = CompactionConfig {
        fresh_tail: 0,
        leaf_chunk_tokens: 4_000,
        leaf_target_tokens: 200,
        max_passes: 1,
        ..CompactionConfig::default()
    };
    let tmp = tempfile::tempdir().expect("tmp");
    let store = Arc::new(
        Store::open(tmp.path().join("lcm.redb"), StoreOptions::new(counter())).expect("open"),
    );
    let mut round = 0u64;
    let instant = InstantSummarizer;
    let structured = StructuredSummarizer::new(counter());
    for (name, summarizer) in [
        ("one_leaf_pass_engine_only", &instant as &dyn Summarizer),
        ("one_leaf_pass_extractive", &summarizer as &dyn Summarizer),
        ("one_leaf_pass_structured", &structured as &dyn Summarizer),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let session = store
                        .create_session(&format!("s{round}"), None)
                        .expect("session");
                    let batch: Vec<NewMessage> = (0..40)
                        .map(|i| corpus::message(&words, round * 40 + i))
                        .collect();
                    store.append_batch(session, batch).expect("append");
                    round += 1;
                    let t = Instant::now();
                    let report = runtime
                        .block_on(compact(&store, session, 100, &config, summarizer, |_| {}))
                        .expect("compact");
                    total += t.elapsed();
                    assert_eq!(report.passes.len(), 1);
                }
                total
            })
        });
    }
    group.finish();

    let mut text = String::new();
    let mut k = 0;
    while text.len() < 1 << 20 {
        text.push_str(&lcm::core::message::search_text(
            &corpus::message(&words, k).parts,
        ));
        text.push('\n');
        k += 1;
    }
    let mut group = c.benchmark_group("extractive");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("summarize_1MiB_to_1200_tokens", |b| {
        b.iter(|| summarizer.summarize_text(std::hint::black_box(&text), 1_200))
    });
    group.finish();

    // The structured summariser on agent work: a span of tool exchanges (commands with output,
    // reads, edits) of about 1 MiB, as the compactor gives it: the digest from the messages,
    // then its rendering to a leaf target; the extractive summariser on the same span's text.
    let span = agent_span(1 << 20);
    let span_text: String = span
        .iter()
        .map(|m| lcm::core::message::search_text(&m.parts).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    let none = |_: &str| None;
    let mut group = c.benchmark_group("structured");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Bytes(span_text.len() as u64));
    group.bench_function("digest_and_render_1MiB_agent_span_to_1200_tokens", |b| {
        b.iter(|| {
            let digest = extract(std::hint::black_box(&span), &OpenItems::default(), &none);
            render(&digest, 0, 1_200, &counter())
        })
    });
    group.bench_function("extractive_same_span_to_1200_tokens", |b| {
        b.iter(|| summarizer.summarize_text(std::hint::black_box(&span_text), 1_200))
    });
    group.finish();
}

/// Agent work of about `bytes` bytes: rounds of a statement of intent, a shell command with
/// its output (every fifth one failing), a file read and an edit.
fn agent_span(bytes: usize) -> Vec<lcm::core::message::Message> {
    use lcm::core::message::{Message, Part, Role, SourceFormat};
    let words = corpus::Words::new(20_000);
    let mut out: Vec<Message> = Vec::new();
    // Appends a message; returns the bytes of its text.
    let push = |role: Role, parts: Vec<Part>, out: &mut Vec<Message>| -> usize {
        let bytes = lcm::core::message::search_text(&parts).len();
        let n = out.len() as u64;
        out.push(Message {
            id: lcm::MessageId(n),
            session: SessionId(0),
            seq: n,
            role,
            created_at: lcm::core::time::Timestamp(0),
            token_count: 0,
            parts,
            source: SourceFormat::Lcm,
        });
        bytes
    };
    let mut i = 0u64;
    let mut size = 0;
    while size < bytes {
        let prose = lcm::core::message::search_text(&corpus::message(&words, i).parts).into_owned();
        let call = format!("call_{i}");
        size += push(
            Role::Assistant,
            vec![
                Part::Text {
                    text: format!("Now let me run the tests for module_{i}. {prose}"),
                },
                Part::ToolCall {
                    id: call.clone(),
                    name: "Bash".into(),
                    arguments: format!(
                        r#"{{"command":"cargo test -p crate_{} module_{i}"}}"#,
                        i % 7
                    ),
                },
            ],
            &mut out,
        );
        let output = if i.is_multiple_of(5) {
            format!("Exit code 101\n{prose}\nerror[E0308]: mismatched types in module_{i}\n")
        } else {
            format!("{prose}\ntest result: ok. 12 passed; 0 failed\n")
        };
        size += push(
            Role::Tool,
            vec![Part::ToolResult {
                call_id: call,
                content: output,
                is_error: i.is_multiple_of(5),
            }],
            &mut out,
        );
        let (read, edit) = (format!("read_{i}"), format!("edit_{i}"));
        size += push(
            Role::Assistant,
            vec![
                Part::ToolCall {
                    id: read.clone(),
                    name: "Read".into(),
                    arguments: format!(r#"{{"file_path":"/repo/src/module_{}.rs"}}"#, i % 40),
                },
                Part::ToolCall {
                    id: edit.clone(),
                    name: "Edit".into(),
                    arguments: format!(
                        r#"{{"file_path":"/repo/src/module_{}.rs","old_string":"a","new_string":"b"}}"#,
                        i % 40
                    ),
                },
            ],
            &mut out,
        );
        size += push(
            Role::Tool,
            vec![
                Part::ToolResult {
                    call_id: read,
                    content: prose.repeat(3),
                    is_error: false,
                },
                Part::ToolResult {
                    call_id: edit,
                    content: "The file has been updated.".into(),
                    is_error: false,
                },
            ],
            &mut out,
        );
        i += 1;
    }
    out
}

/// A whole imported history compacted at once: a session of `n` messages appended with no
/// compaction (as `lcm import` leaves it), then compaction runs until the context is under the
/// goal of a 128k-token budget, with the offline structured summariser. The cost of a pass
/// must not grow with the raw history still waiting, or this is quadratic in `n`.
fn compaction_of_history(c: &mut Criterion) {
    let mut group = c.benchmark_group("compaction_history");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("rt");
    let summarizer = StructuredSummarizer::new(counter());
    let config = CompactionConfig::default();
    let sizes: &[u64] = if std::env::var_os("LCM_BENCH_QUICK").is_some() {
        &[10_000]
    } else {
        &[10_000, 100_000]
    };
    for &n in sizes {
        let template = tempfile::tempdir().expect("tmp");
        let session = {
            let store = Store::open(
                template.path().join("lcm.redb"),
                StoreOptions::new(counter()),
            )
            .expect("open");
            let session = store.create_session("history", None).expect("session");
            append_corpus(&store, session, n);
            session
        };
        group.throughput(Throughput::Elements(n));
        group.bench_function(format!("{n}_messages_to_128k_budget"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let copy = tempfile::tempdir().expect("tmp");
                    std::fs::copy(
                        template.path().join("lcm.redb"),
                        copy.path().join("lcm.redb"),
                    )
                    .expect("copy");
                    let store =
                        Store::open(copy.path().join("lcm.redb"), StoreOptions::new(counter()))
                            .expect("open");
                    let t = Instant::now();
                    loop {
                        let report = runtime
                            .block_on(compact(
                                &store,
                                session,
                                128_000,
                                &config,
                                &summarizer,
                                |_| {},
                            ))
                            .expect("compact");
                        if report.reached_goal || report.passes.is_empty() {
                            assert!(report.reached_goal, "compaction stopped above its goal");
                            break;
                        }
                    }
                    total += t.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    assembly,
    compaction_overhead,
    compaction_of_history
);
criterion_main!(benches);
