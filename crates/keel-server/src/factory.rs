//! How a server session is assembled from its settings.
//!
//! What a client may ask for is bounded by the operator's ceiling (see
//! `ceiling`): checked at creation and again at every load. Settings that
//! no longer fit, or no longer parse, keep the session from loading rather
//! than loading it with defaults (which could turn a tool back on).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::budget::{BudgetGate, Budgets};
use super::ceiling::{ScriptDir, check_overrides, resolve_script};
use super::error::ApiError;
use super::metrics::{MeteredModel, Metrics};
use super::settings::{SessionSettings, ToolsOverrides, merge_approvals};
use super::tenant_ceiling::{Ceiling, ceiling_of};
use keel_agent::{AgentConfig, ProjectDocs, QueueMode, SessionContext};
use keel_config::{KeelConfig, ToolsConfig};
use keel_model::Model;
use keel_store::CheckpointStore;
use keel_tools::workspace::{WorkspaceError, WorkspaceRoot};
/// Builds the agents of server sessions.
pub(crate) struct SessionFactory {
    pub(crate) keel: Arc<KeelConfig>,
    /// Where API clients' `script:` models may come from (`[server]
    /// script_dir`, resolved).
    pub(crate) script_dir: Option<ScriptDir>,
    /// The tenants' own script directories (`[tenants.<id>] script_dir`),
    /// each inside the server's.
    pub(crate) tenant_script_dirs: BTreeMap<String, ScriptDir>,
    /// The model of sessions that name none.
    pub(crate) default_model: Option<String>,
    /// Each session works in a directory of its own under this one.
    pub(crate) workspace_root: PathBuf,
    /// The `keel` binary that runs shell commands under the sandbox.
    pub(crate) launcher: Option<PathBuf>,
    pub(crate) store: Arc<dyn CheckpointStore>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) max_steps: u32,
    pub(crate) submission_capacity: usize,
    /// The budgets; each session's turns ask them before every model step.
    pub(crate) budgets: Arc<Budgets>,
    /// Where the sessions' spans go (nowhere unless traces are exported).
    pub(crate) spans: keel_agent::telemetry::Spans,
}

impl SessionFactory {
    /// The model spec a session with `settings` uses.
    pub(crate) fn model_spec(&self, settings: &SessionSettings) -> Option<String> {
        settings.model.clone().or_else(|| self.default_model.clone())
    }

    /// The ceiling of `tenant`'s sessions.
    fn ceiling(&self, tenant: &str) -> Ceiling {
        ceiling_of(&self.keel, tenant)
    }

    /// Where `tenant`'s `script:` models may come from: its own directory,
    /// else the server's.
    fn script_dir_of(&self, tenant: &str) -> Option<&ScriptDir> {
        self.tenant_script_dirs.get(tenant).or(self.script_dir.as_ref())
    }

    /// Checks that a new session's settings fit its tenant's ceiling
    /// (`403`) and can be built (`400`); returns the model spec to store:
    /// a `script:` path resolved to an absolute one, so that a server
    /// started from another directory still finds the file.
    pub(crate) async fn check(&self, tenant: &str, settings: &SessionSettings) -> Result<String, ApiError> {
        let ceiling = self.ceiling(tenant);
        check_overrides(
            &self.keel,
            &ceiling,
            settings.tools.as_ref(),
            settings.approvals.as_ref(),
        )?;
        let spec = self.model_spec(settings).ok_or_else(|| {
            ApiError::InvalidRequest(
                "no model: name one in `model`, or start the server with --model or a keel.toml `model`".to_owned(),
            )
        })?;
        self.check_model(tenant, &spec).await
    }

    /// Checks that `spec` can be built here (the `model` of a new session
    /// or of a `PATCH`): `403` for a script beyond the ceiling, `404` for a
    /// model this server cannot build; returns the spec to store.
    pub(crate) async fn check_model(&self, tenant: &str, spec: &str) -> Result<String, ApiError> {
        let (_, resolved) = self.load_model(tenant, spec).await?;
        Ok(resolved)
    }

