//! Durable session state: checkpoints, history and the event log.
//!
//! [`CheckpointStore`] is the one interface the runtime persists through
//! in one process; [`LeaseStore`] and [`ClusterStore`] are what several
//! nodes on one database need besides, held explicitly by the callers that
//! need them. [`open`] chooses the backend from a path or URL.
//! [`SqliteCheckpoint`] is the embedded default; `PostgresCheckpoint`
//! (feature `postgres`) keeps the same guarantees in a PostgreSQL database,
//! for several nodes on one database. A store keeps, per session:
//!
//! - a [`Checkpoint`]: the small, rewritten-in-place state (context, counters);
//! - the transcript: history items, appended as deltas and never rewritten;
//! - the turn [`TurnExecution`] in flight, if any, so a restart can close it;
//! - the event log, with a gap-free sequence starting at 1.
//!
//! A batch of events and the checkpoint write that goes with it are committed
//! atomically, or not at all. The store must not know agents, turns, models
//! or tools (no dependency on `keel-model`, `keel-tools` or `keel-agent`): it
//! stores what it is given.

mod access;
mod batch;
mod cluster;
pub(crate) mod codec;
#[cfg(test)]
pub(crate) mod conformance;
mod contract;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod job;
mod lease;
mod notice;
mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
pub(crate) mod rows;
pub mod sqlite;
mod types;
mod usage;
mod walk;
mod webhook;

pub use access::{
    AccessStore, Admission, ApiKeyRecord, BudgetTarget, Ledger, LedgerRead, SlotClaim, TURN_SLOT_GRACE_MS, TurnSlot,
    UsageBucket,
};
pub use batch::{AppendBatch, AppendReceipt, CheckpointWrite, OpenBatch};
pub(crate) use cluster::ttl_ms;
pub use cluster::{ClusterStore, LeaseStore, RelayOutcome, RelayRefusal, RelayState, Relayed, RelayedSubmission};
pub use contract::{CheckpointStore, CheckpointStoreExt, SessionEdit, SessionFilter};
pub use keel_protocol::StoreError;
pub use lease::Lease;
pub use notice::{CarriedEvents, LogNotice, NoticeListener};
pub use open::{Backend, Location, OpenError, OpenOptions, OpenedStore, open, open_at};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresCheckpoint, PostgresHold, PostgresOptions, redact_postgres_url};
pub use sqlite::{ServeLock, SharedHold, SqliteCheckpoint, SqliteOptions, Synchronous, WriterStats};
pub use types::{
    Checkpoint, Compaction, EncodedEvent, EventPage, EventPageRequest, KeyedSubmission, LastTurn, MAX_EVENT_PAGE,
    MAX_TITLE_CHARS, QueueChange, QueuedSubmission, SessionContext, SessionListPage, SessionState, SessionSummary,
    TurnExecution, TurnTrace, title_of,
};
pub use usage::{SessionUsage, session_usage};
pub use walk::walk_back;
pub use webhook::{
    DeliveryFilter, DeliveryOutcome, DeliveryState, WebhookDelivery, WebhookEndpoint, WebhookSecret, WebhookStore,
};
