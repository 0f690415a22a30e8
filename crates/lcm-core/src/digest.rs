//! What a summary keeps of its span, by kind: the structure behind summaries an agent can work
//! from.
//!
//! A [`Digest`] is computed for every summary, whichever summariser writes its text: for a leaf
//! from its messages (`lcm_llm::structured::extract`), for a condensed summary by
//! [`Digest::merge`] of its children's digests. It is stored beside the summary, and it is what
//!
//! - the offline summariser renders (sections instead of scored sentences),
//! - condensed summaries merge, so that depth adds abstraction rather than repetition (the
//!   latest state of each file, errors resolved later dropped, requests kept),
//! - and the assembled context folds into its **open commitments** block ([`open_items`]).
//!
//! Items name the message they come from, so a reader can expand any line back to its source.
//! Commitments and errors are *open items*: carried in every digest that covers them until a
//! later message resolves them, which the later digest records in [`Digest::resolved`].

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::ids::{FileId, MessageId};

/// The structure of one summary's span (see the module documentation).
#[derive(
    Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode,
)]
pub struct Digest {
    /// The user's requests and corrections, in their own words (shortened), oldest first.
    pub requests: Vec<Noted>,
    /// Decisions and conclusions the assistant stated, oldest first.
    pub decisions: Vec<Noted>,
    /// Files read, edited or created, one entry per path in its latest state.
    pub files: Vec<FileTouch>,
    /// Commands run, with their outcome, oldest first.
    pub commands: Vec<CommandRun>,
    /// Other tool calls, counted by tool name.
    pub tools: Vec<ToolTally>,
    /// Errors still unresolved at the end of the span.
    pub errors: Vec<ErrorNote>,
    /// Commitments still open at the end of the span, made in it.
    pub commitments: Vec<Commitment>,
    /// Open items made before the span (commitments, errors) that the span resolved.
    pub resolved: Vec<Resolution>,
}

/// A short text and the message it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct Noted {
    pub message: MessageId,
    pub text: String,
}

/// What was done to a file.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(rename_all = "snake_case")]
pub enum FileAction {
    /// Only read (or viewed).
    Read,
    /// Changed in place.
    Edited,
    /// Written whole (created or overwritten).
    Created,
}

impl FileAction {
    pub fn as_str(self) -> &'static str {
        match self {
            FileAction::Read => "read",
            FileAction::Edited => "edited",
            FileAction::Created => "created",
        }
    }
}

/// A file and what the span did to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct FileTouch {
    pub path: String,
    /// The strongest action on the file in the span (created > edited > read).
    pub action: FileAction,
    /// The file's record, when the store has one for this path in the span.
    pub file: Option<FileId>,
    /// The last message that touched it.
    pub message: MessageId,
}

impl FileTouch {
    /// Takes in a later touch of the same path: the strongest action, the latest known record,
    /// the latest message.
    fn absorb(&mut self, later: &FileTouch) {
        self.action = self.action.max(later.action);
        self.file = later.file.or(self.file);
        self.message = self.message.max(later.message);
    }
}

/// A command and its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct CommandRun {
    /// The message with the call.
    pub message: MessageId,
    /// The command as the summary shows it (shortened).
    pub command: String,
    /// What groups runs of "the same" command (the program and its subcommand): a later
    /// success of the same key resolves an earlier failure.
    pub key: String,
    /// The outcome line: exit status, test counts, the first error line; or `no result` when
    /// the span holds no result for the call.
    pub outcome: String,
    pub ok: bool,
}

/// How many calls of one tool the span made (tools that are neither commands nor file access).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct ToolTally {
    pub name: String,
    pub calls: u32,
}

/// An error not (yet) resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct ErrorNote {
    /// The message with the failing result.
    pub message: MessageId,
    /// Which of the message's results (its part index).
    pub ordinal: u32,
    /// What would resolve it: a later success of a command with this key, or of an edit of
    /// this path (`edit:PATH`).
    pub key: String,
    pub text: String,
}

/// Who a commitment binds.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(rename_all = "snake_case")]
pub enum CommitmentKind {
    /// The agent said it will do something.
    Intent,
    /// The user asked for something.
    Request,
    /// An item of the agent's own to-do list (a `TodoWrite`-style tool) not completed.
    Todo,
}

