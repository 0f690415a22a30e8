//! The summary DAG and the active context in the store.
//!
//! [`Store::apply_summary`] is the only way a summary enters the store, and it is also the only
//! way a context changes: one write transaction checks that the span the summary covers is still
//! exactly what the context holds (otherwise the prepared summary is stale and nothing is
//! written), writes the summary, its ordered sources, the covered-by edges, and the session's new
//! context state (and drops the marks of forgotten sources, which the context no longer
//! shows). A crash at any point leaves the old context or the new one, never a mix.

use lcm_core::digest::Digest;
use lcm_core::files::MessageFiles;
use lcm_core::ids::{FileId, MessageId, SessionId, SummaryId};
use lcm_core::summary::{ContextState, NewSummary, NodeRef, Summary, SummaryKind};
use lcm_core::time::Timestamp;
use redb::ReadableTable;

use crate::codec;
use crate::error::{Result, StoreError};
use crate::message_rows;
use crate::record::RecordView;
use crate::store::{Store, StoreReader, next_counter};
use crate::tables::{self, NODE_MESSAGE, NODE_SUMMARY, meta};

/// A summary as stored (the id is the key; sources live in `summary_sources`).
#[derive(Debug, Clone, bincode::Encode, bincode::Decode)]
pub(crate) struct SummaryRecord {
    pub session: u64,
    pub kind: SummaryKind,
    pub depth: u32,
    pub content: String,
    pub token_count: u32,
    pub earliest_at: Timestamp,
    pub latest_at: Timestamp,
    pub descendant_messages: u64,
    pub descendant_tokens: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub file_ids: Vec<FileId>,
    pub level: u8,
    pub model: String,
    pub created_at: Timestamp,
}

/// A node as keys hold it: (kind byte, number).
pub(crate) fn node_key(node: NodeRef) -> (u8, u64) {
    match node {
        NodeRef::Message(id) => (NODE_MESSAGE, id.0),
        NodeRef::Summary(id) => (NODE_SUMMARY, id.0),
    }
}

/// The node a (kind byte, number) key of `table` names.
pub(crate) fn node_from_key(table: &'static str, (kind, n): (u8, u64)) -> Result<NodeRef> {
    match kind {
        NODE_MESSAGE => Ok(NodeRef::Message(MessageId(n))),
        NODE_SUMMARY => Ok(NodeRef::Summary(SummaryId(n))),
        other => Err(StoreError::Corrupt {
            table,
            detail: format!("unknown node kind {other}"),
        }),
    }
}

/// The outcome of [`Store::apply_summary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApplyOutcome {
    /// Written; the context now shows the summary in place of its sources.
    Applied {
        summary: Summary,
        context: ContextState,
    },
    /// The context no longer holds the span the summary was prepared for; nothing was written.
    Stale { reason: String },
}

