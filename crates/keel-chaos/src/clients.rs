//! The load of a chaos run and its history: per session, a writer that
//! sends messages (each with an idempotency key, retried on any node until
//! one answers), steers and interrupts; a follower that streams the session
//! from any node, over SSE or a WebSocket, and resumes from the last
//! sequence it saw whenever its stream breaks; and, for sessions whose
//! shell calls need approval, an approver that approves or denies every
//! pending call from any node. Everything sent, answered and received is
//! recorded.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::nodes::Addresses;
use keel_protocol::RecordedEvent;
use keel_providers::sse::SseParser;

/// How long one request may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times a message is sent (to random nodes) before it is given up.
const ATTEMPTS: usize = 8;

/// The largest event a follower accepts.
const MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// What one attempt to submit got back.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub(super) enum Outcome {
    /// `202`.
    Accepted { submission_id: String, duplicate: bool },
    /// Another status, with its error code.
    Refused { status: u16, code: String },
    /// No answer (the connection failed or timed out).
    Failed { error: String },
}

/// One attempt, as recorded.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Attempt {
    pub(super) session_id: String,
    /// The idempotency key (`None` for control ops).
    pub(super) key: Option<String>,
    pub(super) op: Value,
    pub(super) node: usize,
    #[serde(flatten)]
    pub(super) outcome: Outcome,
}

/// What one session's clients saw.
#[derive(Debug, Default)]
pub(super) struct SessionHistory {
    pub(super) attempts: Vec<Attempt>,
    /// Every event the follower received, by sequence.
    pub(super) received: BTreeMap<u64, RecordedEvent>,
    /// Problems seen on the wire (a gap, a duplicate, an unparsable event).
    pub(super) wire_violations: Vec<String>,
    /// Times the follower's stream broke and was resumed.
    pub(super) resumes: u64,
    /// Streams the follower opened as WebSockets (the others are SSE).
    pub(super) websockets: u64,
}

/// The history of every session.
pub(super) type History = Arc<Mutex<BTreeMap<String, SessionHistory>>>;

/// What every client of one session shares: the HTTP client, the nodes'
/// addresses, the session and the history they record into.
#[derive(Clone)]
pub(super) struct SessionClients {
    pub(super) http: reqwest::Client,
    pub(super) addresses: Addresses,
    pub(super) session_id: String,
    pub(super) history: History,
}

impl SessionClients {
    /// Records into this session's history.
    fn record(&self, change: impl FnOnce(&mut SessionHistory)) {
        record(&self.history, &self.session_id, change);
    }

    /// Submits `body` (under `key`, if given) to a node `rng` picks and
    /// records the attempt; its outcome.
    async fn attempt(&self, rng: &mut StdRng, body: &Value, key: Option<&str>) -> Outcome {
        let node = rng.random_range(0..addresses_len(&self.addresses));
        let outcome = submit(&self.http, &self.addresses, node, &self.session_id, body, key).await;
        self.record(|session| {
            session.attempts.push(Attempt {
                session_id: self.session_id.clone(),
                key: key.map(str::to_owned),
                op: body.clone(),
                node,
                outcome: outcome.clone(),
            });
        });
        outcome
    }
}

/// Records into the history.
fn record(history: &History, session_id: &str, change: impl FnOnce(&mut SessionHistory)) {
    let mut all = history.lock().unwrap_or_else(|poison| poison.into_inner());
    change(all.entry(session_id.to_owned()).or_default());
}

