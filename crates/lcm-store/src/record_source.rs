//! The record source: what the derived search (the `lcm-search` crate: the index's catch-up,
//! grep) reads of the stored messages. It is the seam between the truth and everything derived
//! from it, and the one a second storage backend implements: the next backend (PostgreSQL,
//! shared by several stateless daemons) gives search what redb's [`Store`] gives it here, and
//! search does not change.
//!
//! Two traits: a [`RecordSource`] (the store: where messages end, the index watermark, read
//! views) and the [`RecordReader`] it opens (one consistent view, walked by id, by session or
//! point by point). Messages come as records in lcm's own layout ([`RecordView`] reads them),
//! never as a backend's rows or types.
//!
//! # What a backend guarantees
//!
//! - **Dense, increasing ids.** Message ids are allocated from one counter in append order:
//!   every id below [`RecordSource::next_message_id`] names a stored message (a gap is damage,
//!   reported as [`StoreError::Corrupt`](crate::StoreError::Corrupt), not skipped silently),
//!   and ids never move back. Within a session, ids grow with the sequence number.
//! - **Immutable records.** A message's record never changes once its append returned, and a
//!   message visible in one view is visible in every view opened after it. Search relies on it
//!   twice: the index is caught up once per message and never revisits it, and a parallel scan
//!   opens one view per thread and may see the same range in different views.
//! - **Records in lcm's own layout.** The bytes a reader hands out are exactly what
//!   [`crate::record`] writes (header, text blob, descriptors), readable by [`RecordView`]; a
//!   backend stores them as they are (a `bytea` column, say) and never re-encodes them.
//! - **Consistent read views.** Every read through one [`RecordReader`] sees the same state of
//!   the store, for as long as the reader lives; readers may be opened from several threads at
//!   once (hence `RecordSource: Sync`).
//! - **Borrowed bytes.** A visitor gets records borrowed from the backend's own buffers for the
//!   length of one call, so a scan copies nothing; whatever it keeps, it copies.
//! - **A watermark beside the truth.** [`RecordSource::index_watermark`] keeps the copy of how
//!   far the index got (the index's own commit is the authority: invariant "one watermark
//!   truth"); it is metadata, written apart from any message.
//!
//! # Rows
//!
//! A walk may hand records out with the **row** they sit in ([`InRow`]): a stretch of stored
//! bytes holding the records of consecutive messages one after another, which a scan searches
//! in one regex call before it looks at the records one by one (a row without a match is passed
//! over whole). redb's store packs up to 64 records in a row; a backend without such packs
//! reports every record as a row of its own (`row == record`, `span == 0..record.len()`,
//! `rest == 1`, `row_first == id`), which is correct, only without the shortcut.
//!
//! # Generic, not `dyn`
//!
//! The traits take their visitors as generic closures, so search is generic over the source
//! (`grep<S: RecordSource>`): each record visited costs a direct, inlinable call, as when
//! search called redb's [`StoreReader`] by name, and the walk is compiled with the visitor
//! inlined into it. A `&dyn` source would take `&mut dyn FnMut` visitors: a virtual call on
//! every record of a scan (tens of millions a second on its hot path), around a visitor that
//! is often a few instructions (a row without a match passes its records over). A host that
//! picks its backend at run time wraps the backends in one enum that implements these traits.
//!
//! # What stays concrete
//!
//! - Opening a store, and the data directory that pairs a store file with its index (the
//!   `lcm-search` crate's `DataDir`), name redb's [`Store`]: choosing the backend is theirs.
//! - The integrity check and its repairs ([`crate::integrity`]) read the tables of redb's store
//!   directly, and [`crate::integrity::DerivedIndex::rebuild_from`] takes that [`Store`]:
//!   a check is of one backend's tables, so each backend brings its own.
//! - Writes (appends, summaries, file records, map jobs) are [`Store`]'s API: search never
//!   writes a message, only the watermark copy, which is on this trait.

use std::ops::{ControlFlow, Range};

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::Message;
use lcm_core::summary::Summary;

use crate::error::Result;
use crate::record::RecordView;
use crate::store::{Store, StoreReader};

/// A store of messages as the derived search reads it (see the [module docs](self) for what an
/// implementation guarantees). redb's [`Store`] implements it, and so do references and `Arc`s
/// of a source.
pub trait RecordSource: Sync {
    /// One consistent read view of the store.
    type Reader<'s>: RecordReader
    where
        Self: 's;

