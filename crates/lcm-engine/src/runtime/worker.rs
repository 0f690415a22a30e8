//! One-shot workers: a supervised actor that runs one task, reports its outcome to the actor
//! that started it, and stops.
//!
//! The compactor, the map worker pool and the delegation actor each run their long jobs (a
//! compaction, a map job's run, a sub-agent) in a child actor of this one shape, so that a panic
//! or a kill of one job is a supervision event of its parent, which retries it, instead of a
//! crash of the parent itself. [`OneShotWorker`] is that shape once; each parent only says what
//! the task is ([`OneShotTask`]) and what a worker's end means ([`WorkerExit`]).

use std::marker::PhantomData;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SpawnErr, SupervisionEvent};

/// The stop reason of a worker that ran its task and reported the outcome: its end is not a
/// failure.
const WORKER_DONE: &str = "done";

/// The work of a one-shot worker.
#[async_trait::async_trait]
pub(crate) trait OneShotTask: Send + 'static {
    /// What the task comes to.
    type Outcome: Send;

    /// Runs the task (once; a retry is a new worker with a new task).
    async fn run(&mut self) -> Self::Outcome;

    /// Hands `outcome` to the parent (a cast: the worker stops right after).
    fn report(&self, outcome: Self::Outcome);
}

/// The message that starts a worker's run, sent by [`spawn_worker`].
pub(crate) struct Run;

/// An actor that runs its [`OneShotTask`] once, reports, and stops with a normal end.
pub(crate) struct OneShotWorker<T>(PhantomData<fn() -> T>);

#[ractor::async_trait]
impl<T: OneShotTask> Actor for OneShotWorker<T> {
    type Msg = Run;
    type State = T;
    type Arguments = T;

    async fn pre_start(
        &self,
        _myself: ActorRef<Run>,
        task: T,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(task)
    }

    async fn handle(
        &self,
        myself: ActorRef<Run>,
        Run: Run,
        task: &mut T,
    ) -> Result<(), ActorProcessingErr> {
        let outcome = task.run().await;
        // Reported before the stop, so the parent has the outcome when it sees the end.
        task.report(outcome);
        myself.stop(Some(WORKER_DONE.into()));
        Ok(())
    }
}

/// Starts a worker for `task` under `supervisor` and starts its run; the worker's actor.
pub(crate) async fn spawn_worker<T: OneShotTask>(
    task: T,
    supervisor: ActorCell,
) -> Result<ActorRef<Run>, SpawnErr> {
    let (worker, _) =
        Actor::spawn_linked(None, OneShotWorker(PhantomData), task, supervisor).await?;
    // A worker that died between its start and this cast is a supervision event as any other.
    let _ = worker.cast(Run);
    Ok(worker)
}

/// How a worker ended, as its parent sees it in a supervision event.
pub(crate) enum WorkerExit {
    /// It ran its task and reported the outcome.
    Done(ActorCell),
    /// It panicked, failed, or was killed before reporting: the outcome is lost.
    Failed { worker: ActorCell, error: String },
}

impl WorkerExit {
    /// The end of a worker told by `event`; `None` for events that are not an end.
    pub(crate) fn of(event: SupervisionEvent) -> Option<WorkerExit> {
        match event {
            SupervisionEvent::ActorFailed(worker, error) => Some(WorkerExit::Failed {
                worker,
                error: error.to_string(),
            }),
            SupervisionEvent::ActorTerminated(worker, _, reason) => Some(match reason.as_deref() {
                Some(WORKER_DONE) => WorkerExit::Done(worker),
                _ => WorkerExit::Failed {
                    worker,
                    error: reason.unwrap_or_else(|| "killed".into()),
                },
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    /// A parent that forwards its workers' ends to the test.
    struct Parent;

    #[ractor::async_trait]
    impl Actor for Parent {
        type Msg = ();
        type State = mpsc::UnboundedSender<Result<(), String>>;
        type Arguments = mpsc::UnboundedSender<Result<(), String>>;

        async fn pre_start(
            &self,
            _myself: ActorRef<()>,
            ends: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(ends)
        }

        async fn handle_supervisor_evt(
            &self,
            _myself: ActorRef<()>,
            event: SupervisionEvent,
            ends: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            match WorkerExit::of(event) {
                Some(WorkerExit::Done(_)) => {
                    let _ = ends.send(Ok(()));
                }
                Some(WorkerExit::Failed { error, .. }) => {
                    let _ = ends.send(Err(error));
                }
                None => {}
            }
            Ok(())
        }
    }

    struct Task {
        panic: bool,
        outcomes: mpsc::UnboundedSender<u32>,
    }

    #[async_trait::async_trait]
    impl OneShotTask for Task {
        type Outcome = u32;

        async fn run(&mut self) -> u32 {
            assert!(!self.panic, "the task panicked");
            42
        }

        fn report(&self, outcome: u32) {
            let _ = self.outcomes.send(outcome);
        }
    }

    #[tokio::test]
    async fn a_worker_reports_its_outcome_then_ends_as_done() {
        let (ends_tx, mut ends) = mpsc::unbounded_channel();
        let (parent, parent_handle) = Actor::spawn(None, Parent, ends_tx).await.unwrap();
        let (outcomes_tx, mut outcomes) = mpsc::unbounded_channel();
        let task = Task {
            panic: false,
            outcomes: outcomes_tx,
        };
        spawn_worker(task, parent.get_cell()).await.unwrap();
        assert_eq!(outcomes.recv().await, Some(42));
        assert_eq!(ends.recv().await, Some(Ok(())));
        parent.stop(None);
        parent_handle.await.unwrap();
    }

    #[tokio::test]
    async fn a_worker_that_panics_is_a_failure_of_its_parent_to_handle_not_a_crash_of_it() {
        let (ends_tx, mut ends) = mpsc::unbounded_channel();
        let (parent, parent_handle) = Actor::spawn(None, Parent, ends_tx).await.unwrap();
        let (outcomes_tx, mut outcomes) = mpsc::unbounded_channel();
        let task = Task {
            panic: true,
            outcomes: outcomes_tx,
        };
        spawn_worker(task, parent.get_cell()).await.unwrap();
        let end = ends.recv().await.expect("an end");
        assert!(end.is_err(), "a failure: {end:?}");
        assert_eq!(outcomes.recv().await, None, "nothing reported");
        assert_eq!(parent.get_status(), ractor::ActorStatus::Running);
        parent.stop(None);
        parent_handle.await.unwrap();
    }
}
