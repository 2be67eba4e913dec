//! [`MeteredStore`]: the store decorator that times commits into
//! `keel_store_commit_seconds` and forwards everything else.

use std::sync::Arc;
use std::time::Instant;

use super::Metrics;
use keel_model::BoxFuture;
use keel_protocol::TranscriptItem;
use keel_protocol::{RecordedEvent, Result};
use keel_store::{
    AppendReceipt, Checkpoint, CheckpointStore, EncodedEvent, EventPage, EventPageRequest, KeyedSubmission, OpenBatch,
    SessionEdit, SessionListPage, SessionState, SessionSummary, StoreError, TurnExecution,
};

/// A store that times its commits into `keel_store_commit_seconds`.
///
/// It cannot miss a method: [`CheckpointStore`] has no default methods, so
/// every one is written out here or this does not compile. What several
/// nodes need ([`keel_store::ClusterStore`]) is not a store's optional part
/// but a trait of its own, which the host holds beside this wrapper.
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

    fn event_page<'a>(
        &'a self,
        session_id: &'a str,
        request: EventPageRequest,
    ) -> BoxFuture<'a, Result<EventPage, StoreError>> {
        self.inner.event_page(session_id, request)
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
        filter: keel_store::SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        self.inner.list_sessions_page(cursor, limit, filter)
    }

    fn list_sessions_by_activity<'a>(
        &'a self,
        cursor: Option<&'a str>,
        limit: usize,
        filter: keel_store::SessionFilter<'a>,
    ) -> BoxFuture<'a, Result<SessionListPage, StoreError>> {
        self.inner.list_sessions_by_activity(cursor, limit, filter)
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

    fn edit_session<'a>(
        &'a self,
        session_id: &'a str,
        edit: SessionEdit<'a>,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        self.inner.edit_session(session_id, edit)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use keel_protocol::{BusyPolicy, Op};
    use keel_store::postgres::local::LocalPostgres;
    use keel_store::{
        CheckpointStoreExt, ClusterStore, PostgresCheckpoint, PostgresOptions, Relayed, RelayedSubmission,
        SessionContext,
    };

    /// Every method of the store reaches the store it decorates, and the
    /// several-node part (leases, relaying), held beside the wrapper, works
    /// on the same database: it once silently did not, for relaying, when
    /// that part was a set of refusing defaults the wrapper had to forward.
    #[tokio::test]
    async fn the_metered_store_forwards_every_optional_method() {
        let Some(postgres) = LocalPostgres::shared() else {
            return;
        };
        let url = postgres.fresh_database();
        let inner = PostgresCheckpoint::connect(&url, PostgresOptions::default())
            .await
            .expect("connect");
        let inner = Arc::new(inner);
        let cluster: Arc<dyn ClusterStore> = inner.clone();
        let store = MeteredStore::new(inner, Arc::new(Metrics::new()));
        let checkpoint = Checkpoint {
            session_context: SessionContext::default(),
            ..Checkpoint::empty("s")
        };
        store.create(&checkpoint, &[], Vec::new()).await.expect("create");
        let ttl = Duration::from_secs(60);
        let epoch = cluster.claim("s", "node-a", ttl).await.expect("claim");
        assert!(
            cluster
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
            submitted_by: None,
            seal: None,
            traceparent: None,
        };
        assert!(matches!(
            cluster.relay("s", &submission, 8).await.expect("relay"),
            Relayed::New { .. }
        ));
        assert_eq!(cluster.sessions_with_relayed("node-a").await.expect("relayed"), ["s"]);
        let waiting = cluster.relayed("s", 8).await.expect("relayed");
        assert_eq!(waiting.len(), 1);
        cluster.relay_done("s", &[waiting[0].relay_id]).await.expect("done");
        assert!(cluster.relayed("s", 8).await.expect("relayed").is_empty());
        cluster.release("s", "node-a", epoch).await.expect("release");
        assert!(
            cluster
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
