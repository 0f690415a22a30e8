//! The embedding model: a sentence-transformers directory loaded once, then shared by the
//! threads that embed (it is `Send + Sync`; every call takes `&self`).
//!
//! A sentence-transformers directory holds the transformer (`config.json`,
//! `model.safetensors`), its tokenizer (`tokenizer.json`), the longest input it reads
//! (`sentence_bert_config.json`: `max_seq_length`) and its pooling (`1_Pooling/config.json`).
//! `modules.json`, when present, names the pipeline: a `Transformer`, a `Pooling` and an
//! optional `Normalize` module are supported; any other module (a `Dense` projection, ...) would
//! change the vectors, so it is refused at load. Mean pooling (MiniLM, E5, GTE) and the
//! first token's state (`pooling_mode_cls_token`: BGE, Arctic Embed) are supported; another
//! pooling is refused, never silently computed wrong. Vectors are always L2-normalised (with or
//! without a `Normalize` module: the same direction, and the index compares by cosine).
//!
//! **Prompts.** Retrieval models trained with a text put before queries and documents (E5's
//! `"query: "` and `"passage: "`) name them in `config_sentence_transformers.json` (`prompts`);
//! [`Embedder::embed_query`] and [`Embedder::embed_documents`] put them before the text as
//! sentence-transformers' `encode_query` and `encode_document` do, and [`EmbedOptions`] can
//! replace them (for models whose card asks for one the directory does not name).
//! [`Embedder::embed`] embeds texts as given.

use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use lcm_core::config::EmbeddingsConfig;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokenizers::{Tokenizer, TruncationParams};

use crate::encoder::{Config as EncoderConfig, Encoder};

/// What went wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbedError {
    /// A file the model needs is missing or unreadable.
    #[error(
        "cannot read {path} (a sentence-transformers model directory needs config.json, model.safetensors, tokenizer.json and 1_Pooling/config.json): {source}"
    )]
    Read {
        /// The file, inside the model directory.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A file is there but not what a supported model holds.
    #[error("{path}: {detail}")]
    Invalid {
        /// The file, inside the model directory.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The tokenizer failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The model's computation failed.
    #[error("model: {0}")]
    Model(String),
}

type Result<T, E = EmbedError> = std::result::Result<T, E>;

/// A batch's token ids, token types and attention mask, `(texts, len)` each: every text's word
/// pieces from the first column, then padding (id 0, type 0, mask 0) up to the longest.
pub(crate) fn padded(
    batch: &[&tokenizers::Encoding],
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let len = batch.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
    let n = batch.len();
    let mut ids = vec![0u32; n * len];
    let mut types = vec![0u32; n * len];
    let mut mask = vec![0u32; n * len];
    for (row, e) in batch.iter().enumerate() {
        let at = row * len;
        let real = e.get_ids().len();
        ids[at..at + real].copy_from_slice(e.get_ids());
        types[at..at + real].copy_from_slice(e.get_type_ids());
        mask[at..at + real].copy_from_slice(e.get_attention_mask());
    }
    let tensor = |values| Tensor::from_vec(values, (n, len), &Device::Cpu);
    Ok((tensor(ids)?, tensor(types)?, tensor(mask)?))
}

/// `forward` of `encodings` in batches of `batch_size` taken by length (so a batch pads
/// little), its results put back in the order of `encodings`.
pub(crate) fn in_length_batches<'e, T: Default + Clone>(
    encodings: &'e [tokenizers::Encoding],
    batch_size: usize,
    mut forward: impl FnMut(Vec<&'e tokenizers::Encoding>) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let mut order: Vec<usize> = (0..encodings.len()).collect();
    order.sort_by_key(|&i| encodings[i].get_ids().len());
    let mut out = vec![T::default(); encodings.len()];
    for batch in order.chunks(batch_size) {
        let results = forward(batch.iter().map(|&i| &encodings[i]).collect())?;
        for (&i, result) in batch.iter().zip(results) {
            out[i] = result;
        }
    }
    Ok(out)
}

/// The model weights of `path`, memory-mapped as f32 on the CPU.
pub(crate) fn mapped_weights(path: &Path) -> Result<VarBuilder<'static>> {
    // SAFETY: the weights file is mapped read-only for the model's lifetime; lcm never
    // writes it, and a model directory is not meant to change under a running process.
    unsafe {
        VarBuilder::from_mmaped_safetensors(std::slice::from_ref(&path), DType::F32, &Device::Cpu)
    }
    .map_err(|e| EmbedError::Invalid {
        path: path.to_path_buf(),
        detail: candle_message(&e),
    })
}

