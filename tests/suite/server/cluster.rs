//! Several `keel serve` nodes on one PostgreSQL database, each a real
//! process on loopback, against a real PostgreSQL the harness starts:
//! requests to any node, streams from any node, a node killed, paused,
//! terminated, and the database restarted. Every stream is checked against
//! the stored log, and the log against the invariants: gap-free, each turn
//! closed once, turns never interleaved.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use keel::protocol::{AbortReason, EventMsg, RecordedEvent};
use keel::store::postgres::local::LocalPostgres;
use keel::store::{PostgresCheckpoint, PostgresOptions};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::{Api, Reply, Resume, SseStream, metric};
use crate::suite::support::server::{Scratch, ServeProcess, slow_chunks};
use crate::suite::support::store::stored_events_in;
use crate::suite::support::wait::{HANG_GUARD, guard, wait_until_async};

mod answers;
mod client_tools;
mod forward;
mod shared_budgets;
mod stale_tenant;
mod webhooks;

/// Nodes' lease time to live in these tests: short, so take-overs after a
/// death are quick.
const SHORT_LEASE_MS: u64 = 2000;

/// How long a take-over may take here: the lease, a sweep, a load, with
/// room for a loaded machine.
const TAKE_OVER_BOUND: Duration = Duration::from_secs(20);

/// Nodes on one database.
struct Cluster {
    url: String,
    scratch: Scratch,
    nodes: Vec<Option<ServeProcess>>,
    lease_ms: u64,
}

impl Cluster {
    /// `count` nodes on a fresh database of `postgres`.
    fn start(postgres: &LocalPostgres, count: usize, lease_ms: u64, extra: &[&str]) -> Self {
        let mut cluster = Self {
            url: postgres.fresh_database(),
            scratch: Scratch::new(),
            nodes: Vec::new(),
            lease_ms,
        };
        for index in 0..count {
            let node = ServeProcess::spawn(cluster.command(index, extra));
            cluster.nodes.push(Some(node));
        }
        cluster
    }

    fn command(&self, index: usize, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command
            .args(["serve", "--db", &self.url, "--listen", "127.0.0.1:0"])
            .args(["--node-id", &format!("node-{index}")])
            .args(["--lease-ttl-ms", &self.lease_ms.to_string()])
            .arg("--workspace-root")
            .arg(self.scratch.workspaces())
            .arg("--script-dir")
            .arg(self.scratch.dir.path())
            .args(extra)
            .env_remove("KEEL_MODEL")
            .env_remove("KEEL_CONFIG")
            .env("KEEL_LOG", "warn")
            // The nodes' own data directory, where the host's cluster key is.
            .env("XDG_DATA_HOME", self.data_home())
            .current_dir(self.scratch.dir.path());
        command
    }

    /// The data directory every node of this cluster shares.
    fn data_home(&self) -> std::path::PathBuf {
        self.scratch.dir.path().join("data")
    }

    /// Starts node `index` behind the operator's `token` (written to a
    /// token file in the scratch directory), with `extra` arguments.
    fn start_with_token(&mut self, index: usize, token: &str, extra: &[&str]) {
        let token_file = self.scratch.dir.path().join("token");
        std::fs::write(&token_file, token).expect("token file");
        let token_path = token_file.display().to_string();
        let mut args = vec!["--token-file", token_path.as_str()];
        args.extend_from_slice(extra);
        let mut node = ServeProcess::spawn(self.command(index, &args));
        node.api.token = Some(token.to_owned());
        self.nodes.push(Some(node));
    }

    fn api(&self, index: usize) -> &Api {
        &self.nodes[index].as_ref().expect("the node runs").api
    }

    fn take(&mut self, index: usize) -> ServeProcess {
        self.nodes[index].take().expect("the node runs")
    }

    /// The session's stored log, read from the database.
    async fn log(&self, session_id: &str) -> Vec<RecordedEvent> {
        let store = PostgresCheckpoint::connect(&self.url, PostgresOptions::default())
            .await
            .expect("open the database");
        let events = stored_events_in(&store, session_id).await;
        store.close().await;
        events
    }
}

