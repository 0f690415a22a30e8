//! The crash campaign (docs/RELIABILITY.md, "Crash campaign"): trials of SIGKILL and of
//! simulated power loss at random moments during mixed workloads, each followed by a reopen,
//! the integrity check and the workload's own invariant. Shared by the short run of the normal
//! suite (`tests/it/crash_campaign`) and the long one (`examples/crash_campaign.rs`).
//!
//! A trial runs one workload on a runtime (`lcm::engine::runtime`) over a fresh data directory:
//! - **SIGKILL**: in a child process (the host's own binary run again, told what to do by
//!   environment variables), which prints each acknowledgement on stdout; killed at a random
//!   moment after its first one.
//! - **power loss**: in this process, on a store opened on a [`PowerLossDisk`]; the power goes
//!   at a random moment, and the image that survives (what was synced, or that plus a random
//!   subset of the unsynced pages: the two modes alternate) becomes the data directory's store
//!   file.
//!
//! Then the data directory is opened by a new runtime (which recovers the store, catches the
//! index up and resumes map jobs) and checked: every acknowledged message is there, unchanged,
//! and full-text search finds it; every acknowledged summary, import and delegation is there;
//! a map job runs to completion with each item answered exactly once, in the store and in its
//! output file; every child session has its parent; the integrity check is clean.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lcm::core::config::Config;
use lcm::core::message::{NewMessage, Role};
use lcm::core::rng::SplitMix64;
use lcm::core::summary::{ContextMark, NodeRef};
use lcm::core::tokens::{Encoding, TokenCounter};
use lcm::engine::operators::MapRequest;
use lcm::engine::runtime::{Runtime, RuntimeEvent, RuntimeOptions};
use lcm::llm::extractive::ExtractiveSummarizer;
use lcm::llm::from_config::LlmClients;
use lcm::llm::http::HttpConfig;
use lcm::llm::openai::OpenAiProvider;
use lcm::llm::summarize::LlmSummarizer;
use lcm::llm::summarize::Summarizer;
use lcm::llm::testing::{RecordedRequest, ScriptedReply, ScriptedServer};
use lcm::store::import::{ImportOptions, import_file};
use lcm::store::power_loss::{PowerLossDisk, Survivor};
use lcm::store::{ItemState, JobStatus, Store, StoreOptions};
use lcm::{GrepMode, GrepRequest, MessageId, Scope, SessionId};
use serde_json::{Value, json};

/// Environment of a SIGKILL trial's child: the workload, the data directory's parent, the
/// scripted model's URL.
pub const CHILD_WORKLOAD_ENV: &str = "LCM_CRASH_CHILD_WORKLOAD";
const CHILD_DIR_ENV: &str = "LCM_CRASH_CHILD_DIR";
const CHILD_URL_ENV: &str = "LCM_CRASH_CHILD_URL";

/// What starts an acknowledgement on the child's stdout.
const ACK_PREFIX: &str = "LCM-CRASH-ACK ";
/// Items of a map job.
const MAP_ITEMS: u64 = 300;
/// The context budget the compaction workloads ask for (small: every few turns compact).
const BUDGET: u64 = 1_500;

/// What a trial runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Workload {
    /// Appends (single and batches) through the runtime.
    Appends,
    /// Imports of transcript files (slices of the real Claude Code sessions when present).
    Imports,
    /// Appends and context assembly that compact with the extractive summariser.
    CompactExtractive,
    /// The same with a summariser over HTTP (the scripted server on loopback).
    CompactHttp,
    /// An `llm_map` job answered by the scripted server.
    Map,
    /// Sub-agent delegations (the `Task` tool) answered by the scripted server.
    Delegation,
    /// All of the above but imports at once.
    Mixed,
}

impl Workload {
    /// Every workload, in table order.
    pub const ALL: [Workload; 7] = [
        Workload::Appends,
        Workload::Imports,
        Workload::CompactExtractive,
        Workload::CompactHttp,
        Workload::Map,
        Workload::Delegation,
        Workload::Mixed,
    ];

    /// Its name in tables, summaries and the child's environment.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Appends => "appends",
            Workload::Imports => "imports",
            Workload::CompactExtractive => "compact_extractive",
            Workload::CompactHttp => "compact_http",
            Workload::Map => "map",
            Workload::Delegation => "delegation",
            Workload::Mixed => "mixed",
        }
    }

    /// The workload named `name`.
    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }
}

/// How a trial crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// The process is killed with SIGKILL.
    Sigkill,
    /// The disk loses power; only what was synced survives.
    PowerLossSynced,
    /// The disk loses power; what was synced survives, and a random part of the rest.
    PowerLossReordered,
}

impl Kind {
    /// Its name in tables and summaries.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Sigkill => "sigkill",
            Kind::PowerLossSynced => "power_loss_synced",
            Kind::PowerLossReordered => "power_loss_reordered",
        }
    }
}

/// One trial of the plan.
#[derive(Debug, Clone, Copy)]
pub struct Trial {
    pub workload: Workload,
    pub kind: Kind,
    pub seed: u64,
}

