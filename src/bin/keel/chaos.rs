//! `keel chaos`: runs `keel serve` under load, breaks it at random moments
//! and checks what clients were told against the store (`keel::chaos`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, ValueEnum};
use keel::chaos::{ChaosParams, ChaosStore, run_chaos};

/// The store a chaos run breaks.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StoreKind {
    /// One node on a SQLite file.
    Sqlite,
    /// Several nodes on a PostgreSQL server the run starts (initdb/pg_ctl).
    Postgres,
}

/// Arguments of `keel chaos`.
#[derive(Args, Debug)]
pub(crate) struct ChaosArgs {
    /// The store to break.
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    /// Nodes, on PostgreSQL.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Sessions under load.
    #[arg(long, default_value_t = 6)]
    sessions: usize,
    /// Faults to inject.
    #[arg(long, default_value_t = 20)]
    faults: usize,
    /// Seeds the load and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where a failed run keeps its evidence.
    #[arg(long, value_name = "DIR", default_value = "chaos-evidence")]
    evidence: PathBuf,
    /// The nodes' lease time to live in milliseconds (PostgreSQL).
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    lease_ttl_ms: u64,
    /// A soak instead of faults: the load for this many seconds, sampling
    /// the server's memory, descriptors and live tasks every 5 s.
    #[arg(long, value_name = "SECONDS")]
    soak: Option<u64>,
    /// Where a soak writes its plot (an SVG) and its samples (CSV beside it).
    #[arg(long, value_name = "FILE", default_value = "soak.svg")]
    plot: PathBuf,
}

pub(crate) async fn chaos(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let params = ChaosParams {
        binary: std::env::current_exe().context("cannot find the keel binary")?,
        store: match args.store {
            StoreKind::Sqlite => ChaosStore::Sqlite,
            StoreKind::Postgres => ChaosStore::Postgres { nodes: args.nodes },
        },
        sessions: args.sessions.max(1),
        faults: args.faults,
        seed: args.seed,
        evidence: args.evidence,
        lease_ttl_ms: args.lease_ttl_ms,
        soak: args.soak.map(std::time::Duration::from_secs),
    };
    let report = run_chaos(&params).await?;
    if args.soak.is_some() {
        let title = format!(
            "keel serve under the chaos load for {:.0} min ({} sessions, no faults)",
            report.wall_s / 60.0,
            params.sessions
        );
        std::fs::write(&args.plot, keel::chaos::svg(&report.samples, &title))
            .with_context(|| format!("cannot write {}", args.plot.display()))?;
        let mut csv = String::from("t_s,rss_kib,fds,tasks\n");
        for sample in &report.samples {
            csv.push_str(&format!(
                "{:.1},{:.0},{:.0},{:.0}\n",
                sample.t_s, sample.rss_kib, sample.fds, sample.tasks
            ));
        }
        let samples = args.plot.with_extension("csv");
        std::fs::write(&samples, csv).with_context(|| format!("cannot write {}", samples.display()))?;
        eprintln!("soak plot in {}, samples in {}", args.plot.display(), samples.display());
    }
    for violation in report.violations.iter().take(20) {
        eprintln!("violation: {violation}");
    }
    if let Some(evidence) = &report.evidence {
        eprintln!("evidence kept in {}", evidence.display());
    }
    println!("{}", report.summary());
    Ok(if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
