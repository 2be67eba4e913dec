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

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use keel_model::{BoxFuture, Model, ModelEventSink, ModelOutput, ModelRequest};
use keel_protocol::{RecordedEvent, Result};
use keel_protocol::{TokenUsage, TranscriptItem};
use keel_store::{
    AppendReceipt, Checkpoint, CheckpointStore, EncodedEvent, EventPage, EventPageRequest, KeyedSubmission, OpenBatch,
    SessionEdit, SessionListPage, SessionState, SessionSummary, StoreError, TurnExecution,
};

/// Distinct bots that keep a label of their own in the model metrics.
pub(crate) const MAX_BOT_LABELS: usize = 32;

/// Distinct providers that keep a label of their own.
pub(crate) const MAX_PROVIDER_LABELS: usize = 16;

/// The label value standing for every value past a budget.
pub(crate) const OTHER_LABEL: &str = "other";

/// The values one label may take: the first `capacity` distinct values
/// asked for keep their own, every later one is [`OTHER_LABEL`], so the
/// label's series are bounded whatever clients send.
#[derive(Debug)]
pub(crate) struct LabelBudget {
    admitted: Mutex<HashSet<String>>,
    capacity: usize,
}

impl LabelBudget {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            admitted: Mutex::new(HashSet::new()),
            capacity,
        }
    }

    /// The label `value` is counted under.
    pub(crate) fn label(&self, value: &str) -> String {
        let mut admitted = self.admitted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if value != OTHER_LABEL && (admitted.contains(value) || admitted.len() < self.capacity) {
            admitted.insert(value.to_owned());
            return value.to_owned();
        }
        OTHER_LABEL.to_owned()
    }
}

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
    pub(crate) relayed_refused: Counter,
    pub(crate) sessions_taken_over: Counter,
    pub(crate) leases_lost: Counter,
    pub(crate) alive_tasks: Gauge,
    /// The bots with a label of their own.
    bots: LabelBudget,
    /// The providers with a label of their own.
    providers: LabelBudget,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::default();
        let live_sessions = Gauge::default();
        registry.register(
            "keel_live_sessions",
            "Sessions loaded in this server",
            live_sessions.clone(),
        );
        let queued_submissions = Gauge::default();
        registry.register(
            "keel_queued_submissions",
            "Submissions waiting in the queues of the live sessions",
            queued_submissions.clone(),
        );
        let events_recorded = Counter::default();
        registry.register(
            "keel_events_recorded",
            "Events recorded by the live sessions",
            events_recorded.clone(),
        );
        // 100 µs to about 3 s.
        let store_commit = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        registry.register(
            "keel_store_commit_seconds",
            "Time from handing a batch to the store to its durable commit",
            store_commit.clone(),
        );
        let model_request = Family::new_with_constructor(ModelBuckets);
        registry.register(
            "keel_model_request_seconds",
            "Duration of model requests, by provider",
            model_request.clone(),
        );
        let model_errors = Family::default();
        registry.register(
            "keel_model_errors",
            "Model requests that failed, by provider",
            model_errors.clone(),
        );
        let model_tokens = Family::default();
        registry.register(
            "keel_model_tokens",
            "Tokens the providers reported, by provider, bot and kind (input, cached_input, output, reasoning)",
            model_tokens.clone(),
        );
        let http_requests = Family::default();
        registry.register(
            "keel_http_requests",
            "HTTP requests answered, by route and status",
            http_requests.clone(),
        );
        let sse_subscribers = Gauge::default();
        registry.register(
            "keel_sse_subscribers",
            "Open server-sent event streams",
            sse_subscribers.clone(),
        );
        let catch_ups = Counter::default();
        registry.register(
            "keel_subscriber_catch_ups",
            "Times a stream or WebSocket subscriber read missed events from the store",
            catch_ups.clone(),
        );
        let relayed_submissions = Counter::default();
        registry.register(
            "keel_relayed_submissions",
            "Submissions this node stored for a session another node runs",
            relayed_submissions.clone(),
        );
        let relayed_refused = Counter::default();
        registry.register(
            "keel_relayed_refused",
            "Relayed submissions this node refused to queue because their seal did not verify",
            relayed_refused.clone(),
        );
        let sessions_taken_over = Counter::default();
        registry.register(
            "keel_sessions_taken_over",
            "Sessions with work this node claimed because no live node held them",
            sessions_taken_over.clone(),
        );
        let leases_lost = Counter::default();
        registry.register(
            "keel_leases_lost",
            "Sessions this node stopped because another node took their lease",
            leases_lost.clone(),
        );
        let alive_tasks = Gauge::default();
        registry.register(
            "keel_runtime_alive_tasks",
            "Tasks alive in the server's async runtime (a leak shows as growth)",
            alive_tasks.clone(),
        );
        Self {
            registry,
            live_sessions,
            queued_submissions,
            events_recorded,
            store_commit,
            model_request,
            model_errors,
            model_tokens,
            http_requests,
            sse_subscribers,
            catch_ups,
            relayed_submissions,
            relayed_refused,
            sessions_taken_over,
            leases_lost,
            alive_tasks,
            bots: LabelBudget::new(MAX_BOT_LABELS),
            providers: LabelBudget::new(MAX_PROVIDER_LABELS),
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

/// A store that times its commits into `keel_store_commit_seconds`.
///
/// It cannot miss a method: [`CheckpointStore`] has no default methods, so
/// every one is written out here or this does not compile. What several
/// nodes need ([`keel_store::ClusterStore`]) is not a store's optional part
/// but a trait of its own, which the host holds beside this wrapper.
pub(crate) struct MeteredStore {
    inner: Arc<dyn CheckpointStore>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub(crate) fn new(inner: Arc<dyn CheckpointStore>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    async fn timed<T>(&self, work: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = work.await;
        if result.is_ok() {
            self.metrics.store_commit.observe(start.elapsed().as_secs_f64());
        }
        result
    }
}

impl CheckpointStore for MeteredStore {
    fn low_on_space(&self) -> Option<String> {
        self.inner.low_on_space()
    }

    fn save<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        transcript_delta: &'a [TranscriptItem],
        execution: Option<&'a TurnExecution>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.save(checkpoint, transcript_delta, execution)
    }

    fn create<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        history: &'a [TranscriptItem],
        events: Vec<EncodedEvent>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(self.timed(self.inner.create(checkpoint, history, events)))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }

    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>> {
        self.inner.load(session_id)
    }

    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: Arc<OpenBatch>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(self.timed(self.inner.append_open(session_id, batch)))
    }

    fn acquire<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.acquire(session_id)
    }

    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>> {
        self.inner.event_page(session_id, request)
    }

    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>> {
        self.inner.events_after(session_id, after_sequence, limit)
    }

    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        bot_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        self.inner.list_sessions_page(cursor, limit, bot_id)
    }

    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>> {
        self.inner.session_summary(session_id)
    }

    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>> {
        self.inner.keyed_submission(session_id, idempotency_key)
    }

    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.sessions_with_work(after, limit)
    }

    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<TranscriptItem>>, StoreError>> {
        self.inner.history_until(session_id, at_sequence)
    }

    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: SessionEdit<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.edit_session(session_id, edit)
    }
}

