//! Context assembly: from a session's context state to the messages a provider receives.
//!
//! The context is: optional system content, then the top-level summaries in order (each
//! rendered as a user message that carries, added by the engine whatever the summariser wrote,
//! its id, kind, depth, time range, what it covers and its files), then every raw message from
//! the frontier on. Assembly reads stored token counts and adds them, so its cost grows with the
//! items in the context, not with the history. The same state always renders to the same bytes,
//! and the rendered prefix only changes when a compaction swaps a summary in, so providers'
//! prompt caches keep hitting between compactions.
//!
//! Large payloads: a message part registered as a large file (see `lcm_store::files`) is shown
//! as the file's reference (id, path, kind, sizes, exploration summary) instead of its payload,
//! and the message counts the tokens of what is shown ([`shown_message`]).
//!
//! The budget invariant: [`AssembledContext::fit`] makes any context fit a budget, whatever
//! compaction did or could not do: it replaces the oldest raw messages (whole tool exchanges)
//! by one marker naming their ids, then the oldest summaries, then the largest parts of the
//! newest messages by references with a head excerpt; if even that cannot fit, it fails with a
//! [`BudgetError`] rather than exceed the budget. Every path that hands a context to a model
//! fits it. Nothing is lost: every message stays reachable by id, grep and expansion.
//!
//! Commitments: when the summaries leave commitments open (an intent the agent stated, a
//! request the user made, an item of its to-do list, made in messages now summarised and not
//! fulfilled by anything after them, the raw tail included), one **open commitments** block
//! follows the summaries ([`ContextItem::Commitments`]), so that they are never compacted away.
//! Fitting a budget keeps it (it is small: at most [`BLOCK_COMMITMENTS`] lines). Besides a
//! compaction, the block is the one thing before the raw tail that can change: when a new
//! message fulfils one of its commitments it leaves the block at once, which costs a provider
//! one prompt-cache miss from the block on (at most once per commitment), rather than show the
//! model as open what it has just done.
//!
//! The agent's marks (`lcm_store::marks`): a **pinned** message no longer in the raw tail is
//! shown verbatim in one **pinned** block after the summaries, before the commitments block
//! ([`ContextItem::Pinned`]; a pinned message still in the raw tail is shown where it is). A
//! **forgotten** raw message or top-level summary is shown as a pointer naming it
//! ([`forgotten_message`], [`forgotten_summary`]), counting the pointer's tokens; compaction
//! summarises what the context shows, so a forgotten item enters its summary as its pointer.
//! Fitting a budget keeps the pinned block whole and leaves it out (a marker naming the ids)
//! only when nothing else makes the context fit. A pin or a forget costs a provider one
//! prompt-cache miss from where it shows on; nothing else about them changes the prefix.
//!
//! Tool pairing: a tool result is only sent right after the assistant message that made the
//! call, and a call only with its result. A call or result whose partner is not in the context
//! (compaction never splits them, but a transcript may hold a dangling one) is rendered as plain
//! text instead, so a provider never sees an orphan.

use std::collections::HashSet;
use std::fmt::Write as _;

use lcm_core::digest::{Commitment, OpenItems, open_items};
use lcm_core::files::{
    render_elided_pins, render_elided_span, render_elided_summaries, render_file_reference,
    render_forgotten, render_part_reference, shown_part,
};
use lcm_core::ids::{FileId, MessageId, SessionId, SummaryId};
use lcm_core::message::{Message, Part, Role};
use lcm_core::summary::{ContextMark, ContextState, NodeRef, Summary, SummaryKind};
use lcm_core::tokens::{BINARY_PART_TOKENS, MESSAGE_OVERHEAD_TOKENS, TokenCounter};
use lcm_llm::structured::resolutions;
use lcm_store::{Store, StoreError, StoreReader};
use serde_json::{Value, json};

use crate::tools::ToolFormat;

/// One item of an assembled context.
#[derive(Debug, Clone, PartialEq)]
pub enum ContextItem {
    /// A top-level summary and its rendered text.
    Summary { summary: Summary, rendered: String },
    /// A raw message, as contexts show it (large parts replaced by file references; its
    /// token count is that of what is shown).
    Message(Message),
    /// A marker for items left out to fit a budget ([`AssembledContext::fit`]), rendered as a
    /// user message: the raw messages `messages` (first and last id, inclusive) or the
    /// summaries `summaries`, named in its text.
    Elided {
        text: String,
        tokens: u64,
        messages: Option<(MessageId, MessageId)>,
        summaries: Vec<SummaryId>,
    },
    /// The messages the agent pinned that the raw tail does not show, verbatim, rendered as a
    /// user message after the summaries (see the module docs); `messages` lists them.
    /// `elided`: a budget had no room for them, and `text` is a marker naming them.
    Pinned {
        text: String,
        tokens: u64,
        messages: Vec<MessageId>,
        elided: bool,
    },
    /// The commitments the summaries left open and nothing after fulfilled, rendered as a user
    /// message after the summaries (see the module docs); `open` lists them all, `text` shows
    /// the newest `shown` of them ([`BLOCK_COMMITMENTS`] at most; fewer only when fitting a
    /// budget could do nothing else).
    Commitments {
        text: String,
        tokens: u64,
        open: Vec<Commitment>,
        shown: usize,
    },
}

