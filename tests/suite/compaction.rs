//! Context compaction with the scripted model playing the summarizer: at
//! the threshold, on request, across a restart, and cut by a crash; and the
//! tokens a long conversation sends per turn with and without it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use keel::agent::{
    AgentConfig, BoxFuture, ContextLimits, ModelEventSink, ModelOutput, ModelRequest, RequestPurpose, SUMMARY_PREFIX,
    SUMMARY_PROMPT, StreamingOptions,
};
use keel::model::ScriptedModel;
use keel::protocol::{CompactionReason, ContextCompactedEvent, EventMsg, Op, RecordedEvent, TranscriptItem};
use keel::store::SqliteCheckpoint;
use keel::{Agent, CheckpointStore, Model};
use tokio::sync::Notify;

use crate::suite::support::{agent::*, store::*, wait::*};

const SESSION: &str = "compaction-session";

/// A model that records what it was asked, then lets `inner` answer; a
/// summary request waits forever when `hang_summaries` is set.
struct Recording {
    inner: ScriptedModel,
    seen: Mutex<Vec<(RequestPurpose, Vec<TranscriptItem>)>>,
    hang_summaries: bool,
    summarizing: Notify,
}

impl Recording {
    fn new(script: &str, db: &TestDb, hang_summaries: bool) -> Arc<Self> {
        let path = db.workspace().join(format!("script-{}.jsonl", std::process::id()));
        std::fs::write(&path, script).expect("write the script");
        Arc::new(Self {
            inner: ScriptedModel::load(&path).expect("load the script"),
            seen: Mutex::new(Vec::new()),
            hang_summaries,
            summarizing: Notify::new(),
        })
    }

    fn seen(&self) -> Vec<(RequestPurpose, Vec<TranscriptItem>)> {
        self.seen.lock().expect("seen lock").clone()
    }
}

impl Model for Recording {
    fn respond<'a>(
        &'a self,
        request: ModelRequest<'a>,
        events: ModelEventSink,
    ) -> BoxFuture<'a, keel::Result<ModelOutput>> {
        self.seen
            .lock()
            .expect("seen lock")
            .push((request.purpose, request.history.to_vec()));
        if self.hang_summaries && request.purpose == RequestPurpose::Summary {
            self.summarizing.notify_one();
            return Box::pin(std::future::pending());
        }
        self.inner.respond(request, events)
    }
}

/// The session's configuration: `model` with a `window`-token context at
/// the default threshold, every delta its own event.
fn config_with(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<Recording>, window: u64) -> AgentConfig {
    let mut config = session_config(db, SESSION, store, model);
    config.streaming = StreamingOptions::per_delta();
    config.context_limits = Some(ContextLimits { window, threshold: 0.8 });
    config
}

async fn agent_with(db: &TestDb, store: &Arc<SqliteCheckpoint>, model: Arc<Recording>, window: u64) -> Agent {
    start_session(config_with(db, store, model, window)).await
}

fn compactions(events: &[RecordedEvent]) -> Vec<ContextCompactedEvent> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ContextCompacted(compacted) => Some(compacted.clone()),
            _ => None,
        })
        .collect()
}

fn text(item: &TranscriptItem) -> &str {
    match item {
        TranscriptItem::UserMessage { text }
        | TranscriptItem::AssistantMessage { text, .. }
        | TranscriptItem::Summary { text } => text,
        _ => "",
    }
}

/// A message of about `bytes` bytes, numbered.
fn long(number: usize, bytes: usize) -> String {
    format!("message {number}: {}", "lorem ipsum ".repeat(bytes / 12))
}