/// Submits `op` to a node with an idempotency key.
async fn submit_keyed(api: &Api, session_id: &str, op: Value, key: &str) -> Reply {
    let request = api
        .client
        .post(api.url(&format!("/v1/sessions/{session_id}/submissions")))
        .header("idempotency-key", key)
        .json(&json!({ "op": op }));
    api.send(request).await
}

fn user_input(text: &str) -> Value {
    json!({"type": "user_input", "text": text})
}

/// Checks the invariants of a log: sequences 1..N without gap or
/// duplicate, every turn started once and closed once, and no turn's
/// events inside another's (turns never interleave).
fn assert_log_sound(log: &[RecordedEvent]) {
    let sequences: Vec<u64> = log.iter().map(|event| event.sequence).collect();
    let expected: Vec<u64> = (1..=log.len() as u64).collect();
    assert_eq!(sequences, expected, "the log is gap-free and has no duplicate");
    let mut open: Option<String> = None;
    let mut started = BTreeSet::new();
    let mut closed = BTreeMap::new();
    for event in log {
        match &event.msg {
            EventMsg::TurnStarted(turn) => {
                assert!(open.is_none(), "turn {} started inside {open:?}", turn.turn_id);
                assert!(
                    started.insert(turn.turn_id.clone()),
                    "turn {} started twice",
                    turn.turn_id
                );
                open = Some(turn.turn_id.clone());
            }
            msg if msg.ends_turn() => {
                let turn_id = msg.turn_id().expect("a turn's end names it").to_owned();
                *closed.entry(turn_id.clone()).or_insert(0) += 1;
                assert_eq!(
                    open.as_deref(),
                    Some(turn_id.as_str()),
                    "an end of a turn that is not open"
                );
                open = None;
            }
            msg => {
                if let (Some(turn_id), Some(open)) = (msg.turn_id(), &open) {
                    assert_eq!(turn_id, open, "an event of another turn inside turn {open}");
                }
            }
        }
    }
    for (turn_id, count) in &closed {
        assert_eq!(*count, 1, "turn {turn_id} closed {count} times");
    }
}

/// Reads a stream until `pick` matches, failing after `bound`.
async fn stream_until(
    stream: &mut SseStream,
    bound: Duration,
    pick: impl FnMut(&RecordedEvent) -> bool,
) -> Vec<RecordedEvent> {
    tokio::time::timeout(bound, stream.until(pick))
        .await
        .expect("the event came in time")
}

/// Checks that what a stream delivered is the log's events, with the same
/// content at the same sequences.
fn assert_stream_matches_log(streamed: &[RecordedEvent], log: &[RecordedEvent]) {
    for event in streamed {
        let stored = log
            .get(usize::try_from(event.sequence).expect("sequence") - 1)
            .unwrap_or_else(|| panic!("streamed sequence {} is not stored", event.sequence));
        assert_eq!(event, stored, "streamed and stored differ at {}", event.sequence);
    }
    let sequences: Vec<u64> = streamed.iter().map(|event| event.sequence).collect();
    let expected: Vec<u64> = (1..=streamed.len() as u64).collect();
    assert_eq!(sequences, expected, "a stream from the start is gap-free");
}

fn aborted_for(event: &RecordedEvent, reason: AbortReason) -> bool {
    matches!(&event.msg, EventMsg::TurnAborted(aborted) if aborted.reason == reason)
}

/// A counter's value in a node's metrics text (0 when absent).
fn counter(text: &str, name: &str) -> f64 {
    metric(text, name).unwrap_or(0.0)
}

