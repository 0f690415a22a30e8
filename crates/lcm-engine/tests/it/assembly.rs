//! Context assembly: order, token totals, the engine-written summary header, determinism, and
//! valid tool pairing in both provider shapes (including on real Claude Code sessions).

use std::path::PathBuf;

use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::summary::{NewSummary, NodeRef, SummaryKind};
use lcm_core::time::Timestamp;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_engine::{ContextItem, assemble};
use lcm_store::import::{ImportOptions, import_file};
use lcm_store::{ApplyOutcome, Store, StoreOptions};
use serde_json::Value;

use crate::common::{assert_anthropic_pairing, assert_openai_pairing};

fn store() -> Store {
    Store::open_in_memory(StoreOptions::new(TokenCounter::new(Encoding::O200kBase))).unwrap()
}

fn msg(role: Role, parts: Vec<Part>, t: i64) -> NewMessage {
    NewMessage {
        role,
        parts,
        created_at: Timestamp(t),
        original: None,
        source_key: None,
    }
}

fn text(t: &str) -> Part {
    Part::Text { text: t.into() }
}

fn call(id: &str) -> Part {
    Part::ToolCall {
        id: id.into(),
        name: "Bash".into(),
        arguments: r#"{"command":"ls"}"#.into(),
    }
}

fn result(id: &str) -> Part {
    Part::ToolResult {
        call_id: id.into(),
        content: format!("output of {id}"),
        is_error: false,
    }
}

/// A conversation with a tool round trip, parallel calls split over entries, and an orphan.
fn conversation(store: &Store) -> (SessionId, Vec<MessageId>) {
    let s = store.create_session("conv", None).unwrap();
    let messages = vec![
        msg(Role::User, vec![text("please list the files")], 1),
        msg(Role::Assistant, vec![text("Listing.")], 2),
        msg(Role::Assistant, vec![call("c1")], 3),
        msg(Role::Tool, vec![result("c1")], 4),
        msg(Role::User, vec![text("now two at once")], 5),
        msg(Role::Assistant, vec![call("c2")], 6),
        msg(Role::Assistant, vec![call("c3")], 7),
        msg(Role::Tool, vec![result("c2")], 8),
        msg(Role::Tool, vec![result("c3")], 9),
        msg(Role::Tool, vec![result("c-orphan")], 10),
        msg(
            Role::Assistant,
            vec![
                text("Done."),
                Part::Reasoning {
                    text: "secret".into(),
                },
            ],
            11,
        ),
    ];
    let ids = store
        .append_batch(s, messages)
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    (s, ids)
}

#[test]
fn raw_context_renders_paired_tools_in_both_shapes() {
    let store = store();
    let (s, _) = conversation(&store);
    let ctx = assemble(&store, s).unwrap();
    assert_eq!(ctx.items.len(), 11);
    let stored: u64 = store.session(s).unwrap().token_total;
    assert_eq!(ctx.tokens, stored);

    let openai = ctx.to_openai(Some("be brief"));
    assert_eq!(openai[0]["role"], "system");
    assert_openai_pairing(&openai);
    // The two parallel calls were merged into one assistant message.
    assert!(
        openai
            .iter()
            .any(|m| m["tool_calls"].as_array().is_some_and(|c| c.len() == 2))
    );
    // The orphan result became text; reasoning is not sent.
    let all = serde_json::to_string(&openai).unwrap();
    assert!(all.contains("[tool result for c-orphan]"));
    assert!(!all.contains("secret"));

    let anthropic = ctx.to_anthropic(Some("be brief"));
    assert_eq!(anthropic["system"], "be brief");
    assert_anthropic_pairing(&anthropic);
}

#[test]
fn whitespace_only_text_never_becomes_an_anthropic_text_block() {
    let store = store();
    let s = store.create_session("ws", None).unwrap();
    for m in [
        msg(Role::User, vec![text("hello")], 1),
        msg(Role::Assistant, vec![text("\n\n"), text("Hi there.")], 2),
        msg(Role::Assistant, vec![text("  \n")], 3),
        msg(Role::User, vec![text("next")], 4),
    ] {
        store.append(s, m).unwrap();
    }
    let ctx = assemble(&store, s).unwrap();
    let body = ctx.to_anthropic(None);
    let blocks: Vec<&Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().unwrap())
        .collect();
    assert!(
        blocks
            .iter()
            .all(|b| b["type"] != "text" || !b["text"].as_str().unwrap().trim().is_empty()),
        "{body}"
    );
    let texts: Vec<&str> = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
    assert_eq!(texts, ["hello", "Hi there.", "next"]);
    // Roles still alternate (user, assistant, user).
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user"]);
}

#[test]
fn summaries_come_first_with_an_engine_written_header_and_rendering_is_deterministic() {
    let store = store();
    let (s, ids) = conversation(&store);
    let outcome = store
        .apply_summary(
            NewSummary {
                session: s,
                kind: SummaryKind::Leaf,
                depth: 0,
                content: "The user asked to list files; one Bash call listed them.".into(),
                token_count: 40,
                sources: ids[..4].iter().map(|id| NodeRef::Message(*id)).collect(),
                level: 1,
                model: "extractive".into(),
                digest: None,
            },
            vec![],
        )
        .unwrap();
    let ApplyOutcome::Applied { summary, .. } = outcome else {
        panic!("stale")
    };
    let ctx = assemble(&store, s).unwrap();
    assert_eq!(ctx.items.len(), 1 + 7);
    let ContextItem::Summary { rendered, .. } = &ctx.items[0] else {
        panic!("summary first")
    };
    for needle in [
        format!("id=\"{}\"", summary.id),
        "kind=\"leaf\"".to_owned(),
        "depth=\"0\"".to_owned(),
        format!("covers=\"{}..{} (4 messages)\"", ids[0], ids[3]),
        "from=\"1970-01-01T00:00:00.001Z\"".to_owned(),
        "to=\"1970-01-01T00:00:00.004Z\"".to_owned(),
    ] {
        assert!(rendered.contains(&needle), "{needle} missing in {rendered}");
    }
    let tail: u64 = ids[4..]
        .iter()
        .map(|id| u64::from(store.message(*id).unwrap().token_count))
        .sum();
    assert_eq!(ctx.tokens, 40 + tail);
    let again = assemble(&store, s).unwrap();
    assert_eq!(
        serde_json::to_string(&ctx.to_openai(None)).unwrap(),
        serde_json::to_string(&again.to_openai(None)).unwrap()
    );
    assert_openai_pairing(&ctx.to_openai(None));
    assert_anthropic_pairing(&ctx.to_anthropic(None));
}

#[test]
fn real_sessions_render_with_valid_pairing() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data/transcripts/claude-code");
    if !dir.is_dir() {
        eprintln!("SKIPPED: {} is absent", dir.display());
        return;
    }
    for name in ["short.jsonl", "tool_heavy.jsonl", "subagent.jsonl"] {
        let store = store();
        let report = import_file(
            &store,
            &dir.join(name),
            &ImportOptions::default(),
            |_, _| {},
        )
        .unwrap();
        for s in &report.sessions {
            let ctx = assemble(&store, s.id).unwrap();
            assert_eq!(
                ctx.items.len() as u64,
                store.session(s.id).unwrap().message_count
            );
            assert_openai_pairing(&ctx.to_openai(None));
            assert_anthropic_pairing(&ctx.to_anthropic(None));
        }
    }
}
