//! Sessions unloading and reloading; the server process shutting down,
//! restarting and crashing.

use std::time::Duration;

use keel::protocol::{AbortReason, EventMsg, RecordedEvent};
use serde_json::json;

use crate::suite::support::api::Resume;
use crate::suite::support::events::{ends_turn, kinds, sequences, started_turn_id};
use crate::suite::support::server::{Scratch, ServeProcess, TestServer, slow_chunks};
use crate::suite::support::wait::{HANG_GUARD, wait_until_async};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_unloads_and_reloads_on_use() {
    let server = TestServer::start(|config, _| config.idle_unload = Duration::from_millis(200)).await;
    let model = server
        .scratch
        .script("s.jsonl", &[r#"{"text": "one"}"#, r#"{"text": "two"}"#]);
    server
        .api
        .create(json!({"id": "napper", "model": model, "on_busy": "queue"}))
        .await;
    let mut stream = server.api.stream("napper", Resume::Start).await;
    server.api.say("napper", "first").await;
    stream.until(ends_turn).await;
    // A subscriber keeps it loaded. Kept: the test proves it is not
    // unloaded within three idle timeouts.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(server.api.session("napper").await["live"], true);
    drop(stream);
    // `live` turns false as the unload begins; the unload is over once its
    // `shutdown_complete` is stored.
    wait_until_async("the session to unload", HANG_GUARD, async || {
        let live = server.api.session("napper").await["live"] == true;
        let newest = server.api.get("/v1/sessions/napper/events?limit=1").await.body;
        !live && newest["events"][0]["msg"]["type"] == "shutdown_complete"
    })
    .await;
    let shown = server.api.session("napper").await;
    assert_eq!(
        (shown["state"].as_str(), shown["turns_completed"].as_u64()),
        (Some("idle"), Some(1))
    );

    // A submission loads it again, with its settings.
    let after = shown["last_sequence"].as_u64().expect("sequence");
    let mut stream = server.api.stream("napper", Resume::After(after)).await;
    server.api.say("napper", "second").await;
    let events = stream.until(ends_turn).await;
    match &events[0].msg {
        EventMsg::SessionStarted(started) => assert!(started.resumed),
        other => panic!("expected session_started, got {other:?}"),
    }
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"));
    assert_eq!(server.api.session("napper").await["live"], true);
    drop(stream);

    let scratch = server.stop().await;
    let stored = scratch.stored("napper").await;
    let unload = kinds(&stored)
        .iter()
        .position(|kind| *kind == "shutdown_complete")
        .expect("an unload");
    assert_eq!(kinds(&stored)[unload + 1], "session_started");
    let texts: Vec<&str> = stored
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["one", "two"], "the script went on where it was");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_one_more_session_than_the_bound_unloads_the_longest_idle() {
    let server = TestServer::start(|config, _| config.max_live_sessions = 2).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "Hi."}"#]);
    for id in ["a", "b"] {
        server.api.create(json!({"id": id, "model": model})).await;
        // Kept: "the longest idle" needs idle times that differ clearly,
        // past whatever each session does just after it opens.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.api.create(json!({"id": "c", "model": model})).await;
    let live: Vec<bool> = futures::future::join_all(["a", "b", "c"].map(|id| server.api.session(id)))
        .await
        .iter()
        .map(|session| session["live"] == true)
        .collect();
    assert_eq!(live, [false, true, true], "the longest-idle session made room");
    let metrics = server.api.metrics().await;
    assert!(metrics.contains("keel_live_sessions 2"), "{metrics}");
    server.stop().await;
}

/// The events of `turn_id` among `events`.
fn turn_events<'a>(events: &'a [RecordedEvent], turn_id: &str) -> Vec<&'a RecordedEvent> {
    events
        .iter()
        .filter(|event| event.msg.turn_id() == Some(turn_id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_turn_in_flight_closes_the_turn_and_exits_zero() {
    let scratch = Scratch::new();
    let model = scratch.script("slow.jsonl", &[&slow_chunks(200, 100)]);
    let process = ServeProcess::start(&scratch, &["--shutdown-grace-secs", "1"]);
    process.api.create(json!({"id": "inflight", "model": model})).await;
    let mut stream = process.api.stream("inflight", Resume::Start).await;
    process.api.say("inflight", "a long one").await;
    let seen = stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    let turn = started_turn_id(&seen);

    let (status, stderr) = tokio::task::spawn_blocking(move || process.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "exit {status:?}: {stderr:?}");
    assert!(stderr.iter().any(|line| line == "keel serve stopped"), "{stderr:?}");

    let stored = scratch.stored("inflight").await;
    let closing: Vec<&RecordedEvent> = turn_events(&stored, &turn)
        .into_iter()
        .filter(|event| event.msg.ends_turn())
        .collect();
    assert_eq!(closing.len(), 1, "the turn is closed once: {:?}", kinds(&stored));
    match &closing[0].msg {
        EventMsg::TurnAborted(aborted) => assert_eq!(aborted.reason, AbortReason::Interrupted),
        other => panic!("expected the turn to be interrupted, got {other:?}"),
    }
    assert_eq!(
        kinds(&stored).last(),
        Some(&"shutdown_complete"),
        "{:?}",
        kinds(&stored)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_stream_resumes_where_it_was() {
    let scratch = Scratch::new();
    let model = scratch.script("s.jsonl", &[r#"{"text": "before"}"#, r#"{"text": "after"}"#]);
    let first = ServeProcess::start(&scratch, &[]);
    first.api.create(json!({"id": "durable", "model": model})).await;
    let mut stream = first.api.stream("durable", Resume::Start).await;
    first.api.say("durable", "one").await;
    let before = stream.until(ends_turn).await;
    let resume_at = before.last().expect("events").sequence;
    let (status, _) = tokio::task::spawn_blocking(move || first.terminate())
        .await
        .expect("stop");
    assert!(status.success());
    // The old stream ends with the server.
    assert!(stream.next().await.is_none_or(|event| event.sequence > resume_at));

    let second = ServeProcess::start(&scratch, &[]);
    let mut stream = second.api.stream("durable", Resume::LastEventId(resume_at)).await;
    second.api.say("durable", "two").await;
    let after = stream.until(ends_turn).await;
    assert_eq!(
        sequences(&after),
        ((resume_at + 1)..=after.last().expect("events").sequence).collect::<Vec<_>>()
    );
    assert!(
        kinds(&after).contains(&"shutdown_complete"),
        "the first server's last event: {:?}",
        kinds(&after)
    );
    assert!(kinds(&after).contains(&"session_started"));
    let texts: Vec<&str> = after
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["after"]);
    let (status, _) = tokio::task::spawn_blocking(move || second.terminate())
        .await
        .expect("stop");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_submission_survives_kill_9_and_runs_after_the_restart() {
    let scratch = Scratch::new();
    let model = scratch.script(
        "s.jsonl",
        &[&slow_chunks(200, 100), r#"{"text": "the queued one ran"}"#],
    );
    let first = ServeProcess::start(&scratch, &[]);
    first.api.create(json!({"id": "crashy", "model": model})).await;
    let mut stream = first.api.stream("crashy", Resume::Start).await;
    first.api.say("crashy", "a long one").await;
    stream
        .until(|event| event.msg.kind() == "assistant_content_delta")
        .await;
    let accepted = first.api.say("crashy", "queued behind it").await;
    let submission_id = accepted["submission_id"].as_str().expect("id").to_owned();
    tokio::task::spawn_blocking(move || first.crash()).await.expect("crash");

    let second = ServeProcess::start(&scratch, &[]);
    let mut stream = second.api.stream("crashy", Resume::Start).await;
    let events = stream
        .until(|event| {
            event.msg.kind() == "turn_complete" && event.submission_id.as_deref() == Some(submission_id.as_str())
        })
        .await;
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["a long one", "queued behind it"]);
    let aborted: Vec<AbortReason> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TurnAborted(aborted) => Some(aborted.reason),
            _ => None,
        })
        .collect();
    assert_eq!(aborted, [AbortReason::RuntimeStopped], "the crashed turn is closed");
    let (status, _) = tokio::task::spawn_blocking(move || second.terminate())
        .await
        .expect("stop");
    assert!(status.success());
}

/// A message acknowledged to an idle session and stored, but never taken up
/// (the server was killed right after its `202`), runs when the server
/// starts again, without any request loading its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_stored_for_an_idle_session_runs_at_the_next_start_without_a_request() {
    use keel::protocol::{Event, Op, SubmissionQueuedEvent};
    use keel::store::CheckpointStoreExt;
    use keel::store::{AppendBatch, CheckpointStore, EncodedEvent, SqliteCheckpoint};

    let scratch = Scratch::new();
    let model = scratch.script("s.jsonl", &[r#"{"text": "the stranded one ran"}"#]);
    let first = ServeProcess::start(&scratch, &[]);
    first.api.create(json!({"id": "idle", "model": model})).await;
    let (status, _) = tokio::task::spawn_blocking(move || first.terminate())
        .await
        .expect("stop");
    assert!(status.success());

    // What `submit_durable` commits before answering `202`; the kill -9
    // that follows leaves it in the store's queue, with no turn in flight.
    let submission_id = "stranded-submission".to_owned();
    let queued = Event {
        submission_id: Some(submission_id.clone()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            op: Op::UserInput {
                text: "acknowledged before the crash".to_owned(),
            },
            on_busy: keel::protocol::BusyPolicy::Queue,
            idempotency_key: None,
            submitted_by: None,
            traceparent: None,
        }),
    };
    {
        let store = SqliteCheckpoint::new(scratch.db()).expect("open the database");
        let batch = AppendBatch {
            events: vec![EncodedEvent::encode(&queued).expect("encode")],
            checkpoint: None,
            lease: None,
        };
        store.append("idle", batch).await.expect("store the message");
        let state = store.load("idle").await.expect("load").expect("the session");
        assert_eq!(state.queued.len(), 1);
        assert!(state.execution.is_none());
    }

    let second = ServeProcess::start(&scratch, &[]);
    // A stream does not load the session: only the server's start can.
    let mut stream = second.api.stream("idle", Resume::Start).await;
    let events = stream
        .until(|event| {
            event.msg.kind() == "turn_complete" && event.submission_id.as_deref() == Some(submission_id.as_str())
        })
        .await;
    let texts: Vec<&str> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["the stranded one ran"]);
    let (status, _) = tokio::task::spawn_blocking(move || second.terminate())
        .await
        .expect("stop");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_op_stops_the_session_and_the_next_message_loads_it_again() {
    let server = TestServer::start(|_, _| {}).await;
    let model = server.scratch.script("s.jsonl", &[r#"{"text": "after the stop"}"#]);
    server.api.create(json!({"id": "stopper", "model": model})).await;
    let mut stream = server.api.stream("stopper", Resume::Start).await;
    let reply = server.api.submit("stopper", json!({"op": {"type": "shutdown"}})).await;
    assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
    stream.until(|event| event.msg.kind() == "shutdown_complete").await;
    server.api.say("stopper", "hello again").await;
    let events = stream.until(ends_turn).await;
    assert_eq!(events[0].msg.kind(), "session_started");
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_waiting_for_approval_unloads_and_the_decision_completes_it_after_reloading() {
    let server = TestServer::start(|config, _| config.idle_unload = Duration::from_millis(200)).await;
    let call = json!({"tool_calls": [{"id": "call-1", "name": "write_file", "arguments": {"path": "note.txt", "content": "hi"}}]});
    let model = server
        .scratch
        .script("s.jsonl", &[&call.to_string(), r#"{"text": "written"}"#]);
    server
        .api
        .create(json!({"id": "asker", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    let mut stream = server.api.stream("asker", Resume::Start).await;
    server.api.say("asker", "write a note").await;
    stream.until(|event| event.msg.kind() == "approval_requested").await;
    let shown = server.api.session("asker").await;
    assert_eq!(shown["state"], "awaiting_approval", "{shown}");
    assert_eq!(shown["pending_approvals"], json!(["call-1"]));
    // Nobody watches: the waiting session is at rest, so it unloads.
    drop(stream);
    wait_until_async("the waiting session to unload", HANG_GUARD, async || {
        server.api.session("asker").await["live"] == false
    })
    .await;
    let shown = server.api.session("asker").await;
    assert_eq!(shown["state"], "awaiting_approval", "{shown}");

    let after = shown["last_sequence"].as_u64().expect("sequence");
    let mut stream = server.api.stream("asker", Resume::After(after)).await;
    let decision = json!({"op": {"type": "approval", "call_id": "call-1", "decision": "approve"}});
    let reply = server.api.submit("asker", decision).await;
    assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
    let events = stream.until(ends_turn).await;
    assert_eq!(kinds(&events).last(), Some(&"turn_complete"), "{:?}", kinds(&events));
    assert!(kinds(&events).contains(&"tool_call_completed"));
    assert_eq!(
        std::fs::read_to_string(server.scratch.workspaces().join("asker").join("note.txt")).expect("the file"),
        "hi"
    );
    server.stop().await;
}

/// Text streamed before `kill -9` was seen by the user: once the restarted
/// server closes the cut turn, that text is in the stored history as an
/// interrupted assistant message, between the question and what follows,
/// so the next request to the provider carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_streamed_before_kill_9_joins_the_history_marked_interrupted() {
    use keel::protocol::TranscriptItem;
    use keel::store::{CheckpointStore, SqliteCheckpoint};

    let scratch = Scratch::new();
    let model = scratch.script("s.jsonl", &[&slow_chunks(200, 50), r#"{"text": "next"}"#]);
    let first = ServeProcess::start(&scratch, &[]);
    first.api.create(json!({"id": "cut", "model": model})).await;
    let mut stream = first.api.stream("cut", Resume::Start).await;
    first.api.say("cut", "a long one").await;
    let mut seen = String::new();
    while !seen.contains("c2 ") {
        let event = stream.next().await.expect("an event");
        if let EventMsg::AssistantContentDelta(delta) = &event.msg {
            seen.push_str(&delta.delta);
        }
    }
    tokio::task::spawn_blocking(move || first.crash()).await.expect("crash");

    let second = ServeProcess::start(&scratch, &[]);
    let mut stream = second.api.stream("cut", Resume::Start).await;
    let events = stream.until(|event| event.msg.kind() == "turn_aborted").await;
    let streamed: String = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantContentDelta(delta) => Some(delta.delta.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        streamed.starts_with(&seen),
        "{streamed:?} holds what the user saw, {seen:?}"
    );
    second.api.say("cut", "go on").await;
    stream.until(|event| event.msg.kind() == "turn_complete").await;
    let (status, _) = tokio::task::spawn_blocking(move || second.terminate())
        .await
        .expect("stop");
    assert!(status.success());

    let store = SqliteCheckpoint::new(scratch.db()).expect("open");
    let state = store.load("cut").await.expect("load").expect("stored");
    assert_eq!(
        state.transcript,
        [
            TranscriptItem::UserMessage {
                text: "a long one".to_owned()
            },
            TranscriptItem::AssistantMessage {
                text: streamed,
                interrupted: true
            },
            TranscriptItem::UserMessage {
                text: "go on".to_owned()
            },
            TranscriptItem::AssistantMessage {
                text: "next".to_owned(),
                interrupted: false
            },
        ]
    );
}

/// The sequence of the first event of `kind` about `call_id` in the log's
/// first page, if any.
async fn logged_at(api: &crate::suite::support::api::Api, session: &str, kind: &str, call_id: &str) -> Option<u64> {
    let page = api
        .get(&format!("/v1/sessions/{session}/events?after=0&limit=1000"))
        .await;
    assert_eq!(page.status, reqwest::StatusCode::OK, "{}", page.body);
    page.body["events"].as_array()?.iter().find_map(|event| {
        (event["msg"]["type"] == kind && event["msg"]["call_id"] == call_id).then(|| event["sequence"].as_u64())?
    })
}

/// `GET /v1/sessions/{id}` shows only what the log holds as of the
/// `last_sequence` it shows: a call is `awaiting_approval` there only once
/// its `approval_requested` is committed, and stops being so only once its
/// `approval_decided` is. Read in a tight loop while a turn asks and its
/// call is decided, many times over: the view showed the call waiting
/// before its request was stored in about a third of such tries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_view_shows_an_approval_only_once_the_log_holds_it() {
    let server = TestServer::start(|_, _| {}).await;
    let api = &server.api;
    for attempt in 0..16 {
        let session = format!("view-{attempt}");
        let call_id = format!("call-{attempt}");
        let call = json!({"tool_calls": [{"id": call_id, "name": "write_file", "arguments": {"path": "n.txt", "content": "x"}}]});
        let model = server
            .scratch
            .script(&format!("{session}.jsonl"), &[&call.to_string(), r#"{"text": "done"}"#]);
        api.create(json!({"id": session, "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
            .await;
        api.say(&session, "write it").await;
        let deadline = std::time::Instant::now() + HANG_GUARD;
        let shown = loop {
            assert!(std::time::Instant::now() < deadline, "the call never showed as waiting");
            let shown = api.session(&session).await;
            if shown["state"] == "awaiting_approval" {
                break shown;
            }
        };
        assert_eq!(shown["pending_approvals"], json!([call_id]), "{shown}");
        let requested = logged_at(api, &session, "approval_requested", &call_id).await;
        let as_of = shown["last_sequence"].as_u64().expect("last_sequence");
        assert!(
            requested.is_some_and(|at| at <= as_of),
            "attempt {attempt}: shown waiting as of sequence {as_of}, requested at {requested:?}"
        );

        let decide = json!({"op": {"type": "approval", "call_id": call_id, "decision": "deny"}});
        let reply = api.submit(&session, decide).await;
        assert_eq!(reply.status, reqwest::StatusCode::ACCEPTED, "{}", reply.body);
        let shown = loop {
            assert!(std::time::Instant::now() < deadline, "the call stayed waiting");
            let shown = api.session(&session).await;
            if shown["state"] != "awaiting_approval" {
                break shown;
            }
        };
        let decided = logged_at(api, &session, "approval_decided", &call_id).await;
        let as_of = shown["last_sequence"].as_u64().expect("last_sequence");
        assert!(
            decided.is_some_and(|at| at <= as_of),
            "attempt {attempt}: shown decided as of sequence {as_of}, decided at {decided:?}"
        );
        api.wait_idle(&session).await;
    }
    server.stop().await;
}
