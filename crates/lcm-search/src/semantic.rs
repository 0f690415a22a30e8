//! Semantic search: the embedding model (`lcm-embed`) and the vector index it fills
//! ([`crate::vectors`]), kept behind the store like the rest of the derived index.
//!
//! The model is loaded, and the vector index opened, on first use: a command that never
//! searches by meaning pays nothing for them. [`Semantic::catch_up_until`] embeds the messages
//! from the vector index's watermark on (each message's searchable text, cut into chunks the
//! model reads whole; the first followed by the head of the message before it in its session,
//! [`CONTEXT_TOKENS`]), committing every `embeddings.index_batch` messages; the runtime's
//! indexer runs it in the background after the words index, so an append never waits for a
//! model. A crash loses at most the batch being embedded, which the next catch-up embeds
//! again.
//!
//! Messages above the watermark are not found by meaning until they are embedded; a hybrid
//! search still finds them by their words.
//!
//! **Summaries** are embedded too, into a second vector index (`vectors/summaries/`, keyed by
//! summary id, with its own watermark: summary ids are dense and a summary never changes), after
//! the messages. [`Semantic::search_summaries`] ranks them by meaning: what `lcm_grep` searches
//! with `scope: "summaries"` in the semantic and hybrid modes, and what `lcm_expand_query`
//! reads first.

use std::collections::{HashMap, VecDeque};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard};

use lcm_core::config::EmbeddingsConfig;
use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_embed::{EmbedOptions, Embedder, RerankOptions, Reranker};
use lcm_store::error::{Result, StoreError};
use lcm_store::records::{RecordReader, RecordSource, RecordView, Step};

use crate::grep::Scope;
use crate::lineage;
use crate::vectors::{Opened, VectorEntry, VectorFilter, VectorHit, VectorIndex};

/// Directory name of the vector index inside a data directory (beside `index/`, so a rebuild
/// of the words index keeps the embeddings, which cost far more to make).
pub const VECTORS_DIR: &str = "vectors";

/// Word pieces of the message before it in its session that a message's first chunk is
/// embedded with (after the chunk, so the chunk is never cut for it). What is remembered is
/// often split over two turns: a reply ("We did a contemporary piece, Finding Freedom") means
/// little without the question it answers, and a question names what its answer is about. On
/// the LoCoMo development set this lifts the embeddings' recall@10 from 0.467 to 0.554
/// (docs/PERFORMANCE.md, "Hybrid recall"); a longer context adds nothing there, and every
/// word piece costs embedding time.
pub const CONTEXT_TOKENS: usize = 32;

/// Directory name of the summaries' vector index, inside [`VECTORS_DIR`].
pub const SUMMARIES_DIR: &str = "summaries";

/// Summaries embedded per commit, at most (a summary is longer than most messages).
const SUMMARY_BATCH: u64 = 256;
/// Query embeddings kept (see `Semantic::queries`).
const QUERY_CACHE: usize = 32;

/// The model and the vector indexes, once loaded.
struct Loaded {
    embedder: Embedder,
    /// Chunks of messages, by message id.
    vectors: RwLock<VectorIndex>,
    /// Chunks of summaries, by summary id (`VectorEntry::message` holds the summary id).
    summaries: RwLock<VectorIndex>,
}

impl Loaded {
    /// The messages' and the summaries' vector indexes, read-locked in that order.
    fn read_both(
        &self,
    ) -> (
        RwLockReadGuard<'_, VectorIndex>,
        RwLockReadGuard<'_, VectorIndex>,
    ) {
        fn read(index: &RwLock<VectorIndex>) -> RwLockReadGuard<'_, VectorIndex> {
            index.read().unwrap_or_else(PoisonError::into_inner)
        }
        (read(&self.vectors), read(&self.summaries))
    }
}

