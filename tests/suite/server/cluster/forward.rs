//! A submission for a session another node runs is handed to that node
//! directly, over HTTP, and through the database only when that fails.
//! What a node hands another is sealed with the cluster key over when it
//! was sent: someone on the nodes' network who captured one can neither
//! send it again nor change it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{Cluster, assert_log_sound, counter, stream_until};
use crate::suite::support::api::Resume;
use keel::store::postgres::local::LocalPostgres;

/// Leases far longer than a test: what a node learns of the owner stays.
const LONG_LEASE_MS: u64 = 60_000;

const TOKEN: &str = "operator-token-of-the-forward-tests-0123";

async fn database(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the database");
    tokio::spawn(connection);
    client
}

async fn count(client: &tokio_postgres::Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect("count").get(0)
}

fn queued_texts(log: &[keel::protocol::RecordedEvent]) -> Vec<String> {
    log.iter()
        .filter(|event| event.msg.kind() == "submission_queued")
        .filter_map(|event| {
            let msg = serde_json::to_value(&event.msg).ok()?;
            msg["op"]["text"].as_str().map(str::to_owned)
        })
        .collect()
}

/// Node 1 hands a message to node 0, which runs its session, without a row
/// in `relayed_submissions`; a node that cannot reach the owner where it
/// advertised itself relays through the database instead, and the message
/// runs all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submission_goes_to_its_owner_directly_or_else_through_the_database() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, LONG_LEASE_MS, &[]);
    for index in 0..2 {
        cluster.start_with_token(index, TOKEN, &[]);
    }
    let model = cluster.scratch.script(
        "d.jsonl",
        &[r#"{"text": "One."}"#, r#"{"text": "Two."}"#, r#"{"text": "Three."}"#],
    );
    cluster.api(0).create(json!({"id": "d", "model": model})).await;
    let client = database(&cluster.url).await;

    cluster.api(1).say("d", "handed over").await;
    cluster.api(0).wait_idle("d").await;
    let metrics = cluster.api(1).metrics().await;
    assert_eq!(counter(&metrics, "keel_forwarded_submissions_total"), 1.0, "{metrics}");
    assert_eq!(counter(&metrics, "keel_relayed_submissions_total"), 1.0);
    assert_eq!(counter(&metrics, "keel_forwards_not_taken_total"), 0.0);
    assert_eq!(
        count(&client, "SELECT count(*) FROM relayed_submissions").await,
        0,
        "no row was stored for it"
    );

    // Node 0's address, as the database says, now leads nowhere; node 2
    // learns it afresh.
    let moved = client
        .execute(
            "UPDATE nodes SET url = 'http://127.0.0.1:9' WHERE node_id = 'node-0'",
            &[],
        )
        .await
        .expect("update");
    assert_eq!(moved, 1, "node 0 advertised where it listens");
    cluster.start_with_token(2, TOKEN, &[]);
    cluster.api(2).say("d", "through the database").await;
    cluster.api(0).wait_idle("d").await;
    let metrics = cluster.api(2).metrics().await;
    assert_eq!(counter(&metrics, "keel_forwards_not_taken_total"), 1.0, "{metrics}");
    assert_eq!(counter(&metrics, "keel_forwarded_submissions_total"), 0.0);
    assert_eq!(counter(&metrics, "keel_relayed_submissions_total"), 1.0);

    let log = cluster.log("d").await;
    assert_log_sound(&log);
    assert_eq!(queued_texts(&log), ["handed over", "through the database"]);
}

/// A TCP relay in front of a node that keeps a copy of every byte sent
/// through it: what someone on the nodes' network could capture.
struct Tap {
    address: SocketAddr,
    seen: Arc<Mutex<Vec<u8>>>,
    target: Arc<OnceLock<SocketAddr>>,
}

impl Tap {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the tap");
        let tap = Self {
            address: listener.local_addr().expect("address"),
            seen: Arc::default(),
            target: Arc::default(),
        };
        let (seen, target) = (Arc::clone(&tap.seen), Arc::clone(&tap.target));
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Some(target) = target.get().copied() else { continue };
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut from_node, mut to_node) = outbound.into_split();
                    let (mut from_caller, mut to_caller) = inbound.split();
                    let upstream = async {
                        let mut buffer = vec![0; 16 * 1024];
                        while let Ok(read) = from_caller.read(&mut buffer).await {
                            if read == 0 || to_node.write_all(&buffer[..read]).await.is_err() {
                                break;
                            }
                            seen.lock().expect("seen").extend_from_slice(&buffer[..read]);
                        }
                    };
                    let downstream = tokio::io::copy(&mut from_node, &mut to_caller);
                    let _ = tokio::join!(upstream, downstream);
                });
            }
        });
        tap
    }

    /// The bodies of the requests to the nodes' route seen so far.
    fn forwarded_bodies(&self) -> Vec<Value> {
        let seen = self.seen.lock().expect("seen").clone();
        let text = String::from_utf8_lossy(&seen).into_owned();
        let mut bodies = Vec::new();
        let mut rest = text.as_str();
        while let Some(start) = rest.find("POST /cluster/v1/forwarded") {
            let request = &rest[start..];
            let Some(head_end) = request.find("\r\n\r\n") else {
                break;
            };
            let length: usize = request[..head_end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .expect("a content length");
            let body = &request[head_end + 4..head_end + 4 + length];
            bodies.push(serde_json::from_str(body).expect("a JSON body"));
            rest = &request[head_end + 4 + length..];
        }
        bodies
    }
}

