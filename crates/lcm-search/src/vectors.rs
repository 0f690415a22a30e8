//! The vector index: the embeddings of stored messages, derived from the store like the rest
//! of the index and rebuilt from it at will. It holds no text: an entry is a message id, the
//! byte range of the message's searchable text the vector was computed from (a long message
//! has several chunks), the message's scope (session, role, time) and the vector, quantised.
//!
//! **Storage** (`<index>/vectors/`), three append-only files of fixed-size records and a
//! manifest:
//! - `meta.bin`: per entry, 40 bytes: id, session, created_at, chunk start and end, role, and
//!   the int8 scale (all LE);
//! - `codes.bin`: per entry, one sign bit per dimension (`dimension / 8` bytes): the first
//!   pass of a search compares these by Hamming distance;
//! - `int8.bin`: per entry, the vector as `dimension` signed bytes (`x ≈ q · scale`, one scale
//!   per vector): the second pass rescores the first pass's best candidates with it;
//! - `manifest.json`: format, dimension, model id, how many entries are committed and the
//!   watermark (every message below it is embedded, none above it).
//!
//! Metadata lives in memory (48 bytes an entry, with each session's list of its entries); the
//! sign codes and the int8 vectors are read through memory maps, so resident memory stays
//! small and the page cache holds what searches touch. The codes are compared as the file
//! stores them (little-endian words): the query's code is put in the same order, and a
//! popcount of their XOR does not depend on it.
//!
//! **Watermark.** [`VectorIndex::commit`] appends the pending entries to the three files,
//! syncs them, then replaces the manifest (write, sync, rename, sync the directory). At open
//! the files are cut back to the manifest's count: whatever a crash left past it is discarded,
//! and the caller embeds it again from the watermark. An index of another format, dimension or
//! model opens empty with [`Opened::Rebuilt`] saying why.
//!
//! **Search.** Only entries in scope compete (the filter is applied before ranking; a scope
//! with a session reads that session's entries, listed apart in memory, not every entry). The
//! query's sign code is compared with every entry's by Hamming distance (`dimension / 64`
//! popcounts an entry), the best `k ×` [`oversample_for`]`(k)` (1,280 up to ten hits, 16 a
//! hit beyond a hundred) are rescored by the int8 dot product, and
//! the best chunk of each message is kept. An index small enough is searched exactly (every
//! entry in scope rescored), which is also what [`VectorIndex::search_exact`] does. From
//! [`crate::vector_lists::LISTS_FROM`] entries on, an unscoped search's first pass reads only
//! the codes of the lists nearest the query ([`crate::vector_lists`]); a scoped one still
//! compares every entry in scope.
//!
//! Beside the three files, an index with lists has `centroids.bin` and `lists.bin`, derived
//! from `int8.bin` and repaired from it at open.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use lcm_store::error::{Result, StoreError};
use memmap2::Mmap;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::vector_lists::{LISTS_FROM, Lists};

/// Bumped when a file's layout changes: an index of another format is rebuilt.
const FORMAT: u32 = 1;
const MANIFEST: &str = "manifest.json";
const META: &str = "meta.bin";
const CODES: &str = "codes.bin";
const INT8: &str = "int8.bin";
const META_LEN: usize = 40;
/// Candidates of the first pass per hit asked for, up to ten hits: at a million entries, 128
/// keeps the best ten of the exact int8 scan (docs/PERFORMANCE.md, "Hybrid recall").
pub const OVERSAMPLE: usize = 128;
/// Candidates per hit at least, for more than ten hits (see [`oversample_for`]).
pub const MIN_OVERSAMPLE: usize = 16;

/// The first pass's candidates per hit for a search of `k`: [`OVERSAMPLE`] up to ten hits,
/// then the same 1,280 candidates in all, but never fewer than [`MIN_OVERSAMPLE`] a hit. What
/// the count must cover is the rank by sign code of the true best entries, which grows with
/// how far down the list a search goes far slower than `k × 128`: at a million entries, a pool
/// of 100 (hybrid search's) keeps 0.994 of the exact int8 best hundred with 1,600 candidates,
/// and rescoring 12,800 cost twice the rest of the search.
pub fn oversample_for(k: usize) -> usize {
    (OVERSAMPLE * 10 / k.max(1)).clamp(MIN_OVERSAMPLE, OVERSAMPLE * 10)
}
/// Fewer entries than this are rescored exactly, without a first pass.
pub const EXACT_BELOW: usize = 20_000;
/// Entries whose first-pass distances one task computes.
const DISTANCE_BLOCK: usize = 64 * 1024;
/// Candidates from which rescoring runs on every core.
const PARALLEL_RESCORE: usize = 4096;

/// One embedded chunk of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VectorEntry {
    pub message: u64,
    pub session: u64,
    pub created_at: i64,
    pub role: u8,
    /// The byte range of the message's searchable text the vector stands for.
    pub chunk: (u32, u32),
}

/// Which entries a search ranks: every field restricts, `None` / empty lets all through.
#[derive(Default)]
pub struct VectorFilter<'a> {
    pub session: Option<u64>,
    /// Role codes (`Role::code`).
    pub roles: Vec<u8>,
    pub since: Option<i64>,
    pub before: Option<i64>,
    /// Only messages this says yes to (a summary's subtree, say).
    pub messages: Option<&'a (dyn Fn(u64) -> bool + Sync)>,
}

impl VectorFilter<'_> {
    /// Whether the filter lets every entry through.
    fn is_everything(&self) -> bool {
        self.session.is_none()
            && self.roles.is_empty()
            && self.since.is_none()
            && self.before.is_none()
            && self.messages.is_none()
    }

    fn admits(&self, e: &VectorEntry) -> bool {
        self.session.is_none_or(|s| s == e.session)
            && (self.roles.is_empty() || self.roles.contains(&e.role))
            && self.since.is_none_or(|t| e.created_at >= t)
            && self.before.is_none_or(|t| e.created_at < t)
            && self.messages.is_none_or(|f| f(e.message))
    }
}

/// A message found by meaning: its best chunk and that chunk's cosine similarity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VectorHit {
    pub message: u64,
    pub chunk: (u32, u32),
    pub score: f32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Manifest {
    format: u32,
    dimension: usize,
    model_id: String,
    entries: u64,
    watermark: u64,
    /// The fingerprint of the last message (or summary) below the watermark
    /// ([`crate::lineage`]); absent in an index written before fingerprints, or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last: Option<u64>,
}

/// What a vector index's files say about it, read without its model or its vectors
/// ([`VectorIndex::summary`]; `lcm stats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VectorIndexSummary {
    /// The model that made the vectors.
    pub model_id: String,
    pub dimension: usize,
    /// Committed entries (a message or summary has one a chunk).
    pub entries: u64,
    /// Every message (or summary) with an id below this is embedded.
    pub watermark: u64,
    /// The lists unscoped searches go through (`None`: every entry is read).
    pub lists: Option<usize>,
}

/// How [`VectorIndex::open`] found the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// The committed entries are there.
    Existing,
    /// Nothing was there: a new, empty index.
    New,
    /// An index of another format, dimension or model (or unreadable) was discarded: empty.
    Rebuilt(String),
}

