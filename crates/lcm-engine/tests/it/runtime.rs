//! The actor runtime through its public API: zero work below the soft threshold, background
//! compaction between soft and hard, waiting above hard, idle stop and restart, shutdown and
//! reopen with nothing lost, clear errors on bad input.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lcm_core::config::Config;
use lcm_core::ids::SessionId;
use lcm_core::message::{NewMessage, Role};
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::runtime::{Runtime, RuntimeError, RuntimeEvent, RuntimeOptions};
use lcm_llm::extractive::ExtractiveSummarizer;
use lcm_llm::provider::{Completion, ProviderError};
use lcm_llm::summarize::{Summarizer, SummaryCall};

/// The extractive summariser, counting its calls.
struct Counting {
    inner: ExtractiveSummarizer,
    calls: AtomicU32,
}

#[async_trait::async_trait]
impl Summarizer for Counting {
    fn model(&self) -> &str {
        self.inner.model()
    }
    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.summarize(call).await
    }
}

fn counting() -> Arc<Counting> {
    Arc::new(Counting {
        inner: ExtractiveSummarizer::new(TokenCounter::new(Encoding::O200kBase)),
        calls: AtomicU32::new(0),
    })
}

/// A configuration scaled down so that a few hundred short messages cross the thresholds.
fn small_config() -> Config {
    let mut config = Config::default();
    config.compaction.fresh_tail = 8;
    config.compaction.leaf_chunk_tokens = 600;
    config.compaction.leaf_target_tokens = 150;
    config.compaction.condensed_target_tokens = 200;
    config.runtime.heartbeat_ms = 50;
    config.runtime.index_interval_ms = 20;
    config
}

fn message(i: usize) -> NewMessage {
    let role = if i.is_multiple_of(2) {
        Role::User
    } else {
        Role::Assistant
    };
    NewMessage::text(
        role,
        format!(
            "turn {i}: the deployment checklist item {i} concerns the staging cluster and its \
             rollback plan, owner team-{} with ticket ref-{i}",
            i % 7
        ),
    )
    .with_source_key(format!("k{i}"))
}

async fn open(config: Config, summarizer: Arc<Counting>) -> Runtime {
    Runtime::open(RuntimeOptions::in_memory(config).with_summarizer(summarizer))
        .await
        .expect("runtime opens")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_soft_threshold_no_summariser_call_and_no_compaction() {
    let summarizer = counting();
    let rt = open(small_config(), Arc::clone(&summarizer)).await;
    let s = rt.session("quiet").await.unwrap();
    for i in 0..40 {
        s.append(message(i)).await.unwrap();
        let ctx = s.context(1_000_000).await.unwrap();
        assert_eq!(ctx.items.len(), i + 1);
    }
    assert_eq!(summarizer.calls.load(Ordering::SeqCst), 0);
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.compactions_requested, 0);
    assert!(!stats.compacting);
    assert_eq!(rt.compactor_stats().await.unwrap().finished, 0);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn between_soft_and_hard_compaction_runs_in_the_background() {
    let summarizer = counting();
    let rt = open(small_config(), Arc::clone(&summarizer)).await;
    let mut events = rt.subscribe();
    let s = rt.session("busy").await.unwrap();
    let batch: Vec<NewMessage> = (0..120).map(message).collect();
    s.append_batch(batch).await.unwrap();
    let total = s.context(1_000_000).await.unwrap().tokens;
    // A budget that puts the context between soft (0.75) and hard (0.9), after the margin.
    let budget = ((total as f64) / 0.82 / 0.95) as u64;
    let ctx = s.context(budget).await.unwrap();
    assert_eq!(
        ctx.tokens, total,
        "the turn is answered at once, uncompacted"
    );
    // The compaction finishes in the background and the next turn sees it.
    let finished = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match events.recv().await {
                Ok(RuntimeEvent::CompactionFinished {
                    session,
                    passes,
                    summaries_by_level,
                    ..
                }) if session == s.id() => {
                    // Every pass wrote one summary at some escalation level.
                    assert_eq!(summaries_by_level.iter().sum::<u32>() as usize, passes);
                    return passes;
                }
                Ok(_) => {}
                Err(e) => panic!("event stream: {e}"),
            }
        }
    })
    .await
    .expect("a compaction finished");
    assert!(finished > 0);
    let after = s.context(budget).await.unwrap();
    assert!(
        after.tokens < ctx.tokens,
        "{} < {}",
        after.tokens,
        ctx.tokens
    );
    assert!(summarizer.calls.load(Ordering::SeqCst) > 0);
    // Every message is still reachable exactly once.
    let reached = rt.store().context_messages(s.id()).unwrap();
    assert_eq!(reached.len(), 120);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

