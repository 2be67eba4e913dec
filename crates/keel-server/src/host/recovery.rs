//! Recovery at start: the sessions a stopped runtime left with work are
//! loaded so that their work runs without waiting for a request.

use super::Host;
use super::client_deadlines::waits_durably;

/// Sessions with stored work listed per store read at start.
const RECOVERY_PAGE: usize = 500;

impl Host {
    /// Loads the sessions left with work by a runtime that stopped: a turn
    /// in flight (closed as `runtime_stopped`) or acknowledged messages
    /// still queued (a crash after a `202`, or during an earlier recovery),
    /// so they run without waiting for a request. Turns waiting for approval
    /// or for a client's result wait on, unloaded, with whatever is queued
    /// behind them (a client call's deadline is armed; one that passed
    /// while the server was down loads the session, to time the call out).
    pub(crate) async fn recover(&self) {
        if self.cluster.is_some() {
            // The take-over sweep claims what no live node runs.
            self.sweep.notify_one();
            return;
        }
        let mut after: Option<String> = None;
        let mut loaded = 0;
        loop {
            let page = match self.store.sessions_with_work(after.as_deref(), RECOVERY_PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "cannot list sessions to recover");
                    return;
                }
            };
            let last = page.len() < RECOVERY_PAGE;
            after = page.last().cloned();
            for session_id in page {
                match self.store.session_summary(&session_id).await {
                    Ok(Some(summary)) if waits_durably(&summary) => {
                        self.arm_client_deadline(&summary);
                        continue;
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::warn!(%session_id, %error, "cannot read a session to recover");
                        continue;
                    }
                }
                if loaded >= self.limits.max_live || self.is_closing() {
                    if loaded >= self.limits.max_live {
                        tracing::warn!(%session_id, "more sessions have stored work than may be live; the rest wait for a request");
                    }
                    return;
                }
                match self.acquire(&session_id).await {
                    Ok(_lease) => {
                        tracing::info!(%session_id, "loaded a session with stored work");
                        loaded += 1;
                    }
                    Err(error) => tracing::warn!(%session_id, %error, "cannot recover session"),
                }
            }
            if last {
                return;
            }
        }
    }
}
