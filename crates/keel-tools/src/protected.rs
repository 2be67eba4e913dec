//! The registry of Keel's protected files: its database (with the SQLite
//! journal, WAL and shared-memory files and the server's lock beside it),
//! its configuration and the server's token file.
//!
//! Two parts of Keel use it. The `shell` tool's launcher covers every
//! registered path in a command's mount namespace (see
//! [`super::workspace::sandbox`]). The file tools, which run in Keel's own
//! process, refuse them (see `workspace/paths.rs`): by *identity*, the
//! device and inode of what they open, so a hard link, a bind mount or any
//! other path to a protected file is refused too; and by *location*, the
//! device and inode of the directory and the name in it, so a protected file
//! that does not exist yet (a `-wal` about to be created, a lock no server
//! has taken yet) cannot be created, and a protected file can never be
//! replaced or renamed over.
//!
//! A file's identity changes when it is replaced (SQLite deletes and
//! recreates its WAL and journal): [`ProtectedSet::current`] looks at every
//! path again when a tool call starts. Identities a path had before are not
//! kept: once a file is gone its inode may be reused by any new file, which
//! would then be refused for nothing; and a hard link to a WAL that has since
//! been removed can be made only by a process that could already read it
//! (the sandbox covers the WAL, and no file tool makes links).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A file's identity: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    /// The device (`st_dev`).
    pub dev: u64,
    /// The inode (`st_ino`).
    pub ino: u64,
}

impl FileId {
    /// The identity of what `metadata` describes.
    pub fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
        }
    }

    /// The identity of what `metadata` (from a `cap-std` handle) describes.
    pub fn of_cap(metadata: &cap_std::fs::Metadata) -> Self {
        use cap_std::fs::MetadataExt as _;
        Self {
            dev: metadata.dev(),
            ino: metadata.ino(),
        }
    }
}

