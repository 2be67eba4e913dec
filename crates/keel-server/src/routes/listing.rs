//! `GET /v1/sessions`: the sessions a principal sees, page by page.

use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access;
use super::sessions::{SessionView, check_bot_id};
use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::openapi::errors::route_errors;
use keel_store::{SessionFilter, SessionListPage};

/// Sessions per page by default, and at most.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// The query of `GET /v1/sessions`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Sessions per page (50 by default).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<usize>,
    /// Where the page starts: the `next_cursor` of the page before, with the
    /// same `order` (`KEY` by creation, `UPDATED-KEY` by activity; in the
    /// other order, `UPDATED-KEY` reads as its key and `N` as a time).
    #[param(pattern = r"^[0-9]{1,18}(-[0-9]{1,18})?$")]
    cursor: Option<String>,
    /// `created` (the default): newest created first, a session keeps its
    /// place. `activity`: most recently active first (`updated_at_ms`); a
    /// session active during a walk of the pages moves ahead of it (a fresh
    /// first page has it), none is listed twice.
    #[param(inline)]
    order: Option<ListOrder>,
    /// Only the sessions of this bot.
    #[param(min_length = 1, max_length = 128, pattern = r"^[ -~]+$")]
    bot_id: Option<String>,
    /// Only the sessions of this tenant. A principal of one tenant sees
    /// only its own anyway (naming another finds none).
    #[param(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    tenant: Option<String>,
}

/// The order of `GET /v1/sessions`.
#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ListOrder {
    /// Newest created first.
    #[default]
    Created,
    /// Most recently active first.
    Activity,
}

/// A page of sessions, in the order asked for.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SessionList {
    /// The page.
    sessions: Vec<SessionView>,
    /// The cursor of the next page; `None` on the last.
    next_cursor: Option<String>,
}

route_errors!(
    /// What `GET /v1/sessions` can answer besides `200`.
    ListErrors: ["invalid_request", "missing_scope_read"]
);

/// `GET /v1/sessions`.
#[utoipa::path(
    get,
    path = "/sessions",
    tag = "sessions",
    operation_id = "list_sessions",
    summary = "List sessions",
    description = "Pages through the stored sessions the credentials see (a tenant's principal: its tenant's \
        only), newest created first, or most recently active first with `order=activity`.",
    params(ListQuery),
    security(("bearer" = ["read"])),
    responses((status = 200, description = "A page of sessions.", body = SessionList), ListErrors),
)]
pub(crate) async fn list(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<SessionList>, ApiError> {
    principal.require(Scope::Read)?;
    let limit = super::page_limit(query.limit, DEFAULT_PAGE, MAX_PAGE)?;
    if let Some(bot_id) = &query.bot_id {
        check_bot_id(bot_id)?;
    }
    if let Some(tenant) = &query.tenant {
        access::check_tenant(tenant)?;
    }
    // A cursor is the key of a row in decimal (`created`), or the time of
    // its last activity and its key (`activity`): refused here, in the form
    // the description states, rather than by whichever store reads it.
    let order = query.order.unwrap_or_default();
    let number = |text: &str| (1..=18).contains(&text.len()) && text.bytes().all(|byte| byte.is_ascii_digit());
    // Either form is read in either order (see `ListQuery::cursor`).
    let is_cursor = |text: &str| match text.split_once('-') {
        Some((updated, key)) => number(updated) && number(key),
        None => number(text),
    };
    if query.cursor.as_deref().is_some_and(|cursor| !is_cursor(cursor)) {
        return Err(ApiError::InvalidRequest(
            "`cursor` must be the `next_cursor` of a page".to_owned(),
        ));
    }
    let Ok(tenant) = access::list_tenant(&principal, query.tenant.as_deref()) else {
        return Ok(Json(SessionList {
            sessions: Vec::new(),
            next_cursor: None,
        }));
    };
    let filter = SessionFilter {
        bot_id: query.bot_id.as_deref(),
        tenant,
    };
    let cursor = query.cursor.as_deref();
    let store = &server.host.store;
    let page: SessionListPage = match order {
        ListOrder::Created => store.list_sessions_page(cursor, limit, filter).await?,
        ListOrder::Activity => store.list_sessions_by_activity(cursor, limit, filter).await?,
    };
    let sessions = page
        .sessions
        .into_iter()
        // The store filters by tenant; a row it let through anyway is not
        // shown to a principal that does not see it.
        .filter(|summary| tenant.is_none_or(|tenant| summary.context.tenant == tenant))
        .map(|summary| {
            let live = server.host.status(&summary.session_id);
            SessionView::new(&server, summary, live)
        })
        .collect();
    Ok(Json(SessionList {
        sessions,
        next_cursor: page.next_cursor,
    }))
}
