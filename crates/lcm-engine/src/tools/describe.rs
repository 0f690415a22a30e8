//! `lcm_describe`: what an id stands for, without expanding it (paper appendix C.1).

use crate::assembly::assemble;
use crate::commitments::{CommitmentStatus, session_commitments};
use async_trait::async_trait;
use lcm_core::ids::{AnyId, MessageId, SessionId, SummaryId};
use lcm_core::summary::{ContextMark, NodeRef};
use lcm_store::StoreReader;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ToolError;
use super::registry::{Tool, ToolContext, ToolDefinition};
use super::util::{
    Region, RegionFinder, blocking, parse_args, part_summary, prefix_within_tokens, render_parts,
    store_err,
};

const NAME: &str = "lcm_describe";

/// Tokens of a message's content shown when the call gives no `max_tokens`.
pub const DEFAULT_DESCRIBE_MAX_TOKENS: usize = 4_000;
/// Subtree nodes listed in a summary's manifest when the call gives no `manifest_limit`.
pub const DEFAULT_MANIFEST_LIMIT: usize = 100;
/// Largest `manifest_limit`.
pub const MAX_MANIFEST_LIMIT: usize = 500;
/// Sources listed one by one; longer lists are given as first..last and a count.
const LISTED_SOURCES: usize = 40;

/// The `lcm_describe` tool. Available to the main agent and to sub-agents.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmDescribe;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    id: String,
    max_tokens: Option<usize>,
    manifest_limit: Option<usize>,
}

#[async_trait]
impl Tool for LcmDescribe {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            NAME,
            "Describe an lcm id without expanding it. For a summary (sum_N): kind, depth, \
             token count, time range, compression ratio, sources, the summary covering it, its \
             full text and a manifest of its subtree (ids, kinds, depths, tokens, times). For a \
             message (msg_N): role, time, parts, token count, its file records, the summary \
             covering it, its content (bounded by max_tokens) and the sessions pinning it. \
             For a file (file_N): path, \
             kind, sizes, hash, exploration summary, the messages referencing it and whether \
             the file on disk is still what was seen. For a session (ses_N): its totals, current \
             context, and its commitments (intents, requests, to-dos that summaries carried, \
             and those open in the raw tail) with their status: open, fulfilled or dropped, \
             and the message that resolved each.",
            json!({
                "type": "object",
                "properties": {
                    "id": {
                        "type": "string", "minLength": 1, "maxLength": 64,
                        "description": "A summary (sum_N), message (msg_N), session (ses_N) or file (file_N) id."
                    },
                    "max_tokens": {
                        "type": "integer", "minimum": 100, "maximum": 32000,
                        "description": "Most tokens of a message's content to show (default 4000)."
                    },
                    "manifest_limit": {
                        "type": "integer", "minimum": 0, "maximum": MAX_MANIFEST_LIMIT,
                        "description": "Most subtree nodes listed for a summary (default 100)."
                    }
                },
                "required": ["id"],
                "additionalProperties": false
            }),
        )
    }

    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError> {
        let args: Args = parse_args(NAME, args)?;
        let ctx = ctx.clone();
        blocking(NAME, move || run(&ctx, args)).await
    }
}

fn run(ctx: &ToolContext, args: Args) -> Result<Value, ToolError> {
    let id: AnyId = args
        .id
        .trim()
        .parse()
        .map_err(|e| ToolError::invalid_argument(NAME, format!("at /id: {e}")))?;
    let reader = ctx.store.reader().map_err(store_err(NAME))?;
    match id {
        AnyId::Summary(id) => describe_summary(
            &reader,
            id,
            args.manifest_limit
                .unwrap_or(DEFAULT_MANIFEST_LIMIT)
                .min(MAX_MANIFEST_LIMIT),
        ),
        AnyId::Message(id) => describe_message(
            ctx,
            &reader,
            id,
            args.max_tokens.unwrap_or(DEFAULT_DESCRIBE_MAX_TOKENS),
        ),
        AnyId::Session(id) => describe_session(ctx, &reader, id),
        AnyId::File(id) => super::file_records::describe_file(&ctx.store, &reader, id, NAME),
        AnyId::Job(id) => Err(ToolError::Unsupported {
            tool: NAME.into(),
            message: format!(
                "{id} is an operator job; lcm_describe describes summaries (sum_N), messages (msg_N), files (file_N) and sessions (ses_N)"
            ),
        }),
    }
}

