//! The event recorder: persists a session's events, then delivers them.
//!
//! One recorder task runs per session. Producers queue events through an
//! [`EventRecorder`] handle. The task takes everything queued, hands it to
//! the store as an [`OpenBatch`](keel_store::OpenBatch), and keeps adding what producers queue
//! meanwhile until the store's writer seals the batch (the writer is usually
//! busy with the previous group commit, so a turn's events tend to land in
//! one commit, shared with other sessions'). Only after the commit does it
//! hand the events, in order, to the delivery queue. Nothing reaches a
//! consumer before it is durable.
//!
//! Everything is bounded: the command queue by [`RECORDER_COMMAND_CAPACITY`]
//! entries, queued events by [`RECORDER_EVENT_BYTE_BUDGET`] bytes of JSON,
//! the delivery queue by [`EVENT_QUEUE_CAPACITY`] events. A slow consumer
//! fills the delivery queue, which stalls the recorder, which fills the
//! command queue, which makes producers wait (or fail, for
//! [`try_send_event`]). Accepted events are never dropped.
//!
//! A store failure stops the recorder: every pending caller gets the error,
//! nothing more is delivered, the delivery queue closes.
//!
//! This module is the handle (encoding and budgeting what producers queue);
//! `task` is the recorder's task, `batch` the group commit it fills,
//! `scrub` the redaction of every command, and `command` what the handle
//! and the task share.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Notify, mpsc, oneshot};

use keel_protocol::{Event, EventMsg, RecordedEvent};

mod batch;
mod command;
mod scrub;
mod task;
#[cfg(test)]
mod tests;

use self::command::{Command, PendingEvent, Shared};
use self::task::RecorderTask;
use keel_protocol::{Error, Result};
use keel_store::{CheckpointStore, CheckpointWrite, EncodedEvent, QueueChange};

/// Recorded events waiting for the consumer. When it is full the recorder
/// waits, which is how a slow consumer slows the producers down.
pub const EVENT_QUEUE_CAPACITY: usize = 256;

/// Commands (event groups, checkpoint writes, flushes) a recorder can hold.
pub const RECORDER_COMMAND_CAPACITY: usize = 1024;

/// Serialized bytes of events a recorder can hold before they are delivered.
pub const RECORDER_EVENT_BYTE_BUDGET: usize = 8 * 1024 * 1024;

/// The most commands one store batch takes. `1` (see [`RecorderOptions`])
/// gives one transaction per event: the baseline group commit is measured against.
const DEFAULT_MAX_BATCH: usize = RECORDER_COMMAND_CAPACITY;

const QUEUE_FULL: &str = "event recorder queue is full";

/// Tuning of a recorder.
#[derive(Debug, Clone, Copy)]
pub struct RecorderOptions {
    /// The most queued commands written in one store batch.
    pub max_batch: usize,
    /// The session lease this recorder writes under (from
    /// `CheckpointStore::acquire`); if the session is taken over, its next
    /// batch is refused and the recorder stops.
    pub lease: Option<u64>,
}

impl Default for RecorderOptions {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            lease: None,
        }
    }
}

/// A handle to a session's recorder. Cloneable; the recorder runs until every
/// handle is dropped and its queue is drained.
#[derive(Clone)]
pub struct EventRecorder {
    commands: mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

/// A handle that does not keep the recorder alive.
#[derive(Clone)]
pub struct WeakEventRecorder {
    commands: mpsc::WeakSender<Command>,
    shared: Arc<Shared>,
}

impl WeakEventRecorder {
    /// The sequence of the newest event the recorder committed.
    pub fn last_sequence(&self) -> u64 {
        self.shared.last_sequence.load(Ordering::Acquire)
    }

    /// The handle again, if the recorder is still alive.
    pub fn upgrade(&self) -> Option<EventRecorder> {
        Some(EventRecorder {
            commands: self.commands.upgrade()?,
            shared: Arc::clone(&self.shared),
        })
    }
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder")
            .field("session_id", &self.shared.session_id)
            .finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// Starts the recorder of `session_id` on the current tokio runtime.
    /// Returns its handle and the queue recorded events are delivered to.
    pub fn spawn(store: Arc<dyn CheckpointStore>, session_id: String) -> (Self, mpsc::Receiver<RecordedEvent>) {
        Self::spawn_with(store, session_id, RecorderOptions::default())
    }

