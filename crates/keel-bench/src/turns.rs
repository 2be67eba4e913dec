//! The "durable streaming agent turns" workload, on Keel's runtime.
//!
//! S sessions run concurrently, each T turns in order. A turn submits one
//! user message; a scripted model streams K chunks of exactly B bytes; the
//! consumer checks that K·B bytes of text arrived. Unlike the LangGraph peer,
//! every chunk is its own recorded event, stored before it is delivered
//! (streaming is set to record each delta), and the turn's checkpoint
//! (history delta and turn state) commits with its events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::database::{BenchDatabase, BenchStore, Grouping};
use super::stats::percentile;
use keel_agent::{AgentConfig, StreamingOptions, create_agent};
use keel_model::{BoxFuture, Model, ModelEvent, ModelEventSink, ModelOutput, ModelRequest, ToolCall, ToolSpec};
use keel_protocol::{Error, Result};
use keel_protocol::{EventMsg, Op, TranscriptItem};
use keel_store::{CheckpointStore, Synchronous};
use keel_tools::{Tool, ToolContext, ToolError};

/// Parameters of the workload.
#[derive(Debug, Clone)]
pub struct TurnsParams {
    /// Concurrent sessions (S).
    pub sessions: usize,
    /// Turns per session, in order (T).
    pub turns: usize,
    /// Text chunks per answer (K).
    pub chunks: usize,
    /// Bytes per chunk (B).
    pub chunk_bytes: usize,
    /// The database (a fresh temporary SQLite file by default).
    pub database: BenchDatabase,
    /// Commit durability.
    pub synchronous: Synchronous,
    /// How streamed text is recorded; per delta for the workload as specified.
    pub streaming: StreamingOptions,
    /// `plain` (one model step) or `tool` (a tool call first).
    pub variant: Variant,
}

/// The two variants of the workload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// user → the model streams K chunks → done.
    #[default]
    Plain,
    /// user → the model calls `lookup` → the tool answers → the model
    /// streams K chunks → done (two model steps and one tool call).
    Tool,
}