impl CommitmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CommitmentKind::Intent => "intent",
            CommitmentKind::Request => "request",
            CommitmentKind::Todo => "todo",
        }
    }
}

/// A statement of intent or a request, open until a later message resolves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct Commitment {
    /// The message it was made in.
    pub message: MessageId,
    /// Which of the message's commitments (from 0, in order).
    pub ordinal: u32,
    pub kind: CommitmentKind,
    /// Its words (shortened).
    pub text: String,
}

/// How an open item ended.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(rename_all = "snake_case")]
pub enum ResolutionKind {
    /// Done (a matching action, or a statement that it is done).
    Fulfilled,
    /// Given up or replaced.
    Dropped,
}

impl ResolutionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ResolutionKind::Fulfilled => "fulfilled",
            ResolutionKind::Dropped => "dropped",
        }
    }
}

/// An open item: a commitment or an error, known by where it was made.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    bincode::Encode,
    bincode::Decode,
)]
#[serde(tag = "item", rename_all = "snake_case")]
pub enum ItemRef {
    Commitment { message: MessageId, ordinal: u32 },
    Error { message: MessageId, ordinal: u32 },
}

impl Commitment {
    /// How resolutions name this commitment.
    pub fn item(&self) -> ItemRef {
        ItemRef::Commitment {
            message: self.message,
            ordinal: self.ordinal,
        }
    }
}

impl ErrorNote {
    /// How resolutions name this error.
    pub fn item(&self) -> ItemRef {
        ItemRef::Error {
            message: self.message,
            ordinal: self.ordinal,
        }
    }
}

/// An open item of an earlier span, resolved by a message of this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, bincode::Encode, bincode::Decode)]
pub struct Resolution {
    /// The item resolved.
    pub item: ItemRef,
    /// The message that resolved it.
    pub by: MessageId,
    pub how: ResolutionKind,
}

/// The items still open after a run of spans: what [`open_items`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpenItems {
    pub commitments: Vec<Commitment>,
    pub errors: Vec<ErrorNote>,
}

impl OpenItems {
    /// Removes the items `resolved` names.
    pub fn resolve(&mut self, resolved: &[Resolution]) {
        if resolved.is_empty() {
            return;
        }
        let closed = |item: ItemRef| resolved.iter().any(|r| r.item == item);
        self.commitments.retain(|c| !closed(c.item()));
        self.errors.retain(|e| !closed(e.item()));
    }

    /// Adds the items a later span left open.
    pub fn extend_from(&mut self, digest: &Digest) {
        self.commitments.extend(digest.commitments.iter().cloned());
        self.errors.extend(digest.errors.iter().cloned());
    }

    pub fn is_empty(&self) -> bool {
        self.commitments.is_empty() && self.errors.is_empty()
    }
}

/// Folds the digests of consecutive spans, oldest first, into the items open after the last.
pub fn open_items<'a>(digests: impl IntoIterator<Item = &'a Digest>) -> OpenItems {
    let mut open = OpenItems::default();
    for digest in digests {
        open.resolve(&digest.resolved);
        open.extend_from(digest);
    }
    open
}

