//! # lcm-search
//!
//! The search derived from lcm's store: rebuildable from it at any time, never the truth.
//! - [`index`]: the search index (tantivy for BM25 words, trigram segments for regex), caught
//!   up with the store behind a watermark.
//! - [`mod@grep`]: regex and full-text search over the index and the store's records, complete
//!   and exact, with scopes, snippets and cursors.
//! - [`semantic`]: search by meaning, the embedding model and the vector indexes
//!   ([`vectors`]) of messages and of summaries it fills, caught up like the index; [`fuse`]
//!   joins a ranking by words and one by meaning for grep's `semantic` and `hybrid` modes.
//! - [`lineage`]: what ties an index to the store it was built from (the fingerprint of its
//!   last entry), so an index beside a replaced store file is rebuilt.
//! - [`word_tokens`]: how text is cut into words for full-text search.
//! - [`data_dir`]: a data directory, the store file and the indexes beside it.
//!
//! Architecture invariant: this crate reads stored messages only through the store's record
//! source ([`lcm_store::RecordSource`] and the [`lcm_store::RecordReader`] views it opens,
//! records in lcm's own layout): the index's catch-up, embedding and grep are generic over it,
//! so a second storage backend serves them unchanged (only [`data_dir`], which opens the store
//! file, and the integrity check's rebuild name redb's `Store`). It never names redb; the regex
//! plans come from `lcm-regex`. tantivy is this crate's alone: its errors reach callers as
//! [`lcm_store::StoreError::Index`], saying what the index was doing.

pub mod data_dir;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod grep;
mod hybrid;
pub mod index;
pub mod lineage;
pub mod semantic;
mod trigram_index;
mod trigram_keys;
pub mod vector_lists;
pub mod vectors;
pub mod word_tokens;

pub use data_dir::DataDir;
pub use grep::{GrepHit, GrepMode, GrepPage, GrepRequest, Scope, Strategy, grep};
pub use hybrid::{
    Fused, NEIGHBOUR_WEIGHT, POOL as HYBRID_POOL, RERANK_K, fuse, lifted_by_neighbours, reranked,
};
pub use index::SearchIndex;

/// Trigram plans of a regex ([`lcm_regex::trigram`]).
pub use lcm_regex::trigram;

impl lcm_store::integrity::DerivedIndex for SearchIndex {
    fn watermark(&self) -> lcm_core::ids::MessageId {
        SearchIndex::watermark(self)
    }

    fn num_docs(&self) -> u64 {
        SearchIndex::num_docs(self)
    }

    fn rebuild_from(&self, store: &lcm_store::Store) -> lcm_store::Result<u64> {
        self.rebuild(store, |_, _| {})
    }
}
