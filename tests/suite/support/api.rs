//! An HTTP client for a keel server, as an application would use it: JSON
//! requests, and an event stream read with the product's own SSE parser.

use std::collections::VecDeque;

use keel::protocol::RecordedEvent;
use keel::provider::sse::{SseEvent, SseParser};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::wait::{HANG_GUARD, guard, wait_until_async};

/// An HTTP client for one server.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) base: String,
    pub(crate) client: reqwest::Client,
    pub(crate) token: Option<String>,
}

/// A response: status and JSON body (`Value::Null` when not JSON).
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
}

impl Reply {
    /// The error code of an error body.
    pub(crate) fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

impl Api {
    pub(crate) fn new(base: String) -> Self {
        Self {
            base,
            client: reqwest::Client::new(),
            token: None,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    pub(crate) async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = guard("an HTTP request", self.authorize(request).send())
            .await
            .expect("send the request");
        let status = response.status();
        let bytes = response.bytes().await.expect("read the body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply { status, body }
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        self.send(self.client.get(self.url(path))).await
    }

    pub(crate) async fn post(&self, path: &str, body: &Value) -> Reply {
        self.send(self.client.post(self.url(path)).json(body)).await
    }

    pub(crate) async fn patch(&self, path: &str, body: &Value) -> Reply {
        self.send(self.client.patch(self.url(path)).json(body)).await
    }

    pub(crate) async fn delete(&self, path: &str) -> Reply {
        self.send(self.client.delete(self.url(path))).await
    }

    /// Creates a session; it must answer `201`.
    pub(crate) async fn create(&self, body: Value) -> Value {
        let reply = self.post("/v1/sessions", &body).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        reply.body
    }

    /// Submits a user message; it must answer `202`.
    pub(crate) async fn say(&self, session_id: &str, text: &str) -> Value {
        let reply = self
            .submit(session_id, json!({"op": {"type": "user_input", "text": text}}))
            .await;
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.body);
        reply.body
    }

    pub(crate) async fn submit(&self, session_id: &str, body: Value) -> Reply {
        self.post(&format!("/v1/sessions/{session_id}/submissions"), &body)
            .await
    }

    /// The session as `GET /v1/sessions/{id}` shows it.
    pub(crate) async fn session(&self, session_id: &str) -> Value {
        let reply = self.get(&format!("/v1/sessions/{session_id}")).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
        reply.body
    }

    /// An event stream of the session from `after`.
    pub(crate) async fn stream(&self, session_id: &str, after: Resume) -> SseStream {
        let path = format!("/v1/sessions/{session_id}/events/stream");
        let request = match after {
            Resume::Start => self.client.get(self.url(&path)),
            Resume::After(after) => self.client.get(self.url(&format!("{path}?after={after}"))),
            Resume::LastEventId(id) => self.client.get(self.url(&path)).header("last-event-id", id.to_string()),
        }
        .header("accept", "text/event-stream");
        let response = guard("opening an event stream", self.authorize(request).send())
            .await
            .expect("open the event stream");
        assert_eq!(response.status(), StatusCode::OK);
        SseStream::new(response)
    }

    /// The server's metrics text.
    pub(crate) async fn metrics(&self) -> String {
        let response = guard(
            "GET /metrics",
            self.authorize(self.client.get(self.url("/metrics"))).send(),
        )
        .await
        .expect("GET /metrics");
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.expect("metrics text")
    }

    /// The output of the session's first completed tool call, waited for
    /// (a minute at most).
    pub(crate) async fn first_tool_output(&self, session_id: &str) -> String {
        let path = format!("/v1/sessions/{session_id}/events?limit=1000");
        super::wait::wait_for_async(
            "the tool call to complete",
            std::time::Duration::from_secs(60),
            async || {
                let events = self.get(&path).await;
                let completed = events.body["events"].as_array().and_then(|events| {
                    events
                        .iter()
                        .find(|event| event["msg"]["type"] == "tool_call_completed")
                        .cloned()
                });
                completed.map(|event| event["msg"]["output"].as_str().unwrap_or_default().to_owned())
            },
        )
        .await
    }

    /// Waits until the session's `state` is `idle` and nothing is queued.
    pub(crate) async fn wait_idle(&self, session_id: &str) {
        wait_until_async("the session to become idle", HANG_GUARD, async || {
            let session = self.session(session_id).await;
            session["state"] == "idle" && session["queued"] == 0
        })
        .await;
    }
}

/// Where a stream resumes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resume {
    Start,
    After(u64),
    LastEventId(u64),
}

/// An event stream being read.
pub(crate) struct SseStream {
    response: reqwest::Response,
    parser: SseParser,
    ready: VecDeque<SseEvent>,
}

impl SseStream {
    pub(crate) fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            parser: SseParser::new(64 * 1024 * 1024),
            ready: VecDeque::new(),
        }
    }

    /// The next event, or `None` when the stream ended.
    pub(crate) async fn next(&mut self) -> Option<RecordedEvent> {
        let event = self.next_sse().await?;
        let recorded: RecordedEvent = serde_json::from_str(&event.data).expect("event JSON");
        assert_eq!(
            event.event.as_deref(),
            Some(recorded.msg.kind()),
            "the SSE event name is the type"
        );
        Some(recorded)
    }

    /// The next SSE event as sent, or `None` when the stream ended.
    pub(crate) async fn next_sse(&mut self) -> Option<SseEvent> {
        guard("the next streamed event", async {
            loop {
                if let Some(event) = self.ready.pop_front() {
                    return Some(event);
                }
                let chunk = self.response.chunk().await.ok()??;
                let mut events = Vec::new();
                self.parser.push(&chunk, &mut events).expect("a well-formed stream");
                self.ready.extend(events);
            }
        })
        .await
    }

    /// Reads up to and including the first event `stop` picks.
    pub(crate) async fn until(&mut self, mut stop: impl FnMut(&RecordedEvent) -> bool) -> Vec<RecordedEvent> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.expect("the stream ended early");
            let done = stop(&event);
            events.push(event);
            if done {
                return events;
            }
        }
    }

    /// Reads up to and including the `n`th event that ends a turn.
    pub(crate) async fn turns(&mut self, n: usize) -> Vec<RecordedEvent> {
        let mut seen = 0;
        self.until(move |event| {
            if event.msg.ends_turn() {
                seen += 1;
            }
            seen == n
        })
        .await
    }
}

/// The value of the unlabelled metric `name` in Prometheus text, if it is
/// there.
pub(crate) fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// [`metric`], which must be there.
pub(crate) fn metric_value(text: &str, name: &str) -> f64 {
    metric(text, name).unwrap_or_else(|| panic!("no {name} in\n{text}"))
}
