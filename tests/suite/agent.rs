//! The agent runtime end to end: turns, streaming, interrupts, the
//! submission queue, shutdown, resume, failures, saturation, back-pressure
//! and the wire shape of what it records.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::agent::recorder::{EVENT_QUEUE_CAPACITY, RECORDER_COMMAND_CAPACITY, RECORDER_EVENT_BYTE_BUDGET};
use keel::agent::{AgentConfig, ModelEvent, ModelOutput, StreamingOptions};
use keel::agent::{BoxFuture, EventPageRequest};
use keel::protocol::*;
use keel::store::{
    AppendReceipt, Checkpoint, EventPage, KeyedSubmission, SessionListPage, SessionState, SessionSummary,
    SqliteCheckpoint, StoreError, TurnExecution,
};
use keel::{CheckpointStore, Error};
use tokio::sync::Notify;

use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

const SESSION: &str = "session-1";

/// Asserts that every event of a turn belongs to `turn_id` and that those the
/// turn itself caused (all but the user messages) carry `submission_id`.
fn assert_turn_events(events: &[RecordedEvent], turn_id: &str, submission_id: &str) {
    for event in events {
        assert_eq!(event.msg.turn_id(), Some(turn_id), "{event:?} must carry the turn id");
        if !matches!(event.msg, EventMsg::UserMessage(_)) {
            assert_eq!(
                event.submission_id.as_deref(),
                Some(submission_id),
                "{event:?} must carry the turn's submission id"
            );
        }
    }
}

/// The texts and submission ids of the user messages among `events`.
fn user_messages(events: &[RecordedEvent]) -> Vec<(String, Option<String>)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some((message.text.clone(), event.submission_id.clone())),
            _ => None,
        })
        .collect()
}

/// A model whose first call streams `text`, then waits for `release` before
/// answering with it; later calls answer `later` at once.
fn gated_model(release: &Arc<Notify>, text: &'static str, later: &'static str) -> Arc<TestModel> {
    let release = Arc::clone(release);
    TestModel::new(move |call| {
        let release = Arc::clone(&release);
        Box::pin(async move {
            if call.call_index == 0 {
                (call.sink)(ModelEvent::TextDelta(text.to_owned()))?;
                release.notified().await;
                Ok(ModelOutput::text(text))
            } else {
                stream_now(&call.sink, &[later.to_owned()])
            }
        })
    })
}

// 1. A plain turn.

#[tokio::test]
async fn plain_turn_records_every_step_in_order_and_stores_what_it_delivers() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::chunks(&["Hel", "lo, ", "world"]);
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    assert_eq!(agent.session_id(), SESSION);

    let submitted = agent.sender().submit(user("hello")).expect("submit");
    let mut delivered = vec![next(&mut agent).await];
    delivered.extend(read_turn(&mut agent).await);

    assert_eq!(
        kinds(&delivered),
        [
            "session_started",
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_content_delta",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete",
        ]
    );
    assert_gapless(&delivered, 1);

    assert_eq!(delivered[0].submission_id, None);
    assert_eq!(
        delivered[0].msg,
        EventMsg::SessionStarted(SessionStartedEvent {
            session_id: SESSION.to_owned(),
            bot_id: "test-bot".to_owned(),
            resumed: false,
            history_items: 0,
            pending_approvals: vec![],
            sandbox: None,
            tools: vec![],
        })
    );

    let turn_id = started_turn_id(&delivered);
    assert_turn_events(&delivered[1..], &turn_id, &submitted.id);
    assert_eq!(
        user_messages(&delivered),
        [("hello".to_owned(), Some(submitted.id.clone()))]
    );
    assert_eq!(
        delivered[3].msg,
        EventMsg::ModelStepStarted(ModelStepStartedEvent {
            turn_id: turn_id.clone(),
            step: 1,
            message_id: Some(format!("{turn_id}-1")),
        })
    );
    assert_eq!(deltas(&delivered), ["Hel", "lo, ", "world"]);
    assert_eq!(deltas(&delivered).concat(), assistant_text(&delivered));
    assert_eq!(assistant_text(&delivered), "Hello, world");
    assert_eq!(
        delivered[8].msg,
        EventMsg::TurnComplete(TurnCompleteEvent {
            turn_id: turn_id.clone(),
            length_limited: false,
        })
    );

    assert_eq!(
        model.seen(),
        [SeenRequest {
            session_id: SESSION.to_owned(),
            turn_id,
            history: vec![user_item("hello")],
            call_index: 0,
            instructions: None,
            tools: vec![],
        }]
    );

    assert_eq!(stored_events(&store, SESSION).await, delivered);
    shutdown(agent).await;
}

// 2. Coalescing.

