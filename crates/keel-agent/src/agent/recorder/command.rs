//! What a recorder's handles send its task, and the state they share.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tokio::sync::{Notify, oneshot};

use keel_protocol::{Error, Event, Result};
use keel_store::{CheckpointWrite, EncodedEvent};

/// An event serialized once, with the event kept for delivery.
pub(super) struct PendingEvent {
    pub(super) event: Event,
    pub(super) encoded: EncodedEvent,
}

/// What a handle queues for the recorder's task.
pub(super) enum Command {
    /// Events (maybe none) and a checkpoint write that commit together.
    Append {
        events: Vec<PendingEvent>,
        checkpoint: Option<Box<CheckpointWrite>>,
        bytes: usize,
        ack: Option<oneshot::Sender<Result<u64>>>,
    },
    /// Answer once every earlier command is stored and delivered.
    Flush(oneshot::Sender<Result<()>>),
}

/// The state a recorder's handles share with its task.
pub(super) struct Shared {
    /// The session the recorder writes to.
    pub(super) session_id: String,
    /// Bytes of events queued and not yet delivered, against
    /// `RECORDER_EVENT_BYTE_BUDGET`.
    pub(super) queued_bytes: AtomicUsize,
    /// Signalled whenever bytes are released or the recorder stops.
    pub(super) room: Notify,
    /// Why the recorder stopped, once it has.
    pub(super) failure: OnceLock<String>,
    /// Durably queued submissions the session has not recorded anything
    /// for yet: the first event that carries one of their ids takes it off
    /// the stored queue, in the same commit.
    pub(super) unsettled: Mutex<HashSet<String>>,
    /// `unsettled.len()`, read without the lock on every event.
    pub(super) unsettled_count: AtomicUsize,
    /// The sequence of the newest committed event.
    pub(super) last_sequence: AtomicU64,
}

impl Shared {
    /// Gives `bytes` of the budget back and wakes the producers waiting for room.
    pub(super) fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.room.notify_waiters();
        }
    }

    /// The error sends get once the recorder has stopped.
    pub(super) fn stopped(&self) -> Error {
        match self.failure.get() {
            Some(reason) => Error::stopped(format!("event recorder stopped: {reason}")),
            None => Error::stopped("event recorder is closed"),
        }
    }
}

impl Command {
    /// The bytes of the budget the command holds.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Command::Append { bytes, .. } => *bytes,
            Command::Flush(_) => 0,
        }
    }
}
