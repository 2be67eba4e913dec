//! [`MeteredStore`]: the store decorator that times commits into
//! `keel_store_commit_seconds` and forwards everything else.

use std::sync::Arc;
use std::time::Instant;

use super::Metrics;
use keel_model::BoxFuture;
use keel_protocol::TranscriptItem;
use keel_protocol::{RecordedEvent, Result};
use keel_store::{
    AppendBatch, AppendReceipt, Checkpoint, CheckpointStore, EncodedEvent, EventPage, EventPageRequest,
    KeyedSubmission, OpenBatch, Relayed, RelayedSubmission, SessionListPage, SessionState, SessionSummary, StoreError,
    TurnExecution,
};

/// A store that times its commits into `keel_store_commit_seconds`.
pub(crate) struct MeteredStore {
    inner: Arc<dyn CheckpointStore>,
    metrics: Arc<Metrics>,
}

impl MeteredStore {
    pub(crate) fn new(inner: Arc<dyn CheckpointStore>, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    async fn timed<T>(&self, work: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let start = Instant::now();
        let result = work.await;
        if result.is_ok() {
            self.metrics.store_commit.observe(start.elapsed().as_secs_f64());
        }
        result
    }
}

impl CheckpointStore for MeteredStore {
    fn low_on_space(&self) -> Option<String> {
        self.inner.low_on_space()
    }

    fn save<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        transcript_delta: &'a [TranscriptItem],
        execution: Option<&'a TurnExecution>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.save(checkpoint, transcript_delta, execution)
    }

