//! The immutable store: sessions and messages in one redb file.
//!
//! Guarantees:
//! - **Durable on return.** Every append commits with redb's immediate durability (fsync) before
//!   it returns; an acknowledged message survives a crash or power loss.
//! - **Immutable.** There is no API that changes or deletes a stored message or its original.
//! - **Atomic batches.** A batch is one transaction: all of it is stored, or none.
//! - **Validated before written.** Bad input is rejected before a transaction opens, so a
//!   rejected call changes nothing.

use std::collections::HashMap;
use std::ops::{ControlFlow, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use lcm_core::formats::lcm as lcm_format;
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{Message, NewMessage, Original, Part, SessionInfo, SourceFormat};
use lcm_core::time::Timestamp;
use lcm_core::tokens::TokenCounter;
use redb::{Database, ReadTransaction, ReadableTable, ReadableTableMetadata, TableHandle};

use crate::coalesced_file::CoalescedFile;
use crate::codec;
use crate::db::{Db, OPEN_PATIENCE, Watched, Writable, retry_while_held};
use crate::error::{Result, StoreError};
use crate::files::{Appending, FileCandidates, FileRules, FileTables};
use crate::message_rows::{self, PackWriter};
use crate::pipeline::OrderedPipeline;
use crate::record::{self, RecordFields, RecordView, encoded_len_hint};
use crate::record_migration;
use crate::record_source::{InRow, Step};
use crate::session_runs::{self, RunWriter};
use crate::tables::{self, meta};

#[derive(Debug, Clone, bincode::Encode, bincode::Decode)]
pub(crate) struct SessionRecord {
    pub key: String,
    pub created_at: Timestamp,
    pub parent: Option<u64>,
    pub message_count: u64,
    pub token_total: u64,
    pub first_message_at: Option<Timestamp>,
    pub last_message_at: Option<Timestamp>,
}

impl SessionRecord {
    fn into_info(self, id: u64) -> SessionInfo {
        SessionInfo {
            id: SessionId(id),
            key: self.key,
            created_at: self.created_at,
            parent: self.parent.map(SessionId),
            message_count: self.message_count,
            token_total: self.token_total,
            first_message_at: self.first_message_at,
            last_message_at: self.last_message_at,
        }
    }
}

/// What happened to one appended message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Appended {
    pub id: MessageId,
    /// `false` when a message with the same source key was already stored in the session (the
    /// existing id is returned and nothing is written).
    pub inserted: bool,
}

/// Totals over the whole store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    pub sessions: u64,
    pub messages: u64,
    pub tokens: u64,
    /// Messages below this id are in the search index.
    pub index_watermark: MessageId,
    pub file_bytes: Option<u64>,
}

/// Options for opening a store.
#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Counts tokens of every appended message.
    pub counter: TokenCounter,
    /// Which parts become file records, and the size of their exploration summaries.
    pub files: FileRules,
    /// The most memory, bytes, redb keeps of the file's pages (`[storage] cache_mib`).
    pub cache_bytes: usize,
}

impl StoreOptions {
    /// redb's own default page cache, 1 GiB (`[storage] cache_mib = 1024`).
    pub const DEFAULT_CACHE_BYTES: usize = 1 << 30;

    /// Options with this counter, the default file rules and the default page cache.
    pub fn new(counter: TokenCounter) -> Self {
        StoreOptions {
            counter,
            files: FileRules::default(),
            cache_bytes: Self::DEFAULT_CACHE_BYTES,
        }
    }

    /// The options a configuration asks for: its tokenizer, its file rules, its page cache.
    pub fn from_config(config: &lcm_core::config::Config) -> Self {
        StoreOptions {
            counter: TokenCounter::new(config.tokenizer.encoding()),
            files: (&config.files).into(),
            cache_bytes: usize::try_from(config.storage.cache_mib)
                .unwrap_or(usize::MAX)
                .saturating_mul(1 << 20),
        }
    }
}

/// The immutable store. Cheap to share behind an `Arc`; all methods take `&self`.
pub struct Store {
    pub(crate) db: Db,
    counter: TokenCounter,
    files: FileRules,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// Messages validated and tokenised by [`Store::prepare_append`], waiting for
/// [`Store::commit_prepared`].
#[derive(Debug)]
pub struct PreparedAppend {
    items: Vec<Prepared>,
}

impl PreparedAppend {
    /// Number of messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The sessions the messages go to (each once, in first-seen order).
    pub fn sessions(&self) -> Vec<SessionId> {
        let mut out: Vec<SessionId> = Vec::new();
        for p in &self.items {
            let s = SessionId(p.session);
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }
}

/// A message prepared outside the write transaction (token count, encoded parts).
#[derive(Debug)]
struct Prepared {
    session: u64,
    created_at: Timestamp,
    token_count: u32,
    /// What the message brings to the file tables.
    files: FileCandidates,
    /// The record ([`crate::record`]), its sequence number left for the transaction to set.
    record: Vec<u8>,
    original: Option<Vec<u8>>,
    source_key: Option<String>,
}

impl Store {
    /// Opens the store at `path`, creating it if absent.
    pub fn open(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        Self::open_with(path.as_ref(), options, |file| file)
    }

