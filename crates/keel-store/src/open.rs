//! Choosing the backend from where the database is: the one place that
//! knows which strings name which backend, so that a command, the bench and
//! the chaos run open a database the same way, and a backend more is its
//! own module plus one arm here.

use std::path::PathBuf;
use std::sync::Arc;

#[cfg(feature = "postgres")]
use crate::PostgresCheckpoint;
use crate::{
    AccessStore, CheckpointStore, ClusterStore, LeaseStore, SqliteCheckpoint, SqliteOptions, StoreError, WebhookStore,
};

/// libpq's keywords that start a `key=value` connection string.
const POSTGRES_KEYWORDS: [&str; 7] = ["host", "hostaddr", "port", "dbname", "user", "password", "service"];

/// Where a database is, by backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection string (a URL or `key=value` pairs).
    Postgres(String),
}

impl Location {
    /// Where `target` points: a `postgres://` or `postgresql://` URL, or a
    /// `key=value` string whose first key is one of libpq's (`host=…
    /// dbname=…`), is PostgreSQL; a `sqlite:` URL or anything else is a
    /// SQLite file.
    pub fn parse(target: &str) -> Self {
        if target.starts_with("postgres://") || target.starts_with("postgresql://") {
            return Self::Postgres(target.to_owned());
        }
        let libpq = target
            .trim_start()
            .split_once('=')
            .is_some_and(|(key, _)| POSTGRES_KEYWORDS.contains(&key.trim()));
        if libpq {
            return Self::Postgres(target.to_owned());
        }
        let path = target
            .strip_prefix("sqlite://")
            .or_else(|| target.strip_prefix("sqlite:"))
            .unwrap_or(target);
        Self::Sqlite(PathBuf::from(path))
    }
}

/// Shown without a password a PostgreSQL connection string may carry.
impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "{}", path.display()),
            #[cfg(feature = "postgres")]
            Location::Postgres(url) => write!(f, "{}", crate::redact_postgres_url(url)),
            #[cfg(not(feature = "postgres"))]
            Location::Postgres(_) => write!(f, "a PostgreSQL database"),
        }
    }
}

/// How [`open`] opens a database, per backend.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// A SQLite store's settings.
    pub sqlite: SqliteOptions,
    /// A PostgreSQL store's settings.
    #[cfg(feature = "postgres")]
    pub postgres: crate::PostgresOptions,
}

/// The concrete store [`open`] opened, for what only one backend has (its
/// writer's counters, its files on disk).
#[derive(Clone)]
pub enum Backend {
    /// A SQLite file.
    Sqlite(Arc<SqliteCheckpoint>),
    /// A PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres(Arc<PostgresCheckpoint>),
}

/// An open database: the single-process contract, and what several nodes
/// need when the backend supports it.
#[derive(Clone)]
pub struct OpenedStore {
    /// The store, for the runtime.
    pub store: Arc<dyn CheckpointStore>,
    /// Owned leases, on backends that several processes share (both).
    pub leases: Arc<dyn LeaseStore>,
    /// API keys, budgets and the usage ledger (both backends).
    pub access: Arc<dyn AccessStore>,
    /// The webhook outbox (both backends).
    pub webhooks: Arc<dyn WebhookStore>,
    /// Relaying and notices between nodes; `None` on a backend that runs
    /// one node (SQLite).
    pub cluster: Option<Arc<dyn ClusterStore>>,
    /// The concrete store.
    pub backend: Backend,
}

/// Why [`open`] could not open a database.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The target names a backend this build does not include.
    #[error("the database is a {backend} one, and this keel was built without its `{feature}` feature")]
    NotBuilt {
        /// The backend's name.
        backend: &'static str,
        /// The Cargo feature that includes it.
        feature: &'static str,
    },
    /// The backend refused to open it.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<OpenError> for StoreError {
    fn from(error: OpenError) -> Self {
        match error {
            OpenError::Store(error) => error,
            not_built @ OpenError::NotBuilt { .. } => StoreError::Invalid(not_built.to_string()),
        }
    }
}

/// Opens the database `target` names (see [`Location::parse`]) with the
/// backend it names. A SQLite file is created if missing (its directory
/// must exist); a PostgreSQL database must exist, and its schema is created
/// or brought up to date.
pub async fn open(target: &str, options: OpenOptions) -> Result<OpenedStore, OpenError> {
    open_at(&Location::parse(target), options).await
}

/// [`open`] for a location already parsed.
pub async fn open_at(location: &Location, options: OpenOptions) -> Result<OpenedStore, OpenError> {
    match location {
        Location::Sqlite(path) => {
            let store = Arc::new(SqliteCheckpoint::open(path.clone(), options.sqlite).await?);
            Ok(OpenedStore {
                store: store.clone(),
                leases: store.clone(),
                access: store.clone(),
                webhooks: store.clone(),
                cluster: None,
                backend: Backend::Sqlite(store),
            })
        }
        #[cfg(feature = "postgres")]
        Location::Postgres(url) => {
            let store = Arc::new(PostgresCheckpoint::connect(url, options.postgres).await?);
            Ok(OpenedStore {
                store: store.clone(),
                leases: store.clone(),
                access: store.clone(),
                webhooks: store.clone(),
                cluster: Some(store.clone()),
                backend: Backend::Postgres(store),
            })
        }
        #[cfg(not(feature = "postgres"))]
        Location::Postgres(_) => Err(OpenError::NotBuilt {
            backend: "PostgreSQL",
            feature: "postgres",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_libpq_strings_are_postgresql_and_anything_else_a_sqlite_file() {
        for postgres in [
            "postgres://db/keel",
            "postgresql://db/keel",
            "host=/run/postgresql dbname=keel",
        ] {
            assert_eq!(Location::parse(postgres), Location::Postgres(postgres.to_owned()));
        }
        assert_eq!(
            Location::parse("sqlite:/tmp/k.db"),
            Location::Sqlite("/tmp/k.db".into())
        );
        assert_eq!(
            Location::parse("sqlite:///tmp/k.db"),
            Location::Sqlite("/tmp/k.db".into())
        );
        assert_eq!(Location::parse("./host=x"), Location::Sqlite("./host=x".into()));
        assert_eq!(
            Location::parse("./postgres://not-a-url"),
            Location::Sqlite("./postgres://not-a-url".into())
        );
    }

    #[tokio::test]
    async fn a_path_opens_a_sqlite_store_with_no_cluster() {
        let directory = tempfile::tempdir().expect("temp dir");
        let path = directory.path().join("keel.sqlite3");
        let target = format!("sqlite:{}", path.display());
        let opened = open(&target, OpenOptions::default()).await.expect("open");
        assert!(opened.cluster.is_none());
        assert!(matches!(opened.backend, Backend::Sqlite(_)));
        assert!(opened.store.session_summary("s").await.expect("summary").is_none());
        assert_eq!(opened.access.access_revision().await.expect("revision"), 0);
    }
}
