//! From a [`Digest`] to a summary's text, within a token target.
//!
//! Sections, in this order: requests, unresolved errors, files, commands, decisions, other
//! tools. When everything does not fit, items are kept by tier (requests and errors first,
//! then edited files and failed commands, then read files and other commands, then decisions,
//! then the tool tally; in a condensed summary every file comes before the commands), and a
//! section that lost items says how many (`… 4 more`). Condensed
//! summaries (depth 1 and more) show commands grouped by what they run, with their count and
//! their last outcome, so depth adds abstraction rather than repetition.

use lcm_core::digest::{CommandRun, Commitment, Digest, FileAction, FileTouch};
use lcm_core::tokens::TokenCounter;

use super::text::shorten_chars;

/// One line of a section and its tier (lower is kept first).
#[derive(Debug)]
struct Item {
    section: usize,
    tier: u8,
    text: String,
    tokens: usize,
}

const REQUESTS: usize = 0;
const ERRORS: usize = 1;
const FILES_EDITED: usize = 2;
const FILES_CREATED: usize = 3;
const FILES_READ: usize = 4;
const COMMANDS: usize = 5;
const DECISIONS: usize = 6;
const TOOLS: usize = 7;
const SECTIONS: usize = 8;

/// Section headers; the files sections name the common directory.
fn header(section: usize, root: &str) -> String {
    let under = if root.is_empty() {
        String::new()
    } else {
        format!(" (under {root})")
    };
    match section {
        REQUESTS => "Requests:".to_owned(),
        ERRORS => "Unresolved errors:".to_owned(),
        FILES_EDITED => format!("Files edited{under}:"),
        FILES_CREATED => format!("Files written{under}:"),
        FILES_READ => format!("Files read{under}:"),
        COMMANDS => "Commands:".to_owned(),
        DECISIONS => "Decisions and findings:".to_owned(),
        _ => "Other tools:".to_owned(),
    }
}

/// Renders `digest` as a summary of at most `target_tokens` tokens (a digest with nothing in
/// it renders as the empty string).
pub fn render(digest: &Digest, depth: u32, target_tokens: u32, counter: &TokenCounter) -> String {
    let root = common_root(&digest.files);
    let mut items = Vec::new();
    let mut push = |section: usize, tier: u8, text: String| {
        let tokens = counter.count_text(&text) + 1;
        items.push(Item {
            section,
            tier,
            text,
            tokens,
        });
    };
    for r in &digest.requests {
        push(REQUESTS, 0, format!("- {}: \"{}\"", r.message, r.text));
    }
    for e in &digest.errors {
        push(ERRORS, 0, format!("- {}: {}", e.message, e.text));
    }
    // A leaf keeps every command's outcome beside the files it read; a condensed summary keeps
    // every file first (its commands are grouped, and a failure that mattered is in errors).
    for f in &digest.files {
        let (section, tier) = match f.action {
            FileAction::Edited => (FILES_EDITED, 1),
            FileAction::Created => (FILES_CREATED, 1),
            FileAction::Read => (FILES_READ, if depth == 0 { 2 } else { 1 }),
        };
        push(section, tier, file_entry(f, &root, depth));
    }
    if depth == 0 {
        for c in &digest.commands {
            push(COMMANDS, if c.ok { 2 } else { 1 }, command_line(c));
        }
    } else {
        for (line, ok) in grouped_commands(&digest.commands) {
            push(COMMANDS, if ok { 3 } else { 2 }, line);
        }
    }
    // Newest decisions matter most: kept from the end.
    let decisions = digest.decisions.len();
    for (i, d) in digest.decisions.iter().enumerate() {
        let tier = if decisions - i <= 3 { 3 } else { 4 };
        push(DECISIONS, tier, format!("- {}: {}", d.message, d.text));
    }
    if !digest.tools.is_empty() {
        let tally: Vec<String> = digest
            .tools
            .iter()
            .map(|t| format!("{} ×{}", t.name, t.calls))
            .collect();
        push(TOOLS, 5, tally.join(", "));
    }
    fit(&items, &root, target_tokens as usize, counter)
}

