//! The spans a session reports, in the OpenTelemetry GenAI vocabulary,
//! without naming an OpenTelemetry crate: the runtime hands finished
//! [`FinishedSpan`]s to a [`SpanSink`] (the server's exports them over
//! OTLP).
//!
//! A turn may outlive the process that started it (it waits durably for
//! an approval, or a crash cuts it), so its span is not an in-memory
//! object: its ids are kept with the turn in flight (`TurnTrace`), each
//! model step's and tool call's span is reported when it ends under the
//! turn's id, and the turn's own span is reported by whichever runtime
//! ends the turn, from its stored start.

use std::sync::Arc;

use keel_protocol::TokenUsage;
use keel_store::TurnTrace;

/// Where finished spans go. `record` must not block: an exporter queues
/// and drops (counting) when it cannot keep up.
pub trait SpanSink: Send + Sync {
    /// Takes a finished span.
    fn record(&self, span: FinishedSpan);
}

/// The spans of a session, or nothing when no sink is configured.
#[derive(Clone, Default)]
pub struct Spans {
    sink: Option<Arc<dyn SpanSink>>,
    /// Whether spans carry what was said: the model's output, tool
    /// arguments and results (redacted as stored text is). Off unless the
    /// operator turns it on: they hold personal data and secrets.
    content: bool,
}

impl Spans {
    /// Spans that go to `sink`, without message contents.
    pub fn to(sink: Arc<dyn SpanSink>) -> Self {
        Self {
            sink: Some(sink),
            content: false,
        }
    }

    /// These spans, carrying message contents when `content` is true.
    pub fn with_content(self, content: bool) -> Self {
        Self { content, ..self }
    }

    /// Whether spans are recorded at all.
    pub fn enabled(&self) -> bool {
        self.sink.is_some()
    }

    /// Whether spans carry message contents (see [`Self::with_content`]).
    pub fn content(&self) -> bool {
        self.content
    }

    /// Hands `span` to the sink, if any.
    pub fn record(&self, span: FinishedSpan) {
        if let Some(sink) = &self.sink {
            sink.record(span);
        }
    }
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spans")
            .field("enabled", &self.enabled())
            .field("content", &self.content)
            .finish()
    }
}

/// OpenTelemetry's span kinds that the runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the runtime (a turn, a tool call).
    Internal,
    /// A request to another service (a model step).
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A string.
    Str(String),
    /// An integer.
    Int(i64),
    /// A floating-point number (a sampling temperature).
    F64(f64),
    /// A list of strings.
    Strs(Vec<String>),
}

impl From<&str> for Value {
    fn from(value: &str) -> Self {
        Self::Str(value.to_owned())
    }
}

impl From<String> for Value {
    fn from(value: String) -> Self {
        Self::Str(value)
    }
}

impl From<u64> for Value {
    fn from(value: u64) -> Self {
        Self::Int(i64::try_from(value).unwrap_or(i64::MAX))
    }
}

/// An event on a span (a retry, the start of an approval wait).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    /// Its name.
    pub name: &'static str,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// What it says.
    pub attributes: Vec<(&'static str, Value)>,
}

/// A span that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSpan {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The span.
    pub span_id: [u8; 8],
    /// Its parent, when it has one.
    pub parent_span_id: Option<[u8; 8]>,
    /// Whether the parent is another process's (a caller's `traceparent`).
    pub parent_is_remote: bool,
    /// Its name (`invoke_agent {bot}`, `chat {model}`, `execute_tool {tool}`).
    pub name: String,
    /// Its kind.
    pub kind: SpanKind,
    /// When it started (ms since the Unix epoch).
    pub start_ms: u64,
    /// When it ended.
    pub end_ms: u64,
    /// Its attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// Its events.
    pub events: Vec<SpanEvent>,
    /// Why it failed (`error.type`, and the span's status), if it did.
    pub error: Option<String>,
}

/// A new trace id (random, never all zero).
pub fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A new span id (random, never all zero).
pub fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

/// `bytes` as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `N` bytes from lowercase or uppercase hex; `None` when it is not that,
/// or all zero (an invalid id in W3C trace context).
pub fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != N * 2 || !text.is_ascii() {
        return None;
    }
    let mut bytes = [0u8; N];
    for (index, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(index * 2..index * 2 + 2)?, 16).ok()?;
    }
    (bytes != [0; N]).then_some(bytes)
}

/// The caller's span a W3C `traceparent` header names: `(trace id, parent
/// span id)`; `None` for anything that is not a version-00 header with
/// valid ids (the turn then starts a trace of its own).
pub fn parse_traceparent(header: &str) -> Option<([u8; 16], [u8; 8])> {
    let mut parts = header.trim().split('-');
    let version = parts.next()?;
    let trace_id = from_hex::<16>(parts.next()?)?;
    let parent = from_hex::<8>(parts.next()?)?;
    let flags = parts.next()?;
    if version != "00" || flags.len() != 2 || u8::from_str_radix(flags, 16).is_err() || parts.next().is_some() {
        return None;
    }
    Some((trace_id, parent))
}

/// A new turn's trace: under the caller's span when `traceparent` names
/// one, else a trace of its own.
pub fn turn_trace(traceparent: Option<&str>) -> TurnTrace {
    let (trace_id, parent) = match traceparent.and_then(parse_traceparent) {
        Some((trace_id, parent)) => (trace_id, Some(parent)),
        None => (new_trace_id(), None),
    };
    TurnTrace {
        trace_id: hex(&trace_id),
        span_id: hex(&new_span_id()),
        parent_span_id: parent.map(|parent| hex(&parent)),
        usage: TokenUsage::default(),
        finish_reason: None,
    }
}

/// A trace id, a span id and the span's parent, as bytes.
pub type SpanIds = ([u8; 16], [u8; 8], Option<[u8; 8]>);

/// The ids of a stored turn trace; `None` when they do not parse.
pub fn ids_of(trace: &TurnTrace) -> Option<SpanIds> {
    Some((
        from_hex::<16>(&trace.trace_id)?,
        from_hex::<8>(&trace.span_id)?,
        trace.parent_span_id.as_deref().and_then(from_hex::<8>),
    ))
}

/// The usage attributes of the GenAI conventions.
pub fn usage_attributes(usage: &TokenUsage) -> Vec<(&'static str, Value)> {
    vec![
        ("gen_ai.usage.input_tokens", usage.input_tokens.into()),
        ("gen_ai.usage.output_tokens", usage.output_tokens.into()),
        ("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_headers_parse_or_start_a_trace_of_their_own() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let (trace_id, parent) = parse_traceparent(header).expect("valid");
        assert_eq!(hex(&trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&parent), "00f067aa0ba902b7");
        let trace = turn_trace(Some(header));
        assert_eq!(trace.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(trace.parent_span_id.as_deref(), Some("00f067aa0ba902b7"));
        assert_ne!(trace.span_id, "00f067aa0ba902b7");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e47é6-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
            let own = turn_trace(Some(bad));
            assert_eq!(own.parent_span_id, None);
            assert_eq!(own.trace_id.len(), 32);
        }
    }
}
