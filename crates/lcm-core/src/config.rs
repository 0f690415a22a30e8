//! Configuration: every option lcm reads, with its default.
//!
//! `config/default.toml` at the repository root documents each option; a test checks that it
//! parses to exactly [`Config::default()`]. Unknown keys are an error, so a typo never silently
//! falls back to a default.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::tokens::Encoding;

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub storage: StorageConfig,
    pub tokenizer: TokenizerConfig,
    pub search: SearchConfig,
    pub embeddings: EmbeddingsConfig,
    pub import: ImportConfig,
    pub watch: WatchConfig,
    pub files: FilesConfig,
    pub compaction: CompactionConfig,
    pub llm: LlmConfig,
    pub runtime: RuntimeConfig,
    pub map: MapConfig,
    pub server: ServerConfig,
    pub proxy: ProxyConfig,
}

impl Config {
    /// Parses TOML text; missing options take their defaults.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values that parse but make no sense.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.search;
        if s.default_limit == 0 || s.default_limit > s.max_limit {
            return Err(ConfigError::Invalid(format!(
                "search.default_limit must be between 1 and search.max_limit ({}), got {}",
                s.max_limit, s.default_limit
            )));
        }
        if s.snippet_chars < 20 {
            return Err(ConfigError::Invalid(format!(
                "search.snippet_chars must be at least 20, got {}",
                s.snippet_chars
            )));
        }
        if !(0.0..0.5).contains(&self.tokenizer.safety_margin) {
            return Err(ConfigError::Invalid(format!(
                "tokenizer.safety_margin must be in [0, 0.5), got {}",
                self.tokenizer.safety_margin
            )));
        }
        if !(1..=1 << 20).contains(&self.storage.cache_mib) {
            return Err(ConfigError::Invalid(format!(
                "storage.cache_mib must be between 1 and 1048576 (1 TiB), got {}",
                self.storage.cache_mib
            )));
        }
        if self.import.max_line_bytes < 1024 {
            return Err(ConfigError::Invalid(format!(
                "import.max_line_bytes must be at least 1024, got {}",
                self.import.max_line_bytes
            )));
        }
        if self.import.batch_size == 0 || s.index_batch == 0 {
            return Err(ConfigError::Invalid(
                "import.batch_size and search.index_batch must be at least 1".into(),
            ));
        }
        self.files.validate()?;
        self.compaction.validate()?;
        self.runtime.validate()?;
        self.map.validate()?;
        self.server.validate()?;
        self.proxy.validate()?;
        self.embeddings.validate()?;
        if s.index_writer_memory_mb < 15 {
            return Err(ConfigError::Invalid(format!(
                "search.index_writer_memory_mb must be at least 15 (tantivy's minimum), got {}",
                s.index_writer_memory_mb
            )));
        }
        Ok(())
    }
}

/// Where data lives, and what memory the store may keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// The data directory (the redb file and the index). `None`: the platform's data directory
    /// plus `lcm`, unless `--data-dir` or `LCM_DATA_DIR` says otherwise.
    pub data_dir: Option<PathBuf>,
    /// The most memory, MiB, the store keeps of its file's pages (redb's page cache). Past it
    /// the least recently used pages are dropped and read again from the file (then usually
    /// from the operating system's own cache) when needed.
    pub cache_mib: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            data_dir: None,
            cache_mib: 1024,
        }
    }
}

/// How tokens are counted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizerConfig {
    /// The model whose tokenizer counts; matched against `model_families` by longest prefix.
    pub model: String,
    /// The encoding used when `model` matches no family.
    pub default_encoding: Encoding,
    /// Model-name prefix -> encoding.
    pub model_families: BTreeMap<String, Encoding>,
    /// Fraction of the budget kept free when assembling, for models whose tokenizer is not public
    /// (counts are then close, not exact).
    pub safety_margin: f64,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        let families = [
            ("gpt-4o", Encoding::O200kBase),
            ("gpt-4.1", Encoding::O200kBase),
            ("gpt-5", Encoding::O200kBase),
            ("o1", Encoding::O200kBase),
            ("o3", Encoding::O200kBase),
            ("o4", Encoding::O200kBase),
            ("gpt-4", Encoding::Cl100kBase),
            ("gpt-3.5", Encoding::Cl100kBase),
            ("text-embedding-3", Encoding::Cl100kBase),
            ("claude", Encoding::O200kBase),
        ];
        TokenizerConfig {
            model: String::new(),
            default_encoding: Encoding::O200kBase,
            model_families: families
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            safety_margin: 0.05,
        }
    }
}

impl TokenizerConfig {
    /// The encoding for `model`: the family with the longest matching prefix, else the default.
    pub fn encoding_for(&self, model: &str) -> Encoding {
        self.model_families
            .iter()
            .filter(|(prefix, _)| model.starts_with(prefix.as_str()))
            .max_by_key(|(prefix, _)| prefix.len())
            .map_or(self.default_encoding, |(_, encoding)| *encoding)
    }