fn region_json(region: &Region) -> Value {
    match region {
        Region::Summary(s) => json!(s.id),
        Region::RawTail(_) => json!("raw_tail"),
    }
}

fn sources_json(sources: &[NodeRef]) -> Value {
    if sources.len() <= LISTED_SOURCES {
        return json!(sources.iter().map(NodeRef::to_string).collect::<Vec<_>>());
    }
    json!({
        "first": sources.first().map(NodeRef::to_string),
        "last": sources.last().map(NodeRef::to_string),
        "count": sources.len(),
    })
}

fn describe_summary(
    reader: &StoreReader,
    id: SummaryId,
    manifest_limit: usize,
) -> Result<Value, ToolError> {
    let s = reader.summary(id).map_err(store_err(NAME))?;
    let mut regions = RegionFinder::new(reader);
    let covered_by = regions
        .covering(NodeRef::Summary(id))
        .map_err(store_err(NAME))?;
    let region = regions.region_of_summary(id).map_err(store_err(NAME))?;
    let context = reader.context(s.session).map_err(store_err(NAME))?;
    let in_context = context.summaries.contains(&id);

    // The subtree, depth first, sources in order: every summary is visited (to count them);
    // nodes are listed up to the limit.
    let mut nodes = Vec::new();
    let mut summaries_below = 0u64;
    let mut stack: Vec<(NodeRef, SummaryId, u32)> =
        s.sources.iter().rev().map(|n| (*n, id, 1)).collect();
    while let Some((node, parent, level)) = stack.pop() {
        match node {
            NodeRef::Summary(child) => {
                summaries_below += 1;
                let c = reader.summary(child).map_err(store_err(NAME))?;
                if nodes.len() < manifest_limit {
                    nodes.push(json!({
                        "id": c.id, "kind": c.kind.as_str(), "depth": c.depth, "level": level,
                        "parent": parent, "tokens": c.token_count,
                        "from": c.earliest_at, "to": c.latest_at,
                        "messages": c.descendant_messages,
                    }));
                }
                stack.extend(c.sources.iter().rev().map(|n| (*n, child, level + 1)));
            }
            NodeRef::Message(m) => {
                if nodes.len() < manifest_limit {
                    let m = reader.message(m).map_err(store_err(NAME))?;
                    nodes.push(json!({
                        "id": m.id, "kind": "message", "role": m.role, "level": level,
                        "parent": parent, "tokens": m.token_count, "at": m.created_at,
                    }));
                }
            }
        }
    }
    let total = summaries_below + s.descendant_messages;
    let shown = nodes.len() as u64;
    let mut manifest = json!({ "nodes": nodes, "shown": shown, "total": total });
    if shown < total {
        manifest["note"] = json!(format!(
            "the first {shown} of {total} nodes (depth first); describe a child summary for its own manifest"
        ));
    }
    let ratio = s.descendant_tokens as f64 / f64::from(s.token_count.max(1));
    let mut out = json!({
        "id": s.id,
        "type": "summary",
        "session": s.session,
        "kind": s.kind.as_str(),
        "depth": s.depth,
        "token_count": s.token_count,
        "from": s.earliest_at,
        "to": s.latest_at,
        "covers": {
            "first_seq": s.first_seq,
            "last_seq": s.last_seq,
            "messages": s.descendant_messages,
            "message_tokens": s.descendant_tokens,
            "summaries": summaries_below,
        },
        "compression_ratio": (ratio * 10.0).round() / 10.0,
        "sources": sources_json(&s.sources),
        "covered_by": covered_by,
        "in_context": in_context,
        "level": s.level,
        "model": s.model,
        "created_at": s.created_at,
    });
    if !in_context {
        out["region"] = region_json(&region);
    }
    if !s.file_ids.is_empty() {
        out["files"] = json!(s.file_ids);
    }
    add_marks(&mut out, reader, NodeRef::Summary(id))?;
    out["content"] = json!(s.content);
    out["manifest"] = manifest;
    Ok(out)
}