/// Runs one turn of a model that streams 1000 one-byte deltas without
/// yielding; returns the recorded deltas and the assistant message.
async fn stream_a_thousand_bytes(streaming: StreamingOptions) -> (Vec<String>, String) {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::new(|call| {
        Box::pin(async move {
            let mut text = String::new();
            for index in 0..1000_u32 {
                let byte = char::from_digit(index % 10, 10).expect("a digit");
                text.push(byte);
                (call.sink)(ModelEvent::TextDelta(byte.to_string()))?;
            }
            Ok(ModelOutput::text(text))
        })
    });
    let mut agent = start_agent(&db, &store, SESSION, model, streaming).await;
    agent.sender().submit(user("stream")).expect("submit");
    let mut delivered = vec![next(&mut agent).await];
    delivered.extend(read_turn(&mut agent).await);
    assert_eq!(delivered.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_gapless(&delivered, 1);
    assert_eq!(stored_events(&store, SESSION).await, delivered);
    shutdown(agent).await;
    let recorded = deltas(&delivered).into_iter().map(str::to_owned).collect();
    (recorded, assistant_text(&delivered).to_owned())
}

#[tokio::test]
async fn coalescing_groups_a_synchronous_burst_and_per_delta_keeps_every_delta() {
    let (coalesced, coalesced_message) = stream_a_thousand_bytes(StreamingOptions::default()).await;
    assert!(
        !coalesced.is_empty() && coalesced.len() < 10,
        "1000 one-byte deltas in one poll must coalesce into a few events, got {}",
        coalesced.len()
    );

    let (each, each_message) = stream_a_thousand_bytes(StreamingOptions::per_delta()).await;
    assert_eq!(each.len(), 1000);
    assert!(each.iter().all(|delta| delta.len() == 1));

    assert_eq!(coalesced_message.len(), 1000);
    assert_eq!(coalesced.concat(), coalesced_message);
    assert_eq!(each.concat(), each_message);
    assert_eq!(coalesced_message, each_message);
}

// 3. Interrupts.

#[tokio::test]
async fn interrupt_mid_stream_keeps_the_streamed_text_drops_the_model_and_closes_its_sink() {
    let db = TestDb::new();
    let store = db.open();
    let slot = SinkSlot::default();
    let dropped = Arc::new(AtomicBool::new(false));
    let model = TestModel::new({
        let (slot, dropped) = (slot.clone(), Arc::clone(&dropped));
        move |call| {
            if call.call_index == 0 {
                *slot.lock().expect("sink slot") = Some(call.sink.clone());
                let flag = DropFlag(Arc::clone(&dropped));
                Box::pin(async move {
                    let _flag = flag;
                    (call.sink)(ModelEvent::TextDelta("partial ".to_owned()))?;
                    (call.sink)(ModelEvent::TextDelta("answer".to_owned()))?;
                    std::future::pending().await
                })
            } else {
                Box::pin(async move { stream_now(&call.sink, &["after".to_owned()]) })
            }
        }
    });
    // Default streaming: the text is recorded when the coalescing window ends.
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::default()).await;
    let mut delivered = vec![next(&mut agent).await];

    let first = agent.sender().submit(user("first")).expect("submit");
    let mut turn = read_until(&mut agent, |event| event.msg.kind() == "model_step_started").await;
    while deltas(&turn).concat() != "partial answer" {
        let event = next(&mut agent).await;
        assert_eq!(event.msg.kind(), "assistant_content_delta", "unexpected {event:?}");
        turn.push(event);
    }
    let turn_id = started_turn_id(&turn);
    assert!(!dropped.load(Ordering::SeqCst), "the model is still running");

    let interrupt = agent
        .sender()
        .submit(Op::Interrupt {
            turn_id: Some(turn_id.clone()),
        })
        .expect("interrupt");
    let end = read_turn(&mut agent).await;
    assert_eq!(kinds(&end), ["turn_aborted"], "no message, no error: {end:?}");
    assert_eq!(end[0].submission_id.as_deref(), Some(interrupt.id.as_str()));
    let EventMsg::TurnAborted(aborted) = &end[0].msg else {
        unreachable!()
    };
    assert_eq!(aborted.turn_id, turn_id);
    assert_eq!(aborted.reason, AbortReason::Interrupted);
    assert!(!aborted.message.is_empty());
    assert_turn_events(&turn[..], &turn_id, &first.id);

    assert!(dropped.load(Ordering::SeqCst), "the model's future was dropped");
    let error = retained(&slot)(ModelEvent::TextDelta("late".to_owned())).expect_err("the sink is closed");
    assert_eq!(error.to_string(), "agent stopped: model event sink closed");

    let second = agent.sender().submit(user("second")).expect("submit");
    let next_turn = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&next_turn),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete",
        ]
    );
    assert_turn_events(&next_turn, &started_turn_id(&next_turn), &second.id);
    assert_eq!(assistant_text(&next_turn), "after");
    let seen = model.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].call_index, 1);
    assert_eq!(
        seen[1].history,
        [
            user_item("first"),
            assistant_item("partial answer", true),
            user_item("second"),
        ]
    );

    delivered.extend(turn);
    delivered.extend(end);
    delivered.extend(next_turn);
    assert_gapless(&delivered, 1);
    assert_eq!(stored_events(&store, SESSION).await, delivered);
    shutdown(agent).await;
}

#[tokio::test]
async fn interrupts_for_another_turn_or_while_idle_are_rejected() {
    let db = TestDb::new();
    let store = db.open();
    let release = Arc::new(Notify::new());
    let model = gated_model(&release, "working", "again");
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    next(&mut agent).await;

    let first = agent.sender().submit(user("first")).expect("submit");
    let turn = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    let turn_id = started_turn_id(&turn);

    let stray = agent
        .sender()
        .submit(Op::Interrupt {
            turn_id: Some("some-other-turn".to_owned()),
        })
        .expect("interrupt");
    let rejected = next(&mut agent).await;
    assert_eq!(rejected.submission_id.as_deref(), Some(stray.id.as_str()));
    let EventMsg::SubmissionRejected(rejection) = &rejected.msg else {
        panic!("expected submission_rejected, got {rejected:?}");
    };
    assert!(rejection.reason.contains("some-other-turn"), "{rejection:?}");

    // The turn goes on and completes normally.
    release.notify_one();
    let rest = read_turn(&mut agent).await;
    assert_eq!(kinds(&rest), ["assistant_message", "turn_complete"]);
    assert_turn_events(&rest, &turn_id, &first.id);
    assert_eq!(assistant_text(&rest), "working");

    // Idle: neither a bare interrupt nor one naming the finished turn does anything.
    let bare = agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("interrupt");
    let stale = agent
        .sender()
        .submit(Op::Interrupt {
            turn_id: Some(turn_id.clone()),
        })
        .expect("interrupt");
    for expected in [&bare, &stale] {
        let event = next(&mut agent).await;
        assert_eq!(event.msg.kind(), "submission_rejected", "{event:?}");
        assert_eq!(event.submission_id.as_deref(), Some(expected.id.as_str()));
    }

    // The session still works.
    agent.sender().submit(user("again")).expect("submit");
    let again = read_turn(&mut agent).await;
    assert_eq!(again.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(assistant_text(&again), "again");
    assert_eq!(model.seen().len(), 2);
    shutdown(agent).await;
}

// 4. Queue semantics.

#[tokio::test]
async fn messages_submitted_during_a_turn_form_the_next_turn() {
    let db = TestDb::new();
    let store = db.open();
    let release = Arc::new(Notify::new());
    let model = gated_model(&release, "one", "two");
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    next(&mut agent).await;

    let a = agent.sender().submit(user("a")).expect("submit");
    let mut first = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    let b = agent.sender().submit(user("b")).expect("submit");
    let c = agent.sender().submit(user("c")).expect("submit");
    release.notify_one();
    first.extend(read_turn(&mut agent).await);
    assert_eq!(first.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(user_messages(&first), [("a".to_owned(), Some(a.id.clone()))]);

    let second = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&second),
        [
            "turn_started",
            "user_message",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete",
        ]
    );
    assert_eq!(
        user_messages(&second),
        [("b".to_owned(), Some(b.id.clone())), ("c".to_owned(), Some(c.id))]
    );
    assert_turn_events(&second, &started_turn_id(&second), &b.id);
    assert_ne!(started_turn_id(&first), started_turn_id(&second));

    let seen = model.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].history,
        [
            user_item("a"),
            assistant_item("one", false),
            user_item("b"),
            user_item("c"),
        ]
    );
    shutdown(agent).await;
}

