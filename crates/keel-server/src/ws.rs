//! `GET /v1/sessions/{id}/ws`: events out and ops in over one WebSocket.
//!
//! The server sends every event after the resume point as a text frame
//! holding the recorded event's JSON (same rule as the event stream). The
//! client sends `{"op": …, "on_busy": …, "idempotency_key": …,
//! "request_id": …}` frames and gets a `submission_accepted` or
//! `submission_error` frame back for each.

use std::sync::Arc;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::{Deserialize, Serialize};

use super::Server;
use super::error::{ApiError, ErrorBody};
use super::extract::ApiQuery;
use super::routes::submissions::submit_op;
use super::sse::checked_resume_point;
use keel_agent::BusyPolicy;
use keel_protocol::Op;

/// The query of the upgrade request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WsQuery {
    after: Option<u64>,
    #[serde(rename = "access_token")]
    _access_token: Option<String>,
}

/// A submission frame from the client.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitFrame {
    op: Op,
    on_busy: Option<BusyPolicy>,
    idempotency_key: Option<String>,
    request_id: Option<String>,
}

/// The server's answer to a submission frame.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Reply {
    SubmissionAccepted {
        request_id: Option<String>,
        submission_id: String,
        sequence: u64,
        duplicate: bool,
    },
    SubmissionError {
        request_id: Option<String>,
        error: ErrorBody,
    },
}

/// `GET /v1/sessions/{id}/ws?after=SEQ`.
pub(crate) async fn upgrade(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<WsQuery>,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let after = checked_resume_point(&server, &id, &headers, query.after).await?;
    Ok(upgrade
        .max_message_size(server.body_limit)
        .on_upgrade(move |socket| run(server, id, after, socket)))
}

async fn run(server: Arc<Server>, session_id: String, after: u64, mut socket: WebSocket) {
    let mut subscription = server.host.subscribe(&session_id, after);
    loop {
        tokio::select! {
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
                    let reply = answer(&server, &session_id, text.as_str()).await;
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
    // The server is shutting down (or the log cannot be read): say goodbye.
    let _ = socket.send(Message::Close(None)).await;
}

/// Submits the op of one frame and builds the reply.
async fn answer(server: &Server, session_id: &str, text: &str) -> Reply {
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
    match submit_op(server, session_id, frame.op, frame.on_busy, frame.idempotency_key).await {
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
