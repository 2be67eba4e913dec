//! Turns with tool calls: the step cycle, bad calls, the step limit,
//! interrupts during tool calls, token usage, and calls cut short by a crash.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel::agent::{AgentConfig, BoxFuture, ModelEvent, ModelOutput, StreamingOptions, ToolCall, ToolSpec};
use keel::protocol::*;
use keel::tools::{ApprovalRules, Tool, ToolContext, ToolError, ToolSet};
use keel::{CheckpointStore, Op};
use tokio::sync::Notify;

use crate::suite::support::{agent::*, events::*, model::*, store::*, wait::*};

const SESSION: &str = "tools-session";

fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
    ToolCall {
        call_id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    }
}

fn usage(input: u64, output: u64) -> TokenUsage {
    TokenUsage {
        input_tokens: input,
        output_tokens: output,
        ..TokenUsage::default()
    }
}

/// A model that answers each call with the next output of `script`, then
/// with "done".
fn scripted(script: Vec<ModelOutput>) -> Arc<TestModel> {
    TestModel::new(move |call| {
        let output = script
            .get(call.call_index as usize)
            .cloned()
            .unwrap_or_else(|| ModelOutput::text("done"));
        Box::pin(async move {
            if !output.text.is_empty() {
                (call.sink)(ModelEvent::TextDelta(output.text.clone()))?;
            }
            Ok(output)
        })
    })
}

fn config(db: &TestDb, store: &Arc<keel::store::SqliteCheckpoint>, model: Arc<dyn keel::Model>) -> AgentConfig {
    let mut config = session_config(db, SESSION, store, model);
    config.tools = ToolSet::builtin();
    // These tests are about running calls; approvals have their own.
    config.approvals = ApprovalRules::auto();
    config.streaming = StreamingOptions::per_delta();
    config
}

#[tokio::test]
async fn tool_calls_run_and_their_results_go_back_to_the_model_in_order() {
    let db = TestDb::new();
    let store = db.open();
    let model = scripted(vec![
        ModelOutput::text("Let me look.").with_tool_calls(vec![
            call("a", "clock", "{}"),
            call("b", "clock", r#"{"timezone": tru"#),
            call("c", "teleport", "{}"),
        ]),
        ModelOutput::text("It is late."),
    ]);
    let mut config = config(&db, &store, model.clone());
    config.instructions = Some("Be brief.".into());
    let mut agent = start_with(config).await;
    agent.sender().submit(user("what time is it?")).expect("submit");
    let events = read_turn(&mut agent).await;

    assert_eq!(
        kinds(&events),
        [
            "session_started",
            "turn_started",
            "user_message",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "tool_call_started",
            "tool_call_completed",
            "tool_call_started",
            "tool_call_completed",
            "tool_call_started",
            "tool_call_completed",
            "model_step_started",
            "assistant_content_delta",
            "assistant_message",
            "turn_complete",
        ]
    );
    let results = tool_results(&events);
    assert_eq!(results.len(), 3);
    assert!(!results[0].2 && results[0].1.contains("\"utc\""), "{results:?}");
    assert!(
        results[1].2 && results[1].1.contains("invalid arguments for 'clock'"),
        "{results:?}"
    );
    assert!(
        results[2].2 && results[2].1.contains("unknown tool 'teleport'"),
        "{results:?}"
    );

    let seen = model.seen();
    assert_eq!(seen[0].tools, ["clock"]);
    assert_eq!(seen[0].instructions.as_deref(), Some("Be brief."));
    let second = &seen[1].history;
    assert_eq!(
        second[..5],
        [
            user_item("what time is it?"),
            assistant_item("Let me look.", false),
            TranscriptItem::ToolCall {
                call_id: "a".into(),
                name: "clock".into(),
                arguments: "{}".into()
            },
            TranscriptItem::ToolCall {
                call_id: "b".into(),
                name: "clock".into(),
                arguments: r#"{"timezone": tru"#.into()
            },
            TranscriptItem::ToolCall {
                call_id: "c".into(),
                name: "teleport".into(),
                arguments: "{}".into()
            },
        ]
    );
    let answered: Vec<&str> = second[5..]
        .iter()
        .map(|item| match item {
            TranscriptItem::ToolResult { call_id, .. } => call_id.as_str(),
            other => panic!("expected tool results, got {other:?}"),
        })
        .collect();
    assert_eq!(answered, ["a", "b", "c"]);

    // The stored history is what the model saw, plus the final answer.
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(state.transcript[..8], second[..]);
    assert_eq!(state.transcript[8], assistant_item("It is late.", false));
    assert_eq!(state.execution, None);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_model_that_keeps_calling_tools_stops_at_the_step_limit_and_the_turn_completes() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::new(|call| {
        Box::pin(async move {
            Ok(ModelOutput::default().with_tool_calls(vec![ToolCall {
                call_id: format!("call-{}", call.call_index),
                name: "clock".into(),
                arguments: "{}".into(),
            }]))
        })
    });
    let mut config = config(&db, &store, model.clone());
    config.max_steps = 3;
    let mut agent = start_with(config).await;
    agent.sender().submit(user("loop")).expect("submit");
    let events = read_turn(&mut agent).await;
    let steps = kinds(&events)
        .iter()
        .filter(|kind| **kind == "model_step_started")
        .count();
    assert_eq!(steps, 3);
    assert_eq!(tool_results(&events).len(), 3, "every call got its result");
    let tail = &events[events.len() - 2..];
    assert!(
        matches!(&tail[0].msg, EventMsg::Error(error) if error.message.contains("limit of 3 model steps")),
        "{tail:?}"
    );
    assert!(matches!(tail[1].msg, EventMsg::TurnComplete(_)));
    assert_eq!(model.seen().len(), 3);
    shutdown(agent).await;
}

/// A tool that waits until released, counting its runs.
struct Gate {
    entered: Arc<Notify>,
    release: Arc<Notify>,
    runs: Arc<AtomicUsize>,
}

impl Tool for Gate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "gate".into(),
            description: "waits".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    fn call<'a>(
        &'a self,
        _arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::SeqCst);
            self.entered.notify_one();
            self.release.notified().await;
            Ok("opened".into())
        })
    }
}

