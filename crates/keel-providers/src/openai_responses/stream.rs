//! Decoding a Responses stream: semantic events up to one of the three
//! terminal ones, text and reasoning streamed at once, function calls
//! assembled per output item, reasoning items kept whole.

use std::collections::HashSet;

use serde_json::Value;

use super::REASONING_PROVIDER;
use crate::ProviderError;
use crate::frame::{Decoded, Emitter, ReadError, StreamDecoder};
use crate::sse::SseEvent;
use keel_model::{ModelOutput, ToolCall};
use keel_protocol::{TokenUsage, TranscriptItem};

/// Error codes OpenAI documents for a failed response that may pass on
/// their own; anything else would fail the same way again.
const RETRYABLE_CODES: &[&str] = &["server_error", "rate_limit_exceeded"];

/// A function call being assembled from its events.
#[derive(Debug, Default)]
struct PendingCall {
    /// The output item's id (`fc_…`), which the argument deltas name.
    item_id: Option<String>,
    /// The output item's position, the other way deltas name it.
    output_index: Option<u64>,
    call_id: String,
    name: String,
    arguments: String,
}

/// The state of one streamed response.
pub struct ResponsesDecoder {
    provider: String,
    /// The usage `response.completed` reported.
    usage: Option<TokenUsage>,
    text: String,
    /// Message items whose text arrived as deltas.
    streamed_messages: HashSet<String>,
    /// Text deltas arrived that named no item; then no message's final text
    /// can be told apart from what was streamed.
    anonymous_text: bool,
    calls: Vec<PendingCall>,
    reasoning: Vec<TranscriptItem>,
    /// The reasoning part (item id, part index) that streamed last, so that
    /// the next part starts on a new paragraph.
    reasoning_part: Option<(String, u64)>,
    /// The response's id (`resp_…`) and model, from the first event whose
    /// `response` names them (`response.created`, else the terminal one).
    id: Option<String>,
    model: Option<String>,
}

