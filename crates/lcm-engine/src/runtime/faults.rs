//! Test-only fault injection: make a named actor panic or stall at a named point.
//!
//! A [`Faults`] plan belongs to one runtime (so parallel tests never see each other's faults).
//! Actors call [`Faults::hit`] (in blocking code) or [`Faults::hit_async`] (in async code) at each
//! [`FaultPoint`]. Without the `fault-injection` cargo feature both are empty inline functions and
//! [`Faults`] holds nothing: release builds carry no trace of the mechanism. Test targets of the
//! workspace enable the feature through the root package's dev-dependencies.

use std::fmt;

use lcm_core::ids::SessionId;
#[cfg(feature = "fault-injection")]
use std::sync::Mutex;
use std::time::Duration;

/// Where a fault can be injected. Each actor kind has points around its commits and its long
/// calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// SessionActor: an append, before its redb transaction commits.
    SessionBeforeCommit,
    /// SessionActor: an append, after its redb transaction committed, before the reply.
    SessionAfterCommit,
    /// AssemblerActor: in the middle of assembling a context.
    AssemblerMidAssembly,
    /// Compaction worker (CompactorActor's child): during a summariser call.
    CompactorMidLlmCall,
    /// Compaction worker: a summary prepared, before its redb transaction.
    CompactorBeforeCommit,
    /// Compaction worker: after a summary's transaction committed.
    CompactorAfterCommit,
    /// CompactorActor itself (not a worker): a session's request recorded, before a worker is
    /// started for it. The actor's crash loses its queue and kills its running workers.
    CompactorActorOnRequest,
    /// CompactorActor itself: a worker's result received (its passes committed), before it is
    /// sent on to the session.
    CompactorActorOnFinished,
    /// IntegrityActor: during a check.
    IntegrityMidCheck,
    /// Search indexer: before an index commit.
    IndexerBeforeCommit,
    /// MapWorkerPool worker: during an item's provider call.
    MapWorkerMidLlmCall,
    /// MapWorkerPool worker: before an item's result is committed.
    MapWorkerBeforeCommit,
    /// MapWorkerPool worker: after an item's result was committed.
    MapWorkerAfterCommit,
    /// MapWorkerPool itself: handling the end of a job's run, before its waiters are answered.
    MapPoolOnEnded,
    /// DelegationActor: during a sub-agent's provider call.
    DelegationMidLlmCall,
    /// DelegationActor itself (not a worker): a run's child session created, before its worker
    /// starts. Other sub-agents may be in flight; the crash kills their workers.
    DelegationActorBeforeWorker,
    /// DelegationActor itself: a sub-agent's result received, before its caller is answered.
    DelegationActorBeforeReply,
}

impl fmt::Display for FaultPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// What happens at an armed point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The actor panics (a supervision event; the supervisor restarts it).
    Panic,
    /// The actor sleeps this long (the supervisor's stall detection may kill it).
    Stall(Duration),
}

/// A runtime's fault plan (see the module docs).
#[derive(Default)]
pub struct Faults {
    #[cfg(feature = "fault-injection")]
    armed: Mutex<Vec<Armed>>,
}

#[cfg(feature = "fault-injection")]
struct Armed {
    point: FaultPoint,
    /// Only hits on behalf of this session (any when `None`).
    session: Option<SessionId>,
    fault: Fault,
    /// Hits of the point to let pass before the first fault.
    skip: u32,
    /// Faults left to inject.
    remaining: u32,
    /// Faults injected so far.
    fired: u32,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Faults")
    }
}

impl Faults {
    /// Arms `point`: after `skip` hits, the next `times` hits inject `fault`.
    #[cfg(feature = "fault-injection")]
    pub fn arm(&self, point: FaultPoint, fault: Fault, skip: u32, times: u32) {
        self.arm_for(point, None, fault, skip, times);
    }

    /// Like [`Faults::arm`], counting only hits on behalf of `session` (when given).
    #[cfg(feature = "fault-injection")]
    pub fn arm_for(
        &self,
        point: FaultPoint,
        session: Option<SessionId>,
        fault: Fault,
        skip: u32,
        times: u32,
    ) {
        self.lock().push(Armed {
            point,
            session,
            fault,
            skip,
            remaining: times,
            fired: 0,
        });
    }

