//! Durability: a child process appends messages (one at a time and in batches) and prints each
//! acknowledged id; the test kills it with SIGKILL at a random moment, reopens the store, and
//! finds every acknowledged message intact. Repeated with several seeds.
//!
//! The child is this same test binary, re-run with an environment variable that makes the test
//! function play the child's part.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lcm::core::message::{NewMessage, Role};
use lcm::store::{Store, StoreOptions};
use lcm::{Encoding, MessageId, TokenCounter};

const CHILD_ENV: &str = "LCM_DURABILITY_CHILD_STORE";
const TEST_NAME: &str = "acknowledged_appends_survive_sigkill";

fn options() -> StoreOptions {
    StoreOptions {
        counter: TokenCounter::new(Encoding::O200kBase),
    }
}

fn text_for(n: u64) -> String {
    format!(
        "message {n}: the quick brown fox {} jumps",
        n.wrapping_mul(2654435761)
    )
}

/// The child: appends forever, printing `ack <id> <n>` after each append returns.
fn child(path: &str) {
    let store = Store::open(path, options()).expect("child opens store");
    let session = store.ensure_session("durability").expect("session");
    let mut out = std::io::stdout().lock();
    let mut n = 0u64;
    loop {
        if n.is_multiple_of(3) {
            let batch: Vec<NewMessage> = (n..n + 8)
                .map(|k| NewMessage::text(Role::User, text_for(k)))
                .collect();
            let results = store.append_batch(session, batch).expect("append batch");
            for (k, r) in (n..).zip(results) {
                writeln!(out, "ack {} {k}", r.id.0).expect("stdout");
            }
            n += 8;
        } else {
            let r = store
                .append(session, NewMessage::text(Role::Assistant, text_for(n)))
                .expect("append");
            writeln!(out, "ack {} {n}", r.id.0).expect("stdout");
            n += 1;
        }
        out.flush().expect("flush");
    }
}

#[test]
fn acknowledged_appends_survive_sigkill() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child(&path);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for seed in 1..=6u64 {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("lcm.redb");
        let mut child = Command::new(&exe)
            .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.strip_prefix("ack ") {
                    let mut it = rest.split(' ');
                    let id: u64 = it.next().unwrap().parse().unwrap();
                    let n: u64 = it.next().unwrap().parse().unwrap();
                    if tx.send((id, n)).is_err() {
                        break;
                    }
                }
            }
        });
        // Wait for the child to be appending, then kill it at a seeded random moment.
        let mut rng = common::SplitMix(seed);
        let mut acked = Vec::new();
        let first = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("child never appended");
        acked.push(first);
        let deadline = Instant::now() + Duration::from_millis(20 + rng.below(400));
        while Instant::now() < deadline {
            if let Ok(ack) = rx.recv_timeout(Duration::from_millis(1)) {
                acked.push(ack);
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        acked.extend(rx.try_iter());

        let store = Store::open(&path, options()).unwrap();
        for (id, n) in &acked {
            let m = store.message(MessageId(*id)).unwrap_or_else(|e| {
                panic!("seed {seed}: acknowledged msg_{id} lost after SIGKILL: {e}")
            });
            assert_eq!(
                m.search_text(),
                text_for(*n),
                "seed {seed}: msg_{id} changed"
            );
        }
        // The store is consistent: the session's count matches the messages it lists.
        let session = store.session_id_for_key("durability").unwrap().unwrap();
        let info = store.session(session).unwrap();
        let listed = store.session_messages(session, 0..u64::MAX).unwrap();
        assert_eq!(info.message_count as usize, listed.len());
        assert!(listed.len() >= acked.len());
        assert!(listed.iter().enumerate().all(|(i, m)| m.seq == i as u64));
        eprintln!(
            "seed {seed}: {} acknowledged, {} stored",
            acked.len(),
            listed.len()
        );
    }
}
