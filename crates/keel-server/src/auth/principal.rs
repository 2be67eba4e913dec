//! Who is asking: a principal's tenant and scopes, put in every
//! authenticated request's extensions by the authentication middleware.

use keel_protocol::{Actor, ActorKind};

use super::scope::{Scope, Scopes};
use crate::error::ApiError;

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
