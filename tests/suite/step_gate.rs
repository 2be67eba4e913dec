//! The step gate: a host's say before each model step. A turn the gate
//! stops ends with `turn_aborted` reason `budget_exhausted` before calling
//! the model again, after the previous step's events are committed.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use keel::CheckpointStore;
use keel::agent::{BoxFuture, ModelOutput, StepGate, StepVerdict, ToolCall};
use keel::protocol::*;
use keel::tools::{ApprovalRules, ToolSet};

use crate::suite::support::{agent::*, model::*, store::*};

const SESSION: &str = "gated";

/// Lets `allowed` steps run, then stops the turn; checks each time that
/// the last step's usage is already in the store.
struct Allow {
    allowed: usize,
    asked: AtomicUsize,
    store: Arc<dyn CheckpointStore>,
    usage_seen: std::sync::Mutex<Vec<usize>>,
}

impl StepGate for Allow {
    fn before_step<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, StepVerdict> {
        Box::pin(async move {
            let events = self.store.events_after(session_id, 0, 1000).await.expect("events");
            let recorded = events
                .iter()
                .filter(|event| matches!(event.msg, EventMsg::TokenUsage(_)))
                .count();
            self.usage_seen.lock().expect("lock").push(recorded);
            if self.asked.fetch_add(1, Ordering::SeqCst) < self.allowed {
                StepVerdict::Go
            } else {
                StepVerdict::BudgetExhausted("the total_tokens budget of tenant 'acme' is spent (30 of 25)".into())
            }
        })
    }
}

/// A model that asks for the clock at every step, reporting 10 tokens each.
fn looping() -> Arc<TestModel> {
    TestModel::new(|call| {
        let output = ModelOutput::text("again")
            .with_tool_calls(vec![ToolCall {
                call_id: format!("c{}", call.call_index),
                name: "clock".into(),
                arguments: "{}".into(),
            }])
            .with_usage(TokenUsage {
                input_tokens: 7,
                output_tokens: 3,
                ..TokenUsage::default()
            });
        Box::pin(async move { Ok(output) })
    })
}

#[tokio::test]
async fn a_gate_stops_a_running_turn_before_its_next_model_step_with_budget_exhausted() {
    let db = TestDb::new();
    let store = db.open();
    let model = looping();
    let gate = Arc::new(Allow {
        allowed: 2,
        asked: AtomicUsize::new(0),
        store: store.clone() as Arc<dyn CheckpointStore>,
        usage_seen: std::sync::Mutex::new(Vec::new()),
    });
    let mut config = session_config(&db, SESSION, &store, model.clone());
    config.tools = ToolSet::builtin();
    config.approvals = ApprovalRules::auto();
    config.step_gate = Some(gate.clone() as Arc<dyn StepGate>);
    let mut agent = start_with(config).await;
    let events = run_turn(&mut agent, "loop").await;

    // Two steps ran, the third was never asked of the model.
    assert_eq!(model.seen().len(), 2);
    let steps = events
        .iter()
        .filter(|event| matches!(event.msg, EventMsg::ModelStepStarted(_)))
        .count();
    assert_eq!(steps, 2);
    match &events.last().expect("events").msg {
        EventMsg::TurnAborted(aborted) => {
            assert_eq!(aborted.reason, AbortReason::BudgetExhausted);
            assert!(aborted.message.contains("total_tokens"), "{}", aborted.message);
        }
        other => panic!("expected turn_aborted, got {other:?}"),
    }
    // Asked before each step, each time with every earlier step's usage
    // committed.
    assert_eq!(*gate.usage_seen.lock().expect("lock"), [0, 1, 2]);
    // The next turn is asked again (and stopped before its first step).
    let events = run_turn(&mut agent, "more").await;
    assert_eq!(model.seen().len(), 2);
    assert!(matches!(
        &events.last().expect("events").msg,
        EventMsg::TurnAborted(aborted) if aborted.reason == AbortReason::BudgetExhausted
    ));
    shutdown(agent).await;
}

/// A gate that watches nothing is never asked.
struct Blind;

impl StepGate for Blind {
    fn watches(&self, _session_id: &str) -> bool {
        false
    }

    fn before_step<'a>(&'a self, _session_id: &'a str) -> BoxFuture<'a, StepVerdict> {
        Box::pin(async { StepVerdict::BudgetExhausted("never asked".into()) })
    }
}

#[tokio::test]
async fn a_gate_that_watches_nothing_lets_every_step_run() {
    let db = TestDb::new();
    let store = db.open();
    let model = TestModel::chunks(&["hello"]);
    let mut config = session_config(&db, SESSION, &store, model);
    config.step_gate = Some(Arc::new(Blind));
    let mut agent = start_with(config).await;
    let events = run_turn(&mut agent, "hi").await;
    assert!(matches!(&events.last().expect("events").msg, EventMsg::TurnComplete(_)));
    shutdown(agent).await;
}
