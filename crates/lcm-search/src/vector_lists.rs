//! The vector index's lists (an inverted file): past [`LISTS_FROM`] entries, an unscoped
//! search's first pass reads the sign codes of the entries in the lists nearest the query
//! instead of every code, which at a million entries was memory-bound at about 8 ms a query
//! (docs/PERFORMANCE.md, "Hybrid recall").
//!
//! - **Training**: spherical k-means over a sample of the entries' int8 vectors (deterministic:
//!   an evenly spaced sample, the first centroids evenly spaced entries), `√n` lists (16 to
//!   4,096); every entry then goes to the list of its nearest centroid. Lists are first
//!   trained once the index holds [`LISTS_FROM`] entries; later entries join the nearest
//!   existing list. Once the index has grown fourfold since (twice the lists its size calls
//!   for: at 800,000 entries, then 3.2 million), the lists are trained anew on every entry
//!   (`Lists::due`): lists trained on what an agent did months ago would hold ever longer
//!   lists for what it does now, and miss more (docs/PERFORMANCE.md, "Lists that drift").
//!   Training (about 10 s at a million entries on two cores) is never part of a commit, which
//!   holds the index's write lock: the catch-up trains after its commit, under the read lock,
//!   so searches go on, and swaps the lists in ([`crate::vectors::VectorIndex::lists_due`]).
//!   A rebuild (`lcm reindex`) trains anew. A read-only process never trains: without list
//!   files it searches every code, as below the threshold.
//! - **Files**, derived from the index's int8 vectors and repaired from them: `centroids.bin`
//!   (list count and dimension as u32 LE, then the int8 centroids; replaced whole) and
//!   `lists.bin` (each entry's list as u16 LE, appended and synced with the index's files
//!   before its manifest names the entries). At open, a list file shorter than the index is
//!   completed by assigning the missing entries, a longer one cut, and one naming a list that
//!   does not exist is discarded with the centroids (trained again). New lists replace old
//!   ones in an order a crash cannot mix up: the list file is emptied first, then the
//!   centroids replaced, then every entry's list written; an empty or short list file is
//!   completed from whichever centroids the crash left.
//! - **Search**: the query's nearest `Lists::probes` lists (a quarter of them, at least 8)
//!   give the candidates; the two passes of [`crate::vectors`] run over them.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use lcm_store::error::{Result, StoreError};
use rayon::prelude::*;

use crate::vectors::{
    dot_i8, hamming, histogram, io, quantise, replace_file, set_file_len, take_nearest,
};

/// Entries from which an index has lists (below it, a full first pass costs under 2 ms).
pub const LISTS_FROM: usize = 200_000;
const CENTROIDS: &str = "centroids.bin";
const ASSIGNMENT: &str = "lists.bin";
/// Sample points per list for training.
const SAMPLE_PER_LIST: usize = 32;
/// Rounds of k-means.
const ROUNDS: usize = 6;

/// The lists of one vector index (see the module doc).
pub(crate) struct Lists {
    dimension: usize,
    /// `count × dimension` int8 centroids (unit vectors, quantised).
    centroids: Vec<i8>,
    /// Each entry's list.
    assignment: Vec<u16>,
    /// Each list's entries, in order.
    members: Vec<Vec<u32>>,
    /// Each list's entries' sign codes, in the same order: the first pass reads a list's
    /// codes in one sweep instead of one cache miss an entry.
    codes: Vec<Vec<u64>>,
}

impl Lists {
    /// How many lists an index of `n` entries is trained with.
    pub(crate) fn count_for(n: usize) -> usize {
        ((n as f64).sqrt().round() as usize).clamp(16, 4096)
    }

    pub(crate) fn count(&self) -> usize {
        self.members.len()
    }

    /// Whether an index of `n` entries has outgrown these lists: its size calls for twice as
    /// many (it has grown fourfold since they were trained), so they are trained anew.
    pub(crate) fn due(&self, n: usize) -> bool {
        Self::count_for(n) >= 2 * self.count()
    }

