//! Path confinement: every path a model gives is resolved inside the
//! session's workspace, through directory handles, or refused.
//!
//! A path is taken relative to the workspace root (an absolute path is
//! accepted when it names something inside the workspace); `.` and `..` in
//! it are applied lexically, and climbing above the root is refused.
//! [`Workspace::locate`] then walks the remaining components one at a time
//! from an open handle on the root: each directory is opened relative to
//! the handle of its parent without following a symbolic link
//! (`openat(O_NOFOLLOW)` via `cap-std`, which adds `RESOLVE_BENEATH` where
//! the kernel has `openat2`). A symbolic link met on the way is read through
//! its directory's handle and its target walked the same way: a relative
//! target from the directory holding the link, an absolute one (or a `..`
//! above the root) lexically along the root's own ancestors until it comes
//! back to the root, whose handle is used again. A target that leaves that
//! path leads outside the workspace and is refused; nothing outside is ever
//! opened. Components that do not exist yet (a file about to be written, its
//! missing parent directories) are kept as names below the deepest existing
//! directory.
//!
//! The result, a [`Location`], holds the handle of the directory the target
//! lives in and the target's name there; the tools open, create, replace
//! and list through that handle, with `O_NOFOLLOW` on the last component.
//!
//! # Guarantee (time of check, time of use)
//!
//! There is no separate check: the walk that finds a path is the one whose
//! handles are used. A process that swaps a directory of the workspace for
//! a symbolic link while a tool runs (even a loop of
//! `renameat2(RENAME_EXCHANGE)`) can make a call fail, or act on the
//! directory that was there when it was opened, but cannot make a call
//! read, list, create, replace or rename anything through a link that
//! leads out of the workspace. Not covered: a directory the walk had
//! already opened being moved out of the workspace by such a process (the
//! call then acts inside that directory, wherever it now is; moving it
//! needs write access outside the workspace, which the `shell` tool's
//! sandbox, where enforced, does not give). The workspace root itself: a
//! workspace Keel created under a workspace root (a server session's, see
//! `created.rs`) is opened from its parent without following a link and
//! must have the identity Keel recorded, so one swapped for a link or for
//! another directory is refused; any other workspace (`keel run`'s, the
//! operator's choice) is opened by its canonical path.
//!
//! # Keel's protected files
//!
//! Keel's database (and its WAL, journal, shared memory and lock), its
//! configuration and the server's token (see `tools/protected.rs`) are
//! refused to every file tool: by location (the directory's identity and
//! the name, so a `-wal` about to be created is covered) and by the
//! identity of what is opened (so a hard link or another path to one is
//! refused too). Listings and searches leave them out. A write never
//! replaces or renames over one: the check is on the directory handle the
//! rename goes through, and a rename over a hard link replaces the link,
//! never the protected file.
//!
//! Links that stay inside the workspace are followed, as before, including
//! absolute ones and ones that climb out along the root's own path and come
//! back (`../ws/a`); a target that passes through anything else outside is
//! refused, even if a link there would lead back in, since following it
//! would mean resolving paths outside.

use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Component, Path, PathBuf};

use cap_fs_ext::DirExt as _;
use cap_std::fs::{Dir, File, Metadata};

use super::created::{check_identity, marker_of};
use crate::ToolError;
use crate::protected::{FileId, ProtectedSet};

mod links;

use self::links::{MAX_SYMLINKS, PendingComponent, push_target, resolve_real};

/// How often one component is looked at again when it was a directory to
/// `lstat` but not to the `open` just before (something is swapping it).
const MAX_RETRIES: usize = 40;

/// A session's workspace directory: its canonical path and an open handle
/// every other path is reached through.
#[derive(Debug)]
pub struct Workspace {
    /// The real (canonical) root; every resolved path starts with it.
    root: PathBuf,
    /// The root as the runtime gave it (absolute, not canonical), so an
    /// absolute path written in those terms is accepted too.
    given: PathBuf,
    /// The root, open.
    dir: Dir,
    /// Keel's protected files as they were when the call started.
    protected: ProtectedSet,
}

/// Where a model-given path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The real location, with every symbolic link resolved; inside the
    /// workspace.
    pub path: PathBuf,
    /// Whether something exists there now.
    pub exists: bool,
}

