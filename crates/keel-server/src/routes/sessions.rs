//! `POST /v1/sessions`, `GET /v1/sessions/{id}`, `PATCH /v1/sessions/{id}`,
//! `DELETE /v1/sessions/{id}`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access;
use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::host::SettingsChange;
use crate::openapi::errors::{BODY, CEILING, CREATING, LOADING, route_errors};
use crate::settings::{SessionSettings, ToolsOverrides};
use keel_agent::{BusyPolicy, MAX_BOT_ID_BYTES, MAX_SESSION_ID_BYTES, QueueMode, SessionContext, SessionStatus};
use keel_protocol::{ClientToolSpec, TokenUsage};
use keel_store::{CheckpointStoreExt, MAX_TITLE_CHARS, SessionSummary};
use keel_tools::ApprovalRules;

/// The bot a session belongs to when the request names none.
const DEFAULT_BOT_ID: &str = "keel-server";

/// The body of `POST /v1/sessions`: every field is optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "bot_id": "support",
    "context": {"customer": "c-1042"},
    "instructions": "Answer in one paragraph.",
    "on_busy": "queue"
}))]
pub(crate) struct CreateSession {
    /// The session's id; a fresh UUID when absent.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    pub(crate) id: Option<String>,
    /// The model spec (`provider:model`, or a model named in the server's
    /// keel.toml); the server's default when absent.
    #[schema(min_length = 1)]
    pub(crate) model: Option<String>,
    /// The bot the session belongs to (`keel-server` when absent).
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -~]+$")]
    pub(crate) bot_id: Option<String>,
    /// The tenant the session belongs to: the credentials' own when absent
    /// (`default` for the operator). Only the operator may name another.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    pub(crate) tenant: Option<String>,
    /// Metadata kept with the session and shown with it.
    pub(crate) context: Option<serde_json::Map<String, serde_json::Value>>,
    /// The system prompt. When absent: the bot's (`[bots.<id>]
    /// instructions` in keel.toml), else Keel's default coding-agent prompt
    /// when the session has tools and its bot is a coding agent, else none;
    /// `""` asks for none. Fixed when the session is created.
    pub(crate) instructions: Option<String>,
    /// Overrides of the server's `[tools]`, within its ceiling.
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub(crate) tools: Option<ToolsOverrides>,
    /// Approval policies over the server's `[approvals]`, within its ceiling.
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub(crate) approvals: Option<ApprovalRules>,
    /// What a message does while the session is busy, by default.
    pub(crate) on_busy: Option<BusyPolicy>,
    /// How messages waiting in the queue become turns: `merge` (all that
    /// wait join the next turn, one answer) or `each` (one turn and answer
    /// per message). Default: the bot's (`merge` for a coding agent,
    /// `each` for a bot with `coding_agent = false`).
    pub(crate) queue_mode: Option<QueueMode>,
    /// Tools the client executes (see "Client tools"): offered to the
    /// model with the server's tools; a call waits for a
    /// `client_tool_result` op. Default: the bot's (`[bots.<id>]
    /// client_tools`); a list given here replaces the bot's (`[]`: none).
    #[schema(max_items = 64)]
    pub(crate) client_tools: Option<Vec<ClientToolSpec>>,
    /// How long the client has to answer a call, in seconds; `0` waits for
    /// ever. Default: the bot's, else the server's `[tools]
    /// client_tool_timeout_secs` (600).
    #[serde(default, deserialize_with = "crate::extract::json_int64")]
    pub(crate) client_tool_timeout_secs: Option<u64>,
}

/// A session as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SessionView {
    /// The session's id.
    id: String,
    /// Its title, once renamed (`PATCH`).
    title: Option<String>,
    /// The bot it belongs to.
    bot_id: String,
    /// The tenant it belongs to: only that tenant's principals (and the
    /// operator) see it.
    tenant: String,
    /// The metadata it was created with.
    context: serde_json::Map<String, serde_json::Value>,
    /// Its model spec (`None` when its stored settings no longer parse).
    model: Option<String>,
    /// What a message does while it is busy, by default.
    on_busy: BusyPolicy,
    /// How messages waiting in its queue become turns (`merge`: one turn
    /// for all; `each`: a turn per message).
    queue_mode: QueueMode,
    /// When it was created, in milliseconds since the Unix epoch.
    created_at_ms: u64,
    /// When its log last grew.
    updated_at_ms: u64,
    /// The sequence of its newest event.
    last_sequence: u64,
    /// What it is doing.
    state: ViewState,
    /// The turn running, if any.
    running_turn_id: Option<String>,
    /// Submissions waiting in its queue (loaded sessions only).
    queued: usize,
    /// The tool calls waiting for a decision.
    pending_approvals: Vec<String>,
    /// The calls of client tools waiting for their result.
    pending_client_tools: Vec<String>,
    /// The tools the client executes, as declared.
    client_tools: Vec<ClientToolSpec>,
    /// Tokens used, summed over its model steps.
    usage: TokenUsage,
    /// Turns that ended normally.
    turns_completed: u64,
    /// Whether its runtime is loaded on the node that answered.
    live: bool,
}

