//! The owner's side of relaying: taking up the submissions other nodes
//! stored for a session this node runs.
//!
//! Each is queued under the id the relaying node chose and a key (the
//! client's, or one made from the id), so one queued twice is a duplicate,
//! and answered for the node waiting to answer its client. The store
//! answers one accepted in the commit that queues it; this node answers the
//! rest (refusals, duplicates, control ops) in one statement per pass.
//!
//! A relay notice usually carries its row. A session that has had its first
//! whole pass since it was loaded queues such a row without reading the
//! store when the row is newer than every row stored at the end of that
//! pass ([`Progress::newest`]: so it was committed after this runtime
//! claimed the session, and no earlier runtime, here or on another node,
//! can have queued it) and this node has not taken it up already
//! ([`RecentlyTaken`]: from its notice or from a read, whichever came
//! first). Any other row is read again.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use super::Host;
use super::answers::{not_the_sender_s, owner_answer, sender_sees};
use super::live::{LiveSession, Progress};
use keel_agent::SubmitOptions;
use keel_store::{RelayOutcome, RelayedSubmission};

/// Relayed submissions read per store call.
const RELAY_PAGE: usize = 64;

/// How long an answer stays with its relayed submission, at least (twice
/// the relay wait when that is longer): only the waiting node reads it, a
/// retry of its key is answered from the session's keys. Short, since the
/// waiting rows are read among the answered ones.
const ANSWER_KEPT: Duration = Duration::from_secs(60);

/// The key a relayed submission without one is queued under, so that
/// queuing it twice is a duplicate.
pub(super) fn relayed_key(submission_id: &str) -> String {
    format!("relayed-{submission_id}")
}

/// Relay ids remembered by [`RecentlyTaken`]. A notice reaches the node
/// through a bounded buffer (a thousand notices; past that they are dropped
/// and everything is read again), so its row was taken up, if at all, far
/// fewer rows ago than this.
const RECENT: usize = 65_536;

/// The relayed submissions this node took up lately (queued, refused or
/// dropped), by relay id, so that a notice that comes after a read took its
/// row up is not queued again.
#[derive(Default)]
pub(super) struct RecentlyTaken {
    ids: Mutex<(VecDeque<u64>, HashSet<u64>)>,
}

impl RecentlyTaken {
    fn lock(&self) -> std::sync::MutexGuard<'_, (VecDeque<u64>, HashSet<u64>)> {
        self.ids.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn contains(&self, relay_id: u64) -> bool {
        self.lock().1.contains(&relay_id)
    }

    fn record(&self, relay_ids: impl IntoIterator<Item = u64>) {
        let mut ids = self.lock();
        let (order, known) = &mut *ids;
        for relay_id in relay_ids {
            if known.insert(relay_id) {
                order.push_back(relay_id);
            }
            while order.len() > RECENT {
                if let Some(oldest) = order.pop_front() {
                    known.remove(&oldest);
                }
            }
        }
    }
}

impl Host {
    /// Queues, in order, the submissions relayed to `session_id` if it is
    /// loaded here (starting with the row the notice `carried`, if any);
    /// otherwise takes it over if no live node runs it.
    pub(super) async fn take_relayed(&self, session_id: &str, carried: Option<Box<RelayedSubmission>>) {
        match self.loaded(session_id).await {
            Some(session) => self.queue_relayed(&session, carried).await,
            None => self.take_over_one(session_id).await,
        }
    }

    /// Queues the submissions relayed to a live session: the row a notice
    /// `carried` alone when that is safe (see the module), otherwise every
    /// waiting row, read in order. Each one's answer (its receipt, or the
    /// refusal a client asking here would get) is recorded for the node
    /// waiting to answer its client; one that fails otherwise (the session
    /// stopped) is left for later, with the rest.
    ///
    /// The made keys are looked up in the store only after the first whole
    /// pass since the session was loaded: a row first taken up later was
    /// committed after this runtime claimed the session, so no earlier
    /// runtime can have queued it (its writes are fenced from the claim on),
    /// and this one takes each row up once, answering it before the next; a
    /// pass whose answers were not recorded makes the next one look keys up
    /// again.
    pub(super) async fn queue_relayed(&self, session: &LiveSession, carried: Option<Box<RelayedSubmission>>) {
        let session_id = session.handle.session_id();
        let mut progress = session.relaying.lock().await;
        if let Some(row) = carried
            && progress.takes_from_notice(row.relay_id)
        {
            if self.recently_taken.contains(row.relay_id) {
                // Taken up already, from a read.
                return;
            }
            let Some(shared) = self.shared.as_deref() else { return };
            shared.taking_up(std::slice::from_ref(&row));
            let (answers, blocked) = self.take_up(session, std::slice::from_ref(&row), true).await;
            progress.passed = self.record_answers(session_id, &answers).await && !blocked;
            return;
        }
        loop {
            let waiting = match async { self.shared()?.relayed(session_id, RELAY_PAGE).await }.await {
                Ok(waiting) => waiting,
                Err(error) => {
                    tracing::warn!(%session_id, %error, "cannot read the submissions relayed to a session");
                    return;
                }
            };
            let (answers, blocked) = self.take_up(session, &waiting, progress.passed).await;
            if !self.record_answers(session_id, &answers).await || blocked {
                // Taken up again, what was queued is a duplicate by its
                // key, answered as the first time: looked up.
                progress.passed = false;
                return;
            }
            if waiting.len() < RELAY_PAGE {
                // Every row committed before this pass's reads is answered.
                if !progress.passed {
                    match async { self.shared()?.newest_relay_id(session_id).await }.await {
                        Ok(newest) => *progress = Progress { passed: true, newest },
                        Err(error) => {
                            tracing::warn!(%session_id, %error, "cannot read the newest relayed submission")
                        }
                    }
                }
                return;
            }
        }
    }

