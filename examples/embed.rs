//! Keel as a library: a session on SQLite, a tool call approved in code,
//! events printed as they are stored, and the session resumed after a
//! restart. `cargo run --example embed [DIR]`; with `KEEL_EMBED_URL` set
//! (an OpenAI-compatible `/v1` URL, e.g. Ollama's) a real model answers
//! (`KEEL_EMBED_MODEL`, default `llama3.2`), else the script `embed.jsonl`.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use keel::model::{Model, ScriptedModel};
use keel::protocol::{ApprovalDecision, EventMsg, Op};
use keel::provider::{ProviderSettings, openai_chat::OpenAiChat};
use keel::store::SqliteCheckpoint;
use keel::tools::{ToolSet, workspace::WriteFile};
use keel::{AgentConfig, Result, create_agent};

/// Two runs of one session, the second after the runtime was closed.
pub(crate) async fn run(dir: &Path, model: Arc<dyn Model>, out: &mut impl Write) -> Result<()> {
    let io = |error: std::io::Error| keel::Error::Config(error.to_string());
    std::fs::create_dir_all(dir.join("work")).map_err(io)?;
    for message in ["Write hello.txt, please.", "Are you still there?"] {
        // Opening the same database again is the restart: the session resumes.
        let store = Arc::new(SqliteCheckpoint::new(dir.join("keel.sqlite3"))?);
        let mut config = AgentConfig::new("embedded", store, Arc::clone(&model));
        config.workspace = dir.join("work");
        config.tools = ToolSet::new();
        config.tools.add(Arc::new(WriteFile)); // writes, so it asks for approval
        let mut agent = create_agent(config).await?;
        agent
            .sender()
            .submit_wait(Op::UserInput { text: message.into() })
            .await?;
        while let Some(event) = agent.next_event().await {
            writeln!(out, "{} {}", event.sequence, event.msg.kind()).map_err(io)?;
            match &event.msg {
                EventMsg::ApprovalRequested(request) => {
                    let (call_id, decision) = (request.call_id.clone(), ApprovalDecision::Approve);
                    agent.sender().submit(Op::Approval { call_id, decision })?;
                }
                EventMsg::AssistantMessage(message) => writeln!(out, "  {}", message.text).map_err(io)?,
                msg if msg.ends_turn() => break,
                _ => {}
            }
        }
        agent.shutdown().await?;
    }
    Ok(())
}

/// The scripted model (offline, deterministic), or a real one if configured.
pub(crate) fn model() -> Result<Arc<dyn Model>> {
    let Ok(url) = std::env::var("KEEL_EMBED_URL") else {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/embed.jsonl");
        return Ok(Arc::new(ScriptedModel::load(script)?));
    };
    let name = std::env::var("KEEL_EMBED_MODEL").unwrap_or_else(|_| "llama3.2".into());
    Ok(Arc::new(OpenAiChat::new(ProviderSettings::new("embed", name, url))?))
}

#[allow(dead_code)] // the integration test calls `run` and `model` instead
#[tokio::main]
async fn main() -> Result<()> {
    let dir = std::env::args().nth(1).unwrap_or_else(|| "embed-data".into());
    run(Path::new(&dir), model()?, &mut std::io::stdout().lock()).await
}
