//! Budgets: what a tenant, or one session, may spend, and their
//! enforcement.
//!
//! A tenant's budget comes from `[tenants.<id>.budget]` in keel.toml unless
//! one was set over the admin API (which wins for that tenant); a session's
//! only from the API. The API's budgets live in the store
//! ([`AccessStore::set_budget`]) and are cached here, reloaded whenever the
//! store's access revision moves (polled, so a budget set on one node
//! applies on every node within [`REVISION_POLL`]). Usage is the store's
//! hourly ledger, which every node writes in the commit of its
//! `token_usage` events, so every node counts the same totals.
//!
//! Enforced twice: a new submission that would make the model work is
//! refused (`429 budget_exhausted`, [`Budgets::admit`]) while a budget of
//! its session or tenant is spent, or when its session would need one of
//! the tenant's `max_concurrent_turns` turn slots and all are held; and a
//! running turn stops before its next model step ([`gate::BudgetGate`]). A
//! session with no budget anywhere costs no store read.
//!
//! The slots are the store's ([`AccessStore::reserve_turn`]): one is taken
//! in a transaction no other admission interleaves with, on any node, so a
//! burst of submissions to idle sessions cannot pass the cap; the store
//! gives it back when its session has no turn and nothing queued.

mod clock;
mod gate;
pub(crate) mod window;

pub use self::clock::BudgetClock;
pub(crate) use self::gate::BudgetGate;
pub use self::window::Exhausted;
pub(crate) use self::window::{Owner, Spend, first_exhausted};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use self::window::window_start;
use crate::error::ApiError;
use crate::metrics::Metrics;
use keel_config::{BudgetConfig, KeelConfig};
use keel_protocol::Op;
use keel_store::{AccessStore, BudgetTarget, LedgerRead, SlotClaim, StoreError, TurnSlot};

/// How often the store's access revision is read for budgets set on other
/// nodes.
pub(crate) const REVISION_POLL: Duration = Duration::from_millis(500);

/// Where the budget that applies to a target comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BudgetSource)]
pub(crate) enum Source {
    /// Set over the admin API (stored).
    Api,
    /// `[tenants.<id>.budget]` in keel.toml.
    Config,
}

/// The API's budgets as last read, with the revision they were read at.
#[derive(Default)]
struct Loaded {
    revision: Option<u64>,
    budgets: HashMap<BudgetTarget, BudgetConfig>,
}

/// The server's budgets and what they are counted against.
pub(crate) struct Budgets {
    /// The store's keys, budgets and usage ledger; without it nothing is
    /// enforced (the store keeps no ledger).
    access: Option<Arc<dyn AccessStore>>,
    /// keel.toml's budgets, by tenant.
    configured: BTreeMap<String, BudgetConfig>,
    loaded: RwLock<Loaded>,
    clock: BudgetClock,
    metrics: Arc<Metrics>,
}

impl Budgets {
    /// The budgets of `keel` (its `[tenants]`) and of `access`'s store.
    pub(crate) fn new(
        access: Option<Arc<dyn AccessStore>>,
        keel: &KeelConfig,
        clock: BudgetClock,
        metrics: Arc<Metrics>,
    ) -> Self {
        let configured: BTreeMap<String, BudgetConfig> = keel
            .tenants
            .iter()
            .filter_map(|(tenant, table)| Some((tenant.clone(), table.budget.filter(|budget| !budget.is_empty())?)))
            .collect();
        if access.is_none() && !configured.is_empty() {
            tracing::warn!("keel.toml sets budgets, but this store keeps no usage ledger: they are not enforced");
        }
        if let Some(access) = &access
            && configured.values().any(caps_turns)
        {
            access.expect_turn_slots();
        }
        Self {
            access,
            configured,
            loaded: RwLock::new(Loaded::default()),
            clock,
            metrics,
        }
    }