    /// The encoding for the configured `model`.
    pub fn encoding(&self) -> Encoding {
        self.encoding_for(&self.model)
    }
}

/// Search and the derived index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SearchConfig {
    /// Characters of context around a match in a snippet (total, both sides).
    pub snippet_chars: usize,
    /// Hits per page when the caller gives no limit.
    pub default_limit: usize,
    /// Largest page a caller may ask for.
    pub max_limit: usize,
    /// Messages per index commit when the index catches up with the store.
    pub index_batch: usize,
    /// Memory for the index writer, in MiB (tantivy's minimum is 15).
    pub index_writer_memory_mb: usize,
}

impl Default for SearchConfig {
    fn default() -> Self {
        SearchConfig {
            snippet_chars: 200,
            default_limit: 20,
            max_limit: 200,
            index_batch: 150_000,
            index_writer_memory_mb: 128,
        }
    }
}

/// The embedding model of semantic and hybrid search (`[embeddings]`). Off until
/// `model_dir` names a model; the vector index it fills is derived like the search index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EmbeddingsConfig {
    /// A sentence-transformers model directory (`model.safetensors`, `config.json`,
    /// `tokenizer.json`, `1_Pooling/config.json`), e.g. all-MiniLM-L6-v2. `None`: no
    /// embeddings, and `semantic` / `hybrid` search say so.
    pub model_dir: Option<PathBuf>,
    /// Texts per model call.
    pub batch_size: usize,
    /// Threads of the model's computations (0: every core).
    pub threads: usize,
    /// Word pieces per embedded chunk: a longer message is embedded in several chunks.
    pub max_tokens: usize,
    /// Messages embedded per vector-index commit while it catches up with the store.
    pub index_batch: usize,
    /// Embedded chunks from which the vector index searches through lists (an inverted file:
    /// an unscoped search reads the quarter of them nearest the query instead of every entry),
    /// trained anew each time the index has grown fourfold since.
    pub lists_from: usize,
    /// Text put before every search query the model embeds, replacing the model directory's
    /// own query prompt (`config_sentence_transformers.json`: `prompts.query`). Models trained
    /// with one (E5: `"query: "`, BGE: `"Represent this sentence for searching relevant
    /// passages: "`) find less without it. `None`: the directory's, else none.
    pub query_prompt: Option<String>,
    /// Text put before every message and summary the model embeds, replacing the model
    /// directory's (`prompts.document`, `passage` or `corpus`); E5: `"passage: "`. Changing it
    /// rebuilds the vector index. `None`: the directory's, else none.
    pub document_prompt: Option<String>,
    /// A cross-encoder directory (`config.json` of a BERT with one label, `model.safetensors`,
    /// `tokenizer.json`; ms-marco-MiniLM-L-12-v2 is the tested one) that reorders the first
    /// [`Self::rerank_depth`] hits of every hybrid search. `None`: hybrid's fused order stands.
    pub reranker_dir: Option<PathBuf>,
    /// Hits of a hybrid search the reranker reads (each costs a forward pass of the
    /// cross-encoder).
    pub rerank_depth: usize,
}

impl Default for EmbeddingsConfig {
    fn default() -> Self {
        EmbeddingsConfig {
            model_dir: None,
            batch_size: 32,
            threads: 0,
            max_tokens: 256,
            index_batch: 2048,
            lists_from: 200_000,
            query_prompt: None,
            document_prompt: None,
            reranker_dir: None,
            rerank_depth: 50,
        }
    }
}

impl EmbeddingsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.batch_size == 0 || self.index_batch == 0 {
            return Err(ConfigError::Invalid(
                "embeddings.batch_size and embeddings.index_batch must be at least 1".into(),
            ));
        }
        if self.reranker_dir.is_some() && self.model_dir.is_none() {
            return Err(ConfigError::Invalid(
                "embeddings.reranker_dir reorders hybrid search, which needs \
                 embeddings.model_dir: set both, or neither"
                    .into(),
            ));
        }
        if !(1..=1000).contains(&self.rerank_depth) {
            return Err(ConfigError::Invalid(format!(
                "embeddings.rerank_depth must be between 1 and 1000, got {}",
                self.rerank_depth
            )));
        }
        if self.lists_from < 16 {
            return Err(ConfigError::Invalid(format!(
                "embeddings.lists_from must be at least 16 (the fewest lists an index has), got {}",
                self.lists_from
            )));
        }
        if !(16..=512).contains(&self.max_tokens) {
            return Err(ConfigError::Invalid(format!(
                "embeddings.max_tokens must be between 16 and 512, got {}",
                self.max_tokens
            )));
        }
        Ok(())
    }
}

