//! Map jobs in the store: the claim / complete / fail / retry lifecycle, exactly-once commits
//! (late duplicates and answers from expired leases are refused), leases, resume after a
//! reopen, creation in batches, and a model-based property test against an in-memory reference
//! of the item states.

use std::path::Path;
use std::time::Duration;

use lcm_core::ids::JobId;
use lcm_core::time::Timestamp;
use lcm_core::tokens::{Encoding, TokenCounter};
use lcm_store::{
    CommitOutcome, FailureKind, ItemContent, ItemFailure, ItemInput, ItemOutcome, ItemReport,
    ItemState, JobStatus, MapJobSpec, MapKind, MapProgress, Store, StoreError, StoreOptions,
};
use proptest::prelude::*;

const LEASE: Duration = Duration::from_secs(10);
const T0: Timestamp = Timestamp(1_700_000_000_000);

fn open(path: &Path) -> Store {
    Store::open(
        path,
        StoreOptions::new(TokenCounter::new(Encoding::O200kBase)),
    )
    .unwrap()
}

fn spec(max_attempts: u32) -> MapJobSpec {
    MapJobSpec {
        kind: MapKind::Llm,
        input_path: "/data/in.jsonl".into(),
        output_path: "/data/out.jsonl".into(),
        prompt: "Classify the item.".into(),
        output_schema: r#"{"type":"object"}"#.into(),
        max_attempts,
        concurrency: 4,
        timeout: Duration::from_secs(120),
        model: None,
        read_only: true,
    }
}

fn items(n: u64) -> impl Iterator<Item = std::io::Result<ItemInput>> {
    (0..n).map(|i| {
        Ok(ItemInput {
            line: i + 1,
            content: ItemContent::Json(format!("{{\"n\":{i}}}")),
        })
    })
}

fn at(secs: i64) -> Timestamp {
    Timestamp(T0.0 + secs * 1000)
}

fn invalid(message: &str) -> ItemFailure {
    ItemFailure::new(FailureKind::InvalidOutput, message)
}

fn progress(total: u64, pending: u64, running: u64, completed: u64, failed: u64) -> MapProgress {
    MapProgress {
        total,
        pending,
        running,
        completed,
        failed,
    }
}

