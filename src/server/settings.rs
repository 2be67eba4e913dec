//! A server session's settings, and how a session is assembled from them.
//!
//! The settings a session was created with (model spec, tools and approval
//! overrides, instructions, busy policy) are stored in the session's
//! [`SessionContext::settings`], so a session reloads with them after being
//! unloaded or after a restart. API users see only the context's metadata.
//!
//! What a client may ask for is bounded by the operator's ceiling (see
//! `ceiling`): checked at creation and again at every load. Settings that
//! no longer fit, or no longer parse, keep the session from loading rather
//! than loading it with defaults (which could turn a tool back on).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ceiling::{ScriptDir, check_overrides, resolve_script};
use super::error::ApiError;
use super::metrics::{MeteredModel, Metrics};
use crate::agent::{AgentConfig, BusyPolicy, SessionContext};
use crate::config::{KeelConfig, ToolsConfig};
use crate::model::Model;
use crate::store::CheckpointStore;
use crate::tools::ApprovalRules;
use crate::tools::workspace::SandboxPolicy;

/// Overrides of `keel.toml`'s `[tools]` for one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) builtin: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shell: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sandbox: Option<SandboxPolicy>,
    /// Whether the shell may use the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) network: Option<bool>,
}

impl ToolsOverrides {
    pub(crate) fn apply(&self, base: &ToolsConfig) -> ToolsConfig {
        ToolsConfig {
            builtin: self.builtin.unwrap_or(base.builtin),
            write: self.write.unwrap_or(base.write),
            shell: self.shell.unwrap_or(base.shell),
            sandbox: self.sandbox.unwrap_or(base.sandbox),
            network: self.network.unwrap_or(base.network),
            ..base.clone()
        }
    }
}

/// `approvals` over `keel.toml`'s `[approvals]`: a given `default` replaces
/// the file's, per-tool entries are added to (and win over) the file's.
pub(crate) fn merge_approvals(base: &ApprovalRules, overrides: &ApprovalRules) -> ApprovalRules {
    let mut tools: BTreeMap<_, _> = base.tools.clone();
    tools.extend(overrides.tools.iter().map(|(name, policy)| (name.clone(), *policy)));
    ApprovalRules {
        default: overrides.default.or(base.default),
        tools,
    }
}

/// What the server stores with a session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionSettings {
    /// The model spec; `None` means the server's default at load time (a
    /// session created by an older `keel run` has no settings; a newer one
    /// stores its `model` and `instructions` here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instructions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tools: Option<ToolsOverrides>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) approvals: Option<ApprovalRules>,
    #[serde(default)]
    pub(crate) on_busy: BusyPolicy,
}

impl SessionSettings {
    /// The settings stored in a session's context: defaults when it has
    /// none (a session an older `keel run` created), an error when they do not parse
    /// (defaults could be looser than what the session was created with).
    pub(crate) fn of(context: &SessionContext) -> Result<Self, String> {
        let Some(value) = &context.settings else {
            return Ok(Self::default());
        };
        serde_json::from_value(value.clone()).map_err(|error| error.to_string())
    }

    /// The stored settings of `session_id`, or the error that keeps it from
    /// loading.
    pub(crate) fn stored(session_id: &str, context: &SessionContext) -> Result<Self, ApiError> {
        Self::of(context).map_err(|error| {
            ApiError::Internal(format!(
                "session '{session_id}' is not loaded: its stored settings do not parse ({error})"
            ))
        })
    }

    /// The settings as stored.
    pub(crate) fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Builds the agents of server sessions.
pub(crate) struct SessionFactory {
    pub(crate) keel: Arc<KeelConfig>,
    /// Where API clients' `script:` models may come from (`[server]
    /// script_dir`, resolved).
    pub(crate) script_dir: Option<ScriptDir>,
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
}

impl SessionFactory {
    /// The model spec a session with `settings` uses.
    pub(crate) fn model_spec(&self, settings: &SessionSettings) -> Option<String> {
        settings.model.clone().or_else(|| self.default_model.clone())
    }

    /// Checks that a new session's settings fit the operator's ceiling
    /// (`403`) and can be built (`400`); returns the model spec.
    pub(crate) async fn check(&self, settings: &SessionSettings) -> Result<String, ApiError> {
        check_overrides(&self.keel, settings.tools.as_ref(), settings.approvals.as_ref())?;
        let spec = self.model_spec(settings).ok_or_else(|| {
            ApiError::InvalidRequest(
                "no model: name one in `model`, or start the server with --model or a keel.toml `model`".to_owned(),
            )
        })?;
        self.load_model(&spec).await?;
        Ok(spec)
    }

    /// Whether the operator chose `spec`: the server's default model or one
    /// named in `keel.toml`.
    fn operator_model(&self, spec: &str) -> bool {
        self.default_model.as_deref() == Some(spec) || self.keel.models.contains_key(spec)
    }

