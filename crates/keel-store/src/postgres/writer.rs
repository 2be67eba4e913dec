//! The writer task of a PostgreSQL store, and its group commit.
//!
//! Every write of every session goes through one task that owns one
//! connection. Each time it wakes it takes *all* queued jobs (up to a
//! limit), seals their open batches, and applies them in one transaction
//! committed with `synchronous_commit = on`, so concurrent sessions share
//! each commit's WAL flush. Within the transaction the group runs in rounds
//! (round `k` holds the `k`th job of each session, so a session's jobs run
//! in order): a round's appends, to distinct sessions, are written by one
//! multi-row statement, and its other jobs (saves, creations, leases,
//! deletions, renames) are sent beside it; tokio-postgres sends a query as
//! soon as its future is first polled, so they are pipelined on the one
//! connection. A group then costs one or two round trips per round (two
//! when a batch changes the submission queue), not one per statement.
//!
//! One failing job does not fail the others (see [`run_group`]). Each job is
//! answered only after the commit that made it durable.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, Statement, Transaction};

use crate::codec::{self, json_array};
use crate::job::{Job, JobError, Mode, Written, check_addressed, encode};
use crate::{AppendReceipt, CheckpointWrite, EncodedEvent, QueueChange, QueuedSubmission, StoreError};
use keel_protocol::now_ms;

/// Counters of the writer's work, readable while it runs.
#[derive(Debug, Default)]
pub(super) struct WriterCounters {
    pub(super) commits: AtomicU64,
    pub(super) jobs: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) commit_micros: AtomicU64,
}

/// A job sealed and serialized: everything it writes, fixed before the
/// transaction starts, so that encoding errors fail the job cleanly.
struct Write {
    session_id: String,
    mode: Mode,
    /// How many events.
    count: u64,
    /// The events' JSON array, stored.
    events: Vec<u8>,
    /// What the events do to the queue, by offset in the batch.
    queue: Vec<(u64, QueueChange)>,
    /// The title the first user message gives, or a rename's title.
    title: Option<String>,
    checkpoint: Option<EncodedWrite>,
}

/// A checkpoint write, serialized.
struct EncodedWrite {
    checkpoint: Vec<u8>,
    /// The checkpoint's bot, kept in a column of its own for listing.
    bot_id: String,
    execution: Option<Vec<u8>>,
    /// The history items added, as a stored JSON array (`None`: none).
    history: Option<Vec<u8>>,
    added: u64,
    /// The history's length to cut back to before the items are added.
    history_cut: Option<u64>,
}

/// What a job writes, serialized. Seals an append's open batch: from here
/// on the producer's additions go to its next job.
fn seal(job: &Job) -> Result<Write, StoreError> {
    let sealed = job.seal();
    let write = Write {
        session_id: sealed.session_id.to_owned(),
        mode: sealed.mode,
        count: 0,
        events: Vec::new(),
        queue: Vec::new(),
        title: sealed.title.map(str::to_owned),
        checkpoint: None,
    };
    match sealed.mode {
        Mode::Acquire | Mode::Delete | Mode::Rename => Ok(write),
        Mode::Append { .. } | Mode::Save | Mode::Create => {
            with_events(write, &sealed.events, sealed.checkpoint.as_deref())
        }
    }
}

/// Fills in a write's events and checkpoint, serialized.
fn with_events(
    mut write: Write,
    events: &[EncodedEvent],
    checkpoint: Option<&CheckpointWrite>,
) -> Result<Write, StoreError> {
    write.count = events.len() as u64;
    write.events = stored(json_array(events.iter().map(|event| event.json.as_str())));
    write.queue = events
        .iter()
        .enumerate()
        .filter_map(|(offset, event)| event.queue.clone().map(|change| (offset as u64, change)))
        .collect();
    write.title = events.iter().find_map(|event| event.title.clone());
    write.checkpoint = checkpoint
        .map(|checkpoint| encode_write(&write.session_id, checkpoint))
        .transpose()?;
    Ok(write)
}

/// The statements the writer runs, prepared once per connection.
struct Statements {
    insert_session: Statement,
    write: Statement,
    append_many: Statement,
    refusal: Statement,
    queue_upsert: Statement,
    queue_delete: Statement,
    key_insert: Statement,
    acquire: Statement,
    rename: Statement,
    delete_session: Statement,
    delete_log: Statement,
    delete_queue: Statement,
    delete_keys: Statement,
}

