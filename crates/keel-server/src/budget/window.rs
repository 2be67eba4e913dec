//! What a budget target spent, and which of its limits that exhausts: pure
//! arithmetic over the store's hourly usage ledger, so it can be checked
//! without a store.
//!
//! The rolling day is the last 24 hourly buckets as of the server's clock:
//! the current hour's and the 23 before it. A bucket leaves the window 24
//! hours after its hour began, which is when a daily limit it helped spend
//! may open again (`resets_at_ms`).

use serde::Serialize;
use utoipa::ToSchema;

use keel_config::BudgetConfig;
use keel_protocol::TokenUsage;
use keel_store::UsageBucket;

/// One hour, in ms: the ledger's bucket.
pub(crate) const HOUR_MS: u64 = 3_600_000;

/// The buckets of a rolling day.
pub(crate) const DAY_HOURS: u64 = 24;

/// The start of the oldest hour in the rolling day as of `now_ms`.
pub(crate) fn window_start(now_ms: u64) -> u64 {
    (now_ms - now_ms % HOUR_MS).saturating_sub((DAY_HOURS - 1) * HOUR_MS)
}

/// Tokens, counted as budgets count them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct Tally {
    /// Prompt tokens (cached ones included).
    pub(crate) input_tokens: u64,
    /// Generated tokens (reasoning included).
    pub(crate) output_tokens: u64,
    /// Both.
    pub(crate) total_tokens: u64,
}

impl From<&TokenUsage> for Tally {
    fn from(usage: &TokenUsage) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            total_tokens: usage.input_tokens.saturating_add(usage.output_tokens),
        }
    }
}

/// The rolling day a spend was counted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct DayWindow {
    /// The start of its oldest hour (ms since the Unix epoch).
    pub(crate) from_ms: u64,
    /// The server's clock when it was counted.
    pub(crate) now_ms: u64,
    /// When its oldest bucket with usage leaves it; `null` when it holds
    /// none.
    pub(crate) oldest_leaves_at_ms: Option<u64>,
}

/// What a tenant or a session spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct Spend {
    /// In the rolling day.
    pub(crate) day: Tally,
    /// The rolling day.
    pub(crate) window: DayWindow,
    /// Ever (`null` when the budget has no all-time limit: not read).
    pub(crate) all_time: Option<Tally>,
}

impl Spend {
    /// The spend of the `buckets` read for the window of `now_ms` (any
    /// older ones are left out), and of `total` when it was read.
    pub(crate) fn new(now_ms: u64, buckets: &[UsageBucket], total: Option<&TokenUsage>) -> Self {
        let from_ms = window_start(now_ms);
        let mut day = TokenUsage::default();
        let mut oldest: Option<u64> = None;
        for bucket in buckets.iter().filter(|bucket| bucket.hour_start_ms >= from_ms) {
            day.add(&bucket.usage);
            if bucket.usage != TokenUsage::default() {
                oldest = Some(oldest.map_or(bucket.hour_start_ms, |seen| seen.min(bucket.hour_start_ms)));
            }
        }
        Self {
            day: Tally::from(&day),
            window: DayWindow {
                from_ms,
                now_ms,
                oldest_leaves_at_ms: oldest.map(|hour| hour + DAY_HOURS * HOUR_MS),
            },
            all_time: total.map(Tally::from),
        }
    }
}

/// A limit that is spent: what the 429 body and the turn's abort name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[schema(as = BudgetExhausted)]
pub struct Exhausted {
    /// Whose budget: `tenant` or `session`.
    #[schema(value_type = String, example = "tenant")]
    pub applies_to: &'static str,
    /// The tenant (of the session, for a session's budget).
    pub tenant: String,
    /// The session, for a session's budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The limit spent: a field of the budget (`total_tokens_per_day`,
    /// `max_concurrent_turns`, …).
    #[schema(value_type = String, example = "total_tokens_per_day")]
    pub limit: &'static str,
    /// Its value.
    pub allowed: u64,
    /// What was spent (or, for `max_concurrent_turns`, the turns running).
    pub used: u64,
    /// When the limit opens again: when the oldest hour of the rolling day
    /// leaves it; `null` for an all-time limit or the concurrency cap.
    pub resets_at_ms: Option<u64>,
}

impl std::fmt::Display for Exhausted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let whose = match &self.session_id {
            Some(session_id) => format!("session '{session_id}'"),
            None => format!("tenant '{}'", self.tenant),
        };
        write!(
            f,
            "the {} budget of {whose} is spent ({} of {})",
            self.limit, self.used, self.allowed
        )?;
        match self.resets_at_ms {
            Some(at) => write!(f, "; it opens again at {at} ms since the epoch"),
            None => Ok(()),
        }
    }
}

/// Who a budget belongs to, as an [`Exhausted`] names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    /// The tenant.
    pub(crate) tenant: &'a str,
    /// The session, for a session's budget.
    pub(crate) session_id: Option<&'a str>,
}

