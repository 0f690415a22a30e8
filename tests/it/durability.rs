//! Durability: a child process appends messages (one at a time and in batches) and prints each
//! acknowledged id; the test kills it with SIGKILL at a random moment, reopens the store, and
//! finds every acknowledged message intact. Repeated with several seeds. The same for imports
//! of session files, whose sessions are created without a sync of their own (made durable by
//! the import's append).
//!
//! The child is this same test binary, re-run with an environment variable that makes the test
//! function play the child's part.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lcm::MessageId;
use lcm::core::message::{NewMessage, Role};
use lcm::store::Store;
use lcm::store::import::{ImportOptions, import_file};

const CHILD_ENV: &str = "LCM_DURABILITY_CHILD_STORE";
const TEST_NAME: &str = "acknowledged_appends_survive_sigkill";
const IMPORT_CHILD_ENV: &str = "LCM_DURABILITY_IMPORT_CHILD_STORE";
const IMPORT_TEST_NAME: &str = "acknowledged_imports_survive_sigkill";

fn text_for(n: u64) -> String {
    format!(
        "message {n}: the quick brown fox {} jumps",
        n.wrapping_mul(2654435761)
    )
}

/// The child: appends forever, printing `ack <id> <n>` after each append returns.
fn child(path: &str) {
    let store = Store::open(path, common::store_options()).expect("child opens store");
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
    for seed in 1..=6u64 {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("lcm.redb");
        let acked = acknowledged_before_sigkill(TEST_NAME, CHILD_ENV, &path, seed, |rest| {
            let mut it = rest.split(' ');
            let id: u64 = it.next()?.parse().ok()?;
            let n: u64 = it.next()?.parse().ok()?;
            Some((id, n))
        });

        let store = Store::open(&path, common::store_options()).unwrap();
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

/// Messages in each session file the import child writes.
const LINES_PER_FILE: u64 = 3;

/// The child of the import test: writes session file after session file (each a new session
/// in lcm's JSONL format) next to the store, imports each, and prints `ack <n>` when the
/// import returns.
fn import_child(path: &str) {
    let store = Store::open(path, common::store_options()).expect("child opens store");
    let dir = std::path::Path::new(path).with_extension("files");
    std::fs::create_dir_all(&dir).expect("files dir");
    let mut out = std::io::stdout().lock();
    for n in 0u64.. {
        let file = dir.join(format!("{n}.jsonl"));
        let lines: String = (0..LINES_PER_FILE)
            .map(|k| {
                format!(
                    "{{\"session\":\"imported-{n}\",\"role\":\"user\",\"created_at\":\"2026-02-10T21:11:56Z\",\"key\":\"k{k}\",\"parts\":[{{\"type\":\"text\",\"text\":\"{}\"}}]}}\n",
                    text_for(n * LINES_PER_FILE + k)
                )
            })
            .collect();
        std::fs::write(&file, lines).expect("write session file");
        let report =
            import_file(&store, &file, &ImportOptions::default(), |_, _| {}).expect("import");
        assert_eq!(report.imported, LINES_PER_FILE);
        writeln!(out, "ack {n}").expect("stdout");
        out.flush().expect("flush");
    }
}

#[test]
fn acknowledged_imports_survive_sigkill() {
    if let Ok(path) = std::env::var(IMPORT_CHILD_ENV) {
        import_child(&path);
        return;
    }
    for seed in 1..=4u64 {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("lcm.redb");
        let acked =
            acknowledged_before_sigkill(IMPORT_TEST_NAME, IMPORT_CHILD_ENV, &path, seed, |n| {
                n.parse::<u64>().ok()
            });

        let store = Store::open(&path, common::store_options()).unwrap();
        for n in &acked {
            let session = store
                .session_id_for_key(&format!("imported-{n}"))
                .unwrap()
                .unwrap_or_else(|| panic!("seed {seed}: acknowledged session {n} lost"));
            let texts: Vec<String> = store
                .session_messages(session, 0..u64::MAX)
                .unwrap()
                .iter()
                .map(|m| m.search_text().into_owned())
                .collect();
            let expected: Vec<String> = (0..LINES_PER_FILE)
                .map(|k| text_for(n * LINES_PER_FILE + k))
                .collect();
            assert_eq!(texts, expected, "seed {seed}: session {n}");
        }
        // Every session the store holds, acknowledged or not, is whole: a session without its
        // messages would be a session created by an import that never stored them.
        for info in store.sessions().unwrap() {
            assert_eq!(
                info.message_count, LINES_PER_FILE,
                "seed {seed}: {} holds {} messages",
                info.key, info.message_count
            );
        }
        eprintln!("seed {seed}: {} imports acknowledged", acked.len());
    }
}

/// Runs this test binary again as the child of test `test` (with `env` naming the store at
/// `path`), gathers what it acknowledges (`ack <rest>` lines, read by `parse`) and kills it with
/// SIGKILL at a seeded random moment after its first acknowledgement.
fn acknowledged_before_sigkill<T: Send + 'static>(
    test: &str,
    env: &str,
    path: &Path,
    seed: u64,
    parse: fn(&str) -> Option<T>,
) -> Vec<T> {
    let exe = std::env::current_exe().unwrap();
    let test = common::test_name(module_path!(), test);
    let mut child = Command::new(&exe)
        .args(["--exact", &test, "--nocapture", "--test-threads=1"])
        .env(env, path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if let Some(ack) = line.strip_prefix("ack ") {
                let ack = parse(ack).unwrap_or_else(|| panic!("unreadable ack: {line}"));
                if tx.send(ack).is_err() {
                    break;
                }
            }
        }
    });
    // Wait for the child to be working, then kill it at a seeded random moment.
    let mut rng = lcm::core::rng::SplitMix64::new(seed);
    let mut acked = vec![
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the child never acknowledged anything"),
    ];
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
    acked
}
