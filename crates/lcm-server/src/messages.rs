//! The body of `POST /v1/sessions/{id}/messages`: lcm's own message JSON (the format of
//! `lcm_core::formats::lcm`, one message per object), alone or in a batch.
//!
//! ```text
//! {"role": "user", "content": "hello", "key": "turn-1"}
//! [{"role": "user", "content": "hi"}, {"role": "assistant", "parts": [{"type": "text", "text": "hello"}]}]
//! {"messages": [ ...the same... ]}
//! ```
//!
//! Each message is parsed by the lcm format's own parser, so the rules (and the error messages)
//! are the importer's: `role` is required, exactly one of `content` and `parts`, unknown fields
//! are refused. Differences for the API: `key` (the message's source key) is optional and, when
//! absent, the message has none (a retried request then stores it again: give keys to make
//! retries safe); `created_at` defaults to now; `session`, if given, must name the session of
//! the URL. Each message's JSON text is kept verbatim as its original.

use lcm_core::formats::lcm::parse_live_message;
use lcm_core::message::{NewMessage, SessionInfo};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::error::{ApiError, json_error, parse_json};

/// Most messages one request may append.
pub const MAX_BATCH: usize = 10_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch<'a> {
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
}

/// The session a message names, checked against the URL's.
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    session: Option<Value>,
}

/// Parses a request body into the messages to append to `session`.
pub(crate) fn parse_messages(
    body: &[u8],
    session: &SessionInfo,
) -> Result<Vec<NewMessage>, ApiError> {
    // Syntax first, for the whole body: a clear `malformed_json` with line and column.
    parse_json::<serde::de::IgnoredAny>(body)?;
    let text = std::str::from_utf8(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not UTF-8: {e}")))?;
    let trimmed = text.trim_start();
    let (raws, batch): (Vec<&RawValue>, bool) = if trimmed.starts_with('[') {
        (serde_json::from_str(text).map_err(json_error)?, true)
    } else if trimmed.starts_with('{') && is_batch_object(text)? {
        let batch: Batch<'_> = serde_json::from_str(text).map_err(|e| {
            ApiError::bad_request(format!(
                "a batch is {{\"messages\": [...]}} and nothing else: {e}"
            ))
        })?;
        (batch.messages, true)
    } else if trimmed.starts_with('{') {
        (vec![serde_json::from_str(text).map_err(json_error)?], false)
    } else {
        return Err(ApiError::bad_request(
            "expected a message (a JSON object), an array of messages, or {\"messages\": [...]}",
        ));
    };
    if raws.is_empty() {
        return Err(ApiError::bad_request("the batch holds no message"));
    }
    if raws.len() > MAX_BATCH {
        return Err(ApiError::bad_request(format!(
            "a batch holds at most {MAX_BATCH} messages, got {}",
            raws.len()
        )));
    }
    raws.iter()
        .enumerate()
        .map(|(i, raw)| {
            parse_one(raw.get(), session).map_err(|message| {
                let message = if batch {
                    format!("messages[{i}]: {message}")
                } else {
                    message
                };
                ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "invalid_message",
                    message,
                )
            })
        })
        .collect()
}

/// Whether a top-level object is a batch (`{"messages": [...]}`) rather than one message.
fn is_batch_object(text: &str) -> Result<bool, ApiError> {
    #[derive(Deserialize)]
    struct HasMessages {
        #[serde(default)]
        messages: Option<serde::de::IgnoredAny>,
    }
    let probe: HasMessages = serde_json::from_str(text).map_err(json_error)?;
    Ok(probe.messages.is_some())
}

fn parse_one(text: &str, session: &SessionInfo) -> Result<NewMessage, String> {
    let message = parse_live_message(text, &session.key)?;
    let probe: Probe = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(given) = probe.session.filter(|v| !v.is_null()) {
        let named = given.as_str().unwrap_or_default();
        if named != session.key && named != session.id.to_string() {
            return Err(format!(
                "`session` is {given} but the URL names session {} (key `{}`): leave `session` out or give that one",
                session.id, session.key
            ));
        }
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::ids::SessionId;
    use lcm_core::message::{Part, Role};
    use lcm_core::time::Timestamp;

    fn session() -> SessionInfo {
        SessionInfo {
            id: SessionId(3),
            key: "chat-1".into(),
            created_at: Timestamp(0),
            parent: None,
            message_count: 0,
            token_total: 0,
            first_message_at: None,
            last_message_at: None,
        }
    }

    #[test]
    fn single_array_and_object_batches() {
        let one =
            parse_messages(br#"{"role":"user","content":"hi","key":"k1"}"#, &session()).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].role, Role::User);
        assert_eq!(one[0].source_key.as_deref(), Some("k1"));
        assert!(one[0].created_at.millis() > 0);
        let original = one[0].original.as_ref().unwrap();
        assert_eq!(
            original.bytes,
            br#"{"role":"user","content":"hi","key":"k1"}"#
        );

        let array = parse_messages(
            br#"[{"role":"user","content":"a"}, {"role":"assistant","parts":[{"type":"text","text":"b"}],"created_at":5}]"#,
            &session(),
        )
        .unwrap();
        assert_eq!(array.len(), 2);
        assert_eq!(array[0].source_key, None);
        assert_eq!(array[1].created_at, Timestamp(5));
        assert_eq!(array[1].parts, vec![Part::Text { text: "b".into() }]);

        let object = parse_messages(
            br#"{"messages":[{"role":"user","content":"a","session":"chat-1"},{"role":"tool","content":"b","session":"ses_3"}]}"#,
            &session(),
        )
        .unwrap();
        assert_eq!(object.len(), 2);
    }

    #[test]
    fn bad_bodies_say_what_is_wrong() {
        let cases: [(&[u8], &str); 8] = [
            (b"", "empty"),
            (b"{\"role\":", "not valid JSON"),
            (b"42", "expected a message"),
            (b"[]", "no message"),
            (br#"{"messages":[],"x":1}"#, "nothing else"),
            (br#"{"role":"robot","content":"x"}"#, "`role` is invalid"),
            (
                br#"[{"role":"user","content":"x"},{"role":"user"}]"#,
                "messages[1]: an lcm message needs `parts`",
            ),
            (
                br#"{"role":"user","content":"x","session":"other"}"#,
                "the URL names session ses_3",
            ),
        ];
        for (body, expected) in cases {
            let err = parse_messages(body, &session()).unwrap_err();
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(
                err.message.contains(expected),
                "{}: {}",
                String::from_utf8_lossy(body),
                err.message
            );
        }
    }
}
