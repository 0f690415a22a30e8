//! The summary DAG in the store: atomic apply, the span check, aggregates, edges both ways,
//! and rejected summaries changing nothing.

use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::{NewMessage, Role};
use lcm_core::summary::{NewSummary, NodeRef, SummaryKind};
use lcm_core::time::Timestamp;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_store::{ApplyOutcome, Store, StoreError, StoreOptions};

fn store_with(n: u64) -> (Store, SessionId, Vec<MessageId>) {
    let store =
        Store::open_in_memory(StoreOptions::new(TokenCounter::new(Encoding::O200kBase))).unwrap();
    let session = store.create_session("s", None).unwrap();
    let messages = (0..n)
        .map(|i| {
            let mut m = NewMessage::text(Role::User, format!("message number {i}"));
            m.created_at = Timestamp(1_000 + i as i64);
            store.append(session, m).unwrap().id
        })
        .collect();
    (store, session, messages)
}

fn leaf(session: SessionId, ids: &[MessageId]) -> NewSummary {
    NewSummary {
        session,
        kind: SummaryKind::Leaf,
        depth: 0,
        content: format!("summary of {} messages", ids.len()),
        token_count: 10,
        sources: ids.iter().map(|id| NodeRef::Message(*id)).collect(),
        level: 1,
        model: "test".into(),
        digest: None,
    }
}

fn condensed(session: SessionId, depth: u32, ids: &[SummaryId]) -> NewSummary {
    NewSummary {
        session,
        kind: SummaryKind::Condensed,
        depth,
        content: "condensed".into(),
        token_count: 12,
        sources: ids.iter().map(|id| NodeRef::Summary(*id)).collect(),
        level: 2,
        model: "test".into(),
        digest: None,
    }
}

/// Applies `count` leaves over the first messages of `ids`, three messages each.
fn leaves_of_three(
    store: &Store,
    session: SessionId,
    ids: &[MessageId],
    count: usize,
) -> Vec<SummaryId> {
    (0..count)
        .map(|i| {
            applied(
                store
                    .apply_summary(leaf(session, &ids[i * 3..i * 3 + 3]), vec![])
                    .unwrap(),
            )
            .id
        })
        .collect()
}

fn applied(outcome: ApplyOutcome) -> lcm_core::summary::Summary {
    match outcome {
        ApplyOutcome::Applied { summary, .. } => summary,
        ApplyOutcome::Stale { reason } => panic!("unexpectedly stale: {reason}"),
    }
}

#[test]
fn leaf_replaces_the_oldest_raw_span_and_records_edges() {
    let (store, s, ids) = store_with(10);
    let tokens: u64 = ids[..4]
        .iter()
        .map(|id| u64::from(store.message(*id).unwrap().token_count))
        .sum();
    let sum = applied(store.apply_summary(leaf(s, &ids[..4]), vec![]).unwrap());
    assert_eq!(sum.id, SummaryId(0));
    assert_eq!((sum.first_seq, sum.last_seq), (0, 3));
    assert_eq!(sum.descendant_messages, 4);
    assert_eq!(sum.descendant_tokens, tokens);
    assert_eq!(
        (sum.earliest_at, sum.latest_at),
        (Timestamp(1_000), Timestamp(1_003))
    );
    let ctx = store.context(s).unwrap();
    assert_eq!(ctx.summaries, vec![sum.id]);
    assert_eq!(ctx.raw_from, 4);
    assert_eq!(ctx.version, 1);
    for id in &ids[..4] {
        assert_eq!(store.covering(NodeRef::Message(*id)).unwrap(), Some(sum.id));
    }
    assert_eq!(store.covering(NodeRef::Message(ids[4])).unwrap(), None);
    assert_eq!(store.summary(sum.id).unwrap().sources.len(), 4);
}

#[test]
fn stale_spans_write_nothing() {
    let (store, s, ids) = store_with(10);
    applied(store.apply_summary(leaf(s, &ids[..4]), vec![]).unwrap());
    let before = store.context(s).unwrap();
    // The same span again: it is no longer raw.
    let again = store.apply_summary(leaf(s, &ids[..4]), vec![]).unwrap();
    assert!(matches!(again, ApplyOutcome::Stale { .. }), "{again:?}");
    // A span that skips the frontier.
    let gap = store.apply_summary(leaf(s, &ids[5..7]), vec![]).unwrap();
    assert!(matches!(gap, ApplyOutcome::Stale { .. }), "{gap:?}");
    assert_eq!(store.context(s).unwrap(), before);
    assert_eq!(store.summary_count().unwrap(), 1);
}

