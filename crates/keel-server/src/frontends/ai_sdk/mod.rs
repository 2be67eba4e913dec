//! The AI SDK's UI message stream (protocol v1): `POST /v1/ai-sdk/chat`
//! takes the body `DefaultChatTransport` posts and answers with the turn's
//! chunks; `GET /v1/ai-sdk/chat/{id}/stream` resumes the running turn;
//! `POST /v1/ai-sdk/chat/{id}/stop` interrupts it. The chat's `id` is the
//! session's thread ([`access::thread_session_id`]).

mod schema;
mod stream;

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use keel_projections::ai_sdk::{ChatRequest, Intent, Projection, RequestError, answer_ops};
use keel_protocol::Op;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use self::stream::Replay;
use crate::Server;
use crate::auth::{Liveness, Principal, Scope};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openapi::errors::{BODY, CEILING, CREATING, LOADING, QUEUEING, route_errors};
use crate::routes::access;
use crate::routes::sessions::{CreateSession, create_session};
use crate::routes::submissions::{AcceptedView, submit_op, traceparent};

/// The routes, under `/v1` behind the token.
pub(crate) fn routes() -> OpenApiRouter<Arc<Server>> {
    OpenApiRouter::new()
        .routes(routes!(chat))
        .routes(routes!(resume))
        .routes(routes!(stop))
}

route_errors!(
    /// What `POST /v1/ai-sdk/chat` can answer instead of a stream.
    ChatErrors: BODY,
    CEILING,
    LOADING,
    CREATING,
    QUEUEING,
    [
        "not_found",
        "conflict",
        "workspace_exists",
        "idempotency_key_reused",
        "session_elsewhere",
        "owner_unavailable",
        "model_not_found",
        "missing_scope_submit",
        "missing_scope_approve"
    ]
);

route_errors!(
    /// What `GET /v1/ai-sdk/chat/{id}/stream` can answer instead of a stream.
    ResumeErrors: ["invalid_request", "not_found", "missing_scope_read"]
);

route_errors!(
    /// What `POST /v1/ai-sdk/chat/{id}/stop` can answer besides `202`.
    StopErrors: LOADING,
    QUEUEING,
    ["not_found", "session_elsewhere", "owner_unavailable", "missing_scope_submit"]
);

/// A request the projection refuses: `400` for a body that is not a chat
/// request or a part Keel does not take, `409` for answers to calls the
/// session does not wait on. Nothing is stored.
fn refused(error: RequestError) -> ApiError {
    match error {
        RequestError::NotWaiting(_) => ApiError::Conflict(error.to_string()),
        RequestError::Malformed(_) | RequestError::UnsupportedPart(_) => ApiError::InvalidRequest(error.to_string()),
    }
}

