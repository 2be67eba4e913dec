//! The event recorder: persists a session's events, then delivers them.
//!
//! One recorder task runs per session. Producers queue events through an
//! [`EventRecorder`] handle. The task takes everything queued, hands it to
//! the store as an [`OpenBatch`], and keeps adding what producers queue
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

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{Notify, mpsc, oneshot};

use keel_protocol::{Event, EventMsg, RecordedEvent};

mod scrub;
use keel_protocol::{Error, Result};
use keel_store::{
    AppendBatch, AppendReceipt, CheckpointStore, CheckpointWrite, EncodedEvent, OpenBatch, QueueChange, StoreError,
};

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

/// An event serialized once, with the event kept for delivery.
struct PendingEvent {
    event: Event,
    encoded: EncodedEvent,
}

enum Command {
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

struct Shared {
    session_id: String,
    queued_bytes: AtomicUsize,
    /// Signalled whenever bytes are released or the recorder stops.
    room: Notify,
    /// Why the recorder stopped, once it has.
    failure: OnceLock<String>,
    /// Durably queued submissions the session has not recorded anything
    /// for yet: the first event that carries one of their ids takes it off
    /// the stored queue, in the same commit.
    unsettled: Mutex<HashSet<String>>,
    /// `unsettled.len()`, read without the lock on every event.
    unsettled_count: AtomicUsize,
    /// The sequence of the newest committed event.
    last_sequence: AtomicU64,
}

impl Shared {
    fn release(&self, bytes: usize) {
        if bytes > 0 {
            self.queued_bytes.fetch_sub(bytes, Ordering::AcqRel);
            self.room.notify_waiters();
        }
    }

