//! Relayed submissions: what a node accepted for a session that another
//! node runs, stored (committed) before the client hears `202`, then queued
//! by the owner.
//!
//! Each call is one statement on a pooled connection. The insert commits
//! without waiting for the disk (`synchronous_commit = off`), one flush less
//! per relayed submission, and loses nothing a client was told: the client
//! hears `202` only once the owner has answered, and the owner answers in
//! (or after) a commit of its own that does wait for the disk, after it read
//! the row; the write-ahead log is flushed in order, so that flush makes
//! the row durable too. A crash before it may lose the row, which nobody
//! was told of (its client retries with its key). The insert announces
//! the session and its live owner on `keel_relay` in its own transaction,
//! so the owner is woken at commit, never for a rolled-back insert, and the
//! other nodes can tell the notice is not theirs. The owner reads the rows in
//! order and queues each under its id and key; the writer answers a row in
//! the transaction that queues it (see `taken_up.rs`), the owner answers
//! the rest (duplicates, refusals, control ops): a crash in between queues
//! such a row again, which its idempotency key turns into a duplicate (see
//! the host).

use std::time::Duration;

use deadpool_postgres::Object;

use super::pg_error;
use super::statements::{int, uint};
use crate::codec;
use crate::rows::{StoredJson, decode};
use crate::{RelayOutcome, RelayState, Relayed, RelayedSubmission, StoreError};
use keel_protocol::now_ms;

