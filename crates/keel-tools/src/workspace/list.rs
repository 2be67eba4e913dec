//! `list_dir`: what a directory of the workspace holds, to a small depth.

use std::ffi::OsStr;
use std::fmt::Write as _;

use cap_fs_ext::DirExt as _;
use cap_std::fs::{Dir, DirEntry, FileType};

use super::paths::dir_identity;
use super::{Arguments, Workspace, blocking, io_failure, plural};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// The deepest listing one call may ask for.
const MAX_DEPTH: u64 = 5;

/// Entries shown per call; the rest are counted.
const MAX_ENTRIES: usize = 500;

/// Entries looked at per call, shown or counted; past this the count is a
/// lower bound, so a call on a huge tree stays cheap.
const MAX_VISITED: usize = 20_000;

/// Directories listed but never descended into: their contents are noise to
/// a model and can be huge.
const NOT_DESCENDED: &[&str] = &[".git"];

/// Lists a directory of the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ListDir;

impl Tool for ListDir {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_dir".into(),
            description: format!(
                "Lists a directory of the workspace, sorted by name, one entry per line as a path relative to the \
                 workspace root: directories end with `/`, files show their size in bytes, symbolic links show \
                 their target (they are not followed). depth 1 (the default) lists only the directory itself; \
                 up to {MAX_DEPTH} also lists subdirectories (never inside .git). At most {MAX_ENTRIES} entries \
                 are shown."
            ),
            parameters: crate::object_schema(
                serde_json::json!({
                    "path": {"type": "string", "description": "The directory, relative to the workspace root; default: the root."},
                    "depth": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH, "description": "How many levels to list; default 1."}
                }),
                &[],
            ),
        }
    }

    fn read_only(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let arguments = Arguments(&arguments);
            let path = arguments.optional_str("path")?.unwrap_or(".").to_string();
            let depth = arguments.optional_u64("depth", 1, MAX_DEPTH)?.unwrap_or(1);
            let workspace = context.workspace.clone();
            blocking(move || {
                let workspace = Workspace::new(&workspace)?;
                list(&workspace, &path, usize::try_from(depth).unwrap_or(1))
            })
            .await
        })
    }
}

/// What a listing has gathered so far.
struct Listing<'a> {
    /// Whose protected files are left out.
    workspace: &'a Workspace,
    lines: Vec<String>,
    /// Entries seen, shown or not.
    visited: usize,
    /// Keel's protected files left out.
    protected: usize,
}

fn list(workspace: &Workspace, path: &str, depth: usize) -> Result<String, ToolError> {
    let location = workspace.locate(path)?;
    workspace.refuse_protected(&location, path)?;
    if !location.exists {
        return Err(ToolError::Failed(format!("'{path}' does not exist")));
    }
    let metadata = location.metadata().map_err(|error| io_failure("list", path, &error))?;
    if !metadata.is_dir() {
        return Err(ToolError::Failed(format!(
            "'{path}' is a file, not a directory; use read_file to read it"
        )));
    }
    let mut listing = Listing {
        workspace,
        lines: Vec::new(),
        visited: 0,
        protected: 0,
    };
    // Listed through a handle opened without following a link, and every
    // subdirectory likewise through its parent's handle: a directory swapped
    // for a link meanwhile is not entered.
    let dir = location.open_dir().map_err(|error| io_failure("list", path, &error))?;
    let entries = sorted_entries(&dir).map_err(|error| io_failure("list", path, &error))?;
    if entries.is_empty() {
        return Ok(format!("['{path}' is empty]"));
    }
    let shown = workspace.display(&location.path);
    walk(&dir, &shown, entries, depth, &mut listing);
    if listing.lines.is_empty() && listing.visited == 0 {
        return Ok(format!(
            "['{path}' holds only Keel's protected files, which are not shown]"
        ));
    }
    let mut output = listing.lines.join("\n");
    output.push('\n');
    if listing.protected > 0 {
        let _ = writeln!(
            output,
            "[{} not shown]",
            plural(
                listing.protected,
                "protected file of Keel's",
                "protected files of Keel's"
            )
        );
    }
    let hidden = listing.visited.saturating_sub(listing.lines.len());
    if hidden > 0 {
        let more = if listing.visited >= MAX_VISITED {
            format!("more than {hidden}")
        } else {
            hidden.to_string()
        };
        let _ = writeln!(
            output,
            "[… {more} more entries not shown; list a subdirectory or use a smaller depth]"
        );
    }
    Ok(output)
}

/// `name` below the directory shown as `parent` (`.` for the root).
pub(super) fn shown_child(parent: &str, name: &OsStr) -> String {
    if parent == "." {
        name.to_string_lossy().into_owned()
    } else {
        format!("{parent}/{}", name.to_string_lossy())
    }
}

