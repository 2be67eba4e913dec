//! Reads, on connections from the pool (never the writer's).
//!
//! A read that needs several statements to agree (a session's row, its
//! history and its queue) runs them in one read-only `REPEATABLE READ`
//! transaction, so they all see one commit; its statements are sent
//! together (pipelined).

use deadpool_postgres::Object;
use tokio_postgres::IsolationLevel;
use tokio_postgres::Row;

use super::pg_error;
use super::statements::{int, uint};
use crate::codec;
use crate::rows::{
    PageCollector, StoredJson, SummaryRow, apply_history_row, decode, decode_batch, filter_clause, take_after,
};
use crate::{
    Checkpoint, EventPage, EventPageRequest, KeyedSubmission, MAX_EVENT_PAGE, QueuedSubmission, SessionFilter,
    SessionListPage, SessionState, SessionSummary, StoreError, TurnExecution,
};
use keel_protocol::{Event, RecordedEvent, TranscriptItem};

/// Parameters of a statement.
type SqlParams<'a, const N: usize> = [&'a (dyn tokio_postgres::types::ToSql + Sync); N];

/// The rows of the log that changed the history, oldest first.
const HISTORY_ROWS: &str = "SELECT l.first_sequence, l.last_sequence, l.history_cut, l.history
     FROM log l JOIN sessions s ON s.key = l.session_key
     WHERE s.id = $1 AND (l.history IS NOT NULL OR l.history_cut IS NOT NULL) AND l.first_sequence <= $2
     ORDER BY l.first_sequence, l.id";

pub(super) async fn load(client: &mut Object, session_id: &str) -> Result<Option<SessionState>, StoreError> {
    let session = client
        .prepare_cached(
            "SELECT checkpoint, execution, last_sequence, transcript_len, tenant FROM sessions WHERE id = $1",
        )
        .await
        .map_err(pg_error)?;
    let history = client.prepare_cached(HISTORY_ROWS).await.map_err(pg_error)?;
    let queue = client
        .prepare_cached(
            "SELECT q.id, q.submission FROM queued_submissions q JOIN sessions s ON s.key = q.session_key
             WHERE s.id = $1 ORDER BY q.sequence",
        )
        .await
        .map_err(pg_error)?;
    let tx = snapshot(client).await?;
    let everything = i64::MAX;
    let (by_id, by_id_and_bound): (SqlParams<'_, 1>, SqlParams<'_, 2>) = ([&session_id], [&session_id, &everything]);
    let (row, history_rows, queue_rows) = futures::try_join!(
        tx.query_opt(&session, &by_id),
        tx.query(&history, &by_id_and_bound),
        tx.query(&queue, &by_id),
    )
    .map_err(pg_error)?;
    tx.commit().await.map_err(pg_error)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let what = || format!("checkpoint of session '{session_id}'");
    let mut checkpoint: Checkpoint = decode(&stored(&row, 0)?, what)?;
    // The stored tenant stands, whatever a later checkpoint says.
    checkpoint.session_context.tenant = row.try_get(4).map_err(pg_error)?;
    let execution: Option<TurnExecution> = optional(&row, 1)?.map(|json| decode(&json, what)).transpose()?;
    let last_sequence = uint(row.try_get(2).map_err(pg_error)?);
    let transcript_len = uint(row.try_get(3).map_err(pg_error)?);
    let mut transcript = Vec::new();
    for row in &history_rows {
        let first_sequence = uint(row.try_get(0).map_err(pg_error)?);
        let cut = row.try_get::<_, Option<i64>>(2).map_err(pg_error)?.map(uint);
        apply_history_row(&mut transcript, session_id, first_sequence, cut, optional(row, 3)?)?;
    }
    if transcript.len() as u64 != transcript_len {
        return Err(StoreError::Corrupt {
            what: format!("history of session '{session_id}'"),
            detail: format!("{} items stored, {transcript_len} expected", transcript.len()),
        });
    }
    let mut queued = Vec::with_capacity(queue_rows.len());
    for row in &queue_rows {
        let id: String = row.try_get(0).map_err(pg_error)?;
        let submission: QueuedSubmission = decode(&stored(row, 1)?, || {
            format!("queued submission {id} of session '{session_id}'")
        })?;
        queued.push(submission);
    }
    Ok(Some(SessionState {
        checkpoint,
        transcript,
        execution,
        last_sequence,
        queued,
    }))
}

