//! The agent's marks on its contexts (`context_marks`, see `crate::marks`):
//!
//! - [`ViolationKind::ContextMarks`]: a mark of a session that does not exist, with an unknown
//!   mark or node kind, on a node that does not exist, a pin on anything but a message, or a
//!   forget on a node of another session. Assembly reads every mark of a session, so one such
//!   row would make its context fail to assemble. Repair: [`Repair::RemoveMark`] (a mark is
//!   the agent's request about what its context shows, never content: without it the context
//!   shows the node as it would have without the request).
//!
//! A store written before marks existed has no such table: nothing to check.

use lcm_core::ids::SessionId;
use lcm_core::summary::{ContextMark, NodeRef};
use redb::ReadableTable;

use super::shared::{Facts, Findings, Tables};
use super::{Repair, ViolationKind};
use crate::codec;
use crate::dag::{self, SummaryRecord};
use crate::error::Result;
use crate::message_rows;
use crate::record::RecordView;

/// Every mark names an existing session and a node it may carry.
pub(super) fn check(t: &Tables, _: &Facts, f: &mut Findings) -> Result<()> {
    let Some(marks) = &t.marks else {
        return Ok(());
    };
    for entry in marks.iter()? {
        let (key, value) = entry?;
        let (session, kind, number) = key.value();
        let (mark, _) = value.value();
        let session_id = SessionId(session);
        let node = dag::node_from_key("context_marks", (kind, number)).ok();
        let subject = match node {
            Some(node) => format!("{session_id} {node}"),
            None => format!("{session_id} node kind {kind} #{number}"),
        };
        let problem = problem(t, session_id, node, ContextMark::from_byte(mark))?;
        if let Some(problem) = problem {
            f.push(
                ViolationKind::ContextMarks,
                subject,
                problem,
                node.map(|node| Repair::RemoveMark {
                    session: session_id,
                    node,
                }),
            );
        }
    }
    Ok(())
}

/// What is wrong with one mark, if anything.
fn problem(
    t: &Tables,
    session: SessionId,
    node: Option<NodeRef>,
    mark: Option<ContextMark>,
) -> Result<Option<String>> {
    if t.sessions.get(session.0)?.is_none() {
        return Ok(Some("a mark of a session that does not exist".into()));
    }
    let (Some(node), Some(mark)) = (node, mark) else {
        return Ok(Some(
            "a mark of an unknown kind, or on an unknown kind of node".into(),
        ));
    };
    let owner = match node {
        NodeRef::Message(id) => match message_rows::get(&t.messages, id.0)? {
            Some(row) => RecordView::read(row.bytes()).ok().map(|r| r.session()),
            None => None,
        },
        NodeRef::Summary(id) => match t.summaries.get(id.0)? {
            Some(bytes) => codec::decode::<SummaryRecord>("summaries", bytes.value())
                .ok()
                .map(|s| SessionId(s.session)),
            None => None,
        },
    };
    let Some(owner) = owner else {
        return Ok(Some(format!(
            "{} marks {node}, which does not exist (or cannot be read)",
            mark.as_str()
        )));
    };
    Ok(match (mark, node) {
        (ContextMark::Pinned, NodeRef::Summary(_)) => {
            Some("a pin on a summary: only messages are pinned".into())
        }
        (ContextMark::Forgotten, _) if owner != session => Some(format!(
            "{node} belongs to {owner}: only a node of the session's own context is forgotten"
        )),
        _ => None,
    })
}
