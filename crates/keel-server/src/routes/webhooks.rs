//! `/v1/webhooks`: endpoints that receive signed deliveries of session
//! events (admin only), their secrets' rotation, and their deliveries.
//!
//! A tenant's admin manages only its own tenant's endpoints, which receive
//! only that tenant's sessions' events (another tenant's endpoint is
//! `404`, as an unknown one); the operator's may be for every tenant. A
//! secret is shown once, in the answer that makes it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use keel_protocol::WEBHOOK_EVENT_TYPES;
use keel_store::{DeliveryFilter, DeliveryState, WebhookDelivery, WebhookEndpoint, WebhookSecret};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::Server;
use crate::auth::{Principal, Scope, now_ms};
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiQuery};
use crate::openapi::errors::{BODY, route_errors};
use crate::webhooks::{check_url, message_id, new_secret};

/// The most deliveries one listing returns.
const MAX_DELIVERY_PAGE: usize = 200;

/// The most endpoints a server keeps.
const MAX_ENDPOINTS: usize = 1_000;

/// The body of `POST /v1/webhooks`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateWebhook {
    /// Where deliveries are posted: `https` (or `http` where `[webhooks]
    /// allow_http` is on), to a public address unless `[webhooks]
    /// allow_private` lists its network.
    #[schema(min_length = 1, max_length = 2048, pattern = r"^https?://[^\s@/?#]+(/\S*)?$")]
    url: String,
    /// The event types it receives (`approval_requested`,
    /// `client_tool_requested`, `turn_complete`, `turn_aborted`,
    /// `session_idle`, `error`, `shutdown_complete`).
    #[schema(min_items = 1)]
    event_types: Vec<WebhookEventType>,
    /// Only the sessions of this bot.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9._-]+$")]
    bot_id: Option<String>,
    /// Only the sessions of this tenant. A tenant's admin may name only
    /// its own, and gets it without naming it; the operator's endpoint
    /// without one receives every tenant's.
    #[schema(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    tenant: Option<String>,
    /// A note for people: no control characters.
    #[schema(min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1f\x7f-\x9f]+$")]
    description: Option<String>,
}

impl CreateWebhook {
    /// Refuses what the description's constraints refuse: a URL longer
    /// than 2,048 bytes or with white space (`403 webhook_url_refused`, as
    /// one that does not parse), a bot id that is not a plain name, a
    /// tenant that is not a tenant name, a description with control
    /// characters or past 256 characters (`400`).
    fn check(&self) -> Result<(), ApiError> {
        if self.url.is_empty() || self.url.len() > 2048 || self.url.chars().any(char::is_whitespace) {
            return Err(ApiError::Forbidden {
                code: "webhook_url_refused",
                message: "`url` must be 1 to 2048 bytes without white space".to_owned(),
            });
        }
        let invalid = |what: &str| Err(ApiError::InvalidRequest(what.to_owned()));
        if let Some(bot) = &self.bot_id
            && (bot.is_empty()
                || bot.len() > 128
                || !bot
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')))
        {
            return invalid("`bot_id` must be 1 to 128 letters, digits, `.`, `_` or `-`");
        }
        if let Some(tenant) = &self.tenant {
            crate::routes::access::check_tenant(tenant)?;
        }
        if let Some(description) = &self.description
            && (description.is_empty()
                || description.chars().count() > 256
                || description.chars().any(char::is_control))
        {
            return invalid("`description` must be 1 to 256 characters, none of them control characters");
        }
        Ok(())
    }
}

/// An event type webhooks can receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WebhookEventType {
    /// A tool call waits for the user's approval.
    ApprovalRequested,
    /// A client-side tool call waits for the client's result.
    ClientToolRequested,
    /// A turn ended.
    TurnComplete,
    /// A turn was cut short (interrupted, failed, the runtime stopped).
    TurnAborted,
    /// A turn ended and nothing is queued: the session waits for its next
    /// input. Its delivery carries the turn's end.
    SessionIdle,
    /// The session reported an error.
    Error,
    /// The session's runtime shut down.
    ShutdownComplete,
}

