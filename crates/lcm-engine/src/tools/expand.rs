//! `lcm_expand`: the real content under a summary (paper appendix C.1), for sub-agents only.
//!
//! The subtree is walked depth first, sources in order: each child summary's text (down to
//! `max_depth` levels below the expanded node), and at the bottom the source messages verbatim
//! (every part in full). A page holds at most `token_cap` tokens of content, counted with the
//! stored token counts. Items are not split, except one larger than a whole page: it is cut
//! into pieces that say which bytes of its content they hold. The cursor names the next node
//! (and byte offset) to show, so pages continue exactly where the previous one stopped.

use async_trait::async_trait;
use lcm_core::ids::{AnyId, SummaryId};
use lcm_core::message::Message;
use lcm_core::summary::{NodeRef, Summary};
use lcm_store::StoreReader;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Caller, Tool, ToolContext, ToolDefinition};
use super::util::{
    blocking, fingerprint, parse_args, parse_id, prefix_within_tokens, render_parts, store_err,
};

const NAME: &str = "lcm_expand";

/// Content tokens of one page when the call gives no `token_cap`.
pub const DEFAULT_EXPAND_TOKEN_CAP: usize = 8_000;
/// Smallest and largest `token_cap` a call may ask for.
pub const EXPAND_TOKEN_CAP_RANGE: (usize, usize) = (100, 100_000);
/// Nodes one call may expand.
const MAX_IDS: usize = 50;
/// Tokens charged for a piece of a split item besides its text.
const PIECE_OVERHEAD: usize = 8;

/// The `lcm_expand` tool. Only sub-agents may call it (and only they are offered it): the main
/// agent delegates expansion (`lcm_expand_query`) so that its own context stays bounded.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmExpand;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    summary_id: Option<String>,
    ids: Option<Vec<String>>,
    max_depth: Option<u32>,
    token_cap: Option<usize>,
    cursor: Option<String>,
}

#[async_trait]
impl Tool for LcmExpand {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            NAME,
            "Expand summaries into the content they replaced: each child summary's text down to \
             max_depth levels, and at the bottom the original messages verbatim, oldest first, \
             up to token_cap tokens per call. If the output stops before the end, pass \
             `next_cursor` back as `cursor` (with the same summary_id/ids and max_depth) to \
             continue. Only available to sub-agents.",
            json!({
                "type": "object",
                "properties": {
                    "summary_id": {
                        "type": "string", "pattern": "^sum_[0-9]+$",
                        "description": "The summary to expand. Give this or `ids`."
                    },
                    "ids": {
                        "type": "array", "minItems": 1, "maxItems": MAX_IDS,
                        "items": {"type": "string", "pattern": "^(sum|msg)_[0-9]+$"},
                        "description": "Several summaries (or messages) to expand, in this order. Give this or `summary_id`."
                    },
                    "max_depth": {
                        "type": "integer", "minimum": 1,
                        "description": "Levels below each expanded summary to descend (default: all the way down to the messages). Summaries at the last level are shown but not expanded."
                    },
                    "token_cap": {
                        "type": "integer", "minimum": EXPAND_TOKEN_CAP_RANGE.0, "maximum": EXPAND_TOKEN_CAP_RANGE.1,
                        "description": "Most tokens of content on this page (default 8000)."
                    },
                    "cursor": {
                        "type": "string",
                        "description": "`next_cursor` of the previous page of the same expansion."
                    }
                },
                "additionalProperties": false
            }),
        )
    }

    fn offered_to(&self, caller: &Caller) -> bool {
        caller.is_sub_agent
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        if !ctx.caller.is_sub_agent {
            return Err(ToolError::NotPermitted {
                tool: NAME.into(),
                reason: "expansion can return very large amounts of text, so only sub-agents may \
                         call lcm_expand. Use lcm_expand_query (with the summary ids and your \
                         question) to have a sub-agent expand them and answer, or lcm_describe \
                         / lcm_grep to inspect them without expanding."
                    .into(),
            });
        }
        let args: Args = parse_args(NAME, args)?;
        let ctx = ctx.clone();
        blocking(NAME, move || run(&ctx, args)).await
    }
}

