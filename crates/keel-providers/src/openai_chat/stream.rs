//! Decoding a Chat Completions stream: chunks up to `data: [DONE]`, text
//! and reasoning streamed at once, tool calls assembled from their pieces.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use crate::ProviderError;
use crate::frame::{Decoded, Emitter, ReadError, StreamDecoder, truncated};
use crate::http::message_of;
use crate::sse::SseEvent;
use keel_model::{ModelOutput, ToolCall};
use keel_protocol::{TokenUsage, new_id};

/// The state of one streamed Chat Completions response.
pub struct ChatDecoder {
    provider: String,
    response: Response,
}

impl ChatDecoder {
    /// A decoder for a response of `provider`.
    pub(super) fn new(provider: &str) -> Self {
        Self {
            provider: provider.to_owned(),
            response: Response::default(),
        }
    }

    /// The provider's error, if `chunk` is one: OpenAI's `{"error": {...}}`,
    /// vLLM's `{"object": "error", "message": ...}`, or an `error` event.
    fn stream_error(&self, chunk: &Value, event: Option<&str>) -> Option<ProviderError> {
        let has_error = chunk.get("error").is_some_and(|error| !error.is_null())
            || chunk.get("object").and_then(Value::as_str) == Some("error")
            || event == Some("error");
        if !has_error {
            return None;
        }
        let error = chunk.get("error").unwrap_or(chunk);
        Some(ProviderError::Stream {
            provider: self.provider.clone(),
            message: message_of(chunk).unwrap_or_else(|| "the provider reported an error".to_owned()),
            retryable: is_passing(error),
        })
    }

    fn malformed(&self, error: &serde_json::Error) -> ReadError {
        crate::frame::malformed(
            &self.provider,
            format!("a chunk is not valid JSON of the expected shape: {error}"),
        )
    }
}

impl StreamDecoder for ChatDecoder {
    fn event(&mut self, event: &SseEvent, emitter: &mut Emitter) -> Result<Decoded, ReadError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(Decoded::Done);
        }
        let chunk: Value = serde_json::from_str(data).map_err(|error| self.malformed(&error))?;
        if let Some(error) = self.stream_error(&chunk, event.event.as_deref()) {
            return Err(error.into());
        }
        let chunk: Chunk = serde_json::from_value(chunk).map_err(|error| self.malformed(&error))?;
        self.response.apply(chunk, emitter)?;
        Ok(Decoded::More)
    }

    fn finish(self) -> Result<ModelOutput, ReadError> {
        // OpenAI ends every choice with a finish reason. A `[DONE]` without
        // one means generation stopped early: llama.cpp's server, for one,
        // reports a failure mid-stream as an `error:` line (not `data:`),
        // which an event-stream reader skips, and then sends `[DONE]`.
        if !self.response.finished {
            return Err(truncated(&self.provider).into());
        }
        Ok(self.response.output())
    }

    /// The connection broke off mid-body: for the turn that is the same
    /// thing as a response that stopped before `[DONE]`.
    fn read_failed(&self, error: ProviderError) -> ProviderError {
        match error {
            ProviderError::Connection { message, .. } => {
                tracing::debug!(provider = %self.provider, %message, "the response body broke off");
                truncated(&self.provider)
            }
            error => error,
        }
    }
}

/// Whether a stream error names a passing condition (overload, rate limit,
/// server trouble), by its type or code.
fn is_passing(error: &Value) -> bool {
    const PASSING: [&str; 7] = [
        "server_error",
        "internal_error",
        "rate_limit_exceeded",
        "rate_limit_error",
        "overloaded",
        "overloaded_error",
        "service_unavailable",
    ];
    ["type", "code"].iter().any(|field| match error.get(field) {
        Some(Value::String(kind)) => PASSING.contains(&kind.as_str()),
        Some(Value::Number(code)) => code
            .as_u64()
            .is_some_and(|code| code == 408 || code == 429 || code >= 500),
        _ => false,
    })
}