impl ResponsesDecoder {
    /// A decoder for a response of `provider`.
    pub(super) fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_owned(),
            usage: None,
            text: String::new(),
            streamed_messages: HashSet::new(),
            anonymous_text: false,
            calls: Vec::new(),
            reasoning: Vec::new(),
            reasoning_part: None,
            id: None,
            model: None,
        }
    }

    /// Reads one event; `Done` once the response completed.
    fn read(&mut self, event: &SseEvent, emitter: &mut Emitter) -> Result<Decoded, ReadError> {
        let data = event.data.trim();
        // Not part of the Responses protocol, but some compatible servers end
        // with it, as Chat Completions does; the terminal event decides.
        if data == "[DONE]" {
            return Ok(Decoded::More);
        }
        let json: Value =
            serde_json::from_str(data).map_err(|error| self.malformed(format!("invalid JSON: {error}")))?;
        if !json.is_object() {
            return Err(self.malformed("an event is not a JSON object".to_owned()));
        }
        let kind = json
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or_default();
        if let Some(response) = json.get("response") {
            let named = |key: &str| response.get(key).and_then(Value::as_str).map(str::to_owned);
            crate::frame::keep_first(&mut self.id, named("id"));
            crate::frame::keep_first(&mut self.model, named("model"));
        }
        match kind {
            "response.output_text.delta" | "response.refusal.delta" => {
                let delta = str_at(&json, "delta");
                match json.get("item_id").and_then(Value::as_str) {
                    Some(item) => _ = self.streamed_messages.insert(item.to_owned()),
                    None => self.anonymous_text = true,
                }
                self.text.push_str(delta);
                emitter.text(delta)?;
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                let part = (
                    str_at(&json, "item_id").to_owned(),
                    json.get("summary_index")
                        .or_else(|| json.get("content_index"))
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                );
                if self.reasoning_part.as_ref().is_some_and(|last| *last != part) {
                    emitter.reasoning("\n\n")?;
                }
                self.reasoning_part = Some(part);
                emitter.reasoning(str_at(&json, "delta"))?;
            }
            "response.output_item.added" => {
                let item = json.get("item").unwrap_or(&Value::Null);
                if str_at(item, "type") == "function_call" {
                    let call = self.call(&json, item);
                    update_call(call, item);
                }
            }
            "response.function_call_arguments.delta" => {
                let call = self.call(&json, &Value::Null);
                call.arguments.push_str(str_at(&json, "delta"));
            }
            "response.function_call_arguments.done" => {
                let call = self.call(&json, &Value::Null);
                if let Some(arguments) = json.get("arguments").and_then(Value::as_str) {
                    call.arguments = arguments.to_owned();
                }
                if let Some(name) = json.get("name").and_then(Value::as_str) {
                    call.name = name.to_owned();
                }
            }
            "response.output_item.done" => self.item_done(&json, emitter)?,
            "response.completed" => {
                self.usage = json.pointer("/response/usage").and_then(usage_of);
                return Ok(Decoded::Done);
            }
            "response.failed" => {
                let response = json.get("response").unwrap_or(&Value::Null);
                let error = response.get("error").filter(|error| error.is_object());
                return Err(self.stream_error(error.unwrap_or(&Value::Null), "the response failed"));
            }
            "response.incomplete" => {
                let reason = json
                    .pointer("/response/incomplete_details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given");
                return Err(ReadError::Provider(ProviderError::Stream {
                    provider: self.provider.to_owned(),
                    message: format!("the response is incomplete ({reason}): the model stopped before it finished"),
                    retryable: false,
                }));
            }
            "error" => {
                // Documented flat (`code`, `message`); some servers nest an
                // `error` object instead.
                let error = json.get("error").filter(|error| error.is_object()).unwrap_or(&json);
                return Err(self.stream_error(error, "the stream reported an error"));
            }
            // `response.created`, `response.in_progress`, content parts,
            // `.done` events whose content the deltas already gave, and
            // whatever the API adds later.
            _ => {}
        }
        Ok(Decoded::More)
    }

    /// A finished output item: reasoning is kept whole (its encrypted
    /// content is only final here), function calls take their final form,
    /// and a message that streamed no deltas is forwarded now.
    fn item_done(&mut self, json: &Value, emitter: &mut Emitter) -> Result<(), ReadError> {
        let item = json.get("item").unwrap_or(&Value::Null);
        match str_at(item, "type") {
            "reasoning" => self.reasoning.push(TranscriptItem::Reasoning {
                provider: REASONING_PROVIDER.to_owned(),
                data: item.clone(),
            }),
            "function_call" => {
                let call = self.call(json, item);
                update_call(call, item);
            }
            "message" if !self.anonymous_text && !self.streamed_messages.contains(str_at(item, "id")) => {
                let parts = item.get("content").and_then(Value::as_array).into_iter().flatten();
                for part in parts {
                    let text = match str_at(part, "type") {
                        "output_text" => str_at(part, "text"),
                        "refusal" => str_at(part, "refusal"),
                        _ => "",
                    };
                    self.text.push_str(text);
                    emitter.text(text)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The output of a completed response.
    fn complete(mut self) -> Result<ModelOutput, ReadError> {
        let mut calls = Vec::with_capacity(self.calls.len());
        for call in std::mem::take(&mut self.calls) {
            if call.call_id.is_empty() || call.name.is_empty() {
                return Err(self.malformed(format!(
                    "function call item {} has no call_id or name",
                    call.item_id.as_deref().unwrap_or("(without id)")
                )));
            }
            calls.push(ToolCall {
                call_id: call.call_id,
                name: call.name,
                arguments: call.arguments,
            });
        }
        let mut output = ModelOutput::text(std::mem::take(&mut self.text))
            .with_tool_calls(calls)
            .with_reasoning(std::mem::take(&mut self.reasoning));
        if let Some(usage) = self.usage {
            output = output.with_usage(usage);
        }
        output.response_id = self.id.take();
        output.response_model = self.model.take();
        Ok(output)
    }

    /// The call an event is about (by item id, else by output index); a new
    /// one if it was not announced.
    fn call(&mut self, event: &Value, item: &Value) -> &mut PendingCall {
        let item_id = event
            .get("item_id")
            .or_else(|| item.get("id"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let output_index = event.get("output_index").and_then(Value::as_u64);
        let position = self.calls.iter().position(|call| match (&item_id, &call.item_id) {
            (Some(wanted), Some(id)) => wanted == id,
            _ => output_index.is_some() && call.output_index == output_index,
        });
        let position = position.unwrap_or_else(|| {
            self.calls.push(PendingCall {
                item_id,
                output_index,
                ..PendingCall::default()
            });
            self.calls.len() - 1
        });
        &mut self.calls[position]
    }

    /// A [`ProviderError::Stream`] from an OpenAI error object (`code`,
    /// `message`), retryable when its code says the failure passes.
    fn stream_error(&self, error: &Value, fallback: &str) -> ReadError {
        let code = error
            .get("code")
            .and_then(Value::as_str)
            .or_else(|| {
                error
                    .get("type")
                    .and_then(Value::as_str)
                    .filter(|kind| *kind != "error")
            })
            .filter(|code| !code.is_empty());
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .filter(|message| !message.is_empty())
            .unwrap_or(fallback);
        ReadError::Provider(ProviderError::Stream {
            provider: self.provider.to_owned(),
            message: match code {
                Some(code) => format!("{code}: {message}"),
                None => message.to_owned(),
            },
            retryable: code.is_some_and(|code| RETRYABLE_CODES.contains(&code)),
        })
    }

    fn malformed(&self, message: String) -> ReadError {
        crate::frame::malformed(&self.provider, message)
    }
}

impl StreamDecoder for ResponsesDecoder {
    fn event(&mut self, event: &SseEvent, emitter: &mut Emitter) -> Result<Decoded, ReadError> {
        self.read(event, emitter)
    }

    fn finish(self) -> Result<ModelOutput, ReadError> {
        self.complete()
    }
}

/// Takes what a function call item knows (the final item overrides what the
/// deltas assembled).
fn update_call(call: &mut PendingCall, item: &Value) {
    if let Some(id) = item.get("id").and_then(Value::as_str) {
        call.item_id = Some(id.to_owned());
    }
    if let Some(call_id) = item.get("call_id").and_then(Value::as_str) {
        call.call_id = call_id.to_owned();
    }
    if let Some(name) = item.get("name").and_then(Value::as_str) {
        call.name = name.to_owned();
    }
    if let Some(arguments) = item.get("arguments").and_then(Value::as_str) {
        // `output_item.added` usually carries "" while the deltas are still
        // to come; only a non-empty value is news.
        if !arguments.is_empty() || call.arguments.is_empty() {
            call.arguments = arguments.to_owned();
        }
    }
}

/// The usage of a response: `input_tokens` (cached ones in
/// `input_tokens_details.cached_tokens`), `output_tokens` (reasoning ones in
/// `output_tokens_details.reasoning_tokens`).
fn usage_of(usage: &Value) -> Option<TokenUsage> {
    if !usage.is_object() {
        return None;
    }
    let count = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    Some(TokenUsage {
        input_tokens: count("/input_tokens"),
        cached_input_tokens: count("/input_tokens_details/cached_tokens"),
        output_tokens: count("/output_tokens"),
        reasoning_tokens: count("/output_tokens_details/reasoning_tokens"),
    })
}

/// The string at `key`, or "".
fn str_at<'v>(value: &'v Value, key: &str) -> &'v str {
    value.get(key).and_then(Value::as_str).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn usage_maps_the_details_and_tolerates_missing_ones() {
        let usage = json!({
            "input_tokens": 120, "input_tokens_details": {"cached_tokens": 100},
            "output_tokens": 40, "output_tokens_details": {"reasoning_tokens": 32}, "total_tokens": 160
        });
        assert_eq!(
            usage_of(&usage),
            Some(TokenUsage {
                input_tokens: 120,
                cached_input_tokens: 100,
                output_tokens: 40,
                reasoning_tokens: 32,
            })
        );
        assert_eq!(
            usage_of(&json!({"input_tokens": 3, "output_tokens": 4})),
            Some(TokenUsage {
                input_tokens: 3,
                output_tokens: 4,
                ..TokenUsage::default()
            })
        );
        assert_eq!(usage_of(&Value::Null), None);
    }
}
