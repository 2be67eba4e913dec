//! Token usage summed over sessions, for `GET /v1/usage`.
//!
//! Totals since a session began come from its checkpoint (kept with every
//! step). Totals since a point in time come from the `token_usage` events
//! recorded since then, read newest first from the sessions written since
//! then only, so that a recent window costs what was recorded in it.

use std::ops::ControlFlow;

use super::{CheckpointStore, MAX_EVENT_PAGE, SessionFilter, StoreError, walk_back};
use keel_protocol::{EventMsg, TokenUsage};

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

/// The token usage of every session `filter` admits (a bot's, a tenant's), newest
/// created first: all of it, or only the steps recorded at or after
/// `since_ms` (milliseconds since the Unix epoch). Sessions with nothing in
/// the window are left out.
pub async fn session_usage(
    store: &dyn CheckpointStore,
    filter: SessionFilter<'_>,
    since_ms: Option<u64>,
) -> Result<Vec<SessionUsage>, StoreError> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list_sessions_page(cursor.as_deref(), MAX_EVENT_PAGE, filter)
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
    walk_back(store, session_id, |event| {
        if event.recorded_at_ms < since_ms {
            return ControlFlow::Break(());
        }
        match &event.msg {
            EventMsg::TokenUsage(step) => total.add(&step.usage),
            EventMsg::ContextCompacted(compacted) => {
                if let Some(usage) = &compacted.usage {
                    total.add(usage);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    })
    .await?;
    Ok(total)
}