/// Stores a submission unless one with its key waits already or `$6`
/// wait (unanswered), and announces the session with its live owner (empty
/// when none: then any node may take it over) and, when it fits in a
/// notice, the row itself (its id, submission id, key and `$7`, the
/// submission's JSON), so that the owner need not read it; returns the
/// log's end and the new row's id, or nothing when the key was taken, the
/// session is full or unknown.
const INSERT: &str = "WITH session AS (
         SELECT key, last_sequence,
                CASE WHEN lease_expires_at > clock_timestamp() THEN lease_owner ELSE '' END AS owner
         FROM sessions WHERE id = $1
     ), inserted AS (
         INSERT INTO relayed_submissions (session_key, submission_id, idempotency_key, submission, relayed_at_ms)
         SELECT key, $2, $3, $4, $5 FROM session
         WHERE (SELECT count(*) FROM relayed_submissions r
                WHERE r.session_key = session.key AND r.answer IS NULL) < $6
         ON CONFLICT (session_key, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING session_key, id
     )
     SELECT session.last_sequence, inserted.id,
            count(pg_notify('keel_relay', $1 || E'\n' || session.owner
                || CASE WHEN octet_length($1) + octet_length(session.owner) + octet_length($7) <= 7600
                        THEN E'\n' || inserted.id || E'\t' || $2 || E'\t' || coalesce($3, '') || E'\t' || $7
                        ELSE '' END))
     FROM inserted JOIN session ON session.key = inserted.session_key
     GROUP BY session.last_sequence, inserted.id";

/// The stored submission with the key `$2`, if any, and how many wait;
/// no row for an unknown session.
const BY_KEY: &str = "SELECT r.id, r.submission_id, r.submission,
         (SELECT count(*) FROM relayed_submissions w WHERE w.session_key = s.key AND w.answer IS NULL)
     FROM sessions s LEFT JOIN relayed_submissions r ON r.session_key = s.key AND r.idempotency_key = $2
     WHERE s.id = $1";

const WAITING: &str = "SELECT r.id, r.submission_id, r.idempotency_key, r.submission
     FROM relayed_submissions r JOIN sessions s ON s.key = r.session_key
     WHERE s.id = $1 AND r.answer IS NULL ORDER BY r.id LIMIT $2";

const DONE: &str = "DELETE FROM relayed_submissions r USING sessions s
     WHERE s.id = $1 AND r.session_key = s.key AND r.id = ANY($2)";

/// Records the answers `$3` (JSON; null: forget the row) to the rows `$2`,
/// freeing their keys (the session's keys are in `submission_keys` from
/// here on), forgets the answers given before `$5`, and wakes the waiting
/// nodes on `keel_answer` with the answers recorded when they fit in a
/// notice (7,900 bytes, under PostgreSQL's 8,000; otherwise the session id
/// alone, and the waiting nodes read them). The update and the delete touch distinct rows: a row is
/// answered only while it has no answer, and forgotten only for a null or
/// an old answer.
const ANSWER: &str = "WITH session AS (SELECT key FROM sessions WHERE id = $1),
     given AS (SELECT * FROM unnest($2::int8[], $3::text[]) AS g(id, answer)),
     answered AS (
         UPDATE relayed_submissions r SET answer = g.answer, answered_at_ms = $4, idempotency_key = NULL
         FROM given g, session
         WHERE r.session_key = session.key AND r.id = g.id AND g.answer IS NOT NULL AND r.answer IS NULL
         RETURNING r.id, r.answer
     ),
     forgotten AS (
         DELETE FROM relayed_submissions r USING session
         WHERE r.session_key = session.key
           AND (r.id IN (SELECT id FROM given WHERE answer IS NULL) OR r.answered_at_ms < $5)
         RETURNING r.id
     )
     SELECT pg_notify('keel_answer', CASE WHEN octet_length(payload) <= 7900 THEN payload ELSE $1 END)
     FROM (SELECT $1 || coalesce(string_agg(E'\n' || a.id || E'\t' || a.answer, '' ORDER BY a.id), '') AS payload
           FROM answered a) AS notice";

/// A row's answer, by its id (unique across sessions): one index lookup.
const STATE: &str = "SELECT answer FROM relayed_submissions WHERE id = $1";

/// The session's highest relay id, answered or not; 0 for none (one index
/// lookup).
const NEWEST: &str = "SELECT coalesce(max(r.id), 0)::int8
     FROM relayed_submissions r JOIN sessions s ON s.key = r.session_key WHERE s.id = $1";

const OWNED_WITH_RELAYED: &str = "SELECT s.id FROM sessions s
     WHERE s.lease_owner = $1
       AND EXISTS (SELECT 1 FROM relayed_submissions r WHERE r.session_key = s.key AND r.answer IS NULL)
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
    let stored = codec::encode(json.clone()).into_bytes();
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
                    &json,
                ],
            )
            .await
            .map_err(pg_error)?;
        if let Some(row) = inserted {
            return Ok(Relayed::New {
                last_sequence: uint(row.try_get(0).map_err(pg_error)?),
                relay_id: uint(row.try_get(1).map_err(pg_error)?),
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
        return Ok(Relayed::Duplicate(Box::new(earlier)));
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

pub(super) async fn answer_relayed(
    client: &Object,
    session_id: &str,
    answers: &[(u64, Option<RelayOutcome>)],
    keep: Duration,
) -> Result<(), StoreError> {
    if answers.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = answers.iter().map(|(id, _)| int(*id)).collect();
    let encoded = answers
        .iter()
        .map(|(_, answer)| answer.as_ref().map(serde_json::to_string).transpose())
        .collect::<Result<Vec<Option<String>>, _>>()
        .map_err(|error| StoreError::Encode(format!("cannot encode a relayed submission's answer: {error}")))?;
    let now = now_ms();
    let before = now.saturating_sub(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX));
    let answer = client.prepare_cached(ANSWER).await.map_err(pg_error)?;
    client
        .execute(&answer, &[&session_id, &ids, &encoded, &int(now), &int(before)])
        .await
        .map_err(pg_error)?;
    Ok(())
}

pub(super) async fn relay_state(client: &Object, relay_id: u64) -> Result<RelayState, StoreError> {
    let state = client.prepare_cached(STATE).await.map_err(pg_error)?;
    let Some(row) = client.query_opt(&state, &[&int(relay_id)]).await.map_err(pg_error)? else {
        return Ok(RelayState::Gone);
    };
    let Some(answer) = row.try_get::<_, Option<String>>(0).map_err(pg_error)? else {
        return Ok(RelayState::Waiting);
    };
    let outcome = serde_json::from_str(&answer).map_err(|error| StoreError::Corrupt {
        what: format!("the answer to relayed submission {relay_id}"),
        detail: error.to_string(),
    })?;
    Ok(RelayState::Answered(outcome))
}

pub(super) async fn newest_relay_id(client: &Object, session_id: &str) -> Result<u64, StoreError> {
    let newest = client.prepare_cached(NEWEST).await.map_err(pg_error)?;
    let row = client.query_one(&newest, &[&session_id]).await.map_err(pg_error)?;
    Ok(uint(row.try_get(0).map_err(pg_error)?))
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

/// Records `url` as where `node` takes submissions (see the `nodes` table).
pub(super) async fn advertise(client: &Object, node: &str, url: &str) -> Result<(), StoreError> {
    client
        .execute(
            "INSERT INTO nodes (node_id, url, advertised_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (node_id) DO UPDATE SET url = excluded.url, advertised_at_ms = excluded.advertised_at_ms",
            &[&node, &url, &int(now_ms())],
        )
        .await
        .map_err(pg_error)?;
    Ok(())
}

/// The URL `node` advertised last; none if that was empty (it takes none).
pub(super) async fn node_url(client: &Object, node: &str) -> Result<Option<String>, StoreError> {
    let row = client
        .query_opt("SELECT url FROM nodes WHERE node_id = $1 AND url <> ''", &[&node])
        .await
        .map_err(pg_error)?;
    row.map(|row| row.try_get(0)).transpose().map_err(pg_error)
}