/// Creates a session row if the id is free; returns its key if it did.
const INSERT_SESSION: &str = "INSERT INTO sessions (id, created_at_ms, updated_at_ms, checkpoint)
     VALUES ($1, $2, $2, '\\x'::bytea) ON CONFLICT (id) DO NOTHING RETURNING key";

/// One statement takes the sequences, rewrites the checkpoint, extends the
/// history, sets a first title, adds the log row and, when it appends
/// events, notifies `keel_log` with the session id and its new last
/// sequence (delivered at commit; see `listen.rs`); matching no row (an
/// unknown session, a stale lease, a cut longer than the history) writes
/// nothing. The row lock the update takes orders concurrent writers of one
/// session (in any process): the second waits, then numbers its events
/// after the first's.
const WRITE: &str = "WITH s AS (
         UPDATE sessions SET
             last_sequence = last_sequence + $1,
             updated_at_ms = $2,
             checkpoint = coalesce($3, checkpoint),
             execution = CASE WHEN $3 IS NULL THEN execution ELSE $4 END,
             transcript_len = coalesce($9, transcript_len) + $5,
             bot_id = coalesce($8, bot_id),
             title = coalesce(title, $10)
         WHERE id = $6 AND ($7 IS NULL OR lease = $7) AND ($9 IS NULL OR $9 <= transcript_len)
         RETURNING key, last_sequence, lease
     ), logged AS (
         INSERT INTO log (session_key, first_sequence, last_sequence, recorded_at_ms, history_cut, history, events)
         SELECT key, last_sequence - $1 + 1, last_sequence, $2, $9, $11, $12 FROM s WHERE $13
     )
     SELECT key, last_sequence, lease,
            CASE WHEN $1 > 0 THEN pg_notify('keel_log', $6 || ' ' || last_sequence) END
     FROM s";

/// [`WRITE`] for appends to many sessions (one each) in one statement: each
/// array holds one value per append; `ord` numbers them, and the result
/// has a row for each append that was written. It notifies as [`WRITE`]
/// does, in the same statement: no round trip is added.
const APPEND_MANY: &str = "WITH input AS (
         SELECT * FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bytea[], $5::int8[], $6::int8[],
                              $7::text[], $8::int8[], $9::text[], $10::bytea[], $11::bytea[], $12::bool[], $13::int4[])
             AS i (id, count, checkpoint, execution, added, lease, bot_id, cut, title, history, events, logged, ord)
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
         RETURNING i.ord, sessions.key, sessions.last_sequence, sessions.lease, sessions.id, i.count
     ), logged AS (
         INSERT INTO log (session_key, first_sequence, last_sequence, recorded_at_ms, history_cut, history, events)
         SELECT s.key, s.last_sequence - i.count + 1, s.last_sequence, $14, i.cut, i.history, i.events
         FROM s JOIN input i ON i.ord = s.ord
         WHERE i.logged
         ORDER BY i.ord
     )
     SELECT ord, key, last_sequence, lease,
            CASE WHEN count > 0 THEN pg_notify('keel_log', id || ' ' || last_sequence) END
     FROM s";

const APPEND_MANY_TYPES: [Type; 14] = [
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
];

const WRITE_TYPES: [Type; 13] = [
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
];

impl Statements {
    async fn prepare(client: &Client) -> Result<Self, tokio_postgres::Error> {
        let (insert_session, write, refusal, queue_upsert, queue_delete, key_insert) = futures::try_join!(
            client.prepare_typed(INSERT_SESSION, &[Type::TEXT, Type::INT8]),
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
            client.prepare_typed(
                "INSERT INTO submission_keys (session_key, key, submission_id, sequence)
                 SELECT $1, * FROM unnest($2::text[], $3::text[], $4::int8[]) ON CONFLICT DO NOTHING",
                &[Type::INT8, Type::TEXT_ARRAY, Type::TEXT_ARRAY, Type::INT8_ARRAY],
            ),
        )?;
        let append_many = client.prepare_typed(APPEND_MANY, &APPEND_MANY_TYPES).await?;
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
            client.prepare_typed("DELETE FROM submission_keys WHERE session_key = $1", &[Type::INT8]),
        )?;
        Ok(Self {
            insert_session,
            write,
            append_many,
            refusal,
            queue_upsert,
            queue_delete,
            key_insert,
            acquire,
            rename,
            delete_session,
            delete_log,
            delete_queue,
            delete_keys,
        })
    }
}