impl Default for TurnsParams {
    fn default() -> Self {
        Self {
            sessions: 8,
            turns: 50,
            chunks: 32,
            chunk_bytes: 16,
            database: BenchDatabase::default(),
            synchronous: Synchronous::Full,
            streaming: StreamingOptions::per_delta(),
            variant: Variant::Plain,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct TurnsReport {
    /// The store's backend (`sqlite`, `postgres`).
    pub backend: &'static str,
    /// S.
    pub sessions: usize,
    /// T.
    pub turns: usize,
    /// K.
    pub chunks: usize,
    /// B.
    pub chunk_bytes: usize,
    /// The variant.
    pub variant: Variant,
    /// Wall time of the timed phase, seconds.
    pub wall_s: f64,
    /// Turns completed per second.
    pub turns_per_s: f64,
    /// Text chunks delivered per second.
    pub chunks_per_s: f64,
    /// Mean turn latency (submit to `turn_complete` delivered), ms.
    pub turn_latency_mean_ms: f64,
    /// Median turn latency, ms.
    pub turn_latency_p50_ms: f64,
    /// 99th percentile (nearest rank) turn latency, ms.
    pub turn_latency_p99_ms: f64,
    /// Mean time from submit to the first text chunk delivered, ms.
    pub ttft_mean_ms: f64,
    /// Events recorded during the timed phase.
    pub events_recorded: u64,
    /// Transactions committed during the timed phase.
    pub commits: u64,
    /// Write jobs (recorder batches and saves) in those transactions.
    pub write_jobs: u64,
    /// Mean time the writer spent per commit (statements and fsync), ms.
    pub commit_mean_ms: f64,
    /// The database's size on disk after it was closed.
    pub db_on_disk_bytes: u64,
    /// Peak resident memory of the process, MiB.
    pub peak_rss_mib: f64,
}

/// The text of chunk `index` of turn `turn`: `[turn.index]abc…`, cut to `bytes`.
pub fn chunk_text(turn: usize, index: usize, bytes: usize) -> String {
    let head = format!("[{turn}.{index}]");
    let alphabet = "abcdefghijklmnopqrstuvwxyz0123456789";
    let mut text = head;
    while text.len() < bytes {
        text.push_str(alphabet);
    }
    text.truncate(bytes);
    text
}

/// The workload's model for `params`.
pub(crate) fn chunk_model(params: &TurnsParams) -> Arc<dyn Model> {
    Arc::new(ChunkModel {
        chunks: params.chunks,
        chunk_bytes: params.chunk_bytes,
        variant: params.variant,
    })
}

/// The workload's model: streams K chunks of B bytes in one burst (after a
/// `lookup` call, in the tool variant).
struct ChunkModel {
    chunks: usize,
    chunk_bytes: usize,
    variant: Variant,
}

impl Model for ChunkModel {
    fn respond<'a>(&'a self, request: ModelRequest<'a>, events: ModelEventSink) -> BoxFuture<'a, Result<ModelOutput>> {
        Box::pin(async move {
            // The turn from the session's call count, not by counting the
            // history's messages: the model must not cost what it measures.
            let steps = if self.variant == Variant::Tool { 2 } else { 1 };
            let turn = usize::try_from(request.call_index / steps).unwrap_or(usize::MAX);
            let asked = matches!(request.history.last(), Some(TranscriptItem::UserMessage { .. }));
            if self.variant == Variant::Tool && asked {
                let arguments = serde_json::json!({"query": format!("turn-{turn}"), "limit": 3}).to_string();
                let call = ToolCall {
                    call_id: format!("call_{turn}"),
                    name: "lookup".into(),
                    arguments,
                };
                return Ok(ModelOutput::default().with_tool_calls(vec![call]));
            }
            let mut text = String::with_capacity(self.chunks * self.chunk_bytes);
            for index in 0..self.chunks {
                let chunk = chunk_text(turn, index, self.chunk_bytes);
                text.push_str(&chunk);
                events(ModelEvent::TextDelta(chunk))?;
            }
            Ok(ModelOutput::text(text))
        })
    }

    fn name(&self) -> String {
        "bench-chunks".to_owned()
    }
}

/// The tool variant's trivial tool: a small JSON answer.
struct Lookup;

impl Tool for Lookup {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "lookup".into(),
            description: "Looks a query up.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["query"]
            }),
        }
    }

    fn read_only(&self) -> bool {
        true
    }

    fn call<'a>(
        &'a self,
        arguments: serde_json::Map<String, serde_json::Value>,
        _context: &'a ToolContext,
    ) -> BoxFuture<'a, std::result::Result<String, ToolError>> {
        Box::pin(async move {
            let query = arguments
                .get("query")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default();
            let limit = arguments
                .get("limit")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(3)
                .min(3) as usize;
            let results = &["a", "b", "c"][..limit];
            Ok(serde_json::json!({"query": query, "results": results}).to_string())
        })
    }
}

/// Per-turn measurements of one session.
#[derive(Default)]
pub(crate) struct SessionTimes {
    /// Each turn's latency (submit to `turn_complete`), ms, in order.
    pub(crate) latencies_ms: Vec<f64>,
    /// Each turn's time to its first text chunk, ms, in order.
    pub(crate) first_chunk_ms: Vec<f64>,
    /// The process's CPU time (user and system) when each turn ended, s.
    pub(crate) cpu_at_end_s: Vec<f64>,
}

/// The workload's database (a fresh `file_name` for SQLite), store and
/// model, warmed up by two turns on a throwaway session, outside any timing.
pub(crate) async fn warmed_up(
    params: &TurnsParams,
    file_name: &str,
) -> Result<(BenchStore, Arc<dyn CheckpointStore>, Arc<dyn Model>)> {
    let database = BenchStore::open(&params.database, file_name, params.synchronous, Grouping::Group).await?;
    let store = database.store();
    let model = chunk_model(params);
    let warmup = format!("warmup-{}", keel_protocol::new_id());
    run_session(params, &store, &model, warmup, 2).await?;
    Ok((database, store, model))
}