impl WebhookEventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::ApprovalRequested => "approval_requested",
            Self::ClientToolRequested => "client_tool_requested",
            Self::TurnComplete => "turn_complete",
            Self::TurnAborted => "turn_aborted",
            Self::SessionIdle => keel_protocol::SESSION_IDLE_WEBHOOK,
            Self::Error => "error",
            Self::ShutdownComplete => "shutdown_complete",
        }
    }
}

/// An endpoint as listed: never its secrets.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookView {
    /// Its id.
    id: String,
    /// Where deliveries are posted.
    url: String,
    /// The event types it receives.
    event_types: Vec<String>,
    /// Only the sessions of this bot, when set.
    bot_id: Option<String>,
    /// Only the sessions of this tenant, when set.
    tenant: Option<String>,
    /// A note for people.
    description: Option<String>,
    /// When it was made (ms since the Unix epoch).
    created_at_ms: u64,
    /// When each secret in use stops being used (ms since the Unix epoch;
    /// `null`: the current one), newest first.
    secrets_expire_at_ms: Vec<Option<u64>>,
}

impl From<WebhookEndpoint> for WebhookView {
    fn from(endpoint: WebhookEndpoint) -> Self {
        Self {
            secrets_expire_at_ms: endpoint.secrets.iter().map(|secret| secret.expires_at_ms).collect(),
            id: endpoint.id,
            url: endpoint.url,
            event_types: endpoint.event_types,
            bot_id: endpoint.bot_id,
            tenant: endpoint.tenant,
            description: endpoint.description,
            created_at_ms: endpoint.created_at_ms,
        }
    }
}

/// The answer of `POST /v1/webhooks` and of a rotation: the endpoint and
/// its new secret, this once.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookWithSecret {
    /// The signing secret (`whsec_` and base64), for the receiver's
    /// Standard Webhooks library. It cannot be shown again.
    secret: String,
    /// The endpoint as listed.
    #[serde(flatten)]
    view: WebhookView,
}

/// The body of `GET /v1/webhooks`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WebhookList {
    /// The endpoints the caller may manage, oldest first.
    webhooks: Vec<WebhookView>,
}

/// The body of `POST /v1/webhooks/{id}/rotate`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RotateWebhook {
    /// How long the secrets in use until now keep signing beside the new
    /// one (seconds), so that receivers can switch; a day by default, at
    /// most a week. 0 stops them at once.
    #[schema(maximum = 604800)]
    #[serde(default, deserialize_with = "crate::extract::json_int64")]
    previous_valid_for_s: Option<u64>,
}

/// A delivery as listed.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryView {
    /// Its id.
    id: u64,
    /// The `webhook-id` it is sent with, the same at every attempt.
    message_id: String,
    /// The session whose event it is.
    session_id: String,
    /// The event's sequence in the session's log.
    sequence: u64,
    /// The event's type.
    event_type: String,
    /// `pending`, `delivered` or `failed`.
    state: String,
    /// How many attempts were made.
    attempts: u32,
    /// When the event was committed (ms since the Unix epoch).
    created_at_ms: u64,
    /// When the next attempt is due, while pending.
    next_attempt_at_ms: Option<u64>,
    /// The HTTP status of the last attempt, when it was answered.
    last_status: Option<u16>,
    /// Why the last attempt failed, when it did.
    last_error: Option<String>,
    /// When it was delivered or given up on.
    finished_at_ms: Option<u64>,
}

impl From<WebhookDelivery> for DeliveryView {
    fn from(delivery: WebhookDelivery) -> Self {
        Self {
            message_id: message_id(&delivery),
            id: delivery.id,
            session_id: delivery.session_id,
            sequence: delivery.sequence,
            event_type: delivery.event_type,
            state: delivery.state.as_str().to_owned(),
            attempts: delivery.attempts,
            created_at_ms: delivery.created_at_ms,
            next_attempt_at_ms: (delivery.state == DeliveryState::Pending).then_some(delivery.next_attempt_at_ms),
            last_status: delivery.last_status,
            last_error: delivery.last_error,
            finished_at_ms: delivery.finished_at_ms,
        }
    }
}

/// The query of `GET /v1/webhooks/{id}/deliveries`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveryQuery {
    /// Only those in this state.
    #[param(inline)]
    state: Option<DeliveryStateParam>,
    /// Only those after this delivery id (the last one of the previous
    /// page).
    #[serde(default, deserialize_with = "crate::extract::int64")]
    after: Option<u64>,
    /// How many at most (default and maximum 200).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<usize>,
}

