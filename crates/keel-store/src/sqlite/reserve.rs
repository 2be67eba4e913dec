//! A reserve of disk space for the store's own writes.
//!
//! The database shares its file system with whatever else writes there,
//! sandboxed commands included: one `dd` can fill it, after which every
//! commit fails (`503 store_full`) though nothing is wrong with the store.
//! So the store keeps a ballast file beside the database,
//! `<database>-reserve`, preallocated to the reserve's size. When a commit
//! meets a full disk, the writer gives the ballast's blocks back (truncates
//! it) and commits again, into the room it just made; once the file system
//! has room for the ballast and the reserve again, the writer allocates it
//! anew. The file stays open and keeps its inode throughout, so protecting
//! it once (from sandboxed commands and file tools) protects it for good.
//!
//! [`SpaceReserve::low_on_space`] says whether the file system is below the
//! reserve (less free than the reserve besides the ballast, or the ballast
//! given up): `/readyz` answers not ready then, and tools that write files
//! are meant to refuse to run, so that they cannot eat what is left.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::identity;

/// The reserve `keel`'s commands keep by default: 64 MiB, room for
/// thousands of turns' commits.
pub const DEFAULT_RESERVE_BYTES: u64 = 64 * 1024 * 1024;

/// How long a reading of the file system's free space is reused.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// How often, at most, the writer tries to allocate a released ballast
/// again.
const RESTORE_EVERY: Duration = Duration::from_secs(1);

/// The ballast beside a database and what is known of the space around it.
#[derive(Debug)]
pub struct SpaceReserve {
    /// The ballast file's path.
    path: PathBuf,
    /// The database's path, named in messages.
    database: PathBuf,
    bytes: u64,
    /// The ballast, open for as long as the store is (`None` when the
    /// reserve is off or the file could not be made).
    file: Mutex<Option<File>>,
    /// Whether the ballast holds its blocks now.
    in_place: AtomicBool,
    /// The last reading of the free bytes, and when it was taken.
    reading: Mutex<Option<(Instant, u64)>>,
    /// When the writer last tried to restore the ballast.
    last_restore: Mutex<Option<Instant>>,
}

impl SpaceReserve {
    /// The path of the ballast of `database`: `<database>-reserve`.
    pub fn path_for(database: &Path) -> PathBuf {
        let mut name = database.as_os_str().to_os_string();
        name.push("-reserve");
        PathBuf::from(name)
    }

