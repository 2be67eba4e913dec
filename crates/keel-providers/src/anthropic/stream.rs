//! Decoding a Messages stream: named events up to `message_stop`, one
//! content block at a time, text and thinking streamed at once, tool inputs
//! assembled from their JSON pieces.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{DEFAULT_MAX_TOKENS, REASONING_PROVIDER};
use crate::frame::{Decoded, Emitter, ReadError, StreamDecoder};
use crate::http::message_of;
use crate::sse::SseEvent;
use crate::{ProviderError, ProviderSettings};
use keel_model::{ModelOutput, ToolCall};
use keel_protocol::{TokenUsage, TranscriptItem};

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

/// What decoding needs to know of the model: its names in errors and logs,
/// and its output limit.
struct Meta {
    provider: String,
    model_name: String,
    max_tokens: u32,
}

impl Meta {
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
            provider: self.provider.clone(),
            message: message_of(&json!({"error": error}))
                .unwrap_or_else(|| "the provider reported an error".to_owned()),
            retryable: PASSING_ERRORS.contains(&kind),
        }
    }

    fn malformed(&self, message: String) -> ProviderError {
        ProviderError::Malformed {
            provider: self.provider.clone(),
            message,
        }
    }
}

/// The state of one streamed Messages response.
pub struct MessagesDecoder {
    meta: Meta,
    response: Response,
}

impl MessagesDecoder {
    /// A decoder for a response of the model in `settings`.
    pub(super) fn new(settings: &ProviderSettings) -> Self {
        Self {
            meta: Meta {
                provider: settings.name.clone(),
                model_name: settings.display_name(),
                max_tokens: settings.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            },
            response: Response::default(),
        }
    }
}

impl StreamDecoder for MessagesDecoder {
    fn event(&mut self, event: &SseEvent, emitter: &mut Emitter) -> Result<Decoded, ReadError> {
        let Some(event) = self.meta.parse(event)? else {
            return Ok(Decoded::More);
        };
        match event {
            StreamEvent::MessageStop {} => return Ok(Decoded::Done),
            StreamEvent::Error { error } => return Err(self.meta.stream_error(&error).into()),
            event => self.response.apply(event, emitter, &self.meta)?,
        }
        Ok(Decoded::More)
    }

    fn finish(self) -> Result<ModelOutput, ReadError> {
        self.response.output(&self.meta)
    }
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
    /// The message's id (`msg_…`).
    #[serde(default)]
    id: Option<String>,
    /// The model that answers, as the API names it.
    #[serde(default)]
    model: Option<String>,
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
    /// The message's id and model, from `message_start`.
    id: Option<String>,
    model: Option<String>,
}

impl Response {
    fn apply(&mut self, event: StreamEvent, emitter: &mut Emitter, model: &Meta) -> Result<(), ReadError> {
        match event {
            StreamEvent::MessageStart { message } => {
                crate::frame::keep_first(&mut self.id, message.id);
                crate::frame::keep_first(&mut self.model, message.model);
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

    fn start_block(&mut self, start: &Value, emitter: &mut Emitter, model: &Meta) -> Result<Block, ReadError> {
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

    fn apply_delta(&mut self, index: u64, delta: Delta, emitter: &mut Emitter, model: &Meta) -> Result<(), ReadError> {
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

    fn output(self, model: &Meta) -> Result<ModelOutput, ReadError> {
        let cut_short = self.stop_reason.as_deref() == Some("max_tokens");
        let last = self.blocks.keys().next_back().copied();
        let mut calls = Vec::new();
        let mut reasoning = Vec::new();
        for (index, block) in self.blocks {
            match block {
                Block::ToolUse { name, .. } if cut_short && Some(index) == last => {
                    let limit = model.max_tokens;
                    return Err(ProviderError::Stream {
                        provider: model.provider.clone(),
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
                model = %model.model_name,
                "the response reached max_tokens; its text is cut short"
            );
        }
        let mut output = ModelOutput::text(self.text)
            .with_tool_calls(calls)
            .with_reasoning(reasoning);
        if cut_short {
            output = output.cut_at_length_limit();
        }
        output.response_id = self.id;
        output.response_model = self.model;
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