/// A delivery's state, as a filter.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DeliveryStateParam {
    /// Not delivered yet.
    Pending,
    /// Answered `2xx`.
    Delivered,
    /// Given up on.
    Failed,
}

/// The body of `GET /v1/webhooks/{id}/deliveries`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryList {
    /// The deliveries, oldest first.
    deliveries: Vec<DeliveryView>,
    /// Pass as `after` for the next page; `null` on the last.
    next_after: Option<u64>,
}

route_errors!(
    /// What `POST /v1/webhooks` can answer besides `201`.
    CreateWebhookErrors: BODY, ["missing_scope_admin", "not_found", "tenant_forbidden", "webhook_url_refused", "webhook_limit"]
);

route_errors!(
    /// What `GET /v1/webhooks` can answer besides `200`.
    ListWebhooksErrors: ["missing_scope_admin", "not_found"]
);

route_errors!(
    /// What `GET` and `DELETE /v1/webhooks/{id}` can answer besides success.
    WebhookErrors: ["missing_scope_admin", "not_found"]
);

route_errors!(
    /// What `POST /v1/webhooks/{id}/rotate` can answer besides `200`.
    RotateWebhookErrors: BODY, ["missing_scope_admin", "not_found"]
);

route_errors!(
    /// What `GET /v1/webhooks/{id}/deliveries` can answer besides `200`.
    DeliveryListErrors: ["invalid_request", "missing_scope_admin", "not_found"]
);

/// The outbox and its settings, `404` on a server without.
fn outbox(server: &Server) -> Result<&crate::WebhookApi, ApiError> {
    server
        .webhooks
        .as_ref()
        .ok_or_else(|| ApiError::NotFound("this server keeps no webhooks".to_owned()))
}

/// The endpoint `id`, if the caller may manage it (else `404`).
async fn visible(api: &crate::WebhookApi, principal: &Principal, id: &str) -> Result<WebhookEndpoint, ApiError> {
    api.outbox
        .webhook_endpoints()
        .await?
        .into_iter()
        .find(|endpoint| endpoint.id == id && may_manage(principal, endpoint))
        .ok_or_else(|| ApiError::NotFound(format!("no webhook endpoint '{id}'")))
}

/// A tenant's admin manages its own tenant's endpoints; the operator all.
fn may_manage(principal: &Principal, endpoint: &WebhookEndpoint) -> bool {
    match principal.tenant_filter() {
        None => true,
        Some(tenant) => endpoint.tenant.as_deref() == Some(tenant),
    }
}

