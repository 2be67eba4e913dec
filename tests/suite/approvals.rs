//! Approvals and concurrency of tool calls: `ask` calls wait for the user
//! (durably, across restarts), denials and interrupts answer the model,
//! parallel-safe calls run together and results keep the calls' order.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel::agent::{AgentConfig, BoxFuture, ModelOutput, StreamingOptions, ToolCall, ToolSpec};
use keel::protocol::*;
use keel::store::SqliteCheckpoint;
use keel::tools::{ApprovalPolicy, ApprovalRules, Tool, ToolContext, ToolError, ToolSet};
use keel::{Agent, Op};
use tokio::sync::{Notify, Semaphore};

use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

const SESSION: &str = "approvals-session";

fn call(id: &str, name: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments: "{}".into(),
    }
}

/// A tool that counts its runs; `entered` is signalled when one starts and
/// it finishes when `gate` gives it a permit.
struct Counter {
    name: &'static str,
    read_only: bool,
    runs: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
}

impl Tool for Counter {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.name.into(),
            description: "counts".into(),
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
        Box::pin(async move {
            let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
            self.entered.notify_waiters();
            let _permit = self
                .gate
                .acquire()
                .await
                .map_err(|_| ToolError::Failed("gate closed".into()))?;
            Ok(format!("{} run {run}", self.name))
        })
    }
}

struct Tools {
    set: ToolSet,
    runs: Arc<AtomicUsize>,
    entered: Arc<Notify>,
    gate: Arc<Semaphore>,
}

/// A writing tool `write` and two reading tools `look` and `peek`, sharing
/// one run counter; `open` lets every call finish at once.
fn tools(open: bool) -> Tools {
    let runs = Arc::new(AtomicUsize::new(0));
    let entered = Arc::new(Notify::new());
    let gate = Arc::new(Semaphore::new(if open { Semaphore::MAX_PERMITS } else { 0 }));
    let mut set = ToolSet::builtin();
    for (name, read_only) in [("write", false), ("look", true), ("peek", true)] {
        set.add(Arc::new(Counter {
            name,
            read_only,
            runs: Arc::clone(&runs),
            entered: Arc::clone(&entered),
            gate: Arc::clone(&gate),
        }));
    }
    Tools {
        set,
        runs,
        entered,
        gate,
    }
}

/// A model that answers the n-th call with `script[n]`, then with "done".
fn scripted(script: Vec<ModelOutput>) -> Arc<TestModel> {
    TestModel::new(move |call| {
        let output = script
            .get(call.call_index as usize)
            .cloned()
            .unwrap_or_else(|| ModelOutput::text("done"));
        Box::pin(async move { Ok(output) })
    })
}

fn config(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<dyn keel::Model>, tools: ToolSet) -> AgentConfig {
    let mut config = session_config(db, SESSION, store, model);
    config.tools = tools;
    config.streaming = StreamingOptions::per_delta();
    config
}

fn approve(call_id: &str, decision: ApprovalDecision) -> Op {
    Op::Approval {
        call_id: call_id.into(),
        decision,
    }
}

/// Reads events until one of kind `kind`.
async fn read_to(agent: &mut Agent, kind: &str) -> Vec<RecordedEvent> {
    read_until(agent, |event| event.msg.kind() == kind).await
}

