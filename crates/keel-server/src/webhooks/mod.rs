//! Webhooks: posting the outbox's deliveries (see `keel_store::WebhookStore`)
//! to their endpoints, signed as the Standard Webhooks specification says.
//!
//! The store writes a delivery in the transaction of its event; this
//! module only sends. Each node runs one [`Deliverer`]: it claims due
//! deliveries as chains (of each endpoint and session, the oldest pending
//! and up to [`CHAIN`] after it), posts a chain's one at a time in
//! sequence order, and settles each before the next is sent: delivered on
//! `2xx`; otherwise retried with exponential backoff and jitter until
//! `[webhooks] retry_for_s` after the event, then failed, and the rest of
//! its chain let go. Settling each on its own costs a write per delivery,
//! but a crash can then send again only the last one sent, so a receiver
//! never sees a session's deliveries go back past a later one. A claim
//! lasts a little longer than an attempt can, and a chain goes on only
//! while its claim covers the next attempt; a node that dies holding one
//! only delays its deliveries until the claim runs out and another node
//! takes them. Delivery is at least once: a receiver deduplicates by
//! `webhook-id`, which every attempt of a delivery shares, as it shares
//! the body.

mod sign;
mod target;

pub(crate) use sign::{key_of, new_secret};
pub(crate) use target::check_url;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_config::WebhooksConfig;
use keel_protocol::{RecordedEvent, now_ms};
use keel_store::{CheckpointStore, DeliveryOutcome, StoreError, WebhookDelivery, WebhookEndpoint, WebhookStore};
use serde::Serialize;
use tokio::sync::{Notify, Semaphore, watch};

use crate::metrics::{Metrics, WebhookOutcome};

/// How often the outbox is looked at when nothing woke the deliverer
/// (retries coming due, other nodes' events).
const POLL: Duration = Duration::from_secs(1);

/// The most deliveries of one endpoint and session claimed at once, and
/// sent one after the other under that claim: one claim per chain rather
/// than per delivery keeps a busy session's outbox from falling behind.
const CHAIN: usize = 32;

/// How an attempt ended, for the rest of its chain.
enum Settled {
    /// Delivered and recorded: the next may go.
    Delivered,
    /// To be retried, failed for good, or not recorded: the rest wait.
    NotDelivered,
    /// Another claimant holds it now, and so the rest.
    ClaimLost,
}

/// `claimed` (sorted by id) as chains: each endpoint's and session's
/// deliveries, in order.
fn chains(claimed: Vec<WebhookDelivery>) -> Vec<Vec<WebhookDelivery>> {
    let mut chains: Vec<Vec<WebhookDelivery>> = Vec::new();
    let mut index: std::collections::HashMap<(String, String), usize> = std::collections::HashMap::new();
    for delivery in claimed {
        let key = (delivery.endpoint_id.clone(), delivery.session_id.clone());
        match index.get(&key) {
            Some(&at) => chains[at].push(delivery),
            None => {
                index.insert(key, chains.len());
                chains.push(vec![delivery]);
            }
        }
    }
    chains
}

/// How often delivered and failed deliveries past `keep_days` are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The body of a delivery, as the Standard Webhooks specification shapes
/// it: `type`, `timestamp` (the event's commit) and `data`.
#[derive(Debug, Serialize)]
pub(crate) struct Payload<'a> {
    /// The event's type (`approval_requested`, `turn_complete`, …).
    #[serde(rename = "type")]
    pub(crate) kind: &'a str,
    /// When the event was committed, RFC 3339.
    pub(crate) timestamp: String,
    /// The session and the event.
    pub(crate) data: PayloadData<'a>,
}

/// `data` of a [`Payload`].
#[derive(Debug, Serialize)]
pub(crate) struct PayloadData<'a> {
    /// The session whose event it is.
    pub(crate) session_id: &'a str,
    /// The event, as the log and the event streams carry it.
    pub(crate) event: &'a RecordedEvent,
}

/// The `webhook-id` of a delivery: the same at every attempt.
pub(crate) fn message_id(delivery: &WebhookDelivery) -> String {
    format!("msg_{}", delivery.id)
}

