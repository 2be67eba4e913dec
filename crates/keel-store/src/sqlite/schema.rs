//! Opening SQLite connections and migrating the schema.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use super::{SqliteOptions, Synchronous};
use crate::StoreError;

/// The schema this build writes; stored in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 8;

/// The schema version of the database file at `path`, read without
/// changing anything (0: no Keel schema yet), for `keel doctor`.
pub fn stored_schema_version(path: &Path) -> Result<i64, StoreError> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)
        .map_err(|e| super::store_error(e, path))?;
    conn.pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| super::store_error(e, path))
}

/// How long a connection waits for another process's lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Version 1: sessions with their checkpoint, and the log.
///
/// The log holds one row per committed batch: a JSON array of consecutive
/// events and, when the batch extended the history, a JSON array of the
/// transcript items it added. Rows are appended in commit order across all
/// sessions, with an index by `(session_key, first_sequence)`. A group commit
/// then writes its new rows into shared pages and touches one small index
/// page per session; the pages a commit touches, more than its fsync, are
/// what it costs. `history` comes before `events` so that reading the
/// history does not read through the (larger) events.
const SCHEMA_V1: &str = "
CREATE TABLE sessions (
    key            INTEGER PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE,
    created_at_ms  INTEGER NOT NULL,
    updated_at_ms  INTEGER NOT NULL,
    last_sequence  INTEGER NOT NULL DEFAULT 0,
    transcript_len INTEGER NOT NULL DEFAULT 0,
    lease          INTEGER NOT NULL DEFAULT 0,
    checkpoint     TEXT NOT NULL,
    execution      TEXT
);
CREATE TABLE log (
    id             INTEGER PRIMARY KEY,
    session_key    INTEGER NOT NULL,
    first_sequence INTEGER NOT NULL,
    last_sequence  INTEGER NOT NULL,
    recorded_at_ms INTEGER NOT NULL,
    history        TEXT,
    events         TEXT NOT NULL
);
CREATE INDEX log_by_session ON log (session_key, first_sequence);
";

/// Version 2: the durable submission queue and idempotency keys.
///
/// A submission stored ahead of running (its `submission_queued` event) has
/// a row in `queued_submissions` until the session takes it up; the rows are
/// written and deleted in the transactions of the events that queue and
/// settle them. `submission_keys` remembers, per session, which submission
/// an idempotency key produced, so a retried request is not queued twice.
const SCHEMA_V2: &str = "
CREATE TABLE queued_submissions (
    session_key INTEGER NOT NULL,
    id          TEXT NOT NULL,
    sequence    INTEGER NOT NULL,
    submission  TEXT NOT NULL,
    PRIMARY KEY (session_key, id)
) WITHOUT ROWID;
CREATE TABLE submission_keys (
    session_key   INTEGER NOT NULL,
    key           TEXT NOT NULL,
    submission_id TEXT NOT NULL,
    sequence      INTEGER NOT NULL,
    PRIMARY KEY (session_key, key)
) WITHOUT ROWID;
";

/// Version 3: each session's bot in a column of its own, so that sessions
/// can be listed by bot (the bot is also in the checkpoint, which a query
/// cannot read: it may be compressed).
const SCHEMA_V3: &str = "
ALTER TABLE sessions ADD COLUMN bot_id TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_by_bot ON sessions (bot_id, key);
";

/// Version 4: each session's title, set from its first user message when
/// that is stored, or by a rename. Sessions stored before have none.
const SCHEMA_V4: &str = "
ALTER TABLE sessions ADD COLUMN title TEXT;
";

/// Version 5: a log row may cut the history back before adding its items
/// (a rolled-back turn): `history_cut` is the history's length to keep.
/// The history is rebuilt by applying the rows in order, so the items a
/// rollback removed stay stored where they were written.
const SCHEMA_V5: &str = "
ALTER TABLE log ADD COLUMN history_cut INTEGER;
";

/// Version 6: the owned lease of `claim`/`renew`/`release`: its owner and
/// its expiry (milliseconds since the Unix epoch, by this process's clock),
/// both set or both null. `lease` stays the epoch.
const SCHEMA_V6: &str = "
ALTER TABLE sessions ADD COLUMN lease_owner TEXT;
ALTER TABLE sessions ADD COLUMN lease_expires_at INTEGER;
";

