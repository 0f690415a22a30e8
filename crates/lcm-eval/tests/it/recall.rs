//! `lcm eval recall` on a real data directory: a small conversation whose answers are known,
//! and the LoCoMo development set when `../shared/data` is present.

use std::path::PathBuf;

use lcm_core::config::{Config, SearchConfig};
use lcm_core::message::{NewMessage, Role};
use lcm_eval::locomo;
use lcm_eval::recall::{self, KS};
use lcm_search::{DataDir, GrepMode};

const SMALL: &str = r#"[{
  "sample_id": "tiny",
  "conversation": {
    "speaker_a": "Ann", "speaker_b": "Bo",
    "session_1_date_time": "9:00 am on 1 May, 2023",
    "session_1": [
      {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a greyhound called Pixel last week."},
      {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! I started learning the cello."},
      {"speaker": "Ann", "dia_id": "D1:3", "text": "We went hiking near the glacier on Sunday."}
    ],
    "session_2_date_time": "6:00 pm on 3 May, 2023",
    "session_2": [
      {"speaker": "Bo", "dia_id": "D2:1", "text": "My cello teacher moved to Lisbon."},
      {"speaker": "Ann", "dia_id": "D2:2", "text": "Pixel the greyhound loves the beach."}
    ]
  },
  "qa": [
    {"question": "What instrument does Bo play, the cello?", "answer": "cello", "evidence": ["D1:2", "D2:1"], "category": 4},
    {"question": "Where did Ann go hiking, the glacier?", "answer": "a glacier", "evidence": ["D1:3"], "category": 1},
    {"question": "Which zeppelin museum?", "answer": null, "evidence": ["D1:1"], "category": 5},
    {"question": "Unanswerable", "evidence": [], "category": 5},
    {"question": "Broken evidence", "evidence": ["D9:9"], "category": 2}
  ]
}]"#;

#[test]
fn recall_counts_the_ranks_of_evidence_turns_in_a_real_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::open(dir.path().join("lcm"), &Config::default()).unwrap();
    let conversations = locomo::parse(SMALL.as_bytes(), "small").unwrap();
    let imported = recall::import(&data, &conversations, |_, _| {}).unwrap();
    assert_eq!(imported[0].dia_id_of.len(), 5);
    // A second import adds nothing (turns are keyed) and maps the same ids.
    let again = recall::import(&data, &conversations, |_, _| {}).unwrap();
    assert_eq!(again[0].dia_id_of, imported[0].dia_id_of);
    assert_eq!(data.store.stats().unwrap().messages, 5);

    let mut calls = 0;
    let report = recall::evaluate(
        &data,
        &SearchConfig::default(),
        &conversations,
        &imported,
        &[GrepMode::FullText],
        &recall::KS,
        |done, total| {
            calls += 1;
            assert!(done <= total && total == 5);
        },
    )
    .unwrap();
    assert!(calls >= 3);
    assert_eq!(report.questions, 5);
    assert_eq!(report.without_evidence, 1);
    assert_eq!(report.unknown_evidence, ["tiny:D9:9"]);
    let mode = &report.modes[0];
    // Scored: the cello question (both turns hold "cello": found at ranks 1-2), the glacier
    // one (found first), the zeppelin one (no word of it is in the conversation: nothing).
    assert_eq!(mode.overall.questions, 3);
    let at = |k: usize| mode.overall.recall_at[KS.iter().position(|&x| x == k).unwrap()];
    assert!((at(5) - 2.0 / 3.0).abs() < 1e-9, "{:?}", mode.overall);
    assert!((at(10) - 2.0 / 3.0).abs() < 1e-9);
    // recall@1: the glacier question fully, the cello one half.
    assert!((at(1) - 0.5).abs() < 1e-9, "{:?}", mode.overall);
    assert!((mode.overall.mrr - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(mode.categories[&5].recall_at, vec![0.0; 3]);
    let table = report.to_table();
    assert!(table.contains("| full_text | 3 | all |"), "{table}");
    assert!(table.contains("4 single-hop"), "{table}");
    assert!(table.contains("tiny:D9:9"), "{table}");
}

fn locomo_dev() -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/locomo-dev/locomo-dev.json");
    if path.exists() {
        Some(path)
    } else {
        eprintln!(
            "skipping: {} is absent (the LoCoMo development set lives in ../shared/data)",
            path.display()
        );
        None
    }
}