/// A read-only transaction whose statements all see one snapshot.
async fn snapshot(client: &mut Object) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
        .map_err(pg_error)
}

/// The history of the batches that end at or before `at_sequence`.
pub(super) async fn history_until(
    client: &mut Object,
    session_id: &str,
    at_sequence: u64,
) -> Result<Option<Vec<TranscriptItem>>, StoreError> {
    let session = client
        .prepare_cached("SELECT last_sequence FROM sessions WHERE id = $1")
        .await
        .map_err(pg_error)?;
    let history = client.prepare_cached(HISTORY_ROWS).await.map_err(pg_error)?;
    // Rows that only extended the history (no events) have an empty range
    // (`first_sequence` one past `last_sequence`): they belong to the
    // history from that point on. Candidates start at most one past the
    // point.
    let bound = int(at_sequence).saturating_add(1);
    let tx = snapshot(client).await?;
    let (by_id, by_id_and_bound): (SqlParams<'_, 1>, SqlParams<'_, 2>) = ([&session_id], [&session_id, &bound]);
    let (row, rows) =
        futures::try_join!(tx.query_opt(&session, &by_id), tx.query(&history, &by_id_and_bound),).map_err(pg_error)?;
    tx.commit().await.map_err(pg_error)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let last_sequence = uint(row.try_get(0).map_err(pg_error)?);
    if at_sequence > last_sequence {
        return Err(StoreError::Invalid(format!(
            "session '{session_id}' has {last_sequence} events, not {at_sequence}"
        )));
    }
    let mut transcript = Vec::new();
    for row in &rows {
        let first_sequence = uint(row.try_get(0).map_err(pg_error)?);
        let last = uint(row.try_get(1).map_err(pg_error)?);
        let cut = row.try_get::<_, Option<i64>>(2).map_err(pg_error)?.map(uint);
        if last > at_sequence && first_sequence > at_sequence {
            // A batch written after the point.
            continue;
        }
        if last > at_sequence {
            return Err(StoreError::Invalid(format!(
                "event {at_sequence} of session '{session_id}' was written with events {first_sequence} to {last}, \
                 whose history cannot be split; fork at {} or {last}",
                first_sequence.saturating_sub(1)
            )));
        }
        apply_history_row(&mut transcript, session_id, first_sequence, cut, optional(row, 3)?)?;
    }
    Ok(Some(transcript))
}

/// Whether the session exists (to tell an empty read from an unknown
/// session).
async fn exists(client: &Object, session_id: &str) -> Result<bool, StoreError> {
    let select = client
        .prepare_cached("SELECT 1 FROM sessions WHERE id = $1")
        .await
        .map_err(pg_error)?;
    Ok(client
        .query_opt(&select, &[&session_id])
        .await
        .map_err(pg_error)?
        .is_some())
}

/// The events after `after`, oldest first, at most `limit`.
pub(super) async fn events_after(
    client: &Object,
    session_id: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let limit = limit.min(MAX_EVENT_PAGE);
    // Every row holds at least one event after `after`, so `limit` rows
    // are enough.
    // The scan starts at the row holding `after + 1` (the last row that
    // starts at or before it: rows never overlap), found in the index, so
    // the tail of a long log costs what its head does.
    let select = client
        .prepare_cached(
            "WITH s AS (SELECT key FROM sessions WHERE id = $1)
             SELECT first_sequence, last_sequence, recorded_at_ms, events FROM log
             WHERE session_key = (SELECT key FROM s)
               AND first_sequence >= COALESCE(
                   (SELECT MAX(first_sequence) FROM log
                    WHERE session_key = (SELECT key FROM s) AND first_sequence <= $4), 0)
               AND last_sequence > $2 AND last_sequence >= first_sequence
             ORDER BY first_sequence, id LIMIT $3",
        )
        .await
        .map_err(pg_error)?;
    let rows = client
        .query(
            &select,
            &[
                &session_id,
                &int(after),
                &(limit.max(1) as i64),
                &int(after.saturating_add(1)),
            ],
        )
        .await
        .map_err(pg_error)?;
    if rows.is_empty() && !exists(client, session_id).await? {
        return Err(StoreError::UnknownSession(session_id.to_owned()));
    }
    let mut events = Vec::with_capacity(limit.min(1024));
    for row in &rows {
        let (_, _, recorded_at_ms, batch) = log_row(row, session_id)?;
        if !take_after(&mut events, limit, after, recorded_at_ms, batch) {
            return Ok(events);
        }
    }
    Ok(events)
}