fn gate() -> (Arc<Gate>, Arc<Notify>, Arc<AtomicUsize>) {
    let entered = Arc::new(Notify::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Gate {
        entered: Arc::clone(&entered),
        release: Arc::new(Notify::new()),
        runs: Arc::clone(&runs),
    });
    (gate, entered, runs)
}

#[tokio::test]
async fn an_interrupt_during_a_tool_call_answers_every_call_and_aborts_the_turn() {
    let db = TestDb::new();
    let store = db.open();
    let (gate, entered, runs) = gate();
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("g1", "gate", "{}"), call("g2", "gate", "{}")]),
    ]);
    let mut config = config(&db, &store, model.clone());
    config.tools.add(gate);
    let mut agent = start_with(config).await;
    agent.sender().submit(user("open the gates")).expect("submit");
    guard("the tool runs", entered.notified()).await;
    let interrupt = agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("interrupt");
    let events = read_turn(&mut agent).await;

    assert_eq!(runs.load(Ordering::SeqCst), 1, "the second call never ran");
    let results = tool_results(&events);
    assert_eq!(
        results,
        [
            ("g1".to_owned(), "interrupted by the user".to_owned(), true),
            ("g2".to_owned(), "not run: the turn was interrupted".to_owned(), true),
        ]
    );
    let last = events.last().expect("events");
    assert_eq!(last.submission_id.as_deref(), Some(interrupt.id.as_str()));
    assert_eq!(abort_of(&events).0, AbortReason::Interrupted);

    // The next turn's history answers both calls.
    agent.sender().submit(user("never mind")).expect("submit");
    read_turn(&mut agent).await;
    let history = &model.seen()[1].history;
    let answered = history
        .iter()
        .filter(|item| matches!(item, TranscriptItem::ToolResult { .. }))
        .count();
    assert_eq!(answered, 2, "{history:?}");
    shutdown(agent).await;
}