/// `trials` trials, workloads and kinds in turn (half SIGKILL, a quarter of each power-loss
/// mode), each with its own seed.
pub fn plan(trials: usize, seed: u64) -> Vec<Trial> {
    let mut rng = SplitMix64::new(seed);
    let kinds = [
        Kind::Sigkill,
        Kind::PowerLossSynced,
        Kind::Sigkill,
        Kind::PowerLossReordered,
    ];
    (0..trials)
        .map(|i| Trial {
            workload: Workload::ALL[i % Workload::ALL.len()],
            // Shifted each round of workloads, so every pair comes up.
            kind: kinds[(i % Workload::ALL.len() + i / Workload::ALL.len()) % kinds.len()],
            seed: rng.next_u64(),
        })
        .collect()
}

/// What a trial found.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub trial: Trial,
    /// Acknowledgements checked after the crash, by what they acknowledged.
    pub acked: BTreeMap<&'static str, u64>,
    /// Broken promises (empty: the trial passed).
    pub violations: Vec<String>,
    /// Wall time of the trial, workload, crash and checks.
    pub elapsed: Duration,
    /// How long the workload ran before the crash.
    pub crashed_after: Duration,
}

/// Something the workload was told had succeeded.
#[derive(Debug, Clone, PartialEq)]
enum Ack {
    /// An appended message: its id and the number its text was made from.
    Message { id: u64, n: u64, tag: String },
    /// A summary a compaction applied.
    Summary { id: String },
    /// An import of the file at `path` returned.
    Import { path: PathBuf },
    /// A map job was created.
    Job { id: String },
    /// A delegation returned: the sub-agent's session and its parent.
    Task { child: u64, parent: u64 },
    /// The agent asked for a mark on a message of its session (`lcm_pin`, `lcm_forget`); the
    /// call had not returned yet.
    MarkAsked {
        session: u64,
        message: u64,
        op: MarkOp,
    },
    /// That call returned: the mark is made.
    Marked {
        session: u64,
        message: u64,
        op: MarkOp,
    },
}

/// A change of the agent's marks the compaction workloads make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MarkOp {
    Pin,
    Unpin,
    Forget,
}

impl MarkOp {
    fn name(self) -> &'static str {
        match self {
            MarkOp::Pin => "pin",
            MarkOp::Unpin => "unpin",
            MarkOp::Forget => "forget",
        }
    }

    fn parse(name: &str) -> Option<MarkOp> {
        [MarkOp::Pin, MarkOp::Unpin, MarkOp::Forget]
            .into_iter()
            .find(|op| op.name() == name)
    }
}

impl Ack {
    fn line(&self) -> String {
        match self {
            Ack::Message { id, n, tag } => format!("msg {id} {n} {tag}"),
            Ack::Summary { id } => format!("sum {id}"),
            Ack::Import { path } => format!("imp {}", path.display()),
            Ack::Job { id } => format!("job {id}"),
            Ack::Task { child, parent } => format!("task {child} {parent}"),
            Ack::MarkAsked {
                session,
                message,
                op,
            } => format!("mark? {session} {message} {}", op.name()),
            Ack::Marked {
                session,
                message,
                op,
            } => format!("mark {session} {message} {}", op.name()),
        }
    }

    fn parse(line: &str) -> Option<Ack> {
        let (what, rest) = line.split_once(' ')?;
        let mut words = rest.split(' ');
        Some(match what {
            "msg" => Ack::Message {
                id: words.next()?.parse().ok()?,
                n: words.next()?.parse().ok()?,
                tag: words.next()?.to_string(),
            },
            "sum" => Ack::Summary { id: rest.into() },
            "imp" => Ack::Import { path: rest.into() },
            "job" => Ack::Job { id: rest.into() },
            "task" => Ack::Task {
                child: words.next()?.parse().ok()?,
                parent: words.next()?.parse().ok()?,
            },
            "mark?" | "mark" => {
                let session = words.next()?.parse().ok()?;
                let message = words.next()?.parse().ok()?;
                let op = MarkOp::parse(words.next()?)?;
                if what == "mark" {
                    Ack::Marked {
                        session,
                        message,
                        op,
                    }
                } else {
                    Ack::MarkAsked {
                        session,
                        message,
                        op,
                    }
                }
            }
            _ => return None,
        })
    }

    fn what(&self) -> &'static str {
        match self {
            Ack::Message { .. } => "messages",
            Ack::Summary { .. } => "summaries",
            Ack::Import { .. } => "imports",
            Ack::Job { .. } => "map_jobs",
            Ack::Task { .. } => "delegations",
            Ack::MarkAsked { .. } => "marks_asked",
            Ack::Marked { .. } => "marks",
        }
    }
}

/// Where acknowledgements go: a list in this process, and stdout in a child.
#[derive(Clone, Default)]
struct Acks {
    list: Arc<Mutex<Vec<Ack>>>,
    print: bool,
}

