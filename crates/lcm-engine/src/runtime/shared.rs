//! What every actor of one runtime shares: the store (the truth), the index, the configuration,
//! the summariser (and the sessions' own, registered by hosts), the event channel, the fault
//! plan, and the current references of the singleton actors (replaced by the root supervisor
//! whenever it restarts one).
//!
//! The runtime holds the shared state itself; its actors, workers and the tasks they start
//! hold it through a [`SharedRef`], a lease shutdown waits for.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lcm_core::config::Config;
use lcm_core::ids::SessionId;
use lcm_llm::from_config::LlmClients;
use lcm_llm::summarize::Summarizer;
use lcm_search::SearchIndex;
use lcm_store::Store;
use ractor::{ActorRef, MessagingErr, RpcReplyPort, rpc::CallResult};
use tokio::sync::{broadcast, watch};

use super::assembler::AssemblerMsg;
use super::compactor::CompactorMsg;
use super::delegation::DelegationLedger;
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
    /// The delegations in flight (outside the DelegationActor, which may crash).
    pub(crate) delegations: DelegationLedger,
    /// Whether the runtime is shutting down (a watch, so that waiters on a slot wake at once).
    closing: watch::Sender<bool>,
    /// Every [`SharedRef`] holds a receiver of it: once they are all dropped, `closed`
    /// completes ([`Shared::leases_returned`]).
    leases: watch::Sender<()>,
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
            delegations: DelegationLedger::default(),
            closing: watch::Sender::new(false),
            leases: watch::Sender::new(()),
        }
    }

    /// A lease of the shared state, for an actor, a worker or a task of the runtime.
    pub(crate) fn lease(self: &Arc<Self>) -> SharedRef {
        SharedRef {
            shared: Arc::clone(self),
            _lease: self.leases.subscribe(),
        }
    }

    /// Completes once every [`SharedRef`] is dropped (at once if none is held): the actors
    /// have stopped and the tasks they started, blocking ones included, have ended, so only
    /// the runtime's own handle keeps the store open.
    pub(crate) async fn leases_returned(&self) {
        self.leases.closed().await;
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
        *self.closing.borrow()
    }

    pub(crate) fn set_closing(&self) {
        self.closing.send_replace(true);
    }

    /// Completes once the runtime starts closing (at once if it has).
    pub(crate) async fn closing(&self) {
        let mut closing = self.closing.subscribe();
        // The sender lives as long as `self`: `wait_for` fails only if it is dropped.
        let _ = closing.wait_for(|&c| c).await;
    }
}

/// The shared state as the runtime's actors, workers and tasks hold it: an `Arc` with a lease.
/// Shutdown awaits the return of every lease ([`Shared::leases_returned`]), so that the store
/// file is free once the host drops the runtime: an `Arc`'s count offers no notification, a
/// watch channel's receivers do.
pub(crate) struct SharedRef {
    shared: Arc<Shared>,
    _lease: watch::Receiver<()>,
}

impl Clone for SharedRef {
    fn clone(&self) -> Self {
        SharedRef {
            shared: Arc::clone(&self.shared),
            _lease: self._lease.clone(),
        }
    }
}

impl Deref for SharedRef {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.shared
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

/// One singleton's current reference, `None` while it is being restarted.
///
/// A watch channel rather than a lock: a caller that finds the slot empty (or still holding an
/// actor it saw stop) subscribes and sleeps until the supervisor puts the successor in, the
/// runtime starts closing, or its deadline passes. It wakes the moment the slot changes, and
/// costs nothing while it waits (no polling).
pub(crate) struct Slot<M: ractor::Message>(watch::Sender<Option<ActorRef<M>>>);

impl<M: ractor::Message> Default for Slot<M> {
    fn default() -> Self {
        Slot(watch::Sender::new(None))
    }
}

impl<M: ractor::Message> Slot<M> {
    /// Puts `actor` in the slot (`None`: it is being restarted) and wakes every waiter.
    pub(crate) fn set(&self, actor: Option<ActorRef<M>>) {
        self.0.send_replace(actor);
    }

    pub(crate) fn get(&self) -> Option<ActorRef<M>> {
        self.0.borrow().clone()
    }

