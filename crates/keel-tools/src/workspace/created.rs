//! The workspaces Keel created: a server session works in a directory Keel
//! made for it under the workspace root, never in one that was there before
//! nor through a link, and Keel removes only what it made.
//!
//! # The record
//!
//! Each workspace `<root>/<name>` has a marker `<root>/.keel-workspaces/<name>`
//! holding the directory's identity (device and inode) and whether Keel
//! created it (`mkdir`) or adopted it (a workspace of a session that existed
//! before markers, see below). The record lives beside the workspaces, not
//! inside one: a session's command can write inside its own workspace (and
//! another session's inside its own), so a marker there could be forged or
//! carried along by `mv`. The registry directory is outside every workspace,
//! is registered as one of Keel's protected paths (so the shell's sandbox
//! covers it and the file tools refuse it), and no session id names it (a
//! plain workspace name never starts with `.`). The session's stored context
//! would be as safe, but a fork or an adoption would then have to rewrite a
//! stored session; a file Keel alone writes keeps the record uniform.
//!
//! # The checks
//!
//! - Creating a session (or a fork) makes its workspace with `mkdir` through
//!   the root's handle: an existing directory, file or link of that name is refused
//!   ([`WorkspaceError::Exists`]), never adopted.
//! - Loading a stored session opens its workspace without following a link
//!   and compares it with the marker ([`WorkspaceError::Replaced`] when it
//!   differs); the file tools do the same at every call (`paths.rs`).
//! - Removing one requires a marker saying Keel created it, the same
//!   identity, and no protected file of Keel's inside; the contents go
//!   through handles that follow no link.
//!
//! # Sessions from before the markers
//!
//! A session already in the store whose workspace has no marker (made by an
//! older server, or by `keel run --new-session` on a database a server later
//! serves): a missing directory is created; an existing one is *adopted* only if it is a real directory (not
//! a link), owned by Keel's user, and holds none of Keel's protected files.
//! An adopted workspace is checked like a created one from then on, but is
//! never removed by Keel: it may be a directory the operator had before the
//! session (an old server adopted whatever the id named).

use std::ffi::{OsStr, OsString};
use std::io::{self, Read as _};
use std::path::{Path, PathBuf};

use cap_fs_ext::DirExt as _;
use cap_std::fs::{Dir, MetadataExt as _};
use serde::{Deserialize, Serialize};

use super::open::open_file_in;
use super::write::atomic_write;
use crate::protected::{FileId, ProtectedSet, protect};

/// The directory of markers, in the workspace root.
pub const REGISTRY_DIR: &str = ".keel-workspaces";

/// How a workspace came to be Keel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Keel made it with `mkdir` for its session.
    Created,
    /// It existed when a session from before the markers was loaded.
    Adopted,
}

/// The record of one workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The directory's device.
    pub dev: u64,
    /// The directory's inode.
    pub ino: u64,
    /// Whether Keel created or adopted it.
    pub origin: Origin,
}

impl Marker {
    fn id(&self) -> FileId {
        FileId {
            dev: self.dev,
            ino: self.ino,
        }
    }
}

/// Why a workspace cannot be used or removed.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A new session's workspace name is taken by something Keel did not
    /// create for it (a directory, file or link).
    #[error(
        "the workspace {} already exists and is not a directory Keel created for this session; choose another \
         id, or move it away",
        path.display()
    )]
    Exists {
        /// The workspace's path.
        path: PathBuf,
    },
    /// The workspace is not the directory Keel recorded (swapped, replaced
    /// by a link, or an existing directory that may not be adopted).
    #[error("the workspace {} is not the directory Keel created for this session: {why}", path.display())]
    Replaced {
        /// The workspace's path.
        path: PathBuf,
        /// What was found.
        why: String,
    },
    /// A delete that would remove what Keel did not create or its own files.
    #[error("the workspace {} was not removed: {why}", path.display())]
    NotRemovable {
        /// The workspace's path.
        path: PathBuf,
        /// Why not.
        why: String,
    },
    /// The file system failed.
    #[error("the workspace {}: {source}", path.display())]
    Io {
        /// The path concerned.
        path: PathBuf,
        /// What failed.
        #[source]
        source: io::Error,
    },
}

/// A workspace root, open, with its registry of markers.
#[derive(Debug)]
pub struct WorkspaceRoot {
    path: PathBuf,
    dir: Dir,
    registry: Dir,
}