/// `POST /v1/ai-sdk/chat`.
#[utoipa::path(
    post,
    path = "/ai-sdk/chat",
    tag = "submissions",
    operation_id = "ai_sdk_chat",
    summary = "Chat with the AI SDK's UI message stream",
    description = "Takes the body of the `ai` package's `DefaultChatTransport` (`id`, `messages`, `trigger`, \
        `messageId`) and answers with the turn as a UI message stream (protocol v1, header \
        `x-vercel-ai-ui-message-stream: v1`), ending with `data: [DONE]`. The chat `id` is the session's \
        thread: the session is created under the server's defaults by its first message. A trailing user \
        message is submitted with its id as `Idempotency-Key` (a resent message streams the same turn); \
        `regenerate-message` regenerates the last answer; a trailing assistant message carrying approval \
        responses or client tool outputs for the calls the turn waits on answers them, and the stream goes \
        on with the same turn. A turn that waits for the client ends its stream with `finish` \
        (`tool-calls`). See docs/ai-sdk.md.",
    request_body(content = schema::ChatBody, content_type = "application/json"),
    security(("bearer" = ["submit"])),
    responses(
        (status = 200, description = "The turn's UI message stream.", content_type = "text/event-stream", body = schema::StreamFrame),
        ChatErrors,
    ),
)]
pub(crate) async fn chat(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Extension(liveness): Extension<Liveness>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    // Checked before the body, so a missing scope is the same `403`
    // whatever is sent (an approval answer needs `approve` as well).
    principal.require(Scope::Submit)?;
    let request = ChatRequest::from_value(body).map_err(refused)?;
    let intent = request.intent().map_err(refused)?;
    let id = access::thread_session_id(&principal, &request.id)?;
    let summary = match access::session(&server, &principal, Scope::Submit, &id).await {
        Err(ApiError::NotFound(_)) if matches!(intent, Intent::UserMessage { .. }) => {
            open_chat(&server, &principal, &id, &request).await?
        }
        other => other?,
    };
    let actor = principal.actor.clone();
    // A caller's trace context puts the turn it starts in its trace.
    let trace = traceparent(&headers);
    // A new turn is followed from before its submission, so its first
    // events come from the channel, not from a store read (a retried
    // submission, stored before, is read from the store).
    let mut early = match intent {
        Intent::UserMessage { .. } | Intent::Regenerate => server.host.subscribe_from_now(&id),
        Intent::Answers(_) => None,
    };
    let (projection, replay) = match intent {
        Intent::UserMessage { message_id, text } => {
            let op = Op::UserInput { text };
            let accepted = submit_op(&server, &id, op, None, Some(message_id), actor, trace).await?;
            early = early.filter(|early| early.sees(accepted.sequence));
            (
                Projection::of_submission(&accepted.submission_id),
                Replay {
                    after: accepted.sequence.saturating_sub(1),
                    silent_until: 0,
                },
            )
        }
        Intent::Regenerate => {
            let key = request
                .message_id
                .as_deref()
                .or_else(|| request.messages.last().map(|message| message.id.as_str()))
                .map(|message| format!("ai-sdk-regenerate:{message}"))
                // An id too long for a key regenerates without one.
                .filter(|key| keel_protocol::validate_idempotency_key(key).is_ok());
            let accepted = submit_op(&server, &id, Op::Regenerate, None, key, actor, trace).await?;
            early = early.filter(|early| early.sees(accepted.sequence));
            (
                Projection::of_submission(&accepted.submission_id),
                Replay {
                    after: accepted.sequence.saturating_sub(1),
                    silent_until: 0,
                },
            )
        }
        Intent::Answers(parts) => {
            // The assistant message's id is its turn's (the stream's
            // `start`), so a resent answer finds its turn after it ended.
            let named = request.messages.last().map(|message| message.id.clone());
            let running = running_turn(&server, &id, summary);
            let mut found = None;
            for turn_id in named.into_iter().chain(running) {
                if let Some(start) = stream::turn_start(&server, &id, &turn_id).await? {
                    found = Some((turn_id, start));
                    break;
                }
            }
            let (turn_id, start) = found.ok_or_else(|| {
                refused(RequestError::NotWaiting(format!(
                    "the last message of chat '{}' is not a turn of it, and no turn runs",
                    request.id
                )))
            })?;
            let (seen, last) = stream::replay_turn(&server, &id, &turn_id, start).await?;
            let ops = answer_ops(&parts, seen.waiting(), |call| seen.answered_at(call).is_some()).map_err(refused)?;
            for (op, _) in &ops {
                principal.require(access::op_scope(op))?;
            }
            // A resent answer streams from where the first one did.
            let resent = parts
                .iter()
                .filter_map(|part| seen.answered_at(&part.call_id))
                .min()
                .map(|at| at.saturating_sub(1));
            for (op, key) in ops {
                submit_op(&server, &id, op, None, Some(key), actor.clone(), trace.clone()).await?;
            }
            (
                Projection::of_turn(&turn_id),
                Replay {
                    after: start.saturating_sub(1),
                    silent_until: resent.unwrap_or(last),
                },
            )
        }
    };
    Ok(stream::response(&server, &id, projection, replay, early, liveness))
}

