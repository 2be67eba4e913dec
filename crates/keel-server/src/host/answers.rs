//! Answers to relayed submissions: what the owner of a session answered to
//! a submission another node relayed to it, and the wake-ups of the nodes
//! waiting for one.
//!
//! The owner records each answer with the relayed row and notifies
//! `keel_answer` ([`keel_store::ClusterStore::answer_relayed`]); the node
//! that relayed it waits, woken by the notice ([`AnswerWaiters::wake`]) or,
//! should the notice be lost, by a short poll, then answers its client
//! exactly what the owner would have.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Notify;

use crate::error::ApiError;
use keel_agent::Accepted;
use keel_protocol::Error;
use keel_store::{RelayOutcome, RelayRefusal};

/// The nodes' wake-ups for answers, per session with a waiting request.
#[derive(Default)]
pub(super) struct AnswerWaiters {
    waiting: Mutex<HashMap<String, Arc<SessionWaiters>>>,
}

/// The requests of this node waiting for answers from one session's owner.
#[derive(Default)]
pub(super) struct SessionWaiters {
    /// Woken at each answer notice of the session.
    pub(super) notify: Notify,
    /// The relayed submissions waited for, with their answers once a
    /// notice carried them.
    awaited: Mutex<HashMap<u64, Option<RelayOutcome>>>,
}

impl SessionWaiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Option<RelayOutcome>>> {
        self.awaited.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

impl AnswerWaiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SessionWaiters>>> {
        self.waiting.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Registers a request waiting for an answer from `session_id`'s owner.
    pub(super) fn watch(&self, session_id: &str) -> AnswerWatch<'_> {
        let session = Arc::clone(self.lock().entry(session_id.to_owned()).or_default());
        AnswerWatch {
            waiters: self,
            session_id: session_id.to_owned(),
            session,
            relay_id: OnceLock::new(),
        }
    }

    /// Wakes the requests waiting for an answer from `session_id`'s owner,
    /// handing over the `answers` the notice carried to those that wait
    /// for them.
    pub(super) fn wake(&self, session_id: &str, answers: Vec<(u64, RelayOutcome)>) {
        // Under the map's lock, so that a watch being dropped sees only
        // its own reference and the map's.
        let waiting = self.lock();
        let Some(session) = waiting.get(session_id) else {
            return;
        };
        if !answers.is_empty() {
            let mut awaited = session.lock();
            for (relay_id, outcome) in answers {
                if let Some(slot) = awaited.get_mut(&relay_id) {
                    *slot = Some(outcome);
                }
            }
        }
        session.notify.notify_waiters();
    }

    /// Wakes every waiting request: notices may have been missed.
    pub(super) fn wake_all(&self) {
        for session in self.lock().values() {
            session.notify.notify_waiters();
        }
    }
}

/// A request's registration with [`AnswerWaiters`]; dropped, it forgets the
/// session once no other request waits on it.
pub(super) struct AnswerWatch<'a> {
    waiters: &'a AnswerWaiters,
    session_id: String,
    pub(super) session: Arc<SessionWaiters>,
    relay_id: OnceLock<u64>,
}

impl AnswerWatch<'_> {
    /// Waits for the answer to relayed submission `relay_id` (from now: an
    /// answer noticed before is read from the store).
    pub(super) fn expect(&self, relay_id: u64) {
        if self.relay_id.set(relay_id).is_ok() {
            self.session.lock().entry(relay_id).or_insert(None);
        }
    }

    /// The answer a notice carried, if one did.
    pub(super) fn carried(&self) -> Option<RelayOutcome> {
        let relay_id = self.relay_id.get()?;
        self.session.lock().get(relay_id).cloned().flatten()
    }
}

