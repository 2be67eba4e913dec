//! `GET /v1/sessions/{id}/events/stream`: the log as server-sent events,
//! replayed from a resume point and then followed live.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use utoipa::IntoParams;

use super::Server;
use super::auth::{Principal, Scope};
use super::error::ApiError;
use super::extract::ApiQuery;
use super::fanout::Subscription;
use super::metrics::Metrics;
use super::openapi::errors::route_errors;
use super::routes::access;
use keel_protocol::RecordedEvent;

/// The query of the stream (the token is checked by the auth layer).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StreamQuery {
    /// The resume point: the events after this sequence (0, the whole log,
    /// by default). `Last-Event-ID` wins when both are given.
    #[serde(default, deserialize_with = "super::extract::int64")]
    after: Option<u64>,
    /// The token, for clients that cannot send headers (browsers'
    /// `EventSource`).
    #[serde(rename = "access_token")]
    #[param(rename = "access_token")]
    _access_token: Option<String>,
}

/// The resume point: `Last-Event-ID` (a reconnecting browser's) wins over
/// `?after`; the whole log by default.
pub(crate) fn resume_point(headers: &HeaderMap, after: Option<u64>) -> Result<u64, ApiError> {
    match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or_else(|| ApiError::InvalidRequest("`Last-Event-ID` must be a sequence number".to_owned())),
        None => Ok(after.unwrap_or(0)),
    }
}

/// The resume point of a stream of session `id` that `principal` reads,
/// checked against its log: `403` without the `read` scope, `404` for an
/// unknown session (or one it does not see), `400` for a point past the
/// log's end (no
/// client can have seen such an event, since events are delivered only once
/// stored; waiting for it would look like a stream that hangs).
pub(crate) async fn checked_resume_point(
    server: &Server,
    principal: &Principal,
    id: &str,
    headers: &HeaderMap,
    after: Option<u64>,
) -> Result<u64, ApiError> {
    let summary = access::session(server, principal, Scope::Read, id)
        .await?
        .ok_or_else(|| ApiError::unknown_session(id))?;
    let after = resume_point(headers, after)?;
    if after > summary.last_sequence {
        return Err(ApiError::InvalidRequest(format!(
            "cannot resume after sequence {after}: the log of session '{id}' ends at {}",
            summary.last_sequence
        )));
    }
    Ok(after)
}

route_errors!(
    /// What a stream of a session's log can answer instead of opening.
    StreamErrors: ["invalid_request", "not_found", "missing_scope_read"]
);

/// `GET /v1/sessions/{id}/events/stream`.
#[utoipa::path(
    get,
    path = "/sessions/{id}/events/stream",
    tag = "events",
    operation_id = "stream_events",
    summary = "Stream a session's log (server-sent events)",
    description = "The events after the resume point, then new ones as they are stored, without end. Each SSE \
        event has `id` = the event's sequence (so a reconnecting `EventSource` resumes by itself), `event` = its \
        `msg.type`, and `data` = the event as JSON: a `RecordedEvent`. OpenAPI 3.1 has no schema for the items \
        of a stream, so the media type's schema is that of one event's `data`. Comments (`: keep-alive`) \
        keep an idle stream open.",
    params(
        ("id" = String, Path, description = "The session's id."),
        (
            "Last-Event-ID" = Option<u64>,
            Header,
            description = "The resume point: the last sequence the client saw (wins over `after`)."
        ),
        StreamQuery,
    ),
    security(("bearer" = ["read"]), ("query_token" = ["read"])),
    responses(
        (
            status = 200,
            description = "The stream: one SSE event per log event, in order, from the resume point on.",
            content_type = "text/event-stream",
            body = RecordedEvent,
        ),
        StreamErrors,
    ),
)]
pub(crate) async fn stream(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<StreamQuery>,
) -> Result<Response, ApiError> {
    let after = checked_resume_point(&server, &principal, &id, &headers, query.after).await?;
    let subscription = server.host.subscribe(&id, after);
    let keep_alive = KeepAlive::new().interval(server.keep_alive).text("keep-alive");
    let mut response = Sse::new(events(subscription, Arc::clone(&server.metrics)))
        .keep_alive(keep_alive)
        .into_response();
    // Reverse proxies (nginx and those that follow it) pass the stream on as
    // it comes instead of buffering it.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// Counts an open stream in `keel_sse_subscribers` while it lives.
struct Counted {
    subscription: Subscription,
    metrics: Arc<Metrics>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.metrics.sse_subscribers.dec();
    }
}

fn events(subscription: Subscription, metrics: Arc<Metrics>) -> impl Stream<Item = Result<Event, Infallible>> {
    metrics.sse_subscribers.inc();
    let state = Counted { subscription, metrics };
    futures::stream::unfold(state, |mut state| async move {
        match state.subscription.next().await {
            Ok(Some(event)) => {
                let message = Event::default()
                    .id(event.sequence.to_string())
                    .event(event.kind)
                    .data(&event.json);
                Some((Ok(message), state))
            }
            Ok(None) => None,
            Err(error) => {
                // The stream cannot go on without a gap; end it so the client
                // reconnects from its last event.
                tracing::error!(%error, "ending an event stream");
                None
            }
        }
    })
}

/// How often an idle stream sends a comment, by default.
pub(crate) const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(15);
