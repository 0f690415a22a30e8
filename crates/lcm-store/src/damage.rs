//! Deliberate damage to a closed store file, for tests of the integrity check and `lcm doctor`
//! in crates above this one, which never open the database themselves (nothing above the store
//! names redb). Not for production use.

use std::path::Path;

use crate::error::{Result, StoreError};
use crate::tables;

/// Sets the counter `name` (e.g. `next_message`) of the store file at `path` to `value`,
/// whatever the stored data says.
pub fn set_counter(path: &Path, name: &str, value: u64) -> Result<()> {
    let known = [
        tables::meta::NEXT_MESSAGE,
        tables::meta::NEXT_SESSION,
        tables::meta::NEXT_SUMMARY,
    ];
    let Some(&name) = known.iter().find(|k| **k == name) else {
        return Err(StoreError::InvalidMessage(format!(
            "unknown counter `{name}` (known: {known:?})"
        )));
    };
    let db = redb::Database::open(path)?;
    let txn = db.begin_write()?;
    txn.open_table(tables::META)?.insert(name, value)?;
    txn.commit()?;
    Ok(())
}
