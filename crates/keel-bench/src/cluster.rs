//! The server workload across several `keel serve` nodes on one PostgreSQL
//! database: turns per second per node and in total, and how much later an
//! event reaches a subscriber on another node than one on its owner.
//!
//! N `keel serve` processes (each on a loopback port) share one database,
//! as nodes on separate machines do: each has its own runtime, connections
//! and CPU time, read from `/proc` apart from the client's (this process). Each of S sessions is created on a node picked
//! by a seeded generator, which owns it; each of its T turns is `POST`ed to
//! a node picked the same way, so about (N−1)/N of them are relayed to the
//! owner (handed over directly, or through the database). Each session has
//! two subscribers to its `…/events/stream`: one on its owner and one on
//! another node, which hears of new events by PostgreSQL `NOTIFY`. With one
//! node both are on it, so that every run serves the same streams and the
//! CPU per turn compares like with like. Both are checked gap-free.
//!
//! Delivery is measured two ways for the events of the timed turns: the
//! difference between the two subscribers' receipt [`Instant`]s (same
//! process, so µs precision), and from the event's `recorded_at_ms` (the
//! store's clock when its commit began) to the wall clock at receipt, per
//! kind of subscriber (ms precision).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::http::{
    WireEvent, check, create_session, events_read, http_client, io_error, join_sessions, next_turn_event, read_stream,
    write_script,
};
use super::process::{ServeProcess, cpu_s_of_processes_named};
use super::stats::percentile;
use keel_protocol::{Error, Result};

/// Parameters of the cluster workload.
#[derive(Debug, Clone)]
pub struct ClusterParams {
    /// Nodes sharing the database (at least 1).
    pub nodes: usize,
    /// Concurrent sessions.
    pub sessions: usize,
    /// Turns per session, run one after the other.
    pub turns: usize,
    /// Text chunks per answer.
    pub chunks: usize,
    /// Bytes per chunk.
    pub chunk_bytes: usize,
    /// The `keel` binary each node runs (`keel serve`).
    pub server: PathBuf,
    /// The PostgreSQL database, by URL (it must exist; every run creates
    /// sessions of its own, so it can be reused).
    pub url: String,
    /// Seeds the choice of owners and of the nodes each turn is posted to.
    pub seed: u64,
}

/// What one cluster run measured. Latencies are in milliseconds; `None`
/// where there was nothing to measure (nothing relayed or no second
/// subscriber with one node).
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// Nodes.
    pub nodes: usize,
    /// Sessions.
    pub sessions: usize,
    /// Timed turns per session.
    pub turns: usize,
    /// Sessions each node owned.
    pub sessions_per_node: Vec<usize>,
    /// Wall time of the timed part.
    pub wall_s: f64,
    /// Completed turns per second, all nodes together.
    pub turns_per_s: f64,
    /// Completed turns per second of the sessions each node owned.
    pub turns_per_s_per_node: Vec<f64>,
    /// Timed `POST`s sent to the session's owner.
    pub posts_same: usize,
    /// Timed `POST`s sent to another node, which relayed them.
    pub posts_relayed: usize,
    /// Median time from sending a `POST` to its owner to the `202`.
    pub accept_same_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub accept_same_p99_ms: Option<f64>,
    /// Median time from sending a `POST` to another node to the `202`
    /// (once the submission is stored for the owner).
    pub accept_relayed_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub accept_relayed_p99_ms: Option<f64>,
    /// Median time from sending a `POST` to `turn_complete` on the
    /// owner's stream.
    pub turn_p50_ms: f64,
    /// Median time from an event's commit (`recorded_at_ms`) to its
    /// receipt on the owner's stream.
    pub delivery_same_p50_ms: f64,
    /// 99th percentile of the same.
    pub delivery_same_p99_ms: f64,
    /// Median time from an event's commit to its receipt on the other
    /// node's stream.
    pub delivery_cross_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub delivery_cross_p99_ms: Option<f64>,
    /// Median of (receipt on the other node's stream − receipt on the
    /// owner's), per event both received, in µs-precise ms.
    pub cross_minus_same_p50_ms: Option<f64>,
    /// 99th percentile of the same.
    pub cross_minus_same_p99_ms: Option<f64>,
    /// Timed events compared between the two streams.
    pub events_compared: usize,
    /// Events every stream received (each checked gap-free), all sessions
    /// together.
    pub events_per_stream: u64,
    /// Streams on the owner node, checked gap-free.
    pub streams_same: usize,
    /// Streams on another node, checked gap-free.
    pub streams_cross: usize,
    /// CPU time of the nodes' processes per timed turn, in ms.
    pub keel_cpu_ms_per_turn: f64,
    /// CPU time of this machine's PostgreSQL processes per timed turn, in
    /// ms; `None` when PostgreSQL runs elsewhere.
    pub postgres_cpu_ms_per_turn: Option<f64>,
    /// Transactions in the database per timed turn (`pg_stat_database`),
    /// the nodes' background work during the run included.
    pub transactions_per_turn: f64,
    /// The statements the timed turns ran most, with `pg_stat_statements`
    /// loaded; empty otherwise.
    pub statements: Vec<StatementCount>,
}

