//! [`crate::WebhookStore`] in the PostgreSQL database: deliveries queued
//! by the writer in the statement after the events' (`WEBHOOK_QUEUE` in
//! `statements.rs`, same transaction); everything else one statement on a
//! pooled connection. A claim locks the rows it takes (`SKIP LOCKED`), so
//! nodes claiming at once never take the same delivery.

use futures::future::BoxFuture;
use tokio_postgres::Row;

use super::pg_error;
use super::statements::{int, uint};
use crate::webhook::{CHAINED, DELIVERY_COLUMNS, ENDPOINT_COLUMNS, IS_HEAD, clip_error, outcome_columns};
use crate::{
    DeliveryFilter, DeliveryOutcome, DeliveryState, StoreError, WebhookDelivery, WebhookEndpoint, WebhookSecret,
    WebhookStore,
};

fn endpoint(row: &Row) -> Result<WebhookEndpoint, StoreError> {
    let id: String = row.try_get(0).map_err(pg_error)?;
    let secrets: String = row.try_get(2).map_err(pg_error)?;
    let types: String = row.try_get(3).map_err(pg_error)?;
    let secrets = serde_json::from_str::<Vec<WebhookSecret>>(&secrets).map_err(|error| StoreError::Corrupt {
        what: format!("the secrets of webhook endpoint '{id}'"),
        detail: error.to_string(),
    })?;
    Ok(WebhookEndpoint {
        url: row.try_get(1).map_err(pg_error)?,
        secrets,
        event_types: WebhookEndpoint::types_from_stored(&types),
        bot_id: row.try_get(4).map_err(pg_error)?,
        tenant: row.try_get(5).map_err(pg_error)?,
        description: row.try_get(6).map_err(pg_error)?,
        created_at_ms: uint(row.try_get(7).map_err(pg_error)?),
        id,
    })
}

fn delivery(row: &Row) -> Result<WebhookDelivery, StoreError> {
    let id = uint(row.try_get(0).map_err(pg_error)?);
    let state: String = row.try_get(6).map_err(pg_error)?;
    let state = DeliveryState::parse(&state).ok_or_else(|| StoreError::Corrupt {
        what: format!("webhook delivery {id}"),
        detail: format!("unknown state '{state}'"),
    })?;
    let attempts: i32 = row.try_get(7).map_err(pg_error)?;
    let status: Option<i32> = row.try_get(9).map_err(pg_error)?;
    Ok(WebhookDelivery {
        id,
        endpoint_id: row.try_get(1).map_err(pg_error)?,
        session_id: row.try_get(2).map_err(pg_error)?,
        sequence: uint(row.try_get(3).map_err(pg_error)?),
        event_type: row.try_get(4).map_err(pg_error)?,
        created_at_ms: uint(row.try_get(5).map_err(pg_error)?),
        state,
        attempts: u32::try_from(attempts).unwrap_or(0),
        next_attempt_at_ms: uint(row.try_get(8).map_err(pg_error)?),
        last_status: status.and_then(|status| u16::try_from(status).ok()),
        last_error: row.try_get(10).map_err(pg_error)?,
        finished_at_ms: row.try_get::<_, Option<i64>>(11).map_err(pg_error)?.map(uint),
    })
}

