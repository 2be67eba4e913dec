//! The agent runtime: submissions in, turns run, events recorded and delivered.
//!
//! [`create_agent`] opens (or resumes) a session and starts its task. Clients
//! submit [`Op`]s through [`Agent::sender`] and read recorded events from
//! [`Agent::next_event`]. Inside, three parts with one job each:
//!
//! - [`submission`]: the bounded submission queue and its cutoff;
//! - [`recorder`]: persist-then-deliver, with group commit and back-pressure;
//! - the session task (`session`, `turn`, `stream`): runs turns, streams the
//!   model's output through a coalescing sink.

mod compaction;
mod fork;
mod handle;
mod lease;
pub mod recorder;
mod session;
mod status;
mod stream;
pub mod submission;
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
pub use self::handle::{check_same_body, key_reused};
use self::lease::take_lease;
pub use self::lease::{LeaseClock, LeaseOwner};
pub use self::recorder::{EVENT_QUEUE_CAPACITY, EventRecorder, RecorderOptions, send_event, try_send_event};
use self::session::Session;
pub use self::status::SessionStatus;
use self::status::StatusCell;
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
    /// Which tool calls run at once, wait for the user's approval, or are
    /// refused (by default: reading tools run, the others ask).
    pub approvals: ApprovalRules,
    /// Standing instructions for the model (the system prompt).
    pub instructions: Option<String>,
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
            approvals: ApprovalRules::default(),
            instructions: None,
            max_steps: DEFAULT_MAX_STEPS,
            sandbox: None,
            startup_warnings: Vec::new(),
            context_limits: None,
            lease_owner: None,
            lease: None,
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
pub async fn create_agent(config: AgentConfig) -> Result<Agent> {
    let AgentConfig {
        session_id,
        store,
        model,
        session_context,
        workspace,
        submission_capacity,
        streaming,
        tools,
        approvals,
        instructions,
        max_steps,
        sandbox,
        startup_warnings,
        context_limits,
        lease_owner,
        lease: held_lease,
    } = config;
    let context_limits = context_limits.or_else(|| model.context_limits());
    if session_id.is_empty() || session_id.len() > MAX_SESSION_ID_BYTES || session_id.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "session id must be 1 to {MAX_SESSION_ID_BYTES} bytes without control characters"
        )));
    }
    let bot_id = &session_context.bot_id;
    if bot_id.len() > MAX_BOT_ID_BYTES || bot_id.chars().any(char::is_control) {
        return Err(Error::InvalidInput(format!(
            "bot id must be at most {MAX_BOT_ID_BYTES} bytes without control characters"
        )));
    }
    // Take the session over before reading it: from here on, a runtime that
    // still holds it (one that was dropped and is finishing its queue, or
    // another process) cannot write into it, so what is read stays true.
    let (lease, state, resumed) =
        match take_lease(store.as_ref(), &session_id, held_lease.as_ref(), lease_owner.as_ref()).await {
            Ok(lease) => {
                let state = store.load(&session_id).await?;
                let state = state.ok_or_else(|| Error::Checkpoint(StoreError::UnknownSession(session_id.clone())))?;
                (lease, state, true)
            }
            Err(StoreError::UnknownSession(_)) => {
                let checkpoint = Checkpoint {
                    session_context,
                    ..Checkpoint::empty(session_id.clone())
                };
                store.save(&checkpoint, &[], None).await?;
                let lease = take_lease(store.as_ref(), &session_id, held_lease.as_ref(), lease_owner.as_ref()).await?;
                (
                    lease,
                    SessionState {
                        checkpoint,
                        transcript: Vec::new(),
                        execution: None,
                        last_sequence: 0,
                        queued: Vec::new(),
                    },
                    false,
                )
            }
            Err(error) => return Err(error.into()),
        };
    let SessionState {
        checkpoint,
        transcript,
        execution,
        queued,
        ..
    } = state;
    let options = RecorderOptions {
        lease: Some(lease.epoch),
        ..RecorderOptions::default()
    };
    let (recorder, events) = EventRecorder::spawn_with(Arc::clone(&store), session_id.clone(), options);
    // A turn that was waiting for the user's approval goes on waiting; any
    // other turn left in flight is closed.
    let (resume, execution) = match execution {
        Some(execution) if !execution.awaiting_approval.is_empty() => (Some(execution), None),
        other => (None, other),
    };
    let mut startup = vec![Event {
        submission_id: None,
        msg: EventMsg::SessionStarted(SessionStartedEvent {
            session_id: session_id.clone(),
            bot_id: checkpoint.session_context.bot_id.clone(),
            resumed,
            history_items: transcript.len() as u64,
            pending_approvals: resume
                .as_ref()
                .map(|turn| turn.awaiting_approval.clone())
                .unwrap_or_default(),
            sandbox: sandbox.clone(),
            tools: tools.names(),
        }),
    }];
    startup.extend(startup_warnings.iter().map(|message| Event {
        submission_id: None,
        msg: EventMsg::Warning(WarningEvent {
            // An MCP server's failure may echo its headers.
            message: keel_secrets::redact_owned(message.clone()),
        }),
    }));
    let mut closing_write = None;
    let mut transcript = transcript;
    if let Some(execution) = execution {
        tracing::warn!(%session_id, turn_id = %execution.turn_id, "closing a turn left in flight by a stopped runtime");
        let submission_id = execution.submission_ids.first().cloned();
        // A tool call that has no recorded result gets one, so the history
        // sent to the provider stays well formed. One whose start was
        // committed may have run; one that never started did not, and the
        // model is told which (an older checkpoint does not say: may have).
        let unanswered = turn::unanswered_calls(&transcript);
        let mut results = Vec::with_capacity(unanswered.len());
        for ToolCall { call_id, .. } in unanswered {
            let never_started = execution
                .started_calls
                .as_ref()
                .is_some_and(|started| !started.contains(&call_id));
            let output = if never_started {
                "not run: the runtime stopped before this call started"
            } else {
                "interrupted: the runtime stopped during this call; the tool may or may not have completed"
            };
            startup.push(Event {
                submission_id: submission_id.clone(),
                msg: EventMsg::ToolCallCompleted(ToolCallCompletedEvent {
                    turn_id: execution.turn_id.clone(),
                    call_id: call_id.clone(),
                    output: output.to_owned(),
                    is_error: true,
                }),
            });
            results.push(TranscriptItem::ToolResult {
                call_id,
                output: output.to_owned(),
                is_error: true,
            });
        }
        // Text streamed before the stop was seen by the user: the model
        // sees it too, marked cut, as after an interrupt.
        let cut = turn::streamed_before_stop(store.as_ref(), &session_id, &execution.turn_id).await?;
        results.extend(cut.map(|text| TranscriptItem::AssistantMessage {
            text,
            interrupted: true,
        }));
        transcript.extend(results.iter().cloned());
        startup.push(Event {
            submission_id,
            msg: EventMsg::TurnAborted(TurnAbortedEvent {
                turn_id: execution.turn_id,
                reason: AbortReason::RuntimeStopped,
                message: "the runtime stopped while this turn was running (process exit or crash); \
                          it was closed when the session was reopened"
                    .to_owned(),
            }),
        });
        closing_write = Some(CheckpointWrite {
            checkpoint: checkpoint.clone(),
            transcript_delta: results,
            execution: None,
            history_cut: None,
        });
    }
    recorder.append(startup, closing_write).await?;

    // Messages stored durably but not taken up before the runtime stopped
    // are queued again, first, under their ids; they kept their places when
    // accepted, so the queue has room for them (unless it was made smaller).
    let (sender, inbox) = submission_channel(submission_capacity.max(queued.len()));
    for stored in queued {
        let op = match stored.op {
            Op::Steer { text } => Op::UserInput { text },
            op => op,
        };
        let reservation = sender.reserve(&op)?;
        recorder.expect_settlement(stored.id.clone());
        sender.send_reserved(reservation, stored.id, op);
    }
    let status = Arc::new(StatusCell::default());
    let handle = SessionHandle {
        session_id: session_id.clone(),
        sender: sender.clone(),
        recorder: recorder.downgrade(),
        store: Arc::clone(&store),
        status: Arc::clone(&status),
        keyed: Arc::default(),
    };
    let session = Session {
        session_id: session_id.clone(),
        model,
        recorder,
        inbox,
        checkpoint,
        transcript,
        streaming,
        tools,
        approvals,
        resume,
        instructions,
        max_steps: max_steps.max(1),
        workspace,
        deferred: None,
        steering: Vec::new(),
        status,
        context_limits,
        calibration: 1.0,
        lease_owner,
        store: Arc::clone(&store),
    };
    let task = tokio::spawn(session.run());
    Ok(Agent {
        session_id,
        sender,
        events,
        task,
        handle,
        lease,
    })
}