/// A handed-over message captured on the way to its owner is refused when
/// sent again, changed, or stripped of its seal; the message itself ran
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_over_submission_sent_again_changed_or_unsealed_is_refused() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, LONG_LEASE_MS, &[]);
    let tap = Tap::start().await;
    let advertised = format!("http://{}", tap.address);
    cluster.start_with_token(0, TOKEN, &["--advertise-url", &advertised]);
    let owner = cluster.api(0).url("");
    let owner_address: SocketAddr = owner
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("the owner's address");
    tap.target.set(owner_address).expect("set once");
    cluster.start_with_token(1, TOKEN, &[]);
    let model = cluster
        .scratch
        .script("h.jsonl", &[r#"{"text": "Once."}"#, r#"{"text": "Twice?"}"#]);
    cluster.api(0).create(json!({"id": "h", "model": model})).await;

    cluster.api(1).say("h", "run me once").await;
    cluster.api(0).wait_idle("h").await;
    let captured = tap.forwarded_bodies();
    assert_eq!(captured.len(), 1, "the message went through the tap: {captured:?}");
    let captured = &captured[0];
    assert_eq!(captured["submission"]["op"]["text"], "run me once");

    let forward = |body: Value| {
        let api = cluster.api(0).clone();
        async move {
            let request = api.client.post(api.url("/cluster/v1/forwarded")).json(&body);
            api.send(request).await
        }
    };
    let again = forward(captured.clone()).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.body);
    assert_eq!(again.body["reply"], "not_taken", "sent again: {}", again.body);

    let mut changed = captured.clone();
    changed["submission"]["op"]["text"] = json!("something else");
    changed["submission_id"] = json!("changed-1");
    let mut unsealed = captured.clone();
    unsealed["submission_id"] = json!("unsealed-1");
    unsealed["submission"]
        .as_object_mut()
        .expect("an object")
        .remove("seal");
    let mut restamped = captured.clone();
    restamped["submission_id"] = json!("restamped-1");
    restamped["sent_at_ms"] = json!(keel::protocol::now_ms());
    for (what, body) in [("changed", changed), ("unsealed", unsealed), ("restamped", restamped)] {
        let reply = forward(body).await;
        assert_eq!(reply.status, StatusCode::OK, "{what}: {}", reply.body);
        assert_eq!(reply.body["reply"], "not_taken", "{what}: {}", reply.body);
    }
    assert_eq!(
        counter(&cluster.api(0).metrics().await, "keel_relayed_refused_total"),
        3.0,
        "each refused for its seal"
    );

    let log = cluster.log("h").await;
    assert_log_sound(&log);
    assert_eq!(queued_texts(&log), ["run me once"], "queued once, nothing else");
}