    /// Builds the model of `spec` on a blocking thread (a script is a file
    /// read). A `script:` spec the operator did not choose must name a file
    /// in the script directory (`403` otherwise); a spec that cannot be
    /// built is `400`.
    async fn load_model(&self, spec: &str) -> Result<Arc<dyn Model>, ApiError> {
        let spec = match spec.strip_prefix("script:") {
            Some(path) if !self.operator_model(spec) => {
                let resolved = resolve_script(self.script_dir.as_ref(), spec, path).await?;
                format!("script:{}", resolved.display())
            }
            _ => spec.to_owned(),
        };
        let keel = Arc::clone(&self.keel);
        tokio::task::spawn_blocking(move || keel.model(&spec))
            .await
            .map_err(|error| ApiError::Internal(format!("building the model failed: {error}")))?
            .map_err(|error| ApiError::InvalidRequest(error.to_string()))
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
        check_overrides(&self.keel, settings.tools.as_ref(), settings.approvals.as_ref()).map_err(refused)?;
        let spec = self.model_spec(settings).ok_or_else(|| {
            ApiError::Internal(format!(
                "session '{session_id}' names no model and the server has no default model"
            ))
        })?;
        let model = self.load_model(&spec).await.map_err(refused)?;
        let provider = self.keel.provider_of(&spec).unwrap_or_else(|| "unknown".to_owned());
        let model = Arc::new(MeteredModel::new(model, provider, Arc::clone(&self.metrics)));
        let workspace = workspace_dir(&self.workspace_root, session_id);
        tokio::fs::create_dir_all(&workspace).await.map_err(|error| {
            ApiError::Internal(format!("cannot create the workspace {}: {error}", workspace.display()))
        })?;
        let mut config = AgentConfig::new(session_id, Arc::clone(&self.store), model);
        config.workspace = workspace;
        config.session_context = context;
        config.instructions = settings.instructions.clone();
        config.max_steps = self.max_steps;
        config.submission_capacity = self.submission_capacity;
        config.approvals = match &settings.approvals {
            Some(overrides) => merge_approvals(&self.keel.approvals, overrides),
            None => self.keel.approvals.clone(),
        };
        let tools = match &settings.tools {
            Some(overrides) => overrides.apply(&self.keel.tools),
            None => self.keel.tools.clone(),
        };
        self.keel
            .install_tools(&mut config, &tools, self.launcher.clone())
            .await;
        Ok(config)
    }
}

/// The workspace of a session: `root/<id>` when the id is a plain name
/// (letters, digits, `-`, `_`, `.`, not starting with `.`), otherwise
/// `root/~<UUID v5 of the id>`, so no id can name a path outside `root`
/// and two ids never share a directory.
pub(crate) fn workspace_dir(root: &Path, session_id: &str) -> PathBuf {
    let plain = !session_id.is_empty()
        && !session_id.starts_with('.')
        && session_id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'));
    if plain {
        root.join(session_id)
    } else {
        let id = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, session_id.as_bytes());
        root.join(format!("~{id}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ApprovalPolicy;

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
    fn overrides_change_only_what_they_name() {
        let base = ToolsConfig::default();
        let tools = ToolsOverrides {
            shell: Some(false),
            sandbox: Some(SandboxPolicy::ReadOnly),
            ..ToolsOverrides::default()
        }
        .apply(&base);
        assert!(tools.builtin && tools.write && !tools.shell);
        assert_eq!(tools.sandbox, SandboxPolicy::ReadOnly);

        let file = ApprovalRules {
            default: Some(ApprovalPolicy::Deny),
            tools: [("shell".to_owned(), ApprovalPolicy::Ask)].into(),
        };
        let request = ApprovalRules {
            default: None,
            tools: [("read_file".to_owned(), ApprovalPolicy::Auto)].into(),
        };
        let merged = merge_approvals(&file, &request);
        assert_eq!(merged.default, Some(ApprovalPolicy::Deny));
        assert_eq!(merged.tools.len(), 2);
    }

    #[test]
    fn settings_round_trip_and_foreign_ones_are_errors() {
        let settings = SessionSettings {
            model: Some("script:a.jsonl".into()),
            on_busy: BusyPolicy::Steer,
            ..SessionSettings::default()
        };
        let context = SessionContext {
            settings: Some(settings.to_value()),
            ..SessionContext::default()
        };
        assert_eq!(SessionSettings::of(&context), Ok(settings));
        let foreign = SessionContext {
            settings: Some(serde_json::json!({"on_busy": 7})),
            ..SessionContext::default()
        };
        assert!(SessionSettings::of(&foreign).is_err(), "not defaults");
        assert_eq!(
            SessionSettings::of(&SessionContext::default()),
            Ok(SessionSettings::default())
        );
    }
}
