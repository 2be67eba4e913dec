//! The agent runtime: submissions in, turns run, events recorded and delivered.
//!
//! [`create_agent`] opens (or resumes) a session and starts its task. Clients
//! submit [`Op`]s through [`Agent::sender`] and read recorded events from
//! [`Agent::next_event`]. Inside, three parts with one job each:
//!
//! - [`submission`]: the bounded submission queue and its cutoff;
//! - [`recorder`]: persist-then-deliver, with group commit and back-pressure;
//! - the session task: runs turns, streams the model's output through a
//!   coalescing sink (`stream`).
//!
//! The session task's modules depend on each other in one direction only:
//! `task` (the loop) → `turn` → `tool_phase` (→ `client_wait`), `compaction` → `session` (the
//! state they share: `Session`, `Turn`) → `control` (what an interrupt, a
//! steered message or an approval does, for every place that waits).
//! `recovery` closes what a stopped runtime left when the session is opened.

mod client_wait;
mod compaction;
mod control;
mod first_turn;
mod fork;
mod handle;
mod instructions;
mod lease;
pub mod recorder;
mod recovery;
mod session;
mod spans;
mod status;
mod step_gate;
mod stream;
pub mod submission;
mod task;
mod tool_phase;
mod turn;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub use self::compaction::{SUMMARY_PREFIX, SUMMARY_PROMPT};
pub use self::fork::{ForkError, fork_session, point_before_turn};
pub use self::handle::{Accepted, SessionHandle, SubmitOptions};
pub use self::handle::{answer_keyed, key_reused};
pub use self::instructions::{
    CODING_AGENT_PROMPT, DEFAULT_PROJECT_INSTRUCTIONS_BYTES, PROJECT_INSTRUCTIONS_FILE, ProjectDocs,
    load_project_instructions, system_prompt,
};
use self::lease::take_lease;
pub use self::lease::{LeaseClock, LeaseOwner};
pub use self::recorder::{EVENT_QUEUE_CAPACITY, EventRecorder, RecorderOptions, send_event, try_send_event};
use self::recovery::InFlight;
use self::session::Session;
pub use self::status::SessionStatus;
use self::status::StatusCell;
pub use self::step_gate::{StepGate, StepVerdict};
pub use self::stream::{MAX_STEP_OUTPUT_BYTES, StreamingOptions};
pub use self::submission::{Inbox, SubmissionSender, Submitted, WeakSubmissionSender, submission_channel};
#[cfg(test)]
use self::test_support::*;
pub use keel_model::{
    BoxFuture, ContextLimits, Model, ModelEvent, ModelEventSink, ModelOutput, ModelRequest, RequestPurpose, ToolCall,
    ToolSpec,
};
pub use keel_protocol::*;
pub use keel_protocol::{Error, Result};
pub use keel_store::{
    Checkpoint, CheckpointStore, CheckpointStoreExt, CheckpointWrite, EventPage, EventPageRequest, Lease, LeaseStore,
    SessionContext, SessionState, SqliteCheckpoint, StoreError,
};
pub use keel_tools::DEFAULT_CLIENT_TOOL_TIMEOUT;
use keel_tools::{ApprovalRules, ToolSet};

/// Queued submissions a session holds by default.
pub const DEFAULT_SUBMISSION_CAPACITY: usize = 64;

/// Model calls one turn may make by default.
pub const DEFAULT_MAX_STEPS: u32 = 25;

/// The longest session id accepted.
pub const MAX_SESSION_ID_BYTES: usize = 128;

/// The longest bot id accepted: it is stored with every checkpoint, listed,
/// and a label of the server's metrics.
pub const MAX_BOT_ID_BYTES: usize = 128;