impl Acks {
    fn push(&self, ack: Ack) {
        if self.print {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A child whose parent stopped reading has nothing left to do.
            if writeln!(out, "{ACK_PREFIX}{}", ack.line())
                .and_then(|()| out.flush())
                .is_err()
            {
                std::process::exit(0);
            }
        }
        self.list
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ack);
    }

    fn take(&self) -> Vec<Ack> {
        std::mem::take(&mut *self.list.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

fn text_for(n: u64, tag: &str) -> String {
    format!(
        "{tag} turn {n}: marker zq{n}{tag}x decided to change src/file_{n}.rs; error E{n:05} seen. {}",
        "More narrative text to summarise. ".repeat((n % 7 + 1) as usize)
    )
}

/// The unique word full-text search finds message `n` of `tag` by.
fn marker(n: u64, tag: &str) -> String {
    format!("zq{n}{tag}x")
}

/// The runtime's configuration for the trials: small compaction windows, quick indexing, map
/// paths confined to `root`, a short sub-agent step limit.
fn config(root: &Path) -> Config {
    let mut config = Config::default();
    config.map.allowed_roots = vec![root.to_path_buf()];
    config.map.concurrency = 8;
    config.runtime.index_interval_ms = 50;
    config.runtime.subagent_max_steps = 4;
    config.runtime.restart_backoff_ms = 5;
    config.compaction.fresh_tail = 4;
    config.compaction.leaf_chunk_tokens = 500;
    config.compaction.leaf_target_tokens = 120;
    config.compaction.condensed_fanout = 3;
    config.compaction.condensed_target_tokens = 200;
    config
}

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn provider(url: &str) -> Arc<OpenAiProvider> {
    Arc::new(OpenAiProvider::new(HttpConfig::new(url, "scripted")).expect("provider"))
}

/// The runtime options of a trial: the model and, for `CompactHttp` and `Mixed`, the summariser
/// on the scripted server; the extractive summariser otherwise.
fn options(root: &Path, url: &str, workload: Workload) -> RuntimeOptions {
    let summarizer: Arc<dyn Summarizer> = match workload {
        Workload::CompactHttp | Workload::Mixed => {
            Arc::new(LlmSummarizer::new(provider(url), counter(), "scripted"))
        }
        _ => Arc::new(ExtractiveSummarizer::new(counter())),
    };
    RuntimeOptions::dir(root.join("data"), config(root))
        .with_summarizer(summarizer)
        .with_llm(LlmClients::new(provider(url)))
}

fn item_of(request: &RecordedRequest) -> Option<Value> {
    let text = request.last_user_text()?;
    let line = text.split("Item (JSON):\n").nth(1)?.lines().next()?;
    serde_json::from_str(line).ok()
}

/// The scripted model: map items are answered from their content, sub-agents (`SLEEP n`) with
/// `done n`, anything else (a summary request) with a short summary.
pub fn scripted_answers() -> ScriptedReply {
    ScriptedReply::from_fn(|request| {
        if let Some(item) = item_of(request) {
            return ScriptedReply::ok(
                json!({
                    "id": item["id"],
                    "upper": item["word"].as_str().unwrap_or_default().to_uppercase()
                })
                .to_string(),
            );
        }
        let text = request.last_user_text().unwrap_or_default();
        if let Some(rest) = text.strip_prefix("SLEEP ") {
            return ScriptedReply::ok(format!("done {rest}"));
        }
        ScriptedReply::ok("The span reviewed modules and fixed flaky test cases; all pass now.")
    })
}

/// Starts the scripted server every trial's model and HTTP summariser talk to.
pub async fn start_server() -> ScriptedServer {
    let server = ScriptedServer::start().await;
    server.set_default(scripted_answers());
    server.set_latency(Duration::from_millis(3));
    server
}

fn map_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "upper": {"type": "string"}},
        "required": ["id", "upper"],
        "additionalProperties": false
    })
}

/// The input files of a trial's workloads under `root`: the map's items and the files to
/// import (slices of the real Claude Code sessions, or lcm JSONL files without them).
fn prepare_inputs(root: &Path, real: Option<&Path>) -> std::io::Result<()> {
    let items: Vec<String> = (0..MAP_ITEMS)
        .map(|i| json!({"id": i, "word": format!("w{i}x")}).to_string())
        .collect();
    std::fs::write(root.join("items.jsonl"), items.join("\n"))?;
    let imports = root.join("imports");
    std::fs::create_dir_all(&imports)?;
    let mut written = 0;
    if let Some(real) = real {
        let mut files: Vec<PathBuf> = std::fs::read_dir(real)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect();
        files.sort();
        for file in files.iter().take(4) {
            let text = std::fs::read_to_string(file)?;
            let lines: Vec<&str> = text.lines().collect();
            // Slices of 120 lines of each session, as separate files of the same session.
            for (k, chunk) in lines.chunks(120).take(6).enumerate() {
                let name = format!(
                    "{}-{k}.jsonl",
                    file.file_stem().unwrap_or_default().to_string_lossy()
                );
                std::fs::write(imports.join(name), chunk.join("\n") + "\n")?;
                written += 1;
            }
        }
    }
    if written == 0 {
        for n in 0..24u64 {
            let lines: String = (0..5)
                .map(|k| {
                    format!(
                        "{{\"session\":\"imported-{n}\",\"role\":\"user\",\"created_at\":\"2026-02-10T21:11:56Z\",\"key\":\"k{k}\",\"parts\":[{{\"type\":\"text\",\"text\":\"{}\"}}]}}\n",
                        text_for(n * 5 + k, "imp")
                    )
                })
                .collect();
            std::fs::write(imports.join(format!("{n:02}.jsonl")), lines)?;
        }
    }
    Ok(())
}

