//! Recall of evidence turns (`lcm eval recall`): each conversation of a LoCoMo file is
//! imported as a session, each question is searched within its conversation's session in
//! each mode, and the ranks at which its evidence turns come back give recall@k and MRR.
//!
//! - **recall@k** of a question: the share of its evidence turns among the first `k` hits
//!   (a question with two evidence turns and one of them found scores 0.5); averaged over
//!   questions.
//! - **MRR**: the mean over questions of 1 / the rank of the first evidence turn found
//!   within the first [`MRR_DEPTH`] hits (0 when none is), whatever the cut-offs.
//!
//! Questions without evidence, and evidence naming no turn of the conversation, count in
//! the report's totals but not in the scores.

use std::collections::{BTreeMap, HashMap};

use lcm_core::config::SearchConfig;
use lcm_core::ids::{MessageId, SessionId};
use lcm_search::{DataDir, GrepMode, GrepRequest, Scope, grep};
use lcm_store::StoreError;
use serde::Serialize;

use crate::Result;
use crate::locomo::{Conversation, category_name};

/// The cut-offs reported by default (`lcm eval recall --at K` adds more).
pub const KS: [usize; 3] = [1, 5, 10];
/// MRR counts the first evidence turn within this many hits, whatever the cut-offs.
pub const MRR_DEPTH: usize = 10;

/// A conversation in the data directory: its session and which turn each message is.
#[derive(Debug, Clone)]
pub struct Imported {
    pub session: SessionId,
    pub dia_id_of: HashMap<MessageId, String>,
}

/// Imports each conversation as a session named `locomo/<id>` (idempotently: turns are keyed
/// by their `dia_id`, so a second import adds nothing) and brings the index up to date, the
/// embeddings too when a model is configured (`embedded(done, total)` as they are made).
pub fn import(
    data: &DataDir,
    conversations: &[Conversation],
    embedded: impl FnMut(u64, u64),
) -> Result<Vec<Imported>> {
    let mut out = Vec::with_capacity(conversations.len());
    for conversation in conversations {
        let session = data
            .store
            .ensure_session_for_append(&format!("locomo/{}", conversation.id))?;
        let messages = conversation.messages();
        let keys: Vec<String> = messages
            .iter()
            .filter_map(|m| m.source_key.clone())
            .collect();
        let appended = data.store.append_batch(session, messages)?;
        let dia_id_of = appended.into_iter().map(|a| a.id).zip(keys).collect();
        out.push(Imported { session, dia_id_of });
    }
    data.index.catch_up(&data.store, |_, _| {})?;
    if let Some(semantic) = data.index.semantic() {
        semantic.catch_up_until(&data.store, embedded, || false)?;
    }
    Ok(out)
}

/// Scores of one set of questions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scores {
    /// Questions scored (those with evidence found in their conversation).
    pub questions: usize,
    /// `recall_at[i]` is recall@`ks[i]` (the report's `ks`).
    pub recall_at: Vec<f64>,
    pub mrr: f64,
}

/// One mode's scores, overall and per category.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeReport {
    pub mode: GrepMode,
    pub overall: Scores,
    /// By category number (see [`category_name`]).
    pub categories: BTreeMap<u8, Scores>,
}

/// The result of [`evaluate`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecallReport {
    pub conversations: usize,
    /// Every question in the file.
    pub questions: usize,
    /// Questions without any evidence (not scored).
    pub without_evidence: usize,
    /// Evidence entries that name no turn of their conversation (left out of the scores).
    pub unknown_evidence: Vec<String>,
    pub ks: Vec<usize>,
    pub modes: Vec<ModeReport>,
}

/// Where one question's evidence came back.
struct Ranked {
    category: u8,
    /// The 1-based rank of each evidence turn within the hits asked for (the largest cut-off,
    /// and at least [`MRR_DEPTH`]).
    ranks: Vec<Option<usize>>,
}