/// A model that times its requests into `keel_model_request_seconds`,
/// counts failures into `keel_model_errors_total`, labelled by provider,
/// and adds the tokens each answer reports to `keel_model_tokens_total`
/// (also labelled by the session's bot). A request cancelled (an
/// interrupted turn) counts as none of them. The labels are bounded (see
/// [`LabelBudget`]); a bot takes one of the bots' labels when it first
/// uses tokens, not when its session is loaded.
pub(crate) struct MeteredModel {
    inner: Arc<dyn Model>,
    label: ProviderLabel,
    bot: String,
    metrics: Arc<Metrics>,
}

impl MeteredModel {
    pub(crate) fn new(inner: Arc<dyn Model>, provider: String, bot: String, metrics: Arc<Metrics>) -> Self {
        let provider = metrics.providers.label(&provider);
        Self {
            inner,
            label: ProviderLabel { provider },
            bot,
            metrics,
        }
    }

    fn count_tokens(&self, usage: &TokenUsage) {
        let bot = self.metrics.bots.label(&self.bot);
        for (kind, tokens) in [
            ("input", usage.input_tokens),
            ("cached_input", usage.cached_input_tokens),
            ("output", usage.output_tokens),
            ("reasoning", usage.reasoning_tokens),
        ] {
            let labels = TokenLabels {
                provider: self.label.provider.clone(),
                bot: bot.clone(),
                kind,
            };
            self.metrics.model_tokens.get_or_create(&labels).inc_by(tokens);
        }
    }
}

