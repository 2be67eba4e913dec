//! The step gate a server installs in its sessions: a turn whose session or
//! tenant budget is spent stops before its next model step.

use std::sync::Arc;

use keel_agent::{StepGate, StepVerdict};
use keel_model::BoxFuture;

use super::Budgets;

/// The gate of one session of `tenant`.
pub(crate) struct BudgetGate {
    pub(crate) budgets: Arc<Budgets>,
    pub(crate) tenant: String,
}

impl StepGate for BudgetGate {
    fn watches(&self, session_id: &str) -> bool {
        self.budgets.watches(&self.tenant, session_id)
    }

    fn before_step<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, StepVerdict> {
        Box::pin(async move {
            match self.budgets.exhausted(&self.tenant, session_id).await {
                Ok(None) => StepVerdict::Go,
                Ok(Some(spent)) => {
                    self.budgets.count(&self.tenant);
                    StepVerdict::BudgetExhausted(spent.to_string())
                }
                // The ledger cannot be read: the step runs (a budget is
                // not worth failing turns over an outage), and the next
                // step asks again.
                Err(error) => {
                    tracing::warn!(%session_id, %error, "cannot read a session's budget; the step runs");
                    StepVerdict::Go
                }
            }
        })
    }
}
