//! The budget invariant: every context lcm hands to a model is within its budget, every message
//! stays reachable (in the context, under a summary in it, or named by an elision marker), and
//! tool calls are never split from their results, over random sessions (messages from a few
//! tokens to several times the budget, tool exchanges, file reads, images), random budgets from
//! 2k to 200k tokens, with and without compaction having run, with messages pinned and items
//! forgotten by the agent; through the assembly every path uses and through the runtime's
//! `SessionHandle::context`.

use std::collections::HashSet;
use std::sync::Arc;

use lcm_core::config::{CompactionConfig, Config};
use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::NodeRef;
use lcm_core::time::Timestamp;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::runtime::{Runtime, RuntimeOptions};
use lcm_engine::{AssembledContext, ContextItem, assemble, compact, effective_budget};
use lcm_llm::extractive::ExtractiveSummarizer;
use lcm_store::{FileRules, Store, StoreOptions};
use proptest::prelude::*;

use crate::common::{assert_anthropic_pairing, assert_openai_pairing};

/// Smaller than the default (25,000) so that random sessions of a test's size meet it often.
const LARGE_FILE_TOKENS: u32 = 6_000;
const SAFETY_MARGIN: f64 = 0.05;

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn store() -> Store {
    Store::open_in_memory(StoreOptions {
        counter: counter(),
        files: FileRules {
            large_file_tokens: LARGE_FILE_TOKENS,
            exploration_max_tokens: 400,
        },
        cache_bytes: StoreOptions::DEFAULT_CACHE_BYTES,
    })
    .unwrap()
}

/// One turn of a random session; sizes are in thousandths of the budget.
#[derive(Debug, Clone)]
enum Turn {
    Text {
        user: bool,
        size: u32,
    },
    /// An assistant turn making `results.len()` calls (file reads if `read`), then the results.
    Tools {
        read: bool,
        results: Vec<u32>,
    },
    Image,
}

fn size() -> impl Strategy<Value = u32> {
    // Mostly small, sometimes up to three times the budget.
    prop_oneof![
        8 => 1u32..40,
        3 => 40u32..400,
        1 => 400u32..3_000,
    ]
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        5 => (any::<bool>(), size()).prop_map(|(user, size)| Turn::Text { user, size }),
        3 => (any::<bool>(), prop::collection::vec(size(), 1..4))
            .prop_map(|(read, results)| Turn::Tools { read, results }),
        1 => Just(Turn::Image),
    ]
}

const WORDS: [&str; 16] = [
    " deploy",
    " the",
    " cluster",
    " rollback",
    " staging",
    " ticket",
    " owner",
    " plan",
    " service",
    " error",
    " retry",
    " config",
    " build",
    " test",
    " cache",
    " index",
];

/// About `tokens` tokens of text (each word is one token), varied by `seed`.
fn words(tokens: u64, seed: usize) -> String {
    let tokens = tokens.clamp(1, 700_000) as usize;
    let mut out = String::with_capacity(tokens * 7);
    for i in 0..tokens {
        out.push_str(WORDS[(i * 7 + seed) % WORDS.len()]);
        if i % 50 == 49 {
            out.push('\n');
        }
    }
    out
}

/// A CSV of about `tokens` tokens (about 12 tokens a row).
fn csv(tokens: u64) -> String {
    let rows = (tokens / 12).max(1);
    let mut out = String::from("id,name,price\n");
    for i in 0..rows {
        out.push_str(&format!("{i},item-{i},{}.{:02}\n", i % 997, i % 100));
    }
    out
}

fn message(role: Role, parts: Vec<Part>, t: usize) -> NewMessage {
    NewMessage {
        role,
        parts,
        created_at: Timestamp(t as i64 * 1_000),
        original: None,
        source_key: Some(format!("m{t}")),
    }
}