/// Everything needed to open a session.
#[derive(Clone)]
pub struct AgentConfig {
    /// The session to open; it is created if the store does not have it.
    pub session_id: String,
    /// Where the session lives.
    pub store: Arc<dyn CheckpointStore>,
    /// What answers.
    pub model: Arc<dyn Model>,
    /// Who the session belongs to; used only when the session is created.
    pub session_context: SessionContext,
    /// The directory the session works in.
    pub workspace: PathBuf,
    /// How many submissions may wait in the queue.
    pub submission_capacity: usize,
    /// How streamed text is grouped into recorded deltas.
    pub streaming: StreamingOptions,
    /// The tools offered to the model.
    pub tools: ToolSet,
    /// Tools the client executes, offered to the model with `tools` (a
    /// name `tools` has stays the server's tool). Their calls wait,
    /// durably, for a `client_tool_result` op.
    pub client_tools: Vec<ClientToolSpec>,
    /// How long a client has to answer a call of a client tool before the
    /// call is answered as an error; `None` waits for ever.
    pub client_tool_timeout: Option<std::time::Duration>,
    /// Which tool calls run at once, wait for the user's approval, or are
    /// refused (by default: reading tools run, the others ask).
    pub approvals: ApprovalRules,
    /// Standing instructions for the model (the system prompt). The
    /// runtime adds no default of its own: a host that wants Keel's coding
    /// agent passes [`CODING_AGENT_PROMPT`].
    pub instructions: Option<String>,
    /// Where project instructions (`AGENTS.md`) are read from, at the
    /// session's first turn, to be appended to `instructions` and recorded
    /// (`instructions_loaded`); `None` reads none.
    pub project_docs: Option<ProjectDocs>,
    /// How the messages waiting in the queue become turns: all together
    /// ([`QueueMode::Merge`], the default) or one turn each.
    pub queue_mode: QueueMode,
    /// The most model calls one turn may make; past it the turn ends with an
    /// error event (and still completes).
    pub max_steps: u32,
    /// The sandbox shell commands run under, recorded in `session_started`.
    pub sandbox: Option<SandboxInfo>,
    /// Recorded as `warning` events right after `session_started` (an MCP
    /// server that did not start, a sandbox the kernel cannot enforce).
    pub startup_warnings: Vec<String>,
    /// The context window and compaction threshold; `None` takes the
    /// model's own ([`Model::context_limits`]).
    pub context_limits: Option<ContextLimits>,
    /// With several nodes on one database, the node that claims the
    /// session; a session another node holds is then refused with
    /// [`StoreError::Owned`]. `None` takes the session over whoever held it.
    pub lease_owner: Option<LeaseOwner>,
    /// The session's lease when the host claimed it already: the session
    /// writes under it and claims nothing (`lease_owner` then only says who
    /// renews it). `None` takes one as `lease_owner` says.
    pub lease: Option<Lease>,
    /// Asked before each model step; a turn it stops is closed as
    /// `turn_aborted` with reason `budget_exhausted`. `None` asks nothing.
    pub step_gate: Option<Arc<dyn StepGate>>,
    /// Where the session's turn, model-step and tool-call spans go (see
    /// [`crate::telemetry`]); nowhere by default.
    pub spans: crate::telemetry::Spans,
}

impl AgentConfig {
    /// A configuration with default limits, working in the current directory.
    pub fn new(session_id: impl Into<String>, store: Arc<dyn CheckpointStore>, model: Arc<dyn Model>) -> Self {
        Self {
            session_id: session_id.into(),
            store,
            model,
            session_context: SessionContext::default(),
            workspace: PathBuf::from("."),
            submission_capacity: DEFAULT_SUBMISSION_CAPACITY,
            streaming: StreamingOptions::default(),
            tools: ToolSet::new(),
            client_tools: Vec::new(),
            client_tool_timeout: Some(DEFAULT_CLIENT_TOOL_TIMEOUT),
            approvals: ApprovalRules::default(),
            instructions: None,
            project_docs: None,
            queue_mode: QueueMode::default(),
            max_steps: DEFAULT_MAX_STEPS,
            sandbox: None,
            startup_warnings: Vec::new(),
            context_limits: None,
            lease_owner: None,
            lease: None,
            step_gate: None,
            spans: crate::telemetry::Spans::default(),
        }
    }
}

/// A live session: submit ops, read recorded events. Dropping it cancels the
/// session's work at once (a running turn is then closed as
/// `runtime_stopped` when the session is next opened); [`Agent::shutdown`]
/// stops it gracefully.
pub struct Agent {
    session_id: String,
    sender: SubmissionSender,
    events: mpsc::Receiver<RecordedEvent>,
    task: JoinHandle<Result<()>>,
    handle: SessionHandle,
    lease: Lease,
}

impl Agent {
    /// The lease the session writes under: what a node renews.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The session's id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Where to submit ops.
    pub fn sender(&self) -> &SubmissionSender {
        &self.sender
    }

