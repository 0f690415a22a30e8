//! A session's commitment ledger: every commitment a summary has carried, with its status, and
//! those still open in the raw tail (what `lcm_describe` on a session lists).
//!
//! Commitments made and fulfilled between two compactions ("let me check the config", then the
//! read) never reach a summary and are not listed: the ledger is about what compaction could
//! have lost.

use lcm_core::digest::{Commitment, ItemRef, OpenItems, ResolutionKind};
use lcm_core::ids::{MessageId, SessionId};
use lcm_llm::structured::extract::Tracker;
use lcm_store::{Store, StoreError};
use serde::Serialize;

/// Where a commitment stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommitmentStatus {
    Open,
    Fulfilled,
    Dropped,
}

/// A commitment and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LedgerEntry {
    #[serde(flatten)]
    pub commitment: Commitment,
    pub status: CommitmentStatus,
    /// The message that fulfilled or dropped it.
    pub by: Option<MessageId>,
    /// Whether a summary covers the message it was made in.
    pub summarised: bool,
}

/// The ledger of `session`, oldest first: the commitments its summaries carried (from their
/// digests, resolved by a later digest or by the raw tail), then those made in the raw tail and
/// still open.
pub fn session_commitments(
    store: &Store,
    session: SessionId,
) -> Result<Vec<LedgerEntry>, StoreError> {
    let reader = store.reader()?;
    let mut ledger: Vec<LedgerEntry> = Vec::new();
    let resolve = |ledger: &mut Vec<LedgerEntry>, item: ItemRef, by: MessageId, how| {
        if let Some(entry) = ledger
            .iter_mut()
            .find(|e| e.commitment.item() == item && e.status == CommitmentStatus::Open)
        {
            entry.status = match how {
                ResolutionKind::Fulfilled => CommitmentStatus::Fulfilled,
                ResolutionKind::Dropped => CommitmentStatus::Dropped,
            };
            entry.by = Some(by);
        }
    };
    // Summaries in creation order: a digest's resolutions only name items made before its span.
    for summary in store.session_summaries(session)? {
        let Some(digest) = reader.summary_digest(summary.id)? else {
            continue;
        };
        for r in &digest.resolved {
            if let ItemRef::Commitment { .. } = r.item {
                resolve(&mut ledger, r.item, r.by, r.how);
            }
        }
        for c in digest.commitments {
            if !ledger.iter().any(|e| e.commitment.item() == c.item()) {
                ledger.push(LedgerEntry {
                    commitment: c,
                    status: CommitmentStatus::Open,
                    by: None,
                    summarised: true,
                });
            }
        }
    }
    // A condensed summary's digest lists what stayed open over its whole range: an item its
    // sources list but it does not was resolved inside that range, by a message the leaf
    // digests already named; so the fold above has every resolution. The raw tail may resolve
    // more, and make new ones.
    let state = reader.context(session)?;
    let open = OpenItems {
        commitments: ledger
            .iter()
            .filter(|e| e.status == CommitmentStatus::Open)
            .map(|e| e.commitment.clone())
            .collect(),
        errors: Vec::new(),
    };
    let none = |_: &str| None;
    let mut tracker = Tracker::new(&open, &none);
    for m in reader.session_messages(session, state.raw_from..u64::MAX)? {
        tracker.message(&m);
    }
    let tail = tracker.finish();
    for r in &tail.resolved {
        resolve(&mut ledger, r.item, r.by, r.how);
    }
    ledger.extend(tail.commitments.into_iter().map(|c| LedgerEntry {
        commitment: c,
        status: CommitmentStatus::Open,
        by: None,
        summarised: false,
    }));
    Ok(ledger)
}
