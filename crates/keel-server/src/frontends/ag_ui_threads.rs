//! The AG-UI threads this node read lately, each as of a sequence, so a run
//! reads only the events stored since instead of the whole log. AG-UI
//! resends the whole history every run; reading and parsing the whole log
//! for each made a run's cost grow with the session's length.
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
#[derive(Clone, PartialEq, Eq)]
struct Incarnation {
    created_at_ms: u64,
}

struct Entry {
    incarnation: Incarnation,
    thread: Arc<Thread>,
    /// When it was last read, for eviction (a counter, not a clock).
    used: u64,
}

/// Up to `capacity` threads, the least recently read evicted first.
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
    /// stored event: the kept one brought forward, or the whole log read.
    /// Without a summary (a session not stored yet) the log is read and
    /// nothing kept.
    pub(crate) async fn read(
        &self,
        store: &dyn CheckpointStore,
        id: &str,
        summary: Option<&SessionSummary>,
    ) -> Result<Arc<Thread>, ApiError> {
        let incarnation = summary.map(|summary| Incarnation {
            created_at_ms: summary.created_at_ms,
        });
        let kept = incarnation
            .as_ref()
            .and_then(|incarnation| self.get(id, incarnation))
            // A thread past the stored log's end is of another incarnation.
            .filter(|kept| summary.is_some_and(|summary| kept.last_sequence() <= summary.last_sequence));
        let mut thread = kept.unwrap_or_default();
        let before = thread.last_sequence();
        // The kept thread is copied only when something is new.
        let events = store.events_after(id, before, PAGE).await?;
        if !events.is_empty() {
            let thread = Arc::make_mut(&mut thread);
            for event in &events {
                thread.apply(event);
            }
            if events.len() == PAGE {
                bring_forward(store, id, thread, u64::MAX).await?;
            }
        }
        if let Some(incarnation) = incarnation
            && (thread.last_sequence() != before || before == 0)
        {
            self.put(id, incarnation, Arc::clone(&thread));
        }
        Ok(thread)
    }

    /// Forgets session `id` (deleted).
    pub(crate) fn forget(&self, id: &str) {
        self.lock().by_session.remove(id);
    }

    fn get(&self, id: &str, incarnation: &Incarnation) -> Option<Arc<Thread>> {
        let mut entries = self.lock();
        entries.clock += 1;
        let now = entries.clock;
        let entry = entries.by_session.get_mut(id)?;
        if entry.incarnation != *incarnation {
            return None;
        }
        entry.used = now;
        Some(Arc::clone(&entry.thread))
    }

    fn put(&self, id: &str, incarnation: Incarnation, thread: Arc<Thread>) {
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