/// Runs the workload once: starts the nodes, drives the sessions, stops
/// the nodes.
pub async fn run_cluster(params: &ClusterParams) -> Result<ClusterReport> {
    if params.nodes == 0 || params.sessions == 0 {
        return Err(Error::Config(
            "a cluster run needs at least one node and one session".to_owned(),
        ));
    }
    let scratch = tempfile::tempdir().map_err(|error| Error::Config(format!("cannot create a temp dir: {error}")))?;
    let script = scratch.path().join("answers.jsonl");
    // One answer per model call; the warm-up turn uses the first.
    write_script(&script, params.turns + 1, params.chunks, params.chunk_bytes)?;
    let mut nodes = Vec::with_capacity(params.nodes);
    let mut started = Ok(());
    for index in 0..params.nodes {
        // One at a time: each store checks the schema as it connects.
        match Node::start(index, params, &script, scratch.path()).await {
            Ok(node) => nodes.push(node),
            Err(error) => {
                started = Err(error);
                break;
            }
        }
    }
    let result = match started {
        Ok(()) => drive(params, &nodes).await,
        Err(error) => Err(error),
    };
    let mut stopped = Ok(());
    for node in nodes {
        let outcome = node.stop().await;
        stopped = stopped.and(outcome);
    }
    let report = result?;
    stopped?;
    Ok(report)
}

/// One node: a `keel serve` process on the database.
struct Node {
    process: ServeProcess,
}

impl Node {
    /// Starts node `index` on the database at `url`, in a scratch
    /// directory of its own under `scratch`.
    async fn start(index: usize, params: &ClusterParams, script: &Path, scratch: &Path) -> Result<Self> {
        let dir = scratch.join(format!("node-{index}"));
        let workspaces = dir.join("workspaces");
        std::fs::create_dir_all(&workspaces).map_err(io_error)?;
        // Sealed, as a cluster serving a token is: the same key on every node.
        let key = scratch.join("cluster.key");
        if !key.exists() {
            std::fs::write(&key, "keel bench cluster key, 32 bytes or more").map_err(io_error)?;
        }
        let headroom = 2 * params.sessions + 64;
        let mut args: Vec<OsString> = vec!["--db".into(), params.url.clone().into()];
        args.extend(["--node-id".into(), format!("bench-node-{index}").into()]);
        args.extend(["--cluster-key-file".into(), key.into_os_string()]);
        args.extend(["--model".into(), format!("script:{}", script.display()).into()]);
        args.extend(["--workspace-root".into(), workspaces.into_os_string()]);
        args.extend(["--max-live-sessions".into(), headroom.to_string().into()]);
        args.extend(["--max-connections".into(), (4 * headroom).to_string().into()]);
        args.extend(["--idle-unload-secs".into(), "86400".into()]);
        let process = ServeProcess::start(&params.server, &dir, &args).await?;
        Ok(Self { process })
    }