/// Posts the outbox's deliveries (see the module's text).
pub(crate) struct Deliverer {
    outbox: Arc<dyn WebhookStore>,
    store: Arc<dyn CheckpointStore>,
    settings: Arc<WebhooksConfig>,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    /// This node's name in claims.
    claimant: String,
    /// Woken when a live session here commits an event webhooks may want.
    wake: Arc<Notify>,
    in_flight: Arc<Semaphore>,
    /// The endpoints as last read, when, and at which count of this
    /// node's changes: read again after [`ENDPOINTS_FRESH`], after a change
    /// made here, or when a delivery names one not among them.
    endpoints: std::sync::Mutex<(Option<tokio::time::Instant>, u64, Arc<Vec<WebhookEndpoint>>)>,
    /// Counts the endpoint changes made through this node's API.
    changes: Arc<std::sync::atomic::AtomicU64>,
}

/// How long the endpoints read are used before they are read again (a
/// rotated secret or a moved URL takes effect within it).
const ENDPOINTS_FRESH: Duration = Duration::from_secs(1);

impl Deliverer {
    /// A deliverer for this node (`claimant`), woken by `wake`.
    pub(crate) fn new(
        outbox: Arc<dyn WebhookStore>,
        store: Arc<dyn CheckpointStore>,
        settings: Arc<WebhooksConfig>,
        metrics: Arc<Metrics>,
        claimant: String,
        wake: Arc<Notify>,
        changes: Arc<std::sync::atomic::AtomicU64>,
    ) -> Self {
        Self {
            client: target::client(&settings),
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight.max(1))),
            endpoints: std::sync::Mutex::new((None, 0, Arc::new(Vec::new()))),
            changes,
            outbox,
            store,
            settings,
            metrics,
            claimant,
            wake,
        }
    }

    /// How long a claim holds: longer than an attempt can take.
    fn claim_for(&self) -> u64 {
        self.settings.timeout_ms.saturating_add(5_000)
    }

    /// Delivers until `closing` turns true.
    pub(crate) async fn run(self: Arc<Self>, mut closing: watch::Receiver<bool>) {
        let mut last_prune: Option<tokio::time::Instant> = None;
        loop {
            if *closing.borrow() {
                return;
            }
            if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(tokio::time::Instant::now());
                self.prune().await;
            }
            self.claim_and_send().await;
            tokio::select! {
                () = self.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                _ = closing.changed() => {}
            }
        }
    }

    /// Claims what is due while there is room in flight, and sends it: a
    /// chain of each endpoint's and session's deliveries per task.
    async fn claim_and_send(self: &Arc<Self>) {
        // Without an endpoint nothing is queued: no claim is tried (on
        // SQLite a claim takes the write lock from the turns).
        match self.endpoints(false).await {
            Ok(endpoints) if endpoints.is_empty() => return,
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot read the webhook endpoints");
                return;
            }
        }
        loop {
            let room = self.in_flight.available_permits();
            if room == 0 {
                return;
            }
            let now = now_ms();
            let claimed = match self
                .outbox
                .claim_webhook_deliveries(&self.claimant, now, now + self.claim_for(), room, CHAIN)
                .await
            {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::warn!(%error, "cannot claim webhook deliveries");
                    return;
                }
            };
            let chains = chains(claimed);
            let count = chains.len();
            for chain in chains {
                let Ok(permit) = Arc::clone(&self.in_flight).acquire_owned().await else {
                    return;
                };
                let this = Arc::clone(self);
                tokio::spawn(async move {
                    this.send_chain(chain, now).await;
                    drop(permit);
                    // The session's next deliveries may be due now.
                    this.wake.notify_one();
                });
            }
            if count < room {
                return;
            }
        }
    }

    /// Sends a chain in order, each after the one before was delivered;
    /// lets go of the rest when one is not, or when the claim (made at
    /// `claimed_at`) would run out during the next attempt.
    async fn send_chain(&self, chain: Vec<WebhookDelivery>, claimed_at: u64) {
        let held_until = claimed_at.saturating_add(self.claim_for());
        let mut chain = chain.into_iter();
        while let Some(delivery) = chain.next() {
            if now_ms().saturating_add(self.settings.timeout_ms) >= held_until {
                self.release(std::iter::once(delivery).chain(chain)).await;
                return;
            }
            match self.attempt(delivery).await {
                Settled::Delivered => {}
                Settled::NotDelivered => {
                    self.release(chain).await;
                    return;
                }
                // Another node holds the rest now.
                Settled::ClaimLost => return,
            }
        }
    }

    /// Lets go of `deliveries`, unattempted.
    async fn release(&self, deliveries: impl Iterator<Item = WebhookDelivery>) {
        let ids: Vec<u64> = deliveries.map(|delivery| delivery.id).collect();
        if ids.is_empty() {
            return;
        }
        if let Err(error) = self.outbox.release_webhook_deliveries(&ids, &self.claimant).await {
            // Their claim runs out on its own.
            tracing::warn!(%error, "cannot let go of webhook deliveries");
        }
    }

    /// One attempt at `delivery`, settled.
    async fn attempt(&self, delivery: WebhookDelivery) -> Settled {
        let result = self.send(&delivery).await;
        let now = now_ms();
        let outcome = match result {
            Ok(status) => DeliveryOutcome::Delivered { status },
            Err(failure) => self.after_failure(&delivery, failure, now),
        };
        let label = match outcome {
            DeliveryOutcome::Delivered { .. } => {
                let latency = now.saturating_sub(delivery.created_at_ms);
                self.metrics.webhook_latency.observe(latency as f64 / 1000.0);
                "delivered"
            }
            DeliveryOutcome::Retry { .. } => "retry",
            DeliveryOutcome::Failed { .. } => "failed",
        };
        self.metrics
            .webhook_attempts
            .get_or_create(&WebhookOutcome { outcome: label })
            .inc();
        let settled = match self
            .outbox
            .settle_webhook_delivery(delivery.id, &self.claimant, now, &outcome)
            .await
        {
            Ok(true) if matches!(outcome, DeliveryOutcome::Delivered { .. }) => Settled::Delivered,
            Ok(true) => Settled::NotDelivered,
            Ok(false) => {
                tracing::debug!(
                    delivery = delivery.id,
                    "a webhook delivery's claim was lost before it was settled"
                );
                Settled::ClaimLost
            }
            Err(error) => {
                tracing::warn!(delivery = delivery.id, %error, "cannot record a webhook delivery's attempt");
                Settled::NotDelivered
            }
        };
        if let DeliveryOutcome::Failed { error, .. } = &outcome {
            tracing::warn!(
                delivery = delivery.id,
                endpoint = %delivery.endpoint_id,
                session_id = %delivery.session_id,
                %error,
                "a webhook delivery failed for good"
            );
        }
        settled
    }

    /// The next attempt's time, or failure once retrying would go past
    /// `retry_for_s` after the event.
    fn after_failure(&self, delivery: &WebhookDelivery, failure: Failure, now: u64) -> DeliveryOutcome {
        let attempts = delivery.attempts.saturating_add(1);
        let backoff = backoff_ms(
            attempts,
            self.settings.first_backoff_ms,
            self.settings.max_backoff_ms,
            rand::random::<f64>(),
        );
        let give_up_at = delivery
            .created_at_ms
            .saturating_add(self.settings.retry_for_s.saturating_mul(1000));
        let next = now.saturating_add(backoff);
        if failure.permanent || next > give_up_at {
            DeliveryOutcome::Failed {
                status: failure.status,
                error: failure.error,
            }
        } else {
            DeliveryOutcome::Retry {
                status: failure.status,
                error: failure.error,
                next_attempt_at_ms: next,
            }
        }
    }

    /// Posts `delivery`; `Ok(status)` on `2xx`.
    async fn send(&self, delivery: &WebhookDelivery) -> Result<u16, Failure> {
        let endpoint = self.endpoint(&delivery.endpoint_id).await?;
        // Checked again: the settings may have changed since it was made.
        check_url(&endpoint.url, &self.settings).map_err(|error| Failure::permanent(error.to_string()))?;
        let event = self.event(delivery).await?;
        let payload = Payload {
            kind: &delivery.event_type,
            timestamp: humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(event.recorded_at_ms))
                .to_string(),
            data: PayloadData {
                session_id: &delivery.session_id,
                event: &event,
            },
        };
        let body = serde_json::to_vec(&payload).map_err(|error| Failure::permanent(error.to_string()))?;
        let now = now_ms();
        let keys: Vec<Vec<u8>> = endpoint
            .secrets
            .iter()
            .filter(|secret| secret.expires_at_ms.is_none_or(|expires| expires > now))
            .filter_map(|secret| key_of(&secret.secret).ok())
            .collect();
        if keys.is_empty() {
            return Err(Failure::retry(None, "the endpoint has no usable secret".to_owned()));
        }
        let id = message_id(delivery);
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        let signature = sign::signature(&keys, &id, timestamp, &body);
        let response = self
            .client
            .post(&endpoint.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            .map_err(|error| Failure::retry(None, describe(&error)))?;
        let status = response.status();
        if status.is_success() {
            Ok(status.as_u16())
        } else {
            Err(Failure::retry(
                Some(status.as_u16()),
                format!("the endpoint answered {status}"),
            ))
        }
    }

    async fn endpoint(&self, id: &str) -> Result<WebhookEndpoint, Failure> {
        let read = |error: StoreError| Failure::retry(None, format!("cannot read the endpoint: {error}"));
        let cached = self.endpoints(false).await.map_err(read)?;
        if let Some(endpoint) = cached.iter().find(|endpoint| endpoint.id == id) {
            return Ok(endpoint.clone());
        }
        // Perhaps made on another node since they were read.
        let endpoints = self.endpoints(true).await.map_err(read)?;
        endpoints
            .iter()
            .find(|endpoint| endpoint.id == id)
            .cloned()
            .ok_or_else(|| Failure::permanent("the endpoint was deleted".to_owned()))
    }

    /// The endpoints, as last read when that is fresh (see
    /// [`ENDPOINTS_FRESH`]) and `again` is false, else read now.
    async fn endpoints(&self, again: bool) -> Result<Arc<Vec<WebhookEndpoint>>, StoreError> {
        let changes = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        if !again {
            let cache = self.endpoints.lock().unwrap_or_else(|poison| poison.into_inner());
            if cache.0.is_some_and(|read| read.elapsed() < ENDPOINTS_FRESH) && cache.1 == changes {
                return Ok(Arc::clone(&cache.2));
            }
        }
        let endpoints = Arc::new(self.outbox.webhook_endpoints().await?);
        *self.endpoints.lock().unwrap_or_else(|poison| poison.into_inner()) =
            (Some(tokio::time::Instant::now()), changes, Arc::clone(&endpoints));
        Ok(endpoints)
    }

    async fn event(&self, delivery: &WebhookDelivery) -> Result<RecordedEvent, Failure> {
        let events = self
            .store
            .events_after(&delivery.session_id, delivery.sequence.saturating_sub(1), 1)
            .await
            .map_err(|error| Failure::retry(None, format!("cannot read the event: {error}")))?;
        events
            .into_iter()
            .find(|event| event.sequence == delivery.sequence)
            .ok_or_else(|| Failure::permanent("the event is no longer stored".to_owned()))
    }

    async fn prune(&self) {
        let keep_ms = self.settings.keep_days.saturating_mul(86_400_000);
        match self
            .outbox
            .prune_webhook_deliveries(now_ms().saturating_sub(keep_ms))
            .await
        {
            Ok(0) => {}
            Ok(pruned) => tracing::info!(pruned, "pruned old webhook deliveries"),
            Err(error) => tracing::warn!(%error, "cannot prune old webhook deliveries"),
        }
    }
}

