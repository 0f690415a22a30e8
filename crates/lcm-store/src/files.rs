//! File records in the store: registered inside the append that brings a file read or a large
//! payload, read back by id, by message and by file.
//!
//! An append registers, in its own transaction (so a context never sees a large payload without
//! its reference, nor a reference without its record):
//! - every tool call that reads a file (`lcm_core::files::read_call_path`), keyed by session and
//!   call id in `read_calls`, so the call's result, appended now or later, links to the path;
//! - every tool result of such a call, and every part with more tokens than
//!   `large_file_tokens`, as a file record (one per distinct content: `file_hashes`), with its
//!   exploration summary (`lcm_files::explore`), and the message's references in
//!   `message_files` / `file_messages`;
//! - every file part (`Part::File`: a path, no content) as a record of that path.
//!
//! The message itself is stored verbatim as always: a record only changes what a context shows.

use std::ops::Range;

use lcm_core::files::{
    FileInfo, FileRef, MessageFiles, read_call_path, render_file_reference, shown_part,
};
use lcm_core::ids::{FileId, MessageId, SessionId};
use lcm_core::message::Part;
use lcm_core::time::Timestamp;
use lcm_core::tokens::{MESSAGE_OVERHEAD_TOKENS, TokenCounter};
use redb::ReadableTable;
use sha2::{Digest, Sha256};

use crate::codec;
use crate::error::{Result, StoreError};
use crate::message_rows;
use crate::record::RecordView;
use crate::session_runs;
use crate::store::{StoreReader, next_counter};
use crate::tables::{self, meta};

/// What the store does with large payloads and file reads ([`crate::StoreOptions::files`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRules {
    /// Parts with more tokens than this are shown by reference.
    pub large_file_tokens: u32,
    /// Most tokens of an exploration summary.
    pub exploration_max_tokens: u32,
}

impl Default for FileRules {
    fn default() -> Self {
        let config = lcm_core::config::FilesConfig::default();
        FileRules::from(&config)
    }
}

impl From<&lcm_core::config::FilesConfig> for FileRules {
    fn from(c: &lcm_core::config::FilesConfig) -> Self {
        FileRules {
            large_file_tokens: c.large_file_tokens,
            exploration_max_tokens: c.exploration_max_tokens,
        }
    }
}

/// What a message brings to the file tables, found before its transaction (from its parts,
/// which are encoded by then).
#[derive(Debug, Default)]
pub(crate) struct FileCandidates {
    /// (call id, path) of tool calls that read a file.
    pub read_calls: Vec<(String, String)>,
    /// (part index, call id) of tool results that are not errors: each is a file read if its
    /// call is one.
    pub results: Vec<(u32, String)>,
    /// (part index, tokens) of parts over the large-file threshold.
    pub large: Vec<(u32, u32)>,
    /// (part index, path, MIME type) of file parts.
    pub paths: Vec<(u32, String, Option<String>)>,
}

impl FileCandidates {
    /// Looks at a message's parts: tool calls and results, file parts, and (when the message
    /// as a whole passes the threshold) each part's tokens, taken from `part_tokens` when the
    /// caller counted them already.
    pub fn of(
        parts: &[Part],
        token_count: u32,
        part_tokens: Option<&[u64]>,
        rules: FileRules,
        counter: TokenCounter,
    ) -> Self {
        let mut out = FileCandidates::default();
        let large = token_count > rules.large_file_tokens;
        for (i, part) in parts.iter().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            match part {
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    if let Some(path) = read_call_path(name, arguments) {
                        out.read_calls.push((id.clone(), path));
                    }
                }
                Part::ToolResult {
                    call_id, is_error, ..
                } if !is_error => out.results.push((index, call_id.clone())),
                Part::File { path, mime_type } => {
                    out.paths.push((index, path.clone(), mime_type.clone()));
                }
                _ => {}
            }
            if large
                && let Some(text) = part.searchable_text()
                && text.len() > rules.large_file_tokens as usize
            {
                let tokens = match part_tokens.and_then(|t| t.get(i)) {
                    Some(counted) => *counted,
                    None => counter.count_text(&text) as u64,
                };
                if tokens > u64::from(rules.large_file_tokens) {
                    out.large
                        .push((index, u32::try_from(tokens).unwrap_or(u32::MAX)));
                }
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.read_calls.is_empty()
            && self.results.is_empty()
            && self.large.is_empty()
            && self.paths.is_empty()
    }

