//! What a server needs of the store to know who may do what: API keys
//! (kept as hashes only), tenants' budgets, and the token usage that budgets
//! are counted against. Shared by every node on one database, so a key
//! made or revoked on one node, or tokens spent on one, count on all.

use futures::future::BoxFuture;
use keel_protocol::{StoreError, TokenUsage};

/// An API key as stored: never the key itself, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// The key's public id (shown by `keel keys list`, used to revoke it).
    pub id: String,
    /// The tenant whose sessions the key acts on.
    pub tenant: String,
    /// A name for people ("ci", "alice's laptop").
    pub name: String,
    /// The scopes it grants (`read`, `submit`, `approve`, `admin`).
    pub scopes: Vec<String>,
    /// SHA-256 of the secret, lowercase hex.
    pub hash: String,
    /// When it was made (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// When it was last used, as last recorded (use is recorded in batches).
    pub last_used_at_ms: Option<u64>,
    /// When it stops working, if it does.
    pub expires_at_ms: Option<u64>,
    /// When it was revoked, if it was.
    pub revoked_at_ms: Option<u64>,
}

/// What [`AccessStore::reserve_turn`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnSlot {
    /// The session took one of its tenant's free turn slots.
    Taken,
    /// The session holds one already: it runs a turn, or took a slot for
    /// work it has queued.
    Held,
    /// The tenant's sessions hold `held` slots, at least the cap: none was
    /// taken.
    Full {
        /// How many the tenant's sessions hold.
        held: u64,
    },
}

/// How long a slot taken for work that never reached the queue (its node
/// died between the two) keeps counting: past this, a session with no
/// turn and nothing queued gives its slot back.
pub const TURN_SLOT_GRACE_MS: u64 = 30_000;

/// Whose budget: a whole tenant, or one of its sessions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetTarget {
    /// Every session of the tenant.
    Tenant(String),
    /// One session (of the tenant it belongs to).
    Session(String),
}

impl BudgetTarget {
    /// The `(kind, id)` a store keys the target's rows by.
    pub(crate) fn key(&self) -> (&'static str, &str) {
        match self {
            BudgetTarget::Tenant(tenant) => (TENANT_KIND, tenant),
            BudgetTarget::Session(session_id) => (SESSION_KIND, session_id),
        }
    }

    /// The target a stored `(kind, id)` names; `None` for a kind this
    /// build does not know.
    pub(crate) fn from_key(kind: &str, id: String) -> Option<Self> {
        match kind {
            TENANT_KIND => Some(BudgetTarget::Tenant(id)),
            SESSION_KIND => Some(BudgetTarget::Session(id)),
            _ => None,
        }
    }
}

/// The stored kind of a [`BudgetTarget::Tenant`].
pub(crate) const TENANT_KIND: &str = "tenant";
/// The stored kind of a [`BudgetTarget::Session`].
pub(crate) const SESSION_KIND: &str = "session";

/// The start of the hour `at_ms` falls in: the ledger's bucket.
pub(crate) fn hour_of(at_ms: u64) -> u64 {
    at_ms - at_ms % HOUR_MS
}

/// An hour, in milliseconds.
pub(crate) const HOUR_MS: u64 = 3_600_000;

/// Token usage recorded in one hour, for rolling windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageBucket {
    /// The hour's start (ms since the Unix epoch, a multiple of 3,600,000).
    pub hour_start_ms: u64,
    /// Tokens recorded in it.
    pub usage: TokenUsage,
}

/// One ledger an admission or a step gate reads (see
/// [`AccessStore::admission`]).
#[derive(Debug, Clone, Copy)]
pub struct LedgerRead<'a> {
    /// Whose ledger.
    pub target: &'a BudgetTarget,
    /// The first hour wanted (see [`AccessStore::usage_buckets`]).
    pub since_ms: u64,
    /// Whether the all-time total is wanted as well.
    pub with_total: bool,
}

/// What a [`LedgerRead`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// The hours since the read's `since_ms`, oldest first.
    pub buckets: Vec<UsageBucket>,
    /// The all-time total, when it was asked for.
    pub total: Option<TokenUsage>,
}

/// A turn slot an admission asks for (see [`AccessStore::reserve_turn`]).
#[derive(Debug, Clone, Copy)]
pub struct SlotClaim<'a> {
    /// The tenant whose slots are counted.
    pub tenant: &'a str,
    /// The session that would hold the slot.
    pub session_id: &'a str,
    /// How many the tenant's sessions may hold.
    pub cap: u64,
    /// The admission's time (ms since the Unix epoch).
    pub now_ms: u64,
}

/// What [`AccessStore::admission`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// One ledger per read asked for, in order.
    pub ledgers: Vec<Ledger>,
    /// The slot, when one was claimed.
    pub slot: Option<TurnSlot>,
}