/// The messages of a random session for `budget`.
fn messages(turns: &[Turn], budget: u64) -> Vec<NewMessage> {
    let tokens = |size: u32| (budget * u64::from(size) / 1_000).max(1);
    let mut out = Vec::new();
    for (i, t) in turns.iter().enumerate() {
        let n = out.len();
        match t {
            Turn::Text { user, size } => {
                let role = if *user { Role::User } else { Role::Assistant };
                out.push(message(
                    role,
                    vec![Part::Text {
                        text: words(tokens(*size), i),
                    }],
                    n,
                ));
            }
            Turn::Tools { read, results } => {
                let calls: Vec<Part> = (0..results.len())
                    .map(|k| Part::ToolCall {
                        id: format!("call-{i}-{k}"),
                        name: if *read { "Read" } else { "Bash" }.into(),
                        arguments: if *read {
                            format!(r#"{{"file_path":"/data/t{i}-{k}.csv"}}"#)
                        } else {
                            r#"{"command":"make test"}"#.into()
                        },
                    })
                    .collect();
                out.push(message(Role::Assistant, calls, n));
                for (k, size) in results.iter().enumerate() {
                    let content = if *read {
                        csv(tokens(*size))
                    } else {
                        words(tokens(*size), i + k)
                    };
                    out.push(message(
                        Role::Tool,
                        vec![Part::ToolResult {
                            call_id: format!("call-{i}-{k}"),
                            content,
                            is_error: false,
                        }],
                        out.len(),
                    ));
                }
            }
            Turn::Image => out.push(message(
                Role::User,
                vec![
                    Part::Text {
                        text: "what is in this picture?".into(),
                    },
                    Part::Binary {
                        media_type: "image/png".into(),
                        byte_len: 480_000,
                    },
                ],
                n,
            )),
        }
    }
    out
}

fn compaction_config() -> CompactionConfig {
    CompactionConfig {
        leaf_chunk_tokens: 4_000,
        leaf_target_tokens: 400,
        condensed_target_tokens: 600,
        ..CompactionConfig::default()
    }
}

/// Every check of the invariant on one context for `budget` (already less the margin).
fn check(store: &Store, session: SessionId, ctx: &AssembledContext, budget: u64) {
    let counter = counter();
    assert!(
        ctx.tokens <= budget,
        "context of {} tokens for a budget of {budget}",
        ctx.tokens
    );
    assert_eq!(
        ctx.tokens,
        ctx.items.iter().map(ContextItem::tokens).sum::<u64>()
    );
    // The breakdown by kind accounts for every item and token, each under its own kind.
    let b = ctx.breakdown();
    let tallies = [b.summaries, b.pinned, b.commitments, b.messages, b.elided];
    assert_eq!(tallies.iter().map(|t| t.tokens).sum::<u64>(), ctx.tokens);
    assert_eq!(
        tallies.iter().map(|t| t.items).sum::<u64>(),
        ctx.items.len() as u64
    );
    let kind = |f: fn(&ContextItem) -> bool| ctx.items.iter().filter(|i| f(i)).count() as u64;
    assert_eq!(
        b.summaries.items,
        kind(|i| matches!(i, ContextItem::Summary { .. }))
    );
    assert_eq!(
        b.elided.items,
        kind(|i| matches!(i, ContextItem::Elided { .. }))
    );
    assert!(b.commitments.items <= 1);
    assert!(b.pinned.items <= 1);
    // What a context says a message costs is what it shows.
    let mut shown: HashSet<MessageId> = HashSet::new();
    let mut in_context: HashSet<SummaryId> = HashSet::new();
    let mut elided_spans: Vec<(MessageId, MessageId)> = Vec::new();
    for item in &ctx.items {
        match item {
            ContextItem::Message(m) => {
                assert_eq!(
                    m.token_count,
                    counter.count_message(m.role, &m.parts),
                    "{} counts what it shows",
                    m.id
                );
                shown.insert(m.id);
            }
            ContextItem::Summary { summary, .. } => {
                in_context.insert(summary.id);
            }
            ContextItem::Elided {
                messages,
                summaries,
                ..
            } => {
                elided_spans.extend(*messages);
                in_context.extend(summaries.iter().copied());
            }
            // The pinned block names what it shows, or what it had no room for.
            ContextItem::Pinned { messages, .. } => shown.extend(messages.iter().copied()),
            ContextItem::Commitments { .. } => {}
        }
    }
    // Every message is reachable: shown, named by a marker, or under a summary in the context
    // (or named by one).
    let info = store.session(session).unwrap();
    let reader = store.reader().unwrap();
    for m in reader
        .session_messages(session, 0..info.message_count)
        .unwrap()
    {
        if shown.contains(&m.id)
            || elided_spans
                .iter()
                .any(|(first, last)| (first.0..=last.0).contains(&m.id.0))
        {
            continue;
        }
        let mut node = NodeRef::Message(m.id);
        let mut reached = false;
        while let Some(cover) = reader.covering(node).unwrap() {
            if in_context.contains(&cover) {
                reached = true;
                break;
            }
            node = NodeRef::Summary(cover);
        }
        assert!(reached, "{} is not reachable from the context", m.id);
    }
    assert_openai_pairing(&ctx.to_openai(Some("system")));
    assert_anthropic_pairing(&ctx.to_anthropic(Some("system")));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_assembled_context_fits_its_budget(
        turns in prop::collection::vec(turn(), 1..14),
        budget in 2_000u64..200_000,
        compacted in any::<bool>(),
        pins in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        forgets in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
        forget_summary in any::<Option<prop::sample::Index>>(),
    ) {
        let store = store();
        let s = store.create_session("random", None).unwrap();
        let ids: Vec<MessageId> = store
            .append_batch(s, messages(&turns, budget))
            .unwrap()
            .iter()
            .map(|a| a.id)
            .collect();
        // Marks made before compaction: pins within a cap of a tenth of the window (a pin
        // past it is refused), forgets of raw messages.
        for pin in &pins {
            match store.pin(s, *pin.get(&ids), budget / 10) {
                Ok(_) | Err(lcm_store::StoreError::Refused(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        for forget in &forgets {
            let node = NodeRef::Message(*forget.get(&ids));
            match store.forget(s, node) {
                Ok(_) | Err(lcm_store::StoreError::Refused(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        let budget = effective_budget(budget, SAFETY_MARGIN);
        if compacted {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let summarizer = ExtractiveSummarizer::new(counter());
            runtime
                .block_on(compact(&store, s, budget, &compaction_config(), &summarizer, |_| {}))
                .unwrap();
            let tops = store.context(s).unwrap().summaries;
            if let (Some(pick), false) = (forget_summary, tops.is_empty()) {
                store.forget(s, NodeRef::Summary(*pick.get(&tops))).unwrap();
            }
        }
        let ctx = assemble(&store, s).unwrap();
        let fitted = ctx.fit(budget, 0, counter()).unwrap();
        check(&store, s, &fitted, budget);
        // With a system prompt beside it, the two together fit.
        let system = counter().count_text(&words(budget / 10, 3)) as u64 + 4;
        let with_system = fitted.clone().fit(budget, system, counter()).unwrap();
        check(&store, s, &with_system, budget - system);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    /// The runtime's context (compaction in the background, waiting above the hard threshold)
    /// is within the window less the margin on every call.
    #[test]
    fn every_runtime_context_fits_its_budget(
        turns in prop::collection::vec(turn(), 1..10),
        budget in 2_000u64..60_000,
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut config = Config {
                compaction: compaction_config(),
                ..Config::default()
            };
            config.files.large_file_tokens = LARGE_FILE_TOKENS;
            config.files.exploration_max_tokens = 400;
            let rt = Runtime::open(
                RuntimeOptions::in_memory(config)
                    .with_summarizer(Arc::new(ExtractiveSummarizer::new(counter()))),
            )
            .await
            .unwrap();
            let handle = rt.session("random").await.unwrap();
            let limit = effective_budget(budget, SAFETY_MARGIN);
            for m in messages(&turns, budget) {
                handle.append(m).await.unwrap();
                let ctx = handle.context(budget).await.unwrap();
                check(rt.store(), handle.id(), &ctx, limit);
            }
            rt.shutdown(std::time::Duration::from_secs(5)).await.unwrap();
        });
    }
}

/// One message over the whole budget (not a registered file: below the large-file threshold)
/// is shown by a reference with a head excerpt, never raw.
#[test]
fn a_message_larger_than_the_budget_is_shown_by_reference() {
    let store = store();
    let s = store.create_session("one", None).unwrap();
    let text = words(5_000, 1);
    let id = store
        .append(
            s,
            message(Role::User, vec![Part::Text { text: text.clone() }], 0),
        )
        .unwrap()
        .id;
    let ctx = assemble(&store, s)
        .unwrap()
        .fit(2_000, 0, counter())
        .unwrap();
    check(&store, s, &ctx, 2_000);
    let ContextItem::Message(m) = &ctx.items[0] else {
        panic!("{:?}", ctx.items[0]);
    };
    let Part::Text { text: shown } = &m.parts[0] else {
        panic!()
    };
    assert!(shown.starts_with(&format!("<lcm_elided message=\"{id}\" part=\"0\"")));
    assert!(shown.contains(&text[..200]), "a head excerpt");
    assert_eq!(
        store.message(id).unwrap().parts[0],
        Part::Text { text },
        "stored verbatim"
    );
}

/// When nothing can make the context fit (the system prompt alone takes the budget), the call
/// fails with a clear error instead of exceeding it.
#[test]
fn an_impossible_budget_is_a_clear_error() {
    let store = store();
    let s = store.create_session("tight", None).unwrap();
    store
        .append(
            s,
            message(
                Role::User,
                vec![Part::Text {
                    text: "hello".into(),
                }],
                0,
            ),
        )
        .unwrap();
    let ctx = assemble(&store, s).unwrap();
    let err = ctx.clone().fit(1_000, 1_200, counter()).unwrap_err();
    assert_eq!((err.budget, err.system), (1_000, 1_200));
    assert!(
        err.to_string().contains("cannot fit in 1000 tokens"),
        "{err}"
    );
    // Room for 2 tokens, and the newest message (5 tokens) is too short to shorten.
    let err = ctx.fit(100, 98, counter()).unwrap_err();
    assert_eq!(err.needed, 5, "{err:?}");
}
