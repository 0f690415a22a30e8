//! A summary's derived fields (sequence range, time range, descendant counts, depth) and how
//! they follow from its sources: what the DAG checker compares with the stored fields (see
//! [`super::dag`]) and what [`super::repairs`] writes back.

use lcm_core::summary::SummaryKind;
use lcm_core::time::Timestamp;

use crate::dag::SummaryRecord;

/// What derived fields a summary (or a message, as a one-message span) has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Derived {
    pub(super) depth: u32,
    pub(super) first_seq: u64,
    pub(super) last_seq: u64,
    pub(super) earliest: Timestamp,
    pub(super) latest: Timestamp,
    pub(super) messages: u64,
    pub(super) tokens: u64,
}

impl Derived {
    /// A message as a source: one message at `seq`.
    pub(super) fn message(seq: u64, at: Timestamp, tokens: u32) -> Derived {
        Derived {
            depth: 0,
            first_seq: seq,
            last_seq: seq,
            earliest: at,
            latest: at,
            messages: 1,
            tokens: u64::from(tokens),
        }
    }

    /// The fields stored in a summary's record.
    pub(super) fn stored(r: &SummaryRecord) -> Derived {
        Derived {
            depth: r.depth,
            first_seq: r.first_seq,
            last_seq: r.last_seq,
            earliest: r.earliest_at,
            latest: r.latest_at,
            messages: r.descendant_messages,
            tokens: r.descendant_tokens,
        }
    }

    /// Writes the fields into a summary's record.
    pub(super) fn write_to(&self, r: &mut SummaryRecord) {
        r.depth = self.depth;
        r.first_seq = self.first_seq;
        r.last_seq = self.last_seq;
        r.earliest_at = self.earliest;
        r.latest_at = self.latest;
        r.descendant_messages = self.messages;
        r.descendant_tokens = self.tokens;
    }

    /// `field: stored X, sources give Y` for every field that differs.
    pub(super) fn differences(stored: &Derived, computed: &Derived) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{name}: stored {a}, sources give {b}"));
            }
        };
        cmp(
            "depth",
            stored.depth.to_string(),
            computed.depth.to_string(),
        );
        cmp(
            "first_seq",
            stored.first_seq.to_string(),
            computed.first_seq.to_string(),
        );
        cmp(
            "last_seq",
            stored.last_seq.to_string(),
            computed.last_seq.to_string(),
        );
        cmp(
            "earliest_at",
            stored.earliest.to_string(),
            computed.earliest.to_string(),
        );
        cmp(
            "latest_at",
            stored.latest.to_string(),
            computed.latest.to_string(),
        );
        cmp(
            "descendant_messages",
            stored.messages.to_string(),
            computed.messages.to_string(),
        );
        cmp(
            "descendant_tokens",
            stored.tokens.to_string(),
            computed.tokens.to_string(),
        );
        out
    }
}

/// Aggregates sources, oldest first, the way `apply_summary` does, noting whether each source
/// starts right after the previous one.
#[derive(Debug)]
pub(super) struct Aggregate {
    total: Option<Derived>,
    /// Every source so far started right after the one before.
    pub(super) contiguous: bool,
}

impl Aggregate {
    pub(super) fn new() -> Self {
        Aggregate {
            total: None,
            contiguous: true,
        }
    }

    /// Adds the next source.
    pub(super) fn add(&mut self, part: Derived) {
        match &mut self.total {
            None => self.total = Some(part),
            Some(t) => {
                if t.last_seq.checked_add(1) != Some(part.first_seq) {
                    self.contiguous = false;
                }
                t.last_seq = part.last_seq;
                t.earliest = t.earliest.min(part.earliest);
                t.latest = t.latest.max(part.latest);
                t.messages += part.messages;
                t.tokens += part.tokens;
                t.depth = t.depth.max(part.depth);
            }
        }
    }

    /// The summary's derived fields: depth 0 for a leaf, one more than its deepest source for
    /// a condensed summary.
    pub(super) fn finish(self, kind: SummaryKind) -> Option<Derived> {
        self.total.map(|mut t| {
            t.depth = match kind {
                SummaryKind::Leaf => 0,
                SummaryKind::Condensed => t.depth + 1,
            };
            t
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp(ms)
    }

    #[test]
    fn consecutive_messages_make_a_contiguous_leaf() {
        let mut agg = Aggregate::new();
        agg.add(Derived::message(3, at(30), 5));
        agg.add(Derived::message(4, at(10), 7));
        assert!(agg.contiguous);
        let d = agg.finish(SummaryKind::Leaf).expect("sources");
        assert_eq!((d.first_seq, d.last_seq, d.depth), (3, 4, 0));
        assert_eq!((d.earliest, d.latest), (at(10), at(30)));
        assert_eq!((d.messages, d.tokens), (2, 12));
    }

    #[test]
    fn a_gap_or_a_repeat_is_not_contiguous() {
        let mut gap = Aggregate::new();
        gap.add(Derived::message(0, at(0), 1));
        gap.add(Derived::message(2, at(0), 1));
        assert!(!gap.contiguous);
        let mut repeat = Aggregate::new();
        repeat.add(Derived::message(0, at(0), 1));
        repeat.add(Derived::message(0, at(0), 1));
        assert!(!repeat.contiguous);
    }

    #[test]
    fn a_condensed_summary_is_one_deeper_than_its_deepest_source() {
        let child = |first, last, depth| Derived {
            depth,
            first_seq: first,
            last_seq: last,
            earliest: at(0),
            latest: at(1),
            messages: last - first + 1,
            tokens: 1,
        };
        let mut agg = Aggregate::new();
        agg.add(child(0, 3, 0));
        agg.add(child(4, 9, 2));
        let d = agg.finish(SummaryKind::Condensed).expect("sources");
        assert_eq!(
            (d.first_seq, d.last_seq, d.depth, d.messages),
            (0, 9, 3, 10)
        );
        assert!(Aggregate::new().finish(SummaryKind::Leaf).is_none());
    }

    #[test]
    fn differences_name_each_field_that_differs() {
        let stored = Derived::message(1, at(5), 3);
        let computed = Derived {
            last_seq: 2,
            tokens: 4,
            ..stored
        };
        assert_eq!(
            Derived::differences(&stored, &computed),
            [
                "last_seq: stored 1, sources give 2",
                "descendant_tokens: stored 3, sources give 4"
            ]
        );
        assert!(Derived::differences(&stored, &stored).is_empty());
    }
}
