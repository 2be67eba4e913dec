//! Property tests of the recorder and the coalescing sink: for random
//! sequences of streamed deltas and whole events, over a real SQLite store,
//! what is delivered is exactly what is stored, in order and gap-free, and
//! the coalesced deltas carry the same text as the deltas streamed.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::recorder::{EventRecorder, RecorderOptions, send_event, try_send_event};
use super::stream::{StepStream, StreamingOptions};
use keel_model::ModelEvent;
use keel_protocol::{Event, EventMsg, RecordedEvent, WarningEvent};
use keel_store::{Checkpoint, CheckpointStore, SqliteCheckpoint};

/// What the test does next.
#[derive(Debug, Clone)]
enum Action {
    /// Streams a piece of assistant text.
    Text(String),
    /// Streams a piece of reasoning.
    Reasoning(String),
    /// Records the pending text (a window passed), then a whole event.
    Event(u16),
    /// Records the pending text, as the turn loop does when a window passes.
    Flush,
    /// Waits for the recorder to catch up.
    Yield,
}

fn action() -> impl Strategy<Value = Action> {
    // Short pieces, multi-byte characters and characters JSON escapes.
    let text = "[a-zé🌍\"\\\n ]{0,12}";
    prop_oneof![
        4 => text.prop_map(Action::Text),
        2 => text.prop_map(Action::Reasoning),
        1 => any::<u16>().prop_map(Action::Event),
        1 => Just(Action::Flush),
        1 => Just(Action::Yield),
    ]
}

/// A run of the log as a reader sees it: text of one kind, or a whole
/// event. Adjacent runs of the same kind are one run.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Run {
    Content(String),
    Reasoning(String),
    Warning(String),
}

fn push_run(runs: &mut Vec<Run>, run: Run) {
    match (runs.last_mut(), run) {
        (_, Run::Content(text) | Run::Reasoning(text)) if text.is_empty() => {}
        (Some(Run::Content(last)), Run::Content(text)) | (Some(Run::Reasoning(last)), Run::Reasoning(text)) => {
            last.push_str(&text);
        }
        (_, run) => runs.push(run),
    }
}

fn warning(number: u16) -> Event {
    Event {
        submission_id: Some(format!("sub-{number}")),
        msg: EventMsg::Warning(WarningEvent {
            message: format!("event {number}"),
        }),
    }
}

fn runs_of(events: &[RecordedEvent]) -> Vec<Run> {
    let mut runs = Vec::new();
    for event in events {
        let run = match &event.msg {
            EventMsg::AssistantContentDelta(delta) => Run::Content(delta.delta.clone()),
            EventMsg::ReasoningDelta(delta) => Run::Reasoning(delta.delta.clone()),
            EventMsg::Warning(warning) => Run::Warning(warning.message.clone()),
            other => panic!("an unexpected event {other:?}"),
        };
        push_run(&mut runs, run);
    }
    runs
}

async fn scenario(actions: Vec<Action>, coalesce_bytes: usize, max_batch: usize) -> Result<(), TestCaseError> {
    let directory = tempfile::tempdir().map_err(|error| TestCaseError::fail(error.to_string()))?;
    let store = Arc::new(
        SqliteCheckpoint::new(directory.path().join("db.sqlite3"))
            .map_err(|error| TestCaseError::fail(error.to_string()))?,
    );
    store
        .save(&Checkpoint::empty("s"), &[], None)
        .await
        .map_err(|error| TestCaseError::fail(error.to_string()))?;
    let options = RecorderOptions { max_batch, lease: None };
    let (recorder, mut delivered) = EventRecorder::spawn_with(store.clone(), "s".to_owned(), options);
    let streaming = StreamingOptions {
        // Only size, kind changes and flushes record text: no timing.
        coalesce_window: Duration::from_secs(3600),
        coalesce_bytes,
    };
    let stream = StepStream::new(recorder.clone(), "t".to_owned(), None, streaming);
    let sink = stream.sink();
    let mut expected = Vec::new();
    for action in actions {
        match action {
            Action::Text(text) => {
                sink(ModelEvent::TextDelta(text.clone())).map_err(|error| TestCaseError::fail(error.to_string()))?;
                push_run(&mut expected, Run::Content(text));
            }
            Action::Reasoning(text) => {
                sink(ModelEvent::ReasoningDelta(text.clone()))
                    .map_err(|error| TestCaseError::fail(error.to_string()))?;
                push_run(&mut expected, Run::Reasoning(text));
            }
            Action::Event(number) => {
                stream.flush().map_err(|error| TestCaseError::fail(error.to_string()))?;
                try_send_event(&recorder, warning(number)).map_err(|error| TestCaseError::fail(error.to_string()))?;
                push_run(&mut expected, Run::Warning(format!("event {number}")));
            }
            Action::Flush => stream.flush().map_err(|error| TestCaseError::fail(error.to_string()))?,
            Action::Yield => tokio::task::yield_now().await,
        }
    }
    let closed = stream.close();
    if let Some(pending) = closed.pending {
        send_event(&recorder, pending)
            .await
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
    }
    recorder
        .flush()
        .await
        .map_err(|error| TestCaseError::fail(error.to_string()))?;
    let mut received = Vec::new();
    while let Ok(event) = delivered.try_recv() {
        received.push(event);
    }
    let stored = store
        .events_after("s", 0, keel_store::MAX_EVENT_PAGE)
        .await
        .map_err(|error| TestCaseError::fail(error.to_string()))?;
    prop_assert_eq!(&received, &stored, "delivered events are the stored ones");
    for (index, event) in received.iter().enumerate() {
        prop_assert_eq!(event.sequence, index as u64 + 1, "sequences start at 1, without gaps");
    }
    prop_assert_eq!(recorder.last_sequence(), received.len() as u64);
    prop_assert_eq!(runs_of(&received), expected, "the coalesced text is the streamed text");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn delivered_events_are_the_stored_ones_and_deltas_keep_their_text(
        actions in proptest::collection::vec(action(), 0..60),
        coalesce_bytes in prop_oneof![Just(0usize), 1usize..48, Just(1 << 20)],
        max_batch in prop_oneof![Just(1usize), 2usize..8, Just(1024)],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| TestCaseError::fail(error.to_string()))?;
        runtime.block_on(scenario(actions, coalesce_bytes, max_batch))?;
    }
}