fn describe_message(
    ctx: &ToolContext,
    reader: &StoreReader,
    id: MessageId,
    max_tokens: usize,
) -> Result<Value, ToolError> {
    let m = reader.message(id).map_err(store_err(NAME))?;
    let mut regions = RegionFinder::new(reader);
    let covered_by = regions
        .covering(NodeRef::Message(id))
        .map_err(store_err(NAME))?;
    let region = regions
        .region_of_message(id, m.session)
        .map_err(store_err(NAME))?;
    let content = render_parts(&m.parts);
    let counter = ctx.store.counter();
    let cut = prefix_within_tokens(counter, &content, max_tokens);
    let mut out = json!({
        "id": m.id,
        "type": "message",
        "session": m.session,
        "seq": m.seq,
        "role": m.role,
        "at": m.created_at,
        "token_count": m.token_count,
        "source": m.source.as_str(),
        "parts": m.parts.iter().map(part_summary).collect::<Vec<_>>(),
        "covered_by": covered_by,
        "region": region_json(&region),
        "content": &content[..cut],
    });
    if let Some(files) = reader.message_files(id).map_err(store_err(NAME))? {
        out["files"] = json!(
            files
                .refs
                .iter()
                .map(|r| json!({"part": r.part, "file": r.file, "shown_as_reference": !r.inline}))
                .collect::<Vec<_>>()
        );
    }
    add_marks(&mut out, reader, NodeRef::Message(id))?;
    if cut < content.len() {
        out["truncated"] = json!(format!(
            "content cut at max_tokens={max_tokens} ({cut} of {} bytes shown); a sub-agent can read it all with lcm_expand",
            content.len()
        ));
    }
    Ok(out)
}

/// Adds `marks` to a node's description: each session whose context pins or forgets it
/// (`lcm_pin`, `lcm_forget`); absent when none does.
fn add_marks(out: &mut Value, reader: &StoreReader, node: NodeRef) -> Result<(), ToolError> {
    let marks = reader.marks_on(node).map_err(store_err(NAME))?;
    if !marks.is_empty() {
        out["marks"] = marks
            .iter()
            .map(|(session, m)| json!({"session": session, "mark": m.mark.as_str(), "at": m.at}))
            .collect();
    }
    Ok(())
}

/// Most commitments a session's description lists (the newest; the counts cover all).
const DESCRIBE_COMMITMENTS: usize = 50;

fn describe_session(
    ctx: &ToolContext,
    reader: &StoreReader,
    id: SessionId,
) -> Result<Value, ToolError> {
    let s = reader.session(id).map_err(store_err(NAME))?;
    // The context as stored, before any budget is fitted (what the agent's next turn starts
    // from): its state and what it spends its tokens on, from one read.
    let assembled = assemble(&ctx.store, id).map_err(store_err(NAME))?;
    let context = &assembled.state;
    let ledger = session_commitments(&ctx.store, id).map_err(store_err(NAME))?;
    let count = |status| ledger.iter().filter(|e| e.status == status).count();
    let marks = reader.marks(id).map_err(store_err(NAME))?;
    let marked = |mark| {
        marks
            .iter()
            .filter(|m| m.mark == mark)
            .map(|m| m.node.to_string())
            .collect::<Vec<_>>()
    };
    let listed = &ledger[ledger.len().saturating_sub(DESCRIBE_COMMITMENTS)..];
    Ok(json!({
        "id": s.id,
        "type": "session",
        "key": s.key,
        "parent": s.parent,
        "created_at": s.created_at,
        "messages": s.message_count,
        "tokens": s.token_total,
        "from": s.first_message_at,
        "to": s.last_message_at,
        "context": {
            "summaries": context.summaries,
            "raw_from_seq": context.raw_from,
            "raw_messages": s.message_count.saturating_sub(context.raw_from),
            "tokens": assembled.tokens,
            "breakdown": assembled.breakdown(),
            "pinned": marked(ContextMark::Pinned),
            "forgotten": marked(ContextMark::Forgotten),
        },
        "commitments": {
            "open": count(CommitmentStatus::Open),
            "fulfilled": count(CommitmentStatus::Fulfilled),
            "dropped": count(CommitmentStatus::Dropped),
            "listed": listed,
        },
    }))
}
