//! [`crate::AccessStore`] in the SQLite file: API keys, the access
//! revision, budgets (written on a connection of their own, each call one
//! transaction), the usage ledger (written by the writer, in the
//! transaction of the events that report the usage) and the reads of all
//! of them (on the reader pool).

use std::sync::Arc;

use futures::future::BoxFuture;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::access::{SESSION_KIND, TENANT_KIND, hour_of};
use crate::{ApiKeyRecord, BudgetTarget, StoreError, TurnSlot, UsageBucket};
use keel_protocol::TokenUsage;

/// Bumps the access revision, in the caller's transaction.
const BUMP: &str = "UPDATE access_revision SET revision = revision + 1 WHERE one = 1";

/// The columns [`key_row`] reads.
const KEY_COLUMNS: &str =
    "id, tenant, name, scopes, hash, created_at_ms, last_used_at_ms, expires_at_ms, revoked_at_ms";

/// Runs `write` in an immediate transaction and commits it.
fn transaction<T>(
    conn: &mut Connection,
    write: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let value = write(&tx)?;
    tx.commit().map_err(super::sqlite_error)?;
    Ok(value)
}

fn bump(conn: &Connection) -> Result<(), StoreError> {
    conn.prepare_cached(BUMP)
        .and_then(|mut update| update.execute([]))
        .map_err(super::sqlite_error)?;
    Ok(())
}

pub(super) fn create_api_key(conn: &mut Connection, key: &ApiKeyRecord) -> Result<(), StoreError> {
    let scopes = crate::job::encode(&key.scopes)?;
    transaction(conn, |tx| {
        let inserted = tx
            .prepare_cached(
                "INSERT INTO api_keys (id, tenant, name, scopes, hash, created_at_ms, last_used_at_ms,
                     expires_at_ms, revoked_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT DO NOTHING",
            )
            .and_then(|mut insert| {
                insert.execute(params![
                    key.id,
                    key.tenant,
                    key.name,
                    scopes,
                    key.hash,
                    key.created_at_ms,
                    key.last_used_at_ms,
                    key.expires_at_ms,
                    key.revoked_at_ms
                ])
            })
            .map_err(super::sqlite_error)?;
        if inserted == 0 {
            return Err(StoreError::Exists(key.id.clone()));
        }
        bump(tx)
    })
}

pub(super) fn api_keys(conn: &Connection) -> Result<Vec<ApiKeyRecord>, StoreError> {
    let mut select = conn
        .prepare_cached(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys ORDER BY created_at_ms, seq"
        ))
        .map_err(super::sqlite_error)?;
    let rows = select.query_map([], key_row).map_err(super::sqlite_error)?;
    let mut keys = Vec::new();
    for row in rows {
        let (mut key, scopes) = row.map_err(super::sqlite_error)?;
        key.scopes = serde_json::from_str(&scopes).map_err(|error| StoreError::Corrupt {
            what: format!("scopes of API key '{}'", key.id),
            detail: error.to_string(),
        })?;
        keys.push(key);
    }
    Ok(keys)
}

/// A key's row, with its scopes still JSON.
fn key_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<(ApiKeyRecord, String)> {
    Ok((
        ApiKeyRecord {
            id: row.get(0)?,
            tenant: row.get(1)?,
            name: row.get(2)?,
            scopes: Vec::new(),
            hash: row.get(4)?,
            created_at_ms: row.get(5)?,
            last_used_at_ms: row.get(6)?,
            expires_at_ms: row.get(7)?,
            revoked_at_ms: row.get(8)?,
        },
        row.get(3)?,
    ))
}

pub(super) fn revoke_api_key(conn: &mut Connection, id: &str, at_ms: u64) -> Result<bool, StoreError> {
    transaction(conn, |tx| {
        let revoked = tx
            .prepare_cached("UPDATE api_keys SET revoked_at_ms = ?2 WHERE id = ?1 AND revoked_at_ms IS NULL")
            .and_then(|mut update| update.execute(params![id, at_ms]))
            .map_err(super::sqlite_error)?;
        if revoked > 0 {
            bump(tx)?;
            return Ok(true);
        }
        let exists = tx
            .prepare_cached("SELECT 1 FROM api_keys WHERE id = ?1")
            .and_then(|mut select| select.query_row(params![id], |_| Ok(())).optional())
            .map_err(super::sqlite_error)?;
        Ok(exists.is_some())
    })
}

