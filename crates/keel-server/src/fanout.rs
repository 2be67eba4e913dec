//! Fan-out of a session's events to any number of subscribers.
//!
//! Each session id has a [`Hub`] while it is live or watched. The live
//! session's pump publishes every event it reads from the agent into the
//! hub's `broadcast` channel, which never waits: the agent is never slowed
//! by a subscriber. A [`Subscription`] remembers the last sequence it
//! handed out. It starts by reading the store after its resume point, then
//! follows the channel; when it lags behind the channel, or sees a gap, it
//! reads the missing range from the store and goes on. Every event is
//! committed before it is published, so the store always has what the
//! channel dropped: a subscriber never misses an event, never sees one
//! twice, and is never disconnected for being slow. A caller about to
//! submit and follow what it submitted can start from the hub's newest
//! published event instead ([`Subscription::from_now`]), without a store
//! read.
//!
//! The channel keeps room for its events from the moment it is made, so
//! it is made only once there is an event for a subscriber: a session that
//! is watched but idle (a page left open) costs its subscribers no ring. A
//! subscription made before the channel follows the store and the hub's
//! pokes; the first publish to a watched hub makes the channel and pokes,
//! and each subscription then joins the channel and reads what it missed
//! from the store, as after a lag.
//!
//! A session that runs on another node (several nodes on one database) has
//! no local publisher: the node's log notices [`Hubs::poke`] its hub,
//! publishing the events a notice carries, or, when it carries none, with
//! the newest stored sequence, and each subscription behind it reads the
//! rest from the store.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::sync::{broadcast, watch};

use super::error::ApiError;
use super::metrics::Metrics;
use keel_protocol::RecordedEvent;
use keel_store::{CarriedEvents, CheckpointStore};

/// Events read from the store per catch-up request.
const CATCH_UP_PAGE: usize = 256;

/// An event serialized once for every subscriber.
#[derive(Debug)]
pub(crate) struct LiveEvent {
    pub(crate) sequence: u64,
    /// The `type` of the event's `msg`.
    pub(crate) kind: &'static str,
    /// The recorded event's JSON.
    pub(crate) json: String,
}

impl LiveEvent {
    pub(crate) fn new(event: &RecordedEvent) -> Self {
        Self {
            sequence: event.sequence,
            kind: event.msg.kind(),
            json: serde_json::to_string(event).unwrap_or_default(),
        }
    }
}

/// The live events of one session.
#[derive(Debug)]
pub(crate) struct Hub {
    session_id: String,
    /// Made by the first publish while someone subscribes (or by
    /// [`Subscription::from_now`]): a channel keeps room for `capacity`
    /// events from the start, which an unwatched or idle session (most of
    /// those loaded) never needs.
    sender: OnceLock<broadcast::Sender<Arc<LiveEvent>>>,
    capacity: usize,
    subscribers: AtomicUsize,
    /// The newest sequence known stored by another node's commit.
    stored: watch::Sender<u64>,
    /// The newest sequence published here (0 for none).
    published: AtomicU64,
}

impl Hub {
    /// Hands `event` to the current subscribers. Never waits.
    pub(crate) fn publish(&self, event: &RecordedEvent) {
        // Said before the send: a subscription made from now on starts
        // after this event, one made before it gets it from the channel.
        self.published.fetch_max(event.sequence, Ordering::SeqCst);
        // Nobody listening: the event is in the store, and is not even
        // encoded (a subscription made meanwhile sees a gap and reads the
        // store).
        if let Some(sender) = self.sender.get().filter(|sender| sender.receiver_count() > 0) {
            let _ = sender.send(Arc::new(LiveEvent::new(event)));
        } else if self.sender.get().is_none() && self.subscribers.load(Ordering::SeqCst) > 0 {
            // Subscriptions wait without a channel: make it (which wakes
            // them to join it), and have them read this event from the
            // store.
            self.sender();
            self.stored
                .send_modify(|stored| *stored = (*stored).max(event.sequence));
        }
    }