    /// As [`Self::open`], with the file as redb sees it wrapped by `wrap` (tests put a disk that
    /// can be made to fail there: [`crate::disk_faults`]).
    pub(crate) fn open_with<B: redb::StorageBackend>(
        path: &Path,
        options: StoreOptions,
        wrap: impl Fn(CoalescedFile) -> B + Send + Sync + 'static,
    ) -> Result<Store> {
        let owned = path.to_path_buf();
        let cache_bytes = options.cache_bytes;
        // Also how the database is opened again after an I/O error (see `crate::db`).
        let open = move || -> Result<(Database, Arc<AtomicBool>)> {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&owned)
                .map_err(|source| StoreError::Io {
                    path: owned.display().to_string(),
                    source,
                })?;
            let failed = Arc::new(AtomicBool::new(false));
            let backend = Watched {
                inner: wrap(CoalescedFile::new(redb::backends::FileBackend::new(file)?)),
                failed: Arc::clone(&failed),
            };
            match Database::builder()
                .set_cache_size(cache_bytes)
                .create_with_backend(backend)
            {
                Ok(db) => Ok((db, failed)),
                Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                    Err(StoreError::AlreadyOpen(owned.display().to_string()))
                }
                Err(e) => Err(e.into()),
            }
        };
        // The check for an interrupted creation is retried with the open: a file held for a
        // moment (see `OPEN_PATIENCE`) is checked once it is free, not skipped.
        let first_open = || {
            match reset_interrupted_creation(path) {
                Ok(true) => {
                    tracing::warn!(path = %path.display(), "the store's creation was interrupted (nothing was ever stored in it); creating it again");
                }
                Ok(false) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(StoreError::AlreadyOpen(path.display().to_string()));
                }
                Err(source) => {
                    return Err(StoreError::Io {
                        path: path.display().to_string(),
                        source,
                    });
                }
            }
            open()
        };
        let (db, failed) = retry_while_held(Instant::now() + OPEN_PATIENCE, first_open)?;
        Self::init(
            Writable::new(db, failed, Some(Box::new(open))),
            options,
            Some(path.to_path_buf()),
        )
    }

    /// Opens a store on `backend`, which holds no file of its own (a simulated disk: tests of
    /// [`crate::power_loss`]). [`Self::path`] is `None`.
    pub(crate) fn open_on_backend<B: redb::StorageBackend>(
        backend: B,
        options: StoreOptions,
    ) -> Result<Store> {
        let failed = Arc::new(AtomicBool::new(false));
        let backend = Watched {
            inner: backend,
            failed: Arc::clone(&failed),
        };
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create_with_backend(backend)?;
        Self::init(Writable::new(db, failed, None), options, None)
    }

    /// Opens the existing store at `path` for reading only. Nothing is written, not even on
    /// open or close (a writable open commits on both), so one-shot readers cost no fsync.
    /// Every write returns [`StoreError::ReadOnly`]. A store that was not closed cleanly is
    /// refused with [`StoreError::NeedsRecovery`] (only a writable open recovers it); a missing
    /// file with [`StoreError::Io`].
    pub fn open_read_only(path: impl AsRef<Path>, options: StoreOptions) -> Result<Store> {
        let path = path.as_ref();
        let shown = || path.display().to_string();
        let open = || {
            Database::builder()
                .set_cache_size(options.cache_bytes)
                .open_read_only(path)
                .map_err(|e| match e {
                    redb::DatabaseError::DatabaseAlreadyOpen => StoreError::AlreadyOpen(shown()),
                    redb::DatabaseError::RepairAborted => StoreError::NeedsRecovery(shown()),
                    redb::DatabaseError::Storage(redb::StorageError::Io(source)) => {
                        StoreError::Io {
                            path: shown(),
                            source,
                        }
                    }
                    e => e.into(),
                })
        };
        let db = retry_while_held(Instant::now() + OPEN_PATIENCE, open)?;
        let db = Db::ReadOnly(db);
        match Self::layout(&db)? {
            Layout::Current => {}
            Layout::Older(found) if found >= READABLE_AS_IS => {}
            Layout::Older(found) => {
                return Err(StoreError::OlderSchema {
                    path: path.display().to_string(),
                    found,
                    current: tables::STORE_SCHEMA,
                });
            }
            Layout::Uninitialised => {
                return Err(StoreError::Corrupt {
                    table: tables::META.name(),
                    detail: format!(
                        "{} has no lcm schema version or lacks tables: not an initialised lcm store",
                        path.display()
                    ),
                });
            }
        }
        Ok(Store {
            db,
            counter: options.counter,
            files: options.files,
            path: Some(path.to_path_buf()),
        })
    }

    /// Whether the store was opened with [`Self::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.db.is_read_only()
    }

    /// Rewrites the store file without its free pages, as SQLite's `VACUUM` does: redb reuses
    /// the pages a commit frees, but a file that grew keeps them (half of a million-message
    /// store built in large batches). Nothing stored changes; every step is a durable redb
    /// commit, so a crash leaves a valid store. Needs the only handle on the store (`&mut`) and
    /// no read snapshot open. Returns the file's size in bytes before and after (0 in memory).
    pub fn vacuum(&mut self) -> Result<(u64, u64)> {
        let size = |path: Option<&Path>| -> Result<u64> {
            match path {
                None => Ok(0),
                Some(p) => std::fs::metadata(p)
                    .map(|m| m.len())
                    .map_err(|source| StoreError::Io {
                        path: p.display().to_string(),
                        source,
                    }),
            }
        };
        let before = size(self.path.as_deref())?;
        self.db.compact()?;
        Ok((before, size(self.path.as_deref())?))
    }

    /// A store in memory, for tests and benchmarks of code above the disk.
    pub fn open_in_memory(options: StoreOptions) -> Result<Store> {
        let db = Database::builder()
            .set_cache_size(options.cache_bytes)
            .create_with_backend(redb::backends::InMemoryBackend::new())?;
        Self::init(
            Writable::new(db, Arc::new(AtomicBool::new(false)), None),
            options,
            None,
        )
    }

    fn init(db: Writable, options: StoreOptions, path: Option<PathBuf>) -> Result<Store> {
        let db = Db::Writable(db);
        // Opening an initialised store reads only: a write transaction would cost an fsync on
        // every open.
        let layout = Self::layout(&db)?;
        if layout == Layout::Current {
            return Ok(Store {
                db,
                counter: options.counter,
                files: options.files,
                path,
            });
        }
        let txn = db.begin_write()?;
        {
            let mut meta_table = txn.open_table(tables::META)?;
            if let Layout::Older(found) = layout
                && found < 2
            {
                let migrated = session_runs::migrate_from_v1(&txn)?;
                tracing::info!(
                    from = found,
                    to = tables::STORE_SCHEMA,
                    entries = migrated.entries,
                    runs = migrated.runs,
                    "migrated the store's session lists to runs"
                );
            }
            // Schema 6: every message record in lcm's own layout (`record.rs`).
            if let Layout::Older(found) = layout
                && found < 6
            {
                let migrated = record_migration::migrate_records(&txn)?;
                tracing::info!(
                    from = found,
                    to = tables::STORE_SCHEMA,
                    messages = migrated.messages,
                    rows_before = migrated.rows_before,
                    rows_after = migrated.rows_after,
                    "rewrote the store's message records in the current layout"
                );
            }
            meta_table.insert(meta::SCHEMA_VERSION, tables::STORE_SCHEMA)?;
            // Create every table so that readers never meet a missing one.
            txn.open_table(tables::SESSIONS)?;
            txn.open_table(tables::SESSION_KEYS)?;
            txn.open_table(tables::MESSAGES)?;
            txn.open_table(tables::ORIGINALS)?;
            txn.open_table(tables::SESSION_RUNS)?;
            txn.open_table(tables::SOURCE_KEYS)?;
            txn.open_table(tables::SUMMARIES)?;
            txn.open_table(tables::SUMMARY_SOURCES)?;
            txn.open_table(tables::COVERED_BY)?;
            txn.open_table(tables::SESSION_SUMMARIES)?;
            txn.open_table(tables::SUMMARY_DIGESTS)?;
            txn.open_table(tables::CONTEXT)?;
            txn.open_table(tables::FILES)?;
            txn.open_table(tables::FILE_HASHES)?;
            txn.open_table(tables::MESSAGE_FILES)?;
            txn.open_table(tables::FILE_MESSAGES)?;
            txn.open_table(tables::READ_CALLS)?;
            txn.open_table(tables::CONTEXT_MARKS)?;
            // A store written before schema 4 gets the file records its messages would have.
            if let Layout::Older(found) = layout
                && found < 4
            {
                let done =
                    crate::files::backfill(&txn, &mut meta_table, options.files, options.counter)?;
                tracing::info!(
                    from = found,
                    messages = done.messages,
                    summaries = done.summaries,
                    "registered the file records of a store written before schema 4"
                );
            }
        }
        txn.commit()?;
        Ok(Store {
            db,
            counter: options.counter,
            files: options.files,
            path,
        })
    }

    /// What the file holds: an lcm store of this build's schema with every table [`Self::init`]
    /// creates, one of an older schema (migrated by a writable open), or nothing yet. A newer
    /// schema is refused here, before anything is written.
    fn layout(db: &Db) -> Result<Layout> {
        let txn = db.begin_read()?;
        let version = match txn.open_table(tables::META) {
            Ok(meta_table) => meta_table.get(meta::SCHEMA_VERSION)?.map(|v| v.value()),
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Layout::Uninitialised),
            Err(e) => return Err(e.into()),
        };
        let Some(version) = version else {
            return Ok(Layout::Uninitialised);
        };
        if version > tables::STORE_SCHEMA {
            return Err(StoreError::NewerSchema {
                found: u32::try_from(version).unwrap_or(u32::MAX),
                supported: u32::try_from(tables::STORE_SCHEMA).unwrap_or(u32::MAX),
            });
        }
        if version < tables::STORE_SCHEMA {
            return Ok(Layout::Older(version));
        }
        let existing: Vec<String> = txn.list_tables()?.map(|t| t.name().to_owned()).collect();
        let required = [
            tables::SESSIONS.name(),
            tables::SESSION_KEYS.name(),
            tables::MESSAGES.name(),
            tables::ORIGINALS.name(),
            tables::SESSION_RUNS.name(),
            tables::SOURCE_KEYS.name(),
            tables::SUMMARIES.name(),
            tables::SUMMARY_SOURCES.name(),
            tables::COVERED_BY.name(),
            tables::SESSION_SUMMARIES.name(),
            tables::SUMMARY_DIGESTS.name(),
            tables::CONTEXT.name(),
            tables::FILES.name(),
            tables::FILE_HASHES.name(),
            tables::MESSAGE_FILES.name(),
            tables::FILE_MESSAGES.name(),
            tables::READ_CALLS.name(),
        ];
        let complete = required
            .iter()
            .all(|name| existing.iter().any(|e| e == name));
        Ok(if complete {
            Layout::Current
        } else {
            Layout::Uninitialised
        })
    }

    /// The file the store lives in (`None` in memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// What preparing an append needs.
    fn counting(&self) -> Counting {
        Counting {
            counter: self.counter,
            files: self.files,
        }
    }

    /// The rules by which appends register file records.
    pub fn file_rules(&self) -> FileRules {
        self.files
    }

    /// The token counter used at ingest.
    pub fn counter(&self) -> TokenCounter {
        self.counter
    }

    // ---------------------------------------------------------------- sessions

    /// Creates a session named `key` (unique), optionally the child of `parent`.
    pub fn create_session(&self, key: &str, parent: Option<SessionId>) -> Result<SessionId> {
        self.create_session_with(key, parent, redb::Durability::Immediate)
    }

    /// [`Store::create_session`], committed with `durability`.
    fn create_session_with(
        &self,
        key: &str,
        parent: Option<SessionId>,
        durability: redb::Durability,
    ) -> Result<SessionId> {
        validate_session_key(key)?;
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)?;
        let id = {
            let mut keys = txn.open_table(tables::SESSION_KEYS)?;
            if keys.get(key)?.is_some() {
                return Err(StoreError::SessionExists(key.to_owned()));
            }
            let mut sessions = txn.open_table(tables::SESSIONS)?;
            if let Some(parent) = parent
                && sessions.get(parent.0)?.is_none()
            {
                return Err(StoreError::SessionNotFound(parent));
            }
            let mut meta_table = txn.open_table(tables::META)?;
            let id = next_counter(&mut meta_table, meta::NEXT_SESSION)?;
            let record = SessionRecord {
                key: key.to_owned(),
                created_at: Timestamp::now(),
                parent: parent.map(|p| p.0),
                message_count: 0,
                token_total: 0,
                first_message_at: None,
                last_message_at: None,
            };
            sessions.insert(id, codec::encode(&record).as_slice())?;
            keys.insert(key, id)?;
            id
        };
        txn.commit()?;
        Ok(SessionId(id))
    }

    /// The session named `key`, created if it does not exist yet.
    pub fn ensure_session(&self, key: &str) -> Result<SessionId> {
        self.ensure_session_with(key, None, redb::Durability::Immediate)
    }

    /// [`Store::ensure_session`] for a caller about to append to the session: a new session is
    /// committed without a sync of its own and becomes durable with the next durable commit,
    /// the caller's append (a crash before it leaves neither the session nor its messages).
    /// An import of many small session files makes one sync a file instead of two.
    pub fn ensure_session_for_append(&self, key: &str) -> Result<SessionId> {
        self.ensure_session_with(key, None, redb::Durability::None)
    }

    /// [`Store::ensure_session_for_append`] for a session spawned from `parent`: a session
    /// created here gets it as its parent; one that exists already is left as it is.
    pub fn ensure_child_session_for_append(
        &self,
        key: &str,
        parent: Option<SessionId>,
    ) -> Result<SessionId> {
        self.ensure_session_with(key, parent, redb::Durability::None)
    }

    fn ensure_session_with(
        &self,
        key: &str,
        parent: Option<SessionId>,
        durability: redb::Durability,
    ) -> Result<SessionId> {
        if let Some(id) = self.session_id_for_key(key)? {
            return Ok(id);
        }
        match self.create_session_with(key, parent, durability) {
            Err(StoreError::SessionExists(_)) => self
                .session_id_for_key(key)?
                .ok_or_else(|| StoreError::SessionKeyNotFound(key.to_owned())),
            other => other,
        }
    }

    /// The session named `key`, if any.
    pub fn session_id_for_key(&self, key: &str) -> Result<Option<SessionId>> {
        let txn = self.db.begin_read()?;
        let keys = txn.open_table(tables::SESSION_KEYS)?;
        Ok(keys.get(key)?.map(|v| SessionId(v.value())))
    }

    /// One session's record.
    pub fn session(&self, id: SessionId) -> Result<SessionInfo> {
        self.reader()?.session(id)
    }

    /// Every session, in creation order.
    pub fn sessions(&self) -> Result<Vec<SessionInfo>> {
        let txn = self.db.begin_read()?;
        let sessions = txn.open_table(tables::SESSIONS)?;
        let mut out = Vec::with_capacity(sessions.len()? as usize);
        for entry in sessions.iter()? {
            let (id, bytes) = entry?;
            let record: SessionRecord = codec::decode("sessions", bytes.value())?;
            out.push(record.into_info(id.value()));
        }
        Ok(out)
    }

    // ---------------------------------------------------------------- append

    /// Appends one message to `session`; durable when it returns.
    pub fn append(&self, session: SessionId, message: NewMessage) -> Result<Appended> {
        let mut out = self.append_mixed(vec![(session, message)])?;
        out.pop()
            .ok_or_else(|| StoreError::InvalidMessage("nothing appended".into()))
    }

    /// Appends messages to `session` in one transaction; durable when it returns.
    pub fn append_batch(
        &self,
        session: SessionId,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Appended>> {
        self.append_mixed(messages.into_iter().map(|m| (session, m)).collect())
    }

    /// Appends messages of several sessions in one transaction, in the order given; durable
    /// when it returns. Messages whose source key is already stored in their session are not
    /// written again (`inserted: false`).
    ///
    /// A large batch has its tokens counted on helper threads while this thread encodes and
    /// inserts the chunks already counted, in order, into the write transaction.
    pub fn append_mixed(&self, messages: Vec<(SessionId, NewMessage)>) -> Result<Vec<Appended>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        validate_batch(&messages)?;
        let total = messages.len();
        let Some(threads) = parallel_threads(total) else {
            let counting = self.counting();
            return self.write_append(total, |tables| {
                for (session, m) in messages {
                    tables.add(prepare_message(counting, session, m)?)?;
                }
                Ok(())
            });
        };
        let pipeline = prepare_pipeline(messages, self.counter);
        let counting = self.counting();
        self.write_append(total, |tables| {
            pipeline.run(threads, |counted| {
                for p in encode_counted(counting, counted) {
                    tables.add(p?)?;
                }
                Ok(())
            })
        })
    }

    /// Validates and tokenises messages without touching the database: the expensive half of
    /// an append, which callers can run in parallel before a group commit with
    /// [`Store::commit_prepared`].
    pub fn prepare_append(&self, messages: Vec<(SessionId, NewMessage)>) -> Result<PreparedAppend> {
        validate_batch(&messages)?;
        Ok(PreparedAppend {
            items: self.prepare(messages)?,
        })
    }

    /// Commits prepared appends (several callers' batches) in one durable transaction: a group
    /// commit, one fsync for all. Returns each batch's results in order. If any batch names a
    /// missing session, nothing is written.
    pub fn commit_prepared(&self, batches: Vec<PreparedAppend>) -> Result<Vec<Vec<Appended>>> {
        let sizes: Vec<usize> = batches.iter().map(|b| b.items.len()).collect();
        let results = self.write_append(sizes.iter().sum(), |tables| {
            for p in batches.into_iter().flat_map(|b| b.items) {
                tables.add(p)?;
            }
            Ok(())
        })?;
        let mut results = results.into_iter();
        Ok(sizes
            .into_iter()
            .map(|n| results.by_ref().take(n).collect())
            .collect())
    }

    /// The write half of every append: one durable transaction in which `insert` adds the
    /// prepared messages (`expected` of them) to the append tables; the results in order.
    fn write_append(
        &self,
        expected: usize,
        insert: impl FnOnce(&mut AppendTables<'_>) -> Result<()>,
    ) -> Result<Vec<Appended>> {
        let txn = self.db.begin_write()?;
        let results = {
            let mut tables = AppendTables::open(&txn, expected, self.counting())?;
            insert(&mut tables)?;
            tables.finish()?
        };
        txn.commit()?;
        Ok(results)
    }

    /// Counts tokens and encodes records before the write lock is taken. Large batches are
    /// counted on every core: token counting is most of the cost of ingest.
    fn prepare(&self, messages: Vec<(SessionId, NewMessage)>) -> Result<Vec<Prepared>> {
        let counting = self.counting();
        let Some(threads) = parallel_threads(messages.len()) else {
            return messages
                .into_iter()
                .map(|(session, m)| prepare_message(counting, session, m))
                .collect();
        };
        let mut prepared = Vec::with_capacity(messages.len());
        prepare_pipeline(messages, self.counter).run(threads, |counted| {
            for p in encode_counted(counting, counted) {
                prepared.push(p?);
            }
            Ok::<(), StoreError>(())
        })?;
        Ok(prepared)
    }

    // ---------------------------------------------------------------- reads

    /// A consistent snapshot for many reads (one read transaction).
    pub fn reader(&self) -> Result<StoreReader> {
        Ok(StoreReader {
            txn: self.db.begin_read()?,
        })
    }

    /// One message by id.
    pub fn message(&self, id: MessageId) -> Result<Message> {
        self.reader()?.message(id)
    }

    /// The original payload of a message, byte for byte.
    pub fn original(&self, id: MessageId) -> Result<Original> {
        self.reader()?.original(id)
    }

    /// The messages of `session` whose sequence numbers fall in `seqs`, in order.
    pub fn session_messages(&self, session: SessionId, seqs: Range<u64>) -> Result<Vec<Message>> {
        self.reader()?.session_messages(session, seqs)
    }

    /// Totals over the whole store.
    pub fn stats(&self) -> Result<StoreStats> {
        let txn = self.db.begin_read()?;
        let sessions = txn.open_table(tables::SESSIONS)?;
        let mut tokens = 0;
        let mut messages = 0;
        for entry in sessions.iter()? {
            let (_, bytes) = entry?;
            let record: SessionRecord = codec::decode("sessions", bytes.value())?;
            tokens += record.token_total;
            messages += record.message_count;
        }
        let meta_table = txn.open_table(tables::META)?;
        let watermark = meta_table
            .get(meta::INDEX_WATERMARK)?
            .map_or(0, |v| v.value());
        Ok(StoreStats {
            sessions: sessions.len()?,
            messages,
            tokens,
            index_watermark: MessageId(watermark),
            file_bytes: self
                .path
                .as_ref()
                .and_then(|p| std::fs::metadata(p).ok())
                .map(|m| m.len()),
        })
    }

    /// The id the next appended message will get (one past the newest).
    pub fn next_message_id(&self) -> Result<MessageId> {
        let txn = self.db.begin_read()?;
        let meta_table = txn.open_table(tables::META)?;
        Ok(MessageId(
            meta_table.get(meta::NEXT_MESSAGE)?.map_or(0, |v| v.value()),
        ))
    }

    /// The index watermark recorded in the store: messages below it are indexed.
    pub fn index_watermark(&self) -> Result<MessageId> {
        let txn = self.db.begin_read()?;
        let meta_table = txn.open_table(tables::META)?;
        Ok(MessageId(
            meta_table
                .get(meta::INDEX_WATERMARK)?
                .map_or(0, |v| v.value()),
        ))
    }

    /// Records how far the search index has caught up (called by the index after it commits).
    pub fn set_index_watermark(&self, watermark: MessageId) -> Result<()> {
        let txn = self.db.begin_write()?;
        {
            let mut meta_table = txn.open_table(tables::META)?;
            meta_table.insert(meta::INDEX_WATERMARK, watermark.0)?;
        }
        txn.commit()?;
        Ok(())
    }
}