impl Owner<'_> {
    /// `limit`, spent as `used` of `allowed`, of this owner's budget.
    pub(crate) fn exhausted(
        self,
        limit: &'static str,
        allowed: u64,
        used: u64,
        resets_at_ms: Option<u64>,
    ) -> Exhausted {
        Exhausted {
            applies_to: if self.session_id.is_some() { "session" } else { "tenant" },
            tenant: self.tenant.to_owned(),
            session_id: self.session_id.map(str::to_owned),
            limit,
            allowed,
            used,
            resets_at_ms,
        }
    }
}

/// The first token limit of `budget` that `spend` reaches (a limit is
/// spent once what was used is at least it), daily limits first.
pub(crate) fn first_exhausted(budget: &BudgetConfig, spend: &Spend, owner: Owner<'_>) -> Option<Exhausted> {
    let resets = spend.window.oldest_leaves_at_ms;
    let daily = [
        (
            "input_tokens_per_day",
            budget.input_tokens_per_day,
            spend.day.input_tokens,
        ),
        (
            "output_tokens_per_day",
            budget.output_tokens_per_day,
            spend.day.output_tokens,
        ),
        (
            "total_tokens_per_day",
            budget.total_tokens_per_day,
            spend.day.total_tokens,
        ),
    ];
    for (limit, allowed, used) in daily {
        if let Some(allowed) = allowed
            && used >= allowed
        {
            return Some(owner.exhausted(limit, allowed, used, resets));
        }
    }
    let all_time = spend.all_time.unwrap_or_default();
    let totals = [
        ("input_tokens", budget.input_tokens, all_time.input_tokens),
        ("output_tokens", budget.output_tokens, all_time.output_tokens),
        ("total_tokens", budget.total_tokens, all_time.total_tokens),
    ];
    totals.into_iter().find_map(|(limit, allowed, used)| {
        let allowed = allowed?;
        (used >= allowed).then(|| owner.exhausted(limit, allowed, used, None))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(hour_start_ms: u64, input_tokens: u64, output_tokens: u64) -> UsageBucket {
        UsageBucket {
            hour_start_ms,
            usage: TokenUsage {
                input_tokens,
                output_tokens,
                ..TokenUsage::default()
            },
        }
    }

    const TENANT: Owner<'static> = Owner {
        tenant: "acme",
        session_id: None,
    };

    #[test]
    fn the_rolling_day_is_the_last_24_hourly_buckets_and_resets_when_its_oldest_leaves() {
        let day0 = 1_000 * DAY_HOURS * HOUR_MS;
        let now = day0 + 30 * HOUR_MS + 5; // 06:00 and 5 ms, the next day
        let from = window_start(now);
        assert_eq!(from, day0 + 7 * HOUR_MS);
        let buckets = [
            bucket(day0 + 6 * HOUR_MS, 1_000, 1_000), // left the window an hour ago
            bucket(day0 + 7 * HOUR_MS, 0, 0),         // empty: keeps nothing open
            bucket(day0 + 9 * HOUR_MS, 40, 10),
            bucket(day0 + 30 * HOUR_MS, 5, 5),
        ];
        let spend = Spend::new(now, &buckets, None);
        assert_eq!(
            spend.day,
            Tally {
                input_tokens: 45,
                output_tokens: 15,
                total_tokens: 60
            }
        );
        assert_eq!(spend.window.oldest_leaves_at_ms, Some(day0 + 33 * HOUR_MS));
        let budget = BudgetConfig {
            total_tokens_per_day: Some(60),
            ..BudgetConfig::default()
        };
        let spent = first_exhausted(&budget, &spend, TENANT).expect("spent at its limit");
        assert_eq!(
            (spent.limit, spent.allowed, spent.used),
            ("total_tokens_per_day", 60, 60)
        );
        assert_eq!(spent.resets_at_ms, Some(day0 + 33 * HOUR_MS));
        assert_eq!(spent.applies_to, "tenant");
        let roomier = BudgetConfig {
            total_tokens_per_day: Some(61),
            ..BudgetConfig::default()
        };
        assert_eq!(first_exhausted(&roomier, &spend, TENANT), None);
        // Once the 09:00 bucket leaves, only the last hour's 10 count.
        let later = Spend::new(day0 + 33 * HOUR_MS, &buckets, None);
        assert_eq!(later.day.total_tokens, 10);
        assert_eq!(first_exhausted(&budget, &later, TENANT), None);
    }

    #[test]
    fn all_time_limits_never_reset_and_name_the_session_they_belong_to() {
        let total = TokenUsage {
            input_tokens: 10,
            output_tokens: 90,
            ..TokenUsage::default()
        };
        let spend = Spend::new(5 * HOUR_MS, &[], Some(&total));
        let budget = BudgetConfig {
            input_tokens: Some(100),
            output_tokens: Some(90),
            ..BudgetConfig::default()
        };
        let owner = Owner {
            tenant: "acme",
            session_id: Some("s1"),
        };
        let spent = first_exhausted(&budget, &spend, owner).expect("output spent");
        assert_eq!(
            serde_json::to_value(&spent).expect("json"),
            serde_json::json!({
                "applies_to": "session", "tenant": "acme", "session_id": "s1",
                "limit": "output_tokens", "allowed": 90, "used": 90, "resets_at_ms": null
            })
        );
        assert_eq!(first_exhausted(&BudgetConfig::default(), &spend, owner), None);
    }
}