    /// Stops the server.
    async fn stop(self) -> Result<()> {
        self.process.stop().await
    }
}

/// What the database did, read from PostgreSQL's own counters.
struct DatabaseCounters {
    client: tokio_postgres::Client,
    /// Whether `pg_stat_statements` is loaded and could be reset.
    statements: bool,
}

/// Statements listed per run, the most called first.
const STATEMENTS_LISTED: i64 = 12;

impl DatabaseCounters {
    /// Connects to the database at `url`; resets `pg_stat_statements` where
    /// the server loads it (`shared_preload_libraries`).
    async fn connect(url: &str) -> Result<Self> {
        let client = keel_store::postgres::connect_bare(url).await?;
        let statements = client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements; SELECT pg_stat_statements_reset()")
            .await
            .is_ok();
        Ok(Self { client, statements })
    }

    /// Transactions committed or rolled back in this database so far, as
    /// far as the backends have reported them.
    async fn transactions(&self) -> Result<i64> {
        let row = self
            .client
            .query_one(
                "SELECT (xact_commit + xact_rollback)::int8 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await
            .map_err(|error| Error::Config(format!("cannot read pg_stat_database: {error}")))?;
        Ok(row.get(0))
    }

    /// Forgets the statements counted so far.
    async fn reset_statements(&self) -> Result<()> {
        if self.statements {
            self.client
                .batch_execute("SELECT pg_stat_statements_reset()")
                .await
                .map_err(|error| Error::Config(format!("cannot reset pg_stat_statements: {error}")))?;
        }
        Ok(())
    }

    /// The statements run in this database since the last reset, the most
    /// called first, with their calls per turn.
    async fn statements(&self, turns: usize) -> Result<Vec<StatementCount>> {
        if !self.statements {
            return Ok(Vec::new());
        }
        let rows = self
            .client
            .query(
                "SELECT calls, query FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND query NOT LIKE '%pg_stat_%'
                 ORDER BY calls DESC LIMIT $1",
                &[&STATEMENTS_LISTED],
            )
            .await
            .map_err(|error| Error::Config(format!("cannot read pg_stat_statements: {error}")))?;
        Ok(rows
            .iter()
            .map(|row| {
                let calls: i64 = row.get(0);
                let query: String = row.get(1);
                StatementCount {
                    calls_per_turn: calls as f64 / turns.max(1) as f64,
                    statement: query.split_whitespace().collect::<Vec<_>>().join(" "),
                }
            })
            .collect())
    }
}

/// How long the backends get to report their counters before they are
/// read (PostgreSQL flushes a busy backend's at most once a second).
const COUNTERS_SETTLE: Duration = Duration::from_millis(1500);

/// A statement and how often the timed turns ran it.
#[derive(Debug, Clone, Serialize)]
pub struct StatementCount {
    /// Calls per timed turn.
    pub calls_per_turn: f64,
    /// The statement, normalized by `pg_stat_statements`, on one line.
    pub statement: String,
}

/// CPU seconds of the nodes and of the local PostgreSQL processes.
#[derive(Clone, Copy)]
struct CpuReading {
    nodes: f64,
    postgres: Option<f64>,
}

impl CpuReading {
    fn take(nodes: &[Node]) -> Result<Self> {
        let mut total = 0.0;
        for node in nodes {
            total += node.process.cpu_s()?;
        }
        Ok(Self {
            nodes: total,
            postgres: cpu_s_of_processes_named("postgres"),
        })
    }
}

/// Creates the sessions, warms them up, runs the timed turns and shuts the
/// sessions down; measures.
async fn drive(params: &ClusterParams, nodes: &[Node]) -> Result<ClusterReport> {
    let bases: Vec<String> = nodes.iter().map(|node| node.process.base.clone()).collect();
    let counters = DatabaseCounters::connect(&params.url).await?;
    let client = http_client()?;
    let mut owners = StdRng::seed_from_u64(params.seed);
    let mut sessions = Vec::with_capacity(params.sessions);
    for index in 0..params.sessions {
        let owner = owners.random_range(0..bases.len());
        // With one node, the second subscriber is on the owner too.
        let other = match bases.len() {
            1 => owner,
            n => (owner + 1 + owners.random_range(0..n - 1)) % n,
        };
        let rng = StdRng::seed_from_u64(params.seed.wrapping_add(index as u64 + 1));
        sessions.push(ClusterSession::open(&client, &bases, owner, other, rng).await?);
    }
    // Warm-up, outside the timing: one turn per session, all at once as
    // the timed turns run, so that the connections they need (the
    // client's, and a node's to another when it relays) are open already.
    futures::future::try_join_all(sessions.iter_mut().map(|session| {
        let (client, bases) = (&client, &bases);
        async move {
            session.turn(client, bases, "warm-up").await?;
            session.timed_after = session.last_sequence();
            Ok::<_, Error>(())
        }
    }))
    .await?;

    tokio::time::sleep(COUNTERS_SETTLE).await;
    let transactions_before = counters.transactions().await?;
    counters.reset_statements().await?;
    let cpu_before = CpuReading::take(nodes)?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, mut session) in sessions.into_iter().enumerate() {
        let (client, bases, turns) = (client.clone(), bases.clone(), params.turns);
        tasks.spawn(async move {
            let mut posts = Vec::with_capacity(turns);
            for turn in 0..turns {
                let text = format!("message {turn} of session {index}");
                posts.push(session.turn(&client, &bases, &text).await?);
            }
            session.timed_until = session.last_sequence();
            Ok::<_, Error>((session, posts))
        });
    }
    let (finished, posts) = join_sessions(tasks).await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu_after = CpuReading::take(nodes)?;
    tokio::time::sleep(COUNTERS_SETTLE).await;
    let transactions = counters.transactions().await? - transactions_before;
    let statements = counters.statements(posts.len()).await?;
    let per_turn_ms = |seconds: f64| seconds * 1000.0 / posts.len().max(1) as f64;

