//! The layering of the workspace, checked on its manifests and sources: every crate depends
//! only on the crates below it, nothing above the store names redb (so that a second storage
//! backend can replace it without touching the engine, the daemon or the tools), the store
//! names no crate of the search (the index engine is the search's), the search reads the store
//! only through its record source, and the regex planning crate depends on nothing but the
//! regex crates.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The names in a manifest's dependency tables (`[dependencies]`, `[dev-dependencies]`,
/// `[build-dependencies]`, target-specific ones too).
fn dependencies(manifest: &Path, kinds: &[&str]) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let mut names = BTreeSet::new();
    let mut add = |table: &toml::Table| {
        for kind in kinds {
            if let Some(deps) = table.get(*kind).and_then(toml::Value::as_table) {
                names.extend(deps.keys().cloned());
            }
        }
    };
    add(&doc);
    if let Some(targets) = doc.get("target").and_then(toml::Value::as_table) {
        for target in targets.values().filter_map(toml::Value::as_table) {
            add(target);
        }
    }
    names
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The crates of the workspace from the bottom up: each may depend on those before it only.
const LAYERS: &[(&str, &[&str])] = &[
    ("lcm-core", &[]),
    ("lcm-regex", &[]),
    ("lcm-files", &["lcm-core"]),
    ("lcm-llm", &["lcm-core"]),
    ("lcm-embed", &["lcm-core"]),
    ("lcm-store", &["lcm-core", "lcm-files"]),
    (
        "lcm-search",
        &["lcm-core", "lcm-embed", "lcm-regex", "lcm-store"],
    ),
    (
        "lcm-engine",
        &[
            "lcm-core",
            "lcm-embed",
            "lcm-files",
            "lcm-llm",
            "lcm-regex",
            "lcm-search",
            "lcm-store",
        ],
    ),
    (
        "lcm-server",
        &[
            "lcm-core",
            "lcm-embed",
            "lcm-engine",
            "lcm-llm",
            "lcm-regex",
            "lcm-store",
        ],
    ),
    (
        "lcm-mcp",
        &[
            "lcm-core",
            "lcm-embed",
            "lcm-engine",
            "lcm-regex",
            "lcm-search",
            "lcm-store",
        ],
    ),
    (
        "lcm-eval",
        &[
            "lcm-core",
            "lcm-embed",
            "lcm-engine",
            "lcm-files",
            "lcm-llm",
            "lcm-regex",
            "lcm-search",
            "lcm-store",
        ],
    ),
    (
        "lcm-cli",
        &[
            "lcm-core",
            "lcm-embed",
            "lcm-engine",
            "lcm-eval",
            "lcm-llm",
            "lcm-mcp",
            "lcm-regex",
            "lcm-search",
            "lcm-server",
            "lcm-store",
        ],
    ),
];

/// The crates above the store, and the facade: none may name redb.
const ABOVE_THE_STORE: &[&str] = &[
    "lcm-search",
    "lcm-engine",
    "lcm-server",
    "lcm-mcp",
    "lcm-eval",
    "lcm-cli",
];

#[test]
fn every_crate_depends_only_on_the_crates_below_it() {
    let mut listed: Vec<&str> = LAYERS.iter().map(|(name, _)| *name).collect();
    listed.sort_unstable();
    let mut found: Vec<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort_unstable();
    assert_eq!(found, listed, "every crate has its place in LAYERS");
    for (name, allowed) in LAYERS {
        let manifest = root().join("crates").join(name).join("Cargo.toml");
        let ours: BTreeSet<String> = dependencies(&manifest, &["dependencies"])
            .into_iter()
            .filter(|d| d.starts_with("lcm-"))
            .collect();
        let extra: Vec<&String> = ours
            .iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{name} depends on {extra:?}, which are not below it"
        );
    }
}

