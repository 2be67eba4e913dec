//! The single writer thread of a SQLite database, and its group commit.
//!
//! Every write of every session goes through one thread that owns the write
//! connection. Each time it wakes it takes *all* queued jobs (up to a limit)
//! and commits them in one transaction, so concurrent sessions share each
//! fsync. One failing job (say, an unknown session) does not fail the others
//! (see [`run_group`]). Each job is answered only after the commit that made
//! it durable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::codec;
use super::identity::FileIdentity;
use super::reserve::SpaceReserve;
use super::slots::TurnSlots;
use crate::job::{Job, JobError, Mode, Sealed, Written, check_addressed, encode};
use crate::{AppendReceipt, CheckpointWrite, QueueChange, QueuedSubmission, StoreError};
use keel_protocol::now_ms;

/// Counters of the writer's work, readable while it runs.
#[derive(Debug, Default)]
pub(super) struct WriterCounters {
    pub(super) commits: AtomicU64,
    pub(super) jobs: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) commit_micros: AtomicU64,
    pub(super) checkpoints: AtomicU64,
}

/// Starts the writer thread. It runs until every job sender is dropped.
pub(super) fn spawn(
    conn: Connection,
    max_jobs_per_commit: usize,
    counters: Arc<WriterCounters>,
    identity: Arc<FileIdentity>,
    reserve: Arc<SpaceReserve>,
    turn_slots: Arc<TurnSlots>,
) -> std::io::Result<(mpsc::Sender<Job>, JoinHandle<()>)> {
    let (jobs, queue) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("keel-sqlite-writer".into())
        .spawn(move || {
            let context = Context {
                counters: &counters,
                identity: &identity,
                reserve: &reserve,
                turn_slots: &turn_slots,
            };
            run(conn, queue, max_jobs_per_commit.max(1), &context);
        })?;
    Ok((jobs, handle))
}

/// What the writer works with besides its connection.
struct Context<'a> {
    counters: &'a WriterCounters,
    identity: &'a FileIdentity,
    reserve: &'a SpaceReserve,
    turn_slots: &'a TurnSlots,
}

/// How long the writer waits for a job before it looks after the space
/// reserve.
const IDLE_WAKE: std::time::Duration = std::time::Duration::from_secs(1);

