//! Assembling a session from `keel.toml`, shared by `keel run` and `keel serve`.

use std::path::PathBuf;

use super::{KeelConfig, ToolsConfig};
use keel_agent::AgentConfig;
use keel_protocol::SandboxInfo;
use keel_tools::session_tools;

impl KeelConfig {
    /// Gives `agent` the tools `tools` describes plus this config's MCP
    /// servers, working in `agent.workspace`: the tool set, the shell's
    /// sandbox (recorded in `session_started`) and the warnings about what
    /// could not be set up. `launcher` is the `keel` binary whose hidden
    /// `sandbox-exec` command runs shell commands under the sandbox.
    pub async fn install_tools(&self, agent: &mut AgentConfig, tools: &ToolsConfig, launcher: Option<PathBuf>) {
        let built = session_tools(tools, &self.mcp, &agent.workspace, launcher).await;
        agent.tools = built.tools;
        agent.sandbox = built.sandbox.as_ref().map(SandboxInfo::from);
        agent.startup_warnings = built.warnings;
    }

    /// The provider behind a model spec (`openai` for `openai:gpt-4.1-mini`,
    /// the entry's provider for a model named in this file), for metrics and
    /// listings; `None` for an unknown name.
    pub fn provider_of(&self, spec: &str) -> Option<String> {
        match spec.split_once(':') {
            Some((provider, _)) => Some(provider.to_owned()),
            None => self.models.get(spec).map(|entry| entry.provider.clone()),
        }
    }
}
