//! Notices from the store about work elsewhere: another node appended to a
//! session's log, relayed a submission to a session, or answered one.
//! Backend-neutral, so the server follows other nodes without naming the
//! backend that tells it.
//!
//! A log notice carries a session id and a sequence, and the commit's events
//! when they fit ([`CarriedEvents`], decoded only by a consumer that wants
//! them); otherwise a consumer reads the events from the log. Notices can
//! be missed (a connection was lost, the consumer fell behind); the
//! listener then yields [`LogNotice::Resync`], after which the consumer
//! re-reads what it follows.

use tokio::sync::mpsc;

use crate::{RelayOutcome, RelayedSubmission};
use keel_protocol::{Event, RecordedEvent, StoreError};
use tokio::task::JoinHandle;

/// What a [`NoticeListener`] yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogNotice {
    /// A commit appended events to a session; its log now ends at
    /// `last_sequence`.
    Log {
        /// The session.
        session_id: String,
        /// The sequence of the session's newest event after the commit.
        last_sequence: u64,
        /// The commit's events, when the notice had room for them.
        carried: Option<CarriedEvents>,
    },
    /// A session has submissions relayed to its owner, or was released
    /// with work left: its owner takes them up, or, when it has no live
    /// owner, another node takes it over.
    Relay {
        /// The session.
        session_id: String,
        /// The node whose live lease it was under; `None` when it had none.
        owner: Option<String>,
        /// The submission relayed, when the notice had room for it (never
        /// for a session released with work): its owner may queue it
        /// without reading it, when it knows it has not taken it up yet.
        carried: Option<Box<RelayedSubmission>>,
    },
    /// The owner of a session answered submissions relayed to it: the
    /// nodes waiting for an answer take it from here, or read it where it
    /// is not here.
    Answered {
        /// The session.
        session_id: String,
        /// The answers, by relayed submission id, when they fit in the
        /// notice (PostgreSQL's payloads are small); empty otherwise.
        answers: Vec<(u64, RelayOutcome)>,
    },
    /// Notices may have been missed (the connection was lost and is back,
    /// or the consumer fell behind): re-read from the log whatever is
    /// followed.
    Resync,
}

/// The events one commit appended to a session, as a log notice carried
/// them: the stored JSON array (base64), decoded on demand, since every node
/// hears every commit and most have no one following the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CarriedEvents {
    /// When the commit recorded them.
    pub(crate) recorded_at_ms: u64,
    /// The stored events, base64.
    pub(crate) encoded: String,
}

impl CarriedEvents {
    /// `events`, recorded at `recorded_at_ms`, as a notice carries them:
    /// for a backend that tells other nodes of its commits, and for tests.
    pub fn encode(recorded_at_ms: u64, events: &[Event]) -> Result<Self, StoreError> {
        use base64::Engine as _;
        let json = events
            .iter()
            .map(|event| serde_json::to_string(event).map_err(|error| StoreError::Encode(error.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let stored = crate::codec::encode(crate::codec::json_array(json)).into_bytes();
        Ok(Self {
            recorded_at_ms,
            encoded: base64::engine::general_purpose::STANDARD.encode(stored),
        })
    }

    /// The events, numbered so that the last is `last_sequence` (the
    /// notice's); [`StoreError::Corrupt`] when they do not decode.
    pub fn events(&self, session_id: &str, last_sequence: u64) -> Result<Vec<RecordedEvent>, StoreError> {
        use base64::Engine as _;
        let what = || format!("the events a notice carried up to {last_sequence} of session '{session_id}'");
        let stored = base64::engine::general_purpose::STANDARD
            .decode(&self.encoded)
            .map_err(|error| StoreError::Corrupt {
                what: what(),
                detail: error.to_string(),
            })?;
        let batch: Vec<Event> = crate::rows::decode(&crate::codec::decode(&stored), what)?;
        let first = (last_sequence + 1)
            .checked_sub(batch.len() as u64)
            .filter(|first| *first >= 1)
            .ok_or_else(|| StoreError::Corrupt {
                what: what(),
                detail: format!("{} events cannot end at {last_sequence}", batch.len()),
            })?;
        Ok((first..)
            .zip(batch)
            .map(|(sequence, event)| RecordedEvent {
                sequence,
                recorded_at_ms: self.recorded_at_ms,
                event,
            })
            .collect())
    }
}

/// A stream of [`LogNotice`]s, fed by a backend's task (PostgreSQL's
/// `LISTEN` connection), which it stops when dropped.
#[derive(Debug)]
pub struct NoticeListener {
    notices: mpsc::Receiver<LogNotice>,
    task: JoinHandle<()>,
}

impl NoticeListener {
    /// A listener over `notices`, fed by `task`.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn new(notices: mpsc::Receiver<LogNotice>, task: JoinHandle<()>) -> Self {
        Self { notices, task }
    }

    /// The next notice; `None` only if the listener's task ended (it does
    /// not while this handle lives, unless it panicked).
    pub async fn recv(&mut self) -> Option<LogNotice> {
        self.notices.recv().await
    }

    /// A notice if one is waiting, without waiting.
    pub fn try_recv(&mut self) -> Option<LogNotice> {
        self.notices.try_recv().ok()
    }
}

impl Drop for NoticeListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}