/// Three nodes: a session created on one takes messages sent to any node
/// (a key retried on another node is a duplicate), and streams opened on
/// the other two deliver exactly the log. An interrupt sent to another
/// node reaches the running turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_node_accepts_any_request_and_streams_any_session() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let cluster = Cluster::start(postgres, 3, SHORT_LEASE_MS, &[]);
    let answers: Vec<String> = (1..=6)
        .map(|n| json!({"text": format!("Answer {n}.")}).to_string())
        .collect();
    let answers: Vec<&str> = answers.iter().map(String::as_str).collect();
    let model = cluster.scratch.script("s.jsonl", &answers);
    cluster.api(0).create(json!({"id": "s", "model": model})).await;
    let mut on_one = cluster.api(1).stream("s", Resume::Start).await;
    let mut on_two = cluster.api(2).stream("s", Resume::Start).await;

    let mut accepted = Vec::new();
    for n in 0..6 {
        let reply = submit_keyed(
            cluster.api(n % 3),
            "s",
            user_input(&format!("message {n}")),
            &format!("key-{n}"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        assert_eq!(reply.body["duplicate"], false);
        accepted.push(reply.body["submission_id"].as_str().expect("an id").to_owned());
    }
    // A retry on another node is answered with the first acceptance.
    let retried = submit_keyed(cluster.api(2), "s", user_input("message 1"), "key-1").await;
    assert_eq!(retried.status, StatusCode::ACCEPTED, "{}", retried.body);
    assert_eq!(retried.body["duplicate"], true);
    assert_eq!(retried.body["submission_id"], accepted[1]);
    let reused = submit_keyed(cluster.api(0), "s", user_input("another body"), "key-4").await;
    assert_eq!(reused.status, StatusCode::CONFLICT, "{}", reused.body);

    let first = guard("six turns on node 1", on_one.turns(6)).await;
    let second = guard("six turns on node 2", on_two.turns(6)).await;
    let log = cluster.log("s").await;
    assert_log_sound(&log);
    assert_stream_matches_log(&first, &log);
    assert_stream_matches_log(&second, &log);
    let completed = log.iter().filter(|event| event.msg.kind() == "turn_complete").count();
    assert_eq!(completed, 6, "every message ran once");
    // Each accepted id is the id of one stored submission.
    for id in &accepted {
        let queued = log
            .iter()
            .filter(|event| event.msg.kind() == "submission_queued" && event.submission_id.as_deref() == Some(id))
            .count();
        assert_eq!(queued, 1, "submission {id} queued once");
    }

    // An interrupt sent to a node that does not run the session.
    let slow = cluster.scratch.script("slow.jsonl", &[&slow_chunks(100, 100)]);
    cluster.api(0).create(json!({"id": "slow", "model": slow})).await;
    let mut watch = cluster.api(1).stream("slow", Resume::Start).await;
    cluster.api(0).say("slow", "take your time").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "assistant_content_delta"
    })
    .await;
    let sent = Instant::now();
    let reply = cluster
        .api(2)
        .submit("slow", json!({"op": {"type": "interrupt"}}))
        .await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut watch, Duration::from_secs(8), |event| {
        aborted_for(event, AbortReason::Interrupted)
    })
    .await;
    eprintln!(
        "an interrupt relayed to the owner closed the turn in {:?}",
        sent.elapsed()
    );
    assert_log_sound(&cluster.log("slow").await);
    let (mut relayed, mut forwarded) = (0.0, 0.0);
    for index in 0..3 {
        let metrics = cluster.api(index).metrics().await;
        relayed += counter(&metrics, "keel_relayed_submissions_total");
        forwarded += counter(&metrics, "keel_forwarded_submissions_total");
    }
    assert_eq!(
        relayed, 6.0,
        "four messages, a retry (answered by the owner) and an interrupt were relayed"
    );
    assert_eq!(forwarded, relayed, "each handed to the owner directly");
}

/// Waits until a resumed node has stopped the session it lost: its next
/// write was fenced off, or its next renewal found the lease gone.
async fn wait_unloaded(api: &Api) {
    wait_until_async("the resumed node to let the session go", TAKE_OVER_BOUND, async || {
        counter(&api.metrics().await, "keel_live_sessions") == 0.0
    })
    .await;
}

/// Sends a signal to a node.
fn signal(node: &ServeProcess, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(node.pid()).expect("pid"));
    nix::sys::signal::kill(pid, signal).expect("signal the node");
}

