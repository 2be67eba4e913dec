//! `[auth]`: who may call `keel serve` besides the operator's token.

use serde::Deserialize;

/// `[auth]` in `keel.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {}
