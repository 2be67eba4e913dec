//! `keel bench`: the benchmark workloads, printed as a table and a JSON line.

use std::process::ExitCode;

use clap::Subcommand;
use keel::agent::StreamingOptions;
use keel::bench::BenchDatabase;
use keel::bench::auth::BenchAuth;
use keel::bench::cluster::{ClusterParams, ClusterReport, run_cluster};
use keel::bench::frontends::BenchVia;
use keel::bench::length::run_lengths;
use keel::bench::memory::{self, MemoryParams, run_memory};
use keel::bench::recorder::{RecorderParams, run_recorder};
use keel::bench::serve::{ServeParams, ServeReport, run_serve};
use keel::bench::tail::{TailParams, run_tail};
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
        /// The database: a SQLite file, or a PostgreSQL URL
        /// (postgres://…) [default: a fresh temporary SQLite file].
        #[arg(long, value_name = "PATH|URL")]
        db: Option<String>,
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
    /// Whether a turn costs more as its session grows: one session of each
    /// length (the turns workload, one session at a time), with the cost of
    /// its last turns against the shortest session's.
    Length {
        /// The sessions' lengths, in turns (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "10,1000,30000")]
        lengths: Vec<usize>,
        /// Text chunks per answer.
        #[arg(short = 'K', long, default_value_t = 32)]
        chunks: usize,
        /// Bytes per chunk.
        #[arg(short = 'B', long, default_value_t = 16)]
        bytes: usize,
        /// The database: a SQLite file, or a PostgreSQL URL
        /// (postgres://…) [default: a fresh temporary SQLite file].
        #[arg(long, value_name = "PATH|URL")]
        db: Option<String>,
        /// `plain` (one model step) or `tool` (a `lookup` tool call first).
        #[arg(long, default_value = "plain", value_parser = ["plain", "tool"])]
        variant: String,
    },
    /// Memory per loaded idle session and per idle event stream: a `keel
    /// serve` process (this binary) on a fresh SQLite file, N sessions
    /// created with the built-in tools on and left idle, then one stream on
    /// each, then as many bare idle HTTP connections (what any connection
    /// costs), the server's resident set read after each step (after a
    /// warm-up that is not counted).
    Memory {
        /// Sessions counted, each with one stream.
        #[arg(short = 'N', long, default_value_t = 2000)]
        sessions: usize,
        /// Sessions and streams made first and not counted.
        #[arg(long, default_value_t = 100)]
        warm_up: usize,
        /// Runs, each on a fresh server; the table ends with the medians.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// The `keel` binary to run as the server (another build, to
        /// compare) [default: this one].
        #[arg(long, value_name = "PATH")]
        server: Option<std::path::PathBuf>,
    },
    /// Whether the tail of a long log costs what its newest page does: one
    /// session of N events stored one per row, then the newest page, the
    /// events after `LAST - 100` (`?after=`, an SSE resume) and after 0
    /// read many times each.
    Tail {
        /// Events in the session, one per row.
        #[arg(short = 'N', long, default_value_t = 1_000_000)]
        events: u64,
        /// Reads of each kind (the table shows medians).
        #[arg(long, default_value_t = 200)]
        reads: usize,
        /// The database: a SQLite file, or a PostgreSQL URL
        /// (postgres://…) [default: a fresh temporary SQLite file].
        #[arg(long, value_name = "PATH|URL")]
        db: Option<String>,
    },
    /// Durable events per second through the recorder (1, 8 and 64
    /// sessions, flooding and one event at a time), against a
    /// one-transaction-per-event baseline; on a temporary SQLite file, and
    /// also on PostgreSQL when `--db` names a PostgreSQL database.
    Recorder {
        /// A PostgreSQL database (postgres://…) to run on beside SQLite.
        #[arg(long, value_name = "URL")]
        db: Option<String>,
    },
    /// Durable turns over `keel serve`'s HTTP API and event streams: the
    /// same turns in-process (the baseline), over HTTP with one subscriber
    /// per session, and with W subscribers of which one is stalled. With
    /// `--nodes N` (N > 1), the turns across N nodes on one PostgreSQL
    /// database instead, against the same on 1 node.
    Serve {
        /// Concurrent sessions.
        #[arg(short = 'S', long, default_value_t = 8)]
        sessions: usize,
        /// Turns per session (enough, with `-B`, for a stalled subscriber
        /// to fall behind its socket buffers and the live buffer).
        #[arg(short = 'T', long, default_value_t = 200)]
        turns: usize,
        /// Text chunks per answer.
        #[arg(short = 'K', long, default_value_t = 32)]
        chunks: usize,
        /// Bytes per chunk.
        #[arg(short = 'B', long, default_value_t = 256)]
        bytes: usize,
        /// Subscribers per session in the fan-out run, one of them stalled.
        #[arg(short = 'W', long, default_value_t = 10)]
        subscribers: usize,
        /// Repetitions of each run; the table shows medians.
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        /// The database: a SQLite file, or a PostgreSQL URL
        /// (postgres://…) [default: a fresh temporary SQLite file each run].
        /// With `--nodes` above 1, a PostgreSQL URL is required.
        #[arg(long, value_name = "PATH|URL")]
        db: Option<String>,
        /// `keel serve` processes (nodes) sharing the PostgreSQL database:
        /// sessions owned by random nodes, each turn posted to a random
        /// node, one subscriber on the owner and one on another node (on
        /// the owner too with 1 node, so both runs serve the same streams;
        /// `-W` is not used). Runs 1 node and N nodes, interleaved, and reports
        /// CPU (the nodes', and a local PostgreSQL's) and transactions per
        /// turn.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
        nodes: u16,
        /// The `keel` binary the nodes run, with `--nodes` (another build,
        /// to compare) [default: this one].
        #[arg(long, value_name = "PATH")]
        server: Option<std::path::PathBuf>,
        /// Seeds the random choice of owners and of the nodes posted to
        /// (with `--nodes`).
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// What authentication costs instead: the one-subscriber HTTP run
        /// with each credential listed (comma-separated: `token` the
        /// operator's token, `key` an API key, `jwt` a JWT checked against a
        /// JWKS file), interleaved, with each one's turns/s against the
        /// token's.
        #[arg(long, value_delimiter = ',', value_name = "token,key,jwt")]
        auth: Vec<String>,
        /// What the front-end protocols cost instead: the one-subscriber
        /// HTTP run driven through each protocol listed (comma-separated:
        /// `native` Keel's submissions and event stream, `ai-sdk` the AI
        /// SDK's UI message stream, `ag-ui` AG-UI), interleaved, with each
        /// one's turns/s and first delta against the native API's.
        #[arg(long, value_delimiter = ',', value_name = "native,ai-sdk,ag-ui")]
        via: Vec<String>,
    },
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
                database: db.as_deref().map(BenchDatabase::parse).unwrap_or_default(),
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
        BenchCommand::Length {
            lengths,
            chunks,
            bytes,
            db,
            variant,
        } => {
            anyhow::ensure!(
                !lengths.is_empty() && lengths.iter().all(|&turns| turns > 0),
                "--lengths takes turn counts above 0"
            );
            let params = TurnsParams {
                sessions: 1,
                chunks,
                chunk_bytes: bytes,
                database: db.as_deref().map(BenchDatabase::parse).unwrap_or_default(),
                variant: if variant == "tool" {
                    Variant::Tool
                } else {
                    Variant::Plain
                },
                ..TurnsParams::default()
            };
            let reports = run_lengths(&params, &lengths).await?;
            print_line(
                "| turns | turns/s | CPU ms/turn | last turns | last p50 ms | last CPU ms/turn | p50 × shortest | CPU × shortest |",
            )?;
            print_line("|---|---|---|---|---|---|---|---|")?;
            let shortest = reports.iter().min_by_key(|report| report.turns).cloned();
            for report in &reports {
                let (p50, cpu) = shortest.as_ref().map_or((1.0, 1.0), |base| {
                    (
                        report.last_p50_ms / base.last_p50_ms.max(f64::MIN_POSITIVE),
                        report.last_cpu_ms_per_turn / base.last_cpu_ms_per_turn.max(f64::MIN_POSITIVE),
                    )
                });
                print_line(&format!(
                    "| {} | {:.1} | {:.3} | {} | {:.3} | {:.3} | {p50:.2} | {cpu:.2} |",
                    report.turns,
                    report.turns_per_s,
                    report.cpu_ms_per_turn,
                    report.window,
                    report.last_p50_ms,
                    report.last_cpu_ms_per_turn,
                ))?;
            }
            print_line(&serde_json::to_string(&reports)?)?;
        }
        BenchCommand::Memory {
            sessions,
            warm_up,
            repeat,
            server,
        } => {
            anyhow::ensure!(sessions > 0 && repeat > 0, "-N and --repeat take counts above 0");
            let params = MemoryParams {
                server: match server {
                    Some(server) => server,
                    None => std::env::current_exe()?,
                },
                sessions,
                warm_up,
            };
            print_line(
                "| run | sessions | server RSS after warm-up MiB | KiB per idle session | KiB per idle stream | KiB per idle connection |",
            )?;
            print_line("|---|---|---|---|---|---|")?;
            let mut reports = Vec::with_capacity(repeat);
            for run in 1..=repeat {
                let report = run_memory(&params).await?;
                print_line(&format!(
                    "| {run} | {} | {:.1} | {:.1} | {:.1} | {:.1} |",
                    report.sessions,
                    report.base_rss_kib as f64 / 1024.0,
                    report.per_session_kib,
                    report.per_stream_kib,
                    report.per_connection_kib
                ))?;
                reports.push(report);
            }
            let (per_session, per_stream, per_connection) = memory::medians(&reports);
            print_line(&format!(
                "| median | {sessions} | | {per_session:.1} | {per_stream:.1} | {per_connection:.1} |"
            ))?;
            print_line(&serde_json::to_string(&reports)?)?;
        }
        BenchCommand::Tail { events, reads, db } => {
            let params = TailParams {
                events,
                reads,
                database: db.as_deref().map(BenchDatabase::parse).unwrap_or_default(),
            };
            let report = run_tail(&params).await?;
            print_line(
                "| backend | events (rows) | written in s | newest page ms | after LAST-100 ms | after 0 ms | tail × newest |",
            )?;
            print_line("|---|---|---|---|---|---|---|")?;
            print_line(&format!(
                "| {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.2} |",
                report.backend,
                report.events,
                report.write_s,
                report.newest_page_ms,
                report.tail_after_ms,
                report.head_after_ms,
                report.tail_vs_newest
            ))?;
            print_line(&serde_json::to_string(&report)?)?;
        }
        BenchCommand::Recorder { db } => {
            let mut databases = vec![BenchDatabase::Sqlite];
            match db.as_deref().map(BenchDatabase::parse) {
                Some(postgres @ BenchDatabase::Postgres(_)) => databases.push(postgres),
                Some(_) => anyhow::bail!("--db takes a PostgreSQL URL (postgres://…); SQLite runs on a temporary file"),
                None => {}
            }
            print_line("| backend | run | sessions | events | events/s | p50 µs | p99 µs | commits | × baseline |")?;
            print_line("|---|---|---|---|---|---|---|---|---|")?;
            let mut all = Vec::new();
            for database in databases {
                let mut reports = Vec::new();
                for (name, mut params) in RecorderParams::standard() {
                    params.database = database.clone();
                    reports.push((name, run_recorder(&params).await?));
                }
                // The first run is the one-transaction-per-event baseline.
                let baseline = reports[0].1.events_per_s;
                for (name, report) in &reports {
                    print_line(&format!(
                        "| {} | {name} | {} | {} | {:.0} | {:.0} | {:.0} | {} | {:.1} |",
                        database.backend(),
                        report.sessions,
                        report.events,
                        report.events_per_s,
                        report.latency_p50_us,
                        report.latency_p99_us,
                        report.commits,
                        report.events_per_s / baseline
                    ))?;
                }
                all.extend(reports.into_iter().map(|(_, report)| report));
            }
            print_line(&serde_json::to_string(&all)?)?;
        }
        BenchCommand::Serve {
            sessions,
            turns,
            chunks,
            bytes,
            subscribers,
            repeat,
            db,
            nodes,
            server,
            seed,
            auth,
            via,
        } => {
            let database = db.as_deref().map(BenchDatabase::parse).unwrap_or_default();
            let auth = auth
                .iter()
                .map(|name| BenchAuth::parse(name))
                .collect::<Result<Vec<_>, _>>()?;
            let via = via
                .iter()
                .map(|name| BenchVia::parse(name))
                .collect::<Result<Vec<_>, _>>()?;
            if nodes > 1 && !(auth.is_empty() && via.is_empty()) {
                anyhow::bail!("--auth and --via run on one node: omit --nodes");
            }
            if !auth.is_empty() && !via.is_empty() {
                anyhow::bail!("--auth and --via are separate comparisons: give one");
            }
            if server.is_some() && nodes == 1 {
                anyhow::bail!("--server names the binary the nodes run: give --nodes N");
            }
            if nodes > 1 {
                let BenchDatabase::Postgres(url) = database else {
                    anyhow::bail!(
                        "--nodes {nodes} needs --db with a PostgreSQL URL (postgres://…): the nodes share one PostgreSQL database"
                    );
                };
                let params = ClusterParams {
                    nodes: usize::from(nodes),
                    sessions,
                    turns,
                    chunks,
                    chunk_bytes: bytes,
                    server: match server {
                        Some(server) => server,
                        None => std::env::current_exe()?,
                    },
                    url,
                    seed,
                };
                bench_cluster(&params, repeat).await?;
            } else {
                let params = ServeParams {
                    sessions,
                    turns,
                    chunks,
                    chunk_bytes: bytes,
                    subscribers: 1,
                    stalled: false,
                    database,
                    auth: BenchAuth::None,
                    via: BenchVia::Native,
                    webhook: false,
                    traces: false,
                    budgets: false,
                };
                if !auth.is_empty() {
                    bench_auth(&params, &auth, repeat).await?;
                } else if !via.is_empty() {
                    bench_via(&params, &via, repeat).await?;
                } else {
                    bench_serve(&params, subscribers, repeat).await?;
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the baseline and the two server runs `repeat` times, interleaved so
/// that the machine's drift touches them alike, and prints their medians.
async fn bench_serve(params: &ServeParams, subscribers: usize, repeat: usize) -> anyhow::Result<()> {
    let &ServeParams {
        sessions,
        turns,
        chunks,
        chunk_bytes: bytes,
        ..
    } = params;
    let in_process = TurnsParams {
        sessions,
        turns,
        chunks,
        chunk_bytes: bytes,
        database: params.database.clone(),
        synchronous: Synchronous::Full,
        // What a server session does: deltas coalesced, every byte stored
        // before it is delivered.
        streaming: StreamingOptions::default(),
        variant: Variant::Plain,
    };
    let over_http = |subscribers: usize, stalled: bool| ServeParams {
        subscribers,
        stalled,
        ..params.clone()
    };
    let readers = subscribers.max(2) - 1;
    let runs = [
        ("HTTP + SSE", over_http(1, false)),
        ("HTTP + SSE, all reading", over_http(readers, false)),
        ("HTTP + SSE, one stalled", over_http(readers, true)),
        (
            "HTTP + SSE, a webhook per turn",
            ServeParams {
                webhook: true,
                ..over_http(1, false)
            },
        ),
        (
            "HTTP + SSE, traces exported",
            ServeParams {
                traces: true,
                ..over_http(1, false)
            },
        ),
        (
            "HTTP + SSE, a budget watching",
            ServeParams {
                budgets: true,
                ..over_http(1, false)
            },
        ),
    ];
    let mut baseline = Vec::new();
    let mut reports: Vec<Vec<ServeReport>> = vec![Vec::new(); runs.len()];
    for _ in 0..repeat.max(1) {
        baseline.push(run_turns(&in_process).await?.turns_per_s);
        for ((_, params), reports) in runs.iter().zip(&mut reports) {
            reports.push(run_serve(params).await?);
        }
    }
    let baseline_turns = keel::bench::median(&baseline);
    let median_of = |reports: &[ServeReport], pick: fn(&ServeReport) -> f64| {
        keel::bench::median(&reports.iter().map(pick).collect::<Vec<_>>())
    };
    print_line(&format!(
        "S={sessions} T={turns} K={chunks} B={bytes}, medians of {} runs",
        repeat.max(1)
    ))?;
    print_line(
        "| run | subscribers/session | turns/s | × in-process | 202 p50 ms | 202 p99 ms | first delta p50 ms | turn p50 ms | catch-ups |",
    )?;
    print_line("|---|---|---|---|---|---|---|---|---|")?;
    print_line(&format!(
        "| in-process (baseline) | - | {baseline_turns:.1} | 1.00 | - | - | - | - | - |"
    ))?;
    for ((name, _), reports) in runs.iter().zip(&reports) {
        let Some(first) = reports.first() else { continue };
        let turns_per_s = median_of(reports, |report| report.turns_per_s);
        print_line(&format!(
            "| {name} | {} | {turns_per_s:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} |",
            first.subscribers + usize::from(first.stalled),
            turns_per_s / baseline_turns,
            median_of(reports, |report| report.accept_p50_ms),
            median_of(reports, |report| report.accept_p99_ms),
            median_of(reports, |report| report.first_delta_p50_ms),
            median_of(reports, |report| report.turn_p50_ms),
            median_of(reports, |report| report.catch_ups as f64),
        ))?;
    }
    let turns_of = |index: usize| median_of(&reports[index], |report| report.turns_per_s);
    print_line(&format!(
        "one stalled / all reading (the stalled subscriber's cost to the agent): {:.2}",
        turns_of(2) / turns_of(1)
    ))?;
    let traced = &reports[4];
    print_line(&format!(
        "traces exported / none: {:.2}; {} spans exported per run",
        turns_of(4) / turns_of(0),
        traced.first().map_or(0, |report| report.spans_exported),
    ))?;
    print_line(&format!(
        "a budget watching / none (admission, turn slots, step gate): {:.2}",
        turns_of(5) / turns_of(0)
    ))?;
    let hooked = &reports[3];
    print_line(&format!(
        "a webhook per turn / none: {:.2}; {} deliveries per run, commit to arrival p50 {:.2} ms, p99 {:.2} ms",
        turns_of(3) / turns_of(0),
        hooked.first().map_or(0, |report| report.webhook_deliveries),
        median_of(hooked, |report| report.webhook_p50_ms.unwrap_or(f64::NAN)),
        median_of(hooked, |report| report.webhook_p99_ms.unwrap_or(f64::NAN)),
    ))?;
    print_line(&serde_json::to_string(&serde_json::json!({
        "baseline_turns_per_s": baseline,
        "runs": runs.iter().zip(&reports).map(|((name, _), reports)| serde_json::json!({"run": name, "reports": reports})).collect::<Vec<_>>(),
    }))?)?;
    Ok(())
}

/// Runs the one-subscriber server workload with each credential of `auths`
/// `repeat` times, interleaved, and prints their medians and each one's
/// turns/s against the token's.
async fn bench_auth(params: &ServeParams, auths: &[BenchAuth], repeat: usize) -> anyhow::Result<()> {
    let runs = auths
        .iter()
        .map(|&auth| (auth.name(), ServeParams { auth, ..params.clone() }))
        .collect::<Vec<_>>();
    bench_compare(params, "credential", &runs, "token", repeat).await
}

/// Runs the one-subscriber server workload driven through each protocol of
/// `vias` `repeat` times, interleaved, and prints their medians and each
/// one's turns/s and first delta against the native API's.
async fn bench_via(params: &ServeParams, vias: &[BenchVia], repeat: usize) -> anyhow::Result<()> {
    let runs = vias
        .iter()
        .map(|&via| (via.name(), ServeParams { via, ..params.clone() }))
        .collect::<Vec<_>>();
    bench_compare(params, "protocol", &runs, "native", repeat).await
}

/// Runs each of `runs` `repeat` times, interleaved so that the machine's
/// drift touches them alike, and prints their medians, each against the
/// run named `baseline` (if listed): its turns/s as a ratio, its first
/// delta as a difference.
async fn bench_compare(
    params: &ServeParams,
    what: &str,
    runs: &[(&'static str, ServeParams)],
    baseline: &str,
    repeat: usize,
) -> anyhow::Result<()> {
    let mut reports: Vec<Vec<ServeReport>> = vec![Vec::new(); runs.len()];
    for _ in 0..repeat.max(1) {
        for ((_, run), reports) in runs.iter().zip(&mut reports) {
            reports.push(run_serve(run).await?);
        }
    }
    let median_of = |reports: &[ServeReport], pick: fn(&ServeReport) -> f64| {
        keel::bench::median(&reports.iter().map(pick).collect::<Vec<_>>())
    };
    let base = runs.iter().position(|(name, _)| *name == baseline).map(|index| {
        (
            median_of(&reports[index], |report| report.turns_per_s),
            median_of(&reports[index], |report| report.first_delta_p50_ms),
        )
    });
    print_line(&format!(
        "S={} T={} K={} B={}, one stream per session, medians of {} runs",
        params.sessions,
        params.turns,
        params.chunks,
        params.chunk_bytes,
        repeat.max(1)
    ))?;
    print_line(&format!(
        "| {what} | turns/s | × {baseline} | 202 p50 ms | 202 p99 ms | first delta p50 ms | Δ first delta ms | turn p50 ms |"
    ))?;
    print_line("|---|---|---|---|---|---|---|---|")?;
    for ((name, _), reports) in runs.iter().zip(&reports) {
        let turns_per_s = median_of(reports, |report| report.turns_per_s);
        let first_delta = median_of(reports, |report| report.first_delta_p50_ms);
        let (ratio, delta) = base.map_or_else(
            || ("-".to_owned(), "-".to_owned()),
            |(turns, first)| {
                (
                    format!("{:.3}", turns_per_s / turns),
                    format!("{:+.2}", first_delta - first),
                )
            },
        );
        print_line(&format!(
            "| {name} | {turns_per_s:.1} | {ratio} | {:.2} | {:.2} | {first_delta:.2} | {delta} | {:.2} |",
            median_of(reports, |report| report.accept_p50_ms),
            median_of(reports, |report| report.accept_p99_ms),
            median_of(reports, |report| report.turn_p50_ms),
        ))?;
    }
    print_line(&serde_json::to_string(&serde_json::json!({
        "runs": runs.iter().zip(&reports).map(|((name, _), reports)| serde_json::json!({what: name, "reports": reports})).collect::<Vec<_>>(),
    }))?)?;
    Ok(())
}

/// Runs the cluster workload on 1 node and on `params.nodes` nodes,
/// interleaved `repeat` times, and prints their medians.
async fn bench_cluster(params: &ClusterParams, repeat: usize) -> anyhow::Result<()> {
    let runs = [
        ClusterParams {
            nodes: 1,
            ..params.clone()
        },
        params.clone(),
    ];
    let mut reports: Vec<Vec<ClusterReport>> = vec![Vec::new(); runs.len()];
    for _ in 0..repeat.max(1) {
        for (params, reports) in runs.iter().zip(&mut reports) {
            reports.push(run_cluster(params).await?);
        }
    }
    let median_of = |reports: &[ClusterReport], pick: &dyn Fn(&ClusterReport) -> Option<f64>| {
        let values: Vec<f64> = reports.iter().filter_map(pick).collect();
        (!values.is_empty()).then(|| keel::bench::median(&values))
    };
    let pair_to = |digits: usize,
                   reports: &[ClusterReport],
                   p50: fn(&ClusterReport) -> Option<f64>,
                   p99: fn(&ClusterReport) -> Option<f64>| {
        match (median_of(reports, &p50), median_of(reports, &p99)) {
            (Some(p50), Some(p99)) => format!("{p50:.digits$} / {p99:.digits$}"),
            _ => "-".to_owned(),
        }
    };
    let pair = |reports: &[ClusterReport], p50, p99| pair_to(2, reports, p50, p99);
    let single = median_of(&reports[0], &|report| Some(report.turns_per_s)).unwrap_or_default();
    print_line(&format!(
        "S={} T={} K={} B={} seed={}, on PostgreSQL, medians of {} runs; latencies in ms as p50 / p99",
        params.sessions,
        params.turns,
        params.chunks,
        params.chunk_bytes,
        params.seed,
        repeat.max(1)
    ))?;
    print_line(
        "| nodes | sessions per node | turns/s | turns/s per node | × 1 node | CPU ms/turn Keel + PostgreSQL | × 1 node | transactions/turn | 202 same-node | 202 relayed | delivery same-node | delivery cross-node | cross − same |",
    )?;
    print_line("|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    let cpu_of = |reports: &[ClusterReport]| {
        let keel = median_of(reports, &|report| Some(report.keel_cpu_ms_per_turn)).unwrap_or_default();
        let postgres = median_of(reports, &|report| report.postgres_cpu_ms_per_turn);
        (keel, postgres)
    };
    let (single_keel, single_postgres) = cpu_of(&reports[0]);
    let single_cpu = single_keel + single_postgres.unwrap_or_default();
    for reports in &reports {
        let Some(first) = reports.first() else { continue };
        let total = median_of(reports, &|report| Some(report.turns_per_s)).unwrap_or_default();
        let per_node: Vec<String> = (0..first.nodes)
            .map(|node| {
                let turns = median_of(reports, &|report| report.turns_per_s_per_node.get(node).copied());
                format!("{:.1}", turns.unwrap_or_default())
            })
            .collect();
        let owned: Vec<String> = first.sessions_per_node.iter().map(usize::to_string).collect();
        let (keel_cpu, postgres_cpu) = cpu_of(reports);
        let cpu = match postgres_cpu {
            Some(postgres) => format!("{keel_cpu:.3} + {postgres:.3}"),
            None => format!("{keel_cpu:.3} + ?"),
        };
        let transactions = median_of(reports, &|report| Some(report.transactions_per_turn)).unwrap_or_default();
        print_line(&format!(
            "| {} | {} | {total:.1} | {} | {:.2} | {cpu} | {:.2} | {transactions:.2} | {} | {} | {} | {} | {} |",
            first.nodes,
            owned.join(" / "),
            per_node.join(" / "),
            total / single,
            (keel_cpu + postgres_cpu.unwrap_or_default()) / single_cpu,
            pair(
                reports,
                |report| report.accept_same_p50_ms,
                |report| report.accept_same_p99_ms
            ),
            pair(
                reports,
                |report| report.accept_relayed_p50_ms,
                |report| report.accept_relayed_p99_ms
            ),
            pair(
                reports,
                |report| Some(report.delivery_same_p50_ms),
                |report| Some(report.delivery_same_p99_ms)
            ),
            pair(
                reports,
                |report| report.delivery_cross_p50_ms,
                |report| report.delivery_cross_p99_ms
            ),
            // Both receipts are `Instant`s in this process: µs precision.
            pair_to(
                3,
                reports,
                |report| report.cross_minus_same_p50_ms,
                |report| report.cross_minus_same_p99_ms
            ),
        ))?;
    }
    for reports in &reports {
        let Some(last) = reports.last() else { continue };
        if last.statements.is_empty() {
            continue;
        }
        print_line(&format!(
            "\n{} node(s), last run: the statements run most (pg_stat_statements), calls per turn",
            last.nodes
        ))?;
        for statement in &last.statements {
            let text: String = statement.statement.chars().take(160).collect();
            print_line(&format!("- {:.2} `{text}`", statement.calls_per_turn))?;
        }
    }
    print_line(&serde_json::to_string(&serde_json::json!({
        "runs": runs.iter().zip(&reports).map(|(params, reports)| serde_json::json!({"nodes": params.nodes, "reports": reports})).collect::<Vec<_>>(),
    }))?)?;
    Ok(())
}
