//! Regex grep against a naive scan: for random corpora and random patterns, with part of the
//! corpus indexed and the rest appended after the index's last commit, in batches of random
//! size (stored as packs of records), grep (followed page by page through its cursors) returns
//! exactly the messages a plain `Regex::is_match` over every stored text finds.

use lcm::core::config::SearchConfig;
use lcm::core::message::{NewMessage, Part, Role};
use lcm::core::time::Timestamp;
use lcm::search::{GrepMode, GrepRequest, Scope, SearchIndex, grep};
use lcm::store::{Store, StoreOptions};
use lcm::{Encoding, MessageId, SessionId, TokenCounter};
use proptest::prelude::*;
use regex::Regex;

const WORDS: &[&str] = &[
    "foo",
    "bar",
    "Baz",
    "qux",
    "héllo",
    "İstanbul",
    "ΣΟΦΙΑ",
    "error",
    "Timeout",
    "ab",
    "a1b2",
    "msg_42",
    "x",
    "FOObar",
    "naïve",
    "日本語",
    "tool_use",
    "ERROR:",
    "42",
    "3.14",
    "HTTP 404",
    "XYZ9",
    "20261125",
    // Holds `bar` after its start and ending before its end: required literals that nest.
    "foobarbaz",
];
const SEPARATORS: &[&str] = &[" ", "\n", "-", ".", "", ", ", "\t"];

fn text_strategy() -> impl Strategy<Value = String> {
    prop::collection::vec(
        (
            prop::sample::select(WORDS),
            prop::sample::select(SEPARATORS),
        ),
        0..12,
    )
    .prop_map(|pieces| pieces.into_iter().map(|(w, s)| format!("{w}{s}")).collect())
}

/// Session, role, texts, and whether the message is a tool call (name and arguments: the first
/// two texts) rather than text parts.
fn message_strategy() -> impl Strategy<Value = (u8, u8, Vec<String>, bool)> {
    (
        0u8..3,
        0u8..4,
        prop::collection::vec(text_strategy(), 1..3),
        prop::bool::weighted(0.2),
    )
}

fn parts(texts: &[String], tool_call: bool) -> Vec<Part> {
    if tool_call {
        return vec![Part::ToolCall {
            id: "toolu_1".into(),
            name: texts[0].clone(),
            arguments: texts.get(1).cloned().unwrap_or_default(),
        }];
    }
    texts
        .iter()
        .map(|t| Part::Text { text: t.clone() })
        .collect()
}

/// Patterns built from pieces of the vocabulary with regex operators around them, and some
/// without a single literal byte.
fn pattern_strategy() -> impl Strategy<Value = String> {
    prop_oneof![4 => word_pattern_strategy(), 1 => class_pattern_strategy()]
}

/// Patterns of classes only, such as `[A-Z]{2}\s[0-9]`: no literal for the index or the regex
/// engine's prefilter, so a scan looks for their leading classes first (`start_classes.rs`).
fn class_pattern_strategy() -> impl Strategy<Value = String> {
    let atom = prop::sample::select(
        &[
            "[A-Z]", "[0-9]", "[A-Z0-9]", r"\d", r"\s", r"\w", "[a-z]", r"\b", "[^a-z]",
        ][..],
    );
    let piece = (
        atom,
        // Runs of six and more: `required.rs` looks for those before the engine runs.
        prop::sample::select(&["", "", "", "{2}", "{3}", "+", "?", "{6}", "{7,}"][..]),
    )
        .prop_map(|(a, q)| format!("{a}{q}"));
    let concat = prop::collection::vec(piece, 1..5).prop_map(|v| v.concat());
    prop::collection::vec(concat, 1..3).prop_map(|alts| alts.join("|"))
}

