//! Summary digests:
//!
//! - [`ViolationKind::OrphanDigest`]: a summary digest whose summary does not exist. No repair
//!   (digests are written with their summaries);
//! - [`ViolationKind::UndecodableRecord`] for digests.
//!
//! A store of schema 4 has no digest table: nothing to check.

use redb::ReadableTable;

use super::ViolationKind;
use super::shared::{Facts, Findings, Tables};
use crate::codec;
use crate::error::Result;

/// Every summary digest decodes and belongs to a summary.
pub(super) fn check(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    let Some(digests) = &t.digests else {
        return Ok(());
    };
    for entry in digests.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let decoded: Result<lcm_core::digest::Digest> =
            codec::decode("summary_digests", bytes.value());
        if f.decode(decoded, format!("sum_{id}"))?.is_none() {
            continue;
        }
        if t.summaries.get(id)?.is_none() {
            f.push(
                ViolationKind::OrphanDigest,
                format!("sum_{id}"),
                "a digest is stored for this summary, which does not exist",
                None,
            );
        }
    }
    Ok(())
}
