//! `lcm_grep`: search the whole immutable history (paper appendix C.1), hits grouped by the
//! summary that currently stands for them in their session's context.
//!
//! Messages are searched with [`lcm_store::grep`] (trigram-planned regex, verified on the
//! stored text; or BM25 full text). A search restricted to a summary's subtree (`summary_id`)
//! scans that subtree's messages (regex) or narrows the store search to the subtree's time
//! range and keeps the hits inside its sequence range (full text). Summaries are searched by
//! matching their stored text with the same semantics ([`lcm_search::grep::TextMatcher`]).
//!
//! Each page holds at most `limit` hits and at most `max_tokens` tokens of output; hits that do
//! not fit are left for the next page, and the cursor resumes exactly at the first hit not
//! shown, so pages never repeat or skip a hit.

use std::collections::HashMap;
use std::ops::ControlFlow;

use async_trait::async_trait;
use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::Role;
use lcm_core::summary::{NodeRef, Summary};
use lcm_core::time::Timestamp;
use lcm_search::grep::TextMatcher;
use lcm_search::{GrepMode, GrepRequest, Scope};
use lcm_store::{Store, StoreError};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::ToolError;
use super::registry::{Tool, ToolContext, ToolDefinition};
use super::util::{
    Region, RegionFinder, blocking, fingerprint, json_tokens, parse_args, parse_id, parse_time,
    prefix_within_tokens, resolve_session, root_session, store_err,
};

const NAME: &str = "lcm_grep";

/// Output tokens of one `lcm_grep` page when the call gives no `max_tokens`.
pub const DEFAULT_GREP_MAX_TOKENS: usize = 4_000;
/// Smallest and largest `max_tokens` a call may ask for.
pub const GREP_MAX_TOKENS_RANGE: (usize, usize) = (300, 32_000);
/// Tokens kept for the page's envelope (counts, cursor, notes) when fitting hits.
const ENVELOPE_TOKENS: usize = 160;

/// The `lcm_grep` tool. Available to the main agent and to sub-agents.
#[derive(Debug, Clone, Copy, Default)]
pub struct LcmGrep;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Target {
    #[default]
    Messages,
    Summaries,
    Both,
}