/// Keys, budgets and usage ledgers, for every node on one database.
///
/// Usage is written by the store itself: every `token_usage` event (and a
/// `context_compacted` one that carries usage) committed in a batch adds
/// its tokens to the ledger of its session's tenant and of the session, in
/// the same transaction, stamped with the event's `recorded_at_ms` (the
/// commit's time, by the writing store's clock). A batch that is refused
/// (fenced, stale, unknown session) adds nothing. Deleting a session drops
/// its own ledger and its budget, never its tenant's ledger: a tenant's
/// spending cannot be undone by deleting sessions.
pub trait AccessStore: Send + Sync {
    /// Stores a new key, exactly as given (the caller hashes the secret).
    /// [`StoreError::Exists`] (carrying the key's id, writing nothing) when
    /// its id or hash is taken.
    fn create_api_key<'a>(&'a self, key: &'a ApiKeyRecord) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Every key, revoked and expired ones included, oldest first.
    fn api_keys(&self) -> BoxFuture<'_, Result<Vec<ApiKeyRecord>, StoreError>>;

    /// Revokes a key at `at_ms` (a second revocation keeps the first time
    /// and leaves the revision as it is). Returns whether the key exists.
    fn revoke_api_key<'a>(&'a self, id: &'a str, at_ms: u64) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Records when keys were last used (`(id, at_ms)`; a later time only
    /// ever replaces an earlier one). Unknown ids are ignored. Does not
    /// bump the revision.
    fn touch_api_keys<'a>(&'a self, used: &'a [(String, u64)]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A number that grows whenever a key is created or revoked or a budget
    /// is set: one cheap read that nodes poll to know when to reload keys
    /// and budgets.
    fn access_revision(&self) -> BoxFuture<'_, Result<u64, StoreError>>;

    /// Every budget set over the API, as its JSON (the store does not read
    /// it), ordered by target.
    fn budgets(&self) -> BoxFuture<'_, Result<Vec<(BudgetTarget, String)>, StoreError>>;

    /// Sets (`Some`) or removes (`None`) a budget, and bumps the revision.
    fn set_budget<'a>(
        &'a self,
        target: &'a BudgetTarget,
        budget_json: Option<&'a str>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The usage of a tenant's sessions or of one session, by hour, for the
    /// hours starting at or after `since_ms` (oldest first).
    fn usage_buckets<'a>(
        &'a self,
        target: &'a BudgetTarget,
        since_ms: u64,
    ) -> BoxFuture<'a, Result<Vec<UsageBucket>, StoreError>>;

    /// All the usage ever recorded for a tenant or a session.
    fn usage_total<'a>(&'a self, target: &'a BudgetTarget) -> BoxFuture<'a, Result<TokenUsage, StoreError>>;

    /// How many sessions of `tenant` hold a turn slot, on any node: they
    /// have a turn in flight (a stored turn execution, from the checkpoint
    /// write that starts a turn to the one that ends it), or took a slot
    /// with [`Self::reserve_turn`] that they still hold.
    fn running_turns<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<u64, StoreError>>;

    /// Takes one of `tenant`'s `cap` turn slots for `session_id`, in one
    /// transaction that no other node's can interleave with, so a burst of
    /// admissions on any nodes never passes the cap. A session running a
    /// turn or holding a slot already holds one ([`TurnSlot::Held`]). A
    /// slot is given back by the store in the transaction that leaves its
    /// session with no turn in flight and nothing queued (the turn's end,
    /// a refusal), or when the session is deleted; one whose work never
    /// reached the queue stops counting after [`TURN_SLOT_GRACE_MS`].
    fn reserve_turn<'a>(
        &'a self,
        tenant: &'a str,
        session_id: &'a str,
        cap: u64,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<TurnSlot, StoreError>>;

    /// An admission's reads of the store at once: the `reads` ledgers and,
    /// when `claim` is given, a turn slot ([`Self::reserve_turn`]). A store
    /// that can sends them together, so an admission waits for the store
    /// once however many budgets watch it; this one reads them one by one.
    fn admission<'a>(
        &'a self,
        reads: &'a [LedgerRead<'a>],
        claim: Option<SlotClaim<'a>>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        Box::pin(async move {
            let mut ledgers = Vec::with_capacity(reads.len());
            for read in reads {
                let buckets = self.usage_buckets(read.target, read.since_ms).await?;
                let total = match read.with_total {
                    true => Some(self.usage_total(read.target).await?),
                    false => None,
                };
                ledgers.push(Ledger { buckets, total });
            }
            let slot = match claim {
                Some(claim) => Some(
                    self.reserve_turn(claim.tenant, claim.session_id, claim.cap, claim.now_ms)
                        .await?,
                ),
                None => None,
            };
            Ok(Admission { ledgers, slot })
        })
    }

    /// Gives back the slot `session_id` holds if it has no turn in flight
    /// and nothing queued: for an admission that took one and then refused
    /// the submission for another reason (a spent token budget), so that
    /// the slot does not count until its grace passes. Nothing for an
    /// unknown session or one without a slot.
    fn give_back_turn<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Tells the store that admissions take turn slots (a concurrency cap
    /// is configured, here or on another node), so that its writer gives
    /// them back as sessions come to rest. Until told, or until this
    /// handle takes a slot itself, a store whose slots live in the
    /// database sends no statement for them, which costs every write that
    /// ends a turn; a slot another node took for a session this one writes
    /// is then given back by the next admission once its grace has passed.
    fn expect_turn_slots(&self);
}
