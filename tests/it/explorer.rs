//! The web explorer (`/ui`) in a real Chromium, driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`; `.ci/run` installs them, the test installs nothing and skips without
//! them). A real transcript from ../shared/data, compacted into a DAG, served by `lcm serve`
//! with an admin token and a tenant: the token prompt, the sessions list, a session's context
//! bar and DAG, a summary and its sources, a search followed to its message, bad input (a
//! malformed id, an invalid regex, a wrong token), the health page, and a tenant who cannot
//! see another tenant's session. Screenshots of the main views go to docs/screenshots/.

use std::io::BufReader;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::common;
use crate::serve::{KillOnDrop, spawn, stop_cleanly, wait_listening};
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};

const ADMIN: &str = "admin-token-for-the-explorer-test-0123";
const TENANT: &str = "tenant-token-for-the-explorer-test-0123";

/// chromedriver and chromium, if both are installed.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let driver = std::env::var_os("LCM_CHROMEDRIVER")
        .map_or_else(|| PathBuf::from("/usr/bin/chromedriver"), PathBuf::from);
    let chromium = std::env::var_os("LCM_CHROMIUM")
        .map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    if driver.exists() && chromium.exists() {
        Some((driver, chromium))
    } else {
        eprintln!(
            "SKIPPED: the browser tests need {} and {} (Debian: apt-get install chromium \
             chromium-driver; .ci/run installs them)",
            chromium.display(),
            driver.display()
        );
        None
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts chromedriver and a headless Chromium session through it.
async fn open_browser(driver: &Path, chromium: &Path) -> (KillOnDrop, Client) {
    let port = free_port();
    let child: Child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let guard = KillOnDrop(child);
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,900"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let client = ClientBuilder::new(connector)
        .capabilities(capabilities)
        .connect(&url)
        .await
        .expect("a Chromium session");
    (guard, client)
}

/// The first element `css` finds, once there is one (failing after 20 s).
async fn element(client: &Client, css: &str) -> fantoccini::elements::Element {
    client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}`: {e}"))
}

/// The text of the first element `css` finds, once there is one.
async fn text_of(client: &Client, css: &str) -> String {
    element(client, css).await.text().await.unwrap()
}

/// Waits until the page's main view says `needle`.
async fn view_says(client: &Client, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = text_of(client, "#view").await;
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the view never said `{needle}`:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn enter_token(client: &Client, token: &str) {
    let input = client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#token-dialog[open] #token-input"))
        .await
        .expect("the token prompt");
    input.clear().await.unwrap();
    input.send_keys(token).await.unwrap();
    client
        .find(Locator::Css("#token-form button[value=save]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// `lcm ARGS` on `data`, which must succeed.
fn lcm(data: &Path, args: &[&str]) -> std::process::Output {
    let out = common::lcm(data, args);
    assert!(
        out.status.success(),
        "lcm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Answers each map item correctly (its word upper-cased) after `delay`.
fn answer_after(delay: Duration) -> ScriptedReply {
    ScriptedReply::from_fn(move |request: &RecordedRequest| {
        let item = request
            .last_user_text()
            .and_then(|t| t.split("Item (JSON):\n").nth(1).map(str::to_owned))
            .and_then(|rest| serde_json::from_str::<Value>(rest.lines().next()?).ok());
        match item {
            Some(item) => {
                let upper = item["word"].as_str().unwrap_or_default().to_uppercase();
                let answer = json!({"id": item["id"], "upper": upper}).to_string();
                ScriptedReply::delayed(delay, ScriptedReply::ok(answer))
            }
            None => ScriptedReply::status(400),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_explorer_in_a_real_chromium() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let Some(shared) = common::shared_data() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // A real session, compacted into a DAG of several levels, and a tenant's session.
    let session = &common::real_sessions(&shared)[0];
    lcm(&data, &["import", "-q", session.to_str().unwrap()]);
    lcm(&data, &["context", "ses_0", "--budget", "6000"]);
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/transcripts/demo-session.jsonl");
    lcm(
        &data,
        &[
            "import",
            "-q",
            "--session",
            "team-a/notes",
            example.to_str().unwrap(),
        ],
    );
    // A model on loopback for a map job: it answers each item after 150 ms.
    let model = ScriptedServer::start().await;
    model.set_default(answer_after(Duration::from_millis(150)));
    let items = tmp.path().join("items.jsonl");
    let lines: String = (0..12)
        .map(|i| format!("{}\n", json!({"id": i, "word": format!("w{i}")})))
        .collect();
    std::fs::write(&items, lines).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!(
            "[server]\ntoken = \"{ADMIN}\"\n[server.tenants]\n\"{TENANT}\" = \"team-a/\"\n\
             [llm]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"map-model\"\n\
             max_retries = 0\n[map]\nallowed_roots = [{:?}]\n",
            model.url(),
            tmp.path().display().to_string()
        ),
    )
    .unwrap();
    let before: Value = serde_json::from_slice(&lcm(&data, &["stats", "--json"]).stdout).unwrap();

    let mut daemon = KillOnDrop(spawn(&data, "127.0.0.1:0"));
    let mut stderr = BufReader::new(daemon.0.stderr.take().unwrap());
    let (_, addr) = wait_listening(&mut stderr);
    let base = format!("http://{addr}");
    let (_driver, client) = open_browser(&driver, &chromium).await;

    // No token yet: the page asks for one; a wrong one is refused with a clear message.
    client.goto(&format!("{base}/ui")).await.unwrap();
    enter_token(&client, "not-the-token").await;
    let why = text_of(&client, "#token-dialog[open] #token-why").await;
    assert!(why.contains("refused"), "{why}");
    enter_token(&client, ADMIN).await;
    let list = view_says(&client, "Sessions (2)").await;
    assert!(
        list.contains("team-a/notes") && list.contains("claude-code:"),
        "{list}"
    );
    assert!(list.contains("summaries, raw from #"), "{list}");
    screenshot(&client, "explorer-sessions").await;

    // A session: the context bar (summaries by depth, then the raw tail), the DAG, a timeline.
    client
        .find(Locator::LinkText("ses_0"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    view_says(&client, "The context as it stands").await;
    element(&client, "#context-bar a").await;
    let bar = client
        .find_all(Locator::Css("#context-bar a"))
        .await
        .unwrap();
    assert!(bar.len() >= 2, "{} segments", bar.len());
    // Drawn in proportion (the page's policy refuses inline style attributes: a width set that
    // way would be lost and the bar empty).
    let widths = client
        .execute(
            "return [...document.querySelectorAll('#context-bar a')]\
             .map(a => a.getBoundingClientRect().width)",
            vec![],
        )
        .await
        .unwrap();
    let widths: Vec<f64> = serde_json::from_value(widths).unwrap();
    assert!(widths.iter().sum::<f64>() > 600.0, "{widths:?}");
    view_says(&client, "#0..#").await;
    // Expanding a DAG node lists its sources.
    let toggle = client
        .find(Locator::Css("#dag button.toggle"))
        .await
        .unwrap();
    toggle.click().await.unwrap();
    text_of(&client, "#dag li ul li a").await;
    screenshot(&client, "explorer-session").await;

    // A summary from the bar: its text and its sources; a source opens.
    let first = client
        .find(Locator::Css("#context-bar a[href^='/ui/summaries/']"))
        .await
        .unwrap();
    let href = first.attr("href").await.unwrap().unwrap();
    first.click().await.unwrap();
    let id = href.rsplit('/').next().unwrap().to_owned();
    view_says(&client, &id).await;
    text_of(&client, "#content").await;
    let source = element(&client, "#sources a").await;
    let source_id = source.text().await.unwrap();
    screenshot(&client, "explorer-summary").await;
    source.click().await.unwrap();
    view_says(&client, &source_id).await;

    // A search, a hit followed to its message (its full text holds the match).
    client
        .goto(&format!("{base}/ui/search?q=mix%20test"))
        .await
        .unwrap();
    let hit = element(&client, "#results .hit a").await;
    screenshot(&client, "explorer-search").await;
    let hit_id = hit.text().await.unwrap();
    hit.click().await.unwrap();
    let message = view_says(&client, &hit_id).await;
    assert!(message.contains("mix test"), "{message}");

    // Summaries are searched too, and a common word pages on.
    client
        .goto(&format!("{base}/ui/search?q=mix%20test&scope=summaries"))
        .await
        .unwrap();
    let hit = element(&client, "#results .hit a").await;
    assert!(hit.text().await.unwrap().starts_with("sum_"));
    client
        .goto(&format!("{base}/ui/search?q=the&mode=regex"))
        .await
        .unwrap();
    client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::LinkText("Next page →"))
        .await
        .expect("a next page")
        .click()
        .await
        .unwrap();
    view_says(&client, "hits on this page").await;
    assert!(
        client
            .current_url()
            .await
            .unwrap()
            .as_str()
            .contains("cursor=")
    );

    // Bad input: an invalid regex, a malformed id, a session that does not exist.
    client
        .goto(&format!("{base}/ui/search?q=%28unclosed"))
        .await
        .unwrap();
    let error = text_of(&client, "#results .error").await;
    assert!(error.contains("HTTP 400"), "{error}");
    client
        .goto(&format!("{base}/ui/summaries/sum_x"))
        .await
        .unwrap();
    let said = view_says(&client, "Not an id").await;
    assert!(said.contains("sum_N"), "{said}");
    client
        .goto(&format!("{base}/ui/sessions/ses_999"))
        .await
        .unwrap();
    view_says(&client, "no session").await;

    // Health: the totals and the integrity check.
    client.goto(&format!("{base}/ui/health")).await.unwrap();
    let health = view_says(&client, "Messages").await;
    assert!(health.contains("watermark"), "{health}");
    // Figures from the metrics (the admin may read them).
    assert!(
        health.contains(" finished, ") && health.contains(" failed, "),
        "{health}"
    );
    client
        .find(Locator::Css("#integrity button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    view_says(&client, "No violations.").await;

    // A map job's progress, live over server-sent events, to its end.
    let (status, body) = crate::serve::http(
        addr,
        "POST",
        "/v1/maps",
        Some(ADMIN),
        &json!({
            "input_path": items, "prompt": "Upper-case the word.", "concurrency": 1,
            "output_schema": {"type": "object", "required": ["id", "upper"]},
        })
        .to_string(),
    );
    assert_eq!(status, 201, "{body}");
    let job: Value = serde_json::from_str(&body).unwrap();
    let job = job["id"]
        .as_str()
        .or(job["job"]["id"].as_str())
        .unwrap()
        .to_owned();
    client.goto(&format!("{base}/ui/maps/{job}")).await.unwrap();
    let early = text_of(&client, "#map-counts").await;
    screenshot(&client, "explorer-map").await;
    let done = view_says(&client, "12 of 12").await;
    assert!(done.contains("completed"), "{done}");
    assert_ne!(
        early, "12 of 12 (0 failed)",
        "the job was over before the page watched it"
    );

    // A tenant sees its own session only, in the list and by address.
    client
        .find(Locator::Css("#token-button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    enter_token(&client, TENANT).await;
    client.goto(&format!("{base}/ui")).await.unwrap();
    let list = view_says(&client, "Sessions (1)").await;
    assert!(
        list.contains("team-a/notes") && !list.contains("claude-code:"),
        "{list}"
    );
    client
        .goto(&format!("{base}/ui/sessions/ses_0"))
        .await
        .unwrap();
    view_says(&client, "no session `ses_0`").await;
    client.goto(&format!("{base}/ui/health")).await.unwrap();
    view_says(&client, "HTTP 403").await;

    client.close().await.unwrap();
    stop_cleanly(&mut daemon.0, stderr);
    // Looking changed nothing stored.
    let after: Value = serde_json::from_slice(&lcm(&data, &["stats", "--json"]).stdout).unwrap();
    assert_eq!(before["store"]["messages"], after["store"]["messages"]);
    assert_eq!(before["store"]["sessions"], after["store"]["sessions"]);
}
