//! `GET /v1/usage`: token usage summed per session, per bot and in all, of
//! the tenant the principal sees (every tenant's only with `admin`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::access;
use crate::Server;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::openapi::errors::route_errors;
use keel_protocol::TokenUsage;
use keel_store::{SessionFilter, session_usage};

/// The query of `GET /v1/usage`.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct UsageQuery {
    /// Only this bot's sessions.
    #[param(min_length = 1, max_length = 128, pattern = r"^[ -~]+$")]
    bot_id: Option<String>,
    /// Only steps recorded at or after this time (ms since the Unix epoch).
    #[serde(default, deserialize_with = "crate::extract::int64")]
    since: Option<u64>,
    /// Only this tenant's sessions. A principal of one tenant sees only its
    /// own (naming another finds none); without it, the operator's report
    /// covers every tenant, which needs the `admin` scope.
    #[param(min_length = 1, max_length = 128, pattern = r"^[ -$&-~]+$")]
    tenant: Option<String>,
}

/// One session's line of the report.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SessionLine {
    /// The session's id.
    id: String,
    /// Its bot.
    bot_id: String,
    /// Its tokens.
    usage: TokenUsage,
}

/// One bot's line of the report.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BotLine {
    /// The bot.
    bot_id: String,
    /// How many of its sessions used tokens.
    sessions: u64,
    /// Their tokens.
    usage: TokenUsage,
}

/// The body of `GET /v1/usage`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UsageReport {
    /// The bot asked for, if any.
    bot_id: Option<String>,
    /// The time asked for, if any.
    since: Option<u64>,
    /// The tenant reported on; `None`: every tenant.
    tenant: Option<String>,
    /// Everything, summed.
    total: TokenUsage,
    /// Per bot.
    bots: Vec<BotLine>,
    /// Per session.
    sessions: Vec<SessionLine>,
}

route_errors!(
    /// What `GET /v1/usage` can answer besides `200`.
    UsageErrors: ["invalid_request", "missing_scope_read", "missing_scope_admin"]
);

/// `GET /v1/usage`.
#[utoipa::path(
    get,
    path = "/usage",
    tag = "usage",
    operation_id = "get_usage",
    summary = "Token usage",
    description = "Tokens used, summed per session, per bot and in all, over the sessions of the credentials' \
        tenant; the operator's covers every tenant (which needs `admin` as well) unless `tenant` names one.",
    params(UsageQuery),
    security(("bearer" = ["read"])),
    responses((status = 200, description = "The report.", body = UsageReport), UsageErrors),
)]
pub(crate) async fn show(
    State(server): State<Arc<Server>>,
    Extension(principal): Extension<Principal>,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    principal.require(Scope::Read)?;
    if let Some(bot_id) = &query.bot_id {
        super::sessions::check_bot_id(bot_id)?;
    }
    if let Some(tenant) = &query.tenant {
        access::check_tenant(tenant)?;
    }
    let filter = match access::list_tenant(&principal, query.tenant.as_deref()) {
        // The whole server's usage.
        Ok(None) => {
            principal.require(Scope::Admin)?;
            Some(SessionFilter::bot(query.bot_id.as_deref()))
        }
        Ok(Some(tenant)) => Some(SessionFilter {
            bot_id: query.bot_id.as_deref(),
            tenant: Some(tenant),
        }),
        // Another tenant than the principal's own: none of its sessions.
        Err(()) => None,
    };
    let found = match filter {
        Some(filter) => session_usage(server.host.store.as_ref(), filter, query.since).await?,
        None => Vec::new(),
    };
    let tenant = filter
        .and_then(|filter| filter.tenant)
        .or(query.tenant.as_deref())
        .map(str::to_owned);
    let mut total = TokenUsage::default();
    let mut bots: BTreeMap<String, BotLine> = BTreeMap::new();
    let mut sessions = Vec::with_capacity(found.len());
    for line in found {
        total.add(&line.usage);
        let bot = bots.entry(line.bot_id.clone()).or_insert_with(|| BotLine {
            bot_id: line.bot_id.clone(),
            sessions: 0,
            usage: TokenUsage::default(),
        });
        bot.sessions += 1;
        bot.usage.add(&line.usage);
        sessions.push(SessionLine {
            id: line.session_id,
            bot_id: line.bot_id,
            usage: line.usage,
        });
    }
    Ok(Json(UsageReport {
        bot_id: query.bot_id,
        since: query.since,
        tenant,
        total,
        bots: bots.into_values().collect(),
        sessions,
    }))
}
