//! Exporting the sessions' spans over OTLP/HTTP (protobuf).
//!
//! Sessions hand finished spans to [`OtlpSpans`], which queues them in a
//! bounded channel and never waits: when the queue is full the span is
//! dropped and counted. One OS thread of its own drains the queue in
//! batches and posts them with the exporter's blocking HTTP client, so an
//! export never runs on (or stalls) the async runtime, and a back end that
//! is down costs the turns nothing.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use keel_agent::telemetry::{FinishedSpan, SpanKind, SpanSink, Value};
use keel_config::TelemetryConfig;
use opentelemetry::trace::{SpanContext, SpanId, Status, TraceFlags, TraceId, TraceState};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};

use crate::metrics::Metrics;

/// Spans posted per request at most.
const BATCH: usize = 512;

/// How often the exporter thread looks at the queue when nothing wakes it:
/// a span waits at most this long (and an export's time) to leave.
const TICK: Duration = Duration::from_millis(250);

/// What the exporter thread receives.
enum Message {
    Span(Box<FinishedSpan>),
    /// Export everything queued before this, then answer.
    Flush(SyncSender<()>),
}

/// The span sink of a server that exports (see the module's text).
pub(crate) struct OtlpSpans {
    queue: SyncSender<Message>,
    /// The exporter thread, woken when a batch is full or a flush is asked
    /// for; otherwise it wakes on its own every [`TICK`], so that recording
    /// a span costs no wake-up of another thread.
    exporter: std::thread::Thread,
    /// Spans queued since the exporter last drained the queue.
    queued: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

/// Whether traces are to be exported: an endpoint configured, or one of
/// the standard variables set, and the SDK not disabled.
pub(crate) fn wanted(config: &TelemetryConfig) -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
    !disabled
        && (config.endpoint.is_some()
            || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            || set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

impl OtlpSpans {
    /// Starts the exporter thread; the text says what is wrong with the
    /// configuration when it cannot.
    pub(crate) fn start(config: &TelemetryConfig, metrics: Arc<Metrics>) -> Result<Arc<Self>, String> {
        let mut builder = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(Duration::from_millis(config.timeout_ms.max(1)));
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        let mut exporter = builder
            .build()
            .map_err(|error| format!("cannot make the OTLP exporter: {error}"))?;
        exporter.set_resource(
            &Resource::builder_empty()
                .with_service_name(config.service_name.clone())
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        let (queue, received) = std::sync::mpsc::sync_channel(config.queue.max(1));
        let thread_metrics = Arc::clone(&metrics);
        let queued = Arc::new(AtomicUsize::new(0));
        let drained = Arc::clone(&queued);
        let thread = std::thread::Builder::new()
            .name("keel-otlp".to_owned())
            .spawn(move || export_until_closed(&exporter, &received, &drained, &thread_metrics))
            .map_err(|error| format!("cannot start the OTLP exporter's thread: {error}"))?;
        Ok(Arc::new(Self {
            queue,
            exporter: thread.thread().clone(),
            queued,
            metrics,
        }))
    }

    /// Exports everything queued so far, waiting at most `timeout` (at
    /// shutdown, so that the last turns' spans leave).
    pub(crate) fn flush(&self, timeout: Duration) {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        if self.queue.send(Message::Flush(done)).is_ok() {
            self.exporter.unpark();
            let _ = wait.recv_timeout(timeout);
        }
    }
}

impl SpanSink for OtlpSpans {
    fn record(&self, span: FinishedSpan) {
        match self.queue.try_send(Message::Span(Box::new(span))) {
            Ok(()) => {
                // A full batch is worth waking the exporter for; anything
                // less waits for its tick.
                if self.queued.fetch_add(1, Ordering::Relaxed) + 1 == BATCH {
                    self.exporter.unpark();
                }
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.spans_dropped.inc();
            }
        }
    }
}

/// The exporter thread: wakes every [`TICK`] (or when woken), takes what
/// is queued, and posts it in batches of at most [`BATCH`].
fn export_until_closed(
    exporter: &opentelemetry_otlp::SpanExporter,
    received: &Receiver<Message>,
    queued: &AtomicUsize,
    metrics: &Metrics,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    let mut waiting: Vec<SyncSender<()>> = Vec::new();
    loop {
        std::thread::park_timeout(TICK);
        let mut closed = false;
        loop {
            match received.try_recv() {
                Ok(Message::Span(span)) => {
                    queued.fetch_sub(1, Ordering::Relaxed);
                    batch.push(span_data(*span));
                    if batch.len() >= BATCH {
                        export(exporter, &mut batch, metrics);
                    }
                }
                Ok(Message::Flush(done)) => waiting.push(done),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        export(exporter, &mut batch, metrics);
        for done in waiting.drain(..) {
            let _ = done.send(());
        }
        if closed {
            return;
        }
    }
}

/// Posts `batch` (emptying it), counting what left and what failed.
fn export(exporter: &opentelemetry_otlp::SpanExporter, batch: &mut Vec<SpanData>, metrics: &Metrics) {
    if batch.is_empty() {
        return;
    }
    let spans = batch.len() as u64;
    match futures::executor::block_on(exporter.export(std::mem::take(batch))) {
        Ok(()) => {
            metrics.spans_exported.inc_by(spans);
        }
        Err(error) => {
            metrics.span_export_failures.inc();
            tracing::warn!(%error, spans, "could not export spans");
        }
    }
}

/// A finished span as the SDK's exporters take it.
fn span_data(span: FinishedSpan) -> SpanData {
    let trace_id = TraceId::from_bytes(span.trace_id);
    let context = SpanContext::new(
        trace_id,
        SpanId::from_bytes(span.span_id),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    );
    let status = match &span.error {
        Some(error) => Status::error(error.clone()),
        None => Status::Unset,
    };
    let mut attributes: Vec<KeyValue> = span.attributes.into_iter().map(key_value).collect();
    if let Some(error) = span.error {
        attributes.push(KeyValue::new("error.type", error));
    }
    let mut span_events = SpanEvents::default();
    span_events.events = span
        .events
        .into_iter()
        .map(|event| {
            opentelemetry::trace::Event::new(
                event.name,
                at(event.at_ms),
                event.attributes.into_iter().map(key_value).collect(),
                0,
            )
        })
        .collect();
    SpanData {
        span_context: context,
        parent_span_id: span.parent_span_id.map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: span.parent_is_remote,
        span_kind: match span.kind {
            SpanKind::Internal => opentelemetry::trace::SpanKind::Internal,
            SpanKind::Client => opentelemetry::trace::SpanKind::Client,
        },
        name: Cow::Owned(span.name),
        start_time: at(span.start_ms),
        end_time: at(span.end_ms),
        attributes,
        dropped_attributes_count: 0,
        events: span_events,
        links: SpanLinks::default(),
        status,
        instrumentation_scope: InstrumentationScope::builder("keel")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

fn key_value((key, value): (&'static str, Value)) -> KeyValue {
    match value {
        Value::Str(text) => KeyValue::new(key, text),
        Value::Int(number) => KeyValue::new(key, number),
        Value::F64(number) => KeyValue::new(key, number),
        Value::Strs(list) => KeyValue::new(
            key,
            opentelemetry::Value::Array(Array::String(list.into_iter().map(StringValue::from).collect())),
        ),
    }
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}
