//! The database a benchmark runs on: a SQLite file (a fresh temporary one
//! by default) or a PostgreSQL database, with the writer's counters either
//! way.

use std::path::PathBuf;
use std::sync::Arc;

use keel_protocol::{Error, Result};
use keel_store::{
    CheckpointStore, PostgresCheckpoint, PostgresOptions, SqliteCheckpoint, SqliteOptions, Synchronous, WriterStats,
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
    /// A `postgres://` or `postgresql://` URL is PostgreSQL; any other
    /// value a SQLite file.
    pub fn parse(value: &str) -> Self {
        if value.starts_with("postgres://") || value.starts_with("postgresql://") {
            Self::Postgres(value.to_owned())
        } else {
            Self::SqliteFile(PathBuf::from(value))
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
    backend: Backend,
    /// Holds the temporary SQLite file until the run ends.
    _scratch: Option<tempfile::TempDir>,
}

enum Backend {
    Sqlite(Arc<SqliteCheckpoint>, PathBuf),
    Postgres(Arc<PostgresCheckpoint>),
}

impl BenchStore {
    /// Opens `database` (`name` names a temporary SQLite file).
    pub(crate) async fn open(
        database: &BenchDatabase,
        name: &str,
        synchronous: Synchronous,
        grouping: Grouping,
    ) -> Result<Self> {
        let (path, scratch) = match database {
            BenchDatabase::Postgres(url) => {
                let options = PostgresOptions {
                    per_event: grouping == Grouping::OneJobPerTransaction,
                    ..PostgresOptions::default()
                };
                let postgres = Arc::new(PostgresCheckpoint::connect(url, options).await?);
                return Ok(Self {
                    store: postgres.clone(),
                    backend: Backend::Postgres(postgres),
                    _scratch: None,
                });
            }
            BenchDatabase::SqliteFile(path) => (path.clone(), None),
            BenchDatabase::Sqlite => {
                let scratch =
                    tempfile::tempdir().map_err(|error| Error::Config(format!("cannot create a temp dir: {error}")))?;
                (scratch.path().join(name), Some(scratch))
            }
        };
        let mut options = SqliteOptions {
            synchronous,
            ..SqliteOptions::default()
        };
        if grouping == Grouping::OneJobPerTransaction {
            options.max_jobs_per_commit = 1;
        }
        let sqlite = Arc::new(SqliteCheckpoint::open(&path, options).await?);
        Ok(Self {
            store: sqlite.clone(),
            backend: Backend::Sqlite(sqlite, path),
            _scratch: scratch,
        })
    }

    /// The store, for the runtime.
    pub(crate) fn store(&self) -> Arc<dyn CheckpointStore> {
        Arc::clone(&self.store)
    }

    /// The writer's counters so far.
    pub(crate) fn stats(&self) -> WriterStats {
        match &self.backend {
            Backend::Sqlite(sqlite, _) => sqlite.writer_stats(),
            Backend::Postgres(postgres) => postgres.stats(),
        }
    }

    /// Bytes the SQLite database takes on disk (its WAL included); 0 for
    /// PostgreSQL, whose files are the server's.
    pub(crate) fn bytes_on_disk(&self) -> u64 {
        match &self.backend {
            Backend::Sqlite(_, path) => sqlite_bytes_on_disk(path),
            Backend::Postgres(_) => 0,
        }
    }

    /// Closes the store once the run is over.
    pub(crate) async fn close(&self) {
        self.store.close().await;
    }
}