#[tokio::test]
async fn past_the_threshold_the_model_gets_the_summary_and_the_latest_message_even_after_a_restart() {
    let db = TestDb::new();
    let store = db.open();
    let answer = "a".repeat(200);
    let script = format!(
        "{{\"text\": \"{answer}\"}}\n{{\"text\": \"the user sent two long messages\", \"summary\": true}}\n\
         {{\"text\": \"second\"}}\n{{\"text\": \"third\"}}\n"
    );
    let model = Recording::new(&script, &db, false);
    // 100 tokens, compacted past 80 (320 bytes): the second turn passes it.
    let mut agent = agent_with(&db, &store, Arc::clone(&model), 100).await;
    let first = run_turn(&mut agent, &long(1, 200)).await;
    assert!(compactions(&first).is_empty());
    let second = run_turn(&mut agent, &long(2, 200)).await;
    let compacted = compactions(&second);
    assert_eq!(compacted.len(), 1, "{second:?}");
    let compacted = &compacted[0];
    assert_eq!(compacted.reason, CompactionReason::Threshold);
    assert_eq!(compacted.summary, "the user sent two long messages");
    assert_eq!((compacted.replaced_from, compacted.replaced_to), (0, 2));
    assert!(compacted.tokens_after < compacted.tokens_before, "{compacted:?}");
    assert!(compacted.turn_id.is_some());

    let seen = model.seen();
    assert_eq!(seen.len(), 3);
    let (purpose, summary_history) = &seen[1];
    assert_eq!(*purpose, RequestPurpose::Summary);
    assert_eq!(summary_history.len(), 3);
    assert_eq!(text(&summary_history[0]), long(1, 200));
    assert_eq!(text(&summary_history[1]), answer);
    assert_eq!(text(&summary_history[2]), SUMMARY_PROMPT);
    let (_, step_history) = &seen[2];
    assert_eq!(step_history.len(), 2);
    assert!(
        text(&step_history[0]).starts_with(SUMMARY_PREFIX) && text(&step_history[0]).ends_with("two long messages")
    );
    // Model-written text, sent as context: never in the user's voice.
    assert!(
        matches!(step_history[0], TranscriptItem::Summary { .. }),
        "{:?}",
        step_history[0]
    );
    assert_eq!(text(&step_history[1]), long(2, 200));
    shutdown(agent).await;

    // The compaction was saved with its event: a new runtime sends the
    // summary too, and the full history is still stored.
    let store = db.open();
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(state.transcript.len(), 4);
    let mut agent = agent_with(&db, &store, Arc::clone(&model), 100_000).await;
    run_turn(&mut agent, "short").await;
    let (_, resumed_history) = model.seen().pop().expect("a request");
    assert!(text(&resumed_history[0]).starts_with(SUMMARY_PREFIX));
    assert!(matches!(resumed_history[0], TranscriptItem::Summary { .. }));
    assert_eq!(text(&resumed_history[1]), long(2, 200));
    assert_eq!(resumed_history.len(), 4);
    shutdown(agent).await;
}

#[tokio::test]
async fn a_compaction_cut_by_a_crash_leaves_no_trace_and_is_redone() {
    let db = TestDb::new();
    let store = db.open();
    let script = "{\"text\": \"first\"}\n{\"text\": \"sum\", \"summary\": true}\n{\"text\": \"second\"}\n";
    let model = Recording::new(script, &db, true);
    let mut agent = agent_with(&db, &store, Arc::clone(&model), 100).await;
    run_turn(&mut agent, &long(1, 400)).await;
    agent.sender().submit(user(&long(2, 400))).expect("submit");
    // Delivered means stored: the turn is in the log when the crash comes.
    read_until(&mut agent, |event| event.msg.kind() == "user_message").await;
    guard("the summary request", model.summarizing.notified()).await;
    // The process dies while the model summarizes.
    drop(agent);

    let store = db.open();
    let state = guard("load", store.load(SESSION))
        .await
        .expect("load")
        .expect("session");
    assert_eq!(state.checkpoint.compaction, None, "nothing of the compaction was saved");
    let model = Recording::new(script, &db, false);
    let mut agent = start_with(config_with(&db, &store, Arc::clone(&model), 100)).await;
    let opened = read_until(&mut agent, |event| event.msg.kind() == "turn_aborted").await;
    assert!(compactions(&opened).is_empty());
    // The next turn compacts afresh, from the same script position.
    let events = run_turn(&mut agent, "again").await;
    let compacted = compactions(&events);
    assert_eq!(compacted.len(), 1, "{events:?}");
    assert_eq!(compacted[0].summary, "sum");
    shutdown(agent).await;
}