/// The vector index of one directory (see the module doc).
pub struct VectorIndex {
    dir: PathBuf,
    dimension: usize,
    model_id: String,
    watermark: u64,
    /// The fingerprint of the last entry below the watermark, as committed.
    last: Option<u64>,
    meta: Vec<VectorEntry>,
    /// Each session's entries, in order: a search scoped to a session reads these instead of
    /// every entry's metadata.
    sessions: HashMap<u64, Vec<u32>>,
    scales: Vec<f32>,
    /// The committed sign codes, `codes.bin` mapped (`None` while there are none).
    codes: Option<Mmap>,
    /// The committed int8 vectors (`None` while there are none).
    int8: Option<Mmap>,
    /// The lists of an index of [`LISTS_FROM`] entries or more (see [`crate::vector_lists`]).
    lists: Option<Lists>,
    /// Entries from which lists are trained ([`LISTS_FROM`]; tests set fewer).
    lists_from: usize,
    /// Lists a search reads, when a measurement sets it (else the lists' own choice).
    list_probes: Option<usize>,
    pending: Vec<(VectorEntry, Vec<f32>)>,
    /// Whether the files may be written (see [`VectorIndex::open`]).
    writable: bool,
    /// How many times the index was cleared: lists trained before a clear are not installed
    /// after it.
    generation: u64,
}

/// Lists trained anew on every committed entry of an index ([`VectorIndex::train_lists`]),
/// for [`VectorIndex::install_lists`].
pub struct TrainedLists {
    lists: Lists,
    generation: u64,
}

impl std::fmt::Debug for VectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VectorIndex")
            .field("dir", &self.dir)
            .field("model_id", &self.model_id)
            .field("entries", &self.meta.len())
            .field("watermark", &self.watermark)
            .finish_non_exhaustive()
    }
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::io(path, source)
}

/// Makes `path` exactly `len` bytes long (created if absent; synced when changed).
pub(crate) fn set_file_len(path: &Path, len: u64) -> Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io(path))?;
    if file.metadata().map_err(io(path))?.len() != len {
        file.set_len(len).map_err(io(path))?;
        file.sync_all().map_err(io(path))?;
    }
    Ok(())
}

/// Maps one of the index's append-only files.
fn map_file(path: &Path) -> Result<Mmap> {
    let file = File::open(path).map_err(io(path))?;
    // SAFETY: lcm alone writes these files, only by appending past what is mapped (and by
    // truncating them at open, before mapping); a process that changed them under us would
    // corrupt only this derived index, which `lcm reindex` rebuilds.
    unsafe { Mmap::map(&file) }.map_err(io(path))
}

/// Replaces `dir/name` with `bytes` atomically: a synced temporary file renamed over it, then
/// the directory synced.
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    let path = dir.join(name);
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// The manifest in `dir`: `None` without one, `Some(Err(why))` when it does not parse.
fn read_manifest(dir: &Path) -> Result<Option<std::result::Result<Manifest, String>>> {
    let path = dir.join(MANIFEST);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice::<Manifest>(&bytes).map_err(|e| e.to_string()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StoreError::io(&path, e)),
    }
}

impl VectorIndex {
    /// What the index in `dir` holds, from its manifest and the header of its centroids:
    /// `None` when there is no index there, or one of another format (the next writable open
    /// rebuilds it). Reads a few bytes; no model, no vectors.
    pub fn summary(dir: &Path) -> Result<Option<VectorIndexSummary>> {
        let Some(Ok(manifest)) = read_manifest(dir)? else {
            return Ok(None);
        };
        if manifest.format != FORMAT {
            return Ok(None);
        }
        Ok(Some(VectorIndexSummary {
            model_id: manifest.model_id,
            dimension: manifest.dimension,
            entries: manifest.entries,
            watermark: manifest.watermark,
            lists: Lists::count_in(dir)?,
        }))
    }

    /// Opens the index in `dir` for vectors of `dimension` from `model_id`, creating it if
    /// absent (see [`Opened`]). Not `writable` (a read-only data directory), nothing is
    /// written: an index that is absent or must be rebuilt opens empty, in memory only.
    pub fn open(
        dir: &Path,
        dimension: usize,
        model_id: &str,
        writable: bool,
    ) -> Result<(VectorIndex, Opened)> {
        if dimension == 0 || !dimension.is_multiple_of(64) {
            return Err(StoreError::InvalidQuery(format!(
                "vector dimension {dimension} is not a positive multiple of 64"
            )));
        }
        if writable {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let empty = || VectorIndex {
            dir: dir.to_path_buf(),
            dimension,
            model_id: model_id.to_string(),
            watermark: 0,
            last: None,
            meta: Vec::new(),
            sessions: HashMap::new(),
            scales: Vec::new(),
            codes: None,
            int8: None,
            lists: None,
            lists_from: LISTS_FROM,
            generation: 0,
            list_probes: None,
            pending: Vec::new(),
            writable,
        };
        let Some(manifest) = read_manifest(dir)? else {
            let index = empty();
            index.truncate_files(0)?;
            return Ok((index, Opened::New));
        };
        let why = match &manifest {
            Err(e) => Some(format!("unreadable manifest: {e}")),
            Ok(m) if m.format != FORMAT => Some(format!("format {} (now {FORMAT})", m.format)),
            Ok(m) if m.dimension != dimension => Some(format!(
                "vectors of dimension {} (the model gives {dimension})",
                m.dimension
            )),
            Ok(m) if m.model_id != model_id => {
                Some(format!("built by {} (now {model_id})", m.model_id))
            }
            Ok(_) => None,
        };
        let mut index = empty();
        let manifest = match (why, manifest) {
            (None, Ok(m)) => m,
            (why, _) => {
                let why = why.unwrap_or_default();
                tracing::warn!(dir = %dir.display(), %why, "vector index discarded; it is rebuilt from the store");
                index.truncate_files(0)?;
                index.write_manifest()?;
                return Ok((index, Opened::Rebuilt(why)));
            }
        };
        match index.load(&manifest) {
            Ok(()) => Ok((index, Opened::Existing)),
            Err(why) => {
                tracing::warn!(dir = %dir.display(), %why, "vector index discarded; it is rebuilt from the store");
                let index = empty();
                index.truncate_files(0)?;
                index.write_manifest()?;
                Ok((index, Opened::Rebuilt(why)))
            }
        }
    }

    /// Reads the committed entries (cutting off whatever follows them); `Err` says why the
    /// files cannot hold them.
    fn load(&mut self, manifest: &Manifest) -> std::result::Result<(), String> {
        let n = usize::try_from(manifest.entries).map_err(|e| e.to_string())?;
        let code_len = self.dimension / 8;
        for (name, per) in [(META, META_LEN), (CODES, code_len), (INT8, self.dimension)] {
            let path = self.dir.join(name);
            let len = std::fs::metadata(&path).map_err(|e| e.to_string())?.len();
            let want = (n * per) as u64;
            if len < want {
                return Err(format!("{name} holds {len} bytes, fewer than {want}"));
            }
        }
        self.truncate_files(n).map_err(|e| e.to_string())?;
        let meta = std::fs::read(self.dir.join(META)).map_err(|e| e.to_string())?;
        for record in meta[..n * META_LEN].chunks_exact(META_LEN) {
            let u64_at = |at: usize| {
                let mut b = [0; 8];
                b.copy_from_slice(&record[at..at + 8]);
                u64::from_le_bytes(b)
            };
            let u32_at = |at: usize| {
                let mut b = [0; 4];
                b.copy_from_slice(&record[at..at + 4]);
                u32::from_le_bytes(b)
            };
            let entry = VectorEntry {
                message: u64_at(0),
                session: u64_at(8),
                created_at: u64_at(16) as i64,
                chunk: (u32_at(24), u32_at(28)),
                role: record[32],
            };
            self.push_entry(entry, f32::from_bits(u32_at(36)));
        }
        self.watermark = manifest.watermark;
        self.last = manifest.last;
        self.remap().map_err(|e| e.to_string())?;
        self.load_lists().map_err(|e| e.to_string())
    }

    /// Reads the lists (completing them, see [`crate::vector_lists`]); an index without them
    /// searches every code until a catch-up trains them ([`Self::lists_due`]).
    fn load_lists(&mut self) -> Result<()> {
        let lists = Lists::load(
            &self.dir,
            self.dimension,
            self.meta.len(),
            self.writable,
            &self.vector_source(),
            self.codes(),
        )?;
        self.lists = lists;
        Ok(())
    }

    /// Entry `i`'s int8 vector and scale, for the lists.
    fn vector_source<'a>(&'a self) -> impl Fn(usize) -> (&'a [i8], f32) + Sync + 'a {
        move |i| (self.int8_of(i), self.scales[i])
    }

    /// Assigns the entries from `first_new` on to the lists, if there are lists (a commit
    /// never trains them: it holds the index's write lock, and searches would wait); the list
    /// file is synced.
    fn extend_lists(&mut self, first_new: usize) -> Result<()> {
        let n = self.meta.len();
        match self.lists.take() {
            Some(mut lists) => {
                lists.assign_up_to(n, &self.vector_source(), self.codes());
                let appended = lists.append(&self.dir, first_new);
                self.lists = Some(lists);
                appended
            }
            None => Ok(()),
        }
    }

    /// Cuts the files to `n` entries (creating them if absent); nothing when not writable.
    fn truncate_files(&self, n: usize) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        if n == 0 {
            Lists::remove(&self.dir)?;
        }
        for (name, per) in [
            (META, META_LEN),
            (CODES, self.dimension / 8),
            (INT8, self.dimension),
        ] {
            set_file_len(&self.dir.join(name), (n * per) as u64)?;
        }
        Ok(())
    }

