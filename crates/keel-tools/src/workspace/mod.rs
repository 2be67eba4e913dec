//! Workspace tools: the built-in tools that let a model work on the files of
//! its session's workspace directory.
//!
//! | tool | does | read only |
//! |---|---|---|
//! | `read_file` | a text file with line numbers, by line range | yes |
//! | `list_dir` | a directory's entries, to a small depth | yes |
//! | `search` | regex search of file contents (respects `.gitignore`) | yes |
//! | `write_file` | creates or replaces a file, atomically | no |
//! | `edit_file` | exact string replacement in a file, atomically | no |
//! | `shell` | `sh -c` in the workspace, bounded, optionally sandboxed | no |
//!
//! Every path is confined to the workspace by [`Workspace`], which resolves
//! it through directory handles opened beneath the workspace root; the file
//! tools read, write and walk through those handles, so a symbolic link
//! swapped in while they run cannot lead them out (see `paths.rs` for what
//! that guarantees and what it cannot). They refuse Keel's protected files
//! (its database, configuration, lock and token; see
//! [`crate::protected`]) by identity and location. A server session's
//! workspace is a directory Keel created for it and recorded (see
//! [`WorkspaceRoot`]); the tools check every call that it still is. The shell cannot be
//! confined by path checks; [`sandbox`] restricts what its commands may
//! write, where the kernel supports Landlock.
//!
//! [`tools`] builds the set from a [`WorkspaceToolsConfig`].

mod created;
mod edit;
mod list;
mod open;
mod paths;
mod read;
pub mod sandbox;
mod search;
mod shell;
mod write;

use std::sync::Arc;

pub use self::created::{Marker, Origin, REGISTRY_DIR, WorkspaceError, WorkspaceRoot};
pub use self::edit::EditFile;
pub use self::list::ListDir;
pub use self::paths::{Resolved, Workspace};
pub use self::read::{ReadFile, read_workspace_text};
pub use self::sandbox::{SandboxPolicy, SandboxStatus};
pub use self::search::Search;
pub use self::shell::{SHELL_PASSED_ENV, ShellConfig, ShellTool};
pub use self::write::WriteFile;
use super::{Tool, ToolError};

/// Which workspace tools to build.
#[derive(Debug, Clone)]
pub struct WorkspaceToolsConfig {
    /// Whether to include the tools that change files (`write_file`,
    /// `edit_file`). The reading tools are always included.
    pub write: bool,
    /// The `shell` tool's configuration; `None` leaves the shell out.
    pub shell: Option<ShellConfig>,
}

impl Default for WorkspaceToolsConfig {
    /// Every tool; the shell with [`ShellConfig::default`].
    fn default() -> Self {
        Self {
            write: true,
            shell: Some(ShellConfig::default()),
        }
    }
}

impl WorkspaceToolsConfig {
    /// Only the reading tools: `read_file`, `list_dir`, `search`.
    pub fn read_only() -> Self {
        Self {
            write: false,
            shell: None,
        }
    }
}

/// The workspace tools `config` asks for, ready for [`super::ToolSet::add`]:
/// `read_file`, `list_dir`, `search`, then (if enabled) `write_file`,
/// `edit_file`, `shell`.
pub fn tools(config: WorkspaceToolsConfig) -> Vec<Arc<dyn Tool>> {
    let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(ReadFile), Arc::new(ListDir), Arc::new(Search)];
    if config.write {
        tools.push(Arc::new(WriteFile));
        tools.push(Arc::new(EditFile));
    }
    if let Some(shell) = config.shell {
        tools.push(Arc::new(ShellTool::new(shell)));
    }
    tools
}

/// The arguments of one call, with typed accessors whose errors name the
/// argument. The tool set checks the schema first; these checks keep a tool
/// correct when it is called directly.
struct Arguments<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl<'a> Arguments<'a> {
    fn required_str(&self, name: &str) -> Result<&'a str, ToolError> {
        match self.0.get(name) {
            Some(serde_json::Value::String(value)) => Ok(value),
            Some(_) => Err(ToolError::InvalidArguments(format!("'{name}' must be a string"))),
            None => Err(ToolError::InvalidArguments(format!("'{name}' is required"))),
        }
    }

    fn optional_str(&self, name: &str) -> Result<Option<&'a str>, ToolError> {
        match self.0.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(value)) => Ok(Some(value)),
            Some(_) => Err(ToolError::InvalidArguments(format!("'{name}' must be a string"))),
        }
    }

    /// A non-negative integer no larger than `max`, if given.
    fn optional_u64(&self, name: &str, min: u64, max: u64) -> Result<Option<u64>, ToolError> {
        match self.0.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(value) => match value.as_u64() {
                Some(number) if (min..=max).contains(&number) => Ok(Some(number)),
                _ => Err(ToolError::InvalidArguments(format!(
                    "'{name}' must be an integer from {min} to {max}"
                ))),
            },
        }
    }

    fn optional_bool(&self, name: &str) -> Result<Option<bool>, ToolError> {
        match self.0.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Bool(value)) => Ok(Some(*value)),
            Some(_) => Err(ToolError::InvalidArguments(format!("'{name}' must be true or false"))),
        }
    }
}

/// Runs blocking file-system work off the async workers. A panic in `work`
/// is passed on, so the tool set reports the tool as crashed.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
        Err(error) => Err(ToolError::Failed(format!("the call was cancelled: {error}"))),
    }
}

/// An I/O failure on `path` as a message for the model.
fn io_failure(what: &str, path: &str, error: &std::io::Error) -> ToolError {
    ToolError::Failed(format!("cannot {what} '{path}': {error}"))
}

/// `count` with the right form of its noun ("1 line", "2 lines").
fn plural(count: usize, one: &str, many: &str) -> String {
    if count == 1 {
        format!("1 {one}")
    } else {
        format!("{count} {many}")
    }
}

/// Calls `tool` directly (no schema check) in `workspace`, for the tools'
/// unit tests.
#[cfg(test)]
async fn test_call(
    tool: &dyn Tool,
    workspace: &std::path::Path,
    arguments: serde_json::Value,
) -> Result<String, ToolError> {
    let context = crate::ToolContext {
        session_id: "s".into(),
        workspace: workspace.to_path_buf(),
    };
    let serde_json::Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    tool.call(arguments, &context).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_set_has_the_tools_asked_for() {
        let names = |config| -> Vec<(String, bool)> {
            tools(config)
                .iter()
                .map(|tool| (tool.spec().name, tool.read_only()))
                .collect()
        };
        let expected_reading = [
            ("read_file".to_string(), true),
            ("list_dir".to_string(), true),
            ("search".to_string(), true),
        ];
        assert_eq!(names(WorkspaceToolsConfig::read_only()), expected_reading);
        let mut everything = expected_reading.to_vec();
        everything.extend([
            ("write_file".to_string(), false),
            ("edit_file".to_string(), false),
            ("shell".to_string(), false),
        ]);
        assert_eq!(names(WorkspaceToolsConfig::default()), everything);
        for tool in tools(WorkspaceToolsConfig::default()) {
            assert_eq!(tool.parallel_safe(), tool.read_only(), "{}", tool.spec().name);
            let schema = tool.spec().parameters;
            assert!(jsonschema::validator_for(&schema).is_ok(), "{}", tool.spec().name);
        }
    }

    #[test]
    fn plurals() {
        assert_eq!(plural(1, "match", "matches"), "1 match");
        assert_eq!(plural(0, "match", "matches"), "0 matches");
        assert_eq!(plural(3, "line", "lines"), "3 lines");
    }
}
