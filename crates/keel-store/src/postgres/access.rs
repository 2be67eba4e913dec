//! [`crate::AccessStore`] in the PostgreSQL database: API keys, the access
//! revision and budgets, each call one statement on a pooled connection
//! (a change and its revision bump in one statement, so in one
//! transaction); the usage ledger, written by the writer in the statement
//! that appends the events reporting the usage (see `statements.rs`), and
//! read here.

use futures::future::BoxFuture;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::pg_error;
use super::slot_sql::{DROP_STALE_SLOTS, GIVE_BACK, HELD_SLOTS, LOCK_TENANT_SLOTS, TAKE_SLOT};
use super::statements::{int, uint};
use crate::{
    AccessStore, Admission, ApiKeyRecord, BudgetTarget, Ledger, LedgerRead, SlotClaim, StoreError, TurnSlot,
    UsageBucket,
};
use keel_protocol::TokenUsage;

/// Stores a key unless its id or hash is taken, bumping the revision if it
/// did; returns whether it did.
const CREATE_KEY: &str = "WITH inserted AS (
         INSERT INTO api_keys (id, tenant, name, scopes, hash, created_at_ms, last_used_at_ms, expires_at_ms,
                               revoked_at_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING RETURNING 1
     ), bumped AS (
         UPDATE access_revision SET revision = revision + 1 WHERE EXISTS (SELECT 1 FROM inserted)
     )
     SELECT EXISTS (SELECT 1 FROM inserted)";

/// Revokes a key not revoked yet (bumping the revision if it did);
/// returns whether the key exists.
const REVOKE_KEY: &str = "WITH revoked AS (
         UPDATE api_keys SET revoked_at_ms = $2 WHERE id = $1 AND revoked_at_ms IS NULL RETURNING 1
     ), bumped AS (
         UPDATE access_revision SET revision = revision + 1 WHERE EXISTS (SELECT 1 FROM revoked)
     )
     SELECT EXISTS (SELECT 1 FROM revoked) OR EXISTS (SELECT 1 FROM api_keys WHERE id = $1)";

/// Moves keys' last use forward to the latest of the times given for each.
const TOUCH_KEYS: &str = "UPDATE api_keys k SET last_used_at_ms = u.at
     FROM (SELECT id, max(at) AS at FROM unnest($1::text[], $2::int8[]) AS t(id, at) GROUP BY id) u
     WHERE k.id = u.id AND (k.last_used_at_ms IS NULL OR k.last_used_at_ms < u.at)";

const SET_BUDGET: &str = "WITH set AS (
         INSERT INTO budgets (kind, target, budget) VALUES ($1, $2, $3)
         ON CONFLICT (kind, target) DO UPDATE SET budget = excluded.budget
     )
     UPDATE access_revision SET revision = revision + 1";

const REMOVE_BUDGET: &str = "WITH removed AS (DELETE FROM budgets WHERE kind = $1 AND target = $2)
     UPDATE access_revision SET revision = revision + 1";

/// A target's hours of usage from `$3` on, oldest first.
const USAGE_BUCKETS: &str = "SELECT input_tokens, cached_input_tokens, output_tokens, reasoning_tokens, hour_ms
     FROM usage_hours WHERE kind = $1 AND target = $2 AND hour_ms >= $3 ORDER BY hour_ms";

/// A target's usage ever.
const USAGE_TOTAL: &str = "SELECT coalesce(sum(input_tokens), 0)::int8, coalesce(sum(cached_input_tokens), 0)::int8,
            coalesce(sum(output_tokens), 0)::int8, coalesce(sum(reasoning_tokens), 0)::int8
     FROM usage_hours WHERE kind = $1 AND target = $2";