/// Most commitments the open-commitments block lists (the newest).
pub const BLOCK_COMMITMENTS: usize = 12;

impl ContextItem {
    /// Tokens of this item in a context.
    pub fn tokens(&self) -> u64 {
        match self {
            ContextItem::Summary { summary, .. } => u64::from(summary.token_count),
            ContextItem::Message(m) => u64::from(m.token_count),
            ContextItem::Elided { tokens, .. }
            | ContextItem::Commitments { tokens, .. }
            | ContextItem::Pinned { tokens, .. } => *tokens,
        }
    }
}

/// Why a context cannot be made to fit its budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the context cannot fit in {budget} tokens: the system prompt ({system} tokens) and the smallest form of the context ({needed} tokens) do not fit"
)]
pub struct BudgetError {
    pub budget: u64,
    pub system: u64,
    pub needed: u64,
}

/// A session's context, ready to render.
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledContext {
    pub session: SessionId,
    pub state: ContextState,
    pub items: Vec<ContextItem>,
    /// Sum of the items' stored token counts.
    pub tokens: u64,
}

/// Items of one kind in a context and the tokens they take.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    pub items: u64,
    pub tokens: u64,
}

/// What a context spends its tokens on, by kind of item ([`AssembledContext::breakdown`]),
/// for users who ask what is in their context and why. The tallies add up to the context's
/// `tokens` and its number of items.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ContextBreakdown {
    /// The top-level summaries (a forgotten one counts its pointer).
    pub summaries: Tally,
    /// The pinned block (at most one; its marker when a budget left it out).
    pub pinned: Tally,
    /// The open-commitments block (at most one).
    pub commitments: Tally,
    /// The raw messages (one whose large parts are shown as file references, or a forgotten
    /// one, counts what it shows).
    pub messages: Tally,
    /// The markers naming what fitting a budget left out.
    pub elided: Tally,
}

/// Reads a session's context (one read snapshot of the store).
pub fn assemble(store: &Store, session: SessionId) -> Result<AssembledContext, StoreError> {
    let reader = store.reader()?;
    let counter = store.counter();
    let state = reader.context(session)?;
    let marks = Marks::read(&reader, session)?;
    let mut items = Vec::with_capacity(state.summaries.len() + 32);
    for id in &state.summaries {
        let mut summary = reader.summary(*id)?;
        let rendered = if marks.is_forgotten(NodeRef::Summary(*id)) {
            forgotten_summary(&mut summary, counter)
        } else {
            render_summary(&summary)
        };
        items.push(ContextItem::Summary { summary, rendered });
    }
    let large = store.file_rules().large_file_tokens;
    let raw = reader.session_messages(session, state.raw_from..u64::MAX)?;
    let pinned = marks
        .pinned
        .iter()
        .map(|id| reader.message(*id))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(block) = pinned_block(&reader, session, &state, &pinned, large, counter)? {
        items.push(block);
    }
    if let Some(block) = commitments_block(&reader, &state.summaries, &raw, counter)? {
        items.push(block);
    }
    for m in raw {
        let forgotten = marks.is_forgotten(NodeRef::Message(m.id));
        let m = shown_message(&reader, m, large)?;
        items.push(ContextItem::Message(if forgotten {
            forgotten_message(m, counter)
        } else {
            m
        }));
    }
    let tokens = items.iter().map(ContextItem::tokens).sum();
    Ok(AssembledContext {
        session,
        state,
        items,
        tokens,
    })
}

/// The agent's marks on one session's context, as assembly and compaction read them.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    forgotten: HashSet<NodeRef>,
    /// Pinned messages, in id order.
    pinned: Vec<MessageId>,
}

impl Marks {
    pub(crate) fn read(reader: &StoreReader, session: SessionId) -> Result<Marks, StoreError> {
        let mut marks = Marks::default();
        for marked in reader.marks(session)? {
            match (marked.mark, marked.node) {
                (ContextMark::Forgotten, node) => {
                    marks.forgotten.insert(node);
                }
                (ContextMark::Pinned, NodeRef::Message(id)) => marks.pinned.push(id),
                // Only messages are pinned (the store pins nothing else).
                (ContextMark::Pinned, NodeRef::Summary(_)) => {}
            }
        }
        Ok(marks)
    }

    pub(crate) fn is_forgotten(&self, node: NodeRef) -> bool {
        self.forgotten.contains(&node)
    }
}

