//! Durable events per second through the event recorder.
//!
//! Runs the recorder workload (`keel::bench::recorder`) for 1, 8 and 64
//! concurrent sessions with group commit, and the one-transaction-per-event
//! baseline, all in the same process on real SQLite files with
//! `synchronous=FULL`. Criterion reports throughput (elements = events); a
//! summary of medians, latency percentiles and the ratio to the baseline is
//! printed at the end.

use std::sync::Mutex;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use keel::bench::median;
use keel::bench::recorder::{RecorderParams, RecorderReport, run_recorder};
use keel::store::Synchronous;

/// (name, sessions, events per session, group commit)
const CONFIGS: [(&str, usize, usize, bool); 4] = [
    ("baseline_txn_per_event", 1, 300, false),
    ("group_commit", 1, 20_000, true),
    ("group_commit", 8, 5_000, true),
    ("group_commit", 64, 1_000, true),
];

fn main() {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start tokio: {error}");
            std::process::exit(1);
        }
    };
    let mut criterion = Criterion::default().configure_from_args();
    let runs: Vec<Mutex<Vec<RecorderReport>>> = CONFIGS.iter().map(|_| Mutex::new(Vec::new())).collect();
    {
        let mut group = criterion.benchmark_group("recorder");
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for ((name, sessions, per_session, group_commit), reports) in CONFIGS.iter().zip(&runs) {
            let params = RecorderParams {
                sessions: *sessions,
                events_per_session: *per_session,
                group_commit: *group_commit,
                synchronous: Synchronous::Full,
            };
            group.throughput(Throughput::Elements((sessions * per_session) as u64));
            group.bench_function(BenchmarkId::new(*name, sessions), |bencher| {
                bencher.iter_custom(|iterations| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        match runtime.block_on(run_recorder(&params)) {
                            Ok(report) => {
                                total += Duration::from_secs_f64(report.wall_s);
                                reports.lock().unwrap_or_else(|poison| poison.into_inner()).push(report);
                            }
                            Err(error) => {
                                eprintln!("recorder bench failed: {error}");
                                std::process::exit(1);
                            }
                        }
                    }
                    total
                });
            });
        }
        group.finish();
    }
    summarize(&runs);
    criterion.final_summary();
}

/// Prints medians over every run of each configuration.
fn summarize(runs: &[Mutex<Vec<RecorderReport>>]) {
    let medians: Vec<(f64, f64, f64, usize)> = runs
        .iter()
        .map(|reports| {
            let reports = reports.lock().unwrap_or_else(|poison| poison.into_inner());
            let rate: Vec<f64> = reports.iter().map(|r| r.events_per_s).collect();
            let p50: Vec<f64> = reports.iter().map(|r| r.latency_p50_us).collect();
            let p99: Vec<f64> = reports.iter().map(|r| r.latency_p99_us).collect();
            (median(&rate), median(&p50), median(&p99), reports.len())
        })
        .collect();
    let baseline = medians[0].0;
    println!();
    println!("| config | sessions | runs | events/s (median) | p50 µs | p99 µs | × baseline |");
    println!("|---|---|---|---|---|---|---|");
    for ((name, sessions, _, _), (rate, p50, p99, count)) in CONFIGS.iter().zip(&medians) {
        println!(
            "| {name} | {sessions} | {count} | {rate:.0} | {p50:.0} | {p99:.0} | {:.1} |",
            rate / baseline
        );
    }
}