/// Transcript import.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImportConfig {
    /// Messages per store transaction.
    pub batch_size: usize,
    /// Longest transcript line (or JSON document) an import reads, in bytes. A longer line is
    /// never held in memory: it is passed over and reported as a bad line.
    pub max_line_bytes: usize,
}

impl Default for ImportConfig {
    fn default() -> Self {
        ImportConfig {
            batch_size: 5_000,
            max_line_bytes: 64 << 20,
        }
    }
}

/// Folders and files `lcm serve` (and `lcm mcp`) follow: new transcripts and lines appended
/// to them are imported as they are written, like `lcm import --follow`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WatchConfig {
    /// Folders (walked recursively for `*.jsonl` and `*.json`) and files; `~/` is the home
    /// directory. Empty: nothing is followed.
    pub paths: Vec<PathBuf>,
}

/// Which summariser compaction uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// The deterministic extractive summariser: no network, no key.
    #[default]
    Extractive,
    /// An OpenAI-compatible Chat Completions endpoint (OpenAI, vLLM, llama.cpp, Ollama, ...).
    Openai,
    /// The Anthropic Messages API.
    Anthropic,
}

/// The language model used for summaries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmConfig {
    /// `extractive` (default), `openai` or `anthropic`.
    pub provider: ProviderKind,
    /// Base URL of the API (e.g. `http://127.0.0.1:8080/v1`). Empty: the provider's public URL.
    pub base_url: String,
    /// Model name sent to the provider.
    pub model: String,
    /// Per-call timeout, seconds.
    pub timeout_s: u64,
    /// Retries on 429, 5xx, timeouts and transport errors (with backoff and jitter).
    pub max_retries: u32,
    /// Send the JSON Schema of a map item's answer as an OpenAI structured output
    /// (`response_format`), which servers that support it enforce while decoding. Turn it off
    /// for an OpenAI-compatible server that refuses the field.
    pub structured_output: bool,
}

impl Default for LlmConfig {
    fn default() -> Self {
        LlmConfig {
            provider: ProviderKind::Extractive,
            base_url: String::new(),
            model: String::new(),
            timeout_s: 60,
            max_retries: 3,
            structured_output: true,
        }
    }
}

/// When and how the context is compacted (paper section 2.1; defaults from seed 001).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// Fraction of the budget at which a compaction starts (without blocking the turn). Below it
    /// no summarisation work happens at all.
    pub soft_threshold: f64,
    /// Fraction of the budget above which assembly waits for compaction.
    pub hard_threshold: f64,
    /// Where a compaction run aims: this fraction of the budget. A leaf pass summarises only
    /// the oldest raw span that brings the context down to it, so the raw history that fits
    /// above it stays raw (the window is used, not left half empty). In (0, soft_threshold].
    pub target_fill: f64,
    /// The most recent messages, never compacted (a tool call is never split from its result)
    /// while they fit in `fresh_tail_max_share` of the budget.
    pub fresh_tail: usize,
    /// Largest share of the budget the fresh tail may hold: past it the tail yields its oldest
    /// messages (a tool call with its results) to compaction, so that a few large messages
    /// cannot keep a context over its budget. In (0, 1].
    pub fresh_tail_max_share: f64,
    /// Largest raw span a leaf summary covers, in tokens.
    pub leaf_chunk_tokens: u32,
    /// Target size of a leaf summary, in tokens.
    pub leaf_target_tokens: u32,
    /// Same-depth summaries that are condensed into one.
    pub condensed_fanout: usize,
    /// Target size of a condensed summary, in tokens.
    pub condensed_target_tokens: u32,
    /// Deepest condensed summary; unset means unlimited.
    pub max_depth: Option<u32>,
    /// Most summaries one compaction run writes (each makes at most two provider calls).
    pub max_passes: usize,
    /// Most tokens a session's pinned messages may take together (`lcm_pin`): a pin that
    /// would pass it is refused. Absolute, since the window is given per call; 0 turns
    /// pinning off.
    pub pinned_max_tokens: u32,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            soft_threshold: 0.75,
            hard_threshold: 0.9,
            target_fill: 0.7,
            fresh_tail: 32,
            fresh_tail_max_share: 0.5,
            leaf_chunk_tokens: 20_000,
            leaf_target_tokens: 1_200,
            condensed_fanout: 4,
            condensed_target_tokens: 2_000,
            max_depth: None,
            max_passes: 64,
            pinned_max_tokens: 4_000,
        }
    }
}

/// [`CompactionConfig`]'s fractions of one budget, in tokens (from
/// [`CompactionConfig::thresholds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// A context above this many tokens is compacted (in the background below `hard`).
    pub soft: u64,
    /// A context above this many tokens waits for compaction before it is sent.
    pub hard: u64,
    /// Where a compaction run aims (`target_fill`, never above `soft`).
    pub target: u64,
}