/// `m` as a context shows it once forgotten: one pointer naming it, its tool calls and results
/// kept as parts carrying the pointer (so a call and its result still pair), everything else
/// left out; its token count is the pointer's.
pub fn forgotten_message(mut m: Message, counter: TokenCounter) -> Message {
    let parts = m.parts.len();
    let what = format!(
        "{} message of {parts} part{}",
        m.role,
        if parts == 1 { "" } else { "s" }
    );
    let pointer = render_forgotten(&m.id.to_string(), &what, u64::from(m.token_count));
    let mut parts: Vec<Part> = Vec::new();
    for part in &m.parts {
        if matches!(part, Part::ToolCall { .. } | Part::ToolResult { .. }) {
            let text = if parts.is_empty() {
                pointer.clone()
            } else {
                format!("(forgotten with {})", m.id)
            };
            parts.push(shown_part(part, text));
        }
    }
    if parts.is_empty() {
        parts.push(Part::Text { text: pointer });
    }
    m.token_count = counter.count_message(m.role, &parts);
    m.parts = parts;
    m
}

/// The pointer a forgotten summary is shown as; sets `summary`'s token count to the
/// pointer's (its content stays).
pub fn forgotten_summary(summary: &mut Summary, counter: TokenCounter) -> String {
    let what = format!(
        "{} summary, depth {}, {} messages from {} to {}",
        summary.kind.as_str(),
        summary.depth,
        summary.descendant_messages,
        summary.earliest_at,
        summary.latest_at
    );
    let pointer = render_forgotten(
        &summary.id.to_string(),
        &what,
        u64::from(summary.token_count),
    );
    summary.token_count =
        u32::try_from(counter.count_text(&pointer) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS))
            .unwrap_or(u32::MAX);
    pointer
}

/// The pinned block `session`'s context shows with `state`: the messages of `pinned` its raw
/// tail does not show (summarised ones, or another session's), verbatim as contexts show them,
/// in `pinned`'s order; `None` when there are none. `pinned` is the session's pinned messages
/// ([`StoreReader::marks`]), as read from the store.
pub fn pinned_block(
    reader: &StoreReader,
    session: SessionId,
    state: &ContextState,
    pinned: &[Message],
    large_file_tokens: u32,
    counter: TokenCounter,
) -> Result<Option<ContextItem>, StoreError> {
    let mut shown = Vec::new();
    for m in pinned {
        if m.session == session && m.seq >= state.raw_from {
            continue;
        }
        shown.push(shown_message(reader, m.clone(), large_file_tokens)?);
    }
    if shown.is_empty() {
        return Ok(None);
    }
    let text = render_pinned(&shown);
    let tokens = counter.count_text(&text) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS);
    Ok(Some(ContextItem::Pinned {
        text,
        tokens,
        messages: shown.iter().map(|m| m.id).collect(),
        elided: false,
    }))
}

/// The pinned block's text: each message with its id, role and time, its parts as text.
pub fn render_pinned(messages: &[Message]) -> String {
    let mut text = String::from(
        "<lcm_pinned>\nPinned with lcm_pin: kept verbatim here though no longer in the recent messages (lcm_pin with unpin releases one).",
    );
    for m in messages {
        let _ = write!(
            text,
            "\n<message id=\"{}\" role=\"{}\" at=\"{}\">\n",
            m.id, m.role, m.created_at
        );
        let parts: Vec<String> = m.parts.iter().filter_map(part_as_text).collect();
        let shown = parts.join("\n");
        if shown.trim().is_empty() {
            text.push_str("(nothing a model is shown: reasoning only)");
        } else {
            text.push_str(shown.trim_end());
        }
        text.push_str("\n</message>");
    }
    text.push_str("\n</lcm_pinned>");
    text
}

/// The open-commitments block of a context: what the digests of `summaries` leave open, less
/// what the raw messages after them resolve; `None` when nothing is open.
fn commitments_block(
    reader: &StoreReader,
    summaries: &[SummaryId],
    raw: &[Message],
    counter: TokenCounter,
) -> Result<Option<ContextItem>, StoreError> {
    if summaries.is_empty() {
        return Ok(None);
    }
    let mut open = open_after(reader, summaries)?;
    if open.commitments.is_empty() {
        return Ok(None);
    }
    let done = resolutions(raw, &open);
    open.resolve(&done);
    if open.commitments.is_empty() {
        return Ok(None);
    }
    let text = render_open_commitments(&open.commitments);
    let tokens = counter.count_text(&text) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS);
    Ok(Some(ContextItem::Commitments {
        text,
        tokens,
        shown: open.commitments.len().min(BLOCK_COMMITMENTS),
        open: open.commitments,
    }))
}

/// What the digests of `summaries` (consecutive, oldest first) leave open. Summaries written
/// without a digest (before schema 5) count as having left nothing open.
pub(crate) fn open_after(
    reader: &StoreReader,
    summaries: &[SummaryId],
) -> Result<OpenItems, StoreError> {
    let mut digests = Vec::with_capacity(summaries.len());
    for id in summaries {
        digests.extend(reader.summary_digest(*id)?);
    }
    Ok(open_items(&digests))
}

