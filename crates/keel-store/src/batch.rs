//! What one write carries: a checkpoint rewrite, a batch of events with it,
//! a batch that can still grow until the writer seals it, and the receipt.

use keel_protocol::TranscriptItem;

use crate::{Checkpoint, EncodedEvent, TurnExecution};

/// A checkpoint rewrite plus the history it adds.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckpointWrite {
    /// The new checkpoint.
    pub checkpoint: Checkpoint,
    /// History items to append.
    pub transcript_delta: Vec<TranscriptItem>,
    /// The turn in flight after this write (`None` when none is).
    pub execution: Option<TurnExecution>,
    /// Cut the history back to its first this-many items before appending
    /// `transcript_delta` (a rolled-back turn). The store refuses a cut
    /// longer than the history.
    pub history_cut: Option<u64>,
}

impl CheckpointWrite {
    /// A write of `checkpoint` that appends `delta` to the history and
    /// leaves `execution` as the turn in flight, cutting nothing.
    pub fn new(checkpoint: &Checkpoint, delta: &[TranscriptItem], execution: Option<&TurnExecution>) -> Self {
        Self {
            checkpoint: checkpoint.clone(),
            transcript_delta: delta.to_vec(),
            execution: execution.cloned(),
            history_cut: None,
        }
    }

    /// Whether `later` can be folded into this write. A cut counts items
    /// from the start of the history, which this write only knows when it
    /// cuts too: a cutting write cannot follow one that does not.
    pub fn can_merge(&self, later: &CheckpointWrite) -> bool {
        later.history_cut.is_none() || self.history_cut.is_some()
    }

    /// Folds a later write into this one (see [`Self::can_merge`]): the
    /// later checkpoint and execution win, the history deltas are
    /// concatenated, and a later cut applies to this write's result.
    pub fn merge(&mut self, later: CheckpointWrite) {
        debug_assert!(
            self.can_merge(&later),
            "a cutting write merged into one that does not cut"
        );
        if let (Some(cut), Some(later_cut)) = (self.history_cut, later.history_cut) {
            // This write leaves `cut + delta` items; the later cut keeps a
            // prefix of them.
            match later_cut.checked_sub(cut) {
                Some(kept) => self
                    .transcript_delta
                    .truncate(usize::try_from(kept).unwrap_or(usize::MAX)),
                None => {
                    self.history_cut = Some(later_cut);
                    self.transcript_delta.clear();
                }
            }
        }
        self.checkpoint = later.checkpoint;
        self.execution = later.execution;
        self.transcript_delta.extend(later.transcript_delta);
    }
}

/// Events to append to one session's log, and the checkpoint write that goes
/// with them; both commit in one transaction.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppendBatch {
    /// Events in order; they get consecutive sequences.
    pub events: Vec<EncodedEvent>,
    /// A checkpoint write, for a session that must already exist.
    pub checkpoint: Option<CheckpointWrite>,
    /// The lease of the writer (see [`crate::CheckpointStore::acquire`]); when set,
    /// the batch is refused with [`crate::StoreError::Fenced`] if the session has
    /// been taken over since.
    pub lease: Option<u64>,
}

/// A batch that can still grow until the store starts writing it.
///
/// The recorder hands the store an open batch and keeps adding what its
/// producers queue while the batch waits for the writer (which is usually
/// busy committing the previous group). The writer seals the batch when it
/// starts the transaction. A turn's events then tend to commit together
/// instead of trickling into successive commits.
#[derive(Debug)]
pub struct OpenBatch {
    /// `None` once the store took the batch.
    state: std::sync::Mutex<Option<AppendBatch>>,
}

impl OpenBatch {
    /// An open batch holding `batch`.
    pub fn new(batch: AppendBatch) -> Self {
        Self {
            state: std::sync::Mutex::new(Some(batch)),
        }
    }

    /// Runs `add` on the batch if the store has not taken it yet; returns
    /// whether it ran.
    pub fn add(&self, add: impl FnOnce(&mut AppendBatch)) -> bool {
        match self.state.lock().unwrap_or_else(|poison| poison.into_inner()).as_mut() {
            Some(batch) => {
                add(batch);
                true
            }
            None => false,
        }
    }

    /// Takes the batch for writing; later additions are refused.
    pub fn seal(&self) -> AppendBatch {
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .take()
            .unwrap_or_default()
    }
}

impl AppendBatch {
    /// Appends `events` and folds in `checkpoint`.
    pub fn extend(&mut self, events: impl IntoIterator<Item = EncodedEvent>, checkpoint: Option<CheckpointWrite>) {
        self.events.extend(events);
        if let Some(write) = checkpoint {
            match &mut self.checkpoint {
                Some(merged) => merged.merge(write),
                None => self.checkpoint = Some(write),
            }
        }
    }

    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.checkpoint.is_none()
    }
}

/// Where an appended batch landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendReceipt {
    /// The first event's sequence; the rest follow without gaps.
    pub first_sequence: u64,
    /// Commit time of the batch, in milliseconds since the Unix epoch.
    pub recorded_at_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(cut: Option<u64>, texts: &[&str]) -> CheckpointWrite {
        CheckpointWrite {
            checkpoint: Checkpoint::empty("s"),
            transcript_delta: texts
                .iter()
                .map(|text| TranscriptItem::UserMessage {
                    text: (*text).to_owned(),
                })
                .collect(),
            execution: None,
            history_cut: cut,
        }
    }

    /// Folding writes gives the history that applying them one by one gives.
    #[test]
    fn merged_writes_cut_and_append_as_applied_one_by_one() {
        let apply = |history: &mut Vec<TranscriptItem>, write: &CheckpointWrite| {
            if let Some(cut) = write.history_cut {
                history.truncate(cut as usize);
            }
            history.extend(write.transcript_delta.iter().cloned());
        };
        let base: Vec<TranscriptItem> = write(None, &["a", "b", "c"]).transcript_delta;
        let cases = [
            (write(Some(1), &["x", "y"]), write(Some(2), &["z"])),
            (write(Some(1), &["x", "y"]), write(Some(0), &["z"])),
            (write(Some(2), &["x"]), write(Some(3), &[])),
            (write(Some(3), &[]), write(None, &["z"])),
            (write(None, &["x"]), write(None, &["y"])),
        ];
        for (first, second) in cases {
            assert!(first.can_merge(&second));
            let mut expected = base.clone();
            apply(&mut expected, &first);
            apply(&mut expected, &second);
            let mut merged = first.clone();
            merged.merge(second.clone());
            let mut got = base.clone();
            apply(&mut got, &merged);
            assert_eq!(got, expected, "{first:?} then {second:?}");
        }
        assert!(!write(None, &["x"]).can_merge(&write(Some(1), &[])));
    }
}
