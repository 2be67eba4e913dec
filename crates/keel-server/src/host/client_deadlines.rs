//! Timing out client tool calls of sessions that are not loaded.
//!
//! A turn waiting for a client's result is at rest: the host may unload
//! its session, and a restart leaves it unloaded. A loaded session times
//! its calls out itself; for the others the host keeps one timer per
//! waiting session, at the earliest deadline of its calls (as stored in its
//! summary), armed when such a session is unloaded and when the host finds
//! one at start or in a take-over sweep. When the deadline passes the
//! session is loaded: it resumes its wait, finds the deadline passed, and
//! answers the calls as errors, durably, as if it had stayed loaded.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use super::Host;
use keel_protocol::now_ms;
use keel_store::SessionSummary;

/// The deadlines to act on: `(when, session)`, earliest first.
#[derive(Debug, Default)]
pub(super) struct ClientDeadlines {
    due: Mutex<BTreeSet<(u64, String)>>,
    changed: tokio::sync::Notify,
}

impl ClientDeadlines {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeSet<(u64, String)>) -> T) -> T {
        f(&mut self.due.lock().unwrap_or_else(|poison| poison.into_inner()))
    }

    /// Arms a timer for `session_id` at `at_ms`.
    fn arm(&self, session_id: &str, at_ms: u64) {
        self.with(|due| due.insert((at_ms, session_id.to_owned())));
        self.changed.notify_one();
    }

    /// The earliest deadline.
    fn next(&self) -> Option<u64> {
        self.with(|due| due.first().map(|(at, _)| *at))
    }

    /// Takes the sessions whose deadline is `now_ms` or earlier.
    fn take_due(&self, now_ms: u64) -> Vec<String> {
        self.with(|due| {
            let later = due.split_off(&(now_ms.saturating_add(1), String::new()));
            std::mem::replace(due, later)
                .into_iter()
                .map(|(_, session_id)| session_id)
                .collect()
        })
    }
}

/// Whether the stored session waits durably with nothing due: for
/// approvals, or for client results none of which has timed out.
pub(super) fn waits_durably(summary: &SessionSummary) -> bool {
    let waiting = !summary.awaiting_approval.is_empty() || !summary.awaiting_client.is_empty();
    waiting && !client_deadline_passed(summary)
}

/// Whether a client call of the stored session has timed out.
fn client_deadline_passed(summary: &SessionSummary) -> bool {
    summary.client_deadline_ms.is_some_and(|at| at <= now_ms())
}

impl Host {
    /// Arms the timer of a stored session that waits for client results
    /// with a deadline (nothing otherwise).
    pub(super) fn arm_client_deadline(&self, summary: &SessionSummary) {
        if let Some(at) = summary
            .client_deadline_ms
            .filter(|_| !summary.awaiting_client.is_empty())
        {
            self.client_deadlines.arm(&summary.session_id, at);
        }
    }

    /// Arms the timer of `session_id` from its stored summary: after it was
    /// unloaded while waiting for a client.
    pub(super) async fn arm_client_deadline_of(&self, session_id: &str) {
        match self.store.session_summary(session_id).await {
            Ok(Some(summary)) => self.arm_client_deadline(&summary),
            Ok(None) => {}
            Err(error) => tracing::warn!(%session_id, %error, "cannot read a session to time its client calls"),
        }
    }

    /// Loads the sessions whose client calls time out while they are not
    /// loaded, each when its deadline passes, until the server shuts down.
    pub(crate) async fn follow_client_deadlines(&self) {
        let mut closing = self.closing.subscribe();
        loop {
            let wait = match self.client_deadlines.next() {
                Some(at) => Duration::from_millis(at.saturating_sub(now_ms())),
                None => Duration::MAX,
            };
            tokio::select! {
                _ = closing.wait_for(|closing| *closing) => return,
                () = self.client_deadlines.changed.notified() => continue,
                () = tokio::time::sleep(wait), if wait != Duration::MAX => {}
            }
            for session_id in self.client_deadlines.take_due(now_ms()) {
                self.wake_for_deadline(&session_id).await;
            }
        }
    }

    /// Loads `session_id` if a client call of it timed out and no runtime
    /// (here or on another node) has it; re-arms a deadline moved later.
    async fn wake_for_deadline(&self, session_id: &str) {
        if self.is_closing() || self.status(session_id).is_some() {
            return;
        }
        let summary = match self.store.session_summary(session_id).await {
            Ok(Some(summary)) if !summary.awaiting_client.is_empty() => summary,
            Ok(_) => return,
            Err(error) => {
                tracing::warn!(%session_id, %error, "cannot read a session to time its client calls");
                return;
            }
        };
        if !client_deadline_passed(&summary) {
            self.arm_client_deadline(&summary);
            return;
        }
        match self.acquire(session_id).await {
            Ok(_session) => tracing::info!(%session_id, "loaded a session to time out its client tool calls"),
            Err(error) => tracing::debug!(%session_id, %error, "a session whose client call timed out was not loaded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_come_due_in_order_and_only_once() {
        let deadlines = ClientDeadlines::default();
        deadlines.arm("b", 20);
        deadlines.arm("a", 10);
        deadlines.arm("c", 30);
        assert_eq!(deadlines.next(), Some(10));
        assert_eq!(deadlines.take_due(5), Vec::<String>::new());
        assert_eq!(deadlines.take_due(20), ["a", "b"]);
        assert_eq!(deadlines.take_due(20), Vec::<String>::new());
        assert_eq!(deadlines.next(), Some(30));
    }
}