/// The real transcripts, if present (`LCM_CRASH_TRANSCRIPTS` or `../shared/data`).
pub fn real_transcripts() -> Option<PathBuf> {
    let dir = std::env::var_os("LCM_CRASH_TRANSCRIPTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/transcripts/claude-code")
        });
    dir.is_dir().then_some(dir)
}

/// Runs `workload` on `rt` until it fails (the crash) or, for the finite ones, ends.
async fn run_workload(rt: Runtime, root: PathBuf, workload: Workload, acks: Acks) {
    match workload {
        Workload::Appends => appends(rt, "app", acks).await,
        Workload::Imports => imports(rt, root, acks).await,
        Workload::CompactExtractive | Workload::CompactHttp => compactions(rt, "cmp", acks).await,
        Workload::Map => map(rt, root, acks).await,
        Workload::Delegation => delegations(rt, acks).await,
        Workload::Mixed => {
            let _ = tokio::join!(
                tokio::spawn(appends(rt.clone(), "mxa", acks.clone())),
                tokio::spawn(compactions(rt.clone(), "mxc", acks.clone())),
                tokio::spawn(map(rt.clone(), root, acks.clone())),
                tokio::spawn(delegations(rt, acks)),
            );
        }
    }
}

async fn appends(rt: Runtime, tag: &'static str, acks: Acks) {
    let Ok(session) = rt.session(&format!("crash-{tag}")).await else {
        return;
    };
    let mut n = 0u64;
    loop {
        if n.is_multiple_of(4) {
            let batch = (n..n + 6)
                .map(|k| NewMessage::text(Role::User, text_for(k, tag)))
                .collect();
            let Ok(results) = session.append_batch(batch).await else {
                return;
            };
            for (k, r) in (n..).zip(results) {
                acks.push(Ack::Message {
                    id: r.id.0,
                    n: k,
                    tag: tag.into(),
                });
            }
            n += 6;
        } else {
            let Ok(r) = session
                .append(NewMessage::text(Role::Assistant, text_for(n, tag)))
                .await
            else {
                return;
            };
            acks.push(Ack::Message {
                id: r.id.0,
                n,
                tag: tag.into(),
            });
            n += 1;
        }
    }
}

/// Pinned messages a compaction workload keeps at once (the oldest is unpinned first), well
/// within `compaction.pinned_max_tokens`.
const MAX_PINS: usize = 6;

/// Appends, each followed by a context for [`BUDGET`] (which compacts), and the agent's marks
/// on its context meanwhile: every third message pinned, every fifth other one forgotten
/// while it is raw.
async fn compactions(rt: Runtime, tag: &'static str, acks: Acks) {
    let Ok(session) = rt.session(&format!("crash-{tag}")).await else {
        return;
    };
    let mut events = rt.subscribe();
    let tools = lcm::engine::ToolRegistry::with_builtins();
    let ctx = lcm::engine::ToolContext::new(
        Arc::clone(rt.store()),
        Some(Arc::clone(rt.index())),
        Arc::new(rt.config().clone()),
        lcm::engine::Caller::main_agent(Some(session.id())),
    );
    let session_id = session.id().0;
    let mark = |message: MessageId, op: MarkOp| {
        let (tools, ctx, acks) = (&tools, &ctx, &acks);
        async move {
            let (session, message) = (session_id, message.0);
            acks.push(Ack::MarkAsked {
                session,
                message,
                op,
            });
            let (name, args) = match op {
                MarkOp::Pin => ("lcm_pin", json!({"id": format!("msg_{message}")})),
                MarkOp::Unpin => (
                    "lcm_pin",
                    json!({"id": format!("msg_{message}"), "unpin": true}),
                ),
                MarkOp::Forget => ("lcm_forget", json!({"id": format!("msg_{message}")})),
            };
            match tools.call(ctx, name, args).await {
                Ok(_) => {
                    acks.push(Ack::Marked {
                        session,
                        message,
                        op,
                    });
                    Some(true)
                }
                // Refused: the message was summarised before it could be forgotten.
                Err(lcm::engine::ToolError::InvalidRequest { .. }) => Some(false),
                Err(_) => None,
            }
        }
    };
    let mut pins: Vec<MessageId> = Vec::new();
    let mut n = 0u64;
    loop {
        let Ok(r) = session
            .append(NewMessage::text(Role::User, text_for(n, tag)))
            .await
        else {
            return;
        };
        acks.push(Ack::Message {
            id: r.id.0,
            n,
            tag: tag.into(),
        });
        n += 1;
        if session.context(BUDGET).await.is_err() {
            return;
        }
        if n % 3 == 1 {
            if pins.len() == MAX_PINS && mark(pins.remove(0), MarkOp::Unpin).await.is_none() {
                return;
            }
            match mark(r.id, MarkOp::Pin).await {
                Some(true) => pins.push(r.id),
                Some(false) => {}
                None => return,
            }
        } else if n % 5 == 1 && mark(r.id, MarkOp::Forget).await.is_none() {
            return;
        }
        while let Ok(event) = events.try_recv() {
            if let RuntimeEvent::SummaryWritten { summary, .. } = event {
                acks.push(Ack::Summary {
                    id: summary.to_string(),
                });
            }
        }
    }
}