impl WebhookStore for super::PostgresCheckpoint {
    fn put_webhook_endpoint<'a>(&'a self, endpoint: &'a WebhookEndpoint) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let secrets = crate::job::encode(&endpoint.secrets)?;
            let client = self.reader().await?;
            // `xmax` is set on a row an upsert updated, not on one it inserted.
            let statement = client
                .prepare_cached(
                    "INSERT INTO webhook_endpoints (id, url, secrets, event_types, bot_id, tenant, description,
                         created_at_ms)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (id) DO UPDATE SET url = excluded.url, secrets = excluded.secrets,
                         event_types = excluded.event_types, bot_id = excluded.bot_id, tenant = excluded.tenant,
                         description = excluded.description
                     RETURNING xmax <> 0",
                )
                .await
                .map_err(pg_error)?;
            let row = client
                .query_one(
                    &statement,
                    &[
                        &endpoint.id,
                        &endpoint.url,
                        &secrets,
                        &endpoint.stored_types(),
                        &endpoint.bot_id,
                        &endpoint.tenant,
                        &endpoint.description,
                        &int(endpoint.created_at_ms),
                    ],
                )
                .await
                .map_err(pg_error)?;
            row.try_get(0).map_err(pg_error)
        })
    }

    fn webhook_endpoints(&self) -> BoxFuture<'_, Result<Vec<WebhookEndpoint>, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints ORDER BY seq"
                ))
                .await
                .map_err(pg_error)?;
            let rows = client.query(&statement, &[]).await.map_err(pg_error)?;
            rows.iter().map(endpoint).collect()
        })
    }

    fn delete_webhook_endpoint<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached(
                    "WITH deliveries AS (DELETE FROM webhook_deliveries WHERE endpoint_id = $1)
                     DELETE FROM webhook_endpoints WHERE id = $1",
                )
                .await
                .map_err(pg_error)?;
            let deleted = client.execute(&statement, &[&id]).await.map_err(pg_error)?;
            Ok(deleted > 0)
        })
    }

    fn claim_webhook_deliveries<'a>(
        &'a self,
        claimant: &'a str,
        now_ms: u64,
        until_ms: u64,
        limit: usize,
        chain: usize,
    ) -> BoxFuture<'a, Result<Vec<WebhookDelivery>, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            // The heads are locked (another node skips them); the rest of a
            // chain cannot be another's head while its head is pending.
            let statement = client
                .prepare_cached(&format!(
                    "WITH heads AS (
                         SELECT d.endpoint_id, d.session_id FROM webhook_deliveries d
                         WHERE d.state = 'pending' AND d.next_attempt_at_ms <= $2
                           AND (d.claimed_until_ms IS NULL OR d.claimed_until_ms < $2)
                           AND {IS_HEAD}
                         ORDER BY d.next_attempt_at_ms, d.id LIMIT $4
                         FOR UPDATE SKIP LOCKED
                     ), due AS (
                         SELECT id FROM ({CHAINED}) chained WHERE n <= $5
                     )
                     UPDATE webhook_deliveries w SET claimed_by = $1, claimed_until_ms = $3
                     FROM due WHERE w.id = due.id
                     RETURNING {}",
                    DELIVERY_COLUMNS
                        .split(", ")
                        .map(|column| format!("w.{column}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .await
                .map_err(pg_error)?;
            let count = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    &statement,
                    &[
                        &claimant,
                        &int(now_ms),
                        &int(until_ms),
                        &count(limit),
                        &count(chain.max(1)),
                    ],
                )
                .await
                .map_err(pg_error)?;
            let mut claimed = rows.iter().map(delivery).collect::<Result<Vec<_>, _>>()?;
            claimed.sort_by_key(|delivery| delivery.id);
            Ok(claimed)
        })
    }

    fn release_webhook_deliveries<'a>(
        &'a self,
        ids: &'a [u64],
        claimant: &'a str,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached(
                    "UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until_ms = NULL
                     WHERE id = ANY($1) AND claimed_by = $2 AND state = 'pending'",
                )
                .await
                .map_err(pg_error)?;
            let ids: Vec<i64> = ids.iter().map(|&id| int(id)).collect();
            let released = client.execute(&statement, &[&ids, &claimant]).await.map_err(pg_error)?;
            Ok(usize::try_from(released).unwrap_or(usize::MAX))
        })
    }

    fn settle_webhook_delivery<'a>(
        &'a self,
        id: u64,
        claimant: &'a str,
        now_ms: u64,
        outcome: &'a DeliveryOutcome,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let (state, status, error, next) = outcome_columns(outcome);
            let finished = (state != DeliveryState::Pending).then_some(int(now_ms));
            let client = self.reader().await?;
            let statement = client
                .prepare_cached(
                    "UPDATE webhook_deliveries SET state = $3, attempts = attempts + 1, last_status = $4,
                         last_error = $5, next_attempt_at_ms = coalesce($6, next_attempt_at_ms),
                         finished_at_ms = $7, claimed_by = NULL, claimed_until_ms = NULL
                     WHERE id = $1 AND claimed_by = $2 AND state = 'pending'",
                )
                .await
                .map_err(pg_error)?;
            let updated = client
                .execute(
                    &statement,
                    &[
                        &int(id),
                        &claimant,
                        &state.as_str(),
                        &status.map(i32::from),
                        &error.map(clip_error),
                        &next.map(int),
                        &finished,
                    ],
                )
                .await
                .map_err(pg_error)?;
            Ok(updated > 0)
        })
    }

    fn webhook_deliveries<'a>(
        &'a self,
        endpoint_id: &'a str,
        filter: &'a DeliveryFilter,
    ) -> BoxFuture<'a, Result<Vec<WebhookDelivery>, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
                     WHERE endpoint_id = $1 AND id > $2 AND ($3::text IS NULL OR state = $3)
                     ORDER BY id LIMIT $4"
                ))
                .await
                .map_err(pg_error)?;
            let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
            let rows = client
                .query(
                    &statement,
                    &[
                        &endpoint_id,
                        &int(filter.after_id.unwrap_or(0)),
                        &filter.state.map(DeliveryState::as_str),
                        &limit,
                    ],
                )
                .await
                .map_err(pg_error)?;
            rows.iter().map(delivery).collect()
        })
    }

    fn prune_webhook_deliveries(&self, before_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            let client = self.reader().await?;
            let statement = client
                .prepare_cached("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND finished_at_ms < $1")
                .await
                .map_err(pg_error)?;
            client.execute(&statement, &[&int(before_ms)]).await.map_err(pg_error)
        })
    }
}
