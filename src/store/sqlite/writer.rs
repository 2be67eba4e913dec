//! The single writer thread of a SQLite database, and its group commit.
//!
//! Every write of every session goes through one thread that owns the write
//! connection. Each time it wakes it takes *all* queued jobs (up to a limit)
//! and commits them in one transaction, so concurrent sessions share each
//! fsync. Jobs are isolated from each other by savepoints: one failing job
//! (say, an unknown session) does not fail the others. Each job is answered
//! only after the commit that made it durable.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use tokio::sync::oneshot;

use crate::protocol::now_ms;
use crate::store::{AppendBatch, AppendReceipt, CheckpointWrite, StoreError};

/// A write waiting for the writer thread.
pub(super) enum Job {
    /// Append events (and maybe a checkpoint write) to an existing session.
    Append {
        session_id: String,
        batch: AppendBatch,
        reply: oneshot::Sender<Result<AppendReceipt, StoreError>>,
    },
    /// Create or rewrite a session's checkpoint.
    Save {
        write: CheckpointWrite,
        reply: oneshot::Sender<Result<AppendReceipt, StoreError>>,
    },
}

impl Job {
    fn answer(self, outcome: Result<AppendReceipt, StoreError>) {
        let reply = match self {
            Job::Append { reply, .. } | Job::Save { reply, .. } => reply,
        };
        // The caller may have given up waiting (cancelled); the write stands.
        let _ = reply.send(outcome);
    }
}

/// Counters of the writer's work, readable while it runs.
#[derive(Debug, Default)]
pub(super) struct WriterCounters {
    pub(super) commits: AtomicU64,
    pub(super) jobs: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) commit_micros: AtomicU64,
}

/// Starts the writer thread. It runs until every job sender is dropped.
pub(super) fn spawn(
    conn: Connection,
    max_jobs_per_commit: usize,
    counters: Arc<WriterCounters>,
) -> std::io::Result<(mpsc::Sender<Job>, JoinHandle<()>)> {
    let (jobs, queue) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("keel-sqlite-writer".into())
        .spawn(move || run(conn, queue, max_jobs_per_commit.max(1), &counters))?;
    Ok((jobs, handle))
}

