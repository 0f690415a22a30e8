//! # lcm-embed
//!
//! Sentence embeddings in process, on the CPU, in pure Rust: a sentence-transformers model
//! (BERT: all-MiniLM-L6-v2; MPNet: all-mpnet-base-v2; the two tested) loaded from a
//! **directory**, never from the network, computed exactly as sentence-transformers computes
//! them: the text tokenised and cut at the model's `max_seq_length`, the encoder's last hidden
//! states averaged over the real (non-padding) tokens, the mean divided by its L2 norm. Tests
//! hold the vectors within 1e-4 of the Python package's on committed fixtures.
//!
//! - [`Embedder`]: load, [`Embedder::embed`] texts in batches, [`Embedder::chunks`] to cut a
//!   long text into pieces the model reads whole.
//! - [`Reranker`]: a cross-encoder (BERT with a one-logit head) that scores a query and each
//!   of a few passages read together, to reorder the first hits of a search.
//!
//! Architecture invariant: this crate knows models, not lcm's data: it takes text and returns
//! vectors; the index that keeps them is `lcm-search`'s.

#![warn(missing_docs)]

mod embedder;
mod encoder;
mod kernels;
mod reranker;

pub use embedder::{EmbedError, EmbedOptions, Embedder, HEAD_BYTES_PER_TOKEN, MAX_CHUNKED_BYTES};
pub use reranker::{RerankOptions, Reranker};
