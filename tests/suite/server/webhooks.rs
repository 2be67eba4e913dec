//! Webhooks, judged by a receiver that verifies every delivery with the
//! Standard Webhooks reference library (`receiver.py`, from the pinned
//! Python environment) and approves each approval request it is sent
//! through the API: deliveries survive `kill -9`, keep their id when
//! redelivered, arrive in sequence order per session, and carry
//! signatures the library verifies, also during a secret's rotation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use keel::config::WebhooksConfig;
use keel::protocol::RecordedEvent;
use rand::{RngExt, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::support::api::{Api, metric};
use crate::suite::support::python::venv_python;
use crate::suite::support::server::{Scratch, ServeProcess, TestServer, free_port};
use crate::suite::support::wait::{HANG_GUARD, wait_for, wait_until_async};

/// The signing secret of the tests' endpoint (`whsec_` and 24 bytes).
pub(crate) const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The variable `keel.toml` names for it.
pub(crate) const SECRET_ENV: &str = "KEEL_TEST_WEBHOOK_SECRET";

/// The receiver (`receiver.py`) as a process.
pub(crate) struct Receiver {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Receiver {
    /// Starts it with `python`, approving through `keel_url` (a URL or a
    /// file that will hold one), answering
    /// `fail_percent` of the deliveries 500 at random.
    pub(crate) fn start(python: &Path, dir: &Path, secret: &str, keel_url: &str, fail_percent: u8) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/server/webhooks/receiver.py");
        let port_file = dir.join("receiver.port");
        let log = dir.join("receiver.jsonl");
        let child = Command::new(python)
            .arg(script)
            .arg(&port_file)
            .arg(&log)
            .arg(secret)
            .arg(keel_url)
            .arg(fail_percent.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the receiver");
        let port = wait_for("the receiver to listen", HANG_GUARD, || {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|port| port.trim().parse().ok())
        });
        Self { child, port, log }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    /// Every request it logged, in arrival order.
    pub(crate) fn entries(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).expect("a log line"))
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `keel.toml` for an endpoint at `url` receiving `types`, with quick
/// retries.
pub(crate) fn keel_toml(url: &str, types: &[&str]) -> String {
    format!(
        r#"[webhooks]
allow_http = true
allow_private = ["127.0.0.1/32"]
timeout_ms = 3000
first_backoff_ms = 100
max_backoff_ms = 400

[webhooks.endpoints.judge]
url = "{url}"
secret_env = "{SECRET_ENV}"
event_types = {types:?}
"#
    )
}

/// `keel serve` on `port` with `keel.toml` and the secret in its
/// environment.
fn serve(scratch: &Scratch, port: u16) -> ServeProcess {
    let listen = format!("127.0.0.1:{port}");
    let mut command = ServeProcess::command(scratch, &["--listen", &listen, "--config", "keel.toml"]);
    command.env(SECRET_ENV, SECRET);
    ServeProcess::spawn(command)
}

/// A script whose model asks for a tool call needing approval, then
/// answers, `turns` times over (the position survives restarts).
pub(crate) fn approval_script(scratch: &Scratch, turns: usize) -> String {
    let mut lines = Vec::new();
    for turn in 0..turns {
        lines.push(
            json!({"tool_calls": [{"id": format!("call-{turn}"), "name": "write_file",
            "arguments": {"path": format!("f{turn}.txt"), "content": "x"}}]}),
        );
        lines.push(json!({"text": format!("wrote {turn}")}));
    }
    scratch.script_of("approvals.jsonl", &lines)
}

/// The verified deliveries of the log, by webhook id: the bodies each
/// carried (one per arrival).
pub(crate) fn verified_by_id(entries: &[Value]) -> BTreeMap<String, Vec<Value>> {
    let mut by_id: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for entry in entries.iter().filter(|entry| entry["ok"] == true) {
        let body: Value = serde_json::from_str(entry["body"].as_str().expect("a body")).expect("JSON");
        by_id
            .entry(entry["id"].as_str().expect("an id").to_owned())
            .or_default()
            .push(body);
    }
    by_id
}

/// The approval requests of the stored logs, as `(session, sequence)`.
pub(crate) fn approval_requests(logs: &HashMap<String, Vec<RecordedEvent>>) -> HashSet<(String, u64)> {
    logs.iter()
        .flat_map(|(session, events)| {
            events
                .iter()
                .filter(|event| event.msg.kind() == "approval_requested")
                .map(move |event| (session.clone(), event.sequence))
        })
        .collect()
}

/// Waits until every one of `sessions` is idle with nothing queued (its
/// approvals came through the receiver); says where each stands if not.
pub(crate) async fn all_idle(api: &Api, sessions: &[String], receiver: &Receiver) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut busy = Vec::new();
        for session in sessions {
            let shown = api.session(session).await;
            if shown["state"] != "idle" || shown["queued"] != 0 {
                busy.push(shown);
            }
        }
        if busy.is_empty() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let ids: Vec<&str> = busy.iter().filter_map(|shown| shown["id"].as_str()).collect();
            let deliveries = api.get("/v1/webhooks/judge/deliveries").await;
            let theirs: Vec<&Value> = deliveries.body["deliveries"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|delivery| delivery["session_id"].as_str().is_some_and(|id| ids.contains(&id)))
                .collect();
            let received: Vec<Value> = receiver
                .entries()
                .into_iter()
                .filter(|entry| {
                    ids.iter()
                        .any(|id| entry["body"].as_str().is_some_and(|body| body.contains(id)))
                })
                .collect();
            let mut logs = Vec::new();
            for id in &ids {
                let events = api.get(&format!("/v1/sessions/{id}/events?limit=1000")).await;
                logs.push(events.body);
            }
            panic!(
                "sessions still busy: {busy:#?}\ntheir deliveries: {theirs:#?}\nreceived: {received:#?}\nlogs: {:#}",
                Value::Array(logs)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_requests_reach_a_verifying_receiver_once_each_in_order_through_kill_9() {
    let Some(python) = venv_python("suite::server::webhooks (kill -9)") else {
        return;
    };
    let scratch = Scratch::new();
    let port = free_port();
    let keel_url = format!("http://127.0.0.1:{port}");
    let receiver = Receiver::start(&python, scratch.dir.path(), SECRET, &keel_url, 20);
    std::fs::write(
        scratch.dir.path().join("keel.toml"),
        keel_toml(&receiver.url(), &["approval_requested", "turn_complete"]),
    )
    .expect("write keel.toml");
    let model = approval_script(&scratch, 60);
    let mut server = serve(&scratch, port);
    let sessions: Vec<String> = (0..10).map(|n| format!("hooked-{n}")).collect();
    for session in &sessions {
        server
            .api
            .create(
                json!({"id": session, "model": model, "tools": {"shell": false}, "approvals": {"default": "ask"},
                "queue_mode": "each"}),
            )
            .await;
        for message in 0..10 {
            let reply = server
                .api
                .submit(
                    session,
                    json!({"op": {"type": "user_input", "text": format!("write {message}")}}),
                )
                .await;
            assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        }
    }
    // Kill -9 at random moments while the turns, their webhooks and the
    // receiver's approvals go on, restarting on the same port.
    let mut rng = rand::rngs::StdRng::seed_from_u64(25);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
        let crashed = server;
        tokio::task::spawn_blocking(move || crashed.crash())
            .await
            .expect("crash");
        server = serve(&scratch, port);
    }
    all_idle(&server.api, &sessions, &receiver).await;
    // Turns a crash cut before their approval request asked for none: top
    // up to 100 approval requests, one more message at a time.
    let requested = async |server: &ServeProcess| {
        let mut total = 0;
        for session in &sessions {
            let reply = server
                .api
                .get(&format!("/v1/sessions/{session}/events?limit=1000"))
                .await;
            let events: Vec<RecordedEvent> = serde_json::from_value(reply.body["events"].clone()).expect("events");
            total += events
                .iter()
                .filter(|event| event.msg.kind() == "approval_requested")
                .count();
        }
        total
    };
    let mut total = requested(&server).await;
    let mut next = 0;
    while total < 100 {
        let session = &sessions[next % sessions.len()];
        next += 1;
        server
            .api
            .submit(session, json!({"op": {"type": "user_input", "text": "one more"}}))
            .await;
        all_idle(&server.api, std::slice::from_ref(session), &receiver).await;
        total = requested(&server).await;
    }
    assert_eq!(total, 100, "top-ups ask one approval each");
    // Every delivery has arrived once its pending count is zero.
    wait_until_async("every delivery to be delivered", HANG_GUARD, async || {
        let reply = server.api.get("/v1/webhooks/judge/deliveries?state=pending").await;
        reply.status == StatusCode::OK && reply.body["deliveries"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let failed = server.api.get("/v1/webhooks/judge/deliveries?state=failed").await;
    assert_eq!(failed.body["deliveries"], json!([]), "none given up on");
    let (status, stderr) = tokio::task::spawn_blocking(move || server.terminate())
        .await
        .expect("terminate");
    assert!(status.success(), "{status}");
    assert!(
        !stderr
            .iter()
            .any(|line| line.contains("webhook") && line.contains("WARN")),
        "{stderr:#?}"
    );

    let mut logs = HashMap::new();
    for session in &sessions {
        logs.insert(session.clone(), scratch.stored(session).await);
    }
    judge(&receiver.entries(), &logs, 100, 3);
}

/// Settings for an in-process server whose endpoints may be plain HTTP,
/// on loopback only if `loopback`.
fn settings(loopback: bool) -> WebhooksConfig {
    WebhooksConfig {
        allow_http: true,
        allow_private: if loopback {
            vec!["127.0.0.1/32".parse().expect("network")]
        } else {
            Vec::new()
        },
        timeout_ms: 2_000,
        retry_for_s: 1,
        first_backoff_ms: 100,
        max_backoff_ms: 200,
        ..WebhooksConfig::default()
    }
}

/// A session on `server` answering `turns` plain texts.
async fn chatty_session(server: &TestServer, id: &str, turns: usize) {
    let lines: Vec<Value> = (0..turns)
        .map(|turn| json!({"text": format!("answer {turn}")}))
        .collect();
    let model = server.scratch.script_of(&format!("{id}.jsonl"), &lines);
    server.api.create(json!({"id": id, "model": model})).await;
}

async fn deliveries(server: &TestServer, endpoint: &str, state: &str) -> Vec<Value> {
    let reply = server
        .api
        .get(&format!("/v1/webhooks/{endpoint}/deliveries?state={state}"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    reply.body["deliveries"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_that_would_reach_the_operators_network_are_refused_before_and_after_dns() {
    let server = TestServer::start(|config, _| config.keel.webhooks = settings(false)).await;
    // Refused by the [webhooks] settings: 403, nothing stored.
    for url in [
        "ftp://hooks.example.com/x",
        "https://127.0.0.1/x",
        "http://[::1]:9/x",
        "http://169.254.169.254/latest/meta-data",
        "http://[::ffff:10.1.2.3]/x",
        "http://[::ffff:0:127.0.0.1]/x",
        "http://2130706433/x",
        "https://user:secret@hooks.example.com/x",
        "not a url",
        // Past the description's 2,048 bytes (schemathesis sent one, and it
        // was stored), or with white space the parser would encode.
        &format!("https://hooks.example.com/{}", "a".repeat(2048)),
        "https://hooks.example.com/a b",
    ] {
        let reply = server
            .api
            .post("/v1/webhooks", &json!({"url": url, "event_types": ["turn_complete"]}))
            .await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{url}: {}", reply.body);
        assert_eq!(reply.code(), "webhook_url_refused", "{url}: {}", reply.body);
    }
    // Malformed: 400.
    for body in [
        json!({"url": "https://hooks.example.com/x", "event_types": []}),
        json!({"url": "https://hooks.example.com/x", "event_types": ["user_message"]}),
        json!({"url": "https://hooks.example.com/x", "event_types": ["turn_complete"], "secret": "mine"}),
        // What the description's constraints refuse.
        json!({"url": "https://hooks.example.com/x", "event_types": ["turn_complete"], "bot_id": "a/b"}),
        json!({"url": "https://hooks.example.com/x", "event_types": ["turn_complete"], "tenant": "a%b"}),
        json!({"url": "https://hooks.example.com/x", "event_types": ["turn_complete"], "description": "a\u{7}b"}),
        json!({"url": "https://hooks.example.com/x", "event_types": ["turn_complete"], "description": "d".repeat(257)}),
    ] {
        let reply = server.api.post("/v1/webhooks", &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}: {}", reply.body);
        assert_eq!(reply.code(), "invalid_request", "{body}: {}", reply.body);
    }
    let listed = server.api.get("/v1/webhooks").await;
    assert_eq!(listed.body["webhooks"], json!([]), "nothing was stored");

    // A name passes registration; it resolves to loopback, which the
    // client's resolver refuses at every attempt: nothing connects, and the
    // delivery fails, visibly, once its retries are over.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let made = server
        .api
        .post(
            "/v1/webhooks",
            &json!({"url": format!("http://localhost:{port}/hook"), "event_types": ["turn_complete"]}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let id = made.body["id"].as_str().expect("an id").to_owned();
    chatty_session(&server, "dns", 1).await;
    server.api.say("dns", "hello").await;
    server.api.wait_idle("dns").await;
    wait_until_async("the delivery to fail", HANG_GUARD, async || {
        !deliveries(&server, &id, "failed").await.is_empty()
    })
    .await;
    let failed = deliveries(&server, &id, "failed").await;
    assert_eq!(failed.len(), 1, "{failed:#?}");
    let error = failed[0]["last_error"].as_str().expect("an error");
    assert!(error.contains("not public"), "{error}");
    assert!(failed[0]["attempts"].as_u64().expect("attempts") >= 2, "{failed:#?}");
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "a delivery connected to loopback");
    let metrics = server.api.metrics().await;
    assert!(
        metric(&metrics, r#"keel_webhook_attempts_total{outcome="failed"}"#).is_some_and(|failed| failed >= 1.0),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_new_one_until_it_expires() {
    let Some(python) = venv_python("suite::server::webhooks (rotation)") else {
        return;
    };
    let server = TestServer::start(|config, _| config.keel.webhooks = settings(true)).await;
    let secrets = server.scratch.dir.path().join("secrets");
    std::fs::write(&secrets, "").expect("write the secrets");
    let receiver = Receiver::start(
        &python,
        server.scratch.dir.path(),
        &secrets.display().to_string(),
        &server.api.base,
        0,
    );
    let made = server
        .api
        .post(
            "/v1/webhooks",
            &json!({"url": receiver.url(), "event_types": ["turn_complete"], "description": "the judge"}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let id = made.body["id"].as_str().expect("an id").to_owned();
    let first = made.body["secret"].as_str().expect("a secret").to_owned();
    assert!(first.starts_with("whsec_"), "{first}");
    // Listings never show a secret.
    let listed = server.api.get("/v1/webhooks").await;
    assert!(!listed.body.to_string().contains(&first[6..]), "{}", listed.body);
    std::fs::write(&secrets, format!("{first}\n")).expect("write the secrets");
    chatty_session(&server, "rotating", 4).await;
    let turn = async |text: &str, count: usize| {
        server.api.say("rotating", text).await;
        server.api.wait_idle("rotating").await;
        wait_for("the delivery to arrive", HANG_GUARD, || {
            let entries = receiver.entries();
            (entries.len() >= count).then_some(entries)
        })
    };
    let entries = turn("one", 1).await;
    assert_eq!(entries[0]["verified"], json!([true]));

    let rotated = server
        .api
        .post(
            &format!("/v1/webhooks/{id}/rotate"),
            &json!({"previous_valid_for_s": 2}),
        )
        .await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.body);
    let second = rotated.body["secret"].as_str().expect("a secret").to_owned();
    assert_ne!(first, second);
    let expiries = rotated.body["secrets_expire_at_ms"]
        .as_array()
        .expect("expiries")
        .clone();
    assert_eq!(expiries.len(), 2);
    assert!(expiries[0].is_null() && expiries[1].is_u64(), "{expiries:?}");
    // During the overlap, each secret verifies on its own.
    std::fs::write(&secrets, format!("{first}\n{second}\n")).expect("write the secrets");
    let entries = turn("two", 2).await;
    assert_eq!(entries[1]["verified"], json!([true, true]));
    // After it, only the new one signs.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    std::fs::write(&secrets, format!("{second}\n{first}\n")).expect("write the secrets");
    let entries = turn("three", 3).await;
    assert_eq!(entries[2]["verified"], json!([true, false]));
    assert!(entries.iter().all(|entry| entry["status"] == 204), "{entries:#?}");

    // A deleted endpoint gets nothing more, and is gone.
    let deleted = server.api.delete(&format!("/v1/webhooks/{id}")).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.body);
    server.api.say("rotating", "four").await;
    server.api.wait_idle("rotating").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.entries().len(), 3);
    let shown = server.api.get(&format!("/v1/webhooks/{id}")).await;
    assert_eq!(shown.status, StatusCode::NOT_FOUND, "{}", shown.body);
    server.stop().await;
}

/// What the receiver's log must show against the stored `logs`: every
/// signature verified; redeliveries under their id with the same body;
/// each approval request delivered (`approvals_expected` of them after
/// deduplication) and each body its stored event; per session, arrivals
/// never going back in sequence; and each turn that asked completed, but
/// for at most `cuts_allowed` cut by a crash.
pub(crate) fn judge(
    entries: &[Value],
    logs: &HashMap<String, Vec<RecordedEvent>>,
    approvals_expected: usize,
    cuts_allowed: usize,
) {
    // Every signature verified, with the reference library.
    let refused: Vec<&Value> = entries.iter().filter(|entry| entry["ok"] != true).collect();
    assert!(refused.is_empty(), "{refused:#?}");
    let by_id = verified_by_id(entries);
    // Redeliveries keep their id and carry the same body.
    let redelivered = by_id.values().filter(|bodies| bodies.len() > 1).count();
    assert!(redelivered > 0, "the receiver's 500s made redeliveries");
    for (id, bodies) in &by_id {
        assert!(bodies.iter().all(|body| body == &bodies[0]), "{id}: {bodies:#?}");
    }
    // Each approval request arrived, under one id: 100 after deduplication.
    let approvals: HashSet<(String, u64)> = by_id
        .values()
        .map(|bodies| &bodies[0])
        .filter(|body| body["type"] == "approval_requested")
        .map(|body| {
            (
                body["data"]["session_id"].as_str().expect("session").to_owned(),
                body["data"]["event"]["sequence"].as_u64().expect("sequence"),
            )
        })
        .collect();
    assert_eq!(approvals.len(), approvals_expected);
    assert_eq!(approvals, approval_requests(logs));
    // Each delivery's body is its stored event.
    for body in by_id.values().map(|bodies| &bodies[0]) {
        let session = body["data"]["session_id"].as_str().expect("session");
        let sequence = body["data"]["event"]["sequence"].as_u64().expect("sequence");
        let stored = logs[session]
            .iter()
            .find(|event| event.sequence == sequence)
            .expect("a stored event");
        assert_eq!(body["data"]["event"], serde_json::to_value(stored).expect("JSON"));
        assert_eq!(body["type"], stored.msg.kind());
    }
    // Per session, arrivals never go back in sequence (a redelivery comes
    // before anything later).
    let mut last: HashMap<String, u64> = HashMap::new();
    for entry in entries.iter().filter(|entry| entry["ok"] == true) {
        let body: Value = serde_json::from_str(entry["body"].as_str().expect("body")).expect("JSON");
        let session = body["data"]["session_id"].as_str().expect("session").to_owned();
        let sequence = body["data"]["event"]["sequence"].as_u64().expect("sequence");
        let previous = last.insert(session.clone(), sequence).unwrap_or(0);
        assert!(sequence >= previous, "{session}: {sequence} arrived after {previous}");
    }
    // Approving from the receiver completed each turn that asked, except
    // one a crash cut (at most one per kill).
    let mut cut = 0;
    for (session, events) in logs {
        for request in events.iter().filter(|event| event.msg.kind() == "approval_requested") {
            let ended = events
                .iter()
                .find(|event| event.sequence > request.sequence && crate::suite::support::events::ends_turn(event))
                .unwrap_or_else(|| panic!("{session}: the turn at {} never ended", request.sequence));
            if ended.msg.kind() != "turn_complete" {
                cut += 1;
            }
        }
    }
    assert!(cut <= cuts_allowed, "{cut} approved turns did not complete");
}

/// `session_idle` comes with a turn's end only when nothing is queued
/// after it: a turn that ends with a message waiting is `turn_complete`
/// alone, the last one is `turn_complete` and then `session_idle`, both
/// carrying that event. (The deliveries are listed, not received: nothing
/// listens at the endpoint.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_idle_follows_a_turns_end_only_when_nothing_is_queued() {
    let server = TestServer::start(|config, _| config.keel.webhooks = settings(true)).await;
    let url = format!("http://127.0.0.1:{}/hook", free_port());
    let made = server
        .api
        .post(
            "/v1/webhooks",
            &json!({"url": url, "event_types": ["turn_complete", "session_idle"]}),
        )
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let id = made.body["id"].as_str().expect("an id").to_owned();
    let slow: Value = serde_json::from_str(&crate::suite::support::server::slow_chunks(20, 50)).expect("JSON");
    let model = server
        .scratch
        .script_of("idling.jsonl", &[slow, json!({"text": "two"})]);
    server.api.create(json!({"id": "idling", "model": model})).await;
    server.api.say("idling", "one").await;
    let queued = server
        .api
        .submit(
            "idling",
            json!({"op": {"type": "user_input", "text": "two"}, "on_busy": "queue"}),
        )
        .await;
    assert_eq!(queued.status, StatusCode::ACCEPTED, "{}", queued.body);
    server.api.wait_idle("idling").await;
    let log = server.api.get("/v1/sessions/idling/events?limit=1000").await;
    let log: Vec<RecordedEvent> = serde_json::from_value(log.body["events"].clone()).expect("events");
    let ends: Vec<u64> = log
        .iter()
        .filter(|event| event.msg.kind() == "turn_complete")
        .map(|event| event.sequence)
        .collect();
    assert_eq!(ends.len(), 2, "{ends:?}");
    let listed = server.api.get(&format!("/v1/webhooks/{id}/deliveries")).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.body);
    let made: Vec<(u64, String)> = listed.body["deliveries"]
        .as_array()
        .expect("deliveries")
        .iter()
        .map(|delivery| {
            (
                delivery["sequence"].as_u64().expect("sequence"),
                delivery["event_type"].as_str().expect("type").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        made,
        [
            (ends[0], "turn_complete".to_owned()),
            (ends[1], "turn_complete".to_owned()),
            (ends[1], "session_idle".to_owned()),
        ],
        "{}",
        listed.body
    );
    server.stop().await;
}
