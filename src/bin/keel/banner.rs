//! What `keel serve` says about itself as it starts, on stderr: the
//! database, the config file read, the default model, the workspace root,
//! the listen address, how requests are authenticated and what the shell's
//! sandbox can enforce on this kernel, so that an operator sees at a glance
//! what is being served, and from where.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use keel::tools::workspace::SandboxPolicy;

use crate::db::Location;

/// What the banner names.
pub(crate) struct Banner<'a> {
    pub(crate) database: &'a Location,
    pub(crate) config: Option<&'a Path>,
    pub(crate) default_model: Option<&'a str>,
    pub(crate) workspace_root: &'a Path,
    pub(crate) address: SocketAddr,
    pub(crate) token_file: Option<&'a PathBuf>,
    pub(crate) max_sandbox: SandboxPolicy,
}

impl Banner<'_> {
    /// The banner's lines (the last one, `keel serve listening on URL`, is
    /// printed by the caller once the server is ready).
    pub(crate) fn lines(&self) -> Vec<String> {
        let config = match self.config {
            Some(path) => path.display().to_string(),
            None => "none found (defaults; see `keel config`)".to_owned(),
        };
        let model = self
            .default_model
            .unwrap_or("none (each new session must name its model)");
        let auth = match self.token_file {
            Some(path) => format!("bearer token from {}", path.display()),
            None => "none: no token, so loopback clients only".to_owned(),
        };
        vec![
            format!("keel serve {}", crate::version::LONG),
            format!("  database:       {}", self.database),
            format!("  config:         {config}"),
            format!("  default model:  {model}"),
            format!("  workspace root: {}", self.workspace_root.display()),
            format!("  listen:         http://{}", self.address),
            format!("  auth:           {auth}"),
            format!("  sandbox:        {}", sandbox_line(self.max_sandbox)),
        ]
    }
}

/// The sandbox ceiling and whether this kernel enforces it, from the
/// launcher's own report on a trial command.
pub(crate) fn sandbox_line(ceiling: SandboxPolicy) -> String {
    let (enforced, detail) = sandbox_support(ceiling);
    let ceiling = policy_name(ceiling);
    if enforced {
        format!("supported on this kernel ({detail}); clients may ask for up to {ceiling}")
    } else {
        format!("NOT enforced on this kernel ({detail}); clients may ask for up to {ceiling}")
    }
}

/// Whether the launcher enforces `ceiling` (or, for full-access, which
/// restricts nothing, workspace-write) here, and its explanation.
pub(crate) fn sandbox_support(ceiling: SandboxPolicy) -> (bool, String) {
    let policy = match ceiling {
        SandboxPolicy::FullAccess => SandboxPolicy::WorkspaceWrite,
        other => other,
    };
    match keel::tools::workspace::sandbox::launcher::probe(policy, false) {
        Ok(status) => (status.enforced, status.detail),
        Err(reason) => (false, reason),
    }
}

/// A policy as keel.toml and the flags spell it.
pub(crate) fn policy_name(policy: SandboxPolicy) -> String {
    serde_json::to_value(policy)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{policy:?}"))
}