    /// Whether the operator chose `spec`: the server's default model, one
    /// named in `keel.toml`, or a bot's model there (a default `script:`
    /// model in any spelling of its path).
    fn operator_model(&self, spec: &str) -> bool {
        self.keel.models.contains_key(spec)
            || self.keel.bots.values().any(|bot| bot.model.as_deref() == Some(spec))
            || self
                .default_model
                .as_deref()
                .is_some_and(|default| default == spec || absolute_spec(default) == absolute_spec(spec))
    }

    /// A new session's settings: what the request gave, completed from its
    /// bot's `[bots.<id>]` defaults (model, tools, queue mode) and the
    /// system prompt resolved (the request's, the bot's, or Keel's coding
    /// prompt for a coding agent with tools). Stored as resolved, so a
    /// later change of `keel.toml` or of the default prompt does not change
    /// the session.
    pub(crate) fn with_bot_defaults(
        &self,
        tenant: &str,
        bot_id: &str,
        mut settings: SessionSettings,
        queue_mode: Option<QueueMode>,
    ) -> SessionSettings {
        let bot = self.keel.bot(bot_id);
        settings.model = settings.model.or_else(|| bot.model.clone());
        if !bot.is_coding_agent() {
            // A chat bot's built-in tools are off unless the request says.
            let asked = settings.tools.unwrap_or_default();
            settings.tools = Some(ToolsOverrides {
                builtin: asked.builtin.or(Some(false)),
                write: asked.write.or(Some(false)),
                shell: asked.shell.or(Some(false)),
                ..asked
            });
        }
        let tools = self.tools_config(tenant, &settings);
        let has_tools =
            tools.builtin || tools.write || tools.shell || self.keel.mcp.servers.values().any(|server| server.enabled);
        settings.instructions = settings.instructions.or_else(|| bot.default_instructions(has_tools));
        settings.queue_mode = queue_mode.unwrap_or_else(|| bot.queue_mode());
        settings.project_instructions = bot.is_coding_agent();
        settings
    }

    /// The `[tools]` a session of `tenant` with `settings` gets: its
    /// overrides over its tenant's narrowed `[tools]`.
    fn tools_config(&self, tenant: &str, settings: &SessionSettings) -> ToolsConfig {
        let base = self.ceiling(tenant).tools;
        match &settings.tools {
            Some(overrides) => overrides.apply(&base),
            None => base,
        }
    }

    /// Builds the model of `spec` on a blocking thread (a script is a file
    /// read), with the spec as it should be stored. A `script:` spec the
    /// operator did not choose must name a file in the script directory
    /// (`403` otherwise); a spec that cannot be built is `404
    /// model_not_found`.
    async fn load_model(&self, tenant: &str, spec: &str) -> Result<(Arc<dyn Model>, String), ApiError> {
        let spec = match spec.strip_prefix("script:") {
            Some(path) if !self.operator_model(spec) => {
                let resolved = resolve_script(self.script_dir_of(tenant), spec, path).await?;
                format!("script:{}", resolved.display())
            }
            _ => absolute_spec(spec),
        };
        let keel = Arc::clone(&self.keel);
        let built = spec.clone();
        let model = tokio::task::spawn_blocking(move || keel.model(&built))
            .await
            .map_err(|error| ApiError::Internal(format!("building the model failed: {error}")))?
            .map_err(|error| ApiError::ModelNotFound(error.to_string()))?;
        Ok((model, spec))
    }

