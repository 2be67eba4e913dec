//! The recorder's group commit, batch boundaries and back-pressure.

use super::*;
use keel_protocol::{EventMsg, WarningEvent};
use keel_store::{AppendReceipt, Checkpoint, OpenBatch, SqliteCheckpoint, StoreError};

fn warning(index: usize) -> Event {
    Event {
        submission_id: None,
        msg: EventMsg::Warning(WarningEvent {
            message: index.to_string(),
        }),
    }
}

/// A store that seals each open batch at once, then waits for a permit
/// before writing it: the writer is "busy" for as long as the test likes.
struct GatedStore {
    inner: Arc<SqliteCheckpoint>,
    gate: tokio::sync::Semaphore,
    batches: AtomicUsize,
    /// How long each write takes on top of the real one.
    delay: std::time::Duration,
}

impl GatedStore {
    fn new(inner: Arc<SqliteCheckpoint>, permits: usize, delay: std::time::Duration) -> Arc<Self> {
        Arc::new(Self {
            inner,
            gate: tokio::sync::Semaphore::new(permits),
            batches: AtomicUsize::new(0),
            delay,
        })
    }
}

/// A SQLite store in `directory` with the session "s", behind a gate that
/// lets no write through yet.
async fn closed_gate(directory: &tempfile::TempDir) -> (Arc<SqliteCheckpoint>, Arc<GatedStore>) {
    let sqlite = Arc::new(SqliteCheckpoint::new(directory.path().join("db.sqlite3")).expect("store"));
    sqlite.save(&Checkpoint::empty("s"), &[], None).await.expect("session");
    let store = GatedStore::new(Arc::clone(&sqlite), 0, std::time::Duration::ZERO);
    (sqlite, store)
}

/// Queues `first` and waits until the store has sealed it as a batch (the
/// gate keeps it from being written).
async fn seal_first_batch(recorder: &EventRecorder, store: &GatedStore, first: Event) {
    try_send_event(recorder, first).expect("queue");
    while store.batches.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
}

impl CheckpointStore for GatedStore {
    fn save<'a>(
        &'a self,
        checkpoint: &'a keel_store::Checkpoint,
        transcript_delta: &'a [keel_protocol::TranscriptItem],
        execution: Option<&'a keel_store::TurnExecution>,
    ) -> keel_model::BoxFuture<'a, std::result::Result<(), StoreError>> {
        self.inner.save(checkpoint, transcript_delta, execution)
    }

    fn load<'a>(
        &'a self,
        session_id: &'a str,
    ) -> keel_model::BoxFuture<'a, std::result::Result<Option<keel_store::SessionState>, StoreError>> {
        self.inner.load(session_id)
    }

    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: Arc<OpenBatch>,
    ) -> keel_model::BoxFuture<'a, std::result::Result<AppendReceipt, StoreError>> {
        Box::pin(async move {
            self.batches.fetch_add(1, Ordering::SeqCst);
            let sealed = batch.seal();
            let _permit = self.gate.acquire().await.map_err(|_| StoreError::Closed)?;
            tokio::time::sleep(self.delay).await;
            self.inner
                .append_open(session_id, Arc::new(OpenBatch::new(sealed)))
                .await
        })
    }

    fn acquire<'a>(&'a self, session_id: &'a str) -> keel_model::BoxFuture<'a, std::result::Result<u64, StoreError>> {
        self.inner.acquire(session_id)
    }

    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: keel_store::EventPageRequest,
    ) -> keel_model::BoxFuture<'a, std::result::Result<keel_store::EventPage, StoreError>> {
        self.inner.event_page(session_id, request)
    }

    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: keel_store::SessionFilter<'a>,
    ) -> keel_model::BoxFuture<'a, std::result::Result<keel_store::SessionListPage, StoreError>> {
        self.inner.list_sessions_page(cursor, limit, filter)
    }

    fn session_summary<'a>(
        &'a self,
        session_id: &'a str,
    ) -> keel_model::BoxFuture<'a, std::result::Result<Option<keel_store::SessionSummary>, StoreError>> {
        self.inner.session_summary(session_id)
    }

    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> keel_model::BoxFuture<'a, std::result::Result<Vec<RecordedEvent>, StoreError>> {
        self.inner.events_after(session_id, after_sequence, limit)
    }

    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> keel_model::BoxFuture<'a, std::result::Result<Option<keel_store::KeyedSubmission>, StoreError>> {
        self.inner.keyed_submission(session_id, idempotency_key)
    }

    fn low_on_space(&self) -> Option<String> {
        self.inner.low_on_space()
    }

    fn close(&self) -> keel_model::BoxFuture<'_, ()> {
        CheckpointStore::close(self.inner.as_ref())
    }

    fn create<'a>(
        &'a self,
        checkpoint: &'a keel_store::Checkpoint,
        history: &'a [keel_protocol::TranscriptItem],
        events: Vec<keel_store::EncodedEvent>,
    ) -> keel_model::BoxFuture<'a, std::result::Result<keel_store::AppendReceipt, StoreError>> {
        self.inner.create(checkpoint, history, events)
    }

    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> keel_model::BoxFuture<'a, std::result::Result<Option<Vec<keel_protocol::TranscriptItem>>, StoreError>> {
        self.inner.history_until(session_id, at_sequence)
    }

    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> keel_model::BoxFuture<'a, std::result::Result<Vec<String>, StoreError>> {
        self.inner.sessions_with_work(after, limit)
    }

    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: keel_store::SessionEdit<'a>,
    ) -> keel_model::BoxFuture<'a, std::result::Result<bool, StoreError>> {
        self.inner.edit_session(session_id, edit)
    }
}

