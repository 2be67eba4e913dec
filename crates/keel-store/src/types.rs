//! The values a store keeps and returns: a session's checkpoint, its turn
//! in flight, its queue, its summary, and the events on their way in.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use keel_protocol::{
    ApprovalDecision, BusyPolicy, DEFAULT_TENANT, Event, EventMsg, Op, ProjectInstructions, RecordedEvent, StoreError,
    TokenUsage, TranscriptItem,
};

/// The most events one [`crate::CheckpointStore::event_page`] call returns.
pub const MAX_EVENT_PAGE: usize = 10_000;

/// Who a session belongs to and what it is about; set when it is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionContext {
    /// The bot (application) that owns the session.
    pub bot_id: String,
    /// The tenant the session belongs to: only its principals (and the
    /// operator) can see or drive it. [`DEFAULT_TENANT`] for sessions made
    /// without one, and for those stored before tenants existed.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// Free-form context supplied by the application.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Settings of the application hosting the session (a server keeps the
    /// session's model, tools and policies here, to reopen it with them).
    /// Opaque to the runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
}

impl Default for SessionContext {
    fn default() -> Self {
        Self {
            bot_id: String::new(),
            tenant: default_tenant(),
            metadata: serde_json::Map::new(),
            settings: None,
        }
    }
}

fn default_tenant() -> String {
    DEFAULT_TENANT.to_owned()
}

/// A session's small durable state, rewritten on every save.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The session this checkpoint belongs to.
    pub session_id: String,
    /// Who the session belongs to.
    pub session_context: SessionContext,
    /// Model calls started in this session; the scripted model's position.
    #[serde(default)]
    pub model_calls: u64,
    /// Turns that completed normally.
    #[serde(default)]
    pub turns_completed: u64,
    /// Tokens the session's model calls used, summed.
    #[serde(default)]
    pub usage: TokenUsage,
    /// Tools the user approved for the rest of the session.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub approved_tools: BTreeSet<String>,
    /// The latest compaction: the model sees its summary in place of the
    /// history items before `replaced_to`. Saved with the `context_compacted`
    /// event in one commit, so a crash never leaves it half-applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
    /// The latest turn, which a `regenerate` op rolls back; `None` before
    /// the first turn and after a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_turn: Option<LastTurn>,
    /// The project instructions (`AGENTS.md`) read at the session's first
    /// turn, kept so that a resumed session sends the same ones; `None`
    /// until read (and for hosts that read none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_instructions: Option<ProjectInstructions>,
}

/// Where the latest turn's history starts, saved when the turn starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastTurn {
    /// The turn.
    pub turn_id: String,
    /// The history's length when it started: its items are the ones after.
    pub history_from: u64,
}

/// The history as compacted: a summary standing for its first items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The summary of the replaced items.
    pub summary: String,
    /// How many history items, from the start, the summary replaces.
    pub replaced_to: u64,
    /// How many compactions the session has made, this one included.
    #[serde(default)]
    pub count: u64,
}

impl Checkpoint {
    /// The checkpoint of a session that has not done anything yet.
    pub fn empty(session_id: impl Into<String>) -> Self {
        Self {
            session_id: session_id.into(),
            session_context: SessionContext::default(),
            model_calls: 0,
            turns_completed: 0,
            usage: TokenUsage::default(),
            approved_tools: BTreeSet::new(),
            compaction: None,
            last_turn: None,
            project_instructions: None,
        }
    }
}

