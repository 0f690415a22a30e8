//! A host embeds the daemon through the facade: `lcm::server::Server` over an `lcm::engine`
//! runtime, in the host's own tokio runtime, answering on loopback and stopping on request.

use std::io::{Read, Write};
use std::net::TcpStream;

use lcm::engine::runtime::{Runtime, RuntimeOptions};
use lcm::server::{Server, ServerOptions, TOKEN_FILE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_embeds_the_daemon_through_the_facade() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut config = lcm::Config::default();
    config.runtime.integrity_interval_s = 0;
    let runtime = Runtime::open(RuntimeOptions::dir(&data, config))
        .await
        .unwrap();
    let server = Server::bind(
        runtime.clone(),
        ServerOptions {
            bind: Some("127.0.0.1:0".parse().unwrap()),
            token_file: Some(data.join(TOKEN_FILE)),
            env_token: None,
        },
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));

    let get = |path: &'static str| {
        tokio::task::spawn_blocking(move || {
            let mut stream = TcpStream::connect(addr).unwrap();
            write!(
                stream,
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut reply = String::new();
            stream.read_to_string(&mut reply).unwrap();
            reply
        })
    };
    let health = get("/healthz").await.unwrap();
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    // On loopback without a configured token the API is open to the host: no session yet.
    let sessions = get("/v1/sessions").await.unwrap();
    assert!(sessions.starts_with("HTTP/1.1 200"), "{sessions}");
    assert!(
        sessions.trim_end().ends_with(r#"{"sessions":[]}"#),
        "{sessions}"
    );

    stop.send(()).unwrap();
    task.await.unwrap().unwrap();
}