/// The writer's connection, reopened after the server went away.
pub(super) struct WriterConnection {
    config: Config,
    live: Option<(Client, Statements)>,
}

impl WriterConnection {
    /// Takes over `client` (already connected) as the writer's connection.
    pub(super) async fn new(config: Config, client: Client) -> Result<Self, StoreError> {
        let statements = setup(&client).await?;
        Ok(Self {
            config,
            live: Some((client, statements)),
        })
    }

    /// Drops the connection; the next group opens a new one.
    fn reset(&mut self) {
        self.live = None;
    }

    /// The connection, reconnecting first if it was lost.
    async fn ready(&mut self) -> Result<(&mut Client, &Statements), StoreError> {
        if self.live.as_ref().is_some_and(|(client, _)| client.is_closed()) {
            tracing::warn!("the postgres writer connection was lost; reconnecting");
            self.live = None;
        }
        if self.live.is_none() {
            let client = super::connect(&self.config).await?;
            let statements = setup(&client).await?;
            self.live = Some((client, statements));
        }
        match &mut self.live {
            Some((client, statements)) => Ok((client, statements)),
            None => Err(StoreError::Closed),
        }
    }
}

/// Makes every commit durable before it returns, and prepares the writer's
/// statements.
async fn setup(client: &Client) -> Result<Statements, StoreError> {
    client
        .batch_execute("SET synchronous_commit = on")
        .await
        .map_err(super::pg_error)?;
    Statements::prepare(client).await.map_err(super::pg_error)
}

/// Starts the writer task. It runs until every job sender is dropped.
pub(super) fn spawn(
    conn: WriterConnection,
    max_jobs_per_commit: usize,
    counters: Arc<WriterCounters>,
) -> (mpsc::UnboundedSender<Job>, JoinHandle<()>) {
    let (jobs, queue) = mpsc::unbounded_channel();
    let handle = tokio::spawn(run(conn, queue, max_jobs_per_commit.max(1), counters));
    (jobs, handle)
}

async fn run(
    mut conn: WriterConnection,
    mut queue: mpsc::UnboundedReceiver<Job>,
    max_jobs: usize,
    counters: Arc<WriterCounters>,
) {
    let mut group = Vec::with_capacity(max_jobs.min(4096));
    while let Some(first) = queue.recv().await {
        group.push(first);
        while group.len() < max_jobs {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, &mut group, &counters).await;
    }
    tracing::debug!("postgres writer stopped");
}

/// Commits a group of jobs in one transaction and answers each of them.
///
/// A connection found dead when the transaction starts is replaced and the
/// group tried once more (nothing was sent, so nothing can be doubled).
/// After any other loss of the connection the jobs fail with
/// [`StoreError::Unavailable`] (a commit cut off may or may not have
/// happened, so it is not retried) and the next group reconnects.
async fn commit_group(conn: &mut WriterConnection, group: &mut Vec<Job>, counters: &WriterCounters) {
    let mut writes: Option<Vec<Result<Write, StoreError>>> = None;
    let mut retried = false;
    let (outcome, micros) = loop {
        let (client, statements) = match conn.ready().await {
            Ok(ready) => ready,
            Err(error) => {
                tracing::warn!(%error, jobs = group.len(), "postgres writer cannot reach the database");
                for job in group.drain(..) {
                    job.answer(Err(error.clone()));
                }
                return;
            }
        };
        // Sealed as the first transaction starts: an open batch takes
        // additions until now.
        let writes = writes.get_or_insert_with(|| group.iter().map(seal).collect());
        let now = now_ms();
        let started = std::time::Instant::now();
        let outcome = run_group(client, statements, writes, now).await;
        let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        match outcome {
            Err(GroupError::NotStarted(error)) if !retried && matches!(error, StoreError::Unavailable(_)) => {
                tracing::warn!(%error, "postgres writer connection lost; reconnecting");
                conn.reset();
                retried = true;
            }
            Err(GroupError::NotStarted(error) | GroupError::NotCommitted(error)) => break (Err(error), micros),
            Ok(done) => break (Ok(done), micros),
        }
    };
    let lost = match &outcome {
        Err(error) => matches!(error, StoreError::Unavailable(_)),
        Ok((outcomes, _)) => outcomes
            .iter()
            .any(|outcome| matches!(outcome, Err(StoreError::Unavailable(_)))),
    };
    if lost {
        conn.reset();
    }
    let writes = writes.unwrap_or_default();
    if let Ok((outcomes, commits)) = &outcome {
        // Count only what was written.
        let (jobs, events) = writes
            .iter()
            .zip(outcomes)
            .filter(|(_, outcome)| outcome.is_ok())
            .fold((0, 0), |(jobs, events), (write, _)| {
                (jobs + 1, events + write.as_ref().map_or(0, |write| write.count))
            });
        counters.commits.fetch_add(*commits, Ordering::Relaxed);
        counters.jobs.fetch_add(jobs, Ordering::Relaxed);
        counters.events.fetch_add(events, Ordering::Relaxed);
        counters.commit_micros.fetch_add(micros, Ordering::Relaxed);
    }
    match outcome {
        Ok((outcomes, _)) => {
            for (job, outcome) in group.drain(..).zip(outcomes) {
                job.answer(outcome);
            }
        }
        Err(error) => {
            tracing::warn!(%error, jobs = group.len(), "postgres group commit failed");
            for job in group.drain(..) {
                job.answer(Err(error.clone()));
            }
        }
    }
    tracing::trace!(micros, "group committed");
}

