//! Whether a turn costs more as its session grows: one session per length
//! (10, 1,000 and 30,000 turns by default), each running the turns workload
//! in order, with what its last turns cost against the shortest session's.
//!
//! A turn that copies or re-reads the whole history makes a session's total
//! cost grow with the square of its length; here that shows as the last
//! turns of the long sessions costing more than the short one's.

use serde::Serialize;

use super::stats::{median, process_cpu_s};
use super::turns::{TurnsParams, run_session, warmed_up};
use keel_protocol::Result;

/// How many of a session's last turns its cost is read from (all of a
/// shorter session's).
pub const WINDOW: usize = 100;

/// What one session of one length measured.
#[derive(Debug, Clone, Serialize)]
pub struct LengthReport {
    /// The session's turns.
    pub turns: usize,
    /// Turns per second over the whole session.
    pub turns_per_s: f64,
    /// CPU time of the process per turn over the whole session, ms.
    pub cpu_ms_per_turn: f64,
    /// How many last turns the two figures below are read from.
    pub window: usize,
    /// Median latency of the last turns, ms.
    pub last_p50_ms: f64,
    /// CPU time of the process per turn over the last turns, ms.
    pub last_cpu_ms_per_turn: f64,
}

/// Runs one session per length in `lengths`, on a fresh database each, with
/// the rest of `params` (its `sessions` and `turns` are not used).
pub async fn run_lengths(params: &TurnsParams, lengths: &[usize]) -> Result<Vec<LengthReport>> {
    let mut reports = Vec::with_capacity(lengths.len());
    for &turns in lengths {
        let (database, store, model) = warmed_up(params, "bench-length.sqlite3").await?;
        let cpu_before = process_cpu_s();
        let started = std::time::Instant::now();
        let session = format!("length-{turns}-{}", keel_protocol::new_id());
        let times = run_session(params, &store, &model, session, turns).await?;
        let wall = started.elapsed().as_secs_f64();
        let cpu = process_cpu_s() - cpu_before;
        drop(store);
        database.close().await;
        let window = WINDOW.min(turns);
        let first = turns - window;
        // The window's CPU: from the end of the turn before it (or the
        // session's start) to the end of its last turn.
        let window_start = match first {
            0 => cpu_before,
            _ => times.cpu_at_end_s[first - 1],
        };
        let window_cpu = times.cpu_at_end_s.last().copied().unwrap_or(window_start) - window_start;
        reports.push(LengthReport {
            turns,
            turns_per_s: turns as f64 / wall,
            cpu_ms_per_turn: cpu * 1000.0 / turns.max(1) as f64,
            window,
            last_p50_ms: median(&times.latencies_ms[first..]),
            last_cpu_ms_per_turn: window_cpu * 1000.0 / window.max(1) as f64,
        });
    }
    Ok(reports)
}