/// Stores the operator's endpoints of `[webhooks.endpoints]` (replacing
/// those of the same ids), their secrets read from the environment; the
/// text says what is wrong with one that cannot be.
pub(crate) async fn store_configured_endpoints(
    outbox: &dyn WebhookStore,
    settings: &WebhooksConfig,
) -> Result<(), String> {
    if settings.endpoints.is_empty() {
        return Ok(());
    }
    let stored = outbox
        .webhook_endpoints()
        .await
        .map_err(|error| format!("cannot read the webhook endpoints: {error}"))?;
    for (id, configured) in &settings.endpoints {
        let context = |what: String| format!("[webhooks.endpoints.{id}]: {what}");
        check_url(&configured.url, settings).map_err(|error| context(error.to_string()))?;
        if configured.event_types.is_empty() {
            return Err(context("event_types names no event type".to_owned()));
        }
        if let Some(unknown) = configured
            .event_types
            .iter()
            .find(|kind| !keel_protocol::WEBHOOK_EVENT_TYPES.contains(&kind.as_str()))
        {
            return Err(context(format!(
                "'{unknown}' is not an event type webhooks receive (one of {})",
                keel_protocol::WEBHOOK_EVENT_TYPES.join(", ")
            )));
        }
        let mut secrets = Vec::new();
        for variable in std::iter::once(&configured.secret_env).chain(&configured.previous_secret_env) {
            let secret = std::env::var(variable).map_err(|_| context(format!("the variable {variable} is not set")))?;
            key_of(&secret).map_err(|error| context(format!("{variable}: {error}")))?;
            secrets.push(keel_store::WebhookSecret {
                secret,
                expires_at_ms: None,
            });
        }
        let created_at_ms = stored
            .iter()
            .find(|endpoint| &endpoint.id == id)
            .map_or_else(now_ms, |endpoint| endpoint.created_at_ms);
        let endpoint = WebhookEndpoint {
            id: id.clone(),
            url: configured.url.clone(),
            secrets,
            event_types: configured.event_types.clone(),
            bot_id: configured.bot.clone(),
            tenant: configured.tenant.clone(),
            description: Some("keel.toml".to_owned()),
            created_at_ms,
        };
        outbox
            .put_webhook_endpoint(&endpoint)
            .await
            .map_err(|error| context(format!("cannot store it: {error}")))?;
    }
    Ok(())
}