    /// The channel, made on first use.
    ///
    /// Subscriptions made before it wait on the hub's pokes, not on a
    /// channel: making it wakes them to join it (whoever makes it, a
    /// publish or [`Subscription::from_now`]).
    fn sender(&self) -> &broadcast::Sender<Arc<LiveEvent>> {
        let mut made = false;
        let sender = self.sender.get_or_init(|| {
            made = true;
            broadcast::channel(self.capacity).0
        });
        if made {
            self.stored.send_modify(|_| {});
        }
        sender
    }

    /// How many subscriptions are open.
    pub(crate) fn subscribers(&self) -> usize {
        self.subscribers.load(Ordering::Relaxed)
    }
}

/// The hubs of the sessions that are live or watched, by session id.
pub(crate) struct Hubs {
    hubs: Mutex<HashMap<String, Weak<Hub>>>,
    capacity: usize,
}

impl Hubs {
    /// Hubs whose channels keep up to `capacity` events for slow receivers.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            hubs: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The hub of `session_id`, created if nobody holds it.
    pub(crate) fn get(&self, session_id: &str) -> Arc<Hub> {
        let mut hubs = self.hubs.lock().unwrap_or_else(|poison| poison.into_inner());
        if let Some(hub) = hubs.get(session_id).and_then(Weak::upgrade) {
            return hub;
        }
        // Forget the hubs nobody holds any more while we are here.
        hubs.retain(|_, hub| hub.strong_count() > 0);
        let hub = Arc::new(Hub {
            session_id: session_id.to_owned(),
            sender: OnceLock::new(),
            capacity: self.capacity,
            subscribers: AtomicUsize::new(0),
            stored: watch::Sender::new(0),
            published: AtomicU64::new(0),
        });
        hubs.insert(session_id.to_owned(), Arc::downgrade(&hub));
        hub
    }
}

impl Hubs {
    /// Tells the subscribers of `session_id`, if any, that its log holds
    /// events up to `last_sequence` (committed by another node). The
    /// events the notice `carried` are published as the pump publishes a
    /// local session's, so its subscribers need no read (one that missed
    /// some sees the gap and reads the store); without them, those behind
    /// read them from the store.
    pub(crate) fn poke(&self, session_id: &str, last_sequence: u64, carried: Option<&CarriedEvents>) {
        let hub = {
            let hubs = self.hubs.lock().unwrap_or_else(|poison| poison.into_inner());
            hubs.get(session_id).and_then(Weak::upgrade)
        };
        let Some(hub) = hub else { return };
        // Decoded only for someone: every node hears every commit.
        if let Some(carried) = carried
            && hub.subscribers() > 0
        {
            match carried.events(session_id, last_sequence) {
                Ok(events) => {
                    for event in &events {
                        hub.publish(event);
                    }
                    return;
                }
                Err(error) => tracing::warn!(%session_id, %error, "cannot read the events a notice carried"),
            }
        }
        hub.stored.send_replace(last_sequence);
    }

    /// [`Self::poke`] for every watched session, without a sequence: after
    /// notices were missed, every subscriber looks at the store again.
    pub(crate) fn poke_all(&self) {
        let hubs: Vec<Arc<Hub>> = {
            let hubs = self.hubs.lock().unwrap_or_else(|poison| poison.into_inner());
            hubs.values().filter_map(Weak::upgrade).collect()
        };
        for hub in hubs {
            hub.stored.send_replace(u64::MAX);
        }
    }
}

/// One subscriber's view of a session's events, from a resume point on.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    /// `None` until the hub has a channel (see the module's text).
    receiver: Option<broadcast::Receiver<Arc<LiveEvent>>>,
    /// Pokes from other nodes' commits.
    stored: watch::Receiver<u64>,
    store: Arc<dyn CheckpointStore>,
    metrics: Arc<Metrics>,
    /// The last sequence handed out.
    last_sent: u64,
    /// Events read from the store, not yet handed out.
    backlog: VecDeque<Arc<LiveEvent>>,
    /// The store may hold events after `last_sent` that the channel will
    /// not deliver.
    behind: bool,
    /// Set when the server shuts down.
    closing: watch::Receiver<bool>,
}

