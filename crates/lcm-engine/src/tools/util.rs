//! Helpers shared by the built-in tools.

use std::collections::HashMap;

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::Part;
use lcm_core::summary::{NodeRef, Summary};
use lcm_core::time::Timestamp;
use lcm_core::tokens::TokenCounter;
use lcm_store::{Store, StoreError, StoreReader};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ToolError;

/// Runs blocking store work off the async task.
pub(crate) async fn blocking<T, F>(tool: &'static str, work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(e) => Err(ToolError::failed(
            tool,
            format!("the tool's task ended: {e}"),
        )),
    }
}

/// Deserialises validated arguments into the tool's typed form.
pub(crate) fn parse_args<T: DeserializeOwned>(tool: &str, args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args)
        .map_err(|e| ToolError::invalid_argument(tool, format!("at the arguments object: {e}")))
}

/// Parses an id argument, with the pointer of the argument in the error.
pub(crate) fn parse_id<T>(tool: &str, pointer: &str, text: &str) -> Result<T, ToolError>
where
    T: std::str::FromStr<Err = lcm_core::ids::IdError>,
{
    text.trim()
        .parse()
        .map_err(|e| ToolError::invalid_argument(tool, format!("at {pointer}: {e}")))
}

/// Parses a time argument (RFC 3339 or YYYY-MM-DD).
pub(crate) fn parse_time(tool: &str, pointer: &str, text: &str) -> Result<Timestamp, ToolError> {
    Timestamp::parse(text)
        .map_err(|e| ToolError::invalid_argument(tool, format!("at {pointer}: {e}")))
}

/// A closure mapping store errors to tool errors for `tool`.
pub(crate) fn store_err(tool: &'static str) -> impl Fn(StoreError) -> ToolError {
    move |e| ToolError::from_store(tool, e)
}

/// The text of a message's parts, every part in full, as the tools show it.
pub(crate) fn render_parts(parts: &[Part]) -> String {
    let mut out = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match part {
            Part::Text { text } => out.push_str(text),
            Part::Reasoning { text } => {
                out.push_str("[reasoning]\n");
                out.push_str(text);
            }
            Part::ToolCall {
                id,
                name,
                arguments,
            } => {
                out.push_str(&format!("[tool call {id}: {name}] {arguments}"));
            }
            Part::ToolResult {
                call_id,
                content,
                is_error,
            } => {
                out.push_str(&format!(
                    "[tool result for {call_id}{}]\n",
                    if *is_error { " (error)" } else { "" }
                ));
                out.push_str(content);
            }
            Part::File { path, mime_type } => match mime_type {
                Some(mime) => out.push_str(&format!("[file {path} ({mime})]")),
                None => out.push_str(&format!("[file {path}]")),
            },
            Part::Binary {
                media_type,
                byte_len,
            } => out.push_str(&format!(
                "[binary {media_type}, {byte_len} bytes; the bytes are kept in the message's original]"
            )),
            Part::Opaque { kind, json } => out.push_str(&format!("[{kind}] {json}")),
        }
    }
    out
}

