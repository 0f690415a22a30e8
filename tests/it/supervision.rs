//! Fault injection into the supervised runtime: for each actor kind and each injection point,
//! a fault (panic, or a stall past the stall timeout) during a workload of many sessions. The
//! supervisor restarts the actor, every acknowledged message is present exactly once, the DAG
//! and context pass the integrity check, and the workload completes under budget.
//!
//! The `fault-injection` feature of lcm-engine is on for test targets only (the root package's
//! dev-dependency); release builds have no trace of it.

use std::sync::Arc;
use std::time::Duration;

use lcm::core::config::Config;
use lcm::core::ids::{MessageId, SessionId};
use lcm::core::message::{NewMessage, Role};
use lcm::core::tokens::{Encoding, TokenCounter};
use lcm::engine::runtime::{ActorKind, Fault, FaultPoint, Runtime, RuntimeOptions};
use lcm::llm::extractive::ExtractiveSummarizer;

const SESSIONS: usize = 6;
const TURNS: usize = 60;
/// About 2,600 tokens of history per session: compaction runs several times.
const BUDGET: u64 = 1_500;

fn config() -> Config {
    let mut config = Config::default();
    config.compaction.fresh_tail = 8;
    config.compaction.leaf_chunk_tokens = 500;
    config.compaction.leaf_target_tokens = 120;
    config.compaction.condensed_target_tokens = 160;
    config.runtime.heartbeat_ms = 50;
    config.runtime.index_interval_ms = 20;
    config.runtime.restart_backoff_ms = 5;
    config.runtime.restart_backoff_max_ms = 100;
    config.runtime.max_restarts = 50;
    config.runtime.stall_timeout_s = 1;
    config
}

async fn runtime(config: Config) -> Runtime {
    let summarizer = Arc::new(ExtractiveSummarizer::new(TokenCounter::new(
        Encoding::O200kBase,
    )));
    Runtime::open(RuntimeOptions::in_memory(config).with_summarizer(summarizer))
        .await
        .expect("runtime opens")
}

fn message(session: usize, turn: usize) -> NewMessage {
    let role = if turn.is_multiple_of(2) {
        Role::User
    } else {
        Role::Assistant
    };
    NewMessage::text(
        role,
        format!(
            "session {session} turn {turn}: we checked the migration of table t{turn} and the \
             index on column c{} before the release of build {}",
            turn % 5,
            1000 + turn
        ),
    )
    .with_source_key(format!("s{session}-t{turn}"))
}

