//! `read_file`: a text file's lines, numbered like `cat -n` so an edit can
//! quote them, a range at a time.

use std::fmt::Write as _;
use std::io::Read as _;

use super::paths::Location;
use super::{Arguments, Workspace, blocking, io_failure, plural};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// The largest file `read_file` (and `edit_file`) will load. Larger files
/// are refused with a hint, so one call cannot pull a huge log into memory.
pub(super) const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Lines returned when the call gives no `limit`, and the most it may ask.
const MAX_LINES: usize = 2000;

/// Longer lines are cut (minified files would otherwise fill the result).
const MAX_LINE_BYTES: usize = 2000;

/// The text budget of one result, well under the tool set's own bound, so
/// the cut falls on a line and the result says where to continue.
const MAX_RESULT_BYTES: usize = 128 * 1024;

/// Reads a text file in the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReadFile;

impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: format!(
                "Reads a UTF-8 text file in the workspace and returns its lines numbered like `cat -n` \
                 (line number, tab, text). Use offset (first line, 1-based) and limit (number of lines) to read \
                 part of a long file; at most {MAX_LINES} lines come back per call, and the result says how to \
                 continue. Binary files and files over {} MiB are refused. Paths are relative to the workspace \
                 root.",
                MAX_FILE_BYTES / (1024 * 1024)
            ),
            parameters: crate::object_schema(
                serde_json::json!({
                    "path": {"type": "string", "description": "The file, relative to the workspace root."},
                    "offset": {"type": "integer", "minimum": 1, "description": "The first line to return (1-based); default 1."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LINES, "description": format!("How many lines to return; default and maximum {MAX_LINES}.")}
                }),
                &["path"],
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
            let path = arguments.required_str("path")?.to_string();
            let offset = arguments.optional_u64("offset", 1, u64::MAX)?.unwrap_or(1);
            let limit = arguments.optional_u64("limit", 1, MAX_LINES as u64)?;
            let workspace = context.workspace.clone();
            blocking(move || {
                let workspace = Workspace::new(&workspace)?;
                let text = load_text(&workspace, &path)?;
                let first = usize::try_from(offset).unwrap_or(usize::MAX);
                let limit = limit.map_or(MAX_LINES, |limit| usize::try_from(limit).unwrap_or(MAX_LINES));
                number_lines(&path, &text, first, limit)
            })
            .await
        })
    }
}

/// The text of the file `name` in the directory `dir`, read exactly as
/// `read_file` reads it (confined to `dir`, following no link out of it,
/// refusing Keel's protected files, binary files and files over 4 MiB);
/// `Ok(None)` when nothing is there. For the runtime's own reads of files
/// the model may have written (a project's `AGENTS.md`): they reach no
/// further than the model's own `read_file` would.
pub fn read_workspace_text(dir: &std::path::Path, name: &str) -> Result<Option<String>, ToolError> {
    let workspace = Workspace::new(dir)?;
    let location = workspace.locate(name)?;
    if !location.exists {
        return Ok(None);
    }
    load_text_at(&workspace, &location, name).map(Some)
}

/// The text of the file `path`, refusing what is not a regular UTF-8 text
/// file of at most [`MAX_FILE_BYTES`].
pub(super) fn load_text(workspace: &Workspace, path: &str) -> Result<String, ToolError> {
    let location = workspace.locate(path)?;
    load_text_at(workspace, &location, path)
}

