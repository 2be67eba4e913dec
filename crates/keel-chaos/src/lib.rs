//! The chaos harness behind `keel chaos`: real `keel serve` processes
//! under load, broken at random moments, and the history of what clients
//! sent, were told and received checked against the store at the end.
//!
//! - `nodes`: the server processes (start, crash, terminate, pause);
//! - `clients`: the load and its history (writers with idempotency keys
//!   retried on any node, followers over SSE or WebSocket resuming from the
//!   last sequence they saw, approvers deciding pending tool calls);
//! - `check`: the invariants.
//!
//! On SQLite one node is killed (SIGKILL) or terminated (SIGTERM) and
//! restarted. On PostgreSQL, several nodes share a database the harness
//! starts itself, and the faults also pause a node past its lease
//! (SIGSTOP, then SIGCONT), restart PostgreSQL and terminate Keel's
//! database connections (`pg_terminate_backend`). Seeds make the load and
//! the fault schedule repeatable, as far as timing allows.
//!
//! A soak (`soak`) runs the same load without faults for a long while,
//! sampling the server's memory, descriptors and live tasks.

mod check;
mod clients;
mod evidence;
mod faults;
mod integrity;
mod nodes;
mod soak;
mod stored;

pub use self::soak::{Sample, svg};

use std::collections::BTreeMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::clients::{History, SessionClients, SessionHistory};
use self::evidence::{keep_evidence, write_fixtures};
use self::faults::{inject, pick};
use self::integrity::{integrity, postgres_integrity};
use self::nodes::{Addresses, Node, NodeSpec, setup};
use self::stored::{open_store, stored_log};
use keel_protocol::RecordedEvent;
use keel_protocol::Result;
use keel_store::CheckpointStore;
use keel_store::postgres::local::LocalPostgres;

/// How long, after the last fault, every acknowledged submission gets to be
/// acted on before it counts as stranded.
const SETTLE_BOUND: Duration = Duration::from_secs(60);

/// One session in this many has its shell calls wait for approval.
const ASKING_EVERY: usize = 3;

/// Which store a run breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosStore {
    /// One node on a SQLite file.
    Sqlite,
    /// `nodes` nodes on a PostgreSQL database the harness starts.
    Postgres {
        /// How many nodes.
        nodes: usize,
    },
}

/// What a run does.
#[derive(Debug, Clone)]
pub struct ChaosParams {
    /// The `keel` binary to run as the servers.
    pub binary: PathBuf,
    /// The store.
    pub store: ChaosStore,
    /// Sessions under load at once.
    pub sessions: usize,
    /// Faults to inject.
    pub faults: usize,
    /// Seeds the load and the fault schedule.
    pub seed: u64,
    /// Where a failed run leaves its evidence (the database, the servers'
    /// logs, the client history); nothing is kept for a run that passed.
    pub evidence: PathBuf,
    /// The nodes' lease time to live, in milliseconds (PostgreSQL).
    pub lease_ttl_ms: u64,
    /// Instead of faults, run the load this long while sampling the first
    /// node (a soak); `faults` is then ignored.
    pub soak: Option<Duration>,
}

/// What a run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Submission attempts, and how many were answered `202`.
    pub attempts: u64,
    /// Attempts answered `202`.
    pub acknowledged: u64,
    /// Events the followers received.
    pub received: u64,
    /// Events stored, all sessions.
    pub stored: u64,
    /// Turns closed.
    pub turns: u64,
    /// Times a follower's stream broke and was resumed.
    pub resumes: u64,
    /// Streams followed over a WebSocket (the others over SSE).
    pub websockets: u64,
    /// Approval decisions stored (approvals and denials).
    pub approvals: u64,
    /// Shell calls' side effects seen.
    pub side_effects: u64,
    /// Every invariant broken (empty when the run passed).
    pub violations: Vec<String>,
    /// Where the evidence of a failed run is.
    pub evidence: Option<PathBuf>,
    /// Wall time of the run, in seconds.
    pub wall_s: f64,
    /// A soak's samples of the first node.
    pub samples: Vec<Sample>,
}

