//! Durable submissions and the busy policies, through `SessionHandle`: a
//! stored message survives a crash, an idempotency key queues once, and
//! queue / interrupt / reject / steer each do what they say, visibly in the
//! log.

use std::sync::Arc;

use keel::agent::{Accepted, AgentConfig, SessionHandle, SubmitOptions};
use keel::protocol::*;
use keel::store::SqliteCheckpoint;
use keel::{Agent, CheckpointStore, Error};
use tokio::sync::Notify;

use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

const SESSION: &str = "durable";

/// A model whose first `blocked` calls stream "working" and then wait for
/// `release`; later calls answer at once. Each answer names its call index.
fn held_model(blocked: u64, release: Arc<Notify>, entered: Arc<Notify>) -> Arc<TestModel> {
    numbered_model("working ", entered, move |call_index| {
        let release = Arc::clone(&release);
        (call_index < blocked).then(|| Box::pin(async move { release.notified().await }) as _)
    })
}

fn config(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<TestModel>) -> AgentConfig {
    session_config(db, SESSION, store, model)
}

fn options(on_busy: BusyPolicy) -> SubmitOptions {
    SubmitOptions {
        on_busy,
        ..SubmitOptions::default()
    }
}

async fn submit(handle: &SessionHandle, text: &str, on_busy: BusyPolicy) -> keel::Result<Accepted> {
    guard("submit_durable", handle.submit_durable(user(text), options(on_busy))).await
}

/// Starts a turn whose model is held, and waits until it is streaming.
async fn busy_agent(
    db: &TestDb,
    store: &Arc<SqliteCheckpoint>,
    blocked: u64,
) -> (Agent, SessionHandle, Arc<Notify>, Arc<TestModel>) {
    let (release, entered) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let model = held_model(blocked, Arc::clone(&release), Arc::clone(&entered));
    let agent = start_session(config(db, store, model.clone())).await;
    let handle = agent.handle();
    submit(&handle, "first", BusyPolicy::Queue).await.expect("first");
    guard("the model starts", entered.notified()).await;
    (agent, handle, release, model)
}

fn user_messages(events: &[RecordedEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some((message.turn_id.clone(), message.text.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_message_is_stored_before_it_is_accepted_and_settled_when_its_turn_starts() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::chunks(&["hi"]);
    let mut agent = start_with(config(&db, &store, model)).await;
    let handle = agent.handle();
    next(&mut agent).await;
    let accepted = submit(&handle, "hello", BusyPolicy::Queue).await.expect("accepted");
    assert!(!accepted.duplicate);
    let turn = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&turn),
        [
            "submission_queued",
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete"
        ]
    );
    assert_eq!(turn[0].sequence, accepted.sequence);
    assert_eq!(turn[0].submission_id.as_deref(), Some(accepted.submission_id.as_str()));
    let EventMsg::SubmissionQueued(queued) = &turn[0].msg else {
        panic!("{:?}", turn[0].msg)
    };
    assert_eq!(queued.op, user("hello"));
    assert_eq!(queued.on_busy, BusyPolicy::Queue);
    assert_eq!(turn[2].submission_id.as_deref(), Some(accepted.submission_id.as_str()));
    // Taken up, so no longer in the stored queue.
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(state.queued, vec![]);
    assert_eq!(handle.status().last_sequence, turn.last().expect("events").sequence);
    shutdown(agent).await;
}

#[tokio::test]
async fn an_accepted_message_survives_a_crash_and_runs_after_the_restart() {
    let db = TestDb::new();
    let store = db.open();
    let (agent, handle, _release, _model) = busy_agent(&db, &store, 1).await;
    let accepted = submit(&handle, "second", BusyPolicy::Queue).await.expect("accepted");
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(
        state
            .queued
            .iter()
            .map(|queued| (queued.id.as_str(), queued.sequence))
            .collect::<Vec<_>>(),
        [(accepted.submission_id.as_str(), accepted.sequence)]
    );
    // The runtime dies with the first turn in flight and the second queued.
    drop(handle);
    drop(agent);

    let model = TestModel::chunks(&["back"]);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    let events = read_until(&mut agent, |event| event.msg.kind() == "turn_complete").await;
    assert_eq!(
        kinds(&events)[..3],
        ["session_started", "turn_aborted", "turn_started"],
        "{:?}",
        kinds(&events)
    );
    let messages = user_messages(&events);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].1, "second");
    let message = events
        .iter()
        .find(|event| event.msg.kind() == "user_message")
        .expect("message");
    assert_eq!(message.submission_id.as_deref(), Some(accepted.submission_id.as_str()));
    assert_eq!(model.seen()[0].history.last(), Some(&user_item("second")));
    assert_eq!(
        store.load(SESSION).await.expect("load").expect("session").queued,
        vec![]
    );
    // Run once only: a second restart queues nothing.
    shutdown(agent).await;
    let mut again = start_with(config(&db, &store, TestModel::chunks(&["x"]))).await;
    let started = next(&mut again).await;
    assert_eq!(started.msg.kind(), "session_started");
    assert_eq!(again.handle().status().queued, 0);
    shutdown(again).await;
}