impl WorkspaceRoot {
    /// Opens (creating it if needed) the workspace root `root` and its
    /// registry, registers the registry as one of Keel's protected paths,
    /// and the root as one whose sandboxed commands each see only their own
    /// workspace ([`crate::workspace::sandbox::keep_workspaces_apart`]).
    pub fn open(root: &Path) -> Result<Self, WorkspaceError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| WorkspaceError::Io { path, source }
        };
        std::fs::create_dir_all(root).map_err(io(root))?;
        let path = std::fs::canonicalize(root).map_err(io(root))?;
        let dir = Dir::open_ambient_dir(&path, cap_std::ambient_authority()).map_err(io(&path))?;
        let registry_path = path.join(REGISTRY_DIR);
        match dir.create_dir(REGISTRY_DIR) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(io(&registry_path)(error)),
        }
        let registry = dir.open_dir_nofollow(REGISTRY_DIR).map_err(io(&registry_path))?;
        // Only Keel reads it; nothing else needs to.
        let _ = std::fs::set_permissions(&registry_path, std::os::unix::fs::PermissionsExt::from_mode(0o700));
        protect(&registry_path);
        crate::workspace::sandbox::keep_workspaces_apart(&path);
        Ok(Self { path, dir, registry })
    }

    /// The canonical root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The workspace named `name` for a new session: made with `mkdir`, or
    /// [`WorkspaceError::Exists`] if anything has that name. Returns its
    /// path.
    pub fn create(&self, name: &OsStr) -> Result<PathBuf, WorkspaceError> {
        let path = self.child(name)?;
        match self.dir.create_dir(name) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => return Err(WorkspaceError::Exists { path }),
            Err(source) => return Err(WorkspaceError::Io { path, source }),
        }
        self.record(name, &path, Origin::Created)?;
        Ok(path)
    }

    /// The workspace of a stored session, checked against its marker, made
    /// if missing, or adopted under the conditions of the module
    /// documentation. Returns its path.
    pub fn open_existing(&self, name: &OsStr) -> Result<PathBuf, WorkspaceError> {
        let path = self.child(name)?;
        if let Some(marker) = self.marker(name, &path)? {
            return match self.dir.open_dir_nofollow(name) {
                Ok(dir) => {
                    check_identity(&dir, marker, &path)?;
                    Ok(path)
                }
                // Gone (removed by the operator): made again, empty.
                Err(error) if error.kind() == io::ErrorKind::NotFound => self.create(name),
                Err(error) => Err(replaced(&path, &error)),
            };
        }
        match self.dir.symlink_metadata(name) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => self.create(name),
            Err(source) => Err(WorkspaceError::Io { path, source }),
            Ok(metadata) if metadata.file_type().is_symlink() || !metadata.is_dir() => Err(WorkspaceError::Replaced {
                path,
                why: "it is a symbolic link or not a directory, and was not made by Keel".to_owned(),
            }),
            Ok(metadata) if metadata.uid() != rustix::process::geteuid().as_raw() => Err(WorkspaceError::Replaced {
                path,
                why: format!(
                    "it has no marker and belongs to uid {}, not Keel's user",
                    metadata.uid()
                ),
            }),
            Ok(_) => {
                let dir = self
                    .dir
                    .open_dir_nofollow(name)
                    .map_err(|error| replaced(&path, &error))?;
                let id = dir_id(&dir, &path)?;
                if let Some(held) = ProtectedSet::current().held_by(id) {
                    return Err(WorkspaceError::Replaced {
                        path,
                        why: format!("it has no marker and holds Keel's protected file {}", held.display()),
                    });
                }
                tracing::info!(workspace = %path.display(), "adopted the workspace of a session from before markers");
                self.write_marker(name, &path, id, Origin::Adopted)?;
                Ok(path)
            }
        }
    }

    /// Undoes [`WorkspaceRoot::create`] after the session could not be
    /// created: the directory goes if it is still the one made and empty.
    pub fn discard(&self, name: &OsStr) {
        let Ok(path) = self.child(name) else { return };
        if let Ok(Some(marker)) = self.marker(name, &path)
            && marker.origin == Origin::Created
            && let Ok(dir) = self.dir.open_dir_nofollow(name)
            && check_identity(&dir, marker, &path).is_ok()
            && dir.remove_open_dir().is_ok()
        {
            let _ = self.registry.remove_file(name);
        }
    }

    /// Checks that the workspace `name` may be removed, without removing
    /// anything: `Ok(None)` when there is nothing to remove.
    pub fn check_removable(&self, name: &OsStr) -> Result<Option<Dir>, WorkspaceError> {
        let path = self.child(name)?;
        let not_removable = |why: String| WorkspaceError::NotRemovable {
            path: path.clone(),
            why,
        };
        let marker = self.marker(name, &path)?;
        let dir = match self.dir.open_dir_nofollow(name) {
            Ok(dir) => dir,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => {
                return Err(not_removable(format!(
                    "it is not a directory Keel created (it is a symbolic link or another file: {error})"
                )));
            }
        };
        let Some(marker) = marker else {
            return Err(not_removable(
                "Keel has no record of creating it (remove it yourself if it is not needed)".to_owned(),
            ));
        };
        if marker.origin != Origin::Created {
            return Err(not_removable(
                "it existed before its session was given a marker, so Keel may not have created it (remove it \
                 yourself if it is not needed)"
                    .to_owned(),
            ));
        }
        check_identity(&dir, marker, &path).map_err(|error| not_removable(error.to_string()))?;
        if let Some(held) = ProtectedSet::current().held_by(marker.id()) {
            return Err(not_removable(format!(
                "it holds Keel's protected file {}",
                held.display()
            )));
        }
        Ok(Some(dir))
    }

    /// Removes the workspace `name` after [`WorkspaceRoot::check_removable`]
    /// (again, under the same conditions), contents first through handles
    /// that follow no link, and its marker.
    pub fn remove(&self, name: &OsStr) -> Result<(), WorkspaceError> {
        let path = self.child(name)?;
        if let Some(dir) = self.check_removable(name)? {
            dir.remove_open_dir_all().map_err(|source| WorkspaceError::Io {
                path: path.clone(),
                source,
            })?;
        }
        match self.registry.remove_file(name) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(WorkspaceError::Io { path, source }),
        }
    }

    /// `name`'s path, refusing anything but one plain component.
    fn child(&self, name: &OsStr) -> Result<PathBuf, WorkspaceError> {
        let plain = !name.is_empty()
            && name != REGISTRY_DIR
            && Path::new(name).components().count() == 1
            && matches!(
                Path::new(name).components().next(),
                Some(std::path::Component::Normal(_))
            );
        if !plain {
            return Err(WorkspaceError::Replaced {
                path: self.path.join(name),
                why: "a workspace is one plain name below the workspace root".to_owned(),
            });
        }
        Ok(self.path.join(name))
    }

    /// Records the directory `name` (just made, or adopted) with `origin`.
    fn record(&self, name: &OsStr, path: &Path, origin: Origin) -> Result<(), WorkspaceError> {
        let dir = self
            .dir
            .open_dir_nofollow(name)
            .map_err(|error| replaced(path, &error))?;
        let id = dir_id(&dir, path)?;
        self.write_marker(name, path, id, origin)
    }

    fn write_marker(&self, name: &OsStr, path: &Path, id: FileId, origin: Origin) -> Result<(), WorkspaceError> {
        let marker = Marker {
            dev: id.dev,
            ino: id.ino,
            origin,
        };
        let text = serde_json::to_vec(&marker).map_err(|error| WorkspaceError::Io {
            path: path.to_path_buf(),
            source: io::Error::other(error),
        })?;
        atomic_write(&self.registry, name, &text, 0o600).map_err(|source| WorkspaceError::Io {
            path: self.path.join(REGISTRY_DIR).join(name),
            source,
        })
    }

    fn marker(&self, name: &OsStr, path: &Path) -> Result<Option<Marker>, WorkspaceError> {
        read_marker(&self.registry, name).map_err(|source| WorkspaceError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// The marker of the workspace `name` in a registry; `None` when there is
/// none. A marker that does not parse is an error, never "no marker".
fn read_marker(registry: &Dir, name: &OsStr) -> io::Result<Option<Marker>> {
    let mut file = match open_file_in(registry, name) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut text = Vec::new();
    (&mut file).take(4096).read_to_end(&mut text)?;
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|error| io::Error::other(format!("its marker does not parse: {error}")))
}

/// The marker of the workspace at `workspace` (an absolute path), if its
/// parent is a workspace root that has one for it; for the file tools, which
/// get only the path.
pub(super) fn marker_of(workspace: &Path) -> io::Result<Option<(Dir, OsString, Marker)>> {
    let (Some(parent), Some(name)) = (workspace.parent(), workspace.file_name()) else {
        return Ok(None);
    };
    let parent = match Dir::open_ambient_dir(parent, cap_std::ambient_authority()) {
        Ok(dir) => dir,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let registry = match parent.open_dir_nofollow(REGISTRY_DIR) {
        Ok(dir) => dir,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    Ok(read_marker(&registry, name)?.map(|marker| (parent, name.to_os_string(), marker)))
}

/// The identity of the open directory `dir`.
fn dir_id(dir: &Dir, path: &Path) -> Result<FileId, WorkspaceError> {
    dir.dir_metadata()
        .map(|metadata| FileId::of_cap(&metadata))
        .map_err(|source| WorkspaceError::Io {
            path: path.to_path_buf(),
            source,
        })
}

/// Whether the open `dir` is the one `marker` records.
pub(super) fn check_identity(dir: &Dir, marker: Marker, path: &Path) -> Result<(), WorkspaceError> {
    if dir_id(dir, path)? == marker.id() {
        Ok(())
    } else {
        Err(WorkspaceError::Replaced {
            path: path.to_path_buf(),
            why: "another directory is in its place (it was moved or replaced)".to_owned(),
        })
    }
}

fn replaced(path: &Path, error: &io::Error) -> WorkspaceError {
    WorkspaceError::Replaced {
        path: path.to_path_buf(),
        why: format!("it cannot be opened as a directory without following a link ({error})"),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn name(text: &str) -> &OsStr {
        OsStr::new(text)
    }

    fn root() -> (tempfile::TempDir, WorkspaceRoot) {
        let dir = tempfile::tempdir().unwrap();
        let root = WorkspaceRoot::open(&dir.path().join("root")).unwrap();
        (dir, root)
    }

    #[test]
    fn a_new_workspace_is_made_never_adopted() {
        let (dir, root) = root();
        let made = root.create(name("a")).unwrap();
        assert!(made.is_dir());
        assert!(matches!(root.create(name("a")), Err(WorkspaceError::Exists { .. })));
        std::fs::create_dir(root.path().join("src")).unwrap();
        symlink(dir.path(), root.path().join("link")).unwrap();
        for taken in ["src", "link"] {
            assert!(
                matches!(root.create(name(taken)), Err(WorkspaceError::Exists { .. })),
                "{taken}"
            );
        }
        for bad in ["", "..", "a/b", REGISTRY_DIR] {
            assert!(root.create(name(bad)).is_err(), "{bad:?}");
        }
        // The registry itself is protected.
        assert!(crate::protected::protected_paths().contains(&root.path().join(REGISTRY_DIR)));
    }

    #[test]
    fn a_stored_sessions_workspace_must_be_the_one_recorded() {
        let (dir, root) = root();
        root.create(name("a")).unwrap();
        assert!(root.open_existing(name("a")).is_ok());
        std::fs::rename(root.path().join("a"), root.path().join("moved")).unwrap();
        symlink(dir.path(), root.path().join("a")).unwrap();
        assert!(matches!(
            root.open_existing(name("a")),
            Err(WorkspaceError::Replaced { .. })
        ));
        std::fs::remove_file(root.path().join("a")).unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        assert!(matches!(
            root.open_existing(name("a")),
            Err(WorkspaceError::Replaced { .. })
        ));
        // Removed by the operator: made again.
        std::fs::remove_dir(root.path().join("a")).unwrap();
        assert!(root.open_existing(name("a")).unwrap().is_dir());
    }

    #[test]
    fn a_workspace_from_before_markers_is_adopted_only_when_safe_and_never_removed() {
        let (dir, root) = root();
        std::fs::create_dir(root.path().join("old")).unwrap();
        std::fs::write(root.path().join("old/work"), "work").unwrap();
        assert!(root.open_existing(name("old")).is_ok());
        assert!(matches!(
            root.check_removable(name("old")),
            Err(WorkspaceError::NotRemovable { .. })
        ));
        assert!(root.remove(name("old")).is_err());
        assert!(root.path().join("old/work").exists());
        // One holding a protected file, or a link, is not adopted.
        std::fs::create_dir(root.path().join("data")).unwrap();
        let database = root.path().join("data/keel.sqlite3");
        std::fs::write(&database, "").unwrap();
        crate::protected::protect_all(keel_store::sqlite::database_files(&database));
        assert!(matches!(
            root.open_existing(name("data")),
            Err(WorkspaceError::Replaced { .. })
        ));
        symlink(dir.path(), root.path().join("linked")).unwrap();
        assert!(matches!(
            root.open_existing(name("linked")),
            Err(WorkspaceError::Replaced { .. })
        ));
        // A missing one is made.
        assert!(root.open_existing(name("fork")).unwrap().is_dir());
        assert!(root.check_removable(name("fork")).unwrap().is_some());
    }

    #[test]
    fn only_a_created_workspace_without_keels_files_is_removed() {
        let (dir, root) = root();
        root.create(name("a")).unwrap();
        std::fs::create_dir_all(root.path().join("a/sub")).unwrap();
        std::fs::write(dir.path().join("outside"), "keep").unwrap();
        symlink(dir.path().join("outside"), root.path().join("a/sub/link")).unwrap();
        root.remove(name("a")).unwrap();
        assert!(!root.path().join("a").exists());
        assert_eq!(std::fs::read_to_string(dir.path().join("outside")).unwrap(), "keep");
        assert!(root.check_removable(name("a")).unwrap().is_none());

        root.create(name("holds")).unwrap();
        let token = root.path().join("holds/token");
        std::fs::write(&token, "secret").unwrap();
        crate::protected::protect(&token);
        assert!(matches!(
            root.remove(name("holds")),
            Err(WorkspaceError::NotRemovable { .. })
        ));
        assert!(token.exists());

        // A failed creation leaves the id usable.
        root.create(name("failed")).unwrap();
        root.discard(name("failed"));
        assert!(root.create(name("failed")).is_ok());
    }
}
