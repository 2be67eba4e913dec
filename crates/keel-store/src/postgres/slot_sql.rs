//! The SQL of turn slots on PostgreSQL (see `crate::AccessStore::reserve_turn`):
//! the admissions' statements (`access.rs`) and the writer's release
//! (`statements.rs`), built from one text of who holds a slot and of when
//! a session is at rest.

/// The keys of the sessions of tenant `$n` that hold a turn slot: a turn
/// in flight, or a slot taken (see `reserve_turn`).
macro_rules! holders {
    ($tenant:literal) => {
        concat!(
            "SELECT key FROM sessions WHERE tenant = ",
            $tenant,
            " AND execution IS NOT NULL UNION SELECT session_key FROM turn_slots WHERE tenant = ",
            $tenant
        )
    };
}

/// Whether the session of slot `t` is at rest: no turn in flight and
/// nothing queued, so its slot goes back.
macro_rules! at_rest {
    () => {
        "NOT EXISTS (SELECT 1 FROM sessions s WHERE s.key = t.session_key AND s.execution IS NOT NULL)
         AND NOT EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = t.session_key)"
    };
}

/// How many sessions of tenant `$1` hold a turn slot.
pub(super) const HELD_SLOTS: &str = concat!("SELECT count(*) FROM (", holders!("$1"), ") holders");

/// Serializes the admissions of one tenant across nodes, for the rest of
/// the transaction (a lock of its own, apart from the migration's).
pub(super) const LOCK_TENANT_SLOTS: &str =
    "SELECT pg_advisory_xact_lock(hashtextextended('keel turn slots ' || $1, 0))";

/// Takes a slot of tenant `$2` for session `$1` (at `$3`) unless `$4` are
/// held, run after [`LOCK_TENANT_SLOTS`]: whether the session holds one
/// already (then nothing is taken), how many are held, and whether one was
/// taken. No row: no such session.
pub(super) const TAKE_SLOT: &str = concat!(
    "WITH target AS (
         SELECT key, execution IS NOT NULL
             OR EXISTS (SELECT 1 FROM turn_slots t WHERE t.session_key = sessions.key) AS held
         FROM sessions WHERE id = $1),
     holders AS (SELECT count(*) AS held FROM (",
    holders!("$2"),
    ") h),
     taken AS (
         INSERT INTO turn_slots (session_key, tenant, taken_at_ms)
         SELECT target.key, $2, $3 FROM target, holders WHERE NOT target.held AND holders.held < $4
         RETURNING 1)
     SELECT target.held, holders.held, EXISTS (SELECT 1 FROM taken) FROM target, holders"
);

/// Drops tenant `$1`'s slots taken before `$2` whose session is at rest
/// (their message never reached the queue): run only when the cap is
/// found reached, before counting again.
pub(super) const DROP_STALE_SLOTS: &str = concat!(
    "DELETE FROM turn_slots t WHERE t.tenant = $1 AND t.taken_at_ms < $2 AND ",
    at_rest!()
);

/// Gives back the slot of the session keyed `$1` if it is at rest: the
/// writer's, in a batch that may leave its session so.
pub(super) const RELEASE_AT_REST: &str = concat!("DELETE FROM turn_slots t WHERE t.session_key = $1 AND ", at_rest!());

/// [`RELEASE_AT_REST`] for the session whose id is `$1`.
pub(super) const GIVE_BACK: &str = concat!(
    "DELETE FROM turn_slots t WHERE t.session_key = (SELECT key FROM sessions WHERE id = $1) AND ",
    at_rest!()
);
