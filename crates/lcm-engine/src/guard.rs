//! The scope-reduction guard of `Task` (paper section 3.2, appendix C.3).
//!
//! A sub-agent (not the root agent) that delegates with `Task` must say what slice it hands off
//! (`delegated_scope`) and what it keeps doing itself (`kept_work`). The call is rejected, with
//! the instruction to do the work directly, when:
//!
//! 1. either field is missing or has fewer than [`MIN_MEANINGFUL_WORDS`] content words (words
//!    of two or more letters or digits, not counting a short list of filler words such as
//!    "the", "all", "everything", "rest");
//! 2. `kept_work` says the caller keeps nothing ("nothing", "none", "n/a", ...);
//! 3. the delegated scope *is* the caller's own scope: after normalisation (lower case,
//!    punctuation removed, filler words dropped, words sorted and deduplicated) it equals, or
//!    covers at least [`RESTATEMENT_OVERLAP`] (three quarters) of the words of, the caller's own
//!    delegated scope
//!    (for a root-spawned sub-agent with no declared scope: its task prompt);
//! 4. the delegated scope restates the caller's own task prompt in the same sense.
//!
//! Exempt: the root agent (depth 0), read-only exploration agents (they cannot spawn), and the
//! parallel `Tasks` tool (sibling decomposition, not nesting). Because each accepted nesting
//! strictly reduces the declared scope, delegation chains bottom out without a depth limit.

use std::collections::BTreeSet;

/// Fewest content words a scope or kept-work description must have.
pub const MIN_MEANINGFUL_WORDS: usize = 2;

/// Share of the caller's scope words that a delegated scope may cover before it counts as a
/// restatement of the whole scope.
pub const RESTATEMENT_OVERLAP: f64 = 0.75;

/// What the paper tells an agent whose delegation is refused.
pub const REJECTION_INSTRUCTION: &str = "Delegation rejected by the scope-reduction guard: a sub-agent may only delegate a strict part of its own work. Do this work directly yourself instead of delegating it. If only part of it should be delegated, call Task again with `delegated_scope` naming that specific part and `kept_work` naming what you will still do yourself.";

const FILLER: &[&str] = &[
    "a",
    "an",
    "the",
    "and",
    "or",
    "of",
    "to",
    "in",
    "on",
    "for",
    "with",
    "by",
    "it",
    "this",
    "that",
    "these",
    "those",
    "all",
    "any",
    "every",
    "everything",
    "entire",
    "whole",
    "rest",
    "remaining",
    "task",
    "tasks",
    "work",
    "job",
    "please",
    "do",
    "is",
    "are",
    "be",
    "my",
    "our",
    "your",
    "its",
    "as",
    "at",
    "from",
    "up",
];

const NOTHING: &[&str] = &[
    "nothing",
    "none",
    "n/a",
    "na",
    "-",
    "no",
    "nil",
    "null",
    "nothing else",
    "no work",
];

/// Who is calling `Task`.
#[derive(Debug, Clone, Default)]
pub struct DelegationCaller {
    /// 0 for the root agent; a sub-agent spawned by the root is at depth 1.
    pub depth: u32,
    /// The caller's own task prompt (what it was asked to do).
    pub task: String,
    /// The scope its own delegator declared for it, if any.
    pub scope: Option<String>,
}

/// A `Task` call as the guard sees it.
#[derive(Debug, Clone, Default)]
pub struct DelegationRequest {
    pub prompt: String,
    pub delegated_scope: Option<String>,
    pub kept_work: Option<String>,
    pub read_only: bool,
    /// Part of a parallel `Tasks` call.
    pub parallel: bool,
}

/// Why the guard refused a delegation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}. {}", REJECTION_INSTRUCTION)]
pub struct GuardRejection {
    /// What was wrong, in one sentence.
    pub reason: String,
}

/// Checks a `Task` call against the scope-reduction rules (see the module docs).
pub fn check_delegation(
    caller: &DelegationCaller,
    request: &DelegationRequest,
) -> Result<(), GuardRejection> {
    if caller.depth == 0 || request.read_only || request.parallel {
        return Ok(());
    }
    let reject = |reason: String| Err(GuardRejection { reason });
    let Some(scope) = request.delegated_scope.as_deref() else {
        return reject("a sub-agent must give `delegated_scope` to delegate".into());
    };
    let Some(kept) = request.kept_work.as_deref() else {
        return reject("a sub-agent must give `kept_work` to delegate".into());
    };
    if is_nothing(kept) {
        return reject(format!(
            "`kept_work` (\"{}\") keeps nothing for the caller",
            kept.trim()
        ));
    }
    let scope_words = content_words(scope);
    let kept_words = content_words(kept);
    if scope_words.len() < MIN_MEANINGFUL_WORDS {
        return reject(format!(
            "`delegated_scope` (\"{}\") does not name a specific part of the work",
            scope.trim()
        ));
    }
    if kept_words.len() < MIN_MEANINGFUL_WORDS {
        return reject(format!(
            "`kept_work` (\"{}\") does not name work the caller keeps",
            kept.trim()
        ));
    }
    let own_scope = caller.scope.as_deref().unwrap_or(&caller.task);
    for (what, own) in [("scope", own_scope), ("task", caller.task.as_str())] {
        let own_words = content_words(own);
        if !own_words.is_empty() && restates(&scope_words, &own_words) {
            return reject(format!(
                "`delegated_scope` restates the caller's whole {what} instead of a part of it"
            ));
        }
    }
    Ok(())
}

