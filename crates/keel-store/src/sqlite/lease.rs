//! Owned leases on SQLite: claim, renew, release, and the sessions to take
//! over, with the PostgreSQL store's semantics.
//!
//! They run on a connection of their own (not the writer's), each in an
//! immediate transaction, so a claim's check and its update are one atomic
//! step against other claims and against the writer's appends (which check
//! the epoch inside their own transaction). Times are this process's clock,
//! in milliseconds since the Unix epoch.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::sqlite_error;
use crate::{StoreError, ttl_ms};
use keel_protocol::now_ms;

fn now() -> i64 {
    i64::try_from(now_ms()).unwrap_or(i64::MAX)
}

pub(super) fn claim(conn: &mut Connection, session_id: &str, owner: &str, ttl: Duration) -> Result<u64, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error)?;
    let now = now();
    let row: Option<(i64, Option<String>, Option<i64>)> = tx
        .prepare_cached("SELECT lease, lease_owner, lease_expires_at FROM sessions WHERE id = ?1")
        .and_then(|mut select| {
            select
                .query_row(params![session_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
                .optional()
        })
        .map_err(sqlite_error)?;
    let Some((lease, holder, expires_at)) = row else {
        return Err(StoreError::UnknownSession(session_id.to_owned()));
    };
    let live = expires_at.is_some_and(|expires_at| expires_at > now);
    let mine = holder.as_deref() == Some(owner);
    if let (Some(holder), Some(expires_at)) = (&holder, expires_at)
        && live
        && !mine
    {
        return Err(StoreError::Owned {
            session_id: session_id.to_owned(),
            owner: holder.clone(),
            expires_in_ms: u64::try_from(expires_at - now).unwrap_or(0),
        });
    }
    let lease = if mine && live { lease } else { lease + 1 };
    tx.prepare_cached("UPDATE sessions SET lease = ?2, lease_owner = ?3, lease_expires_at = ?4 WHERE id = ?1")
        .and_then(|mut update| update.execute(params![session_id, lease, owner, now.saturating_add(ttl_ms(ttl))]))
        .map_err(sqlite_error)?;
    tx.commit().map_err(sqlite_error)?;
    Ok(u64::try_from(lease).unwrap_or(0))
}

pub(super) fn renew(
    conn: &mut Connection,
    owner: &str,
    ttl: Duration,
    sessions: &[(String, u64)],
) -> Result<Vec<String>, StoreError> {
    if sessions.is_empty() {
        return Ok(Vec::new());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite_error)?;
    let expires_at = now().saturating_add(ttl_ms(ttl));
    let mut lost = Vec::new();
    {
        let mut update = tx
            .prepare_cached(
                "UPDATE sessions SET lease_expires_at = ?4 WHERE id = ?1 AND lease = ?2 AND lease_owner = ?3",
            )
            .map_err(sqlite_error)?;
        for (session_id, epoch) in sessions {
            let epoch = i64::try_from(*epoch).unwrap_or(i64::MAX);
            if update
                .execute(params![session_id, epoch, owner, expires_at])
                .map_err(sqlite_error)?
                == 0
            {
                lost.push(session_id.clone());
            }
        }
    }
    tx.commit().map_err(sqlite_error)?;
    Ok(lost)
}

pub(super) fn release(conn: &mut Connection, session_id: &str, owner: &str, epoch: u64) -> Result<(), StoreError> {
    let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
    let released = conn
        .prepare_cached(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL
             WHERE id = ?1 AND lease_owner = ?2 AND lease = ?3",
        )
        .and_then(|mut update| update.execute(params![session_id, owner, epoch]))
        .map_err(sqlite_error)?;
    if released == 0 {
        let exists = conn
            .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")
            .and_then(|mut select| select.exists(params![session_id]))
            .map_err(sqlite_error)?;
        if !exists {
            return Err(StoreError::UnknownSession(session_id.to_owned()));
        }
    }
    Ok(())
}

pub(super) fn sessions_to_take_over(
    conn: &Connection,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "SELECT id FROM sessions
         WHERE (?3 IS NULL OR id > ?3)
           AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at <= ?1)
           AND (execution IS NOT NULL
                OR EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = sessions.key))
         ORDER BY id LIMIT ?2",
    )
    .and_then(|mut select| {
        select
            .query_map(params![now(), limit, after], |row| row.get(0))?
            .collect::<Result<Vec<String>, _>>()
    })
    .map_err(sqlite_error)
}