/// What a session is doing.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ViewState {
    /// Nothing runs and nothing waits.
    Idle,
    /// A turn runs, or a submission is being acted on.
    Running,
    /// A turn waits for a decision about a tool call.
    AwaitingApproval,
    /// A turn waits for the client's result of a client tool call.
    AwaitingClientTool,
}

/// What a session id keeps as it is in a path segment: the unreserved
/// characters of RFC 3986 (ids may hold spaces, slashes or any text).
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The answer to a request that made a session (`POST /v1/sessions`, a
/// fork): `201`, the view, and a `Location` naming the new session.
pub(crate) struct Created(pub(super) SessionView);

impl IntoResponse for Created {
    fn into_response(self) -> Response {
        let id = utf8_percent_encode(&self.0.id, PATH_SEGMENT);
        let location = format!("/v1/sessions/{id}");
        (StatusCode::CREATED, [(header::LOCATION, location)], Json(self.0)).into_response()
    }
}

impl SessionView {
    /// The view of a stored session, with the live status when it is loaded.
    pub(super) fn new(server: &Server, summary: SessionSummary, live: Option<SessionStatus>) -> Self {
        // Settings that do not parse show no model (the session will not
        // load; the listing still shows it).
        let settings = SessionSettings::of(&summary.context).ok();
        let (running_turn_id, queued, last_sequence, acting) = match &live {
            Some(status) => (
                status.running_turn_id.clone(),
                status.queued,
                status.last_sequence.max(summary.last_sequence),
                status.busy,
            ),
            None => (summary.running_turn_id.clone(), 0, summary.last_sequence, false),
        };
        let stored = (&summary.awaiting_approval[..], &summary.awaiting_client[..]);
        let (pending_approvals, pending_client_tools) = waiting(live.as_ref(), stored);
        // A live session that took a submission is `running` from then on,
        // before its turn has an id, until what it did is stored.
        let state = if !pending_approvals.is_empty() {
            ViewState::AwaitingApproval
        } else if !pending_client_tools.is_empty() {
            ViewState::AwaitingClientTool
        } else if running_turn_id.is_some() || acting {
            ViewState::Running
        } else {
            ViewState::Idle
        };
        Self {
            title: summary.title,
            id: summary.session_id,
            bot_id: summary.bot_id,
            tenant: summary.context.tenant,
            context: summary.context.metadata,
            model: settings
                .as_ref()
                .and_then(|settings| server.host.factory.model_spec(settings)),
            on_busy: settings.as_ref().map(|settings| settings.on_busy).unwrap_or_default(),
            queue_mode: settings
                .as_ref()
                .map(|settings| settings.queue_mode)
                .unwrap_or_default(),
            client_tools: settings.map(|settings| settings.client_tools).unwrap_or_default(),
            created_at_ms: summary.created_at_ms,
            updated_at_ms: summary.updated_at_ms,
            last_sequence,
            state,
            running_turn_id,
            queued,
            pending_approvals,
            pending_client_tools,
            usage: summary.usage,
            turns_completed: summary.turns_completed,
            live: live.is_some(),
        }
    }
}

/// The calls a view shows waiting for a decision and for a client's
/// result: those of the live status and those of the `stored` summary
/// (approvals, client calls) read for the view. The status takes a wait
/// on only once its request is committed, so a client that saw the request
/// in the stream and asks at once may find only the summary holding it;
/// and a wait the session ended but has not committed stays, as the
/// summary says: either way the view shows what the log holds.
fn waiting(live: Option<&SessionStatus>, stored: (&[String], &[String])) -> (Vec<String>, Vec<String>) {
    match live {
        Some(status) => (
            joined(&status.awaiting_approval, stored.0),
            joined(&status.awaiting_client, stored.1),
        ),
        None => (stored.0.to_vec(), stored.1.to_vec()),
    }
}

/// The call ids of `live` and then those of `stored` it lacks.
fn joined(live: &[String], stored: &[String]) -> Vec<String> {
    let mut calls = live.to_vec();
    calls.extend(stored.iter().filter(|call| !live.contains(call)).cloned());
    calls
}

/// Checks a session id the way the runtime does, with an API message.
pub(super) fn check_id(id: &str) -> Result<(), ApiError> {
    if !keel_protocol::is_path_name(id, MAX_SESSION_ID_BYTES) {
        return Err(ApiError::InvalidRequest(format!(
            "`id` must be 1 to {MAX_SESSION_ID_BYTES} printable ASCII characters other than `%`"
        )));
    }
    Ok(())
}

/// Whether `text` is 1 to `max` printable ASCII characters (space
/// included): ids go into paths, headers, directory names and metric
/// labels, and the bound is then the same in bytes and in characters, as
/// the API's description states it.
fn printable_ascii(text: &str, max: usize) -> bool {
    !text.is_empty() && text.len() <= max && text.bytes().all(|byte| (b' '..=b'~').contains(&byte))
}

/// Checks a bot id (given at creation, or as a filter) against the
/// runtime's bound, with an API message: it is stored with every checkpoint
/// and becomes a metric label, so it is short and printable.
pub(crate) fn check_bot_id(bot_id: &str) -> Result<(), ApiError> {
    if !printable_ascii(bot_id, MAX_BOT_ID_BYTES) {
        return Err(ApiError::InvalidRequest(format!(
            "`bot_id` must be 1 to {MAX_BOT_ID_BYTES} printable ASCII characters"
        )));
    }
    Ok(())
}

route_errors!(
    /// What `POST /v1/sessions` can answer besides `201`.
    CreateErrors: BODY,
    CEILING,
    LOADING,
    CREATING
);

/// `POST /v1/sessions`.
#[utoipa::path(
    post,
    path = "/sessions",
    tag = "sessions",
    operation_id = "create_session",
    summary = "Create a session",
    description = "Creates a session with its settings (checked against the server's ceiling before anything is \
        stored) and loads it, in the credentials' tenant (the operator may name one).",
    request_body(
        content = Option<CreateSession>,
        description = "The settings; an empty body is `{}`.",
        content_type = "application/json"
    ),
    responses(
        (
            status = 201,
            description = "The session, created and loaded.",
            body = SessionView,
            headers(("Location" = String, description = "The new session's path.")),        ),
        CreateErrors,
    ),
    security(("bearer" = ["submit"])),
)]
pub(crate) async fn create(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    ApiJson(request): ApiJson<Option<CreateSession>>,
) -> Result<Created, ApiError> {
    principal.require(Scope::Submit)?;
    // `null` is the empty body, as the description allows.
    let mut request = request.unwrap_or_default();
    let id = access::new_session_id(&principal, request.id.take())?;
    let (summary, status) = create_session(&server, &principal, &id, request).await?;
    Ok(Created(SessionView::new(&server, summary, Some(status))))
}

