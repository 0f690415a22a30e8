//! Scratch directories of the benches, under `LCM_BENCH_DIR` (else the directory the bench
//! runs in), removed when the bench ends.
//!
//! A fixture built once and kept in a `static` (the corpus every group of `store.rs` reads,
//! the data directories of `vectors.rs`) is never dropped, so a `TempDir` it held was never
//! removed: each run left its store and indexes behind, gigabytes at a million messages.
//! Such fixtures take a [`kept`] directory instead, and the bench's `main` holds a
//! [`RemoveKeptOnExit`] while criterion's groups run.

use std::path::PathBuf;
use std::sync::Mutex;

/// Directories handed out by [`kept`], removed by [`RemoveKeptOnExit`].
static KEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A new directory for a fixture that lives until the bench ends.
pub fn kept() -> PathBuf {
    let parent = std::env::var_os("LCM_BENCH_DIR").unwrap_or_else(|| ".".into());
    let dir = tempfile::tempdir_in(parent)
        .expect("a scratch directory (LCM_BENCH_DIR, else the current directory)")
        .keep();
    KEPT.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(dir.clone());
    dir
}

/// Removes every directory [`kept`] handed out when dropped: a bench's `main` holds one while
/// criterion's groups run, so the directories go when they end or one of them panics.
pub struct RemoveKeptOnExit;

impl Drop for RemoveKeptOnExit {
    fn drop(&mut self) {
        let dirs = std::mem::take(
            &mut *KEPT
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for dir in dirs {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                eprintln!(
                    "could not remove the scratch directory {}: {e}",
                    dir.display()
                );
            }
        }
    }
}