/// The rayon pool a model computes on: `threads` of them (0: one a core), named `name-N`.
pub(crate) fn compute_pool(threads: usize, name: &'static str) -> Result<rayon::ThreadPool> {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        threads
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map_err(|e| EmbedError::Model(format!("cannot start {threads} threads: {e}")))
}

/// The first `max_bytes` of `text`, cut on a character boundary.
pub(crate) fn head_bytes(text: &str, max_bytes: usize) -> &str {
    &text[..text.floor_char_boundary(max_bytes)]
}

pub(crate) fn model_error(e: candle_core::Error) -> EmbedError {
    EmbedError::Model(candle_message(&e))
}

/// A candle error's message, without the backtrace candle captures into it when
/// `RUST_BACKTRACE` is set: the message is for the user, the backtrace is candle's insides.
pub(crate) fn candle_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_message(inner),
        candle_core::Error::Context { inner, context } => {
            format!("{context}: {}", candle_message(inner))
        }
        candle_core::Error::WithPath { inner, path } => {
            format!("{}: {}", path.display(), candle_message(inner))
        }
        other => other.to_string(),
    }
}

/// How an [`Embedder`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedOptions {
    /// Texts per forward pass.
    pub batch_size: usize,
    /// Threads of the model's computations (0: every core).
    pub threads: usize,
    /// Word pieces per chunk of [`Embedder::chunks`] (capped by the model's `max_seq_length`,
    /// less its two special tokens and the document prompt's).
    pub max_tokens: usize,
    /// Put before each query ([`Embedder::embed_query`]) instead of the model directory's
    /// query prompt.
    pub query_prompt: Option<String>,
    /// Put before each document ([`Embedder::embed_documents`]) instead of the model
    /// directory's document prompt.
    pub document_prompt: Option<String>,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        EmbedOptions::from(&EmbeddingsConfig::default())
    }
}

impl From<&EmbeddingsConfig> for EmbedOptions {
    fn from(c: &EmbeddingsConfig) -> Self {
        EmbedOptions {
            batch_size: c.batch_size.max(1),
            threads: c.threads,
            max_tokens: c.max_tokens,
            query_prompt: c.query_prompt.clone(),
            document_prompt: c.document_prompt.clone(),
        }
    }
}

/// The most bytes of one text [`Embedder::chunks`] cuts into chunks: the rest of a longer
/// text is not embedded (regex and full-text search still find it). 256 KiB is about 64k word
/// pieces, 256 chunks of the default size.
pub const MAX_CHUNKED_BYTES: usize = 256 * 1024;

/// Bytes of a text [`Embedder::head`] reads per word piece wanted: more than any word piece
/// spans (WordPiece makes a word of more than 100 characters one unknown piece), so the head is
/// cut by the tokenizer, not by this bound, for any text but one of such words.
pub const HEAD_BYTES_PER_TOKEN: usize = 128;

/// A loaded sentence-embedding model.
pub struct Embedder {
    model: Encoder,
    /// Cuts at `max_seq` word pieces, special tokens included; no padding (batches are padded
    /// here).
    tokenizer: Tokenizer,
    /// The same without truncation, for [`Self::chunks`].
    splitter: Tokenizer,
    max_seq: usize,
    chunk_tokens: usize,
    batch_size: usize,
    dimension: usize,
    pooling: Pooling,
    /// Put before each query and each document (see the module doc).
    query_prompt: String,
    document_prompt: String,
    model_id: String,
    pool: rayon::ThreadPool,
}

/// How the word pieces' states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pooling {
    /// The mean of the real (not padding) tokens' states.
    Mean,
    /// The state of the first token (`[CLS]`).
    Cls,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("model_id", &self.model_id)
            .field("dimension", &self.dimension)
            .field("max_seq", &self.max_seq)
            .field("chunk_tokens", &self.chunk_tokens)
            .field("pooling", &self.pooling)
            .field("query_prompt", &self.query_prompt)
            .field("document_prompt", &self.document_prompt)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: usize,
}

#[derive(Deserialize)]
struct PoolingConfig {
    word_embedding_dimension: usize,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    /// Whether the prompt's tokens are pooled with the text's (sentence-transformers' default).
    #[serde(default = "pooled_with_the_text")]
    include_prompt: bool,
}