    /// Maps `codes.bin` and `int8.bin` again (after a commit appended to them).
    fn remap(&mut self) -> Result<()> {
        if self.meta.is_empty() {
            self.codes = None;
            self.int8 = None;
            return Ok(());
        }
        let codes = map_file(&self.dir.join(CODES))?;
        if codes.as_ptr().align_offset(std::mem::align_of::<u64>()) != 0 {
            // A map starts on a page boundary: this would be a platform without pages.
            return Err(StoreError::io(
                &self.dir.join(CODES),
                std::io::Error::other("the map of the sign codes is not 8-byte aligned"),
            ));
        }
        self.codes = Some(codes);
        self.int8 = Some(map_file(&self.dir.join(INT8))?);
        Ok(())
    }

    /// The committed entries' sign codes, `dimension / 64` words an entry, as `codes.bin`
    /// stores them (little-endian words; see the module doc).
    fn codes(&self) -> &[u64] {
        let Some(map) = &self.codes else { return &[] };
        let bytes = &map[..self.meta.len() * self.dimension / 8];
        // SAFETY: every bit pattern is a valid u64, and `remap` checked that the map (hence
        // `bytes`, which starts where it does) is 8-byte aligned, so `head` and `tail` are empty.
        let (head, words, tail) = unsafe { bytes.align_to::<u64>() };
        debug_assert!(head.is_empty() && tail.is_empty());
        words
    }

