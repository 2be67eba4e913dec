//! The faults a chaos run injects: which one comes next, and how each is
//! applied and undone.

use std::time::Duration;

use rand::RngExt;
use rand::rngs::StdRng;

use super::ChaosStore;
use super::nodes::{Node, setup};
use keel_protocol::Result;
use keel_store::postgres::local::LocalPostgres;

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    Kill,
    Terminate,
    Pause,
    RestartPostgres,
    TerminateConnections,
}

impl Fault {
    pub(super) fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9",
            Fault::Terminate => "sigterm",
            Fault::Pause => "sigstop",
            Fault::RestartPostgres => "postgres restart",
            Fault::TerminateConnections => "pg_terminate_backend",
        }
    }
}

/// The next fault: any of those the store has, the likelier first.
pub(super) fn pick(rng: &mut StdRng, store: ChaosStore) -> Fault {
    match store {
        ChaosStore::Sqlite => {
            if rng.random_range(0..3) == 0 {
                Fault::Terminate
            } else {
                Fault::Kill
            }
        }
        // Database restarts among the node faults, as often as kills: a
        // commit cut by one is what a retry on another node meets.
        ChaosStore::Postgres { .. } => match rng.random_range(0..10) {
            0..=2 => Fault::Kill,
            3 => Fault::Terminate,
            4..=5 => Fault::Pause,
            6..=8 => Fault::RestartPostgres,
            _ => Fault::TerminateConnections,
        },
    }
}

/// Applies one fault and brings what it broke back.
pub(super) async fn inject(
    fault: Fault,
    rng: &mut StdRng,
    nodes: &mut [Node],
    postgres: Option<&LocalPostgres>,
    db: &str,
    client: &reqwest::Client,
    lease_ttl_ms: u64,
) -> Result<()> {
    let index = rng.random_range(0..nodes.len());
    let node = &mut nodes[index];
    match fault {
        Fault::Kill => {
            node.crash();
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..500))).await;
            node.restart(client).await
        }
        Fault::Terminate => {
            node.terminate().await;
            node.restart(client).await
        }
        Fault::Pause => {
            node.signal(nix::sys::signal::Signal::SIGSTOP);
            let past_lease = lease_ttl_ms + rng.random_range(0..lease_ttl_ms);
            tokio::time::sleep(Duration::from_millis(past_lease)).await;
            node.signal(nix::sys::signal::Signal::SIGCONT);
            Ok(())
        }
        Fault::RestartPostgres => {
            if let Some(postgres) = postgres {
                // pg_ctl waits; this worker waits with it, the others go on.
                tokio::task::block_in_place(|| postgres.try_stop()).map_err(setup)?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
                tokio::task::block_in_place(|| postgres.try_start()).map_err(setup)?;
            }
            Ok(())
        }
        Fault::TerminateConnections => terminate_connections(db).await,
    }
}

/// Ends every connection Keel has to the database.
async fn terminate_connections(url: &str) -> Result<()> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|error| setup(format!("cannot connect to terminate connections: {error}")))?;
    let driver = tokio::spawn(connection);
    let _ = client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND application_name LIKE 'keel%'",
            &[],
        )
        .await;
    drop(client);
    let _ = driver.await;
    Ok(())
}