/// The block's text: the newest [`BLOCK_COMMITMENTS`] open commitments with the message each
/// was made in, and how many older ones `lcm_describe` lists.
pub fn render_open_commitments(open: &[Commitment]) -> String {
    render_newest_commitments(open, BLOCK_COMMITMENTS)
}

/// The block's text listing the newest `shown` of `open` (none: only how many are open).
fn render_newest_commitments(open: &[Commitment], shown: usize) -> String {
    let newest = &open[open.len().saturating_sub(shown)..];
    let mut text = String::from(
        "<lcm_open_commitments>\nMade in messages now summarised, not yet fulfilled (expand an id for its context):",
    );
    for c in newest {
        text.push_str(&format!(
            "\n- {} ({}): {}",
            c.message,
            c.kind.as_str(),
            c.text
        ));
    }
    if newest.len() < open.len() {
        text.push_str(&format!(
            "\n- … {} {} (lcm_describe lists every commitment)",
            open.len() - newest.len(),
            if newest.is_empty() { "open" } else { "older" }
        ));
    }
    text.push_str("\n</lcm_open_commitments>");
    text
}

/// `m` as contexts show it: each part registered as a large file replaced by the file's
/// reference, and the token count of what is shown. Only messages over `large_file_tokens`
/// can have such parts (the store registers none in smaller ones), so others cost nothing.
pub fn shown_message(
    reader: &StoreReader,
    mut m: Message,
    large_file_tokens: u32,
) -> Result<Message, StoreError> {
    if m.token_count <= large_file_tokens {
        return Ok(m);
    }
    let Some(files) = reader.message_files(m.id)? else {
        return Ok(m);
    };
    if files.refs.iter().all(|r| r.inline) {
        return Ok(m);
    }
    for (index, part) in m.parts.iter_mut().enumerate() {
        if let Some(file) = files.replaced(index) {
            *part = shown_part(part, render_file_reference(&reader.file(file)?));
        }
    }
    m.token_count = files.context_tokens;
    Ok(m)
}

/// The text of a summary as the model sees it: a header the engine writes (never the model),
/// then the summary's content.
pub fn render_summary(s: &Summary) -> String {
    let covers = match s.kind {
        SummaryKind::Leaf => format!(
            "{}..{} ({} messages)",
            first_id(&s.sources),
            last_id(&s.sources),
            s.descendant_messages
        ),
        SummaryKind::Condensed => format!(
            "{} ({} summaries over {} messages)",
            s.sources
                .iter()
                .map(NodeRef::to_string)
                .collect::<Vec<_>>()
                .join(","),
            s.sources.len(),
            s.descendant_messages
        ),
    };
    let files = files_attribute(&s.file_ids);
    format!(
        "<lcm_summary id=\"{}\" kind=\"{}\" depth=\"{}\" from=\"{}\" to=\"{}\" covers=\"{}\"{}>\n{}\n</lcm_summary>\n(Expand {} with lcm_expand_query or lcm_describe for the exact messages.)",
        s.id,
        s.kind.as_str(),
        s.depth,
        s.earliest_at,
        s.latest_at,
        covers,
        files,
        s.content.trim_end(),
        s.id
    )
}

/// The ` files="file_1,file_4"` attribute of a summary's header (empty without files).
pub fn files_attribute(files: &[FileId]) -> String {
    if files.is_empty() {
        return String::new();
    }
    let list: Vec<String> = files.iter().map(FileId::to_string).collect();
    format!(" files=\"{}\"", list.join(","))
}

/// Tokens a system prompt costs beside a context (its text and a message's overhead).
pub fn system_prompt_tokens(counter: TokenCounter, system: &str) -> u64 {
    counter.count_text(system) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS)
}

fn first_id(sources: &[NodeRef]) -> String {
    sources.first().map_or_else(String::new, NodeRef::to_string)
}

fn last_id(sources: &[NodeRef]) -> String {
    sources.last().map_or_else(String::new, NodeRef::to_string)
}

impl AssembledContext {
    /// Makes the context fit `budget` tokens with `system_tokens` of system prompt beside it
    /// (see the module docs): unchanged when it fits; otherwise the oldest raw tool exchanges,
    /// then the oldest summaries, are replaced by markers naming them, then the largest parts
    /// of what remains by references with a head excerpt. Only when that is not enough, as last
    /// resorts: the pinned block by a marker naming its messages, then the open-commitments
    /// block listing fewer of the newest commitments, down to none (a line saying how many are
    /// open). Fails when even that does not fit.
    pub fn fit(
        mut self,
        budget: u64,
        system_tokens: u64,
        counter: TokenCounter,
    ) -> Result<AssembledContext, BudgetError> {
        let mut error = match self.clone().fit_items(budget, system_tokens, counter) {
            Ok(fitted) => return Ok(fitted),
            Err(error) => error,
        };
        if self.elide_pinned_block(counter) {
            match self.clone().fit_items(budget, system_tokens, counter) {
                Ok(fitted) => return Ok(fitted),
                Err(e) => error = e,
            }
        }
        while self.show_fewer_commitments(counter) {
            match self.clone().fit_items(budget, system_tokens, counter) {
                Ok(fitted) => return Ok(fitted),
                Err(e) => error = e,
            }
        }
        Err(error)
    }

