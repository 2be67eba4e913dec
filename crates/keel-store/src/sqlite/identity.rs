//! The identity of the database file, checked around every commit and read.
//!
//! An open SQLite connection keeps writing to the file it opened even after
//! that file was deleted or replaced under its path: commits would still be
//! acknowledged, then be gone at the next start. The store remembers the
//! file's device and inode when it opens it and, once the path no longer
//! leads to that file, fails closed: every later write and read is refused
//! with [`StoreError::Replaced`], so nothing more is acknowledged and
//! readiness checks say not ready.
//!
//! The shared-memory file (`-shm`) is checked with it: every connection
//! maps it, and once it is made immutable or append-only (`chattr +i`,
//! which also flushes its pages and marks them read-only), the next write
//! into the mapping kills the process with `SIGBUS`. So before each group
//! commit, read, lease call and checkpoint the store looks at its flags (a
//! `statx`, no open) and fails with [`StoreError::Unavailable`] instead of
//! touching the mapping, until the flag is gone.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::StoreError;

/// The file a store opened, and whether its path still leads to it.
#[derive(Debug)]
pub(super) struct FileIdentity {
    path: PathBuf,
    /// The database's `-shm` file.
    shm: PathBuf,
    device: u64,
    inode: u64,
    /// Set, for good, once the path was found to lead elsewhere.
    lost: AtomicBool,
}

impl FileIdentity {
    /// Remembers the file now at `path` (which must exist).
    pub(super) fn of(path: &Path) -> Result<Self, StoreError> {
        let metadata = std::fs::metadata(path).map_err(|error| {
            StoreError::Backend(std::sync::Arc::new(std::io::Error::new(
                error.kind(),
                format!("cannot read {}: {error}", path.display()),
            )))
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            shm: shm_path(path),
            device: metadata.dev(),
            inode: metadata.ino(),
            lost: AtomicBool::new(false),
        })
    }

    /// `Ok` while the path still leads to the file that was opened and its
    /// `-shm` can be written through its mapping: checked before every
    /// group commit, read and lease call, which all touch the mapping. A
    /// `stat` and a `statx`: cheap beside the fsync of a commit.
    pub(super) fn usable(&self) -> Result<(), StoreError> {
        self.check().and_then(|()| self.shm_mappable())
    }

    /// `Ok` while the path still leads to the file that was opened. A
    /// `stat`: cheap beside the fsync of a commit.
    pub(super) fn check(&self) -> Result<(), StoreError> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(self.error());
        }
        let same = std::fs::metadata(&self.path)
            .is_ok_and(|metadata| metadata.dev() == self.device && metadata.ino() == self.inode);
        if same {
            return Ok(());
        }
        if !self.lost.swap(true, Ordering::Relaxed) {
            tracing::error!(
                path = %self.path.display(),
                "the database file was deleted or replaced while open; refusing every write and read from now on"
            );
        }
        Err(self.error())
    }

    fn error(&self) -> StoreError {
        StoreError::Replaced(self.path.display().to_string())
    }

    /// `Err` while the `-shm` is immutable or append-only: a write into its
    /// mapping would be `SIGBUS`. A missing `-shm` (not made yet) is fine.
    fn shm_mappable(&self) -> Result<(), StoreError> {
        use rustix::fs::{AtFlags, StatxAttributes, StatxFlags};
        let Ok(status) = rustix::fs::statx(rustix::fs::CWD, &self.shm, AtFlags::empty(), StatxFlags::BASIC_STATS)
        else {
            return Ok(());
        };
        let frozen = StatxAttributes::IMMUTABLE | StatxAttributes::APPEND;
        if status.stx_attributes.intersects(frozen) {
            return Err(StoreError::Unavailable(format!(
                "the database's shared-memory file {} was made immutable or append-only; \
                 no write or read is attempted until that is undone (chattr -i -a)",
                self.shm.display()
            )));
        }
        Ok(())
    }

    /// `Ok` while the file system holding the database is writable. Checked
    /// after each commit, before it is acknowledged: once ext4 turns itself
    /// read-only after an error (`errors=remount-ro`), `fsync` answers
    /// success without writing anything, so a commit would be acknowledged
    /// and then lost. A `statvfs`: cheap beside the fsync.
    pub(super) fn file_system_writable(&self) -> Result<(), StoreError> {
        match rustix::fs::statvfs(&self.path) {
            Ok(status) if status.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) => {
                Err(StoreError::Unavailable(format!(
                    "the file system holding {} turned read-only: the last commit may not have reached the disk",
                    self.path.display()
                )))
            }
            _ => Ok(()),
        }
    }

    /// `Ok` when a checkpoint may run: the file system is writable
    /// ([`Self::file_system_writable`]) and so is the `-shm`'s mapping,
    /// which a checkpoint updates.
    pub(super) fn writable(&self) -> Result<(), StoreError> {
        self.file_system_writable().and_then(|()| self.shm_mappable())
    }
}

/// Bytes free for unprivileged writers on the file system holding `path`
/// (its directory's, when `path` does not exist yet), by `statvfs`.
pub(super) fn free_bytes(path: &Path) -> Option<u64> {
    let status = rustix::fs::statvfs(path)
        .or_else(|_| {
            rustix::fs::statvfs(
                path.parent()
                    .filter(|dir| !dir.as_os_str().is_empty())
                    .unwrap_or(Path::new(".")),
            )
        })
        .ok()?;
    Some(status.f_bavail.saturating_mul(status.f_frsize))
}

/// The `-shm` file of `database`.
fn shm_path(database: &Path) -> PathBuf {
    let mut name = database.as_os_str().to_os_string();
    name.push("-shm");
    PathBuf::from(name)
}

/// Refuses a database whose shared-memory file (`-shm`, the WAL index every
/// connection maps) exists but cannot be written by this process: SQLite
/// would fail later with a puzzling "readonly database", or, mapped read
/// only, die of `SIGBUS` with no word. Checked before the first connection.
pub(super) fn check_shm_writable(database: &Path) -> Result<(), StoreError> {
    let shm = shm_path(database);
    match std::fs::OpenOptions::new().read(true).write(true).open(&shm) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(StoreError::Backend(std::sync::Arc::new(std::io::Error::new(
            error.kind(),
            format!(
                "the database's shared-memory file {} is not writable by this process ({error}): \
                 give it the database's owner and mode, or delete it while no process has the database open",
                shm.display()
            ),
        )))),
    }
}
