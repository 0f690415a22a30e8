//! Search by meaning with the real embedding model (all-MiniLM-L6-v2 from
//! `../shared/tools/embed-model`; skipped without it): semantic and hybrid grep, scopes, pages,
//! the vector index as a derived index (rebuilt alike, caught up after a kill -9), and the
//! clear error without a model.

use crate::common;

use std::path::Path;
use std::process::Command;

use lcm::core::config::Config;
use lcm::core::ids::{MessageId, SessionId};
use lcm::core::message::{NewMessage, Role};
use lcm::search::{DataDir, GrepMode, GrepPage, GrepRequest, Scope, grep};

const FACTS: [&str; 4] = [
    "The deploy failed because the disk on the build server was completely full.",
    "We adopted a puppy last week and named him Rex.",
    "For lunch I had a bowl of tomato soup with bread.",
    "The flight to Lisbon was delayed by three hours because of a storm.",
];

fn filler(i: usize) -> String {
    format!(
        "Status update {i}: the quarterly report table has {i} rows and the column totals match."
    )
}

/// A data directory with the facts and filler in two sessions, indexed and embedded.
fn filled(dir: &Path, config: &Config) -> (DataDir, SessionId, SessionId) {
    let data = DataDir::open(dir, config).unwrap();
    let a = data.store.create_session("a", None).unwrap();
    let b = data.store.create_session("b", None).unwrap();
    let mut batch: Vec<NewMessage> = (0..40)
        .map(|i| NewMessage::text(Role::User, filler(i)))
        .collect();
    batch.extend(FACTS.iter().map(|f| NewMessage::text(Role::Assistant, *f)));
    data.store.append_batch(a, batch).unwrap();
    data.store
        .append(b, NewMessage::text(Role::User, FACTS[0]))
        .unwrap();
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    let semantic = data.index.semantic().expect("a model is configured");
    semantic
        .catch_up_until(&data.store, |_, _| {}, || false)
        .unwrap();
    (data, a, b)
}

fn search(
    data: &DataDir,
    mode: GrepMode,
    pattern: &str,
    scope: Scope,
    cursor: Option<String>,
) -> GrepPage {
    grep(
        &data.store,
        &data.index,
        &Config::default().search,
        &GrepRequest {
            pattern: pattern.into(),
            mode,
            scope,
            limit: Some(5),
            cursor,
        },
    )
    .unwrap()
}

fn text_of(data: &DataDir, id: MessageId) -> String {
    data.store.message(id).unwrap().search_text().into_owned()
}

#[test]
fn meaning_finds_what_the_words_miss_within_the_scope() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data, a, b) = filled(
        &tmp.path().join("lcm"),
        &common::config_with_embeddings(&model),
    );
    let semantic = data.index.semantic().unwrap();
    assert_eq!(
        semantic.watermark().unwrap(),
        data.store.next_message_id().unwrap()
    );

    // No word of the query is in the fact: full text misses it, meaning finds it first.
    let query = "storage ran out of space";
    let words = grep(
        &data.store,
        &data.index,
        &Config::default().search,
        &GrepRequest {
            pattern: query.into(),
            mode: GrepMode::FullText,
            scope: Scope::default(),
            limit: Some(5),
            cursor: None,
        },
    )
    .unwrap();
    assert!(
        words
            .hits
            .iter()
            .all(|h| !text_of(&data, h.message).contains("disk"))
    );
    let page = search(&data, GrepMode::Semantic, query, Scope::default(), None);
    let first = &page.hits[0];
    assert!(text_of(&data, first.message).contains("disk"), "{page:?}");
    assert_eq!(first.found_by, vec![GrepMode::Semantic]);
    assert!(first.score.is_some_and(|s| s > 0.2 && s <= 1.01));
    assert!(page.hits.windows(2).all(|w| w[0].score >= w[1].score));

    // The scope applies before ranking: session b holds the same fact once.
    let only_b = search(
        &data,
        GrepMode::Semantic,
        query,
        Scope {
            session: Some(b),
            ..Scope::default()
        },
        None,
    );
    assert_eq!(only_b.hits.len(), 1);
    assert_eq!(only_b.hits[0].session, b);
    let assistant_in_a = search(
        &data,
        GrepMode::Semantic,
        "a dog joined the family",
        Scope {
            session: Some(a),
            roles: vec![Role::Assistant],
            ..Scope::default()
        },
        None,
    );
    assert!(text_of(&data, assistant_in_a.hits[0].message).contains("puppy"));
    assert!(
        assistant_in_a
            .hits
            .iter()
            .all(|h| h.role == Role::Assistant && h.session == a)
    );

    // Hybrid: both sides; a hit found by both says so.
    let hybrid = search(
        &data,
        GrepMode::Hybrid,
        "flight delayed storm",
        Scope::default(),
        None,
    );
    let top = &hybrid.hits[0];
    assert!(text_of(&data, top.message).contains("Lisbon"));
    assert_eq!(top.found_by, vec![GrepMode::FullText, GrepMode::Semantic]);
    assert!(
        top.snippet.contains("flight") || top.snippet.contains("delayed"),
        "{}",
        top.snippet
    );
}