impl Thresholds {
    /// Whether a context of `tokens` is over the soft threshold (compaction is due).
    pub fn above_soft(&self, tokens: u64) -> bool {
        tokens > self.soft
    }

    /// Whether a context of `tokens` is over the hard threshold (it must wait for compaction).
    pub fn above_hard(&self, tokens: u64) -> bool {
        tokens > self.hard
    }
}

impl CompactionConfig {
    /// The thresholds of `budget` tokens (the window less its safety margin) in tokens.
    ///
    /// The one place the fractions become token counts: the session actor, the controller,
    /// the compaction loop and the CLI all ask here, so they agree to the token on where
    /// "above soft" starts.
    pub fn thresholds(&self, budget: u64) -> Thresholds {
        let of = |fraction: f64| (fraction * budget as f64) as u64;
        Thresholds {
            soft: of(self.soft_threshold),
            hard: of(self.hard_threshold),
            target: of(self.target_fill.min(self.soft_threshold)),
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        if !(0.0 < self.soft_threshold
            && self.soft_threshold <= self.hard_threshold
            && self.hard_threshold <= 1.0)
        {
            return bad(format!(
                "compaction thresholds must satisfy 0 < soft_threshold <= hard_threshold <= 1, got {} and {}",
                self.soft_threshold, self.hard_threshold
            ));
        }
        if !(self.target_fill > 0.0 && self.target_fill <= self.soft_threshold) {
            return bad(format!(
                "compaction.target_fill must be in (0, soft_threshold = {}], got {}",
                self.soft_threshold, self.target_fill
            ));
        }
        if !(self.fresh_tail_max_share > 0.0 && self.fresh_tail_max_share <= 1.0) {
            return bad(format!(
                "compaction.fresh_tail_max_share must be in (0, 1], got {}",
                self.fresh_tail_max_share
            ));
        }
        if self.condensed_fanout < 2 {
            return bad(format!(
                "compaction.condensed_fanout must be at least 2, got {}",
                self.condensed_fanout
            ));
        }
        if self.leaf_target_tokens == 0
            || self.condensed_target_tokens == 0
            || self.leaf_chunk_tokens <= self.leaf_target_tokens
        {
            return bad("compaction targets must be positive and leaf_chunk_tokens larger than leaf_target_tokens".into());
        }
        if self.max_passes == 0 {
            return bad("compaction.max_passes must be at least 1".into());
        }
        Ok(())
    }
}

/// Large payloads and file reads (the paper's large-file stage): what becomes a file record and
/// how much of the context its reference may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// A part of a message (tool result, paste, file read) with more tokens than this is shown
    /// in contexts as a reference to its file record (id, path, kind, size, exploration summary)
    /// instead of the payload. The message itself is stored verbatim either way.
    pub large_file_tokens: u32,
    /// Most tokens of one exploration summary.
    pub exploration_max_tokens: u32,
}

impl Default for FilesConfig {
    fn default() -> Self {
        FilesConfig {
            large_file_tokens: 25_000,
            exploration_max_tokens: 600,
        }
    }
}

impl FilesConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.large_file_tokens < 256 {
            return Err(ConfigError::Invalid(format!(
                "files.large_file_tokens must be at least 256, got {}",
                self.large_file_tokens
            )));
        }
        if self.exploration_max_tokens < 64 || self.exploration_max_tokens >= self.large_file_tokens
        {
            return Err(ConfigError::Invalid(format!(
                "files.exploration_max_tokens must be at least 64 and below files.large_file_tokens, got {}",
                self.exploration_max_tokens
            )));
        }
        Ok(())
    }
}

