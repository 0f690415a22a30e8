//! The integrity check and its safe repairs, on real redb files: a healthy store checks clean;
//! each kind of damage (written with raw redb writes after the store is dropped) is reported as
//! exactly that violation with the right subject; the repairable ones are repaired (the check is
//! clean afterwards) and no repair changes a message, an original, a summary's content or its
//! sources; index watermark and document-count damage is repaired by a reindex.

use std::path::{Path, PathBuf};

use lcm_core::config::SearchConfig;
use lcm_core::ids::{FileId, MessageId, SessionId, SummaryId};
use lcm_core::message::{NewMessage, Original, Role, SourceFormat};
use lcm_core::summary::{ContextState, NewSummary, NodeRef, SummaryKind};
use lcm_core::time::Timestamp;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_search::SearchIndex;
use lcm_store::codec;
use lcm_store::integrity::{Counter, Repair, ViolationKind, check, repair};
use lcm_store::tables::{self, NODE_MESSAGE, NODE_SUMMARY, meta};
use lcm_store::{ApplyOutcome, Store, StoreOptions};
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};

use crate::common::SummaryRec;

// ------------------------------------------------------------------------------ fixture

/// Mirror of the store's session record (same fields, same order: the same bytes).
#[derive(Debug, Clone, PartialEq, bincode::Encode, bincode::Decode)]
struct SessionRec {
    key: String,
    created_at: Timestamp,
    parent: Option<u64>,
    message_count: u64,
    token_total: u64,
    first_message_at: Option<Timestamp>,
    last_message_at: Option<Timestamp>,
}

/// What the fixture holds.
///
/// - `ses_0` (alpha): 12 messages; leaves L0 (#0-2), L1 (#3-5), L2 (#6-8); C condenses L0 and
///   L1; context [C, L2] + raw from #9.
/// - `ses_1` (beta): 6 messages interleaved with alpha's (even ones with an original and a
///   source key); leaf LB (#0-1); context [LB] + raw from #2.
/// - `ses_2` (gamma): empty; `ses_3` (delta): child of gamma, one message.
struct Fixture {
    alpha: SessionId,
    beta: SessionId,
    gamma: SessionId,
    delta: SessionId,
    a: Vec<MessageId>,
    b: Vec<MessageId>,
    b_tokens: Vec<u32>,
    l0: SummaryId,
    l1: SummaryId,
    l2: SummaryId,
    c: SummaryId,
    lb: SummaryId,
}

fn options() -> StoreOptions {
    StoreOptions::new(TokenCounter::new(Encoding::O200kBase))
}

fn open(path: &Path) -> Store {
    Store::open(path, options()).unwrap()
}

fn leaf(session: SessionId, ids: &[MessageId]) -> NewSummary {
    NewSummary {
        session,
        kind: SummaryKind::Leaf,
        depth: 0,
        content: format!("leaf over {} messages", ids.len()),
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

fn applied(store: &Store, new: NewSummary) -> SummaryId {
    match store.apply_summary(new, vec![FileId(7)]).unwrap() {
        ApplyOutcome::Applied { summary, .. } => summary.id,
        ApplyOutcome::Stale { reason } => panic!("unexpectedly stale: {reason}"),
    }
}

fn build(path: &Path) -> Fixture {
    let store = open(path);
    let alpha = store.create_session("alpha", None).unwrap();
    let beta = store.create_session("beta", None).unwrap();
    let gamma = store.create_session("gamma", None).unwrap();
    let delta = store.create_session("delta", Some(gamma)).unwrap();
    let mut batch = Vec::new();
    for i in 0..12i64 {
        let mut m = NewMessage::text(Role::User, format!("alpha message {i} about the parser"));
        m.created_at = Timestamp(1_000 + i * 10);
        batch.push((alpha, m));
        if i < 6 {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            let mut m = NewMessage::text(role, format!("beta message {i}: the ticket INV-{i}"));
            m.created_at = Timestamp(1_005 + i * 10);
            if i % 2 == 0 {
                m.original = Some(Original {
                    format: SourceFormat::OpenAiChat,
                    bytes: format!("{{\"role\":\"user\",\"content\":\"beta {i}\"}}").into_bytes(),
                });
                m.source_key = Some(format!("b-{i}"));
            }
            batch.push((beta, m));
        }
    }
    let ids = store.append_mixed(batch).unwrap();
    let mut m = NewMessage::text(Role::User, "delta's only message");
    m.created_at = Timestamp(5_000);
    store.append(delta, m).unwrap();

    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut it = ids.into_iter().map(|x| x.id);
    for i in 0..12 {
        a.push(it.next().unwrap());
        if i < 6 {
            b.push(it.next().unwrap());
        }
    }
    let b_tokens = b
        .iter()
        .map(|id| store.message(*id).unwrap().token_count)
        .collect();
    let l0 = applied(&store, leaf(alpha, &a[0..3]));
    let l1 = applied(&store, leaf(alpha, &a[3..6]));
    let l2 = applied(&store, leaf(alpha, &a[6..9]));
    let c = applied(&store, condensed(alpha, 1, &[l0, l1]));
    let lb = applied(&store, leaf(beta, &b[0..2]));
    assert_eq!(store.context(alpha).unwrap().summaries, vec![c, l2]);
    Fixture {
        alpha,
        beta,
        gamma,
        delta,
        a,
        b,
        b_tokens,
        l0,
        l1,
        l2,
        c,
        lb,
    }
}

/// Opens the redb file directly and runs `corrupt` in one committed write transaction.
fn raw_write(path: &Path, corrupt: impl FnOnce(&WriteTransaction)) {
    let db = Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    corrupt(&txn);
    txn.commit().unwrap();
}

/// Rewrites every pack row of `messages` as plain rows, one record per message (both layouts
/// are valid), so that a case can damage one message's row alone. A pack is `0xFE`, a count
/// (u16 LE), the end of each record (u32 LE each, from the start of the records), the records.
fn unpack_messages(txn: &WriteTransaction) {
    let mut table = txn.open_table(tables::MESSAGES).unwrap();
    let rows: Vec<(u64, Vec<u8>)> = table
        .iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value(), v.value().to_vec())
        })
        .collect();
    let mut packs = 0;
    for (first, row) in rows {
        if row[0] != 0xFE {
            continue;
        }
        packs += 1;
        let n = usize::from(u16::from_le_bytes([row[1], row[2]]));
        let records = 3 + 4 * n;
        let mut start = 0;
        for i in 0..n {
            let end = u32::from_le_bytes(row[3 + 4 * i..7 + 4 * i].try_into().unwrap()) as usize;
            table
                .insert(first + i as u64, &row[records + start..records + end])
                .unwrap();
            start = end;
        }
    }
    assert!(packs > 0, "the fixture's batch is written as a pack");
}

