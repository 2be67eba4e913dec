//! The state a session task owns, and the identity of a running turn.
//!
//! One task per live session. It owns the inbox, the in-memory checkpoint
//! and transcript, and a recorder handle. Everything it decides is recorded
//! through the recorder, in order, together with the checkpoint writes, so
//! the store always holds a consistent prefix of the session's history.
//! The modules that run the session (`task`, `turn`, `tool_phase`,
//! `compaction`) share these types; this module names none of them.

use std::path::PathBuf;
use std::sync::Arc;

use super::control::{self, ControlLane};
use super::instructions::ProjectDocs;
use super::lease::LeaseOwner;
use super::recorder::EventRecorder;
use super::status::StatusCell;
use super::stream::StreamingOptions;
use super::submission::Inbox;
use keel_model::{ContextLimits, Model};
use keel_protocol::Result;
use keel_protocol::{ClientToolSpec, Event, EventMsg, QueueMode, Submission, TranscriptItem};
use keel_store::{Checkpoint, CheckpointStore, CheckpointWrite, TurnExecution};
use keel_tools::{ApprovalRules, ToolSet};

/// The state a session task owns.
pub(super) struct Session {
    pub(super) session_id: String,
    pub(super) model: Arc<dyn Model>,
    pub(super) recorder: EventRecorder,
    pub(super) inbox: Inbox,
    pub(super) checkpoint: Checkpoint,
    pub(super) transcript: Vec<TranscriptItem>,
    pub(super) streaming: StreamingOptions,
    /// The tools offered to the model.
    pub(super) tools: ToolSet,
    /// The tools the client executes, offered to the model with `tools`.
    pub(super) client_tools: Vec<ClientToolSpec>,
    /// How long a client has to answer a call; `None`: for ever.
    pub(super) client_tool_timeout: Option<std::time::Duration>,
    /// Which tool calls run, wait for the user, or are refused.
    pub(super) approvals: ApprovalRules,
    /// A turn found waiting for approvals or client results when the session was opened; it
    /// goes on before anything else.
    pub(super) resume: Option<TurnExecution>,
    /// The system prompt sent: the session's instructions plus its project
    /// instructions once they are read.
    pub(super) instructions: Option<String>,
    /// The session's own instructions, which project instructions join.
    pub(super) base_instructions: Option<String>,
    /// Where project instructions are read from at the first turn.
    pub(super) project_docs: Option<ProjectDocs>,
    /// How queued messages become turns.
    pub(super) queue_mode: QueueMode,
    /// The most model calls one turn may make.
    pub(super) max_steps: u32,
    /// The directory tools work in.
    pub(super) workspace: PathBuf,
    /// A submission taken off the queue while gathering a turn's input that
    /// was not input itself; it is handled next.
    pub(super) deferred: Option<Submission>,
    /// Messages steered at the running turn, waiting for its next model
    /// step. Any left when the turn ends start the next turn.
    pub(super) steering: Vec<Submission>,
    /// What the session is doing, for its handles.
    pub(super) status: Arc<StatusCell>,
    /// The model's context window and compaction threshold, if known.
    pub(super) context_limits: Option<ContextLimits>,
    /// Provider-reported prompt tokens over the raw estimate, from the last
    /// request that reported usage (1 until then).
    pub(super) calibration: f64,
    /// With several nodes, this node's lease on the session: no tool call
    /// starts once it may have lapsed.
    pub(super) lease_owner: Option<LeaseOwner>,
    /// The store, asked before each tool call whether its file system still
    /// has the room its commits need (see `CheckpointStore::low_on_space`).
    pub(super) store: Arc<dyn CheckpointStore>,
    /// Asked before each model step (budgets); `None` asks nothing.
    pub(super) step_gate: Option<Arc<dyn super::StepGate>>,
    /// Where the session's spans go.
    pub(super) spans: crate::telemetry::Spans,
    /// The shell's sandbox policy (`workspace-write`, …), for the spans of
    /// the calls it runs.
    pub(super) sandbox_policy: Option<String>,
    /// When each tool call of the step started here (ms), and when its
    /// approval was asked for, by call id: for its span.
    pub(super) tool_starts: std::collections::HashMap<String, (u64, Option<u64>)>,
    /// When each call waiting for approval was asked about (ms).
    pub(super) approval_asked: std::collections::HashMap<String, u64>,
}

/// The identity and durable state of a running turn.
pub(super) struct Turn {
    pub(super) execution: TurnExecution,
    /// The submission that started it; the turn's events carry its id.
    pub(super) submission_id: String,
}

impl Turn {
    /// The turn's id.
    pub(super) fn id(&self) -> &str {
        &self.execution.turn_id
    }

    /// An event of the turn: it carries the id of the submission that started it.
    pub(super) fn event(&self, msg: EventMsg) -> Event {
        Event {
            submission_id: Some(self.submission_id.clone()),
            msg,
        }
    }
}

impl Session {
    /// The control lane, for a wait that holds nothing else of the session.
    pub(super) fn control_lane(&mut self) -> ControlLane<'_> {
        ControlLane {
            inbox: &mut self.inbox,
            steering: &mut self.steering,
            recorder: &self.recorder,
            transcript: &self.transcript,
        }
    }

    /// Records that `submission` will not be acted on.
    pub(super) async fn reject(&self, submission: &Submission, reason: &str) -> Result<()> {
        control::refuse(&self.recorder, submission, reason).await
    }

    /// A checkpoint write of the current state plus `transcript_delta`.
    pub(super) fn checkpoint_write(
        &self,
        transcript_delta: Vec<TranscriptItem>,
        execution: Option<&TurnExecution>,
    ) -> CheckpointWrite {
        CheckpointWrite {
            checkpoint: self.checkpoint.clone(),
            transcript_delta,
            execution: execution.cloned(),
            history_cut: None,
        }
    }
}

/// The id of the assistant message model step `step` of turn `turn_id`
/// writes: derived from both, so a step resumed or replayed keeps its id.
pub(super) fn step_message_id(turn_id: &str, step: u32) -> String {
    format!("{turn_id}-{step}")
}