/// The files of Keel's own that neither a sandboxed command nor a file tool
/// may read or change (see [`protect`]).
static PROTECTED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Marks `path` (a file or directory of Keel's: its database, token file,
/// configuration) as one no sandboxed command may read or change and no file
/// tool may open, create, replace or list. Process-wide, because these are
/// the process's own secrets, whichever session runs. A path that does not
/// exist yet is protected where it will appear.
pub fn protect(path: &Path) {
    let path = normalize(path);
    let mut registry = PROTECTED.lock().unwrap_or_else(|poison| poison.into_inner());
    if !registry.contains(&path) {
        registry.push(path);
    }
}

/// Marks every path of `paths` with [`protect`]: the files one thing of
/// Keel's is made of (a SQLite database and the files beside it, which the
/// store names), whether or not they exist yet.
pub fn protect_all(paths: impl IntoIterator<Item = PathBuf>) {
    for path in paths {
        protect(&path);
    }
}

/// The paths marked by [`protect`].
pub fn protected_paths() -> Vec<PathBuf> {
    let registry = PROTECTED.lock().unwrap_or_else(|poison| poison.into_inner());
    registry.clone()
}

/// `path` made absolute, with its directory canonical (and the file itself
/// when it exists), so that every spelling of it is one entry and its
/// location can be compared with a directory handle's.
fn normalize(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    if let Ok(real) = std::fs::canonicalize(&absolute) {
        return real;
    }
    match (absolute.parent(), absolute.file_name()) {
        (Some(parent), Some(name)) => std::fs::canonicalize(parent).map_or(absolute.clone(), |real| real.join(name)),
        _ => absolute,
    }
}

/// What is protected at one moment, in the terms the file tools compare:
/// identities of files, and (directory, name) locations.
#[derive(Debug, Clone, Default)]
pub struct ProtectedSet {
    /// The identity of every protected path that exists.
    files: HashSet<FileId>,
    /// Where each protected path is: its directory's identity and its name.
    locations: HashSet<(FileId, OsString)>,
    /// The paths, for [`ProtectedSet::held_by`].
    paths: Vec<PathBuf>,
}

impl ProtectedSet {
    /// The registry as it is now: every path looked at again, so a file
    /// that appeared or was replaced since it was registered is covered.
    pub fn current() -> Self {
        let paths = protected_paths();
        let mut set = Self::default();
        for path in &paths {
            if let Ok(metadata) = std::fs::symlink_metadata(path) {
                set.files.insert(FileId::of(&metadata));
            }
            if let (Some(parent), Some(name)) = (path.parent(), path.file_name())
                && let Ok(metadata) = std::fs::metadata(parent)
            {
                set.locations.insert((FileId::of(&metadata), name.to_os_string()));
            }
        }
        set.paths = paths;
        set
    }

    /// Whether nothing is protected (a library user that registered
    /// nothing): the tools then skip their checks.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Whether `id` is one of the protected files.
    pub fn is_file(&self, id: FileId) -> bool {
        self.files.contains(&id)
    }

    /// Whether `name` in the directory `dir` is where a protected file is
    /// or will be.
    pub fn is_location(&self, dir: FileId, name: &OsStr) -> bool {
        !self.locations.is_empty() && self.locations.contains(&(dir, name.to_os_string()))
    }

    /// A protected path that lies inside the directory `dir` (at any depth,
    /// or `dir` itself), compared by the identity of each of the path's
    /// ancestors, so another spelling of `dir` is caught too.
    pub fn held_by(&self, dir: FileId) -> Option<&Path> {
        self.paths.iter().map(PathBuf::as_path).find(|path| {
            path.ancestors()
                .any(|ancestor| std::fs::symlink_metadata(ancestor).is_ok_and(|metadata| FileId::of(&metadata) == dir))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn protect_database(path: &Path) {
        protect_all(keel_store::sqlite::database_files(path));
    }

    fn id(path: &Path) -> FileId {
        FileId::of(&std::fs::symlink_metadata(path).unwrap())
    }

    #[test]
    fn paths_are_absolute_and_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("keel.sqlite3");
        std::fs::write(&database, "").unwrap();
        protect_database(&database);
        protect_database(&database);
        let protected = protected_paths();
        let real = std::fs::canonicalize(&database).unwrap();
        assert_eq!(protected.iter().filter(|path| **path == real).count(), 1);
        for suffix in ["-wal", "-shm", "-journal", "-serve.lock"] {
            let sidecar = format!("{}{suffix}", real.display());
            assert!(
                protected.iter().any(|path| path.as_os_str() == sidecar.as_str()),
                "{suffix}: {protected:?}"
            );
        }
        assert!(protected.iter().all(|path| path.is_absolute()));
    }

    #[test]
    fn files_are_known_by_identity_and_missing_ones_by_location() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("state.sqlite3");
        std::fs::write(&database, "data").unwrap();
        let link = dir.path().join("innocent");
        std::fs::hard_link(&database, &link).unwrap();
        protect_database(&database);
        let set = ProtectedSet::current();
        assert!(set.is_file(id(&database)));
        assert!(set.is_file(id(&link)), "a hard link is the same file");
        let other = dir.path().join("other");
        std::fs::write(&other, "").unwrap();
        assert!(!set.is_file(id(&other)));
        // The WAL does not exist yet: its place is protected all the same.
        let real_dir = id(dir.path());
        assert!(set.is_location(real_dir, OsStr::new("state.sqlite3-wal")));
        assert!(set.is_location(real_dir, OsStr::new("state.sqlite3-serve.lock")));
        assert!(!set.is_location(real_dir, OsStr::new("other")));
    }

    #[test]
    fn a_file_that_appears_or_is_replaced_later_is_known_by_its_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("db.sqlite3");
        std::fs::write(&database, "").unwrap();
        protect_database(&database);
        let wal = dir.path().join("db.sqlite3-wal");
        std::fs::write(&wal, "first").unwrap();
        let link = dir.path().join("wal-link");
        std::fs::hard_link(&wal, &link).unwrap();
        assert!(ProtectedSet::current().is_file(id(&link)));
        // SQLite removes the WAL and makes a new one.
        std::fs::remove_file(&wal).unwrap();
        std::fs::remove_file(&link).unwrap();
        std::fs::write(&wal, "second").unwrap();
        assert!(ProtectedSet::current().is_file(id(&wal)));
    }

    #[test]
    fn a_directory_holding_a_protected_file_is_found_by_identity() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("deep")).unwrap();
        let token = data.join("deep/token");
        std::fs::write(&token, "secret").unwrap();
        protect(&token);
        let set = ProtectedSet::current();
        assert_eq!(
            set.held_by(id(&data)),
            Some(std::fs::canonicalize(&token).unwrap().as_path())
        );
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        assert_eq!(set.held_by(id(&elsewhere)), None);
    }
}
