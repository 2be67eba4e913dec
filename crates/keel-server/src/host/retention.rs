//! Retention: sessions idle past `[server] retention_days` are deleted.

use std::time::Duration;

use super::Host;
use crate::error::ApiError;

impl Host {
    /// written for `max_idle` (`[server] retention_days`). A session that is
    /// loaded or has a turn in flight is left for a later sweep.
    pub(crate) async fn retain(&self, max_idle: Duration, every: Duration) {
        let mut closing = self.closing.subscribe();
        loop {
            match self.sweep(max_idle).await {
                Ok(0) => {}
                Ok(deleted) => tracing::info!(deleted, "deleted sessions past their retention"),
                Err(error) => tracing::warn!(%error, "cannot apply the session retention"),
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                _ = closing.wait_for(|closing| *closing) => return,
            }
        }
    }

    /// One retention sweep; returns how many sessions it deleted.
    async fn sweep(&self, max_idle: Duration) -> Result<usize, ApiError> {
        let max_idle_ms = u64::try_from(max_idle.as_millis()).unwrap_or(u64::MAX);
        let cutoff = keel_protocol::now_ms().saturating_sub(max_idle_ms);
        let mut expired = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .store
                .list_sessions_page(
                    cursor.as_deref(),
                    keel_store::MAX_EVENT_PAGE,
                    keel_store::SessionFilter::bot(None),
                )
                .await?;
            expired.extend(
                page.sessions
                    .into_iter()
                    .filter(|summary| summary.updated_at_ms < cutoff && summary.running_turn_id.is_none())
                    .map(|summary| summary.session_id),
            );
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let mut deleted = 0;
        for session_id in expired {
            if self.is_closing() {
                break;
            }
            if self.delete_where(&session_id, false, Some(cutoff)).await? {
                tracing::info!(%session_id, "session deleted: idle past the retention");
                deleted += 1;
            }
        }
        Ok(deleted)
    }
}