    /// Whether registering needs the parts' contents (not only call ids).
    fn may_register(&self) -> bool {
        !self.results.is_empty() || !self.large.is_empty() || !self.paths.is_empty()
    }
}

/// The file tables, open in an append's write transaction.
pub(crate) struct FileTables<'t> {
    files: redb::Table<'t, u64, &'static [u8]>,
    hashes: redb::Table<'t, &'static [u8], u64>,
    message_files: redb::Table<'t, u64, &'static [u8]>,
    file_messages: redb::Table<'t, (u64, u64), ()>,
    read_calls: redb::Table<'t, (u64, &'static str), &'static str>,
    rules: FileRules,
    counter: TokenCounter,
}

/// A part's content being registered.
struct Content<'a> {
    part: u32,
    path: Option<&'a str>,
    text: &'a str,
    /// Its tokens, when already counted.
    tokens: Option<u32>,
    /// Whether contexts show it by reference (it then needs its exploration summary now).
    shown_by_reference: bool,
}

/// The exploration summary of a content, as file records hold it.
pub fn explored_summary(
    path: Option<&str>,
    text: &str,
    counter: TokenCounter,
    max_tokens: u32,
) -> String {
    let input = lcm_files::ExploreInput {
        path,
        mime_type: None,
        bytes: text.as_bytes(),
    };
    lcm_files::explore(&input, &counter, max_tokens as usize).summary
}

/// One message being appended, as the file tables need it.
pub(crate) struct Appending<'a> {
    pub id: u64,
    pub session: u64,
    pub token_count: u32,
    pub created_at: Timestamp,
    /// Decodes the message's parts (only called when a part may become a record).
    pub parts: &'a dyn Fn() -> Result<Vec<Part>>,
}

impl<'t> FileTables<'t> {
    pub fn open(
        txn: &'t redb::WriteTransaction,
        rules: FileRules,
        counter: TokenCounter,
    ) -> Result<Self> {
        Ok(FileTables {
            files: txn.open_table(tables::FILES)?,
            hashes: txn.open_table(tables::FILE_HASHES)?,
            message_files: txn.open_table(tables::MESSAGE_FILES)?,
            file_messages: txn.open_table(tables::FILE_MESSAGES)?,
            read_calls: txn.open_table(tables::READ_CALLS)?,
            rules,
            counter,
        })
    }