/// Why nothing of a group was committed.
enum GroupError {
    /// The transaction could not even start: nothing was sent.
    NotStarted(StoreError),
    /// The transaction or its commit failed.
    NotCommitted(StoreError),
}

fn dirty(error: tokio_postgres::Error) -> JobError {
    JobError::Dirty(super::pg_error(error))
}

/// Outcomes of a group, per job, and how many transactions committed.
type GroupOutcome = (Vec<Result<Written, StoreError>>, u64);

/// Applies every job of the group and commits; the outer error means
/// nothing of the group was committed.
///
/// The fast path runs every job in one transaction: the errors jobs are
/// expected to hit (an unknown session, a stale lease, an existing id, an
/// invalid write) are found without a failing statement, so they need no
/// rollback. A statement that fails (a full disk, a lost connection, a
/// deadlock with another process) aborts the transaction; then it is rolled
/// back and each job is retried in a transaction of its own, so one job's
/// failure cannot take the others down with it.
async fn run_group(
    client: &mut Client,
    statements: &Statements,
    writes: &[Result<Write, StoreError>],
    now: u64,
) -> Result<GroupOutcome, GroupError> {
    let tx = client
        .transaction()
        .await
        .map_err(|error| GroupError::NotStarted(super::pg_error(error)))?;
    let outcomes = apply_all(&tx, statements, writes, now).await;
    if let Some(error) = outcomes.iter().find_map(|outcome| match outcome {
        Err(JobError::Dirty(error)) => Some(error.clone()),
        _ => None,
    }) {
        tracing::warn!(%error, "a write failed part-way; retrying the group one job at a time");
        let _ = tx.rollback().await;
        let mut outcomes = Vec::with_capacity(writes.len());
        let mut commits = 0;
        for write in writes {
            let outcome = run_alone(client, statements, write, now).await;
            commits += u64::from(outcome.is_ok());
            outcomes.push(outcome);
        }
        return Ok((outcomes, commits));
    }
    tx.commit()
        .await
        .map_err(|error| GroupError::NotCommitted(super::pg_error(error)))?;
    Ok((
        outcomes
            .into_iter()
            .map(|outcome| outcome.map_err(JobError::into_inner))
            .collect(),
        1,
    ))
}

/// Runs one job in a transaction of its own.
async fn run_alone(
    client: &mut Client,
    statements: &Statements,
    write: &Result<Write, StoreError>,
    now: u64,
) -> Result<Written, StoreError> {
    let write = write.as_ref().map_err(Clone::clone)?;
    let tx = client.transaction().await.map_err(super::pg_error)?;
    let outcome = if matches!(write.mode, Mode::Append { .. }) {
        append_all(&tx, statements, &[(0, write)], now)
            .await
            .pop()
            .map_or_else(|| Err(JobError::Clean(StoreError::Closed)), |(_, outcome)| outcome)
    } else {
        apply(&tx, statements, write, now).await
    };
    let written = outcome.map_err(JobError::into_inner)?;
    tx.commit().await.map_err(super::pg_error)?;
    Ok(written)
}

