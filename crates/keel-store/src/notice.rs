//! Notices from the store about work elsewhere: another node appended to a
//! session's log, relayed a submission to a session, or answered one.
//! Backend-neutral, so the server follows other nodes without naming the
//! backend that tells it.
//!
//! A log notice carries a session id and a sequence, never events: a
//! consumer reads the events from the log. Notices can be missed (a connection was
//! lost, the consumer fell behind); the listener then yields
//! [`LogNotice::Resync`], after which the consumer re-reads what it follows.

use tokio::sync::mpsc;

use crate::{RelayOutcome, RelayedSubmission};
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
