//! `GET /v1/sessions/{id}/events`: pages of the log, backwards or forwards.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access;
use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::openapi::errors::route_errors;
use keel_protocol::RecordedEvent;
use keel_store::EventPageRequest;

/// Events per page by default, and at most.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The query of `GET /v1/sessions/{id}/events`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PageQuery {
    /// Page backwards: the newest events older than this sequence (the
    /// newest of all by default). With `after`, the end of a forward window.
    #[serde(default, deserialize_with = "crate::extract::int64")]
    before: Option<u64>,
    /// Page forwards: the events after this sequence (and before `before`,
    /// when given too).
    #[serde(default, deserialize_with = "crate::extract::int64")]
    after: Option<u64>,
    /// Events per page (100 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// A page of events, oldest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventsView {
    /// The page, oldest first.
    events: Vec<RecordedEvent>,
    /// Whether more events lie beyond the page, in its direction.
    has_more: bool,
}

route_errors!(
    /// What a read of a session's log can answer besides `200`.
    LogErrors: ["invalid_request", "not_found", "missing_scope_read"]
);

/// `GET /v1/sessions/{id}/events?before=SEQ|after=SEQ&limit=N`.
#[utoipa::path(
    get,
    path = "/sessions/{id}/events",
    tag = "events",
    operation_id = "list_events",
    summary = "Page through a session's log",
    params(("id" = String, Path, description = "The session's id."), PageQuery),
    security(("bearer" = ["read"])),
    responses((status = 200, description = "A page of events, oldest first.", body = EventsView), LogErrors),
)]
pub(crate) async fn page(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<EventsView>, ApiError> {
    let stored = access::session(&server, &principal, Scope::Read, &id).await?;
    let limit = super::page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let store = &server.host.store;
    if stored.is_none() {
        return Err(ApiError::unknown_session(&id));
    }
    let view = match (query.before, query.after) {
        // Forwards; with `before` too, only the events between the two.
        (before, Some(after)) => {
            let mut events = store.events_after(&id, after, limit + 1).await?;
            if let Some(before) = before {
                events.retain(|event| event.sequence < before);
            }
            let has_more = events.len() > limit;
            events.truncate(limit);
            EventsView { events, has_more }
        }
        (before, None) => {
            let page = store
                .event_page(
                    &id,
                    EventPageRequest {
                        before_sequence: before,
                        limit,
                    },
                )
                .await?;
            EventsView {
                events: page.events,
                has_more: page.has_more,
            }
        }
    };
    Ok(Json(view))
}
