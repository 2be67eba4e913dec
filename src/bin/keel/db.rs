//! Where a command's database is (a SQLite file, the default, or a
//! PostgreSQL database named by a `postgres://` URL), opening it, and the
//! hold a command keeps on it so that a `keel serve` and the local commands
//! do not take sessions from each other.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
pub(crate) use keel::store::Location;
use keel::store::{AccessStore, Backend, CheckpointStore, ClusterStore, NoticeListener, OpenOptions, SqliteOptions};
use keel::store::{PostgresHold, ServeLock, SharedHold, StoreError, WebhookStore};

/// Where the database is.
#[derive(Args, Debug, Clone)]
pub(crate) struct DbArgs {
    /// The database: a SQLite file [default: <data dir>/keel/keel.sqlite3],
    /// or a PostgreSQL database as a URL (postgres://USER@HOST:PORT/DATABASE)
    /// or a key=value string (host=/run/postgresql dbname=keel). Give a
    /// PostgreSQL password through KEEL_DB, a ~/.pgpass file or PGPASSFILE,
    /// never on the command line, where every local user sees it (ps).
    #[arg(long, env = "KEEL_DB", value_name = "PATH|URL")]
    db: Option<PathBuf>,
    /// Create the SQLite file named by --db if it does not exist (without
    /// it, a --db file that does not exist is an error, so that a mistyped
    /// path does not start an empty database; the default path, and one
    /// given in KEEL_DB, are created when needed).
    #[arg(long)]
    create: bool,
    /// MiB of disk kept for a SQLite database's own commits, in a ballast
    /// file beside it (<database>-reserve) that is given up when the disk
    /// fills, so commits go on; 0 turns it off. Below it, /readyz says not
    /// ready.
    #[arg(long, env = "KEEL_STORE_RESERVE_MB", value_name = "MIB",
          default_value_t = keel::store::sqlite::DEFAULT_RESERVE_BYTES / (1024 * 1024))]
    store_reserve_mb: u64,
}

/// Warns, once, when the PostgreSQL connection string carrying a password
/// came from the command line rather than `KEEL_DB`: every local user can
/// read a process's arguments (`ps`, `/proc/<pid>/cmdline`).
fn warn_if_password_in_arguments(url: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let from_environment = std::env::var_os("KEEL_DB").is_some_and(|value| value == url);
    if from_environment || keel::store::redact_postgres_url(url) == url {
        return;
    }
    WARNED.call_once(|| {
        tracing::warn!(
            "the --db connection string carries a password, which every local user can read in the process list"
        );
        eprintln!(
            "warning: the password in --db is visible to every local user (ps); \
             give it in KEEL_DB, ~/.pgpass or PGPASSFILE instead"
        );
    });
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
            Some(given) => Ok(match given.to_str().map(Location::parse) {
                Some(Location::Postgres(url)) => {
                    warn_if_password_in_arguments(&url);
                    // Its Unix socket directory, if it connects through one:
                    // no sandboxed command may reach the database there.
                    for directory in keel::store::postgres::socket_directories(&url) {
                        keel::tools::workspace::sandbox::cover_socket_directory(&directory);
                    }
                    Location::Postgres(url)
                }
                Some(sqlite) => sqlite,
                None => Location::Sqlite(given.clone()),
            }),
            None => {
                let data = dirs::data_dir().context("no per-user data directory; pass --db or set KEEL_DB")?;
                Ok(Location::Sqlite(data.join("keel").join("keel.sqlite3")))
            }
        }
    }

    /// For `keel serve`, which creates its database: an error when the
    /// SQLite file does not exist and may not be created (see
    /// [`Self::may_create`]).
    pub(crate) fn ensure_creatable(&self) -> anyhow::Result<()> {
        match self.location()? {
            Location::Sqlite(path) if !path.exists() => self.may_create(&path),
            _ => Ok(()),
        }
    }

    /// Whether a command that would create the SQLite file at `path` may:
    /// with `--create`, or when the path is not from `--db` (the default,
    /// or `KEEL_DB`). An error naming the path and `--create` otherwise.
    fn may_create(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let Some(given) = &self.db else { return Ok(()) };
        let from_environment = std::env::var_os("KEEL_DB").is_some_and(|value| value == given.as_os_str());
        anyhow::ensure!(
            self.create || from_environment,
            "no database at {}: pass --create to create it there (or check the --db path)",
            path.display()
        );
        Ok(())
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
        Ok(self.open_store(create).await?.store)
    }

    async fn open_store(&self, create: bool) -> anyhow::Result<keel::store::OpenedStore> {
        let location = self.location()?;
        if let Location::Sqlite(path) = &location
            && !path.exists()
        {
            if !create {
                anyhow::bail!("no database at {}", path.display());
            }
            self.may_create(path)?;
            if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
                create_private_dir(parent)?;
            }
        }
        let options = OpenOptions {
            sqlite: SqliteOptions {
                reserve_bytes: self.store_reserve_mb.saturating_mul(1024 * 1024),
                ..SqliteOptions::default()
            },
            ..OpenOptions::default()
        };
        let opened = keel::store::open_at(&location, options).await?;
        if let (Location::Sqlite(path), Backend::Sqlite(store)) = (&location, &opened.backend) {
            // It holds every session's conversation: no sandboxed
            // command of any session may read it. Nor may one shrink
            // or delete the space reserve beside it.
            keel::tools::workspace::sandbox::protect_all(keel::store::sqlite::database_files(path));
            keel::tools::workspace::sandbox::protect(store.space_reserve().path());
        }
        Ok(opened)
    }

    /// Opens the database's keys, budgets and usage (for `keel keys`),
    /// creating a SQLite file when `create` is set.
    pub(crate) async fn open_access(&self, create: bool) -> anyhow::Result<Arc<dyn AccessStore>> {
        Ok(self.open_store(create).await?.access)
    }

    /// Opens the database for `keel serve`: on a database several nodes
    /// share (PostgreSQL), with its several-node part and the listener
    /// that makes the server one node among several; and its keys.
    pub(crate) async fn open_for_serving(&self) -> anyhow::Result<Serving> {
        let opened = self.open_store(true).await?;
        let cluster = match opened.cluster {
            Some(cluster) => {
                let listener = cluster.listen().await?;
                Some((cluster, listener))
            }
            None => None,
        };
        Ok(Serving {
            store: opened.store,
            cluster,
            access: opened.access,
            webhooks: opened.webhooks,
        })
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
                    create_private_dir(parent).map_err(|error| StoreError::Invalid(format!("{error:#}")))?;
                }
                let lock = ServeLock::acquire(&path, holder)?;
                keel::tools::workspace::sandbox::protect(lock.path());
                Ok(Hold::SqliteServing(lock))
            }
            Location::Postgres(url) => PostgresHold::serve(&url, holder, node_id).await.map(Hold::Postgres),
        }
    }
}