    fn create<'a>(
        &'a self,
        checkpoint: &'a Checkpoint,
        history: &'a [TranscriptItem],
        events: Vec<EncodedEvent>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(self.timed(self.inner.create(checkpoint, history, events)))
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.inner.close()
    }

    fn load<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionState>, StoreError>> {
        self.inner.load(session_id)
    }

    fn append<'a>(
        &'a self,
        session_id: &'a str,
        batch: AppendBatch,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(self.timed(self.inner.append(session_id, batch)))
    }

    fn append_open<'a>(
        &'a self,
        session_id: &'a str,
        batch: Arc<OpenBatch>,
    ) -> BoxFuture<'a, Result<AppendReceipt, StoreError>> {
        Box::pin(self.timed(self.inner.append_open(session_id, batch)))
    }

    fn acquire<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.acquire(session_id)
    }

    fn claim<'a>(
        &'a self,
        session_id: &'a str,
        owner: &'a str,
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        self.inner.claim(session_id, owner, ttl)
    }

    fn renew<'a>(
        &'a self,
        owner: &'a str,
        ttl: std::time::Duration,
        sessions: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.renew(owner, ttl, sessions)
    }

    fn release<'a>(&'a self, session_id: &'a str, owner: &'a str, epoch: u64) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.release(session_id, owner, epoch)
    }

    fn sessions_to_take_over<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.sessions_to_take_over(after, limit)
    }

    fn relay<'a>(
        &'a self,
        session_id: &'a str,
        submission: &'a RelayedSubmission,
        max_waiting: usize,
    ) -> BoxFuture<'a, Result<Relayed, StoreError>> {
        self.inner.relay(session_id, submission, max_waiting)
    }

    fn relayed<'a>(
        &'a self,
        session_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RelayedSubmission>, StoreError>> {
        self.inner.relayed(session_id, limit)
    }

    fn relay_done<'a>(&'a self, session_id: &'a str, relay_ids: &'a [u64]) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.relay_done(session_id, relay_ids)
    }

    fn sessions_with_relayed<'a>(&'a self, owner: &'a str) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.sessions_with_relayed(owner)
    }

    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>> {
        self.inner.event_page(session_id, request)
    }

    fn list_sessions(&self, limit: usize) -> BoxFuture<'_, Result<Vec<SessionSummary>, StoreError>> {
        self.inner.list_sessions(limit)
    }

    fn events_after<'a>(
        &'a self,
        session_id: &'a str,
        after_sequence: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<RecordedEvent>, StoreError>> {
        self.inner.events_after(session_id, after_sequence, limit)
    }

    fn list_sessions_page<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        bot_id: Option<&'a str>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        self.inner.list_sessions_page(cursor, limit, bot_id)
    }

    fn session_summary<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<Option<SessionSummary>, StoreError>> {
        self.inner.session_summary(session_id)
    }

    fn keyed_submission<'a>(
        &'a self,
        session_id: &'a str,
        idempotency_key: &'a str,
    ) -> BoxFuture<'a, Result<Option<KeyedSubmission>, StoreError>> {
        self.inner.keyed_submission(session_id, idempotency_key)
    }

    fn sessions_with_work<'a>(
        &'a self,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<String>, StoreError>> {
        self.inner.sessions_with_work(after, limit)
    }

    fn history_until<'a>(
        &'a self,
        session_id: &'a str,
        at_sequence: u64,
    ) -> BoxFuture<'a, Result<Option<Vec<TranscriptItem>>, StoreError>> {
        self.inner.history_until(session_id, at_sequence)
    }

    fn delete_session<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.delete_session(session_id)
    }

    fn rename_session<'a>(&'a self, session_id: &'a str, title: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.rename_session(session_id, title)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use keel_protocol::{BusyPolicy, Op};
    use keel_store::postgres::local::TestPostgres;
    use keel_store::{PostgresCheckpoint, PostgresOptions, SessionContext};

    /// Every optional method of the store reaches the store it decorates:
    /// the trait's defaults refuse or answer "none", so one not forwarded
    /// would silently turn a feature off (it once did, for relaying).
    #[tokio::test]
    async fn the_metered_store_forwards_every_optional_method() {
        let Some(postgres) = TestPostgres::shared() else { return };
        let url = postgres.fresh_database();
        let inner = PostgresCheckpoint::connect(&url, PostgresOptions::default())
            .await
            .expect("connect");
        let store = MeteredStore::new(Arc::new(inner), Arc::new(Metrics::new()));
        let checkpoint = Checkpoint {
            session_context: SessionContext::default(),
            ..Checkpoint::empty("s")
        };
        store.create(&checkpoint, &[], Vec::new()).await.expect("create");
        let ttl = Duration::from_secs(60);
        let epoch = store.claim("s", "node-a", ttl).await.expect("claim");
        assert!(
            store
                .renew("node-a", ttl, &[("s".to_owned(), epoch)])
                .await
                .expect("renew")
                .is_empty()
        );
        let submission = RelayedSubmission {
            relay_id: 0,
            submission_id: "r".to_owned(),
            op: Op::Interrupt { turn_id: None },
            on_busy: Some(BusyPolicy::Queue),
            idempotency_key: None,
            seal: None,
        };
        assert!(matches!(
            store.relay("s", &submission, 8).await.expect("relay"),
            Relayed::New { .. }
        ));
        assert_eq!(store.sessions_with_relayed("node-a").await.expect("relayed"), ["s"]);
        let waiting = store.relayed("s", 8).await.expect("relayed");
        assert_eq!(waiting.len(), 1);
        store.relay_done("s", &[waiting[0].relay_id]).await.expect("done");
        assert!(store.relayed("s", 8).await.expect("relayed").is_empty());
        store.release("s", "node-a", epoch).await.expect("release");
        assert!(
            store
                .sessions_to_take_over(None, 8)
                .await
                .expect("take over")
                .is_empty()
        );
        assert!(store.sessions_with_work(None, 8).await.expect("work").is_empty());
        assert_eq!(store.history_until("s", 0).await.expect("history"), Some(Vec::new()));
        assert!(store.rename_session("s", "renamed").await.expect("rename"));
        assert!(store.delete_session("s").await.expect("delete"));
        store.close().await;
        assert!(matches!(store.load("s").await, Err(StoreError::Closed)));
    }
}
