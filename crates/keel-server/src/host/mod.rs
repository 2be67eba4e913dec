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
//! renewals, take-overs, wake-ups) lives in `cluster.rs`.

mod cluster;
mod relay_seal;

pub(crate) use cluster::Node;
pub use relay_seal::RelayKey;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::error::ApiError;
use super::factory::SessionFactory;
use super::fanout::{Hub, Hubs, Subscription};
use super::metrics::Metrics;
use super::settings::SessionSettings;
use keel_agent::{
    Agent, LeaseClock, LeaseOwner, SessionContext, SessionHandle, SessionStatus, SubmitOptions, create_agent,
};
use keel_protocol::Op;
use keel_store::{CheckpointStore, CheckpointStoreExt, ClusterStore, Lease};

/// How long a session may take to stop once asked before it is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an interrupted turn may take to close at shutdown.
const INTERRUPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Sessions with stored work listed per store read at start.
const RECOVERY_PAGE: usize = 500;

/// How often a settling session's status is looked at.
const SETTLE_POLL: Duration = Duration::from_millis(20);

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
    /// up (several nodes only; `None`: neither).
    relay_key: Option<RelayKey>,
}

/// Where one session id's live session is kept.
#[derive(Default)]
struct Slot {
    live: tokio::sync::Mutex<Option<Arc<LiveSession>>>,
}

/// How a live session is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseMode {
    /// `Op::Shutdown` after the queued work; the last events are recorded.
    Graceful,
    /// Drop the agent: for a session at rest whose shutdown op would wait
    /// behind a turn (one waiting for approval), or as a last resort.
    Abort,
}

/// A loaded session: its agent is owned by its pump task.
pub(crate) struct LiveSession {
    pub(crate) handle: SessionHandle,
    pub(crate) settings: SessionSettings,
    hub: Arc<Hub>,
    /// Requests using the session right now.
    users: AtomicUsize,
    /// The last event or the end of the last request.
    last_active: Arc<Mutex<Instant>>,
    /// Set when the session's task has stopped (a `shutdown` op, a store failure).
    stopped: Arc<AtomicBool>,
    close: Mutex<Option<oneshot::Sender<CloseMode>>>,
    pump: Mutex<Option<JoinHandle<()>>>,
    /// The sequence of the last event published.
    published: watch::Receiver<u64>,
    /// The lease the session writes under, claimed once when it was loaded.
    lease: Lease,
    /// With several nodes, when the lease was last known to be extended.
    clock: Option<LeaseClock>,
    /// Serializes taking up relayed submissions (several nodes only).
    relaying: tokio::sync::Mutex<()>,
}

impl LiveSession {
    /// Waits (a little) until the session's startup events are committed
    /// and published, so what is shown of a new session includes them.
    pub(crate) async fn started(&self) {
        let mut published = self.published.clone();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, published.wait_for(|sequence| *sequence > 0)).await;
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Waits (a little) until the pump has ended.
    async fn wait_stopped(&self) {
        let mut published = self.published.clone();
        // The pump drops its sender when it ends.
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, async { while published.changed().await.is_ok() {} }).await;
    }

    fn idle_since(&self) -> Instant {
        *self.last_active.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Whether the session can be unloaded without losing or delaying work.
    fn unloadable(&self) -> bool {
        let status = self.handle.status();
        self.users.load(Ordering::SeqCst) == 0 && self.hub.subscribers() == 0 && at_rest(&status)
    }

    fn in_use(self: &Arc<Self>) -> SessionInUse {
        self.users.fetch_add(1, Ordering::SeqCst);
        SessionInUse { live: Arc::clone(self) }
    }
}

/// Whether a session's status lets it stop without cutting a turn short:
/// idle, or waiting for approval with nothing queued (that wait is durable).
fn at_rest(status: &SessionStatus) -> bool {
    !status.busy || (!status.awaiting_approval.is_empty() && status.queued == 0)
}

/// A live session in use by a request; it is not unloaded while in use.
pub(crate) struct SessionInUse {
    live: Arc<LiveSession>,
}

impl std::ops::Deref for SessionInUse {
    type Target = LiveSession;

    fn deref(&self) -> &LiveSession {
        &self.live
    }
}

