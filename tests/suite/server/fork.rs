//! Forking a session at a sequence: `POST /v1/sessions/{id}/fork`.

use keel::protocol::{EventMsg, TranscriptItem};
use keel::store::{CheckpointStore, SqliteCheckpoint};
use reqwest::StatusCode;
use serde_json::json;

use crate::suite::support::api::{Resume, SseStream};
use crate::suite::support::events::{ends_turn, started_turn_id};
use crate::suite::support::server::{Scratch, TestServer};

fn user(text: &str) -> TranscriptItem {
    TranscriptItem::UserMessage { text: text.to_owned() }
}

fn assistant(text: &str) -> TranscriptItem {
    TranscriptItem::AssistantMessage {
        text: text.to_owned(),
        interrupted: false,
    }
}

/// A server with the session "parent" on a model scripted with `answers`,
/// and a stream of its events from the start.
async fn parent_session(answers: &[&str]) -> (TestServer, SseStream) {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", answers);
    server.api.create(json!({"id": "parent", "model": model})).await;
    let stream = server.api.stream("parent", Resume::Start).await;
    (server, stream)
}

/// Forks "parent" into "edited" with `fork` (the body without the id), lets
/// the child answer its edited message, stops the server and opens its store.
async fn fork_edited_and_stop(server: TestServer, mut fork: serde_json::Value) -> (Scratch, SqliteCheckpoint) {
    fork["id"] = json!("edited");
    let edited = server.api.post("/v1/sessions/parent/fork", &fork).await;
    assert_eq!(edited.status, StatusCode::CREATED, "{}", edited.body);
    let mut child = server.api.stream("edited", Resume::Start).await;
    child.until(ends_turn).await;
    server.api.wait_idle("edited").await;
    let scratch = server.stop().await;
    let store = SqliteCheckpoint::new(scratch.db()).expect("open");
    (scratch, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_starts_from_the_parents_history_at_a_sequence_and_goes_its_own_way() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"text": "A."}"#, r#"{"text": "B."}"#]);
    server
        .api
        .create(json!({"id": "parent", "model": model, "bot_id": "b1", "context": {"user": "u"}}))
        .await;
    let mut stream = server.api.stream("parent", Resume::Start).await;
    server.api.say("parent", "one").await;
    let first = stream.until(ends_turn).await;
    let first_end = first.last().expect("the first turn").sequence;
    let first_start = first
        .iter()
        .find(|event| matches!(event.msg, EventMsg::TurnStarted(_)))
        .expect("turn_started")
        .sequence;
    server.api.say("parent", "two").await;
    stream.until(ends_turn).await;
    server.api.wait_idle("parent").await;

    // Inside a turn, past the log, an unknown parent, a taken id: refused.
    let inside = server
        .api
        .post("/v1/sessions/parent/fork", &json!({"at_sequence": first_start + 1}))
        .await;
    assert_eq!(inside.status, StatusCode::CONFLICT, "{}", inside.body);
    assert_eq!(inside.code(), "invalid_fork_point", "{}", inside.body);
    let past = server
        .api
        .post("/v1/sessions/parent/fork", &json!({"at_sequence": 100_000}))
        .await;
    assert_eq!(past.status, StatusCode::CONFLICT, "{}", past.body);
    assert_eq!(past.code(), "invalid_fork_point", "{}", past.body);
    let unknown = server
        .api
        .post("/v1/sessions/nobody/fork", &json!({"at_sequence": 1}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.body);
    let taken = server
        .api
        .post(
            "/v1/sessions/parent/fork",
            &json!({"at_sequence": first_end, "id": "parent"}),
        )
        .await;
    assert_eq!(taken.status, StatusCode::CONFLICT, "{}", taken.body);

    let forked = server
        .api
        .post(
            "/v1/sessions/parent/fork",
            &json!({"at_sequence": first_end, "id": "child"}),
        )
        .await;
    assert_eq!(forked.status, StatusCode::CREATED, "{}", forked.body);
    assert_eq!(forked.body["id"], "child");
    assert_eq!(forked.body["bot_id"], "b1");
    assert_eq!(forked.body["context"], json!({"user": "u"}));
    assert_eq!(forked.body["model"], model.as_str());

    // The fork runs a turn of its own on top of the parent's first turn.
    let mut child = server.api.stream("child", Resume::Start).await;
    server.api.say("child", "other").await;
    let events = child.until(ends_turn).await;
    match &events.first().expect("the fork's first event").msg {
        EventMsg::SessionForked(forked) => {
            assert_eq!(forked.parent_session_id, "parent");
            assert_eq!(forked.at_sequence, first_end);
            assert_eq!(forked.history_items, 2);
        }
        other => panic!("a fork starts with session_forked, not {other:?}"),
    }
    assert_eq!(events.first().map(|event| event.sequence), Some(1));
    assert!(
        events.windows(2).all(|pair| pair[1].sequence == pair[0].sequence + 1),
        "gap-free sequences"
    );
    server.api.wait_idle("child").await;

    let scratch = server.stop().await;
    let store = SqliteCheckpoint::new(scratch.db()).expect("open");
    let child = store.load("child").await.expect("read").expect("stored");
    assert_eq!(
        child.transcript,
        [user("one"), assistant("A."), user("other"), assistant("A.")]
    );
    let parent = store.load("parent").await.expect("read").expect("stored");
    assert_eq!(
        parent.transcript,
        [user("one"), assistant("A."), user("two"), assistant("B.")],
        "the parent is untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_forks_to_one_id_make_one_session() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "A."}"#]);
    server.api.create(json!({"id": "parent", "model": model})).await;
    let mut stream = server.api.stream("parent", Resume::Start).await;
    server.api.say("parent", "one").await;
    let end = stream.until(ends_turn).await.last().expect("a turn").sequence;
    server.api.wait_idle("parent").await;

    let body = json!({"at_sequence": end, "id": "child"});
    let replies = futures::future::join_all((0..8).map(|_| server.api.post("/v1/sessions/parent/fork", &body))).await;
    let created = replies
        .iter()
        .filter(|reply| reply.status == StatusCode::CREATED)
        .count();
    assert_eq!(
        created,
        1,
        "{:?}",
        replies.iter().map(|reply| reply.status).collect::<Vec<_>>()
    );
    assert!(
        replies
            .iter()
            .all(|reply| reply.status == StatusCode::CREATED || reply.status == StatusCode::CONFLICT)
    );
    let scratch = server.stop().await;
    let store = SqliteCheckpoint::new(scratch.db()).expect("open");
    let child = store.load("child").await.expect("read").expect("stored");
    assert_eq!(child.transcript, [user("one"), assistant("A.")]);
    assert_eq!(child.last_sequence, 1, "one session_forked event");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_with_a_message_edits_a_past_message() {
    let (server, mut stream) = parent_session(&[r#"{"text": "A."}"#, r#"{"text": "B."}"#]).await;
    server.api.say("parent", "one").await;
    // Edit "two": fork where the turn before it ended, with the new text.
    let before = stream.until(ends_turn).await.last().expect("a turn").sequence;
    server.api.say("parent", "two").await;
    stream.until(ends_turn).await;
    server.api.wait_idle("parent").await;
    let too_big = "x".repeat(keel::protocol::MAX_MESSAGE_BYTES + 1);
    let refused = server
        .api
        .post(
            "/v1/sessions/parent/fork",
            &json!({"at_sequence": before, "id": "bad", "message": too_big}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", refused.body);
    assert_eq!(server.api.get("/v1/sessions/bad").await.status, StatusCode::NOT_FOUND);

    let (_scratch, store) =
        fork_edited_and_stop(server, json!({"at_sequence": before, "message": "two, edited"})).await;
    let edited = store.load("edited").await.expect("read").expect("stored");
    assert_eq!(
        edited.transcript,
        [user("one"), assistant("A."), user("two, edited"), assistant("A.")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_before_a_turn_edits_its_message_and_regenerate_answers_again_over_http() {
    let (server, mut stream) = parent_session(&[r#"{"text": "A."}"#, r#"{"text": "B."}"#, r#"{"text": "C."}"#]).await;
    server.api.say("parent", "one").await;
    stream.until(ends_turn).await;
    server.api.say("parent", "two").await;
    let second = stream.until(ends_turn).await;
    let second_turn = started_turn_id(&second);

    // Regenerate: the second turn is rolled back and "two" answered again.
    let regenerate = server.api.submit("parent", json!({"op": {"type": "regenerate"}})).await;
    assert_eq!(regenerate.status, StatusCode::ACCEPTED, "{}", regenerate.body);
    let again = stream.until(ends_turn).await;
    let rolled = again
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnRolledBack(rolled) => Some(rolled.clone()),
            _ => None,
        })
        .expect("turn_rolled_back");
    assert_eq!(
        (rolled.rolled_back_turn_id.as_str(), rolled.history_from),
        (second_turn.as_str(), 2)
    );
    let regenerated_turn = started_turn_id(&again);
    server.api.wait_idle("parent").await;

    // Edit "two" (the regenerated turn's message) by naming its turn.
    for (bad, status) in [
        (json!({"before_turn": "no-such-turn"}), StatusCode::CONFLICT),
        (
            json!({"before_turn": regenerated_turn, "at_sequence": 1}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({}), StatusCode::BAD_REQUEST),
    ] {
        let refused = server.api.post("/v1/sessions/parent/fork", &bad).await;
        assert_eq!(refused.status, status, "{bad}: {}", refused.body);
    }
    let (_scratch, store) = fork_edited_and_stop(
        server,
        json!({"before_turn": regenerated_turn, "message": "two, edited"}),
    )
    .await;
    let parent = store.load("parent").await.expect("read").expect("stored");
    assert_eq!(
        parent.transcript,
        [user("one"), assistant("A."), user("two"), assistant("C.")]
    );
    let edited = store.load("edited").await.expect("read").expect("stored");
    assert_eq!(
        edited.transcript[..3],
        [user("one"), assistant("A."), user("two, edited")]
    );
}
