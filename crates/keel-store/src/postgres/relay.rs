//! Relayed submissions: what a node accepted for a session that another
//! node runs, stored (committed) before the client hears `202`, then queued
//! by the owner.
//!
//! Each call is one statement on a pooled connection. The insert announces
//! the session and its live owner on `keel_relay` in its own transaction,
//! so the owner is woken at commit, never for a rolled-back insert, and the
//! other nodes can tell the notice is not theirs. The owner reads the rows in
//! order, queues each under its id and key, then deletes them: a crash in
//! between queues a row again, which its idempotency key turns into a
//! duplicate (see the host).

use deadpool_postgres::Object;

use super::pg_error;
use super::statements::{int, uint};
use crate::codec;
use crate::rows::{StoredJson, decode};
use crate::{Relayed, RelayedSubmission, StoreError};
use keel_protocol::now_ms;

/// Stores a submission unless one with its key waits already or `$6`
/// wait, and announces the session with its live owner (empty when none:
/// then any node may take it over); returns the log's end, or nothing when
/// the key was taken, the session is full or unknown.
const INSERT: &str = "WITH session AS (
         SELECT key, last_sequence,
                CASE WHEN lease_expires_at > clock_timestamp() THEN lease_owner ELSE '' END AS owner
         FROM sessions WHERE id = $1
     ), inserted AS (
         INSERT INTO relayed_submissions (session_key, submission_id, idempotency_key, submission, relayed_at_ms)
         SELECT key, $2, $3, $4, $5 FROM session
         WHERE (SELECT count(*) FROM relayed_submissions r WHERE r.session_key = session.key) < $6
         ON CONFLICT (session_key, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING session_key
     )
     SELECT session.last_sequence, count(pg_notify('keel_relay', $1 || E'\n' || session.owner))
     FROM inserted JOIN session ON session.key = inserted.session_key
     GROUP BY session.last_sequence";

/// The waiting submission with the key `$2`, if any, and how many wait;
/// no row for an unknown session.
const BY_KEY: &str = "SELECT r.id, r.submission_id, r.submission,
         (SELECT count(*) FROM relayed_submissions w WHERE w.session_key = s.key)
     FROM sessions s LEFT JOIN relayed_submissions r ON r.session_key = s.key AND r.idempotency_key = $2
     WHERE s.id = $1";

const WAITING: &str = "SELECT r.id, r.submission_id, r.idempotency_key, r.submission
     FROM relayed_submissions r JOIN sessions s ON s.key = r.session_key
     WHERE s.id = $1 ORDER BY r.id LIMIT $2";

const DONE: &str = "DELETE FROM relayed_submissions r USING sessions s
     WHERE s.id = $1 AND r.session_key = s.key AND r.id = ANY($2)";

const OWNED_WITH_RELAYED: &str = "SELECT s.id FROM sessions s
     WHERE s.lease_owner = $1
       AND EXISTS (SELECT 1 FROM relayed_submissions r WHERE r.session_key = s.key)
     ORDER BY s.id";

/// How many times a relay that lost its key to a row which was then taken
/// up at once is tried again.
const RELAY_ATTEMPTS: usize = 4;

pub(super) async fn relay(
    client: &Object,
    session_id: &str,
    submission: &RelayedSubmission,
    max_waiting: usize,
) -> Result<Relayed, StoreError> {
    let max_waiting = i64::try_from(max_waiting).unwrap_or(i64::MAX);
    let json = serde_json::to_string(submission)
        .map_err(|error| StoreError::Invalid(format!("cannot encode a relayed submission: {error}")))?;
    let stored = codec::encode(json).into_bytes();
    let insert = client.prepare_cached(INSERT).await.map_err(pg_error)?;
    let by_key = client.prepare_cached(BY_KEY).await.map_err(pg_error)?;
    let now = int(now_ms());
    for _ in 0..RELAY_ATTEMPTS {
        let inserted = client
            .query_opt(
                &insert,
                &[
                    &session_id,
                    &submission.submission_id,
                    &submission.idempotency_key,
                    &stored,
                    &now,
                    &max_waiting,
                ],
            )
            .await
            .map_err(pg_error)?;
        if let Some(row) = inserted {
            return Ok(Relayed::New {
                last_sequence: uint(row.try_get(0).map_err(pg_error)?),
            });
        }
        let key = submission.idempotency_key.as_deref().unwrap_or("");
        let Some(row) = client
            .query_opt(&by_key, &[&session_id, &key])
            .await
            .map_err(pg_error)?
        else {
            return Err(StoreError::UnknownSession(session_id.to_owned()));
        };
        let Some(relay_id) = row.try_get::<_, Option<i64>>(0).map_err(pg_error)? else {
            let waiting: i64 = row.try_get(3).map_err(pg_error)?;
            if waiting >= max_waiting {
                return Ok(Relayed::Full);
            }
            // Taken up between the two statements: the caller finds it
            // among the queued keys; or there is room again.
            continue;
        };
        let earlier = decode_row(
            relay_id,
            row.try_get(1).map_err(pg_error)?,
            Some(key.to_owned()),
            row.try_get(2).map_err(pg_error)?,
        )?;
        return Ok(Relayed::Duplicate(earlier));
    }
    Err(StoreError::Unavailable(format!(
        "the relayed submissions of session '{session_id}' kept changing"
    )))
}

pub(super) async fn relayed(
    client: &Object,
    session_id: &str,
    limit: usize,
) -> Result<Vec<RelayedSubmission>, StoreError> {
    let waiting = client.prepare_cached(WAITING).await.map_err(pg_error)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client.query(&waiting, &[&session_id, &limit]).await.map_err(pg_error)?;
    rows.iter()
        .map(|row| {
            decode_row(
                row.try_get(0).map_err(pg_error)?,
                row.try_get(1).map_err(pg_error)?,
                row.try_get(2).map_err(pg_error)?,
                row.try_get(3).map_err(pg_error)?,
            )
        })
        .collect()
}

pub(super) async fn relay_done(client: &Object, session_id: &str, relay_ids: &[u64]) -> Result<(), StoreError> {
    if relay_ids.is_empty() {
        return Ok(());
    }
    let done = client.prepare_cached(DONE).await.map_err(pg_error)?;
    let ids: Vec<i64> = relay_ids.iter().map(|&id| int(id)).collect();
    client.execute(&done, &[&session_id, &ids]).await.map_err(pg_error)?;
    Ok(())
}

pub(super) async fn sessions_with_relayed(client: &Object, owner: &str) -> Result<Vec<String>, StoreError> {
    let select = client.prepare_cached(OWNED_WITH_RELAYED).await.map_err(pg_error)?;
    let rows = client.query(&select, &[&owner]).await.map_err(pg_error)?;
    rows.iter().map(|row| row.try_get(0).map_err(pg_error)).collect()
}

fn decode_row(
    relay_id: i64,
    submission_id: String,
    idempotency_key: Option<String>,
    stored: Vec<u8>,
) -> Result<RelayedSubmission, StoreError> {
    let json: StoredJson = codec::decode(&stored);
    let decoded: RelayedSubmission = decode(&json, || format!("relayed submission {relay_id}"))?;
    Ok(RelayedSubmission {
        relay_id: uint(relay_id),
        submission_id,
        idempotency_key,
        ..decoded
    })
}
