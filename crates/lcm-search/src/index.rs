//! The search index: derived from the store, rebuildable from it at any time, holding no copy
//! of any text. Two parts, in one directory:
//! - a tantivy index (no field stored), per message: `msg_id`, `session`, `role`, `created_at`
//!   (numbers, to filter by scope and to map hits back to the store; `msg_id` and `created_at`
//!   as fast fields only, not terms) and `words` (the text
//!   tokenised into stemmed, lowercased words, for ranked BM25 full-text search);
//! - the trigram index (`trigram_index.rs`, in `trigrams/`): which messages hold each
//!   lowercased character trigram, to narrow regex search to the messages that can match (see
//!   [`lcm_regex::trigram`]).
//!
//! **Watermark.** Every message with an id below the watermark is indexed in both, none above
//! it. The index writes the watermark as the payload of the tantivy commit that adds the
//! documents, after the trigram segments of the same messages are written and synced; at open,
//! trigram segments past the watermark are deleted, so the two can never disagree. The copy in
//! redb (`meta.index_watermark`) is updated after and is what integrity checks compare against.
//! A crash between the two is repaired at the next open. Messages at or above the watermark are
//! found by grep through a scan of the store.

use std::ops::{ControlFlow, Range};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use lcm_core::config::SearchConfig;
use lcm_core::ids::MessageId;
use tantivy::query::{BooleanQuery, ConstScoreQuery, Occur, Query, RangeQuery, TermQuery};
use tantivy::schema::{
    Field, INDEXED, IndexRecordOption, NumericOptions, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::TextAnalyzer;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, Searcher, TantivyDocument, Term};

use crate::grep::Scope;
use crate::trigram_index::{Segment, TrigramBuilder, TrigramIndex};
use lcm_regex::trigram::TrigramQuery;
use lcm_store::error::{Result, StoreError};
use lcm_store::record::RecordView;
use lcm_store::records::{RecordReader, RecordSource};

const WORDS_TOKENIZER: &str = "en_stem";
/// Bumped when the schema or a tokenizer changes: an index of another version is rebuilt.
/// 2: trigrams starting or ending with ASCII whitespace are no longer indexed; no fieldnorms
/// for trigrams. 3: trigrams in their own segments ([`crate::trigram_index`]), not in tantivy.
/// 4: `msg_id` and `created_at` are fast fields only (an index of format 3 has another schema,
/// so it is rebuilt by the schema check as well).
const INDEX_FORMAT: u32 = 4;
/// The trigram index's directory, inside the index directory.
const TRIGRAM_DIR: &str = "trigrams";

#[derive(Debug, Clone, Copy)]
pub(crate) struct Fields {
    pub msg_id: Field,
    pub session: Field,
    pub role: Field,
    pub created_at: Field,
    pub words: Field,
}

fn schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    // `msg_id` (read back from a hit) and `created_at` (a time range is a fast-field range
    // query) are fast fields only: in the inverted index both would add a term, nearly unique,
    // for every document, which no query reads.
    let fast = NumericOptions::default().set_fast();
    let msg_id = builder.add_u64_field("msg_id", fast.clone());
    let session = builder.add_u64_field("session", fast.clone().set_indexed());
    let role = builder.add_u64_field("role", INDEXED);
    let created_at = builder.add_i64_field("created_at", fast);
    let words = builder.add_text_field(
        "words",
        TextOptions::default().set_indexing_options(
            TextFieldIndexing::default()
                .set_tokenizer(WORDS_TOKENIZER)
                .set_index_option(IndexRecordOption::WithFreqsAndPositions),
        ),
    );
    (
        builder.build(),
        Fields {
            msg_id,
            session,
            role,
            created_at,
            words,
        },
    )
}

fn register_tokenizers(index: &Index) {
    // tantivy's own `en_stem` terms, with stems cached (the schema names `en_stem`).
    index
        .tokenizers()
        .register(WORDS_TOKENIZER, crate::word_tokens::words_analyzer());
}

/// Whether every part of every segment a search reads opens: the reader opens a segment's
/// files whole but each field's terms, postings, positions, norms and fast-field columns only
/// when a search first needs them, so a torn file of the newest commit (a power loss) would
/// otherwise be found by a search, not by the open that rebuilds the index.
fn segments_readable(reader: &IndexReader) -> bool {
    let (_, fields) = schema();
    reader.searcher().segment_readers().iter().all(|segment| {
        [fields.session, fields.role, fields.words]
            .into_iter()
            .all(|field| segment.inverted_index(field).is_ok())
            && segment.get_fieldnorms_reader(fields.words).is_ok()
            && segment.fast_fields().u64("msg_id").is_ok()
            && segment.fast_fields().u64("session").is_ok()
            && segment.fast_fields().i64("created_at").is_ok()
    })
}

/// The payload written with every commit: format version, watermark and the fingerprint of
/// the last message below it ([`crate::lineage`]), when known.
fn payload(watermark: u64, last: Option<u64>) -> String {
    match last {
        Some(last) => format!("lcm-index v{INDEX_FORMAT} watermark {watermark} last {last:016x}"),
        None => format!("lcm-index v{INDEX_FORMAT} watermark {watermark}"),
    }
}

/// The watermark and last message's fingerprint of a payload of this format (an index
/// committed before fingerprints has none).
fn parse_payload(payload: Option<&str>) -> Option<(u64, Option<u64>)> {
    let rest = payload?.strip_prefix(&format!("lcm-index v{INDEX_FORMAT} watermark "))?;
    match rest.split_once(" last ") {
        None => Some((rest.parse().ok()?, None)),
        Some((watermark, last)) => Some((
            watermark.parse().ok()?,
            Some(u64::from_str_radix(last, 16).ok()?),
        )),
    }
}

/// How segments are merged: as tantivy's log merge policy, but a size level is merged once it
/// holds four segments (tantivy waits for eight). Every segment costs a search and an open (six
/// files mapped, footers checked: about 0.1 ms each), and a catch-up commits a segment per
/// indexing thread. Merging at two segments kept the index at one or two segments but made
/// catching up with 300,000 messages 40% slower (the merges compete with indexing); at four it
/// indexes as fast as tantivy's default and a 100,000-message index ends as one segment instead
/// of four. A level spans sizes within 2.8x of its largest segment (tantivy: 1.7x): the indexing
/// threads of one commit take uneven shares of the documents (34k, 29k, 21k and 16k of 100,000
/// in two commits), which split four similar segments over two levels and left them unmerged.
fn merge_policy() -> tantivy::indexer::LogMergePolicy {
    let mut policy = tantivy::indexer::LogMergePolicy::default();
    policy.set_min_num_segments(4);
    policy.set_level_log_size(1.5);
    policy
}

