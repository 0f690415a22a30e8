//! The search index against the store:
//!
//! - [`ViolationKind::WatermarkMismatch`]: the redb copy of the index watermark differs from
//!   the index's own (the tantivy commit payload). Repair: [`Repair::SetIndexWatermark`];
//! - [`ViolationKind::WatermarkBeyondEnd`]: the index watermark (or, without an index, its
//!   redb copy) is past the next message id. Repair: [`Repair::Reindex`];
//! - [`ViolationKind::IndexDocCount`]: the index does not hold exactly one document per
//!   message below its watermark. Repair: [`Repair::Reindex`].
//!
//! These run last, after the store's read transaction is closed: they read the index, then the
//! store's watermark in a transaction of their own. If the index's watermark moves meanwhile
//! (a catch-up is running), they are skipped rather than reported.

use std::ops::ControlFlow;

use lcm_core::ids::MessageId;

use super::DerivedIndex;
use super::shared::{Findings, message_end, meta_value};
use super::{Repair, ViolationKind};
use crate::error::Result;
use crate::message_rows;
use crate::store::Store;
use crate::tables::{self, meta};

/// Checks the index if there is one (returning its number of documents), else only that the
/// store's copy of the watermark (`stored_watermark`, read in the check's snapshot) is not past
/// `end`, one past the newest message. `dense`: message ids run 0..next_message without a gap.
pub(super) fn check(
    store: &Store,
    index: Option<&dyn DerivedIndex>,
    stored_watermark: u64,
    end: u64,
    dense: bool,
    f: &mut Findings,
) -> Result<Option<u64>> {
    match index {
        Some(index) => check_index(store, index, dense, f).map(Some),
        None => {
            if stored_watermark > end {
                f.push(
                    ViolationKind::WatermarkBeyondEnd,
                    format!("meta.{}", meta::INDEX_WATERMARK),
                    format!(
                        "the index watermark {stored_watermark} is past the next message id {end}: the index claims messages that do not exist and would never index the next ones"
                    ),
                    Some(Repair::Reindex),
                );
            }
            Ok(None)
        }
    }
}

/// Compares the index with the store: watermarks, and one document per message below the
/// watermark. Returns the number of documents.
fn check_index(
    store: &Store,
    index: &dyn DerivedIndex,
    dense: bool,
    f: &mut Findings,
) -> Result<u64> {
    let before = index.watermark();
    let (stored, next) = {
        let txn = store.db.begin_read()?;
        let meta_table = txn.open_table(tables::META)?;
        let messages = txn.open_table(tables::MESSAGES)?;
        (
            MessageId(meta_value(&meta_table, meta::INDEX_WATERMARK)?),
            MessageId(message_end(&meta_table, &messages)?),
        )
    };
    let docs = index.num_docs();
    let after = index.watermark();
    if before != after {
        f.skipped.push(format!(
            "index: the watermark moved from {} to {} during the check (indexing in progress); check again when the index is idle",
            before.0, after.0
        ));
        return Ok(docs);
    }
    let watermark = after;
    if watermark > next {
        f.push(
            ViolationKind::WatermarkBeyondEnd,
            "index",
            format!(
                "the index watermark {} is past the next message id {}: the index claims messages that do not exist and would never index the next ones",
                watermark.0, next.0
            ),
            Some(Repair::Reindex),
        );
        return Ok(docs);
    }
    if stored != watermark {
        f.push(
            ViolationKind::WatermarkMismatch,
            format!("meta.{}", meta::INDEX_WATERMARK),
            format!(
                "the store records watermark {}, the index's commit says {}",
                stored.0, watermark.0
            ),
            Some(Repair::SetIndexWatermark { watermark }),
        );
    }
    let below = if dense {
        watermark.0
    } else {
        let txn = store.db.begin_read()?;
        let messages = txn.open_table(tables::MESSAGES)?;
        let mut n = 0u64;
        // Counts every message below the watermark (nothing breaks the walk).
        let _all = message_rows::for_each(&messages, 0..watermark.0, |_, _| {
            n += 1;
            Ok(ControlFlow::Continue(()))
        })?;
        n
    };
    if docs != below {
        f.push(
            ViolationKind::IndexDocCount,
            "index",
            format!(
                "the index holds {docs} documents, but {below} messages are below its watermark {}: searches would {} messages",
                watermark.0,
                if docs < below { "miss" } else { "return stale or duplicate" }
            ),
            Some(Repair::Reindex),
        );
    }
    Ok(docs)
}
