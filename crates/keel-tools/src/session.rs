//! The tool set of one session, assembled from `keel.toml`: the built-in
//! tools, the workspace tools with the shell's sandbox, and the tools of the
//! session's MCP servers.

use std::path::{Path, PathBuf};

use super::ToolSet;
use super::ToolsConfig;
use super::mcp::McpConfig;
use super::mcp::start_servers;
use super::workspace::{self, SandboxStatus, ShellConfig, ShellTool, WorkspaceToolsConfig};

/// What [`session_tools`] assembled.
#[derive(Debug)]
pub struct SessionTools {
    /// The tools to offer the model. MCP tools keep their servers running
    /// until this set (and every clone of it) is dropped.
    pub tools: ToolSet,
    /// The sandbox shell commands will run under, when the shell is offered.
    pub sandbox: Option<SandboxStatus>,
    /// What the user should know: MCP servers that did not start, a sandbox
    /// that the kernel cannot enforce. One line each.
    pub warnings: Vec<String>,
}

/// Assembles a session's tools. `launcher` is the `keel` binary whose hidden
/// `sandbox-exec` command runs shell commands under the sandbox, and MCP
/// servers out of sight of other sessions' workspaces; without it the
/// shell runs unsandboxed (and says so).
///
/// MCP servers start concurrently; one that fails is left out with a warning
/// rather than failing the session.
pub async fn session_tools(
    tools: &ToolsConfig,
    mcp: &McpConfig,
    workspace: &Path,
    launcher: Option<PathBuf>,
) -> SessionTools {
    let mut set = ToolSet::new();
    let mut warnings = Vec::new();
    let mut sandbox = None;
    let mcp_launcher = launcher.clone();
    let servers = start_servers(mcp, workspace, mcp_launcher.as_deref());
    if tools.builtin {
        set = ToolSet::builtin();
        let shell = tools.shell.then(|| ShellConfig {
            sandbox: tools.sandbox,
            network: tools.network,
            launcher,
            timeout: tools.shell_timeout,
            max_timeout: tools.shell_max_timeout,
            ..ShellConfig::default()
        });
        if let Some(shell) = &shell {
            let status = ShellTool::new(shell.clone()).expected_sandbox().await;
            if !status.enforced && status.policy != workspace::SandboxPolicy::FullAccess {
                warnings.push(format!(
                    "shell commands are not sandboxed ({} asked for): {}",
                    status.policy, status.detail
                ));
            }
            sandbox = Some(status);
        }
        let config = WorkspaceToolsConfig {
            write: tools.write,
            shell,
        };
        for tool in workspace::tools(config) {
            set.add(tool);
        }
    }
    let servers = servers.await;
    for error in servers.failures() {
        warnings.push(format!("the MCP server '{}' was left out: {error}", error.server()));
    }
    // Watched, so a server's changed tool list reaches the model.
    for server in servers.servers() {
        set.add_source(server.tool_source());
    }
    SessionTools {
        tools: set,
        sandbox,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_config_chooses_the_tools_and_the_shell_reports_its_sandbox() {
        let dir = tempfile::tempdir().expect("dir");
        let names = |set: &ToolSet| set.specs().into_iter().map(|spec| spec.name).collect::<Vec<_>>();

        let all = session_tools(&ToolsConfig::default(), &McpConfig::default(), dir.path(), None).await;
        assert_eq!(
            names(&all.tools),
            [
                "clock",
                "edit_file",
                "list_dir",
                "read_file",
                "search",
                "shell",
                "write_file"
            ]
        );
        // Without a launcher the shell cannot be sandboxed, and the user is told.
        let status = all.sandbox.expect("the shell is offered");
        assert!(!status.enforced);
        assert_eq!(status.detail, "no sandbox launcher is configured");
        assert_eq!(all.warnings.len(), 1, "{:?}", all.warnings);
        assert!(all.warnings[0].starts_with("shell commands are not sandboxed (workspace-write asked for)"));

        let reading = ToolsConfig {
            write: false,
            shell: false,
            ..ToolsConfig::default()
        };
        let reading = session_tools(&reading, &McpConfig::default(), dir.path(), None).await;
        assert_eq!(names(&reading.tools), ["clock", "list_dir", "read_file", "search"]);
        assert!(reading.sandbox.is_none() && reading.warnings.is_empty());

        let none = ToolsConfig {
            builtin: false,
            ..ToolsConfig::default()
        };
        assert!(
            session_tools(&none, &McpConfig::default(), dir.path(), None)
                .await
                .tools
                .is_empty()
        );
    }

    #[tokio::test]
    async fn an_mcp_server_that_does_not_start_is_a_warning() {
        let dir = tempfile::tempdir().expect("dir");
        let tools = ToolsConfig {
            builtin: false,
            ..ToolsConfig::default()
        };
        let mcp: McpConfig =
            toml::from_str("[servers.gone]\ncommand = \"/nonexistent/keel-mcp\"\n").expect("the [mcp] table");
        let built = session_tools(&tools, &mcp, dir.path(), None).await;
        assert!(built.tools.is_empty());
        assert_eq!(built.warnings.len(), 1);
        assert!(
            built.warnings[0].starts_with("the MCP server 'gone' was left out: "),
            "{}",
            built.warnings[0]
        );
    }
}
