//! Anthropic Messages: `POST {base}/v1/messages`, streamed.
//!
//! The request carries the standing instructions as `system`, the history as
//! `messages` that alternate between `user` and `assistant`, the tools, and
//! `stream: true`. The response is a stream of named events, each with the
//! same name as the `type` of its JSON data:
//!
//! - `message_start`: the message shell, with the input token counts;
//! - `content_block_start` / `content_block_delta` / `content_block_stop`:
//!   one content block at a time, by `index`: `text` (`text_delta`, streamed
//!   at once), `tool_use` (id and name first, then the input as pieces of
//!   JSON text in `input_json_delta`s), `thinking` (`thinking_delta`,
//!   streamed as reasoning, then one `signature_delta`) and
//!   `redacted_thinking` (complete in its start);
//! - `message_delta`: the stop reason and the cumulative usage;
//! - `message_stop`: the end; a stream that ends without it is truncated;
//! - `ping`: keep-alive, ignored, as is any event type added later;
//! - `error`: the provider failed mid-stream (for example
//!   `overloaded_error`, which would be an HTTP 529 before the stream).
//!
//! Thinking blocks become [`TranscriptItem::Reasoning`] items (provider
//! `anthropic`, the complete block with its signature as data) and go back,
//! unchanged and ahead of the step's text and tool calls, on the next
//! request: the API requires them there while a tool-use cycle runs.
//!
//! **Prompt caching.** An agent's conversation only grows, and every step
//! sends all of it; without caching each step pays for the whole history
//! again. The request marks the stable prefix with `cache_control`
//! (ephemeral): the last tool, the system prompt, and the last block of the
//! history, so the next step reads all of it from the cache. Cache reads
//! and writes are counted in `token_usage` (`cached_input_tokens`).
//!
//! A response that reaches `max_tokens` in the middle of a `tool_use` block
//! fails the step instead of running the call: its input is unfinished, a
//! tool must never run with arguments the model did not complete, and
//! trying again would only hit the same limit. The message says to raise
//! `max_output_tokens`. A response cut short in its text is kept as it is.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::http::{EventStream, HttpClient, Secret, message_of, with_retries, within_step_deadline};
use super::sse::SseEvent;
use super::{Emitter, ProviderError, ProviderSettings, ReadError};
use keel_model::{BoxFuture, Model, ModelEventSink, ModelOutput, ModelRequest, ToolCall, ToolSpec};
use keel_protocol::Result;
use keel_protocol::{TokenUsage, TranscriptItem};

/// The API version sent as `anthropic-version`.
pub const API_VERSION: &str = "2023-06-01";

/// `max_tokens` when the settings give none; the API requires the field.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The `provider` of the reasoning items this adapter keeps and sends back.
/// It names the wire protocol, not the configured name, so that a model
/// renamed in `keel.toml` still gets its thinking blocks back.
pub const REASONING_PROVIDER: &str = "anthropic";

/// The mark of a prompt-cache breakpoint (the default five-minute cache).
fn cache_control() -> Value {
    json!({"type": "ephemeral"})
}

/// Event types this adapter knows; events of other types are skipped
/// without reading their data.
const KNOWN_EVENTS: [&str; 7] = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
];

/// Stream error types that pass: overload, rate limits, server trouble.
/// They correspond to HTTP 529, 429, 500 and 504 outside a stream.
const PASSING_ERRORS: [&str; 4] = ["overloaded_error", "rate_limit_error", "api_error", "timeout_error"];

/// A model behind the Anthropic Messages API.
#[derive(Debug)]
pub struct Anthropic {
    settings: ProviderSettings,
    http: HttpClient,
}

impl Anthropic {
    /// A client for the model and endpoint in `settings`.
    pub fn new(settings: ProviderSettings) -> Result<Self> {
        let http = HttpClient::new(settings.name.clone(), settings.http.clone())?;
        Ok(Self { settings, http })
    }

    fn url(&self) -> String {
        format!("{}/v1/messages", self.settings.base_url)
    }

    /// The key, the API version, then the configured headers (which may
    /// replace any of them, for gateways or newer API versions).
    fn headers(&self) -> Vec<(String, Secret)> {
        let mut headers = Vec::with_capacity(self.settings.headers.len() + 3);
        if let Some(key) = &self.settings.api_key {
            headers.push(("x-api-key".to_owned(), key.clone()));
        }
        headers.push(("anthropic-version".to_owned(), Secret::new(API_VERSION)));
        headers.push(("content-type".to_owned(), Secret::new("application/json")));
        headers.extend(self.settings.headers.iter().cloned());
        headers
    }

