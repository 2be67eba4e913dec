//! Client tools in the runtime: a call is requested durably, waits on the
//! control lane like an approval, and its result (the client's, a
//! timeout's or an interrupt's) goes to the model as the call's result.

use std::sync::Arc;
use std::time::Duration;

use keel::agent::{AgentConfig, BoxFuture, ModelOutput, StreamingOptions, ToolCall, ToolSpec};
use keel::protocol::*;
use keel::store::{CheckpointStore, SqliteCheckpoint};
use keel::tools::{Tool, ToolContext, ToolError, ToolSet};
use keel::{Agent, Op};

use crate::suite::support::{agent::*, events::*, model::*, store::*};

const SESSION: &str = "client-tools-session";

/// A server tool answering its own name; `read_only` ones run at once,
/// the others ask for approval (the default rules).
struct Named {
    name: &'static str,
    read_only: bool,
}

impl Tool for Named {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.into(),
            description: "answers its name".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn call<'a>(
        &'a self,
        _arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move { Ok(format!("{} ran", self.name)) })
    }
}

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments: r#"{"hint":"warm"}"#.into(),
    }
}

/// A model that calls `calls` in its first step, then answers "done".
fn calling(calls: Vec<ToolCall>) -> Arc<TestModel> {
    TestModel::new(move |request| {
        let output = match request.call_index {
            0 => ModelOutput::default().with_tool_calls(calls.clone()),
            _ => ModelOutput::text("done"),
        };
        Box::pin(async move { Ok(output) })
    })
}

fn pick_color() -> ClientToolSpec {
    ClientToolSpec {
        name: "pick_color".into(),
        description: "Asks the user to pick a color.".into(),
        parameters: serde_json::json!({"type": "object", "properties": {"hint": {"type": "string"}}}),
    }
}

fn config(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<dyn keel::Model>) -> AgentConfig {
    let mut config = session_config(db, SESSION, store, model);
    let mut tools = ToolSet::new();
    tools.add(Arc::new(Named {
        name: "look",
        read_only: true,
    }));
    tools.add(Arc::new(Named {
        name: "write",
        read_only: false,
    }));
    config.tools = tools;
    config.client_tools = vec![pick_color()];
    config.streaming = StreamingOptions::per_delta();
    config
}

fn answer(call_id: &str, output: &str) -> Op {
    Op::ClientToolResult {
        call_id: call_id.into(),
        output: output.into(),
        is_error: false,
    }
}

async fn read_to(agent: &mut Agent, kind: &str) -> Vec<RecordedEvent> {
    read_until(agent, |event| event.msg.kind() == kind).await
}

/// The reasons of the `submission_rejected` events of `events`.
fn refusals(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::SubmissionRejected(rejected) => Some(rejected.reason.clone()),
            _ => None,
        })
        .collect()
}

/// The tool results the model saw in its last request, in order.
fn results_seen(model: &TestModel) -> Vec<(String, String, bool)> {
    let seen = model.seen();
    let last = seen.last().expect("a request");
    last.history
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::ToolResult {
                call_id,
                output,
                is_error,
            } => Some((call_id.clone(), output.clone(), *is_error)),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_client_call_is_requested_and_its_result_goes_to_the_model() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color")]);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    agent.sender().submit(user("pick")).expect("submit");
    let before = read_to(&mut agent, "client_tool_requested").await;
    assert!(
        model.seen()[0].tools.contains(&"pick_color".to_owned()),
        "offered with the server's tools: {:?}",
        model.seen()[0].tools
    );
    let Some(EventMsg::ClientToolRequested(request)) = before.last().map(|event| &event.msg) else {
        panic!("expected client_tool_requested")
    };
    assert_eq!((request.call_id.as_str(), request.name.as_str()), ("c1", "pick_color"));
    assert_eq!(request.arguments, r#"{"hint":"warm"}"#);
    assert!(request.expires_at_ms.is_some(), "the default timeout applies");
    assert_eq!(agent.handle().status().awaiting_client, ["c1"]);
    assert_eq!(model.seen().len(), 1, "nothing runs while the client has the call");

    agent.sender().submit(answer("c1", "teal")).expect("answer");
    let rest = read_turn(&mut agent).await;
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    assert_eq!(tool_results(&rest), [("c1".to_owned(), "teal".to_owned(), false)]);
    assert_eq!(results_seen(&model), [("c1".to_owned(), "teal".to_owned(), false)]);
    assert!(agent.handle().status().awaiting_client.is_empty());
    shutdown(agent).await;
}

#[tokio::test]
async fn a_second_answer_and_an_answer_for_an_unknown_call_are_refused_apart() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color")]);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    agent.sender().submit(user("pick")).expect("submit");
    read_to(&mut agent, "client_tool_requested").await;
    agent.sender().submit(answer("nope", "x")).expect("stray");
    let stray = read_to(&mut agent, "submission_rejected").await;
    assert_eq!(refusals(&stray), ["no client tool call nope is waiting for a result"]);
    agent.sender().submit(answer("c1", "teal")).expect("answer");
    read_turn(&mut agent).await;
    agent.sender().submit(answer("c1", "again")).expect("again");
    let again = read_to(&mut agent, "submission_rejected").await;
    assert_eq!(refusals(&again), ["client tool call c1 was already answered"]);
    assert_eq!(results_seen(&model), [("c1".to_owned(), "teal".to_owned(), false)]);
    shutdown(agent).await;
}