impl Digest {
    /// The digest of consecutive spans (`children`, oldest first) taken as one: what a
    /// condensed summary over them keeps.
    ///
    /// Requests and decisions are kept in order (an identical text once); files merge by path
    /// into their strongest action and latest record; commands are kept in order; tool tallies
    /// add up; errors and commitments are those still open at the end (an item a later child
    /// resolved is dropped); `resolved` keeps only resolutions of items made before the first
    /// child.
    pub fn merge<'a>(children: impl IntoIterator<Item = &'a Digest>) -> Digest {
        let mut merged = Digest::default();
        let mut open = OpenItems::default();
        let mut resolved: Vec<Resolution> = Vec::new();
        // Texts already kept, and where each path is in `merged.files`: merging stays linear in
        // the children's sizes (a deep summary merges children that are themselves full).
        let mut requests_seen: HashSet<&'a str> = HashSet::new();
        let mut decisions_seen: HashSet<&'a str> = HashSet::new();
        let mut file_at: HashMap<&'a str, usize> = HashMap::new();
        for child in children {
            for r in &child.resolved {
                let inside = open.commitments.iter().any(|c| c.item() == r.item)
                    || open.errors.iter().any(|e| e.item() == r.item);
                if !inside && !resolved.iter().any(|known| known.item == r.item) {
                    resolved.push(r.clone());
                }
            }
            open.resolve(&child.resolved);
            open.extend_from(child);
            push_unique(&mut merged.requests, &mut requests_seen, &child.requests);
            push_unique(&mut merged.decisions, &mut decisions_seen, &child.decisions);
            for touch in &child.files {
                match file_at.get(touch.path.as_str()) {
                    Some(&at) => merged.files[at].absorb(touch),
                    None => {
                        file_at.insert(touch.path.as_str(), merged.files.len());
                        merged.files.push(touch.clone());
                    }
                }
            }
            merged.commands.extend(child.commands.iter().cloned());
            for tally in &child.tools {
                merged.count_tool(&tally.name, tally.calls);
            }
        }
        merged.errors = open.errors;
        merged.commitments = open.commitments;
        merged.resolved = resolved;
        // Deep summaries cover whole sessions, which grow without end: every list of their
        // digests is bounded, or each compaction would read, merge and write a digest as long
        // as the history (rendering keeps a few lines of each section anyway). Requests keep
        // the session's first ones (they usually state the task) and the newest.
        keep_first_and_newest(&mut merged.requests, MERGED_FIRST_REQUESTS, MERGED_REQUESTS);
        keep_newest(&mut merged.decisions, MERGED_DECISIONS);
        keep_latest_files(&mut merged.files, MERGED_FILES);
        keep_newest(&mut merged.commands, MERGED_COMMANDS);
        keep_newest(&mut merged.errors, MERGED_OPEN_ITEMS);
        keep_newest(&mut merged.commitments, MERGED_OPEN_ITEMS);
        merged
    }

    /// Records an action on a file: one entry per path, keeping the strongest action, the
    /// latest known record and the latest message.
    pub fn touch(&mut self, touch: FileTouch) {
        match self.files.iter_mut().find(|f| f.path == touch.path) {
            Some(known) => known.absorb(&touch),
            None => self.files.push(touch),
        }
    }

    /// Counts `calls` more calls of the tool `name`.
    pub fn count_tool(&mut self, name: &str, calls: u32) {
        match self.tools.iter_mut().find(|t| t.name == name) {
            Some(tally) => tally.calls += calls,
            None => self.tools.push(ToolTally {
                name: name.to_owned(),
                calls,
            }),
        }
    }

    /// Whether the span was agent work (commands, files or tools), rather than conversation.
    pub fn is_agent_work(&self) -> bool {
        !(self.commands.is_empty() && self.files.is_empty() && self.tools.is_empty())
    }
}

/// Most commands a merged digest keeps (the newest).
pub const MERGED_COMMANDS: usize = 200;
/// Most decisions a merged digest keeps (the newest).
pub const MERGED_DECISIONS: usize = 100;
/// Most requests a merged digest keeps: the first [`MERGED_FIRST_REQUESTS`] and the newest.
pub const MERGED_REQUESTS: usize = 100;
/// The oldest requests a merged digest always keeps (a session's first requests usually state
/// its task).
pub const MERGED_FIRST_REQUESTS: usize = 10;
/// Most files a merged digest keeps (those touched last).
pub const MERGED_FILES: usize = 500;
/// Most open commitments, and most unresolved errors, a merged digest keeps (the newest; the
/// assembled context's block shows far fewer).
pub const MERGED_OPEN_ITEMS: usize = 200;

fn keep_newest<T>(items: &mut Vec<T>, most: usize) {
    keep_first_and_newest(items, 0, most);
}

/// Keeps the first `first` and the newest `most - first` of `items`.
fn keep_first_and_newest<T>(items: &mut Vec<T>, first: usize, most: usize) {
    if items.len() > most {
        let first = first.min(most);
        items.drain(first..items.len() - (most - first));
    }
}

/// Keeps the `most` files touched last, in their order.
fn keep_latest_files(files: &mut Vec<FileTouch>, most: usize) {
    if files.len() <= most {
        return;
    }
    let mut order: Vec<usize> = (0..files.len()).collect();
    // Touched last first; among files of the same message, the later entry first.
    order.sort_unstable_by_key(|&i| std::cmp::Reverse((files[i].message, i)));
    let mut keep = vec![false; files.len()];
    for &i in &order[..most] {
        keep[i] = true;
    }
    let mut at = 0;
    files.retain(|_| {
        at += 1;
        keep[at - 1]
    });
}

