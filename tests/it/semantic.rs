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
    caught_up(&data);
    (data, a, b)
}

/// Catches the words index, then the embeddings, up with the store; returns the messages and
/// summaries embedded.
fn caught_up(data: &DataDir) -> u64 {
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    data.index
        .semantic()
        .expect("a model is configured")
        .catch_up_until(&data.store, |_, _| {}, || false)
        .unwrap()
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

/// A session of 60 status updates.
fn long_session(data: &DataDir) -> SessionId {
    let session = data.store.create_session("long", None).unwrap();
    let batch: Vec<NewMessage> = (0..60)
        .map(|i| NewMessage::text(Role::User, filler(i)))
        .collect();
    data.store.append_batch(session, batch).unwrap();
    session
}

/// Compacts `session` (a [`long_session`]) into summaries with the extractive summariser;
/// returns how many the store holds (two at least).
async fn compacted(data: &DataDir, session: SessionId) -> u64 {
    use lcm::core::config::CompactionConfig;
    use lcm::llm::extractive::ExtractiveSummarizer;
    let compaction = CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 300,
        leaf_target_tokens: 80,
        ..CompactionConfig::default()
    };
    let summarizer = ExtractiveSummarizer::new(data.store.counter());
    lcm::engine::compact(&data.store, session, 400, &compaction, &summarizer, |_| {})
        .await
        .unwrap();
    let summaries = data.store.next_summary_id().unwrap().0;
    assert!(summaries >= 2, "{summaries} summaries");
    summaries
}

/// The page the `lcm_grep` tool gives for `args` over `data`.
async fn lcm_grep(data: &DataDir, config: &Config, args: serde_json::Value) -> serde_json::Value {
    use lcm::engine::tools::{Caller, ToolContext, ToolRegistry};
    let ctx = ToolContext::new(
        data.store.clone(),
        Some(data.index.clone()),
        std::sync::Arc::new(config.clone()),
        Caller::main_agent(None),
    );
    ToolRegistry::with_builtins()
        .call(&ctx, "lcm_grep", args)
        .await
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

/// The semantic score of `message` for `query` (which must find it among the first 20).
fn meaning_score(data: &DataDir, query: &str, message: MessageId) -> f32 {
    let page = grep(
        &data.store,
        &data.index,
        &Config::default().search,
        &GrepRequest {
            pattern: query.into(),
            mode: GrepMode::Semantic,
            scope: Scope::default(),
            limit: Some(20),
            cursor: None,
        },
    )
    .unwrap();
    page.hits
        .iter()
        .find(|h| h.message == message)
        .and_then(|h| h.score)
        .unwrap_or_else(|| panic!("{query:?} does not find {message:?}: {page:?}"))
}

#[test]
fn a_message_is_embedded_with_the_head_of_the_message_before_it_in_its_session() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let question = "Which dance piece did your team perform to win the regional competition?";
    let aside = "The printer on the third floor is out of toner again.";
    let reply = "We did Finding Freedom, and the judges loved it.";
    let long = "word ".repeat(400);
    let tmp = tempfile::tempdir().unwrap();
    // One message per commit: every predecessor is read back from the store; 64: most are met
    // earlier in the same batch. The vectors must not depend on it.
    let mut scores = Vec::new();
    for index_batch in [1, 64] {
        let mut config = common::config_with_embeddings(&model);
        config.embeddings.index_batch = index_batch;
        let data = DataDir::open(tmp.path().join(format!("lcm-{index_batch}")), &config).unwrap();
        let a = data.store.create_session("a", None).unwrap();
        let b = data.store.create_session("b", None).unwrap();
        let q = data
            .store
            .append(a, NewMessage::text(Role::User, question))
            .unwrap();
        // Between the two turns of session a, by id: a message of session b.
        data.store
            .append(b, NewMessage::text(Role::User, aside))
            .unwrap();
        let r = data
            .store
            .append(a, NewMessage::text(Role::Assistant, reply))
            .unwrap();
        // A long predecessor gives only its head.
        data.store
            .append(b, NewMessage::text(Role::User, long.as_str()))
            .unwrap();
        let after_long = data
            .store
            .append(b, NewMessage::text(Role::Assistant, "Noted."))
            .unwrap();
        caught_up(&data);

        // The first message of a session is embedded alone: its own text is its nearest query.
        let alone = meaning_score(&data, question, q.id);
        assert!(alone > 0.99, "{alone}");
        // The reply is embedded followed by the question before it in session a, not by the
        // message before it by id (session b's).
        let with_question = meaning_score(&data, &format!("{reply}\n{question}"), r.id);
        let with_aside = meaning_score(&data, &format!("{reply}\n{aside}"), r.id);
        let bare = meaning_score(&data, reply, r.id);
        assert!(with_question > 0.99, "{with_question}");
        assert!(
            with_question > with_aside + 0.05,
            "{with_question} {with_aside}"
        );
        assert!(with_question > bare + 0.05, "{with_question} {bare}");
        // 32 word pieces of the 400-word message ("word" is one piece), not all of it.
        let head = "word ".repeat(32);
        let context = head.trim_end();
        let with_head = meaning_score(&data, &format!("Noted.\n{context}"), after_long.id);
        assert!(with_head > 0.99, "{with_head}");
        scores.push([alone, with_question, with_aside, bare, with_head]);
    }
    // The same vectors (up to the rounding of the texts a model call batches together).
    for (one, many) in scores[0].iter().zip(&scores[1]) {
        assert!((one - many).abs() < 1e-5, "{scores:?}");
    }
}

