//! [`crate::WebhookStore`] in the SQLite file: deliveries queued by the
//! writer in the transaction of their event ([`queue_deliveries`]);
//! endpoints written on the access side
//! connection, claims and outcomes on the webhook one, each call one
//! transaction; listings on the reader pool.

use futures::future::BoxFuture;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

use crate::webhook::{CHAINED, DELIVERY_COLUMNS, ENDPOINT_COLUMNS, IS_HEAD, clip_error, outcome_columns};
use crate::{
    DeliveryFilter, DeliveryOutcome, DeliveryState, StoreError, WebhookDelivery, WebhookEndpoint, WebhookSecret,
    WebhookStore,
};

/// The session whose events the writer queues deliveries for.
pub(super) struct Queuing<'a> {
    /// Its key in `sessions`.
    pub(super) key: i64,
    pub(super) session_id: &'a str,
    pub(super) bot_id: &'a str,
    pub(super) tenant: &'a str,
    /// The commit's time.
    pub(super) now: u64,
}

/// Queues a delivery of the event at `sequence` (of type `kind`) for each
/// endpoint that wants it, in the writer's transaction; with `if_idle`
/// (a `session_idle`), only when the session has nothing queued as the
/// transaction leaves it.
pub(super) fn queue_deliveries(
    conn: &Connection,
    session: &Queuing<'_>,
    sequence: u64,
    kind: &str,
    if_idle: bool,
) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "INSERT INTO webhook_deliveries (endpoint_id, session_id, sequence, event_type, created_at_ms,
             next_attempt_at_ms)
         SELECT id, ?1, ?2, ?3, ?6, ?6 FROM webhook_endpoints
         WHERE instr(event_types, ',' || ?3 || ',') > 0
           AND (bot_id IS NULL OR bot_id = ?4) AND (tenant IS NULL OR tenant = ?5)
           AND (NOT ?8 OR NOT EXISTS (SELECT 1 FROM queued_submissions WHERE session_key = ?7))
         ORDER BY seq",
    )?
    .execute(params![
        session.session_id,
        sequence,
        kind,
        session.bot_id,
        session.tenant,
        session.now,
        session.key,
        if_idle
    ])
}

fn endpoint_row(row: &Row<'_>) -> rusqlite::Result<(WebhookEndpoint, String)> {
    let types: String = row.get(3)?;
    Ok((
        WebhookEndpoint {
            id: row.get(0)?,
            url: row.get(1)?,
            secrets: Vec::new(),
            event_types: WebhookEndpoint::types_from_stored(&types),
            bot_id: row.get(4)?,
            tenant: row.get(5)?,
            description: row.get(6)?,
            created_at_ms: row.get(7)?,
        },
        row.get(2)?,
    ))
}

fn delivery_row(row: &Row<'_>) -> rusqlite::Result<(WebhookDelivery, String)> {
    Ok((
        WebhookDelivery {
            id: row.get(0)?,
            endpoint_id: row.get(1)?,
            session_id: row.get(2)?,
            sequence: row.get(3)?,
            event_type: row.get(4)?,
            created_at_ms: row.get(5)?,
            state: DeliveryState::Pending,
            attempts: row.get(7)?,
            next_attempt_at_ms: row.get(8)?,
            last_status: row.get(9)?,
            last_error: row.get(10)?,
            finished_at_ms: row.get(11)?,
        },
        row.get(6)?,
    ))
}

/// A delivery whose stored state is one this build knows.
fn with_state((mut delivery, state): (WebhookDelivery, String)) -> Result<WebhookDelivery, StoreError> {
    delivery.state = DeliveryState::parse(&state).ok_or_else(|| StoreError::Corrupt {
        what: format!("webhook delivery {}", delivery.id),
        detail: format!("unknown state '{state}'"),
    })?;
    Ok(delivery)
}

/// An endpoint whose stored secrets decode.
fn with_secrets((mut endpoint, secrets): (WebhookEndpoint, String)) -> Result<WebhookEndpoint, StoreError> {
    endpoint.secrets = serde_json::from_str::<Vec<WebhookSecret>>(&secrets).map_err(|error| StoreError::Corrupt {
        what: format!("the secrets of webhook endpoint '{}'", endpoint.id),
        detail: error.to_string(),
    })?;
    Ok(endpoint)
}

