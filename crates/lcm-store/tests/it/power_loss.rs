//! Power loss under the store (docs/RELIABILITY.md, "Power loss"): a workload of appends, batch
//! appends, new sessions, imports and summaries (leaf and condensed) runs on a
//! [`PowerLossDisk`] whose power goes after the k-th write or sync (k random over the whole
//! workload). The image that survives (what was synced; or that plus a random subset of the
//! unsynced pages) is written to a file and opened with `Store::open`: every acknowledged
//! message, session and summary is there, unchanged, the integrity check is clean, and the store
//! takes new writes.

use std::path::Path;

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::{NewMessage, Role};
use lcm_core::summary::{NewSummary, NodeRef, SummaryKind};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_store::import::{ImportOptions, import_file};
use lcm_store::power_loss::{PowerLossDisk, Survivor};
use lcm_store::{ApplyOutcome, Store, StoreOptions, integrity};

fn options() -> StoreOptions {
    StoreOptions::new(TokenCounter::new(Encoding::O200kBase))
}

/// What the workload was told succeeded before the power went.
#[derive(Debug, Default)]
struct Acknowledged {
    messages: Vec<(MessageId, String)>,
    sessions: Vec<(String, SessionId)>,
    summaries: Vec<(SummaryId, SessionId, String)>,
    imports: Vec<(String, Vec<String>)>,
}

fn text(n: u64) -> String {
    format!(
        "message {n}: decided to change src/file_{n}.rs {}",
        "and some narrative. ".repeat((n % 5) as usize)
    )
}

/// Ends the workload on an error, which must be the cut (anything else is a failure).
macro_rules! or_cut {
    ($disk:expr, $result:expr) => {
        match $result {
            Ok(value) => value,
            Err(e) => {
                assert!($disk.is_cut(), "an error with the power on: {e}");
                return;
            }
        }
    };
}

/// The workload: 12 rounds of appends (single and batches), a new session every fourth round,
/// an import every fifth, a leaf summary of the oldest raw messages every second round and a
/// condensed summary once three leaves are on top. Stops at the first error (the cut).
fn workload(disk: &PowerLossDisk, inputs: &Path, acked: &mut Acknowledged) {
    let store = or_cut!(disk, Store::open_on_power_loss_disk(disk, options()));
    let main = or_cut!(disk, store.create_session("main", None));
    acked.sessions.push(("main".into(), main));
    let mut n = 0u64;
    for round in 0..12u64 {
        let r = or_cut!(
            disk,
            store.append(main, NewMessage::text(Role::User, text(n)))
        );
        acked.messages.push((r.id, text(n)));
        n += 1;
        if round % 3 == 1 {
            let batch = (n..n + 6)
                .map(|k| NewMessage::text(Role::Assistant, text(k)))
                .collect();
            let results = or_cut!(disk, store.append_batch(main, batch));
            for r in results {
                acked.messages.push((r.id, text(n)));
                n += 1;
            }
        }
        if round % 4 == 3 {
            let key = format!("side-{round}");
            let side = or_cut!(disk, store.ensure_session(&key));
            acked.sessions.push((key, side));
            let r = or_cut!(
                disk,
                store.append(side, NewMessage::text(Role::User, text(n)))
            );
            acked.messages.push((r.id, text(n)));
            n += 1;
        }
        if round % 5 == 4 {
            let key = format!("imported-{round}");
            let texts: Vec<String> = (0..3).map(|k| text(1_000 * round + k)).collect();
            let lines: String = texts
                .iter()
                .enumerate()
                .map(|(k, t)| {
                    format!(
                        "{{\"session\":\"{key}\",\"role\":\"user\",\"created_at\":\"2026-02-10T21:11:56Z\",\"key\":\"k{k}\",\"parts\":[{{\"type\":\"text\",\"text\":\"{t}\"}}]}}\n"
                    )
                })
                .collect();
            let file = inputs.join(format!("{key}.jsonl"));
            std::fs::write(&file, lines).unwrap();
            let report = or_cut!(
                disk,
                import_file(&store, &file, &ImportOptions::default(), |_, _| {})
            );
            assert_eq!(report.imported, 3);
            acked.imports.push((key, texts));
        }
        if round % 2 == 1 {
            summarise(disk, &store, main, acked);
        }
    }
}

