//! The single-process store contract: what the runtime and one server need
//! of a store, with no default methods, and the conveniences derived from it.
//!
//! No method has a default, so a store (or a decorator such as the server's
//! metrics wrapper) that leaves one out does not compile. What can be said
//! in terms of the contract lives in [`CheckpointStoreExt`], implemented for
//! every store, which nobody can override to do something else.

use std::sync::Arc;

use futures::future::BoxFuture;
use keel_protocol::{RecordedEvent, StoreError, TranscriptItem};

use crate::{
    AppendBatch, AppendReceipt, Checkpoint, EncodedEvent, EventPage, EventPageRequest, KeyedSubmission, MAX_EVENT_PAGE,
    OpenBatch, SessionListPage, SessionState, SessionSummary, TurnExecution,
};

/// What [`CheckpointStore::edit_session`] does to a session's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEdit<'a> {
    /// Sets the session's title (replacing the one its first message gave it).
    Rename {
        /// The new title.
        title: &'a str,
    },
    /// Deletes the session for good: its checkpoint, history, events,
    /// queued submissions and idempotency keys, in one transaction (all of
    /// it goes, or none). The caller stops any runtime writing to it first;
    /// that runtime's later writes then fail with
    /// [`StoreError::UnknownSession`].
    Delete,
}

/// Which sessions a listing shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionFilter<'a> {
    /// Only those of this bot.
    pub bot_id: Option<&'a str>,
    /// Only those of this tenant.
    pub tenant: Option<&'a str>,
}

impl<'a> SessionFilter<'a> {
    /// Only the sessions of `bot_id`, when given (of any tenant).
    pub fn bot(bot_id: Option<&'a str>) -> Self {
        Self { bot_id, tenant: None }
    }
}

/// Durable storage for sessions in one process. Object safe, so the runtime
/// holds an `Arc<dyn CheckpointStore>` and backends can be swapped. What
/// several nodes on one database need besides is [`crate::ClusterStore`].
///
/// Implementations must keep each session's event sequence gap-free, accept
/// events only for sessions that have a checkpoint, and leave stored data
/// unchanged when a call fails.
pub trait CheckpointStore: Send + Sync {
    /// Why the file system holding the store is below the space the store
    /// keeps for its own commits, if it is: SQLite's space reserve (see
    /// [`crate::sqlite::SpaceReserve::low_on_space`]) is used up, or less than it
    /// is free. `/readyz` answers not ready meanwhile, and tools that write
    /// files should refuse to run, so that a command cannot take the room
    /// commits need. Cheap (a cached `statvfs`), callable from async code.
    fn low_on_space(&self) -> Option<String>;

    /// Finishes the writes already queued and lets go of the database;
    /// every later call fails with [`StoreError::Closed`].
    fn close(&self) -> BoxFuture<'_, ()>;

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
    fn create<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        history: &'a [TranscriptItem],
        events: Vec<EncodedEvent>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>>;

    /// Loads a session, or `None` if it does not exist.
    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>>;

    /// Appends a batch ([`CheckpointStoreExt::append`]) that that may still grow: the store seals it
    /// as late as it can, when it starts writing. The receipt's sequences
    /// cover the events the batch held when sealed.
    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: std::sync::Arc<OpenBatch>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>>;

    /// Takes the session over for a new runtime and returns its lease. From
    /// then on, batches carrying an older lease are refused with
    /// [`StoreError::Fenced`]: a runtime that lost its session (to a restart,
    /// or another process) cannot write into it.
    fn acquire<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// The events after `after_sequence`, oldest first, at most `limit`
    /// (capped at [`MAX_EVENT_PAGE`]). Fails with
    /// [`StoreError::UnknownSession`] for a session that does not exist.
    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>>;

    /// Reads a page of the log, going backwards from `before_sequence`.
    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>>;

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
    ) -> BoxFuture<'a, Result<Option<Vec<TranscriptItem>>, StoreError>>;

    /// The submission stored with `idempotency_key` in this session, if any.
    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>>;

    /// One session's summary without its history, or `None`.
    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>>;

    /// Lists sessions, newest created first, `limit` (at most
    /// [`MAX_EVENT_PAGE`]) per page from `cursor` (a page's `next_cursor`;
    /// `None` for the first page); only those `filter` admits. A
    /// malformed cursor is [`StoreError::Invalid`].
    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>>;

    /// Lists sessions most recently active first (the time their log last
    /// grew or their checkpoint was last written, ties by creation, newest
    /// first), `limit` (at most [`MAX_EVENT_PAGE`]) per page from `cursor`
    /// (a page's `next_cursor`); only those `filter` admits. A
    /// session never appears twice in one walk of the pages and every
    /// session not active during the walk appears once; one active during
    /// the walk moves ahead of the pages already read (a fresh first page
    /// has it). A malformed cursor is [`StoreError::Invalid`]; a store that
    /// cannot order by activity answers that too.
    fn list_sessions_by_activity<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        let _ = (cursor, limit, filter);
        Box::pin(async {
            Err(StoreError::Invalid(
                "this store cannot list sessions by activity".to_owned(),
            ))
        })
    }

    /// Up to `limit` ids, in id order after `after`, of the sessions with
    /// work stored: submissions queued, or a turn in flight. A host loads
    /// them when it starts, so that nothing acknowledged waits for a request.
    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>>;

    /// Renames or deletes a session ([`SessionEdit`]). Returns whether the
    /// session existed.
    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: SessionEdit<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
}

/// What is said in terms of [`CheckpointStore`], for every store.
pub trait CheckpointStoreExt: CheckpointStore {
    /// Appends events and an optional checkpoint write atomically. Fails with
    /// [`StoreError::UnknownSession`] if the session has no checkpoint.
    fn append<'a>(
        &'a self,
        session_id: &'a str,
        batch: AppendBatch,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        self.append_open(session_id, Arc::new(OpenBatch::new(batch)))
    }

    /// Lists up to `limit` sessions, most recently updated first (ties by
    /// id): every page of [`CheckpointStore::list_sessions_page`], sorted.
    fn list_sessions(&self, limit: usize) -> BoxFuture<'_, Result<Vec<SessionSummary>, StoreError>> {
        Box::pin(async move {
            let mut sessions = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = self
                    .list_sessions_page(cursor.as_deref(), MAX_EVENT_PAGE, SessionFilter::bot(None))
                    .await?;
                sessions.extend(page.sessions);
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            sessions.sort_by(|a, b| {
                b.updated_at_ms
                    .cmp(&a.updated_at_ms)
                    .then_with(|| a.session_id.cmp(&b.session_id))
            });
            sessions.truncate(limit);
            Ok(sessions)
        })
    }

    /// Sets a session's title ([`SessionEdit::Rename`]). Returns whether the
    /// session exists.
    fn rename_session<'a>(&'a self, session_id: &'a str, title: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.edit_session(session_id, SessionEdit::Rename { title })
    }

    /// Deletes a session for good ([`SessionEdit::Delete`]). Returns whether
    /// the session existed.
    fn delete_session<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.edit_session(session_id, SessionEdit::Delete)
    }
}

impl<T: CheckpointStore + ?Sized> CheckpointStoreExt for T {}
