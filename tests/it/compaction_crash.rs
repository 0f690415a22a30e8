//! Crash consistency of compaction: a child process appends and compacts in a loop and is killed
//! with SIGKILL at random moments (several seeds). On reopen the context is a consistent state
//! (the old one or the new one, never a mix): every summary it points at exists, the DAG has no
//! orphan edges, and walking down from the context reaches every message exactly once.

use crate::common;

use std::collections::HashSet;
use std::process::{Command, Stdio};
use std::time::Duration;

use lcm::core::config::CompactionConfig;
use lcm::core::message::{NewMessage, Role};
use lcm::core::summary::NodeRef;
use lcm::engine::compact;
use lcm::llm::ExtractiveSummarizer;
use lcm::store::Store;
use lcm::{MessageId, SessionId};

const CHILD_ENV: &str = "LCM_COMPACTION_CRASH_STORE";
const TEST_NAME: &str = "compaction_survives_sigkill_at_any_moment";

fn config() -> CompactionConfig {
    CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 600,
        leaf_target_tokens: 120,
        condensed_fanout: 3,
        condensed_target_tokens: 200,
        ..CompactionConfig::default()
    }
}

/// The child: append a few messages, compact for a small window, forever.
fn child(path: &str) {
    let store = Store::open(path, common::store_options()).expect("open");
    let session = store.ensure_session("crash").expect("session");
    let summarizer = ExtractiveSummarizer::new(store.counter());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut n = 0u64;
    loop {
        for _ in 0..5 {
            let text = format!(
                "turn {n}: decided to change src/file_{n}.rs; error E{n:05} seen. {}",
                "More narrative text to summarise. ".repeat((n % 7 + 2) as usize)
            );
            store
                .append(session, NewMessage::text(Role::User, text))
                .expect("append");
            n += 1;
        }
        runtime
            .block_on(compact(
                &store,
                session,
                1_500,
                &config(),
                &summarizer,
                |_| {},
            ))
            .expect("compact");
        println!("round {n}");
    }
}

fn check_consistent(store: &Store, session: SessionId, seed: u64) -> usize {
    let info = store.session(session).unwrap();
    let ctx = store.context(session).unwrap();
    assert!(
        ctx.raw_from <= info.message_count,
        "seed {seed}: frontier past the end"
    );
    // Walk down from the context: the summaries cover #0..raw_from, then the raw tail.
    let seen = store
        .context_messages(session)
        .unwrap_or_else(|e| panic!("seed {seed}: the context points at something missing: {e}"));
    let covered = store
        .session_messages(session, 0..ctx.raw_from)
        .unwrap()
        .len();
    assert!(seen.len() >= covered);
    let all: Vec<MessageId> = store
        .session_messages(session, 0..u64::MAX)
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(
        seen, all,
        "seed {seed}: every message exactly once, in order"
    );
    // No orphan: every summary is either in the context or covered by exactly one summary, and
    // its sources' covered-by edges point back at it.
    let top: HashSet<_> = ctx.summaries.iter().copied().collect();
    let summaries = store.session_summaries(session).unwrap();
    for s in &summaries {
        let parent = store.covering(NodeRef::Summary(s.id)).unwrap();
        assert!(
            top.contains(&s.id) != parent.is_some(),
            "seed {seed}: {} is neither in the context nor covered (or both)",
            s.id
        );
        for source in &s.sources {
            assert_eq!(
                store.covering(*source).unwrap(),
                Some(s.id),
                "seed {seed}: edge {source} -> {}",
                s.id
            );
        }
    }
    summaries.len()
}

#[test]
fn compaction_survives_sigkill_at_any_moment() {
    if let Ok(path) = std::env::var(CHILD_ENV) {
        child(&path);
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let test = common::test_name(module_path!(), TEST_NAME);
    let mut total_summaries = 0;
    for seed in 1..=8u64 {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("lcm.redb");
        let mut child = Command::new(&exe)
            .args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut rng = lcm::core::rng::SplitMix64::new(seed * 7919);
        std::thread::sleep(Duration::from_millis(300 + rng.below(1_200)));
        child.kill().unwrap(); // SIGKILL, wherever the child is
        child.wait().unwrap();
        let store = Store::open(&path, common::store_options()).unwrap();
        let Some(session) = store.session_id_for_key("crash").unwrap() else {
            continue; // killed before the session existed
        };
        total_summaries += check_consistent(&store, session, seed);
    }
    assert!(
        total_summaries > 0,
        "the children never got to compact: the test proves nothing"
    );
}
