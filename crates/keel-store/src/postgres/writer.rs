//! The writer task of a PostgreSQL store, and its group commit: when jobs
//! are taken, how a group is split into rounds and transactions, and what
//! happens when the connection goes away. What each job writes is
//! [`super::apply`]; the statements, [`super::statements`].
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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config, Transaction};

use super::apply::{Indexed, Write, append_all, apply, seal};
use super::statements::Statements;
use super::taken_up::TakenUp;
use crate::StoreError;
use crate::job::{Job, JobError, Mode, Written};
use keel_protocol::now_ms;

/// Counters of the writer's work, readable while it runs.
#[derive(Debug, Default)]
pub(super) struct WriterCounters {
    pub(super) commits: AtomicU64,
    pub(super) jobs: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) commit_micros: AtomicU64,
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
    (taken_up, slots_in_use): (Arc<TakenUp>, Arc<AtomicBool>),
) -> (mpsc::UnboundedSender<Job>, JoinHandle<()>) {
    let (jobs, queue) = mpsc::unbounded_channel();
    let shared = (taken_up, slots_in_use);
    let handle = tokio::spawn(run(conn, queue, max_jobs_per_commit.max(1), counters, shared));
    (jobs, handle)
}

async fn run(
    mut conn: WriterConnection,
    mut queue: mpsc::UnboundedReceiver<Job>,
    max_jobs: usize,
    counters: Arc<WriterCounters>,
    (taken_up, slots_in_use): (Arc<TakenUp>, Arc<AtomicBool>),
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
        commit_group(&mut conn, &mut group, &counters, (&taken_up, &slots_in_use)).await;
    }
    tracing::debug!("postgres writer stopped");
}

/// Commits a group of jobs in one transaction and answers each of them.
///
/// A connection found dead when the transaction starts is replaced and the
/// group tried once more (nothing was sent, so nothing can be doubled).
/// A connection lost during `COMMIT` leaves the outcome unknown: it is
/// never taken as "did not happen". The writer reconnects and asks the
/// database what became of the transaction (`txid_status`, by the id it
/// read inside it), answering the jobs as written when it committed; when
/// it aborted, or the database cannot say within [`RESOLVE_FOR`], the jobs
/// fail with [`StoreError::Unavailable`] and nothing is retried. After any
/// other loss of the connection the jobs fail the same way and the next
/// group reconnects.
async fn commit_group(
    conn: &mut WriterConnection,
    group: &mut Vec<Job>,
    counters: &WriterCounters,
    (taken_up, slots_in_use): (&TakenUp, &AtomicBool),
) {
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
        let slots = slots_in_use.load(Ordering::Relaxed);
        let writes = writes.get_or_insert_with(|| group.iter().map(|job| seal(job, taken_up, slots)).collect());
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
            Err(GroupError::Unknown { error, txid, outcomes }) => {
                conn.reset();
                let resolved = match resolve(conn, txid).await {
                    Some(true) => {
                        tracing::warn!(%error, txid, "the connection was lost during a commit that happened");
                        Ok((outcomes, 1))
                    }
                    Some(false) => Err(error),
                    None => {
                        tracing::error!(%error, txid, "the outcome of a commit cut off cannot be learnt; its jobs fail");
                        Err(error)
                    }
                };
                break (resolved, micros);
            }
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
    Job::answer_group(group, outcome.map(|(outcomes, _)| outcomes), "postgres");
    tracing::trace!(micros, "group committed");
}

/// Why a group was not answered as committed.
enum GroupError {
    /// The transaction could not even start: nothing was sent.
    NotStarted(StoreError),
    /// The transaction or its commit failed.
    NotCommitted(StoreError),
    /// The connection was lost during `COMMIT`: transaction `txid` may or
    /// may not have committed, with these outcomes if it did.
    Unknown {
        error: StoreError,
        txid: i64,
        outcomes: Vec<Result<Written, StoreError>>,
    },
}

/// How long the writer tries to learn the outcome of a commit cut off (a
/// database restarting answers once it is back).
const RESOLVE_FOR: std::time::Duration = std::time::Duration::from_secs(15);

/// Whether transaction `txid` committed (`Some(true)`), aborted or never
/// was (`Some(false)`), asked on a new connection until [`RESOLVE_FOR`]
/// passes (`None`: still unknown).
async fn resolve(conn: &mut WriterConnection, txid: i64) -> Option<bool> {
    let deadline = tokio::time::Instant::now() + RESOLVE_FOR;
    let mut pause = std::time::Duration::from_millis(50);
    loop {
        let status = match conn.ready().await {
            Ok((client, _)) => client
                .query_one("SELECT txid_status($1)", &[&txid])
                .await
                .map_err(super::pg_error)
                .and_then(|row| row.try_get::<_, Option<String>>(0).map_err(super::pg_error)),
            Err(error) => Err(error),
        };
        match status.as_ref().map(Option::as_deref) {
            Ok(Some("committed")) => return Some(true),
            Ok(Some("aborted")) => return Some(false),
            // Still in progress (its session not yet gone) or too old to say.
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(%error, txid, "cannot learn a cut commit's outcome yet");
                conn.reset();
            }
        }
        if tokio::time::Instant::now() + pause > deadline {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(1));
    }
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
    // The transaction's id, pipelined with its first statements: what the
    // writer asks about should the connection be lost during `COMMIT`.
    let (txid, outcomes) = futures::join!(
        tx.query_one(&statements.txid, &[]),
        apply_all(&tx, statements, writes, now)
    );
    let txid: Option<i64> = txid.ok().and_then(|row| row.try_get(0).ok());
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
    let outcomes: Vec<Result<Written, StoreError>> = outcomes
        .into_iter()
        .map(|outcome| outcome.map_err(JobError::into_inner))
        .collect();
    match tx.commit().await.map_err(super::pg_error) {
        Ok(()) => Ok((outcomes, 1)),
        Err(error @ StoreError::Unavailable(_)) => match txid {
            Some(txid) => Err(GroupError::Unknown { error, txid, outcomes }),
            None => Err(GroupError::NotCommitted(error)),
        },
        Err(error) => Err(GroupError::NotCommitted(error)),
    }
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
