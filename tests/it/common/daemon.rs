//! `lcm serve` as a child process: spawn it, wait for its listening line, talk plain HTTP to
//! it, stop it with SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::time::{Duration, Instant};

fn spawn(data_dir: &Path, bind: &str) -> Child {
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
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `lcm serve` started on a data directory and listening: killed when dropped (a test that
/// fails midway leaves no daemon behind) unless stopped first.
pub struct Daemon {
    pub child: KillOnDrop,
    /// The rest of its stderr, after the listening line.
    pub stderr: BufReader<ChildStderr>,
    pub addr: SocketAddr,
    /// The lines it printed before the listening line.
    pub before: Vec<String>,
}

impl Daemon {
    /// Spawns `lcm serve --bind bind` on `data_dir` and waits for its listening line.
    pub fn start(data_dir: &Path, bind: &str) -> Daemon {
        let mut child = KillOnDrop(spawn(data_dir, bind));
        let mut stderr = BufReader::new(child.0.stderr.take().expect("piped stderr"));
        let (before, addr) = wait_listening(&mut stderr);
        Daemon {
            child,
            stderr,
            addr,
            before,
        }
    }

    /// SIGTERM, and the exit status is success (see [`stop_cleanly`]).
    pub fn stop(mut self) {
        stop_cleanly(&mut self.child.0, &mut self.stderr);
    }
}

/// Reads stderr until the `listening on http://ADDR` line; every line read before it, and ADDR.
fn wait_listening(stderr: &mut BufReader<ChildStderr>) -> (Vec<String>, SocketAddr) {
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
pub fn http(
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

pub fn terminate(child: &mut Child) -> std::process::ExitStatus {
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
pub fn stop_cleanly(child: &mut Child, mut stderr: impl BufRead) {
    let status = terminate(child);
    let mut rest = String::new();
    let _ = stderr.read_to_string(&mut rest);
    assert!(status.success(), "lcm serve exited with {status}: {rest}");
}
