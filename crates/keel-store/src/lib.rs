//! Durable session state: checkpoints, history and the event log.
//!
//! [`CheckpointStore`] is the interface the runtime persists through.
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

pub(crate) mod codec;
#[cfg(test)]
pub(crate) mod conformance;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod job;
mod notice;
#[cfg(feature = "postgres")]
pub mod postgres;
pub(crate) mod rows;
pub mod sqlite;
mod usage;
mod walk;

use serde::{Deserialize, Serialize};

pub use keel_protocol::StoreError;
pub use notice::{LogNotice, NoticeListener};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresCheckpoint, PostgresHold, PostgresOptions, redact_postgres_url};
pub use sqlite::{ServeLock, SharedHold, SqliteCheckpoint, SqliteOptions, Synchronous, WriterStats};
pub use usage::{SessionUsage, session_usage};
pub use walk::walk_back;

use futures::future::BoxFuture;
use std::collections::{BTreeMap, BTreeSet};

use keel_protocol::{ApprovalDecision, BusyPolicy, Event, EventMsg, Op, RecordedEvent, TokenUsage, TranscriptItem};

/// The most events one [`CheckpointStore::event_page`] call returns.
pub const MAX_EVENT_PAGE: usize = 10_000;

/// Who a session belongs to and what it is about; set when it is created.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionContext {
    /// The bot (application) that owns the session.
    pub bot_id: String,
    /// Free-form context supplied by the application.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Settings of the application hosting the session (a server keeps the
    /// session's model, tools and policies here, to reopen it with them).
    /// Opaque to the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
}

/// A session's small durable state, rewritten on every save.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The session this checkpoint belongs to.
    pub session_id: String,
    /// Who the session belongs to.
    pub session_context: SessionContext,
    /// Model calls started in this session; the scripted model's position.
    #[serde(default)]
    pub model_calls: u64,
    /// Turns that completed normally.
    #[serde(default)]
    pub turns_completed: u64,
    /// Tokens the session's model calls used, summed.
    #[serde(default)]
    pub usage: TokenUsage,
    /// Tools the user approved for the rest of the session.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub approved_tools: BTreeSet<String>,
    /// The latest compaction: the model sees its summary in place of the
    /// history items before `replaced_to`. Saved with the `context_compacted`
    /// event in one commit, so a crash never leaves it half-applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
    /// The latest turn, which a `regenerate` op rolls back; `None` before
    /// the first turn and after a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_turn: Option<LastTurn>,
}

/// Where the latest turn's history starts, saved when the turn starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastTurn {
    /// The turn.
    pub turn_id: String,
    /// The history's length when it started: its items are the ones after.
    pub history_from: u64,
}

/// The history as compacted: a summary standing for its first items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The summary of the replaced items.
    pub summary: String,
    /// How many history items, from the start, the summary replaces.
    pub replaced_to: u64,
    /// How many compactions the session has made, this one included.
    #[serde(default)]
    pub count: u64,
}

impl Checkpoint {
    /// The checkpoint of a session that has not done anything yet.
    pub fn empty(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            session_context: SessionContext::default(),
            model_calls: 0,
            turns_completed: 0,
            usage: TokenUsage::default(),
            approved_tools: BTreeSet::new(),
            compaction: None,
            last_turn: None,
        }
    }
}

/// The turn a session is running, saved while it runs so that a restart can
/// find it and close it explicitly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnExecution {
    /// The running turn.
    pub turn_id: String,
    /// The submissions the turn took.
    pub submission_ids: Vec<String>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// The model step the turn is at, from 1.
    #[serde(default)]
    pub step: u32,
    /// Tool calls of this step waiting for the user's decision. A turn
    /// found waiting when the session is opened goes on waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_approval: Vec<String>,
    /// Decisions already made for this step's calls, by call id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decisions: BTreeMap<String, ApprovalDecision>,
    /// This step's calls whose `tool_call_started` is committed (written
    /// in the same batch), so a restart can tell a call that may have run
    /// from one that never started. `None` in checkpoints of versions that
    /// did not keep it: then any unanswered call may have run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_calls: Option<Vec<String>>,
}