/// A log row's bounds, commit time and events with their sequences.
type LogRow = (u64, u64, u64, Vec<(u64, Event)>);

/// Reads a log row (`first_sequence, last_sequence, recorded_at_ms,
/// events`), checking its events against its bounds.
fn log_row(row: &Row, session_id: &str) -> Result<LogRow, StoreError> {
    let first = uint(row.try_get(0).map_err(pg_error)?);
    let last = uint(row.try_get(1).map_err(pg_error)?);
    let recorded_at_ms = uint(row.try_get(2).map_err(pg_error)?);
    let events = decode_batch(session_id, first, last, &stored(row, 3)?)?;
    Ok((first, last, recorded_at_ms, events))
}

pub(super) async fn event_page(
    client: &Object,
    session_id: &str,
    request: EventPageRequest,
) -> Result<EventPage, StoreError> {
    let limit = request.limit.min(MAX_EVENT_PAGE);
    let before = request.before_sequence.map_or(i64::MAX, int);
    // Every row holds at least one event before the bound: `limit + 1`
    // rows hold the page and tell whether there is more.
    let select = client
        .prepare_cached(
            "SELECT first_sequence, last_sequence, recorded_at_ms, events FROM log
             WHERE session_key = (SELECT key FROM sessions WHERE id = $1)
               AND first_sequence < $2 AND last_sequence >= first_sequence
             ORDER BY first_sequence DESC, id DESC LIMIT $3",
        )
        .await
        .map_err(pg_error)?;
    let rows = client
        .query(&select, &[&session_id, &before, &(limit as i64 + 1)])
        .await
        .map_err(pg_error)?;
    if rows.is_empty() && !exists(client, session_id).await? {
        return Err(StoreError::UnknownSession(session_id.to_owned()));
    }
    let mut page = PageCollector::new(limit, uint(before));
    for row in &rows {
        if page.full() {
            break;
        }
        let (_, _, recorded_at_ms, batch) = log_row(row, session_id)?;
        if !page.take(recorded_at_ms, batch) {
            break;
        }
    }
    Ok(page.finish())
}

/// The submission stored under `idempotency_key`, if any.
pub(super) async fn keyed_submission(
    client: &Object,
    session_id: &str,
    idempotency_key: &str,
) -> Result<Option<KeyedSubmission>, StoreError> {
    let select = client
        .prepare_cached(
            "SELECT k.submission_id, k.sequence FROM submission_keys k JOIN sessions s ON s.key = k.session_key
             WHERE s.id = $1 AND k.key = $2",
        )
        .await
        .map_err(pg_error)?;
    let Some(row) = client
        .query_opt(&select, &[&session_id, &idempotency_key])
        .await
        .map_err(pg_error)?
    else {
        return Ok(None);
    };
    Ok(Some(KeyedSubmission {
        submission_id: row.try_get(0).map_err(pg_error)?,
        sequence: uint(row.try_get(1).map_err(pg_error)?),
    }))
}

/// Up to `limit` ids after `after` (in id order) of the sessions with
/// submissions queued or a turn in flight.
pub(super) async fn sessions_with_work(
    client: &Object,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let select = client
        .prepare_cached(
            "SELECT id FROM sessions
             WHERE ($1::text IS NULL OR id > $1)
               AND (execution IS NOT NULL
                    OR EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = sessions.key))
             ORDER BY id LIMIT $2",
        )
        .await
        .map_err(pg_error)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = client.query(&select, &[&after, &limit]).await.map_err(pg_error)?;
    rows.iter().map(|row| row.try_get(0).map_err(pg_error)).collect()
}

