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
//!
//! Nothing but the `keel` command depends on this crate. It must not reach
//! into the server: it drives `keel serve` over HTTP as separate processes,
//! and reads the store only to check it at the end.

mod check;
mod clients;
mod nodes;
mod soak;

pub use self::soak::{Sample, svg};

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;

use self::clients::History;
use self::nodes::{Addresses, Node, NodeSpec, keep, setup};
use keel_protocol::RecordedEvent;
use keel_protocol::Result;
use keel_store::postgres::local::TestPostgres;
use keel_store::{CheckpointStore, MAX_EVENT_PAGE, StoreError};

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

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Kill,
    Terminate,
    Pause,
    RestartPostgres,
    TerminateConnections,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill -9",
            Fault::Terminate => "sigterm",
            Fault::Pause => "sigstop",
            Fault::RestartPostgres => "postgres restart",
            Fault::TerminateConnections => "pg_terminate_backend",
        }
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
            Some(TestPostgres::own().ok_or_else(|| setup("PostgreSQL's binaries were not found".to_owned()))?)
        }
    };
    let (db, count) = match (&postgres, params.store) {
        (Some(postgres), ChaosStore::Postgres { nodes }) => (postgres.fresh_database(), nodes.max(1)),
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
    let mut session_ids = Vec::with_capacity(params.sessions);
    let mut asking = Vec::new();
    for index in 0..params.sessions {
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
        session_ids.push(id);
    }

    let history: History = Arc::new(Mutex::new(BTreeMap::new()));
    let (stop_writers, writers_stop) = watch::channel(false);
    let (stop_followers, followers_stop) = watch::channel(false);
    let (mut writers, mut followers) = (Vec::new(), Vec::new());
    let session_clients = |session_id: &str| clients::SessionClients {
        http: client.clone(),
        addresses: Arc::clone(&addresses),
        session_id: session_id.to_owned(),
        history: Arc::clone(&history),
    };
    // Approvers run as long as followers do: turns waiting for approval
    // must close for the run to settle.
    for (index, session_id) in asking.iter().enumerate() {
        followers.push(tokio::spawn(clients::approve(
            session_clients(session_id),
            params.seed.wrapping_mul(7919).wrapping_add(index as u64),
            followers_stop.clone(),
        )));
    }
    for (index, session_id) in session_ids.iter().enumerate() {
        let seed = params.seed.wrapping_mul(1000).wrapping_add(index as u64);
        writers.push(tokio::spawn(clients::write(
            session_clients(session_id),
            seed,
            writers_stop.clone(),
        )));
        followers.push(tokio::spawn(clients::follow(
            session_clients(session_id),
            seed ^ 0x5eed,
            followers_stop.clone(),
        )));
    }

    let mut report = ChaosReport::default();
    let mut rng = StdRng::seed_from_u64(params.seed);
    if let Some(duration) = params.soak {
        let since = Instant::now();
        let base = nodes[0].base();
        while since.elapsed() < duration {
            if let Some(pid) = nodes[0].pid()
                && let Some(sample) = soak::sample(&client, pid, &base, since).await
            {
                report.samples.push(sample);
            }
            tokio::time::sleep(soak::SAMPLE_EVERY).await;
        }
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
    let _ = stop_writers.send(true);
    for writer in writers {
        let _ = writer.await;
    }
    let store = open_store(&db).await?;
    let deadline = Instant::now() + SETTLE_BOUND;
    let mut logs = BTreeMap::new();
    loop {
        logs.clear();
        for session_id in &session_ids {
            logs.insert(session_id.clone(), stored_log(store.as_ref(), session_id).await?);
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
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = stop_followers.send(true);
    for follower in followers {
        let _ = follower.await;
    }
    for node in &mut nodes {
        node.terminate().await;
    }

    let all = std::mem::take(&mut *history.lock().unwrap_or_else(|poison| poison.into_inner()));
    for session_id in &session_ids {
        let log = logs.get(session_id).map(Vec::as_slice).unwrap_or_default();
        let session = all.get(session_id);
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
        check::side_effects(
            session_id,
            &effects,
            log,
            asking.contains(session_id),
            &mut report.violations,
        );
        check::approvals(session_id, log, &mut report.violations);
        report.side_effects += effects.values().sum::<usize>() as u64;
        report.approvals += log
            .iter()
            .filter(|event| matches!(event.msg, keel_protocol::EventMsg::ApprovalDecided(_)))
            .count() as u64;
        report.stored += log.len() as u64;
        report.turns += log.iter().filter(|event| event.msg.ends_turn()).count() as u64;
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

/// The script every session answers from, and the operator's keel.toml.
fn write_fixtures(dir: &Path) -> Result<()> {
    let mut script = String::new();
    for index in 0..4000 {
        let line = match index % 4 {
            0 => {
                json!({"chunks": ["Once ", "upon ", "a ", "time, ", "far ", "away, ", "there ", "was."], "delay_ms": 40})
            }
            // The side effect names its call, so a call run twice shows.
            1 => json!({"tool_calls": [{
                "id": format!("call-{index}"),
                "name": "shell",
                "arguments": {"command": format!("echo call-{index} >> effects.txt")},
            }]}),
            2 => json!({"text": "The tool ran."}),
            _ => json!({"text": "Short."}),
        };
        script.push_str(&line.to_string());
        script.push('\n');
    }
    let write = |name: &str, text: &str| {
        std::fs::write(dir.join(name), text).map_err(|error| setup(format!("cannot write {name}: {error}")))
    };
    write("chaos.jsonl", &script)?;
    write("keel.toml", "[approvals]\ntools = { shell = \"auto\" }\n")
}

fn pick(rng: &mut StdRng, store: ChaosStore) -> Fault {
    match store {
        ChaosStore::Sqlite => {
            if rng.random_range(0..3) == 0 {
                Fault::Terminate
            } else {
                Fault::Kill
            }
        }
        ChaosStore::Postgres { .. } => match rng.random_range(0..10) {
            0..=3 => Fault::Kill,
            4 => Fault::Terminate,
            5..=6 => Fault::Pause,
            7 => Fault::RestartPostgres,
            _ => Fault::TerminateConnections,
        },
    }
}

/// Applies one fault and brings what it broke back.
async fn inject(
    fault: Fault,
    rng: &mut StdRng,
    nodes: &mut [Node],
    postgres: Option<&TestPostgres>,
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
                tokio::task::block_in_place(|| postgres.stop());
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..1000))).await;
                tokio::task::block_in_place(|| postgres.start());
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

async fn open_store(db: &str) -> Result<Arc<dyn CheckpointStore>> {
    let opened = keel_store::open(db, keel_store::OpenOptions::default())
        .await
        .map_err(StoreError::from)?;
    Ok(opened.store)
}

/// A session's whole stored log.
async fn stored_log(store: &dyn CheckpointStore, session_id: &str) -> Result<Vec<RecordedEvent>> {
    let mut log: Vec<RecordedEvent> = Vec::new();
    let deadline = Instant::now() + SETTLE_BOUND;
    loop {
        let after = log.last().map_or(0, |event| event.sequence);
        let page = match store.events_after(session_id, after, MAX_EVENT_PAGE).await {
            Ok(page) => page,
            // The database is coming back from a restart.
            Err(keel_store::StoreError::Unavailable(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let done = page.len() < MAX_EVENT_PAGE;
        log.extend(page);
        if done {
            return Ok(log);
        }
    }
}

/// SQLite's own check of the file.
fn integrity(path: &Path, violations: &mut Vec<String>) {
    let verdict = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .and_then(|conn| conn.query_row("PRAGMA integrity_check", [], |row| row.get::<_, String>(0)));
    match verdict {
        Ok(verdict) if verdict == "ok" => {}
        Ok(verdict) => violations.push(format!("the database's integrity check says: {verdict}")),
        Err(error) => violations.push(format!("the database cannot be checked: {error}")),
    }
}

/// PostgreSQL's own checks (`amcheck`): every B-tree index of the database
/// is consistent and finds every row of its table, and no table has a
/// corrupt page. A check that cannot run is a violation too.
async fn postgres_integrity(url: &str, violations: &mut Vec<String>) {
    const INDEXES: &str = "SELECT c.oid::regclass::text FROM pg_class c
         JOIN pg_am am ON am.oid = c.relam JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind = 'i' AND am.amname = 'btree' AND n.nspname = 'public'";
    const TABLES: &str = "SELECT c.oid::regclass::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind = 'r' AND n.nspname = 'public'";
    let checked = async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        client.batch_execute("CREATE EXTENSION IF NOT EXISTS amcheck").await?;
        let mut found = Vec::new();
        for row in client.query(INDEXES, &[]).await? {
            let index: String = row.try_get(0)?;
            if let Err(error) = client
                .execute("SELECT bt_index_check($1::text::regclass, true)", &[&index])
                .await
            {
                found.push(format!("the index {index} fails its check: {error}"));
            }
        }
        let tables = client.query(TABLES, &[]).await?;
        for row in &tables {
            let table: String = row.try_get(0)?;
            for corrupt in client
                .query(
                    "SELECT blkno, offnum, msg FROM verify_heapam($1::text::regclass)",
                    &[&table],
                )
                .await?
            {
                let (block, offset, message): (i64, Option<i32>, String) =
                    (corrupt.try_get(0)?, corrupt.try_get(1)?, corrupt.try_get(2)?);
                found.push(format!(
                    "the table {table} is corrupt at block {block}, item {offset:?}: {message}"
                ));
            }
        }
        if tables.is_empty() {
            found.push("no table of Keel's was found to check".to_owned());
        }
        drop(client);
        let _ = driver.await;
        Ok::<_, tokio_postgres::Error>(found)
    };
    match checked.await {
        Ok(found) => violations.extend(found),
        Err(error) => violations.push(format!("the database cannot be checked: {error}")),
    }
}

/// Copies the evidence of a failed run into a directory of its own.
fn keep_evidence(
    params: &ChaosParams,
    dir: &Path,
    nodes: &[Node],
    history: &BTreeMap<String, clients::SessionHistory>,
    report: &ChaosReport,
) -> Result<PathBuf> {
    let target = params
        .evidence
        .join(format!("chaos-seed-{}-{}", params.seed, keel_protocol::now_ms()));
    std::fs::create_dir_all(&target).map_err(|error| setup(format!("cannot keep the evidence: {error}")))?;
    for node in nodes {
        keep(&node.log_path(), &target);
    }
    for name in ["keel.sqlite3", "keel.sqlite3-wal", "chaos.jsonl", "keel.toml"] {
        keep(&dir.join(name), &target);
    }
    let mut file = std::fs::File::create(target.join("history.jsonl"))
        .map_err(|error| setup(format!("cannot keep the history: {error}")))?;
    for (session_id, session) in history {
        for attempt in &session.attempts {
            let _ = writeln!(file, "{}", serde_json::to_string(attempt).unwrap_or_default());
        }
        for event in session.received.values() {
            let _ = writeln!(file, "{}", json!({"session_id": session_id, "received": event}));
        }
    }
    std::fs::write(target.join("violations.txt"), report.violations.join("\n"))
        .map_err(|error| setup(format!("cannot keep the violations: {error}")))?;
    Ok(target)
}
