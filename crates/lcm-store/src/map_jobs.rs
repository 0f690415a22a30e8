//! Database-backed map jobs (`llm_map` / `agentic_map`, paper section 3.1): exactly-once
//! execution of one prompt over every item of a JSONL file, surviving crashes.
//!
//! A job is a [`MapJob`] record plus one item record per input item. Items move through
//!
//! ```text
//!            claim                  complete
//! Pending ----------> Running -------------------> Completed
//!    ^                 |  |  fail, attempts left
//!    +-----------------+  |  (or released / lease expired with attempts left / resume)
//!                         |  fail, no attempts left (or a permanent failure)
//!                         +----------------------> Failed
//! ```
//!
//! Guarantees:
//! - **One result per item.** An item's first committed result (or final failure) is the only
//!   one: a late answer for a finished item is refused as [`CommitOutcome::Duplicate`], an answer
//!   from a claim that is no longer current (its lease expired and the item was claimed again,
//!   or it was released) as [`CommitOutcome::LeaseLost`]. A claim is identified by its owner and
//!   its attempt number; a claim whose lease expired may still commit as long as nobody claimed
//!   the item again.
//! - **Atomic claims.** [`Store::claim`] takes up to `max` items in one write transaction: items
//!   whose lease expired first, then pending items, lowest index first. It reads only the
//!   `map_running` and `map_pending` index tables, never the finished items.
//! - **Leases.** A claimed item carries an expiry; after it, the item can be claimed again (the
//!   expired attempt counts: an item that keeps hanging its worker fails after `max_attempts`).
//! - **Resume.** No worker survives a crash, so at startup [`Store::resume`] (or
//!   [`Store::resume_all`]) puts every running item back to pending, without counting the
//!   interrupted attempt. Completed items are never run again.
//! - **Durability.** Creating a job ends with a durable commit, and so does every commit of a
//!   result. Claims commit without fsync (a claim lost in a crash only means the item is pending
//!   again, which `resume` would do anyway); the next durable commit persists them.
//! - **Invisible until whole.** [`Store::create_job`] streams items in batched transactions
//!   under the status [`JobStatus::Preparing`]; the job becomes [`JobStatus::Running`] (claimable)
//!   only in the last transaction, after every item is written. A job whose input fails to read
//!   is deleted; one left `Preparing` by a crash can be deleted with [`Store::delete_job`].
//! - **Counts.** The job record keeps the number of items in each state, updated in the same
//!   transaction as every transition, so progress is one read. A running job whose items are all
//!   finished becomes [`JobStatus::Completed`] in the transaction that finished the last one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lcm_core::ids::JobId;
use lcm_core::time::Timestamp;
use redb::{
    Durability, ReadOnlyTable, ReadTransaction, ReadableTable, Table, TableDefinition, TableError,
    WriteTransaction,
};
use serde::Serialize;

use crate::codec;
use crate::error::{Result, StoreError};
use crate::store::{Store, next_counter};
use crate::tables::{self, meta};

/// Items written per transaction while a job is created (also bounded by
/// [`CREATE_BATCH_BYTES`]).
pub const CREATE_BATCH_ITEMS: usize = 10_000;
/// Payload bytes written per transaction while a job is created.
pub const CREATE_BATCH_BYTES: usize = 16 << 20;

/// Which operator a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, bincode::Encode, bincode::Decode)]
#[serde(rename_all = "snake_case")]
pub enum MapKind {
    /// One stateless LLM call per item.
    Llm,
    /// One sub-agent session per item.
    Agentic,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, bincode::Encode, bincode::Decode)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Its items are being written; not claimable yet.
    Preparing,
    /// Claimable: some items are pending or running.
    Running,
    /// Every item is completed or failed.
    Completed,
    /// Cancelled: nothing is claimed any more (answers of claims still out are still accepted).
    Cancelled,
    /// Stopped by an error that concerns the whole job (see [`MapJob::error`]).
    Failed,
}

impl JobStatus {
    /// The status's name: `preparing`, `running`, `completed`, `cancelled` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobStatus::Preparing => "preparing",
            JobStatus::Running => "running",
            JobStatus::Completed => "completed",
            JobStatus::Cancelled => "cancelled",
            JobStatus::Failed => "failed",
        }
    }

    /// Whether the job is over (completed, cancelled or failed).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobStatus::Completed | JobStatus::Cancelled | JobStatus::Failed
        )
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a new job is: everything but its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapJobSpec {
    /// The operator.
    pub kind: MapKind,
    /// The JSONL input file (resolved by the caller; stored as given, must be UTF-8).
    pub input_path: PathBuf,
    /// Where the output JSONL goes (must be UTF-8).
    pub output_path: PathBuf,
    /// The per-item instruction.
    pub prompt: String,
    /// The JSON Schema every result must satisfy, as JSON text.
    pub output_schema: String,
    /// Attempts per item before it fails (at least 1).
    pub max_attempts: u32,
    /// Items processed at once (at least 1).
    pub concurrency: u32,
    /// Longest one attempt may take.
    pub timeout: Duration,
    /// The model, when not the provider's default.
    pub model: Option<String>,
    /// For `agentic_map`: whether sub-agents are denied filesystem writes.
    pub read_only: bool,
}

