//! The supervised actor runtime: what a host embeds.
//!
//! A host opens a [`Runtime`] from a configuration, gets a [`SessionHandle`] per conversation,
//! appends messages and asks for the context to send for each turn; compaction, indexing and
//! integrity checks happen behind it, in supervised actors (ractor on tokio):
//!
//! ```text
//! RootActor (supervisor: restarts with backoff, stall detection, session registry)
//! ├── SessionActor × live sessions   appends (group commit), thresholds, waits above hard
//! ├── AssemblerActor                 context states → context items
//! ├── CompactorActor                 queue + concurrency limit
//! │   └── CompactionWorker × running one compaction run each; retried if it dies
//! ├── IndexerActor                   keeps tantivy caught up with redb
//! ├── IntegrityActor                 invariants of the store, on a schedule and on demand
//! ├── MapWorkerPool                  llm_map jobs, exactly once per item, resumed after crashes
//! │   └── MapJobWorker × running jobs
//! └── DelegationActor                sub-agents for Task / Tasks / lcm_expand_query, the guard
//!     └── SubAgentWorker × running sub-agents
//! ```
//!
//! The store is the truth; every actor's state is a cache rebuilt from it, so a restarted actor
//! simply starts again. Every change of what a model sees is one redb transaction, so a crash
//! at any point leaves the old context or the new one.
//!
//! ```no_run
//! use lcm_core::config::Config;
//! use lcm_core::message::{NewMessage, Role};
//! use lcm_engine::runtime::{Runtime, RuntimeOptions};
//!
//! # async fn example() -> Result<(), lcm_engine::runtime::RuntimeError> {
//! let runtime = Runtime::open(RuntimeOptions::dir("./lcm-data", Config::default())).await?;
//! let session = runtime.session("my-conversation").await?;
//! session
//!     .append(NewMessage::text(Role::User, "hello").with_source_key("turn-1"))
//!     .await?;
//! let context = session.context(128_000).await?;
//! println!("{} tokens in context", context.tokens);
//! runtime.shutdown(std::time::Duration::from_secs(10)).await?;
//! # Ok(())
//! # }
//! ```

mod assembler;
mod compactor;
mod delegation;
mod error;
mod events;
pub mod faults;
mod indexer;
mod integrity;
mod map_pool;
mod retry;
mod root;
mod session;
mod session_summarizers;
mod shared;
mod subagent_window;
mod supervision;
mod worker;
mod writer;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lcm_core::config::Config;
use lcm_core::ids::{JobId, SessionId};
use lcm_core::message::NewMessage;
use lcm_core::tokens::TokenCounter;
use lcm_llm::from_config::{LlmClients, clients_from_config, summarizer_from_config};
use lcm_llm::summarize::Summarizer;
use lcm_search::{DataDir, SearchIndex};
use lcm_store::{Appended, MapJob, Store, StoreOptions};
use ractor::{Actor, ActorRef};
use tokio::sync::broadcast;

pub use compactor::CompactorStats;
pub use delegation::{DelegationStats, RegistryTools, SUB_AGENT_END_MARKER};
pub use error::RuntimeError;
pub use events::RuntimeEvent;
pub use faults::{Fault, FaultPoint, Faults};
pub use integrity::IntegrityOutcome;
pub use root::SupervisorStats;
pub use session::SessionStats;
pub use subagent_window::context_turns;
pub use supervision::ActorKind;

/// `context` (from [`SessionHandle::context`], already within `window` less the safety margin)
/// fitted again with a system prompt beside it: the system prompt's tokens come out of the same
/// budget, so what a model receives, system included, stays within it.
pub fn fit_with_system(
    runtime: &Runtime,
    context: AssembledContext,
    window: u64,
    system: Option<&str>,
) -> Result<AssembledContext, RuntimeError> {
    let Some(system) = system else {
        return Ok(context);
    };
    let counter = runtime.store().counter();
    let system_tokens = crate::assembly::system_prompt_tokens(counter, system);
    let budget =
        crate::compaction::effective_budget(window, runtime.config().tokenizer.safety_margin);
    Ok(context.fit(budget, system_tokens, counter)?)
}