    fn write_manifest(&self) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        let manifest = Manifest {
            format: FORMAT,
            dimension: self.dimension,
            model_id: self.model_id.clone(),
            entries: self.meta.len() as u64,
            watermark: self.watermark,
            last: self.last,
        };
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| StoreError::InvalidQuery(e.to_string()))?;
        replace_file(&self.dir, MANIFEST, &bytes)
    }

    /// Length of every vector.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// The model whose vectors the index holds.
    pub fn model_id(&self) -> &str {
        &self.model_id
    }

    /// Every message below this id is embedded (as of the last commit), none above it.
    pub fn watermark(&self) -> u64 {
        self.watermark
    }

    /// The fingerprint of the last message (or summary) below the watermark, as the commit
    /// that reached it recorded ([`crate::lineage`]).
    pub fn last(&self) -> Option<u64> {
        self.last
    }

    /// The committed entries, in the order they were pushed (by message id).
    pub fn entries(&self) -> &[VectorEntry] {
        &self.meta
    }

    /// Committed entries (chunks, not messages).
    pub fn len(&self) -> usize {
        self.meta.len()
    }

    /// Whether no entry is committed.
    pub fn is_empty(&self) -> bool {
        self.meta.is_empty()
    }

    /// Adds an entry, searchable after the next [`Self::commit`]. `vector` must have the
    /// index's dimension (L2-normalised, as the embedder gives it).
    pub fn push(&mut self, entry: VectorEntry, vector: Vec<f32>) -> Result<()> {
        if vector.len() != self.dimension {
            return Err(StoreError::InvalidQuery(format!(
                "a vector of dimension {} for an index of dimension {}",
                vector.len(),
                self.dimension
            )));
        }
        self.pending.push((entry, vector));
        Ok(())
    }

    /// Makes the pending entries durable and searchable, and the watermark `watermark`
    /// (see the module doc for the order of writes). `last` is the fingerprint of the message
    /// (or summary) just below it, recorded with it ([`crate::lineage`]; `None` if unknown).
    pub fn commit(&mut self, watermark: u64, last: Option<u64>) -> Result<()> {
        if !self.writable {
            return Err(StoreError::ReadOnly);
        }
        let pending = std::mem::take(&mut self.pending);
        let mut meta_out = Vec::with_capacity(pending.len() * META_LEN);
        let mut codes_out = Vec::with_capacity(pending.len() * self.dimension / 8);
        let mut int8_out = Vec::with_capacity(pending.len() * self.dimension);
        let first_new = self.meta.len();
        for (entry, vector) in &pending {
            let (q, scale) = quantise(vector);
            meta_out.extend_from_slice(&entry.message.to_le_bytes());
            meta_out.extend_from_slice(&entry.session.to_le_bytes());
            meta_out.extend_from_slice(&entry.created_at.to_le_bytes());
            meta_out.extend_from_slice(&entry.chunk.0.to_le_bytes());
            meta_out.extend_from_slice(&entry.chunk.1.to_le_bytes());
            meta_out.push(entry.role);
            meta_out.extend_from_slice(&[0; 3]);
            meta_out.extend_from_slice(&scale.to_bits().to_le_bytes());
            let code = sign_code(vector);
            for word in &code {
                codes_out.extend_from_slice(&word.to_le_bytes());
            }
            int8_out.extend(q.iter().map(|&x| x as u8));
            self.push_entry(*entry, scale);
        }
        let written = (|| -> Result<()> {
            for (name, bytes) in [(META, &meta_out), (CODES, &codes_out), (INT8, &int8_out)] {
                let path = self.dir.join(name);
                let file = OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .map_err(io(&path))?;
                let mut out = BufWriter::new(file);
                out.write_all(bytes).map_err(io(&path))?;
                let file = out
                    .into_inner()
                    .map_err(|e| StoreError::io(&path, e.into_error()))?;
                file.sync_all().map_err(io(&path))?;
            }
            Ok(())
        })();
        let previous = (self.watermark, self.last);
        (self.watermark, self.last) = (watermark, last);
        // The lists read the new entries' int8 vectors through the map: remap first.
        let result = written
            .and_then(|()| self.remap())
            .and_then(|()| self.extend_lists(first_new))
            .and_then(|()| self.write_manifest());
        if let Err(e) = result {
            // Nothing past the last manifest counts: forget the entries in memory too (the
            // files are cut back at the next open).
            self.truncate_entries(first_new);
            if let Some(lists) = &mut self.lists {
                lists.truncate(first_new);
            }
            (self.watermark, self.last) = previous;
            return Err(e);
        }
        Ok(())
    }

    /// Drops every entry (a rebuild starts from here).
    pub fn clear(&mut self) -> Result<()> {
        self.pending.clear();
        self.truncate_entries(0);
        self.codes = None;
        self.int8 = None;
        self.lists = None;
        self.watermark = 0;
        self.last = None;
        self.generation += 1;
        self.truncate_files(0)?;
        self.write_manifest()
    }

    /// Adds a committed entry to the metadata in memory.
    fn push_entry(&mut self, entry: VectorEntry, scale: f32) {
        let position = u32::try_from(self.meta.len()).unwrap_or(u32::MAX);
        self.sessions
            .entry(entry.session)
            .or_default()
            .push(position);
        self.meta.push(entry);
        self.scales.push(scale);
    }

    /// Forgets the entries from `n` on in memory.
    fn truncate_entries(&mut self, n: usize) {
        for entry in self.meta.get(n..).unwrap_or_default() {
            if let Some(positions) = self.sessions.get_mut(&entry.session) {
                while positions.last().is_some_and(|&i| i as usize >= n) {
                    positions.pop();
                }
                if positions.is_empty() {
                    self.sessions.remove(&entry.session);
                }
            }
        }
        self.meta.truncate(n);
        self.scales.truncate(n);
    }

    fn int8_of(&self, i: usize) -> &[i8] {
        let Some(map) = &self.int8 else { return &[] };
        let bytes = &map[i * self.dimension..(i + 1) * self.dimension];
        // SAFETY: i8 and u8 have the same size and alignment.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) }
    }

    fn rescore(&self, i: usize, query: &[i8], query_scale: f32) -> f32 {
        dot_i8(self.int8_of(i), query) as f32 * self.scales[i] * query_scale
    }

    /// The `k` messages nearest `query` among the entries `filter` admits, best first (by
    /// their best chunk; ties by message id), in two passes (see the module doc).
    pub fn search(&self, query: &[f32], k: usize, filter: &VectorFilter<'_>) -> Vec<VectorHit> {
        self.search_with(query, k, filter, oversample_for(k))
    }

    /// [`Self::search`] that rescores every entry in scope.
    pub fn search_exact(
        &self,
        query: &[f32],
        k: usize,
        filter: &VectorFilter<'_>,
    ) -> Vec<VectorHit> {
        self.search_with(query, k, filter, usize::MAX)
    }

    /// [`Self::search`] with `oversample` first-pass candidates per hit (`usize::MAX`: exact).
    pub fn search_with(
        &self,
        query: &[f32],
        k: usize,
        filter: &VectorFilter<'_>,
        oversample: usize,
    ) -> Vec<VectorHit> {
        if k == 0 || query.len() != self.dimension || self.meta.is_empty() {
            return Vec::new();
        }
        let (q8, q_scale) = quantise(query);
        // In the order the codes are stored (see the module doc).
        let code: Vec<u64> = sign_code(query).into_iter().map(u64::to_le).collect();
        // A message has several chunks: keep enough candidates that k distinct messages
        // survive the grouping.
        let wanted = k.saturating_mul(oversample);
        let exact_up_to = wanted.max(EXACT_BELOW);
        let candidates = if filter.is_everything() {
            if self.meta.len() <= exact_up_to {
                (0..self.meta.len()).collect()
            } else if let Some(lists) = &self.lists {
                let probes = self.list_probes.unwrap_or_else(|| lists.probes());
                lists.nearest(&q8, &code, probes, wanted)
            } else {
                self.nearest_codes(&code, None, wanted)
            }
        } else {
            let in_scope = self.in_scope(filter);
            if in_scope.len() <= exact_up_to {
                in_scope
            } else {
                self.nearest_codes(&code, Some(&in_scope), wanted)
            }
        };
        // Rescoring reads the int8 vectors: spread over the cores when there are many.
        let scored: Vec<(usize, f32)> = if candidates.len() >= PARALLEL_RESCORE {
            candidates
                .par_iter()
                .map(|&i| (i, self.rescore(i, &q8, q_scale)))
                .collect()
        } else {
            candidates
                .iter()
                .map(|&i| (i, self.rescore(i, &q8, q_scale)))
                .collect()
        };
        best_per_message(&self.meta, scored, k)
    }

    /// Every entry `filter` admits, in order.
    fn in_scope(&self, filter: &VectorFilter<'_>) -> Vec<usize> {
        if let Some(session) = filter.session {
            let positions = self.sessions.get(&session).map_or(&[][..], Vec::as_slice);
            return positions
                .iter()
                .map(|&i| i as usize)
                .filter(|&i| filter.admits(&self.meta[i]))
                .collect();
        }
        (0..self.meta.len())
            .into_par_iter()
            .with_min_len(DISTANCE_BLOCK)
            .filter(|&i| filter.admits(&self.meta[i]))
            .collect()
    }

    /// The first pass: the `wanted` entries (of `scope`, or all) whose sign codes are nearest
    /// `code` by Hamming distance, ties by position. Found without sorting: the distances of a
    /// block of entries at a time (on every core), a histogram of them, the distance where the
    /// histogram reaches `wanted`, and the entries under it.
    fn nearest_codes(&self, code: &[u64], scope: Option<&[usize]>, wanted: usize) -> Vec<usize> {
        let words = self.dimension / 64;
        let all_codes = self.codes();
        let len = scope.map_or(self.meta.len(), <[usize]>::len);
        let mut distances = vec![0u16; len];
        let histogram = distances
            .par_chunks_mut(DISTANCE_BLOCK)
            .enumerate()
            .map(|(block, out)| {
                let first = block * DISTANCE_BLOCK;
                match scope {
                    None => {
                        let codes = &all_codes[first * words..(first + out.len()) * words];
                        hamming(codes, words, code, out);
                    }
                    Some(scope) => {
                        for (d, &i) in out.iter_mut().zip(&scope[first..]) {
                            let codes = &all_codes[i * words..(i + 1) * words];
                            hamming(codes, words, code, std::slice::from_mut(d));
                        }
                    }
                }
                histogram(out, self.dimension)
            })
            .reduce(
                || vec![0usize; self.dimension + 1],
                |mut a, b| {
                    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        take_nearest(&distances, &histogram, wanted, |j| {
            scope.map_or(j, |scope| scope[j])
        })
    }

    /// Bytes on disk of the committed entries (the three files).
    pub fn disk_bytes(&self) -> u64 {
        let lists = self.lists.as_ref().map_or(0, |l| l.disk_bytes());
        (self.meta.len() * (META_LEN + self.dimension / 8 + self.dimension)) as u64 + lists
    }

    /// Trains lists from `entries` entries on (see [`Self::lists_due`]) instead of [`LISTS_FROM`]:
    /// for tests and measurements on small indexes.
    pub fn set_lists_from(&mut self, entries: usize) {
        self.lists_from = entries;
    }

    /// Forgets the lists in memory (their files stay): searches read every code again, as
    /// below [`LISTS_FROM`]. For measurements comparing the two first passes.
    pub fn forget_lists(&mut self) {
        self.lists = None;
    }

    /// Reads `probes` lists a search (`None`: the lists' own choice) instead of a quarter
    /// of them: for measurements of what the lists keep.
    pub fn set_list_probes(&mut self, probes: Option<usize>) {
        self.list_probes = probes;
    }

    /// Whether the index should train lists ([`Self::train_lists`], then
    /// [`Self::install_lists`]): it has none and [`LISTS_FROM`] entries or more, or it has
    /// outgrown them (grown fourfold since they were trained, see [`crate::vector_lists`]).
    /// Never for a read-only index: a process that cannot keep the lists would pay for the
    /// training at every start.
    pub fn lists_due(&self) -> bool {
        let n = self.meta.len();
        self.writable
            && match &self.lists {
                Some(lists) => lists.due(n),
                None => n >= self.lists_from,
            }
    }

    /// Trains and installs lists when they are due ([`Self::lists_due`]); whether it did. For
    /// a process that holds the index alone: [`crate::semantic`] trains under the read lock.
    pub fn update_lists(&mut self) -> Result<bool> {
        if !self.lists_due() {
            return Ok(false);
        }
        let trained = self.train_lists();
        self.install_lists(trained)?;
        Ok(true)
    }

    /// Trains lists anew on every committed entry (seconds at a million entries, on every
    /// core) without changing the index: searches go on meanwhile under a read lock.
    pub fn train_lists(&self) -> TrainedLists {
        let lists = Lists::train(
            self.meta.len(),
            self.dimension,
            &self.vector_source(),
            self.codes(),
        );
        TrainedLists {
            lists,
            generation: self.generation,
        }
    }

    /// Puts lists from [`Self::train_lists`] in place of the index's (entries committed since
    /// join them) and writes their files. Lists trained before a [`Self::clear`] are dropped.
    /// If the files cannot be written, the index goes on without lists in memory (searches
    /// read every code) and the next catch-up trains them again.
    pub fn install_lists(&mut self, trained: TrainedLists) -> Result<()> {
        if !self.writable {
            return Err(StoreError::ReadOnly);
        }
        let n = self.meta.len();
        let TrainedLists {
            mut lists,
            generation,
        } = trained;
        if generation != self.generation {
            return Ok(());
        }
        lists.assign_up_to(n, &self.vector_source(), self.codes());
        if let Err(e) = lists.save(&self.dir) {
            // The files are now neither the old lists nor the new: nothing in memory may
            // append to them.
            self.lists = None;
            return Err(e);
        }
        self.lists = Some(lists);
        Ok(())
    }

    /// How many lists the index has (`None` without lists).
    pub fn list_count(&self) -> Option<usize> {
        self.lists.as_ref().map(Lists::count)
    }

    /// How many entries the longest list holds (`None` without lists): a search that probes
    /// it reads them all, so long lists are slow ones.
    pub fn longest_list(&self) -> Option<usize> {
        self.lists.as_ref().map(Lists::longest)
    }

    /// Whether the index has lists (see [`crate::vector_lists`]): its unscoped searches read
    /// only the entries of the lists nearest the query in their first pass.
    pub fn has_lists(&self) -> bool {
        self.lists.is_some()
    }

    /// Bytes the committed entries hold in memory (metadata, scales, and the lists' copy of
    /// the sign codes; `codes.bin` and the int8 vectors are mapped, so the page cache holds
    /// them, not this process).
    pub fn memory_bytes(&self) -> u64 {
        let sessions: usize = self
            .sessions
            .values()
            .map(|p| p.capacity() * 4 + std::mem::size_of::<(u64, Vec<u32>)>())
            .sum();
        (self.meta.capacity() * std::mem::size_of::<VectorEntry>()
            + self.scales.capacity() * std::mem::size_of::<f32>()
            + sessions) as u64
            + self.lists.as_ref().map_or(0, Lists::memory_bytes)
    }
}

/// The `k` messages of the best scored entries (`(position, score)`), each with its best
/// chunk (ties to the first position), best first (ties by message id).
fn best_per_message(meta: &[VectorEntry], scored: Vec<(usize, f32)>, k: usize) -> Vec<VectorHit> {
    let mut ranked: Vec<(f32, u64, usize)> = scored
        .into_iter()
        .map(|(i, score)| (score, meta[i].message, i))
        .collect();
    let order = |a: &(f32, u64, usize), b: &(f32, u64, usize)| {
        b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
    };
    // A message has few chunks: the best `4k` entries nearly always hold `k` messages, and
    // sorting only them spares sorting every candidate (thousands for a pool of 100).
    let mut sorted = k.saturating_mul(4).min(ranked.len());
    loop {
        if sorted < ranked.len() {
            ranked.select_nth_unstable_by(sorted, order);
            ranked[..sorted].sort_unstable_by(order);
        } else {
            ranked.sort_unstable_by(order);
        }
        let mut seen = HashSet::with_capacity(k);
        let hits: Vec<VectorHit> = ranked[..sorted]
            .iter()
            .filter(|&&(_, message, _)| seen.insert(message))
            .take(k)
            .map(|&(score, message, i)| VectorHit {
                message,
                chunk: meta[i].chunk,
                score,
            })
            .collect();
        if hits.len() == k || sorted == ranked.len() {
            return hits;
        }
        sorted = ranked.len();
    }
}

/// How many of `distances` (Hamming distances of `dimension`-bit codes) are each distance.
pub(crate) fn histogram(distances: &[u16], dimension: usize) -> Vec<usize> {
    let mut histogram = vec![0usize; dimension + 1];
    for &d in distances {
        histogram[usize::from(d)] += 1;
    }
    histogram
}

/// The positions `at(j)` of the `wanted` smallest `distances` (ties by `j`), given the
/// `histogram` of the distances (`histogram[d]`: how many are `d`).
pub(crate) fn take_nearest(
    distances: &[u16],
    histogram: &[usize],
    wanted: usize,
    at: impl Fn(usize) -> usize,
) -> Vec<usize> {
    // The smallest distance `cut` with at least `wanted` entries at or under it.
    let mut below = 0;
    let mut cut = histogram.len().saturating_sub(1);
    for (d, &count) in histogram.iter().enumerate() {
        if below + count >= wanted {
            cut = d;
            break;
        }
        below += count;
    }
    let cut = cut as u16;
    let mut at_cut = wanted.saturating_sub(below);
    let mut out = Vec::with_capacity(wanted);
    for (j, &d) in distances.iter().enumerate() {
        if d < cut || (d == cut && at_cut > 0) {
            if d == cut {
                at_cut -= 1;
            }
            out.push(at(j));
        }
    }
    out
}

/// Symmetric int8 quantisation with one scale per vector: `x ≈ q · scale`.
pub(crate) fn quantise(v: &[f32]) -> (Vec<i8>, f32) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    if max == 0.0 {
        return (vec![0; v.len()], 0.0);
    }
    let scale = max / 127.0;
    let q = v
        .iter()
        .map(|x| (x / scale).round().clamp(-127.0, 127.0) as i8)
        .collect();
    (q, scale)
}