    /// Replaces the pinned block by a marker naming its messages; false when there is none.
    fn elide_pinned_block(&mut self, counter: TokenCounter) -> bool {
        let Some(block) = self
            .items
            .iter()
            .position(|i| matches!(i, ContextItem::Pinned { elided: false, .. }))
        else {
            return false;
        };
        if let ContextItem::Pinned {
            messages, tokens, ..
        } = &self.items[block]
        {
            let text = render_elided_pins(messages, *tokens);
            let marker_tokens =
                counter.count_text(&text) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS);
            self.items[block] = ContextItem::Pinned {
                text,
                tokens: marker_tokens,
                messages: messages.clone(),
                elided: true,
            };
        }
        self.tokens = self.items.iter().map(ContextItem::tokens).sum();
        true
    }

    /// Renders the open-commitments block with one commitment fewer (the oldest shown goes);
    /// false when it lists none already, or there is no block.
    fn show_fewer_commitments(&mut self, counter: TokenCounter) -> bool {
        let Some(ContextItem::Commitments {
            text,
            tokens,
            open,
            shown,
        }) = self
            .items
            .iter_mut()
            .find(|i| matches!(i, ContextItem::Commitments { .. }))
        else {
            return false;
        };
        if *shown == 0 {
            return false;
        }
        *shown -= 1;
        *text = render_newest_commitments(open, *shown);
        *tokens = counter.count_text(text) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS);
        self.tokens = self.items.iter().map(ContextItem::tokens).sum();
        true
    }

    /// [`fit`](Self::fit) with the pinned block kept as it is.
    fn fit_items(
        mut self,
        budget: u64,
        system_tokens: u64,
        counter: TokenCounter,
    ) -> Result<AssembledContext, BudgetError> {
        let fail = |needed: u64| BudgetError {
            budget,
            system: system_tokens,
            needed,
        };
        let Some(room) = budget.checked_sub(system_tokens) else {
            return Err(fail(0));
        };
        if self.tokens <= room {
            return Ok(self);
        }
        // Markers of an earlier fit stay as they are (they name what is already left out).
        let (earlier_summaries, earlier_raw): (Vec<ContextItem>, Vec<ContextItem>) = self
            .items
            .iter()
            .filter(|i| matches!(i, ContextItem::Elided { .. }))
            .cloned()
            .partition(
                |i| matches!(i, ContextItem::Elided { summaries, .. } if !summaries.is_empty()),
            );
        // The open commitments are kept whole: they are what compaction must never lose; and
        // the pinned block (or its marker), which `fit` leaves out only as the last resort.
        let commitments: Option<ContextItem> = self
            .items
            .iter()
            .find(|i| matches!(i, ContextItem::Commitments { .. }))
            .cloned();
        let pinned: Option<ContextItem> = self
            .items
            .iter()
            .find(|i| matches!(i, ContextItem::Pinned { .. }))
            .cloned();
        let fixed = earlier_summaries
            .iter()
            .chain(&earlier_raw)
            .chain(&pinned)
            .chain(&commitments)
            .map(ContextItem::tokens)
            .sum::<u64>();
        let Some(room) = room.checked_sub(fixed) else {
            return Err(fail(fixed));
        };
        let summaries: Vec<ContextItem> = self
            .items
            .iter()
            .filter(|i| matches!(i, ContextItem::Summary { .. }))
            .cloned()
            .collect();
        let mut raw: Vec<Message> = self
            .items
            .drain(..)
            .filter_map(|i| match i {
                ContextItem::Message(m) => Some(m),
                _ => None,
            })
            .collect();
        let groups = exchange_starts(&raw);
        let tokens_of = |items: &[ContextItem]| items.iter().map(ContextItem::tokens).sum::<u64>();
        let raw_tokens =
            |raw: &[Message]| raw.iter().map(|m| u64::from(m.token_count)).sum::<u64>();

        // 1. The oldest raw exchanges, all but the newest, become one marker.
        let summary_tokens = tokens_of(&summaries);
        let mut cut = 0; // raw[..cut] elided
        let mut raw_marker: Option<ContextItem> = None;
        for &start in groups.iter().skip(1) {
            if summary_tokens + marker_tokens(&raw_marker) + raw_tokens(&raw[cut..]) <= room {
                break;
            }
            cut = start;
            raw_marker = Some(span_marker(self.session, &raw[..cut], counter));
        }
        let mut kept_raw = raw.split_off(cut);
        let tokens = |s: &[ContextItem], m: &Option<ContextItem>, r: &[Message]| {
            tokens_of(s) + marker_tokens(m) + raw_tokens(r)
        };

        // 2. The oldest summaries, as many as needed, become one marker.
        let mut summaries = summaries;
        let mut summary_marker: Option<ContextItem> = None;
        let mut dropped: Vec<Summary> = Vec::new();
        while !summaries.is_empty()
            && tokens(&summaries, &raw_marker, &kept_raw) + marker_tokens(&summary_marker) > room
        {
            if let ContextItem::Summary { summary, .. } = summaries.remove(0) {
                dropped.push(summary);
            }
            summary_marker = Some(summaries_marker(&dropped, counter));
        }

        // 3. The largest parts of the newest messages become references with a head excerpt.
        let mut shrunk = HashSet::new();
        while tokens(&summaries, &raw_marker, &kept_raw) + marker_tokens(&summary_marker) > room {
            if !shrink_largest_part(&mut kept_raw, &mut shrunk, counter) {
                let needed = tokens(&summaries, &raw_marker, &kept_raw)
                    + marker_tokens(&summary_marker)
                    + fixed;
                return Err(fail(needed));
            }
        }

        let mut items = Vec::with_capacity(summaries.len() + kept_raw.len() + 4);
        items.extend(earlier_summaries);
        items.extend(summary_marker);
        items.extend(summaries);
        items.extend(pinned);
        items.extend(commitments);
        items.extend(earlier_raw);
        items.extend(raw_marker);
        items.extend(kept_raw.into_iter().map(ContextItem::Message));
        self.tokens = tokens_of(&items);
        self.items = items;
        debug_assert!(self.tokens <= room + fixed);
        Ok(self)
    }
}

