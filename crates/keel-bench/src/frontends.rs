//! The front-end protocols under the server workload: the same turns
//! driven as the AI SDK's `DefaultChatTransport` drives them (`POST
//! /v1/ai-sdk/chat`, the UI message stream in the answer) and as AG-UI's
//! `HttpAgent` does (`POST /v1/ag-ui`, AG-UI events in the answer, the
//! whole history resent each run), against the native API (a `POST …/submissions`
//! watched on the session's event stream).
//!
//! Each protocol's stream is a projection of the stored log, so what it
//! costs over the native stream is the projection and its framing.

use std::time::Instant;

use futures::StreamExt;
use serde_json::{Value, json};

use super::http::{TURN_TIMEOUT, check, http_error};
use keel_protocol::{Error, Result};

/// How the workload's client drives a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BenchVia {
    /// Keel's own API: a submission, the turn watched on the event stream.
    #[default]
    Native,
    /// The AI SDK's UI message stream.
    AiSdk,
    /// AG-UI.
    AgUi,
}

impl BenchVia {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            BenchVia::Native => "native",
            BenchVia::AiSdk => "ai-sdk",
            BenchVia::AgUi => "ag-ui",
        }
    }

    /// Parses a name of [`Self::name`].
    pub fn parse(name: &str) -> Result<Self> {
        [BenchVia::Native, BenchVia::AiSdk, BenchVia::AgUi]
            .into_iter()
            .find(|via| via.name() == name)
            .ok_or_else(|| Error::Config(format!("unknown protocol '{name}' (native, ai-sdk, ag-ui)")))
    }
}

/// The times of one turn, from sending its POST.
pub(super) struct TurnTimes {
    /// Until the POST was answered (`202`, or a stream's headers).
    pub(super) accept_ms: f64,
    /// Until the first text delta arrived.
    pub(super) first_delta_ms: f64,
    /// Until the turn was over.
    pub(super) turn_ms: f64,
}

/// What a protocol client keeps between turns: the thread's messages, as
/// an AG-UI client resends them every run. Kept as the JSON it sends (each
/// message appended once), so the client's own cost per run is writing
/// the bytes, not re-encoding the history: what is measured is Keel's.
#[derive(Default)]
pub(super) struct Thread {
    /// The messages as JSON, comma-separated, without the brackets.
    messages: String,
    turns: usize,
}

impl Thread {
    fn push(&mut self, message: &Value) {
        if !self.messages.is_empty() {
            self.messages.push(',');
        }
        self.messages.push_str(&message.to_string());
    }
}