/// Semantic search over one data directory (see the module doc).
pub struct Semantic {
    dir: PathBuf,
    config: EmbeddingsConfig,
    writable: bool,
    loaded: OnceLock<std::result::Result<Loaded, String>>,
    /// The cross-encoder of `reranker_dir`, loaded at the first hybrid search that reads it.
    reranker: OnceLock<std::result::Result<Reranker, String>>,
    /// One catch-up at a time.
    catching_up: Mutex<()>,
    /// The embeddings of the latest queries, newest last: the pages of one search (and the
    /// summaries' and messages' sides of one request) embed their query once.
    queries: Mutex<VecDeque<(String, Vec<f32>)>>,
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
            reranker: OnceLock::new(),
            catching_up: Mutex::new(()),
            queries: Mutex::new(VecDeque::new()),
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
            let messages_id = messages_index_id(&embedder);
            let (mut vectors, opened) = VectorIndex::open(
                &self.dir,
                embedder.dimension(),
                &messages_id,
                self.writable,
            )
            .map_err(|e| e.to_string())?;
            if let Opened::Rebuilt(why) = &opened {
                tracing::info!(%why, "the vector index starts empty and is rebuilt from the store");
            }
            let (mut summaries, opened) = VectorIndex::open(
                &self.dir.join(SUMMARIES_DIR),
                embedder.dimension(),
                embedder.model_id(),
                self.writable,
            )
            .map_err(|e| e.to_string())?;
            if let Opened::Rebuilt(why) = &opened {
                tracing::info!(%why, "the summaries' vector index starts empty and is rebuilt from the store");
            }
            vectors.set_lists_from(self.config.lists_from);
            summaries.set_lists_from(self.config.lists_from);
            Ok(Loaded {
                embedder,
                vectors: RwLock::new(vectors),
                summaries: RwLock::new(summaries),
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

    /// Hits of a hybrid search the reranker reads, when one is configured.
    pub fn rerank_depth(&self) -> Option<usize> {
        self.config
            .reranker_dir
            .as_ref()
            .map(|_| self.config.rerank_depth)
    }

    /// The reranker's score of each passage for `query` (see [`Reranker::score`]), loading it
    /// at the first call; an error when none is configured or it cannot be loaded.
    pub fn rerank(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let reranker = self.reranker.get_or_init(|| {
            let dir = self.config.reranker_dir.clone().unwrap_or_default();
            let options = RerankOptions {
                threads: self.config.threads,
                ..RerankOptions::default()
            };
            Reranker::load(&dir, options).map_err(|e| {
                format!(
                    "the reranker of `[embeddings] reranker_dir` ({}) cannot be loaded: {e}",
                    dir.display()
                )
            })
        });
        let reranker = reranker
            .as_ref()
            .map_err(|e| StoreError::InvalidQuery(e.clone()))?;
        reranker.score(query, passages).map_err(model_error)
    }

    /// `f` of the messages' vector index, under its read lock.
    fn read_messages<T>(&self, f: impl FnOnce(&VectorIndex) -> T) -> Result<T> {
        let index = self.loaded()?.vectors.read();
        Ok(f(&index.unwrap_or_else(PoisonError::into_inner)))
    }

    /// `f` of the summaries' vector index, under its read lock.
    fn read_summaries<T>(&self, f: impl FnOnce(&VectorIndex) -> T) -> Result<T> {
        let index = self.loaded()?.summaries.read();
        Ok(f(&index.unwrap_or_else(PoisonError::into_inner)))
    }

    /// Every message below this id is embedded.
    pub fn watermark(&self) -> Result<MessageId> {
        self.read_messages(|v| MessageId(v.watermark()))
    }

    /// Every summary below this id is embedded.
    pub fn summary_watermark(&self) -> Result<SummaryId> {
        self.read_summaries(|v| SummaryId(v.watermark()))
    }

    /// Messages of `store` not embedded yet (the catch-up has not reached them): search by
    /// meaning cannot find them until it does.
    pub fn messages_not_embedded(&self, store: &impl RecordSource) -> Result<u64> {
        Ok(store
            .next_message_id()?
            .0
            .saturating_sub(self.watermark()?.0))
    }

    /// Summaries of `store` not embedded yet (see [`Self::messages_not_embedded`]).
    pub fn summaries_not_embedded(&self, store: &impl RecordSource) -> Result<u64> {
        Ok(store
            .next_summary_id()?
            .0
            .saturating_sub(self.summary_watermark()?.0))
    }

    /// Why the vectors may stand for other texts than `store`'s, if they may: they go past
    /// its end (messages or summaries; the store was restored from an older copy), or the
    /// last message or summary they hold is not the store's ([`crate::lineage`]; the store
    /// file was replaced). `None` when they are the store's.
    pub fn stale_for(&self, store: &impl RecordSource) -> Result<Option<&'static str>> {
        let (messages, summaries) = self.loaded()?.read_both();
        if messages.watermark() > store.next_message_id()?.0
            || summaries.watermark() > store.next_summary_id()?.0
        {
            return Ok(Some(
                "the vector index holds entries past the store's end (was the store restored \
                 from an older copy?)",
            ));
        }
        let reader = store.reader()?;
        let same = messages_are_the_stores(&messages, &reader)?
            && summaries_are_the_stores(&summaries, &reader)?;
        Ok((!same).then_some(
            "the vector index was built from another store (was the store file replaced?)",
        ))
    }

    /// [`StoreError::InvalidQuery`] saying why, when the vectors are [`Self::stale_for`]
    /// `store`: a search by meaning would find other texts than the store's.
    pub fn refuse_if_stale_for(&self, store: &impl RecordSource) -> Result<()> {
        if let Some(why) = self.stale_for(store)? {
            return Err(StoreError::InvalidQuery(format!(
                "{why}: search by meaning waits until the store is embedded again, which the \
                 next catch-up does (`lcm serve`, an import, or `lcm reindex`)"
            )));
        }
        Ok(())
    }

    /// Whether messages or summaries of `store` are not embedded yet.
    pub fn is_behind(&self, store: &impl RecordSource) -> Result<bool> {
        Ok(self.watermark()? < store.next_message_id()?
            || self.summary_watermark()? < store.next_summary_id()?)
    }

    /// Embedded chunks of summaries.
    pub fn summary_chunk_count(&self) -> Result<usize> {
        self.read_summaries(VectorIndex::len)
    }

    /// How many lists the messages' vector index searches through (`None` below
    /// `embeddings.lists_from` chunks, before its catch-up trained them, or read-only).
    pub fn list_count(&self) -> Result<Option<usize>> {
        self.read_messages(VectorIndex::list_count)
    }

    /// Embedded chunks of messages (a message has one or more).
    pub fn chunk_count(&self) -> Result<usize> {
        self.read_messages(VectorIndex::len)
    }

    /// Embeds every message from the watermark to the store's end and every summary from the
    /// summaries' watermark on, in turns: a commit of up to `index_batch` messages, then one of
    /// up to 256 summaries, and so on (a long backlog of messages, such as an import or a load
    /// faster than the model, does not keep the summaries, which contexts show, from being
    /// found by meaning until it is through). `progress(done, total)` after each commit
    /// (messages and summaries counted together); stops after a turn when `stop()` says so.
    /// Returns the messages and summaries embedded.
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
        if let Some(why) = self.stale_for(store)? {
            // The vectors stand for other texts than the store's: embedded again.
            tracing::warn!("{why}; embedding everything again");
            clear(loaded)?;
        }
        // Lists due before any commit (an index opened without them).
        for index in [&loaded.vectors, &loaded.summaries] {
            retrain_lists_if_due(index)?;
        }
        let start = self.watermark()?.0;
        let end = store.next_message_id()?.0;
        let summaries_start = self.summary_watermark()?.0;
        let summaries_end = store.next_summary_id()?.0;
        let total = end.saturating_sub(start) + summaries_end.saturating_sub(summaries_start);
        let mut done = 0u64;
        let (mut from, mut summaries_from) = (start, summaries_start);
        let summary_batch = (self.config.index_batch as u64).clamp(1, SUMMARY_BATCH);
        while from < end || summaries_from < summaries_end {
            if from < end {
                let to = (from + self.config.index_batch as u64).min(end);
                self.embed_range(loaded, store, from, to)?;
                done += to - from;
                from = to;
                progress(done, total);
            }
            if summaries_from < summaries_end {
                let to = (summaries_from + summary_batch).min(summaries_end);
                self.embed_summaries(loaded, store, summaries_from, to)?;
                done += to - summaries_from;
                summaries_from = to;
                progress(done, total);
            }
            if stop() {
                break;
            }
        }
        Ok(done)
    }