fn marker_tokens(marker: &Option<ContextItem>) -> u64 {
    marker.as_ref().map_or(0, ContextItem::tokens)
}

fn elided(
    text: String,
    messages: Option<(MessageId, MessageId)>,
    summaries: Vec<SummaryId>,
    counter: TokenCounter,
) -> ContextItem {
    let tokens = counter.count_text(&text) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS);
    ContextItem::Elided {
        text,
        tokens,
        messages,
        summaries,
    }
}

/// The marker for raw messages left out (`raw` is not empty).
fn span_marker(session: SessionId, raw: &[Message], counter: TokenCounter) -> ContextItem {
    let (first, last) = (raw[0].id, raw[raw.len() - 1].id);
    let stored: u64 = raw.iter().map(|m| u64::from(m.token_count)).sum();
    elided(
        render_elided_span(session, first, last, raw.len() as u64, stored),
        Some((first, last)),
        Vec::new(),
        counter,
    )
}

/// The marker for summaries left out (`dropped` is not empty).
fn summaries_marker(dropped: &[Summary], counter: TokenCounter) -> ContextItem {
    let ids: Vec<SummaryId> = dropped.iter().map(|s| s.id).collect();
    let messages: u64 = dropped.iter().map(|s| s.descendant_messages).sum();
    elided(render_elided_summaries(&ids, messages), None, ids, counter)
}

/// Indices in `raw` where a tool exchange starts: a message starts one unless it answers a
/// call made in the exchange before it (a call and its results go together).
fn exchange_starts(raw: &[Message]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut open: HashSet<&str> = HashSet::new();
    for (i, m) in raw.iter().enumerate() {
        let answers = m.parts.iter().any(|p| match p {
            Part::ToolResult { call_id, .. } => open.contains(call_id.as_str()),
            _ => false,
        });
        if !answers {
            starts.push(i);
            open.clear();
        }
        for p in &m.parts {
            if let Part::ToolCall { id, .. } = p {
                open.insert(id.as_str());
            }
        }
    }
    starts
}

/// Characters of a part kept as the head excerpt of its reference.
const HEAD_EXCERPT_CHARS: usize = 400;