/// Version 7: tenants and access.
///
/// - `sessions.tenant`: the tenant a session was created for (sessions
///   stored before have `'default'`), set when its row is made and never
///   moved by a later write, indexed for listings by tenant (newest
///   created first) and for counting a tenant's turns in flight.
/// - `api_keys`: keys as their hashes (see `access.rs`), unique by id and
///   by hash; `scopes` is a JSON array.
/// - `access_revision`: one row, bumped in the transaction of every change
///   of keys or budgets, which nodes poll.
/// - `budgets`: budgets set over the API, by target (`kind` is `tenant` or
///   `session`), as JSON the store does not read.
/// - `usage_hours`: the usage ledger, tokens per target and hour, added to
///   in the transaction of the events that report them.
const SCHEMA_V7: &str = "
ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
CREATE INDEX sessions_by_tenant ON sessions (tenant, key);
CREATE INDEX sessions_running_by_tenant ON sessions (tenant) WHERE execution IS NOT NULL;
CREATE TABLE api_keys (
    seq             INTEGER PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    hash            TEXT NOT NULL UNIQUE,
    tenant          TEXT NOT NULL,
    name            TEXT NOT NULL,
    scopes          TEXT NOT NULL,
    created_at_ms   INTEGER NOT NULL,
    last_used_at_ms INTEGER,
    expires_at_ms   INTEGER,
    revoked_at_ms   INTEGER
);
CREATE TABLE access_revision (
    one      INTEGER PRIMARY KEY CHECK (one = 1),
    revision INTEGER NOT NULL
);
INSERT INTO access_revision (one, revision) VALUES (1, 0);
CREATE TABLE budgets (
    kind   TEXT NOT NULL,
    target TEXT NOT NULL,
    budget TEXT NOT NULL,
    PRIMARY KEY (kind, target)
) WITHOUT ROWID;
CREATE TABLE usage_hours (
    kind                TEXT NOT NULL,
    target              TEXT NOT NULL,
    hour_ms             INTEGER NOT NULL,
    input_tokens        INTEGER NOT NULL,
    cached_input_tokens INTEGER NOT NULL,
    output_tokens       INTEGER NOT NULL,
    reasoning_tokens    INTEGER NOT NULL,
    PRIMARY KEY (kind, target, hour_ms)
) WITHOUT ROWID;
";

/// Version 8: the webhook outbox (see `webhook.rs`).
///
/// - `webhook_endpoints`: where deliveries go; `event_types` is `,a,b,`,
///   `secrets` a JSON array, newest first.
/// - `webhook_deliveries`: one row per endpoint and event it wants,
///   written by the writer in the event's transaction; a claim
///   (`claimed_by`, `claimed_until_ms`) holds a pending one while it is
///   attempted. Indexed for the claim (pending ones by due time, and by
///   endpoint and session to find each one's oldest) and for listing an
///   endpoint's.
const SCHEMA_V8: &str = "
CREATE TABLE webhook_endpoints (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    url           TEXT NOT NULL,
    secrets       TEXT NOT NULL,
    event_types   TEXT NOT NULL,
    bot_id        TEXT,
    tenant        TEXT,
    description   TEXT,
    created_at_ms INTEGER NOT NULL
);
CREATE TABLE webhook_deliveries (
    id                 INTEGER PRIMARY KEY,
    endpoint_id        TEXT NOT NULL,
    session_id         TEXT NOT NULL,
    sequence           INTEGER NOT NULL,
    event_type         TEXT NOT NULL,
    created_at_ms      INTEGER NOT NULL,
    state              TEXT NOT NULL DEFAULT 'pending',
    attempts           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at_ms INTEGER NOT NULL,
    claimed_by         TEXT,
    claimed_until_ms   INTEGER,
    last_status        INTEGER,
    last_error         TEXT,
    finished_at_ms     INTEGER
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at_ms) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_heads ON webhook_deliveries (endpoint_id, session_id, id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, id);
CREATE INDEX webhook_deliveries_by_session ON webhook_deliveries (session_id);
";

/// Opens the writer connection: WAL, the configured durability, an optional
/// size cap, and the schema brought up to date.
pub(super) fn open_writer(path: &Path, options: &SqliteOptions) -> Result<Connection, StoreError> {
    super::identity::check_shm_writable(path)?;
    let mut conn = open(path, OpenFlags::default(), options.vfs.as_deref())?;
    configure(&conn).map_err(|e| super::store_error(e, path))?;
    // Refuse a newer schema before changing anything: switching to WAL
    // rewrites the file's header. `migrate` checks again under the lock.
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| super::store_error(e, path))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(|e| super::store_error(e, path))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Invalid(format!(
            "cannot use WAL mode on {} (got {mode})",
            path.display()
        )));
    }
    let synchronous = match options.synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    // A WAL that grew during a burst is cut back when it starts over.
    conn.pragma_update(None, "journal_size_limit", 32 * 1024 * 1024)
        .map_err(|e| super::store_error(e, path))?;
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(|e| super::store_error(e, path))?;
    if let Some(max_bytes) = options.max_size_bytes {
        let page_size: i64 = conn
            .pragma_query_value(None, "page_size", |row| row.get(0))
            .map_err(|e| super::store_error(e, path))?;
        let pages = (i64::try_from(max_bytes).unwrap_or(i64::MAX) / page_size.max(512)).max(1);
        conn.pragma_update(None, "max_page_count", pages)
            .map_err(|e| super::store_error(e, path))?;
    }
    migrate(&mut conn).map_err(|e| match e {
        MigrateError::Sqlite(e) => super::store_error(e, path),
        MigrateError::TooNew(found) => StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        },
    })?;
    Ok(conn)
}

