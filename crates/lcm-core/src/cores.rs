//! How many threads parallel work uses (the store's ingest, import, grep's scans).

use std::sync::OnceLock;

/// The cores this process may use, read once. `std::thread::available_parallelism` reads the
/// cgroup files on every call (about 20 µs, measured here), which a single durable append or a
/// grep of a few unindexed messages would otherwise pay each time.
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