pub(super) fn touch_api_keys(conn: &mut Connection, used: &[(String, u64)]) -> Result<(), StoreError> {
    if used.is_empty() {
        return Ok(());
    }
    transaction(conn, |tx| {
        let mut update = tx
            .prepare_cached(
                "UPDATE api_keys SET last_used_at_ms = ?2
                 WHERE id = ?1 AND (last_used_at_ms IS NULL OR last_used_at_ms < ?2)",
            )
            .map_err(super::sqlite_error)?;
        for (id, at_ms) in used {
            update.execute(params![id, at_ms]).map_err(super::sqlite_error)?;
        }
        Ok(())
    })
}

pub(super) fn access_revision(conn: &Connection) -> Result<u64, StoreError> {
    conn.prepare_cached("SELECT revision FROM access_revision WHERE one = 1")
        .and_then(|mut select| select.query_row([], |row| row.get(0)))
        .map_err(super::sqlite_error)
}

pub(super) fn budgets(conn: &Connection) -> Result<Vec<(BudgetTarget, String)>, StoreError> {
    let mut select = conn
        .prepare_cached("SELECT kind, target, budget FROM budgets ORDER BY kind DESC, target")
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map([], |row| Ok((row.get::<_, String>(0)?, row.get(1)?, row.get(2)?)))
        .map_err(super::sqlite_error)?;
    let mut budgets = Vec::new();
    for row in rows {
        let (kind, target, budget) = row.map_err(super::sqlite_error)?;
        match BudgetTarget::from_key(&kind, target) {
            Some(target) => budgets.push((target, budget)),
            None => tracing::warn!(kind, "a budget of an unknown kind is ignored"),
        }
    }
    Ok(budgets)
}

pub(super) fn set_budget(conn: &mut Connection, target: &BudgetTarget, budget: Option<&str>) -> Result<(), StoreError> {
    let (kind, id) = target.key();
    transaction(conn, |tx| {
        match budget {
            Some(budget) => tx
                .prepare_cached(
                    "INSERT INTO budgets (kind, target, budget) VALUES (?1, ?2, ?3)
                     ON CONFLICT (kind, target) DO UPDATE SET budget = excluded.budget",
                )
                .and_then(|mut upsert| upsert.execute(params![kind, id, budget])),
            None => tx
                .prepare_cached("DELETE FROM budgets WHERE kind = ?1 AND target = ?2")
                .and_then(|mut delete| delete.execute(params![kind, id])),
        }
        .map_err(super::sqlite_error)?;
        bump(tx)
    })
}

pub(super) fn usage_buckets(
    conn: &Connection,
    target: &BudgetTarget,
    since_ms: u64,
) -> Result<Vec<UsageBucket>, StoreError> {
    let (kind, id) = target.key();
    let since = i64::try_from(since_ms).unwrap_or(i64::MAX);
    let mut select = conn
        .prepare_cached(
            "SELECT hour_ms, input_tokens, cached_input_tokens, output_tokens, reasoning_tokens FROM usage_hours
             WHERE kind = ?1 AND target = ?2 AND hour_ms >= ?3 ORDER BY hour_ms",
        )
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map(params![kind, id, since], |row| {
            Ok(UsageBucket {
                hour_start_ms: row.get(0)?,
                usage: TokenUsage {
                    input_tokens: row.get(1)?,
                    cached_input_tokens: row.get(2)?,
                    output_tokens: row.get(3)?,
                    reasoning_tokens: row.get(4)?,
                },
            })
        })
        .map_err(super::sqlite_error)?;
    rows.collect::<Result<_, _>>().map_err(super::sqlite_error)
}

pub(super) fn usage_total(conn: &Connection, target: &BudgetTarget) -> Result<TokenUsage, StoreError> {
    let (kind, id) = target.key();
    conn.prepare_cached(
        "SELECT coalesce(sum(input_tokens), 0), coalesce(sum(cached_input_tokens), 0),
                coalesce(sum(output_tokens), 0), coalesce(sum(reasoning_tokens), 0)
         FROM usage_hours WHERE kind = ?1 AND target = ?2",
    )
    .and_then(|mut select| {
        select.query_row(params![kind, id], |row| {
            Ok(TokenUsage {
                input_tokens: row.get(0)?,
                cached_input_tokens: row.get(1)?,
                output_tokens: row.get(2)?,
                reasoning_tokens: row.get(3)?,
            })
        })
    })
    .map_err(super::sqlite_error)
}

