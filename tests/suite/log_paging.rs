//! Property test of log paging: for random layouts of batches appended to a
//! SQLite store, reading the log backwards with `event_page` and forwards
//! with `events_after`, in pages of random sizes, gives every event once,
//! in order.

use std::sync::Arc;

use keel::protocol::{Event, EventMsg, WarningEvent};
use keel::store::CheckpointStoreExt;
use keel::store::{
    AppendBatch, Checkpoint, CheckpointStore, EncodedEvent, EventPageRequest, MAX_EVENT_PAGE, SqliteCheckpoint,
};
use proptest::prelude::*;

fn warning(number: usize) -> Event {
    Event {
        submission_id: None,
        msg: EventMsg::Warning(WarningEvent {
            message: format!("event {number}"),
        }),
    }
}

fn number_of(event: &keel::RecordedEvent) -> usize {
    match &event.msg {
        EventMsg::Warning(warning) => warning.message["event ".len()..].parse().expect("a number"),
        other => panic!("an unexpected event {other:?}"),
    }
}

async fn scenario(batches: Vec<usize>, back_pages: Vec<usize>, forward_pages: Vec<usize>) {
    let directory = tempfile::tempdir().expect("directory");
    let store = Arc::new(SqliteCheckpoint::new(directory.path().join("db.sqlite3")).expect("store"));
    store.save(&Checkpoint::empty("s"), &[], None).await.expect("session");
    let mut total = 0;
    for size in batches {
        let events = (total..total + size)
            .map(|number| EncodedEvent::encode(&warning(number)).expect("encode"))
            .collect();
        let batch = AppendBatch {
            events,
            checkpoint: None,
            lease: None,
        };
        store.append("s", batch).await.expect("append");
        total += size;
    }
    let expected: Vec<u64> = (1..=total as u64).collect();

    // Backwards, from the newest.
    let mut backwards = Vec::new();
    let mut before = None;
    for round in 0.. {
        assert!(round <= total, "paging backwards ends");
        let limit = back_pages[round % back_pages.len()];
        let page = store
            .event_page(
                "s",
                EventPageRequest {
                    before_sequence: before,
                    limit,
                },
            )
            .await
            .expect("page");
        assert!(
            page.events.len() <= limit.min(MAX_EVENT_PAGE),
            "a page of {limit} at most"
        );
        let sequences: Vec<u64> = page.events.iter().map(|event| event.sequence).collect();
        assert!(sequences.windows(2).all(|pair| pair[0] < pair[1]), "a page is in order");
        if let Some(before) = before {
            assert!(sequences.iter().all(|sequence| *sequence < before));
        }
        for event in page.events.iter().rev() {
            assert_eq!(number_of(event) as u64 + 1, event.sequence, "the event at its sequence");
        }
        backwards.splice(0..0, sequences.iter().copied());
        let Some(first) = sequences.first() else {
            assert!(!page.has_more, "an empty page says there is no more");
            break;
        };
        assert_eq!(page.has_more, *first > 1, "has_more says whether older events exist");
        if !page.has_more {
            break;
        }
        before = Some(*first);
    }
    assert_eq!(backwards, expected, "backwards: every event once, in order");

    // Forwards, from the start.
    let mut forwards = Vec::new();
    let mut after = 0;
    for round in 0.. {
        assert!(round <= total, "paging forwards ends");
        let limit = forward_pages[round % forward_pages.len()];
        let page = store.events_after("s", after, limit).await.expect("events after");
        assert!(page.len() <= limit.min(MAX_EVENT_PAGE), "a page of {limit} at most");
        if page.is_empty() {
            break;
        }
        assert!(page.iter().all(|event| event.sequence > after));
        for event in &page {
            assert_eq!(number_of(event) as u64 + 1, event.sequence);
        }
        forwards.extend(page.iter().map(|event| event.sequence));
        after = page.last().map_or(after, |event| event.sequence);
    }
    assert_eq!(forwards, expected, "forwards: every event once, in order");

    // A page of nothing still says whether there is more.
    let request = EventPageRequest {
        before_sequence: None,
        limit: 0,
    };
    let page = store.event_page("s", request).await.expect("empty page");
    assert!(page.events.is_empty());
    assert_eq!(page.has_more, total > 0);
    assert!(store.events_after("s", 0, 0).await.expect("no events").is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn paging_backwards_and_forwards_gives_every_event_once_in_order(
        batches in proptest::collection::vec(prop_oneof![3 => 1usize..4, 1 => 4usize..40], 0..24),
        back_pages in proptest::collection::vec(prop_oneof![1usize..8, 8usize..64], 1..6),
        forward_pages in proptest::collection::vec(prop_oneof![1usize..8, 8usize..64], 1..6),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(scenario(batches, back_pages, forward_pages));
    }
}