/// The turn a session is running, saved while it runs so that a restart can
/// find it and close it explicitly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnExecution {
    /// The running turn.
    pub turn_id: String,
    /// The submissions the turn took.
    pub submission_ids: Vec<String>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// The model step the turn is at, from 1.
    #[serde(default)]
    pub step: u32,
    /// Tool calls of this step waiting for the user's decision. A turn
    /// found waiting when the session is opened goes on waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_approval: Vec<String>,
    /// Decisions already made for this step's calls, by call id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decisions: BTreeMap<String, ApprovalDecision>,
    /// This step's calls whose `tool_call_started` is committed (written
    /// in the same batch), so a restart can tell a call that may have run
    /// from one that never started. `None` in checkpoints of versions that
    /// did not keep it: then any unanswered call may have run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_calls: Option<Vec<String>>,
    /// Calls of this step to tools the client executes, requested
    /// (`client_tool_requested`) and not answered yet. A turn found waiting
    /// for them when the session is opened goes on waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_client: Vec<String>,
    /// When each call of `awaiting_client` times out, in milliseconds
    /// since the Unix epoch, by call id; a call without one waits for ever.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub client_deadlines: BTreeMap<String, u64>,
    /// The turn's place in a trace, kept so that whichever runtime ends the
    /// turn (after a wait, a restart or a crash) reports its span under the
    /// same ids. `None` for turns stored by versions that kept none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TurnTrace>,
}

/// A turn's span: its trace, its own id, its parent (a caller's span, from
/// a `traceparent`), and what its model steps used so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnTrace {
    /// The trace, 32 lowercase hex digits.
    pub trace_id: String,
    /// The turn's span, 16 lowercase hex digits.
    pub span_id: String,
    /// The caller's span the turn runs under, when a submission said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<String>,
    /// The tokens the turn's model steps reported so far.
    #[serde(default)]
    pub usage: TokenUsage,
    /// Why the last model step stopped (`stop`, `tool_calls`, `length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

impl TurnExecution {
    /// The earliest time a call waiting for the client times out.
    pub fn next_client_deadline_ms(&self) -> Option<u64> {
        self.awaiting_client
            .iter()
            .filter_map(|call_id| self.client_deadlines.get(call_id).copied())
            .min()
    }
}

/// Everything needed to resume a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionState {
    /// The latest checkpoint.
    pub checkpoint: Checkpoint,
    /// The whole history, oldest first.
    pub transcript: Vec<TranscriptItem>,
    /// The turn that was running when the checkpoint was written, if any.
    pub execution: Option<TurnExecution>,
    /// The sequence of the newest event in the log (0 when it is empty).
    pub last_sequence: u64,
    /// Submissions stored durably and not yet taken up, oldest first.
    pub queued: Vec<QueuedSubmission>,
}

/// A submission stored before it was queued (its `submission_queued`
/// event), kept until the session takes it up, so a crash cannot lose it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSubmission {
    /// The submission's id.
    pub id: String,
    /// The op.
    pub op: Op,
    /// What it does if the session is busy.
    pub on_busy: BusyPolicy,
    /// The sequence of its `submission_queued` event, or of its
    /// `submission_rejected` when it was refused (`on_busy: reject`).
    pub sequence: u64,
    /// The caller's `traceparent`, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// How an event changes the session's stored submission queue; the store
/// applies it in the transaction that appends the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueChange {
    /// A `submission_queued` event: the submission joins the queue (its
    /// sequence is the event's, filled in by the store) and its idempotency
    /// key, if any, is remembered.
    Queued {
        /// The submission.
        submission: Box<QueuedSubmission>,
        /// The client's idempotency key.
        idempotency_key: Option<String>,
    },
    /// The first event the session recorded for this submission: it was
    /// taken up and leaves the queue.
    Settled(String),
    /// A `submission_rejected` event of a submission that carried an
    /// idempotency key: nothing is queued, but the key is remembered (at
    /// the event's sequence), so a retry is refused the same way.
    Refused {
        /// The refused submission's id.
        submission_id: String,
        /// The client's idempotency key.
        idempotency_key: String,
    },
}

