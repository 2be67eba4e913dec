//! Owned leases on PostgreSQL: claim, renew, release, and the sessions a
//! surviving node should take over.
//!
//! Each touches one session row per statement, outside the writer's group
//! commit: the row lock of the `UPDATE` orders it against concurrent claims
//! and against the writer's appends, which check the epoch (`lease`) in
//! their own statement, and a transaction holding one row lock cannot
//! deadlock with the writer's, which holds many. A renewal is the exception:
//! one statement renews every lease of a node, taking only rows nobody has
//! locked (so it never waits, and cannot deadlock either), then the few rows
//! it skipped are renewed one per statement. Times are the server's
//! (`clock_timestamp()`), so the nodes' clocks do not matter.

use std::time::Duration;

use deadpool_postgres::Object;

use super::pg_error;
use super::statements::{int, uint};
use crate::{StoreError, ttl_ms};

/// Takes the session when it is free, expired or already `owner`'s; bumps
/// the epoch unless `owner` renews a live lease of its own.
const CLAIM: &str = "UPDATE sessions SET
         lease = CASE WHEN lease_owner IS DISTINCT FROM $2
                           OR lease_expires_at IS NULL
                           OR lease_expires_at <= clock_timestamp()
                      THEN lease + 1 ELSE lease END,
         lease_owner = $2,
         lease_expires_at = clock_timestamp() + $3::int8::float8 * interval '1 millisecond'
     WHERE id = $1
       AND (lease_owner IS NULL OR lease_owner = $2
            OR lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())
     RETURNING lease";

/// Who holds a session that a claim did not get, and for how long.
const HOLDER: &str = "SELECT lease_owner,
         CASE WHEN lease_owner IS NULL OR lease_expires_at IS NULL THEN NULL
              ELSE greatest(0, ceil(extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000))::int8 END
     FROM sessions WHERE id = $1";

/// Extends the leases `$2` (session ids) still held by `$1` at their epochs
/// `$3` and returns their ids, in one statement, skipping the rows another
/// transaction has locked: waiting for them, in another order than the
/// writer's group locks them, could deadlock with it.
const RENEW_MANY: &str = "WITH held AS (
         SELECT s.id FROM sessions s JOIN unnest($2::text[], $3::int8[]) AS h (id, lease)
             ON s.id = h.id AND s.lease = h.lease
         WHERE s.lease_owner = $1
         FOR UPDATE OF s SKIP LOCKED
     )
     UPDATE sessions s SET lease_expires_at = clock_timestamp() + $4::int8::float8 * interval '1 millisecond'
     FROM held WHERE s.id = held.id
     RETURNING s.id";

/// Extends one lease still held at its epoch; no row when it is not. For
/// the rows [`RENEW_MANY`] skipped or did not find: one row per statement,
/// each its own transaction, which cannot deadlock with the writer's.
const RENEW: &str =
    "UPDATE sessions SET lease_expires_at = clock_timestamp() + $4::int8::float8 * interval '1 millisecond'
     WHERE id = $2 AND lease = $3 AND lease_owner = $1
     RETURNING 1";

/// Clears the owner; a session left with work is announced on
/// [`RELAY_CHANNEL`](super::listen::RELAY_CHANNEL), so the other nodes take it over at once.
const RELEASE: &str = "WITH released AS (
         UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
         WHERE id = $1 AND lease_owner = $2 AND lease = $3
         RETURNING key, execution IS NOT NULL AS in_flight
     )
     SELECT count(*)::int8,
            count(CASE WHEN in_flight
                         OR EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = released.key)
                         OR EXISTS (SELECT 1 FROM relayed_submissions r
                                    WHERE r.session_key = released.key AND r.answer IS NULL)
                       THEN pg_notify('keel_relay', $1 || E'\n') END)
     FROM released";

const TAKE_OVER: &str = "SELECT id FROM sessions
     WHERE ($2::text IS NULL OR id > $2)
       AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= clock_timestamp())
       AND (execution IS NOT NULL
            OR EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = sessions.key)
            OR EXISTS (SELECT 1 FROM relayed_submissions r
                       WHERE r.session_key = sessions.key AND r.answer IS NULL))
     ORDER BY id LIMIT $1";

