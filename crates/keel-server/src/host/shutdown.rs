//! Shutting the host down: no new work, a grace period for running turns,
//! then every live session stopped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Host;
use super::live::{LiveSession, at_rest};
use super::pump::close_mode;
use keel_agent::SubmitOptions;
use keel_protocol::Op;

/// How long an interrupted turn may take to close at shutdown.
const INTERRUPT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a settling session's status is looked at.
const SETTLE_POLL: Duration = Duration::from_millis(20);

impl Host {
    /// Stops accepting work: requests get `503 unavailable`, streams end.
    pub(crate) fn begin_shutdown(&self) {
        self.closing.send_replace(true);
    }

    /// Stops every live session: running turns get the grace period to
    /// finish, then are interrupted; then each session shuts down.
    pub(crate) async fn close_all(&self) {
        self.begin_shutdown();
        let deadline = Instant::now() + self.limits.shutdown_grace;
        let slots = self.slots_now();
        futures::future::join_all(slots.into_iter().map(|slot| async move {
            let mut live = slot.live.lock().await;
            if let Some(session) = live.take() {
                self.released();
                self.settle_and_close(session, deadline).await;
            }
        }))
        .await;
    }

    /// Waits until the session is at rest or the grace period is over. A
    /// turn still running then is interrupted (recording `turn_aborted`)
    /// if nothing is queued behind it; with messages queued, the session is
    /// dropped instead, so the messages stay stored and run at the next
    /// start (which closes the cut turn as `runtime_stopped` and runs them).
    async fn settle_and_close(&self, session: Arc<LiveSession>, deadline: Instant) {
        while !session.stopped() && !at_rest(&session.handle.status()) && Instant::now() < deadline {
            tokio::time::sleep(SETTLE_POLL).await;
        }
        let status = session.handle.status();
        if !session.stopped()
            && !at_rest(&status)
            && status.queued == 0
            && let Some(turn_id) = &status.running_turn_id
        {
            let interrupt = Op::Interrupt {
                turn_id: Some(turn_id.clone()),
            };
            match session.handle.submit_durable(interrupt, SubmitOptions::default()).await {
                Ok(_) => {
                    let closed = Instant::now() + INTERRUPT_TIMEOUT;
                    while !session.stopped() && session.handle.status().busy && Instant::now() < closed {
                        tokio::time::sleep(SETTLE_POLL).await;
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot interrupt a running turn at shutdown"),
            }
        }
        let mode = close_mode(&session.handle.status());
        self.close(session, mode).await;
    }
}