/// Where a page starts: the root's index, the node to show next, and the byte offset in its
/// content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Resume {
    root: usize,
    node: NodeRef,
    offset: usize,
}

impl Resume {
    pub(super) fn encode(&self, fingerprint: u64) -> String {
        format!(
            "le1.{fingerprint:016x}.{}.{}.{}",
            self.root, self.node, self.offset
        )
    }

    pub(super) fn decode(text: &str, fingerprint: u64) -> Result<Resume, ToolError> {
        let bad = |why: &str| ToolError::InvalidRequest {
            tool: NAME.into(),
            message: format!(
                "invalid cursor `{text}`: {why}; pass `next_cursor` from the previous page with the same summary_id/ids and max_depth, or omit `cursor` to start over"
            ),
        };
        let pieces: Vec<&str> = text.trim().split('.').collect();
        let [tag, print, root, node, offset] = pieces.as_slice() else {
            return Err(bad("not a cursor lcm_expand issued"));
        };
        if *tag != "le1" {
            return Err(bad("not a cursor lcm_expand issued"));
        }
        if u64::from_str_radix(print, 16).ok() != Some(fingerprint) {
            return Err(bad("it belongs to a different expansion"));
        }
        let node = match node.parse::<AnyId>() {
            Ok(AnyId::Summary(id)) => NodeRef::Summary(id),
            Ok(AnyId::Message(id)) => NodeRef::Message(id),
            _ => return Err(bad("malformed")),
        };
        Ok(Resume {
            root: root.parse().map_err(|_| bad("malformed"))?,
            node,
            offset: offset.parse().map_err(|_| bad("malformed"))?,
        })
    }
}

/// One page being filled.
struct Page {
    cap: usize,
    used: usize,
    items: Vec<Value>,
    counter: lcm_core::tokens::TokenCounter,
}

enum Step {
    /// Keep walking.
    Next,
    /// The page is full: the next page starts here.
    Stop(NodeRef, usize),
}

impl Page {
    /// Adds an item whose content is `content[offset..]` (all of it, or the piece that fits),
    /// charging `stored` tokens for a whole item.
    fn offer(
        &mut self,
        node: NodeRef,
        mut item: Value,
        content: &str,
        offset: usize,
        stored: usize,
    ) -> Step {
        let offset = content.floor_char_boundary(offset);
        let rest = &content[offset..];
        let whole = if offset == 0 {
            stored
        } else {
            self.counter.count_text(rest) + PIECE_OVERHEAD
        };
        if self.used + whole <= self.cap {
            if offset > 0 {
                item["part"] = json!({"from_byte": offset, "to_byte": content.len(), "of_bytes": content.len()});
            }
            item["content"] = json!(rest);
            self.used += whole;
            self.items.push(item);
            return Step::Next;
        }
        let left = self.cap - self.used;
        // An item that fits a page of its own starts the next page whole. A larger one is split:
        // from here if the page is empty (progress) or has room for a real piece.
        if !self.items.is_empty() && (whole <= self.cap || left < self.cap / 4) {
            return Step::Stop(node, offset);
        }
        let mut n = prefix_within_tokens(self.counter, rest, left.saturating_sub(PIECE_OVERHEAD));
        if n == 0 {
            if !self.items.is_empty() {
                return Step::Stop(node, offset);
            }
            // Always progress: at least one character.
            n = rest.chars().next().map_or(0, char::len_utf8);
        }
        let piece = &rest[..n];
        item["part"] =
            json!({"from_byte": offset, "to_byte": offset + n, "of_bytes": content.len()});
        item["content"] = json!(piece);
        self.used += (self.counter.count_text(piece) + PIECE_OVERHEAD).min(left);
        self.items.push(item);
        if offset + n < content.len() {
            Step::Stop(node, offset + n)
        } else {
            Step::Next
        }
    }
}

