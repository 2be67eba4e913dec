//! A serving node's life once it is assembled: where it tells the other
//! nodes to reach it, the listeners it answers on (the API's and, when
//! given one, the cluster's own), the host's background work, and the
//! graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use keel_store::NoticeListener;

use crate::ClusterConfig;
use crate::conn;
use crate::host::Host;

/// Records where the other nodes hand this node the submissions for its
/// sessions (`host/forward.rs`): `--advertise-url`, else the address the
/// cluster's route listens on (the cluster's own listener, else the API's)
/// unless it is unspecified; else nothing (an empty URL, so a node id used
/// before with a URL is not sent to where it was).
pub(crate) async fn advertise(cluster: &ClusterConfig, address: SocketAddr) {
    let url = match &cluster.advertise_url {
        Some(url) => url.clone(),
        None if address.ip().is_unspecified() => {
            tracing::info!(
                "submissions for this node's sessions come through the database: it listens on {address}, \
                 so give --advertise-url for the other nodes to reach it directly"
            );
            String::new()
        }
        None => format!("http://{address}"),
    };
    if let Err(error) = cluster.store.advertise(&cluster.node_id, &url).await {
        tracing::warn!(%error, "cannot record where this node takes submissions; they come through the database");
    }
}

/// Where a node answers: the API's listener and its application, and the
/// cluster's own listener with the one route the nodes call each other on,
/// when the operator keeps that off the API's address.
pub(crate) struct Doors {
    pub(crate) listener: TcpListener,
    pub(crate) app: axum::Router,
    pub(crate) cluster: Option<(TcpListener, axum::Router)>,
    pub(crate) limits: conn::ConnectionLimits,
}

/// Runs the host's background work (unloading idle sessions, retention,
/// recovery and, with several nodes, renewals, take-overs, retries and the
/// database's notices) while the `doors` answer; once `shutdown` resolves
/// and the connections have drained, stops it all and shuts the live
/// sessions down.
pub(crate) async fn run(
    host: Arc<Host>,
    doors: Doors,
    retention: Option<(Duration, Duration)>,
    notices: Option<NoticeListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // The stored budgets are read before the first request is answered, so
    // that a request right after a restart never finds a budget missing.
    if let Err(error) = host.factory.budgets.reload().await {
        tracing::warn!(%error, "cannot read the stored budgets");
    }
    let reaper = spawn_on(&host, |host| async move { host.reap().await });
    let retainer =
        retention.map(|(max_idle, every)| spawn_on(&host, |host| async move { host.retain(max_idle, every).await }));
    let recovery = spawn_on(&host, |host| async move { host.recover().await });
    let budgets = spawn_on(&host, |host| async move { host.follow_budgets().await });
    let client_deadlines = spawn_on(&host, |host| async move { host.follow_client_deadlines().await });
    // Several nodes: renewals, take-overs and the database's notices.
    let renewals = spawn_on(&host, |host| async move { host.keep_leases().await });
    let takeovers = spawn_on(&host, |host| async move { host.take_over().await });
    let retries = spawn_on(&host, |host| async move { host.retry_relayed().await });
    let follower = notices.map(|notices| spawn_on(&host, |host| async move { host.follow(notices).await }));
    // The cluster's door closes with the API's: a hand-over arriving later
    // would be refused anyway, and its sender relays through the database.
    let cluster_door = doors.cluster.map(|(listener, app)| {
        let mut closing = host.closing_signal();
        let stopping = async move {
            let _ = closing.wait_for(|closing| *closing).await;
        };
        tokio::spawn(conn::serve_connections(listener, app, doors.limits, stopping))
    });
    let stopping = {
        let host = Arc::clone(&host);
        async move {
            shutdown.await;
            tracing::info!("shutting down");
            // Streams end now, so the connections can drain.
            host.begin_shutdown();
        }
    };
    conn::serve_connections(doors.listener, doors.app, doors.limits, stopping).await;
    host.begin_shutdown();
    if let Some(door) = cluster_door {
        let _ = door.await;
    }
    recovery.abort();
    budgets.abort();
    client_deadlines.abort();
    let _ = reaper.await;
    if let Some(retainer) = retainer {
        let _ = retainer.await;
    }
    takeovers.abort();
    retries.abort();
    if let Some(follower) = follower {
        follower.abort();
    }
    host.close_all().await;
    // Leases were kept while turns finished; the sessions are released now.
    renewals.abort();
}

/// Spawns a task of the host's with a reference of its own.
fn spawn_on<F>(host: &Arc<Host>, job: impl FnOnce(Arc<Host>) -> F) -> tokio::task::JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(job(Arc::clone(host)))
}