/// The supervised actor runtime: session lifetimes, concurrency, supervision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    /// A session actor with no work for this long stops (its state is rebuilt from the store on
    /// next use).
    pub idle_timeout_s: u64,
    /// Longest a host call (append, context, tool) waits for the runtime before failing.
    pub call_timeout_s: u64,
    /// Compactions (and so summariser calls) running at once across all sessions.
    pub max_concurrent_compactions: usize,
    /// Attempts of one compaction whose worker crashed or stalled before it is reported failed.
    pub compaction_max_attempts: u32,
    /// First delay before restarting a crashed actor; doubles with each restart in the window.
    pub restart_backoff_ms: u64,
    /// Longest restart delay.
    pub restart_backoff_max_ms: u64,
    /// Restarts of one actor within `restart_window_s` after which it is not restarted again (a
    /// session is then refused until the runtime restarts; a singleton stops the runtime).
    pub max_restarts: u32,
    pub restart_window_s: u64,
    /// An actor busy with one message for longer than this is considered stuck: it is killed and
    /// restarted. 0 disables stall detection.
    pub stall_timeout_s: u64,
    /// How often the supervisor checks for stuck actors, in milliseconds.
    pub heartbeat_ms: u64,
    /// How often the integrity check runs in the background, in seconds; 0 disables it (it still
    /// runs on demand).
    pub integrity_interval_s: u64,
    /// Largest delay between an append and the search index catching up with it, in
    /// milliseconds (grep scans the unindexed tail meanwhile, so results are complete anyway).
    pub index_interval_ms: u64,
    /// Tool-calling steps a sub-agent (Task, Tasks, lcm_expand_query) may take.
    pub subagent_max_steps: u32,
    /// Tokens (input + output, summed over its calls) a sub-agent may spend.
    pub subagent_max_tokens: u64,
    /// The window of a sub-agent's model: each request is the sub-agent's session assembled,
    /// compacted and fitted to this many tokens (less the safety margin and its system prompt).
    pub subagent_context_tokens: u64,
    /// Longest a sub-agent may run, in seconds.
    pub subagent_timeout_s: u64,
    /// Runs of a sub-agent whose worker crashed, before the call fails.
    pub subagent_max_attempts: u32,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            idle_timeout_s: 300,
            call_timeout_s: 600,
            max_concurrent_compactions: 8,
            compaction_max_attempts: 3,
            restart_backoff_ms: 50,
            restart_backoff_max_ms: 10_000,
            max_restarts: 10,
            restart_window_s: 60,
            stall_timeout_s: 900,
            heartbeat_ms: 1_000,
            integrity_interval_s: 3_600,
            index_interval_ms: 1_000,
            subagent_max_steps: 30,
            subagent_max_tokens: 400_000,
            subagent_context_tokens: 100_000,
            subagent_timeout_s: 600,
            subagent_max_attempts: 2,
        }
    }
}

impl RuntimeConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.subagent_max_steps == 0
            || self.subagent_timeout_s == 0
            || self.subagent_max_attempts == 0
        {
            return Err(ConfigError::Invalid(
                "runtime.subagent_max_steps, runtime.subagent_timeout_s and runtime.subagent_max_attempts must be at least 1".into(),
            ));
        }
        if self.subagent_context_tokens < 1024 {
            return Err(ConfigError::Invalid(format!(
                "runtime.subagent_context_tokens must be at least 1024, got {}",
                self.subagent_context_tokens
            )));
        }
        if self.max_concurrent_compactions == 0 || self.compaction_max_attempts == 0 {
            return Err(ConfigError::Invalid(
                "runtime.max_concurrent_compactions and runtime.compaction_max_attempts must be at least 1".into(),
            ));
        }
        if self.call_timeout_s == 0 || self.heartbeat_ms == 0 || self.index_interval_ms == 0 {
            return Err(ConfigError::Invalid(
                "runtime.call_timeout_s, runtime.heartbeat_ms and runtime.index_interval_ms must be positive".into(),
            ));
        }
        if self.restart_backoff_ms > self.restart_backoff_max_ms {
            return Err(ConfigError::Invalid(format!(
                "runtime.restart_backoff_ms ({}) must not exceed runtime.restart_backoff_max_ms ({})",
                self.restart_backoff_ms, self.restart_backoff_max_ms
            )));
        }
        Ok(())
    }
}

/// The map operators (`llm_map`, `agentic_map`): defaults for jobs and the limits on their files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MapConfig {
    /// Items of one job processed at once.
    pub concurrency: u32,
    /// Attempts per item (the first included) before it is failed.
    pub max_attempts: u32,
    /// Longest one attempt at one item may take, seconds.
    pub timeout_s: u64,
    /// How long a claimed item belongs to its worker before another may take it over, seconds.
    /// Must exceed `timeout_s`.
    pub lease_s: u64,
    /// Directories the input and output files must lie in (after resolving `..` and symlinks).
    /// Empty: the working directory.
    pub allowed_roots: Vec<PathBuf>,
    /// Longest input line, bytes; a longer line becomes a failed item.
    pub max_item_bytes: u64,
}

impl Default for MapConfig {
    fn default() -> Self {
        MapConfig {
            concurrency: 16,
            max_attempts: 3,
            timeout_s: 120,
            lease_s: 300,
            allowed_roots: Vec::new(),
            max_item_bytes: 1 << 20,
        }
    }
}

impl MapConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.concurrency == 0 || self.max_attempts == 0 {
            return Err(ConfigError::Invalid(
                "map.concurrency and map.max_attempts must be at least 1".into(),
            ));
        }
        if self.timeout_s == 0 || self.max_item_bytes == 0 {
            return Err(ConfigError::Invalid(
                "map.timeout_s and map.max_item_bytes must be positive".into(),
            ));
        }
        if self.lease_s <= self.timeout_s {
            return Err(ConfigError::Invalid(format!(
                "map.lease_s ({}) must exceed map.timeout_s ({}), or items would be taken over while still being worked on",
                self.lease_s, self.timeout_s
            )));
        }
        Ok(())
    }
}