use crate::assembly::AssembledContext;
use crate::operators::{MapRequest, MapSummary};
use crate::tools::{
    AgenticMapTool, Caller, ListDir, LlmMapTool, ReadFile, Tool, ToolError, ToolFormat,
    ToolRegistry, WriteFile,
};
use retry::{Attempt, retry_until};
use root::{RootActor, RootMsg};
use session::SessionMsg;
use shared::{AskError, Shared, ask, ask_service, join_blocking};
use writer::GroupWriter;

/// Where the runtime keeps its data.
#[derive(Debug, Clone)]
pub enum StoreLocation {
    /// A data directory (`lcm.redb` and `index/`), created if absent.
    Dir(PathBuf),
    /// In memory only (tests, ephemeral agents): gone when the runtime is dropped.
    Memory,
}

/// How to open a runtime.
#[derive(Clone)]
pub struct RuntimeOptions {
    pub location: StoreLocation,
    pub config: Config,
    /// The summariser for compaction; `None` builds the one `config.llm` describes.
    pub summarizer: Option<Arc<dyn Summarizer>>,
    /// The model for operators (llm_map) and sub-agents; `None` builds the one `config.llm`
    /// describes (none for the offline `extractive` setting).
    pub llm: Option<LlmClients>,
    /// The host's own tools, offered to models beside the built-in ones.
    pub tools: Vec<Arc<dyn Tool>>,
}

impl RuntimeOptions {
    /// A runtime over the data directory at `path`.
    pub fn dir(path: impl Into<PathBuf>, config: Config) -> RuntimeOptions {
        RuntimeOptions {
            location: StoreLocation::Dir(path.into()),
            config,
            summarizer: None,
            llm: None,
            tools: Vec::new(),
        }
    }

    /// A runtime whose store lives in memory.
    pub fn in_memory(config: Config) -> RuntimeOptions {
        RuntimeOptions {
            location: StoreLocation::Memory,
            config,
            summarizer: None,
            llm: None,
            tools: Vec::new(),
        }
    }

    /// Uses `summarizer` instead of the configured one.
    pub fn with_summarizer(mut self, summarizer: Arc<dyn Summarizer>) -> RuntimeOptions {
        self.summarizer = Some(summarizer);
        self
    }

    /// Offers the host's `tool` to models (main agents and sub-agents) beside the built-ins.
    pub fn with_tool(mut self, tool: Arc<dyn Tool>) -> RuntimeOptions {
        self.tools.push(tool);
        self
    }

    /// Uses `llm` for operators and sub-agents instead of the configured model.
    pub fn with_llm(mut self, llm: LlmClients) -> RuntimeOptions {
        self.llm = Some(llm);
        self
    }
}

/// A running runtime. Cheap to clone; all clones drive the same actors. The store file is
/// released when the runtime is shut down and every clone and session handle is dropped.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    root: ActorRef<RootMsg>,
    root_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropped without `shutdown`: stop the actors (each change is atomic, so abandoning
        // work loses nothing stored).
        self.root.stop(Some("runtime dropped".into()));
        self.shared.writer.close();
    }
}

impl Runtime {
    /// Opens the store and index and starts the actors. Must be called inside a tokio runtime
    /// (multi-threaded: store work runs on the blocking pool).
    pub async fn open(options: RuntimeOptions) -> Result<Runtime, RuntimeError> {
        let location = options.location.clone();
        Self::start(options, move |config| open_store(location, config)).await
    }

    /// Opens a runtime over `store`, which the caller opened (tests open one on a disk that can
    /// be made to fail: `lcm_store::disk_faults`). The search index lives in memory;
    /// `options.location` is not used.
    #[doc(hidden)]
    pub async fn open_on_store(
        store: Store,
        options: RuntimeOptions,
    ) -> Result<Runtime, RuntimeError> {
        Self::start(options, move |config| {
            let index = SearchIndex::open_in_ram(&store, &config.search)?;
            Ok((Arc::new(store), Arc::new(index)))
        })
        .await
    }