impl AccessStore for super::PostgresCheckpoint {
    fn create_api_key<'a>(&'a self, key: &'a ApiKeyRecord) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let scopes = crate::job::encode(&key.scopes)?;
            let client = self.reader().await?;
            let statement = client.prepare_cached(CREATE_KEY).await.map_err(pg_error)?;
            let row = client
                .query_one(
                    &statement,
                    &[
                        &key.id,
                        &key.tenant,
                        &key.name,
                        &scopes,
                        &key.hash,
                        &int(key.created_at_ms),
                        &key.last_used_at_ms.map(int),
                        &key.expires_at_ms.map(int),
                        &key.revoked_at_ms.map(int),
                    ],
                )
                .await
                .map_err(pg_error)?;
            if !row.try_get::<_, bool>(0).map_err(pg_error)? {
                return Err(StoreError::Exists(key.id.clone()));
            }
            Ok(())
        })
    }

    fn api_keys(&self) -> BoxFuture<'_, Result<Vec<ApiKeyRecord>, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached(
                    "SELECT id, tenant, name, scopes, hash, created_at_ms, last_used_at_ms, expires_at_ms,
                            revoked_at_ms
                     FROM api_keys ORDER BY created_at_ms, seq",
                )
                .await
                .map_err(pg_error)?;
            let rows = client.query(&statement, &[]).await.map_err(pg_error)?;
            rows.iter().map(key_row).collect()
        })
    }

    fn revoke_api_key<'a>(&'a self, id: &'a str, at_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client.prepare_cached(REVOKE_KEY).await.map_err(pg_error)?;
            let row = client
                .query_one(&statement, &[&id, &int(at_ms)])
                .await
                .map_err(pg_error)?;
            row.try_get(0).map_err(pg_error)
        })
    }

    fn touch_api_keys<'a>(&'a self, used: &'a [(String, u64)]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if used.is_empty() {
                return Ok(());
            }
            let ids: Vec<&str> = used.iter().map(|(id, _)| id.as_str()).collect();
            let times: Vec<i64> = used.iter().map(|(_, at)| int(*at)).collect();
            let client = self.reader().await?;
            let statement = client.prepare_cached(TOUCH_KEYS).await.map_err(pg_error)?;
            client.execute(&statement, &[&ids, &times]).await.map_err(pg_error)?;
            Ok(())
        })
    }

    fn access_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached("SELECT revision FROM access_revision")
                .await
                .map_err(pg_error)?;
            let row = client.query_one(&statement, &[]).await.map_err(pg_error)?;
            Ok(uint(row.try_get(0).map_err(pg_error)?))
        })
    }

    fn budgets(&self) -> BoxFuture<'_, Result<Vec<(BudgetTarget, String)>, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached("SELECT kind, target, budget FROM budgets ORDER BY kind DESC, target")
                .await
                .map_err(pg_error)?;
            let rows = client.query(&statement, &[]).await.map_err(pg_error)?;
            let mut budgets = Vec::with_capacity(rows.len());
            for row in &rows {
                let kind: String = row.try_get(0).map_err(pg_error)?;
                match BudgetTarget::from_key(&kind, row.try_get(1).map_err(pg_error)?) {
                    Some(target) => budgets.push((target, row.try_get(2).map_err(pg_error)?)),
                    None => tracing::warn!(kind, "a budget of an unknown kind is ignored"),
                }
            }
            Ok(budgets)
        })
    }

    fn set_budget<'a>(
        &'a self,
        target: &'a BudgetTarget,
        budget_json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let (kind, id) = target.key();
            let client = self.reader().await?;
            match budget_json {
                Some(budget) => {
                    let statement = client.prepare_cached(SET_BUDGET).await.map_err(pg_error)?;
                    client.execute(&statement, &[&kind, &id, &budget]).await
                }
                None => {
                    let statement = client.prepare_cached(REMOVE_BUDGET).await.map_err(pg_error)?;
                    client.execute(&statement, &[&kind, &id]).await
                }
            }
            .map_err(pg_error)?;
            Ok(())
        })
    }

    fn usage_buckets<'a>(
        &'a self,
        target: &'a BudgetTarget,
        since_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<UsageBucket>, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client.prepare_cached(USAGE_BUCKETS).await.map_err(pg_error)?;
            read_buckets(&client, &statement, target, since_ms).await
        })
    }

    fn usage_total<'a>(&'a self, target: &'a BudgetTarget) -> BoxFuture<'a, Result<TokenUsage, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client.prepare_cached(USAGE_TOTAL).await.map_err(pg_error)?;
            read_total(&client, &statement, target).await
        })
    }

    fn running_turns<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client.prepare_cached(HELD_SLOTS).await.map_err(pg_error)?;
            let row = client.query_one(&statement, &[&tenant]).await.map_err(pg_error)?;
            Ok(uint(row.try_get(0).map_err(pg_error)?))
        })
    }

    fn reserve_turn<'a>(
        &'a self,
        tenant: &'a str,
        session_id: &'a str,
        cap: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<TurnSlot, StoreError>> {
        let claim = SlotClaim {
            tenant,
            session_id,
            cap,
            now_ms,
        };
        self.expect_turn_slots();
        Box::pin(async move { claim_slot(&self.admitter().await?, &claim).await })
    }

    fn admission<'a>(
        &'a self,
        reads: &'a [LedgerRead<'a>],
        claim: Option<SlotClaim<'a>>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        if claim.is_some() {
            self.expect_turn_slots();
        }
        Box::pin(async move {
            // Reads alone (a step gate, a budget's view) take a reader: the
            // admissions' few connections are for the slots' transactions.
            let client = match claim {
                Some(_) => self.admitter().await?,
                None => self.reader().await?,
            };
            let buckets = client.prepare_cached(USAGE_BUCKETS).await.map_err(pg_error)?;
            let total = client.prepare_cached(USAGE_TOTAL).await.map_err(pg_error)?;
            // Polled in order, so sent in order on the one connection: the
            // reads go before the slot's transaction (they do not lengthen
            // its lock), and the whole admission is one round trip.
            let ledgers = futures::future::try_join_all(reads.iter().map(|read| async {
                let total = async {
                    match read.with_total {
                        true => read_total(&client, &total, read.target).await.map(Some),
                        false => Ok(None),
                    }
                };
                let (buckets, total) =
                    futures::try_join!(read_buckets(&client, &buckets, read.target, read.since_ms), total)?;
                Ok::<_, StoreError>(Ledger { buckets, total })
            }));
            let slot = async {
                match claim {
                    Some(claim) => claim_slot(&client, &claim).await.map(Some),
                    None => Ok(None),
                }
            };
            let (ledgers, slot) = futures::try_join!(ledgers, slot)?;
            Ok(Admission { ledgers, slot })
        })
    }

    fn give_back_turn<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client.prepare_cached(GIVE_BACK).await.map_err(pg_error)?;
            client.execute(&statement, &[&session_id]).await.map_err(pg_error)?;
            Ok(())
        })
    }

    fn expect_turn_slots(&self) {
        self.slots_in_use.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Takes a slot for `claim` (see [`AccessStore::reserve_turn`]). Most
/// admissions find room; stale slots are looked for only when they might
/// be what fills the cap, in a second transaction.
async fn claim_slot(client: &deadpool_postgres::Object, claim: &SlotClaim<'_>) -> Result<TurnSlot, StoreError> {
    match take_slot(client, claim, false).await? {
        TurnSlot::Full { .. } => take_slot(client, claim, true).await,
        slot => Ok(slot),
    }
}

/// The settings of the admissions' connections ([`for_admissions`]):
/// their commits do not wait for the disk (see [`take_slot`]), and the
/// slot table is read by plain index scans. Every admission inserts a row
/// and every turn's end deletes one, so between vacuums its indexes hold
/// many dead entries; a plain index scan marks those it passes as dead,
/// and the next scan skips them, where a bitmap scan (which the planner
/// picks for a fresh table) visits every one, each time.
const ADMISSION_SETTINGS: &str = "-c synchronous_commit=off -c enable_bitmapscan=off";

/// `config` for the admissions' connections ([`ADMISSION_SETTINGS`]).
pub(super) fn for_admissions(config: &tokio_postgres::Config) -> tokio_postgres::Config {
    super::with_settings(config, ADMISSION_SETTINGS)
}

/// One admission's transaction (see [`AccessStore::reserve_turn`]), its
/// stale slots dropped first when `drop_stale`.
///
/// It is sent whole, one round trip: the server runs it in order, so the
/// slots are counted (read committed, a snapshot of the statement's own)
/// only once the lock is held, seeing every slot another node's admission
/// took before letting it go, and the lock is held only while the server
/// works, never across a round trip. A statement that fails aborts it, and
/// the `COMMIT` then rolls it back. Its commit need not wait for the disk
/// (the admissions' connections do not): the write that queues the
/// admitted submission, which the client is answered after, comes later in
/// the WAL, so no slot is lost whose submission is kept.
async fn take_slot(
    client: &deadpool_postgres::Object,
    claim: &SlotClaim<'_>,
    drop_stale: bool,
) -> Result<TurnSlot, StoreError> {
    let SlotClaim {
        tenant,
        session_id,
        cap,
        now_ms,
    } = *claim;
    let lock = client.prepare_cached(LOCK_TENANT_SLOTS).await.map_err(pg_error)?;
    let take = client.prepare_cached(TAKE_SLOT).await.map_err(pg_error)?;
    let stale = client.prepare_cached(DROP_STALE_SLOTS).await.map_err(pg_error)?;
    let stale_before = int(now_ms.saturating_sub(crate::TURN_SLOT_GRACE_MS));
    let (now, cap) = (int(now_ms), int(cap));
    let lock_parameters: [&(dyn ToSql + Sync); 1] = [&tenant];
    let stale_parameters: [&(dyn ToSql + Sync); 2] = [&tenant, &stale_before];
    let take_parameters: [&(dyn ToSql + Sync); 4] = [&session_id, &tenant, &now, &cap];
    let dropped = async {
        if drop_stale {
            client.execute(&stale, &stale_parameters).await.map(drop)
        } else {
            Ok(())
        }
    };
    let (begun, locked, dropped, row, committed) = futures::join!(
        client.batch_execute("BEGIN"),
        client.execute(&lock, &lock_parameters),
        dropped,
        client.query_opt(&take, &take_parameters),
        client.batch_execute("COMMIT"),
    );
    begun.map_err(pg_error)?;
    locked.map_err(pg_error)?;
    dropped.map_err(pg_error)?;
    let row = row.map_err(pg_error)?;
    committed.map_err(pg_error)?;
    let Some(row) = row else {
        return Err(StoreError::UnknownSession(session_id.to_owned()));
    };
    let held_already: bool = row.try_get(0).map_err(pg_error)?;
    let held: i64 = row.try_get(1).map_err(pg_error)?;
    let taken: bool = row.try_get(2).map_err(pg_error)?;
    Ok(if held_already {
        TurnSlot::Held
    } else if taken {
        TurnSlot::Taken
    } else {
        TurnSlot::Full { held: uint(held) }
    })
}

/// `target`'s hours of usage from `since_ms` on ([`USAGE_BUCKETS`]).
async fn read_buckets(
    client: &deadpool_postgres::Object,
    statement: &tokio_postgres::Statement,
    target: &BudgetTarget,
    since_ms: u64,
) -> Result<Vec<UsageBucket>, StoreError> {
    let (kind, id) = target.key();
    let rows = client
        .query(statement, &[&kind, &id, &int(since_ms)])
        .await
        .map_err(pg_error)?;
    rows.iter()
        .map(|row| {
            Ok(UsageBucket {
                usage: usage_row(row)?,
                hour_start_ms: uint(row.try_get(4).map_err(pg_error)?),
            })
        })
        .collect()
}

/// `target`'s usage ever ([`USAGE_TOTAL`]).
async fn read_total(
    client: &deadpool_postgres::Object,
    statement: &tokio_postgres::Statement,
    target: &BudgetTarget,
) -> Result<TokenUsage, StoreError> {
    let (kind, id) = target.key();
    let row = client.query_one(statement, &[&kind, &id]).await.map_err(pg_error)?;
    usage_row(&row)
}

/// A key's row, its scopes decoded.
fn key_row(row: &Row) -> Result<ApiKeyRecord, StoreError> {
    let id: String = row.try_get(0).map_err(pg_error)?;
    let scopes: String = row.try_get(3).map_err(pg_error)?;
    let scopes = serde_json::from_str(&scopes).map_err(|error| StoreError::Corrupt {
        what: format!("scopes of API key '{id}'"),
        detail: error.to_string(),
    })?;
    let optional = |index| -> Result<Option<u64>, StoreError> {
        Ok(row.try_get::<_, Option<i64>>(index).map_err(pg_error)?.map(uint))
    };
    Ok(ApiKeyRecord {
        tenant: row.try_get(1).map_err(pg_error)?,
        name: row.try_get(2).map_err(pg_error)?,
        scopes,
        hash: row.try_get(4).map_err(pg_error)?,
        created_at_ms: uint(row.try_get(5).map_err(pg_error)?),
        last_used_at_ms: optional(6)?,
        expires_at_ms: optional(7)?,
        revoked_at_ms: optional(8)?,
        id,
    })
}

/// The usage in a row's first four columns (input, cached input, output, reasoning).
fn usage_row(row: &Row) -> Result<TokenUsage, StoreError> {
    let column = |index| -> Result<u64, StoreError> { Ok(uint(row.try_get(index).map_err(pg_error)?)) };
    Ok(TokenUsage {
        input_tokens: column(0)?,
        cached_input_tokens: column(1)?,
        output_tokens: column(2)?,
        reasoning_tokens: column(3)?,
    })
}
