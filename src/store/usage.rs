//! Token usage summed over sessions, for `GET /v1/usage`.
//!
//! Totals since a session began come from its checkpoint (kept with every
//! step). Totals since a point in time come from the `token_usage` events
//! recorded since then, read newest first from the sessions written since
//! then only, so that a recent window costs what was recorded in it.

use super::{CheckpointStore, EventPageRequest, MAX_EVENT_PAGE, StoreError};
use crate::protocol::{EventMsg, TokenUsage};

/// One session's token usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionUsage {
    /// The session.
    pub session_id: String,
    /// The bot that owns it.
    pub bot_id: String,
    /// Tokens used (in the window asked for).
    pub usage: TokenUsage,
}

/// The token usage of every session (of bot `bot_id` when given), newest
/// created first: all of it, or only the steps recorded at or after
/// `since_ms` (milliseconds since the Unix epoch). Sessions with nothing in
/// the window are left out.
pub async fn session_usage(
    store: &dyn CheckpointStore,
    bot_id: Option<&str>,
    since_ms: Option<u64>,
) -> Result<Vec<SessionUsage>, StoreError> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list_sessions_page(cursor.as_deref(), MAX_EVENT_PAGE, bot_id)
            .await?;
        for summary in page.sessions {
            let usage = match since_ms {
                None => summary.usage,
                // Written before the window: nothing of it is in there.
                Some(since) if summary.updated_at_ms < since => continue,
                Some(since) => usage_since(store, &summary.session_id, since).await?,
            };
            if usage != TokenUsage::default() {
                found.push(SessionUsage {
                    session_id: summary.session_id,
                    bot_id: summary.bot_id,
                    usage,
                });
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(found),
        }
    }
}

/// The usage of the `token_usage` events of one session recorded at or
/// after `since_ms`, read backwards from the newest.
async fn usage_since(store: &dyn CheckpointStore, session_id: &str, since_ms: u64) -> Result<TokenUsage, StoreError> {
    let mut total = TokenUsage::default();
    let mut before_sequence = None;
    loop {
        let request = EventPageRequest {
            before_sequence,
            limit: MAX_EVENT_PAGE,
        };
        let page = store.event_page(session_id, request).await?;
        for event in page.events.iter().rev() {
            if event.recorded_at_ms < since_ms {
                return Ok(total);
            }
            if let EventMsg::TokenUsage(step) = &event.msg {
                total.add(&step.usage);
            }
        }
        match page.events.first() {
            Some(first) if page.has_more => before_sequence = Some(first.sequence),
            _ => return Ok(total),
        }
    }
}