/// Runs one turn of `session` over `via` (not [`BenchVia::Native`]), the
/// user saying `text`.
pub(super) async fn protocol_turn(
    via: BenchVia,
    client: &reqwest::Client,
    base: &str,
    session: &str,
    thread: &mut Thread,
    text: &str,
) -> Result<TurnTimes> {
    thread.turns += 1;
    let message_id = format!("bench-user-{}", thread.turns);
    let (url, body) = match via {
        BenchVia::AiSdk => (
            format!("{base}/v1/ai-sdk/chat"),
            // The transport sends the whole chat; the server takes the
            // trailing message (a client may trim what it resends).
            json!({
                "id": session,
                "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}],
                "trigger": "submit-message",
            })
            .to_string(),
        ),
        BenchVia::AgUi => {
            thread.push(&json!({"id": message_id, "role": "user", "content": text}));
            let head = json!({"threadId": session, "runId": format!("bench-run-{}", thread.turns)}).to_string();
            let head = head.strip_suffix('}').unwrap_or(&head);
            let tail = r#"],"tools":[],"context":[],"state":{},"forwardedProps":{}}"#;
            let mut body = String::with_capacity(head.len() + thread.messages.len() + 16 + tail.len());
            body.push_str(head);
            body.push_str(r#","messages":["#);
            body.push_str(&thread.messages);
            body.push_str(tail);
            (format!("{base}/v1/ag-ui"), body)
        }
        BenchVia::Native => return Err(Error::Config("the native API is not a protocol stream".to_owned())),
    };
    let started = Instant::now();
    let response = check(
        client
            .post(url)
            .header(reqwest::header::ACCEPT, "text/event-stream")
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await,
    )
    .await?;
    let accept_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut first_delta_ms = None;
    let mut answer = Answer::default();
    let mut frames = Frames::new(response);
    while let Some(data) = tokio::time::timeout(TURN_TIMEOUT, frames.next())
        .await
        .map_err(|_| Error::stopped(format!("no {} frame for {TURN_TIMEOUT:?}", via.name())))??
    {
        let end = match via {
            BenchVia::AiSdk => answer.ai_sdk(&data)?,
            _ => answer.ag_ui(&data)?,
        };
        if answer.has_text {
            first_delta_ms.get_or_insert_with(|| started.elapsed().as_secs_f64() * 1000.0);
        }
        if end {
            break;
        }
    }
    if !answer.ended {
        return Err(Error::stopped(format!("the {} stream ended during a turn", via.name())));
    }
    let turn_ms = started.elapsed().as_secs_f64() * 1000.0;
    // Read to the body's end, as `fetch` does, so the connection goes back
    // to the pool instead of a new one per turn.
    while tokio::time::timeout(TURN_TIMEOUT, frames.next())
        .await
        .map_err(|_| Error::stopped(format!("the {} stream did not end after its turn", via.name())))??
        .is_some()
    {}
    if via == BenchVia::AgUi {
        thread.push(&json!({
            "id": answer.message_id.unwrap_or_default(),
            "role": "assistant",
            "content": answer.text,
        }));
    }
    Ok(TurnTimes {
        accept_ms,
        first_delta_ms: first_delta_ms.unwrap_or_default(),
        turn_ms,
    })
}

/// The answer as a protocol stream tells it.
#[derive(Default)]
struct Answer {
    has_text: bool,
    text: String,
    message_id: Option<String>,
    ended: bool,
}

impl Answer {
    /// Takes in one UI message chunk; whether the stream is over.
    fn ai_sdk(&mut self, data: &str) -> Result<bool> {
        if data == "[DONE]" {
            return Ok(true);
        }
        let chunk = parse(data)?;
        match chunk["type"].as_str() {
            Some("text-delta") => self.has_text = true,
            Some("finish") => self.ended = true,
            Some(kind @ ("error" | "abort")) => {
                return Err(Error::Model(format!("the AI SDK stream sent `{kind}`: {data}")));
            }
            _ => {}
        }
        Ok(false)
    }

    /// Takes in one AG-UI event; whether the run is over.
    fn ag_ui(&mut self, data: &str) -> Result<bool> {
        let event = parse(data)?;
        match event["type"].as_str() {
            Some("TEXT_MESSAGE_START") => self.message_id = event["messageId"].as_str().map(str::to_owned),
            Some("TEXT_MESSAGE_CONTENT") => {
                self.has_text = true;
                self.text.push_str(event["delta"].as_str().unwrap_or_default());
            }
            Some("RUN_FINISHED") => {
                self.ended = true;
                return Ok(true);
            }
            Some("RUN_ERROR") => return Err(Error::Model(format!("the AG-UI run failed: {data}"))),
            _ => {}
        }
        Ok(false)
    }
}

fn parse(data: &str) -> Result<Value> {
    serde_json::from_str(data).map_err(|error| Error::Model(format!("a stream frame is not JSON ({error}): {data}")))
}

/// The `data:` of each server-sent event of a response, in order.
struct Frames {
    body: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Frames {
    fn new(response: reqwest::Response) -> Self {
        Self {
            body: response.bytes_stream().boxed(),
            buffer: Vec::new(),
        }
    }

    /// The next event's data (its `data:` lines joined); `None` at the end.
    async fn next(&mut self) -> Result<Option<String>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|window| window == b"\n\n") {
                let frame: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&frame);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .map(|value| value.strip_prefix(' ').unwrap_or(value))
                    .collect();
                if data.is_empty() {
                    continue; // a comment or a keep-alive
                }
                return Ok(Some(data.join("\n")));
            }
            match self.body.next().await {
                Some(chunk) => self.buffer.extend_from_slice(&chunk.map_err(http_error)?),
                None => return Ok(None),
            }
        }
    }
}