/// Searches every question in each of `modes` and scores the ranks of its evidence at each
/// cut-off of `ks` (sorted and deduplicated here; [`KS`] is the usual set), each at most
/// `config.max_limit`, as a search's page is. `progress(done, total)` is called after each
/// question of each mode.
pub fn evaluate(
    data: &DataDir,
    config: &SearchConfig,
    conversations: &[Conversation],
    imported: &[Imported],
    modes: &[GrepMode],
    ks: &[usize],
    mut progress: impl FnMut(usize, usize),
) -> Result<RecallReport> {
    let ks = cut_offs(ks, config)?;
    let depth = ks.last().copied().unwrap_or(MRR_DEPTH).max(MRR_DEPTH);
    let questions: usize = conversations.iter().map(|c| c.questions.len()).sum();
    let total = questions * modes.len();
    let mut without_evidence = 0;
    let mut unknown_evidence = Vec::new();
    // The scored questions: (conversation, question, its known evidence).
    let mut scored = Vec::new();
    for (c, conversation) in conversations.iter().enumerate() {
        let known = conversation.dia_ids();
        for (q, question) in conversation.questions.iter().enumerate() {
            if question.evidence.is_empty() {
                without_evidence += 1;
                continue;
            }
            let (found, unknown): (Vec<&String>, Vec<&String>) = question
                .evidence
                .iter()
                .partition(|e| known.contains(e.as_str()));
            unknown_evidence.extend(
                unknown
                    .into_iter()
                    .map(|e| format!("{}:{e}", conversation.id)),
            );
            if !found.is_empty() {
                scored.push((c, q, found));
            }
        }
    }

    let mut reports = Vec::with_capacity(modes.len());
    let mut done = 0;
    for (m, &mode) in modes.iter().enumerate() {
        let mut ranked = Vec::with_capacity(scored.len());
        for &(c, q, ref evidence) in &scored {
            let question = &conversations[c].questions[q];
            let hits = grep(
                &data.store,
                &data.index,
                config,
                &GrepRequest {
                    pattern: question.question.clone(),
                    mode,
                    scope: Scope {
                        session: Some(imported[c].session),
                        ..Scope::default()
                    },
                    limit: Some(depth),
                    cursor: None,
                },
            )?
            .hits;
            let turns: Vec<Option<&String>> = hits
                .iter()
                .map(|h| imported[c].dia_id_of.get(&h.message))
                .collect();
            let ranks = evidence
                .iter()
                .map(|e| turns.iter().position(|t| *t == Some(*e)).map(|i| i + 1))
                .collect();
            ranked.push(Ranked {
                category: question.category,
                ranks,
            });
            done += 1;
            progress(done, total);
        }
        // Questions without scores still count as done.
        done = (m + 1) * questions;
        progress(done, total);
        let mut categories: BTreeMap<u8, Vec<&Ranked>> = BTreeMap::new();
        for r in &ranked {
            categories.entry(r.category).or_default().push(r);
        }
        reports.push(ModeReport {
            mode,
            overall: scores(ranked.iter(), &ks),
            categories: categories
                .into_iter()
                .map(|(category, rs)| (category, scores(rs.into_iter(), &ks)))
                .collect(),
        });
    }
    Ok(RecallReport {
        conversations: conversations.len(),
        questions,
        without_evidence,
        unknown_evidence,
        ks,
        modes: reports,
    })
}

/// `ks` sorted and deduplicated, or an error unless each is between 1 and
/// `config.max_limit` (a search's page, which holds the hits a cut-off counts in).
pub fn cut_offs(ks: &[usize], config: &SearchConfig) -> Result<Vec<usize>> {
    let mut ks = ks.to_vec();
    ks.sort_unstable();
    ks.dedup();
    if ks.first().is_none_or(|&k| k == 0) || ks.last().is_some_and(|&k| k > config.max_limit) {
        return Err(StoreError::InvalidQuery(format!(
            "recall cut-offs must be between 1 and search.max_limit ({}), got {ks:?}",
            config.max_limit
        ))
        .into());
    }
    Ok(ks)
}