    /// The current reference, waiting (up to `deadline`) while the actor is being restarted.
    pub(crate) async fn wait(
        &self,
        kind: ActorKind,
        shared: &Shared,
        deadline: Instant,
    ) -> Result<ActorRef<M>, RuntimeError> {
        self.wait_for(kind, &shared.closing, deadline, None).await
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
        self.wait_for(kind, &shared.closing, deadline, Some(stopped))
            .await
    }

    /// Asks the actor in the slot the request `build` makes, within `timeout` in all: waits
    /// out a restart of the actor, and when the actor dies with the request (dropping its reply
    /// port), waits for its successor and asks it again. Every wait is on the slot's watch
    /// (woken when the supervisor puts the successor in), never a pause and another try.
    async fn ask<T: Send + 'static>(
        &self,
        kind: ActorKind,
        closing: &watch::Sender<bool>,
        timeout: Duration,
        build: impl Fn(RpcReplyPort<T>) -> M,
    ) -> Result<T, RuntimeError> {
        let deadline = Instant::now() + timeout;
        let mut stopped = None;
        loop {
            let actor = self.wait_for(kind, closing, deadline, stopped).await?;
            let remaining = deadline.saturating_duration_since(Instant::now());
            match ask(&actor, remaining, &build).await {
                Ok(answer) => return Ok(answer),
                Err(AskError::Timeout) => return Err(RuntimeError::Timeout { kind, timeout }),
                // Lost with the actor: the slot holds it until its supervisor has handled the
                // stop, so the next wait is for another actor.
                Err(AskError::Gone) => stopped = Some(actor.get_id()),
            }
        }
    }

