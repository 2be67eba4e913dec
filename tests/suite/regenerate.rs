//! Regenerating the last answer: the `regenerate` op rolls the last turn
//! back by an event (its items leave the history, its events stay in the
//! log) and runs its user messages again, durably and atomically; and the
//! turn ends that forks start from are batch boundaries.

use std::sync::Arc;

use keel::agent::{AgentConfig, ModelOutput, SubmitOptions, ToolCall};
use keel::protocol::*;
use keel::store::SqliteCheckpoint;
use keel::{Agent, CheckpointStore};
use tokio::sync::Notify;

use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

const SESSION: &str = "regenerate";

/// A model that answers `answer N` (N its call index), except that call
/// `hang_at` streams a little and then never answers.
fn numbered(hang_at: Option<u64>, entered: Arc<Notify>) -> Arc<TestModel> {
    numbered_model("thinking", entered, move |call_index| {
        (Some(call_index) == hang_at).then(|| Box::pin(std::future::pending()) as _)
    })
}

fn config(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<TestModel>) -> AgentConfig {
    session_config(db, SESSION, store, model)
}

async fn opened(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<TestModel>) -> Agent {
    start_session(config(db, store, model)).await
}

fn rollbacks(events: &[RecordedEvent]) -> Vec<TurnRolledBackEvent> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TurnRolledBack(rolled) => Some(rolled.clone()),
            _ => None,
        })
        .collect()
}

async fn history(store: &Arc<SqliteCheckpoint>) -> Vec<TranscriptItem> {
    guard("load", store.load(SESSION))
        .await
        .expect("load")
        .expect("the session")
        .transcript
}

#[tokio::test]
async fn regenerate_rolls_the_last_turn_back_and_answers_its_message_again() {
    let db = TestDb::new();
    let store = db.open();
    let model = numbered(None, Arc::new(Notify::new()));
    let mut agent = opened(&db, &store, Arc::clone(&model)).await;
    run_turn(&mut agent, "hello").await;
    let second = run_turn(&mut agent, "tell me more").await;
    assert_eq!(answers(&second), ["answer 1"]);

    let submitted = agent.sender().submit(Op::Regenerate).expect("submit regenerate");
    let again = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&again)[..3],
        ["turn_rolled_back", "turn_started", "user_message"],
        "the rollback and the new turn's start commit together"
    );
    assert_eq!(again[0].sequence + 1, again[1].sequence);
    assert_eq!(again[0].recorded_at_ms, again[1].recorded_at_ms);
    assert_eq!(
        rollbacks(&again),
        [TurnRolledBackEvent {
            rolled_back_turn_id: started_turn_id(&second),
            history_from: 2,
            items_removed: 2,
            compaction_undone: false,
        }]
    );
    assert!(
        again
            .iter()
            .all(|event| event.submission_id.as_deref() == Some(&*submitted.id))
    );
    assert_eq!(answers(&again), ["answer 2"]);
    // The model saw the history without the answer it gave before.
    let seen = model.seen();
    assert_eq!(
        seen[2].history,
        [
            user_item("hello"),
            assistant_item("answer 0", false),
            user_item("tell me more")
        ]
    );
    let expected = [
        user_item("hello"),
        assistant_item("answer 0", false),
        user_item("tell me more"),
        assistant_item("answer 2", false),
    ];
    assert_eq!(history(&store).await, expected);
    shutdown(agent).await;

    // A restart rebuilds the same history; the log keeps the undone answer.
    let mut agent = opened(&db, &store, numbered(None, Arc::new(Notify::new()))).await;
    assert_eq!(history(&store).await, expected);
    let log = guard("events", store.events_after(SESSION, 0, 1000))
        .await
        .expect("events");
    assert_eq!(answers(&log), ["answer 0", "answer 1", "answer 2"]);
    // Regenerating the regenerated turn rolls that one back.
    agent.sender().submit(Op::Regenerate).expect("submit regenerate");
    let third = read_turn(&mut agent).await;
    assert_eq!(rollbacks(&third)[0].rolled_back_turn_id, started_turn_id(&again));
    assert_eq!(history(&store).await.len(), 4);
    shutdown(agent).await;
}

