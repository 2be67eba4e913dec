//! The AG-UI threads this node read lately, each as of a sequence, so a run
//! reads only the events stored since instead of the whole log. AG-UI
//! resends the whole history every run; reading and parsing the whole log
//! for each made a run's cost grow with the session's length.
//!
//! A run takes its thread out of the cache ([`Checkout`]) and gives it back
//! when its stream ends, brought forward by every event the run streamed:
//! the next run of the thread finds it up to date and neither copies it nor
//! reads the store. Two runs of one thread at once are rare; the second
//! finds nothing kept and reads the log.
//!
//! A thread is kept under its session's id and creation time, and is only
//! ever brought forward from the store (the log is append-only and
//! gap-free), so what a run reads is what reading the whole log would give:
//! a session deleted and created again under the same id is another entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use keel_projections::ag_ui::Thread;
use keel_store::{CheckpointStore, SessionSummary};

use crate::error::ApiError;

/// Events read per page while a thread catches up.
const PAGE: usize = 1000;

/// Which incarnation of a session a thread is of.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Incarnation {
    created_at_ms: u64,
}

struct Entry {
    incarnation: Incarnation,
    thread: Thread,
    /// When it was last given back, for eviction (a counter, not a clock).
    used: u64,
}

/// Up to `capacity` threads, the least recently used evicted first.
pub(crate) struct ThreadCache {
    entries: Mutex<Entries>,
    capacity: usize,
}

#[derive(Default)]
struct Entries {
    by_session: HashMap<String, Entry>,
    clock: u64,
}

impl ThreadCache {
    /// A cache of at most `capacity` threads (`0` keeps none).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(Entries::default()),
            capacity,
        }
    }

    /// The thread of session `id` (stored as `summary`) up to the newest
    /// event the summary counts, taken out of the cache until the checkout
    /// is dropped: the kept one, brought forward from the store when it is
    /// behind, or the whole log read. Without a summary (a session not
    /// stored yet) the log is read and nothing is kept.
    pub(crate) async fn checkout(
        self: &Arc<Self>,
        store: &dyn CheckpointStore,
        id: &str,
        summary: Option<&SessionSummary>,
    ) -> Result<Checkout, ApiError> {
        let incarnation = summary.map(|summary| Incarnation {
            created_at_ms: summary.created_at_ms,
        });
        let newest = summary.map(|summary| summary.last_sequence);
        let mut thread = incarnation
            .and_then(|incarnation| self.take(id, incarnation))
            // A thread past the stored log's end is of another incarnation.
            .filter(|kept| newest.is_some_and(|newest| kept.last_sequence() <= newest))
            .unwrap_or_default();
        // The summary and the log are written in one transaction: a thread
        // at the summary's last sequence has every event it counts.
        if newest != Some(thread.last_sequence()) {
            bring_forward(store, id, &mut thread, u64::MAX).await?;
        }
        Ok(Checkout {
            cache: Arc::clone(self),
            id: id.to_owned(),
            incarnation,
            thread,
        })
    }

    /// A checkout of a session that does not exist yet: an empty thread,
    /// kept by no one.
    pub(crate) fn detached(self: &Arc<Self>, id: &str) -> Checkout {
        Checkout {
            cache: Arc::clone(self),
            id: id.to_owned(),
            incarnation: None,
            thread: Thread::new(),
        }
    }

    /// Forgets session `id` (deleted).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().by_session.remove(id);
    }

    fn take(&self, id: &str, incarnation: Incarnation) -> Option<Thread> {
        let mut entries = self.lock();
        let entry = entries.by_session.remove(id)?;
        (entry.incarnation == incarnation).then_some(entry.thread)
    }

    fn put(&self, id: &str, incarnation: Incarnation, thread: Thread) {
        if self.capacity == 0 {
            return;
        }
        let mut entries = self.lock();
        entries.clock += 1;
        let used = entries.clock;
        if let Some(entry) = entries.by_session.get(id)
            && entry.incarnation == incarnation
            && entry.thread.last_sequence() > thread.last_sequence()
        {
            // A concurrent run brought it further already.
            return;
        }
        if !entries.by_session.contains_key(id) && entries.by_session.len() >= self.capacity {
            let oldest = entries
                .by_session
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(session, _)| session.clone());
            if let Some(oldest) = oldest {
                entries.by_session.remove(&oldest);
            }
        }
        entries.by_session.insert(
            id.to_owned(),
            Entry {
                incarnation,
                thread,
                used,
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A thread taken out of the [`ThreadCache`] by one request, given back
/// (as far as the request brought it) when dropped.
pub(crate) struct Checkout {
    cache: Arc<ThreadCache>,
    id: String,
    incarnation: Option<Incarnation>,
    thread: Thread,
}

impl Checkout {
    /// The thread as read.
    pub(crate) fn thread(&self) -> &Thread {
        &self.thread
    }

    /// Takes the thread out, for a run's projection to bring forward; the
    /// checkout is empty until [`Checkout::give_back`].
    pub(crate) fn take(&mut self) -> Thread {
        std::mem::take(&mut self.thread)
    }

    /// Gives back a thread of the session, kept when it is at least as far
    /// as the one held (a run started before the thread's end may finish
    /// before it too).
    pub(crate) fn give_back(&mut self, thread: Thread) {
        if thread.last_sequence() >= self.thread.last_sequence() {
            self.thread = thread;
        }
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(incarnation) = self.incarnation {
            self.cache.put(&self.id, incarnation, std::mem::take(&mut self.thread));
        }
    }
}

/// Applies to `thread` the stored events of session `id` after its last
/// one, up to sequence `until`.
pub(crate) async fn bring_forward(
    store: &dyn CheckpointStore,
    id: &str,
    thread: &mut Thread,
    until: u64,
) -> Result<(), ApiError> {
    while thread.last_sequence() < until {
        let events = store.events_after(id, thread.last_sequence(), PAGE).await?;
        let full = events.len() == PAGE;
        for event in events.iter().take_while(|event| event.sequence <= until) {
            thread.apply(event);
        }
        if !full {
            break;
        }
    }
    Ok(())
}
