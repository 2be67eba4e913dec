//! The PostgreSQL schema, its version and its migrations.
//!
//! The version is the one row of `keel_schema`. Migrations run in one
//! transaction under a transaction-scoped advisory lock, so two processes
//! opening one database at once migrate it once: the second waits, then
//! finds it up to date.

use tokio_postgres::Client;

use crate::StoreError;

/// The schema this build writes.
pub(super) const SCHEMA_VERSION: i32 = 7;

/// The advisory lock key migrations hold (`keel` in ASCII, then `schema`).
const MIGRATION_LOCK: i64 = 0x6b65_656c_5343_4d41;

/// Version 1: the SQLite store's layout (at its version 5), in one step.
///
/// - `sessions`: one row per session: its checkpoint, its turn in flight,
///   the counters a write updates (`last_sequence`, `transcript_len`), the
///   lease (`lease` is the epoch `acquire` and `claim` bump; `lease_owner`
///   and `lease_expires_at`, both set or both null, are the owned lease of
///   `claim`/`renew`/`release`), the bot and the title.
/// - `log`: one row per committed batch: the JSON array of its events and
///   the history items it added (after cutting the history back to
///   `history_cut`, when set), indexed by `(session_key, first_sequence)`.
///   One row per batch keeps a group commit to one index entry per session.
/// - `queued_submissions` and `submission_keys`: the durable queue and the
///   idempotency keys, written from the events that queue and settle them.
///
/// Ids compare in the "C" collation (bytewise, as Rust and SQLite compare
/// strings), so paging by id does not depend on the server's locale.
const SCHEMA_V1: &str = r#"
CREATE TABLE sessions (
    key              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               TEXT COLLATE "C" NOT NULL UNIQUE,
    bot_id           TEXT COLLATE "C" NOT NULL DEFAULT '',
    created_at_ms    BIGINT NOT NULL,
    updated_at_ms    BIGINT NOT NULL,
    last_sequence    BIGINT NOT NULL DEFAULT 0,
    transcript_len   BIGINT NOT NULL DEFAULT 0,
    lease            BIGINT NOT NULL DEFAULT 0,
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    title            TEXT,
    checkpoint       BYTEA NOT NULL,
    execution        BYTEA
);
CREATE INDEX sessions_by_bot ON sessions (bot_id, key);
CREATE TABLE log (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_key    BIGINT NOT NULL,
    first_sequence BIGINT NOT NULL,
    last_sequence  BIGINT NOT NULL,
    recorded_at_ms BIGINT NOT NULL,
    history_cut    BIGINT,
    history        BYTEA,
    events         BYTEA NOT NULL
);
CREATE INDEX log_by_session ON log (session_key, first_sequence);
CREATE TABLE queued_submissions (
    session_key BIGINT NOT NULL,
    id          TEXT COLLATE "C" NOT NULL,
    sequence    BIGINT NOT NULL,
    submission  BYTEA NOT NULL,
    PRIMARY KEY (session_key, id)
);
CREATE TABLE submission_keys (
    session_key   BIGINT NOT NULL,
    key           TEXT COLLATE "C" NOT NULL,
    submission_id TEXT NOT NULL,
    sequence      BIGINT NOT NULL,
    PRIMARY KEY (session_key, key)
);
"#;