/// [`load_text`] of an already located file, which `edit_file` then
/// replaces through the same directory handle.
pub(super) fn load_text_at(workspace: &Workspace, location: &Location, path: &str) -> Result<String, ToolError> {
    workspace.refuse_protected(location, path)?;
    if !location.exists {
        return Err(ToolError::Failed(format!(
            "'{path}' does not exist; use list_dir or search to find the file"
        )));
    }
    let metadata = location.metadata().map_err(|error| io_failure("read", path, &error))?;
    if metadata.is_dir() {
        return Err(ToolError::Failed(format!(
            "'{path}' is a directory; use list_dir to see what it holds"
        )));
    }
    if !metadata.is_file() {
        return Err(ToolError::Failed(format!("'{path}' is not a regular file")));
    }
    // Opened without following a link, then checked again on the handle:
    // what is read is what was checked.
    let file = location.open_file().map_err(|error| io_failure("read", path, &error))?;
    // Checked again on what was opened: a protected file swapped in since
    // the lookup is refused by its identity.
    workspace.refuse_protected_file(&file, path)?;
    let metadata = file.metadata().map_err(|error| io_failure("read", path, &error))?;
    if !metadata.is_file() {
        return Err(ToolError::Failed(format!("'{path}' is not a regular file")));
    }
    let too_large = |size: u64| {
        ToolError::Failed(format!(
            "'{path}' is {size} bytes, over the {} MiB limit of read_file; use search to find the lines you need, \
             or shell (for example `sed -n '1000,1100p' {path}`)",
            MAX_FILE_BYTES / (1024 * 1024)
        ))
    };
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large(metadata.len()));
    }
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that grew since the check.
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| io_failure("read", path, &error))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large(bytes.len() as u64));
    }
    if bytes.contains(&0) {
        return Err(ToolError::Failed(format!(
            "'{path}' is a binary file ({} bytes, contains NUL bytes); read_file shows text only. \
             Use shell to inspect it (for example `file {path}` or `od -c {path} | head`)",
            bytes.len()
        )));
    }
    String::from_utf8(bytes).map_err(|error| {
        ToolError::Failed(format!(
            "'{path}' is not UTF-8 text (invalid byte at offset {}); read_file shows UTF-8 text only. \
             Use shell to inspect it (for example `iconv -f latin1 -t utf-8 {path}`)",
            error.utf8_error().valid_up_to()
        ))
    })
}

/// Lines `first..first + limit` of `text`, numbered, with a trailer when
/// more remain.
fn number_lines(path: &str, text: &str, first: usize, limit: usize) -> Result<String, ToolError> {
    if text.is_empty() {
        return Ok(format!("['{path}' is empty]"));
    }
    let lines: Vec<&str> = text.strip_suffix('\n').unwrap_or(text).split('\n').collect();
    let total = lines.len();
    if first > total {
        return Err(ToolError::Failed(format!(
            "offset {first} is past the end of '{path}', which has {}",
            plural(total, "line", "lines")
        )));
    }
    let mut output = String::new();
    let mut last = first - 1;
    for (index, line) in lines.iter().enumerate().skip(first - 1).take(limit) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut shown = format!("{:>6}\t{}", index + 1, cut_line(line));
        shown.push('\n');
        if output.len() + shown.len() > MAX_RESULT_BYTES && last >= first {
            break;
        }
        output.push_str(&shown);
        last = index + 1;
    }
    if last < total {
        let _ = writeln!(
            output,
            "[lines {first}-{last} of {total}; to read more, call read_file with offset={}]",
            last + 1
        );
    }
    if text.contains("\r\n") {
        output.push_str("[this file has CRLF line endings; the \\r is not shown]\n");
    }
    Ok(output)
}

