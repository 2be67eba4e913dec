//! `GET/PUT/DELETE /v1/tenants/{tenant}/budget` and
//! `GET/PUT/DELETE /v1/sessions/{id}/budget`: budgets over the admin API.
//!
//! A budget set here is stored (every node reads it within a second) and
//! wins over keel.toml's `[tenants.<id>.budget]` for its tenant; deleting it
//! gives keel.toml's back. A `GET` or `PUT` answers the budget that applies
//! now, where it comes from, what was spent and whether a limit is spent
//! (`404` when none applies); a `DELETE` answers `204`.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access;
use crate::Server;
use crate::auth::{Principal, Scope};
use crate::budget::{Exhausted, Source, Spend};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openapi::errors::{BODY, route_errors};
use keel_config::BudgetConfig;
use keel_store::BudgetTarget;

/// A budget: every limit is optional and only those given apply, but it
/// has at least one (`DELETE` removes a budget); no limit is `null`.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"total_tokens_per_day": 200000, "max_concurrent_turns": 4}), min_properties = 1)]
pub(crate) struct BudgetBody {
    /// Prompt tokens in the last 24 hours (hourly buckets).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    input_tokens_per_day: Option<u64>,
    /// Generated tokens in the last 24 hours.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    output_tokens_per_day: Option<u64>,
    /// Prompt and generated tokens in the last 24 hours.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    total_tokens_per_day: Option<u64>,
    /// Prompt tokens, ever.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    input_tokens: Option<u64>,
    /// Generated tokens, ever.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    output_tokens: Option<u64>,
    /// Prompt and generated tokens, ever.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    total_tokens: Option<u64>,
    /// The most turns the tenant's sessions run at once, on every node (a
    /// tenant's budget only).
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "limit")]
    #[schema(value_type = u64, required = false, maximum = 9_223_372_036_854_775_807_u64)]
    max_concurrent_turns: Option<u64>,
}

impl From<BudgetBody> for BudgetConfig {
    fn from(body: BudgetBody) -> Self {
        Self {
            input_tokens_per_day: body.input_tokens_per_day,
            output_tokens_per_day: body.output_tokens_per_day,
            total_tokens_per_day: body.total_tokens_per_day,
            input_tokens: body.input_tokens,
            output_tokens: body.output_tokens,
            total_tokens: body.total_tokens,
            max_concurrent_turns: body.max_concurrent_turns,
        }
    }
}

impl From<BudgetConfig> for BudgetBody {
    fn from(budget: BudgetConfig) -> Self {
        Self {
            input_tokens_per_day: budget.input_tokens_per_day,
            output_tokens_per_day: budget.output_tokens_per_day,
            total_tokens_per_day: budget.total_tokens_per_day,
            input_tokens: budget.input_tokens,
            output_tokens: budget.output_tokens,
            total_tokens: budget.total_tokens,
            max_concurrent_turns: budget.max_concurrent_turns,
        }
    }
}

/// A tenant's or a session's budget as it applies now.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BudgetView {
    /// The tenant (the session's, for a session's budget).
    tenant: String,
    /// The session, for a session's budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    /// The budget that applies.
    budget: BudgetBody,
    /// Where it comes from: set over this API, or keel.toml's
    /// `[tenants.<id>.budget]`.
    source: Source,
    /// What was spent: in the rolling day (the last 24 hourly buckets by
    /// the server's clock) and ever.
    spend: Spend,
    /// The turns the tenant runs now, on every node (a tenant's budget
    /// only).
    #[serde(skip_serializing_if = "Option::is_none")]
    running_turns: Option<u64>,
    /// The first of its limits that is spent, as a refused submission
    /// would name it; `null` when none is.
    exhausted: Option<Exhausted>,
}

/// The path of a tenant's budget.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub(crate) struct TenantPath {
    /// The tenant: 1 to 128 printable ASCII characters other than `%`.
    #[param(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    tenant: String,
}

route_errors!(
    /// What reading a tenant's budget can answer besides `200`.
    ShowTenantBudgetErrors: ["invalid_request", "not_found", "missing_scope_admin", "unavailable"]
);

route_errors!(
    /// What setting a tenant's budget can answer besides `200`.
    SetTenantBudgetErrors: BODY,
    ["missing_scope_admin", "unavailable"]
);

route_errors!(
    /// What removing a tenant's budget can answer besides `204`.
    DeleteTenantBudgetErrors: ["invalid_request", "missing_scope_admin", "unavailable"]
);