#[tokio::test]
async fn an_idempotency_key_queues_once_even_across_a_restart() {
    let db = TestDb::new();
    let store = db.open();
    let (agent, handle, release, _model) = busy_agent(&db, &store, 1).await;
    let keyed = SubmitOptions {
        on_busy: BusyPolicy::Queue,
        idempotency_key: Some("retry-me-1".into()),
        ..SubmitOptions::default()
    };
    let first = handle.submit_durable(user("once"), keyed.clone()).await.expect("first");
    let second = handle
        .submit_durable(user("once"), keyed.clone())
        .await
        .expect("second");
    assert!(!first.duplicate && second.duplicate);
    assert_eq!(
        (&first.submission_id, first.sequence),
        (&second.submission_id, second.sequence)
    );
    let bad = handle
        .submit_durable(
            user("x"),
            SubmitOptions {
                idempotency_key: Some("has space".into()),
                ..SubmitOptions::default()
            },
        )
        .await;
    assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
    release.notify_one();
    let stored = stored_events(&store, SESSION).await;
    assert_eq!(
        stored
            .iter()
            .filter(|event| event.msg.kind() == "submission_queued")
            .count(),
        2,
        "the first message and the keyed one"
    );
    drop(handle);
    shutdown(agent).await;

    let agent = start_with(config(&db, &store, TestModel::chunks(&["x"]))).await;
    let third = agent.handle().submit_durable(user("once"), keyed).await.expect("third");
    assert!(third.duplicate);
    assert_eq!(third.submission_id, first.submission_id);
    shutdown(agent).await;
}

#[tokio::test]
async fn reject_refuses_a_message_while_busy_and_says_so_in_the_log() {
    let db = TestDb::new();
    let store = db.open();
    let (mut agent, handle, release, _model) = busy_agent(&db, &store, 1).await;
    let refused = submit(&handle, "not now", BusyPolicy::Reject).await;
    assert!(matches!(refused, Err(Error::SessionBusy(_))), "{refused:?}");
    release.notify_one();
    let turn = read_turn(&mut agent).await;
    let rejected: Vec<&RecordedEvent> = turn
        .iter()
        .filter(|event| event.msg.kind() == "submission_rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{:?}", kinds(&turn));
    assert_eq!(assistant_text(&turn), "answer 0");
    // Idle, the same policy starts a turn.
    let accepted = submit(&handle, "now", BusyPolicy::Reject).await.expect("idle");
    let turn = read_turn(&mut agent).await;
    assert_eq!(turn[0].sequence, accepted.sequence);
    assert_eq!(user_messages(&turn)[0].1, "now");
    drop(handle);
    shutdown(agent).await;
}

#[tokio::test]
async fn interrupt_aborts_the_running_turn_and_starts_one_with_the_message() {
    let db = TestDb::new();
    let store = db.open();
    let (mut agent, handle, _release, model) = busy_agent(&db, &store, 1).await;
    let accepted = submit(&handle, "change of plan", BusyPolicy::Interrupt)
        .await
        .expect("accepted");
    let first = read_turn(&mut agent).await;
    assert_eq!(abort_of(&first).0, AbortReason::Interrupted);
    let second = read_turn(&mut agent).await;
    assert_eq!(second.last().expect("end").msg.kind(), "turn_complete");
    let messages = user_messages(&second);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].1, "change of plan");
    let queued = first
        .iter()
        .chain(&second)
        .find(|event| event.sequence == accepted.sequence)
        .expect("the queued event");
    assert!(matches!(&queued.msg, EventMsg::SubmissionQueued(q) if q.on_busy == BusyPolicy::Interrupt));
    // The new turn's model saw the interrupted answer and then the message.
    let history = &model.seen()[1].history;
    assert_eq!(history.last(), Some(&user_item("change of plan")));
    drop(handle);
    shutdown(agent).await;
}

#[tokio::test]
async fn steer_joins_the_running_turn_before_its_next_step() {
    let db = TestDb::new();
    let store = db.open();
    let (mut agent, handle, release, model) = busy_agent(&db, &store, 1).await;
    let accepted = submit(&handle, "also mention cats", BusyPolicy::Steer)
        .await
        .expect("accepted");
    release.notify_one();
    let turn = read_turn(&mut agent).await;
    let turn_id = started_turn_id(&turn);
    assert_eq!(turn.last().expect("end").msg.kind(), "turn_complete");
    // One turn, two steps: the model answered, the steered message joined,
    // and the model answered again seeing it.
    let messages = user_messages(&turn);
    assert_eq!(
        messages,
        [
            (turn_id.clone(), "first".to_owned()),
            (turn_id.clone(), "also mention cats".to_owned())
        ]
    );
    let steered = turn
        .iter()
        .find(|event| matches!(&event.msg, EventMsg::UserMessage(m) if m.text == "also mention cats"))
        .expect("steered message");
    assert_eq!(steered.submission_id.as_deref(), Some(accepted.submission_id.as_str()));
    assert_eq!(
        turn.iter()
            .filter(|event| event.msg.kind() == "model_step_started")
            .count(),
        2
    );
    let seen = model.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].history,
        [
            user_item("first"),
            assistant_item("answer 0", false),
            user_item("also mention cats")
        ]
    );
    assert_eq!(
        store.load(SESSION).await.expect("load").expect("session").queued,
        vec![]
    );
    drop(handle);
    shutdown(agent).await;
}

