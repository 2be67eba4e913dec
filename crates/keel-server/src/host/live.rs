//! A loaded session as the host keeps it: its slot, its state, and the
//! guard a request holds on it while using it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::CLOSE_TIMEOUT;
use super::pump::CloseMode;
use crate::fanout::Hub;
use crate::settings::SessionSettings;
use keel_agent::{LeaseClock, SessionHandle, SessionStatus};
use keel_store::Lease;

/// Where one session id's live session is kept.
#[derive(Default)]
pub(super) struct Slot {
    pub(super) live: tokio::sync::Mutex<Option<Arc<LiveSession>>>,
}

/// A slot, locked: its live session, if any, is this holder's to use,
/// replace or take out.
pub(super) type SlotGuard<'a> = tokio::sync::MutexGuard<'a, Option<Arc<LiveSession>>>;

/// A loaded session: its agent is owned by its pump task.
pub(crate) struct LiveSession {
    pub(crate) handle: SessionHandle,
    pub(crate) settings: SessionSettings,
    /// The tenant it belongs to.
    pub(crate) tenant: String,
    pub(super) hub: Arc<Hub>,
    /// Requests using the session right now.
    pub(super) users: AtomicUsize,
    /// The last event or the end of the last request.
    pub(super) last_active: Arc<Mutex<Instant>>,
    /// Set when the session's task has stopped (a `shutdown` op, a store failure).
    pub(super) stopped: Arc<AtomicBool>,
    pub(super) close: Mutex<Option<oneshot::Sender<CloseMode>>>,
    pub(super) pump: Mutex<Option<JoinHandle<()>>>,
    /// The sequence of the last event published.
    pub(super) published: watch::Receiver<u64>,
    /// The lease the session writes under, claimed once when it was loaded.
    pub(super) lease: Lease,
    /// With several nodes, when the lease was last known to be extended.
    pub(super) clock: Option<LeaseClock>,
    /// Serializes taking up relayed submissions (several nodes only), and
    /// holds how far that got since the session was loaded here (see
    /// `Host::queue_relayed`).
    pub(super) relaying: tokio::sync::Mutex<Progress>,
}

impl LiveSession {
    /// Waits (a little) until the session's startup events are committed
    /// and published, so what is shown of a new session includes them.
    pub(crate) async fn started(&self) {
        let mut published = self.published.clone();
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, published.wait_for(|sequence| *sequence > 0)).await;
    }

    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Waits (a little) until the pump has ended.
    pub(super) async fn wait_stopped(&self) {
        let mut published = self.published.clone();
        // The pump drops its sender when it ends.
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, async { while published.changed().await.is_ok() {} }).await;
    }

    pub(super) fn idle_since(&self) -> Instant {
        *self.last_active.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Whether the session can be unloaded without losing or delaying work.
    pub(super) fn unloadable(&self) -> bool {
        let status = self.handle.status();
        self.users.load(Ordering::SeqCst) == 0 && self.hub.subscribers() == 0 && at_rest(&status)
    }

    pub(super) fn in_use(self: &Arc<Self>) -> SessionInUse {
        self.users.fetch_add(1, Ordering::SeqCst);
        SessionInUse { live: Arc::clone(self) }
    }
}

/// Whether a session's status lets it stop without cutting a turn short:
/// idle, or waiting for approval or a client's result with nothing queued
/// (those waits are durable).
pub(super) fn at_rest(status: &SessionStatus) -> bool {
    let waiting = !status.awaiting_approval.is_empty() || !status.awaiting_client.is_empty();
    !status.busy || (waiting && status.queued == 0)
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

/// How far taking up a live session's relayed submissions got since the
/// session was loaded here.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// A whole pass over the rows has run (and its answers are recorded).
    pub(super) passed: bool,
    /// The highest relay id stored when that pass ended.
    pub(super) newest: u64,
}

impl Progress {
    /// Whether the row `relay_id` a notice carried may be queued without
    /// reading the store: it is newer than every row this runtime's first
    /// whole pass could see, so no earlier runtime can have queued it (this
    /// node remembers what it took up itself, `RecentlyTaken`).
    pub(super) fn takes_from_notice(&self, relay_id: u64) -> bool {
        self.passed && relay_id > self.newest
    }
}