impl Drop for AnswerWatch<'_> {
    fn drop(&mut self) {
        if let Some(relay_id) = self.relay_id.get() {
            self.session.lock().remove(relay_id);
        }
        let mut waiting = self.waiters.lock();
        // Two references: the map's and ours; anyone else cloned it under
        // the lock we hold.
        if waiting
            .get(&self.session_id)
            .is_some_and(|kept| Arc::ptr_eq(kept, &self.session) && Arc::strong_count(kept) == 2)
        {
            waiting.remove(&self.session_id);
        }
    }
}

/// What the owner answers to a relayed submission it took up, from what
/// queuing it gave (`submission_id` is the id the relaying node chose);
/// `Err` for a failure that is not an answer (the session stopped, the
/// store failed): the submission waits for another try.
pub(super) fn owner_answer(result: Result<Accepted, Error>, submission_id: &str) -> Result<RelayOutcome, Error> {
    let refused = |refusal, message| Ok(RelayOutcome::Refused { refusal, message });
    match result {
        Ok(accepted) => Ok(RelayOutcome::Accepted {
            // Queued under its own id is not a duplicate: taken up again
            // after a crash, it is the same submission.
            duplicate: accepted.duplicate && accepted.submission_id != submission_id,
            submission_id: accepted.submission_id,
            sequence: accepted.sequence,
        }),
        Err(Error::SessionBusy(message)) => refused(RelayRefusal::SessionBusy, message),
        Err(Error::Busy(_)) => refused(RelayRefusal::QueueFull, ApiError::QueueFull.to_string()),
        Err(Error::KeyReused(message)) => refused(RelayRefusal::KeyReused, message),
        Err(Error::InvalidInput(message)) => refused(RelayRefusal::InvalidRequest, message),
        Err(other) => Err(other),
    }
}

/// The owner's answer to a relayed submission sent by a principal of
/// another tenant than the session's: the answer to a session that does
/// not exist. The relaying node checked the tenant it knew, which can be
/// stale (see `routes::access::session_to_submit`).
pub(super) fn not_the_sender_s(session_id: &str) -> RelayOutcome {
    RelayOutcome::Refused {
        refusal: RelayRefusal::UnknownSession,
        message: ApiError::unknown_session(session_id).to_string(),
    }
}

/// Whether a relayed submission's sender may reach a session of `tenant`:
/// the operator reaches every tenant; an API key or a token only its own.
pub(super) fn sender_sees(submitted_by: Option<&keel_protocol::Actor>, tenant: &str) -> bool {
    submitted_by.is_none_or(|actor| actor.kind == keel_protocol::ActorKind::Operator || actor.tenant == tenant)
}