    /// A cloneable handle for submitting durably and reading the session's
    /// status from other tasks. It keeps the submission queue open: drop
    /// every clone before expecting the session to end on its own.
    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

    /// The next recorded event, or `None` once the session has stopped and
    /// every event was delivered.
    pub async fn next_event(&mut self) -> Option<RecordedEvent> {
        self.events.recv().await
    }

    /// Stops the session after the work already queued: submits
    /// [`Op::Shutdown`], discards the events still to come, and reports why
    /// the session task ended if it failed.
    pub async fn shutdown(mut self) -> Result<()> {
        // Keep draining while waiting for room in the queue: the session may
        // be blocked on delivering to us.
        let submitted = {
            let submit = self.sender.submit_wait(Op::Shutdown);
            tokio::pin!(submit);
            let mut draining = true;
            loop {
                tokio::select! {
                    result = &mut submit => break result.map(drop),
                    event = self.events.recv(), if draining => draining = event.is_some(),
                }
            }
        };
        while self.events.recv().await.is_some() {}
        let ended = match (&mut self.task).await {
            Ok(result) => result,
            Err(error) => Err(Error::stopped(format!("session task failed: {error}"))),
        };
        match (ended, submitted) {
            (Err(error), _) => Err(error),
            // The session stopped on its own before the shutdown could be queued.
            (Ok(()), Err(Error::Stopped(_))) => Ok(()),
            (Ok(()), submitted) => submitted,
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens the session named in `config`, creating it if needed, and starts
/// its task. A turn left in flight by a runtime that stopped is closed with
/// a `turn_aborted` event (reason `runtime_stopped`) before anything else.
pub async fn create_agent(mut config: AgentConfig) -> Result<Agent> {
    check_ids(&config.session_id, &config.session_context.bot_id)?;
    let store = Arc::clone(&config.store);
    let session_id = config.session_id.clone();
    let session_context = std::mem::take(&mut config.session_context);
    let (lease, state, resumed) = open_state(
        store.as_ref(),
        &session_id,
        session_context,
        config.lease.as_ref(),
        config.lease_owner.as_ref(),
    )
    .await?;
    let SessionState {
        checkpoint,
        mut transcript,
        execution,
        queued,
        ..
    } = state;
    let options = RecorderOptions {
        lease: Some(lease.epoch),
        ..RecorderOptions::default()
    };
    let (recorder, events) = EventRecorder::spawn_with(Arc::clone(&store), session_id.clone(), options);
    let in_flight = InFlight::sort(execution);
    let sandbox_policy = config.sandbox.as_ref().map(|sandbox| sandbox.policy.clone());
    let started = SessionStartedEvent {
        session_id: session_id.clone(),
        bot_id: checkpoint.session_context.bot_id.clone(),
        resumed,
        history_items: transcript.len() as u64,
        pending_approvals: in_flight
            .resume
            .as_ref()
            .map(|turn| turn.awaiting_approval.clone())
            .unwrap_or_default(),
        sandbox: config.sandbox.take(),
        tools: config.tools.names(),
    };
    let mut startup = startup_events(started, &config.startup_warnings);
    let mut closing_write = None;
    let mut stale_span = None;
    if let Some(stale) = in_flight.stale {
        // Its span was never reported: the runtime that started it stopped.
        stale_span = spans::turn_span(
            &stale,
            &session_id,
            &checkpoint.session_context.bot_id,
            config.model.as_ref(),
            Some("runtime_stopped"),
            keel_protocol::now_ms(),
        );
        let closing =
            recovery::close_stale_turn(store.as_ref(), &session_id, &checkpoint, &mut transcript, stale).await?;
        startup.extend(closing.events);
        closing_write = Some(closing.write);
    }
    recorder.append(startup, closing_write).await?;
    if let Some(span) = stale_span {
        config.spans.record(span);
    }
    let (sender, inbox) = recovery::requeue(queued, config.submission_capacity, &recorder)?;
    let status = Arc::new(StatusCell::default());
    let handle = SessionHandle {
        session_id: session_id.clone(),
        sender: sender.clone(),
        recorder: recorder.downgrade(),
        store,
        status: Arc::clone(&status),
        keyed: Arc::default(),
    };
    let opened = Opened {
        recorder,
        inbox,
        checkpoint,
        transcript,
        resume: in_flight.resume,
        status,
        sandbox_policy,
    };
    let task = tokio::spawn(session(config, opened).run());
    Ok(Agent {
        session_id,
        sender,
        events,
        task,
        handle,
        lease,
    })
}

/// What opening the session made, for its task.
struct Opened {
    recorder: EventRecorder,
    inbox: Inbox,
    checkpoint: Checkpoint,
    transcript: Vec<TranscriptItem>,
    resume: Option<keel_store::TurnExecution>,
    status: Arc<StatusCell>,
    /// The shell's sandbox policy, for tool calls' spans.
    sandbox_policy: Option<String>,
}

/// The session task's state, from the configuration and what opening made.
fn session(config: AgentConfig, opened: Opened) -> Session {
    let context_limits = config.context_limits.or_else(|| config.model.context_limits());
    // A resumed session sends the project instructions it recorded.
    let instructions = instructions::system_prompt(
        config.instructions.as_deref(),
        opened.checkpoint.project_instructions.as_ref(),
    );
    Session {
        session_id: config.session_id,
        model: config.model,
        recorder: opened.recorder,
        inbox: opened.inbox,
        checkpoint: opened.checkpoint,
        transcript: opened.transcript,
        streaming: config.streaming,
        tools: config.tools,
        client_tools: config.client_tools,
        client_tool_timeout: config.client_tool_timeout,
        approvals: config.approvals,
        resume: opened.resume,
        instructions,
        base_instructions: config.instructions,
        project_docs: config.project_docs,
        queue_mode: config.queue_mode,
        max_steps: config.max_steps.max(1),
        workspace: config.workspace,
        deferred: None,
        steering: Vec::new(),
        status: opened.status,
        context_limits,
        calibration: 1.0,
        lease_owner: config.lease_owner,
        store: config.store,
        step_gate: config.step_gate,
        spans: config.spans,
        sandbox_policy: opened.sandbox_policy,
        tool_starts: std::collections::HashMap::new(),
        approval_asked: std::collections::HashMap::new(),
    }
}

/// Refuses a session id or bot id that breaks the limits on them.
fn check_ids(session_id: &str, bot_id: &str) -> Result<()> {
    if session_id.is_empty() || session_id.len() > MAX_SESSION_ID_BYTES || session_id.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "session id must be 1 to {MAX_SESSION_ID_BYTES} bytes without control characters"
        )));
    }
    if bot_id.len() > MAX_BOT_ID_BYTES || bot_id.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "bot id must be at most {MAX_BOT_ID_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// Takes the session's lease and reads the session, creating it (for
