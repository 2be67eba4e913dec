//! `/healthz`, `/readyz`, `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;

use crate::server::Server;

/// `200 ok` while the process runs.
pub(crate) async fn healthz() -> &'static str {
    "ok"
}

/// `200 ready` when the store answers and the server is not shutting down.
pub(crate) async fn readyz(State(server): State<Arc<Server>>) -> (StatusCode, &'static str) {
    if server.host.is_closing() {
        return (StatusCode::SERVICE_UNAVAILABLE, "shutting down");
    }
    match server.host.store.list_sessions_page(None, 1, None).await {
        Ok(_) => (StatusCode::OK, "ready"),
        Err(error) => {
            tracing::warn!(%error, "not ready: the store does not answer");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable")
        }
    }
}

/// The metrics in the Prometheus text format.
pub(crate) async fn metrics(State(server): State<Arc<Server>>) -> impl IntoResponse {
    let queued = server.host.queued_total();
    server
        .metrics
        .queued_submissions
        .set(i64::try_from(queued).unwrap_or(i64::MAX));
    let tasks = tokio::runtime::Handle::current().metrics().num_alive_tasks();
    server.metrics.alive_tasks.set(i64::try_from(tasks).unwrap_or(i64::MAX));
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        server.metrics.render(),
    )
}