#[tokio::test]
async fn messages_queued_before_a_turn_starts_all_join_it() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::chunks(&["all three"]);
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    // The test runtime is single-threaded: the session task cannot take
    // anything before this task awaits, so all three are queued first.
    let ids: Vec<String> = ["a", "b", "c"]
        .into_iter()
        .map(|text| agent.sender().submit(user(text)).expect("submit").id)
        .collect();

    let mut delivered = vec![next(&mut agent).await];
    delivered.extend(read_turn(&mut agent).await);
    assert_eq!(
        kinds(&delivered),
        [
            "session_started",
            "turn_started",
            "user_message",
            "user_message",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete",
        ]
    );
    assert_eq!(
        user_messages(&delivered),
        [
            ("a".to_owned(), Some(ids[0].clone())),
            ("b".to_owned(), Some(ids[1].clone())),
            ("c".to_owned(), Some(ids[2].clone())),
        ]
    );
    assert_turn_events(&delivered[1..], &started_turn_id(&delivered), &ids[0]);
    let seen = model.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].history, [user_item("a"), user_item("b"), user_item("c")]);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_full_queue_refuses_with_busy_and_hands_the_op_back() {
    let db = TestDb::new();
    let store = db.open();
    let release = Arc::new(Notify::new());
    let model = gated_model(&release, "one", "more");
    let mut config = AgentConfig::new(SESSION, store.clone() as Arc<dyn CheckpointStore>, model.clone());
    config.workspace = db.workspace().to_path_buf();
    config.submission_capacity = 2;
    config.streaming = StreamingOptions::per_delta();
    let mut agent = start_with(config).await;
    next(&mut agent).await;

    agent.sender().submit(user("a")).expect("submit");
    // Once the model streams, the session has taken "a" off the queue.
    read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    let b = agent.sender().submit(user("b")).expect("room for b");
    let c = agent.sender().submit(user("c")).expect("room for c");
    let handed_back = match agent.sender().submit(user("d")) {
        Err(Error::Busy(op)) => *op,
        other => panic!("expected Busy, got {other:?}"),
    };
    assert_eq!(handed_back, user("d"));

    release.notify_one();
    let first = read_turn(&mut agent).await;
    assert_eq!(first.last().map(|event| event.msg.kind()), Some("turn_complete"));
    let second = read_turn(&mut agent).await;
    assert_eq!(second.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(
        user_messages(&second),
        [("b".to_owned(), Some(b.id)), ("c".to_owned(), Some(c.id))]
    );

    let d = agent.sender().submit(handed_back).expect("room again");
    let third = read_turn(&mut agent).await;
    assert_eq!(third.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(user_messages(&third), [("d".to_owned(), Some(d.id))]);
    assert_eq!(model.seen().len(), 3);
    shutdown(agent).await;
}

// 5. Shutdown.

#[tokio::test]
async fn shutdown_finishes_earlier_work_rejects_later_submissions_and_ends_the_stream() {
    let db = TestDb::new();
    let store = db.open();
    let release = Arc::new(Notify::new());
    let model = gated_model(&release, "one", "two");
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;

    agent.sender().submit(user("a")).expect("submit");
    let mut delivered = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    let b = agent.sender().submit(user("b")).expect("submit");
    let shutdown_op = agent.sender().submit(Op::Shutdown).expect("submit");
    let late = agent.sender().submit(user("late")).expect("still queued");
    release.notify_one();
    delivered.extend(read_to_end(&mut agent).await);

    let turns: Vec<&RecordedEvent> = delivered.iter().filter(|event| event.msg.ends_turn()).collect();
    assert_eq!(turns.len(), 2, "both turns queued before the shutdown ran");
    assert!(turns.iter().all(|event| event.msg.kind() == "turn_complete"));
    let second_turn_start = delivered
        .iter()
        .rposition(|event| event.msg.kind() == "turn_started")
        .expect("second turn");
    assert_eq!(
        user_messages(&delivered[second_turn_start..]),
        [("b".to_owned(), Some(b.id))]
    );

    let tail = &delivered[delivered.len() - 3..];
    assert_eq!(
        kinds(tail),
        ["turn_complete", "submission_rejected", "shutdown_complete"]
    );
    assert_eq!(tail[1].submission_id.as_deref(), Some(late.id.as_str()));
    assert_eq!(tail[2].submission_id.as_deref(), Some(shutdown_op.id.as_str()));
    assert_eq!(model.seen().len(), 2, "the late message never reached the model");

    assert!(matches!(agent.sender().submit(user("after")), Err(Error::Stopped(_))));
    assert_gapless(&delivered, 1);
    assert_eq!(stored_events(&store, SESSION).await, delivered);
    shutdown(agent).await;
}

#[tokio::test]
async fn agent_shutdown_runs_queued_work_and_returns_ok() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::chunks(&["done"]);
    let agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::default()).await;
    agent.sender().submit(user("a")).expect("submit");
    agent.sender().submit(user("b")).expect("submit");
    shutdown(agent).await;

    let stored = stored_events(&store, SESSION).await;
    assert_eq!(
        kinds(&stored),
        [
            "session_started",
            "turn_started",
            "user_message",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete",
            "shutdown_complete",
        ]
    );
    assert_gapless(&stored, 1);
    assert_eq!(model.seen().len(), 1);
}

