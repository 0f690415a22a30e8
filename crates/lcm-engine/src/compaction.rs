//! The compaction control loop (paper sections 2.1 and 2.3).
//!
//! A compaction run repeats one **pass** at a time while the context is above its goal (the
//! soft threshold), aiming at `target_fill` of the budget:
//! - a **leaf pass** over the oldest raw span outside the fresh tail, just long enough to bring
//!   the context down to the aim (at most `leaf_chunk_tokens`), ending where no tool call is
//!   separated from its result: the raw history that fits above the aim stays raw, so the
//!   window is used rather than left half empty. A span cut short by the chunk (small
//!   messages followed by one larger than it) that is smaller than a leaf summary's target, or
//!   too small to pay for its summary's header at all, takes the next message or tool exchange
//!   too, past the chunk if need be;
//! - a **condensed pass** when no leaf pass can reach the aim and `condensed_fanout` summaries
//!   of one depth sit side by side in the context (the oldest such run), into one summary a
//!   level deeper. When no two summaries of one depth stand together and no raw message can be
//!   spared, neighbours of different depths merge (one deeper than the deepest, choosing the
//!   run that deepens the DAG least) rather than a lone summary being re-summarised deeper.
//!
//! A run assembles the context once and patches it after each applied pass (the summary in
//! place of its sources, as the store wrote it), so a pass costs its own span however much raw
//! history waits; the context is assembled again before the run ends, so its report and its
//! decision to stop are measured on the real context.
//!
//! Every summary has a [`Digest`] of its span (requests, files, commands, errors, open
//! commitments; see `lcm_core::digest`): built from the messages for a leaf, with the items the
//! summaries before it left open, merged from the sources' digests for a condensed summary.
//! It is stored with the summary, rendered by the structured offline summariser, and the
//! span's open commitments are appended to whatever text the summariser wrote.
//!
//! Every pass planned covers enough tokens that its summary is smaller than what it replaces;
//! candidates too small for that are passed over, so a run only ends early when no pass at all
//! is possible.
//!
//! Each pass reads its span, summarises it with three-level escalation (at most two provider
//! calls; the third level is deterministic), and applies the summary with
//! [`Store::apply_summary`], which swaps it into the context in the same transaction that
//! writes it, or refuses if the span changed meanwhile (the pass is then planned again). A run
//! writes at most `max_passes` summaries, so its provider calls are bounded by twice that, and
//! plans at most twice that many passes.
//!
//! Goal and convergence: a run started at the soft threshold aims below it. If the fresh tail
//! alone keeps the context above the **hard** threshold, the tail is compacted too, down to its
//! last two messages; and if no raw span is left, the oldest summaries are condensed again (a
//! single one too, while it is large enough for even the smallest summary to save
//! `MIN_SUMMARY_TOKENS` on it). Summary targets never exceed a third of the input, so small
//! spans shrink too. A summary that would not be smaller than what it replaces (by
//! `MIN_SUMMARY_TOKENS`, for a lone one) is not applied, and the run ends there: planning again
//! would give the same pass. So every run ends under the hard threshold whenever the last two
//! messages and the smallest summaries fit in it, and never writes a chain of summaries that
//! do not shrink; what still does not fit, `AssembledContext::fit` leaves out of the request.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use lcm_core::config::CompactionConfig;
use lcm_core::digest::{Commitment, CommitmentKind, Digest};
use lcm_core::ids::{FileId, MessageId, SessionId, SummaryId};
use lcm_core::message::{Message, Part};
use lcm_core::summary::{ContextState, NewSummary, NodeRef, Summary, SummaryKind};
use lcm_core::tokens::TokenCounter;
use lcm_llm::prompts::{message_header, summary_header};
use lcm_llm::structured::{commitments_section, extract};
use lcm_llm::summarize::{Summarizer, SummaryRequest, summarize_with_escalation};
use lcm_store::{ApplyOutcome, Store, StoreError, StoreReader};
use serde::Serialize;

use crate::assembly::{
    AssembledContext, ContextItem, Marks, assemble, files_attribute, forgotten_message,
    forgotten_summary, open_after, render_summary, shown_message,
};

/// Tokens reserved for the header the engine adds to every summary (id, kind, depth, times,
/// covered ids, files); checked against real renderings in the tests.
pub const SUMMARY_HEADER_TOKENS: u32 = 120;

/// Smallest useful summary text; spans that cannot beat header + this are left alone.
const MIN_SUMMARY_TOKENS: u32 = 32;

/// A span must cover more than this to be worth a summary: the summary pays for its header and
/// the smallest useful text, and the escalation makes its text smaller than the rest, so every
/// pass over a span above it shrinks the context.
const MIN_SPAN_TOKENS: u32 = SUMMARY_HEADER_TOKENS + MIN_SUMMARY_TOKENS;