/// One input item, as read from the input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemInput {
    /// Its 1-based line in the input file.
    pub line: u64,
    /// Its content.
    pub content: ItemContent,
}

/// What an input line held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode)]
#[serde(rename_all = "snake_case")]
pub enum ItemContent {
    /// A JSON value (its text).
    Json(String),
    /// A line that is not a usable item, and why (the item is failed at creation).
    Invalid(String),
}

/// Item counts of a job, by state.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode,
)]
pub struct MapProgress {
    /// Every item.
    pub total: u64,
    /// Waiting to be claimed.
    pub pending: u64,
    /// Claimed, not finished.
    pub running: u64,
    /// Finished with a result.
    pub completed: u64,
    /// Finished without one.
    pub failed: u64,
}

impl MapProgress {
    /// Items finished either way.
    pub fn done(&self) -> u64 {
        self.completed + self.failed
    }

    /// Whether every item is finished.
    pub fn is_finished(&self) -> bool {
        self.pending == 0 && self.running == 0
    }
}

/// A map job as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapJob {
    /// Its id, `job_N`.
    pub id: JobId,
    /// The operator.
    pub kind: MapKind,
    /// The JSONL input file.
    pub input_path: PathBuf,
    /// Where the output goes.
    pub output_path: PathBuf,
    /// The per-item instruction.
    pub prompt: String,
    /// The JSON Schema of a result, as JSON text.
    pub output_schema: String,
    /// Attempts per item.
    pub max_attempts: u32,
    /// Items processed at once.
    pub concurrency: u32,
    /// Longest one attempt may take, in milliseconds.
    pub timeout_ms: u64,
    /// The model, when not the provider's default.
    pub model: Option<String>,
    /// For `agentic_map`: no filesystem writes.
    pub read_only: bool,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it completed, was cancelled or failed.
    pub finished_at: Option<Timestamp>,
    /// Where it is in its life.
    pub status: JobStatus,
    /// Why it failed, for [`JobStatus::Failed`].
    pub error: Option<String>,
    /// Its items by state.
    pub progress: MapProgress,
}

impl MapJob {
    /// The per-attempt timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// Where an item is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum ItemState {
    /// Waiting to be claimed.
    Pending,
    /// Claimed by `owner` until `lease_expires_at`.
    Running {
        /// Who claimed it.
        owner: String,
        /// When another worker may take it over.
        lease_expires_at: Timestamp,
    },
    /// Finished with `result` (JSON text).
    Completed {
        /// The result, JSON text.
        result: String,
    },
    /// Finished without a result.
    Failed {
        /// The last error.
        error: String,
    },
}

/// One item of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MapItem {
    /// Its position among the job's items (0-based, input order).
    pub index: u64,
    /// Its 1-based line in the input file.
    pub line: u64,
    /// Its content.
    pub payload: ItemContent,
    /// Where it is.
    pub state: ItemState,
    /// Attempts made (claims, less those interrupted by a crash or released unused).
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// The last invalid-output error, fed back to the model on the next attempt.
    pub feedback: Option<String>,
}

/// An item handed to a worker by [`Store::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedItem {
    /// Its job.
    pub job: JobId,
    /// Its index.
    pub index: u64,
    /// Its 1-based line in the input file.
    pub line: u64,
    /// Its JSON text.
    pub payload: String,
    /// This attempt's number (1-based); commit with it.
    pub attempt: u32,
    /// The claimer; commit with it.
    pub owner: String,
    /// When another worker may take the item over.
    pub lease_expires_at: Timestamp,
    /// The last invalid-output error, to feed back to the model.
    pub feedback: Option<String>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
}

/// How an attempt failed, which decides what happens next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The answer was not valid (not JSON, or not matching the schema): retried while attempts
    /// are left, with the message fed back to the model.
    InvalidOutput,
    /// Something that may go away (timeout, rate limit, server error): retried while attempts
    /// are left.
    Transient,
    /// Retrying cannot help: the item fails now.
    Permanent,
}

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFailure {
    /// What happens next.
    pub kind: FailureKind,
    /// What went wrong.
    pub message: String,
}

impl ItemFailure {
    /// A failure of `kind` saying `message`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        ItemFailure {
            kind,
            message: message.into(),
        }
    }
}

/// The end of one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemOutcome {
    /// A result (JSON text).
    Completed(String),
    /// A failed attempt.
    Failed(ItemFailure),
    /// Given back unused (the worker stopped before the attempt ended): the item is pending
    /// again and the attempt does not count.
    Released,
}

