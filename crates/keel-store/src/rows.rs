//! Turning what a backend read back into the store's types, the same way
//! for every backend: a stored JSON value, a log row's events, and the
//! history rebuilt from its rows. A damaged value is
//! [`StoreError::Corrupt`], naming its row, never a failed query.

use serde::de::DeserializeOwned;

use super::StoreError;
use crate::{Checkpoint, EventPage, SessionFilter, SessionListPage, SessionSummary, TurnExecution};
use keel_protocol::{Event, RecordedEvent, TranscriptItem};

/// A stored JSON value as read: its JSON bytes, or why they could not be
/// had (see [`super::codec::decode`]), kept until it is decoded so that the
/// error can name its row.
pub(crate) type StoredJson = Result<Vec<u8>, String>;

/// Decodes a stored value; `what` names it in the error.
pub(crate) fn decode<T: DeserializeOwned>(json: &StoredJson, what: impl FnOnce() -> String) -> Result<T, StoreError> {
    json.as_deref()
        .map_err(Clone::clone)
        .and_then(|bytes| serde_json::from_slice(bytes).map_err(|error| error.to_string()))
        .map_err(|detail| StoreError::Corrupt { what: what(), detail })
}

/// The events of a log row holding `first..=last`, each with its sequence,
/// checked against the row's bounds.
pub(crate) fn decode_batch(
    session_id: &str,
    first: u64,
    last: u64,
    json: &StoredJson,
) -> Result<Vec<(u64, Event)>, StoreError> {
    let what = || format!("events {first} to {last} of session '{session_id}'");
    let batch: Vec<Event> = decode(json, what)?;
    // Checked: damaged bounds (a `last` of `u64::MAX`, or before `first`)
    // are a corrupt row, not an overflow.
    let count = last.checked_add(1).and_then(|end| end.checked_sub(first));
    if count != Some(batch.len() as u64) {
        return Err(StoreError::Corrupt {
            what: what(),
            detail: format!("the row holds {} events", batch.len()),
        });
    }
    Ok((first..=last).zip(batch).collect())
}

/// Applies one log row to a history being rebuilt: its cut, then its items.
pub(crate) fn apply_history_row(
    transcript: &mut Vec<TranscriptItem>,
    session_id: &str,
    first_sequence: u64,
    cut: Option<u64>,
    items: Option<StoredJson>,
) -> Result<(), StoreError> {
    let what = || format!("history recorded at event {first_sequence} of session '{session_id}'");
    if let Some(cut) = cut {
        let cut = usize::try_from(cut).unwrap_or(usize::MAX);
        if cut > transcript.len() {
            return Err(StoreError::Corrupt {
                what: what(),
                detail: format!("a cut to {cut} items of a history of {}", transcript.len()),
            });
        }
        transcript.truncate(cut);
    }
    if let Some(items) = items {
        let items: Vec<TranscriptItem> = decode(&items, what)?;
        transcript.extend(items);
    }
    Ok(())
}

/// A `sessions` row as read for a summary, by either backend.
pub(crate) struct SummaryRow {
    pub(crate) key: i64,
    pub(crate) session_id: String,
    pub(crate) checkpoint: StoredJson,
    pub(crate) execution: Option<StoredJson>,
    pub(crate) created_at_ms: u64,
    pub(crate) updated_at_ms: u64,
    pub(crate) last_sequence: u64,
    pub(crate) title: Option<String>,
    /// The tenant stored with the session, which the summary reports
    /// (rather than the checkpoint's copy).
    pub(crate) tenant: String,
}

/// The conditions a [`SessionFilter`] adds to a listing's `WHERE`
/// (`" AND bot_id = ?3 AND tenant = ?4"`), numbering its parameters from
/// `first` with the backend's placeholder `mark` (`?` or `$`), and their
/// values in that order. Only the filters given appear, so the query can
/// use the index of the one it has.
pub(crate) fn filter_clause<'f>(filter: SessionFilter<'f>, mark: char, first: usize) -> (String, Vec<&'f str>) {
    let mut clause = String::new();
    let mut values = Vec::new();
    for (column, value) in [("bot_id", filter.bot_id), ("tenant", filter.tenant)] {
        if let Some(value) = value {
            clause.push_str(&format!(" AND {column} = {mark}{}", first + values.len()));
            values.push(value);
        }
    }
    (clause, values)
}

impl SummaryRow {
    /// The key a session list page starts below: none for the first page,
    /// else the cursor the page before it gave (a by-activity cursor,
    /// `UPDATED-KEY`, reads as its key).
    pub(crate) fn cursor_bound(cursor: Option<&str>) -> Result<i64, StoreError> {
        let Some(cursor) = cursor else {
            return Ok(i64::MAX);
        };
        let key = cursor.split_once('-').map_or(cursor, |(_, key)| key);
        key.parse()
            .map_err(|_| StoreError::Invalid(format!("'{cursor}' is not a session list cursor")))
    }

