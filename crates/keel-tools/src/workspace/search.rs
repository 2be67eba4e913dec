//! `search`: a regular expression over the contents of the workspace's
//! files, like a small `ripgrep`.
//!
//! The walk respects `.gitignore`, `.ignore` and `.git/info/exclude` of the
//! workspace's directories (even outside a git repository, so a workspace
//! that is not a clone still gets its ignore files honoured), with the
//! `ignore` crate's matchers and precedence, but not ignore files above the
//! workspace nor the user's global excludes, which would make results
//! depend on the machine. Hidden files are searched; `.git` is not.
//!
//! The walk goes through directory handles (see `paths.rs`): each
//! subdirectory is opened from its parent's handle without following a
//! link, and each file likewise, so a directory swapped for a link during
//! the walk is not entered. Symbolic links are not followed at all.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use cap_fs_ext::DirExt as _;
use cap_std::fs::Dir;
use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use super::list::{shown_child, sorted_entries};
use super::open::open_file_in;
use super::paths::dir_identity;
use super::read::MAX_FILE_BYTES;
use super::{Arguments, Workspace, blocking, plural};
use crate::{Tool, ToolContext, ToolError};
use keel_model::{BoxFuture, ToolSpec};

/// Matching lines returned per call.
const MAX_MATCHES: usize = 200;

/// Longer matching lines are cut.
const MAX_LINE_BYTES: usize = 300;

/// Files looked at per call; a walk past this stops with a marker.
const MAX_FILES: usize = 50_000;

/// Searches file contents in the workspace.
#[derive(Debug, Clone, Copy, Default)]
pub struct Search;

impl Tool for Search {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "search".into(),
            description: format!(
                "Searches the contents of the workspace's files for a regular expression (Rust regex syntax, \
                 matched line by line) and returns matching lines as `path:line: text`, paths relative to the \
                 workspace root. Respects .gitignore; skips binary files, files over {} MiB and .git. At most \
                 {MAX_MATCHES} matches are returned; narrow with path (a directory or file) or glob (for \
                 example `*.rs`, or `src/**/*.rs` to match the path from the workspace root).",
                MAX_FILE_BYTES / (1024 * 1024)
            ),
            parameters: crate::object_schema(
                serde_json::json!({
                    "pattern": {"type": "string", "description": "The regular expression, for example `fn \\w+_test` or `(?i)todo`."},
                    "path": {"type": "string", "description": "A directory or file to search, relative to the workspace root; default: the whole workspace."},
                    "glob": {"type": "string", "description": "Only files whose name matches (`*.rs`), or whose path from the workspace root matches when the glob has a `/` (`src/**/*.rs`)."}
                }),
                &["pattern"],
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
            let pattern = arguments.required_str("pattern")?;
            let regex = regex::bytes::Regex::new(pattern)
                .map_err(|error| ToolError::InvalidArguments(format!("'pattern' is not a valid regex: {error}")))?;
            let glob = arguments.optional_str("glob")?.map(FileFilter::new).transpose()?;
            let path = arguments.optional_str("path")?.unwrap_or(".").to_string();
            let workspace = context.workspace.clone();
            blocking(move || {
                let workspace = Workspace::new(&workspace)?;
                search(&workspace, &regex, &path, glob.as_ref())
            })
            .await
        })
    }
}

/// The `glob` argument: matched against the file name, or against the path
/// from the workspace root when it contains a `/` (as in `.gitignore`).
struct FileFilter {
    matcher: globset::GlobMatcher,
    whole_path: bool,
}

impl FileFilter {
    fn new(glob: &str) -> Result<Self, ToolError> {
        let whole_path = glob.contains('/');
        let matcher = globset::GlobBuilder::new(glob.trim_start_matches('/'))
            .literal_separator(whole_path)
            .build()
            .map_err(|error| ToolError::InvalidArguments(format!("'glob' is not a valid glob: {error}")))?
            .compile_matcher();
        Ok(Self { matcher, whole_path })
    }

    fn accepts(&self, relative: &str, name: &std::ffi::OsStr) -> bool {
        if self.whole_path {
            self.matcher.is_match(relative)
        } else {
            self.matcher.is_match(name)
        }
    }
}

/// What a search found and passed over.
#[derive(Default)]
struct Findings {
    lines: Vec<String>,
    /// Whether there were more matches than returned.
    more: bool,
    files: usize,
    binary: usize,
    too_large: usize,
    unreadable: usize,
    /// Whether the walk stopped at [`MAX_FILES`].
    walk_cut: bool,
}

