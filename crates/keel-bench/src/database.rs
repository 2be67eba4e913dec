//! The database a benchmark runs on: a SQLite file (a fresh temporary one
//! by default) or a PostgreSQL database, with the writer's counters either
//! way.

use std::path::PathBuf;
use std::sync::Arc;

use keel_protocol::{Error, Result};
use keel_store::{
    AccessStore, Backend, CheckpointStore, Location, OpenOptions, StoreError, Synchronous, WebhookStore, WriterStats,
};

use super::stats::sqlite_bytes_on_disk;

/// Where a benchmark stores its sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BenchDatabase {
    /// A SQLite file; a fresh one in a temporary directory when `None`.
    #[default]
    Sqlite,
    /// This SQLite file (created if missing).
    SqliteFile(PathBuf),
    /// A PostgreSQL database, by URL (it must exist; the benchmark's
    /// sessions get ids of their own, so a database can be reused).
    Postgres(String),
}

impl BenchDatabase {
    /// What the store names it ([`Location::parse`]): a PostgreSQL URL or
    /// connection string, or else a SQLite file.
    pub fn parse(value: &str) -> Self {
        match Location::parse(value) {
            Location::Postgres(url) => Self::Postgres(url),
            Location::Sqlite(path) => Self::SqliteFile(path),
        }
    }

    /// The backend's name, for reports.
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Sqlite | Self::SqliteFile(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }
}

/// How the store groups commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// Everything queued commits together (the default).
    Group,
    /// One store job per transaction: the baseline group commit is
    /// measured against.
    OneJobPerTransaction,
}

/// An open benchmark store.
pub(crate) struct BenchStore {
    store: Arc<dyn CheckpointStore>,
    /// The same database's keys, budgets and usage.
    access: Arc<dyn AccessStore>,
    /// The same database's webhook outbox.
    webhooks: Arc<dyn WebhookStore>,
    backend: Backend,
    /// The SQLite file, for its size on disk.
    path: Option<PathBuf>,
    /// Holds the temporary SQLite file until the run ends.
    _scratch: Option<tempfile::TempDir>,
}

impl BenchStore {
    /// Opens `database` (`name` names a temporary SQLite file).
    pub(crate) async fn open(
        database: &BenchDatabase,
        name: &str,
        synchronous: Synchronous,
        grouping: Grouping,
    ) -> Result<Self> {
        let (location, scratch) = match database {
            BenchDatabase::Postgres(url) => (Location::Postgres(url.clone()), None),
            BenchDatabase::SqliteFile(path) => (Location::Sqlite(path.clone()), None),
            BenchDatabase::Sqlite => {
                let scratch =
                    tempfile::tempdir().map_err(|error| Error::Config(format!("cannot create a temp dir: {error}")))?;
                (Location::Sqlite(scratch.path().join(name)), Some(scratch))
            }
        };
        let one_per_transaction = grouping == Grouping::OneJobPerTransaction;
        let mut options = OpenOptions::default();
        options.sqlite.synchronous = synchronous;
        if one_per_transaction {
            options.sqlite.max_jobs_per_commit = 1;
        }
        options.postgres.per_event = one_per_transaction;
        let opened = keel_store::open_at(&location, options)
            .await
            .map_err(StoreError::from)?;
        let path = match location {
            Location::Sqlite(path) => Some(path),
            Location::Postgres(_) => None,
        };
        Ok(Self {
            store: opened.store,
            access: opened.access,
            webhooks: opened.webhooks,
            backend: opened.backend,
            path,
            _scratch: scratch,
        })
    }

    /// The store, for the runtime.
    pub(crate) fn store(&self) -> Arc<dyn CheckpointStore> {
        Arc::clone(&self.store)
    }

    /// The database's keys, budgets and usage, for the server.
    pub(crate) fn access(&self) -> Arc<dyn AccessStore> {
        Arc::clone(&self.access)
    }

    /// The database's webhook outbox, for the server.
    pub(crate) fn webhooks(&self) -> Arc<dyn WebhookStore> {
        Arc::clone(&self.webhooks)
    }

    /// The writer's counters so far.
    pub(crate) fn stats(&self) -> WriterStats {
        match &self.backend {
            Backend::Sqlite(sqlite) => sqlite.writer_stats(),
            Backend::Postgres(postgres) => postgres.stats(),
        }
    }

    /// Bytes the SQLite database takes on disk (its WAL included); 0 for
    /// PostgreSQL, whose files are the server's.
    pub(crate) fn bytes_on_disk(&self) -> u64 {
        self.path.as_deref().map_or(0, sqlite_bytes_on_disk)
    }

    /// Closes the store once the run is over.
    pub(crate) async fn close(&self) {
        self.store.close().await;
    }
}