impl Store {
    /// Writes a prepared summary and swaps it into its session's context, atomically, if the
    /// context still holds exactly its sources: for a leaf, the oldest raw messages from the
    /// context's frontier on; for a condensed summary, a contiguous run of the context's
    /// top-level summaries, the deepest of them one depth below it (a run of one depth is the
    /// usual case; compaction over the hard threshold may merge neighbours of different depths). Otherwise returns [`ApplyOutcome::Stale`]
    /// and writes nothing. Malformed summaries (no sources, wrong kinds or depths, another
    /// session's nodes) are [`StoreError::InvalidMessage`] errors.
    pub fn apply_summary(
        &self,
        mut new: NewSummary,
        file_ids: Vec<FileId>,
    ) -> Result<ApplyOutcome> {
        validate_summary(&new)?;
        let digest = new.digest.take();
        let txn = self.db.begin_write()?;
        let outcome = {
            let sessions = txn.open_table(tables::SESSIONS)?;
            if sessions.get(new.session.0)?.is_none() {
                return Err(StoreError::SessionNotFound(new.session));
            }
            let mut context_table = txn.open_table(tables::CONTEXT)?;
            let state: ContextState = match context_table.get(new.session.0)? {
                Some(bytes) => codec::decode("context", bytes.value())?,
                None => ContextState::default(),
            };
            let messages = txn.open_table(tables::MESSAGES)?;
            let message_files = txn.open_table(tables::MESSAGE_FILES)?;
            let mut summaries = txn.open_table(tables::SUMMARIES)?;

            // Aggregate the sources, checking they are exactly a span of the current context.
            let mut agg = Aggregate::new(file_ids);
            let mut new_state = state.clone();
            // Where the new summary goes in the top-level list.
            let insert_at;
            match new.kind {
                SummaryKind::Leaf => {
                    for (i, source) in new.sources.iter().enumerate() {
                        let NodeRef::Message(id) = source else {
                            unreachable!("validated: leaf sources are messages");
                        };
                        let stored = message_rows::get(&messages, id.0)?
                            .ok_or(StoreError::MessageNotFound(*id))?;
                        let m = RecordView::read(stored.bytes())?;
                        if m.session() != new.session {
                            return Err(StoreError::InvalidMessage(format!(
                                "{id} belongs to {}, not {}",
                                m.session(),
                                new.session
                            )));
                        }
                        if m.seq() != state.raw_from + i as u64 {
                            return Ok(ApplyOutcome::Stale {
                                reason: format!(
                                    "{id} (#{}) is not message #{} of the raw span starting at #{}",
                                    m.seq(),
                                    state.raw_from + i as u64,
                                    state.raw_from
                                ),
                            });
                        }
                        agg.add_message(&m);
                        // A leaf names every file its messages reference (the paper: file
                        // ids propagate through the DAG).
                        if let Some(bytes) = message_files.get(id.0)? {
                            let files: MessageFiles =
                                codec::decode("message_files", bytes.value())?;
                            agg.add_files(files.refs.iter().map(|r| r.file));
                        }
                    }
                    new_state.raw_from = agg.last_seq + 1;
                    insert_at = new_state.summaries.len();
                }
                SummaryKind::Condensed => {
                    let ids: Vec<SummaryId> = new
                        .sources
                        .iter()
                        .map(|s| match s {
                            NodeRef::Summary(id) => *id,
                            NodeRef::Message(_) => {
                                unreachable!("validated: condensed sources are summaries")
                            }
                        })
                        .collect();
                    let Some(start) = state.summaries.iter().position(|s| *s == ids[0]) else {
                        return Ok(ApplyOutcome::Stale {
                            reason: format!(
                                "{} is no longer a top-level summary of the context",
                                ids[0]
                            ),
                        });
                    };
                    if state.summaries.get(start..start + ids.len()) != Some(ids.as_slice()) {
                        return Ok(ApplyOutcome::Stale {
                            reason: "the sources are no longer a contiguous run of the context"
                                .into(),
                        });
                    }
                    let mut deepest = 0;
                    for id in &ids {
                        let bytes = summaries.get(id.0)?.ok_or_else(|| StoreError::Corrupt {
                            table: "context",
                            detail: format!("context of {} points at missing {id}", new.session),
                        })?;
                        let s: SummaryRecord = codec::decode("summaries", bytes.value())?;
                        deepest = deepest.max(s.depth);
                        agg.add_summary(&s);
                    }
                    if deepest + 1 != new.depth {
                        return Err(StoreError::InvalidMessage(format!(
                            "the deepest source has depth {deepest}: a condensed summary over \
                             these sources has depth {}, not {}",
                            deepest + 1,
                            new.depth
                        )));
                    }
                    new_state.summaries.drain(start..start + ids.len());
                    insert_at = start;
                }
            }
            let Some(earliest) = agg.earliest else {
                unreachable!("validated: at least one source");
            };

            let mut meta_table = txn.open_table(tables::META)?;
            let id = next_counter(&mut meta_table, meta::NEXT_SUMMARY)?;
            let created_at = Timestamp::now();
            let record = SummaryRecord {
                session: new.session.0,
                kind: new.kind,
                depth: new.depth,
                content: new.content,
                token_count: new.token_count,
                earliest_at: earliest,
                latest_at: agg.latest.unwrap_or(earliest),
                descendant_messages: agg.messages,
                descendant_tokens: agg.tokens,
                first_seq: agg.first_seq,
                last_seq: agg.last_seq,
                file_ids: agg.file_ids,
                level: new.level,
                model: new.model,
                created_at,
            };
            summaries.insert(id, codec::encode(&record).as_slice())?;
            if let Some(digest) = &digest {
                txn.open_table(tables::SUMMARY_DIGESTS)?
                    .insert(id, codec::encode(digest).as_slice())?;
            }
            let mut sources_table = txn.open_table(tables::SUMMARY_SOURCES)?;
            let mut covered = txn.open_table(tables::COVERED_BY)?;
            for (ordinal, source) in new.sources.iter().enumerate() {
                let key = node_key(*source);
                sources_table.insert((id, ordinal as u32), key)?;
                if let Some(existing) = covered.insert(key, id)? {
                    return Err(StoreError::Corrupt {
                        table: "covered_by",
                        detail: format!("{source} is already covered by sum_{}", existing.value()),
                    });
                }
            }
            txn.open_table(tables::SESSION_SUMMARIES)?
                .insert((new.session.0, id), ())?;
            // A forgotten source leaves the context with this summary: its mark would name
            // nothing the context shows, so it goes (pins stay: they outlive compaction).
            crate::marks::drop_forgotten(&txn, new.session, &new.sources)?;

            // The new summary takes the place of its sources.
            new_state.summaries.insert(insert_at, SummaryId(id));
            new_state.version = state.version + 1;
            context_table.insert(new.session.0, codec::encode(&new_state).as_slice())?;
            ApplyOutcome::Applied {
                summary: record.into_summary(id, new.sources),
                context: new_state,
            }
        };
        if matches!(outcome, ApplyOutcome::Applied { .. }) {
            txn.commit()?;
        } else {
            txn.abort()?;
        }
        Ok(outcome)
    }

