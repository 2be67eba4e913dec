//! Turn slots on SQLite (see [`crate::AccessStore::reserve_turn`]), held
//! in memory and shared by every handle on the database in this process.
//!
//! One process serves a SQLite database (`keel serve` holds its lock), so a
//! process-wide lock makes admissions exact without a write transaction:
//! taking a slot in the database would wait for the writer's commit in
//! flight (its `fsync`) at every admission of an idle session. A slot is
//! counted with the sessions that have a turn in flight (read from the
//! database, committed), so one holds a slot from its admission until the
//! writer finds it at rest (no turn, nothing queued) after a commit. A
//! crash forgets the slots; the sessions it left are counted by their
//! turns in flight as they are recovered.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};

use rusqlite::{Connection, OptionalExtension, params};

use crate::job::{Mode, Sealed, Written};
use crate::{StoreError, TURN_SLOT_GRACE_MS, TurnSlot};

/// The slots of each database this process has open, by its path made real.
static OPEN: LazyLock<Mutex<HashMap<PathBuf, Weak<TurnSlots>>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// The turn slots of one database.
#[derive(Debug, Default)]
pub(super) struct TurnSlots {
    held: Mutex<HashMap<String, Slot>>,
}

/// A slot a session took.
#[derive(Debug)]
struct Slot {
    tenant: String,
    /// When it was taken or last found held by an admission: a commit that
    /// began before this does not give it back.
    taken_at_ms: u64,
}

impl TurnSlots {
    /// The slots of the database at `path`, shared with every other handle
    /// on it in this process.
    pub(super) fn of(path: &Path) -> Arc<Self> {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let mut open = OPEN.lock().unwrap_or_else(|poison| poison.into_inner());
        open.retain(|_, slots| slots.strong_count() > 0);
        if let Some(slots) = open.get(&key).and_then(Weak::upgrade) {
            return slots;
        }
        let slots = Arc::new(Self::default());
        open.insert(key, Arc::downgrade(&slots));
        slots
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        self.held.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// Whether no session holds a slot: the writer then has nothing to
    /// give back (and costs nothing).
    pub(super) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Takes a slot of `tenant` for `session_id` unless `cap` are held
    /// (`conn` reads what is committed).
    pub(super) fn reserve(
        &self,
        conn: &Connection,
        tenant: &str,
        session_id: &str,
        cap: u64,
        now: u64,
    ) -> Result<TurnSlot, StoreError> {
        let sql = super::sqlite_error;
        let mut held = self.lock();
        let running: Option<bool> = conn
            .prepare_cached("SELECT execution IS NOT NULL FROM sessions WHERE id = ?1")
            .and_then(|mut select| select.query_row(params![session_id], |row| row.get(0)).optional())
            .map_err(sql)?;
        let Some(running) = running else {
            return Err(StoreError::UnknownSession(session_id.to_owned()));
        };
        if let Some(slot) = held.get_mut(session_id) {
            slot.taken_at_ms = slot.taken_at_ms.max(now);
            return Ok(TurnSlot::Held);
        }
        if running {
            return Ok(TurnSlot::Held);
        }
        // Slots whose work never reached the queue stop counting.
        let stale: Vec<String> = held
            .iter()
            .filter(|(_, slot)| slot.tenant == tenant && slot.taken_at_ms < now.saturating_sub(TURN_SLOT_GRACE_MS))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if at_rest(conn, &id).map_err(sql)? {
                held.remove(&id);
            }
        }
        let count = holders(conn, &held, tenant).map_err(sql)?;
        if count >= cap {
            return Ok(TurnSlot::Full { held: count });
        }
        held.insert(
            session_id.to_owned(),
            Slot {
                tenant: tenant.to_owned(),
                taken_at_ms: now,
            },
        );
        Ok(TurnSlot::Taken)
    }

    /// How many sessions of `tenant` hold a slot: a turn in flight, or one
    /// taken.
    pub(super) fn held(&self, conn: &Connection, tenant: &str) -> Result<u64, StoreError> {
        let held = self.lock();
        holders(conn, &held, tenant).map_err(super::sqlite_error)
    }

    /// Gives back the slots of `sessions` that are at rest after a commit
    /// that began at `committed_from_ms` (`conn` reads it), unless an
    /// admission found them held since.
    pub(super) fn release_at_rest<'a>(
        &self,
        conn: &Connection,
        sessions: impl IntoIterator<Item = &'a str>,
        committed_from_ms: u64,
    ) -> rusqlite::Result<()> {
        let mut held = self.lock();
        for session_id in sessions {
            let stale = held
                .get(session_id)
                .is_some_and(|slot| slot.taken_at_ms <= committed_from_ms);
            if stale && at_rest(conn, session_id)? {
                held.remove(session_id);
            }
        }
        Ok(())
    }

    /// Gives back, after a group committed at `now`, the slots of the
    /// sessions its writes may have left at rest (a turn's end, a refused
    /// keyed submission, a checkpoint with no turn) and of those it deleted.
    pub(super) fn give_back(
        &self,
        conn: &Connection,
        writes: &[Sealed<'_>],
        outcomes: &[Result<Written, StoreError>],
        now: u64,
    ) {
        let written = || writes.iter().zip(outcomes).filter(|(_, outcome)| outcome.is_ok());
        for (write, _) in written().filter(|(write, _)| write.mode == Mode::Delete) {
            self.forget(write.session_id);
        }
        let resting = written()
            .filter(|(write, _)| {
                let no_turn = write.checkpoint.as_ref().map(|write| write.execution.is_none());
                crate::EncodedEvent::may_free_turn_slot(&write.events, no_turn)
            })
            .map(|(write, _)| write.session_id);
        if let Err(error) = self.release_at_rest(conn, resting, now) {
            // Kept until a later write of the session, or the grace, frees it.
            tracing::warn!(%error, "cannot give turn slots back");
        }
    }

    /// Forgets the slot of a deleted session.
    pub(super) fn forget(&self, session_id: &str) {
        self.lock().remove(session_id);
    }
}

/// Whether `session_id` has no turn in flight and nothing queued (a
/// session deleted is at rest).
fn at_rest(conn: &Connection, session_id: &str) -> rusqlite::Result<bool> {
    let busy: Option<bool> = conn
        .prepare_cached(
            "SELECT s.execution IS NOT NULL OR EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = s.key)
             FROM sessions s WHERE s.id = ?1",
        )?
        .query_row(params![session_id], |row| row.get(0))
        .optional()?;
    Ok(!busy.unwrap_or(false))
}

/// The sessions of `tenant` with a turn in flight or a slot of `held`.
fn holders(conn: &Connection, held: &HashMap<String, Slot>, tenant: &str) -> rusqlite::Result<u64> {
    let mut sessions: BTreeSet<String> = conn
        .prepare_cached("SELECT id FROM sessions WHERE tenant = ?1 AND execution IS NOT NULL")?
        .query_map(params![tenant], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    sessions.extend(
        held.iter()
            .filter(|(_, slot)| slot.tenant == tenant)
            .map(|(id, _)| id.clone()),
    );
    Ok(sessions.len() as u64)
}