#[test]
fn full_text_recall_on_the_locomo_development_set() {
    let Some(path) = locomo_dev() else { return };
    let conversations = locomo::load(&path).unwrap();
    assert_eq!(conversations.len(), 5);
    let dir = tempfile::tempdir().unwrap();
    let data = DataDir::open(dir.path().join("lcm"), &Config::default()).unwrap();
    let imported = recall::import(&data, &conversations, |_, _| {}).unwrap();
    let turns: usize = conversations
        .iter()
        .flat_map(|c| &c.sessions)
        .map(|s| s.turns.len())
        .sum();
    assert_eq!(data.store.stats().unwrap().messages, turns as u64);
    let report = recall::evaluate(
        &data,
        &SearchConfig::default(),
        &conversations,
        &imported,
        &[GrepMode::FullText],
        &recall::KS,
        |_, _| {},
    )
    .unwrap();
    eprintln!("{}", report.to_table());
    assert_eq!(report.questions, 999);
    let full_text = &report.modes[0];
    let scored: usize = full_text.categories.values().map(|s| s.questions).sum();
    assert_eq!(scored, full_text.overall.questions);
    assert!(full_text.overall.questions >= 990);
    // Keyword search finds about half of the evidence in its first ten hits: the floor
    // guards against a regression of BM25 ranking, not a goal.
    let at10 = full_text.overall.recall_at[2];
    assert!(at10 > 0.45, "full-text recall@10 fell to {at10:.3}");
    assert!(full_text.overall.recall_at[0] <= full_text.overall.recall_at[1]);
    assert!(full_text.overall.recall_at[1] <= at10);
}

/// The model directory a setup script prints (idempotent; it fetches from a package registry
/// the first time), or `None` with a message.
fn model_from(setup: PathBuf) -> Option<PathBuf> {
    match std::process::Command::new(&setup).output() {
        Ok(out) if out.status.success() => Some(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )),
        _ => {
            eprintln!(
                "skipping: the embedding model ({}) is not available",
                setup.display()
            );
            None
        }
    }
}

/// all-MiniLM-L6-v2 (see `../shared/tools/embed-model`).
fn embed_model() -> Option<PathBuf> {
    model_from(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/tools/embed-model/setup.sh"),
    )
}

/// all-mpnet-base-v2 (see `tests/models/all-mpnet-base-v2.sh`).
fn mpnet_model() -> Option<PathBuf> {
    model_from(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/models/all-mpnet-base-v2.sh"),
    )
}

/// Recall@10 of full text, semantic and hybrid search over `conversations` with `model`.
fn recall_at_10(model: PathBuf, conversations: &[locomo::Conversation]) -> [f64; 3] {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.embeddings.model_dir = Some(model);
    let data = DataDir::open(dir.path().join("lcm"), &config).unwrap();
    let imported = recall::import(&data, conversations, |_, _| {}).unwrap();
    let report = recall::evaluate(
        &data,
        &SearchConfig::default(),
        conversations,
        &imported,
        &[GrepMode::FullText, GrepMode::Semantic, GrepMode::Hybrid],
        &recall::KS,
        |_, _| {},
    )
    .unwrap();
    eprintln!("{}", report.to_table());
    [0, 1, 2].map(|i| report.modes[i].overall.recall_at[2])
}

