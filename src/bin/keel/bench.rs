//! `keel bench`: the benchmark workloads, printed as a table and a JSON line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use keel::agent::StreamingOptions;
use keel::bench::recorder::{RecorderParams, run_recorder};
use keel::bench::turns::{TurnsParams, Variant, run_turns};
use keel::store::Synchronous;

use crate::print_line;

/// The workloads.
#[derive(Subcommand, Debug)]
pub(crate) enum BenchCommand {
    /// Durable streaming agent turns (the LangGraph peer workload).
    Turns {
        /// Concurrent sessions.
        #[arg(short = 'S', long, default_value_t = 8)]
        sessions: usize,
        /// Turns per session.
        #[arg(short = 'T', long, default_value_t = 50)]
        turns: usize,
        /// Text chunks per answer.
        #[arg(short = 'K', long, default_value_t = 32)]
        chunks: usize,
        /// Bytes per chunk.
        #[arg(short = 'B', long, default_value_t = 16)]
        bytes: usize,
        /// The database file [default: a fresh temporary file].
        #[arg(long, value_name = "PATH")]
        db: Option<PathBuf>,
        /// Use synchronous=NORMAL (not power-loss safe) instead of FULL.
        #[arg(long)]
        relaxed: bool,
        /// Coalesce streamed chunks into deltas as the runtime does by
        /// default (40 ms / 16 KiB), instead of recording each chunk as its
        /// own event. Every byte is still stored before it is delivered.
        #[arg(long)]
        coalesce: bool,
        /// `plain` (one model step) or `tool` (a `lookup` tool call first).
        #[arg(long, default_value = "plain", value_parser = ["plain", "tool"])]
        variant: String,
    },
    /// Durable events per second through the recorder (1, 8 and 64
    /// sessions, flooding and one event at a time), against a
    /// one-transaction-per-event baseline.
    Recorder,
}

pub(crate) async fn bench(command: BenchCommand) -> anyhow::Result<ExitCode> {
    match command {
        BenchCommand::Turns {
            sessions,
            turns,
            chunks,
            bytes,
            db,
            relaxed,
            coalesce,
            variant,
        } => {
            let params = TurnsParams {
                sessions,
                turns,
                chunks,
                chunk_bytes: bytes,
                db,
                synchronous: if relaxed {
                    Synchronous::Normal
                } else {
                    Synchronous::Full
                },
                streaming: if coalesce {
                    StreamingOptions::default()
                } else {
                    StreamingOptions::per_delta()
                },
                variant: if variant == "tool" {
                    Variant::Tool
                } else {
                    Variant::Plain
                },
            };
            let report = run_turns(&params).await?;
            print_line(
                "| S | T | K | B | turns/s | chunks/s | lat mean ms | lat p99 ms | ttft ms | events | commits | DB MB | RSS MiB |",
            )?;
            print_line("|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
            print_line(&format!(
                "| {} | {} | {} | {} | {:.1} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {:.2} | {:.1} |",
                report.sessions,
                report.turns,
                report.chunks,
                report.chunk_bytes,
                report.turns_per_s,
                report.chunks_per_s,
                report.turn_latency_mean_ms,
                report.turn_latency_p99_ms,
                report.ttft_mean_ms,
                report.events_recorded,
                report.commits,
                report.db_on_disk_bytes as f64 / 1e6,
                report.peak_rss_mib
            ))?;
            print_line(&serde_json::to_string(&report)?)?;
        }
        BenchCommand::Recorder => {
            let mut reports = Vec::new();
            for (name, params) in RecorderParams::standard() {
                reports.push((name, run_recorder(&params).await?));
            }
            let baseline = reports[0].1.events_per_s;
            print_line("| run | sessions | events | events/s | p50 µs | p99 µs | commits | × baseline |")?;
            print_line("|---|---|---|---|---|---|---|---|")?;
            for (name, report) in &reports {
                print_line(&format!(
                    "| {name} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.1} |",
                    report.sessions,
                    report.events,
                    report.events_per_s,
                    report.latency_p50_us,
                    report.latency_p99_us,
                    report.commits,
                    report.events_per_s / baseline
                ))?;
            }
            let reports: Vec<_> = reports.into_iter().map(|(_, report)| report).collect();
            print_line(&serde_json::to_string(&reports)?)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