    let mut sessions_per_node = vec![0; bases.len()];
    let mut same_delivery = Vec::new();
    let mut cross_delivery = Vec::new();
    let mut cross_minus_same = Vec::new();
    let (mut events_per_stream, mut streams_same, mut streams_cross) = (0, 0, 0);
    for session in finished {
        sessions_per_node[session.owner] += 1;
        let streams = session.finish(&client, &bases).await?;
        events_per_stream += streams.count;
        streams_same += 1;
        let same = streams.timed(&streams.same);
        same_delivery.extend(same.iter().filter_map(commit_to_receipt_ms));
        if let Some(cross) = &streams.cross
            && bases.len() > 1
        {
            streams_cross += 1;
            let cross = streams.timed(cross);
            cross_delivery.extend(cross.iter().filter_map(commit_to_receipt_ms));
            cross_minus_same.extend(
                same.iter()
                    .zip(cross)
                    .map(|(same, cross)| signed_ms(cross.received, same.received)),
            );
        }
    }

    let accept = |relayed: bool| {
        posts
            .iter()
            .filter(|post| post.relayed == relayed)
            .map(|post| post.accept_ms)
            .collect::<Vec<_>>()
    };
    let (accept_same, accept_relayed) = (accept(false), accept(true));
    let turns_per_s_per_node = sessions_per_node
        .iter()
        .map(|owned| (owned * params.turns) as f64 / wall)
        .collect();
    Ok(ClusterReport {
        nodes: bases.len(),
        sessions: params.sessions,
        turns: params.turns,
        sessions_per_node,
        wall_s: wall,
        turns_per_s: posts.len() as f64 / wall,
        turns_per_s_per_node,
        posts_same: accept_same.len(),
        posts_relayed: accept_relayed.len(),
        accept_same_p50_ms: quantile(&accept_same, 50.0),
        accept_same_p99_ms: quantile(&accept_same, 99.0),
        accept_relayed_p50_ms: quantile(&accept_relayed, 50.0),
        accept_relayed_p99_ms: quantile(&accept_relayed, 99.0),
        turn_p50_ms: percentile(&posts.iter().map(|post| post.turn_ms).collect::<Vec<_>>(), 50.0),
        delivery_same_p50_ms: percentile(&same_delivery, 50.0),
        delivery_same_p99_ms: percentile(&same_delivery, 99.0),
        delivery_cross_p50_ms: quantile(&cross_delivery, 50.0),
        delivery_cross_p99_ms: quantile(&cross_delivery, 99.0),
        cross_minus_same_p50_ms: quantile(&cross_minus_same, 50.0),
        cross_minus_same_p99_ms: quantile(&cross_minus_same, 99.0),
        events_compared: cross_minus_same.len(),
        keel_cpu_ms_per_turn: per_turn_ms(cpu_after.nodes - cpu_before.nodes),
        postgres_cpu_ms_per_turn: cpu_after
            .postgres
            .zip(cpu_before.postgres)
            .map(|(after, before)| per_turn_ms(after - before)),
        transactions_per_turn: transactions as f64 / posts.len().max(1) as f64,
        statements,
        events_per_stream,
        streams_same,
        streams_cross,
    })
}