/// The daemon (`lcm serve`): where it listens, who may call it, and its request limits.
/// Its `Debug` output never shows a token.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// The address to listen on (`IP:PORT`). Anything but a loopback address requires a bearer
    /// token (generated on first start when none is configured).
    pub bind: String,
    /// The bearer token every route but `/healthz` requires; `LCM_SERVER_TOKEN` overrides it.
    /// `None`: no token on loopback, a generated one (kept in `<data-dir>/server-token`)
    /// elsewhere or when tenants are configured.
    pub token: Option<String>,
    /// Largest request body, in bytes; a larger one is refused with 413.
    pub max_body_bytes: u64,
    /// Longest a request (other than an event stream) may take before it is answered with 503.
    pub request_timeout_s: u64,
    /// On SIGTERM / SIGINT: how long in-flight requests, then running compactions, get to finish.
    pub shutdown_grace_s: u64,
    /// Scoped tokens: token -> session key prefix. A tenant token sees and appends only the
    /// sessions whose key starts with its prefix, and creates only such sessions.
    pub tenants: BTreeMap<String, String>,
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Configurations get logged; secrets must not be.
        f.debug_struct("ServerConfig")
            .field("bind", &self.bind)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("max_body_bytes", &self.max_body_bytes)
            .field("request_timeout_s", &self.request_timeout_s)
            .field("shutdown_grace_s", &self.shutdown_grace_s)
            .field(
                "tenant_prefixes",
                &self.tenants.values().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Shortest token accepted in `[server]` (a guessable token is no protection).
pub const MIN_SERVER_TOKEN_LEN: usize = 16;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: "127.0.0.1:7878".to_owned(),
            token: None,
            max_body_bytes: 8 << 20,
            request_timeout_s: 600,
            shutdown_grace_s: 10,
            tenants: BTreeMap::new(),
        }
    }
}

impl ServerConfig {
    /// The bind address, parsed.
    pub fn bind_addr(&self) -> Result<std::net::SocketAddr, ConfigError> {
        self.bind.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "server.bind must be an IP address and a port (\"127.0.0.1:7878\", \"[::1]:7878\", \"0.0.0.0:7878\"), got {:?}",
                self.bind
            ))
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.bind_addr()?;
        if let Some(token) = &self.token {
            check_token("server.token", token)?;
        }
        for (token, prefix) in &self.tenants {
            check_token("a token of server.tenants", token)?;
            if prefix.is_empty() {
                return Err(ConfigError::Invalid(
                    "server.tenants: a tenant's session key prefix must not be empty (an empty prefix would see every session; use server.token for that)".into(),
                ));
            }
            if self.token.as_deref() == Some(token.as_str()) {
                return Err(ConfigError::Invalid(
                    "server.tenants: a tenant token must differ from server.token".into(),
                ));
            }
        }
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::Invalid(format!(
                "server.max_body_bytes must be at least 1024, got {}",
                self.max_body_bytes
            )));
        }
        if self.request_timeout_s == 0 {
            return Err(ConfigError::Invalid(
                "server.request_timeout_s must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// The OpenAI- and Anthropic-compatible proxy of the daemon (`POST /v1/chat/completions`,
/// `POST /v1/messages`): where it forwards requests, how much context it sends, and the lcm tools
/// it adds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxyConfig {
    /// Base URL of the OpenAI-compatible upstream; `/chat/completions` is appended.
    pub openai_base_url: String,
    /// Base URL of the Anthropic-compatible upstream; `/messages` is appended.
    pub anthropic_base_url: String,
    /// Most tokens of a request sent upstream (the whole JSON body: system prompt, tools, the
    /// assembled context, tool rounds), counted with the configured tokenizer. The
    /// `x-lcm-budget` header sets it for one request.
    pub context_budget_tokens: u64,
    /// Add `lcm_grep`, `lcm_describe` and `lcm_expand_query` to the tools of requests that let
    /// the model choose its tools, and run the calls the model makes to them.
    pub inject_tools: bool,
    /// With `inject_tools`, also add `lcm_pin` and `lcm_forget` (never for a tenant): the model
    /// keeps what it must see verbatim past compaction and sets aside what it no longer needs,
    /// at the cost of their definitions in every request.
    pub inject_context_tools: bool,
    /// Rounds of lcm tool calls the proxy runs for one client request before it asks the model
    /// for an answer without tools.
    pub max_tool_rounds: u32,
    /// Longest wait for the upstream, in seconds: for the head of its answer, then between two
    /// chunks of its body.
    pub timeout_s: u64,
    /// When `[llm]` is not configured (provider `extractive`): most calls per session and
    /// window (`summary_window_s`) that compactions of a proxied session make to the client's
    /// own model, with the client's credentials; past it (and whenever such a call fails) the
    /// offline summariser writes the summary. 0: never summarise with the client's model.
    pub summary_calls_per_window: u32,
    /// The window of `summary_calls_per_window`, in seconds.
    pub summary_window_s: u64,
    /// How long the client's model (and the credentials it holds, in memory only) stays the
    /// summariser of a session without a proxied request of that session, in seconds.
    pub summarizer_idle_s: u64,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            openai_base_url: "https://api.openai.com/v1".to_owned(),
            anthropic_base_url: "https://api.anthropic.com/v1".to_owned(),
            context_budget_tokens: 100_000,
            inject_tools: true,
            inject_context_tools: false,
            max_tool_rounds: 4,
            timeout_s: 600,
            summary_calls_per_window: 20,
            summary_window_s: 600,
            summarizer_idle_s: 900,
        }
    }
}