/// Patterns built from pieces of the vocabulary with regex operators around them.
fn word_pattern_strategy() -> impl Strategy<Value = String> {
    // Weighted towards literals: those are the patterns the index narrows, where a wrong
    // trigram plan would lose hits.
    let atom = prop_oneof![
        6 => prop::sample::select(WORDS).prop_map(regex::escape),
        2 => prop::sample::select(WORDS).prop_map(|w| {
            let chars: Vec<char> = w.chars().collect();
            let end = chars.len().min(3);
            regex::escape(&chars[..end].iter().collect::<String>())
        }),
        1 => Just(".".to_owned()),
        1 => Just(r"\d+".to_owned()),
        1 => Just("[a-f]".to_owned()),
        1 => Just(r"\w".to_owned()),
        1 => Just(r"\s".to_owned()),
        1 => Just("[Ee]rr".to_owned()),
        // Classes with one of the bytes that join a message's fields into its text (a newline
        // between parts, a space in a tool call) and not the other: a scan that searches whole
        // rows of records must leave such patterns to message-by-message tests.
        1 => Just(r"\n".to_owned()),
        1 => Just(" ".to_owned()),
        1 => Just(r"[^\n]".to_owned()),
        1 => Just("[^ ]".to_owned()),
        // Look-arounds: Unicode word boundaries must hold on the bytes a scan matches too.
        1 => Just(r"\b".to_owned()),
        1 => Just(r"\B".to_owned()),
        1 => Just("$".to_owned()),
    ];
    let piece = (
        atom,
        prop::sample::select(&["", "", "", "", "", "?", "*", "+", "{2}"][..]),
    )
        .prop_map(|(a, q)| {
            if q.is_empty() {
                a
            } else {
                format!("(?:{a}){q}")
            }
        });
    let concat = prop::collection::vec(piece, 1..4).prop_map(|v| v.concat());
    (
        prop::collection::vec(concat, 1..3),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(alts, ci, anchored)| {
            let mut p = alts.join("|");
            if anchored {
                p = format!("^(?:{p})");
            }
            if ci {
                p = format!("(?i){p}");
            }
            p
        })
}

fn role(code: u8) -> Role {
    Role::ALL[usize::from(code) % 4]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn regex_grep_equals_naive_scan(
        messages in prop::collection::vec(message_strategy(), 1..40),
        indexed_fraction in 0.0f64..=1.0,
        patterns in prop::collection::vec(pattern_strategy(), 1..4),
        scope_session in prop::option::of(0u8..3),
        scope_role in prop::option::of(0u8..4),
        page in 1usize..6,
        index_batch in 1usize..12,
        append_batch in 1usize..24,
    ) {
        let store = Store::open_in_memory(StoreOptions::new(TokenCounter::new(Encoding::O200kBase))).unwrap();
        // Small commits: many trigram segments, merged four at a time.
        let config = SearchConfig { index_batch, ..SearchConfig::default() };
        let index = SearchIndex::open_in_ram(&store, &config).unwrap();
        let sessions: Vec<SessionId> = (0..3).map(|i| store.create_session(&format!("s{i}"), None).unwrap()).collect();
        let split = (messages.len() as f64 * indexed_fraction) as usize;
        // Appended in batches (several messages in a batch are stored as packs), the index
        // caught up between the two halves.
        let incoming: Vec<(SessionId, NewMessage)> = messages
            .iter()
            .enumerate()
            .map(|(i, (session, role_code, texts, tool_call))| {
                let m = NewMessage {
                    role: role(*role_code),
                    parts: parts(texts, *tool_call),
                    created_at: Timestamp(i as i64),
                    original: None,
                    source_key: None,
                };
                (sessions[usize::from(*session)], m)
            })
            .collect();
        let (before, after) = incoming.split_at(split);
        for chunk in before.chunks(append_batch) {
            store.append_mixed(chunk.to_vec()).unwrap();
        }
        index.catch_up(&store, |_, _| {}).unwrap();
        for chunk in after.chunks(append_batch) {
            store.append_mixed(chunk.to_vec()).unwrap();
        }
        let scope = Scope {
            session: scope_session.map(|s| sessions[usize::from(s)]),
            roles: scope_role.map(role).into_iter().collect(),
            ..Scope::default()
        };
        let reader = store.reader().unwrap();
        for pattern in &patterns {
            let regex = Regex::new(pattern).unwrap();
            let mut expected = Vec::new();
            for id in 0..messages.len() as u64 {
                let m = reader.message(MessageId(id)).unwrap();
                let in_scope = scope.session.is_none_or(|s| s == m.session)
                    && (scope.roles.is_empty() || scope.roles.contains(&m.role));
                if in_scope && regex.is_match(&m.search_text()) {
                    expected.push(m.id);
                }
            }
            let mut found = Vec::new();
            let mut cursor = None;
            for _ in 0..=messages.len() + 1 {
                let result = grep(&store, &index, &config, &GrepRequest {
                    pattern: pattern.clone(),
                    mode: GrepMode::Regex,
                    scope: scope.clone(),
                    limit: Some(page),
                    cursor: cursor.take(),
                }).unwrap();
                prop_assert!(result.hits.len() <= page);
                found.extend(result.hits.iter().map(|h| h.message));
                match result.next_cursor {
                    Some(c) => cursor = Some(c),
                    None => break,
                }
            }
            prop_assert_eq!(&found, &expected, "pattern {:?}", pattern);
        }
    }
}