#[tokio::test]
async fn regenerate_with_no_turn_to_roll_back_is_rejected_and_changes_nothing() {
    let db = TestDb::new();
    let store = db.open();
    let mut agent = opened(&db, &store, numbered(None, Arc::new(Notify::new()))).await;
    let submitted = agent.sender().submit(Op::Regenerate).expect("submit");
    let event = next(&mut agent).await;
    assert_eq!(event.submission_id.as_deref(), Some(&*submitted.id));
    let EventMsg::SubmissionRejected(rejected) = &event.msg else {
        panic!("{event:?}")
    };
    assert_eq!(rejected.reason, "there is no turn to regenerate");
    assert_eq!(history(&store).await, []);
    shutdown(agent).await;
}

#[tokio::test]
async fn every_message_of_the_rolled_back_turn_runs_again_and_its_tool_calls_leave_the_history() {
    let db = TestDb::new();
    let store = db.open();
    // The first turn calls a tool the session does not have (its result is
    // an error item), then answers.
    let model = TestModel::new(|call| {
        Box::pin(async move {
            Ok(match call.call_index {
                0 => ModelOutput::text("").with_tool_calls(vec![ToolCall {
                    call_id: "c1".into(),
                    name: "no_such_tool".into(),
                    arguments: "{}".into(),
                }]),
                n => ModelOutput::text(format!("answer {n}")),
            })
        })
    });
    let mut agent = opened(&db, &store, Arc::clone(&model)).await;
    // Two messages queued before the turn starts join it.
    agent.sender().submit(user("one")).expect("submit");
    agent.sender().submit(user("two")).expect("submit");
    let first = read_turn(&mut agent).await;
    let items = history(&store).await;
    assert!(items.len() >= 5, "{items:?}");
    if user_messages(&first) != ["one", "two"] {
        // The second message started a turn of its own: roll that back.
        read_turn(&mut agent).await;
    }
    let before = history(&store).await;
    agent.sender().submit(Op::Regenerate).expect("submit");
    let again = read_turn(&mut agent).await;
    let rolled = &rollbacks(&again)[0];
    let from = rolled.history_from as usize;
    assert_eq!(rolled.items_removed as usize, before.len() - from);
    let rerun: Vec<TranscriptItem> = before[from..]
        .iter()
        .filter(|item| matches!(item, TranscriptItem::UserMessage { .. }))
        .cloned()
        .collect();
    assert_eq!(
        user_messages(&again)
            .into_iter()
            .map(|text| user_item(&text))
            .collect::<Vec<_>>(),
        rerun
    );
    let after = history(&store).await;
    assert_eq!(after[..from], before[..from]);
    assert!(
        !after[from..]
            .iter()
            .any(|item| matches!(item, TranscriptItem::ToolCall { .. })),
        "{after:?}"
    );
    shutdown(agent).await;
}

#[tokio::test]
async fn an_accepted_regenerate_survives_a_crash_and_a_crash_in_its_turn_keeps_the_message() {
    let db = TestDb::new();
    let store = db.open();
    let entered = Arc::new(Notify::new());
    // Call 1 (the second turn) hangs: the regenerate waits behind it.
    let mut agent = opened(&db, &store, numbered(Some(1), Arc::clone(&entered))).await;
    run_turn(&mut agent, "hello").await;
    agent.sender().submit(user("slow one")).expect("submit");
    guard("the model starts", entered.notified()).await;
    let handle = agent.handle();
    let accepted = guard(
        "submit_durable",
        handle.submit_durable(Op::Regenerate, SubmitOptions::default()),
    )
    .await
    .expect("accepted");
    // The process dies with the regenerate stored and not yet run.
    drop(agent);

    let store = db.open();
    let state = guard("load", store.load(SESSION))
        .await
        .expect("load")
        .expect("session");
    assert_eq!(state.queued.len(), 1);
    assert_eq!(state.queued[0].op, Op::Regenerate);
    // After the restart the cut turn is closed, then rolled back and run
    // again; this time the model hangs in the regenerated turn.
    let entered = Arc::new(Notify::new());
    let mut agent = start_with(config(&db, &store, numbered(Some(2), Arc::clone(&entered)))).await;
    let events = read_until(&mut agent, |event| {
        event.msg.kind() == "user_message" && event.submission_id.as_deref() == Some(&*accepted.submission_id)
    })
    .await;
    let rolled = rollbacks(&events);
    assert_eq!(rolled.len(), 1, "{events:?}");
    assert_eq!(rolled[0].history_from, 2);
    guard("the model starts", entered.notified()).await;
    drop(agent);

    // A crash inside the regenerated turn: its message is in the history,
    // with the cut text, never lost between the rollback and the new turn.
    let store = db.open();
    let items = history(&store).await;
    assert_eq!(
        items[..3],
        [
            user_item("hello"),
            assistant_item("answer 0", false),
            user_item("slow one")
        ]
    );
    assert!(
        !items[3..]
            .iter()
            .any(|item| matches!(item, TranscriptItem::UserMessage { .. })),
        "the rolled-back turn's message is in the history once: {items:?}"
    );
}