/// A session on node 0 with a slow turn in flight and a message queued
/// behind it (relayed from node 1), watched from node 2 from the start.
async fn busy_session_on_node_zero(cluster: &Cluster, session_id: &str) -> (SseStream, Vec<RecordedEvent>) {
    let script = cluster.scratch.script(
        &format!("{session_id}.jsonl"),
        &[
            &slow_chunks(400, 50),
            r#"{"text": "The queued one ran."}"#,
            r#"{"text": "And one more."}"#,
        ],
    );
    cluster.api(0).create(json!({"id": session_id, "model": script})).await;
    let mut watch = cluster.api(2).stream(session_id, Resume::Start).await;
    cluster.api(0).say(session_id, "a long answer, please").await;
    let queued = submit_keyed(cluster.api(1), session_id, user_input("and then this"), "queued-1").await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{}", queued.body);
    // The owner has queued it (stored) and the turn is streaming.
    let mut seen = stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "submission_queued" && event.sequence > 3
    })
    .await;
    seen.extend(
        stream_until(&mut watch, Duration::from_secs(30), |event| {
            event.msg.kind() == "assistant_content_delta"
        })
        .await,
    );
    (watch, seen)
}

/// What follows on a stream once the owner is gone: the cut turn closed as
/// `runtime_stopped` by the node that took over, then the queued message's
/// turn run to its end. Returns every event seen.
async fn taken_over(watch: &mut SseStream, mut seen: Vec<RecordedEvent>) -> Vec<RecordedEvent> {
    let rest = stream_until(watch, TAKE_OVER_BOUND, |event| {
        aborted_for(event, AbortReason::RuntimeStopped)
    })
    .await;
    seen.extend(rest);
    seen.extend(stream_until(watch, TAKE_OVER_BOUND, |event| event.msg.kind() == "turn_complete").await);
    seen
}

/// A node killed (SIGKILL) mid-turn: once its lease expires another node
/// takes the session over without any request, closes the cut turn as
/// `runtime_stopped` and runs the message queued behind it; a stream on a
/// third node sees all of it, gap-free, exactly as stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_s_sessions_are_taken_over_by_the_others() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 3, SHORT_LEASE_MS, &[]);
    let (mut watch, seen) = busy_session_on_node_zero(&cluster, "k").await;
    let killed = Instant::now();
    cluster.take(0).crash();
    let seen = taken_over(&mut watch, seen).await;
    eprintln!(
        "a session of a killed node ran again {:?} after the kill",
        killed.elapsed()
    );
    let log = cluster.log("k").await;
    assert_log_sound(&log);
    assert_stream_matches_log(&seen, &log);
    let texts: Vec<&str> = log
        .iter()
        .filter_map(|event| match &event.msg {
            EventMsg::UserMessage(message) => Some(message.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts,
        ["a long answer, please", "and then this"],
        "each message ran once"
    );
    let mut taken = 0.0;
    for index in 1..3 {
        taken += counter(&cluster.api(index).metrics().await, "keel_sessions_taken_over_total");
    }
    assert_eq!(taken, 1.0, "one node took the session over");
}

/// A node paused (SIGSTOP) past its lease: another node takes its session
/// over. Resumed (SIGCONT), the paused node's writes are fenced off and it
/// stops its runtime: the log has no duplicate, no interleaved turn, and the
/// cut turn is closed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_is_fenced_off_when_it_resumes() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let cluster = Cluster::start(postgres, 3, SHORT_LEASE_MS, &[]);
    let (mut watch, seen) = busy_session_on_node_zero(&cluster, "p").await;
    let paused = cluster.nodes[0].as_ref().expect("node 0");
    signal(paused, nix::sys::signal::Signal::SIGSTOP);
    let seen = taken_over(&mut watch, seen).await;
    signal(paused, nix::sys::signal::Signal::SIGCONT);
    wait_unloaded(cluster.api(0)).await;
    // Whatever node 0 still tried to write was refused; the session goes
    // on where it runs now, reached through node 0 as well.
    let reply = submit_keyed(cluster.api(0), "p", user_input("one more"), "after-pause").await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    let more = stream_until(&mut watch, TAKE_OVER_BOUND, |event| event.msg.ends_turn()).await;
    let log = cluster.log("p").await;
    assert_log_sound(&log);
    let mut all = seen;
    all.extend(more);
    assert_stream_matches_log(&all, &log);
    let completions = log.iter().filter(|event| event.msg.kind() == "turn_complete").count();
    let aborts = log
        .iter()
        .filter(|event| aborted_for(event, AbortReason::RuntimeStopped))
        .count();
    assert_eq!(
        (aborts, completions),
        (1, 2),
        "the cut turn closed once; the others ran once: {:?}",
        log.iter().map(|event| event.msg.kind()).collect::<Vec<_>>()
    );
}

