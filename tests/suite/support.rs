//! Shared helpers for the integration tests: stores, agents, event readers
//! and test models.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel::agent::{
    AgentConfig, BoxFuture, EventPageRequest, ModelEvent, ModelEventSink, ModelOutput, ModelRequest, SessionContext,
    StreamingOptions,
};
use keel::protocol::{AbortReason, TranscriptItem};
use keel::store::{CheckpointStore, MAX_EVENT_PAGE, SqliteCheckpoint};
use keel::{Agent, EventMsg, Model, Op, RecordedEvent, create_agent};
use tokio::sync::Notify;

/// How long any single wait may take before the test is declared hung.
/// Only a guard against hangs; no test asserts on timing.
pub(crate) const HANG_GUARD: Duration = Duration::from_secs(30);

/// Awaits `future`, failing the test if it does not finish within [`HANG_GUARD`].
pub(crate) async fn guard<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(HANG_GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("hung: {what}"))
}

/// A temporary directory holding one SQLite database file.
pub(crate) struct TestDb {
    dir: tempfile::TempDir,
}

impl TestDb {
    pub(crate) fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temporary directory"),
        }
    }

    /// The database file.
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("keel.sqlite3")
    }

    /// A new store on the database file, as a new process would open it.
    pub(crate) fn open(&self) -> Arc<SqliteCheckpoint> {
        Arc::new(SqliteCheckpoint::new(self.path()).expect("open the store"))
    }

    pub(crate) fn workspace(&self) -> &Path {
        self.dir.path()
    }
}

/// Starts an agent for `session_id` with the given model and streaming options.
pub(crate) async fn start_agent(
    db: &TestDb,
    store: &Arc<SqliteCheckpoint>,
    session_id: &str,
    model: Arc<dyn Model>,
    streaming: StreamingOptions,
) -> Agent {
    let mut config = session_config(db, session_id, store, model);
    config.session_context = SessionContext {
        bot_id: "test-bot".to_owned(),
        ..SessionContext::default()
    };
    config.streaming = streaming;
    start_with(config).await
}

/// Starts an agent from a full configuration.
pub(crate) async fn start_with(config: AgentConfig) -> Agent {
    guard("create_agent", create_agent(config))
        .await
        .expect("create the agent")
}

/// Starts an agent from a full configuration and reads its
/// `session_started` event.
pub(crate) async fn start_session(config: AgentConfig) -> Agent {
    let mut agent = start_with(config).await;
    assert_eq!(next(&mut agent).await.msg.kind(), "session_started");
    agent
}

/// A user message op.
pub(crate) fn user(text: &str) -> Op {
    Op::UserInput { text: text.to_owned() }
}

/// Stops the agent gracefully; it must succeed.
pub(crate) async fn shutdown(agent: Agent) {
    guard("Agent::shutdown", agent.shutdown()).await.expect("shutdown");
}

/// The next delivered event; fails if the stream ended or hung.
pub(crate) async fn next(agent: &mut Agent) -> RecordedEvent {
    guard("next_event", agent.next_event())
        .await
        .expect("the event stream ended unexpectedly")
}

/// Reads events up to and including the first one for which `stop` holds.
pub(crate) async fn read_until(agent: &mut Agent, stop: impl Fn(&RecordedEvent) -> bool) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    loop {
        let event = next(agent).await;
        let done = stop(&event);
        events.push(event);
        if done {
            return events;
        }
    }
}

/// Reads events up to and including the next event that closes a turn.
pub(crate) async fn read_turn(agent: &mut Agent) -> Vec<RecordedEvent> {
    read_until(agent, |event| event.msg.ends_turn()).await
}

/// Reads every event until the stream ends.
pub(crate) async fn read_to_end(agent: &mut Agent) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    while let Some(event) = guard("next_event until the end", agent.next_event()).await {
        events.push(event);
    }
    events
}

/// The `type` tags of `events`, in order.
pub(crate) fn kinds(events: &[RecordedEvent]) -> Vec<&'static str> {
    events.iter().map(|event| event.msg.kind()).collect()
}

/// `(call_id, output, is_error)` of each `tool_call_completed` among `events`.
pub(crate) fn tool_results(events: &[RecordedEvent]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::ToolCallCompleted(done) => Some((done.call_id.clone(), done.output.clone(), done.is_error)),
            _ => None,
        })
        .collect()
}