    /// The JSON body for `request`.
    fn body(&self, request: &ModelRequest<'_>) -> Value {
        let mut messages = messages(request.history);
        mark_cache_breakpoint(&mut messages);
        let mut body = json!({
            "model": self.settings.model,
            "max_tokens": self.settings.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            "messages": messages,
            "stream": true,
        });
        // The prompt is cached in the order tools, system, messages; each
        // part that does not change between steps ends with a breakpoint.
        let mut system = Vec::new();
        if let Some(instructions) = request.instructions.filter(|text| !text.trim().is_empty()) {
            system.push(json!({"type": "text", "text": instructions, "cache_control": cache_control()}));
        }
        // The compaction summary is context, not the user's words: a system
        // block after the instructions, never a user message.
        system.extend(summaries(request.history).map(|text| json!({"type": "text", "text": text})));
        if !system.is_empty() {
            body["system"] = Value::Array(system);
        }
        if !request.tools.is_empty() {
            let mut tools = tools(request.tools);
            if let Some(last) = tools.as_array_mut().and_then(|tools| tools.last_mut()) {
                last["cache_control"] = cache_control();
            }
            body["tools"] = tools;
        }
        if let Some(temperature) = self.settings.temperature {
            body["temperature"] = json!(temperature);
        }
        body
    }

    /// Reads the event stream up to `message_stop`.
    async fn read(&self, mut stream: EventStream, emitter: &mut Emitter) -> Result<ModelOutput, ReadError> {
        if let Some(message) = stream.take_complete() {
            stream.replay(events_of_complete(&message));
        }
        let mut response = Response::default();
        loop {
            let Some(event) = stream.next().await? else {
                // The body ended cleanly, but the message did not.
                return Err(self.truncated().into());
            };
            let Some(event) = self.parse(&event)? else {
                continue;
            };
            match event {
                StreamEvent::MessageStop {} => break,
                StreamEvent::Error { error } => return Err(self.stream_error(&error).into()),
                event => response.apply(event, emitter, self)?,
            }
        }
        response.output(self)
    }

    /// The event's JSON, or `None` for an event to skip (`ping`, a type
    /// this adapter does not know).
    fn parse(&self, event: &SseEvent) -> Result<Option<StreamEvent>, ProviderError> {
        // Events are named after their type; unnamed ones (from a proxy that
        // drops the names) are told by the `type` in their data.
        if let Some(name) = event.event.as_deref()
            && !KNOWN_EVENTS.contains(&name)
        {
            return Ok(None);
        }
        let mut data: Value = serde_json::from_str(&event.data)
            .map_err(|error| self.malformed(format!("an event is not valid JSON: {error}")))?;
        if let (Some(object), Some(name)) = (data.as_object_mut(), event.event.as_deref()) {
            object.entry("type").or_insert_with(|| json!(name));
        }
        let event: StreamEvent = serde_json::from_value(data)
            .map_err(|error| self.malformed(format!("an event does not have the expected shape: {error}")))?;
        Ok(match event {
            StreamEvent::Other => None,
            event => Some(event),
        })
    }

    /// An `error` event as a provider error, passing if its type says so.
    fn stream_error(&self, error: &Value) -> ProviderError {
        let kind = error.get("type").and_then(Value::as_str).unwrap_or_default();
        ProviderError::Stream {
            provider: self.settings.name.clone(),
            message: message_of(&json!({"error": error}))
                .unwrap_or_else(|| "the provider reported an error".to_owned()),
            retryable: PASSING_ERRORS.contains(&kind),
        }
    }

    fn truncated(&self) -> ProviderError {
        ProviderError::Truncated {
            provider: self.settings.name.clone(),
        }
    }

    fn malformed(&self, message: String) -> ProviderError {
        ProviderError::Malformed {
            provider: self.settings.name.clone(),
            message,
        }
    }
}

impl super::ReadStream for Anthropic {
    fn read_stream(
        &self,
        stream: EventStream,
        emitter: &mut Emitter,
    ) -> impl Future<Output = Result<ModelOutput, ReadError>> + Send {
        self.read(stream, emitter)
    }
}