/// Drives `SESSIONS` sessions concurrently, `TURNS` turns each (append, then the context for
/// the budget); returns each session's acknowledged message ids.
async fn workload(rt: &Runtime, tag: &str) -> Vec<(SessionId, Vec<MessageId>)> {
    let mut tasks = Vec::new();
    for k in 0..SESSIONS {
        let rt = rt.clone();
        let key = format!("{tag}-{k}");
        tasks.push(tokio::spawn(async move {
            let s = rt.session(&key).await.expect("session");
            let mut acked = Vec::new();
            for t in 0..TURNS {
                let a = s.append(message(k, t)).await.expect("append acknowledged");
                acked.push(a.id);
                let ctx = s.context(BUDGET).await.expect("context");
                assert!(ctx.tokens <= BUDGET, "{} > {BUDGET}", ctx.tokens);
            }
            (s.id(), acked)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("workload task"));
    }
    out
}

/// Every acknowledged message is stored once, every message is reachable exactly once from the
/// context, the index catches up, and the integrity check is clean.
async fn verify(rt: &Runtime, acked: &[(SessionId, Vec<MessageId>)]) {
    let store = rt.store();
    let mut total = 0;
    for (session, ids) in acked {
        assert_eq!(ids.len(), TURNS);
        let info = store.session(*session).unwrap();
        assert_eq!(info.message_count, TURNS as u64, "no duplicates, none lost");
        for id in ids {
            assert_eq!(store.message(*id).unwrap().session, *session);
        }
        let reached = store.context_messages(*session).unwrap();
        assert_eq!(&reached, ids, "each message reached exactly once, in order");
        total += ids.len() as u64;
    }
    rt.flush_index().await.expect("index flush");
    assert_eq!(rt.index().watermark().0, total);
    let outcome = rt.check_integrity(false).await.expect("integrity check");
    assert!(
        outcome.report.violations.is_empty(),
        "{:#?}",
        outcome.report.violations
    );
}

fn restarts(stats: &lcm::engine::runtime::SupervisorStats, kind: ActorKind) -> u64 {
    stats
        .restarts
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(0, |(_, n)| *n)
}

/// Injects `fault` at `point` (after `skip` hits, `times` times) during the workload.
async fn inject(point: FaultPoint, fault: Fault, skip: u32, times: u32) -> Runtime {
    let rt = runtime(config()).await;
    rt.faults().arm(point, fault, skip, times);
    let acked = workload(&rt, &format!("{point:?}")).await;
    // A fault in a background actor (the indexer catching up) may fire again after the
    // workload: its restarted actor catches up at start, after the restart's backoff.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while rt.faults().fired(point) < times && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        rt.faults().fired(point),
        times,
        "the fault at {point} fired as armed"
    );
    verify(&rt, &acked).await;
    rt
}

const PANIC: Fault = Fault::Panic;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_panics_before_commit() {
    let rt = inject(FaultPoint::SessionBeforeCommit, PANIC, 10, 4).await;
    let stats = rt.supervisor_stats().await.unwrap();
    assert!(restarts(&stats, ActorKind::Session) >= 4, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_panics_after_commit() {
    // The message is stored but the reply is lost: the handle's retry finds it by its key.
    let rt = inject(FaultPoint::SessionAfterCommit, PANIC, 10, 4).await;
    let stats = rt.supervisor_stats().await.unwrap();
    assert!(restarts(&stats, ActorKind::Session) >= 4, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assembler_panics_mid_assembly() {
    let rt = inject(FaultPoint::AssemblerMidAssembly, PANIC, 20, 3).await;
    let stats = rt.supervisor_stats().await.unwrap();
    // Assemblies run concurrently: panics in flight together fail the same actor instance.
    let n = restarts(&stats, ActorKind::Assembler);
    assert!((1..=3).contains(&n), "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_worker_panics_mid_llm_call() {
    let rt = inject(FaultPoint::CompactorMidLlmCall, PANIC, 2, 3).await;
    let stats = rt.compactor_stats().await.unwrap();
    assert!(stats.worker_failures >= 3, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_worker_panics_before_commit() {
    let rt = inject(FaultPoint::CompactorBeforeCommit, PANIC, 1, 3).await;
    assert!(rt.compactor_stats().await.unwrap().worker_failures >= 3);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_worker_panics_after_commit() {
    let rt = inject(FaultPoint::CompactorAfterCommit, PANIC, 1, 3).await;
    assert!(rt.compactor_stats().await.unwrap().worker_failures >= 3);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The CompactorActor itself (not a worker) panics while taking a session's request: its queue
/// and running workers die with it. The root restarts it, every session with a request in
/// flight sends it again, and every context request waiting on a compaction is answered within
/// its budget (the workload's contexts); nothing hangs (bounded by a timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactor_actor_panics_on_a_request() {
    let rt = tokio::time::timeout(
        Duration::from_secs(180),
        inject(FaultPoint::CompactorActorOnRequest, PANIC, 2, 3),
    )
    .await
    .expect("no request hangs on a crashed compactor");
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(restarts(&stats, ActorKind::Compactor), 3, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The CompactorActor panics after a worker's passes committed, before the result reaches the
/// session: the session asks again after the restart, and the compaction already committed is
/// neither lost nor applied twice (the integrity check and the exactly-once walk of `verify`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compactor_actor_panics_between_a_result_and_its_session() {
    let rt = tokio::time::timeout(
        Duration::from_secs(180),
        inject(FaultPoint::CompactorActorOnFinished, PANIC, 1, 3),
    )
    .await
    .expect("no request hangs on a crashed compactor");
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(restarts(&stats, ActorKind::Compactor), 3, "{stats:?}");
    assert!(rt.store().summary_count().unwrap() > 0);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A CompactorActor stuck on a request is killed by the root's stall detection and restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_compactor_actor_is_killed_and_restarted() {
    let rt = tokio::time::timeout(
        Duration::from_secs(180),
        inject(
            FaultPoint::CompactorActorOnRequest,
            Fault::Stall(Duration::from_secs(3)),
            3,
            1,
        ),
    )
    .await
    .expect("no request hangs on a stalled compactor");
    let stats = rt.supervisor_stats().await.unwrap();
    assert!(stats.stalls >= 1, "{stats:?}");
    assert!(restarts(&stats, ActorKind::Compactor) >= 1, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// A compactor that crashes on every request exhausts its restarts and the runtime stops: a
/// context request waiting on it gets an error (never hangs), and what was appended stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compactor_that_keeps_crashing_fails_waiters_instead_of_hanging() {
    let mut config = config();
    config.runtime.max_restarts = 2;
    let rt = runtime(config).await;
    let s = rt.session("waiting").await.unwrap();
    let mut acked = Vec::new();
    for t in 0..TURNS {
        acked.push(s.append(message(0, t)).await.expect("append").id);
    }
    rt.faults().arm(
        FaultPoint::CompactorActorOnRequest,
        Fault::Panic,
        0,
        u32::MAX,
    );
    // Far above the hard threshold: the request waits for compactions that never come.
    let answer = tokio::time::timeout(Duration::from_secs(60), s.context(BUDGET))
        .await
        .expect("the waiter is answered, not left hanging");
    let err = answer.expect_err("no compaction can run");
    assert!(!err.to_string().is_empty());
    assert!(rt.faults().fired(FaultPoint::CompactorActorOnRequest) >= 3);
    // Nothing acknowledged is lost.
    let info = rt.store().session(s.id()).unwrap();
    assert_eq!(info.message_count, TURNS as u64);
    for id in &acked {
        assert_eq!(rt.store().message(*id).unwrap().session, s.id());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexer_panics_before_commit() {
    let rt = inject(FaultPoint::IndexerBeforeCommit, PANIC, 1, 2).await;
    let stats = rt.supervisor_stats().await.unwrap();
    assert!(restarts(&stats, ActorKind::Indexer) >= 2, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_actor_panics_mid_check() {
    let rt = runtime(config()).await;
    let acked = workload(&rt, "integrity").await;
    rt.faults()
        .arm(FaultPoint::IntegrityMidCheck, Fault::Panic, 0, 1);
    // The first check dies with its actor; the call is retried against the restarted one.
    verify(&rt, &acked).await;
    assert_eq!(rt.faults().fired(FaultPoint::IntegrityMidCheck), 1);
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(restarts(&stats, ActorKind::Integrity), 1, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_session_is_killed_and_restarted() {
    let rt = inject(
        FaultPoint::SessionBeforeCommit,
        Fault::Stall(Duration::from_secs(3)),
        15,
        1,
    )
    .await;
    let stats = rt.supervisor_stats().await.unwrap();
    assert!(stats.stalls >= 1, "{stats:?}");
    assert!(restarts(&stats, ActorKind::Session) >= 1, "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_compaction_worker_is_killed_and_retried() {
    let rt = inject(
        FaultPoint::CompactorMidLlmCall,
        Fault::Stall(Duration::from_secs(3)),
        1,
        1,
    )
    .await;
    assert!(rt.compactor_stats().await.unwrap().worker_failures >= 1);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_session_is_quarantined_and_others_are_unaffected() {
    let mut config = config();
    config.runtime.max_restarts = 3;
    let rt = runtime(config).await;
    let bad = rt.session("bad").await.unwrap();
    rt.faults().arm_for(
        FaultPoint::SessionBeforeCommit,
        Some(bad.id()),
        Fault::Panic,
        0,
        u32::MAX,
    );
    let err = bad.append(message(99, 0)).await.unwrap_err();
    assert!(
        err.to_string().contains("refused") || err.to_string().contains("restarting"),
        "{err}"
    );
    assert_eq!(rt.store().session(bad.id()).unwrap().message_count, 0);
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(stats.quarantined_sessions, 1, "{stats:?}");
    // Every other session works as if nothing happened.
    let acked = workload(&rt, "others").await;
    verify(&rt, &acked).await;
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}