fn run(mut conn: Connection, queue: mpsc::Receiver<Job>, max_jobs: usize, context: &Context<'_>) {
    let Context { identity, reserve, .. } = *context;
    let mut group = Vec::with_capacity(max_jobs);
    loop {
        // A ballast released for a full disk is allocated again once there
        // is room, whether or not anything is being written.
        reserve.restore();
        let first = match queue.recv_timeout(IDLE_WAKE) {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        group.push(first);
        while group.len() < max_jobs {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        // A database deleted or replaced under its path takes no more
        // writes: they would be acknowledged and then lost. Nor does one
        // whose `-shm` was frozen: writing its mapping would be SIGBUS.
        if let Err(error) = identity.usable() {
            for job in group.drain(..) {
                job.answer(Err(error.clone()));
            }
            continue;
        }
        commit_group(&mut conn, &mut group, context);
    }
    // Fold the WAL into the database now, while this connection can: the
    // checkpoint SQLite runs when the last connection closes is skipped if
    // another connection (the checkpointer's) is still open then.
    if identity.check().is_ok()
        && identity.writable().is_ok()
        && let Err(error) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
    {
        tracing::warn!(%error, "the WAL could not be checkpointed at close");
    }
    tracing::debug!("sqlite writer stopped");
}

/// Commits a group of jobs in one transaction and answers each of them.
fn commit_group(conn: &mut Connection, group: &mut Vec<Job>, context: &Context<'_>) {
    let Context {
        counters,
        identity,
        reserve,
        turn_slots,
    } = *context;
    let now = now_ms();
    let started = std::time::Instant::now();
    let writes: Vec<Sealed<'_>> = group.iter().map(Job::seal).collect();
    // Checked again after the commit: a file deleted while it ran got the
    // commit, but no one will read it, so it is not acknowledged.
    let outcome = run_group(conn, &writes, now, reserve).and_then(|done| {
        identity
            .check()
            .and_then(|()| identity.file_system_writable())
            .map(|()| done)
    });
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    if let Ok((outcomes, commits)) = &outcome {
        // Count only what was written.
        let written = writes.iter().zip(outcomes).filter(|(_, outcome)| outcome.is_ok());
        let (jobs, events) = written.fold((0, 0), |(jobs, events), (write, _)| {
            (jobs + 1, events + write.events.len())
        });
        counters.commits.fetch_add(*commits, Ordering::Relaxed);
        counters.jobs.fetch_add(jobs, Ordering::Relaxed);
        counters.events.fetch_add(events as u64, Ordering::Relaxed);
        counters.commit_micros.fetch_add(micros, Ordering::Relaxed);
    }
    if let Ok((outcomes, _)) = &outcome
        && !turn_slots.is_empty()
    {
        turn_slots.give_back(conn, &writes, outcomes, now);
    }
    drop(writes);
    Job::answer_group(group, outcome.map(|(outcomes, _)| outcomes), "sqlite");
    tracing::trace!(micros, "group committed");
}

/// Applies every job of the group and commits; returns each job's outcome
/// and the number of transactions committed. The outer error means nothing
/// of the group was committed.
///
/// The fast path runs every job in one transaction without savepoints: the
/// errors jobs are expected to hit (an unknown session, an invalid write) are
/// found before the job writes anything, so they need no rollback. If a job
/// fails after it started writing (a full disk, an I/O error), the
/// transaction is rolled back and each job is retried in a transaction of its
/// own, so one job's failure cannot take the others down with it.
///
/// A group that met a full disk (at commit or part-way, with nothing
/// committed either way) is tried once more after the space reserve gave
/// its room back.
fn run_group(
    conn: &mut Connection,
    group: &[Sealed<'_>],
    now: u64,
    reserve: &SpaceReserve,
) -> Result<(Vec<Result<Written, StoreError>>, u64), StoreError> {
    let mut attempt = try_group(conn, group, now);
    let full = match &attempt {
        Err(error) | Ok(Attempt::Dirty(error)) => matches!(error, StoreError::Full(_)),
        Ok(Attempt::Committed(_)) => false,
    };
    if full && reserve.release_for_commit() {
        attempt = try_group(conn, group, now);
    }
    match attempt? {
        Attempt::Committed(outcomes) => Ok((outcomes, 1)),
        Attempt::Dirty(error) => {
            tracing::warn!(%error, "a write failed part-way; retrying the group one job at a time");
            let outcomes: Vec<_> = group.iter().map(|job| run_alone(conn, job, now)).collect();
            let commits = outcomes.iter().filter(|outcome| outcome.is_ok()).count() as u64;
            Ok((outcomes, commits))
        }
    }
}

/// What one try at a group's transaction did.
enum Attempt {
    /// Committed; each job's outcome.
    Committed(Vec<Result<Written, StoreError>>),
    /// A job failed after it started writing; the transaction was rolled
    /// back, nothing is committed.
    Dirty(StoreError),
}

/// Applies every job of the group in one transaction and commits it.
fn try_group(conn: &mut Connection, group: &[Sealed<'_>], now: u64) -> Result<Attempt, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let mut outcomes = Vec::with_capacity(group.len());
    for job in group {
        match apply(&tx, job, now) {
            Ok(receipt) => outcomes.push(Ok(receipt)),
            Err(JobError::Clean(error)) => outcomes.push(Err(error)),
            Err(JobError::Dirty(error)) => return Ok(Attempt::Dirty(error)),
        }
    }
    tx.commit().map_err(super::sqlite_error)?;
    Ok(Attempt::Committed(outcomes))
}

/// Runs one job in a transaction of its own.
fn run_alone(conn: &mut Connection, job: &Sealed<'_>, now: u64) -> Result<Written, StoreError> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let receipt = apply(&tx, job, now).map_err(JobError::into_inner)?;
    tx.commit().map_err(super::sqlite_error)?;
    Ok(receipt)
}

fn dirty(error: rusqlite::Error) -> JobError {
    JobError::Dirty(super::sqlite_error(error))
}

/// A checkpoint write, serialized before anything is written.
struct EncodedWrite {
    checkpoint: String,
    /// The checkpoint's bot, kept in a column of its own for listing.
    bot_id: String,
    /// The checkpoint's tenant, stored when the write makes the session.
    tenant: String,
    execution: Option<String>,
    transcript: Vec<String>,
    /// The history's length to cut back to before `transcript` is added.
    history_cut: Option<u64>,
}

fn apply(conn: &Connection, job: &Sealed<'_>, now: u64) -> Result<Written, JobError> {
    let Sealed {
        session_id,
        events,
        checkpoint,
        mode,
        title,
    } = job;
    if *mode == Mode::Acquire {
        return acquire(conn, session_id, now);
    }
    if *mode == Mode::Delete {
        return delete(conn, session_id, now);
    }
    if *mode == Mode::Rename {
        return rename(conn, session_id, title.unwrap_or_default(), now);
    }
    let write = checkpoint
        .as_deref()
        .map(|write| encode_write(session_id, write))
        .transpose()
        .map_err(JobError::Clean)?;
    if matches!(mode, Mode::Save | Mode::Create) {
        // The tenant is the one the session is made for; later writes
        // never move it.
        let tenant = write
            .as_ref()
            .map_or(keel_protocol::DEFAULT_TENANT, |write| write.tenant.as_str());
        let created = conn
            .prepare_cached(
                "INSERT INTO sessions (id, created_at_ms, updated_at_ms, checkpoint, tenant)
                 VALUES (?1, ?2, ?2, '{}', ?3)
                 ON CONFLICT (id) DO NOTHING",
            )
            .and_then(|mut insert| insert.execute(params![session_id, now, tenant]))
            .map_err(dirty)?;
        if *mode == Mode::Create && created == 0 {
            return Err(JobError::Clean(StoreError::Exists((*session_id).to_owned())));
        }
    }
    let lease = match mode {
        Mode::Append { lease } => *lease,
        Mode::Save | Mode::Create | Mode::Acquire | Mode::Delete | Mode::Rename => None,
    };
    // One statement takes the sequences, rewrites the checkpoint and extends
    // the history; matching no row means the session does not exist, and then
    // nothing was written.
    let count = events.len() as u64;
    let added = write.as_ref().map_or(0, |write| write.transcript.len() as u64);
    let history_cut = write.as_ref().and_then(|write| write.history_cut);
    if let Some(cut) = history_cut {
        check_cut(conn, session_id, cut)?;
    }
    let (checkpoint, execution, bot_id) = match &write {
        Some(write) => (
            Some(write.checkpoint.as_str()),
            write.execution.as_deref(),
            Some(write.bot_id.as_str()),
        ),
        None => (None, None, None),
    };
    let row: Option<(i64, u64, u64, String, String)> = conn
        .prepare_cached(
            "UPDATE sessions SET
                 last_sequence = last_sequence + ?1,
                 updated_at_ms = ?2,
                 checkpoint = coalesce(?3, checkpoint),
                 execution = CASE WHEN ?3 IS NULL THEN execution ELSE ?4 END,
                 transcript_len = coalesce(?9, transcript_len) + ?5,
                 bot_id = coalesce(?8, bot_id)
             WHERE id = ?6 AND (?7 IS NULL OR lease = ?7)
             RETURNING key, last_sequence, lease, tenant, bot_id",
        )
        .and_then(|mut update| {
            update
                .query_row(
                    params![
                        count,
                        now,
                        checkpoint,
                        execution,
                        added,
                        session_id,
                        lease,
                        bot_id,
                        history_cut
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
                )
                .optional()
        })
        .map_err(dirty)?;
    let Some((key, last_sequence, lease, tenant, bot_id)) = row else {
        return Err(JobError::Clean(refusal(conn, session_id)?));
    };
    let first_sequence = last_sequence - count + 1;
    let history = write
        .as_ref()
        .filter(|write| !write.transcript.is_empty())
        .map(|write| crate::codec::json_array(&write.transcript));
    if count > 0 || history.is_some() || history_cut.is_some() {
        conn.prepare_cached(
            "INSERT INTO log (session_key, first_sequence, last_sequence, recorded_at_ms, history, events, history_cut)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .and_then(|mut insert| {
            let events = codec::encode(crate::codec::json_array(events.iter().map(|event| &event.json)));
            let history = history.map(codec::encode);
            insert.execute(params![
                key,
                first_sequence,
                last_sequence,
                now,
                history,
                events,
                history_cut
            ])
        })
        .map_err(dirty)?;
    }
    for (offset, event) in events.iter().enumerate() {
        if let Some(change) = &event.queue {
            apply_queue_change(conn, key, first_sequence + offset as u64, change)?;
        }
    }
    if let Some(usage) = crate::EncodedEvent::batch_usage(events) {
        super::access::add_usage(conn, &tenant, session_id, now, &usage).map_err(dirty)?;
    }
    let queuing = super::webhooks::Queuing {
        key,
        session_id,
        bot_id: &bot_id,
        tenant: &tenant,
        now,
    };
    for (offset, event) in events.iter().enumerate() {
        let sequence = first_sequence + offset as u64;
        if let Some(kind) = event.webhook {
            super::webhooks::queue_deliveries(conn, &queuing, sequence, kind, false).map_err(dirty)?;
        }
        if event.ends_turn {
            let idle = keel_protocol::SESSION_IDLE_WEBHOOK;
            super::webhooks::queue_deliveries(conn, &queuing, sequence, idle, true).map_err(dirty)?;
        }
    }
    // The first user message titles a session that has no title yet.
    if let Some(title) = events.iter().find_map(|event| event.title.as_deref()) {
        conn.prepare_cached("UPDATE sessions SET title = ?2 WHERE key = ?1 AND title IS NULL")
            .and_then(|mut update| update.execute(params![key, title]))
            .map_err(dirty)?;
    }
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence,
            recorded_at_ms: now,
        },
        lease,
    })
}

/// Remembers that `idempotency_key` names submission `submission_id`, whose
/// event is at `sequence`. A key names one submission for ever: the same
/// submission again changes nothing, and another one under a key already
/// taken refuses the whole write (see [`key_taken`]), so no interleaving of
/// nodes and retries can store a key twice.
fn remember_key(
    conn: &Connection,
    key: i64,
    idempotency_key: &str,
    submission_id: &str,
    sequence: u64,
) -> Result<(), JobError> {
    let inserted = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO submission_keys (session_key, key, submission_id, sequence)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut insert| insert.execute(params![key, idempotency_key, submission_id, sequence]))
        .map_err(dirty)?;
    if inserted == 0 {
        let holder: String = conn
            .prepare_cached("SELECT submission_id FROM submission_keys WHERE session_key = ?1 AND key = ?2")
            .and_then(|mut select| select.query_row(params![key, idempotency_key], |row| row.get(0)))
            .map_err(dirty)?;
        if holder != submission_id {
            return Err(JobError::Dirty(crate::job::key_taken(
                idempotency_key,
                &holder,
                submission_id,
            )));
        }
    }
    Ok(())
}

