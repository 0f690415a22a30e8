//! The trigram index: for each lowercased character trigram, the messages whose text holds it,
//! to narrow regex search to the messages that can match ([`lcm_regex::trigram`] plans the query,
//! [`crate::trigram_keys`] keys the trigrams).
//!
//! Messages never change and their ids only grow, so the index is a list of immutable
//! **segments**, each covering a contiguous range of message ids, together covering every id
//! below the search index's watermark, in id order. A catch-up writes one segment for the
//! messages it indexes (more if they do not fit the builder's memory budget); segments of
//! similar size at the tail are merged four at a time, so a history of n messages is held in
//! O(log n) segments. There is nothing to delete or update, and merging is concatenation.
//!
//! This replaces a trigram field in tantivy, which spent most of the indexing time hashing
//! each (message, trigram) pair into its term dictionary as a string: here a pair is a table
//! lookup and a push while messages are added, and a counting sort when the segment is written.
//!
//! **Segment file** (`{first:020}-{end:020}.tri`, little-endian):
//! `LCMTRI01`; the postings of each key in key order (message ids as LEB128 varints, the first
//! as its distance from the segment's first id, each next as its gap to the previous minus
//! one); the keys (`u64` each, ascending); the end offset of each key's postings (`u64` each,
//! from the start of the postings); a footer of first id, end id, number of keys, offset of the
//! keys, offset of the ends (`u64` each) and `LCMTRI01` again.
//!
//! **Durability and the watermark.** A segment is written to a temporary file, synced and
//! renamed (and its directory synced) before the tantivy commit whose watermark covers it; it
//! becomes searchable (published) after that commit. A merge writes its segment the same way
//! before deleting the ones it replaces. At open, segments past the watermark (written for a
//! commit that never happened) and segments inside a larger one (left by an interrupted merge)
//! are deleted; if the rest do not cover exactly the ids below the watermark, the index is
//! unusable and the caller rebuilds it from the store.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::{ControlFlow, Range};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustc_hash::FxHashMap;

use crate::trigram_keys::{ASCII_TRIGRAMS, DistinctTrigrams, ascii_slot, gram_key};
use lcm_regex::trigram::TrigramQuery;
use lcm_store::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LCMTRI01";
const FOOTER_LEN: usize = 5 * 8 + MAGIC.len();
const SUFFIX: &str = ".tri";
const TMP_SUFFIX: &str = ".tri.tmp";
/// Segments merged at once, when this many of one size level sit at the tail.
const MERGE_FAN_IN: usize = 4;
/// What verifying one candidate on the stored text costs (a record read and a regex run, about
/// a microsecond), in bytes of postings decoded in the same time.
const VERIFY_COST: usize = 1024;
/// Candidates handed to the caller in the first batch; each next batch is twice as large, up
/// to [`MAX_BATCH`].
const FIRST_BATCH: usize = 32;
const MAX_BATCH: usize = 4096;
/// (message, trigram) pairs a builder holds before it writes a segment early: 8 bytes each,
/// 64 MiB.
const BUILDER_PAIRS: usize = 8 << 20;
/// Room for pairs a builder keeps between catch-ups (8 MiB): what a bulk catch-up grew beyond
/// it is given back at its end ([`TrigramBuilder::release_bulk_memory`]), so that a host that
/// once indexed a large import does not hold that memory for good.
pub(crate) const KEEP_PAIRS: usize = 1 << 20;

/// The published segments, and where their files live (`None`: in memory).
pub(crate) struct TrigramIndex {
    dir: Option<PathBuf>,
    live: RwLock<Arc<Vec<Arc<Segment>>>>,
}

impl std::fmt::Debug for TrigramIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrigramIndex")
            .field("dir", &self.dir)
            .field("segments", &self.segments().len())
            .finish()
    }
}

impl TrigramIndex {
    /// An empty index whose segments live in memory (tests and benchmarks).
    pub(crate) fn in_memory() -> TrigramIndex {
        TrigramIndex {
            dir: None,
            live: RwLock::new(Arc::new(Vec::new())),
        }
    }

