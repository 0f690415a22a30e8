//! Following live transcripts (`lcm import --follow`): the latency from a write to the
//! transcript until its message is stored and indexed (searchable by every grep mode), and
//! what a `lcm grep` costs through the follower meanwhile (the CLI beside a process holding the
//! data directory: connect, run, stream the answer back).
//!
//! A real follower process on a real folder: each iteration appends one line to a transcript
//! and waits for the follower to report it on its stdout, which it does once the round's
//! messages are committed and the index has caught up. Figures: docs/PERFORMANCE.md.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};

fn lcm() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lcm"));
    command.env_remove("LCM_CONFIG").env_remove("LCM_DATA_DIR");
    command
}

struct Follower {
    child: Child,
    stdout: BufReader<ChildStdout>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(data: &Path, watched: &Path) -> Follower {
    let mut child = lcm()
        .arg("--data-dir")
        .arg(data)
        .args(["import", "--follow"])
        .arg(watched)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lcm import --follow");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut said = String::new();
    while !said.contains("following") {
        said.clear();
        assert!(
            stderr.read_line(&mut said).expect("stderr") > 0,
            "the follower ended"
        );
    }
    // Drained on a thread so the follower never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while stderr.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    Follower { child, stdout }
}

fn append(path: &Path, n: u64) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the transcript");
    writeln!(
        file,
        r#"{{"session":"live","role":"user","key":"k{n}","content":"message number {n} of a live session"}}"#
    )
    .expect("append");
}

/// Waits for the follower to report a round that stored messages.
fn reported(follower: &mut Follower) {
    let mut line = String::new();
    loop {
        line.clear();
        let n = follower.stdout.read_line(&mut line).expect("stdout");
        assert!(n > 0, "the follower ended");
        if line.contains(" new messages") {
            return;
        }
    }
}

/// One `lcm grep` on `data`: the bytes it printed.
fn grep(data: &Path) -> usize {
    let out = lcm()
        .arg("--data-dir")
        .arg(data)
        .args(["grep", "--json", "message number 1 "])
        .output()
        .expect("lcm grep");
    assert!(out.status.success());
    out.stdout.len()
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let watched = tmp.path().join("watched");
    std::fs::create_dir_all(&watched).expect("folder");
    let transcript = watched.join("live.jsonl");
    append(&transcript, 0);
    let data = tmp.path().join("data");
    let mut follower = start(&data, &watched);
    let mut n = 1;

    // One pass printed as a table first: p50 / p99 of 200 writes.
    let mut latencies = Vec::new();
    for _ in 0..200 {
        let t0 = Instant::now();
        append(&transcript, n);
        n += 1;
        reported(&mut follower);
        latencies.push(t0.elapsed());
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    eprintln!(
        "follow: write -> stored and indexed over {} writes: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        latencies[latencies.len() - 1].as_secs_f64() * 1e3
    );

    let mut group = c.benchmark_group("follow");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(10));
    group.bench_function("write_to_searchable", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let t0 = Instant::now();
                append(&transcript, n);
                n += 1;
                reported(&mut follower);
                total += t0.elapsed();
            }
            total
        });
    });
    group.bench_function("grep_through_the_follower", |b| {
        b.iter(|| grep(&data));
    });
    group.finish();
    drop(follower);
    // The same grep alone, on the store with nobody holding it.
    c.bench_function("follow/grep_alone", |b| {
        b.iter(|| grep(&data));
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