    /// Queues `rows` in order until one fails; returns the answers (`None`:
    /// forget the row unanswered) and whether one failed.
    async fn take_up(
        &self,
        session: &LiveSession,
        rows: &[RelayedSubmission],
        passed: bool,
    ) -> (Vec<(u64, Option<RelayOutcome>)>, bool) {
        let session_id = session.handle.session_id();
        let mut answers = Vec::with_capacity(rows.len());
        for relayed in rows {
            let sealed = self
                .relay_key
                .as_ref()
                .is_some_and(|key| key.verify(session_id, relayed));
            if !sealed {
                // Not sealed by a node of this cluster: nobody
                // authenticated sent it. Dropped, never queued.
                tracing::warn!(
                    %session_id,
                    submission_id = %relayed.submission_id,
                    "refused a relayed submission whose seal does not verify"
                );
                self.metrics.relayed_refused.inc();
                answers.push((relayed.relay_id, None));
                continue;
            }
            if !sender_sees(relayed.submitted_by.as_ref(), &session.tenant) {
                // The relaying node went by a tenant it learnt earlier,
                // which no longer is this session's.
                answers.push((relayed.relay_id, Some(not_the_sender_s(session_id))));
                continue;
            }
            // A client's key may have been used on any node before.
            let key_is_new = passed && relayed.idempotency_key.is_none();
            let key = relayed
                .idempotency_key
                .clone()
                .unwrap_or_else(|| relayed_key(&relayed.submission_id));
            let options = SubmitOptions {
                on_busy: relayed.on_busy.unwrap_or(session.settings.on_busy),
                idempotency_key: Some(key),
                submission_id: Some(relayed.submission_id.clone()),
                submitted_by: relayed.submitted_by.clone(),
                key_is_new,
                traceparent: relayed.traceparent.clone(),
            };
            let mut queued = session.handle.submit_durable(relayed.op.clone(), options).await;
            if let Ok(accepted) = &queued
                && super::is_decision(&relayed.op)
            {
                // A decision is answered once the session recorded it, as
                // on the node that runs it (see `Host::decision_recorded`):
                // answered before, a crash here would lose it for good.
                match self.decision_recorded(session_id, accepted.clone()).await {
                    Ok(recorded) => queued = Ok(recorded),
                    Err(error) => {
                        tracing::warn!(%session_id, %error, "a relayed decision was not recorded in time");
                        return (answers, true);
                    }
                }
            }
            match owner_answer(queued, &relayed.submission_id) {
                Ok(answer) => answers.push((relayed.relay_id, Some(answer))),
                Err(error) => {
                    tracing::warn!(%session_id, %error, "cannot queue a relayed submission yet");
                    return (answers, true);
                }
            }
        }
        (answers, false)
    }

    /// Records the answers to relayed submissions (those the commit that
    /// queued them did not record already) and remembers their rows as
    /// taken up; `false` if they could not be recorded.
    async fn record_answers(&self, session_id: &str, answers: &[(u64, Option<RelayOutcome>)]) -> bool {
        self.recently_taken
            .record(answers.iter().map(|(relay_id, _)| *relay_id));
        let keep = ANSWER_KEPT.max(self.relay_wait * 2);
        match async { self.shared()?.answer_relayed(session_id, answers, keep).await }.await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%session_id, %error, "cannot record the answers to relayed submissions");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_taken_from_its_notice_only_when_no_earlier_runtime_can_have_taken_it() {
        let fresh = Progress::default();
        assert!(!fresh.takes_from_notice(11), "no whole pass yet");
        let passed = Progress {
            passed: true,
            newest: 10,
        };
        assert!(!passed.takes_from_notice(10), "stored when the pass ended");
        assert!(passed.takes_from_notice(11));
    }

    #[test]
    fn recently_taken_rows_are_remembered_within_a_bound() {
        let taken = RecentlyTaken::default();
        taken.record([1, 2, 2, 3]);
        assert!(taken.contains(2) && !taken.contains(4));
        taken.record(10..10 + RECENT as u64);
        assert!(!taken.contains(1), "the oldest go first");
        assert!(taken.contains(10 + RECENT as u64 - 1));
        let ids = taken.lock();
        assert_eq!((ids.0.len(), ids.1.len()), (RECENT, RECENT));
    }
}
