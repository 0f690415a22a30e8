//! What summaries keep of the real Claude Code sessions of `../shared/data`, and how much of the
//! window a compaction leaves in use (issue 23).
//!
//! Each session is appended message by message to a real store; whenever the context passes
//! the soft threshold of the budget it is compacted, as a host's runtime would. Afterwards:
//!
//! - **requests**: every user request (the user's own words, not the harness's notices) that a
//!   summary covers appears, by its first eight words, in the leaf covering it;
//! - **files**: of the files the session read, edited or wrote, the share named (by file name)
//!   in the leaf covering the call and in every condensed summary above it;
//! - **commands**: every shell command a leaf covers has a line naming the command (its first
//!   25 characters) with its outcome (`ok`, `exit N` or `failed`) in that leaf;
//! - **budget use**: after each compaction, the context's share of the budget (at 8k too):
//!   the median run ends between 60% and the soft threshold; a run ends above it only when
//!   the newest messages alone fill the window (then assembly's fit keeps the budget), in at
//!   most 5% of runs.
//!
//! The definitions here are the test's own, independent of the summariser's code. Run with
//! `--nocapture` to see the figures; `LCM_QUALITY_BASELINE=1` measures the extractive
//! summariser too (the figures before issue 23). Skips when the data is absent.

use std::collections::HashMap;

use lcm_core::config::{CompactionConfig, Config};
use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::{NodeRef, SummaryKind};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::{assemble, compact, needs_compaction};
use lcm_llm::summarize::Summarizer;
use lcm_llm::{ExtractiveSummarizer, StructuredSummarizer};
use lcm_store::{Store, StoreOptions};

use crate::common::{real_session_messages, shared_data, summaries_above};

/// What the harness prints and checks for one session, budget and summariser.
#[derive(Debug, Default, Clone)]
struct Quality {
    requests: (usize, usize),
    files_leaf: (usize, usize),
    files_condensed: (usize, usize),
    commands: (usize, usize),
    /// Context tokens / budget after each compaction run.
    use_after: Vec<f64>,
}

impl Quality {
    fn add(&mut self, other: &Quality) {
        let sum = |a: &mut (usize, usize), b: (usize, usize)| {
            a.0 += b.0;
            a.1 += b.1;
        };
        sum(&mut self.requests, other.requests);
        sum(&mut self.files_leaf, other.files_leaf);
        sum(&mut self.files_condensed, other.files_condensed);
        sum(&mut self.commands, other.commands);
        self.use_after.extend(&other.use_after);
    }
}