fn pooled_with_the_text() -> bool {
    true
}

impl PoolingConfig {
    fn pooling(&self) -> Option<Pooling> {
        let modes = [
            self.pooling_mode_mean_tokens,
            self.pooling_mode_cls_token,
            self.pooling_mode_max_tokens,
            self.pooling_mode_mean_sqrt_len_tokens,
        ];
        match modes {
            [true, false, false, false] => Some(Pooling::Mean),
            [false, true, false, false] => Some(Pooling::Cls),
            _ => None,
        }
    }
}

/// `config_sentence_transformers.json`: the prompts a model was trained with.
#[derive(Deserialize, Default)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: std::collections::HashMap<String, String>,
    #[serde(default)]
    default_prompt_name: Option<String>,
}

impl SentenceTransformersConfig {
    /// The prompt sentence-transformers puts before a text of this kind: the first of `names`
    /// the model has, else its default prompt, else none.
    fn prompt(&self, names: &[&str]) -> String {
        names
            .iter()
            .find_map(|n| self.prompts.get(*n))
            .or_else(|| {
                self.default_prompt_name
                    .as_ref()
                    .and_then(|n| self.prompts.get(n))
            })
            .cloned()
            .unwrap_or_default()
    }
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| EmbedError::Read {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| EmbedError::Invalid {
        path: path.to_path_buf(),
        detail: format!("not the expected JSON: {e}"),
    })
}

