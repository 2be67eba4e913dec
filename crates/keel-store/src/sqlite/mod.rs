//! The embedded store: one SQLite file in WAL mode.
//!
//! Writes go to a single writer thread per [`SqliteCheckpoint`] that commits
//! the queued work of all sessions together (group commit), so an fsync is
//! shared by everything that was waiting for it. Reads use a small pool of
//! separate connections on tokio's blocking threads; no SQLite call runs on
//! an async worker thread.
//!
//! Open one `SqliteCheckpoint` per database file and share it (it is meant to
//! sit behind an `Arc`): two instances on the same file still work, through
//! SQLite's locking, but no longer share their commits.

mod access;
mod backup;
mod checkpointer;
mod codec;
mod identity;
mod lease;
mod lock;
mod reader;
mod reserve;
mod schema;
mod slots;
mod webhooks;
pub use self::schema::{SCHEMA_VERSION, stored_schema_version};
mod writer;

#[cfg(test)]
mod migration_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;

use rusqlite::ErrorCode;
use tokio::sync::oneshot;

pub use self::backup::{backup, backup_blocking};
use self::identity::FileIdentity;
pub use self::lock::{LOCK_SUFFIX, ServeLock, SharedHold, database_files};
use self::reader::ReaderPool;
pub use self::reserve::{DEFAULT_RESERVE_BYTES, SpaceReserve};
use self::writer::WriterCounters;
use super::job::{Job, Reply, Written, existed};
use super::{
    AppendReceipt, Checkpoint, CheckpointStore, CheckpointWrite, EncodedEvent, EventPage, EventPageRequest,
    KeyedSubmission, LeaseStore, OpenBatch, SessionEdit, SessionFilter, SessionListPage, SessionState, SessionSummary,
    StoreError, TurnExecution,
};
use futures::future::BoxFuture;
use keel_protocol::{RecordedEvent, TranscriptItem};

/// How SQLite makes a commit durable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Synchronous {
    /// `synchronous=FULL`: every commit is fsynced before it is acknowledged,
    /// so an acknowledged event survives power loss. The default.
    #[default]
    Full,
    /// `synchronous=NORMAL`: in WAL mode the log is fsynced only at
    /// checkpoints. A process crash loses nothing, but a power loss or OS
    /// crash can lose the last acknowledged commits. Faster; choose it only
    /// when the machine's durability is someone else's problem.
    Normal,
}

/// Settings of a [`SqliteCheckpoint`].
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// Durability of commits.
    pub synchronous: Synchronous,
    /// Refuse writes that would grow the file past this size; they fail with
    /// [`StoreError::Full`], as on a full disk.
    pub max_size_bytes: Option<u64>,
    /// The most write jobs one transaction may carry. `1` disables group
    /// commit (one transaction per job), which is only useful as a baseline.
    pub max_jobs_per_commit: usize,
    /// The name of the SQLite VFS every connection of the store opens the
    /// file with (writer, checkpointer, readers, leases); `None` is
    /// SQLite's default. Mostly for fault testing: see
    /// `keel::testing::faulty_vfs`, which must be registered first. A name
    /// SQLite does not know fails the open.
    pub vfs: Option<String>,
    /// Disk space kept for the store's own commits, in a ballast file
    /// beside the database (`<database>-reserve`, see [`SpaceReserve`]):
    /// released when a commit meets a full disk, so that it goes on, and
    /// allocated again once there is room. `0` (the library's default)
    /// turns it off; `keel`'s commands keep [`DEFAULT_RESERVE_BYTES`].
    pub reserve_bytes: u64,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            max_size_bytes: None,
            max_jobs_per_commit: 4096,
            vfs: None,
            reserve_bytes: 0,
        }
    }
}

/// What the writer has done since the store was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed.
    pub commits: u64,
    /// Write jobs (one per recorder batch or save) those transactions wrote.
    pub jobs: u64,
    /// Events those transactions wrote.
    pub events: u64,
    /// Time spent committing, summed, in microseconds.
    pub commit_micros: u64,
    /// WAL checkpoints run in the background.
    pub checkpoints: u64,
}

/// A [`CheckpointStore`] in one SQLite file.
pub struct SqliteCheckpoint {
    path: PathBuf,
    /// The VFS of [`SqliteOptions::vfs`].
    vfs: Option<String>,
    counters: Arc<WriterCounters>,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    /// The writer thread, then the checkpointer thread (which ends after it).
    threads: Mutex<Vec<JoinHandle<()>>>,
    readers: Arc<ReaderPool>,
    /// The file opened; every read and commit checks the path still leads
    /// to it.
    identity: Arc<FileIdentity>,
    /// The connection of the owned-lease calls, opened on first use.
    leases: SideConnection,
    /// The connection that writes keys and budgets, opened on first use:
    /// apart from the leases', so that no access call delays a renewal.
    access: SideConnection,
    /// The connection that claims and settles webhook deliveries, opened
    /// on first use, committing without waiting for the disk: a claim or
    /// an outcome lost to a power cut only means a delivery made again,
    /// which receivers deduplicate.
    webhooks: SideConnection,
    /// The turn slots sessions took at admission, shared by every handle
    /// on the database in this process (see `slots.rs`).
    turn_slots: Arc<slots::TurnSlots>,
    /// The disk space kept for the store's commits.
    reserve: Arc<SpaceReserve>,
}

