//! A disk that loses power, for crash tests of the store (docs/RELIABILITY.md, "Power loss").
//! Not part of the API: hidden from the docs.
//!
//! SIGKILL never loses what the kernel already accepted, so it cannot test the syncs that the
//! durability promise rests on. [`PowerLossDisk`] can: it is a file in memory that records
//! every write, resize and sync it is given and, at a chosen point, loses power.
//!
//! **Where it sits.** [`Store::open_on_power_loss_disk`] opens a store exactly as
//! [`Store::open`] does, with the simulated disk in place of redb's file backend *under* lcm's
//! write path: redb → `CoalescedFile` (the held, sorted and merged page writes of a commit and
//! the skipped empty syncs, as in production) → this disk. So the writes and syncs it records
//! are the `pwrite`s and `fdatasync`s lcm gives the kernel, and a bug in how `CoalescedFile`
//! orders writes against syncs is a bug these tests can find. Below that line is the kernel,
//! which the simulation replaces by the two disks below.
//!
//! **The cut.** [`PowerLossDisk::cut_after`]`(k)`: the first `k` operations (writes, resizes
//! and syncs as the disk receives them; reads are not counted) succeed, and from then on every
//! operation, reads included, fails with `EIO`: the process keeps running but its disk is gone,
//! so nothing it does after the cut can reach the image. [`PowerLossDisk::cut`] cuts at once
//! (from another thread, at a random moment).
//!
//! **What survives** ([`PowerLossDisk::survivor`]):
//! - [`Survivor::Synced`]: the image as of the last successful sync: a disk that keeps nothing
//!   of an unsynced write;
//! - [`Survivor::Reordered`]: that, plus a random subset of the writes and resizes made since,
//!   each write cut at 4 KiB page boundaries and each piece kept or lost on its own, the kept
//!   ones applied in the order they were made: a disk whose cache reorders and drops writes (a
//!   later page may reach the medium while an earlier one does not).
//!
//! The surviving image is then written to a real file and opened with [`Store::open`], so the
//! recovery tested is the one that runs in production.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::StorageBackend;

use crate::coalesced_file::CoalescedFile;
use crate::error::Result;
use crate::store::{Store, StoreOptions};

/// `EIO`: the I/O error every operation returns once the power is gone.
const EIO: i32 = 5;
/// The granularity at which [`Survivor::Reordered`] keeps or loses unsynced writes.
pub const PAGE: u64 = 4096;

/// What survives the power loss of a [`PowerLossDisk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Survivor {
    /// Only what was synced.
    Synced,
    /// What was synced and a random subset of the unsynced page writes and resizes.
    Reordered,
}

/// A simulated disk holding one file, shared by the store that writes it (through
/// [`Store::open_on_power_loss_disk`]) and the test that cuts its power. Cheap to clone: all
/// clones are the same disk.
#[derive(Clone, Default)]
pub struct PowerLossDisk {
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// The file as the process sees it.
    current: Vec<u8>,
    /// The file as of the last successful sync.
    durable: Vec<u8>,
    /// Writes and resizes since the last sync, in order.
    pending: Vec<Pending>,
    /// Writes, resizes and syncs that succeeded.
    operations: u64,
    syncs: u64,
    /// Operations allowed before the power goes.
    cut_after: Option<u64>,
    cut: bool,
}