#[tokio::test]
async fn queue_waits_for_the_next_turn_and_a_full_queue_refuses_before_storing() {
    let db = TestDb::new();
    let store = db.open();
    let (release, entered) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let model = held_model(1, Arc::clone(&release), Arc::clone(&entered));
    let mut config = config(&db, &store, model.clone());
    config.submission_capacity = 2;
    let mut agent = start_with(config).await;
    let handle = agent.handle();
    next(&mut agent).await;
    submit(&handle, "first", BusyPolicy::Queue).await.expect("first");
    guard("the model starts", entered.notified()).await;
    submit(&handle, "second", BusyPolicy::Queue).await.expect("second");
    submit(&handle, "third", BusyPolicy::Queue).await.expect("third");
    assert!(handle.status().busy);
    assert_eq!(handle.status().queued, 2);
    let full = submit(&handle, "fourth", BusyPolicy::Queue).await;
    assert!(matches!(full, Err(Error::Busy(_))), "{full:?}");
    release.notify_one();
    let first = read_turn(&mut agent).await;
    let second = read_turn(&mut agent).await;
    assert_eq!(user_messages(&first).len(), 1);
    // Both waiting messages join the next turn.
    let texts: Vec<String> = user_messages(&second).into_iter().map(|(_, text)| text).collect();
    assert_eq!(texts, ["second", "third"]);
    let stored = stored_events(&store, SESSION).await;
    assert!(
        !stored.iter().any(|event| matches!(&event.msg,
            EventMsg::SubmissionQueued(q) if q.op == user("fourth"))),
        "a refused message is not stored"
    );
    assert_eq!(model.seen().len(), 2);
    drop(handle);
    shutdown(agent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_messages_are_each_stored_before_anything_they_cause() {
    // A message is handed to the session before its `submission_queued`
    // commits (so a turn can start in the same commit): what the session
    // records for it must still come after it in the log, and the sequence
    // the caller gets must be that event's.
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::chunks(&["a", "b"]);
    let mut agent = start_with(config(&db, &store, model)).await;
    let handle = agent.handle();
    next(&mut agent).await;
    const MESSAGES: usize = 24;
    let mut senders = tokio::task::JoinSet::new();
    for sender in 0..4 {
        let handle = handle.clone();
        senders.spawn(async move {
            let mut accepted = Vec::new();
            for message in 0..MESSAGES / 4 {
                let text = format!("message {message} of sender {sender}");
                // The queue holds a few at a time: wait for room when full.
                let mut patience = Patience::new("room in the queue", HANG_GUARD);
                loop {
                    match handle.submit_durable(user(&text), options(BusyPolicy::Queue)).await {
                        Ok(done) => break accepted.push(done),
                        Err(Error::Busy(_)) => patience.pause().await,
                        Err(error) => panic!("submit: {error}"),
                    }
                }
            }
            accepted
        });
    }
    // Messages queued while a turn runs may start the next turn together,
    // so read until every message was taken up and its turn completed.
    let reading = async {
        let mut taken_up = 0;
        loop {
            match next(&mut agent).await.msg.kind() {
                "user_message" => taken_up += 1,
                "turn_complete" if taken_up == MESSAGES => break,
                _ => {}
            }
        }
    };
    let (accepted, ()) = tokio::join!(
        async {
            let mut all = Vec::new();
            while let Some(joined) = senders.join_next().await {
                all.extend(joined.expect("sender"));
            }
            all
        },
        guard("every turn", reading)
    );
    assert_eq!(accepted.len(), MESSAGES);

    let events = stored_events(&store, SESSION).await;
    assert_gapless(&events, 1);
    for done in &accepted {
        let theirs: Vec<&RecordedEvent> = events
            .iter()
            .filter(|event| event.submission_id.as_deref() == Some(done.submission_id.as_str()))
            .collect();
        assert_eq!(theirs[0].msg.kind(), "submission_queued", "{theirs:?}");
        assert_eq!(theirs[0].sequence, done.sequence);
        assert_eq!(
            theirs.iter().filter(|event| event.msg.kind() == "user_message").count(),
            1,
            "{theirs:?}"
        );
    }
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(state.queued, vec![], "every message was taken up");
    shutdown(agent).await;
}