/// The end of one claim, for [`Store::commit_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemReport {
    /// The item.
    pub index: u64,
    /// The claim's owner.
    pub owner: String,
    /// The claim's attempt number.
    pub attempt: u32,
    /// How it ended.
    pub outcome: ItemOutcome,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitOutcome {
    /// Recorded.
    Committed,
    /// The item was already finished: the late answer was discarded.
    Duplicate,
    /// The claim is no longer current (lease expired and the item was claimed again, released
    /// or resumed): the answer was discarded.
    LeaseLost,
}

// ------------------------------------------------------------------------------------ records

#[derive(Debug, Clone, bincode::Encode, bincode::Decode)]
struct JobRecord {
    kind: MapKind,
    input_path: String,
    output_path: String,
    prompt: String,
    output_schema: String,
    max_attempts: u32,
    concurrency: u32,
    timeout_ms: u64,
    model: Option<String>,
    read_only: bool,
    created_at: Timestamp,
    finished_at: Option<Timestamp>,
    status: JobStatus,
    error: Option<String>,
    counts: MapProgress,
}

impl JobRecord {
    fn into_job(self, id: u64) -> MapJob {
        MapJob {
            id: JobId(id),
            kind: self.kind,
            input_path: PathBuf::from(self.input_path),
            output_path: PathBuf::from(self.output_path),
            prompt: self.prompt,
            output_schema: self.output_schema,
            max_attempts: self.max_attempts,
            concurrency: self.concurrency,
            timeout_ms: self.timeout_ms,
            model: self.model,
            read_only: self.read_only,
            created_at: self.created_at,
            finished_at: self.finished_at,
            status: self.status,
            error: self.error,
            progress: self.counts,
        }
    }

    /// A running job with nothing left to do becomes completed.
    fn finish_if_done(&mut self) {
        if self.status == JobStatus::Running && self.counts.is_finished() {
            self.status = JobStatus::Completed;
            self.finished_at = Some(Timestamp::now());
        }
    }
}

#[derive(Debug, Clone, bincode::Encode, bincode::Decode)]
struct ItemRecord {
    line: u64,
    payload: ItemContent,
    state: ItemState,
    attempts: u32,
    last_error: Option<String>,
    feedback: Option<String>,
}

impl ItemRecord {
    fn into_item(self, index: u64) -> MapItem {
        MapItem {
            index,
            line: self.line,
            payload: self.payload,
            state: self.state,
            attempts: self.attempts,
            last_error: self.last_error,
            feedback: self.feedback,
        }
    }
}

const JOBS: &str = "map_jobs";
const ITEMS: &str = "map_items";

fn job_range(job: u64) -> std::ops::RangeInclusive<(u64, u64)> {
    (job, 0)..=(job, u64::MAX)
}

fn expiry(now: Timestamp, lease: Duration) -> Timestamp {
    let ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    Timestamp(now.0.saturating_add(ms))
}

fn path_text(path: &Path, what: &str) -> Result<String> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| StoreError::InvalidJob(format!("the {what} path {path:?} is not UTF-8")))
}