    /// How many faults were injected at `point` so far.
    #[cfg(feature = "fault-injection")]
    pub fn fired(&self, point: FaultPoint) -> u32 {
        self.lock()
            .iter()
            .filter(|a| a.point == point)
            .map(|a| a.fired)
            .sum()
    }

    /// Disarms every point.
    #[cfg(feature = "fault-injection")]
    pub fn clear(&self) {
        self.lock().clear();
    }

    #[cfg(feature = "fault-injection")]
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Armed>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fault to inject now at `point`, if any (counts the hit).
    #[cfg(feature = "fault-injection")]
    fn take(&self, point: FaultPoint, session: Option<SessionId>) -> Option<Fault> {
        let mut armed = self.lock();
        let a = armed.iter_mut().find(|a| {
            a.point == point && a.remaining > 0 && (a.session.is_none() || a.session == session)
        })?;
        if a.skip > 0 {
            a.skip -= 1;
            return None;
        }
        a.remaining -= 1;
        a.fired += 1;
        Some(a.fault)
    }

    /// Injects the armed fault at `point` (on behalf of `session`) from blocking code.
    #[inline(always)]
    pub fn hit(&self, point: FaultPoint, session: Option<SessionId>) {
        #[cfg(feature = "fault-injection")]
        match self.take(point, session) {
            Some(Fault::Panic) => panic!("injected fault at {point}"),
            Some(Fault::Stall(d)) => std::thread::sleep(d),
            None => {}
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = (point, session);
    }

    /// Injects the armed fault at `point` (on behalf of `session`) from async code.
    #[inline(always)]
    pub async fn hit_async(&self, point: FaultPoint, session: Option<SessionId>) {
        #[cfg(feature = "fault-injection")]
        match self.take(point, session) {
            Some(Fault::Panic) => panic!("injected fault at {point}"),
            Some(Fault::Stall(d)) => tokio::time::sleep(d).await,
            None => {}
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = (point, session);
    }
}

#[cfg(not(feature = "fault-injection"))]
const _: () = assert!(std::mem::size_of::<Faults>() == 0);

#[cfg(all(test, feature = "fault-injection"))]
mod tests {
    use super::*;

    #[test]
    fn skip_then_fire_a_bounded_number_of_times() {
        let faults = Faults::default();
        faults.arm(
            FaultPoint::SessionBeforeCommit,
            Fault::Stall(Duration::ZERO),
            2,
            3,
        );
        for _ in 0..10 {
            faults.hit(FaultPoint::SessionBeforeCommit, None);
            faults.hit(FaultPoint::SessionAfterCommit, None);
        }
        assert_eq!(faults.fired(FaultPoint::SessionBeforeCommit), 3);
        assert_eq!(faults.fired(FaultPoint::SessionAfterCommit), 0);
    }

    #[test]
    fn panic_fault_panics_with_the_point_name() {
        let faults = Faults::default();
        faults.arm(FaultPoint::IntegrityMidCheck, Fault::Panic, 0, 1);
        let err = std::panic::catch_unwind(|| faults.hit(FaultPoint::IntegrityMidCheck, None))
            .expect_err("armed point panics");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("IntegrityMidCheck"), "{msg}");
        // Fired once: the next hit passes.
        faults.hit(FaultPoint::IntegrityMidCheck, None);
    }

    #[test]
    fn scoped_faults_only_hit_their_session() {
        let faults = Faults::default();
        let s = Some(SessionId(7));
        faults.arm_for(
            FaultPoint::SessionBeforeCommit,
            s,
            Fault::Stall(Duration::ZERO),
            0,
            5,
        );
        faults.hit(FaultPoint::SessionBeforeCommit, Some(SessionId(8)));
        faults.hit(FaultPoint::SessionBeforeCommit, None);
        assert_eq!(faults.fired(FaultPoint::SessionBeforeCommit), 0);
        faults.hit(FaultPoint::SessionBeforeCommit, s);
        assert_eq!(faults.fired(FaultPoint::SessionBeforeCommit), 1);
    }
}
