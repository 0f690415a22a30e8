//! Commitments are never compacted away: an intent stated early is carried by every summary
//! covering it through three levels of compaction and shown in the context's open-commitments
//! block, until a later action fulfils it; then it leaves the block (at once, while the
//! fulfilling message is raw) and the summaries written after say it was resolved.

use lcm_core::config::CompactionConfig;
use lcm_core::digest::{CommitmentKind, ItemRef};
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::NodeRef;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::{ContextItem, assemble, compact};
use lcm_llm::StructuredSummarizer;
use lcm_store::{Store, StoreOptions};

use crate::common::{intent_message, summaries_above};

/// The window the session is compacted for.
const BUDGET: u64 = 2_000;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn config() -> CompactionConfig {
    CompactionConfig {
        fresh_tail: 4,
        leaf_chunk_tokens: 700,
        leaf_target_tokens: 150,
        condensed_fanout: 2,
        condensed_target_tokens: 250,
        max_passes: 200,
        ..CompactionConfig::default()
    }
}

fn message(role: Role, parts: Vec<Part>) -> NewMessage {
    NewMessage {
        parts,
        ..NewMessage::text(role, "")
    }
}

/// One tool exchange that has nothing to do with the changelog: a test run.
fn exchange(store: &Store, s: SessionId, i: usize) {
    let call = format!("call_{i}");
    store
        .append(
            s,
            message(
                Role::Assistant,
                vec![
                    Part::Text {
                        text: format!("Running the parser tests, round {i}."),
                    },
                    Part::ToolCall {
                        id: call.clone(),
                        name: "Bash".into(),
                        arguments: format!(
                            r#"{{"command":"cargo test -p parser round_{i}","description":"Parser tests"}}"#
                        ),
                    },
                ],
            ),
        )
        .unwrap();
    let output = format!(
        "running 12 tests\n{}test result: ok. 12 passed; 0 failed; 0 ignored\n",
        "test parse::case ... ok\n".repeat(20)
    );
    store
        .append(
            s,
            message(
                Role::Tool,
                vec![Part::ToolResult {
                    call_id: call,
                    content: output,
                    is_error: false,
                }],
            ),
        )
        .unwrap();
}