/// Sends work to one session until `stop` says so.
pub(super) async fn write(clients: SessionClients, seed: u64, mut stop: watch::Receiver<bool>) {
    let session_id = &clients.session_id;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sent = 0u64;
    while !*stop.borrow() {
        let roll = rng.random_range(0..100);
        let (op, on_busy, keyed) = match roll {
            0..=64 => (
                json!({"type": "user_input", "text": format!("message {sent}")}),
                None,
                true,
            ),
            65..=74 => (
                json!({"type": "user_input", "text": format!("steer {sent}")}),
                Some("steer"),
                true,
            ),
            75..=84 => (
                json!({"type": "user_input", "text": format!("urgent {sent}")}),
                Some("interrupt"),
                true,
            ),
            _ => (json!({"type": "interrupt"}), None, false),
        };
        let key = keyed.then(|| format!("{session_id}-{sent}"));
        sent += 1;
        let mut body = json!({ "op": op });
        if let Some(policy) = on_busy {
            body["on_busy"] = json!(policy);
        }
        for attempt in 0..ATTEMPTS {
            let outcome = clients.attempt(&mut rng, &body, key.as_deref()).await;
            let answered = matches!(outcome, Outcome::Accepted { .. })
                || matches!(&outcome, Outcome::Refused { status, .. } if *status != 503 && *status != 500);
            // A control op is not retried: it acts at once or not at all.
            if answered || key.is_none() || *stop.borrow() {
                break;
            }
            let backoff = Duration::from_millis(100 * (attempt as u64 + 1));
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => {}
            }
        }
        let pause = Duration::from_millis(rng.random_range(50..400));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => {}
        }
    }
}

fn addresses_len(addresses: &Addresses) -> usize {
    addresses
        .read()
        .unwrap_or_else(|poison| poison.into_inner())
        .len()
        .max(1)
}

fn address(addresses: &Addresses, node: usize) -> String {
    let addresses = addresses.read().unwrap_or_else(|poison| poison.into_inner());
    addresses.get(node).or(addresses.first()).cloned().unwrap_or_default()
}

async fn submit(
    client: &reqwest::Client,
    addresses: &Addresses,
    node: usize,
    session_id: &str,
    body: &Value,
    key: Option<&str>,
) -> Outcome {
    let url = format!("{}/v1/sessions/{session_id}/submissions", address(addresses, node));
    let mut request = client.post(url).json(body).timeout(REQUEST_TIMEOUT);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            return Outcome::Failed {
                error: error.to_string(),
            };
        }
    };
    let status = response.status().as_u16();
    let body: Value = match response.json().await {
        Ok(body) => body,
        Err(error) => {
            return Outcome::Failed {
                error: error.to_string(),
            };
        }
    };
    if status == 202 {
        return Outcome::Accepted {
            submission_id: body["submission_id"].as_str().unwrap_or_default().to_owned(),
            duplicate: body["duplicate"].as_bool().unwrap_or(false),
        };
    }
    Outcome::Refused {
        status,
        code: body["error"]["code"].as_str().unwrap_or_default().to_owned(),
    }
}

