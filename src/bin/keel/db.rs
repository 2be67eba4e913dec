//! Where a command's database is (a SQLite file, the default, or a
//! PostgreSQL database named by a `postgres://` URL), opening it, and the
//! hold a command keeps on it so that a `keel serve` and the local commands
//! do not take sessions from each other.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use keel::store::postgres::LogListener;
use keel::store::{CheckpointStore, ServeLock, SharedHold, SqliteCheckpoint, SqliteOptions, StoreError};
use keel::store::{PostgresCheckpoint, PostgresHold, PostgresOptions};

/// Where the database is.
#[derive(Args, Debug, Clone)]
pub(crate) struct DbArgs {
    /// The database: a SQLite file [default: <data dir>/keel/keel.sqlite3],
    /// or a PostgreSQL database as a URL
    /// (postgres://USER:PASSWORD@HOST:PORT/DATABASE).
    #[arg(long, env = "KEEL_DB", value_name = "PATH|URL")]
    db: Option<PathBuf>,
}

/// A database, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL.
    Postgres(String),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "{}", path.display()),
            // The URL may carry a password.
            Location::Postgres(url) => write!(f, "{}", keel::store::redact_postgres_url(url)),
        }
    }
}

/// What a command holds on its database while it works (see
/// [`DbArgs::share`] and [`DbArgs::lock_for_serving`]).
#[must_use = "the hold lasts as long as the value"]
pub(crate) enum Hold {
    /// A shared hold on a SQLite file, kept for as long as the value lives.
    SqliteShared(#[allow(dead_code, reason = "held only to be dropped")] SharedHold),
    /// `keel serve`'s exclusive hold on a SQLite file.
    SqliteServing(ServeLock),
    /// An advisory lock on a PostgreSQL database.
    Postgres(PostgresHold),
}

impl Hold {
    /// Records who holds the database now (a server's address, once known).
    pub(crate) async fn describe(&mut self, holder: &str) -> anyhow::Result<()> {
        match self {
            Hold::SqliteServing(lock) => lock.describe(holder).map_err(Into::into),
            Hold::Postgres(hold) => hold.describe(holder).await.map_err(Into::into),
            Hold::SqliteShared(_) => Ok(()),
        }
    }
}

impl DbArgs {
    /// Where the database is: a `postgres://` or `postgresql://` URL is
    /// PostgreSQL, anything else a SQLite file.
    pub(crate) fn location(&self) -> anyhow::Result<Location> {
        match &self.db {
            Some(given) => Ok(match given.to_str() {
                Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                    // Its Unix socket directory, if it connects through one:
                    // no sandboxed command may reach the database there.
                    keel::tools::workspace::sandbox::cover_postgres_sockets(url);
                    Location::Postgres(url.to_owned())
                }
                _ => Location::Sqlite(given.clone()),
            }),
            None => {
                let data = dirs::data_dir().context("no per-user data directory; pass --db or set KEEL_DB")?;
                Ok(Location::Sqlite(data.join("keel").join("keel.sqlite3")))
            }
        }
    }

    /// The SQLite file, for what only a SQLite database has (`what` names
    /// it in the error for a PostgreSQL one).
    pub(crate) fn sqlite_file(&self, what: &str) -> anyhow::Result<PathBuf> {
        match self.location()? {
            Location::Sqlite(path) => Ok(path),
            Location::Postgres(url) => anyhow::bail!(
                "{what} works on a SQLite database; {} is a PostgreSQL one",
                keel::store::redact_postgres_url(&url)
            ),
        }
    }

    /// Opens the database, creating a SQLite file (and its directory) when
    /// `create` is set. A PostgreSQL database must exist; its schema is
    /// created or brought up to date.
    pub(crate) async fn open(&self, create: bool) -> anyhow::Result<Arc<dyn CheckpointStore>> {
        match self.location()? {
            Location::Sqlite(path) => {
                if !path.exists() {
                    if !create {
                        anyhow::bail!("no database at {}", path.display());
                    }
                    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                        std::fs::create_dir_all(parent)
                            .with_context(|| format!("cannot create {}", parent.display()))?;
                    }
                }
                let store = SqliteCheckpoint::open(&path, SqliteOptions::default()).await?;
                // It holds every session's conversation: no sandboxed
                // command of any session may read it.
                keel::tools::workspace::sandbox::protect_database(&path);
                Ok(Arc::new(store))
            }
            Location::Postgres(url) => Ok(Arc::new(
                PostgresCheckpoint::connect(&url, PostgresOptions::default()).await?,
            )),
        }
    }

    /// Opens the database for `keel serve`: on PostgreSQL, with the
    /// listener that makes the server one node among several.
    pub(crate) async fn open_for_serving(&self) -> anyhow::Result<(Arc<dyn CheckpointStore>, Option<LogListener>)> {
        match self.location()? {
            Location::Sqlite(_) => Ok((self.open(true).await?, None)),
            Location::Postgres(url) => {
                let store = PostgresCheckpoint::connect(&url, PostgresOptions::default()).await?;
                let listener = store.listen().await?;
                Ok((Arc::new(store), Some(listener)))
            }
        }
    }

    /// A shared hold on the database for a command that opens sessions
    /// itself (`run`, `chat`, `fork`, `sessions rm`): refused with
    /// [`StoreError::Held`] while a `keel serve` serves it, and keeping one
    /// from starting meanwhile.
    pub(crate) async fn share(&self) -> Result<Hold, StoreError> {
        match self
            .location()
            .map_err(|error| StoreError::Invalid(error.to_string()))?
        {
            Location::Sqlite(path) => ServeLock::share(&path).map(Hold::SqliteShared),
            Location::Postgres(url) => PostgresHold::share(&url).await.map(Hold::Postgres),
        }
    }

    /// `keel serve`'s hold: refused with [`StoreError::Held`] (naming the
    /// holder) while a local command has a session open on the database, or,
    /// on SQLite, while another server serves it. Servers on one PostgreSQL
    /// database share it, as nodes.
    pub(crate) async fn lock_for_serving(&self, holder: &str, node_id: &str) -> Result<Hold, StoreError> {
        match self
            .location()
            .map_err(|error| StoreError::Invalid(error.to_string()))?
        {
            Location::Sqlite(path) => {
                if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|error| StoreError::Backend(Arc::new(error)))?;
                }
                let lock = ServeLock::acquire(&path, holder)?;
                keel::tools::workspace::sandbox::protect(lock.path());
                Ok(Hold::SqliteServing(lock))
            }
            Location::Postgres(url) => PostgresHold::serve(&url, holder, node_id).await.map(Hold::Postgres),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(db: &str) -> DbArgs {
        DbArgs {
            db: Some(PathBuf::from(db)),
        }
    }

    #[test]
    fn a_postgres_url_is_postgresql_and_anything_else_a_sqlite_file() {
        assert_eq!(
            args("postgres://keel@db/keel").location().expect("location"),
            Location::Postgres("postgres://keel@db/keel".to_owned())
        );
        assert_eq!(
            args("postgresql://db/keel").location().expect("location"),
            Location::Postgres("postgresql://db/keel".to_owned())
        );
        assert_eq!(
            args("./postgres://not-a-url").location().expect("location"),
            Location::Sqlite(PathBuf::from("./postgres://not-a-url"))
        );
        let shown = Location::Postgres("postgres://keel:hunter2@db/keel".to_owned()).to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(args("postgres://db/keel").sqlite_file("keel backup").is_err());
    }
}
