//! An agent in this process: starting it on a test database, feeding it
//! user messages and reading its events as they are delivered.

use std::sync::Arc;

use keel::agent::{AgentConfig, SessionContext, StreamingOptions};
use keel::store::{CheckpointStore, SqliteCheckpoint};
use keel::{Agent, Model, Op, RecordedEvent, create_agent};

use super::store::TestDb;
use super::wait::guard;

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