/// The configured prompts reach the model: the document prompt before every message the
/// index embeds, the query prompt before every query. A message's own text with the document
/// prompt is then its nearest query. Changing the document prompt rebuilds the index at the
/// next open, and the vectors are then embedded the new way.
#[test]
fn the_query_and_document_prompts_are_put_before_what_is_embedded() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let fact = FACTS[1];
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lcm");
    let open = |query_prompt: &str, document_prompt: Option<&str>| {
        let mut config = common::config_with_embeddings(&model);
        config.embeddings.query_prompt = Some(query_prompt.into());
        config.embeddings.document_prompt = document_prompt.map(str::to_string);
        let data = DataDir::open(&dir, &config).unwrap();
        caught_up(&data);
        data
    };
    let id = {
        let data = open("", Some("passage: "));
        let s = data.store.create_session("s", None).unwrap();
        let id = data
            .store
            .append(s, NewMessage::text(Role::User, fact))
            .unwrap()
            .id;
        caught_up(&data);
        // Stored as "passage: {fact}": that text is its nearest query, the fact alone is not.
        let prompted = meaning_score(&data, &format!("passage: {fact}"), id);
        let bare = meaning_score(&data, fact, id);
        assert!(prompted > 0.99, "{prompted}");
        assert!(bare < prompted - 0.01, "{bare} {prompted}");
        id
    };
    {
        // The query prompt goes before the query: the fact alone now finds it exactly.
        let data = open("passage: ", Some("passage: "));
        let score = meaning_score(&data, fact, id);
        assert!(score > 0.99, "{score}");
    }
    // Without the document prompt the index is embedded again, the fact as it is.
    let data = open("", None);
    let score = meaning_score(&data, fact, id);
    assert!(score > 0.99, "{score}");
}

