//! The one retry policy for calls into the runtime's actors.
//!
//! An actor that dies with a request in its mailbox drops the reply port: the caller learns the
//! request was lost, not what happened to it. For an idempotent request (reading a context, an
//! append whose messages all carry a source key) the runtime asks again, because the supervisor
//! is already starting the actor's successor. A call to a session's actor goes through
//! [`retry_until`], with the same policy:
//!
//! - a lost request is asked again after [`LOST_CALL_PAUSE`] (the root then checks the
//!   session's actor and starts a successor);
//! - an actor waiting out its restart backoff is asked again once the backoff is over;
//! - anything else (an answer, a timeout, a refusal) ends the call at once;
//! - the call's deadline (`runtime.call_timeout_s` from its start) bounds it all: when the next
//!   attempt would start past it, the last attempt's error is returned.
//!
//! A call to a singleton (compactor, indexer, ...) needs no pause: its successor is put in the
//! singleton's slot, a watch channel, and the caller waits on the slot for an actor other than
//! the one that died (`Slot::ask` in [`super::shared`]).

use std::future::Future;
use std::time::{Duration, Instant};

/// The pause before a lost request is sent again: long enough for a dead session actor's status
/// to say so when the root looks it up, short enough not to be noticed.
pub(crate) const LOST_CALL_PAUSE: Duration = Duration::from_millis(2);

/// What one attempt of a retried call came to.
#[derive(Debug)]
pub(crate) enum Attempt<T, E> {
    /// The call is over: its answer, or an error that asking again would not change.
    Done(Result<T, E>),
    /// Worth asking again after `after`; `error` is the call's answer if there is no time left.
    Again { after: Duration, error: E },
}

impl<T, E> Attempt<T, E> {
    /// The request was lost with the actor that held it: ask again after [`LOST_CALL_PAUSE`].
    pub(crate) fn lost(error: E) -> Attempt<T, E> {
        Attempt::Again {
            after: LOST_CALL_PAUSE,
            error,
        }
    }
}

/// Runs `attempt` until it is done, or until the next attempt would start after `deadline`:
/// then the last attempt's error is returned.
pub(crate) async fn retry_until<T, E, F, Fut>(deadline: Instant, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt<T, E>>,
{
    loop {
        match attempt().await {
            Attempt::Done(result) => return result,
            Attempt::Again { after, error } => {
                if Instant::now() + after >= deadline {
                    return Err(error);
                }
                tokio::time::sleep(after).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_ends_the_call_at_once() {
        let mut calls = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer: Result<u32, String> = retry_until(deadline, || {
            calls += 1;
            async { Attempt::Done(Ok(7)) }
        })
        .await;
        assert_eq!(answer, Ok(7));
        assert_eq!(calls, 1);
    }

    #[tokio::test]
    async fn a_lost_request_is_asked_again_until_it_is_answered() {
        let mut calls = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer: Result<u32, String> = retry_until(deadline, || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Attempt::lost(format!("lost {n}"))
                } else {
                    Attempt::Done(Ok(n))
                }
            }
        })
        .await;
        assert_eq!(answer, Ok(3));
    }

    #[tokio::test]
    async fn an_error_that_is_not_worth_retrying_is_returned_at_once() {
        let mut calls = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        let answer: Result<u32, String> = retry_until(deadline, || {
            calls += 1;
            async { Attempt::Done(Err("refused".to_string())) }
        })
        .await;
        assert_eq!(answer, Err("refused".to_string()));
        assert_eq!(calls, 1);
    }

    #[tokio::test]
    async fn it_gives_up_at_the_deadline_with_the_last_error() {
        let mut calls = 0u32;
        let started = Instant::now();
        let deadline = started + Duration::from_millis(50);
        let answer: Result<u32, String> = retry_until(deadline, || {
            calls += 1;
            let n = calls;
            async move { Attempt::lost(format!("lost {n}")) }
        })
        .await;
        assert_eq!(answer, Err(format!("lost {calls}")), "the last error");
        assert!(calls > 1, "retried before giving up");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn a_backoff_past_the_deadline_is_not_waited_out() {
        let mut calls = 0;
        let started = Instant::now();
        let deadline = started + Duration::from_millis(100);
        let answer: Result<u32, &str> = retry_until(deadline, || {
            calls += 1;
            async {
                Attempt::Again {
                    after: Duration::from_secs(30),
                    error: "restarting",
                }
            }
        })
        .await;
        assert_eq!(answer, Err("restarting"));
        assert_eq!(calls, 1);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