/// Everything needed to resume a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// The latest checkpoint.
    pub checkpoint: Checkpoint,
    /// The whole history, oldest first.
    pub transcript: Vec<TranscriptItem>,
    /// The turn that was running when the checkpoint was written, if any.
    pub execution: Option<TurnExecution>,
    /// The sequence of the newest event in the log (0 when it is empty).
    pub last_sequence: u64,
    /// Submissions stored durably and not yet taken up, oldest first.
    pub queued: Vec<QueuedSubmission>,
}

/// A submission stored before it was queued (its `submission_queued`
/// event), kept until the session takes it up, so a crash cannot lose it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSubmission {
    /// The submission's id.
    pub id: String,
    /// The op.
    pub op: Op,
    /// What it does if the session is busy.
    pub on_busy: BusyPolicy,
    /// The sequence of its `submission_queued` event.
    pub sequence: u64,
}

/// How an event changes the session's stored submission queue; the store
/// applies it in the transaction that appends the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueChange {
    /// A `submission_queued` event: the submission joins the queue (its
    /// sequence is the event's, filled in by the store) and its idempotency
    /// key, if any, is remembered.
    Queued {
        /// The submission.
        submission: Box<QueuedSubmission>,
        /// The client's idempotency key.
        idempotency_key: Option<String>,
    },
    /// The first event the session recorded for this submission: it was
    /// taken up and leaves the queue.
    Settled(String),
}

/// One line of a session listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// The session's id.
    pub session_id: String,
    /// The bot that owns it.
    pub bot_id: String,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When it was last written.
    pub updated_at_ms: u64,
    /// The newest event's sequence.
    pub last_sequence: u64,
    /// The turn in flight at the last write, if any.
    pub running_turn_id: Option<String>,
    /// Who the session belongs to, and the host's settings.
    pub context: SessionContext,
    /// Tokens used, summed.
    pub usage: TokenUsage,
    /// Turns that completed normally.
    pub turns_completed: u64,
    /// Tool calls waiting for the user's decision.
    pub awaiting_approval: Vec<String>,
    /// The session's title: its first user message, shortened, until it
    /// is renamed; `None` before any message.
    #[serde(default)]
    pub title: Option<String>,
}

/// A page of [`CheckpointStore::list_sessions_page`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionListPage {
    /// The sessions, newest created first.
    pub sessions: Vec<SessionSummary>,
    /// Where the next page starts; `None` after the last page.
    pub next_cursor: Option<String>,
}

/// A submission that a node accepted for a session another node runs,
/// kept by the store until the owner queues it ([`CheckpointStore::relay`]).
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
    /// The accepting node's seal over the rest (see the server's
    /// `RelayKey`), stored with the op; the store keeps it as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
}

/// What [`CheckpointStore::relay`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relayed {
    /// Stored and announced; the session's log ended at `last_sequence`
    /// then, so the submission's events come after it.
    New {
        /// The sequence of the session's newest event when it was relayed.
        last_sequence: u64,
    },
    /// A submission with the same idempotency key waits already: this one.
    Duplicate(RelayedSubmission),
    /// As many submissions as allowed wait already; nothing was stored.
    Full,
}

/// Where a submission with an idempotency key landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedSubmission {
    /// The submission's id.
    pub submission_id: String,
    /// The sequence of its `submission_queued` event.
    pub sequence: u64,
}

/// Which part of the log to read: the `limit` newest events older than
/// `before_sequence` (or the newest overall when it is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventPageRequest {
    /// Read events with a smaller sequence than this.
    pub before_sequence: Option<u64>,
    /// How many at most; capped at [`MAX_EVENT_PAGE`].
    pub limit: usize,
}

/// A page of the event log, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// The events, in ascending sequence.
    pub events: Vec<RecordedEvent>,
    /// Whether older events exist before the first one here.
    pub has_more: bool,
}

/// An event serialized once, on its way to the store: the JSON of the
/// [`Event`] (`submission_id` and `msg`).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedEvent {
    /// The event's JSON.
    pub json: String,
    /// What the event does to the stored submission queue.
    pub queue: Option<QueueChange>,
    /// The title a `user_message` event gives a session that has none yet.
    pub title: Option<String>,
}

