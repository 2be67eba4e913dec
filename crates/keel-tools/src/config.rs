//! `[tools]`: which built-in tools a session offers and how the shell runs.

use std::time::Duration;

use serde::Deserialize;

use super::workspace::{SandboxPolicy, ShellConfig};

/// `[tools]` in `keel.toml`. Every field has a default, so an absent
/// section offers every built-in tool with the shell in a workspace-write
/// sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawToolsConfig")]
pub struct ToolsConfig {
    /// Whether to offer the built-in tools at all (`clock` and the reading
    /// workspace tools); `false` leaves only MCP tools.
    pub builtin: bool,
    /// Whether to offer `write_file` and `edit_file`.
    pub write: bool,
    /// Whether to offer `shell`.
    pub shell: bool,
    /// What shell commands may change.
    pub sandbox: SandboxPolicy,
    /// Whether shell commands may use the network (off by default: a
    /// command the model runs should not reach other hosts unless allowed;
    /// full access always has it).
    pub network: bool,
    /// How long a command may run when the call does not say.
    pub shell_timeout: Duration,
    /// The longest timeout a call may ask for.
    pub shell_max_timeout: Duration,
    /// How long a client has to answer a call of a tool it executes before
    /// the call is answered as an error; `None` (`0` in the file): for ever.
    pub client_tool_timeout: Option<Duration>,
}

/// How long a client has to answer a call by default.
pub const DEFAULT_CLIENT_TOOL_TIMEOUT: Duration = Duration::from_secs(600);

impl Default for ToolsConfig {
    fn default() -> Self {
        let shell = ShellConfig::default();
        Self {
            builtin: true,
            write: true,
            shell: true,
            sandbox: shell.sandbox,
            network: shell.network,
            shell_timeout: shell.timeout,
            shell_max_timeout: shell.max_timeout,
            client_tool_timeout: Some(DEFAULT_CLIENT_TOOL_TIMEOUT),
        }
    }
}

/// `[tools]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolsConfig {
    #[serde(default = "yes")]
    builtin: bool,
    #[serde(default = "yes")]
    write: bool,
    #[serde(default = "yes")]
    shell: bool,
    #[serde(default)]
    sandbox: SandboxPolicy,
    #[serde(default)]
    network: bool,
    shell_timeout_secs: Option<u64>,
    shell_max_timeout_secs: Option<u64>,
    client_tool_timeout_secs: Option<u64>,
}

fn yes() -> bool {
    true
}

impl TryFrom<RawToolsConfig> for ToolsConfig {
    type Error = String;

    fn try_from(raw: RawToolsConfig) -> Result<Self, Self::Error> {
        let defaults = Self::default();
        let seconds = |value: Option<u64>, default: Duration, key: &str| match value {
            Some(0) => Err(format!("[tools]: `{key}` must be at least 1")),
            Some(secs) => Ok(Duration::from_secs(secs)),
            None => Ok(default),
        };
        let shell_timeout = seconds(raw.shell_timeout_secs, defaults.shell_timeout, "shell_timeout_secs")?;
        let shell_max_timeout = seconds(
            raw.shell_max_timeout_secs,
            defaults.shell_max_timeout.max(shell_timeout),
            "shell_max_timeout_secs",
        )?;
        if shell_max_timeout < shell_timeout {
            return Err("[tools]: `shell_max_timeout_secs` is shorter than `shell_timeout_secs`".to_owned());
        }
        Ok(Self {
            builtin: raw.builtin,
            write: raw.write,
            shell: raw.shell,
            sandbox: raw.sandbox,
            network: raw.network,
            shell_timeout,
            shell_max_timeout,
            client_tool_timeout: match raw.client_tool_timeout_secs {
                Some(0) => None,
                Some(secs) => Some(Duration::from_secs(secs)),
                None => defaults.client_tool_timeout,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `[tools]` table of a keel.toml.
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        tools: ToolsConfig,
    }

    fn tools(text: &str) -> Result<ToolsConfig, String> {
        toml::from_str::<File>(text)
            .map(|file| file.tools)
            .map_err(|error| error.message().to_owned())
    }

    #[test]
    fn every_tool_is_offered_by_default_with_a_workspace_write_shell() {
        let config = tools("").expect("empty file");
        assert_eq!(config, ToolsConfig::default());
        assert!(config.builtin && config.write && config.shell && !config.network);
        assert_eq!(config.sandbox, SandboxPolicy::WorkspaceWrite);
    }

    #[test]
    fn the_section_sets_tools_sandbox_and_timeouts() {
        let config = tools(
            "[tools]\nwrite = false\nsandbox = \"read-only\"\nnetwork = true\nshell_timeout_secs = 5\nshell_max_timeout_secs = 30\n",
        )
        .expect("valid");
        assert!(!config.write && config.shell && config.builtin && config.network);
        assert_eq!(config.sandbox, SandboxPolicy::ReadOnly);
        assert_eq!(config.shell_timeout, Duration::from_secs(5));
        assert_eq!(config.shell_max_timeout, Duration::from_secs(30));
        assert_eq!(config.client_tool_timeout, Some(DEFAULT_CLIENT_TOOL_TIMEOUT));
    }

    #[test]
    fn the_client_tool_timeout_is_set_in_seconds_and_zero_is_never() {
        let short = tools("[tools]\nclient_tool_timeout_secs = 3\n").expect("valid");
        assert_eq!(short.client_tool_timeout, Some(Duration::from_secs(3)));
        let never = tools("[tools]\nclient_tool_timeout_secs = 0\n").expect("valid");
        assert_eq!(never.client_tool_timeout, None);
    }

    #[test]
    fn bad_entries_are_one_line_errors() {
        for (text, expected) in [
            ("[tools]\nsandbox = \"none\"\n", "unknown variant `none`"),
            (
                "[tools]\nshell_timeout_secs = 0\n",
                "`shell_timeout_secs` must be at least 1",
            ),
            (
                "[tools]\nshell_timeout_secs = 60\nshell_max_timeout_secs = 10\n",
                "`shell_max_timeout_secs` is shorter",
            ),
            ("[tools]\nshel = true\n", "unknown field `shel`"),
        ] {
            let message = tools(text).expect_err(text);
            assert!(message.contains(expected), "{text}: {message}");
        }
    }
}