    /// Registers what one appended message brings (see the module doc).
    pub fn add(
        &mut self,
        meta_table: &mut redb::Table<'_, &'static str, u64>,
        m: Appending<'_>,
        candidates: &FileCandidates,
    ) -> Result<()> {
        for (call_id, path) in &candidates.read_calls {
            self.read_calls
                .insert((m.session, call_id.as_str()), path.as_str())?;
        }
        if !candidates.may_register() {
            return Ok(());
        }
        // Which parts become records: reads (inline unless large), large parts, file parts.
        let mut wanted: Vec<(u32, Option<String>, bool)> = Vec::new();
        for (part, call_id) in &candidates.results {
            let path = self
                .read_calls
                .get((m.session, call_id.as_str()))?
                .map(|p| p.value().to_owned());
            let large = candidates.large.iter().any(|(i, _)| i == part);
            if path.is_some() || large {
                wanted.push((*part, path, !large));
            }
        }
        for (part, _) in &candidates.large {
            if !wanted.iter().any(|(i, _, _)| i == part) {
                wanted.push((*part, None, false));
            }
        }
        let mut refs = Vec::new();
        let mut context_tokens = i64::from(m.token_count);
        if !wanted.is_empty() {
            let parts = (m.parts)()?;
            wanted.sort_by_key(|(i, _, _)| *i);
            for (part, path, inline) in wanted {
                let Some(original) = parts.get(part as usize) else {
                    continue;
                };
                let Some(text) = original.searchable_text() else {
                    continue;
                };
                // A large part's tokens were counted before the transaction, and a message of
                // one part is that part and the per-message overhead: not counted again.
                let counted = candidates
                    .large
                    .iter()
                    .find(|(i, _)| *i == part)
                    .map(|(_, t)| *t)
                    .or_else(|| {
                        (parts.len() == 1)
                            .then(|| m.token_count.saturating_sub(MESSAGE_OVERHEAD_TOKENS))
                    });
                let file = self.register_content(
                    meta_table,
                    &m,
                    Content {
                        part,
                        path: path.as_deref(),
                        text: &text,
                        tokens: counted,
                        shown_by_reference: !inline,
                    },
                )?;
                if !inline {
                    // What the context pays for the part, shown as the reference, exactly as
                    // the message's own count is made (per part, `count_message`).
                    let tokens = counted.unwrap_or(0);
                    let shown = shown_part(original, render_file_reference(&file));
                    let shown_tokens = shown
                        .searchable_text()
                        .map_or(0, |t| self.counter.count_text(t.as_ref()));
                    context_tokens += shown_tokens as i64 - i64::from(tokens);
                }
                refs.push(FileRef {
                    part,
                    file: file.id,
                    inline,
                });
            }
        }
        for (part, path, mime) in &candidates.paths {
            let file = self.register_path(meta_table, &m, *part, path, mime.as_deref())?;
            refs.push(FileRef {
                part: *part,
                file: file.id,
                inline: true,
            });
        }
        if refs.is_empty() {
            return Ok(());
        }
        for r in &refs {
            self.file_messages.insert((r.file.0, m.id), ())?;
        }
        let record = MessageFiles {
            refs,
            context_tokens: u32::try_from(context_tokens.max(1)).unwrap_or(u32::MAX),
        };
        self.message_files
            .insert(m.id, codec::encode(&record).as_slice())?;
        Ok(())
    }

    /// The record of this content: the existing one if the same content was seen before, else
    /// a new one with its exploration summary.
    /// The record of this content: the existing one if the same content was seen before, else
    /// a new one. Its exploration summary is computed only when a context shows it by reference
    /// (now or, for content first seen in a small read, the first time it comes back large):
    /// a small read stays in the context as it is, and `explored` gives its summary on demand.
    fn register_content(
        &mut self,
        meta_table: &mut redb::Table<'_, &'static str, u64>,
        m: &Appending<'_>,
        content: Content<'_>,
    ) -> Result<FileInfo> {
        let bytes = content.text.as_bytes();
        let hash = Sha256::digest(bytes);
        if let Some(mut existing) = self.existing(hash.as_slice())? {
            if content.shown_by_reference && existing.exploration.is_empty() {
                existing.exploration = self.explore(existing.path.as_deref(), content.text);
                self.update(&mut existing)?;
            }
            return Ok(existing);
        }
        let input = lcm_files::ExploreInput {
            path: content.path,
            mime_type: None,
            bytes,
        };
        let (kind, mime_type, language) = lcm_files::detect(&input);
        let exploration = if content.shown_by_reference {
            self.explore(content.path, content.text)
        } else {
            String::new()
        };
        let id = next_counter(meta_table, meta::NEXT_FILE)?;
        let mut info = FileInfo {
            id: FileId(id),
            session: SessionId(m.session),
            path: content.path.map(str::to_owned),
            kind: kind.as_str().to_owned(),
            mime_type,
            language,
            byte_len: bytes.len() as u64,
            token_count: content.tokens.unwrap_or_else(|| {
                u32::try_from(self.counter.count_text(content.text)).unwrap_or(u32::MAX)
            }),
            content_hash: hex(hash.as_slice()),
            content_message: Some(MessageId(m.id)),
            content_part: content.part,
            exploration,
            reference_tokens: 0,
            created_at: m.created_at,
        };
        self.insert_new(hash.as_slice(), &mut info)?;
        Ok(info)
    }

    fn explore(&self, path: Option<&str>, text: &str) -> String {
        explored_summary(path, text, self.counter, self.rules.exploration_max_tokens)
    }