/// Smallest `proxy.context_budget_tokens` (and `x-lcm-budget`) accepted.
pub const MIN_PROXY_BUDGET_TOKENS: u64 = 1024;

impl ProxyConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        for (name, url) in [
            ("proxy.openai_base_url", &self.openai_base_url),
            ("proxy.anthropic_base_url", &self.anthropic_base_url),
        ] {
            let url = url.trim();
            let rest = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"));
            if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be an http:// or https:// URL with a host, got {url:?}"
                )));
            }
        }
        if self.context_budget_tokens < MIN_PROXY_BUDGET_TOKENS {
            return Err(ConfigError::Invalid(format!(
                "proxy.context_budget_tokens must be at least {MIN_PROXY_BUDGET_TOKENS}, got {}",
                self.context_budget_tokens
            )));
        }
        if !(1..=32).contains(&self.max_tool_rounds) {
            return Err(ConfigError::Invalid(format!(
                "proxy.max_tool_rounds must be between 1 and 32, got {}",
                self.max_tool_rounds
            )));
        }
        if self.timeout_s == 0 {
            return Err(ConfigError::Invalid(
                "proxy.timeout_s must be at least 1".into(),
            ));
        }
        if self.summary_calls_per_window > MAX_PROXY_SUMMARY_CALLS {
            return Err(ConfigError::Invalid(format!(
                "proxy.summary_calls_per_window must be between 0 (never use the client's model) and {MAX_PROXY_SUMMARY_CALLS}, got {}",
                self.summary_calls_per_window
            )));
        }
        for (name, seconds) in [
            ("proxy.summary_window_s", self.summary_window_s),
            ("proxy.summarizer_idle_s", self.summarizer_idle_s),
        ] {
            if !(1..=MAX_PROXY_SUMMARY_SECONDS).contains(&seconds) {
                return Err(ConfigError::Invalid(format!(
                    "{name} must be between 1 and {MAX_PROXY_SUMMARY_SECONDS} seconds, got {seconds}"
                )));
            }
        }
        Ok(())
    }
}

/// Largest `proxy.summary_calls_per_window`.
pub const MAX_PROXY_SUMMARY_CALLS: u32 = 100_000;
/// Longest `proxy.summary_window_s` and `proxy.summarizer_idle_s`: one day.
pub const MAX_PROXY_SUMMARY_SECONDS: u64 = 86_400;

