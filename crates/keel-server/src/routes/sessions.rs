//! `POST /v1/sessions`, `GET /v1/sessions`, `GET /v1/sessions/{id}`,
//! `POST /v1/sessions/{id}/fork`.
//! `PATCH /v1/sessions/{id}`, `DELETE /v1/sessions/{id}`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use crate::Server;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::routes::submissions::{check_op, submit_op};
use crate::settings::{SessionSettings, ToolsOverrides};
use keel_agent::{
    BusyPolicy, ForkError, MAX_BOT_ID_BYTES, MAX_SESSION_ID_BYTES, SessionContext, SessionStatus, fork_session,
    point_before_turn,
};
use keel_protocol::{Op, TokenUsage, new_id};
use keel_store::{CheckpointStoreExt, MAX_TITLE_CHARS, SessionSummary};
use keel_tools::ApprovalRules;

/// The bot a session belongs to when the request names none.
const DEFAULT_BOT_ID: &str = "keel-server";

/// Sessions per page by default, and at most.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// The body of `POST /v1/sessions`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSession {
    id: Option<String>,
    model: Option<String>,
    bot_id: Option<String>,
    context: Option<serde_json::Map<String, serde_json::Value>>,
    instructions: Option<String>,
    tools: Option<ToolsOverrides>,
    approvals: Option<ApprovalRules>,
    on_busy: Option<BusyPolicy>,
}

/// A session as the API shows it.
#[derive(Debug, Serialize)]
pub(crate) struct SessionView {
    id: String,
    title: Option<String>,
    bot_id: String,
    context: serde_json::Map<String, serde_json::Value>,
    model: Option<String>,
    on_busy: BusyPolicy,
    created_at_ms: u64,
    updated_at_ms: u64,
    last_sequence: u64,
    state: &'static str,
    running_turn_id: Option<String>,
    queued: usize,
    pending_approvals: Vec<String>,
    usage: TokenUsage,
    turns_completed: u64,
    live: bool,
}

