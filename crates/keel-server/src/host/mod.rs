//! Hosting many sessions in one process.
//!
//! A session is loaded (its agent created) on first use and unloaded once
//! it has been idle for a while: nobody subscribed, no request using it, no
//! turn running (a turn waiting for approval is at rest: its wait is durable)
//! and nothing queued. At most `max_live` sessions are loaded; loading one
//! more unloads the longest-idle unloadable session, or fails with
//! `503 too_many_sessions` when none is. At start, the sessions the store
//! holds work for (a turn in flight, messages queued) are loaded.
//!
//! Each session id has a slot whose async lock serializes loading, using
//! and unloading it: two requests never load the same session twice, and a
//! session is never reloaded before its previous agent has stopped.
//!
//! With several nodes on one database (`cluster`), a session is loaded
//! only under a lease this node claimed; the rest of that mode (relaying,
//! renewals, take-overs, wake-ups) lives in `cluster.rs`, and the answers
//! to relayed submissions in `answers.rs`.

//!
//! One job per module: `live` (a loaded session and the lease a request
//! holds on it), `pump` (the task that owns a session's agent and
//! publishes its events), `lifecycle` (loading, the bound on live
//! sessions, unloading), `recovery` (the sessions with stored work at
//! start), `retention` (deleting sessions idle past their retention) and
//! `shutdown`.

mod answers;
mod client_deadlines;
mod cluster;
mod elsewhere;
mod forward;
mod lifecycle;
mod live;
mod model_change;
mod pump;
mod recovery;
mod relay_seal;
mod retention;
mod shutdown;
mod take_up;

pub(crate) use cluster::Node;
pub(crate) use forward::{FORWARD_PATH, Forward, ForwardReply};
pub(crate) use model_change::SettingsChange;
pub use relay_seal::RelayKey;

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use self::live::{SessionInUse, Slot, SlotGuard};
use self::pump::CloseMode;
use super::error::ApiError;
use super::factory::SessionFactory;
use super::fanout::{Hubs, Subscription};
use super::metrics::Metrics;
use super::settings::SessionSettings;
use keel_agent::{LeaseClock, LeaseOwner, SessionContext, SessionStatus, SubmitOptions};
use keel_protocol::{Actor, ActorKind, Op};
use keel_store::{CheckpointStore, CheckpointStoreExt, ClusterStore};

/// How long a session may take to stop once asked before it is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds of a host.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostLimits {
    /// The most sessions loaded at once.
    pub(crate) max_live: usize,
    /// How long an unloadable session stays loaded.
    pub(crate) idle_unload: Duration,
    /// How long running turns get to finish at shutdown before they are
    /// interrupted.
    pub(crate) shutdown_grace: Duration,
}

/// The live sessions of a server.
pub(crate) struct Host {
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) factory: SessionFactory,
    metrics: Arc<Metrics>,
    hubs: Hubs,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    live_count: AtomicUsize,
    limits: HostLimits,
    closing: watch::Sender<bool>,
    /// With several nodes on one database: this node, whose leases the
    /// sessions it loads are claimed under.
    cluster: Option<LeaseOwner>,
    /// The store's relaying and notices (several nodes only).
    shared: Option<Arc<dyn ClusterStore>>,
    /// Wakes the take-over sweep (several nodes only).
    sweep: tokio::sync::Notify,
    /// Seals the submissions this node relays and checks those it takes
    /// up (several nodes only; `None` alone, where nothing relayed or
    /// handed over is taken).
    relay_key: Option<RelayKey>,
    /// How long a relayed submission waits for the owner's answer.
    relay_wait: Duration,
    /// The requests waiting for an owner's answer (several nodes only).
    answers: answers::AnswerWaiters,
    /// The sessions other live nodes run, as last learnt (several nodes
    /// only): their submissions are relayed without a claim first.
    elsewhere: elsewhere::ElsewhereHints,
    /// The relayed submissions this node took up lately.
    recently_taken: take_up::RecentlyTaken,
    /// Where the other nodes take submissions handed to them directly.
    peers: forward::Peers,
    /// Wakes the webhook deliverer when a live session commits an event
    /// webhooks may want.
    pub(crate) webhook_wake: Arc<tokio::sync::Notify>,
    /// The submissions other nodes handed to this one lately.
    handed_recently: forward::HandedRecently,
    /// When the client calls of sessions not loaded time out.
    client_deadlines: client_deadlines::ClientDeadlines,
}

