//! The lock that keeps a second server off a database.
//!
//! Sessions are fenced by leases, so two processes on one database never
//! interleave their writes, but they keep taking sessions from each other
//! and their clients get errors. `keel serve` therefore holds an exclusive
//! [`ServeLock`] on a file beside the database (`<database>-serve.lock`)
//! for as long as it runs; the lock is the kernel's (`flock`), so it goes
//! away with the process however it ends. The file says who holds it (pid,
//! address), for the message of whoever finds it held.
//!
//! `keel run` and `keel chat` take a *shared* hold on the same file
//! ([`ServeLock::share`]) while they have a session open on the database: a
//! server starting meanwhile would load their turn in flight and take the
//! session from under them, so it refuses to start instead.

use std::fs::{File, OpenOptions};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{FlockOperation, flock};
use rustix::io::Errno;

use crate::StoreError;

/// An exclusive hold on a database by one serving process; released when
/// dropped (or when the process ends).
#[derive(Debug)]
pub struct ServeLock {
    file: File,
    path: PathBuf,
}

impl ServeLock {
    /// Takes the lock of the database at `database`, recording `holder`
    /// (who holds it, for others' messages). Fails with
    /// [`StoreError::Held`] when another process holds it.
    pub fn acquire(database: &Path, holder: &str) -> Result<Self, StoreError> {
        let (file, path) = open_lock_file(database)?;
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                // Shared holds only (terminal commands) let a shared probe
                // in; another server's exclusive one does not.
                let holder = match flock(&file, FlockOperation::NonBlockingLockShared) {
                    Ok(()) => SHARED_HOLDERS.to_owned(),
                    Err(_) => read_holder(&path),
                };
                return Err(StoreError::Held {
                    database: database.display().to_string(),
                    holder,
                });
            }
            Err(error) => return Err(io_error(&path, &error.into())),
        }
        let mut lock = Self { file, path };
        lock.describe(holder)?;
        Ok(lock)
    }

    /// Replaces the holder's description (once its address is known).
    pub fn describe(&mut self, holder: &str) -> Result<(), StoreError> {
        let written = self
            .file
            .set_len(0)
            .and_then(|()| self.file.rewind())
            .and_then(|()| self.file.write_all(holder.as_bytes()));
        written.map_err(|error| io_error(&self.path, &error))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes a shared hold on the database at `database`, for a command that
    /// opens a session on it directly: kept while the session is open, it
    /// keeps a server from starting. Fails with [`StoreError::Held`], naming
    /// the server, when one holds the database.
    pub fn share(database: &Path) -> Result<SharedHold, StoreError> {
        let (file, path) = open_lock_file(database)?;
        match flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => Ok(SharedHold { _file: file }),
            Err(Errno::WOULDBLOCK) => Err(StoreError::Held {
                database: database.display().to_string(),
                holder: read_holder(&path),
            }),
            Err(error) => Err(io_error(&path, &error.into())),
        }
    }

    /// Who holds the lock of the database at `database`, if a process does
    /// (its description); `None` when no server holds it.
    pub fn holder(database: &Path) -> Result<Option<String>, StoreError> {
        let path = lock_path(database)?;
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_error(&path, &error)),
        };
        // A shared lock is refused only while someone holds the exclusive
        // one; it is released when `file` is dropped.
        match flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => Ok(None),
            Err(Errno::WOULDBLOCK) => Ok(Some(read_holder(&path))),
            Err(error) => Err(io_error(&path, &error.into())),
        }
    }
}

/// Who holds a database when only shared holds are on it.
const SHARED_HOLDERS: &str = "keel run or keel chat (a session opened on it directly)";

/// A terminal command's shared hold on a database (see [`ServeLock::share`]);
/// released when dropped.
#[derive(Debug)]
pub struct SharedHold {
    _file: File,
}

/// What the lock file's name adds to the database's: `<database>-serve.lock`.
/// Public so that the registry of Keel's protected files covers the lock
/// before any process has created it.
pub const LOCK_SUFFIX: &str = "-serve.lock";

/// Every file a SQLite database at `path` is made of, whether or not it exists
/// yet: the database, its journal, WAL and shared-memory files, and the lock
/// `keel serve` holds on it. The registry of Keel's protected files covers all
/// of them.
pub fn database_files(path: &Path) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    for suffix in ["-wal", "-shm", "-journal", LOCK_SUFFIX] {
        let mut sidecar = path.as_os_str().to_os_string();
        sidecar.push(suffix);
        files.push(PathBuf::from(sidecar));
    }
    files
}

/// `<database>-serve.lock`, in the database's directory made absolute, so
/// that every spelling of the database's path finds the same lock.
fn lock_path(database: &Path) -> Result<PathBuf, StoreError> {
    let name = database
        .file_name()
        .ok_or_else(|| StoreError::Invalid(format!("{} names no file", database.display())))?;
    let directory = match database.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let directory = directory.canonicalize().map_err(|error| io_error(&directory, &error))?;
    let mut lock_name = name.to_os_string();
    lock_name.push(LOCK_SUFFIX);
    Ok(directory.join(lock_name))
}

fn read_holder(path: &Path) -> String {
    let holder = std::fs::read_to_string(path).unwrap_or_default();
    let holder = holder.trim();
    if holder.is_empty() {
        "another process".to_owned()
    } else {
        holder.to_owned()
    }
}

fn io_error(path: &Path, error: &std::io::Error) -> StoreError {
    StoreError::Backend(Arc::new(std::io::Error::new(
        error.kind(),
        format!("{}: {error}", path.display()),
    )))
}

/// Opens (creating it if needed, keeping what it holds) the lock file of
/// the database at `database`.
fn open_lock_file(database: &Path) -> Result<(File, PathBuf), StoreError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = lock_path(database)?;
    let file = OpenOptions::new()
        .mode(0o600)
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|error| io_error(&path, &error))?;
    Ok((file, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_database_names_its_holder_until_the_lock_is_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let database = dir.path().join("keel.sqlite3");
        assert_eq!(ServeLock::holder(&database).expect("holder"), None);
        let mut lock = ServeLock::acquire(&database, "first").expect("lock");
        lock.describe("keel serve (pid 1, http://127.0.0.1:1)")
            .expect("describe");
        assert_eq!(
            ServeLock::holder(&database).expect("holder").as_deref(),
            Some("keel serve (pid 1, http://127.0.0.1:1)")
        );
        // Another spelling of the same path finds the same lock.
        let relative = dir.path().join(".").join("keel.sqlite3");
        match ServeLock::acquire(&relative, "second") {
            Err(StoreError::Held { holder, .. }) => assert_eq!(holder, "keel serve (pid 1, http://127.0.0.1:1)"),
            other => panic!("expected Held, got {other:?}"),
        }
        assert!(matches!(ServeLock::share(&database), Err(StoreError::Held { .. })));
        drop(lock);
        assert_eq!(ServeLock::holder(&database).expect("holder"), None);

        // Terminal commands share; a server is then refused, naming them.
        let first = ServeLock::share(&database).expect("share");
        let second = ServeLock::share(&database).expect("share again");
        match ServeLock::acquire(&database, "server") {
            Err(StoreError::Held { holder, .. }) => assert_eq!(holder, SHARED_HOLDERS),
            other => panic!("expected Held, got {other:?}"),
        }
        drop((first, second));
        ServeLock::acquire(&database, "second").expect("free again");
    }
}
