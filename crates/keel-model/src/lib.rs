//! Models: what produces the assistant's side of a turn.
//!
//! A [`Model`] gets the history and a [`ModelEventSink`], streams what it
//! generates into the sink as it goes, and returns the complete
//! [`ModelOutput`]. The sink is synchronous and never blocks: the runtime
//! coalesces and records what it receives, and applies back-pressure by not
//! polling the model's future while the recorder is congested.
//! [`ScriptedModel`] plays answers back from a file, for tests, examples and
//! demos without a network.
//!
//! It must not know providers, the store or the recorder (no dependency on
//! `keel-providers` or `keel-store`): a model sees a history and a sink.

mod script;

use std::sync::Arc;

pub use futures::future::BoxFuture;
pub use keel_protocol::{ProviderError, mentions_context_length};
pub use script::{MAX_SCRIPT_BYTES, ScriptedModel};

use keel_protocol::Result;
use keel_protocol::{TokenUsage, TranscriptItem};

/// Something a model streams while it works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelEvent {
    /// A piece of the assistant's text.
    TextDelta(String),
    /// A piece of the model's visible reasoning (a summary or thinking text).
    ReasoningDelta(String),
}

/// Where a model streams its [`ModelEvent`]s. Cloneable and synchronous.
///
/// Once the response has completed or been cancelled, every call fails with
/// `agent stopped: model event sink closed`; a model should stop then.
pub type ModelEventSink = Arc<dyn Fn(ModelEvent) -> Result<()> + Send + Sync>;

/// What a model is asked to respond to.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    /// The session.
    pub session_id: &'a str,
    /// The turn this step belongs to.
    pub turn_id: &'a str,
    /// The conversation so far, oldest first, including this turn's input
    /// and the tool calls and results of its earlier steps.
    pub history: &'a [TranscriptItem],
    /// How many model calls the session made before this one; survives restarts.
    pub call_index: u64,
    /// Standing instructions (the system prompt), if any.
    pub instructions: Option<&'a str>,
    /// The tools the model may call.
    pub tools: &'a [ToolSpec],
    /// Why the model is asked: a step of a turn, or a summary of the
    /// history for compaction (a scripted model answers each from its own
    /// lines).
    pub purpose: RequestPurpose,
}

/// What a [`ModelRequest`] is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RequestPurpose {
    /// A model step of a turn.
    #[default]
    Turn,
    /// A summary of the older history, for context compaction; the last
    /// history item is the summarization prompt. `call_index` then counts
    /// the session's earlier summaries.
    Summary,
}

/// How much history a model takes, for context compaction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContextLimits {
    /// The context window, in tokens.
    pub window: u64,
    /// The share of the window (0 to 1) past which the history is compacted
    /// before a request.
    pub threshold: f64,
}

/// The compaction threshold when none is configured: 80% of the window.
pub const DEFAULT_COMPACT_THRESHOLD: f64 = 0.8;

/// The context window of a well-known model, by its provider name (for
/// example `gpt-4.1-mini`, `claude-sonnet-4-5`), when none is configured.
pub fn known_context_window(model: &str) -> Option<u64> {
    let model = model.to_ascii_lowercase();
    let known: [(&str, u64); 8] = [
        ("gpt-4.1", 1_047_576),
        ("gpt-5", 400_000),
        ("gpt-4o", 128_000),
        ("o3", 200_000),
        ("o4", 200_000),
        ("claude", 200_000),
        ("gpt-oss", 131_072),
        ("llama3", 128_000),
    ];
    known
        .iter()
        .find(|(prefix, _)| model.starts_with(prefix))
        .map(|(_, window)| *window)
}

impl<'a> ModelRequest<'a> {
    /// A request with no instructions and no tools.
    pub fn new(session_id: &'a str, turn_id: &'a str, history: &'a [TranscriptItem], call_index: u64) -> Self {
        Self {
            session_id,
            turn_id,
            history,
            call_index,
            instructions: None,
            tools: &[],
            purpose: RequestPurpose::Turn,
        }
    }
}

/// A tool as a model sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments (an object schema).
    pub parameters: serde_json::Value,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The provider's id for the call.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as JSON text, exactly as the model produced them.
    pub arguments: String,
}

/// A model's complete response to one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelOutput {
    /// The assistant's text (possibly empty when it only calls tools).
    pub text: String,
    /// Tool calls to run before the model is asked again, in order.
    pub tool_calls: Vec<ToolCall>,
    /// Reasoning state to keep in the history (see [`TranscriptItem::Reasoning`]).
    pub reasoning: Vec<TranscriptItem>,
    /// Tokens used, if the provider said.
    pub usage: Option<TokenUsage>,
    /// The provider stopped the output at its length limit
    /// (`max_output_tokens`, `finish_reason: length`): the text may stop
    /// mid-sentence and a tool call's arguments mid-object. The runtime
    /// records it, so a cut answer is not taken for a finished one.
    pub length_limited: bool,
    /// Where the request went (the provider's host), for the step's span.
    pub server_address: Option<String>,
    /// When each retry of the request started (ms since the Unix epoch),
    /// for the step's span; empty when the first attempt answered.
    pub retries: Vec<u64>,
    /// The provider's id of the response (`chatcmpl-…`, `resp_…`,
    /// `msg_…`), for the step's span: it is what the provider's own logs
    /// and support know the call by.
    pub response_id: Option<String>,
    /// The model that answered, as the provider names it (often a dated
    /// version of the one asked for), for the step's span.
    pub response_model: Option<String>,
}

impl ModelOutput {
    /// A response that is just text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    /// This response with `calls` added.
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }

    /// This response with `usage` set.
    pub fn with_usage(mut self, usage: TokenUsage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// This response marked as cut at the output length limit.
    pub fn cut_at_length_limit(mut self) -> Self {
        self.length_limited = true;
        self
    }

    /// This response with `items` of reasoning state.
    pub fn with_reasoning(mut self, items: Vec<TranscriptItem>) -> Self {
        self.reasoning = items;
        self
    }
}

/// A language model, or anything that answers like one.
pub trait Model: Send + Sync {
    /// Responds to `request`, streaming into `events` as output is produced.
    /// Dropping the returned future cancels the work.
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>>;

    /// A short name for logs and session listings (for example `script:a.jsonl`).
    fn name(&self) -> String {
        "model".to_owned()
    }

    /// The model's context window and compaction threshold, if known; with
    /// `None` the history is compacted only on request or when the provider
    /// says it is too long.
    fn context_limits(&self) -> Option<ContextLimits> {
        None
    }

    /// The provider whose API the model speaks, as OpenTelemetry's GenAI
    /// conventions name it (`openai`, `anthropic`), for spans; `None` for
    /// a model that is no provider's (then the prefix of [`Model::name`]).
    fn provider_name(&self) -> Option<&'static str> {
        None
    }

    /// The sampling settings sent with every request, for the step's span.
    fn request_parameters(&self) -> RequestParameters {
        RequestParameters::default()
    }
}

/// The sampling settings a model sends with its requests; `None` where it
/// sends none (the provider's default applies).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RequestParameters {
    /// The most tokens an answer may have.
    pub max_tokens: Option<u32>,
    /// The sampling temperature.
    pub temperature: Option<f64>,
}