fn run(ctx: &ToolContext, args: Args) -> Result<Value, ToolError> {
    let roots = roots_of(&args)?;
    let max_depth = args.max_depth.unwrap_or(u32::MAX).max(1);
    let cap = args
        .token_cap
        .unwrap_or(DEFAULT_EXPAND_TOKEN_CAP)
        .clamp(EXPAND_TOKEN_CAP_RANGE.0, EXPAND_TOKEN_CAP_RANGE.1);
    let root_text: Vec<String> = roots.iter().map(NodeRef::to_string).collect();
    let depth_text = max_depth.to_string();
    let mut pieces: Vec<&str> = root_text.iter().map(String::as_str).collect();
    pieces.push(&depth_text);
    let print = fingerprint(&pieces);
    let resume = args
        .cursor
        .as_deref()
        .map(|c| Resume::decode(c, print))
        .transpose()?;
    if let Some(r) = &resume
        && r.root >= roots.len()
    {
        return Err(ToolError::InvalidRequest {
            tool: NAME.into(),
            message: "invalid cursor: it points past the expanded ids".into(),
        });
    }
    let reader = ctx.store.reader().map_err(store_err(NAME))?;
    let mut roots_json = Vec::with_capacity(roots.len());
    for root in &roots {
        roots_json.push(match root {
            NodeRef::Summary(id) => {
                let s = reader.summary(*id).map_err(store_err(NAME))?;
                json!({
                    "id": s.id, "kind": s.kind.as_str(), "depth": s.depth, "session": s.session,
                    "messages": s.descendant_messages, "message_tokens": s.descendant_tokens,
                    "from": s.earliest_at, "to": s.latest_at,
                })
            }
            NodeRef::Message(id) => {
                let m = reader.message(*id).map_err(store_err(NAME))?;
                json!({"id": m.id, "kind": "message", "session": m.session, "tokens": m.token_count})
            }
        });
    }
    let mut page = Page {
        cap,
        used: 0,
        items: Vec::new(),
        counter: ctx.store.counter(),
    };
    let first_root = resume.as_ref().map_or(0, |r| r.root);
    let mut next = None;
    for (i, root) in roots.iter().enumerate().skip(first_root) {
        let target = resume
            .as_ref()
            .filter(|r| r.root == i)
            .map(|r| (r.node, r.offset));
        if let Some((node, offset)) = walk(&reader, *root, max_depth, target, &mut page)? {
            next = Some(Resume {
                root: i,
                node,
                offset,
            });
            break;
        }
    }
    let mut out = json!({
        "roots": roots_json,
        "items": page.items,
        "tokens": page.used,
        "token_cap": cap,
        "complete": next.is_none(),
        "next_cursor": next.as_ref().map(|r| r.encode(print)),
    });
    if next.is_some() {
        out["note"] = json!(
            "stopped at token_cap; pass next_cursor as cursor (same summary_id/ids and max_depth) to continue"
        );
    }
    Ok(out)
}

fn roots_of(args: &Args) -> Result<Vec<NodeRef>, ToolError> {
    match (&args.summary_id, &args.ids) {
        (Some(_), Some(_)) => Err(ToolError::invalid_argument(
            NAME,
            "at the arguments object: give `summary_id` or `ids`, not both",
        )),
        (None, None) => Err(ToolError::invalid_argument(
            NAME,
            "at the arguments object: give `summary_id` (one summary) or `ids` (a list)",
        )),
        (Some(id), None) => Ok(vec![NodeRef::Summary(parse_id::<SummaryId>(
            NAME,
            "/summary_id",
            id,
        )?)]),
        (None, Some(ids)) => {
            if ids.is_empty() || ids.len() > MAX_IDS {
                return Err(ToolError::invalid_argument(
                    NAME,
                    format!("at /ids: give 1 to {MAX_IDS} ids"),
                ));
            }
            ids.iter()
                .enumerate()
                .map(|(i, text)| match text.trim().parse::<AnyId>() {
                    Ok(AnyId::Summary(id)) => Ok(NodeRef::Summary(id)),
                    Ok(AnyId::Message(id)) => Ok(NodeRef::Message(id)),
                    Ok(other) => Err(ToolError::invalid_argument(
                        NAME,
                        format!("at /ids/{i}: {other} is not a summary (sum_N) or message (msg_N)"),
                    )),
                    Err(e) => Err(ToolError::invalid_argument(
                        NAME,
                        format!("at /ids/{i}: {e}"),
                    )),
                })
                .collect()
        }
    }
}