impl ChaosReport {
    /// The one line that sums a run up.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(kind, count)| format!("{kind} {count}"))
            .collect();
        format!(
            "chaos: {} faults ({}), {} submissions ({} acknowledged), {} events stored, {} streamed, {} turns, {} stream resumes ({} streams over WebSocket), {} approval decisions, {} side effects, {} violations, {:.0} s",
            self.faults.values().sum::<u64>(),
            faults.join(", "),
            self.attempts,
            self.acknowledged,
            self.stored,
            self.received,
            self.turns,
            self.resumes,
            self.websockets,
            self.approvals,
            self.side_effects,
            self.violations.len(),
            self.wall_s,
        )
    }
}

/// Runs the load, injects the faults, lets the system settle and checks
/// the invariants. A failed check is a violation in the report, not an
/// error; an error means the run could not be carried out.
pub async fn run_chaos(params: &ChaosParams) -> Result<ChaosReport> {
    let started = Instant::now();
    let scratch = tempfile::tempdir().map_err(|error| setup(format!("no temporary directory: {error}")))?;
    let dir = scratch.path().to_owned();
    write_fixtures(&dir)?;
    let postgres = match params.store {
        ChaosStore::Sqlite => None,
        ChaosStore::Postgres { .. } => {
            Some(LocalPostgres::launch_own().map_err(|why| setup(format!("cannot start PostgreSQL: {why}")))?)
        }
    };
    let (db, count) = match (&postgres, params.store) {
        (Some(postgres), ChaosStore::Postgres { nodes }) => (
            postgres
                .try_fresh_database()
                .map_err(|why| setup(format!("cannot create the database: {why}")))?,
            nodes.max(1),
        ),
        _ => (dir.join("keel.sqlite3").display().to_string(), 1),
    };
    let spec = NodeSpec {
        binary: params.binary.clone(),
        db: db.clone(),
        dir: dir.clone(),
        lease_ttl_ms: params.lease_ttl_ms,
    };
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .map_err(|error| setup(format!("no HTTP client: {error}")))?;
    let mut nodes = Vec::with_capacity(count);
    for index in 0..count {
        nodes.push(Node::start(index, spec.clone(), &client).await?);
    }
    let addresses: Addresses = Arc::new(RwLock::new(nodes.iter().map(Node::base).collect()));
    let model = format!("script:{}", dir.join("chaos.jsonl").display());
    let sessions = Sessions::create(&client, &nodes, &model, params.sessions).await?;
    let history: History = Arc::new(Mutex::new(BTreeMap::new()));
    let load = Load::start(params, &sessions, |session_id| SessionClients {
        http: client.clone(),
        addresses: Arc::clone(&addresses),
        session_id: session_id.to_owned(),
        history: Arc::clone(&history),
    });

    let mut report = ChaosReport::default();
    let mut rng = StdRng::seed_from_u64(params.seed);
    if let Some(duration) = params.soak {
        report.samples = soak_samples(&client, &nodes[0], duration).await;
    }
    let faults = if params.soak.is_some() { 0 } else { params.faults };
    for _ in 0..faults {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..900))).await;
        let fault = pick(&mut rng, params.store);
        inject(
            fault,
            &mut rng,
            &mut nodes,
            postgres.as_ref(),
            &db,
            &client,
            params.lease_ttl_ms,
        )
        .await?;
        *report.faults.entry(fault.name().to_owned()).or_default() += 1;
    }
    // The load stops (requests in flight are answered first); whatever was
    // acknowledged must now be acted on.
    Load::stop(&load.stop_writers, load.writers).await;
    let store = open_store(&db).await?;
    let logs = settle(store.as_ref(), &sessions.ids, &history).await?;
    Load::stop(&load.stop_followers, load.followers).await;
    for node in &mut nodes {
        node.terminate().await;
    }

    let all = std::mem::take(&mut *history.lock().unwrap_or_else(|poison| poison.into_inner()));
    for session_id in &sessions.ids {
        let log = logs.get(session_id).map(Vec::as_slice).unwrap_or_default();
        let asking = sessions.asking.contains(session_id);
        check_session(&mut report, &dir, session_id, log, all.get(session_id), asking);
    }
    store.close().await;
    if params.store == ChaosStore::Sqlite {
        integrity(&dir.join("keel.sqlite3"), &mut report.violations);
    } else {
        postgres_integrity(&db, &mut report.violations).await;
    }
    if params.soak.is_some() {
        soak::growth(&report.samples, &mut report.violations);
    }
    report.wall_s = started.elapsed().as_secs_f64();
    if !report.violations.is_empty() {
        let target = keep_evidence(params, &dir, &nodes, &all, &report)?;
        if let Some(postgres) = &postgres
            && let Err(why) = postgres.dump(&db, &target.join("keel.sql"))
        {
            tracing::warn!(%why, "the database could not be kept with the evidence");
        }
        report.evidence = Some(target);
    }
    Ok(report)
}

