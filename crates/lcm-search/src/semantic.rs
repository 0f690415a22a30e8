//! Semantic search: the embedding model (`lcm-embed`) and the vector index it fills
//! ([`crate::vectors`]), kept behind the store like the rest of the derived index.
//!
//! The model is loaded, and the vector index opened, on first use: a command that never
//! searches by meaning pays nothing for them. [`Semantic::catch_up_until`] embeds the messages
//! from the vector index's watermark on (each message's searchable text, cut into chunks the
//! model reads whole), committing every `embeddings.index_batch` messages; the runtime's
//! indexer runs it in the background after the words index, so an append never waits for a
//! model. A crash loses at most the batch being embedded, which the next catch-up embeds
//! again.
//!
//! Messages above the watermark are not found by meaning until they are embedded; a hybrid
//! search still finds them by their words.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};

use lcm_core::config::EmbeddingsConfig;
use lcm_core::ids::MessageId;
use lcm_embed::{EmbedOptions, Embedder};
use lcm_store::error::{Result, StoreError};
use lcm_store::records::{RecordReader, RecordSource};

use crate::grep::Scope;
use crate::vectors::{Opened, VectorEntry, VectorFilter, VectorHit, VectorIndex};

/// Directory name of the vector index inside a data directory (beside `index/`, so a rebuild
/// of the words index keeps the embeddings, which cost far more to make).
pub const VECTORS_DIR: &str = "vectors";

/// The model and the vector index, once loaded.
struct Loaded {
    embedder: Embedder,
    vectors: RwLock<VectorIndex>,
}

/// Semantic search over one data directory (see the module doc).
pub struct Semantic {
    dir: PathBuf,
    config: EmbeddingsConfig,
    writable: bool,
    loaded: OnceLock<std::result::Result<Loaded, String>>,
    /// One catch-up at a time.
    catching_up: Mutex<()>,
}

impl std::fmt::Debug for Semantic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semantic")
            .field("dir", &self.dir)
            .field("model_dir", &self.config.model_dir)
            .finish_non_exhaustive()
    }
}

impl Semantic {
    /// Semantic search with the vector index in `dir`, if `config` names a model (`None`
    /// otherwise). Nothing is loaded yet.
    pub fn new(dir: PathBuf, config: &EmbeddingsConfig, writable: bool) -> Option<Semantic> {
        config.model_dir.as_ref()?;
        Some(Semantic {
            dir,
            config: config.clone(),
            writable,
            loaded: OnceLock::new(),
            catching_up: Mutex::new(()),
        })
    }

    fn loaded(&self) -> Result<&Loaded> {
        let loaded = self.loaded.get_or_init(|| {
            let model_dir = self.config.model_dir.clone().unwrap_or_default();
            let embedder = Embedder::load(&model_dir, EmbedOptions::from(&self.config))
                .map_err(|e| {
                    format!(
                        "the embedding model of `[embeddings] model_dir` ({}) cannot be loaded: {e}",
                        model_dir.display()
                    )
                })?;
            let (vectors, opened) = VectorIndex::open(
                &self.dir,
                embedder.dimension(),
                embedder.model_id(),
                self.writable,
            )
            .map_err(|e| e.to_string())?;
            if let Opened::Rebuilt(why) = &opened {
                tracing::info!(%why, "the vector index starts empty and is rebuilt from the store");
            }
            Ok(Loaded {
                embedder,
                vectors: RwLock::new(vectors),
            })
        });
        loaded
            .as_ref()
            .map_err(|e| StoreError::InvalidQuery(e.clone()))
    }

    /// The model, loaded if it was not yet.
    pub fn embedder(&self) -> Result<&Embedder> {
        Ok(&self.loaded()?.embedder)
    }

    /// Every message below this id is embedded.
    pub fn watermark(&self) -> Result<MessageId> {
        let loaded = self.loaded()?;
        let vectors = loaded
            .vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(MessageId(vectors.watermark()))
    }