#[tokio::test]
async fn shutdown_ends_the_stream_even_if_the_model_kept_its_sink() {
    let db = TestDb::new();
    let store = db.open();
    let slot = SinkSlot::default();
    let model = TestModel::new({
        let slot = slot.clone();
        move |call| {
            *slot.lock().expect("sink slot") = Some(call.sink.clone());
            Box::pin(async move { stream_now(&call.sink, &["kept".to_owned()]) })
        }
    });
    let mut agent = start_agent(&db, &store, SESSION, model, StreamingOptions::default()).await;
    agent.sender().submit(user("a")).expect("submit");
    let shutdown_op = agent.sender().submit(Op::Shutdown).expect("submit");
    let delivered = read_to_end(&mut agent).await;
    let last = delivered.last().expect("events");
    assert_eq!(last.msg.kind(), "shutdown_complete");
    assert_eq!(last.submission_id.as_deref(), Some(shutdown_op.id.as_str()));
    let error = retained(&slot)(ModelEvent::TextDelta("late".to_owned())).expect_err("closed");
    assert_eq!(error.to_string(), "agent stopped: model event sink closed");
    shutdown(agent).await;
}

// 6. Resume.

#[tokio::test]
async fn reopening_a_session_closes_the_turn_left_in_flight_and_restores_history() {
    let db = TestDb::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let crashed = TestModel::new({
        let dropped = Arc::clone(&dropped);
        move |call| {
            let flag = DropFlag(Arc::clone(&dropped));
            Box::pin(async move {
                let _flag = flag;
                (call.sink)(ModelEvent::TextDelta("partial".to_owned()))?;
                std::future::pending().await
            })
        }
    });

    // First run: the model blocks mid-turn, then the agent is dropped.
    let store = db.open();
    let mut agent = start_agent(&db, &store, SESSION, crashed, StreamingOptions::per_delta()).await;
    let first = agent.sender().submit(user("first")).expect("submit");
    let first_run = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    let old_turn = started_turn_id(&first_run);
    drop(agent);
    wait_for_flag("the dropped agent's model future is dropped", &dropped).await;
    drop(store);

    // Second run, as a new process: a new store on the same file.
    let store = db.open();
    let model = TestModel::chunks(&["resumed"]);
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    let mut second_run = vec![next(&mut agent).await, next(&mut agent).await];
    assert_eq!(
        second_run[0].msg,
        EventMsg::SessionStarted(SessionStartedEvent {
            session_id: SESSION.to_owned(),
            bot_id: "test-bot".to_owned(),
            resumed: true,
            history_items: 1,
            pending_approvals: vec![],
            sandbox: None,
            tools: vec![],
        })
    );
    assert_eq!(second_run[0].sequence, first_run.last().expect("events").sequence + 1);
    assert_eq!(second_run[1].submission_id.as_deref(), Some(first.id.as_str()));
    let EventMsg::TurnAborted(aborted) = &second_run[1].msg else {
        panic!("expected turn_aborted, got {:?}", second_run[1]);
    };
    assert_eq!(aborted.turn_id, old_turn);
    assert_eq!(aborted.reason, AbortReason::RuntimeStopped);

    let second = agent.sender().submit(user("second")).expect("submit");
    let turn = read_turn(&mut agent).await;
    assert_eq!(turn.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_turn_events(&turn, &started_turn_id(&turn), &second.id);
    assert_ne!(started_turn_id(&turn), old_turn);
    second_run.extend(turn);
    let seen = model.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].call_index, 1, "the call count survives the restart");
    assert_eq!(seen[0].history[0], user_item("first"));
    assert_eq!(seen[0].history.last(), Some(&user_item("second")));

    agent.sender().submit(Op::Shutdown).expect("shutdown");
    second_run.extend(read_to_end(&mut agent).await);
    assert_eq!(
        second_run.last().map(|event| event.msg.kind()),
        Some("shutdown_complete")
    );

    let all: Vec<RecordedEvent> = first_run.into_iter().chain(second_run).collect();
    assert_gapless(&all, 1);
    assert_eq!(stored_events(&store, SESSION).await, all);
}

/// Text streamed before a crash was seen by the user: on resume it joins
/// the history as a cut assistant message, so the next request carries it.
/// A step that completed before the crash (text and a call) is not repeated.
#[tokio::test]
async fn a_crash_mid_stream_keeps_the_streamed_text_in_the_history_on_resume() {
    let db = TestDb::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let crashed = TestModel::new({
        let dropped = Arc::clone(&dropped);
        move |call| {
            let flag = DropFlag(Arc::clone(&dropped));
            Box::pin(async move {
                let _flag = flag;
                (call.sink)(ModelEvent::TextDelta("partial ".to_owned()))?;
                (call.sink)(ModelEvent::TextDelta("answer".to_owned()))?;
                std::future::pending().await
            })
        }
    });
    let store = db.open();
    let mut agent = start_agent(&db, &store, SESSION, crashed, StreamingOptions::per_delta()).await;
    agent.sender().submit(user("first")).expect("submit");
    let mut first_run = read_until(&mut agent, |event| event.msg.kind() == "assistant_content_delta").await;
    while deltas(&first_run).concat() != "partial answer" {
        first_run.push(next(&mut agent).await);
    }
    drop(agent);
    wait_for_flag("the dropped agent's model future is dropped", &dropped).await;
    drop(store);

    let store = db.open();
    let model = TestModel::chunks(&["resumed"]);
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    let reopened = vec![next(&mut agent).await, next(&mut agent).await];
    assert_eq!(kinds(&reopened), ["session_started", "turn_aborted"]);
    agent.sender().submit(user("second")).expect("submit");
    read_turn(&mut agent).await;
    let seen = model.seen();
    assert_eq!(
        seen[0].history,
        [
            user_item("first"),
            assistant_item("partial answer", true),
            user_item("second"),
        ],
        "the next request carries what the user saw, marked cut"
    );
    shutdown(agent).await;
    // The history is durable: a third runtime sees it too, once.
    drop(store);
    let store = db.open();
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(
        state.transcript,
        [
            user_item("first"),
            assistant_item("partial answer", true),
            user_item("second"),
            assistant_item("resumed", false),
        ]
    );
}