#[test]
fn claim_complete_fail_retry_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("lcm.redb"));
    let job = store.create_job(&spec(2), items(3)).unwrap();
    assert_eq!(store.job(job).unwrap().status, JobStatus::Running);
    assert_eq!(store.progress(job).unwrap(), progress(3, 3, 0, 0, 0));

    let claimed = store.claim(job, "a", at(0), LEASE, 2).unwrap();
    assert_eq!(
        claimed.iter().map(|c| c.index).collect::<Vec<_>>(),
        [0, 1],
        "lowest index first"
    );
    assert!(claimed.iter().all(|c| c.attempt == 1 && c.owner == "a"));
    assert_eq!(claimed[1].payload, r#"{"n":1}"#);
    assert_eq!(claimed[0].lease_expires_at, at(10));
    assert_eq!(store.progress(job).unwrap(), progress(3, 1, 2, 0, 0));

    assert_eq!(
        store.complete(job, 0, "a", 1, r#"{"label":"x"}"#).unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        store
            .fail(job, 1, "a", 1, invalid("missing property `label`"))
            .unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(store.progress(job).unwrap(), progress(3, 2, 0, 1, 0));
    let item = store.item(job, 1).unwrap();
    assert_eq!(item.state, ItemState::Pending);
    assert_eq!(item.feedback.as_deref(), Some("missing property `label`"));

    // The retry carries the feedback; a transient failure keeps it.
    let claimed = store.claim(job, "b", at(1), LEASE, 5).unwrap();
    assert_eq!(claimed.iter().map(|c| c.index).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(claimed[0].attempt, 2);
    assert_eq!(
        claimed[0].feedback.as_deref(),
        Some("missing property `label`")
    );
    assert_eq!(claimed[1].feedback, None);
    let outcome = store
        .fail(
            job,
            1,
            "b",
            2,
            ItemFailure::new(FailureKind::Transient, "HTTP 500"),
        )
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed);
    let item = store.item(job, 1).unwrap();
    assert_eq!(
        item.state,
        ItemState::Failed {
            error: "HTTP 500".into()
        },
        "no attempts left"
    );
    assert_eq!(item.attempts, 2);
    assert_eq!(item.feedback.as_deref(), Some("missing property `label`"));
    assert_eq!(store.job(job).unwrap().status, JobStatus::Running);

    assert_eq!(
        store.complete(job, 2, "b", 1, "[1, 2]").unwrap(),
        CommitOutcome::Committed
    );
    let done = store.job(job).unwrap();
    assert_eq!(
        done.status,
        JobStatus::Completed,
        "the last item finished it"
    );
    assert!(done.finished_at.is_some());
    assert_eq!(done.progress, progress(3, 0, 0, 2, 1));
    assert!(store.claim(job, "c", at(2), LEASE, 5).unwrap().is_empty());

    let states: Vec<ItemState> = store
        .items_in_order(job)
        .unwrap()
        .map(|i| i.unwrap().state)
        .collect();
    assert_eq!(
        states,
        [
            ItemState::Completed {
                result: r#"{"label":"x"}"#.into()
            },
            ItemState::Failed {
                error: "HTTP 500".into()
            },
            ItemState::Completed {
                result: "[1, 2]".into()
            },
        ]
    );
}

#[test]
fn a_permanent_failure_is_not_retried() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let job = store.create_job(&spec(3), items(1)).unwrap();
    store.claim(job, "a", at(0), LEASE, 1).unwrap();
    let failure = ItemFailure::new(FailureKind::Permanent, "HTTP 400: context too long");
    assert_eq!(
        store.fail(job, 0, "a", 1, failure).unwrap(),
        CommitOutcome::Committed
    );
    assert!(matches!(
        store.item(job, 0).unwrap().state,
        ItemState::Failed { .. }
    ));
    assert_eq!(store.job(job).unwrap().status, JobStatus::Completed);
}

#[test]
fn a_late_duplicate_is_discarded() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let job = store.create_job(&spec(3), items(1)).unwrap();
    store.claim(job, "a", at(0), LEASE, 1).unwrap();
    assert_eq!(
        store.complete(job, 0, "a", 1, "1").unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        store.complete(job, 0, "a", 1, "2").unwrap(),
        CommitOutcome::Duplicate
    );
    assert_eq!(
        store.fail(job, 0, "a", 1, invalid("late")).unwrap(),
        CommitOutcome::Duplicate
    );
    assert_eq!(
        store.release_item(job, 0, "a", 1).unwrap(),
        CommitOutcome::Duplicate
    );
    let item = store.item(job, 0).unwrap();
    assert_eq!(item.state, ItemState::Completed { result: "1".into() });
    assert_eq!(item.last_error, None);
    assert_eq!(store.progress(job).unwrap(), progress(1, 0, 0, 1, 0));
}