/// A short description of a part (its type and what it names, not its content).
pub(crate) fn part_summary(part: &Part) -> Value {
    match part {
        Part::Text { text } => serde_json::json!({"type": "text", "chars": text.chars().count()}),
        Part::Reasoning { text } => {
            serde_json::json!({"type": "reasoning", "chars": text.chars().count()})
        }
        Part::ToolCall { id, name, .. } => {
            serde_json::json!({"type": "tool_call", "id": id, "name": name})
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => serde_json::json!({
            "type": "tool_result", "call_id": call_id, "is_error": is_error,
            "chars": content.chars().count(),
        }),
        Part::File { path, mime_type } => {
            serde_json::json!({"type": "file", "path": path, "mime_type": mime_type})
        }
        Part::Binary {
            media_type,
            byte_len,
        } => serde_json::json!({"type": "binary", "media_type": media_type, "bytes": byte_len}),
        Part::Opaque { kind, .. } => serde_json::json!({"type": "opaque", "kind": kind}),
    }
}

/// The largest byte length `n <= text.len()` (on a char boundary) such that `text[..n]` counts at
/// most `tokens` tokens. Prefers to end at a line break (or a space) in the last tenth.
pub(crate) fn prefix_within_tokens(counter: TokenCounter, text: &str, tokens: usize) -> usize {
    if counter.count_text(text) <= tokens {
        return text.len();
    }
    let fits = |n: usize| counter.count_text(&text[..n]) <= tokens;
    // Grow an upper bound from an estimate, then bisect between the last fit and it.
    let mut lo = 0usize;
    let mut hi = text.floor_char_boundary((tokens.max(1) * 4).min(text.len()));
    while hi < text.len() && fits(hi) {
        lo = hi;
        hi = text.floor_char_boundary((hi * 2).min(text.len()));
        if hi <= lo {
            hi = text.len();
        }
    }
    // Invariant: fits(lo), !fits(hi) (or hi == text.len(), which does not fit).
    while hi - lo > 1 {
        let mid = text.floor_char_boundary(lo + (hi - lo) / 2);
        if mid <= lo {
            break;
        }
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let tail_start = lo - lo / 10;
    if let Some(nl) = text[tail_start..lo].rfind('\n') {
        return tail_start + nl + 1;
    }
    if let Some(sp) = text[tail_start..lo].rfind(' ') {
        return tail_start + sp + 1;
    }
    lo
}

/// Tokens of a JSON value as sent to a model (compact serialisation).
pub(crate) fn json_tokens(counter: TokenCounter, value: &Value) -> usize {
    counter.count_text(&value.to_string())
}

/// FNV-1a over the given pieces (stable across runs): binds cursors to their request.
pub(crate) fn fingerprint(pieces: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for piece in pieces {
        for b in piece.bytes().chain(std::iter::once(0xff)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// Where a node stands in its session's current context.
#[derive(Debug, Clone)]
pub(crate) enum Region {
    /// Covered, through zero or more summaries, by this summary of the context.
    Summary(Box<Summary>),
    /// Not covered by any summary: still verbatim in the context.
    RawTail(SessionId),
}

/// Finds, for messages and summaries, the summary of the current context that stands for them
/// (walking `covered_by` upward), with memoisation across calls.
pub(crate) struct RegionFinder<'r> {
    reader: &'r StoreReader,
    /// Summary -> the context summary above it (itself when it is in the context).
    top_of: HashMap<SummaryId, SummaryId>,
    summaries: HashMap<SummaryId, Summary>,
}

impl<'r> RegionFinder<'r> {
    pub(crate) fn new(reader: &'r StoreReader) -> Self {
        RegionFinder {
            reader,
            top_of: HashMap::new(),
            summaries: HashMap::new(),
        }
    }

    /// The file records a message references, if any.
    pub(crate) fn message_files(
        &self,
        id: MessageId,
    ) -> Result<Option<lcm_core::files::MessageFiles>, StoreError> {
        self.reader.message_files(id)
    }

    /// The summary directly covering `node`, if any.
    pub(crate) fn covering(&self, node: NodeRef) -> Result<Option<SummaryId>, StoreError> {
        self.reader.covering(node)
    }

    /// One summary (cached).
    pub(crate) fn summary(&mut self, id: SummaryId) -> Result<&Summary, StoreError> {
        if !self.summaries.contains_key(&id) {
            let s = self.reader.summary(id)?;
            self.summaries.insert(id, s);
        }
        self.summaries
            .get(&id)
            .ok_or(StoreError::SummaryNotFound(id))
    }

    /// The region of a message of `session`.
    pub(crate) fn region_of_message(
        &mut self,
        id: MessageId,
        session: SessionId,
    ) -> Result<Region, StoreError> {
        match self.covering(NodeRef::Message(id))? {
            None => Ok(Region::RawTail(session)),
            Some(parent) => self.region_of_summary(parent),
        }
    }

    /// The region of a summary: the context summary at the top of its `covered_by` chain.
    pub(crate) fn region_of_summary(&mut self, id: SummaryId) -> Result<Region, StoreError> {
        let top = self.top_of(id)?;
        Ok(Region::Summary(Box::new(self.summary(top)?.clone())))
    }

    fn top_of(&mut self, id: SummaryId) -> Result<SummaryId, StoreError> {
        let mut chain = vec![id];
        let mut current = id;
        let top = loop {
            if let Some(top) = self.top_of.get(&current) {
                break *top;
            }
            match self.reader.covering(NodeRef::Summary(current))? {
                None => break current,
                Some(parent) => {
                    if chain.len() > 10_000 {
                        return Err(StoreError::Corrupt {
                            table: "covered_by",
                            detail: format!("a cycle above {id}"),
                        });
                    }
                    chain.push(parent);
                    current = parent;
                }
            }
        };
        for s in chain {
            self.top_of.insert(s, top);
        }
        Ok(top)
    }
}

/// Resolves a session argument: `ses_N` or a session key.
pub(crate) fn resolve_session(
    tool: &'static str,
    store: &Store,
    given: &str,
) -> Result<SessionId, ToolError> {
    let given = given.trim();
    if let Ok(id) = given.parse::<SessionId>() {
        store.session(id).map_err(store_err(tool))?;
        return Ok(id);
    }
    store
        .session_id_for_key(given)
        .map_err(store_err(tool))?
        .ok_or_else(|| ToolError::NotFound {
            tool: tool.to_owned(),
            id: given.to_owned(),
            message: format!(
                "no session `{given}`: give `current`, `all`, a session id (ses_N) or a session key"
            ),
        })
}

/// The root of `session`'s parent chain (the conversation a sub-agent session belongs to).
pub(crate) fn root_session(store: &Store, session: SessionId) -> Result<SessionId, StoreError> {
    let mut current = session;
    for _ in 0..1_000 {
        match store.session(current)?.parent {
            Some(parent) => current = parent,
            None => return Ok(current),
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;

    #[test]
    fn prefixes_fit_their_token_budget() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let text = "alpha beta gamma delta ".repeat(500) + "é日本語 ".repeat(300).as_str();
        for budget in [1usize, 7, 50, 333, 2_000] {
            let n = prefix_within_tokens(counter, &text, budget);
            assert!(text.is_char_boundary(n));
            assert!(counter.count_text(&text[..n]) <= budget, "{budget}");
            assert!(n > 0 || budget < 2, "{budget}");
            // Close to the budget (within the line/space snapping slack).
            if budget >= 50 {
                assert!(
                    counter.count_text(&text[..n]) * 10 >= budget * 8,
                    "{budget}"
                );
            }
        }
        assert_eq!(prefix_within_tokens(counter, "short", 10), 5);
    }
}