fn run(mut conn: Connection, queue: mpsc::Receiver<Job>, max_jobs: usize, counters: &WriterCounters) {
    let mut group = Vec::with_capacity(max_jobs);
    while let Ok(first) = queue.recv() {
        group.push(first);
        while group.len() < max_jobs {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        commit_group(&mut conn, &mut group, counters);
    }
    tracing::debug!("sqlite writer stopped");
}

/// Commits a group of jobs in one transaction and answers each of them.
fn commit_group(conn: &mut Connection, group: &mut Vec<Job>, counters: &WriterCounters) {
    let now = now_ms();
    let started = std::time::Instant::now();
    let outcome = run_group(conn, group, now);
    let micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    // Only the events of jobs that succeeded were written.
    let events: usize = match &outcome {
        Ok(outcomes) => group
            .iter()
            .zip(outcomes)
            .map(|(job, outcome)| match (job, outcome) {
                (Job::Append { batch, .. }, Ok(_)) => batch.events.len(),
                _ => 0,
            })
            .sum(),
        Err(_) => 0,
    };
    if outcome.is_ok() {
        counters.commits.fetch_add(1, Ordering::Relaxed);
        counters.jobs.fetch_add(group.len() as u64, Ordering::Relaxed);
        counters.events.fetch_add(events as u64, Ordering::Relaxed);
        counters.commit_micros.fetch_add(micros, Ordering::Relaxed);
    }
    match outcome {
        Ok(outcomes) => {
            for (job, outcome) in group.drain(..).zip(outcomes) {
                job.answer(outcome);
            }
        }
        Err(error) => {
            tracing::warn!(%error, jobs = group.len(), "sqlite group commit failed");
            for job in group.drain(..) {
                job.answer(Err(error.clone()));
            }
        }
    }
    tracing::trace!(micros, events, "group committed");
}

/// Applies every job inside one transaction. The outer error means nothing
/// of the group was committed.
fn run_group(
    conn: &mut Connection,
    group: &[Job],
    now: u64,
) -> Result<Vec<Result<AppendReceipt, StoreError>>, StoreError> {
    let mut tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(super::sqlite_error)?;
    let mut outcomes = Vec::with_capacity(group.len());
    for job in group {
        let outcome = apply_isolated(&mut tx, job, now);
        if let Err(error) = &outcome {
            // On SQLITE_FULL, IOERR and the like SQLite may roll back the
            // whole transaction by itself; then nothing of the group stands.
            if tx.is_autocommit() {
                return Err(error.clone());
            }
        }
        outcomes.push(outcome);
    }
    tx.commit().map_err(super::sqlite_error)?;
    Ok(outcomes)
}

fn apply_isolated(tx: &mut Transaction<'_>, job: &Job, now: u64) -> Result<AppendReceipt, StoreError> {
    let savepoint = tx.savepoint().map_err(super::sqlite_error)?;
    let receipt = apply(&savepoint, job, now)?;
    savepoint.commit().map_err(super::sqlite_error)?;
    Ok(receipt)
}

fn apply(conn: &Connection, job: &Job, now: u64) -> Result<AppendReceipt, StoreError> {
    match job {
        Job::Save { write, .. } => {
            let session_id = &write.checkpoint.session_id;
            conn.prepare_cached(
                "INSERT INTO sessions (id, created_at_ms, updated_at_ms, checkpoint) VALUES (?1, ?2, ?2, '{}')
                 ON CONFLICT (id) DO NOTHING",
            )
            .and_then(|mut insert| insert.execute(params![session_id, now]))
            .map_err(super::sqlite_error)?;
            write_checkpoint(conn, session_id, write, now)?;
            Ok(AppendReceipt {
                first_sequence: 0,
                recorded_at_ms: now,
            })
        }
        Job::Append { session_id, batch, .. } => {
            if let Some(write) = &batch.checkpoint {
                write_checkpoint(conn, session_id, write, now)?;
            }
            let first_sequence = append_events(conn, session_id, batch, now)?;
            Ok(AppendReceipt {
                first_sequence,
                recorded_at_ms: now,
            })
        }
    }
}

/// Rewrites the checkpoint row and appends the transcript delta.
fn write_checkpoint(conn: &Connection, session_id: &str, write: &CheckpointWrite, now: u64) -> Result<(), StoreError> {
    if write.checkpoint.session_id != session_id {
        return Err(StoreError::Invalid(format!(
            "checkpoint of session '{}' written to session '{session_id}'",
            write.checkpoint.session_id
        )));
    }
    let checkpoint = encode(&write.checkpoint)?;
    let execution = write.execution.as_ref().map(encode).transpose()?;
    let added = write.transcript_delta.len() as u64;
    let transcript_len: Option<u64> = conn
        .prepare_cached(
            "UPDATE sessions SET checkpoint = ?1, execution = ?2, updated_at_ms = ?3,
                 transcript_len = transcript_len + ?4
             WHERE id = ?5 RETURNING transcript_len",
        )
        .and_then(|mut update| {
            update
                .query_row(params![checkpoint, execution, now, added, session_id], |row| row.get(0))
                .optional()
        })
        .map_err(super::sqlite_error)?;
    let Some(transcript_len) = transcript_len else {
        return Err(StoreError::UnknownSession(session_id.to_owned()));
    };
    if added > 0 {
        let mut insert = conn
            .prepare_cached("INSERT INTO transcript (session_id, position, item) VALUES (?1, ?2, ?3)")
            .map_err(super::sqlite_error)?;
        let first_position = transcript_len - added;
        for (position, item) in (first_position..).zip(&write.transcript_delta) {
            insert
                .execute(params![session_id, position, encode(item)?])
                .map_err(super::sqlite_error)?;
        }
    }
    Ok(())
}

/// Takes the next sequences of the session and inserts the events under
/// them. Returns the first sequence (or the next one, when there are none).
fn append_events(conn: &Connection, session_id: &str, batch: &AppendBatch, now: u64) -> Result<u64, StoreError> {
    let count = batch.events.len() as u64;
    let last_sequence: Option<u64> = conn
        .prepare_cached(
            "UPDATE sessions SET last_sequence = last_sequence + ?1, updated_at_ms = ?2
             WHERE id = ?3 RETURNING last_sequence",
        )
        .and_then(|mut update| {
            update
                .query_row(params![count, now, session_id], |row| row.get(0))
                .optional()
        })
        .map_err(super::sqlite_error)?;
    let Some(last_sequence) = last_sequence else {
        return Err(StoreError::UnknownSession(session_id.to_owned()));
    };
    let first_sequence = last_sequence - count + 1;
    if count > 0 {
        let mut insert = conn
            .prepare_cached(
                "INSERT INTO events (session_id, sequence, recorded_at_ms, kind, body) VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(super::sqlite_error)?;
        for (sequence, event) in (first_sequence..).zip(&batch.events) {
            insert
                .execute(params![session_id, sequence, now, event.kind, event.json])
                .map_err(super::sqlite_error)?;
        }
    }
    Ok(first_sequence)
}

fn encode<T: serde::Serialize>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|error| StoreError::Encode(error.to_string()))
}