/// SIGTERM on a node hands its sessions over at once (well before their
/// leases would expire): another node closes the cut turn and runs the
/// queued message, and a client of the stopped node resumes its stream on
/// another node from its `Last-Event-ID`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_node_s_sessions_over_at_once() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    // Leases long enough that only the hand-off can explain a quick take-over.
    let mut cluster = Cluster::start(postgres, 3, 60_000, &["--shutdown-grace-secs", "0"]);
    let (mut watch, seen) = busy_session_on_node_zero(&cluster, "t").await;
    let mut on_zero = cluster.api(0).stream("t", Resume::Start).await;
    let before = guard(
        "node 0's stream",
        on_zero.until(|event| event.msg.kind() == "assistant_content_delta"),
    )
    .await;
    let stopped = Instant::now();
    let (status, _) = cluster.take(0).terminate();
    assert!(status.success(), "{status:?}");
    let seen = taken_over(&mut watch, seen).await;
    let handed = stopped.elapsed();
    eprintln!("sessions handed over {handed:?} after SIGTERM");
    assert!(
        handed < Duration::from_secs(30),
        "taken over in {handed:?}, not by the lease's expiry"
    );
    // The client of node 0 resumes on node 1 where it stopped.
    let last = before.last().expect("events").sequence;
    let mut resumed = cluster.api(1).stream("t", Resume::LastEventId(last)).await;
    let rest = guard(
        "the resumed stream",
        resumed.until(|event| event.msg.kind() == "turn_complete"),
    )
    .await;
    assert_eq!(rest.first().map(|event| event.sequence), Some(last + 1));
    let log = cluster.log("t").await;
    assert_log_sound(&log);
    assert_stream_matches_log(&seen, &log);
    let mut both = before;
    both.extend(rest);
    assert_stream_matches_log(&both, &log);
}

/// A node that learnt who runs a session relays its next submissions
/// without claiming it first; when that owner lets the session go before
/// its lease would have ended (SIGTERM, an idle unload), the relayed row is
/// announced with no live owner and taken up at once, here by the relaying
/// node itself, not answered `503` after the relay wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_to_an_owner_that_let_the_session_go_is_taken_up_at_once() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    // Leases far longer than the test: what node 1 learnt stays its hint.
    let mut cluster = Cluster::start(
        postgres,
        2,
        60_000,
        &["--shutdown-grace-secs", "0", "--relay-wait-ms", "20000"],
    );
    let answers = [
        r#"{"text": "First."}"#,
        r#"{"text": "Second."}"#,
        r#"{"text": "Third."}"#,
        r#"{"text": "Fourth."}"#,
    ];
    let model = cluster.scratch.script("h.jsonl", &answers);
    cluster.api(0).create(json!({"id": "h", "model": model})).await;
    let mut watch = cluster.api(1).stream("h", Resume::Start).await;
    cluster.api(0).say("h", "on the owner").await;
    guard("the first turn", watch.turns(1)).await;
    // Relayed: node 1 finds node 0's lease, then relays on what it learnt.
    for text in ["relayed once", "relayed again"] {
        cluster.api(1).say("h", text).await;
    }
    guard("the relayed turns", watch.turns(2)).await;
    let relayed = metric(&cluster.api(1).metrics().await, "keel_relayed_submissions_total");
    assert_eq!(relayed, Some(2.0), "both went through the database");

    let (status, _) = cluster.take(0).terminate();
    assert!(status.success(), "{status:?}");
    let sent = Instant::now();
    let reply = cluster
        .api(1)
        .submit(
            "h",
            json!({"op": {"type": "user_input", "text": "after the owner left"}}),
        )
        .await;
    let answered = sent.elapsed();
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    assert!(answered < Duration::from_secs(15), "answered after {answered:?}");
    guard("the turn after the hand-off", watch.turns(1)).await;
    let log = cluster.log("h").await;
    assert_log_sound(&log);
    let completed = log.iter().filter(|event| event.msg.kind() == "turn_complete").count();
    let kinds: Vec<&str> = log.iter().map(|event| event.msg.kind()).collect();
    assert_eq!(completed, 4, "every message ran once: {kinds:?}");
}