/// tantivy's errors as the store's: [`StoreError::Index`], saying what the index was doing and
/// keeping tantivy's error as its source. (The store names no index engine, so it has no `From`
/// conversion from tantivy's errors, and the orphan rule forbids one here.)
trait During<T> {
    /// This result, its error (if any) a [`StoreError::Index`] that failed while doing `what`
    /// ("committing documents").
    fn during(self, what: &str) -> Result<T>;
}

impl<T, E: Into<tantivy::TantivyError>> During<T> for std::result::Result<T, E> {
    fn during(self, what: &str) -> Result<T> {
        self.map_err(|e| StoreError::index(what, e.into()))
    }
}

/// What the writer's lock guards: tantivy's writer and the trigram segments being built.
#[derive(Default)]
struct Writer {
    /// Opened on first use, closed by `finish_merges`.
    tantivy: Option<IndexWriter>,
    /// Trigrams of the messages fed since the last segment.
    trigrams: TrigramBuilder,
    /// Trigram segments written for messages fed and not yet committed.
    pending: Vec<Arc<Segment>>,
    /// The last message fed and its fingerprint, for the payload of the commit that covers it.
    last_fed: Option<(u64, u64)>,
}

/// An index found in its directory, usable ([`SearchIndex::open_existing`]).
struct Existing {
    index: Index,
    reader: IndexReader,
    trigrams: TrigramIndex,
    watermark: u64,
    /// The fingerprint of the last message below the watermark, from the payload.
    last: Option<u64>,
}

/// One page of ranked full-text hits ([`SearchIndex::full_text`]).
pub(crate) struct RankedPage {
    /// (message, score), best first.
    pub hits: Vec<(MessageId, f32)>,
    /// Whether more ranked hits follow.
    pub more: bool,
    /// The ranking covers the messages below this; the rest are for the caller to scan.
    pub indexed: MessageId,
}

/// A tantivy searcher and the watermark of the commit it shows, replaced together: a full-text
/// search takes both at once, so it ranks exactly the messages below that watermark and scans
/// the rest. (Read apart, a commit between the reads would leave its messages to neither.)
#[derive(Clone)]
struct SearchView {
    searcher: Searcher,
    watermark: u64,
}

/// The derived full-text and trigram index.
pub struct SearchIndex {
    index: Index,
    reader: IndexReader,
    /// What full-text searches see; follows each commit.
    view: RwLock<SearchView>,
    trigrams: TrigramIndex,
    writer: Mutex<Writer>,
    fields: Fields,
    dir: Option<PathBuf>,
    config: SearchConfig,
    /// Messages below this are in the committed index.
    watermark: AtomicU64,
    /// Messages below this were handed to the writer ([`SearchIndex::feed`]), committed or not;
    /// never below the watermark. Only changed with the writer's lock held.
    fed: AtomicU64,
    /// The watermark last recorded in the store's copy (`meta.index_watermark`): behind the
    /// watermark when recording failed (a full disk), and then recorded again by the next
    /// catch-up even when it has nothing to index. Only changed with the writer's lock held.
    recorded: AtomicU64,
    /// Search by meaning, when an embedding model is configured.
    semantic: Option<crate::semantic::Semantic>,
}

impl std::fmt::Debug for SearchIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SearchIndex")
            .field("dir", &self.dir)
            .field("watermark", &self.watermark())
            .finish()
    }
}

impl SearchIndex {
    /// Opens the index in `dir`, creating it if absent. An index that cannot be opened, was
    /// written by another index format, or whose trigram segments do not cover its watermark is
    /// discarded and starts empty (it is derived data); the next [`catch_up`](Self::catch_up)
    /// rebuilds it.
    pub fn open(
        dir: impl AsRef<Path>,
        store: &impl RecordSource,
        config: &SearchConfig,
    ) -> Result<SearchIndex> {
        let dir = dir.as_ref();
        let end = store.next_message_id()?.0;
        let existing = match Self::open_existing(dir, !store.is_read_only())? {
            Some(found) if found.watermark > end => {
                // An index past the store's end holds messages the store no longer has (the
                // store was restored from an older copy), under ids it gives to new messages.
                tracing::warn!(
                    dir = %dir.display(),
                    index_watermark = found.watermark,
                    store_end = end,
                    "the search index holds messages past the store's end (was the store restored from an older copy?); rebuilding it"
                );
                None
            }
            Some(found) => {
                let reader = store.reader()?;
                let same = crate::lineage::same_lineage(found.watermark, found.last, |id| {
                    crate::lineage::stored_message_fingerprint(&reader, MessageId(id))
                })?;
                if !same {
                    tracing::warn!(
                        dir = %dir.display(),
                        index_watermark = found.watermark,
                        "the search index was built from another store (was the store file replaced?); rebuilding it"
                    );
                }
                same.then_some(found)
            }
            None => None,
        };
        let (index, reader, trigrams, watermark) = match existing {
            Some(found) => (
                found.index,
                Some(found.reader),
                found.trigrams,
                found.watermark,
            ),
            // A read-only store leaves the directory alone: an empty index in memory has
            // watermark 0, so grep scans the store, complete but slower.
            None if store.is_read_only() => return Self::open_in_ram(store, config),
            None => {
                if dir.exists() {
                    tracing::warn!(dir = %dir.display(), "search index unusable; rebuilding it from the store");
                    std::fs::remove_dir_all(dir).map_err(|source| StoreError::io(dir, source))?;
                }
                std::fs::create_dir_all(dir).map_err(|source| StoreError::io(dir, source))?;
                let index = Index::create_in_dir(dir, schema().0).during("creating the index")?;
                (
                    index,
                    None,
                    TrigramIndex::create(&dir.join(TRIGRAM_DIR))?,
                    0,
                )
            }
        };
        Self::init(
            index,
            reader,
            trigrams,
            watermark,
            Some(dir.to_path_buf()),
            store,
            config,
        )
    }

