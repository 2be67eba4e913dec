//! What several nodes on one database need of a store besides the
//! single-process contract: owned leases and taking over the sessions of a
//! node that died ([`LeaseStore`]), relaying submissions to the node that
//! runs a session and the notices that wake the nodes ([`ClusterStore`]).
//! No method has a default: a backend implements a trait whole or not at
//! all, and a caller that needs one holds it explicitly (an
//! `Option<Arc<dyn ClusterStore>>`), never a store that refuses.

use std::time::Duration;

use futures::future::BoxFuture;
use keel_protocol::{Actor, BusyPolicy, Op, StoreError};
use serde::{Deserialize, Serialize};

use crate::NoticeListener;

/// A submission that a node accepted for a session another node runs,
/// kept by the store until the owner queues it ([`ClusterStore::relay`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayedSubmission {
    /// The store's id for it, in the order relayed; set by the store.
    #[serde(skip)]
    pub relay_id: u64,
    /// The id the accepting node answered with; the owner queues it under
    /// this id.
    #[serde(skip)]
    pub submission_id: String,
    /// The op.
    pub op: Op,
    /// What a user message does if the session is busy; `None` leaves it
    /// to the session's default.
    pub on_busy: Option<BusyPolicy>,
    /// The client's idempotency key, unique per session among the relayed
    /// submissions as among the queued ones.
    #[serde(skip)]
    pub idempotency_key: Option<String>,
    /// The principal that made the submission on the accepting node,
    /// stored with the op (rows stored before it existed read as `None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<Actor>,
    /// The accepting node's seal over the rest (see the server's
    /// `RelayKey`), stored with the op; the store keeps it as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
    /// The client's W3C `traceparent`, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// What [`ClusterStore::relay`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relayed {
    /// Stored and announced; the session's log ended at `last_sequence`
    /// then, so the submission's events come after it.
    New {
        /// The sequence of the session's newest event when it was relayed.
        last_sequence: u64,
        /// The store's id for it ([`RelayedSubmission::relay_id`]), to
        /// wait for its answer with ([`ClusterStore::relay_state`]).
        relay_id: u64,
    },
    /// A submission with the same idempotency key waits already: this one.
    Duplicate(Box<RelayedSubmission>),
    /// As many submissions as allowed wait already; nothing was stored.
    Full,
}

/// What the owner answered to a relayed submission, as it would have
/// answered the client itself; stored with it so that the node which
/// relayed it, or any node asked again with its key, answers the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RelayOutcome {
    /// Queued (or, for a control op, acted on).
    Accepted {
        /// The submission's id.
        submission_id: String,
        /// The sequence of its `submission_queued` event (a control op:
        /// the log's end when it was taken).
        sequence: u64,
        /// Whether an earlier submission with its key answered.
        duplicate: bool,
    },
    /// Refused; nothing was queued.
    Refused {
        /// Why.
        refusal: RelayRefusal,
        /// The owner's message.
        message: String,
    },
}

/// Why the owner refused a relayed submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RelayRefusal {
    /// `on_busy: reject` while the session was busy.
    SessionBusy,
    /// The session's submission queue was full.
    QueueFull,
    /// Its idempotency key names another request.
    KeyReused,
    /// The op breaks the protocol's limits.
    InvalidRequest,
    /// The session is not the sender's: its tenant is another than the
    /// one the relaying node believed (answered as a session that does not
    /// exist).
    UnknownSession,
}

/// Where a relayed submission is ([`ClusterStore::relay_state`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayState {
    /// Its owner has not taken it yet.
    Waiting,
    /// Its owner took it and answered.
    Answered(RelayOutcome),
    /// Not stored (any more): forgotten unanswered (its seal did not
    /// verify, its session was deleted) or answered long ago.
    Gone,
}

/// Owned leases: a session is claimed by a node for a time to live, renewed,
/// released, and taken over once its owner's lease expired. Implemented by
/// both backends (on SQLite, by processes sharing one file).
pub trait LeaseStore: Send + Sync {
    /// Claims the session for `owner` (a node) for `ttl`, and returns the
    /// lease epoch to write with (the `lease` of an [`crate::AppendBatch`]).
    ///
    /// Atomic, in any number of processes on one database: the claim
    /// succeeds when nobody owns the session, when its owner's lease has
    /// expired, or when `owner` already owns it (a renewal). The epoch is
    /// bumped whenever the owner changes (from none or from another owner)
    /// and when `owner` claims again after its own lease expired, so that
    /// batches written under the earlier epoch are refused with
    /// [`StoreError::Fenced`]; a renewal of a live lease keeps it. The
    /// expiry becomes now + `ttl` by the store's clock (the database
    /// server's on PostgreSQL). When another owner's lease is live the
    /// claim fails with [`StoreError::Owned`] and changes nothing; an
    /// unknown id is [`StoreError::UnknownSession`].
    ///
    /// [`crate::CheckpointStore::acquire`] bumps the epoch without looking at the owner: a
    /// caller uses one scheme or the other for a session.
    fn claim<'a>(
        &'a self,
        session_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Extends to now + `ttl` the lease of every listed `(session id,
    /// epoch)` that `owner` still holds at that epoch (a lease
    /// that expired but that nobody claimed since is still held). Returns
    /// the ids of the others, in the order given: sessions taken over,
    /// released or deleted, whose runtimes the caller must stop.
    fn renew<'a>(
        &'a self,
        owner: &'a str,
        ttl: Duration,
        sessions: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;

    /// Gives up `owner`'s lease on the session (a node shutting down hands
    /// its sessions over): clears the owner and the expiry, if `owner`
    /// still holds it at `epoch`, so another owner can claim it at once
    /// (which bumps the epoch). A lease held by someone else, or at another
    /// epoch, is left alone and is not an error; an unknown id is
    /// [`StoreError::UnknownSession`]. The caller stops writing first:
    /// until another owner claims the session, a batch at `epoch` is still
    /// accepted.
    fn release<'a>(&'a self, session_id: &'a str, owner: &'a str, epoch: u64) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Up to `limit` ids, in id order after `after`, of the sessions with
    /// work stored (as [`crate::CheckpointStore::sessions_with_work`]: submissions queued or
    /// relayed, or a turn in flight) whose lease has no owner or has
    /// expired: what a surviving node claims and resumes.
    fn sessions_to_take_over<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;
}

