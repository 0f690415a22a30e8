//! Commitment tracking measured against a hand-labelled sample of the real Claude Code
//! sessions of `../shared/data` (`tests/data/commitment_labels.json`, labelled by reading the
//! transcripts; the guide is `tests/data/COMMITMENT_LABELS.md`).
//!
//! Each session's main conversation is fed, in order, to the tracker the summaries use
//! (`lcm_llm::structured::extract::Tracker`). In each labelled window (60 text entries per
//! session) a detected commitment counts as right when the label has one of the same kind in
//! the same entry (counted per entry and kind). Resolution agreement: of the right ones, those
//! resolved at the labelled entry, or both left open. Run with `--nocapture` for the figures.
//! Skips when the data is absent.

use std::collections::HashMap;

use lcm_core::digest::{CommitmentKind, OpenItems};
use lcm_core::formats::{Format, LineContext, LineOutcome, parse_line};
use lcm_core::ids::{MessageId, SessionId};
use lcm_core::message::{Message, SourceFormat};
use lcm_core::time::Timestamp;
use lcm_llm::structured::extract::Tracker;
use serde::Deserialize;

use crate::common::shared_data;

#[derive(Debug, Deserialize)]
struct Labels {
    transcripts: Vec<Transcript>,
}

#[derive(Debug, Deserialize)]
struct Transcript {
    file: String,
    text_entry_uuids: Vec<String>,
    commitments: Vec<Label>,
}

#[derive(Debug, Deserialize)]
struct Label {
    uuid: String,
    kind: String,
    resolved_by: Option<String>,
}

/// The main conversation of a transcript as stored messages (ids in order), with the uuid of
/// the entry each comes from.
fn main_conversation(path: &std::path::Path) -> (Vec<Message>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut parsed = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let ctx = LineContext {
            line: i as u64 + 1,
            default_session_key: "main",
        };
        if let Ok(LineOutcome::Messages(messages)) =
            parse_line(Format::ClaudeCode, line.as_bytes(), &ctx)
        {
            parsed.extend(messages);
        }
    }
    // Sub-agent entries have their own session key: keep the session of the first message.
    let main = parsed[0].session_key.clone();
    let mut messages = Vec::new();
    let mut uuids = Vec::new();
    for p in parsed.into_iter().filter(|p| p.session_key == main) {
        let n = messages.len() as u64;
        uuids.push(p.message.source_key.clone().unwrap_or_default());
        messages.push(Message {
            id: MessageId(n + 1),
            session: SessionId(1),
            seq: n,
            role: p.message.role,
            created_at: Timestamp::now(),
            token_count: 0,
            parts: p.message.parts,
            source: SourceFormat::ClaudeCode,
        });
    }
    (messages, uuids)
}

fn kind_name(kind: CommitmentKind) -> &'static str {
    match kind {
        CommitmentKind::Intent | CommitmentKind::Todo => "intent",
        CommitmentKind::Request => "request",
    }
}

#[test]
fn commitment_tracking_matches_the_hand_labelled_sample() {
    let Some(data) = shared_data() else {
        return;
    };
    let labels: Labels = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/data/commitment_labels.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(labels.transcripts.len(), 4);
    let (mut right, mut detected, mut labelled) = (0usize, 0usize, 0usize);
    let (mut agreed, mut compared) = (0usize, 0usize);
    for transcript in &labels.transcripts {
        let path = data.join("transcripts/claude-code").join(&transcript.file);
        let (messages, uuids) = main_conversation(&path);
        let none = |_: &str| None;
        let mut tracker = Tracker::new(&OpenItems::default(), &none);
        for m in &messages {
            tracker.message(m);
        }
        let uuid_of = |id: MessageId| uuids[(id.0 - 1) as usize].as_str();
        let window: std::collections::HashSet<&str> = transcript
            .text_entry_uuids
            .iter()
            .map(String::as_str)
            .collect();
        // Detections and labels per (entry, kind), in order.
        let mut found: HashMap<(&str, &str), Vec<Option<&str>>> = HashMap::new();
        for (commitment, resolution) in tracker.commitments_made() {
            let uuid = uuid_of(commitment.message);
            if window.contains(uuid) {
                found
                    .entry((uuid, kind_name(commitment.kind)))
                    .or_default()
                    .push(resolution.map(|(by, _)| uuid_of(by)));
            }
        }
        let mut expected: HashMap<(&str, &str), Vec<Option<&str>>> = HashMap::new();
        for label in &transcript.commitments {
            expected
                .entry((label.uuid.as_str(), label.kind.as_str()))
                .or_default()
                .push(label.resolved_by.as_deref());
        }
        let (mut t_right, mut t_detected, mut t_labelled) = (0, 0, 0);
        for (key, got) in &found {
            t_detected += got.len();
            if let Some(want) = expected.get(key) {
                let matched = got.len().min(want.len());
                t_right += matched;
                for i in 0..matched {
                    compared += 1;
                    if got[i] == want[i] {
                        agreed += 1;
                    } else if std::env::var_os("LCM_SHOW_DISAGREEMENTS").is_some() {
                        eprintln!(
                            "  resolution {key:?}: got {:?}, labelled {:?}",
                            got[i], want[i]
                        );
                    }
                }
            }
        }
        for want in expected.values() {
            t_labelled += want.len();
        }
        for (key, want) in &expected {
            let got = found.get(key).map_or(0, Vec::len);
            if got < want.len() {
                eprintln!(
                    "  missed {} {:?} x{}",
                    transcript.file,
                    key,
                    want.len() - got
                );
            }
        }
        for (key, got) in &found {
            let want = expected.get(key).map_or(0, Vec::len);
            if got.len() > want {
                eprintln!(
                    "  extra {} {:?} x{}",
                    transcript.file,
                    key,
                    got.len() - want
                );
            }
        }
        eprintln!(
            "{}: {t_right} right of {t_detected} detected, {t_labelled} labelled",
            transcript.file
        );
        right += t_right;
        detected += t_detected;
        labelled += t_labelled;
    }
    let precision = right as f64 / detected.max(1) as f64;
    let recall = right as f64 / labelled.max(1) as f64;
    let agreement = agreed as f64 / compared.max(1) as f64;
    eprintln!(
        "commitments: precision {precision:.3} ({right}/{detected}), recall {recall:.3} ({right}/{labelled}), resolution agreement {agreement:.3} ({agreed}/{compared})"
    );
    assert!(labelled >= 200, "the sample is the labelled one");
    assert!(precision >= 0.8, "precision {precision:.3}");
    assert!(recall >= 0.8, "recall {recall:.3}");
}