/// The commitments the context's block shows, by message.
fn block(store: &Store, s: SessionId) -> Vec<MessageId> {
    assemble(store, s)
        .unwrap()
        .items
        .iter()
        .filter_map(|i| match i {
            ContextItem::Commitments { open, text, .. } => {
                for c in open.iter().rev().take(12) {
                    assert!(text.contains(&c.message.to_string()), "{text}");
                }
                Some(open.iter().map(|c| c.message).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect()
}

/// The summaries above a message, its leaf first.
fn chain(store: &Store, id: MessageId) -> Vec<lcm_core::ids::SummaryId> {
    summaries_above(store, NodeRef::Message(id))
}

/// Four more unrelated exchanges (counted in `round`), then a compaction.
async fn more_work(store: &Store, s: SessionId, round: &mut usize) {
    for _ in 0..4 {
        exchange(store, s, *round);
        *round += 1;
    }
    compact(
        store,
        s,
        BUDGET,
        &config(),
        &StructuredSummarizer::new(counter()),
        |_| {},
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_commitment_survives_three_levels_of_compaction_until_fulfilled() {
    let store = Store::open_in_memory(StoreOptions::new(counter())).unwrap();
    let s = store.create_session("s", None).unwrap();

    store
        .append(
            s,
            NewMessage::text(Role::User, "Please make the parser accept trailing commas."),
        )
        .unwrap();
    let promise = store
        .append(
            s,
            NewMessage::text(
                Role::Assistant,
                "Understood. Once the parser change is in, I'll update CHANGELOG.md with a note.",
            ),
        )
        .unwrap()
        .id;

    // Enough unrelated work for a depth-2 summary above the promise.
    let mut round = 0;
    while chain(&store, promise).len() < 3 {
        more_work(&store, s, &mut round).await;
        assert!(round < 400, "no depth-2 summary after {round} rounds");
    }
    let above = chain(&store, promise);
    for id in &above {
        let summary = store.summary(*id).unwrap();
        assert!(
            summary.content.contains("Open commitments:")
                && summary.content.contains(&promise.to_string())
                && summary.content.contains("CHANGELOG.md"),
            "{id} (depth {}) lost the commitment:\n{}",
            summary.depth,
            summary.content
        );
        let digest = store
            .reader()
            .unwrap()
            .summary_digest(*id)
            .unwrap()
            .unwrap();
        assert!(
            digest
                .commitments
                .iter()
                .any(|c| c.message == promise && c.kind == CommitmentKind::Intent),
            "{id}: {digest:?}"
        );
    }
    assert!(store.summary(above[2]).unwrap().depth >= 2);
    assert!(block(&store, s).contains(&promise), "the block shows it");

    // The agent does it: an edit of the changelog.
    let edit = store
        .append(
            s,
            message(
                Role::Assistant,
                vec![Part::ToolCall {
                    id: "call_changelog".into(),
                    name: "Edit".into(),
                    arguments: r###"{"file_path":"/repo/CHANGELOG.md","old_string":"## Unreleased","new_string":"## Unreleased\n- Trailing commas"}"###.into(),
                }],
            ),
        )
        .unwrap()
        .id;
    store
        .append(
            s,
            message(
                Role::Tool,
                vec![Part::ToolResult {
                    call_id: "call_changelog".into(),
                    content: "The file /repo/CHANGELOG.md has been updated.".into(),
                    is_error: false,
                }],
            ),
        )
        .unwrap();
    assert!(
        !block(&store, s).contains(&promise),
        "fulfilled by a raw message: gone from the block at once"
    );

    // Compacted past the fulfilment: the leaf over the edit records the resolution, and every
    // summary written over both no longer lists it.
    while chain(&store, edit).is_empty() {
        more_work(&store, s, &mut round).await;
    }
    let reader = store.reader().unwrap();
    let leaf = chain(&store, edit)[0];
    let digest = reader.summary_digest(leaf).unwrap().unwrap();
    assert!(
        digest.resolved.iter().any(|r| r.item
            == ItemRef::Commitment {
                message: promise,
                ordinal: 0
            }
            && r.by == edit),
        "{digest:?}"
    );
    assert!(!block(&store, s).contains(&promise));
    // Keep going until one summary covers both; it does not list the commitment.
    loop {
        let promise_chain = chain(&store, promise);
        let edit_chain = chain(&store, edit);
        if let Some(shared) = promise_chain.iter().find(|id| edit_chain.contains(id)) {
            let summary = store.summary(*shared).unwrap();
            let digest = reader_digest(&store, *shared);
            assert!(
                !digest.commitments.iter().any(|c| c.message == promise),
                "{shared}: {digest:?}"
            );
            assert!(
                !summary
                    .content
                    .lines()
                    .any(|l| l.starts_with(&format!("- {promise} "))),
                "{}",
                summary.content
            );
            break;
        }
        more_work(&store, s, &mut round).await;
        assert!(round < 2_000, "no summary over both after {round} rounds");
    }
}

fn reader_digest(store: &Store, id: lcm_core::ids::SummaryId) -> lcm_core::digest::Digest {
    store.reader().unwrap().summary_digest(id).unwrap().unwrap()
}

/// Fitting a window too small for the whole open-commitments block lists fewer of the newest
/// commitments, down to a line saying how many are open, before giving up; the block is cut
/// only when nothing else makes the context fit.
#[tokio::test]
async fn a_window_too_small_for_the_block_shows_fewer_commitments() {
    let store = Store::open_in_memory(StoreOptions::new(counter())).unwrap();
    let s = store.create_session("s", None).unwrap();
    for i in 0..14 {
        store.append(s, intent_message(i)).unwrap();
    }
    compact(
        &store,
        s,
        600,
        &config(),
        &StructuredSummarizer::new(counter()),
        |_| {},
    )
    .await
    .unwrap();
    let ctx = assemble(&store, s).unwrap();
    let (whole, open) = ctx
        .items
        .iter()
        .find_map(|i| match i {
            ContextItem::Commitments {
                tokens,
                open,
                shown,
                ..
            } => {
                assert_eq!(*shown, open.len().min(12));
                Some((*tokens, open.len()))
            }
            _ => None,
        })
        .expect("an open-commitments block");
    assert!(open >= 4, "{open} open");
    let fitted_in = |budget: u64| {
        let fitted = ctx.clone().fit(budget, 0, counter()).ok()?;
        assert!(fitted.tokens <= budget, "{} > {budget}", fitted.tokens);
        fitted.items.iter().find_map(|i| match i {
            ContextItem::Commitments {
                shown,
                text,
                tokens,
                ..
            } => Some((*shown, text.clone(), *tokens)),
            _ => None,
        })
    };
    // Room for the whole context: the block is kept whole.
    let (shown, _, _) = fitted_in(ctx.tokens).expect("fits");
    assert_eq!(shown, open.min(12));
    // The smallest window the context fits in: the block lists none, only how many are open.
    let (mut low, mut high) = (1, ctx.tokens);
    while low < high {
        let mid = (low + high) / 2;
        if fitted_in(mid).is_some() {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let (none, text, bare) = fitted_in(low).expect("fits");
    assert_eq!(none, 0, "{text}");
    assert!(text.contains(&format!("… {open} open")), "{text}");
    // Halfway between that and the whole block's size: some of the newest, and how many more.
    let (fewer, text, _) = fitted_in(low + (whole - bare) / 2).expect("fits");
    assert!(0 < fewer && fewer < open.min(12), "{fewer}: {text}");
    assert!(
        text.contains("older (lcm_describe lists every commitment)"),
        "{text}"
    );
    // Too little even for that: a clear error.
    assert!(ctx.clone().fit(low - 1, 0, counter()).is_err());
}