#[tokio::test]
async fn an_ask_call_waits_for_approval_and_runs_once_approved() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![ModelOutput::default().with_tool_calls(vec![call("w1", "write")])]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set)).await;
    agent.sender().submit(user("write it")).expect("submit");
    let asked = read_to(&mut agent, "approval_requested").await;
    let Some(EventMsg::ApprovalRequested(request)) = asked.last().map(|event| &event.msg) else {
        panic!("expected approval_requested")
    };
    assert_eq!(
        (
            request.call_id.as_str(),
            request.name.as_str(),
            request.arguments.as_str()
        ),
        ("w1", "write", "{}")
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0, "nothing runs before the decision");

    let decision = agent
        .sender()
        .submit(approve("w1", ApprovalDecision::Approve))
        .expect("approve");
    let rest = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&rest),
        [
            "approval_decided",
            "tool_call_started",
            "tool_call_completed",
            "model_step_started",
            "assistant_message",
            "turn_complete"
        ]
    );
    assert_eq!(rest[0].submission_id.as_deref(), Some(decision.id.as_str()));
    assert_eq!(
        tool_results(&rest),
        [("w1".to_owned(), "write run 1".to_owned(), false)]
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_denied_call_is_answered_denied_by_user_and_the_turn_goes_on() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![ModelOutput::default().with_tool_calls(vec![call("w1", "write")])]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set)).await;
    agent.sender().submit(user("write it")).expect("submit");
    read_to(&mut agent, "approval_requested").await;
    agent
        .sender()
        .submit(approve("w1", ApprovalDecision::Deny))
        .expect("deny");
    let rest = read_turn(&mut agent).await;
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0, "a denied call never runs");
    let answered = tool_results(&rest);
    assert!(
        answered[0].2 && answered[0].1.starts_with("denied by user"),
        "{answered:?}"
    );
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    // The model's next step saw the denial.
    let history = &model.seen()[1].history;
    assert!(history.iter().any(|item| matches!(item, TranscriptItem::ToolResult { output, is_error: true, .. } if output.starts_with("denied by user"))));
    shutdown(agent).await;
}

#[tokio::test]
async fn approve_for_session_stops_asking_even_after_a_restart() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("w1", "write")]),
        ModelOutput::text("first done"),
        ModelOutput::default().with_tool_calls(vec![call("w2", "write")]),
        ModelOutput::text("second done"),
    ]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set.clone())).await;
    agent.sender().submit(user("one")).expect("submit");
    read_to(&mut agent, "approval_requested").await;
    agent
        .sender()
        .submit(approve("w1", ApprovalDecision::ApproveForSession))
        .expect("approve");
    read_turn(&mut agent).await;
    shutdown(agent).await;

    // A new runtime on the same session: `write` no longer asks.
    let reopened = db.open();
    let mut agent = start_with(config(&db, &reopened, model, tools.set)).await;
    agent.sender().submit(user("two")).expect("submit");
    let turn = read_turn(&mut agent).await;
    assert!(!kinds(&turn).contains(&"approval_requested"), "{:?}", kinds(&turn));
    assert_eq!(tools.runs.load(Ordering::SeqCst), 2);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_deny_policy_refuses_without_asking_and_an_auto_policy_runs_without_asking() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("w1", "write"), call("l1", "look")]),
    ]);
    let mut config = config(&db, &store, model, tools.set);
    config.approvals = ApprovalRules {
        default: None,
        tools: [("write".to_owned(), ApprovalPolicy::Deny)].into(),
    };
    let mut agent = start_with(config).await;
    agent.sender().submit(user("go")).expect("submit");
    let turn = read_turn(&mut agent).await;
    assert!(!kinds(&turn).contains(&"approval_requested"));
    let answered = tool_results(&turn);
    assert_eq!(answered[0].0, "w1");
    assert!(
        answered[0].2 && answered[0].1.starts_with("denied by policy"),
        "{answered:?}"
    );
    assert_eq!(answered[1], ("l1".to_owned(), "look run 1".to_owned(), false));
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1, "only the reading tool ran");
    shutdown(agent).await;
}