/// Opens a connection to the store's file through `vfs` (SQLite's default
/// when `None`).
fn open(path: &Path, flags: OpenFlags, vfs: Option<&str>) -> Result<Connection, StoreError> {
    if flags.contains(OpenFlags::SQLITE_OPEN_CREATE) {
        create_private(path)?;
    }
    match vfs {
        Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
        None => Connection::open_with_flags(path, flags),
    }
    .map_err(|e| super::store_error(e, path))
}

/// Creates the database file, empty, readable by its owner only, if it does
/// not exist: it holds every session's conversation. SQLite gives its WAL,
/// shared-memory and journal files the database file's permissions.
fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    match created {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(StoreError::Backend(std::sync::Arc::new(std::io::Error::new(
            error.kind(),
            format!("cannot create the database {}: {error}", path.display()),
        )))),
    }
}

/// Opens the connection that runs WAL checkpoints (and, alike, the side
/// connections that write: leases, access, webhooks). None of them
/// checkpoints on its own after a commit: checkpoints run only where the
/// store decides, after checking the file system is writable, and one
/// running beside the writer's would make its inline one wait.
pub(super) fn open_checkpointer(path: &Path, vfs: Option<&str>) -> Result<Connection, StoreError> {
    let conn = open(path, OpenFlags::default(), vfs)?;
    configure(&conn).map_err(|e| super::store_error(e, path))?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(|e| super::store_error(e, path))?;
    Ok(conn)
}

/// Opens the connection that claims, renews and releases leases.
pub(super) fn open_leases(path: &Path, vfs: Option<&str>) -> Result<Connection, StoreError> {
    open_checkpointer(path, vfs)
}

/// Opens the connection that claims and settles webhook deliveries:
/// `synchronous = NORMAL`, so that its commits (two per delivery) do not
/// each wait for the disk (see `SqliteCheckpoint::webhooks`).
pub(super) fn open_webhooks(path: &Path, vfs: Option<&str>) -> Result<Connection, StoreError> {
    let conn = open_checkpointer(path, vfs)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(|e| super::store_error(e, path))?;
    Ok(conn)
}

/// Opens a connection for reads only.
pub(super) fn open_reader(path: &Path, vfs: Option<&str>) -> Result<Connection, StoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let conn = open(path, flags, vfs)?;
    configure(&conn).map_err(|e| super::store_error(e, path))?;
    conn.pragma_update(None, "query_only", true)
        .map_err(|e| super::store_error(e, path))?;
    Ok(conn)
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Checkpoints run only where the store decides (the checkpointer, the
    // writer at close), after checking the file system is still writable;
    // never as a side effect of the last connection closing.
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    conn.set_prepared_statement_cache_capacity(32);
    Ok(())
}

enum MigrateError {
    Sqlite(rusqlite::Error),
    TooNew(i64),
}

impl From<rusqlite::Error> for MigrateError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sqlite(error)
    }
}

fn migrate(conn: &mut Connection) -> Result<(), MigrateError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(MigrateError::TooNew(version));
    }
    if version < 1 {
        tx.execute_batch(SCHEMA_V1)?;
    }
    if version < 2 {
        tx.execute_batch(SCHEMA_V2)?;
    }
    if version < 3 {
        tx.execute_batch(SCHEMA_V3)?;
        if version >= 1 {
            backfill_bot_ids(&tx)?;
        }
    }
    if version < 4 {
        tx.execute_batch(SCHEMA_V4)?;
    }
    if version < 5 {
        tx.execute_batch(SCHEMA_V5)?;
    }
    if version < 6 {
        tx.execute_batch(SCHEMA_V6)?;
    }
    if version < 7 {
        tx.execute_batch(SCHEMA_V7)?;
    }
    if version < 8 {
        tx.execute_batch(SCHEMA_V8)?;
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

/// Fills the `bot_id` column of sessions stored before version 3 from their
/// checkpoints. A checkpoint that cannot be read leaves the column empty:
/// the session is then listed under no bot, and reading it reports the
/// damage as before.
fn backfill_bot_ids(tx: &rusqlite::Transaction<'_>) -> Result<(), rusqlite::Error> {
    #[derive(serde::Deserialize)]
    struct Stored {
        session_context: Context,
    }
    #[derive(serde::Deserialize)]
    struct Context {
        bot_id: String,
    }
    let mut select = tx.prepare("SELECT key, checkpoint FROM sessions")?;
    let mut update = tx.prepare("UPDATE sessions SET bot_id = ?2 WHERE key = ?1")?;
    let mut rows = select.query([])?;
    while let Some(row) = rows.next()? {
        let key: i64 = row.get(0)?;
        let bot_id = super::codec::decode(row.get_ref(1)?)
            .ok()
            .and_then(|json| serde_json::from_slice::<Stored>(&json).ok())
            .map(|stored| stored.session_context.bot_id);
        if let Some(bot_id) = bot_id {
            update.execute(rusqlite::params![key, bot_id])?;
        }
    }
    Ok(())
}