impl Host {
    pub(crate) fn new(
        store: Arc<dyn CheckpointStore>,
        factory: SessionFactory,
        metrics: Arc<Metrics>,
        limits: HostLimits,
        live_buffer: usize,
        node: Option<Node>,
    ) -> Self {
        let (cluster, shared, relay_key, relay_wait) = match node {
            Some(node) => (
                Some(node.owner),
                Some(node.store),
                Some(node.relay_key),
                node.relay_wait,
            ),
            None => (None, None, None, Duration::ZERO),
        };
        Self {
            store,
            factory,
            metrics,
            hubs: Hubs::new(live_buffer),
            slots: Mutex::new(HashMap::new()),
            live_count: AtomicUsize::new(0),
            limits,
            closing: watch::Sender::new(false),
            cluster,
            shared,
            sweep: tokio::sync::Notify::new(),
            relay_key,
            relay_wait,
            answers: answers::AnswerWaiters::default(),
            elsewhere: elsewhere::ElsewhereHints::default(),
            recently_taken: take_up::RecentlyTaken::default(),
            peers: forward::Peers::new(relay_wait),
            webhook_wake: Arc::new(tokio::sync::Notify::new()),
            handed_recently: forward::HandedRecently::default(),
            client_deadlines: client_deadlines::ClientDeadlines::default(),
        }
    }

