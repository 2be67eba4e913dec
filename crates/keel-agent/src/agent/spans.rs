//! The spans of a session's turns, model steps and tool calls (see
//! `crate::telemetry`), built from what the turn in flight keeps.

use keel_protocol::now_ms;
use keel_store::TurnExecution;

use super::session::{Session, Turn};
use crate::telemetry::{FinishedSpan, SpanEvent, SpanKind, Value, ids_of, new_span_id, usage_attributes};
use keel_model::{Model, ModelOutput, ToolCall};

/// The provider and model of `model`, for spans: the provider its API
/// is (`openai`), else the prefix of its name (`script:a.jsonl` →
/// `script`), else `unknown`; the model is its name after the prefix.
pub(super) fn provider_and_model(model: &dyn Model) -> (String, String) {
    let name = model.name();
    let (prefix, model_name) = match name.split_once(':') {
        Some((prefix, rest)) if !prefix.is_empty() && !rest.is_empty() => (prefix, rest),
        _ => ("unknown", name.as_str()),
    };
    (
        model.provider_name().unwrap_or(prefix).to_owned(),
        model_name.to_owned(),
    )
}

/// The span of a turn that ended at `end_ms`: `error` is why it did not
/// complete (the abort reason), `None` when it did.
pub(super) fn turn_span(
    execution: &TurnExecution,
    session_id: &str,
    bot_id: &str,
    model: &dyn Model,
    error: Option<&str>,
    end_ms: u64,
) -> Option<FinishedSpan> {
    let trace = execution.trace.as_ref()?;
    let (trace_id, span_id, parent) = ids_of(trace)?;
    let (provider, model) = provider_and_model(model);
    let mut attributes = vec![
        ("gen_ai.operation.name", Value::from("invoke_agent")),
        ("gen_ai.agent.name", Value::from(bot_id)),
        ("gen_ai.agent.id", Value::from(bot_id)),
        ("gen_ai.conversation.id", Value::from(session_id)),
        ("gen_ai.provider.name", Value::from(provider)),
        ("gen_ai.request.model", Value::from(model)),
        ("keel.turn.id", Value::from(execution.turn_id.as_str())),
        ("keel.turn.steps", Value::from(u64::from(execution.step))),
    ];
    attributes.extend(usage_attributes(&trace.usage));
    if let Some(reason) = &trace.finish_reason {
        attributes.push(("gen_ai.response.finish_reasons", Value::Strs(vec![reason.clone()])));
    }
    Some(FinishedSpan {
        trace_id,
        span_id,
        parent_span_id: parent,
        parent_is_remote: parent.is_some(),
        name: format!("invoke_agent {bot_id}"),
        kind: SpanKind::Internal,
        start_ms: execution.started_at_ms,
        end_ms: end_ms.max(execution.started_at_ms),
        attributes,
        events: Vec::new(),
        error: error.map(str::to_owned),
    })
}

/// Why a model step stopped, as the GenAI conventions name it.
pub(super) fn finish_reason(output: &ModelOutput) -> &'static str {
    if output.length_limited {
        "length"
    } else if !output.tool_calls.is_empty() {
        "tool_calls"
    } else {
        "stop"
    }
}

impl Session {
    /// Reports the span of a summary (context compaction), started at
    /// `start_ms`: under `turn` when one runs, else a trace of its own.
    pub(super) fn report_summary(
        &self,
        turn: Option<&Turn>,
        start_ms: u64,
        output: Option<&ModelOutput>,
        error: Option<&str>,
    ) {
        if !self.spans.enabled() {
            return;
        }
        let (trace_id, parent) = match turn.and_then(|turn| turn.execution.trace.as_ref()).and_then(ids_of) {
            Some((trace_id, turn_span, _)) => (trace_id, Some(turn_span)),
            None => (crate::telemetry::new_trace_id(), None),
        };
        let extra = vec![("keel.compaction", Value::from("summary"))];
        self.spans
            .record(self.chat_span((trace_id, parent), start_ms, output, error, extra));
    }

    /// Reports the span of model step `step` of `turn`, started at
    /// `start_ms`: its output when it completed, `error` otherwise.
    pub(super) fn report_step(
        &self,
        turn: &Turn,
        step: u32,
        start_ms: u64,
        output: Option<&ModelOutput>,
        error: Option<&str>,
    ) {
        if !self.spans.enabled() {
            return;
        }
        let Some((trace_id, turn_span, _)) = turn.execution.trace.as_ref().and_then(ids_of) else {
            return;
        };
        let extra = vec![("keel.step", Value::from(u64::from(step)))];
        self.spans
            .record(self.chat_span((trace_id, Some(turn_span)), start_ms, output, error, extra));
    }

