//! `lcm eval run`: generates the tasks of a [`Plan`] (each family, length and seed) and runs
//! each with each arm, one [`RunResult`] per task and arm.

use std::path::Path;
use std::sync::Arc;

use lcm_core::config::Config;
use lcm_core::tokens::TokenCounter;
use lcm_llm::from_config::LlmClients;
use lcm_llm::{LlmSummarizer, StructuredSummarizer, Summarizer};
use lcm_search::DataDir;

use crate::model::ModelSettings;
use crate::report::RunResult;
use crate::tasks::{self, Family};
use crate::trec::Item;
use crate::{EvalError, Result, agent, baseline, scripted};

/// Who answers a task's questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arm {
    /// No model: lcm's tools and a fixed policy ([`scripted`]; needle tasks only).
    Scripted,
    /// The model alone, its input truncated to its window ([`baseline`]).
    Baseline,
    /// The model as an lcm agent ([`agent`]).
    Lcm,
}

impl Arm {
    /// The arm's name in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Arm::Scripted => "scripted",
            Arm::Baseline => "baseline",
            Arm::Lcm => "lcm",
        }
    }

    /// Whether the arm calls a model.
    pub fn needs_model(self) -> bool {
        self != Arm::Scripted
    }
}

/// What compacts the lcm arm's sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SummarizerChoice {
    /// The offline structured summariser (no model calls: tractable with any model).
    #[default]
    Offline,
    /// The configured model.
    Model,
}

/// What `lcm eval run` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub families: Vec<Family>,
    /// Context lengths, in tokens.
    pub lengths: Vec<u64>,
    pub arms: Vec<Arm>,
    /// The first seed; task `k` of a family and length uses `seed + k`.
    pub seed: u64,
    /// Tasks per family and length.
    pub tasks: u64,
    /// The budget sessions are compacted to (scripted and lcm arms), in tokens.
    pub budget: u64,
    /// How the model arms run.
    pub model: ModelSettings,
    pub summarizer: SummarizerChoice,
}

/// Room a window must keep for the instructions and the question, beside the answer's.
const MIN_PROMPT_ROOM: u64 = 256;

impl Plan {
    /// Refuses a plan that cannot run: the scripted arm on aggregation tasks, a model arm (or
    /// the model summariser) without a model, a window with no room for a question.
    pub fn check(&self, llm: Option<&LlmClients>) -> Result<()> {
        if self.families.is_empty() || self.lengths.is_empty() || self.arms.is_empty() {
            return Err(EvalError::Invalid(
                "nothing to run: a plan needs a family, a length and an arm".into(),
            ));
        }
        if self.arms.contains(&Arm::Scripted) && self.families.contains(&Family::Aggregation) {
            return Err(EvalError::Invalid(
                "the scripted arm answers needle tasks only: aggregation questions need a model \
                 to judge each record (run the scripted arm with --family needles alone)"
                    .into(),
            ));
        }
        if llm.is_none() {
            if let Some(arm) = self.arms.iter().find(|a| a.needs_model()) {
                return Err(EvalError::Invalid(format!(
                    "the {} arm needs a model, and none is configured: set [llm] provider to \
                     \"openai\" or \"anthropic\", with model and base_url, in the configuration \
                     file (--config; see docs/EVAL.md)",
                    arm.as_str()
                )));
            }
            if self.summarizer == SummarizerChoice::Model && self.arms.contains(&Arm::Lcm) {
                return Err(EvalError::Invalid(
                    "the model summariser needs a model: configure [llm] or use the offline one"
                        .into(),
                ));
            }
        }
        if self.arms.iter().any(|a| a.needs_model()) {
            let least = u64::from(self.model.max_output_tokens) + MIN_PROMPT_ROOM;
            if self.model.window < least {
                return Err(EvalError::Invalid(format!(
                    "a window of {} tokens leaves no room for a question beside {} tokens of \
                     answer: use --window {least} or more",
                    self.model.window, self.model.max_output_tokens
                )));
            }
            if self.model.max_turns == 0 {
                return Err(EvalError::Invalid(
                    "the lcm arm needs at least one turn per question".into(),
                ));
            }
        }
        Ok(())
    }
}

/// Runs `plan` over `items` (the TREC set) with `config`'s tokenizer and the model `llm`, in
/// data directories made under `work`; `progress` sees each result as it is made. The plan is
/// checked first ([`Plan::check`]).
pub async fn run(
    plan: &Plan,
    items: &[Item],
    config: &Config,
    llm: Option<&LlmClients>,
    work: &Path,
    mut progress: impl FnMut(&RunResult),
) -> Result<Vec<RunResult>> {
    plan.check(llm)?;
    let counter = TokenCounter::new(config.tokenizer.encoding());
    let scripted_data = if plan.arms.contains(&Arm::Scripted) {
        Some(DataDir::open(work.join("scripted"), config)?)
    } else {
        None
    };
    let mut results = Vec::new();
    for family in &plan.families {
        for length in &plan.lengths {
            for k in 0..plan.tasks {
                let seed = plan.seed + k;
                let task = tasks::generate(*family, items, seed, *length, counter);
                for arm in &plan.arms {
                    let (score, questions, tokens_spent, calls, wall_ms) = match (arm, llm) {
                        (Arm::Scripted, _) => {
                            let Some(data) = &scripted_data else {
                                continue;
                            };
                            let run = scripted::run(&task, data, plan.budget).await?;
                            if run.facts_compacted < run.facts {
                                return Err(EvalError::Invalid(format!(
                                    "{} of {} planted facts are still raw after compaction to {} \
                                     tokens: use a smaller --budget",
                                    run.facts - run.facts_compacted,
                                    run.facts,
                                    plan.budget
                                )));
                            }
                            (
                                run.score,
                                run.answers.len(),
                                run.tokens_read,
                                u64::from(run.calls),
                                run.wall_ms,
                            )
                        }
                        (Arm::Baseline, Some(llm)) => {
                            let run = baseline::run(&task, llm.chat.as_ref(), &plan.model, counter)
                                .await?;
                            (
                                run.score,
                                run.answers.len(),
                                run.tokens,
                                run.calls,
                                run.wall_ms,
                            )
                        }
                        (Arm::Lcm, Some(llm)) => {
                            let summarizer: Arc<dyn Summarizer> = match plan.summarizer {
                                SummarizerChoice::Offline => {
                                    Arc::new(StructuredSummarizer::new(counter))
                                }
                                SummarizerChoice::Model => Arc::new(LlmSummarizer::new(
                                    Arc::clone(&llm.provider),
                                    counter,
                                    llm.chat.model().to_owned(),
                                )),
                            };
                            let dir = work.join(format!("lcm-{}-{length}-{seed}", family.as_str()));
                            let run = agent::run(
                                &task,
                                &dir,
                                config,
                                llm,
                                summarizer,
                                plan.budget,
                                &plan.model,
                            )
                            .await?
                            .run;
                            (
                                run.score,
                                run.answers.len(),
                                run.tokens,
                                run.calls,
                                run.wall_ms,
                            )
                        }
                        // Refused by the check above.
                        (Arm::Baseline | Arm::Lcm, None) => continue,
                    };
                    let result = RunResult {
                        seed,
                        family: *family,
                        length: *length,
                        arm: arm.as_str().to_owned(),
                        score,
                        questions,
                        tokens_spent,
                        calls,
                        wall_ms,
                    };
                    progress(&result);
                    results.push(result);
                }
            }
        }
    }
    Ok(results)
}