    fn stopped(&self) -> Error {
        match self.failure.get() {
            Some(reason) => Error::stopped(format!("event recorder stopped: {reason}")),
            None => Error::stopped("event recorder is closed"),
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

impl Command {
    fn bytes(&self) -> usize {
        match self {
            Command::Append { bytes, .. } => *bytes,
            Command::Flush(_) => 0,
        }
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

/// The recorder's task: drain, persist, deliver, acknowledge.
struct RecorderTask {
    store: Arc<dyn CheckpointStore>,
    shared: Arc<Shared>,
    commands: mpsc::Receiver<Command>,
    delivery: mpsc::Sender<RecordedEvent>,
    max_batch: usize,
    lease: Option<u64>,
    /// Redacts each command as it is taken from the queue, in order.
    scrub: scrub::Scrubber,
}

/// What to do, in order, once a batch is committed.
enum Settle {
    Deliver {
        events: Vec<Event>,
        bytes: usize,
        ack: Option<oneshot::Sender<Result<u64>>>,
    },
    Flush(oneshot::Sender<Result<()>>),
}

/// The batch being written, and what to do for each command in it.
struct Batch {
    open: Arc<OpenBatch>,
    settles: Vec<Settle>,
    /// Whether any command in it writes something (not only flushes).
    writes: bool,
    /// Whether it takes no more commands: it holds the end of a turn, so
    /// the log has a batch boundary there (a fork can start at any turn's
    /// end, and a batch's history items cannot be split).
    closed: bool,
    max: usize,
}

impl Batch {
    fn new(max: usize, lease: Option<u64>) -> Self {
        Self {
            open: Arc::new(OpenBatch::new(AppendBatch {
                lease,
                ..AppendBatch::default()
            })),
            settles: Vec::new(),
            writes: false,
            closed: false,
            max,
        }
    }

    /// Adds `command` if the batch has room and the store has not sealed it
    /// yet; hands it back otherwise.
    fn add(&mut self, command: Command) -> Option<Command> {
        if self.closed || self.settles.len() >= self.max {
            return Some(command);
        }
        match command {
            Command::Flush(ack) => {
                self.settles.push(Settle::Flush(ack));
                None
            }
            Command::Append {
                events,
                checkpoint,
                bytes,
                ack,
            } => {
                let ends_turn = events.iter().any(|pending| pending.event.msg.ends_turn());
                let mut parts = Some((events, checkpoint, ack));
                let mut added = false;
                self.open.add(|batch| {
                    // A history cut counts from the start of the history,
                    // which a batch that added items without cutting
                    // cannot express: such a write starts the next batch.
                    let fits = match (
                        &batch.checkpoint,
                        parts.as_ref().and_then(|(_, write, _)| write.as_deref()),
                    ) {
                        (Some(earlier), Some(later)) => earlier.can_merge(later),
                        _ => true,
                    };
                    if fits && let Some((events, checkpoint, ack)) = parts.take() {
                        added = true;
                        let mut plain = Vec::with_capacity(events.len());
                        let encoded = events.into_iter().map(|PendingEvent { event, encoded }| {
                            plain.push(event);
                            encoded
                        });
                        batch.extend(encoded, checkpoint.map(|write| *write));
                        self.settles.push(Settle::Deliver {
                            events: plain,
                            bytes,
                            ack,
                        });
                    }
                });
                self.writes |= added;
                self.closed |= added && ends_turn;
                parts.map(|(events, checkpoint, ack)| Command::Append {
                    events,
                    checkpoint,
                    bytes,
                    ack,
                })
            }
        }
    }
}

impl RecorderTask {
    async fn run(mut self) {
        // Commands not yet in a batch, oldest first: those that arrived after
        // the batch in flight was sealed start the next one.
        let mut waiting: VecDeque<Command> = VecDeque::new();
        let mut receiving = true;
        loop {
            if waiting.is_empty() {
                let mut incoming = Vec::with_capacity(self.max_batch);
                if !receiving || self.commands.recv_many(&mut incoming, self.max_batch).await == 0 {
                    break;
                }
                waiting.extend(incoming.into_iter().map(|command| self.scrub.command(command)));
            }
            let mut batch = Batch::new(self.max_batch, self.lease);
            while let Some(command) = waiting.pop_front() {
                if let Some(command) = batch.add(command) {
                    waiting.push_front(command);
                    break;
                }
            }
            // Then everything already queued, while the batch has room.
            while waiting.is_empty() {
                let Ok(command) = self.commands.try_recv() else { break };
                waiting.extend(batch.add(self.scrub.command(command)));
            }
            match self.write(&mut batch, &mut waiting, &mut receiving).await {
                Ok(receipt) => self.settle(batch.settles, receipt).await,
                Err(error) => {
                    tracing::error!(session_id = %self.shared.session_id, %error, "event recorder stopped");
                    let _ = self.shared.failure.set(error.to_string());
                    for settle in batch.settles {
                        self.fail_settle(settle, &error);
                    }
                    self.commands.close();
                    for command in waiting.drain(..) {
                        self.fail(command, &error);
                    }
                    while let Some(command) = self.commands.recv().await {
                        self.fail(command, &error);
                    }
                    break;
                }
            }
        }
        self.shared.room.notify_waiters();
    }

    /// Hands the batch to the store and, until the store has sealed and
    /// committed it, keeps adding newly queued commands to it. The first
    /// command it refuses goes to `waiting` and starts the next batch.
    async fn write(
        &mut self,
        batch: &mut Batch,
        waiting: &mut VecDeque<Command>,
        receiving: &mut bool,
    ) -> std::result::Result<Option<AppendReceipt>, StoreError> {
        if !batch.writes {
            return Ok(None);
        }
        let (store, session_id, open) = (
            Arc::clone(&self.store),
            self.shared.session_id.clone(),
            Arc::clone(&batch.open),
        );
        let write = async move { store.append_open(&session_id, open).await };
        tokio::pin!(write);
        loop {
            tokio::select! {
                biased;
                receipt = &mut write => return receipt.map(Some),
                // One at a time: once a command is refused (the batch is
                // sealed or full) the rest stay in the bounded queue.
                received = self.commands.recv(), if *receiving && waiting.is_empty() => match received {
                    Some(command) => waiting.extend(batch.add(self.scrub.command(command))),
                    None => *receiving = false,
                },
            }
        }
    }

    /// Delivers a committed batch in order and answers its commands.
    async fn settle(&self, settles: Vec<Settle>, receipt: Option<AppendReceipt>) {
        let mut next_sequence = receipt.map_or(0, |r| r.first_sequence);
        let recorded_at_ms = receipt.map_or(0, |r| r.recorded_at_ms);
        for settle in settles {
            match settle {
                Settle::Deliver { events, bytes, ack } => {
                    for event in events {
                        let recorded = RecordedEvent {
                            sequence: next_sequence,
                            recorded_at_ms,
                            event,
                        };
                        next_sequence += 1;
                        self.shared.last_sequence.store(recorded.sequence, Ordering::Release);
                        // A dropped receiver means nobody is listening; the
                        // event is stored all the same.
                        let _ = self.delivery.send(recorded).await;
                    }
                    self.shared.release(bytes);
                    if let Some(ack) = ack {
                        let _ = ack.send(Ok(next_sequence.saturating_sub(1)));
                    }
                }
                Settle::Flush(ack) => {
                    let _ = ack.send(Ok(()));
                }
            }
        }
        // Command slots were freed even where no bytes were (checkpoint
        // writes, flushes); let waiting producers look again.
        self.shared.room.notify_waiters();
    }

    fn fail(&self, command: Command, error: &StoreError) {
        let settle = match command {
            Command::Append { bytes, ack, .. } => Settle::Deliver {
                events: Vec::new(),
                bytes,
                ack,
            },
            Command::Flush(ack) => Settle::Flush(ack),
        };
        self.fail_settle(settle, error);
    }

    fn fail_settle(&self, settle: Settle, error: &StoreError) {
        match settle {
            Settle::Deliver { bytes, ack, .. } => {
                self.shared.release(bytes);
                if let Some(ack) = ack {
                    let _ = ack.send(Err(Error::Checkpoint(error.clone())));
                }
            }
            Settle::Flush(ack) => {
                let _ = ack.send(Err(Error::stopped(format!("event recorder stopped: {error}"))));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::{EventMsg, WarningEvent};
    use keel_store::{Checkpoint, SqliteCheckpoint};

    fn warning(index: usize) -> Event {
        Event {
            submission_id: None,
            msg: EventMsg::Warning(WarningEvent {
                message: index.to_string(),
            }),
        }
    }

    /// A store that seals each open batch at once, then waits for a permit
    /// before writing it: the writer is "busy" for as long as the test likes.
    struct GatedStore {
        inner: Arc<SqliteCheckpoint>,
        gate: tokio::sync::Semaphore,
        batches: AtomicUsize,
        /// How long each write takes on top of the real one.
        delay: std::time::Duration,
    }

    impl GatedStore {
        fn new(inner: Arc<SqliteCheckpoint>, permits: usize, delay: std::time::Duration) -> Arc<Self> {
            Arc::new(Self {
                inner,
                gate: tokio::sync::Semaphore::new(permits),
                batches: AtomicUsize::new(0),
                delay,
            })
        }
    }

    /// A SQLite store in `directory` with the session "s", behind a gate that
    /// lets no write through yet.
    async fn closed_gate(directory: &tempfile::TempDir) -> (Arc<SqliteCheckpoint>, Arc<GatedStore>) {
        let sqlite = Arc::new(SqliteCheckpoint::new(directory.path().join("db.sqlite3")).expect("store"));
        sqlite.save(&Checkpoint::empty("s"), &[], None).await.expect("session");
        let store = GatedStore::new(Arc::clone(&sqlite), 0, std::time::Duration::ZERO);
        (sqlite, store)
    }

    /// Queues `first` and waits until the store has sealed it as a batch (the
    /// gate keeps it from being written).
    async fn seal_first_batch(recorder: &EventRecorder, store: &GatedStore, first: Event) {
        try_send_event(recorder, first).expect("queue");
        while store.batches.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    }

    impl CheckpointStore for GatedStore {
        fn save<'a>(
            &'a self,
            checkpoint: &'a keel_store::Checkpoint,
            transcript_delta: &'a [keel_protocol::TranscriptItem],
            execution: Option<&'a keel_store::TurnExecution>,
        ) -> keel_model::BoxFuture<'a, std::result::Result<(), StoreError>> {
            self.inner.save(checkpoint, transcript_delta, execution)
        }

        fn load<'a>(
            &'a self,
            session_id: &'a str,
        ) -> keel_model::BoxFuture<'a, std::result::Result<Option<keel_store::SessionState>, StoreError>> {
            self.inner.load(session_id)
        }

        fn append_open<'a>(
            &'a self,
            session_id: &'a str,
            batch: Arc<OpenBatch>,
        ) -> keel_model::BoxFuture<'a, std::result::Result<AppendReceipt, StoreError>> {
            Box::pin(async move {
                self.batches.fetch_add(1, Ordering::SeqCst);
                let sealed = batch.seal();
                let _permit = self.gate.acquire().await.map_err(|_| StoreError::Closed)?;
                tokio::time::sleep(self.delay).await;
                self.inner
                    .append_open(session_id, Arc::new(OpenBatch::new(sealed)))
                    .await
            })
        }

        fn acquire<'a>(
            &'a self,
            session_id: &'a str,
        ) -> keel_model::BoxFuture<'a, std::result::Result<u64, StoreError>> {
            self.inner.acquire(session_id)
        }

        fn event_page<'a>(
            &'a self,
            session_id: &'a str,
            request: keel_store::EventPageRequest,
        ) -> keel_model::BoxFuture<'a, std::result::Result<keel_store::EventPage, StoreError>> {
            self.inner.event_page(session_id, request)
        }

