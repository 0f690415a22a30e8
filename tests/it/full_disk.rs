//! A real full disk: the data directory on a small tmpfs that the test mounts (and unmounts),
//! filled up by a file of zeros. Appends through the runtime, compactions, and the CLI's import
//! and compaction fail with a clear error that says the disk is full; nothing acknowledged is
//! lost; once the filler is removed the same runtime (no restart) and the next command work
//! again, a second import completes the first without duplicates, and the integrity check is
//! clean. Mounting needs root (or `CAP_SYS_ADMIN`): without it each test prints `SKIPPED: ...`
//! with the reason and returns.
//!
//! The injected variants (ENOSPC and EIO on writes and syncs, without a mount) are in
//! `lcm-store`'s `disk_faults`, the runtime's and the HTTP API's tests.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use lcm::core::config::Config;
use lcm::core::ids::MessageId;
use lcm::core::message::{NewMessage, Role};
use lcm::core::rng::work_words;
use lcm::core::tokens::{Encoding, TokenCounter};
use lcm::engine::runtime::{Runtime, RuntimeError, RuntimeOptions};
use lcm::llm::extractive::ExtractiveSummarizer;

use crate::common::{lcm, open_closed_store};

/// A tmpfs mounted on a temporary directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
    filler: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=`), or says why it could not.
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("no temporary directory: {e}"))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let filler = dir.path().join("filler");
        Ok(Tmpfs { dir, filler })
    }

    /// Mounts one, or prints `SKIPPED: <test>: <why>` and gives `None`.
    fn for_test(test: &str, size: &str) -> Option<Tmpfs> {
        match Tmpfs::mount(size) {
            Ok(fs) => Some(fs),
            Err(why) => {
                println!("SKIPPED: {test}: {why}");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the file system: a file of zeros grows until the disk refuses it.
    fn fill(&self) {
        let mut file = std::fs::File::create(&self.filler).expect("filler");
        let chunk = vec![0u8; 64 << 10];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(
                        e.raw_os_error(),
                        Some(28),
                        "the filler stops at ENOSPC: {e}"
                    );
                    break;
                }
            }
        }
        // Whatever a page-sized write could still squeeze in.
        while file.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
    }

    /// Fills the file system, then gives `bytes` back (the filler shrinks).
    fn fill_leaving(&self, bytes: u64) {
        self.fill();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.filler)
            .expect("filler");
        let len = file.metadata().expect("filler size").len();
        file.set_len(len.saturating_sub(bytes))
            .expect("shrink the filler");
    }

    /// Space returns.
    fn free(&self) {
        std::fs::remove_file(&self.filler).expect("remove the filler");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let status = Command::new("umount").arg(self.dir.path()).status();
        if !status.is_ok_and(|s| s.success()) {
            // Something still holds a file there: detach it, it goes when released.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

fn config() -> Config {
    let mut config = Config::default();
    config.compaction.fresh_tail = 8;
    config.compaction.leaf_chunk_tokens = 500;
    config.compaction.leaf_target_tokens = 120;
    config.runtime.restart_backoff_ms = 5;
    config.runtime.index_interval_ms = 50;
    config
}

/// About 1,000 tokens: the disk fills in a few hundred appends.
fn big_message(turn: usize) -> NewMessage {
    let text = format!("turn {turn}: {}", work_words(turn as u64, 1000));
    let role = if turn.is_multiple_of(2) {
        Role::User
    } else {
        Role::Assistant
    };
    NewMessage::text(role, text).with_source_key(format!("t{turn}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_and_compactions_on_a_full_tmpfs_fail_cleanly_and_recover() {
    let Some(fs) = Tmpfs::for_test("full_disk::appends_and_compactions", "24m") else {
        return;
    };
    let data = fs.path().join("data");
    let summarizer = Arc::new(ExtractiveSummarizer::new(TokenCounter::new(
        Encoding::O200kBase,
    )));
    let rt = Runtime::open(RuntimeOptions::dir(&data, config()).with_summarizer(summarizer))
        .await
        .expect("runtime on the tmpfs");
    let s = rt.session("full").await.unwrap();
    let mut acked: Vec<MessageId> = Vec::new();
    for t in 0..20 {
        acked.push(s.append(big_message(t)).await.expect("room yet").id);
    }

    fs.fill();
    // The store file may still have room in pages it holds: append until the disk refuses.
    let mut refused = None;
    let mut turn = 20;
    while turn < 20_000 {
        match s.append(big_message(turn)).await {
            Ok(a) => acked.push(a.id),
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
        turn += 1;
    }
    let error = refused.expect("a full disk refuses an append");
    match &error {
        RuntimeError::Store(e) => assert!(e.is_disk_full(), "{e}"),
        other => panic!("a full disk is a storage error, got {other:?}"),
    }
    // A compaction on the full disk cannot commit: the context request still returns
    // (an error, or the context as it stands within the budget), never hangs.
    let during = tokio::time::timeout(Duration::from_secs(60), s.context(4_000))
        .await
        .expect("a context request on a full disk returns");
    if let Ok(ctx) = &during {
        assert!(ctx.tokens <= 4_000, "{}", ctx.tokens);
    }
    let summaries_before = rt.store().summary_count().unwrap_or(0);

    // Space returns: the same runtime appends and compacts again.
    fs.free();
    for t in turn..turn + 10 {
        acked.push(
            s.append(big_message(t))
                .await
                .expect("appends work again once space returns")
                .id,
        );
    }
    let ctx = tokio::time::timeout(Duration::from_secs(60), s.context(4_000))
        .await
        .expect("context")
        .expect("compaction works again");
    assert!(ctx.tokens <= 4_000, "{}", ctx.tokens);
    assert!(rt.store().summary_count().unwrap() > summaries_before);
    let outcome = rt.check_integrity(false).await.unwrap();
    assert!(outcome.report.is_clean(), "{:?}", outcome.report.violations);
    rt.shutdown(Duration::from_secs(10)).await.unwrap();
    drop(s);
    drop(rt);

    // Every acknowledged append is there once, in order; the refused one is not.
    let store = open_closed_store(&data).expect("reopen");
    let session = store.session_id_for_key("full").unwrap().unwrap();
    let stored: Vec<MessageId> = store
        .session_messages(session, 0..u64::MAX)
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(stored, acked);
}

/// An OpenAI-messages JSONL transcript of `n` messages of about 300 tokens, numbered.
fn transcript(path: &Path, tag: &str, n: usize) {
    let mut out = String::new();
    for i in 0..n {
        let role = if i.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        };
        let body = format!(
            "{tag} message {i}: {}",
            "lorem ipsum dolor sit amet ".repeat(60)
        );
        out.push_str(&serde_json::json!({"role": role, "content": body}).to_string());
        out.push('\n');
    }
    std::fs::write(path, out).expect("transcript");
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The message numbers of session `key`, in order (from their text).
fn numbers(data: &Path, key: &str, tag: &str) -> Vec<usize> {
    let store = open_closed_store(data).expect("open");
    let Some(session) = store.session_id_for_key(key).unwrap() else {
        return Vec::new();
    };
    store
        .session_messages(session, 0..u64::MAX)
        .unwrap()
        .iter()
        .map(|m| {
            let text = m.search_text();
            let rest = text
                .strip_prefix(&format!("{tag} message "))
                .unwrap_or_else(|| panic!("unexpected message {text}"));
            rest.split(':').next().unwrap().parse().unwrap()
        })
        .collect()
}

#[test]
fn an_import_on_a_full_tmpfs_fails_clearly_and_completes_once_space_returns() {
    let Some(fs) = Tmpfs::for_test("full_disk::an_import", "32m") else {
        return;
    };
    let data = fs.path().join("data");
    let sources = tempfile::tempdir().unwrap();
    let small = sources.path().join("small.jsonl");
    let big = sources.path().join("big.jsonl");
    transcript(&small, "small", 40);
    transcript(&big, "big", 3_000);

    let out = lcm(
        &data,
        &[
            "import",
            "--format",
            "openai",
            "--session",
            "small",
            small.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    // Room for a part of the big import only.
    fs.fill_leaving(1 << 20);
    let out = lcm(
        &data,
        &[
            "import",
            "--format",
            "openai",
            "--session",
            "big",
            big.to_str().unwrap(),
        ],
    );
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    assert!(
        !out.status.success(),
        "an import on a full disk fails: {text}"
    );
    assert!(text.contains("the disk is full"), "a clear message: {text}");
    assert!(text.contains("not imported"), "{text}");
    // A compaction on the full disk fails the same way, and changes nothing.
    let out = lcm(&data, &["compact", "small", "--budget", "2000"]);
    if !out.status.success() {
        assert!(
            stderr(&out).contains("the disk is full"),
            "{}",
            stderr(&out)
        );
    }

    fs.free();
    // What the failed import stored is a prefix of the file, whole transactions: no gap, no
    // duplicate; the small session is untouched.
    let partial = numbers(&data, "big", "big");
    assert!(partial.len() < 3_000, "the disk stopped the import");
    assert_eq!(partial, (0..partial.len()).collect::<Vec<_>>());
    assert_eq!(
        numbers(&data, "small", "small"),
        (0..40).collect::<Vec<_>>()
    );
    let out = lcm(&data, &["doctor"]);
    assert!(
        out.status.success(),
        "doctor after the full disk: {}",
        stderr(&out)
    );

    // The same import again completes it.
    let out = lcm(
        &data,
        &[
            "import",
            "--format",
            "openai",
            "--session",
            "big",
            big.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(numbers(&data, "big", "big"), (0..3_000).collect::<Vec<_>>());
    let out = lcm(&data, &["compact", "small", "--budget", "2000"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = lcm(&data, &["doctor"]);
    assert!(out.status.success(), "{}", stderr(&out));
}
