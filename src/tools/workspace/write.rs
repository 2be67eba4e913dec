//! `write_file`: creates or replaces a file in the workspace, atomically.

use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{Arguments, Workspace, blocking, io_failure, plural};
use crate::model::{BoxFuture, ToolSpec};
use crate::tools::{Tool, ToolContext, ToolError};

/// The mode of a file `write_file` creates (the usual `0644`, set
/// explicitly so the result does not depend on the process's umask).
const NEW_FILE_MODE: u32 = 0o644;

/// Creates or replaces a file in the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFile;

impl Tool for WriteFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "write_file".into(),
            description: "Writes a file in the workspace with exactly the given content, replacing it if it exists \
                          and creating missing parent directories. The write is atomic: readers see the old or \
                          the new content, never a mix. To change part of an existing file prefer edit_file. Paths \
                          are relative to the workspace root."
                .into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file, relative to the workspace root."},
                    "content": {"type": "string", "description": "The complete new content of the file."}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
        }
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let arguments = Arguments(&arguments);
            let path = arguments.required_str("path")?.to_string();
            let content = arguments.required_str("content")?.to_string();
            let workspace = context.workspace.clone();
            blocking(move || {
                let workspace = Workspace::new(&workspace)?;
                write(&workspace, &path, &content)
            })
            .await
        })
    }
}

fn write(workspace: &Workspace, path: &str, content: &str) -> Result<String, ToolError> {
    let resolved = workspace.resolve(path)?;
    let previous = if resolved.exists {
        let metadata = std::fs::metadata(&resolved.path).map_err(|error| io_failure("write", path, &error))?;
        if metadata.is_dir() {
            return Err(ToolError::Failed(format!(
                "'{path}' is a directory; give the path of a file inside it"
            )));
        }
        Some(metadata.len())
    } else {
        None
    };
    // The resolved path is below the workspace root and is not the root
    // itself (that exists and is a directory), so it has a parent inside.
    let Some(parent) = resolved.path.parent() else {
        return Err(ToolError::Failed(format!("'{path}' has no parent directory")));
    };
    std::fs::create_dir_all(parent).map_err(|error| io_failure("create the directories of", path, &error))?;
    atomic_write(&resolved.path, content.as_bytes()).map_err(|error| io_failure("write", path, &error))?;
    let shown = workspace.display(&resolved.path);
    let written = plural(content.len(), "byte", "bytes");
    Ok(match previous {
        None => format!("wrote {written} to '{shown}' (new file)"),
        Some(before) => format!("wrote {written} to '{shown}' (replaced {before} bytes)"),
    })
}

/// Replaces `target` with `content` atomically: the bytes go to a temporary
/// file in the same directory, which is synced and then renamed over the
/// target, so a crash or a concurrent reader sees the old file or the new
/// one. An existing file keeps its permissions. The temporary file is
/// removed if anything fails before the rename.
///
/// Replacing a file by rename gives it a new inode: other hard links to it
/// keep the old content.
pub(super) fn atomic_write(target: &Path, content: &[u8]) -> io::Result<()> {
    let dir = target
        .parent()
        .ok_or_else(|| io::Error::other("the path has no parent directory"))?;
    let permissions = match std::fs::metadata(target) {
        Ok(metadata) => metadata.permissions(),
        Err(_) => std::fs::Permissions::from_mode(NEW_FILE_MODE),
    };
    let mut temporary = tempfile::Builder::new()
        .prefix(".keel-write-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    temporary.write_all(content)?;
    temporary.as_file().set_permissions(permissions)?;
    temporary.as_file().sync_all()?;
    temporary.persist(target).map_err(|error| error.error)?;
    // Make the rename itself durable; a failure here leaves a complete file,
    // so it is not reported.
    if let Ok(directory) = std::fs::File::open(dir) {
        let _ = directory.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    async fn write_file(workspace: &Path, arguments: serde_json::Value) -> Result<String, ToolError> {
        super::super::test_call(&WriteFile, workspace, arguments).await
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn creates_files_and_parents_then_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let output = write_file(
            dir.path(),
            serde_json::json!({"path": "a/b/c.txt", "content": "hello\n"}),
        )
        .await
        .unwrap();
        assert_eq!(output, "wrote 6 bytes to 'a/b/c.txt' (new file)");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(),
            "hello\n"
        );
        let mode = std::fs::metadata(dir.path().join("a/b/c.txt"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, NEW_FILE_MODE);
        let output = write_file(dir.path(), serde_json::json!({"path": "./a/b/c.txt", "content": "x"}))
            .await
            .unwrap();
        assert_eq!(output, "wrote 1 byte to 'a/b/c.txt' (replaced 6 bytes)");
        assert_eq!(std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(), "x");
        assert_eq!(names(&dir.path().join("a/b")), ["c.txt"], "no temporary file is left");
    }

    #[tokio::test]
    async fn replacing_keeps_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o750)).unwrap();
        write_file(
            dir.path(),
            serde_json::json!({"path": "run.sh", "content": "#!/bin/sh\necho hi\n"}),
        )
        .await
        .unwrap();
        assert_eq!(std::fs::metadata(&script).unwrap().permissions().mode() & 0o777, 0o750);
    }

    #[tokio::test]
    async fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let refused = write_file(dir.path(), serde_json::json!({"path": "sub", "content": "x"}))
            .await
            .unwrap_err();
        assert_eq!(
            refused,
            ToolError::Failed("'sub' is a directory; give the path of a file inside it".into())
        );
        // The rename fails (a directory is in the way) after the temporary
        // file was written: it must be cleaned up.
        let target = dir.path().join("sub");
        assert!(atomic_write(&target, b"data").is_err());
        assert_eq!(names(dir.path()), ["sub"]);
    }

    #[tokio::test]
    async fn writes_through_links_stay_inside() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        symlink(&outside, workspace.join("out")).unwrap();
        let refused = write_file(&workspace, serde_json::json!({"path": "out/new/x.txt", "content": "x"}))
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, ToolError::Failed(message) if message.starts_with("'out/new/x.txt' leads outside the workspace through a symbolic link")),
            "{refused:?}"
        );
        assert!(!outside.join("new").exists(), "no directory is created outside");
    }
}