/// Chooses the items by tier until the target, then verifies the rendering (token counts do
/// not add up exactly across joins) and drops the last chosen until it fits.
fn fit(items: &[Item], root: &str, target: usize, counter: &TokenCounter) -> String {
    let mut order: Vec<usize> = (0..items.len()).collect();
    // By tier; within a tier, in order (decisions kept from the newest).
    order.sort_by_key(|&i| {
        let position = if items[i].section == DECISIONS {
            items.len() - i
        } else {
            i
        };
        (items[i].tier, position)
    });
    let mut chosen = vec![false; items.len()];
    let mut headers = [false; SECTIONS];
    let mut used = 0usize;
    let header_tokens = |section: usize| counter.count_text(&header(section, root)) + 2;
    for &i in &order {
        let section = items[i].section;
        let mut cost = items[i].tokens;
        if !headers[section] {
            cost += header_tokens(section);
        }
        if used + cost <= target {
            chosen[i] = true;
            headers[section] = true;
            used += cost;
        }
    }
    let mut dropping = order.iter().rev().copied();
    loop {
        let text = assemble(items, &chosen, root);
        if counter.count_text(&text) <= target || !chosen.iter().any(|c| *c) {
            return text;
        }
        match dropping.find(|&i| chosen[i]) {
            Some(i) => chosen[i] = false,
            None => return String::new(),
        }
    }
}

fn assemble(items: &[Item], chosen: &[bool], root: &str) -> String {
    let mut out = String::new();
    for section in 0..SECTIONS {
        let in_section = || {
            items
                .iter()
                .zip(chosen)
                .filter(move |(i, _)| i.section == section)
        };
        let total = in_section().count();
        let kept: Vec<&str> = in_section()
            .filter(|(_, c)| **c)
            .map(|(i, _)| i.text.as_str())
            .collect();
        if kept.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&header(section, root));
        let inline = matches!(section, FILES_EDITED | FILES_CREATED | FILES_READ | TOOLS);
        if inline {
            out.push(' ');
            out.push_str(&kept.join(", "));
        } else {
            for text in &kept {
                out.push('\n');
                out.push_str(text);
            }
        }
        if kept.len() < total {
            out.push_str(&format!(
                "{}… {} more",
                if inline { ", " } else { "\n" },
                total - kept.len()
            ));
        }
    }
    out
}

/// A file as its section lists it: its path under the common root, and in a leaf its record
/// (a condensed summary's header lists every record under it already).
fn file_entry(f: &FileTouch, root: &str, depth: u32) -> String {
    let path = f.path.strip_prefix(root).unwrap_or(&f.path);
    match f.file {
        Some(id) if depth == 0 => format!("{path} ({id})"),
        _ => path.to_owned(),
    }
}

/// The directory all absolute paths share (with its trailing `/`), when there are at least
/// two and it is deeper than one level; else the empty string.
fn common_root(files: &[FileTouch]) -> String {
    let absolute: Vec<&str> = files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| p.starts_with('/'))
        .collect();
    if absolute.len() < 2 || absolute.len() < files.len() {
        return String::new();
    }
    let mut prefix: &str = absolute[0];
    for path in &absolute[1..] {
        let shared = prefix
            .char_indices()
            .zip(path.chars())
            .take_while(|((_, a), b)| a == b)
            .last()
            .map_or(0, |((i, c), _)| i + c.len_utf8());
        prefix = &prefix[..shared];
    }
    // Back to a whole directory.
    let root = match prefix.rfind('/') {
        Some(cut) => &prefix[..=cut],
        None => "",
    };
    if root.matches('/').count() >= 3 {
        root.to_owned()
    } else {
        String::new()
    }
}

fn command_line(c: &CommandRun) -> String {
    format!("- `{}` → {}", c.command, c.outcome)
}

/// Commands grouped by key, in order of first run: `` `cargo test` ×5, last: exit 1: ... ``;
/// a group's last failure is shown too when its last run succeeded. The flag says whether the
/// group's last run succeeded.
fn grouped_commands(commands: &[CommandRun]) -> Vec<(String, bool)> {
    let mut groups: Vec<(&str, Vec<&CommandRun>)> = Vec::new();
    for c in commands {
        match groups.iter_mut().find(|(key, _)| *key == c.key) {
            Some((_, runs)) => runs.push(c),
            None => groups.push((&c.key, vec![c])),
        }
    }
    groups
        .into_iter()
        .map(|(_, runs)| {
            let last = runs[runs.len() - 1];
            if runs.len() == 1 {
                return (command_line(last), last.ok);
            }
            let failures = runs.iter().filter(|r| !r.ok).count();
            let mut line = format!(
                "- `{}` ×{} (last: `{}` → {}",
                last.key,
                runs.len(),
                shorten_chars(&last.command, 60),
                last.outcome
            );
            if failures > 0 && last.ok {
                line.push_str(&format!("; {failures} failed before"));
            }
            line.push(')');
            (line, last.ok)
        })
        .collect()
}