impl Model for Anthropic {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            self.settings.check_context(request.instructions, request.history)?;
            let (url, headers, body) = (self.url(), self.headers(), self.body(&request));
            let attempts = with_retries(&self.settings.http.retry, |_| {
                super::attempt(&self.http, self, &url, &headers, &body, Arc::clone(&events))
            });
            within_step_deadline(&self.settings.name, &self.settings.http, attempts).await
        })
    }

    fn name(&self) -> String {
        format!("{}:{}", self.settings.name, self.settings.model)
    }

    fn context_limits(&self) -> Option<keel_model::ContextLimits> {
        self.settings.context_limits()
    }
}

/// Which side of the conversation a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    User,
    Assistant,
}

/// The compaction summaries in the history, for `system`.
fn summaries(history: &[TranscriptItem]) -> impl Iterator<Item = &str> {
    history.iter().filter_map(|item| match item {
        TranscriptItem::Summary { text } => Some(text.as_str()),
        _ => None,
    })
}

/// The history as Messages API messages.
///
/// Consecutive items of one role form one message, so that roles alternate
/// as the API requires: user text and tool results are user content;
/// thinking blocks, text and tool calls are assistant content, in history
/// order (which puts a step's thinking first, as the API wants it). Blocks
/// the API would refuse are left out: empty or blank text, and reasoning
/// that another provider produced; a message left with nothing is left out
/// too, which joins its neighbours.
fn messages(history: &[TranscriptItem]) -> Vec<Value> {
    let mut messages: Vec<(Role, Vec<Value>)> = Vec::new();
    for item in history {
        let (role, block) = match item {
            TranscriptItem::UserMessage { text } => match text_block(text) {
                Some(block) => (Role::User, block),
                None => continue,
            },
            // Text of an interrupted step was seen by the user; the model
            // should know it said it.
            TranscriptItem::AssistantMessage { text, .. } => match text_block(text) {
                Some(block) => (Role::Assistant, block),
                None => continue,
            },
            TranscriptItem::ToolCall {
                call_id,
                name,
                arguments,
            } => (
                Role::Assistant,
                json!({"type": "tool_use", "id": call_id, "name": name, "input": tool_input(arguments)}),
            ),
            TranscriptItem::ToolResult {
                call_id,
                output,
                is_error,
            } => {
                let mut block = json!({"type": "tool_result", "tool_use_id": call_id, "is_error": is_error});
                // `content` is optional; an empty one is left out rather than
                // risk an empty text block.
                if !output.is_empty() {
                    block["content"] = json!(output);
                }
                (Role::User, block)
            }
            // Sent back exactly as received: the signature covers it.
            TranscriptItem::Reasoning { provider, data } if provider == REASONING_PROVIDER => {
                (Role::Assistant, data.clone())
            }
            TranscriptItem::Reasoning { .. } => continue,
            // Messages are only the user's or the assistant's: the summary
            // goes to `system` (see `summaries`).
            TranscriptItem::Summary { .. } => continue,
        };
        match messages.last_mut() {
            Some((last, blocks)) if *last == role => blocks.push(block),
            _ => messages.push((role, vec![block])),
        }
    }
    messages
        .into_iter()
        .map(|(role, mut blocks)| match role {
            Role::Assistant => json!({"role": "assistant", "content": blocks}),
            Role::User => {
                // "In the user message containing tool results, the
                // tool_result blocks must come first": text merged into the
                // same message goes after them, wherever the history had it.
                // The sort is stable, so each group keeps its order.
                blocks.sort_by_key(|block| block.get("type").and_then(Value::as_str) != Some("tool_result"));
                json!({"role": "user", "content": blocks})
            }
        })
        .collect()
}