/// The percentile `p` of `values`, or `None` when there are none.
fn quantile(values: &[f64], p: f64) -> Option<f64> {
    (!values.is_empty()).then(|| percentile(values, p))
}

/// From an event's commit to its receipt, on the wall clock (ms).
fn commit_to_receipt_ms(event: &WireEvent) -> Option<f64> {
    let recorded = event.recorded_at_ms?;
    Some(event.received_unix_ms as f64 - recorded as f64)
}

/// `later − earlier` in ms, rounded to the µs, negative if `later` came
/// first.
fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(after) => after.as_micros() as f64 / 1000.0,
        None => -(earlier.duration_since(later).as_micros() as f64 / 1000.0),
    }
}

/// One timed `POST` and its turn.
struct Post {
    /// Whether it went to a node other than the owner.
    relayed: bool,
    accept_ms: f64,
    turn_ms: f64,
}

/// What a session's streams received, once it was shut down.
struct Streams {
    /// Events per stream (all streams agree).
    count: u64,
    /// The timed events are those after this sequence …
    timed_after: usize,
    /// … up to this one.
    timed_until: usize,
    /// The owner's stream, every event in order.
    same: Vec<WireEvent>,
    /// The second subscriber's stream (on another node, with more than one).
    cross: Option<Vec<WireEvent>>,
}

impl Streams {
    /// The events of the timed turns among `events`, a whole stream.
    fn timed<'a>(&self, events: &'a [WireEvent]) -> &'a [WireEvent] {
        // Gap-free from 1, so event `n` is at index `n - 1`.
        events.get(self.timed_after..self.timed_until).unwrap_or_default()
    }
}

/// The second subscriber (on another node than the owner, with more than
/// one): its reader and what it forwarded.
struct CrossSubscriber {
    reader: JoinHandle<Result<u64>>,
    events: mpsc::UnboundedReceiver<WireEvent>,
}

/// One session under load.
struct ClusterSession {
    id: String,
    /// The node that created and runs it.
    owner: usize,
    /// Picks the node each turn is posted to.
    rng: StdRng,
    /// The owner's stream, as it is read.
    events: mpsc::UnboundedReceiver<WireEvent>,
    /// What the turns took from `events`, in order.
    seen: Vec<WireEvent>,
    /// The owner's stream's reader, ending with its count.
    reader: JoinHandle<Result<u64>>,
    cross: Option<CrossSubscriber>,
    timed_after: usize,
    timed_until: usize,
}