/// Runs the workload and reports what it measured.
pub async fn run_turns(params: &TurnsParams) -> Result<TurnsReport> {
    let (database, store, model) = warmed_up(params, "bench-turns.sqlite3").await?;

    let before = database.stats();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for session in 0..params.sessions {
        let (params, store, model) = (params.clone(), Arc::clone(&store), Arc::clone(&model));
        let session_id = format!("bench-{session}-{}", keel_protocol::new_id());
        tasks.spawn(async move { run_session(&params, &store, &model, session_id, params.turns).await });
    }
    let mut times = SessionTimes::default();
    while let Some(joined) = tasks.join_next().await {
        let session = joined.map_err(|error| Error::stopped(format!("bench session failed: {error}")))??;
        times.latencies_ms.extend(session.latencies_ms);
        times.first_chunk_ms.extend(session.first_chunk_ms);
    }
    let wall = started.elapsed();
    let after = database.stats();
    drop(store);
    database.close().await;
    let turns = times.latencies_ms.len();
    let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
    Ok(TurnsReport {
        backend: params.database.backend(),
        sessions: params.sessions,
        turns: params.turns,
        chunks: params.chunks,
        chunk_bytes: params.chunk_bytes,
        variant: params.variant,
        wall_s: wall.as_secs_f64(),
        turns_per_s: turns as f64 / wall.as_secs_f64(),
        // Every turn was checked to deliver all K·B bytes.
        chunks_per_s: (turns * params.chunks) as f64 / wall.as_secs_f64(),
        turn_latency_mean_ms: mean(&times.latencies_ms),
        turn_latency_p50_ms: percentile(&times.latencies_ms, 50.0),
        turn_latency_p99_ms: percentile(&times.latencies_ms, 99.0),
        ttft_mean_ms: mean(&times.first_chunk_ms),
        events_recorded: after.events - before.events,
        commits: after.commits - before.commits,
        write_jobs: after.jobs - before.jobs,
        commit_mean_ms: (after.commit_micros - before.commit_micros) as f64
            / 1000.0
            / (after.commits - before.commits).max(1) as f64,
        db_on_disk_bytes: database.bytes_on_disk(),
        peak_rss_mib: super::peak_rss_mib().unwrap_or(0.0),
    })
}

/// Runs `turns` turns in one session, checking every byte of every answer.
pub(crate) async fn run_session(
    params: &TurnsParams,
    store: &Arc<dyn CheckpointStore>,
    model: &Arc<dyn Model>,
    session_id: String,
    turns: usize,
) -> Result<SessionTimes> {
    let mut config = AgentConfig::new(session_id.clone(), Arc::clone(store), Arc::clone(model));
    config.streaming = params.streaming;
    if params.variant == Variant::Tool {
        config.tools.add(Arc::new(Lookup));
    }
    config.session_context.bot_id = "bench".to_owned();
    let mut agent = create_agent(config).await?;
    let mut times = SessionTimes::default();
    let expected = params.chunks * params.chunk_bytes;
    for turn in 0..turns {
        let started = Instant::now();
        let text = format!("user msg {turn} of session {session_id}");
        agent.sender().submit_wait(Op::UserInput { text }).await?;
        let mut first_chunk: Option<Duration> = None;
        let mut bytes = 0;
        loop {
            let event = agent
                .next_event()
                .await
                .ok_or_else(|| Error::stopped("the session ended during a bench turn"))?;
            match &event.msg {
                EventMsg::AssistantContentDelta(delta) => {
                    first_chunk.get_or_insert_with(|| started.elapsed());
                    bytes += delta.delta.len();
                }
                EventMsg::TurnComplete(_) => break,
                EventMsg::TurnAborted(aborted) => {
                    return Err(Error::Model(format!("bench turn aborted: {}", aborted.message)));
                }
                _ => {}
            }
        }
        if bytes != expected {
            return Err(Error::Model(format!(
                "bench turn delivered {bytes} text bytes, expected {expected}"
            )));
        }
        times.latencies_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        times.cpu_at_end_s.push(super::stats::process_cpu_s());
        times
            .first_chunk_ms
            .push(first_chunk.unwrap_or_default().as_secs_f64() * 1000.0);
    }
    agent.shutdown().await?;
    Ok(times)
}