/// Adds a batch's usage, committed at `now`, to the ledgers of its tenant
/// and its session: one statement, one row each.
pub(super) fn add_usage(
    conn: &Connection,
    tenant: &str,
    session_id: &str,
    now: u64,
    usage: &TokenUsage,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO usage_hours (kind, target, hour_ms, input_tokens, cached_input_tokens, output_tokens,
             reasoning_tokens)
         VALUES (?1, ?2, ?5, ?6, ?7, ?8, ?9), (?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (kind, target, hour_ms) DO UPDATE SET
             input_tokens = input_tokens + excluded.input_tokens,
             cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens,
             output_tokens = output_tokens + excluded.output_tokens,
             reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens",
    )?
    .execute(params![
        TENANT_KIND,
        tenant,
        SESSION_KIND,
        session_id,
        hour_of(now),
        usage.input_tokens,
        usage.cached_input_tokens,
        usage.output_tokens,
        usage.reasoning_tokens
    ])?;
    Ok(())
}

/// Drops a deleted session's ledger and budget (bumping the revision when
/// it had a budget), in the deletion's transaction. Its tenant's ledger
/// stays: deleting sessions does not give a tenant its tokens back.
pub(super) fn forget_session(conn: &Connection, session_id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached("DELETE FROM usage_hours WHERE kind = ?1 AND target = ?2")?
        .execute(params![SESSION_KIND, session_id])?;
    let budgets = conn
        .prepare_cached("DELETE FROM budgets WHERE kind = ?1 AND target = ?2")?
        .execute(params![SESSION_KIND, session_id])?;
    if budgets > 0 {
        conn.prepare_cached(BUMP)?.execute([])?;
    }
    Ok(())
}

impl crate::AccessStore for super::SqliteCheckpoint {
    fn create_api_key<'a>(&'a self, key: &'a ApiKeyRecord) -> BoxFuture<'a, Result<(), StoreError>> {
        let key = key.clone();
        Box::pin(self.on_side(&self.access, move |conn| create_api_key(conn, &key)))
    }

    fn api_keys(&self) -> BoxFuture<'_, Result<Vec<ApiKeyRecord>, StoreError>> {
        Box::pin(self.read(api_keys))
    }

    fn revoke_api_key<'a>(&'a self, id: &'a str, at_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.on_side(&self.access, move |conn| revoke_api_key(conn, &id, at_ms)))
    }

    fn touch_api_keys<'a>(&'a self, used: &'a [(String, u64)]) -> BoxFuture<'a, Result<(), StoreError>> {
        let used = used.to_vec();
        Box::pin(self.on_side(&self.access, move |conn| touch_api_keys(conn, &used)))
    }

    fn access_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.read(access_revision))
    }

    fn budgets(&self) -> BoxFuture<'_, Result<Vec<(BudgetTarget, String)>, StoreError>> {
        Box::pin(self.read(budgets))
    }

    fn set_budget<'a>(
        &'a self,
        target: &'a BudgetTarget,
        budget_json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let (target, budget) = (target.clone(), budget_json.map(str::to_owned));
        Box::pin(self.on_side(&self.access, move |conn| set_budget(conn, &target, budget.as_deref())))
    }

    fn usage_buckets<'a>(
        &'a self,
        target: &'a BudgetTarget,
        since_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<UsageBucket>, StoreError>> {
        let target = target.clone();
        Box::pin(self.read(move |conn| usage_buckets(conn, &target, since_ms)))
    }

    fn usage_total<'a>(&'a self, target: &'a BudgetTarget) -> BoxFuture<'a, Result<TokenUsage, StoreError>> {
        let target = target.clone();
        Box::pin(self.read(move |conn| usage_total(conn, &target)))
    }

    fn running_turns<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let (tenant, slots) = (tenant.to_owned(), Arc::clone(&self.turn_slots));
        Box::pin(self.read(move |conn| slots.held(conn, &tenant)))
    }

    fn reserve_turn<'a>(
        &'a self,
        tenant: &'a str,
        session_id: &'a str,
        cap: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<TurnSlot, StoreError>> {
        let (tenant, session_id) = (tenant.to_owned(), session_id.to_owned());
        let slots = Arc::clone(&self.turn_slots);
        Box::pin(self.read(move |conn| slots.reserve(conn, &tenant, &session_id, cap, now_ms)))
    }

    fn give_back_turn<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let (session_id, slots) = (session_id.to_owned(), Arc::clone(&self.turn_slots));
        let now = keel_protocol::now_ms();
        Box::pin(self.read(move |conn| {
            slots
                .release_at_rest(conn, [session_id.as_str()], now)
                .map_err(super::sqlite_error)
        }))
    }

    fn expect_turn_slots(&self) {
        // Nothing to do: the slots are in this process's memory, and the
        // writer gives back nothing while none is held.
    }
}
