//! `POST /v1/sessions/{id}/submissions`, and the checks shared with the
//! WebSocket's submissions.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};

use crate::Server;
use crate::error::ApiError;
use crate::extract::ApiJson;
use keel_agent::{Accepted, BusyPolicy};
use keel_protocol::{MAX_MESSAGE_BYTES, Op, validate_idempotency_key};

/// The body of `POST /v1/sessions/{id}/submissions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitRequest {
    pub(crate) op: Op,
    pub(crate) on_busy: Option<BusyPolicy>,
}

/// The answer to an accepted submission.
#[derive(Debug, Serialize)]
pub(crate) struct AcceptedView {
    pub(crate) submission_id: String,
    pub(crate) sequence: u64,
    pub(crate) duplicate: bool,
}

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
pub(crate) async fn submit(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<SubmitRequest>,
) -> Result<(StatusCode, Json<AcceptedView>), ApiError> {
    let key = match headers.get("idempotency-key") {
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::InvalidRequest("`Idempotency-Key` must be printable ASCII".to_owned()))?
                .to_owned(),
        ),
        None => None,
    };
    let accepted = submit_op(&server, &id, request.op, request.on_busy, key).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted.into())))
}

/// Checks and submits an op to a session.
pub(crate) async fn submit_op(
    server: &Server,
    session_id: &str,
    op: Op,
    on_busy: Option<BusyPolicy>,
    idempotency_key: Option<String>,
) -> Result<Accepted, ApiError> {
    if let Some(key) = &idempotency_key {
        validate_idempotency_key(key).map_err(ApiError::InvalidRequest)?;
    }
    check_op(&op)?;
    server.host.submit(session_id, op, on_busy, idempotency_key).await
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
