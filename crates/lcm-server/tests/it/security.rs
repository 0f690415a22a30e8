//! Security over real HTTP: a daemon bound beyond loopback requires a bearer token (generated,
//! kept 0600, accepted); tenant tokens reach only their own sessions; bodies over the limit
//! get 413; malformed JSON gets a clear 400; a map input or output path outside the allowed
//! roots is refused. In every rejected case, the store is unchanged.

use crate::common::{self, Setup, start};
use lcm_server::TokenSource;
use reqwest::{Method, StatusCode};
use serde_json::json;

const ADMIN: &str = "admin-token-0123456789abcdef";
const TENANT_A: &str = "tenant-a-token-0123456789";
const TENANT_B: &str = "tenant-b-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_a_bearer_token_is_required() {
    let (mut setup, tmp, root) = Setup::new();
    setup.bind = "0.0.0.0:0".parse().unwrap();
    let server = start(setup, tmp, root).await;

    // No token configured: one was generated and kept in the data directory, owner-only.
    let token_file = server.data.join(lcm_server::TOKEN_FILE);
    assert_eq!(
        server.token_source,
        TokenSource::Generated(Some(token_file.clone()))
    );
    let token = server.token.clone().expect("a token");
    assert!(token.len() >= 64 && token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(std::fs::read_to_string(&token_file).unwrap().trim(), token);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&token_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let before = server.stats();
    let create = || Some(json!({"key": "intruder"}).to_string().into_bytes());
    // Without a token, or with a wrong one: 401, a JSON error, and nothing created.
    for bad in [None, Some("wrong-token-0123456789"), Some("")] {
        let answer = server
            .send(Method::POST, "/v1/sessions", create(), bad)
            .await;
        assert_eq!(
            answer.status,
            StatusCode::UNAUTHORIZED,
            "{bad:?}: {answer:?}"
        );
        assert_eq!(answer.kind(), "unauthorized");
        assert!(answer.headers.contains_key("www-authenticate"));
        for path in [
            "/v1/sessions",
            "/readyz",
            "/metrics",
            "/openapi.json",
            "/v1/tools",
        ] {
            let answer = server.send(Method::GET, path, None, bad).await;
            assert_eq!(
                answer.status,
                StatusCode::UNAUTHORIZED,
                "{path} {bad:?}: {answer:?}"
            );
        }
    }
    assert_eq!(server.stats(), before);
    // /healthz needs no token.
    let health = server.send(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, StatusCode::OK);

    // With the token: 200 / 201.
    let answer = server
        .send(Method::GET, "/v1/sessions", None, Some(&token))
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let answer = server
        .send(Method::POST, "/v1/sessions", create(), Some(&token))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
    let answer = server
        .send(Method::GET, "/metrics", None, Some(&token))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    let text = answer.body.as_str().unwrap();
    assert!(
        text.contains(
            "lcm_http_requests_total{route=\"/v1/sessions\",method=\"POST\",status=\"401\"} 3"
        ),
        "{text}"
    );

    // The environment's token overrides the file on the next start.
    let (tmp, _data) = server.stop_and_keep().await;
    let root = tmp.path().join("root").canonicalize().unwrap();
    let mut setup = Setup {
        config: common::config(&root),
        ..Setup::new().0
    };
    setup.bind = "0.0.0.0:0".parse().unwrap();
    setup.env_token = Some("from-the-environment-0123".into());
    let server = start(setup, tmp, root).await;
    assert_eq!(server.token_source, TokenSource::Configured);
    let answer = server
        .send(Method::GET, "/v1/sessions", None, Some(&token))
        .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    let answer = server
        .send(
            Method::GET,
            "/v1/sessions",
            None,
            Some("from-the-environment-0123"),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body["sessions"][0]["key"], "intruder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_tokens_reach_only_their_own_sessions() {
    let (mut setup, tmp, root) = Setup::new();
    setup.config.server.token = Some(ADMIN.into());
    setup.config.server.tenants = [
        (TENANT_A.to_owned(), "a/".to_owned()),
        (TENANT_B.to_owned(), "b/".to_owned()),
    ]
    .into();
    let server = start(setup, tmp, root).await;
    let send =
        |method: Method, path: String, body: Option<serde_json::Value>, token: &'static str| {
            let server = &server;
            async move {
                server
                    .send(
                        method,
                        &path,
                        body.map(|b| b.to_string().into_bytes()),
                        Some(token),
                    )
                    .await
            }
        };

    // Tenant B stores a secret.
    let b = send(
        Method::POST,
        "/v1/sessions".into(),
        Some(json!({"key": "b/chat"})),
        TENANT_B,
    )
    .await;
    assert_eq!(b.status, StatusCode::CREATED, "{b:?}");
    let b_id = b.body["id"].as_str().unwrap().to_owned();
    let secret = send(
        Method::POST,
        format!("/v1/sessions/{b_id}/messages"),
        Some(json!({"role": "user", "content": "the vault code is 7341", "key": "m1"})),
        TENANT_B,
    )
    .await;
    assert_eq!(secret.status, StatusCode::CREATED, "{secret:?}");
    let b_msg = secret.body["appended"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Tenant A has its own session, and may not create one outside its prefix.
    let a = send(
        Method::POST,
        "/v1/sessions".into(),
        Some(json!({"key": "a/chat"})),
        TENANT_A,
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED);
    let a_id = a.body["id"].as_str().unwrap().to_owned();
    let outside = send(
        Method::POST,
        "/v1/sessions".into(),
        Some(json!({"key": "b/mine"})),
        TENANT_A,
    )
    .await;
    assert_eq!(outside.status, StatusCode::FORBIDDEN, "{outside:?}");

    let before = server.stats();
    // Listing shows only A's sessions; the admin sees both.
    let list = send(Method::GET, "/v1/sessions".into(), None, TENANT_A).await;
    let keys: Vec<&str> = list.body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["a/chat"]);
    let list = send(Method::GET, "/v1/sessions".into(), None, ADMIN).await;
    assert_eq!(list.body["sessions"].as_array().unwrap().len(), 2);

    // Everything of B's is absent (404) or refused (403) for A.
    let cases: Vec<(Method, String, Option<serde_json::Value>, StatusCode)> = vec![
        (
            Method::GET,
            format!("/v1/sessions/{b_id}"),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            "/v1/sessions/b%2Fchat".into(),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/v1/sessions/{b_id}/context?budget=1000"),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{b_id}/messages"),
            Some(json!({"role": "user", "content": "x"})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{b_id}/tools/lcm_grep"),
            Some(json!({"pattern": "vault"})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/lcm_grep"),
            Some(json!({"pattern": "vault", "session": "all"})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/lcm_grep"),
            Some(json!({"pattern": "vault", "session": b_id})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/lcm_grep"),
            Some(json!({"pattern": "vault", "session": "b/chat"})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/lcm_describe"),
            Some(json!({"id": b_msg})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/lcm_describe"),
            Some(json!({"id": b_id})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/lcm_expand_query"),
            Some(json!({"prompt": "vault code?"})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{a_id}/tools/read_file"),
            Some(json!({"path": "x"})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            "/v1/grep".into(),
            Some(json!({"pattern": "vault"})),
            StatusCode::BAD_REQUEST,
        ),
        (
            Method::POST,
            "/v1/grep".into(),
            Some(json!({"pattern": "vault", "session": "all"})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            "/v1/grep".into(),
            Some(json!({"pattern": "vault", "session": b_id})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/v1/describe/{b_msg}"),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/v1/describe/{b_id}"),
            None,
            StatusCode::NOT_FOUND,
        ),
        (Method::GET, "/v1/maps".into(), None, StatusCode::FORBIDDEN),
        (
            Method::POST,
            "/v1/maps".into(),
            Some(json!({"input_path": "x", "prompt": "p", "output_schema": {}})),
            StatusCode::FORBIDDEN,
        ),
        (
            Method::POST,
            "/v1/integrity?repair=true".into(),
            None,
            StatusCode::FORBIDDEN,
        ),
        (Method::GET, "/metrics".into(), None, StatusCode::FORBIDDEN),
    ];
    for (method, path, body, status) in cases {
        let request_names = |id: &str, _: &common::Answer| {
            body.as_ref().is_some_and(|b| b.to_string().contains(id))
        };
        let answer = send(method.clone(), path.clone(), body.clone(), TENANT_A).await;
        assert_eq!(answer.status, status, "{method} {path}: {answer:?}");
        assert!(!answer.message().is_empty());
        assert!(
            !answer.body.to_string().contains("7341"),
            "{method} {path} leaked the secret: {answer:?}"
        );
        if !path.contains(&b_id) && !request_names(&b_id, &answer) {
            assert!(
                !answer.message().contains(&b_id),
                "{method} {path} named B's session: {answer:?}"
            );
        }
    }
    assert_eq!(
        server.stats(),
        before,
        "a refused request changed the store"
    );

    // What A may do: its own session, its own search (which does not see B's secret).
    let own = send(
        Method::POST,
        format!("/v1/sessions/{a_id}/messages"),
        Some(json!({"role": "user", "content": "hello from a"})),
        TENANT_A,
    )
    .await;
    assert_eq!(own.status, StatusCode::CREATED);
    let grep = send(
        Method::POST,
        format!("/v1/sessions/{a_id}/tools/lcm_grep"),
        Some(json!({"pattern": "vault|hello"})),
        TENANT_A,
    )
    .await;
    assert_eq!(grep.status, StatusCode::OK, "{grep:?}");
    assert_eq!(grep.body["hits"], 1);
    let grep = send(
        Method::POST,
        "/v1/grep".into(),
        Some(json!({"pattern": "vault|hello", "session": "a/chat"})),
        TENANT_A,
    )
    .await;
    assert_eq!(
        (grep.status, grep.body["hits"].clone()),
        (StatusCode::OK, json!(1))
    );
    // B still reads its own; the admin reads everything.
    let ctx = send(
        Method::GET,
        format!("/v1/sessions/{b_id}/context?budget=1000"),
        None,
        TENANT_B,
    )
    .await;
    assert_eq!(ctx.status, StatusCode::OK);
    let grep = send(
        Method::POST,
        "/v1/grep".into(),
        Some(json!({"pattern": "vault|hello"})),
        ADMIN,
    )
    .await;
    assert_eq!(grep.body["hits"], 2);
    // Tokens are required on loopback too once tenants exist.
    let anonymous = server.send(Method::GET, "/v1/sessions", None, None).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_413_and_change_nothing() {
    let (mut setup, tmp, root) = Setup::new();
    setup.config.server.max_body_bytes = 2048;
    let server = start(setup, tmp, root).await;
    let id = server.session("s").await;
    let before = server.stats();
    let big = json!({"role": "user", "content": "x".repeat(4096)}).to_string();
    let answer = server
        .post_raw(&format!("/v1/sessions/{id}/messages"), big.as_bytes())
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE, "{answer:?}");
    assert_eq!(answer.kind(), "payload_too_large");
    assert!(answer.message().contains("2048"), "{answer:?}");
    let batch: Vec<_> = (0..40)
        .map(|i| json!({"role": "user", "content": format!("message {i} {}", "y".repeat(40))}))
        .collect();
    let answer = server
        .post(&format!("/v1/sessions/{id}/messages"), &json!(batch))
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    let answer = server
        .post("/v1/sessions", &json!({"key": "k".repeat(3000)}))
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    let answer = server
        .post("/v1/grep", &json!({"pattern": "z".repeat(3000)}))
        .await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(server.stats(), before);
    // Just under the limit is fine.
    let fits = json!({"role": "user", "content": "x".repeat(1500)});
    let answer = server
        .post(&format!("/v1/sessions/{id}/messages"), &fits)
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_gets_a_clear_400_and_changes_nothing() {
    let (setup, tmp, root) = Setup::new();
    let server = start(setup, tmp, root).await;
    let id = server.session("s").await;
    let messages = format!("/v1/sessions/{id}/messages");
    let before = server.stats();
    let cases: [(&str, &[u8], &str, &str); 10] = [
        (&messages, b"{\"role\": \"user\", \"content\": ", "malformed_json", "line 1 column"),
        (&messages, b"{'role': 'user'}", "malformed_json", "not valid JSON"),
        (&messages, b"", "malformed_json", "empty"),
        (&messages, b"[{\"role\":\"user\",\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"x\",\"colour\":1}]", "invalid_message", "messages[1]: `colour` is not a field"),
        (&messages, b"{\"role\":\"user\",\"content\":\"x\",\"source_key\":\"k\"}", "invalid_message", "`source_key` is not a field"),
        (&messages, b"\"just a string\"", "invalid_request", "expected a message"),
        ("/v1/sessions", b"{\"key\": \"a\",}", "malformed_json", "line 1 column"),
        ("/v1/grep", b"{\"pattern\": [1, 2", "malformed_json", "not valid JSON"),
        ("/v1/sessions", b"[\"key\"]", "invalid_request", "must be a JSON object"),
        ("/v1/sessions", b"{\"key\": 5}", "invalid_request", "invalid type: integer `5`"),
    ];
    for (path, body, kind, needle) in cases {
        let answer = server.post_raw(path, body).await;
        let shown = String::from_utf8_lossy(body);
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{path} {shown}: {answer:?}"
        );
        assert_eq!(answer.kind(), kind, "{path} {shown}: {answer:?}");
        assert!(
            answer.message().contains(needle),
            "{path} {shown}: {answer:?}"
        );
    }
    // The batch with one bad message stored none of them.
    assert_eq!(server.stats(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_paths_outside_the_allowed_roots_are_refused() {
    let upstream = lcm_llm::testing::ScriptedServer::start().await;
    let (mut setup, tmp, root) = Setup::new();
    setup.llm = Some(common::llm(&upstream));
    let outside = tmp.path().join("outside.jsonl");
    std::fs::write(&outside, "{\"secret\": 1}\n").unwrap();
    std::fs::write(root.join("in.jsonl"), "{\"a\": 1}\n").unwrap();
    let server = start(setup, tmp, root.clone()).await;
    let before = server.stats();
    let request = |input: &str, output: Option<&str>| {
        let mut body = json!({"input_path": input, "prompt": "Classify.", "output_schema": {"type": "object"}});
        if let Some(output) = output {
            body["output_path"] = json!(output);
        }
        body
    };
    let cases = [
        request("../outside.jsonl", None),
        request(outside.to_str().unwrap(), None),
        request("sub/../../outside.jsonl", None),
        request("/etc/passwd", None),
        request("in.jsonl", Some("../escaped.jsonl")),
        request("in.jsonl", Some("/tmp/lcm-server-escaped.jsonl")),
    ];
    for body in cases {
        let answer = server.post("/v1/maps", &body).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{body}: {answer:?}");
        assert!(
            answer.message().contains("allowed") || answer.message().contains("outside"),
            "{body}: {answer:?}"
        );
    }
    assert_eq!(server.job_count(), 0, "a refused map created a job");
    assert_eq!(server.stats(), before);
    assert_eq!(upstream.request_count(), 0, "the model was called");
    assert!(!root.parent().unwrap().join("escaped.jsonl").exists());
    assert!(!std::path::Path::new("/tmp/lcm-server-escaped.jsonl").exists());
}
