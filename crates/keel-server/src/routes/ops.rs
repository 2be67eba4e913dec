//! `/healthz`, `/readyz`, `/metrics`.

use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::openapi::errors::{NONE, route_errors};

route_errors!(
    /// What `/readyz` answers when not ready.
    open ReadyErrors: ["unavailable", "store_unavailable", "store_full"]
);

route_errors!(
    /// What `/healthz` can answer besides `200`: the front door's refusals.
    open HealthErrors: NONE
);

/// `200 ok` while the process runs.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "healthz",
    summary = "Liveness",
    security(()),
    responses(
        (status = 200, description = "`ok` while the process runs.", body = String, content_type = "text/plain"),
        HealthErrors,
    ),
)]
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// `200 ready` when the store answers, has room for its commits and the
/// server is not shutting down; otherwise `503` with the reason as an API
/// error (`unavailable`, `store_unavailable`, `store_full`).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    operation_id = "readyz",
    summary = "Readiness",
    security(()),
    responses(
        (status = 200, description = "`ready`: the store answers and has room.", body = String, content_type = "text/plain"),
        ReadyErrors,
    ),
)]
pub(crate) async fn readyz(State(server): State<Arc<Server>>) -> Response {
    if server.host.is_closing() {
        return ApiError::Unavailable("the server is shutting down".to_owned()).into_response();
    }
    if let Err(error) = server
        .host
        .store
        .list_sessions_page(None, 1, keel_store::SessionFilter::bot(None))
        .await
    {
        tracing::warn!(%error, "not ready: the store does not answer");
        let refusal = match ApiError::from(error) {
            full @ ApiError::StoreFull(_) => full,
            other => ApiError::StoreUnavailable(format!("the store does not answer: {other}")),
        };
        return refusal.into_response();
    }
    if let Some(why) = server.host.store.low_on_space() {
        tracing::warn!(%why, "not ready: the store is short of space");
        return ApiError::StoreFull(why).into_response();
    }
    "ready".into_response()
}

route_errors!(
    /// What `/metrics` can answer besides `200`.
    MetricsErrors: ["missing_scope_admin"]
);

/// The metrics in the Prometheus text format.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    operation_id = "metrics",
    summary = "Metrics (OpenMetrics text)",
    description = "The server's metrics, for the operator: they may name tenants (never sessions), so only \
        credentials with `admin` on every tenant read them.",
    security(("bearer" = ["admin"])),
    responses(
        (
            status = 200,
            description = "The metrics.",
            body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"
        ),
        MetricsErrors,
    ),
)]
pub(crate) async fn metrics(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
) -> Result<impl IntoResponse, ApiError> {
    // A tenant's administrator is not the server's: the message says what
    // is missing, whatever scopes the credential has.
    if !principal.scopes.has(Scope::Admin) || principal.tenant_filter().is_some() {
        return Err(ApiError::Forbidden {
            code: "missing_scope_admin",
            message: "/metrics needs `admin` over every tenant (the operator's token): the numbers are the whole \
                server's, and this credential is not admin of every tenant"
                .to_owned(),
        });
    }
    let queued = server.host.queued_total();
    server
        .metrics
        .queued_submissions
        .set(i64::try_from(queued).unwrap_or(i64::MAX));
    let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    server.metrics.alive_tasks.set(i64::try_from(tasks).unwrap_or(i64::MAX));
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        server.metrics.render(),
    ))
}