/// Replaces the largest part of `raw` not replaced before (`shrunk`) and larger than a
/// reference (a long text, or an image) by a reference with a head excerpt, and recounts its
/// message; `false` when no part is worth replacing.
fn shrink_largest_part(
    raw: &mut [Message],
    shrunk: &mut HashSet<(usize, usize)>,
    counter: TokenCounter,
) -> bool {
    // Compared in bytes of text; an image as the bytes of text its tokens would take.
    let size = |part: &Part| match part {
        Part::Binary { .. } => BINARY_PART_TOKENS as usize * 4,
        other => other.searchable_text().map_or(0, |t| t.len()),
    };
    let mut best: Option<(usize, usize, usize)> = None; // (message, part, size)
    for (mi, m) in raw.iter().enumerate() {
        for (pi, part) in m.parts.iter().enumerate() {
            let len = size(part);
            if !shrunk.contains(&(mi, pi))
                && len > HEAD_EXCERPT_CHARS * 2
                && best.is_none_or(|(_, _, best_len)| len > best_len)
            {
                best = Some((mi, pi, len));
            }
        }
    }
    let Some((mi, pi, _)) = best else {
        return false;
    };
    shrunk.insert((mi, pi));
    let m = &mut raw[mi];
    // The part is counted once; the message's count changes by the difference (counts add up
    // part by part, `TokenCounter::count_message`).
    let part_tokens = counter.count_part(&m.parts[pi]);
    let head = match &m.parts[pi] {
        Part::Binary {
            media_type,
            byte_len,
        } => format!("[{media_type}, {byte_len} bytes, kept in the store]"),
        other => other
            .searchable_text()
            .map(|t| t.chars().take(HEAD_EXCERPT_CHARS).collect())
            .unwrap_or_default(),
    };
    let reference = render_part_reference(m.id, pi, part_tokens, &head);
    m.parts[pi] = shown_part(&m.parts[pi], reference);
    let shown_tokens = counter.count_part(&m.parts[pi]);
    m.token_count =
        u32::try_from(u64::from(m.token_count) - part_tokens + shown_tokens).unwrap_or(u32::MAX);
    true
}

/// Call ids that have both a call and a result in the context.
fn paired_calls(items: &[ContextItem]) -> HashSet<&str> {
    let mut calls = HashSet::new();
    let mut results = HashSet::new();
    for item in items {
        if let ContextItem::Message(m) = item {
            for part in &m.parts {
                match part {
                    Part::ToolCall { id, .. } => {
                        calls.insert(id.as_str());
                    }
                    Part::ToolResult { call_id, .. } => {
                        results.insert(call_id.as_str());
                    }
                    _ => {}
                }
            }
        }
    }
    calls.intersection(&results).copied().collect()
}

/// Text a part contributes when it is not sent structurally.
fn part_as_text(part: &Part) -> Option<String> {
    match part {
        Part::Text { text } => Some(text.clone()),
        // Reasoning stays in the store; providers do not take it back as input.
        Part::Reasoning { .. } => None,
        Part::ToolCall {
            id,
            name,
            arguments,
        } => Some(format!("[tool call {id}: {name} {arguments}]")),
        Part::ToolResult {
            call_id,
            content,
            is_error,
        } => Some(format!(
            "[tool result for {call_id}{}]\n{content}",
            if *is_error { " (error)" } else { "" }
        )),
        Part::File { path, .. } => Some(format!("[file {path}]")),
        Part::Binary {
            media_type,
            byte_len,
        } => Some(format!(
            "[{media_type}, {byte_len} bytes, kept in the store]"
        )),
        Part::Opaque { kind, json } => Some(format!("[{kind}] {json}")),
    }
}

impl AssembledContext {
    /// Its items and tokens by kind of item.
    pub fn breakdown(&self) -> ContextBreakdown {
        let mut breakdown = ContextBreakdown::default();
        for item in &self.items {
            let tally = match item {
                ContextItem::Summary { .. } => &mut breakdown.summaries,
                ContextItem::Commitments { .. } => &mut breakdown.commitments,
                ContextItem::Pinned { .. } => &mut breakdown.pinned,
                ContextItem::Message(_) => &mut breakdown.messages,
                ContextItem::Elided { .. } => &mut breakdown.elided,
            };
            tally.items += 1;
            tally.tokens += item.tokens();
        }
        breakdown
    }

    /// The context as the daemon's context route and the MCP `lcm_context` tool answer with
    /// it: the session, the `window` asked for, the items' tokens, the system prompt's
    /// (`system_tokens`, 0 without one), the [`breakdown`](Self::breakdown), the context
    /// state, and the body in `format`'s shape (OpenAI `messages`, or Anthropic `system` and
    /// `messages`).
    pub fn to_response(
        &self,
        window: u64,
        format: ToolFormat,
        system: Option<&str>,
        counter: TokenCounter,
    ) -> Value {
        let mut out = json!({
            "session": self.session,
            "budget": window,
            "tokens": self.tokens,
            "system_tokens": system.map_or(0, |s| system_prompt_tokens(counter, s)),
            "breakdown": self.breakdown(),
            "summaries": self.state.summaries,
            "raw_from": self.state.raw_from,
        });
        match format {
            ToolFormat::OpenAi => {
                out["format"] = json!("openai");
                out["messages"] = Value::Array(self.to_openai(system));
            }
            ToolFormat::Anthropic => {
                out["format"] = json!("anthropic");
                match self.to_anthropic(system) {
                    Value::Object(fields) => {
                        for (k, v) in fields {
                            out[k.as_str()] = v;
                        }
                    }
                    other => out["messages"] = other,
                }
            }
        }
        out
    }