/// One bit per dimension, set where the component is positive.
fn sign_code(v: &[f32]) -> Vec<u64> {
    v.chunks(64)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u64, |w, (i, x)| if *x > 0.0 { w | 1 << i } else { w })
        })
        .collect()
}

/// The dot product of two int8 vectors: the widening loop, compiled for AVX2 where the CPU
/// has it (checked once), else for the baseline x86-64 or the target.
pub(crate) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if cpu().avx2 {
        // SAFETY: the CPU has AVX2 (checked at run time).
        return unsafe { dot_i8_avx2(a, b) };
    }
    dot_i8_portable(a, b)
}

#[inline(always)]
fn dot_i8_portable(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_i8_avx2(a: &[i8], b: &[i8]) -> i32 {
    dot_i8_portable(a, b)
}

/// The Hamming distances of consecutive sign codes (`words` words each) from `query`, into
/// `out` (one per code): with the `popcnt` instruction where the CPU has it (checked once).
pub(crate) fn hamming(codes: &[u64], words: usize, query: &[u64], out: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if cpu().popcnt {
        // SAFETY: the CPU has POPCNT (checked at run time).
        return unsafe { hamming_popcnt(codes, words, query, out) };
    }
    hamming_portable(codes, words, query, out);
}

#[inline(always)]
fn hamming_portable(codes: &[u64], words: usize, query: &[u64], out: &mut [u16]) {
    for (code, d) in codes.chunks_exact(words).zip(out) {
        *d = code
            .iter()
            .zip(query)
            .map(|(a, b)| (a ^ b).count_ones() as u16)
            .sum();
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "popcnt")]
fn hamming_popcnt(codes: &[u64], words: usize, query: &[u64], out: &mut [u16]) {
    hamming_portable(codes, words, query, out);
}

/// What the CPU offers the kernels above.
#[cfg(target_arch = "x86_64")]
struct Cpu {
    avx2: bool,
    popcnt: bool,
}

#[cfg(target_arch = "x86_64")]
fn cpu() -> &'static Cpu {
    static CPU: std::sync::OnceLock<Cpu> = std::sync::OnceLock::new();
    CPU.get_or_init(|| Cpu {
        avx2: std::arch::is_x86_feature_detected!("avx2"),
        popcnt: std::arch::is_x86_feature_detected!("popcnt"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random test vectors from the deterministic generator.
    struct Rng(lcm_core::rng::SplitMix64);
    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(lcm_core::rng::SplitMix64::new(seed))
        }
        /// A number in [-1, 1), from the top 24 bits.
        fn next(&mut self) -> f32 {
            (self.0.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
        fn unit(&mut self, dim: usize) -> Vec<f32> {
            let v: Vec<f32> = (0..dim).map(|_| self.next()).collect();
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            v.into_iter().map(|x| x / n).collect()
        }
    }

    fn entry(message: u64, session: u64) -> VectorEntry {
        VectorEntry {
            message,
            session,
            created_at: message as i64 * 1000,
            role: (message % 2) as u8 + 1,
            chunk: (0, 10),
        }
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn filled(dir: &Path, n: u64, rng: &mut Rng) -> (VectorIndex, Vec<Vec<f32>>) {
        let (mut index, opened) = VectorIndex::open(dir, 128, "test-model", true).unwrap();
        assert_eq!(opened, Opened::New);
        let mut vectors = Vec::new();
        for m in 0..n {
            let v = rng.unit(128);
            index.push(entry(m, m % 3), v.clone()).unwrap();
            vectors.push(v);
        }
        index.commit(n, None).unwrap();
        (index, vectors)
    }

    #[test]
    fn exact_search_finds_the_true_nearest_within_quantisation_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(7);
        let (index, vectors) = filled(tmp.path(), 500, &mut rng);
        for _ in 0..20 {
            let q = rng.unit(128);
            let hits = index.search_exact(&q, 10, &VectorFilter::default());
            assert_eq!(hits.len(), 10);
            let mut truth: Vec<(f32, u64)> = vectors
                .iter()
                .enumerate()
                .map(|(i, v)| (dot(&q, v), i as u64))
                .collect();
            truth.sort_by(|a, b| b.0.total_cmp(&a.0));
            for h in &hits {
                let exact = dot(&q, &vectors[h.message as usize]);
                assert!((h.score - exact).abs() < 0.02, "{} vs {exact}", h.score);
            }
            // The true nearest is first unless another is within quantisation error of it.
            assert!(hits[0].score >= truth[0].0 - 0.02);
            assert!(hits.windows(2).all(|w| w[0].score >= w[1].score));
        }
    }

    #[test]
    fn filters_apply_before_ranking() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(3);
        let (index, vectors) = filled(tmp.path(), 300, &mut rng);
        // The query is message 4's own vector (session 1): filtered to session 2, it must not
        // come back, and every hit is of session 2.
        let q = vectors[4].clone();
        let all = index.search(&q, 5, &VectorFilter::default());
        assert_eq!(all[0].message, 4);
        let only_2 = index.search(
            &q,
            5,
            &VectorFilter {
                session: Some(2),
                ..VectorFilter::default()
            },
        );
        assert_eq!(only_2.len(), 5);
        assert!(only_2.iter().all(|h| h.message % 3 == 2));
        let allow = |m: u64| (100..110).contains(&m);
        let within = index.search(
            &q,
            50,
            &VectorFilter {
                roles: vec![1],
                since: Some(0),
                before: Some(108_000),
                messages: Some(&allow),
                ..VectorFilter::default()
            },
        );
        let found: Vec<u64> = {
            let mut f: Vec<u64> = within.iter().map(|h| h.message).collect();
            f.sort_unstable();
            f
        };
        assert_eq!(found, vec![100, 102, 104, 106]);
    }

    #[test]
    fn chunks_of_one_message_count_once_with_the_best() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut index, _) = VectorIndex::open(tmp.path(), 64, "m", true).unwrap();
        let mut rng = Rng::new(11);
        let q = rng.unit(64);
        let far = rng.unit(64);
        for (i, v) in [far.clone(), q.clone(), far.clone()]
            .into_iter()
            .enumerate()
        {
            let mut e = entry(9, 0);
            e.chunk = (i as u32 * 10, i as u32 * 10 + 10);
            index.push(e, v).unwrap();
        }
        index.push(entry(10, 0), far).unwrap();
        index.commit(11, None).unwrap();
        let hits = index.search(&q, 5, &VectorFilter::default());
        assert_eq!(hits.len(), 2);
        assert_eq!((hits[0].message, hits[0].chunk), (9, (10, 20)));
        assert_eq!(hits[1].message, 10);
    }

    #[test]
    fn the_first_pass_keeps_the_exact_answer_on_a_large_index() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(5);
        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        let vectors = clustered(EXACT_BELOW + 5_000, 200, 0.4, &mut rng);
        for (m, v) in vectors.iter().enumerate() {
            index.push(entry(m as u64, 0), v.clone()).unwrap();
        }
        index.commit(vectors.len() as u64, None).unwrap();
        let mut agree = 0;
        for t in 0..20 {
            let q = &vectors[t * 997];
            let fast: Vec<u64> = index
                .search(q, 10, &VectorFilter::default())
                .iter()
                .map(|h| h.message)
                .collect();
            let exact: Vec<u64> = index
                .search_exact(q, 10, &VectorFilter::default())
                .iter()
                .map(|h| h.message)
                .collect();
            agree += fast.iter().filter(|m| exact.contains(m)).count();
            assert_eq!(fast[0], exact[0], "the query's own vector comes first");
        }
        assert!(agree >= 190, "recall@10 of the first pass: {agree}/200");
        // Reopened, the codes come from the file's map: the same first pass, the same hits.
        let (reopened, _) = VectorIndex::open(tmp.path(), 128, "m", false).unwrap();
        for t in 0..20 {
            let q = &vectors[t * 997 + 1];
            let all = VectorFilter::default();
            assert_eq!(index.search(q, 10, &all), reopened.search(q, 10, &all));
        }
    }

    #[test]
    fn a_scope_by_session_admits_exactly_what_a_scan_of_every_entry_admits() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(4);
        let (mut index, _) = filled(tmp.path(), 300, &mut rng);
        let scan = |index: &VectorIndex, filter: &VectorFilter<'_>| -> Vec<usize> {
            (0..index.len())
                .filter(|&i| filter.admits(&index.meta[i]))
                .collect()
        };
        // Each filter's positions, checked against a scan of every entry.
        let check = |index: &VectorIndex| -> Vec<usize> {
            let mut per_session = Vec::new();
            for session in 0..4 {
                for (roles, since) in [(vec![], None), (vec![1], None), (vec![], Some(150_000))] {
                    let whole = roles.is_empty() && since.is_none();
                    let filter = VectorFilter {
                        session: Some(session),
                        roles,
                        since,
                        ..VectorFilter::default()
                    };
                    let listed = index.in_scope(&filter);
                    assert_eq!(listed, scan(index, &filter), "session {session}");
                    if whole {
                        per_session.push(listed.len());
                    }
                }
            }
            per_session
        };
        assert_eq!(check(&index), [100, 100, 100, 0]);
        let (reopened, _) = VectorIndex::open(tmp.path(), 128, "test-model", false).unwrap();
        assert_eq!(check(&reopened), [100, 100, 100, 0]);
        // Entries forgotten in memory (a failed commit) leave their sessions' lists too.
        index.truncate_entries(100);
        assert_eq!(check(&index), [34, 33, 33, 0]);
        index.clear().unwrap();
        assert!(index.sessions.is_empty());
        assert_eq!(check(&index), [0, 0, 0, 0]);
    }

    #[test]
    fn the_sign_codes_stay_in_the_file_not_in_memory() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(9);
        let n = 3_000;
        let (mut index, _) = VectorIndex::open(tmp.path(), 384, "m", true).unwrap();
        for m in 0..n {
            index.push(entry(m, 0), rng.unit(384)).unwrap();
        }
        index.commit(n, None).unwrap();
        let (reopened, _) = VectorIndex::open(tmp.path(), 384, "m", false).unwrap();
        // Metadata and scale: 44 bytes an entry, some of it spare capacity; the 48 bytes of
        // sign code an entry are mapped.
        let held = reopened.memory_bytes();
        assert!(held < n * 80, "{held} bytes in memory for {n} entries");
        assert_eq!(reopened.codes().len() as u64, n * 384 / 64);
        assert_eq!(reopened.codes(), index.codes());
    }

    #[test]
    fn the_first_pass_keeps_1280_candidates_up_to_ten_hits_and_16_a_hit_beyond() {
        let candidates = |k: usize| k * oversample_for(k);
        assert_eq!(candidates(1), 1_280);
        assert_eq!(candidates(10), 1_280);
        assert_eq!(candidates(100), 1_600);
        assert_eq!(candidates(1_000), 16_000);
        assert_eq!(oversample_for(0), 1_280);
    }

    #[test]
    fn the_best_chunk_of_each_message_even_when_one_message_fills_the_top() {
        // Message 1 has ten chunks, all better than message 2's and 3's: the first sort of
        // the best 4k entries holds one message only, and the whole list is sorted next.
        let mut meta = Vec::new();
        let mut scored = Vec::new();
        for c in 0..10u32 {
            meta.push(VectorEntry {
                chunk: (c, c + 1),
                ..entry(1, 0)
            });
            scored.push((meta.len() - 1, 0.9 - c as f32 * 0.01));
        }
        for (message, score) in [(4, 0.5), (3, 0.5), (2, 0.5), (2, 0.7)] {
            meta.push(entry(message, 0));
            scored.push((meta.len() - 1, score));
        }
        let hits = best_per_message(&meta, scored.clone(), 2);
        let got: Vec<(u64, f32)> = hits.iter().map(|h| (h.message, h.score)).collect();
        assert_eq!(got, [(1, 0.9), (2, 0.7)]);
        assert_eq!(hits[0].chunk, (0, 1));
        // Equal scores rank by message id.
        let hits = best_per_message(&meta, scored, 4);
        let got: Vec<u64> = hits.iter().map(|h| h.message).collect();
        assert_eq!(got, [1, 2, 3, 4]);
        assert!(best_per_message(&meta, Vec::new(), 3).is_empty());
    }

    /// `n` unit vectors of dimension 128, the `m`th near centre `m % centres` with noise of
    /// weight `spread` (as real embeddings cluster).
    fn clustered(n: usize, centres: usize, spread: f32, rng: &mut Rng) -> Vec<Vec<f32>> {
        let centre: Vec<Vec<f32>> = (0..centres).map(|_| rng.unit(128)).collect();
        (0..n)
            .map(|m| {
                let noise = rng.unit(128);
                let v: Vec<f32> = centre[m % centres]
                    .iter()
                    .zip(&noise)
                    .map(|(a, b)| a + spread * b)
                    .collect();
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                v.into_iter().map(|x| x / norm).collect()
            })
            .collect()
    }

    #[test]
    fn lists_keep_the_exact_answer_and_are_repaired_from_the_vectors() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(11);
        let vectors = clustered(EXACT_BELOW + 4_000, 100, 0.5, &mut rng);
        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        index.set_lists_from(EXACT_BELOW);
        let half = vectors.len() / 2;
        for (m, v) in vectors[..half].iter().enumerate() {
            index.push(entry(m as u64, 0), v.clone()).unwrap();
        }
        index.commit(half as u64, None).unwrap();
        assert!(!index.has_lists(), "fewer entries than lists_from");
        for (m, v) in vectors.iter().enumerate().skip(half) {
            index.push(entry(m as u64, 0), v.clone()).unwrap();
        }
        index.commit(vectors.len() as u64, None).unwrap();
        assert!(!index.has_lists(), "a commit never trains");
        assert!(index.update_lists().unwrap());
        assert!(index.has_lists());
        let n = vectors.len();
        let lists_file = tmp.path().join("lists.bin");
        assert_eq!(std::fs::metadata(&lists_file).unwrap().len(), n as u64 * 2);

        let queries: Vec<usize> = (0..20).map(|t| t * 1_201 % n).collect();
        let search = |index: &VectorIndex| -> Vec<Vec<u64>> {
            queries
                .iter()
                .map(|&q| {
                    let hits = index.search(&vectors[q], 10, &VectorFilter::default());
                    hits.iter().map(|h| h.message).collect()
                })
                .collect()
        };
        let found = search(&index);
        let mut agree = 0;
        for (&q, fast) in queries.iter().zip(&found) {
            let exact = index.search_exact(&vectors[q], 10, &VectorFilter::default());
            agree += exact.iter().filter(|h| fast.contains(&h.message)).count();
            assert_eq!(fast[0], q as u64, "the query's own vector comes first");
        }
        assert!(agree >= 180, "recall@10 with lists: {agree}/200");
        drop(index);

        // Reopened: the lists are read back (the default threshold is far above n).
        let (index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        assert!(index.has_lists());
        assert_eq!(search(&index), found);
        drop(index);

        // A list file cut short is completed from the int8 vectors: in memory by a read-only
        // open, which writes nothing, and on disk by a writable one.
        let file = OpenOptions::new().write(true).open(&lists_file).unwrap();
        file.set_len(n as u64).unwrap();
        drop(file);
        let (index, _) = VectorIndex::open(tmp.path(), 128, "m", false).unwrap();
        assert!(index.has_lists());
        assert_eq!(search(&index), found);
        assert_eq!(std::fs::metadata(&lists_file).unwrap().len(), n as u64);
        drop(index);
        let (index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        assert_eq!(search(&index), found);
        assert_eq!(std::fs::metadata(&lists_file).unwrap().len(), n as u64 * 2);
        drop(index);

        // One naming a list that does not exist is discarded: no lists below the default
        // threshold, the two passes over every code instead, still finding each query.
        let mut f = OpenOptions::new().write(true).open(&lists_file).unwrap();
        f.write_all(&[0xFF, 0xFF]).unwrap();
        drop(f);
        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        assert!(!index.has_lists());
        for (&q, hits) in queries.iter().zip(search(&index)) {
            assert_eq!(hits[0], q as u64);
        }
        index.clear().unwrap();
        assert!(!lists_file.exists() && !tmp.path().join("centroids.bin").exists());
    }

    /// Lists trained on what came first, then a drift: four times as many entries from
    /// elsewhere join the nearest old lists, which grow long. The index asks for new lists
    /// once it has grown fourfold; trained and installed, they balance the entries again, find
    /// at least as much, are on disk (a reopen reads them, and does not ask again), and lists
    /// trained before a clear are never installed after it.
    #[test]
    fn lists_are_trained_anew_once_the_index_has_grown_fourfold() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(5);
        let first = clustered(1_000, 20, 0.5, &mut rng);
        let later = clustered(4_000, 200, 0.5, &mut rng);
        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        index.set_lists_from(1_000);
        let mut m = 0u64;
        let mut add = |index: &mut VectorIndex, vectors: &[Vec<f32>]| {
            for v in vectors {
                index.push(entry(m, 0), v.clone()).unwrap();
                m += 1;
            }
            index.commit(m, None).unwrap();
        };
        add(&mut index, &first);
        assert!(index.update_lists().unwrap());
        assert_eq!(index.list_count(), Some(Lists::count_for(1_000)));
        assert!(!index.lists_due());
        add(&mut index, &later[..2_000]);
        assert!(!index.lists_due(), "grown threefold");
        add(&mut index, &later[2_000..]);
        assert!(index.lists_due(), "grown fivefold");

        let n = first.len() + later.len();
        let queries: Vec<usize> = (0..40).map(|t| t * 97 % later.len()).collect();
        let recall = |index: &VectorIndex| -> usize {
            queries
                .iter()
                .map(|&q| {
                    let exact = index.search_exact(&later[q], 10, &VectorFilter::default());
                    let fast = index.search(&later[q], 10, &VectorFilter::default());
                    exact.iter().filter(|h| fast.contains(h)).count()
                })
                .sum()
        };
        let stale = recall(&index);
        let stale_longest = index.longest_list().unwrap();

        let trained = index.train_lists();
        index.install_lists(trained).unwrap();
        assert_eq!(index.list_count(), Some(Lists::count_for(n)));
        assert!(!index.lists_due());
        let longest = index.longest_list().unwrap();
        assert!(
            longest * 2 < stale_longest,
            "longest list {longest}, before {stale_longest}"
        );
        let fresh = recall(&index);
        assert!(
            fresh >= stale && fresh >= 360,
            "recall {fresh}/400, before {stale}/400"
        );
        let found: Vec<Vec<VectorHit>> = queries
            .iter()
            .map(|&q| index.search(&later[q], 10, &VectorFilter::default()))
            .collect();
        assert_eq!(
            std::fs::metadata(tmp.path().join("lists.bin"))
                .unwrap()
                .len(),
            n as u64 * 2
        );
        drop(index);

        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        assert_eq!(index.list_count(), Some(Lists::count_for(n)));
        assert!(!index.lists_due());
        let again: Vec<Vec<VectorHit>> = queries
            .iter()
            .map(|&q| index.search(&later[q], 10, &VectorFilter::default()))
            .collect();
        assert_eq!(again, found);

        // Trained, then the index is cleared and filled again: the old lists stay out.
        let trained = index.train_lists();
        index.clear().unwrap();
        index.set_lists_from(usize::MAX);
        for (i, v) in later[..100].iter().enumerate() {
            index.push(entry(i as u64, 0), v.clone()).unwrap();
        }
        index.commit(100, None).unwrap();
        index.install_lists(trained).unwrap();
        assert!(!index.has_lists());
        assert!(!tmp.path().join("centroids.bin").exists());
    }

    #[test]
    fn a_crash_keeps_exactly_the_committed_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(1);
        let (mut index, vectors) = filled(tmp.path(), 50, &mut rng);
        let before = index.search(&vectors[3], 5, &VectorFilter::default());
        // Entries pushed but never committed, then garbage past the end of every file, as a
        // crash in the middle of a commit leaves them.
        for m in 50..60 {
            index.push(entry(m, 0), rng.unit(128)).unwrap();
        }
        drop(index);
        for name in [META, CODES, INT8] {
            let mut f = OpenOptions::new()
                .append(true)
                .open(tmp.path().join(name))
                .unwrap();
            f.write_all(&[0xAB; 1000]).unwrap();
        }
        // A read-only open sees the committed entries and writes nothing.
        let (read_only, opened) = VectorIndex::open(tmp.path(), 128, "test-model", false).unwrap();
        assert_eq!(opened, Opened::Existing);
        assert_eq!(read_only.len(), 50);
        assert_eq!(
            read_only.search(&vectors[3], 5, &VectorFilter::default()),
            before
        );
        assert_eq!(
            std::fs::metadata(tmp.path().join(INT8)).unwrap().len(),
            50 * 128 + 1000
        );
        drop(read_only);
        let (index, opened) = VectorIndex::open(tmp.path(), 128, "test-model", true).unwrap();
        assert_eq!(opened, Opened::Existing);
        assert_eq!(index.len(), 50);
        assert_eq!(index.watermark(), 50);
        assert_eq!(
            index.search(&vectors[3], 5, &VectorFilter::default()),
            before
        );
        assert_eq!(
            std::fs::metadata(tmp.path().join(INT8)).unwrap().len(),
            50 * 128
        );
    }

    #[test]
    fn another_model_or_a_broken_manifest_means_a_rebuild() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng::new(2);
        drop(filled(tmp.path(), 20, &mut rng));
        let (index, opened) = VectorIndex::open(tmp.path(), 128, "other-model", true).unwrap();
        assert!(matches!(&opened, Opened::Rebuilt(why) if why.contains("test-model")));
        assert!(index.is_empty());
        assert_eq!(index.watermark(), 0);
        drop(index);
        let (_, opened) = VectorIndex::open(tmp.path(), 256, "other-model", true).unwrap();
        assert!(matches!(&opened, Opened::Rebuilt(why) if why.contains("dimension")));
        std::fs::write(tmp.path().join(MANIFEST), b"{ half").unwrap();
        let (index, opened) = VectorIndex::open(tmp.path(), 256, "other-model", true).unwrap();
        assert!(matches!(&opened, Opened::Rebuilt(why) if why.contains("manifest")));
        assert!(index.is_empty());
        // A manifest that counts more entries than the files hold.
        drop(index);
        std::fs::write(
            tmp.path().join(MANIFEST),
            br#"{"format":1,"dimension":256,"model_id":"other-model","entries":99,"watermark":99}"#,
        )
        .unwrap();
        let (index, opened) = VectorIndex::open(tmp.path(), 256, "other-model", true).unwrap();
        assert!(matches!(&opened, Opened::Rebuilt(why) if why.contains("fewer")));
        assert!(
            index
                .search(&rng.unit(256), 3, &VectorFilter::default())
                .is_empty()
        );
        assert!(VectorIndex::open(tmp.path(), 100, "m", true).is_err());
    }

    #[test]
    fn a_vector_of_the_wrong_dimension_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut index, _) = VectorIndex::open(tmp.path(), 64, "m", true).unwrap();
        assert!(index.push(entry(0, 0), vec![0.0; 63]).is_err());
        index.commit(0, None).unwrap();
        assert!(index.is_empty());
    }
}
