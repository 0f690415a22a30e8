//! From messages to a [`Digest`]: what each message is, not how its sentences score.

use std::collections::HashMap;
use std::sync::LazyLock;

use lcm_core::digest::{
    CommandRun, Commitment, CommitmentKind, Digest, ErrorNote, FileAction, FileTouch, Noted,
    OpenItems, Resolution, ResolutionKind,
};
use lcm_core::ids::{FileId, MessageId};
use lcm_core::message::{Message, Part, Role};
use regex::Regex;
use serde_json::Value;

use super::commands::{command_key, command_label, outcome_line, shell_command};
use super::commitments::{KeyTerms, Statement, intents, is_immediate, user_drops};
use super::text::{compile, sentences, shorten_words};

/// Most words of a request as summaries keep it.
const REQUEST_WORDS: usize = 40;
/// Most words of a decision.
const DECISION_WORDS: usize = 32;
/// Most decisions kept from one message.
const DECISIONS_PER_MESSAGE: usize = 2;

/// Sentences that state a decision or a conclusion.
static DECISION: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)\b(?:decided|decide to|chose|choosing|going with|switch(?:ed)? to|instead of|settled on|opted|the (?:root )?cause|the (?:issue|problem|bug|culprit|fix) (?:is|was)|turns out|this means|that means|works now|now works|all tests pass|tests? (?:now )?pass|root cause|the reason|conclusion|in summary|summary:)\b",
    )
});

/// User texts that are the harness talking, not the user: slash-command echoes, notices,
/// injected skill bodies, a previous compaction's summary.
const HARNESS_PREFIXES: [&str; 11] = [
    "<command-name>",
    "<command-message>",
    "<local-command-",
    "<task-notification>",
    "<system-reminder>",
    "<user-prompt-submit-hook>",
    "Caveat: The messages below",
    "[Request interrupted",
    "This session is being continued from a previous conversation",
    "Base directory for this skill:",
    "<bash-stdout>",
];

/// Whether a user text is a person's words (a request or a correction), not the harness's.
pub fn is_user_words(text: &str) -> bool {
    let text = text.trim_start();
    !text.is_empty() && !HARNESS_PREFIXES.iter().any(|p| text.starts_with(p))
}

/// Tool names that read a file, edit one in place, or write one whole.
const READS: [&str; 7] = [
    "read",
    "read_file",
    "view",
    "view_file",
    "open_file",
    "readfile",
    "fs_read",
];
const EDITS: [&str; 6] = [
    "edit",
    "multiedit",
    "str_replace",
    "apply_patch",
    "notebookedit",
    "replace",
];
const WRITES: [&str; 4] = ["write", "write_file", "create_file", "writefile"];
const EDITORS: [&str; 3] = [
    "str_replace_editor",
    "str_replace_based_edit_tool",
    "text_editor",
];
/// Tools that keep the agent's own to-do list.
const TODO_TOOLS: [&str; 2] = ["todowrite", "todo_write"];

fn is(names: &[&str], name: &str) -> bool {
    names.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// The path argument of a file tool.
fn path_arg(args: &Value) -> Option<String> {
    ["file_path", "path", "notebook_path", "filename", "file"]
        .iter()
        .find_map(|k| args.get(*k).and_then(Value::as_str))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
}

/// What a tool call was, for when its result arrives.
#[derive(Debug)]
enum Call {
    /// Index into the digest's commands.
    Command(usize),
    /// An edit or write of this path.
    Write(String),
    Other,
}

/// An open commitment and what would resolve it.
#[derive(Debug)]
struct Open {
    commitment: Commitment,
    terms: KeyTerms,
    /// Said of the next step ("let me check the config", "now add the route"): the agent's
    /// next action is it, whatever that action names.
    immediate: bool,
    /// Made before the span (its resolution goes to `Digest::resolved`).
    carried: bool,
}

/// An open error.
#[derive(Debug)]
struct OpenError {
    error: ErrorNote,
    carried: bool,
}

/// Builds a digest one message at a time (see [`extract`]).
pub struct Tracker<'a> {
    digest: Digest,
    calls: HashMap<String, Call>,
    open: Vec<Open>,
    errors: Vec<OpenError>,
    last_assistant: Option<MessageId>,
    file_for_path: &'a dyn Fn(&str) -> Option<FileId>,
    /// Every commitment made in the span, with how it ended (if it did).
    made: Vec<(Commitment, Option<(MessageId, ResolutionKind)>)>,
}

