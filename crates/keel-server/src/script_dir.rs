//! The directory API clients' `script:` models must come from, resolved
//! once: the server's (`[server] script_dir`) and each tenant's.

use std::path::{Path, PathBuf};

/// Where API clients' `script:` models may come from: the directory as
/// configured and as resolved (symlinks and `..` gone).
#[derive(Debug, Clone)]
pub(crate) struct ScriptDir {
    /// As `keel.toml` or the flag names it.
    pub(crate) configured: PathBuf,
    /// Resolved.
    pub(crate) canonical: PathBuf,
}

impl ScriptDir {
    /// Resolves the configured directory; it must exist.
    pub(crate) fn new(configured: &Path) -> Result<Self, String> {
        let canonical = configured
            .canonicalize()
            .map_err(|error| format!("the script directory {}: {error}", configured.display()))?;
        if !canonical.is_dir() {
            return Err(format!(
                "the script directory {} is not a directory",
                configured.display()
            ));
        }
        Ok(Self {
            configured: configured.to_path_buf(),
            canonical,
        })
    }

    /// Whether this directory is `other` or inside it, as resolved.
    pub(crate) fn is_inside(&self, other: &ScriptDir) -> bool {
        self.canonical.starts_with(&other.canonical)
    }
}
