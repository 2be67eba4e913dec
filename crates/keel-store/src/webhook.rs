//! The webhook outbox: endpoints, and one delivery per endpoint and event
//! that it subscribes to.
//!
//! Deliveries are written by the store itself, in the transaction that
//! appends the event (a batch's events whose type is one of
//! [`keel_protocol::WEBHOOK_EVENT_TYPES`], matched against the endpoints
//! stored at that moment, by type, bot and tenant). So a crash can delay
//! a delivery, never lose it, and an event that was rolled back has none.
//!
//! Whoever delivers *claims* the oldest pending delivery of each endpoint
//! and session for a while ([`WebhookStore::claim_webhook_deliveries`]):
//! one claimant at a time, in sequence order per session, and another
//! takes over when a claim runs out (its claimant died). It then settles
//! it: delivered, to be retried at a later time, or failed.

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// A secret deliveries are signed with, and until when it is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookSecret {
    /// The secret, as the receiver holds it (`whsec_` and base64).
    pub secret: String,
    /// When it stops being used (ms since the Unix epoch); for ever when
    /// `None`. A rotated-out secret signs beside the new one until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

/// An endpoint that receives deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookEndpoint {
    /// Its id (`wh_…`, or an operator's name for one from `keel.toml`).
    pub id: String,
    /// Where deliveries are posted.
    pub url: String,
    /// The secrets deliveries are signed with, newest first.
    pub secrets: Vec<WebhookSecret>,
    /// The event types it receives, each one of
    /// [`keel_protocol::WEBHOOK_EVENT_TYPES`].
    pub event_types: Vec<String>,
    /// Only the sessions of this bot, when set.
    pub bot_id: Option<String>,
    /// Only the sessions of this tenant, when set.
    pub tenant: Option<String>,
    /// A note for people.
    pub description: Option<String>,
    /// When it was made (ms since the Unix epoch).
    pub created_at_ms: u64,
}

impl WebhookEndpoint {
    /// The event types as the store keeps them (`,a,b,`), so that one
    /// `instr`/`strpos` finds whether an endpoint wants a type.
    pub(crate) fn stored_types(&self) -> String {
        format!(",{},", self.event_types.join(","))
    }

    /// The event types from how the store keeps them.
    pub(crate) fn types_from_stored(stored: &str) -> Vec<String> {
        stored
            .split(',')
            .filter(|kind| !kind.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet: waiting for its turn, its next attempt, or in
    /// flight.
    Pending,
    /// The endpoint answered `2xx`.
    Delivered,
    /// Given up on, after retrying for as long as allowed.
    Failed,
}

impl DeliveryState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    pub(crate) fn parse(stored: &str) -> Option<Self> {
        match stored {
            "pending" => Some(Self::Pending),
            "delivered" => Some(Self::Delivered),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// One event for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookDelivery {
    /// Its id, stable across attempts (the receiver deduplicates by it).
    pub id: u64,
    /// The endpoint.
    pub endpoint_id: String,
    /// The session whose event it is.
    pub session_id: String,
    /// The event's sequence in the session's log.
    pub sequence: u64,
    /// The event's type.
    pub event_type: String,
    /// When the event was committed (ms since the Unix epoch).
    pub created_at_ms: u64,
    /// Where it stands.
    pub state: DeliveryState,
    /// How many attempts were made.
    pub attempts: u32,
    /// When the next attempt is due, while pending.
    pub next_attempt_at_ms: u64,
    /// The HTTP status of the last attempt, if one was answered.
    pub last_status: Option<u16>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When it was delivered or given up on.
    pub finished_at_ms: Option<u64>,
}

/// How an attempt ended, for [`WebhookStore::settle_webhook_delivery`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryOutcome {
    /// Answered `2xx` with `status`.
    Delivered {
        /// The status.
        status: u16,
    },
    /// Not delivered; try again at `next_attempt_at_ms`.
    Retry {
        /// The status, if the endpoint answered.
        status: Option<u16>,
        /// What went wrong.
        error: String,
        /// When to try again.
        next_attempt_at_ms: u64,
    },
    /// Not delivered, and no more attempts will be made.
    Failed {
        /// The status, if the endpoint answered.
        status: Option<u16>,
        /// What went wrong.
        error: String,
    },
}

/// Which deliveries [`WebhookStore::webhook_deliveries`] lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFilter {
    /// Only those after this id (paging), oldest first.
    pub after_id: Option<u64>,
    /// Only those in this state.
    pub state: Option<DeliveryState>,
    /// How many at most.
    pub limit: usize,
}

/// The webhook outbox of a store (see the module's text).
pub trait WebhookStore: Send + Sync {
    /// Stores `endpoint`, replacing the one with its id if any; returns
    /// whether it replaced one. Events committed from then on are matched
    /// against it.
    fn put_webhook_endpoint<'a>(&'a self, endpoint: &'a WebhookEndpoint) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Every endpoint, oldest first.
    fn webhook_endpoints(&self) -> BoxFuture<'_, Result<Vec<WebhookEndpoint>, StoreError>>;