#[tokio::test]
async fn an_interrupt_while_waiting_for_approval_denies_and_aborts() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("l1", "look"), call("w1", "write")]),
    ]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set)).await;
    agent.sender().submit(user("go")).expect("submit");
    read_to(&mut agent, "approval_requested").await;
    agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("interrupt");
    let rest = read_turn(&mut agent).await;
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0, "nothing ran");
    let answered = tool_results(&rest);
    assert_eq!(answered.len(), 2, "both calls are answered: {answered:?}");
    assert_eq!(answered[0].1, "not run: the turn was interrupted");
    assert!(answered[1].1.starts_with("denied by user"));
    assert_eq!(abort_of(&rest).0, AbortReason::Interrupted);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_pending_approval_survives_a_restart_and_the_same_decision_completes_the_turn() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![ModelOutput::default().with_tool_calls(vec![call("w1", "write")])]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set.clone())).await;
    agent.sender().submit(user("write it")).expect("submit");
    let before = read_to(&mut agent, "approval_requested").await;
    let turn_id = started_turn_id(&before);
    drop(agent);

    let reopened = db.open();
    let mut agent = start_with(config(&db, &reopened, model.clone(), tools.set)).await;
    let started = next(&mut agent).await;
    let EventMsg::SessionStarted(session) = &started.msg else {
        panic!("expected session_started")
    };
    assert_eq!(session.pending_approvals, ["w1"]);
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0);

    agent
        .sender()
        .submit(approve("w1", ApprovalDecision::Approve))
        .expect("approve");
    let rest = read_turn(&mut agent).await;
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1, "the call ran exactly once");
    assert!(
        rest.iter().all(|event| event.msg.turn_id() == Some(turn_id.as_str())),
        "the same turn goes on"
    );
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    assert_eq!(model.seen().len(), 2, "the model was asked again with the result");
    shutdown(agent).await;
    let log = stored_events(&reopened, SESSION).await;
    assert_gapless(&log, 1);
    assert_eq!(log.iter().filter(|event| event.msg.ends_turn()).count(), 1);
}

#[tokio::test]
async fn approvals_for_unknown_calls_or_no_turn_are_rejected() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let model = scripted(vec![ModelOutput::default().with_tool_calls(vec![call("w1", "write")])]);
    let mut agent = start_with(config(&db, &store, model, tools.set)).await;
    next(&mut agent).await;
    let idle = agent
        .sender()
        .submit(approve("nope", ApprovalDecision::Approve))
        .expect("submit");
    let rejected = next(&mut agent).await;
    assert_eq!(rejected.submission_id.as_deref(), Some(idle.id.as_str()));
    assert!(matches!(&rejected.msg, EventMsg::SubmissionRejected(r) if r.reason.contains("nope")));

    agent.sender().submit(user("write it")).expect("submit");
    read_to(&mut agent, "approval_requested").await;
    let stray = agent
        .sender()
        .submit(approve("w9", ApprovalDecision::Approve))
        .expect("submit");
    let rejected = next(&mut agent).await;
    assert_eq!(rejected.submission_id.as_deref(), Some(stray.id.as_str()));
    assert_eq!(rejected.msg.kind(), "submission_rejected");
    agent
        .sender()
        .submit(approve("w1", ApprovalDecision::Approve))
        .expect("approve");
    read_turn(&mut agent).await;
    shutdown(agent).await;
}

#[tokio::test]
async fn parallel_safe_calls_run_together_and_their_results_keep_the_call_order() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(false);
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("a", "look"), call("b", "peek")]),
    ]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set)).await;
    let entered = tools.entered.notified();
    tokio::pin!(entered);
    entered.as_mut().enable();
    agent.sender().submit(user("look and peek")).expect("submit");
    // Both calls start while neither can finish: they run together.
    while tools.runs.load(Ordering::SeqCst) < 2 {
        guard("both calls start", entered.as_mut()).await;
        entered.set(tools.entered.notified());
        entered.as_mut().enable();
    }
    tools.gate.add_permits(2);
    let turn = read_turn(&mut agent).await;
    let answered: Vec<String> = tool_results(&turn).into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(answered, ["a", "b"], "results in the order of the calls");
    let history = &model.seen()[1].history;
    let order: Vec<&str> = history
        .iter()
        .filter_map(|item| match item {
            TranscriptItem::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(order, ["a", "b"]);
    shutdown(agent).await;
}

#[tokio::test]
async fn calls_that_are_not_all_parallel_safe_run_one_after_the_other() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(false);
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("a", "look"), call("w", "write")]),
    ]);
    let mut config = config(&db, &store, model, tools.set);
    config.approvals = ApprovalRules::auto();
    let mut agent = start_with(config).await;
    agent.sender().submit(user("look then write")).expect("submit");
    read_to(&mut agent, "tool_call_started").await;
    // The first call runs alone: the second has not started.
    guard("the first call starts", async {
        while tools.runs.load(Ordering::SeqCst) < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        tools.runs.load(Ordering::SeqCst),
        1,
        "the second call waits for the first"
    );
    tools.gate.add_permits(2);
    let turn = read_turn(&mut agent).await;
    let answered: Vec<String> = tool_results(&turn).into_iter().map(|(id, _, _)| id).collect();
    assert_eq!(answered, ["a", "w"]);
    assert_eq!(tools.runs.load(Ordering::SeqCst), 2);
    shutdown(agent).await;
}