async fn imports(rt: Runtime, root: PathBuf, acks: Acks) {
    let Ok(entries) = std::fs::read_dir(root.join("imports")) else {
        return;
    };
    let mut files: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    // Again and again: imports are idempotent, so later rounds store nothing new.
    loop {
        for file in &files {
            let store = Arc::clone(rt.store());
            let path = file.clone();
            let imported = tokio::task::spawn_blocking(move || {
                import_file(&store, &path, &ImportOptions::default(), |_, _| {})
            })
            .await;
            match imported {
                Ok(Ok(_)) => acks.push(Ack::Import { path: file.clone() }),
                _ => return,
            }
        }
    }
}

async fn map(rt: Runtime, root: PathBuf, acks: Acks) {
    let mut request = MapRequest::llm(
        root.join("items.jsonl"),
        "Upper-case the word.",
        map_schema(),
    );
    request.output_path = Some(root.join("items.out.jsonl"));
    let Ok(job) = rt.llm_map(request).await else {
        return;
    };
    acks.push(Ack::Job {
        id: job.id.to_string(),
    });
    let _ = rt.map_wait(job.id).await;
}

async fn delegations(rt: Runtime, acks: Acks) {
    let Ok(main) = rt.session("crash-main").await else {
        return;
    };
    for n in 0u64.. {
        let Ok(out) = main
            .call_tool("Task", json!({"prompt": format!("SLEEP {n}")}))
            .await
        else {
            return;
        };
        let Some(child) = out["session"]
            .as_str()
            .and_then(|s| s.parse::<SessionId>().ok())
            .or_else(|| serde_json::from_value::<SessionId>(out["session"].clone()).ok())
        else {
            return;
        };
        acks.push(Ack::Task {
            child: child.0,
            parent: main.id().0,
        });
    }
}

/// The child of a SIGKILL trial, if this process is one: runs the workload its environment
/// names until it is killed. Returns `false` when this process is not a child.
pub fn run_child_if_asked() -> bool {
    let (Ok(workload), Ok(dir), Ok(url)) = (
        std::env::var(CHILD_WORKLOAD_ENV),
        std::env::var(CHILD_DIR_ENV),
        std::env::var(CHILD_URL_ENV),
    ) else {
        return false;
    };
    let workload = Workload::parse(&workload).expect("a known workload");
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    tokio.block_on(async {
        let root = PathBuf::from(dir);
        let rt = Runtime::open(options(&root, &url, workload))
            .await
            .expect("the child opens its runtime");
        let acks = Acks {
            print: true,
            ..Acks::default()
        };
        run_workload(rt, root, workload, acks).await;
        // A finite workload that ended waits for the kill.
        tokio::time::sleep(Duration::from_secs(3_600)).await;
    });
    true
}

/// Runs one trial; `child` makes the command that runs this binary as a SIGKILL trial's child
/// (the campaign adds the environment).
pub async fn run_trial(
    trial: Trial,
    server: &ScriptedServer,
    real: Option<&Path>,
    child: &(dyn Fn() -> Command + Sync),
) -> Outcome {
    let started = Instant::now();
    let tmp = tempfile::tempdir().expect("temp dir");
    let root = tmp.path().to_path_buf();
    let mut violations = Vec::new();
    if let Err(e) = prepare_inputs(&root, real) {
        violations.push(format!("preparing the inputs failed: {e}"));
    }
    let mut rng = SplitMix64::new(trial.seed);
    let (acked, crashed_after) = match trial.kind {
        Kind::Sigkill => sigkill(trial, &root, server, &mut rng, child, &mut violations).await,
        Kind::PowerLossSynced | Kind::PowerLossReordered => {
            power_loss(trial, &root, server, &mut rng, &mut violations).await
        }
    };
    let mut counts = BTreeMap::new();
    for ack in &acked {
        *counts.entry(ack.what()).or_insert(0) += 1;
    }
    if violations.is_empty() {
        verify(
            trial.workload,
            &root,
            &server.url(),
            &acked,
            &mut violations,
        )
        .await;
    }
    Outcome {
        trial,
        acked: counts,
        violations,
        elapsed: started.elapsed(),
        crashed_after,
    }
}

/// The moment of the crash: 50 to 1,250 ms into the workload, later for the slow starters.
fn crash_delay(workload: Workload, rng: &mut SplitMix64) -> Duration {
    let base = match workload {
        Workload::Map | Workload::Mixed | Workload::Delegation => 150,
        _ => 50,
    };
    Duration::from_millis(base + rng.below(1_100))
}

