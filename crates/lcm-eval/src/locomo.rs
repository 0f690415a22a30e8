//! The LoCoMo format (Maharana et al., 2024): a JSON array of conversations between two
//! speakers, each in numbered sessions with a date, and questions whose answers lie in given
//! dialogue turns (their "evidence"). A file of one conversation is read too, in that shape or
//! in the multimodal-dialog release's (the `conversation` object's keys and `qa` at the top
//! level), see [`parse`].
//!
//! ```text
//! [{ "sample_id": "conv-26",
//!    "conversation": { "speaker_a": "Caroline", "speaker_b": "Melanie",
//!                      "session_1_date_time": "1:56 pm on 8 May, 2023",
//!                      "session_1": [{ "speaker": "Caroline", "dia_id": "D1:1", "text": "…",
//!                                      "blip_caption": "…" (optional: an image shared) }, …], … },
//!    "qa": [{ "question": "…", "answer": "…", "evidence": ["D1:3"], "category": 2 }, …] }, …]
//! ```
//!
//! A conversation becomes one lcm session: each turn a message (speaker A's as the user's,
//! B's as the assistant's) whose text is `Speaker: text`, with an image's caption after it,
//! created at its session's date (turns a second apart, in order), keyed by its `dia_id`, so
//! a search hit names the turn it found.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use chrono::NaiveDateTime;
use lcm_core::message::{NewMessage, Part, Role};
use lcm_core::time::Timestamp;
use serde_json::{Value, json};

use crate::{EvalError, Result};

/// One conversation and its questions.
#[derive(Debug, Clone, PartialEq)]
pub struct Conversation {
    /// `sample_id` (or `conversation-N`, its position, when absent).
    pub id: String,
    pub speaker_a: String,
    pub speaker_b: String,
    /// In session order.
    pub sessions: Vec<DialogueSession>,
    pub questions: Vec<Question>,
}

/// One dated session of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct DialogueSession {
    /// The `N` of `session_N`.
    pub number: u32,
    /// `session_N_date_time`, when given and readable.
    pub date: Option<Timestamp>,
    pub turns: Vec<Turn>,
}

/// One turn of dialogue.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub speaker: String,
    /// The turn's address (`D1:3`: session 1, turn 3), which evidence names.
    pub dia_id: String,
    pub text: String,
    /// The caption of an image the speaker shared.
    pub image_caption: Option<String>,
}

/// A question about a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub question: String,
    /// The reference answer (numbers as text); adversarial questions have none.
    pub answer: Option<String>,
    /// The `dia_id`s of the turns that hold the answer, normalised (see [`normalise_evidence`]).
    pub evidence: Vec<String>,
    /// 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.
    pub category: u8,
}

/// The name of a LoCoMo question category.
pub fn category_name(category: u8) -> &'static str {
    match category {
        1 => "multi-hop",
        2 => "temporal",
        3 => "open-domain",
        4 => "single-hop",
        5 => "adversarial",
        _ => "other",
    }
}

/// Reads a LoCoMo file.
pub fn load(path: &Path) -> Result<Vec<Conversation>> {
    load_all(&[path])
}

/// Reads LoCoMo files (the multimodal-dialog release ships a file per conversation) into one
/// list, in order; a conversation id twice, in one file or in two, is an error, since each
/// becomes a session of its own.
pub fn load_all<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<Conversation>> {
    let mut all: Vec<Conversation> = Vec::new();
    let mut origin_of: HashMap<String, String> = HashMap::new();
    for path in paths {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| EvalError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let origin = path.display().to_string();
        for conversation in parse(&bytes, &origin)? {
            if let Some(first) = origin_of.insert(conversation.id.clone(), origin.clone()) {
                return Err(EvalError::Format {
                    origin,
                    at: format!("conversation {}", conversation.id),
                    detail: format!("the id is already used in {first}"),
                });
            }
            all.push(conversation);
        }
    }
    Ok(all)
}

