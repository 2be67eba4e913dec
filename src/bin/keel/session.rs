//! Opening a session on the local database, shared by `keel run` and
//! `keel chat`: the session id, the workspace and the tools.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use keel::agent::{AgentConfig, ProjectDocs};
use keel::config::KeelConfig;
use keel::protocol::new_id;
use keel::store::{CheckpointStore, StoreError};
use keel::tools::workspace::SandboxPolicy;

use crate::ModelArgs;
use crate::db::{DbArgs, Hold};

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

/// What a session keeps of how it was created, so that continuing it needs
/// no flags again: the settings object a server stores (its `model` and
/// `instructions`; the CLI writes the same shape, so either can resume the
/// other's sessions).
#[derive(Debug, Default, Clone, serde::Deserialize, serde::Serialize)]
pub(crate) struct StoredSettings {
    /// The model spec the session was created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    /// Its system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instructions: Option<String>,
}

impl StoredSettings {
    /// The settings stored with session `id` (defaults when it has none, or
    /// none this binary understands). Errors when the session does not exist.
    pub(crate) async fn of(store: &dyn CheckpointStore, id: &str) -> anyhow::Result<Self> {
        let Some(summary) = store.session_summary(id).await? else {
            bail!("unknown session '{id}' (omit --session to start a new one, or use --new-session {id})");
        };
        Ok(summary
            .context
            .settings
            .and_then(|value| serde_json::from_value(value).ok())
            .unwrap_or_default())
    }

    /// The value to store in a new session's context.
    pub(crate) fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// The id for a new session: `chosen` if the store does not have it yet (an
/// error naming it otherwise), or a fresh one.
async fn new_session_id(store: &dyn CheckpointStore, chosen: Option<&str>) -> anyhow::Result<String> {
    match chosen {
        Some(id) => {
            if store.session_summary(id).await?.is_some() {
                bail!("session '{id}' exists (use --session {id} to continue it)");
            }
            Ok(id.to_owned())
        }
        None => Ok(new_id()),
    }
}

/// A session `run` or `chat` is about to open: its store, id, what it
/// keeps from its creation, its model, and the command's hold on the
/// database.
pub(crate) struct Opening {
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) id: String,
    pub(crate) stored: StoredSettings,
    pub(crate) model: Arc<dyn keel::Model>,
    pub(crate) spec: String,
    pub(crate) hold: Option<Hold>,
}

impl Opening {
    /// Prepares `session` (a stored one, whose model and prompt it keeps)
    /// or a new session (under `new_session` if given). A new session's
    /// model is built before the database is touched, so bad input leaves
    /// nothing behind; a session being continued is read first, for the
    /// model it keeps (`create_on_resume`: whether a missing database is
    /// created then, to report the unknown session in it).
    pub(crate) async fn prepare(
        db: &DbArgs,
        model: &ModelArgs,
        keel_config: &KeelConfig,
        session: Option<&str>,
        new_session: Option<&str>,
        create_on_resume: bool,
    ) -> anyhow::Result<Self> {
        let (store, id, stored, model, spec) = match session {
            Some(id) => {
                let store = db.open(create_on_resume).await?;
                let stored = StoredSettings::of(store.as_ref(), id).await?;
                let (model, spec) = model.build(keel_config, stored.model.as_deref())?;
                (store, id.to_owned(), stored, model, spec)
            }
            None => {
                let (model, spec) = model.build(keel_config, None)?;
                let store = db.open(true).await?;
                let id = new_session_id(store.as_ref(), new_session).await?;
                (store, id, StoredSettings::default(), model, spec)
            }
        };
        let hold = hold_database(db, session).await?;
        Ok(Self {
            store,
            id,
            stored,
            model,
            spec,
            hold,
        })
    }
}

/// The command's shared hold on `database` (see [`ServeLock::share`]), to
/// keep while a session is open, so that no `keel serve` starts on the
/// database and takes the session meanwhile. A stored session (`resumed`)
/// of a database that a running `keel serve` holds is refused: opening it
/// here would take it from the server, whose next request for it would
/// fail. A new session is opened without a hold then (the server cannot
/// know of it).
async fn hold_database(db: &DbArgs, resumed: Option<&str>) -> anyhow::Result<Option<Hold>> {
    match (db.share().await, resumed) {
        (Ok(hold), _) => Ok(Some(hold)),
        (Err(StoreError::Held { holder, .. }), Some(id)) => bail!(
            "session '{id}' is served by {holder} on the database {}: talk to it through the server \
             (`keel chat --server URL --session {id}`), or stop the server first",
            db.location()?
        ),
        (Err(StoreError::Held { .. }), None) => Ok(None),
        (Err(error), _) => Err(error.into()),
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
        // `sandbox-exec` command, which applies the sandbox and runs them:
        // executed as the running binary itself, never by a path a command
        // could replace.
        let launcher = Some(keel::tools::workspace::sandbox::launcher::SELF_EXE.into());
        keel_config.install_tools(&mut config, &tools_config, launcher).await;
    }
    config
}

/// The system prompt of a CLI session: `--system` when given (an empty one
/// is none); else what a resumed session was created with; else, for a new
/// session, its bot's default from keel.toml (Keel's coding-agent prompt
/// for a coding bot with tools). Stored with a new session, so a later
/// change of keel.toml does not change the conversation.
pub(crate) fn session_instructions(
    keel_config: &KeelConfig,
    bot_id: &str,
    system: Option<&str>,
    stored: Option<String>,
    resumed: bool,
    tools: &ToolArgs,
) -> Option<String> {
    let chosen = match system {
        Some(text) => Some(text.to_owned()),
        None if resumed => stored,
        None => keel_config.bot(bot_id).default_instructions(!tools.no_tools),
    };
    chosen.filter(|text| !text.is_empty())
}

/// Where a CLI session reads its project instructions (`AGENTS.md` in its
/// workspace): only for a coding bot with tools, as the server does.
pub(crate) fn project_docs(
    keel_config: &KeelConfig,
    bot_id: &str,
    tools: &ToolArgs,
    workspace: &std::path::Path,
) -> Option<ProjectDocs> {
    (keel_config.bot(bot_id).is_coding_agent() && !tools.no_tools).then(|| ProjectDocs::new(workspace))
}
