//! Handing a submission to the node that runs its session directly, over
//! HTTP, instead of through the database.
//!
//! A relay through the store costs a row, two notices and a wait for the
//! owner's answer notice (see `cluster.rs`). When a node knows which node
//! holds a session (its lease, learnt from a claim: `elsewhere.rs`) and
//! where that node takes submissions (the URL it advertised in the store's
//! `nodes`), it posts the submission to that node's
//! [`FORWARD_PATH`] instead, sealed like a stored row and stamped with when
//! it was sent. The owner queues it as if its client had asked it (the
//! same checks of tenant and key) and answers at once; the relaying node
//! answers its client with that.
//!
//! The store stays the way that always works: a submission the owner did
//! not take (it does not run the session any more, it cannot be reached,
//! its budgets need the stored session) is relayed through the store as
//! before. One whose fate is unknown (the owner took the request and gave
//! no answer) is relayed through the store only if it has an idempotency
//! key, which makes a second queueing a duplicate; without one it is
//! answered `503 owner_unavailable`, as a single node that died mid-request
//! leaves its client not knowing.
//!
//! A handed-over submission is sealed over when it was sent, and the owner
//! takes one only within [`FORWARD_WINDOW`] of that (by its own clock) and
//! only once by its id (it remembers the ids of that long and twice over):
//! a copy replayed later is refused. With no cluster key nothing is sealed
//! or checked, as for stored rows (`relay_seal.rs`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::Host;
use super::answers::{client_answer, not_the_sender_s, owner_answer, sender_sees};
use crate::error::ApiError;
use keel_agent::{Accepted, SubmitOptions};
use keel_protocol::now_ms;
use keel_store::{RelayOutcome, RelayedSubmission};

/// Where a node takes submissions handed over by the others (not part of
/// the client API: a node refuses what no node of its cluster sealed).
pub(crate) const FORWARD_PATH: &str = "/cluster/v1/forwarded";

/// How far from its sending a handed-over submission is still taken, by
/// the owner's clock: the nodes' clocks must agree closer than this, or
/// their submissions go through the store.
const FORWARD_WINDOW: Duration = Duration::from_secs(10);

/// Ids of handed-over submissions remembered at most. Past this, new ones
/// are not taken (they go through the store): a full memory never lets a
/// copy through.
const MAX_REMEMBERED: usize = 262_144;

/// How long a node that could not be reached is not tried again.
const UNREACHABLE_PAUSE: Duration = Duration::from_secs(1);

/// How long a node found to advertise no URL is not looked up again.
const NO_URL_PAUSE: Duration = Duration::from_secs(30);

/// How long a connection to another node may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a node hands another: the submission (its `seal` the forward
/// seal), for which session, and when it was sent (ms since the epoch).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Forward {
    /// The session it is for.
    pub(crate) session_id: String,
    /// The id the relaying node answers with; queued under it.
    pub(crate) submission_id: String,
    /// The client's idempotency key.
    pub(crate) idempotency_key: Option<String>,
    /// The rest of the submission (as a stored row holds it, whose id and
    /// key are columns of their own), sealed with
    /// [`super::RelayKey::seal_forward`].
    pub(crate) submission: RelayedSubmission,
    /// When the relaying node sent it, by its clock.
    pub(crate) sent_at_ms: u64,
}

impl Forward {
    /// The submission whole again.
    fn into_parts(self) -> (String, RelayedSubmission, u64) {
        let submission = RelayedSubmission {
            submission_id: self.submission_id,
            idempotency_key: self.idempotency_key,
            ..self.submission
        };
        (self.session_id, submission, self.sent_at_ms)
    }
}

/// The owner's reply to a handed-over submission.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub(crate) enum ForwardReply {
    /// It answered the submission as its client would have been answered.
    Answered {
        /// The answer.
        answer: RelayOutcome,
    },
    /// Nothing was queued: relay it through the store.
    NotTaken {
        /// Why, for the logs.
        reason: String,
    },
    /// Queuing it failed midway: it may or may not be queued.
    Unknown {
        /// What failed.
        message: String,
        /// Whether it was the owner's store, unavailable (the answer its
        /// own client would have had: `503 store_unavailable`).
        #[serde(default)]
        store_unavailable: bool,
    },
}

impl ForwardReply {
    fn not_taken(reason: &str) -> Self {
        Self::NotTaken {
            reason: reason.to_owned(),
        }
    }
}