impl ClusterSession {
    /// Creates a session on node `owner` and subscribes to it there and on
    /// node `other`.
    async fn open(client: &reqwest::Client, bases: &[String], owner: usize, other: usize, rng: StdRng) -> Result<Self> {
        let id = create_session(client, &bases[owner]).await?;
        let subscribe = |node: usize| {
            let url = format!("{}/v1/sessions/{id}/events/stream?after=0", bases[node]);
            async move {
                let response = check(client.get(url).send().await).await?;
                let (sender, events) = mpsc::unbounded_channel();
                Ok::<_, Error>((tokio::spawn(read_stream(response, Some(sender))), events))
            }
        };
        let (reader, events) = subscribe(owner).await?;
        let (reader_two, events_two) = subscribe(other).await?;
        let cross = Some(CrossSubscriber {
            reader: reader_two,
            events: events_two,
        });
        Ok(Self {
            id,
            owner,
            rng,
            events,
            seen: Vec::new(),
            reader,
            cross,
            timed_after: 0,
            timed_until: 0,
        })
    }

    /// The last sequence the owner's stream delivered to the turns.
    fn last_sequence(&self) -> usize {
        self.seen.last().map_or(0, |event| event.sequence as usize)
    }

    /// Posts `text` to a random node and waits for its turn to complete on
    /// the owner's stream.
    async fn turn(&mut self, client: &reqwest::Client, bases: &[String], text: &str) -> Result<Post> {
        let node = self.rng.random_range(0..bases.len());
        let url = format!("{}/v1/sessions/{}/submissions", bases[node], self.id);
        let body = json!({"op": {"type": "user_input", "text": text}});
        let started = Instant::now();
        check(client.post(url).json(&body).send().await).await?;
        let accept_ms = started.elapsed().as_secs_f64() * 1000.0;
        loop {
            let event = next_turn_event(&mut self.events).await?;
            let kind = event.kind.clone();
            let sequence = event.sequence;
            self.seen.push(event);
            match kind.as_str() {
                "turn_complete" => break,
                "turn_aborted" => return Err(Error::Model(format!("bench turn aborted at {sequence}"))),
                _ => {}
            }
        }
        Ok(Post {
            relayed: node != self.owner,
            accept_ms,
            turn_ms: started.elapsed().as_secs_f64() * 1000.0,
        })
    }

    /// Shuts the session down (on its owner), waits for both streams to
    /// end with it, and checks that they got the same events.
    async fn finish(mut self, client: &reqwest::Client, bases: &[String]) -> Result<Streams> {
        let url = format!("{}/v1/sessions/{}/submissions", bases[self.owner], self.id);
        check(client.post(url).json(&json!({"op": {"type": "shutdown"}})).send().await).await?;
        let count = events_read(self.reader).await?;
        while let Ok(event) = self.events.try_recv() {
            self.seen.push(event);
        }
        let cross = match self.cross {
            Some(mut cross) => {
                let cross_count = events_read(cross.reader).await?;
                if cross_count != count {
                    return Err(Error::Model(format!(
                        "session '{}': {count} events on its owner's stream, {cross_count} on another node's",
                        self.id
                    )));
                }
                let mut events = Vec::new();
                while let Ok(event) = cross.events.try_recv() {
                    events.push(event);
                }
                Some(events)
            }
            None => None,
        };
        let complete = |events: &[WireEvent]| {
            events.len() as u64 == count
                && events
                    .iter()
                    .enumerate()
                    .all(|(index, event)| event.sequence == index as u64 + 1)
        };
        if !complete(&self.seen) || cross.as_deref().is_some_and(|cross| !complete(cross)) {
            return Err(Error::Model(format!(
                "session '{}': a stream's forwarded events do not run 1..={count}",
                self.id
            )));
        }
        Ok(Streams {
            count,
            timed_after: self.timed_after,
            timed_until: self.timed_until,
            same: self.seen,
            cross,
        })
    }
}
