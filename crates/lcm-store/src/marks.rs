//! The agent's marks on its context: pinned messages and forgotten items (`context_marks`).
//!
//! A mark changes what a model sees, so each change is one write transaction that checks,
//! inside it, what makes the change valid: a pin, that the session's pins stay within the
//! caller's cap (the tokens each pinned message shows in a context); a forget, that the node
//! is in the session's context right now (a raw message from `raw_from` on, or a top-level
//! summary), so a compaction committed a moment before cannot make it mark what the model no
//! longer sees. Nothing else is written: the DAG, the context state and the messages stay as
//! they are, so marks never cost losslessness, and removing one restores exactly what was. A
//! forgotten node's mark goes when a summary covers it (in `apply_summary`'s transaction): the
//! context no longer shows it, and the table stays as small as the context.
//!
//! A store written before marks existed has no `context_marks` table: it reads as having none
//! (a writable open creates the table).

use lcm_core::ids::{MessageId, SessionId};
use lcm_core::summary::{ContextMark, ContextState, MarkedNode, NodeRef};
use lcm_core::time::Timestamp;
use redb::{ReadableTable, WriteTransaction};

use crate::codec;
use crate::dag;
use crate::error::{Result, StoreError};
use crate::files;
use crate::message_rows;
use crate::record::RecordView;
use crate::store::{Store, StoreReader};
use crate::tables::{self, NODE_MESSAGE};

/// What a pin did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    /// Tokens the message shows in a context (large parts as their file references).
    pub tokens: u64,
    /// Tokens of all the session's pinned messages, this one included.
    pub total_tokens: u64,
    /// The mark the message had before (`Forgotten` is replaced; `Pinned` means it already was).
    pub before: Option<ContextMark>,
}

impl Store {
    /// Pins `message` in `session`'s context: from the moment it is no longer in the raw tail
    /// it is shown verbatim after the summaries (the message may be another session's: a
    /// memory brought into this one). Refused with [`StoreError::Refused`], nothing written,
    /// when the session's pinned messages would then show more than `max_tokens` together.
    /// Pinning a pinned message changes nothing; pinning a forgotten one replaces that mark.
    pub fn pin(&self, session: SessionId, message: MessageId, max_tokens: u64) -> Result<Pinned> {
        let txn = self.db.begin_write()?;
        let pinned = {
            session_exists(&txn, session)?;
            let tokens = shown_tokens(&txn, message)?;
            let mut marks = txn.open_table(tables::CONTEXT_MARKS)?;
            let key = (session.0, NODE_MESSAGE, message.0);
            let before = mark_at(&marks, key)?;
            if before == Some(ContextMark::Pinned) {
                let total_tokens = pinned_tokens(&txn, &marks, session)?;
                return Ok(Pinned {
                    tokens,
                    total_tokens,
                    before,
                });
            }
            let others = pinned_tokens(&txn, &marks, session)?;
            let total_tokens = others + tokens;
            if max_tokens == 0 {
                return Err(StoreError::Refused(
                    "pinning is off: compaction.pinned_max_tokens is 0".into(),
                ));
            }
            if total_tokens > max_tokens {
                return Err(StoreError::Refused(format!(
                    "{message} shows {tokens} tokens and the pinned messages of {session} \
                     already show {others}: together {total_tokens}, over the cap of \
                     {max_tokens} (compaction.pinned_max_tokens); unpin one first"
                )));
            }
            marks.insert(
                key,
                (ContextMark::Pinned.to_byte(), Timestamp::now().millis()),
            )?;
            Pinned {
                tokens,
                total_tokens,
                before,
            }
        };
        txn.commit()?;
        Ok(pinned)
    }