route_errors!(
    /// What a session's budget routes can answer besides `200` or `204`.
    SessionBudgetErrors: ["not_found", "missing_scope_admin", "unavailable"]
);

route_errors!(
    /// What setting a session's budget can answer besides `200`.
    SetSessionBudgetErrors: BODY,
    ["not_found", "missing_scope_admin", "unavailable"]
);

/// `GET /v1/tenants/{tenant}/budget`.
#[utoipa::path(
    get,
    path = "/tenants/{tenant}/budget",
    tag = "usage",
    operation_id = "get_tenant_budget",
    security(("bearer" = ["admin"])),
    summary = "A tenant's budget",
    description = "The budget that applies to the tenant's sessions (set over the API, else keel.toml's), what \
        they spent in the rolling day and ever, the turns they run, and the limit spent if one is; `404` when \
        no budget applies.",
    params(TenantPath),
    responses((status = 200, description = "The budget.", body = BudgetView), ShowTenantBudgetErrors),
)]
pub(crate) async fn show_tenant(
    State(server): State<Arc<Server>>,
    Path(TenantPath { tenant }): Path<TenantPath>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<BudgetView>, ApiError> {
    require_server_admin(&principal)?;
    access::check_tenant(&tenant)?;
    Ok(Json(view(&server, tenant, None).await?))
}

/// `PUT /v1/tenants/{tenant}/budget`.
#[utoipa::path(
    put,
    path = "/tenants/{tenant}/budget",
    tag = "usage",
    operation_id = "set_tenant_budget",
    security(("bearer" = ["admin"])),
    summary = "Set a tenant's budget",
    description = "Stores the tenant's budget, which then applies on every node (within a second) instead of \
        keel.toml's.",
    params(TenantPath),
    request_body(content = BudgetBody, content_type = "application/json"),
    responses((status = 200, description = "The budget as it applies now.", body = BudgetView), SetTenantBudgetErrors),
)]
pub(crate) async fn set_tenant(
    State(server): State<Arc<Server>>,
    Path(TenantPath { tenant }): Path<TenantPath>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<BudgetBody>,
) -> Result<Json<BudgetView>, ApiError> {
    require_server_admin(&principal)?;
    access::check_tenant(&tenant)?;
    let budget = check_budget(&body)?;
    let target = BudgetTarget::Tenant(tenant.clone());
    server.host.factory.budgets.set(&target, Some(&budget)).await?;
    Ok(Json(view(&server, tenant, None).await?))
}