#[tokio::test]
async fn token_usage_is_recorded_per_step_and_summed_in_the_checkpoint() {
    let db = TestDb::new();
    let store = db.open();
    let model = scripted(vec![
        ModelOutput::default()
            .with_tool_calls(vec![call("a", "clock", "{}")])
            .with_usage(usage(100, 10)),
        ModelOutput::text("ok").with_usage(usage(150, 20)),
        ModelOutput::text("again").with_usage(usage(200, 5)),
    ]);
    let mut agent = start_with(config(&db, &store, model)).await;
    agent.sender().submit(user("one")).expect("submit");
    let mut events = read_turn(&mut agent).await;
    agent.sender().submit(user("two")).expect("submit");
    events.extend(read_turn(&mut agent).await);
    let totals: Vec<(u32, TokenUsage, TokenUsage)> = events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::TokenUsage(used) => Some((used.step, used.usage, used.session_total)),
            _ => None,
        })
        .collect();
    assert_eq!(
        totals,
        [
            (1, usage(100, 10), usage(100, 10)),
            (2, usage(150, 20), usage(250, 30)),
            (1, usage(200, 5), usage(450, 35)),
        ]
    );
    shutdown(agent).await;
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(state.checkpoint.usage, usage(450, 35));
}

#[tokio::test]
async fn a_tool_call_cut_short_by_a_stopped_runtime_gets_an_interrupted_result_on_resume() {
    let db = TestDb::new();
    let store = db.open();
    let (gate, entered, runs) = gate();
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("g1", "gate", "{}")]),
    ]);
    let mut config = config(&db, &store, model.clone());
    config.tools.add(gate);
    let agent = start_with(config.clone()).await;
    agent.sender().submit(user("open")).expect("submit");
    guard("the tool runs", entered.notified()).await;
    // The runtime stops while the tool runs (a crash, as far as the store knows).
    drop(agent);

    let reopened_store = db.open();
    let mut reopened = config.clone();
    reopened.store = reopened_store.clone();
    let mut agent = start_with(reopened).await;
    let events = read_turn(&mut agent).await;
    assert_eq!(
        kinds(&events),
        ["session_started", "tool_call_completed", "turn_aborted"],
        "the call is answered, then the turn closed"
    );
    let results = tool_results(&events);
    assert_eq!(results[0].0, "g1");
    assert!(
        results[0].2 && results[0].1.starts_with("interrupted: the runtime stopped"),
        "{results:?}"
    );
    assert_eq!(abort_of(&events).0, AbortReason::RuntimeStopped);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the call was not run again");

    agent.sender().submit(user("still there?")).expect("submit");
    read_turn(&mut agent).await;
    let seen = model.seen();
    let history = &seen.last().expect("a request").history;
    assert!(
        history
            .iter()
            .any(|item| matches!(item, TranscriptItem::ToolResult { call_id, is_error: true, .. } if call_id == "g1")),
        "{history:?}"
    );
    shutdown(agent).await;
}

/// A step that completed (its text recorded, its call started) before the
/// runtime stopped is not taken for text cut mid-stream: on resume its text
/// stays in the history once, not again as an interrupted message.
#[tokio::test]
async fn a_crash_during_a_tool_call_does_not_repeat_the_steps_text_as_cut() {
    let db = TestDb::new();
    let store = db.open();
    let (gate, entered, _runs) = gate();
    let model = scripted(vec![
        ModelOutput::text("Let me check.").with_tool_calls(vec![call("g1", "gate", "{}")]),
    ]);
    let mut config = config(&db, &store, model.clone());
    config.tools.add(gate);
    let agent = start_with(config.clone()).await;
    agent.sender().submit(user("open")).expect("submit");
    guard("the tool runs", entered.notified()).await;
    drop(agent);

    let reopened_store = db.open();
    let mut reopened = config.clone();
    reopened.store = reopened_store.clone();
    let mut agent = start_with(reopened).await;
    let events = read_turn(&mut agent).await;
    assert_eq!(abort_of(&events).0, AbortReason::RuntimeStopped);
    shutdown(agent).await;
    let state = reopened_store.load(SESSION).await.expect("load").expect("session");
    let messages: Vec<&TranscriptItem> = state
        .transcript
        .iter()
        .filter(|item| matches!(item, TranscriptItem::AssistantMessage { .. }))
        .collect();
    assert_eq!(
        messages,
        [&assistant_item("Let me check.", false)],
        "{:?}",
        state.transcript
    );
}