// 7. Model failures.

#[tokio::test]
async fn a_failing_model_aborts_the_turn_with_an_error_and_the_session_goes_on() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::new(|call| {
        Box::pin(async move {
            if call.call_index == 0 {
                (call.sink)(ModelEvent::TextDelta("par".to_owned()))?;
                Err(Error::Model("upstream unavailable".to_owned()))
            } else {
                stream_now(&call.sink, &["fine".to_owned()])
            }
        })
    });
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    next(&mut agent).await;

    let first = agent.sender().submit(user("first")).expect("submit");
    let failed = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&failed),
        [
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "error",
            "turn_aborted",
        ]
    );
    let turn_id = started_turn_id(&failed);
    assert_turn_events(&failed, &turn_id, &first.id);
    assert_eq!(
        failed[4].msg,
        EventMsg::Error(ErrorEvent {
            turn_id: Some(turn_id.clone()),
            message: "model failed: upstream unavailable".to_owned(),
        })
    );
    assert_eq!(
        failed[5].msg,
        EventMsg::TurnAborted(TurnAbortedEvent {
            turn_id,
            reason: AbortReason::ModelFailed,
            message: "model failed: upstream unavailable".to_owned(),
        })
    );

    agent.sender().submit(user("second")).expect("submit");
    let next_turn = read_turn(&mut agent).await;
    assert_eq!(next_turn.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(
        model.seen()[1].history,
        [user_item("first"), assistant_item("par", true), user_item("second"),]
    );
    shutdown(agent).await;
}

#[tokio::test]
async fn a_panicking_model_is_caught_like_a_failure_and_the_session_goes_on() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::new(|call| match call.call_index {
        0 => Box::pin(async { panic!("model exploded in its future") }),
        1 => panic!("model exploded in respond"),
        _ => Box::pin(async move { stream_now(&call.sink, &["survived".to_owned()]) }),
    });
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    next(&mut agent).await;

    for (text, expected) in [
        ("one", "the model panicked: model exploded in its future"),
        ("two", "the model panicked: model exploded in respond"),
    ] {
        let submitted = agent.sender().submit(user(text)).expect("submit");
        let turn = read_turn(&mut agent).await;
        assert_eq!(
            kinds(&turn),
            [
                "turn_started",
                "user_message",
                "model_step_started",
                "error",
                "turn_aborted"
            ]
        );
        let turn_id = started_turn_id(&turn);
        assert_turn_events(&turn, &turn_id, &submitted.id);
        assert_eq!(
            turn[3].msg,
            EventMsg::Error(ErrorEvent {
                turn_id: Some(turn_id.clone()),
                message: expected.to_owned(),
            })
        );
        assert_eq!(abort_of(&turn), (AbortReason::ModelFailed, expected.to_owned()));
    }

    agent.sender().submit(user("three")).expect("submit");
    let turn = read_turn(&mut agent).await;
    assert_eq!(turn.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(assistant_text(&turn), "survived");
    let seen = model.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[2].call_index, 2);
    assert_eq!(
        seen[2].history,
        [user_item("one"), user_item("two"), user_item("three")]
    );
    shutdown(agent).await;
}

// 8. Saturation.

/// What a bursting model managed to stream before the sink refused.
#[derive(Debug, Default)]
struct Burst {
    accepted: Vec<String>,
    refusal: Option<String>,
}

/// A model whose first call pushes `count` deltas of `size` bytes in one
/// poll, stopping at the first refusal; later calls answer "recovered".
fn bursting_model(burst: &Arc<Mutex<Burst>>, count: usize, size: usize) -> Arc<TestModel> {
    let burst = Arc::clone(burst);
    TestModel::new(move |call| {
        let burst = Arc::clone(&burst);
        Box::pin(async move {
            if call.call_index > 0 {
                return stream_now(&call.sink, &["recovered".to_owned()]);
            }
            for index in 0..count {
                let delta = char::from(b'a' + (index % 26) as u8).to_string().repeat(size);
                match (call.sink)(ModelEvent::TextDelta(delta.clone())) {
                    Ok(()) => burst.lock().expect("burst").accepted.push(delta),
                    Err(error) => {
                        burst.lock().expect("burst").refusal = Some(error.to_string());
                        return Err(error);
                    }
                }
            }
            Ok(ModelOutput::text("never"))
        })
    })
}