/// PostgreSQL restarted under two nodes: requests meanwhile get `503
/// store_unavailable`; once it is back both nodes serve again by
/// themselves, relaying included, and nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_ride_out_a_postgresql_restart() {
    let Some(postgres) = LocalPostgres::own() else { return };
    let cluster = Cluster::start(&postgres, 2, SHORT_LEASE_MS, &[]);
    let model = cluster.scratch.script(
        "r.jsonl",
        &[r#"{"text": "One."}"#, r#"{"text": "Two."}"#, r#"{"text": "Three."}"#],
    );
    cluster.api(0).create(json!({"id": "r", "model": model})).await;
    cluster.api(1).say("r", "before").await;
    cluster.api(1).wait_idle("r").await;
    postgres.stop();
    let refused = cluster.api(1).submit("r", json!({"op": user_input("during")})).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE, "{}", refused.body);
    assert_eq!(refused.code(), "store_unavailable");
    postgres.start();
    wait_until_async("node 1 to serve again", HANG_GUARD, async || {
        let reply = submit_keyed(cluster.api(1), "r", user_input("after"), "after-restart").await;
        if reply.status == StatusCode::ACCEPTED {
            return true;
        }
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{}", reply.body);
        false
    })
    .await;
    let mut watch = cluster.api(1).stream("r", Resume::Start).await;
    let events = guard("the turn after the restart", watch.turns(2)).await;
    let log = cluster.log("r").await;
    assert_log_sound(&log);
    assert_stream_matches_log(&events, &log);
    assert_eq!(
        log.iter().filter(|event| event.msg.kind() == "turn_complete").count(),
        2,
        "the message before and the one after the restart ran, once each"
    );
}

/// Writes a `keel.toml` letting the shell run without approval.
fn shell_auto(cluster: &Cluster) -> String {
    let path = cluster.scratch.dir.path().join("keel.toml");
    std::fs::write(&path, "[approvals]\ntools = { shell = \"auto\" }\n").expect("keel.toml");
    path.display().to_string()
}

/// A node paused while a shell command it started runs: the node that
/// takes over closes the turn without running the command again, and the
/// paused node, resumed, cannot record the command's result. The command's
/// side effect (a line appended to a file) happens once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_cut_by_a_pause_runs_once() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, SHORT_LEASE_MS, &[]);
    let config = shell_auto(&cluster);
    for index in 0..3 {
        let node = ServeProcess::spawn(cluster.command(index, &["--config", &config]));
        cluster.nodes.push(Some(node));
    }
    let call = json!({"tool_calls": [{"id": "once", "name": "shell", "arguments": {"command": "echo ran >> count.txt; sleep 3; echo finished; : > finished.txt"}}]});
    let model = cluster
        .scratch
        .script("tool.jsonl", &[&call.to_string(), r#"{"text": "After."}"#]);
    cluster.api(0).create(json!({"id": "tool", "model": model})).await;
    let mut watch = cluster.api(2).stream("tool", Resume::Start).await;
    cluster.api(0).say("tool", "count").await;
    let mut seen = stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "tool_call_started"
    })
    .await;
    // `tool_call_started` is stored before the command is spawned; pause
    // the node only once the command runs, or a loaded machine pauses it
    // in between and the command, rightly, never runs at all.
    let count_file = cluster.scratch.workspaces().join("tool").join("count.txt");
    wait_until_async("the command to start", HANG_GUARD, async || count_file.exists()).await;
    let paused = cluster.nodes[0].as_ref().expect("node 0");
    signal(paused, nix::sys::signal::Signal::SIGSTOP);
    seen.extend(
        stream_until(&mut watch, TAKE_OVER_BOUND, |event| {
            aborted_for(event, AbortReason::RuntimeStopped)
        })
        .await,
    );
    // The command finishes meanwhile (it is not the node's own process);
    // the resumed node tries to record its result.
    let finished = cluster.scratch.workspaces().join("tool").join("finished.txt");
    wait_until_async("the command to finish", HANG_GUARD, async || finished.exists()).await;
    signal(paused, nix::sys::signal::Signal::SIGCONT);
    wait_unloaded(cluster.api(0)).await;
    cluster.api(1).say("tool", "and now?").await;
    seen.extend(stream_until(&mut watch, TAKE_OVER_BOUND, |event| event.msg.kind() == "turn_complete").await);
    let log = cluster.log("tool").await;
    assert_log_sound(&log);
    assert_stream_matches_log(&seen, &log);
    let of_call = |kind: &str| {
        log.iter()
            .filter(|event| {
                event.msg.kind() == kind && serde_json::to_value(&event.msg).expect("json")["call_id"] == "once"
            })
            .count()
    };
    assert_eq!(
        (of_call("tool_call_started"), of_call("tool_call_completed")),
        (1, 1),
        "started once, closed once (by the node that took over)"
    );
    let count = std::fs::read_to_string(&count_file).expect("the file");
    assert_eq!(count, "ran\n", "the command ran once");
    drop(cluster.take(0));
}

