//! # lcm-core
//!
//! The vocabulary every other lcm crate speaks: typed ids ([`ids`]), timestamps ([`time`]), the
//! session and message model ([`message`]), file records ([`files`]), token counting ([`tokens`]), configuration
//! ([`config`]), the parsers of transcript formats ([`formats`]) and a deterministic random
//! source ([`rng`]).
//!
//! Architecture invariant: this crate does no I/O (no files, no network, no clock other than
//! `Timestamp::now`). Everything here is a pure function of its inputs, which is what lets the
//! store, the engine and the tests share one definition of each idea.

pub mod config;
pub mod cores;
pub mod digest;
pub mod files;
pub mod formats;
pub mod ids;
pub mod message;
pub mod rng;
pub mod summary;
pub mod time;
pub mod tokens;

pub use config::Config;
pub use ids::{AnyId, FileId, IdError, JobId, MessageId, SessionId, SummaryId};
pub use message::{Message, NewMessage, Original, Part, Role, SessionInfo, SourceFormat};
pub use summary::{ContextState, NewSummary, NodeRef, Summary, SummaryKind};
pub use time::Timestamp;
pub use tokens::{Encoding, TokenCounter};
