//! Entry points for the fuzz harness (feature `fuzzing`; only the workspace's test targets
//! enable it): the parsers of outside text that are private to this crate.

use crate::grep::Cursor;

/// Decodes a grep cursor (`next_cursor` of a page, given back by a client) as [`crate::grep`]
/// does for a search whose fingerprint is `fingerprint`. `Ok` holds the cursor encoded again
/// (its canonical form); `Err` the message the caller would get.
pub fn grep_cursor(text: &str, fingerprint: u64) -> Result<String, String> {
    Cursor::decode(text, fingerprint)
        .map(|cursor| cursor.encode(fingerprint))
        .map_err(|e| e.to_string())
}

/// The cursors grep issues for `fingerprint`: after message `number`, and at ranked offset
/// `number` (seeds for the fuzzer).
pub fn issued_grep_cursors(number: u64, fingerprint: u64) -> [String; 2] {
    [
        Cursor::After(lcm_core::ids::MessageId(number)).encode(fingerprint),
        Cursor::Ranked(usize::try_from(number).unwrap_or(usize::MAX)).encode(fingerprint),
    ]
}