    /// The span of a model call (a step or a summary) under `(trace,
    /// parent)`, started at `start_ms`, with `extra` attributes.
    fn chat_span(
        &self,
        (trace_id, parent): ([u8; 16], Option<[u8; 8]>),
        start_ms: u64,
        output: Option<&ModelOutput>,
        error: Option<&str>,
        extra: Vec<(&'static str, Value)>,
    ) -> FinishedSpan {
        let (provider, model) = provider_and_model(self.model.as_ref());
        // The model the provider says answered, else the one asked for.
        let answered = output
            .and_then(|output| output.response_model.clone())
            .unwrap_or_else(|| model.clone());
        let mut attributes = vec![
            ("gen_ai.operation.name", Value::from("chat")),
            ("gen_ai.provider.name", Value::from(provider)),
            ("gen_ai.request.model", Value::from(model.clone())),
            ("gen_ai.response.model", Value::from(answered)),
            ("gen_ai.conversation.id", Value::from(self.session_id.as_str())),
        ];
        let parameters = self.model.request_parameters();
        if let Some(max_tokens) = parameters.max_tokens {
            attributes.push(("gen_ai.request.max_tokens", Value::from(u64::from(max_tokens))));
        }
        if let Some(temperature) = parameters.temperature {
            attributes.push(("gen_ai.request.temperature", Value::F64(temperature)));
        }
        if let Some(id) = output.and_then(|output| output.response_id.as_deref()) {
            attributes.push(("gen_ai.response.id", Value::from(id)));
        }
        attributes.extend(extra);
        let mut events = Vec::new();
        if let Some(output) = output {
            if let Some(usage) = &output.usage {
                attributes.extend(usage_attributes(usage));
            }
            if self.spans.content() {
                let message = serde_json::json!([{
                    "role": "assistant",
                    "parts": [{"type": "text", "content": keel_secrets::redact(&output.text)}],
                    "finish_reason": finish_reason(output),
                }]);
                attributes.push(("gen_ai.output.messages", Value::from(message.to_string())));
            }
            attributes.push((
                "gen_ai.response.finish_reasons",
                Value::Strs(vec![finish_reason(output).to_owned()]),
            ));
            if let Some(address) = &output.server_address {
                attributes.push(("server.address", Value::from(address.as_str())));
            }
            events = output
                .retries
                .iter()
                .enumerate()
                .map(|(index, &at_ms)| SpanEvent {
                    name: "gen_ai.request.retry",
                    at_ms,
                    attributes: vec![("keel.retry", Value::from(index as u64 + 1))],
                })
                .collect();
        }
        FinishedSpan {
            trace_id,
            span_id: new_span_id(),
            parent_span_id: parent,
            parent_is_remote: false,
            name: format!("chat {model}"),
            kind: SpanKind::Client,
            start_ms,
            end_ms: now_ms().max(start_ms),
            attributes,
            events,
            error: error.map(str::to_owned),
        }
    }

    /// Reports the span of the tool call `call_id` (`name`) of `turn`,
    /// from when it started (when this runtime saw it start) to now.
    pub(super) fn report_tool(&mut self, turn: &Turn, call: &ToolCall, output: &str, is_error: bool) {
        let (call_id, name) = (call.call_id.as_str(), call.name.as_str());
        let started = self.tool_starts.remove(call_id);
        if !self.spans.enabled() {
            return;
        }
        let Some((trace_id, turn_span, _)) = turn.execution.trace.as_ref().and_then(ids_of) else {
            return;
        };
        let end_ms = now_ms();
        let (start_ms, waited_ms) = started.unwrap_or((end_ms, None));
        let client = self.client_tools.iter().any(|tool| tool.name == name);
        // MCP tools are named `{server}__{tool}`.
        let kind = if !client && name.contains("__") {
            "extension"
        } else {
            "function"
        };
        let mut events = Vec::new();
        if let Some(asked_ms) = waited_ms {
            events.push(SpanEvent {
                name: "keel.approval.requested",
                at_ms: asked_ms,
                attributes: Vec::new(),
            });
        }
        let mut attributes = vec![
            ("gen_ai.operation.name", Value::from("execute_tool")),
            ("gen_ai.tool.name", Value::from(name)),
            ("gen_ai.tool.call.id", Value::from(call_id)),
            ("gen_ai.tool.type", Value::from(kind)),
            ("gen_ai.conversation.id", Value::from(self.session_id.as_str())),
            (
                "keel.tool.executor",
                Value::from(if client { "client" } else { "server" }),
            ),
        ];
        if name == "shell"
            && let Some(policy) = &self.sandbox_policy
        {
            attributes.push(("keel.sandbox.policy", Value::from(policy.as_str())));
        }
        if self.spans.content() {
            // The result was redacted before it was stored; the arguments
            // are redacted here, as the log's are.
            attributes.push((
                "gen_ai.tool.call.arguments",
                Value::from(keel_secrets::redact(&call.arguments).into_owned()),
            ));
            attributes.push(("gen_ai.tool.call.result", Value::from(output)));
        }
        self.spans.record(FinishedSpan {
            trace_id,
            span_id: new_span_id(),
            parent_span_id: Some(turn_span),
            parent_is_remote: false,
            name: format!("execute_tool {name}"),
            kind: SpanKind::Internal,
            start_ms,
            end_ms: end_ms.max(start_ms),
            attributes,
            events,
            error: is_error.then(|| "tool_error".to_owned()),
        });
    }

    /// Reports the span of `turn`, which just ended (`error`: why not
    /// completed).
    pub(super) fn report_turn(&self, turn: &Turn, error: Option<&str>) {
        if !self.spans.enabled() {
            return;
        }
        let span = turn_span(
            &turn.execution,
            &self.session_id,
            &self.checkpoint.session_context.bot_id,
            self.model.as_ref(),
            error,
            now_ms(),
        );
        if let Some(span) = span {
            self.spans.record(span);
        }
    }
}