#[test]
fn nothing_above_the_store_names_redb() {
    let kinds = ["dependencies", "dev-dependencies", "build-dependencies"];
    let mut manifests: Vec<PathBuf> = ABOVE_THE_STORE
        .iter()
        .map(|name| root().join("crates").join(name).join("Cargo.toml"))
        .collect();
    manifests.push(root().join("Cargo.toml"));
    for manifest in &manifests {
        let deps = dependencies(manifest, &kinds);
        assert!(
            !deps.contains("redb"),
            "{} depends on redb: only lcm-store may",
            manifest.display()
        );
    }
    let mut files = Vec::new();
    for name in ABOVE_THE_STORE {
        sources(&root().join("crates").join(name), &mut files);
    }
    for dir in ["src", "tests", "benches", "examples"] {
        sources(&root().join(dir), &mut files);
    }
    assert!(files.len() > 50, "the sources were found ({})", files.len());
    let this = Path::new(file!()).file_name().unwrap();
    for file in files {
        if file.file_name() == Some(this) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            !text.contains("redb::"),
            "{} uses redb directly: go through lcm-store's API",
            file.display()
        );
    }
}

/// What the store must not name: the crates of the derived search and its index engine (a
/// dependency whose name starts with one of these).
const THE_SEARCH: &[&str] = &["lcm-search", "lcm-regex", "tantivy"];

#[test]
fn the_store_names_neither_the_search_nor_its_index_engine() {
    // The store and every workspace crate it builds on (its dev-dependencies may use the
    // search: its integration tests check the index's agreement with it).
    let mut pending = vec!["lcm-store".to_string()];
    let mut seen = BTreeSet::new();
    while let Some(name) = pending.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let manifest = root().join("crates").join(&name).join("Cargo.toml");
        let deps = dependencies(&manifest, &["dependencies", "build-dependencies"]);
        for dep in &deps {
            assert!(
                !THE_SEARCH.iter().any(|s| dep.starts_with(s)),
                "{name} (lcm-store or a crate below it) depends on {dep}: the index is lcm-search's"
            );
        }
        pending.extend(deps.into_iter().filter(|d| d.starts_with("lcm-")));
    }
    assert!(
        seen.contains("lcm-core"),
        "the walk reached the crates below ({seen:?})"
    );
    let mut files = Vec::new();
    sources(&root().join("crates/lcm-store/src"), &mut files);
    assert!(files.len() > 10, "the sources were found ({})", files.len());
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for path in ["tantivy::", "lcm_search::", "lcm_regex::"] {
            assert!(
                !text.contains(path),
                "{} uses {path}: the store names no crate of the search",
                file.display()
            );
        }
    }
}

/// The files of `lcm-search` that may name redb's store, each for a reason of its own: the data
/// directory opens the store file (choosing the backend is its job), and the integrity check's
/// `DerivedIndex::rebuild_from` takes the store it checks (a check is of one backend's tables).
const SEARCH_FILES_NAMING_THE_STORE: &[&str] = &["data_dir.rs", "lib.rs"];

/// Whether `text` names redb's store or its reader: `Store` or `StoreReader` as a whole word
/// (`StoreError`, `StoreOptions` are not the store), or anything of `lcm_store::store`.
fn names_the_store(text: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let whole = |name: &str| {
        text.match_indices(name).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + name.len()..].chars().next();
            !before.is_some_and(word) && !after.is_some_and(word)
        })
    };
    whole("Store") || whole("StoreReader") || text.contains("lcm_store::store::")
}

#[test]
fn search_reads_the_store_only_through_the_record_source() {
    // Code only: a file's tests (its `#[cfg(test)] mod tests`, last in the file) build stores
    // to search, and a comment may name the store it talks about.
    let mut files = Vec::new();
    sources(&root().join("crates/lcm-search/src"), &mut files);
    assert!(files.len() > 5, "the sources were found ({})", files.len());
    let mut checked = 0;
    for file in files {
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if SEARCH_FILES_NAMING_THE_STORE.contains(&name) {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            let line = line.trim_start();
            if line.starts_with("//") {
                continue;
            }
            assert!(
                !names_the_store(line),
                "{}:{}: `{line}` names redb's store: search reads messages through \
                 lcm_store::RecordSource, which a second backend implements",
                file.display(),
                n + 1
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 5,
        "grep, index, semantic and more were checked ({checked})"
    );
    assert!(names_the_store("fn f(store: &Store)"));
    assert!(names_the_store("use lcm_store::store::Store;"));
    assert!(!names_the_store("Result<(), StoreError>"));
}

#[test]
fn the_regex_planning_crate_depends_only_on_the_regex_crates() {
    let manifest = root().join("crates/lcm-regex/Cargo.toml");
    let deps = dependencies(&manifest, &["dependencies"]);
    let expected: BTreeSet<String> = ["regex-automata", "regex-syntax"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(deps, expected);
}