/// One line of a session listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// The session's id.
    pub session_id: String,
    /// The bot that owns it.
    pub bot_id: String,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When it was last written.
    pub updated_at_ms: u64,
    /// The newest event's sequence.
    pub last_sequence: u64,
    /// The turn in flight at the last write, if any.
    pub running_turn_id: Option<String>,
    /// Who the session belongs to, and the host's settings.
    pub context: SessionContext,
    /// Tokens used, summed.
    pub usage: TokenUsage,
    /// Turns that completed normally.
    pub turns_completed: u64,
    /// Tool calls waiting for the user's decision.
    pub awaiting_approval: Vec<String>,
    /// Calls of tools the client executes waiting for their result.
    #[serde(default)]
    pub awaiting_client: Vec<String>,
    /// The earliest time one of `awaiting_client` times out, in
    /// milliseconds since the Unix epoch; `None` when none can.
    #[serde(default)]
    pub client_deadline_ms: Option<u64>,
    /// The session's title: its first user message, shortened, until it
    /// is renamed; `None` before any message.
    #[serde(default)]
    pub title: Option<String>,
}

/// A page of [`crate::CheckpointStore::list_sessions_page`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionListPage {
    /// The sessions, newest created first.
    pub sessions: Vec<SessionSummary>,
    /// Where the next page starts; `None` after the last page.
    pub next_cursor: Option<String>,
}

/// Where a submission with an idempotency key landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedSubmission {
    /// The submission's id.
    pub submission_id: String,
    /// The sequence of its `submission_queued` event, or of its
    /// `submission_rejected` when it was refused (`on_busy: reject`).
    pub sequence: u64,
}

/// Which part of the log to read: the `limit` newest events older than
/// `before_sequence` (or the newest overall when it is `None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventPageRequest {
    /// Read events with a smaller sequence than this.
    pub before_sequence: Option<u64>,
    /// How many at most; capped at [`MAX_EVENT_PAGE`].
    pub limit: usize,
}

/// A page of the event log, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// The events, in ascending sequence.
    pub events: Vec<RecordedEvent>,
    /// Whether older events exist before the first one here.
    pub has_more: bool,
}

/// An event serialized once, on its way to the store: the JSON of the
/// [`Event`] (`submission_id` and `msg`).
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedEvent {
    /// The event's JSON.
    pub json: String,
    /// What the event does to the stored submission queue.
    pub queue: Option<QueueChange>,
    /// The title a `user_message` event gives a session that has none yet.
    pub title: Option<String>,
    /// The tokens a `token_usage` event (or a `context_compacted` one that
    /// carries usage) reports, which the store adds to the usage ledger
    /// (see [`crate::AccessStore`]); `None` for every other event, so a
    /// batch without usage costs the ledger nothing.
    pub usage: Option<TokenUsage>,
    /// The event's type when webhook endpoints may subscribe to it
    /// ([`keel_protocol::WEBHOOK_EVENT_TYPES`]): the store writes their
    /// deliveries in the event's transaction.
    pub webhook: Option<&'static str>,
    /// The event ends a turn: endpoints of
    /// [`keel_protocol::SESSION_IDLE_WEBHOOK`] get it too when the
    /// transaction leaves the session's queue empty.
    pub ends_turn: bool,
}

impl EncodedEvent {
    /// Whether a write of `events` may leave its session with no turn in
    /// flight and nothing queued, so the store gives back the session's
    /// turn slot (see [`crate::AccessStore::reserve_turn`]) in its
    /// transaction: it ends a turn, refuses a keyed submission, or writes a
    /// checkpoint with no turn (`no_turn`: `Some(true)`). Every other write
    /// leaves the slot alone without a statement.
    pub(crate) fn may_free_turn_slot(events: &[EncodedEvent], no_turn: Option<bool>) -> bool {
        no_turn == Some(true)
            || events
                .iter()
                .any(|event| event.ends_turn || matches!(event.queue, Some(QueueChange::Refused { .. })))
    }