/// Where a model-given path leads, with the handle to reach it: the tools
/// act through [`Location`]'s methods, never through [`Location::path`].
#[derive(Debug)]
pub(super) struct Location {
    /// The real location, for showing (see [`Workspace::display`]).
    pub(super) path: PathBuf,
    /// Whether something existed there when it was looked up.
    pub(super) exists: bool,
    /// The deepest directory of the walk: the one holding the target.
    dir: Dir,
    /// The target below `dir`: no name when it is `dir` itself, its name
    /// when it exists, and the missing directories then its name when it
    /// does not.
    rest: Vec<OsString>,
}

/// Why a walk stopped.
enum WalkError {
    /// A symbolic link's target left the workspace at `through` (a lexical
    /// path), with `pending` still to walk.
    Escaped {
        through: PathBuf,
        pending: Vec<PendingComponent>,
    },
    /// The walk met one of Keel's protected directories.
    Protected,
    /// The file system said no.
    Io(io::Error),
}

impl From<io::Error> for WalkError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

impl Workspace {
    /// The workspace at `dir`, which must be an existing directory. When
    /// `dir` is a workspace Keel created under a workspace root (a server
    /// session's, see `created.rs`), it is opened without following a link
    /// and must be the directory Keel recorded: a workspace swapped for a
    /// link or another directory is refused, not followed.
    pub fn new(dir: &Path) -> Result<Self, ToolError> {
        let unusable =
            |error: io::Error| ToolError::Failed(format!("the workspace {} is not usable: {error}", dir.display()));
        let given = std::path::absolute(dir).map_err(unusable)?;
        let protected = ProtectedSet::current();
        if let Some((parent, name, marker)) = marker_of(&given).map_err(unusable)? {
            let handle = parent.open_dir_nofollow(&name).map_err(|error| {
                ToolError::Failed(format!(
                    "the workspace {} is not the directory Keel created for this session (it cannot be opened \
                     without following a link: {error}); the file tools refuse to act",
                    dir.display()
                ))
            })?;
            check_identity(&handle, marker, &given)
                .map_err(|error| ToolError::Failed(format!("{error}; the file tools refuse to act")))?;
            let parent_path = given.parent().unwrap_or(&given);
            let root = std::fs::canonicalize(parent_path).map_err(unusable)?.join(&name);
            return Ok(Self {
                root,
                given,
                dir: handle,
                protected,
            });
        }
        let root = std::fs::canonicalize(dir).map_err(unusable)?;
        if !root.is_dir() {
            return Err(ToolError::Failed(format!(
                "the workspace {} is not a directory",
                dir.display()
            )));
        }
        let handle = Dir::open_ambient_dir(&root, cap_std::ambient_authority()).map_err(unusable)?;
        Ok(Self {
            root,
            given,
            dir: handle,
            protected,
        })
    }

    /// Refuses `location` when it is one of Keel's protected files: by
    /// location (its directory and name, whether or not it exists) and, if
    /// something is there, by identity (a hard link or another path to a
    /// protected file). `path` is the model's, for the message.
    pub(super) fn refuse_protected(&self, location: &Location, path: &str) -> Result<(), ToolError> {
        if self.protected.is_empty() {
            return Ok(());
        }
        let hit = match location.rest.as_slice() {
            [] => dir_identity(&location.dir).is_some_and(|id| self.protected.is_file(id)),
            [name] => {
                dir_identity(&location.dir).is_some_and(|dir| self.protected.is_location(dir, name))
                    || location
                        .dir
                        .symlink_metadata(name)
                        .is_ok_and(|metadata| self.protected.is_file(FileId::of_cap(&metadata)))
            }
            // Below a missing directory: nothing protected can be there.
            _ => false,
        };
        if hit { Err(protected_file(path)) } else { Ok(()) }
    }

    /// Refuses the open `file` when it is one of Keel's protected files, by
    /// the identity of the handle: what was opened, whatever path led to it.
    pub(super) fn refuse_protected_file(&self, file: &File, path: &str) -> Result<(), ToolError> {
        if self.protected.is_empty() {
            return Ok(());
        }
        match file.metadata() {
            Ok(metadata) if self.protected.is_file(FileId::of_cap(&metadata)) => Err(protected_file(path)),
            Ok(_) => Ok(()),
            Err(error) => Err(ToolError::Failed(format!("cannot read '{path}': {error}"))),
        }
    }