    /// Opens a read view: every read through it sees the store as it is now.
    fn reader(&self) -> Result<Self::Reader<'_>>;

    /// The id the next appended message will get (one past the newest; every id below it is
    /// stored).
    fn next_message_id(&self) -> Result<MessageId>;

    /// Whether the store refuses writes (then so does the index's catch-up, and the watermark
    /// copy is left alone).
    fn is_read_only(&self) -> bool;

    /// The store's copy of the index watermark: messages below it were indexed.
    fn index_watermark(&self) -> Result<MessageId>;

    /// Records the index watermark (after the index committed up to it).
    fn set_index_watermark(&self, watermark: MessageId) -> Result<()>;

    /// The id the next summary will get: summary ids are dense, in creation order, and a
    /// summary never changes once made (the vector index of summaries embeds them by id).
    fn next_summary_id(&self) -> Result<SummaryId>;
}

/// One consistent read view of a [`RecordSource`]. Records are borrowed for one call of the
/// visitor; ids are message ids.
pub trait RecordReader {
    /// Visits the record of every message with an id in `ids`, in id order, each with its row
    /// ([`InRow`]), until `visit` says [`Step::Stop`]; [`Step::SkipRow`] goes on after the
    /// visited record's row.
    fn range_records_in_rows(
        &self,
        ids: Range<MessageId>,
        visit: impl FnMut(InRow<'_>) -> Result<Step>,
    ) -> Result<()>;

    /// Visits the records of the messages `ids` that exist, in the order given, until `visit`
    /// breaks. Ascending ids should cost one lookup per row, not per message (index
    /// candidates are verified this way).
    fn records_of(
        &self,
        ids: impl IntoIterator<Item = MessageId>,
        visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()>;

    /// The ids of the messages of `session`, as ascending, disjoint ranges (consecutive ids
    /// merged). An unknown session is [`StoreError::SessionNotFound`](crate::StoreError).
    fn session_id_ranges(&self, session: SessionId) -> Result<Vec<Range<u64>>>;

    /// [`Self::range_records_in_rows`] over the messages of `session` with sequence numbers in
    /// `seqs` and ids in `ids`, in order (ids grow with the sequence within a session). A
    /// skipped row ends within the session's messages. An unknown session is
    /// [`StoreError::SessionNotFound`](crate::StoreError); a message of the session missing
    /// from the store is [`StoreError::Corrupt`](crate::StoreError).
    fn session_records_in_rows(
        &self,
        session: SessionId,
        seqs: Range<u64>,
        ids: Range<MessageId>,
        visit: impl FnMut(InRow<'_>) -> Result<Step>,
    ) -> Result<()>;

    /// Visits the record of every message with an id in `ids`, in id order, until `visit`
    /// breaks.
    fn range_records(
        &self,
        ids: Range<MessageId>,
        mut visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        self.range_records_in_rows(ids, |r| {
            Ok(match visit(MessageId(r.id), r.record)? {
                ControlFlow::Continue(()) => Step::Next,
                ControlFlow::Break(()) => Step::Stop,
            })
        })
    }

    /// One summary with its sources ([`crate::StoreError::SummaryNotFound`] if absent).
    fn summary(&self, id: SummaryId) -> Result<Summary>;

    /// One message by id, `None` if absent.
    fn try_message(&self, id: MessageId) -> Result<Option<Message>> {
        let mut message = None;
        self.records_of([id], |id, bytes| {
            message = Some(RecordView::read(bytes)?.to_message(id)?);
            Ok(ControlFlow::Break(()))
        })?;
        Ok(message)
    }

    /// Visits every message with an id in `ids`, in id order, decoded (owned parts).
    fn for_each_message(
        &self,
        ids: Range<MessageId>,
        mut visit: impl FnMut(Message) -> ControlFlow<()>,
    ) -> Result<()> {
        self.range_records(ids, |id, bytes| {
            Ok(visit(RecordView::read(bytes)?.to_message(id)?))
        })
    }
}

/// A stored record seen with the row it sits in (for readers that look at whole rows; see the
/// [module docs](self#rows)).
pub struct InRow<'a> {
    /// The message's id.
    pub id: u64,
    /// Its record (lcm's layout), `&row[span]`.
    pub record: &'a [u8],
    /// Messages of the row from this one on that the walk would visit (this one included): what
    /// a [`Step::SkipRow`] passes over.
    pub rest: u64,
    /// The first id of the row's messages: a new row starts when it changes.
    pub row_first: u64,
    /// The whole row: the records of its messages one after another (and whatever the backend
    /// keeps between them).
    pub row: &'a [u8],
    /// Where `record` lies in `row`; the records of one row come in order, each after the last.
    pub span: Range<usize>,
}

/// What a walk over whole rows does after visiting a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Next,
    /// Skips the rest of this record's row (the visitor has dealt with [`InRow::rest`]).
    SkipRow,
    Stop,
}

impl RecordSource for Store {
    type Reader<'s> = StoreReader;