fn put_endpoint(conn: &mut Connection, endpoint: &WebhookEndpoint) -> Result<bool, StoreError> {
    let secrets = crate::job::encode(&endpoint.secrets)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let existed = tx
        .prepare_cached("SELECT 1 FROM webhook_endpoints WHERE id = ?1")
        .and_then(|mut select| select.query_row(params![endpoint.id], |_| Ok(())).optional())
        .map_err(super::sqlite_error)?
        .is_some();
    tx.prepare_cached(
        "INSERT INTO webhook_endpoints (id, url, secrets, event_types, bot_id, tenant, description, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (id) DO UPDATE SET url = excluded.url, secrets = excluded.secrets,
             event_types = excluded.event_types, bot_id = excluded.bot_id, tenant = excluded.tenant,
             description = excluded.description",
    )
    .and_then(|mut insert| {
        insert.execute(params![
            endpoint.id,
            endpoint.url,
            secrets,
            endpoint.stored_types(),
            endpoint.bot_id,
            endpoint.tenant,
            endpoint.description,
            endpoint.created_at_ms
        ])
    })
    .map_err(super::sqlite_error)?;
    tx.commit().map_err(super::sqlite_error)?;
    Ok(existed)
}

fn endpoints(conn: &Connection) -> Result<Vec<WebhookEndpoint>, StoreError> {
    let mut select = conn
        .prepare_cached(&format!(
            "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints ORDER BY seq"
        ))
        .map_err(super::sqlite_error)?;
    let rows = select.query_map([], endpoint_row).map_err(super::sqlite_error)?;
    rows.map(|row| with_secrets(row.map_err(super::sqlite_error)?))
        .collect()
}

fn delete_endpoint(conn: &mut Connection, id: &str) -> Result<bool, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let deleted = tx
        .prepare_cached("DELETE FROM webhook_endpoints WHERE id = ?1")
        .and_then(|mut delete| delete.execute(params![id]))
        .map_err(super::sqlite_error)?;
    tx.prepare_cached("DELETE FROM webhook_deliveries WHERE endpoint_id = ?1")
        .and_then(|mut delete| delete.execute(params![id]))
        .map_err(super::sqlite_error)?;
    tx.commit().map_err(super::sqlite_error)?;
    Ok(deleted > 0)
}

fn claim(
    conn: &mut Connection,
    claimant: &str,
    (now_ms, until_ms): (u64, u64),
    limit: usize,
    chain: usize,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let claimed = {
        let mut update = tx
            .prepare_cached(&format!(
                "UPDATE webhook_deliveries SET claimed_by = ?1, claimed_until_ms = ?3
                 WHERE id IN (
                     WITH heads AS (
                         SELECT d.endpoint_id, d.session_id FROM webhook_deliveries d
                         WHERE d.state = 'pending' AND d.next_attempt_at_ms <= ?2
                           AND (d.claimed_until_ms IS NULL OR d.claimed_until_ms < ?2)
                           AND {IS_HEAD}
                         ORDER BY d.next_attempt_at_ms, d.id LIMIT ?4)
                     SELECT id FROM ({CHAINED}) WHERE n <= ?5)
                 RETURNING {DELIVERY_COLUMNS}"
            ))
            .map_err(super::sqlite_error)?;
        let count = |value: usize| i64::try_from(value).unwrap_or(i64::MAX);
        let rows = update
            .query_map(
                params![claimant, now_ms, until_ms, count(limit), count(chain.max(1))],
                delivery_row,
            )
            .map_err(super::sqlite_error)?;
        let mut claimed = rows
            .map(|row| with_state(row.map_err(super::sqlite_error)?))
            .collect::<Result<Vec<_>, _>>()?;
        claimed.sort_by_key(|delivery| delivery.id);
        claimed
    };
    tx.commit().map_err(super::sqlite_error)?;
    Ok(claimed)
}

fn release(conn: &mut Connection, ids: &[u64], claimant: &str) -> Result<usize, StoreError> {
    let tx = conn.transaction().map_err(super::sqlite_error)?;
    let mut released = 0;
    {
        let mut update = tx
            .prepare_cached(
                "UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until_ms = NULL
                 WHERE id = ?1 AND claimed_by = ?2 AND state = 'pending'",
            )
            .map_err(super::sqlite_error)?;
        for id in ids {
            released += update.execute(params![id, claimant]).map_err(super::sqlite_error)?;
        }
    }
    tx.commit().map_err(super::sqlite_error)?;
    Ok(released)
}

