//! `GET /v1/maps/{job}/events`: a map job's progress as server-sent events.
//!
//! The stream subscribes to the runtime's events before reading the job, so nothing between
//! the two is missed. It sends:
//!
//! - `job`: the job's record (status, progress) first, again after a `map_finished`, whenever
//!   the subscription lagged behind (events were missed), and when the job ended without an
//!   event (cancelled);
//! - `map_progress` / `map_finished`: the runtime's [`RuntimeEvent`]s for this job, as JSON.
//!
//! It ends when the job is over (completed, cancelled or failed), or when the server shuts
//! down; comments keep idle connections alive.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use lcm_core::ids::JobId;
use lcm_engine::runtime::RuntimeEvent;
use lcm_store::MapJob;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};

use crate::error::{ApiError, PathParams};
use crate::handlers::parse_job;
use crate::state::AppState;

/// How often the stream rereads the job when no event comes (a cancellation has no event).
const POLL: Duration = Duration::from_secs(1);

struct JobStream {
    state: AppState,
    job: JobId,
    events: broadcast::Receiver<RuntimeEvent>,
    shutdown: watch::Receiver<bool>,
    queue: VecDeque<Event>,
    done: bool,
}

pub(crate) async fn map_events(
    State(state): State<AppState>,
    PathParams(job): PathParams<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let job = parse_job(&job)?;
    let events = state.runtime().subscribe();
    let record = state.blocking(move |store| Ok(store.job(job)?)).await?;
    let mut stream = JobStream {
        shutdown: state.inner.shutdown.clone(),
        state,
        job,
        events,
        queue: VecDeque::new(),
        done: false,
    };
    stream.push_record(&record);
    let stream = futures_util::stream::unfold(stream, |mut s| async move {
        loop {
            if let Some(event) = s.queue.pop_front() {
                return Some((Ok(event), s));
            }
            if s.done {
                return None;
            }
            s.next_events().await;
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

impl JobStream {
    /// Queues a `job` event; a job that is over ends the stream.
    fn push_record(&mut self, record: &MapJob) {
        self.queue.push_back(event("job", record));
        if record.status.is_terminal() {
            self.done = true;
        }
    }

    /// Rereads the job and queues it (`only_if_over`: only when it is over).
    async fn refresh(&mut self, only_if_over: bool) {
        let job = self.job;
        match self.state.blocking(move |store| Ok(store.job(job)?)).await {
            Ok(record) if !only_if_over || record.status.is_terminal() => self.push_record(&record),
            Ok(_) => {}
            Err(error) => {
                self.queue.push_back(
                    Event::default()
                        .event("error")
                        .data(error.body().to_string()),
                );
                self.done = true;
            }
        }
    }

    /// Waits for the next thing worth sending (or the end).
    async fn next_events(&mut self) {
        enum Wake {
            Event(Result<RuntimeEvent, RecvError>),
            Tick,
            Shutdown,
        }
        let wake = tokio::select! {
            received = self.events.recv() => Wake::Event(received),
            _ = tokio::time::sleep(POLL) => Wake::Tick,
            _ = self.shutdown.wait_for(|closing| *closing) => Wake::Shutdown,
        };
        match wake {
            Wake::Event(Ok(e @ RuntimeEvent::MapProgress { job, .. })) if job == self.job => {
                self.queue.push_back(event("map_progress", &e));
            }
            Wake::Event(Ok(e @ RuntimeEvent::MapFinished { job, .. })) if job == self.job => {
                self.queue.push_back(event("map_finished", &e));
                self.refresh(false).await;
                // The run ended: whatever the record says, nothing more will come.
                self.done = true;
            }
            Wake::Event(Ok(_)) => {}
            Wake::Event(Err(RecvError::Lagged(_))) => self.refresh(false).await,
            Wake::Event(Err(RecvError::Closed)) => {
                self.refresh(false).await;
                self.done = true;
            }
            Wake::Tick => self.refresh(true).await,
            Wake::Shutdown => {
                self.queue
                    .push_back(Event::default().event("shutdown").data(
                        r#"{"message":"the server is shutting down; reconnect to follow the job"}"#,
                    ));
                self.done = true;
            }
        }
    }
}

fn event(name: &str, value: &impl serde::Serialize) -> Event {
    let data = serde_json::to_string(value)
        .unwrap_or_else(|e| format!(r#"{{"error":"serialisation","message":"{e}"}}"#));
    Event::default().event(name).data(data)
}
