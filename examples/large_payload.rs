//! Ingest of one message carrying a large payload, measured: time and peak memory of appending a
//! tool result of `--mb` MiB (default 10) of CSV to a fresh on-disk store (durable commit,
//! exact token count, SHA-256, exploration summary, file record), then the context for a
//! 32,000-token window. Peak memory is the process's high-water mark (Linux `VmHWM`) before and
//! after, so run it on its own:
//!
//! ```sh
//! cargo run --release --example large_payload -- --mb 10
//! ```

#[path = "../benches/support/orders.rs"]
mod orders;

use std::time::Instant;

use lcm::core::message::{NewMessage, Part, Role};
use lcm::engine::assemble;
use lcm::store::{Store, StoreOptions};
use lcm::{Encoding, TokenCounter};

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = match args.iter().position(|a| a == "--mb") {
        Some(i) => args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("--mb needs a number"))?
            .parse()?,
        None => 10,
    };
    let counter = TokenCounter::new(Encoding::O200kBase);
    // Load the tokenizer before measuring (a one-time cost of every process that counts).
    counter.count_text("warm up");
    let (csv, rows) = orders::orders_csv(mb << 20);
    let bytes = csv.len();
    let tmp = tempfile::tempdir()?;
    let store = Store::open(tmp.path().join("lcm.redb"), StoreOptions::new(counter))?;
    let session = store.create_session("large", None)?;
    store.append(
        session,
        NewMessage {
            parts: vec![Part::ToolCall {
                id: "c1".into(),
                name: "Read".into(),
                arguments: r#"{"file_path":"/data/orders.csv"}"#.into(),
            }],
            ..NewMessage::text(Role::Assistant, "")
        },
    )?;
    let message = NewMessage {
        parts: vec![Part::ToolResult {
            call_id: "c1".into(),
            content: csv,
            is_error: false,
        }],
        ..NewMessage::text(Role::Tool, "")
    };
    let before = peak_rss_mib();
    let started = Instant::now();
    let id = store.append(session, message)?.id;
    let append = started.elapsed();
    let after = peak_rss_mib();
    let started = Instant::now();
    let ctx = assemble(&store, session)?.fit(32_000, 0, counter)?;
    let context = started.elapsed();
    let reader = store.reader()?;
    let file = reader
        .message_files(id)?
        .and_then(|f| f.refs.first().map(|r| r.file))
        .ok_or_else(|| anyhow::anyhow!("no file record"))?;
    let info = reader.file(file)?;
    println!(
        "payload: {:.1} MiB, {} rows, {} tokens; append (durable, with its file record): {:.0?}; \
         context for 32k: {} tokens in {:.0?}",
        bytes as f64 / 1048576.0,
        rows,
        info.token_count,
        append,
        ctx.tokens,
        context
    );
    if let (Some(before), Some(after)) = (before, after) {
        println!(
            "peak memory: {before:.0} MiB before the append (payload built), {after:.0} MiB after: +{:.0} MiB",
            after - before
        );
    }
    println!(
        "{}: {}",
        info.id,
        info.exploration.lines().next().unwrap_or("")
    );
    Ok(())
}
