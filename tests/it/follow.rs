//! Following live transcripts: `lcm import --follow` and `[watch]` in `lcm serve`. Lines
//! appended in several writes, a new file in a new folder, a last line written in two halves,
//! a file rewritten shorter: every message is stored exactly once, and found by the CLI (which
//! runs through the follower meanwhile) soon after the write.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::daemon::{Daemon, KillOnDrop};
use crate::common::lcm;

/// One lcm-format line with its own key.
fn line(session: &str, key: &str, text: &str) -> String {
    format!(r#"{{"session":"{session}","role":"user","key":"{key}","content":"{text}"}}"#) + "\n"
}

fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.sync_all().unwrap();
}

/// The hits of `word` (a regex) in the data directory, through whoever holds it.
fn hits(data: &Path, word: &str) -> usize {
    let out = lcm(data, &["grep", "--json", word]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    page["hits"].as_array().unwrap().len()
}

/// Waits until `word` is found once (failing after a generous deadline; latency itself is
/// measured by `benches/follow.rs`).
fn found_once(data: &Path, word: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match hits(data, word) {
            1 => return,
            0 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            n => panic!("{word}: {n} hits"),
        }
    }
}

/// Starts `lcm import --follow PATH` and waits for it to say it follows.
fn follower(data: &Path, watched: &Path) -> (KillOnDrop, BufReader<std::process::ChildStderr>) {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(data)
        .args(["import", "--follow"])
        .arg(watched)
        .env_remove("LCM_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("following") {
        said.clear();
        assert!(
            stderr.read_line(&mut said).unwrap() > 0,
            "the follower ended"
        );
    }
    (KillOnDrop(child), stderr)
}

#[test]
fn a_follower_stores_every_line_once_whatever_the_writer_does() {
    let tmp = tempfile::tempdir().unwrap();
    let watched = tmp.path().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let data = tmp.path().join("data");
    // A transcript there before the follower starts is imported first.
    let a = watched.join("a.jsonl");
    append(&a, &line("a", "k1", "alpha-one"));
    let (mut follower, _stderr) = follower(&data, &watched);
    found_once(&data, "alpha-one");

    // Lines appended in several writes.
    append(&a, &line("a", "k2", "alpha-two"));
    append(&a, &line("a", "k3", "alpha-three"));
    found_once(&data, "alpha-two");
    found_once(&data, "alpha-three");

    // A last line written in two halves: stored once whole, never half.
    let whole = line("a", "k4", "alpha-four-complete");
    let (first, second) = whole.split_at(30);
    append(&a, first);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(hits(&data, "alpha-four"), 0, "half a line was read");
    append(&a, second);
    found_once(&data, "alpha-four-complete");

    // A new file in a new folder.
    std::fs::create_dir_all(watched.join("project/sub")).unwrap();
    let b = watched.join("project/sub/b.jsonl");
    append(
        &b,
        &(line("b", "k1", "beta-one") + &line("b", "k2", "beta-two")),
    );
    found_once(&data, "beta-two");

    // Rewritten shorter: what was stored stays once, what is new is added.
    std::fs::write(
        &a,
        line("a", "k1", "alpha-one") + &line("a", "k9", "alpha-nine"),
    )
    .unwrap();
    found_once(&data, "alpha-nine");

    // Ctrl-C ends following cleanly, and the follower said what it did.
    crate::common::send_sigint(follower.0.id());
    let status = follower.0.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut follower.0.stdout.take().unwrap(), &mut stdout).unwrap();
    assert!(
        stdout.contains("a.jsonl: truncated") || stdout.contains("a.jsonl: rewritten"),
        "{stdout}"
    );

    // Exactly once each, with the store to ourselves now.
    for word in [
        "alpha-one",
        "alpha-two",
        "alpha-three",
        "alpha-four-complete",
        "alpha-nine",
        "beta-one",
        "beta-two",
    ] {
        assert_eq!(hits(&data, word), 1, "{word}");
    }
    let sessions: Value =
        serde_json::from_slice(&lcm(&data, &["sessions", "--json"]).stdout).unwrap();
    let count = |key: &str| {
        sessions
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["key"] == key)
            .map(|s| s["message_count"].as_u64().unwrap())
    };
    assert_eq!(count("a"), Some(5));
    assert_eq!(count("b"), Some(2));
}

#[test]
fn standard_input_cannot_be_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let out = lcm(tmp.path(), &["import", "--follow", "-"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be followed"));
}

/// `lcm serve` with `[watch]`: a Claude Code user's sessions are searchable as they are
/// written, through the daemon.
#[test]
fn a_daemon_watching_a_folder_imports_live() {
    let tmp = tempfile::tempdir().unwrap();
    let watched = tmp.path().join("projects");
    std::fs::create_dir_all(&watched).unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!("[watch]\npaths = [{:?}]\n", watched.display().to_string()),
    )
    .unwrap();
    let daemon = Daemon::start(&data, "127.0.0.1:0");
    let session = watched.join("-home-me-app/s1.jsonl");
    std::fs::create_dir_all(session.parent().unwrap()).unwrap();
    append(&session, &line("s1", "k1", "gamma-one"));
    found_once(&data, "gamma-one");
    append(&session, &line("s1", "k2", "gamma-two"));
    found_once(&data, "gamma-two");
    daemon.stop();
    assert_eq!(hits(&data, "gamma-"), 2);
}

/// `lcm import --follow` through a running daemon: the daemon follows for the CLI, and Ctrl-C
/// in the CLI stops the following there (the CLI's cancel), not the daemon.
#[test]
fn ctrl_c_stops_a_follow_the_daemon_runs_for_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let watched = tmp.path().join("watched");
    std::fs::create_dir_all(&watched).unwrap();
    let data = tmp.path().join("data");
    let daemon = Daemon::start(&data, "127.0.0.1:0");

    let (mut cli, _stderr) = follower(&data, &watched);
    append(&watched.join("t.jsonl"), &line("t", "k1", "delta-one"));
    found_once(&data, "delta-one");
    crate::common::send_sigint(cli.0.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = cli.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the CLI did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    // The daemon goes on serving, and follows no more.
    append(&watched.join("t.jsonl"), &line("t", "k2", "delta-two"));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(hits(&data, "delta-"), 1);
    daemon.stop();
}