/// Hybrid recall on the development set, with the real model. The floor is what lcm measures
/// with all-MiniLM-L6-v2 (docs/PERFORMANCE.md, "Hybrid recall": semantic 0.554, hybrid
/// 0.745), less a margin: it guards the fusion, the lift by neighbouring turns (hybrid 0.641
/// without it), the context each message is embedded with (semantic 0.467, hybrid 0.725
/// without it) and the embeddings against regressions. (The issue's goal of 0.85 is out of
/// this model's reach: a message's own vector finds 0.47 of the evidence in the first ten, in
/// Rust and in sentence-transformers alike.)
#[test]
fn hybrid_recall_on_the_locomo_development_set_with_the_real_model() {
    let (Some(path), Some(model)) = (locomo_dev(), embed_model()) else {
        return;
    };
    let conversations = locomo::load(&path).unwrap();
    let [words, meaning, hybrid] = recall_at_10(model, &conversations);
    assert!(meaning > 0.52, "semantic recall@10 fell to {meaning:.3}");
    assert!(hybrid > 0.735, "hybrid recall@10 fell to {hybrid:.3}");
    assert!(
        hybrid > words + 0.02 && hybrid > meaning,
        "hybrid ({hybrid:.3}) must beat full text ({words:.3}) and semantic ({meaning:.3})"
    );
}

/// all-mpnet-base-v2 end to end (768 dimensions through the vector index, the fusion and the
/// lift), on the development set's smallest conversation (369 turns, 105 questions; the whole
/// set takes it about eight minutes to embed on two cores): it finds more by meaning than
/// all-MiniLM-L6-v2, and hybrid more than either side alone. On the whole set: semantic 0.586
/// against 0.554, hybrid 0.781 against 0.746 (docs/PERFORMANCE.md, "Hybrid recall").
#[test]
fn mpnet_finds_more_by_meaning_than_minilm_on_a_locomo_conversation() {
    let (Some(path), Some(minilm), Some(mpnet)) = (locomo_dev(), embed_model(), mpnet_model())
    else {
        return;
    };
    let mut conversations = locomo::load(&path).unwrap();
    conversations.retain(|c| c.id == "conv-30");
    assert_eq!(conversations.len(), 1);
    let [_, small_meaning, small_hybrid] = recall_at_10(minilm, &conversations);
    let [words, meaning, hybrid] = recall_at_10(mpnet, &conversations);
    assert!(
        meaning > small_meaning + 0.02,
        "semantic recall@10: all-mpnet-base-v2 {meaning:.3}, all-MiniLM-L6-v2 {small_meaning:.3}"
    );
    assert!(
        hybrid >= small_hybrid && hybrid > words && hybrid > meaning,
        "hybrid with all-mpnet-base-v2 {hybrid:.3} (with all-MiniLM-L6-v2 {small_hybrid:.3}; \
         full text {words:.3}, semantic {meaning:.3})"
    );
}

/// bge-small-en-v1.5 (see `tests/models/bge-small-en-v1.5.sh`).
fn bge_model() -> Option<PathBuf> {
    model_from(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/models/bge-small-en-v1.5.sh"),
    )
}

/// bge-small-en-v1.5 end to end (first-token pooling and a query prompt through the vector
/// index, the fusion and the lift), on the development set's smallest conversation: a model
/// trained for retrieval finds more by meaning than all-MiniLM-L6-v2, and hybrid more than
/// either side alone. On the whole set: semantic 0.646 against 0.554, hybrid 0.775 against
/// 0.746 (docs/PERFORMANCE.md, "Hybrid recall").
#[test]
fn bge_finds_more_by_meaning_than_minilm_on_a_locomo_conversation() {
    let (Some(path), Some(minilm), Some(bge)) = (locomo_dev(), embed_model(), bge_model()) else {
        return;
    };
    let mut conversations = locomo::load(&path).unwrap();
    conversations.retain(|c| c.id == "conv-30");
    assert_eq!(conversations.len(), 1);
    let [_, small_meaning, small_hybrid] = recall_at_10(minilm, &conversations);
    let [words, meaning, hybrid] = recall_at_10(bge, &conversations);
    assert!(
        meaning > small_meaning + 0.03,
        "semantic recall@10: bge-small-en-v1.5 {meaning:.3}, all-MiniLM-L6-v2 {small_meaning:.3}"
    );
    assert!(
        hybrid >= small_hybrid && hybrid > words && hybrid > meaning,
        "hybrid with bge-small-en-v1.5 {hybrid:.3} (with all-MiniLM-L6-v2 {small_hybrid:.3}; \
         full text {words:.3}, semantic {meaning:.3})"
    );
}