    /// Whether the server is shutting down.
    /// Turns true when the server begins to shut down.
    pub(crate) fn closing_signal(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    pub(crate) fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    fn check_open(&self) -> Result<(), ApiError> {
        if self.is_closing() {
            return Err(ApiError::Unavailable("the server is shutting down".to_owned()));
        }
        Ok(())
    }

    /// The live session `session_id`, loaded if it is not; `404` if the
    /// store does not have it.
    pub(crate) async fn acquire(&self, session_id: &str) -> Result<SessionInUse, ApiError> {
        let slot = self.open_slot(session_id)?;
        let mut loaded_now = false;
        let result = async {
            let mut live = self.lock_open(&slot).await?;
            if let Some(session) = live.as_ref() {
                if !session.stopped() {
                    return Ok(session.in_use());
                }
                if let Some(stale) = live.take() {
                    self.unload(stale, Some(CloseMode::Abort)).await;
                }
            }
            let summary = self
                .store
                .session_summary(session_id)
                .await?
                .ok_or_else(|| ApiError::unknown_session(session_id))?;
            let settings = SessionSettings::stored(session_id, &summary.context)?;
            // With several nodes, the lease first: a session another node
            // runs costs one statement here, not a session's assembly. Its
            // clock starts before the claim: the lease lasts from there.
            let clock = LeaseClock::new();
            let claimed = self.claim(session_id, &summary.context.tenant).await?;
            let held = claimed.clone().map(|lease| (lease, clock));
            let session = match self.start(session_id, settings, summary.context, held).await {
                Ok(session) => session,
                Err(error) => {
                    if let Some(lease) = &claimed {
                        self.release(lease).await;
                    }
                    return Err(error);
                }
            };
            let lease = session.in_use();
            *live = Some(session);
            loaded_now = true;
            Ok(lease)
        }
        .await;
        match &result {
            Err(_) => self.forget_slot(session_id, slot),
            // What was relayed to it while nobody ran it goes first.
            Ok(session) if loaded_now && self.cluster.is_some() => self.queue_relayed(session, None).await,
            Ok(_) => {}
        }
        result
    }

    /// Creates the session `session_id` and loads it; `409 conflict` if it
    /// exists.
    pub(crate) async fn create(
        &self,
        session_id: &str,
        settings: SessionSettings,
        context: SessionContext,
    ) -> Result<SessionInUse, ApiError> {
        let slot = self.open_slot(session_id)?;
        let result = async {
            let mut live = self.lock_open(&slot).await?;
            let exists = live.as_ref().is_some_and(|session| !session.stopped())
                || self.store.session_summary(session_id).await?.is_some();
            if exists {
                return Err(ApiError::Conflict(format!("session '{session_id}' exists")));
            }
            // A directory Keel makes for it, never one that was there.
            let tenant = context.tenant.clone();
            self.factory.create_workspace(&tenant, session_id).await?;
            let session = match self.start(session_id, settings, context, None).await {
                Ok(session) => session,
                Err(error) => {
                    self.factory.discard_workspace(&tenant, session_id).await;
                    return Err(error);
                }
            };
            let lease = session.in_use();
            *live = Some(session);
            Ok(lease)
        }
        .await;
        if result.is_err() {
            self.forget_slot(session_id, slot);
        }
        result
    }

    /// Deletes the session `session_id` from the store, shutting its live
    /// session down first; with `workspace`, its workspace directory goes
    /// too. Returns whether the session existed.
    ///
    /// The slot's lock is held from the shutdown to the deletion, so a
    /// request arriving meanwhile waits, then finds no session (`404`)
    /// instead of loading it again between the two.
    pub(crate) async fn delete(&self, session_id: &str, workspace: bool) -> Result<bool, ApiError> {
        self.delete_where(session_id, workspace, None).await
    }

    /// [`Self::delete`]; with `idle_before`, only a session that is not
    /// loaded, has no turn in flight and was last written before that time
    /// (checked under the slot's lock, so a request that used it meanwhile
    /// keeps it).
    pub(super) async fn delete_where(
        &self,
        session_id: &str,
        workspace: bool,
        idle_before: Option<u64>,
    ) -> Result<bool, ApiError> {
        let slot = self.open_slot(session_id)?;
        let result = async {
            let mut live = self.lock_open(&slot).await?;
            if let Some(cutoff) = idle_before {
                let idle = live.is_none()
                    && self
                        .store
                        .session_summary(session_id)
                        .await?
                        .is_some_and(|summary| summary.updated_at_ms < cutoff && summary.running_turn_id.is_none());
                if !idle {
                    return Ok(false);
                }
            }
            // The workspace is in its tenant's root.
            let tenant = if workspace {
                let stored = self.store.session_summary(session_id).await?;
                let tenant = match (stored, live.as_ref()) {
                    (Some(summary), _) => summary.context.tenant,
                    (None, Some(session)) => session.tenant.clone(),
                    (None, None) => return Ok(false),
                };
                // Refused before anything is deleted: a workspace Keel did
                // not create, or one holding Keel's own files, stays, and so
                // does its session.
                self.factory.check_workspace_removable(&tenant, session_id).await?;
                Some(tenant)
            } else {
                None
            };
            if let Some(session) = live.take() {
                // Its work is about to be deleted: nothing to wait for.
                self.unload(session, Some(CloseMode::Abort)).await;
            }
            let existed = self.store.delete_session(session_id).await?;
            if existed && let Some(tenant) = &tenant {
                self.factory
                    .remove_workspace(tenant, session_id)
                    .await
                    .map_err(|error| {
                        ApiError::Internal(format!(
                            "session '{session_id}' was deleted but its workspace was not: {error}"
                        ))
                    })?;
            }
            Ok(existed)
        }
        .await;
        self.forget_slot(session_id, slot);
        result
    }

    /// Submits `op` to the session, loading it if needed, recorded as sent
    /// by `submitted_by` (the operator's actor names the session's tenant,
    /// the one it acted for). A session found stopped (by a `shutdown` op)
    /// is loaded again once.
    pub(crate) async fn submit(
        &self,
        session_id: &str,
        op: Op,
        on_busy: Option<keel_agent::BusyPolicy>,
        idempotency_key: Option<String>,
        submitted_by: Actor,
        traceparent: Option<String>,
    ) -> Result<keel_agent::Accepted, ApiError> {
        let mut retried = false;
        // Another node runs it, as a claim found moments ago: relayed at
        // once.
        if self.status(session_id).is_none() && self.runs_elsewhere(session_id) {
            return self
                .relay(session_id, op, on_busy, idempotency_key, submitted_by, traceparent)
                .await;
        }
        loop {
            let session = match self.acquire(session_id).await {
                Ok(session) => session,
                // Another node runs it: it takes the submission from the store.
                Err(ApiError::Elsewhere(_)) if self.cluster.is_some() => {
                    return self
                        .relay(session_id, op, on_busy, idempotency_key, submitted_by, traceparent)
                        .await;
                }
                Err(error) => return Err(error),
            };
            let budgets = &self.factory.budgets;
            if budgets.watches(&session.tenant, session_id)
                && !self.retried_key(session_id, idempotency_key.as_deref()).await?
            {
                budgets.admit(&session.tenant, session_id, &op).await?;
            }
            let options = SubmitOptions {
                on_busy: on_busy.unwrap_or(session.settings.on_busy),
                idempotency_key: idempotency_key.clone(),
                submission_id: None,
                submitted_by: Some(acting_for(submitted_by.clone(), &session.tenant)),
                key_is_new: false,
                traceparent: traceparent.clone(),
            };
            match session.handle.submit_durable(op.clone(), options).await {
                Ok(accepted) if is_decision(&op) => {
                    // Held meanwhile: the session is not unloaded before
                    // it has recorded the decision.
                    let answer = self.decision_recorded(session_id, accepted).await;
                    drop(session);
                    return answer;
                }
                Ok(accepted) => return Ok(accepted),
                Err(keel_protocol::Error::Stopped(_)) if !retried && !self.is_closing() => {
                    // It stopped (a `shutdown` op): load it again.
                    retried = true;
                    session.wait_stopped().await;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Answers a decision (an approval, a client tool's result) once the
    /// session has recorded what it made of it: a decision is not stored
    /// ahead like a message, so without this wait a `202` could come back
    /// for one that a crash then lost, and nobody would send it again. A
    /// decision that nothing records in time is `503`: the caller sends it
    /// again, and one that took effect meanwhile is refused harmlessly.
    async fn decision_recorded(
        &self,
        session_id: &str,
        accepted: keel_agent::Accepted,
    ) -> Result<keel_agent::Accepted, ApiError> {
        let mut events = self.subscribe(session_id, accepted.sequence);
        let recorded = async {
            loop {
                let Some(event) = events.next().await? else {
                    return Ok::<bool, ApiError>(false);
                };
                let carries = serde_json::from_str::<serde_json::Value>(&event.json)
                    .is_ok_and(|event| event["submission_id"] == accepted.submission_id.as_str());
                if carries {
                    return Ok(true);
                }
            }
        };
        match tokio::time::timeout(DECISION_WAIT, recorded).await {
            Ok(Ok(true)) => Ok(accepted),
            Ok(Err(error)) => Err(error),
            Ok(Ok(false)) | Err(_) => Err(ApiError::Unavailable(format!(
                "the session did not record submission {} in time; it may not take effect: send it again",
                accepted.submission_id
            ))),
        }
    }

    /// Whether `key` names a submission the session took already: a retry,
    /// answered as the first request was whatever the budgets say now.
    async fn retried_key(&self, session_id: &str, key: Option<&str>) -> Result<bool, ApiError> {
        match key {
            Some(key) => Ok(self.store.keyed_submission(session_id, key).await?.is_some()),
            None => Ok(false),
        }
    }

    /// Keeps the budgets up to date with the store's until shutdown.
    pub(crate) async fn follow_budgets(&self) {
        self.factory.budgets.follow(self.closing.subscribe()).await;
    }

    /// A subscription to the events of `session_id` after `after`. It does
    /// not load the session; it follows it while it is live.
    pub(crate) fn subscribe(&self, session_id: &str, after: u64) -> Subscription {
        Subscription::new(
            self.hubs.get(session_id),
            after,
            Arc::clone(&self.store),
            Arc::clone(&self.metrics),
            self.closing.subscribe(),
        )
    }

    /// [`Subscription::from_now`] on `session_id`'s hub.
    pub(crate) fn subscribe_from_now(&self, session_id: &str) -> Option<Subscription> {
        Subscription::from_now(
            self.hubs.get(session_id),
            Arc::clone(&self.store),
            Arc::clone(&self.metrics),
            self.closing.subscribe(),
        )
    }

    /// The status of `session_id` if it is live (and not being loaded or
    /// unloaded right now).
    pub(crate) fn status(&self, session_id: &str) -> Option<SessionStatus> {
        let slot = self.find_slot(session_id)?;
        let live = slot.live.try_lock().ok()?;
        live.as_ref()
            .filter(|session| !session.stopped())
            .map(|session| session.handle.status())
    }

    /// The tenant of `session_id` if it is live here (and not being loaded
    /// or unloaded right now): what a session not stored yet belongs to.
    pub(crate) fn live_tenant(&self, session_id: &str) -> Option<String> {
        let slot = self.find_slot(session_id)?;
        let live = slot.live.try_lock().ok()?;
        live.as_ref()
            .filter(|session| !session.stopped())
            .map(|session| session.tenant.clone())
    }

    /// The tenant of `session_id` if this node knows it without reading the
    /// store: it runs the session, or learnt moments ago that another live
    /// node does ([`elsewhere`]).
    pub(crate) fn known_tenant(&self, session_id: &str) -> Option<String> {
        self.live_tenant(session_id)
            .or_else(|| self.elsewhere.get(session_id).map(|hint| hint.tenant))
    }

    /// Submissions queued across the live sessions.
    pub(crate) fn queued_total(&self) -> usize {
        let slots = self.slots_now();
        slots
            .iter()
            .filter_map(|slot| {
                let live = slot.live.try_lock().ok()?;
                live.as_ref().map(|session| session.handle.status().queued)
            })
            .sum()
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn slot(&self, session_id: &str) -> Arc<Slot> {
        Arc::clone(self.lock_slots().entry(session_id.to_owned()).or_default())
    }

    /// The slot of `session_id` if it has one; never makes one.
    fn find_slot(&self, session_id: &str) -> Option<Arc<Slot>> {
        self.lock_slots().get(session_id).cloned()
    }

    /// Every slot, as they are now.
    fn slots_now(&self) -> Vec<Arc<Slot>> {
        self.lock_slots().values().cloned().collect()
    }

    /// Every slot with its session id, as they are now.
    fn slots_by_id(&self) -> Vec<(String, Arc<Slot>)> {
        self.lock_slots()
            .iter()
            .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
            .collect()
    }

    /// The slot of `session_id` for a request that may load, create or
    /// delete it; `503` once the server is shutting down.
    fn open_slot(&self, session_id: &str) -> Result<Arc<Slot>, ApiError> {
        self.check_open()?;
        Ok(self.slot(session_id))
    }

    /// Locks `slot`, then checks again that the server is not shutting
    /// down: it may have begun while the lock was awaited.
    async fn lock_open<'a>(&self, slot: &'a Slot) -> Result<SlotGuard<'a>, ApiError> {
        let live = slot.live.lock().await;
        self.check_open()?;
        Ok(live)
    }

    /// Drops the slot of `session_id` if it is empty and nobody else holds it.
    fn forget_slot(&self, session_id: &str, slot: Arc<Slot>) {
        let mut slots = self.lock_slots();
        let ours = slots.get(session_id).is_some_and(|kept| Arc::ptr_eq(kept, &slot));
        // Two references: the map's and ours. Anyone else would have cloned
        // it under the map's lock, which we hold.
        if ours && Arc::strong_count(&slot) == 2 && slot.live.try_lock().is_ok_and(|live| live.is_none()) {
            slots.remove(session_id);
        }
    }
}

/// `actor` as recorded on a session of `tenant`: the operator acts for
/// every tenant, so its submissions name the session's; any other principal
/// names its own (only ever the session's, since it sees no other).
pub(crate) fn acting_for(actor: Actor, tenant: &str) -> Actor {
    match actor.kind {
        ActorKind::Operator => Actor {
            tenant: tenant.to_owned(),
            ..actor
        },
        ActorKind::ApiKey | ActorKind::Jwt => actor,
    }
}

/// How long a decision waits to be recorded before it is answered `503`.
const DECISION_WAIT: Duration = Duration::from_secs(10);

/// Whether `op` is a decision a waiting turn takes (see
/// [`Host::decision_recorded`]).
fn is_decision(op: &Op) -> bool {
    matches!(op, Op::Approval { .. } | Op::ClientToolResult { .. })
}
