//! Picking things out of a list of recorded events: kinds, texts, results,
//! and the shape of the sequence numbers.

use keel::protocol::AbortReason;
use keel::{EventMsg, RecordedEvent};

/// The `type` tags of `events`, in order.
pub(crate) fn kinds(events: &[RecordedEvent]) -> Vec<&'static str> {
    events.iter().map(|event| event.msg.kind()).collect()
}

/// `(call_id, output, is_error)` of each `tool_call_completed` among `events`.
pub(crate) fn tool_results(events: &[RecordedEvent]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((done.call_id.clone(), done.output.clone(), done.is_error)),
            _ => None,
        })
        .collect()
}

/// The assistant content deltas among `events`.
pub(crate) fn deltas(events: &[RecordedEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantContentDelta(delta) => Some(delta.delta.as_str()),
            _ => None,
        })
        .collect()
}

/// The text of the first `assistant_message` among `events`.
pub(crate) fn assistant_text(events: &[RecordedEvent]) -> &str {
    events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .expect("an assistant_message event")
}

/// The id of the turn started among `events`.
pub(crate) fn started_turn_id(events: &[RecordedEvent]) -> String {
    events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some(started.turn_id.clone()),
            _ => None,
        })
        .expect("a turn_started event")
}

/// The texts of the `user_message` events among `events`, in order.
pub(crate) fn user_messages(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some(message.text.clone()),
            _ => None,
        })
        .collect()
}

/// The texts of the `assistant_message` events among `events`, in order.
pub(crate) fn answers(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.clone()),
            _ => None,
        })
        .collect()
}

/// The reason and message of the `turn_aborted` event among `events`.
pub(crate) fn abort_of(events: &[RecordedEvent]) -> (AbortReason, String) {
    events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnAborted(aborted) => Some((aborted.reason, aborted.message.clone())),
            _ => None,
        })
        .expect("a turn_aborted event")
}

/// Asserts that the sequences of `events` are exactly `first..first + len`.
pub(crate) fn assert_gapless(events: &[RecordedEvent], first: u64) {
    let sequences: Vec<u64> = events.iter().map(|event| event.sequence).collect();
    let expected: Vec<u64> = (first..first + events.len() as u64).collect();
    assert_eq!(sequences, expected, "sequences must be consecutive from {first}");
}

/// The sequences of `events`.
pub(crate) fn sequences(events: &[RecordedEvent]) -> Vec<u64> {
    events.iter().map(|event| event.sequence).collect()
}

/// Whether `event` ends a turn.
pub(crate) fn ends_turn(event: &RecordedEvent) -> bool {
    event.msg.ends_turn()
}