#[test]
fn an_expired_lease_is_reclaimed_and_the_old_owner_is_refused() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let job = store.create_job(&spec(3), items(2)).unwrap();
    assert_eq!(store.claim(job, "a", at(0), LEASE, 2).unwrap().len(), 2);
    // Not expired yet: nothing to take.
    assert!(store.claim(job, "b", at(5), LEASE, 2).unwrap().is_empty());
    // Item 1's lease expired, nobody took it over: a's late answer still counts.
    // (Claim only one so item 1 stays with a.)
    let taken = store.claim(job, "b", at(11), LEASE, 1).unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].index, taken[0].attempt), (0, 2));
    assert!(
        taken[0]
            .last_error
            .as_deref()
            .unwrap()
            .contains("lease expired")
    );
    assert_eq!(
        store.complete(job, 0, "a", 1, r#""from a""#).unwrap(),
        CommitOutcome::LeaseLost,
        "the old owner's answer is refused"
    );
    assert_eq!(
        store
            .complete(job, 1, "a", 1, r#""late but alone""#)
            .unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        store.complete(job, 0, "b", 2, r#""from b""#).unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(
        store.item(job, 0).unwrap().state,
        ItemState::Completed {
            result: r#""from b""#.into()
        }
    );
    // Wrong attempt number, same owner: refused too.
    let job2 = store.create_job(&spec(3), items(1)).unwrap();
    store.claim(job2, "a", at(0), LEASE, 1).unwrap();
    assert_eq!(
        store.complete(job2, 0, "a", 2, "1").unwrap(),
        CommitOutcome::LeaseLost
    );
    assert_eq!(store.progress(job).unwrap(), progress(2, 0, 0, 2, 0));
}

#[test]
fn an_item_whose_lease_keeps_expiring_fails() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let job = store.create_job(&spec(2), items(1)).unwrap();
    assert_eq!(
        store.claim(job, "a", at(0), LEASE, 1).unwrap()[0].attempt,
        1
    );
    assert_eq!(
        store.claim(job, "b", at(20), LEASE, 1).unwrap()[0].attempt,
        2
    );
    assert!(store.claim(job, "c", at(40), LEASE, 1).unwrap().is_empty());
    let item = store.item(job, 0).unwrap();
    assert!(
        matches!(&item.state, ItemState::Failed { error } if error.contains("lease expired")),
        "{item:?}"
    );
    assert_eq!(store.job(job).unwrap().status, JobStatus::Completed);
    assert_eq!(store.progress(job).unwrap(), progress(1, 0, 0, 0, 1));
}

#[test]
fn release_expired_returns_items_to_the_queue() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let a = store.create_job(&spec(3), items(3)).unwrap();
    let b = store.create_job(&spec(1), items(1)).unwrap();
    store.claim(a, "w", at(0), LEASE, 2).unwrap();
    store.claim(a, "w", at(8), LEASE, 1).unwrap();
    store.claim(b, "w", at(0), LEASE, 1).unwrap();
    assert_eq!(store.release_expired(at(5)).unwrap(), 0);
    assert_eq!(store.release_expired(at(12)).unwrap(), 3);
    assert_eq!(store.progress(a).unwrap(), progress(3, 2, 1, 0, 0));
    // b had one attempt only: failed, and so finished.
    assert_eq!(store.progress(b).unwrap(), progress(1, 0, 0, 0, 1));
    assert_eq!(store.job(b).unwrap().status, JobStatus::Completed);
    // The expired attempts count.
    assert_eq!(store.claim(a, "v", at(13), LEASE, 1).unwrap()[0].attempt, 2);
}

#[test]
fn resume_after_reopen_reruns_only_unfinished_items() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lcm.redb");
    let job;
    {
        let store = open(&path);
        job = store.create_job(&spec(3), items(10)).unwrap();
        let claimed = store.claim(job, "before-crash", at(0), LEASE, 4).unwrap();
        for c in &claimed[..2] {
            store
                .complete(job, c.index, &c.owner, c.attempt, "true")
                .unwrap();
        }
        // Crash: the store is dropped with items 2 and 3 running.
    }
    let store = open(&path);
    assert_eq!(store.progress(job).unwrap(), progress(10, 6, 2, 2, 0));
    let resumed = store.resume_all().unwrap();
    assert_eq!(resumed, vec![(job, 2)]);
    assert_eq!(store.progress(job).unwrap(), progress(10, 8, 0, 2, 0));
    // The interrupted attempt does not count.
    assert_eq!(store.item(job, 2).unwrap().attempts, 0);
    // The old owner's answer after the restart is refused.
    assert_eq!(
        store.complete(job, 2, "before-crash", 1, "1").unwrap(),
        CommitOutcome::LeaseLost
    );
    let claimed = store.claim(job, "after", at(1), LEASE, 100).unwrap();
    assert_eq!(
        claimed.iter().map(|c| c.index).collect::<Vec<_>>(),
        (2..10).collect::<Vec<_>>(),
        "completed items are not claimed again"
    );
    for c in &claimed {
        assert_eq!(c.attempt, 1);
        store
            .complete(job, c.index, &c.owner, c.attempt, "false")
            .unwrap();
    }
    let results: Vec<String> = store
        .items_in_order(job)
        .unwrap()
        .map(|i| match i.unwrap().state {
            ItemState::Completed { result } => result,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(results[..2], ["true", "true"]);
    assert!(results[2..].iter().all(|r| r == "false"));
    assert_eq!(store.job(job).unwrap().status, JobStatus::Completed);
}

#[test]
fn bad_lines_fail_at_creation_and_order_is_kept() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let input = vec![
        Ok(ItemInput {
            line: 1,
            content: ItemContent::Json("{\"a\":1}".into()),
        }),
        Ok(ItemInput {
            line: 3,
            content: ItemContent::Invalid("line 3 is not JSON: expected value".into()),
        }),
        Ok(ItemInput {
            line: 4,
            content: ItemContent::Json("{not json".into()),
        }),
        Ok(ItemInput {
            line: 5,
            content: ItemContent::Json("\"b\"".into()),
        }),
    ];
    let job = store.create_job(&spec(3), input).unwrap();
    assert_eq!(store.progress(job).unwrap(), progress(4, 2, 0, 0, 2));
    let all: Vec<_> = store
        .items_in_order(job)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        all.iter().map(|i| (i.index, i.line)).collect::<Vec<_>>(),
        [(0, 1), (1, 3), (2, 4), (3, 5)]
    );
    assert_eq!(
        all[1].state,
        ItemState::Failed {
            error: "line 3 is not JSON: expected value".into()
        }
    );
    assert!(matches!(&all[2].state, ItemState::Failed { error } if error.contains("line 4")));
    assert_eq!(all[1].attempts, 0);
    let claimed = store.claim(job, "a", at(0), LEASE, 10).unwrap();
    assert_eq!(claimed.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 3]);

    // Only bad lines, or none at all: complete at once.
    let bad = vec![Ok(ItemInput {
        line: 1,
        content: ItemContent::Invalid("line 1 is over the limit".into()),
    })];
    let job = store.create_job(&spec(3), bad).unwrap();
    assert_eq!(store.job(job).unwrap().status, JobStatus::Completed);
    let empty = store.create_job(&spec(3), items(0)).unwrap();
    assert_eq!(store.job(empty).unwrap().status, JobStatus::Completed);
    assert_eq!(store.progress(empty).unwrap(), MapProgress::default());
}