impl Embedder {
    /// Loads the model in `dir` (see the module doc for the files it reads).
    pub fn load(dir: &Path, options: EmbedOptions) -> Result<Embedder> {
        let (root, pooling_dir) = pipeline(dir)?;
        let config_path = root.join("config.json");
        let config_bytes = read(&config_path)?;
        let config: EncoderConfig = parse(&config_path, &config_bytes)?;
        if config.is_cross_encoder() {
            return Err(EmbedError::Invalid {
                path: config_path,
                detail: "this is a cross-encoder (a reranker: it scores a query and a passage \
                         together), not an embedding model; give its directory as \
                         `[embeddings] reranker_dir`"
                    .into(),
            });
        }
        let family = config.family().map_err(|detail| EmbedError::Invalid {
            path: config_path,
            detail,
        })?;
        let pooling_path = pooling_dir.join("config.json");
        let pooling_config: PoolingConfig = parse(&pooling_path, &read(&pooling_path)?)?;
        let Some(pooling) = pooling_config.pooling() else {
            return Err(EmbedError::Invalid {
                path: pooling_path,
                detail: "only mean pooling (pooling_mode_mean_tokens alone) or the first token \
                         (pooling_mode_cls_token alone) is supported"
                    .into(),
            });
        };
        let st_config_path = dir.join("config_sentence_transformers.json");
        let st_config: SentenceTransformersConfig = match std::fs::read(&st_config_path) {
            Ok(bytes) => parse(&st_config_path, &bytes)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
            Err(source) => {
                return Err(EmbedError::Read {
                    path: st_config_path,
                    source,
                });
            }
        };
        let query_prompt = options
            .query_prompt
            .clone()
            .unwrap_or_else(|| st_config.prompt(&["query"]));
        let document_prompt = options
            .document_prompt
            .clone()
            .unwrap_or_else(|| st_config.prompt(&["document", "passage", "corpus"]));
        let prompted = !query_prompt.is_empty() || !document_prompt.is_empty();
        if prompted && !pooling_config.include_prompt {
            return Err(EmbedError::Invalid {
                path: pooling_path,
                detail: "pooling without the prompt's tokens (include_prompt: false) is not \
                         supported"
                    .into(),
            });
        }
        // sentence-transformers reads at most max_seq_length word pieces (the tokenizer's own
        // limit may be larger), and never more than the model has positions for.
        let st_path = root.join("sentence_bert_config.json");
        let max_seq = match std::fs::read(&st_path) {
            Ok(bytes) => parse::<SentenceBertConfig>(&st_path, &bytes)?.max_seq_length,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 512,
            Err(source) => {
                return Err(EmbedError::Read {
                    path: st_path,
                    source,
                });
            }
        };
        let max_seq = max_seq.min(config.positions(family));
        if max_seq < 8 {
            return Err(EmbedError::Invalid {
                path: st_path,
                detail: format!("max_seq_length {max_seq} is too small"),
            });
        }

        let tokenizer_path = root.join("tokenizer.json");
        let tokenizer_bytes = read(&tokenizer_path)?;
        let mut splitter =
            Tokenizer::from_bytes(&tokenizer_bytes).map_err(|e| EmbedError::Invalid {
                path: tokenizer_path.clone(),
                detail: e.to_string(),
            })?;
        splitter
            .with_truncation(None)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        splitter.with_padding(None);
        let mut tokenizer = splitter.clone();
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq,
                ..TruncationParams::default()
            }))
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;

        // The document prompt's pieces take room in every chunk the model reads.
        let prompt_pieces = splitter
            .encode(document_prompt.as_str(), false)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?
            .len();
        let Some(chunk_room) = (max_seq - 2)
            .checked_sub(prompt_pieces)
            .filter(|&room| room >= 8)
        else {
            return Err(EmbedError::Invalid {
                path: st_path,
                detail: format!(
                    "max_seq_length {max_seq} leaves no room for text after the document \
                     prompt ({prompt_pieces} word pieces)"
                ),
            });
        };

        let weights = root.join("model.safetensors");
        let model_id = model_id(
            dir,
            &config_bytes,
            &tokenizer_bytes,
            &weights,
            pooling,
            &document_prompt,
        )?;
        let vb = mapped_weights(&weights)?;
        let model = Encoder::load(vb, &config).map_err(|e| EmbedError::Invalid {
            path: weights.clone(),
            detail: format!(
                "not the weights of the model config.json describes: {}",
                candle_message(&e)
            ),
        })?;
        let pool = compute_pool(options.threads, "lcm-embed")?;
        Ok(Embedder {
            model,
            tokenizer,
            splitter,
            max_seq,
            chunk_tokens: options.max_tokens.clamp(1, chunk_room),
            batch_size: options.batch_size.max(1),
            dimension: pooling_config.word_embedding_dimension,
            pooling,
            query_prompt,
            document_prompt,
            model_id,
            pool,
        })
    }

    /// Length of every vector.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// Names the model and its exact files (directory name and a hash of its configuration,
    /// tokenizer and weights' size and head, and of its pooling and document prompt unless
    /// they are mean pooling and none): an index built by another model is rebuilt.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// The most word pieces the model reads of one text (special tokens included).
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// The prompt put before each query (empty: none).
    pub fn query_prompt(&self) -> &str {
        &self.query_prompt
    }

    /// The prompt put before each document (empty: none).
    pub fn document_prompt(&self) -> &str {
        &self.document_prompt
    }

    /// The embedding of a search query: the query prompt, then `query`.
    pub fn embed_query(&self, query: &str) -> Result<Vec<f32>> {
        let text = format!("{}{query}", self.query_prompt);
        Ok(self.embed(&[text.as_str()])?.pop().unwrap_or_default())
    }

    /// The embedding of each document (a message's chunk, a summary): the document prompt,
    /// then the text.
    pub fn embed_documents(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if self.document_prompt.is_empty() {
            return self.embed(texts);
        }
        let prompted: Vec<String> = texts
            .iter()
            .map(|t| format!("{}{t}", self.document_prompt))
            .collect();
        self.embed(&prompted.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The embedding of each text as given, without a prompt (L2-normalised; a text longer
    /// than the model reads is cut, as sentence-transformers does). Texts are batched by
    /// length, so a batch pads little; the order of the result is the order of `texts`.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        // Everything parallel runs in this embedder's pool: the tokenizer's batch encoding and
        // candle's matrix products (gemm) and softmax are rayon work, which runs on the pool
        // that `install` makes current. `threads` thus bounds the compute threads, and rayon's
        // global pool is never started (tests/it/model.rs checks it).
        self.pool.install(|| self.embed_in_pool(texts))
    }

    /// The threads of the pool the model computes on ([`EmbedOptions::threads`], 0 resolved to
    /// the number of cores).
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    fn embed_in_pool(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        in_length_batches(&encodings, self.batch_size, |batch| self.forward(batch))
    }

    fn forward(&self, batch: Vec<&tokenizers::Encoding>) -> Result<Vec<Vec<f32>>> {
        let (ids, types, mask) = padded(&batch).map_err(model_error)?;
        let hidden = self
            .model
            .forward(&ids, &types, &mask)
            .map_err(model_error)?;
        if self.pooling == Pooling::Cls {
            let first = hidden.narrow(1, 0, 1).and_then(|h| h.squeeze(1));
            let rows: Vec<Vec<f32>> = first.and_then(|h| h.to_vec2()).map_err(model_error)?;
            return Ok(rows.into_iter().map(normalised).collect());
        }
        // Mean over the real tokens: padding is masked out of the sum and the count.
        let mask = mask
            .to_dtype(DType::F32)
            .and_then(|m| m.unsqueeze(2))
            .map_err(model_error)?;
        let summed = hidden
            .broadcast_mul(&mask)
            .and_then(|h| h.sum(1))
            .map_err(model_error)?;
        let counts = mask.sum(1).map_err(model_error)?;
        let mean = summed.broadcast_div(&counts).map_err(model_error)?;
        let rows: Vec<Vec<f32>> = mean.to_vec2().map_err(model_error)?;
        Ok(rows.into_iter().map(normalised).collect())
    }

    /// The word pieces (without special tokens) of the first `max_bytes` of `text`, cut on a
    /// character boundary, with the text they are of.
    fn word_pieces<'t>(
        &self,
        text: &'t str,
        max_bytes: usize,
    ) -> Result<(&'t str, tokenizers::Encoding)> {
        let text = head_bytes(text, max_bytes);
        let encoding = self
            .splitter
            .encode(text, false)
            .map_err(|e| EmbedError::Tokenizer(e.to_string()))?;
        Ok((text, encoding))
    }

    /// The start of `text` that is at most `max_tokens` word pieces (on a character boundary;
    /// all of a shorter text): the context a message's first chunk is embedded with. Only the
    /// first [`HEAD_BYTES_PER_TOKEN`] × `max_tokens` bytes are read, so a huge text costs no
    /// more than a short one.
    pub fn head<'t>(&self, text: &'t str, max_tokens: usize) -> Result<&'t str> {
        let (text, encoding) =
            self.word_pieces(text, max_tokens.saturating_mul(HEAD_BYTES_PER_TOKEN))?;
        let offsets = encoding.get_offsets();
        Ok(match (max_tokens, offsets.get(max_tokens)) {
            (0, _) => "",
            // More pieces than wanted: cut after the last one kept.
            (_, Some(_)) => &text[..offsets[max_tokens - 1].1],
            (_, None) => text,
        })
    }

    /// Cuts `text` into byte ranges that the model reads whole: consecutive, covering the
    /// text from its start (up to [`MAX_CHUNKED_BYTES`]), on character boundaries, each of at
    /// most `max_tokens` word pieces. A text the model reads whole is one chunk; an empty (or
    /// blank) text none.
    pub fn chunks(&self, text: &str) -> Result<Vec<Range<usize>>> {
        let (text, encoding) = self.word_pieces(text, MAX_CHUNKED_BYTES)?;
        let offsets = encoding.get_offsets();
        if offsets.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(offsets.len().div_ceil(self.chunk_tokens));
        let mut start = 0;
        for window in offsets.chunks(self.chunk_tokens) {
            let last = window.last().map_or(start, |&(_, e)| e);
            out.push(start..last.max(start));
            start = last.max(start);
        }
        // The last chunk runs to the end of the text (trailing spaces, unknown characters).
        if let Some(last) = out.last_mut() {
            last.end = text.len();
        }
        Ok(out)
    }
}