/// A turn waiting for approval waits through its node's death: nobody
/// takes the session over for the wait alone; the decision, sent to
/// another node, loads it there and completes the turn. While the owner
/// lives, a decision sent to any node reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_reach_the_owner_from_any_node_and_wait_through_its_death() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 3, SHORT_LEASE_MS, &[]);
    let write = |id: &str| {
        json!({"tool_calls": [{"id": id, "name": "write_file", "arguments": {"path": format!("{id}.txt"), "content": id}}]}).to_string()
    };
    let (first, second) = (write("first"), write("second"));
    let model = cluster.scratch.script(
        "ask.jsonl",
        &[
            &first,
            r#"{"text": "One written."}"#,
            &second,
            r#"{"text": "Two written."}"#,
        ],
    );
    cluster
        .api(0)
        .create(json!({"id": "ask", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    let mut watch = cluster.api(2).stream("ask", Resume::Start).await;
    cluster.api(1).say("ask", "write the first").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "approval_requested"
    })
    .await;
    let decide = |call_id: &str| json!({"op": {"type": "approval", "call_id": call_id, "decision": "approve"}});
    let reply = cluster.api(2).submit("ask", decide("first")).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "turn_complete"
    })
    .await;

    cluster.api(1).say("ask", "write the second").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "approval_requested"
    })
    .await;
    cluster.take(0).crash();
    // Past the lease, and a few sweeps: the wait alone is not taken over.
    // Kept: the test proves nothing happens within this window.
    tokio::time::sleep(Duration::from_millis(3 * SHORT_LEASE_MS)).await;
    for index in 1..3 {
        assert_eq!(
            counter(&cluster.api(index).metrics().await, "keel_sessions_taken_over_total"),
            0.0,
            "a session waiting for approval is not loaded for the wait"
        );
    }
    let shown = cluster.api(1).session("ask").await;
    assert_eq!(shown["state"], "awaiting_approval", "{shown}");
    let reply = cluster.api(1).submit("ask", decide("second")).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut watch, TAKE_OVER_BOUND, |event| event.msg.kind() == "turn_complete").await;
    let log = cluster.log("ask").await;
    assert_log_sound(&log);
    let written = cluster.scratch.workspaces().join("ask");
    assert_eq!(
        std::fs::read_to_string(written.join("first.txt")).expect("first"),
        "first"
    );
    assert_eq!(
        std::fs::read_to_string(written.join("second.txt")).expect("second"),
        "second"
    );
}