    /// The budget clock's time (ms since the Unix epoch).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The store's access part, or `503` when it has none.
    pub(crate) fn access(&self) -> Result<&dyn AccessStore, ApiError> {
        self.access
            .as_deref()
            .ok_or_else(|| ApiError::Unavailable("this server's store keeps no budgets or usage ledger".to_owned()))
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.loaded.read().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The budget that applies to `target`, and where it comes from.
    pub(crate) fn applying(&self, target: &BudgetTarget) -> Option<(BudgetConfig, Source)> {
        if let Some(budget) = self.read().budgets.get(target) {
            return Some((*budget, Source::Api));
        }
        match target {
            BudgetTarget::Tenant(tenant) => self.configured.get(tenant).map(|budget| (*budget, Source::Config)),
            BudgetTarget::Session(_) => None,
        }
    }

    /// Whether any budget applies to `session_id` of `tenant` (no store
    /// read: the cache only).
    pub(crate) fn watches(&self, tenant: &str, session_id: &str) -> bool {
        if self.access.is_none() {
            return false;
        }
        if self.configured.contains_key(tenant) {
            return true;
        }
        let loaded = self.read();
        !loaded.budgets.is_empty()
            && (loaded.budgets.contains_key(&BudgetTarget::Tenant(tenant.to_owned()))
                || loaded
                    .budgets
                    .contains_key(&BudgetTarget::Session(session_id.to_owned())))
    }

    /// What `target` spent by the budget clock: the rolling day always,
    /// and the all-time total when `with_total`.
    pub(crate) async fn spend(&self, target: &BudgetTarget, with_total: bool) -> Result<Spend, StoreError> {
        let Some(access) = &self.access else {
            return Ok(Spend::new(self.now_ms(), &[], None));
        };
        let now_ms = self.now_ms();
        let read = LedgerRead {
            target,
            since_ms: window_start(now_ms),
            with_total,
        };
        let admission = access.admission(std::slice::from_ref(&read), None).await?;
        let ledger = admission.ledgers.first();
        Ok(Spend::new(
            now_ms,
            ledger.map_or(&[][..], |ledger| &ledger.buckets),
            ledger.and_then(|ledger| ledger.total.as_ref()),
        ))
    }

    /// The token budgets that watch `session_id` of `tenant`: its own, then
    /// its tenant's, each with a token limit.
    fn token_budgets(&self, tenant: &str, session_id: &str) -> Vec<(BudgetTarget, BudgetConfig)> {
        [
            BudgetTarget::Session(session_id.to_owned()),
            BudgetTarget::Tenant(tenant.to_owned()),
        ]
        .into_iter()
        .filter_map(|target| {
            let (budget, _) = self.applying(&target)?;
            (budget.has_daily_limit() || budget.has_total_limit()).then_some((target, budget))
        })
        .collect()
    }

    /// Reads the ledgers of `budgets` (see [`Self::token_budgets`]), and
    /// takes `claim`'s turn slot if one is given, in one wait for the store;
    /// then finds the first spent limit.
    async fn check(
        &self,
        tenant: &str,
        session_id: &str,
        budgets: &[(BudgetTarget, BudgetConfig)],
        claim: Option<SlotClaim<'_>>,
    ) -> Result<(Option<Exhausted>, Option<TurnSlot>), StoreError> {
        let Some(access) = &self.access else {
            return Ok((None, None));
        };
        let now_ms = self.now_ms();
        let reads: Vec<LedgerRead<'_>> = budgets
            .iter()
            .map(|(target, budget)| LedgerRead {
                target,
                since_ms: window_start(now_ms),
                with_total: budget.has_total_limit(),
            })
            .collect();
        let admission = access.admission(&reads, claim).await?;
        let spent = budgets
            .iter()
            .zip(&admission.ledgers)
            .find_map(|((target, budget), ledger)| {
                let owner = Owner {
                    tenant,
                    session_id: matches!(target, BudgetTarget::Session(_)).then_some(session_id),
                };
                let spend = Spend::new(now_ms, &ledger.buckets, ledger.total.as_ref());
                first_exhausted(budget, &spend, owner)
            });
        Ok((spent, admission.slot))
    }

    /// The first spent token limit of the session's budget, then of its
    /// tenant's.
    pub(crate) async fn exhausted(&self, tenant: &str, session_id: &str) -> Result<Option<Exhausted>, StoreError> {
        if !self.watches(tenant, session_id) {
            return Ok(None);
        }
        let budgets = self.token_budgets(tenant, session_id);
        if budgets.is_empty() {
            return Ok(None);
        }
        Ok(self.check(tenant, session_id, &budgets, None).await?.0)
    }

    /// Refuses (`429 budget_exhausted`) an op that would make the model
    /// work on `session_id` of `tenant` while one of their budgets is
    /// spent, or when the session holds no turn slot and the tenant's
    /// `max_concurrent_turns` are all held; otherwise takes the session a
    /// slot (it keeps the one it holds while it runs or has work queued).
    pub(crate) async fn admit(&self, tenant: &str, session_id: &str, op: &Op) -> Result<(), ApiError> {
        if !spends_tokens(op) || !self.watches(tenant, session_id) {
            return Ok(());
        }
        let cap = self
            .applying(&BudgetTarget::Tenant(tenant.to_owned()))
            .and_then(|(budget, _)| budget.max_concurrent_turns);
        let budgets = self.token_budgets(tenant, session_id);
        if cap.is_none() && budgets.is_empty() {
            return Ok(());
        }
        let claim = cap.map(|cap| SlotClaim {
            tenant,
            session_id,
            cap,
            now_ms: keel_protocol::now_ms(),
        });
        let (refusal, slot_maybe_taken) = match self.check(tenant, session_id, &budgets, claim).await {
            Ok((None, Some(TurnSlot::Full { held }))) => {
                let owner = Owner {
                    tenant,
                    session_id: None,
                };
                let cap = cap.unwrap_or_default();
                return Err(self.refuse(owner.exhausted("max_concurrent_turns", cap, held, None)));
            }
            Ok((None, _)) => return Ok(()),
            Ok((Some(spent), slot)) => (self.refuse(spent), slot == Some(TurnSlot::Taken)),
            // Whether a slot was taken before the failure is not known.
            Err(error) => (error.into(), claim.is_some()),
        };
        // Refused after all: a slot taken for it goes back at once (the
        // store keeps one its session needs: a turn in flight, work queued).
        if slot_maybe_taken
            && let Some(access) = &self.access
            && let Err(error) = access.give_back_turn(session_id).await
        {
            tracing::warn!(%error, session_id, "cannot give back a turn slot; it counts until its grace passes");
        }
        Err(refusal)
    }

    /// Counts a spent budget of `tenant`'s in the metrics.
    pub(crate) fn count(&self, tenant: &str) {
        self.metrics.budget_exhausted(tenant);
    }

    fn refuse(&self, spent: Exhausted) -> ApiError {
        self.count(&spent.tenant);
        ApiError::BudgetExhausted(Box::new(spent))
    }

    /// Sets (`Some`) or removes `target`'s budget over the API, and reloads.
    pub(crate) async fn set(&self, target: &BudgetTarget, budget: Option<&BudgetConfig>) -> Result<(), ApiError> {
        let json = budget
            .map(serde_json::to_string)
            .transpose()
            .map_err(|error| ApiError::Internal(format!("cannot encode a budget: {error}")))?;
        self.access()?.set_budget(target, json.as_deref()).await?;
        self.reload().await?;
        Ok(())
    }

    /// Reads the API's budgets again if the store's access revision moved
    /// since they were last read.
    pub(crate) async fn reload(&self) -> Result<(), StoreError> {
        let Some(access) = &self.access else { return Ok(()) };
        let revision = access.access_revision().await?;
        if self.read().revision == Some(revision) {
            return Ok(());
        }
        let mut budgets = HashMap::new();
        for (target, json) in access.budgets().await? {
            match serde_json::from_str::<BudgetConfig>(&json) {
                Ok(budget) => {
                    budgets.insert(target, budget);
                }
                Err(error) => tracing::warn!(?target, %error, "ignoring a stored budget that does not parse"),
            }
        }
        if budgets.values().any(caps_turns) {
            access.expect_turn_slots();
        }
        let mut loaded = self.loaded.write().unwrap_or_else(|poison| poison.into_inner());
        // A slower read of an older revision must not replace a newer one.
        if loaded.revision.is_none_or(|seen| seen < revision) {
            *loaded = Loaded {
                revision: Some(revision),
                budgets,
            };
        }
        Ok(())
    }

    /// Reloads the API's budgets every [`REVISION_POLL`] the access
    /// revision moved, until `closing`.
    pub(crate) async fn follow(&self, mut closing: watch::Receiver<bool>) {
        if self.access.is_none() {
            return;
        }
        loop {
            if let Err(error) = self.reload().await {
                tracing::warn!(%error, "cannot read the stored budgets");
            }
            tokio::select! {
                () = tokio::time::sleep(REVISION_POLL) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
        }
    }
}

/// Whether `budget` caps how many turns run at once: then admissions take
/// turn slots, which the store must give back (on every node).
fn caps_turns(budget: &BudgetConfig) -> bool {
    budget.max_concurrent_turns.is_some()
}

/// Whether `op` makes the model work: a message, a steer, a compaction or
/// a regeneration. Interrupts, approvals and shutdowns always pass.
fn spends_tokens(op: &Op) -> bool {
    matches!(
        op,
        Op::UserInput { .. } | Op::Steer { .. } | Op::Compact | Op::Regenerate
    )
}