#[test]
fn pages_of_a_semantic_search_follow_their_cursors_without_repeats() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (data, a, _) = filled(
        &tmp.path().join("lcm"),
        &common::config_with_embeddings(&model),
    );
    for mode in [GrepMode::Semantic, GrepMode::Hybrid] {
        let scope = Scope {
            session: Some(a),
            ..Scope::default()
        };
        let mut seen = Vec::new();
        let mut cursor = None;
        loop {
            let page = search(&data, mode, "report table rows", scope.clone(), cursor);
            seen.extend(page.hits.iter().map(|h| h.message));
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
            assert!(seen.len() < 200, "pages never end");
        }
        let mut unique = seen.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), seen.len(), "{mode:?}: a message on two pages");
        assert!(seen.len() >= 40, "{mode:?}: {} messages", seen.len());
        // A cursor of one mode is refused by the other.
        let first = search(&data, mode, "report table rows", scope.clone(), None);
        let other = if mode == GrepMode::Semantic {
            GrepMode::Hybrid
        } else {
            GrepMode::Semantic
        };
        let err = grep(
            &data.store,
            &data.index,
            &Config::default().search,
            &GrepRequest {
                pattern: "report table rows".into(),
                mode: other,
                scope,
                limit: Some(5),
                cursor: first.next_cursor,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("cursor"), "{err}");
    }
}

#[test]
fn a_rebuild_gives_the_same_results_and_a_new_model_starts_over() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = common::config_with_embeddings(&model);
    let (data, _, _) = filled(&tmp.path().join("lcm"), &config);
    let queries = [
        "storage ran out of space",
        "a dog joined the family",
        "soup",
    ];
    let before: Vec<GrepPage> = queries
        .iter()
        .map(|q| search(&data, GrepMode::Hybrid, q, Scope::default(), None))
        .collect();
    let semantic = data.index.semantic().unwrap();
    let chunks = semantic.chunk_count().unwrap();
    semantic
        .rebuild_until(&data.store, |_, _| {}, || false)
        .unwrap();
    assert_eq!(semantic.chunk_count().unwrap(), chunks);
    for (q, page) in queries.iter().zip(&before) {
        let again = search(&data, GrepMode::Hybrid, q, Scope::default(), None);
        let ids = |p: &GrepPage| p.hits.iter().map(|h| h.message).collect::<Vec<_>>();
        assert_eq!(ids(&again), ids(page), "{q}");
    }
}

#[test]
fn kill_9_while_embedding_loses_nothing_the_next_catch_up_embeds() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lcm");
    let config_path = tmp.path().join("config.toml");
    std::fs::write(
        &config_path,
        format!(
            "[embeddings]\nmodel_dir = {:?}\nindex_batch = 16\nthreads = 1\n",
            model.display().to_string()
        ),
    )
    .unwrap();
    {
        let data = DataDir::open(&dir, &Config::default()).unwrap();
        let s = data.store.create_session("long", None).unwrap();
        let batch: Vec<NewMessage> = (0..600)
            .map(|i| NewMessage::text(Role::User, filler(i)))
            .collect();
        data.store.append_batch(s, batch).unwrap();
        data.store
            .append(s, NewMessage::text(Role::User, FACTS[1]))
            .unwrap();
    }
    // `lcm reindex` embeds in commits of 16 messages: killed once some are committed.
    let mut child = Command::new(env!("CARGO_BIN_EXE_lcm"))
        .arg("--data-dir")
        .arg(&dir)
        .arg("--config")
        .arg(&config_path)
        .args(["reindex", "-q"])
        .spawn()
        .unwrap();
    let manifest = dir.join("vectors/manifest.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let watermark = std::fs::read(&manifest)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|m| m["watermark"].as_u64())
            .unwrap_or(0);
        if watermark >= 32 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no embedding committed in time"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let config = Config::from_toml(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let data = DataDir::open(&dir, &config).unwrap();
    let semantic = data.index.semantic().unwrap();
    let survived = semantic.watermark().unwrap();
    assert!(survived.0 >= 32 && survived.0 < 601, "{survived:?}");
    semantic
        .catch_up_until(&data.store, |_, _| {}, || false)
        .unwrap();
    assert_eq!(semantic.watermark().unwrap(), MessageId(601));
    // Every message has exactly its chunks: as many as a fresh embedding of the store makes.
    let after_crash = semantic.chunk_count().unwrap();
    semantic
        .rebuild_until(&data.store, |_, _| {}, || false)
        .unwrap();
    assert_eq!(semantic.chunk_count().unwrap(), after_crash);
    let page = search(
        &data,
        GrepMode::Semantic,
        "a dog joined the family",
        Scope::default(),
        None,
    );
    assert!(text_of(&data, page.hits[0].message).contains("puppy"));
}

#[test]
fn without_a_model_the_modes_name_the_option_and_a_bad_model_says_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let data = DataDir::open(tmp.path().join("plain"), &Config::default()).unwrap();
    assert!(data.index.semantic().is_none());
    let s = data.store.create_session("s", None).unwrap();
    data.store
        .append(s, NewMessage::text(Role::User, "hello"))
        .unwrap();
    let err = grep(
        &data.store,
        &data.index,
        &Config::default().search,
        &GrepRequest {
            pattern: "greeting".into(),
            mode: GrepMode::Hybrid,
            scope: Scope::default(),
            limit: None,
            cursor: None,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("[embeddings]") && err.to_string().contains("model_dir"));
    assert!(!tmp.path().join("plain/vectors").exists());

    // A model directory that is not one: the search says so, naming the directory.
    let mut config = Config::default();
    config.embeddings.model_dir = Some(tmp.path().join("no-model-here"));
    drop(data);
    let data = DataDir::open(tmp.path().join("plain"), &config).unwrap();
    let err = grep(
        &data.store,
        &data.index,
        &config.search,
        &GrepRequest {
            pattern: "greeting".into(),
            mode: GrepMode::Semantic,
            scope: Scope::default(),
            limit: None,
            cursor: None,
        },
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("no-model-here") && text.contains("config.json"),
        "{text}"
    );
    assert_eq!(data.store.stats().unwrap().messages, 1);
}
