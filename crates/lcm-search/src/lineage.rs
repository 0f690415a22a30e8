//! What ties a derived index to the store it was built from.
//!
//! An index records, beside its watermark, the fingerprint of the last message (or summary)
//! below it: a hash of what the index read of it (session, place, role, time and text). At
//! open, and before a search by meaning, the store's message at the same id must have the
//! same fingerprint. A data directory whose store file was replaced (by another store, or a
//! copy of this one that went another way) has other messages under the index's ids: the
//! index would hide the store's own messages from grep and find others by meaning, so it is
//! rebuilt instead. A store restored from an older copy of itself is caught before this, by a
//! watermark past its end.
//!
//! The hash is SHA-256 (its first 8 bytes): stable across builds and platforms, so an index
//! outlives upgrades, and read once per commit or check, so its speed does not matter.

use lcm_core::ids::{MessageId, SummaryId};
use lcm_core::summary::Summary;
use lcm_store::error::{Result, StoreError};
use lcm_store::records::{RecordReader, RecordView};
use sha2::{Digest, Sha256};
use std::ops::ControlFlow;

/// The fingerprint of a message's record (see the module doc).
pub fn message_fingerprint(view: &RecordView<'_>) -> Result<u64> {
    let mut hash = Sha256::new();
    hash.update(b"message");
    hash.update(view.session().0.to_le_bytes());
    hash.update(view.seq().to_le_bytes());
    hash.update(view.role().code().to_le_bytes());
    hash.update(view.created_at().0.to_le_bytes());
    hash.update(view.text()?.as_bytes());
    Ok(first_word(hash))
}

/// The fingerprint of a summary (see the module doc).
pub fn summary_fingerprint(summary: &Summary) -> u64 {
    let mut hash = Sha256::new();
    hash.update(b"summary");
    hash.update(summary.id.0.to_le_bytes());
    hash.update(summary.session.0.to_le_bytes());
    hash.update(summary.earliest_at.0.to_le_bytes());
    hash.update(summary.content.as_bytes());
    first_word(hash)
}

fn first_word(hash: Sha256) -> u64 {
    let digest = hash.finalize();
    let mut word = [0; 8];
    word.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(word)
}

/// The fingerprint of the stored message `id`, `None` when the store has none.
pub fn stored_message_fingerprint<R: RecordReader>(
    reader: &R,
    id: MessageId,
) -> Result<Option<u64>> {
    let mut found = None;
    reader.records_of(vec![id], |_, record| {
        found = Some(message_fingerprint(&RecordView::read(record)?)?);
        Ok(ControlFlow::Break(()))
    })?;
    Ok(found)
}

/// The fingerprint of the stored summary `id`, `None` when the store has none.
pub fn stored_summary_fingerprint<R: RecordReader>(
    reader: &R,
    id: SummaryId,
) -> Result<Option<u64>> {
    match reader.summary(id) {
        Ok(summary) => Ok(Some(summary_fingerprint(&summary))),
        Err(StoreError::SummaryNotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether an index whose watermark is `watermark` and whose last entry's fingerprint is
/// `last` (`None`: an index written before fingerprints, or empty) was built from the store
/// `reader` reads, as far as its last entry tells: `stored(watermark - 1)` is the store's
/// fingerprint of the same entry.
pub fn same_lineage(
    watermark: u64,
    last: Option<u64>,
    stored: impl FnOnce(u64) -> Result<Option<u64>>,
) -> Result<bool> {
    match (watermark.checked_sub(1), last) {
        (Some(id), Some(last)) => Ok(stored(id)? == Some(last)),
        _ => Ok(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::message::{NewMessage, Role};
    use lcm_core::tokens::{Encoding, TokenCounter};
    use lcm_store::store::{Store, StoreOptions};

    fn store() -> Store {
        Store::open_in_memory(StoreOptions::new(TokenCounter::new(Encoding::O200kBase))).unwrap()
    }

    fn message(at: i64, text: &str) -> NewMessage {
        NewMessage {
            created_at: lcm_core::time::Timestamp(at),
            ..NewMessage::text(Role::User, text)
        }
    }

    /// The same messages appended to two stores have the same fingerprints; a message that
    /// differs in its text, or stands elsewhere in its session, does not.
    #[test]
    fn a_fingerprint_follows_what_the_index_read_of_a_message() {
        let (a, b) = (store(), store());
        for s in [&a, &b] {
            let session = s.create_session("s", None).unwrap();
            for (at, text) in [(1, "one"), (2, "two")] {
                s.append(session, message(at, text)).unwrap();
            }
        }
        let of = |s: &Store, id: u64| {
            stored_message_fingerprint(&s.reader().unwrap(), MessageId(id)).unwrap()
        };
        assert_eq!(of(&a, 0), of(&b, 0));
        assert_eq!(of(&a, 1), of(&b, 1));
        assert_ne!(of(&a, 0), of(&a, 1));
        assert_eq!(of(&a, 2), None, "no such message");
        // The same text at another place: another fingerprint.
        let c = store();
        let session = c.create_session("s", None).unwrap();
        c.append(session, message(2, "two")).unwrap();
        assert_ne!(of(&c, 0), of(&a, 1));
        // Another text at the same place and time: another fingerprint.
        let d = store();
        let session = d.create_session("s", None).unwrap();
        d.append(session, message(1, "uno")).unwrap();
        assert_ne!(of(&d, 0), of(&a, 0));
    }

    #[test]
    fn an_index_is_of_a_store_when_its_last_entry_matches_or_is_unknown() {
        let stored = |fingerprint: Option<u64>| move |_| Ok(fingerprint);
        assert!(same_lineage(5, Some(9), stored(Some(9))).unwrap());
        assert!(!same_lineage(5, Some(9), stored(Some(8))).unwrap());
        assert!(!same_lineage(5, Some(9), stored(None)).unwrap());
        // Written before fingerprints, or empty: nothing to compare.
        assert!(same_lineage(5, None, stored(Some(8))).unwrap());
        assert!(same_lineage(0, Some(9), stored(Some(8))).unwrap());
    }
}