fn is_json(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// The map tables of one write transaction.
struct Tables<'t> {
    jobs: Table<'t, u64, &'static [u8]>,
    items: Table<'t, (u64, u64), &'static [u8]>,
    pending: Table<'t, (u64, u64), ()>,
    running: Table<'t, (u64, u64), i64>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<Self> {
        Ok(Tables {
            jobs: txn.open_table(tables::MAP_JOBS)?,
            items: txn.open_table(tables::MAP_ITEMS)?,
            pending: txn.open_table(tables::MAP_PENDING)?,
            running: txn.open_table(tables::MAP_RUNNING)?,
        })
    }

    fn job(&self, job: u64) -> Result<JobRecord> {
        let bytes = self
            .jobs
            .get(job)?
            .ok_or(StoreError::JobNotFound(JobId(job)))?;
        codec::decode(JOBS, bytes.value())
    }

    fn put_job(&mut self, job: u64, record: &JobRecord) -> Result<()> {
        self.jobs.insert(job, codec::encode(record).as_slice())?;
        Ok(())
    }

    fn item(&self, job: u64, index: u64) -> Result<ItemRecord> {
        let bytes = self
            .items
            .get((job, index))?
            .ok_or_else(|| StoreError::InvalidJob(format!("{} has no item {index}", JobId(job))))?;
        codec::decode(ITEMS, bytes.value())
    }

    fn put_item(&mut self, job: u64, index: u64, record: &ItemRecord) -> Result<()> {
        self.items
            .insert((job, index), codec::encode(record).as_slice())?;
        Ok(())
    }

    /// Running -> Pending or Failed (when it has no attempts left) after its lease expired.
    fn expire(
        &mut self,
        job: u64,
        index: u64,
        record: &mut JobRecord,
        item: &mut ItemRecord,
    ) -> Result<()> {
        self.running.remove((job, index))?;
        record.counts.running = record.counts.running.saturating_sub(1);
        let message = format!(
            "attempt {} did not finish before its lease expired",
            item.attempts
        );
        if item.attempts >= record.max_attempts {
            item.state = ItemState::Failed {
                error: message.clone(),
            };
            record.counts.failed += 1;
        } else {
            item.state = ItemState::Pending;
            self.pending.insert((job, index), ())?;
            record.counts.pending += 1;
        }
        item.last_error = Some(message);
        Ok(())
    }

    /// Running -> Pending without counting the attempt (released, or interrupted by a crash).
    fn unclaim(
        &mut self,
        job: u64,
        index: u64,
        record: &mut JobRecord,
        item: &mut ItemRecord,
    ) -> Result<()> {
        self.running.remove((job, index))?;
        self.pending.insert((job, index), ())?;
        record.counts.running = record.counts.running.saturating_sub(1);
        record.counts.pending += 1;
        item.attempts = item.attempts.saturating_sub(1);
        item.state = ItemState::Pending;
        Ok(())
    }

    /// Every running item of `job` (index, expiry), in index order.
    fn running_of(&self, job: u64) -> Result<Vec<(u64, i64)>> {
        let mut out = Vec::new();
        for entry in self.running.range(job_range(job))? {
            let (key, expires) = entry?;
            out.push((key.value().1, expires.value()));
        }
        Ok(out)
    }

    /// Removes a job and everything of it.
    fn delete(&mut self, job: u64) -> Result<bool> {
        let existed = self.jobs.remove(job)?.is_some();
        self.items.retain_in(job_range(job), |_, _| false)?;
        self.pending.retain_in(job_range(job), |_, _| false)?;
        self.running.retain_in(job_range(job), |_, _| false)?;
        Ok(existed)
    }
}