fn edit_session(txn: &WriteTransaction, id: SessionId, edit: impl FnOnce(&mut SessionRec)) {
    let mut table = txn.open_table(tables::SESSIONS).unwrap();
    let mut rec: SessionRec = {
        let bytes = table.get(id.0).unwrap().unwrap();
        codec::decode("sessions", bytes.value()).unwrap()
    };
    edit(&mut rec);
    table.insert(id.0, codec::encode(&rec).as_slice()).unwrap();
}

fn edit_summary(txn: &WriteTransaction, id: SummaryId, edit: impl FnOnce(&mut SummaryRec)) {
    let mut table = txn.open_table(tables::SUMMARIES).unwrap();
    let mut rec: SummaryRec = {
        let bytes = table.get(id.0).unwrap().unwrap();
        codec::decode("summaries", bytes.value()).unwrap()
    };
    edit(&mut rec);
    table.insert(id.0, codec::encode(&rec).as_slice()).unwrap();
}

/// Adds a summary record (no edges) at the next summary id and moves the counter past it.
fn add_bare_summary(txn: &WriteTransaction, session: SessionId) -> SummaryId {
    let mut meta_table = txn.open_table(tables::META).unwrap();
    let id = meta_table.get(meta::NEXT_SUMMARY).unwrap().unwrap().value();
    meta_table.insert(meta::NEXT_SUMMARY, id + 1).unwrap();
    let rec = SummaryRec {
        session: session.0,
        kind: SummaryKind::Leaf,
        depth: 0,
        content: "stray".into(),
        token_count: 3,
        earliest_at: Timestamp(0),
        latest_at: Timestamp(0),
        descendant_messages: 0,
        descendant_tokens: 0,
        first_seq: 0,
        last_seq: 0,
        file_ids: vec![],
        level: 1,
        model: "test".into(),
        created_at: Timestamp(0),
    };
    txn.open_table(tables::SUMMARIES)
        .unwrap()
        .insert(id, codec::encode(&rec).as_slice())
        .unwrap();
    SummaryId(id)
}

fn set_source(txn: &WriteTransaction, summary: SummaryId, ordinal: u32, node: (u8, u64)) {
    txn.open_table(tables::SUMMARY_SOURCES)
        .unwrap()
        .insert((summary.0, ordinal), node)
        .unwrap();
}

fn remove_cover(txn: &WriteTransaction, node: (u8, u64)) {
    txn.open_table(tables::COVERED_BY)
        .unwrap()
        .remove(node)
        .unwrap();
}

fn set_context(txn: &WriteTransaction, session: SessionId, state: &ContextState) {
    txn.open_table(tables::CONTEXT)
        .unwrap()
        .insert(session.0, codec::encode(state).as_slice())
        .unwrap();
}

/// A summary without its derived fields: session, kind, content, token count, files, level,
/// model.
type SummaryContent = (u64, SummaryKind, String, u32, Vec<FileId>, u8, String);

/// Everything no repair may change: raw message and original bytes, summaries without their
/// derived fields, and source rows.
#[derive(Debug, PartialEq)]
struct Content {
    messages: Vec<(u64, Vec<u8>)>,
    originals: Vec<(u64, Vec<u8>)>,
    summaries: Vec<(u64, Result<SummaryContent, Vec<u8>>)>,
    sources: Vec<((u64, u32), (u8, u64))>,
}

fn content(path: &Path) -> Content {
    let db = Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let bytes_of = |def: redb::TableDefinition<u64, &[u8]>| -> Vec<(u64, Vec<u8>)> {
        let table = txn.open_table(def).unwrap();
        table
            .iter()
            .unwrap()
            .map(|e| {
                let (k, v) = e.unwrap();
                (k.value(), v.value().to_vec())
            })
            .collect()
    };
    let messages = bytes_of(tables::MESSAGES);
    let originals = bytes_of(tables::ORIGINALS);
    let summaries = bytes_of(tables::SUMMARIES)
        .into_iter()
        .map(|(id, bytes)| {
            let fields = codec::decode::<SummaryRec>("summaries", &bytes)
                .map(|r| {
                    (
                        r.session,
                        r.kind,
                        r.content,
                        r.token_count,
                        r.file_ids,
                        r.level,
                        r.model,
                    )
                })
                .map_err(|_| bytes);
            (id, fields)
        })
        .collect();
    let sources = txn
        .open_table(tables::SUMMARY_SOURCES)
        .unwrap()
        .iter()
        .unwrap()
        .map(|e| {
            let (k, v) = e.unwrap();
            (k.value(), v.value())
        })
        .collect();
    Content {
        messages,
        originals,
        summaries,
        sources,
    }
}

/// A fresh fixture in its own directory.
fn fixture() -> (tempfile::TempDir, PathBuf, Fixture) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lcm.redb");
    let fx = build(&path);
    (dir, path, fx)
}