    /// Embedded chunks (a message has one or more).
    pub fn chunk_count(&self) -> Result<usize> {
        let loaded = self.loaded()?;
        let vectors = loaded
            .vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(vectors.len())
    }

    /// Embeds every message from the watermark to the store's end, committing every
    /// `index_batch` messages; `progress(done, total)` after each commit; stops after a commit
    /// when `stop()` says so. Returns the messages embedded.
    pub fn catch_up_until(
        &self,
        store: &impl RecordSource,
        mut progress: impl FnMut(u64, u64),
        stop: impl Fn() -> bool,
    ) -> Result<u64> {
        let loaded = self.loaded()?;
        let _one = self
            .catching_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let start = self.watermark()?.0;
        let end = store.next_message_id()?.0;
        let total = end.saturating_sub(start);
        let mut done = 0u64;
        let mut from = start;
        while from < end {
            let to = (from + self.config.index_batch as u64).min(end);
            self.embed_range(loaded, store, from, to)?;
            done += to - from;
            from = to;
            progress(done, total);
            if stop() {
                break;
            }
        }
        Ok(done)
    }

    /// Embeds and commits the messages `from..to`.
    fn embed_range(
        &self,
        loaded: &Loaded,
        store: &impl RecordSource,
        from: u64,
        to: u64,
    ) -> Result<()> {
        let mut texts: Vec<String> = Vec::new();
        let mut entries: Vec<VectorEntry> = Vec::new();
        let mut failure = None;
        store
            .reader()?
            .for_each_message(MessageId(from)..MessageId(to), |m| {
                let text = m.search_text();
                let chunks = match loaded.embedder.chunks(&text) {
                    Ok(chunks) => chunks,
                    Err(e) => {
                        failure = Some(StoreError::InvalidQuery(e.to_string()));
                        return ControlFlow::Break(());
                    }
                };
                for chunk in chunks {
                    entries.push(VectorEntry {
                        message: m.id.0,
                        session: m.session.0,
                        created_at: m.created_at.0,
                        role: m.role.code() as u8,
                        chunk: (chunk.start as u32, chunk.end as u32),
                    });
                    texts.push(text[chunk].to_string());
                }
                ControlFlow::Continue(())
            })?;
        if let Some(e) = failure {
            return Err(e);
        }
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors = loaded
            .embedder
            .embed(&refs)
            .map_err(|e| StoreError::InvalidQuery(e.to_string()))?;
        let mut index = loaded
            .vectors
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for (entry, vector) in entries.into_iter().zip(vectors) {
            index.push(entry, vector)?;
        }
        index.commit(to)
    }

    /// Drops every vector and embeds the store again.
    pub fn rebuild_until(
        &self,
        store: &impl RecordSource,
        progress: impl FnMut(u64, u64),
        stop: impl Fn() -> bool,
    ) -> Result<u64> {
        {
            let loaded = self.loaded()?;
            let mut index = loaded
                .vectors
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            index.clear()?;
        }
        self.catch_up_until(store, progress, stop)
    }

    /// The `k` embedded messages in `scope` nearest `query` in meaning, best first.
    pub fn search(
        &self,
        query: &str,
        k: usize,
        scope: &Scope,
        messages: Option<&(dyn Fn(u64) -> bool + Sync)>,
    ) -> Result<Vec<VectorHit>> {
        let loaded = self.loaded()?;
        let query = loaded
            .embedder
            .embed(&[query])
            .map_err(|e| StoreError::InvalidQuery(e.to_string()))?
            .pop()
            .unwrap_or_default();
        let filter = VectorFilter {
            session: scope.session.map(|s| s.0),
            roles: scope.roles.iter().map(|r| r.code() as u8).collect(),
            since: scope.since.map(|t| t.0),
            before: scope.before.map(|t| t.0),
            messages,
        };
        let vectors = loaded
            .vectors
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(vectors.search(&query, k, &filter))
    }
}