impl Subscription {
    /// A subscription to `hub` handing out the events after `after`.
    pub(crate) fn new(
        hub: Arc<Hub>,
        after: u64,
        store: Arc<dyn CheckpointStore>,
        metrics: Arc<Metrics>,
        closing: watch::Receiver<bool>,
    ) -> Self {
        // Counted before the channel is looked at, and subscribed (when
        // there is a channel) before the first store read: whatever is
        // published from now on is in the channel or makes it and pokes,
        // and whatever was published before is in the store.
        hub.subscribers.fetch_add(1, Ordering::SeqCst);
        let mut stored = hub.stored.subscribe();
        stored.mark_unchanged();
        let receiver = hub.sender.get().map(broadcast::Sender::subscribe);
        Self {
            hub,
            receiver,
            stored,
            store,
            metrics,
            last_sent: after,
            backlog: VecDeque::new(),
            behind: true,
            closing,
        }
    }

    /// A subscription to `hub` handing out the events published from now
    /// on, without reading the store, for a caller about to submit
    /// something and follow it. `None` when the hub has published nothing
    /// yet or another node stored more than it published (then only the
    /// store knows where "now" is). Events the pump did not publish (stored
    /// for an unloaded session) show as a gap before the next published
    /// one, which the store fills as for any subscriber.
    pub(crate) fn from_now(
        hub: Arc<Hub>,
        store: Arc<dyn CheckpointStore>,
        metrics: Arc<Metrics>,
        closing: watch::Receiver<bool>,
    ) -> Option<Self> {
        // The caller is about to make events: the channel is wanted.
        hub.sender();
        let mut subscription = Self::new(hub, 0, store, metrics, closing);
        // Read after subscribing: whatever is published after this load
        // is in the channel.
        let published = subscription.hub.published.load(Ordering::SeqCst);
        let stored = *subscription.stored.borrow();
        if published == 0 || stored > published {
            return None;
        }
        subscription.last_sent = published;
        subscription.behind = false;
        Some(subscription)
    }

    /// Whether the event at `sequence` is still to be handed out.
    pub(crate) fn sees(&self, sequence: u64) -> bool {
        sequence > self.last_sent
    }