async fn sigkill(
    trial: Trial,
    root: &Path,
    server: &ScriptedServer,
    rng: &mut SplitMix64,
    child: &(dyn Fn() -> Command + Sync),
    violations: &mut Vec<String>,
) -> (Vec<Ack>, Duration) {
    let spawned = child()
        .env(CHILD_WORKLOAD_ENV, trial.workload.name())
        .env(CHILD_DIR_ENV, root)
        .env(CHILD_URL_ENV, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut process = match spawned {
        Ok(p) => p,
        Err(e) => {
            violations.push(format!("the child did not start: {e}"));
            return (Vec::new(), Duration::ZERO);
        }
    };
    let Some(stdout) = process.stdout.take() else {
        violations.push("the child has no stdout".into());
        return (Vec::new(), Duration::ZERO);
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may have printed the test's name on the same line first.
            if let Some((_, rest)) = line.split_once(ACK_PREFIX) {
                let parsed = Ack::parse(rest);
                if tx.send(parsed.ok_or(line)).is_err() {
                    break;
                }
            }
        }
    });
    let delay = crash_delay(trial.workload, rng);
    let kill_at = tokio::task::spawn_blocking(move || {
        // The clock starts at the first acknowledgement (the child is working).
        let first = rx.recv_timeout(Duration::from_secs(60));
        let started = Instant::now();
        std::thread::sleep(delay);
        (first, rx, started)
    })
    .await;
    let Ok((first, rx, started)) = kill_at else {
        violations.push("the timer task failed".into());
        return (Vec::new(), Duration::ZERO);
    };
    let _ = process.kill(); // SIGKILL
    let _ = process.wait();
    let _ = reader.join();
    let mut acked = Vec::new();
    match first {
        Ok(ack) => {
            for ack in std::iter::once(ack).chain(rx.try_iter()) {
                match ack {
                    Ok(ack) => acked.push(ack),
                    Err(line) => violations.push(format!("unreadable acknowledgement: {line}")),
                }
            }
        }
        Err(_) => violations.push("the child never acknowledged anything".into()),
    }
    (acked, started.elapsed())
}

async fn power_loss(
    trial: Trial,
    root: &Path,
    server: &ScriptedServer,
    rng: &mut SplitMix64,
    violations: &mut Vec<String>,
) -> (Vec<Ack>, Duration) {
    let disk = PowerLossDisk::new();
    let store = match Store::open_on_power_loss_disk(&disk, StoreOptions::new(counter())) {
        Ok(store) => store,
        Err(e) => {
            violations.push(format!("the store did not open on the simulated disk: {e}"));
            return (Vec::new(), Duration::ZERO);
        }
    };
    let rt = match Runtime::open_on_store(store, options(root, &server.url(), trial.workload)).await
    {
        Ok(rt) => rt,
        Err(e) => {
            violations.push(format!("the runtime did not start: {e}"));
            return (Vec::new(), Duration::ZERO);
        }
    };
    let acks = Acks::default();
    let started = Instant::now();
    let work = tokio::spawn(run_workload(
        rt.clone(),
        root.to_path_buf(),
        trial.workload,
        acks.clone(),
    ));
    tokio::time::sleep(crash_delay(trial.workload, rng)).await;
    // At a random moment, a few operations from now (mid-commit as often as between commits).
    disk.cut_after(disk.operations() + rng.below(8));
    let crashed_after = started.elapsed();
    // The process lives on with a dead disk: its work fails and ends.
    // An idle workload (a map job that ended) writes nothing more: the power goes anyway.
    let deadline = Instant::now() + Duration::from_secs(1);
    while !disk.is_cut() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    disk.cut();
    if tokio::time::timeout(Duration::from_secs(20), work)
        .await
        .is_err()
    {
        violations.push("the workload did not end after the power went".into());
    }
    let _ = rt.shutdown(Duration::from_secs(2)).await;
    drop(rt);
    let survivor = if trial.kind == Kind::PowerLossSynced {
        Survivor::Synced
    } else {
        Survivor::Reordered
    };
    let image = disk.survivor(survivor, rng.next_u64());
    let data = root.join("data");
    let written = std::fs::create_dir_all(&data)
        .and_then(|()| std::fs::write(data.join(lcm::search::data_dir::STORE_FILE), &image));
    if let Err(e) = written {
        violations.push(format!("writing the surviving image failed: {e}"));
    }
    (acks.take(), crashed_after)
}