impl Model for MeteredModel {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            let start = Instant::now();
            let result = self.inner.respond(request, events).await;
            self.metrics
                .model_request
                .get_or_create(&self.label)
                .observe(start.elapsed().as_secs_f64());
            match &result {
                Ok(output) => {
                    if let Some(usage) = &output.usage {
                        self.count_tokens(usage);
                    }
                }
                Err(_) => {
                    self.metrics.model_errors.get_or_create(&self.label).inc();
                }
            }
            result
        })
    }

    fn name(&self) -> String {
        self.inner.name()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use keel_protocol::{BusyPolicy, Op};
    use keel_store::postgres::local::TestPostgres;
    use keel_store::{
        CheckpointStoreExt, ClusterStore, PostgresCheckpoint, PostgresOptions, Relayed, RelayedSubmission,
        SessionContext,
    };

    /// The first values of a budget keep their label, later ones are
    /// `other`, and a value admitted stays admitted.
    #[test]
    fn a_label_budget_keeps_its_first_values_and_counts_the_rest_as_other() {
        let budget = LabelBudget::new(2);
        assert_eq!(budget.label("a"), "a");
        assert_eq!(budget.label("b"), "b");
        assert_eq!(budget.label("c"), OTHER_LABEL);
        assert_eq!(budget.label("a"), "a");
        assert_eq!(budget.label(OTHER_LABEL), OTHER_LABEL);
    }

    /// Every method of the store reaches the store it decorates, and the
    /// several-node part (leases, relaying), held beside the wrapper, works
    /// on the same database: it once silently did not, for relaying, when
    /// that part was a set of refusing defaults the wrapper had to forward.
    #[tokio::test]
    async fn the_metered_store_forwards_every_optional_method() {
        let Some(postgres) = TestPostgres::shared() else { return };
        let url = postgres.fresh_database();
        let inner = PostgresCheckpoint::connect(&url, PostgresOptions::default())
            .await
            .expect("connect");
        let inner = Arc::new(inner);
        let cluster: Arc<dyn ClusterStore> = inner.clone();
        let store = MeteredStore::new(inner, Arc::new(Metrics::new()));
        let checkpoint = Checkpoint {
            session_context: SessionContext::default(),
            ..Checkpoint::empty("s")
        };
        store.create(&checkpoint, &[], Vec::new()).await.expect("create");
        let ttl = Duration::from_secs(60);
        let epoch = cluster.claim("s", "node-a", ttl).await.expect("claim");
        assert!(
            cluster
                .renew("node-a", ttl, &[("s".to_owned(), epoch)])
                .await
                .expect("renew")
                .is_empty()
        );
        let submission = RelayedSubmission {
            relay_id: 0,
            submission_id: "r".to_owned(),
            op: Op::Interrupt { turn_id: None },
            on_busy: Some(BusyPolicy::Queue),
            idempotency_key: None,
            seal: None,
        };
        assert!(matches!(
            cluster.relay("s", &submission, 8).await.expect("relay"),
            Relayed::New { .. }
        ));
        assert_eq!(cluster.sessions_with_relayed("node-a").await.expect("relayed"), ["s"]);
        let waiting = cluster.relayed("s", 8).await.expect("relayed");
        assert_eq!(waiting.len(), 1);
        cluster.relay_done("s", &[waiting[0].relay_id]).await.expect("done");
        assert!(cluster.relayed("s", 8).await.expect("relayed").is_empty());
        cluster.release("s", "node-a", epoch).await.expect("release");
        assert!(
            cluster
                .sessions_to_take_over(None, 8)
                .await
                .expect("take over")
                .is_empty()
        );
        assert!(store.sessions_with_work(None, 8).await.expect("work").is_empty());
        assert_eq!(store.history_until("s", 0).await.expect("history"), Some(Vec::new()));
        assert!(store.rename_session("s", "renamed").await.expect("rename"));
        assert!(store.delete_session("s").await.expect("delete"));
        store.close().await;
        assert!(matches!(store.load("s").await, Err(StoreError::Closed)));
    }
}