    /// The tokens a batch of events reports, summed; `None` when none of
    /// them reports any.
    pub(crate) fn batch_usage(events: &[EncodedEvent]) -> Option<TokenUsage> {
        events
            .iter()
            .filter_map(|event| event.usage.as_ref())
            .fold(None, |total, usage| {
                let mut total = total.unwrap_or_default();
                total.add(usage);
                Some(total)
            })
    }

    /// Serializes an event. A `submission_queued` event carries the
    /// submission to store in the queue.
    pub fn encode(event: &Event) -> Result<Self, StoreError> {
        let json = serde_json::to_string(event).map_err(|error| StoreError::Encode(error.to_string()))?;
        let queue = match (&event.msg, &event.submission_id) {
            (EventMsg::SubmissionQueued(queued), Some(id)) => Some(QueueChange::Queued {
                submission: Box::new(QueuedSubmission {
                    id: id.clone(),
                    op: queued.op.clone(),
                    on_busy: queued.on_busy,
                    sequence: 0,
                    traceparent: queued.traceparent.clone(),
                }),
                idempotency_key: queued.idempotency_key.clone(),
            }),
            (EventMsg::SubmissionRejected(rejected), Some(id)) => {
                rejected.idempotency_key.as_ref().map(|key| QueueChange::Refused {
                    submission_id: id.clone(),
                    idempotency_key: key.clone(),
                })
            }
            _ => None,
        };
        let title = match &event.msg {
            EventMsg::UserMessage(message) => title_of(&message.text),
            _ => None,
        };
        let usage = match &event.msg {
            EventMsg::TokenUsage(step) => Some(step.usage),
            EventMsg::ContextCompacted(compacted) => compacted.usage,
            _ => None,
        };
        Ok(Self {
            json,
            queue,
            title,
            usage,
            webhook: event.msg.webhook_type(),
            ends_turn: event.msg.ends_turn(),
        })
    }
}

/// The most characters of a session title.
pub const MAX_TITLE_CHARS: usize = 200;

/// How many characters of the first message make a session's title, at
/// most (a sidebar line).
const DERIVED_TITLE_CHARS: usize = 60;

/// The title a message gives a session: its first non-blank line, trimmed
/// and shortened to 60 characters at a word boundary (with `…`);
/// `None` for a blank message.
pub fn title_of(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|line| !line.is_empty())?;
    if line.chars().count() <= DERIVED_TITLE_CHARS {
        return Some(line.to_owned());
    }
    // The room left for the ellipsis.
    let cut: String = line.chars().take(DERIVED_TITLE_CHARS - 1).collect();
    let next_is_space = line[cut.len()..].starts_with(char::is_whitespace);
    let words = match cut.rfind(char::is_whitespace) {
        // A word that does not fit goes whole, unless it is the only one.
        Some(space) if !next_is_space && space > 0 => &cut[..space],
        _ => cut.as_str(),
    };
    Some(format!("{}…", words.trim_end()))
}

#[cfg(test)]
mod tests {
    use super::title_of;

    #[test]
    fn titles_are_one_line_cut_at_a_word_boundary() {
        assert_eq!(
            title_of("  \n  Hello there  \nsecond line").as_deref(),
            Some("Hello there")
        );
        assert_eq!(title_of(" \n\t "), None);
        let long = "Explain how the borrow checker decides that two mutable references overlap in a loop";
        let title = title_of(long).expect("a title");
        assert_eq!(title, "Explain how the borrow checker decides that two mutable…");
        assert!(title.chars().count() <= 60, "{title}");
        // One word longer than the bound is cut inside it.
        let word = "x".repeat(100);
        assert_eq!(title_of(&word).expect("a title").chars().count(), 60);
        // A cut that falls just before a space keeps the whole last word.
        let exact = format!("{} tail", "a".repeat(59));
        assert_eq!(title_of(&exact).expect("a title"), format!("{}…", "a".repeat(59)));
        let multibyte = "é".repeat(70);
        assert_eq!(title_of(&multibyte).expect("a title").chars().count(), 60);
    }
}