/// A job's write and its index in the group.
type Indexed<'a> = (usize, &'a Write);

/// Applies the group's jobs in `tx`, in rounds: round `k` holds the `k`th
/// job of every session that has one, so a session's jobs run in order and
/// a round never holds two of one session. A round's appends are written
/// by one statement (see [`append_all`]); its other jobs run beside it,
/// all sent at once (pipelined).
async fn apply_all(
    tx: &Transaction<'_>,
    statements: &Statements,
    writes: &[Result<Write, StoreError>],
    now: u64,
) -> Vec<Result<Written, JobError>> {
    let mut chains: Vec<Vec<Indexed<'_>>> = Vec::new();
    let mut by_session: HashMap<&str, usize> = HashMap::new();
    for (index, write) in writes.iter().enumerate() {
        if let Ok(write) = write {
            let chain = *by_session.entry(write.session_id.as_str()).or_insert_with(|| {
                chains.push(Vec::new());
                chains.len() - 1
            });
            chains[chain].push((index, write));
        }
    }
    let mut outcomes: Vec<Option<Result<Written, JobError>>> = writes
        .iter()
        .map(|write| write.as_ref().err().map(|error| Err(JobError::Clean(error.clone()))))
        .collect();
    let rounds = chains.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..rounds {
        let (appends, others): (Vec<Indexed<'_>>, Vec<Indexed<'_>>) = chains
            .iter()
            .filter_map(|chain| chain.get(round).copied())
            .partition(|(_, write)| matches!(write.mode, Mode::Append { .. }));
        let (appended, others) = futures::join!(
            append_all(tx, statements, &appends, now),
            join_all(
                others
                    .iter()
                    .map(|&(index, write)| async move { (index, apply(tx, statements, write, now).await) })
            ),
        );
        let mut failed = false;
        for (index, outcome) in appended.into_iter().chain(others) {
            failed |= matches!(outcome, Err(JobError::Dirty(_)));
            outcomes[index] = Some(outcome);
        }
        if failed {
            // The transaction is aborted: the group is retried job by job.
            break;
        }
    }
    outcomes
        .into_iter()
        .map(|outcome| {
            outcome.unwrap_or_else(|| {
                Err(JobError::Dirty(StoreError::Invalid(
                    "not written: an earlier write of the group failed".to_owned(),
                )))
            })
        })
        .collect()
}