/// The events a stream would have carried for a complete, non-streamed
/// answer (a `message` object, or an error): each content block arrives
/// whole in its start, which the reader accepts as it does a block that
/// gets no deltas.
fn events_of_complete(message: &Value) -> Vec<SseEvent> {
    let event = |kind: &str, data: Value| SseEvent {
        event: Some(kind.to_owned()),
        data: data.to_string(),
    };
    if message.get("type").and_then(Value::as_str) == Some("error") {
        return vec![event("error", message.clone())];
    }
    let mut shell = message.clone();
    shell["content"] = json!([]);
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": shell}),
    )];
    let blocks = message.get("content").and_then(Value::as_array).into_iter().flatten();
    for (index, block) in blocks.enumerate() {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(event(
        "message_delta",
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": message.get("stop_reason"), "stop_sequence": null},
            "usage": message.get("usage").cloned().unwrap_or_else(|| json!({})),
        }),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

/// Marks the end of the history as a prompt-cache breakpoint: the history
/// only grows, so everything up to its last block is the stable prefix of
/// the next step's request, which then reads it from the cache instead of
/// paying for it again. Thinking blocks cannot carry the mark; the block
/// before them does then.
fn mark_cache_breakpoint(messages: &mut [Value]) {
    let Some(blocks) = messages
        .last_mut()
        .and_then(|message| message.get_mut("content"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    let cacheable = |block: &Value| {
        !matches!(
            block.get("type").and_then(Value::as_str),
            Some("thinking" | "redacted_thinking")
        )
    };
    if let Some(block) = blocks.iter_mut().rev().find(|block| cacheable(block)) {
        block["cache_control"] = cache_control();
    }
}

/// A text block, unless the text is blank (the API refuses those).
fn text_block(text: &str) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

/// A tool call's arguments as the `input` object the API requires. Arguments
/// that are not a JSON object go as `{}`: the call already failed with an
/// error result saying why, which the model reads next.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(object)) => Value::Object(object),
        _ => Value::Object(Map::new()),
    }
}

fn tools(tools: &[ToolSpec]) -> Value {
    tools
        .iter()
        .map(|tool| {
            let mut spec = json!({"name": tool.name, "input_schema": tool.parameters});
            if !tool.description.is_empty() {
                spec["description"] = json!(tool.description);
            }
            spec
        })
        .collect()
}

/// One stream event. Only what is used; unknown fields pass, and `null`
/// counts as absent.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum StreamEvent {
    MessageStart {
        message: MessageStart,
    },
    ContentBlockStart {
        index: u64,
        content_block: Value,
    },
    ContentBlockDelta {
        index: u64,
        delta: Delta,
    },
    MessageDelta {
        #[serde(default)]
        delta: Option<MessageDelta>,
        #[serde(default)]
        usage: Option<Usage>,
    },
    /// A struct variant, so that fields a gateway adds are ignored.
    MessageStop {},
    Error {
        /// `{"type", "message"}`; read leniently, since any error ends the call.
        #[serde(default)]
        error: Value,
    },
    /// `ping`, `content_block_stop` (every block is complete at
    /// `message_stop` anyway) and types added later.
    #[serde(other)]
    Other,
}

#[derive(Debug, Deserialize)]
struct MessageStart {
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
struct MessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// Token counts; `message_start` has them all, `message_delta` the
/// cumulative ones that changed (at least `output_tokens`).
#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

/// A `content_block_delta`'s delta, by its `type` (`text_delta` and so on).
#[derive(Debug, Deserialize)]
#[serde(tag = "type")]
enum Delta {
    #[serde(rename = "text_delta")]
    Text { text: String },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: String },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: String },
    #[serde(rename = "signature_delta")]
    Signature { signature: String },
    /// `citations_delta` and whatever comes later.
    #[serde(other)]
    Other,
}

/// A content block as assembled so far.
enum Block {
    Text,
    ToolUse {
        id: String,
        name: String,
        /// The input JSON text, from the `input_json_delta` pieces.
        input: String,
        /// The input given in the block's start, for a call that gets no
        /// pieces (a tool without parameters).
        initial: Value,
    },
    Thinking {
        /// The block as it started, completed at the end.
        block: Map<String, Value>,
        thinking: String,
        signature: String,
    },
    RedactedThinking(Value),
    /// A block type this adapter does not use (server tools and their
    /// results); its deltas are ignored.
    Other,
}

/// Token counts as reported so far (the API's fields, not yet summed).
#[derive(Debug, Default)]
struct Tokens {
    input: u64,
    output: u64,
    cache_creation: u64,
    cache_read: u64,
}

impl Tokens {
    /// Takes every count `usage` has: the counts are cumulative, so the
    /// latest one is the total.
    fn update(&mut self, usage: &Usage) {
        let fields = [
            (&mut self.input, usage.input_tokens),
            (&mut self.output, usage.output_tokens),
            (&mut self.cache_creation, usage.cache_creation_input_tokens),
            (&mut self.cache_read, usage.cache_read_input_tokens),
        ];
        for (field, value) in fields {
            if let Some(value) = value {
                *field = value;
            }
        }
    }
}