#[tokio::test]
async fn the_compact_op_compacts_between_turns_or_says_why_not() {
    let db = TestDb::new();
    let store = db.open();
    let script = "{\"text\": \"one\", \"usage\": {\"input_tokens\": 10, \"output_tokens\": 2}}\n\
                  {\"text\": \"two\"}\n\
                  {\"text\": \"asked for\", \"summary\": true, \"usage\": {\"input_tokens\": 50, \"output_tokens\": 7}}\n";
    let model = Recording::new(script, &db, false);
    let mut agent = agent_with(&db, &store, Arc::clone(&model), 1_000_000).await;
    let nothing = agent.sender().submit(Op::Compact).expect("submit compact");
    let rejected = read_until(&mut agent, |event| event.msg.kind() == "submission_rejected").await;
    assert_eq!(
        rejected.last().and_then(|event| event.submission_id.clone()),
        Some(nothing.id)
    );
    run_turn(&mut agent, "hello").await;
    run_turn(&mut agent, "again").await;
    let submitted = agent.sender().submit(Op::Compact).expect("submit compact");
    let event = next(&mut agent).await;
    assert_eq!(event.submission_id, Some(submitted.id));
    let EventMsg::ContextCompacted(compacted) = &event.msg else {
        panic!("{event:?}");
    };
    assert_eq!(compacted.reason, CompactionReason::Requested);
    assert_eq!(compacted.turn_id, None);
    assert_eq!((compacted.summary.as_str(), compacted.replaced_to), ("asked for", 2));
    // The summary request's tokens count in the session's usage.
    let summary_usage = compacted.usage.expect("the summary's usage");
    assert_eq!((summary_usage.input_tokens, summary_usage.output_tokens), (50, 7));
    shutdown(agent).await;
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(
        (
            state.checkpoint.usage.input_tokens,
            state.checkpoint.usage.output_tokens
        ),
        (60, 9)
    );
}

/// Not a check of speed: prints the prompt tokens (estimated, four bytes a
/// token) of each turn of a 40-turn conversation with and without
/// compaction, and the time compacting took, for the record.
#[tokio::test]
async fn measure_tokens_sent_per_turn_on_a_long_conversation() {
    const TURNS: usize = 40;
    let mut figures = Vec::new();
    for window in [None, Some(4_000u64)] {
        let db = TestDb::new();
        let store = db.open();
        let mut script = String::new();
        for turn in 0..TURNS {
            script.push_str(&format!("{{\"text\": \"{}\"}}\n", long(turn, 600)));
            script.push_str("{\"text\": \"A summary of the conversation so far, a few hundred bytes long. ");
            script.push_str(&"Facts kept. ".repeat(30));
            script.push_str("\", \"summary\": true}\n");
        }
        let model = Recording::new(&script, &db, false);
        let mut agent = agent_with(&db, &store, Arc::clone(&model), window.unwrap_or(10_000_000)).await;
        let started = Instant::now();
        let mut compacting_ms = 0;
        let mut compactions_made = 0;
        for number in 0..TURNS {
            let events = run_turn(&mut agent, &long(number, 600)).await;
            for compacted in compactions(&events) {
                compacting_ms += compacted.duration_ms;
                compactions_made += 1;
            }
        }
        let elapsed = started.elapsed();
        let per_turn: Vec<u64> = model
            .seen()
            .iter()
            .filter(|(purpose, _)| *purpose == RequestPurpose::Turn)
            .map(|(_, history)| history.iter().map(|item| text(item).len() as u64).sum::<u64>() / 4)
            .collect();
        println!(
            "window {window:?}: prompt tokens per turn {per_turn:?}; total {}; {compactions_made} compactions taking {compacting_ms} ms; whole run {} ms",
            per_turn.iter().sum::<u64>(),
            elapsed.as_millis()
        );
        figures.push((per_turn, compactions_made));
        shutdown(agent).await;
    }
    let (unbounded, _) = &figures[0];
    let (bounded, made) = &figures[1];
    assert!(*made > 0);
    assert!(bounded.iter().all(|tokens| *tokens <= 4_000), "{bounded:?}");
    assert!(unbounded.last() > bounded.last());
}

#[tokio::test]
async fn an_interrupt_while_the_model_summarizes_ends_the_turn_without_compacting() {
    let db = TestDb::new();
    let store = db.open();
    let script = "{\"text\": \"first\"}\n{\"text\": \"sum\", \"summary\": true}\n{\"text\": \"second\"}\n";
    let model = Recording::new(script, &db, true);
    let mut agent = agent_with(&db, &store, Arc::clone(&model), 100).await;
    run_turn(&mut agent, &long(1, 400)).await;
    agent.sender().submit(user(&long(2, 400))).expect("submit");
    guard("the summary request", model.summarizing.notified()).await;
    let interrupt = agent
        .sender()
        .submit(Op::Interrupt { turn_id: None })
        .expect("submit the interrupt");
    let events = read_turn(&mut agent).await;
    let last = events.last().expect("the turn's end");
    let EventMsg::TurnAborted(aborted) = &last.msg else {
        panic!("{events:?}");
    };
    assert_eq!(aborted.reason, keel::protocol::AbortReason::Interrupted);
    assert_eq!(last.submission_id, Some(interrupt.id));
    assert!(compactions(&events).is_empty());
    let state = store.load(SESSION).await.expect("load").expect("session");
    assert_eq!(state.checkpoint.compaction, None);
    shutdown(agent).await;
}
