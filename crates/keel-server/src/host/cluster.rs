//! Several nodes on one database: what a host does besides running its own
//! sessions.
//!
//! - **Ownership.** A session is loaded only under a lease this node
//!   claimed ([`Host::claim`], before the session is assembled, so a
//!   session another live node holds costs one statement and is
//!   [`ApiError::Elsewhere`]; the [`Lease`] claimed is handed to the
//!   session's runtime, which claims nothing more). [`Host::keep_leases`] renews the leases of
//!   the loaded sessions every third of their time to live and stops a
//!   session whose lease was lost (the node paused past it and another node
//!   took over); the store fences the lost runtime's writes meanwhile.
//! - **Relaying.** A submission for a session another node runs is stored
//!   ([`ClusterStore::relay`]); the owner, woken by the notice, queues it
//!   under the same id ([`Host::take_relayed`]) and records its answer,
//!   which the relaying node waits for and answers its client with (see
//!   `answers.rs`): the same answer from every node.
//! - **Taking over.** [`Host::take_over`] claims the sessions with work that
//!   no live node holds (a node died, or released them at shutdown): at
//!   each notice of a released session, and every half lease as a safety
//!   net.
//! - **Streams.** [`Host::follow`] turns the log notices of sessions that
//!   run elsewhere into pokes of their hubs, so subscribers on this node
//!   read the new events from the store.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::answers::{AnswerWatch, client_answer};
use super::client_deadlines::waits_durably;
use super::forward::Forwarded;
use super::live::{LiveSession, SessionInUse};
use super::pump::CloseMode;
use super::take_up::relayed_key;
use super::{Host, RelayKey};
use crate::error::ApiError;
use crate::settings::SessionSettings;
use keel_agent::{Accepted, BusyPolicy, LeaseOwner, answer_keyed, key_reused};
use keel_protocol::{Actor, Op, new_id};
use keel_store::{ClusterStore, Lease, RelayState, Relayed, RelayedSubmission, StoreError};
use keel_store::{LogNotice, NoticeListener};
use tokio::sync::futures::Notified;

/// A host's part among several nodes on one database.
pub(crate) struct Node {
    /// This node, whose leases the sessions it loads are claimed under.
    pub(crate) owner: LeaseOwner,
    /// The store's several-node part (relaying, take-over), on the
    /// database the host's store is on.
    pub(crate) store: Arc<dyn ClusterStore>,
    /// Seals the submissions this node relays and checks those it takes
    /// up: a node of a cluster always has one (nothing unsealed is acted on).
    pub(crate) relay_key: RelayKey,
    /// How long a submission relayed to another node waits for the owner's
    /// answer before it is answered `503 owner_unavailable`.
    pub(crate) relay_wait: Duration,
}

/// How often a node waiting for the owner's answer reads it again, should
/// the owner's notice be lost. Rarely needed: notices carry the answers,
/// and a listener that lost its connection wakes every waiter when it is
/// back (`Resync`); a short poll only read rows still waiting while a busy
/// owner took its time (0.46 reads per turn at 128 sessions).
const ANSWER_POLL: Duration = Duration::from_secs(1);

/// A submission this node relayed, waiting for the owner's answer.
struct WaitingRelay<'a> {
    /// The store's id for it.
    relay_id: u64,
    /// Whether it was a retry of one relayed already (its key's).
    asked_again: bool,
    /// What was relayed.
    submission: &'a RelayedSubmission,
}

/// Sessions read per take-over page.
const TAKE_OVER_PAGE: usize = 100;