fn scores<'a>(ranked: impl Iterator<Item = &'a Ranked>, ks: &[usize]) -> Scores {
    let mut n = 0usize;
    let mut recall = vec![0f64; ks.len()];
    let mut mrr = 0f64;
    for r in ranked {
        n += 1;
        let evidence = r.ranks.len() as f64;
        for (i, &k) in ks.iter().enumerate() {
            let found = r.ranks.iter().filter(|rank| rank.is_some_and(|x| x <= k));
            recall[i] += found.count() as f64 / evidence;
        }
        if let Some(&first) = r.ranks.iter().flatten().min()
            && first <= MRR_DEPTH
        {
            mrr += 1.0 / first as f64;
        }
    }
    let mean = |x: f64| if n == 0 { 0.0 } else { x / n as f64 };
    Scores {
        questions: n,
        recall_at: recall.iter().map(|&x| mean(x)).collect(),
        mrr: mean(mrr),
    }
}

impl RecallReport {
    /// The report as a Markdown table: one row per mode and category (`all` first).
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        out.push_str("| mode | questions | category |");
        for k in &self.ks {
            out.push_str(&format!(" recall@{k} |"));
        }
        out.push_str(" MRR |\n| --- | ---: | --- |");
        for _ in &self.ks {
            out.push_str(" ---: |");
        }
        out.push_str(" ---: |\n");
        for mode in &self.modes {
            let name = mode.mode.name();
            let rows = std::iter::once(("all".to_string(), &mode.overall)).chain(
                mode.categories
                    .iter()
                    .map(|(c, s)| (format!("{c} {}", category_name(*c)), s)),
            );
            for (category, s) in rows {
                out.push_str(&format!("| {name} | {} | {category} |", s.questions));
                for r in &s.recall_at {
                    out.push_str(&format!(" {r:.3} |"));
                }
                out.push_str(&format!(" {:.3} |\n", s.mrr));
            }
        }
        out.push_str(&format!(
            "\n{} conversations, {} questions ({} without evidence",
            self.conversations, self.questions, self.without_evidence
        ));
        if !self.unknown_evidence.is_empty() {
            out.push_str(&format!(
                "; evidence naming no turn, left out: {}",
                self.unknown_evidence.join(", ")
            ));
        }
        out.push_str(")\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scores_count_shares_of_evidence_and_first_ranks() {
        let ranked = [
            Ranked {
                category: 1,
                ranks: vec![Some(1), None],
            },
            Ranked {
                category: 1,
                ranks: vec![Some(7)],
            },
            Ranked {
                category: 2,
                ranks: vec![None],
            },
        ];
        let s = scores(ranked.iter(), &KS);
        assert_eq!(s.questions, 3);
        // recall@1: 0.5 + 0 + 0; @5: same; @10: 0.5 + 1 + 0.
        assert_eq!(s.recall_at, vec![0.5 / 3.0, 0.5 / 3.0, 1.5 / 3.0]);
        assert!((s.mrr - (1.0 + 1.0 / 7.0) / 3.0).abs() < 1e-12);
        let empty = scores(std::iter::empty(), &KS);
        assert_eq!(empty.recall_at, vec![0.0; 3]);
    }

    #[test]
    fn deeper_cut_offs_count_deeper_ranks_and_leave_mrr_at_ten() {
        let ranked = [
            Ranked {
                category: 1,
                ranks: vec![Some(3), Some(40)],
            },
            Ranked {
                category: 1,
                ranks: vec![Some(25)],
            },
        ];
        let s = scores(ranked.iter(), &[10, 20, 50]);
        // @10: 0.5 + 0; @20: the same; @50: 1 + 1.
        assert_eq!(s.recall_at, vec![0.25, 0.25, 1.0]);
        // The turn at 25 is past MRR's ten: only the first question's 1/3 counts.
        assert!((s.mrr - (1.0 / 3.0) / 2.0).abs() < 1e-12);
    }
}