/// A bearer token is at least [`MIN_SERVER_TOKEN_LEN`] visible ASCII characters.
fn check_token(what: &str, token: &str) -> Result<(), ConfigError> {
    if token.len() < MIN_SERVER_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ConfigError::Invalid(format!(
            "{what} must be at least {MIN_SERVER_TOKEN_LEN} visible ASCII characters (no spaces)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_are_the_fractions_of_the_budget_rounded_down() {
        let config = CompactionConfig {
            soft_threshold: 0.75,
            hard_threshold: 0.9,
            target_fill: 0.7,
            ..CompactionConfig::default()
        };
        let t = config.thresholds(1_001);
        assert_eq!((t.soft, t.hard, t.target), (750, 900, 700));
        assert!(!t.above_soft(750) && t.above_soft(751));
        assert!(!t.above_hard(900) && t.above_hard(901));
        // The target never passes the soft threshold.
        let high_target = CompactionConfig {
            target_fill: 0.8,
            ..config
        };
        assert_eq!(high_target.thresholds(1_000).target, 750);
    }

    #[test]
    fn debug_output_never_shows_a_token() {
        let mut config = Config::default();
        config.server.token = Some("admin-secret-0123456789".into());
        config
            .server
            .tenants
            .insert("tenant-secret-0123456789".into(), "team-a/".into());
        let shown = format!("{config:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(
            shown.contains("<redacted>") && shown.contains("team-a/"),
            "{shown}"
        );
    }

    #[test]
    fn empty_text_gives_defaults() {
        assert_eq!(Config::from_toml("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let err = Config::from_toml("[search]\nsnipet_chars = 10\n").unwrap_err();
        assert!(err.to_string().contains("snipet_chars"), "{err}");
        let err = Config::from_toml("[search]\ndefault_limit = 500\n").unwrap_err();
        assert!(err.to_string().contains("default_limit"), "{err}");
        let err = Config::from_toml("[tokenizer]\ndefault_encoding = \"gpt2\"\n").unwrap_err();
        assert!(err.to_string().contains("gpt2"), "{err}");
        let err = Config::from_toml("[storage]\ncache_mib = 0\n").unwrap_err();
        assert!(err.to_string().contains("storage.cache_mib"), "{err}");
        let small = Config::from_toml("[storage]\ncache_mib = 64\n").unwrap();
        assert_eq!(small.storage.cache_mib, 64);
    }

    #[test]
    fn a_reranker_needs_the_embedding_model_and_a_depth() {
        let err = Config::from_toml("[embeddings]\nreranker_dir = \"/r\"\n").unwrap_err();
        assert!(err.to_string().contains("embeddings.model_dir"), "{err}");
        let err =
            Config::from_toml("[embeddings]\nmodel_dir = \"/m\"\nrerank_depth = 0\n").unwrap_err();
        assert!(err.to_string().contains("embeddings.rerank_depth"), "{err}");
        let both =
            Config::from_toml("[embeddings]\nmodel_dir = \"/m\"\nreranker_dir = \"/r\"\n").unwrap();
        assert_eq!(both.embeddings.reranker_dir, Some(PathBuf::from("/r")));
        assert_eq!(both.embeddings.rerank_depth, 50);
    }

    #[test]
    fn model_families_match_by_longest_prefix() {
        let t = TokenizerConfig::default();
        assert_eq!(t.encoding_for("gpt-4o-mini"), Encoding::O200kBase);
        assert_eq!(t.encoding_for("gpt-4-turbo"), Encoding::Cl100kBase);
        assert_eq!(t.encoding_for("llama-3"), Encoding::O200kBase);
    }

    #[test]
    fn server_options_are_checked() {
        let server = Config::default().server;
        assert!(server.bind_addr().unwrap().ip().is_loopback());
        let cases = [
            ("[server]\nbind = \"localhost\"\n", "server.bind"),
            ("[server]\ntoken = \"short\"\n", "server.token"),
            ("[server]\nmax_body_bytes = 10\n", "server.max_body_bytes"),
            (
                "[server]\nrequest_timeout_s = 0\n",
                "server.request_timeout_s",
            ),
            (
                "[server.tenants]\n\"tenant-token-0123456789\" = \"\"\n",
                "prefix must not be empty",
            ),
            (
                "[server]\ntoken = \"same-token-0123456789\"\n[server.tenants]\n\"same-token-0123456789\" = \"a/\"\n",
                "must differ",
            ),
        ];
        for (text, expected) in cases {
            let err = Config::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let ok = Config::from_toml(
            "[server]\nbind = \"0.0.0.0:0\"\ntoken = \"admin-token-0123456789\"\n[server.tenants]\n\"tenant-token-0123456789\" = \"team-a/\"\n",
        )
        .unwrap();
        assert_eq!(ok.server.tenants.len(), 1);
    }

    #[test]
    fn proxy_options_are_checked() {
        let cases = [
            (
                "[proxy]\nopenai_base_url = \"api.openai.com\"\n",
                "proxy.openai_base_url",
            ),
            (
                "[proxy]\nanthropic_base_url = \"http://\"\n",
                "proxy.anthropic_base_url",
            ),
            (
                "[proxy]\ncontext_budget_tokens = 100\n",
                "proxy.context_budget_tokens",
            ),
            ("[proxy]\nmax_tool_rounds = 0\n", "proxy.max_tool_rounds"),
            ("[proxy]\ntimeout_s = 0\n", "proxy.timeout_s"),
            (
                "[proxy]\nsummary_calls_per_window = 100001\n",
                "proxy.summary_calls_per_window",
            ),
            ("[proxy]\nsummary_window_s = 0\n", "proxy.summary_window_s"),
            (
                "[proxy]\nsummarizer_idle_s = 86401\n",
                "proxy.summarizer_idle_s",
            ),
        ];
        for (text, expected) in cases {
            let err = Config::from_toml(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text}: {err}");
        }
        let ok = Config::from_toml(
            "[proxy]\nopenai_base_url = \"http://127.0.0.1:8080/v1\"\ncontext_budget_tokens = 8000\n",
        )
        .unwrap();
        assert_eq!(ok.proxy.context_budget_tokens, 8000);
        assert!(ok.proxy.inject_tools);
    }
}
