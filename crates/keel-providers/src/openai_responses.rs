//! OpenAI Responses: `POST {base}/responses` with `stream: true`.
//!
//! **Request.** Keel's history becomes `input` items: user messages
//! (`input_text`), assistant messages (`output_text`), `function_call` and
//! `function_call_output` items, and the reasoning items this protocol
//! produced, sent back exactly as the API gave them (reasoning of other
//! providers is skipped). Tools are flat `function` tools.
//!
//! Earlier assistant output goes back in the shape the API produced it:
//! messages with `status` and `annotations`, function calls with `status`,
//! and, for every server but OpenAI's own (which refuses ids of items it did
//! not store), an `id`, as strict implementations (vLLM, Azure) require. A
//! failed tool result, which has no error field here, starts with `Error:`.
//!
//! **Statelessness.** Keel owns the conversation, so every request carries
//! the whole history and sets `store: false`: nothing is kept on OpenAI's
//! side and `previous_response_id` is never used. A reasoning model's
//! reasoning items can then only be sent back if they carry their encrypted
//! content, so the request asks for `include: ["reasoning.encrypted_content"]`.
//! Models without reasoning (`gpt-4.1`, `gpt-4o`) refuse that with a 400
//! ("Encrypted content is not supported with this model"); the adapter then
//! drops `include` for good and sends the request again at once.
//!
//! **Response.** Semantic SSE events, each a JSON object with a `type`:
//! text deltas are forwarded at once, reasoning summary (and reasoning text)
//! deltas as reasoning, function call arguments are assembled per output
//! item, finished reasoning items are kept whole, and `response.completed`
//! (with the usage) ends the response. `response.failed`, `error` events and
//! `response.incomplete` are errors; a body that ends without one of the
//! three terminal events is [`ProviderError::Truncated`].
//!
//! **Incomplete responses.** `response.incomplete` (for example the
//! `max_output_tokens` limit) is reported as an error naming the reason, not
//! as an answer: the text may stop mid-sentence and a function call's
//! arguments mid-object, and running such a call or presenting the text as
//! the final answer would be wrong. The text already streamed stays in the
//! session (the runtime keeps it, marked interrupted). It is not retried:
//! the same request would stop at the same limit.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value, json};

use super::http::{AttemptError, EventStream, HttpClient, Secret, with_retries, within_step_deadline};
use super::sse::SseEvent;
use super::{Emitter, ProviderError, ProviderSettings, ReadError};
use keel_model::{BoxFuture, Model, ModelEventSink, ModelOutput, ModelRequest, ToolCall, ToolSpec};
use keel_protocol::Result;
use keel_protocol::{TokenUsage, TranscriptItem};

/// The `provider` of the reasoning items this adapter keeps; only these are
/// sent back to it.
pub const REASONING_PROVIDER: &str = "openai-responses";

/// Error codes OpenAI documents for a failed response that may pass on
/// their own; anything else would fail the same way again.
const RETRYABLE_CODES: &[&str] = &["server_error", "rate_limit_exceeded"];

/// A model behind the OpenAI Responses API.
#[derive(Debug)]
pub struct OpenAiResponses {
    settings: ProviderSettings,
    http: HttpClient,
    /// Set once the endpoint refused `include: ["reasoning.encrypted_content"]`
    /// (a model without reasoning); later requests leave it out.
    without_encrypted_reasoning: AtomicBool,
}

impl OpenAiResponses {
    /// A client for the model and endpoint in `settings`.
    pub fn new(settings: ProviderSettings) -> Result<Self> {
        let http = HttpClient::new(settings.name.clone(), settings.http.clone())?;
        Ok(Self {
            settings,
            http,
            without_encrypted_reasoning: AtomicBool::new(false),
        })
    }

