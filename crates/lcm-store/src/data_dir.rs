//! A data directory: the store file and the search index beside it.
//!
//! ```text
//! <data_dir>/lcm.redb   the store (the truth)
//! <data_dir>/index/     the tantivy index (derived; safe to delete)
//! ```

use std::path::{Path, PathBuf};

use lcm_core::config::Config;
use lcm_core::tokens::TokenCounter;

use crate::error::{Result, StoreError};
use crate::index::SearchIndex;
use crate::store::{Store, StoreOptions};

/// File name of the store inside a data directory.
pub const STORE_FILE: &str = "lcm.redb";
/// Directory name of the index inside a data directory.
pub const INDEX_DIR: &str = "index";

/// An opened data directory.
#[derive(Debug)]
pub struct DataDir {
    pub path: PathBuf,
    pub store: Store,
    pub index: SearchIndex,
}

impl DataDir {
    /// Opens (creating if needed) the data directory at `path`.
    pub fn open(path: impl AsRef<Path>, config: &Config) -> Result<DataDir> {
        let path = path.as_ref().to_path_buf();
        std::fs::create_dir_all(&path).map_err(|source| StoreError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let counter = TokenCounter::new(config.tokenizer.encoding());
        let store = Store::open(path.join(STORE_FILE), StoreOptions { counter })?;
        let index = SearchIndex::open(path.join(INDEX_DIR), &store, &config.search)?;
        Ok(DataDir { path, store, index })
    }
}