#[tokio::test]
async fn every_turn_end_is_a_point_a_fork_can_start_from() {
    let db = TestDb::new();
    let store = db.open();
    let entered = Arc::new(Notify::new());
    let mut agent = opened(&db, &store, numbered(None, entered)).await;
    // Messages queued back to back, with a slow consumer: the recorder has
    // every reason to put one turn's end and the next one's start in one
    // batch.
    for index in 0..30 {
        agent
            .sender()
            .submit(user(&format!("message {index}")))
            .expect("submit");
        if index % 3 == 0 {
            agent.sender().submit(Op::Compact).expect("submit");
        }
    }
    let mut ends = Vec::new();
    while ends.len() < 10 {
        let event = next(&mut agent).await;
        if event.msg.ends_turn() {
            ends.push(event.sequence);
        }
    }
    shutdown(agent).await;
    let log = guard("events", store.events_after(SESSION, 0, 10_000))
        .await
        .expect("events");
    let ends: Vec<u64> = log
        .iter()
        .filter(|event| event.msg.ends_turn())
        .map(|event| event.sequence)
        .collect();
    assert!(ends.len() >= 10, "{ends:?}");
    let mut previous = 0;
    for end in ends {
        let items = guard("history_until", store.history_until(SESSION, end))
            .await
            .unwrap_or_else(|error| panic!("a fork at the end of a turn (event {end}): {error}"))
            .expect("the session");
        assert!(items.len() > previous, "each turn adds to the history");
        previous = items.len();
    }
}

/// A fork's latest turn is the parent's turn that ended at the fork point:
/// regenerate in the fork answers that turn again, in the fork only. So is
/// a fork after a regenerated turn's end.
#[tokio::test]
async fn regenerate_in_a_fork_answers_the_turn_the_fork_point_ended_again() {
    let db = TestDb::new();
    let store = db.open();
    let model = numbered(None, Arc::new(Notify::new()));
    let mut agent = opened(&db, &store, Arc::clone(&model)).await;
    run_turn(&mut agent, "hello").await;
    let second = run_turn(&mut agent, "tell me more").await;
    let second_end = second.last().expect("the second turn").sequence;
    agent.sender().submit(Op::Regenerate).expect("submit regenerate");
    let regenerated = read_turn(&mut agent).await;
    let regenerated_end = regenerated.last().expect("the regenerated turn").sequence;
    shutdown(agent).await;
    let parent = history(&store).await;

    for (fork, at) in [("fork-of-second", second_end), ("fork-of-regenerated", regenerated_end)] {
        let forked = keel::agent::fork_session(store.as_ref(), SESSION, at, fork)
            .await
            .expect("fork");
        assert_eq!(forked.history_items, 4);
        let fork_store: Arc<dyn CheckpointStore> = store.clone();
        let mut config = AgentConfig::new(fork, fork_store, numbered(None, Arc::new(Notify::new())));
        config.workspace = db.workspace().to_path_buf();
        let mut agent = start_session(config).await;
        agent.sender().submit(Op::Regenerate).expect("submit regenerate");
        let again = read_turn(&mut agent).await;
        let rolled = rollbacks(&again);
        assert_eq!(rolled.len(), 1, "{again:?}");
        assert_eq!((rolled[0].history_from, rolled[0].items_removed), (2, 2));
        assert_eq!(user_messages(&again), ["tell me more"]);
        shutdown(agent).await;
        let forked_history = guard("load", store.load(fork))
            .await
            .expect("load")
            .expect("the fork")
            .transcript;
        assert_eq!(forked_history[..3], parent[..3]);
        assert_eq!(forked_history.len(), 4);
    }
    assert_eq!(history(&store).await, parent, "the parent is untouched");
}
