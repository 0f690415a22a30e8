//! The reranker: a cross-encoder that reads a query and a passage together and scores how well
//! the passage answers the query (one logit, higher is better), as sentence-transformers'
//! `CrossEncoder` and `transformers`' `BertForSequenceClassification` compute it: the pair
//! tokenised as `[CLS] query [SEP] passage [SEP]` (token type 0 for the query, 1 for the
//! passage; the longer of the two cut first past the model's length), the BERT encoder, the
//! pooler (a dense layer and tanh over the first token's state) and the classifier (a dense
//! layer to one value).
//!
//! An embedding compares two vectors made apart; a cross-encoder attends from every word of the
//! query to every word of the passage, so it tells the turn that answers a question from one
//! that only shares its words or its topic. It costs a forward pass per passage, so it reorders
//! the first few dozen hits of a search, never a whole index.
//!
//! The directory holds `config.json` (a BERT with `num_labels` 1), `model.safetensors` (the
//! `bert.` encoder, `bert.pooler.dense` and `classifier`) and `tokenizer.json`: the layout of
//! a Hugging Face `BertForSequenceClassification` (ms-marco-MiniLM-L-12-v2 is the tested one;
//! `tests/models/ms-marco-MiniLM-L-12-v2.sh` puts it on disk).

use std::path::Path;

use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationParams, TruncationStrategy};

use crate::embedder::{
    EmbedError, HEAD_BYTES_PER_TOKEN, candle_message, compute_pool, head_bytes, in_length_batches,
    mapped_weights, model_error, padded, parse, read,
};
use crate::encoder::{Config as EncoderConfig, Encoder, Family, Linear};

type Result<T, E = EmbedError> = std::result::Result<T, E>;

/// How a [`Reranker`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RerankOptions {
    /// Pairs per forward pass.
    pub batch_size: usize,
    /// Threads of the model's computations (0: every core).
    pub threads: usize,
    /// Word pieces of a pair read at most, special tokens included (capped by the model's
    /// positions).
    pub max_length: usize,
}

impl Default for RerankOptions {
    fn default() -> Self {
        RerankOptions {
            batch_size: 16,
            threads: 0,
            max_length: 512,
        }
    }
}

/// The fields of `config.json` past the encoder's.
#[derive(Deserialize)]
struct HeadConfig {
    #[serde(default = "one_label")]
    num_labels: usize,
}

fn one_label() -> usize {
    1
}

/// A loaded cross-encoder (`Send + Sync`; every call takes `&self`).
pub struct Reranker {
    model: Encoder,
    pooler: Linear,
    classifier: Linear,
    /// Pair encoding, cut at `max_length` (the longer side first), no padding.
    tokenizer: Tokenizer,
    max_length: usize,
    batch_size: usize,
    pool: rayon::ThreadPool,
}

impl std::fmt::Debug for Reranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reranker")
            .field("max_length", &self.max_length)
            .field("batch_size", &self.batch_size)
            .finish_non_exhaustive()
    }
}

impl Reranker {
    /// Loads the cross-encoder in `dir` (see the module doc for its files).
    pub fn load(dir: &Path, options: RerankOptions) -> Result<Reranker> {
        let config_path = dir.join("config.json");
        let config_bytes = read(&config_path)?;
        let config: EncoderConfig = parse(&config_path, &config_bytes)?;
        let head: HeadConfig = parse(&config_path, &config_bytes)?;
        let invalid = |detail: String| EmbedError::Invalid {
            path: config_path.clone(),
            detail,
        };
        if !config.architectures.is_empty() && !config.is_cross_encoder() {
            return Err(invalid(format!(
                "this is not a cross-encoder ({}: no classification head to score a query and \
                 a passage with); an embedding model goes in `[embeddings] model_dir`",
                config.architectures.join(", ")
            )));
        }
        let family = config.family().map_err(invalid)?;
        if family != Family::Bert {
            return Err(invalid(
                "a reranker must be a BERT cross-encoder (model_type \"bert\")".into(),
            ));
        }
        if head.num_labels != 1 {
            return Err(invalid(format!(
                "a reranker gives one score (num_labels 1), this model gives {}",
                head.num_labels
            )));
        }
        let max_length = options.max_length.min(config.positions(family));
        if max_length < 8 {
            return Err(invalid(format!("max_length {max_length} is too small")));
        }

        let tokenizer_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_bytes(read(&tokenizer_path)?).map_err(|e| EmbedError::Invalid {
                path: tokenizer_path.clone(),
                detail: e.to_string(),
            })?;
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                ..TruncationParams::default()
            }))
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;

        let weights = dir.join("model.safetensors");
        let vb = mapped_weights(&weights)?;
        let not_the_weights = |e: candle_core::Error| EmbedError::Invalid {
            path: weights.clone(),
            detail: format!(
                "not the weights of the cross-encoder config.json describes \
                 (bert.*, bert.pooler.dense, classifier): {}",
                candle_message(&e)
            ),
        };
        let hidden = config.hidden_size;
        let model = Encoder::load(vb.clone(), &config).map_err(not_the_weights)?;
        let pooler =
            Linear::load(hidden, hidden, vb.pp("bert.pooler.dense")).map_err(not_the_weights)?;
        let classifier = Linear::load(hidden, 1, vb.pp("classifier")).map_err(not_the_weights)?;
        let pool = compute_pool(options.threads, "lcm-rerank")?;
        Ok(Reranker {
            model,
            pooler,
            classifier,
            tokenizer,
            max_length,
            batch_size: options.batch_size.max(1),
            pool,
        })
    }

    /// The most word pieces of a pair the model reads.
    pub fn max_length(&self) -> usize {
        self.max_length
    }

    /// How well each passage answers `query`: one logit per passage, in the order given (only
    /// their order means anything; sentence-transformers' `CrossEncoder.predict` returns the
    /// same values through a sigmoid). Only the first [`HEAD_BYTES_PER_TOKEN`] × max length
    /// bytes of a passage are read: the rest could not fit in the pair.
    pub fn score(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        if passages.is_empty() {
            return Ok(Vec::new());
        }
        self.pool.install(|| self.score_in_pool(query, passages))
    }

    fn score_in_pool(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let room = self.max_length.saturating_mul(HEAD_BYTES_PER_TOKEN);
        let pairs: Vec<(String, String)> = passages
            .iter()
            .map(|p| (query.to_string(), head_bytes(p, room).to_string()))
            .collect();
        let encodings = self
            .tokenizer
            .encode_batch(pairs, true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        in_length_batches(&encodings, self.batch_size, |batch| self.forward(batch))
    }

    fn forward(&self, batch: Vec<&tokenizers::Encoding>) -> Result<Vec<f32>> {
        let (ids, types, mask) = padded(&batch).map_err(model_error)?;
        let hidden = self
            .model
            .forward(&ids, &types, &mask)
            .map_err(model_error)?;
        let logits = hidden
            .narrow(1, 0, 1)
            .and_then(|first| first.squeeze(1))
            .and_then(|first| self.pooler.forward(&first))
            .and_then(|pooled| pooled.tanh())
            .and_then(|pooled| self.classifier.forward(&pooled))
            .and_then(|logits| logits.squeeze(1))
            .and_then(|logits| logits.to_vec1())
            .map_err(model_error)?;
        Ok(logits)
    }
}
