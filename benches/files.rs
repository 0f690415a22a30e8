//! Large payloads: the append of one message carrying a 10 MiB tool result (its file record
//! and exploration summary included), and the context for a 32,000-token window that shows it
//! by reference. Explorer throughput per kind: `cargo bench -p lcm-files`.

#[path = "support/orders.rs"]
mod orders;

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lcm::core::config::Config;
use lcm::core::message::NewMessage;
use lcm::search::DataDir;

/// One message carrying a 10 MiB tool result (a CSV a `Read` returned), appended durably to a
/// fresh store: token count, SHA-256, exploration summary and file record included. Peak memory:
/// `examples/large_payload.rs`.
fn large_payload(c: &mut Criterion) {
    use lcm::core::message::{Part, Role};
    let (csv, _) = orders::orders_csv(10 << 20);
    let config = Config::default();
    let mut group = c.benchmark_group("large_payload");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Bytes(csv.len() as u64));
    group.bench_function("lcm/append_10MiB_tool_result", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let tmp = tempfile::tempdir().expect("tmp");
                let data = DataDir::open(tmp.path(), &config).expect("open");
                let session = data.store.create_session("large", None).expect("session");
                data.store
                    .append(
                        session,
                        NewMessage {
                            parts: vec![Part::ToolCall {
                                id: "c1".into(),
                                name: "Read".into(),
                                arguments: r#"{"file_path":"/data/orders.csv"}"#.into(),
                            }],
                            ..NewMessage::text(Role::Assistant, "")
                        },
                    )
                    .expect("call");
                let message = NewMessage {
                    parts: vec![Part::ToolResult {
                        call_id: "c1".into(),
                        content: csv.clone(),
                        is_error: false,
                    }],
                    ..NewMessage::text(Role::Tool, "")
                };
                let t = Instant::now();
                data.store.append(session, message).expect("append");
                total += t.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, large_payload);
criterion_main!(benches);
