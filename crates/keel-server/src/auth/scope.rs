//! What a principal may do: the four scopes and sets of them. Apart from
//! the principal so that the errors can name a scope without depending on
//! authentication.

use std::fmt;

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
