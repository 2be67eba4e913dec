//! `[server]`: the ceiling on what API clients of `keel serve` may ask for
//! when they create a session.
//!
//! The operator's own choices (`[tools]`, `[approvals]`, `--model`, the
//! models of `keel.toml`) are not limited by it; a client may narrow them
//! freely and widen them only up to this ceiling. The defaults are safe: a
//! shell sandbox no looser than `workspace-write`, only the reading tools
//! auto-approved, no network, no `script:` models.

use std::num::NonZeroU64;
use std::path::PathBuf;

use serde::Deserialize;

use keel_tools::workspace::SandboxPolicy;
use keel_tools::workspace::sandbox::SandboxReads;

/// The tools an API client may set to `auto` unless `[server]
/// auto_approve` says otherwise: the ones that only read.
pub const READING_TOOLS: [&str; 4] = ["clock", "read_file", "list_dir", "search"];

/// `[server]` in `keel.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerPolicy {
    /// The most permissive shell sandbox an API client may ask for.
    #[serde(default = "default_max_sandbox")]
    pub max_sandbox: SandboxPolicy,
    /// The tools an API client may set to `auto` approval (also through
    /// `approvals.default = "auto"`); `"*"` allows every tool.
    #[serde(default = "default_auto_approve")]
    pub auto_approve: Vec<String>,
    /// Whether an API client may turn the shell's network on.
    #[serde(default)]
    pub allow_network: bool,
    /// The directory `script:` models named by API clients must be in;
    /// without it they may name none (but the server's own default model).
    #[serde(default)]
    pub script_dir: Option<PathBuf>,
    /// Delete sessions idle (no write) for this many days; the server
    /// sweeps in the background. `None`, the default, keeps them forever.
    #[serde(default)]
    pub retention_days: Option<u32>,
    /// With several nodes on one database: milliseconds a submission sent
    /// to a node that does not run its session waits for the owner's
    /// answer (`--relay-wait-ms` overrides it); `None`: the server's
    /// default (5 s).
    #[serde(default)]
    pub relay_wait_ms: Option<NonZeroU64>,
    /// What every restricted shell command of the server may read:
    /// `"anywhere"` (the default: everywhere but Keel's files and the other
    /// workspaces) or `"workspace"` (its workspace and the system's
    /// directories only), for hosts whose users' files must stay out of
    /// the sessions' reach.
    #[serde(default)]
    pub sandbox_reads: SandboxReads,
}

fn default_max_sandbox() -> SandboxPolicy {
    SandboxPolicy::WorkspaceWrite
}

fn default_auto_approve() -> Vec<String> {
    READING_TOOLS.iter().map(|tool| (*tool).to_owned()).collect()
}

impl Default for ServerPolicy {
    fn default() -> Self {
        Self {
            max_sandbox: default_max_sandbox(),
            auto_approve: default_auto_approve(),
            allow_network: false,
            script_dir: None,
            retention_days: None,
            relay_wait_ms: None,
            sandbox_reads: SandboxReads::default(),
        }
    }
}

impl ServerPolicy {
    /// Whether an API client may set `tool` to `auto`.
    pub fn may_auto_approve(&self, tool: &str) -> bool {
        self.auto_approve
            .iter()
            .any(|allowed| allowed == "*" || allowed == tool)
    }

    /// Whether an API client may set every tool to `auto`.
    pub fn may_auto_approve_all(&self) -> bool {
        self.auto_approve.iter().any(|allowed| allowed == "*")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeelConfig;

    fn server(text: &str) -> Result<ServerPolicy, String> {
        toml::from_str::<KeelConfig>(text)
            .map(|config| config.server)
            .map_err(|error| error.message().to_owned())
    }

    #[test]
    fn the_defaults_are_the_safe_ceiling() {
        let policy = server("").expect("empty file");
        assert_eq!(policy, ServerPolicy::default());
        assert_eq!(policy.max_sandbox, SandboxPolicy::WorkspaceWrite);
        assert!(policy.may_auto_approve("read_file") && policy.may_auto_approve("clock"));
        assert!(!policy.may_auto_approve("shell") && !policy.may_auto_approve("write_file"));
        assert!(!policy.may_auto_approve_all() && !policy.allow_network && policy.script_dir.is_none());
    }

    #[test]
    fn the_section_raises_the_ceiling() {
        let policy = server(
            "[server]\nmax_sandbox = \"full-access\"\nauto_approve = [\"*\"]\nallow_network = true\nscript_dir = \"scripts\"\n",
        )
        .expect("valid");
        assert_eq!(policy.max_sandbox, SandboxPolicy::FullAccess);
        assert!(policy.may_auto_approve("shell") && policy.may_auto_approve_all());
        assert!(policy.allow_network);
        assert_eq!(policy.script_dir, Some(PathBuf::from("scripts")));
        assert_eq!(
            server("[server]\nretention_days = 30\n").expect("valid").retention_days,
            Some(30)
        );
    }

    #[test]
    fn bad_entries_are_one_line_errors() {
        for (text, expected) in [
            ("[server]\nmax_sandbox = \"none\"\n", "unknown variant `none`"),
            ("[server]\nscriptdir = \"x\"\n", "unknown field `scriptdir`"),
            ("[server]\nauto_approve = \"shell\"\n", "invalid type"),
        ] {
            let message = server(text).expect_err(text);
            assert!(
                message.contains(expected) && !message.contains('\n'),
                "{text}: {message}"
            );
        }
    }
}
