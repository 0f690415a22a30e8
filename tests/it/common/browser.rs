//! A real Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`; `.ci/run`
//! installs them, tests skip without them), for the web explorer's tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// chromedriver and chromium, if both are installed.
pub fn browser() -> Option<(PathBuf, PathBuf)> {
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

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// chromedriver in a process group of its own, with the Chromium it starts: dropping it (a test
/// that ends or panics) kills the whole group, so no browser outlives its test.
pub struct BrowserProcesses(Child);

impl Drop for BrowserProcesses {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts chromedriver and a headless Chromium session through it.
pub async fn open_browser(driver: &Path, chromium: &Path) -> (BrowserProcesses, Client) {
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
pub async fn element(client: &Client, css: &str) -> fantoccini::elements::Element {
    client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no `{css}`: {e}"))
}

/// The text of the first element `css` finds, once there is one.
pub async fn text_of(client: &Client, css: &str) -> String {
    element(client, css).await.text().await.unwrap()
}

/// Waits until the page's main view says `needle`.
pub async fn view_says(client: &Client, needle: &str) -> String {
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
pub async fn press(client: &Client, key: Key) {
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
pub async fn tab_to(client: &Client, wanted: impl Fn(&str, &str) -> bool) {
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

pub async fn enter_token(client: &Client, token: &str) {
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

pub async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// `lcm ARGS` on `data`, which must succeed.
pub fn lcm_ok(data: &Path, args: &[&str]) -> std::process::Output {
    let out = super::lcm(data, args);
    assert!(
        out.status.success(),
        "lcm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