/// Version 2: `relayed_submissions`, the submissions a node accepted for a
/// session another node runs, until the owner queues them (see
/// `relay.rs`). A client's idempotency key is unique per session here too.
const SCHEMA_V2: &str = r#"
CREATE TABLE relayed_submissions (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_key     BIGINT NOT NULL,
    submission_id   TEXT COLLATE "C" NOT NULL,
    idempotency_key TEXT COLLATE "C",
    submission      BYTEA NOT NULL,
    relayed_at_ms   BIGINT NOT NULL
);
CREATE INDEX relayed_by_session ON relayed_submissions (session_key, id);
CREATE UNIQUE INDEX relayed_by_key ON relayed_submissions (session_key, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
"#;

/// Version 3: the owner's answer to a relayed submission (`answer`, the
/// JSON of a `RelayOutcome`, and when it was given), kept a while with the
/// row so that the node which relayed it answers its client the same.
/// Rows without an answer are the ones waiting.
const SCHEMA_V3: &str = r#"
ALTER TABLE relayed_submissions ADD COLUMN answer TEXT, ADD COLUMN answered_at_ms BIGINT;
"#;

/// Version 4: tenants and access, as the SQLite store's version 7.
///
/// - `sessions.tenant`: the tenant a session was created for (`'default'`
///   for those stored before), set when its row is made and never moved by
///   a later write; indexed for listings by tenant (newest created first)
///   and for counting a tenant's turns in flight.
/// - `api_keys`: keys as their hashes (see `access.rs`), unique by id and
///   by hash; `scopes` is a JSON array; `seq` orders them as made.
/// - `access_revision`: one row, bumped in the transaction of every change
///   of keys or budgets, which nodes poll.
/// - `budgets`: budgets set over the API, by target (`kind` is `tenant` or
///   `session`), as JSON the store does not read.
/// - `usage_hours`: the usage ledger, tokens per target and hour, added to
///   in the transaction of the events that report them.
const SCHEMA_V4: &str = r#"
ALTER TABLE sessions ADD COLUMN tenant TEXT COLLATE "C" NOT NULL DEFAULT 'default';
CREATE INDEX sessions_by_tenant ON sessions (tenant, key);
CREATE INDEX sessions_running_by_tenant ON sessions (tenant) WHERE execution IS NOT NULL;
CREATE TABLE api_keys (
    seq             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              TEXT COLLATE "C" NOT NULL UNIQUE,
    hash            TEXT COLLATE "C" NOT NULL UNIQUE,
    tenant          TEXT COLLATE "C" NOT NULL,
    name            TEXT NOT NULL,
    scopes          TEXT NOT NULL,
    created_at_ms   BIGINT NOT NULL,
    last_used_at_ms BIGINT,
    expires_at_ms   BIGINT,
    revoked_at_ms   BIGINT
);
CREATE TABLE access_revision (
    one      BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
    revision BIGINT NOT NULL
);
INSERT INTO access_revision (revision) VALUES (0);
CREATE TABLE budgets (
    kind   TEXT COLLATE "C" NOT NULL,
    target TEXT COLLATE "C" NOT NULL,
    budget TEXT NOT NULL,
    PRIMARY KEY (kind, target)
);
CREATE TABLE usage_hours (
    kind                TEXT COLLATE "C" NOT NULL,
    target              TEXT COLLATE "C" NOT NULL,
    hour_ms             BIGINT NOT NULL,
    input_tokens        BIGINT NOT NULL,
    cached_input_tokens BIGINT NOT NULL,
    output_tokens       BIGINT NOT NULL,
    reasoning_tokens    BIGINT NOT NULL,
    PRIMARY KEY (kind, target, hour_ms)
);
"#;

/// Version 5: where each node takes submissions from the others
/// (`nodes`: its id, the base URL it advertised, and when), so a node
/// hands a submission to a session's owner directly instead of through
/// `relayed_submissions`.
const SCHEMA_V5: &str = r#"
CREATE TABLE nodes (
    node_id           TEXT COLLATE "C" PRIMARY KEY,
    url               TEXT NOT NULL,
    advertised_at_ms  BIGINT NOT NULL
);
"#;

/// Version 6: the webhook outbox (see `webhook.rs`): endpoints, and one
/// delivery per endpoint and event it wants, written in the event's
/// transaction by the writer; a claim holds a pending one while it is
/// attempted. Indexed as on SQLite.
const SCHEMA_V6: &str = r#"
CREATE TABLE webhook_endpoints (
    seq           BIGSERIAL PRIMARY KEY,
    id            TEXT COLLATE "C" NOT NULL UNIQUE,
    url           TEXT NOT NULL,
    secrets       TEXT NOT NULL,
    event_types   TEXT NOT NULL,
    bot_id        TEXT,
    tenant        TEXT,
    description   TEXT,
    created_at_ms BIGINT NOT NULL
);
CREATE TABLE webhook_deliveries (
    id                 BIGSERIAL PRIMARY KEY,
    endpoint_id        TEXT COLLATE "C" NOT NULL,
    session_id         TEXT COLLATE "C" NOT NULL,
    sequence           BIGINT NOT NULL,
    event_type         TEXT NOT NULL,
    created_at_ms      BIGINT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'pending',
    attempts           INTEGER NOT NULL DEFAULT 0,
    next_attempt_at_ms BIGINT NOT NULL,
    claimed_by         TEXT,
    claimed_until_ms   BIGINT,
    last_status        INTEGER,
    last_error         TEXT,
    finished_at_ms     BIGINT
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at_ms) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_heads ON webhook_deliveries (endpoint_id, session_id, id) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, id);
CREATE INDEX webhook_deliveries_by_session ON webhook_deliveries (session_id);
"#;

