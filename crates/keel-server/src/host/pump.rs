//! The pump: the task that owns a live session's agent, reads its events
//! as they are committed and publishes them to the session's hub.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::fanout::Hub;
use crate::metrics::Metrics;
use keel_agent::{Agent, SessionStatus};
use keel_protocol::Op;

/// How a live session is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CloseMode {
    /// `Op::Shutdown` after the queued work; the last events are recorded.
    Graceful,
    /// Drop the agent: for a session at rest whose shutdown op would wait
    /// behind a turn (one waiting for approval), or as a last resort.
    Abort,
}

/// How to stop a session with this status: a busy one (a turn waiting for
/// approval, or messages queued) is left as it is stored for the next
/// runtime; `Op::Shutdown` would wait behind its work.
pub(super) fn close_mode(status: &SessionStatus) -> CloseMode {
    if status.busy {
        CloseMode::Abort
    } else {
        CloseMode::Graceful
    }
}

/// The task that owns a live session's agent and publishes its events.
pub(super) struct Pump {
    pub(super) agent: Agent,
    pub(super) hub: Arc<Hub>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) last_active: Arc<Mutex<Instant>>,
    pub(super) stopped: Arc<AtomicBool>,
    pub(super) published: watch::Sender<u64>,
    /// Woken by an event webhooks may want: its delivery is in the store.
    pub(super) webhooks: Arc<tokio::sync::Notify>,
}

impl Pump {
    pub(super) async fn run(mut self, mut close: oneshot::Receiver<CloseMode>) {
        loop {
            tokio::select! {
                event = self.agent.next_event() => match event {
                    Some(event) => self.publish(&event),
                    None => break,
                },
                mode = &mut close => {
                    if matches!(mode, Ok(CloseMode::Abort)) {
                        // Dropping the agent stops its task where it is; the
                        // next runtime takes the session over from the store.
                        self.stopped.store(true, Ordering::SeqCst);
                        return;
                    }
                    self.shut_down().await;
                    break;
                }
            }
        }
        self.stopped.store(true, Ordering::SeqCst);
        let session_id = self.agent.session_id().to_owned();
        // The session task has ended (or is being dropped): report why.
        if let Err(error) = self.agent.shutdown().await {
            tracing::warn!(%session_id, %error, "session stopped");
        }
    }

    fn publish(&self, event: &keel_protocol::RecordedEvent) {
        self.metrics.events_recorded.inc();
        *self.last_active.lock().unwrap_or_else(|poison| poison.into_inner()) = Instant::now();
        self.hub.publish(event);
        self.published.send_replace(event.sequence);
        if event.msg.webhook_type().is_some() {
            self.webhooks.notify_one();
        }
    }

    /// Queues `Op::Shutdown` and publishes the events up to the last one.
    async fn shut_down(&mut self) {
        let sender = self.agent.sender().clone();
        {
            let submit = sender.submit_wait(Op::Shutdown);
            tokio::pin!(submit);
            loop {
                tokio::select! {
                    _ = &mut submit => break,
                    event = self.agent.next_event() => match event {
                        Some(event) => self.publish(&event),
                        None => break,
                    },
                }
            }
        }
        drop(sender);
        while let Some(event) = self.agent.next_event().await {
            self.publish(&event);
        }
    }
}