/// Messages stored after the embeddings' catch-up are not in the vector index until the next
/// one: semantic and hybrid pages count them (library, `lcm grep`, the `lcm_grep` tool), the
/// words still find them in hybrid search, and once embedded the count is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn searches_by_meaning_count_the_messages_not_embedded_yet() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lcm");
    let config = common::config_with_embeddings(&model);
    let (data, a, b) = filled(&dir, &config);
    let late = [
        "The violin lesson moved to Thursday at five.",
        "Remember to water the basil on the balcony.",
        "The violin teacher asked us to practise scales.",
    ];
    for text in late {
        data.store
            .append(a, NewMessage::text(Role::User, text))
            .unwrap();
    }
    // The words index catches up (as it does within milliseconds); the embeddings do not.
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    // Appended since: in neither index yet.
    let newest = data
        .store
        .append(
            a,
            NewMessage::text(Role::User, "The violin case needs a new handle."),
        )
        .unwrap()
        .id;
    let page = |mode| search(&data, mode, "violin", Scope::default(), None);
    let hybrid = page(GrepMode::Hybrid);
    assert_eq!(hybrid.not_embedded, Some(4));
    // Found by their words (the newest by a scan past the words index's watermark), each
    // given the embeddings' score at its rank by words (its meaning is unknown, not far):
    // within the first page of 20.
    let wide = |scope: Scope| {
        grep(
            &data.store,
            &data.index,
            &Config::default().search,
            &GrepRequest {
                pattern: "violin".into(),
                mode: GrepMode::Hybrid,
                scope,
                limit: Some(20),
                cursor: None,
            },
        )
        .unwrap()
    };
    let all = wide(Scope::default());
    let late_hits: Vec<_> = all
        .hits
        .iter()
        .filter(|h| text_of(&data, h.message).contains("violin"))
        .collect();
    assert_eq!(
        late_hits.len(),
        3,
        "hybrid finds the late messages by their words: {all:?}"
    );
    assert!(late_hits.iter().all(|h| h.found_by == [GrepMode::FullText]));
    assert!(late_hits.iter().any(|h| h.message == newest));
    // The scan keeps to the scope: session b has no violin.
    let in_b = wide(Scope {
        session: Some(b),
        ..Scope::default()
    });
    assert!(in_b.hits.iter().all(|h| h.session == b), "{in_b:?}");
    assert!(
        in_b.hits
            .iter()
            .all(|h| !text_of(&data, h.message).contains("violin"))
    );
    let semantic = page(GrepMode::Semantic);
    assert_eq!(semantic.not_embedded, Some(4));
    assert!(
        semantic
            .hits
            .iter()
            .all(|h| !text_of(&data, h.message).contains("violin")),
        "{semantic:?}"
    );
    assert_eq!(page(GrepMode::FullText).not_embedded, None);

    // The `lcm_grep` tool says it in its page.
    let tool = |mode: &'static str| {
        lcm_grep(
            &data,
            &config,
            serde_json::json!({"pattern": "violin", "mode": mode}),
        )
    };
    let found = tool("semantic").await;
    assert_eq!(found["not_embedded"]["messages"], 4, "{found}");
    let note = found["not_embedded"]["note"].as_str().unwrap();
    assert!(
        note.contains("4 newest messages are not embedded yet"),
        "{note}"
    );
    assert!(tool("full_text").await.get("not_embedded").is_none());

    // So does `lcm grep`, reading the directory as it is.
    let config_path = tmp.path().join("config.toml");
    std::fs::write(
        &config_path,
        format!(
            "[embeddings]\nmodel_dir = {}\n",
            toml::Value::String(model.to_string_lossy().into_owned())
        ),
    )
    .unwrap();
    let cli = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lcm"));
        cmd.arg("--data-dir")
            .arg(&dir)
            .arg("--config")
            .arg(&config_path)
            .args(["grep", "--mode", "hybrid", "violin"]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    drop(data);
    let printed = cli(false);
    assert!(
        printed.contains("note: 4 newest messages are not embedded yet")
            && printed.contains("hybrid search finds them by their words only"),
        "{printed}"
    );
    let printed: serde_json::Value = serde_json::from_str(&cli(true)).unwrap();
    assert_eq!(printed["not_embedded"], 4);

    // Embedded: nothing to say.
    let data = DataDir::open(&dir, &config).unwrap();
    caught_up(&data);
    let semantic = search(&data, GrepMode::Semantic, "violin", Scope::default(), None);
    assert_eq!(semantic.not_embedded, Some(0));
    assert!(text_of(&data, semantic.hits[0].message).contains("violin"));
    drop(data);
    assert!(!cli(false).contains("note:"));
}

