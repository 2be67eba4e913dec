//! A store in a PostgreSQL database, with the SQLite store's guarantees.
//!
//! Writes go to one writer task per [`PostgresCheckpoint`], owning one
//! connection, that commits the queued work of all sessions together (group
//! commit, see `writer.rs`). Reads use a pool of other connections
//! (`deadpool-postgres`). The layout is the SQLite store's: a `sessions` row
//! per session and one `log` row per committed batch (see `schema.rs`).
//!
//! Sequences are taken from the session row inside the committing
//! transaction, under its row lock, so any number of stores (in any
//! processes) on one database keep every session's log gap-free; `create`
//! refuses an existing id atomically; `acquire` bumps the session's lease
//! and a batch carrying an older one is refused with [`StoreError::Fenced`].
//!
//! For several nodes on one database, `claim`, `renew` and `release` keep an
//! owned lease per session (owner, epoch, expiry by the server's clock; see
//! `lease.rs`), and every commit that appends to a session notifies
//! `keel_log` with the session and its newest sequence, which
//! [`PostgresCheckpoint::listen`] receives (see `listen.rs`). A node that
//! does not run a session relays submissions to its owner through the
//! `relayed_submissions` table, announced on `keel_relay` (see `relay.rs`).

mod access;
mod apply;
mod hold;
mod lease;
mod listen;
pub mod local;
mod reader;
mod relay;
mod schema;
mod slot_sql;
mod statements;
mod taken_up;
mod webhooks;
mod writer;

pub use hold::{PostgresHold, redact_postgres_url, socket_directories};
pub use listen::{LOG_CHANNEL, NOTICE_BUFFER, RELAY_CHANNEL};

#[cfg(test)]
mod cut_commit_tests;
#[cfg(test)]
mod tests;

use std::error::Error as _;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use self::writer::{WriterConnection, WriterCounters};
use super::job::{Job, Reply, Written, existed};
use super::{
    AppendReceipt, Checkpoint, CheckpointStore, CheckpointWrite, ClusterStore, EncodedEvent, EventPage,
    EventPageRequest, KeyedSubmission, LeaseStore, OpenBatch, RelayOutcome, RelayState, Relayed, RelayedSubmission,
    SessionEdit, SessionFilter, SessionListPage, SessionState, SessionSummary, StoreError, TurnExecution, WriterStats,
};
use futures::future::BoxFuture;
use keel_protocol::{RecordedEvent, TranscriptItem};

use crate::NoticeListener;

/// How long connecting may take before the database counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a [`PostgresCheckpoint`].
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// The most connections reads use at once (the writer has its own).
    pub pool_size: usize,
    /// One transaction per write, no grouping: the baseline a benchmark
    /// compares group commit against. Never faster.
    pub per_event: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        Self {
            pool_size: 8,
            per_event: false,
        }
    }
}

/// Connections a store keeps for lease calls, beside its reads'.
const LEASE_CONNECTIONS: usize = 2;

/// Connections kept for storing relayed submissions.
const RELAY_CONNECTIONS: usize = 8;

/// Connections kept for admissions (ledger reads and turn slots).
const ADMISSION_CONNECTIONS: usize = 4;

/// The most write jobs one group commit carries.
const MAX_JOBS_PER_COMMIT: usize = 4096;

/// A [`CheckpointStore`] in a PostgreSQL database.
pub struct PostgresCheckpoint {
    counters: Arc<WriterCounters>,
    jobs: Mutex<Option<mpsc::UnboundedSender<Job>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    pool: Pool,
    /// Connections of their own for claims, renewals and releases, so that
    /// no backlog of reads can delay a renewal past its lease.
    leases: Pool,
    /// Connections of their own for storing relayed submissions, whose
    /// commits do not wait for the disk (`relay.rs` says why that loses
    /// nothing a client was told).
    relays: Pool,
    /// Connections of their own for admissions, set up for the slots'
    /// transactions (`access.rs` says how).
    admissions: Pool,
    /// Where to connect, for listeners.
    config: Config,
    /// The relayed submissions handed to this node as their owner, which
    /// the writer answers in the transaction that queues them.
    taken_up: Arc<taken_up::TakenUp>,
    /// Whether admissions take turn slots, so the writer gives them back
    /// (see `AccessStore::expect_turn_slots`).
    slots_in_use: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for PostgresCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCheckpoint")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl PostgresCheckpoint {
    /// Connects to the database at `url` (`postgres://user@host:port/db`),
    /// creating or migrating Keel's schema, and starts the writer task. Call
    /// it inside the tokio runtime the store will be used on: the writer and
    /// the connections run as tasks of that runtime.
    ///
    /// A malformed URL is [`StoreError::Invalid`]; a server that cannot be
    /// reached is [`StoreError::Unavailable`]; a schema written by a newer
    /// Keel is [`StoreError::SchemaTooNew`].
    pub async fn connect(url: &str, options: PostgresOptions) -> Result<Self, StoreError> {
        let config = parse_url(url)?;
        let mut client = connect(&config).await?;
        schema::migrate(&mut client).await?;
        let conn = WriterConnection::new(config.clone(), client).await?;
        let counters = Arc::new(WriterCounters::default());
        let max_jobs = if options.per_event { 1 } else { MAX_JOBS_PER_COMMIT };
        let leases = connection_pool(&config, LEASE_CONNECTIONS)?;
        let relays = connection_pool(&without_waiting_for_the_disk(&config), RELAY_CONNECTIONS)?;
        let pool = connection_pool(&config, options.pool_size.max(1))?;
        let admissions = connection_pool(&access::for_admissions(&config), ADMISSION_CONNECTIONS)?;
        let taken_up = Arc::new(taken_up::TakenUp::default());
        let slots_in_use = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let shared = (Arc::clone(&taken_up), Arc::clone(&slots_in_use));
        let (jobs, writer) = writer::spawn(conn, max_jobs, Arc::clone(&counters), shared);
        Ok(Self {
            counters,
            jobs: Mutex::new(Some(jobs)),
            writer: Mutex::new(Some(writer)),
            pool,
            leases,
            relays,
            admissions,
            config,
            taken_up,
            slots_in_use,
        })
    }

