//! A daemon on an ephemeral port over a temporary data directory, and a small JSON client.

pub mod load;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use lcm_core::config::Config;
use lcm_engine::runtime::{Runtime, RuntimeOptions};
use lcm_engine::tools::Tool;
use lcm_llm::from_config::LlmClients;
use lcm_llm::http::HttpConfig;
use lcm_llm::openai::OpenAiProvider;
use lcm_llm::testing::ScriptedServer;
use lcm_server::{Server, ServerError, ServerOptions, TokenSource};
use lcm_store::StoreStats;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A test configuration: map inputs confined to `root`, no background integrity checks.
pub fn config(root: &Path) -> Config {
    let mut config = Config::default();
    config.runtime.integrity_interval_s = 0;
    config.map.allowed_roots = vec![root.to_path_buf()];
    config.map.timeout_s = 10;
    config.map.lease_s = 30;
    config.server.shutdown_grace_s = 5;
    // Tests talk only to loopback: a proxy test points these at its scripted upstream, and
    // any other request that reaches them is refused at once (port 9, discard, is closed).
    config.proxy.openai_base_url = "http://127.0.0.1:9/v1".into();
    config.proxy.anthropic_base_url = "http://127.0.0.1:9/v1".into();
    config
}

/// The model on the scripted `server`: no HTTP retries, no circuit breaker.
pub fn llm(server: &ScriptedServer) -> LlmClients {
    let http = HttpConfig::new(server.url(), "map-model")
        .with_max_retries(0)
        .with_circuit(0, Duration::from_secs(1));
    LlmClients::new(Arc::new(OpenAiProvider::new(http).expect("provider")))
}

/// How to start a test daemon.
pub struct Setup {
    pub config: Config,
    pub bind: SocketAddr,
    pub llm: Option<LlmClients>,
    pub env_token: Option<String>,
    pub tools: Vec<Arc<dyn Tool>>,
}

impl Setup {
    /// Loopback, default configuration (with the test settings of [`config`]).
    pub fn new() -> (Setup, tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).expect("root");
        let root = root.canonicalize().expect("canonical root");
        let setup = Setup {
            config: config(&root),
            bind: "127.0.0.1:0".parse().expect("addr"),
            llm: None,
            env_token: None,
            tools: Vec::new(),
        };
        (setup, tmp, root)
    }
}

/// A running daemon.
pub struct TestServer {
    pub addr: SocketAddr,
    pub url: String,
    pub token: Option<String>,
    pub token_source: TokenSource,
    pub runtime: Runtime,
    pub data: PathBuf,
    pub root: PathBuf,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
    _tmp: Option<tempfile::TempDir>,
}

/// A client for plain HTTP (rustls needs a crypto provider even when TLS is never used).
pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .no_proxy()
        .build()
        .expect("client")
}

/// Starts a daemon from `setup` over the data directory `tmp/data`.
pub async fn start(setup: Setup, tmp: tempfile::TempDir, root: PathBuf) -> TestServer {
    let data = tmp.path().join("data");
    let mut options = RuntimeOptions::dir(&data, setup.config.clone());
    if let Some(llm) = setup.llm.clone() {
        options = options.with_llm(llm);
    }
    for tool in &setup.tools {
        options = options.with_tool(Arc::clone(tool));
    }
    let runtime = Runtime::open(options).await.expect("runtime");
    serve(runtime, setup, tmp, root).await
}

/// Starts a daemon from `setup` over `runtime`, opened by the caller (its configuration, model
/// and tools are the runtime's), keeping its token in `tmp/data`.
pub async fn serve(
    runtime: Runtime,
    setup: Setup,
    tmp: tempfile::TempDir,
    root: PathBuf,
) -> TestServer {
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).expect("data directory");
    let server = Server::bind(
        runtime.clone(),
        ServerOptions {
            bind: Some(setup.bind),
            token_file: Some(data.join(lcm_server::TOKEN_FILE)),
            env_token: setup.env_token,
        },
    )
    .await
    .expect("bind");
    let port = server.local_addr().port();
    // Bound to 0.0.0.0 or 127.0.0.1: the tests connect through loopback either way.
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let token = server.token().map(str::to_owned);
    let token_source = server.token_source().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    TestServer {
        addr,
        url: format!("http://{addr}"),
        token,
        token_source,
        runtime,
        data,
        root,
        client: client(),
        stop: Some(stop),
        task: Some(task),
        _tmp: Some(tmp),
    }
}

/// A loopback daemon with the default test setup.
pub async fn start_default() -> TestServer {
    let (setup, tmp, root) = Setup::new();
    start(setup, tmp, root).await
}

/// An answer: status, and the body as JSON (`Value::String` when it is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
    pub headers: reqwest::header::HeaderMap,
}

impl Answer {
    /// The `error` kind of a JSON error body.
    pub fn kind(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }

    /// The `message` of a JSON error body.
    pub fn message(&self) -> &str {
        self.body["message"].as_str().unwrap_or("")
    }
}

impl TestServer {
    /// Sends `method path` with `body` (raw bytes) and `token` (`None`: no Authorization).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        token: Option<&str>,
    ) -> Answer {
        let mut request = self.client.request(method, format!("{}{path}", self.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("request");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Answer {
            status,
            body,
            headers,
        }
    }

    /// GET with the server's own token.
    pub async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None, self.token.as_deref())
            .await
    }

    /// GET that must answer 200 OK; its body.
    pub async fn get_ok(&self, path: &str) -> Value {
        let answer = self.get(path).await;
        assert_eq!(answer.status, StatusCode::OK, "GET {path}: {answer:?}");
        answer.body
    }

    /// POST JSON with the server's own token.
    pub async fn post(&self, path: &str, body: &Value) -> Answer {
        self.send(
            Method::POST,
            path,
            Some(body.to_string().into_bytes()),
            self.token.as_deref(),
        )
        .await
    }

    /// POST raw bytes with the server's own token.
    pub async fn post_raw(&self, path: &str, body: &[u8]) -> Answer {
        self.send(
            Method::POST,
            path,
            Some(body.to_vec()),
            self.token.as_deref(),
        )
        .await
    }

    /// Creates (or gets) the session `key`; its id.
    pub async fn session(&self, key: &str) -> String {
        let answer = self.post("/v1/sessions", &json!({ "key": key })).await;
        assert!(answer.status.is_success(), "{answer:?}");
        answer.body["id"].as_str().expect("id").to_owned()
    }

    /// What the store holds now.
    pub fn stats(&self) -> StoreStats {
        let mut stats = self.runtime.store().stats().expect("stats");
        // The watermark moves as the index catches up; it is not "stored content".
        stats.index_watermark = lcm_core::ids::MessageId(0);
        stats.file_bytes = None;
        stats
    }

    /// Map jobs in the store.
    pub fn job_count(&self) -> usize {
        self.runtime.store().jobs().expect("jobs").len()
    }

    /// Stops the daemon (as SIGTERM would) and waits for it; the result of its run.
    pub async fn stop(&mut self) -> Result<(), ServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.expect("server task"),
            None => Ok(()),
        }
    }

    /// Stops the daemon and keeps its data directory (returned) for a reopen.
    pub async fn stop_and_keep(mut self) -> (tempfile::TempDir, PathBuf) {
        self.stop().await.expect("clean stop");
        let tmp = self._tmp.take().expect("tempdir");
        (tmp, self.data.clone())
    }
}