/// The extractive summariser, each call taking `delay` (a model's latency); `called` is
/// notified at each call.
struct Slow {
    inner: ExtractiveSummarizer,
    delay: Duration,
    called: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl Summarizer for Slow {
    fn model(&self) -> &str {
        self.inner.model()
    }
    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        self.called.notify_one();
        tokio::time::sleep(self.delay).await;
        self.inner.summarize(call).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_once_the_running_compaction_ends_not_at_the_grace_period() {
    let summarizer = Arc::new(Slow {
        inner: ExtractiveSummarizer::new(TokenCounter::new(Encoding::O200kBase)),
        delay: Duration::from_millis(100),
        called: tokio::sync::Notify::new(),
    });
    let rt = Runtime::open(
        RuntimeOptions::in_memory(small_config()).with_summarizer(Arc::clone(&summarizer) as _),
    )
    .await
    .expect("runtime opens");
    let s = rt.session("busy").await.unwrap();
    s.append_batch((0..120).map(message).collect())
        .await
        .unwrap();
    let total = s.context(1_000_000).await.unwrap().tokens;
    // Between soft and hard: a compaction starts in the background.
    let budget = ((total as f64) / 0.82 / 0.95) as u64;
    s.context(budget).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), summarizer.called.notified())
        .await
        .expect("the compaction called its summariser");
    // The compactor answers the drain when its run ends, and every lease of the runtime's
    // state is returned as its actors stop: shutdown waits for neither its grace period nor
    // the 5 s bound of the last wait.
    let started = std::time::Instant::now();
    rt.shutdown(Duration::from_secs(60)).await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "shutdown took {took:?}");
    // The run that was going on finished: its summaries are stored.
    assert!(!rt.store().session_summaries(s.id()).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_hard_the_turn_waits_for_compaction() {
    let summarizer = counting();
    let rt = open(small_config(), Arc::clone(&summarizer)).await;
    let s = rt.session("over").await.unwrap();
    s.append_batch((0..200).map(message).collect())
        .await
        .unwrap();
    let total = s.context(10_000_000).await.unwrap().tokens;
    let budget = total / 2;
    let ctx = s.context(budget).await.unwrap();
    let hard = (0.9 * (budget as f64 * 0.95)) as u64;
    assert!(ctx.tokens <= hard, "{} <= {hard}", ctx.tokens);
    assert_eq!(rt.store().context_messages(s.id()).unwrap().len(), 200);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_stop_and_restart_on_next_use() {
    let mut config = small_config();
    config.runtime.idle_timeout_s = 1;
    let rt = open(config, counting()).await;
    let mut events = rt.subscribe();
    let s = rt.session("idle").await.unwrap();
    s.append(message(0)).await.unwrap();
    assert_eq!(rt.supervisor_stats().await.unwrap().live_sessions, 1);
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(RuntimeEvent::SessionStopped { session, reason }) = events.recv().await
                && session == s.id()
            {
                assert_eq!(reason, "idle");
                return;
            }
        }
    })
    .await
    .expect("the idle session stopped");
    assert_eq!(rt.supervisor_stats().await.unwrap().live_sessions, 0);
    // The next call starts it again, from the store.
    s.append(message(1)).await.unwrap();
    assert_eq!(s.context(1_000_000).await.unwrap().items.len(), 2);
    let stats = rt.supervisor_stats().await.unwrap();
    assert_eq!(stats.live_sessions, 1);
    assert!(stats.restarts.iter().all(|(_, n)| *n == 0), "{stats:?}");
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_then_reopen_keeps_every_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let mut acknowledged = Vec::new();
    {
        let rt = Runtime::open(
            RuntimeOptions::dir(dir.path(), config.clone()).with_summarizer(counting()),
        )
        .await
        .unwrap();
        for k in 0..5 {
            let s = rt.session(&format!("s{k}")).await.unwrap();
            for i in 0..30 {
                let a = s.append(message(i)).await.unwrap();
                acknowledged.push((s.id(), a.id));
            }
        }
        rt.flush_index().await.unwrap();
        rt.shutdown(Duration::from_secs(5)).await.unwrap();
        // After shutdown nothing new is taken.
        assert!(matches!(
            rt.session("late").await,
            Err(RuntimeError::ShuttingDown)
        ));
    }
    let rt = Runtime::open(RuntimeOptions::dir(dir.path(), config).with_summarizer(counting()))
        .await
        .expect("the store file was released and reopens");
    for (session, id) in &acknowledged {
        let m = rt.store().message(*id).unwrap();
        assert_eq!(m.session, *session);
    }
    assert_eq!(
        rt.store().stats().unwrap().messages,
        acknowledged.len() as u64
    );
    assert_eq!(rt.index().watermark().0, acknowledged.len() as u64);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_changes_nothing() {
    let rt = open(small_config(), counting()).await;
    let s = rt.session("strict").await.unwrap();
    s.append(message(0)).await.unwrap();
    let before = rt.store().stats().unwrap();

    let err = match rt.session_by_id(SessionId(9_999)).await {
        Err(e) => e,
        Ok(_) => panic!("unknown session accepted"),
    };
    assert!(err.to_string().contains("ses_9999"), "{err}");

    let empty = NewMessage {
        parts: Vec::new(),
        ..NewMessage::text(Role::User, "")
    };
    let err = s.append_batch(vec![message(1), empty]).await.unwrap_err();
    assert!(err.to_string().contains("message 1 of the batch"), "{err}");

    let err = s.context(0).await.unwrap_err();
    assert!(err.to_string().contains("budget"), "{err}");

    assert_eq!(rt.store().stats().unwrap(), before);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_from_many_sessions_are_group_committed_and_all_kept() {
    let rt = open(small_config(), counting()).await;
    let mut tasks = Vec::new();
    for k in 0..20 {
        let rt = rt.clone();
        tasks.push(tokio::spawn(async move {
            let s = rt.session(&format!("c{k}")).await.unwrap();
            for i in 0..50 {
                s.append(message(i)).await.unwrap();
            }
            s.id()
        }));
    }
    for t in tasks {
        let id = t.await.unwrap();
        let info = rt.store().session(id).unwrap();
        assert_eq!(info.message_count, 50);
    }
    assert_eq!(rt.store().stats().unwrap().messages, 1_000);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_called_outside_any_session_searches_every_session() {
    let rt = open(small_config(), counting()).await;
    let a = rt.session("a").await.expect("a");
    let b = rt.session("b").await.expect("b");
    a.append(message(1)).await.expect("append a");
    b.append(message(2)).await.expect("append b");

    let all = rt
        .call_tool("lcm_grep", serde_json::json!({"pattern": "ticket ref-\\d"}))
        .await
        .expect("grep");
    assert_eq!(all["hits"], 2, "{all}");
    // As a session's main agent, the same search stays in that session.
    let one = a
        .call_tool("lcm_grep", serde_json::json!({"pattern": "ticket ref-\\d"}))
        .await
        .expect("grep");
    assert_eq!(one["hits"], 1, "{one}");
    // Arguments are validated the same way.
    let error = rt
        .call_tool("lcm_grep", serde_json::json!({"pattern": 7}))
        .await
        .expect_err("bad arguments");
    assert!(error.to_string().contains("/pattern"), "{error}");
    rt.shutdown(Duration::from_secs(5)).await.expect("shutdown");
}

/// The extractive summariser under a label of its own, counting its calls.
struct Labelled {
    inner: ExtractiveSummarizer,
    label: &'static str,
    calls: AtomicU32,
}

#[async_trait::async_trait]
impl Summarizer for Labelled {
    fn model(&self) -> &str {
        self.label
    }
    async fn summarize(&self, call: &SummaryCall<'_>) -> Result<Completion, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.summarize(call).await
    }
}

fn labelled(label: &'static str) -> Arc<Labelled> {
    Arc::new(Labelled {
        inner: ExtractiveSummarizer::new(TokenCounter::new(Encoding::O200kBase)),
        label,
        calls: AtomicU32::new(0),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_own_summariser_is_used_until_it_idles_out() {
    let default = counting();
    let rt = open(small_config(), Arc::clone(&default)).await;
    let mut events = rt.subscribe();
    let own = labelled("own-model");
    let a = rt.session("with-its-own").await.unwrap();
    let b = rt.session("with-the-default").await.unwrap();
    a.set_summarizer(
        Arc::clone(&own) as Arc<dyn Summarizer>,
        Duration::from_secs(60),
    );
    assert!(a.has_summarizer());
    assert!(!b.has_summarizer());
    assert_eq!(rt.session_summarizer_count(), 1);
    assert_eq!(rt.summarizer().model(), "extractive");

    // Both sessions compact (above hard, the turn waits for it).
    for s in [&a, &b] {
        s.append_batch((0..200).map(message).collect())
            .await
            .unwrap();
        let total = s.context(10_000_000).await.unwrap().tokens;
        s.context(total / 2).await.unwrap();
    }
    let models = |s: &lcm_engine::runtime::SessionHandle| -> Vec<String> {
        let summaries = rt.store().session_summaries(s.id()).unwrap();
        summaries.into_iter().map(|s| s.model).collect()
    };
    let (of_a, of_b) = (models(&a), models(&b));
    assert!(
        !of_a.is_empty() && of_a.iter().all(|m| m == "own-model"),
        "{of_a:?}"
    );
    assert!(
        !of_b.is_empty() && of_b.iter().all(|m| m == "extractive"),
        "{of_b:?}"
    );
    assert!(own.calls.load(Ordering::SeqCst) as usize >= of_a.len());
    assert!(default.calls.load(Ordering::SeqCst) as usize >= of_b.len());
    // Each summary was announced, saying whose summariser wrote it.
    let mut announced = (0, 0);
    while let Ok(event) = events.try_recv() {
        if let RuntimeEvent::SummaryWritten {
            session,
            model,
            session_summarizer,
            level,
            ..
        } = event
        {
            assert!((1..=3).contains(&level));
            if session == a.id() {
                assert!(session_summarizer && model == "own-model");
                announced.0 += 1;
            } else {
                assert!(!session_summarizer && model == "extractive");
                announced.1 += 1;
            }
        }
    }
    assert_eq!(announced, (of_a.len(), of_b.len()));

    // A refresh with the registration's tag builds nothing; another tag (or none) builds.
    let build = || Ok::<_, String>(Arc::clone(&own) as Arc<dyn Summarizer>);
    assert_eq!(
        a.refresh_summarizer(1, Duration::from_secs(60), build),
        Ok(true)
    );
    assert_eq!(
        a.refresh_summarizer(1, Duration::from_secs(60), || Err("not built".to_owned())),
        Ok(false)
    );
    assert_eq!(
        a.refresh_summarizer(2, Duration::from_secs(60), || Err("failed".to_owned())),
        Err("failed".to_owned())
    );
    assert!(a.has_summarizer(), "a failed build leaves the registration");
    assert!(a.clear_summarizer());
    assert!(!a.has_summarizer());

    // Idle expiry: nothing touches the registry, yet the compactor's heartbeat drops the entry
    // and the summariser it held.
    let held = labelled("held");
    b.set_summarizer(
        Arc::clone(&held) as Arc<dyn Summarizer>,
        Duration::from_millis(200),
    );
    assert_eq!(Arc::strong_count(&held), 2);
    let dropped = tokio::time::timeout(Duration::from_secs(5), async {
        while Arc::strong_count(&held) > 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(dropped.is_ok(), "the idle entry was never dropped");
    assert_eq!(rt.session_summarizer_count(), 0);

    // Shutdown drops every registration.
    a.set_summarizer(
        Arc::clone(&held) as Arc<dyn Summarizer>,
        Duration::from_secs(60),
    );
    assert_eq!(Arc::strong_count(&held), 2);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
    assert_eq!(Arc::strong_count(&held), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_fails_appends_as_storage_errors_and_loses_nothing_acknowledged() {
    use lcm_store::disk_faults::DiskSwitch;
    use lcm_store::{Store, StoreError, StoreOptions};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lcm.redb");
    let options = || StoreOptions::new(TokenCounter::new(Encoding::O200kBase));
    let disk = DiskSwitch::default();
    let store = Store::open_on_faulty_disk(&path, options(), disk.clone()).unwrap();
    let runtime = Runtime::open_on_store(store, RuntimeOptions::in_memory(small_config()))
        .await
        .expect("runtime opens");
    let keys: Vec<String> = (0..8).map(|s| format!("writer-{s}")).collect();
    let mut sessions = Vec::new();
    for key in &keys {
        sessions.push(runtime.session(key).await.unwrap());
    }
    for (s, session) in sessions.iter().enumerate() {
        session.append(message(s)).await.expect("acknowledged");
    }

    // Every session appends at once, so the writer groups several batches in one commit.
    disk.fill();
    let appends: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(s, key)| {
            let (runtime, key) = (runtime.clone(), key.clone());
            tokio::spawn(async move { runtime.session(&key).await?.append(message(100 + s)).await })
        })
        .collect();
    for append in appends {
        match append.await.unwrap() {
            Err(RuntimeError::Store(e @ StoreError::CommitFailed { .. }))
            | Err(RuntimeError::Store(e @ StoreError::Database(_))) => {
                assert!(e.is_disk_full(), "{e}");
            }
            other => panic!("a full disk is a storage failure, got {other:?}"),
        }
    }
    // Space is back: the same runtime appends again (the store reopens its file).
    disk.free();
    for (s, session) in sessions.iter().enumerate() {
        session
            .append(message(200 + s))
            .await
            .expect("acknowledged once the disk has space");
    }
    // The index may have committed while the disk was full and the store refused its copy of
    // the watermark: its next pass records it.
    runtime.flush_index().await.unwrap();
    let outcome = runtime.check_integrity(false).await.unwrap();
    assert!(outcome.report.is_clean(), "{:?}", outcome.report.violations);
    runtime.shutdown(Duration::from_secs(5)).await.unwrap();
    drop(sessions);
    drop(runtime);

    let store = Store::open(&path, options()).unwrap();
    for (s, key) in keys.iter().enumerate() {
        let session = store.session_id_for_key(key).unwrap().expect("the session");
        let messages = store.session_messages(session, 0..10).unwrap();
        assert_eq!(
            messages.len(),
            2,
            "{key}: the acknowledged appends, and only they"
        );
        assert!(messages[0].search_text().contains(&format!("turn {s}: ")));
        assert!(
            messages[1]
                .search_text()
                .contains(&format!("turn {}: ", 200 + s))
        );
    }
}

/// A context that compaction can do nothing more for (over the hard threshold of a window of
/// a few hundred tokens) is answered at once on the next requests, without another compaction
/// or summariser call, until the session changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_compaction_cannot_help_is_not_compacted_again_until_it_changes() {
    let summarizer = counting();
    let rt = open(small_config(), Arc::clone(&summarizer)).await;
    let s = rt.session("tight").await.unwrap();
    s.append_batch((0..40).map(message).collect())
        .await
        .unwrap();
    let budget = 250;
    // Until compaction has done what it can: the requests stop asking for more.
    let mut settled = None;
    for _ in 0..20 {
        let ctx = s.context(budget).await.unwrap();
        assert!(ctx.tokens <= budget, "{} > {budget}", ctx.tokens);
        let stats = s.stats().await.unwrap();
        if !stats.compacting && settled == Some(stats.compactions_requested) {
            break;
        }
        settled = (!stats.compacting).then_some(stats.compactions_requested);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let requested = settled.expect("compaction settles");
    let calls = summarizer.calls.load(Ordering::SeqCst);
    for _ in 0..5 {
        let ctx = s.context(budget).await.unwrap();
        assert!(ctx.tokens <= budget);
    }
    let stats = s.stats().await.unwrap();
    assert_eq!(stats.compactions_requested, requested);
    assert_eq!(summarizer.calls.load(Ordering::SeqCst), calls);
    // A new message changes the context: compaction is asked for again.
    s.append(message(40)).await.unwrap();
    s.context(budget).await.unwrap();
    assert!(s.stats().await.unwrap().compactions_requested > requested);
    assert_eq!(rt.store().context_messages(s.id()).unwrap().len(), 41);
    rt.shutdown(Duration::from_secs(5)).await.unwrap();
}