#[test]
fn a_large_job_is_written_in_batches_and_claims_skip_finished_items() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let n = 25_000;
    let job = store.create_job(&spec(3), items(n)).unwrap();
    assert_eq!(store.progress(job).unwrap(), progress(n, n, 0, 0, 0));
    // Finish all but the last 10 in a few big batches.
    let mut done = 0;
    while done < n - 10 {
        let claimed = store
            .claim(job, "w", at(0), LEASE, (n - 10 - done) as usize)
            .unwrap();
        let reports: Vec<ItemReport> = claimed
            .iter()
            .map(|c| ItemReport {
                index: c.index,
                owner: c.owner.clone(),
                attempt: c.attempt,
                outcome: ItemOutcome::Completed(c.payload.clone()),
            })
            .collect();
        let outcomes = store.commit_batch(job, &reports).unwrap();
        assert!(outcomes.iter().all(|o| *o == CommitOutcome::Committed));
        done += claimed.len() as u64;
    }
    let started = std::time::Instant::now();
    let claimed = store.claim(job, "w", at(1), LEASE, 100).unwrap();
    let took = started.elapsed();
    assert_eq!(
        claimed.iter().map(|c| c.index).collect::<Vec<_>>(),
        (n - 10..n).collect::<Vec<_>>()
    );
    // Reads the pending index only (generous bound for slow machines).
    assert!(took < Duration::from_secs(1), "claim took {took:?}");
    assert_eq!(store.progress(job).unwrap(), progress(n, 0, 10, n - 10, 0));
    assert_eq!(store.items_in_order(job).unwrap().count() as u64, n);
}

#[test]
fn an_input_error_leaves_no_job_behind() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let input = items(3).chain(std::iter::once(Err(std::io::Error::other("disk gone"))));
    let err = store.create_job(&spec(3), input).unwrap_err();
    assert!(
        matches!(&err, StoreError::Io { path, .. } if path == "/data/in.jsonl"),
        "{err}"
    );
    assert!(store.jobs().unwrap().is_empty());
    // Ids are not reused, and the next job works.
    let job = store.create_job(&spec(3), items(1)).unwrap();
    assert_eq!(store.jobs().unwrap().len(), 1);
    assert_eq!(store.job(job).unwrap().progress.total, 1);
}