impl SqliteCheckpoint {
    /// Opens (creating if needed) the database at `path` with the default,
    /// durable settings. Blocking; from async code prefer [`Self::open`].
    pub fn new(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::with_options(path, SqliteOptions::default())
    }

    /// Opens the database at `path` with `options`. Blocking.
    pub fn with_options(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        let mut conn = schema::open_writer(&path, &options)?;
        let identity = Arc::new(FileIdentity::of(&path)?);
        let reserve = Arc::new(SpaceReserve::open(&path, options.reserve_bytes));
        let counters = Arc::new(WriterCounters::default());
        let checkpointer = checkpointer::start(
            &mut conn,
            &path,
            options.vfs.as_deref(),
            Arc::clone(&counters),
            Arc::clone(&identity),
        )?;
        let turn_slots = slots::TurnSlots::of(&path);
        let (jobs, writer) = writer::spawn(
            conn,
            options.max_jobs_per_commit,
            Arc::clone(&counters),
            Arc::clone(&identity),
            Arc::clone(&reserve),
            Arc::clone(&turn_slots),
        )
        .map_err(|error| StoreError::Backend(Arc::new(error)))?;
        Ok(Self {
            identity,
            counters,
            readers: Arc::new(ReaderPool::new(path.clone(), options.vfs.clone())),
            path,
            vfs: options.vfs,
            jobs: Mutex::new(Some(jobs)),
            threads: Mutex::new(vec![writer, checkpointer]),
            leases: SideConnection::default(),
            access: SideConnection::default(),
            webhooks: SideConnection::default(),
            turn_slots,
            reserve,
        })
    }

    /// Opens the database on a blocking thread.
    pub async fn open(path: impl Into<PathBuf>, options: SqliteOptions) -> Result<Self, StoreError> {
        let path = path.into();
        tokio::task::spawn_blocking(move || Self::with_options(path, options))
            .await
            .map_err(|error| StoreError::Backend(Arc::new(error)))?
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The disk space kept for the store's commits: its ballast file (to
    /// protect like the database) and [`SpaceReserve::low_on_space`], the
    /// check tools that write files make before they run. Shared, so a
    /// caller may keep it apart from the store.
    pub fn space_reserve(&self) -> Arc<SpaceReserve> {
        Arc::clone(&self.reserve)
    }

    /// Counters of the writer's work so far. `jobs / commits` is how many
    /// writes each fsync carried on average.
    pub fn writer_stats(&self) -> WriterStats {
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(std::sync::atomic::Ordering::Relaxed);
        WriterStats {
            commits: load(&self.counters.commits),
            jobs: load(&self.counters.jobs),
            events: load(&self.counters.events),
            commit_micros: load(&self.counters.commit_micros),
            checkpoints: load(&self.counters.checkpoints),
        }
    }

    /// Stops the writer after the writes already queued, waits for it, and
    /// closes every connection, so the WAL is folded into the main file.
    /// Later calls fail with [`StoreError::Closed`].
    pub async fn close(&self) {
        self.jobs.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|poison| poison.into_inner()));
        self.readers.clear();
        for side in [&self.leases, &self.access, &self.webhooks] {
            side.lock().unwrap_or_else(|poison| poison.into_inner()).take();
        }
        let _ = tokio::task::spawn_blocking(move || {
            for thread in threads {
                let _ = thread.join();
            }
        })
        .await;
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

    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        if self.jobs.lock().unwrap_or_else(|poison| poison.into_inner()).is_none() {
            return Err(StoreError::Closed);
        }
        let readers = Arc::clone(&self.readers);
        let identity = Arc::clone(&self.identity);
        tokio::task::spawn_blocking(move || {
            identity.usable()?;
            readers.with(read)
        })
        .await
        .map_err(|error| StoreError::Backend(Arc::new(error)))?
    }
}

/// A connection of its own for calls that write outside the writer's group
/// commit (leases, keys), opened on first use.
type SideConnection = Arc<Mutex<Option<rusqlite::Connection>>>;

impl SqliteCheckpoint {
    /// Runs an owned-lease call on the lease connection, on a blocking
    /// thread.
    async fn lease<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.on_side(&self.leases, call).await
    }

    /// Runs `call` on the side connection `side`, on a blocking thread.
    async fn on_side<T: Send + 'static>(
        &self,
        side: &SideConnection,
        call: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.on_side_opened_by(side, schema::open_leases, call).await
    }

    /// Runs `call` on the webhook side connection (see its field).
    async fn on_webhook_side<T: Send + 'static>(
        &self,
        call: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.on_side_opened_by(&self.webhooks, schema::open_webhooks, call)
            .await
    }

    /// Runs `call` on the side connection `side`, opened by `open` on
    /// first use, on a blocking thread.
    async fn on_side_opened_by<T: Send + 'static>(
        &self,
        side: &SideConnection,
        open: fn(&Path, Option<&str>) -> Result<rusqlite::Connection, StoreError>,
        call: impl FnOnce(&mut rusqlite::Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        if self.jobs.lock().unwrap_or_else(|poison| poison.into_inner()).is_none() {
            return Err(StoreError::Closed);
        }
        let side = Arc::clone(side);
        let identity = Arc::clone(&self.identity);
        let path = self.path.clone();
        let vfs = self.vfs.clone();
        tokio::task::spawn_blocking(move || {
            identity.usable()?;
            let mut conn = side.lock().unwrap_or_else(|poison| poison.into_inner());
            if conn.is_none() {
                *conn = Some(open(&path, vfs.as_deref())?);
            }
            match conn.as_mut() {
                Some(conn) => call(conn),
                None => Err(StoreError::Closed),
            }
        })
        .await
        .map_err(|error| StoreError::Backend(Arc::new(error)))?
    }
}