/// A node started on PostgreSQL with neither a token nor a cluster key
/// still acts on no hand-over nobody sealed: it seals with this host's own
/// key (made once in Keel's data directory, shared by the host's nodes,
/// never in the database), so an unauthenticated approval posted to the
/// cluster route, or forged into the relay table, decides nothing, while
/// the nodes still hand each other what clients sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_given_no_key_act_on_nothing_unsealed() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let cluster = Cluster::start(postgres, 2, LONG_LEASE_MS, &[]);
    let key_file = cluster.data_home().join("keel").join("cluster.key");
    assert!(key_file.exists(), "the host's key was made where its nodes find it");
    let call = json!({"tool_calls": [{"id": "guarded", "name": "write_file", "arguments": {"path": "decided.txt", "content": "written"}}]});
    let model = cluster
        .scratch
        .script("unsealed.jsonl", &[&call.to_string(), r#"{"text": "Written."}"#]);
    cluster
        .api(0)
        .create(json!({"id": "unsealed", "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"}}))
        .await;
    let mut watch = cluster.api(0).stream("unsealed", Resume::Start).await;
    cluster.api(0).say("unsealed", "write it").await;
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "approval_requested"
    })
    .await;

    let forged = |submission_id: &str, op: Value| {
        json!({
            "session_id": "unsealed",
            "submission_id": submission_id,
            "idempotency_key": null,
            "submission": {"op": op, "on_busy": null},
            "sent_at_ms": keel::protocol::now_ms(),
        })
    };
    let approve = json!({"type": "approval", "call_id": "guarded", "decision": "approve"});
    let message = json!({"type": "user_input", "text": "forged"});
    for (submission_id, op) in [("forged-approval", approve.clone()), ("forged-message", message)] {
        let api = cluster.api(0);
        let request = api
            .client
            .post(api.url("/cluster/v1/forwarded"))
            .json(&forged(submission_id, op));
        let reply = api.send(request).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        assert_eq!(reply.body["reply"], "not_taken", "{submission_id}: {}", reply.body);
        assert_eq!(reply.body["reason"], "its seal does not verify", "{}", reply.body);
    }
    let shown = cluster.api(0).session("unsealed").await;
    assert_eq!(shown["state"], "awaiting_approval", "{shown}");
    let written = cluster.scratch.workspaces().join("unsealed").join("decided.txt");
    assert!(!written.exists(), "an unsealed approval ran the call");

    // A client's decision through the other node is sealed with the
    // host's key, handed over, and taken.
    let reply = cluster.api(1).submit("unsealed", json!({"op": approve})).await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
    stream_until(&mut watch, Duration::from_secs(30), |event| {
        event.msg.kind() == "turn_complete"
    })
    .await;
    assert_eq!(std::fs::read_to_string(&written).expect("written"), "written");
    let log = cluster.log("unsealed").await;
    assert_log_sound(&log);
    assert!(
        !log.iter().any(|event| event
            .submission_id
            .as_deref()
            .is_some_and(|id| id.starts_with("forged"))),
        "the forged submissions left no trace in the log"
    );
    assert!(
        !queued_texts(&log).iter().any(|text| text == "forged"),
        "the forged message was not queued"
    );
}

/// `--cluster-listen` keeps the nodes' route off the API's address: each
/// node advertises its cluster listener, a submission sent to the other
/// node is handed over there directly (no relay row), and the API's
/// address answers the route `404`, so a client that can reach the API
/// cannot even knock on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_route_can_have_a_listener_of_its_own() {
    let Some(postgres) = LocalPostgres::shared() else {
        return;
    };
    let mut cluster = Cluster::start(postgres, 0, LONG_LEASE_MS, &[]);
    let ports: Vec<u16> = (0..2).map(|_| crate::suite::support::server::free_port()).collect();
    for (index, port) in ports.iter().enumerate() {
        let listen = format!("127.0.0.1:{port}");
        cluster.start_with_token(index, TOKEN, &["--cluster-listen", &listen]);
    }
    let client = database(&cluster.url).await;
    // A node answers its API before its row is written: wait for both.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let urls = loop {
        let urls: Vec<String> = client
            .query("SELECT url FROM nodes ORDER BY node_id", &[])
            .await
            .expect("nodes")
            .iter()
            .map(|row| row.get(0))
            .collect();
        if urls.len() >= ports.len() || std::time::Instant::now() > deadline {
            break urls;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let expected: Vec<String> = ports.iter().map(|port| format!("http://127.0.0.1:{port}")).collect();
    assert_eq!(urls, expected, "each node advertises its cluster listener");

    let model = cluster.scratch.script("apart.jsonl", &[r#"{"text": "One."}"#]);
    cluster.api(0).create(json!({"id": "apart", "model": model})).await;
    cluster.api(1).say("apart", "handed over").await;
    cluster.api(0).wait_idle("apart").await;
    let metrics = cluster.api(1).metrics().await;
    assert_eq!(counter(&metrics, "keel_forwarded_submissions_total"), 1.0, "{metrics}");
    assert_eq!(counter(&metrics, "keel_forwards_not_taken_total"), 0.0, "{metrics}");
    assert_eq!(count(&client, "SELECT count(*) FROM relayed_submissions").await, 0);
    assert_eq!(queued_texts(&cluster.log("apart").await), ["handed over"]);

    for index in 0..2 {
        let api = cluster.api(index);
        let request = api.client.post(api.url("/cluster/v1/forwarded")).json(&json!({}));
        let reply = api.send(request).await;
        assert_eq!(reply.status, StatusCode::NOT_FOUND, "node {index}: {}", reply.body);
    }
    // The cluster's door takes only its route.
    let door = reqwest::get(format!("http://127.0.0.1:{}/v1/sessions", ports[0]))
        .await
        .expect("the cluster listener answers");
    assert_eq!(door.status(), StatusCode::NOT_FOUND);
}
