//! `[tenants.<id>]`: what one tenant's principals may ask for (narrowing
//! the server's `[server]` ceiling) and what they may spend.
//!
//! Each key narrows the server's: a tenant never gets more than `[server]`
//! (and `[tools]`) give API clients, whatever its table says. An absent key
//! keeps the server's.
//!
//! ```toml
//! [tenants.acme]
//! max_sandbox = "read-only"          # at most the server's max_sandbox
//! auto_approve = ["read_file"]       # only tools the server's auto_approve lists too
//! allow_network = false              # true only where [server] allow_network is
//! script_dir = "scripts/acme"        # inside the server's script_dir
//! tools = { shell = false }          # builtin / write / shell: false turns it off for the tenant
//! ```

use std::path::PathBuf;

use serde::Deserialize;

use super::budget::BudgetConfig;
use keel_tools::workspace::SandboxPolicy;

/// The longest tenant name, in bytes (a bot id's bound: it is stored with
/// every session and named in keys and tokens).
pub const MAX_TENANT_BYTES: usize = keel_agent::MAX_BOT_ID_BYTES;

/// The tenant names' grammar, in words, for error messages.
pub const TENANT_NAME_RULE: &str = "1 to 128 printable ASCII characters other than `%`";

/// Whether `tenant` is a tenant name: 1 to [`MAX_TENANT_BYTES`] printable
/// ASCII characters other than `%` (it goes in URL paths: see
/// [`keel_protocol::is_path_name`]). The one grammar every door checks: a
/// session's tenant, `[tenants.<id>]`, an API key's, a JWT's claim.
pub fn valid_tenant(tenant: &str) -> bool {
    keel_protocol::is_path_name(tenant, MAX_TENANT_BYTES)
}

/// One tenant's table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's token budgets and concurrency cap (`[tenants.<id>.budget]`).
    #[serde(default)]
    pub budget: Option<BudgetConfig>,
    /// The loosest shell sandbox the tenant's sessions may have (also
    /// lowering the operator's `[tools] sandbox` for them).
    #[serde(default)]
    pub max_sandbox: Option<SandboxPolicy>,
    /// The tools the tenant's principals may set to `auto` (of those the
    /// server's `auto_approve` allows); `"*"`: all the server allows.
    #[serde(default)]
    pub auto_approve: Option<Vec<String>>,
    /// Whether the tenant's sessions may give the shell the network (only
    /// where the server allows it).
    #[serde(default)]
    pub allow_network: Option<bool>,
    /// The directory the tenant's `script:` models must be in: inside the
    /// server's `script_dir`.
    #[serde(default)]
    pub script_dir: Option<PathBuf>,
    /// The built-in tools the tenant's sessions may have.
    #[serde(default)]
    pub tools: TenantTools,
}

/// `[tenants.<id>.tools]`: `false` turns a built-in tool group off for the
/// tenant's sessions; `true` (the default) leaves it as `[tools]` has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantTools {
    /// The clock and the reading workspace tools.
    #[serde(default = "yes")]
    pub builtin: bool,
    /// `write_file` and `edit_file`.
    #[serde(default = "yes")]
    pub write: bool,
    /// The shell.
    #[serde(default = "yes")]
    pub shell: bool,
}

fn yes() -> bool {
    true
}

impl Default for TenantTools {
    fn default() -> Self {
        Self {
            builtin: true,
            write: true,
            shell: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeelConfig;

    #[test]
    fn a_tenant_table_reads_the_ceiling_keys() {
        let config: KeelConfig = toml::from_str(
            "[tenants.acme]\nmax_sandbox = \"read-only\"\nauto_approve = [\"read_file\"]\nallow_network = false\n\
             script_dir = \"s/acme\"\ntools = { shell = false }\n[tenants.other]\n",
        )
        .expect("valid");
        let acme = &config.tenants["acme"];
        assert_eq!(acme.max_sandbox, Some(SandboxPolicy::ReadOnly));
        assert_eq!(acme.auto_approve.as_deref(), Some(&["read_file".to_owned()][..]));
        assert_eq!(acme.allow_network, Some(false));
        assert_eq!(acme.script_dir, Some(PathBuf::from("s/acme")));
        assert_eq!(
            acme.tools,
            TenantTools {
                builtin: true,
                write: true,
                shell: false
            }
        );
        let other = &config.tenants["other"];
        assert!(other.max_sandbox.is_none() && other.auto_approve.is_none() && other.tools == TenantTools::default());
        let wrong = toml::from_str::<KeelConfig>("[tenants.acme]\nmax_sandbx = \"read-only\"\n");
        assert!(wrong.is_err_and(|error| error.message().contains("unknown field `max_sandbx`")));
    }

    #[test]
    fn tenant_names_are_short_printable_ascii_without_percent() {
        assert!(valid_tenant("acme") && valid_tenant("Acme Corp.") && valid_tenant(&"a".repeat(MAX_TENANT_BYTES)));
        for bad in ["", "t\u{e9}", "a\nb", "t%C3%A9", &"a".repeat(MAX_TENANT_BYTES + 1)] {
            assert!(!valid_tenant(bad), "{bad:?}");
        }
        assert!(valid_tenant("org:42"));
        assert!(TENANT_NAME_RULE.contains(&format!("1 to {MAX_TENANT_BYTES} ")));
    }
}
