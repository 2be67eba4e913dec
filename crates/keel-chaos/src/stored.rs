//! Reading back what a chaos run stored, once the load has stopped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::SETTLE_BOUND;
use keel_protocol::{RecordedEvent, Result};
use keel_store::{CheckpointStore, MAX_EVENT_PAGE, StoreError};

/// The store at `db` (a PostgreSQL URL or a SQLite file), opened to check it.
pub(super) async fn open_store(db: &str) -> Result<Arc<dyn CheckpointStore>> {
    let opened = keel_store::open(db, keel_store::OpenOptions::default())
        .await
        .map_err(StoreError::from)?;
    Ok(opened.store)
}

/// A session's whole stored log.
pub(super) async fn stored_log(store: &dyn CheckpointStore, session_id: &str) -> Result<Vec<RecordedEvent>> {
    let mut log: Vec<RecordedEvent> = Vec::new();
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let after = log.last().map_or(0, |event| event.sequence);
        let page = match store.events_after(session_id, after, MAX_EVENT_PAGE).await {
            Ok(page) => page,
            // The database is coming back from a restart.
            Err(keel_store::StoreError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let done = page.len() < MAX_EVENT_PAGE;
        log.extend(page);
        if done {
            return Ok(log);
        }
    }
}