    /// Listens for log notifications on a connection of its own: one
    /// [`LogNotice::Log`](crate::LogNotice::Log) (session id and newest sequence, never events)
    /// for each commit that appends to a session, made by any store on this
    /// database, in any process. Returns once listening, so any commit after
    /// this call is noticed. The listener reconnects by itself after a lost
    /// connection and then yields [`LogNotice::Resync`](crate::LogNotice::Resync).
    pub async fn listen(&self) -> Result<NoticeListener, StoreError> {
        self.listen_with_capacity(NOTICE_BUFFER).await
    }

    /// [`Self::listen`] with room for `capacity` notices (at least 1)
    /// waiting for the consumer: past that, notices are dropped and the
    /// listener yields [`LogNotice::Resync`](crate::LogNotice::Resync) once there is room again.
    pub async fn listen_with_capacity(&self, capacity: usize) -> Result<NoticeListener, StoreError> {
        if self.jobs.lock().unwrap_or_else(|poison| poison.into_inner()).is_none() {
            return Err(StoreError::Closed);
        }
        listen::start(self.config.clone(), capacity).await
    }

    /// Counters of the writer's work so far. `jobs / commits` is how many
    /// writes each commit carried on average. `checkpoints` is always 0
    /// (PostgreSQL checkpoints on its own).
    pub fn stats(&self) -> WriterStats {
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        WriterStats {
            commits: load(&self.counters.commits),
            jobs: load(&self.counters.jobs),
            events: load(&self.counters.events),
            commit_micros: load(&self.counters.commit_micros),
            checkpoints: 0,
        }
    }

    /// Stops the writer after the writes already queued, waits for it, and
    /// closes every connection. Later calls fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        self.jobs.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        let writer = self.writer.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
        self.pool.close();
        self.leases.close();
        self.relays.close();
    }

    fn submit(&self, job: Job) -> Result<(), StoreError> {
        let jobs = self.jobs.lock().unwrap_or_else(|poison| poison.into_inner());
        let jobs = jobs.as_ref().ok_or(StoreError::Closed)?;
        jobs.send(job).map_err(|_| StoreError::Closed)
    }

    async fn write(&self, job: impl FnOnce(Reply) -> Job) -> Result<Written, StoreError> {
        let (reply, receipt) = oneshot::channel();
        self.submit(job(reply))?;
        receipt.await.map_err(|_| StoreError::Closed)?
    }

    /// A pooled read connection.
    async fn reader(&self) -> Result<Object, StoreError> {
        self.pooled(&self.pool).await
    }

    /// A connection for an admission.
    async fn admitter(&self) -> Result<Object, StoreError> {
        self.pooled(&self.admissions).await
    }

    /// A connection for a lease call.
    async fn leaser(&self) -> Result<Object, StoreError> {
        self.pooled(&self.leases).await
    }

    async fn pooled(&self, pool: &Pool) -> Result<Object, StoreError> {
        if self.jobs.lock().unwrap_or_else(|poison| poison.into_inner()).is_none() {
            return Err(StoreError::Closed);
        }
        pool.get().await.map_err(pool_error)
    }
}

impl CheckpointStore for PostgresCheckpoint {
    /// Never low: the database server keeps its own disk, and no reserve
    /// is kept here.
    fn low_on_space(&self) -> Option<String> {
        None
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(PostgresCheckpoint::close(self))
    }