impl Host {
    /// Relays `op` for `session_id`, which another node runs, and answers
    /// what the owner answered: the same receipt, or the same refusal, as
    /// if the client had asked the owner.
    ///
    /// Handed to the owner directly when this node knows which node that is
    /// and where it takes submissions (`forward.rs`); otherwise, or if the
    /// owner did not take it, stored for the owner to take up
    /// ([`Self::owner_s_answer`]). Found moments ago to run elsewhere
    /// ([`Self::relays_at_once`]), a session is not read first: the owner
    /// applies its own `on_busy` when the client gave none.
    pub(super) async fn relay(
        &self,
        session_id: &str,
        op: Op,
        on_busy: Option<BusyPolicy>,
        idempotency_key: Option<String>,
        submitted_by: Actor,
        traceparent: Option<String>,
    ) -> Result<Accepted, ApiError> {
        // One wait for the owner's answer, however it is reached.
        let deadline = Instant::now() + self.relay_wait;
        if let Some(hint) = self.elsewhere.get(session_id)
            && !self.factory.budgets.watches(&hint.tenant, session_id)
        {
            let submission = RelayedSubmission {
                relay_id: 0,
                submission_id: new_id(),
                op: op.clone(),
                on_busy,
                idempotency_key: idempotency_key.clone(),
                submitted_by: Some(super::acting_for(submitted_by.clone(), &hint.tenant)),
                seal: None,
                traceparent: traceparent.clone(),
            };
            match self.forward(session_id, &hint.owner, submission, deadline).await {
                Forwarded::Answered(answer) => {
                    self.metrics.relayed_submissions.inc();
                    self.metrics.forwarded_submissions.inc();
                    return answer;
                }
                // Queued twice, it would run twice: only a key makes the
                // store's path safe.
                Forwarded::Unknown(error) if idempotency_key.is_none() => return Err(error),
                Forwarded::Unknown(_) | Forwarded::NotTaken => {
                    self.metrics.forwards_not_taken.inc();
                }
            }
        }
        if let Some(tenant) = self.relays_at_once(session_id, idempotency_key.as_deref()) {
            let relayed = (op, on_busy, None, submitted_by, traceparent);
            return self.store_relayed(session_id, relayed, &tenant, deadline).await;
        }
        let summary = self
            .store
            .session_summary(session_id)
            .await?
            .ok_or_else(|| ApiError::unknown_session(session_id))?;
        let on_busy = match on_busy {
            Some(policy) => policy,
            None => SessionSettings::stored(session_id, &summary.context)?.on_busy,
        };
        if let Some(key) = &idempotency_key
            && let Some(earlier) = self.store.keyed_submission(session_id, key).await?
        {
            return Ok(answer_keyed(self.store.as_ref(), session_id, key, earlier, &op, on_busy).await?);
        }
        // The ledger and the turn slots are shared: this node refuses what
        // the owner would, and takes the slot the owner's turn will hold.
        let tenant = &summary.context.tenant;
        self.factory.budgets.admit(tenant, session_id, &op).await?;
        let relayed = (op, Some(on_busy), idempotency_key, submitted_by, traceparent);
        self.store_relayed(session_id, relayed, tenant, deadline).await
    }

    /// Whether another live node runs `session_id`, as a claim found
    /// moments ago (several nodes only).
    pub(super) fn runs_elsewhere(&self, session_id: &str) -> bool {
        self.cluster.is_some() && self.elsewhere.get(session_id).is_some()
    }

    /// The tenant of `session_id` if a submission for it can be relayed at
    /// once: another live node holds it (as a claim found moments ago), and
    /// nothing needs the stored session first (no `key` to look up, no
    /// budget to check).
    pub(super) fn relays_at_once(&self, session_id: &str, key: Option<&str>) -> Option<String> {
        if self.cluster.is_none() || key.is_some() {
            return None;
        }
        let elsewhere = self.elsewhere.get(session_id)?;
        (!self.factory.budgets.watches(&elsewhere.tenant, session_id)).then_some(elsewhere.tenant)
    }

    /// Stores a submission (its op, `on_busy`, key and sender) for the
    /// owner of `session_id` and waits for its answer until `deadline`.
    async fn store_relayed(
        &self,
        session_id: &str,
        (op, on_busy, idempotency_key, submitted_by, traceparent): Relaying,
        tenant: &str,
        deadline: Instant,
    ) -> Result<Accepted, ApiError> {
        let submission = RelayedSubmission {
            relay_id: 0,
            submission_id: new_id(),
            op,
            on_busy,
            idempotency_key,
            // Sealed with the rest: the owner records it as it is.
            submitted_by: Some(super::acting_for(submitted_by, tenant)),
            seal: None,
            traceparent,
        };
        let submission = RelayedSubmission {
            seal: self
                .relay_key
                .as_ref()
                .and_then(|key| key.seal(session_id, &submission)),
            ..submission
        };
        // Listening before the row is stored: the owner's answer cannot
        // come before it, so no wake-up is missed and no read is wasted.
        let watch = self.answers.watch(session_id);
        let woken = watch.session.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let capacity = self.factory.submission_capacity;
        let (relay_id, asked_again) = match self.shared()?.relay(session_id, &submission, capacity).await? {
            Relayed::New { relay_id, .. } => {
                self.metrics.relayed_submissions.inc();
                (relay_id, false)
            }
            Relayed::Duplicate(earlier) => {
                if (&earlier.op, earlier.on_busy) != (&submission.op, submission.on_busy) {
                    let key = earlier.idempotency_key.unwrap_or_default();
                    return Err(key_reused(&key, &earlier.submission_id).into());
                }
                // Still waiting for the owner: its answer is this one's.
                (earlier.relay_id, true)
            }
            Relayed::Full => return Err(ApiError::QueueFull),
        };
        // From here an answer notice carries the answer to this one (one
        // noticed already is read from the row).
        watch.expect(relay_id);
        let relayed = WaitingRelay {
            relay_id,
            asked_again,
            submission: &submission,
        };
        self.owner_s_answer(session_id, relayed, &watch, woken, deadline).await
    }

