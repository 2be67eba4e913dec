//! Relayed submissions answered in the commit that queues them.
//!
//! The owner of a session reads the submissions other nodes relayed to it
//! ([`super::relay::relayed`]), queues each under the id the relaying node
//! chose, then records its answer. Recording the answer in a statement of
//! its own costs the database a transaction per relayed submission; instead
//! the writer answers a row in the very transaction that stores its
//! `submission_queued` event (the answer is known there: accepted, not a
//! duplicate, at that event's sequence), and the owner's own call to
//! answer it ([`super::relay::answer_relayed`]) sends only what is left:
//! duplicates, refusals, control ops.
//!
//! This registry is how the writer knows which queued submissions were
//! relayed: the rows the store handed out, by submission id. It is only a
//! shortcut. A row missing from it (forgotten past the bound) is answered
//! by the owner's call as before, and answering a row twice changes
//! nothing (the update takes only rows still without an answer).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::statements::int;
use crate::{QueueChange, RelayOutcome, RelayedSubmission, StoreError};

/// Rows remembered at most, waiting or answered; past this the registry
/// starts again empty (its rows are then answered the slow way).
const MAX_ROWS: usize = 65_536;

/// How long answers stay with their rows until an owner says otherwise
/// ([`TakenUp::keep`]).
const DEFAULT_KEEP: Duration = Duration::from_secs(120);

/// The relayed rows handed to an owner and not answered yet, and those the
/// writer answered since.
#[derive(Debug)]
pub(super) struct TakenUp {
    rows: Mutex<Rows>,
    /// How long an answer stays with its row, in ms: the owner's last word.
    keep_ms: AtomicU64,
}

#[derive(Debug, Default)]
struct Rows {
    /// Relay id by submission id, of the rows handed out unanswered.
    waiting: HashMap<String, u64>,
    /// Relay ids the writer answered, until the owner's answer call.
    answered: HashSet<u64>,
}

impl Default for TakenUp {
    fn default() -> Self {
        Self {
            rows: Mutex::default(),
            keep_ms: AtomicU64::new(millis(DEFAULT_KEEP)),
        }
    }
}

impl TakenUp {
    fn lock(&self) -> std::sync::MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Remembers the rows handed to an owner, unanswered.
    pub(super) fn handed_out(&self, rows: &[RelayedSubmission]) {
        if rows.is_empty() {
            return;
        }
        let mut taken = self.lock();
        if taken.waiting.len() + taken.answered.len() + rows.len() > MAX_ROWS {
            *taken = Rows::default();
        }
        for row in rows {
            // Read again: any earlier answer was not committed.
            taken.answered.remove(&row.relay_id);
            taken.waiting.insert(row.submission_id.clone(), row.relay_id);
        }
    }

    /// The relay id of submission `submission_id` if it was handed out
    /// unanswered: the writer answers it in the transaction that queues
    /// it. Marked answered from here on; should that transaction fail, the
    /// owner's answer call (which sends only what succeeded) or a new read
    /// of the row puts it right.
    pub(super) fn answer(&self, submission_id: &str) -> Option<u64> {
        let mut taken = self.lock();
        if taken.waiting.is_empty() {
            return None;
        }
        let relay_id = taken.waiting.remove(submission_id)?;
        taken.answered.insert(relay_id);
        Some(relay_id)
    }

    /// The relayed submissions among the submissions a write queues
    /// (`queue`, by offset in its batch), taken to be answered with it.
    pub(super) fn answering(&self, queue: &[(u64, QueueChange)]) -> Answering {
        let rows = queue
            .iter()
            .filter_map(|(offset, change)| match change {
                QueueChange::Queued { submission, .. } => {
                    let relay_id = self.answer(&submission.id)?;
                    Some((*offset, relay_id, submission.id.clone()))
                }
                _ => None,
            })
            .collect();
        Answering {
            rows,
            keep: self.keep(),
        }
    }

    /// The rows of `answers` the writer has not answered already; forgets
    /// all of them.
    pub(super) fn left_to_answer<T: Clone>(&self, answers: &[(u64, T)]) -> Vec<(u64, T)> {
        let mut taken = self.lock();
        let left = answers
            .iter()
            .filter(|(relay_id, _)| !taken.answered.remove(relay_id))
            .cloned()
            .collect();
        if !taken.waiting.is_empty() {
            let done: HashSet<u64> = answers.iter().map(|(relay_id, _)| *relay_id).collect();
            taken.waiting.retain(|_, relay_id| !done.contains(relay_id));
        }
        left
    }

