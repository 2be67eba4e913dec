//! How a session's runtime comes by its [`Lease`]: handed down by the host
//! that claimed it, claimed here for a node, or taken over in one process;
//! and, with several nodes, who renews it and when it was last renewed.
//!
//! Writes are fenced by the store (a stale epoch is refused in the
//! committing transaction), but a tool's side effect is not a write: a node
//! paused after recording `tool_call_started` could, once resumed, start a
//! command under a lease another node has since taken. So a node starts no
//! tool call once its lease may have lapsed ([`LeaseClock::fresh`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keel_store::{CheckpointStore, Lease, LeaseStore, StoreError};

/// The node that holds a session's [`Lease`] and renews it: a session it
/// creates is claimed for it ([`LeaseStore::claim`]) instead of taken over
/// unconditionally ([`CheckpointStore::acquire`]), and no tool call starts
/// once the lease may have lapsed.
#[derive(Clone)]
pub struct LeaseOwner {
    /// The node's id, unique among the live nodes.
    pub node: String,
    /// How long a lease lasts without a renewal.
    pub ttl: Duration,
    /// When this session's lease was last known to be renewed; the node
    /// that renews it moves it on ([`LeaseClock::renewed_at`]).
    pub clock: LeaseClock,
    /// Where the node's leases are claimed: the store the session is in.
    pub leases: Arc<dyn LeaseStore>,
}

impl std::fmt::Debug for LeaseOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseOwner")
            .field("node", &self.node)
            .field("ttl", &self.ttl)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

/// Of a lease's time to live, the part within which a tool call may still
/// start: the rest is margin for the time between the check and the start,
/// and for clocks that run at slightly different rates.
const START_WITHIN: (u32, u32) = (3, 4);

/// When a lease was last known to be extended: the instant *before* its
/// claim or its latest successful renewal was sent, so the lease lasts at
/// least its time to live from there. Shared by the runtime (which reads
/// it) and the node's renewal loop (which moves it on).
#[derive(Debug, Clone)]
pub struct LeaseClock {
    origin: Instant,
    /// Milliseconds from `origin` to the last known extension.
    renewed_ms: Arc<AtomicU64>,
}

impl LeaseClock {
    /// A clock renewed now: make it before the lease is claimed.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            renewed_ms: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Records an extension sent at `sent` (never moves the clock back).
    pub fn renewed_at(&self, sent: Instant) {
        let ms = u64::try_from(sent.saturating_duration_since(self.origin).as_millis()).unwrap_or(u64::MAX);
        self.renewed_ms.fetch_max(ms, Ordering::AcqRel);
    }

    /// Time since the last known extension.
    pub fn since_renewal(&self) -> Duration {
        let renewed = self.origin + Duration::from_millis(self.renewed_ms.load(Ordering::Acquire));
        Instant::now().saturating_duration_since(renewed)
    }

    /// Whether a tool call may start under a lease of `ttl`: the lease was
    /// extended within the first three quarters of it.
    pub fn fresh(&self, ttl: Duration) -> bool {
        self.since_renewal() < ttl * START_WITHIN.0 / START_WITHIN.1
    }
}

impl Default for LeaseClock {
    fn default() -> Self {
        Self::new()
    }
}

/// The session's lease: the one its host claimed and handed down (`held`),
/// or else claimed here for `owner`, or else taken over in one process.
pub(super) async fn take_lease(
    store: &dyn CheckpointStore,
    session_id: &str,
    held: Option<&Lease>,
    owner: Option<&LeaseOwner>,
) -> Result<Lease, StoreError> {
    match (held, owner) {
        (Some(lease), _) if lease.session_id == session_id => Ok(lease.clone()),
        (Some(lease), _) => Err(StoreError::Invalid(format!(
            "a lease on session '{}' was handed to session '{session_id}'",
            lease.session_id
        ))),
        (None, Some(owner)) => Lease::claim(owner.leases.as_ref(), session_id, &owner.node, owner.ttl).await,
        (None, None) => Lease::take_over(store, session_id).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_is_fresh_until_three_quarters_of_the_lease_have_passed_since_its_renewal() {
        let clock = LeaseClock::new();
        let ttl = Duration::from_secs(3600);
        assert!(clock.fresh(ttl));
        assert!(!clock.fresh(Duration::ZERO));
        // Renewals move it on, never back.
        let later = Instant::now() + Duration::from_secs(10);
        clock.renewed_at(later);
        clock.renewed_at(Instant::now());
        assert!(
            clock.since_renewal() == Duration::ZERO,
            "renewed in the future: no time has passed"
        );
        let copy = clock.clone();
        assert!(copy.fresh(Duration::from_millis(1)), "clones share the clock");
    }
}