    /// How many entries the longest list holds.
    pub(crate) fn longest(&self) -> usize {
        self.members.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// How many lists a search reads: a quarter. On real embeddings (benches/vectors.rs,
    /// `real`) a sixteenth lost 6-7% of the exact top ten, an eighth 3%, a quarter 1%.
    pub(crate) fn probes(&self) -> usize {
        (self.count() / 4).max(8).min(self.count())
    }

    /// Trains lists on the first `n` entries, `vector(i)` giving entry `i`'s int8 vector and
    /// scale, and assigns each of them.
    pub(crate) fn train<'a>(
        n: usize,
        dimension: usize,
        vector: &(impl Fn(usize) -> (&'a [i8], f32) + Sync),
        codes: &[u64],
    ) -> Lists {
        let count = Self::count_for(n).min(n.max(1));
        let sample_len = (count * SAMPLE_PER_LIST).min(n);
        let sample: Vec<usize> = (0..sample_len).map(|s| s * n / sample_len).collect();
        let mut centroids: Vec<i8> = (0..count)
            .flat_map(|c| vector(c * n / count).0.to_vec())
            .collect();
        for _ in 0..ROUNDS {
            let nearest: Vec<u16> = sample
                .par_iter()
                .map(|&i| nearest_of(&centroids, dimension, vector(i).0))
                .collect();
            let mut sums = vec![0f32; count * dimension];
            for (&i, &c) in sample.iter().zip(&nearest) {
                let (v, scale) = vector(i);
                let sum = &mut sums[usize::from(c) * dimension..][..dimension];
                for (s, &x) in sum.iter_mut().zip(v) {
                    *s += f32::from(x) * scale;
                }
            }
            for (c, sum) in sums.chunks_exact(dimension).enumerate() {
                let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
                // A list no sample point chose keeps its centroid.
                if norm > 0.0 {
                    let unit: Vec<f32> = sum.iter().map(|x| x / norm).collect();
                    centroids[c * dimension..(c + 1) * dimension]
                        .copy_from_slice(&quantise(&unit).0);
                }
            }
        }
        let mut lists = Lists::new(dimension, centroids, count);
        lists.assign_up_to(n, vector, codes);
        lists
    }

    fn new(dimension: usize, centroids: Vec<i8>, count: usize) -> Lists {
        Lists {
            dimension,
            centroids,
            assignment: Vec::new(),
            members: vec![Vec::new(); count],
            codes: vec![Vec::new(); count],
        }
    }

    fn words(&self) -> usize {
        self.dimension / 64
    }

    /// Puts entry `i` (the next one) in `list`.
    fn add(&mut self, i: usize, list: u16, codes: &[u64]) {
        let words = self.words();
        let list_index = usize::from(list);
        self.members[list_index].push(i as u32);
        self.codes[list_index].extend_from_slice(&codes[i * words..(i + 1) * words]);
        self.assignment.push(list);
    }

    /// Assigns the entries from the last assigned one up to `n` to their nearest lists.
    pub(crate) fn assign_up_to<'a>(
        &mut self,
        n: usize,
        vector: &(impl Fn(usize) -> (&'a [i8], f32) + Sync),
        codes: &[u64],
    ) {
        let from = self.assignment.len();
        if n <= from {
            return;
        }
        let nearest: Vec<u16> = (from..n)
            .into_par_iter()
            .with_min_len(1024)
            .map(|i| nearest_of(&self.centroids, self.dimension, vector(i).0))
            .collect();
        for (i, &list) in (from..n).zip(&nearest) {
            self.add(i, list, codes);
        }
    }

    /// Forgets the entries from `n` on (a commit that failed).
    pub(crate) fn truncate(&mut self, n: usize) {
        let words = self.words();
        for &list in self.assignment.get(n..).unwrap_or_default() {
            let list = usize::from(list);
            self.members[list].pop();
            let len = self.codes[list].len();
            self.codes[list].truncate(len - words);
        }
        self.assignment.truncate(n);
    }

    /// The first pass over the `probes` lists nearest `query` (int8): the `wanted` entries
    /// among theirs whose sign codes are nearest `code` (all of them when they are fewer).
    pub(crate) fn nearest(
        &self,
        query: &[i8],
        code: &[u64],
        probes: usize,
        wanted: usize,
    ) -> Vec<usize> {
        let mut by_score: Vec<(i32, usize)> = self
            .centroids
            .chunks_exact(self.dimension)
            .map(|c| dot_i8(c, query))
            .zip(0..)
            .collect();
        let probes = probes.min(by_score.len());
        if probes == 0 {
            return Vec::new();
        }
        by_score.select_nth_unstable_by(probes - 1, |a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let probed = &by_score[..probes];
        let positions: Vec<usize> = probed
            .iter()
            .flat_map(|&(_, list)| self.members[list].iter().map(|&i| i as usize))
            .collect();
        if positions.len() <= wanted {
            return positions;
        }
        let mut distances = vec![0u16; positions.len()];
        let mut at = 0;
        for &(_, list) in probed {
            let len = self.members[list].len();
            hamming(
                &self.codes[list],
                self.words(),
                code,
                &mut distances[at..at + len],
            );
            at += len;
        }
        let histogram = histogram(&distances, self.dimension);
        take_nearest(&distances, &histogram, wanted, |j| positions[j])
    }

    /// Bytes of the list files.
    pub(crate) fn disk_bytes(&self) -> u64 {
        (8 + self.centroids.len() + self.assignment.len() * 2) as u64
    }

    /// Bytes these lists hold in memory.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.centroids.capacity()
            + self.assignment.capacity() * 2
            + self.members.iter().map(|m| m.capacity() * 4).sum::<usize>()
            + self.codes.iter().map(|c| c.capacity() * 8).sum::<usize>()) as u64
    }

    /// How many lists the centroids file in `dir` says it holds (`None` without one), read
    /// from its header only.
    pub(crate) fn count_in(dir: &Path) -> Result<Option<usize>> {
        let path = dir.join(CENTROIDS);
        let mut header = [0u8; 4];
        match File::open(&path).and_then(|mut f| f.read_exact(&mut header)) {
            Ok(()) => Ok(Some(u32::from_le_bytes(header) as usize)),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(StoreError::io(&path, e)),
        }
    }

    /// The lists in `dir` for the first `n` entries, completed from `vector` when the list file
    /// is short (and cut when long, if `writable`); `None` when there are none, or none usable.
    pub(crate) fn load<'a>(
        dir: &Path,
        dimension: usize,
        n: usize,
        writable: bool,
        vector: &(impl Fn(usize) -> (&'a [i8], f32) + Sync),
        codes: &[u64],
    ) -> Result<Option<Lists>> {
        let path = dir.join(CENTROIDS);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::io(&path, e)),
        };
        let u32_at = |at: usize| {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        };
        let (Some(count), Some(stored_dimension)) = (u32_at(0), u32_at(4)) else {
            return Ok(None);
        };
        if stored_dimension != dimension
            || count == 0
            || count > usize::from(u16::MAX)
            || bytes.len() != 8 + count * dimension
        {
            return Ok(None);
        }
        let centroids = bytes[8..].iter().map(|&b| b as i8).collect();
        let path = dir.join(ASSIGNMENT);
        let mut stored = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut stored).map_err(io(&path))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(&path, e)),
        }
        let mut lists = Lists::new(dimension, centroids, count);
        for (i, pair) in stored.chunks_exact(2).take(n).enumerate() {
            let list = u16::from_le_bytes([pair[0], pair[1]]);
            if usize::from(list) >= count {
                return Ok(None);
            }
            lists.add(i, list, codes);
        }
        let kept = lists.assignment.len();
        lists.assign_up_to(n, vector, codes);
        if writable && (kept < n || stored.len() != n * 2) {
            set_file_len(&path, (kept * 2) as u64)?;
            lists.append(dir, kept)?;
        }
        Ok(Some(lists))
    }

    /// Writes the centroids and every assignment (new lists, in place of any old ones),
    /// synced: the list file is emptied before the centroids are replaced, so that a crash
    /// never leaves old assignments beside new centroids (see the module doc).
    pub(crate) fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(ASSIGNMENT);
        set_file_len(&path, 0)?;
        let mut bytes = Vec::with_capacity(8 + self.centroids.len());
        bytes.extend_from_slice(&(self.count() as u32).to_le_bytes());
        bytes.extend_from_slice(&(self.dimension as u32).to_le_bytes());
        bytes.extend(self.centroids.iter().map(|&c| c as u8));
        replace_file(dir, CENTROIDS, &bytes)?;
        self.append(dir, 0)
    }

    /// Appends the assignments of the entries from `from` on to the list file, synced.
    pub(crate) fn append(&self, dir: &Path, from: usize) -> Result<()> {
        let path = dir.join(ASSIGNMENT);
        let bytes: Vec<u8> = self.assignment[from.min(self.assignment.len())..]
            .iter()
            .flat_map(|l| l.to_le_bytes())
            .collect();
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io(&path))?;
        file.write_all(&bytes).map_err(io(&path))?;
        file.sync_all().map_err(io(&path))
    }

    /// Removes the files of the lists in `dir` (a rebuild).
    pub(crate) fn remove(dir: &Path) -> Result<()> {
        for name in [CENTROIDS, ASSIGNMENT] {
            let path = dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(&path, e)),
            }
        }
        Ok(())
    }
}

/// The list whose centroid is nearest `v` (the largest int8 dot product; ties to the first).
fn nearest_of(centroids: &[i8], dimension: usize, v: &[i8]) -> u16 {
    let mut best = (i32::MIN, 0u16);
    for (c, centroid) in centroids.chunks_exact(dimension).enumerate() {
        let score = dot_i8(centroid, v);
        if score > best.0 {
            best = (score, c as u16);
        }
    }
    best.1
}
