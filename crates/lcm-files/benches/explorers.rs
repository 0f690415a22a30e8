//! Throughput of `explore` per kind on generated inputs of about 10 MB each.
//!
//! Run with `cargo bench -p lcm-files`. Each input is built once, deterministically; the
//! measured call is the whole `explore` (detection by path, exploration, token cap of 1,000).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_files::{ExploreInput, explore};

const TARGET: usize = 10 * 1024 * 1024;

fn csv() -> String {
    let mut s = String::from("id,name,price,date,category,in_stock,comment\n");
    let mut i = 0u64;
    while s.len() < TARGET {
        s.push_str(&format!(
            "{i},Product {i},{}.{:02},2023-{:02}-{:02},{},{},\"note, with comma {}\"\n",
            i % 1000,
            i % 100,
            1 + i % 12,
            1 + i % 28,
            ["tools", "garden", "kitchen"][(i % 3) as usize],
            i.is_multiple_of(2),
            i % 17
        ));
        i += 1;
    }
    s
}

fn record(i: u64) -> String {
    format!(
        r#"{{"id":{i},"type":"{}","user":{{"name":"user {}","email":"u{}@example.com","tags":["a","b"]}},"total":{}.5,"items":[{{"sku":"S{}","qty":{}}}],"paid":{}}}"#,
        ["order", "refund"][(i % 2) as usize],
        i % 5000,
        i % 5000,
        i % 997,
        i % 300,
        1 + i % 4,
        i.is_multiple_of(3)
    )
}

fn json() -> String {
    let mut s = String::from("[");
    let mut i = 0u64;
    while s.len() < TARGET {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&record(i));
        i += 1;
    }
    s.push(']');
    s
}

fn jsonl() -> String {
    let mut s = String::new();
    let mut i = 0u64;
    while s.len() < TARGET {
        s.push_str(&record(i));
        s.push('\n');
        i += 1;
    }
    s
}

fn rust() -> String {
    let mut s = String::from("use std::collections::HashMap;\nuse std::sync::Arc;\n\n");
    let mut i = 0u64;
    while s.len() < TARGET {
        s.push_str(&format!(
            "/// Item {i}.\n#[derive(Debug, Clone)]\npub struct Item{i} {{\n    pub id: u64,\n    name: String,\n    tags: Vec<String>,\n}}\n\n\
             impl Item{i} {{\n    pub fn new(id: u64, name: &str) -> Self {{\n        Item{i} {{ id, name: name.to_string(), tags: Vec::new() }}\n    }}\n\n\
             \x20   pub fn score(&self, weights: &HashMap<String, f64>) -> f64 {{\n        self.tags.iter().filter_map(|t| weights.get(t)).sum()\n    }}\n}}\n\n\
             pub fn process_{i}(items: &[Item{i}], limit: usize) -> Result<Vec<u64>, String> {{\n    let mut out = Vec::new();\n    for item in items.iter().take(limit) {{\n        if item.id % 2 == 0 {{ out.push(item.id); }}\n    }}\n    Ok(out)\n}}\n\n"
        ));
        i += 1;
    }
    s
}

fn log() -> String {
    let mut s = String::new();
    let mut i = 0u64;
    while s.len() < TARGET {
        let level = match i % 200 {
            0 => "ERROR",
            1..=9 => "WARN",
            10..=29 => "DEBUG",
            _ => "INFO",
        };
        s.push_str(&format!(
            "2024-06-01T{:02}:{:02}:{:02}.{:03}Z {level} [worker-{}] request id={:08x} path=/api/v1/items/{} served in {}ms\n",
            i / 3_600_000 % 24,
            i / 60_000 % 60,
            i / 1000 % 60,
            i % 1000,
            i % 8,
            i * 2_654_435_761 % 0xffff_ffff,
            i % 5000,
            i % 250
        ));
        i += 1;
    }
    s
}

fn markdown() -> String {
    let mut s = String::from("# Handbook\n\nThis is the handbook.\n\n");
    let mut i = 0u64;
    while s.len() < TARGET {
        s.push_str(&format!(
            "## Section {i}\n\nSome prose about section {i}, with a [link](https://example.com/{i}) and *emphasis*. \
             It goes on for a while so that paragraphs have a realistic length for documentation.\n\n\
             ### Example {i}\n\n```rust\nfn example_{i}() -> u32 {{ {i} }}\n```\n\n- item one\n- item two\n\n"
        ));
        i += 1;
    }
    s
}

fn text() -> String {
    let words = [
        "the",
        "agent",
        "context",
        "window",
        "summary",
        "lossless",
        "memory",
        "store",
        "message",
        "token",
        "budget",
        "compaction",
        "retrieval",
        "model",
        "session",
        "payload",
    ];
    let mut s = String::new();
    let mut i = 0usize;
    while s.len() < TARGET {
        s.push_str(words[i % words.len()]);
        i += 1;
        s.push(if i.is_multiple_of(13) { '\n' } else { ' ' });
    }
    s
}

fn bench(c: &mut Criterion) {
    let counter = TokenCounter::new(Encoding::O200kBase);
    // Load the token tables before measuring.
    counter.count_text("warm up");
    let inputs: Vec<(&str, &str, String)> = vec![
        ("csv", "data.csv", csv()),
        ("json", "data.json", json()),
        ("jsonl", "data.jsonl", jsonl()),
        ("rust", "src/lib.rs", rust()),
        // Code is parsed up to 512 KiB: this one is parsed whole (the parse rate).
        (
            "rust_512kib",
            "src/lib.rs",
            rust()[..512 * 1024].to_string(),
        ),
        ("log", "app.log", log()),
        ("markdown", "README.md", markdown()),
        ("text", "notes.txt", text()),
    ];
    let mut group = c.benchmark_group("explore");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6));
    for (name, path, content) in &inputs {
        group.throughput(Throughput::Bytes(content.len() as u64));
        group.bench_function(*name, |b| {
            b.iter(|| {
                let e = explore(
                    &ExploreInput {
                        path: Some(path),
                        mime_type: None,
                        bytes: black_box(content.as_bytes()),
                    },
                    &counter,
                    1_000,
                );
                black_box(e)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