    /// The request headers: the key as a bearer token, then the configured
    /// extra headers (which may override it, for gateways that want
    /// something else).
    fn headers(&self) -> Vec<(String, Secret)> {
        let mut headers = Vec::with_capacity(self.settings.headers.len() + 1);
        if let Some(key) = &self.settings.api_key {
            headers.push((
                "authorization".to_owned(),
                Secret::new(format!("Bearer {}", key.expose())),
            ));
        }
        headers.extend(self.settings.headers.iter().cloned());
        headers
    }

    /// The JSON body for `request`.
    fn body(&self, request: &ModelRequest<'_>) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(self.settings.model));
        let item_ids = !super::is_openai_itself(&self.settings.base_url);
        body.insert("input".into(), Value::Array(input_items(request.history, item_ids)));
        if let Some(instructions) = request.instructions {
            body.insert("instructions".into(), json!(instructions));
        }
        if !request.tools.is_empty() {
            body.insert("tools".into(), Value::Array(request.tools.iter().map(tool).collect()));
        }
        body.insert("stream".into(), json!(true));
        body.insert("store".into(), json!(false));
        if !self.without_encrypted_reasoning.load(Ordering::Relaxed) {
            body.insert("include".into(), json!(["reasoning.encrypted_content"]));
        }
        if let Some(max) = self.settings.max_output_tokens {
            body.insert("max_output_tokens".into(), json!(max));
        }
        if let Some(temperature) = self.settings.temperature {
            body.insert("temperature".into(), json!(temperature));
        }
        Value::Object(body)
    }

    /// Sends the request and opens its event stream; a refusal of the
    /// encrypted reasoning is answered by sending it again without.
    async fn open(
        &self,
        url: &str,
        headers: &[(String, Secret)],
        request: &ModelRequest<'_>,
    ) -> Result<EventStream, ProviderError> {
        match self.http.post_events(url, headers, &self.body(request)).await {
            Err(error) if refuses_encrypted_reasoning(&error) => {
                tracing::info!(
                    model = %self.settings.model,
                    "the model has no encrypted reasoning; asking without it from now on"
                );
                self.without_encrypted_reasoning.store(true, Ordering::Relaxed);
                self.http.post_events(url, headers, &self.body(request)).await
            }
            result => result,
        }
    }

    /// One try: send, then read the stream to its terminal event.
    async fn attempt(
        &self,
        url: &str,
        headers: &[(String, Secret)],
        request: &ModelRequest<'_>,
        sink: ModelEventSink,
    ) -> Result<ModelOutput, AttemptError> {
        let stream = self
            .open(url, headers, request)
            .await
            .map_err(|error| AttemptError::Provider { error, streamed: false })?;
        let mut emitter = Emitter::new(sink);
        self.read(stream, &mut emitter)
            .await
            .map_err(|error| error.into_attempt(&emitter))
    }

    /// Reads the event stream up to its terminal event.
    async fn read(&self, mut stream: EventStream, emitter: &mut Emitter) -> Result<ModelOutput, ReadError> {
        if let Some(response) = stream.take_complete() {
            stream.replay(events_of_complete(&response));
        }
        let mut response = ResponseReader::new(&self.settings.name);
        loop {
            let outcome = match stream.next().await {
                Ok(Some(event)) => response.read(&event, emitter),
                // Only a terminal event ends a response; a clean end of the
                // body before it lost the rest.
                Ok(None) => Err(ReadError::Provider(ProviderError::Truncated {
                    provider: self.settings.name.clone(),
                })),
                Err(error) => Err(ReadError::Provider(error)),
            };
            match outcome {
                Ok(None) => {}
                Ok(Some(output)) => return Ok(output),
                Err(error) => return Err(error),
            }
        }
    }
}

impl super::ReadStream for OpenAiResponses {
    fn read_stream(
        &self,
        stream: EventStream,
        emitter: &mut Emitter,
    ) -> impl Future<Output = Result<ModelOutput, ReadError>> + Send {
        self.read(stream, emitter)
    }
}