/// Creates and loads the session `id` from `request` (its `id` is not
/// read: the caller chose `id`, for whom it may), in the tenant the
/// principal may create it in. Its stored summary and live status.
pub(crate) async fn create_session(
    server: &Server,
    principal: &Principal,
    id: &str,
    request: CreateSession,
) -> Result<(SessionSummary, keel_agent::SessionStatus), ApiError> {
    principal.require(Scope::Submit)?;
    let tenant = access::new_session_tenant(principal, request.tenant.as_deref())?;
    let id = id.to_owned();
    check_id(&id)?;
    if let Some(bot_id) = &request.bot_id {
        check_bot_id(bot_id)?;
    }
    let bot_id = request.bot_id.unwrap_or_else(|| DEFAULT_BOT_ID.to_owned());
    let bot = server.host.factory.keel.bot(&bot_id);
    let mut client_tools = request.client_tools.unwrap_or(bot.client_tools);
    crate::client_tools::check_declared(&server.host.factory.keel, &mut client_tools)?;
    let asked = SessionSettings {
        client_tools,
        client_tool_timeout_secs: request.client_tool_timeout_secs.or(bot.client_tool_timeout_secs),
        model: request.model,
        instructions: request.instructions,
        tools: request.tools,
        approvals: request.approvals,
        on_busy: request.on_busy.unwrap_or_default(),
        ..SessionSettings::default()
    };
    let settings = server
        .host
        .factory
        .with_bot_defaults(&tenant, &bot_id, asked, request.queue_mode);
    // A bad spec or a missing key is the request's fault; check it before
    // anything is stored. The resolved spec is stored, so the session keeps
    // its model when the server's default changes.
    let spec = server.host.factory.check(&tenant, &settings).await?;
    let settings = SessionSettings {
        model: Some(spec),
        ..settings
    };
    let context = SessionContext {
        bot_id,
        tenant,
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
    Ok((summary, status))
}

route_errors!(
    /// What a route of one session that reads no body can answer.
    OneSessionErrors: ["not_found", "missing_scope_read"]
);

/// `GET /v1/sessions/{id}`.
#[utoipa::path(
    get,
    path = "/sessions/{id}",
    tag = "sessions",
    operation_id = "get_session",
    summary = "Get a session",
    description = "The session as stored, with its live status when the answering node runs it. Never loads it.",
    params(("id" = String, Path, description = "The session's id.")),
    security(("bearer" = ["read"])),
    responses((status = 200, description = "The session.", body = SessionView), OneSessionErrors),
)]
pub(crate) async fn show(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let summary = access::session(&server, &principal, Scope::Read, &id)
        .await?
        .ok_or_else(|| ApiError::unknown_session(&id))?;
    Ok(Json(view(&server, summary)))
}

