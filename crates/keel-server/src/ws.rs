//! `GET /v1/sessions/{id}/ws`: events out and ops in over one WebSocket.
//!
//! The server sends every event after the resume point as a text frame
//! holding the recorded event's JSON (same rule as the event stream). The
//! client sends `{"op": …, "on_busy": …, "idempotency_key": …,
//! "request_id": …}` frames and gets a `submission_accepted` or
//! `submission_error` frame back for each.

use std::sync::Arc;

use axum::Extension;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::Server;
use super::auth::{Liveness, Principal};
use super::error::{ApiError, ErrorBody};
use super::extract::ApiQuery;
use super::openapi::errors::route_errors;
use super::routes::access;
use super::routes::submissions::submit_op;
use super::sse::checked_resume_point;
use keel_agent::BusyPolicy;
use keel_protocol::Op;

/// The query of the upgrade request.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct WsQuery {
    /// The resume point, as for the event stream.
    #[serde(default, deserialize_with = "super::extract::int64")]
    after: Option<u64>,
    /// The token, for clients that cannot send headers (browsers).
    #[serde(rename = "access_token")]
    #[param(rename = "access_token")]
    _access_token: Option<String>,
}

/// A submission frame from the client: a text frame holding this JSON.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitFrame {
    /// What to do.
    op: Op,
    /// As for `POST …/submissions`.
    on_busy: Option<BusyPolicy>,
    /// As the `Idempotency-Key` header of `POST …/submissions`.
    idempotency_key: Option<String>,
    /// Echoed in the reply, to match it to its frame.
    request_id: Option<String>,
}

/// The server's answer to a submission frame (event frames are
/// `RecordedEvent`s).
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Reply {
    /// The submission was stored, as a `202` would say.
    SubmissionAccepted {
        /// The frame's `request_id`.
        request_id: Option<String>,
        /// The submission's id.
        submission_id: String,
        /// As in a `202`'s body.
        sequence: u64,
        /// As in a `202`'s body.
        duplicate: bool,
    },
    /// The submission was refused, as an error answer would say.
    SubmissionError {
        /// The frame's `request_id`, when it could be read.
        request_id: Option<String>,
        /// The error.
        error: ErrorBody,
    },
}

route_errors!(
    /// What the WebSocket route can answer instead of upgrading.
    UpgradeErrors: ["invalid_request", "not_found", "missing_scope_read"]
);

/// `GET /v1/sessions/{id}/ws?after=SEQ`.
#[utoipa::path(
    get,
    path = "/sessions/{id}/ws",
    tag = "events",
    operation_id = "connect_websocket",
    summary = "A session over a WebSocket",
    description = "Upgrades to a WebSocket that sends the log from the resume point on, each event a text frame \
        holding a `RecordedEvent`, and takes submissions as text frames holding a `WsSubmitFrame`, each \
        answered by a `WsReply` frame. Opening it needs the `read` scope; each submission frame needs the \
        scope its op needs (`submit`; `approve` for an `approval`, `admin` for a `shutdown`), else it is answered by a \
        `submission_error` naming the missing scope.",
    params(
        ("id" = String, Path, description = "The session's id."),
        ("Last-Event-ID" = Option<u64>, Header, description = "The resume point (wins over `after`)."),
        WsQuery,
    ),
    security(("bearer" = ["read"]), ("query_token" = ["read"])),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol."),
        UpgradeErrors,
    ),
)]
pub(crate) async fn upgrade(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    Extension(liveness): Extension<Liveness>,
    ApiQuery(query): ApiQuery<WsQuery>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let after = checked_resume_point(&server, &principal, &id, &headers, query.after).await?;
    Ok(upgrade
        .max_message_size(server.body_limit)
        .on_upgrade(move |socket| run(server, principal, id, after, liveness, socket)))
}

async fn run(
    server: Arc<Server>,
    principal: Principal,
    session_id: String,
    after: u64,
    liveness: Liveness,
    mut socket: WebSocket,
) {
    let mut subscription = server.host.subscribe(&session_id, after);
    // The socket closes when its credential stops working (a revoked key).
    let ended = liveness.ended();
    tokio::pin!(ended);
    loop {
        tokio::select! {
            () = &mut ended => break,
            event = subscription.next() => match event {
                Ok(Some(event)) => {
                    if socket.send(Message::text(event.json.clone())).await.is_err() {
                        return;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::error!(%error, "ending a WebSocket");
                    break;
                }
            },
            frame = socket.recv() => match frame {
                Some(Ok(Message::Text(text))) => {
                    let reply = answer(&server, &principal, &session_id, text.as_str()).await;
                    let reply = serde_json::to_string(&reply).unwrap_or_default();
                    if socket.send(Message::text(reply)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    let reply = Reply::SubmissionError {
                        request_id: None,
                        error: ApiError::InvalidRequest("send ops as text frames".to_owned()).body(),
                    };
                    let reply = serde_json::to_string(&reply).unwrap_or_default();
                    if socket.send(Message::text(reply)).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            },
        }
    }
    // The server is shutting down, the log cannot be read or the
    // credential stopped working: say goodbye.
    let _ = socket.send(Message::Close(None)).await;
}

/// Submits the op of one frame and builds the reply: the principal needs
/// the op's scope for each frame (it saw the session when it connected).
async fn answer(server: &Server, principal: &Principal, session_id: &str, text: &str) -> Reply {
    let frame = match serde_json::from_str::<SubmitFrame>(text) {
        Ok(frame) => frame,
        Err(error) => {
            // Still answer to the request id if one can be read.
            let request_id = serde_json::from_str::<serde_json::Value>(text)
                .ok()
                .and_then(|value| value.get("request_id")?.as_str().map(str::to_owned));
            return Reply::SubmissionError {
                request_id,
                error: ApiError::InvalidRequest(format!("invalid frame: {error}")).body(),
            };
        }
    };
    if let Err(error) = principal.require(access::op_scope(&frame.op)) {
        return Reply::SubmissionError {
            request_id: frame.request_id,
            error: error.body(),
        };
    }
    let actor = principal.actor.clone();
    match submit_op(
        server,
        session_id,
        frame.op,
        frame.on_busy,
        frame.idempotency_key,
        actor,
        None,
    )
    .await
    {
        Ok(accepted) => Reply::SubmissionAccepted {
            request_id: frame.request_id,
            submission_id: accepted.submission_id,
            sequence: accepted.sequence,
            duplicate: accepted.duplicate,
        },
        Err(error) => Reply::SubmissionError {
            request_id: frame.request_id,
            error: error.body(),
        },
    }
}