    /// Starts the runtime over the store and index `open` opens (on the blocking pool).
    async fn start(
        options: RuntimeOptions,
        open: impl FnOnce(&Config) -> Result<(Arc<Store>, Arc<SearchIndex>), RuntimeError>
        + Send
        + 'static,
    ) -> Result<Runtime, RuntimeError> {
        options
            .config
            .validate()
            .map_err(|e| RuntimeError::Invalid(e.to_string()))?;
        let config = Arc::new(options.config);
        let summarizer = match options.summarizer {
            Some(s) => s,
            None => {
                let counter = TokenCounter::new(config.tokenizer.encoding());
                summarizer_from_config(&config.llm, counter)
                    .map_err(|e| RuntimeError::Start(format!("summariser: {e}")))?
            }
        };
        let llm = match options.llm {
            Some(llm) => Some(llm),
            None => clients_from_config(&config.llm)
                .map_err(|e| RuntimeError::Start(format!("LLM client: {e}")))?,
        };
        let mut tools = ToolRegistry::with_builtins();
        let runtime_tools: [Arc<dyn Tool>; 5] = [
            Arc::new(LlmMapTool),
            Arc::new(AgenticMapTool),
            Arc::new(ReadFile),
            Arc::new(ListDir),
            Arc::new(WriteFile),
        ];
        for tool in runtime_tools.into_iter().chain(options.tools) {
            tools
                .register(tool)
                .map_err(|e| RuntimeError::Invalid(e.to_string()))?;
        }
        let open_config = Arc::clone(&config);
        let (store, index) =
            join_blocking(tokio::task::spawn_blocking(move || open(&open_config)).await)??;
        let (writer, writer_thread) = GroupWriter::start(Arc::clone(&store))
            .map_err(|e| RuntimeError::Start(format!("writer thread: {e}")))?;
        let shared = Arc::new(Shared::new(
            store, index, config, summarizer, llm, tools, writer,
        ));
        let (root, root_task) = RootActor::spawn(None, RootActor, shared.lease())
            .await
            .map_err(|e| RuntimeError::Start(e.to_string()))?;
        Ok(Runtime {
            inner: Arc::new(Inner {
                shared,
                root,
                root_task: Mutex::new(Some(root_task)),
                writer_thread: Mutex::new(Some(writer_thread)),
            }),
        })
    }

    /// The handle of the session with host key `key`, created if absent.
    pub async fn session(&self, key: &str) -> Result<SessionHandle, RuntimeError> {
        self.check_open()?;
        let store = Arc::clone(&self.inner.shared.store);
        let key = key.to_string();
        let id =
            join_blocking(tokio::task::spawn_blocking(move || store.ensure_session(&key)).await)??;
        Ok(self.handle(id))
    }

    /// The handle of an existing session.
    pub async fn session_by_id(&self, id: SessionId) -> Result<SessionHandle, RuntimeError> {
        self.check_open()?;
        let store = Arc::clone(&self.inner.shared.store);
        join_blocking(tokio::task::spawn_blocking(move || store.session(id)).await)??;
        Ok(self.handle(id))
    }

    fn handle(&self, id: SessionId) -> SessionHandle {
        SessionHandle {
            runtime: self.clone(),
            id,
            actor: Mutex::new(None),
        }
    }

    /// Events from now on (compactions, failures, restarts, ...).
    pub fn subscribe(&self) -> broadcast::Receiver<RuntimeEvent> {
        self.inner.shared.events.subscribe()
    }

    /// The store (the truth). Reads are always safe; writes should go through session handles,
    /// which serialise them per session.
    pub fn store(&self) -> &Arc<Store> {
        &self.inner.shared.store
    }

    /// The search index (a cache of the store; see [`Runtime::flush_index`]).
    pub fn index(&self) -> &Arc<SearchIndex> {
        &self.inner.shared.index
    }

    /// The configuration the runtime runs with.
    pub fn config(&self) -> &Config {
        &self.inner.shared.config
    }

    /// The runtime's summariser: what compactions use unless their session has one of its own
    /// ([`SessionHandle::set_summarizer`]).
    pub fn summarizer(&self) -> &Arc<dyn Summarizer> {
        &self.inner.shared.summarizer
    }

    /// Sessions with a summariser of their own now (entries past their idle time are dropped
    /// first).
    pub fn session_summarizer_count(&self) -> usize {
        self.inner.shared.session_summarizers.len()
    }

    /// The fault plan of this runtime (tests only: the `fault-injection` feature).
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> &Faults {
        &self.inner.shared.faults
    }