fn search(
    workspace: &Workspace,
    regex: &regex::bytes::Regex,
    path: &str,
    glob: Option<&FileFilter>,
) -> Result<String, ToolError> {
    let location = workspace.locate(path)?;
    workspace.refuse_protected(&location, path)?;
    if !location.exists {
        return Err(ToolError::Failed(format!("'{path}' does not exist")));
    }
    let mut search = Walk {
        workspace,
        regex,
        glob,
        findings: Findings::default(),
    };
    let shown = workspace.display(&location.path);
    match location.metadata() {
        Ok(metadata) if metadata.is_dir() => match location.open_dir() {
            Ok(dir) => {
                let mut ignores = ancestors_ignores(workspace, &location.path);
                ignores.push(IgnoreLevel::of(&dir, &location.path));
                search.directory(&dir, &location.path, &shown, &mut ignores);
            }
            Err(_) => search.findings.unreadable += 1,
        },
        Ok(metadata) if metadata.is_file() => {
            if let (dir, Some(name)) = location.parent() {
                search.file(dir, name, shown);
            }
        }
        // Anything else (a FIFO, a socket) has no lines to search.
        Ok(_) => {}
        Err(_) => search.findings.unreadable += 1,
    }
    Ok(report(regex, path, &search.findings))
}

/// One search's walk: what it looks for and what it found.
struct Walk<'a> {
    /// Whose protected files are left out.
    workspace: &'a Workspace,
    regex: &'a regex::bytes::Regex,
    glob: Option<&'a FileFilter>,
    findings: Findings,
}

impl Walk<'_> {
    /// Searches the entries of `dir` (real path `real`, shown as `shown`),
    /// in name order, descending through each subdirectory's handle opened
    /// from `dir` without following links. `ignores` holds the ignore rules
    /// of `dir` and the directories above it. Returns whether to stop.
    fn directory(&mut self, dir: &Dir, real: &Path, shown: &str, ignores: &mut Vec<IgnoreLevel>) -> bool {
        let Ok(entries) = sorted_entries(dir) else {
            self.findings.unreadable += 1;
            return false;
        };
        let dir_id = dir_identity(dir);
        for entry in entries {
            let name = entry.file_name();
            if name == ".git" || self.workspace.hides(dir, dir_id, &name) {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                self.findings.unreadable += 1;
                continue;
            };
            // Only directories and regular files: links are not followed.
            if !kind.is_dir() && !kind.is_file() {
                continue;
            }
            let child_real = real.join(&name);
            if ignored(ignores, &child_real, kind.is_dir()) {
                continue;
            }
            let child_shown = shown_child(shown, &name);
            if kind.is_dir() {
                let Ok(child) = dir.open_dir_nofollow(&name) else {
                    self.findings.unreadable += 1;
                    continue;
                };
                ignores.push(IgnoreLevel::of(&child, &child_real));
                let stop = self.directory(&child, &child_real, &child_shown, ignores);
                ignores.pop();
                if stop {
                    return true;
                }
            } else if self.file(dir, &name, child_shown) {
                return true;
            }
        }
        false
    }

    /// Searches the file `name` of `dir`, shown as `relative`, if the glob
    /// accepts it. Returns whether to stop.
    fn file(&mut self, dir: &Dir, name: &OsStr, relative: String) -> bool {
        if self.glob.is_some_and(|glob| !glob.accepts(&relative, name)) {
            return false;
        }
        if self.findings.files >= MAX_FILES {
            self.findings.walk_cut = true;
            return true;
        }
        self.findings.files += 1;
        search_file(self.workspace, dir, name, &relative, self.regex, &mut self.findings);
        self.findings.more
    }
}

/// The ignore rules one directory adds: its `.ignore`, `.gitignore` and
/// `.git/info/exclude`, each read through the directory's handle.
struct IgnoreLevel {
    ignore: Gitignore,
    gitignore: Gitignore,
    exclude: Gitignore,
}

impl IgnoreLevel {
    fn of(dir: &Dir, real: &Path) -> Self {
        let exclude = dir
            .open_dir_nofollow(".git")
            .and_then(|git| git.open_dir_nofollow("info"))
            .map_or_else(|_| Gitignore::empty(), |info| ignore_file(&info, "exclude", real));
        Self {
            ignore: ignore_file(dir, ".ignore", real),
            gitignore: ignore_file(dir, ".gitignore", real),
            exclude,
        }
    }
}

/// The rules of the ignore file `name` in `dir` (real path `real`, which
/// its patterns are relative to); none when it is missing or unreadable.
fn ignore_file(dir: &Dir, name: &str, real: &Path) -> Gitignore {
    let Ok(file) = open_file_in(dir, OsStr::new(name)) else {
        return Gitignore::empty();
    };
    let mut bytes = Vec::new();
    if file.take(MAX_FILE_BYTES).read_to_end(&mut bytes).is_err() {
        return Gitignore::empty();
    }
    let mut builder = GitignoreBuilder::new(real);
    for line in String::from_utf8_lossy(&bytes).lines() {
        // A bad pattern is skipped, as git does.
        let _ = builder.add_line(None, line);
    }
    builder.build().unwrap_or_else(|_| Gitignore::empty())
}