impl From<Tokens> for TokenUsage {
    /// `input_tokens` counts only the tokens after the last cache
    /// breakpoint; the prompt is all three input counts together.
    fn from(tokens: Tokens) -> Self {
        TokenUsage {
            input_tokens: tokens
                .input
                .saturating_add(tokens.cache_read)
                .saturating_add(tokens.cache_creation),
            cached_input_tokens: tokens.cache_read,
            output_tokens: tokens.output,
            // Thinking tokens are part of `output_tokens`; the API does not
            // count them apart.
            reasoning_tokens: 0,
        }
    }
}

/// The response as assembled so far.
#[derive(Default)]
struct Response {
    text: String,
    /// By index, which is the block's place in the message.
    blocks: BTreeMap<u64, Block>,
    tokens: Option<Tokens>,
    stop_reason: Option<String>,
}

impl Response {
    fn apply(&mut self, event: StreamEvent, emitter: &mut Emitter, model: &Anthropic) -> Result<(), ReadError> {
        match event {
            StreamEvent::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.tokens.get_or_insert_with(Tokens::default).update(&usage);
                }
            }
            StreamEvent::ContentBlockStart { index, content_block } => {
                let block = self.start_block(&content_block, emitter, model)?;
                if self.blocks.insert(index, block).is_some() {
                    return Err(model.malformed(format!("content block {index} started twice")).into());
                }
            }
            StreamEvent::ContentBlockDelta { index, delta } => self.apply_delta(index, delta, emitter, model)?,
            StreamEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.and_then(|delta| delta.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                if let Some(usage) = usage {
                    self.tokens.get_or_insert_with(Tokens::default).update(&usage);
                }
            }
            StreamEvent::MessageStop {} | StreamEvent::Error { .. } | StreamEvent::Other => {}
        }
        Ok(())
    }

    fn start_block(&mut self, start: &Value, emitter: &mut Emitter, model: &Anthropic) -> Result<Block, ReadError> {
        let text_of = |field: &str| start.get(field).and_then(Value::as_str).unwrap_or_default();
        Ok(match text_of("type") {
            "text" => {
                // The start carries the block's first text, usually empty.
                let text = text_of("text");
                emitter.text(text)?;
                self.text.push_str(text);
                Block::Text
            }
            "tool_use" => {
                let (id, name) = (text_of("id"), text_of("name"));
                if id.is_empty() || name.is_empty() {
                    return Err(model.malformed("a tool_use block without id or name".to_owned()).into());
                }
                Block::ToolUse {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    input: String::new(),
                    initial: start.get("input").cloned().unwrap_or_else(|| json!({})),
                }
            }
            "thinking" => {
                let thinking = text_of("thinking");
                emitter.reasoning(thinking)?;
                Block::Thinking {
                    block: start.as_object().cloned().unwrap_or_default(),
                    thinking: thinking.to_owned(),
                    signature: text_of("signature").to_owned(),
                }
            }
            "redacted_thinking" => Block::RedactedThinking(start.clone()),
            _ => Block::Other,
        })
    }

    fn apply_delta(
        &mut self,
        index: u64,
        delta: Delta,
        emitter: &mut Emitter,
        model: &Anthropic,
    ) -> Result<(), ReadError> {
        let Some(block) = self.blocks.get_mut(&index) else {
            return Err(model
                .malformed(format!("a delta for content block {index}, which was not started"))
                .into());
        };
        match (block, delta) {
            (Block::Text, Delta::Text { text }) => {
                emitter.text(&text)?;
                self.text.push_str(&text);
            }
            (Block::ToolUse { input, .. }, Delta::InputJson { partial_json }) => input.push_str(&partial_json),
            (Block::Thinking { thinking, .. }, Delta::Thinking { thinking: piece }) => {
                emitter.reasoning(&piece)?;
                thinking.push_str(&piece);
            }
            (Block::Thinking { signature, .. }, Delta::Signature { signature: piece }) => {
                signature.push_str(&piece);
            }
            // Blocks this adapter does not use, and deltas added later.
            (Block::Other, _) | (_, Delta::Other) => {}
            (_, delta) => {
                return Err(model
                    .malformed(format!("content block {index} got a delta of another kind: {delta:?}"))
                    .into());
            }
        }
        Ok(())
    }

    fn output(self, model: &Anthropic) -> Result<ModelOutput, ReadError> {
        let cut_short = self.stop_reason.as_deref() == Some("max_tokens");
        let last = self.blocks.keys().next_back().copied();
        let mut calls = Vec::new();
        let mut reasoning = Vec::new();
        for (index, block) in self.blocks {
            match block {
                Block::ToolUse { name, .. } if cut_short && Some(index) == last => {
                    let limit = model.settings.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
                    return Err(ProviderError::Stream {
                        provider: model.settings.name.clone(),
                        message: format!(
                            "the response reached its limit of {limit} output tokens in the middle of a call to \
                             '{name}', so the call was not run; raise max_output_tokens"
                        ),
                        retryable: false,
                    }
                    .into());
                }
                Block::ToolUse {
                    id,
                    name,
                    input,
                    initial,
                } => calls.push(ToolCall {
                    call_id: id,
                    name,
                    // A tool without parameters gets no pieces; its input is
                    // the one in the block's start, `{}`.
                    arguments: if input.trim().is_empty() {
                        initial.to_string()
                    } else {
                        input
                    },
                }),
                Block::Thinking {
                    mut block,
                    thinking,
                    signature,
                } => {
                    // Without its signature (cut off by max_tokens) the API
                    // would refuse the block; thinking is only required back
                    // within a tool-use cycle, which a cut-off response does
                    // not start.
                    if signature.is_empty() {
                        continue;
                    }
                    block.insert("thinking".to_owned(), Value::String(thinking));
                    block.insert("signature".to_owned(), Value::String(signature));
                    reasoning.push(TranscriptItem::Reasoning {
                        provider: REASONING_PROVIDER.to_owned(),
                        data: Value::Object(block),
                    });
                }
                Block::RedactedThinking(data) => reasoning.push(TranscriptItem::Reasoning {
                    provider: REASONING_PROVIDER.to_owned(),
                    data,
                }),
                Block::Text | Block::Other => {}
            }
        }
        if cut_short {
            tracing::warn!(
                model = %model.name(),
                "the response reached max_tokens; its text is cut short"
            );
        }
        let mut output = ModelOutput::text(self.text)
            .with_tool_calls(calls)
            .with_reasoning(reasoning);
        if cut_short {
            output = output.cut_at_length_limit();
        }
        Ok(match self.tokens {
            Some(tokens) => output.with_usage(tokens.into()),
            None => output,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_text_foreign_reasoning_and_empty_messages_are_left_out() {
        let history = vec![
            TranscriptItem::UserMessage { text: "hi".into() },
            TranscriptItem::Reasoning {
                provider: "openai-responses".into(),
                data: json!({"type": "reasoning"}),
            },
            TranscriptItem::AssistantMessage {
                text: " \n".into(),
                interrupted: false,
            },
            TranscriptItem::UserMessage { text: "again".into() },
        ];
        assert_eq!(
            messages(&history),
            vec![json!({"role": "user", "content": [
                {"type": "text", "text": "hi"},
                {"type": "text", "text": "again"},
            ]})]
        );
    }

    #[test]
    fn tool_results_come_first_in_their_user_message_and_bad_arguments_become_an_empty_input() {
        let history = vec![
            TranscriptItem::UserMessage { text: "go".into() },
            TranscriptItem::ToolCall {
                call_id: "toolu_1".into(),
                name: "clock".into(),
                arguments: "[1, 2]".into(),
            },
            TranscriptItem::UserMessage { text: "early".into() },
            TranscriptItem::ToolResult {
                call_id: "toolu_1".into(),
                output: String::new(),
                is_error: true,
            },
        ];
        assert_eq!(
            messages(&history),
            vec![
                json!({"role": "user", "content": [{"type": "text", "text": "go"}]}),
                json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "clock", "input": {}},
                ]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true},
                    {"type": "text", "text": "early"},
                ]}),
            ]
        );
    }

    #[test]
    fn usage_sums_the_three_input_counts_and_takes_the_latest_cumulative_values() {
        let mut tokens = Tokens::default();
        tokens.update(&Usage {
            input_tokens: Some(10),
            output_tokens: Some(1),
            cache_creation_input_tokens: Some(20),
            cache_read_input_tokens: Some(300),
        });
        tokens.update(&Usage {
            input_tokens: None,
            output_tokens: Some(42),
            cache_creation_input_tokens: None,
            cache_read_input_tokens: None,
        });
        assert_eq!(
            TokenUsage::from(tokens),
            TokenUsage {
                input_tokens: 330,
                cached_input_tokens: 300,
                output_tokens: 42,
                reasoning_tokens: 0,
            }
        );
    }
}