    fn save<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        transcript_delta: &'a [TranscriptItem],
        execution: Option<&'a TurnExecution>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let write = CheckpointWrite::new(checkpoint, transcript_delta, execution);
        Box::pin(async move { self.write(|reply| Job::save(write, reply)).await.map(drop) })
    }

    fn create<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        history: &'a [TranscriptItem],
        events: Vec<EncodedEvent>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        let write = CheckpointWrite::new(checkpoint, history, None);
        Box::pin(async move {
            let written = self.write(|reply| Job::create(write, events, reply)).await?;
            Ok(written.receipt)
        })
    }

    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>> {
        Box::pin(async move { reader::load(&mut self.reader().await?, session_id).await })
    }

    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: Arc<OpenBatch>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        let session_id = session_id.to_owned();
        Box::pin(async move {
            let written = self
                .write(move |reply| Job::Append {
                    session_id,
                    batch,
                    reply,
                })
                .await?;
            Ok(written.receipt)
        })
    }

    fn acquire<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        let session_id = session_id.to_owned();
        Box::pin(async move {
            let written = self.write(move |reply| Job::Acquire { session_id, reply }).await?;
            Ok(written.lease)
        })
    }

    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>> {
        Box::pin(async move { reader::event_page(&self.reader().await?, session_id, request).await })
    }

    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        Box::pin(async move { reader::list_sessions_page(&self.reader().await?, cursor, limit, filter).await })
    }

    fn list_sessions_by_activity<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        Box::pin(async move { reader::list_sessions_by_activity(&self.reader().await?, cursor, limit, filter).await })
    }

    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>> {
        Box::pin(async move { reader::session_summary(&self.reader().await?, session_id).await })
    }

    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>> {
        Box::pin(async move { reader::events_after(&self.reader().await?, session_id, after_sequence, limit).await })
    }

    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>> {
        Box::pin(async move { reader::keyed_submission(&self.reader().await?, session_id, idempotency_key).await })
    }

    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<TranscriptItem>>, StoreError>> {
        Box::pin(async move { reader::history_until(&mut self.reader().await?, session_id, at_sequence).await })
    }

    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { reader::sessions_with_work(&self.reader().await?, after, limit).await })
    }

    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: SessionEdit<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { existed(self.write(|reply| Job::edit(session_id, edit, reply)).await) })
    }
}

impl LeaseStore for PostgresCheckpoint {
    fn claim<'a>(
        &'a self,
        session_id: &'a str,
        owner: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { lease::claim(&self.leaser().await?, session_id, owner, ttl).await })
    }

    fn renew<'a>(
        &'a self,
        owner: &'a str,
        ttl: Duration,
        sessions: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { lease::renew(&self.leaser().await?, owner, ttl, sessions).await })
    }

    fn release<'a>(&'a self, session_id: &'a str, owner: &'a str, epoch: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { lease::release(&self.leaser().await?, session_id, owner, epoch).await })
    }

    fn sessions_to_take_over<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { lease::sessions_to_take_over(&self.reader().await?, after, limit).await })
    }
}

impl ClusterStore for PostgresCheckpoint {
    fn relay<'a>(
        &'a self,
        session_id: &'a str,
        submission: &'a RelayedSubmission,
        max_waiting: usize,
    ) -> BoxFuture<'a, Result<Relayed, StoreError>> {
        Box::pin(async move {
            let client = self.pooled(&self.relays).await?;
            relay::relay(&client, session_id, submission, max_waiting).await
        })
    }

    fn relayed<'a>(
        &'a self,
        session_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RelayedSubmission>, StoreError>> {
        Box::pin(async move {
            let rows = relay::relayed(&self.reader().await?, session_id, limit).await?;
            self.taken_up.handed_out(&rows);
            Ok(rows)
        })
    }

    fn taking_up(&self, rows: &[RelayedSubmission]) {
        self.taken_up.handed_out(rows);
    }

    fn relay_done<'a>(&'a self, session_id: &'a str, relay_ids: &'a [u64]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { relay::relay_done(&self.reader().await?, session_id, relay_ids).await })
    }

    fn answer_relayed<'a>(
        &'a self,
        session_id: &'a str,
        answers: &'a [(u64, Option<RelayOutcome>)],
        keep: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.taken_up.set_keep(keep);
            // What the writer answered with its submission_queued needs no
            // statement of its own.
            let left = self.taken_up.left_to_answer(answers);
            if left.is_empty() {
                return Ok(());
            }
            relay::answer_relayed(&self.reader().await?, session_id, &left, keep).await
        })
    }

    fn relay_state<'a>(&'a self, _session_id: &'a str, relay_id: u64) -> BoxFuture<'a, Result<RelayState, StoreError>> {
        // Relay ids are unique across sessions: the id alone finds it.
        Box::pin(async move { relay::relay_state(&self.reader().await?, relay_id).await })
    }

    fn newest_relay_id<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move { relay::newest_relay_id(&self.reader().await?, session_id).await })
    }

    fn sessions_with_relayed<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        Box::pin(async move { relay::sessions_with_relayed(&self.reader().await?, owner).await })
    }

    fn advertise<'a>(&'a self, node: &'a str, url: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move { relay::advertise(&self.reader().await?, node, url).await })
    }

    fn node_url<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<Option<String>, StoreError>> {
        Box::pin(async move { relay::node_url(&self.reader().await?, node).await })
    }

    fn listen(&self) -> BoxFuture<'_, Result<NoticeListener, StoreError>> {
        Box::pin(PostgresCheckpoint::listen(self))
    }
}

