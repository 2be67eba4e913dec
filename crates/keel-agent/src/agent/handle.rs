//! [`SessionHandle`]: a cloneable way into a live session for servers and
//! other hosts, with durable submission and the busy policies.

use std::sync::Arc;

use super::recorder::{EventRecorder, WeakEventRecorder};
use super::status::{SessionStatus, StatusCell};
use super::submission::SubmissionSender;
use keel_protocol::{
    Actor, BusyPolicy, Event, EventMsg, Op, SubmissionQueuedEvent, SubmissionRejectedEvent, new_id,
    validate_idempotency_key,
};
use keel_protocol::{Error, Result};
use keel_store::{CheckpointStore, KeyedSubmission};

/// How a submission is to be handled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubmitOptions {
    /// What a user message does if the session is busy.
    pub on_busy: BusyPolicy,
    /// A client's key for the request: a second submission with the same
    /// key is answered with the first one's receipt and queues nothing.
    pub idempotency_key: Option<String>,
    /// The submission's id, when the caller chose it: a node that relayed
    /// the submission to this one answered its client with it. A fresh id
    /// when `None`.
    pub submission_id: Option<String>,
    /// Who sent it: recorded as `submitted_by` in its `submission_queued`
    /// (and as `decided_by` when it is an approval).
    pub submitted_by: Option<Actor>,
    /// The caller knows that nothing was stored under `idempotency_key`
    /// yet (a key made from a fresh id, first seen under this runtime's
    /// lease), so the store is not asked. Wrongly set, a retry would be
    /// queued twice: leave it `false` unless that is certain.
    pub key_is_new: bool,
    /// The caller's W3C `traceparent`: the turn the submission starts runs
    /// in the caller's trace (kept with the queued submission).
    pub traceparent: Option<String>,
}

/// What [`SessionHandle::submit_durable`] accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The submission's id; the events it causes carry it.
    pub submission_id: String,
    /// The sequence of its `submission_queued` event (for a control op: the
    /// newest sequence when it was accepted).
    pub sequence: u64,
    /// Whether an earlier submission with the same idempotency key answered.
    pub duplicate: bool,
}

/// A cloneable handle on a live session: submit ops durably, read its
/// status. The [`super::Agent`] it came from still owns the event stream.
#[derive(Clone)]
pub struct SessionHandle {
    pub(super) session_id: String,
    pub(super) sender: SubmissionSender,
    /// Weak, so that the session's recorder ends with the session even
    /// while handles remain.
    pub(super) recorder: WeakEventRecorder,
    pub(super) store: Arc<dyn CheckpointStore>,
    pub(super) status: Arc<StatusCell>,
    /// Serializes keyed submissions, so two requests with one key cannot
    /// both miss the stored key and both be queued.
    pub(super) keyed: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

impl SessionHandle {
    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Where to submit ops without storing them first.
    pub fn sender(&self) -> &SubmissionSender {
        &self.sender
    }

    /// What the session is doing now.
    pub fn status(&self) -> SessionStatus {
        self.status.snapshot(
            self.sender.queued(),
            self.sender.last_queued(),
            self.recorder.last_sequence(),
        )
    }

    fn recorder(&self) -> Result<EventRecorder> {
        self.recorder
            .upgrade()
            .ok_or_else(|| Error::Stopped("the session has stopped".to_owned()))
    }

