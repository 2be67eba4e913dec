//! Models written in a test: a closure of each call that sees every
//! request, and the small parts such models are made of.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use keel::Model;
use keel::agent::{BoxFuture, ModelEvent, ModelEventSink, ModelOutput, ModelRequest};
use keel::protocol::TranscriptItem;
use tokio::sync::Notify;

/// What a test model was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeenRequest {
    pub(crate) session_id: String,
    pub(crate) turn_id: String,
    pub(crate) history: Vec<TranscriptItem>,
    pub(crate) call_index: u64,
    pub(crate) instructions: Option<String>,
    pub(crate) tools: Vec<String>,
}

/// One model call, with owned copies of the request and the sink.
pub(crate) struct Call {
    pub(crate) call_index: u64,
    pub(crate) sink: ModelEventSink,
}

type Respond = dyn Fn(Call) -> BoxFuture<'static, keel::Result<ModelOutput>> + Send + Sync;

/// A model whose behaviour is a closure of the call; it remembers every
/// request it saw. The closure runs synchronously inside `respond`, so a
/// panic in it is a panic of `respond` itself.
pub(crate) struct TestModel {
    respond: Box<Respond>,
    seen: Mutex<Vec<SeenRequest>>,
}

impl TestModel {
    pub(crate) fn new(
        respond: impl Fn(Call) -> BoxFuture<'static, keel::Result<ModelOutput>> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            respond: Box::new(respond),
            seen: Mutex::new(Vec::new()),
        })
    }

    /// A model that streams `chunks` synchronously (all in its first poll)
    /// and answers with their concatenation.
    pub(crate) fn chunks(chunks: &[&str]) -> Arc<Self> {
        let chunks: Vec<String> = chunks.iter().map(|chunk| (*chunk).to_owned()).collect();
        Self::new(move |call| {
            let chunks = chunks.clone();
            Box::pin(async move { stream_now(&call.sink, &chunks) })
        })
    }

    /// Every request seen so far.
    pub(crate) fn seen(&self) -> Vec<SeenRequest> {
        self.seen.lock().expect("seen lock").clone()
    }
}

impl Model for TestModel {
    fn respond<'a>(
        &'a self,
        request: ModelRequest<'a>,
        events: ModelEventSink,
    ) -> BoxFuture<'a, keel::Result<ModelOutput>> {
        self.seen.lock().expect("seen lock").push(SeenRequest {
            session_id: request.session_id.to_owned(),
            turn_id: request.turn_id.to_owned(),
            history: request.history.to_vec(),
            call_index: request.call_index,
            instructions: request.instructions.map(str::to_owned),
            tools: request.tools.iter().map(|tool| tool.name.clone()).collect(),
        });
        (self.respond)(Call {
            call_index: request.call_index,
            sink: events,
        })
    }

    fn name(&self) -> String {
        "test".to_owned()
    }
}

/// A model that answers `answer N`, N its call index. A call for which
/// `hold` gives a future first streams `streamed`, notifies `entered` and
/// waits for that future before it answers.
pub(crate) fn numbered_model(
    streamed: &'static str,
    entered: Arc<Notify>,
    hold: impl Fn(u64) -> Option<BoxFuture<'static, ()>> + Send + Sync + 'static,
) -> Arc<TestModel> {
    TestModel::new(move |call| {
        let entered = Arc::clone(&entered);
        let held = hold(call.call_index);
        Box::pin(async move {
            if let Some(held) = held {
                (call.sink)(ModelEvent::TextDelta(streamed.into()))?;
                entered.notify_one();
                held.await;
            }
            Ok(ModelOutput::text(format!("answer {}", call.call_index)))
        })
    })
}

/// Streams `chunks` into `sink` without yielding; answers with their concatenation.
pub(crate) fn stream_now(sink: &ModelEventSink, chunks: &[String]) -> keel::Result<ModelOutput> {
    for chunk in chunks {
        sink(ModelEvent::TextDelta(chunk.clone()))?;
    }
    Ok(ModelOutput::text(chunks.concat()))
}

/// A user message transcript item.
pub(crate) fn user_item(text: &str) -> TranscriptItem {
    TranscriptItem::UserMessage { text: text.to_owned() }
}

/// An assistant message transcript item.
pub(crate) fn assistant_item(text: &str, interrupted: bool) -> TranscriptItem {
    TranscriptItem::AssistantMessage {
        text: text.to_owned(),
        interrupted,
    }
}

/// Sets a flag when dropped; put one in a model's future to see it dropped.
pub(crate) struct DropFlag(pub(crate) Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A slot where a model keeps the sink it was given.
pub(crate) type SinkSlot = Arc<Mutex<Option<ModelEventSink>>>;

/// The sink kept in `slot`.
pub(crate) fn retained(slot: &SinkSlot) -> ModelEventSink {
    slot.lock().expect("sink slot lock").clone().expect("a retained sink")
}
