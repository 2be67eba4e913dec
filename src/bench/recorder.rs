//! Durable events per second through the event recorder.
//!
//! Each session has a producer that queues small events as fast as the
//! recorder takes them (waiting for room, as the turn loop does) and a
//! consumer that receives them after they are stored. Latency is measured
//! from the moment an event is handed to the recorder to the moment the
//! consumer receives it, so it includes the commit.
//!
//! The baseline turns group commit off on both levels (one event per store
//! job, one job per transaction): one fsync per event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::stats::percentile;
use crate::agent::{EventRecorder, RecorderOptions};
use crate::protocol::{Event, EventMsg, WarningEvent};
use crate::store::{Checkpoint, CheckpointStore, SqliteCheckpoint, SqliteOptions, Synchronous};
use crate::{Error, Result};

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
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RecorderReport {
    /// Sessions.
    pub sessions: usize,
    /// Whether group commit was on.
    pub group_commit: bool,
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

/// Runs the workload on a fresh database in a temporary directory.
pub async fn run_recorder(params: &RecorderParams) -> Result<RecorderReport> {
    let scratch = tempfile::tempdir().map_err(|error| Error::Config(format!("cannot create a temp dir: {error}")))?;
    let options = SqliteOptions {
        synchronous: params.synchronous,
        max_jobs_per_commit: if params.group_commit {
            SqliteOptions::default().max_jobs_per_commit
        } else {
            1
        },
        ..SqliteOptions::default()
    };
    let sqlite = Arc::new(SqliteCheckpoint::open(scratch.path().join("bench-recorder.sqlite3"), options).await?);
    let store: Arc<dyn CheckpointStore> = sqlite.clone();
    let recorder_options = RecorderOptions {
        max_batch: if params.group_commit {
            RecorderOptions::default().max_batch
        } else {
            1
        },
    };
    let mut sessions = Vec::with_capacity(params.sessions);
    for index in 0..params.sessions {
        let session_id = format!("session-{index}");
        store.save(&Checkpoint::empty(session_id.clone()), &[], None).await?;
        sessions.push(session_id);
    }

    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for session_id in sessions {
        let (store, count) = (Arc::clone(&store), params.events_per_session);
        tasks.spawn(async move { record_session(store, session_id, count, recorder_options).await });
    }
    let mut latencies_us = Vec::with_capacity(params.sessions * params.events_per_session);
    while let Some(joined) = tasks.join_next().await {
        let session = joined.map_err(|error| Error::stopped(format!("bench session failed: {error}")))??;
        latencies_us.extend(session.iter().map(|latency| latency.as_secs_f64() * 1e6));
    }
    let wall = started.elapsed();
    let commits = sqlite.writer_stats().commits;
    drop(store);
    sqlite.close().await;
    Ok(RecorderReport {
        sessions: params.sessions,
        group_commit: params.group_commit,
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
        recorder.append(vec![event], None).await?;
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