/// The view of the stored session `summary`, live status included.
fn view(server: &Server, summary: SessionSummary) -> SessionView {
    let live = server.host.status(&summary.session_id);
    SessionView::new(server, summary, live)
}

/// The query of `DELETE /v1/sessions/{id}`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeleteQuery {
    /// Also remove the session's workspace directory.
    #[serde(default)]
    workspace: bool,
}

route_errors!(
    /// What `DELETE /v1/sessions/{id}` can answer besides `204`.
    DeleteErrors: [
        "invalid_request",
        "not_found",
        "workspace_not_removable",
        "session_elsewhere",
        "unavailable",
        "missing_scope_admin"
    ]
);

/// `DELETE /v1/sessions/{id}`: `204` once the session is gone, `404` if
/// there was none.
#[utoipa::path(
    delete,
    path = "/sessions/{id}",
    tag = "sessions",
    operation_id = "delete_session",
    summary = "Delete a session",
    description = "Deletes the session and its log; with `workspace=true` also its workspace directory.",
    params(("id" = String, Path, description = "The session's id."), DeleteQuery),
    security(("bearer" = ["admin"])),
    responses((status = 204, description = "The session is gone."), DeleteErrors),
)]
pub(crate) async fn delete(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    access::session(&server, &principal, Scope::Admin, &id).await?;
    if server.host.delete(&id, query.workspace).await? {
        server.ag_ui_threads.forget(&id);
        tracing::info!(session_id = %id, workspace = query.workspace, "session deleted");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::unknown_session(&id))
    }
}

/// The body of `PATCH /v1/sessions/{id}`: a new title, a new model, or
/// both (at least one; `null` is not a value of either).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"title": "Trip to Lisbon"}), min_properties = 1)]
pub(crate) struct UpdateSession {
    /// The new title: 1 to 200 characters, not all white space, no control
    /// characters; stored trimmed.
    #[serde(default, deserialize_with = "crate::extract::not_null")]
    #[schema(
        value_type = String,
        required = false,
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*$"
    )]
    title: Option<String>,
    /// The new model spec, checked like `model` at creation (a `script:`
    /// path is stored absolute); used from the session's next turn. Refused
    /// (`409 session_busy`) while a turn is in flight or submissions wait.
    #[serde(default, deserialize_with = "crate::extract::not_null")]
    #[schema(value_type = String, required = false, min_length = 1)]
    model: Option<String>,
    /// The session's client tools, replacing its list (`[]`: none),
    /// checked as at creation; used from the next turn. Refused (`409
    /// session_busy`) while a turn is in flight, waiting included.
    #[serde(default, deserialize_with = "crate::extract::not_null")]
    #[schema(value_type = Vec<ClientToolSpec>, required = false, max_items = 64)]
    client_tools: Option<Vec<ClientToolSpec>>,
}

route_errors!(
    /// What `PATCH /v1/sessions/{id}` can answer besides `200`.
    UpdateErrors: BODY,
    [
        "not_found",
        "script_model_over_ceiling",
        "model_not_found",
        "session_busy",
        "session_elsewhere",
        "unavailable",
        "missing_scope_submit",
        "invalid_client_tool",
        "client_tool_conflict"
    ]
);