/// A call whose start is stored is never started again in its turn. Here
/// a runtime committed `look`'s start but never heard so (the connection
/// was lost during its commit, which happened) and stopped; the turn's
/// state says `look` started and `write` still waits for approval. The
/// turn goes on when `write` is approved: `write` runs, and `look` is
/// answered as a call that may have run, not started a second time (outside
/// testing saw one `tool_call_started` twice in a turn, no boundary between).
#[tokio::test]
async fn a_call_whose_start_is_stored_is_never_started_again_in_its_turn() {
    let db = TestDb::new();
    let store = db.open();
    let tools = tools(true);
    let step = ModelOutput::default().with_tool_calls(vec![call("w1", "write"), call("l1", "look")]);
    let model = scripted(vec![step]);
    let mut agent = start_with(config(&db, &store, model.clone(), tools.set.clone())).await;
    agent.sender().submit(user("write and look")).expect("submit");
    let before = read_to(&mut agent, "approval_requested").await;
    let turn_id = started_turn_id(&before);
    drop(agent);

    // What the lost commit had stored: `look` started, with the turn's
    // state saying so.
    let reopened = db.open();
    let state = keel::CheckpointStore::load(&*reopened, SESSION)
        .await
        .expect("load")
        .expect("the session");
    let mut execution = state.execution.expect("the turn in flight");
    assert_eq!(execution.awaiting_approval, ["w1"]);
    execution.started_calls = Some(vec!["l1".to_owned()]);
    let started = Event {
        submission_id: None,
        msg: EventMsg::ToolCallStarted(ToolCallStartedEvent {
            turn_id: turn_id.clone(),
            call_id: "l1".into(),
            name: "look".into(),
            arguments: "{}".into(),
        }),
    };
    let batch = keel::store::AppendBatch {
        lease: None,
        events: vec![keel::store::EncodedEvent::encode(&started).expect("encode")],
        checkpoint: Some(keel::store::CheckpointWrite {
            checkpoint: state.checkpoint,
            transcript_delta: Vec::new(),
            execution: Some(execution),
            history_cut: None,
        }),
    };
    keel::store::CheckpointStoreExt::append(&*reopened, SESSION, batch)
        .await
        .expect("the start the lost commit stored");

    let mut agent = start_with(config(&db, &reopened, model.clone(), tools.set)).await;
    agent
        .sender()
        .submit(approve("w1", ApprovalDecision::Approve))
        .expect("approve");
    let rest = read_turn(&mut agent).await;
    assert!(matches!(
        rest.last().map(|event| &event.msg),
        Some(EventMsg::TurnComplete(_))
    ));
    assert_eq!(
        tools.runs.load(Ordering::SeqCst),
        1,
        "write ran; look did not run again"
    );
    shutdown(agent).await;
    let log = stored_events(&reopened, SESSION).await;
    assert_gapless(&log, 1);
    let starts: Vec<&str> = log
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallStarted(call) => Some(call.call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(starts, ["l1", "w1"], "each call started once");
    let look = log
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) if done.call_id == "l1" => Some(done),
            _ => None,
        })
        .expect("look answered");
    assert!(
        look.is_error && look.output.contains("may or may not have completed"),
        "{look:?}"
    );
}