    /// Waits until `deadline` (at most [`Node::relay_wait`] from the
    /// client's request) for the owner's answer to a submission this node
    /// relayed: woken by the owner's notice (`woken`,
    /// armed before the row was stored), which carries the answer when it
    /// fits, and reading the row otherwise and meanwhile, in case the
    /// notice is lost. Past the wait,
    /// [`ApiError::OwnerUnavailable`]: the submission stays relayed, and a
    /// retry with its key gets its real answer.
    async fn owner_s_answer<'n>(
        &self,
        session_id: &str,
        relayed: WaitingRelay<'_>,
        watch: &'n AnswerWatch<'_>,
        mut woken: Pin<&mut Notified<'n>>,
        deadline: Instant,
    ) -> Result<Accepted, ApiError> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            tokio::select! {
                () = &mut woken => {}
                () = tokio::time::sleep(left.min(ANSWER_POLL)) => {}
            }
            if let Some(outcome) = watch.carried() {
                return client_answer(outcome, relayed.asked_again);
            }
            // Armed before the read, so an answer recorded after it wakes.
            woken.set(watch.session.notify.notified());
            woken.as_mut().enable();
            match self.shared()?.relay_state(session_id, relayed.relay_id).await? {
                RelayState::Answered(outcome) => return client_answer(outcome, relayed.asked_again),
                RelayState::Gone => return self.forgotten(session_id, relayed.submission).await,
                RelayState::Waiting => {}
            }
            if Instant::now() >= deadline {
                self.metrics.relay_answers_missed.inc();
                let retry_after_secs = self.cluster.as_ref().map_or(1, |owner| owner.ttl.as_secs().max(1));
                return Err(ApiError::OwnerUnavailable {
                    message: format!(
                        "the node running session '{session_id}' did not take the submission up within {} ms; \
                         it stays relayed: retry with the same Idempotency-Key to learn what became of it",
                        self.relay_wait.as_millis()
                    ),
                    retry_after_secs,
                });
            }
        }
    }

    /// The answer to a relayed submission that was forgotten unanswered:
    /// its key's, if the owner queued it under one; otherwise the session
    /// is gone, or the owner refused the row (its seal did not verify).
    async fn forgotten(&self, session_id: &str, submission: &RelayedSubmission) -> Result<Accepted, ApiError> {
        let key = submission
            .idempotency_key
            .clone()
            .unwrap_or_else(|| relayed_key(&submission.submission_id));
        if let Some(earlier) = self.store.keyed_submission(session_id, &key).await? {
            let on_busy = submission.on_busy.unwrap_or_default();
            return Ok(answer_keyed(self.store.as_ref(), session_id, &key, earlier, &submission.op, on_busy).await?);
        }
        if self.store.session_summary(session_id).await?.is_none() {
            return Err(ApiError::unknown_session(session_id));
        }
        Err(ApiError::Unavailable(format!(
            "the node running session '{session_id}' dropped a relayed submission unanswered; \
             do all nodes have the same cluster key?"
        )))
    }

    /// With several nodes, claims `session_id` for this node: `Ok(None)`
    /// on a single node; [`ApiError::Elsewhere`] when another live node
    /// holds it.
    ///
    /// A claim that finds another node's lease remembers it (with the
    /// session's `tenant`) until that lease ends, so that the session's
    /// next submissions are relayed without a claim first.
    pub(super) async fn claim(&self, session_id: &str, tenant: &str) -> Result<Option<Lease>, ApiError> {
        let Some(owner) = &self.cluster else { return Ok(None) };
        let asked = Instant::now();
        match Lease::claim(owner.leases.as_ref(), session_id, &owner.node, owner.ttl).await {
            Ok(lease) => {
                self.elsewhere.forget(session_id);
                Ok(Some(lease))
            }
            Err(error) => {
                if let StoreError::Owned {
                    owner, expires_in_ms, ..
                } = &error
                {
                    let left = Duration::from_millis(*expires_in_ms);
                    self.elsewhere.learn(session_id, tenant, owner, asked, left);
                }
                Err(error.into())
            }
        }
    }

    /// With several nodes, gives up this node's `lease` (nothing if it was
    /// lost meanwhile), so another node may take the session at once.
    pub(super) async fn release(&self, lease: &Lease) {
        let Some(owner) = &self.cluster else { return };
        let session_id = lease.session_id.as_str();
        match owner.leases.release(session_id, &owner.node, lease.epoch).await {
            Ok(()) | Err(StoreError::UnknownSession(_)) => {}
            Err(error) => tracing::warn!(%session_id, %error, "cannot release a session's lease; it expires"),
        }
    }

    /// The store's several-node part; only a host of several nodes has it.
    pub(super) fn shared(&self) -> Result<&dyn ClusterStore, StoreError> {
        self.shared
            .as_deref()
            .ok_or_else(|| StoreError::Invalid("this node runs alone: its store relays nothing".to_owned()))
    }

    /// Loads `session_id` here if it is worth it and no live node holds it
    /// (a claim: one statement when another node does).
    pub(super) async fn take_over_one(&self, session_id: &str) {
        if self.is_closing() || !self.worth_taking(session_id).await {
            return;
        }
        match self.acquire(session_id).await {
            Ok(_session) => {
                tracing::info!(%session_id, "took over a session with work");
                self.metrics.sessions_taken_over.inc();
            }
            // Another node runs it, or it is gone.
            Err(ApiError::Elsewhere(_) | ApiError::NotFound(_)) => {}
            Err(error) => tracing::warn!(%session_id, %error, "cannot take over a session"),
        }
    }

    /// The live session `session_id` if this node runs it; never loads it.
    pub(super) async fn loaded(&self, session_id: &str) -> Option<SessionInUse> {
        let slot = self.find_slot(session_id)?;
        let live = slot.live.lock().await;
        live.as_ref()
            .filter(|session| !session.stopped())
            .map(|session| session.in_use())
    }

    /// Renews the leases of the loaded sessions every third of their time
    /// to live and stops the sessions whose leases were lost. Runs until
    /// aborted: leases are kept while a shutdown lets turns finish. It does
    /// nothing else, so that no other work can delay a renewal.
    pub(crate) async fn keep_leases(self: &Arc<Self>) {
        let Some(owner) = self.cluster.clone() else { return };
        let every = owner.ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            let sessions: Vec<Arc<LiveSession>> = self
                .live_sessions()
                .into_iter()
                .filter(|session| !session.stopped())
                .collect();
            let held: Vec<(String, u64)> = sessions
                .iter()
                .map(|session| (session.handle.session_id().to_owned(), session.lease.epoch))
                .collect();
            let sent = Instant::now();
            match tokio::time::timeout(every, owner.leases.renew(&owner.node, owner.ttl, &held)).await {
                Ok(Ok(lost)) => {
                    for session in &sessions {
                        if let Some(clock) = &session.clock
                            && !lost.iter().any(|id| id == session.handle.session_id())
                        {
                            clock.renewed_at(sent);
                        }
                    }
                    for session_id in lost {
                        let host = Arc::clone(self);
                        tokio::spawn(async move { host.drop_lost(&session_id).await });
                    }
                }
                Ok(Err(error)) => tracing::warn!(%error, "cannot renew this node's leases"),
                Err(_) => tracing::warn!("renewing this node's leases took longer than a third of their time to live"),
            }
        }
    }

    /// Takes up, every third of a lease until the server shuts down, the
    /// relayed submissions of this node's sessions whose wake-up was
    /// missed (a lost notice, a full queue).
    pub(crate) async fn retry_relayed(&self) {
        let Some(owner) = self.cluster.clone() else { return };
        let every = owner.ttl / 3;
        let mut closing = self.closing.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
            match async { self.shared()?.sessions_with_relayed(&owner.node).await }.await {
                Ok(sessions) => {
                    for session_id in sessions {
                        self.take_relayed(&session_id, None).await;
                    }
                }
                Err(error) => tracing::debug!(%error, "cannot look for relayed submissions"),
            }
        }
    }

    /// The live sessions, as they are now.
    fn live_sessions(&self) -> Vec<Arc<LiveSession>> {
        let slots = self.slots_now();
        slots
            .iter()
            .filter_map(|slot| slot.live.try_lock().ok()?.as_ref().map(Arc::clone))
            .collect()
    }

    /// Stops a session whose lease another node took: it must not run here.
    async fn drop_lost(&self, session_id: &str) {
        let Some(slot) = self.find_slot(session_id) else {
            return;
        };
        let mut live = slot.live.lock().await;
        if let Some(session) = live.take() {
            tracing::warn!(%session_id, "this node lost the session's lease; stopping it here");
            self.metrics.leases_lost.inc();
            // Its writes are fenced off already; nothing to finish.
            self.unload(session, Some(CloseMode::Abort)).await;
        }
        drop(live);
        self.forget_slot(session_id, slot);
    }

    /// Claims and loads, until the server shuts down, the sessions with
    /// work that no live node holds: when woken ([`Self::follow`], a
    /// restart) and every half lease.
    pub(crate) async fn take_over(&self) {
        let Some(owner) = self.cluster.clone() else { return };
        let every = owner.ttl / 2;
        let mut closing = self.closing.subscribe();
        loop {
            self.sweep_once().await;
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = self.sweep.notified() => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
        }
    }

    /// One pass of [`Self::take_over`].
    async fn sweep_once(&self) {
        let Some(owner) = &self.cluster else { return };
        let mut after: Option<String> = None;
        loop {
            let page = match owner
                .leases
                .sessions_to_take_over(after.as_deref(), TAKE_OVER_PAGE)
                .await
            {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "cannot list sessions to take over");
                    return;
                }
            };
            for session_id in &page {
                if self.is_closing() {
                    return;
                }
                if self.status(session_id).is_some() {
                    continue;
                }
                if self.live_count.load(Ordering::SeqCst) >= self.limits.max_live {
                    tracing::warn!("more sessions have work than may be live here; the rest wait");
                    return;
                }
                self.take_over_one(session_id).await;
            }
            if page.len() < TAKE_OVER_PAGE {
                return;
            }
            after = page.last().cloned();
        }
    }

    /// Whether a session without a live owner should be loaded: not one
    /// whose turn waits for approval or a client's result (none timed out)
    /// with nothing relayed to it (that wait is durable; whoever receives
    /// the answer loads it).
    async fn worth_taking(&self, session_id: &str) -> bool {
        match self.store.session_summary(session_id).await {
            Ok(Some(summary)) if !waits_durably(&summary) => true,
            Ok(Some(summary)) => {
                // Its client calls time out here if no node loads it first.
                self.arm_client_deadline(&summary);
                async { self.shared()?.relayed(session_id, 1).await }
                    .await
                    .is_ok_and(|relayed| !relayed.is_empty())
            }
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(%session_id, %error, "cannot read a session to take over");
                false
            }
        }
    }

    /// Acts on the database's notices until the server shuts down: pokes
    /// the hubs of sessions that run elsewhere, takes up relayed
    /// submissions, and wakes the take-over sweep.
    pub(crate) async fn follow(self: &Arc<Self>, mut listener: NoticeListener) {
        let mut closing = self.closing.subscribe();
        loop {
            let notice = tokio::select! {
                notice = listener.recv() => notice,
                _ = closing.wait_for(|closing| *closing) => return,
            };
            match notice {
                None => return,
                Some(LogNotice::Log {
                    session_id,
                    last_sequence,
                    carried,
                }) => {
                    // A local session's subscribers hear from its pump.
                    if self.status(&session_id).is_none() {
                        self.hubs.poke(&session_id, last_sequence, carried.as_ref());
                    }
                }
                Some(LogNotice::Relay {
                    session_id,
                    owner,
                    carried,
                }) => {
                    // Another live node's relay is none of this node's business.
                    let mine = self.cluster.as_ref().map(|cluster| cluster.node.as_str());
                    if owner.is_none() || owner.as_deref() == mine {
                        // Only a notice naming this node as the owner says
                        // the row is this node's to take up.
                        let carried = carried.filter(|_| owner.is_some());
                        let host = Arc::clone(self);
                        tokio::spawn(async move { host.take_relayed(&session_id, carried).await });
                    }
                }
                Some(LogNotice::Answered { session_id, answers }) => self.answers.wake(&session_id, answers),
                Some(LogNotice::Resync) => {
                    self.answers.wake_all();
                    self.hubs.poke_all();
                    self.sweep.notify_one();
                }
            }
        }
    }
}

/// A submission on its way to the owner: its op, `on_busy`, key, sender
/// and `traceparent`.
type Relaying = (Op, Option<BusyPolicy>, Option<String>, Actor, Option<String>);