/// Events queued while a batch is being written all go into the next
/// batch: a producer that outruns the store gets group commits, not one
/// commit per event.
#[tokio::test(flavor = "current_thread")]
async fn events_queued_behind_a_sealed_batch_form_one_next_batch() {
    let directory = tempfile::tempdir().expect("directory");
    let (_sqlite, store) = closed_gate(&directory).await;
    let (recorder, mut delivered) = EventRecorder::spawn(store.clone(), "s".into());

    seal_first_batch(&recorder, &store, warning(0)).await;
    // The first batch is sealed and waiting; these queue behind it.
    for index in 1..300 {
        try_send_event(&recorder, warning(index)).expect("queue");
    }
    tokio::task::yield_now().await;
    store.gate.add_permits(1_000);
    let drain = tokio::spawn(async move {
        for index in 0..300 {
            let event = delivered.recv().await.expect("delivered");
            assert_eq!(event.sequence, index as u64 + 1);
        }
    });
    recorder.flush().await.expect("flush");
    drain.await.expect("every event delivered in order");
    assert_eq!(
        store.batches.load(Ordering::SeqCst),
        2,
        "one batch in flight, one for everything behind it"
    );
}

fn turn_complete() -> Event {
    Event {
        submission_id: None,
        msg: EventMsg::TurnComplete(keel_protocol::TurnCompleteEvent {
            turn_id: "t".into(),
            length_limited: false,
        }),
    }
}

fn write(cut: Option<u64>, items: usize) -> CheckpointWrite {
    CheckpointWrite {
        checkpoint: Checkpoint::empty("s"),
        transcript_delta: (0..items)
            .map(|index| keel_protocol::TranscriptItem::UserMessage {
                text: index.to_string(),
            })
            .collect(),
        execution: None,
        history_cut: cut,
    }
}

/// The end of a turn closes its batch, so every turn's end is a batch
/// boundary (a fork point); and a write that cuts the history never
/// joins a batch that added history without cutting.
#[tokio::test(flavor = "current_thread")]
async fn a_turns_end_and_a_history_cut_are_batch_boundaries() {
    let directory = tempfile::tempdir().expect("directory");
    let (sqlite, store) = closed_gate(&directory).await;
    let (recorder, mut delivered) = EventRecorder::spawn(store.clone(), "s".into());
    seal_first_batch(&recorder, &store, warning(0)).await;
    // Behind the sealed first batch: a turn's end, then more.
    recorder
        .append(vec![warning(1)], Some(write(None, 2)))
        .await
        .expect("queue");
    recorder.append(vec![turn_complete()], None).await.expect("queue");
    recorder
        .append(vec![warning(2)], Some(write(None, 1)))
        .await
        .expect("queue");
    recorder
        .append(vec![warning(3)], Some(write(Some(1), 1)))
        .await
        .expect("queue");
    recorder
        .append(vec![warning(4)], Some(write(None, 1)))
        .await
        .expect("queue");
    tokio::task::yield_now().await;
    store.gate.add_permits(1_000);
    let drain = tokio::spawn(async move {
        for sequence in 1..=6 {
            assert_eq!(delivered.recv().await.expect("delivered").sequence, sequence);
        }
    });
    recorder.flush().await.expect("flush");
    drain.await.expect("every event delivered");
    assert_eq!(
        store.batches.load(Ordering::SeqCst),
        4,
        "[0] [1, end] [2] [3 (cut), 4]: a batch closes after a turn's end, and a cut starts one"
    );
    let state = sqlite.load("s").await.expect("load").expect("session");
    assert_eq!(
        state.transcript.len(),
        3,
        "2 + 1 items, cut to 1, plus 1 and 1: {:?}",
        state.transcript
    );
    let fork_point = sqlite
        .history_until("s", 3)
        .await
        .expect("the turn's end is a fork point");
    assert_eq!(fork_point.map(|items| items.len()), Some(2));
}