/// A table of a read transaction, `None` when no map job was ever written.
fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &ReadTransaction,
    definition: TableDefinition<K, V>,
) -> Result<Option<ReadOnlyTable<K, V>>> {
    match txn.open_table(definition) {
        Ok(table) => Ok(Some(table)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// A write transaction that skips the fsync (for claims; see the module documentation).
fn begin_light(store: &Store) -> Result<WriteTransaction> {
    let mut txn = store.db.begin_write()?;
    // Refused only in redb's multi-process modes: then the commit simply stays durable.
    let _ = txn.set_durability(Durability::None);
    Ok(txn)
}

/// The items of a job in index order; see [`Store::items_in_order`].
pub struct MapItems {
    range: Option<redb::Range<'static, (u64, u64), &'static [u8]>>,
}

impl std::fmt::Debug for MapItems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapItems").finish_non_exhaustive()
    }
}

impl Iterator for MapItems {
    type Item = Result<MapItem>;

    fn next(&mut self) -> Option<Self::Item> {
        let range = self.range.as_mut()?;
        let entry = range.next()?;
        Some(entry.map_err(StoreError::from).and_then(|(key, bytes)| {
            let record: ItemRecord = codec::decode(ITEMS, bytes.value())?;
            Ok(record.into_item(key.value().1))
        }))
    }
}

impl Store {
    // ------------------------------------------------------------------------------ create

    /// Creates a job from `spec` and its items, read from `items` in input order and numbered
    /// from 0. Items are written in batched transactions ([`CREATE_BATCH_ITEMS`],
    /// [`CREATE_BATCH_BYTES`]) under [`JobStatus::Preparing`]; the job becomes
    /// [`JobStatus::Running`] in the last, durable, transaction (or [`JobStatus::Completed`] at
    /// once when no item is runnable). Invalid items, and JSON items whose text does not parse,
    /// are failed at creation with their error and 0 attempts.
    ///
    /// If `items` yields an error, everything written for the job is deleted and the error is
    /// returned as [`StoreError::Io`] on the input path.
    pub fn create_job(
        &self,
        spec: &MapJobSpec,
        items: impl IntoIterator<Item = std::io::Result<ItemInput>>,
    ) -> Result<JobId> {
        let record = validate_spec(spec)?;
        let input_path = record.input_path.clone();
        let txn = begin_light(self)?;
        let id = {
            let mut meta_table = txn.open_table(tables::META)?;
            let id = next_counter(&mut meta_table, meta::NEXT_JOB)?;
            let mut t = Tables::open(&txn)?;
            t.put_job(id, &record)?;
            id
        };
        txn.commit()?;

        let mut batch: Vec<ItemRecord> = Vec::new();
        let mut batch_bytes = 0usize;
        let mut next_index = 0u64;
        for item in items {
            let item = match item {
                Ok(item) => item,
                Err(source) => {
                    // Best effort: a job left Preparing can still be deleted later.
                    if let Err(e) = self.delete_job(JobId(id)) {
                        tracing::warn!(job = %JobId(id), error = %e, "cannot delete a half-created map job");
                    }
                    return Err(StoreError::Io {
                        path: input_path,
                        source,
                    });
                }
            };
            let (payload, state, last_error) = match item.content {
                ItemContent::Json(text) if is_json(&text) => {
                    (ItemContent::Json(text), ItemState::Pending, None)
                }
                ItemContent::Json(_) => {
                    let error = format!("line {} is not valid JSON", item.line);
                    (
                        ItemContent::Invalid(error.clone()),
                        ItemState::Failed {
                            error: error.clone(),
                        },
                        Some(error),
                    )
                }
                ItemContent::Invalid(error) => (
                    ItemContent::Invalid(error.clone()),
                    ItemState::Failed {
                        error: error.clone(),
                    },
                    Some(error),
                ),
            };
            batch_bytes += match &payload {
                ItemContent::Json(text) | ItemContent::Invalid(text) => text.len(),
            };
            batch.push(ItemRecord {
                line: item.line,
                payload,
                state,
                attempts: 0,
                last_error,
                feedback: None,
            });
            if batch.len() >= CREATE_BATCH_ITEMS || batch_bytes >= CREATE_BATCH_BYTES {
                self.write_items(id, &mut next_index, std::mem::take(&mut batch))?;
                batch_bytes = 0;
            }
        }
        self.write_items(id, &mut next_index, batch)?;

        let txn = self.db.begin_write()?;
        {
            let mut t = Tables::open(&txn)?;
            let mut record = t.job(id)?;
            // Cancelled meanwhile: stays cancelled.
            if record.status == JobStatus::Preparing {
                record.status = JobStatus::Running;
                record.finish_if_done();
                t.put_job(id, &record)?;
            }
        }
        txn.commit()?;
        Ok(JobId(id))
    }

    fn write_items(&self, job: u64, next_index: &mut u64, batch: Vec<ItemRecord>) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let txn = begin_light(self)?;
        {
            let mut t = Tables::open(&txn)?;
            let mut record = t.job(job)?;
            for item in batch {
                let index = *next_index;
                *next_index += 1;
                record.counts.total += 1;
                match item.state {
                    ItemState::Pending => {
                        t.pending.insert((job, index), ())?;
                        record.counts.pending += 1;
                    }
                    _ => record.counts.failed += 1,
                }
                t.put_item(job, index, &item)?;
            }
            t.put_job(job, &record)?;
        }
        txn.commit()?;
        Ok(())
    }

    // ------------------------------------------------------------------------------- claim

    /// Claims up to `max` items of a running job for `owner`, atomically: first items whose
    /// lease expired at `now` (those without attempts left fail instead), then pending items,
    /// lowest index first. Each claimed item becomes Running under `owner` until `now + lease`,
    /// with its attempt count raised by one. A job that is not running yields nothing.
    pub fn claim(
        &self,
        job: JobId,
        owner: &str,
        now: Timestamp,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<ClaimedItem>> {
        let id = job.0;
        let expires = expiry(now, lease);
        let txn = begin_light(self)?;
        let (claimed, changed) = {
            let mut t = Tables::open(&txn)?;
            let mut record = t.job(id)?;
            if record.status != JobStatus::Running || max == 0 {
                (Vec::new(), false)
            } else {
                let mut claimed = Vec::new();
                let mut changed = false;
                let expired: Vec<u64> = t
                    .running_of(id)?
                    .into_iter()
                    .filter(|(_, at)| *at <= now.0)
                    .map(|(index, _)| index)
                    .collect();
                for index in expired {
                    if claimed.len() >= max {
                        break;
                    }
                    let mut item = t.item(id, index)?;
                    changed = true;
                    if item.attempts >= record.max_attempts {
                        t.expire(id, index, &mut record, &mut item)?;
                        t.put_item(id, index, &item)?;
                        continue;
                    }
                    // Stays Running (and in `map_running`), under a new claim.
                    item.last_error = Some(format!(
                        "attempt {} did not finish before its lease expired",
                        item.attempts
                    ));
                    claimed.push(take(
                        &mut t,
                        job,
                        index,
                        item,
                        owner,
                        expires,
                        /* was_pending */ false,
                        &mut record,
                    )?);
                }
                if claimed.len() < max {
                    let mut next = Vec::new();
                    for entry in t.pending.range(job_range(id))?.take(max - claimed.len()) {
                        next.push(entry?.0.value().1);
                    }
                    for index in next {
                        let item = t.item(id, index)?;
                        changed = true;
                        claimed.push(take(
                            &mut t,
                            job,
                            index,
                            item,
                            owner,
                            expires,
                            /* was_pending */ true,
                            &mut record,
                        )?);
                    }
                }
                if changed {
                    record.finish_if_done();
                    t.put_job(id, &record)?;
                }
                (claimed, changed)
            }
        };
        if changed {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        Ok(claimed)
    }

    // ------------------------------------------------------------------------------ commit

    /// Records `result` (JSON text) for a claimed item; see [`Store::commit_batch`].
    pub fn complete(
        &self,
        job: JobId,
        index: u64,
        owner: &str,
        attempt: u32,
        result: &str,
    ) -> Result<CommitOutcome> {
        self.commit_one(
            job,
            index,
            owner,
            attempt,
            ItemOutcome::Completed(result.to_owned()),
        )
    }

    /// Records a failed attempt of a claimed item: it is pending again (keeping the error, and
    /// for invalid output the feedback) while it has attempts left and the failure is not
    /// permanent, else failed. See [`Store::commit_batch`].
    pub fn fail(
        &self,
        job: JobId,
        index: u64,
        owner: &str,
        attempt: u32,
        failure: ItemFailure,
    ) -> Result<CommitOutcome> {
        self.commit_one(job, index, owner, attempt, ItemOutcome::Failed(failure))
    }

    /// Gives a claimed item back unused: pending again, the attempt not counted.
    pub fn release_item(
        &self,
        job: JobId,
        index: u64,
        owner: &str,
        attempt: u32,
    ) -> Result<CommitOutcome> {
        self.commit_one(job, index, owner, attempt, ItemOutcome::Released)
    }

    fn commit_one(
        &self,
        job: JobId,
        index: u64,
        owner: &str,
        attempt: u32,
        outcome: ItemOutcome,
    ) -> Result<CommitOutcome> {
        let mut out = self.commit_batch(
            job,
            &[ItemReport {
                index,
                owner: owner.to_owned(),
                attempt,
                outcome,
            }],
        )?;
        out.pop()
            .ok_or_else(|| StoreError::InvalidJob("empty commit".into()))
    }

    /// Records the ends of several claims of `job` in one durable transaction, in order, and
    /// says for each what happened: [`CommitOutcome::Committed`] when the item was still running
    /// under that owner and attempt; [`CommitOutcome::Duplicate`] (discarded) when it was
    /// already finished; [`CommitOutcome::LeaseLost`] (discarded) otherwise. Results must be
    /// JSON text (checked before anything is written). Commits are accepted for cancelled jobs
    /// too, so work already paid for is kept.
    pub fn commit_batch(&self, job: JobId, reports: &[ItemReport]) -> Result<Vec<CommitOutcome>> {
        for report in reports {
            if let ItemOutcome::Completed(result) = &report.outcome
                && !is_json(result)
            {
                return Err(StoreError::InvalidJob(format!(
                    "the result of item {} of {job} is not JSON",
                    report.index
                )));
            }
        }
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let id = job.0;
        let txn = self.db.begin_write()?;
        let outcomes = {
            let mut t = Tables::open(&txn)?;
            let mut record = t.job(id)?;
            if record.status == JobStatus::Preparing {
                return Err(StoreError::InvalidJob(format!(
                    "{job} is still being created"
                )));
            }
            let mut outcomes = Vec::with_capacity(reports.len());
            for report in reports {
                let mut item = t.item(id, report.index)?;
                let current = match &item.state {
                    ItemState::Completed { .. } | ItemState::Failed { .. } => {
                        outcomes.push(CommitOutcome::Duplicate);
                        continue;
                    }
                    ItemState::Running { owner, .. } => {
                        *owner == report.owner && item.attempts == report.attempt
                    }
                    ItemState::Pending => false,
                };
                if !current {
                    outcomes.push(CommitOutcome::LeaseLost);
                    continue;
                }
                match &report.outcome {
                    ItemOutcome::Completed(result) => {
                        t.running.remove((id, report.index))?;
                        record.counts.running = record.counts.running.saturating_sub(1);
                        record.counts.completed += 1;
                        item.state = ItemState::Completed {
                            result: result.clone(),
                        };
                    }
                    ItemOutcome::Failed(failure) => {
                        t.running.remove((id, report.index))?;
                        record.counts.running = record.counts.running.saturating_sub(1);
                        if failure.kind == FailureKind::InvalidOutput {
                            item.feedback = Some(failure.message.clone());
                        }
                        item.last_error = Some(failure.message.clone());
                        if failure.kind == FailureKind::Permanent
                            || item.attempts >= record.max_attempts
                        {
                            item.state = ItemState::Failed {
                                error: failure.message.clone(),
                            };
                            record.counts.failed += 1;
                        } else {
                            item.state = ItemState::Pending;
                            t.pending.insert((id, report.index), ())?;
                            record.counts.pending += 1;
                        }
                    }
                    ItemOutcome::Released => {
                        t.unclaim(id, report.index, &mut record, &mut item)?;
                    }
                }
                t.put_item(id, report.index, &item)?;
                outcomes.push(CommitOutcome::Committed);
            }
            record.finish_if_done();
            t.put_job(id, &record)?;
            outcomes
        };
        txn.commit()?;
        Ok(outcomes)
    }

    // -------------------------------------------------------------------------- recovery

    /// Moves every running item (of every job) whose lease expired at `now` back to pending, or
    /// to failed when it has no attempts left (the expired attempt counts). Returns how many
    /// items moved.
    pub fn release_expired(&self, now: Timestamp) -> Result<usize> {
        let txn = self.db.begin_write()?;
        let moved = {
            let mut t = Tables::open(&txn)?;
            let mut expired = Vec::new();
            for entry in t.running.iter()? {
                let (key, at) = entry?;
                if at.value() <= now.0 {
                    expired.push(key.value());
                }
            }
            let mut jobs: HashMap<u64, JobRecord> = HashMap::new();
            for &(job, index) in &expired {
                let record = match jobs.entry(job) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(t.job(job)?),
                };
                let mut item = t.item(job, index)?;
                t.expire(job, index, record, &mut item)?;
                t.put_item(job, index, &item)?;
            }
            for (job, mut record) in jobs {
                record.finish_if_done();
                t.put_job(job, &record)?;
            }
            expired.len()
        };
        txn.commit()?;
        Ok(moved)
    }

    /// Puts every running item of `job` back to pending without counting its attempt: the
    /// recovery after a crash, when no worker of the old process survives. Returns how many
    /// items moved. A job still being created is refused.
    pub fn resume(&self, job: JobId) -> Result<usize> {
        self.unclaim_where(job, |_| true)
    }

    /// [`Store::resume`] for every running job; what to call at startup. Returns the jobs still
    /// running after it (with pending items to run) and how many items each got back.
    pub fn resume_all(&self) -> Result<Vec<(JobId, usize)>> {
        let mut out = Vec::new();
        for job in self.jobs()? {
            if job.status == JobStatus::Running {
                let moved = self.resume(job.id)?;
                out.push((job.id, moved));
            }
        }
        Ok(out)
    }

    /// Puts the running items of `job` claimed by `owner` back to pending without counting
    /// their attempts (a worker pool stopping cleanly). Returns how many items moved.
    pub fn release(&self, job: JobId, owner: &str) -> Result<usize> {
        self.unclaim_where(
            job,
            |state| matches!(state, ItemState::Running { owner: o, .. } if o == owner),
        )
    }

    fn unclaim_where(&self, job: JobId, select: impl Fn(&ItemState) -> bool) -> Result<usize> {
        let id = job.0;
        let txn = self.db.begin_write()?;
        let moved = {
            let mut t = Tables::open(&txn)?;
            let mut record = t.job(id)?;
            if record.status == JobStatus::Preparing {
                return Err(StoreError::InvalidJob(format!(
                    "{job} was never fully created (its input was still being read): delete it and start again"
                )));
            }
            let mut moved = 0;
            for (index, _) in t.running_of(id)? {
                let mut item = t.item(id, index)?;
                if !select(&item.state) {
                    continue;
                }
                t.unclaim(id, index, &mut record, &mut item)?;
                t.put_item(id, index, &item)?;
                moved += 1;
            }
            record.finish_if_done();
            t.put_job(id, &record)?;
            moved
        };
        txn.commit()?;
        Ok(moved)
    }

    // ------------------------------------------------------------------------- job status

    /// Cancels a job: nothing is claimed from it any more. Answers of claims still out are
    /// still accepted. A finished job is left as it is. Returns the job.
    pub fn cancel(&self, job: JobId) -> Result<MapJob> {
        self.set_status(job, JobStatus::Cancelled, None)
    }

    /// Marks a job failed as a whole (an error no retry can fix, e.g. the provider refuses the
    /// credentials), with `error`. A finished job is left as it is. Returns the job.
    pub fn fail_job(&self, job: JobId, error: &str) -> Result<MapJob> {
        self.set_status(job, JobStatus::Failed, Some(error.to_owned()))
    }

    fn set_status(&self, job: JobId, status: JobStatus, error: Option<String>) -> Result<MapJob> {
        let txn = self.db.begin_write()?;
        let record = {
            let mut t = Tables::open(&txn)?;
            let mut record = t.job(job.0)?;
            if !record.status.is_terminal() {
                record.status = status;
                record.error = error;
                record.finished_at = Some(Timestamp::now());
                t.put_job(job.0, &record)?;
            }
            record
        };
        txn.commit()?;
        Ok(record.into_job(job.0))
    }

    /// Deletes a job and its items. Returns whether it existed.
    pub fn delete_job(&self, job: JobId) -> Result<bool> {
        let txn = self.db.begin_write()?;
        let existed = Tables::open(&txn)?.delete(job.0)?;
        txn.commit()?;
        Ok(existed)
    }

    // ------------------------------------------------------------------------------ reads

    /// One job.
    pub fn job(&self, job: JobId) -> Result<MapJob> {
        let txn = self.db.begin_read()?;
        let table = read_table(&txn, tables::MAP_JOBS)?.ok_or(StoreError::JobNotFound(job))?;
        let bytes = table.get(job.0)?.ok_or(StoreError::JobNotFound(job))?;
        let record: JobRecord = codec::decode(JOBS, bytes.value())?;
        Ok(record.into_job(job.0))
    }

    /// Every job, oldest first.
    pub fn jobs(&self) -> Result<Vec<MapJob>> {
        let txn = self.db.begin_read()?;
        let Some(table) = read_table(&txn, tables::MAP_JOBS)? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (id, bytes) = entry?;
            let record: JobRecord = codec::decode(JOBS, bytes.value())?;
            out.push(record.into_job(id.value()));
        }
        Ok(out)
    }

    /// A job's items by state.
    pub fn progress(&self, job: JobId) -> Result<MapProgress> {
        Ok(self.job(job)?.progress)
    }

    /// One item of a job.
    pub fn item(&self, job: JobId, index: u64) -> Result<MapItem> {
        let txn = self.db.begin_read()?;
        let table = read_table(&txn, tables::MAP_ITEMS)?.ok_or(StoreError::JobNotFound(job))?;
        let bytes = table
            .get((job.0, index))?
            .ok_or_else(|| StoreError::InvalidJob(format!("{job} has no item {index}")))?;
        let record: ItemRecord = codec::decode(ITEMS, bytes.value())?;
        Ok(record.into_item(index))
    }

    /// The items of a job in index (input) order, read from one snapshot, one at a time (for
    /// writing the output without holding it in memory).
    pub fn items_in_order(&self, job: JobId) -> Result<MapItems> {
        let txn = self.db.begin_read()?;
        let jobs = read_table(&txn, tables::MAP_JOBS)?.ok_or(StoreError::JobNotFound(job))?;
        if jobs.get(job.0)?.is_none() {
            return Err(StoreError::JobNotFound(job));
        }
        let range = match read_table(&txn, tables::MAP_ITEMS)? {
            Some(items) => Some(items.range(job_range(job.0))?),
            None => None,
        };
        Ok(MapItems { range })
    }
}