    /// [`Self::spawn`] with explicit options.
    pub fn spawn_with(
        store: Arc<dyn CheckpointStore>,
        session_id: String,
        options: RecorderOptions,
    ) -> (Self, mpsc::Receiver<RecordedEvent>) {
        let (commands, command_rx) = mpsc::channel(RECORDER_COMMAND_CAPACITY);
        let (delivery, delivered) = mpsc::channel(EVENT_QUEUE_CAPACITY);
        let shared = Arc::new(Shared {
            session_id,
            queued_bytes: AtomicUsize::new(0),
            room: Notify::new(),
            failure: OnceLock::new(),
            unsettled: Mutex::new(HashSet::new()),
            unsettled_count: AtomicUsize::new(0),
            last_sequence: AtomicU64::new(0),
        });
        let task = RecorderTask {
            store,
            shared: Arc::clone(&shared),
            commands: command_rx,
            delivery,
            max_batch: options.max_batch.max(1),
            lease: options.lease,
            scrub: scrub::Scrubber::default(),
        };
        tokio::spawn(task.run());
        (Self { commands, shared }, delivered)
    }

    /// The session this recorder writes to.
    pub fn session_id(&self) -> &str {
        &self.shared.session_id
    }

    /// The sequence of the newest event this recorder committed (0 before
    /// the first).
    pub fn last_sequence(&self) -> u64 {
        self.shared.last_sequence.load(Ordering::Acquire)
    }

    /// Marks `submission_id` as queued in the store: the first event
    /// recorded later with this submission id removes it from the stored
    /// queue, atomically with that event.
    pub(crate) fn expect_settlement(&self, submission_id: String) {
        let mut unsettled = self
            .shared
            .unsettled
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        unsettled.insert(submission_id);
        self.shared.unsettled_count.store(unsettled.len(), Ordering::Release);
    }

    /// Whether `event` is the first one for a durably queued submission;
    /// if so it is no longer waited for.
    fn settles(&self, event: &Event) -> Option<String> {
        if self.shared.unsettled_count.load(Ordering::Acquire) == 0
            || matches!(event.msg, EventMsg::SubmissionQueued(_))
        {
            return None;
        }
        let id = event.submission_id.as_ref()?;
        let mut unsettled = self
            .shared
            .unsettled
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let settled = unsettled.remove(id);
        self.shared.unsettled_count.store(unsettled.len(), Ordering::Release);
        settled.then(|| id.clone())
    }

    /// A handle that does not keep the recorder alive.
    pub fn downgrade(&self) -> WeakEventRecorder {
        WeakEventRecorder {
            commands: self.commands.downgrade(),
            shared: Arc::clone(&self.shared),
        }
    }

    /// Waits until every command queued before this call is stored and
    /// delivered. Fails with [`Error::Stopped`] if the recorder stopped first.
    pub async fn flush(&self) -> Result<()> {
        let (ack, done) = oneshot::channel();
        self.commands
            .send(Command::Flush(ack))
            .await
            .map_err(|_| self.shared.stopped())?;
        done.await.map_err(|_| self.shared.stopped())?
    }

    /// Queues `events` and an optional checkpoint write to be committed
    /// together, waiting for room in the queue but not for the commit.
    pub async fn append(&self, events: Vec<Event>, checkpoint: Option<CheckpointWrite>) -> Result<()> {
        let command = self.encode(events, checkpoint, None)?;
        self.send(command).await
    }

    /// [`Self::append`], then waits until the group is stored and delivered.
    /// Returns the sequence of the last event (or of the log's end).
    pub async fn commit(&self, events: Vec<Event>, checkpoint: Option<CheckpointWrite>) -> Result<u64> {
        self.append_with_receipt(events, checkpoint).await?.await
    }

    /// [`Self::append`], answering a future that resolves as [`Self::commit`]
    /// does: the caller can act between queueing the group and its commit
    /// (events queued after it still commit after it).
    pub async fn append_with_receipt(
        &self,
        events: Vec<Event>,
        checkpoint: Option<CheckpointWrite>,
    ) -> Result<impl Future<Output = Result<u64>> + Send + use<>> {
        let (ack, done) = oneshot::channel();
        let command = self.encode(events, checkpoint, Some(ack))?;
        self.send(command).await?;
        let shared = Arc::clone(&self.shared);
        Ok(async move { done.await.map_err(|_| shared.stopped())? })
    }

