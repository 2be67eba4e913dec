//! The statements the PostgreSQL writer runs, as SQL and prepared once per
//! connection, and how counters cross into PostgreSQL's `bigint`.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

/// The statements the writer runs, prepared once per connection.
pub(super) struct Statements {
    pub(super) insert_session: Statement,
    pub(super) write: Statement,
    pub(super) append_many: Statement,
    pub(super) refusal: Statement,
    pub(super) queue_upsert: Statement,
    pub(super) queue_delete: Statement,
    pub(super) key_insert: Statement,
    pub(super) relay_answer: Statement,
    pub(super) acquire: Statement,
    pub(super) rename: Statement,
    pub(super) delete_session: Statement,
    pub(super) delete_log: Statement,
    pub(super) delete_queue: Statement,
    pub(super) delete_keys: Statement,
    pub(super) delete_access: Statement,
    pub(super) webhook_queue: Statement,
    pub(super) slot_release: Statement,
    /// The transaction's id, asked for should its `COMMIT` be cut off.
    pub(super) txid: Statement,
}

/// Queues, in the transaction of the events, a webhook delivery for each
/// event `($1[i], $2[i], $3[i])` (session id, sequence, type) and each
/// endpoint that wants it (by type, bot and tenant), at `$4`; one of type
/// `session_idle` only when the session has nothing queued.
pub(super) const WEBHOOK_QUEUE: &str = "INSERT INTO webhook_deliveries (endpoint_id, session_id, sequence, event_type,
         created_at_ms, next_attempt_at_ms)
     SELECT w.id, e.session_id, e.sequence, e.event_type, $4, $4
     FROM unnest($1::text[], $2::int8[], $3::text[]) WITH ORDINALITY AS e(session_id, sequence, event_type, ord)
     JOIN sessions s ON s.id = e.session_id
     JOIN webhook_endpoints w ON strpos(w.event_types, ',' || e.event_type || ',') > 0
         AND (w.bot_id IS NULL OR w.bot_id = s.bot_id) AND (w.tenant IS NULL OR w.tenant = s.tenant)
     WHERE e.event_type <> 'session_idle'
        OR NOT EXISTS (SELECT 1 FROM queued_submissions q WHERE q.session_key = s.key)
     ORDER BY e.ord, w.seq";

/// Creates a session row, for tenant `$3`, if the id is free; returns its
/// key if it did. The tenant is never moved by a later write.
pub(super) const INSERT_SESSION: &str = "INSERT INTO sessions (id, created_at_ms, updated_at_ms, checkpoint, tenant)
     VALUES ($1, $2, $2, '\\x'::bytea, $3) ON CONFLICT (id) DO NOTHING RETURNING key";

/// Answers, in the transaction that queues them, the relayed submissions
/// `$2` (relay ids) of the session whose key is `$1` with the answers `$3`
/// (JSON), freeing their keys as `relay::ANSWER` does; forgets the answers
/// of the session given before `$5`; and wakes the waiting nodes on
/// `keel_answer` (the session id `$4`, then each answer while they fit in a
/// notice) at commit.
pub(super) const RELAY_ANSWER: &str = "WITH answered AS (
         UPDATE relayed_submissions r SET answer = g.answer, answered_at_ms = $6, idempotency_key = NULL
         FROM unnest($2::int8[], $3::text[]) AS g(id, answer)
         WHERE r.session_key = $1 AND r.id = g.id AND r.answer IS NULL
         RETURNING r.id, r.answer
     ),
     forgotten AS (
         DELETE FROM relayed_submissions r WHERE r.session_key = $1 AND r.answered_at_ms < $5 RETURNING r.id
     )
     SELECT pg_notify('keel_answer', CASE WHEN octet_length(payload) <= 7900 THEN payload ELSE $4 END)
     FROM (SELECT $4 || string_agg(E'\n' || a.id || E'\t' || a.answer, '' ORDER BY a.id) AS payload
           FROM answered a HAVING count(*) > 0) AS notice";

