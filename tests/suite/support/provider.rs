//! Helpers shared by the provider adapters' tests.

use std::sync::{Arc, Mutex};

use keel::agent::{ModelEvent, ModelEventSink, ModelOutput, ModelRequest, StreamingOptions};
use keel::protocol::TokenUsage;
use keel::store::SqliteCheckpoint;
use keel::tools::ToolSet;
use keel::{Agent, EventMsg, Model, RecordedEvent};

use super::agent::{session_config, start_session};
use super::store::TestDb;
use super::wait::guard;

/// Calls `model` once with `request`, directly; returns its result and
/// everything it streamed into the sink.
pub(crate) async fn call_model(
    model: &dyn Model,
    request: ModelRequest<'_>,
) -> (keel::Result<ModelOutput>, Vec<ModelEvent>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink: ModelEventSink = {
        let seen = Arc::clone(&seen);
        Arc::new(move |event| {
            seen.lock().expect("events").push(event);
            Ok(())
        })
    };
    let result = guard("Model::respond", model.respond(request, sink)).await;
    let events = seen.lock().expect("events").clone();
    (result, events)
}

/// The text deltas among `events`.
pub(crate) fn text_deltas(events: &[ModelEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|event| match event {
            ModelEvent::TextDelta(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The messages of the `error` events among `events`.
pub(crate) fn error_messages(events: &[RecordedEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::Error(error) => Some(error.message.as_str()),
            _ => None,
        })
        .collect()
}

/// The `token_usage` events among `events`: (step, usage, session total).
pub(crate) fn token_usages(events: &[RecordedEvent]) -> Vec<(u32, TokenUsage, TokenUsage)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TokenUsage(usage) => Some((usage.step, usage.usage, usage.session_total)),
            _ => None,
        })
        .collect()
}

/// An agent for `session` on `model` with the built-in tools, per-delta
/// streaming and `instructions`; its `session_started` is already read.
pub(crate) async fn provider_agent(
    db: &TestDb,
    store: &Arc<SqliteCheckpoint>,
    session: &str,
    model: Arc<dyn Model>,
    instructions: &str,
) -> Agent {
    let mut config = session_config(db, session, store, model);
    config.tools = ToolSet::builtin();
    config.instructions = Some(instructions.to_owned());
    config.streaming = StreamingOptions::per_delta();
    start_session(config).await
}

/// A token usage without reasoning tokens, as most providers report it.
pub(crate) fn usage(input: u64, cached: u64, output: u64) -> TokenUsage {
    TokenUsage {
        input_tokens: input,
        cached_input_tokens: cached,
        output_tokens: output,
        reasoning_tokens: 0,
    }
}