/// A store restored from a copy older than its vector index: the vectors of messages the
/// store no longer has would stand for the new messages given their ids. Until it is embedded
/// again a search by meaning says so; the next catch-up starts over, and the new messages are
/// then found by their own meaning.
#[test]
fn vectors_ahead_of_a_restored_store_are_embedded_again() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lcm");
    let backup = tmp.path().join("backup.redb");
    let store_file = dir.join(lcm::search::data_dir::STORE_FILE);
    let config = common::config_with_embeddings(&model);
    let (data, a, _) = filled(&dir, &config);
    drop(data);
    std::fs::copy(&store_file, &backup).unwrap();
    {
        let data = DataDir::open(&dir, &config).unwrap();
        for text in [
            "The violin lesson moved to Thursday.",
            "The basil needs water.",
        ] {
            data.store
                .append(a, NewMessage::text(Role::User, text))
                .unwrap();
        }
        caught_up(&data);
        assert_eq!(data.index.semantic().unwrap().watermark().unwrap().0, 47);
    }
    std::fs::copy(&backup, &store_file).unwrap();
    let data = DataDir::open(&dir, &config).unwrap();
    let fresh = data
        .store
        .append(
            a,
            NewMessage::text(Role::User, "Our train to Porto leaves at noon."),
        )
        .unwrap()
        .id;
    assert_eq!(fresh.0, 45, "the id the violin lesson had");
    let request = |mode| GrepRequest {
        pattern: "Our train to Porto leaves at noon.".into(),
        mode,
        scope: Scope::default(),
        limit: Some(5),
        cursor: None,
    };
    let search = |mode| {
        grep(
            &data.store,
            &data.index,
            &Config::default().search,
            &request(mode),
        )
    };
    let refused = search(GrepMode::Semantic).unwrap_err().to_string();
    assert!(
        refused.contains("past the store's end") && refused.contains("lcm reindex"),
        "{refused}"
    );
    // The catch-up embeds everything again (45 old messages and the new one).
    assert_eq!(caught_up(&data), 46);
    let page = search(GrepMode::Semantic).unwrap();
    assert_eq!(page.hits[0].message, fresh);
    // Its own text (followed by the head of the turn before it): the stale vector of the
    // violin lesson scored 0.32.
    assert!(page.hits[0].score.unwrap() > 0.6, "{page:?}");
    assert_eq!(page.not_embedded, Some(0));
    let check = data.index.semantic().unwrap().check(&data.store).unwrap();
    assert!(check.is_clean(), "{check:?}");
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
    // What the crash left is consistent: everything below the watermark, nothing past it.
    let check = semantic.check(&data.store).unwrap();
    assert!(check.is_clean(), "{check:?}");
    assert_eq!(check.message_watermark, survived.0);
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