/// `PATCH /v1/sessions/{id}`: renames the session, switches its model or
/// replaces its client tools;
/// answers the session.
#[utoipa::path(
    patch,
    path = "/sessions/{id}",
    tag = "sessions",
    operation_id = "update_session",
    summary = "Rename a session, switch its model or replace its client tools",
    description = "Sets the session's `title`, its `model`, its `client_tools`, or several. A new model is \
        checked as at creation, recorded in the log (`model_changed`) and used from the next turn; new client \
        tools are checked as at creation and offered from the next turn; both are refused while a turn is in \
        flight. This is how a session whose model the server no longer offers (`session_model_unavailable`) \
        is made to load again.",
    params(("id" = String, Path, description = "The session's id.")),
    request_body(content = UpdateSession, content_type = "application/json"),
    security(("bearer" = ["submit"])),
    responses((status = 200, description = "The session, updated.", body = SessionView), UpdateErrors),
)]
pub(crate) async fn update(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(request): ApiJson<UpdateSession>,
) -> Result<Json<SessionView>, ApiError> {
    let stored = access::session(&server, &principal, Scope::Submit, &id).await?;
    let title = request.title.as_deref().map(checked_title).transpose()?;
    if title.is_none() && request.model.is_none() && request.client_tools.is_none() {
        return Err(ApiError::InvalidRequest(
            "give `title`, `model`, `client_tools` or several".to_owned(),
        ));
    }
    let mut client_tools = request.client_tools;
    if let Some(tools) = &mut client_tools {
        crate::client_tools::check_declared(&server.host.factory.keel, tools)?;
    }
    let Some(stored) = stored else {
        return Err(ApiError::unknown_session(&id));
    };
    if let Some(model) = &request.model {
        let spec = server.host.factory.check_model(&stored.context.tenant, model).await?;
        server.host.change_model(&id, &spec).await?;
    }
    if let Some(tools) = client_tools {
        server
            .host
            .change_settings(&id, SettingsChange::ClientTools(tools))
            .await?;
    }
    if let Some(title) = title
        && !server.host.store.rename_session(&id, title).await?
    {
        return Err(ApiError::unknown_session(&id));
    }
    let summary = server
        .host
        .store
        .session_summary(&id)
        .await?
        .ok_or_else(|| ApiError::unknown_session(&id))?;
    Ok(Json(view(&server, summary)))
}

/// A title as sent, checked, and trimmed. The length is the title's as
/// sent, so the bound is the one the description states.
fn checked_title(title: &str) -> Result<&str, ApiError> {
    let trimmed = title.trim();
    if trimmed.is_empty() || title.chars().count() > MAX_TITLE_CHARS || title.chars().any(char::is_control) {
        return Err(ApiError::InvalidRequest(format!(
            "`title` must be 1 to {MAX_TITLE_CHARS} characters without control characters"
        )));
    }
    Ok(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(approvals: &[&str], client: &[&str]) -> SessionStatus {
        SessionStatus {
            running_turn_id: Some("t1".to_owned()),
            queued: 0,
            awaiting_approval: approvals.iter().map(|call| (*call).to_owned()).collect(),
            awaiting_client: client.iter().map(|call| (*call).to_owned()).collect(),
            last_sequence: 7,
            busy: true,
        }
    }

    fn ids(calls: &[&str]) -> Vec<String> {
        calls.iter().map(|call| (*call).to_owned()).collect()
    }

    #[test]
    fn a_wait_the_log_holds_shows_before_the_live_status_takes_it_on() {
        // Committed, not yet in the status: a reader who saw the request
        // in the stream finds it waiting.
        let live = status(&[], &[]);
        let shown = waiting(Some(&live), (&ids(&["a1"]), &ids(&["c1"])));
        assert_eq!(shown, (ids(&["a1"]), ids(&["c1"])));
        // Ended in the status, not yet committed: still waiting.
        let shown = waiting(Some(&live), (&ids(&["a1"]), &[]));
        assert_eq!(shown, (ids(&["a1"]), Vec::new()));
        // Both, each call once, the live order first.
        let live = status(&["a2", "a1"], &["c1"]);
        let shown = waiting(Some(&live), (&ids(&["a1", "a3"]), &ids(&["c1"])));
        assert_eq!(shown, (ids(&["a2", "a1", "a3"]), ids(&["c1"])));
        // Not loaded: the summary alone.
        assert_eq!(waiting(None, (&ids(&["a1"]), &[])), (ids(&["a1"]), Vec::new()));
    }
}
