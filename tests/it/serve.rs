//! `lcm serve` as a process: it starts on an ephemeral loopback port and says where, answers
//! HTTP, stops cleanly on SIGTERM (exit 0) and releases the data directory, which the next
//! command reads with what the daemon stored. Bound beyond loopback it prints a generated
//! token once and refuses requests without it.

use std::io::Read;
use std::process::Command;

use crate::common::daemon::{Daemon, http, terminate};

#[test]
fn serve_answers_and_stops_cleanly_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut daemon = Daemon::start(&data, "127.0.0.1:0");
    let (before, addr) = (&daemon.before, daemon.addr);
    assert!(before.iter().all(|l| !l.contains("token")), "{before:?}");

    assert_eq!(http(addr, "GET", "/healthz", None, "").0, 200);
    let (status, body) = http(addr, "POST", "/v1/sessions", None, r#"{"key":"from-http"}"#);
    assert_eq!(status, 201, "{body}");
    let id: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = id["id"].as_str().unwrap();
    let (status, body) = http(
        addr,
        "POST",
        &format!("/v1/sessions/{id}/messages"),
        None,
        r#"{"role":"user","content":"kept across the restart","key":"k1"}"#,
    );
    assert_eq!(status, 201, "{body}");

    let status = terminate(&mut daemon.child.0);
    assert!(status.success(), "exit status {status:?}");
    let mut rest = String::new();
    daemon.stderr.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");

    // The store was released: the CLI opens it and sees what the daemon stored.
    let out = Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(&data)
        .args(["grep", "kept across", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("kept across the restart"));
}

#[test]
fn serve_beyond_loopback_prints_a_token_once_and_requires_it() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let daemon = Daemon::start(&data, "0.0.0.0:0");
    let addr = daemon.addr;
    let shown = daemon.before.join("");
    let token = std::fs::read_to_string(data.join("server-token")).unwrap();
    let token = token.trim();
    assert!(
        shown.contains(token),
        "the generated token was not shown: {shown}"
    );
    assert_eq!(http(addr, "GET", "/v1/sessions", None, "").0, 401);
    assert_eq!(http(addr, "GET", "/v1/sessions", Some(token), "").0, 200);
    assert_eq!(http(addr, "GET", "/healthz", None, "").0, 200);
    daemon.stop();

    // The next start uses the kept token and does not print it again.
    let daemon = Daemon::start(&data, "0.0.0.0:0");
    let before = &daemon.before;
    assert!(!before.join("").contains(token), "{before:?}");
    assert_eq!(
        http(daemon.addr, "GET", "/v1/sessions", Some(token), "").0,
        200
    );
    daemon.stop();
}

#[test]
fn sigterm_right_after_the_listening_line_is_a_graceful_stop() {
    // The handlers are installed before the line is printed: a signal at once must not kill the
    // process with the default action (exit by signal, not success).
    for _ in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        Daemon::start(&tmp.path().join("data"), "127.0.0.1:0").stop();
    }
}