/// Corrupts a fresh fixture, then checks that exactly `expected` (kind, subject) is reported,
/// that the repairable violations (and only those) carry a repair, that repairing leaves only
/// the unrepairable ones, and that no content changed.
fn run_case(
    corrupt: impl FnOnce(&WriteTransaction, &Fixture),
    expected: impl FnOnce(&Fixture) -> Vec<(ViolationKind, String, bool)>,
) {
    let (_dir, path, fx) = fixture();
    raw_write(&path, |txn| corrupt(txn, &fx));
    let expected = expected(&fx);
    let before = content(&path);

    let store = open(&path);
    let report = check(&store, None).unwrap();
    let mut found: Vec<(ViolationKind, String, bool)> = report
        .violations
        .iter()
        .map(|v| (v.kind, v.subject.clone(), v.repair.is_some()))
        .collect();
    let mut want = expected.clone();
    found.sort_by_key(|(k, s, r)| (k.as_str(), s.clone(), *r));
    want.sort_by_key(|(k, s, r)| (k.as_str(), s.clone(), *r));
    assert_eq!(found, want, "report: {report:#?}");
    for v in &report.violations {
        assert!(!v.detail.is_empty());
    }

    let repaired = repair(&store, None, &report).unwrap();
    assert_eq!(
        repaired.unrepairable,
        want.iter().filter(|(_, _, r)| !r).count()
    );
    assert!(repaired.skipped.is_empty(), "{repaired:#?}");
    let after = check(&store, None).unwrap();
    let mut left: Vec<(ViolationKind, String, bool)> = after
        .violations
        .iter()
        .map(|v| (v.kind, v.subject.clone(), v.repair.is_some()))
        .collect();
    left.sort_by_key(|(k, s, r)| (k.as_str(), s.clone(), *r));
    let unrepairable: Vec<_> = want.into_iter().filter(|(_, _, r)| !r).collect();
    assert_eq!(
        left, unrepairable,
        "after repair: {after:#?}\n{repaired:#?}"
    );
    // A second repair has nothing left to do.
    let again = repair(&store, None, &after).unwrap();
    assert!(again.applied.is_empty());
    drop(store);
    assert_eq!(content(&path), before, "a repair changed content");
}

fn v(
    kind: ViolationKind,
    subject: impl ToString,
    repairable: bool,
) -> (ViolationKind, String, bool) {
    (kind, subject.to_string(), repairable)
}

// ------------------------------------------------------------------------------ healthy

#[test]
fn healthy_store_checks_clean_with_and_without_the_index() {
    let (dir, path, fx) = fixture();
    let store = open(&path);
    let report = check(&store, None).unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.checked.sessions, 4);
    assert_eq!(report.checked.messages, 19);
    assert_eq!(report.checked.originals, 3);
    assert_eq!(report.checked.summaries, 5);
    // 3 + 3 + 3 leaves, 2 condensed, 2 for beta's leaf.
    assert_eq!(report.checked.source_edges, 13);
    assert_eq!(report.checked.cover_edges, 13);
    assert_eq!(report.checked.contexts, 2);
    assert_eq!(report.checked.index_documents, None);

    let index =
        SearchIndex::open(dir.path().join("index"), &store, &SearchConfig::default()).unwrap();
    // Not yet indexed is not a violation: the watermark is behind, consistently.
    assert!(check(&store, Some(&index)).unwrap().is_clean());
    index.catch_up(&store, |_, _| {}).unwrap();
    let report = check(&store, Some(&index)).unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.checked.index_documents, Some(19));

    // More history keeps it clean: appends, a second condensation, an empty repair.
    for i in 0..4 {
        let mut m = NewMessage::text(Role::User, format!("late {i}"));
        m.created_at = Timestamp(9_000 + i);
        store.append(fx.alpha, m).unwrap();
    }
    let l3 = applied(&store, leaf(fx.alpha, &fx.a[9..12]));
    let c2 = applied(&store, condensed(fx.alpha, 1, &[fx.l2, l3]));
    applied(&store, condensed(fx.alpha, 2, &[fx.c, c2]));
    index.catch_up(&store, |_, _| {}).unwrap();
    let report = check(&store, Some(&index)).unwrap();
    assert!(report.is_clean(), "{report:#?}");
    let nothing = repair(&store, Some(&index), &report).unwrap();
    assert!(nothing.applied.is_empty() && nothing.skipped.is_empty());
    // The JSON form names kinds and repairs in snake_case.
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["violations"], serde_json::json!([]));
    let _ = (fx.beta, fx.gamma, fx.delta, fx.lb, fx.l1);
}

// ------------------------------------------------------------------------------ damage

#[test]
fn undecodable_message_record() {
    run_case(
        |txn, fx| {
            unpack_messages(txn);
            txn.open_table(tables::MESSAGES)
                .unwrap()
                .insert(fx.b[5].0, [1u8, 0xff].as_slice())
                .unwrap();
        },
        |fx| vec![v(ViolationKind::UndecodableRecord, fx.b[5], false)],
    );
}

#[test]
fn damaged_pack_row() {
    run_case(
        |txn, _| {
            // The batch's pack loses its last byte: its last record no longer fits.
            let mut table = txn.open_table(tables::MESSAGES).unwrap();
            let mut row = table.get(0).unwrap().unwrap().value().to_vec();
            assert_eq!(row[0], 0xFE, "a pack");
            row.pop();
            table.insert(0, row.as_slice()).unwrap();
        },
        // The row is reported under its first message, the cut record under its own; every
        // other message of the pack still reads.
        |fx| {
            vec![
                v(ViolationKind::UndecodableRecord, fx.a[0], false),
                v(ViolationKind::UndecodableRecord, fx.a[11], false),
            ]
        },
    );
}

#[test]
fn undecodable_session_record() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SESSIONS)
                .unwrap()
                .insert(fx.gamma.0, [1u8].as_slice())
                .unwrap();
        },
        // Its key no longer maps back to a readable record either.
        |fx| vec![v(ViolationKind::UndecodableRecord, fx.gamma, false)],
    );
}

#[test]
fn message_counter_behind() {
    run_case(
        |txn, _| {
            txn.open_table(tables::META)
                .unwrap()
                .insert(meta::NEXT_MESSAGE, 3)
                .unwrap();
        },
        |_| vec![v(ViolationKind::CounterBehind, "meta.next_message", true)],
    );
}

#[test]
fn summary_counter_behind() {
    run_case(
        |txn, _| {
            txn.open_table(tables::META)
                .unwrap()
                .insert(meta::NEXT_SUMMARY, 0)
                .unwrap();
        },
        |_| vec![v(ViolationKind::CounterBehind, "meta.next_summary", true)],
    );
}

#[test]
fn missing_message() {
    run_case(
        |txn, fx| {
            unpack_messages(txn);
            txn.open_table(tables::MESSAGES)
                .unwrap()
                .remove(fx.b[5].0)
                .unwrap();
        },
        |fx| vec![v(ViolationKind::MissingMessage, fx.b[5], false)],
    );
}

