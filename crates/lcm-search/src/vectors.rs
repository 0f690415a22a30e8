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
//! Metadata and sign codes live in memory (88 bytes an entry at 384 dimensions); the int8
//! vectors are read through a memory map, so resident memory stays small and the page cache
//! holds what searches touch.
//!
//! **Watermark.** [`VectorIndex::commit`] appends the pending entries to the three files,
//! syncs them, then replaces the manifest (write, sync, rename, sync the directory). At open
//! the files are cut back to the manifest's count: whatever a crash left past it is discarded,
//! and the caller embeds it again from the watermark. An index of another format, dimension or
//! model opens empty with [`Opened::Rebuilt`] saying why.
//!
//! **Search.** Only entries in scope compete (the filter is applied before ranking). The
//! query's sign code is compared with every entry's by Hamming distance (`dimension / 64`
//! popcounts an entry), the best `k × OVERSAMPLE` are rescored by the int8 dot product, and
//! the best chunk of each message is kept. An index small enough is searched exactly (every
//! entry in scope rescored), which is also what [`VectorIndex::search_exact`] does.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use lcm_store::error::{Result, StoreError};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};

/// Bumped when a file's layout changes: an index of another format is rebuilt.
const FORMAT: u32 = 1;
const MANIFEST: &str = "manifest.json";
const META: &str = "meta.bin";
const CODES: &str = "codes.bin";
const INT8: &str = "int8.bin";
const META_LEN: usize = 40;
/// Candidates of the first pass per hit asked for.
pub const OVERSAMPLE: usize = 16;
/// Fewer entries in scope than this are rescored exactly, without a first pass.
pub const EXACT_BELOW: usize = 20_000;

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
    meta: Vec<VectorEntry>,
    scales: Vec<f32>,
    codes: Vec<u64>,
    /// The committed int8 vectors (`None` while there are none).
    int8: Option<Mmap>,
    pending: Vec<(VectorEntry, Vec<f32>)>,
    /// Whether the files may be written (see [`VectorIndex::open`]).
    writable: bool,
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

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::io(path, source)
}