impl EncodedEvent {
    /// Serializes an event. A `submission_queued` event carries the
    /// submission to store in the queue.
    pub fn encode(event: &Event) -> Result<Self, StoreError> {
        let json = serde_json::to_string(event).map_err(|error| StoreError::Encode(error.to_string()))?;
        let queue = match (&event.msg, &event.submission_id) {
            (EventMsg::SubmissionQueued(queued), Some(id)) => Some(QueueChange::Queued {
                submission: Box::new(QueuedSubmission {
                    id: id.clone(),
                    op: queued.op.clone(),
                    on_busy: queued.on_busy,
                    sequence: 0,
                }),
                idempotency_key: queued.idempotency_key.clone(),
            }),
            _ => None,
        };
        let title = match &event.msg {
            EventMsg::UserMessage(message) => title_of(&message.text),
            _ => None,
        };
        Ok(Self { json, queue, title })
    }
}

/// The most characters of a session title.
pub const MAX_TITLE_CHARS: usize = 200;

/// How many characters of the first message make a session's title.
const DERIVED_TITLE_CHARS: usize = 80;

/// The title a message gives a session: its first non-blank line, trimmed
/// and shortened (with `…`); `None` for a blank message.
pub fn title_of(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    let mut title: String = line.chars().take(DERIVED_TITLE_CHARS).collect();
    if title.len() < line.len() {
        title.push('…');
    }
    Some(title)
}

/// A checkpoint rewrite plus the history it adds.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointWrite {
    /// The new checkpoint.
    pub checkpoint: Checkpoint,
    /// History items to append.
    pub transcript_delta: Vec<TranscriptItem>,
    /// The turn in flight after this write (`None` when none is).
    pub execution: Option<TurnExecution>,
    /// Cut the history back to its first this-many items before appending
    /// `transcript_delta` (a rolled-back turn). The store refuses a cut
    /// longer than the history.
    pub history_cut: Option<u64>,
}

impl CheckpointWrite {
    /// Whether `later` can be folded into this write. A cut counts items
    /// from the start of the history, which this write only knows when it
    /// cuts too: a cutting write cannot follow one that does not.
    pub fn can_merge(&self, later: &CheckpointWrite) -> bool {
        later.history_cut.is_none() || self.history_cut.is_some()
    }

    /// Folds a later write into this one (see [`Self::can_merge`]): the
    /// later checkpoint and execution win, the history deltas are
    /// concatenated, and a later cut applies to this write's result.
    pub fn merge(&mut self, later: CheckpointWrite) {
        debug_assert!(
            self.can_merge(&later),
            "a cutting write merged into one that does not cut"
        );
        if let (Some(cut), Some(later_cut)) = (self.history_cut, later.history_cut) {
            // This write leaves `cut + delta` items; the later cut keeps a
            // prefix of them.
            match later_cut.checked_sub(cut) {
                Some(kept) => self
                    .transcript_delta
                    .truncate(usize::try_from(kept).unwrap_or(usize::MAX)),
                None => {
                    self.history_cut = Some(later_cut);
                    self.transcript_delta.clear();
                }
            }
        }
        self.checkpoint = later.checkpoint;
        self.execution = later.execution;
        self.transcript_delta.extend(later.transcript_delta);
    }
}

/// Events to append to one session's log, and the checkpoint write that goes
/// with them; both commit in one transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppendBatch {
    /// Events in order; they get consecutive sequences.
    pub events: Vec<EncodedEvent>,
    /// A checkpoint write, for a session that must already exist.
    pub checkpoint: Option<CheckpointWrite>,
    /// The lease of the writer (see [`CheckpointStore::acquire`]); when set,
    /// the batch is refused with [`StoreError::Fenced`] if the session has
    /// been taken over since.
    pub lease: Option<u64>,
}

/// A batch that can still grow until the store starts writing it.
///
/// The recorder hands the store an open batch and keeps adding what its
/// producers queue while the batch waits for the writer (which is usually
/// busy committing the previous group). The writer seals the batch when it
/// starts the transaction. A turn's events then tend to commit together
/// instead of trickling into successive commits.
#[derive(Debug)]
pub struct OpenBatch {
    /// `None` once the store took the batch.
    state: std::sync::Mutex<Option<AppendBatch>>,
}

impl OpenBatch {
    /// An open batch holding `batch`.
    pub fn new(batch: AppendBatch) -> Self {
        Self {
            state: std::sync::Mutex::new(Some(batch)),
        }
    }

    /// Runs `add` on the batch if the store has not taken it yet; returns
    /// whether it ran.
    pub fn add(&self, add: impl FnOnce(&mut AppendBatch)) -> bool {
        match self.state.lock().unwrap_or_else(|poison| poison.into_inner()).as_mut() {
            Some(batch) => {
                add(batch);
                true
            }
            None => false,
        }
    }