fn settle(
    conn: &mut Connection,
    id: u64,
    claimant: &str,
    now_ms: u64,
    outcome: &DeliveryOutcome,
) -> Result<bool, StoreError> {
    let (state, status, error, next) = outcome_columns(outcome);
    let finished = (state != DeliveryState::Pending).then_some(now_ms);
    let updated = conn
        .prepare_cached(
            "UPDATE webhook_deliveries SET state = ?3, attempts = attempts + 1, last_status = ?4,
                 last_error = ?5, next_attempt_at_ms = coalesce(?6, next_attempt_at_ms), finished_at_ms = ?7,
                 claimed_by = NULL, claimed_until_ms = NULL
             WHERE id = ?1 AND claimed_by = ?2 AND state = 'pending'",
        )
        .and_then(|mut update| {
            update.execute(params![
                id,
                claimant,
                state.as_str(),
                status,
                error.map(clip_error),
                next,
                finished
            ])
        })
        .map_err(super::sqlite_error)?;
    Ok(updated > 0)
}

fn deliveries(
    conn: &Connection,
    endpoint_id: &str,
    filter: &DeliveryFilter,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let mut select = conn
        .prepare_cached(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries
             WHERE endpoint_id = ?1 AND id > ?2 AND (?3 IS NULL OR state = ?3)
             ORDER BY id LIMIT ?4"
        ))
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map(
            params![
                endpoint_id,
                filter
                    .after_id
                    .map_or(0, |after| i64::try_from(after).unwrap_or(i64::MAX)),
                filter.state.map(DeliveryState::as_str),
                i64::try_from(filter.limit).unwrap_or(i64::MAX)
            ],
            delivery_row,
        )
        .map_err(super::sqlite_error)?;
    rows.map(|row| with_state(row.map_err(super::sqlite_error)?)).collect()
}

fn prune(conn: &mut Connection, before_ms: u64) -> Result<u64, StoreError> {
    let deleted = conn
        .prepare_cached("DELETE FROM webhook_deliveries WHERE state <> 'pending' AND finished_at_ms < ?1")
        .and_then(|mut delete| delete.execute(params![before_ms]))
        .map_err(super::sqlite_error)?;
    Ok(deleted as u64)
}

impl WebhookStore for super::SqliteCheckpoint {
    fn put_webhook_endpoint<'a>(&'a self, endpoint: &'a WebhookEndpoint) -> BoxFuture<'a, Result<bool, StoreError>> {
        let endpoint = endpoint.clone();
        Box::pin(self.on_side(&self.access, move |conn| put_endpoint(conn, &endpoint)))
    }

    fn webhook_endpoints(&self) -> BoxFuture<'_, Result<Vec<WebhookEndpoint>, StoreError>> {
        Box::pin(self.read(endpoints))
    }

    fn delete_webhook_endpoint<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let id = id.to_owned();
        Box::pin(self.on_side(&self.access, move |conn| delete_endpoint(conn, &id)))
    }

    fn claim_webhook_deliveries<'a>(
        &'a self,
        claimant: &'a str,
        now_ms: u64,
        until_ms: u64,
        limit: usize,
        chain: usize,
    ) -> BoxFuture<'a, Result<Vec<WebhookDelivery>, StoreError>> {
        let claimant = claimant.to_owned();
        Box::pin(self.on_webhook_side(move |conn| claim(conn, &claimant, (now_ms, until_ms), limit, chain)))
    }

    fn release_webhook_deliveries<'a>(
        &'a self,
        ids: &'a [u64],
        claimant: &'a str,
    ) -> BoxFuture<'a, Result<usize, StoreError>> {
        let (ids, claimant) = (ids.to_vec(), claimant.to_owned());
        Box::pin(self.on_webhook_side(move |conn| release(conn, &ids, &claimant)))
    }

    fn settle_webhook_delivery<'a>(
        &'a self,
        id: u64,
        claimant: &'a str,
        now_ms: u64,
        outcome: &'a DeliveryOutcome,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (claimant, outcome) = (claimant.to_owned(), outcome.clone());
        Box::pin(self.on_webhook_side(move |conn| settle(conn, id, &claimant, now_ms, &outcome)))
    }

    fn webhook_deliveries<'a>(
        &'a self,
        endpoint_id: &'a str,
        filter: &'a DeliveryFilter,
    ) -> BoxFuture<'a, Result<Vec<WebhookDelivery>, StoreError>> {
        let (endpoint_id, filter) = (endpoint_id.to_owned(), filter.clone());
        Box::pin(self.read(move |conn| deliveries(conn, &endpoint_id, &filter)))
    }

    fn prune_webhook_deliveries(&self, before_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(self.on_webhook_side(move |conn| prune(conn, before_ms)))
    }
}