/// `line`, cut to [`MAX_LINE_BYTES`] on a character boundary with a marker.
fn cut_line(line: &str) -> String {
    if line.len() <= MAX_LINE_BYTES {
        return line.to_string();
    }
    let mut end = MAX_LINE_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[line cut: {} more bytes]", &line[..end], line.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn read(workspace: &std::path::Path, arguments: serde_json::Value) -> Result<String, ToolError> {
        super::super::test_call(&ReadFile, workspace, arguments).await
    }

    #[tokio::test]
    async fn lines_come_back_numbered() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "one\ntwo\n\nfour").unwrap();
        let output = read(dir.path(), serde_json::json!({"path": "a.txt"})).await.unwrap();
        assert_eq!(output, "     1\tone\n     2\ttwo\n     3\t\n     4\tfour\n");
    }

    #[tokio::test]
    async fn ranges_say_how_to_continue() {
        let dir = tempfile::tempdir().unwrap();
        let text: String = (1..=10).map(|n| format!("line {n}\n")).collect();
        std::fs::write(dir.path().join("a.txt"), text).unwrap();
        let output = read(
            dir.path(),
            serde_json::json!({"path": "a.txt", "offset": 3, "limit": 2}),
        )
        .await
        .unwrap();
        assert_eq!(
            output,
            "     3\tline 3\n     4\tline 4\n[lines 3-4 of 10; to read more, call read_file with offset=5]\n"
        );
        let tail = read(dir.path(), serde_json::json!({"path": "a.txt", "offset": 9}))
            .await
            .unwrap();
        assert_eq!(tail, "     9\tline 9\n    10\tline 10\n");
        let past = read(dir.path(), serde_json::json!({"path": "a.txt", "offset": 11}))
            .await
            .unwrap_err();
        assert_eq!(
            past,
            ToolError::Failed("offset 11 is past the end of 'a.txt', which has 10 lines".into())
        );
    }

    #[tokio::test]
    async fn default_limit_caps_the_lines() {
        let dir = tempfile::tempdir().unwrap();
        let text: String = (1..=2500).map(|n| format!("{n}\n")).collect();
        std::fs::write(dir.path().join("long.txt"), text).unwrap();
        let output = read(dir.path(), serde_json::json!({"path": "long.txt"})).await.unwrap();
        assert_eq!(output.lines().count(), MAX_LINES + 1);
        assert!(output.starts_with("     1\t1\n"));
        assert!(
            output.ends_with("  2000\t2000\n[lines 1-2000 of 2500; to read more, call read_file with offset=2001]\n"),
            "{}",
            &output[output.len() - 200..]
        );
    }

    #[tokio::test]
    async fn the_byte_budget_ends_on_a_line() {
        let dir = tempfile::tempdir().unwrap();
        // 200 lines of 1000 bytes: more than the result budget.
        let text: String = (0..200).map(|_| format!("{}\n", "x".repeat(1000))).collect();
        std::fs::write(dir.path().join("wide.txt"), text).unwrap();
        let output = read(dir.path(), serde_json::json!({"path": "wide.txt"})).await.unwrap();
        assert!(output.len() <= MAX_RESULT_BYTES + 200);
        let shown = MAX_RESULT_BYTES / 1008;
        assert!(
            output.ends_with(&format!(
                "[lines 1-{shown} of 200; to read more, call read_file with offset={}]\n",
                shown + 1
            )),
            "{}",
            &output[output.len() - 200..]
        );
    }

    #[tokio::test]
    async fn long_lines_are_cut() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("min.js"), "é".repeat(1500)).unwrap();
        let output = read(dir.path(), serde_json::json!({"path": "min.js"})).await.unwrap();
        assert_eq!(
            output,
            format!("     1\t{}…[line cut: 1000 more bytes]\n", "é".repeat(1000))
        );
    }

    #[tokio::test]
    async fn what_is_not_text_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bin"), b"ab\0cd").unwrap();
        std::fs::write(dir.path().join("latin1"), b"caf\xe9\n").unwrap();
        std::fs::write(dir.path().join("empty"), b"").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let huge = std::fs::File::create(dir.path().join("huge")).unwrap();
        huge.set_len(MAX_FILE_BYTES + 1).unwrap();
        let root = dir.path().to_path_buf();
        let error = |path: &'static str| {
            let root = root.clone();
            async move {
                match read(&root, serde_json::json!({"path": path})).await {
                    Err(ToolError::Failed(message)) => message,
                    other => panic!("{path}: {other:?}"),
                }
            }
        };
        assert!(
            error("bin")
                .await
                .starts_with("'bin' is a binary file (5 bytes, contains NUL bytes)")
        );
        assert!(
            error("latin1")
                .await
                .starts_with("'latin1' is not UTF-8 text (invalid byte at offset 3)")
        );
        assert!(error("sub").await.starts_with("'sub' is a directory; use list_dir"));
        assert!(error("missing").await.starts_with("'missing' does not exist"));
        assert!(
            error("huge")
                .await
                .starts_with("'huge' is 4194305 bytes, over the 4 MiB limit of read_file")
        );
        assert_eq!(
            read(dir.path(), serde_json::json!({"path": "empty"})).await.unwrap(),
            "['empty' is empty]"
        );
    }

    #[tokio::test]
    async fn crlf_files_are_shown_without_carriage_returns() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dos.txt"), "a\r\nb\r\n").unwrap();
        let output = read(dir.path(), serde_json::json!({"path": "dos.txt"})).await.unwrap();
        assert_eq!(
            output,
            "     1\ta\n     2\tb\n[this file has CRLF line endings; the \\r is not shown]\n"
        );
    }
}
