//! Needles after compaction: facts planted at chosen depths of a long generated session —
//! single facts, facts updated later in the session, and two-hop chains (who leads a project,
//! where that person's desk is) — and questions whose answers are only in the part of the
//! session a small budget compacts. The filler is small talk about TREC questions.

use lcm_core::tokens::TokenCounter;

use super::{Answer, Family, Question, Speaker, Task, Turn, turn_tokens};
use crate::trec::{Item, LABEL_NAMES};
use lcm_core::rng::SplitMix64;

const PROJECTS: [&str; 12] = [
    "Kestrel", "Heron", "Osprey", "Plover", "Merlin", "Avocet", "Bittern", "Curlew", "Dunlin",
    "Egret", "Godwit", "Harrier",
];
const PEOPLE: [&str; 12] = [
    "Dana", "Imre", "Sofia", "Tomasz", "Aiko", "Ravi", "Lena", "Marek", "Nadia", "Oskar", "Priya",
    "Yusuf",
];
const REPLIES: [&str; 4] = [
    "Good question; I would file it under",
    "That one, I believe, is about",
    "Noted. It reads as a question of",
    "Interesting. I would call it",
];

/// A fact to plant: its text and how deep in the session it goes (a share of the turns).
struct Planted {
    text: String,
    depth: f64,
}

/// Generates a needle task over `items` (filler questions) of at most `target_tokens`: two
/// single facts, two facts updated later, and two two-hop chains, all within the first 60% of
/// the session (the part a small budget compacts).
pub fn generate(items: &[Item], seed: u64, target_tokens: u64, counter: TokenCounter) -> Task {
    let mut rng = SplitMix64::new(seed ^ 0x000E_ED1E);
    let mut projects = PROJECTS;
    rng.shuffle(&mut projects);
    let mut people = PEOPLE;
    rng.shuffle(&mut people);
    let mut jitter = |depth: f64| depth + (rng.below(60) as f64 - 30.0) / 1000.0;
    let mut planted = Vec::new();
    let mut questions = Vec::new();
    let mut lockers: Vec<u64> = Vec::new();
    let mut code_rng = SplitMix64::new(seed ^ 0xC0DE);
    for depth in [0.1, 0.45] {
        let locker = loop {
            let n = code_rng.in_range(100..1000);
            if !lockers.contains(&n) {
                break n;
            }
        };
        lockers.push(locker);
        let letter = |r: &mut SplitMix64| char::from(b'A' + r.below(26) as u8);
        let code = format!(
            "{}{}-{:04}",
            letter(&mut code_rng),
            letter(&mut code_rng),
            code_rng.below(10_000)
        );
        planted.push(Planted {
            text: format!("For the record: the access code of locker {locker} is {code}."),
            depth: jitter(depth),
        });
        questions.push(Question {
            kind: "single_fact".into(),
            text: format!("What is the access code of locker {locker}? Answer with the code only."),
            answer: Answer::Text(code),
        });
    }
    for (i, depth) in [0.15, 0.3].into_iter().enumerate() {
        let project = projects[i];
        let first = 100 + code_rng.below(400);
        let now = 500 + code_rng.below(400);
        planted.push(Planted {
            text: format!("For the record: the meeting room of project {project} is room {first}."),
            depth: jitter(depth),
        });
        planted.push(Planted {
            text: format!(
                "Update for the record: the meeting room of project {project} is now room {now}."
            ),
            depth: jitter(depth + 0.2),
        });
        questions.push(Question {
            kind: "updated_fact".into(),
            text: format!(
                "What is the meeting room of project {project} now? Answer with the room only (e.g. room 101)."
            ),
            answer: Answer::Text(format!("room {now}")),
        });
    }
    for (i, (lead_depth, desk_depth)) in [(0.2, 0.05), (0.4, 0.55)].into_iter().enumerate() {
        let project = projects[2 + i];
        let person = people[i];
        let building = format!(
            "building {}{}",
            char::from(b'A' + code_rng.below(26) as u8),
            1 + code_rng.below(9)
        );
        planted.push(Planted {
            text: format!("For the record: {person} leads project {project}."),
            depth: jitter(lead_depth),
        });
        planted.push(Planted {
            text: format!("For the record: {person}'s desk is in {building}."),
            depth: jitter(desk_depth),
        });
        questions.push(Question {
            kind: "two_hop".into(),
            text: format!(
                "In which building is the desk of the person who leads project {project}? Answer with the building only (e.g. building A1)."
            ),
            answer: Answer::Text(building),
        });
    }

    // Filler up to the target less what the facts take.
    let facts: u64 = planted.iter().map(|p| turn_tokens(counter, &p.text)).sum();
    let mut filler = Vec::new();
    let mut tokens = facts;
    loop {
        let item = &items[rng.index(items.len())];
        let ask = format!("Quick question: {}", item.text);
        let reply = format!(
            "{} {}.",
            REPLIES[rng.index(REPLIES.len())],
            LABEL_NAMES[item.label]
        );
        let pair = turn_tokens(counter, &ask) + turn_tokens(counter, &reply);
        if tokens + pair > target_tokens {
            break;
        }
        tokens += pair;
        filler.push(Turn {
            speaker: Speaker::User,
            text: ask,
        });
        filler.push(Turn {
            speaker: Speaker::Assistant,
            text: reply,
        });
    }
    // Each fact goes before the filler turn at its depth (after a whole exchange).
    let mut at: Vec<(usize, String)> = planted
        .into_iter()
        .map(|p| {
            let pairs = filler.len() / 2;
            (
                (p.depth.clamp(0.0, 1.0) * pairs as f64) as usize * 2,
                p.text,
            )
        })
        .collect();
    at.sort_by_key(|(position, _)| *position);
    let mut turns = Vec::with_capacity(filler.len() + at.len());
    let mut planted_at = Vec::new();
    let mut facts = at.into_iter().peekable();
    for (i, turn) in filler.into_iter().enumerate() {
        while let Some((_, text)) = facts.next_if(|(position, _)| *position <= i) {
            planted_at.push(turns.len());
            turns.push(Turn {
                speaker: Speaker::User,
                text,
            });
        }
        turns.push(turn);
    }
    for (_, text) in facts {
        planted_at.push(turns.len());
        turns.push(Turn {
            speaker: Speaker::User,
            text,
        });
    }
    Task {
        family: Family::Needles,
        seed,
        target_tokens,
        tokens,
        turns,
        questions,
        planted: planted_at,
    }
}