    /// A new, empty index in `dir` (created if absent; segment files already there, finished
    /// or not, are deleted).
    pub(crate) fn create(dir: &Path) -> Result<TrigramIndex> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::io(dir, e))?;
        let (segments, unfinished) = segment_files(dir)?;
        for path in segments.iter().map(|(path, _)| path).chain(&unfinished) {
            remove_file(path)?;
        }
        Ok(TrigramIndex {
            dir: Some(dir.to_path_buf()),
            live: RwLock::new(Arc::new(Vec::new())),
        })
    }

    /// Opens the segments in `dir` that cover the ids below `watermark`. `None` if they do not
    /// (missing, damaged or overlapping segments): the caller rebuilds. A writable open also
    /// deletes leftovers (temporary files, segments past the watermark or inside another);
    /// a read-only one changes nothing.
    pub(crate) fn open(dir: &Path, watermark: u64, writable: bool) -> Result<Option<TrigramIndex>> {
        if !dir.is_dir() {
            return Ok(None);
        }
        let (mut files, unfinished) = segment_files(dir)?;
        // By first id, the widest first: a segment inside an earlier one is a merge's leftover.
        files.sort_by_key(|(_, ids)| (ids.start, std::cmp::Reverse(ids.end)));
        let mut kept = Vec::new();
        let mut leftovers = Vec::new();
        let mut covered = 0;
        for (path, ids) in files {
            if ids.end <= covered || ids.start >= watermark {
                leftovers.push(path);
            } else if ids.start == covered && ids.end <= watermark {
                covered = ids.end;
                kept.push((path, ids));
            } else {
                // A gap, a partial overlap or a segment across the watermark.
                return Ok(None);
            }
        }
        if covered != watermark {
            return Ok(None);
        }
        let mut segments = Vec::with_capacity(kept.len());
        for (path, ids) in kept {
            match Segment::map(&path) {
                Ok(segment) if segment.ids == ids => segments.push(Arc::new(segment)),
                Ok(_) | Err(StoreError::Corrupt { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        if writable {
            for path in leftovers.iter().chain(&unfinished) {
                remove_file(path)?;
            }
        }
        Ok(Some(TrigramIndex {
            dir: Some(dir.to_path_buf()),
            live: RwLock::new(Arc::new(segments)),
        }))
    }

    /// The published segments, in id order.
    pub(crate) fn segments(&self) -> Arc<Vec<Arc<Segment>>> {
        match self.live.read() {
            Ok(live) => live.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Writes what `builder` holds as a segment (durably, when on disk), not yet published.
    /// `None` if the builder covers no ids.
    pub(crate) fn write_pending(
        &self,
        builder: &mut TrigramBuilder,
    ) -> Result<Option<Arc<Segment>>> {
        let Some(ids) = builder.cover.take() else {
            return Ok(None);
        };
        let segment =
            self.write_segment(ids.clone(), |writer| builder.drain_into(writer, ids.start))?;
        Ok(Some(segment))
    }

    /// Makes `pending` (written after the published ones, in order, contiguous) searchable,
    /// then merges the tail if it holds enough segments of one size. Fails only if `pending`
    /// does not continue the published segments (a bug), before anything changes.
    pub(crate) fn publish(&self, pending: Vec<Arc<Segment>>) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let mut segments = self.segments().as_ref().clone();
        let mut end = segments.last().map_or(0, |s| s.ids.end);
        for segment in &pending {
            if segment.ids.start != end {
                return Err(StoreError::InvalidQuery(format!(
                    "trigram segment {:?} does not follow the index's end {end}",
                    segment.ids
                )));
            }
            end = segment.ids.end;
        }
        segments.extend(pending);
        self.replace(segments);
        // A failed merge (a full disk) loses nothing: the parts stay published and a temporary
        // file is deleted at the next open. It must not fail the commit that already happened.
        if let Err(e) = self.merge_tail() {
            tracing::warn!(error = %e, "trigram segment merge failed; segments left as they are");
        }
        Ok(())
    }

    /// Deletes segments written but never published (their commit failed or was dropped).
    pub(crate) fn discard(&self, pending: Vec<Arc<Segment>>) -> Result<()> {
        for segment in pending {
            if let Some(path) = &segment.path {
                remove_file(path)?;
            }
        }
        Ok(())
    }

    /// Drops every segment (a rebuild starts from nothing).
    pub(crate) fn clear(&self) -> Result<()> {
        let old = self.segments();
        self.replace(Vec::new());
        self.discard(old.iter().cloned().collect())
    }

    fn replace(&self, segments: Vec<Arc<Segment>>) {
        let segments = Arc::new(segments);
        match self.live.write() {
            Ok(mut live) => *live = segments,
            Err(poisoned) => *poisoned.into_inner() = segments,
        }
    }

    /// Merges the last segments while [`MERGE_FAN_IN`] or more of them share the size level of
    /// the last one (sizes in powers of four of 64 KiB).
    fn merge_tail(&self) -> Result<()> {
        loop {
            let segments = self.segments();
            let Some(last) = segments.last() else {
                return Ok(());
            };
            let level = last.level();
            let tail = segments
                .iter()
                .rev()
                .take_while(|s| s.level() <= level)
                .count();
            if tail < MERGE_FAN_IN {
                return Ok(());
            }
            let from = segments.len() - tail;
            let parts: Vec<Arc<Segment>> = segments[from..].to_vec();
            let ids = parts[0].ids.start..parts[tail - 1].ids.end;
            let merged = self.write_segment(ids, |writer| merge_into(&parts, writer))?;
            let mut next = segments[..from].to_vec();
            next.push(merged);
            self.replace(next);
            self.discard(parts)?;
        }
    }

    /// Writes a segment of `ids` whose postings `fill` pushes, to a file renamed into place once
    /// synced (or in memory).
    fn write_segment(
        &self,
        ids: Range<u64>,
        fill: impl FnOnce(&mut SegmentWriter<&mut dyn Write>) -> Result<()>,
    ) -> Result<Arc<Segment>> {
        let Some(dir) = &self.dir else {
            let mut bytes = Vec::new();
            let mut writer = SegmentWriter::new(&mut bytes as &mut dyn Write, ids.start)?;
            fill(&mut writer)?;
            writer.finish(ids.end)?;
            return Ok(Arc::new(Segment::parse(SegmentBytes::Owned(bytes), None)?));
        };
        let name = format!("{:020}-{:020}", ids.start, ids.end);
        let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
        let path = dir.join(format!("{name}{SUFFIX}"));
        let file = File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        {
            let mut writer = SegmentWriter::new(&mut out as &mut dyn Write, ids.start)
                .map_err(|e| with_path(e, &tmp))?;
            fill(&mut writer).map_err(|e| with_path(e, &tmp))?;
            writer.finish(ids.end).map_err(|e| with_path(e, &tmp))?;
        }
        let file = out
            .into_inner()
            .map_err(|e| StoreError::io(&tmp, e.into_error()))?;
        file.sync_data().map_err(|e| StoreError::io(&tmp, e))?;
        drop(file);
        std::fs::rename(&tmp, &path).map_err(|e| StoreError::io(&path, e))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| StoreError::io(dir, e))?;
        Ok(Arc::new(Segment::map(&path)?))
    }

    /// Visits the ids of published messages after `after` whose trigrams satisfy `plan`,
    /// segment by segment in id order (each batch ascending), until `visit` breaks. A superset
    /// of the messages that match: callers verify each.
    pub(crate) fn candidates(
        &self,
        plan: &TrigramQuery,
        after: Option<u64>,
        mut visit: impl FnMut(Vec<u64>) -> Result<ControlFlow<()>>,
    ) -> Result<()> {
        let first = after.map_or(0, |a| a.saturating_add(1));
        // Small batches first: a page of hits among dense candidates is usually full after a
        // few dozen, and only what is handed over is decoded.
        let mut batch_len = FIRST_BATCH;
        for segment in self.segments().iter() {
            if segment.ids.end <= first {
                continue;
            }
            let mut ids = segment.lazy(plan)?;
            let mut next = first.max(segment.ids.start);
            let mut batch = Vec::with_capacity(batch_len);
            while let Some(id) = ids.seek(next)? {
                batch.push(id);
                next = id + 1;
                if batch.len() == batch_len {
                    if visit(std::mem::take(&mut batch))?.is_break() {
                        return Ok(());
                    }
                    batch_len = (batch_len * 2).min(MAX_BATCH);
                    batch.reserve(batch_len);
                }
            }
            if !batch.is_empty() && visit(batch)?.is_break() {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The segment files in `dir` with the ids their names say they cover, and the temporary files
/// of segments never finished (a crash while one was written).
type DirListing = (Vec<(PathBuf, Range<u64>)>, Vec<PathBuf>);

/// Lists `dir` once: see [`DirListing`].
fn segment_files(dir: &Path) -> Result<DirListing> {
    let mut out = Vec::new();
    let mut unfinished = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))? {
        let path = entry.map_err(|e| StoreError::io(dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(TMP_SUFFIX) {
            unfinished.push(path);
            continue;
        }
        let Some(stem) = name.strip_suffix(SUFFIX) else {
            continue;
        };
        let Some((first, end)) = stem.split_once('-') else {
            continue;
        };
        if let (Ok(first), Ok(end)) = (first.parse::<u64>(), end.parse::<u64>())
            && first <= end
        {
            out.push((path, first..end));
        }
    }
    Ok((out, unfinished))
}

/// Accumulates the (message, trigram) pairs of the messages added since the last segment.
#[derive(Default)]
pub(crate) struct TrigramBuilder {
    trigrams: DistinctTrigrams,
    /// Slot + 1 of each all-ASCII key seen (0: none), indexed by [`ascii_slot`]; allocated at
    /// first use (8 MiB).
    ascii_slots: Vec<u32>,
    /// Slot of each other key seen.
    other_slots: FxHashMap<u64, u32>,
    /// Key of each slot.
    slot_keys: Vec<u64>,
    /// (slot, message id minus the cover's start), in the order added (so ids ascend per slot).
    pairs: Vec<(u32, u32)>,
    /// Ids covered since the last segment.
    cover: Option<Range<u64>>,
}

impl std::fmt::Debug for TrigramBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrigramBuilder")
            .field("cover", &self.cover)
            .field("pairs", &self.pairs.len())
            .finish()
    }
}

impl TrigramBuilder {
    /// Whether the builder should be written out before more is added: its pairs reached the
    /// memory budget, or the next id would not fit its 32-bit offsets.
    pub(crate) fn is_full(&self, next_id: u64) -> bool {
        self.pairs.len() >= BUILDER_PAIRS
            || self
                .cover
                .as_ref()
                .is_some_and(|c| next_id.saturating_sub(c.start) >= u64::from(u32::MAX))
    }

    /// Extends the cover to `ids` (which must start where it ends): messages of the range not
    /// added hold no trigram.
    pub(crate) fn cover(&mut self, ids: Range<u64>) {
        match &mut self.cover {
            Some(cover) => cover.end = cover.end.max(ids.end),
            None => self.cover = Some(ids),
        }
    }

    /// Adds the trigrams of message `id` (ids ascending; the cover is extended to it).
    pub(crate) fn add(&mut self, id: u64, text: &str) {
        self.cover(id..id + 1);
        let start = self.cover.as_ref().map_or(id, |c| c.start);
        let doc = (id - start) as u32;
        if self.ascii_slots.is_empty() {
            self.ascii_slots = vec![0; ASCII_TRIGRAMS];
        }
        for &key in self.trigrams.keys(text) {
            let slot = match ascii_slot(key) {
                Some(index) => {
                    let entry = &mut self.ascii_slots[index];
                    if *entry == 0 {
                        self.slot_keys.push(key);
                        *entry = self.slot_keys.len() as u32;
                    }
                    *entry - 1
                }
                None => {
                    let next = self.slot_keys.len() as u32;
                    let slot = *self.other_slots.entry(key).or_insert(next);
                    if slot == next {
                        self.slot_keys.push(key);
                    }
                    slot
                }
            };
            self.pairs.push((slot, doc));
        }
    }

    /// Gives back the room of a bulk catch-up beyond [`KEEP_PAIRS`], if nothing is held (call
    /// it between catch-ups; within one, the room is reused from segment to segment).
    pub(crate) fn release_bulk_memory(&mut self) {
        if self.pairs.is_empty() && self.pairs.capacity() > KEEP_PAIRS {
            self.pairs = Vec::new();
        }
    }

    /// The pairs the builder has room for (tests).
    #[cfg(test)]
    pub(crate) fn pairs_capacity(&self) -> usize {
        self.pairs.capacity()
    }

    /// Forgets everything added (the writer dropped what it was fed).
    pub(crate) fn reset(&mut self) {
        self.clear_slots();
        self.cover = None;
    }

    fn clear_slots(&mut self) {
        for &key in &self.slot_keys {
            if let Some(index) = ascii_slot(key) {
                self.ascii_slots[index] = 0;
            }
        }
        self.slot_keys.clear();
        self.other_slots.clear();
        self.pairs.clear();
        if self.pairs.capacity() > BUILDER_PAIRS {
            self.pairs = Vec::new();
        }
    }

    /// Pushes every key's ids to `writer` in key order (a counting sort of the pairs by slot,
    /// stable, so each key's ids stay ascending), then forgets them.
    fn drain_into(&mut self, writer: &mut SegmentWriter<&mut dyn Write>, first: u64) -> Result<()> {
        let mut order: Vec<u32> = (0..self.slot_keys.len() as u32).collect();
        order.sort_unstable_by_key(|&slot| self.slot_keys[slot as usize]);
        let mut starts = vec![0u32; self.slot_keys.len() + 1];
        for &(slot, _) in &self.pairs {
            starts[slot as usize + 1] += 1;
        }
        // Running totals in slot order (any order works: each slot gets its own stretch).
        for slot in 0..self.slot_keys.len() {
            starts[slot + 1] += starts[slot];
        }
        let mut docs = vec![0u32; self.pairs.len()];
        let mut next = starts.clone();
        for &(slot, doc) in &self.pairs {
            docs[next[slot as usize] as usize] = doc;
            next[slot as usize] += 1;
        }
        for slot in order {
            let stretch = &docs[starts[slot as usize] as usize..starts[slot as usize + 1] as usize];
            writer.push(
                self.slot_keys[slot as usize],
                stretch.iter().map(|&d| first + u64::from(d)),
            )?;
        }
        self.clear_slots();
        Ok(())
    }
}

/// Writes one segment: postings key by key, then the tables and the footer.
struct SegmentWriter<W: Write> {
    out: W,
    first: u64,
    /// Bytes of postings written.
    written: u64,
    keys: Vec<u64>,
    ends: Vec<u64>,
    buf: Vec<u8>,
}

impl<W: Write> SegmentWriter<W> {
    fn new(mut out: W, first: u64) -> Result<Self> {
        out.write_all(MAGIC).map_err(write_error)?;
        Ok(SegmentWriter {
            out,
            first,
            written: 0,
            keys: Vec::new(),
            ends: Vec::new(),
            buf: Vec::new(),
        })
    }

    /// The postings of `key` (greater than the last key pushed): ascending ids, at or after the
    /// segment's first.
    fn push(&mut self, key: u64, ids: impl IntoIterator<Item = u64>) -> Result<()> {
        debug_assert!(self.keys.last().is_none_or(|&last| last < key));
        self.buf.clear();
        let mut next = self.first;
        for id in ids {
            debug_assert!(id >= next);
            write_varint(&mut self.buf, id - next);
            next = id + 1;
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        self.out.write_all(&self.buf).map_err(write_error)?;
        self.written += self.buf.len() as u64;
        self.keys.push(key);
        self.ends.push(self.written);
        Ok(())
    }

    fn finish(mut self, end: u64) -> Result<W> {
        let keys_at = MAGIC.len() as u64 + self.written;
        let ends_at = keys_at + 8 * self.keys.len() as u64;
        let mut tail = Vec::with_capacity(16 * self.keys.len() + FOOTER_LEN);
        for key in &self.keys {
            tail.extend_from_slice(&key.to_le_bytes());
        }
        for end in &self.ends {
            tail.extend_from_slice(&end.to_le_bytes());
        }
        for field in [self.first, end, self.keys.len() as u64, keys_at, ends_at] {
            tail.extend_from_slice(&field.to_le_bytes());
        }
        tail.extend_from_slice(MAGIC);
        self.out.write_all(&tail).map_err(write_error)?;
        self.out.flush().map_err(write_error)?;
        Ok(self.out)
    }
}

/// Concatenates the postings of `parts` (contiguous, in id order) key by key into `writer`.
fn merge_into(parts: &[Arc<Segment>], writer: &mut SegmentWriter<&mut dyn Write>) -> Result<()> {
    // A cursor per part over its keys; each round takes the smallest key left.
    let mut cursors = vec![0usize; parts.len()];
    let mut ids = Vec::new();
    loop {
        let mut smallest: Option<u64> = None;
        for (part, &at) in parts.iter().zip(&cursors) {
            if at < part.n_keys {
                let key = part.key(at);
                smallest = Some(smallest.map_or(key, |s| s.min(key)));
            }
        }
        let Some(key) = smallest else {
            return Ok(());
        };
        ids.clear();
        for (part, at) in parts.iter().zip(cursors.iter_mut()) {
            if *at < part.n_keys && part.key(*at) == key {
                part.decode_into(*at, &mut ids)?;
                *at += 1;
            }
        }
        writer.push(key, ids.iter().copied())?;
    }
}

/// A segment's bytes: the file mapped, or built in memory.
enum SegmentBytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for SegmentBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            SegmentBytes::Mapped(map) => map,
            SegmentBytes::Owned(bytes) => bytes,
        }
    }
}

/// One immutable segment: the postings of the messages `ids`.
pub(crate) struct Segment {
    ids: Range<u64>,
    data: SegmentBytes,
    path: Option<PathBuf>,
    n_keys: usize,
    keys_at: usize,
    ends_at: usize,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("ids", &self.ids)
            .field("keys", &self.n_keys)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl Segment {
    fn map(path: &Path) -> Result<Segment> {
        let file = File::open(path).map_err(|e| StoreError::io(path, e))?;
        // SAFETY: segment files are written once, synced and renamed into place, and never
        // written again (only deleted, which leaves a mapping intact); lcm does not support
        // other processes editing its data directory (as for tantivy's own mapped files).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| StoreError::io(path, e))?;
        Segment::parse(SegmentBytes::Mapped(map), Some(path.to_path_buf()))
    }

    /// Checks the frame (both magics, the footer's offsets against the length) and reads it.
    fn parse(data: SegmentBytes, path: Option<PathBuf>) -> Result<Segment> {
        let name = path
            .as_deref()
            .map_or("(in memory)".into(), |p| p.display().to_string());
        let corrupt = |detail: &str| StoreError::Corrupt {
            table: "trigram index",
            detail: format!("segment {name}: {detail}"),
        };
        let len = data.len();
        if len < MAGIC.len() + FOOTER_LEN
            || &data[..MAGIC.len()] != MAGIC
            || &data[len - MAGIC.len()..] != MAGIC
        {
            return Err(corrupt("not a trigram segment (bad length or magic)"));
        }
        let footer = len - FOOTER_LEN;
        let field = |i: usize| read_u64(&data, footer + 8 * i);
        let (first, end, n_keys, keys_at, ends_at) =
            (field(0), field(1), field(2), field(3), field(4));
        let n_keys = usize::try_from(n_keys).map_err(|_| corrupt("key count"))?;
        let tables_ok = first <= end
            && keys_at >= MAGIC.len() as u64
            && n_keys.checked_mul(16).is_some_and(|t| {
                ends_at == keys_at + 8 * n_keys as u64 && keys_at + t as u64 == footer as u64
            });
        if !tables_ok {
            return Err(corrupt("tables do not fit the file"));
        }
        let segment = Segment {
            ids: first..end,
            n_keys,
            keys_at: keys_at as usize,
            ends_at: ends_at as usize,
            data,
            path,
        };
        if n_keys > 0 && segment.end_of(n_keys - 1) != keys_at - MAGIC.len() as u64 {
            return Err(corrupt("postings do not end where the keys start"));
        }
        Ok(segment)
    }

    /// Size level: powers of four of 64 KiB.
    fn level(&self) -> u32 {
        ((self.data.len() >> 16).max(1)).ilog2() / 2
    }

    fn key(&self, at: usize) -> u64 {
        read_u64(&self.data, self.keys_at + 8 * at)
    }

    fn end_of(&self, at: usize) -> u64 {
        read_u64(&self.data, self.ends_at + 8 * at)
    }

    /// The position of `key` among the segment's keys.
    fn find(&self, key: u64) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.n_keys);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// The encoded postings of the key at `at`.
    fn postings(&self, at: usize) -> Result<&[u8]> {
        let start = if at == 0 { 0 } else { self.end_of(at - 1) };
        let end = self.end_of(at);
        let base = MAGIC.len() as u64;
        if start > end || base + end > self.keys_at as u64 {
            return Err(self.corrupt("postings offsets out of order"));
        }
        Ok(&self.data[(base + start) as usize..(base + end) as usize])
    }

    /// Appends the ids of the key at `at` to `out`.
    fn decode_into(&self, at: usize, out: &mut Vec<u64>) -> Result<()> {
        let mut cursor = self.cursor(at)?;
        while let Some(id) = cursor.next_id()? {
            out.push(id);
        }
        Ok(())
    }

    /// A cursor over the postings of the key at `at`, nothing decoded yet.
    fn cursor(&self, at: usize) -> Result<PostingCursor<'_>> {
        Ok(PostingCursor {
            bytes: self.postings(at)?,
            next: self.ids.start,
            head: None,
            segment: self,
        })
    }

    fn corrupt(&self, detail: &str) -> StoreError {
        StoreError::Corrupt {
            table: "trigram index",
            detail: format!("segment {:?}: {detail}", self.ids),
        }
    }

    /// The ids whose trigrams satisfy `query`, decoded as they are asked for. In a
    /// conjunction, a part whose postings would cost more to decode than verifying the
    /// candidates the cheaper parts leave is dropped: the result is then a superset, as
    /// promised.
    fn lazy(&self, query: &TrigramQuery) -> Result<LazyIds<'_>> {
        Ok(match query {
            TrigramQuery::Gram(gram) => match gram_key(gram) {
                Some(key) => match self.find(key) {
                    Some(at) => LazyIds::Gram(self.cursor(at)?),
                    None => LazyIds::Nothing,
                },
                // Not a gram the index holds: no constraint.
                None => LazyIds::All(self.ids.clone()),
            },
            TrigramQuery::All => LazyIds::All(self.ids.clone()),
            TrigramQuery::And(parts) => {
                // Cheapest first (it leads the others): a part's cost is the encoded length
                // of its postings, known without decoding.
                let mut ordered: Vec<(usize, &TrigramQuery)> = parts
                    .iter()
                    .map(|part| (self.estimate(part), part))
                    .collect();
                ordered.sort_by_key(|(cost, _)| *cost);
                let mut kept = Vec::new();
                let mut fewest = usize::MAX;
                for (cost, part) in ordered {
                    if fewest.saturating_mul(VERIFY_COST) < cost {
                        break;
                    }
                    fewest = fewest.min(self.estimated_ids(part, cost));
                    kept.push(self.lazy(part)?);
                }
                if kept.is_empty() {
                    // A conjunction of nothing constrains nothing (the planner makes none).
                    LazyIds::All(self.ids.clone())
                } else {
                    LazyIds::And(kept)
                }
            }
            TrigramQuery::Or(parts) => LazyIds::Or(
                parts
                    .iter()
                    .map(|part| self.lazy(part))
                    .collect::<Result<_>>()?,
            ),
        })
    }

    /// About how many ids `query`, whose postings are `cost` bytes, yields: for a gram, the
    /// count at which its gaps would take that many bytes (a gap of k bytes is below 128^k);
    /// for anything else, `cost` (each id takes at least a byte).
    fn estimated_ids(&self, query: &TrigramQuery, cost: usize) -> usize {
        let span = self.ids.end - self.ids.start;
        if !matches!(query, TrigramQuery::Gram(_)) || cost == usize::MAX {
            return cost;
        }
        (1..=3u32)
            .map(|k| (cost / k as usize, 128u64.pow(k)))
            .find(|&(n, gap)| n == 0 || span / (n as u64) < gap)
            .map_or(cost / 4, |(n, _)| n)
    }

    /// A rough cost of evaluating `query`: bytes of postings it decodes.
    fn estimate(&self, query: &TrigramQuery) -> usize {
        match query {
            TrigramQuery::Gram(gram) => match gram_key(gram) {
                // Absent from this segment: nothing to decode.
                Some(key) => self
                    .find(key)
                    .map_or(0, |at| self.postings(at).map_or(usize::MAX, <[u8]>::len)),
                None => usize::MAX,
            },
            TrigramQuery::All => usize::MAX,
            // A conjunction of nothing constrains nothing, as `All`.
            TrigramQuery::And(parts) => parts
                .iter()
                .map(|p| self.estimate(p))
                .min()
                .unwrap_or(usize::MAX),
            TrigramQuery::Or(parts) => parts
                .iter()
                .map(|p| self.estimate(p))
                .fold(0usize, usize::saturating_add),
        }
    }
}

/// The ids of a query over one segment, ascending, each found by [`LazyIds::seek`]: postings
/// are decoded only as far as the ids asked for.
enum LazyIds<'a> {
    /// The ids of one gram's postings.
    Gram(PostingCursor<'a>),
    /// Every id of the range.
    All(Range<u64>),
    /// No id.
    Nothing,
    /// The ids every part holds (leapfrog: each part in turn skips to the largest seen).
    And(Vec<LazyIds<'a>>),
    /// The ids any part holds.
    Or(Vec<LazyIds<'a>>),
}

impl LazyIds<'_> {
    /// The smallest id at or after `target`, if any. Asking again for a target at or below the
    /// answer gives the same answer.
    fn seek(&mut self, target: u64) -> Result<Option<u64>> {
        match self {
            LazyIds::Gram(cursor) => cursor.seek(target),
            LazyIds::All(ids) => Ok(Some(target.max(ids.start)).filter(|&id| id < ids.end)),
            LazyIds::Nothing => Ok(None),
            LazyIds::And(parts) => {
                // Round the parts until as many in a row hold `candidate` as there are parts:
                // one that answers with a larger id moves it, and the others must agree again.
                let n = parts.len();
                let (mut candidate, mut agreed, mut at) = (target, 0, 0);
                while agreed < n {
                    match parts[at].seek(candidate)? {
                        None => return Ok(None),
                        Some(id) if id > candidate => (candidate, agreed) = (id, 1),
                        Some(_) => agreed += 1,
                    }
                    at = (at + 1) % n;
                }
                Ok(Some(candidate))
            }
            LazyIds::Or(parts) => {
                let mut first: Option<u64> = None;
                for part in parts.iter_mut() {
                    if let Some(id) = part.seek(target)? {
                        first = Some(first.map_or(id, |f| f.min(id)));
                    }
                }
                Ok(first)
            }
        }
    }
}

/// One gram's postings, decoded as far as they were sought.
struct PostingCursor<'a> {
    /// What is not decoded yet.
    bytes: &'a [u8],
    /// The smallest id the next varint can give (the last id decoded plus one).
    next: u64,
    /// The last id decoded, if nothing asked past it yet.
    head: Option<u64>,
    segment: &'a Segment,
}

impl PostingCursor<'_> {
    /// The smallest id at or after `target`, if any; asking again for a target at or below the
    /// answer gives the same answer.
    fn seek(&mut self, target: u64) -> Result<Option<u64>> {
        if let Some(head) = self.head
            && head >= target
        {
            return Ok(Some(head));
        }
        while let Some(id) = self.next_id()? {
            if id >= target {
                self.head = Some(id);
                return Ok(Some(id));
            }
        }
        self.head = None;
        Ok(None)
    }

    /// Decodes the next id, if any.
    fn next_id(&mut self) -> Result<Option<u64>> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let gap =
            read_varint(&mut self.bytes).ok_or_else(|| self.segment.corrupt("truncated varint"))?;
        let id = self
            .next
            .checked_add(gap)
            .filter(|&id| id < self.segment.ids.end)
            .ok_or_else(|| self.segment.corrupt("id past the segment's end"))?;
        self.next = id + 1;
        Ok(Some(id))
    }
}