#[test]
fn missing_message_without_any_entry_is_a_gap() {
    run_case(
        |txn, fx| {
            // The message and its entry are gone, and the session's counters agree: only the
            // gap in the ids (below next_message) and in the session's sequence show it.
            unpack_messages(txn);
            txn.open_table(tables::MESSAGES)
                .unwrap()
                .remove(fx.b[5].0)
                .unwrap();
            // beta's messages are interleaved with alpha's: one run each.
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .remove((fx.beta.0, 5))
                .unwrap();
            edit_session(txn, fx.beta, |r| {
                r.message_count = 5;
                r.token_total -= u64::from(fx.b_tokens[5]);
                r.last_message_at = Some(Timestamp(1_005 + 40));
            });
        },
        |fx| vec![v(ViolationKind::MissingMessage, fx.b[5], false)],
    );
}

#[test]
fn orphan_message() {
    run_case(
        |txn, fx| {
            // beta's messages are interleaved with alpha's: one run each.
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .remove((fx.beta.0, 5))
                .unwrap();
            edit_session(txn, fx.beta, |r| {
                r.message_count = 5;
                r.token_total -= u64::from(fx.b_tokens[5]);
                r.last_message_at = Some(Timestamp(1_005 + 40));
            });
        },
        |fx| vec![v(ViolationKind::OrphanMessage, fx.b[5], false)],
    );
}

#[test]
fn session_index_entry_of_an_unknown_session() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .insert((99, 0), (fx.b[3].0, 1))
                .unwrap();
        },
        |_| vec![v(ViolationKind::SessionIndexMismatch, "ses_99", false)],
    );
}

#[test]
fn rows_of_unknown_sessions_are_reported_once_per_session_with_their_count() {
    // Two rows of ses_98 and three of ses_99 after the rows of existing sessions: one
    // violation per unknown session, saying how many rows it has.
    let (_dir, path, fx) = fixture();
    raw_write(&path, |txn| {
        let mut runs = txn.open_table(tables::SESSION_RUNS).unwrap();
        for (session, seq) in [(98, 0), (98, 5), (99, 0), (99, 7), (99, 9)] {
            runs.insert((session, seq), (fx.b[3].0, 1)).unwrap();
        }
    });
    let store = open(&path);
    let report = check(&store, None).unwrap();
    let mut found: Vec<(String, String)> = report
        .violations
        .iter()
        .filter(|v| v.kind == ViolationKind::SessionIndexMismatch)
        .map(|v| (v.subject.clone(), v.detail.clone()))
        .collect();
    found.sort();
    assert_eq!(found.len(), 2, "{report:#?}");
    assert_eq!(found[0].0, "ses_98");
    assert!(found[0].1.contains("has 2 rows"), "{}", found[0].1);
    assert_eq!(found[1].0, "ses_99");
    assert!(found[1].1.contains("has 3 rows"), "{}", found[1].1);
}

#[test]
fn session_index_entries_swapped() {
    run_case(
        |txn, fx| {
            let mut t = txn.open_table(tables::SESSION_RUNS).unwrap();
            t.insert((fx.beta.0, 3), (fx.b[5].0, 1)).unwrap();
            t.insert((fx.beta.0, 5), (fx.b[3].0, 1)).unwrap();
        },
        // Both entries are wrong, and so both messages are unreachable.
        |fx| {
            vec![
                v(ViolationKind::SessionIndexMismatch, fx.beta, false),
                v(ViolationKind::SessionIndexMismatch, fx.beta, false),
                v(ViolationKind::OrphanMessage, fx.b[3], false),
                v(ViolationKind::OrphanMessage, fx.b[5], false),
            ]
        },
    );
}

#[test]
fn session_seq_gap() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .remove((fx.beta.0, 3))
                .unwrap();
        },
        |fx| {
            vec![
                v(ViolationKind::SessionSeqGap, fx.beta, false),
                v(ViolationKind::OrphanMessage, fx.b[3], false),
            ]
        },
    );
}

/// alpha's messages #6-11 came in one stretch after beta's last one: one run of six.
#[test]
fn alpha_ends_in_one_run_of_six() {
    let (_dir, path, fx) = fixture();
    let db = Database::open(&path).unwrap();
    let txn = db.begin_read().unwrap();
    let runs = txn.open_table(tables::SESSION_RUNS).unwrap();
    let last = runs
        .range((fx.alpha.0, 0)..=(fx.alpha.0, u64::MAX))
        .unwrap()
        .next_back()
        .unwrap()
        .unwrap();
    assert_eq!(last.0.value(), (fx.alpha.0, 6));
    assert_eq!(last.1.value(), (fx.a[6].0, 6));
}

#[test]
fn session_runs_overlapping() {
    run_case(
        |txn, fx| {
            // A second run placing messages at #8 and #9, inside the run #6-11.
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .insert((fx.alpha.0, 8), (fx.a[8].0, 2))
                .unwrap();
        },
        |fx| vec![v(ViolationKind::SessionIndexMismatch, fx.alpha, false)],
    );
}

#[test]
fn session_run_empty() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .insert((fx.alpha.0, 12), (fx.a[11].0 + 1, 0))
                .unwrap();
        },
        |fx| vec![v(ViolationKind::SessionIndexMismatch, fx.alpha, false)],
    );
}

#[test]
fn session_run_past_the_newest_message() {
    run_case(
        |txn, fx| {
            // The run #6-11 claims 100 messages: the walk stops at the newest one, delta's
            // message (after a[11]), which it reports as misplaced.
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .insert((fx.alpha.0, 6), (fx.a[6].0, 100))
                .unwrap();
        },
        |fx| {
            vec![
                v(ViolationKind::SessionIndexMismatch, fx.alpha, false),
                v(ViolationKind::SessionIndexMismatch, fx.alpha, false),
            ]
        },
    );
}

#[test]
fn session_run_at_the_last_sequence_numbers() {
    run_case(
        |txn, fx| {
            // A run whose sequence numbers would run past u64::MAX: reported, not walked into
            // an overflow.
            txn.open_table(tables::SESSION_RUNS)
                .unwrap()
                .insert((fx.alpha.0, u64::MAX - 1), (fx.a[0].0, 5))
                .unwrap();
        },
        |fx| {
            vec![
                v(ViolationKind::SessionSeqGap, fx.alpha, false),
                v(ViolationKind::SessionIndexMismatch, fx.alpha, false),
            ]
        },
    );
}