/// Creates the session of a chat's first message. A chat the session has
/// never seen cannot bring a history (`409`): Keel's history is its log.
async fn open_chat(
    server: &Server,
    principal: &Principal,
    id: &str,
    request: &ChatRequest,
) -> Result<Option<keel_store::SessionSummary>, ApiError> {
    let history = request.history().len();
    if history > 0 {
        return Err(ApiError::Conflict(format!(
            "chat '{}' has no session yet, but the request carries {history} earlier message(s): the history \
             does not match",
            request.id
        )));
    }
    match create_session(server, principal, id, CreateSession::default()).await {
        Ok(_) | Err(ApiError::Conflict(_)) => {}
        Err(error) => return Err(error),
    }
    // Created by this request or a concurrent one: the one check again.
    access::session(server, principal, Scope::Submit, id).await
}

/// `GET /v1/ai-sdk/chat/{id}/stream`.
#[utoipa::path(
    get,
    path = "/ai-sdk/chat/{id}/stream",
    tag = "events",
    operation_id = "ai_sdk_resume",
    summary = "Resume a chat's running turn (AI SDK)",
    description = "The `DefaultChatTransport`'s reconnect URL: the running turn of the chat as a UI message \
        stream, replayed from its start and then followed live (so a client that reconnects after a cut, on \
        any node, assembles the whole message once), or `204` when no turn runs.",
    params((
        "id" = String,
        Path,
        description = "The chat's id.",
        min_length = 1,
        max_length = 128,
        pattern = r"^[ -$&-~]+$"
    )),
    security(("bearer" = ["read"])),
    responses(
        (status = 200, description = "The running turn's UI message stream.", content_type = "text/event-stream", body = schema::StreamFrame),
        (status = 204, description = "No turn runs."),
        ResumeErrors,
    ),
)]
pub(crate) async fn resume(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Extension(liveness): Extension<Liveness>,
    Path(chat): Path<String>,
) -> Result<Response, ApiError> {
    let id = access::thread_session_id(&principal, &chat)?;
    let summary = access::session(&server, &principal, Scope::Read, &id).await?;
    let Some(turn_id) = running_turn(&server, &id, summary) else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let Some(start) = stream::turn_start(&server, &id, &turn_id).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let replay = Replay {
        after: start.saturating_sub(1),
        silent_until: 0,
    };
    Ok(stream::response(
        &server,
        &id,
        Projection::of_turn(&turn_id),
        replay,
        None,
        liveness,
    ))
}

/// The turn running in session `id`: the live status where the session
/// runs on this node (the stored summary says what the last write did,
/// which may be behind a turn that just started), else the summary's.
fn running_turn(server: &Server, id: &str, summary: Option<keel_store::SessionSummary>) -> Option<String> {
    match server.host.status(id) {
        Some(status) => status.running_turn_id,
        None => summary.and_then(|summary| summary.running_turn_id),
    }
}

/// `POST /v1/ai-sdk/chat/{id}/stop`.
#[utoipa::path(
    post,
    path = "/ai-sdk/chat/{id}/stop",
    tag = "submissions",
    operation_id = "ai_sdk_stop",
    summary = "Stop a chat's running turn (AI SDK)",
    description = "Submits an `interrupt`: the running turn ends, and its stream with an `abort` chunk.",
    params((
        "id" = String,
        Path,
        description = "The chat's id.",
        min_length = 1,
        max_length = 128,
        pattern = r"^[ -$&-~]+$"
    )),
    security(("bearer" = ["submit"])),
    responses(
        (status = 202, description = "The interrupt is stored.", body = AcceptedView),
        StopErrors,
    ),
)]
pub(crate) async fn stop(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(chat): Path<String>,
) -> Result<(StatusCode, Json<AcceptedView>), ApiError> {
    let id = access::thread_session_id(&principal, &chat)?;
    access::session(&server, &principal, Scope::Submit, &id).await?;
    let op = Op::Interrupt { turn_id: None };
    let accepted = submit_op(&server, &id, op, None, None, principal.actor, None).await?;
    Ok((StatusCode::ACCEPTED, Json(accepted.into())))
}
