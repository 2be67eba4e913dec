//! Whether reading near the end of a long log costs what reading its newest
//! page does: one session of N events stored one per row (the worst case
//! for a scan: every event its own row), then many reads of the last page
//! (`event_page` without `before`, what `GET …/events` answers first), of
//! the events after `LAST - 100` (`?after=`, an SSE resume near the end),
//! and, as the baseline a scan would show against, of the events after 0.
//!
//! A query bounded only by the session in the index reads the whole log
//! before it finds the tail; one bounded by the sequence costs the same at
//! any length.

use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::database::{BenchDatabase, BenchStore, Grouping};
use super::stats::median;
use keel_protocol::{Error, Event, EventMsg, Result, WarningEvent};
use keel_store::{
    AppendBatch, Checkpoint, CheckpointStore, CheckpointStoreExt, EncodedEvent, EventPageRequest, Synchronous,
};

/// Events read per request, as a client pages.
pub const PAGE: usize = 100;

/// Appends in flight while the log is written (each one row).
const WRITERS: usize = 64;

/// Parameters of the workload.
#[derive(Debug, Clone)]
pub struct TailParams {
    /// Events in the session, one per row.
    pub events: u64,
    /// Reads of each kind; the report has their medians.
    pub reads: usize,
    /// The database (a fresh temporary SQLite file by default).
    pub database: BenchDatabase,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct TailReport {
    /// The store's backend.
    pub backend: &'static str,
    /// Events (and rows) in the session.
    pub events: u64,
    /// Seconds it took to store them.
    pub write_s: f64,
    /// Median time to read the newest page, ms.
    pub newest_page_ms: f64,
    /// Median time to read the `PAGE` events after `LAST - PAGE`, ms.
    pub tail_after_ms: f64,
    /// Median time to read the `PAGE` events after 0, ms.
    pub head_after_ms: f64,
    /// `tail_after_ms` against `newest_page_ms`.
    pub tail_vs_newest: f64,
}

/// Writes the session, then times the reads.
pub async fn run_tail(params: &TailParams) -> Result<TailReport> {
    if params.events <= PAGE as u64 || params.reads == 0 {
        return Err(Error::Config(format!(
            "the tail workload needs more than {PAGE} events and at least one read"
        )));
    }
    // Durability is not what is measured here: the log is written relaxed.
    let database = BenchStore::open(
        &params.database,
        "bench-tail.sqlite3",
        Synchronous::Normal,
        Grouping::Group,
    )
    .await?;
    let store = database.store();
    let session = format!("tail-{}", keel_protocol::new_id());
    store.save(&Checkpoint::empty(session.clone()), &[], None).await?;
    let written = Instant::now();
    write_log(&store, &session, params.events).await?;
    let write_s = written.elapsed().as_secs_f64();

    let last = params.events;
    let newest = time_reads(params.reads, || async {
        let page = store
            .event_page(
                &session,
                EventPageRequest {
                    before_sequence: None,
                    limit: PAGE,
                },
            )
            .await?;
        expect_page(&page.events, last - PAGE as u64 + 1, last)
    })
    .await?;
    let tail = time_reads(params.reads, || async {
        let events = store.events_after(&session, last - PAGE as u64, PAGE).await?;
        expect_page(&events, last - PAGE as u64 + 1, last)
    })
    .await?;
    let head = time_reads(params.reads, || async {
        let events = store.events_after(&session, 0, PAGE).await?;
        expect_page(&events, 1, PAGE as u64)
    })
    .await?;
    database.close().await;
    Ok(TailReport {
        backend: params.database.backend(),
        events: params.events,
        write_s,
        newest_page_ms: newest,
        tail_after_ms: tail,
        head_after_ms: head,
        tail_vs_newest: tail / newest.max(f64::MIN_POSITIVE),
    })
}

/// Appends `events` events to `session`, each its own row (its own append).
async fn write_log(store: &Arc<dyn CheckpointStore>, session: &str, events: u64) -> Result<()> {
    let encoded = EncodedEvent::encode(&Event {
        submission_id: None,
        msg: EventMsg::Warning(WarningEvent {
            message: "a small event".to_owned(),
        }),
    })?;
    futures::stream::iter(0..events)
        .map(|_| {
            let batch = AppendBatch {
                events: vec![encoded.clone()],
                checkpoint: None,
                lease: None,
            };
            async move { store.append(session, batch).await.map(drop) }
        })
        .buffer_unordered(WRITERS)
        .try_collect::<()>()
        .await?;
    Ok(())
}

/// The median of `reads` timed calls of `read`, ms.
async fn time_reads<F, Fut>(reads: usize, read: F) -> Result<f64>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    // One untimed read first, so the pages read are cached alike.
    read().await?;
    let mut times = Vec::with_capacity(reads);
    for _ in 0..reads {
        let started = Instant::now();
        read().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(median(&times))
}

/// Checks that a read returned exactly the events `first..=last`.
fn expect_page(events: &[keel_protocol::RecordedEvent], first: u64, last: u64) -> Result<()> {
    let sequences: Vec<u64> = events.iter().map(|event| event.sequence).collect();
    if sequences != (first..=last).collect::<Vec<_>>() {
        return Err(Error::stopped(format!(
            "the tail workload read the wrong events: wanted {first}..={last}, got {} from {:?}",
            sequences.len(),
            sequences.first()
        )));
    }
    Ok(())
}