impl CheckpointStore for SqliteCheckpoint {
    fn low_on_space(&self) -> Option<String> {
        self.reserve.low_on_space()
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

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(SqliteCheckpoint::close(self))
    }

    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.read(move |conn| reader::load(conn, &session_id)))
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
        let session_id = session_id.to_owned();
        Box::pin(self.read(move |conn| reader::event_page(conn, &session_id, request)))
    }

    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        let (cursor, filter) = (cursor.map(str::to_owned), reader::OwnedFilter::of(filter));
        Box::pin(self.read(move |conn| reader::list_sessions_page(conn, cursor.as_deref(), limit, &filter)))
    }

    fn list_sessions_by_activity<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        let (cursor, filter) = (cursor.map(str::to_owned), reader::OwnedFilter::of(filter));
        Box::pin(self.read(move |conn| reader::list_sessions_by_activity(conn, cursor.as_deref(), limit, &filter)))
    }

    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.read(move |conn| reader::session_summary(conn, &session_id)))
    }

    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.read(move |conn| reader::events_after(conn, &session_id, after_sequence, limit)))
    }

    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>> {
        let (session_id, key) = (session_id.to_owned(), idempotency_key.to_owned());
        Box::pin(self.read(move |conn| reader::keyed_submission(conn, &session_id, &key)))
    }

    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<TranscriptItem>>, StoreError>> {
        let session_id = session_id.to_owned();
        Box::pin(self.read(move |conn| reader::history_until(conn, &session_id, at_sequence)))
    }

    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let after = after.map(str::to_owned);
        Box::pin(self.read(move |conn| reader::sessions_with_work(conn, after.as_deref(), limit)))
    }

    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: SessionEdit<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move { existed(self.write(|reply| Job::edit(session_id, edit, reply)).await) })
    }
}

impl LeaseStore for SqliteCheckpoint {
    fn claim<'a>(
        &'a self,
        session_id: &'a str,
        owner: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        let (session_id, owner) = (session_id.to_owned(), owner.to_owned());
        Box::pin(self.lease(move |conn| lease::claim(conn, &session_id, &owner, ttl)))
    }

    fn renew<'a>(
        &'a self,
        owner: &'a str,
        ttl: std::time::Duration,
        sessions: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let (owner, sessions) = (owner.to_owned(), sessions.to_vec());
        Box::pin(self.lease(move |conn| lease::renew(conn, &owner, ttl, &sessions)))
    }

    fn release<'a>(&'a self, session_id: &'a str, owner: &'a str, epoch: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        let (session_id, owner) = (session_id.to_owned(), owner.to_owned());
        Box::pin(self.lease(move |conn| lease::release(conn, &session_id, &owner, epoch)))
    }

    fn sessions_to_take_over<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        let after = after.map(str::to_owned);
        Box::pin(self.read(move |conn| lease::sessions_to_take_over(conn, after.as_deref(), limit)))
    }
}

/// Maps a SQLite error to the store's error, naming the file when that helps.
fn store_error(error: rusqlite::Error, path: &Path) -> StoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::NotADatabase(path.display().to_string()),
        Some(ErrorCode::CannotOpen) => StoreError::Backend(Arc::new(std::io::Error::other(format!(
            "cannot open {}: {error}",
            path.display()
        )))),
        _ => sqlite_error(error),
    }
}

/// Maps a SQLite error to the store's error.
///
/// An I/O error (`SQLITE_IOERR`: a failed write or fsync, a file system
/// turned read-only under an open file) or a database that cannot be
/// written (`SQLITE_READONLY`) is the file's, not the request's: SQLite
/// rolled the transaction back, nothing was acknowledged, and the same
/// write can succeed once the fault clears, so it is
/// [`StoreError::Unavailable`] (a `503` to clients), like a database server
/// gone away.
fn sqlite_error(error: rusqlite::Error) -> StoreError {
    match error.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => StoreError::Full(error.to_string()),
        Some(ErrorCode::NotADatabase) => StoreError::NotADatabase(error.to_string()),
        Some(ErrorCode::SystemIoFailure | ErrorCode::ReadOnly) => {
            StoreError::Unavailable(format!("the database file cannot be written: {error}"))
        }
        _ => StoreError::Backend(Arc::new(error)),
    }
}