    /// Resolves once the recorder has stopped (after a store failure, or
    /// when every other handle is gone); then every send fails.
    pub async fn stopped(&self) {
        self.commands.closed().await;
    }

    /// The error sends get once the recorder has stopped.
    pub fn stop_error(&self) -> Error {
        self.shared.stopped()
    }

    /// Whether the queue is past half its command or byte capacity. The turn
    /// loop stops polling the model while it is, which pushes back on the
    /// provider instead of buffering.
    pub fn is_congested(&self) -> bool {
        // A stopped recorder is not congested: sends to it fail at once, and
        // waiting for room would never end.
        !self.commands.is_closed() && self.commands.capacity() < RECORDER_COMMAND_CAPACITY / 2
            || !self.commands.is_closed()
                && self.shared.queued_bytes.load(Ordering::Acquire) > RECORDER_EVENT_BYTE_BUDGET / 2
    }

    /// Waits until the queue is no longer congested (or the recorder stopped).
    pub async fn wait_for_room(&self) {
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if !self.is_congested() || self.commands.is_closed() {
                return;
            }
            room.await;
        }
    }

    fn encode(
        &self,
        events: Vec<Event>,
        checkpoint: Option<CheckpointWrite>,
        ack: Option<oneshot::Sender<Result<u64>>>,
    ) -> Result<Command> {
        let mut bytes = 0;
        let mut pending = Vec::with_capacity(events.len());
        for event in events {
            let mut encoded = EncodedEvent::encode(&event)?;
            if let Some(id) = self.settles(&event) {
                encoded.queue = Some(QueueChange::Settled(id));
            }
            bytes += encoded.json.len();
            pending.push(PendingEvent { event, encoded });
        }
        if bytes > RECORDER_EVENT_BYTE_BUDGET {
            return Err(Error::InvalidInput(format!(
                "events of {bytes} bytes exceed the recorder's budget of {RECORDER_EVENT_BYTE_BUDGET}"
            )));
        }
        Ok(Command::Append {
            events: pending,
            checkpoint: checkpoint.map(Box::new),
            bytes,
            ack,
        })
    }

    fn try_reserve_bytes(&self, bytes: usize) -> bool {
        self.shared
            .queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                let total = queued.checked_add(bytes)?;
                (total <= RECORDER_EVENT_BYTE_BUDGET).then_some(total)
            })
            .is_ok()
    }

    fn try_send(&self, command: Command) -> Result<()> {
        let bytes = command.bytes();
        if !self.try_reserve_bytes(bytes) {
            return Err(if self.commands.is_closed() {
                self.shared.stopped()
            } else {
                Error::stopped(QUEUE_FULL)
            });
        }
        self.commands.try_send(command).map_err(|error| {
            self.shared.release(bytes);
            match error {
                mpsc::error::TrySendError::Full(_) => Error::stopped(QUEUE_FULL),
                mpsc::error::TrySendError::Closed(_) => self.shared.stopped(),
            }
        })
    }

    async fn send(&self, command: Command) -> Result<()> {
        let bytes = command.bytes();
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if self.try_reserve_bytes(bytes) {
                break;
            }
            if self.commands.is_closed() {
                return Err(self.shared.stopped());
            }
            room.await;
        }
        self.commands.send(command).await.map_err(|_| {
            self.shared.release(bytes);
            self.shared.stopped()
        })
    }
}

/// Records `event` and waits until it is stored and handed to the delivery
/// queue. Returns its sequence.
pub async fn send_event(recorder: &EventRecorder, event: Event) -> Result<u64> {
    recorder.commit(vec![event], None).await
}

/// Queues `event` without waiting. Fails with `agent stopped: event recorder
/// queue is full` when the command queue or the byte budget is exhausted;
/// everything accepted before is still recorded and delivered.
pub fn try_send_event(recorder: &EventRecorder, event: Event) -> Result<()> {
    let command = recorder.encode(vec![event], None, None)?;
    recorder.try_send(command)
}