    /// Takes the batch for writing; later additions are refused.
    pub fn seal(&self) -> AppendBatch {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take()
            .unwrap_or_default()
    }
}

impl AppendBatch {
    /// Appends `events` and folds in `checkpoint`.
    pub fn extend(&mut self, events: impl IntoIterator<Item = EncodedEvent>, checkpoint: Option<CheckpointWrite>) {
        self.events.extend(events);
        if let Some(write) = checkpoint {
            match &mut self.checkpoint {
                Some(merged) => merged.merge(write),
                None => self.checkpoint = Some(write),
            }
        }
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.checkpoint.is_none()
    }
}

/// Where an appended batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendReceipt {
    /// The first event's sequence; the rest follow without gaps.
    pub first_sequence: u64,
    /// Commit time of the batch, in milliseconds since the Unix epoch.
    pub recorded_at_ms: u64,
}

/// Durable storage for sessions. Object safe, so the runtime holds an
/// `Arc<dyn CheckpointStore>` and backends can be swapped.
///
/// Implementations must keep each session's event sequence gap-free, accept
/// events only for sessions that have a checkpoint, and leave stored data
/// unchanged when a call fails.
pub trait CheckpointStore: Send + Sync {
    /// Why the file system holding the store is below the space the store
    /// keeps for its own commits, if it is: SQLite's space reserve (see
    /// [`sqlite::SpaceReserve::low_on_space`]) is used up, or less than it
    /// is free. `/readyz` answers not ready meanwhile, and tools that write
    /// files should refuse to run, so that a command cannot take the room
    /// commits need. Cheap (a cached `statvfs`), callable from async code.
    /// The default, for stores that keep no reserve, is `None`.
    fn low_on_space(&self) -> Option<String> {
        None
    }