/// Whether `scope` covers (nearly) all of `own`: equal sets, or overlap of at least
/// [`RESTATEMENT_OVERLAP`] of `own`'s words.
fn restates(scope: &BTreeSet<String>, own: &BTreeSet<String>) -> bool {
    if scope == own {
        return true;
    }
    let shared = scope.intersection(own).count();
    shared as f64 >= RESTATEMENT_OVERLAP * own.len() as f64
}

fn is_nothing(text: &str) -> bool {
    let t = text.trim().to_lowercase();
    let t = t.trim_end_matches('.');
    t.is_empty() || NOTHING.contains(&t)
}

/// The normalised content words of a text: lower case, split on anything that is not a letter
/// or digit, filler words and single characters dropped, a plural `s` removed, deduplicated and
/// sorted.
pub fn content_words(text: &str) -> BTreeSet<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 2 && !FILLER.contains(w))
        .map(singular)
        .collect()
}

fn singular(word: &str) -> String {
    match word.strip_suffix('s') {
        Some(stem) if stem.chars().count() >= 3 && !stem.ends_with('s') => stem.to_string(),
        _ => word.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(task: &str, scope: Option<&str>) -> DelegationCaller {
        DelegationCaller {
            depth: 1,
            task: task.into(),
            scope: scope.map(str::to_string),
        }
    }

    fn task(scope: Option<&str>, kept: Option<&str>) -> DelegationRequest {
        DelegationRequest {
            prompt: "do it".into(),
            delegated_scope: scope.map(str::to_string),
            kept_work: kept.map(str::to_string),
            ..DelegationRequest::default()
        }
    }

    #[test]
    fn root_read_only_and_parallel_callers_are_exempt() {
        let root = DelegationCaller::default();
        assert!(check_delegation(&root, &task(None, None)).is_ok());
        let caller = sub("audit the billing module", None);
        let mut r = task(None, None);
        r.read_only = true;
        assert!(check_delegation(&caller, &r).is_ok());
        let mut r = task(None, None);
        r.parallel = true;
        assert!(check_delegation(&caller, &r).is_ok());
    }

    #[test]
    fn missing_or_empty_fields_are_rejected_with_the_instruction() {
        let caller = sub("audit the billing module", None);
        for (scope, kept) in [
            (None, Some("write the report")),
            (Some("check invoices rounding"), None),
            (Some("check invoices rounding"), Some("nothing")),
            (Some("check invoices rounding"), Some("  N/A. ")),
            (Some("everything"), Some("write the report")),
            (Some("check invoices rounding"), Some("the rest")),
        ] {
            let err = check_delegation(&caller, &task(scope, kept)).unwrap_err();
            assert!(err.to_string().contains("Do this work directly"), "{err}");
        }
    }

    #[test]
    fn delegating_the_whole_scope_is_rejected() {
        let caller = sub(
            "Audit the billing module",
            Some("audit of the billing module"),
        );
        let err = check_delegation(
            &caller,
            &task(
                Some("The billing module: audit it all!"),
                Some("review the findings"),
            ),
        )
        .unwrap_err();
        assert!(err.reason.contains("restates"), "{err}");
        // Restating the task prompt when no scope was declared is caught too.
        let caller = sub("find every caller of parse_config in the repo", None);
        let err = check_delegation(
            &caller,
            &task(
                Some("find all callers of parse_config in the repo"),
                Some("summarise the results"),
            ),
        )
        .unwrap_err();
        assert!(err.reason.contains("restates"), "{err}");
    }

    #[test]
    fn a_strict_narrowing_is_accepted() {
        let caller = sub(
            "audit the billing module",
            Some("billing module: invoices, refunds and tax rounding"),
        );
        let ok = check_delegation(
            &caller,
            &task(
                Some("tax rounding in invoice totals"),
                Some("refunds and the final audit report"),
            ),
        );
        assert!(ok.is_ok(), "{ok:?}");
    }
}
