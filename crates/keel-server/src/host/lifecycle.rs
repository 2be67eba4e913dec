//! Loading and unloading sessions: assembling a session and its pump, the
//! bound on live sessions (evicting the longest idle), unloading idle
//! ones, and stopping a session's pump.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::live::{LiveSession, Slot};
use super::pump::{CloseMode, Pump, close_mode};
use super::{CLOSE_TIMEOUT, Host};
use crate::error::ApiError;
use crate::settings::SessionSettings;
use keel_agent::{LeaseClock, LeaseOwner, SessionContext, create_agent};
use keel_store::Lease;

impl Host {
    /// Unloads idle sessions until the server shuts down.
    pub(crate) async fn reap(&self) {
        let tick = (self.limits.idle_unload / 2).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let mut closing = self.closing.subscribe();
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
            for (session_id, slot) in self.slots_by_id() {
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

    /// several nodes, then gives up its lease so another node may take it.
    pub(super) async fn close(&self, session: Arc<LiveSession>, mode: CloseMode) {
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
    pub(super) async fn start(
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
        let tenant = context.tenant.clone();
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
            tenant,
            hub: self.hubs.get(session_id),
            users: AtomicUsize::new(0),
            last_active: Arc::new(Mutex::new(Instant::now())),
            stopped: Arc::new(AtomicBool::new(false)),
            close: Mutex::new(Some(close)),
            pump: Mutex::new(None),
            published: published_rx,
            lease: agent.lease().clone(),
            clock,
            relaying: tokio::sync::Mutex::default(),
        });
        let pump = Pump {
            agent,
            hub: Arc::clone(&session.hub),
            metrics: Arc::clone(&self.metrics),
            last_active: Arc::clone(&session.last_active),
            stopped: Arc::clone(&session.stopped),
            published,
            webhooks: Arc::clone(&self.webhook_wake),
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
        let mut oldest: Option<(bool, Instant, String, Arc<Slot>)> = None;
        for (session_id, slot) in self.slots_by_id() {
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
    pub(super) async fn unload(&self, session: Arc<LiveSession>, mode: Option<CloseMode>) {
        self.released();
        let status = session.handle.status();
        let mode = mode.unwrap_or_else(|| close_mode(&status));
        let session_id = session.handle.session_id().to_owned();
        self.close(session, mode).await;
        if !status.awaiting_client.is_empty() {
            // Its calls time out while it is not loaded: the host wakes it.
            self.arm_client_deadline_of(&session_id).await;
        }
        if self.cluster.is_some() {
            // Another node may write it from now on, or may have already
            // (a lost lease): its subscribers here look at the store.
            self.hubs.poke(&session_id, u64::MAX, None);
        }
    }

    /// Gives back a place among the live sessions.
    pub(super) fn released(&self) {
        let before = self.live_count.fetch_sub(1, Ordering::SeqCst);
        self.metrics
            .live_sessions
            .set(i64::try_from(before.saturating_sub(1)).unwrap_or(0));
    }
}
