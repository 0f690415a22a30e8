//! The per-turn policy of the control loop (paper section 2.4, zero-cost continuity).
//!
//! [`ContextController::context_for_turn`] is what a host calls before each model call:
//! - below the soft threshold it only assembles: no summariser is called, no compaction runs;
//! - between the soft and the hard threshold it starts a compaction in the background (one per
//!   session at a time) and returns the current context at once: the turn is not blocked, and the
//!   summaries are swapped in atomically between turns when they are ready;
//! - above the hard threshold it waits for the session's compaction (starting one if none is
//!   running) and returns the context once it is back under the hard threshold;
//! - a context that the session's last compaction could do nothing for (the same tokens, for
//!   the same budget) is returned without starting another, until the session changes.
//!
//! The supervised actor runtime (SessionActor, CompactorActor) will take over this role; the
//! policy is the same.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lcm_core::config::CompactionConfig;
use lcm_core::ids::SessionId;
use lcm_llm::summarize::Summarizer;
use lcm_store::Store;
use tokio::task::JoinHandle;

use crate::assembly::{AssembledContext, assemble};
use crate::compaction::{CompactionError, CompactionReport, compact};

type Running = JoinHandle<Result<CompactionReport, CompactionError>>;

/// Runs the soft/hard threshold policy for many sessions.
pub struct ContextController {
    store: Arc<Store>,
    summarizer: Arc<dyn Summarizer>,
    config: CompactionConfig,
    running: Mutex<HashMap<SessionId, Running>>,
    /// Per session, the context's tokens and the budget of the last compaction that applied
    /// no pass: another run on that context would do the same nothing.
    stuck: Mutex<HashMap<SessionId, (u64, u64)>>,
}

impl ContextController {
    pub fn new(
        store: Arc<Store>,
        summarizer: Arc<dyn Summarizer>,
        config: CompactionConfig,
    ) -> Self {
        ContextController {
            store,
            summarizer,
            config,
            running: Mutex::new(HashMap::new()),
            stuck: Mutex::new(HashMap::new()),
        }
    }

    /// The context to send for this turn, under `budget` tokens (see the module docs).
    pub async fn context_for_turn(
        &self,
        session: SessionId,
        budget: u64,
    ) -> Result<AssembledContext, CompactionError> {
        if budget == 0 {
            return Err(CompactionError::ZeroBudget);
        }
        let thresholds = self.config.thresholds(budget);
        let counter = self.store.counter();
        let ctx = assemble(&self.store, session)?;
        self.collect_finished(session).await;
        if !thresholds.above_soft(ctx.tokens)
            || self.stuck_at(session) == Some((ctx.tokens, budget))
        {
            return Ok(ctx.fit(budget, 0, counter)?);
        }
        if !thresholds.above_hard(ctx.tokens) {
            self.start(session, budget);
            return Ok(ctx.fit(budget, 0, counter)?);
        }
        // Above the hard threshold: wait for a compaction (the running one, then a fresh one if
        // the running one was started for an older, smaller context).
        for _ in 0..2 {
            self.start(session, budget);
            self.wait(session).await?;
            let ctx = assemble(&self.store, session)?;
            if !thresholds.above_hard(ctx.tokens)
                || self.stuck_at(session) == Some((ctx.tokens, budget))
            {
                return Ok(ctx.fit(budget, 0, counter)?);
            }
        }
        Ok(assemble(&self.store, session)?.fit(budget, 0, counter)?)
    }

    /// Whether a compaction of `session` is running.
    pub fn is_compacting(&self, session: SessionId) -> bool {
        self.lock()
            .get(&session)
            .is_some_and(|handle| !handle.is_finished())
    }

    /// Waits for the session's running compaction, if any, and returns its report.
    pub async fn wait(
        &self,
        session: SessionId,
    ) -> Result<Option<CompactionReport>, CompactionError> {
        let handle = self.lock().remove(&session);
        match handle {
            None => Ok(None),
            Some(handle) => match handle.await {
                Ok(report) => {
                    if let Ok(report) = &report {
                        self.remember(session, report);
                    }
                    report.map(Some)
                }
                // A panicking compaction wrote nothing half-done (apply is one transaction);
                // report it as no compaction.
                Err(_) => Ok(None),
            },
        }
    }

    /// Reads the report of the session's compaction if it has finished (remembering a run
    /// that applied no pass); a running one is left alone.
    async fn collect_finished(&self, session: SessionId) {
        let finished = {
            let mut running = self.lock();
            match running.get(&session) {
                Some(handle) if handle.is_finished() => running.remove(&session),
                _ => None,
            }
        };
        if let Some(handle) = finished
            && let Ok(Ok(report)) = handle.await
        {
            self.remember(session, &report);
        }
    }

    /// Remembers what a finished run of `session` could do.
    fn remember(&self, session: SessionId, report: &CompactionReport) {
        let mut stuck = self.stuck.lock().unwrap_or_else(|p| p.into_inner());
        if report.passes.is_empty() {
            stuck.insert(session, (report.tokens_after, report.budget));
        } else {
            stuck.remove(&session);
        }
    }

    /// The tokens and budget at which the session's last compaction applied no pass.
    fn stuck_at(&self, session: SessionId) -> Option<(u64, u64)> {
        let stuck = self.stuck.lock().unwrap_or_else(|p| p.into_inner());
        stuck.get(&session).copied()
    }

    /// Starts a background compaction of `session` unless one is running.
    fn start(&self, session: SessionId, budget: u64) {
        let mut running = self.lock();
        if running.get(&session).is_some_and(|h| !h.is_finished()) {
            return;
        }
        let store = Arc::clone(&self.store);
        let summarizer = Arc::clone(&self.summarizer);
        let config = self.config.clone();
        let handle = tokio::spawn(async move {
            compact(
                &store,
                session,
                budget,
                &config,
                summarizer.as_ref(),
                |_| {},
            )
            .await
        });
        running.insert(session, handle);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Running>> {
        // The map holds only join handles: a poisoned lock leaves it usable.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