    fn reader(&self) -> Result<StoreReader> {
        Store::reader(self)
    }

    fn next_message_id(&self) -> Result<MessageId> {
        Store::next_message_id(self)
    }

    fn is_read_only(&self) -> bool {
        Store::is_read_only(self)
    }

    fn index_watermark(&self) -> Result<MessageId> {
        Store::index_watermark(self)
    }

    fn set_index_watermark(&self, watermark: MessageId) -> Result<()> {
        Store::set_index_watermark(self, watermark)
    }

    fn next_summary_id(&self) -> Result<SummaryId> {
        Store::next_summary_id(self)
    }
}

impl RecordReader for StoreReader {
    fn range_records_in_rows(
        &self,
        ids: Range<MessageId>,
        visit: impl FnMut(InRow<'_>) -> Result<Step>,
    ) -> Result<()> {
        StoreReader::range_records_in_rows(self, ids, visit)
    }

    fn records_of(
        &self,
        ids: impl IntoIterator<Item = MessageId>,
        visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        StoreReader::records_of(self, ids, visit)
    }

    fn session_id_ranges(&self, session: SessionId) -> Result<Vec<Range<u64>>> {
        StoreReader::session_id_ranges(self, session)
    }

    fn session_records_in_rows(
        &self,
        session: SessionId,
        seqs: Range<u64>,
        ids: Range<MessageId>,
        visit: impl FnMut(InRow<'_>) -> Result<Step>,
    ) -> Result<()> {
        StoreReader::session_records_in_rows(self, session, seqs, ids, visit)
    }

    fn range_records(
        &self,
        ids: Range<MessageId>,
        visit: impl FnMut(MessageId, &[u8]) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        StoreReader::range_records(self, ids, visit)
    }

    fn try_message(&self, id: MessageId) -> Result<Option<Message>> {
        StoreReader::try_message(self, id)
    }

    fn summary(&self, id: SummaryId) -> Result<Summary> {
        StoreReader::summary(self, id)
    }

    fn for_each_message(
        &self,
        ids: Range<MessageId>,
        visit: impl FnMut(Message) -> ControlFlow<()>,
    ) -> Result<()> {
        StoreReader::for_each_message(self, ids, visit)
    }
}

/// A source behind a reference is a source (callers pass `&store` as often as `store`).
impl<T: RecordSource> RecordSource for &T {
    type Reader<'s>
        = T::Reader<'s>
    where
        Self: 's;

    fn reader(&self) -> Result<Self::Reader<'_>> {
        (**self).reader()
    }

    fn next_message_id(&self) -> Result<MessageId> {
        (**self).next_message_id()
    }

    fn is_read_only(&self) -> bool {
        (**self).is_read_only()
    }

    fn index_watermark(&self) -> Result<MessageId> {
        (**self).index_watermark()
    }

    fn set_index_watermark(&self, watermark: MessageId) -> Result<()> {
        (**self).set_index_watermark(watermark)
    }

    fn next_summary_id(&self) -> Result<SummaryId> {
        (**self).next_summary_id()
    }
}

/// A shared source is a source (the runtime keeps its store in an `Arc`).
impl<T: RecordSource + Send> RecordSource for std::sync::Arc<T> {
    type Reader<'s>
        = T::Reader<'s>
    where
        Self: 's;

    fn reader(&self) -> Result<Self::Reader<'_>> {
        (**self).reader()
    }

    fn next_message_id(&self) -> Result<MessageId> {
        (**self).next_message_id()
    }

    fn is_read_only(&self) -> bool {
        (**self).is_read_only()
    }

    fn index_watermark(&self) -> Result<MessageId> {
        (**self).index_watermark()
    }

    fn set_index_watermark(&self, watermark: MessageId) -> Result<()> {
        (**self).set_index_watermark(watermark)
    }

    fn next_summary_id(&self) -> Result<SummaryId> {
        (**self).next_summary_id()
    }
}