    /// Embeds and commits the summaries `from..to`.
    fn embed_summaries(
        &self,
        loaded: &Loaded,
        store: &impl RecordSource,
        from: u64,
        to: u64,
    ) -> Result<()> {
        // The read snapshot ends before the model runs: a snapshot held for the seconds a batch
        // takes keeps redb from reusing the pages the appends meanwhile free, and the store
        // file grows (the soak with embeddings: 241 MB against 89 MB).
        let summaries = {
            let reader = store.reader()?;
            let mut summaries = Vec::new();
            for id in from..to {
                match reader.summary(SummaryId(id)) {
                    Ok(s) => summaries.push(s),
                    // Ids are dense; a gap (damage the integrity check reports) is not embedded.
                    Err(StoreError::SummaryNotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            summaries
        };
        let mut texts: Vec<&str> = Vec::new();
        let mut entries: Vec<VectorEntry> = Vec::new();
        for s in &summaries {
            let chunks = loaded.embedder.chunks(&s.content).map_err(model_error)?;
            for chunk in chunks {
                entries.push(VectorEntry {
                    message: s.id.0,
                    session: s.session.0,
                    created_at: s.earliest_at.0,
                    role: 0,
                    chunk: (chunk.start as u32, chunk.end as u32),
                });
                texts.push(&s.content[chunk]);
            }
        }
        let last = summaries
            .last()
            .filter(|s| s.id.0 + 1 == to)
            .map(lineage::summary_fingerprint);
        embed_into(
            &loaded.embedder,
            &loaded.summaries,
            &texts,
            entries,
            to,
            last,
        )
    }

    /// Embeds and commits the messages `from..to`: each chunk of a message's text, the first
    /// followed by the head of the message before it in its session (see
    /// [`CONTEXT_TOKENS`]).
    fn embed_range(
        &self,
        loaded: &Loaded,
        store: &impl RecordSource,
        from: u64,
        to: u64,
    ) -> Result<()> {
        let embedder = &loaded.embedder;
        let mut texts: Vec<String> = Vec::new();
        let mut entries: Vec<VectorEntry> = Vec::new();
        // The head of the last message of each session met in this range, by its seq: ids grow
        // with the seq within a session, so a message's predecessor, when in the range, was
        // met just before it in that session.
        let mut last_head: HashMap<SessionId, (u64, String)> = HashMap::new();
        let mut last = None;
        let reader = store.reader()?;
        reader.range_records(MessageId(from)..MessageId(to), |id, bytes| {
            let view = RecordView::read(bytes)?;
            if id.0 + 1 == to {
                last = Some(lineage::message_fingerprint(&view)?);
            }
            let (session, seq) = (view.session(), view.seq());
            let text = view.text()?;
            let context = match (seq.checked_sub(1), last_head.remove(&session)) {
                (Some(before), Some((at, head))) if at == before => head,
                (Some(before), _) => previous_head(&reader, embedder, session, before, id)?,
                (None, _) => String::new(),
            };
            let chunks = embedder.chunks(text).map_err(model_error)?;
            for (i, chunk) in chunks.into_iter().enumerate() {
                entries.push(VectorEntry {
                    message: id.0,
                    session: session.0,
                    created_at: view.created_at().0,
                    role: view.role().code() as u8,
                    chunk: (chunk.start as u32, chunk.end as u32),
                });
                texts.push(if i == 0 {
                    first_chunk_text(&text[chunk], &context)
                } else {
                    text[chunk].to_string()
                });
            }
            last_head.insert(session, (seq, context_head(embedder, text)?));
            Ok(ControlFlow::Continue(()))
        })?;
        // The read snapshot ends before the model runs (see `embed_summaries`).
        drop(reader);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        embed_into(embedder, &loaded.vectors, &refs, entries, to, last)
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
            // Not while a catch-up is between its watermark and its commit.
            let _one = self
                .catching_up
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            clear(loaded)?;
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
        let query = self.embed_query(loaded, query)?;
        let filter = VectorFilter {
            session: scope.session.map(|s| s.0),
            roles: scope.roles.iter().map(|r| r.code() as u8).collect(),
            since: scope.since.map(|t| t.0),
            before: scope.before.map(|t| t.0),
            messages,
        };
        self.read_messages(|v| v.search(&query, k, &filter))
    }

    /// The `k` embedded summaries nearest `query` in meaning, best first (by their best
    /// chunk; [`VectorHit::message`] is the summary id), among those of `session` (all when
    /// `None`) that `summaries` says yes to, applied before ranking.
    pub fn search_summaries(
        &self,
        query: &str,
        k: usize,
        session: Option<lcm_core::ids::SessionId>,
        summaries: Option<&(dyn Fn(u64) -> bool + Sync)>,
    ) -> Result<Vec<VectorHit>> {
        let loaded = self.loaded()?;
        let query = self.embed_query(loaded, query)?;
        let filter = VectorFilter {
            session: session.map(|s| s.0),
            messages: summaries,
            ..VectorFilter::default()
        };
        self.read_summaries(|v| v.search(&query, k, &filter))
    }
}

/// What [`Semantic::check`] found: the vector indexes against the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct VectorCheck {
    /// The model the vectors are of.
    pub model_id: String,
    /// Messages below this id are embedded.
    pub message_watermark: u64,
    pub message_chunks: u64,
    /// Summaries below this id are embedded.
    pub summary_watermark: u64,
    pub summary_chunks: u64,
    /// What is wrong, one sentence each; `lcm doctor --repair` rebuilds the vectors.
    pub problems: Vec<String>,
}

impl VectorCheck {
    /// Whether nothing is wrong.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Walks `entries` (sorted by id) beside the ids `0..watermark` of the store, in order: each
/// id with text must have a chunk, each chunk must lie in its text, no entry may be left over.
struct Coverage<'a> {
    what: &'static str,
    entries: &'a [VectorEntry],
    at: usize,
    missing: u64,
    first_missing: Option<u64>,
    bad_chunks: u64,
}

impl<'a> Coverage<'a> {
    fn new(what: &'static str, entries: &'a [VectorEntry]) -> Self {
        Coverage {
            what,
            entries,
            at: 0,
            missing: 0,
            first_missing: None,
            bad_chunks: 0,
        }
    }

    fn visit(&mut self, id: u64, text: &str) {
        let start = self.at;
        while let Some(e) = self.entries.get(self.at).filter(|e| e.message == id) {
            let (from, to) = (e.chunk.0 as usize, e.chunk.1 as usize);
            if from >= to || to > text.len() {
                self.bad_chunks += 1;
            }
            self.at += 1;
        }
        if self.at == start && !text.trim().is_empty() {
            self.missing += 1;
            self.first_missing.get_or_insert(id);
        }
    }

    fn finish(self, problems: &mut Vec<String>) {
        let what = self.what;
        if self.missing > 0 {
            problems.push(format!(
                "{} {what}s below the watermark have no vector (the first: {})",
                self.missing,
                self.first_missing.unwrap_or_default()
            ));
        }
        if self.bad_chunks > 0 {
            problems.push(format!(
                "{} chunks lie outside their {what}'s text",
                self.bad_chunks
            ));
        }
        let stray = self.entries.len() - self.at;
        if stray > 0 {
            problems.push(format!(
                "{stray} vectors stand for no {what} below the watermark (or out of order)"
            ));
        }
    }
}

impl Semantic {
    /// The query's embedding, from the cache of recent queries when it is there.
    fn embed_query(&self, loaded: &Loaded, query: &str) -> Result<Vec<f32>> {
        let cached = |queries: &VecDeque<(String, Vec<f32>)>| {
            queries
                .iter()
                .find(|(q, _)| q == query)
                .map(|(_, v)| v.clone())
        };
        if let Some(v) = cached(&self.queries.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(v);
        }
        let vector = loaded.embedder.embed_query(query).map_err(model_error)?;
        let mut queries = self.queries.lock().unwrap_or_else(PoisonError::into_inner);
        if queries.len() == QUERY_CACHE {
            queries.pop_front();
        }
        queries.push_back((query.to_string(), vector.clone()));
        Ok(vector)
    }

    /// Checks the vector indexes against `store`: watermarks within the store, every message
    /// and summary with text below its watermark embedded, no vector for anything else, every
    /// chunk inside its text. A model that cannot be loaded is an error. Waits for a running
    /// catch-up (one at a time).
    pub fn check(&self, store: &impl RecordSource) -> Result<VectorCheck> {
        let loaded = self.loaded()?;
        let _one = self
            .catching_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let next_message = store.next_message_id()?.0;
        let next_summary = store.next_summary_id()?.0;
        let (vectors, summaries) = loaded.read_both();
        let mut report = VectorCheck {
            model_id: vectors.model_id().to_string(),
            message_watermark: vectors.watermark(),
            message_chunks: vectors.len() as u64,
            summary_watermark: summaries.watermark(),
            summary_chunks: summaries.len() as u64,
            problems: Vec::new(),
        };
        let reader = store.reader()?;
        if vectors.watermark() > next_message {
            report.problems.push(format!(
                "the message vectors' watermark {} is past the next message id {next_message}",
                vectors.watermark()
            ));
        } else {
            let mut coverage = Coverage::new("message", vectors.entries());
            reader.for_each_message(MessageId(0)..MessageId(vectors.watermark()), |m| {
                coverage.visit(m.id.0, &m.search_text());
                ControlFlow::Continue(())
            })?;
            coverage.finish(&mut report.problems);
        }
        if summaries.watermark() > next_summary {
            report.problems.push(format!(
                "the summary vectors' watermark {} is past the next summary id {next_summary}",
                summaries.watermark()
            ));
        } else {
            let mut coverage = Coverage::new("summary", summaries.entries());
            for id in 0..summaries.watermark() {
                match reader.summary(SummaryId(id)) {
                    Ok(s) => coverage.visit(id, &s.content),
                    Err(StoreError::SummaryNotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            coverage.finish(&mut report.problems);
        }
        // Vectors of another store's texts under the same ids ([`lineage`]).
        if !messages_are_the_stores(&vectors, &reader)? {
            report.problems.push(format!(
                "the message vectors were made from another store: the last one embedded (id {}) \
                 is not the store's message",
                vectors.watermark() - 1
            ));
        }
        if !summaries_are_the_stores(&summaries, &reader)? {
            report.problems.push(format!(
                "the summary vectors were made from another store: the last one embedded (id {}) \
                 is not the store's summary",
                summaries.watermark() - 1
            ));
        }
        Ok(report)
    }
}

/// Whether the messages' vector `index` ends with the store's message ([`lineage`]).
fn messages_are_the_stores<R: RecordReader>(index: &VectorIndex, reader: &R) -> Result<bool> {
    lineage::same_lineage(index.watermark(), index.last(), |id| {
        lineage::stored_message_fingerprint(reader, MessageId(id))
    })
}

/// Whether the summaries' vector `index` ends with the store's summary ([`lineage`]).
fn summaries_are_the_stores<R: RecordReader>(index: &VectorIndex, reader: &R) -> Result<bool> {
    lineage::same_lineage(index.watermark(), index.last(), |id| {
        lineage::stored_summary_fingerprint(reader, SummaryId(id))
    })
}

/// The model id the messages' vector index is built under: the model's, and how a message is
/// embedded (with the head of the one before it), so that an index of messages embedded
/// another way (before the context existed, say) is rebuilt.
pub fn messages_index_id(embedder: &Embedder) -> String {
    format!(
        "{}; messages with {CONTEXT_TOKENS} word pieces of the previous",
        embedder.model_id()
    )
}

/// What the model reads for a message's first chunk: the chunk, then on a line of its own
/// the head of the message before it in its session (`context`, empty for a session's first).
pub fn first_chunk_text(chunk: &str, context: &str) -> String {
    if context.is_empty() {
        chunk.to_string()
    } else {
        format!("{chunk}\n{context}")
    }
}

/// The head ([`CONTEXT_TOKENS`] word pieces) of the message at `seq` in `session`, among
/// the messages below `below`; empty when there is none.
fn previous_head<R: RecordReader>(
    reader: &R,
    embedder: &Embedder,
    session: SessionId,
    seq: u64,
    below: MessageId,
) -> Result<String> {
    let mut head = String::new();
    reader.session_records_in_rows(session, seq..seq + 1, MessageId(0)..below, |row| {
        head = context_head(embedder, RecordView::read(row.record)?.text()?)?;
        Ok(Step::Stop)
    })?;
    Ok(head)
}

/// The head of `text` the next message of its session is embedded with ([`CONTEXT_TOKENS`]
/// word pieces).
fn context_head(embedder: &Embedder, text: &str) -> Result<String> {
    Ok(embedder
        .head(text, CONTEXT_TOKENS)
        .map_err(model_error)?
        .to_string())
}

/// Drops every vector of messages and of summaries (the caller holds `catching_up`).
fn clear(loaded: &Loaded) -> Result<()> {
    for index in [&loaded.vectors, &loaded.summaries] {
        index
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear()?;
    }
    Ok(())
}

/// A model's failure, as the store's error type the catch-up and searches return.
fn model_error(e: lcm_embed::EmbedError) -> StoreError {
    StoreError::InvalidQuery(e.to_string())
}

/// Embeds `texts` (one per entry), adds them to `index` and commits it up to `watermark`,
/// whose last message or summary has the fingerprint `last`.
fn embed_into(
    embedder: &Embedder,
    index: &RwLock<VectorIndex>,
    texts: &[&str],
    entries: Vec<VectorEntry>,
    watermark: u64,
    last: Option<u64>,
) -> Result<()> {
    let vectors = embedder.embed_documents(texts).map_err(model_error)?;
    {
        let mut index = index.write().unwrap_or_else(PoisonError::into_inner);
        for (entry, vector) in entries.into_iter().zip(vectors) {
            index.push(entry, vector)?;
        }
        index.commit(watermark, last)?;
    }
    retrain_lists_if_due(index)
}

/// Trains `index`'s lists when they are due ([`VectorIndex::lists_due`]: none yet at
/// [`crate::vector_lists::LISTS_FROM`] entries, or outgrown): under the read lock, so searches
/// go on; commits wait, and only the catch-up that called this commits.
fn retrain_lists_if_due(index: &RwLock<VectorIndex>) -> Result<()> {
    let trained = {
        let index = index.read().unwrap_or_else(PoisonError::into_inner);
        if !index.lists_due() {
            return Ok(());
        }
        tracing::info!(
            entries = index.len(),
            lists = index.list_count(),
            "training the vector index's lists (searches go on meanwhile)"
        );
        index.train_lists()
    };
    index
        .write()
        .unwrap_or_else(PoisonError::into_inner)
        .install_lists(trained)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::VectorFilter;
    use lcm_core::rng::SplitMix64;

    fn unit(rng: &mut SplitMix64) -> Vec<f32> {
        let v: Vec<f32> = (0..128).map(|_| rng.uniform() as f32 - 0.5).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / norm).collect()
    }

    #[test]
    fn the_configured_default_is_the_index_s_own() {
        assert_eq!(
            EmbeddingsConfig::default().lists_from,
            crate::vector_lists::LISTS_FROM
        );
    }

    /// What a catch-up does after each commit: lists once the index reaches `lists_from`
    /// entries, then nothing until it has grown fourfold since, then new lists (as many as its
    /// size calls for), once.
    #[test]
    fn a_catch_up_trains_lists_at_the_threshold_and_again_at_four_times_it() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = SplitMix64::new(3);
        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        index.set_lists_from(300);
        let index = RwLock::new(index);
        let mut vectors = Vec::new();
        let mut commit = |n: usize| {
            let mut index = index.write().unwrap();
            for _ in 0..n {
                let v = unit(&mut rng);
                let entry = VectorEntry {
                    message: vectors.len() as u64,
                    session: 0,
                    created_at: 0,
                    role: 0,
                    chunk: (0, 1),
                };
                index.push(entry, v.clone()).unwrap();
                vectors.push(v);
            }
            index.commit(vectors.len() as u64, None).unwrap();
        };
        let lists = || index.read().unwrap().list_count();
        commit(299);
        retrain_lists_if_due(&index).unwrap();
        assert_eq!(lists(), None, "299 entries");
        commit(1);
        assert_eq!(lists(), None, "a commit never trains");
        retrain_lists_if_due(&index).unwrap();
        assert_eq!(lists(), Some(17));
        commit(800);
        retrain_lists_if_due(&index).unwrap();
        assert_eq!(lists(), Some(17), "1,100 entries call for 33 lists");
        commit(200);
        retrain_lists_if_due(&index).unwrap();
        assert_eq!(lists(), Some(36), "1,300 entries call for 36");
        retrain_lists_if_due(&index).unwrap();
        assert_eq!(lists(), Some(36));
        let index = index.read().unwrap();
        let hits = index.search(&vectors[1_250], 1, &VectorFilter::default());
        assert_eq!(hits[0].message, 1_250);
    }
}
