//! The CLI beside a running daemon: while `lcm serve` holds a data directory, every command
//! that reads or writes it runs through the daemon (its control socket) and prints exactly what
//! it prints without the daemon, byte for byte, `--json` or not, errors and exit codes
//! included. Commands that need the store alone say the daemon must stop first, and change
//! nothing. A daemon killed with SIGKILL leaves a stale advert that the CLI ignores.

use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common;
use crate::common::daemon::{Daemon, KillOnDrop};

/// `lcm ARGS` in `cwd` on the data directory `data` (named relative to `cwd`).
fn lcm_in(cwd: &Path, data: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_lcm"))
        .current_dir(cwd)
        .args(["--data-dir", data])
        .args(args)
        .env_remove("LCM_CONFIG")
        .env_remove("LCM_DATA_DIR")
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lcm");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).unwrap();
    }
    child.wait_with_output().expect("lcm output")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// What differs between two runs of the same command by nature: how long the check took, and
/// the times of records made during the run (sessions and summaries are stamped with the wall
/// clock when created). Those are masked; everything else must be byte for byte the same.
fn without_timings(text: &str) -> String {
    let mut text = text.to_owned();
    let today = lcm::core::time::Timestamp::now().to_string();
    let today = &today[..11]; // `YYYY-MM-DDT`
    while let Some(at) = text.find(today) {
        let end = (at + 24).min(text.len());
        text.replace_range(at..end, "<now>");
    }
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = if let Some(at) = line.find("\"elapsed_ms\": ") {
            format!("{}\"elapsed_ms\": N,", &line[..at])
        } else if line.starts_with("checked ") && line.ends_with(" ms") {
            let cut = line.rfind(" in ").unwrap_or(line.len());
            format!("{} in N ms", &line[..cut])
        } else {
            line.to_owned()
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// One command of the comparison, with what it gets on stdin.
struct Step {
    args: Vec<String>,
    stdin: Option<Vec<u8>>,
}

fn step(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        stdin: None,
    }
}

/// Every command the issue lists, reading and writing, in text and JSON, plus errors.
fn steps(second: &Path, third: &[u8]) -> Vec<Step> {
    let second = second.to_str().unwrap();
    let mut steps = vec![
        step(&["import", "--json", second]),
        step(&["import", second]),
        Step {
            args: vec!["import".into(), "-".into()],
            stdin: Some(third.to_vec()),
        },
        step(&["sessions"]),
        step(&["sessions", "--json"]),
        step(&["stats"]),
        step(&["stats", "--json"]),
        step(&["grep", "error", "--limit", "5"]),
        step(&["grep", "error", "--limit", "5", "--json"]),
        step(&["grep", "--mode", "full-text", "session error", "--json"]),
        step(&["grep", "--session", "ses_1", "fn ", "--limit", "3"]),
        step(&["show", "msg_3"]),
        step(&["show", "msg_3", "--json"]),
        step(&["show", "msg_3", "--original"]),
        step(&["show", "ses_0", "--json"]),
        step(&["context", "ses_0", "--budget", "8000"]),
        step(&["dag", "ses_0"]),
        step(&["dag", "ses_0", "--json"]),
        step(&["describe", "sum_0"]),
        step(&["describe", "sum_0", "--json"]),
        step(&["describe", "msg_5", "--json"]),
        step(&["compact", "ses_1", "--budget", "6000"]),
        step(&["compact", "ses_1", "--budget", "6000", "--json"]),
        step(&[
            "tool",
            "lcm_grep",
            "--args",
            r#"{"pattern":"error","limit":3}"#,
            "--session",
            "ses_0",
        ]),
        step(&["tool", "lcm_describe", "--args", r#"{"id":"sum_0"}"#]),
        step(&["map", "status"]),
        step(&["map", "status", "--json"]),
        step(&["doctor"]),
        step(&["doctor", "--json"]),
    ];
    // Errors: the same message, the same exit code.
    steps.extend([
        step(&["show", "msg_999999"]),
        step(&["grep", "(unclosed"]),
        step(&["describe", "sum_999"]),
        step(&["tool", "lcm_grep", "--args", "{not json"]),
        step(&["import", "no-such-file.jsonl"]),
        step(&["context", "no-such-session"]),
    ]);
    steps
}

#[derive(Debug, PartialEq, Eq)]
struct Ran {
    args: Vec<String>,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run_all(cwd: &Path, steps: &[Step]) -> Vec<Ran> {
    steps
        .iter()
        .map(|s| {
            let args: Vec<&str> = s.args.iter().map(String::as_str).collect();
            let out = lcm_in(cwd, "data", &args, s.stdin.as_deref());
            Ran {
                args: s.args.clone(),
                code: out.status.code(),
                stdout: without_timings(&String::from_utf8_lossy(&out.stdout)),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        })
        .collect()
}

#[test]
fn every_command_prints_the_same_through_a_running_daemon() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let sessions = common::real_sessions(&shared);
    assert!(sessions.len() >= 3, "{sessions:?}");
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tmp.path();
    // The same starting point for both runs: one session imported.
    let first = lcm_in(
        cwd,
        "data",
        &["import", "-q", sessions[0].to_str().unwrap()],
        None,
    );
    assert!(first.status.success(), "{first:?}");
    copy_dir(&cwd.join("data"), &cwd.join("pristine"));
    let third = std::fs::read(&sessions[2]).unwrap();
    let steps = steps(&sessions[1], &third);

    // With the daemon holding the directory.
    let daemon = Daemon::start(&cwd.join("data"), "127.0.0.1:0");
    assert!(cwd.join("data/daemon.json").exists());
    let through_daemon = run_all(cwd, &steps);

    // The commands that need the store alone refuse, name the daemon, and change nothing.
    let before = lcm_in(cwd, "data", &["stats", "--json"], None);
    for args in [
        &["vacuum"][..],
        &["reindex"],
        &["doctor", "--repair"],
        &["map", "cancel", "job_0"],
    ] {
        let out = lcm_in(cwd, "data", args, None);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("stop the daemon first") && stderr.contains("lcm serve (pid "),
            "{args:?}: {stderr}"
        );
    }
    let after = lcm_in(cwd, "data", &["stats", "--json"], None);
    assert_eq!(before.stdout, after.stdout);
    daemon.stop();
    // A clean stop takes its advert and socket away.
    assert!(!cwd.join("data/daemon.json").exists());
    assert!(!cwd.join("data/lcm.sock").exists());

    // The same commands on the same starting point, at the same path, without a daemon.
    std::fs::rename(cwd.join("data"), cwd.join("after-daemon")).unwrap();
    std::fs::rename(cwd.join("pristine"), cwd.join("data")).unwrap();
    let alone = run_all(cwd, &steps);

    for (with, without) in through_daemon.iter().zip(&alone) {
        assert_eq!(
            with,
            without,
            "`lcm {}` printed differently through the daemon",
            with.args.join(" ")
        );
    }
    // The comparison compared real work: imports stored messages, errors failed.
    assert_eq!(through_daemon[0].code, Some(0));
    assert!(through_daemon[0].stdout.contains("\"imported\""));
    assert!(through_daemon[1].stdout.contains("0 new messages"));
    assert!(
        through_daemon[2].stdout.starts_with("-: ")
            && !through_daemon[2].stdout.starts_with("-: 0 new"),
        "{}",
        through_daemon[2].stdout
    );
    assert!(through_daemon[15].stdout.contains("\"summaries\""));
    let failed: Vec<&Ran> = through_daemon
        .iter()
        .filter(|r| r.code != Some(0))
        .collect();
    assert_eq!(failed.len(), 6, "{failed:#?}");
    assert!(failed.iter().all(|r| r.stderr.starts_with("error: ")));
}

#[test]
fn a_killed_daemon_leaves_an_advert_the_cli_ignores() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/transcripts/demo-session.jsonl");
    let mut daemon = Daemon::start(&data, "127.0.0.1:0");
    // Imported through the daemon.
    let out = lcm_in(
        tmp.path(),
        "data",
        &["import", "-q", example.to_str().unwrap()],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    daemon.child.0.kill().unwrap();
    daemon.child.0.wait().unwrap();
    assert!(
        data.join("daemon.json").exists(),
        "a SIGKILL leaves the advert"
    );

    // The CLI finds nobody behind it and opens the store itself.
    let out = lcm_in(tmp.path(), "data", &["sessions", "--json"], None);
    assert!(out.status.success(), "{out:?}");
    let sessions: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sessions.as_array().unwrap().len(), 1);
    let out = lcm_in(tmp.path(), "data", &["vacuum", "-q"], None);
    assert!(out.status.success(), "{out:?}");

    // The next daemon replaces the stale advert with its own.
    let stale = std::fs::read_to_string(data.join("daemon.json")).unwrap();
    let daemon = Daemon::start(&data, "127.0.0.1:0");
    let fresh = std::fs::read_to_string(data.join("daemon.json")).unwrap();
    assert_ne!(stale, fresh);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for file in ["daemon.json", "lcm.sock"] {
            let mode = std::fs::metadata(data.join(file))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{file} is readable by others: {mode:o}");
        }
    }
    let out = lcm_in(tmp.path(), "data", &["stats", "--json"], None);
    assert!(out.status.success(), "{out:?}");
    daemon.stop();
}

/// A wrong token (an advert from another daemon, or forged) is refused by the daemon.
#[test]
fn the_daemon_refuses_a_client_without_its_token() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let daemon = Daemon::start(&data, "127.0.0.1:0");
    let advert_path: PathBuf = data.join("daemon.json");
    let text = std::fs::read_to_string(&advert_path).unwrap();
    let mut advert: serde_json::Value = serde_json::from_str(&text).unwrap();
    advert["token"] = "0".repeat(64).into();
    std::fs::write(&advert_path, advert.to_string()).unwrap();
    let out = lcm_in(tmp.path(), "data", &["sessions"], None);
    assert_eq!(out.status.code(), Some(1));
    let stderr_text = String::from_utf8_lossy(&out.stderr);
    assert!(stderr_text.contains("token is wrong"), "{stderr_text}");
    assert!(out.stdout.is_empty());
    std::fs::write(&advert_path, text).unwrap();
    daemon.stop();
}

/// `lcm mcp` holds the data directory as `lcm serve` does, and serves the CLI the same way.
#[test]
fn the_cli_runs_through_lcm_mcp_too() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/transcripts/demo-session.jsonl");
    let mut mcp = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_lcm"))
            .arg("--data-dir")
            .arg(&data)
            .arg("mcp")
            .env_remove("LCM_CONFIG")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = BufReader::new(mcp.0.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("serving MCP") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "lcm mcp ended");
    }
    let out = lcm_in(
        tmp.path(),
        "data",
        &["import", "--json", example.to_str().unwrap()],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let imported: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(imported["total"]["imported"].as_u64().unwrap() >= 15);
    let out = lcm_in(tmp.path(), "data", &["vacuum"], None);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("lcm mcp (pid "),
        "{text}"
    );
    // Closing stdin ends `lcm mcp`, which takes its advert away.
    drop(mcp.0.stdin.take());
    let status = mcp.0.wait().unwrap();
    assert!(status.success());
    assert!(!data.join("daemon.json").exists());
    let out = lcm_in(tmp.path(), "data", &["sessions", "--json"], None);
    assert!(out.status.success(), "{out:?}");
}