/// `DELETE /v1/tenants/{tenant}/budget`.
#[utoipa::path(
    delete,
    path = "/tenants/{tenant}/budget",
    tag = "usage",
    operation_id = "delete_tenant_budget",
    security(("bearer" = ["admin"])),
    summary = "Remove a tenant's budget",
    description = "Removes the budget set over the API (if there is one); keel.toml's applies again, if it has \
        one.",
    params(TenantPath),
    responses((status = 204, description = "The API's budget is gone."), DeleteTenantBudgetErrors),
)]
pub(crate) async fn delete_tenant(
    State(server): State<Arc<Server>>,
    Path(TenantPath { tenant }): Path<TenantPath>,
    Extension(principal): Extension<Principal>,
) -> Result<StatusCode, ApiError> {
    require_server_admin(&principal)?;
    access::check_tenant(&tenant)?;
    let target = BudgetTarget::Tenant(tenant);
    server.host.factory.budgets.set(&target, None).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /v1/sessions/{id}/budget`.
#[utoipa::path(
    get,
    path = "/sessions/{id}/budget",
    tag = "usage",
    operation_id = "get_session_budget",
    security(("bearer" = ["admin"])),
    summary = "A session's budget",
    description = "The session's own budget (besides its tenant's), what it spent in the rolling day and ever, \
        and the limit spent if one is; `404` when the session has none.",
    params(("id" = String, Path, description = "The session's id.")),
    responses((status = 200, description = "The budget.", body = BudgetView), SessionBudgetErrors),
)]
pub(crate) async fn show_session(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<BudgetView>, ApiError> {
    let tenant = budget_session(&server, &principal, &id).await?;
    Ok(Json(view(&server, tenant, Some(id)).await?))
}

/// `PUT /v1/sessions/{id}/budget`.
#[utoipa::path(
    put,
    path = "/sessions/{id}/budget",
    tag = "usage",
    operation_id = "set_session_budget",
    security(("bearer" = ["admin"])),
    summary = "Set a session's budget",
    description = "Stores a budget of the session's own, which applies on every node (within a second) besides \
        its tenant's.",
    params(("id" = String, Path, description = "The session's id.")),
    request_body(content = BudgetBody, content_type = "application/json"),
    responses((status = 200, description = "The budget as it applies now.", body = BudgetView), SetSessionBudgetErrors),
)]
pub(crate) async fn set_session(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<BudgetBody>,
) -> Result<Json<BudgetView>, ApiError> {
    let tenant = budget_session(&server, &principal, &id).await?;
    let budget = check_budget(&body)?;
    let target = BudgetTarget::Session(id.clone());
    server.host.factory.budgets.set(&target, Some(&budget)).await?;
    Ok(Json(view(&server, tenant, Some(id)).await?))
}

/// `DELETE /v1/sessions/{id}/budget`.
#[utoipa::path(
    delete,
    path = "/sessions/{id}/budget",
    tag = "usage",
    operation_id = "delete_session_budget",
    security(("bearer" = ["admin"])),
    summary = "Remove a session's budget",
    description = "Removes the session's own budget (if it has one); its tenant's still applies.",
    params(("id" = String, Path, description = "The session's id.")),
    responses((status = 204, description = "The session's budget is gone."), SessionBudgetErrors),
)]
pub(crate) async fn delete_session(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
    Extension(principal): Extension<Principal>,
) -> Result<StatusCode, ApiError> {
    budget_session(&server, &principal, &id).await?;
    server
        .host
        .factory
        .budgets
        .set(&BudgetTarget::Session(id), None)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Budgets are the server's administrator's: `admin` on every tenant (a
/// tenant's own administrator may not raise its budget).
fn require_server_admin(principal: &Principal) -> Result<(), ApiError> {
    principal.require(Scope::Admin)?;
    if principal.tenant_filter().is_some() {
        return Err(ApiError::MissingScope(Scope::Admin));
    }
    Ok(())
}

/// A limit of a budget body: an integer from 0 to 2^63 - 1 (`5.0` reads as
/// 5, as JSON Schema counts it), never `null`.
fn limit<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    match crate::extract::json_int64(deserializer)? {
        Some(value) => Ok(Some(value)),
        None => Err(serde::de::Error::custom(
            "a limit is a number; leave it out to have none",
        )),
    }
}

/// Refuses a budget with no limit: `DELETE` is how one is removed.
fn check_budget(body: &BudgetBody) -> Result<BudgetConfig, ApiError> {
    let budget = BudgetConfig::from(*body);
    if budget.is_empty() {
        return Err(ApiError::InvalidRequest(
            "a budget needs at least one limit; DELETE removes a budget".to_owned(),
        ));
    }
    Ok(budget)
}

/// The tenant of session `id`, for a budget route: the session's check
/// first (`admin`, then `404` for a session the principal does not see, as
/// for one that does not exist), then `admin` on every tenant.
async fn budget_session(server: &Server, principal: &Principal, id: &str) -> Result<String, ApiError> {
    let summary = access::session(server, principal, Scope::Admin, id)
        .await?
        .ok_or_else(|| ApiError::unknown_session(id))?;
    require_server_admin(principal)?;
    Ok(summary.context.tenant)
}

/// The budget of `tenant`, or of its session `session_id`, as it applies
/// now, with what was spent.
async fn view(server: &Server, tenant: String, session_id: Option<String>) -> Result<BudgetView, ApiError> {
    let budgets = &server.host.factory.budgets;
    let access = budgets.access()?;
    let target = match &session_id {
        Some(id) => BudgetTarget::Session(id.clone()),
        None => BudgetTarget::Tenant(tenant.clone()),
    };
    let Some((budget, source)) = budgets.applying(&target) else {
        let whose = match &session_id {
            Some(id) => format!("session '{id}'"),
            None => format!("tenant '{tenant}'"),
        };
        return Err(ApiError::NotFound(format!("no budget applies to {whose}")));
    };
    let spend = budgets.spend(&target, true).await?;
    let running_turns = match &session_id {
        None => Some(access.running_turns(&tenant).await?),
        Some(_) => None,
    };
    let owner = crate::budget::Owner {
        tenant: &tenant,
        session_id: session_id.as_deref(),
    };
    let exhausted = crate::budget::first_exhausted(&budget, &spend, owner);
    Ok(BudgetView {
        tenant,
        session_id,
        budget: budget.into(),
        source,
        spend,
        running_turns,
        exhausted,
    })
}