#[test]
fn cancel_stops_claims_but_keeps_answers_already_paid_for() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let job = store.create_job(&spec(3), items(4)).unwrap();
    store.claim(job, "a", at(0), LEASE, 1).unwrap();
    let cancelled = store.cancel(job).unwrap();
    assert_eq!(cancelled.status, JobStatus::Cancelled);
    assert!(store.claim(job, "a", at(1), LEASE, 4).unwrap().is_empty());
    assert_eq!(
        store.complete(job, 0, "a", 1, "{}").unwrap(),
        CommitOutcome::Committed
    );
    assert_eq!(store.job(job).unwrap().status, JobStatus::Cancelled);
    assert_eq!(store.progress(job).unwrap(), progress(4, 3, 0, 1, 0));
    // Cancelling a finished job changes nothing.
    let other = store.create_job(&spec(3), items(0)).unwrap();
    assert_eq!(store.cancel(other).unwrap().status, JobStatus::Completed);
    // fail_job marks it failed with the reason.
    let third = store.create_job(&spec(3), items(2)).unwrap();
    let failed = store
        .fail_job(third, "the provider refused the key")
        .unwrap();
    assert_eq!(failed.status, JobStatus::Failed);
    assert_eq!(
        failed.error.as_deref(),
        Some("the provider refused the key")
    );
}

#[test]
fn release_gives_back_one_owners_items_without_counting_them() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    let job = store.create_job(&spec(3), items(4)).unwrap();
    store.claim(job, "a", at(0), LEASE, 2).unwrap();
    store.claim(job, "b", at(0), LEASE, 2).unwrap();
    assert_eq!(store.release(job, "a").unwrap(), 2);
    assert_eq!(store.progress(job).unwrap(), progress(4, 2, 2, 0, 0));
    assert_eq!(store.item(job, 0).unwrap().attempts, 0);
    assert_eq!(store.item(job, 2).unwrap().attempts, 1);
    assert_eq!(
        store.release_item(job, 2, "b", 1).unwrap(),
        CommitOutcome::Committed
    );
    let again = store.claim(job, "c", at(1), LEASE, 10).unwrap();
    assert_eq!(again.iter().map(|c| c.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(again.iter().all(|c| c.attempt == 1));
}

#[test]
fn reads_and_bad_calls_say_what_is_wrong() {
    let store = open(&tempfile::tempdir().unwrap().path().join("lcm.redb"));
    assert!(store.jobs().unwrap().is_empty());
    assert!(matches!(
        store.job(JobId(0)),
        Err(StoreError::JobNotFound(JobId(0)))
    ));
    assert!(matches!(
        store.items_in_order(JobId(3)),
        Err(StoreError::JobNotFound(_))
    ));
    assert!(matches!(
        store.create_job(&spec(0), items(1)),
        Err(StoreError::InvalidJob(_))
    ));
    let mut bad_schema = spec(1);
    bad_schema.output_schema = "{".into();
    assert!(matches!(
        store.create_job(&bad_schema, items(1)),
        Err(StoreError::InvalidJob(_))
    ));
    let job = store.create_job(&spec(1), items(1)).unwrap();
    assert_eq!(job, JobId(0));
    assert_eq!(job.to_string(), "job_0");
    store.claim(job, "a", at(0), LEASE, 1).unwrap();
    let err = store.complete(job, 0, "a", 1, "not json").unwrap_err();
    assert!(err.to_string().contains("not JSON"), "{err}");
    assert!(matches!(
        store.complete(job, 7, "a", 1, "1"),
        Err(StoreError::InvalidJob(_))
    ));
    assert!(store.delete_job(job).unwrap());
    assert!(!store.delete_job(job).unwrap());
    assert!(store.jobs().unwrap().is_empty());
}

// ------------------------------------------------------------------------------ model test

/// The reference: what every item should be after each operation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RefState {
    Pending,
    Running { owner: String, expires: i64 },
    Completed(String),
    Failed,
}

#[derive(Debug, Clone)]
struct RefItem {
    state: RefState,
    attempts: u32,
}

#[derive(Debug)]
struct Reference {
    items: Vec<RefItem>,
    max_attempts: u32,
    status: JobStatus,
}

impl Reference {
    fn new(n: usize, max_attempts: u32) -> Self {
        Reference {
            items: vec![
                RefItem {
                    state: RefState::Pending,
                    attempts: 0
                };
                n
            ],
            max_attempts,
            status: if n == 0 {
                JobStatus::Completed
            } else {
                JobStatus::Running
            },
        }
    }

    fn finish_if_done(&mut self) {
        let open = self
            .items
            .iter()
            .any(|i| matches!(i.state, RefState::Pending | RefState::Running { .. }));
        if self.status == JobStatus::Running && !open {
            self.status = JobStatus::Completed;
        }
    }

