//! Token budgets and the cap on concurrent turns, for a tenant or a session.
//!
//! Each limit is optional: a budget limits only what it names. The daily
//! limits count a rolling 24 hours (the last 24 hourly buckets of the
//! store's usage ledger), the others every token ever recorded. The server
//! enforces them (`keel-server`'s `budget` module); this crate only reads
//! them.

use serde::{Deserialize, Serialize};

/// A budget (`[tenants.<id>.budget]`, or set over the admin API).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Prompt tokens in the last 24 hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens_per_day: Option<u64>,
    /// Generated tokens in the last 24 hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens_per_day: Option<u64>,
    /// Prompt and generated tokens in the last 24 hours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens_per_day: Option<u64>,
    /// Prompt tokens, ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Generated tokens, ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Prompt and generated tokens, ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    /// The most turns running at once across the tenant's sessions (on
    /// every node); a new turn past it is refused. Meaningful for a
    /// tenant's budget only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_turns: Option<u64>,
}

impl BudgetConfig {
    /// Whether any of its limits counts tokens in a rolling day.
    pub fn has_daily_limit(&self) -> bool {
        self.input_tokens_per_day.is_some()
            || self.output_tokens_per_day.is_some()
            || self.total_tokens_per_day.is_some()
    }

    /// Whether any of its limits counts every token ever recorded.
    pub fn has_total_limit(&self) -> bool {
        self.input_tokens.is_some() || self.output_tokens.is_some() || self.total_tokens.is_some()
    }

    /// Whether it limits nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::BudgetConfig;
    use crate::KeelConfig;

    #[test]
    fn a_tenant_s_budget_is_read_from_its_table_and_unknown_limits_are_errors() {
        let text = "[tenants.acme.budget]\ntotal_tokens_per_day = 1000\noutput_tokens = 50\nmax_concurrent_turns = 2\n";
        let config = KeelConfig::parse(text, Path::new("keel.toml")).expect("parses");
        let budget = config.tenants["acme"].budget.expect("a budget");
        assert_eq!(
            budget,
            BudgetConfig {
                total_tokens_per_day: Some(1000),
                output_tokens: Some(50),
                max_concurrent_turns: Some(2),
                ..BudgetConfig::default()
            }
        );
        assert!(budget.has_daily_limit() && budget.has_total_limit() && !budget.is_empty());
        let wrong = KeelConfig::parse("[tenants.acme.budget]\ntokens_per_week = 1\n", Path::new("keel.toml"));
        let message = wrong.expect_err("refused").to_string();
        assert!(
            message.contains("keel.toml:2:1") && message.contains("tokens_per_week"),
            "{message}"
        );
    }
}
