//! The summary DAG and the active context, as data.
//!
//! A **leaf** summary covers a contiguous span of a session's messages; a **condensed** summary
//! covers a contiguous run of summaries of one depth (leaves are depth 0, a condensed summary is
//! one deeper than its sources). Summaries are immutable once written. The **context state** of a
//! session is what the model sees: an ordered list of top-level summaries followed by every raw
//! message from a frontier sequence number on. Because compaction always takes the oldest span,
//! that pair describes any context LCM can produce, and replacing it is one small write.

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::ids::{FileId, MessageId, SessionId, SummaryId};
use crate::time::Timestamp;

/// Leaf (over messages) or condensed (over summaries).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(rename_all = "snake_case")]
pub enum SummaryKind {
    Leaf,
    Condensed,
}

impl SummaryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SummaryKind::Leaf => "leaf",
            SummaryKind::Condensed => "condensed",
        }
    }
}

/// A node of the DAG: a message or a summary.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(untagged)]
pub enum NodeRef {
    Message(MessageId),
    Summary(SummaryId),
}

impl std::fmt::Display for NodeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeRef::Message(id) => id.fmt(f),
            NodeRef::Summary(id) => id.fmt(f),
        }
    }
}

/// What the agent asked of one node of its context: kept in view verbatim (`lcm_pin`, a
/// message), or set aside behind a pointer (`lcm_forget`, a raw message or a top-level
/// summary). Neither deletes anything: the node stays in the store, in the DAG and in search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextMark {
    /// Shown verbatim after the summaries once no longer in the raw tail.
    Pinned,
    /// Shown as a pointer naming it while it is in the context.
    Forgotten,
}

impl ContextMark {
    /// The byte the store keeps it as.
    pub fn to_byte(self) -> u8 {
        match self {
            ContextMark::Pinned => 1,
            ContextMark::Forgotten => 2,
        }
    }

    /// The mark a stored byte names (`None` for an unknown byte).
    pub fn from_byte(byte: u8) -> Option<ContextMark> {
        match byte {
            1 => Some(ContextMark::Pinned),
            2 => Some(ContextMark::Forgotten),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContextMark::Pinned => "pinned",
            ContextMark::Forgotten => "forgotten",
        }
    }
}

/// A node of a session's context and the mark the agent put on it, with when.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkedNode {
    pub node: NodeRef,
    pub mark: ContextMark,
    pub at: Timestamp,
}

/// A summary to be written: everything but what the store assigns (id, created_at).
#[derive(Debug, Clone, PartialEq)]
pub struct NewSummary {
    pub session: SessionId,
    pub kind: SummaryKind,
    /// 0 for a leaf; one more than its sources for a condensed summary.
    pub depth: u32,
    /// The text the model wrote (or the deterministic fallback produced).
    pub content: String,
    /// Tokens of the summary as rendered into the context (header included).
    pub token_count: u32,
    /// Its sources, oldest first: messages (leaf) or summaries of depth `depth - 1`.
    pub sources: Vec<NodeRef>,
    /// Escalation level that produced it: 1 narrative, 2 bullet points, 3 deterministic.
    pub level: u8,
    /// The model (or `extractive`, `truncation`) that wrote it.
    pub model: String,
    /// The structure of its span (see [`crate::digest`]), stored beside it.
    pub digest: Option<Digest>,
}

/// A stored summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub id: SummaryId,
    pub session: SessionId,
    pub kind: SummaryKind,
    pub depth: u32,
    pub content: String,
    pub token_count: u32,
    pub earliest_at: Timestamp,
    pub latest_at: Timestamp,
    /// Messages in its subtree.
    pub descendant_messages: u64,
    /// Tokens of those messages.
    pub descendant_tokens: u64,
    /// The session sequence numbers it covers, first and last (inclusive).
    pub first_seq: u64,
    pub last_seq: u64,
    pub sources: Vec<NodeRef>,
    /// Files mentioned anywhere in its subtree.
    pub file_ids: Vec<FileId>,
    pub level: u8,
    pub model: String,
    pub created_at: Timestamp,
}

/// What a session's model sees: top-level summaries in order, then raw messages from
/// `raw_from` on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, bincode::Encode, bincode::Decode)]
pub struct ContextState {
    pub summaries: Vec<SummaryId>,
    /// Sequence number of the oldest raw message in the context.
    pub raw_from: u64,
    /// Bumped by every replacement (part of compaction fingerprints).
    pub version: u64,
}