/// The ledger's insert of one hour's usage per target (session, tenant),
/// shared by the one-session and the many-session appends.
macro_rules! usage_hours_insert {
    () => {
        "         INSERT INTO usage_hours (kind, target, hour_ms, input_tokens, cached_input_tokens, output_tokens,
                                  reasoning_tokens)
"
    };
}

/// What a ledger row already there for the hour gets: the new tokens added.
macro_rules! usage_hours_add {
    () => {
        "         ON CONFLICT (kind, target, hour_ms) DO UPDATE SET
             input_tokens = usage_hours.input_tokens + excluded.input_tokens,
             cached_input_tokens = usage_hours.cached_input_tokens + excluded.cached_input_tokens,
             output_tokens = usage_hours.output_tokens + excluded.output_tokens,
             reasoning_tokens = usage_hours.reasoning_tokens + excluded.reasoning_tokens
"
    };
}

/// One statement takes the sequences, rewrites the checkpoint, extends the
/// history, sets a first title, adds the log row, adds the usage its events
/// report (`$14` to `$17`, null for none) to the ledgers of the session and
/// its tenant (one row each, in the hour of `$2`) and, when it appends
/// events, notifies `keel_log` with the session id and its new last
/// sequence (delivered at commit; see `listen.rs`); matching no row (an
/// unknown session, a stale lease, a cut longer than the history) writes
/// nothing. The row lock the update takes orders concurrent writers of one
/// session (in any process): the second waits, then numbers its events
/// after the first's.
pub(super) const WRITE: &str = concat!(
    "WITH s AS (
         UPDATE sessions SET
             last_sequence = last_sequence + $1,
             updated_at_ms = $2,
             checkpoint = coalesce($3, checkpoint),
             execution = CASE WHEN $3 IS NULL THEN execution ELSE $4 END,
             transcript_len = coalesce($9, transcript_len) + $5,
             bot_id = coalesce($8, bot_id),
             title = coalesce(title, $10)
         WHERE id = $6 AND ($7 IS NULL OR lease = $7) AND ($9 IS NULL OR $9 <= transcript_len)
         RETURNING key, last_sequence, lease, tenant
     ), logged AS (
         INSERT INTO log (session_key, first_sequence, last_sequence, recorded_at_ms, history_cut, history, events)
         SELECT key, last_sequence - $1 + 1, last_sequence, $2, $9, $11, $12 FROM s WHERE $13
     ), ledger AS (
",
    usage_hours_insert!(),
    "         SELECT u.kind, u.target, $2 - $2 % 3600000, $14, $15, $16, $17
         FROM s, LATERAL (VALUES ('session', $6), ('tenant', s.tenant)) AS u (kind, target)
         WHERE $14 IS NOT NULL
         ORDER BY u.kind, u.target
",
    usage_hours_add!(),
    "     )
     SELECT key, last_sequence, lease,
            CASE WHEN $1 > 0 THEN pg_notify('keel_log', $6 || ' ' || last_sequence) END
     FROM s"
);

