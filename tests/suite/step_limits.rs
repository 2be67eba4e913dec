//! A model step that produces more than a step may hold: the turn ends with
//! an `error` event and `turn_aborted` (`model_failed`), nothing oversized
//! joins the log or the history, and the session goes on with its next turn.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use keel::agent::{BoxFuture, ModelEvent, ModelEventSink, ModelOutput, ModelRequest, StreamingOptions, ToolCall};
use keel::protocol::{AbortReason, TranscriptItem};
use keel::store::CheckpointStore;
use keel::{EventMsg, Model, RecordedEvent};

use crate::suite::support::agent::{read_turn, shutdown, start_agent, user};
use crate::suite::support::store::TestDb;

const MIB: usize = 1024 * 1024;

/// Answers by its call index: 0, one tool call with 10 MiB of arguments;
/// 1, 16 MiB of text in 64 KiB deltas (twice the recorder's byte budget,
/// so its message could never be recorded), then the same text as its
/// answer; then short text. Remembers how much text the sink took and the
/// largest history item it was sent.
#[derive(Default)]
struct OversizedModel {
    accepted_text: AtomicUsize,
    largest_history_item: Mutex<usize>,
}

impl Model for OversizedModel {
    fn respond<'a>(
        &'a self,
        request: ModelRequest<'a>,
        sink: ModelEventSink,
    ) -> BoxFuture<'a, keel::Result<ModelOutput>> {
        Box::pin(async move {
            let largest = request
                .history
                .iter()
                .map(|item| serde_json::to_string(item).map(|json| json.len()).unwrap_or(0))
                .max()
                .unwrap_or(0);
            {
                let mut seen = self.largest_history_item.lock().expect("lock");
                *seen = (*seen).max(largest);
            }
            match request.call_index {
                0 => {
                    let content = "x".repeat(10 * MIB);
                    let arguments = serde_json::json!({"path": "big.txt", "content": content}).to_string();
                    Ok(ModelOutput::default().with_tool_calls(vec![ToolCall {
                        call_id: "huge".to_owned(),
                        name: "write_file".to_owned(),
                        arguments,
                    }]))
                }
                1 => {
                    let chunk = "y".repeat(64 * 1024);
                    for _ in 0..256 {
                        if sink(ModelEvent::TextDelta(chunk.clone())).is_err() {
                            break;
                        }
                        self.accepted_text.fetch_add(chunk.len(), Ordering::SeqCst);
                        tokio::task::yield_now().await;
                    }
                    Ok(ModelOutput::text("y".repeat(self.accepted_text.load(Ordering::SeqCst))))
                }
                _ => Ok(ModelOutput::text("fine")),
            }
        })
    }
}

fn aborts(events: &[RecordedEvent]) -> Vec<AbortReason> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TurnAborted(aborted) => Some(aborted.reason),
            _ => None,
        })
        .collect()
}

fn errors(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::Error(error) => Some(error.message.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_over_the_byte_budget_aborts_its_turn_and_the_session_goes_on() {
    let db = TestDb::new();
    let store = db.open();
    let model = Arc::new(OversizedModel::default());
    let mut agent = start_agent(&db, &store, "big", model.clone(), StreamingOptions::default()).await;
    crate::suite::support::agent::next(&mut agent).await; // session_started

    // A tool call with 10 MiB of arguments: not run, not recorded.
    agent
        .sender()
        .submit_wait(user("write a big file"))
        .await
        .expect("submit");
    let first = read_turn(&mut agent).await;
    assert_eq!(aborts(&first), [AbortReason::ModelFailed], "{:?}", errors(&first));
    let messages = errors(&first);
    assert_eq!(messages.len(), 1);
    assert!(messages[0].contains("bytes"), "{messages:?}");
    assert!(!first.iter().any(|event| event.msg.kind() == "tool_call_started"));
    assert!(!db.workspace().join("big.txt").exists());

    // 16 MiB of streamed text: streamed (and back-pressured) as deltas,
    // but the step's answer is too large to record and its text stays out
    // of the history.
    agent.sender().submit_wait(user("talk a lot")).await.expect("submit");
    let second = read_turn(&mut agent).await;
    assert_eq!(aborts(&second), [AbortReason::ModelFailed], "{:?}", errors(&second));
    assert_eq!(model.accepted_text.load(Ordering::SeqCst), 16 * MIB);
    assert!(!second.iter().any(|event| event.msg.kind() == "assistant_message"));

    // The session is alive and its history well formed and small.
    agent.sender().submit_wait(user("again")).await.expect("submit");
    let third = read_turn(&mut agent).await;
    assert_eq!(third.last().map(|event| event.msg.kind()), Some("turn_complete"));
    let largest = *model.largest_history_item.lock().expect("lock");
    assert!(largest < MIB, "a history item of {largest} bytes");
    shutdown(agent).await;

    let state = store.load("big").await.expect("load").expect("session");
    assert!(state.execution.is_none(), "no turn is left in flight");
    assert!(
        !state
            .transcript
            .iter()
            .any(|item| matches!(item, TranscriptItem::ToolCall { call_id, .. } if call_id == "huge")),
        "the oversized call is not in the history"
    );
}