/// `POST /v1/webhooks`.
#[utoipa::path(
    post,
    path = "/webhooks",
    tag = "webhooks",
    operation_id = "create_webhook",
    summary = "Register a webhook endpoint",
    description = "Registers an endpoint that receives the chosen session events, signed as the Standard Webhooks \
        specification says (`webhook-id`, `webhook-timestamp`, `webhook-signature`), at least once and in sequence \
        order per session. Admin only; a tenant's admin registers for its own tenant. The answer holds the signing \
        secret, shown this once. Events committed from then on are delivered.",
    security(("bearer" = ["admin"])),
    request_body = CreateWebhook,
    responses((status = 201, description = "The endpoint and its secret, shown once.", body = WebhookWithSecret),
        CreateWebhookErrors),
)]
pub(crate) async fn create(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<CreateWebhook>,
) -> Result<(StatusCode, Json<WebhookWithSecret>), ApiError> {
    principal.require(Scope::Admin)?;
    body.check()?;
    let api = outbox(&server)?;
    let tenant = match (principal.tenant_filter(), body.tenant) {
        (None, tenant) => tenant,
        (Some(own), None) => Some(own.to_owned()),
        (Some(own), Some(named)) if named == own => Some(named),
        (Some(_), Some(_)) => {
            return Err(ApiError::Forbidden {
                code: "tenant_forbidden",
                message: "`tenant` may name only the credentials' own tenant".to_owned(),
            });
        }
    };
    check_url(&body.url, &api.settings).map_err(|error| ApiError::Forbidden {
        code: "webhook_url_refused",
        message: error.to_string(),
    })?;
    let mut event_types: Vec<String> = Vec::new();
    for kind in body.event_types {
        let kind = kind.as_str();
        debug_assert!(WEBHOOK_EVENT_TYPES.contains(&kind));
        if !event_types.iter().any(|known| known == kind) {
            event_types.push(kind.to_owned());
        }
    }
    if event_types.is_empty() {
        return Err(ApiError::InvalidRequest("name at least one event type".to_owned()));
    }
    if api.outbox.webhook_endpoints().await?.len() >= MAX_ENDPOINTS {
        return Err(ApiError::ProtocolConflict {
            code: "webhook_limit",
            message: format!("this server keeps at most {MAX_ENDPOINTS} webhook endpoints; delete one first"),
        });
    }
    let secret = new_secret();
    let id_bytes: [u8; 12] = rand::random();
    let endpoint = WebhookEndpoint {
        id: format!("wh_{}", hex(&id_bytes)),
        url: body.url,
        secrets: vec![WebhookSecret {
            secret: secret.clone(),
            expires_at_ms: None,
        }],
        event_types,
        bot_id: body.bot_id,
        tenant,
        description: body.description,
        created_at_ms: now_ms(),
    };
    api.outbox.put_webhook_endpoint(&endpoint).await?;
    api.changed();
    tracing::info!(webhook = %endpoint.id, url = %endpoint.url, "webhook endpoint registered");
    Ok((
        StatusCode::CREATED,
        Json(WebhookWithSecret {
            secret,
            view: WebhookView::from(endpoint),
        }),
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `GET /v1/webhooks`.
#[utoipa::path(
    get,
    path = "/webhooks",
    tag = "webhooks",
    operation_id = "list_webhooks",
    summary = "List webhook endpoints",
    description = "The endpoints the caller may manage (admin only: a tenant's admin sees its own tenant's), \
        without their secrets.",
    security(("bearer" = ["admin"])),
    responses((status = 200, description = "The endpoints.", body = WebhookList), ListWebhooksErrors),
)]
pub(crate) async fn list(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<WebhookList>, ApiError> {
    principal.require(Scope::Admin)?;
    let api = outbox(&server)?;
    let webhooks = api
        .outbox
        .webhook_endpoints()
        .await?
        .into_iter()
        .filter(|endpoint| may_manage(&principal, endpoint))
        .map(WebhookView::from)
        .collect();
    Ok(Json(WebhookList { webhooks }))
}

/// `GET /v1/webhooks/{id}`.
#[utoipa::path(
    get,
    path = "/webhooks/{id}",
    tag = "webhooks",
    operation_id = "show_webhook",
    summary = "Show a webhook endpoint",
    description = "One endpoint, without its secrets (admin only; another tenant's is `404`).",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "The endpoint's id.")),
    responses((status = 200, description = "The endpoint.", body = WebhookView), WebhookErrors),
)]
pub(crate) async fn show(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<WebhookView>, ApiError> {
    principal.require(Scope::Admin)?;
    let api = outbox(&server)?;
    Ok(Json(WebhookView::from(visible(api, &principal, &id).await?)))
}

/// `DELETE /v1/webhooks/{id}`.
#[utoipa::path(
    delete,
    path = "/webhooks/{id}",
    tag = "webhooks",
    operation_id = "delete_webhook",
    summary = "Delete a webhook endpoint",
    description = "Deletes an endpoint and its deliveries, pending ones included (admin only; another tenant's is \
        `404`). An attempt in flight may still arrive.",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "The endpoint's id.")),
    responses((status = 204, description = "The endpoint is deleted."), WebhookErrors),
)]
pub(crate) async fn delete(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    principal.require(Scope::Admin)?;
    let api = outbox(&server)?;
    visible(api, &principal, &id).await?;
    if !api.outbox.delete_webhook_endpoint(&id).await? {
        return Err(ApiError::NotFound(format!("no webhook endpoint '{id}'")));
    }
    api.changed();
    tracing::info!(webhook = %id, "webhook endpoint deleted");
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/webhooks/{id}/rotate`.
#[utoipa::path(
    post,
    path = "/webhooks/{id}/rotate",
    tag = "webhooks",
    operation_id = "rotate_webhook_secret",
    summary = "Rotate a webhook endpoint's secret",
    description = "Makes a new signing secret, shown this once. The secrets in use until now keep signing beside it \
        for `previous_valid_for_s` (a day by default), so every delivery meanwhile carries a signature each secret \
        verifies (admin only; another tenant's is `404`).",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "The endpoint's id.")),
    request_body = RotateWebhook,
    responses((status = 200, description = "The endpoint and its new secret, shown once.", body = WebhookWithSecret),
        RotateWebhookErrors),
)]
pub(crate) async fn rotate(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RotateWebhook>,
) -> Result<Json<WebhookWithSecret>, ApiError> {
    principal.require(Scope::Admin)?;
    let api = outbox(&server)?;
    let mut endpoint = visible(api, &principal, &id).await?;
    let keep_for_s = body.previous_valid_for_s.unwrap_or(86_400);
    if keep_for_s > 604_800 {
        return Err(ApiError::InvalidRequest(
            "previous_valid_for_s is at most 604800 (a week)".to_owned(),
        ));
    }
    let now = now_ms();
    let until = now.saturating_add(keep_for_s.saturating_mul(1000));
    let secret = new_secret();
    let mut secrets = vec![WebhookSecret {
        secret: secret.clone(),
        expires_at_ms: None,
    }];
    // The previous ones end at `until` at the latest; expired ones are
    // dropped.
    secrets.extend(
        endpoint
            .secrets
            .into_iter()
            .map(|old| WebhookSecret {
                expires_at_ms: Some(old.expires_at_ms.map_or(until, |expires| expires.min(until))),
                secret: old.secret,
            })
            .filter(|old| old.expires_at_ms.is_some_and(|expires| expires > now))
            .take(4),
    );
    endpoint.secrets = secrets;
    api.outbox.put_webhook_endpoint(&endpoint).await?;
    api.changed();
    tracing::info!(webhook = %id, "webhook secret rotated");
    Ok(Json(WebhookWithSecret {
        secret,
        view: WebhookView::from(endpoint),
    }))
}

/// `GET /v1/webhooks/{id}/deliveries`.
#[utoipa::path(
    get,
    path = "/webhooks/{id}/deliveries",
    tag = "webhooks",
    operation_id = "list_webhook_deliveries",
    summary = "List a webhook endpoint's deliveries",
    description = "The endpoint's deliveries, oldest first, by state (`failed` ones are those given up on after \
        retrying for `[webhooks] retry_for_s`); delivered and failed ones are kept `[webhooks] keep_days` (admin only; \
        another tenant's endpoint is `404`).",
    security(("bearer" = ["admin"])),
    params(("id" = String, Path, description = "The endpoint's id."), DeliveryQuery),
    responses((status = 200, description = "A page of deliveries.", body = DeliveryList), DeliveryListErrors),
)]
pub(crate) async fn deliveries(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    ApiQuery(query): ApiQuery<DeliveryQuery>,
) -> Result<Json<DeliveryList>, ApiError> {
    principal.require(Scope::Admin)?;
    let api = outbox(&server)?;
    visible(api, &principal, &id).await?;
    let limit = query.limit.unwrap_or(MAX_DELIVERY_PAGE);
    if !(1..=MAX_DELIVERY_PAGE).contains(&limit) {
        return Err(ApiError::InvalidRequest(format!(
            "limit is between 1 and {MAX_DELIVERY_PAGE}"
        )));
    }
    let filter = DeliveryFilter {
        after_id: query.after,
        state: query.state.map(|state| match state {
            DeliveryStateParam::Pending => DeliveryState::Pending,
            DeliveryStateParam::Delivered => DeliveryState::Delivered,
            DeliveryStateParam::Failed => DeliveryState::Failed,
        }),
        limit,
    };
    let deliveries = api.outbox.webhook_deliveries(&id, &filter).await?;
    let next_after = (deliveries.len() == limit)
        .then(|| deliveries.last().map(|delivery| delivery.id))
        .flatten();
    Ok(Json(DeliveryList {
        deliveries: deliveries.into_iter().map(DeliveryView::from).collect(),
        next_after,
    }))
}