    /// The tantivy index (with the reader that checked it), the trigram segments and the
    /// watermark in `dir`, if both parts are usable and agree.
    fn open_existing(dir: &Path, writable: bool) -> Result<Option<Existing>> {
        if !dir.join("meta.json").exists() {
            return Ok(None);
        }
        let Ok(index) = Index::open_in_dir(dir) else {
            return Ok(None);
        };
        let Ok(metas) = index.load_metas() else {
            return Ok(None);
        };
        // An empty index has no payload yet; anything else must be ours.
        let (watermark, last) = match metas.payload.as_deref() {
            None => (0, None),
            payload => match parse_payload(payload) {
                Some(found) => found,
                None => return Ok(None),
            },
        };
        if index.schema() != schema().0 {
            return Ok(None);
        }
        // A segment file the last commit names but that is missing or torn (its data never
        // reached the disk, or was damaged since) fails here, as the reader opens every
        // segment: the index is unusable and rebuilt, the data directory still opens.
        let readable: tantivy::Result<IndexReader> = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into();
        let Ok(reader) = readable else {
            return Ok(None);
        };
        if !segments_readable(&reader) {
            return Ok(None);
        }
        let trigram_dir = dir.join(TRIGRAM_DIR);
        let trigrams = if watermark == 0 && !trigram_dir.exists() && writable {
            TrigramIndex::create(&trigram_dir)?
        } else {
            match TrigramIndex::open(&trigram_dir, watermark, writable)? {
                Some(trigrams) => trigrams,
                None => return Ok(None),
            }
        };
        Ok(Some(Existing {
            index,
            reader,
            trigrams,
            watermark,
            last,
        }))
    }

    /// An index in memory (tests and benchmarks).
    pub fn open_in_ram(store: &impl RecordSource, config: &SearchConfig) -> Result<SearchIndex> {
        let (schema, _) = schema();
        Self::init(
            Index::create_in_ram(schema),
            None,
            TrigramIndex::in_memory(),
            0,
            None,
            store,
            config,
        )
    }

    /// `watermark` is what the payload of the index's last commit says (0 for a new index);
    /// `reader`, one already opened on `index` (else it is opened here).
    fn init(
        index: Index,
        reader: Option<IndexReader>,
        trigrams: TrigramIndex,
        watermark: u64,
        dir: Option<PathBuf>,
        store: &impl RecordSource,
        config: &SearchConfig,
    ) -> Result<SearchIndex> {
        register_tokenizers(&index);
        let (_, fields) = schema();
        let reader = match reader {
            Some(reader) => reader,
            None => index
                .reader_builder()
                .reload_policy(ReloadPolicy::Manual)
                .try_into()
                .during("opening the index reader")?,
        };
        // The index's own payload is the truth about what it holds; the store's copy follows
        // (at the next writable open, for a read-only store).
        if !store.is_read_only() && store.index_watermark()?.0 != watermark {
            store.set_index_watermark(MessageId(watermark))?;
        }
        let view = RwLock::new(SearchView {
            searcher: reader.searcher(),
            watermark,
        });
        Ok(SearchIndex {
            index,
            reader,
            view,
            trigrams,
            writer: Mutex::new(Writer::default()),
            fields,
            dir,
            config: config.clone(),
            watermark: AtomicU64::new(watermark),
            fed: AtomicU64::new(watermark),
            recorded: AtomicU64::new(watermark),
            semantic: None,
        })
    }

    /// Messages with ids below this are indexed.
    pub fn watermark(&self) -> MessageId {
        MessageId(self.watermark.load(Ordering::Acquire))
    }

