//! `lcm serve` as a process: it starts on an ephemeral loopback port and says where, answers
//! HTTP, stops cleanly on SIGTERM (exit 0) and releases the data directory, which the next
//! command reads with what the daemon stored. Bound beyond loopback it prints a generated
//! token once and refuses requests without it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn spawn(data_dir: &Path, bind: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["serve", "--bind", bind])
        .env_remove("LCM_CONFIG")
        .env_remove("LCM_SERVER_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lcm serve")
}

/// Kills the child when dropped: a test that fails midway leaves no daemon behind.
pub(crate) struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads stderr until the `listening on http://ADDR` line; every line read before it, and ADDR.
pub(crate) fn wait_listening(stderr: &mut BufReader<ChildStderr>) -> (Vec<String>, SocketAddr) {
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let n = stderr.read_line(&mut line).expect("stderr");
        assert!(n > 0, "lcm serve ended before listening: {lines:?}");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            let addr = rest.split_whitespace().next().expect("address");
            let port = addr.rsplit(':').next().expect("port");
            return (lines, format!("127.0.0.1:{port}").parse().expect("addr"));
        }
        lines.push(line);
    }
}

/// One HTTP/1.1 request; the status code and the body.
pub(crate) fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "lcm serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM, then: the exit status is success (else the test fails with the rest of stderr).
pub(crate) fn stop_cleanly(child: &mut Child, mut stderr: impl BufRead) {
    let status = terminate(child);
    let mut rest = String::new();
    let _ = stderr.read_to_string(&mut rest);
    assert!(status.success(), "lcm serve exited with {status}: {rest}");
}

#[test]
fn serve_answers_and_stops_cleanly_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut child = spawn(&data, "127.0.0.1:0");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (before, addr) = wait_listening(&mut stderr);
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

    let status = terminate(&mut child);
    assert!(status.success(), "exit status {status:?}");
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
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
    let mut child = spawn(&data, "0.0.0.0:0");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (before, addr) = wait_listening(&mut stderr);
    let shown = before.join("");
    let token = std::fs::read_to_string(data.join("server-token")).unwrap();
    let token = token.trim();
    assert!(
        shown.contains(token),
        "the generated token was not shown: {shown}"
    );
    assert_eq!(http(addr, "GET", "/v1/sessions", None, "").0, 401);
    assert_eq!(http(addr, "GET", "/v1/sessions", Some(token), "").0, 200);
    assert_eq!(http(addr, "GET", "/healthz", None, "").0, 200);
    stop_cleanly(&mut child, stderr);

    // The next start uses the kept token and does not print it again.
    let mut child = spawn(&data, "0.0.0.0:0");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (before, addr) = wait_listening(&mut stderr);
    assert!(!before.join("").contains(token), "{before:?}");
    assert_eq!(http(addr, "GET", "/v1/sessions", Some(token), "").0, 200);
    stop_cleanly(&mut child, stderr);
}

#[test]
fn sigterm_right_after_the_listening_line_is_a_graceful_stop() {
    // The handlers are installed before the line is printed: a signal at once must not kill the
    // process with the default action (exit by signal, not success).
    for _ in 0..5 {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = spawn(&tmp.path().join("data"), "127.0.0.1:0");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        wait_listening(&mut stderr);
        stop_cleanly(&mut child, stderr);
    }
}
