//! Progress of a running tool call, reported while it runs.
//!
//! A tool that learns how far it got (an MCP server's
//! `notifications/progress`) reports it to the [`ProgressSink`] of the call
//! it serves, found with [`ProgressSink::current`]. The agent scopes each
//! call's future with its own sink and records what arrives as
//! `tool_call_progress` events: the latest report of each call, at most
//! one batch per interval, and the last one before the call's result. The
//! sink is task-local rather than a field
//! of [`ToolContext`](super::ToolContext) so tools stay ignorant of turns
//! and events: a tool run outside a turn simply has no sink.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// The longest progress message kept, in bytes; a server controls it, and
/// it goes into the session's log.
pub const MAX_PROGRESS_MESSAGE_BYTES: usize = 1024;

/// How far a running call got.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolProgress {
    /// The call.
    pub call_id: String,
    /// The progress so far (it grows with each report).
    pub progress: f64,
    /// The total the progress goes up to, when known.
    pub total: Option<f64>,
    /// What the tool is doing, in its words.
    pub message: Option<String>,
}

tokio::task_local! {
    static SINK: ProgressSink;
}

/// The latest progress of each running call of a step: a report replaces
/// the one before it, so a reader that lags reads the newest, never a
/// backlog.
#[derive(Debug, Default)]
pub struct ProgressBoard {
    latest: Mutex<BTreeMap<String, ToolProgress>>,
    changed: Notify,
}

impl ProgressBoard {
    /// An empty board.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Waits until a report arrived since the last [`Self::take`] (or the
    /// last wait).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The reports not taken yet, one per call (the latest), by call id.
    pub fn take(&self) -> Vec<ToolProgress> {
        std::mem::take(&mut *self.latest.lock().unwrap_or_else(PoisonError::into_inner))
            .into_values()
            .collect()
    }
}

/// Where one call's progress goes. Reports never wait.
#[derive(Debug, Clone)]
pub struct ProgressSink {
    call_id: String,
    board: Arc<ProgressBoard>,
}

impl ProgressSink {
    /// A sink for the call `call_id`, posting to `board`.
    pub fn new(call_id: impl Into<String>, board: Arc<ProgressBoard>) -> Self {
        Self {
            call_id: call_id.into(),
            board,
        }
    }

    /// Runs `future` (a call) with this sink as its current one.
    pub fn scope<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        SINK.scope(self, future)
    }

    /// The sink of the call being run, if it has one.
    pub fn current() -> Option<ProgressSink> {
        SINK.try_with(Clone::clone).ok()
    }

    /// Reports progress, replacing the call's report not taken yet.
    pub fn report(&self, progress: f64, total: Option<f64>, message: Option<String>) {
        let message = message.map(|mut text| {
            if text.len() > MAX_PROGRESS_MESSAGE_BYTES {
                let mut end = MAX_PROGRESS_MESSAGE_BYTES;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.push('…');
            }
            text
        });
        let report = ToolProgress {
            call_id: self.call_id.clone(),
            progress,
            total,
            message,
        };
        self.board
            .latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(self.call_id.clone(), report);
        self.board.changed.notify_one();
    }
}