/// Writes appends to distinct sessions with one statement ([`APPEND_MANY`]),
/// then their queue changes, and finds why each append that matched no row
/// was refused; returns each job's outcome by its index in the group.
async fn append_all(
    tx: &Transaction<'_>,
    st: &Statements,
    appends: &[Indexed<'_>],
    now: u64,
) -> Vec<(usize, Result<Written, JobError>)> {
    if appends.is_empty() {
        return Vec::new();
    }
    let writes: Vec<&Write> = appends.iter().map(|(_, write)| *write).collect();
    fn checkpoint<'w>(write: &&'w Write) -> Option<&'w EncodedWrite> {
        write.checkpoint.as_ref()
    }
    let ids: Vec<&str> = writes.iter().map(|write| write.session_id.as_str()).collect();
    let counts: Vec<i64> = writes.iter().map(|write| int(write.count)).collect();
    let checkpoints: Vec<Option<&[u8]>> = writes
        .iter()
        .map(|write| checkpoint(write).map(|write| write.checkpoint.as_slice()))
        .collect();
    let executions: Vec<Option<&[u8]>> = writes
        .iter()
        .map(|write| checkpoint(write).and_then(|write| write.execution.as_deref()))
        .collect();
    let added: Vec<i64> = writes
        .iter()
        .map(|write| int(checkpoint(write).map_or(0, |write| write.added)))
        .collect();
    let leases: Vec<Option<i64>> = writes
        .iter()
        .map(|write| match write.mode {
            Mode::Append { lease } => lease.map(int),
            _ => None,
        })
        .collect();
    let bots: Vec<Option<&str>> = writes
        .iter()
        .map(|write| checkpoint(write).map(|write| write.bot_id.as_str()))
        .collect();
    let cuts: Vec<Option<i64>> = writes
        .iter()
        .map(|write| checkpoint(write).and_then(|write| write.history_cut).map(int))
        .collect();
    let titles: Vec<Option<&str>> = writes.iter().map(|write| write.title.as_deref()).collect();
    let histories: Vec<Option<&[u8]>> = writes
        .iter()
        .map(|write| checkpoint(write).and_then(|write| write.history.as_deref()))
        .collect();
    let events: Vec<&[u8]> = writes.iter().map(|write| write.events.as_slice()).collect();
    let logged: Vec<bool> = writes
        .iter()
        .map(|write| {
            write.count > 0
                || checkpoint(write).is_some_and(|write| write.history.is_some() || write.history_cut.is_some())
        })
        .collect();
    let ords: Vec<i32> = (0..writes.len())
        .map(|ord| i32::try_from(ord).unwrap_or(i32::MAX))
        .collect();
    let now_sql = int(now);
    let params: [&(dyn ToSql + Sync); 14] = [
        &ids,
        &counts,
        &checkpoints,
        &executions,
        &added,
        &leases,
        &bots,
        &cuts,
        &titles,
        &histories,
        &events,
        &logged,
        &ords,
        &now_sql,
    ];
    let rows = match tx.query(&st.append_many, &params).await {
        Ok(rows) => rows,
        Err(error) => {
            let error = super::pg_error(error);
            return appends
                .iter()
                .map(|&(index, _)| (index, Err(JobError::Dirty(error.clone()))))
                .collect();
        }
    };
    let mut written: Vec<Option<(i64, u64, u64)>> = vec![None; writes.len()];
    for row in &rows {
        let read = (|| -> Result<(usize, (i64, u64, u64)), tokio_postgres::Error> {
            let ord: i32 = row.try_get(0)?;
            Ok((
                usize::try_from(ord).unwrap_or(usize::MAX),
                (row.try_get(1)?, uint(row.try_get(2)?), uint(row.try_get(3)?)),
            ))
        })();
        match read {
            Ok((ord, values)) if ord < written.len() => written[ord] = Some(values),
            Ok(_) => {}
            Err(error) => {
                let error = super::pg_error(error);
                return appends
                    .iter()
                    .map(|&(index, _)| (index, Err(JobError::Dirty(error.clone()))))
                    .collect();
            }
        }
    }
    join_all(
        appends
            .iter()
            .zip(written)
            .map(|(&(index, write), written)| async move {
                let Some((key, last_sequence, lease)) = written else {
                    let refused = match refusal(tx, st, &write.session_id, write).await {
                        Ok(error) => JobError::Clean(error),
                        Err(error) => error,
                    };
                    return (index, Err(refused));
                };
                let first_sequence = last_sequence + 1 - write.count;
                if !write.queue.is_empty()
                    && let Err(error) = apply_queue_changes(tx, st, key, first_sequence, &write.queue).await
                {
                    return (index, Err(error));
                }
                let receipt = AppendReceipt {
                    first_sequence,
                    recorded_at_ms: now,
                };
                (index, Ok(Written { receipt, lease }))
            }),
    )
    .await
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

