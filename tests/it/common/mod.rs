//! Shared helpers of the integration tests (also of tests/page_load, which includes this file).

pub mod browser;
pub mod daemon;

use std::path::PathBuf;

use lcm::TokenCounter;
use lcm::core::config::Config;
use lcm::search::DataDir;
use lcm::store::{Store, StoreOptions};

/// `lcm --data-dir DATA_DIR ARGS...`, run to its end (no configuration from the environment).
pub fn lcm(data_dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env_remove("LCM_CONFIG")
        .output()
        .expect("run lcm")
}

/// The JSON value a successful `lcm --json` printed (failing the test with its stderr if it
/// did not succeed).
pub fn json(output: &std::process::Output) -> serde_json::Value {
    assert!(
        output.status.success(),
        "lcm failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is JSON")
}

/// `../shared/data` beside the repository, if present (a fresh clone of the project alone has
/// none: tests that need it skip with a message).
pub fn shared_data() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (it holds the real transcripts); this test needs it",
            dir.display()
        );
        None
    }
}

/// The four long real Claude Code sessions.
pub fn real_sessions(data: &std::path::Path) -> Vec<PathBuf> {
    let dir = data.join("transcripts/claude-code");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension().is_some_and(|e| e == "jsonl")
                        && p.file_stem().is_some_and(|s| s.len() == 36)
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// A data directory in a fresh temporary folder (kept alive by the returned guard).
pub fn temp_data_dir() -> (tempfile::TempDir, DataDir) {
    let tmp = tempfile::tempdir().expect("temp dir");
    let data = DataDir::open(tmp.path().join("data"), &Config::default()).expect("open data dir");
    (tmp, data)
}

/// Options for opening a [`Store`] directly, with the default configuration's tokenizer.
pub fn store_options() -> StoreOptions {
    StoreOptions::new(TokenCounter::new(Config::default().tokenizer.encoding()))
}

/// The store of a closed data directory, opened read-only: this fails with
/// `StoreError::NeedsRecovery` if the last process to write it did not close it cleanly.
pub fn open_closed_store(data_dir: &std::path::Path) -> lcm::store::Result<Store> {
    Store::open_read_only(
        data_dir.join(lcm::search::data_dir::STORE_FILE),
        store_options(),
    )
}

/// The name libtest gives test function `name` of the module at `module` (its `module_path!()`,
/// whose first segment, the test binary's crate, libtest leaves out): what `--exact` matches when
/// a test runs this binary again as a child process that plays its part.
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// Sends SIGINT (what Ctrl-C sends) to process `pid`.
#[cfg(unix)]
pub fn send_sigint(pid: u32) {
    let sent = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -INT {pid}");
}

/// The all-MiniLM-L6-v2 directory from `../shared/tools/embed-model/setup.sh`, or `None` (with a
/// message) when the model cannot be put on disk.
pub fn embed_model_dir() -> Option<PathBuf> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let setup =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/tools/embed-model/setup.sh");
        let out = std::process::Command::new(&setup).output();
        match out {
            Ok(out) if out.status.success() => Some(PathBuf::from(
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            )),
            Ok(out) => {
                eprintln!(
                    "SKIPPED: the embedding model could not be set up: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED: cannot run {}: {e}", setup.display());
                None
            }
        }
    })
    .clone()
}

/// The default configuration with the embedding model of [`embed_model_dir`].
pub fn config_with_embeddings(model_dir: &std::path::Path) -> Config {
    let mut config = Config::default();
    config.embeddings.model_dir = Some(model_dir.to_path_buf());
    config.embeddings.index_batch = 64;
    config
}