/// Adds a queued submission (and its idempotency key), removes a settled
/// one, or remembers a refused one's key, in the transaction of the event
/// that does it.
fn apply_queue_change(conn: &Connection, key: i64, sequence: u64, change: &QueueChange) -> Result<(), JobError> {
    match change {
        QueueChange::Queued {
            submission,
            idempotency_key,
        } => {
            let stored = QueuedSubmission {
                sequence,
                ..(**submission).clone()
            };
            let json = encode(&stored).map_err(JobError::Clean)?;
            conn.prepare_cached(
                "INSERT OR REPLACE INTO queued_submissions (session_key, id, sequence, submission) VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut insert| insert.execute(params![key, stored.id, sequence, json]))
            .map_err(dirty)?;
            if let Some(idempotency_key) = idempotency_key {
                remember_key(conn, key, idempotency_key, &stored.id, sequence)?;
            }
        }
        QueueChange::Refused {
            submission_id,
            idempotency_key,
        } => remember_key(conn, key, idempotency_key, submission_id, sequence)?,
        QueueChange::Settled(id) => {
            conn.prepare_cached("DELETE FROM queued_submissions WHERE session_key = ?1 AND id = ?2")
                .and_then(|mut delete| delete.execute(params![key, id]))
                .map_err(dirty)?;
        }
    }
    Ok(())
}

/// Takes the session over for a new holder.
fn acquire(conn: &Connection, session_id: &str, now: u64) -> Result<Written, JobError> {
    let row: Option<(u64, u64)> = conn
        .prepare_cached(
            "UPDATE sessions SET lease = lease + 1, updated_at_ms = ?1 WHERE id = ?2 RETURNING lease, last_sequence",
        )
        .and_then(|mut update| {
            update
                .query_row(params![now, session_id], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(dirty)?;
    let Some((lease, last_sequence)) = row else {
        return Err(JobError::Clean(StoreError::UnknownSession(session_id.to_owned())));
    };
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: last_sequence + 1,
            recorded_at_ms: now,
        },
        lease,
    })
}

/// Sets a session's title.
fn rename(conn: &Connection, session_id: &str, title: &str, now: u64) -> Result<Written, JobError> {
    let changed = conn
        .prepare_cached("UPDATE sessions SET title = ?2 WHERE id = ?1")
        .and_then(|mut update| update.execute(params![session_id, title]))
        .map_err(dirty)?;
    if changed == 0 {
        return Err(JobError::Clean(StoreError::UnknownSession(session_id.to_owned())));
    }
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: 0,
            recorded_at_ms: now,
        },
        lease: 0,
    })
}