/// The digest of `messages` (a span, oldest first). `carried` are the items left open by the
/// spans before it: those the span resolves are listed in [`Digest::resolved`].
/// `file_for_path` gives the file record the store holds for a path in this span, if any.
pub fn extract(
    messages: &[Message],
    carried: &OpenItems,
    file_for_path: &dyn Fn(&str) -> Option<FileId>,
) -> Digest {
    let mut tracker = Tracker::new(carried, file_for_path);
    for m in messages {
        tracker.message(m);
    }
    tracker.finish()
}

/// Which of `open` the messages resolve, in order: what the raw tail of a context has done of
/// the commitments its summaries left open.
pub fn resolutions<'m>(
    messages: impl IntoIterator<Item = &'m Message>,
    open: &OpenItems,
) -> Vec<Resolution> {
    let none = |_: &str| None;
    let mut tracker = Tracker::new(open, &none);
    for m in messages {
        // Once nothing carried is open, no later message can resolve more of it (a long raw
        // tail is not read to its end for nothing).
        if !tracker.carried_open() {
            break;
        }
        tracker.message(m);
    }
    tracker.finish().resolved
}

impl<'a> Tracker<'a> {
    /// A tracker starting with `carried` open.
    pub fn new(carried: &OpenItems, file_for_path: &'a dyn Fn(&str) -> Option<FileId>) -> Self {
        Tracker {
            digest: Digest::default(),
            calls: HashMap::new(),
            open: carried
                .commitments
                .iter()
                .map(|c| Open {
                    terms: KeyTerms::of(&c.text),
                    immediate: c.kind == CommitmentKind::Intent && is_immediate(&c.text),
                    commitment: c.clone(),
                    carried: true,
                })
                .collect(),
            errors: carried
                .errors
                .iter()
                .map(|e| OpenError {
                    error: e.clone(),
                    carried: true,
                })
                .collect(),
            last_assistant: None,
            file_for_path,
            made: Vec::new(),
        }
    }

    /// Whether any item carried in at the start is still open. Carried items come first in
    /// both lists (later ones are pushed behind them, removals keep the order).
    fn carried_open(&self) -> bool {
        self.open.first().is_some_and(|o| o.carried)
            || self.errors.first().is_some_and(|e| e.carried)
    }

    /// Takes in the next message.
    pub fn message(&mut self, m: &Message) {
        let mut ordinal = 0u32;
        for (index, part) in m.parts.iter().enumerate() {
            match (m.role, part) {
                (Role::User, Part::Text { text }) if is_user_words(text) => {
                    self.user_text(m.id, text, &mut ordinal)
                }
                (Role::Assistant, Part::Text { text }) => {
                    self.assistant_text(m.id, text, &mut ordinal)
                }
                (
                    _,
                    Part::ToolCall {
                        id,
                        name,
                        arguments,
                    },
                ) => self.tool_call(m.id, id, name, arguments, &mut ordinal),
                (
                    _,
                    Part::ToolResult {
                        call_id,
                        content,
                        is_error,
                    },
                ) => self.tool_result(m.id, index as u32, call_id, content, *is_error),
                _ => {}
            }
        }
        if m.role == Role::Assistant {
            self.last_assistant = Some(m.id);
        }
    }

    fn resolve_commitment(&mut self, at: usize, by: MessageId, how: ResolutionKind) {
        let open = self.open.remove(at);
        if let Some(made) = self
            .made
            .iter_mut()
            .find(|(c, _)| c.item() == open.commitment.item())
        {
            made.1 = Some((by, how));
        }
        if open.carried {
            self.digest.resolved.push(Resolution {
                item: open.commitment.item(),
                by,
                how,
            });
        }
    }