/// Applies one job on its own. The group's appends go through
/// [`append_all`] instead; one given here is written by [`WRITE`], with the
/// same effect.
async fn apply(tx: &Transaction<'_>, st: &Statements, write: &Write, now: u64) -> Result<Written, JobError> {
    let session_id = write.session_id.as_str();
    let now_sql = int(now);
    let lease = match write.mode {
        Mode::Acquire => return acquire(tx, st, session_id, now).await,
        Mode::Delete => return delete(tx, st, session_id, now).await,
        Mode::Rename => return rename(tx, st, session_id, write.title.as_deref().unwrap_or_default(), now).await,
        Mode::Append { lease } => lease.map(int),
        Mode::Save | Mode::Create => None,
    };
    let checkpoint = write.checkpoint.as_ref();
    let history_cut = checkpoint.and_then(|write| write.history_cut).map(int);
    let count = int(write.count);
    let added = int(checkpoint.map_or(0, |write| write.added));
    let write_log =
        write.count > 0 || checkpoint.is_some_and(|write| write.history.is_some() || write.history_cut.is_some());
    let params: [&(dyn ToSql + Sync); 13] = [
        &count,
        &now_sql,
        &checkpoint.map(|write| write.checkpoint.as_slice()),
        &checkpoint.and_then(|write| write.execution.as_deref()),
        &added,
        &session_id,
        &lease,
        &checkpoint.map(|write| write.bot_id.as_str()),
        &history_cut,
        &write.title,
        &checkpoint.and_then(|write| write.history.as_deref()),
        &write.events.as_slice(),
        &write_log,
    ];
    let row = match write.mode {
        Mode::Create => {
            let created = tx
                .query_opt(&st.insert_session, &[&session_id, &now_sql])
                .await
                .map_err(dirty)?;
            if created.is_none() {
                return Err(JobError::Clean(StoreError::Exists(session_id.to_owned())));
            }
            tx.query_opt(&st.write, &params).await.map_err(dirty)?
        }
        Mode::Save => {
            // Both sent at once: the insert runs first, the write sees it.
            let insert: [&(dyn ToSql + Sync); 2] = [&session_id, &now_sql];
            let (_, row) = futures::try_join!(
                tx.query_opt(&st.insert_session, &insert),
                tx.query_opt(&st.write, &params),
            )
            .map_err(dirty)?;
            row
        }
        _ => tx.query_opt(&st.write, &params).await.map_err(dirty)?,
    };
    let Some(row) = row else {
        return Err(JobError::Clean(refusal(tx, st, session_id, write).await?));
    };
    let key: i64 = row.try_get(0).map_err(dirty)?;
    let last_sequence = uint(row.try_get(1).map_err(dirty)?);
    let lease = uint(row.try_get(2).map_err(dirty)?);
    let first_sequence = last_sequence + 1 - write.count;
    if !write.queue.is_empty() {
        apply_queue_changes(tx, st, key, first_sequence, &write.queue).await?;
    }
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence,
            recorded_at_ms: now,
        },
        lease,
    })
}

/// Applies a batch's queue changes: the submissions it queued join the
/// queue (with their idempotency keys), the ones it settled leave it.
///
/// Applied in order, changes to one submission leave only the last one in
/// force, and of two uses of one idempotency key the first one stands; so
/// the batch's net changes are computed here, and sent as at most three
/// statements whose order does not matter (pipelined).
async fn apply_queue_changes(
    tx: &Transaction<'_>,
    st: &Statements,
    key: i64,
    first_sequence: u64,
    changes: &[(u64, QueueChange)],
) -> Result<(), JobError> {
    let mut last: HashMap<&str, (u64, &QueueChange)> = HashMap::new();
    let mut keys: Vec<(&str, &str, u64)> = Vec::new();
    for (offset, change) in changes {
        let sequence = first_sequence + offset;
        let id = match change {
            QueueChange::Queued {
                submission,
                idempotency_key,
            } => {
                if let Some(idempotency_key) = idempotency_key
                    && !keys.iter().any(|(known, _, _)| known == idempotency_key)
                {
                    keys.push((idempotency_key, &submission.id, sequence));
                }
                submission.id.as_str()
            }
            QueueChange::Settled(id) => id.as_str(),
        };
        last.insert(id, (sequence, change));
    }
    let (mut queued_ids, mut queued_sequences, mut queued_json, mut settled) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, (sequence, change)) in last {
        match change {
            QueueChange::Queued { submission, .. } => {
                let stored = QueuedSubmission {
                    sequence,
                    ..(**submission).clone()
                };
                let json = serde_json::to_string(&stored)
                    .map_err(|error| JobError::Dirty(StoreError::Encode(error.to_string())))?;
                queued_ids.push(id.to_owned());
                queued_sequences.push(int(sequence));
                queued_json.push(codec::encode(json).into_bytes());
            }
            QueueChange::Settled(_) => settled.push(id.to_owned()),
        }
    }
    let key_names: Vec<&str> = keys.iter().map(|(name, _, _)| *name).collect();
    let key_ids: Vec<&str> = keys.iter().map(|(_, id, _)| *id).collect();
    let key_sequences: Vec<i64> = keys.iter().map(|(_, _, sequence)| int(*sequence)).collect();
    let upsert = async {
        if queued_ids.is_empty() {
            return Ok(0);
        }
        tx.execute(&st.queue_upsert, &[&key, &queued_ids, &queued_sequences, &queued_json])
            .await
    };
    let delete = async {
        if settled.is_empty() {
            return Ok(0);
        }
        tx.execute(&st.queue_delete, &[&key, &settled]).await
    };
    let remember = async {
        if key_names.is_empty() {
            return Ok(0);
        }
        tx.execute(&st.key_insert, &[&key, &key_names, &key_ids, &key_sequences])
            .await
    };
    futures::try_join!(upsert, delete, remember).map_err(dirty)?;
    Ok(())
}