    /// The configuration that opens `session_id` with `settings`. For a new
    /// session, `context` is stored with it.
    pub(crate) async fn agent_config(
        &self,
        session_id: &str,
        settings: &SessionSettings,
        context: SessionContext,
    ) -> Result<AgentConfig, ApiError> {
        // The ceiling may have been lowered since the session was created.
        let refused = |error: ApiError| match error {
            ApiError::Forbidden { code, message } => ApiError::Forbidden {
                code,
                message: format!(
                    "session '{session_id}' is not loaded: its settings are beyond this server's ceiling: {message}"
                ),
            },
            other => ApiError::Internal(format!("cannot load session '{session_id}': {other}")),
        };
        let tenant = context.tenant.clone();
        let ceiling = self.ceiling(&tenant);
        check_overrides(
            &self.keel,
            &ceiling,
            settings.tools.as_ref(),
            settings.approvals.as_ref(),
        )
        .map_err(refused)?;
        let spec = self.model_spec(settings).ok_or_else(|| {
            model_unavailable(
                session_id,
                None,
                "it names no model and the server has no default model",
            )
        })?;
        let (model, _) = self.load_model(&tenant, &spec).await.map_err(|error| match error {
            // Beyond the ceiling: its code, and the way out.
            ApiError::Forbidden { code, message } => ApiError::Forbidden {
                code,
                message: format!(
                    "session '{session_id}' is not loaded: its model is beyond this server's ceiling: \
                         {message}; {SWITCH_MODEL}"
                ),
            },
            ApiError::ModelNotFound(message) => model_unavailable(session_id, Some(&spec), &message),
            other => refused(other),
        })?;
        let provider = self.keel.provider_of(&spec).unwrap_or_else(|| "unknown".to_owned());
        let bot = context.bot_id.clone();
        let model = Arc::new(MeteredModel::new(model, provider, bot, Arc::clone(&self.metrics)));
        // A stored session's workspace: the directory Keel created for it,
        // checked by identity (or made, or adopted, see `created.rs`).
        let workspace = self
            .with_workspaces(&context.tenant, session_id, |root, name| root.open_existing(name))
            .await?;
        let mut config = AgentConfig::new(session_id, Arc::clone(&self.store), model);
        config.spans = self.spans.clone();
        // Asked before each model step; it reads the store only while a
        // budget applies to the session or its tenant.
        config.step_gate = Some(Arc::new(BudgetGate {
            budgets: Arc::clone(&self.budgets),
            tenant: context.tenant.clone(),
        }));
        config.workspace = workspace;
        config.session_context = context;
        // An empty prompt is the request's way to have none.
        config.instructions = settings.instructions.clone().filter(|text| !text.is_empty());
        config.queue_mode = settings.queue_mode;
        // Read below the workspace root, down to the session's workspace.
        config.project_docs = settings
            .project_instructions
            .then(|| ProjectDocs::new(&self.workspace_root));
        config.max_steps = self.max_steps;
        config.submission_capacity = self.submission_capacity;
        config.approvals = match &settings.approvals {
            Some(overrides) => merge_approvals(&self.keel.approvals, overrides),
            None => self.keel.approvals.clone(),
        };
        let tools = self.tools_config(&tenant, settings);
        self.keel
            .install_tools(&mut config, &tools, self.launcher.clone())
            .await;
        config.client_tools = settings.client_tools.clone();
        config.client_tool_timeout = match settings.client_tool_timeout_secs {
            Some(0) => None,
            Some(secs) => Some(std::time::Duration::from_secs(secs)),
            None => tools.client_tool_timeout,
        };
        Ok(config)
    }
}

impl SessionFactory {
    /// Makes the workspace of the new session `session_id` with `mkdir`:
    /// `409 workspace_exists` when anything has its name already (an
    /// operator's directory, a link, a workspace left by a deleted session).
    pub(crate) async fn create_workspace(&self, tenant: &str, session_id: &str) -> Result<(), ApiError> {
        self.with_workspaces(tenant, session_id, |root, name| root.create(name))
            .await
            .map(drop)
    }

