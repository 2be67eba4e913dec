//! `edit_file`: replaces an exact piece of a text file, atomically.
//!
//! Exact matching, and refusing an ambiguous match, keep an edit from
//! landing somewhere the model did not look.

use cap_std::fs::PermissionsExt as _;

use super::read::load_text_at;
use super::write::atomic_write;
use super::{Arguments, Workspace, blocking, io_failure, plural};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// Replaces text in a file of the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct EditFile;

impl Tool for EditFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "edit_file".into(),
            description: "Edits a text file in the workspace by replacing old_string with new_string. old_string \
                          must match the file exactly, including whitespace and indentation (copy it from \
                          read_file's output without the line numbers), and must occur exactly once unless \
                          replace_all is true; include surrounding lines to make it unique. The write is atomic."
                .into(),
            parameters: crate::object_schema(
                serde_json::json!({
                    "path": {"type": "string", "description": "The file, relative to the workspace root."},
                    "old_string": {"type": "string", "minLength": 1, "description": "The exact text to replace."},
                    "new_string": {"type": "string", "description": "The text to put in its place."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one; default false."}
                }),
                &["path", "old_string", "new_string"],
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
            let old = arguments.required_str("old_string")?.to_string();
            let new = arguments.required_str("new_string")?.to_string();
            let replace_all = arguments.optional_bool("replace_all")?.unwrap_or(false);
            if old.is_empty() {
                return Err(ToolError::InvalidArguments(
                    "'old_string' is empty; to create or overwrite a whole file use write_file".into(),
                ));
            }
            if old == new {
                return Err(ToolError::InvalidArguments(
                    "'old_string' and 'new_string' are the same; nothing would change".into(),
                ));
            }
            let workspace = context.workspace.clone();
            blocking(move || {
                let workspace = Workspace::new(&workspace)?;
                edit(&workspace, &path, &old, &new, replace_all)
            })
            .await
        })
    }
}

fn edit(workspace: &Workspace, path: &str, old: &str, new: &str, replace_all: bool) -> Result<String, ToolError> {
    let location = workspace.locate(path)?;
    let text = load_text_at(workspace, &location, path)?;
    let count = text.matches(old).count();
    if count == 0 {
        let mut message = format!(
            "old_string was not found in '{path}'; read the file again and copy the text exactly, including \
             whitespace and line breaks"
        );
        if text.contains("\r\n") && old.contains('\n') && !old.contains("\r\n") {
            message.push_str(" (the file has CRLF line endings: write each line break in old_string as \\r\\n)");
        }
        if looks_numbered(old) {
            message.push_str(" (old_string seems to start with read_file's line numbers; leave them out)");
        }
        return Err(ToolError::Failed(message));
    }
    if count > 1 && !replace_all {
        return Err(ToolError::Failed(format!(
            "old_string occurs {count} times in '{path}'; include more surrounding lines to make it unique, or set \
             replace_all to true to replace every occurrence"
        )));
    }
    let edited = text.replace(old, new);
    // The file is replaced in the directory it was read from, through that
    // directory's handle, keeping its permissions.
    let (dir, Some(name)) = location.parent() else {
        return Err(ToolError::Failed(format!("'{path}' is not a regular file")));
    };
    let metadata = location.metadata().map_err(|error| io_failure("write", path, &error))?;
    if !metadata.is_file() {
        return Err(ToolError::Failed(format!(
            "'{path}' changed while it was being edited (it is no longer a regular file); read it again"
        )));
    }
    // Looked at again just before the rename (the file may have changed
    // since it was read).
    workspace.refuse_protected(&location, path)?;
    let mode = metadata.permissions().mode();
    atomic_write(dir, name, edited.as_bytes(), mode).map_err(|error| io_failure("write", path, &error))?;
    Ok(format!(
        "replaced {} in '{}'",
        plural(count, "occurrence", "occurrences"),
        workspace.display(&location.path)
    ))
}

