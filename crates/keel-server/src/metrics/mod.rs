//! Prometheus metrics, and the decorators that feed them: [`MeteredStore`]
//! times the store's commits, [`MeteredModel`] the provider's requests.
//!
//! Every label set is bounded, since each distinct value is a series kept
//! for the life of the process and rendered by every scrape: routes are the
//! router's patterns, statuses HTTP's, and the values a client chooses (a
//! session's bot, the provider its model spec names) go through a
//! [`LabelBudget`]: the first [`MAX_BOT_LABELS`] bots (and
//! [`MAX_PROVIDER_LABELS`] providers) to use tokens keep their own label,
//! later ones are counted under `other`.

mod labels;
mod model;
mod store;

pub(crate) use self::labels::{LabelBudget, MAX_BOT_LABELS, MAX_PROVIDER_LABELS, MAX_TENANT_LABELS};
pub(crate) use self::model::MeteredModel;
pub(crate) use self::store::MeteredStore;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// Labels of the per-provider model metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ProviderLabel {
    provider: String,
}

/// Labels of `keel_model_tokens_total`: who used the tokens, and which
/// count of the provider's report (`input` includes `cached_input`,
/// `output` includes `reasoning`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TokenLabels {
    provider: String,
    bot: String,
    kind: &'static str,
}

/// Labels of `keel_budget_exhausted_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TenantLabel {
    tenant: String,
}

/// Labels of `keel_webhook_attempts_total`: how an attempt ended
/// (`delivered`, `retry` or `failed`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct WebhookOutcome {
    pub(crate) outcome: &'static str,
}

/// Labels of `keel_http_requests_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct HttpLabels {
    route: String,
    status: u16,
}

/// Builds the model-latency histograms: 10 ms to about 5 min.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModelBuckets;

impl MetricConstructor<Histogram> for ModelBuckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(exponential_buckets(0.01, 2.0, 15))
    }
}

