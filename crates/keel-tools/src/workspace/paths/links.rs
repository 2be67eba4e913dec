//! Symbolic links as paths: the pending components of a resolution, a
//! link's target pushed onto them, and the by-path resolution used only to
//! word the message about a link that leads outside the workspace.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

/// How many symbolic links one resolution may follow, like the kernel's
/// `MAXSYMLINKS`; more is a loop.
pub(super) const MAX_SYMLINKS: usize = 40;

/// Puts a link's target on `pending`, its first component last.
pub(super) fn push_target(target: &Path, pending: &mut Vec<PendingComponent>) {
    for part in target.components().rev() {
        match part {
            Component::RootDir | Component::Prefix(_) => pending.push(PendingComponent::Root),
            Component::CurDir => {}
            Component::ParentDir => pending.push(PendingComponent::Parent),
            Component::Normal(part) => pending.push(PendingComponent::Name(part.to_os_string())),
        }
    }
}

/// Walks `pending` by path from `start`, following symbolic links like the
/// kernel does, and returns the location reached. Only for messages about
/// links leading outside: by path, so it may race; nothing is opened. Once
/// a component is missing, the rest are appended as they are.
pub(super) fn resolve_real(start: PathBuf, mut pending: Vec<PendingComponent>) -> io::Result<PathBuf> {
    let mut resolved = start;
    let mut links = 0;
    let mut exists = true;
    while let Some(component) = pending.pop() {
        match component {
            PendingComponent::Root => resolved = PathBuf::from("/"),
            PendingComponent::Parent => {
                resolved.pop();
            }
            PendingComponent::Name(name) => {
                let next = resolved.join(&name);
                if !exists {
                    resolved = next;
                    continue;
                }
                match std::fs::symlink_metadata(&next) {
                    Ok(metadata) if metadata.file_type().is_symlink() => {
                        links += 1;
                        if links > MAX_SYMLINKS {
                            return Err(io::Error::other("too many levels of symbolic links"));
                        }
                        push_target(&std::fs::read_link(&next)?, &mut pending);
                    }
                    Ok(_) => resolved = next,
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {
                        exists = false;
                        resolved = next;
                    }
                    Err(error) => return Err(error),
                }
            }
        }
    }
    Ok(resolved)
}

/// One step of a resolution.
pub(super) enum PendingComponent {
    /// Restart at `/` (an absolute link target).
    Root,
    /// `..` from a link target.
    Parent,
    /// A name to look up.
    Name(OsString),
}