/// Runs a burst that overflows the recorder, checks how the turn ended and
/// that the session keeps working; returns how many deltas were accepted.
async fn saturate(count: usize, size: usize) -> usize {
    let db = TestDb::new();
    let store = db.open();
    let burst = Arc::new(Mutex::new(Burst::default()));
    let model = bursting_model(&burst, count, size);
    let mut agent = start_agent(&db, &store, SESSION, model.clone(), StreamingOptions::per_delta()).await;
    let mut delivered = vec![next(&mut agent).await];

    let first = agent.sender().submit(user("burst")).expect("submit");
    let turn = read_turn(&mut agent).await;
    let (accepted, refusal) = {
        let burst = burst.lock().expect("burst");
        (burst.accepted.clone(), burst.refusal.clone())
    };
    assert_eq!(refusal.as_deref(), Some("agent stopped: event recorder queue is full"));
    assert!(!accepted.is_empty() && accepted.len() < count);

    let turn_id = started_turn_id(&turn);
    assert_turn_events(&turn, &turn_id, &first.id);
    let n = accepted.len();
    assert_eq!(turn.len(), n + 5, "{:?}", kinds(&turn));
    assert_eq!(
        kinds(&turn[..3]),
        ["turn_started", "user_message", "model_step_started"]
    );
    assert_eq!(kinds(&turn[n + 3..]), ["error", "turn_aborted"]);
    assert!(deltas(&turn) == accepted, "every accepted delta is delivered, in order");
    let EventMsg::Error(error) = &turn[n + 3].msg else {
        unreachable!()
    };
    assert!(error.message.contains("event recorder queue is full"), "{error:?}");
    assert_eq!(abort_of(&turn), (AbortReason::RecorderSaturated, error.message.clone()));

    agent.sender().submit(user("after")).expect("submit");
    let after = read_turn(&mut agent).await;
    assert_eq!(after.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(assistant_text(&after), "recovered");
    let seen = model.seen();
    assert_eq!(seen.len(), 2);
    // Compared without printing: the texts are megabytes long.
    let history = &seen[1].history;
    assert!(
        history.len() == 3
            && history[0] == user_item("burst")
            && history[1] == assistant_item(&accepted.concat(), true)
            && history[2] == user_item("after"),
        "the history must hold exactly the recorded text, not the refused delta"
    );

    delivered.extend(turn);
    delivered.extend(after);
    assert_gapless(&delivered, 1);
    assert!(
        stored_events(&store, SESSION).await == delivered,
        "the store holds what was delivered"
    );
    shutdown(agent).await;
    n
}

#[tokio::test]
async fn a_burst_past_the_byte_budget_ends_the_turn_as_saturated() {
    let size = 64 * 1024;
    let accepted = saturate(2 * RECORDER_EVENT_BYTE_BUDGET / size, size).await;
    assert!(
        accepted * size <= RECORDER_EVENT_BYTE_BUDGET,
        "{accepted} deltas of {size} bytes cannot fit in the budget"
    );
    assert!(accepted * size > RECORDER_EVENT_BYTE_BUDGET / 2);
}

#[tokio::test]
async fn a_burst_past_the_command_capacity_ends_the_turn_as_saturated() {
    let accepted = saturate(4 * RECORDER_COMMAND_CAPACITY, 1).await;
    assert!(accepted <= RECORDER_COMMAND_CAPACITY);
    assert!(accepted > RECORDER_COMMAND_CAPACITY / 2);
}

// 9. Back-pressure.

/// Streams `delta` forever (yielding between deltas) to a consumer that
/// does not read, checks that the model stops being polled, then reads and
/// checks that streaming resumes and nothing was lost.
async fn back_pressure(streaming: StreamingOptions, delta: &'static str) {
    let db = TestDb::new();
    let store = db.open();
    let calls = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let model = TestModel::new({
        let (calls, accepted) = (Arc::clone(&calls), Arc::clone(&accepted));
        move |call| {
            let (calls, accepted) = (Arc::clone(&calls), Arc::clone(&accepted));
            Box::pin(async move {
                loop {
                    calls.fetch_add(1, Ordering::SeqCst);
                    (call.sink)(ModelEvent::TextDelta(delta.to_owned()))?;
                    accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                }
            })
        }
    });
    let mut agent = start_agent(&db, &store, SESSION, model, streaming).await;
    let first = agent.sender().submit(user("stream forever")).expect("submit");

    // Nobody reads. On this single-threaded runtime a model that can be
    // polled gains at least one call between two observations, so an
    // unchanged count means the turn loop stopped polling it. It must stop
    // well before the recorder's command queue could overflow.
    let plateau = guard("the model stops being polled", async {
        let (mut last, mut unchanged) = (0, 0);
        loop {
            // Kept: proving the model is no longer polled takes a window in which nothing may change.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let now = calls.load(Ordering::SeqCst);
            if now == last && now > 0 {
                unchanged += 1;
                if unchanged == 25 {
                    break now;
                }
            } else {
                (last, unchanged) = (now, 0);
            }
        }
    })
    .await;
    assert!(
        plateau <= 2 * RECORDER_COMMAND_CAPACITY + EVENT_QUEUE_CAPACITY,
        "the model was polled {plateau} times without a reader"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), plateau, "no delta was refused");

    // Reading again lets the model go on.
    let mut delivered = Vec::new();
    while calls.load(Ordering::SeqCst) < plateau + RECORDER_COMMAND_CAPACITY {
        delivered.push(next(&mut agent).await);
    }
    let turn_id = started_turn_id(&delivered);
    let interrupt = agent
        .sender()
        .submit(Op::Interrupt {
            turn_id: Some(turn_id.clone()),
        })
        .expect("interrupt");
    delivered.extend(read_turn(&mut agent).await);

    let (turn, end) = delivered[1..].split_at(delivered.len() - 2);
    assert_turn_events(turn, &turn_id, &first.id);
    assert_eq!(end[0].submission_id.as_deref(), Some(interrupt.id.as_str()));
    assert_eq!(abort_of(end).0, AbortReason::Interrupted);
    assert!(!kinds(turn).contains(&"error"));
    let recorded = deltas(turn);
    assert!(recorded.iter().all(|recorded| *recorded == delta));
    assert_eq!(
        recorded.len(),
        accepted.load(Ordering::SeqCst),
        "every accepted delta is recorded"
    );
    assert_gapless(&delivered, 1);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_consumer_that_does_not_read_stops_the_model_until_it_reads_again() {
    back_pressure(StreamingOptions::per_delta(), "x").await;
}

#[tokio::test]
async fn back_pressure_also_holds_for_deltas_that_fill_the_coalescing_buffer_at_once() {
    // Each delta reaches `coalesce_bytes` by itself, so it is recorded as it
    // arrives and no coalescing window ever starts.
    static CHUNK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| "y".repeat(16 * 1024));
    back_pressure(StreamingOptions::default(), CHUNK.as_str()).await;
}

// 10. Wire shape.

#[test]
fn recorded_events_serialize_to_the_documented_shape() {
    let delta = RecordedEvent {
        sequence: 7,
        recorded_at_ms: 1_764_430_000_000,
        event: Event {
            submission_id: Some("sub-1".to_owned()),
            msg: EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                turn_id: "turn-1".to_owned(),
                delta: "Hel".to_owned(),
            }),
        },
    };
    let json = serde_json::to_string(&delta).expect("serialize");
    assert_eq!(
        json,
        r#"{"sequence":7,"recorded_at_ms":1764430000000,"submission_id":"sub-1","msg":{"type":"assistant_content_delta","turn_id":"turn-1","delta":"Hel"}}"#
    );
    assert_eq!(serde_json::from_str::<RecordedEvent>(&json).expect("parse"), delta);

    let started = RecordedEvent {
        sequence: 1,
        recorded_at_ms: 5,
        event: Event {
            submission_id: None,
            msg: EventMsg::ShutdownComplete(ShutdownCompleteEvent {}),
        },
    };
    let json = serde_json::to_string(&started).expect("serialize");
    assert_eq!(
        json,
        r#"{"sequence":1,"recorded_at_ms":5,"submission_id":null,"msg":{"type":"shutdown_complete"}}"#
    );
    assert_eq!(serde_json::from_str::<RecordedEvent>(&json).expect("parse"), started);
}

