//! Commands and their outcomes: what a summary keeps of a shell call.

use std::sync::LazyLock;

use regex::Regex;

use super::text::{compile, shorten_chars};

/// Longest command shown, in characters.
const COMMAND_CHARS: usize = 100;
/// Longest outcome line, in characters.
const OUTCOME_CHARS: usize = 140;

/// Tool names that run a shell command.
const SHELLS: [&str; 10] = [
    "bash",
    "shell",
    "exec",
    "exec_command",
    "run_command",
    "execute_command",
    "run_terminal_cmd",
    "terminal",
    "run_shell_command",
    "local_shell",
];

/// The command a tool call runs, if it is a shell call: `command` (or `cmd`, a string or a
/// list of words), with its `description` when the tool gives one.
pub fn shell_command(name: &str, args: &serde_json::Value) -> Option<(String, Option<String>)> {
    if !SHELLS.iter().any(|s| s.eq_ignore_ascii_case(name)) {
        return None;
    }
    let command = match args.get("command").or_else(|| args.get("cmd"))? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(words) => words
            .iter()
            .filter_map(|w| w.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => return None,
    };
    let description = args
        .get("description")
        .and_then(|d| d.as_str())
        .map(str::to_owned);
    Some((command, description))
}

/// The command as a summary shows it: its first line, without a leading `cd DIR &&`, with
/// whitespace collapsed, at most 100 characters.
pub fn command_label(command: &str) -> String {
    let first = command.lines().map(str::trim).find(|l| !l.is_empty());
    let mut line = first.unwrap_or("").to_owned();
    while let Some(rest) = strip_cd(&line) {
        line = rest.to_owned();
    }
    let collapsed = line.split_whitespace().collect::<Vec<_>>().join(" ");
    shorten_chars(&collapsed, COMMAND_CHARS)
}

fn strip_cd(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("cd ")?;
    let (_, after) = rest.split_once("&&")?;
    Some(after.trim_start())
}

/// What groups runs of "the same" command: the program and, for tools with subcommands, the
/// subcommand (`cargo test`, `git push`, `mix test`, `npm run`), after any `cd DIR &&` and
/// environment assignments.
pub fn command_key(command: &str) -> String {
    let label = command_label(command);
    let mut words = label
        .split_whitespace()
        .skip_while(|w| w.contains('=') && !w.starts_with('-'))
        .filter(|w| !matches!(*w, "sudo" | "time" | "timeout" | "env" | "uv" | "poetry"));
    let program = words.next().unwrap_or("");
    let program = program.rsplit('/').next().unwrap_or(program);
    match words.find(|w| !w.starts_with('-') && !w.chars().all(|c| c.is_ascii_digit())) {
        Some(sub) if has_subcommands(program) => format!("{program} {sub}"),
        _ => program.to_owned(),
    }
}

fn has_subcommands(program: &str) -> bool {
    matches!(
        program,
        "cargo"
            | "git"
            | "mix"
            | "npm"
            | "pnpm"
            | "yarn"
            | "go"
            | "docker"
            | "kubectl"
            | "make"
            | "bd"
            | "gh"
            | "pip"
            | "python"
            | "python3"
            | "bun"
            | "deno"
            | "dotnet"
            | "gradle"
            | "mvn"
    )
}

static EXIT_CODE: LazyLock<Regex> =
    LazyLock::new(|| compile(r"(?i)^(?:exit code|exit status|exited with(?: code)?)[: ]+(\d+)"));
/// Lines that report test counts (cargo, pytest, mix/ExUnit, jest, go, generic).
static TEST_COUNTS: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)(?:test result:|\b\d+ (?:tests?|examples?|specs?), \d+ failures?|\b\d+ passed\b|\b\d+ failed\b|^tests?:\s+\d+|^(?:ok|FAIL)\s+\S+\s+\d+(?:\.\d+)?s$|\bran \d+ tests?\b)",
    )
});
/// Lines that name an error.
static ERROR_LINE: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"(?i)(?:\berror\b|\berror\[|\bfatal\b|\bfailed\b|\bfailure\b|\bpanicked\b|\bexception\b|\btraceback\b|\bno such file\b|\bnot found\b|\bcannot\b|\bundefined\b|\bdenied\b|\brejected\b|\binvalid\b|\bunable\b|\*\* \()",
    )
});

