//! A short chaos run on each store, as CI runs it: real `keel serve`
//! processes under load, killed, terminated and paused at random (and on
//! PostgreSQL, the database restarted and Keel's connections cut), then
//! every client's history checked against the store. `keel chaos` runs the
//! same harness for as long as asked.

use std::path::PathBuf;

use keel::chaos::{ChaosParams, ChaosStore, run_chaos};
use keel::store::postgres::local::LocalPostgres;

fn params(store: ChaosStore, sessions: usize, faults: usize, seed: u64) -> ChaosParams {
    ChaosParams {
        binary: PathBuf::from(env!("CARGO_BIN_EXE_keel")),
        store,
        sessions,
        faults,
        seed,
        evidence: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("chaos-evidence"),
        lease_ttl_ms: 2000,
        soak: None,
    }
}

async fn run(params: ChaosParams) {
    let report = run_chaos(&params).await.expect("the chaos run could be carried out");
    eprintln!("{}", report.summary());
    assert!(
        report.violations.is_empty(),
        "{} violations (evidence in {:?}):\n{}",
        report.violations.len(),
        report.evidence,
        report.violations.join("\n")
    );
    assert_eq!(report.faults.values().sum::<u64>(), params.faults as u64);
    assert!(
        report.acknowledged > 0 && report.turns > 0,
        "the load ran: {}",
        report.summary()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_on_sqlite_keeps_every_promise() {
    run(params(ChaosStore::Sqlite, 4, 12, 7)).await;
}

/// Forty faults, database restarts three in ten among them, on twelve
/// sessions: the length and mix with which outside testing found a commit
/// cut by a restart stored twice (a key queued twice, a call started twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_run_on_three_postgresql_nodes_with_database_restarts_keeps_every_promise() {
    if LocalPostgres::shared().is_none() {
        return;
    }
    run(params(ChaosStore::Postgres { nodes: 3 }, 12, 40, 7)).await;
}