enum Pending {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

fn power_lost() -> io::Error {
    io::Error::from_raw_os_error(EIO)
}

fn apply(image: &mut Vec<u8>, op: &Pending) {
    match op {
        Pending::Write { offset, data } => write_at(image, *offset, data),
        Pending::SetLen(len) => image.resize(to_usize(*len), 0),
    }
}

fn write_at(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = to_usize(offset);
    let end = start + data.len();
    if end > image.len() {
        image.resize(end, 0);
    }
    image[start..end].copy_from_slice(data);
}

fn to_usize(n: u64) -> usize {
    // A simulated disk lives in memory: it cannot be larger than the address space.
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl State {
    /// Counts an operation that changes the disk, or fails it if the power is (now) gone.
    fn operation(&mut self) -> io::Result<()> {
        self.alive()?;
        if self.cut_after.is_some_and(|k| self.operations >= k) {
            self.cut = true;
            return Err(power_lost());
        }
        self.operations += 1;
        Ok(())
    }

    fn alive(&self) -> io::Result<()> {
        if self.cut { Err(power_lost()) } else { Ok(()) }
    }
}

impl PowerLossDisk {
    /// An empty disk (a store not created yet).
    pub fn new() -> PowerLossDisk {
        PowerLossDisk::default()
    }

    /// A disk holding `image`, all of it synced (a store file written before).
    pub fn from_image(image: Vec<u8>) -> PowerLossDisk {
        let disk = PowerLossDisk::default();
        {
            let mut state = disk.state();
            state.current = image.clone();
            state.durable = image;
        }
        disk
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock with the state half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The power goes once `operations` operations in all (counted from the disk's creation)
    /// have succeeded: the next one fails, and every one after it.
    pub fn cut_after(&self, operations: u64) {
        let mut state = self.state();
        state.cut_after = Some(operations);
        if state.operations >= operations {
            state.cut = true;
        }
    }

    /// The power goes now.
    pub fn cut(&self) {
        self.state().cut = true;
    }

    /// Whether the power is gone.
    pub fn is_cut(&self) -> bool {
        self.state().cut
    }

    /// Writes, resizes and syncs that succeeded so far.
    pub fn operations(&self) -> u64 {
        self.state().operations
    }

    /// Syncs that succeeded so far.
    pub fn syncs(&self) -> u64 {
        self.state().syncs
    }

    /// Writes and resizes made since the last sync (what a power loss now would put at risk).
    pub fn unsynced(&self) -> usize {
        self.state().pending.len()
    }

    /// The file a power loss now leaves (or left) on the disk; `seed` picks the subset of
    /// unsynced pages kept by [`Survivor::Reordered`].
    pub fn survivor(&self, survivor: Survivor, seed: u64) -> Vec<u8> {
        let state = self.state();
        let mut image = state.durable.clone();
        if survivor == Survivor::Synced {
            return image;
        }
        let mut rng = lcm_core::rng::SplitMix64::new(seed);
        for op in &state.pending {
            match op {
                Pending::SetLen(_) => {
                    if rng.coin() {
                        apply(&mut image, op);
                    }
                }
                Pending::Write { offset, data } => {
                    let end = offset + data.len() as u64;
                    let mut at = *offset;
                    while at < end {
                        let next = end.min((at / PAGE + 1) * PAGE);
                        if rng.coin() {
                            let from = to_usize(at - offset);
                            let to = to_usize(next - offset);
                            write_at(&mut image, at, &data[from..to]);
                        }
                        at = next;
                    }
                }
            }
        }
        image
    }
}

impl fmt::Debug for PowerLossDisk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state();
        f.debug_struct("PowerLossDisk")
            .field("len", &state.current.len())
            .field("operations", &state.operations)
            .field("unsynced", &state.pending.len())
            .field("cut", &state.cut)
            .finish()
    }
}

/// The disk as redb's storage backend.
#[derive(Debug)]
struct SimulatedFile(PowerLossDisk);

impl StorageBackend for SimulatedFile {
    fn len(&self) -> io::Result<u64> {
        let state = self.0.state();
        state.alive()?;
        Ok(state.current.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let state = self.0.state();
        state.alive()?;
        let start = to_usize(offset);
        let bytes = start
            .checked_add(out.len())
            .and_then(|end| state.current.get(start..end))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.0.state();
        state.operation()?;
        let op = Pending::SetLen(len);
        apply(&mut state.current, &op);
        state.pending.push(op);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut state = self.0.state();
        state.operation()?;
        let state = &mut *state;
        for op in state.pending.drain(..) {
            apply(&mut state.durable, &op);
        }
        state.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut state = self.0.state();
        state.operation()?;
        write_at(&mut state.current, offset, data);
        state.pending.push(Pending::Write {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }

    fn close(&self) -> io::Result<()> {
        Ok(())
    }
}

impl Store {
    /// Opens a store as [`Store::open`] does, on the simulated `disk` (with lcm's write path,
    /// `CoalescedFile`, above it). [`Store::path`] is `None`.
    pub fn open_on_power_loss_disk(disk: &PowerLossDisk, options: StoreOptions) -> Result<Store> {
        Store::open_on_backend(CoalescedFile::new(SimulatedFile(disk.clone())), options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(disk: &PowerLossDisk) -> SimulatedFile {
        SimulatedFile(disk.clone())
    }

    #[test]
    fn after_the_cut_every_operation_fails_and_the_image_is_frozen() {
        let disk = PowerLossDisk::new();
        let f = file(&disk);
        f.set_len(2 * PAGE).unwrap();
        f.write(0, &[1; 4096]).unwrap();
        f.sync_data().unwrap();
        disk.cut_after(4);
        f.write(PAGE, &[2; 4096]).unwrap(); // the 4th operation: still powered
        let err = f.sync_data().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(EIO));
        assert!(disk.is_cut());
        assert!(f.write(0, &[3; 10]).is_err());
        assert!(f.read(0, &mut [0; 10]).is_err());
        assert!(f.len().is_err());
        assert_eq!(disk.operations(), 4);
        let synced = disk.survivor(Survivor::Synced, 0);
        assert_eq!(synced.len(), 2 * PAGE as usize);
        assert!(synced[..4096].iter().all(|&b| b == 1));
        assert!(synced[4096..].iter().all(|&b| b == 0), "never synced");
    }

    #[test]
    fn a_reordering_disk_keeps_any_subset_of_unsynced_pages_and_never_a_synced_loss() {
        let disk = PowerLossDisk::new();
        let f = file(&disk);
        f.set_len(8 * PAGE).unwrap();
        f.write(0, &[9; 8 * 4096]).unwrap();
        f.sync_data().unwrap();
        // One write of four pages and two single pages, unsynced.
        f.write(PAGE, &[1; 4 * 4096]).unwrap();
        f.write(6 * PAGE, &[2; 4096]).unwrap();
        f.write(7 * PAGE, &[3; 4096]).unwrap();
        disk.cut();
        let mut kept_counts = std::collections::BTreeSet::new();
        for seed in 0..64 {
            let image = disk.survivor(Survivor::Reordered, seed);
            assert_eq!(image.len(), 8 * PAGE as usize);
            let page = |p: usize| image[p * 4096..(p + 1) * 4096].to_vec();
            assert!(page(0).iter().all(|&b| b == 9), "synced, never lost");
            let mut kept = 0;
            for (p, new) in [(1, 1u8), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (7, 3)] {
                let bytes = page(p);
                if p == 5 {
                    assert!(bytes.iter().all(|&b| b == 9), "never written again");
                    continue;
                }
                // Each page is whole: old or new, never torn.
                assert!(bytes.iter().all(|&b| b == new) || bytes.iter().all(|&b| b == 9));
                kept += usize::from(bytes[0] == new);
            }
            kept_counts.insert(kept);
        }
        // Pages of the one four-page write are kept or lost one by one.
        assert!(kept_counts.len() > 3, "subsets seen: {kept_counts:?}");
        assert_eq!(disk.survivor(Survivor::Reordered, 7), {
            disk.survivor(Survivor::Reordered, 7)
        });
    }

    #[test]
    fn an_unsynced_growth_may_be_lost() {
        let disk = PowerLossDisk::from_image(vec![5; 4096]);
        let f = file(&disk);
        f.set_len(3 * PAGE).unwrap();
        disk.cut();
        assert_eq!(disk.survivor(Survivor::Synced, 0), vec![5; 4096]);
        let lengths: std::collections::BTreeSet<usize> = (0..32)
            .map(|seed| disk.survivor(Survivor::Reordered, seed).len())
            .collect();
        assert_eq!(
            lengths,
            [4096, 3 * 4096].into_iter().collect(),
            "kept or lost"
        );
    }
}