impl Drop for SessionInUse {
    fn drop(&mut self) {
        *self
            .live
            .last_active
            .lock()
            .unwrap_or_else(|poison| poison.into_inner()) = Instant::now();
        self.live.users.fetch_sub(1, Ordering::SeqCst);
    }
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
        let (cluster, shared, relay_key) = match node {
            Some(node) => (Some(node.owner), Some(node.store), node.relay_key),
            None => (None, None, None),
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
        }
    }

    /// Whether the server is shutting down.
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
        self.check_open()?;
        let slot = self.slot(session_id);
        let mut loaded_now = false;
        let result = async {
            let mut live = slot.live.lock().await;
            self.check_open()?;
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
            let claimed = self.claim(session_id).await?;
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
            Ok(session) if loaded_now && self.cluster.is_some() => self.queue_relayed(session).await,
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
        self.check_open()?;
        let slot = self.slot(session_id);
        let result = async {
            let mut live = slot.live.lock().await;
            self.check_open()?;
            let exists = live.as_ref().is_some_and(|session| !session.stopped())
                || self.store.session_summary(session_id).await?.is_some();
            if exists {
                return Err(ApiError::Conflict(format!("session '{session_id}' exists")));
            }
            // A directory Keel makes for it, never one that was there.
            self.factory.create_workspace(session_id).await?;
            let session = match self.start(session_id, settings, context, None).await {
                Ok(session) => session,
                Err(error) => {
                    self.factory.discard_workspace(session_id).await;
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
    async fn delete_where(
        &self,
        session_id: &str,
        workspace: bool,
        idle_before: Option<u64>,
    ) -> Result<bool, ApiError> {
        self.check_open()?;
        let slot = self.slot(session_id);
        let result = async {
            let mut live = slot.live.lock().await;
            self.check_open()?;
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
            if workspace {
                // Refused before anything is deleted: a workspace Keel did
                // not create, or one holding Keel's own files, stays, and so
                // does its session.
                if self.store.session_summary(session_id).await?.is_none() && live.is_none() {
                    return Ok(false);
                }
                self.factory.check_workspace_removable(session_id).await?;
            }
            if let Some(session) = live.take() {
                // Its work is about to be deleted: nothing to wait for.
                self.unload(session, Some(CloseMode::Abort)).await;
            }
            let existed = self.store.delete_session(session_id).await?;
            if existed && workspace {
                self.factory.remove_workspace(session_id).await.map_err(|error| {
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

    /// Submits `op` to the session, loading it if needed. A session found
    /// stopped (by a `shutdown` op) is loaded again once.
    pub(crate) async fn submit(
        &self,
        session_id: &str,
        op: Op,
        on_busy: Option<keel_agent::BusyPolicy>,
        idempotency_key: Option<String>,
    ) -> Result<keel_agent::Accepted, ApiError> {
        let mut retried = false;
        loop {
            let session = match self.acquire(session_id).await {
                Ok(session) => session,
                // Another node runs it: it takes the submission from the store.
                Err(ApiError::Elsewhere(_)) if self.cluster.is_some() => {
                    return self.relay(session_id, op, on_busy, idempotency_key).await;
                }
                Err(error) => return Err(error),
            };
            let options = SubmitOptions {
                on_busy: on_busy.unwrap_or(session.settings.on_busy),
                idempotency_key: idempotency_key.clone(),
                submission_id: None,
            };
            match session.handle.submit_durable(op.clone(), options).await {
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

    /// The status of `session_id` if it is live (and not being loaded or
    /// unloaded right now).
    pub(crate) fn status(&self, session_id: &str) -> Option<SessionStatus> {
        let slot = self.lock_slots().get(session_id).cloned()?;
        let live = slot.live.try_lock().ok()?;
        live.as_ref()
            .filter(|session| !session.stopped())
            .map(|session| session.handle.status())
    }

    /// Submissions queued across the live sessions.
    pub(crate) fn queued_total(&self) -> usize {
        let slots: Vec<Arc<Slot>> = self.lock_slots().values().cloned().collect();
        slots
            .iter()
            .filter_map(|slot| {
                let live = slot.live.try_lock().ok()?;
                live.as_ref().map(|session| session.handle.status().queued)
            })
            .sum()
    }

    /// Loads the sessions left with work by a runtime that stopped: a turn
    /// in flight (closed as `runtime_stopped`) or acknowledged messages
    /// still queued (a crash after a `202`, or during an earlier recovery),
    /// so they run without waiting for a request. Turns waiting for approval
    /// wait on, unloaded, with whatever is queued behind them.
    pub(crate) async fn recover(&self) {
        if self.cluster.is_some() {
            // The take-over sweep claims what no live node runs.
            self.sweep.notify_one();
            return;
        }
        let mut after: Option<String> = None;
        let mut loaded = 0;
        loop {
            let page = match self.store.sessions_with_work(after.as_deref(), RECOVERY_PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "cannot list sessions to recover");
                    return;
                }
            };
            let last = page.len() < RECOVERY_PAGE;
            after = page.last().cloned();
            for session_id in page {
                match self.store.session_summary(&session_id).await {
                    Ok(Some(summary)) if summary.awaiting_approval.is_empty() => {}
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::warn!(%session_id, %error, "cannot read a session to recover");
                        continue;
                    }
                }
                if loaded >= self.limits.max_live || self.is_closing() {
                    if loaded >= self.limits.max_live {
                        tracing::warn!(%session_id, "more sessions have stored work than may be live; the rest wait for a request");
                    }
                    return;
                }
                match self.acquire(&session_id).await {
                    Ok(_lease) => {
                        tracing::info!(%session_id, "loaded a session with stored work");
                        loaded += 1;
                    }
                    Err(error) => tracing::warn!(%session_id, %error, "cannot recover session"),
                }
            }
            if last {
                return;
            }
        }
    }

    /// Unloads idle sessions until the server shuts down.
    pub(crate) async fn reap(&self) {
        let tick = (self.limits.idle_unload / 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut closing = self.closing.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
            let slots: Vec<(String, Arc<Slot>)> = self
                .lock_slots()
                .iter()
                .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
                .collect();
            for (session_id, slot) in slots {
                let Ok(mut live) = slot.live.try_lock() else { continue };
                let due = live.as_ref().is_some_and(|session| {
                    session.stopped()
                        || (session.unloadable() && session.idle_since().elapsed() >= self.limits.idle_unload)
                });
                if due && let Some(session) = live.take() {
                    tracing::debug!(%session_id, "unloading an idle session");
                    self.unload(session, None).await;
                }
                drop(live);
                self.forget_slot(&session_id, slot);
            }
        }
    }

    /// Deletes, every `every` until the server shuts down, the sessions not
    /// written for `max_idle` (`[server] retention_days`). A session that is
    /// loaded or has a turn in flight is left for a later sweep.
    pub(crate) async fn retain(&self, max_idle: Duration, every: Duration) {
        let mut closing = self.closing.subscribe();
        loop {
            match self.sweep(max_idle).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "deleted sessions past their retention"),
                Err(error) => tracing::warn!(%error, "cannot apply the session retention"),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
        }
    }

    /// One retention sweep; returns how many sessions it deleted.
    async fn sweep(&self, max_idle: Duration) -> Result<usize, ApiError> {
        let max_idle_ms = u64::try_from(max_idle.as_millis()).unwrap_or(u64::MAX);
        let cutoff = keel_protocol::now_ms().saturating_sub(max_idle_ms);
        let mut expired = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .store
                .list_sessions_page(cursor.as_deref(), keel_store::MAX_EVENT_PAGE, None)
                .await?;
            expired.extend(
                page.sessions
                    .into_iter()
                    .filter(|summary| summary.updated_at_ms < cutoff && summary.running_turn_id.is_none())
                    .map(|summary| summary.session_id),
            );
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let mut deleted = 0;
        for session_id in expired {
            if self.is_closing() {
                break;
            }
            if self.delete_where(&session_id, false, Some(cutoff)).await? {
                tracing::info!(%session_id, "session deleted: idle past the retention");
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Stops accepting work: requests get `503 unavailable`, streams end.
    pub(crate) fn begin_shutdown(&self) {
        self.closing.send_replace(true);
    }

    /// Stops every live session: running turns get the grace period to
    /// finish, then are interrupted; then each session shuts down.
    pub(crate) async fn close_all(&self) {
        self.begin_shutdown();
        let deadline = Instant::now() + self.limits.shutdown_grace;
        let slots: Vec<Arc<Slot>> = self.lock_slots().values().cloned().collect();
        futures::future::join_all(slots.into_iter().map(|slot| async move {
            let mut live = slot.live.lock().await;
            if let Some(session) = live.take() {
                self.released();
                self.settle_and_close(session, deadline).await;
            }
        }))
        .await;
    }

    /// Waits until the session is at rest or the grace period is over. A
    /// turn still running then is interrupted (recording `turn_aborted`)
    /// if nothing is queued behind it; with messages queued, the session is
    /// dropped instead, so the messages stay stored and run at the next
    /// start (which closes the cut turn as `runtime_stopped` and runs them).
    async fn settle_and_close(&self, session: Arc<LiveSession>, deadline: Instant) {
        while !session.stopped() && !at_rest(&session.handle.status()) && Instant::now() < deadline {
            tokio::time::sleep(SETTLE_POLL).await;
        }
        let status = session.handle.status();
        if !session.stopped()
            && !at_rest(&status)
            && status.queued == 0
            && let Some(turn_id) = &status.running_turn_id
        {
            let interrupt = Op::Interrupt {
                turn_id: Some(turn_id.clone()),
            };
            match session.handle.submit_durable(interrupt, SubmitOptions::default()).await {
                Ok(_) => {
                    let closed = Instant::now() + INTERRUPT_TIMEOUT;
                    while !session.stopped() && session.handle.status().busy && Instant::now() < closed {
                        tokio::time::sleep(SETTLE_POLL).await;
                    }
                }
                Err(error) => tracing::warn!(%error, "cannot interrupt a running turn at shutdown"),
            }
        }
        let mode = close_mode(&session.handle.status());
        self.close(session, mode).await;
    }

    /// Stops a live session's pump and waits for it (within a bound); with
    /// several nodes, then gives up its lease so another node may take it.
    async fn close(&self, session: Arc<LiveSession>, mode: CloseMode) {
        self.stop_pump(&session, mode).await;
        self.release(&session.lease).await;
    }

    async fn stop_pump(&self, session: &LiveSession, mode: CloseMode) {
        let sender = session.close.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(mode);
        }
        let pump = session.pump.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        if let Some(mut pump) = pump
            && tokio::time::timeout(CLOSE_TIMEOUT, &mut pump).await.is_err()
        {
            tracing::warn!("a session did not stop in time; dropping it");
            pump.abort();
            let _ = pump.await;
        }
    }

    /// Loads a session, making room for it first; under `held`, the lease
    /// this node claimed for it and the clock its renewals move on, or one
    /// the session takes itself (a new session, or a single node).
    async fn start(
        &self,
        session_id: &str,
        settings: SessionSettings,
        context: SessionContext,
        held: Option<(Lease, LeaseClock)>,
    ) -> Result<Arc<LiveSession>, ApiError> {
        self.reserve().await?;
        let started = self.spawn(session_id, settings, context, held).await;
        if started.is_err() {
            self.released();
        }
        started
    }

    async fn spawn(
        &self,
        session_id: &str,
        settings: SessionSettings,
        context: SessionContext,
        held: Option<(Lease, LeaseClock)>,
    ) -> Result<Arc<LiveSession>, ApiError> {
        let mut config = self.factory.agent_config(session_id, &settings, context).await?;
        // A clock of the session's own, started before its claim (the
        // host's, or the session's own for a new one): the renewals that
        // include it move it on.
        let (lease, clock) = held.map_or_else(|| (None, LeaseClock::new()), |(lease, clock)| (Some(lease), clock));
        config.lease_owner = self.cluster.clone().map(|owner| LeaseOwner { clock, ..owner });
        config.lease = lease;
        let clock = config.lease_owner.as_ref().map(|owner| owner.clock.clone());
        let agent = create_agent(config).await?;
        let (close, close_rx) = oneshot::channel();
        let (published, published_rx) = watch::channel(0);
        let session = Arc::new(LiveSession {
            handle: agent.handle(),
            settings,
            hub: self.hubs.get(session_id),
            users: AtomicUsize::new(0),
            last_active: Arc::new(Mutex::new(Instant::now())),
            stopped: Arc::new(AtomicBool::new(false)),
            close: Mutex::new(Some(close)),
            pump: Mutex::new(None),
            published: published_rx,
            lease: agent.lease().clone(),
            clock,
            relaying: tokio::sync::Mutex::new(()),
        });
        let pump = Pump {
            agent,
            hub: Arc::clone(&session.hub),
            metrics: Arc::clone(&self.metrics),
            last_active: Arc::clone(&session.last_active),
            stopped: Arc::clone(&session.stopped),
            published,
        };
        let task = tokio::spawn(pump.run(close_rx));
        *session.pump.lock().unwrap_or_else(|poison| poison.into_inner()) = Some(task);
        Ok(session)
    }

    /// Takes a place among the live sessions, unloading an idle one if
    /// they are all taken.
    async fn reserve(&self) -> Result<(), ApiError> {
        for _ in 0..8 {
            let max = self.limits.max_live;
            let reserved = self
                .live_count
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |live| {
                    (live < max).then_some(live + 1)
                });
            if let Ok(before) = reserved {
                self.metrics
                    .live_sessions
                    .set(i64::try_from(before + 1).unwrap_or(i64::MAX));
                return Ok(());
            }
            if !self.evict_one().await {
                break;
            }
        }
        Err(ApiError::TooManySessions(format!(
            "{} sessions are live and none of them can be unloaded; retry later",
            self.limits.max_live
        )))
    }

    /// Unloads the longest-idle unloadable session; `false` if there is none.
    async fn evict_one(&self) -> bool {
        let slots: Vec<(String, Arc<Slot>)> = self
            .lock_slots()
            .iter()
            .map(|(id, slot)| (id.clone(), Arc::clone(slot)))
            .collect();
        let mut oldest: Option<(bool, Instant, String, Arc<Slot>)> = None;
        for (session_id, slot) in slots {
            let Ok(live) = slot.live.try_lock() else { continue };
            let Some(session) = live.as_ref() else { continue };
            let stopped = session.stopped();
            if !stopped && !session.unloadable() {
                continue;
            }
            // Stopped sessions go first, then the longest idle.
            let key = (!stopped, session.idle_since());
            if oldest.as_ref().is_none_or(|(a, b, _, _)| key < (*a, *b)) {
                drop(live);
                oldest = Some((key.0, key.1, session_id, slot));
            }
        }
        let Some((_, _, session_id, slot)) = oldest else {
            return false;
        };
        let Ok(mut live) = slot.live.try_lock() else {
            return true;
        };
        let still = live
            .as_ref()
            .is_some_and(|session| session.stopped() || session.unloadable());
        if still && let Some(session) = live.take() {
            tracing::debug!(%session_id, "unloading the longest-idle session to make room");
            self.unload(session, None).await;
        }
        drop(live);
        self.forget_slot(&session_id, slot);
        true
    }

    /// Unloads a session taken out of its slot: gives its place back and
    /// stops it, the way its status calls for unless `mode` is given.
    async fn unload(&self, session: Arc<LiveSession>, mode: Option<CloseMode>) {
        self.released();
        let mode = mode.unwrap_or_else(|| close_mode(&session.handle.status()));
        let session_id = session.handle.session_id().to_owned();
        self.close(session, mode).await;
        if self.cluster.is_some() {
            // Another node may write it from now on, or may have already
            // (a lost lease): its subscribers here look at the store.
            self.hubs.poke(&session_id, u64::MAX);
        }
    }

    /// Gives back a place among the live sessions.
    fn released(&self) {
        let before = self.live_count.fetch_sub(1, Ordering::SeqCst);
        self.metrics
            .live_sessions
            .set(i64::try_from(before.saturating_sub(1)).unwrap_or(0));
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn slot(&self, session_id: &str) -> Arc<Slot> {
        Arc::clone(self.lock_slots().entry(session_id.to_owned()).or_default())
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

/// How to stop a session with this status: a busy one (a turn waiting for
/// approval, or messages queued) is left as it is stored for the next
/// runtime; `Op::Shutdown` would wait behind its work.
fn close_mode(status: &SessionStatus) -> CloseMode {
    if status.busy {
        CloseMode::Abort
    } else {
        CloseMode::Graceful
    }
}

/// The task that owns a live session's agent and publishes its events.
struct Pump {
    agent: Agent,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    last_active: Arc<Mutex<Instant>>,
    stopped: Arc<AtomicBool>,
    published: watch::Sender<u64>,
}

impl Pump {
    async fn run(mut self, mut close: oneshot::Receiver<CloseMode>) {
        loop {
            tokio::select! {
                event = self.agent.next_event() => match event {
                    Some(event) => self.publish(&event),
                    None => break,
                },
                mode = &mut close => {
                    if matches!(mode, Ok(CloseMode::Abort)) {
                        // Dropping the agent stops its task where it is; the
                        // next runtime takes the session over from the store.
                        self.stopped.store(true, Ordering::SeqCst);
                        return;
                    }
                    self.shut_down().await;
                    break;
                }
            }
        }
        self.stopped.store(true, Ordering::SeqCst);
        let session_id = self.agent.session_id().to_owned();
        // The session task has ended (or is being dropped): report why.
        if let Err(error) = self.agent.shutdown().await {
            tracing::warn!(%session_id, %error, "session stopped");
        }
    }

    fn publish(&self, event: &keel_protocol::RecordedEvent) {
        self.metrics.events_recorded.inc();
        *self.last_active.lock().unwrap_or_else(|poison| poison.into_inner()) = Instant::now();
        self.hub.publish(event);
        self.published.send_replace(event.sequence);
    }

    /// Queues `Op::Shutdown` and publishes the events up to the last one.
    async fn shut_down(&mut self) {
        let sender = self.agent.sender().clone();
        {
            let submit = sender.submit_wait(Op::Shutdown);
            tokio::pin!(submit);
            loop {
                tokio::select! {
                    _ = &mut submit => break,
                    event = self.agent.next_event() => match event {
                        Some(event) => self.publish(&event),
                        None => break,
                    },
                }
            }
        }
        drop(sender);
        while let Some(event) = self.agent.next_event().await {
            self.publish(&event);
        }
    }
}