/// Version 7: `turn_slots`, as the SQLite store's version 9: the turn
/// slots sessions took to be admitted under their tenant's
/// `max_concurrent_turns`, given back by the writer.
const SCHEMA_V7: &str = r#"
CREATE TABLE turn_slots (
    session_key BIGINT PRIMARY KEY,
    tenant      TEXT COLLATE "C" NOT NULL,
    taken_at_ms BIGINT NOT NULL
);
CREATE INDEX turn_slots_by_tenant ON turn_slots (tenant);
"#;

/// Brings the database's schema up to [`SCHEMA_VERSION`], or refuses one
/// written by a newer Keel with [`StoreError::SchemaTooNew`] (changing
/// nothing).
pub(super) async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let tx = client.transaction().await.map_err(super::pg_error)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(super::pg_error)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS keel_schema (
             one     BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
             version INTEGER NOT NULL
         )",
    )
    .await
    .map_err(super::pg_error)?;
    let found: i32 = tx
        .query_opt("SELECT version FROM keel_schema", &[])
        .await
        .map_err(super::pg_error)?
        .map(|row| row.try_get(0))
        .transpose()
        .map_err(super::pg_error)?
        .unwrap_or(0);
    if found > SCHEMA_VERSION {
        // Dropping the transaction rolls it back.
        return Err(StoreError::SchemaTooNew {
            found: i64::from(found),
            supported: i64::from(SCHEMA_VERSION),
        });
    }
    if found < 1 {
        tracing::info!("creating the keel schema (version {SCHEMA_VERSION})");
        tx.batch_execute(SCHEMA_V1).await.map_err(super::pg_error)?;
    }
    if found < 2 {
        tx.batch_execute(SCHEMA_V2).await.map_err(super::pg_error)?;
    }
    if found < 3 {
        tx.batch_execute(SCHEMA_V3).await.map_err(super::pg_error)?;
    }
    if found < 4 {
        tx.batch_execute(SCHEMA_V4).await.map_err(super::pg_error)?;
    }
    if found < 5 {
        tx.batch_execute(SCHEMA_V5).await.map_err(super::pg_error)?;
    }
    if found < 6 {
        tx.batch_execute(SCHEMA_V6).await.map_err(super::pg_error)?;
    }
    if found < 7 {
        tx.batch_execute(SCHEMA_V7).await.map_err(super::pg_error)?;
    }
    if found < SCHEMA_VERSION {
        tx.execute(
            "INSERT INTO keel_schema (version) VALUES ($1) ON CONFLICT (one) DO UPDATE SET version = excluded.version",
            &[&SCHEMA_VERSION],
        )
        .await
        .map_err(super::pg_error)?;
    }
    tx.commit().await.map_err(super::pg_error)
}