    /// The context as an OpenAI Chat Completions `messages` array.
    pub fn to_openai(&self, system: Option<&str>) -> Vec<Value> {
        let paired = paired_calls(&self.items);
        let mut out = Vec::with_capacity(self.items.len() + 1);
        if let Some(system) = system {
            out.push(json!({"role": "system", "content": system}));
        }
        for item in &self.items {
            match item {
                ContextItem::Summary { rendered, .. }
                | ContextItem::Elided { text: rendered, .. }
                | ContextItem::Pinned { text: rendered, .. }
                | ContextItem::Commitments { text: rendered, .. } => {
                    out.push(json!({"role": "user", "content": rendered}));
                }
                ContextItem::Message(m) => openai_message(m, &paired, &mut out),
            }
        }
        out
    }

    /// The context as an Anthropic Messages request body's `system` and `messages`.
    /// Consecutive messages of one role are merged (the API requires alternation), and the
    /// first message is a user message.
    pub fn to_anthropic(&self, system: Option<&str>) -> Value {
        let paired = paired_calls(&self.items);
        let mut system_text: Vec<String> = system.map(str::to_owned).into_iter().collect();
        let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
        let mut push = |role: &'static str, blocks: Vec<Value>| {
            if blocks.is_empty() {
                return;
            }
            match turns.last_mut() {
                Some((last, existing)) if *last == role => existing.extend(blocks),
                _ => turns.push((role, blocks)),
            }
        };
        for item in &self.items {
            match item {
                ContextItem::Summary { rendered, .. }
                | ContextItem::Elided { text: rendered, .. }
                | ContextItem::Pinned { text: rendered, .. }
                | ContextItem::Commitments { text: rendered, .. } => {
                    push("user", vec![json!({"type": "text", "text": rendered})]);
                }
                ContextItem::Message(m) => {
                    if m.role == Role::System {
                        system_text.extend(m.parts.iter().filter_map(part_as_text));
                        continue;
                    }
                    let mut blocks = Vec::new();
                    for part in &m.parts {
                        match part {
                            Part::ToolCall {
                                id,
                                name,
                                arguments,
                            } if paired.contains(id.as_str()) => {
                                let input: Value = serde_json::from_str(arguments)
                                    .unwrap_or_else(|_| json!({"arguments": arguments}));
                                blocks.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
                            }
                            Part::ToolResult {
                                call_id,
                                content,
                                is_error,
                            } if paired.contains(call_id.as_str()) => {
                                blocks.push(json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}));
                            }
                            other => {
                                // The API refuses whitespace-only text blocks (transcripts
                                // have them, e.g. Claude Code's "\n\n" between blocks).
                                if let Some(text) = part_as_text(other)
                                    && !text.trim().is_empty()
                                {
                                    blocks.push(json!({"type": "text", "text": text}));
                                }
                            }
                        }
                    }
                    let role = if m.role == Role::Assistant {
                        "assistant"
                    } else {
                        "user"
                    };
                    push(role, blocks);
                }
            }
        }
        if turns.first().is_some_and(|(role, _)| *role == "assistant") {
            turns.insert(
                0,
                (
                    "user",
                    vec![json!({"type": "text", "text": "(conversation continues)"})],
                ),
            );
        }
        let messages: Vec<Value> = turns
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect();
        let mut body = json!({ "messages": messages });
        if !system_text.is_empty() {
            body["system"] = Value::String(system_text.join("\n\n"));
        }
        body
    }
}

fn openai_message(m: &Message, paired: &HashSet<&str>, out: &mut Vec<Value>) {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for part in &m.parts {
        match part {
            Part::ToolCall {
                id,
                name,
                arguments,
            } if paired.contains(id.as_str()) => {
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
            }
            Part::ToolResult {
                call_id, content, ..
            } if paired.contains(call_id.as_str()) => {
                results.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}));
            }
            other => text.extend(part_as_text(other)),
        }
    }
    if m.role == Role::Assistant {
        // Transcripts often store one assistant turn as several entries (text, then each tool
        // call): merge them, since every tool call of an assistant message must be answered
        // before the next assistant message.
        let merge = out.last().is_some_and(|last| last["role"] == "assistant");
        if merge && let Some(last) = out.last_mut() {
            if !text.is_empty() {
                let joined = match last["content"].as_str() {
                    Some(existing) => format!("{existing}\n{}", text.join("\n")),
                    None => text.join("\n"),
                };
                last["content"] = Value::String(joined);
            }
            if !calls.is_empty() {
                match last["tool_calls"].as_array_mut() {
                    Some(existing) => existing.extend(calls),
                    None => last["tool_calls"] = Value::Array(calls),
                }
            }
        } else if !text.is_empty() || !calls.is_empty() {
            let mut message = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text.join("\n")) }});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            out.push(message);
        }
        out.extend(results);
        return;
    }
    // Results first: they must directly follow the assistant message that made the calls.
    out.extend(results);
    if !text.is_empty() {
        let role = if m.role == Role::System {
            "system"
        } else {
            "user"
        };
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
}