fn read_u64(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    if let Some(slice) = data.get(at..at + 8) {
        bytes.copy_from_slice(slice);
    }
    u64::from_le_bytes(bytes)
}

fn write_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads one LEB128 varint from the front of `bytes`; `None` if truncated or too long.
fn read_varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// A write error without a path yet (the writer does not know its file).
fn write_error(source: std::io::Error) -> StoreError {
    StoreError::Io {
        path: String::new(),
        source,
    }
}

fn with_path(e: StoreError, path: &Path) -> StoreError {
    match e {
        StoreError::Io { path: p, source } if p.is_empty() => StoreError::io(path, source),
        other => other,
    }
}

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// Every id published, whatever its trigrams (a gram that is no key constrains nothing).
    fn ids_of(index: &TrigramIndex, plan: &TrigramQuery, after: Option<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        index
            .candidates(plan, after, |ids| {
                out.extend(ids);
                Ok(ControlFlow::Continue(()))
            })
            .unwrap();
        out
    }

    fn gram(g: &str) -> TrigramQuery {
        TrigramQuery::Gram(g.into())
    }

    /// Adds `texts` as messages `first..`, writing a segment after each id in `cuts`, and
    /// publishes them.
    fn add(index: &TrigramIndex, first: u64, texts: &[&str], cuts: &[u64]) {
        let mut builder = TrigramBuilder::default();
        let mut pending = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let id = first + i as u64;
            builder.add(id, text);
            if cuts.contains(&id) {
                pending.extend(index.write_pending(&mut builder).unwrap());
            }
        }
        pending.extend(index.write_pending(&mut builder).unwrap());
        index.publish(pending).unwrap();
    }

    #[test]
    fn grams_find_the_messages_that_hold_them() {
        let index = TrigramIndex::in_memory();
        add(
            &index,
            0,
            &["Hello world", "yellow", "say HELLO", "nothing"],
            &[1],
        );
        assert_eq!(index.segments().len(), 2);
        assert_eq!(ids_of(&index, &gram("ell"), None), [0, 1, 2]);
        assert_eq!(ids_of(&index, &gram("ell"), Some(0)), [1, 2]);
        assert_eq!(ids_of(&index, &gram("hel"), None), [0, 2]);
        let both = TrigramQuery::And(vec![gram("hel"), gram("wor")]);
        assert_eq!(ids_of(&index, &both, None), [0]);
        let either = TrigramQuery::Or(vec![gram("wor"), gram("thi")]);
        assert_eq!(ids_of(&index, &either, None), [0, 3]);
        assert!(ids_of(&index, &gram("zzz"), None).is_empty());
        // Not a trigram: no constraint, every id.
        assert_eq!(ids_of(&index, &gram("ab"), None), [0, 1, 2, 3]);
    }

    #[test]
    fn a_conjunction_asks_every_part_about_every_candidate() {
        let index = TrigramIndex::in_memory();
        // `qqq` (the cheapest list: it leads) holds 1 and 2, `zzz` holds 1 and 5 to 7, `www`
        // holds 1 and 6: only 1 is in all; 2 is in the leading list alone.
        let texts = ["", "qqq zzz www", "qqq", "", "", "zzz", "zzz www", "zzz"];
        add(&index, 0, &texts, &[]);
        let q = |grams: &[&str]| TrigramQuery::And(grams.iter().map(|g| gram(g)).collect());
        assert_eq!(ids_of(&index, &q(&["qqq", "zzz"]), None), [1]);
        assert_eq!(ids_of(&index, &q(&["zzz", "www"]), None), [1, 6]);
        assert_eq!(ids_of(&index, &q(&["qqq", "zzz", "www"]), None), [1]);
        assert_eq!(ids_of(&index, &q(&["zzz", "www"]), Some(1)), [6]);
        let either = TrigramQuery::Or(vec![q(&["qqq", "zzz"]), q(&["zzz", "www"])]);
        assert_eq!(ids_of(&index, &either, None), [1, 6]);
    }

    #[test]
    fn an_intersection_stops_once_verifying_is_cheaper_than_decoding() {
        let index = TrigramIndex::in_memory();
        let mut texts = vec!["xyz common"; 3000];
        texts[5] = "rare";
        texts[6] = "rare xyz abc";
        for text in &mut texts[7..12] {
            *text = "abc";
        }
        add(&index, 0, &texts, &[]);
        // Exact while the lists are short.
        let rare_and_abc = TrigramQuery::And(vec![gram("rar"), gram("abc")]);
        assert_eq!(ids_of(&index, &rare_and_abc, None), [6]);
        // "xyz" has 2,995 ids (about 3 KB of postings): two candidates are cheaper to verify
        // than that list is to decode, so it is not intersected: a superset, as promised.
        let many = TrigramQuery::And(vec![gram("rar"), gram("are"), gram("xyz")]);
        let rare_only = ids_of(&index, &many, None);
        assert_eq!(rare_only, [5, 6]);
    }

    #[test]
    fn segments_of_one_size_are_merged_four_at_a_time() {
        let index = TrigramIndex::in_memory();
        // One message of 100,000 pseudo-random CJK characters: a segment of about 1.7 MB
        // (a level above the small ones).
        let big = crate::trigram_keys::random_cjk(100_000, 7);
        add(&index, 0, &[&big], &[]);
        assert!(index.segments()[0].level() > 0);
        for round in 0..3u64 {
            add(&index, 1 + round * 2, &["abc one", "abd two"], &[]);
        }
        // Three small ones after the big one: not yet.
        assert_eq!(index.segments().len(), 4);
        add(&index, 7, &["abc three"], &[]);
        // Four small ones at the tail: merged into one; the big one is left alone.
        let ids: Vec<Range<u64>> = index.segments().iter().map(|s| s.ids.clone()).collect();
        assert_eq!(ids, [0..1, 1..8]);
        assert_eq!(ids_of(&index, &gram("abc"), None), [1, 3, 5, 7]);
        assert_eq!(ids_of(&index, &gram("abd"), None), [2, 4, 6]);
        let first = big.chars().take(3).collect::<String>();
        assert_eq!(ids_of(&index, &gram(&first), None), [0]);
    }

    #[test]
    fn open_deletes_leftovers_and_keeps_the_cover_of_the_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trigrams");
        let index = TrigramIndex::create(&path).unwrap();
        add(&index, 0, &["abc", "bcd", "cde"], &[0, 1]);
        let files = |p: &Path| -> BTreeSet<String> {
            std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(files(&path).len(), 3);
        // A merge interrupted after its segment was renamed in: it and the parts both exist.
        let parts = index.segments();
        let merged = index
            .write_segment(0..2, |w| merge_into(&parts[..2], w))
            .unwrap();
        // A segment written for a commit that never happened, and a temporary file.
        let mut builder = TrigramBuilder::default();
        builder.add(3, "xyz");
        index.write_pending(&mut builder).unwrap();
        std::fs::write(
            path.join("00000000000000000004-00000000000000000005.tri.tmp"),
            b"x",
        )
        .unwrap();
        drop((index, parts, merged));
        assert_eq!(files(&path).len(), 6);

        let read_only = TrigramIndex::open(&path, 3, false).unwrap().unwrap();
        assert_eq!(files(&path).len(), 6, "a read-only open deletes nothing");
        assert_eq!(ids_of(&read_only, &gram("bcd"), None), [1]);
        drop(read_only);

        let index = TrigramIndex::open(&path, 3, true).unwrap().unwrap();
        let ids: Vec<Range<u64>> = index.segments().iter().map(|s| s.ids.clone()).collect();
        assert_eq!(ids, [0..2, 2..3]);
        assert_eq!(
            files(&path),
            BTreeSet::from([
                "00000000000000000000-00000000000000000002.tri".to_string(),
                "00000000000000000002-00000000000000000003.tri".to_string(),
            ])
        );
        assert_eq!(ids_of(&index, &gram("cde"), None), [2]);
        assert!(ids_of(&index, &gram("xyz"), None).is_empty());
        drop(index);

        // Segments that fall short of the watermark (or leave a gap) are no index at all.
        assert!(TrigramIndex::open(&path, 4, true).unwrap().is_none());
        std::fs::remove_file(path.join("00000000000000000000-00000000000000000002.tri")).unwrap();
        assert!(TrigramIndex::open(&path, 3, true).unwrap().is_none());
        assert!(
            TrigramIndex::open(&dir.path().join("absent"), 0, true)
                .unwrap()
                .is_none()
        );

        // A new index starts from an empty directory: segments and unfinished files go.
        std::fs::write(
            path.join("00000000000000000007-00000000000000000009.tri.tmp"),
            b"x",
        )
        .unwrap();
        let index = TrigramIndex::create(&path).unwrap();
        assert!(index.segments().is_empty());
        assert!(files(&path).is_empty(), "left: {:?}", files(&path));
    }

    #[test]
    fn damaged_segments_are_reported_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trigrams");
        let index = TrigramIndex::create(&path).unwrap();
        add(&index, 0, &["abcdef", "bcdefg"], &[]);
        drop(index);
        let file = path.join("00000000000000000000-00000000000000000002.tri");
        let good = std::fs::read(&file).unwrap();

        // Truncated: not a segment; the open says the index is unusable.
        std::fs::write(&file, &good[..good.len() - 3]).unwrap();
        assert!(TrigramIndex::open(&path, 2, true).unwrap().is_none());

        // Postings whose gap runs past the segment's end: an error naming the index, no panic.
        let mut bad = good.clone();
        bad[MAGIC.len()] = 0x7f;
        std::fs::write(&file, &bad).unwrap();
        let index = TrigramIndex::open(&path, 2, true).unwrap().unwrap();
        let key = gram_key("abc").unwrap();
        let first_key = index.segments()[0].key(0);
        assert_eq!(first_key, key, "the damaged postings are the first key's");
        let error = index
            .candidates(&gram("abc"), None, |_| Ok(ControlFlow::Continue(())))
            .unwrap_err();
        assert!(
            matches!(
                &error,
                StoreError::Corrupt {
                    table: "trigram index",
                    ..
                }
            ),
            "{error}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the cuts between segments and the merges, the candidates of a gram are the
        /// messages whose lowercased text holds it.
        #[test]
        fn candidates_are_the_messages_holding_the_gram(
            texts in proptest::collection::vec("[abcAB \\n]{0,12}", 1..60),
            cuts in proptest::collection::vec(0u64..60, 0..12),
            grams in proptest::collection::vec("[abc][abc ][abc]", 1..6),
            after in proptest::option::of(0u64..60),
        ) {
            let index = TrigramIndex::in_memory();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            add(&index, 0, &texts, &cuts);
            for g in &grams {
                let expected: Vec<u64> = texts
                    .iter()
                    .enumerate()
                    .filter(|(i, t)| {
                        after.is_none_or(|a| *i as u64 > a) && t.to_lowercase().contains(g.as_str())
                    })
                    .map(|(i, _)| i as u64)
                    .collect();
                prop_assert_eq!(ids_of(&index, &gram(g), after), expected, "{:?}", g);
            }
        }

        /// Conjunctions and disjunctions, nested, decoded lazily: the messages whose text
        /// satisfies the query; and a caller that stops after the first batch got the first
        /// ids of that list.
        #[test]
        fn candidates_of_nested_queries_are_the_messages_that_satisfy_them(
            texts in proptest::collection::vec("[abcAB \n]{0,12}", 1..80),
            cuts in proptest::collection::vec(0u64..80, 0..6),
            query in query_strategy(),
            after in proptest::option::of(0u64..80),
        ) {
            let index = TrigramIndex::in_memory();
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            add(&index, 0, &texts, &cuts);
            let expected: Vec<u64> = texts
                .iter()
                .enumerate()
                .filter(|(i, t)| after.is_none_or(|a| *i as u64 > a) && satisfies(&query, t))
                .map(|(i, _)| i as u64)
                .collect();
            prop_assert_eq!(&ids_of(&index, &query, after), &expected, "{:?}", query);
            let mut first = Vec::new();
            index
                .candidates(&query, after, |ids| {
                    first = ids;
                    Ok(ControlFlow::Break(()))
                })
                .unwrap();
            prop_assert_eq!(&first[..], &expected[..first.len()]);
            prop_assert!(first.len() <= FIRST_BATCH);
        }
    }

    fn query_strategy() -> impl Strategy<Value = TrigramQuery> {
        let leaf = prop_oneof![
            4 => "[abc][abc ][abc]".prop_map(TrigramQuery::Gram),
            1 => Just(TrigramQuery::All),
            // Not a trigram: no constraint.
            1 => Just(TrigramQuery::Gram("ab".into())),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(TrigramQuery::And),
                proptest::collection::vec(inner, 0..4).prop_map(TrigramQuery::Or),
            ]
        })
    }

    /// What `query` says of a text, from its lowercased text directly.
    fn satisfies(query: &TrigramQuery, text: &str) -> bool {
        match query {
            TrigramQuery::All => true,
            TrigramQuery::Gram(g) if g.chars().count() != 3 => true,
            TrigramQuery::Gram(g) => text.to_lowercase().contains(g.as_str()),
            TrigramQuery::And(parts) => parts.iter().all(|p| satisfies(p, text)),
            TrigramQuery::Or(parts) => parts.iter().any(|p| satisfies(p, text)),
        }
    }
}
