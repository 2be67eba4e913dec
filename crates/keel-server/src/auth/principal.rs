//! Who is asking: a principal's tenant and scopes, put in every
//! authenticated request's extensions by the authentication middleware.

use std::fmt;

use keel_protocol::{Actor, ActorKind};

use crate::error::ApiError;

/// What a principal may do.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Get and list sessions, read their events, follow their streams.
    Read,
    /// Send messages, steer, interrupt, compact, regenerate, fork.
    Submit,
    /// Decide approvals.
    Approve,
    /// Delete sessions, manage keys and budgets, see every tenant's usage.
    Admin,
}

impl Scope {
    /// Every scope, in order.
    pub(crate) const ALL: [Scope; 4] = [Scope::Read, Scope::Submit, Scope::Approve, Scope::Admin];

    /// The scope's name in keys, tokens and errors.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Submit => "submit",
            Scope::Approve => "approve",
            Scope::Admin => "admin",
        }
    }

    /// The scope named `name`, if there is one.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|scope| scope.name() == name)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Scopes(u8);

impl Scopes {
    /// Every scope.
    pub(crate) const ALL: Scopes = Scopes(0b1111);

    /// The set holding `scopes`.
    pub(crate) fn of(scopes: impl IntoIterator<Item = Scope>) -> Self {
        Self(scopes.into_iter().fold(0, |bits, scope| bits | Self::bit(scope)))
    }

    /// Whether `scope` is in the set.
    pub(crate) fn has(self, scope: Scope) -> bool {
        self.0 & Self::bit(scope) != 0
    }

    /// The scopes in the set, in order.
    pub(crate) fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |scope| self.has(*scope))
    }

    fn bit(scope: Scope) -> u8 {
        1 << (scope as u8)
    }
}

/// Which tenants' sessions a principal sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tenancy {
    /// Every tenant's: the operator.
    All,
    /// One tenant's.
    One(String),
}

/// The principal of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// What is recorded as `submitted_by` / `decided_by`.
    pub(crate) actor: Actor,
    /// Whose sessions it sees.
    pub(crate) tenancy: Tenancy,
    /// What it may do.
    pub(crate) scopes: Scopes,
}

impl Principal {
    /// The operator: every scope on every tenant; it acts on the default
    /// tenant unless a request names another.
    pub(crate) fn operator() -> Self {
        Self {
            actor: Actor::operator(keel_protocol::DEFAULT_TENANT),
            tenancy: Tenancy::All,
            scopes: Scopes::ALL,
        }
    }

    /// A principal of one tenant.
    pub(crate) fn of_tenant(
        tenant: &str,
        principal_id: &str,
        kind: ActorKind,
        name: Option<String>,
        scopes: Scopes,
    ) -> Self {
        Self {
            actor: Actor {
                tenant: tenant.to_owned(),
                principal_id: principal_id.to_owned(),
                kind,
                name,
            },
            tenancy: Tenancy::One(tenant.to_owned()),
            scopes,
        }
    }

    /// `403` naming the scope unless the principal has it.
    pub(crate) fn require(&self, scope: Scope) -> Result<(), ApiError> {
        if self.scopes.has(scope) {
            Ok(())
        } else {
            Err(ApiError::MissingScope(scope))
        }
    }

    /// Whether the principal may see the sessions of `tenant`.
    pub(crate) fn sees(&self, tenant: &str) -> bool {
        match &self.tenancy {
            Tenancy::All => true,
            Tenancy::One(own) => own == tenant,
        }
    }

    /// The one tenant the principal is limited to, `None` for the operator.
    pub(crate) fn tenant_filter(&self) -> Option<&str> {
        match &self.tenancy {
            Tenancy::All => None,
            Tenancy::One(own) => Some(own),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_a_set_and_a_missing_one_is_named() {
        let scopes = Scopes::of([Scope::Read, Scope::Approve]);
        assert!(scopes.has(Scope::Read) && scopes.has(Scope::Approve));
        assert!(!scopes.has(Scope::Submit) && !scopes.has(Scope::Admin));
        assert_eq!(scopes.iter().collect::<Vec<_>>(), [Scope::Read, Scope::Approve]);
        assert_eq!(Scope::parse("admin"), Some(Scope::Admin));
        assert_eq!(Scope::parse("root"), None);
        let principal = Principal::of_tenant("a", "k1", ActorKind::ApiKey, Some("ci".into()), scopes);
        assert_eq!(
            principal.require(Scope::Submit),
            Err(ApiError::MissingScope(Scope::Submit))
        );
        assert!(principal.sees("a") && !principal.sees("b"));
        assert!(Principal::operator().sees("b"));
    }
}