    /// Submits `op` so that, once this returns `Ok`, a crash cannot lose it.
    ///
    /// A user message, `compact` or `regenerate` is stored (a
    /// `submission_queued` event, plus a row in the store's queue that the
    /// session's first event for it removes) before it is queued; after a
    /// restart a stored one that had not started is queued again. If the
    /// session is busy, `options.on_busy` decides: wait, interrupt the
    /// running turn, be refused ([`Error::SessionBusy`], recorded as
    /// `submission_rejected`), or steer a message into the running turn
    /// (other work waits). Control ops (interrupt, approval) act at once
    /// and are not stored ahead; shutdown is queued as it is.
    ///
    /// Errors: [`Error::InvalidInput`] for an op or key that breaks the
    /// protocol's limits, [`Error::KeyReused`] for a known key sent with
    /// another op or policy, [`Error::Busy`] when the queue is full,
    /// [`Error::Stopped`] when the session stopped, [`Error::Checkpoint`]
    /// when the store fails.
    pub async fn submit_durable(&self, op: Op, options: SubmitOptions) -> Result<Accepted> {
        op.validate().map_err(Error::InvalidInput)?;
        if let Some(key) = &options.idempotency_key {
            validate_idempotency_key(key).map_err(Error::InvalidInput)?;
        }
        if !op.is_stored_ahead() {
            return self.submit_now(op, options.submission_id, options.submitted_by);
        }
        let _keyed = match &options.idempotency_key {
            Some(key) => {
                let guard = self.keyed.lock().await;
                if !options.key_is_new
                    && let Some(earlier) = self.store.keyed_submission(&self.session_id, key).await?
                {
                    return answer_keyed(
                        self.store.as_ref(),
                        &self.session_id,
                        key,
                        earlier,
                        &op,
                        options.on_busy,
                    )
                    .await;
                }
                Some(guard)
            }
            None => None,
        };
        let recorder = self.recorder()?;
        let busy = self.status().busy;
        let policy = if busy { options.on_busy } else { BusyPolicy::Queue };
        let id = options.submission_id.clone().unwrap_or_else(new_id);
        if policy == BusyPolicy::Reject {
            let reason = "the session is busy and the message asked to be refused then (on_busy: reject)";
            let rejected = Event {
                submission_id: Some(id),
                msg: EventMsg::SubmissionRejected(SubmissionRejectedEvent {
                    reason: reason.to_owned(),
                    // The key stays taken: a retry is refused the same way.
                    idempotency_key: options.idempotency_key.clone(),
                }),
            };
            recorder.commit(vec![rejected], None).await?;
            return Err(Error::SessionBusy(reason.to_owned()));
        }
        // What runs: a steered message goes to the running turn; other
        // work waits for it.
        let queued_op = match (policy, op.message_text()) {
            (BusyPolicy::Steer, Some(text)) => Op::Steer { text: text.to_owned() },
            (_, Some(text)) => Op::UserInput { text: text.to_owned() },
            (_, None) => op.clone(),
        };
        // Take the place first: a full queue refuses before anything is stored.
        let reservation = self.sender.reserve(&queued_op)?;
        let event = Event {
            submission_id: Some(id.clone()),
            msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
                op: op.clone(),
                on_busy: options.on_busy,
                idempotency_key: options.idempotency_key.clone(),
                submitted_by: options.submitted_by.clone(),
                traceparent: options.traceparent.clone(),
            }),
        };
        // The message goes to the session as soon as its `submission_queued`
        // is queued, not once it is committed: the session's events for it
        // are queued after it, so they commit with it or after it (never
        // before), and an idle session's turn can start in the same commit.
        // The caller hears of the acceptance only after the commit.
        let stored = recorder.append_with_receipt(vec![event], None).await?;
        recorder.expect_settlement(id.clone());
        drop(recorder);
        if policy == BusyPolicy::Interrupt {
            // The interrupt takes the control lane, so it reaches the running
            // turn ahead of the message; a full control lane means interrupts
            // are already on their way.
            match self.sender.submit(Op::Interrupt { turn_id: None }) {
                Ok(_) | Err(Error::Busy(_)) => {}
                Err(error) => return Err(error),
            }
        }
        self.sender.send_reserved(
            reservation,
            id.clone(),
            queued_op,
            options.submitted_by,
            options.traceparent,
        );
        let sequence = stored.await?;
        Ok(Accepted {
            submission_id: id,
            sequence,
            duplicate: false,
        })
    }

    /// Submits an op that is not stored ahead (a control op, shutdown)
    /// straight to the queue, under `submission_id` if one is given.
    fn submit_now(&self, op: Op, submission_id: Option<String>, submitted_by: Option<Actor>) -> Result<Accepted> {
        let id = submission_id.unwrap_or_else(new_id);
        let reservation = self.sender.reserve(&op)?;
        let submitted = self.sender.send_reserved(reservation, id, op, submitted_by, None);
        Ok(Accepted {
            submission_id: submitted.id,
            sequence: self.recorder.last_sequence(),
            duplicate: false,
        })
    }
}

/// The answer to a submission whose idempotency key is stored already
/// (`earlier`): what the first one was answered, read back from the event
/// the key points at. A `submission_queued` is a duplicate receipt, unless
/// the request differs from the first one ([`Error::KeyReused`]: answering
/// it as a duplicate would silently drop the new message); a
/// `submission_rejected` is the same refusal ([`Error::SessionBusy`]), for a
/// key names one request forever. If the event cannot be found the retry is
/// taken as the same request, as before keys were compared. Also used by a
/// node relaying to another.
pub async fn answer_keyed(
    store: &dyn CheckpointStore,
    session_id: &str,
    key: &str,
    earlier: KeyedSubmission,
    op: &Op,
    on_busy: BusyPolicy,
) -> Result<Accepted> {
    let after = earlier.sequence.saturating_sub(1);
    let events = store.events_after(session_id, after, 1).await?;
    let stored = events
        .into_iter()
        .next()
        .filter(|stored| stored.submission_id.as_deref() == Some(earlier.submission_id.as_str()));
    match stored.map(|stored| stored.event.msg) {
        Some(EventMsg::SubmissionRejected(rejected)) => return Err(Error::SessionBusy(rejected.reason)),
        Some(EventMsg::SubmissionQueued(queued)) if queued.op != *op || queued.on_busy != on_busy => {
            return Err(key_reused(key, &earlier.submission_id));
        }
        _ => {}
    }
    Ok(Accepted {
        submission_id: earlier.submission_id,
        sequence: earlier.sequence,
        duplicate: true,
    })
}

/// The refusal of a key sent again with another body than submission
/// `submission_id`'s.
pub fn key_reused(key: &str, submission_id: &str) -> Error {
    Error::KeyReused(format!(
        "idempotency key '{key}' was first used for submission {submission_id} with another body; use a new key for a new request"
    ))
}