    fn claim(&mut self, owner: &str, now: i64, lease_ms: i64, max: usize) -> Vec<(u64, u32)> {
        let mut out = Vec::new();
        if self.status != JobStatus::Running || max == 0 {
            return out;
        }
        let max_attempts = self.max_attempts;
        for (index, item) in self.items.iter_mut().enumerate() {
            if out.len() >= max {
                break;
            }
            if let RefState::Running { expires, .. } = &item.state
                && *expires <= now
            {
                if item.attempts >= max_attempts {
                    item.state = RefState::Failed;
                } else {
                    item.attempts += 1;
                    item.state = RefState::Running {
                        owner: owner.into(),
                        expires: now + lease_ms,
                    };
                    out.push((index as u64, item.attempts));
                }
            }
        }
        for (index, item) in self.items.iter_mut().enumerate() {
            if out.len() >= max {
                break;
            }
            if item.state == RefState::Pending {
                item.attempts += 1;
                item.state = RefState::Running {
                    owner: owner.into(),
                    expires: now + lease_ms,
                };
                out.push((index as u64, item.attempts));
            }
        }
        self.finish_if_done();
        out
    }

    fn commit(
        &mut self,
        index: usize,
        owner: &str,
        attempt: u32,
        outcome: &ItemOutcome,
    ) -> CommitOutcome {
        let max_attempts = self.max_attempts;
        let item = &mut self.items[index];
        match &item.state {
            RefState::Completed(_) | RefState::Failed => return CommitOutcome::Duplicate,
            RefState::Running { owner: o, .. } if o == owner && item.attempts == attempt => {}
            _ => return CommitOutcome::LeaseLost,
        }
        match outcome {
            ItemOutcome::Completed(result) => item.state = RefState::Completed(result.clone()),
            ItemOutcome::Failed(failure) => {
                item.state =
                    if failure.kind == FailureKind::Permanent || item.attempts >= max_attempts {
                        RefState::Failed
                    } else {
                        RefState::Pending
                    };
            }
            ItemOutcome::Released => {
                item.attempts -= 1;
                item.state = RefState::Pending;
            }
        }
        self.finish_if_done();
        CommitOutcome::Committed
    }

    fn release_expired(&mut self, now: i64) -> usize {
        let mut moved = 0;
        for item in &mut self.items {
            if let RefState::Running { expires, .. } = &item.state
                && *expires <= now
            {
                moved += 1;
                item.state = if item.attempts >= self.max_attempts {
                    RefState::Failed
                } else {
                    RefState::Pending
                };
            }
        }
        self.finish_if_done();
        moved
    }

    fn resume(&mut self) -> usize {
        let mut moved = 0;
        for item in &mut self.items {
            if matches!(item.state, RefState::Running { .. }) {
                moved += 1;
                item.attempts -= 1;
                item.state = RefState::Pending;
            }
        }
        self.finish_if_done();
        moved
    }

    fn cancel(&mut self) {
        if !self.status.is_terminal() {
            self.status = JobStatus::Cancelled;
        }
    }

    fn progress(&self) -> MapProgress {
        let mut p = MapProgress {
            total: self.items.len() as u64,
            ..MapProgress::default()
        };
        for item in &self.items {
            match item.state {
                RefState::Pending => p.pending += 1,
                RefState::Running { .. } => p.running += 1,
                RefState::Completed(_) => p.completed += 1,
                RefState::Failed => p.failed += 1,
            }
        }
        p
    }
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        owner: u8,
        max: usize,
    },
    Complete {
        owner: u8,
        pick: usize,
        skew: i8,
    },
    Fail {
        owner: u8,
        pick: usize,
        skew: i8,
        kind: u8,
    },
    Release {
        owner: u8,
        pick: usize,
    },
    Advance {
        secs: i64,
    },
    ReleaseExpired,
    Reopen,
    Cancel,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 0usize..4).prop_map(|(owner, max)| Op::Claim { owner, max }),
        6 => (0u8..3, any::<usize>(), -1i8..=1).prop_map(|(owner, pick, skew)| Op::Complete { owner, pick, skew }),
        5 => (0u8..3, any::<usize>(), -1i8..=1, 0u8..3)
            .prop_map(|(owner, pick, skew, kind)| Op::Fail { owner, pick, skew, kind }),
        1 => (0u8..3, any::<usize>()).prop_map(|(owner, pick)| Op::Release { owner, pick }),
        4 => (0i64..16).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::ReleaseExpired),
        1 => Just(Op::Reopen),
        1 => prop_oneof![49 => Just(Op::Advance { secs: 0 }), 1 => Just(Op::Cancel)],
    ]
}

