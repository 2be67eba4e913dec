//! Token budgets and the cap on concurrent turns, for a tenant or a session.

use serde::Deserialize;

/// A budget (`[tenants.<id>.budget]`, or set over the admin API).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {}
