//! Opening a session on the local database, shared by `keel run` and
//! `keel chat`: the session id, the workspace and the tools.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use keel::agent::AgentConfig;
use keel::config::KeelConfig;
use keel::protocol::new_id;
use keel::store::{CheckpointStore, ServeLock, SharedHold, StoreError};
use keel::tools::workspace::SandboxPolicy;

/// Which tools a session offers and where it works.
#[derive(Args, Debug, Clone)]
pub(crate) struct ToolArgs {
    /// Offer no tools to the model (by default: the built-in tools, the
    /// workspace tools and the MCP servers of keel.toml).
    #[arg(long)]
    pub(crate) no_tools: bool,
    /// What shell commands may change, instead of keel.toml's `[tools]
    /// sandbox` (default workspace-write).
    #[arg(long, value_name = "POLICY")]
    pub(crate) sandbox: Option<SandboxPolicy>,
    /// The session's working directory, to which the file tools are
    /// confined [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
}

impl ToolArgs {
    /// The workspace directory, made absolute; it must exist.
    pub(crate) fn workspace(&self) -> anyhow::Result<PathBuf> {
        let workspace = match &self.workspace {
            Some(dir) => dir.clone(),
            None => std::env::current_dir().context("cannot read the current directory")?,
        };
        workspace
            .canonicalize()
            .with_context(|| format!("cannot use {} as the workspace", workspace.display()))
    }
}

/// The session to open: `session` if the store has it (an error naming it
/// otherwise), or a new id; with the command's shared hold on the database
/// (see [`ServeLock::share`]), to keep while the session is open. A stored
/// session of a database that a running `keel serve` holds is refused:
/// opening it here would take it from the server, whose next request for
/// it would fail. A new one is opened without a hold (the server cannot
/// know of it).
pub(crate) async fn session_id(
    store: &dyn CheckpointStore,
    database: &Path,
    session: Option<&str>,
) -> anyhow::Result<(String, Option<SharedHold>)> {
    let hold = match ServeLock::share(database) {
        Ok(hold) => Ok(hold),
        Err(StoreError::Held { holder, .. }) => Err(holder),
        Err(error) => return Err(error.into()),
    };
    match session {
        Some(id) => {
            if store.session_summary(id).await?.is_none() {
                bail!("unknown session '{id}' (omit --session to start a new one)");
            }
            match hold {
                Ok(hold) => Ok((id.to_owned(), Some(hold))),
                Err(holder) => bail!(
                    "session '{id}' is served by {holder} on the database {}: talk to it through the server \
                     (`keel chat --server URL --session {id}`), or stop the server first",
                    database.display()
                ),
            }
        }
        None => Ok((new_id(), hold.ok())),
    }
}

/// The configuration of session `session_id` working in `workspace`, with
/// keel.toml's approval rules and the tools `tools` asks for (built-in,
/// workspace and MCP tools; none with `--no-tools`). What could not be set up
/// is in the config's `startup_warnings`.
pub(crate) async fn agent_config(
    session_id: String,
    store: Arc<dyn CheckpointStore>,
    model: Arc<dyn keel::Model>,
    keel_config: &KeelConfig,
    tools: &ToolArgs,
    workspace: PathBuf,
) -> AgentConfig {
    let mut config = AgentConfig::new(session_id, store, model);
    config.approvals = keel_config.approvals.clone();
    config.workspace = workspace;
    if !tools.no_tools {
        let mut tools_config = keel_config.tools.clone();
        if let Some(policy) = tools.sandbox {
            tools_config.sandbox = policy;
        }
        // The shell's commands are started through this binary's hidden
        // `sandbox-exec` command, which applies the sandbox and runs them.
        let launcher = std::env::current_exe().ok();
        keel_config.install_tools(&mut config, &tools_config, launcher).await;
    }
    config
}
