//! Conformance: listing sessions by their last activity.

use std::time::Duration;

use super::{StoreFactory, append, create, events};
use crate::{CheckpointStore, StoreError};

/// Every id of a walk through the by-activity pages of `store`, `limit`
/// per page, calling `between` after each page.
async fn walk(store: &dyn CheckpointStore, limit: usize, mut between: impl AsyncFnMut(usize)) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for page_number in 0.. {
        let page = store
            .list_sessions_by_activity(cursor.as_deref(), limit, crate::SessionFilter::bot(None))
            .await
            .expect("page");
        assert!(page.sessions.len() <= limit);
        seen.extend(page.sessions.iter().map(|summary| summary.session_id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
        between(page_number).await;
    }
    seen
}

/// Lets the store's clock move on, so that each write has its own time.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(3)).await;
}

pub(crate) async fn sessions_by_activity_put_the_latest_written_first_page_by_page(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    for id in ["a", "b", "c", "d", "e"] {
        create(&store, id).await;
        tick().await;
    }
    append(&store, "b", &events("b", 0, 1)).await;
    tick().await;
    append(&store, "d", &events("d", 0, 1)).await;
    tick().await;
    let seen = walk(&store, 2, async |_| {}).await;
    assert_eq!(seen, ["d", "b", "e", "c", "a"]);
    // A bare time: the sessions last active at or before it.
    let b = store.session_summary("b").await.expect("summary").expect("b");
    let before_b = store
        .list_sessions_by_activity(Some(&b.updated_at_ms.to_string()), 10, crate::SessionFilter::bot(None))
        .await
        .expect("page");
    let ids: Vec<&str> = before_b
        .sessions
        .iter()
        .map(|summary| summary.session_id.as_str())
        .collect();
    assert_eq!(ids, ["b", "e", "c", "a"]);
    let first = store
        .list_sessions_by_activity(None, 10, crate::SessionFilter::bot(Some("bot")))
        .await
        .expect("by bot");
    assert_eq!(first.sessions.len(), 5);
    let none = store
        .list_sessions_by_activity(None, 10, crate::SessionFilter::bot(Some("nobody")))
        .await
        .expect("by bot");
    assert!(none.sessions.is_empty() && none.next_cursor.is_none());
    for cursor in ["x", "x-1", "1-", "-1", "1-2-3"] {
        assert!(
            matches!(
                store
                    .list_sessions_by_activity(Some(cursor), 2, crate::SessionFilter::bot(None))
                    .await,
                Err(StoreError::Invalid(_))
            ),
            "{cursor}"
        );
    }
}

pub(crate) async fn a_walk_by_activity_lists_no_session_twice_and_misses_none_left_alone(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    let ids: Vec<String> = (0..9).map(|n| format!("s{n}")).collect();
    for id in &ids {
        create(&store, id).await;
        tick().await;
    }
    // After each page, a session not read yet and one already read get
    // written: both move ahead of the walk.
    let mut touched = Vec::new();
    let seen = walk(&store, 2, async |page| {
        for id in [format!("s{}", 6 - page * 2), format!("s{}", 8 - page)] {
            if !touched.contains(&id) {
                append(&store, &id, &events(&id, 0, 1)).await;
                touched.push(id);
                tick().await;
            }
        }
    })
    .await;
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "listed twice: {seen:?}");
    for id in ids.iter().filter(|id| !touched.contains(id)) {
        assert!(seen.contains(id), "{id} missing from {seen:?}");
    }
    // A fresh first page has the sessions written during the walk first.
    let fresh = walk(&store, 100, async |_| {}).await;
    assert_eq!(fresh.len(), ids.len());
    let mut newest: Vec<&String> = touched.iter().rev().collect();
    newest.truncate(2);
    assert_eq!(fresh.iter().take(2).collect::<Vec<_>>(), newest);
}