#[tokio::test]
async fn an_interrupt_answers_the_waiting_calls_and_aborts_the_turn() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color"), call("l1", "look")]);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    agent.sender().submit(user("pick")).expect("submit");
    read_to(&mut agent, "client_tool_requested").await;
    agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("interrupt");
    let rest = read_turn(&mut agent).await;
    let (reason, _) = abort_of(&rest);
    assert_eq!(reason, AbortReason::Interrupted);
    let results = tool_results(&rest);
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0].0, "c1");
    assert!(results[0].2 && results[0].1.contains("interrupted"), "{results:?}");
    assert_eq!(results[1].0, "l1");
    assert!(results[1].2 && results[1].1.starts_with("not run"), "{results:?}");
    assert!(agent.handle().status().awaiting_client.is_empty());
    shutdown(agent).await;
}

#[tokio::test]
async fn an_unanswered_call_times_out_as_an_error_result() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color")]);
    let mut config = config(&db, &store, model.clone());
    config.client_tool_timeout = Some(Duration::from_millis(300));
    let mut agent = start_with(config).await;
    agent.sender().submit(user("pick")).expect("submit");
    let started = std::time::Instant::now();
    let rest = read_turn(&mut agent).await;
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    let expected = (
        "c1".to_owned(),
        "the client did not answer within 300 ms".to_owned(),
        true,
    );
    assert_eq!(tool_results(&rest), std::slice::from_ref(&expected));
    assert_eq!(results_seen(&model), [expected]);
    agent.sender().submit(answer("c1", "late")).expect("late");
    let late = read_to(&mut agent, "submission_rejected").await;
    assert_eq!(refusals(&late), ["client tool call c1 was already answered"]);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_step_mixing_an_approval_a_server_tool_and_client_tools_keeps_every_result() {
    let db = TestDb::new();
    let store = db.open();
    let calls = vec![
        call("w1", "write"),
        call("c1", "pick_color"),
        call("l1", "look"),
        call("c2", "pick_color"),
    ];
    let model = calling(calls);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    agent.sender().submit(user("all of it")).expect("submit");
    read_to(&mut agent, "approval_requested").await;
    // The client calls are requested once the approvals are decided.
    agent.sender().submit(answer("c1", "early")).expect("early");
    let early = read_to(&mut agent, "submission_rejected").await;
    assert_eq!(refusals(&early), ["no client tool call c1 is waiting for a result"]);
    agent
        .sender()
        .submit(Op::Approval {
            call_id: "w1".into(),
            decision: ApprovalDecision::Approve,
        })
        .expect("approve");
    let requested = read_until(
        &mut agent,
        |event| matches!(&event.msg, EventMsg::ClientToolRequested(request) if request.call_id == "c2"),
    )
    .await;
    let asked: Vec<&str> = requested
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ClientToolRequested(request) => Some(request.call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["c1", "c2"], "both requested at once");
    assert_eq!(agent.handle().status().awaiting_client, ["c1", "c2"]);
    // Answered out of order: each result is recorded as it arrives.
    agent.sender().submit(answer("c2", "blue")).expect("c2");
    agent.sender().submit(answer("c1", "red")).expect("c1");
    let rest = read_turn(&mut agent).await;
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    let results = tool_results(&rest);
    let by_call = |id: &str| results.iter().find(|result| result.0 == id).cloned();
    assert_eq!(by_call("c1"), Some(("c1".into(), "red".into(), false)));
    assert_eq!(by_call("c2"), Some(("c2".into(), "blue".into(), false)));
    assert_eq!(by_call("w1"), Some(("w1".into(), "write ran".into(), false)));
    assert_eq!(by_call("l1"), Some(("l1".into(), "look ran".into(), false)));
    // Client results as they arrived, then the server's calls in call order.
    let seen: Vec<String> = results_seen(&model).into_iter().map(|result| result.0).collect();
    assert_eq!(seen, ["c2", "c1", "w1", "l1"]);
    shutdown(agent).await;
    let log = stored_events(&store, SESSION).await;
    assert_gapless(&log, 1);
}