/// Why a write matched no row: the session is unknown, the cut is longer
/// than its history, or another holder took it over.
async fn refusal(
    tx: &Transaction<'_>,
    st: &Statements,
    session_id: &str,
    write: &Write,
) -> Result<StoreError, JobError> {
    let Some(row) = tx.query_opt(&st.refusal, &[&session_id]).await.map_err(dirty)? else {
        return Ok(StoreError::UnknownSession(session_id.to_owned()));
    };
    let lease = uint(row.try_get(0).map_err(dirty)?);
    let length = uint(row.try_get(1).map_err(dirty)?);
    if let Some(cut) = write.checkpoint.as_ref().and_then(|write| write.history_cut)
        && cut > length
    {
        return Ok(StoreError::Invalid(format!(
            "cannot cut the history of session '{session_id}' to {cut} items: it has {length}"
        )));
    }
    Ok(match write.mode {
        Mode::Append { lease: Some(held) } if held != lease => StoreError::Fenced {
            session_id: session_id.to_owned(),
            lease,
        },
        // Not reachable: the row exists and nothing else refuses.
        _ => StoreError::UnknownSession(session_id.to_owned()),
    })
}

/// Takes the session over for a new holder.
async fn acquire(tx: &Transaction<'_>, st: &Statements, session_id: &str, now: u64) -> Result<Written, JobError> {
    let row = tx
        .query_opt(&st.acquire, &[&int(now), &session_id])
        .await
        .map_err(dirty)?
        .ok_or_else(|| JobError::Clean(StoreError::UnknownSession(session_id.to_owned())))?;
    let lease = uint(row.try_get(0).map_err(dirty)?);
    let last_sequence = uint(row.try_get(1).map_err(dirty)?);
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: last_sequence + 1,
            recorded_at_ms: now,
        },
        lease,
    })
}

/// Sets a session's title.
async fn rename(
    tx: &Transaction<'_>,
    st: &Statements,
    session_id: &str,
    title: &str,
    now: u64,
) -> Result<Written, JobError> {
    tx.query_opt(&st.rename, &[&session_id, &title])
        .await
        .map_err(dirty)?
        .ok_or_else(|| JobError::Clean(StoreError::UnknownSession(session_id.to_owned())))?;
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: 0,
            recorded_at_ms: now,
        },
        lease: 0,
    })
}

/// Deletes a session's rows: the session, its log, its queue (stored and
/// relayed) and its idempotency keys, all in the group's transaction.
async fn delete(tx: &Transaction<'_>, st: &Statements, session_id: &str, now: u64) -> Result<Written, JobError> {
    let row = tx
        .query_opt(&st.delete_session, &[&session_id])
        .await
        .map_err(dirty)?
        .ok_or_else(|| JobError::Clean(StoreError::UnknownSession(session_id.to_owned())))?;
    let key: i64 = row.try_get(0).map_err(dirty)?;
    let by_key: [&(dyn ToSql + Sync); 1] = [&key];
    futures::try_join!(
        tx.execute(&st.delete_log, &by_key),
        tx.execute(&st.delete_queue, &by_key),
        tx.execute(&st.delete_keys, &by_key),
    )
    .map_err(dirty)?;
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: 0,
            recorded_at_ms: now,
        },
        lease: 0,
    })
}

/// Checks and serializes a checkpoint write for `session_id`.
fn encode_write(session_id: &str, write: &CheckpointWrite) -> Result<EncodedWrite, StoreError> {
    check_addressed(session_id, write)?;
    let history = if write.transcript_delta.is_empty() {
        None
    } else {
        let items = write
            .transcript_delta
            .iter()
            .map(encode)
            .collect::<Result<Vec<_>, _>>()?;
        Some(stored(json_array(items.iter().map(String::as_str))))
    };
    Ok(EncodedWrite {
        checkpoint: stored(encode(&write.checkpoint)?),
        bot_id: write.checkpoint.session_context.bot_id.clone(),
        execution: write.execution.as_ref().map(encode).transpose()?.map(stored),
        history,
        added: write.transcript_delta.len() as u64,
        history_cut: write.history_cut,
    })
}

/// The stored bytes of `json` (see [`codec`]).
fn stored(json: String) -> Vec<u8> {
    codec::encode(json).into_bytes()
}