    fn add_commitment(
        &mut self,
        message: MessageId,
        ordinal: &mut u32,
        kind: CommitmentKind,
        text: String,
    ) {
        let commitment = Commitment {
            message,
            ordinal: *ordinal,
            kind,
            text,
        };
        *ordinal += 1;
        self.made.push((commitment.clone(), None));
        self.open.push(Open {
            terms: KeyTerms::of(&commitment.text),
            immediate: kind == CommitmentKind::Intent && is_immediate(&commitment.text),
            commitment,
            carried: false,
        });
    }

    fn user_text(&mut self, id: MessageId, text: &str, ordinal: &mut u32) {
        // The user speaks again: the turn that answered the open requests has ended.
        let dropped = user_drops(text);
        let mut i = 0;
        while i < self.open.len() {
            let open = &self.open[i];
            if open.commitment.kind == CommitmentKind::Request {
                if dropped {
                    self.resolve_commitment(i, id, ResolutionKind::Dropped);
                    continue;
                }
                if let Some(answer) = self.last_assistant.filter(|a| *a > open.commitment.message) {
                    self.resolve_commitment(i, answer, ResolutionKind::Fulfilled);
                    continue;
                }
            }
            i += 1;
        }
        let request = shorten_words(text.trim(), REQUEST_WORDS);
        self.digest.requests.push(Noted {
            message: id,
            text: request.clone(),
        });
        if !dropped {
            self.add_commitment(id, ordinal, CommitmentKind::Request, request);
        }
    }

    fn assistant_text(&mut self, id: MessageId, text: &str, ordinal: &mut u32) {
        // Statements about earlier intents (not those of this message), the text read once.
        let statement = Statement::new(text);
        let mut i = 0;
        while i < self.open.len() {
            let open = &self.open[i];
            if open.commitment.message != id && open.commitment.kind != CommitmentKind::Request {
                if statement.states_dropped(&open.terms) {
                    self.resolve_commitment(i, id, ResolutionKind::Dropped);
                    continue;
                }
                if statement.states_done(&open.terms) {
                    self.resolve_commitment(i, id, ResolutionKind::Fulfilled);
                    continue;
                }
            }
            i += 1;
        }
        let mut kept = 0;
        for line in text.lines() {
            for sentence in sentences(line) {
                if kept < DECISIONS_PER_MESSAGE && DECISION.is_match(sentence) {
                    let decision = shorten_words(sentence, DECISION_WORDS);
                    if !self.digest.decisions.iter().any(|d| d.text == decision) {
                        self.digest.decisions.push(Noted {
                            message: id,
                            text: decision,
                        });
                        kept += 1;
                    }
                }
            }
        }
        for intent in intents(text) {
            self.add_commitment(id, ordinal, CommitmentKind::Intent, intent);
        }
    }

    fn tool_call(
        &mut self,
        id: MessageId,
        call_id: &str,
        name: &str,
        arguments: &str,
        ordinal: &mut u32,
    ) {
        let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
        self.fulfil_by_action(id, name, arguments);
        let call = if let Some((command, _description)) = shell_command(name, &args) {
            self.digest.commands.push(CommandRun {
                message: id,
                command: command_label(&command),
                key: command_key(&command),
                outcome: "no result".to_owned(),
                ok: true,
            });
            Call::Command(self.digest.commands.len() - 1)
        } else if let Some(action) = file_action(name, &args) {
            match path_arg(&args) {
                Some(path) => {
                    self.touch(id, &path, action);
                    if action == FileAction::Read {
                        Call::Other
                    } else {
                        Call::Write(path)
                    }
                }
                None => {
                    self.digest.count_tool(name, 1);
                    Call::Other
                }
            }
        } else if is(&TODO_TOOLS, name) {
            self.todo_list(id, &args, ordinal);
            Call::Other
        } else {
            self.digest.count_tool(name, 1);
            Call::Other
        };
        self.calls.insert(call_id.to_owned(), call);
    }

    fn touch(&mut self, id: MessageId, path: &str, action: FileAction) {
        self.digest.touch(FileTouch {
            path: path.to_owned(),
            action,
            file: (self.file_for_path)(path),
            message: id,
        });
    }