    /// Catches the search index up with the store now; the number of messages indexed.
    pub async fn flush_index(&self) -> Result<u64, RuntimeError> {
        let shared = &self.inner.shared;
        let slot = &shared.services.indexer;
        ask_service(shared, slot, ActorKind::Indexer, indexer::IndexerMsg::Flush).await?
    }

    /// Runs the integrity check now (and the safe repairs if `repair`).
    pub async fn check_integrity(&self, repair: bool) -> Result<IntegrityOutcome, RuntimeError> {
        let shared = &self.inner.shared;
        let slot = &shared.services.integrity;
        ask_service(shared, slot, ActorKind::Integrity, |reply| {
            integrity::IntegrityMsg::Check { repair, reply }
        })
        .await?
    }

    /// Starts an `llm_map` job (the request is validated first: schema, paths inside the
    /// allowed roots); it runs in the background, resumed after crashes and restarts.
    pub async fn llm_map(&self, request: MapRequest) -> Result<MapJob, RuntimeError> {
        self.check_open()?;
        let request = Box::new(request);
        let caller = Box::new(Caller::main_agent(None));
        self.map_call(move |reply| map_pool::MapPoolMsg::Start {
            request,
            caller,
            reply,
        })
        .await?
    }

    /// Waits until `job`'s run ends and returns its summary (counts, output path, examples,
    /// failures; never the whole output). A restart of the map worker pool meanwhile does not
    /// end the wait: the new pool resumes the job and the wait follows it.
    pub async fn map_wait(&self, job: JobId) -> Result<MapSummary, RuntimeError> {
        map_pool::wait(&self.inner.shared, job).await?
    }

    /// Cancels `job`: nothing more is claimed, answers in flight are abandoned.
    pub async fn map_cancel(&self, job: JobId) -> Result<(), RuntimeError> {
        self.map_call(move |reply| map_pool::MapPoolMsg::Cancel { job, reply })
            .await?
    }

    /// Runs `job` again from where it stopped (completed items are not redone).
    pub async fn map_resume(&self, job: JobId) -> Result<(), RuntimeError> {
        self.map_call(move |reply| map_pool::MapPoolMsg::Resume { job, reply })
            .await?
    }