/// Deletes a session's rows: the log, the queue, the idempotency keys, its
/// usage ledger and budget, and the session itself, all in the group's
/// transaction.
fn delete(conn: &Connection, session_id: &str, now: u64) -> Result<Written, JobError> {
    let key: Option<i64> = conn
        .prepare_cached("SELECT key FROM sessions WHERE id = ?1")
        .and_then(|mut select| select.query_row(params![session_id], |row| row.get(0)).optional())
        .map_err(dirty)?;
    let Some(key) = key else {
        return Err(JobError::Clean(StoreError::UnknownSession(session_id.to_owned())));
    };
    for statement in [
        "DELETE FROM log WHERE session_key = ?1",
        "DELETE FROM queued_submissions WHERE session_key = ?1",
        "DELETE FROM submission_keys WHERE session_key = ?1",
        "DELETE FROM sessions WHERE key = ?1",
    ] {
        conn.prepare_cached(statement)
            .and_then(|mut delete| delete.execute(params![key]))
            .map_err(dirty)?;
    }
    super::access::forget_session(conn, session_id).map_err(dirty)?;
    conn.prepare_cached("DELETE FROM webhook_deliveries WHERE session_id = ?1")
        .and_then(|mut delete| delete.execute(params![session_id]))
        .map_err(dirty)?;
    Ok(Written {
        receipt: AppendReceipt {
            first_sequence: 0,
            recorded_at_ms: now,
        },
        lease: 0,
    })
}