/// The columns [`SummaryRow::read`] reads.
const SUMMARY_COLUMNS: &str =
    "key, id, checkpoint, execution, created_at_ms, updated_at_ms, last_sequence, title, tenant";

/// The summary rows `sql` selects (its `{filter}` replaced by the
/// filter's conditions, numbered after `params`).
async fn summary_rows(
    client: &Object,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    filter: SessionFilter<'_>,
) -> Result<Vec<SummaryRow>, StoreError> {
    let (clause, values) = filter_clause(filter, '$', params.len() + 1);
    let mut all = params.to_vec();
    all.extend(
        values
            .iter()
            .map(|value| value as &(dyn tokio_postgres::types::ToSql + Sync)),
    );
    let select = client
        .prepare_cached(&sql.replace("{filter}", &clause))
        .await
        .map_err(pg_error)?;
    let rows = client.query(&select, &all).await.map_err(pg_error)?;
    rows.iter().map(SummaryRow::read).collect()
}

/// Sessions newest created first, from `cursor` (a session key, exclusive),
/// only those `filter` admits.
pub(super) async fn list_sessions_page(
    client: &Object,
    cursor: Option<&str>,
    limit: usize,
    filter: SessionFilter<'_>,
) -> Result<SessionListPage, StoreError> {
    let limit = limit.clamp(1, MAX_EVENT_PAGE);
    let before = SummaryRow::cursor_bound(cursor)?;
    let sql = format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE key < $1 {{filter}} ORDER BY key DESC LIMIT $2");
    let rows = summary_rows(client, &sql, &[&before, &(limit as i64 + 1)], filter).await?;
    SummaryRow::page(rows, limit)
}

/// Sessions most recently active first, from `cursor` (exclusive; see
/// [`SummaryRow::activity_bound`]), only those `filter` admits.
pub(super) async fn list_sessions_by_activity(
    client: &Object,
    cursor: Option<&str>,
    limit: usize,
    filter: SessionFilter<'_>,
) -> Result<SessionListPage, StoreError> {
    let limit = limit.clamp(1, MAX_EVENT_PAGE);
    let (updated, key) = SummaryRow::activity_bound(cursor)?;
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM sessions WHERE (updated_at_ms, key) < ($1, $2) {{filter}}
         ORDER BY updated_at_ms DESC, key DESC LIMIT $3"
    );
    let rows = summary_rows(client, &sql, &[&updated, &key, &(limit as i64 + 1)], filter).await?;
    SummaryRow::activity_page(rows, limit)
}

/// One session's summary.
pub(super) async fn session_summary(client: &Object, session_id: &str) -> Result<Option<SessionSummary>, StoreError> {
    let select = client
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = $1"))
        .await
        .map_err(pg_error)?;
    client
        .query_opt(&select, &[&session_id])
        .await
        .map_err(pg_error)?
        .map(|row| SummaryRow::read(&row)?.decode())
        .transpose()
}

impl SummaryRow {
    fn read(row: &Row) -> Result<Self, StoreError> {
        Ok(Self {
            key: row.try_get(0).map_err(pg_error)?,
            session_id: row.try_get(1).map_err(pg_error)?,
            checkpoint: stored(row, 2)?,
            execution: optional(row, 3)?,
            created_at_ms: uint(row.try_get(4).map_err(pg_error)?),
            updated_at_ms: uint(row.try_get(5).map_err(pg_error)?),
            last_sequence: uint(row.try_get(6).map_err(pg_error)?),
            title: row.try_get(7).map_err(pg_error)?,
            tenant: row.try_get(8).map_err(pg_error)?,
        })
    }
}

/// Reads a JSON column without interpreting it, so that a damaged value
/// reaches [`decode`] and is reported as [`StoreError::Corrupt`], naming
/// its row.
fn stored(row: &Row, index: usize) -> Result<StoredJson, StoreError> {
    let bytes: &[u8] = row.try_get(index).map_err(pg_error)?;
    Ok(codec::decode(bytes))
}

/// [`stored`] for a nullable column.
fn optional(row: &Row, index: usize) -> Result<Option<StoredJson>, StoreError> {
    let bytes: Option<&[u8]> = row.try_get(index).map_err(pg_error)?;
    Ok(bytes.map(codec::decode))
}