/// Whether a span of `tokens` is worth summarising (see [`MIN_SPAN_TOKENS`]).
fn worth_summarising(tokens: u64) -> bool {
    tokens > u64::from(MIN_SPAN_TOKENS)
}

/// Whether a lone summary of `tokens` is worth summarising again, one level deeper: only when
/// even the smallest summary ([`MIN_SPAN_TOKENS`]) would save [`MIN_SUMMARY_TOKENS`] on it.
/// (A summary not much above that floor can only be rewritten at about its size: re-summarising
/// it again and again built chains of dozens of summaries of one size, one per pass.)
fn worth_summarising_alone(tokens: u64) -> bool {
    tokens >= u64::from(MIN_SPAN_TOKENS + MIN_SUMMARY_TOKENS)
}

/// Whether a summary of `output` tokens is worth applying in place of sources of `input`
/// tokens: it must be smaller, and a lone summary summarised again must save at least
/// [`MIN_SUMMARY_TOKENS`] (see [`worth_summarising_alone`]).
fn saves_enough(input: u32, output: u32, lone: bool) -> bool {
    let floor = if lone { MIN_SUMMARY_TOKENS } else { 1 };
    input.saturating_sub(output) >= floor
}

/// Messages of the tail kept raw even when the hard threshold forces compacting into the tail.
const MIN_RAW_MESSAGES: usize = 2;

/// What one pass will summarise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pass {
    Leaf {
        messages: Vec<MessageId>,
    },
    Condensed {
        depth: u32,
        summaries: Vec<SummaryId>,
    },
}

/// One pass that was applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PassReport {
    pub summary: SummaryId,
    pub kind: SummaryKind,
    pub depth: u32,
    pub sources: usize,
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub level: u8,
    pub provider_calls: u32,
}

/// What a compaction run did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompactionReport {
    pub session: SessionId,
    pub budget: u64,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub passes: Vec<PassReport>,
    /// Prepared summaries discarded because their span changed before they were applied.
    pub stale: u32,
    pub provider_calls: u32,
    /// Whether the run ended below its goal (the soft threshold).
    pub reached_goal: bool,
    /// Summaries written by the summariser but not applied because they would not have
    /// saved enough over what they replace (see the module doc); the run ends at the first.
    pub unproductive: u32,
}

impl CompactionReport {
    /// Summaries written at escalation levels 1, 2 and 3 (a level outside 1..=3 counts as 3).
    pub fn summaries_by_level(&self) -> [u32; 3] {
        let mut by_level = [0u32; 3];
        for pass in &self.passes {
            by_level[usize::from(pass.level.clamp(1, 3)) - 1] += 1;
        }
        by_level
    }
}

/// Why a compaction could not run.
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Budget(#[from] crate::assembly::BudgetError),
    #[error("budget must be positive")]
    ZeroBudget,
    #[error("compaction was cancelled: {0}")]
    Cancelled(String),
}

/// The budget compaction and assembly work against: the model's window less the configured
/// safety margin (`tokenizer.safety_margin`), which absorbs the difference between our counts and
/// a provider's for models whose tokenizer is not public.
pub fn effective_budget(window: u64, safety_margin: f64) -> u64 {
    ((window as f64) * (1.0 - safety_margin.clamp(0.0, 0.5))).floor() as u64
}

/// Whether the context needs compaction at all (above the soft threshold).
pub fn needs_compaction(tokens: u64, budget: u64, config: &CompactionConfig) -> bool {
    config.thresholds(budget).above_soft(tokens)
}

/// Runs passes until the context is under the soft threshold of `budget` (or nothing more can
/// be compacted), calling `progress` after each applied pass.
///
/// Store calls run on the calling task (fine for the CLI and tests); the actor runtime uses
/// [`compact_shared`], which moves them to the blocking pool.
pub async fn compact(
    store: &Store,
    session: SessionId,
    budget: u64,
    config: &CompactionConfig,
    summarizer: &dyn Summarizer,
    progress: impl FnMut(&PassReport) + Send,
) -> Result<CompactionReport, CompactionError> {
    let mut observer = ProgressObserver(progress);
    run(
        StoreAccess::Borrowed(store),
        session,
        budget,
        config,
        summarizer,
        &mut observer,
    )
    .await
}

/// [`compact`] for async hosts: every store call runs on tokio's blocking pool, so the task
/// never blocks a runtime worker on redb; `observer` sees each pass before and after its commit.
pub async fn compact_shared(
    store: Arc<Store>,
    session: SessionId,
    budget: u64,
    config: &CompactionConfig,
    summarizer: &dyn Summarizer,
    observer: &mut (dyn CompactionObserver + Send),
) -> Result<CompactionReport, CompactionError> {
    run(
        StoreAccess::Shared(store),
        session,
        budget,
        config,
        summarizer,
        observer,
    )
    .await
}

