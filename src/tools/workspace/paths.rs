//! Path confinement: every path a model gives is resolved inside the
//! session's workspace, or refused.
//!
//! A path is taken relative to the workspace root (an absolute path is
//! accepted when it names something inside the workspace). Resolution walks
//! the path one component at a time, following symbolic links itself, so the
//! result is the real location the operation will touch; that location must
//! be under the canonical workspace root. Components that do not exist yet
//! (a file about to be written, its missing parent directories) are checked
//! against the deepest existing ancestor, whose real location is known.
//!
//! # Limits (time of check, time of use)
//!
//! The check and the use are separate system calls. A process that swaps a
//! directory inside the workspace for a symbolic link *between* them can
//! redirect the use outside the workspace. Within Keel this needs a process
//! running at the same time as the file tool: the `shell` tool is not
//! parallel safe, so it never runs beside another call of the same step, and
//! it kills its whole process group when a call ends, so nothing it started
//! is left to race. A process outside Keel with write access to the
//! workspace can still win such a race; closing that would take
//! `openat2(RESOLVE_BENEATH)` for every open, which these tools do not use
//! (yet). The sandbox of the `shell` tool, where enforced, is the boundary
//! that does not depend on timing.

use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::tools::ToolError;

/// How many symbolic links one resolution may follow, like the kernel's
/// `MAXSYMLINKS`; more is a loop.
const MAX_SYMLINKS: usize = 40;

/// A session's workspace directory, canonicalized once.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The real (canonical) root; every resolved path starts with it.
    root: PathBuf,
    /// The root as the runtime gave it (absolute, not canonical), so an
    /// absolute path written in those terms is accepted too.
    given: PathBuf,
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