/// The outcome line of a command's result: `exit N` or `ok`, then the test counts and, when
/// it failed, the first error line. `is_error` is the tool's own failure flag.
pub fn outcome_line(result: &str, is_error: bool) -> (String, bool) {
    let mut lines = result.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut exit: Option<u32> = None;
    let first = lines.next();
    if let Some(caps) = first.and_then(|l| EXIT_CODE.captures(l)) {
        exit = caps.get(1).and_then(|m| m.as_str().parse().ok());
    }
    let ok = !is_error && exit.is_none_or(|code| code == 0);
    let body = result
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !EXIT_CODE.is_match(l));
    let mut counts: Option<&str> = None;
    let mut error: Option<&str> = None;
    for line in body {
        if TEST_COUNTS.is_match(line) {
            counts = Some(line); // The last count line is the total.
        } else if error.is_none() && !ok && ERROR_LINE.is_match(line) {
            error = Some(line);
        }
    }
    let mut out = match (ok, exit) {
        (true, _) => "ok".to_owned(),
        (false, Some(code)) => format!("exit {code}"),
        (false, None) => "failed".to_owned(),
    };
    if let Some(counts) = counts {
        out.push_str(": ");
        out.push_str(counts);
    }
    if !ok {
        // A failure without counts or a recognisable error line shows its first line instead.
        let detail = error.or_else(|| {
            counts.is_none().then(|| {
                result
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty() && !EXIT_CODE.is_match(l))
            })?
        });
        if let Some(detail) = detail {
            out.push_str(": ");
            out.push_str(detail);
        }
    }
    (shorten_chars(&out, OUTCOME_CHARS), ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_keys() {
        assert_eq!(
            command_label("cd /home/u/p && cargo test -p lcm-core\n# more"),
            "cargo test -p lcm-core"
        );
        assert_eq!(command_key("cd /x && cargo test -p lcm-core"), "cargo test");
        assert_eq!(command_key("RUST_LOG=debug cargo  build"), "cargo build");
        assert_eq!(command_key("git push 2>&1"), "git push");
        assert_eq!(command_key("ls -la /tmp"), "ls");
        assert_eq!(command_key("/usr/bin/python3 -m pytest"), "python3 pytest");
        assert_eq!(command_label(&"x".repeat(300)).chars().count(), 100);
    }

    #[test]
    fn outcomes() {
        assert_eq!(outcome_line("", false), ("ok".to_owned(), true));
        let (line, ok) = outcome_line(
            "Exit code 1\nCompiling\n     error: undefined function get/2 (expected X)\nmore",
            true,
        );
        assert!(!ok);
        assert_eq!(line, "exit 1: error: undefined function get/2 (expected X)");
        let (line, ok) = outcome_line(
            "running 3 tests\ntest result: ok. 3 passed; 0 failed; 0 ignored",
            false,
        );
        assert!(ok);
        assert_eq!(line, "ok: test result: ok. 3 passed; 0 failed; 0 ignored");
        let (line, ok) = outcome_line("Finished in 0.2 seconds\n12 tests, 2 failures\n", true);
        assert!(!ok);
        assert_eq!(line, "failed: 12 tests, 2 failures");
        let (line, _) = outcome_line("Exit code 128\nfatal: no upstream branch", true);
        assert_eq!(line, "exit 128: fatal: no upstream branch");
        assert_eq!(
            shell_command(
                "Bash",
                &serde_json::json!({"command": "ls", "description": "List"})
            ),
            Some(("ls".to_owned(), Some("List".to_owned())))
        );
        assert_eq!(
            shell_command("shell", &serde_json::json!({"cmd": ["git", "status"]})),
            Some(("git status".to_owned(), None))
        );
        assert_eq!(
            shell_command("Read", &serde_json::json!({"command": "x"})),
            None
        );
    }
}