#[tokio::test]
async fn a_waiting_call_survives_a_restart_and_the_answer_completes_the_same_turn() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color")]);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    agent.sender().submit(user("pick")).expect("submit");
    let before = read_to(&mut agent, "client_tool_requested").await;
    let turn_id = started_turn_id(&before);
    drop(agent);

    let reopened = db.open();
    let mut agent = start_with(config(&db, &reopened, model.clone())).await;
    let started = next(&mut agent).await;
    assert_eq!(started.msg.kind(), "session_started");
    let waiting = reopened
        .session_summary(SESSION)
        .await
        .expect("summary")
        .expect("stored");
    assert_eq!(waiting.awaiting_client, ["c1"]);
    assert!(waiting.client_deadline_ms.is_some());
    agent.sender().submit(answer("c1", "teal")).expect("answer");
    let rest = read_turn(&mut agent).await;
    assert!(
        rest.iter().all(|event| event.msg.turn_id() == Some(turn_id.as_str())),
        "the same turn goes on"
    );
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    assert_eq!(results_seen(&model), [("c1".to_owned(), "teal".to_owned(), false)]);
    shutdown(agent).await;
    let log = stored_events(&reopened, SESSION).await;
    assert_gapless(&log, 1);
    assert_eq!(log.iter().filter(|event| event.msg.ends_turn()).count(), 1);
}

#[tokio::test]
async fn a_deadline_that_passed_while_the_session_was_closed_times_the_call_out_on_opening() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color")]);
    let mut config = config(&db, &store, model.clone());
    config.client_tool_timeout = Some(Duration::from_millis(200));
    let mut agent = start_with(config).await;
    agent.sender().submit(user("pick")).expect("submit");
    read_to(&mut agent, "client_tool_requested").await;
    drop(agent);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut config = self::config(&db, &db.open(), model.clone());
    config.client_tool_timeout = Some(Duration::from_millis(200));
    let mut agent = start_with(config).await;
    let rest = read_turn(&mut agent).await;
    assert_eq!(
        tool_results(&rest),
        [(
            "c1".to_owned(),
            "the client did not answer within 200 ms".to_owned(),
            true
        )]
    );
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    shutdown(agent).await;
}

#[tokio::test]
async fn a_result_over_the_cap_is_refused_before_it_is_queued() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("c1", "pick_color")]);
    let mut agent = start_with(config(&db, &store, model.clone())).await;
    agent.sender().submit(user("pick")).expect("submit");
    read_to(&mut agent, "client_tool_requested").await;
    let big = "x".repeat(MAX_CLIENT_TOOL_OUTPUT_BYTES + 1);
    assert!(agent.sender().submit(answer("c1", &big)).is_err());
    agent.sender().submit(answer("c1", "small")).expect("answer");
    let rest = read_turn(&mut agent).await;
    assert_eq!(tool_results(&rest), [("c1".to_owned(), "small".to_owned(), false)]);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_server_tool_keeps_its_name_over_a_client_tool_of_the_same_name() {
    let db = TestDb::new();
    let store = db.open();
    let model = calling(vec![call("l1", "look")]);
    let mut config = config(&db, &store, model.clone());
    config.client_tools.push(ClientToolSpec {
        name: "look".into(),
        description: "shadowed".into(),
        parameters: serde_json::json!({"type": "object"}),
    });
    let mut agent = start_with(config).await;
    let events = run_turn(&mut agent, "look").await;
    assert!(!kinds(&events).contains(&"client_tool_requested"));
    assert_eq!(tool_results(&events), [("l1".to_owned(), "look ran".to_owned(), false)]);
    let offered = &model.seen()[0].tools;
    assert_eq!(offered.iter().filter(|name| *name == "look").count(), 1, "{offered:?}");
    shutdown(agent).await;
}