/// The assistant content deltas among `events`.
pub(crate) fn deltas(events: &[RecordedEvent]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantContentDelta(delta) => Some(delta.delta.as_str()),
            _ => None,
        })
        .collect()
}

/// The text of the first `assistant_message` among `events`.
pub(crate) fn assistant_text(events: &[RecordedEvent]) -> &str {
    events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .expect("an assistant_message event")
}

/// The id of the turn started among `events`.
pub(crate) fn started_turn_id(events: &[RecordedEvent]) -> String {
    events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnStarted(started) => Some(started.turn_id.clone()),
            _ => None,
        })
        .expect("a turn_started event")
}

/// The texts of the `user_message` events among `events`, in order.
pub(crate) fn user_messages(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some(message.text.clone()),
            _ => None,
        })
        .collect()
}

/// The texts of the `assistant_message` events among `events`, in order.
pub(crate) fn answers(events: &[RecordedEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::AssistantMessage(message) => Some(message.text.clone()),
            _ => None,
        })
        .collect()
}

/// The reason and message of the `turn_aborted` event among `events`.
pub(crate) fn abort_of(events: &[RecordedEvent]) -> (AbortReason, String) {
    events
        .iter()
        .find_map(|event| match &event.msg {
            EventMsg::TurnAborted(aborted) => Some((aborted.reason, aborted.message.clone())),
            _ => None,
        })
        .expect("a turn_aborted event")
}

/// Every stored event of a session, oldest first, read back page by page.
pub(crate) async fn stored_events(store: &SqliteCheckpoint, session_id: &str) -> Vec<RecordedEvent> {
    stored_events_in(store, session_id).await
}

/// [`stored_events`] from any store.
pub(crate) async fn stored_events_in(store: &dyn CheckpointStore, session_id: &str) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    let mut before_sequence = None;
    loop {
        let page = guard(
            "event_page",
            store.event_page(
                session_id,
                EventPageRequest {
                    before_sequence,
                    limit: MAX_EVENT_PAGE,
                },
            ),
        )
        .await
        .expect("read an event page");
        let Some(first) = page.events.first() else { break };
        before_sequence = Some(first.sequence);
        let has_more = page.has_more;
        events.splice(0..0, page.events);
        if !has_more {
            break;
        }
    }
    events
}

/// Asserts that the sequences of `events` are exactly `first..first + len`.
pub(crate) fn assert_gapless(events: &[RecordedEvent], first: u64) {
    let sequences: Vec<u64> = events.iter().map(|event| event.sequence).collect();
    let expected: Vec<u64> = (first..first + events.len() as u64).collect();
    assert_eq!(sequences, expected, "sequences must be consecutive from {first}");
}

/// What a test model was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenRequest {
    pub(crate) session_id: String,
    pub(crate) turn_id: String,
    pub(crate) history: Vec<TranscriptItem>,
    pub(crate) call_index: u64,
    pub(crate) instructions: Option<String>,
    pub(crate) tools: Vec<String>,
}

/// One model call, with owned copies of the request and the sink.
pub(crate) struct Call {
    pub(crate) call_index: u64,
    pub(crate) sink: ModelEventSink,
}

type Respond = dyn Fn(Call) -> BoxFuture<'static, keel::Result<ModelOutput>> + Send + Sync;

/// A model whose behaviour is a closure of the call; it remembers every
/// request it saw. The closure runs synchronously inside `respond`, so a
/// panic in it is a panic of `respond` itself.
pub(crate) struct TestModel {
    respond: Box<Respond>,
    seen: Mutex<Vec<SeenRequest>>,
}

impl TestModel {
    pub(crate) fn new(
        respond: impl Fn(Call) -> BoxFuture<'static, keel::Result<ModelOutput>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            respond: Box::new(respond),
            seen: Mutex::new(Vec::new()),
        })
    }

    /// A model that streams `chunks` synchronously (all in its first poll)
    /// and answers with their concatenation.
    pub(crate) fn chunks(chunks: &[&str]) -> Arc<Self> {
        let chunks: Vec<String> = chunks.iter().map(|chunk| (*chunk).to_owned()).collect();
        Self::new(move |call| {
            let chunks = chunks.clone();
            Box::pin(async move { stream_now(&call.sink, &chunks) })
        })
    }

    /// Every request seen so far.
    pub(crate) fn seen(&self) -> Vec<SeenRequest> {
        self.seen.lock().expect("seen lock").clone()
    }
}