    /// Creates or rewrites a session's checkpoint, appends `transcript_delta`
    /// to its history and sets (or clears) its turn in flight.
    fn save<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        transcript_delta: &'a [TranscriptItem],
        execution: Option<&'a TurnExecution>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Creates a session that must not exist yet: its checkpoint, its
    /// history and its first `events`, in one transaction. Fails with
    /// [`StoreError::Exists`] (writing nothing) when the id is taken, so of
    /// two creators of one id, in any processes, exactly one succeeds.
    ///
    /// The default checks, then saves and appends: not atomic, and racy
    /// between processes; stores override it.
    fn create<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        history: &'a [TranscriptItem],
        events: Vec<EncodedEvent>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(async move {
            let session_id = checkpoint.session_id.as_str();
            if self.session_summary(session_id).await?.is_some() {
                return Err(StoreError::Exists(session_id.to_owned()));
            }
            self.save(checkpoint, history, None).await?;
            self.append(
                session_id,
                AppendBatch {
                    events,
                    ..AppendBatch::default()
                },
            )
            .await
        })
    }

    /// Finishes the writes already queued and lets go of the database;
    /// every later call fails with [`StoreError::Closed`]. The default does
    /// nothing (a store with nothing to let go of).
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Loads a session, or `None` if it does not exist.
    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>>;

    /// Appends events and an optional checkpoint write atomically. Fails with
    /// [`StoreError::UnknownSession`] if the session has no checkpoint.
    fn append<'a>(
        &'a self,
        session_id: &'a str,
        batch: AppendBatch,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>>;

    /// [`Self::append`] for a batch that may still grow: the store seals it
    /// as late as it can, when it starts writing. The receipt's sequences
    /// cover the events the batch held when sealed.
    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: std::sync::Arc<OpenBatch>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(async move { self.append(session_id, batch.seal()).await })
    }

    /// Takes the session over for a new runtime and returns its lease. From
    /// then on, batches carrying an older lease are refused with
    /// [`StoreError::Fenced`]: a runtime that lost its session (to a restart,
    /// or another process) cannot write into it.
    fn acquire<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Claims the session for `owner` (a node) for `ttl`, and returns the
    /// lease epoch to write with (the `lease` of an [`AppendBatch`]).
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
    /// [`Self::acquire`] bumps the epoch without looking at the owner: a
    /// caller uses one scheme or the other for a session.
    ///
    /// The default refuses: the store has no owned leases.
    fn claim<'a>(
        &'a self,
        session_id: &'a str,
        owner: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let _ = (session_id, owner, ttl);
        Box::pin(async { Err(no_owned_leases()) })
    }

    /// Extends to now + `ttl` the lease of every listed `(session id,
    /// epoch)` that `owner` still holds at that epoch (a lease
    /// that expired but that nobody claimed since is still held). Returns
    /// the ids of the others, in the order given: sessions taken over,
    /// released or deleted, whose runtimes the caller must stop.
    ///
    /// The default refuses: the store has no owned leases.
    fn renew<'a>(
        &'a self,
        owner: &'a str,
        ttl: std::time::Duration,
        sessions: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let _ = (owner, ttl, sessions);
        Box::pin(async { Err(no_owned_leases()) })
    }

    /// Gives up `owner`'s lease on the session (a node shutting down hands
    /// its sessions over): clears the owner and the expiry, if `owner`
    /// still holds it at `epoch`, so another owner can claim it at once
    /// (which bumps the epoch). A lease held by someone else, or at another
    /// epoch, is left alone and is not an error; an unknown id is
    /// [`StoreError::UnknownSession`]. The caller stops writing first:
    /// until another owner claims the session, a batch at `epoch` is still
    /// accepted.
    ///
    /// The default refuses: the store has no owned leases.
    fn release<'a>(&'a self, session_id: &'a str, owner: &'a str, epoch: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (session_id, owner, epoch);
        Box::pin(async { Err(no_owned_leases()) })
    }

    /// Up to `limit` ids, in id order after `after`, of the sessions with
    /// work stored (as [`Self::sessions_with_work`]: submissions queued or
    /// relayed, or a turn in flight) whose lease has no owner or has
    /// expired: what a surviving node claims and resumes.
    ///
    /// The default refuses: the store has no owned leases.
    fn sessions_to_take_over<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let _ = (after, limit);
        Box::pin(async { Err(no_owned_leases()) })
    }

    /// Stores `submission` for `session_id`, which another node runs, and
    /// wakes that node (on PostgreSQL, a notification on `keel_relay`). The
    /// owner takes it up with [`Self::relayed`] and [`Self::relay_done`].
    /// With an idempotency key that a waiting relayed submission has
    /// already, it stores nothing and returns that one; with `max_waiting`
    /// submissions waiting, it stores nothing ([`Relayed::Full`]). An
    /// unknown session is [`StoreError::UnknownSession`].
    ///
    /// The default refuses: the store runs on one node.
    fn relay<'a>(
        &'a self,
        session_id: &'a str,
        submission: &'a RelayedSubmission,
        max_waiting: usize,
    ) -> BoxFuture<'a, Result<Relayed, StoreError>> {
        let _ = (session_id, submission, max_waiting);
        Box::pin(async { Err(no_owned_leases()) })
    }

    /// Up to `limit` submissions relayed to `session_id`, oldest first.
    ///
    /// The default has none.
    fn relayed<'a>(
        &'a self,
        session_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RelayedSubmission>, StoreError>> {
        let _ = (session_id, limit);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Forgets relayed submissions the owner has queued (or refused);
    /// unknown ids are ignored.
    ///
    /// The default has none to forget.
    fn relay_done<'a>(&'a self, session_id: &'a str, relay_ids: &'a [u64]) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (session_id, relay_ids);
        Box::pin(async { Ok(()) })
    }

    /// The sessions leased to `owner` with relayed submissions waiting: the
    /// owner's safety net for a wake-up it missed.
    ///
    /// The default has none.
    fn sessions_with_relayed<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let _ = owner;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Reads a page of the log, going backwards from `before_sequence`.
    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>>;

    /// Lists sessions, most recently updated first.
    fn list_sessions(&self, limit: usize) -> BoxFuture<'_, Result<Vec<SessionSummary>, StoreError>>;

    /// Lists sessions, newest created first, `limit` (at most
    /// [`MAX_EVENT_PAGE`]) per page from `cursor` (a page's `next_cursor`;
    /// `None` for the first page); only those of bot `bot_id` when given. A
    /// malformed cursor is [`StoreError::Invalid`].
    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        bot_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>>;

    /// One session's summary without its history, or `None`.
    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>>;

    /// The events after `after_sequence`, oldest first, at most `limit`
    /// (capped at [`MAX_EVENT_PAGE`]). Fails with
    /// [`StoreError::UnknownSession`] for a session that does not exist.
    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>>;

    /// The submission stored with `idempotency_key` in this session, if any.
    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>>;

    /// The history a session had once its log reached `at_sequence`: the
    /// items of every batch that ends at or before it, oldest first; `None`
    /// for an unknown session. A fork starts from it, so a fork copies the
    /// parent's history, never its log. Fails with [`StoreError::Invalid`]
    /// when `at_sequence` is past the log or inside a batch that added
    /// history (the batch's items cannot be split by event).
    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<TranscriptItem>>, StoreError>> {
        let _ = (session_id, at_sequence);
        Box::pin(async { Err(StoreError::Invalid("this store cannot read a past history".to_owned())) })
    }

    /// Deletes a session for good: its checkpoint, history, events, queued
    /// submissions and idempotency keys, in one transaction (all of it goes,
    /// or none). Returns whether the session existed. The caller stops any
    /// runtime writing to it first; that runtime's later writes then fail
    /// with [`StoreError::UnknownSession`].
    ///
    /// The default refuses: a store must opt in to deleting data.
    fn delete_session<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Err(StoreError::Invalid(format!(
                "this store cannot delete sessions (asked to delete '{session_id}')"
            )))
        })
    }

    /// Sets a session's title (replacing the one its first message gave
    /// it). Returns whether the session exists.
    ///
    /// The default refuses: the store has no place for a title.
    fn rename_session<'a>(&'a self, session_id: &'a str, title: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            Err(StoreError::Invalid(format!(
                "this store cannot rename sessions (asked to title '{session_id}' {title:?})"
            )))
        })
    }

    /// Up to `limit` ids, in id order after `after`, of the sessions with
    /// work stored: submissions queued, or a turn in flight. A host loads
    /// them when it starts, so that nothing acknowledged waits for a request.
    ///
    /// The default walks every session and finds only turns in flight (a
    /// summary does not show the queue); stores with a queue override it.
    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let mut ids = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = self.list_sessions_page(cursor.as_deref(), MAX_EVENT_PAGE, None).await?;
                ids.extend(
                    page.sessions
                        .into_iter()
                        .filter(|summary| summary.running_turn_id.is_some())
                        .map(|summary| summary.session_id)
                        .filter(|id| after.is_none_or(|after| id.as_str() > after)),
                );
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            ids.sort();
            ids.truncate(limit);
            Ok(ids)
        })
    }
}

