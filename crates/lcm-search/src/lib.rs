//! # lcm-search
//!
//! The search derived from lcm's store: rebuildable from it at any time, never the truth.
//! - [`index`]: the search index (tantivy for BM25 words, trigram segments for regex), caught
//!   up with the store behind a watermark.
//! - [`mod@grep`]: regex and full-text search over the index and the store's records, complete
//!   and exact, with scopes, snippets and cursors.
//! - [`word_tokens`]: how text is cut into words for full-text search.
//! - [`semantic`], [`vectors`]: search by meaning (an embedding model, the vector index of
//!   messages and summaries); [`fuse`] joins a ranking by words and one by meaning (`hybrid`).
//! - [`data_dir`]: a data directory, the store file and the index beside it.
//!
//! Architecture invariant: this crate reads stored messages only through the store's record
//! source ([`lcm_store::records`], records in lcm's own layout) and never names redb; the
//! regex plans come from `lcm-regex`.

pub mod data_dir;
pub mod grep;
mod hybrid;
pub mod index;
pub mod semantic;
mod trigram_index;
mod trigram_keys;
pub mod vectors;
pub mod word_tokens;

pub use data_dir::DataDir;
pub use grep::{GrepHit, GrepMode, GrepPage, GrepRequest, Scope, Strategy, grep};
pub use hybrid::{Fused, POOL as HYBRID_POOL, fuse};
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