    /// The session's context state (empty: no summaries, raw from the first message).
    pub fn context(&self, session: SessionId) -> Result<ContextState> {
        self.reader()?.context(session)
    }

    /// One summary.
    pub fn summary(&self, id: SummaryId) -> Result<Summary> {
        self.reader()?.summary(id)
    }

    /// The summary covering a message or a summary, if any (one lookup).
    pub fn covering(&self, node: NodeRef) -> Result<Option<SummaryId>> {
        self.reader()?.covering(node)
    }

    /// See [`StoreReader::context_messages`].
    pub fn context_messages(&self, session: SessionId) -> Result<Vec<MessageId>> {
        self.reader()?.context_messages(session)
    }

    /// Every summary of a session, in creation order.
    pub fn session_summaries(&self, session: SessionId) -> Result<Vec<Summary>> {
        let reader = self.reader()?;
        let table = reader.txn.open_table(tables::SESSION_SUMMARIES)?;
        let mut out = Vec::new();
        for entry in table.range((session.0, 0)..=(session.0, u64::MAX))? {
            let (key, _) = entry?;
            out.push(reader.summary(SummaryId(key.value().1))?);
        }
        Ok(out)
    }

    /// How many summaries a session has, without reading them.
    pub fn session_summary_count(&self, session: SessionId) -> Result<u64> {
        let reader = self.reader()?;
        let table = reader.txn.open_table(tables::SESSION_SUMMARIES)?;
        let mut count = 0;
        for entry in table.range((session.0, 0)..=(session.0, u64::MAX))? {
            entry?;
            count += 1;
        }
        Ok(count)
    }

    /// The id the next summary will get (one past the newest): summary ids are dense, in
    /// creation order, and a summary never changes once made.
    pub fn next_summary_id(&self) -> Result<SummaryId> {
        let txn = self.db.begin_read()?;
        let meta_table = txn.open_table(tables::META)?;
        Ok(SummaryId(
            meta_table.get(meta::NEXT_SUMMARY)?.map_or(0, |v| v.value()),
        ))
    }

    /// Summaries in the whole store (for integrity checks and stats).
    pub fn summary_count(&self) -> Result<u64> {
        use redb::ReadableTableMetadata;
        let txn = self.db.begin_read()?;
        Ok(txn.open_table(tables::SUMMARIES)?.len()?)
    }
}

impl StoreReader {
    /// The session's context state.
    pub fn context(&self, session: SessionId) -> Result<ContextState> {
        self.session(session)?;
        let table = self.txn.open_table(tables::CONTEXT)?;
        match table.get(session.0)? {
            Some(bytes) => codec::decode("context", bytes.value()),
            None => Ok(ContextState::default()),
        }
    }

    /// One summary with its ordered sources.
    pub fn summary(&self, id: SummaryId) -> Result<Summary> {
        let table = self.txn.open_table(tables::SUMMARIES)?;
        let bytes = table.get(id.0)?.ok_or(StoreError::SummaryNotFound(id))?;
        let record: SummaryRecord = codec::decode("summaries", bytes.value())?;
        let sources_table = self.txn.open_table(tables::SUMMARY_SOURCES)?;
        let mut sources = Vec::new();
        for entry in sources_table.range((id.0, 0)..=(id.0, u32::MAX))? {
            let (_, node) = entry?;
            sources.push(node_from_key("summary_sources", node.value())?);
        }
        Ok(record.into_summary(id.0, sources))
    }

    /// The digest written with a summary (`None` for a summary written without one, or by a
    /// build before schema 5).
    pub fn summary_digest(&self, id: SummaryId) -> Result<Option<Digest>> {
        let table = match self.txn.open_table(tables::SUMMARY_DIGESTS) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        match table.get(id.0)? {
            Some(bytes) => Ok(Some(codec::decode("summary_digests", bytes.value())?)),
            None => Ok(None),
        }
    }

