//! Approval policies: which tool calls run at once, which wait for the user,
//! which are refused.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What happens to a call of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ApprovalPolicy {
    /// Run without asking.
    Auto,
    /// Record an `approval_requested` event and wait for the user's decision.
    Ask,
    /// Never run; the model is told the tool is not allowed.
    Deny,
}

/// The approval policy of each tool in a session.
///
/// By default tools that only read run without asking and every other tool
/// (writing files, the shell, MCP tools not marked read-only) asks. `tools`
/// overrides that per tool name; `default` overrides it for every tool not
/// named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ApprovalRules {
    /// The policy for every tool not in `tools`, instead of the default.
    #[serde(default)]
    pub default: Option<ApprovalPolicy>,
    /// Per-tool policies.
    #[serde(default)]
    pub tools: BTreeMap<String, ApprovalPolicy>,
}

impl ApprovalRules {
    /// Every call runs without asking.
    pub fn auto() -> Self {
        Self {
            default: Some(ApprovalPolicy::Auto),
            tools: BTreeMap::new(),
        }
    }

    /// The policy for a call of `tool`.
    pub fn policy(&self, tool: &str, read_only: bool) -> ApprovalPolicy {
        if let Some(policy) = self.tools.get(tool) {
            return *policy;
        }
        match self.default {
            Some(policy) => policy,
            None if read_only => ApprovalPolicy::Auto,
            None => ApprovalPolicy::Ask,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_tools_run_writing_tools_ask_unless_overridden() {
        let rules = ApprovalRules::default();
        assert_eq!(rules.policy("read_file", true), ApprovalPolicy::Auto);
        assert_eq!(rules.policy("shell", false), ApprovalPolicy::Ask);
        let rules: ApprovalRules = serde_json::from_value(serde_json::json!({
            "default": "deny",
            "tools": {"shell": "auto"}
        }))
        .expect("rules");
        assert_eq!(rules.policy("shell", false), ApprovalPolicy::Auto);
        assert_eq!(rules.policy("read_file", true), ApprovalPolicy::Deny);
    }
}