/// Sees each pass of a compaction run around its commit (progress reports, fault injection).
pub trait CompactionObserver {
    /// Just before the summary is applied (the redb write transaction).
    fn before_apply(&mut self, _summary: &NewSummary) {}
    /// Just after the summary was committed.
    fn after_apply(&mut self, _pass: &PassReport) {}
}

/// Nobody watches: `&mut ()` for a run without progress reports.
impl CompactionObserver for () {}

struct ProgressObserver<F>(F);

impl<F: FnMut(&PassReport)> CompactionObserver for ProgressObserver<F> {
    fn after_apply(&mut self, pass: &PassReport) {
        (self.0)(pass)
    }
}

/// How a compaction run reaches the store: directly, or through the blocking pool.
enum StoreAccess<'a> {
    Borrowed(&'a Store),
    Shared(Arc<Store>),
}

impl StoreAccess<'_> {
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> Result<T, CompactionError> {
        match self {
            StoreAccess::Borrowed(store) => Ok(f(store)),
            StoreAccess::Shared(store) => {
                let store = Arc::clone(store);
                tokio::task::spawn_blocking(move || f(&store))
                    .await
                    .map_err(|e| match e.try_into_panic() {
                        // A panic in a store call is the caller's panic (supervision sees it).
                        Ok(payload) => std::panic::resume_unwind(payload),
                        Err(e) => CompactionError::Cancelled(e.to_string()),
                    })
            }
        }
    }

    fn counter(&self) -> TokenCounter {
        match self {
            StoreAccess::Borrowed(store) => store.counter(),
            StoreAccess::Shared(store) => store.counter(),
        }
    }
}