/// A leaf summary of the 4 oldest raw messages, then, with 3 leaves on top, a condensed one.
fn summarise(disk: &PowerLossDisk, store: &Store, session: SessionId, acked: &mut Acknowledged) {
    let context = or_cut!(disk, store.context(session));
    let raw = or_cut!(
        disk,
        store.session_messages(session, context.raw_from..context.raw_from + 4)
    );
    if raw.len() == 4 {
        let content = format!("leaf over #{}..", context.raw_from);
        let leaf = NewSummary {
            session,
            kind: SummaryKind::Leaf,
            depth: 0,
            content: content.clone(),
            token_count: 10,
            sources: raw.iter().map(|m| NodeRef::Message(m.id)).collect(),
            level: 1,
            model: "test".into(),
            digest: None,
        };
        match or_cut!(disk, store.apply_summary(leaf, Vec::new())) {
            ApplyOutcome::Applied { summary, .. } => {
                acked.summaries.push((summary.id, session, content))
            }
            ApplyOutcome::Stale { reason } => panic!("stale with one writer: {reason}"),
        }
    }
    let context = or_cut!(disk, store.context(session));
    let leaves: Vec<SummaryId> = context.summaries.iter().copied().take(3).collect();
    let depths: Vec<u32> = leaves
        .iter()
        .map(|id| store.summary(*id).map(|s| s.depth).unwrap_or(u32::MAX))
        .collect();
    if leaves.len() == 3 && depths.iter().all(|&d| d == 0) {
        let content = format!("condensed over {leaves:?}");
        let condensed = NewSummary {
            session,
            kind: SummaryKind::Condensed,
            depth: 1,
            content: content.clone(),
            token_count: 12,
            sources: leaves.iter().map(|id| NodeRef::Summary(*id)).collect(),
            level: 2,
            model: "test".into(),
            digest: None,
        };
        match or_cut!(disk, store.apply_summary(condensed, Vec::new())) {
            ApplyOutcome::Applied { summary, .. } => {
                acked.summaries.push((summary.id, session, content))
            }
            ApplyOutcome::Stale { reason } => panic!("stale with one writer: {reason}"),
        }
    }
}

/// Reopens the surviving `image` with `Store::open` and checks everything acknowledged.
fn check_survivor(image: &[u8], acked: &Acknowledged, what: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("lcm.redb");
    std::fs::write(&path, image).unwrap();
    let store = Store::open(&path, options())
        .unwrap_or_else(|e| panic!("{what}: the surviving image does not open: {e}"));
    for (id, text) in &acked.messages {
        let m = store
            .message(*id)
            .unwrap_or_else(|e| panic!("{what}: acknowledged {id} lost: {e}"));
        assert_eq!(&*m.search_text(), text.as_str(), "{what}: {id} changed");
    }
    for (key, id) in &acked.sessions {
        assert_eq!(
            store.session_id_for_key(key).unwrap(),
            Some(*id),
            "{what}: acknowledged session {key} lost"
        );
    }
    for (id, session, content) in &acked.summaries {
        let s = store
            .summary(*id)
            .unwrap_or_else(|e| panic!("{what}: acknowledged {id} lost: {e}"));
        assert_eq!((&s.session, &s.content), (session, content), "{what}: {id}");
    }
    for (key, texts) in &acked.imports {
        let session = store
            .session_id_for_key(key)
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: imported session {key} lost"));
        let stored: Vec<String> = store
            .session_messages(session, 0..u64::MAX)
            .unwrap()
            .iter()
            .map(|m| m.search_text().into_owned())
            .collect();
        assert_eq!(&stored, texts, "{what}: import {key}");
    }
    let report = integrity::check(&store, None).unwrap();
    assert!(report.is_clean(), "{what}: {:?}", report.violations);
    // Still a working store: it takes a new write.
    let session = store.ensure_session("after").unwrap();
    store
        .append(session, NewMessage::text(Role::User, "after the crash"))
        .unwrap_or_else(|e| panic!("{what}: the recovered store refuses writes: {e}"));
}