impl Workspace {
    /// The workspace at `dir`, which must be an existing directory.
    pub fn new(dir: &Path) -> Result<Self, ToolError> {
        let root = std::fs::canonicalize(dir)
            .map_err(|error| ToolError::Failed(format!("the workspace {} is not usable: {error}", dir.display())))?;
        if !root.is_dir() {
            return Err(ToolError::Failed(format!(
                "the workspace {} is not a directory",
                dir.display()
            )));
        }
        let given = std::path::absolute(dir).unwrap_or_else(|_| root.clone());
        Ok(Self { root, given })
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves `path` (as the model wrote it) to its real location inside
    /// the workspace. The empty path and `.` are the root.
    pub fn resolve(&self, path: &str) -> Result<Resolved, ToolError> {
        let relative = self.relative_components(path)?;
        let mut followed_link = false;
        let resolved = resolve_real(&self.root, relative, &mut followed_link)
            .map_err(|error| ToolError::Failed(format!("cannot resolve '{path}': {error}")))?;
        if !resolved.path.starts_with(&self.root) {
            let how = if followed_link { " through a symbolic link" } else { "" };
            return Err(ToolError::Failed(format!(
                "'{path}' leads outside the workspace{how}: it resolves to {}, which is not under the workspace {}",
                resolved.path.display(),
                self.root.display()
            )));
        }
        Ok(resolved)
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
}

/// Walks `components` from `root`, following symbolic links like the kernel
/// does, and returns the real location. Once a component is missing, the
/// rest are appended as they are (they cannot be links).
fn resolve_real(root: &Path, components: Vec<OsString>, followed_link: &mut bool) -> io::Result<Resolved> {
    let mut resolved = root.to_path_buf();
    // Pending components, next one last (so links can push their targets).
    let mut pending: Vec<PendingComponent> = components.into_iter().rev().map(PendingComponent::Name).collect();
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
                        *followed_link = true;
                        let target = std::fs::read_link(&next)?;
                        // The target's components come next, in order.
                        for part in target.components().rev() {
                            match part {
                                Component::RootDir | Component::Prefix(_) => pending.push(PendingComponent::Root),
                                Component::CurDir => {}
                                Component::ParentDir => pending.push(PendingComponent::Parent),
                                Component::Normal(part) => pending.push(PendingComponent::Name(part.to_os_string())),
                            }
                        }
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
    Ok(Resolved { path: resolved, exists })
}

/// One step of a resolution.
enum PendingComponent {
    /// Restart at `/` (an absolute link target).
    Root,
    /// `..` from a link target.
    Parent,
    /// A name to look up.
    Name(OsString),
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        outside: PathBuf,
        workspace: Workspace,
    }

    /// A workspace with `a/b.txt`, and a directory `outside` beside it
    /// holding `secret.txt`.
    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("a/b.txt"), "b").unwrap();
        std::fs::write(outside.join("secret.txt"), "secret").unwrap();
        let workspace = Workspace::new(&root).unwrap();
        let outside = std::fs::canonicalize(outside).unwrap();
        Fixture {
            _dir: dir,
            outside,
            workspace,
        }
    }

    fn refused(workspace: &Workspace, path: &str) -> String {
        match workspace.resolve(path) {
            Err(ToolError::Failed(message)) => message,
            other => panic!("{path}: expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn relative_and_absolute_paths_inside_resolve() {
        let fixture = fixture();
        let root = fixture.workspace.root().to_path_buf();
        for path in ["a/b.txt", "./a/b.txt", "a/./b.txt", "a/../a/b.txt"] {
            assert_eq!(
                fixture.workspace.resolve(path).unwrap(),
                Resolved {
                    path: root.join("a/b.txt"),
                    exists: true
                },
                "{path}"
            );
        }
        let absolute = root.join("a/b.txt");
        assert_eq!(
            fixture.workspace.resolve(absolute.to_str().unwrap()).unwrap().path,
            absolute
        );
        for path in ["", ".", "a/.."] {
            assert_eq!(fixture.workspace.resolve(path).unwrap().path, root, "{path}");
        }
        let missing = fixture.workspace.resolve("new/dir/file.txt").unwrap();
        assert_eq!(
            missing,
            Resolved {
                path: root.join("new/dir/file.txt"),
                exists: false
            }
        );
        assert_eq!(fixture.workspace.display(&missing.path), "new/dir/file.txt");
        assert_eq!(fixture.workspace.display(&root), ".");
    }

    #[test]
    fn climbing_out_and_absolute_paths_elsewhere_are_refused() {
        let fixture = fixture();
        for path in ["../x", "a/../../b", "..", "a/b.txt/../../../outside/secret.txt"] {
            let message = refused(&fixture.workspace, path);
            assert!(
                message.contains(&format!("'{path}' is outside the workspace")),
                "{message}"
            );
            assert!(message.contains("climbs above the workspace root"), "{message}");
        }
        let message = refused(&fixture.workspace, "/etc/passwd");
        assert!(
            message.starts_with("'/etc/passwd' is outside the workspace "),
            "{message}"
        );
        let root = fixture.workspace.root().display().to_string();
        let sneaky = format!("{root}/../outside/secret.txt");
        assert!(refused(&fixture.workspace, &sneaky).contains("climbs above"));
    }

    #[test]
    fn symbolic_links_leading_outside_are_refused() {
        let fixture = fixture();
        let root = fixture.workspace.root().to_path_buf();
        symlink(fixture.outside.join("secret.txt"), root.join("file-link")).unwrap();
        symlink(&fixture.outside, root.join("dir-link")).unwrap();
        symlink("../outside", root.join("relative-link")).unwrap();
        symlink(fixture.outside.join("missing.txt"), root.join("dangling")).unwrap();
        for (path, target) in [
            ("file-link", fixture.outside.join("secret.txt")),
            ("dir-link/secret.txt", fixture.outside.join("secret.txt")),
            ("dir-link", fixture.outside.clone()),
            ("relative-link/secret.txt", fixture.outside.join("secret.txt")),
            // Not-yet-existing files below a link, and through a dangling link.
            ("dir-link/new/file.txt", fixture.outside.join("new/file.txt")),
            ("dangling", fixture.outside.join("missing.txt")),
        ] {
            let message = refused(&fixture.workspace, path);
            assert_eq!(
                message,
                format!(
                    "'{path}' leads outside the workspace through a symbolic link: it resolves to {}, which is not under the workspace {}",
                    target.display(),
                    root.display()
                )
            );
        }
    }

    #[test]
    fn symbolic_links_inside_the_workspace_are_followed() {
        let fixture = fixture();
        let root = fixture.workspace.root().to_path_buf();
        symlink("a", root.join("inner")).unwrap();
        symlink(root.join("a/b.txt"), root.join("b-link")).unwrap();
        // A link that leaves and comes back ends inside: allowed.
        symlink(
            format!("../{}/a", root.file_name().unwrap().to_str().unwrap()),
            root.join("round-trip"),
        )
        .unwrap();
        for path in ["inner/b.txt", "b-link", "round-trip/b.txt"] {
            assert_eq!(
                fixture.workspace.resolve(path).unwrap().path,
                root.join("a/b.txt"),
                "{path}"
            );
        }
        assert_eq!(
            fixture.workspace.resolve("inner/new.txt").unwrap(),
            Resolved {
                path: root.join("a/new.txt"),
                exists: false
            }
        );
    }

    #[test]
    fn link_loops_are_reported() {
        let fixture = fixture();
        let root = fixture.workspace.root().to_path_buf();
        symlink("loop-b", root.join("loop-a")).unwrap();
        symlink("loop-a", root.join("loop-b")).unwrap();
        let message = refused(&fixture.workspace, "loop-a");
        assert!(message.contains("too many levels of symbolic links"), "{message}");
    }

    #[test]
    fn the_workspace_itself_is_canonicalized() {
        let fixture = fixture();
        let root = fixture.workspace.root().to_path_buf();
        let alias = root.parent().unwrap().join("alias");
        symlink(&root, &alias).unwrap();
        let workspace = Workspace::new(&alias).unwrap();
        assert_eq!(workspace.root(), root);
        // An absolute path written with the alias is inside too.
        let through_alias = alias.join("a/b.txt");
        assert_eq!(
            workspace.resolve(through_alias.to_str().unwrap()).unwrap().path,
            root.join("a/b.txt")
        );
        let missing = root.parent().unwrap().join("no-such-workspace");
        assert!(Workspace::new(&missing).is_err());
    }
}
