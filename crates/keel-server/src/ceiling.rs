//! The operator's ceiling on what API clients ask for (`[server]` in
//! `keel.toml`, see [`ServerPolicy`]), checked when a session is created and
//! again each time a stored one is loaded, so lowering the ceiling also
//! stops sessions created under a higher one.
//!
//! The operator's own settings (`[tools]`, `[approvals]`, the default model,
//! the models of `keel.toml`) always pass: a client is refused only for
//! asking for more than they give. A tenant's `[tenants.<id>]` table
//! narrows both for its sessions first (see `tenant_ceiling`).

use std::path::{Path, PathBuf};

use super::error::ApiError;
use super::settings::{ToolsOverrides, merge_approvals};
use super::tenant_ceiling::Ceiling;
pub(crate) use crate::script_dir::ScriptDir;
use keel_config::{KeelConfig, ServerPolicy, ToolsConfig};
use keel_tools::{ApprovalPolicy, ApprovalRules};

/// The built-in tools and whether each only reads.
const BUILTIN_TOOLS: [(&str, bool); 7] = [
    ("clock", true),
    ("read_file", true),
    ("list_dir", true),
    ("search", true),
    ("write_file", false),
    ("edit_file", false),
    ("shell", false),
];

fn forbidden(code: &'static str, message: String) -> ApiError {
    ApiError::Forbidden { code, message }
}

/// Checks a session's tool and approval overrides against `keel`'s
/// `[approvals]` and the `[tools]` and `[server]` of `ceiling` (its
/// tenant's); `403` naming the setting.
pub(crate) fn check_overrides(
    keel: &KeelConfig,
    ceiling: &Ceiling,
    tools: Option<&ToolsOverrides>,
    approvals: Option<&ApprovalRules>,
) -> Result<(), ApiError> {
    let base = &ceiling.tools;
    let policy = &ceiling.policy;
    if let Some(overrides) = tools {
        for (key, asked, offered) in [
            ("builtin", overrides.builtin, base.builtin),
            ("write", overrides.write, base.write),
            ("shell", overrides.shell, base.shell),
        ] {
            if asked == Some(true) && !offered {
                return Err(forbidden(
                    "tool_over_ceiling",
                    format!(
                        "`tools.{key}` cannot be turned on: this server's keel.toml turns it off ([tools] {key} = false)"
                    ),
                ));
            }
        }
        if let Some(sandbox) = overrides.sandbox {
            // What the operator set in `[tools]` is theirs, whatever the ceiling.
            let allowed = policy.max_sandbox.rank().max(base.sandbox.rank());
            if sandbox.rank() > allowed {
                return Err(forbidden(
                    "sandbox_over_ceiling",
                    format!(
                        "`tools.sandbox` = \"{sandbox}\" is beyond this server's ceiling (\"{}\"); the operator can \
                         raise it with [server] max_sandbox in keel.toml or `keel serve --max-sandbox`",
                        policy.max_sandbox
                    ),
                ));
            }
        }
        if overrides.network == Some(true) && !base.network && !policy.allow_network {
            return Err(forbidden(
                "network_over_ceiling",
                "`tools.network` cannot be turned on: this server does not let API clients give the shell the \
                 network; the operator can allow it with [server] allow_network = true in keel.toml or `keel serve \
                 --allow-network`"
                    .to_owned(),
            ));
        }
    }
    if let Some(overrides) = approvals {
        let effective = tools.map_or_else(|| base.clone(), |overrides| overrides.apply(base));
        check_approvals(keel, policy, &effective, overrides)?;
    }
    Ok(())
}

