//! Entry points for the fuzz harness (feature `fuzzing`; only the workspace's test targets
//! enable it): the tools' cursors, which a model gives back as text.

use super::expand::Resume;
use super::grep_tool::Pos;

/// Decodes an `lcm_grep` cursor as the tool does for a search whose fingerprint is
/// `fingerprint`. `Ok` holds the cursor encoded again (its canonical form); `Err` the message
/// the model would get.
pub fn grep_tool_cursor(text: &str, fingerprint: u64) -> Result<String, String> {
    Pos::decode(text, fingerprint)
        .map(|pos| pos.encode(fingerprint))
        .map_err(|e| e.to_string())
}

/// Decodes an `lcm_expand` cursor as the tool does for an expansion whose fingerprint is
/// `fingerprint`. `Ok` holds the cursor encoded again; `Err` the message the model would get.
pub fn expand_cursor(text: &str, fingerprint: u64) -> Result<String, String> {
    Resume::decode(text, fingerprint)
        .map(|resume| resume.encode(fingerprint))
        .map_err(|e| e.to_string())
}