#[tokio::test]
async fn reasoning_items_join_the_history_before_the_answer() {
    let db = TestDb::new();
    let store = db.open();
    let reasoning = TranscriptItem::Reasoning {
        provider: "openai-responses".into(),
        data: serde_json::json!({"type": "reasoning", "id": "rs_1", "encrypted_content": "opaque"}),
    };
    let model = scripted(vec![
        ModelOutput::text("forty-two").with_reasoning(vec![reasoning.clone()]),
    ]);
    let mut agent = start_with(config(&db, &store, model)).await;
    agent.sender().submit(user("the answer?")).expect("submit");
    read_turn(&mut agent).await;
    shutdown(agent).await;
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(
        state.transcript,
        [user_item("the answer?"), reasoning, assistant_item("forty-two", false)]
    );
}

/// A tool that counts its runs.
struct Counter(Arc<AtomicUsize>);

impl Tool for Counter {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "count".into(),
            description: "counts".into(),
            parameters: serde_json::json!({"type": "object"}),
        }
    }

    fn call<'a>(
        &'a self,
        _arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok("counted".into())
        })
    }
}

/// With several nodes, a node whose lease may have lapsed (the process was
/// paused, its renewals stalled) starts no tool call, though its writes
/// still go through: another node may hold the session by now. Its runtime
/// stops with the call started but not run, and the next opening closes the
/// turn saying so. While the lease is renewed, calls run.
#[tokio::test]
async fn no_tool_call_starts_under_a_lease_that_may_have_lapsed() {
    let db = TestDb::new();
    let store = db.open();
    let runs = Arc::new(AtomicUsize::new(0));
    let model = scripted(vec![
        ModelOutput::default().with_tool_calls(vec![call("c1", "count", "{}")]),
        ModelOutput::text("counted once"),
        ModelOutput::default().with_tool_calls(vec![call("c2", "count", "{}")]),
    ]);
    let ttl = std::time::Duration::from_millis(400);
    let clock = keel::agent::LeaseClock::new();
    let mut config = config(&db, &store, model.clone());
    config.tools.add(Arc::new(Counter(Arc::clone(&runs))));
    config.lease_owner = Some(keel::agent::LeaseOwner {
        node: "node-a".into(),
        ttl,
        clock: clock.clone(),
        leases: store.clone(),
    });
    let mut agent = start_with(config.clone()).await;
    agent.sender().submit(user("count")).expect("submit");
    let events = read_turn(&mut agent).await;
    assert_eq!(events.last().map(|event| event.msg.kind()), Some("turn_complete"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a call runs under a fresh lease");

    // Nothing renews the lease for longer than three quarters of it.
    // Kept: the test is about the lease running out with time.
    tokio::time::sleep(ttl).await;
    agent.sender().submit(user("count again")).expect("submit");
    let events = read_to_end(&mut agent).await;
    assert!(
        events
            .iter()
            .any(|event| matches!(&event.msg, EventMsg::ToolCallStarted(call) if call.call_id == "c2")),
        "{:?}",
        kinds(&events)
    );
    assert!(
        !events.iter().any(|event| event.msg.ends_turn()),
        "the stopped runtime closed nothing: {:?}",
        kinds(&events)
    );
    let ended = guard("the runtime's end", agent.shutdown()).await;
    assert!(
        matches!(&ended, Err(keel::Error::Stopped(why)) if why.contains("lease")),
        "{ended:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the call never ran");

    // The next opening (here the same node, with a fresh claim) closes the
    // turn: the call is answered as never run.
    let mut reopened = config.clone();
    reopened.lease_owner = Some(keel::agent::LeaseOwner {
        node: "node-a".into(),
        ttl,
        clock: keel::agent::LeaseClock::new(),
        leases: store.clone(),
    });
    let mut agent = start_with(reopened).await;
    let events = read_turn(&mut agent).await;
    assert_eq!(abort_of(&events).0, AbortReason::RuntimeStopped);
    let results = tool_results(&events);
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0].0, "c2");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "nor after the reopening");
    drop(agent);
}