impl Target {
    fn as_str(self) -> &'static str {
        match self {
            Target::Messages => "messages",
            Target::Summaries => "summaries",
            Target::Both => "both",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    pattern: String,
    #[serde(default = "default_mode")]
    mode: GrepMode,
    #[serde(default)]
    scope: Target,
    summary_id: Option<String>,
    session: Option<String>,
    since: Option<String>,
    before: Option<String>,
    limit: Option<usize>,
    max_tokens: Option<usize>,
    cursor: Option<String>,
}

fn default_mode() -> GrepMode {
    GrepMode::Regex
}

#[async_trait]
impl Tool for LcmGrep {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition::new(
            NAME,
            "Search the full, verbatim history of the conversation (every message ever \
             stored, including those now replaced by summaries in your context). Returns matching \
             messages grouped by the summary that currently stands for them in your context \
             (`raw_tail`: still verbatim in your context), each with its id, role, time and a \
             snippet around the match. Paginated: pass `next_cursor` back as `cursor` for more. \
             Use lcm_describe on an id for details; to read the full text under a summary, expand \
             it (lcm_expand in a sub-agent, or lcm_expand_query).",
            json!({
                "type": "object",
                "properties": {
                    "pattern": {
                        "type": "string", "minLength": 1, "maxLength": 4096,
                        "description": "mode regex: a regular expression (Rust syntax, case-sensitive; prefix (?i) to ignore case). mode full_text: words to rank by (+word requires, -word excludes, \"a phrase\"). mode semantic or hybrid: what you are looking for, in your own words."
                    },
                    "mode": {
                        "type": "string", "enum": ["regex", "full_text", "semantic", "hybrid"], "default": "regex",
                        "description": "regex: every match, oldest first (exact). full_text: stemmed words, best matches first (BM25). semantic: messages nearest in meaning (an embedding model must be configured). hybrid: full_text and semantic together, best of both first (the same)."
                    },
                    "scope": {
                        "type": "string", "enum": ["messages", "summaries", "both"], "default": "messages",
                        "description": "Search the verbatim messages, the summaries' text, or both (summaries first)."
                    },
                    "summary_id": {
                        "type": "string", "pattern": "^sum_[0-9]+$",
                        "description": "Only search under this summary (the messages and summaries it covers)."
                    },
                    "session": {
                        "type": "string",
                        "description": "`current` (default: your conversation), `all` (every session), a session id (ses_N) or a session key."
                    },
                    "since": {
                        "type": "string",
                        "description": "Only hits created at or after this time (RFC 3339, or YYYY-MM-DD)."
                    },
                    "before": {
                        "type": "string",
                        "description": "Only hits created before this time (RFC 3339, or YYYY-MM-DD)."
                    },
                    "limit": {
                        "type": "integer", "minimum": 1, "maximum": 200,
                        "description": "Most hits on this page (default 20)."
                    },
                    "max_tokens": {
                        "type": "integer", "minimum": GREP_MAX_TOKENS_RANGE.0, "maximum": GREP_MAX_TOKENS_RANGE.1,
                        "description": "Most tokens of output on this page (default 4000); hits that do not fit move to the next page."
                    },
                    "cursor": {
                        "type": "string",
                        "description": "`next_cursor` of the previous page of the same search."
                    }
                },
                "required": ["pattern"],
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

/// Which engine searches the messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Engine {
    /// [`lcm_store::grep`] (needs the index).
    Store,
    /// A scan with a [`TextMatcher`] (regex; no index, or a summary's bounded subtree).
    Scan,
}

/// A request with its arguments resolved.
struct Plan {
    pattern: String,
    mode: GrepMode,
    target: Target,
    session: Option<SessionId>,
    within: Option<Summary>,
    since: Option<Timestamp>,
    before: Option<Timestamp>,
    limit: usize,
    max_tokens: usize,
    engine: Engine,
    fingerprint: u64,
    snippet_chars: usize,
}

/// Where a page starts (and where the next one will).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pos {
    /// Summaries with ids from this number on.
    Summaries { from: u64 },
    /// The store's page at `cursor` (its start when `None`), from its `skip`-th hit on.
    Store { cursor: Option<String>, skip: usize },
    /// Scan from this sequence number (one session) or message id (all sessions) on.
    Scan { from: u64 },
}

impl Pos {
    pub(super) fn encode(&self, fingerprint: u64) -> String {
        match self {
            Pos::Summaries { from } => format!("lg1.{fingerprint:016x}.s.{from}"),
            Pos::Scan { from } => format!("lg1.{fingerprint:016x}.x.{from}"),
            Pos::Store { cursor, skip } => format!(
                "lg1.{fingerprint:016x}.m.{skip}.{}",
                cursor.as_deref().unwrap_or("-")
            ),
        }
    }

    pub(super) fn decode(text: &str, fingerprint: u64) -> Result<Pos, ToolError> {
        let bad = |why: &str| ToolError::InvalidRequest {
            tool: NAME.into(),
            message: format!(
                "invalid cursor `{text}`: {why}; pass `next_cursor` from the previous page of the same search, or omit `cursor` to start over"
            ),
        };
        let mut pieces = text.trim().splitn(5, '.');
        if pieces.next() != Some("lg1") {
            return Err(bad("not a cursor lcm_grep issued"));
        }
        let print = pieces
            .next()
            .and_then(|p| u64::from_str_radix(p, 16).ok())
            .ok_or_else(|| bad("not a cursor lcm_grep issued"))?;
        if print != fingerprint {
            return Err(bad(
                "it belongs to a different search (pattern, mode, scope, session, summary_id or time range changed)",
            ));
        }
        let kind = pieces.next();
        let number = pieces.next().and_then(|n| n.parse::<u64>().ok());
        let rest = pieces.next();
        match (kind, number, rest) {
            (Some("s"), Some(from), None) => Ok(Pos::Summaries { from }),
            (Some("x"), Some(from), None) => Ok(Pos::Scan { from }),
            (Some("m"), Some(skip), Some(cursor)) => Ok(Pos::Store {
                cursor: (cursor != "-").then(|| cursor.to_owned()),
                skip: usize::try_from(skip).map_err(|_| bad("malformed"))?,
            }),
            _ => Err(bad("malformed")),
        }
    }
}

/// One hit before rendering.
enum Hit {
    Message {
        id: MessageId,
        session: SessionId,
        seq: u64,
        role: Role,
        created_at: Timestamp,
        snippet: String,
        matches: usize,
        /// Ranked modes: the BM25, cosine or fused score.
        score: Option<f32>,
        /// Semantic and hybrid modes: which searches found it.
        found_by: Vec<GrepMode>,
    },
    Summary {
        summary: Box<Summary>,
        snippet: String,
        matches: usize,
        score: Option<f32>,
        found_by: Vec<GrepMode>,
    },
}

/// A hit and the position that starts at it.
struct Candidate {
    pos: Pos,
    hit: Hit,
}

fn run(ctx: &ToolContext, args: Args) -> Result<Value, ToolError> {
    let plan = resolve(ctx, &args)?;
    let start = match &args.cursor {
        Some(c) => Pos::decode(c, plan.fingerprint)?,
        None => plan.start(),
    };
    let reader = ctx.store.reader().map_err(store_err(NAME))?;
    let mut matcher = match (plan.target, plan.engine, &ctx.index) {
        (Target::Messages, Engine::Store, _) => None,
        // Summaries by meaning: the words side of `hybrid` matches their words (a query
        // without words leaves meaning alone).
        (_, _, Some(index)) if plan.mode == GrepMode::Hybrid => {
            TextMatcher::new(index, GrepMode::FullText, &plan.pattern).ok()
        }
        (_, _, Some(_)) if plan.mode == GrepMode::Semantic => None,
        (_, _, Some(index)) => {
            Some(TextMatcher::new(index, plan.mode, &plan.pattern).map_err(store_err(NAME))?)
        }
        (_, _, None) => Some(TextMatcher::regex(&plan.pattern).map_err(store_err(NAME))?),
    };
    let (candidates, next) = collect(ctx, &reader, &plan, &mut matcher, start)?;
    render(ctx, &reader, &plan, candidates, next)
}

fn resolve(ctx: &ToolContext, args: &Args) -> Result<Plan, ToolError> {
    let store = &ctx.store;
    let search = &ctx.config.search;
    let pattern = args.pattern.clone();
    if pattern.trim().is_empty() {
        return Err(ToolError::invalid_argument(
            NAME,
            "at /pattern: the pattern is blank",
        ));
    }
    let within = match &args.summary_id {
        Some(text) => {
            let id: SummaryId = parse_id(NAME, "/summary_id", text)?;
            Some(store.summary(id).map_err(store_err(NAME))?)
        }
        None => None,
    };
    let explicit = match args.session.as_deref().map(str::trim) {
        None | Some("current") => None,
        Some("all") => Some(None),
        Some(other) => Some(Some(resolve_session(NAME, store, other)?)),
    };
    let session = match (&within, explicit) {
        (Some(w), Some(Some(s))) if s != w.session => {
            return Err(ToolError::InvalidRequest {
                tool: NAME.into(),
                message: format!(
                    "{} belongs to {}, not {s}; drop `session` or give the summary's session",
                    w.id, w.session
                ),
            });
        }
        (Some(w), _) => Some(w.session),
        (None, Some(explicit)) => explicit,
        (None, None) => match ctx.caller.session {
            Some(s) => Some(root_session(store, s).map_err(store_err(NAME))?),
            None => None,
        },
    };
    let since = args
        .since
        .as_deref()
        .map(|t| parse_time(NAME, "/since", t))
        .transpose()?;
    let before = args
        .before
        .as_deref()
        .map(|t| parse_time(NAME, "/before", t))
        .transpose()?;
    let limit = args
        .limit
        .unwrap_or(search.default_limit)
        .clamp(1, search.max_limit.max(1));
    let max_tokens = args
        .max_tokens
        .unwrap_or(DEFAULT_GREP_MAX_TOKENS)
        .clamp(GREP_MAX_TOKENS_RANGE.0, GREP_MAX_TOKENS_RANGE.1);
    let engine = match (args.mode, &ctx.index, &within) {
        (GrepMode::FullText, None, _) => {
            return Err(ToolError::Unsupported {
                tool: NAME.into(),
                message: "full_text search needs the search index, which this host did not open; use mode regex".into(),
            });
        }
        (GrepMode::Semantic | GrepMode::Hybrid, None, _) => {
            return Err(ToolError::Unsupported {
                tool: NAME.into(),
                message: format!(
                    "{} search needs the search index, which this host did not open; use mode regex",
                    args.mode.name()
                ),
            });
        }
        (GrepMode::Regex, None, _) | (GrepMode::Regex, _, Some(_)) => Engine::Scan,
        _ => Engine::Store,
    };
    let session_text = session.map_or_else(|| "all".to_owned(), |s| s.to_string());
    let within_text = within
        .as_ref()
        .map_or_else(String::new, |w| w.id.to_string());
    let since_text = since.map_or_else(String::new, |t| t.0.to_string());
    let before_text = before.map_or_else(String::new, |t| t.0.to_string());
    let mode_text = args.mode.name();
    let engine_text = match engine {
        Engine::Store => "store",
        Engine::Scan => "scan",
    };
    let fingerprint = fingerprint(&[
        &pattern,
        mode_text,
        args.scope.as_str(),
        &session_text,
        &within_text,
        &since_text,
        &before_text,
        engine_text,
    ]);
    Ok(Plan {
        pattern,
        mode: args.mode,
        target: args.scope,
        session,
        within,
        since,
        before,
        limit,
        max_tokens,
        engine,
        fingerprint,
        snippet_chars: search.snippet_chars,
    })
}

impl Plan {
    fn start(&self) -> Pos {
        match self.target {
            Target::Summaries | Target::Both => Pos::Summaries { from: 0 },
            Target::Messages => self.message_start(),
        }
    }

    fn message_start(&self) -> Pos {
        match self.engine {
            Engine::Store => Pos::Store {
                cursor: None,
                skip: 0,
            },
            Engine::Scan => Pos::Scan {
                from: self.within.as_ref().map_or(0, |w| w.first_seq),
            },
        }
    }

    /// The time range messages are searched in: the caller's, narrowed to the subtree's.
    fn time_range(&self) -> (Option<Timestamp>, Option<Timestamp>) {
        let mut since = self.since;
        let mut before = self.before;
        if let Some(w) = &self.within {
            since = Some(since.map_or(w.earliest_at, |s| s.max(w.earliest_at)));
            let end = Timestamp(w.latest_at.0.saturating_add(1));
            before = Some(before.map_or(end, |b| b.min(end)));
        }
        (since, before)
    }

    fn admits_time(&self, t: Timestamp) -> bool {
        self.since.is_none_or(|s| t >= s) && self.before.is_none_or(|b| t < b)
    }

    fn admits_message(&self, session: SessionId, seq: u64) -> bool {
        self.within
            .as_ref()
            .is_none_or(|w| w.session == session && (w.first_seq..=w.last_seq).contains(&seq))
    }

    fn admits_summary(&self, s: &Summary) -> bool {
        self.session.is_none_or(|session| s.session == session)
            && self.within.as_ref().is_none_or(|w| {
                w.session == s.session && w.first_seq <= s.first_seq && s.last_seq <= w.last_seq
            })
            && self.since.is_none_or(|t| s.latest_at >= t)
            && self.before.is_none_or(|t| s.earliest_at < t)
    }
}

/// Up to `plan.limit` hits from `start` on, and the position after the last one (`None`: no
/// more hits).
fn collect(
    ctx: &ToolContext,
    reader: &lcm_store::StoreReader,
    plan: &Plan,
    matcher: &mut Option<TextMatcher>,
    start: Pos,
) -> Result<(Vec<Candidate>, Option<Pos>), ToolError> {
    let mut out = Vec::new();
    let mut pos = Some(start);
    while let Some(current) = pos.take() {
        let want = plan.limit - out.len();
        if want == 0 {
            pos = Some(current);
            break;
        }
        let next = match current {
            Pos::Summaries { from } => {
                let next = if plan.mode.needs_embeddings() {
                    ranked_summary_hits(ctx, plan, matcher.as_mut(), from, want, &mut out)?
                } else {
                    let Some(matcher) = matcher.as_mut() else {
                        return Err(ToolError::failed(NAME, "no matcher for summaries"));
                    };
                    summary_hits(&ctx.store, plan, matcher, from, want, &mut out)?
                };
                match (next, plan.target) {
                    (Some(from), _) => Some(Pos::Summaries { from }),
                    (None, Target::Both) => Some(plan.message_start()),
                    (None, _) => None,
                }
            }
            Pos::Store { cursor, skip } => store_hits(ctx, plan, cursor, skip, want, &mut out)?,
            Pos::Scan { from } => {
                let Some(matcher) = matcher.as_mut() else {
                    return Err(ToolError::failed(NAME, "no matcher for the scan"));
                };
                scan_hits(reader, plan, matcher, from, want, &mut out)?
            }
        };
        pos = next;
    }
    Ok((out, pos))
}

/// The summaries in the search's scope, by id.
fn summaries_in_scope(store: &Store, plan: &Plan) -> Result<Vec<Summary>, ToolError> {
    let mut summaries = match plan.session {
        Some(session) => store.session_summaries(session).map_err(store_err(NAME))?,
        None => {
            let mut all = Vec::new();
            for s in store.sessions().map_err(store_err(NAME))? {
                all.extend(store.session_summaries(s.id).map_err(store_err(NAME))?);
            }
            all.sort_by_key(|s| s.id);
            all
        }
    };
    summaries.retain(|s| plan.admits_summary(s));
    Ok(summaries)
}

/// Summaries matching from id `from` on; the id to continue from, `None` when no summary left
/// matches.
fn summary_hits(
    store: &Store,
    plan: &Plan,
    matcher: &mut TextMatcher,
    from: u64,
    want: usize,
    out: &mut Vec<Candidate>,
) -> Result<Option<u64>, ToolError> {
    let mut summaries = summaries_in_scope(store, plan)?;
    summaries.retain(|s| s.id.0 >= from);
    let mut taken = 0;
    for s in summaries {
        let Some(found) = matcher.find(&s.content, plan.snippet_chars) else {
            continue;
        };
        if taken == want {
            // One more matches: the next page starts at it.
            return Ok(Some(s.id.0));
        }
        taken += 1;
        out.push(Candidate {
            pos: Pos::Summaries { from: s.id.0 },
            hit: Hit::Summary {
                summary: Box::new(s),
                snippet: found.snippet,
                matches: found.matches,
                score: None,
                found_by: Vec::new(),
            },
        });
    }
    Ok(None)
}

/// Summaries ranked by meaning (semantic) or by meaning and words (hybrid, `words` matching
/// their text), from the `offset`-th on; the offset to continue from, `None` at the end. The
/// scope applies before ranking.
fn ranked_summary_hits(
    ctx: &ToolContext,
    plan: &Plan,
    mut words: Option<&mut TextMatcher>,
    offset: u64,
    want: usize,
    out: &mut Vec<Candidate>,
) -> Result<Option<u64>, ToolError> {
    let semantic = ctx
        .index
        .as_ref()
        .and_then(|index| index.semantic())
        .ok_or_else(|| store_err(NAME)(lcm_search::grep::no_embeddings_error(plan.mode)))?;
    let in_scope: HashMap<u64, Summary> = summaries_in_scope(&ctx.store, plan)?
        .into_iter()
        .map(|s| (s.id.0, s))
        .collect();
    let offset = usize::try_from(offset).unwrap_or(usize::MAX);
    let pool = offset
        .saturating_add(want)
        .saturating_add(1)
        .max(lcm_search::HYBRID_POOL);
    let admits = |id: u64| in_scope.contains_key(&id);
    semantic
        .refuse_if_stale_for(&*ctx.store)
        .map_err(store_err(NAME))?;
    // Read before the search (see `lcm_search::fuse`): summaries not embedded yet are scored
    // by the embeddings' score at their rank by words.
    let embedded_below = semantic.summary_watermark().map_err(store_err(NAME))?.0;
    let meaning: Vec<(u64, f32, (u32, u32))> = semantic
        .search_summaries(&plan.pattern, pool, plan.session, Some(&admits))
        .map_err(store_err(NAME))?
        .into_iter()
        .map(|h| (h.message, h.score, h.chunk))
        .collect();
    let mut by_words: Vec<(u64, f32)> = Vec::new();
    if let Some(matcher) = words.as_deref_mut() {
        for (id, s) in &in_scope {
            if let Some(found) = matcher.find(&s.content, plan.snippet_chars) {
                by_words.push((*id, found.matches as f32));
            }
        }
    }
    let ranked = lcm_search::fuse(&by_words, &meaning, |id| id < embedded_below);
    for (i, f) in ranked.iter().enumerate().skip(offset) {
        if i == offset + want {
            return Ok(Some(i as u64));
        }
        let Some(s) = in_scope.get(&f.id) else {
            continue;
        };
        let found = match words.as_deref_mut() {
            Some(matcher) if f.by_words => matcher.find(&s.content, plan.snippet_chars),
            _ => None,
        };
        let (snippet, matches) = match found {
            Some(found) => (found.snippet, found.matches),
            None => {
                let start = s
                    .content
                    .floor_char_boundary(f.chunk.map_or(0, |c| c.0 as usize));
                (
                    lcm_search::grep::snippet(&s.content, start, start, plan.snippet_chars),
                    0,
                )
            }
        };
        let mut found_by = Vec::with_capacity(2);
        if f.by_words {
            found_by.push(GrepMode::FullText);
        }
        if f.chunk.is_some() {
            found_by.push(GrepMode::Semantic);
        }
        out.push(Candidate {
            pos: Pos::Summaries { from: i as u64 },
            hit: Hit::Summary {
                summary: Box::new(s.clone()),
                snippet,
                matches,
                score: Some(f.score),
                found_by,
            },
        });
    }
    Ok(None)
}

/// Message hits through [`lcm_store::grep`], from the store page at `cursor`, skipping its
/// first `skip` hits; the position after the last hit taken.
fn store_hits(
    ctx: &ToolContext,
    plan: &Plan,
    mut cursor: Option<String>,
    mut skip: usize,
    want: usize,
    out: &mut Vec<Candidate>,
) -> Result<Option<Pos>, ToolError> {
    let Some(index) = &ctx.index else {
        return Err(ToolError::Unsupported {
            tool: NAME.into(),
            message: "this search needs the search index, which this host did not open".into(),
        });
    };
    let max_limit = ctx.config.search.max_limit.max(1);
    if skip >= max_limit {
        return Err(ToolError::InvalidRequest {
            tool: NAME.into(),
            message:
                "invalid cursor: it points past a page; start the search again without `cursor`"
                    .into(),
        });
    }
    let (since, before) = plan.time_range();
    if let (Some(s), Some(b)) = (since, before)
        && s >= b
    {
        return Ok(None);
    }
    let mut taken = 0;
    loop {
        let request = GrepRequest {
            pattern: plan.pattern.clone(),
            mode: plan.mode,
            scope: Scope {
                session: plan.session,
                roles: Vec::new(),
                since,
                before,
            },
            limit: Some((skip + (want - taken)).min(max_limit)),
            cursor: cursor.clone(),
        };
        let page = lcm_search::grep(&ctx.store, index, &ctx.config.search, &request)
            .map_err(store_err(NAME))?;
        let count = page.hits.len();
        for (i, hit) in page.hits.into_iter().enumerate().skip(skip) {
            if !plan.admits_message(hit.session, hit.seq) {
                continue;
            }
            out.push(Candidate {
                pos: Pos::Store {
                    cursor: cursor.clone(),
                    skip: i,
                },
                hit: Hit::Message {
                    id: hit.message,
                    session: hit.session,
                    seq: hit.seq,
                    role: hit.role,
                    created_at: hit.created_at,
                    snippet: hit.snippet,
                    matches: hit.matches,
                    score: hit.score,
                    found_by: hit.found_by,
                },
            });
            taken += 1;
            if taken == want {
                return Ok(if i + 1 < count {
                    Some(Pos::Store {
                        cursor,
                        skip: i + 1,
                    })
                } else {
                    page.next_cursor.map(|c| Pos::Store {
                        cursor: Some(c),
                        skip: 0,
                    })
                });
            }
        }
        match page.next_cursor {
            Some(next) => {
                cursor = Some(next);
                skip = 0;
            }
            None => return Ok(None),
        }
    }
}

/// Message hits by scanning: the summary's subtree, one session, or every message.
fn scan_hits(
    reader: &lcm_store::StoreReader,
    plan: &Plan,
    matcher: &mut TextMatcher,
    from: u64,
    want: usize,
    out: &mut Vec<Candidate>,
) -> Result<Option<Pos>, ToolError> {
    // `out` may already hold summary hits: this scan adds up to `want`.
    let full = out.len() + want;
    let mut next = None;
    let mut visit = |m: lcm_core::message::Message, resume: u64| {
        if !plan.admits_time(m.created_at) || !plan.admits_message(m.session, m.seq) {
            return ControlFlow::Continue(());
        }
        let Some(found) = matcher.find(&m.search_text(), plan.snippet_chars) else {
            return ControlFlow::Continue(());
        };
        if out.len() >= full {
            next = Some(Pos::Scan { from: resume });
            return ControlFlow::Break(());
        }
        out.push(Candidate {
            pos: Pos::Scan { from: resume },
            hit: Hit::Message {
                id: m.id,
                session: m.session,
                seq: m.seq,
                role: m.role,
                created_at: m.created_at,
                snippet: found.snippet,
                matches: found.matches,
                score: None,
                found_by: Vec::new(),
            },
        });
        ControlFlow::Continue(())
    };
    let result = match (&plan.within, plan.session) {
        (Some(w), _) => {
            let end = w.last_seq.saturating_add(1);
            reader.for_each_in_session(w.session, from.max(w.first_seq)..end, |m| {
                let seq = m.seq;
                visit(m, seq)
            })
        }
        (None, Some(session)) => reader.for_each_in_session(session, from..u64::MAX, |m| {
            let seq = m.seq;
            visit(m, seq)
        }),
        (None, None) => reader.for_each_message(MessageId(from)..MessageId(u64::MAX), |m| {
            let id = m.id.0;
            visit(m, id)
        }),
    };
    result.map_err(store_err(NAME))?;
    Ok(next)
}

/// A group of hits under one region.
struct Group {
    header: Map<String, Value>,
    hits: Vec<Value>,
}

fn region_header(region: &Region) -> (String, Map<String, Value>) {
    let value = match region {
        Region::Summary(s) => json!({
            "region": s.id,
            "session": s.session,
            "kind": s.kind.as_str(),
            "depth": s.depth,
            "from": s.earliest_at,
            "to": s.latest_at,
            "messages": s.descendant_messages,
        }),
        Region::RawTail(session) => json!({
            "region": "raw_tail",
            "session": session,
        }),
    };
    let key = match region {
        Region::Summary(s) => s.id.to_string(),
        Region::RawTail(session) => format!("raw:{session}"),
    };
    match value {
        Value::Object(map) => (key, map),
        _ => (key, Map::new()),
    }
}

fn hit_json(hit: &Hit, regions: &mut RegionFinder<'_>) -> Result<(Value, Region), StoreError> {
    Ok(match hit {
        Hit::Message {
            id,
            session,
            seq,
            role,
            created_at,
            snippet,
            matches,
            score,
            found_by,
        } => {
            let covered_by = regions.covering(NodeRef::Message(*id))?;
            let region = regions.region_of_message(*id, *session)?;
            let mut v = json!({
                "type": "message", "id": id, "role": role, "at": created_at, "seq": seq,
            });
            if let Some(c) = covered_by {
                v["covered_by"] = json!(c);
            }
            // A hit inside a file's content (a large payload or a file read) says which record.
            if let Some(files) = regions.message_files(*id)? {
                let ids: Vec<String> = files.refs.iter().map(|r| r.file.to_string()).collect();
                v["files"] = json!(ids);
            }
            v["snippet"] = json!(snippet);
            v["matches"] = json!(matches);
            rank_json(&mut v, *score, found_by);
            (v, region)
        }
        Hit::Summary {
            summary,
            snippet,
            matches,
            score,
            found_by,
        } => {
            let covered_by = regions.covering(NodeRef::Summary(summary.id))?;
            let region = regions.region_of_summary(summary.id)?;
            let mut v = json!({
                "type": "summary", "id": summary.id, "kind": summary.kind.as_str(),
                "depth": summary.depth, "from": summary.earliest_at, "to": summary.latest_at,
            });
            if let Some(c) = covered_by {
                v["covered_by"] = json!(c);
            }
            v["snippet"] = json!(snippet);
            v["matches"] = json!(matches);
            rank_json(&mut v, *score, found_by);
            (v, region)
        }
    })
}

/// A ranked hit's score and (semantic, hybrid) the searches that found it.
fn rank_json(v: &mut Value, score: Option<f32>, found_by: &[GrepMode]) {
    if let Some(score) = score {
        // Four decimals: enough to order by, without float noise in the output.
        v["score"] = json!((f64::from(score) * 1e4).round() / 1e4);
    }
    if !found_by.is_empty() {
        v["found_by"] = json!(found_by.iter().map(|m| m.name()).collect::<Vec<_>>());
    }
}

fn render(
    ctx: &ToolContext,
    reader: &lcm_store::StoreReader,
    plan: &Plan,
    candidates: Vec<Candidate>,
    mut next: Option<Pos>,
) -> Result<Value, ToolError> {
    let counter = ctx.store.counter();
    // Messages and summaries the embeddings have not reached: said, so that an agent knows a
    // search by meaning could not find them yet.
    let by_meaning = matches!(plan.mode, GrepMode::Semantic | GrepMode::Hybrid);
    let not_embedded = match ctx.index.as_ref().and_then(|i| i.semantic()) {
        Some(semantic) if by_meaning => {
            not_embedded_json(semantic, &ctx.store, plan).map_err(store_err(NAME))?
        }
        _ => None,
    };
    let mut regions = RegionFinder::new(reader);
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of: HashMap<String, usize> = HashMap::new();
    let budget = plan.max_tokens.saturating_sub(ENVELOPE_TOKENS);
    let mut used = 0usize;
    let total = candidates.len();
    let mut shown = 0usize;
    let mut held_back = None;
    // Where each shown hit sits, to take hits back if the page ends up too large.
    let mut placed: Vec<(usize, Pos)> = Vec::new();
    for candidate in candidates {
        let (mut hit, region) = hit_json(&candidate.hit, &mut regions).map_err(store_err(NAME))?;
        let (key, header) = region_header(&region);
        let new_group = !group_of.contains_key(&key);
        let mut cost = json_tokens(counter, &hit) + 1;
        if new_group {
            cost += json_tokens(counter, &Value::Object(header.clone())) + 12;
        }
        if used + cost > budget {
            if shown > 0 {
                held_back = Some(candidate.pos);
                break;
            }
            // The first hit must fit (progress): cut its snippet.
            let snippet = hit["snippet"].as_str().unwrap_or_default().to_owned();
            let over = used + cost - budget;
            let keep = counter.count_text(&snippet).saturating_sub(over + 4);
            let cut = prefix_within_tokens(counter, &snippet, keep);
            hit["snippet"] = json!(format!("{}…", &snippet[..cut]));
            cost = budget.saturating_sub(used);
        }
        used += cost;
        let index = match group_of.get(&key) {
            Some(i) => *i,
            None => {
                group_of.insert(key, groups.len());
                groups.push(Group {
                    header,
                    hits: Vec::new(),
                });
                groups.len() - 1
            }
        };
        groups[index].hits.push(hit);
        placed.push((index, candidate.pos));
        shown += 1;
    }
    if let Some(pos) = held_back.clone() {
        next = Some(pos);
    }
    loop {
        let page = page_json(
            plan,
            &groups,
            shown,
            total,
            next.as_ref(),
            held_back.is_some(),
            not_embedded.as_ref(),
        );
        if json_tokens(counter, &page) <= plan.max_tokens || shown <= 1 {
            return Ok(page);
        }
        // The estimate was short: give back the last hit.
        let Some((group, pos)) = placed.pop() else {
            return Ok(page);
        };
        groups[group].hits.pop();
        if groups[group].hits.is_empty() {
            groups.remove(group);
        }
        shown -= 1;
        next = Some(pos.clone());
        held_back = Some(pos);
    }
}

/// `{messages, summaries, note}` for the messages and summaries of the searched target the
/// embeddings have not reached yet (each key only when some are behind); `None` when none are.
fn not_embedded_json(
    semantic: &lcm_search::semantic::Semantic,
    store: &lcm_store::Store,
    plan: &Plan,
) -> lcm_store::Result<Option<Value>> {
    use lcm_search::grep::{Unembedded, not_embedded_note};
    let mut out = serde_json::Map::new();
    let mut notes = Vec::new();
    let (messages, summaries) = match plan.target {
        Target::Messages => (true, false),
        Target::Summaries => (false, true),
        Target::Both => (true, true),
    };
    if messages {
        let pending = semantic.messages_not_embedded(store)?;
        if let Some(note) = not_embedded_note(Some(pending), plan.mode, Unembedded::Messages) {
            out.insert("messages".into(), json!(pending));
            notes.push(note);
        }
    }
    if summaries {
        let pending = semantic.summaries_not_embedded(store)?;
        if let Some(note) = not_embedded_note(Some(pending), plan.mode, Unembedded::Summaries) {
            out.insert("summaries".into(), json!(pending));
            notes.push(note);
        }
    }
    if notes.is_empty() {
        return Ok(None);
    }
    out.insert("note".into(), json!(notes.join(". ")));
    Ok(Some(Value::Object(out)))
}

fn page_json(
    plan: &Plan,
    groups: &[Group],
    shown: usize,
    fetched: usize,
    next: Option<&Pos>,
    truncated: bool,
    not_embedded: Option<&Value>,
) -> Value {
    let groups: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut m = g.header.clone();
            m.insert("hits".into(), Value::Array(g.hits.clone()));
            Value::Object(m)
        })
        .collect();
    let mut page = json!({
        "searched": {
            "mode": plan.mode.name(),
            "scope": plan.target.as_str(),
            "session": plan.session.map_or_else(|| "all".to_owned(), |s| s.to_string()),
        },
        "hits": shown,
        "groups": groups,
        "next_cursor": next.map(|p| p.encode(plan.fingerprint)),
    });
    if let Some(w) = &plan.within {
        page["searched"]["summary_id"] = json!(w.id);
    }
    if shown == 0 {
        page["note"] = json!("no matches");
    } else {
        page["note"] = json!(
            "groups: the summary standing for the hits in the context now (raw_tail: still verbatim in the context); covered_by: the smallest summary containing the hit"
        );
    }
    if let Some(pending) = not_embedded {
        page["not_embedded"] = pending.clone();
    }
    if truncated {
        page["truncated"] = json!(format!(
            "{shown} of {fetched} hits fit in max_tokens={}; the rest continue at next_cursor",
            plan.max_tokens
        ));
    }
    page
}