/// What became of a submission this node tried to hand over.
pub(super) enum Forwarded {
    /// The owner answered: this is the client's answer.
    Answered(Result<Accepted, ApiError>),
    /// Nothing was queued: relay it through the store.
    NotTaken,
    /// It may have been queued: relay it through the store only with an
    /// idempotency key; this is the answer otherwise.
    Unknown(ApiError),
}

/// Where the other nodes take submissions, as this node last read it.
pub(super) struct Peers {
    client: reqwest::Client,
    known: Mutex<HashMap<String, Peer>>,
}

/// One node's URL (`None`: it advertised none) and until when it is not
/// tried.
struct Peer {
    url: Option<String>,
    paused_until: Option<Instant>,
}

impl Peers {
    /// An HTTP client that follows no redirect (a node answers, it does
    /// not send elsewhere) and gives up connecting quickly.
    pub(super) fn new(timeout: Duration) -> Self {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(timeout)
            .build()
            .unwrap_or_default();
        Self {
            client,
            known: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Peer>> {
        self.known.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// `Some(url)` if known and not paused; `Some(None)` if known to be
    /// paused or without one; `None` if it must be read.
    fn cached(&self, node: &str) -> Option<Option<String>> {
        let mut known = self.lock();
        let peer = known.get(node)?;
        match peer.paused_until {
            Some(until) if until > Instant::now() => Some(None),
            Some(_) => {
                known.remove(node);
                None
            }
            None => Some(peer.url.clone()),
        }
    }

    fn remember(&self, node: &str, url: Option<String>) {
        let paused_until = url.is_none().then(|| Instant::now() + NO_URL_PAUSE);
        self.lock().insert(node.to_owned(), Peer { url, paused_until });
    }

    /// Stops trying `node` for a moment, then reads its URL again (it may
    /// have restarted elsewhere).
    fn unreachable(&self, node: &str) {
        self.lock().insert(
            node.to_owned(),
            Peer {
                url: None,
                paused_until: Some(Instant::now() + UNREACHABLE_PAUSE),
            },
        );
    }
}

/// The ids of the submissions handed to this node lately, so a copy sent
/// again is not queued twice.
///
/// Kept as 64-bit hashes under a key of this process (so nobody can aim
/// for a collision): two ids that collide only send the second through the
/// store, which is as safe, never let a copy through.
#[derive(Default)]
pub(super) struct HandedRecently {
    seen: Mutex<Handed>,
    hasher: RandomState,
}

/// The ids' hashes, in the order received (with when), and as a set.
#[derive(Default)]
struct Handed {
    order: VecDeque<(Instant, u64)>,
    ids: HashSet<u64>,
}

impl HandedRecently {
    /// Remembers `submission_id` and says whether it is new; `false` also
    /// when the memory is full of ids too recent to forget.
    fn first_time(&self, submission_id: &str) -> bool {
        let id = self.hasher.hash_one(submission_id);
        let mut seen = self.seen.lock().unwrap_or_else(|poison| poison.into_inner());
        let Handed { order, ids } = &mut *seen;
        let now = Instant::now();
        // Kept twice the window: a copy arriving later is stale by any
        // clock that drifted less than the window meanwhile.
        while let Some((at, _)) = order.front()
            && now.duration_since(*at) > FORWARD_WINDOW * 2
        {
            if let Some((_, old)) = order.pop_front() {
                ids.remove(&old);
            }
        }
        if ids.len() >= MAX_REMEMBERED || !ids.insert(id) {
            return false;
        }
        order.push_back((now, id));
        true
    }
}

/// Whether a submission sent at `sent_at_ms` is still fresh at `now_ms`.
fn fresh(sent_at_ms: u64, now_ms: u64) -> bool {
    let window = u64::try_from(FORWARD_WINDOW.as_millis()).unwrap_or(u64::MAX);
    sent_at_ms.abs_diff(now_ms) <= window
}

impl Host {
    /// Hands `submission` (unsealed) for `session_id` to `owner`, the node
    /// that holds it, if that node advertised where; waits for its answer
    /// until `deadline`.
    pub(super) async fn forward(
        &self,
        session_id: &str,
        owner: &str,
        submission: RelayedSubmission,
        deadline: Instant,
    ) -> Forwarded {
        let Some(url) = self.owner_url(owner).await else {
            return Forwarded::NotTaken;
        };
        let sent_at_ms = now_ms();
        let seal = self
            .relay_key
            .as_ref()
            .and_then(|key| key.seal_forward(session_id, &submission, sent_at_ms));
        let forward = Forward {
            session_id: session_id.to_owned(),
            submission_id: submission.submission_id.clone(),
            idempotency_key: submission.idempotency_key.clone(),
            submission: RelayedSubmission { seal, ..submission },
            sent_at_ms,
        };
        let sent = self
            .peers
            .client
            .post(format!("{}{FORWARD_PATH}", url.trim_end_matches('/')))
            .timeout(deadline.saturating_duration_since(Instant::now()))
            .json(&forward)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(error) if error.is_connect() => {
                tracing::debug!(%owner, %error, "cannot reach the node running a session; relaying through the store");
                self.peers.unreachable(owner);
                return Forwarded::NotTaken;
            }
            Err(error) => return unknown(session_id, &error.to_string(), false),
        };
        let status = response.status();
        if status.is_server_error() {
            return unknown(session_id, &format!("it answered {status}"), false);
        }
        if !status.is_success() {
            // Refused before anything ran (its front door, an older node).
            tracing::warn!(%owner, %status, "the node running a session refused a submission handed to it");
            return Forwarded::NotTaken;
        }
        match response.json::<ForwardReply>().await {
            Ok(ForwardReply::Answered { answer }) => Forwarded::Answered(client_answer(answer, false)),
            Ok(ForwardReply::NotTaken { reason }) => {
                tracing::debug!(%owner, %reason, "the node running a session did not take a submission");
                Forwarded::NotTaken
            }
            Ok(ForwardReply::Unknown {
                message,
                store_unavailable,
            }) => unknown(session_id, &message, store_unavailable),
            Err(error) => unknown(session_id, &error.to_string(), false),
        }
    }

    /// Where `owner` takes submissions: cached, else read from the store.
    async fn owner_url(&self, owner: &str) -> Option<String> {
        if let Some(cached) = self.peers.cached(owner) {
            return cached;
        }
        match async { self.shared()?.node_url(owner).await }.await {
            Ok(url) => {
                self.peers.remember(owner, url.clone());
                url
            }
            Err(error) => {
                tracing::debug!(%owner, %error, "cannot read where a node takes submissions");
                None
            }
        }
    }

    /// Queues a submission another node handed over for a session this
    /// node runs, and answers as the relaying node's client would have
    /// been answered here.
    pub(crate) async fn take_forwarded(&self, forward: Forward) -> ForwardReply {
        let (session_id, submission, sent_at_ms) = forward.into_parts();
        if self.cluster.is_none() {
            return ForwardReply::not_taken("this node runs alone");
        }
        // Nothing unsealed is acted on: a node without a key takes nothing.
        let sealed = self
            .relay_key
            .as_ref()
            .is_some_and(|key| key.verify_forward(&session_id, &submission, sent_at_ms));
        if !sealed {
            tracing::warn!(
                %session_id,
                submission_id = %submission.submission_id,
                "refused a submission handed over whose seal does not verify"
            );
            self.metrics.relayed_refused.inc();
            return ForwardReply::not_taken("its seal does not verify");
        }
        if !fresh(sent_at_ms, now_ms()) {
            return ForwardReply::not_taken("sent too long ago (or the nodes' clocks disagree)");
        }
        if !self.handed_recently.first_time(&submission.submission_id) {
            return ForwardReply::not_taken("handed over before");
        }
        let Some(session) = self.loaded(&session_id).await else {
            return ForwardReply::not_taken("the session does not run here");
        };
        if !sender_sees(submission.submitted_by.as_ref(), &session.tenant) {
            return ForwardReply::Answered {
                answer: not_the_sender_s(&session_id),
            };
        }
        if self.factory.budgets.watches(&session.tenant, &session_id) {
            // Admitted against the stored session, on the store's path.
            return ForwardReply::not_taken("a budget watches the session");
        }
        let options = SubmitOptions {
            on_busy: submission.on_busy.unwrap_or(session.settings.on_busy),
            idempotency_key: submission.idempotency_key.clone(),
            submission_id: Some(submission.submission_id.clone()),
            submitted_by: submission.submitted_by.clone(),
            key_is_new: false,
            traceparent: submission.traceparent.clone(),
        };
        let decision = super::is_decision(&submission.op);
        let mut queued = session.handle.submit_durable(submission.op, options).await;
        if let Ok(accepted) = &queued
            && decision
        {
            // A decision is answered once the session recorded it, as on
            // this node's own API (see `Host::decision_recorded`).
            match self.decision_recorded(&session_id, accepted.clone()).await {
                Ok(recorded) => queued = Ok(recorded),
                Err(error) => {
                    return ForwardReply::Unknown {
                        store_unavailable: matches!(error, ApiError::StoreUnavailable(_)),
                        message: error.to_string(),
                    };
                }
            }
        }
        match owner_answer(queued, &submission.submission_id) {
            Ok(answer) => ForwardReply::Answered { answer },
            // Stopped before anything was stored (as `Host::submit` relies
            // on too): the store's path loads it again.
            Err(keel_protocol::Error::Stopped(_)) => ForwardReply::not_taken("the session stopped"),
            Err(error) => {
                let error = ApiError::from(error);
                ForwardReply::Unknown {
                    store_unavailable: matches!(error, ApiError::StoreUnavailable(_)),
                    message: error.to_string(),
                }
            }
        }
    }
}

/// The answer to a submission whose fate the owner left unknown: the
/// owner's own when its store failed, as its client would have heard.
fn unknown(session_id: &str, what: &str, store_unavailable: bool) -> Forwarded {
    tracing::warn!(%session_id, %what, "a submission handed to the node running its session got no answer");
    if store_unavailable {
        return Forwarded::Unknown(ApiError::StoreUnavailable(what.to_owned()));
    }
    Forwarded::Unknown(ApiError::OwnerUnavailable {
        message: format!(
            "the node running session '{session_id}' took the submission and gave no answer ({what}); \
             it may have been queued: send it with an Idempotency-Key to retry safely"
        ),
        retry_after_secs: 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handed_over_id_is_taken_once() {
        let recently = HandedRecently::default();
        assert!(recently.first_time("a"));
        assert!(!recently.first_time("a"), "a copy");
        assert!(recently.first_time("b"));
    }

    #[test]
    fn a_full_memory_takes_nothing_new() {
        let recently = HandedRecently::default();
        for index in 0..MAX_REMEMBERED {
            assert!(recently.first_time(&index.to_string()));
        }
        assert!(
            !recently.first_time("one more"),
            "taking it could let a copy through later"
        );
    }

    #[test]
    fn freshness_is_a_window_either_side() {
        let window = FORWARD_WINDOW.as_millis() as u64;
        assert!(fresh(1_000_000, 1_000_000 + window));
        assert!(fresh(1_000_000 + window, 1_000_000), "a clock slightly ahead");
        assert!(!fresh(1_000_000, 1_000_001 + window));
        assert!(!fresh(1_000_001 + window, 1_000_000));
    }

    #[test]
    fn a_forward_reads_back_whole() {
        let submission = RelayedSubmission {
            relay_id: 0,
            submission_id: "sub-1".into(),
            op: keel_protocol::Op::Interrupt { turn_id: None },
            on_busy: None,
            idempotency_key: Some("key-1".into()),
            submitted_by: Some(keel_protocol::Actor::operator("acme")),
            seal: Some("00".into()),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let forward = Forward {
            session_id: "s".into(),
            submission_id: submission.submission_id.clone(),
            idempotency_key: submission.idempotency_key.clone(),
            submission: submission.clone(),
            sent_at_ms: 5,
        };
        let text = serde_json::to_string(&forward).expect("encode");
        let read: Forward = serde_json::from_str(&text).expect("decode");
        assert_eq!(read.into_parts(), ("s".to_owned(), submission, 5));
    }

    #[test]
    fn replies_read_back_as_sent() {
        let replies = [
            ForwardReply::Answered {
                answer: RelayOutcome::Accepted {
                    submission_id: "s".into(),
                    sequence: 3,
                    duplicate: false,
                },
            },
            ForwardReply::not_taken("why"),
            ForwardReply::Unknown {
                message: "what".into(),
                store_unavailable: true,
            },
        ];
        for reply in replies {
            let text = serde_json::to_string(&reply).expect("encode");
            assert_eq!(serde_json::from_str::<ForwardReply>(&text).expect("decode"), reply);
        }
    }
}
