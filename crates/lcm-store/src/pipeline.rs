//! Work cut into chunks that any thread may do, consumed in order by the thread that started it:
//! how a large append counts tokens on every core while its writing thread inserts, and how an
//! import parses lines on every core while its thread stores them.
//!
//! Helpers run on one process-wide pool ([`helper_pool`]). The consuming thread never waits for
//! a helper that has not started (the pool may be busy with another pipeline's chunks): when the
//! next chunk is not ready it does a chunk no one has claimed itself, and a helper that starts
//! late finds nothing left and returns.

use std::any::Any;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// Chunks of `I` turned into `O` by `work`, on the consuming thread and the helper pool.
pub(crate) struct OrderedPipeline<I, O> {
    work: Box<dyn Fn(I) -> O + Send + Sync>,
    state: Mutex<State<I, O>>,
    /// Signalled whenever a chunk is done (or a helper panicked).
    ready: Condvar,
}

struct State<I, O> {
    /// Chunks not yet claimed by a thread (taken on claim).
    inputs: Vec<Option<I>>,
    /// Done chunks the consuming thread has not taken yet.
    outputs: Vec<Option<O>>,
    /// The next chunk to claim.
    next: usize,
    /// Set when the consuming thread is done: helpers claim nothing more.
    stopped: bool,
    /// A helper's panic, resumed on the consuming thread.
    panic: Option<Box<dyn Any + Send>>,
}

impl<I: Send + 'static, O: Send + 'static> OrderedPipeline<I, O> {
    /// Shared: the consuming thread and each helper on the pool hold it.
    pub fn new(chunks: Vec<I>, work: impl Fn(I) -> O + Send + Sync + 'static) -> Arc<Self> {
        let outputs = chunks.iter().map(|_| None).collect();
        Arc::new(OrderedPipeline {
            work: Box::new(work),
            state: Mutex::new(State {
                inputs: chunks.into_iter().map(Some).collect(),
                outputs,
                next: 0,
                stopped: false,
                panic: None,
            }),
            ready: Condvar::new(),
        })
    }

    fn chunks(&self) -> usize {
        self.lock().outputs.len()
    }

    fn lock(&self) -> MutexGuard<'_, State<I, O>> {
        // Nothing panics while holding the lock, so a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next unclaimed chunk, if any and not stopped.
    fn claim(state: &mut State<I, O>) -> Option<(usize, I)> {
        if state.stopped || state.next >= state.inputs.len() {
            return None;
        }
        let index = state.next;
        state.next += 1;
        state.inputs[index].take().map(|chunk| (index, chunk))
    }

    /// A helper's loop: do chunks until none is left or the consumer stopped. Never panics (a
    /// panic in `work` is caught and handed to the consuming thread): the pool aborts the
    /// process on a panicking job.
    fn help(&self) {
        loop {
            let Some((index, chunk)) = Self::claim(&mut self.lock()) else {
                return;
            };
            let done =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.work)(chunk)));
            let mut state = self.lock();
            match done {
                Ok(done) => state.outputs[index] = Some(done),
                Err(panic) => {
                    state.panic = Some(panic);
                    state.stopped = true;
                }
            }
            drop(state);
            self.ready.notify_all();
        }
    }

    /// Chunk `index`, done (by a helper, or here while it is not ready).
    fn take(&self, index: usize) -> O {
        let mut state = self.lock();
        loop {
            if let Some(done) = state.outputs[index].take() {
                return done;
            }
            if let Some(panic) = state.panic.take() {
                drop(state);
                std::panic::resume_unwind(panic);
            }
            if let Some((claimed, chunk)) = Self::claim(&mut state) {
                drop(state);
                let done = (self.work)(chunk);
                if claimed == index {
                    return done;
                }
                state = self.lock();
                state.outputs[claimed] = Some(done);
                continue;
            }
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Does every chunk on this thread and up to `threads - 1` helpers, handing the results to
    /// `consume` in order on this thread. An error from `consume` ends the run (helpers stop
    /// after the chunk they are doing). Without a pool (the system refused its threads), this
    /// thread does every chunk.
    pub fn run<E>(
        self: Arc<Self>,
        threads: usize,
        mut consume: impl FnMut(O) -> Result<(), E>,
    ) -> Result<(), E> {
        if let Some(pool) = helper_pool() {
            for _ in 1..threads.min(self.chunks()) {
                let pipeline = Arc::clone(&self);
                pool.spawn(move || pipeline.help());
            }
        }
        let consumed = (0..self.chunks()).try_for_each(|chunk| consume(self.take(chunk)));
        self.lock().stopped = true;
        consumed
    }
}

/// The threads that help pipelines: `cores - 1` of them, started on first use and kept for the
/// life of the process, shared by every store in it. (A thread started for each append cost
/// about 7% of a batch of 1,000 on two cores: 3.96-4.10 ms against 3.69-3.80 ms with threads
/// kept, alternating runs of one example program.) `None`, after one warning, if the system
/// refuses the threads: consuming threads then do every chunk themselves.
pub(crate) fn helper_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let built = rayon::ThreadPoolBuilder::new()
            .num_threads(lcm_core::cores::cores().saturating_sub(1).max(1))
            .thread_name(|i| format!("lcm-helper-{i}"))
            .build();
        match built {
            Ok(pool) => Some(pool),
            Err(e) => {
                tracing::warn!(error = %e, "no helper threads; pipelines run on their consuming thread");
                None
            }
        }
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_whoever_does_the_chunks() {
        let chunks: Vec<Vec<u64>> = (0..200u64)
            .map(|k| (k * 10..k * 10 + 10).collect())
            .collect();
        let pipeline = OrderedPipeline::new(chunks, |chunk: Vec<u64>| {
            // Uneven work, so helpers and the consumer finish out of order.
            if chunk[0].is_multiple_of(30) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            chunk.iter().map(|v| v * 2).collect::<Vec<u64>>()
        });
        let mut seen = Vec::new();
        pipeline
            .run(4, |done| {
                seen.extend(done);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(seen, (0..2_000u64).map(|v| v * 2).collect::<Vec<_>>());
    }

    #[test]
    fn an_error_from_the_consumer_ends_the_run_with_that_error() {
        let chunks: Vec<u32> = (0..100).collect();
        let pipeline = OrderedPipeline::new(chunks, |k: u32| k);
        let mut consumed = 0;
        let result = pipeline.run(2, |k| {
            consumed += 1;
            if k == 7 {
                Err(format!("stop at {k}"))
            } else {
                Ok(())
            }
        });
        assert_eq!(result, Err("stop at 7".to_owned()));
        assert_eq!(consumed, 8);
    }

    #[test]
    fn a_panic_in_the_work_reaches_the_consuming_thread() {
        let chunks: Vec<u32> = (0..64).collect();
        let pipeline = OrderedPipeline::new(chunks, |k: u32| {
            assert!(k != 40, "chunk 40 is bad");
            k
        });
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pipeline.run(2, |_| Ok::<(), ()>(()))
        }));
        let panic = outcome.expect_err("the panic is resumed");
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        assert!(message.contains("chunk 40 is bad"), "{message}");
    }
}