/// A read snapshot of the store; every read through it sees the same state.
pub struct StoreReader {
    pub(crate) txn: ReadTransaction,
}

impl StoreReader {
    /// One message by id.
    pub fn message(&self, id: MessageId) -> Result<Message> {
        self.try_message(id)?.ok_or(StoreError::MessageNotFound(id))
    }

    /// One message by id, `None` if absent.
    pub fn try_message(&self, id: MessageId) -> Result<Option<Message>> {
        let table = self.txn.open_table(tables::MESSAGES)?;
        let Some(stored) = message_rows::get(&table, id.0)? else {
            return Ok(None);
        };
        Ok(Some(RecordView::read(stored.bytes())?.to_message(id)?))
    }

    /// The original payload of a message, byte for byte as the host gave it; for a message
    /// given without one, its rendering in lcm's own JSONL format.
    pub fn original(&self, id: MessageId) -> Result<Original> {
        let table = self.txn.open_table(tables::MESSAGES)?;
        let stored = message_rows::get(&table, id.0)?.ok_or(StoreError::MessageNotFound(id))?;
        let record = RecordView::read(stored.bytes())?;
        if !record.has_original() {
            let session = self.session(record.session())?;
            let message = NewMessage {
                role: record.role(),
                parts: record.parts()?,
                created_at: record.created_at(),
                original: None,
                source_key: record.source_key()?.map(str::to_owned),
            };
            return Ok(Original {
                format: SourceFormat::Lcm,
                bytes: lcm_format::to_line(&session.key, &message).into_bytes(),
            });
        }
        let originals = self.txn.open_table(tables::ORIGINALS)?;
        let bytes = originals.get(id.0)?.ok_or_else(|| StoreError::Corrupt {
            table: "originals",
            detail: format!("{id} has a record but no original"),
        })?;
        Ok(Original {
            format: record.source(),
            bytes: bytes.value().to_vec(),
        })
    }