    /// Undoes [`Self::create_workspace`] when the session could not be
    /// created, so that the id stays usable.
    pub(crate) async fn discard_workspace(&self, tenant: &str, session_id: &str) {
        let discarded = self
            .with_workspaces(tenant, session_id, |root, name| {
                root.discard(name);
                Ok(())
            })
            .await;
        if let Err(error) = discarded {
            tracing::warn!(session_id, %error, "a workspace made for a session that was not created stays");
        }
    }

    /// Refuses (`409 workspace_not_removable`) to remove a workspace Keel
    /// did not create, one that was replaced, or one holding Keel's own
    /// files; removes nothing.
    pub(crate) async fn check_workspace_removable(&self, tenant: &str, session_id: &str) -> Result<(), ApiError> {
        self.with_workspaces(tenant, session_id, |root, name| root.check_removable(name).map(drop))
            .await
    }

    /// Removes the workspace of `session_id` (checked again), following no
    /// link inside it.
    pub(crate) async fn remove_workspace(&self, tenant: &str, session_id: &str) -> Result<(), ApiError> {
        self.with_workspaces(tenant, session_id, |root, name| root.remove(name))
            .await
    }

    /// Runs `work` on the workspace root of `tenant` and the name of
    /// `session_id`'s workspace in it, on a blocking thread (it is
    /// file-system work).
    async fn with_workspaces<T: Send + 'static>(
        &self,
        tenant: &str,
        session_id: &str,
        work: impl FnOnce(&WorkspaceRoot, &OsStr) -> Result<T, WorkspaceError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let dir = tenant_workspace_dir(&self.workspace_root, tenant, session_id);
        let root = dir
            .parent()
            .map_or_else(|| self.workspace_root.clone(), Path::to_path_buf);
        tokio::task::spawn_blocking(move || {
            let name = dir.file_name().unwrap_or_default();
            let workspaces = WorkspaceRoot::open(&root)?;
            work(&workspaces, name)
        })
        .await
        .map_err(|error| ApiError::Internal(format!("the workspace work failed: {error}")))?
        .map_err(ApiError::from)
    }
}

/// How a session whose model cannot be built here is made to load again.
const SWITCH_MODEL: &str = "switch its model to one this server offers (GET /v1/models) with PATCH \
     /v1/sessions/{id} and a body {\"model\": \"…\"}; the session and its history are kept as they are";

/// `409 session_model_unavailable`: the stored session `session_id` cannot
/// be loaded with its model `spec` (why), and how to make it load again.
fn model_unavailable(session_id: &str, spec: Option<&str>, why: &str) -> ApiError {
    let model = spec.map_or_else(String::new, |spec| format!(" \"{spec}\""));
    ApiError::SessionModelUnavailable(format!(
        "session '{session_id}' cannot be loaded: its model{model} is not available on this server ({why}); \
         {SWITCH_MODEL}"
    ))
}

/// `spec` with a `script:` path made absolute against the current
/// directory (nothing is read: the path is only spelled out), options after
/// `?` kept; any other spec as it is.
pub(crate) fn absolute_spec(spec: &str) -> String {
    let Some(rest) = spec.strip_prefix("script:") else {
        return spec.to_owned();
    };
    let (path, options) = match rest.split_once('?') {
        Some((path, options)) => (path, Some(options)),
        None => (rest, None),
    };
    let Ok(absolute) = std::path::absolute(path) else {
        return spec.to_owned();
    };
    match options {
        Some(options) => format!("script:{}?{options}", absolute.display()),
        None => format!("script:{}", absolute.display()),
    }
}

/// The workspace of a session: `root/<id>` when the id is a plain name
/// (letters, digits, `-`, `_`, `.`, not starting with `.`), otherwise
/// `root/~<UUID v5 of the id>`, so no id can name a path outside `root`
/// and two ids never share a directory. Public so that `keel sessions rm`
/// finds the directory the server used.
pub fn workspace_dir(root: &Path, session_id: &str) -> PathBuf {
    root.join(safe_name(session_id))
}

