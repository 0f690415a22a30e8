//! The id counters in `meta`:
//!
//! - [`ViolationKind::CounterBehind`]: a `meta` counter is not past the largest id of its
//!   table, so the next insert would overwrite a record (repair: [`Repair::RaiseCounter`]).
//!
//! `next_message`, `next_session` and `next_summary` are checked first; `next_file` with the
//! file tables (see [`super::files`]), which older stores do not have.

use super::shared::{Facts, Findings, Tables, last_key, meta_value};
use super::{Counter, Repair, ViolationKind};
use crate::error::Result;

/// `next_message`, `next_session` and `next_summary` are past every stored id.
pub(super) fn check(t: &Tables, facts: &Facts, f: &mut Findings) -> Result<()> {
    check_counter(t, f, facts.last_message, Counter::NextMessage, "message")?;
    check_counter(
        t,
        f,
        last_key(&t.sessions)?,
        Counter::NextSession,
        "session",
    )?;
    check_counter(
        t,
        f,
        last_key(&t.summaries)?,
        Counter::NextSummary,
        "summary",
    )
}

/// Reports `counter` if it is not past `last`, the newest stored id it counts (`what`).
pub(super) fn check_counter(
    t: &Tables,
    f: &mut Findings,
    last: Option<u64>,
    counter: Counter,
    what: &str,
) -> Result<()> {
    let next = meta_value(&t.meta, counter.meta_key())?;
    if let Some(last) = last
        && last >= next
    {
        f.push(
            ViolationKind::CounterBehind,
            format!("meta.{}", counter.meta_key()),
            format!(
                "the counter is {next} but {what} {last} exists: the next new {what} would overwrite a stored one"
            ),
            Some(Repair::RaiseCounter { counter }),
        );
    }
    Ok(())
}