#[test]
fn session_totals() {
    run_case(
        |txn, fx| {
            edit_session(txn, fx.alpha, |r| {
                r.token_total += 5;
                r.message_count = 11;
                r.first_message_at = None;
            });
        },
        |fx| vec![v(ViolationKind::SessionTotals, fx.alpha, true)],
    );
}

#[test]
fn session_key_missing() {
    run_case(
        |txn, _| {
            txn.open_table(tables::SESSION_KEYS)
                .unwrap()
                .remove("gamma")
                .unwrap();
        },
        |fx| vec![v(ViolationKind::SessionKeyMismatch, fx.gamma, false)],
    );
}

#[test]
fn session_key_of_an_unknown_session() {
    run_case(
        |txn, _| {
            txn.open_table(tables::SESSION_KEYS)
                .unwrap()
                .insert("ghost", 42)
                .unwrap();
        },
        |_| vec![v(ViolationKind::SessionKeyMismatch, "ses_42", false)],
    );
}

#[test]
fn missing_parent_session() {
    run_case(
        |txn, fx| edit_session(txn, fx.delta, |r| r.parent = Some(77)),
        |fx| vec![v(ViolationKind::MissingParentSession, fx.delta, false)],
    );
}

#[test]
fn original_missing() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::ORIGINALS)
                .unwrap()
                .remove(fx.b[4].0)
                .unwrap();
        },
        |fx| vec![v(ViolationKind::OriginalMismatch, fx.b[4], false)],
    );
}

#[test]
fn original_of_an_unknown_message() {
    run_case(
        |txn, _| {
            txn.open_table(tables::ORIGINALS)
                .unwrap()
                .insert(500, b"{}".as_slice())
                .unwrap();
        },
        |_| vec![v(ViolationKind::OriginalMismatch, "msg_500", false)],
    );
}

#[test]
fn source_key_missing() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SOURCE_KEYS)
                .unwrap()
                .remove((fx.beta.0, "b-4"))
                .unwrap();
        },
        |fx| vec![v(ViolationKind::SourceKeyMismatch, fx.b[4], false)],
    );
}

#[test]
fn source_key_pointing_at_the_wrong_message() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SOURCE_KEYS)
                .unwrap()
                .insert((fx.beta.0, "b-9"), fx.b[3].0)
                .unwrap();
        },
        |fx| vec![v(ViolationKind::SourceKeyMismatch, fx.beta, false)],
    );
}

#[test]
fn orphan_summary() {
    run_case(
        |txn, fx| {
            add_bare_summary(txn, fx.gamma);
        },
        |_| vec![v(ViolationKind::OrphanSummary, "sum_5", false)],
    );
}

#[test]
fn session_summary_entry_of_an_unknown_session() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SESSION_SUMMARIES)
                .unwrap()
                .insert((99, fx.l0.0), ())
                .unwrap();
        },
        |_| vec![v(ViolationKind::SessionSummaryMismatch, "ses_99", false)],
    );
}

#[test]
fn session_summary_entry_of_a_missing_summary() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::SESSION_SUMMARIES)
                .unwrap()
                .insert((fx.gamma.0, 40), ())
                .unwrap();
        },
        |fx| vec![v(ViolationKind::SessionSummaryMismatch, fx.gamma, false)],
    );
}

#[test]
fn empty_summary() {
    run_case(
        |txn, fx| {
            let id = add_bare_summary(txn, fx.gamma);
            txn.open_table(tables::SESSION_SUMMARIES)
                .unwrap()
                .insert((fx.gamma.0, id.0), ())
                .unwrap();
        },
        |_| vec![v(ViolationKind::EmptySummary, "sum_5", false)],
    );
}

#[test]
fn source_rows_with_a_gap() {
    run_case(
        |txn, fx| {
            let mut t = txn.open_table(tables::SUMMARY_SOURCES).unwrap();
            let node = t.remove((fx.l2.0, 2)).unwrap().unwrap().value();
            t.insert((fx.l2.0, 5), node).unwrap();
        },
        |fx| vec![v(ViolationKind::SourceRows, fx.l2, false)],
    );
}

#[test]
fn source_rows_of_a_missing_summary() {
    run_case(
        |txn, fx| set_source(txn, SummaryId(60), 0, (NODE_MESSAGE, fx.b[5].0)),
        |_| vec![v(ViolationKind::SourceRows, "sum_60", false)],
    );
}

#[test]
fn missing_source() {
    run_case(
        |txn, fx| {
            set_source(txn, fx.l2, 2, (NODE_MESSAGE, 999_999));
            remove_cover(txn, (NODE_MESSAGE, fx.a[8].0));
        },
        |fx| vec![v(ViolationKind::MissingSource, fx.l2, false)],
    );
}

#[test]
fn foreign_source() {
    run_case(
        |txn, fx| {
            set_source(txn, fx.l2, 2, (NODE_MESSAGE, fx.b[5].0));
            remove_cover(txn, (NODE_MESSAGE, fx.a[8].0));
        },
        |fx| vec![v(ViolationKind::ForeignSource, fx.l2, false)],
    );
}

#[test]
fn wrong_source_kind() {
    run_case(
        |txn, fx| {
            set_source(txn, fx.l2, 2, (NODE_SUMMARY, fx.lb.0));
            remove_cover(txn, (NODE_MESSAGE, fx.a[8].0));
        },
        |fx| vec![v(ViolationKind::WrongSourceKind, fx.l2, false)],
    );
}

#[test]
fn non_contiguous_sources() {
    run_case(
        |txn, fx| {
            set_source(txn, fx.l2, 0, (NODE_MESSAGE, fx.a[7].0));
            set_source(txn, fx.l2, 1, (NODE_MESSAGE, fx.a[6].0));
        },
        |fx| vec![v(ViolationKind::NonContiguousSources, fx.l2, false)],
    );
}

#[test]
fn leaf_summary_fields() {
    run_case(
        |txn, fx| {
            edit_summary(txn, fx.l1, |r| {
                r.descendant_tokens += 7;
                r.latest_at = Timestamp(1);
                r.last_seq = 4;
            });
        },
        |fx| vec![v(ViolationKind::SummaryFields, fx.l1, true)],
    );
}