impl Model for OpenAiResponses {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            self.settings.check_context(request.instructions, request.history)?;
            let url = format!("{}/responses", self.settings.base_url);
            let headers = self.headers();
            let attempts = with_retries(&self.settings.http.retry, |_| {
                self.attempt(&url, &headers, &request, events.clone())
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

/// The events a stream would have carried for a complete, non-streamed
/// `response` object (or an error): each output item done, then the
/// terminal event its `status` names.
fn events_of_complete(response: &Value) -> Vec<SseEvent> {
    let event = |data: Value| SseEvent {
        event: None,
        data: data.to_string(),
    };
    if response.get("output").is_none()
        && let Some(error) = response.get("error").filter(|error| error.is_object())
    {
        return vec![event(json!({"type": "error", "error": error}))];
    }
    let items = response.get("output").and_then(Value::as_array).into_iter().flatten();
    let mut events: Vec<SseEvent> = items
        .enumerate()
        .map(|(index, item)| event(json!({"type": "response.output_item.done", "output_index": index, "item": item})))
        .collect();
    let terminal = match response.get("status").and_then(Value::as_str) {
        Some("incomplete") => "response.incomplete",
        Some("failed") => "response.failed",
        _ => "response.completed",
    };
    events.push(event(json!({"type": terminal, "response": response})));
    events
}

/// Whether `error` is the API refusing `include: ["reasoning.encrypted_content"]`
/// because the model does not reason.
fn refuses_encrypted_reasoning(error: &ProviderError) -> bool {
    matches!(error, ProviderError::Status { status: 400, message, .. }
        if message.to_ascii_lowercase().contains("encrypted content is not supported"))
}

/// The history as Responses `input` items.
///
/// Assistant output goes back in the shape the API gave it: messages with
/// `status` and `output_text` parts with `annotations`, function calls with
/// `status`. With `item_ids` (every server but OpenAI's own) they also get
/// an `id`, which strict implementations (vLLM, Azure) require; OpenAI
/// itself refuses ids of items it did not store, and `store` is false.
/// Keel keeps no provider item ids, so they are derived from what is kept:
/// the message's place in the history, the call's id.
fn input_items(history: &[TranscriptItem], item_ids: bool) -> Vec<Value> {
    history
        .iter()
        .enumerate()
        .filter_map(|(position, item)| match item {
            TranscriptItem::UserMessage { text } => Some(json!({
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            })),
            // An empty answer says nothing; the API gains nothing from it.
            TranscriptItem::AssistantMessage { text, .. } if text.is_empty() => None,
            TranscriptItem::AssistantMessage { text, .. } => {
                let mut item = json!({
                    "type": "message",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                });
                if item_ids {
                    item["id"] = json!(format!("msg_keel_{position}"));
                }
                Some(item)
            }
            TranscriptItem::ToolCall {
                call_id,
                name,
                arguments,
            } => {
                let mut item = json!({
                    "type": "function_call",
                    "call_id": call_id,
                    "name": name,
                    "arguments": super::well_formed_arguments(arguments),
                    "status": "completed",
                });
                if item_ids {
                    item["id"] = json!(format!("fc_{}", call_id.trim_start_matches("call_")));
                }
                Some(item)
            }
            TranscriptItem::ToolResult {
                call_id,
                output,
                is_error,
            } => Some(json!({
                "type": "function_call_output",
                "call_id": call_id,
                // The item has no error field; the text carries it.
                "output": super::tool_result_text(output, *is_error),
            })),
            TranscriptItem::Reasoning { provider, data } if provider == REASONING_PROVIDER => Some(data.clone()),
            TranscriptItem::Reasoning { .. } => None,
            // Context from the runtime, not the user's words: the role
            // Responses gives the application's own instructions.
            TranscriptItem::Summary { text } => Some(json!({"type": "message", "role": "developer", "content": text})),
        })
        .collect()
}

/// A tool as a Responses function tool. `strict: false` because without it
/// the API normalises the schema into strict mode, which makes every
/// optional property required; Keel's tools describe their arguments as
/// they are.
fn tool(spec: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "name": spec.name,
        "description": spec.description,
        "parameters": spec.parameters,
        "strict": false,
    })
}

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
struct ResponseReader<'a> {
    provider: &'a str,
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
}