fn owner_name(owner: u8) -> String {
    format!("w{owner}")
}

/// The item `pick` points at, and the attempt a commit claims: its current attempt, or one off
/// it (`skew`) to play a stale or impossible claim.
fn target(reference: &Reference, pick: usize, skew: i8) -> (usize, u32) {
    let index = pick % reference.items.len();
    let attempt = reference.items[index]
        .attempts
        .saturating_add_signed(i32::from(skew));
    (index, attempt)
}

fn check(store: &Store, job: JobId, reference: &Reference) -> Result<(), TestCaseError> {
    let record = store.job(job).unwrap();
    prop_assert_eq!(record.status, reference.status);
    prop_assert_eq!(record.progress, reference.progress());
    for (item, expected) in store.items_in_order(job).unwrap().zip(&reference.items) {
        let item = item.unwrap();
        prop_assert_eq!(item.attempts, expected.attempts, "item {}", item.index);
        let matches = match (&item.state, &expected.state) {
            (ItemState::Pending, RefState::Pending) => true,
            (
                ItemState::Running {
                    owner,
                    lease_expires_at,
                },
                RefState::Running { owner: o, expires },
            ) => owner == o && lease_expires_at.0 == *expires,
            (ItemState::Completed { result }, RefState::Completed(r)) => result == r,
            (ItemState::Failed { .. }, RefState::Failed) => true,
            _ => false,
        };
        prop_assert!(
            matches,
            "item {}: store {:?}, reference {:?}",
            item.index,
            item.state,
            expected.state
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_the_reference(
        n in 1usize..7,
        max_attempts in 1u32..4,
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let mut store = open(&path);
        let job = store.create_job(&spec(max_attempts), items(n as u64)).unwrap();
        let mut reference = Reference::new(n, max_attempts);
        let lease_ms = LEASE.as_millis() as i64;
        let mut now = T0.0;
        for op in ops {
            match op {
                Op::Claim { owner, max } => {
                    let name = owner_name(owner);
                    let got: Vec<(u64, u32)> = store
                        .claim(job, &name, Timestamp(now), LEASE, max)
                        .unwrap()
                        .iter()
                        .map(|c| (c.index, c.attempt))
                        .collect();
                    prop_assert_eq!(got, reference.claim(&name, now, lease_ms, max));
                }
                Op::Complete { owner, pick, skew } => {
                    let (index, attempt) = target(&reference, pick, skew);
                    let name = owner_name(owner);
                    let result = format!("{{\"by\":\"{name}\",\"attempt\":{attempt}}}");
                    let got = store.complete(job, index as u64, &name, attempt, &result).unwrap();
                    let want = reference.commit(index, &name, attempt, &ItemOutcome::Completed(result));
                    prop_assert_eq!(got, want);
                }
                Op::Fail { owner, pick, skew, kind } => {
                    let (index, attempt) = target(&reference, pick, skew);
                    let name = owner_name(owner);
                    let kind = [FailureKind::InvalidOutput, FailureKind::Transient, FailureKind::Permanent][kind as usize];
                    let failure = ItemFailure::new(kind, "no");
                    let got = store.fail(job, index as u64, &name, attempt, failure.clone()).unwrap();
                    let want = reference.commit(index, &name, attempt, &ItemOutcome::Failed(failure));
                    prop_assert_eq!(got, want);
                }
                Op::Release { owner, pick } => {
                    let (index, attempt) = target(&reference, pick, 0);
                    let name = owner_name(owner);
                    let got = store.release_item(job, index as u64, &name, attempt).unwrap();
                    prop_assert_eq!(got, reference.commit(index, &name, attempt, &ItemOutcome::Released));
                }
                Op::Advance { secs } => now += secs * 1000,
                Op::ReleaseExpired => {
                    prop_assert_eq!(store.release_expired(Timestamp(now)).unwrap(), reference.release_expired(now));
                }
                Op::Reopen => {
                    drop(store);
                    store = open(&path);
                    prop_assert_eq!(store.resume(job).unwrap(), reference.resume());
                }
                Op::Cancel => {
                    store.cancel(job).unwrap();
                    reference.cancel();
                }
            }
            check(&store, job, &reference)?;
        }
    }
}