    /// The record of a path named by a file part (no content: it lives on the filesystem).
    fn register_path(
        &mut self,
        meta_table: &mut redb::Table<'_, &'static str, u64>,
        m: &Appending<'_>,
        part: u32,
        path: &str,
        mime: Option<&str>,
    ) -> Result<FileInfo> {
        let mut hasher = Sha256::new();
        hasher.update(b"path:");
        hasher.update(path.as_bytes());
        let key = hasher.finalize();
        if let Some(existing) = self.existing(key.as_slice())? {
            return Ok(existing);
        }
        let input = lcm_files::ExploreInput {
            path: Some(path),
            mime_type: mime,
            bytes: &[],
        };
        let (kind, mime_type, language) = lcm_files::detect(&input);
        let id = next_counter(meta_table, meta::NEXT_FILE)?;
        let mut info = FileInfo {
            id: FileId(id),
            session: SessionId(m.session),
            path: Some(path.to_owned()),
            kind: kind.as_str().to_owned(),
            mime_type: mime.map_or(mime_type, str::to_owned),
            language,
            byte_len: 0,
            token_count: 0,
            content_hash: String::new(),
            content_message: None,
            content_part: part,
            exploration: "A file named by the conversation; its content was not part of it (it \
                          stays on the filesystem)."
                .into(),
            reference_tokens: 0,
            created_at: m.created_at,
        };
        self.insert_new(key.as_slice(), &mut info)?;
        Ok(info)
    }

    fn existing(&self, key: &[u8]) -> Result<Option<FileInfo>> {
        let Some(id) = self.hashes.get(key)?.map(|v| v.value()) else {
            return Ok(None);
        };
        let bytes = self.files.get(id)?.ok_or_else(|| StoreError::Corrupt {
            table: "file_hashes",
            detail: format!("points at missing file_{id}"),
        })?;
        Ok(Some(codec::decode("files", bytes.value())?))
    }

    fn insert_new(&mut self, key: &[u8], info: &mut FileInfo) -> Result<()> {
        self.update(info)?;
        self.hashes.insert(key, info.id.0)?;
        Ok(())
    }

    /// Writes `info` (new, or with its exploration just computed), with the tokens of its
    /// reference.
    fn update(&mut self, info: &mut FileInfo) -> Result<()> {
        info.reference_tokens = if info.exploration.is_empty() {
            0
        } else {
            u32::try_from(self.counter.count_text(&render_file_reference(info))).unwrap_or(u32::MAX)
        };
        self.files
            .insert(info.id.0, codec::encode(&*info).as_slice())?;
        Ok(())
    }
}

/// Lowercase hex of a hash.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// SHA-256 of `bytes`, lowercase hex: the hash a [`FileInfo::content_hash`] holds.
pub fn content_hash(bytes: &[u8]) -> String {
    hex(Sha256::digest(bytes).as_slice())
}

/// Opens a file table for reading; a store written before schema 4 has none (`None`).
macro_rules! open_optional {
    ($txn:expr, $def:expr) => {
        match $txn.open_table($def) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        }
    };
}

impl crate::Store {
    /// A file record with its exploration summary (computed now from the content as seen, for
    /// a small read whose summary no context has needed yet), and that content.
    pub fn file_explored(
        &self,
        reader: &StoreReader,
        id: FileId,
    ) -> Result<(FileInfo, Option<String>)> {
        let mut info = reader.file(id)?;
        let content = reader.file_content(&info)?;
        if info.exploration.is_empty()
            && let Some(text) = &content
        {
            info.exploration = explored_summary(
                info.path.as_deref(),
                text,
                self.counter(),
                self.file_rules().exploration_max_tokens,
            );
        }
        Ok((info, content))
    }
}

impl StoreReader {
    /// A file record as stored (a small read's has no exploration summary yet: see
    /// [`crate::Store::file_explored`]).
    pub fn file(&self, id: FileId) -> Result<FileInfo> {
        let Some(files) = open_optional!(self.txn, tables::FILES) else {
            return Err(StoreError::FileNotFound(id));
        };
        let bytes = files.get(id.0)?.ok_or(StoreError::FileNotFound(id))?;
        codec::decode("files", bytes.value())
    }

