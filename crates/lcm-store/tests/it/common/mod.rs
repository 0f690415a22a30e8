//! Helpers shared by the store's integration tests.

use lcm_core::ids::FileId;
use lcm_core::summary::SummaryKind;
use lcm_core::time::Timestamp;

/// Mirror of the store's summary record (same fields, same order: the same bytes), for
/// tests that write records as a raw redb write would.
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
pub struct SummaryRec {
    pub session: u64,
    pub kind: SummaryKind,
    pub depth: u32,
    pub content: String,
    pub token_count: u32,
    pub earliest_at: Timestamp,
    pub latest_at: Timestamp,
    pub descendant_messages: u64,
    pub descendant_tokens: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub file_ids: Vec<FileId>,
    pub level: u8,
    pub model: String,
    pub created_at: Timestamp,
}
