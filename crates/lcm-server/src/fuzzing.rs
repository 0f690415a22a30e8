//! Entry points for the fuzz harness (feature `fuzzing`; only the workspace's test targets
//! enable it): the server's parsers of outside bytes, which are private to this crate.

use lcm_core::ids::SessionId;
use lcm_core::message::{NewMessage, SessionInfo};
use lcm_core::time::Timestamp;

pub use crate::proxy::fuzzing::{
    ParsedRequest, ProxyShape, answer_message, json_answer, proxy_request, stream_answer,
};

/// Parses the body of `POST /v1/sessions/{id}/messages` for a session `ses_1` with key
/// `fuzz`, as the handler does. `Err` holds the error's kind and message, as the client would
/// get them.
pub fn api_messages(body: &[u8]) -> Result<Vec<NewMessage>, String> {
    let session = SessionInfo {
        id: SessionId(1),
        key: "fuzz".into(),
        created_at: Timestamp(0),
        parent: None,
        message_count: 0,
        token_total: 0,
        first_message_at: None,
        last_message_at: None,
    };
    crate::messages::parse_messages(body, &session)
        .map_err(|e| format!("{}: {}", e.kind, e.message))
}
