//! Durable events per second through the event recorder.
//!
//! Each session has a producer and a consumer that receives the events after
//! they are stored. Two ways to produce:
//!
//! - [`Load::Flood`]: queue events as fast as the recorder takes them
//!   (waiting for room, as the turn loop does). Measures throughput; latency
//!   is then mostly time spent queued.
//! - [`Load::OneAtATime`]: send an event and wait until it is delivered
//!   before the next (`send_event`). Measures commit latency, and how
//!   sessions share commits.
//!
//! Latency runs from the moment an event is handed to the recorder to the
//! moment the consumer receives it, so it includes the commit.
//!
//! The baseline turns group commit off on both levels (one event per store
//! job, one job per transaction): one fsync per event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::database::{BenchDatabase, BenchStore, Grouping};
use super::stats::percentile;
use keel_agent::{EventRecorder, RecorderOptions, send_event};
use keel_protocol::{Error, Result};
use keel_protocol::{Event, EventMsg, WarningEvent};
use keel_store::{Checkpoint, CheckpointStore, Synchronous};

/// Parameters of one run.
#[derive(Debug, Clone)]
pub struct RecorderParams {
    /// Concurrent sessions, each with its own recorder.
    pub sessions: usize,
    /// Events each session records.
    pub events_per_session: usize,
    /// Commit everything queued together (`true`), or one event per
    /// transaction (the baseline).
    pub group_commit: bool,
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How each session produces its events.
    pub load: Load,
    /// The database (a fresh temporary SQLite file by default).
    pub database: BenchDatabase,
}

/// How the producers load the recorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Load {
    /// As fast as the recorder takes events.
    Flood,
    /// One event at a time per session, each waiting for its delivery.
    OneAtATime,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RecorderReport {
    /// The store's backend (`sqlite`, `postgres`).
    pub backend: &'static str,
    /// Sessions.
    pub sessions: usize,
    /// Whether group commit was on.
    pub group_commit: bool,
    /// How the producers loaded the recorder.
    pub load: Load,
    /// Events recorded and delivered.
    pub events: usize,
    /// Wall time, seconds.
    pub wall_s: f64,
    /// Durable events per second.
    pub events_per_s: f64,
    /// Median latency from queueing to delivery, microseconds.
    pub latency_p50_us: f64,
    /// 99th percentile (nearest rank) of the same, microseconds.
    pub latency_p99_us: f64,
    /// Transactions committed.
    pub commits: u64,
}

impl RecorderParams {
    /// The runs `cargo bench` and `keel bench recorder` make, named: the
    /// one-transaction-per-event baseline, then 1, 8 and 64 sessions with
    /// group commit, flooding (throughput) and one event at a time (latency).
    pub fn standard() -> Vec<(&'static str, RecorderParams)> {
        let run = |sessions, events_per_session, group_commit, load| RecorderParams {
            sessions,
            events_per_session,
            group_commit,
            synchronous: Synchronous::Full,
            load,
            database: BenchDatabase::default(),
        };
        vec![
            ("baseline_txn_per_event", run(1, 300, false, Load::Flood)),
            ("flood", run(1, 20_000, true, Load::Flood)),
            ("flood", run(8, 5_000, true, Load::Flood)),
            ("flood", run(64, 1_000, true, Load::Flood)),
            ("one_at_a_time", run(1, 300, true, Load::OneAtATime)),
            ("one_at_a_time", run(8, 300, true, Load::OneAtATime)),
            ("one_at_a_time", run(64, 100, true, Load::OneAtATime)),
        ]
    }
}

/// Runs the workload on a fresh database in a temporary directory.
pub async fn run_recorder(params: &RecorderParams) -> Result<RecorderReport> {
    let grouping = if params.group_commit {
        Grouping::Group
    } else {
        Grouping::OneJobPerTransaction
    };
    let database = BenchStore::open(&params.database, "bench-recorder.sqlite3", params.synchronous, grouping).await?;
    let store = database.store();
    // Ids of this run's own: a PostgreSQL database may be reused.
    let run = keel_protocol::new_id();
    let recorder_options = RecorderOptions {
        max_batch: if params.group_commit {
            RecorderOptions::default().max_batch
        } else {
            1
        },
        lease: None,
    };
    let mut sessions = Vec::with_capacity(params.sessions);
    for index in 0..params.sessions {
        let session_id = format!("session-{index}-{run}");
        store.save(&Checkpoint::empty(session_id.clone()), &[], None).await?;
        sessions.push(session_id);
    }

    let commits_before = database.stats().commits;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for session_id in sessions {
        let (store, count, load) = (Arc::clone(&store), params.events_per_session, params.load);
        tasks.spawn(async move { record_session(store, session_id, count, recorder_options, load).await });
    }
    let mut latencies_us = Vec::with_capacity(params.sessions * params.events_per_session);
    while let Some(joined) = tasks.join_next().await {
        let session = joined.map_err(|error| Error::stopped(format!("bench session failed: {error}")))??;
        latencies_us.extend(session.iter().map(|latency| latency.as_secs_f64() * 1e6));
    }
    let wall = started.elapsed();
    let commits = database.stats().commits.saturating_sub(commits_before);
    drop(store);
    database.close().await;
    Ok(RecorderReport {
        backend: params.database.backend(),
        sessions: params.sessions,
        group_commit: params.group_commit,
        load: params.load,
        events: latencies_us.len(),
        wall_s: wall.as_secs_f64(),
        events_per_s: latencies_us.len() as f64 / wall.as_secs_f64(),
        latency_p50_us: percentile(&latencies_us, 50.0),
        latency_p99_us: percentile(&latencies_us, 99.0),
        commits,
    })
}

/// Records `count` events in one session; returns each event's latency.
async fn record_session(
    store: Arc<dyn CheckpointStore>,
    session_id: String,
    count: usize,
    options: RecorderOptions,
    load: Load,
) -> Result<Vec<Duration>> {
    let (recorder, mut delivered) = EventRecorder::spawn_with(store, session_id, options);
    // Queue times travel beside the events, in the same order.
    let (stamps, mut stamp_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let consumer = tokio::spawn(async move {
        let mut latencies = Vec::with_capacity(count);
        while latencies.len() < count {
            let Some(_event) = delivered.recv().await else { break };
            let Ok(queued) = stamp_rx.try_recv() else { break };
            latencies.push(queued.elapsed());
        }
        latencies
    });
    for index in 0..count {
        let event = Event {
            submission_id: None,
            msg: EventMsg::Warning(WarningEvent {
                message: format!("bench event {index}: a short payload"),
            }),
        };
        let _ = stamps.send(Instant::now());
        match load {
            Load::Flood => recorder.append(vec![event], None).await?,
            Load::OneAtATime => {
                send_event(&recorder, event).await?;
            }
        }
    }
    recorder.flush().await?;
    let latencies = consumer
        .await
        .map_err(|error| Error::stopped(format!("bench consumer failed: {error}")))?;
    if latencies.len() != count {
        return Err(Error::stopped(format!(
            "delivered {} of {count} events",
            latencies.len()
        )));
    }
    Ok(latencies)
}
