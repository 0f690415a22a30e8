//! Group commit: one writer thread turns many sessions' appends into few durable transactions.
//!
//! redb has one writer at a time and a durable commit costs an fsync, so 200 sessions appending
//! at once would queue 200 fsyncs. Session actors instead tokenise their messages themselves
//! ([`Store::prepare_append`], in parallel on the blocking pool) and hand the prepared batch to
//! this thread, which commits everything that arrived while the previous commit ran in one
//! transaction ([`Store::commit_prepared`]) and answers each caller. A lone append pays one
//! channel hop over a direct commit; under load, one fsync serves many appends.
//!
//! A batch that fails (a session that does not exist) fails alone: the group is retried batch
//! by batch, so one caller's bad input never fails another's append.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use lcm_store::{Appended, PreparedAppend, Store, StoreError};
use tokio::sync::oneshot;

/// Most prepared batches committed in one transaction.
const MAX_GROUP: usize = 512;

type Reply = oneshot::Sender<Result<Vec<Appended>, StoreError>>;

struct Request {
    batch: PreparedAppend,
    reply: Reply,
}

/// Handle to the writer thread; the thread stops once [`GroupWriter::close`] is called (or the
/// handle dropped) and the requests already sent are committed.
pub(crate) struct GroupWriter {
    tx: Mutex<Option<mpsc::Sender<Request>>>,
}

impl GroupWriter {
    /// Starts the writer thread for `store`.
    pub(crate) fn start(
        store: Arc<Store>,
    ) -> std::io::Result<(GroupWriter, std::thread::JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel::<Request>();
        let thread = std::thread::Builder::new()
            .name("lcm-writer".into())
            .spawn(move || run(&store, &rx))?;
        Ok((
            GroupWriter {
                tx: Mutex::new(Some(tx)),
            },
            thread,
        ))
    }

    /// Commits `batch` (durably) with whatever else is waiting.
    pub(crate) async fn commit(&self, batch: PreparedAppend) -> Result<Vec<Appended>, StoreError> {
        let (reply, answer) = oneshot::channel();
        {
            let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            let tx = tx.as_ref().ok_or_else(writer_gone)?;
            tx.send(Request { batch, reply })
                .map_err(|_| writer_gone())?;
        }
        answer.await.map_err(|_| writer_gone())?
    }

    /// Takes no more requests; the thread ends after committing what it has.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

fn writer_gone() -> StoreError {
    StoreError::InvalidMessage(
        "the runtime's writer has stopped (the runtime is shutting down)".into(),
    )
}

fn run(store: &Store, rx: &mpsc::Receiver<Request>) {
    while let Ok(first) = rx.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(next) => group.push(next),
                Err(_) => break,
            }
        }
        commit_group(store, group);
    }
}

fn commit_group(store: &Store, group: Vec<Request>) {
    if group.len() == 1 {
        let Some(Request { batch, reply }) = group.into_iter().next() else {
            return;
        };
        let result = guarded(|| store.commit_prepared(vec![batch]))
            .map(|mut out| out.pop().unwrap_or_default());
        let _ = reply.send(result);
        return;
    }
    // Check sessions up front, so that a batch for a missing session fails alone instead of
    // failing the whole group's transaction.
    let (ok, bad): (Vec<Request>, Vec<Request>) = group
        .into_iter()
        .partition(|r| sessions_exist(store, &r.batch));
    for r in bad {
        let missing = r
            .batch
            .sessions()
            .into_iter()
            .find(|s| store.session(*s).is_err());
        let _ = r.reply.send(Err(match missing {
            Some(s) => StoreError::SessionNotFound(s),
            None => writer_gone(),
        }));
    }
    if ok.is_empty() {
        return;
    }
    let (batches, replies): (Vec<PreparedAppend>, Vec<Reply>) =
        ok.into_iter().map(|r| (r.batch, r.reply)).unzip();
    match guarded(|| store.commit_prepared(batches)) {
        Ok(results) => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Ok(result));
            }
        }
        Err(error) => {
            // The batches were consumed by the failed transaction (nothing was written): every
            // caller gets the error and may retry.
            let message = error.to_string();
            for reply in replies {
                let _ = reply.send(Err(StoreError::InvalidMessage(format!(
                    "group commit failed, nothing written: {message}"
                ))));
            }
        }
    }
}

fn sessions_exist(store: &Store, batch: &PreparedAppend) -> bool {
    batch
        .sessions()
        .into_iter()
        .all(|s| store.session(s).is_ok())
}

/// Runs a store call; a panic inside it becomes an error instead of killing the writer thread.
fn guarded<T>(f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(StoreError::InvalidMessage(
            "the store panicked during a commit; nothing was written".into(),
        ))
    })
}