    /// A tool call fulfils the open intents that name it, and the first intent with nothing to
    /// name ("let me check").
    fn fulfil_by_action(&mut self, id: MessageId, name: &str, arguments: &str) {
        let action = format!("{name} {arguments}").to_lowercase();
        // The oldest open intent about the next step is this action, whatever it names.
        let next_step = self.open.iter().position(|o| {
            o.commitment.kind == CommitmentKind::Intent && (o.immediate || o.terms.is_empty())
        });
        let mut i = 0;
        let mut removed = 0;
        while i < self.open.len() {
            let open = &self.open[i];
            let fulfilled = match open.commitment.kind {
                CommitmentKind::Intent => {
                    next_step == Some(i + removed) || open.terms.named_in(&action)
                }
                CommitmentKind::Request | CommitmentKind::Todo => false,
            };
            if fulfilled {
                self.resolve_commitment(i, id, ResolutionKind::Fulfilled);
                removed += 1;
            } else {
                i += 1;
            }
        }
    }

    /// A to-do list replaces the previous one: items not completed are open; open items it
    /// marks completed are fulfilled, those it no longer lists are dropped.
    fn todo_list(&mut self, id: MessageId, args: &Value, ordinal: &mut u32) {
        let Some(items) = args.get("todos").and_then(Value::as_array) else {
            return;
        };
        let listed: Vec<(String, bool)> = items
            .iter()
            .filter_map(|item| {
                let text = item.get("content").and_then(Value::as_str)?;
                let done = item.get("status").and_then(Value::as_str) == Some("completed");
                Some((shorten_words(text, 24), done))
            })
            .collect();
        let mut i = 0;
        while i < self.open.len() {
            let open = &self.open[i];
            if open.commitment.kind != CommitmentKind::Todo {
                i += 1;
                continue;
            }
            match listed
                .iter()
                .find(|(text, _)| *text == open.commitment.text)
            {
                Some((_, true)) => self.resolve_commitment(i, id, ResolutionKind::Fulfilled),
                Some((_, false)) => i += 1,
                None => self.resolve_commitment(i, id, ResolutionKind::Dropped),
            }
        }
        for (text, done) in listed {
            let known = self
                .open
                .iter()
                .any(|o| o.commitment.kind == CommitmentKind::Todo && o.commitment.text == text);
            if !done && !known {
                self.add_commitment(id, ordinal, CommitmentKind::Todo, text);
            }
        }
    }

    fn tool_result(
        &mut self,
        id: MessageId,
        part: u32,
        call_id: &str,
        content: &str,
        is_error: bool,
    ) {
        let (key, failure) = match self.calls.remove(call_id) {
            Some(Call::Command(index)) => {
                let (outcome, ok) = outcome_line(content, is_error);
                let run = &mut self.digest.commands[index];
                run.outcome = outcome;
                run.ok = ok;
                let failure = (!ok).then(|| format!("`{}` → {}", run.command, run.outcome));
                (run.key.clone(), failure)
            }
            Some(Call::Write(path)) => {
                let failure = is_error.then(|| {
                    let first = content.lines().map(str::trim).find(|l| !l.is_empty());
                    format!(
                        "editing {path} failed: {}",
                        shorten_words(first.unwrap_or(""), 24)
                    )
                });
                (format!("edit:{path}"), failure)
            }
            Some(Call::Other) | None => return,
        };
        match failure {
            Some(text) => self.errors.push(OpenError {
                error: ErrorNote {
                    message: id,
                    ordinal: part,
                    key,
                    text,
                },
                carried: false,
            }),
            None => {
                // A success resolves the earlier failures of the same command or file.
                let mut i = 0;
                while i < self.errors.len() {
                    if self.errors[i].error.key == key {
                        let open = self.errors.remove(i);
                        if open.carried {
                            self.digest.resolved.push(Resolution {
                                item: open.error.item(),
                                by: id,
                                how: ResolutionKind::Fulfilled,
                            });
                        }
                    } else {
                        i += 1;
                    }
                }
            }
        }
    }

