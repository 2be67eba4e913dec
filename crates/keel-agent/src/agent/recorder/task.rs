//! The recorder's task: takes queued commands, writes them to the store in
//! batches, then delivers the events in order and answers the commands.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::batch::{Batch, Settle};
use super::command::{Command, Shared};
use super::scrub;
use keel_protocol::{Error, RecordedEvent};
use keel_store::{AppendReceipt, CheckpointStore, StoreError};

/// The recorder's task: drain, persist, deliver, acknowledge.
pub(super) struct RecorderTask {
    pub(super) store: Arc<dyn CheckpointStore>,
    pub(super) shared: Arc<Shared>,
    pub(super) commands: mpsc::Receiver<Command>,
    pub(super) delivery: mpsc::Sender<RecordedEvent>,
    pub(super) max_batch: usize,
    pub(super) lease: Option<u64>,
    /// Redacts each command as it is taken from the queue, in order.
    pub(super) scrub: scrub::Scrubber,
}

impl RecorderTask {
    /// Runs until every handle is gone and the queue is drained, or the
    /// store fails.
    pub(super) async fn run(mut self) {
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
                waiting.extend(incoming.into_iter().flat_map(|command| self.scrub.command(command)));
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
                take_in(&mut self.scrub, &mut batch, &mut waiting, command);
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
                    Some(command) => take_in(&mut self.scrub, batch, waiting, command),
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

/// Redacts `command` and adds what it becomes to `batch` while nothing
/// waits before it; the rest waits, in order.
fn take_in(scrub: &mut scrub::Scrubber, batch: &mut Batch, waiting: &mut VecDeque<Command>, command: Command) {
    for command in scrub.command(command) {
        if waiting.is_empty() {
            waiting.extend(batch.add(command));
        } else {
            waiting.push_back(command);
        }
    }
}