/// The number of writes, resizes and syncs the whole workload gives the disk.
fn operations_of_the_whole_workload(inputs: &Path) -> u64 {
    let disk = PowerLossDisk::new();
    let mut acked = Acknowledged::default();
    workload(&disk, inputs, &mut acked);
    assert!(!disk.is_cut());
    assert!(
        acked.summaries.len() >= 6,
        "{} summaries",
        acked.summaries.len()
    );
    disk.operations()
}

fn trials(survivor: Survivor, seeds: std::ops::Range<u64>) {
    let inputs = tempfile::tempdir().unwrap();
    let total = operations_of_the_whole_workload(inputs.path());
    let mut cut_mid_commit = 0;
    for seed in seeds {
        // Spread the cuts over the whole workload: k from a seeded generator, plus the edges.
        let k = match seed {
            0 => 0,
            1 => total - 1,
            _ => seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) % total,
        };
        let disk = PowerLossDisk::new();
        disk.cut_after(k);
        let mut acked = Acknowledged::default();
        workload(&disk, inputs.path(), &mut acked);
        assert!(disk.is_cut(), "k = {k} of {total}: the power never went");
        cut_mid_commit += usize::from(disk.unsynced() > 0);
        let image = disk.survivor(survivor, seed);
        check_survivor(
            &image,
            &acked,
            &format!("{survivor:?}, seed {seed}, cut after {k} of {total} operations"),
        );
    }
    assert!(
        cut_mid_commit > 0,
        "no cut left unsynced writes: the reordering disk was not tested"
    );
}

#[test]
fn only_synced_data_survives_and_every_acknowledged_write_is_there() {
    trials(Survivor::Synced, 0..40);
}

#[test]
fn a_reordering_disk_keeps_a_random_part_of_the_last_commit_and_loses_nothing_acknowledged() {
    trials(Survivor::Reordered, 0..40);
}

#[test]
fn many_reorderings_of_the_same_cut_all_recover() {
    // One cut in the middle of a commit's writes, 30 subsets of its unsynced pages.
    let inputs = tempfile::tempdir().unwrap();
    let total = operations_of_the_whole_workload(inputs.path());
    let mut tried = 0;
    for k in (total / 2..total).rev() {
        let disk = PowerLossDisk::new();
        disk.cut_after(k);
        let mut acked = Acknowledged::default();
        workload(&disk, inputs.path(), &mut acked);
        if disk.unsynced() < 4 {
            continue;
        }
        for seed in 0..30 {
            let image = disk.survivor(Survivor::Reordered, seed);
            check_survivor(&image, &acked, &format!("k = {k}, subset {seed}"));
        }
        tried += 1;
        if tried == 2 {
            break;
        }
    }
    assert_eq!(tried, 2, "no cut left four unsynced writes");
}

/// Regression (found by these tests): a power loss between redb's two syncs of a new file (the
/// header, then its magic number) left a file redb refused for ever, "Not a redb database";
/// lcm now empties such a file, which holds nothing, and creates the store again.
#[test]
fn a_power_loss_while_the_store_is_created_leaves_a_store_that_opens() {
    let inputs = tempfile::tempdir().unwrap();
    let mut interrupted = 0;
    for k in 0..12 {
        for survivor in [Survivor::Synced, Survivor::Reordered] {
            let disk = PowerLossDisk::new();
            disk.cut_after(k);
            let mut acked = Acknowledged::default();
            workload(&disk, inputs.path(), &mut acked);
            let image = disk.survivor(survivor, k);
            interrupted += usize::from(!image.is_empty() && image[..9].iter().all(|&b| b == 0));
            check_survivor(&image, &acked, &format!("{survivor:?}, cut after {k}"));
        }
    }
    assert!(
        interrupted > 0,
        "no cut fell between the two syncs of the creation"
    );
}