/// [`WRITE`] for appends to many sessions (one each) in one statement: each
/// array holds one value per append; `ord` numbers them, and the result
/// has a row for each append that was written. It notifies as [`WRITE`]
/// does, in the same statement: no round trip is added; when the stored
/// events are small enough, the notice carries them too (base64, with the
/// time recorded), so that another node's subscribers need not read them. The usage of the
/// appends (`$15` to `$18`) is summed per ledger row before it is added:
/// several sessions of one tenant meet in one row, which one statement
/// may change only once. Ledger rows are locked in one order (kind,
/// target), as every writer locks them, so two nodes' commits wait for
/// each other rather than deadlock.
pub(super) const APPEND_MANY: &str = concat!(
    "WITH input AS (
         SELECT * FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bytea[], $5::int8[], $6::int8[],
                              $7::text[], $8::int8[], $9::text[], $10::bytea[], $11::bytea[], $12::bool[], $13::int4[],
                              $15::int8[], $16::int8[], $17::int8[], $18::int8[])
             AS i (id, count, checkpoint, execution, added, lease, bot_id, cut, title, history, events, logged, ord,
                   input, cached, output, reasoning)
     ), s AS (
         UPDATE sessions SET
             last_sequence = sessions.last_sequence + i.count,
             updated_at_ms = $14,
             checkpoint = coalesce(i.checkpoint, sessions.checkpoint),
             execution = CASE WHEN i.checkpoint IS NULL THEN sessions.execution ELSE i.execution END,
             transcript_len = coalesce(i.cut, sessions.transcript_len) + i.added,
             bot_id = coalesce(i.bot_id, sessions.bot_id),
             title = coalesce(sessions.title, i.title)
         FROM input i
         WHERE sessions.id = i.id
           AND (i.lease IS NULL OR sessions.lease = i.lease)
           AND (i.cut IS NULL OR i.cut <= sessions.transcript_len)
         RETURNING i.ord, sessions.key, sessions.last_sequence, sessions.lease, sessions.id, i.count, sessions.tenant
     ), logged AS (
         INSERT INTO log (session_key, first_sequence, last_sequence, recorded_at_ms, history_cut, history, events)
         SELECT s.key, s.last_sequence - i.count + 1, s.last_sequence, $14, i.cut, i.history, i.events
         FROM s JOIN input i ON i.ord = s.ord
         WHERE i.logged
         ORDER BY i.ord
     ), ledger AS (
",
    usage_hours_insert!(),
    "         SELECT u.kind, u.target, $14 - $14 % 3600000,
                sum(i.input)::int8, sum(i.cached)::int8, sum(i.output)::int8, sum(i.reasoning)::int8
         FROM s JOIN input i ON i.ord = s.ord,
              LATERAL (VALUES ('session', s.id), ('tenant', s.tenant)) AS u (kind, target)
         WHERE i.input IS NOT NULL
         GROUP BY u.kind, u.target
         ORDER BY u.kind, u.target
",
    usage_hours_add!(),
    "     )
     SELECT s.ord, s.key, s.last_sequence, s.lease,
            CASE WHEN s.count > 0 THEN pg_notify('keel_log', s.id || ' ' || s.last_sequence
                || CASE WHEN octet_length(i.events) <= 5600
                        THEN E'\n' || $14 || E'\n' || translate(encode(i.events, 'base64'), E'\n', '')
                        ELSE '' END) END
     FROM s JOIN input i ON i.ord = s.ord"
);

pub(super) const APPEND_MANY_TYPES: [Type; 18] = [
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::BYTEA_ARRAY,
    Type::BYTEA_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::BYTEA_ARRAY,
    Type::BYTEA_ARRAY,
    Type::BOOL_ARRAY,
    Type::INT4_ARRAY,
    Type::INT8,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
    Type::INT8_ARRAY,
];

pub(super) const WRITE_TYPES: [Type; 17] = [
    Type::INT8,
    Type::INT8,
    Type::BYTEA,
    Type::BYTEA,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::BYTEA,
    Type::BYTEA,
    Type::BOOL,
    Type::INT8,
    Type::INT8,
    Type::INT8,
    Type::INT8,
];

