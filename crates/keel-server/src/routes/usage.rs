//! `GET /v1/usage`: token usage summed per session, per bot and in all.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use crate::Server;
use crate::error::ApiError;
use crate::extract::ApiQuery;
use keel_protocol::TokenUsage;
use keel_store::session_usage;

/// The query of `GET /v1/usage`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UsageQuery {
    /// Only this bot's sessions.
    bot_id: Option<String>,
    /// Only steps recorded at or after this time (ms since the Unix epoch).
    since: Option<u64>,
}

/// One session's line of the report.
#[derive(Debug, Serialize)]
pub(crate) struct SessionLine {
    id: String,
    bot_id: String,
    usage: TokenUsage,
}

/// One bot's line of the report.
#[derive(Debug, Serialize)]
pub(crate) struct BotLine {
    bot_id: String,
    sessions: u64,
    usage: TokenUsage,
}

/// The body of `GET /v1/usage`.
#[derive(Debug, Serialize)]
pub(crate) struct UsageReport {
    bot_id: Option<String>,
    since: Option<u64>,
    total: TokenUsage,
    bots: Vec<BotLine>,
    sessions: Vec<SessionLine>,
}

/// `GET /v1/usage`.
pub(crate) async fn show(
    State(server): State<Arc<Server>>,
    ApiQuery(query): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiError> {
    if let Some(bot_id) = &query.bot_id {
        super::sessions::check_bot_id(bot_id)?;
    }
    let found = session_usage(server.host.store.as_ref(), query.bot_id.as_deref(), query.since).await?;
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