/// Parses LoCoMo JSON; `origin` names the input in errors. The input is an array of
/// conversations (`locomo10.json`), one such conversation, or one conversation as the
/// multimodal-dialog release ships it (speakers, sessions and `qa` at the top level; its id
/// is the file's name without extension, as `origin` gives it).
pub fn parse(bytes: &[u8], origin: &str) -> Result<Vec<Conversation>> {
    let error = |at: String, detail: String| EvalError::Format {
        origin: origin.to_string(),
        at,
        detail,
    };
    let root: Value = serde_json::from_slice(bytes)
        .map_err(|e| error("the file".into(), format!("not JSON: {e}")))?;
    let items = match root {
        Value::Array(items) => items,
        Value::Object(one) if one.contains_key("conversation") => vec![Value::Object(one)],
        Value::Object(mut body) if body.contains_key("speaker_a") => {
            let id = Path::new(origin)
                .file_stem()
                .map_or_else(|| "conversation-0".into(), |s| s.to_string_lossy());
            let qa = body.remove("qa").unwrap_or(Value::Null);
            vec![json!({ "sample_id": id, "conversation": body, "qa": qa })]
        }
        _ => {
            return Err(error(
                "the top level".into(),
                "expected an array of conversations or one conversation".into(),
            ));
        }
    };
    let conversations = items
        .iter()
        .enumerate()
        .map(|(i, item)| conversation(i, item).map_err(|(at, detail)| error(at, detail)))
        .collect::<Result<Vec<_>>>()?;
    let mut ids = HashSet::new();
    if let Some(twice) = conversations.iter().find(|c| !ids.insert(c.id.as_str())) {
        return Err(error(
            format!("conversation {}", twice.id),
            "the id is used twice".into(),
        ));
    }
    Ok(conversations)
}

type FieldError = (String, String);

fn conversation(index: usize, item: &Value) -> std::result::Result<Conversation, FieldError> {
    let id = item
        .get("sample_id")
        .and_then(Value::as_str)
        .map_or_else(|| format!("conversation-{index}"), str::to_string);
    let at = |field: &str| format!("conversation {id} ({field})");
    let body = item
        .get("conversation")
        .and_then(Value::as_object)
        .ok_or_else(|| (at("conversation"), "missing or not an object".into()))?;
    let speaker = |key: &str| {
        body.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| (at(key), "missing or not a string".to_string()))
    };
    let speaker_a = speaker("speaker_a")?;
    let speaker_b = speaker("speaker_b")?;

    let mut numbers: Vec<u32> = body
        .keys()
        .filter_map(|k| k.strip_prefix("session_")?.parse().ok())
        .collect();
    numbers.sort_unstable();
    let mut sessions = Vec::with_capacity(numbers.len());
    let mut seen = HashSet::new();
    for number in numbers {
        let key = format!("session_{number}");
        let Value::Array(raw_turns) = &body[&key] else {
            return Err((at(&key), "not an array of turns".into()));
        };
        let date = body
            .get(&format!("session_{number}_date_time"))
            .and_then(Value::as_str)
            .and_then(parse_date);
        let mut turns = Vec::with_capacity(raw_turns.len());
        for (t, raw) in raw_turns.iter().enumerate() {
            let field = |name: &str| raw.get(name).and_then(Value::as_str).map(str::to_string);
            let (Some(speaker), Some(dia_id)) = (
                field("speaker"),
                field("dia_id").map(|d| canonical_dia_id(&d)),
            ) else {
                return Err((
                    at(&format!("{key}[{t}]")),
                    "a turn needs `speaker` and `dia_id` strings".into(),
                ));
            };
            if !seen.insert(dia_id.clone()) {
                return Err((at(&format!("{key}[{t}]")), format!("`{dia_id}` twice")));
            }
            turns.push(Turn {
                speaker,
                dia_id,
                text: field("text").unwrap_or_default(),
                image_caption: field("blip_caption").filter(|c| !c.trim().is_empty()),
            });
        }
        sessions.push(DialogueSession {
            number,
            date,
            turns,
        });
    }

    let questions = match item.get("qa") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(qa)) => qa
            .iter()
            .enumerate()
            .map(|(q, raw)| question(raw).map_err(|detail| (at(&format!("qa[{q}]")), detail)))
            .collect::<std::result::Result<_, _>>()?,
        Some(_) => return Err((at("qa"), "not an array".into())),
    };
    Ok(Conversation {
        id,
        speaker_a,
        speaker_b,
        sessions,
        questions,
    })
}