/// How many times a claim that lost to a lease which then ended at once is
/// tried again.
const CLAIM_ATTEMPTS: usize = 4;

pub(super) async fn claim(client: &Object, session_id: &str, owner: &str, ttl: Duration) -> Result<u64, StoreError> {
    let claim = client.prepare_cached(CLAIM).await.map_err(pg_error)?;
    let holder = client.prepare_cached(HOLDER).await.map_err(pg_error)?;
    let ttl = ttl_ms(ttl);
    for _ in 0..CLAIM_ATTEMPTS {
        if let Some(row) = client
            .query_opt(&claim, &[&session_id, &owner, &ttl])
            .await
            .map_err(pg_error)?
        {
            return Ok(uint(row.try_get(0).map_err(pg_error)?));
        }
        let Some(row) = client.query_opt(&holder, &[&session_id]).await.map_err(pg_error)? else {
            return Err(StoreError::UnknownSession(session_id.to_owned()));
        };
        let holder: Option<String> = row.try_get(0).map_err(pg_error)?;
        let left: Option<i64> = row.try_get(1).map_err(pg_error)?;
        match (holder, left) {
            (Some(holder), Some(left)) if left > 0 && holder != owner => {
                return Err(StoreError::Owned {
                    session_id: session_id.to_owned(),
                    owner: holder,
                    expires_in_ms: uint(left),
                });
            }
            // Released or expired between the two statements: try again.
            _ => continue,
        }
    }
    Err(StoreError::Unavailable(format!(
        "the lease of session '{session_id}' kept changing while it was claimed"
    )))
}

pub(super) async fn renew(
    client: &Object,
    owner: &str,
    ttl: Duration,
    sessions: &[(String, u64)],
) -> Result<Vec<String>, StoreError> {
    if sessions.is_empty() {
        return Ok(Vec::new());
    }
    let ttl = ttl_ms(ttl);
    let renew_many = client.prepare_cached(RENEW_MANY).await.map_err(pg_error)?;
    let ids: Vec<&str> = sessions.iter().map(|(id, _)| id.as_str()).collect();
    let epochs: Vec<i64> = sessions.iter().map(|(_, epoch)| int(*epoch)).collect();
    let renewed: std::collections::HashSet<String> = client
        .query(&renew_many, &[&owner, &ids, &epochs, &ttl])
        .await
        .map_err(pg_error)?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(pg_error)?;
    // Locked by another transaction, or lost: one at a time.
    let left: Vec<&(String, u64)> = sessions.iter().filter(|(id, _)| !renewed.contains(id)).collect();
    if left.is_empty() {
        return Ok(Vec::new());
    }
    let renew = client.prepare_cached(RENEW).await.map_err(pg_error)?;
    // Sent together, so they cost one round trip (pipelined).
    let renewed = futures::future::join_all(left.iter().map(|(id, epoch)| {
        let (renew, epoch) = (&renew, int(*epoch));
        async move { client.query_opt(renew, &[&owner, id, &epoch, &ttl]).await }
    }))
    .await;
    let mut lost = Vec::new();
    for ((id, _), renewed) in left.into_iter().zip(renewed) {
        if renewed.map_err(pg_error)?.is_none() {
            lost.push(id.clone());
        }
    }
    Ok(lost)
}

pub(super) async fn release(client: &Object, session_id: &str, owner: &str, epoch: u64) -> Result<(), StoreError> {
    let release = client.prepare_cached(RELEASE).await.map_err(pg_error)?;
    let released: i64 = client
        .query_one(&release, &[&session_id, &owner, &int(epoch)])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(pg_error)?;
    if released == 0 {
        let exists = client
            .query_opt("SELECT 1 FROM sessions WHERE id = $1", &[&session_id])
            .await
            .map_err(pg_error)?;
        if exists.is_none() {
            return Err(StoreError::UnknownSession(session_id.to_owned()));
        }
    }
    Ok(())
}

pub(super) async fn sessions_to_take_over(
    client: &Object,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let select = client.prepare_cached(TAKE_OVER).await.map_err(pg_error)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client.query(&select, &[&limit, &after]).await.map_err(pg_error)?;
    rows.iter().map(|row| row.try_get(0).map_err(pg_error)).collect()
}