/// `lcm doctor` checks the vector index against the store; an index that claims more than the
/// store holds is reported, and `--repair` rebuilds it (the store itself untouched).
#[test]
fn doctor_checks_the_vector_index_and_repair_rebuilds_it() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lcm");
    let config_path = tmp.path().join("config.toml");
    std::fs::write(
        &config_path,
        format!(
            "[embeddings]\nmodel_dir = {}\nindex_batch = 64\n",
            toml::Value::String(model.to_string_lossy().into_owned())
        ),
    )
    .unwrap();
    let config = Config::from_toml(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let messages = {
        let (data, _, _) = filled(&dir, &config);
        let check = data.index.semantic().unwrap().check(&data.store).unwrap();
        assert!(check.is_clean(), "{check:?}");
        assert_eq!(check.message_watermark, 45);
        assert!(check.message_chunks >= 45);
        data.store.stats().unwrap().messages
    };
    let doctor = |repair: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lcm"));
        cmd.arg("--data-dir")
            .arg(&dir)
            .arg("--config")
            .arg(&config_path)
            .args(["doctor", "--json"]);
        if repair {
            cmd.arg("--repair");
        }
        let out = cmd.output().unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (
            out.status.success(),
            report,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, report, _) = doctor(false);
    assert!(ok, "{report}");
    assert_eq!(
        report["vectors"]["check"]["problems"],
        serde_json::json!([])
    );
    assert_eq!(report["vectors"]["check"]["message_watermark"], 45);

    // Damage: the manifest claims messages the store does not have.
    let manifest_path = dir.join("vectors/manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest_path).unwrap()).unwrap();
    manifest["watermark"] = serde_json::json!(1000);
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let (ok, report, stderr) = doctor(false);
    assert!(!ok, "{report}");
    let problems = report["vectors"]["check"]["problems"].to_string();
    assert!(
        problems.contains("past the next message id 45"),
        "{problems}"
    );
    assert!(stderr.contains("lcm doctor --repair"), "{stderr}");

    let (ok, report, stderr) = doctor(true);
    assert!(ok, "{report} {stderr}");
    assert_eq!(report["vectors"]["rebuilt"], 45, "{report}");
    assert_eq!(
        report["vectors"]["after"]["problems"],
        serde_json::json!([])
    );
    assert_eq!(report["vectors"]["after"]["message_watermark"], 45);
    let data = DataDir::open(&dir, &config).unwrap();
    assert_eq!(data.store.stats().unwrap().messages, messages);
    let page = search(
        &data,
        GrepMode::Semantic,
        "storage ran out of space",
        Scope::default(),
        None,
    );
    assert!(text_of(&data, page.hits[0].message).contains("disk"));
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

/// The first hit of a `/v1/grep` answer and its group's region (`sum_N` or `raw_tail`).
fn first_hit(found: &serde_json::Value) -> Option<(serde_json::Value, String)> {
    found["groups"].as_array()?.iter().find_map(|g| {
        let hit = g["hits"].as_array()?.first()?.clone();
        Some((hit, g["region"].as_str()?.to_owned()))
    })
}

/// `lcm serve` with a model: a session compacted until its history stands in summaries is
/// still found by meaning through `/v1/grep` (semantic and hybrid, hits saying which search
/// found them and their score), and its summaries are ranked by meaning too, page by page.
#[test]
fn over_http_a_compacted_session_is_found_by_meaning_and_so_are_its_summaries() {
    use crate::common::daemon::{Daemon, http};
    use serde_json::{Value, json};
    use std::time::{Duration, Instant};

    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!(
            "[embeddings]\nmodel_dir = {}\nindex_batch = 64\n\n[compaction]\nfresh_tail = 2\n\
             leaf_chunk_tokens = 300\nleaf_target_tokens = 80\n",
            toml::Value::String(model.to_string_lossy().into_owned())
        ),
    )
    .unwrap();
    let child = Daemon::start(&data, "127.0.0.1:0");
    let addr = child.addr;
    let post = |path: &str, body: Value| -> Value {
        let (status, text) = http(addr, "POST", path, None, &body.to_string());
        assert!((200..300).contains(&status), "{path}: {status} {text}");
        serde_json::from_str(&text).unwrap()
    };

    post("/v1/sessions", json!({"key": "travel"}));
    // The facts early in the history, where compaction replaces them by summaries.
    let mut batch: Vec<Value> = FACTS
        .iter()
        .map(|f| json!({"role": "assistant", "content": f}))
        .collect();
    batch.extend((0..44).map(|i| json!({"role": "user", "content": filler(i)})));
    post("/v1/sessions/travel/messages", json!(batch));
    // A budget far below the history: the session compacts until it fits.
    let (status, text) = http(
        addr,
        "GET",
        "/v1/sessions/travel/context?budget=700",
        None,
        "",
    );
    assert_eq!(status, 200, "{text}");
    let context: Value = serde_json::from_str(&text).unwrap();
    assert!(
        context["tokens"].as_u64().unwrap() <= 700,
        "the context fits its budget: {context}"
    );
    assert!(
        !context["summaries"].as_array().unwrap().is_empty(),
        "{context}"
    );

    // Embedding runs in the background: wait until both the fact and a summary are found.
    let deadline = Instant::now() + Duration::from_secs(180);
    let (fact, fact_region, summaries) = loop {
        let fact = post(
            "/v1/grep",
            json!({"pattern": "storage ran out of space", "mode": "semantic", "limit": 3}),
        );
        let summaries = post(
            "/v1/grep",
            json!({"pattern": "status of the quarterly report", "mode": "semantic",
                   "scope": "summaries", "limit": 1}),
        );
        if let (Some((hit, region)), Some(_)) = (first_hit(&fact), first_hit(&summaries))
            && hit["snippet"].as_str().unwrap().contains("disk")
        {
            break (hit, region, summaries);
        }
        assert!(
            Instant::now() < deadline,
            "not found by meaning in time: {fact} {summaries}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Found by meaning although no word of the query is in it, inside a summary's span.
    assert_eq!(fact["found_by"], json!(["semantic"]), "{fact}");
    let score = fact["score"].as_f64().unwrap();
    assert!(score > 0.2 && score <= 1.0, "{fact}");
    assert!(fact_region.starts_with("sum_"), "{fact_region}");

    // Hybrid: words and meaning, a hit found by both says so.
    let hybrid = post(
        "/v1/grep",
        json!({"pattern": "flight delayed storm", "mode": "hybrid", "limit": 3}),
    );
    let (top, _) = first_hit(&hybrid).unwrap();
    assert!(top["snippet"].as_str().unwrap().contains("Lisbon"), "{top}");
    assert_eq!(top["found_by"], json!(["full_text", "semantic"]), "{top}");

    // Summaries by meaning, one a page: the cursor walks every summary once, best first.
    let (first, _) = first_hit(&summaries).unwrap();
    assert_eq!(first["type"], "summary", "{first}");
    assert!(
        first["found_by"]
            .as_array()
            .unwrap()
            .contains(&json!("semantic")),
        "{first}"
    );
    let mut seen = vec![first["id"].as_str().unwrap().to_owned()];
    let mut scores = vec![first["score"].as_f64().unwrap()];
    let mut page = summaries;
    while let Some(cursor) = page["next_cursor"].as_str().map(str::to_owned) {
        page = post(
            "/v1/grep",
            json!({"pattern": "status of the quarterly report", "mode": "semantic",
                   "scope": "summaries", "limit": 1, "cursor": cursor}),
        );
        let (hit, _) = first_hit(&page).unwrap();
        seen.push(hit["id"].as_str().unwrap().to_owned());
        scores.push(hit["score"].as_f64().unwrap());
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no summary twice: {seen:?}");
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    let every = post(
        "/v1/grep",
        json!({"pattern": ".", "mode": "regex", "scope": "summaries", "limit": 100}),
    );
    let stored: usize = every["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["hits"].as_array().unwrap().len())
        .sum();
    assert_eq!(
        seen.len(),
        stored,
        "every summary is embedded and found: {every}"
    );

    // A bad cursor is refused with a clear message.
    let (status, text) = http(
        addr,
        "POST",
        "/v1/grep",
        None,
        &json!({"pattern": "x", "mode": "semantic", "scope": "summaries",
                "cursor": "lg1.0.s.1"})
        .to_string(),
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("cursor"), "{text}");
    child.stop();
}

/// `lcm mcp` with a model: an MCP client appends a history and finds it by meaning through
/// lcm_grep (semantic and hybrid), the hits saying which search found them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_searches_by_meaning() {
    use crate::mcp::{Client, call, close, lcm_command, ok};
    use rmcp::ServiceExt;
    use rmcp::transport::TokioChildProcess;
    use serde_json::json;
    use std::time::{Duration, Instant};

    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(
        data.join("config.toml"),
        format!(
            "[embeddings]\nmodel_dir = {}\n",
            toml::Value::String(model.to_string_lossy().into_owned())
        ),
    )
    .unwrap();
    let (transport, stderr) = TokioChildProcess::builder(lcm_command(&data, Some("pets")))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn lcm mcp");
    let client: Client = ().serve(transport).await.expect("initialize");
    let messages: Vec<_> = FACTS
        .iter()
        .map(|f| json!({"role": "user", "content": f}))
        .chain((0..10).map(|i| json!({"role": "assistant", "content": filler(i)})))
        .collect();
    ok(
        "lcm_append",
        call(&client, "lcm_append", json!({"messages": messages})).await,
    );

    let deadline = Instant::now() + Duration::from_secs(120);
    let top = loop {
        let found = ok(
            "lcm_grep",
            call(
                &client,
                "lcm_grep",
                json!({"pattern": "a dog joined the family", "mode": "semantic", "limit": 2}),
            )
            .await,
        );
        let top = found["groups"][0]["hits"][0].clone();
        if top["snippet"].as_str().is_some_and(|s| s.contains("puppy")) {
            break top;
        }
        assert!(Instant::now() < deadline, "not found by meaning: {found}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(top["found_by"], json!(["semantic"]), "{top}");
    assert!(top["score"].as_f64().is_some_and(|s| s > 0.2), "{top}");

    // The words' index commits on its own schedule: until it has the message, hybrid finds it
    // by meaning alone; then by both.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = ok(
            "lcm_grep",
            call(
                &client,
                "lcm_grep",
                json!({"pattern": "tomato soup lunch", "mode": "hybrid", "limit": 2}),
            )
            .await,
        );
        let top = &found["groups"][0]["hits"][0];
        assert!(top["snippet"].as_str().unwrap().contains("tomato"), "{top}");
        if top["found_by"] == json!(["full_text", "semantic"]) {
            break;
        }
        assert_eq!(top["found_by"], json!(["semantic"]), "{top}");
        assert!(Instant::now() < deadline, "never found by its words: {top}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    close(client, stderr.expect("stderr")).await;
}

/// The catch-up trains the vector index's lists once it holds `embeddings.lists_from` chunks
/// (no commit and no open trains them), and searches through them find what a scan of every
/// entry finds.
#[test]
fn the_catch_up_trains_lists_from_the_configured_size() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_with_embeddings(&model);
    config.embeddings.lists_from = 60;
    config.embeddings.index_batch = 30;
    let (data, _, _) = filled(tmp.path(), &config);
    let semantic = data.index.semantic().unwrap();
    assert_eq!(semantic.chunk_count().unwrap(), 45);
    assert_eq!(
        semantic.list_count().unwrap(),
        None,
        "45 chunks, lists from 60"
    );
    let session = data.store.create_session("c", None).unwrap();
    let more = (40..60).map(|i| NewMessage::text(Role::User, filler(i)));
    data.store.append_batch(session, more.collect()).unwrap();
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    semantic
        .catch_up_until(&data.store, |_, _| {}, || false)
        .unwrap();
    assert_eq!(semantic.list_count().unwrap(), Some(16));
    let page = search(
        &data,
        GrepMode::Semantic,
        "a dog joined our family",
        Scope::default(),
        None,
    );
    assert_eq!(text_of(&data, page.hits[0].message), FACTS[1]);
    drop(data);

    // `lcm stats` says so from the index's files (no model loaded).
    let stats = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lcm"));
        cmd.arg("--data-dir").arg(tmp.path()).arg("stats");
        if json {
            cmd.arg("--json");
        }
        let out = cmd.env_remove("LCM_CONFIG").output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let json: serde_json::Value = serde_json::from_str(&stats(true)).unwrap();
    let vectors = &json["vectors"]["messages"];
    assert_eq!(vectors["entries"], 65, "{json}");
    assert_eq!(vectors["watermark"], 65);
    assert_eq!(vectors["lists"], 16);
    assert!(
        json["vectors"]["summaries"].is_null(),
        "no summary embedded: {json}"
    );
    let text = stats(false);
    assert!(
        text.contains("embedded      65 chunks (watermark msg_65; 16 lists;"),
        "{text}"
    );

    // Reopened: the lists are read back, not trained again; a bad size is a clear error.
    let data = DataDir::open(tmp.path(), &config).unwrap();
    assert_eq!(
        data.index.semantic().unwrap().list_count().unwrap(),
        Some(16)
    );
    config.embeddings.lists_from = 8;
    let refused = config.validate().unwrap_err().to_string();
    assert!(refused.contains("embeddings.lists_from"), "{refused}");
}

/// A backlog of messages does not hold the summaries back: each turn of a catch-up embeds a
/// batch of messages and then a batch of summaries (before, every message came first, so a
/// load faster than the model kept the summaries out of search by meaning).
#[tokio::test]
async fn a_backlog_of_messages_does_not_hold_the_summaries_back() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut config = common::config_with_embeddings(&model);
    config.embeddings.index_batch = 10;
    let data = DataDir::open(tmp.path(), &config).unwrap();
    let session = long_session(&data);
    let summaries = compacted(&data, session).await;

    let semantic = data.index.semantic().unwrap();
    let embedded = semantic
        .catch_up_until(&data.store, |_, _| {}, || true)
        .unwrap();
    assert_eq!(semantic.watermark().unwrap().0, 10, "one batch of messages");
    let first = semantic.summary_watermark().unwrap().0;
    assert_eq!(first, summaries.min(10), "and one of summaries");
    assert_eq!(embedded, 10 + first);

    semantic
        .catch_up_until(&data.store, |_, _| {}, || false)
        .unwrap();
    assert_eq!(semantic.watermark().unwrap().0, 60);
    assert_eq!(semantic.summary_watermark().unwrap().0, summaries);
    assert!(!semantic.is_behind(&data.store).unwrap());
}

/// A data directory whose store file was replaced by another store with more messages: the
/// vectors under each id stand for the old store's texts. The last embedded message's
/// fingerprint is not the new store's: searches by meaning are refused, saying why, until the
/// next catch-up embeds everything again; then the new store's messages are found by their own
/// meaning. Beside its own store the vectors are kept.
#[test]
fn vectors_beside_a_replaced_store_are_embedded_again() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lcm");
    let other = tmp.path().join("other");
    let config = common::config_with_embeddings(&model);
    let (data, _, _) = filled(&dir, &config);
    let embedded = data.index.semantic().unwrap().watermark().unwrap();
    drop(data);
    {
        let data = DataDir::open(&dir, &config).unwrap();
        let semantic = data.index.semantic().unwrap();
        assert_eq!(semantic.stale_for(&data.store).unwrap(), None);
        assert_eq!(
            caught_up(&data),
            0,
            "beside its own store nothing is embedded again"
        );
    }
    let theirs = [
        "Our train to Porto leaves at noon.",
        "The violin lesson moved to Thursday.",
    ];
    {
        let data = DataDir::open(&other, &Config::default()).unwrap();
        let session = data.store.create_session("t", None).unwrap();
        let batch = (0..embedded.0 + 10)
            .map(|i| NewMessage::text(Role::User, format!("another store's entry {i}")))
            .chain(theirs.iter().map(|t| NewMessage::text(Role::Assistant, *t)))
            .collect();
        data.store.append_batch(session, batch).unwrap();
    }
    let store_file = lcm::search::data_dir::STORE_FILE;
    std::fs::copy(other.join(store_file), dir.join(store_file)).unwrap();
    let data = DataDir::open(&dir, &config).unwrap();
    data.index.catch_up(&data.store, |_, _| {}).unwrap();
    let request = GrepRequest {
        pattern: "when does the train to Porto leave".into(),
        mode: GrepMode::Semantic,
        scope: Scope::default(),
        limit: Some(3),
        cursor: None,
    };
    let check = data.index.semantic().unwrap().check(&data.store).unwrap();
    assert!(
        check
            .problems
            .iter()
            .any(|p| p.contains("message vectors were made from another store")),
        "{check:?}"
    );
    let refused = grep(&data.store, &data.index, &config.search, &request)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("another store") && refused.contains("lcm reindex"),
        "{refused}"
    );
    let end = data.store.next_message_id().unwrap().0;
    assert_eq!(caught_up(&data), end, "every message embedded again");
    let page = grep(&data.store, &data.index, &config.search, &request).unwrap();
    assert!(
        text_of(&data, page.hits[0].message).contains("Porto"),
        "{page:?}"
    );
    let check = data.index.semantic().unwrap().check(&data.store).unwrap();
    assert!(check.is_clean(), "{check:?}");
}

/// Summaries the embeddings have not reached are counted too: `lcm_grep` by meaning over
/// summaries says how many, and over both messages and summaries gives each count.
#[tokio::test]
async fn searches_by_meaning_count_the_summaries_not_embedded_yet() {
    let Some(model) = common::embed_model_dir() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let config = common::config_with_embeddings(&model);
    let data = DataDir::open(tmp.path(), &config).unwrap();
    let session = long_session(&data);
    // Every message embedded before compaction makes the summaries.
    caught_up(&data);
    let summaries = compacted(&data, session).await;
    let semantic = data.index.semantic().unwrap();
    assert_eq!(
        semantic.summaries_not_embedded(&data.store).unwrap(),
        summaries
    );
    assert_eq!(semantic.messages_not_embedded(&data.store).unwrap(), 0);

    let tool = |mode: &'static str, scope: &'static str| {
        lcm_grep(
            &data,
            &config,
            serde_json::json!({"pattern": "release", "mode": mode, "scope": scope}),
        )
    };
    let page = tool("semantic", "summaries").await;
    assert_eq!(page["not_embedded"]["summaries"], summaries, "{page}");
    assert!(page["not_embedded"].get("messages").is_none(), "{page}");
    let note = page["not_embedded"]["note"].as_str().unwrap();
    assert!(
        note.contains(&format!(
            "{summaries} newest summaries are not embedded yet"
        )),
        "{note}"
    );
    // Over messages alone: every message is embedded, nothing to say.
    assert!(
        tool("hybrid", "messages")
            .await
            .get("not_embedded")
            .is_none()
    );
    // Both: the summaries' count only, as no message is behind; then both once one is.
    let both = tool("hybrid", "both").await;
    assert_eq!(both["not_embedded"]["summaries"], summaries, "{both}");
    data.store
        .append(session, NewMessage::text(Role::User, "one more"))
        .unwrap();
    let both = tool("hybrid", "both").await;
    assert_eq!(both["not_embedded"]["messages"], 1, "{both}");
    assert_eq!(both["not_embedded"]["summaries"], summaries, "{both}");
    let note = both["not_embedded"]["note"].as_str().unwrap();
    assert!(
        note.contains("1 newest message is") && note.contains("summaries are"),
        "{note}"
    );
    // Embedded: nothing to say.
    caught_up(&data);
    assert!(tool("semantic", "both").await.get("not_embedded").is_none());
}