    /// Whether the entry `name` of `dir` (whose identity is `dir_id`, see
    /// [`dir_identity`]) is one of Keel's protected files, which listings
    /// and searches leave out.
    pub(super) fn hides(&self, dir: &Dir, dir_id: Option<FileId>, name: &OsStr) -> bool {
        if self.protected.is_empty() {
            return false;
        }
        dir_id.is_some_and(|id| self.protected.is_location(id, name))
            || dir
                .symlink_metadata(name)
                .is_ok_and(|metadata| self.protected.is_file(FileId::of_cap(&metadata)))
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `path` (as the model wrote it) to its real location inside
    /// the workspace. The empty path and `.` are the root. What it returns
    /// is a report; the tools use `Workspace::locate`, whose handles keep
    /// the answer true while they act.
    pub fn resolve(&self, path: &str) -> Result<Resolved, ToolError> {
        let location = self.locate(path)?;
        Ok(Resolved {
            path: location.path,
            exists: location.exists,
        })
    }

    /// Walks `path` (as the model wrote it) from the root's handle, as the
    /// module documentation describes, and returns where it leads, with
    /// the handle of the directory holding it.
    pub(super) fn locate(&self, path: &str) -> Result<Location, ToolError> {
        let components = self.relative_components(path)?;
        match self.walk(components) {
            Ok(location) => Ok(location),
            Err(WalkError::Io(error)) => Err(ToolError::Failed(format!("cannot resolve '{path}': {error}"))),
            Err(WalkError::Protected) => Err(protected_file(path)),
            Err(WalkError::Escaped { through, pending }) => {
                // Only for the message: where the link would have led, found
                // by path; nothing is opened, and a race can only make the
                // message less precise.
                let message = match resolve_real(through.clone(), pending) {
                    Ok(target) if !target.starts_with(&self.root) => format!(
                        "'{path}' leads outside the workspace through a symbolic link: it resolves to {}, which is \
                         not under the workspace {}",
                        target.display(),
                        self.root.display()
                    ),
                    _ => format!(
                        "'{path}' leads outside the workspace through a symbolic link: it passes through {}, which \
                         is not under the workspace {}",
                        through.display(),
                        self.root.display()
                    ),
                };
                Err(ToolError::Failed(message))
            }
        }
    }

    /// Opens the directory at `relative` (a real path below the root, as in
    /// a [`Location`]'s path) through the root's handle, following no link.
    pub(super) fn open_real_dir(&self, relative: &Path) -> io::Result<Dir> {
        let mut dir = self.dir.try_clone()?;
        for component in relative.components() {
            match component {
                Component::Normal(name) => dir = dir.open_dir_nofollow(name)?,
                Component::CurDir => {}
                _ => return Err(io::Error::other("not a path below the workspace root")),
            }
        }
        Ok(dir)
    }

    /// `real` (a resolved path) relative to the root, for showing to the
    /// model: `.` for the root itself.
    pub fn display(&self, real: &Path) -> String {
        match real.strip_prefix(&self.root) {
            Ok(relative) if relative.as_os_str().is_empty() => ".".into(),
            Ok(relative) => relative.display().to_string(),
            Err(_) => real.display().to_string(),
        }
    }

    /// The components of `path` below the root, with `.` and `..` applied
    /// lexically; refuses anything that climbs above the root or is an
    /// absolute path elsewhere.
    fn relative_components(&self, path: &str) -> Result<Vec<OsString>, ToolError> {
        let raw = Path::new(path);
        let below_root: &Path = if raw.is_absolute() {
            if let Ok(rest) = raw.strip_prefix(&self.root) {
                rest
            } else if let Ok(rest) = raw.strip_prefix(&self.given) {
                rest
            } else {
                return Err(ToolError::Failed(format!(
                    "'{path}' is outside the workspace {}; use a path inside it (relative paths start at the workspace root)",
                    self.root.display()
                )));
            }
        } else {
            raw
        };
        let mut components = Vec::new();
        for component in below_root.components() {
            match component {
                Component::CurDir => {}
                Component::Normal(name) => components.push(name.to_os_string()),
                Component::ParentDir => {
                    if components.pop().is_none() {
                        return Err(ToolError::Failed(format!(
                            "'{path}' is outside the workspace: '..' climbs above the workspace root; \
                             use a path inside the workspace (relative paths start at its root)"
                        )));
                    }
                }
                // An absolute remainder cannot happen after strip_prefix, and
                // prefixes exist only on Windows; both would escape.
                Component::RootDir | Component::Prefix(_) => {
                    return Err(ToolError::Failed(format!("'{path}' is outside the workspace")));
                }
            }
        }
        Ok(components)
    }

    /// Walks `components` from the root's handle, one directory handle at a
    /// time, following symbolic links itself (see the module documentation).
    fn walk(&self, components: Vec<OsString>) -> Result<Location, WalkError> {
        // Pending components, next one last (so links can push their targets).
        let mut pending: Vec<PendingComponent> = components.into_iter().rev().map(PendingComponent::Name).collect();
        // The directories entered below the root, each with its name.
        let mut stack: Vec<(Dir, OsString)> = Vec::new();
        // While a link's target is above the root: where it is, lexically.
        let mut above: Option<PathBuf> = None;
        // Names below the deepest existing directory, once one is missing.
        let mut missing: Vec<OsString> = Vec::new();
        // The target's name in the deepest directory, when it exists.
        let mut target: Option<OsString> = None;
        let (mut links, mut retries) = (0, 0);
        while let Some(component) = pending.pop() {
            if let Some(mut outside) = above.take() {
                match component {
                    PendingComponent::Root => outside = PathBuf::from("/"),
                    PendingComponent::Parent => {
                        outside.pop();
                    }
                    PendingComponent::Name(name) => outside.push(name),
                }
                above = self.settle(outside, &mut stack, &mut pending)?;
                continue;
            }
            if !missing.is_empty() {
                match component {
                    PendingComponent::Name(name) => missing.push(name),
                    // `..` or `/` after a missing directory: the kernel
                    // would not get past the missing one either.
                    PendingComponent::Root | PendingComponent::Parent => {
                        return Err(io::Error::from(io::ErrorKind::NotFound).into());
                    }
                }
                continue;
            }
            match component {
                PendingComponent::Root => {
                    above = self.settle(PathBuf::from("/"), &mut stack, &mut pending)?;
                }
                PendingComponent::Parent => {
                    if stack.pop().is_none() {
                        let parent = self.root.parent().unwrap_or(&self.root).to_path_buf();
                        above = self.settle(parent, &mut stack, &mut pending)?;
                    }
                }
                PendingComponent::Name(name) => {
                    let current = stack.last().map_or(&self.dir, |(dir, _)| dir);
                    // The last component is only looked at, not opened: the
                    // tool opens it (without following links) as it needs.
                    let opened = if pending.is_empty() {
                        Err(None)
                    } else {
                        current.open_dir_nofollow(&name).map_err(Some)
                    };
                    let error = match opened {
                        Ok(dir) => {
                            // A protected directory is not entered.
                            if dir_identity(&dir).is_some_and(|id| self.protected.is_file(id)) {
                                return Err(WalkError::Protected);
                            }
                            stack.push((dir, name));
                            continue;
                        }
                        Err(error) => error,
                    };
                    match current.symlink_metadata(&name) {
                        Ok(metadata) if metadata.file_type().is_symlink() => {
                            links += 1;
                            if links > MAX_SYMLINKS {
                                return Err(io::Error::other("too many levels of symbolic links").into());
                            }
                            let link = current.read_link_contents(&name)?;
                            push_target(&link, &mut pending);
                        }
                        Ok(metadata) if error.is_some() && metadata.is_dir() => {
                            // A directory now, not when it was opened: look again.
                            retries += 1;
                            if retries > MAX_RETRIES {
                                return Err(io::Error::other("the path kept changing while it was resolved").into());
                            }
                            pending.push(PendingComponent::Name(name));
                        }
                        Ok(_) => match error {
                            // Not a directory, yet more components follow.
                            Some(error) => return Err(error.into()),
                            None => target = Some(name),
                        },
                        Err(lookup) if lookup.kind() == io::ErrorKind::NotFound => missing.push(name),
                        Err(lookup) => return Err(error.unwrap_or(lookup).into()),
                    }
                }
            }
        }
        if let Some(through) = above {
            return Err(WalkError::Escaped {
                through,
                pending: Vec::new(),
            });
        }
        let mut path = self.root.clone();
        path.extend(stack.iter().map(|(_, name)| name));
        let exists = missing.is_empty();
        let rest: Vec<OsString> = target.into_iter().chain(missing).collect();
        path.extend(&rest);
        let dir = match stack.pop() {
            Some((dir, _)) => dir,
            None => self.dir.try_clone()?,
        };
        Ok(Location {
            path,
            exists,
            dir,
            rest,
        })
    }

    /// Where a link's target is once it has climbed to `outside`: back at
    /// the root (its handle is used again: `None`), still on the root's own
    /// path above it (`Some`), or elsewhere, which is an escape.
    fn settle(
        &self,
        outside: PathBuf,
        stack: &mut Vec<(Dir, OsString)>,
        pending: &mut Vec<PendingComponent>,
    ) -> Result<Option<PathBuf>, WalkError> {
        stack.clear();
        if outside == self.root || outside == self.given {
            Ok(None)
        } else if self.root.starts_with(&outside) || self.given.starts_with(&outside) {
            Ok(Some(outside))
        } else {
            Err(WalkError::Escaped {
                through: outside,
                pending: std::mem::take(pending),
            })
        }
    }
}

impl Location {
    /// The target's own metadata, not following a link (a link there now
    /// means something swapped it since the walk).
    pub(super) fn metadata(&self) -> io::Result<Metadata> {
        match self.rest.as_slice() {
            [] => self.dir.dir_metadata(),
            [name] => self.dir.symlink_metadata(name),
            _ => Err(io::ErrorKind::NotFound.into()),
        }
    }