    async fn map_call<T: Send + 'static>(
        &self,
        build: impl FnOnce(ractor::RpcReplyPort<T>) -> map_pool::MapPoolMsg,
    ) -> Result<T, RuntimeError> {
        map_pool::call(&self.inner.shared, build).await
    }

    /// Calls the tool `name` with JSON `args` as a main agent outside any session: searches
    /// default to every session, sub-agents and map jobs are children of no session. The
    /// arguments are validated against the tool's schema first; the error is written for the
    /// model. [`SessionHandle::call_tool`] calls as one session's main agent instead.
    pub async fn call_tool(
        &self,
        name: &str,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, ToolError> {
        let shared = &self.inner.shared;
        let ctx = delegation::tool_context(&shared.lease(), Caller::main_agent(None));
        shared.tools.call(&ctx, name, args).await
    }

    /// The tools a main agent is offered, in a provider's function-calling shape.
    pub fn tool_definitions(&self, format: ToolFormat) -> serde_json::Value {
        self.inner
            .shared
            .tools
            .export_for(format, &Caller::main_agent(None))
    }

    /// The delegation actor's observable state (sub-agents running, started, refused; the
    /// delegation tree's depth and fan-out).
    pub async fn delegation_stats(&self) -> Result<DelegationStats, RuntimeError> {
        let shared = &self.inner.shared;
        let slot = &shared.services.delegation;
        ask_service(
            shared,
            slot,
            ActorKind::Delegation,
            delegation::DelegationMsg::Stats,
        )
        .await
    }

    /// The supervisor's observable state (live sessions, restarts, stalls).
    pub async fn supervisor_stats(&self) -> Result<SupervisorStats, RuntimeError> {
        let shared = &self.inner.shared;
        ask(&self.inner.root, shared.call_timeout(), RootMsg::Stats)
            .await
            .map_err(|_| gone(ActorKind::Runtime))
    }

    /// The compactor's observable state (running, queued, finished, worker failures).
    pub async fn compactor_stats(&self) -> Result<CompactorStats, RuntimeError> {
        let shared = &self.inner.shared;
        let slot = &shared.services.compactor;
        ask_service(
            shared,
            slot,
            ActorKind::Compactor,
            compactor::CompactorMsg::Stats,
        )
        .await
    }

    /// Stops the runtime: no new work is taken; running compactions get up to `grace` to
    /// finish (then they are abandoned, which is safe: every pass is one transaction); queued
    /// appends and context requests are served; the index catches up; the actors stop.
    pub async fn shutdown(&self, grace: Duration) -> Result<(), RuntimeError> {
        let shared = Arc::clone(&self.inner.shared);
        let deadline = Instant::now() + grace;
        let sessions = ask(
            &self.inner.root,
            grace.max(Duration::from_millis(100)),
            RootMsg::BeginShutdown,
        )
        .await
        .unwrap_or_default();
        shared.set_closing();
        // Sessions' own summarisers (and the credentials they may hold) go now; a compaction
        // still running keeps the one it started with until it ends.
        shared.session_summarizers.clear();
        // Map jobs stop where they are (answers in are committed, claims given back); they stay
        // running in the store and the next runtime resumes them.
        if let Some(pool) = shared.services.map_pool.get() {
            let _ = ask(
                &pool,
                grace.max(Duration::from_millis(100)),
                map_pool::MapPoolMsg::Drain,
            )
            .await;
        }
        // Running compactions finish (or the grace period ends); nothing queued starts. The
        // compactor answers once none runs; a compactor gone answers nothing, which ends the
        // wait as well.
        if let Some(compactor) = shared.services.compactor.get() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let _ = ask(&compactor, remaining, compactor::CompactorMsg::Drain).await;
        }
        for session in sessions {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let _ = session
                .drain_and_wait(Some(remaining.max(Duration::from_millis(10))))
                .await;
        }
        if let Some(indexer) = shared.services.indexer.get() {
            let _ = ask(
                &indexer,
                grace.max(Duration::from_secs(1)),
                indexer::IndexerMsg::Flush,
            )
            .await;
        }
        self.inner.root.stop(Some("shutdown".into()));
        let task = self
            .inner
            .root_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        shared.writer.close();
        let thread = self
            .inner
            .writer_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
        // Actors killed with the root drop their leases as they stop, and blocking tasks they
        // started finish quickly; wait (notified, at most 5 s) for every lease of the shared
        // state, so that the store file is free once every handle is dropped.
        let _ = tokio::time::timeout(Duration::from_secs(5), shared.leases_returned()).await;
        Ok(())
    }

    fn check_open(&self) -> Result<(), RuntimeError> {
        if self.inner.shared.is_closing() {
            Err(RuntimeError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    async fn session_actor(&self, id: SessionId) -> Result<ActorRef<SessionMsg>, RuntimeError> {
        let shared = &self.inner.shared;
        let root = &self.inner.root;
        let deadline = Instant::now() + shared.call_timeout();
        retry_until(deadline, || async move {
            if let Err(error) = self.check_open() {
                return Attempt::Done(Err(error));
            }
            let answer = ask(root, shared.call_timeout(), |reply| RootMsg::Session {
                session: id,
                reply,
            })
            .await;
            match answer {
                // The session's actor is waiting out its restart backoff.
                Ok(Err(error @ RuntimeError::Restarting { retry_after, .. })) => Attempt::Again {
                    after: retry_after,
                    error,
                },
                Ok(result) => Attempt::Done(result),
                Err(_) if shared.is_closing() => Attempt::Done(Err(RuntimeError::ShuttingDown)),
                Err(_) => Attempt::Done(Err(gone(ActorKind::Runtime))),
            }
        })
        .await
    }
}

fn timeout(kind: ActorKind, shared: &Shared) -> RuntimeError {
    RuntimeError::Timeout {
        kind,
        timeout: shared.call_timeout(),
    }
}

fn gone(kind: ActorKind) -> RuntimeError {
    RuntimeError::Unavailable {
        kind,
        detail: "it stopped".into(),
    }
}

fn open_store(
    location: StoreLocation,
    config: &Config,
) -> Result<(Arc<Store>, Arc<SearchIndex>), RuntimeError> {
    match location {
        StoreLocation::Dir(path) => {
            let dir = DataDir::open(&path, config)?;
            Ok((dir.store, dir.index))
        }
        StoreLocation::Memory => {
            let store = Store::open_in_memory(StoreOptions::from_config(config))?;
            let index = SearchIndex::open_in_ram(&store, &config.search)?;
            Ok((Arc::new(store), Arc::new(index)))
        }
    }
}

/// Why a call to a session actor got no answer.
enum CallError {
    /// The actor died before answering.
    Gone,
    /// No answer in time.
    Timeout,
    /// The runtime refused to start the session's actor.
    Refused(RuntimeError),
}

/// A host's handle on one session. Calls go to the session's actor, which is started on first
/// use, stops when idle, and is restarted (transparently for idempotent calls) if it fails.
pub struct SessionHandle {
    runtime: Runtime,
    id: SessionId,
    actor: Mutex<Option<ActorRef<SessionMsg>>>,
}

impl SessionHandle {
    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// Appends one message; durable when it returns.
    pub async fn append(&self, message: NewMessage) -> Result<Appended, RuntimeError> {
        let mut out = self.append_batch(vec![message]).await?;
        out.pop()
            .ok_or_else(|| RuntimeError::Invalid("nothing was appended".into()))
    }

    /// Appends messages in one transaction; durable when it returns.
    ///
    /// If the session's actor dies before answering, a batch whose messages all have a
    /// `source_key` is retried against the restarted actor (the keys make the retry
    /// idempotent); otherwise [`RuntimeError::Unacknowledged`] says the outcome is unknown.
    pub async fn append_batch(
        &self,
        messages: Vec<NewMessage>,
    ) -> Result<Vec<Appended>, RuntimeError> {
        let retryable = messages.iter().all(|m| m.source_key.is_some());
        let keep = retryable.then(|| messages.clone());
        let mut pending = Some(messages);
        let deadline = Instant::now() + self.runtime.inner.shared.call_timeout();
        retry_until(deadline, || {
            // The first attempt sends the batch itself, a retry a copy (kept only if retryable).
            let batch = pending.take().or_else(|| keep.clone()).unwrap_or_default();
            async move {
                let answer = self
                    .call(|reply| SessionMsg::Append {
                        messages: batch,
                        reply,
                    })
                    .await;
                let unacknowledged = RuntimeError::Unacknowledged { session: self.id };
                match answer {
                    Err(CallError::Gone) if retryable => Attempt::lost(unacknowledged),
                    Err(CallError::Gone) => Attempt::Done(Err(unacknowledged)),
                    other => Attempt::Done(self.answer(other)),
                }
            }
        })
        .await
    }

    /// The context to send to a model whose window is `budget` tokens (the configured safety
    /// margin is kept free). Below the soft threshold this only reads; between soft and hard it
    /// starts a background compaction and answers at once; above hard it waits for compaction.
    pub async fn context(&self, budget: u64) -> Result<AssembledContext, RuntimeError> {
        let deadline = Instant::now() + self.runtime.inner.shared.call_timeout();
        retry_until(deadline, || async move {
            match self
                .call(|reply| SessionMsg::Context { budget, reply })
                .await
            {
                // Reading is idempotent: ask the restarted actor.
                Err(CallError::Gone) => Attempt::lost(gone(ActorKind::Session)),
                other => Attempt::Done(self.answer(other)),
            }
        })
        .await
    }

    /// Calls the tool `name` with JSON `args` as this session's main agent (the arguments are
    /// validated against the tool's schema first). The error is written for the model.
    pub async fn call_tool(
        &self,
        name: &str,
        args: serde_json::Value,
    ) -> Result<serde_json::Value, ToolError> {
        let shared = &self.runtime.inner.shared;
        let ctx = delegation::tool_context(&shared.lease(), Caller::main_agent(Some(self.id)));
        shared.tools.call(&ctx, name, args).await
    }

    /// The tools this session's main agent is offered (the built-ins, `llm_map`, the host's
    /// tools), as the agent loop ([`crate::agent::run_agent`]) takes them: the adapter the
    /// runtime's sub-agents run on, called as this session's main agent. It holds the runtime
    /// open: drop it before [`Runtime::shutdown`], which waits for it.
    pub fn agent_tools(&self) -> RegistryTools {
        RegistryTools::new(
            &self.runtime.inner.shared.lease(),
            Caller::main_agent(Some(self.id)),
        )
    }

    /// Has this session's compactions summarised by `summarizer` instead of the runtime's,
    /// until the registration is not refreshed for `idle` (then it is dropped, with whatever
    /// the summariser holds). Replaces any summariser registered before; a compaction already
    /// running finishes with the one it started with.
    ///
    /// The registration lives in memory only: it is never stored, and a new runtime starts
    /// without any. Expiry is checked on every access and on the compactor's heartbeat.
    pub fn set_summarizer(&self, summarizer: Arc<dyn Summarizer>, idle: Duration) {
        self.runtime
            .inner
            .shared
            .session_summarizers
            .set(self.id, summarizer, None, idle);
    }

    /// Refreshes this session's summariser, or registers a new one: when a live registration
    /// made with the same `tag` (a fingerprint of what the summariser is built from, chosen by
    /// the caller) exists, its idle clock restarts (with `idle`) and nothing is built;
    /// otherwise the summariser `make` builds replaces any registration, as
    /// [`Self::set_summarizer`] does. Returns whether `make` ran; its error, if it failed
    /// (the registration is then unchanged).
    pub fn refresh_summarizer<E>(
        &self,
        tag: u64,
        idle: Duration,
        make: impl FnOnce() -> Result<Arc<dyn Summarizer>, E>,
    ) -> Result<bool, E> {
        let registry = &self.runtime.inner.shared.session_summarizers;
        if registry.refresh(self.id, tag, idle) {
            return Ok(false);
        }
        // Built outside the registry's lock (building may take a while); a concurrent
        // registration for the same session is simply replaced.
        let summarizer = make()?;
        registry.set(self.id, summarizer, Some(tag), idle);
        Ok(true)
    }

    /// Drops this session's own summariser; whether a live one was registered. Its compactions
    /// use the runtime's summariser again.
    pub fn clear_summarizer(&self) -> bool {
        self.runtime
            .inner
            .shared
            .session_summarizers
            .remove(self.id)
    }

    /// Whether this session has a live summariser of its own (an expired one is dropped).
    pub fn has_summarizer(&self) -> bool {
        self.runtime
            .inner
            .shared
            .session_summarizers
            .get(self.id)
            .is_some()
    }

    /// The session actor's observable state.
    pub async fn stats(&self) -> Result<SessionStats, RuntimeError> {
        self.call(SessionMsg::Stats).await.map_err(|e| match e {
            CallError::Refused(error) => error,
            _ => gone(ActorKind::Session),
        })
    }

    /// The outcome of a [`Self::call`] that is not retried: its answer, or why it failed.
    fn answer<T>(
        &self,
        outcome: Result<Result<T, RuntimeError>, CallError>,
    ) -> Result<T, RuntimeError> {
        match outcome {
            Ok(result) => result,
            Err(CallError::Refused(error)) => Err(error),
            Err(CallError::Timeout) => Err(timeout(ActorKind::Session, &self.runtime.inner.shared)),
            Err(CallError::Gone) => Err(gone(ActorKind::Session)),
        }
    }

    /// Sends one RPC to the session's actor (resolving it through the root when needed).
    async fn call<T: Send + 'static>(
        &self,
        build: impl FnOnce(ractor::RpcReplyPort<T>) -> SessionMsg,
    ) -> Result<T, CallError> {
        let actor = match self.cached_actor() {
            Some(actor) => actor,
            None => {
                let actor = self
                    .runtime
                    .session_actor(self.id)
                    .await
                    .map_err(CallError::Refused)?;
                *self.actor.lock().unwrap_or_else(|p| p.into_inner()) = Some(actor.clone());
                actor
            }
        };
        match ask(&actor, self.runtime.inner.shared.call_timeout(), build).await {
            Ok(value) => Ok(value),
            Err(AskError::Timeout) => Err(CallError::Timeout),
            Err(AskError::Gone) => {
                *self.actor.lock().unwrap_or_else(|p| p.into_inner()) = None;
                Err(CallError::Gone)
            }
        }
    }

    fn cached_actor(&self) -> Option<ActorRef<SessionMsg>> {
        let cached = self.actor.lock().unwrap_or_else(|p| p.into_inner()).clone();
        cached.filter(|a| {
            matches!(
                a.get_status(),
                ractor::ActorStatus::Running | ractor::ActorStatus::Starting
            )
        })
    }
}