/// Why an attempt did not deliver.
struct Failure {
    status: Option<u16>,
    error: String,
    /// No later attempt can do better (the endpoint or event is gone).
    permanent: bool,
}

impl Failure {
    fn retry(status: Option<u16>, error: String) -> Self {
        Self {
            status,
            error,
            permanent: false,
        }
    }

    fn permanent(error: String) -> Self {
        Self {
            status: None,
            error,
            permanent: true,
        }
    }
}

/// A request's error with its causes (reqwest's own text is terse: "error
/// sending request").
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The delay before attempt `attempts + 1`: `first · 2^(attempts-1)`,
/// capped at `max`, then between half and all of that (`jitter` in
/// `[0, 1)`), so that deliveries failing together do not retry together.
fn backoff_ms(attempts: u32, first: u64, max: u64, jitter: f64) -> u64 {
    let exponent = attempts.saturating_sub(1).min(40);
    let full = first.saturating_mul(1u64 << exponent).min(max).max(1);
    let half = full / 2;
    half + ((full - half) as f64 * jitter.clamp(0.0, 1.0)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter_below_it() {
        assert_eq!(backoff_ms(1, 1_000, 600_000, 0.0), 500);
        assert_eq!(backoff_ms(1, 1_000, 600_000, 0.999_999), 999);
        assert_eq!(backoff_ms(2, 1_000, 600_000, 0.0), 1_000);
        assert_eq!(backoff_ms(4, 1_000, 600_000, 0.0), 4_000);
        assert_eq!(backoff_ms(30, 1_000, 600_000, 0.0), 300_000);
        assert_eq!(backoff_ms(u32::MAX, 1_000, 600_000, 0.5), 450_000);
        assert_eq!(backoff_ms(3, 0, 0, 0.5), 0);
    }
}