    /// Records how long answers stay with their rows.
    pub(super) fn set_keep(&self, keep: Duration) {
        self.keep_ms.store(millis(keep), Ordering::Relaxed);
    }

    /// How long answers stay with their rows.
    fn keep(&self) -> Duration {
        Duration::from_millis(self.keep_ms.load(Ordering::Relaxed))
    }
}

/// The relayed submissions a write queues, answered in its transaction.
#[derive(Debug, Default)]
pub(super) struct Answering {
    /// `(offset of the submission_queued event in the batch, relay id,
    /// submission id)`.
    rows: Vec<(u64, u64, String)>,
    /// How long the session's answers are kept.
    keep: Duration,
}

/// The parameters of [`super::statements::RELAY_ANSWER`].
pub(super) struct AnswerParams {
    pub(super) relay_ids: Vec<i64>,
    /// Each one's answer, JSON.
    pub(super) answers: Vec<String>,
    /// The session's answers recorded before this (ms) are forgotten.
    pub(super) forget_before: i64,
}

impl Answering {
    /// The answers of a write whose first event has `first_sequence`,
    /// committed at `now`: accepted, not duplicates, at the sequence of each
    /// one's `submission_queued`; `None` when it queues no relayed one.
    pub(super) fn params(&self, first_sequence: u64, now: u64) -> Result<Option<AnswerParams>, StoreError> {
        if self.rows.is_empty() {
            return Ok(None);
        }
        let mut relay_ids = Vec::with_capacity(self.rows.len());
        let mut answers = Vec::with_capacity(self.rows.len());
        for (offset, relay_id, submission_id) in &self.rows {
            let answer = RelayOutcome::Accepted {
                submission_id: submission_id.clone(),
                sequence: first_sequence + offset,
                duplicate: false,
            };
            answers.push(serde_json::to_string(&answer).map_err(|error| StoreError::Encode(error.to_string()))?);
            relay_ids.push(int(*relay_id));
        }
        Ok(Some(AnswerParams {
            relay_ids,
            answers,
            forget_before: int(now.saturating_sub(millis(self.keep))),
        }))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_protocol::Op;

    fn row(relay_id: u64, submission_id: &str) -> RelayedSubmission {
        RelayedSubmission {
            traceparent: None,
            relay_id,
            submission_id: submission_id.to_owned(),
            op: Op::Interrupt { turn_id: None },
            on_busy: None,
            idempotency_key: None,
            submitted_by: None,
            seal: None,
        }
    }

    #[test]
    fn a_row_handed_out_is_answered_once_by_the_writer_and_not_again_by_the_owner() {
        let taken = TakenUp::default();
        assert_eq!(taken.answer("a"), None, "nothing handed out");
        taken.handed_out(&[row(1, "a"), row(2, "b")]);
        assert_eq!(taken.answer("a"), Some(1));
        assert_eq!(taken.answer("a"), None, "answered once");
        // The owner answers both: only b is left for its statement.
        assert_eq!(taken.left_to_answer(&[(1, "x"), (2, "y")]), vec![(2, "y")]);
        assert_eq!(taken.answer("b"), None, "the owner answered it");
        assert!(taken.lock().waiting.is_empty() && taken.lock().answered.is_empty());
    }

    #[test]
    fn a_row_read_again_is_waiting_again() {
        let taken = TakenUp::default();
        taken.handed_out(&[row(1, "a")]);
        assert_eq!(taken.answer("a"), Some(1));
        // Its transaction failed: the owner reads the row again.
        taken.handed_out(&[row(1, "a")]);
        assert_eq!(taken.left_to_answer(&[(1, ())]), vec![(1, ())], "not answered: sent");
        taken.handed_out(&[row(1, "a")]);
        assert_eq!(taken.answer("a"), Some(1));
    }

    #[test]
    fn the_registry_is_bounded() {
        let taken = TakenUp::default();
        for index in 0..(MAX_ROWS as u64 + 10) {
            taken.handed_out(&[row(index, &index.to_string())]);
        }
        let rows = taken.lock();
        assert!(rows.waiting.len() + rows.answered.len() <= MAX_ROWS);
    }
}