#[test]
fn condensed_summaries_replace_a_run_in_place_and_aggregate() {
    let (store, s, ids) = store_with(20);
    let leaves = leaves_of_three(&store, s, &ids, 5);
    // Condense the oldest four (a contiguous run of depth-0 summaries).
    let top = applied(
        store
            .apply_summary(condensed(s, 1, &leaves[..4]), vec![])
            .unwrap(),
    );
    assert_eq!(top.depth, 1);
    assert_eq!(top.descendant_messages, 12);
    assert_eq!((top.first_seq, top.last_seq), (0, 11));
    let ctx = store.context(s).unwrap();
    assert_eq!(ctx.summaries, vec![top.id, leaves[4]]);
    assert_eq!(ctx.raw_from, 15);
    for l in &leaves[..4] {
        assert_eq!(store.covering(NodeRef::Summary(*l)).unwrap(), Some(top.id));
    }
    // Every message is reached exactly once, walking down from the context.
    assert_eq!(store.context_messages(s).unwrap(), ids.to_vec());
    // The summaries of the session, in creation order.
    let all = store.session_summaries(s).unwrap();
    assert_eq!(all.len(), 6);
    assert_eq!(store.session_summary_count(s).unwrap(), 6);
    let other = store.create_session("other", None).unwrap();
    assert_eq!(store.session_summary_count(other).unwrap(), 0);
    assert_eq!(all.last().unwrap().id, top.id);
}

/// Neighbours of different depths may be condensed together (compaction does so over the hard
/// threshold rather than re-summarise a lone summary): the new summary is one deeper than its
/// deepest source, and any other depth is refused, writing nothing.
#[test]
fn neighbours_of_different_depths_condense_one_deeper_than_the_deepest() {
    let (store, s, ids) = store_with(12);
    let leaves = leaves_of_three(&store, s, &ids, 3);
    let deep = applied(
        store
            .apply_summary(condensed(s, 1, &leaves[..2]), vec![])
            .unwrap(),
    );
    // Context: [depth 1, depth 0].
    let mixed = [deep.id, leaves[2]];
    let before = store.context(s).unwrap();
    for wrong in [1, 3] {
        let err = store
            .apply_summary(condensed(s, wrong, &mixed), vec![])
            .unwrap_err();
        assert!(
            err.to_string().contains(
                "the deepest source has depth 1: a condensed summary over these sources has depth 2"
            ),
            "{err}"
        );
    }
    assert_eq!(store.context(s).unwrap(), before);
    assert_eq!(store.summary_count().unwrap(), 4);
    let top = applied(
        store
            .apply_summary(condensed(s, 2, &mixed), vec![])
            .unwrap(),
    );
    assert_eq!((top.depth, top.descendant_messages), (2, 9));
    assert_eq!((top.first_seq, top.last_seq), (0, 8));
    assert_eq!(store.context(s).unwrap().summaries, vec![top.id]);
    assert_eq!(store.context_messages(s).unwrap(), ids.to_vec());
    assert!(
        lcm_store::integrity::check(&store, None)
            .unwrap()
            .is_clean(),
        "integrity after a mixed-depth condensation"
    );
}

#[test]
fn malformed_summaries_are_errors_and_change_nothing() {
    let (store, s, ids) = store_with(6);
    let l0 = applied(store.apply_summary(leaf(s, &ids[..2]), vec![]).unwrap()).id;
    let before = store.context(s).unwrap();
    let cases = [
        (leaf(s, &[]), "at least one source"),
        (condensed(s, 2, &[l0]), "depth"),
        (condensed(s, 0, &[l0]), "depth 1 or more"),
        (
            NewSummary {
                sources: vec![NodeRef::Summary(l0)],
                ..leaf(s, &ids[2..3])
            },
            "must all be messages",
        ),
        (
            NewSummary {
                level: 4,
                ..leaf(s, &ids[2..3])
            },
            "escalation level",
        ),
    ];
    for (summary, expected) in cases {
        let err = store.apply_summary(summary, vec![]).unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
    }
    let other = store.create_session("other", None).unwrap();
    let err = store
        .apply_summary(leaf(other, &ids[2..3]), vec![])
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidMessage(_)), "{err}");
    assert_eq!(store.context(s).unwrap(), before);
    assert_eq!(store.summary_count().unwrap(), 1);
}
