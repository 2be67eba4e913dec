//! One tenant's ceiling: its `[tenants.<id>]` table narrowing, for its
//! sessions, the operator's `[tools]` and the server's `[server]` ceiling.
//!
//! Every key can only take away: the sandbox is the lower of the two, a
//! tool may be auto-approved only if both lists allow it, the network and
//! the tool groups are on only if both allow them, and a tenant's script
//! directory must lie inside the server's. The narrowed `[tools]` is what
//! the tenant's sessions start from, so a tenant's session that asks for
//! nothing gets no more than its tenant allows either.

use std::collections::BTreeMap;

use crate::script_dir::ScriptDir;
use keel_config::{KeelConfig, ServerPolicy, ToolsConfig};

/// What the sessions of one tenant start from and may ask for.
#[derive(Debug, Clone)]
pub(crate) struct Ceiling {
    /// The operator's `[tools]`, narrowed for the tenant: the settings its
    /// sessions start from.
    pub(crate) tools: ToolsConfig,
    /// The server's `[server]`, narrowed for the tenant.
    pub(crate) policy: ServerPolicy,
}

/// The ceiling of `tenant`'s sessions: the server's own for a tenant
/// without a table.
pub(crate) fn ceiling_of(keel: &KeelConfig, tenant: &str) -> Ceiling {
    let mut tools = keel.tools.clone();
    let mut policy = keel.server.clone();
    let Some(table) = keel.tenants.get(tenant) else {
        return Ceiling { tools, policy };
    };
    if let Some(max) = table.max_sandbox {
        if max.rank() < policy.max_sandbox.rank() {
            policy.max_sandbox = max;
        }
        if max.rank() < tools.sandbox.rank() {
            tools.sandbox = max;
        }
    }
    if let Some(allowed) = &table.auto_approve {
        policy.auto_approve = narrow_auto_approve(&policy.auto_approve, allowed);
    }
    if table.allow_network == Some(false) {
        policy.allow_network = false;
        tools.network = false;
    }
    tools.builtin &= table.tools.builtin;
    tools.write &= table.tools.write;
    tools.shell &= table.tools.shell;
    Ceiling { tools, policy }
}

/// The tools both `server` and `tenant` let clients auto-approve (`"*"`:
/// every tool).
fn narrow_auto_approve(server: &[String], tenant: &[String]) -> Vec<String> {
    let all = |list: &[String]| list.iter().any(|tool| tool == "*");
    if all(server) {
        return tenant.to_vec();
    }
    if all(tenant) {
        return server.to_vec();
    }
    server.iter().filter(|tool| tenant.contains(tool)).cloned().collect()
}