#[test]
fn condensed_summary_fields() {
    run_case(
        |txn, fx| {
            edit_summary(txn, fx.c, |r| {
                r.depth = 3;
                r.descendant_messages = 2;
                r.first_seq = 1;
            });
        },
        |fx| vec![v(ViolationKind::SummaryFields, fx.c, true)],
    );
}

#[test]
fn summary_fields_and_context_repaired_together() {
    run_case(
        |txn, fx| {
            // A wrong range on a top-level summary and a context that matches neither.
            edit_summary(txn, fx.l2, |r| r.last_seq = 20);
            set_context(
                txn,
                fx.alpha,
                &ContextState {
                    summaries: vec![fx.c],
                    raw_from: 6,
                    version: 9,
                },
            );
        },
        |fx| {
            vec![
                v(ViolationKind::SummaryFields, fx.l2, true),
                v(ViolationKind::ContextMismatch, fx.alpha, true),
            ]
        },
    );
}

#[test]
fn double_cover() {
    run_case(
        |txn, fx| set_source(txn, fx.l2, 3, (NODE_MESSAGE, fx.a[2].0)),
        |fx| vec![v(ViolationKind::DoubleCover, fx.a[2], false)],
    );
}

#[test]
fn cover_edge_missing() {
    run_case(
        |txn, fx| remove_cover(txn, (NODE_MESSAGE, fx.a[1].0)),
        |fx| vec![v(ViolationKind::CoverEdgeMissing, fx.a[1], false)],
    );
}

#[test]
fn cover_edge_without_a_source_edge() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::COVERED_BY)
                .unwrap()
                .insert((NODE_MESSAGE, fx.a[10].0), fx.l0.0)
                .unwrap();
        },
        |fx| vec![v(ViolationKind::CoverEdgeWrong, fx.a[10], false)],
    );
}

#[test]
fn cover_edge_of_a_missing_node() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::COVERED_BY)
                .unwrap()
                .insert((NODE_SUMMARY, 70), fx.c.0)
                .unwrap();
        },
        |_| vec![v(ViolationKind::CoverEdgeWrong, "sum_70", false)],
    );
}

#[test]
fn context_with_a_wrong_frontier() {
    run_case(
        |txn, fx| {
            set_context(
                txn,
                fx.alpha,
                &ContextState {
                    summaries: vec![fx.c, fx.l2],
                    raw_from: 11,
                    version: 4,
                },
            );
        },
        |fx| vec![v(ViolationKind::ContextMismatch, fx.alpha, true)],
    );
}

#[test]
fn context_missing() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::CONTEXT)
                .unwrap()
                .remove(fx.beta.0)
                .unwrap();
        },
        |fx| vec![v(ViolationKind::ContextMismatch, fx.beta, true)],
    );
}

#[test]
fn context_listing_covered_summaries() {
    run_case(
        |txn, fx| {
            set_context(
                txn,
                fx.alpha,
                &ContextState {
                    summaries: vec![fx.l0, fx.l1, fx.l2],
                    raw_from: 9,
                    version: 2,
                },
            );
        },
        |fx| vec![v(ViolationKind::ContextMismatch, fx.alpha, true)],
    );
}

#[test]
fn undecodable_context() {
    run_case(
        |txn, fx| {
            txn.open_table(tables::CONTEXT)
                .unwrap()
                .insert(fx.alpha.0, [1u8, 0xff, 0xff].as_slice())
                .unwrap();
        },
        |fx| vec![v(ViolationKind::ContextMismatch, fx.alpha, true)],
    );
}

#[test]
fn context_of_an_unknown_session() {
    run_case(
        |txn, _| set_context(txn, SessionId(33), &ContextState::default()),
        |_| vec![v(ViolationKind::ContextMismatch, "ses_33", false)],
    );
}

#[test]
fn context_that_skips_messages_without_a_sound_dag() {
    run_case(
        |txn, fx| {
            // L2's sources are broken, so the DAG cannot give a context: no repair is offered.
            set_source(txn, fx.l2, 0, (NODE_MESSAGE, fx.a[7].0));
            set_source(txn, fx.l2, 1, (NODE_MESSAGE, fx.a[6].0));
            set_context(
                txn,
                fx.alpha,
                &ContextState {
                    summaries: vec![fx.c],
                    raw_from: 9,
                    version: 4,
                },
            );
        },
        |fx| {
            vec![
                v(ViolationKind::NonContiguousSources, fx.l2, false),
                v(ViolationKind::ContextMismatch, fx.alpha, false),
            ]
        },
    );
}

#[test]
fn watermark_beyond_the_end_without_an_index_is_left_for_the_index() {
    let (_dir, path, _fx) = fixture();
    raw_write(&path, |txn| {
        txn.open_table(tables::META)
            .unwrap()
            .insert(meta::INDEX_WATERMARK, 1_000)
            .unwrap();
    });
    let store = open(&path);
    let report = check(&store, None).unwrap();
    assert_eq!(report.violations.len(), 1, "{report:#?}");
    assert_eq!(report.violations[0].kind, ViolationKind::WatermarkBeyondEnd);
    assert_eq!(report.violations[0].subject, "meta.index_watermark");
    assert_eq!(report.violations[0].repair, Some(Repair::Reindex));
    let repaired = repair(&store, None, &report).unwrap();
    assert!(repaired.applied.is_empty());
    assert_eq!(repaired.skipped.len(), 1);
    assert!(
        repaired.skipped[0]
            .detail
            .contains("needs the search index"),
        "{repaired:?}"
    );
}

#[test]
fn repairs_are_serialized_with_their_arguments() {
    let r = Repair::RaiseCounter {
        counter: Counter::NextMessage,
    };
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        serde_json::json!({"repair": "raise_counter", "counter": "next_message"})
    );
    assert_eq!(
        serde_json::to_value(Repair::RebuildContext {
            session: SessionId(3)
        })
        .unwrap(),
        serde_json::json!({"repair": "rebuild_context", "session": "ses_3"})
    );
    assert_eq!(
        serde_json::to_value(ViolationKind::SummaryFields).unwrap(),
        "summary_fields"
    );
}

// ------------------------------------------------------------------------------ index