/// The open-commitments section a summary carries (empty for none): one line each, with the
/// message it was made in.
pub fn commitments_section(commitments: &[Commitment]) -> String {
    if commitments.is_empty() {
        return String::new();
    }
    let mut out = "Open commitments:".to_owned();
    for c in commitments {
        out.push_str(&format!(
            "\n- {} ({}): {}",
            c.message,
            c.kind.as_str(),
            c.text
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use lcm_core::digest::{ErrorNote, Noted, ToolTally};
    use lcm_core::ids::{FileId, MessageId};
    use lcm_core::tokens::Encoding;

    use super::*;

    fn digest() -> Digest {
        let file = |path: &str, action, id: Option<u64>| FileTouch {
            path: path.into(),
            action,
            file: id.map(FileId),
            message: MessageId(3),
        };
        let command = |command: &str, key: &str, outcome: &str, ok| CommandRun {
            message: MessageId(4),
            command: command.into(),
            key: key.into(),
            outcome: outcome.into(),
            ok,
        };
        Digest {
            requests: vec![Noted {
                message: MessageId(1),
                text: "fix the flaky proxy test".into(),
            }],
            decisions: (0..6)
                .map(|i| Noted {
                    message: MessageId(10 + i),
                    text: format!("decision number {i} with some words to make it longer"),
                })
                .collect(),
            files: vec![
                file("/home/u/proj/src/a.rs", FileAction::Edited, Some(7)),
                file("/home/u/proj/src/b.rs", FileAction::Read, None),
                file("/home/u/proj/tests/c.rs", FileAction::Created, None),
            ],
            commands: vec![
                command(
                    "cargo test -p x",
                    "cargo test",
                    "exit 101: error[E0308]",
                    false,
                ),
                command("cargo test -p x", "cargo test", "ok: 3 passed", true),
                command("git status", "git status", "ok", true),
            ],
            tools: vec![ToolTally {
                name: "Grep".into(),
                calls: 2,
            }],
            errors: vec![ErrorNote {
                message: MessageId(5),
                ordinal: 0,
                key: "git push".into(),
                text: "`git push` → exit 128: fatal: no upstream".into(),
            }],
            ..Digest::default()
        }
    }

    #[test]
    fn a_leaf_lists_every_section_when_it_fits() {
        let counter = TokenCounter::new(Encoding::Cl100kBase);
        let text = render(&digest(), 0, 2_000, &counter);
        assert!(
            text.starts_with("Requests:\n- msg_1: \"fix the flaky proxy test\""),
            "{text}"
        );
        assert!(
            text.contains("Unresolved errors:\n- msg_5: `git push` → exit 128"),
            "{text}"
        );
        assert!(
            text.contains("Files edited (under /home/u/proj/): src/a.rs (file_7)"),
            "{text}"
        );
        assert!(
            text.contains("Files written (under /home/u/proj/): tests/c.rs"),
            "{text}"
        );
        assert!(
            text.contains("Files read (under /home/u/proj/): src/b.rs"),
            "{text}"
        );
        assert!(
            text.contains("- `cargo test -p x` → exit 101: error[E0308]"),
            "{text}"
        );
        assert!(text.contains("decision number 5"), "{text}");
        assert!(text.ends_with("Other tools: Grep ×2"), "{text}");
    }

    #[test]
    fn a_small_target_keeps_the_first_tiers_and_counts_the_rest() {
        let counter = TokenCounter::new(Encoding::Cl100kBase);
        let full = counter.count_text(&render(&digest(), 0, 2_000, &counter));
        for target in [10u32, 40, 60, 90, full as u32 - 20] {
            let text = render(&digest(), 0, target, &counter);
            assert!(
                counter.count_text(&text) <= target as usize,
                "{target}: {text}"
            );
        }
        let text = render(&digest(), 0, 90, &counter);
        assert!(text.contains("fix the flaky proxy test"), "{text}");
        assert!(text.contains("no upstream"), "{text}");
        assert!(!text.contains("decision number 0"), "{text}");
    }

    #[test]
    fn condensed_groups_commands() {
        let counter = TokenCounter::new(Encoding::Cl100kBase);
        let text = render(&digest(), 1, 2_000, &counter);
        assert!(
            text.contains(
                "- `cargo test` ×2 (last: `cargo test -p x` → ok: 3 passed; 1 failed before)"
            ),
            "{text}"
        );
    }

    #[test]
    fn commitments_render_with_their_source() {
        assert_eq!(commitments_section(&[]), "");
        let c = Commitment {
            message: MessageId(9),
            ordinal: 0,
            kind: lcm_core::digest::CommitmentKind::Intent,
            text: "run the tests".into(),
        };
        assert_eq!(
            commitments_section(&[c]),
            "Open commitments:\n- msg_9 (intent): run the tests"
        );
    }
}