/// Checks the `[tenants]` tables as the server starts: each name a tenant
/// name, each script directory an existing one inside the server's
/// (`server_dir`). Returns the tenants' script directories, resolved.
pub(crate) fn tenant_script_dirs(
    keel: &KeelConfig,
    server_dir: Option<&ScriptDir>,
) -> Result<BTreeMap<String, ScriptDir>, String> {
    let mut dirs = BTreeMap::new();
    for (tenant, table) in &keel.tenants {
        if !keel_config::valid_tenant(tenant) {
            return Err(format!(
                "[tenants.{tenant:?}]: a tenant name is 1 to {} printable ASCII characters other than `%`",
                keel_config::MAX_TENANT_BYTES
            ));
        }
        let Some(configured) = &table.script_dir else {
            continue;
        };
        let dir = ScriptDir::new(configured)?;
        if !server_dir.is_some_and(|server| dir.is_inside(server)) {
            return Err(format!(
                "[tenants.{tenant}] script_dir {} is not inside the server's script directory ([server] script_dir): \
                 a tenant's ceiling can only narrow the server's",
                configured.display()
            ));
        }
        dirs.insert(tenant.clone(), dir);
    }
    Ok(dirs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_config::TenantConfig;
    use keel_tools::workspace::SandboxPolicy;

    fn keel_with(tenant: TenantConfig) -> KeelConfig {
        let mut keel = KeelConfig::default();
        keel.tenants.insert("acme".to_owned(), tenant);
        keel
    }

    #[test]
    fn a_tenant_table_only_narrows() {
        let mut keel = keel_with(TenantConfig {
            max_sandbox: Some(SandboxPolicy::FullAccess),
            auto_approve: Some(vec!["*".to_owned()]),
            allow_network: Some(true),
            ..TenantConfig::default()
        });
        // Asking for more than the server gives gets the server's.
        let wide = ceiling_of(&keel, "acme");
        assert_eq!(wide.policy, keel.server);
        assert_eq!(wide.tools, keel.tools);

        keel.server.max_sandbox = SandboxPolicy::FullAccess;
        keel.server.allow_network = true;
        keel.tools.network = true;
        keel.tenants.insert(
            "acme".to_owned(),
            TenantConfig {
                max_sandbox: Some(SandboxPolicy::ReadOnly),
                auto_approve: Some(vec!["read_file".to_owned(), "shell".to_owned()]),
                allow_network: Some(false),
                tools: keel_config::TenantTools {
                    shell: false,
                    ..keel_config::TenantTools::default()
                },
                ..TenantConfig::default()
            },
        );
        let narrow = ceiling_of(&keel, "acme");
        assert_eq!(narrow.policy.max_sandbox, SandboxPolicy::ReadOnly);
        assert_eq!(narrow.tools.sandbox, SandboxPolicy::ReadOnly);
        // `shell` is not in the server's list: the tenant cannot add it.
        assert_eq!(narrow.policy.auto_approve, ["read_file"]);
        assert!(!narrow.policy.allow_network && !narrow.tools.network);
        assert!(!narrow.tools.shell && narrow.tools.write && narrow.tools.builtin);
        // Another tenant keeps the server's.
        let other = ceiling_of(&keel, "other");
        assert_eq!(other.policy, keel.server);
        assert!(other.tools.shell && other.tools.network);
    }

    #[test]
    fn auto_approval_lists_intersect() {
        let list = |tools: &[&str]| tools.iter().map(|tool| (*tool).to_owned()).collect::<Vec<_>>();
        assert_eq!(narrow_auto_approve(&list(&["*"]), &list(&["shell"])), ["shell"]);
        assert_eq!(narrow_auto_approve(&list(&["clock"]), &list(&["*"])), ["clock"]);
        assert_eq!(
            narrow_auto_approve(&list(&["clock", "search"]), &list(&["search", "shell"])),
            ["search"]
        );
    }

    #[test]
    fn a_tenants_script_directory_must_be_inside_the_servers() {
        let root = tempfile::tempdir().expect("temporary directory");
        let server = root.path().join("scripts");
        std::fs::create_dir_all(server.join("acme")).expect("mkdir");
        std::fs::create_dir(root.path().join("elsewhere")).expect("mkdir");
        let server_dir = ScriptDir::new(&server).expect("server dir");
        let with_dir = |dir: std::path::PathBuf| {
            keel_with(TenantConfig {
                script_dir: Some(dir),
                ..TenantConfig::default()
            })
        };
        let inside = with_dir(server.join("acme"));
        assert!(tenant_script_dirs(&inside, Some(&server_dir)).is_ok_and(|dirs| dirs.contains_key("acme")));
        for keel in [
            with_dir(root.path().join("elsewhere")),
            with_dir(server.join("acme/../..")),
        ] {
            let error = tenant_script_dirs(&keel, Some(&server_dir)).expect_err("outside");
            assert!(error.contains("not inside"), "{error}");
        }
        assert!(tenant_script_dirs(&inside, None).is_err(), "no server directory");
        let mut bad_name = KeelConfig::default();
        bad_name.tenants.insert("a\u{e9}".to_owned(), TenantConfig::default());
        assert!(tenant_script_dirs(&bad_name, None).is_err());
    }
}