/// A fixture with an index caught up in `<dir>/index`.
fn indexed_fixture() -> (tempfile::TempDir, PathBuf) {
    let (dir, path, _fx) = fixture();
    let store = open(&path);
    let index =
        SearchIndex::open(dir.path().join("index"), &store, &SearchConfig::default()).unwrap();
    index.catch_up(&store, |_, _| {}).unwrap();
    assert!(check(&store, Some(&index)).unwrap().is_clean());
    (dir, path)
}

/// Commits `payload` as the tantivy commit payload of the index in `dir` (no documents change).
fn set_index_payload(dir: &Path, payload: &str) {
    let index = tantivy::Index::open_in_dir(dir).unwrap();
    let mut writer: tantivy::IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
    let mut commit = writer.prepare_commit().unwrap();
    commit.set_payload(payload);
    commit.commit().unwrap();
}

/// Opens the store and the index, checks that `kind` is reported about `subject` with
/// `expected` repair, repairs, and checks clean (and that the index finds everything).
fn check_index_repair(
    dir: &Path,
    path: &Path,
    kind: ViolationKind,
    subject: &str,
    expected: Repair,
) {
    let before = content(path);
    let store = open(path);
    let index = SearchIndex::open(dir.join("index"), &store, &SearchConfig::default()).unwrap();
    let report = check(&store, Some(&index)).unwrap();
    assert_eq!(report.violations.len(), 1, "{report:#?}");
    let found = &report.violations[0];
    assert_eq!(
        (found.kind, found.subject.as_str()),
        (kind, subject),
        "{report:#?}"
    );
    assert_eq!(found.repair, Some(expected));
    let repaired = repair(&store, Some(&index), &report).unwrap();
    assert_eq!(repaired.applied.len(), 1, "{repaired:#?}");
    let after = check(&store, Some(&index)).unwrap();
    assert!(after.is_clean(), "{after:#?}");
    assert_eq!(after.checked.index_documents, Some(19));
    assert_eq!(index.watermark(), MessageId(19));
    assert_eq!(store.index_watermark().unwrap(), MessageId(19));
    drop(index);
    drop(store);
    assert_eq!(content(path), before);
}

#[test]
fn index_with_fewer_documents_than_its_watermark_says_is_reindexed() {
    let (dir, path) = indexed_fixture();
    // The index's watermark (and its trigram segments) cover all 19 messages, but tantivy
    // lost the documents of 16 of them.
    let index = tantivy::Index::open_in_dir(dir.path().join("index")).unwrap();
    let msg_id = index.schema().get_field("msg_id").unwrap();
    let mut writer: tantivy::IndexWriter = index.writer_with_num_threads(1, 15_000_000).unwrap();
    for id in 3..19 {
        writer.delete_term(tantivy::Term::from_field_u64(msg_id, id));
    }
    let payload = index.load_metas().unwrap().payload;
    let mut commit = writer.prepare_commit().unwrap();
    commit.set_payload(payload.as_deref().unwrap());
    commit.commit().unwrap();
    drop(writer);
    check_index_repair(
        dir.path(),
        &path,
        ViolationKind::IndexDocCount,
        "index",
        Repair::Reindex,
    );
}

/// An index past the store's end (here another store's, of 6 more messages; as a store
/// restored from an older copy leaves it) is rebuilt when it is opened: the next catch-up
/// indexes this store's messages, the check is clean, and the store is unchanged.
#[test]
fn index_watermark_beyond_the_end_is_rebuilt_at_open() {
    let (dir, path) = indexed_fixture();
    // The index of a store with 6 more messages, put in the place of this store's index.
    let (other, other_path, _fx) = fixture();
    {
        let store = open(&other_path);
        let session = store.create_session("more", None).unwrap();
        let more = (0..6)
            .map(|i| NewMessage::text(Role::User, format!("one more {i}")))
            .collect();
        store.append_batch(session, more).unwrap();
        let index = SearchIndex::open(other.path().join("index"), &store, &SearchConfig::default())
            .unwrap();
        assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 25);
        index.finish_merges().unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    copy_dir(&other.path().join("index"), &dir.path().join("index"));
    let before = content(&path);
    let store = open(&path);
    let index =
        SearchIndex::open(dir.path().join("index"), &store, &SearchConfig::default()).unwrap();
    assert_eq!(index.watermark(), MessageId(0), "rebuilt, not trusted");
    assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 19);
    let after = check(&store, Some(&index)).unwrap();
    assert!(after.is_clean(), "{after:#?}");
    assert_eq!(after.checked.index_documents, Some(19));
    drop(index);
    drop(store);
    assert_eq!(content(&path), before);
}

/// An index whose watermark its trigram segments do not cover (here: a payload claiming 1,000
/// messages) is discarded at open, and the next catch-up rebuilds it; the store is unchanged.
#[test]
fn index_whose_trigram_segments_fall_short_of_its_watermark_is_rebuilt() {
    let (dir, path) = indexed_fixture();
    let before = content(&path);
    let index_dir = dir.path().join("index");
    let payload = tantivy::Index::open_in_dir(&index_dir)
        .unwrap()
        .load_metas()
        .unwrap()
        .payload
        .unwrap();
    set_index_payload(
        &index_dir,
        &payload.replace("watermark 19", "watermark 1000"),
    );
    let store = open(&path);
    let index =
        SearchIndex::open(dir.path().join("index"), &store, &SearchConfig::default()).unwrap();
    assert_eq!(index.watermark(), MessageId(0));
    assert_eq!(index.num_docs(), 0);
    assert_eq!(index.catch_up(&store, |_, _| {}).unwrap(), 19);
    let report = check(&store, Some(&index)).unwrap();
    assert!(report.is_clean(), "{report:#?}");
    drop(index);
    drop(store);
    // Only the watermark copy moved (to 0 at open, back to 19 after the catch-up).
    assert_eq!(content(&path), before);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn redb_watermark_disagreeing_with_the_index_is_set_from_it() {
    let (dir, path) = indexed_fixture();
    let store = open(&path);
    let index =
        SearchIndex::open(dir.path().join("index"), &store, &SearchConfig::default()).unwrap();
    // A second, empty index on the same store resets the store's copy of the watermark to 0.
    let other = SearchIndex::open_in_ram(&store, &SearchConfig::default()).unwrap();
    drop(other);
    assert_eq!(store.index_watermark().unwrap(), MessageId(0));
    let report = check(&store, Some(&index)).unwrap();
    assert_eq!(report.violations.len(), 1, "{report:#?}");
    assert_eq!(report.violations[0].kind, ViolationKind::WatermarkMismatch);
    assert_eq!(report.violations[0].subject, "meta.index_watermark");
    assert_eq!(
        report.violations[0].repair,
        Some(Repair::SetIndexWatermark {
            watermark: MessageId(19)
        })
    );
    let repaired = repair(&store, Some(&index), &report).unwrap();
    assert_eq!(repaired.applied.len(), 1);
    assert!(check(&store, Some(&index)).unwrap().is_clean());
    assert_eq!(store.index_watermark().unwrap(), MessageId(19));
}

// ------------------------------------------------------------------------------ file records

/// A store with one file read (`file_0`, referenced by the result message) and its check.
fn files_fixture() -> (tempfile::TempDir, PathBuf, MessageId) {
    use lcm_core::message::Part;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lcm.redb");
    let store = open(&path);
    let s = store.create_session("reads", None).unwrap();
    let call = NewMessage {
        parts: vec![Part::ToolCall {
            id: "r1".into(),
            name: "Read".into(),
            arguments: r#"{"file_path":"/src/lib.rs"}"#.into(),
        }],
        ..NewMessage::text(Role::Assistant, "")
    };
    let result = NewMessage {
        parts: vec![Part::ToolResult {
            call_id: "r1".into(),
            content: "pub fn answer() -> u32 {\n    42\n}\n".into(),
            is_error: false,
        }],
        ..NewMessage::text(Role::Tool, "")
    };
    store.append(s, call).unwrap();
    let id = store.append(s, result).unwrap().id;
    let report = check(&store, None).unwrap();
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.checked.files, 1);
    (dir, path, id)
}

