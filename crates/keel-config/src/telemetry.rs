//! `[telemetry]`: where `keel serve` exports its traces (OpenTelemetry, over
//! OTLP/HTTP with protobuf).
//!
//! Export is on when `endpoint` is set here or the standard variables
//! (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, `OTEL_EXPORTER_OTLP_ENDPOINT`)
//! are, unless `OTEL_SDK_DISABLED=true`; headers come from
//! `OTEL_EXPORTER_OTLP_HEADERS` (a collector's key), never from this file.

use serde::Deserialize;

/// `[telemetry]` in `keel.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// The OTLP/HTTP endpoint's base URL (`http://collector:4318`); spans
    /// are posted to `{endpoint}/v1/traces`. The variables above apply
    /// when it is unset.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// `service.name` of the spans' resource.
    #[serde(default = "default_service_name")]
    pub service_name: String,
    /// Spans waiting for export at most; past it, new spans are dropped
    /// (and counted in `keel_spans_dropped_total`), never waited for.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// How long one export may take (ms).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Whether spans carry what was said: the model's output
    /// (`gen_ai.output.messages`), tool arguments and results. Off by
    /// default: they hold personal data and secrets; when on, they are
    /// redacted as stored text is.
    #[serde(default)]
    pub capture_content: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            service_name: default_service_name(),
            queue: default_queue(),
            timeout_ms: default_timeout_ms(),
            capture_content: false,
        }
    }
}

fn default_service_name() -> String {
    "keel".to_owned()
}

fn default_queue() -> usize {
    4096
}

fn default_timeout_ms() -> u64 {
    10_000
}
