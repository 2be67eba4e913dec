//! Reading a session's log backwards, newest first, a page at a time: for
//! what lies at its end (the text a cut turn streamed, the usage since a
//! time) without reading it all.

use std::ops::ControlFlow;

use super::{CheckpointStore, EventPageRequest, MAX_EVENT_PAGE, StoreError};
use keel_protocol::RecordedEvent;

/// Visits a session's events from the newest back, a page at a time, until
/// `visit` breaks or the log's start is reached.
pub async fn walk_back(
    store: &dyn CheckpointStore,
    session_id: &str,
    mut visit: impl FnMut(&RecordedEvent) -> ControlFlow<()>,
) -> Result<(), StoreError> {
    let mut before_sequence = None;
    loop {
        let request = EventPageRequest {
            before_sequence,
            limit: MAX_EVENT_PAGE,
        };
        let page = store.event_page(session_id, request).await?;
        for event in page.events.iter().rev() {
            if visit(event).is_break() {
                return Ok(());
            }
        }
        match page.events.first() {
            Some(first) if page.has_more => before_sequence = Some(first.sequence),
            _ => return Ok(()),
        }
    }
}