    /// Every commitment made so far, in order, with the message that resolved it and how
    /// (`None`: still open).
    pub fn commitments_made(&self) -> &[(Commitment, Option<(MessageId, ResolutionKind)>)] {
        &self.made
    }

    /// The digest: what the span left open, and what it resolved of the carried items.
    pub fn finish(mut self) -> Digest {
        self.digest.commitments = self
            .open
            .into_iter()
            .filter(|o| !o.carried)
            .map(|o| o.commitment)
            .collect();
        self.digest.errors = self
            .errors
            .into_iter()
            .filter(|e| !e.carried)
            .map(|e| e.error)
            .collect();
        self.digest
    }
}

/// What a file tool does to its file, if the call is one.
fn file_action(name: &str, args: &Value) -> Option<FileAction> {
    if is(&READS, name) {
        Some(FileAction::Read)
    } else if is(&EDITS, name) {
        Some(FileAction::Edited)
    } else if is(&WRITES, name) {
        Some(FileAction::Created)
    } else if is(&EDITORS, name) {
        match args.get("command").and_then(Value::as_str) {
            Some("view") => Some(FileAction::Read),
            Some("create") => Some(FileAction::Created),
            Some(_) => Some(FileAction::Edited),
            None => None,
        }
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use lcm_core::digest::ItemRef;
    use lcm_core::ids::SessionId;
    use lcm_core::message::SourceFormat;
    use lcm_core::time::Timestamp;

    use super::*;

    fn message(id: u64, role: Role, parts: Vec<Part>) -> Message {
        Message {
            id: MessageId(id),
            session: SessionId(1),
            seq: id,
            role,
            created_at: Timestamp(0),
            token_count: 0,
            parts,
            source: SourceFormat::Lcm,
        }
    }

    fn text(text: &str) -> Part {
        Part::Text { text: text.into() }
    }

    fn call(id: &str, name: &str, args: &str) -> Part {
        Part::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    fn result(id: &str, content: &str, is_error: bool) -> Part {
        Part::ToolResult {
            call_id: id.into(),
            content: content.into(),
            is_error,
        }
    }

    fn span() -> Vec<Message> {
        vec![
            message(
                1,
                Role::User,
                vec![text("<command-name>/clear</command-name>")],
            ),
            message(
                2,
                Role::User,
                vec![text("Please fix the failing parser test.")],
            ),
            message(
                3,
                Role::Assistant,
                vec![
                    text("Let me run the tests. After that I'll update CHANGELOG.md."),
                    call(
                        "c1",
                        "Bash",
                        r#"{"command":"cd /r && cargo test -p parser"}"#,
                    ),
                ],
            ),
            message(
                4,
                Role::Tool,
                vec![result(
                    "c1",
                    "Exit code 101\nerror[E0308]: mismatched types",
                    true,
                )],
            ),
            message(
                5,
                Role::Assistant,
                vec![call(
                    "c2",
                    "Edit",
                    r#"{"file_path":"/r/src/parse.rs","old_string":"a","new_string":"b"}"#,
                )],
            ),
            message(6, Role::Tool, vec![result("c2", "updated", false)]),
            message(
                7,
                Role::Assistant,
                vec![call("c3", "Bash", r#"{"command":"cargo test -p parser"}"#)],
            ),
            message(
                8,
                Role::Tool,
                vec![result("c3", "test result: ok. 4 passed; 0 failed", false)],
            ),
        ]
    }

    #[test]
    fn a_span_of_agent_work_becomes_its_digest() {
        let lookup = |path: &str| (path == "/r/src/parse.rs").then_some(FileId(9));
        let digest = extract(&span(), &OpenItems::default(), &lookup);
        // The harness's notice is not a request; the user's words are.
        let requests: Vec<&str> = digest.requests.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(requests, ["Please fix the failing parser test."]);
        assert_eq!(digest.commands.len(), 2);
        assert_eq!(digest.commands[0].command, "cargo test -p parser");
        assert_eq!(
            digest.commands[0].outcome,
            "exit 101: error[E0308]: mismatched types"
        );
        assert!(!digest.commands[0].ok);
        assert_eq!(
            digest.commands[1].outcome,
            "ok: test result: ok. 4 passed; 0 failed"
        );
        // The later success of the same command resolved the failure.
        assert!(digest.errors.is_empty(), "{:?}", digest.errors);
        assert_eq!(
            digest.files,
            [FileTouch {
                path: "/r/src/parse.rs".into(),
                action: FileAction::Edited,
                file: Some(FileId(9)),
                message: MessageId(5),
            }]
        );
        // "run the tests" was done by the next call; the changelog and the request are open.
        let open: Vec<(u64, CommitmentKind, &str)> = digest
            .commitments
            .iter()
            .map(|c| (c.message.0, c.kind, c.text.as_str()))
            .collect();
        assert_eq!(
            open,
            [
                (
                    2,
                    CommitmentKind::Request,
                    "Please fix the failing parser test."
                ),
                (
                    3,
                    CommitmentKind::Intent,
                    "After that I'll update CHANGELOG.md"
                ),
            ]
        );
    }

    #[test]
    fn carried_items_are_resolved_by_a_later_span() {
        let first = extract(&span()[..4], &OpenItems::default(), &|_| None);
        assert_eq!(
            first.errors.len(),
            1,
            "the failure is open at the end of the first span"
        );
        let carried = lcm_core::digest::open_items([&first]);
        let later = vec![
            message(
                10,
                Role::Assistant,
                vec![call("c9", "Bash", r#"{"command":"cargo test -p parser"}"#)],
            ),
            message(11, Role::Tool, vec![result("c9", "ok", false)]),
            message(
                12,
                Role::Assistant,
                vec![call(
                    "c10",
                    "Edit",
                    r#"{"file_path":"/r/CHANGELOG.md","old_string":"a","new_string":"b"}"#,
                )],
            ),
            message(13, Role::User, vec![text("Thanks. Now the docs.")]),
        ];
        let second = extract(&later, &carried, &|_| None);
        let resolved: Vec<(ItemRef, u64)> =
            second.resolved.iter().map(|r| (r.item, r.by.0)).collect();
        assert!(
            resolved.contains(&(first.errors[0].item(), 11)),
            "{resolved:?}"
        );
        let intent = first
            .commitments
            .iter()
            .find(|c| c.kind == CommitmentKind::Intent)
            .unwrap();
        assert!(resolved.contains(&(intent.item(), 12)), "{resolved:?}");
        // The request is fulfilled by the turn that answered it, once the user speaks again.
        let request = first
            .commitments
            .iter()
            .find(|c| c.kind == CommitmentKind::Request)
            .unwrap();
        assert!(resolved.contains(&(request.item(), 12)), "{resolved:?}");
        // Nothing open of the first span is left; the new request is open.
        let open = lcm_core::digest::open_items([&first, &second]);
        assert!(open.errors.is_empty());
        assert_eq!(open.commitments.len(), 1);
        assert_eq!(open.commitments[0].message, MessageId(13));
    }

    #[test]
    fn a_todo_list_opens_and_closes_its_items() {
        let todos = |items: &str| format!(r#"{{"todos":[{items}]}}"#);
        let span = vec![
            message(
                1,
                Role::Assistant,
                vec![call(
                    "t1",
                    "TodoWrite",
                    &todos(
                        r#"{"content":"Write the parser","status":"in_progress"},{"content":"Add tests","status":"pending"}"#,
                    ),
                )],
            ),
            message(
                2,
                Role::Assistant,
                vec![call(
                    "t2",
                    "TodoWrite",
                    &todos(
                        r#"{"content":"Write the parser","status":"completed"},{"content":"Add tests","status":"pending"}"#,
                    ),
                )],
            ),
        ];
        let digest = extract(&span, &OpenItems::default(), &|_| None);
        let open: Vec<&str> = digest.commitments.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(open, ["Add tests"]);
        assert!(
            digest.tools.is_empty(),
            "a to-do list is not tallied as another tool"
        );
    }
}
