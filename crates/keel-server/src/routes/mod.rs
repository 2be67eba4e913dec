//! The routes of the API (see `docs/http-api.md`).

pub(crate) mod events;
pub(crate) mod ops;
pub(crate) mod sessions;
pub(crate) mod submissions;
pub(crate) mod usage;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use tower_http::cors::CorsLayer;
use tower_http::trace::TraceLayer;

use super::error::ApiError;
use super::{Server, auth, front, sse, ui, ws};

/// The whole application.
pub(crate) fn router(server: Arc<Server>) -> Router {
    let require_token = middleware::from_fn_with_state(Arc::clone(&server), auth::require_token);
    let v1 = Router::new()
        .route("/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/sessions/{id}",
            get(sessions::show).patch(sessions::update).delete(sessions::delete),
        )
        .route("/sessions/{id}/fork", post(sessions::fork))
        .route("/sessions/{id}/submissions", post(submissions::submit))
        .route("/sessions/{id}/events", get(events::page))
        .route("/sessions/{id}/events/stream", get(sse::stream))
        .route("/sessions/{id}/ws", get(ws::upgrade))
        .route("/usage", get(usage::show))
        .route_layer(require_token.clone());
    let metrics = Router::new()
        .route("/metrics", get(ops::metrics))
        .route_layer(require_token);
    let mut app = Router::new()
        .nest("/v1", v1)
        .merge(metrics)
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .merge(ui::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&server), count_requests))
        .layer(middleware::from_fn(stamp_version))
        .layer(DefaultBodyLimit::max(server.body_limit))
        .layer(
            // The path only: a query may hold an access token.
            TraceLayer::new_for_http().make_span_with(|request: &Request| {
                tracing::debug_span!("http", method = %request.method(), path = %request.uri().path())
            }),
        );
    if let Some(origin) = &server.cors_origin {
        app = app.layer(cors(origin.clone()));
    }
    // Outermost, so that nothing (CORS preflights included) answers a
    // request the front door refuses.
    app.layer(middleware::from_fn_with_state(Arc::clone(&server), front::admit))
        .with_state(server)
}

/// CORS for one origin: the API's methods and headers, nothing else.
fn cors(origin: HeaderValue) -> CorsLayer {
    CorsLayer::new()
        .allow_origin(origin)
        .allow_methods([Method::GET, Method::POST])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("idempotency-key"),
            HeaderName::from_static("last-event-id"),
        ])
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

/// Names the API's version on every answer (errors included), so a client
/// can tell a server it cannot read before it reads the body.
async fn stamp_version(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    response.headers_mut().insert(
        HeaderName::from_static(crate::API_VERSION_HEADER),
        HeaderValue::from_static(crate::API_VERSION),
    );
    response
}

/// Counts each answered request in `keel_http_requests_total`, by the
/// route's pattern (never the raw path, which holds ids).
async fn count_requests(State(server): State<Arc<Server>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let response = next.run(request).await;
    server.metrics.http_request(&route, response.status().as_u16());
    response
}

/// A page's `limit` query parameter: `default` when not given, `400` when
/// it is not 1 to `max`.
pub(crate) fn page_limit(asked: Option<usize>, default: usize, max: usize) -> Result<usize, ApiError> {
    let limit = asked.unwrap_or(default);
    if limit == 0 || limit > max {
        return Err(ApiError::InvalidRequest(format!("`limit` must be 1 to {max}")));
    }
    Ok(limit)
}
