//! What every actor of one runtime shares: the store (the truth), the index, the configuration,
//! the summariser (and the sessions' own, registered by hosts), the event channel, the fault
//! plan, and the current references of the singleton actors (replaced by the root supervisor
//! whenever it restarts one).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use lcm_core::config::Config;
use lcm_core::ids::SessionId;
use lcm_llm::from_config::LlmClients;
use lcm_llm::summarize::Summarizer;
use lcm_search::SearchIndex;
use lcm_store::Store;
use ractor::{ActorRef, MessagingErr, RpcReplyPort, rpc::CallResult};
use tokio::sync::broadcast;

use super::assembler::AssemblerMsg;
use super::compactor::CompactorMsg;
use super::error::RuntimeError;
use super::events::RuntimeEvent;
use super::faults::Faults;
use super::indexer::IndexerMsg;
use super::session_summarizers::SessionSummarizers;
use super::supervision::ActorKind;
use super::writer::GroupWriter;
use crate::tools::ToolRegistry;

/// Shared by all actors of a runtime (behind an `Arc`).
pub(crate) struct Shared {
    pub(crate) store: Arc<Store>,
    pub(crate) index: Arc<SearchIndex>,
    pub(crate) config: Arc<Config>,
    pub(crate) summarizer: Arc<dyn Summarizer>,
    /// Summarisers hosts registered for single sessions (used instead of `summarizer`).
    pub(crate) session_summarizers: SessionSummarizers,
    /// The model for operators and sub-agents (`None`: offline, they refuse with a clear error).
    pub(crate) llm: Option<LlmClients>,
    /// The tools models can call (built-ins and the host's).
    pub(crate) tools: ToolRegistry,
    pub(crate) events: broadcast::Sender<RuntimeEvent>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) writer: GroupWriter,
    pub(crate) services: Services,
    closing: AtomicBool,
}

impl Shared {
    pub(crate) fn new(
        store: Arc<Store>,
        index: Arc<SearchIndex>,
        config: Arc<Config>,
        summarizer: Arc<dyn Summarizer>,
        llm: Option<LlmClients>,
        tools: ToolRegistry,
        writer: GroupWriter,
    ) -> Shared {
        let (events, _) = broadcast::channel(1024);
        Shared {
            store,
            index,
            config,
            summarizer,
            session_summarizers: SessionSummarizers::default(),
            llm,
            tools,
            events,
            faults: Arc::new(Faults::default()),
            writer,
            services: Services::default(),
            closing: AtomicBool::new(false),
        }
    }

    /// The summariser for `session`'s compactions: its own when a live one is registered
    /// (`true`), else the runtime's.
    pub(crate) fn summarizer_for(&self, session: SessionId) -> (Arc<dyn Summarizer>, bool) {
        match self.session_summarizers.get(session) {
            Some(summarizer) => (summarizer, true),
            None => (Arc::clone(&self.summarizer), false),
        }
    }

    /// Publishes an event to every subscriber (none listening is fine).
    pub(crate) fn emit(&self, event: RuntimeEvent) {
        tracing::debug!(?event, "runtime event");
        let _ = self.events.send(event);
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        Duration::from_secs(self.config.runtime.call_timeout_s)
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub(crate) fn set_closing(&self) {
        self.closing.store(true, Ordering::Release);
    }
}

/// The live references of the singleton actors. `None` while one is being restarted.
#[derive(Default)]
pub(crate) struct Services {
    pub(crate) compactor: Slot<CompactorMsg>,
    pub(crate) assembler: Slot<AssemblerMsg>,
    pub(crate) indexer: Slot<IndexerMsg>,
    pub(crate) integrity: Slot<super::integrity::IntegrityMsg>,
    pub(crate) map_pool: Slot<super::map_pool::MapPoolMsg>,
    pub(crate) delegation: Slot<super::delegation::DelegationMsg>,
}

/// One singleton's current reference.
pub(crate) struct Slot<M: ractor::Message>(RwLock<Option<ActorRef<M>>>);

impl<M: ractor::Message> Default for Slot<M> {
    fn default() -> Self {
        Slot(RwLock::new(None))
    }
}

impl<M: ractor::Message> Slot<M> {
    pub(crate) fn set(&self, actor: Option<ActorRef<M>>) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = actor;
    }

    pub(crate) fn get(&self) -> Option<ActorRef<M>> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The current reference, waiting (up to `deadline`) while the actor is being restarted.
    pub(crate) async fn wait(
        &self,
        kind: ActorKind,
        shared: &Shared,
        deadline: Instant,
    ) -> Result<ActorRef<M>, RuntimeError> {
        self.wait_for(kind, shared, deadline, None).await
    }

    /// As [`Self::wait`], for the successor of `stopped`, an actor seen to stop: until its
    /// supervisor has handled the stop, the slot still holds it.
    pub(crate) async fn wait_successor(
        &self,
        kind: ActorKind,
        shared: &Shared,
        deadline: Instant,
        stopped: ractor::ActorId,
    ) -> Result<ActorRef<M>, RuntimeError> {
        self.wait_for(kind, shared, deadline, Some(stopped)).await
    }

    async fn wait_for(
        &self,
        kind: ActorKind,
        shared: &Shared,
        deadline: Instant,
        stopped: Option<ractor::ActorId>,
    ) -> Result<ActorRef<M>, RuntimeError> {
        loop {
            if let Some(actor) = self.get()
                && Some(actor.get_id()) != stopped
            {
                return Ok(actor);
            }
            if shared.is_closing() {
                return Err(RuntimeError::ShuttingDown);
            }
            if Instant::now() >= deadline {
                return Err(RuntimeError::Unavailable {
                    kind,
                    detail: "it is being restarted and did not come back in time".into(),
                });
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Why an RPC to an actor got no answer.
#[derive(Debug)]
pub(crate) enum AskError {
    /// The actor died before answering (or was already dead).
    Gone,
    /// No answer within the timeout.
    Timeout,
}

/// Sends an RPC and waits for its answer.
pub(crate) async fn ask<M: ractor::Message, T: Send + 'static>(
    actor: &ActorRef<M>,
    timeout: Duration,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
) -> Result<T, AskError> {
    match actor.call(build, Some(timeout)).await {
        Ok(CallResult::Success(value)) => Ok(value),
        Ok(CallResult::Timeout) => Err(AskError::Timeout),
        Ok(CallResult::SenderError) | Err(MessagingErr::SendErr(_)) => Err(AskError::Gone),
        Err(_) => Err(AskError::Gone),
    }
}

/// Re-raises a panic caught in a blocking task in the actor that awaited it, so that the
/// supervisor sees the actor fail.
pub(crate) fn join_blocking<T>(
    result: Result<T, tokio::task::JoinError>,
) -> Result<T, RuntimeError> {
    match result {
        Ok(value) => Ok(value),
        Err(error) => match error.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            // Cancelled only when the tokio runtime shuts down under us.
            Err(_) => Err(RuntimeError::ShuttingDown),
        },
    }
}