/// Refuses approvals that make a tool `auto` which the operator's own rules
/// do not, unless `[server] auto_approve` lists it.
fn check_approvals(
    keel: &KeelConfig,
    policy: &ServerPolicy,
    tools: &ToolsConfig,
    overrides: &ApprovalRules,
) -> Result<(), ApiError> {
    let merged = merge_approvals(&keel.approvals, overrides);
    let offered = |name: &str| match name {
        "write_file" | "edit_file" => tools.builtin && tools.write,
        "shell" => tools.builtin && tools.shell,
        _ => tools.builtin,
    };
    let mut candidates: Vec<(&str, bool)> = BUILTIN_TOOLS
        .iter()
        .copied()
        .filter(|(name, _)| offered(name))
        .collect();
    // Tools named in the request that are not built in are MCP tools, whose
    // read-only hint is not known before the session starts: not read-only.
    candidates.extend(
        overrides
            .tools
            .keys()
            .filter(|name| !BUILTIN_TOOLS.iter().any(|(builtin, _)| builtin == *name))
            .map(|name| (name.as_str(), false)),
    );
    for (name, read_only) in candidates {
        let asked = merged.policy(name, read_only);
        let operator = keel.approvals.policy(name, read_only);
        if asked == ApprovalPolicy::Auto && operator != ApprovalPolicy::Auto && !policy.may_auto_approve(name) {
            return Err(over_auto(&format!("`{name}`")));
        }
    }
    // Every MCP tool without an entry of its own follows the default.
    let mcp = keel.mcp.servers.values().any(|server| server.enabled);
    if mcp
        && merged.default == Some(ApprovalPolicy::Auto)
        && keel.approvals.default != Some(ApprovalPolicy::Auto)
        && !policy.may_auto_approve_all()
    {
        return Err(over_auto("this server's MCP tools"));
    }
    Ok(())
}

fn over_auto(what: &str) -> ApiError {
    forbidden(
        "auto_approval_over_ceiling",
        format!(
            "`approvals` would auto-approve {what}, which this server does not let API clients do; the operator can \
             allow it with [server] auto_approve in keel.toml or `keel serve --auto-approve`"
        ),
    )
}

/// `403 script_model_over_ceiling`.
fn script_refused(spec: &str, why: &str) -> ApiError {
    forbidden(
        "script_model_over_ceiling",
        format!(
            "`model` \"{spec}\": {why}; script models from API clients must be files in the server's script \
             directory ([server] script_dir in keel.toml or `keel serve --script-dir`)"
        ),
    )
}