/// The answer to the client of the node that relayed a submission: the
/// owner's, marked a duplicate when this request was (`asked_again`).
pub(super) fn client_answer(outcome: RelayOutcome, asked_again: bool) -> Result<Accepted, ApiError> {
    match outcome {
        RelayOutcome::Accepted {
            submission_id,
            sequence,
            duplicate,
        } => Ok(Accepted {
            submission_id,
            sequence,
            duplicate: duplicate || asked_again,
        }),
        RelayOutcome::Refused { refusal, message } => Err(match refusal {
            RelayRefusal::SessionBusy => ApiError::SessionBusy(message),
            RelayRefusal::QueueFull => ApiError::QueueFull,
            RelayRefusal::KeyReused => ApiError::KeyReused(message),
            RelayRefusal::InvalidRequest => ApiError::InvalidRequest(message),
            RelayRefusal::UnknownSession => ApiError::NotFound(message),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_s_answer_is_the_client_s() {
        let accepted = |id: &str, duplicate| Accepted {
            submission_id: id.to_owned(),
            sequence: 7,
            duplicate,
        };
        // Each refusal comes back as the error the owner would have answered.
        type Refusal = (fn() -> Error, &'static str);
        let refusals: [Refusal; 4] = [
            (|| Error::SessionBusy("busy".into()), "session_busy"),
            (
                || Error::Busy(Box::new(keel_protocol::Op::Interrupt { turn_id: None })),
                "queue_full",
            ),
            (|| Error::KeyReused("k".into()), "idempotency_key_reused"),
            (|| Error::InvalidInput("bad".into()), "invalid_request"),
        ];
        for (error, code) in refusals {
            let direct = ApiError::from(error());
            let outcome = owner_answer(Err(error()), "r").expect("an answer");
            let relayed = client_answer(outcome, false).expect_err("refused");
            assert_eq!((relayed.code(), relayed.to_string()), (code, direct.to_string()));
        }
        assert!(owner_answer(Err(Error::Stopped("gone".into())), "r").is_err());
        // Its own id again is the same submission, another one a duplicate.
        let own = owner_answer(Ok(accepted("r", true)), "r").expect("an answer");
        assert_eq!(client_answer(own.clone(), false), Ok(accepted("r", false)));
        assert_eq!(client_answer(own, true), Ok(accepted("r", true)));
        let other = owner_answer(Ok(accepted("first", true)), "r").expect("an answer");
        assert_eq!(client_answer(other, false), Ok(accepted("first", true)));
    }

    #[test]
    fn a_sender_of_another_tenant_is_answered_as_for_no_session() {
        use keel_protocol::{Actor, ActorKind};
        let key_of = |tenant: &str| Actor {
            tenant: tenant.to_owned(),
            principal_id: "k1".to_owned(),
            kind: ActorKind::ApiKey,
            name: Some("ci".to_owned()),
        };
        assert!(sender_sees(Some(&key_of("acme")), "acme"));
        assert!(!sender_sees(Some(&key_of("acme")), "globex"));
        assert!(
            sender_sees(Some(&Actor::operator("acme")), "globex"),
            "the operator sees every tenant"
        );
        assert!(sender_sees(None, "globex"), "rows from before principals were recorded");
        let refused = client_answer(not_the_sender_s("s"), false).expect_err("refused");
        let direct = ApiError::unknown_session("s");
        assert_eq!(
            (refused.code(), refused.to_string()),
            (direct.code(), direct.to_string())
        );
    }

    #[tokio::test]
    async fn a_wake_reaches_the_session_s_waiters_and_the_last_one_out_forgets_it() {
        let waiters = AnswerWaiters::default();
        let first = waiters.watch("s");
        let second = waiters.watch("s");
        {
            let woken = first.session.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            waiters.wake("other", Vec::new());
            waiters.wake("s", Vec::new());
            tokio::time::timeout(std::time::Duration::from_secs(5), woken)
                .await
                .expect("woken");
        }
        drop(first);
        assert_eq!(waiters.lock().len(), 1);
        drop(second);
        assert!(waiters.lock().is_empty());
    }

    #[test]
    fn a_notice_hands_each_waiter_its_own_answer_and_nothing_else_is_kept() {
        let waiters = AnswerWaiters::default();
        let accepted = |sequence| RelayOutcome::Accepted {
            submission_id: format!("s{sequence}"),
            sequence,
            duplicate: false,
        };
        let mine = waiters.watch("s");
        let theirs = waiters.watch("s");
        assert_eq!(mine.carried(), None, "nothing awaited yet");
        mine.expect(7);
        theirs.expect(8);
        // Another node's answers (9) and another session's are not kept.
        waiters.wake("s", vec![(7, accepted(1)), (9, accepted(3))]);
        waiters.wake("t", vec![(8, accepted(4))]);
        assert_eq!(mine.carried(), Some(accepted(1)));
        assert_eq!(theirs.carried(), None, "its answer has not come");
        assert_eq!(mine.session.lock().len(), 2, "only what is awaited");
        waiters.wake("s", vec![(8, accepted(2))]);
        assert_eq!(theirs.carried(), Some(accepted(2)));
        drop(mine);
        assert_eq!(theirs.session.lock().len(), 1, "a waiter takes its slot with it");
        drop(theirs);
        assert!(waiters.lock().is_empty());
    }
}