fn summary_item(s: &Summary, level: u32, expanded: bool) -> Value {
    let mut item = json!({
        "type": "summary", "id": s.id, "kind": s.kind.as_str(), "depth": s.depth,
        "level": level, "from": s.earliest_at, "to": s.latest_at, "tokens": s.token_count,
    });
    if !expanded {
        item["expanded"] = json!(false);
        item["note"] = json!(format!(
            "max_depth reached: expand {} to see what it covers",
            s.id
        ));
    }
    item
}

fn message_item(m: &Message, level: u32) -> Value {
    json!({
        "type": "message", "id": m.id, "session": m.session, "seq": m.seq, "role": m.role,
        "at": m.created_at, "level": level, "tokens": m.token_count,
    })
}

/// Walks one root's subtree into `page`, from `target` when resuming; the position to resume
/// at when the page filled up.
fn walk(
    reader: &StoreReader,
    root: NodeRef,
    max_depth: u32,
    target: Option<(NodeRef, usize)>,
    page: &mut Page,
) -> Result<Option<(NodeRef, usize)>, ToolError> {
    let invalid_cursor = || ToolError::InvalidRequest {
        tool: NAME.into(),
        message:
            "invalid cursor: it does not point inside this expansion; omit `cursor` to start over"
                .into(),
    };
    let mut stack: Vec<(NodeRef, u32)> = match root {
        NodeRef::Message(_) => vec![(root, 0)],
        NodeRef::Summary(id) => {
            let s = reader.summary(id).map_err(store_err(NAME))?;
            s.sources.iter().rev().map(|n| (*n, 1)).collect()
        }
    };
    // When resuming: the target node and the session sequence number it starts at.
    let mut pending = match target {
        None => None,
        Some((node, offset)) => {
            let seq = match node {
                NodeRef::Message(id) => reader.message(id).map_err(store_err(NAME))?.seq,
                NodeRef::Summary(id) => reader.summary(id).map_err(store_err(NAME))?.first_seq,
            };
            Some((node, offset, seq))
        }
    };
    while let Some((node, level)) = stack.pop() {
        let mut offset = 0;
        match node {
            NodeRef::Summary(id) => {
                let s = reader.summary(id).map_err(store_err(NAME))?;
                if let Some((target, target_offset, seq)) = pending {
                    if node == target {
                        pending = None;
                        offset = target_offset;
                    } else if s.last_seq < seq {
                        continue; // Shown on an earlier page.
                    } else if s.first_seq <= seq && level < max_depth {
                        // An ancestor of the target, shown on an earlier page: go down.
                        stack.extend(s.sources.iter().rev().map(|n| (*n, level + 1)));
                        continue;
                    } else {
                        return Err(invalid_cursor());
                    }
                }
                let expanded = level < max_depth;
                let item = summary_item(&s, level, expanded);
                if let Step::Stop(node, offset) =
                    page.offer(node, item, &s.content, offset, s.token_count as usize)
                {
                    return Ok(Some((node, offset)));
                }
                if expanded {
                    stack.extend(s.sources.iter().rev().map(|n| (*n, level + 1)));
                }
            }
            NodeRef::Message(id) => {
                let m = reader.message(id).map_err(store_err(NAME))?;
                if let Some((target, target_offset, seq)) = pending {
                    if node == target {
                        pending = None;
                        offset = target_offset;
                    } else if m.seq < seq {
                        continue;
                    } else {
                        return Err(invalid_cursor());
                    }
                }
                let content = render_parts(&m.parts);
                let item = message_item(&m, level);
                if let Step::Stop(node, offset) =
                    page.offer(node, item, &content, offset, m.token_count as usize)
                {
                    return Ok(Some((node, offset)));
                }
            }
        }
    }
    if pending.is_some() {
        return Err(invalid_cursor());
    }
    Ok(None)
}
