//! Choosing parts of a benchmark: `LCM_BENCH_GROUPS` (comma-separated group names; all when
//! unset), so one part can be measured without building the others' fixtures.

/// Whether the bench's group `name` is to run.
pub fn wanted(name: &str) -> bool {
    std::env::var("LCM_BENCH_GROUPS").map_or(true, |g| g.split(',').any(|g| g.trim() == name))
}
