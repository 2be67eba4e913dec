//! `write_file`: creates or replaces a file in the workspace, atomically.

use std::ffi::OsStr;
use std::io::{self, Write as _};
use std::os::unix::fs::PermissionsExt as _;

use cap_std::fs::{Dir, OpenOptionsExt as _, PermissionsExt as _};

use super::{Arguments, Workspace, blocking, io_failure, plural};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

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
            parameters: crate::object_schema(
                serde_json::json!({
                    "path": {"type": "string", "description": "The file, relative to the workspace root."},
                    "content": {"type": "string", "description": "The complete new content of the file."}
                }),
                &["path", "content"],
            ),
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
    let location = workspace.locate(path)?;
    // Never created, replaced or renamed over, whatever the approval.
    workspace.refuse_protected(&location, path)?;
    let existing = if location.exists {
        let metadata = location.metadata().map_err(|error| io_failure("write", path, &error))?;
        if metadata.is_dir() {
            return Err(ToolError::Failed(format!(
                "'{path}' is a directory; give the path of a file inside it"
            )));
        }
        Some(metadata)
    } else {
        None
    };
    let (dir, name) = location
        .parent_for_write()
        .map_err(|error| io_failure("create the directories of", path, &error))?;
    // An existing file keeps its permissions.
    let mode = existing
        .as_ref()
        .filter(|metadata| metadata.is_file())
        .map_or(NEW_FILE_MODE, |metadata| metadata.permissions().mode());
    atomic_write(&dir, name, content.as_bytes(), mode).map_err(|error| io_failure("write", path, &error))?;
    let shown = workspace.display(&location.path);
    let written = plural(content.len(), "byte", "bytes");
    Ok(match existing {
        None => format!("wrote {written} to '{shown}' (new file)"),
        Some(before) => format!("wrote {written} to '{shown}' (replaced {} bytes)", before.len()),
    })
}

/// Replaces `name` in `dir` with `content` atomically: the bytes go to a
/// temporary file created in `dir` (through its handle), which is synced,
/// given `mode` and then renamed over `name` within `dir`, so a crash or a
/// concurrent reader sees the old file or the new one, and no link can
/// redirect it. The temporary file is removed if anything fails before the
/// rename.
///
/// Replacing a file by rename gives it a new inode: other hard links to it
/// keep the old content.
pub(super) fn atomic_write(dir: &Dir, name: &OsStr, content: &[u8], mode: u32) -> io::Result<()> {
    let (temporary_name, file) = create_temporary(dir)?;
    let written = (|| {
        let mut file = file.into_std();
        file.write_all(content)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        dir.rename(&temporary_name, dir, name)
    })();
    if let Err(error) = written {
        let _ = dir.remove_file(&temporary_name);
        return Err(error);
    }
    // Make the rename itself durable; a failure here leaves a complete file,
    // so it is not reported.
    if let Ok(directory) = dir.try_clone() {
        let _ = directory.into_std_file().sync_all();
    }
    Ok(())
}

/// A new, empty temporary file in `dir` (created exclusively, so never
/// through a link), with its name.
fn create_temporary(dir: &Dir) -> io::Result<(String, cap_std::fs::File)> {
    let mut options = cap_std::fs::OpenOptions::new();
    options.write(true).create_new(true).mode(0o600);
    let mut attempts = 0;
    loop {
        let name = format!(".keel-write-{}.tmp", uuid::Uuid::now_v7().simple());
        match dir.open_with(&name, &options) {
            Ok(file) => return Ok((name, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::Path;

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
        let handle = Dir::open_ambient_dir(dir.path(), cap_std::ambient_authority()).unwrap();
        assert!(atomic_write(&handle, OsStr::new("sub"), b"data", NEW_FILE_MODE).is_err());
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