/// Lists `entries` (of `dir`, shown as `parent`), descending while `depth`
/// allows.
fn walk(dir: &Dir, parent: &str, entries: Vec<DirEntry>, depth: usize, listing: &mut Listing<'_>) {
    let dir_id = dir_identity(dir);
    for entry in entries {
        if listing.visited >= MAX_VISITED {
            return;
        }
        let name = entry.file_name();
        if listing.workspace.hides(dir, dir_id, &name) {
            listing.protected += 1;
            continue;
        }
        listing.visited += 1;
        let shown = shown_child(parent, &name);
        // `DirEntry::file_type` does not follow symbolic links.
        let file_type = entry.file_type();
        let is_dir = file_type.as_ref().is_ok_and(FileType::is_dir);
        if listing.lines.len() < MAX_ENTRIES {
            let line = match &file_type {
                Ok(kind) if kind.is_dir() => format!("{shown}/"),
                Ok(kind) if kind.is_file() => match dir.symlink_metadata(&name) {
                    Ok(metadata) => {
                        let size = usize::try_from(metadata.len()).unwrap_or(usize::MAX);
                        format!("{shown}  ({})", plural(size, "byte", "bytes"))
                    }
                    Err(_) => shown.clone(),
                },
                Ok(kind) if kind.is_symlink() => match dir.read_link_contents(&name) {
                    Ok(target) => format!("{shown} -> {}", target.display()),
                    Err(_) => format!("{shown} -> ?"),
                },
                Ok(_) => format!("{shown}  (special file)"),
                Err(error) => format!("{shown}  [cannot read: {error}]"),
            };
            listing.lines.push(line);
        }
        if is_dir && depth > 1 && !NOT_DESCENDED.iter().any(|skip| name == *skip) {
            match dir.open_dir_nofollow(&name).and_then(|child| {
                let entries = sorted_entries(&child)?;
                Ok((child, entries))
            }) {
                Ok((child, entries)) => walk(&child, &shown, entries, depth - 1, listing),
                Err(error) => {
                    if listing.lines.len() < MAX_ENTRIES {
                        listing.lines.push(format!("{shown}/  [cannot list: {error}]"));
                    }
                }
            }
        }
    }
}

/// The entries of `dir`, sorted by name.
pub(super) fn sorted_entries(dir: &Dir) -> std::io::Result<Vec<DirEntry>> {
    let mut entries = dir.entries()?.collect::<std::io::Result<Vec<_>>>()?;
    entries.sort_by_key(DirEntry::file_name);
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use super::*;

    async fn list_dir(workspace: &Path, arguments: serde_json::Value) -> Result<String, ToolError> {
        super::super::test_call(&ListDir, workspace, arguments).await
    }

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src/deep/deeper")).unwrap();
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::write(root.join("Cargo.toml"), "[package]\n").unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        std::fs::write(root.join("src/deep/deeper/x.txt"), "x").unwrap();
        std::fs::write(root.join(".git/HEAD"), "ref").unwrap();
        symlink("src/main.rs", root.join("link")).unwrap();
        dir
    }

    #[tokio::test]
    async fn entries_are_sorted_marked_and_sized() {
        let dir = tree();
        let output = list_dir(dir.path(), serde_json::json!({})).await.unwrap();
        assert_eq!(output, ".git/\nCargo.toml  (10 bytes)\nlink -> src/main.rs\nsrc/\n");
        let output = list_dir(dir.path(), serde_json::json!({"path": "src", "depth": 2}))
            .await
            .unwrap();
        assert_eq!(output, "src/deep/\nsrc/deep/deeper/\nsrc/main.rs  (13 bytes)\n");
    }

    #[tokio::test]
    async fn depth_goes_down_but_not_into_git() {
        let dir = tree();
        let output = list_dir(dir.path(), serde_json::json!({"depth": 5})).await.unwrap();
        assert_eq!(
            output,
            ".git/\nCargo.toml  (10 bytes)\nlink -> src/main.rs\nsrc/\nsrc/deep/\nsrc/deep/deeper/\n\
             src/deep/deeper/x.txt  (1 byte)\nsrc/main.rs  (13 bytes)\n"
        );
    }

    #[tokio::test]
    async fn long_listings_are_capped_with_a_count() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..MAX_ENTRIES + 7 {
            std::fs::write(dir.path().join(format!("f{n:04}")), "").unwrap();
        }
        let output = list_dir(dir.path(), serde_json::json!({})).await.unwrap();
        let lines: Vec<&str> = output.lines().collect();
        assert_eq!(lines.len(), MAX_ENTRIES + 1);
        assert_eq!(lines[0], "f0000  (0 bytes)");
        assert_eq!(
            lines[MAX_ENTRIES],
            "[… 7 more entries not shown; list a subdirectory or use a smaller depth]"
        );
    }

    #[tokio::test]
    async fn files_empty_and_missing_directories() {
        let dir = tree();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        assert_eq!(
            list_dir(dir.path(), serde_json::json!({"path": "empty"}))
                .await
                .unwrap(),
            "['empty' is empty]"
        );
        assert_eq!(
            list_dir(dir.path(), serde_json::json!({"path": "Cargo.toml"})).await,
            Err(ToolError::Failed(
                "'Cargo.toml' is a file, not a directory; use read_file to read it".into()
            ))
        );
        assert_eq!(
            list_dir(dir.path(), serde_json::json!({"path": "nope"})).await,
            Err(ToolError::Failed("'nope' does not exist".into()))
        );
    }
}