/// Follows one session's stream from any node, over SSE or a WebSocket
/// at random, resuming after every break, until `stop` says so; returns
/// once stopped.
pub(super) async fn follow(clients: SessionClients, seed: u64, stop: watch::Receiver<bool>) {
    let SessionClients {
        http: client,
        addresses,
        session_id,
        history,
    } = clients;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut last = 0u64;
    let mut first = true;
    while !*stop.borrow() {
        let node = rng.random_range(0..addresses_len(&addresses));
        let websocket = rng.random_bool(0.5);
        let base = address(&addresses, node);
        if !first {
            record(&history, &session_id, |session| session.resumes += 1);
        }
        first = false;
        if websocket {
            record(&history, &session_id, |session| session.websockets += 1);
            let url = format!(
                "{}/v1/sessions/{session_id}/ws?after={last}",
                base.replacen("http://", "ws://", 1)
            );
            if let Ok(Ok((socket, _))) =
                tokio::time::timeout(REQUEST_TIMEOUT, tokio_tungstenite::connect_async(url)).await
            {
                read_socket(socket, &session_id, &mut last, &history, stop.clone()).await;
            }
        } else {
            let response = client
                .get(format!("{base}/v1/sessions/{session_id}/events/stream"))
                .header("accept", "text/event-stream")
                .header("last-event-id", last.to_string())
                .send()
                .await;
            if let Ok(response) = response
                && response.status().is_success()
            {
                read(response, &session_id, &mut last, &history, stop.clone()).await;
            }
        }
        if *stop.borrow() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads an SSE stream until it breaks or `stop` says so.
async fn read(
    response: reqwest::Response,
    session_id: &str,
    last: &mut u64,
    history: &History,
    mut stop: watch::Receiver<bool>,
) {
    let mut parser = SseParser::new(MAX_EVENT_BYTES);
    let mut body = response.bytes_stream();
    let mut events = Vec::new();
    loop {
        let chunk = tokio::select! {
            chunk = body.next() => chunk,
            _ = stop.changed() => return,
        };
        let Some(Ok(chunk)) = chunk else { return };
        events.clear();
        if parser.push(&chunk, &mut events).is_err() {
            record(history, session_id, |session| {
                session.wire_violations.push("a malformed event stream".to_owned());
            });
            return;
        }
        for event in &events {
            // Comments and keep-alives carry no event.
            if let Ok(recorded) = serde_json::from_str::<RecordedEvent>(&event.data) {
                receive(history, session_id, last, recorded);
            }
        }
    }
}

/// Reads a WebSocket until it closes or `stop` says so.
async fn read_socket(
    mut socket: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    session_id: &str,
    last: &mut u64,
    history: &History,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let frame = tokio::select! {
            frame = socket.next() => frame,
            _ = stop.changed() => return,
        };
        match frame {
            Some(Ok(Message::Text(text))) => match serde_json::from_str::<RecordedEvent>(&text) {
                Ok(recorded) => receive(history, session_id, last, recorded),
                Err(error) => record(history, session_id, |session| {
                    session
                        .wire_violations
                        .push(format!("a WebSocket frame that is no event: {error}"));
                }),
            },
            Some(Ok(Message::Binary(_))) => {
                record(history, session_id, |session| {
                    session.wire_violations.push("a binary WebSocket frame".to_owned());
                });
                return;
            }
            // Pings are answered by the library.
            Some(Ok(_)) => {}
            None | Some(Err(_)) => return,
        }
    }
}

/// Records an event a follower received, checking it comes right after the
/// last one.
fn receive(history: &History, session_id: &str, last: &mut u64, recorded: RecordedEvent) {
    let expected = *last + 1;
    *last = (*last).max(recorded.sequence);
    record(history, session_id, |session| {
        if recorded.sequence != expected {
            session.wire_violations.push(format!(
                "streamed sequence {} where {expected} was due",
                recorded.sequence
            ));
        }
        session.received.insert(recorded.sequence, recorded);
    });
}

/// Decides every pending approval of one session, from any node, until
/// `stop` says so: most calls are approved, some denied. A decision that
/// gets no answer is made again once the call still shows as pending.
pub(super) async fn approve(clients: SessionClients, seed: u64, mut stop: watch::Receiver<bool>) {
    let SessionClients {
        http: client,
        addresses,
        session_id,
        ..
    } = &clients;
    let mut rng = StdRng::seed_from_u64(seed);
    while !*stop.borrow() {
        let pause = Duration::from_millis(rng.random_range(100..400));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
        let node = rng.random_range(0..addresses_len(addresses));
        let url = format!("{}/v1/sessions/{session_id}", address(addresses, node));
        let Ok(response) = client.get(url).timeout(REQUEST_TIMEOUT).send().await else {
            continue;
        };
        let Ok(shown) = response.json::<Value>().await else {
            continue;
        };
        let pending: Vec<String> = shown["pending_approvals"]
            .as_array()
            .map(|calls| calls.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        for call_id in pending {
            let decision = if rng.random_range(0..5) == 0 { "deny" } else { "approve" };
            let body = json!({"op": {"type": "approval", "call_id": call_id, "decision": decision}});
            clients.attempt(&mut rng, &body, None).await;
        }
    }
}