/// The file an API client's `script:` spec names, resolved inside `dir`:
/// `403` when it is (or leads through a symlink) outside, or no directory
/// is configured; `400` when there is no such file in it. Runs its file
/// system calls on a blocking thread.
pub(crate) async fn resolve_script(dir: Option<&ScriptDir>, spec: &str, path: &str) -> Result<PathBuf, ApiError> {
    let Some(dir) = dir else {
        return Err(script_refused(spec, "this server has no script directory"));
    };
    let requested = Path::new(path);
    let joined = if requested.is_absolute() {
        requested.to_path_buf()
    } else {
        dir.canonical.join(requested)
    };
    // A path plainly outside is refused before the file system is asked, so
    // the answer says nothing about what exists elsewhere.
    let escapes = joined
        .components()
        .any(|component| component == std::path::Component::ParentDir);
    if escapes || !(joined.starts_with(&dir.canonical) || joined.starts_with(&dir.configured)) {
        return Err(script_refused(spec, "the file is outside the script directory"));
    }
    let resolved = tokio::task::spawn_blocking(move || joined.canonicalize())
        .await
        .map_err(|error| ApiError::Internal(format!("resolving a script failed: {error}")))?
        .map_err(|_| ApiError::ModelNotFound(format!("`model` \"{spec}\": no such script in the script directory")))?;
    if !resolved.starts_with(&dir.canonical) {
        return Err(script_refused(spec, "the file leads outside the script directory"));
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_tools::workspace::SandboxPolicy;

    fn code(result: Result<(), ApiError>) -> &'static str {
        result.err().map_or("ok", |error| error.code())
    }

    /// The check of a session of the default tenant (no `[tenants]` table).
    fn check(
        keel: &KeelConfig,
        tools: Option<&ToolsOverrides>,
        approvals: Option<&ApprovalRules>,
    ) -> Result<(), ApiError> {
        let ceiling = crate::tenant_ceiling::ceiling_of(keel, keel_protocol::DEFAULT_TENANT);
        check_overrides(keel, &ceiling, tools, approvals)
    }

    fn rules(default: Option<ApprovalPolicy>, tools: &[(&str, ApprovalPolicy)]) -> ApprovalRules {
        ApprovalRules {
            default,
            tools: tools
                .iter()
                .map(|(name, policy)| ((*name).to_owned(), *policy))
                .collect(),
        }
    }

    #[test]
    fn the_default_ceiling_refuses_what_widens_the_operators_settings() {
        let keel = KeelConfig::default();
        let full = ToolsOverrides {
            sandbox: Some(SandboxPolicy::FullAccess),
            ..ToolsOverrides::default()
        };
        assert_eq!(code(check(&keel, Some(&full), None)), "sandbox_over_ceiling");
        let network = ToolsOverrides {
            network: Some(true),
            ..ToolsOverrides::default()
        };
        assert_eq!(code(check(&keel, Some(&network), None)), "network_over_ceiling");
        let auto = rules(Some(ApprovalPolicy::Auto), &[]);
        assert_eq!(code(check(&keel, None, Some(&auto))), "auto_approval_over_ceiling");
        let shell = rules(None, &[("shell", ApprovalPolicy::Auto)]);
        assert_eq!(code(check(&keel, None, Some(&shell))), "auto_approval_over_ceiling");
        let mcp = rules(None, &[("files__write", ApprovalPolicy::Auto)]);
        assert_eq!(code(check(&keel, None, Some(&mcp))), "auto_approval_over_ceiling");

        // Narrowing is always fine, and so is auto for the reading tools only.
        let narrow = ToolsOverrides {
            write: Some(false),
            shell: Some(false),
            sandbox: Some(SandboxPolicy::ReadOnly),
            network: Some(false),
            ..ToolsOverrides::default()
        };
        assert_eq!(code(check(&keel, Some(&narrow), Some(&auto))), "ok");
        let reading = rules(Some(ApprovalPolicy::Ask), &[("read_file", ApprovalPolicy::Auto)]);
        assert_eq!(code(check(&keel, None, Some(&reading))), "ok");
    }

    #[test]
    fn tools_turned_off_stay_off_and_the_operator_can_raise_the_ceiling() {
        let mut keel = KeelConfig::default();
        keel.tools.shell = false;
        let shell = ToolsOverrides {
            shell: Some(true),
            ..ToolsOverrides::default()
        };
        assert_eq!(code(check(&keel, Some(&shell), None)), "tool_over_ceiling");

        let mut keel = KeelConfig::default();
        keel.server.max_sandbox = SandboxPolicy::FullAccess;
        keel.server.allow_network = true;
        keel.server.auto_approve = vec!["*".to_owned()];
        let everything = ToolsOverrides {
            sandbox: Some(SandboxPolicy::FullAccess),
            network: Some(true),
            ..ToolsOverrides::default()
        };
        let auto = rules(Some(ApprovalPolicy::Auto), &[]);
        assert_eq!(code(check(&keel, Some(&everything), Some(&auto))), "ok");

        // The operator's own auto rules and sandbox are not the client's doing.
        let mut keel = KeelConfig {
            approvals: rules(Some(ApprovalPolicy::Auto), &[]),
            ..KeelConfig::default()
        };
        keel.tools.sandbox = SandboxPolicy::FullAccess;
        let same = ToolsOverrides {
            sandbox: Some(SandboxPolicy::FullAccess),
            ..ToolsOverrides::default()
        };
        assert_eq!(code(check(&keel, Some(&same), Some(&auto))), "ok");
    }

    #[tokio::test]
    async fn scripts_resolve_only_inside_the_directory() {
        let root = tempfile::tempdir().expect("temporary directory");
        let scripts = root.path().join("scripts");
        std::fs::create_dir(&scripts).expect("mkdir");
        std::fs::write(scripts.join("a.jsonl"), "{\"text\": \"hi\"}").expect("write");
        std::fs::write(root.path().join("outside.jsonl"), "{\"text\": \"hi\"}").expect("write");
        std::os::unix::fs::symlink(root.path().join("outside.jsonl"), scripts.join("link.jsonl")).expect("symlink");
        let dir = ScriptDir::new(&scripts).expect("script dir");
        let resolve = |path: String| {
            let dir = dir.clone();
            async move {
                resolve_script(Some(&dir), "spec", &path)
                    .await
                    .map_err(|error| error.code())
            }
        };
        assert!(resolve("a.jsonl".into()).await.is_ok());
        assert!(resolve(scripts.join("a.jsonl").display().to_string()).await.is_ok());
        for path in [
            "../outside.jsonl".to_owned(),
            root.path().join("outside.jsonl").display().to_string(),
            "link.jsonl".to_owned(),
            "/etc/passwd".to_owned(),
        ] {
            assert_eq!(resolve(path.clone()).await, Err("script_model_over_ceiling"), "{path}");
        }
        assert_eq!(resolve("missing.jsonl".into()).await, Err("model_not_found"));
        assert_eq!(
            resolve_script(None, "spec", "a.jsonl")
                .await
                .map_err(|error| error.code()),
            Err("script_model_over_ceiling")
        );
    }
}