/// What a session id keeps as it is in a path segment: the unreserved
/// characters of RFC 3986 (ids may hold spaces, slashes or any text).
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The answer to a request that made a session (`POST /v1/sessions`, a
/// fork): `201`, the view, and a `Location` naming the new session.
pub(crate) struct Created(SessionView);

impl IntoResponse for Created {
    fn into_response(self) -> Response {
        let id = utf8_percent_encode(&self.0.id, PATH_SEGMENT);
        let location = format!("/v1/sessions/{id}");
        (StatusCode::CREATED, [(header::LOCATION, location)], Json(self.0)).into_response()
    }
}

impl SessionView {
    /// The view of a stored session, with the live status when it is loaded.
    fn new(server: &Server, summary: SessionSummary, live: Option<SessionStatus>) -> Self {
        // Settings that do not parse show no model (the session will not
        // load; the listing still shows it).
        let settings = SessionSettings::of(&summary.context).ok();
        let (running_turn_id, queued, pending_approvals, last_sequence, acting) = match &live {
            Some(status) => (
                status.running_turn_id.clone(),
                status.queued,
                status.awaiting_approval.clone(),
                status.last_sequence.max(summary.last_sequence),
                status.busy,
            ),
            None => (
                summary.running_turn_id.clone(),
                0,
                summary.awaiting_approval.clone(),
                summary.last_sequence,
                false,
            ),
        };
        // A live session that took a submission is `running` from then on,
        // before its turn has an id, until what it did is stored.
        let state = if !pending_approvals.is_empty() {
            "awaiting_approval"
        } else if running_turn_id.is_some() || acting {
            "running"
        } else {
            "idle"
        };
        Self {
            title: summary.title,
            id: summary.session_id,
            bot_id: summary.bot_id,
            context: summary.context.metadata,
            model: settings
                .as_ref()
                .and_then(|settings| server.host.factory.model_spec(settings)),
            on_busy: settings.map(|settings| settings.on_busy).unwrap_or_default(),
            created_at_ms: summary.created_at_ms,
            updated_at_ms: summary.updated_at_ms,
            last_sequence,
            state,
            running_turn_id,
            queued,
            pending_approvals,
            usage: summary.usage,
            turns_completed: summary.turns_completed,
            live: live.is_some(),
        }
    }
}

/// Checks a session id the way the runtime does, with an API message.
fn check_id(id: &str) -> Result<(), ApiError> {
    if id.is_empty() || id.len() > MAX_SESSION_ID_BYTES || id.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "`id` must be 1 to {MAX_SESSION_ID_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// Checks a bot id (given at creation, or as a filter) against the
/// runtime's bound, with an API message: it is stored with every checkpoint
/// and becomes a metric label, so it is short and printable.
pub(crate) fn check_bot_id(bot_id: &str) -> Result<(), ApiError> {
    if bot_id.is_empty() || bot_id.len() > MAX_BOT_ID_BYTES || bot_id.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "`bot_id` must be 1 to {MAX_BOT_ID_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// `POST /v1/sessions`.
pub(crate) async fn create(
    State(server): State<Arc<Server>>,
    ApiJson(request): ApiJson<CreateSession>,
) -> Result<Created, ApiError> {
    let id = request.id.unwrap_or_else(new_id);
    check_id(&id)?;
    if let Some(bot_id) = &request.bot_id {
        check_bot_id(bot_id)?;
    }
    let settings = SessionSettings {
        model: request.model,
        instructions: request.instructions,
        tools: request.tools,
        approvals: request.approvals,
        on_busy: request.on_busy.unwrap_or_default(),
    };
    // A bad spec or a missing key is the request's fault; check it before
    // anything is stored. The resolved spec is stored, so the session keeps
    // its model when the server's default changes.
    let spec = server.host.factory.check(&settings).await?;
    let settings = SessionSettings {
        model: Some(spec),
        ..settings
    };
    let context = SessionContext {
        bot_id: request.bot_id.unwrap_or_else(|| DEFAULT_BOT_ID.to_owned()),
        metadata: request.context.unwrap_or_default(),
        settings: Some(settings.to_value()),
    };
    let session = server.host.create(&id, settings, context).await?;
    session.started().await;
    let status = session.handle.status();
    drop(session);
    let summary = server
        .host
        .store
        .session_summary(&id)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("session '{id}' was created but cannot be read")))?;
    Ok(Created(SessionView::new(&server, summary, Some(status))))
}

/// The query of `GET /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    limit: Option<usize>,
    cursor: Option<String>,
    /// Only the sessions of this bot.
    bot_id: Option<String>,
}

/// A page of sessions.
#[derive(Debug, Serialize)]
pub(crate) struct SessionList {
    sessions: Vec<SessionView>,
    next_cursor: Option<String>,
}

/// `GET /v1/sessions`.
pub(crate) async fn list(
    State(server): State<Arc<Server>>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<SessionList>, ApiError> {
    let limit = super::page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    if let Some(bot_id) = &query.bot_id {
        check_bot_id(bot_id)?;
    }
    let page = server
        .host
        .store
        .list_sessions_page(query.cursor.as_deref(), limit, query.bot_id.as_deref())
        .await?;
    let sessions = page
        .sessions
        .into_iter()
        .map(|summary| {
            let live = server.host.status(&summary.session_id);
            SessionView::new(&server, summary, live)
        })
        .collect();
    Ok(Json(SessionList {
        sessions,
        next_cursor: page.next_cursor,
    }))
}

/// `GET /v1/sessions/{id}`.
pub(crate) async fn show(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let summary = server
        .host
        .store
        .session_summary(&id)
        .await?
        .ok_or_else(|| ApiError::unknown_session(&id))?;
    let live = server.host.status(&id);
    Ok(Json(SessionView::new(&server, summary, live)))
}

/// The body of `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkSession {
    /// The parent's event the fork starts after.
    at_sequence: Option<u64>,
    /// Or the parent's turn the fork starts just before (after the event
    /// that ended the turn before it).
    before_turn: Option<String>,
    /// The new session's id; a fresh one when absent.
    id: Option<String>,
    /// A user message submitted to the fork once it exists: with a point
    /// just before a past message's turn, this edits that message.
    message: Option<String>,
}