    /// Removes an endpoint and its deliveries; `false` when there was none.
    fn delete_webhook_endpoint<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Claims for `claimant`, until `until_ms`, the deliveries of up to
    /// `limit` endpoint-and-session pairs whose oldest pending delivery is
    /// due at `now_ms` and held by nobody (or its claim ran out): that
    /// delivery and the pending ones after it, `chain` at most, by id. A
    /// pair's deliveries are to be sent in that order, each after the one
    /// before it was delivered; the claimant lets go of those it will not
    /// send ([`WebhookStore::release_webhook_deliveries`]).
    fn claim_webhook_deliveries<'a>(
        &'a self,
        claimant: &'a str,
        now_ms: u64,
        until_ms: u64,
        limit: usize,
        chain: usize,
    ) -> BoxFuture<'a, Result<Vec<WebhookDelivery>, StoreError>>;

    /// Lets go of the claims `claimant` holds on the deliveries `ids`,
    /// unattempted: anyone may claim them again. Returns how many it held.
    fn release_webhook_deliveries<'a>(
        &'a self,
        ids: &'a [u64],
        claimant: &'a str,
    ) -> BoxFuture<'a, Result<usize, StoreError>>;

    /// Records how an attempt on a delivery `claimant` holds ended, at
    /// `now_ms`, and lets the claim go; `false` (changing nothing) when the
    /// claim was lost to another claimant.
    fn settle_webhook_delivery<'a>(
        &'a self,
        id: u64,
        claimant: &'a str,
        now_ms: u64,
        outcome: &'a DeliveryOutcome,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The deliveries of an endpoint, by id, filtered.
    fn webhook_deliveries<'a>(
        &'a self,
        endpoint_id: &'a str,
        filter: &'a DeliveryFilter,
    ) -> BoxFuture<'a, Result<Vec<WebhookDelivery>, StoreError>>;

    /// Deletes the deliveries that were delivered or failed before
    /// `before_ms`; returns how many.
    fn prune_webhook_deliveries(&self, before_ms: u64) -> BoxFuture<'_, Result<u64, StoreError>>;
}

/// The columns [`WebhookDelivery`] is read from, in its fields' order.
pub(crate) const DELIVERY_COLUMNS: &str = "id, endpoint_id, session_id, sequence, event_type, created_at_ms, state, \
     attempts, next_attempt_at_ms, last_status, last_error, finished_at_ms";

/// The columns [`WebhookEndpoint`] is read from.
pub(crate) const ENDPOINT_COLUMNS: &str = "id, url, secrets, event_types, bot_id, tenant, description, created_at_ms";

/// The claim's head rule, shared by both stores: the oldest pending
/// delivery of its endpoint and session.
pub(crate) const IS_HEAD: &str = "NOT EXISTS (SELECT 1 FROM webhook_deliveries p
     WHERE p.state = 'pending' AND p.endpoint_id = d.endpoint_id AND p.session_id = d.session_id AND p.id < d.id)";

/// The chains of a claim, shared by both stores: of each endpoint and
/// session in `heads` (`endpoint_id`, `session_id`), its pending
/// deliveries by id, numbered from 1 (`n`).
pub(crate) const CHAINED: &str =
    "SELECT c.id, row_number() OVER (PARTITION BY c.endpoint_id, c.session_id ORDER BY c.id) AS n
     FROM heads h JOIN webhook_deliveries c
       ON c.endpoint_id = h.endpoint_id AND c.session_id = h.session_id AND c.state = 'pending'";

/// How an outcome is stored: state, status, error, next attempt, and
/// whether it finished.
pub(crate) fn outcome_columns(outcome: &DeliveryOutcome) -> (DeliveryState, Option<u16>, Option<&str>, Option<u64>) {
    match outcome {
        DeliveryOutcome::Delivered { status } => (DeliveryState::Delivered, Some(*status), None, None),
        DeliveryOutcome::Retry {
            status,
            error,
            next_attempt_at_ms,
        } => (
            DeliveryState::Pending,
            *status,
            Some(error.as_str()),
            Some(*next_attempt_at_ms),
        ),
        DeliveryOutcome::Failed { status, error } => (DeliveryState::Failed, *status, Some(error.as_str()), None),
    }
}

/// The most characters of an attempt's error kept.
pub(crate) const MAX_ERROR_CHARS: usize = 500;

/// `error`, cut to [`MAX_ERROR_CHARS`].
pub(crate) fn clip_error(error: &str) -> String {
    error.chars().take(MAX_ERROR_CHARS).collect()
}
