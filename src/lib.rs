//! # lcm
//!
//! Lossless Context Management: unbounded, lossless memory for LLM agents inside a bounded
//! context window. This facade re-exports the public API of the workspace's crates:
//!
//! - [`core`]: ids, the message model, configuration, token counting, transcript formats;
//! - [`store`]: the immutable redb store: messages, the summary DAG, file records, map jobs,
//!   import, integrity;
//! - [`search`]: the derived index (tantivy and trigram segments), regex and full-text grep;
//! - [`llm`]: providers, the extractive summariser, three-level escalation;
//! - [`engine`]: context assembly, the compaction control loop and the actor runtime;
//! - [`server`]: the daemon's HTTP API over a runtime (what `lcm serve` runs), to embed in a host;
//! - [`mcp`]: the tools over the Model Context Protocol (what `lcm mcp` runs).
//!
//! See `docs/ARCHITECTURE.md` for the layers and their invariants.

pub use lcm_core as core;
pub use lcm_engine as engine;
pub use lcm_llm as llm;
pub use lcm_mcp as mcp;
pub use lcm_search as search;
pub use lcm_server as server;
pub use lcm_store as store;

pub use lcm_core::{
    AnyId, Config, Encoding, Message, MessageId, NewMessage, Part, Role, SessionId, SessionInfo,
    Timestamp, TokenCounter,
};
pub use lcm_search::{DataDir, GrepMode, GrepRequest, Scope, SearchIndex, grep};
pub use lcm_store::{Store, StoreError};
