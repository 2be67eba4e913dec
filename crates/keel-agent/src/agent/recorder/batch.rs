//! Group commit: the batch a recorder's task fills with queued commands
//! while the store's writer is busy, and what is to be done for each once
//! it is committed.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::command::{Command, PendingEvent};
use keel_protocol::{Event, Result};
use keel_store::{AppendBatch, OpenBatch};

/// What to do, in order, once a batch is committed.
pub(super) enum Settle {
    Deliver {
        events: Vec<Event>,
        bytes: usize,
        ack: Option<oneshot::Sender<Result<u64>>>,
    },
    Flush(oneshot::Sender<Result<()>>),
}

/// The batch being written, and what to do for each command in it.
pub(super) struct Batch {
    pub(super) open: Arc<OpenBatch>,
    pub(super) settles: Vec<Settle>,
    /// Whether any command in it writes something (not only flushes).
    pub(super) writes: bool,
    /// Whether it takes no more commands: it holds the end of a turn, so
    /// the log has a batch boundary there (a fork can start at any turn's
    /// end, and a batch's history items cannot be split).
    closed: bool,
    max: usize,
}

impl Batch {
    /// An empty batch of at most `max` commands, written under `lease`.
    pub(super) fn new(max: usize, lease: Option<u64>) -> Self {
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
    pub(super) fn add(&mut self, command: Command) -> Option<Command> {
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