impl VectorIndex {
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
            meta: Vec::new(),
            scales: Vec::new(),
            codes: Vec::new(),
            int8: None,
            pending: Vec::new(),
            writable,
        };
        let manifest_path = dir.join(MANIFEST);
        let manifest = match std::fs::read(&manifest_path) {
            Ok(bytes) => serde_json::from_slice::<Manifest>(&bytes).map_err(|e| e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let index = empty();
                index.truncate_files(0)?;
                return Ok((index, Opened::New));
            }
            Err(e) => return Err(StoreError::io(&manifest_path, e)),
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
            self.meta.push(VectorEntry {
                message: u64_at(0),
                session: u64_at(8),
                created_at: u64_at(16) as i64,
                chunk: (u32_at(24), u32_at(28)),
                role: record[32],
            });
            self.scales.push(f32::from_bits(u32_at(36)));
        }
        let codes = std::fs::read(self.dir.join(CODES)).map_err(|e| e.to_string())?;
        self.codes = codes[..n * code_len]
            .chunks_exact(8)
            .map(|c| {
                let mut b = [0; 8];
                b.copy_from_slice(c);
                u64::from_le_bytes(b)
            })
            .collect();
        self.watermark = manifest.watermark;
        self.remap().map_err(|e| e.to_string())
    }

    /// Cuts the files to `n` entries (creating them if absent); nothing when not writable.
    fn truncate_files(&self, n: usize) -> Result<()> {
        if !self.writable {
            return Ok(());
        }
        for (name, per) in [
            (META, META_LEN),
            (CODES, self.dimension / 8),
            (INT8, self.dimension),
        ] {
            let path = self.dir.join(name);
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io(&path))?;
            let want = (n * per) as u64;
            if file.metadata().map_err(io(&path))?.len() != want {
                file.set_len(want).map_err(io(&path))?;
                file.sync_all().map_err(io(&path))?;
            }
        }
        Ok(())
    }

    fn remap(&mut self) -> Result<()> {
        let path = self.dir.join(INT8);
        if self.meta.is_empty() {
            self.int8 = None;
            return Ok(());
        }
        let file = File::open(&path).map_err(io(&path))?;
        // SAFETY: lcm alone writes this file, only by appending past what is mapped (and by
        // truncating it at open, before mapping); a process that changed it under us would
        // corrupt only this derived index, which `lcm reindex` rebuilds.
        let map = unsafe { Mmap::map(&file) }.map_err(io(&path))?;
        self.int8 = Some(map);
        Ok(())
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
        };
        let tmp = self.dir.join("manifest.json.tmp");
        let bytes = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| StoreError::InvalidQuery(e.to_string()))?;
        let mut file = File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(&bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        let path = self.dir.join(MANIFEST);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&self.dir))?;
        Ok(())
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
    /// (see the module doc for the order of writes).
    pub fn commit(&mut self, watermark: u64) -> Result<()> {
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
            self.meta.push(*entry);
            self.scales.push(scale);
            self.codes.extend_from_slice(&code);
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
        let previous = self.watermark;
        self.watermark = watermark;
        let result = written
            .and_then(|()| self.write_manifest())
            .and_then(|()| self.remap());
        if let Err(e) = result {
            // Nothing past the last manifest counts: forget the entries in memory too (the
            // files are cut back at the next open).
            self.meta.truncate(first_new);
            self.scales.truncate(first_new);
            self.codes.truncate(first_new * self.dimension / 64);
            self.watermark = previous;
            return Err(e);
        }
        Ok(())
    }

    /// Drops every entry (a rebuild starts from here).
    pub fn clear(&mut self) -> Result<()> {
        self.pending.clear();
        self.meta.clear();
        self.scales.clear();
        self.codes.clear();
        self.int8 = None;
        self.watermark = 0;
        self.truncate_files(0)?;
        self.write_manifest()
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
        self.search_with(query, k, filter, OVERSAMPLE)
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
        let in_scope: Vec<usize> = (0..self.meta.len())
            .filter(|&i| filter.admits(&self.meta[i]))
            .collect();
        // A message has several chunks: keep enough candidates that k distinct messages
        // survive the grouping.
        let wanted = k.saturating_mul(oversample);
        let candidates: Vec<usize> = if in_scope.len() <= wanted.max(EXACT_BELOW) {
            in_scope
        } else {
            let code = sign_code(query);
            let words = self.dimension / 64;
            let mut by_distance: Vec<(u32, usize)> = in_scope
                .into_iter()
                .map(|i| {
                    let entry = &self.codes[i * words..(i + 1) * words];
                    let d: u32 = entry
                        .iter()
                        .zip(&code)
                        .map(|(a, b)| (a ^ b).count_ones())
                        .sum();
                    (d, i)
                })
                .collect();
            let cut = wanted.min(by_distance.len());
            by_distance.select_nth_unstable(cut - 1);
            by_distance.truncate(cut);
            by_distance.into_iter().map(|(_, i)| i).collect()
        };
        let mut best: std::collections::HashMap<u64, VectorHit> = std::collections::HashMap::new();
        for i in candidates {
            let score = self.rescore(i, &q8, q_scale);
            let e = &self.meta[i];
            let hit = VectorHit {
                message: e.message,
                chunk: e.chunk,
                score,
            };
            best.entry(e.message)
                .and_modify(|b| {
                    if score > b.score {
                        *b = hit;
                    }
                })
                .or_insert(hit);
        }
        let mut hits: Vec<VectorHit> = best.into_values().collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.message.cmp(&b.message)));
        hits.truncate(k);
        hits
    }

    /// Bytes on disk of the committed entries (the three files).
    pub fn disk_bytes(&self) -> u64 {
        (self.meta.len() * (META_LEN + self.dimension / 8 + self.dimension)) as u64
    }
}

/// Symmetric int8 quantisation with one scale per vector: `x ≈ q · scale`.
fn quantise(v: &[f32]) -> (Vec<i8>, f32) {
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

/// The dot product of two int8 vectors (the compiler vectorises the widening loop).
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random generator (splitmix64).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
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
        index.commit(n).unwrap();
        (index, vectors)
    }

    #[test]
    fn exact_search_finds_the_true_nearest_within_quantisation_error() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng(7);
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
        let mut rng = Rng(3);
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
        let mut rng = Rng(11);
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
        index.commit(11).unwrap();
        let hits = index.search(&q, 5, &VectorFilter::default());
        assert_eq!(hits.len(), 2);
        assert_eq!((hits[0].message, hits[0].chunk), (9, (10, 20)));
        assert_eq!(hits[1].message, 10);
    }

    #[test]
    fn the_first_pass_keeps_the_exact_answer_on_a_large_index() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng(5);
        let (mut index, _) = VectorIndex::open(tmp.path(), 128, "m", true).unwrap();
        // Clustered data, as real embeddings are: 200 centres, points near them.
        let centres: Vec<Vec<f32>> = (0..200).map(|_| rng.unit(128)).collect();
        let mut vectors = Vec::new();
        for m in 0..(EXACT_BELOW as u64 + 5_000) {
            let c = &centres[(m % 200) as usize];
            let noise = rng.unit(128);
            let v: Vec<f32> = c.iter().zip(&noise).map(|(a, b)| a + 0.4 * b).collect();
            let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            let v: Vec<f32> = v.into_iter().map(|x| x / n).collect();
            index.push(entry(m, 0), v.clone()).unwrap();
            vectors.push(v);
        }
        index.commit(vectors.len() as u64).unwrap();
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
    }

    #[test]
    fn a_crash_keeps_exactly_the_committed_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let mut rng = Rng(1);
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
        let mut rng = Rng(2);
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
        index.commit(0).unwrap();
        assert!(index.is_empty());
    }
}
