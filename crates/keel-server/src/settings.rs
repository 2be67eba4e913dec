//! A server session's settings: what a client asked for when it created it.
//!
//! The settings a session was created with (model spec, tools and approval
//! overrides, instructions, busy policy, queue mode) are stored in the session's
//! [`SessionContext::settings`], so a session reloads with them after being
//! unloaded or after a restart. API users see only the context's metadata.
//! `ceiling` checks them against the operator's ceiling; `factory` builds a
//! session from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::ApiError;
use keel_agent::{BusyPolicy, QueueMode, SessionContext};
use keel_config::ToolsConfig;
use keel_tools::ApprovalRules;
use keel_tools::workspace::SandboxPolicy;

/// Overrides of `keel.toml`'s `[tools]` for one session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolsOverrides {
    /// Whether the built-in tools are offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) builtin: Option<bool>,
    /// Whether the tools that write files are offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) write: Option<bool>,
    /// Whether the shell is offered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) shell: Option<bool>,
    /// How the shell's commands are confined.
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
    /// The system prompt, fixed when the session was created: the
    /// request's, its bot's, or Keel's coding prompt (an empty one: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) instructions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tools: Option<ToolsOverrides>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) approvals: Option<ApprovalRules>,
    #[serde(default)]
    pub(crate) on_busy: BusyPolicy,
    /// How queued messages become turns.
    #[serde(default)]
    pub(crate) queue_mode: QueueMode,
    /// Whether the session reads the project's `AGENTS.md` at its first
    /// turn (a coding agent's session created since they are read).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) project_instructions: bool,
    /// The tools the client executes: the request's, else its bot's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) client_tools: Vec<keel_protocol::ClientToolSpec>,
    /// How long a client has to answer a call, in seconds (0: for ever);
    /// `None`: the server's `[tools] client_tool_timeout_secs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_tool_timeout_secs: Option<u64>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use keel_tools::ApprovalPolicy;

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