/// A row written into `relayed_submissions` by anyone but a node (say a
/// process that reached the database's socket) decides nothing: the owner
/// refuses an approval no node sealed and leaves the call waiting, while a
/// decision a client sent through another node (relayed and sealed with
/// the key both derive from the API token) is taken up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_row_no_node_sealed_decides_nothing() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, SHORT_LEASE_MS, &[]);
    for index in 0..2 {
        cluster.start_with_token(index, "cluster-token-of-this-test-0123456789", &[]);
    }
    let call = json!({"tool_calls": [{"id": "guarded", "name": "write_file", "arguments": {"path": "decided.txt", "content": "written"}}]});
    let model = cluster
        .scratch
        .script("forge.jsonl", &[&call.to_string(), r#"{"text": "Written."}"#]);
    cluster
        .api(0)
        .create(json!({"id": "forge", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    let mut watch = cluster.api(0).stream("forge", Resume::Start).await;
    cluster.api(0).say("forge", "write it").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "approval_requested"
    })
    .await;

    // The forgery: an approval inserted straight into the table, and the
    // owner woken for it, as a node would.
    let (client, connection) = tokio_postgres::connect(&cluster.url, tokio_postgres::NoTls)
        .await
        .expect("connect to the database");
    let connection = tokio::spawn(connection);
    let forged = json!({"op": {"type": "approval", "call_id": "guarded", "decision": "approve"}, "on_busy": null});
    let inserted = client
        .execute(
            "INSERT INTO relayed_submissions (session_key, submission_id, idempotency_key, submission, relayed_at_ms)
             SELECT key, 'forged-1', NULL, $2, 0 FROM sessions WHERE id = $1",
            &[&"forge", &forged.to_string().into_bytes()],
        )
        .await
        .expect("insert the forged row");
    assert_eq!(inserted, 1);
    client
        .execute("SELECT pg_notify('keel_relay', $1)", &[&"forge\nnode-0"])
        .await
        .expect("notify");
    wait_until_async("the owner to look at the forged row", TAKE_OVER_BOUND, async || {
        counter(&cluster.api(0).metrics().await, "keel_relayed_refused_total") >= 1.0
    })
    .await;
    // Counted as it is refused, deleted once the page is done.
    wait_until_async("the refused row to be deleted", TAKE_OVER_BOUND, async || {
        let left: i64 = client
            .query_one("SELECT count(*) FROM relayed_submissions", &[])
            .await
            .expect("count")
            .get(0);
        left == 0
    })
    .await;
    let shown = cluster.api(0).session("forge").await;
    assert_eq!(shown["state"], "awaiting_approval", "{shown}");
    let written = cluster.scratch.workspaces().join("forge").join("decided.txt");
    assert!(!written.exists(), "a forged approval ran the call");

    // A client's decision through the other node is relayed, sealed, and
    // taken up by the owner.
    let decide = json!({"op": {"type": "approval", "call_id": "guarded", "decision": "approve"}});
    let reply = cluster.api(1).submit("forge", decide).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "turn_complete"
    })
    .await;
    assert_eq!(std::fs::read_to_string(&written).expect("written"), "written");
    assert_eq!(
        counter(&cluster.api(1).metrics().await, "keel_relayed_submissions_total"),
        1.0,
        "the decision was relayed, not taken by node 1 itself"
    );
    let log = cluster.log("forge").await;
    assert_log_sound(&log);
    assert!(
        !log.iter()
            .any(|event| event.submission_id.as_deref() == Some("forged-1")),
        "the forged submission left no trace in the log"
    );
    drop(client);
    connection.abort();
}

/// A cluster key too short to be a secret is refused before the server
/// opens anything, and its text is never echoed.
#[test]
fn a_short_cluster_key_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let key = dir.path().join("cluster.key");
    std::fs::write(&key, "short-secret\n").expect("key file");
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--listen", "127.0.0.1:0", "--cluster-key-file"])
        .arg(&key)
        .arg("--db")
        .arg(dir.path().join("keel.sqlite3"))
        .env_remove("KEEL_CONFIG")
        .current_dir(dir.path())
        .output()
        .expect("keel serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("holds 12 bytes; give it at least 32"), "{stderr}");
    assert!(!stderr.contains("short-secret"), "{stderr}");
    assert!(
        !dir.path().join("keel.sqlite3").exists(),
        "the database was opened: {stderr}"
    );
}