    /// Sets `node` aside in `session`'s context: while it is in the context it is shown as a
    /// pointer naming it. Refused with [`StoreError::Refused`], nothing written, when the
    /// context does not show it now (a summarised message, a summary covered by another, a
    /// node of another session). Returns the mark it had before (`Pinned` is replaced).
    pub fn forget(&self, session: SessionId, node: NodeRef) -> Result<Option<ContextMark>> {
        let txn = self.db.begin_write()?;
        let before = {
            let state = context_state(&txn, session)?;
            match node {
                NodeRef::Message(id) => {
                    let seq = message_seq(&txn, session, id)?;
                    if seq < state.raw_from {
                        return Err(StoreError::Refused(format!(
                            "{id} is summarised: the context shows the summary covering it, \
                             not {id} (forget that summary instead)"
                        )));
                    }
                }
                NodeRef::Summary(id) => {
                    if !state.summaries.contains(&id) {
                        return Err(StoreError::Refused(format!(
                            "{id} is not a top-level summary of {session}'s context"
                        )));
                    }
                }
            }
            let mut marks = txn.open_table(tables::CONTEXT_MARKS)?;
            let key = node_key(session, node);
            let before = mark_at(&marks, key)?;
            if before != Some(ContextMark::Forgotten) {
                marks.insert(
                    key,
                    (ContextMark::Forgotten.to_byte(), Timestamp::now().millis()),
                )?;
            }
            before
        };
        txn.commit()?;
        Ok(before)
    }

    /// Removes `node`'s `mark` in `session` (unpin, restore); `false`, nothing written, when
    /// the node does not carry that mark.
    pub fn clear_mark(&self, session: SessionId, node: NodeRef, mark: ContextMark) -> Result<bool> {
        let txn = self.db.begin_write()?;
        let cleared = {
            session_exists(&txn, session)?;
            let mut marks = txn.open_table(tables::CONTEXT_MARKS)?;
            let key = node_key(session, node);
            if mark_at(&marks, key)? == Some(mark) {
                marks.remove(key)?;
                true
            } else {
                false
            }
        };
        if !cleared {
            txn.abort()?;
            return Ok(false);
        }
        txn.commit()?;
        Ok(true)
    }

    /// See [`StoreReader::marks`].
    pub fn marks(&self, session: SessionId) -> Result<Vec<MarkedNode>> {
        self.reader()?.marks(session)
    }
}

impl StoreReader {
    /// The marks on `session`'s context, messages first, each kind in id order.
    pub fn marks(&self, session: SessionId) -> Result<Vec<MarkedNode>> {
        let Some(table) = self.marks_table()? else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in table.range((session.0, 0, 0)..=(session.0, u8::MAX, u64::MAX))? {
            let (key, value) = entry?;
            let (_, kind, number) = key.value();
            let (mark, at) = value.value();
            out.push(MarkedNode {
                node: node_from(kind, number)?,
                mark: decode_mark(mark)?,
                at: Timestamp(at),
            });
        }
        Ok(out)
    }

    /// The sessions whose context carries a mark on `node`, with the mark and when, in session
    /// order: a summary only in its own session; a message also where another session pinned
    /// it. Reads the whole table, which stays small (each session's forgotten items are in its
    /// context, its pins within `compaction.pinned_max_tokens`).
    pub fn marks_on(&self, node: NodeRef) -> Result<Vec<(SessionId, MarkedNode)>> {
        let Some(table) = self.marks_table()? else {
            return Ok(Vec::new());
        };
        let wanted = dag::node_key(node);
        let mut out = Vec::new();
        for entry in table.iter()? {
            let (key, value) = entry?;
            let (session, kind, number) = key.value();
            if (kind, number) != wanted {
                continue;
            }
            let (mark, at) = value.value();
            out.push((
                SessionId(session),
                MarkedNode {
                    node,
                    mark: decode_mark(mark)?,
                    at: Timestamp(at),
                },
            ));
        }
        Ok(out)
    }

