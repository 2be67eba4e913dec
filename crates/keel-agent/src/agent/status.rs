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
    /// Calls of the running turn to tools the client executes, waiting for
    /// their result.
    pub awaiting_client: Vec<String>,
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
    awaiting_client: Vec<String>,
    /// The task took a submission and is acting on it; a turn may be about
    /// to start.
    working: bool,
    /// The sequence of the newest queued submission the task had taken
    /// when it last went idle. One accepted after it (a higher sequence) is
    /// still to act on, even once the task has received it and before it
    /// shows as working.
    acted: u64,
}

impl StatusCell {
    fn with<T>(&self, f: impl FnOnce(&mut Activity) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|poison| poison.into_inner()))
    }

    pub(super) fn set_working(&self, working: bool) {
        self.with(|activity| activity.working = working);
    }

    /// The task waits for work, having taken every queued submission up to
    /// sequence `acted`.
    pub(super) fn set_idle(&self, acted: u64) {
        self.with(|activity| {
            activity.working = false;
            activity.acted = activity.acted.max(acted);
        });
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
            activity.awaiting_client.clear();
        });
    }

    pub(super) fn set_awaiting_client(&self, calls: &[String]) {
        self.with(|activity| activity.awaiting_client = calls.to_vec());
    }

    pub(super) fn set_awaiting_approval(&self, calls: &[String]) {
        self.with(|activity| activity.awaiting_approval = calls.to_vec());
    }

    /// The snapshot, with the queue length, the sequence of the newest
    /// queued submission accepted (`last_queued`) and the log's last
    /// sequence filled in by the caller. A session that took a submission
    /// but has not started acting on it yet is busy.
    pub(super) fn snapshot(&self, queued: usize, last_queued: u64, last_sequence: u64) -> SessionStatus {
        self.with(|activity| SessionStatus {
            running_turn_id: activity.running_turn_id.clone(),
            queued,
            awaiting_approval: activity.awaiting_approval.clone(),
            awaiting_client: activity.awaiting_client.clone(),
            last_sequence,
            busy: activity.working || activity.running_turn_id.is_some() || queued > 0 || last_queued > activity.acted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Between taking a submission off the queue and showing as working,
    /// the session is busy: the submission was accepted after it last went
    /// idle.
    #[test]
    fn a_submission_taken_but_not_yet_acted_on_keeps_the_session_busy() {
        let cell = StatusCell::default();
        cell.set_idle(0);
        assert!(!cell.snapshot(0, 0, 0).busy);
        // Accepted as sequence 1, then received: the queue is empty again.
        assert!(cell.snapshot(0, 1, 0).busy, "taken but not acted on");
        cell.set_working(true);
        assert!(cell.snapshot(0, 1, 0).busy);
        cell.set_idle(1);
        assert!(!cell.snapshot(0, 1, 3).busy);
        assert!(cell.snapshot(1, 1, 3).busy, "a place reserved in the queue");
    }
}