    /// The next event, in sequence order; `None` once the server is
    /// shutting down. Cancel-safe: dropping the future loses nothing.
    pub(crate) async fn next(&mut self) -> Result<Option<Arc<LiveEvent>>, ApiError> {
        loop {
            if *self.closing.borrow() {
                return Ok(None);
            }
            if let Some(event) = self.backlog.pop_front() {
                self.last_sent = event.sequence;
                return Ok(Some(event));
            }
            if self.receiver.is_none()
                && let Some(sender) = self.hub.sender.get()
            {
                // Joined before the store read: nothing falls between.
                self.receiver = Some(sender.subscribe());
                self.behind = true;
                continue;
            }
            if self.behind {
                self.catch_up().await?;
                continue;
            }
            let received = tokio::select! {
                Some(received) = recv(self.receiver.as_mut()) => received,
                changed = self.closing.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => return Ok(None),
                },
                Ok(()) = self.stored.changed() => {
                    if *self.stored.borrow_and_update() > self.last_sent {
                        self.behind = true;
                    }
                    continue;
                }
            };
            match received {
                Ok(event) if event.sequence <= self.last_sent => {}
                Ok(event) if event.sequence == self.last_sent + 1 => {
                    self.last_sent = event.sequence;
                    return Ok(Some(event));
                }
                // A gap (the session was reloaded while we were not
                // listening) or a lag: the store has the rest.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    self.behind = true;
                    self.metrics.catch_ups.inc();
                }
                // The hub keeps its sender while we hold it.
                Err(broadcast::error::RecvError::Closed) => return Ok(None),
            }
        }
    }

    /// Reads the next page after `last_sent` from the store.
    async fn catch_up(&mut self) -> Result<(), ApiError> {
        let events = self
            .store
            .events_after(&self.hub.session_id, self.last_sent, CATCH_UP_PAGE)
            .await?;
        if events.len() < CATCH_UP_PAGE {
            // Caught up with the store: what comes next comes through the
            // channel (possibly again; duplicates are skipped).
            self.behind = false;
        }
        for (expected, event) in (self.last_sent + 1..).zip(&events) {
            if event.sequence != expected {
                return Err(ApiError::Internal(format!(
                    "the log of session '{}' has a gap before sequence {}",
                    self.hub.session_id, event.sequence
                )));
            }
        }
        self.backlog
            .extend(events.iter().map(|event| Arc::new(LiveEvent::new(event))));
        Ok(())
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.subscribers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The next item of `receiver`; `None` at once without one (the caller's
/// `select!` then waits on its other branches).
async fn recv(
    receiver: Option<&mut broadcast::Receiver<Arc<LiveEvent>>>,
) -> Option<Result<Arc<LiveEvent>, broadcast::error::RecvError>> {
    Some(receiver?.recv().await)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use keel_protocol::{AssistantContentDeltaEvent, Event, EventMsg, ModelChangedEvent};
    use keel_store::{Checkpoint, EncodedEvent, SqliteCheckpoint, SqliteOptions};

    fn event(sequence: u64) -> RecordedEvent {
        RecordedEvent {
            sequence,
            recorded_at_ms: 0,
            event: Event {
                submission_id: None,
                msg: EventMsg::ModelChanged(ModelChangedEvent {
                    previous: None,
                    model: "script:a".to_owned(),
                }),
            },
        }
    }

    #[tokio::test]
    async fn a_watched_idle_hub_has_no_ring_until_an_event_comes_and_then_pokes_its_subscriber() {
        let path = std::env::temp_dir().join(format!("keel-fanout-{}.sqlite3", std::process::id()));
        let store: Arc<dyn CheckpointStore> =
            Arc::new(SqliteCheckpoint::open(&path, SqliteOptions::default()).await.unwrap());
        let hubs = Hubs::new(64);
        let hub = hubs.get("s");
        let (_closing, closing) = watch::channel(false);
        let subscription = Subscription::new(Arc::clone(&hub), 0, store, Arc::new(Metrics::new()), closing);
        assert!(hub.sender.get().is_none(), "an idle watched hub made its ring");
        assert!(subscription.receiver.is_none());

        let mut pokes = hub.stored.subscribe();
        hub.publish(&event(1));
        assert!(
            hub.sender.get().is_some(),
            "the first event to a watched hub makes its ring"
        );
        assert!(pokes.has_changed().unwrap());
        assert_eq!(*pokes.borrow_and_update(), 1, "the subscriber is told to read event 1");

        // A hub nobody watches makes none.
        let unwatched = hubs.get("t");
        unwatched.publish(&event(1));
        assert!(unwatched.sender.get().is_none());
        drop(subscription);
        let _ = std::fs::remove_file(&path);
    }

    fn delta(n: u64) -> Event {
        Event {
            submission_id: None,
            msg: EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                turn_id: "t".to_owned(),
                delta: format!("delta {n}"),
            }),
        }
    }

    /// A SQLite store in `dir` whose session `s` holds `events`.
    async fn store_holding(dir: &tempfile::TempDir, events: &[Event]) -> Arc<dyn CheckpointStore> {
        let store = SqliteCheckpoint::open(dir.path().join("s.sqlite3"), SqliteOptions::default())
            .await
            .expect("a store");
        let stored = events
            .iter()
            .map(|event| EncodedEvent::encode(event).expect("encode"))
            .collect();
        store
            .create(&Checkpoint::empty("s"), &[], stored)
            .await
            .expect("a session");
        Arc::new(store)
    }

    /// A subscription waiting on a hub without a channel joins the channel
    /// whoever makes it: here a caller following what it submits
    /// ([`Subscription::from_now`]), after which events go only to the
    /// channel.
    #[tokio::test]
    async fn a_subscription_waiting_without_a_channel_joins_it_whoever_makes_it() {
        let dir = tempfile::tempdir().expect("a directory");
        let store = store_holding(&dir, &[delta(1)]).await;
        let metrics = Arc::new(Metrics::new());
        let hubs = Hubs::new(16);
        let hub = hubs.get("s");
        let (_closing, closed) = watch::channel(false);
        let mut waiting = Subscription::new(
            Arc::clone(&hub),
            0,
            Arc::clone(&store),
            Arc::clone(&metrics),
            closed.clone(),
        );
        let first = tokio::time::timeout(Duration::from_secs(10), waiting.next())
            .await
            .expect("in time")
            .expect("no error")
            .expect("an event");
        assert_eq!(first.sequence, 1, "read from the store");
        assert!(hub.sender.get().is_none(), "no channel yet");
        let next = tokio::spawn(async move { waiting.next().await.map(|event| event.map(|event| event.sequence)) });
        tokio::task::yield_now().await;
        // Nothing published yet here: from_now makes the channel, follows
        // nothing, and goes.
        assert!(Subscription::from_now(Arc::clone(&hub), store, metrics, closed).is_none());
        assert!(hub.sender.get().is_some());
        // Woken, the waiting subscription joins the channel.
        tokio::time::timeout(Duration::from_secs(10), async {
            while hub.sender.get().is_none_or(|sender| sender.receiver_count() == 0) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the waiting subscription joined the channel");
        // An event the store here does not hold: only the channel has it.
        hub.publish(&RecordedEvent {
            sequence: 2,
            recorded_at_ms: 0,
            event: delta(2),
        });
        let got = tokio::time::timeout(Duration::from_secs(10), next)
            .await
            .expect("the channel's event in time")
            .expect("the task");
        assert_eq!(got.expect("no error"), Some(2));
    }

    /// Events another node committed reach this node's subscribers from
    /// the notice that carried them, without a store read: once the
    /// subscriber follows the hub's channel (the first event to an idle
    /// watched hub makes it, and the subscriber reads that one from the
    /// store), an event the store here does not even hold still arrives.
    #[tokio::test]
    async fn the_events_a_notice_carries_reach_the_subscribers_without_a_read() {
        let dir = tempfile::tempdir().expect("a directory");
        let store = store_holding(&dir, &[delta(1), delta(2)]).await;
        let hubs = Hubs::new(16);
        let (_closing, closed) = watch::channel(false);
        let mut subscription = Subscription::new(hubs.get("s"), 0, store, Arc::new(Metrics::new()), closed);
        let first = CarriedEvents::encode(7, &[delta(1), delta(2)]).expect("encode");
        let second = CarriedEvents::encode(8, &[delta(3)]).expect("encode");
        hubs.poke("s", 2, Some(&first));
        let mut seen = Vec::new();
        let mut next = async || {
            let event = tokio::time::timeout(Duration::from_secs(10), subscription.next())
                .await
                .expect("an event in time, not a read of a log that lacks it")
                .expect("no error")
                .expect("an event");
            (
                event.sequence,
                event.json.contains(&format!("delta {}", event.sequence)),
            )
        };
        for _ in 0..2 {
            seen.push(next().await);
        }
        // Event 3 is in no store this node could read.
        hubs.poke("s", 3, Some(&second));
        seen.push(next().await);
        assert_eq!(seen, [(1, true), (2, true), (3, true)]);
        // Nobody subscribed: nothing is decoded, the hub is only poked.
        hubs.poke("other", 9, Some(&second));
    }
}