/// `session_context`) if the store does not have it: the lease epoch, the
/// state, and whether an existing session was reopened.
async fn open_state(
    store: &dyn CheckpointStore,
    session_id: &str,
    session_context: SessionContext,
    held: Option<&Lease>,
    lease_owner: Option<&LeaseOwner>,
) -> Result<(Lease, SessionState, bool)> {
    // Take the session over before reading it: from here on, a runtime that
    // still holds it (one that was dropped and is finishing its queue, or
    // another process) cannot write into it, so what is read stays true.
    match take_lease(store, session_id, held, lease_owner).await {
        Ok(lease) => {
            let state = store.load(session_id).await?;
            let state = state.ok_or_else(|| Error::Checkpoint(StoreError::UnknownSession(session_id.to_owned())))?;
            Ok((lease, state, true))
        }
        Err(StoreError::UnknownSession(_)) => {
            let checkpoint = Checkpoint {
                session_context,
                ..Checkpoint::empty(session_id.to_owned())
            };
            store.save(&checkpoint, &[], None).await?;
            let lease = take_lease(store, session_id, held, lease_owner).await?;
            let state = SessionState {
                checkpoint,
                transcript: Vec::new(),
                execution: None,
                last_sequence: 0,
                queued: Vec::new(),
            };
            Ok((lease, state, false))
        }
        Err(error) => Err(error.into()),
    }
}

/// The events a session's task records first: `session_started`, then the
/// startup warnings.
fn startup_events(started: SessionStartedEvent, warnings: &[String]) -> Vec<Event> {
    let mut startup = vec![Event {
        submission_id: None,
        msg: EventMsg::SessionStarted(started),
    }];
    startup.extend(warnings.iter().map(|message| Event {
        submission_id: None,
        msg: EventMsg::Warning(WarningEvent {
            // An MCP server's failure may echo its headers.
            message: keel_secrets::redact_owned(message.clone()),
        }),
    }));
    startup
}
