//! `POST /v1/sessions/{id}/submissions`, and the checks shared with the
//! WebSocket's submissions.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::access;
use crate::Server;
use crate::auth::Principal;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openapi::errors::{BODY, LOADING, QUEUEING, route_errors};
use keel_agent::{Accepted, BusyPolicy};
use keel_protocol::{Actor, MAX_MESSAGE_BYTES, Op, validate_idempotency_key};

/// The body of `POST /v1/sessions/{id}/submissions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"op": {"type": "user_input", "text": "Hello"}, "on_busy": "queue"}))]
pub(crate) struct SubmitRequest {
    /// What to do.
    pub(crate) op: Op,
    /// What a `user_input` does while the session is busy; the session's
    /// default when absent.
    pub(crate) on_busy: Option<BusyPolicy>,
}

/// The answer to an accepted submission.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"submission_id": "0193a0c4-5b1e-7c3d-9f00-2a4b6c8d0e1f", "sequence": 42, "duplicate": false}))]
pub(crate) struct AcceptedView {
    /// The submission's id: the `submission_id` of the events it causes.
    pub(crate) submission_id: String,
    /// The sequence of its `submission_queued` event (for an op acted on at
    /// once, the log's last sequence when it was accepted).
    pub(crate) sequence: u64,
    /// Whether this answers a retry of an `Idempotency-Key` already taken:
    /// nothing new was queued.
    pub(crate) duplicate: bool,
}

route_errors!(
    /// What `POST /v1/sessions/{id}/submissions` can answer besides `202`.
    SubmitErrors: BODY,
    LOADING,
    QUEUEING,
    [
        "not_found",
        "idempotency_key_reused",
        "session_elsewhere",
        "owner_unavailable",
        "missing_scope_submit",
        "missing_scope_approve",
        "missing_scope_admin",
        "unknown_tool_call",
        "tool_call_answered",
        "client_tool_output_too_large"
    ]
);

impl From<Accepted> for AcceptedView {
    fn from(accepted: Accepted) -> Self {
        Self {
            submission_id: accepted.submission_id,
            sequence: accepted.sequence,
            duplicate: accepted.duplicate,
        }
    }
}

/// `POST /v1/sessions/{id}/submissions`: `202` once the submission is stored.
#[utoipa::path(
    post,
    path = "/sessions/{id}/submissions",
    tag = "submissions",
    operation_id = "submit",
    summary = "Submit an op",
    description = "Submits an op to the session, loading it first if need be; answered `202` once the \
        submission is durably stored. Retry with the same `Idempotency-Key` after a network error or a `503`: \
        the retry is answered as the first request was, and queues nothing. An `approval` op needs the \
        `approve` scope instead of `submit`, a `shutdown` op `admin`.",
    params(
        ("id" = String, Path, description = "The session's id."),
        (
            "Idempotency-Key" = Option<String>,
            Header,
            description = "Names this request: a retry with the same key is answered as the first request was.",
            min_length = 1,
            max_length = 128,
            pattern = r"^[!-~]+$"
        ),
    ),
    request_body(content = SubmitRequest, content_type = "application/json"),
    security(("bearer" = ["submit"])),
    responses(
        (
            status = 202,
            description = "The submission is stored (or was, for a retried key).",
            body = AcceptedView,
            links(
                ("events" = (
                    operation_id = "list_events",
                    parameters(("id" = "$request.path.id"), ("after" = "$response.body#/sequence"))
                )),
                ("session" = (operation_id = "get_session", parameters(("id" = "$request.path.id")))),
            )
        ),
        SubmitErrors,
    ),
)]
pub(crate) async fn submit(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<SubmitRequest>,
) -> Result<(StatusCode, Json<AcceptedView>), ApiError> {
    access::session_to_submit(&server, &principal, access::op_scope(&request.op), &id).await?;
    let key = match headers.get("idempotency-key") {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::InvalidRequest("`Idempotency-Key` must be printable ASCII".to_owned()))?
                .to_owned(),
        ),
        None => None,
    };
    let accepted = submit_op(
        &server,
        &id,
        request.op,
        request.on_busy,
        key,
        principal.actor,
        traceparent(&headers),
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(accepted.into())))
}

/// The request's W3C `traceparent`, when it has a valid one (normalized to
/// lowercase); anything else is ignored, as trace context says, and the
/// turn starts a trace of its own.
pub(crate) fn traceparent(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("traceparent")?.to_str().ok()?;
    keel_agent::telemetry::parse_traceparent(value)?;
    Some(value.trim().to_ascii_lowercase())
}

/// Checks and submits an op to a session, recording `submitted_by` as
/// who sent it.
pub(crate) async fn submit_op(
    server: &Server,
    session_id: &str,
    op: Op,
    on_busy: Option<BusyPolicy>,
    idempotency_key: Option<String>,
    submitted_by: Actor,
    traceparent: Option<String>,
) -> Result<Accepted, ApiError> {
    if let Some(key) = &idempotency_key {
        validate_idempotency_key(key).map_err(ApiError::InvalidRequest)?;
    }
    crate::client_tools::check_result(server, session_id, &op).await?;
    check_op(&op)?;
    server
        .host
        .submit(session_id, op, on_busy, idempotency_key, submitted_by, traceparent)
        .await
}

/// Checks an op's size and fields, before anything is stored for it.
pub(crate) fn check_op(op: &Op) -> Result<(), ApiError> {
    if let Op::UserInput { text } | Op::Steer { text } = op
        && text.len() > MAX_MESSAGE_BYTES
    {
        return Err(ApiError::TooLarge(format!(
            "the message is {} bytes; the limit is {MAX_MESSAGE_BYTES}",
            text.len()
        )));
    }
    op.validate().map_err(ApiError::InvalidRequest)
}
