//! A consistent copy of a database that may be in use.
//!
//! `VACUUM INTO` reads the database in one read transaction, so the copy is
//! a snapshot of one moment even while a server keeps committing (WAL
//! readers do not block the writer, nor it them). The copy is written under
//! a temporary name beside the destination, made private to the user, then
//! renamed: a copy cut short never lies under the name asked for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{Connection, OpenFlags};

use crate::StoreError;

/// Copies the database at `source` into the new file `dest`, consistently,
/// on a blocking thread. Fails if `dest` exists or `source` does not.
pub async fn backup(source: PathBuf, dest: PathBuf) -> Result<(), StoreError> {
    tokio::task::spawn_blocking(move || backup_blocking(&source, &dest))
        .await
        .map_err(|error| StoreError::Backend(Arc::new(error)))?
}

/// [`backup`], on the calling thread.
pub fn backup_blocking(source: &Path, dest: &Path) -> Result<(), StoreError> {
    if dest.exists() {
        return Err(StoreError::Invalid(format!(
            "{} exists; not overwriting it",
            dest.display()
        )));
    }
    let partial = partial_name(dest);
    let _ = std::fs::remove_file(&partial);
    let target = partial
        .to_str()
        .ok_or_else(|| StoreError::Invalid(format!("{} is not a UTF-8 path", dest.display())))?
        .to_owned();
    // No `SQLITE_OPEN_CREATE`: a mistyped source is an error, not a new
    // empty database.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(source, flags).map_err(|error| super::store_error(error, source))?;
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(super::sqlite_error)?;
    let copied = conn
        .execute("VACUUM INTO ?1", [&target])
        .map_err(|error| super::store_error(error, source))
        .and_then(|_| private(&partial))
        .and_then(|()| std::fs::rename(&partial, dest).map_err(|error| StoreError::Backend(Arc::new(error))));
    if copied.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    copied
}

/// Where the copy is written before it is renamed into place.
fn partial_name(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
    PathBuf::from(name)
}

/// Makes the copy readable by its owner only: it holds every conversation.
fn private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|error| StoreError::Backend(Arc::new(error)))
}