impl<'a> ResponseReader<'a> {
    fn new(provider: &'a str) -> Self {
        Self {
            provider,
            text: String::new(),
            streamed_messages: HashSet::new(),
            anonymous_text: false,
            calls: Vec::new(),
            reasoning: Vec::new(),
            reasoning_part: None,
        }
    }

    /// Reads one event; returns the output once the response completed.
    fn read(&mut self, event: &SseEvent, emitter: &mut Emitter) -> Result<Option<ModelOutput>, ReadError> {
        let data = event.data.trim();
        // Not part of the Responses protocol, but some compatible servers end
        // with it, as Chat Completions does; the terminal event decides.
        if data == "[DONE]" {
            return Ok(None);
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
            "response.completed" => return self.complete(&json).map(Some),
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
        Ok(None)
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
    fn complete(&mut self, json: &Value) -> Result<ModelOutput, ReadError> {
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
        if let Some(usage) = json.pointer("/response/usage").and_then(usage_of) {
            output = output.with_usage(usage);
        }
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
        ReadError::Provider(ProviderError::Malformed {
            provider: self.provider.to_owned(),
            message,
        })
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

    #[test]
    fn only_this_protocols_reasoning_and_non_empty_answers_are_sent() {
        let history = vec![
            TranscriptItem::Reasoning {
                provider: "anthropic".into(),
                data: json!({"type": "thinking"}),
            },
            TranscriptItem::AssistantMessage {
                text: String::new(),
                interrupted: false,
            },
            TranscriptItem::Reasoning {
                provider: REASONING_PROVIDER.into(),
                data: json!({"type": "reasoning", "id": "rs_1", "summary": []}),
            },
        ];
        assert_eq!(
            input_items(&history, true),
            [json!({"type": "reasoning", "id": "rs_1", "summary": []})]
        );
    }

    #[test]
    fn openai_itself_gets_no_item_ids_and_failed_results_say_so() {
        let history = vec![
            TranscriptItem::AssistantMessage {
                text: "Checking.".into(),
                interrupted: false,
            },
            TranscriptItem::ToolCall {
                call_id: "call_a".into(),
                name: "clock".into(),
                arguments: "{}".into(),
            },
            TranscriptItem::ToolResult {
                call_id: "call_a".into(),
                output: "error: no clock".into(),
                is_error: true,
            },
        ];
        assert_eq!(
            input_items(&history, false),
            [
                json!({"type": "message", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]}),
                json!({"type": "function_call", "call_id": "call_a", "name": "clock", "arguments": "{}", "status": "completed"}),
                // Already says it failed: not said twice.
                json!({"type": "function_call_output", "call_id": "call_a", "output": "error: no clock"}),
            ]
        );
        // A call cut mid-arguments goes back as a well-formed call.
        let cut = [TranscriptItem::ToolCall {
            call_id: "call_b".into(),
            name: "clock".into(),
            arguments: "{\"tz\": \"Eur".into(),
        }];
        assert_eq!(input_items(&cut, false)[0]["arguments"], "{}");
    }

    #[test]
    fn only_the_refusal_of_encrypted_reasoning_drops_the_include() {
        let status = |status: u16, message: &str| ProviderError::Status {
            provider: "openai".into(),
            status,
            message: message.into(),
            retry_after: None,
        };
        assert!(refuses_encrypted_reasoning(&status(
            400,
            "invalid_request_error: Encrypted content is not supported with this model."
        )));
        assert!(!refuses_encrypted_reasoning(&status(
            400,
            "invalid_request_error: bad tool"
        )));
        assert!(!refuses_encrypted_reasoning(&status(
            500,
            "Encrypted content is not supported with this model."
        )));
    }
}