/// One entry of `modules.json`: a step of the pipeline sentence-transformers runs.
#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

/// The directory of the transformer's files and that of the pooling configuration, from
/// `modules.json` (without one: `dir` itself and `dir/1_Pooling`).
fn pipeline(dir: &Path) -> Result<(PathBuf, PathBuf)> {
    let path = dir.join("modules.json");
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((dir.to_path_buf(), dir.join("1_Pooling")));
        }
        Err(source) => return Err(EmbedError::Read { path, source }),
    };
    let modules: Vec<Module> = parse(&path, &bytes)?;
    let (mut transformer, mut pooling) = (None, None);
    for module in &modules {
        // "sentence_transformers.models.Pooling" and the like: the class name decides.
        let class = module.kind.rsplit('.').next().unwrap_or_default();
        match class {
            "Transformer" if transformer.is_none() => transformer = Some(dir.join(&module.path)),
            "Pooling" if pooling.is_none() && transformer.is_some() => {
                pooling = Some(dir.join(&module.path));
            }
            "Normalize" if pooling.is_some() => {}
            _ => {
                return Err(EmbedError::Invalid {
                    path,
                    detail: format!(
                        "module {:?} is not supported here: only a Transformer, then a Pooling, \
                         then optionally a Normalize module",
                        module.kind
                    ),
                });
            }
        }
    }
    match (transformer, pooling) {
        (Some(transformer), Some(pooling)) => Ok((transformer, pooling)),
        _ => Err(EmbedError::Invalid {
            path,
            detail: "a Transformer and a Pooling module are needed".into(),
        }),
    }
}

