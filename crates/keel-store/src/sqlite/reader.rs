//! Reads: a small pool of read-only connections, used from blocking threads.
//!
//! WAL mode lets these read while the writer commits.

use std::path::PathBuf;
use std::sync::Mutex;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, params};

use crate::rows::{
    PageCollector, StoredJson, SummaryRow, apply_history_row, decode, decode_batch, filter_clause, take_after,
};
use crate::{
    Checkpoint, EventPage, EventPageRequest, KeyedSubmission, MAX_EVENT_PAGE, QueuedSubmission, SessionFilter,
    SessionListPage, SessionState, SessionSummary, StoreError, TurnExecution,
};
use keel_protocol::{RecordedEvent, TranscriptItem};

/// Idle read connections kept for reuse.
const MAX_IDLE_READERS: usize = 4;

/// Hands out read connections, opening more on demand.
pub(super) struct ReaderPool {
    path: PathBuf,
    /// The VFS the connections open with (`None`: SQLite's default).
    vfs: Option<String>,
    idle: Mutex<Vec<Connection>>,
}

impl ReaderPool {
    pub(super) fn new(path: PathBuf, vfs: Option<String>) -> Self {
        Self {
            path,
            vfs,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Runs `read` on a pooled connection. Blocking: call from a blocking thread.
    pub(super) fn with<T>(&self, read: impl FnOnce(&Connection) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let pooled = self.idle.lock().unwrap_or_else(|poison| poison.into_inner()).pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => super::schema::open_reader(&self.path, self.vfs.as_deref())?,
        };
        let result = read(&conn);
        let mut idle = self.idle.lock().unwrap_or_else(|poison| poison.into_inner());
        if idle.len() < MAX_IDLE_READERS {
            idle.push(conn);
        }
        result
    }

    /// Closes the idle connections.
    pub(super) fn clear(&self) {
        self.idle.lock().unwrap_or_else(|poison| poison.into_inner()).clear();
    }
}

pub(super) fn load(conn: &Connection, session_id: &str) -> Result<Option<SessionState>, StoreError> {
    // One read transaction, so that the row and the history come from the
    // same commit (each statement alone would take its own snapshot). Dropping
    // it ends the read.
    let _snapshot = conn.unchecked_transaction().map_err(super::sqlite_error)?;
    type Row = (i64, StoredJson, Option<StoredJson>, u64, u64, String);
    let row: Option<Row> = conn
        .prepare_cached(
            "SELECT key, checkpoint, execution, last_sequence, transcript_len, tenant FROM sessions WHERE id = ?1",
        )
        .and_then(|mut select| {
            select
                .query_row(params![session_id], |row| {
                    Ok((
                        row.get(0)?,
                        stored_json(row, 1)?,
                        stored_optional_json(row, 2)?,
                        row.get(3)?,
                        row.get(4)?,
                        row.get(5)?,
                    ))
                })
                .optional()
        })
        .map_err(super::sqlite_error)?;
    let Some((key, checkpoint, execution, last_sequence, transcript_len, tenant)) = row else {
        return Ok(None);
    };
    let what = || format!("checkpoint of session '{session_id}'");
    let mut checkpoint: Checkpoint = decode(&checkpoint, what)?;
    // The stored tenant stands, whatever a later checkpoint says.
    checkpoint.session_context.tenant = tenant;
    let execution: Option<TurnExecution> = execution.map(|json| decode(&json, what)).transpose()?;
    let mut select = conn
        .prepare_cached(
            "SELECT first_sequence, history_cut, history FROM log
             WHERE session_key = ?1 AND (history IS NOT NULL OR history_cut IS NOT NULL)
             ORDER BY first_sequence, id",
        )
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map(params![key], |row| {
            Ok((row.get::<_, u64>(0)?, row.get(1)?, stored_optional_json(row, 2)?))
        })
        .map_err(super::sqlite_error)?;
    let mut transcript = Vec::new();
    for row in rows {
        let (first_sequence, cut, items) = row.map_err(super::sqlite_error)?;
        apply_history_row(&mut transcript, session_id, first_sequence, cut, items)?;
    }
    if transcript.len() as u64 != transcript_len {
        return Err(StoreError::Corrupt {
            what: format!("history of session '{session_id}'"),
            detail: format!("{} items stored, {transcript_len} expected", transcript.len()),
        });
    }
    let queued = queued_submissions(conn, key, session_id)?;
    Ok(Some(SessionState {
        checkpoint,
        transcript,
        execution,
        last_sequence,
        queued,
    }))
}

/// The history of the batches that end at or before `at_sequence`.
pub(super) fn history_until(
    conn: &Connection,
    session_id: &str,
    at_sequence: u64,
) -> Result<Option<Vec<TranscriptItem>>, StoreError> {
    let _snapshot = conn.unchecked_transaction().map_err(super::sqlite_error)?;
    let row: Option<(i64, u64)> = conn
        .prepare_cached("SELECT key, last_sequence FROM sessions WHERE id = ?1")
        .and_then(|mut select| {
            select
                .query_row(params![session_id], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(super::sqlite_error)?;
    let Some((key, last_sequence)) = row else {
        return Ok(None);
    };
    if at_sequence > last_sequence {
        return Err(StoreError::Invalid(format!(
            "session '{session_id}' has {last_sequence} events, not {at_sequence}"
        )));
    }
    // Rows that only extended the history (no events) have an empty range
    // (`first_sequence` one past `last_sequence`, the log's length when
    // they were written): they belong to the history from that length on.
    // Candidates start at most one past `at_sequence`.
    let mut select = conn
        .prepare_cached(
            "SELECT first_sequence, last_sequence, history_cut, history FROM log
             WHERE session_key = ?1 AND (history IS NOT NULL OR history_cut IS NOT NULL)
                 AND first_sequence <= ?2 + 1
             ORDER BY first_sequence, id",
        )
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map(params![key, at_sequence], |row| {
            Ok((
                row.get::<_, u64>(0)?,
                row.get::<_, u64>(1)?,
                row.get(2)?,
                stored_optional_json(row, 3)?,
            ))
        })
        .map_err(super::sqlite_error)?;
    let mut transcript = Vec::new();
    for row in rows {
        let (first_sequence, last, cut, items) = row.map_err(super::sqlite_error)?;
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
        apply_history_row(&mut transcript, session_id, first_sequence, cut, items)?;
    }
    Ok(Some(transcript))
}

/// The session's stored submission queue, oldest first.
fn queued_submissions(conn: &Connection, key: i64, session_id: &str) -> Result<Vec<QueuedSubmission>, StoreError> {
    let mut select = conn
        .prepare_cached("SELECT id, submission FROM queued_submissions WHERE session_key = ?1 ORDER BY sequence")
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map(params![key], |row| Ok((row.get::<_, String>(0)?, stored_json(row, 1)?)))
        .map_err(super::sqlite_error)?;
    let mut queued = Vec::new();
    for row in rows {
        let (id, json) = row.map_err(super::sqlite_error)?;
        queued.push(decode(&json, || {
            format!("queued submission {id} of session '{session_id}'")
        })?);
    }
    Ok(queued)
}

/// The events after `after`, oldest first, at most `limit`.
pub(super) fn events_after(
    conn: &Connection,
    session_id: &str,
    after: u64,
    limit: usize,
) -> Result<Vec<RecordedEvent>, StoreError> {
    let limit = limit.min(MAX_EVENT_PAGE);
    let key = session_key(conn, session_id)?.ok_or_else(|| StoreError::UnknownSession(session_id.to_owned()))?;
    // Past i64::MAX nothing is newer.
    let (Ok(after_sql), Ok(next_sql)) = (i64::try_from(after), i64::try_from(after.saturating_add(1))) else {
        return Ok(Vec::new());
    };
    // The scan starts at the row holding `after + 1` (the last row that
    // starts at or before it: rows never overlap), found in the index, so
    // the tail of a long log costs what its head does.
    let mut select = conn
        .prepare_cached(
            "SELECT first_sequence, last_sequence, recorded_at_ms, events FROM log
             WHERE session_key = ?1
               AND first_sequence >= COALESCE(
                   (SELECT MAX(first_sequence) FROM log WHERE session_key = ?1 AND first_sequence <= ?3), 0)
               AND last_sequence > ?2 AND last_sequence >= first_sequence
             ORDER BY first_sequence, id",
        )
        .map_err(super::sqlite_error)?;
    let mut rows = select
        .query(params![key, after_sql, next_sql])
        .map_err(super::sqlite_error)?;
    let mut events = Vec::with_capacity(limit.min(1024));
    while let Some(row) = rows.next().map_err(super::sqlite_error)? {
        let first: u64 = row.get(0).map_err(super::sqlite_error)?;
        let last: u64 = row.get(1).map_err(super::sqlite_error)?;
        let recorded_at_ms: u64 = row.get(2).map_err(super::sqlite_error)?;
        let json = stored_json(row, 3).map_err(super::sqlite_error)?;
        if !take_after(
            &mut events,
            limit,
            after,
            recorded_at_ms,
            decode_batch(session_id, first, last, &json)?,
        ) {
            return Ok(events);
        }
    }
    Ok(events)
}

/// The submission stored under `idempotency_key`, if any.
pub(super) fn keyed_submission(
    conn: &Connection,
    session_id: &str,
    idempotency_key: &str,
) -> Result<Option<KeyedSubmission>, StoreError> {
    conn.prepare_cached(
        "SELECT k.submission_id, k.sequence FROM submission_keys k JOIN sessions s ON s.key = k.session_key
         WHERE s.id = ?1 AND k.key = ?2",
    )
    .and_then(|mut select| {
        select
            .query_row(params![session_id, idempotency_key], |row| {
                Ok(KeyedSubmission {
                    submission_id: row.get(0)?,
                    sequence: row.get(1)?,
                })
            })
            .optional()
    })
    .map_err(super::sqlite_error)
}

/// Up to `limit` ids after `after` (in id order) of the sessions with
/// submissions queued or a turn in flight.
pub(super) fn sessions_with_work(
    conn: &Connection,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<String>, StoreError> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    conn.prepare_cached(
        "SELECT id FROM sessions
         WHERE (?1 IS NULL OR id > ?1)
           AND (execution IS NOT NULL
                OR EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = sessions.key))
         ORDER BY id LIMIT ?2",
    )
    .and_then(|mut select| {
        select
            .query_map(params![after, limit], |row| row.get(0))?
            .collect::<Result<Vec<String>, _>>()
    })
    .map_err(super::sqlite_error)
}

pub(super) fn event_page(
    conn: &Connection,
    session_id: &str,
    request: EventPageRequest,
) -> Result<EventPage, StoreError> {
    let limit = request.limit.min(MAX_EVENT_PAGE);
    // Sequences are SQLite integers, so any bound past i64::MAX means "all".
    let before = request
        .before_sequence
        .map_or(i64::MAX, |before| i64::try_from(before).unwrap_or(i64::MAX));
    let key = session_key(conn, session_id)?.ok_or_else(|| StoreError::UnknownSession(session_id.to_owned()))?;
    let mut select = conn
        .prepare_cached(
            "SELECT first_sequence, last_sequence, recorded_at_ms, events FROM log
             WHERE session_key = ?1 AND first_sequence < ?2 ORDER BY first_sequence DESC, id DESC",
        )
        .map_err(super::sqlite_error)?;
    let mut rows = select.query(params![key, before]).map_err(super::sqlite_error)?;
    let mut page = PageCollector::new(limit, before as u64);
    while let Some(row) = rows.next().map_err(super::sqlite_error)? {
        let first: u64 = row.get(0).map_err(super::sqlite_error)?;
        let last: u64 = row.get(1).map_err(super::sqlite_error)?;
        if last + 1 == first {
            // A batch that only extended the history.
            continue;
        }
        if page.full() {
            break;
        }
        let recorded_at_ms: u64 = row.get(2).map_err(super::sqlite_error)?;
        let json = stored_json(row, 3).map_err(super::sqlite_error)?;
        if !page.take(recorded_at_ms, decode_batch(session_id, first, last, &json)?) {
            break;
        }
    }
    Ok(page.finish())
}

/// Which sessions a listing shows, owned, for a read on another thread.
#[derive(Debug, Clone, Default)]
pub(super) struct OwnedFilter {
    bot_id: Option<String>,
    tenant: Option<String>,
}

impl OwnedFilter {
    pub(super) fn of(filter: SessionFilter<'_>) -> Self {
        Self {
            bot_id: filter.bot_id.map(str::to_owned),
            tenant: filter.tenant.map(str::to_owned),
        }
    }

    fn borrow(&self) -> SessionFilter<'_> {
        SessionFilter {
            bot_id: self.bot_id.as_deref(),
            tenant: self.tenant.as_deref(),
        }
    }
}

/// The summary rows `sql` selects (its `{filter}` replaced by the
/// filter's conditions, numbered after `params`), decoded.
fn summary_rows(
    conn: &Connection,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
    filter: &OwnedFilter,
) -> Result<Vec<SummaryRow>, StoreError> {
    let (clause, values) = filter_clause(filter.borrow(), '?', params.len() + 1);
    let mut all: Vec<&dyn rusqlite::ToSql> = params.to_vec();
    all.extend(values.iter().map(|value| value as &dyn rusqlite::ToSql));
    let mut select = conn
        .prepare_cached(&sql.replace("{filter}", &clause))
        .map_err(super::sqlite_error)?;
    let rows = select
        .query_map(all.as_slice(), summary_row)
        .map_err(super::sqlite_error)?;
    rows.collect::<Result<_, _>>().map_err(super::sqlite_error)
}

/// Sessions newest created first, from `cursor` (a session key, exclusive),
/// only those `filter` admits.
pub(super) fn list_sessions_page(
    conn: &Connection,
    cursor: Option<&str>,
    limit: usize,
    filter: &OwnedFilter,
) -> Result<SessionListPage, StoreError> {
    let limit = limit.clamp(1, MAX_EVENT_PAGE);
    let before = SummaryRow::cursor_bound(cursor)?;
    let sql = format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE key < ?1 {{filter}} ORDER BY key DESC LIMIT ?2");
    let rows = summary_rows(conn, &sql, &[&before, &(limit as i64 + 1)], filter)?;
    SummaryRow::page(rows, limit)
}

/// Sessions most recently active first, from `cursor` (exclusive; see
/// [`SummaryRow::activity_bound`]), only those `filter` admits.
pub(super) fn list_sessions_by_activity(
    conn: &Connection,
    cursor: Option<&str>,
    limit: usize,
    filter: &OwnedFilter,
) -> Result<SessionListPage, StoreError> {
    let limit = limit.clamp(1, MAX_EVENT_PAGE);
    let (updated, key) = SummaryRow::activity_bound(cursor)?;
    let sql = format!(
        "SELECT {SUMMARY_COLUMNS} FROM sessions
         WHERE (updated_at_ms < ?1 OR (updated_at_ms = ?1 AND key < ?2)) {{filter}}
         ORDER BY updated_at_ms DESC, key DESC LIMIT ?3"
    );
    let rows = summary_rows(conn, &sql, &[&updated, &key, &(limit as i64 + 1)], filter)?;
    SummaryRow::activity_page(rows, limit)
}

/// One session's summary.
pub(super) fn session_summary(conn: &Connection, session_id: &str) -> Result<Option<SessionSummary>, StoreError> {
    conn.prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = ?1"))
        .and_then(|mut select| select.query_row(params![session_id], summary_row).optional())
        .map_err(super::sqlite_error)?
        .map(SummaryRow::decode)
        .transpose()
}

/// The columns [`summary_row`] reads.
const SUMMARY_COLUMNS: &str =
    "key, id, checkpoint, execution, created_at_ms, updated_at_ms, last_sequence, title, tenant";

fn summary_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SummaryRow> {
    Ok(SummaryRow {
        key: row.get(0)?,
        session_id: row.get(1)?,
        checkpoint: stored_json(row, 2)?,
        execution: stored_optional_json(row, 3)?,
        created_at_ms: row.get(4)?,
        updated_at_ms: row.get(5)?,
        last_sequence: row.get(6)?,
        title: row.get(7)?,
        tenant: row.get(8)?,
    })
}

/// The integer key the log and the history use for `session_id`.
fn session_key(conn: &Connection, session_id: &str) -> Result<Option<i64>, StoreError> {
    conn.prepare_cached("SELECT key FROM sessions WHERE id = ?1")
        .and_then(|mut select| select.query_row(params![session_id], |row| row.get(0)).optional())
        .map_err(super::sqlite_error)
}

/// Reads a JSON column without interpreting it, so that a damaged value (a
/// blob, a number, text that is not UTF-8) reaches [`decode`] and is reported
/// as [`StoreError::Corrupt`], naming its row, instead of failing the query.
fn stored_json(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<StoredJson> {
    Ok(super::codec::decode(row.get_ref(index)?))
}

/// [`stored_json`] for a nullable column.
fn stored_optional_json(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<Option<StoredJson>> {
    match row.get_ref(index)? {
        ValueRef::Null => Ok(None),
        _ => stored_json(row, index).map(Some),
    }
}