async fn run(
    store: StoreAccess<'_>,
    session: SessionId,
    budget: u64,
    config: &CompactionConfig,
    summarizer: &dyn Summarizer,
    observer: &mut (dyn CompactionObserver + Send),
) -> Result<CompactionReport, CompactionError> {
    if budget == 0 {
        return Err(CompactionError::ZeroBudget);
    }
    let counter = store.counter();
    let thresholds = config.thresholds(budget);
    let (goal, hard, aim) = (thresholds.soft, thresholds.hard, thresholds.target);
    // The context the passes are planned on: assembled once, then patched after each pass
    // (the summary in place of its sources), so a pass costs the same however much raw
    // history waits behind it. A patched context is exact but for the open-commitments block
    // (and messages appended meanwhile): it is assembled again before the run may end.
    let mut ctx = store.with(move |s| assemble(s, session)).await??;
    let mut patched = false;
    let tokens_before = ctx.tokens;
    let mut report = CompactionReport {
        session,
        budget,
        tokens_before,
        tokens_after: tokens_before,
        passes: Vec::new(),
        stale: 0,
        provider_calls: 0,
        reached_goal: tokens_before <= goal,
        unproductive: 0,
    };
    let mut attempts = 0;
    loop {
        let planned = if report.unproductive == 0
            && report.tokens_after > goal
            && report.passes.len() < config.max_passes
        {
            let tail_max_tokens = (config.fresh_tail_max_share * budget as f64) as u64;
            let excess = ctx.tokens.saturating_sub(aim);
            plan(
                &ctx.items,
                config,
                ctx.tokens > hard,
                tail_max_tokens,
                excess,
            )
        } else {
            None
        };
        let Some(pass) = planned else {
            if !patched {
                break;
            }
            // Before ending, measure the real context (and plan on it if it is still above).
            ctx = store.with(move |s| assemble(s, session)).await??;
            patched = false;
            report.tokens_after = ctx.tokens;
            continue;
        };
        attempts += 1;
        if attempts > config.max_passes * 2 {
            break; // Only reachable if spans keep changing under us; never loop forever.
        }
        let prepare_config = config.clone();
        let prepared_pass = pass.clone();
        let (mut request, sources, kind, depth, files) = store
            .with(move |s| prepare(s, session, &prepared_pass, &prepare_config))
            .await??;
        // The summary must pay for its header too, or the pass would grow the context. `plan`
        // only proposes spans worth it, measured on the stored counts `prepare` reads too, so
        // this only fails if the context changed meanwhile: plan again on a fresh assembly
        // (bounded by `attempts`) rather than end the run while other passes may be possible.
        if !worth_summarising(u64::from(request.input_tokens)) {
            ctx = store.with(move |s| assemble(s, session)).await??;
            patched = false;
            report.tokens_after = ctx.tokens;
            continue;
        }
        request.input_tokens -= SUMMARY_HEADER_TOKENS;
        // Open commitments are carried in every summary that covers them, whichever summariser
        // writes the rest: the section is the engine's, and the summariser's target leaves room
        // for it. The whole must stay smaller than what it replaces (or passes would not
        // converge): when it would not, only the newest commitments that fit are listed (the
        // digest keeps them all).
        // Requests are listed by the summary's own requests section (and in the context's
        // block while open); the text carries the agent's intents and to-dos.
        let open: Vec<Commitment> = request
            .digest
            .as_ref()
            .map(|d| {
                d.commitments
                    .iter()
                    .filter(|c| c.kind != CommitmentKind::Request)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let commitments_tokens = count_u32(counter, &summary_commitments(&open));
        request.target_tokens = request
            .target_tokens
            .saturating_sub(commitments_tokens)
            .max(MIN_SUMMARY_TOKENS);
        let outcome = summarize_with_escalation(summarizer, counter, &request).await;
        report.provider_calls += outcome.calls;
        let content = with_commitments(counter, outcome.text, &open, request.input_tokens);
        // The header names every file under the summary: its stored count pays for them too.
        let token_count = summary_tokens(counter, &content) + files_tokens(counter, &files);
        // A summary that would not save enough is not written, and the run plans nothing more:
        // it would plan the same pass again (the structured summariser writes a condensed
        // summary from its sources' digests, so a lone summary comes out the same).
        let lone = kind == SummaryKind::Condensed && sources.len() == 1;
        let replaced = request.input_tokens + SUMMARY_HEADER_TOKENS;
        if !saves_enough(replaced, token_count, lone) {
            report.unproductive += 1;
            continue;
        }
        let new = NewSummary {
            session,
            kind,
            depth,
            content,
            token_count,
            sources: sources.clone(),
            level: outcome.level.number(),
            model: outcome.model,
            digest: request.digest,
        };
        observer.before_apply(&new);
        match store
            .with(move |s| s.apply_summary(new, Vec::new()))
            .await??
        {
            ApplyOutcome::Applied { summary, context } => {
                let pass_report = PassReport {
                    summary: summary.id,
                    kind,
                    depth,
                    sources: sources.len(),
                    input_tokens: replaced,
                    output_tokens: token_count,
                    level: summary.level,
                    provider_calls: outcome.calls,
                };
                observer.after_apply(&pass_report);
                report.passes.push(pass_report);
                if patch(&mut ctx, &pass, summary, context) {
                    patched = true;
                } else {
                    ctx = store.with(move |s| assemble(s, session)).await??;
                    patched = false;
                }
            }
            ApplyOutcome::Stale { .. } => {
                report.stale += 1;
                ctx = store.with(move |s| assemble(s, session)).await??;
                patched = false;
            }
        }
        report.tokens_after = ctx.tokens;
    }
    report.reached_goal = report.tokens_after <= goal;
    Ok(report)
}

/// Puts an applied pass's summary in place of its sources in `ctx`, as the store did in the
/// same transaction (`context` is the state it wrote), so the next pass plans without reading
/// the raw history again. The open-commitments block is left as it was (the run assembles the
/// context again before it ends). Returns false, leaving `ctx` to be assembled again, when the
/// sources are not where the pass found them.
fn patch(ctx: &mut AssembledContext, pass: &Pass, summary: Summary, context: ContextState) -> bool {
    let summaries_end = ctx
        .items
        .iter()
        .position(|i| !matches!(i, ContextItem::Summary { .. }))
        .unwrap_or(ctx.items.len());
    let (start, len) = match pass {
        Pass::Leaf { messages } => {
            let Some(first) = ctx
                .items
                .iter()
                .position(|i| matches!(i, ContextItem::Message(_)))
            else {
                return false;
            };
            (first, messages.len())
        }
        Pass::Condensed { summaries, .. } => {
            let Some(first) = ctx.items[..summaries_end].iter().position(
                |i| matches!(i, ContextItem::Summary { summary, .. } if Some(&summary.id) == summaries.first()),
            ) else {
                return false;
            };
            (first, summaries.len())
        }
    };
    let sources: Vec<NodeRef> = match pass {
        Pass::Leaf { messages } => messages.iter().map(|id| NodeRef::Message(*id)).collect(),
        Pass::Condensed { summaries, .. } => {
            summaries.iter().map(|id| NodeRef::Summary(*id)).collect()
        }
    };
    let found = ctx.items.get(start..start + len).is_some_and(|items| {
        items
            .iter()
            .zip(&sources)
            .all(|(item, source)| match (item, source) {
                (ContextItem::Message(m), NodeRef::Message(id)) => m.id == *id,
                (ContextItem::Summary { summary, .. }, NodeRef::Summary(id)) => summary.id == *id,
                _ => false,
            })
    });
    if !found {
        return false;
    }
    let rendered = render_summary(&summary);
    let item = ContextItem::Summary { summary, rendered };
    match pass {
        // A leaf joins the end of the summaries; its messages were the oldest raw ones.
        Pass::Leaf { .. } => {
            ctx.items.drain(start..start + len);
            ctx.items.insert(summaries_end, item);
        }
        Pass::Condensed { .. } => {
            ctx.items.splice(start..start + len, [item]);
        }
    }
    ctx.state = context;
    ctx.tokens = ctx.items.iter().map(ContextItem::tokens).sum();
    true
}

/// A top-level summary as the planner sees it: id, depth and tokens.
type TopSummary = (SummaryId, u32, u64);

/// Chooses the next pass for a context, or `None` when nothing can be compacted.
/// `over_hard` allows compacting into the fresh tail (down to its last two messages). The
/// fresh tail also yields in tokens: it keeps only the newest messages that fit in
/// `tail_max_tokens` together, so a few huge messages cannot pin a context over its budget.
/// `excess` is how many tokens the run still wants to remove (down to `target_fill`): a leaf
/// span stops at the first closed prefix whose summary would remove that much, so the raw
/// history above the aim stays raw; when a leaf pass cannot remove it, a run of `fanout`
/// same-depth summaries is condensed first.
///
/// Every pass it proposes covers more than a summary's header and smallest body
/// (`MIN_SPAN_TOKENS`), so applying it shrinks the context: a candidate too small for that is
/// passed over for the next one, never returned.
pub fn plan(
    items: &[ContextItem],
    config: &CompactionConfig,
    over_hard: bool,
    tail_max_tokens: u64,
    excess: u64,
) -> Option<Pass> {
    let summaries: Vec<TopSummary> = items
        .iter()
        .filter_map(|i| match i {
            ContextItem::Summary { summary, .. } => {
                Some((summary.id, summary.depth, u64::from(summary.token_count)))
            }
            _ => None,
        })
        .collect();
    let span_tokens = |span: &[TopSummary]| span.iter().map(|s| s.2).sum::<u64>();
    let ids = |span: &[TopSummary]| span.iter().map(|s| s.0).collect::<Vec<_>>();
    let fanout = config.condensed_fanout;

    // Leaf: the oldest raw span outside the fresh tail, just long enough to remove `excess`.
    let raw: Vec<&Message> = items
        .iter()
        .filter_map(|i| match i {
            ContextItem::Message(m) => Some(m),
            _ => None,
        })
        .collect();
    let keep = if over_hard {
        MIN_RAW_MESSAGES.min(config.fresh_tail)
    } else {
        config.fresh_tail
    };
    let keep = keep.min(tail_fitting(&raw, tail_max_tokens));
    let eligible = raw.len().saturating_sub(keep);
    // A span is preferably at least a leaf summary's target: below that, most of what the pass
    // writes is header, so a chunk cut short by a large next message takes that message too.
    let preferred = config.leaf_target_tokens.min(config.leaf_chunk_tokens);
    let leaf = leaf_span_end(
        &raw[..eligible],
        config.leaf_chunk_tokens,
        preferred,
        &|tokens| leaf_savings(tokens, config) >= excess,
    )
    .map(|end| {
        let tokens: u64 = raw[..end].iter().map(|m| u64::from(m.token_count)).sum();
        (end, tokens)
    });
    if let Some((end, tokens)) = leaf
        && leaf_savings(tokens, config) >= excess
    {
        return Some(Pass::Leaf {
            messages: raw[..end].iter().map(|m| m.id).collect(),
        });
    }

    // Condensed: the oldest run of `fanout` same-depth summaries side by side.
    let mut run_start = 0;
    for i in 0..summaries.len() {
        if summaries[i].1 != summaries[run_start].1 {
            run_start = i;
        }
        let depth = summaries[run_start].1;
        let allowed = config.max_depth.is_none_or(|max| depth < max);
        // Fanout >= 2 summaries always outweigh MIN_SPAN_TOKENS (each carries a header); the
        // check only keeps the guarantee above independent of that.
        if i + 1 - run_start == fanout
            && allowed
            && worth_summarising(span_tokens(&summaries[run_start..=i]))
        {
            return Some(Pass::Condensed {
                depth: depth + 1,
                summaries: ids(&summaries[run_start..=i]),
            });
        }
    }

    // A leaf pass that removes less than wanted is still progress.
    if let Some((end, _)) = leaf {
        return Some(Pass::Leaf {
            messages: raw[..end].iter().map(|m| m.id).collect(),
        });
    }

    // Still above the goal with no full run of summaries and nothing raw outside the fresh
    // tail: condense a shorter run of same-depth summaries (two or more), then let the fresh
    // tail yield its oldest messages, down to what fits with the aim. Otherwise every turn of
    // a small window would end over the soft threshold and start a compaction that can do
    // nothing.
    if excess > 0 {
        let mut start = 0;
        while start < summaries.len() {
            let depth = summaries[start].1;
            let len = summaries[start..]
                .iter()
                .take_while(|s| s.1 == depth)
                .count();
            let run = &summaries[start..start + len.min(fanout)];
            let allowed = config.max_depth.is_none_or(|max| depth < max);
            if run.len() >= 2 && allowed && worth_summarising(span_tokens(run)) {
                return Some(Pass::Condensed {
                    depth: depth + 1,
                    summaries: ids(run),
                });
            }
            start += len;
        }
        // The span stops as soon as it removes the excess, so the tail keeps all it can.
        let eligible = raw
            .len()
            .saturating_sub(MIN_RAW_MESSAGES.min(config.fresh_tail));
        if let Some(end) = leaf_span_end(
            &raw[..eligible],
            config.leaf_chunk_tokens,
            preferred,
            &|tokens| leaf_savings(tokens, config) >= excess,
        ) {
            return Some(Pass::Leaf {
                messages: raw[..end].iter().map(|m| m.id).collect(),
            });
        }
        // No same-depth neighbours and no raw message to spare: merge neighbours of different
        // depths, where that deepens the DAG least. (Re-summarising a lone summary instead, as
        // below, would build a chain one level deeper per compaction when each new leaf lands
        // beside an older, deeper summary.) Above the hard threshold, `max_depth` yields.
        if let Some(run) = mixed_run(&summaries, fanout)
            && (over_hard || config.max_depth.is_none_or(|max| run.0 < max))
        {
            return Some(Pass::Condensed {
                depth: run.0 + 1,
                summaries: ids(run.1),
            });
        }
    }

    // Above the hard threshold with a single summary (or none worth merging) and no raw span
    // left: condense the oldest run of same-depth summaries even if it is shorter than the
    // fanout (a single summary is re-summarised one level deeper), passing over runs too small
    // to be worth a summary (a lone summary of a few words). Every pass at least halves what it
    // covers, so this converges; the hard threshold takes precedence over `max_depth`.
    if over_hard {
        let mut start = 0;
        while start < summaries.len() {
            let depth = summaries[start].1;
            let len = summaries[start..]
                .iter()
                .take_while(|s| s.1 == depth)
                .count();
            let run = &summaries[start..start + len.min(fanout)];
            let worth = if run.len() == 1 {
                worth_summarising_alone(span_tokens(run))
            } else {
                worth_summarising(span_tokens(run))
            };
            if worth {
                return Some(Pass::Condensed {
                    depth: depth + 1,
                    summaries: ids(run),
                });
            }
            start += len;
        }
    }
    None
}

/// The neighbouring summaries to merge when no run of one depth can be: of the runs of
/// `fanout` (or all, if fewer) summaries side by side, the one whose deepest summary is
/// shallowest (the oldest of those), with that depth; `None` for fewer than two summaries or
/// when no such run is worth a summary.
fn mixed_run(summaries: &[TopSummary], fanout: usize) -> Option<(u32, &[TopSummary])> {
    let width = fanout.min(summaries.len());
    if width < 2 {
        return None;
    }
    summaries
        .windows(width)
        .filter(|run| worth_summarising(run.iter().map(|s| s.2).sum()))
        .map(|run| (run.iter().map(|s| s.1).max().unwrap_or(0), run))
        .min_by_key(|(deepest, _)| *deepest)
}

/// The target of a summary over `input_tokens`: the configured size, but never above a third
/// of what it replaces (so small spans shrink too), and at least the smallest useful summary.
fn summary_target(configured: u32, input_tokens: u64) -> u32 {
    shrinking_target(configured, input_tokens, 3)
}

/// [`summary_target`] with another share: a condensed summary may take half of what it
/// replaces, since its sources are already dense (every file they name must still fit).
fn shrinking_target(configured: u32, input_tokens: u64, share: u64) -> u32 {
    configured
        .min(u32::try_from(input_tokens / share).unwrap_or(u32::MAX))
        .max(MIN_SUMMARY_TOKENS)
}

/// What a leaf pass over `tokens` is expected to remove from the context: the span, less a
/// summary of a sixth of it (at most the target) and the header. Summaries of agent work come
/// out well under their target, so counting them at full target would leave the context far
/// below the aim; when one comes out larger, the run simply makes one more pass.
fn leaf_savings(tokens: u64, config: &CompactionConfig) -> u64 {
    let expected = summary_target(config.leaf_target_tokens, tokens)
        .min(u32::try_from(tokens / 6).unwrap_or(u32::MAX))
        + SUMMARY_HEADER_TOKENS;
    tokens.saturating_sub(u64::from(expected))
}

/// How many of the newest `raw` messages fit in `max_tokens` together.
fn tail_fitting(raw: &[&Message], max_tokens: u64) -> usize {
    let mut total = 0u64;
    raw.iter()
        .rev()
        .take_while(|m| {
            total += u64::from(m.token_count);
            total <= max_tokens
        })
        .count()
}

/// The end of the leaf span over `messages` (oldest first), or `None` if no span is worth
/// summarising. Only *closed* prefixes count (no tool call waits for its result after them),
/// and only those worth a summary at all ([`worth_summarising`]).
///
/// The span is the longest such prefix within `chunk_tokens`, unless that one is smaller than
/// `preferred_tokens` (or there is none: a message larger than the chunk, or small messages
/// followed by one): then it is extended to the first closed prefix past the chunk, which takes
/// the next message or tool exchange whole. A span may so exceed the chunk, by less than
/// `preferred_tokens` beyond that next message or exchange (which would have been a span of
/// its own otherwise); the summariser's escalation caps what any span becomes. With too few
/// messages for that, the longest closed prefix worth a summary is the span. A span stops
/// earlier, at the first closed prefix of at least `preferred_tokens` that is `enough` for the
/// run (it removes what the run wants removed).
fn leaf_span_end(
    messages: &[&Message],
    chunk_tokens: u32,
    preferred_tokens: u32,
    enough: &dyn Fn(u64) -> bool,
) -> Option<usize> {
    let mut open: HashSet<&str> = HashSet::new();
    let mut tokens = 0u64;
    // The end and size of the span so far.
    let mut best: Option<(usize, u64)> = None;
    for (i, m) in messages.iter().enumerate() {
        tokens += u64::from(m.token_count);
        if tokens > u64::from(chunk_tokens)
            && best.is_some_and(|(_, size)| size >= u64::from(preferred_tokens))
        {
            break;
        }
        for part in &m.parts {
            match part {
                Part::ToolCall { id, .. } => {
                    open.insert(id.as_str());
                }
                Part::ToolResult { call_id, .. } => {
                    open.remove(call_id.as_str());
                }
                _ => {}
            }
        }
        if open.is_empty() && worth_summarising(tokens) {
            best = Some((i + 1, tokens));
            if tokens > u64::from(chunk_tokens) {
                break; // The first closed prefix past the chunk.
            }
            if tokens >= u64::from(preferred_tokens) && enough(tokens) {
                break; // Removes what the run wants: the rest stays raw.
            }
        }
    }
    best.map(|(end, _)| end)
}

/// What [`prepare`] gives a pass: the request, its sources, kind and depth, and the files under
/// it (as `apply_summary` will record them).
type Prepared = (SummaryRequest, Vec<NodeRef>, SummaryKind, u32, Vec<FileId>);

/// Most open commitments a summary's text lists (the newest; its digest keeps them all).
const SUMMARY_COMMITMENTS: usize = 10;

/// The open-commitments section of a summary: the newest [`SUMMARY_COMMITMENTS`].
fn summary_commitments(open: &[Commitment]) -> String {
    summary_commitments_of(open, SUMMARY_COMMITMENTS)
}

/// The open-commitments section listing the newest `shown` of `open` (empty for none).
fn summary_commitments_of(open: &[Commitment], shown: usize) -> String {
    let newest = &open[open.len().saturating_sub(shown)..];
    let mut section = commitments_section(newest);
    if newest.len() < open.len() {
        section.push_str(&format!(
            "\n- … {} older, listed by lcm_describe",
            open.len() - newest.len()
        ));
    }
    section
}

/// A summary's text without the open-commitments section the engine appended to it.
fn without_commitments(content: &str) -> &str {
    match content.rfind("\n\nOpen commitments:\n") {
        Some(at) => &content[..at],
        None => content,
    }
}

/// `text` with the open-commitments section of as many of the newest of `open` as keep the
/// whole under `input_tokens` (the text itself already is).
fn with_commitments(
    counter: TokenCounter,
    text: String,
    open: &[Commitment],
    input_tokens: u32,
) -> String {
    for shown in (1..=open.len().min(SUMMARY_COMMITMENTS)).rev() {
        let section = summary_commitments_of(open, shown);
        let content = format!("{}\n\n{section}", text.trim_end());
        if count_u32(counter, &content) < input_tokens {
            return content;
        }
    }
    text
}

fn count_u32(counter: TokenCounter, text: &str) -> u32 {
    u32::try_from(counter.count_text(text)).unwrap_or(u32::MAX)
}

/// Reads a pass's sources, renders the text to summarise (reasoning and binary payloads
/// stripped) and builds the span's digest: from its messages for a leaf (with what the
/// summaries before it left open), merged from its sources' for a condensed summary (none if
/// a source has none).
fn prepare(
    store: &Store,
    session: SessionId,
    pass: &Pass,
    config: &CompactionConfig,
) -> Result<Prepared, StoreError> {
    let reader = store.reader()?;
    let large = store.file_rules().large_file_tokens;
    // What the context shows is what is summarised: a forgotten item as its pointer.
    let marks = Marks::read(&reader, session)?;
    let counter = store.counter();
    let mut files: Vec<FileId> = Vec::new();
    let mut add_files = |more: &mut dyn Iterator<Item = FileId>| {
        for f in more {
            if !files.contains(&f) {
                files.push(f);
            }
        }
    };
    let mut content = String::new();
    let mut input_tokens = 0u64;
    let digest;
    let (sources, kind, depth, target) = match pass {
        Pass::Leaf { messages } => {
            let mut span = Vec::with_capacity(messages.len());
            let mut paths: HashMap<String, FileId> = HashMap::new();
            for id in messages {
                // What the context shows: a large file as its reference, not its payload.
                let mut m = shown_message(&reader, reader.message(*id)?, large)?;
                if marks.is_forgotten(NodeRef::Message(*id)) {
                    m = forgotten_message(m, counter);
                }
                if let Some(refs) = reader.message_files(*id)? {
                    add_files(&mut refs.refs.iter().map(|r| r.file));
                    for r in &refs.refs {
                        if let Some(path) = reader.file(r.file)?.path {
                            paths.insert(path, r.file);
                        }
                    }
                }
                input_tokens += u64::from(m.token_count);
                content.push_str(&message_header(m.id, m.role, m.created_at));
                content.push('\n');
                for part in &m.parts {
                    if let Some(text) = summarisable_text(part) {
                        content.push_str(&text);
                        content.push('\n');
                    }
                }
                content.push('\n');
                span.push(m);
            }
            let before = reader.context(session)?.summaries;
            let carried = open_after(&reader, &before)?;
            digest = Some(extract(&span, &carried, &|path: &str| {
                paths.get(path).copied()
            }));
            (
                messages.iter().map(|id| NodeRef::Message(*id)).collect(),
                SummaryKind::Leaf,
                0,
                config.leaf_target_tokens,
            )
        }
        Pass::Condensed { depth, summaries } => {
            digest = stored_digests(&reader, summaries)?.map(|d| Digest::merge(&d));
            for id in summaries {
                let mut s = reader.summary(*id)?;
                add_files(&mut s.file_ids.iter().copied());
                // Without the sources' commitments sections: the engine writes the merged one.
                let text = if marks.is_forgotten(NodeRef::Summary(*id)) {
                    forgotten_summary(&mut s, counter)
                } else {
                    without_commitments(&s.content).to_string()
                };
                input_tokens += u64::from(s.token_count);
                let header = summary_header(s.id, s.depth, s.earliest_at, s.latest_at);
                content.push_str(&format!("{header}\n{text}\n\n"));
            }
            (
                summaries.iter().map(|id| NodeRef::Summary(*id)).collect(),
                SummaryKind::Condensed,
                *depth,
                config.condensed_target_tokens,
            )
        }
    };
    let target = match kind {
        SummaryKind::Leaf => summary_target(target, input_tokens),
        SummaryKind::Condensed => shrinking_target(target, input_tokens, 2),
    };
    let request = SummaryRequest {
        content,
        input_tokens: u32::try_from(input_tokens).unwrap_or(u32::MAX),
        target_tokens: target,
        depth,
        digest,
    };
    Ok((request, sources, kind, depth, files))
}

/// The digests of `summaries`, in order; `None` if one of them has none.
pub(crate) fn stored_digests(
    reader: &StoreReader,
    summaries: &[SummaryId],
) -> Result<Option<Vec<Digest>>, StoreError> {
    let mut digests = Vec::with_capacity(summaries.len());
    for id in summaries {
        match reader.summary_digest(*id)? {
            Some(digest) => digests.push(digest),
            None => return Ok(None),
        }
    }
    Ok(Some(digests))
}

/// Tokens of the `files="..."` attribute [`crate::assembly::render_summary`] writes for
/// `files` (none for no files).
fn files_tokens(counter: TokenCounter, files: &[FileId]) -> u32 {
    u32::try_from(counter.count_text(&files_attribute(files))).unwrap_or(u32::MAX)
}

/// The text of a part worth summarising: no reasoning, no binary payloads.
fn summarisable_text(part: &Part) -> Option<String> {
    match part {
        Part::Text { text } => Some(text.clone()),
        Part::Reasoning { .. } | Part::Binary { .. } => None,
        Part::ToolCall {
            name, arguments, ..
        } => Some(format!("tool call {name} {arguments}")),
        Part::ToolResult {
            content, is_error, ..
        } => Some(if *is_error {
            format!("tool error: {content}")
        } else {
            format!("tool result: {content}")
        }),
        Part::File { path, .. } => Some(format!("file {path}")),
        Part::Opaque { kind, .. } => Some(format!("[{kind}]")),
    }
}

/// The stored token count of a summary with this content: its text plus the header reserve.
pub fn summary_tokens(counter: TokenCounter, content: &str) -> u32 {
    counter.count_text(content) as u32 + SUMMARY_HEADER_TOKENS
}