/// The directory below the workspace root that holds the tenants'
/// workspace roots. No session's workspace can have its name: a plain name
/// has no `~`, a hashed one is `~` and a UUID.
const TENANTS_DIR: &str = "~tenants";

/// The workspace of a session of `tenant`: the default tenant's are where
/// they always were ([`workspace_dir`]); another tenant's are in a root of
/// its own, `root/~tenants/<tenant>/`, named as a session id is (a plain
/// name as it is, any other hashed), so no tenant name can lead outside and
/// two tenants never share one. Each tenant root has its own record of the
/// workspaces Keel made. Public so that `keel sessions rm` finds the
/// directory the server used.
pub fn tenant_workspace_dir(root: &Path, tenant: &str, session_id: &str) -> PathBuf {
    if tenant == keel_protocol::DEFAULT_TENANT {
        workspace_dir(root, session_id)
    } else {
        workspace_dir(&root.join(TENANTS_DIR).join(safe_name(tenant)), session_id)
    }
}

/// `name` as one path component: itself when it is a plain name (letters,
/// digits, `-`, `_`, `.`, not starting with `.`), otherwise `~<UUID v5 of
/// it>`.
fn safe_name(name: &str) -> String {
    let plain = !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'));
    if plain {
        name.to_owned()
    } else {
        let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes());
        format!("~{id}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_paths_are_spelled_absolute_and_other_specs_stay() {
        let here = std::env::current_dir().expect("current directory");
        let expected = format!("script:{}", here.join("examples/hello.jsonl").display());
        assert_eq!(absolute_spec("script:examples/hello.jsonl"), expected);
        assert_eq!(absolute_spec("script:/srv/a.jsonl?x=1"), "script:/srv/a.jsonl?x=1");
        assert_eq!(
            absolute_spec("script:a.jsonl?context_window=10"),
            format!("script:{}?context_window=10", here.join("a.jsonl").display())
        );
        assert_eq!(absolute_spec("openai:gpt-4.1-mini"), "openai:gpt-4.1-mini");
        assert_eq!(absolute_spec("fast"), "fast");
    }

    #[test]
    fn plain_ids_name_their_directory_and_others_are_hashed() {
        let root = Path::new("/srv/keel");
        assert_eq!(workspace_dir(root, "my-session_1.a"), root.join("my-session_1.a"));
        for id in ["..", ".hidden", "a/b", "../../etc", "with space", "ü"] {
            let dir = workspace_dir(root, id);
            assert_eq!(dir.parent(), Some(root), "{id}");
            assert!(
                dir.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with('~'))
            );
        }
        assert_ne!(workspace_dir(root, "a/b"), workspace_dir(root, "a\\b"));
        assert_eq!(workspace_dir(root, "a/b"), workspace_dir(root, "a/b"), "stable");
    }

    #[test]
    fn each_tenant_has_a_root_of_its_own_and_the_default_keeps_the_old_layout() {
        let root = Path::new("/srv/keel");
        assert_eq!(tenant_workspace_dir(root, "default", "s1"), root.join("s1"));
        assert_eq!(
            tenant_workspace_dir(root, "acme", "s1"),
            root.join("~tenants").join("acme").join("s1")
        );
        assert_ne!(
            tenant_workspace_dir(root, "acme", "s1"),
            tenant_workspace_dir(root, "beta", "s1")
        );
        for tenant in ["..", "../x", "a/b", ".hidden", "with space", "~tenants"] {
            let dir = tenant_workspace_dir(root, tenant, "s1");
            let tenant_root = dir.parent().and_then(Path::parent);
            assert_eq!(tenant_root, Some(root.join("~tenants").as_path()), "{tenant}");
            assert!(
                dir.components().all(|part| part != std::path::Component::ParentDir),
                "{tenant}"
            );
        }
        // No session of the default tenant can take the tenants' directory.
        for id in ["~tenants", "tenants"] {
            assert_ne!(workspace_dir(root, id), root.join("~tenants"), "{id}");
        }
    }
}