/// What the owned-lease methods of a store without them fail with.
fn no_owned_leases() -> StoreError {
    StoreError::Invalid("this store has no owned leases".to_owned())
}

/// A lease's time to live in whole milliseconds (at least 1), as stored.
pub(crate) fn ttl_ms(ttl: std::time::Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(cut: Option<u64>, texts: &[&str]) -> CheckpointWrite {
        CheckpointWrite {
            checkpoint: Checkpoint::empty("s"),
            transcript_delta: texts
                .iter()
                .map(|text| TranscriptItem::UserMessage {
                    text: (*text).to_owned(),
                })
                .collect(),
            execution: None,
            history_cut: cut,
        }
    }

    /// Folding writes gives the history that applying them one by one gives.
    #[test]
    fn merged_writes_cut_and_append_as_applied_one_by_one() {
        let apply = |history: &mut Vec<TranscriptItem>, write: &CheckpointWrite| {
            if let Some(cut) = write.history_cut {
                history.truncate(cut as usize);
            }
            history.extend(write.transcript_delta.iter().cloned());
        };
        let base: Vec<TranscriptItem> = write(None, &["a", "b", "c"]).transcript_delta;
        let cases = [
            (write(Some(1), &["x", "y"]), write(Some(2), &["z"])),
            (write(Some(1), &["x", "y"]), write(Some(0), &["z"])),
            (write(Some(2), &["x"]), write(Some(3), &[])),
            (write(Some(3), &[]), write(None, &["z"])),
            (write(None, &["x"]), write(None, &["y"])),
        ];
        for (first, second) in cases {
            assert!(first.can_merge(&second));
            let mut expected = base.clone();
            apply(&mut expected, &first);
            apply(&mut expected, &second);
            let mut merged = first.clone();
            merged.merge(second.clone());
            let mut got = base.clone();
            apply(&mut got, &merged);
            assert_eq!(got, expected, "{first:?} then {second:?}");
        }
        assert!(!write(None, &["x"]).can_merge(&write(Some(1), &[])));
    }
}
