//! The routes of the API (see `docs/http-api.md`).

pub(crate) mod access;
pub(crate) mod budgets;
pub(crate) mod cluster;
pub(crate) mod events;
pub(crate) mod fork;
pub(crate) mod keys;
pub(crate) mod listing;
pub(crate) mod models;
pub(crate) mod ops;
pub(crate) mod sessions;
pub(crate) mod submissions;
pub(crate) mod usage;
pub(crate) mod webhooks;

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::IntoResponse;
use axum::response::Response;
use tower_http::cors::CorsLayer;
use tower_http::trace::TraceLayer;
use utoipa::openapi::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::openapi::errors::{NONE, route_errors};
use super::{Server, auth, front, openapi, sse, ui, ws};

/// The documented routes, by who may call them. The same value makes the
/// router and the description, so neither can have a route the other lacks.
pub(crate) struct Documented {
    /// `/v1/…` behind the token.
    pub(crate) v1: OpenApiRouter<Arc<Server>>,
    /// `/v1/…` anyone may call: the description itself.
    pub(crate) v1_open: OpenApiRouter<Arc<Server>>,
    /// `/metrics`, behind the token.
    pub(crate) metrics: OpenApiRouter<Arc<Server>>,
    /// `/healthz` and `/readyz`, for probes that hold no token.
    pub(crate) probes: OpenApiRouter<Arc<Server>>,
}

/// Every documented route.
pub(crate) fn documented() -> Documented {
    Documented {
        v1: OpenApiRouter::new()
            .routes(routes!(sessions::create, listing::list))
            .routes(routes!(sessions::show, sessions::update, sessions::delete))
            .routes(routes!(fork::fork))
            .routes(routes!(submissions::submit))
            .routes(routes!(events::page))
            .routes(routes!(sse::stream))
            .routes(routes!(crate::frontends::ag_ui::run))
            .routes(routes!(ws::upgrade))
            .routes(routes!(usage::show))
            .routes(routes!(
                budgets::show_tenant,
                budgets::set_tenant,
                budgets::delete_tenant
            ))
            .routes(routes!(
                budgets::show_session,
                budgets::set_session,
                budgets::delete_session
            ))
            .routes(routes!(models::list))
            .routes(routes!(keys::whoami))
            .routes(routes!(keys::create, keys::list))
            .routes(routes!(keys::revoke))
            .routes(routes!(webhooks::create, webhooks::list))
            .routes(routes!(webhooks::show, webhooks::delete))
            .routes(routes!(webhooks::rotate))
            .routes(routes!(webhooks::deliveries))
            .merge(crate::frontends::ai_sdk::routes()),
        v1_open: OpenApiRouter::new().routes(routes!(describe)),
        metrics: OpenApiRouter::new().routes(routes!(ops::metrics)),
        probes: OpenApiRouter::new()
            .routes(routes!(ops::healthz))
            .routes(routes!(ops::readyz)),
    }
}

/// The API's whole OpenAPI description, made from the same routers as the
/// application.
pub fn openapi_document() -> OpenApi {
    let routes = documented();
    openapi::describe(
        routes.v1.merge(routes.v1_open).into_openapi(),
        [routes.metrics.into_openapi(), routes.probes.into_openapi()],
    )
}

/// [`openapi_document`] as served and committed: pretty JSON, one
/// trailing newline.
pub fn openapi_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        let mut json = openapi_document().to_pretty_json().unwrap_or_default();
        json.push('\n');
        json
    })
}

route_errors!(
    /// What `/v1/openapi.json` can answer besides `200`: the front door's
    /// refusals.
    open DocErrors: NONE
);

/// `GET /v1/openapi.json`.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "get_openapi",
    summary = "This description",
    security(()),
    responses((status = 200, description = "The API's OpenAPI 3.1 description.", body = Object), DocErrors),
)]
async fn describe() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json())
}

/// The whole application: the documented routes, the web UI, and (unless
/// the cluster has a listener of its own, [`cluster_router`]) the one
/// route the nodes of a cluster call each other on ([`cluster`]).
pub(crate) fn router(server: Arc<Server>, cluster_route: bool) -> Router {
    let require_token = middleware::from_fn_with_state(Arc::clone(&server), auth::authenticate);
    let routes = documented();
    let v1 = Router::from(routes.v1)
        .route_layer(require_token.clone())
        .merge(Router::from(routes.v1_open));
    let metrics = Router::from(routes.metrics).route_layer(require_token);
    let mut app = Router::new()
        .nest("/v1", v1)
        .merge(metrics)
        .merge(Router::from(routes.probes))
        .merge(ui::router());
    if cluster_route {
        app = app.route(crate::host::FORWARD_PATH, axum::routing::post(cluster::forwarded));
    }
    app = app
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

/// The cluster's own listener's application: the route the nodes hand each
/// other submissions on, and nothing else, behind the same front door
/// (hosts, framing, body limit and timeout) but without CORS.
pub(crate) fn cluster_router(server: Arc<Server>) -> Router {
    Router::new()
        .route(crate::host::FORWARD_PATH, axum::routing::post(cluster::forwarded))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(Arc::clone(&server), count_requests))
        .layer(middleware::from_fn(stamp_version))
        .layer(DefaultBodyLimit::max(server.body_limit))
        .layer(middleware::from_fn_with_state(Arc::clone(&server), front::admit))
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