/// The sessions under load: every one, and those whose shell calls wait
/// for approval.
struct Sessions {
    ids: Vec<String>,
    asking: Vec<String>,
}

impl Sessions {
    /// Creates `count` sessions answering from `model`, spread over the
    /// nodes; one in [`ASKING_EVERY`] asks before running a shell call.
    async fn create(client: &reqwest::Client, nodes: &[Node], model: &str, count: usize) -> Result<Self> {
        let mut ids = Vec::with_capacity(count);
        let mut asking = Vec::new();
        for index in 0..count {
            let id = format!("chaos-{index}");
            let base = nodes[index % nodes.len()].base();
            let mut body = json!({"id": id, "model": model});
            if index % ASKING_EVERY == ASKING_EVERY - 1 {
                body["approvals"] = json!({"tools": {"shell": "ask"}});
                asking.push(id.clone());
            }
            let created = client
                .post(format!("{base}/v1/sessions"))
                .json(&body)
                .send()
                .await
                .map_err(|error| setup(format!("cannot create a session: {error}")))?;
            if !created.status().is_success() {
                return Err(setup(format!("creating a session answered {}", created.status())));
            }
            ids.push(id);
        }
        Ok(Self { ids, asking })
    }
}

/// The clients under way: the writers, and the followers and approvers,
/// each group stopped by its own signal.
struct Load {
    stop_writers: watch::Sender<bool>,
    writers: Vec<JoinHandle<()>>,
    stop_followers: watch::Sender<bool>,
    followers: Vec<JoinHandle<()>>,
}

impl Load {
    /// Starts an approver per asking session, and a writer and a follower
    /// per session, with the clients `clients_of` gives a session.
    fn start(params: &ChaosParams, sessions: &Sessions, clients_of: impl Fn(&str) -> SessionClients) -> Self {
        let (stop_writers, writers_stop) = watch::channel(false);
        let (stop_followers, followers_stop) = watch::channel(false);
        let (mut writers, mut followers) = (Vec::new(), Vec::new());
        // Approvers run as long as followers do: turns waiting for approval
        // must close for the run to settle.
        for (index, session_id) in sessions.asking.iter().enumerate() {
            followers.push(tokio::spawn(clients::approve(
                clients_of(session_id),
                params.seed.wrapping_mul(7919).wrapping_add(index as u64),
                followers_stop.clone(),
            )));
        }
        for (index, session_id) in sessions.ids.iter().enumerate() {
            let seed = params.seed.wrapping_mul(1000).wrapping_add(index as u64);
            writers.push(tokio::spawn(clients::write(
                clients_of(session_id),
                seed,
                writers_stop.clone(),
            )));
            followers.push(tokio::spawn(clients::follow(
                clients_of(session_id),
                seed ^ 0x5eed,
                followers_stop.clone(),
            )));
        }
        Self {
            stop_writers,
            writers,
            stop_followers,
            followers,
        }
    }