/// ms-marco-MiniLM-L-12-v2 (see `tests/models/ms-marco-MiniLM-L-12-v2.sh`).
fn reranker_model() -> Option<PathBuf> {
    model_from(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/models/ms-marco-MiniLM-L-12-v2.sh"),
    )
}

/// The reranker end to end, on the first 40 questions of the development set's smallest
/// conversation (369 turns) with all-MiniLM-L6-v2 and the first 20 hits reranked (a pass of
/// the cross-encoder each; the whole set takes it most of an hour on two cores): the same data
/// directory searched in hybrid mode without and with `reranker_dir` puts the evidence
/// higher with it (MRR), every search says it was reranked, and a reranker directory that
/// cannot be loaded fails the search with an error naming the option, the data directory
/// unchanged. On the whole set with all-mpnet-base-v2 and 50 hits reranked: recall@10 0.781
/// → 0.827, MRR 0.517 → 0.594 (docs/PERFORMANCE.md, "Hybrid recall").
#[test]
fn the_reranker_finds_more_of_the_evidence_in_hybrid_search() {
    let (Some(path), Some(model), Some(reranker)) = (locomo_dev(), embed_model(), reranker_model())
    else {
        return;
    };
    let mut conversations = locomo::load(&path).unwrap();
    conversations.retain(|c| c.id == "conv-30");
    assert_eq!(conversations.len(), 1);
    conversations[0].questions.truncate(40);
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.embeddings.model_dir = Some(model);
    config.embeddings.rerank_depth = 20;
    let hybrid_recall = |config: &Config| {
        let data = DataDir::open(dir.path().join("lcm"), config).unwrap();
        let imported = recall::import(&data, &conversations, |_, _| {}).unwrap();
        let report = recall::evaluate(
            &data,
            &SearchConfig::default(),
            &conversations,
            &imported,
            &[GrepMode::Hybrid],
            &recall::KS,
            |_, _| {},
        )
        .unwrap();
        eprintln!("{}", report.to_table());
        let page = lcm_search::grep(
            &data.store,
            &data.index,
            &SearchConfig::default(),
            &lcm_search::GrepRequest {
                pattern: conversations[0].questions[0].question.clone(),
                mode: GrepMode::Hybrid,
                scope: lcm_search::Scope::default(),
                limit: Some(10),
                cursor: None,
            },
        )
        .unwrap();
        (report.modes[0].overall.mrr, page)
    };
    let (plain, page) = hybrid_recall(&config);
    assert_eq!(page.strategy, lcm_search::Strategy::Hybrid);
    config.embeddings.reranker_dir = Some(reranker);
    let (reranked, page) = hybrid_recall(&config);
    assert_eq!(page.strategy, lcm_search::Strategy::HybridReranked);
    assert_eq!(page.hits.len(), 10);
    assert!(
        reranked > plain + 0.02,
        "hybrid MRR with the reranker {reranked:.3}, without {plain:.3}"
    );

    // A directory that holds no reranker: the search fails naming the option; nothing stored
    // changed (the same messages, the same recall without it).
    let broken = tempfile::tempdir().unwrap();
    config.embeddings.reranker_dir = Some(broken.path().to_path_buf());
    let data = DataDir::open(dir.path().join("lcm"), &config).unwrap();
    let before = data.store.next_message_id().unwrap();
    let err = lcm_search::grep(
        &data.store,
        &data.index,
        &SearchConfig::default(),
        &lcm_search::GrepRequest {
            pattern: "camping".into(),
            mode: GrepMode::Hybrid,
            scope: lcm_search::Scope::default(),
            limit: Some(10),
            cursor: None,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("[embeddings] reranker_dir") && err.contains("config.json"),
        "{err}"
    );
    assert_eq!(data.store.next_message_id().unwrap(), before);
    drop(data);
    config.embeddings.reranker_dir = None;
    let (again, _) = hybrid_recall(&config);
    assert_eq!(again, plain);
}

/// A long message is judged where it was found, not by its first page: a session of short
/// notes that share the question's words without answering it, and one long log whose answer
/// lies 20,000 bytes in (past anything the cross-encoder reads of a text from its start). The
/// reranked hybrid search lifts the log above its place in plain hybrid search; read from its
/// start (before session 37), the reranker scored it lowest of all and it stayed last.
#[test]
fn the_reranker_reads_a_long_message_where_it_was_found() {
    let (Some(model), Some(reranker)) = (embed_model(), reranker_model()) else {
        eprintln!("SKIPPED: the embedding model or the reranker is absent (see tests/models)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.embeddings.model_dir = Some(model);
    let notes = [
        "Reminder: the staging deploy key should be rotated some day.",
        "Does anyone know where the staging deploy key lives?",
        "The staging deploy key docs are out of date.",
        "I asked about rotating the staging deploy key in standup.",
        "Staging deploy key: still on the agenda for next week.",
        "Who owns the staging deploy key? Nobody answered.",
    ];
    let mut log = String::new();
    let mut line = 0;
    while log.len() < 20_000 {
        line += 1;
        log.push_str(&format!(
            "12:{:02}:{:02} INFO worker-{} heartbeat ok, queue depth {}\n",
            line / 60 % 60,
            line % 60,
            line % 7,
            line * 13 % 97
        ));
    }
    log.push_str(
        "12:59:59 WARN Priya rotated the staging deploy key on Tuesday because the old key \
         leaked in a public CI log.\n",
    );
    for line in 0..40 {
        log.push_str(&format!("13:00:{line:02} INFO worker-3 heartbeat ok\n"));
    }
    let long = {
        let data = DataDir::open(dir.path().join("lcm"), &config).unwrap();
        let session = data.store.ensure_session("ops").unwrap();
        for note in notes {
            data.store
                .append(session, NewMessage::text(Role::User, note))
                .unwrap();
        }
        let long = data
            .store
            .append(session, NewMessage::text(Role::Assistant, log))
            .unwrap()
            .id;
        data.index.catch_up(&data.store, |_, _| {}).unwrap();
        data.index
            .semantic()
            .unwrap()
            .catch_up_until(&data.store, |_, _| {}, || false)
            .unwrap();
        long
    };
    let place_of_the_log = |config: &Config| {
        let data = DataDir::open(dir.path().join("lcm"), config).unwrap();
        let page = lcm_search::grep(
            &data.store,
            &data.index,
            &SearchConfig::default(),
            &lcm_search::GrepRequest {
                pattern: "Who rotated the staging deploy key, and why?".into(),
                mode: GrepMode::Hybrid,
                scope: lcm_search::Scope::default(),
                limit: Some(7),
                cursor: None,
            },
        )
        .unwrap();
        let order: Vec<_> = page.hits.iter().map(|h| h.message).collect();
        assert_eq!(order.len(), 7, "{order:?}");
        let place = order.iter().position(|&m| m == long).unwrap();
        (place, page.strategy)
    };
    let (plain, strategy) = place_of_the_log(&config);
    assert_eq!(strategy, lcm_search::Strategy::Hybrid);
    config.embeddings.reranker_dir = Some(reranker);
    let (reranked, strategy) = place_of_the_log(&config);
    assert_eq!(strategy, lcm_search::Strategy::HybridReranked);
    assert!(
        reranked + 2 <= plain,
        "the log is hit {} reranked, {} without",
        reranked + 1,
        plain + 1
    );
}
