//! A data directory: the store file and the search index beside it.
//!
//! ```text
//! <data_dir>/lcm.redb   the store (the truth)
//! <data_dir>/index/     the tantivy index (derived; safe to delete)
//! <data_dir>/vectors/   the vector index, with an embedding model (derived; safe to delete)
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lcm_core::config::Config;

use crate::index::SearchIndex;
use crate::semantic::{Semantic, VECTORS_DIR};
use lcm_store::error::{Result, StoreError};
use lcm_store::store::{Store, StoreOptions};

/// File name of the store inside a data directory.
pub const STORE_FILE: &str = "lcm.redb";
/// Directory name of the index inside a data directory.
pub const INDEX_DIR: &str = "index";

/// An opened data directory. The store and the index are shared handles, so a process that
/// already holds them (the daemon's runtime) can lend them as a data directory
/// ([`DataDir::from_parts`]).
#[derive(Debug, Clone)]
pub struct DataDir {
    pub path: PathBuf,
    pub store: Arc<Store>,
    pub index: Arc<SearchIndex>,
}

impl DataDir {
    /// Opens (creating if needed) the data directory at `path`.
    pub fn open(path: impl AsRef<Path>, config: &Config) -> Result<DataDir> {
        let path = path.as_ref().to_path_buf();
        std::fs::create_dir_all(&path).map_err(|source| StoreError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let store = Store::open(path.join(STORE_FILE), StoreOptions::from_config(config))?;
        Self::with_store(path, store, config)
    }

    /// Opens the data directory for reading: neither the store nor the index is written, not
    /// even on open or close, so a one-shot reader (`lcm grep`) pays no fsync. Writes through it
    /// return [`StoreError::ReadOnly`]. Falls back to [`Self::open`] when the store does not
    /// exist yet, was not closed cleanly (only a writable open recovers it) or has the layout of
    /// an older lcm (only a writable open migrates it).
    pub fn open_read_only(path: impl AsRef<Path>, config: &Config) -> Result<DataDir> {
        let path = path.as_ref().to_path_buf();
        let store =
            match Store::open_read_only(path.join(STORE_FILE), StoreOptions::from_config(config)) {
                Ok(store) => store,
                Err(StoreError::NeedsRecovery(_) | StoreError::OlderSchema { .. }) => {
                    return Self::open(path, config);
                }
                Err(StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    return Self::open(path, config);
                }
                Err(e) => return Err(e),
            };
        Self::with_store(path, store, config)
    }

    /// The data directory at `path` around its opened `store`: the index beside it.
    fn with_store(path: PathBuf, store: Store, config: &Config) -> Result<DataDir> {
        let mut index = SearchIndex::open(path.join(INDEX_DIR), &store, &config.search)?;
        index.set_semantic(Semantic::new(
            path.join(VECTORS_DIR),
            &config.embeddings,
            !store.is_read_only(),
        ));
        Ok(DataDir {
            path,
            store: Arc::new(store),
            index: Arc::new(index),
        })
    }

    /// The data directory at `path` whose store and index are already open (by a runtime).
    pub fn from_parts(path: PathBuf, store: Arc<Store>, index: Arc<SearchIndex>) -> DataDir {
        DataDir { path, store, index }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shot reader (`lcm grep`, `lcm show`) on a store of an older schema (the committed
    /// schema-5 fixture) opens it writable once, which migrates it, instead of failing.
    #[test]
    fn a_read_only_open_of_an_older_store_migrates_it() {
        let dir = tempfile::tempdir().unwrap();
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lcm-store/tests/fixtures/schema5/lcm.redb");
        std::fs::copy(fixture, dir.path().join(STORE_FILE)).unwrap();
        let config = Config::default();
        let data = DataDir::open_read_only(dir.path(), &config).unwrap();
        assert!(!data.store.is_read_only(), "opened writable to migrate");
        let id = lcm_core::ids::MessageId(27);
        assert!(
            data.store
                .message(id)
                .unwrap()
                .search_text()
                .contains("cannot find")
        );
        drop(data);
        let data = DataDir::open_read_only(dir.path(), &config).unwrap();
        assert!(data.store.is_read_only(), "migrated: read-only from now on");
        assert_eq!(data.store.message(id).unwrap().seq, 5);
    }
}