/// Why an update of `session_id` matched no row: the session is unknown, or
/// another holder took it over.
fn refusal(conn: &Connection, session_id: &str) -> Result<StoreError, JobError> {
    let lease: Option<u64> = conn
        .prepare_cached("SELECT lease FROM sessions WHERE id = ?1")
        .and_then(|mut select| select.query_row(params![session_id], |row| row.get(0)).optional())
        .map_err(dirty)?;
    Ok(match lease {
        Some(lease) => StoreError::Fenced {
            session_id: session_id.to_owned(),
            lease,
        },
        None => StoreError::UnknownSession(session_id.to_owned()),
    })
}

/// Refuses, before anything is written, a cut longer than the history.
fn check_cut(conn: &Connection, session_id: &str, cut: u64) -> Result<(), JobError> {
    let length: Option<u64> = conn
        .prepare_cached("SELECT transcript_len FROM sessions WHERE id = ?1")
        .and_then(|mut select| select.query_row(params![session_id], |row| row.get(0)).optional())
        .map_err(dirty)?;
    match length {
        Some(length) if cut > length => Err(JobError::Clean(StoreError::Invalid(format!(
            "cannot cut the history of session '{session_id}' to {cut} items: it has {length}"
        )))),
        // An unknown session is refused by the write itself.
        _ => Ok(()),
    }
}

/// Checks and serializes a checkpoint write for `session_id`.
fn encode_write(session_id: &str, write: &CheckpointWrite) -> Result<EncodedWrite, StoreError> {
    check_addressed(session_id, write)?;
    Ok(EncodedWrite {
        checkpoint: encode(&write.checkpoint)?,
        bot_id: write.checkpoint.session_context.bot_id.clone(),
        tenant: write.checkpoint.session_context.tenant.clone(),
        execution: write.execution.as_ref().map(encode).transpose()?,
        transcript: write.transcript_delta.iter().map(encode).collect::<Result<_, _>>()?,
        history_cut: write.history_cut,
    })
}