    /// A message's file references, if it has any.
    pub fn message_files(&self, id: MessageId) -> Result<Option<MessageFiles>> {
        let Some(table) = open_optional!(self.txn, tables::MESSAGE_FILES) else {
            return Ok(None);
        };
        match table.get(id.0)? {
            Some(bytes) => Ok(Some(codec::decode("message_files", bytes.value())?)),
            None => Ok(None),
        }
    }

    /// The file references of `session`'s messages with sequence numbers in `seqs`, in order.
    /// Reads the references table over the session's runs of ids, not the messages: only a
    /// message with a file read or a large part has references, so a long stretch of a
    /// session costs a few seeks.
    pub fn session_message_files(
        &self,
        session: SessionId,
        seqs: Range<u64>,
    ) -> Result<Vec<(MessageId, MessageFiles)>> {
        self.session(session)?;
        let Some(table) = open_optional!(self.txn, tables::MESSAGE_FILES) else {
            return Ok(Vec::new());
        };
        let index = self.txn.open_table(tables::SESSION_RUNS)?;
        let mut out = Vec::new();
        for run in session_runs::runs_in(&index, session.0, seqs.clone())? {
            let run = run?;
            let ids = run.ids_within(&seqs);
            if ids.is_empty() {
                continue;
            }
            for entry in table.range(ids)? {
                let (id, bytes) = entry?;
                let files = codec::decode("message_files", bytes.value())?;
                out.push((MessageId(id.value()), files));
            }
        }
        Ok(out)
    }

    /// The tokens message `id` shows in a context: the count its file references record
    /// (large parts as references), else its stored count.
    pub fn shown_tokens(&self, id: MessageId) -> Result<u64> {
        let files = open_optional!(self.txn, tables::MESSAGE_FILES);
        let messages = self.txn.open_table(tables::MESSAGES)?;
        shown_tokens_in(files.as_ref(), &messages, id)
    }

    /// Tokens the file references save in `session`'s messages with sequence numbers in
    /// `seqs`: each one's stored count less what a context shows of it (large parts as
    /// references). Reads the references and the record headers of those messages only.
    pub fn file_reference_savings(&self, session: SessionId, seqs: Range<u64>) -> Result<u64> {
        let messages = self.txn.open_table(tables::MESSAGES)?;
        let mut saved = 0u64;
        for (id, files) in self.session_message_files(session, seqs)? {
            let stored = stored_tokens(&messages, id)?;
            saved += stored.saturating_sub(u64::from(files.context_tokens));
        }
        Ok(saved)
    }

    /// The messages that reference a file, in order.
    pub fn file_messages(&self, id: FileId) -> Result<Vec<MessageId>> {
        let Some(table) = open_optional!(self.txn, tables::FILE_MESSAGES) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for entry in table.range((id.0, 0)..=(id.0, u64::MAX))? {
            out.push(MessageId(entry?.0.value().1));
        }
        Ok(out)
    }

    /// Number of file records.
    pub fn file_count(&self) -> Result<u64> {
        use redb::ReadableTableMetadata;
        let Some(files) = open_optional!(self.txn, tables::FILES) else {
            return Ok(0);
        };
        Ok(files.len()?)
    }

    /// The text of a file record's content as it was seen: the part of the message that carried
    /// it. `None` for a record of a path alone (its content was never in the conversation).
    pub fn file_content(&self, info: &FileInfo) -> Result<Option<String>> {
        let Some(message) = info.content_message else {
            return Ok(None);
        };
        let m = self.message(message)?;
        let part = m
            .parts
            .get(info.content_part as usize)
            .ok_or_else(|| StoreError::Corrupt {
                table: "files",
                detail: format!(
                    "{} names part {} of {message}, which has {} parts",
                    info.id,
                    info.content_part,
                    m.parts.len()
                ),
            })?;
        Ok(part.searchable_text().map(|t| t.into_owned()))
    }
}

/// What [`backfill`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Backfilled {
    /// Messages that got file references.
    pub messages: u64,
    /// Summaries whose file ids were filled in.
    pub summaries: u64,
}