fn question(raw: &Value) -> std::result::Result<Question, String> {
    let question = raw
        .get("question")
        .and_then(Value::as_str)
        .ok_or("`question` missing or not a string")?
        .to_string();
    let answer = match raw.get("answer") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let evidence = match raw.get("evidence") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(Value::as_str)
            .flat_map(normalise_evidence)
            .collect(),
        Some(_) => return Err("`evidence` is not an array".into()),
    };
    let category = raw
        .get("category")
        .and_then(Value::as_u64)
        .and_then(|c| u8::try_from(c).ok())
        .ok_or("`category` missing or not a small number")?;
    Ok(Question {
        question,
        answer,
        evidence,
        category,
    })
}

/// The `dia_id`s an evidence entry names. The published files hold a few irregular entries
/// (`"D8:6; D9:17"` and `"D9:1 D4:4"`, several in one; `"D:11:26"`; `"D30:05"`): several ids
/// are split on `;`, `,` and spaces, and each is read by [`canonical_dia_id`]. Anything else
/// is kept as written (and reported as unknown if no turn has it).
pub fn normalise_evidence(entry: &str) -> Vec<String> {
    entry
        .split([';', ',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(canonical_dia_id)
        .collect()
}

/// A `dia_id` in the one form turns and evidence are compared in: `D:N:M` reads as `DN:M`,
/// and leading zeros of the two numbers go (`D30:05` is `D30:5`). An id of another shape is
/// kept as written.
pub fn canonical_dia_id(id: &str) -> String {
    let id = id.trim();
    let body = id.strip_prefix("D:").or_else(|| id.strip_prefix('D'));
    // Digits only: `str::parse` would also take a leading `+`.
    let number = |n: &str| {
        n.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| n.parse::<u64>().ok())
            .flatten()
    };
    let numbers = body
        .and_then(|b| b.split_once(':'))
        .and_then(|(s, t)| Some((number(s)?, number(t)?)));
    match numbers {
        Some((session, turn)) => format!("D{session}:{turn}"),
        None => id.to_string(),
    }
}

/// Reads a LoCoMo session date (`1:56 pm on 8 May, 2023`) as UTC.
pub fn parse_date(text: &str) -> Option<Timestamp> {
    let normalised = text.trim().to_ascii_uppercase();
    NaiveDateTime::parse_from_str(&normalised, "%I:%M %p ON %d %B, %Y")
        .ok()
        .map(|t| Timestamp(t.and_utc().timestamp_millis()))
}

impl Turn {
    /// The text of the turn's message: the speaker, what they said, and the caption of an
    /// image they shared.
    pub fn message_text(&self) -> String {
        let mut text = format!("{}: {}", self.speaker, self.text);
        if let Some(caption) = &self.image_caption {
            text.push_str(" [shares an image: ");
            text.push_str(caption);
            text.push(']');
        }
        text
    }
}

impl Conversation {
    /// The conversation's turns as messages, in order, each keyed by its `dia_id`. A session
    /// without a readable date follows the previous one by a day (the first starts at the
    /// Unix epoch).
    pub fn messages(&self) -> Vec<NewMessage> {
        const SECOND: i64 = 1_000;
        const DAY: i64 = 86_400 * SECOND;
        let mut out = Vec::new();
        let mut clock = 0i64;
        for session in &self.sessions {
            clock = match session.date {
                Some(date) => date.0.max(clock),
                None => clock + DAY,
            };
            for turn in &session.turns {
                let role = if turn.speaker == self.speaker_b {
                    Role::Assistant
                } else {
                    Role::User
                };
                out.push(NewMessage {
                    role,
                    parts: vec![Part::Text {
                        text: turn.message_text(),
                    }],
                    created_at: Timestamp(clock),
                    original: None,
                    source_key: Some(turn.dia_id.clone()),
                });
                clock += SECOND;
            }
        }
        out
    }

    /// Every turn's `dia_id`.
    pub fn dia_ids(&self) -> HashSet<&str> {
        self.sessions
            .iter()
            .flat_map(|s| &s.turns)
            .map(|t| t.dia_id.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_of_the_published_files_read() {
        let t = parse_date("1:56 pm on 8 May, 2023").unwrap();
        assert_eq!(
            chrono::DateTime::from_timestamp_millis(t.0)
                .unwrap()
                .to_rfc3339(),
            "2023-05-08T13:56:00+00:00"
        );
        let t = parse_date("11:01 am on 17 December, 2022").unwrap();
        assert_eq!(
            chrono::DateTime::from_timestamp_millis(t.0)
                .unwrap()
                .to_rfc3339(),
            "2022-12-17T11:01:00+00:00"
        );
        assert_eq!(parse_date("yesterday"), None);
    }

    #[test]
    fn irregular_evidence_entries_are_split_and_repaired() {
        assert_eq!(normalise_evidence("D8:6; D9:17"), ["D8:6", "D9:17"]);
        assert_eq!(normalise_evidence("D:11:26"), ["D11:26"]);
        assert_eq!(normalise_evidence(" D1:3 "), ["D1:3"]);
        assert_eq!(normalise_evidence("D9:1 D4:4"), ["D9:1", "D4:4"]);
        assert_eq!(normalise_evidence("D30:05"), ["D30:5"]);
        assert_eq!(normalise_evidence("D:011:026"), ["D11:26"]);
        assert_eq!(normalise_evidence("D1:0"), ["D1:0"]);
        assert_eq!(normalise_evidence("D1:x"), ["D1:x"]);
        assert_eq!(normalise_evidence("D:1"), ["D:1"]);
        assert_eq!(normalise_evidence("D"), ["D"]);
        assert!(normalise_evidence("").is_empty());
    }

    #[test]
    fn malformed_input_says_where() {
        let err = parse(b"{}", "x.json").unwrap_err().to_string();
        assert!(err.contains("x.json") && err.contains("array"), "{err}");
        let err = parse(
            br#"[{"sample_id":"c1","conversation":{"speaker_a":"A"}}]"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("c1") && err.contains("speaker_b"), "{err}");
        let err = parse(
            br#"[{"conversation":{"speaker_a":"A","speaker_b":"B","session_1":[{"speaker":"A"}]}}]"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("conversation-0") && err.contains("session_1[0]"),
            "{err}"
        );
        let err = parse(
            br#"[{"conversation":{"speaker_a":"A","speaker_b":"B"},"qa":[{"question":"q","category":"x"}]}]"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("qa[0]") && err.contains("category"), "{err}");
    }

    #[test]
    fn turns_become_keyed_messages_in_order() {
        let conversations = parse(
            br#"[{"sample_id":"c","conversation":{"speaker_a":"Ann","speaker_b":"Bo",
                "session_2_date_time":"9:00 am on 2 May, 2023",
                "session_2":[{"speaker":"Bo","dia_id":"D2:1","text":"later"}],
                "session_1_date_time":"9:00 am on 1 May, 2023",
                "session_1":[{"speaker":"Ann","dia_id":"D1:1","text":"hi","blip_caption":"a cat"},
                             {"speaker":"Bo","dia_id":"D1:2","text":"hello"}]},
                "qa":[{"question":"q?","answer":2022,"evidence":["D1:2"],"category":4}]}]"#,
            "x",
        )
        .unwrap();
        let c = &conversations[0];
        assert_eq!(
            c.sessions.iter().map(|s| s.number).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(c.questions[0].answer.as_deref(), Some("2022"));
        let messages = c.messages();
        let keys: Vec<_> = messages
            .iter()
            .map(|m| m.source_key.clone().unwrap())
            .collect();
        assert_eq!(keys, ["D1:1", "D1:2", "D2:1"]);
        assert_eq!(messages[0].role, Role::User);
        assert_eq!(messages[1].role, Role::Assistant);
        assert!(messages[0].created_at < messages[1].created_at);
        assert!(messages[1].created_at < messages[2].created_at);
        let Part::Text { text } = &messages[0].parts[0] else {
            panic!("text part")
        };
        assert_eq!(text, "Ann: hi [shares an image: a cat]");
    }

    #[test]
    fn a_turn_and_its_evidence_meet_however_their_numbers_are_padded() {
        let conversations = parse(
            br#"[{"sample_id":"c","conversation":{"speaker_a":"Ann","speaker_b":"Bo",
                "session_1":[{"speaker":"Ann","dia_id":"D1:01","text":"hi"},
                             {"speaker":"Bo","dia_id":"D1:2","text":"hello"}]},
                "qa":[{"question":"q?","evidence":["D1:1","D1:02"],"category":4}]}]"#,
            "x",
        )
        .unwrap();
        let c = &conversations[0];
        let turns = c.dia_ids();
        assert_eq!(turns, HashSet::from(["D1:1", "D1:2"]));
        assert!(
            c.questions[0]
                .evidence
                .iter()
                .all(|e| turns.contains(e.as_str()))
        );
        // Two spellings of one turn are one turn twice.
        let err = parse(
            br#"[{"conversation":{"speaker_a":"A","speaker_b":"B",
                "session_1":[{"speaker":"A","dia_id":"D1:1","text":"x"},
                             {"speaker":"B","dia_id":"D1:001","text":"y"}]}}]"#,
            "x",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`D1:1` twice"), "{err}");
    }

    #[test]
    fn one_conversation_reads_as_the_array_holds_it_or_as_the_release_ships_it() {
        let one = br#"{"sample_id":"conv-7","conversation":{"speaker_a":"A","speaker_b":"B",
            "session_1":[{"speaker":"A","dia_id":"D1:1","text":"x"}]},
            "qa":[{"question":"q?","evidence":["D1:1"],"category":4}]}"#;
        let parsed = parse(one, "dir/one.json").unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].id, "conv-7");
        assert_eq!(parsed[0].questions.len(), 1);

        // The multimodal-dialog release: a file per conversation, the body at the top level.
        let release = br#"{"speaker_a":"A","speaker_b":"B",
            "session_1_date_time":"9:00 am on 1 May, 2023",
            "session_1":[{"speaker":"A","dia_id":"D1:1","text":"x"},
                         {"speaker":"B","dia_id":"D1:2","text":"y"}],
            "events_session_1":{"A":["an event"]},
            "qa":[{"question":"q?","evidence":["D1:2"],"category":4}]}"#;
        let parsed = parse(release, "data/locomo10_v2/26.json").unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].id, "26");
        assert_eq!(parsed[0].speaker_b, "B");
        assert_eq!(parsed[0].sessions[0].turns.len(), 2);
        assert_eq!(parsed[0].questions[0].evidence, ["D1:2"]);

        let err = parse(br#""text""#, "x").unwrap_err().to_string();
        assert!(
            err.contains("array of conversations or one conversation"),
            "{err}"
        );
    }

    #[test]
    fn a_conversation_id_twice_is_refused_in_one_file_and_across_files() {
        let conversation = |id: &str| {
            format!(
                r#"{{"sample_id":"{id}","conversation":{{"speaker_a":"A","speaker_b":"B",
                "session_1":[{{"speaker":"A","dia_id":"D1:1","text":"x"}}]}}}}"#
            )
        };
        let twice = format!("[{},{}]", conversation("c1"), conversation("c1"));
        let err = parse(twice.as_bytes(), "x.json").unwrap_err().to_string();
        assert!(
            err.contains("conversation c1") && err.contains("twice"),
            "{err}"
        );

        let dir = tempfile::tempdir().unwrap();
        let first = dir.path().join("first.json");
        let second = dir.path().join("second.json");
        std::fs::write(&first, format!("[{}]", conversation("c1"))).unwrap();
        std::fs::write(
            &second,
            format!("[{},{}]", conversation("c2"), conversation("c3")),
        )
        .unwrap();
        let both = load_all(&[&first, &second]).unwrap();
        let ids: Vec<_> = both.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["c1", "c2", "c3"]);

        std::fs::write(&second, conversation("c1")).unwrap();
        let err = load_all(&[&first, &second]).unwrap_err().to_string();
        assert!(
            err.contains("second.json")
                && err.contains("already used in")
                && err.contains("first.json"),
            "{err}"
        );
    }
}
