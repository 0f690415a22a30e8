//! The web explorer (`/ui`) in a real Chromium, driven over WebDriver (Debian's `chromium` and
//! `chromium-driver`; `.ci/run` installs them, the test installs nothing and skips without
//! them). A real transcript from ../shared/data, compacted into a DAG, served by `lcm serve`
//! with an admin token and a tenant: the token prompt, the sessions list, a session's context
//! bar and DAG (with a pinned message and a forgotten summary), a summary and its sources, a search followed to its message, a file record, the
//! keyboard alone, bad input (a malformed id, an invalid regex, a wrong token), the health page,
//! a map job watched to its end, and a tenant who cannot see another tenant's session.
//! Screenshots of the main views go to docs/screenshots/. The page load of a session of 100,000
//! messages is measured alone, in its own test binary (tests/page_load/).

use std::path::Path;
use std::time::Duration;

use fantoccini::Locator;
use fantoccini::key::Key;
use serde_json::{Value, json};

use crate::common;
use crate::common::browser::{
    browser, element, enter_token, lcm_ok as lcm, open_browser, press, screenshot, tab_to, text_of,
    view_says,
};
use crate::common::daemon::Daemon;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};

const ADMIN: &str = "admin-token-for-the-explorer-test-0123";
const TENANT: &str = "tenant-token-for-the-explorer-test-0123";

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
    let context: Value =
        serde_json::from_slice(&lcm(&data, &["context", "ses_0", "--budget", "6000"]).stdout)
            .unwrap();
    // The agent's marks: the first message pinned (summarised: shown in the pinned block), the
    // first top-level summary forgotten (shown as a pointer).
    let top = context["summaries"][0].as_str().unwrap();
    lcm(&data, &["tool", "lcm_pin", "--args", r#"{"id": "msg_0"}"#]);
    lcm(
        &data,
        &[
            "tool",
            "lcm_forget",
            "--args",
            &json!({ "id": top }).to_string(),
        ],
    );
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

    let daemon = Daemon::start(&data, "127.0.0.1:0");
    let addr = daemon.addr;
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
    // The marks: the forgotten summary hatched and as narrow as its pointer, the pinned block
    // a segment of its own, both listed with links.
    let forgotten = element(
        &client,
        &format!("#context-bar a.forgotten[href$='/{top}']"),
    )
    .await;
    let label = forgotten.attr("aria-label").await.unwrap().unwrap();
    assert!(label.ends_with("forgotten"), "{label}");
    element(&client, "#context-bar a#pinned-block").await;
    let marks = text_of(&client, "ul.marks").await;
    assert!(
        marks.contains("msg_0") && marks.contains("in the pinned block"),
        "{marks}"
    );
    assert!(
        marks.contains(top) && marks.contains("shown as a pointer"),
        "{marks}"
    );
    let facts = view_says(&client, "Pinned").await;
    assert!(
        facts.contains("1 message (1 in the pinned block"),
        "{facts}"
    );
    // A pinned message's page says where it is pinned.
    client
        .goto(&format!("{base}/ui/messages/msg_0"))
        .await
        .unwrap();
    let pinned = view_says(&client, "Marks").await;
    assert!(pinned.contains("pinned in ses_0"), "{pinned}");
    client.back().await.unwrap();
    view_says(&client, "The context as it stands").await;
    view_says(&client, "#0..#").await;
    // Expanding a DAG node lists its sources.
    let toggle = client
        .find(Locator::Css("#dag button.toggle"))
        .await
        .unwrap();
    toggle.click().await.unwrap();
    text_of(&client, "#dag li ul li a").await;
    let dag = text_of(&client, "#dag").await;
    assert!(!dag.contains("null") && !dag.contains("[object"), "{dag}");
    assert!(dag.contains("forgotten"), "{dag}");
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
    let (status, body) = crate::common::daemon::http(
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
    daemon.stop();
    // Looking changed nothing stored.
    let after: Value = serde_json::from_slice(&lcm(&data, &["stats", "--json"]).stdout).unwrap();
    assert_eq!(before["store"]["messages"], after["store"]["messages"]);
    assert_eq!(before["store"]["sessions"], after["store"]["sessions"]);
}