    /// Opens (creating it, mode 0600) the ballast of `database` and
    /// allocates `bytes` to it; `0` turns the reserve off and leaves the
    /// file alone (another process on the database may keep a reserve in
    /// it). A file system without room for it leaves the reserve released,
    /// which [`Self::low_on_space`] reports.
    pub(super) fn open(database: &Path, bytes: u64) -> Self {
        let path = Self::path_for(database);
        let file = if bytes == 0 {
            None
        } else {
            use std::os::unix::fs::OpenOptionsExt as _;
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => Some(file),
                Err(error) => {
                    tracing::warn!(%error, path = %path.display(), "cannot open the store's space reserve; it is off");
                    None
                }
            }
        };
        let reserve = Self {
            path,
            database: database.to_path_buf(),
            bytes,
            file: Mutex::new(file),
            in_place: AtomicBool::new(false),
            reading: Mutex::new(None),
            last_restore: Mutex::new(None),
        };
        if bytes > 0 && !reserve.allocate() {
            tracing::warn!(
                path = %reserve.path.display(),
                reserve_mib = bytes / (1024 * 1024),
                "the database's file system has no room for the store's space reserve"
            );
        }
        reserve
    }

    /// The ballast file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The reserve's size in bytes; `0` when it is off.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the ballast holds its blocks now (always `false` when the
    /// reserve is off).
    pub fn in_place(&self) -> bool {
        self.in_place.load(Ordering::Relaxed)
    }

    /// Bytes free on the database's file system for unprivileged writers,
    /// besides the ballast: a `statvfs`, reused for a second. `None` when
    /// the file system cannot be asked.
    pub fn free_bytes(&self) -> Option<u64> {
        let mut reading = self.reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, free)) = *reading
            && at.elapsed() < FRESH_FOR
        {
            return Some(free);
        }
        let free = identity::free_bytes(&self.database)?;
        *reading = Some((Instant::now(), free));
        Some(free)
    }

    /// A fresh reading, for the writer's decisions.
    fn free_bytes_now(&self) -> Option<u64> {
        let free = identity::free_bytes(&self.database)?;
        *self.reading.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), free));
        Some(free)
    }

    /// Why the database's file system is below the store's reserve, if it
    /// is: less is free than the reserve (besides the ballast), or the
    /// ballast was given up to let commits go on. While it is, `/readyz`
    /// answers not ready and tools that write files should refuse to run,
    /// so that they cannot take the room the store needs. `None` when the
    /// reserve is off. Cheap: a `statvfs` at most once a second.
    pub fn low_on_space(&self) -> Option<String> {
        if self.bytes == 0 {
            return None;
        }
        let free = self.free_bytes();
        let mib = |bytes: u64| bytes / (1024 * 1024);
        if !self.in_place() {
            return Some(format!(
                "the store's space reserve ({} MiB beside {}) is used up or could not be made: its file system has {} MiB free",
                mib(self.bytes),
                self.database.display(),
                free.map_or_else(|| "unknown".to_owned(), |free| mib(free).to_string()),
            ));
        }
        match free {
            Some(free) if free < self.bytes => Some(format!(
                "the file system holding {} has {} MiB free, below the store's reserve of {} MiB",
                self.database.display(),
                mib(free),
                mib(self.bytes)
            )),
            _ => None,
        }
    }

    /// Gives the ballast's blocks back, when the file system is short of
    /// space (less free than the reserve): a commit that met a full disk
    /// can then go on. Returns whether it made room.
    pub(super) fn release_for_commit(&self) -> bool {
        if !self.in_place() || self.free_bytes_now().is_some_and(|free| free >= self.bytes) {
            // Nothing to give, or the disk is not what is full (a size cap).
            return false;
        }
        let released = self.release();
        if released {
            tracing::warn!(
                path = %self.path.display(),
                reserve_mib = self.bytes / (1024 * 1024),
                "the database's file system is full: the store's space reserve was released so that commits go on"
            );
        }
        released
    }

    /// Allocates a released ballast again once the file system has room for
    /// it and the reserve besides (so that restoring it does not at once
    /// leave the store short). At most once a second; for the writer thread.
    pub(super) fn restore(&self) {
        if self.bytes == 0 || self.in_place() {
            return;
        }
        {
            let mut last = self
                .last_restore
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < RESTORE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        if self
            .free_bytes_now()
            .is_some_and(|free| free >= self.bytes.saturating_mul(2))
            && self.allocate()
        {
            tracing::info!(path = %self.path.display(), "the store's space reserve is in place again");
            self.free_bytes_now();
        }
    }

    /// Truncates the ballast to nothing. Returns whether it held blocks.
    fn release(&self) -> bool {
        let file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(file) = file.as_ref() else {
            return false;
        };
        if let Err(error) = file.set_len(0) {
            tracing::warn!(%error, path = %self.path.display(), "cannot release the store's space reserve");
            return false;
        }
        self.in_place.swap(false, Ordering::Relaxed)
    }

    /// Gives the ballast all its blocks: `fallocate`, or zeros written out
    /// where the file system does not support it. On failure (no room) the
    /// ballast is truncated again, so a half-made reserve holds no space.
    fn allocate(&self) -> bool {
        let file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(file) = file.as_ref() else {
            return false;
        };
        let allocated = match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, self.bytes) {
            Ok(()) => Ok(()),
            Err(rustix::io::Errno::OPNOTSUPP) => write_zeros(file, self.bytes),
            Err(error) => Err(std::io::Error::from(error)),
        };
        match allocated {
            Ok(()) => {
                self.in_place.store(true, Ordering::Relaxed);
                true
            }
            Err(error) => {
                tracing::debug!(%error, path = %self.path.display(), "cannot allocate the store's space reserve");
                let _ = file.set_len(0);
                self.in_place.store(false, Ordering::Relaxed);
                false
            }
        }
    }
}

/// Writes `bytes` zeros at the start of `file` and syncs it.
fn write_zeros(mut file: &File, bytes: u64) -> std::io::Result<()> {
    use std::io::Seek as _;
    file.seek(std::io::SeekFrom::Start(0))?;
    let block = vec![0u8; 1024 * 1024];
    let mut left = bytes;
    while left > 0 {
        let take = usize::try_from(left.min(block.len() as u64)).unwrap_or(block.len());
        file.write_all(&block[..take])?;
        left -= take as u64;
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ballast is allocated, released only when the disk is short, and
    /// a reserve of 0 is off.
    #[test]
    fn the_ballast_is_allocated_and_the_reserve_reported() {
        let dir = tempfile::tempdir().expect("dir");
        let database = dir.path().join("keel.sqlite3");
        let reserve = SpaceReserve::open(&database, 1024 * 1024);
        assert!(reserve.in_place());
        let metadata = std::fs::metadata(reserve.path()).expect("ballast");
        assert_eq!(metadata.len(), 1024 * 1024);
        {
            use std::os::unix::fs::PermissionsExt as _;
            assert_eq!(metadata.permissions().mode() & 0o777, 0o600);
        }
        // This disk has far more than a MiB free: nothing is released.
        assert!(!reserve.release_for_commit());
        assert_eq!(reserve.low_on_space(), None);
        assert!(reserve.release());
        assert!(reserve.low_on_space().is_some_and(|why| why.contains("used up")));
        reserve.restore();
        assert!(reserve.in_place());
        assert_eq!(reserve.low_on_space(), None);

        let off = SpaceReserve::open(&dir.path().join("other.sqlite3"), 0);
        assert!(!off.in_place() && off.low_on_space().is_none());
        assert!(!off.path().exists());
        // A store without a reserve leaves another's ballast alone.
        let beside = SpaceReserve::open(&database, 0);
        assert!(!beside.release_for_commit() && !beside.release());
        assert_eq!(std::fs::metadata(beside.path()).expect("ballast").len(), 1024 * 1024);
    }
}
