//! `POST /v1/sessions/{id}/fork`: a new session from another's history.

use std::sync::Arc;

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, AnyOfBuilder, KnownFormat, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type,
};
use utoipa::{PartialSchema, ToSchema};

use super::access;
use super::sessions::{Created, SessionView, check_id};
use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openapi::errors::{BODY, CEILING, LOADING, QUEUEING, route_errors};
use crate::routes::submissions::{check_op, submit_op};
use keel_agent::{ForkError, MAX_SESSION_ID_BYTES, fork_session, point_before_turn};
use keel_protocol::{Op, TranscriptItem};
use keel_store::{CheckpointStoreExt, title_of};

/// The body of `POST /v1/sessions/{id}/fork`: one of `at_sequence` and
/// `before_turn`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkSession {
    /// The parent's event the fork starts after.
    #[serde(default, deserialize_with = "crate::extract::json_int64")]
    at_sequence: Option<u64>,
    /// Or the parent's turn the fork starts just before (after the event
    /// that ended the turn before it).
    before_turn: Option<String>,
    /// The new session's id; a fresh one when absent.
    id: Option<String>,
    /// A user message submitted to the fork once it exists: with a point
    /// just before a past message's turn, this edits that message. Not only
    /// white space.
    message: Option<String>,
}

/// "Exactly one of `at_sequence` and `before_turn`, `null` being absent" is
/// beyond the derive: one closed object per way of naming the point, so
/// that the description accepts exactly the bodies the handler does.
impl PartialSchema for ForkSession {
    fn schema() -> RefOr<Schema> {
        let by_sequence = point(
            "at_sequence",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                .minimum(Some(0))
                .description(Some("The parent's event the fork starts after.")),
            "before_turn",
        );
        let by_turn = point(
            "before_turn",
            ObjectBuilder::new().schema_type(Type::String).description(Some(
                "The parent's turn the fork starts just before (after the event that ended the turn before it).",
            )),
            "at_sequence",
        );
        // `anyOf`: the two shapes exclude each other, which a linter reading
        // only `required` cannot see.
        AnyOfBuilder::new()
            .item(by_sequence)
            .item(by_turn)
            .examples([serde_json::json!({"before_turn": "0193a0c4-5b1e-7c3d-9f00-2a4b6c8d0e1f", "message": "Make it shorter."})])
            .description(Some(
                "The body of `POST /v1/sessions/{id}/fork`: the point (`at_sequence` or `before_turn`), and \
                 optionally the fork's `id` and a `message` to submit to it.",
            ))
            .into()
    }
}

impl ToSchema for ForkSession {}

/// One way of naming the fork point: `named` required, `other` absent or
/// `null`, with the fields both ways share.
fn point(named: &str, schema: ObjectBuilder, other: &str) -> Schema {
    let nullable_string = || ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null]));
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property(named, schema)
        .required(named)
        .property(other, ObjectBuilder::new().schema_type(Type::Null))
        .property(
            "id",
            nullable_string()
                .min_length(Some(1))
                .max_length(Some(MAX_SESSION_ID_BYTES))
                .pattern(Some(keel_protocol::PATH_NAME_PATTERN))
                .description(Some("The fork's id; a fresh one when absent.")),
        )
        .property(
            "message",
            nullable_string().pattern(Some(r"\S")).description(Some(
                "A user message submitted to the fork once it exists (not only white space): with a point just \
                 before a past message's turn, this edits that message.",
            )),
        )
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .into()
}

route_errors!(
    /// What `POST /v1/sessions/{id}/fork` can answer besides `201`.
    ForkErrors: BODY,
    CEILING,
    LOADING,
    QUEUEING,
    [
        "not_found",
        "conflict",
        "workspace_exists",
        "invalid_fork_point",
        "missing_scope_submit",
        "tenant_forbidden"
    ]
);

/// `POST /v1/sessions/{id}/fork`: a new session whose history is the
/// parent's as it was at `at_sequence` (between turns). Only the history is
/// copied; the fork's log starts with a `session_forked` event naming its
/// parent.
#[utoipa::path(
    post,
    path = "/sessions/{id}/fork",
    tag = "sessions",
    operation_id = "fork_session",
    summary = "Fork a session",
    description = "A new session whose history is the parent's at a point between turns; with `message`, a \
        user message submitted to it (an edit of a past message). The fork belongs to the parent's tenant.",
    params(("id" = String, Path, description = "The parent session's id.")),
    request_body(content = ForkSession, content_type = "application/json"),
    security(("bearer" = ["submit"])),
    responses(
        (
            status = 201,
            description = "The fork, created.",
            body = SessionView,
            headers(("Location" = String, description = "The fork's path.")),        ),
        ForkErrors,
    ),
)]
pub(crate) async fn fork(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(parent): Path<String>,
    ApiJson(request): ApiJson<ForkSession>,
) -> Result<Created, ApiError> {
    // The fork copies the parent's context, its tenant included: it
    // belongs to the parent's tenant, so its `parent_session_id` never
    // names a session its own readers cannot see.
    let tenant = access::session(&server, &principal, Scope::Submit, &parent)
        .await?
        .ok_or_else(|| ApiError::unknown_session(&parent))?
        .context
        .tenant;
    let id = access::new_session_id(&principal, request.id)?;
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
        ForkError::BadPoint(message) => ApiError::InvalidForkPoint(message),
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
    server.host.factory.create_workspace(&tenant, &id).await?;
    if let Err(error) = fork_session(store.as_ref(), &parent, at_sequence, &id).await {
        server.host.factory.discard_workspace(&tenant, &id).await;
        return Err(fork_error(error));
    }
    // An edit is titled by the edited message (the first message of the
    // fork's own log); a plain fork by the conversation it holds.
    match message {
        Some(op) => {
            submit_op(&server, &id, op, None, None, principal.actor, None).await?;
        }
        None => title_from_history(&server, &id).await?,
    }
    let summary = store
        .session_summary(&id)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("session '{id}' was forked but cannot be read")))?;
    let live = server.host.status(&id);
    Ok(Created(SessionView::new(&server, summary, live)))
}

/// Titles the fork `id` (made without a message) from the first user
/// message of the history it inherited, if it has one; otherwise its first
/// message will, as any session's.
async fn title_from_history(server: &Server, id: &str) -> Result<(), ApiError> {
    let Some(state) = server.host.store.load(id).await? else {
        return Ok(());
    };
    let first = state.transcript.iter().find_map(|item| match item {
        TranscriptItem::UserMessage { text } => title_of(text),
        _ => None,
    });
    if let Some(title) = first {
        server.host.store.rename_session(id, &title).await?;
    }
    Ok(())
}