#[test]
fn every_event_kind_is_its_wire_type() {
    let turn_id = || "turn-1".to_owned();
    let all = [
        EventMsg::SessionStarted(SessionStartedEvent {
            session_id: "s".to_owned(),
            bot_id: "b".to_owned(),
            resumed: false,
            history_items: 0,
            pending_approvals: vec![],
            sandbox: None,
            tools: vec![],
        }),
        EventMsg::TurnStarted(TurnStartedEvent {
            turn_id: turn_id(),
            trace_id: None,
        }),
        EventMsg::UserMessage(UserMessageEvent {
            turn_id: turn_id(),
            text: "hi".to_owned(),
        }),
        EventMsg::ModelStepStarted(ModelStepStartedEvent {
            turn_id: turn_id(),
            step: 1,
            message_id: Some("m-1".to_owned()),
        }),
        EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
            turn_id: turn_id(),
            delta: "d".to_owned(),
        }),
        EventMsg::AssistantMessage(AssistantMessageEvent {
            turn_id: turn_id(),
            text: "t".to_owned(),
            message_id: None,
        }),
        EventMsg::TurnComplete(TurnCompleteEvent {
            turn_id: turn_id(),
            length_limited: false,
        }),
        EventMsg::TurnAborted(TurnAbortedEvent {
            turn_id: turn_id(),
            reason: AbortReason::RecorderSaturated,
            message: "m".to_owned(),
        }),
        EventMsg::Warning(WarningEvent {
            message: "w".to_owned(),
        }),
        EventMsg::Error(ErrorEvent {
            turn_id: None,
            message: "e".to_owned(),
        }),
        EventMsg::SubmissionRejected(SubmissionRejectedEvent {
            reason: "r".to_owned(),
            idempotency_key: None,
        }),
        EventMsg::ShutdownComplete(ShutdownCompleteEvent {}),
        EventMsg::ToolCallProgress(ToolCallProgressEvent {
            turn_id: turn_id(),
            call_id: "c".to_owned(),
            progress: 2.0,
            total: Some(4.0),
            message: None,
        }),
        EventMsg::ToolsChanged(ToolsChangedEvent {
            turn_id: turn_id(),
            tools: vec!["a".to_owned()],
            added: vec!["a".to_owned()],
            removed: vec![],
        }),
        EventMsg::ClientToolRequested(ClientToolRequestedEvent {
            turn_id: turn_id(),
            call_id: "c".to_owned(),
            name: "pick_color".to_owned(),
            arguments: "{}".to_owned(),
            expires_at_ms: Some(9),
        }),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for msg in &all {
        let value = serde_json::to_value(msg).expect("serialize");
        assert_eq!(value["type"], msg.kind(), "{msg:?}");
        assert_eq!(&serde_json::from_value::<EventMsg>(value).expect("parse"), msg);
        assert!(seen.insert(msg.kind()), "duplicate kind {}", msg.kind());
    }
    assert_eq!(seen.len(), 15);

    for (reason, wire) in [
        (AbortReason::Interrupted, "interrupted"),
        (AbortReason::RuntimeStopped, "runtime_stopped"),
        (AbortReason::ModelFailed, "model_failed"),
        (AbortReason::RecorderSaturated, "recorder_saturated"),
    ] {
        assert_eq!(serde_json::to_value(reason).expect("serialize"), wire);
    }
}

