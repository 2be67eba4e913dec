//! Durable events per second through the event recorder.
//!
//! Runs the standard recorder workloads (`RecorderParams::standard`): the
//! one-transaction-per-event baseline, then 1, 8 and 64 concurrent sessions
//! with group commit, flooding the recorder (throughput) and sending one event
//! at a time (commit latency), all in the same process on real SQLite files
//! with `synchronous=FULL`. Criterion reports throughput (elements = events);
//! a summary of medians, latency percentiles and ratios to the baseline is
//! printed at the end.

use std::sync::Mutex;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use keel_bench::median;
use keel_bench::recorder::{RecorderParams, RecorderReport, run_recorder};

fn main() {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start tokio: {error}");
            std::process::exit(1);
        }
    };
    let configs = RecorderParams::standard();
    let mut criterion = Criterion::default().configure_from_args();
    let runs: Vec<Mutex<Vec<RecorderReport>>> = configs.iter().map(|_| Mutex::new(Vec::new())).collect();
    {
        let mut group = criterion.benchmark_group("recorder");
        group
            .sample_size(10)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(3));
        for ((name, params), reports) in configs.iter().zip(&runs) {
            group.throughput(Throughput::Elements(
                (params.sessions * params.events_per_session) as u64,
            ));
            group.bench_function(BenchmarkId::new(*name, params.sessions), |bencher| {
                bencher.iter_custom(|iterations| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iterations {
                        match runtime.block_on(run_recorder(params)) {
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
    summarize(&configs, &runs);
    criterion.final_summary();
}

/// Prints medians over every run of each configuration.
fn summarize(configs: &[(&str, RecorderParams)], runs: &[Mutex<Vec<RecorderReport>>]) {
    let medians: Vec<(f64, f64, f64, usize)> = runs
        .iter()
        .map(|reports| {
            let reports = reports.lock().unwrap_or_else(|poison| poison.into_inner());
            let pick = |field: fn(&RecorderReport) -> f64| median(&reports.iter().map(field).collect::<Vec<_>>());
            (
                pick(|r| r.events_per_s),
                pick(|r| r.latency_p50_us),
                pick(|r| r.latency_p99_us),
                reports.len(),
            )
        })
        .collect();
    let baseline = medians[0].0;
    println!();
    println!("| run | sessions | runs | events/s (median) | p50 µs | p99 µs | × baseline |");
    println!("|---|---|---|---|---|---|---|");
    for ((name, params), (rate, p50, p99, count)) in configs.iter().zip(&medians) {
        println!(
            "| {name} | {} | {count} | {rate:.0} | {p50:.0} | {p99:.0} | {:.1} |",
            params.sessions,
            rate / baseline
        );
    }
}