    /// Every message the session's context reaches, in order: each top-level summary expanded
    /// down to its messages (depth first, sources in order), then the raw tail. When the store
    /// is consistent this is every message of the session exactly once, oldest first.
    pub fn context_messages(&self, session: SessionId) -> Result<Vec<MessageId>> {
        let state = self.context(session)?;
        let mut out = Vec::new();
        let mut stack: Vec<NodeRef> = state
            .summaries
            .iter()
            .rev()
            .map(|s| NodeRef::Summary(*s))
            .collect();
        while let Some(node) = stack.pop() {
            match node {
                NodeRef::Message(id) => out.push(id),
                NodeRef::Summary(id) => stack.extend(self.summary(id)?.sources.into_iter().rev()),
            }
        }
        self.for_each_in_session(session, state.raw_from..u64::MAX, |m| {
            out.push(m.id);
            std::ops::ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// The summary covering `node`, if any.
    pub fn covering(&self, node: NodeRef) -> Result<Option<SummaryId>> {
        let table = self.txn.open_table(tables::COVERED_BY)?;
        Ok(table.get(node_key(node))?.map(|v| SummaryId(v.value())))
    }
}

impl SummaryRecord {
    fn into_summary(self, id: u64, sources: Vec<NodeRef>) -> Summary {
        Summary {
            id: SummaryId(id),
            session: SessionId(self.session),
            kind: self.kind,
            depth: self.depth,
            content: self.content,
            token_count: self.token_count,
            earliest_at: self.earliest_at,
            latest_at: self.latest_at,
            descendant_messages: self.descendant_messages,
            descendant_tokens: self.descendant_tokens,
            first_seq: self.first_seq,
            last_seq: self.last_seq,
            sources,
            file_ids: self.file_ids,
            level: self.level,
            model: self.model,
            created_at: self.created_at,
        }
    }
}

/// Totals over a summary's sources.
struct Aggregate {
    earliest: Option<Timestamp>,
    latest: Option<Timestamp>,
    messages: u64,
    tokens: u64,
    first_seq: u64,
    last_seq: u64,
    file_ids: Vec<FileId>,
    any: bool,
}

impl Aggregate {
    fn new(file_ids: Vec<FileId>) -> Self {
        Aggregate {
            earliest: None,
            latest: None,
            messages: 0,
            tokens: 0,
            first_seq: 0,
            last_seq: 0,
            file_ids,
            any: false,
        }
    }

    fn span(&mut self, earliest: Timestamp, latest: Timestamp, first: u64, last: u64) {
        self.earliest = Some(self.earliest.map_or(earliest, |e| e.min(earliest)));
        self.latest = Some(self.latest.map_or(latest, |l| l.max(latest)));
        if !self.any {
            self.first_seq = first;
        }
        self.last_seq = last;
        self.any = true;
    }

    fn add_message(&mut self, m: &RecordView<'_>) {
        self.span(m.created_at(), m.created_at(), m.seq(), m.seq());
        self.messages += 1;
        self.tokens += u64::from(m.token_count());
    }

    fn add_summary(&mut self, s: &SummaryRecord) {
        self.span(s.earliest_at, s.latest_at, s.first_seq, s.last_seq);
        self.messages += s.descendant_messages;
        self.tokens += s.descendant_tokens;
        self.add_files(s.file_ids.iter().copied());
    }

    /// Adds files not yet named, keeping first-seen order.
    fn add_files(&mut self, files: impl Iterator<Item = FileId>) {
        for f in files {
            if !self.file_ids.contains(&f) {
                self.file_ids.push(f);
            }
        }
    }
}

fn validate_summary(new: &NewSummary) -> Result<()> {
    let invalid = |detail: String| Err(StoreError::InvalidMessage(detail));
    if new.sources.is_empty() {
        return invalid("a summary needs at least one source".into());
    }
    if new.content.trim().is_empty() {
        return invalid("a summary needs content".into());
    }
    if !(1..=3).contains(&new.level) {
        return invalid(format!(
            "escalation level must be 1, 2 or 3, got {}",
            new.level
        ));
    }
    match new.kind {
        SummaryKind::Leaf => {
            if new.depth != 0 {
                return invalid(format!("a leaf summary has depth 0, got {}", new.depth));
            }
            if !new.sources.iter().all(|s| matches!(s, NodeRef::Message(_))) {
                return invalid("a leaf summary's sources must all be messages".into());
            }
        }
        SummaryKind::Condensed => {
            if new.depth == 0 {
                return invalid("a condensed summary has depth 1 or more".into());
            }
            if !new.sources.iter().all(|s| matches!(s, NodeRef::Summary(_))) {
                return invalid("a condensed summary's sources must all be summaries".into());
            }
        }
    }
    Ok(())
}
