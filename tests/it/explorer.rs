//! The web explorer (`/ui`) in a real Chromium, driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`; `.ci/run` installs them, the test installs nothing and skips without
//! them). A real transcript from ../shared/data, compacted into a DAG, served by `lcm serve`
//! with an admin token and a tenant: the token prompt, the sessions list, a session's context
//! bar and DAG, a summary and its sources, a search followed to its message, a file record, the
//! keyboard alone, bad input (a malformed id, an invalid regex, a wrong token), the health page,
//! a map job watched to its end, and a tenant who cannot see another tenant's session; and a
//! session of 100,000 messages opened in under 300 ms. Screenshots of the main views go to
//! docs/screenshots/.

use std::io::BufReader;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
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

/// chromedriver in a process group of its own, with the Chromium it starts: dropping it (a test
/// that ends or panics) kills the whole group, so no browser outlives its test.
struct BrowserProcesses(Child);

impl Drop for BrowserProcesses {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts chromedriver and a headless Chromium session through it.
async fn open_browser(driver: &Path, chromium: &Path) -> (BrowserProcesses, Client) {
    use std::os::unix::process::CommandExt;
    let port = free_port();
    let child: Child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start chromedriver");
    let guard = BrowserProcesses(child);
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

/// Presses and releases one key, wherever the focus is.
async fn press(client: &Client, key: Key) {
    let key: char = key.into();
    client
        .perform_actions(
            KeyActions::new("keyboard".into())
                .then(KeyAction::Down { value: key })
                .then(KeyAction::Up { value: key }),
        )
        .await
        .unwrap();
}

/// Presses Tab until the focused element's text and `href` satisfy `wanted` (at most 80 times).
async fn tab_to(client: &Client, wanted: impl Fn(&str, &str) -> bool) {
    for _ in 0..80 {
        press(client, Key::Tab).await;
        let focused = client.active_element().await.unwrap();
        let text = focused.text().await.unwrap_or_default();
        let href = focused
            .attr("href")
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        if wanted(&text, &href) {
            return;
        }
    }
    panic!("no element wanted within 80 presses of Tab");
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

    // A file record: where it came from, its exploration summary, the messages that refer to it.
    client
        .goto(&format!("{base}/ui/files/file_0"))
        .await
        .unwrap();
    let file = view_says(&client, "file_0 · file").await;
    for fact in ["Path", "Exploration summary", "Referenced by", "Session"] {
        assert!(file.contains(fact), "no `{fact}` on the file page:\n{file}");
    }
    assert!(!text_of(&client, "#content").await.is_empty());
    let referrer = element(&client, "#referenced-by a").await;
    let referrer_id = referrer.text().await.unwrap();
    assert!(referrer_id.starts_with("msg_"), "{referrer_id}");
    screenshot(&client, "explorer-file").await;
    referrer.click().await.unwrap();
    view_says(&client, &referrer_id).await;

    // The keyboard alone: Tab to a session's link and Enter opens it; Tab to a segment of its
    // context bar and Enter opens that summary.
    client.goto(&format!("{base}/ui")).await.unwrap();
    view_says(&client, "Sessions (2)").await;
    tab_to(&client, |text, _| text == "ses_0").await;
    press(&client, Key::Enter).await;
    view_says(&client, "The context as it stands").await;
    element(&client, "#context-bar a").await;
    tab_to(&client, |_, href| href.starts_with("/ui/summaries/")).await;
    press(&client, Key::Enter).await;
    view_says(&client, "Covers").await;
    assert!(
        client
            .current_url()
            .await
            .unwrap()
            .path()
            .starts_with("/ui/summaries/sum_")
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
    // The counts reach 12 of 12 a moment before the job's status says it ended.
    let done = view_says(&client, "completed").await;
    assert!(done.contains("12 of 12 (0 failed)"), "{done}");
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

/// A session of 100,000 messages compacted into a DAG five levels deep opens in the browser in
/// under 300 ms: from navigation to the context bar drawn (`document.body.dataset
/// .contextDrawnMs`, the page's `performance.now()` then), five loads interleaved with those of
/// a session of 400 messages. The page reads the session, its layout (the summaries standing in
/// the context) and one page of the timeline, never the history, so the large session must load
/// about as fast as the small one whatever the machine's load, and under 300 ms when the machine
/// is not too busy for the small one to load quickly (the suite runs other tests beside it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_of_100k_messages_opens_in_under_300_ms() {
    let Some((driver, chromium)) = browser() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    // 100,000 generated turns of one session (a few words each, deterministic).
    let words = [
        "parser", "store", "index", "budget", "summary", "context", "token", "window", "agent",
        "tool", "file", "search", "regex", "error", "fixed", "tests", "branch", "config",
    ];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut history = |session: &str, turns: u64| {
        let mut lines = String::with_capacity(17 << 20);
        for i in 0..turns {
            let text: Vec<&str> = (0..12)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    words[(state >> 33) as usize % words.len()]
                })
                .collect();
            let line = json!({
                "session": session,
                "role": if i % 2 == 0 { "user" } else { "assistant" },
                "created_at": 1_767_225_600_000u64 + i * 1_000,
                "content": format!("{i}: {}", text.join(" ")),
            });
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        let path = tmp.path().join(format!("{session}.jsonl"));
        std::fs::write(&path, lines).unwrap();
        path
    };
    // The session under test, and a small one to compare with in the same run.
    let large = history("large", 100_000);
    let small = history("small", 400);
    lcm(
        &data,
        &[
            "import",
            "-q",
            large.to_str().unwrap(),
            small.to_str().unwrap(),
        ],
    );
    // Small leaves, so that the 1.9 M tokens make a DAG five levels deep in one run.
    std::fs::write(
        data.join("config.toml"),
        format!(
            "[server]\ntoken = \"{ADMIN}\"\n[compaction]\nleaf_chunk_tokens = 1200\n\
             leaf_target_tokens = 400\nmax_passes = 100000\n"
        ),
    )
    .unwrap();
    let out = lcm(
        &data,
        &["compact", "-q", "--json", "ses_0", "--budget", "64000"],
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["reached_goal"], true, "{report}");
    let deepest = report["passes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["depth"].as_u64())
        .max()
        .unwrap();
    assert!(deepest >= 5, "a DAG {deepest} levels deep");
    lcm(&data, &["compact", "-q", "ses_1", "--budget", "2000"]);

    let mut daemon = KillOnDrop(spawn(&data, "127.0.0.1:0"));
    let mut stderr = BufReader::new(daemon.0.stderr.take().unwrap());
    let (_, addr) = wait_listening(&mut stderr);
    let base = format!("http://{addr}");
    let (_browser, client) = open_browser(&driver, &chromium).await;
    client.goto(&format!("{base}/ui")).await.unwrap();
    enter_token(&client, ADMIN).await;
    view_says(&client, "Sessions (2)").await;
    // Loads of the large and the small session, interleaved, so that both see the same machine.
    let mut drawn: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for _ in 0..5 {
        for (which, session) in ["ses_0", "ses_1"].into_iter().enumerate() {
            client.goto("about:blank").await.unwrap();
            client
                .goto(&format!("{base}/ui/sessions/{session}"))
                .await
                .unwrap();
            element(&client, "#context-bar a").await;
            let ms = client
                .execute(
                    "return Number(document.body.dataset.contextDrawnMs)",
                    vec![],
                )
                .await
                .unwrap()
                .as_f64()
                .unwrap();
            drawn[which].push(ms);
        }
    }
    client
        .goto(&format!("{base}/ui/sessions/ses_0"))
        .await
        .unwrap();
    let page = view_says(&client, "The context as it stands").await;
    assert!(page.contains("100,000"), "{page}");
    for d in &mut drawn {
        d.sort_by(f64::total_cmp);
    }
    let [large, small] = &drawn;
    eprintln!(
        "context bar drawn after: 100,000 messages, depth {deepest}: {large:?} ms; \
         400 messages: {small:?} ms"
    );
    // The page reads the same few things whatever the history: the large session loads about
    // as fast as the small one measured beside it, however busy the machine is.
    assert!(
        large[2] <= small[2] * 3.0 + 150.0,
        "median {} ms for 100,000 messages against {} ms for 400",
        large[2],
        small[2]
    );
    // And under 300 ms, on a machine not so busy that the small session itself is slow (the
    // suite runs other tests beside this one; docs/PERFORMANCE.md has the quiet figure).
    if small[0] < 100.0 {
        assert!(
            large[0] < 300.0,
            "fastest load of 100,000 messages {} ms (all: {large:?})",
            large[0]
        );
    } else {
        eprintln!(
            "the machine is busy (400 messages take {} ms at best): the 300 ms bound is not \
             checked in this run",
            small[0]
        );
    }
    client.close().await.unwrap();
    stop_cleanly(&mut daemon.0, stderr);
}