/// One `chat.completion.chunk`. Only what is used; unknown fields pass, and
/// `null` counts as absent.
#[derive(Debug, Deserialize)]
struct Chunk {
    /// The completion's id (`chatcmpl-…`), the same in every chunk.
    #[serde(default)]
    id: Option<String>,
    /// The model that answers, as the server names it.
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    /// Servers disagree on the type of the reasoning fields beyond strings,
    /// so anything else is ignored rather than refused.
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct CompletionTokensDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl From<Usage> for TokenUsage {
    fn from(usage: Usage) -> Self {
        TokenUsage {
            input_tokens: usage.prompt_tokens.unwrap_or(0),
            cached_input_tokens: usage
                .prompt_tokens_details
                .and_then(|details| details.cached_tokens)
                .unwrap_or(0),
            output_tokens: usage.completion_tokens.unwrap_or(0),
            reasoning_tokens: usage
                .completion_tokens_details
                .and_then(|details| details.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

/// The response as assembled so far.
#[derive(Default)]
struct Response {
    text: String,
    calls: Vec<PartialCall>,
    /// Where each wire `index` currently points in `calls`.
    by_index: HashMap<u64, usize>,
    usage: Option<TokenUsage>,
    finished: bool,
    /// The finish reason was `length`: the output limit cut the response.
    length_limited: bool,
    /// The completion's id and model, from the first chunk that names them.
    id: Option<String>,
    model: Option<String>,
}

/// A tool call whose pieces are still arriving.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

impl Response {
    fn apply(&mut self, chunk: Chunk, emitter: &mut Emitter) -> Result<(), keel_protocol::Error> {
        crate::frame::keep_first(&mut self.id, chunk.id);
        crate::frame::keep_first(&mut self.model, chunk.model);
        if let Some(usage) = chunk.usage {
            self.usage = Some(usage.into());
        }
        // One choice was asked for (`n` is not set); others are not ours.
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta {
                self.apply_delta(delta, emitter)?;
            }
            if let Some(reason) = choice.finish_reason {
                self.finished = true;
                self.length_limited = reason == "length";
            }
        }
        Ok(())
    }

    fn apply_delta(&mut self, delta: Delta, emitter: &mut Emitter) -> Result<(), keel_protocol::Error> {
        // Some servers send both names for the same reasoning; take one.
        let reasoning = [&delta.reasoning_content, &delta.reasoning]
            .into_iter()
            .find_map(|field| field.as_ref().and_then(Value::as_str).filter(|text| !text.is_empty()));
        if let Some(reasoning) = reasoning {
            emitter.reasoning(reasoning)?;
        }
        // A refusal is the model's answer in place of content.
        for text in [delta.content, delta.refusal].into_iter().flatten() {
            emitter.text(&text)?;
            self.text.push_str(&text);
        }
        for call in delta.tool_calls.unwrap_or_default() {
            self.apply_call(call);
        }
        Ok(())
    }

    /// Adds a piece of a tool call to the call its `index` names. A piece
    /// with another id than the call at that index starts a new call (some
    /// servers number every complete call 0); a piece without an index
    /// continues the last call unless its id is new.
    fn apply_call(&mut self, piece: ToolCallDelta) {
        let id = piece.id.filter(|id| !id.is_empty());
        let continues = |call: &PartialCall| id.as_ref().is_none_or(|id| call.id.is_empty() || *id == call.id);
        let current = match piece.index {
            Some(index) => self.by_index.get(&index).copied(),
            None => self.calls.len().checked_sub(1),
        };
        let position = match current {
            Some(position) if continues(&self.calls[position]) => position,
            _ => {
                self.calls.push(PartialCall::default());
                self.calls.len() - 1
            }
        };
        if let Some(index) = piece.index {
            self.by_index.insert(index, position);
        }
        let call = &mut self.calls[position];
        if let Some(id) = id {
            call.id = id;
        }
        if let Some(function) = piece.function {
            // The name comes whole in one piece; some servers repeat it.
            if let Some(name) = function.name.filter(|name| *name != call.name) {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn output(self) -> ModelOutput {
        let calls = self
            .calls
            .into_iter()
            .map(|call| ToolCall {
                // Results refer to calls by id, so a call needs one even when
                // the server gave none.
                call_id: if call.id.is_empty() {
                    format!("call_{}", new_id())
                } else {
                    call.id
                },
                name: call.name,
                // A call without arguments takes the empty object.
                arguments: if call.arguments.trim().is_empty() {
                    "{}".to_owned()
                } else {
                    call.arguments
                },
            })
            .collect();
        let mut output = ModelOutput::text(self.text).with_tool_calls(calls);
        if self.length_limited {
            output = output.cut_at_length_limit();
        }
        output.response_id = self.id;
        output.response_model = self.model;
        match self.usage {
            Some(usage) => output.with_usage(usage),
            None => output,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn piece(index: Option<u64>, id: Option<&str>, name: Option<&str>, arguments: &str) -> ToolCallDelta {
        ToolCallDelta {
            index,
            id: id.map(str::to_owned),
            function: Some(FunctionDelta {
                name: name.map(str::to_owned),
                arguments: Some(arguments.to_owned()),
            }),
        }
    }

    #[test]
    fn tool_call_pieces_are_assembled_by_index_or_by_id() {
        let mut response = Response::default();
        response.apply_call(piece(Some(0), Some("a"), Some("f"), "{\"x\""));
        response.apply_call(piece(Some(1), Some("b"), Some("g"), ""));
        response.apply_call(piece(Some(0), None, None, ": 1}"));
        // A server repeating id and name on every piece.
        response.apply_call(piece(Some(1), Some("b"), Some("g"), "{}"));
        // A server numbering every complete call 0.
        response.apply_call(piece(Some(0), Some("c"), Some("h"), "{\"y\": 2}"));
        // No index at all: continues the last call, or starts one with a new id.
        response.apply_call(piece(None, Some("d"), Some("k"), "{\"z\""));
        response.apply_call(piece(None, None, None, ": 3}"));
        // A name in two pieces.
        response.apply_call(piece(None, None, Some("ey"), ""));
        let calls = response.output().tool_calls;
        let got: Vec<(&str, &str, &str)> = calls
            .iter()
            .map(|call| (call.call_id.as_str(), call.name.as_str(), call.arguments.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("a", "f", "{\"x\": 1}"),
                ("b", "g", "{}"),
                ("c", "h", "{\"y\": 2}"),
                ("d", "key", "{\"z\": 3}"),
            ]
        );
    }

    #[test]
    fn a_call_without_id_or_arguments_gets_both() {
        let mut response = Response::default();
        response.apply_call(piece(Some(0), None, Some("clock"), ""));
        let calls = response.output().tool_calls;
        assert_eq!(calls.len(), 1);
        assert!(calls[0].call_id.starts_with("call_"), "{:?}", calls[0]);
        assert_eq!(calls[0].arguments, "{}");
    }

    #[test]
    fn passing_stream_errors_are_told_by_type_or_code() {
        assert!(is_passing(&json!({"type": "server_error", "message": "x"})));
        assert!(is_passing(&json!({"code": "rate_limit_exceeded"})));
        assert!(is_passing(&json!({"code": 503, "message": "x"})));
        assert!(!is_passing(
            &json!({"type": "invalid_request_error", "code": "context_length_exceeded"})
        ));
        assert!(!is_passing(&json!({"message": "x"})));
    }
}