#[test]
fn ops_round_trip_through_their_json() {
    for (op, json) in [
        (user("hi"), r#"{"type":"user_input","text":"hi"}"#),
        (Op::Interrupt { turn_id: None }, r#"{"type":"interrupt"}"#),
        (
            Op::Interrupt {
                turn_id: Some("turn-1".to_owned()),
            },
            r#"{"type":"interrupt","turn_id":"turn-1"}"#,
        ),
        (Op::Shutdown, r#"{"type":"shutdown"}"#),
    ] {
        assert_eq!(serde_json::to_string(&op).expect("serialize"), json);
        assert_eq!(serde_json::from_str::<Op>(json).expect("parse"), op);
    }
    assert!(serde_json::from_str::<Op>(r#"{"type":"launch"}"#).is_err());
}

#[tokio::test]
async fn delivered_events_have_exactly_the_documented_fields() {
    let db = TestDb::new();
    let store = db.open();
    let mut agent = start_agent(
        &db,
        &store,
        SESSION,
        TestModel::chunks(&["ok"]),
        StreamingOptions::default(),
    )
    .await;
    let submitted = agent.sender().submit(user("hi")).expect("submit");
    agent.sender().submit(Op::Shutdown).expect("submit");
    let delivered = read_to_end(&mut agent).await;
    assert_eq!(
        delivered.last().map(|event| event.msg.kind()),
        Some("shutdown_complete")
    );
    for event in &delivered {
        let value = serde_json::to_value(event).expect("serialize");
        let object = value.as_object().expect("an object");
        let keys: Vec<&str> = object.keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 4, "{value}");
        for key in ["sequence", "recorded_at_ms", "submission_id", "msg"] {
            assert!(object.contains_key(key), "{key} missing in {value}");
        }
        assert_eq!(value["sequence"], event.sequence);
        assert_eq!(value["msg"]["type"], event.msg.kind());
        assert!(value["recorded_at_ms"].as_u64().expect("a number") > 0);
        match event.msg.kind() {
            "session_started" => assert!(value["submission_id"].is_null()),
            "shutdown_complete" => assert!(value["submission_id"].is_string()),
            _ => assert_eq!(value["submission_id"], submitted.id.as_str()),
        }
        assert_eq!(&serde_json::from_value::<RecordedEvent>(value).expect("parse"), event);
    }
}

// 11. A store that fails mid-write.

/// A store that works until `fail_after` appends went through, then fails
/// every append as a full disk would; reads go to the real store.
struct FailingStore {
    inner: Arc<SqliteCheckpoint>,
    appends: AtomicUsize,
    fail_after: usize,
}

impl CheckpointStore for FailingStore {
    fn save<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        transcript_delta: &'a [TranscriptItem],
        execution: Option<&'a TurnExecution>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.save(checkpoint, transcript_delta, execution)
    }

    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>> {
        self.inner.load(session_id)
    }

    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: Arc<keel::store::OpenBatch>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        if self.appends.fetch_add(1, Ordering::SeqCst) >= self.fail_after {
            return Box::pin(async { Err(StoreError::Full("injected: no space left on device".into())) });
        }
        self.inner.append_open(session_id, batch)
    }

    fn acquire<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.acquire(session_id)
    }

    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>> {
        self.inner.event_page(session_id, request)
    }

    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: keel_store::SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        self.inner.list_sessions_page(cursor, limit, filter)
    }

    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>> {
        self.inner.session_summary(session_id)
    }

    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>> {
        self.inner.events_after(session_id, after_sequence, limit)
    }

    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>> {
        self.inner.keyed_submission(session_id, idempotency_key)
    }

    fn low_on_space(&self) -> Option<String> {
        self.inner.low_on_space()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        CheckpointStore::close(self.inner.as_ref())
    }

    fn create<'a>(
        &'a self,
        checkpoint: &'a keel::store::Checkpoint,
        history: &'a [keel::protocol::TranscriptItem],
        events: Vec<keel::store::EncodedEvent>,
    ) -> BoxFuture<'a, Result<keel::store::AppendReceipt, StoreError>> {
        self.inner.create(checkpoint, history, events)
    }

    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<keel::protocol::TranscriptItem>>, StoreError>> {
        self.inner.history_until(session_id, at_sequence)
    }

    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.sessions_with_work(after, limit)
    }

    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: keel::store::SessionEdit<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.edit_session(session_id, edit)
    }
}

#[tokio::test]
async fn a_store_failing_mid_turn_stops_the_session_with_a_typed_error_and_keeps_a_resumable_prefix() {
    let db = TestDb::new();
    let store = db.open();
    // Slow chunks, so that the turn spans several recorder batches and the
    // failure lands in the middle of it.
    let model = TestModel::new(|call| {
        Box::pin(async move {
            for chunk in ["one ", "two ", "three ", "four "] {
                // Kept: the model's pace is the point, so that the turn spans several recorder batches.
                tokio::time::sleep(Duration::from_millis(20)).await;
                (call.sink)(ModelEvent::TextDelta(chunk.to_owned()))?;
            }
            Ok(ModelOutput::text("one two three four "))
        })
    });
    let failing = Arc::new(FailingStore {
        inner: Arc::clone(&store),
        appends: AtomicUsize::new(0),
        fail_after: 3,
    });
    let mut config = AgentConfig::new(SESSION, failing.clone() as Arc<dyn CheckpointStore>, model.clone());
    config.streaming = StreamingOptions::per_delta();
    let mut agent = start_with(config).await;
    agent.sender().submit(user("hello")).expect("submit");

    let delivered = read_to_end(&mut agent).await;
    let error = guard("shutdown", agent.shutdown())
        .await
        .expect_err("the session failed");
    assert!(error.to_string().contains("no space left on device"), "{error}");
    assert!(
        matches!(error, Error::Stopped(_) | Error::Checkpoint(StoreError::Full(_))),
        "{error:?}"
    );

    // What was delivered is exactly what is stored: a gap-free prefix.
    let stored = stored_events(&store, SESSION).await;
    assert_eq!(stored, delivered);
    assert_gapless(&stored, 1);
    assert!(
        !stored.iter().any(|event| event.msg.ends_turn()),
        "the failed turn was not closed: {:?}",
        kinds(&stored)
    );

    // A runtime with a working store resumes the session and closes the turn.
    let mut agent = start_agent(&db, &store, SESSION, model, StreamingOptions::per_delta()).await;
    let reopened = read_until(&mut agent, |event| event.msg.ends_turn()).await;
    assert_eq!(reopened[0].sequence, stored.len() as u64 + 1);
    assert_eq!(abort_of(&reopened).0, AbortReason::RuntimeStopped);
    shutdown(agent).await;
}

// 12. Two runtimes, one session.

#[tokio::test]
async fn opening_a_session_elsewhere_fences_off_the_runtime_that_held_it() {
    let db = TestDb::new();
    let store = db.open();
    let mut first = start_agent(
        &db,
        &store,
        SESSION,
        TestModel::chunks(&["from first"]),
        StreamingOptions::default(),
    )
    .await;
    first.sender().submit(user("one")).expect("submit");
    read_turn(&mut first).await;

    // Another runtime (another process, as far as the store knows) opens it.
    let other_store = db.open();
    let mut second = start_agent(
        &db,
        &other_store,
        SESSION,
        TestModel::chunks(&["from second"]),
        StreamingOptions::default(),
    )
    .await;

    // The first runtime can no longer write: its next turn stops it.
    first.sender().submit(user("two")).expect("submit");
    let rest = read_to_end(&mut first).await;
    assert!(rest.is_empty(), "nothing more is delivered: {:?}", kinds(&rest));
    let error = guard("shutdown", first.shutdown()).await.expect_err("fenced");
    assert!(error.to_string().contains("taken over by another runtime"), "{error}");

    // The second one works, and the log holds nothing of the fenced turn.
    second.sender().submit(user("three")).expect("submit");
    let turn = read_turn(&mut second).await;
    assert_eq!(assistant_text(&turn), "from second");
    shutdown(second).await;
    let log = stored_events(&other_store, SESSION).await;
    assert_gapless(&log, 1);
    let users: Vec<String> = user_messages(&log).into_iter().map(|(text, _)| text).collect();
    assert_eq!(users, ["one", "three"]);
}
