//! `[tenants.<id>]`: what one tenant's principals may ask for (narrowing
//! the server's `[server]` ceiling) and what they may spend.

use serde::Deserialize;

use super::budget::BudgetConfig;

/// One tenant's table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The tenant's token budgets and concurrency cap (`[tenants.<id>.budget]`).
    #[serde(default)]
    pub budget: Option<BudgetConfig>,
}