fn share((hit, all): (usize, usize)) -> f64 {
    if all == 0 {
        1.0
    } else {
        hit as f64 / all as f64
    }
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

/// User texts that are the harness (Claude Code's notices, slash commands, injected skills,
/// its own compaction summaries), not the user.
fn is_request(text: &str) -> bool {
    let t = text.trim_start();
    !t.is_empty()
        && !t.starts_with('<')
        && !t.starts_with("Caveat:")
        && !t.starts_with("[Request interrupted")
        && !t.starts_with("This session is being continued")
        && !t.starts_with("Base directory for this skill")
}

fn first_words(text: &str, n: usize) -> String {
    text.split_whitespace()
        .take(n)
        .collect::<Vec<_>>()
        .join(" ")
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The command as a person would recognise it: its first line after any `cd DIR &&`.
fn command_head(command: &str) -> String {
    let line = command.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut line = line.trim();
    while let Some(rest) = line
        .strip_prefix("cd ")
        .and_then(|r| r.split_once("&&"))
        .map(|(_, r)| r.trim_start())
    {
        line = rest;
    }
    collapse(line).chars().take(25).collect()
}

/// Appends `messages` one by one, compacting whenever the context passes the soft threshold;
/// returns the session and the context's share of the budget after each compaction.
async fn replay(
    store: &Store,
    messages: &[NewMessage],
    budget: u64,
    config: &CompactionConfig,
    summarizer: &dyn Summarizer,
) -> (SessionId, Vec<f64>) {
    let session = store.create_session("replay", None).unwrap();
    let mut estimate = 0u64;
    let mut use_after = Vec::new();
    for m in messages.iter().cloned() {
        let appended = store.append(session, m).unwrap();
        estimate += u64::from(
            store
                .reader()
                .unwrap()
                .message(appended.id)
                .unwrap()
                .token_count,
        );
        if !needs_compaction(estimate, budget, config) {
            continue;
        }
        estimate = assemble(store, session).unwrap().tokens;
        if needs_compaction(estimate, budget, config) {
            let report = compact(store, session, budget, config, summarizer, |_| {})
                .await
                .unwrap();
            estimate = report.tokens_after;
            use_after.push(report.tokens_after as f64 / budget as f64);
            if std::env::var_os("LCM_QUALITY_TRACE").is_some() {
                let passes: Vec<String> = report
                    .passes
                    .iter()
                    .map(|p| {
                        format!(
                            "{}{}:{}->{}",
                            p.kind.as_str(),
                            p.depth,
                            p.input_tokens,
                            p.output_tokens
                        )
                    })
                    .collect();
                eprintln!(
                    "  run {}->{} {}",
                    report.tokens_before,
                    report.tokens_after,
                    passes.join(" ")
                );
            }
        }
    }
    (session, use_after)
}

/// Measures what the summaries of one replayed session keep.
fn measure(store: &Store, session: SessionId, messages: &[NewMessage]) -> Quality {
    let reader = store.reader().unwrap();
    let info = store.session(session).unwrap();
    let stored = reader
        .session_messages(session, 0..info.message_count)
        .unwrap();
    assert_eq!(stored.len(), messages.len());
    let mut content_of: HashMap<SummaryId, (String, SummaryKind)> = HashMap::new();
    let mut summary = |id: SummaryId| {
        content_of
            .entry(id)
            .or_insert_with(|| {
                let s = reader.summary(id).unwrap();
                (s.content, s.kind)
            })
            .clone()
    };
    let chain = |node: NodeRef| summaries_above(store, node);
    let mut q = Quality::default();
    let mut commands: HashMap<String, (MessageId, String)> = HashMap::new();
    for m in &stored {
        let above = chain(NodeRef::Message(m.id));
        for part in &m.parts {
            match part {
                Part::Text { text } if m.role == Role::User && is_request(text) => {
                    let Some(leaf) = above.first() else { continue };
                    q.requests.1 += 1;
                    let needle = first_words(text, 8);
                    if collapse(&summary(*leaf).0).contains(&needle) {
                        q.requests.0 += 1;
                    } else {
                        eprintln!("  request of {} not in {leaf}: {needle:?}", m.id);
                    }
                }
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => {
                    let Some(leaf) = above.first() else { continue };
                    let args: serde_json::Value =
                        serde_json::from_str(arguments).unwrap_or_default();
                    if name == "Bash"
                        && let Some(command) = args.get("command").and_then(|c| c.as_str())
                    {
                        commands.insert(id.clone(), (m.id, command_head(command)));
                    }
                    let file = matches!(name.as_str(), "Read" | "Edit" | "MultiEdit" | "Write")
                        .then(|| args.get("file_path").and_then(|p| p.as_str()))
                        .flatten();
                    if let Some(path) = file {
                        let base = path.rsplit('/').next().unwrap_or(path);
                        q.files_leaf.1 += 1;
                        if summary(*leaf).0.contains(base) {
                            q.files_leaf.0 += 1;
                        }
                        for condensed in &above[1..] {
                            q.files_condensed.1 += 1;
                            if summary(*condensed).0.contains(base) {
                                q.files_condensed.0 += 1;
                            } else if std::env::var_os("LCM_QUALITY_TRACE").is_some() {
                                let s = store.summary(*condensed).unwrap();
                                eprintln!(
                                    "  {condensed} (depth {}, level {}, {} tokens, {} sources) does not name {base}",
                                    s.depth,
                                    s.level,
                                    s.token_count,
                                    s.sources.len()
                                );
                            }
                        }
                    }
                }
                Part::ToolResult { call_id, .. } => {
                    let Some((call_message, head)) = commands.remove(call_id) else {
                        continue;
                    };
                    let Some(leaf) = chain(NodeRef::Message(call_message)).first().copied() else {
                        continue;
                    };
                    q.commands.1 += 1;
                    let text = summary(leaf).0;
                    let found = text.lines().any(|line| {
                        collapse(line).contains(&head)
                            && (line.contains("ok")
                                || line.contains("exit ")
                                || line.contains("failed"))
                    });
                    if found {
                        q.commands.0 += 1;
                    }
                }
                _ => {}
            }
        }
    }
    q
}

async fn run(
    sessions: &[(String, Vec<NewMessage>)],
    budget: u64,
    summarizer: &dyn Summarizer,
    label: &str,
) -> Quality {
    let counter = TokenCounter::new(Encoding::O200kBase);
    let config = Config::default().compaction;
    let mut total = Quality::default();
    for (name, messages) in sessions {
        let store = Store::open_in_memory(StoreOptions::new(counter)).unwrap();
        let (session, use_after) = replay(&store, messages, budget, &config, summarizer).await;
        let mut q = measure(&store, session, messages);
        if std::env::var_os("LCM_QUALITY_SHOW").is_some() {
            // The first leaf and the deepest summary, to read.
            let all = store.session_summaries(session).unwrap();
            for s in all.iter().take(1).chain(all.iter().max_by_key(|s| s.depth)) {
                eprintln!("--- {} depth {}:\n{}", s.id, s.depth, s.content);
            }
        }
        q.use_after = use_after;
        eprintln!(
            "{label} {budget} {name}: requests {:?} files leaf {:?} condensed {:?} commands {:?} use after median {:.2}",
            q.requests,
            q.files_leaf,
            q.files_condensed,
            q.commands,
            median(&q.use_after)
        );
        total.add(&q);
    }
    eprintln!(
        "{label} at {budget}: requests {:.3} ({:?}), files in leaf {:.3}, in condensed {:.3}, commands {:.3} ({:?}), budget use after compaction: median {:.2}, min {:.2}, max {:.2}, {} runs",
        share(total.requests),
        total.requests,
        share(total.files_leaf),
        share(total.files_condensed),
        share(total.commands),
        total.commands,
        median(&total.use_after),
        total
            .use_after
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min),
        total.use_after.iter().copied().fold(0.0, f64::max),
        total.use_after.len()
    );
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn summaries_of_real_sessions_keep_requests_files_and_command_outcomes() {
    let Some(data) = shared_data() else {
        return;
    };
    let mut sessions = real_session_messages(&data);
    assert_eq!(sessions.len(), 4, "expected the four real sessions");
    if let Ok(only) = std::env::var("LCM_QUALITY_ONLY") {
        sessions.retain(|(name, _)| name.starts_with(&only));
    }
    let counter = TokenCounter::new(Encoding::O200kBase);
    let baseline = std::env::var_os("LCM_QUALITY_BASELINE").is_some();
    let soft = Config::default().compaction.soft_threshold;
    for budget in [8_000u64, 16_000, 32_000] {
        if baseline {
            run(
                &sessions,
                budget,
                &ExtractiveSummarizer::new(counter),
                "extractive",
            )
            .await;
        }
        let q = run(
            &sessions,
            budget,
            &StructuredSummarizer::new(counter),
            "structured",
        )
        .await;
        // The window is used: a compaction leaves the context between 60% of the budget and
        // the soft threshold (the median run; a single tool exchange larger than the window
        // leaves some runs lower, and none ends above the soft threshold).
        let used = median(&q.use_after);
        assert!(
            (0.6..=soft).contains(&used),
            "budget use after compaction at {budget}: {used:.2}"
        );
        let above = q.use_after.iter().filter(|u| **u > soft).count();
        assert!(
            above * 20 <= q.use_after.len(),
            "{budget}: {above} of {} runs ended above the soft threshold",
            q.use_after.len()
        );
        if budget < 16_000 {
            continue;
        }
        assert!(
            q.requests.1 > 0 && q.files_leaf.1 > 0 && q.commands.1 > 0,
            "{q:?}"
        );
        assert_eq!(q.requests.0, q.requests.1, "every request: {q:?}");
        assert!(share(q.files_leaf) >= 0.95, "files in leaves: {q:?}");
        assert!(
            share(q.files_condensed) >= 0.95,
            "files in condensed: {q:?}"
        );
        assert_eq!(q.commands.0, q.commands.1, "every command's outcome: {q:?}");
    }
}