        fn list_sessions_page<'a>(
            &'a self,
            cursor: Option<&'a str>,
            limit: usize,
            bot_id: Option<&'a str>,
        ) -> keel_model::BoxFuture<'a, std::result::Result<keel_store::SessionListPage, StoreError>> {
            self.inner.list_sessions_page(cursor, limit, bot_id)
        }

        fn session_summary<'a>(
            &'a self,
            session_id: &'a str,
        ) -> keel_model::BoxFuture<'a, std::result::Result<Option<keel_store::SessionSummary>, StoreError>> {
            self.inner.session_summary(session_id)
        }

        fn events_after<'a>(
            &'a self,
            session_id: &'a str,
            after_sequence: u64,
            limit: usize,
        ) -> keel_model::BoxFuture<'a, std::result::Result<Vec<RecordedEvent>, StoreError>> {
            self.inner.events_after(session_id, after_sequence, limit)
        }

        fn keyed_submission<'a>(
            &'a self,
            session_id: &'a str,
            idempotency_key: &'a str,
        ) -> keel_model::BoxFuture<'a, std::result::Result<Option<keel_store::KeyedSubmission>, StoreError>> {
            self.inner.keyed_submission(session_id, idempotency_key)
        }

        fn low_on_space(&self) -> Option<String> {
            self.inner.low_on_space()
        }

        fn close(&self) -> keel_model::BoxFuture<'_, ()> {
            CheckpointStore::close(self.inner.as_ref())
        }

        fn create<'a>(
            &'a self,
            checkpoint: &'a keel_store::Checkpoint,
            history: &'a [keel_protocol::TranscriptItem],
            events: Vec<keel_store::EncodedEvent>,
        ) -> keel_model::BoxFuture<'a, std::result::Result<keel_store::AppendReceipt, StoreError>> {
            self.inner.create(checkpoint, history, events)
        }

        fn history_until<'a>(
            &'a self,
            session_id: &'a str,
            at_sequence: u64,
        ) -> keel_model::BoxFuture<'a, std::result::Result<Option<Vec<keel_protocol::TranscriptItem>>, StoreError>>
        {
            self.inner.history_until(session_id, at_sequence)
        }

        fn sessions_with_work<'a>(
            &'a self,
            after: Option<&'a str>,
            limit: usize,
        ) -> keel_model::BoxFuture<'a, std::result::Result<Vec<String>, StoreError>> {
            self.inner.sessions_with_work(after, limit)
        }

        fn edit_session<'a>(
            &'a self,
            session_id: &'a str,
            edit: keel_store::SessionEdit<'a>,
        ) -> keel_model::BoxFuture<'a, std::result::Result<bool, StoreError>> {
            self.inner.edit_session(session_id, edit)
        }
    }

    /// Events queued while a batch is being written all go into the next
    /// batch: a producer that outruns the store gets group commits, not one
    /// commit per event.
    #[tokio::test(flavor = "current_thread")]
    async fn events_queued_behind_a_sealed_batch_form_one_next_batch() {
        let directory = tempfile::tempdir().expect("directory");
        let (_sqlite, store) = closed_gate(&directory).await;
        let (recorder, mut delivered) = EventRecorder::spawn(store.clone(), "s".into());

        seal_first_batch(&recorder, &store, warning(0)).await;
        // The first batch is sealed and waiting; these queue behind it.
        for index in 1..300 {
            try_send_event(&recorder, warning(index)).expect("queue");
        }
        tokio::task::yield_now().await;
        store.gate.add_permits(1_000);
        let drain = tokio::spawn(async move {
            for index in 0..300 {
                let event = delivered.recv().await.expect("delivered");
                assert_eq!(event.sequence, index as u64 + 1);
            }
        });
        recorder.flush().await.expect("flush");
        drain.await.expect("every event delivered in order");
        assert_eq!(
            store.batches.load(Ordering::SeqCst),
            2,
            "one batch in flight, one for everything behind it"
        );
    }

    fn turn_complete() -> Event {
        Event {
            submission_id: None,
            msg: EventMsg::TurnComplete(keel_protocol::TurnCompleteEvent {
                turn_id: "t".into(),
                length_limited: false,
            }),
        }
    }

    fn write(cut: Option<u64>, items: usize) -> CheckpointWrite {
        CheckpointWrite {
            checkpoint: Checkpoint::empty("s"),
            transcript_delta: (0..items)
                .map(|index| keel_protocol::TranscriptItem::UserMessage {
                    text: index.to_string(),
                })
                .collect(),
            execution: None,
            history_cut: cut,
        }
    }

    /// The end of a turn closes its batch, so every turn's end is a batch
    /// boundary (a fork point); and a write that cuts the history never
    /// joins a batch that added history without cutting.
    #[tokio::test(flavor = "current_thread")]
    async fn a_turns_end_and_a_history_cut_are_batch_boundaries() {
        let directory = tempfile::tempdir().expect("directory");
        let (sqlite, store) = closed_gate(&directory).await;
        let (recorder, mut delivered) = EventRecorder::spawn(store.clone(), "s".into());
        seal_first_batch(&recorder, &store, warning(0)).await;
        // Behind the sealed first batch: a turn's end, then more.
        recorder
            .append(vec![warning(1)], Some(write(None, 2)))
            .await
            .expect("queue");
        recorder.append(vec![turn_complete()], None).await.expect("queue");
        recorder
            .append(vec![warning(2)], Some(write(None, 1)))
            .await
            .expect("queue");
        recorder
            .append(vec![warning(3)], Some(write(Some(1), 1)))
            .await
            .expect("queue");
        recorder
            .append(vec![warning(4)], Some(write(None, 1)))
            .await
            .expect("queue");
        tokio::task::yield_now().await;
        store.gate.add_permits(1_000);
        let drain = tokio::spawn(async move {
            for sequence in 1..=6 {
                assert_eq!(delivered.recv().await.expect("delivered").sequence, sequence);
            }
        });
        recorder.flush().await.expect("flush");
        drain.await.expect("every event delivered");
        assert_eq!(
            store.batches.load(Ordering::SeqCst),
            4,
            "[0] [1, end] [2] [3 (cut), 4]: a batch closes after a turn's end, and a cut starts one"
        );
        let state = sqlite.load("s").await.expect("load").expect("session");
        assert_eq!(
            state.transcript.len(),
            3,
            "2 + 1 items, cut to 1, plus 1 and 1: {:?}",
            state.transcript
        );
        let fork_point = sqlite
            .history_until("s", 3)
            .await
            .expect("the turn's end is a fork point");
        assert_eq!(fork_point.map(|items| items.len()), Some(2));
    }

    /// A model that answers "hi" at once.
    struct Answers;

    impl keel_model::Model for Answers {
        fn respond<'a>(
            &'a self,
            _request: keel_model::ModelRequest<'a>,
            _events: keel_model::ModelEventSink,
        ) -> keel_model::BoxFuture<'a, Result<keel_model::ModelOutput>> {
            Box::pin(async { Ok(keel_model::ModelOutput::text("hi")) })
        }
    }

    /// A session shows as idle only once what it recorded is stored: a host
    /// that sees it idle reads everything it did from the store.
    #[tokio::test]
    async fn a_session_is_idle_only_once_its_turn_is_stored() {
        let directory = tempfile::tempdir().expect("directory");
        let sqlite = Arc::new(SqliteCheckpoint::new(directory.path().join("db.sqlite3")).expect("store"));
        let store = GatedStore::new(Arc::clone(&sqlite), 1_000, std::time::Duration::from_millis(100));
        let mut config = crate::agent::AgentConfig::new("s", store, Arc::new(Answers));
        config.workspace = directory.path().to_path_buf();
        let mut agent = crate::agent::create_agent(config).await.expect("agent");
        let handle = agent.handle();
        agent
            .sender()
            .submit(keel_protocol::Op::UserInput { text: "hello".into() })
            .expect("submit");
        // Busy from the moment it is submitted until the turn is stored.
        while !handle.status().busy {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        while handle.status().busy {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        let stored = sqlite.events_after("s", 0, 100).await.expect("events");
        assert!(
            stored.iter().any(|event| event.msg.ends_turn()),
            "idle before the turn's end was stored: {:?}",
            stored.iter().map(|event| event.msg.kind()).collect::<Vec<_>>()
        );
        while let Ok(Some(_)) = tokio::time::timeout(std::time::Duration::from_millis(10), agent.next_event()).await {}
        agent.shutdown().await.expect("shutdown");
    }
}