    /// The marks table, `None` in a store written before marks existed.
    fn marks_table(
        &self,
    ) -> Result<Option<redb::ReadOnlyTable<tables::MarkKey, tables::MarkValue>>> {
        match self.txn.open_table(tables::CONTEXT_MARKS) {
            Ok(table) => Ok(Some(table)),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// Removes the `Forgotten` marks of `sources` in `session` (a summary covering them is being
/// applied in `txn`), so the table holds no more forgotten rows than the context has items.
pub(crate) fn drop_forgotten(
    txn: &WriteTransaction,
    session: SessionId,
    sources: &[NodeRef],
) -> Result<()> {
    let mut marks = txn.open_table(tables::CONTEXT_MARKS)?;
    for source in sources {
        let key = node_key(session, *source);
        if mark_at(&marks, key)? == Some(ContextMark::Forgotten) {
            marks.remove(key)?;
        }
    }
    Ok(())
}

fn node_key(session: SessionId, node: NodeRef) -> tables::MarkKey {
    let (kind, number) = dag::node_key(node);
    (session.0, kind, number)
}

fn node_from(kind: u8, number: u64) -> Result<NodeRef> {
    dag::node_from_key("context_marks", (kind, number))
}

fn decode_mark(byte: u8) -> Result<ContextMark> {
    ContextMark::from_byte(byte).ok_or_else(|| StoreError::Corrupt {
        table: "context_marks",
        detail: format!("unknown mark {byte}"),
    })
}

fn session_exists(txn: &WriteTransaction, session: SessionId) -> Result<()> {
    let sessions = txn.open_table(tables::SESSIONS)?;
    if sessions.get(session.0)?.is_none() {
        return Err(StoreError::SessionNotFound(session));
    }
    Ok(())
}

fn context_state(txn: &WriteTransaction, session: SessionId) -> Result<ContextState> {
    session_exists(txn, session)?;
    let table = txn.open_table(tables::CONTEXT)?;
    match table.get(session.0)? {
        Some(bytes) => codec::decode("context", bytes.value()),
        None => Ok(ContextState::default()),
    }
}

/// The tokens `message` shows in a context ([`files::shown_tokens_in`]).
fn shown_tokens(txn: &WriteTransaction, message: MessageId) -> Result<u64> {
    let refs = txn.open_table(tables::MESSAGE_FILES)?;
    let messages = txn.open_table(tables::MESSAGES)?;
    files::shown_tokens_in(Some(&refs), &messages, message)
}

/// The mark at `key`, if any.
fn mark_at(
    marks: &redb::Table<tables::MarkKey, tables::MarkValue>,
    key: tables::MarkKey,
) -> Result<Option<ContextMark>> {
    match marks.get(key)? {
        Some(v) => decode_mark(v.value().0).map(Some),
        None => Ok(None),
    }
}

/// `message`'s sequence number, refused when it is not a message of `session`.
fn message_seq(txn: &WriteTransaction, session: SessionId, message: MessageId) -> Result<u64> {
    let messages = txn.open_table(tables::MESSAGES)?;
    let row =
        message_rows::get(&messages, message.0)?.ok_or(StoreError::MessageNotFound(message))?;
    let record = RecordView::read(row.bytes())?;
    if record.session() != session {
        return Err(StoreError::Refused(format!(
            "{message} belongs to {}, not {session}: only a node of a session's own context \
             can be forgotten in it",
            record.session()
        )));
    }
    Ok(record.seq())
}

/// Tokens the pinned messages of `session` show together.
fn pinned_tokens(
    txn: &WriteTransaction,
    marks: &redb::Table<tables::MarkKey, tables::MarkValue>,
    session: SessionId,
) -> Result<u64> {
    let mut total = 0;
    for entry in marks.range((session.0, NODE_MESSAGE, 0)..=(session.0, NODE_MESSAGE, u64::MAX))? {
        let (key, value) = entry?;
        if decode_mark(value.value().0)? == ContextMark::Pinned {
            total += shown_tokens(txn, MessageId(key.value().2))?;
        }
    }
    Ok(total)
}