    /// Opens the target for reading (see [`open_file_in`]).
    pub(super) fn open_file(&self) -> io::Result<File> {
        match self.rest.as_slice() {
            [name] => super::open::open_file_in(&self.dir, name),
            [] => Err(io::ErrorKind::IsADirectory.into()),
            _ => Err(io::ErrorKind::NotFound.into()),
        }
    }

    /// Opens the target as a directory, following no link.
    pub(super) fn open_dir(&self) -> io::Result<Dir> {
        match self.rest.as_slice() {
            [] => self.dir.try_clone(),
            [name] => self.dir.open_dir_nofollow(name),
            _ => Err(io::ErrorKind::NotFound.into()),
        }
    }

    /// The directory to create the target in and its name there, creating
    /// the missing directories on the way through their parents' handles.
    pub(super) fn parent_for_write(&self) -> io::Result<(Dir, &OsStr)> {
        let Some((name, directories)) = self.rest.split_last() else {
            return Err(io::ErrorKind::IsADirectory.into());
        };
        let mut dir = self.dir.try_clone()?;
        for directory in directories {
            match dir.create_dir(directory) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(error),
            }
            // Created just now or by someone else meanwhile: either way it
            // must be a directory, not a link.
            dir = dir.open_dir_nofollow(directory)?;
        }
        Ok((dir, name))
    }

    /// The directory holding the target, and the target's name in it
    /// (`None` when the target is that directory).
    pub(super) fn parent(&self) -> (&Dir, Option<&OsStr>) {
        match self.rest.as_slice() {
            [name] => (&self.dir, Some(name.as_os_str())),
            _ => (&self.dir, None),
        }
    }
}

/// The identity of the open directory `dir`, if it can be read.
pub(super) fn dir_identity(dir: &Dir) -> Option<FileId> {
    dir.dir_metadata().ok().map(|metadata| FileId::of_cap(&metadata))
}

/// The refusal of a protected file: there is no way around it, no approval
/// included, so the message says so.
pub(super) fn protected_file(path: &str) -> ToolError {
    ToolError::Failed(format!(
        "'{path}' is one of Keel's protected files (its database, configuration, lock or token); the file tools \
         never read, list, create, replace or change it, whatever the approval"
    ))
}

#[cfg(test)]
mod tests;