    /// One session's record.
    pub fn session(&self, id: SessionId) -> Result<SessionInfo> {
        let sessions = self.txn.open_table(tables::SESSIONS)?;
        let bytes = sessions.get(id.0)?.ok_or(StoreError::SessionNotFound(id))?;
        let record: SessionRecord = codec::decode("sessions", bytes.value())?;
        Ok(record.into_info(id.0))
    }

    /// The messages of `session` with sequence numbers in `seqs`, in order.
    pub fn session_messages(&self, session: SessionId, seqs: Range<u64>) -> Result<Vec<Message>> {
        let mut out = Vec::new();
        self.for_each_in_session(session, seqs, |m| {
            out.push(m);
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Visits the messages of `session` with sequence numbers in `seqs`, in order.
    pub fn for_each_in_session(
        &self,
        session: SessionId,
        seqs: Range<u64>,
        mut visit: impl FnMut(Message) -> ControlFlow<()>,
    ) -> Result<()> {
        let every = MessageId(0)..MessageId(u64::MAX);
        self.session_records(session, seqs, every, |id, bytes| {
            Ok(visit(RecordView::read(bytes)?.to_message(id)?))
        })
    }

    /// Visits every message with an id in `ids`, in id order (append order across sessions).
    pub fn for_each_message(
        &self,
        ids: Range<MessageId>,
        mut visit: impl FnMut(Message) -> ControlFlow<()>,
    ) -> Result<()> {
        self.range_records(ids, |id, bytes| {
            Ok(visit(RecordView::read(bytes)?.to_message(id)?))
        })
    }

    /// The stored bytes of the messages `ids` that exist, in the order given (grep reads them
    /// through [`crate::record::RecordView`]); the bytes live as long as one call of `visit`. Ascending ids
    /// read each row once.
    pub fn records_of(
        &self,
        ids: impl IntoIterator<Item = MessageId>,
        mut visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let records = self.txn.open_table(tables::MESSAGES)?;
        let mut cursor = message_rows::RecordCursor::new(&records);
        for id in ids {
            let Some(bytes) = cursor.get(id.0)? else {
                continue;
            };
            if visit(id, bytes)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// The stored bytes of every message with an id in `ids`, in id order; the bytes live as
    /// long as one call of `visit`.
    pub fn range_records(
        &self,
        ids: Range<MessageId>,
        mut visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let records = self.txn.open_table(tables::MESSAGES)?;
        // A break from `visit` only ends the walk.
        message_rows::for_each(&records, ids.start.0..ids.end.0, |id, bytes| {
            visit(MessageId(id), bytes)
        })
        .map(|_flow| ())
    }

    /// [`Self::range_records`], with each record's row (a scan tests whole packs at once); the
    /// visitor may skip the rest of a row.
    pub fn range_records_in_rows(
        &self,
        ids: Range<MessageId>,
        visit: impl FnMut(InRow<'_>) -> Result<Step>,
    ) -> Result<()> {
        let records = self.txn.open_table(tables::MESSAGES)?;
        // A break from `visit` only ends the walk.
        message_rows::for_each_in_rows(&records, ids.start.0..ids.end.0, visit).map(|_flow| ())
    }

    /// The ids of the messages of `session`, as ascending, disjoint ranges (one per run of
    /// consecutive ids; ids grow with the sequence within a session).
    pub fn session_id_ranges(&self, session: SessionId) -> Result<Vec<Range<u64>>> {
        self.session(session)?;
        let index = self.txn.open_table(tables::SESSION_RUNS)?;
        let mut ranges: Vec<Range<u64>> = Vec::new();
        for run in session_runs::runs_in(&index, session.0, 0..u64::MAX)? {
            let run = run?;
            let ids = run.first_id..run.first_id.saturating_add(run.len);
            match ranges.last_mut() {
                Some(last) if last.end == ids.start => last.end = ids.end,
                _ => ranges.push(ids),
            }
        }
        Ok(ranges)
    }

    /// The stored bytes of the messages of `session` with sequence numbers in `seqs` and ids
    /// in `ids`, in order; the bytes live as long as one call of `visit`. (Ids grow with the
    /// sequence within a session, so the walk ends at the first id past `ids`.)
    pub fn session_records(
        &self,
        session: SessionId,
        seqs: Range<u64>,
        ids: Range<MessageId>,
        mut visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        self.session_records_in_rows(session, seqs, ids, |r| {
            Ok(match visit(MessageId(r.id), r.record)? {
                ControlFlow::Continue(()) => Step::Next,
                ControlFlow::Break(()) => Step::Stop,
            })
        })
    }

    /// [`Self::session_records`], with each record's row; the visitor may skip the rest of a
    /// row (within the session's run).
    pub fn session_records_in_rows(
        &self,
        session: SessionId,
        seqs: Range<u64>,
        ids: Range<MessageId>,
        mut visit: impl FnMut(InRow<'_>) -> Result<Step>,
    ) -> Result<()> {
        self.session(session)?;
        let index = self.txn.open_table(tables::SESSION_RUNS)?;
        let records = self.txn.open_table(tables::MESSAGES)?;
        for run in session_runs::runs_in(&index, session.0, seqs.clone())? {
            let run = run?;
            // The run's messages within `seqs`, as ids, within `ids`.
            let within = run.ids_within(&seqs);
            let from = within.start.max(ids.start.0);
            let to = within.end.min(ids.end.0);
            if from >= ids.end.0 {
                break;
            }
            if from >= to {
                continue;
            }
            // Every id of the run must be stored: a gap is damage, reported below.
            let mut expected = from;
            let mut gap = false;
            let flow = message_rows::for_each_in_rows(&records, from..to, |r| {
                if r.id != expected {
                    gap = true;
                    return Ok(Step::Stop);
                }
                let rest = r.rest;
                let step = visit(r)?;
                match step {
                    Step::Next => expected += 1,
                    Step::SkipRow => expected += rest,
                    Step::Stop => {}
                }
                Ok(step)
            })?;
            if flow.is_break() && !gap {
                return Ok(());
            }
            if expected < to {
                return Err(StoreError::Corrupt {
                    table: "session_runs",
                    detail: format!("points at missing message msg_{expected}"),
                });
            }
        }
        Ok(())
    }
}

pub(crate) fn next_counter(meta_table: &mut redb::Table<&str, u64>, key: &str) -> Result<u64> {
    let next = meta_table.get(key)?.map_or(0, |v| v.value());
    meta_table.insert(key, next + 1)?;
    Ok(next)
}

/// Counts the tokens of `m` and encodes its record (all but session and sequence number): the
/// half of an append that needs no transaction.
fn prepare_message(counting: Counting, session: SessionId, m: NewMessage) -> Result<Prepared> {
    // A part that may pass the large-file threshold is counted on its own, once: the parts'
    // counts add up to the message's, and registering its file record needs them.
    let threshold = counting.files.large_file_tokens as usize;
    if m.parts.iter().any(|p| encoded_len_hint(p) > threshold) {
        let parts: Vec<u64> = m
            .parts
            .iter()
            .map(|p| counting.counter.count_part(p))
            .collect();
        let total =
            u64::from(lcm_core::tokens::MESSAGE_OVERHEAD_TOKENS) + parts.iter().sum::<u64>();
        let token_count = u32::try_from(total).unwrap_or(u32::MAX);
        return encode_message(counting, session, m, token_count, Some(&parts));
    }
    let token_count = counting.counter.count_message(m.role, &m.parts);
    encode_message(counting, session, m, token_count, None)
}

/// What preparing a message needs: the token counter and the store's file rules.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Counting {
    pub counter: TokenCounter,
    pub files: FileRules,
}

/// `m`'s record, encoded, with its token count.
fn encode_message(
    counting: Counting,
    session: SessionId,
    m: NewMessage,
    token_count: u32,
    part_tokens: Option<&[u64]>,
) -> Result<Prepared> {
    let files = FileCandidates::of(
        &m.parts,
        token_count,
        part_tokens,
        counting.files,
        counting.counter,
    );
    let (source, original) = match m.original {
        Some(Original { format, bytes }) => (format, Some(bytes)),
        None => (SourceFormat::Lcm, None),
    };
    let mut record = Vec::new();
    record::encode(
        &RecordFields {
            session,
            seq: 0,
            role: m.role,
            created_at: m.created_at,
            token_count,
            source,
            has_original: original.is_some(),
            parts: &m.parts,
            source_key: m.source_key.as_deref(),
        },
        &mut record,
    )?;
    Ok(Prepared {
        session: session.0,
        created_at: m.created_at,
        token_count,
        files,
        record,
        original,
        source_key: m.source_key,
    })
}

/// Batches of at least this many messages are prepared on several threads: through a
/// [`prepare_pipeline`] by an append, on every core by [`Store::prepare_append`].
const PARALLEL_MIN_BATCH: usize = 256;
/// The threads to prepare a batch of `len` messages on, or `None` to prepare it on the calling
/// thread alone (a small batch, or a single core).
fn parallel_threads(len: usize) -> Option<usize> {
    let threads = lcm_core::cores::cores();
    (threads >= 2 && len >= PARALLEL_MIN_BATCH).then_some(threads)
}

/// Messages per chunk of a [`prepare_pipeline`]: small enough that the writing thread starts
/// inserting soon, large enough that handing chunks over costs nothing measurable.
const PIPELINE_CHUNK: usize = 64;

/// A message on its way into the store, with the session it goes to.
type Incoming = (SessionId, NewMessage);

/// A chunk of messages handed back with their token counts, in order.
type Counted = (Vec<Incoming>, Vec<u32>);

/// The records of a counted chunk, encoded in order (on the thread that frees the messages).
fn encode_counted(
    counting: Counting,
    (chunk, counts): Counted,
) -> impl Iterator<Item = Result<Prepared>> {
    chunk
        .into_iter()
        .zip(counts)
        .map(move |((session, m), token_count)| {
            encode_message(counting, session, m, token_count, None)
        })
}

/// A large append's messages in chunks of [`PIPELINE_CHUNK`], their tokens counted on the helper
/// pool and the writing thread ([`OrderedPipeline`]), handed back to the writer in order with
/// their counts. Helpers only count: the writer encodes, and the messages come back to be freed
/// on the thread that allocated them. (With glibc's allocator, records allocated on a helper and
/// freed by the writer made two cores prepare a batch of 1,000 in 1.27 ms instead of 1.06-1.12.)
fn prepare_pipeline(
    messages: Vec<Incoming>,
    counter: TokenCounter,
) -> Arc<OrderedPipeline<Vec<Incoming>, Counted>> {
    let mut chunks = Vec::with_capacity(messages.len().div_ceil(PIPELINE_CHUNK));
    let mut iter = messages.into_iter();
    loop {
        let chunk: Vec<_> = iter.by_ref().take(PIPELINE_CHUNK).collect();
        if chunk.is_empty() {
            break;
        }
        chunks.push(chunk);
    }
    OrderedPipeline::new(chunks, move |chunk: Vec<Incoming>| {
        let counts = chunk
            .iter()
            .map(|(_, m)| counter.count_message(m.role, &m.parts))
            .collect();
        (chunk, counts)
    })
}

/// The tables an append writes, open in one write transaction, and what the append has
/// changed so far: the other half of an append, shared by every way of appending.
struct AppendTables<'t> {
    meta: redb::Table<'t, &'static str, u64>,
    sessions: redb::Table<'t, u64, &'static [u8]>,
    records: redb::Table<'t, u64, &'static [u8]>,
    originals: redb::Table<'t, u64, &'static [u8]>,
    session_runs: redb::Table<'t, (u64, u64), (u64, u64)>,
    source_keys: redb::Table<'t, (u64, &'static str), u64>,
    files: FileTables<'t>,
    runs: RunWriter,
    next_id: u64,
    touched: HashMap<u64, SessionRecord>,
    results: Vec<Appended>,
    /// The records written so far, gathered into rows.
    packs: PackWriter,
}

impl<'t> AppendTables<'t> {
    fn open(txn: &'t redb::WriteTransaction, expected: usize, counting: Counting) -> Result<Self> {
        let meta = txn.open_table(tables::META)?;
        let next_id = meta.get(meta::NEXT_MESSAGE)?.map_or(0, |v| v.value());
        Ok(AppendTables {
            meta,
            sessions: txn.open_table(tables::SESSIONS)?,
            records: txn.open_table(tables::MESSAGES)?,
            originals: txn.open_table(tables::ORIGINALS)?,
            session_runs: txn.open_table(tables::SESSION_RUNS)?,
            source_keys: txn.open_table(tables::SOURCE_KEYS)?,
            files: FileTables::open(txn, counting.files, counting.counter)?,
            runs: RunWriter::default(),
            next_id,
            touched: HashMap::new(),
            results: Vec::with_capacity(expected),
            packs: PackWriter::default(),
        })
    }

    /// Inserts one prepared message, unless its source key is already stored in its session.
    fn add(&mut self, mut p: Prepared) -> Result<()> {
        if let Some(key) = &p.source_key
            && let Some(existing) = self.source_keys.get((p.session, key.as_str()))?
        {
            self.results.push(Appended {
                id: MessageId(existing.value()),
                inserted: false,
            });
            return Ok(());
        }
        let session = match self.touched.entry(p.session) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let bytes = self
                    .sessions
                    .get(p.session)?
                    .ok_or(StoreError::SessionNotFound(SessionId(p.session)))?;
                e.insert(codec::decode("sessions", bytes.value())?)
            }
        };
        let id = self.next_id;
        self.next_id += 1;
        let seq = session.message_count;
        session.message_count += 1;
        session.token_total += u64::from(p.token_count);
        session.first_message_at.get_or_insert(p.created_at);
        session.last_message_at = Some(p.created_at);

        // The record encoded by `prepare_message`, with its sequence number now known.
        record::set_seq(&mut p.record, seq);
        self.packs.push(&mut self.records, id, &p.record)?;
        if let Some(original) = &p.original {
            self.originals.insert(id, original.as_slice())?;
        }
        self.runs.push(&mut self.session_runs, p.session, seq, id)?;
        if let Some(key) = &p.source_key {
            self.source_keys.insert((p.session, key.as_str()), id)?;
        }
        if !p.files.is_empty() {
            let record = &p.record;
            let parts = || -> Result<Vec<Part>> { RecordView::read(record)?.parts() };
            let appending = Appending {
                id,
                session: p.session,
                token_count: p.token_count,
                created_at: p.created_at,
                parts: &parts,
            };
            self.files.add(&mut self.meta, appending, &p.files)?;
        }
        self.results.push(Appended {
            id: MessageId(id),
            inserted: true,
        });
        Ok(())
    }

    /// Writes the sessions' new counters, their message runs and the next message id; the
    /// results in order.
    fn finish(mut self) -> Result<Vec<Appended>> {
        self.packs.flush(&mut self.records)?;
        self.runs.finish(&mut self.session_runs)?;
        for (id, record) in &self.touched {
            self.sessions
                .insert(*id, codec::encode(record).as_slice())?;
        }
        self.meta.insert(meta::NEXT_MESSAGE, self.next_id)?;
        Ok(self.results)
    }
}

/// The oldest schema this build reads without migrating it. Schema 6 changed the layout of
/// every message record, so an older store must be opened writable once (which migrates it)
/// before a read-only open can read it; a read-only open of one says so.
const READABLE_AS_IS: u64 = 6;

/// What a store file holds, as [`Store::layout`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Nothing yet (a new file), or an initialisation that never committed.
    Uninitialised,
    /// This build's schema, every table present.
    Current,
    /// An older schema, which a writable open migrates.
    Older(u64),
}

/// Checks every message of a batch before anything is prepared or written.
fn validate_batch(messages: &[(SessionId, NewMessage)]) -> Result<()> {
    for (i, (_, m)) in messages.iter().enumerate() {
        validate_message(m).map_err(|e| match e {
            StoreError::InvalidMessage(detail) if messages.len() > 1 => {
                StoreError::InvalidMessage(format!("message {i} of the batch: {detail}"))
            }
            other => other,
        })?;
    }
    Ok(())
}

fn validate_session_key(key: &str) -> Result<()> {
    if key.trim().is_empty() {
        return Err(StoreError::InvalidMessage(
            "a session key must not be empty".into(),
        ));
    }
    if key.len() > 1024 {
        return Err(StoreError::InvalidMessage(format!(
            "a session key must be at most 1024 bytes, got {}",
            key.len()
        )));
    }
    Ok(())
}

fn validate_message(m: &NewMessage) -> Result<()> {
    if m.parts.is_empty() {
        return Err(StoreError::InvalidMessage(
            "a message needs at least one part".into(),
        ));
    }
    if let Some(key) = &m.source_key
        && (key.is_empty() || key.len() > 1024)
    {
        return Err(StoreError::InvalidMessage(format!(
            "a source key must be 1 to 1024 bytes, got {}",
            key.len()
        )));
    }
    Ok(())
}

/// Bytes at the start of a redb file that hold its magic number.
const REDB_MAGIC_LEN: usize = 9;
/// redb's header fits in the file's first page.
const REDB_HEADER_PAGE: u64 = 4096;

/// Empties the store file at `path` if its creation was interrupted, and says whether it did.
///
/// redb creates a file in two synced steps: the file grown and a header without its magic
/// number written, then the magic number. A crash between the two (SIGKILL, or a power loss
/// during the very first open: the power-loss tests found it) leaves a file redb refuses for
/// ever ("Not a redb database: magic number mismatch"), although nothing was ever committed to
/// it. Such a file (zeros where the magic number goes, and nothing but zeros after the header
/// page) holds nothing: it is emptied, and redb then creates the store. Any other file is left
/// as it is. Checked under an exclusive lock: a process creating the file holds one (redb's
/// whole-file lock), and its half-made file is then left alone: a file locked elsewhere is an
/// error of kind `WouldBlock`. Costs one read of a few bytes when the file has its magic
/// number (every store but an interrupted one).
fn reset_interrupted_creation(path: &Path) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(file) => file,
        // A new store: nothing was interrupted.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    let len = file.metadata()?.len();
    let mut magic = [0u8; REDB_MAGIC_LEN];
    let magic = &mut magic[..usize::try_from(len)
        .unwrap_or(REDB_MAGIC_LEN)
        .min(REDB_MAGIC_LEN)];
    file.read_exact(magic)?;
    if len == 0 || magic.iter().any(|&b| b != 0) {
        return Ok(false);
    }
    file.seek(SeekFrom::Start(REDB_HEADER_PAGE.min(len)))?;
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut chunk)?;
        if read == 0 {
            break;
        }
        if chunk[..read].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
    file.set_len(0)?;
    file.sync_all()?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::message::Role;
    use redb::ReadableDatabase;

    #[test]
    fn a_file_whose_creation_was_interrupted_is_created_again_and_no_other_file_is_touched() {
        let dir = tempfile::tempdir().unwrap();
        let options =
            || StoreOptions::new(TokenCounter::new(lcm_core::tokens::Encoding::O200kBase));
        // What redb leaves between its two syncs: the file grown, a header without magic.
        let interrupted = dir.path().join("interrupted.redb");
        let mut bytes = vec![0u8; 1 << 20];
        bytes[REDB_MAGIC_LEN..64].fill(7);
        std::fs::write(&interrupted, &bytes).unwrap();
        let store = Store::open(&interrupted, options()).unwrap();
        let session = store.create_session("s", None).unwrap();
        store
            .append(session, NewMessage::text(Role::User, "stored"))
            .unwrap();
        drop(store);
        // Not a redb file, but data after the header page: refused and left as it was.
        let foreign = dir.path().join("foreign.redb");
        bytes[REDB_HEADER_PAGE as usize + 10] = 1;
        std::fs::write(&foreign, &bytes).unwrap();
        assert!(Store::open(&foreign, options()).is_err());
        assert_eq!(std::fs::read(&foreign).unwrap(), bytes);
    }

    /// An interrupted file held for a moment (by a child process forked while this process had
    /// it open, say) is checked once it is free, not skipped: skipped, redb would refuse it
    /// for ever as "not a redb database".
    #[test]
    fn an_interrupted_creation_held_for_a_moment_is_reset_once_free() {
        let dir = tempfile::tempdir().unwrap();
        let interrupted = dir.path().join("interrupted.redb");
        let mut bytes = vec![0u8; 1 << 20];
        bytes[REDB_MAGIC_LEN..64].fill(7);
        std::fs::write(&interrupted, &bytes).unwrap();
        let holder = std::fs::File::open(&interrupted).unwrap();
        holder.lock().unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(150));
            drop(holder);
        });
        let store = Store::open(&interrupted, options()).unwrap();
        release.join().unwrap();
        let session = store.create_session("s", None).unwrap();
        store
            .append(session, NewMessage::text(Role::User, "stored"))
            .unwrap();
        assert_eq!(store.stats().unwrap().messages, 1);
    }

    /// An append encodes its records before the transaction assigns their sequence numbers
    /// (`record::set_seq` fills them in): what is read back carries the assigned ones.
    #[test]
    fn records_encoded_before_the_transaction_carry_their_sequence_numbers() {
        let store = Store::open_in_memory(options()).unwrap();
        let a = store.create_session("a", None).unwrap();
        let b = store.create_session("b", None).unwrap();
        let batch: Vec<(SessionId, NewMessage)> = (0..10)
            .map(|k| (if k % 3 == 0 { b } else { a }, varied_message(k)))
            .collect();
        store.append_mixed(batch).unwrap();
        for (session, n) in [(a, 6), (b, 4)] {
            let read = store.session_messages(session, 0..u64::MAX).unwrap();
            let seqs: Vec<u64> = read.iter().map(|m| m.seq).collect();
            assert_eq!(seqs, (0..n).collect::<Vec<u64>>());
        }
    }

    fn options() -> StoreOptions {
        StoreOptions::new(TokenCounter::new(lcm_core::tokens::Encoding::O200kBase))
    }

    #[test]
    fn a_reopened_store_reads_what_was_written_and_appends_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let (session, id) = {
            let store = Store::open(&path, options()).unwrap();
            let session = store.create_session("s", None).unwrap();
            let id = store
                .append(session, NewMessage::text(Role::User, "hello"))
                .unwrap()
                .id;
            (session, id)
        };
        let store = Store::open(&path, options()).unwrap();
        assert_eq!(store.message(id).unwrap().search_text(), "hello");
        let next = store
            .append(session, NewMessage::text(Role::Assistant, "again"))
            .unwrap();
        assert_eq!(next.id.0, id.0 + 1);
        assert_eq!(store.session(session).unwrap().message_count, 2);
    }

    /// A page cache far smaller than the store (`[storage] cache_mib = 1` against 6 MB of
    /// messages) bounds memory only: everything written reads back, before and after a reopen.
    #[test]
    fn a_store_much_larger_than_its_page_cache_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let config = lcm_core::config::Config::from_toml("[storage]\ncache_mib = 1\n").unwrap();
        let small = || StoreOptions::from_config(&config);
        assert_eq!(small().cache_bytes, 1 << 20);
        let text = |i: usize| format!("message {i}: {}", "lossless context ".repeat(60));
        let session = {
            let store = Store::open(&path, small()).unwrap();
            let session = store.create_session("s", None).unwrap();
            for chunk in (0..6_000).collect::<Vec<_>>().chunks(500) {
                let batch = chunk
                    .iter()
                    .map(|&i| NewMessage::text(Role::User, text(i)))
                    .collect();
                store.append_batch(session, batch).unwrap();
            }
            session
        };
        assert!(std::fs::metadata(&path).unwrap().len() > 6 << 20);
        let store = Store::open(&path, small()).unwrap();
        let read = store.session_messages(session, 0..u64::MAX).unwrap();
        assert_eq!(read.len(), 6_000);
        for (i, message) in read.iter().enumerate() {
            assert_eq!(message.search_text(), text(i));
        }
    }

    #[test]
    fn a_store_of_a_newer_schema_is_refused_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        drop(Store::open(&path, options()).unwrap());
        {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(tables::META)
                .unwrap()
                .insert(meta::SCHEMA_VERSION, tables::STORE_SCHEMA + 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let err = Store::open(&path, options()).expect_err("refused");
        assert!(matches!(err, StoreError::NewerSchema { .. }), "{err}");
        let db = Database::create(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let version = txn
            .open_table(tables::META)
            .unwrap()
            .get(meta::SCHEMA_VERSION)
            .unwrap()
            .map(|v| v.value());
        assert_eq!(version, Some(tables::STORE_SCHEMA + 1), "left as it was");
    }

    /// A schema-2 store (plain rows of layout-1 records) is refused by a read-only open, which
    /// says what to do and writes nothing; its first writable open migrates it to the current
    /// schema (records in the current layout), and batched appends then add packs beside the
    /// plain rows.
    #[test]
    fn a_schema_2_store_is_migrated_and_takes_packs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let session = {
            let store = Store::open(&path, options()).unwrap();
            let session = store.create_session("s", None).unwrap();
            for k in 0..5 {
                store.append(session, varied_message(k)).unwrap();
            }
            session
        };
        let set_version = |version: u64| {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            assert_eq!(record_migration::write_layout_1(&txn).unwrap(), 5);
            txn.open_table(tables::META)
                .unwrap()
                .insert(meta::SCHEMA_VERSION, version)
                .unwrap();
            txn.commit().unwrap();
        };
        let version = || {
            let db = Database::create(&path).unwrap();
            let txn = db.begin_read().unwrap();
            let meta_table = txn.open_table(tables::META).unwrap();
            meta_table
                .get(meta::SCHEMA_VERSION)
                .unwrap()
                .map(|v| v.value())
        };
        set_version(2);
        let file = std::fs::read(&path).unwrap();
        let err = Store::open_read_only(&path, options()).expect_err("needs migration");
        assert!(
            matches!(err, StoreError::OlderSchema { found: 2, .. }),
            "{err}"
        );
        assert!(
            err.to_string().contains("writable open upgrades it"),
            "{err}"
        );
        assert!(std::fs::read(&path).unwrap() == file, "nothing written");
        assert_eq!(version(), Some(2), "a read-only open writes nothing");
        let store = Store::open(&path, options()).unwrap();
        let read = store.session_messages(session, 0..u64::MAX).unwrap();
        assert_eq!(read.len(), 5);
        assert_eq!(read[3].parts, varied_message(3).parts);
        drop(store);
        assert_eq!(version(), Some(tables::STORE_SCHEMA));
        let store = Store::open(&path, options()).unwrap();
        let batch: Vec<NewMessage> = (5..300).map(varied_message).collect();
        store.append_batch(session, batch).unwrap();
        let read = store.session_messages(session, 0..u64::MAX).unwrap();
        assert_eq!(read.len(), 300);
        for (k, m) in read.iter().enumerate() {
            assert_eq!(m.parts, varied_message(k).parts, "message {k}");
            assert_eq!(m.seq, k as u64);
        }
        assert!(crate::integrity::check(&store, None).unwrap().is_clean());
    }

    /// A batch is stored in packs; every read path gives each message back as appended: by id,
    /// by id range from any start, by session and sequence range, point reads in order, the
    /// original.
    #[test]
    fn messages_in_packs_read_back_through_every_path() {
        let store = Store::open_in_memory(options()).unwrap();
        let a = store.create_session("a", None).unwrap();
        let b = store.create_session("b", None).unwrap();
        let single = store.append(a, varied_message(0)).unwrap().id;
        // Interleaved sessions in one batch, some messages large enough to close packs early.
        let batch: Vec<(SessionId, NewMessage)> = (1..400)
            .map(|k| {
                let mut m = varied_message(k);
                if k % 37 == 0 {
                    m.parts.push(Part::Text {
                        text: "x".repeat(9_000),
                    });
                }
                (if k % 3 == 0 { b } else { a }, m)
            })
            .collect();
        let expected: Vec<(SessionId, NewMessage)> = batch.clone();
        let appended = store.append_mixed(batch).unwrap();
        let rows = {
            let txn = store.db.begin_read().unwrap();
            txn.open_table(tables::MESSAGES).unwrap().len().unwrap()
        };
        assert!(rows < 60, "399 messages in packs, {rows} rows");

        let reader = store.reader().unwrap();
        for ((session, m), got) in expected.iter().zip(&appended) {
            let read = reader.message(got.id).unwrap();
            assert_eq!((read.session, &read.parts), (*session, &m.parts));
            assert_eq!(
                reader.original(got.id).unwrap().bytes,
                store.original(got.id).unwrap().bytes
            );
        }
        assert_eq!(
            reader.message(single).unwrap().parts,
            varied_message(0).parts
        );
        assert!(matches!(
            reader.message(MessageId(400)),
            Err(StoreError::MessageNotFound(_))
        ));
        for start in [0u64, 1, 2, 63, 64, 65, 200, 399, 400] {
            let mut ids = Vec::new();
            reader
                .for_each_message(MessageId(start)..MessageId(start + 70), |m| {
                    ids.push(m.id.0);
                    ControlFlow::Continue(())
                })
                .unwrap();
            let want: Vec<u64> = (start..(start + 70).min(400)).collect();
            assert_eq!(ids, want, "from {start}");
        }
        let b_all = reader.session_messages(b, 0..u64::MAX).unwrap();
        assert_eq!(b_all.len(), 133);
        let b_mid = reader.session_messages(b, 40..50).unwrap();
        assert_eq!(b_mid, b_all[40..50].to_vec());
        let mut points = Vec::new();
        reader
            .records_of((0..400).step_by(7).map(MessageId), |id, bytes| {
                points.push((id.0, RecordView::read(bytes)?.seq()));
                Ok(ControlFlow::Continue(()))
            })
            .unwrap();
        assert_eq!(points.len(), 58);
        for (id, seq) in points {
            assert_eq!(reader.message(MessageId(id)).unwrap().seq, seq);
        }
        assert!(crate::integrity::check(&store, None).unwrap().is_clean());
    }

    /// Each session's messages, read through its message list.
    fn sessions_read(store: &Store) -> Vec<(SessionId, Vec<Message>)> {
        store
            .sessions()
            .unwrap()
            .into_iter()
            .map(|s| (s.id, store.session_messages(s.id, 0..u64::MAX).unwrap()))
            .collect()
    }

    /// A store written by schema 1 (one `session_messages` row per message) is refused by a
    /// read-only open with a clear error and nothing written, and migrated by a writable open:
    /// every session reads the same, the integrity check is clean, appends go on.
    #[test]
    fn a_schema_1_store_is_migrated_by_a_writable_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let (a, b, before) = {
            let store = Store::open(&path, options()).unwrap();
            let a = store.create_session("a", None).unwrap();
            let b = store.create_session("b", None).unwrap();
            // Interleaved (a run per message), then a stretch of a alone (one run).
            let mut batch: Vec<(SessionId, NewMessage)> = (0..40)
                .map(|k| (if k % 2 == 0 { a } else { b }, varied_message(k)))
                .collect();
            batch.extend((40..100).map(|k| (a, varied_message(k))));
            store.append_mixed(batch).unwrap();
            (a, b, sessions_read(&store))
        };
        assert_eq!(session_runs::rewrite_as_v1(&path), 100);
        let file = std::fs::read(&path).unwrap();
        let err = Store::open_read_only(&path, options()).expect_err("needs migration");
        assert!(
            matches!(
                err,
                StoreError::OlderSchema {
                    found: 1,
                    current: tables::STORE_SCHEMA,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string().contains("writable open upgrades it"),
            "{err}"
        );
        assert!(std::fs::read(&path).unwrap() == file, "nothing written");

        let store = Store::open(&path, options()).unwrap();
        assert_eq!(sessions_read(&store), before);
        let report = crate::integrity::check(&store, None).unwrap();
        assert!(report.is_clean(), "{report:#?}");
        {
            let txn = store.db.begin_read().unwrap();
            let meta_table = txn.open_table(tables::META).unwrap();
            let version = meta_table.get(meta::SCHEMA_VERSION).unwrap().unwrap();
            assert_eq!(version.value(), tables::STORE_SCHEMA);
            // a: 20 interleaved runs and one of 60 (a#19 and a#20 are not consecutive ids);
            // b: 20 interleaved runs.
            assert_eq!(
                txn.open_table(tables::SESSION_RUNS).unwrap().len().unwrap(),
                41
            );
            let names: Vec<String> = txn
                .list_tables()
                .unwrap()
                .map(|t| t.name().to_owned())
                .collect();
            assert!(!names.iter().any(|n| n == "session_messages"), "{names:?}");
        }
        let next = store.append(a, varied_message(100)).unwrap();
        assert_eq!(store.session_messages(a, 80..81).unwrap()[0].id, next.id);
        assert_eq!(store.session(b).unwrap().message_count, 20);
        assert!(crate::integrity::check(&store, None).unwrap().is_clean());
    }

    /// A varied message: text of several lengths, tool calls and results, some with originals
    /// and source keys (the pipeline must prepare and insert each exactly like a small batch).
    fn varied_message(k: usize) -> NewMessage {
        let mut m = match k % 4 {
            0 => NewMessage::text(
                Role::User,
                format!("question {k}: {}", "why ".repeat(k % 50)),
            ),
            1 => NewMessage {
                role: Role::Assistant,
                parts: vec![
                    Part::Reasoning {
                        text: format!("thinking about {k}"),
                    },
                    Part::ToolCall {
                        id: format!("call_{k}"),
                        name: "grep".into(),
                        arguments: format!("{{\"pattern\": \"ERR_{k}\"}}"),
                    },
                ],
                created_at: Timestamp(k as i64),
                original: None,
                source_key: None,
            },
            2 => NewMessage {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: format!("call_{k}"),
                    content: "line of output\n".repeat(k % 200),
                    is_error: k % 8 == 2,
                }],
                created_at: Timestamp(k as i64),
                original: Some(Original {
                    format: SourceFormat::ClaudeCode,
                    bytes: format!("{{\"raw\": {k}}}").into_bytes(),
                }),
                source_key: None,
            },
            _ => NewMessage::text(Role::Assistant, format!("answer {k} ✓ — done")),
        };
        if k.is_multiple_of(5) {
            m.source_key = Some(format!("key-{k}"));
        }
        m.created_at = Timestamp(1_000 + k as i64);
        m
    }

    /// Each session's record but its creation time.
    fn counters(store: &Store) -> Vec<SessionInfo> {
        let sessions = store.sessions().unwrap().into_iter();
        sessions
            .map(|s| SessionInfo {
                created_at: Timestamp(0),
                ..s
            })
            .collect()
    }

    /// Everything stored about the messages of a store, in id order.
    fn stored(store: &Store) -> Vec<(Message, Original)> {
        let end = store.next_message_id().unwrap().0;
        (0..end)
            .map(|id| {
                let id = MessageId(id);
                (store.message(id).unwrap(), store.original(id).unwrap())
            })
            .collect()
    }

    /// A large batch goes through the prepare pipeline (helper threads, chunks taken in
    /// order); small batches do not. Both must store exactly the same records, results and
    /// session counters, across several sessions and with duplicate source keys in the batch.
    #[test]
    fn a_pipelined_append_stores_what_small_appends_store() {
        let pipelined = Store::open_in_memory(options()).unwrap();
        let serial = Store::open_in_memory(options()).unwrap();
        // What the runtime's group writer does: prepare (on every core), then commit.
        let grouped = Store::open_in_memory(options()).unwrap();
        let mut batches = Vec::new();
        for store in [&pipelined, &serial, &grouped] {
            let a = store.create_session("a", None).unwrap();
            let b = store.create_session("b", None).unwrap();
            let batch: Vec<(SessionId, NewMessage)> = (0..1_500)
                .map(|k| {
                    // Every 97th message repeats an earlier source key of its session.
                    let mut m = varied_message(k);
                    if k % 97 == 96 {
                        m.source_key = Some("key-0".into());
                    }
                    (if k % 3 == 0 { a } else { b }, m)
                })
                .collect();
            batches.push(batch);
        }
        let big = batches.remove(0);
        assert!(big.len() >= PARALLEL_MIN_BATCH && big.len() > 10 * PIPELINE_CHUNK);
        let results_pipelined = pipelined.append_mixed(big).unwrap();
        let mut results_serial = Vec::new();
        for chunk in batches.remove(0).chunks(100) {
            results_serial.extend(serial.append_mixed(chunk.to_vec()).unwrap());
        }
        assert_eq!(results_pipelined, results_serial);
        let prepared = grouped.prepare_append(batches.remove(0)).unwrap();
        assert_eq!(prepared.len(), 1_500);
        let results_grouped = grouped.commit_prepared(vec![prepared]).unwrap();
        assert_eq!(results_grouped, vec![results_serial.clone()]);
        assert_eq!(stored(&grouped), stored(&serial));
        // Worked out independently: a key repeats if its session already has it.
        let mut seen = std::collections::HashSet::new();
        let repeats = (0..1_500usize)
            .filter(|k| {
                let key = if k % 97 == 96 {
                    "key-0".to_owned()
                } else {
                    format!("key-{k}")
                };
                (k % 5 == 0 || k % 97 == 96) && !seen.insert((k % 3 == 0, key))
            })
            .count();
        assert!(repeats > 10);
        assert_eq!(
            results_pipelined.iter().filter(|r| !r.inserted).count(),
            repeats
        );
        assert_eq!(counters(&pipelined), counters(&serial));
        let (left, right) = (stored(&pipelined), stored(&serial));
        assert_eq!(left.len(), 1_500 - repeats);
        for ((m1, o1), (m2, o2)) in left.iter().zip(&right) {
            assert_eq!(m1, m2);
            assert_eq!(o1, o2);
            assert_eq!(
                m1.token_count,
                pipelined.counter().count_message(m1.role, &m1.parts)
            );
        }
        // Sequence numbers run without gaps within each session, in append order.
        for session in pipelined.sessions().unwrap() {
            let seqs: Vec<u64> = pipelined
                .session_messages(session.id, 0..u64::MAX)
                .unwrap()
                .iter()
                .map(|m| m.seq)
                .collect();
            assert_eq!(seqs, (0..session.message_count).collect::<Vec<_>>());
        }
    }

    /// The helpers are shared by every append of the process. When they are all busy (here:
    /// blocked by a job of this test), a large append does not wait for them: the writing
    /// thread prepares every chunk itself and the append returns.
    #[test]
    fn a_pipelined_append_does_not_wait_for_busy_helpers() {
        let Some(pool) = crate::pipeline::helper_pool() else {
            panic!("this machine refused the prepare pool's threads");
        };
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let (started, running) = std::sync::mpsc::channel::<()>();
        let blocked = Arc::new(std::sync::Mutex::new(blocked));
        for _ in 0..pool.current_num_threads() {
            let (blocked, started) = (Arc::clone(&blocked), started.clone());
            pool.spawn(move || {
                let blocked = blocked.lock().unwrap_or_else(|e| e.into_inner());
                started.send(()).ok();
                // Holds the lock, so the pool's other threads queue behind it.
                blocked
                    .recv_timeout(std::time::Duration::from_secs(60))
                    .ok();
            });
        }
        running
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a pool thread started the blocking job");

        let store = Store::open_in_memory(options()).unwrap();
        let session = store.create_session("a", None).unwrap();
        let batch: Vec<(SessionId, NewMessage)> =
            (0..2_000).map(|k| (session, varied_message(k))).collect();
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            done.send(store.append_mixed(batch).map(|r| r.len())).ok();
        });
        let appended = result.recv_timeout(std::time::Duration::from_secs(30));
        for _ in 0..pool.current_num_threads() {
            release.send(()).ok();
        }
        assert_eq!(
            appended
                .expect("the append returned while every helper was busy")
                .unwrap(),
            2_000
        );
    }

    /// A large batch that names a missing session fails as a whole: nothing of it is stored.
    #[test]
    fn a_pipelined_append_to_a_missing_session_stores_nothing() {
        let store = Store::open_in_memory(options()).unwrap();
        let session = store.create_session("a", None).unwrap();
        store
            .append(session, NewMessage::text(Role::User, "before"))
            .unwrap();
        let before = (stored(&store), store.sessions().unwrap());
        let batch: Vec<(SessionId, NewMessage)> = (0..1_000)
            .map(|k| {
                let target = if k == 900 { SessionId(77) } else { session };
                (target, varied_message(k))
            })
            .collect();
        let err = store.append_mixed(batch).expect_err("missing session");
        assert!(
            matches!(err, StoreError::SessionNotFound(SessionId(77))),
            "{err}"
        );
        assert_eq!((stored(&store), store.sessions().unwrap()), before);
        assert_eq!(store.next_message_id().unwrap(), MessageId(1));
    }
}