/// A pool of at most `size` connections to `config`'s database.
/// `config` for connections whose commits return before the disk has them
/// (`synchronous_commit = off`): a crash of the database server may lose
/// their last commits, never break one.
fn without_waiting_for_the_disk(config: &Config) -> Config {
    with_settings(config, "-c synchronous_commit=off")
}

/// `config` with `settings` (`-c name=value …`) added to its options.
fn with_settings(config: &Config, settings: &str) -> Config {
    let mut config = config.clone();
    let options = match config.get_options() {
        Some(options) => format!("{options} {settings}"),
        None => settings.to_owned(),
    };
    config.options(&options);
    config
}

fn connection_pool(config: &Config, size: usize) -> Result<Pool, StoreError> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .build()
        .map_err(|error| StoreError::Invalid(format!("cannot make a connection pool: {error}")))
}

/// Parses a connection URL (or a `key=value` connection string), with
/// Keel's defaults for what it leaves out.
fn parse_url(url: &str) -> Result<Config, StoreError> {
    let mut config: Config = url
        .parse()
        .map_err(|error| StoreError::Invalid(format!("malformed PostgreSQL URL: {}", describe(&error))))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("keel");
    }
    Ok(config)
}

/// A bare connection to the database at `url` (the store's URL rules and
/// defaults), driven on a task of its own: for tools that read
/// PostgreSQL's own views, such as the benches' counters, never for Keel's
/// tables.
pub async fn connect_bare(url: &str) -> Result<Client, StoreError> {
    connect(&parse_url(url)?).await
}

/// Opens a connection and drives it on a task of its own.
async fn connect(config: &Config) -> Result<Client, StoreError> {
    let (client, connection) = config.connect(NoTls).await.map_err(connect_error)?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "postgres connection ended");
        }
    });
    Ok(client)
}

/// Maps a PostgreSQL error to the store's error.
fn pg_error(error: tokio_postgres::Error) -> StoreError {
    match error.code() {
        Some(code) if *code == SqlState::DISK_FULL || *code == SqlState::OUT_OF_MEMORY => {
            StoreError::Full(describe(&error))
        }
        Some(code)
            if code.code().starts_with("08")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::TOO_MANY_CONNECTIONS =>
        {
            StoreError::Unavailable(describe(&error))
        }
        Some(_) => backend(error),
        // No server error code: the connection failed or was closed.
        None if error.is_closed() || error.source().is_some_and(|source| source.is::<std::io::Error>()) => {
            StoreError::Unavailable(describe(&error))
        }
        None => backend(error),
    }
}

/// A failure to connect: without a server's error code (refused, timed
/// out, closed) the database is unavailable; with one (no such database,
/// authentication) it is [`pg_error`]'s.
fn connect_error(error: tokio_postgres::Error) -> StoreError {
    match error.code() {
        None => StoreError::Unavailable(describe(&error)),
        Some(_) => pg_error(error),
    }
}

/// Any other database error, displayed with its cause (tokio-postgres's own
/// display of a server error is only "db error").
fn backend(error: tokio_postgres::Error) -> StoreError {
    StoreError::Backend(Arc::new(DatabaseError {
        message: describe(&error),
        source: error,
    }))
}

/// A database error with its whole message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct DatabaseError {
    message: String,
    #[source]
    source: tokio_postgres::Error,
}

/// An error and its causes, on one line.
fn describe(error: &tokio_postgres::Error) -> String {
    let mut message = error.to_string();
    let mut cause = error.source();
    while let Some(source) = cause {
        let text = source.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        cause = source.source();
    }
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Maps a failure to get a pooled connection to the store's error.
fn pool_error(error: PoolError) -> StoreError {
    match error {
        PoolError::Backend(error) => pg_error(error),
        PoolError::Closed => StoreError::Closed,
        other => StoreError::Unavailable(other.to_string()),
    }
}
