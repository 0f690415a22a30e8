//! Group commit: one writer thread turns many sessions' appends into few durable transactions.
//!
//! redb has one writer at a time and a durable commit costs an fsync, so 200 sessions appending
//! at once would queue 200 fsyncs. Session actors instead tokenise their messages themselves
//! ([`Store::prepare_append`], in parallel on the blocking pool) and hand the prepared batch to
//! this thread, which commits everything that arrived while the previous commit ran in one
//! transaction ([`Store::commit_prepared`]) and answers each caller. A lone append pays one
//! channel hop over a direct commit; under load, one fsync serves many appends.
//!
//! A batch that fails (a session that does not exist) fails alone: sessions are checked before
//! the group's transaction, so one caller's bad input never fails another's append. A
//! transaction that fails for every batch (a full or failing disk) is the store's failure, not
//! the callers': each gets [`StoreError::CommitFailed`], never an invalid-input error.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use lcm_store::{Appended, PreparedAppend, Store, StoreError};
use tokio::sync::oneshot;

use super::error::RuntimeError;
use super::supervision::ActorKind;

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

    /// Commits `batch` (durably) with whatever else is waiting. A closed writer refuses with
    /// [`RuntimeError::ShuttingDown`]; a writer thread that died, with
    /// [`RuntimeError::Unavailable`].
    pub(crate) async fn commit(
        &self,
        batch: PreparedAppend,
    ) -> Result<Vec<Appended>, RuntimeError> {
        let (reply, answer) = oneshot::channel();
        {
            let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            let tx = tx.as_ref().ok_or(RuntimeError::ShuttingDown)?;
            tx.send(Request { batch, reply })
                .map_err(|_| writer_died())?;
        }
        Ok(answer.await.map_err(|_| writer_died())??)
    }

    /// Takes no more requests; the thread ends after committing what it has.
    pub(crate) fn close(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

/// The writer thread ended while the runtime was open (a panic outside a commit).
fn writer_died() -> RuntimeError {
    RuntimeError::Unavailable {
        kind: ActorKind::Runtime,
        detail: "its group-commit writer thread stopped".into(),
    }
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
    let mut ok = Vec::with_capacity(group.len());
    for r in group {
        match session_error(store, &r.batch) {
            None => ok.push(r),
            Some(error) => {
                let _ = r.reply.send(Err(error));
            }
        }
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
            // caller gets the store's failure (an error is not `Clone`: its text) and may retry.
            let detail = format!(
                "the group commit of {} batches failed: {error}",
                replies.len()
            );
            let disk_full = error.is_disk_full();
            for reply in replies {
                let _ = reply.send(Err(StoreError::CommitFailed {
                    detail: detail.clone(),
                    disk_full,
                }));
            }
        }
    }
}

/// Why `batch` cannot be committed before any transaction opens: a session it appends to is
/// missing (or cannot be read).
fn session_error(store: &Store, batch: &PreparedAppend) -> Option<StoreError> {
    batch
        .sessions()
        .into_iter()
        .find_map(|s| store.session(s).err())
}

/// Runs a store call; a panic inside it becomes an error instead of killing the writer thread.
fn guarded<T>(f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(StoreError::CommitFailed {
            detail: "the store panicked during the commit".into(),
            disk_full: false,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::ids::SessionId;
    use lcm_core::message::{NewMessage, Role};
    use lcm_core::tokens::{Encoding, TokenCounter};
    use lcm_store::StoreOptions;
    use lcm_store::disk_faults::DiskSwitch;

    type Answer = oneshot::Receiver<Result<Vec<Appended>, StoreError>>;

    fn request(store: &Store, session: SessionId, text: &str) -> (Request, Answer) {
        let batch = store
            .prepare_append(vec![(session, NewMessage::text(Role::User, text))])
            .unwrap();
        let (reply, answer) = oneshot::channel();
        (Request { batch, reply }, answer)
    }

    fn options() -> StoreOptions {
        StoreOptions::new(TokenCounter::new(Encoding::O200kBase))
    }

    #[test]
    fn a_group_commit_on_a_full_disk_fails_every_batch_as_a_storage_failure() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lcm.redb");
        let disk = DiskSwitch::default();
        let store = Store::open_on_faulty_disk(&path, options(), disk.clone()).unwrap();
        let sessions = [
            store.create_session("a", None).unwrap(),
            store.create_session("b", None).unwrap(),
        ];
        let (group, answers): (Vec<Request>, Vec<Answer>) = sessions
            .iter()
            .map(|s| request(&store, *s, "acknowledged"))
            .unzip();
        commit_group(&store, group);
        for mut answer in answers {
            assert!(answer.try_recv().unwrap().is_ok());
        }

        disk.fill();
        let (group, answers): (Vec<Request>, Vec<Answer>) = sessions
            .iter()
            .map(|s| request(&store, *s, "refused by the disk"))
            .unzip();
        commit_group(&store, group);
        for mut answer in answers {
            match answer.try_recv().unwrap() {
                Err(StoreError::CommitFailed { detail, .. }) => {
                    assert!(detail.contains("group commit"), "{detail}")
                }
                other => panic!("expected CommitFailed, got {other:?}"),
            }
        }
        drop(store);

        // What was acknowledged before the disk filled is all there.
        let store = Store::open(&path, options()).unwrap();
        for session in sessions {
            let messages = store.session_messages(session, 0..10).unwrap();
            assert_eq!(messages.len(), 1);
            assert!(messages[0].search_text().contains("acknowledged"));
        }
    }

    #[test]
    fn a_batch_for_a_missing_session_fails_alone_with_its_own_error() {
        let store = Store::open_in_memory(options()).unwrap();
        let kept = store.create_session("kept", None).unwrap();
        let (good, mut good_answer) = request(&store, kept, "stored");
        let missing = SessionId(kept.0 + 1_000);
        let (bad, mut bad_answer) = request(&store, missing, "not stored");
        commit_group(&store, vec![good, bad]);
        assert!(good_answer.try_recv().unwrap().is_ok());
        assert!(matches!(
            bad_answer.try_recv().unwrap(),
            Err(StoreError::SessionNotFound(s)) if s == missing
        ));
    }
}