/// A store shared by several nodes on one database: leases, and relaying
/// submissions to the node that runs a session, woken by the store's
/// notices. Implemented by PostgreSQL.
pub trait ClusterStore: LeaseStore {
    /// Stores `submission` for `session_id`, which another node runs, and
    /// wakes that node (on PostgreSQL, a notification on `keel_relay`). The
    /// owner takes it up with [`Self::relayed`] and [`Self::relay_done`].
    /// With an idempotency key that a waiting (unanswered) relayed
    /// submission has already, it stores nothing and returns that one;
    /// with `max_waiting` submissions waiting, it stores nothing
    /// ([`Relayed::Full`]). An unknown session is
    /// [`StoreError::UnknownSession`].
    fn relay<'a>(
        &'a self,
        session_id: &'a str,
        submission: &'a RelayedSubmission,
        max_waiting: usize,
    ) -> BoxFuture<'a, Result<Relayed, StoreError>>;

    /// Up to `limit` submissions relayed to `session_id` and not answered
    /// yet, oldest first.
    ///
    /// The store answers each row handed out here in the very commit that
    /// queues a submission under its id (a `submission_queued` event):
    /// accepted, not a duplicate, at that event's sequence, with the same
    /// wake-up as [`Self::answer_relayed`]; so the owner's answers cost no
    /// transaction of their own but for duplicates, refusals and control ops.
    fn relayed<'a>(
        &'a self,
        session_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RelayedSubmission>, StoreError>>;

    /// Tells the store that the owner takes up `rows`, which a notice
    /// carried ([`crate::LogNotice::Relay`]) instead of [`Self::relayed`]:
    /// they are answered by the commit that queues them all the same.
    fn taking_up(&self, rows: &[RelayedSubmission]);

    /// Forgets relayed submissions the owner has queued (or refused);
    /// unknown ids are ignored.
    fn relay_done<'a>(&'a self, session_id: &'a str, relay_ids: &'a [u64]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records the owner's answers to relayed submissions of `session_id`,
    /// `(relay id, answer)` (`None`: forgets it unanswered), in one
    /// statement that also forgets the answers recorded more than
    /// `keep` ago and wakes the nodes waiting for one (on PostgreSQL, a
    /// notification on `keel_answer`). An answered submission no longer
    /// waits ([`Self::relayed`]) and frees its idempotency key here: what
    /// the owner queued or refused under it is in the session's keys
    /// ([`crate::CheckpointStore::keyed_submission`]). Unknown ids are
    /// ignored, and so are rows answered already (by the commit that
    /// queued them, see [`Self::relayed`]): their first answer stands.
    fn answer_relayed<'a>(
        &'a self,
        session_id: &'a str,
        answers: &'a [(u64, Option<RelayOutcome>)],
        keep: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Whether relayed submission `relay_id` of `session_id` waits, was
    /// answered (and how), or is gone.
    fn relay_state<'a>(&'a self, session_id: &'a str, relay_id: u64) -> BoxFuture<'a, Result<RelayState, StoreError>>;

    /// The highest relay id of any submission relayed to `session_id` and
    /// still stored, answered or not (0 for none): a row with a higher id
    /// was committed after this was read.
    fn newest_relay_id<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// The sessions leased to `owner` with relayed submissions waiting: the
    /// owner's safety net for a wake-up it missed.
    fn sessions_with_relayed<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;

    /// Records that node `node` takes submissions for the sessions it runs
    /// at `url` (its base URL, as the other nodes reach it), replacing what
    /// it advertised before; an empty `url` says it takes none.
    fn advertise<'a>(&'a self, node: &'a str, url: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The base URL node `node` advertised last ([`Self::advertise`]), if
    /// it did and it was not empty.
    fn node_url<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Option<String>, StoreError>>;

    /// Starts following the store's notices (log commits, relayed
    /// submissions, released sessions) of every node; see [`NoticeListener`].
    fn listen(&self) -> BoxFuture<'_, Result<NoticeListener, StoreError>>;
}

/// A lease's time to live in whole milliseconds (at least 1), as stored.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}
