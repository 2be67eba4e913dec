//! What a live session is doing, shared between its task and its handles.

use std::sync::Mutex;

use serde::Serialize;

/// A snapshot of a live session's activity.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionStatus {
    /// The turn running now, if any.
    pub running_turn_id: Option<String>,
    /// Submissions waiting in the queue (not counting control ops).
    pub queued: usize,
    /// Tool calls of the running turn waiting for the user's decision.
    pub awaiting_approval: Vec<String>,
    /// The sequence of the newest committed event.
    pub last_sequence: u64,
    /// Whether a new message would have to wait: a turn runs (or is about to
    /// start), or messages are queued ahead of it.
    pub busy: bool,
}

/// The part of [`SessionStatus`] the session task keeps up to date.
#[derive(Debug, Default)]
pub(super) struct StatusCell {
    inner: Mutex<Activity>,
}

#[derive(Debug, Default)]
struct Activity {
    running_turn_id: Option<String>,
    awaiting_approval: Vec<String>,
    /// The task took a submission and is acting on it; a turn may be about
    /// to start.
    working: bool,
}

impl StatusCell {
    fn with<T>(&self, f: impl FnOnce(&mut Activity) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|poison| poison.into_inner()))
    }

    pub(super) fn set_working(&self, working: bool) {
        self.with(|activity| activity.working = working);
    }

    pub(super) fn begin_turn(&self, turn_id: &str) {
        self.with(|activity| {
            activity.running_turn_id = Some(turn_id.to_owned());
            activity.working = true;
        });
    }

    pub(super) fn end_turn(&self) {
        self.with(|activity| {
            activity.running_turn_id = None;
            activity.awaiting_approval.clear();
        });
    }

    pub(super) fn set_awaiting_approval(&self, calls: &[String]) {
        self.with(|activity| activity.awaiting_approval = calls.to_vec());
    }

    /// The snapshot, with the queue length and sequence filled in by the
    /// caller. A session that took a submission but has not started its turn
    /// yet is busy.
    pub(super) fn snapshot(&self, queued: usize, last_sequence: u64) -> SessionStatus {
        self.with(|activity| SessionStatus {
            running_turn_id: activity.running_turn_id.clone(),
            queued,
            awaiting_approval: activity.awaiting_approval.clone(),
            last_sequence,
            busy: activity.working || activity.running_turn_id.is_some() || queued > 0,
        })
    }
}