fn normalised(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    // sentence-transformers divides by max(norm, 1e-12).
    let norm = norm.max(1e-12);
    for x in &mut v {
        *x /= norm;
    }
    v
}

fn model_id(
    dir: &Path,
    config: &[u8],
    tokenizer: &[u8],
    weights: &Path,
    pooling: Pooling,
    document_prompt: &str,
) -> Result<String> {
    let io = |source| EmbedError::Read {
        path: weights.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(weights).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    let mut head = Vec::with_capacity(1 << 16);
    file.take(1 << 16).read_to_end(&mut head).map_err(io)?;
    let mut hash = Sha256::new();
    for part in [config, tokenizer, &size.to_le_bytes(), &head] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    // Only when they differ from mean pooling and no prompt, so that the ids of indexes
    // built before either was supported stay the same.
    if pooling != Pooling::Mean || !document_prompt.is_empty() {
        for part in [
            format!("{pooling:?}").as_bytes(),
            document_prompt.as_bytes(),
        ] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
    }
    let digest = hash.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let name = dir
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    Ok(format!("{name}@{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalising_keeps_direction_and_survives_zero() {
        let v = normalised(vec![3.0, 4.0]);
        assert!((v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7);
        assert_eq!(normalised(vec![0.0, 0.0]), vec![0.0, 0.0]);
    }

    const _: () = {
        const fn shared<T: Send + Sync>() {}
        shared::<Embedder>();
    };

    /// A message for the user: candle's backtrace (captured under `RUST_BACKTRACE`) left out,
    /// its context and path kept.
    #[test]
    fn candle_messages_leave_the_backtrace_out() {
        let inner =
            || candle_core::Error::Msg("cannot find tensor bert.pooler.dense.weight".into());
        let traced = candle_core::Error::WithBacktrace {
            inner: Box::new(inner()),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        assert!(traced.to_string().len() > inner().to_string().len());
        assert_eq!(
            candle_message(&traced),
            "cannot find tensor bert.pooler.dense.weight"
        );
        let placed = traced.with_path("/m/model.safetensors").context("loading");
        assert_eq!(
            candle_message(&placed),
            "loading: /m/model.safetensors: cannot find tensor bert.pooler.dense.weight"
        );
    }

    /// A cross-encoder's directory given as the embedding model is refused before its
    /// weights are read, with the option it belongs in.
    #[test]
    fn a_cross_encoder_is_refused_as_the_embedding_model() {
        let tmp = tempfile::tempdir().unwrap();
        let config = serde_json::json!({
            "architectures": ["BertForSequenceClassification"],
            "model_type": "bert", "vocab_size": 30522, "hidden_size": 384,
            "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 1536,
            "hidden_act": "gelu", "max_position_embeddings": 512, "type_vocab_size": 2,
            "layer_norm_eps": 1e-12, "num_labels": 1
        });
        std::fs::write(tmp.path().join("config.json"), config.to_string()).unwrap();
        let Err(error) = Embedder::load(tmp.path(), EmbedOptions::default()) else {
            panic!("a cross-encoder loaded as an embedding model");
        };
        let message = error.to_string();
        assert!(matches!(error, EmbedError::Invalid { .. }), "{message}");
        assert!(message.contains("cross-encoder"), "{message}");
        assert!(message.contains("reranker_dir"), "{message}");
    }

    /// all-MiniLM-L6-v2 from `../shared/tools/embed-model/setup.sh` (see tests/it/model.rs),
    /// or `None` with a message.
    fn minilm_dir() -> Option<PathBuf> {
        let setup = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/tools/embed-model/setup.sh");
        match std::process::Command::new(&setup).output() {
            Ok(out) if out.status.success() => Some(PathBuf::from(
                String::from_utf8_lossy(&out.stdout).trim().to_string(),
            )),
            _ => {
                eprintln!("skipping: no embedding model ({} failed)", setup.display());
                None
            }
        }
    }

    /// A directory with `dir`'s model files (linked) and this pooling configuration.
    fn with_pooling(dir: &Path, pooling: &str) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        for file in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::os::unix::fs::symlink(dir.join(file), tmp.path().join(file)).unwrap();
        }
        std::fs::create_dir(tmp.path().join("1_Pooling")).unwrap();
        std::fs::write(tmp.path().join("1_Pooling/config.json"), pooling).unwrap();
        tmp
    }

    /// First-token pooling (BGE, Arctic Embed) is the transformer's state of `[CLS]`,
    /// normalised, whatever the padding of the batch; mean pooling of the same weights gives
    /// another vector, and another model id.
    #[test]
    fn first_token_pooling_is_the_state_of_cls() {
        let Some(dir) = minilm_dir() else { return };
        let cls = with_pooling(
            &dir,
            r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true}"#,
        );
        let mean = with_pooling(
            &dir,
            r#"{"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true}"#,
        );
        let cls = Embedder::load(cls.path(), EmbedOptions::default()).unwrap();
        let mean = Embedder::load(mean.path(), EmbedOptions::default()).unwrap();
        assert_ne!(cls.model_id(), mean.model_id());
        let texts = [
            "Where did Caroline move from four years ago?",
            "a much longer text, so that the first one is padded in the batch: \
             it went on and on about the weather, the trains and the mountains",
        ];
        let batched = cls.embed(&texts).unwrap();
        for (i, text) in texts.iter().enumerate() {
            let encoding = cls.tokenizer.encode(*text, true).unwrap();
            let ids = Tensor::new(encoding.get_ids(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let mask = ids.ones_like().unwrap();
            let hidden = cls
                .model
                .forward(&ids, &ids.zeros_like().unwrap(), &mask)
                .unwrap();
            let state: Vec<f32> = hidden.get(0).unwrap().get(0).unwrap().to_vec1().unwrap();
            let expected = normalised(state);
            let d = |v: &[f32]| {
                v.iter()
                    .zip(&expected)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max)
            };
            assert!(
                d(&batched[i]) < 1e-5,
                "text {i} batched: {}",
                d(&batched[i])
            );
            let alone = cls.embed(&[text]).unwrap().remove(0);
            assert!(d(&alone) < 1e-5, "text {i} alone: {}", d(&alone));
            let by_mean = mean.embed(&[text]).unwrap().remove(0);
            assert!(
                d(&by_mean) > 1e-2,
                "mean pooling differs from the first token"
            );
        }
    }

    /// A batch's attention reads each text's real word pieces only (`Layer::attend`): the
    /// states of a text padded in a batch are the states it has alone, and its padding rows
    /// stay finite.
    #[test]
    fn a_padded_text_has_the_states_it_has_alone() {
        let Some(dir) = minilm_dir() else { return };
        let model = Embedder::load(&dir, EmbedOptions::default()).unwrap();
        let texts = [
            "short",
            "a text of middling length about trains",
            "the longest text of the three, so that both others are padded in the batch: \
             it went on about the weather, the trains and the mountains",
        ];
        let encodings: Vec<_> = texts
            .iter()
            .map(|t| model.tokenizer.encode(*t, true).unwrap())
            .collect();
        let (ids, types, mask) = padded(&encodings.iter().collect::<Vec<_>>()).unwrap();
        let batched = model
            .pool
            .install(|| model.model.forward(&ids, &types, &mask).unwrap());
        for (i, e) in encodings.iter().enumerate() {
            let n = e.get_ids().len();
            let alone_ids = Tensor::new(e.get_ids(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let alone = model
                .model
                .forward(
                    &alone_ids,
                    &alone_ids.zeros_like().unwrap(),
                    &alone_ids.ones_like().unwrap(),
                )
                .unwrap();
            let alone: Vec<Vec<f32>> = alone.get(0).unwrap().to_vec2().unwrap();
            let rows: Vec<Vec<f32>> = batched.get(i).unwrap().to_vec2().unwrap();
            for (row, state) in rows.iter().enumerate() {
                if row < n {
                    let d = state
                        .iter()
                        .zip(&alone[row])
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(d < 1e-5, "text {i}, piece {row}: {d}");
                    assert!(state.iter().any(|v| v.abs() > 0.1), "a real state");
                } else {
                    assert!(
                        state.iter().all(|v| v.is_finite()),
                        "text {i}, padding row {row} is not finite"
                    );
                }
            }
        }
    }
}