    /// The `(updated_at_ms, key)` a by-activity page starts below: none for
    /// the first page, else the cursor (`UPDATED-KEY`) the page before gave;
    /// a bare `UPDATED` (the form of a by-creation cursor) starts with the
    /// sessions last active at or before that time.
    pub(crate) fn activity_bound(cursor: Option<&str>) -> Result<(i64, i64), StoreError> {
        let Some(cursor) = cursor else {
            return Ok((i64::MAX, i64::MAX));
        };
        let parts = match cursor.split_once('-') {
            Some((updated, key)) => updated.parse().ok().zip(key.parse().ok()),
            None => cursor.parse().ok().map(|updated| (updated, i64::MAX)),
        };
        parts.ok_or_else(|| StoreError::Invalid(format!("'{cursor}' is not a by-activity session list cursor")))
    }

    /// A by-activity page from up to `limit + 1` rows read most recently
    /// active first.
    pub(crate) fn activity_page(mut rows: Vec<SummaryRow>, limit: usize) -> Result<SessionListPage, StoreError> {
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|row| format!("{}-{}", row.updated_at_ms, row.key))
        } else {
            None
        };
        let sessions = rows.into_iter().map(SummaryRow::decode).collect::<Result<_, _>>()?;
        Ok(SessionListPage { sessions, next_cursor })
    }

    /// A session list page from up to `limit + 1` rows read newest first:
    /// one row more than the page says there is a next page.
    pub(crate) fn page(mut rows: Vec<SummaryRow>, limit: usize) -> Result<SessionListPage, StoreError> {
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(|row| row.key.to_string())
        } else {
            None
        };
        let sessions = rows.into_iter().map(SummaryRow::decode).collect::<Result<_, _>>()?;
        Ok(SessionListPage { sessions, next_cursor })
    }

    /// The summary the row describes.
    pub(crate) fn decode(self) -> Result<SessionSummary, StoreError> {
        let session_id = self.session_id;
        let what = || format!("checkpoint of session '{session_id}'");
        let mut checkpoint: Checkpoint = decode(&self.checkpoint, what)?;
        checkpoint.session_context.tenant = self.tenant;
        let execution: Option<TurnExecution> = self.execution.map(|json| decode(&json, what)).transpose()?;
        let client_deadline_ms = execution.as_ref().and_then(TurnExecution::next_client_deadline_ms);
        let (running_turn_id, awaiting_approval, awaiting_client) = match execution {
            Some(execution) => (
                Some(execution.turn_id),
                execution.awaiting_approval,
                execution.awaiting_client,
            ),
            None => (None, Vec::new(), Vec::new()),
        };
        Ok(SessionSummary {
            bot_id: checkpoint.session_context.bot_id.clone(),
            session_id,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            last_sequence: self.last_sequence,
            running_turn_id,
            context: checkpoint.session_context,
            usage: checkpoint.usage,
            turns_completed: checkpoint.turns_completed,
            awaiting_approval,
            awaiting_client,
            client_deadline_ms,
            title: self.title,
        })
    }
}

/// An event page collected from log rows read newest first, the way every
/// backend pages back: events before the bound, at most `limit`, and
/// whether there are more.
pub(crate) struct PageCollector {
    /// Newest first while collecting; reversed by [`Self::finish`].
    events: Vec<RecordedEvent>,
    limit: usize,
    before: u64,
    has_more: bool,
}

impl PageCollector {
    /// A page of at most `limit` events with sequences below `before`.
    pub(crate) fn new(limit: usize, before: u64) -> Self {
        Self {
            events: Vec::with_capacity(limit.min(1024)),
            limit,
            before,
            has_more: false,
        }
    }

    /// Whether the page is full; it then has more, and needs no more rows.
    pub(crate) fn full(&mut self) -> bool {
        self.has_more |= self.events.len() == self.limit;
        self.has_more
    }

    /// Takes the events of one row (in sequence order), newest first;
    /// `false` once the page is full.
    pub(crate) fn take(&mut self, recorded_at_ms: u64, batch: Vec<(u64, Event)>) -> bool {
        for (sequence, event) in batch.into_iter().rev() {
            if sequence >= self.before {
                continue;
            }
            if self.full() {
                return false;
            }
            self.events.push(RecordedEvent {
                sequence,
                recorded_at_ms,
                event,
            });
        }
        true
    }

    /// The page, oldest first.
    pub(crate) fn finish(mut self) -> EventPage {
        self.events.reverse();
        EventPage {
            events: self.events,
            has_more: self.has_more,
        }
    }
}

/// Appends the events of one log row (in sequence order) that come after
/// `after` to `events`, reading forwards, up to `limit` in all; `false`
/// once `events` is full.
pub(crate) fn take_after(
    events: &mut Vec<RecordedEvent>,
    limit: usize,
    after: u64,
    recorded_at_ms: u64,
    batch: Vec<(u64, Event)>,
) -> bool {
    for (sequence, event) in batch {
        if sequence <= after {
            continue;
        }
        if events.len() == limit {
            return false;
        }
        events.push(RecordedEvent {
            sequence,
            recorded_at_ms,
            event,
        });
    }
    true
}