/// Reopens the data directory and checks every promise.
async fn verify(
    workload: Workload,
    root: &Path,
    url: &str,
    acked: &[Ack],
    violations: &mut Vec<String>,
) {
    let rt = match Runtime::open(options(root, url, workload)).await {
        Ok(rt) => rt,
        Err(e) => {
            violations.push(format!("the data directory does not reopen: {e}"));
            return;
        }
    };
    let store = Arc::clone(rt.store());
    // The index catches up with the store (it may be behind, or rebuilt).
    if let Err(e) = rt.flush_index().await {
        violations.push(format!("the index does not catch up: {e}"));
    }
    for ack in acked {
        match ack {
            Ack::Message { id, n, tag } => match store.message(MessageId(*id)) {
                Ok(m) if m.search_text() == text_for(*n, tag) => {
                    // Full-text search finds a sample of them (every tenth).
                    if n.is_multiple_of(10)
                        && !found_by_search(&rt, &marker(*n, tag), MessageId(*id))
                    {
                        violations.push(format!(
                            "acknowledged msg_{id} is not found by full-text search"
                        ));
                    }
                }
                Ok(_) => violations.push(format!("acknowledged msg_{id} changed")),
                Err(e) => violations.push(format!("acknowledged msg_{id} lost: {e}")),
            },
            Ack::Summary { id } => {
                let found = id
                    .parse()
                    .ok()
                    .map(|id| store.summary(id).is_ok())
                    .unwrap_or(false);
                if !found {
                    violations.push(format!("acknowledged summary {id} lost"));
                }
            }
            Ack::Import { path } => {
                // An acknowledged import is whole: importing the file again stores nothing.
                let store = Arc::clone(&store);
                let file = path.clone();
                let again = tokio::task::spawn_blocking(move || {
                    import_file(&store, &file, &ImportOptions::default(), |_, _| {})
                })
                .await;
                match again {
                    Ok(Ok(report)) if report.imported == 0 => {}
                    Ok(Ok(report)) => violations.push(format!(
                        "acknowledged import of {} lost {} messages",
                        path.display(),
                        report.imported
                    )),
                    other => violations
                        .push(format!("re-importing {} failed: {other:?}", path.display())),
                }
            }
            Ack::Job { id } => {
                let known = store
                    .jobs()
                    .map(|jobs| jobs.iter().any(|j| j.id.to_string() == *id))
                    .unwrap_or(false);
                if !known {
                    violations.push(format!("acknowledged map job {id} lost"));
                }
            }
            // Checked together below: a mark depends on the calls after it.
            Ack::MarkAsked { .. } | Ack::Marked { .. } => {}
            Ack::Task { child, parent } => match store.session(SessionId(*child)) {
                Ok(info) if info.parent == Some(SessionId(*parent)) && info.message_count > 0 => {}
                Ok(info) => violations.push(format!(
                    "acknowledged delegation's session ses_{child} is half-made: {info:?}"
                )),
                Err(e) => violations.push(format!(
                    "acknowledged delegation's session ses_{child} lost: {e}"
                )),
            },
        }
    }
    check_marks(&store, acked, violations);
    check_jobs(&rt, root, violations).await;
    // No orphan child session: every parent named exists (the integrity check checks it too).
    if let Ok(sessions) = store.sessions() {
        for info in &sessions {
            if let Some(parent) = info.parent
                && store.session(parent).is_err()
            {
                violations.push(format!("{} is an orphan: {parent} is gone", info.id));
            }
        }
    }
    match rt.check_integrity(false).await {
        Ok(outcome) if outcome.report.is_clean() => {}
        Ok(outcome) => violations.push(format!("integrity check: {:?}", outcome.report.violations)),
        Err(e) => violations.push(format!("integrity check failed: {e}")),
    }
    if let Err(e) = rt.shutdown(Duration::from_secs(5)).await {
        violations.push(format!("the runtime does not shut down: {e}"));
    }
}

/// The agent's marks after the crash: each message's mark is the one its last returned call
/// made (none for a forgotten message summarised since: its mark goes with the summary that
/// covers it), or, when a call on it had not returned, possibly that call's.
fn check_marks(store: &Store, acked: &[Ack], violations: &mut Vec<String>) {
    // Per (session, message): the last call that returned, and one asked after it.
    let mut calls: BTreeMap<(u64, u64), (Option<MarkOp>, Option<MarkOp>)> = BTreeMap::new();
    for ack in acked {
        match *ack {
            Ack::MarkAsked {
                session,
                message,
                op,
            } => calls.entry((session, message)).or_default().1 = Some(op),
            Ack::Marked {
                session,
                message,
                op,
            } => *calls.entry((session, message)).or_default() = (Some(op), None),
            _ => {}
        }
    }
    for ((session, message), (returned, running)) in calls {
        let (session, id) = (SessionId(session), MessageId(message));
        let read = store.reader().and_then(|reader| {
            let raw_from = reader.context(session)?.raw_from;
            let raw = reader.message(id)?.seq >= raw_from;
            let mark = reader
                .marks(session)?
                .into_iter()
                .find(|m| m.node == NodeRef::Message(id))
                .map(|m| m.mark);
            Ok((raw, mark))
        });
        let (raw, mark) = match read {
            Ok(read) => read,
            Err(e) => {
                violations.push(format!("the marks of {session} cannot be read: {e}"));
                return;
            }
        };
        let made = |op: Option<MarkOp>| match op {
            Some(MarkOp::Pin) => Some(ContextMark::Pinned),
            Some(MarkOp::Forget) if raw => Some(ContextMark::Forgotten),
            Some(MarkOp::Unpin | MarkOp::Forget) | None => None,
        };
        let allowed = [Some(made(returned)), running.map(|op| made(Some(op)))];
        if !allowed.contains(&Some(mark)) {
            violations.push(format!(
                "{id} in {session} is marked {mark:?} after calls {returned:?} (returned), \
                 {running:?} (running)"
            ));
        }
    }
}