/// The server's metrics.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub(crate) live_sessions: Gauge,
    pub(crate) queued_submissions: Gauge,
    pub(crate) events_recorded: Counter,
    pub(crate) store_commit: Histogram,
    pub(crate) model_request: Family<ProviderLabel, Histogram, ModelBuckets>,
    pub(crate) model_errors: Family<ProviderLabel, Counter>,
    pub(crate) model_tokens: Family<TokenLabels, Counter>,
    pub(crate) http_requests: Family<HttpLabels, Counter>,
    pub(crate) sse_subscribers: Gauge,
    pub(crate) catch_ups: Counter,
    pub(crate) relayed_submissions: Counter,
    pub(crate) forwarded_submissions: Counter,
    pub(crate) webhook_attempts: Family<WebhookOutcome, Counter>,
    pub(crate) webhook_latency: Histogram,
    pub(crate) spans_exported: Counter,
    pub(crate) spans_dropped: Counter,
    pub(crate) span_export_failures: Counter,
    pub(crate) forwards_not_taken: Counter,
    pub(crate) relayed_refused: Counter,
    pub(crate) relay_answers_missed: Counter,
    pub(crate) sessions_taken_over: Counter,
    pub(crate) leases_lost: Counter,
    pub(crate) alive_tasks: Gauge,
    pub(crate) budget_exhausted: Family<TenantLabel, Counter>,
    /// The tenants with a label of their own.
    tenants: LabelBudget,
    /// The bots with a label of their own.
    bots: LabelBudget,
    /// The providers with a label of their own.
    providers: LabelBudget,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        Self {
            live_sessions: registered(
                &mut registry,
                "keel_live_sessions",
                "Sessions loaded in this server",
                Gauge::default(),
            ),
            queued_submissions: registered(
                &mut registry,
                "keel_queued_submissions",
                "Submissions waiting in the queues of the live sessions",
                Gauge::default(),
            ),
            events_recorded: registered(
                &mut registry,
                "keel_events_recorded",
                "Events recorded by the live sessions",
                Counter::default(),
            ),
            // 100 µs to about 3 s.
            store_commit: registered(
                &mut registry,
                "keel_store_commit_seconds",
                "Time from handing a batch to the store to its durable commit",
                Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            ),
            model_request: registered(
                &mut registry,
                "keel_model_request_seconds",
                "Duration of model requests, by provider",
                Family::new_with_constructor(ModelBuckets),
            ),
            model_errors: registered(
                &mut registry,
                "keel_model_errors",
                "Model requests that failed, by provider",
                Family::default(),
            ),
            model_tokens: registered(
                &mut registry,
                "keel_model_tokens",
                "Tokens the providers reported, by provider, bot and kind (input, cached_input, output, reasoning)",
                Family::default(),
            ),
            http_requests: registered(
                &mut registry,
                "keel_http_requests",
                "HTTP requests answered, by route and status",
                Family::default(),
            ),
            sse_subscribers: registered(
                &mut registry,
                "keel_sse_subscribers",
                "Open server-sent event streams",
                Gauge::default(),
            ),
            catch_ups: registered(
                &mut registry,
                "keel_subscriber_catch_ups",
                "Times a stream or WebSocket subscriber read missed events from the store",
                Counter::default(),
            ),
            relayed_submissions: registered(
                &mut registry,
                "keel_relayed_submissions",
                "Submissions this node relayed to the node running their session, directly or through the store",
                Counter::default(),
            ),
            forwarded_submissions: registered(
                &mut registry,
                "keel_forwarded_submissions",
                "Relayed submissions this node handed to the node running their session directly, over HTTP",
                Counter::default(),
            ),
            webhook_attempts: registered(
                &mut registry,
                "keel_webhook_attempts",
                "Webhook delivery attempts this node made, by outcome: delivered, retry (to be tried again) or failed (given up on)",
                Family::default(),
            ),
            // 1 ms to about 9 h.
            webhook_latency: registered(
                &mut registry,
                "keel_webhook_delivery_seconds",
                "Time from an event's commit to its delivery's 2xx answer, retries included",
                Histogram::new(exponential_buckets(0.001, 2.0, 25)),
            ),
            spans_exported: registered(
                &mut registry,
                "keel_spans_exported",
                "Spans (turns, model steps, tool calls) this node exported over OTLP",
                Counter::default(),
            ),
            spans_dropped: registered(
                &mut registry,
                "keel_spans_dropped",
                "Spans dropped because the export queue was full (the back end slower than the turns)",
                Counter::default(),
            ),
            span_export_failures: registered(
                &mut registry,
                "keel_span_export_failures",
                "OTLP exports that failed (the back end unreachable or refusing); their spans are lost",
                Counter::default(),
            ),
            forwards_not_taken: registered(
                &mut registry,
                "keel_forwards_not_taken",
                "Relayed submissions the owner could not be handed directly (unreachable, not running the session), relayed through the store instead",
                Counter::default(),
            ),
            relayed_refused: registered(
                &mut registry,
                "keel_relayed_refused",
                "Relayed submissions this node refused to queue because their seal did not verify",
                Counter::default(),
            ),
            relay_answers_missed: registered(
                &mut registry,
                "keel_relay_answers_missed",
                "Relayed submissions answered owner_unavailable: the owner gave no answer in time",
                Counter::default(),
            ),
            sessions_taken_over: registered(
                &mut registry,
                "keel_sessions_taken_over",
                "Sessions with work this node claimed because no live node held them",
                Counter::default(),
            ),
            leases_lost: registered(
                &mut registry,
                "keel_leases_lost",
                "Sessions this node stopped because another node took their lease",
                Counter::default(),
            ),
            alive_tasks: registered(
                &mut registry,
                "keel_runtime_alive_tasks",
                "Tasks alive in the server's async runtime (a leak shows as growth)",
                Gauge::default(),
            ),
            budget_exhausted: registered(
                &mut registry,
                "keel_budget_exhausted",
                "Submissions refused and turns stopped because a budget of the tenant or its session was spent",
                Family::default(),
            ),
            tenants: LabelBudget::new(MAX_TENANT_LABELS),
            bots: LabelBudget::new(MAX_BOT_LABELS),
            providers: LabelBudget::new(MAX_PROVIDER_LABELS),
            registry,
        }
    }

    /// The metrics in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(%error, "cannot encode the metrics");
        }
        text
    }

    /// Counts a submission refused, or a turn stopped, by a spent budget of
    /// `tenant` or of one of its sessions.
    pub(crate) fn budget_exhausted(&self, tenant: &str) {
        let tenant = self.tenants.label(tenant);
        self.budget_exhausted.get_or_create(&TenantLabel { tenant }).inc();
    }

    /// Counts an answered HTTP request.
    pub(crate) fn http_request(&self, route: &str, status: u16) {
        self.http_requests
            .get_or_create(&HttpLabels {
                route: route.to_owned(),
                status,
            })
            .inc();
    }
}

/// Registers `metric` as `name` with its `help` text and hands it back:
/// the registry and the server share it.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}
