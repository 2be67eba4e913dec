//! Who made a request: the principal recorded with every submission and
//! every approval decision, the audit trail of a session.

use serde::{Deserialize, Serialize};

/// The tenant of sessions created without one (by the operator, or before
/// tenants existed).
pub const DEFAULT_TENANT: &str = "default";

/// How a principal proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// The server's own token (`--token-file`), or no token on loopback:
    /// the operator, with every scope on every tenant.
    Operator,
    /// An API key made by the operator (`keel keys create`).
    ApiKey,
    /// A JWT from the identity provider configured in `[auth.jwt]`.
    Jwt,
}

/// A principal as recorded in the log: `submitted_by` on a stored
/// submission, `decided_by` on an approval decision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Actor {
    /// The tenant the principal acted for.
    pub tenant: String,
    /// The principal's id: the API key's id, the JWT's subject, or
    /// `operator`.
    pub principal_id: String,
    /// How it authenticated.
    pub kind: ActorKind,
    /// The API key's name, or the JWT's subject; absent for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Actor {
    /// The operator acting on `tenant`.
    pub fn operator(tenant: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            principal_id: "operator".to_owned(),
            kind: ActorKind::Operator,
            name: None,
        }
    }
}
