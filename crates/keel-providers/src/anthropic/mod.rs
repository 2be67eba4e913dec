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

mod stream;

use serde_json::{Map, Value, json};

use self::stream::MessagesDecoder;
use crate::ProviderSettings;
use crate::frame::{HttpModel, WireFormat};
use crate::http::Secret;
use crate::sse::SseEvent;
use keel_model::{ModelRequest, ToolSpec};
use keel_protocol::TranscriptItem;

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

/// A model behind the Anthropic Messages API.
pub type Anthropic = HttpModel<Messages>;

/// The Messages wire format.
#[derive(Debug, Default)]
pub struct Messages;

impl WireFormat for Messages {
    type Decoder = MessagesDecoder;

    const PATH: &'static str = "/v1/messages";

    const PROVIDER: &'static str = "anthropic";

    /// The key, the API version, then the configured headers (which may
    /// replace any of them, for gateways or newer API versions).
    fn headers(&self, settings: &ProviderSettings) -> Vec<(String, Secret)> {
        let mut headers = Vec::with_capacity(settings.headers.len() + 3);
        if let Some(key) = &settings.api_key {
            headers.push(("x-api-key".to_owned(), key.clone()));
        }
        headers.push(("anthropic-version".to_owned(), Secret::new(API_VERSION)));
        headers.push(("content-type".to_owned(), Secret::new("application/json")));
        headers.extend(settings.headers.iter().cloned());
        headers
    }

    fn body(&self, settings: &ProviderSettings, request: &ModelRequest<'_>) -> Value {
        let mut messages = messages(request.history);
        mark_cache_breakpoint(&mut messages);
        let mut body = json!({
            "model": settings.model,
            "max_tokens": settings.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
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
        if let Some(temperature) = settings.temperature {
            body["temperature"] = json!(temperature);
        }
        body
    }

    fn events_of_complete(&self, answer: Value) -> Vec<SseEvent> {
        events_of_complete(&answer)
    }

    fn decoder(&self, settings: &ProviderSettings) -> MessagesDecoder {
        MessagesDecoder::new(settings)
    }

    /// The API requires `max_tokens`: without one configured, the default
    /// is sent.
    fn max_tokens(&self, settings: &ProviderSettings) -> Option<u32> {
        Some(settings.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS))
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
}