/// Whether `text` starts like a line of `read_file` output (spaces, a
/// number, a tab), which a model may have copied by mistake.
fn looks_numbered(text: &str) -> bool {
    let trimmed = text.trim_start_matches(' ');
    let digits = trimmed.chars().take_while(char::is_ascii_digit).count();
    digits > 0 && trimmed[digits..].starts_with('\t')
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    async fn edit_file(workspace: &Path, arguments: serde_json::Value) -> Result<String, ToolError> {
        super::super::test_call(&EditFile, workspace, arguments).await
    }

    fn failed(result: Result<String, ToolError>) -> String {
        match result {
            Err(ToolError::Failed(message) | ToolError::InvalidArguments(message)) => message,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn replaces_one_exact_occurrence() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.rs"), "fn a() {}\nfn b() {}\n").unwrap();
        let output = edit_file(
            dir.path(),
            serde_json::json!({"path": "a.rs", "old_string": "fn b() {}", "new_string": "fn b() { a() }"}),
        )
        .await
        .unwrap();
        assert_eq!(output, "replaced 1 occurrence in 'a.rs'");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.rs")).unwrap(),
            "fn a() {}\nfn b() { a() }\n"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left");
    }

    #[tokio::test]
    async fn ambiguous_and_missing_strings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let original = "x = 1\nx = 1\nx = 1\n";
        std::fs::write(dir.path().join("a.txt"), original).unwrap();
        let ambiguous = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "a.txt", "old_string": "x = 1", "new_string": "x = 2"}),
            )
            .await,
        );
        assert_eq!(
            ambiguous,
            "old_string occurs 3 times in 'a.txt'; include more surrounding lines to make it unique, or set \
             replace_all to true to replace every occurrence"
        );
        let missing = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "a.txt", "old_string": "y = 1", "new_string": "y = 2"}),
            )
            .await,
        );
        assert!(missing.starts_with("old_string was not found in 'a.txt'"), "{missing}");
        let numbered = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "a.txt", "old_string": "     1\tx = 1", "new_string": "x = 2"}),
            )
            .await,
        );
        assert!(numbered.ends_with("leave them out)"), "{numbered}");
        assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), original);
        let all = edit_file(
            dir.path(),
            serde_json::json!({"path": "a.txt", "old_string": "x = 1", "new_string": "x = 2", "replace_all": true}),
        )
        .await
        .unwrap();
        assert_eq!(all, "replaced 3 occurrences in 'a.txt'");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
            "x = 2\nx = 2\nx = 2\n"
        );
    }

    #[tokio::test]
    async fn crlf_files_get_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dos.txt"), "a\r\nb\r\n").unwrap();
        let missing = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "dos.txt", "old_string": "a\nb", "new_string": "c"}),
            )
            .await,
        );
        assert!(
            missing.ends_with("(the file has CRLF line endings: write each line break in old_string as \\r\\n)"),
            "{missing}"
        );
        let output = edit_file(
            dir.path(),
            serde_json::json!({"path": "dos.txt", "old_string": "a\r\nb", "new_string": "c"}),
        )
        .await
        .unwrap();
        assert_eq!(output, "replaced 1 occurrence in 'dos.txt'");
        assert_eq!(std::fs::read_to_string(dir.path().join("dos.txt")).unwrap(), "c\r\n");
    }

    #[tokio::test]
    async fn pointless_edits_are_argument_errors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        let empty = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "a.txt", "old_string": "", "new_string": "b"}),
            )
            .await,
        );
        assert!(empty.starts_with("'old_string' is empty"), "{empty}");
        let same = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "a.txt", "old_string": "a", "new_string": "a"}),
            )
            .await,
        );
        assert!(same.contains("are the same"), "{same}");
        let missing_file = failed(
            edit_file(
                dir.path(),
                serde_json::json!({"path": "b.txt", "old_string": "a", "new_string": "b"}),
            )
            .await,
        );
        assert!(missing_file.starts_with("'b.txt' does not exist"), "{missing_file}");
    }
}