/// Appends the items of `more` whose text is not in `seen`, which it records.
fn push_unique<'a>(into: &mut Vec<Noted>, seen: &mut HashSet<&'a str>, more: &'a [Noted]) {
    for item in more {
        if seen.insert(item.text.as_str()) {
            into.push(item.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commitment(message: u64, text: &str) -> Commitment {
        Commitment {
            message: MessageId(message),
            ordinal: 0,
            kind: CommitmentKind::Intent,
            text: text.to_owned(),
        }
    }

    fn error(message: u64, key: &str) -> ErrorNote {
        ErrorNote {
            message: MessageId(message),
            ordinal: 0,
            key: key.to_owned(),
            text: format!("{key} failed"),
        }
    }

    fn resolution(source: u64, by: u64) -> Resolution {
        Resolution {
            item: ItemRef::Commitment {
                message: MessageId(source),
                ordinal: 0,
            },
            by: MessageId(by),
            how: ResolutionKind::Fulfilled,
        }
    }

    fn touch(path: &str, action: FileAction, file: Option<u64>, message: u64) -> FileTouch {
        FileTouch {
            path: path.to_owned(),
            action,
            file: file.map(FileId),
            message: MessageId(message),
        }
    }

    #[test]
    fn merge_drops_items_a_later_child_resolved_and_keeps_older_resolutions() {
        let first = Digest {
            commitments: vec![commitment(2, "run the tests"), commitment(3, "update docs")],
            errors: vec![error(4, "cargo test")],
            ..Digest::default()
        };
        let second = Digest {
            // 2 and 4 are the first child's; 1 is older than both children.
            resolved: vec![
                resolution(2, 10),
                Resolution {
                    item: error(4, "cargo test").item(),
                    by: MessageId(11),
                    how: ResolutionKind::Fulfilled,
                },
                resolution(1, 12),
            ],
            commitments: vec![commitment(13, "commit")],
            ..Digest::default()
        };
        let merged = Digest::merge([&first, &second]);
        let open: Vec<u64> = merged.commitments.iter().map(|c| c.message.0).collect();
        assert_eq!(open, [3, 13]);
        assert!(merged.errors.is_empty());
        assert_eq!(merged.resolved, [resolution(1, 12)]);
    }

    #[test]
    fn merge_keeps_the_latest_state_of_each_file_and_unique_requests() {
        let first = Digest {
            files: vec![touch("src/a.rs", FileAction::Read, Some(1), 1)],
            requests: vec![Noted {
                message: MessageId(1),
                text: "fix it".into(),
            }],
            tools: vec![ToolTally {
                name: "Grep".into(),
                calls: 2,
            }],
            ..Digest::default()
        };
        let second = Digest {
            files: vec![
                touch("src/a.rs", FileAction::Edited, None, 5),
                touch("src/b.rs", FileAction::Created, Some(2), 6),
            ],
            requests: vec![
                Noted {
                    message: MessageId(4),
                    text: "fix it".into(),
                },
                Noted {
                    message: MessageId(7),
                    text: "and test it".into(),
                },
            ],
            tools: vec![ToolTally {
                name: "Grep".into(),
                calls: 1,
            }],
            ..Digest::default()
        };
        let merged = Digest::merge([&first, &second]);
        assert_eq!(
            merged.files,
            [
                touch("src/a.rs", FileAction::Edited, Some(1), 5),
                touch("src/b.rs", FileAction::Created, Some(2), 6)
            ]
        );
        let texts: Vec<&str> = merged.requests.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(texts, ["fix it", "and test it"]);
        assert_eq!(merged.tools[0].calls, 3);
        assert!(merged.is_agent_work());
    }

    #[test]
    fn merged_digests_keep_the_newest_commands() {
        let child = |from: u64| Digest {
            commands: (from..from + 100)
                .map(|i| CommandRun {
                    message: MessageId(i),
                    command: format!("cargo test {i}"),
                    key: "cargo test".into(),
                    outcome: "ok".into(),
                    ok: true,
                })
                .collect(),
            ..Digest::default()
        };
        let merged = Digest::merge([&child(0), &child(100), &child(200)]);
        assert_eq!(merged.commands.len(), MERGED_COMMANDS);
        assert_eq!(merged.commands[0].message, MessageId(100));
        assert_eq!(merged.commands[199].message, MessageId(299));
    }

    /// A leaf's digest of messages `from..from + 10`: five requests, three open commitments,
    /// two errors and three files (one of them new).
    fn leaf(from: u64) -> Digest {
        Digest {
            requests: (from..from + 5)
                .map(|i| Noted {
                    message: MessageId(i),
                    text: format!("request {i}"),
                })
                .collect(),
            commitments: (from..from + 3)
                .map(|i| commitment(i, &format!("promise {i}")))
                .collect(),
            errors: (from..from + 2)
                .map(|i| error(i, &format!("cargo test {i}")))
                .collect(),
            files: vec![
                touch("src/lib.rs", FileAction::Edited, None, from),
                touch("src/main.rs", FileAction::Read, None, from + 1),
                touch(
                    &format!("src/m{from}.rs"),
                    FileAction::Created,
                    None,
                    from + 2,
                ),
            ],
            ..Digest::default()
        }
    }

    #[test]
    fn merged_digests_stay_bounded_however_long_the_history() {
        // 2,000 leaves (20,000 messages) condensed four at a time, level after level, as
        // compaction does: the top digest covers the whole history.
        let mut level: Vec<Digest> = (0..2_000).map(|k| leaf(k * 10)).collect();
        while level.len() > 1 {
            level = level.chunks(4).map(|c| Digest::merge(c.iter())).collect();
        }
        let top = &level[0];
        assert_eq!(top.requests.len(), MERGED_REQUESTS);
        let first: Vec<u64> = top.requests[..MERGED_FIRST_REQUESTS]
            .iter()
            .map(|r| r.message.0)
            .collect();
        assert_eq!(
            first,
            [0, 1, 2, 3, 4, 10, 11, 12, 13, 14],
            "the session's first"
        );
        assert_eq!(top.requests.last().map(|r| r.message.0), Some(19_994));
        assert_eq!(top.commitments.len(), MERGED_OPEN_ITEMS);
        assert_eq!(top.commitments.last().map(|c| c.message.0), Some(19_992));
        assert_eq!(top.errors.len(), MERGED_OPEN_ITEMS);
        assert_eq!(top.files.len(), MERGED_FILES);
        // The files touched last, the two touched in every leaf among them, in their order.
        assert_eq!(top.files[0].path, "src/lib.rs");
        assert_eq!(top.files[0].message, MessageId(19_990));
        assert_eq!(top.files[1].path, "src/main.rs");
        assert_eq!(
            top.files.last().map(|f| f.path.as_str()),
            Some("src/m19990.rs")
        );
        // Smaller than the history by far: merging it again costs the same as the last time.
        let again = Digest::merge([top, &leaf(20_000)]);
        assert_eq!(again.requests.len(), MERGED_REQUESTS);
        assert_eq!(again.requests[0].message, MessageId(0));
        assert_eq!(again.requests.last().map(|r| r.message.0), Some(20_004));
    }

    #[test]
    fn merged_requests_are_kept_once_by_text() {
        let noted = |message: u64, text: &str| Noted {
            message: MessageId(message),
            text: text.to_owned(),
        };
        let a = Digest {
            requests: vec![noted(1, "fix it"), noted(2, "test it")],
            decisions: vec![noted(2, "use redb")],
            ..Digest::default()
        };
        let b = Digest {
            requests: vec![noted(5, "fix it"), noted(6, "ship it")],
            decisions: vec![noted(7, "use redb"), noted(8, "keep bincode")],
            ..Digest::default()
        };
        let merged = Digest::merge([&a, &b]);
        let texts: Vec<(u64, &str)> = merged
            .requests
            .iter()
            .map(|r| (r.message.0, r.text.as_str()))
            .collect();
        assert_eq!(texts, [(1, "fix it"), (2, "test it"), (6, "ship it")]);
        assert_eq!(merged.decisions.len(), 2);
    }

    #[test]
    fn open_items_fold_in_order() {
        let a = Digest {
            commitments: vec![commitment(1, "a")],
            ..Digest::default()
        };
        let b = Digest {
            resolved: vec![resolution(1, 5)],
            commitments: vec![commitment(6, "b")],
            ..Digest::default()
        };
        let open = open_items([&a, &b]);
        assert_eq!(open.commitments, [commitment(6, "b")]);
        // Order matters: a resolution seen before its item does not close it.
        let open = open_items([&b, &a]);
        assert_eq!(open.commitments.len(), 2);
    }
}