impl Model for TestModel {
    fn respond<'a>(
        &'a self,
        request: ModelRequest<'a>,
        events: ModelEventSink,
    ) -> BoxFuture<'a, keel::Result<ModelOutput>> {
        self.seen.lock().expect("seen lock").push(SeenRequest {
            session_id: request.session_id.to_owned(),
            turn_id: request.turn_id.to_owned(),
            history: request.history.to_vec(),
            call_index: request.call_index,
            instructions: request.instructions.map(str::to_owned),
            tools: request.tools.iter().map(|tool| tool.name.clone()).collect(),
        });
        (self.respond)(Call {
            call_index: request.call_index,
            sink: events,
        })
    }

    fn name(&self) -> String {
        "test".to_owned()
    }
}

/// A model that answers `answer N`, N its call index. A call for which
/// `hold` gives a future first streams `streamed`, notifies `entered` and
/// waits for that future before it answers.
pub(crate) fn numbered_model(
    streamed: &'static str,
    entered: Arc<Notify>,
    hold: impl Fn(u64) -> Option<BoxFuture<'static, ()>> + Send + Sync + 'static,
) -> Arc<TestModel> {
    TestModel::new(move |call| {
        let entered = Arc::clone(&entered);
        let held = hold(call.call_index);
        Box::pin(async move {
            if let Some(held) = held {
                (call.sink)(ModelEvent::TextDelta(streamed.into()))?;
                entered.notify_one();
                held.await;
            }
            Ok(ModelOutput::text(format!("answer {}", call.call_index)))
        })
    })
}

/// The configuration of an agent for `session_id` on `store`, working in
/// the database's workspace.
pub(crate) fn session_config(
    db: &TestDb,
    session_id: &str,
    store: &Arc<SqliteCheckpoint>,
    model: Arc<dyn Model>,
) -> AgentConfig {
    let store: Arc<dyn CheckpointStore> = store.clone();
    let mut config = AgentConfig::new(session_id, store, model);
    config.workspace = db.workspace().to_path_buf();
    config
}

/// Submits `text` and reads the turn it starts.
pub(crate) async fn run_turn(agent: &mut Agent, text: &str) -> Vec<RecordedEvent> {
    agent.sender().submit(user(text)).expect("submit");
    read_turn(agent).await
}

/// Streams `chunks` into `sink` without yielding; answers with their concatenation.
pub(crate) fn stream_now(sink: &ModelEventSink, chunks: &[String]) -> keel::Result<ModelOutput> {
    for chunk in chunks {
        sink(ModelEvent::TextDelta(chunk.clone()))?;
    }
    Ok(ModelOutput::text(chunks.concat()))
}

/// A user message transcript item.
pub(crate) fn user_item(text: &str) -> TranscriptItem {
    TranscriptItem::UserMessage { text: text.to_owned() }
}

/// An assistant message transcript item.
pub(crate) fn assistant_item(text: &str, interrupted: bool) -> TranscriptItem {
    TranscriptItem::AssistantMessage {
        text: text.to_owned(),
        interrupted,
    }
}

/// Sets a flag when dropped; put one in a model's future to see it dropped.
pub(crate) struct DropFlag(pub(crate) Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A slot where a model keeps the sink it was given.
pub(crate) type SinkSlot = Arc<Mutex<Option<ModelEventSink>>>;

/// The sink kept in `slot`.
pub(crate) fn retained(slot: &SinkSlot) -> ModelEventSink {
    slot.lock().expect("sink slot lock").clone().expect("a retained sink")
}

/// Waits until `flag` is set, yielding to the runtime in between.
pub(crate) async fn wait_for_flag(what: &str, flag: &AtomicBool) {
    guard(what, async {
        while !flag.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
}

/// The `keel` binary, as user `uid` can run it: the build's own, or for
/// another user a copy in `dir` (which that user must own), since the
/// checkout may lie under a directory only its owner can enter.
pub(crate) fn keel_binary_for(uid: Option<u32>, dir: &std::path::Path) -> std::path::PathBuf {
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    if uid.is_none() {
        return binary;
    }
    let copy = dir.join("keel-binary");
    std::fs::copy(&binary, &copy).expect("copy the keel binary");
    copy
}

/// SQLite's own check of the database at `path` says `ok`.
pub(crate) fn assert_integrity_ok(path: impl AsRef<std::path::Path>) {
    let conn = rusqlite::Connection::open(path.as_ref()).expect("open the database");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok", "{}", path.as_ref().display());
}