    /// Signals a group of clients to stop and waits for them.
    async fn stop(signal: &watch::Sender<bool>, tasks: Vec<JoinHandle<()>>) {
        let _ = signal.send(true);
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// A soak's samples of `node`, one every [`soak::SAMPLE_EVERY`] for
/// `duration`.
async fn soak_samples(client: &reqwest::Client, node: &Node, duration: Duration) -> Vec<Sample> {
    let mut samples = Vec::new();
    let since = Instant::now();
    let base = node.base();
    while since.elapsed() < duration {
        if let Some(pid) = node.pid()
            && let Some(sample) = soak::sample(client, pid, &base, since).await
        {
            samples.push(sample);
        }
        tokio::time::sleep(soak::SAMPLE_EVERY).await;
    }
    samples
}

/// Reads every session's stored log until all the acknowledged work is
/// done and streamed, or [`SETTLE_BOUND`] has passed; the logs as last read.
async fn settle(
    store: &dyn CheckpointStore,
    session_ids: &[String],
    history: &History,
) -> Result<BTreeMap<String, Vec<RecordedEvent>>> {
    let deadline = Instant::now() + SETTLE_BOUND;
    let mut logs = BTreeMap::new();
    loop {
        logs.clear();
        for session_id in session_ids {
            logs.insert(session_id.clone(), stored_log(store, session_id).await?);
        }
        let settled = {
            let all = history.lock().unwrap_or_else(|poison| poison.into_inner());
            session_ids.iter().all(|session_id| {
                let log = logs.get(session_id).map(Vec::as_slice).unwrap_or_default();
                let received = all
                    .get(session_id)
                    .and_then(|session| session.received.keys().next_back().copied())
                    .unwrap_or(0);
                let caught_up = received >= log.len() as u64;
                caught_up && all.get(session_id).is_none_or(|session| check::settled(session, log))
            })
        };
        if settled || Instant::now() > deadline {
            return Ok(logs);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Checks one session's invariants against its stored `log` and what its
/// clients saw, and adds its counts to the report.
fn check_session(
    report: &mut ChaosReport,
    dir: &Path,
    session_id: &str,
    log: &[RecordedEvent],
    session: Option<&SessionHistory>,
    asking: bool,
) {
    check::log(session_id, log, &mut report.violations);
    if let Some(session) = session {
        check::history(session_id, session, log, &mut report.violations);
        if !check::settled(session, log) {
            report.violations.push(format!(
                "{session_id}: acknowledged work not done {} s after the last fault",
                SETTLE_BOUND.as_secs()
            ));
        }
        report.attempts += session.attempts.len() as u64;
        report.acknowledged += session
            .attempts
            .iter()
            .filter(|attempt| matches!(attempt.outcome, clients::Outcome::Accepted { .. }))
            .count() as u64;
        report.received += session.received.len() as u64;
        report.resumes += session.resumes;
        report.websockets += session.websockets;
    }
    let mut effects: BTreeMap<String, usize> = BTreeMap::new();
    if let Ok(text) = std::fs::read_to_string(dir.join("workspaces").join(session_id).join("effects.txt")) {
        for call_id in text.lines() {
            *effects.entry(call_id.to_owned()).or_default() += 1;
        }
    }
    check::side_effects(session_id, &effects, log, asking, &mut report.violations);
    check::approvals(session_id, log, &mut report.violations);
    report.side_effects += effects.values().sum::<usize>() as u64;
    report.approvals += log
        .iter()
        .filter(|event| matches!(event.msg, keel_protocol::EventMsg::ApprovalDecided(_)))
        .count() as u64;
    report.stored += log.len() as u64;
    report.turns += log.iter().filter(|event| event.msg.ends_turn()).count() as u64;
}