fn found(path: &Path) -> Vec<(ViolationKind, String, bool)> {
    let store = open(path);
    let mut found: Vec<_> = check(&store, None)
        .unwrap()
        .violations
        .iter()
        .map(|v| (v.kind, v.subject.clone(), v.repair.is_some()))
        .collect();
    found.sort_by_key(|(k, s, _)| (k.as_str(), s.clone()));
    found
}

#[test]
fn file_table_damage_is_reported() {
    // A missing record: the message's reference and the content hash point nowhere.
    let (_dir, path, id) = files_fixture();
    raw_write(&path, |txn| {
        txn.open_table(tables::FILES).unwrap().remove(0).unwrap();
    });
    assert_eq!(
        found(&path),
        vec![
            v(ViolationKind::FileRecords, "file_0", false),
            v(ViolationKind::FileRecords, id, false),
        ]
    );

    // A reference without its reverse entry, and a reverse entry without its reference.
    let (_dir, path, id) = files_fixture();
    raw_write(&path, |txn| {
        let mut reverse = txn.open_table(tables::FILE_MESSAGES).unwrap();
        reverse.remove((0, id.0)).unwrap();
        reverse.insert((0, id.0 - 1), ()).unwrap();
    });
    assert_eq!(
        found(&path),
        vec![
            v(ViolationKind::FileRecords, "file_0", false),
            v(ViolationKind::FileRecords, id, false),
        ]
    );

    // A counter behind the records: reported and repaired, nothing else changes.
    let (_dir, path, _) = files_fixture();
    raw_write(&path, |txn| {
        txn.open_table(tables::META)
            .unwrap()
            .insert(meta::NEXT_FILE, 0)
            .unwrap();
    });
    assert_eq!(
        found(&path),
        vec![v(ViolationKind::CounterBehind, "meta.next_file", true)]
    );
    let store = open(&path);
    let report = check(&store, None).unwrap();
    let repaired = repair(&store, None, &report).unwrap();
    assert_eq!(repaired.applied.len(), 1, "{repaired:#?}");
    assert!(check(&store, None).unwrap().is_clean());
    let _ = Counter::NextFile;
}

#[test]
fn digest_of_a_summary_that_does_not_exist() {
    run_case(
        |txn, _| {
            let digest = lcm_core::digest::Digest::default();
            txn.open_table(tables::SUMMARY_DIGESTS)
                .unwrap()
                .insert(99, codec::encode(&digest).as_slice())
                .unwrap();
        },
        |_| vec![v(ViolationKind::OrphanDigest, "sum_99", false)],
    );
}

#[test]
fn context_marks_on_nothing_are_removed_and_sound_ones_kept() {
    run_case(
        |txn, fx| {
            let mut marks = txn.open_table(tables::CONTEXT_MARKS).unwrap();
            // Sound: a pin of a message of another session, a forget of a raw message.
            marks
                .insert((fx.alpha.0, NODE_MESSAGE, fx.b[0].0), (1, 0))
                .unwrap();
            marks
                .insert((fx.alpha.0, NODE_MESSAGE, fx.a[11].0), (2, 0))
                .unwrap();
            // Broken: a missing message, a pin of a summary, a forget of another session's
            // summary, a session that does not exist, an unknown mark.
            marks
                .insert((fx.alpha.0, NODE_MESSAGE, 999), (1, 0))
                .unwrap();
            marks
                .insert((fx.alpha.0, NODE_SUMMARY, fx.l2.0), (1, 0))
                .unwrap();
            marks
                .insert((fx.alpha.0, NODE_SUMMARY, fx.lb.0), (2, 0))
                .unwrap();
            marks.insert((77, NODE_MESSAGE, fx.a[0].0), (1, 0)).unwrap();
            marks
                .insert((fx.beta.0, NODE_MESSAGE, fx.b[5].0), (9, 0))
                .unwrap();
        },
        |fx| {
            vec![
                v(
                    ViolationKind::ContextMarks,
                    format!("{} msg_999", fx.alpha),
                    true,
                ),
                v(
                    ViolationKind::ContextMarks,
                    format!("{} {}", fx.alpha, fx.l2),
                    true,
                ),
                v(
                    ViolationKind::ContextMarks,
                    format!("{} {}", fx.alpha, fx.lb),
                    true,
                ),
                v(
                    ViolationKind::ContextMarks,
                    format!("ses_77 {}", fx.a[0]),
                    true,
                ),
                v(
                    ViolationKind::ContextMarks,
                    format!("{} {}", fx.beta, fx.b[5]),
                    true,
                ),
            ]
        },
    );
}
