//! The scripted retrieval arm: no model. A needle task's session is stored in lcm and
//! compacted to a small budget, then each question is answered by a fixed policy that reads
//! only the question's text and calls lcm's own tools as an agent would (`lcm_grep` for the
//! fact's wording, `lcm_describe` on the hits for the verbatim messages under the summaries).
//! Since lcm loses nothing, the policy must find every answer at every length: this measures
//! the machinery (and counts the tool calls and tokens it needs), not a model.

use std::sync::Arc;
use std::time::Instant;

use lcm_core::config::Config;
use lcm_core::ids::SessionId;
use lcm_engine::{Caller, ToolContext, ToolRegistry};
use lcm_llm::StructuredSummarizer;
use lcm_search::DataDir;
use regex::Regex;
use serde::Serialize;
use serde_json::{Value, json};

use crate::stored::store_and_compact;
use crate::tasks::Task;
use crate::{EvalError, Result};

/// What the policy did for one question.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScriptedAnswer {
    pub question: String,
    pub expected: String,
    pub given: String,
    pub score: f64,
    /// Tool calls made for this question.
    pub calls: u32,
    /// Tokens of the tool results read (what a model would have had to read).
    pub tokens_read: u64,
}

/// One task run by the scripted arm.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScriptedRun {
    /// Mean score over the questions.
    pub score: f64,
    pub answers: Vec<ScriptedAnswer>,
    /// The context before and after compaction, in tokens.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// Planted facts now under a summary (every one, for the task to test what it should).
    pub facts_compacted: usize,
    pub facts: usize,
    pub calls: u32,
    pub tokens_read: u64,
    pub wall_ms: u64,
}

/// Stores `task` as a session in the data directory `data`, compacts it to `budget` tokens
/// with the offline structured summariser, and answers its questions with the policy.
pub async fn run(task: &Task, data: &DataDir, budget: u64) -> Result<ScriptedRun> {
    let started = Instant::now();
    let summarizer = StructuredSummarizer::new(data.store.counter());
    let stored = store_and_compact(task, data, budget, &summarizer).await?;
    let session = stored.session;
    let tools = Tools::new(data, session);
    let mut answers = Vec::with_capacity(task.questions.len());
    for question in &task.questions {
        let mut used = Usage::default();
        let given = answer(&tools, &question.text, &mut used).await?;
        answers.push(ScriptedAnswer {
            question: question.text.clone(),
            expected: question.answer.text(),
            score: question.answer.score(&given),
            given,
            calls: used.calls,
            tokens_read: used.tokens,
        });
    }
    let score = answers.iter().map(|a| a.score).sum::<f64>() / answers.len().max(1) as f64;
    Ok(ScriptedRun {
        score,
        tokens_before: stored.tokens_before,
        tokens_after: stored.tokens_after,
        facts_compacted: stored.facts_compacted,
        facts: stored.facts,
        calls: answers.iter().map(|a| a.calls).sum(),
        tokens_read: answers.iter().map(|a| a.tokens_read).sum(),
        answers,
        wall_ms: started.elapsed().as_millis() as u64,
    })
}

/// lcm's tools as the main agent of the task's session calls them.
struct Tools {
    registry: ToolRegistry,
    ctx: ToolContext,
}

/// What answering one question cost.
#[derive(Default)]
struct Usage {
    calls: u32,
    tokens: u64,
}

impl Tools {
    fn new(data: &DataDir, session: SessionId) -> Self {
        Tools {
            registry: ToolRegistry::with_builtins(),
            ctx: ToolContext::new(
                Arc::clone(&data.store),
                Some(Arc::clone(&data.index)),
                Arc::new(Config::default()),
                Caller::main_agent(Some(session)),
            ),
        }
    }

    async fn call(&self, name: &str, args: Value, used: &mut Usage) -> Result<Value> {
        used.calls += 1;
        let result = self
            .registry
            .call(&self.ctx, name, args)
            .await
            .map_err(|e| EvalError::Tool(e.to_string()))?;
        used.tokens += self.ctx.store.counter().count_text(&result.to_string()) as u64;
        Ok(result)
    }

    /// The ids of the messages matching `pattern` (a regex), oldest first.
    async fn grep(&self, pattern: &str, used: &mut Usage) -> Result<Vec<String>> {
        let result = self
            .call("lcm_grep", json!({ "pattern": pattern, "limit": 50 }), used)
            .await?;
        let mut hits: Vec<(u64, String)> = result["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["hits"].as_array().into_iter().flatten())
            .filter_map(|h| Some((h["seq"].as_u64()?, h["id"].as_str()?.to_owned())))
            .collect();
        hits.sort();
        Ok(hits.into_iter().map(|(_, id)| id).collect())
    }

    /// The verbatim text of message `id` (wherever it is: raw or under summaries).
    async fn text(&self, id: &str, used: &mut Usage) -> Result<String> {
        let d = self.call("lcm_describe", json!({ "id": id }), used).await?;
        Ok(d["content"].as_str().unwrap_or_default().to_owned())
    }

    /// The first capture of `extract` in the newest (`newest`) or oldest message matching
    /// `pattern`.
    async fn find(
        &self,
        pattern: &str,
        extract: &Regex,
        newest: bool,
        used: &mut Usage,
    ) -> Result<Option<String>> {
        let mut ids = self.grep(pattern, used).await?;
        if newest {
            ids.reverse();
        }
        for id in ids {
            let text = self.text(&id, used).await?;
            if let Some(found) = extract.captures(&text).and_then(|c| c.get(1)) {
                return Ok(Some(found.as_str().to_owned()));
            }
        }
        Ok(None)
    }
}

fn re(pattern: &str) -> Result<Regex> {
    Regex::new(pattern).map_err(|e| EvalError::Tool(format!("policy pattern {pattern}: {e}")))
}

/// The policy: recognises the question's form, looks the fact up, and answers with what the
/// verbatim message says (an empty answer when it finds nothing).
async fn answer(tools: &Tools, question: &str, used: &mut Usage) -> Result<String> {
    if let Some(c) = re(r"^What is the access code of locker (\d+)\?")?.captures(question) {
        let locker = &c[1];
        let found = tools
            .find(
                &format!(r"access code of locker {locker} is"),
                &re(&format!(r"locker {locker} is ([A-Z]{{2}}-\d{{4}})"))?,
                false,
                used,
            )
            .await?;
        return Ok(found.unwrap_or_default());
    }
    if let Some(c) = re(r"^What is the meeting room of project (\w+) now\?")?.captures(question) {
        let project = &c[1];
        let found = tools
            .find(
                &format!(r"meeting room of project {project} is"),
                &re(&format!(r"project {project} is (?:now )?(room \d+)"))?,
                true,
                used,
            )
            .await?;
        return Ok(found.unwrap_or_default());
    }
    if let Some(c) = re(r"^In which building is the desk of the person who leads project (\w+)\?")?
        .captures(question)
    {
        let project = &c[1];
        let Some(person) = tools
            .find(
                &format!(r"\w+ leads project {project}\."),
                &re(&format!(r"(\w+) leads project {project}\."))?,
                false,
                used,
            )
            .await?
        else {
            return Ok(String::new());
        };
        let found = tools
            .find(
                &format!(r"{person}'s desk is in"),
                &re(&format!(r"{person}'s desk is in (building [A-Z]\d)"))?,
                false,
                used,
            )
            .await?;
        return Ok(found.unwrap_or_default());
    }
    Ok(String::new())
}