impl Statements {
    pub(super) async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let (insert_session, write, refusal, queue_upsert, queue_delete, key_insert) = futures::try_join!(
            client.prepare_typed(INSERT_SESSION, &[Type::TEXT, Type::INT8, Type::TEXT]),
            client.prepare_typed(WRITE, &WRITE_TYPES),
            client.prepare_typed("SELECT lease, transcript_len FROM sessions WHERE id = $1", &[Type::TEXT]),
            client.prepare_typed(
                "INSERT INTO queued_submissions (session_key, id, sequence, submission)
                 SELECT $1, * FROM unnest($2::text[], $3::int8[], $4::bytea[])
                 ON CONFLICT (session_key, id) DO UPDATE SET sequence = excluded.sequence, submission = excluded.submission",
                &[Type::INT8, Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::BYTEA_ARRAY],
            ),
            client.prepare_typed(
                "DELETE FROM queued_submissions WHERE session_key = $1 AND id = ANY($2)",
                &[Type::INT8, Type::TEXT_ARRAY],
            ),
            // A key names one submission for ever: it answers the keys
            // already naming another (as they were before the statement).
            client.prepare_typed(
                "WITH wanted AS (
                     SELECT * FROM unnest($2::text[], $3::text[], $4::int8[]) AS w(key, submission_id, sequence)
                 ), inserted AS (
                     INSERT INTO submission_keys (session_key, key, submission_id, sequence)
                     SELECT $1, key, submission_id, sequence FROM wanted ON CONFLICT DO NOTHING
                 )
                 SELECT w.key, k.submission_id, w.submission_id FROM wanted w
                 JOIN submission_keys k ON k.session_key = $1 AND k.key = w.key
                 WHERE k.submission_id <> w.submission_id",
                &[Type::INT8, Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8_ARRAY],
            ),
        )?;
        let append_many = client.prepare_typed(APPEND_MANY, &APPEND_MANY_TYPES).await?;
        let relay_answer = client
            .prepare_typed(
                RELAY_ANSWER,
                &[
                    Type::INT8,
                    Type::INT8_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::TEXT,
                    Type::INT8,
                    Type::INT8,
                ],
            )
            .await?;
        let (acquire, rename, delete_session, delete_log, delete_queue, delete_keys) = futures::try_join!(
            client.prepare_typed(
                "UPDATE sessions SET lease = lease + 1, updated_at_ms = $1 WHERE id = $2 RETURNING lease, last_sequence",
                &[Type::INT8, Type::TEXT],
            ),
            client.prepare_typed(
                "UPDATE sessions SET title = $2 WHERE id = $1 RETURNING key",
                &[Type::TEXT, Type::TEXT]
            ),
            client.prepare_typed("DELETE FROM sessions WHERE id = $1 RETURNING key", &[Type::TEXT]),
            client.prepare_typed("DELETE FROM log WHERE session_key = $1", &[Type::INT8]),
            // The relayed submissions go with the queue.
            client.prepare_typed(
                "WITH relayed AS (DELETE FROM relayed_submissions WHERE session_key = $1)
                 DELETE FROM queued_submissions WHERE session_key = $1",
                &[Type::INT8]
            ),
            // The turn slot goes with the keys.
            client.prepare_typed(
                "WITH slot AS (DELETE FROM turn_slots WHERE session_key = $1)
                 DELETE FROM submission_keys WHERE session_key = $1",
                &[Type::INT8]
            ),
        )?;
        // A deleted session's ledger and budget go with it (nodes reload
        // budgets when it had one); its tenant's ledger stays.
        let delete_access = client
            .prepare_typed(
                "WITH ledger AS (DELETE FROM usage_hours WHERE kind = 'session' AND target = $1),
                      webhooks AS (DELETE FROM webhook_deliveries WHERE session_id = $1),
                      budget AS (DELETE FROM budgets WHERE kind = 'session' AND target = $1 RETURNING 1)
                 UPDATE access_revision SET revision = revision + 1 WHERE EXISTS (SELECT 1 FROM budget)",
                &[Type::TEXT],
            )
            .await?;
        let webhook_queue = client
            .prepare_typed(
                WEBHOOK_QUEUE,
                &[Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::TEXT_ARRAY, Type::INT8],
            )
            .await?;
        // A session's turn slot, given back once it has no turn in flight
        // and nothing queued (see `AccessStore::reserve_turn`).
        let slot_release = client
            .prepare_typed(super::slot_sql::RELEASE_AT_REST, &[Type::INT8])
            .await?;
        let txid = client.prepare_typed("SELECT txid_current()", &[]).await?;
        Ok(Self {
            insert_session,
            write,
            append_many,
            refusal,
            queue_upsert,
            queue_delete,
            key_insert,
            relay_answer,
            acquire,
            rename,
            delete_session,
            delete_log,
            delete_queue,
            delete_keys,
            delete_access,
            webhook_queue,
            slot_release,
            txid,
        })
    }
}

/// A u64 as a PostgreSQL `bigint` (values past `i64::MAX` saturate; no
/// counter gets there).
pub(super) fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A `bigint` read back as the u64 it was written from.
pub(super) fn uint(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}