/// The ignore rules of the directories from the workspace root down to the
/// parent of `real` (a directory's real path), opened from the root's
/// handle, since rules of a parent apply below it. Stops early at anything
/// that is no longer a directory.
fn ancestors_ignores(workspace: &Workspace, real: &Path) -> Vec<IgnoreLevel> {
    let mut levels = Vec::new();
    let Ok(relative) = real.strip_prefix(workspace.root()) else {
        return levels;
    };
    let Ok(mut dir) = workspace.open_real_dir(Path::new("")) else {
        return levels;
    };
    let mut at = workspace.root().to_path_buf();
    let names: Vec<&OsStr> = relative.iter().collect();
    for name in names {
        levels.push(IgnoreLevel::of(&dir, &at));
        match dir.open_dir_nofollow(name) {
            Ok(child) => dir = child,
            Err(_) => break,
        }
        at.push(name);
    }
    levels
}

/// Whether `path` is ignored, with the precedence of the `ignore` crate's
/// walker: `.ignore` files over `.gitignore` files over
/// `.git/info/exclude`, and within each kind the deepest directory's rules
/// first; a whitelist (`!pattern`) match keeps the path.
fn ignored(levels: &[IgnoreLevel], path: &Path, is_dir: bool) -> bool {
    let kinds: [fn(&IgnoreLevel) -> &Gitignore; 3] =
        [|level| &level.ignore, |level| &level.gitignore, |level| &level.exclude];
    for kind in kinds {
        for level in levels.iter().rev() {
            match kind(level).matched(path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
    }
    false
}

/// Adds the matching lines of the file `name` in `dir` to `findings`; the
/// file is opened without following a link.
fn search_file(
    workspace: &Workspace,
    dir: &Dir,
    name: &OsStr,
    relative: &str,
    regex: &regex::bytes::Regex,
    findings: &mut Findings,
) {
    let Ok(file) = open_file_in(dir, name) else {
        findings.unreadable += 1;
        return;
    };
    // What was opened, whatever the name: a protected file swapped in is
    // not read.
    if workspace.refuse_protected_file(&file, relative).is_err() {
        return;
    }
    match file.metadata() {
        Ok(metadata) if !metadata.is_file() => {
            findings.unreadable += 1;
            return;
        }
        Ok(metadata) if metadata.len() > MAX_FILE_BYTES => {
            findings.too_large += 1;
            return;
        }
        Ok(_) => {}
        Err(_) => {
            findings.unreadable += 1;
            return;
        }
    }
    let mut bytes = Vec::new();
    if file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).is_err() {
        findings.unreadable += 1;
        return;
    }
    if bytes.len() as u64 > MAX_FILE_BYTES {
        findings.too_large += 1;
        return;
    }
    if bytes.contains(&0) {
        findings.binary += 1;
        return;
    }
    if !regex.is_match(&bytes) {
        return;
    }
    let content = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    for (index, line) in content.split(|byte| *byte == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !regex.is_match(line) {
            continue;
        }
        if findings.lines.len() == MAX_MATCHES {
            findings.more = true;
            return;
        }
        findings
            .lines
            .push(format!("{relative}:{}: {}", index + 1, cut_line(line)));
    }
}

/// `line` as text (invalid UTF-8 replaced), cut to [`MAX_LINE_BYTES`].
fn cut_line(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    if text.len() <= MAX_LINE_BYTES {
        return text.into_owned();
    }
    let mut end = MAX_LINE_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[line cut: {} more bytes]", &text[..end], text.len() - end)
}

fn report(regex: &regex::bytes::Regex, path: &str, findings: &Findings) -> String {
    let mut output = String::new();
    if findings.lines.is_empty() {
        let _ = writeln!(
            output,
            "no matches for /{}/ in '{path}' ({} searched)",
            regex.as_str(),
            plural(findings.files, "file", "files")
        );
    }
    for line in &findings.lines {
        output.push_str(line);
        output.push('\n');
    }
    if findings.more {
        let _ = writeln!(
            output,
            "[stopped at {MAX_MATCHES} matches; narrow the search with path, glob or a more specific pattern]"
        );
    }
    if findings.walk_cut {
        let _ = writeln!(
            output,
            "[stopped after {MAX_FILES} files; narrow the search with path or glob]"
        );
    }
    let mut skipped = Vec::new();
    if findings.binary > 0 {
        skipped.push(plural(findings.binary, "binary file", "binary files"));
    }
    if findings.too_large > 0 {
        skipped.push(format!(
            "{} over {} MiB",
            plural(findings.too_large, "file", "files"),
            MAX_FILE_BYTES / (1024 * 1024)
        ));
    }
    if findings.unreadable > 0 {
        skipped.push(plural(findings.unreadable, "unreadable entry", "unreadable entries"));
    }
    if !skipped.is_empty() {
        let _ = writeln!(output, "[skipped {}]", skipped.join(", "));
    }
    output
}

#[cfg(test)]
mod tests;