/// Marks an item Running under a new claim and describes the claim.
#[allow(clippy::too_many_arguments)]
fn take(
    t: &mut Tables<'_>,
    job: JobId,
    index: u64,
    mut item: ItemRecord,
    owner: &str,
    expires: Timestamp,
    was_pending: bool,
    record: &mut JobRecord,
) -> Result<ClaimedItem> {
    let ItemContent::Json(payload) = &item.payload else {
        return Err(StoreError::Corrupt {
            table: ITEMS,
            detail: format!("item {index} of {job} is claimable but has no JSON payload"),
        });
    };
    let payload = payload.clone();
    if was_pending {
        t.pending.remove((job.0, index))?;
        record.counts.pending = record.counts.pending.saturating_sub(1);
        record.counts.running += 1;
    }
    t.running.insert((job.0, index), expires.0)?;
    item.attempts += 1;
    item.state = ItemState::Running {
        owner: owner.to_owned(),
        lease_expires_at: expires,
    };
    t.put_item(job.0, index, &item)?;
    Ok(ClaimedItem {
        job,
        index,
        line: item.line,
        payload,
        attempt: item.attempts,
        owner: owner.to_owned(),
        lease_expires_at: expires,
        feedback: item.feedback,
        last_error: item.last_error,
    })
}

fn validate_spec(spec: &MapJobSpec) -> Result<JobRecord> {
    let bad = |msg: String| Err(StoreError::InvalidJob(msg));
    if spec.max_attempts == 0 {
        return bad("max_attempts must be at least 1".into());
    }
    if spec.concurrency == 0 {
        return bad("concurrency must be at least 1".into());
    }
    if spec.timeout.is_zero() {
        return bad("the timeout must be above zero".into());
    }
    if spec.prompt.trim().is_empty() {
        return bad("the prompt must not be empty".into());
    }
    if !is_json(&spec.output_schema) {
        return bad("the output schema is not JSON".into());
    }
    Ok(JobRecord {
        kind: spec.kind,
        input_path: path_text(&spec.input_path, "input")?,
        output_path: path_text(&spec.output_path, "output")?,
        prompt: spec.prompt.clone(),
        output_schema: spec.output_schema.clone(),
        max_attempts: spec.max_attempts,
        concurrency: spec.concurrency,
        timeout_ms: u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX),
        model: spec.model.clone(),
        read_only: spec.read_only,
        created_at: Timestamp::now(),
        finished_at: None,
        status: JobStatus::Preparing,
        error: None,
        counts: MapProgress::default(),
    })
}
