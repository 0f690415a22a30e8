//! The store's errors: one enum, each variant saying what was wrong and with what.

use lcm_core::ids::{FileId, JobId, MessageId, SessionId, SummaryId};

/// Everything that can go wrong in `lcm-store`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("no message {0} in the store")]
    MessageNotFound(MessageId),
    #[error("no summary {0} in the store")]
    SummaryNotFound(SummaryId),
    #[error("no file record {0} in the store")]
    FileNotFound(FileId),
    #[error("no session {0} in the store")]
    SessionNotFound(SessionId),
    #[error("no session with key `{0}` in the store")]
    SessionKeyNotFound(String),
    #[error("a session with key `{0}` already exists")]
    SessionExists(String),
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    #[error("invalid search: {0}")]
    InvalidQuery(String),
    #[error("invalid cursor: {0}")]
    InvalidCursor(String),
    #[error("no map job {0} in the store")]
    JobNotFound(JobId),
    /// A map-job call that does not fit the job (bad spec, unknown item, wrong status, ...).
    #[error("map job: {0}")]
    InvalidJob(String),
    /// A change the store's current state refuses (a pin past its cap, forgetting what the
    /// context does not show): nothing was written.
    #[error("refused: {0}")]
    Refused(String),
    #[error(
        "the database was written by a newer lcm (schema {found}, this build reads up to {supported}): upgrade lcm"
    )]
    NewerSchema { found: u32, supported: u32 },
    /// A read-only open of a store of an older layout: only a writable open migrates it.
    #[error(
        "the store {path} has the layout of an older lcm (schema {found}); a writable open upgrades it to schema {current} (any command that writes, such as `lcm import` or `lcm serve`)"
    )]
    OlderSchema {
        path: String,
        found: u64,
        current: u64,
    },
    /// A write through a store opened with [`Store::open_read_only`](crate::Store::open_read_only).
    #[error("the store is open read-only; open it writable to change it")]
    ReadOnly,
    /// Another handle (another process, such as `lcm serve`) has the store open.
    #[error(
        "the store {0} is open in another process (a running `lcm serve`?): stop it, or use its HTTP API"
    )]
    AlreadyOpen(String),
    /// A read-only open of a store that was not closed cleanly: only a writable open recovers it.
    #[error(
        "the store {0} was not closed cleanly and needs recovery, which only a writable open performs"
    )]
    NeedsRecovery(String),
    /// A write transaction that was accepted as valid could not be made durable (the disk is
    /// full or failing, the store panicked): nothing of it was written, and the same request
    /// may succeed later. A failure of the server, not of the request.
    #[error("the commit failed, nothing was written: {detail}")]
    CommitFailed {
        detail: String,
        /// Whether the disk was full (`ENOSPC`, a quota): the commit may succeed once space is
        /// freed.
        disk_full: bool,
    },
    #[error("corrupt record in table `{table}`: {detail}")]
    Corrupt { table: &'static str, detail: String },
    #[error("database error: {0}")]
    Database(#[from] redb::Error),
    /// The search index (derived data, held by the `lcm-search` crate) failed while doing
    /// `what`; `source` is the index engine's own error. The store names no index engine: the
    /// search converts its errors at each call (`StoreError::index`).
    #[error("search index error while {what}: {source}")]
    Index {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

macro_rules! via_redb_error {
    ($($ty:ty),*) => {$(
        impl From<$ty> for StoreError {
            fn from(e: $ty) -> Self {
                StoreError::Database(e.into())
            }
        }
    )*};
}

via_redb_error!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::CompactionError,
    redb::SetDurabilityError
);

/// `ENOSPC` (no space left on device) and `EDQUOT` (disk quota exceeded), as Linux numbers them.
const DISK_FULL_ERRNOS: [i32; 2] = [28, 122];

/// Whether `error` says the disk is full.
pub fn io_error_is_disk_full(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || error
        .raw_os_error()
        .is_some_and(|code| DISK_FULL_ERRNOS.contains(&code))
}

/// Whether an error's text carries a full disk's I/O error (`... (os error 28)`).
fn mentions_disk_full(text: &str) -> bool {
    DISK_FULL_ERRNOS
        .iter()
        .any(|code| text.contains(&format!("(os error {code})")))
}

impl StoreError {
    /// Whether the disk is full (`ENOSPC` or a quota): the write failed for want of space and
    /// may succeed once space is freed. The HTTP API answers 507.
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::CommitFailed { disk_full, .. } => *disk_full,
            StoreError::Io { source, .. } => io_error_is_disk_full(source),
            StoreError::Database(redb::Error::Io(source)) => io_error_is_disk_full(source),
            StoreError::Database(other) => mentions_disk_full(&other.to_string()),
            StoreError::Index { source, .. } => {
                let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
                while let Some(e) = next {
                    if let Some(io) = e.downcast_ref::<std::io::Error>()
                        && io_error_is_disk_full(io)
                    {
                        return true;
                    }
                    next = e.source();
                }
                // Errors that kept only the I/O error's text.
                mentions_disk_full(&source.to_string())
            }
            _ => false,
        }
    }

    /// Whether the storage failed (the disk, the database file, the index), not the request:
    /// nothing of the failed write was kept and the same request may succeed later. The HTTP
    /// API answers 503 (507 when [`StoreError::is_disk_full`]).
    pub fn is_storage_failure(&self) -> bool {
        matches!(
            self,
            StoreError::CommitFailed { .. }
                | StoreError::Database(_)
                | StoreError::Io { .. }
                | StoreError::Index { .. }
        )
    }

    /// An I/O error on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> StoreError {
        StoreError::Io {
            path: path.display().to_string(),
            source,
        }
    }

    /// A failure of the search index while doing `what` (`"committing the index"`), caused by
    /// `source`, the index engine's error (kept as the error's source).
    pub fn index(
        what: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::Index {
            what: what.into(),
            source: source.into(),
        }
    }
}
