//! `GET /v1/sessions/{id}/events`: pages of the log, backwards or forwards.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};

use crate::Server;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use keel_protocol::RecordedEvent;
use keel_store::EventPageRequest;

/// Events per page by default, and at most.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

/// The query of `GET /v1/sessions/{id}/events`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    before: Option<u64>,
    after: Option<u64>,
    limit: Option<usize>,
}

/// A page of events, oldest first.
#[derive(Debug, Serialize)]
pub(crate) struct EventsView {
    events: Vec<RecordedEvent>,
    has_more: bool,
}

/// `GET /v1/sessions/{id}/events?before=SEQ|after=SEQ&limit=N`.
pub(crate) async fn page(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<EventsView>, ApiError> {
    let limit = super::page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let store = &server.host.store;
    if store.session_summary(&id).await?.is_none() {
        return Err(ApiError::unknown_session(&id));
    }
    let view = match (query.before, query.after) {
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidRequest(
                "give `before` or `after`, not both".to_owned(),
            ));
        }
        (_, Some(after)) => {
            let mut events = store.events_after(&id, after, limit + 1).await?;
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
