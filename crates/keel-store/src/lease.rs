//! The one value for a session's lease: what a runtime was given when the
//! session was taken, and writes under. A host claims it once per load and
//! hands it to the runtime; the store fences off every batch written under
//! an older one.

use std::time::Duration;

use keel_protocol::StoreError;

use crate::{CheckpointStore, LeaseStore};

/// What was claimed: the session, by whom, its fencing epoch and how long
/// it lasts without a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub session_id: String,
    /// The node it was claimed for; `None` when it was taken over in one
    /// process ([`CheckpointStore::acquire`]), which nobody renews.
    pub owner: Option<String>,
    /// The fencing token: the store refuses batches written under an older
    /// one ([`StoreError::Fenced`]), so a runtime that lost the session
    /// cannot write into it. The `lease` of an [`crate::AppendBatch`].
    pub epoch: u64,
    /// How long it lasts from its claim or latest renewal (its expiry is
    /// that plus this, by the store's clock); `None` when it never expires.
    pub ttl: Option<Duration>,
}

impl Lease {
    /// Takes `session_id` over in one process, fencing off whoever held it.
    pub async fn take_over(store: &dyn CheckpointStore, session_id: &str) -> Result<Self, StoreError> {
        let epoch = store.acquire(session_id).await?;
        Ok(Self {
            session_id: session_id.to_owned(),
            owner: None,
            epoch,
            ttl: None,
        })
    }

    /// Claims `session_id` for `owner` for `ttl` ([`LeaseStore::claim`]).
    pub async fn claim(
        leases: &dyn LeaseStore,
        session_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Self, StoreError> {
        let epoch = leases.claim(session_id, owner, ttl).await?;
        Ok(Self {
            session_id: session_id.to_owned(),
            owner: Some(owner.to_owned()),
            epoch,
            ttl: Some(ttl),
        })
    }
}