/// `POST /v1/sessions/{id}/fork`: a new session whose history is the
/// parent's as it was at `at_sequence` (between turns). Only the history is
/// copied; the fork's log starts with a `session_forked` event naming its
/// parent.
pub(crate) async fn fork(
    State(server): State<Arc<Server>>,
    Path(parent): Path<String>,
    ApiJson(request): ApiJson<ForkSession>,
) -> Result<Created, ApiError> {
    let id = request.id.unwrap_or_else(new_id);
    check_id(&id)?;
    // A live session may not be stored yet (it is created first).
    if server.host.status(&id).is_some() {
        return Err(ApiError::Conflict(format!("session '{id}' already exists")));
    }
    // A message the fork would refuse must not leave a fork behind.
    let message = request.message.map(|text| Op::UserInput { text });
    if let Some(op) = &message {
        check_op(op)?;
    }
    let store = &server.host.store;
    let fork_error = |error| match error {
        ForkError::UnknownParent(parent) => ApiError::unknown_session(&parent),
        ForkError::Exists(_) => ApiError::Conflict(error.to_string()),
        ForkError::BadPoint(message) => ApiError::InvalidRequest(message),
        ForkError::Store(error) => error.into(),
    };
    let at_sequence = match (request.at_sequence, request.before_turn) {
        (Some(at_sequence), None) => at_sequence,
        (None, Some(turn_id)) => point_before_turn(store.as_ref(), &parent, &turn_id)
            .await
            .map_err(fork_error)?,
        _ => {
            return Err(ApiError::InvalidRequest(
                "give one of `at_sequence` and `before_turn`".to_owned(),
            ));
        }
    };
    // The fork's workspace is made with it, like a new session's (never an
    // existing directory of that name); it is taken back if the fork fails.
    if store.session_summary(&id).await?.is_some() {
        return Err(ApiError::Conflict(format!("session '{id}' already exists")));
    }
    server.host.factory.create_workspace(&id).await?;
    if let Err(error) = fork_session(store.as_ref(), &parent, at_sequence, &id).await {
        server.host.factory.discard_workspace(&id).await;
        return Err(fork_error(error));
    }
    if let Some(op) = message {
        submit_op(&server, &id, op, None, None).await?;
    }
    let summary = store
        .session_summary(&id)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("session '{id}' was forked but cannot be read")))?;
    let live = server.host.status(&id);
    Ok(Created(SessionView::new(&server, summary, live)))
}

/// The query of `DELETE /v1/sessions/{id}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteQuery {
    /// Also remove the session's workspace directory.
    #[serde(default)]
    workspace: bool,
}

/// `DELETE /v1/sessions/{id}`: `204` once the session is gone, `404` if
/// there was none.
pub(crate) async fn delete(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    if server.host.delete(&id, query.workspace).await? {
        tracing::info!(session_id = %id, workspace = query.workspace, "session deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::unknown_session(&id))
    }
}

/// The body of `PATCH /v1/sessions/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateSession {
    title: String,
}

/// `PATCH /v1/sessions/{id}`: renames the session; answers the session.
pub(crate) async fn update(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<UpdateSession>,
) -> Result<Json<SessionView>, ApiError> {
    let title = request.title.trim();
    if title.is_empty() || title.chars().count() > MAX_TITLE_CHARS || title.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "`title` must be 1 to {MAX_TITLE_CHARS} characters without control characters"
        )));
    }
    if !server.host.store.rename_session(&id, title).await? {
        return Err(ApiError::unknown_session(&id));
    }
    show(State(server), Path(id)).await
}