    async fn wait_for(
        &self,
        kind: ActorKind,
        closing: &watch::Sender<bool>,
        deadline: Instant,
        stopped: Option<ractor::ActorId>,
    ) -> Result<ActorRef<M>, RuntimeError> {
        // Subscribed before the first look, so no change between the look and the wait is missed.
        let mut slot = self.0.subscribe();
        let mut closing = closing.subscribe();
        loop {
            let current = slot.borrow_and_update().clone();
            if let Some(actor) = current
                && Some(actor.get_id()) != stopped
            {
                return Ok(actor);
            }
            if *closing.borrow_and_update() {
                return Err(RuntimeError::ShuttingDown);
            }
            if Instant::now() >= deadline {
                return Err(RuntimeError::Unavailable {
                    kind,
                    detail: "it is being restarted and did not come back in time".into(),
                });
            }
            // Neither sender can be dropped while `self` and `shared` are borrowed, so a
            // `changed` error cannot happen; either way the loop looks again.
            tokio::select! {
                _ = slot.changed() => {}
                _ = closing.changed() => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
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

/// Asks the singleton in `slot` (a `kind` actor) the request `build` makes, within the call
/// timeout (see [`Slot::ask`]), so `build` must make the same request every time.
pub(crate) async fn ask_service<M: ractor::Message, T: Send + 'static>(
    shared: &Shared,
    slot: &Slot<M>,
    kind: ActorKind,
    build: impl Fn(RpcReplyPort<T>) -> M,
) -> Result<T, RuntimeError> {
    slot.ask(kind, &shared.closing, shared.call_timeout(), build)
        .await
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

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};

    struct Idle;

    #[ractor::async_trait]
    impl Actor for Idle {
        type Msg = ();
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<()>,
            _args: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    /// A request answered with a number.
    struct Ask(RpcReplyPort<u32>);

    /// Answers every [`Ask`] with its number, or (`None`) fails on the first, dropping it.
    struct Answering(Option<u32>);

    #[ractor::async_trait]
    impl Actor for Answering {
        type Msg = Ask;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<Ask>,
            _args: (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _myself: ActorRef<Ask>,
            Ask(reply): Ask,
            _state: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            match self.0 {
                Some(answer) => {
                    let _ = reply.send(answer);
                    Ok(())
                }
                None => Err("failed on the request".into()),
            }
        }
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_the_successor_is_put_in_the_slot() {
        let slot = Arc::new(Slot::<()>::default());
        let closing = Arc::new(watch::Sender::new(false));
        let waiter = {
            let (slot, closing) = (Arc::clone(&slot), Arc::clone(&closing));
            tokio::spawn(async move {
                slot.wait_for(ActorKind::Indexer, &closing, far(), None)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the slot is empty: the waiter waits");
        let (actor, handle) = Actor::spawn(None, Idle, ()).await.unwrap();
        let set_at = Instant::now();
        slot.set(Some(actor.clone()));
        let found = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the change, long before its deadline")
            .unwrap()
            .unwrap();
        assert_eq!(found.get_id(), actor.get_id());
        assert!(set_at.elapsed() < Duration::from_secs(1));
        actor.stop(None);
        handle.await.unwrap();
    }

    #[tokio::test]
    async fn a_waiter_for_a_successor_ignores_the_actor_that_stopped() {
        let slot = Arc::new(Slot::<()>::default());
        let closing = Arc::new(watch::Sender::new(false));
        let (old, old_handle) = Actor::spawn(None, Idle, ()).await.unwrap();
        slot.set(Some(old.clone()));
        let waiter = {
            let (slot, closing) = (Arc::clone(&slot), Arc::clone(&closing));
            let stopped = old.get_id();
            tokio::spawn(async move {
                slot.wait_for(ActorKind::MapWorkerPool, &closing, far(), Some(stopped))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiter.is_finished(),
            "the slot still holds the stopped actor"
        );
        let (new, new_handle) = Actor::spawn(None, Idle, ()).await.unwrap();
        slot.set(Some(new.clone()));
        let found = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(found.get_id(), new.get_id());
        for (actor, handle) in [(old, old_handle), (new, new_handle)] {
            actor.stop(None);
            handle.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_waiter_wakes_when_the_runtime_starts_closing_and_gives_up_at_its_deadline() {
        let slot = Arc::new(Slot::<()>::default());
        let closing = Arc::new(watch::Sender::new(false));
        let waiter = {
            let (slot, closing) = (Arc::clone(&slot), Arc::clone(&closing));
            tokio::spawn(async move {
                slot.wait_for(ActorKind::Compactor, &closing, far(), None)
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        closing.send_replace(true);
        let answer = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(answer, Err(RuntimeError::ShuttingDown)));

        let open = watch::Sender::new(false);
        let deadline = Instant::now() + Duration::from_millis(30);
        let answer = slot
            .wait_for(ActorKind::Compactor, &open, deadline, None)
            .await;
        assert!(matches!(answer, Err(RuntimeError::Unavailable { .. })));
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test]
    async fn a_request_lost_with_its_actor_is_asked_of_the_successor_once_it_is_in() {
        let slot = Arc::new(Slot::<Ask>::default());
        let closing = Arc::new(watch::Sender::new(false));
        let (dying, dying_handle) = Actor::spawn(None, Answering(None), ()).await.unwrap();
        slot.set(Some(dying.clone()));
        let asking = {
            let (slot, closing) = (Arc::clone(&slot), Arc::clone(&closing));
            tokio::spawn(async move {
                slot.ask(ActorKind::Indexer, &closing, Duration::from_secs(60), Ask)
                    .await
            })
        };
        dying_handle.await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !asking.is_finished(),
            "the slot still holds the actor that died: the caller waits for its successor"
        );
        let (next, next_handle) = Actor::spawn(None, Answering(Some(7)), ()).await.unwrap();
        slot.set(Some(next.clone()));
        let answer = tokio::time::timeout(Duration::from_secs(5), asking)
            .await
            .expect("woken by the successor, long before the deadline")
            .unwrap()
            .unwrap();
        assert_eq!(answer, 7);
        next.stop(None);
        next_handle.await.unwrap();
    }

    #[tokio::test]
    async fn a_request_lost_with_no_successor_in_time_says_the_actor_is_unavailable() {
        let slot = Slot::<Ask>::default();
        let closing = watch::Sender::new(false);
        let (dying, dying_handle) = Actor::spawn(None, Answering(None), ()).await.unwrap();
        slot.set(Some(dying));
        let started = Instant::now();
        let answer = slot
            .ask(
                ActorKind::Compactor,
                &closing,
                Duration::from_millis(50),
                Ask,
            )
            .await;
        assert!(
            matches!(answer, Err(RuntimeError::Unavailable { .. })),
            "{answer:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(50));
        dying_handle.await.unwrap();
    }
}
