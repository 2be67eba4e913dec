//! A turn's UI message stream, read from the log: replayed from the turn's
//! start, then followed live, so a reconnecting client (on any node, after
//! any restart) gets the whole message again, and a slow one only reads
//! the log later.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt as _};
use keel_projections::ai_sdk::{DONE, Projection};
use keel_protocol::{EventMsg, RecordedEvent};
use keel_store::{EventPageRequest, MAX_EVENT_PAGE};

use crate::Server;
use crate::auth::Liveness;
use crate::error::ApiError;
use crate::fanout::Subscription;

/// How long a stream that reached a wait for the client (an approval, a
/// client tool) looks for more events of the same commit before it ends:
/// the requests of one model step are committed together, so they arrive
/// together.
const WAIT_SETTLE: Duration = Duration::from_millis(50);

/// The header that tells the `ai` package the body is a UI message stream.
const STREAM_HEADER: &str = "x-vercel-ai-ui-message-stream";

/// Where to read a turn from: the events after `after`, those up to
/// `silent_until` only building the projection's state (the client has
/// their chunks already).
pub(crate) struct Replay {
    /// Subscribe after this sequence.
    pub(crate) after: u64,
    /// Events up to this sequence are not sent (`0`: all are).
    pub(crate) silent_until: u64,
}

/// The SSE answer carrying `projection`'s chunks from the log of `session_id`,
/// ending with `[DONE]` when the turn ends or waits for the client. `early`
/// is a subscription taken before the submission (it sees every event
/// `replay` asks for without reading the store); without one, the stream
/// subscribes after `replay.after`.
pub(crate) fn response(
    server: &Server,
    session_id: &str,
    projection: Projection,
    replay: Replay,
    early: Option<Subscription>,
    liveness: Liveness,
) -> Response {
    let subscription = early.unwrap_or_else(|| server.host.subscribe(session_id, replay.after));
    let pump = Pump {
        subscription,
        projection,
        silent_until: replay.silent_until,
        queue: VecDeque::new(),
        done: false,
    };
    let keep_alive = KeepAlive::new().interval(server.keep_alive).text("keep-alive");
    let frames = frames(pump).take_until(liveness.ended());
    let mut response = Sse::new(frames).keep_alive(keep_alive).into_response();
    let headers = response.headers_mut();
    headers.insert(STREAM_HEADER, HeaderValue::from_static("v1"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

struct Pump {
    subscription: Subscription,
    projection: Projection,
    silent_until: u64,
    /// Frames to send before reading more.
    queue: VecDeque<String>,
    done: bool,
}

impl Pump {
    /// Reads the next event and queues its frames; `false` when the stream
    /// must end without more (the server stops, or the log cannot be read:
    /// the client resumes).
    async fn read(&mut self) -> bool {
        let settling = !self.projection.waiting().is_empty() && self.projection.is_open();
        let next = if settling {
            match tokio::time::timeout(WAIT_SETTLE, self.subscription.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let frames = self.projection.pause().iter().map(|chunk| chunk.to_json()).collect();
                    self.finish(frames);
                    return true;
                }
            }
        } else {
            self.subscription.next().await
        };
        let live = match next {
            Ok(Some(live)) => live,
            Ok(None) => return false,
            Err(error) => {
                tracing::error!(%error, "ending a UI message stream");
                return false;
            }
        };
        let event: RecordedEvent = match serde_json::from_str(&live.json) {
            Ok(event) => event,
            Err(error) => {
                tracing::error!(%error, sequence = live.sequence, "an unreadable event ends a UI message stream");
                return false;
            }
        };
        let chunks = self.projection.push(&event);
        if event.sequence <= self.silent_until {
            if event.sequence == self.silent_until {
                // What the client saw ended at the wait it answers.
                self.projection.pause();
            }
            return true;
        }
        let frames = chunks.iter().map(|chunk| chunk.to_json()).collect();
        if self.projection.is_finished() {
            self.finish(frames);
        } else {
            self.queue.extend(frames);
        }
        true
    }

    fn finish(&mut self, frames: Vec<String>) {
        self.queue.extend(frames);
        self.queue.push_back(DONE.to_owned());
        self.done = true;
    }
}

fn frames(pump: Pump) -> impl Stream<Item = Result<Event, Infallible>> {
    futures::stream::unfold(pump, |mut pump| async move {
        loop {
            if let Some(frame) = pump.queue.pop_front() {
                return Some((Ok(Event::default().data(frame)), pump));
            }
            if pump.done || !pump.read().await {
                return None;
            }
        }
    })
}

/// The sequence of turn `turn_id`'s `turn_started` in the log of
/// `session_id`, searched backwards from the log's end.
pub(crate) async fn turn_start(server: &Server, session_id: &str, turn_id: &str) -> Result<Option<u64>, ApiError> {
    let mut before = None;
    loop {
        let page = server
            .host
            .store
            .event_page(
                session_id,
                EventPageRequest {
                    before_sequence: before,
                    limit: MAX_EVENT_PAGE,
                },
            )
            .await?;
        let found = page
            .events
            .iter()
            .rev()
            .find(|event| matches!(&event.msg, EventMsg::TurnStarted(started) if started.turn_id == turn_id));
        if let Some(event) = found {
            return Ok(Some(event.sequence));
        }
        match page.events.first() {
            Some(first) if page.has_more => before = Some(first.sequence),
            _ => return Ok(None),
        }
    }
}

/// Turn `turn_id` of `session_id` projected from its start (`start`) to
/// the log's end: the projection's state, and the last sequence read.
pub(crate) async fn replay_turn(
    server: &Server,
    session_id: &str,
    turn_id: &str,
    start: u64,
) -> Result<(Projection, u64), ApiError> {
    let mut projection = Projection::of_turn(turn_id);
    let mut after = start.saturating_sub(1);
    loop {
        let events = server
            .host
            .store
            .events_after(session_id, after, MAX_EVENT_PAGE)
            .await?;
        let Some(last) = events.last() else {
            return Ok((projection, after));
        };
        after = last.sequence;
        for event in &events {
            projection.push(event);
        }
    }
}