fn found_by_search(rt: &Runtime, word: &str, id: MessageId) -> bool {
    let request = GrepRequest {
        pattern: word.to_string(),
        mode: GrepMode::FullText,
        scope: Scope::default(),
        limit: Some(10),
        cursor: None,
    };
    lcm::grep(&**rt.store(), rt.index(), &rt.config().search, &request)
        .map(|page| page.hits.iter().any(|h| h.message == id))
        .unwrap_or(false)
}

/// Every map job the store holds runs to completion after the restart, each item answered
/// exactly once, in the store and in the output file (one line per item, in order).
async fn check_jobs(rt: &Runtime, root: &Path, violations: &mut Vec<String>) {
    let Ok(jobs) = rt.store().jobs() else {
        violations.push("the jobs do not read".into());
        return;
    };
    for job in jobs {
        if job.status == JobStatus::Preparing {
            continue; // never acknowledged: its items were still being written
        }
        let summary = match tokio::time::timeout(Duration::from_secs(60), rt.map_wait(job.id)).await
        {
            Ok(Ok(summary)) => summary,
            Ok(Err(e)) => {
                violations.push(format!("{} does not resume: {e}", job.id));
                continue;
            }
            Err(_) => {
                violations.push(format!("{} does not finish after the restart", job.id));
                continue;
            }
        };
        if summary.completed != MAP_ITEMS || summary.failed != 0 {
            violations.push(format!(
                "{}: {} completed, {} failed of {MAP_ITEMS}",
                job.id, summary.completed, summary.failed
            ));
        }
        let mut seen = 0u64;
        if let Ok(items) = rt.store().items_in_order(job.id) {
            for item in items {
                let Ok(item) = item else {
                    violations.push(format!("{}: an item does not read", job.id));
                    break;
                };
                let ok = item.index == seen
                    && matches!(&item.state, ItemState::Completed { result }
                        if serde_json::from_str::<Value>(result)
                            .is_ok_and(|v| v["id"] == seen && v["upper"] == format!("W{seen}X")));
                if !ok {
                    violations.push(format!("{}: item {seen} is {:?}", job.id, item.state));
                }
                seen += 1;
            }
        }
        if seen != MAP_ITEMS {
            violations.push(format!("{}: {seen} items of {MAP_ITEMS}", job.id));
        }
        let output = std::fs::read_to_string(root.join("items.out.jsonl")).unwrap_or_default();
        let mut indices = HashSet::new();
        for (i, line) in output.lines().enumerate() {
            let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
            if v["index"] != i as u64 || v["ok"] != true || !indices.insert(i) {
                violations.push(format!("output line {i} is wrong: {line}"));
                break;
            }
        }
        if indices.len() as u64 != MAP_ITEMS {
            violations.push(format!(
                "the output holds {} lines of {MAP_ITEMS}",
                indices.len()
            ));
        }
    }
}

/// Totals of a campaign by workload and kind.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut rows: BTreeMap<(Workload, Kind), (u64, u64, u64, Duration)> = BTreeMap::new();
    for o in outcomes {
        let row = rows.entry((o.trial.workload, o.trial.kind)).or_default();
        row.0 += 1;
        row.1 += o.acked.values().sum::<u64>();
        row.2 += u64::from(!o.violations.is_empty());
        row.3 += o.elapsed;
    }
    let mut out = format!(
        "{:<20} {:<22} {:>7} {:>14} {:>9} {:>10}\n",
        "workload", "kind", "trials", "acks checked", "failures", "time (s)"
    );
    for ((workload, kind), (trials, acks, failures, time)) in &rows {
        out.push_str(&format!(
            "{:<20} {:<22} {:>7} {:>14} {:>9} {:>10.1}\n",
            workload.name(),
            kind.name(),
            trials,
            acks,
            failures,
            time.as_secs_f64()
        ));
    }
    out
}

/// The campaign's summary as JSON.
pub fn summary_json(outcomes: &[Outcome], seed: u64, elapsed: Duration) -> Value {
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    let mut by_workload: BTreeMap<&str, u64> = BTreeMap::new();
    let mut acked: BTreeMap<&str, u64> = BTreeMap::new();
    for o in outcomes {
        *by_kind.entry(o.trial.kind.name()).or_default() += 1;
        *by_workload.entry(o.trial.workload.name()).or_default() += 1;
        for (what, n) in &o.acked {
            *acked.entry(what).or_default() += n;
        }
    }
    let failures: Vec<Value> = outcomes
        .iter()
        .filter(|o| !o.violations.is_empty())
        .map(|o| {
            json!({
                "workload": o.trial.workload.name(),
                "kind": o.trial.kind.name(),
                "seed": o.trial.seed,
                "violations": o.violations,
            })
        })
        .collect();
    json!({
        "seed": seed,
        "trials": outcomes.len(),
        "by_kind": by_kind,
        "by_workload": by_workload,
        "acknowledged_checked": acked,
        "failed_trials": failures.len(),
        "failures": failures,
        "seconds": elapsed.as_secs_f64(),
        "cores": std::thread::available_parallelism().map_or(1, usize::from),
    })
}
