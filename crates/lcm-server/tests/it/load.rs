//! A small load run over real HTTP on loopback (the full 100 clients x 1,000 appends is the
//! benchmark `benches/load.rs`, figures in docs/PERFORMANCE.md): concurrent clients append and
//! assemble with compactions running; no request fails, every acknowledged message is stored
//! exactly once, every context is within its budget, and the store passes the integrity check.

use crate::common::load::{LoadShape, run, session_key};
use crate::common::{Setup, start};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_lose_nothing_and_stay_within_budget() {
    let (mut setup, tmp, root) = Setup::new();
    // Small chunks so that every session compacts several times during the run.
    setup.config.compaction.fresh_tail = 8;
    setup.config.compaction.leaf_chunk_tokens = 600;
    setup.config.compaction.leaf_target_tokens = 120;
    let mut server = start(setup, tmp, root).await;
    let shape = LoadShape {
        clients: 20,
        appends: 120,
        assemblies: 12,
        budget: 2_000,
        first_turn: 0,
    };
    let report = run(&server, shape).await;
    assert!(report.errors.is_empty(), "{:#?}", report.errors);
    assert_eq!(report.appends.len(), shape.clients * shape.appends);
    assert_eq!(report.assemblies.len(), shape.clients * shape.assemblies);
    assert!(
        report.max_context_tokens <= shape.budget,
        "a context of {} tokens for a budget of {}",
        report.max_context_tokens,
        shape.budget
    );

    // Every acknowledged append is stored, once, in its client's session, in order.
    let store = server.runtime.store();
    for client in 0..shape.clients {
        let answer = server
            .get(&format!("/v1/sessions/{}", session_key(client)))
            .await;
        assert_eq!(
            answer.body["message_count"], shape.appends as u64,
            "{answer:?}"
        );
        let id = serde_json::from_value(answer.body["id"].clone()).expect("session id");
        let messages = store.session_messages(id, 0..u64::MAX).expect("messages");
        for (turn, message) in messages.iter().enumerate() {
            let text = message.search_text();
            assert!(
                text.ends_with(&format!("ref LOAD-{client}-{turn}.")),
                "session {client}, position {turn}: {text}"
            );
        }
    }
    // The sessions really compacted under the load.
    assert!(store.summary_count().expect("summaries") > 0);
    let integrity = server.post("/v1/integrity", &json!({})).await;
    assert_eq!(integrity.body["clean"], true, "{integrity:?}");
    server.stop().await.expect("clean stop");
}