/// Registers the file records of every stored message, in id order, as the appends of this
/// build would have, and fills in the file ids of the summaries above them (a leaf's from its
/// messages, a condensed summary's from its children, which always have smaller ids): what a
/// store written before schema 4 lacks. Runs in the writable open that upgrades it, inside its
/// transaction.
pub(crate) fn backfill(
    txn: &redb::WriteTransaction,
    meta_table: &mut redb::Table<'_, &'static str, u64>,
    rules: FileRules,
    counter: TokenCounter,
) -> Result<Backfilled> {
    use std::collections::HashMap;
    use std::ops::ControlFlow;

    use crate::dag::SummaryRecord;
    use crate::record::RecordView;

    let mut done = Backfilled::default();
    {
        let messages = txn.open_table(tables::MESSAGES)?;
        let mut files = FileTables::open(txn, rules, counter)?;
        let _: ControlFlow<()> =
            crate::message_rows::for_each(&messages, 0..u64::MAX, |id, bytes| {
                let record = RecordView::read(bytes)?;
                let record_parts = record.parts()?;
                let candidates =
                    FileCandidates::of(&record_parts, record.token_count(), None, rules, counter);
                if candidates.is_empty() {
                    return Ok(ControlFlow::Continue(()));
                }
                let parts = || -> Result<Vec<Part>> { Ok(record_parts.clone()) };
                let appending = Appending {
                    id,
                    session: record.session().0,
                    token_count: record.token_count(),
                    created_at: record.created_at(),
                    parts: &parts,
                };
                files.add(meta_table, appending, &candidates)?;
                done.messages += 1;
                Ok(ControlFlow::Continue(()))
            })?;
    }
    let message_files = txn.open_table(tables::MESSAGE_FILES)?;
    let sources = txn.open_table(tables::SUMMARY_SOURCES)?;
    let mut summaries = txn.open_table(tables::SUMMARIES)?;
    let mut file_ids: HashMap<u64, Vec<FileId>> = HashMap::new();
    let ids: Vec<u64> = summaries
        .iter()?
        .map(|entry| entry.map(|(k, _)| k.value()))
        .collect::<std::result::Result<_, _>>()?;
    for id in ids {
        let mut union: Vec<FileId> = Vec::new();
        for row in sources.range((id, 0)..=(id, u32::MAX))? {
            let (kind, n) = row?.1.value();
            let more: Vec<FileId> = if kind == tables::NODE_MESSAGE {
                match message_files.get(n)? {
                    Some(bytes) => codec::decode::<MessageFiles>("message_files", bytes.value())?
                        .refs
                        .iter()
                        .map(|r| r.file)
                        .collect(),
                    None => Vec::new(),
                }
            } else {
                file_ids.get(&n).cloned().unwrap_or_default()
            };
            for f in more {
                if !union.contains(&f) {
                    union.push(f);
                }
            }
        }
        let Some(bytes) = summaries.get(id)?.map(|b| b.value().to_vec()) else {
            continue;
        };
        let mut record: SummaryRecord = codec::decode("summaries", &bytes)?;
        if record.file_ids != union && !union.is_empty() {
            record.file_ids = union.clone();
            summaries.insert(id, codec::encode(&record).as_slice())?;
            done.summaries += 1;
        }
        file_ids.insert(id, union);
    }
    Ok(done)
}

/// The tokens `message` shows in a context: the count its file references record (what the
/// engine's `shown_message` shows: large parts as references; the stored count when every
/// reference is inline), else its stored count. `files` is `None` in a store without file
/// tables.
pub(crate) fn shown_tokens_in(
    files: Option<&impl ReadableTable<u64, &'static [u8]>>,
    messages: &impl ReadableTable<u64, &'static [u8]>,
    message: MessageId,
) -> Result<u64> {
    if let Some(bytes) = files.map(|f| f.get(message.0)).transpose()?.flatten() {
        let files: MessageFiles = codec::decode("message_files", bytes.value())?;
        return Ok(u64::from(files.context_tokens));
    }
    stored_tokens(messages, message)
}

/// The token count stored with `message` (its record's header).
fn stored_tokens(
    messages: &impl ReadableTable<u64, &'static [u8]>,
    message: MessageId,
) -> Result<u64> {
    let row =
        message_rows::get(messages, message.0)?.ok_or(StoreError::MessageNotFound(message))?;
    Ok(u64::from(RecordView::read(row.bytes())?.token_count()))
}
