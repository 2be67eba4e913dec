//! Forking a session: a new session whose history is another's as it was at
//! a sequence of its log.

use std::ops::ControlFlow;

use keel_protocol::{Event, EventMsg, SessionForkedEvent, TranscriptItem};
use keel_store::{Checkpoint, CheckpointStore, EncodedEvent, EventPageRequest, LastTurn, StoreError, walk_back};

/// Events read per page while looking for the turn around a fork point.
const SCAN_PAGE: usize = 500;

/// Why a fork was refused.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The parent does not exist.
    #[error("unknown session '{0}'")]
    UnknownParent(String),
    /// The new session's id is taken.
    #[error("session '{0}' already exists")]
    Exists(String),
    /// The fork point is not one the parent's history can be cut at (past
    /// the log, inside a turn, inside a write batch).
    #[error("{0}")]
    BadPoint(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Forks `parent` at `at_sequence` into a new session `id` and returns the
/// fork's first event.
///
/// The fork keeps the parent's bot, context and settings; its counters,
/// usage and standing approvals start afresh. Its latest turn (what a
/// `regenerate` rolls back) is the parent's turn that ended at the point. Only the parent's history up
/// to the fork point is copied, never its log: the fork's log starts with
/// `session_forked`. The point must be between turns, since the history
/// inside a turn may hold a step the model never finished (a tool call
/// without its result). The fork is created in one transaction with its
/// first event, and only if `id` is free, so of two forks to one id (in
/// any processes) one succeeds and the other gets [`ForkError::Exists`].
/// A server also checks its live sessions, which may not be stored yet.
pub async fn fork_session(
    store: &dyn CheckpointStore,
    parent: &str,
    at_sequence: u64,
    id: &str,
) -> Result<SessionForkedEvent, ForkError> {
    let summary = store
        .session_summary(parent)
        .await?
        .ok_or_else(|| ForkError::UnknownParent(parent.to_owned()))?;
    if at_sequence > summary.last_sequence {
        return Err(ForkError::BadPoint(format!(
            "session '{parent}' has {} events, not {at_sequence}",
            summary.last_sequence
        )));
    }
    let last_turn = check_between_turns(store, parent, at_sequence).await?;
    let history = history_at(store, parent, at_sequence).await?;
    let mut checkpoint = Checkpoint::empty(id);
    checkpoint.session_context = summary.context;
    // The turn that ended at the fork point is the fork's latest turn too,
    // so that a regenerate in the fork answers it again.
    if let Some(turn_id) = last_turn {
        let before = point_before_turn(store, parent, &turn_id).await?;
        let history_from = history_at(store, parent, before).await?.len() as u64;
        checkpoint.last_turn = Some(LastTurn { turn_id, history_from });
    }
    let forked = SessionForkedEvent {
        parent_session_id: parent.to_owned(),
        at_sequence,
        history_items: history.len() as u64,
    };
    let event = Event {
        submission_id: None,
        msg: EventMsg::SessionForked(forked.clone()),
    };
    store
        .create(&checkpoint, &history, vec![EncodedEvent::encode(&event)?])
        .await
        .map_err(|error| match error {
            StoreError::Exists(id) => ForkError::Exists(id),
            other => ForkError::Store(other),
        })?;
    tracing::info!(session_id = %id, parent = %parent, at_sequence, "session forked");
    Ok(forked)
}

/// The parent's history once its log reached `at`.
async fn history_at(store: &dyn CheckpointStore, parent: &str, at: u64) -> Result<Vec<TranscriptItem>, ForkError> {
    store
        .history_until(parent, at)
        .await
        .map_err(|error| match error {
            StoreError::Invalid(message) => ForkError::BadPoint(message),
            other => ForkError::Store(other),
        })?
        .ok_or_else(|| ForkError::UnknownParent(parent.to_owned()))
}

/// The fork point just before turn `turn_id` of `session_id`: the sequence
/// of the event that ended the turn before it, or 0 when none did. A fork
/// there with a new message edits the turn's first message.
pub async fn point_before_turn(store: &dyn CheckpointStore, session_id: &str, turn_id: &str) -> Result<u64, ForkError> {
    if store.session_summary(session_id).await?.is_none() {
        return Err(ForkError::UnknownParent(session_id.to_owned()));
    }
    // The turn whose start is looked for; once found, the end of the turn
    // before it. A turn that regenerated another starts from the history
    // before that one (the rollback commits with the turn's start, so no
    // point lies between them): the search goes on from the undone turn.
    let mut target = Some(turn_id.to_owned());
    let mut found = false;
    let mut point = 0;
    walk_back(store, session_id, |event| {
        match (&target, &event.msg) {
            (Some(wanted), EventMsg::TurnStarted(start)) if start.turn_id == *wanted => {
                found = true;
                target = None;
            }
            (None, EventMsg::TurnRolledBack(rolled)) => target = Some(rolled.rolled_back_turn_id.clone()),
            (None, msg) if msg.ends_turn() => {
                point = event.sequence;
                return ControlFlow::Break(());
            }
            _ => {}
        }
        ControlFlow::Continue(())
    })
    .await?;
    if !found {
        return Err(ForkError::BadPoint(format!(
            "session '{session_id}' has no turn '{turn_id}'"
        )));
    }
    Ok(point)
}

/// Refuses a fork point inside a turn.
/// Returns the turn that ended last at or before it, if any.
async fn check_between_turns(
    store: &dyn CheckpointStore,
    session_id: &str,
    at: u64,
) -> Result<Option<String>, ForkError> {
    let mut before = at.saturating_add(1);
    while before > 1 {
        let page = store
            .event_page(
                session_id,
                EventPageRequest {
                    before_sequence: Some(before),
                    limit: SCAN_PAGE,
                },
            )
            .await?;
        for event in page.events.iter().rev() {
            if event.msg.ends_turn() {
                return Ok(event.msg.turn_id().map(str::to_owned));
            }
            if let EventMsg::TurnStarted(started) = &event.msg {
                return Err(ForkError::BadPoint(format!(
                    "event {at} is inside turn '{}' (started at {}); fork where no turn is running",
                    started.turn_id, event.sequence
                )));
            }
        }
        match page.events.first() {
            Some(first) if page.has_more => before = first.sequence,
            _ => break,
        }
    }
    Ok(None)
}
