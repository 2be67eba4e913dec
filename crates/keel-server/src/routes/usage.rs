//! `GET /v1/usage`: token usage summed per session, per bot and in all.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::Server;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use crate::openapi::errors::route_errors;
use keel_protocol::TokenUsage;
use keel_store::session_usage;

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
    /// Everything, summed.
    total: TokenUsage,
    /// Per bot.
    bots: Vec<BotLine>,
    /// Per session.
    sessions: Vec<SessionLine>,
}

route_errors!(
    /// What `GET /v1/usage` can answer besides `200`.
    UsageErrors: ["invalid_request"]
);

/// `GET /v1/usage`.
#[utoipa::path(
    get,
    path = "/usage",
    tag = "usage",
    operation_id = "get_usage",
    summary = "Token usage",
    description = "Tokens used, summed per session, per bot and in all.",
    params(UsageQuery),
    responses((status = 200, description = "The report.", body = UsageReport), UsageErrors),
)]
pub(crate) async fn show(
    State(server): State<Arc<Server>>,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    if let Some(bot_id) = &query.bot_id {
        super::sessions::check_bot_id(bot_id)?;
    }
    let found = session_usage(
        server.host.store.as_ref(),
        keel_store::SessionFilter::bot(query.bot_id.as_deref()),
        query.since,
    )
    .await?;
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
        total,
        bots: bots.into_values().collect(),
        sessions,
    }))
}