/// Creates `directory` and its missing parents, readable by the owner only
/// (the database in it holds every conversation); existing ones are left
/// as they are.
fn create_private_dir(directory: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(directory)
        .with_context(|| format!("cannot create {}", directory.display()))
}

/// What went wrong opening the database at `location`, and what to do: a
/// database held by another process names it; a PostgreSQL login, a
/// missing database or TLS say so.
pub(crate) fn explain_open_error(error: StoreError, location: &Location) -> anyhow::Error {
    if let StoreError::Held { .. } = &error {
        return anyhow::anyhow!("{error}; refusing to start (stop it, or pass another --db)");
    }
    match location {
        Location::Postgres(_) => explain_failure(&error.to_string(), location),
        Location::Sqlite(_) => error.into(),
    }
}

/// A failure to reach the PostgreSQL database at `location`, said as
/// `text`: what failed (the login, a missing database, TLS) and what to do.
pub(crate) fn explain_failure(text: &str, location: &Location) -> anyhow::Error {
    let lower = text.to_lowercase();
    let hint = if lower.contains("password authentication failed")
        || lower.contains("authentication")
        || (lower.contains("role") && lower.contains("does not exist"))
    {
        "PostgreSQL refused the login (authentication failed): check the user in --db and the password \
         (in KEEL_DB, ~/.pgpass or PGPASSFILE)"
    } else if lower.contains("database") && lower.contains("does not exist") {
        "the PostgreSQL database does not exist: create it (createdb NAME, or CREATE DATABASE) or fix its name in --db"
    } else if lower.contains("tls") || lower.contains("ssl") {
        "TLS to PostgreSQL failed: Keel connects without TLS, so use sslmode=disable (or prefer) over a trusted \
         network or a Unix socket (host=/run/postgresql), or put a TLS proxy beside Keel"
    } else {
        return anyhow::anyhow!("cannot open the database {location}: {text}");
    };
    anyhow::anyhow!("cannot open the database {location}: {hint} ({text})")
}

/// The parts of a database `keel serve` serves from.
pub(crate) struct Serving {
    /// The sessions.
    pub(crate) store: Arc<dyn CheckpointStore>,
    /// With several nodes: the store's shared part and its notices.
    pub(crate) cluster: Option<(Arc<dyn ClusterStore>, NoticeListener)>,
    /// Keys, budgets and the usage ledger.
    pub(crate) access: Arc<dyn AccessStore>,
    /// The webhook outbox.
    pub(crate) webhooks: Arc<dyn WebhookStore>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(db: &str) -> DbArgs {
        DbArgs {
            db: Some(PathBuf::from(db)),
            create: false,
            store_reserve_mb: 0,
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
        assert_eq!(
            args("host=/run/postgresql dbname=keel").location().expect("location"),
            Location::Postgres("host=/run/postgresql dbname=keel".to_owned())
        );
        assert_eq!(
            args("./host=x").location().expect("location"),
            Location::Sqlite(PathBuf::from("./host=x"))
        );
        for given in ["postgres://db/keel?password=hunter2", "host=db password=hunter2"] {
            let shown = args(given).location().expect("location").to_string();
            assert!(!shown.contains("hunter2"), "{shown}");
        }
        assert!(args("postgres://db/keel").sqlite_file("keel backup").is_err());
    }
}
