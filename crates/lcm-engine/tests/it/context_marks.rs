//! Pin and forget: the agent keeps a message in view verbatim past compaction, or sets an item
//! of its context aside behind a pointer. Each is one mark in the store, checked in its
//! transaction; assembly, compaction and fitting a budget show what the marks ask, and nothing
//! is ever deleted.

use std::sync::Arc;

use lcm_core::config::{CompactionConfig, Config};
use lcm_core::files::render_elided_pins;
use lcm_core::ids::{MessageId, SessionId, SummaryId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::{ContextMark, NodeRef};
use lcm_core::tokens::{Encoding, MESSAGE_OVERHEAD_TOKENS, TokenCounter};
use lcm_engine::tools::{Caller, ToolContext, ToolError, ToolRegistry};
use lcm_engine::{AssembledContext, ContextItem, assemble, compact, render_summary};
use lcm_llm::ExtractiveSummarizer;
use lcm_store::{Store, StoreError, StoreOptions};
use serde_json::{Value, json};

use crate::common::{assert_anthropic_pairing, assert_openai_pairing};

const SPEC: &str = "SPEC marker-pinned-spec: retries stop after 7 attempts, backoff doubles from \
                    250 ms, and the deploy window is Tuesday 14:00 UTC.";

fn counter() -> TokenCounter {
    TokenCounter::new(Encoding::O200kBase)
}

fn store() -> Store {
    Store::open_in_memory(StoreOptions::new(counter())).unwrap()
}

fn config() -> CompactionConfig {
    CompactionConfig {
        fresh_tail: 6,
        leaf_chunk_tokens: 800,
        leaf_target_tokens: 120,
        condensed_fanout: 2,
        condensed_target_tokens: 200,
        max_passes: 200,
        ..CompactionConfig::default()
    }
}

fn text(role: Role, text: String) -> NewMessage {
    NewMessage::text(role, text)
}

/// `n` turns of filler, each about 60 tokens, naming its number.
fn filler(store: &Store, s: SessionId, from: usize, n: usize) -> Vec<MessageId> {
    (from..from + n)
        .map(|i| {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            let body = format!(
                "turn {i} marker-filler-{i}: {}",
                "the build cache was warmed and the staging service restarted; ".repeat(4)
            );
            store.append(s, text(role, body)).unwrap().id
        })
        .collect()
}

async fn compact_to(store: &Store, s: SessionId, budget: u64) {
    let summarizer = ExtractiveSummarizer::new(counter());
    compact(store, s, budget, &config(), &summarizer, |_| {})
        .await
        .unwrap();
}

fn pinned_block(ctx: &AssembledContext) -> Option<(&str, &[MessageId], bool)> {
    ctx.items.iter().find_map(|i| match i {
        ContextItem::Pinned {
            text,
            messages,
            elided,
            ..
        } => Some((text.as_str(), messages.as_slice(), *elided)),
        _ => None,
    })
}

fn raw_ids(ctx: &AssembledContext) -> Vec<MessageId> {
    ctx.items
        .iter()
        .filter_map(|i| match i {
            ContextItem::Message(m) => Some(m.id),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_pinned_message_stays_verbatim_after_compaction() {
    let store = store();
    let s = store.create_session("pin", None).unwrap();
    let spec = store.append(s, text(Role::User, SPEC.into())).unwrap().id;
    let pinned = store.pin(s, spec, 4_000).unwrap();
    assert_eq!(pinned.total_tokens, pinned.tokens);
    assert_eq!(
        pinned.tokens,
        u64::from(store.message(spec).unwrap().token_count)
    );
    // In the raw tail it is shown where it is: no block.
    let ctx = assemble(&store, s).unwrap();
    assert!(pinned_block(&ctx).is_none());
    assert_eq!(raw_ids(&ctx), vec![spec]);

    filler(&store, s, 1, 60);
    compact_to(&store, s, 2_000).await;
    let ctx = assemble(&store, s).unwrap();
    assert!(!ctx.state.summaries.is_empty(), "the spec was summarised");
    assert!(!raw_ids(&ctx).contains(&spec));
    let (block, messages, elided) = pinned_block(&ctx).expect("a pinned block");
    assert_eq!((messages, elided), (&[spec][..], false));
    assert!(block.contains(SPEC), "verbatim: {block}");
    assert!(block.contains(&format!("<message id=\"{spec}\" role=\"user\"")));
    // After the summaries, before the raw tail.
    let at = ctx
        .items
        .iter()
        .position(|i| matches!(i, ContextItem::Pinned { .. }))
        .unwrap();
    assert!(
        ctx.items[..at]
            .iter()
            .all(|i| matches!(i, ContextItem::Summary { .. }))
    );
    assert!(
        ctx.items[at + 1..]
            .iter()
            .all(|i| !matches!(i, ContextItem::Summary { .. }))
    );
    let b = ctx.breakdown();
    assert_eq!(b.pinned.items, 1);
    assert_eq!(b.pinned.tokens, ctx.items[at].tokens());
    let openai = ctx.to_openai(None);
    assert!(
        openai
            .iter()
            .any(|m| m["role"] == "user" && m["content"].as_str().unwrap().contains(SPEC))
    );
    assert_openai_pairing(&openai);
    assert_anthropic_pairing(&ctx.to_anthropic(None));

    // Unpinned: the block goes, and the context is the one without the pin.
    assert!(
        store
            .clear_mark(s, NodeRef::Message(spec), ContextMark::Pinned)
            .unwrap()
    );
    let unpinned = assemble(&store, s).unwrap();
    assert!(pinned_block(&unpinned).is_none());
    assert_eq!(unpinned.tokens, ctx.tokens - b.pinned.tokens);
    // Unpinning again changes nothing and says so.
    assert!(
        !store
            .clear_mark(s, NodeRef::Message(spec), ContextMark::Pinned)
            .unwrap()
    );
}

#[test]
fn a_pin_past_the_cap_or_of_nothing_is_refused_and_nothing_changes() {
    let store = store();
    let s = store.create_session("cap", None).unwrap();
    let ids = filler(&store, s, 0, 3);
    let each = u64::from(store.message(ids[0]).unwrap().token_count);
    let cap = each * 2 - 1;
    store.pin(s, ids[0], cap).unwrap();
    let before = store.marks(s).unwrap();

    let err = store.pin(s, ids[1], cap).unwrap_err();
    assert!(matches!(err, StoreError::Refused(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("compaction.pinned_max_tokens") && text.contains(&ids[1].to_string()),
        "{text}"
    );
    assert_eq!(store.marks(s).unwrap(), before, "nothing written");

    let off = store.pin(s, ids[1], 0).unwrap_err();
    assert!(off.to_string().contains("pinning is off"), "{off}");
    assert!(matches!(
        store.pin(s, MessageId(999), cap),
        Err(StoreError::MessageNotFound(MessageId(999)))
    ));
    assert!(matches!(
        store.pin(SessionId(77), ids[1], cap),
        Err(StoreError::SessionNotFound(SessionId(77)))
    ));
    assert_eq!(store.marks(s).unwrap(), before, "nothing written");
    // Pinning a pinned message again is not a second pin.
    let again = store.pin(s, ids[0], cap).unwrap();
    assert_eq!(again.before, Some(ContextMark::Pinned));
    assert_eq!(again.total_tokens, each);
}

/// Another session's message can be pinned into this one: it shows in the block at once.
#[test]
fn a_message_of_another_session_is_pinned_into_this_context() {
    let store = store();
    let a = store.create_session("a", None).unwrap();
    let b = store.create_session("b", None).unwrap();
    let memory = store.append(a, text(Role::User, SPEC.into())).unwrap().id;
    filler(&store, b, 0, 2);
    store.pin(b, memory, 4_000).unwrap();
    let ctx = assemble(&store, b).unwrap();
    let (block, messages, _) = pinned_block(&ctx).unwrap();
    assert_eq!(messages, &[memory][..]);
    assert!(block.contains(SPEC));
    assert!(pinned_block(&assemble(&store, a).unwrap()).is_none());
}

/// A session with a tool exchange whose result is long.
fn with_tool_exchange(store: &Store) -> (SessionId, MessageId, MessageId) {
    let s = store.create_session("forget", None).unwrap();
    filler(store, s, 0, 2);
    let mut call = NewMessage::text(Role::Assistant, "");
    call.parts = vec![
        Part::Text {
            text: "Reading the log.".into(),
        },
        Part::ToolCall {
            id: "call_log".into(),
            name: "Bash".into(),
            arguments: r#"{"command":"cat build.log"}"#.into(),
        },
    ];
    let call = store.append(s, call).unwrap().id;
    let mut result = NewMessage::text(Role::Tool, "");
    result.parts = vec![Part::ToolResult {
        call_id: "call_log".into(),
        content: "warning: marker-noisy-log unused import\n".repeat(200),
        is_error: false,
    }];
    let result = store.append(s, result).unwrap().id;
    filler(store, s, 2, 2);
    (s, call, result)
}

#[test]
fn a_forgotten_message_is_a_pointer_until_restored() {
    let store = store();
    let (s, call, result) = with_tool_exchange(&store);
    let before = assemble(&store, s).unwrap();
    assert_eq!(store.forget(s, NodeRef::Message(result)).unwrap(), None);
    let ctx = assemble(&store, s).unwrap();
    let shown = ctx
        .items
        .iter()
        .find_map(|i| match i {
            ContextItem::Message(m) if m.id == result => Some(m),
            _ => None,
        })
        .unwrap();
    let [
        Part::ToolResult {
            call_id, content, ..
        },
    ] = shown.parts.as_slice()
    else {
        panic!("{:?}", shown.parts);
    };
    assert_eq!(call_id, "call_log", "the result still answers its call");
    assert!(content.starts_with(&format!("<lcm_forgotten id=\"{result}\"")));
    assert!(!content.contains("marker-noisy-log"));
    assert_eq!(
        shown.token_count,
        counter().count_message(shown.role, &shown.parts)
    );
    let stored = u64::from(store.message(result).unwrap().token_count);
    assert_eq!(
        ctx.tokens,
        before.tokens - stored + u64::from(shown.token_count)
    );
    let openai = ctx.to_openai(None);
    assert_openai_pairing(&openai);
    assert_anthropic_pairing(&ctx.to_anthropic(None));
    assert!(
        !serde_json::to_string(&openai)
            .unwrap()
            .contains("marker-noisy-log")
    );
    // The call made with it is kept as it was.
    assert!(ctx.items.iter().any(|i| matches!(
        i,
        ContextItem::Message(m) if m.id == call && m.parts == store.message(call).unwrap().parts
    )));
    // The store still has every byte.
    assert!(matches!(
        &store.message(result).unwrap().parts[0],
        Part::ToolResult { content, .. } if content.contains("marker-noisy-log")
    ));

    // Restored: exactly the context before.
    assert!(
        store
            .clear_mark(s, NodeRef::Message(result), ContextMark::Forgotten)
            .unwrap()
    );
    assert_eq!(assemble(&store, s).unwrap(), before);
}

#[tokio::test]
async fn forgetting_what_the_context_does_not_show_is_refused() {
    let store = store();
    let s = store.create_session("refuse", None).unwrap();
    let early = filler(&store, s, 0, 80);
    let other = store.create_session("other", None).unwrap();
    let foreign = filler(&store, other, 0, 1)[0];
    compact_to(&store, s, 2_000).await;
    let state = store.context(s).unwrap();
    let covered: Vec<SummaryId> = store
        .session_summaries(s)
        .unwrap()
        .iter()
        .map(|x| x.id)
        .filter(|id| !state.summaries.contains(id))
        .collect();
    assert!(!covered.is_empty(), "the fixture needs a condensed summary");
    for node in [
        NodeRef::Message(early[0]),
        NodeRef::Summary(covered[0]),
        NodeRef::Message(foreign),
    ] {
        let err = store.forget(s, node).unwrap_err();
        assert!(matches!(err, StoreError::Refused(_)), "{node}: {err:?}");
        assert!(store.marks(s).unwrap().is_empty(), "nothing written");
    }
    assert!(matches!(
        store.forget(s, NodeRef::Message(MessageId(10_000))),
        Err(StoreError::MessageNotFound(_))
    ));
    // A top-level summary can be forgotten: it shows as a pointer, and restored it renders
    // exactly as before.
    let top = state.summaries[0];
    let before = assemble(&store, s).unwrap();
    store.forget(s, NodeRef::Summary(top)).unwrap();
    let ctx = assemble(&store, s).unwrap();
    let ContextItem::Summary { summary, rendered } = &ctx.items[0] else {
        panic!("{:?}", ctx.items[0]);
    };
    assert_eq!(summary.id, top);
    assert!(rendered.starts_with(&format!("<lcm_forgotten id=\"{top}\"")));
    assert!(summary.token_count < store.summary(top).unwrap().token_count);
    assert_eq!(
        u64::from(summary.token_count),
        counter().count_text(rendered) as u64 + u64::from(MESSAGE_OVERHEAD_TOKENS)
    );
    store
        .clear_mark(s, NodeRef::Summary(top), ContextMark::Forgotten)
        .unwrap();
    let restored = assemble(&store, s).unwrap();
    assert_eq!(restored, before);
    let ContextItem::Summary { rendered, .. } = &restored.items[0] else {
        panic!()
    };
    assert_eq!(rendered, &render_summary(&store.summary(top).unwrap()));
}

/// Compaction summarises what the context shows: forgotten messages enter their summary as
/// their pointers (so a summary never grows past what it replaces), and the run converges.
#[tokio::test]
async fn compaction_summarises_forgotten_messages_as_their_pointers() {
    let store = store();
    let (s, _, result) = with_tool_exchange(&store);
    store.forget(s, NodeRef::Message(result)).unwrap();
    filler(&store, s, 10, 60);
    let summarizer = ExtractiveSummarizer::new(counter());
    let report = compact(&store, s, 2_000, &config(), &summarizer, |_| {})
        .await
        .unwrap();
    assert!(report.reached_goal, "{report:?}");
    assert!(store.covering(NodeRef::Message(result)).unwrap().is_some());
    // The mark went with the message's place in the context.
    assert!(store.marks(s).unwrap().is_empty());
    for summary in store.session_summaries(s).unwrap() {
        assert!(
            !summary.content.contains("marker-noisy-log"),
            "{} summarises the forgotten output",
            summary.id
        );
    }
    // Still found in the store, under the summary that covers it.
    assert!(store.context_messages(s).unwrap().contains(&result));
}

/// Fitting a budget keeps the pinned block while anything else can go, and leaves it out (a
/// marker naming its messages) only when nothing else makes the context fit.
#[tokio::test]
async fn fitting_a_budget_leaves_the_pinned_block_out_last() {
    let store = store();
    let s = store.create_session("fit", None).unwrap();
    let spec = store
        .append(s, text(Role::User, SPEC.repeat(6)))
        .unwrap()
        .id;
    store.pin(s, spec, 4_000).unwrap();
    filler(&store, s, 1, 60);
    compact_to(&store, s, 3_000).await;
    let ctx = assemble(&store, s).unwrap();
    let block_tokens = ctx.breakdown().pinned.tokens;
    assert!(block_tokens > 0);
    // The smallest budget the rest of the context fits in (fitting succeeds from some budget
    // on: found by bisection).
    let mut rest = ctx.clone();
    rest.items
        .retain(|i| !matches!(i, ContextItem::Pinned { .. }));
    rest.tokens -= block_tokens;
    let fits = |budget: u64| rest.clone().fit(budget, 0, counter()).is_ok();
    let (mut low, mut high) = (0, rest.tokens);
    while low < high {
        let mid = (low + high) / 2;
        if fits(mid) { high = mid } else { low = mid + 1 }
    }
    let smallest_rest = low;
    let marker = counter().count_text(&render_elided_pins(&[spec], block_tokens)) as u64
        + u64::from(MESSAGE_OVERHEAD_TOKENS);
    let (mut kept, mut elided) = (0, 0);
    for budget in (200..=ctx.tokens).step_by(25) {
        let Ok(fitted) = ctx.clone().fit(budget, 0, counter()) else {
            assert!(
                budget < smallest_rest + marker,
                "{budget} fits the rest and the marker"
            );
            continue;
        };
        assert!(fitted.tokens <= budget);
        let (block, messages, is_elided) = pinned_block(&fitted).unwrap();
        assert_eq!(messages, &[spec][..]);
        if is_elided {
            elided += 1;
            assert!(block.contains(&spec.to_string()) && !block.contains(SPEC));
            // Left out only because even the smallest form of the rest left no room for it.
            assert!(
                budget < smallest_rest + block_tokens,
                "{budget}: the block fitted beside the rest ({smallest_rest} + {block_tokens})"
            );
        } else {
            kept += 1;
            assert!(block.contains(SPEC));
        }
    }
    assert!(kept > 0 && elided > 0, "kept {kept}, elided {elided}");
}

fn registry_context(store: Arc<Store>, caller: Caller, cap: u32) -> ToolContext {
    let mut config = Config::default();
    config.compaction.pinned_max_tokens = cap;
    ToolContext::new(store, None, Arc::new(config), caller)
}

#[tokio::test]
async fn the_tools_pin_and_forget_for_the_main_agent_only() {
    let store = Arc::new(store());
    let (s, _, result) = with_tool_exchange(&store);
    let first = store.session_messages(s, 0..1).unwrap()[0].id;
    let registry = ToolRegistry::with_builtins();
    let main = registry_context(store.clone(), Caller::main_agent(Some(s)), 4_000);

    let pinned = registry
        .call(&main, "lcm_pin", json!({"id": first.to_string()}))
        .await
        .unwrap();
    assert_eq!(pinned["pinned"], true);
    assert_eq!(pinned["session"], json!(s));
    assert_eq!(pinned["pinned_max_tokens"], 4_000);
    assert_eq!(
        pinned["tokens"],
        json!(store.message(first).unwrap().token_count)
    );
    let forgotten = registry
        .call(&main, "lcm_forget", json!({"id": result.to_string()}))
        .await
        .unwrap();
    assert_eq!(forgotten["forgotten"], true);
    let described = registry
        .call(&main, "lcm_describe", json!({"id": s.to_string()}))
        .await
        .unwrap();
    assert_eq!(described["context"]["pinned"], json!([first.to_string()]));
    assert_eq!(
        described["context"]["forgotten"],
        json!([result.to_string()])
    );
    let marks = store.marks(s).unwrap();

    // Refused, each with a clear error, and nothing written.
    let sub = main.with_caller(Caller::sub_agent(Some(s), 1));
    let err = registry
        .call(&sub, "lcm_forget", json!({"id": first.to_string()}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::NotPermitted { .. }), "{err}");
    let names = |caller: &Caller| -> Vec<String> {
        registry
            .definitions_for(caller)
            .into_iter()
            .map(|d| d.name)
            .collect()
    };
    assert!(!names(&Caller::sub_agent(Some(s), 1)).contains(&"lcm_pin".to_string()));
    assert!(names(&Caller::main_agent(Some(s))).contains(&"lcm_pin".to_string()));
    let bad: [(&str, Value, &str); 5] = [
        ("lcm_pin", json!({"id": "sum_1"}), "a message (msg_N)"),
        ("lcm_pin", json!({"id": first.to_string(), "why": 1}), "why"),
        ("lcm_pin", json!({"id": "msg_x"}), "/id"),
        (
            "lcm_forget",
            json!({"id": first.to_string(), "restore": true}),
            "is not forgotten",
        ),
        (
            "lcm_pin",
            json!({"id": result.to_string(), "unpin": true}),
            "is not pinned",
        ),
    ];
    for (tool, args, says) in bad {
        let err = registry.call(&main, tool, args.clone()).await.unwrap_err();
        assert!(err.to_string().contains(says), "{tool} {args}: {err}");
    }
    let tight = registry_context(store.clone(), Caller::main_agent(Some(s)), 10);
    let err = registry
        .call(&tight, "lcm_pin", json!({"id": result.to_string()}))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ToolError::InvalidRequest { .. })
            && err.to_string().contains("compaction.pinned_max_tokens"),
        "{err}"
    );
    assert_eq!(store.marks(s).unwrap(), marks, "nothing written");

    // Pinning the forgotten message replaces that mark (and says so).
    let repinned = registry
        .call(&main, "lcm_pin", json!({"id": result.to_string()}))
        .await
        .unwrap();
    assert_eq!(repinned["was_forgotten"], true);
    assert!(
        store
            .marks(s)
            .unwrap()
            .iter()
            .all(|m| m.mark == ContextMark::Pinned)
    );
}

/// `lcm_describe` of a node says which contexts pin or forget it: a message pinned in its own
/// session and in another one, a forgotten summary; once released, it says nothing of marks.
#[tokio::test]
async fn describe_names_the_contexts_that_pin_or_forget_a_node() {
    let store = Arc::new(store());
    let a = store.create_session("a", None).unwrap();
    let b = store.create_session("b", None).unwrap();
    let spec = store.append(a, text(Role::User, SPEC.into())).unwrap().id;
    filler(&store, a, 1, 30);
    filler(&store, b, 0, 2);
    compact_to(&store, a, 1_200).await;
    let top = store.reader().unwrap().context(a).unwrap().summaries[0];
    let registry = ToolRegistry::with_builtins();
    let main = registry_context(store.clone(), Caller::main_agent(Some(a)), 4_000);
    let describe = |id: String| {
        let (registry, main) = (&registry, &main);
        async move {
            registry
                .call(main, "lcm_describe", json!({ "id": id }))
                .await
                .unwrap()
        }
    };
    assert!(describe(spec.to_string()).await.get("marks").is_none());

    store.pin(a, spec, 4_000).unwrap();
    store.pin(b, spec, 4_000).unwrap();
    store.forget(a, NodeRef::Summary(top)).unwrap();
    let marks = |d: &Value| -> Vec<(Value, Value)> {
        d["marks"]
            .as_array()
            .unwrap_or_else(|| panic!("no marks: {d}"))
            .iter()
            .map(|m| (m["session"].clone(), m["mark"].clone()))
            .collect()
    };
    let message = describe(spec.to_string()).await;
    assert_eq!(
        marks(&message),
        [(json!(a), json!("pinned")), (json!(b), json!("pinned"))]
    );
    let summary = describe(top.to_string()).await;
    assert_eq!(marks(&summary), [(json!(a), json!("forgotten"))]);
    // A summary under the forgotten one carries no mark of its own.
    if let Some(NodeRef::Summary(child)) = store.summary(top).unwrap().sources.first() {
        assert!(describe(child.to_string()).await.get("marks").is_none());
    }

    store
        .clear_mark(b, NodeRef::Message(spec), ContextMark::Pinned)
        .unwrap();
    assert_eq!(
        marks(&describe(spec.to_string()).await),
        [(json!(a), json!("pinned"))]
    );
    store
        .clear_mark(a, NodeRef::Message(spec), ContextMark::Pinned)
        .unwrap();
    store
        .clear_mark(a, NodeRef::Summary(top), ContextMark::Forgotten)
        .unwrap();
    assert!(describe(spec.to_string()).await.get("marks").is_none());
    assert!(describe(top.to_string()).await.get("marks").is_none());
}