    /// The writer's state (tantivy's writer, opened on first use; the trigram builder).
    fn lock_writer(&self) -> Result<std::sync::MutexGuard<'_, Writer>> {
        self.writer
            .lock()
            .map_err(|_| StoreError::InvalidQuery("index writer poisoned by a panic".into()))
    }

    /// The tantivy writer in `slot`, opened with the configured memory budget if there is none.
    fn open_writer<'g>(&self, slot: &'g mut Option<IndexWriter>) -> Result<&'g mut IndexWriter> {
        let writer = match slot.take() {
            Some(writer) => writer,
            None => {
                let writer: IndexWriter = self
                    .index
                    .writer(self.config.index_writer_memory_mb * 1024 * 1024)
                    .during("opening the index writer")?;
                writer.set_merge_policy(Box::new(merge_policy()));
                writer
            }
        };
        Ok(slot.insert(writer))
    }

    /// Hands the messages appended since the last feed (or commit) to the index writer, whose
    /// threads tokenise them in the background, without committing: the next
    /// [`catch_up`](Self::catch_up) commits them with whatever it adds. An import feeds the
    /// index after each file, so one file is indexed while the next is parsed and stored.
    /// Returns how many messages were handed over. Nothing fed is searchable through the index
    /// before that commit (grep scans the store past the watermark, so nothing is missed).
    pub fn feed(&self, store: &impl RecordSource) -> Result<u64> {
        if store.is_read_only() {
            return Err(StoreError::ReadOnly);
        }
        let mut guard = self.lock_writer()?;
        let start = self.fed.load(Ordering::Acquire).max(self.watermark().0);
        let end = store.next_message_id()?.0;
        if start >= end {
            return Ok(0);
        }
        self.add_documents(&mut guard, store, start..end)?;
        Ok(end - start)
    }

    /// Indexes every message appended since the watermark, committing every
    /// `config.index_batch` messages (and whatever [`feed`](Self::feed) handed over before).
    /// `progress` is called with (indexed so far, total to index). Returns how many messages
    /// were indexed. A read-only store is refused with [`StoreError::ReadOnly`] before the index
    /// changes.
    pub fn catch_up(
        &self,
        store: &impl RecordSource,
        progress: impl FnMut(u64, u64),
    ) -> Result<u64> {
        self.catch_up_until(store, progress, || false)
    }

    /// [`catch_up`](Self::catch_up), asking `stop` after each commit whether to end there (a
    /// command interrupted by Ctrl-C): the index then covers the messages below its watermark,
    /// as after any commit, and the next catch-up goes on from it. Returns how many messages
    /// were indexed.
    pub fn catch_up_until(
        &self,
        store: &impl RecordSource,
        mut progress: impl FnMut(u64, u64),
        stop: impl Fn() -> bool,
    ) -> Result<u64> {
        if store.is_read_only() {
            return Err(StoreError::ReadOnly);
        }
        let mut guard = self.lock_writer()?;
        let start = self.watermark().0;
        let end = store.next_message_id()?.0;
        if start >= end {
            self.record_watermark(store, start)?;
            return Ok(0);
        }
        let total = end - start;
        let batch = self.config.index_batch as u64;
        let mut done = 0;
        let mut from = start;
        while from < end {
            // A commit takes every document the writer holds: the first one covers at least
            // what was fed, so that the watermark never falls short of what is committed.
            let fed = self.fed.load(Ordering::Acquire);
            let to = (from + batch).min(end).max(fed);
            if fed < to {
                self.add_documents(&mut guard, store, fed.max(from)..to)?;
            }
            if let Err(e) = self.commit(&mut guard, to) {
                self.drop_uncommitted(&mut guard)?;
                return Err(e);
            }
            self.watermark.store(to, Ordering::Release);
            // Searches see the commit even if the store cannot record it (a full disk).
            self.show_commit(to)?;
            self.record_watermark(store, to)?;
            done += to - from;
            progress(done, total);
            from = to;
            if from < end && stop() {
                break;
            }
        }
        guard.trigrams.release_bulk_memory();
        Ok(done)
    }

    /// Records `watermark` (the index's) in the store's copy unless it is there already. The
    /// writer's lock is held.
    fn record_watermark(&self, store: &impl RecordSource, watermark: u64) -> Result<()> {
        if self.recorded.load(Ordering::Acquire) != watermark {
            store.set_index_watermark(MessageId(watermark))?;
            self.recorded.store(watermark, Ordering::Release);
        }
        Ok(())
    }

    /// Makes the last commit, whose watermark is `watermark`, what full-text searches see. On
    /// a failure they keep the previous searcher with its own watermark: older, still exact.
    fn show_commit(&self, watermark: u64) -> Result<()> {
        self.reader.reload().during("reloading the index reader")?;
        let view = SearchView {
            searcher: self.reader.searcher(),
            watermark,
        };
        // Nothing panics while the lock is held (a plain assignment or clone): a poisoned lock
        // still holds a whole view.
        *self.view.write().unwrap_or_else(PoisonError::into_inner) = view;
        Ok(())
    }

    /// The searcher full-text searches use and the watermark of the commit it shows.
    fn view(&self) -> SearchView {
        self.view
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Commits everything fed (the messages below `to`): the trigram segments first, written
    /// and synced, then tantivy with watermark `to`, then the segments are published.
    fn commit(&self, writer: &mut Writer, to: u64) -> Result<()> {
        if let Some(segment) = self.trigrams.write_pending(&mut writer.trigrams)? {
            writer.pending.push(segment);
        }
        let last = writer
            .last_fed
            .filter(|&(id, _)| id + 1 == to)
            .map(|(_, fingerprint)| fingerprint);
        let tantivy = self.open_writer(&mut writer.tantivy)?;
        let mut commit = tantivy.prepare_commit().during("preparing a commit")?;
        commit.set_payload(&payload(to, last));
        commit.commit().during("committing documents")?;
        self.trigrams.publish(std::mem::take(&mut writer.pending))
    }

    /// Drops what was fed and not committed: tantivy's documents (a rollback), the trigrams
    /// being built and the segments written for them. The fed mark returns to the watermark.
    fn drop_uncommitted(&self, writer: &mut Writer) -> Result<()> {
        if let Some(tantivy) = writer.tantivy.as_mut() {
            tantivy
                .rollback()
                .during("rolling back uncommitted documents")?;
        }
        self.drop_uncommitted_trigrams(writer)
    }

    /// The trigram part of [`drop_uncommitted`](Self::drop_uncommitted), for when tantivy's
    /// writer drops its own (closing it).
    fn drop_uncommitted_trigrams(&self, writer: &mut Writer) -> Result<()> {
        self.fed.store(self.watermark().0, Ordering::Release);
        writer.trigrams.reset();
        self.trigrams.discard(std::mem::take(&mut writer.pending))
    }

    /// Adds the messages `ids` to tantivy's writer and the trigram builder and records them as
    /// fed. On a failure, everything not committed is dropped and the fed mark returns to the
    /// watermark.
    fn add_documents(
        &self,
        writer: &mut Writer,
        store: &impl RecordSource,
        ids: Range<u64>,
    ) -> Result<()> {
        let added = self.try_add_documents(writer, store, ids.clone());
        match added {
            Ok(()) => {
                self.fed.store(ids.end, Ordering::Release);
                Ok(())
            }
            Err(e) => {
                self.drop_uncommitted(writer)?;
                Err(e)
            }
        }
    }

    fn try_add_documents(
        &self,
        writer: &mut Writer,
        store: &impl RecordSource,
        ids: Range<u64>,
    ) -> Result<()> {
        let Writer {
            tantivy,
            trigrams,
            pending,
            last_fed,
        } = writer;
        let tantivy = self.open_writer(tantivy)?;
        let reader = store.reader()?;
        let mut failure = None;
        // Records are read in place: the text is a slice of the record, nothing of the message
        // is decoded into owned values.
        reader.range_records(MessageId(ids.start)..MessageId(ids.end), |id, bytes| {
            let view = RecordView::read(bytes)?;
            let text = view.text()?;
            if trigrams.is_full(id.0) {
                match self.trigrams.write_pending(trigrams) {
                    Ok(segment) => pending.extend(segment),
                    Err(e) => {
                        failure = Some(e);
                        return Ok(ControlFlow::Break(()));
                    }
                }
            }
            trigrams.add(id.0, text);
            if id.0 + 1 == ids.end {
                *last_fed = Some((id.0, crate::lineage::message_fingerprint(&view)?));
            }
            let added = tantivy.add_document(self.document(id, &view, text));
            if let Err(e) = added.during("adding a document") {
                failure = Some(e);
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        // Ids without a record (none today: ids are dense) hold no trigram.
        trigrams.cover(ids);
        Ok(())
    }

    /// Closes the index writer after its background segment merges finish, so that the files
    /// in the index directory stop changing (before copying or backing it up). The next
    /// [`catch_up`](Self::catch_up) opens a new writer.
    pub fn finish_merges(&self) -> Result<()> {
        let mut guard = self.lock_writer()?;
        // Closing the writer drops what was fed and not committed: feed it again later. (A
        // rollback here would also cancel the merges this waits for.)
        self.drop_uncommitted_trigrams(&mut guard)?;
        if let Some(writer) = guard.tantivy.take() {
            writer
                .wait_merging_threads()
                .during("finishing segment merges")?;
        }
        Ok(())
    }

    /// Drops everything and indexes the whole store again.
    pub fn rebuild(
        &self,
        store: &impl RecordSource,
        progress: impl FnMut(u64, u64),
    ) -> Result<u64> {
        self.rebuild_until(store, progress, || false)
    }

    /// [`rebuild`](Self::rebuild), ending after the first commit at which `stop` says so (see
    /// [`catch_up_until`](Self::catch_up_until)).
    pub fn rebuild_until(
        &self,
        store: &impl RecordSource,
        progress: impl FnMut(u64, u64),
        stop: impl Fn() -> bool,
    ) -> Result<u64> {
        if store.is_read_only() {
            return Err(StoreError::ReadOnly);
        }
        {
            let mut guard = self.lock_writer()?;
            // Documents fed and not committed would survive the deletion: drop them first.
            self.drop_uncommitted(&mut guard)?;
            let writer = self.open_writer(&mut guard.tantivy)?;
            writer
                .delete_all_documents()
                .during("deleting every document")?;
            let mut commit = writer.prepare_commit().during("preparing a commit")?;
            commit.set_payload(&payload(0, None));
            commit.commit().during("committing the emptied index")?;
            self.watermark.store(0, Ordering::Release);
            self.fed.store(0, Ordering::Release);
            self.show_commit(0)?;
            self.record_watermark(store, 0)?;
            // After the commit: segments past a watermark of 0 are deleted at open anyway.
            self.trigrams.clear()?;
        }
        self.catch_up_until(store, progress, stop)
    }

    fn document(&self, id: MessageId, m: &RecordView<'_>, text: &str) -> TantivyDocument {
        let f = &self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_u64(f.msg_id, id.0);
        doc.add_u64(f.session, m.session().0);
        doc.add_u64(f.role, m.role().code());
        doc.add_i64(f.created_at, m.created_at().0);
        doc.add_text(f.words, text);
        doc
    }

    /// Filters for a scope, as non-scoring clauses.
    fn scope_clauses(&self, scope: &Scope) -> Vec<(Occur, Box<dyn Query>)> {
        let f = &self.fields;
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        let filter = |q: Box<dyn Query>| -> (Occur, Box<dyn Query>) {
            (Occur::Must, Box::new(ConstScoreQuery::new(q, 0.0)))
        };
        if let Some(session) = scope.session {
            clauses.push(filter(Box::new(TermQuery::new(
                Term::from_field_u64(f.session, session.0),
                IndexRecordOption::Basic,
            ))));
        }
        if !scope.roles.is_empty() {
            let roles: Vec<Box<dyn Query>> = scope
                .roles
                .iter()
                .map(|r| -> Box<dyn Query> {
                    Box::new(TermQuery::new(
                        Term::from_field_u64(f.role, r.code()),
                        IndexRecordOption::Basic,
                    ))
                })
                .collect();
            clauses.push(filter(Box::new(BooleanQuery::union(roles))));
        }
        if scope.since.is_some() || scope.before.is_some() {
            use std::ops::Bound;
            let lower = scope.since.map_or(Bound::Unbounded, |t| {
                Bound::Included(Term::from_field_i64(f.created_at, t.0))
            });
            let upper = scope.before.map_or(Bound::Unbounded, |t| {
                Bound::Excluded(Term::from_field_i64(f.created_at, t.0))
            });
            clauses.push(filter(Box::new(RangeQuery::new(lower, upper))));
        }
        clauses
    }

    /// Visits the ids of messages after `after` and below `indexed` (a watermark the caller
    /// read once, and scans from) whose trigrams satisfy `plan`, in id order, a batch at a
    /// time, until `visit` breaks. A superset of the messages that match: callers verify each
    /// (and check its scope).
    pub(crate) fn regex_candidates(
        &self,
        plan: &TrigramQuery,
        after: Option<MessageId>,
        indexed: MessageId,
        mut visit: impl FnMut(&[MessageId]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        self.trigrams.candidates(plan, after.map(|a| a.0), |ids| {
            // A catch-up publishes a segment just before it moves the watermark: ids past the
            // caller's watermark are left to its scan.
            let ids: Vec<MessageId> = ids
                .into_iter()
                .take_while(|&id| id < indexed.0)
                .map(MessageId)
                .collect();
            visit(&ids)
        })
    }

    /// Ranked full-text search: up to `limit` (message id, score) from rank `offset` among the
    /// messages below the watermark it returns, and whether more ranked hits follow. The
    /// caller scans the messages from that watermark.
    pub(crate) fn full_text(
        &self,
        text: &str,
        scope: &Scope,
        offset: usize,
        limit: usize,
    ) -> Result<RankedPage> {
        let parser = tantivy::query::QueryParser::for_index(&self.index, vec![self.fields.words]);
        let (query, _errors) = parser.parse_query_lenient(text);
        let mut clauses = self.scope_clauses(scope);
        clauses.push((Occur::Must, query));
        let query = BooleanQuery::new(clauses);
        let SearchView {
            searcher,
            watermark,
        } = self.view();
        let top = tantivy::collector::TopDocs::with_limit(limit + 1)
            .and_offset(offset)
            .order_by_score();
        let docs = searcher
            .search(&query, &top)
            .during("running a full-text search")?;
        let more = docs.len() > limit;
        let mut out = Vec::with_capacity(limit.min(docs.len()));
        for (score, address) in docs.into_iter().take(limit) {
            let column = searcher
                .segment_reader(address.segment_ord)
                .fast_fields()
                .u64("msg_id")
                .during("reading message ids of full-text hits")?;
            // Below the view's watermark always, except in a read-only process whose reader
            // opened a commit newer than the payload it read: those the caller scans.
            if let Some(id) = column.first(address.doc_id).filter(|&id| id < watermark) {
                out.push((MessageId(id), score));
            }
        }
        Ok(RankedPage {
            hits: out,
            more,
            indexed: MessageId(watermark),
        })
    }

    /// The analyzer of the `words` field (stemmed, lowercased words), for matching the
    /// unindexed tail and for finding snippet positions.
    pub(crate) fn words_analyzer(&self) -> Result<TextAnalyzer> {
        self.index
            .tokenizer_for_field(self.fields.words)
            .during("looking up the words analyzer")
    }

    /// Search by meaning, if an embedding model is configured.
    pub fn semantic(&self) -> Option<&crate::semantic::Semantic> {
        self.semantic.as_ref()
    }

    /// Gives the index its search by meaning (see [`crate::semantic`]).
    pub fn set_semantic(&mut self, semantic: Option<crate::semantic::Semantic>) {
        self.semantic = semantic;
    }

    /// Number of indexed documents (integrity checks, stats).
    pub fn num_docs(&self) -> u64 {
        self.view().searcher.num_docs()
    }

    /// Number of tantivy segments a full-text search (and an open) goes through.
    pub fn segment_count(&self) -> usize {
        self.view().searcher.segment_readers().len()
    }

    /// Number of trigram segments a regex search goes through.
    pub fn trigram_segment_count(&self) -> usize {
        self.trigrams.segments().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grep::{GrepMode, GrepRequest, grep};
    use crate::trigram_index::KEEP_PAIRS;
    use lcm_core::ids::SessionId;
    use lcm_core::message::{NewMessage, Role};
    use lcm_core::tokens::{Encoding, TokenCounter};
    use lcm_store::store::Store;
    use lcm_store::store::StoreOptions;

    /// The payload carries the last message's fingerprint; one written before fingerprints
    /// (watermark only) still reads, without it; anything else is not this format's.
    #[test]
    fn payloads_read_back_with_and_without_the_last_fingerprint() {
        for (watermark, last) in [(0, None), (20, None), (20, Some(0)), (7, Some(u64::MAX))] {
            let written = payload(watermark, last);
            assert_eq!(
                parse_payload(Some(&written)),
                Some((watermark, last)),
                "{written}"
            );
        }
        assert_eq!(
            parse_payload(Some(&format!("lcm-index v{INDEX_FORMAT} watermark 20"))),
            Some((20, None))
        );
        for bad in [
            "lcm-index v1 watermark 20".to_string(),
            format!("lcm-index v{INDEX_FORMAT} watermark 20 last xyz"),
            format!("lcm-index v{INDEX_FORMAT} watermark twenty"),
        ] {
            assert_eq!(parse_payload(Some(&bad)), None, "{bad}");
        }
    }

    /// Each commit records the fingerprint of the message just below its watermark, as the
    /// store holds it.
    #[test]
    fn a_commit_records_the_fingerprint_of_its_last_message() {
        // Two commits: the fingerprint is the last one's.
        let (dir, store, index, session) = fixture(2);
        for n in 0..3 {
            store
                .append(session, NewMessage::text(Role::User, format!("note {n}")))
                .unwrap();
        }
        index.catch_up(&store, |_, _| {}).unwrap();
        let metas = Index::open_in_dir(dir.path().join("index"))
            .unwrap()
            .load_metas()
            .unwrap();
        let expected =
            crate::lineage::stored_message_fingerprint(&store.reader().unwrap(), MessageId(2))
                .unwrap();
        assert!(expected.is_some());
        assert_eq!(parse_payload(metas.payload.as_deref()), Some((3, expected)));
    }

    #[test]
    fn indexing_goes_on_after_the_writer_finished_its_merges() {
        let config = SearchConfig::default();
        let (_dir, store, index, session) = fixture(config.index_batch);
        let request = |pattern: &str| GrepRequest {
            pattern: pattern.into(),
            mode: GrepMode::Regex,
            scope: Scope::default(),
            limit: Some(10),
            cursor: None,
        };
        for (round, word) in ["alphaword", "betaword"].into_iter().enumerate() {
            store
                .append(session, NewMessage::text(Role::User, format!("say {word}")))
                .unwrap();
            assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 1);
            index.finish_merges().unwrap();
            // Finishing twice, or with no writer open, is fine.
            index.finish_merges().unwrap();
            assert_eq!(index.watermark().0, round as u64 + 1);
            let page = grep(&store, &index, &config, &request(word)).unwrap();
            assert_eq!(page.hits.len(), 1, "{word}");
        }
        assert_eq!(index.num_docs(), 2);
    }

    /// A full disk refuses the store's copy of the watermark after the index committed: the
    /// commit is what searches see at once, and the next catch-up records the copy even with
    /// nothing new to index (before, it stayed behind until more messages came, and the
    /// searcher stayed on the older commit).
    #[test]
    fn a_watermark_the_full_disk_refused_is_recorded_by_the_next_catch_up() {
        use lcm_store::disk_faults::DiskSwitch;
        use lcm_store::integrity;

        let dir = tempfile::tempdir().unwrap();
        let disk = DiskSwitch::default();
        let options = StoreOptions::new(TokenCounter::new(Encoding::O200kBase));
        let store =
            Store::open_on_faulty_disk(dir.path().join("lcm.redb"), options, disk.clone()).unwrap();
        let config = SearchConfig::default();
        let index = SearchIndex::open(dir.path().join("index"), &store, &config).unwrap();
        let session = store.create_session("s", None).unwrap();
        append(&store, session, 0, 12);

        disk.fill();
        let refused = index.catch_up(&store, |_, _| {}).unwrap_err();
        assert!(refused.is_disk_full(), "{refused}");
        assert_eq!(index.watermark(), MessageId(12), "the index committed");
        assert_eq!(index.num_docs(), 12, "and searches see its commit");

        // Space is back (the store reopens its file at its next transaction).
        disk.free();
        assert_eq!(
            store.index_watermark().unwrap(),
            MessageId(0),
            "not recorded"
        );
        let report = integrity::check(&store, Some(&index)).unwrap();
        let kinds: Vec<_> = report.violations.iter().map(|v| v.kind).collect();
        assert_eq!(kinds, [integrity::ViolationKind::WatermarkMismatch]);
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 0);
        assert_eq!(store.index_watermark().unwrap(), MessageId(12));
        let report = integrity::check(&store, Some(&index)).unwrap();
        assert!(report.is_clean(), "{:?}", report.violations);
        assert_indexed_once(&store, &index, 12);
    }

    /// An index written by another index format (here: version 1, which also indexed
    /// trigrams starting or ending with whitespace) is discarded at open and rebuilt from the
    /// store by the next catch-up; the rebuilt index finds everything and holds none of those.
    #[test]
    fn an_index_of_an_older_format_is_rebuilt() {
        let config = SearchConfig::default();
        let (dir, store, index, session) = fixture(config.index_batch);
        append(&store, session, 0, 20);
        index.catch_up(&store, |_, _| {}).unwrap();
        index.finish_merges().unwrap();
        {
            let old = Index::open_in_dir(dir.path().join("index")).unwrap();
            let mut writer: IndexWriter = old.writer_with_num_threads(1, 15_000_000).unwrap();
            let mut commit = writer.prepare_commit().unwrap();
            commit.set_payload("lcm-index v1 watermark 20");
            commit.commit().unwrap();
        }
        drop(index);
        let index = SearchIndex::open(dir.path().join("index"), &store, &config).unwrap();
        assert_eq!(index.watermark(), MessageId(0), "discarded");
        assert_eq!(index.num_docs(), 0);
        assert_eq!(store.index_watermark().unwrap(), MessageId(0));
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 20);
        assert_indexed_once(&store, &index, 20);
        // "message number0 here": windows starting or ending with a space are left out.
        let grams = [
            ("ber", true),
            ("e n", true),
            ("0 h", true),
            (" nu", false),
            ("er0", true),
            ("r0 ", false),
        ];
        for (gram, held) in grams {
            let plan = TrigramQuery::Gram(gram.into());
            let mut found = Vec::new();
            index
                .regex_candidates(&plan, None, index.watermark(), |ids| {
                    found.extend_from_slice(ids);
                    Ok(ControlFlow::Continue(()))
                })
                .unwrap();
            assert_eq!(!found.is_empty(), held, "{gram:?}");
        }
    }

    /// An index with this format's payload but another schema (format 3's, where `msg_id` and
    /// `created_at` were also indexed as terms) is discarded at open and rebuilt.
    #[test]
    fn an_index_with_another_schema_is_rebuilt() {
        let config = SearchConfig::default();
        let (dir, store, index, session) = fixture(config.index_batch);
        append(&store, session, 0, 20);
        index.catch_up(&store, |_, _| {}).unwrap();
        index.finish_merges().unwrap();
        drop(index);
        let index_dir = dir.path().join("index");
        for entry in std::fs::read_dir(&index_dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::remove_file(path).unwrap();
            }
        }
        {
            let mut builder = Schema::builder();
            let number = NumericOptions::default().set_indexed().set_fast();
            builder.add_u64_field("msg_id", number.clone());
            builder.add_u64_field("session", number.clone());
            builder.add_u64_field("role", INDEXED);
            builder.add_i64_field("created_at", number);
            builder.add_text_field(
                "words",
                TextOptions::default().set_indexing_options(
                    TextFieldIndexing::default()
                        .set_tokenizer(WORDS_TOKENIZER)
                        .set_index_option(IndexRecordOption::WithFreqsAndPositions),
                ),
            );
            let old = Index::create_in_dir(&index_dir, builder.build()).unwrap();
            let mut writer: IndexWriter = old.writer_with_num_threads(1, 15_000_000).unwrap();
            let mut commit = writer.prepare_commit().unwrap();
            commit.set_payload(&payload(20, None));
            commit.commit().unwrap();
        }
        let index = SearchIndex::open(&index_dir, &store, &config).unwrap();
        assert_eq!(index.watermark(), MessageId(0), "discarded");
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 20);
        assert_indexed_once(&store, &index, 20);
    }

    #[test]
    fn an_index_error_says_what_failed_and_keeps_its_cause() {
        // A writer's memory budget below tantivy's minimum: opening the writer fails.
        let (_dir, store, _, session) = fixture(100);
        append(&store, session, 0, 3);
        let config = SearchConfig {
            index_writer_memory_mb: 1,
            ..SearchConfig::default()
        };
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        let err = index.catch_up(&store, |_, _| {}).unwrap_err();
        assert!(matches!(err, StoreError::Index { .. }), "{err:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("search index error while opening the index writer: "),
            "{message}"
        );
        assert!(
            message.contains("memory arena"),
            "tantivy's words: {message}"
        );
        let cause = std::error::Error::source(&err).expect("the cause is kept");
        assert!(cause.downcast_ref::<tantivy::TantivyError>().is_some());
        // Nothing was indexed, and the next catch-up with a usable budget indexes everything.
        assert_eq!(index.watermark(), MessageId(0));
        let index = SearchIndex::open_in_ram(&store, &SearchConfig::default()).unwrap();
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 3);
    }

    /// A store, an index over it with commits every `index_batch` messages, and a session.
    fn fixture(index_batch: usize) -> (tempfile::TempDir, Store, SearchIndex, SessionId) {
        let dir = tempfile::tempdir().unwrap();
        let options = StoreOptions::new(TokenCounter::new(Encoding::O200kBase));
        let store = Store::open(dir.path().join("lcm.redb"), options).unwrap();
        let config = SearchConfig {
            index_batch,
            ..SearchConfig::default()
        };
        let index = SearchIndex::open(dir.path().join("index"), &store, &config).unwrap();
        let session = store.create_session("s", None).unwrap();
        (dir, store, index, session)
    }

    fn append(store: &Store, session: SessionId, from: usize, n: usize) {
        let batch = (from..from + n)
            .map(|i| NewMessage::text(Role::User, format!("message number{i} here")))
            .collect();
        store.append_batch(session, batch).unwrap();
    }

    /// Every message number{i} is found exactly once through the index.
    fn assert_indexed_once(store: &Store, index: &SearchIndex, n: usize) {
        assert_eq!(index.num_docs(), n as u64, "documents in the index");
        assert_eq!(index.watermark(), store.next_message_id().unwrap());
        for i in [0, n / 2, n - 1] {
            let page = grep(
                store,
                index,
                &SearchConfig::default(),
                &GrepRequest {
                    pattern: format!("number{i} "),
                    mode: GrepMode::Regex,
                    scope: Scope::default(),
                    limit: Some(10),
                    cursor: None,
                },
            )
            .unwrap();
            assert_eq!(page.hits.len(), 1, "number{i}");
        }
    }

    #[test]
    fn a_bulk_catch_up_gives_back_its_trigram_memory() {
        let (_dir, store, index, session) = fixture(1000);
        // Three texts of 400,000 pseudo-random CJK characters: about 1.2 million (message,
        // trigram) pairs, more than a builder keeps room for between catch-ups.
        let texts: Vec<String> = (0..3)
            .map(|seed| crate::trigram_keys::random_cjk(400_000, seed))
            .collect();
        let batch = texts
            .iter()
            .map(|t| NewMessage::text(Role::User, t.clone()))
            .collect();
        store.append_batch(session, batch).unwrap();
        assert_eq!(index.feed(&store).unwrap(), 3);
        let held = index.lock_writer().unwrap().trigrams.pairs_capacity();
        assert!(held > KEEP_PAIRS, "{held} pairs of room while fed");
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 3);
        let kept = index.lock_writer().unwrap().trigrams.pairs_capacity();
        assert!(
            kept <= KEEP_PAIRS,
            "{kept} pairs of room after the catch-up"
        );
        // Still indexed: a trigram of the second text finds it through the index.
        let gram: String = texts[1].chars().skip(1000).take(3).collect();
        let page = grep(
            &store,
            &index,
            &SearchConfig::default(),
            &GrepRequest {
                pattern: regex::escape(&gram),
                mode: GrepMode::Regex,
                scope: Scope::default(),
                limit: Some(10),
                cursor: None,
            },
        )
        .unwrap();
        assert_eq!(page.strategy, crate::grep::Strategy::TrigramIndex);
        assert_eq!(page.hits.len(), 1, "{page:?}");
        assert_eq!(page.hits[0].message, MessageId(1));
    }

    #[test]
    fn fed_messages_are_committed_once_by_the_next_catch_up() {
        let (_dir, store, index, session) = fixture(3);
        append(&store, session, 0, 4);
        assert_eq!(index.feed(&store).unwrap(), 4);
        // Fed is not committed: nothing in the index yet, and feeding again adds nothing.
        assert_eq!(index.num_docs(), 0);
        assert_eq!(index.watermark().0, 0);
        assert_eq!(index.feed(&store).unwrap(), 0);
        append(&store, session, 4, 5);
        assert_eq!(index.feed(&store).unwrap(), 5);
        append(&store, session, 9, 4);
        // Commits every 3 messages, the first one past everything fed (9), then 12, then 13.
        let mut seen = Vec::new();
        assert_eq!(
            index
                .catch_up(&store, |done, total| seen.push((done, total)))
                .unwrap(),
            13
        );
        assert_eq!(seen, vec![(9, 13), (12, 13), (13, 13)]);
        assert_indexed_once(&store, &index, 13);
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 0);
        assert_indexed_once(&store, &index, 13);
    }

    #[test]
    fn a_stopped_catch_up_ends_at_a_commit_and_the_next_one_goes_on_from_it() {
        let (_dir, store, index, session) = fixture(4);
        append(&store, session, 0, 10);
        // Asked to stop after its first commit: the watermark is that commit's.
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            true
        };
        assert_eq!(index.catch_up_until(&store, |_, _| {}, stop).unwrap(), 4);
        assert_eq!(asked.get(), 1);
        assert_eq!(index.watermark().0, 4);
        assert_eq!(store.stats().unwrap().index_watermark.0, 4);
        assert_eq!(index.num_docs(), 4);
        // Grep stays complete: the messages past the watermark are scanned.
        let page = grep(
            &store,
            &index,
            &SearchConfig::default(),
            &GrepRequest {
                pattern: "number[0-9] ".into(),
                mode: GrepMode::Regex,
                scope: Scope::default(),
                limit: Some(20),
                cursor: None,
            },
        )
        .unwrap();
        assert_eq!(page.hits.len(), 10);
        // The next catch-up indexes the rest; a rebuild stopped at once covers its first batch.
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 6);
        assert_indexed_once(&store, &index, 10);
        assert_eq!(index.rebuild_until(&store, |_, _| {}, || true).unwrap(), 4);
        assert_eq!(index.watermark().0, 4);
        assert_eq!(index.num_docs(), 4);
        // Not asked after the last commit: a stop there would change nothing.
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            false
        };
        assert_eq!(index.catch_up_until(&store, |_, _| {}, stop).unwrap(), 6);
        assert_eq!(asked.get(), 1, "asked after the commit at 8, not after 10");
        assert_indexed_once(&store, &index, 10);
    }

    #[test]
    fn fed_messages_dropped_with_the_writer_or_a_rebuild_are_indexed_again() {
        let (_dir, store, index, session) = fixture(50_000);
        append(&store, session, 0, 6);
        index.feed(&store).unwrap();
        // Closing the writer drops the fed documents; the next catch-up indexes them again.
        index.finish_merges().unwrap();
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 6);
        assert_indexed_once(&store, &index, 6);

        append(&store, session, 6, 3);
        index.feed(&store).unwrap();
        assert_eq!(index.rebuild(&store, |_, _| {}).unwrap(), 9);
        assert_indexed_once(&store, &index, 9);
    }

    #[test]
    fn segments_of_similar_size_are_merged_once_there_are_four() {
        let config = SearchConfig::default();
        let (dir, store, index, session) = fixture(config.index_batch);
        // Three catch-ups of 12,000 messages, each committing a segment per indexing thread (two
        // on two cores): the first four, of one size level, are merged into one; the last two
        // are a level below it. tantivy's default policy waits for eight segments in a level
        // and would keep all six. (On one core each catch-up makes one segment: three, kept.)
        for round in 0..3 {
            let batch = (0..12_000)
                .map(|i| NewMessage::text(Role::User, format!("r{round} m{i}")))
                .collect();
            store.append_batch(session, batch).unwrap();
            index.catch_up(&store, |_, _| {}).unwrap();
        }
        index.finish_merges().unwrap();
        let reopened = SearchIndex::open(dir.path().join("index"), &store, &config).unwrap();
        assert_eq!(reopened.num_docs(), 36_000);
        assert!(
            reopened.segment_count() <= 3,
            "{} segments",
            reopened.segment_count()
        );
    }
}