/// A model that answers "hi" at once.
struct Answers;

impl keel_model::Model for Answers {
    fn respond<'a>(
        &'a self,
        _request: keel_model::ModelRequest<'a>,
        _events: keel_model::ModelEventSink,
    ) -> keel_model::BoxFuture<'a, Result<keel_model::ModelOutput>> {
        Box::pin(async { Ok(keel_model::ModelOutput::text("hi")) })
    }
}

/// A session shows as idle only once what it recorded is stored: a host
/// that sees it idle reads everything it did from the store.
#[tokio::test]
async fn a_session_is_idle_only_once_its_turn_is_stored() {
    let directory = tempfile::tempdir().expect("directory");
    let sqlite = Arc::new(SqliteCheckpoint::new(directory.path().join("db.sqlite3")).expect("store"));
    let store = GatedStore::new(Arc::clone(&sqlite), 1_000, std::time::Duration::from_millis(100));
    let mut config = crate::agent::AgentConfig::new("s", store, Arc::new(Answers));
    config.workspace = directory.path().to_path_buf();
    let mut agent = crate::agent::create_agent(config).await.expect("agent");
    let handle = agent.handle();
    agent
        .sender()
        .submit(keel_protocol::Op::UserInput { text: "hello".into() })
        .expect("submit");
    // Busy from the moment it is submitted until the turn is stored.
    while !handle.status().busy {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    while handle.status().busy {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let stored = sqlite.events_after("s", 0, 100).await.expect("events");
    assert!(
        stored.iter().any(|event| event.msg.ends_turn()),
        "idle before the turn's end was stored: {:?}",
        stored.iter().map(|event| event.msg.kind()).collect::<Vec<_>>()
    );
    while let Ok(Some(_)) = tokio::time::timeout(std::time::Duration::from_millis(10), agent.next_event()).await {}
    agent.shutdown().await.expect("shutdown");
}

/// A streamed delta whose end could begin a secret is held back for the
/// next one; a flush, which promises that everything sent before it is
/// stored, stores it too. The proptest found a lone reasoning delta `e`
/// (a JWT starts `ey`) missing from the log after a flush.
#[tokio::test(flavor = "current_thread")]
async fn a_flush_stores_the_held_back_end_of_a_delta() {
    let directory = tempfile::tempdir().expect("directory");
    let store = Arc::new(SqliteCheckpoint::new(directory.path().join("db.sqlite3")).expect("store"));
    store.save(&Checkpoint::empty("s"), &[], None).await.expect("save");
    let (recorder, _delivered) = EventRecorder::spawn(store.clone(), "s".into());
    for msg in [
        EventMsg::ReasoningDelta(keel_protocol::ReasoningDeltaEvent {
            turn_id: "t".into(),
            delta: "e".into(),
        }),
        EventMsg::AssistantContentDelta(keel_protocol::AssistantContentDeltaEvent {
            turn_id: "t".into(),
            delta: "see k".into(),
        }),
    ] {
        try_send_event(
            &recorder,
            Event {
                submission_id: None,
                msg,
            },
        )
        .expect("queue");
    }
    recorder.flush().await.expect("flush");
    let stored = store
        .events_after("s", 0, keel_store::MAX_EVENT_PAGE)
        .await
        .expect("events");
    let (mut reasoning, mut content) = (String::new(), String::new());
    for event in &stored {
        match &event.msg {
            EventMsg::ReasoningDelta(delta) => reasoning.push_str(&delta.delta),
            EventMsg::AssistantContentDelta(delta) => content.push_str(&delta.delta),
            other => panic!("an unexpected event {other:?}"),
        }
    }
    assert_eq!((reasoning.as_str(), content.as_str()), ("e", "see k"));
}
