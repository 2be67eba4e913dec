//! Tests of the PostgreSQL store against a real server (see
//! [`crate::postgres::local`]); each test gets a database of its own. When
//! PostgreSQL cannot be found they print a `SKIPPED` line and return (CI
//! sets `KEEL_REQUIRE_POSTGRES_TESTS=1`, which makes that a failure).
//!
//! Tests that need several writes in one group submit them from one task on
//! a current-thread runtime: `join_all` queues every job before the writer
//! task can run, so the writer finds them all at its next wake-up.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;

use super::{PostgresCheckpoint, PostgresOptions, schema};
use crate::postgres::local::LocalPostgres;
use crate::{
    AppendBatch, AppendReceipt, Checkpoint, CheckpointStore, CheckpointStoreExt, CheckpointWrite, ClusterStore,
    EncodedEvent, EventPageRequest, KeyedSubmission, LeaseStore, MAX_EVENT_PAGE, OpenBatch, QueueChange,
    SessionContext, StoreError, TurnExecution,
};
use keel_protocol::{
    AssistantContentDeltaEvent, BusyPolicy, Event, EventMsg, Op, RecordedEvent, SubmissionQueuedEvent, TokenUsage,
    TranscriptItem, TurnStartedEvent,
};

/// The conformance suite's view of this backend: a database of its own on
/// the shared test server for each test.
struct PostgresFactory;

impl crate::conformance::StoreFactory for PostgresFactory {
    type Database = String;
    type Store = PostgresCheckpoint;

    fn available(&self) -> bool {
        LocalPostgres::shared().is_some()
    }

    async fn database(&self) -> String {
        database().expect("PostgreSQL is available (checked first)")
    }

    async fn open(&self, url: &String) -> PostgresCheckpoint {
        PostgresCheckpoint::connect(url, PostgresOptions::default())
            .await
            .expect("connect")
    }

    async fn close(&self, store: &PostgresCheckpoint) {
        store.close().await;
    }
}

crate::conformance::store_conformance_tests!(PostgresFactory);
crate::conformance::access_conformance_tests!(PostgresFactory);
crate::conformance::webhook_conformance_tests!(PostgresFactory);

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs a test body, failing it if it takes absurdly long. A hang guard only.
async fn guarded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(300), test)
        .await
        .expect("test hung")
}

/// A new empty database's URL, or `None` when PostgreSQL is not available.
fn database() -> Option<String> {
    LocalPostgres::shared().map(LocalPostgres::fresh_database)
}

/// A store on a new empty database; returns from the test when PostgreSQL
/// is not available (after the harness said so).
macro_rules! store_or_skip {
    () => {
        store_or_skip!(PostgresOptions::default())
    };
    ($options:expr) => {{
        let Some(url) = database() else { return };
        let store = PostgresCheckpoint::connect(&url, $options).await.expect("connect");
        (store, url)
    }};
}

/// Another store on the database at `url`: another node, or another
/// process.
async fn another_handle(url: &str) -> PostgresCheckpoint {
    PostgresCheckpoint::connect(url, PostgresOptions::default())
        .await
        .expect("another store on the database")
}

/// A plain connection, for looking behind the store's back.
async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("raw connection");
    tokio::spawn(connection);
    client
}

async fn raw_count(url: &str, sql: &str) -> i64 {
    raw(url).await.query_one(sql, &[]).await.expect("count").get(0)
}

fn context(bot_id: &str) -> SessionContext {
    SessionContext {
        bot_id: bot_id.into(),
        metadata: serde_json::Map::new(),
        settings: Some(serde_json::json!({"model": "script:x"})),
        ..SessionContext::default()
    }
}

fn checkpoint(session_id: &str, bot_id: &str, model_calls: u64) -> Checkpoint {
    Checkpoint {
        session_id: session_id.into(),
        session_context: context(bot_id),
        model_calls,
        turns_completed: model_calls / 2,
        usage: TokenUsage {
            input_tokens: model_calls * 100,
            ..TokenUsage::default()
        },
        approved_tools: Default::default(),
        compaction: None,
        last_turn: None,
        project_instructions: None,
    }
}

fn user(text: &str) -> TranscriptItem {
    TranscriptItem::UserMessage { text: text.into() }
}

fn execution(turn_id: &str) -> TurnExecution {
    TurnExecution {
        turn_id: turn_id.into(),
        submission_ids: vec![format!("{turn_id}-sub")],
        started_at_ms: 1_764_430_000_000,
        step: 1,
        awaiting_approval: vec!["call-1".into()],
        decisions: Default::default(),
        started_calls: None,
        awaiting_client: Vec::new(),
        client_deadlines: Default::default(),
        trace: None,
    }
}

async fn create(store: &PostgresCheckpoint, session_id: &str) {
    create_for(store, session_id, "bot").await;
}

async fn create_for(store: &PostgresCheckpoint, session_id: &str, bot_id: &str) {
    store
        .save(&checkpoint(session_id, bot_id, 0), &[], None)
        .await
        .expect("create session");
}

/// The `n`th event of a made-up session; kinds and payloads vary.
fn event(session_id: &str, n: usize) -> Event {
    let turn_id = format!("{session_id}-turn-{}", n / 3);
    let msg = match n % 3 {
        0 => EventMsg::TurnStarted(TurnStartedEvent {
            turn_id,
            trace_id: None,
        }),
        1 => EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
            turn_id,
            delta: format!("delta {n} of {session_id}: ünïcødé ✓ \"quoted\" \\ \n"),
        }),
        _ => EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
            turn_id,
            delta: "x".repeat(n * 50),
        }),
    };
    Event {
        submission_id: n.is_multiple_of(2).then(|| format!("{session_id}-submission-{n}")),
        msg,
    }
}

fn events(session_id: &str, from: usize, count: usize) -> Vec<Event> {
    (from..from + count).map(|n| event(session_id, n)).collect()
}

fn queued(id: &str, key: Option<&str>) -> Event {
    Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            traceparent: None,
            op: Op::UserInput {
                text: format!("text of {id}"),
            },
            on_busy: BusyPolicy::Queue,
            idempotency_key: key.map(str::to_owned),
            submitted_by: None,
        }),
    }
}

fn encode(events: &[Event]) -> Vec<EncodedEvent> {
    events
        .iter()
        .map(|event| EncodedEvent::encode(event).expect("encode event"))
        .collect()
}

fn batch(events: &[Event]) -> AppendBatch {
    AppendBatch {
        lease: None,
        events: encode(events),
        checkpoint: None,
    }
}

/// An event marked as settling queued submission `id`.
fn settling(session_id: &str, n: usize, id: &str) -> EncodedEvent {
    let mut encoded = encode(&events(session_id, n, 1));
    encoded[0].queue = Some(QueueChange::Settled(id.into()));
    encoded.remove(0)
}

fn recorded(receipt: AppendReceipt, events: &[Event]) -> Vec<RecordedEvent> {
    (receipt.first_sequence..)
        .zip(events)
        .map(|(sequence, event)| RecordedEvent {
            sequence,
            recorded_at_ms: receipt.recorded_at_ms,
            event: event.clone(),
        })
        .collect()
}

async fn append(store: &PostgresCheckpoint, session_id: &str, events: &[Event]) -> Vec<RecordedEvent> {
    let receipt = store.append(session_id, batch(events)).await.expect("append");
    recorded(receipt, events)
}

/// Appends `events` in one batch that cuts the history to `cut` items, then
/// adds `history`.
async fn append_with_cut(
    store: &PostgresCheckpoint,
    session_id: &str,
    events: &[Event],
    cut: Option<u64>,
    history: &[TranscriptItem],
) -> Result<AppendReceipt, StoreError> {
    let mut batch = batch(events);
    batch.checkpoint = Some(CheckpointWrite {
        checkpoint: checkpoint(session_id, "bot", 0),
        transcript_delta: history.to_vec(),
        execution: None,
        history_cut: cut,
    });
    store.append(session_id, batch).await
}

/// A session's whole log, read backwards page by page (`limit` a page).
async fn whole_log(store: &PostgresCheckpoint, session_id: &str, limit: usize) -> Vec<RecordedEvent> {
    let mut pages = Vec::new();
    let mut before_sequence = None;
    loop {
        let page = store
            .event_page(session_id, EventPageRequest { before_sequence, limit })
            .await
            .expect("event page");
        let has_more = page.has_more;
        before_sequence = page.events.first().map(|event| event.sequence);
        pages.push(page.events);
        if !has_more {
            break;
        }
    }
    pages.into_iter().rev().flatten().collect()
}

fn assert_gap_free(log: &[RecordedEvent]) {
    let sequences: Vec<u64> = log.iter().map(|event| event.sequence).collect();
    let expected: Vec<u64> = (1..=log.len() as u64).collect();
    assert_eq!(sequences, expected, "sequences start at 1 without gaps");
}

async fn last_sequence(store: &PostgresCheckpoint, session_id: &str) -> u64 {
    store
        .load(session_id)
        .await
        .expect("load")
        .expect("session exists")
        .last_sequence
}

// ---------------------------------------------------------------------------
// Sequences and group commit
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_stay_gap_free_across_concurrent_appends_to_many_sessions() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        let store = Arc::new(store);
        let sessions: Vec<String> = (0..24).map(|index| format!("s{index}")).collect();
        for id in &sessions {
            create(&store, id).await;
        }
        // Every session's appends run concurrently with every other's, and
        // with each other (a session's tasks race for its sequence).
        let tasks = sessions.iter().flat_map(|id| {
            (0..4).map({
                let store = Arc::clone(&store);
                move |task| {
                    let (store, id) = (Arc::clone(&store), id.clone());
                    tokio::spawn(async move {
                        let mut written = Vec::new();
                        for round in 0..5 {
                            let from = (task * 5 + round) * 3;
                            written.extend(append(&store, &id, &events(&id, from, 1 + round % 3)).await);
                        }
                        written
                    })
                }
            })
        });
        let mut by_session: std::collections::HashMap<String, Vec<RecordedEvent>> = Default::default();
        for (index, task) in join_all(tasks.collect::<Vec<_>>()).await.into_iter().enumerate() {
            by_session
                .entry(sessions[index / 4].clone())
                .or_default()
                .extend(task.expect("task"));
        }
        for id in &sessions {
            let log = whole_log(&store, id, 7).await;
            assert_gap_free(&log);
            let mut expected = by_session.remove(id).expect("written");
            expected.sort_by_key(|event| event.sequence);
            assert_eq!(log, expected, "{id}: the log is exactly what was acknowledged");
            assert_eq!(last_sequence(&store, id).await, log.len() as u64);
            assert_eq!(store.events_after(id, 0, MAX_EVENT_PAGE).await.expect("after"), log);
        }
    })
    .await;
}

/// Submits every future at once (on a current-thread runtime, all are
/// queued before the writer runs).
async fn all_at_once<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    join_all(futures).await
}

#[tokio::test]
async fn a_group_commit_carries_many_jobs_and_per_event_commits_each_alone() {
    guarded(async {
        let (grouped, url) = store_or_skip!();
        let per_event = PostgresCheckpoint::connect(
            &url,
            PostgresOptions {
                per_event: true,
                ..PostgresOptions::default()
            },
        )
        .await
        .expect("connect");
        for index in 0..50 {
            create(&grouped, &format!("s{index}")).await;
        }
        let before = grouped.stats();
        let outcomes = all_at_once((0..200).map(|index| {
            let id = format!("s{}", index % 50);
            let store = &grouped;
            async move { store.append(&id, batch(&events(&id, index, 2))).await }
        }))
        .await;
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        let after = grouped.stats();
        let (commits, jobs, written) = (
            after.commits - before.commits,
            after.jobs - before.jobs,
            after.events - before.events,
        );
        eprintln!("grouped: {jobs} jobs, {written} events in {commits} commits");
        assert_eq!((jobs, written), (200, 400));
        assert!(commits * 10 <= jobs, "{commits} commits for {jobs} jobs");
        assert!(after.commit_micros > before.commit_micros);
        assert_eq!(after.checkpoints, 0);

        let before = per_event.stats();
        let outcomes = all_at_once((0..40).map(|index| {
            let id = format!("s{}", index % 10);
            let store = &per_event;
            async move { store.append(&id, batch(&events(&id, index, 1))).await }
        }))
        .await;
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
        let after = per_event.stats();
        eprintln!(
            "per event: {} jobs in {} commits",
            after.jobs - before.jobs,
            after.commits - before.commits
        );
        assert_eq!((after.commits - before.commits, after.jobs - before.jobs), (40, 40));
        for index in 0..50 {
            assert_gap_free(&whole_log(&grouped, &format!("s{index}"), MAX_EVENT_PAGE).await);
        }
        per_event.close().await;
        grouped.close().await;
    })
    .await;
}

#[tokio::test]
async fn jobs_that_fail_in_a_group_write_nothing_and_the_others_commit() {
    guarded(async {
        let (store, url) = store_or_skip!();
        create(&store, "a").await;
        create(&store, "b").await;
        // A checkpoint PostgreSQL cannot store (a NUL in a text column)
        // fails a statement: the group is retried job by job.
        let mut poisoned = checkpoint("b", "bot\0", 1);
        poisoned.model_calls = 9;
        let before = store.stats();
        let outcomes = all_at_once([
            Box::pin(store.append("a", batch(&events("a", 0, 2)))) as futures::future::BoxFuture<'_, _>,
            Box::pin(store.append("nobody", batch(&events("nobody", 0, 1)))),
            Box::pin(store.append(
                "b",
                AppendBatch {
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: poisoned,
                        transcript_delta: vec![user("lost")],
                        execution: None,
                        history_cut: None,
                    }),
                    ..batch(&events("b", 0, 3))
                },
            )),
            Box::pin(store.append(
                "a",
                AppendBatch {
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("other", "bot", 0),
                        transcript_delta: vec![],
                        execution: None,
                        history_cut: None,
                    }),
                    ..batch(&events("a", 2, 1))
                },
            )),
            Box::pin(store.append("a", batch(&events("a", 3, 1)))),
        ])
        .await;
        assert_eq!(outcomes[0].as_ref().map(|receipt| receipt.first_sequence).ok(), Some(1));
        assert!(matches!(&outcomes[1], Err(StoreError::UnknownSession(id)) if id == "nobody"));
        let Err(StoreError::Backend(poisoned)) = &outcomes[2] else {
            panic!("{:?}", outcomes[2])
        };
        assert_ne!(poisoned.to_string(), "db error", "the server's message is shown");
        assert!(matches!(&outcomes[3], Err(StoreError::Invalid(_))), "{:?}", outcomes[3]);
        assert_eq!(outcomes[4].as_ref().map(|receipt| receipt.first_sequence).ok(), Some(3));
        // Nothing of the failed jobs: b is as created, a has its 3 events.
        let b = store.load("b").await.expect("load").expect("b");
        assert_eq!(
            (b.last_sequence, b.transcript.len(), b.checkpoint.model_calls),
            (0, 0, 0)
        );
        assert_eq!(last_sequence(&store, "a").await, 3);
        assert_eq!(raw_count(&url, "SELECT count(*) FROM sessions").await, 2);
        let after = store.stats();
        assert_eq!(after.jobs - before.jobs, 2, "only what was written counts");
        assert_eq!(after.events - before.events, 3);
    })
    .await;
}

#[tokio::test]
async fn append_open_takes_additions_until_the_writer_seals_the_batch() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        create(&store, "s").await;
        let open = Arc::new(OpenBatch::new(batch(&events("s", 0, 1))));
        let mut pending = store.append_open("s", Arc::clone(&open));
        // Submitted; the writer has not run yet (this runtime has one
        // thread and this task has not yielded).
        assert!(futures::poll!(&mut pending).is_pending());
        assert!(open.add(|batch| batch.extend(encode(&events("s", 1, 2)), None)));
        let receipt = pending.await.expect("append");
        assert_eq!(receipt.first_sequence, 1);
        assert!(!open.add(|_| ()), "sealed once written");
        assert_eq!(whole_log(&store, "s", 10).await, recorded(receipt, &events("s", 0, 3)));
    })
    .await;
}

// ---------------------------------------------------------------------------
// Atomicity, fencing, creation
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_batch_and_its_checkpoint_write_commit_together_or_not_at_all() {
    guarded(async {
        let (store, url) = store_or_skip!();
        assert!(matches!(
            store.append("s", batch(&events("s", 0, 1))).await,
            Err(StoreError::UnknownSession(_))
        ));
        store
            .save(&checkpoint("s", "bot", 0), &[user("seed")], None)
            .await
            .expect("create");
        let write = CheckpointWrite {
            checkpoint: checkpoint("s", "bot", 4),
            transcript_delta: vec![user("one"), user("two")],
            execution: Some(execution("t1")),
            history_cut: None,
        };
        let receipt = store
            .append(
                "s",
                AppendBatch {
                    checkpoint: Some(write),
                    ..batch(&events("s", 0, 3))
                },
            )
            .await
            .expect("append");
        assert_eq!(receipt.first_sequence, 1);
        let state = store.load("s").await.expect("load").expect("s");
        assert_eq!(state.checkpoint, checkpoint("s", "bot", 4));
        assert_eq!(state.transcript, vec![user("seed"), user("one"), user("two")]);
        assert_eq!(state.execution, Some(execution("t1")));
        assert_eq!(state.last_sequence, 3);
        // A checkpoint of another session: refused, nothing written.
        let refused = store
            .append(
                "s",
                AppendBatch {
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("t", "bot", 9),
                        transcript_delta: vec![user("no")],
                        execution: None,
                        history_cut: None,
                    }),
                    ..batch(&events("s", 3, 2))
                },
            )
            .await;
        assert!(matches!(refused, Err(StoreError::Invalid(_))), "{refused:?}");
        let again = store.load("s").await.expect("load").expect("s");
        assert_eq!(again, state);
        assert_eq!(raw_count(&url, "SELECT count(*) FROM log").await, 2);
        // A save without execution clears the turn in flight.
        store.save(&checkpoint("s", "bot", 5), &[], None).await.expect("save");
        let saved = store.load("s").await.expect("load").expect("s");
        assert_eq!((saved.execution, saved.checkpoint.model_calls), (None, 5));
    })
    .await;
}

#[tokio::test]
async fn a_newer_lease_fences_off_the_older_holder_and_nothing_it_sends_is_written() {
    guarded(async {
        let (store, url) = store_or_skip!();
        assert!(matches!(store.acquire("s").await, Err(StoreError::UnknownSession(_))));
        create(&store, "s").await;
        let first = store.acquire("s").await.expect("first lease");
        let with_lease = |lease, from| AppendBatch {
            lease: Some(lease),
            ..batch(&events("s", from, 2))
        };
        let kept = store
            .append("s", with_lease(first, 0))
            .await
            .expect("the holder writes");
        // Another store (another process) takes the session over.
        let other = another_handle(&url).await;
        let second = other.acquire("s").await.expect("taken over");
        assert!(second > first);
        let mut fenced = with_lease(first, 2);
        fenced.checkpoint = Some(CheckpointWrite {
            checkpoint: checkpoint("s", "bot", 7),
            transcript_delta: vec![user("stale")],
            execution: None,
            history_cut: None,
        });
        let refused = store.append("s", fenced).await;
        assert!(
            matches!(&refused, Err(StoreError::Fenced { session_id, lease }) if session_id == "s" && *lease == second),
            "{refused:?}"
        );
        let state = store.load("s").await.expect("load").expect("s");
        assert_eq!(
            (
                state.last_sequence,
                state.transcript.len(),
                state.checkpoint.model_calls
            ),
            (2, 0, 0)
        );
        let next = other
            .append("s", with_lease(second, 2))
            .await
            .expect("the new holder writes");
        assert_eq!((kept.first_sequence, next.first_sequence), (1, 3));
        // Writers without a lease are not fenced.
        store
            .append("s", batch(&events("s", 4, 1)))
            .await
            .expect("unleased append");
        let leases: i64 = raw(&url)
            .await
            .query_one("SELECT lease FROM sessions WHERE id = 's'", &[])
            .await
            .expect("lease")
            .get(0);
        assert_eq!(leases as u64, second);
    })
    .await;
}

#[tokio::test]
async fn create_makes_a_session_with_its_first_events_once_even_across_stores() {
    guarded(async {
        let (first, url) = store_or_skip!();
        let second = another_handle(&url).await;
        let history = [user("seed")];
        let attempts = (0..8).map(|index| {
            let store = if index % 2 == 0 { &first } else { &second };
            let events = encode(&events("new", 0, 2));
            let checkpoint = checkpoint("new", "bot", 0);
            let history = &history;
            async move { store.create(&checkpoint, history, events).await }
        });
        let outcomes = join_all(attempts).await;
        let created = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
        assert_eq!(created, 1, "{outcomes:?}");
        assert!(
            outcomes.iter().all(|outcome| match outcome {
                Ok(receipt) => receipt.first_sequence == 1,
                Err(StoreError::Exists(id)) => id == "new",
                Err(_) => false,
            }),
            "{outcomes:?}"
        );
        let state = second.load("new").await.expect("load").expect("created");
        assert_eq!((state.last_sequence, state.transcript), (2, vec![user("seed")]));
        create(&first, "old").await;
        let refused = first
            .create(&checkpoint("old", "other", 0), &history, encode(&events("old", 0, 1)))
            .await;
        assert!(matches!(refused, Err(StoreError::Exists(_))), "{refused:?}");
        let old = first.load("old").await.expect("load").expect("old");
        assert_eq!((old.last_sequence, old.transcript.len()), (0, 0));
        assert_eq!(old.checkpoint.session_context.bot_id, "bot");
    })
    .await;
}

// ---------------------------------------------------------------------------
// The queue, idempotency keys, titles
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_queue_and_idempotency_keys_are_written_from_the_events() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        create(&store, "s").await;
        append(&store, "s", &events("s", 0, 2)).await;
        append(&store, "s", &[queued("q1", Some("key-1")), queued("q2", None)]).await;
        let state = store.load("s").await.expect("load").expect("s");
        let stored: Vec<(&str, u64)> = state.queued.iter().map(|q| (q.id.as_str(), q.sequence)).collect();
        assert_eq!(stored, [("q1", 3), ("q2", 4)]);
        assert_eq!(
            state.queued[0].op,
            Op::UserInput {
                text: "text of q1".into()
            }
        );
        assert_eq!(
            store.keyed_submission("s", "key-1").await.expect("key"),
            Some(KeyedSubmission {
                submission_id: "q1".into(),
                sequence: 3
            })
        );
        assert_eq!(store.keyed_submission("s", "key-2").await.expect("key"), None);
        assert_eq!(store.keyed_submission("other", "key-1").await.expect("key"), None);
        // Settled in the commit of the event that takes it up.
        store
            .append(
                "s",
                AppendBatch {
                    lease: None,
                    events: vec![settling("s", 5, "q1")],
                    checkpoint: None,
                },
            )
            .await
            .expect("settle");
        let state = store.load("s").await.expect("load").expect("s");
        assert_eq!(state.queued.iter().map(|q| q.id.as_str()).collect::<Vec<_>>(), ["q2"]);
        assert!(store.keyed_submission("s", "key-1").await.expect("key").is_some());
        // A key used by two submissions in one batch refuses the batch
        // whole: a key names one submission.
        let mut both = encode(&[queued("q3", Some("key-3")), queued("q4", Some("key-3"))]);
        both.push(settling("s", 6, "q3"));
        let refused = store
            .append(
                "s",
                AppendBatch {
                    lease: None,
                    events: both,
                    checkpoint: None,
                },
            )
            .await;
        assert!(matches!(refused, Err(StoreError::Invalid(_))), "{refused:?}");
        // Queued and settled in one batch: it never shows.
        let mut settled_too = encode(&[queued("q3", Some("key-3"))]);
        settled_too.push(settling("s", 6, "q3"));
        store
            .append(
                "s",
                AppendBatch {
                    lease: None,
                    events: settled_too,
                    checkpoint: None,
                },
            )
            .await
            .expect("append");
        let state = store.load("s").await.expect("load").expect("s");
        assert_eq!(state.queued.iter().map(|q| q.id.as_str()).collect::<Vec<_>>(), ["q2"]);
        assert_eq!(
            store.keyed_submission("s", "key-3").await.expect("key"),
            Some(KeyedSubmission {
                submission_id: "q3".into(),
                sequence: 6
            })
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// History: cuts and past histories
// ---------------------------------------------------------------------------

#[tokio::test]
async fn history_until_takes_the_batches_up_to_a_sequence_and_never_splits_one() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        store
            .save(&checkpoint("s", "bot", 0), &[user("seed")], None)
            .await
            .expect("create");
        append_with_cut(&store, "s", &events("s", 1, 2), None, &[user("one"), user("A")])
            .await
            .expect("1-2");
        append(&store, "s", &events("s", 3, 1)).await; // 3, no history
        append_with_cut(&store, "s", &events("s", 4, 3), None, &[user("two")])
            .await
            .expect("4-6");
        let until = |at| store.history_until("s", at);
        assert_eq!(until(0).await.expect("read"), Some(vec![user("seed")]));
        let first = Some(vec![user("seed"), user("one"), user("A")]);
        assert_eq!(until(2).await.expect("read"), first);
        assert_eq!(until(3).await.expect("read"), first);
        assert_eq!(
            until(6).await.expect("read"),
            Some(vec![user("seed"), user("one"), user("A"), user("two")])
        );
        for inside in [1, 4, 5] {
            let refused = until(inside).await;
            assert!(matches!(refused, Err(StoreError::Invalid(_))), "{inside}: {refused:?}");
        }
        assert!(matches!(until(7).await, Err(StoreError::Invalid(_))), "past the log");
        assert_eq!(store.history_until("nobody", 0).await.expect("read"), None);
        assert_eq!(store.load("s").await.expect("load").expect("s").transcript.len(), 4);
    })
    .await;
}

#[tokio::test]
async fn a_history_cut_drops_the_newest_items_and_a_cut_too_long_is_refused() {
    guarded(async {
        let (store, url) = store_or_skip!();
        create(&store, "s").await;
        append_with_cut(&store, "s", &events("s", 1, 2), None, &[user("one"), user("A")])
            .await
            .expect("1-2");
        append_with_cut(&store, "s", &events("s", 3, 2), None, &[user("two"), user("B")])
            .await
            .expect("3-4");
        append_with_cut(&store, "s", &events("s", 5, 2), Some(2), &[user("two"), user("C")])
            .await
            .expect("cut, 5-6");
        let expected = vec![user("one"), user("A"), user("two"), user("C")];
        let loaded = store.load("s").await.expect("load").expect("s");
        assert_eq!((loaded.transcript.clone(), loaded.last_sequence), (expected.clone(), 6));
        assert_eq!(
            store.history_until("s", 4).await.expect("read").expect("s")[3],
            user("B")
        );
        assert_eq!(store.history_until("s", 6).await.expect("read"), Some(expected.clone()));
        // Too long a cut is refused before anything is written (even
        // with a stale lease, the cut is what is reported, as on SQLite).
        let refused = append_with_cut(&store, "s", &events("s", 7, 1), Some(5), &[]).await;
        assert!(
            matches!(&refused, Err(StoreError::Invalid(message)) if message.contains("it has 4")),
            "{refused:?}"
        );
        let after = store.load("s").await.expect("load").expect("s");
        assert_eq!((after.transcript, after.last_sequence), (expected.clone(), 6));
        // A cut with nothing added; a second store reads the same.
        append_with_cut(&store, "s", &events("s", 7, 1), Some(1), &[])
            .await
            .expect("cut");
        store.close().await;
        let store = another_handle(&url).await;
        let reopened = store.load("s").await.expect("load").expect("s");
        assert_eq!((reopened.transcript, reopened.last_sequence), (vec![user("one")], 7));
        assert_eq!(store.history_until("s", 6).await.expect("read"), Some(expected));
    })
    .await;
}

// ---------------------------------------------------------------------------
// Reading: pages, listings, sessions with work, deletion
// ---------------------------------------------------------------------------

#[tokio::test]
async fn event_pages_and_events_after_page_through_batches_both_ways() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        create(&store, "s").await;
        create(&store, "other").await;
        let mut written = Vec::new();
        for (from, count) in [(0, 3), (3, 1), (4, 5), (9, 2)] {
            written.extend(append(&store, "s", &events("s", from, count)).await);
            append(&store, "other", &events("other", from, 1)).await;
        }
        // A batch that only adds history is invisible to the log.
        store
            .save(&checkpoint("s", "bot", 1), &[user("h")], None)
            .await
            .expect("save");
        for limit in [1, 2, 3, 4, 11, 50] {
            assert_eq!(whole_log(&store, "s", limit).await, written, "pages of {limit}");
        }
        let newest = store
            .event_page(
                "s",
                EventPageRequest {
                    before_sequence: None,
                    limit: 4,
                },
            )
            .await
            .expect("page");
        assert_eq!((newest.events, newest.has_more), (written[7..].to_vec(), true));
        let zero = store
            .event_page(
                "s",
                EventPageRequest {
                    before_sequence: None,
                    limit: 0,
                },
            )
            .await
            .expect("page");
        assert!(zero.events.is_empty() && zero.has_more);
        assert_eq!(store.events_after("s", 0, 100).await.expect("all"), written);
        assert_eq!(
            store.events_after("s", 2, 4).await.expect("middle"),
            written[2..6].to_vec()
        );
        assert_eq!(store.events_after("s", 11, 10).await.expect("end"), vec![]);
        assert_eq!(store.events_after("s", u64::MAX, 10).await.expect("past"), vec![]);
        assert_eq!(store.events_after("s", 0, 0).await.expect("none"), vec![]);
        create(&store, "empty").await;
        let empty = store
            .event_page(
                "empty",
                EventPageRequest {
                    before_sequence: None,
                    limit: 5,
                },
            )
            .await
            .expect("page");
        assert!(empty.events.is_empty() && !empty.has_more);
        assert!(matches!(
            store.events_after("missing", 0, 10).await,
            Err(StoreError::UnknownSession(_))
        ));
        assert!(matches!(
            store
                .event_page(
                    "missing",
                    EventPageRequest {
                        before_sequence: None,
                        limit: 5
                    }
                )
                .await,
            Err(StoreError::UnknownSession(_))
        ));
    })
    .await;
}

#[tokio::test]
async fn sessions_are_listed_newest_first_by_cursor_and_by_bot() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        for (id, bot) in [("a", "x"), ("b", "y"), ("c", "x"), ("d", "y"), ("e", "x")] {
            create_for(&store, id, bot).await;
        }
        append(&store, "a", &events("a", 0, 1)).await;
        let pages = |bot: Option<&'static str>| {
            let store = &store;
            async move {
                let mut seen = Vec::new();
                let mut cursor = None;
                loop {
                    let page = store
                        .list_sessions_page(cursor.as_deref(), 2, crate::SessionFilter::bot(bot))
                        .await
                        .expect("page");
                    assert!(page.sessions.len() <= 2);
                    seen.extend(page.sessions.into_iter().map(|summary| summary.session_id));
                    match page.next_cursor {
                        Some(next) => cursor = Some(next),
                        None => break seen,
                    }
                }
            }
        };
        assert_eq!(pages(None).await, ["e", "d", "c", "b", "a"]);
        assert_eq!(pages(Some("x")).await, ["e", "c", "a"]);
        assert_eq!(pages(Some("nobody")).await, Vec::<String>::new());
        assert!(matches!(
            store
                .list_sessions_page(Some("not-a-cursor"), 2, crate::SessionFilter::bot(None))
                .await,
            Err(StoreError::Invalid(_))
        ));
        let recent = store.list_sessions(2).await.expect("list");
        assert_eq!(recent[0].session_id, "a", "the newest update first");
        let summary = store.session_summary("a").await.expect("summary").expect("a");
        assert_eq!((summary.last_sequence, summary.bot_id.as_str()), (1, "x"));
        assert_eq!(summary.context, context("x"));
        assert_eq!(store.session_summary("zzz").await.expect("summary"), None);
    })
    .await;
}

#[tokio::test]
async fn sessions_with_work_lists_queued_messages_and_turns_in_flight_in_pages() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        // Ids that a locale's collation would order differently from bytes.
        for id in ["B-idle", "a-queued", "Z-running", "d-settled"] {
            create(&store, id).await;
        }
        append(&store, "a-queued", &[queued("q1", None)]).await;
        append(&store, "d-settled", &[queued("q2", None)]).await;
        store
            .append(
                "d-settled",
                AppendBatch {
                    lease: None,
                    events: vec![settling("d-settled", 1, "q2")],
                    checkpoint: None,
                },
            )
            .await
            .expect("settle");
        store
            .save(&checkpoint("Z-running", "bot", 1), &[], Some(&execution("t")))
            .await
            .expect("a turn in flight");
        assert_eq!(
            store.sessions_with_work(None, 10).await.expect("list"),
            ["Z-running", "a-queued"]
        );
        assert_eq!(store.sessions_with_work(None, 1).await.expect("list"), ["Z-running"]);
        assert_eq!(
            store.sessions_with_work(Some("Z-running"), 1).await.expect("list"),
            ["a-queued"]
        );
        assert!(
            store
                .sessions_with_work(Some("a-queued"), 1)
                .await
                .expect("list")
                .is_empty()
        );
    })
    .await;
}

#[tokio::test]
async fn delete_session_removes_everything_of_it_and_only_it() {
    guarded(async {
        let (store, url) = store_or_skip!();
        create(&store, "gone").await;
        create(&store, "kept").await;
        append(&store, "gone", &[queued("q1", Some("k"))]).await;
        append(&store, "kept", &[queued("q2", Some("k"))]).await;
        assert!(store.delete_session("gone").await.expect("delete"));
        assert!(!store.delete_session("gone").await.expect("delete again"));
        assert_eq!(store.load("gone").await.expect("load"), None);
        assert!(matches!(
            store.append("gone", batch(&events("gone", 1, 1))).await,
            Err(StoreError::UnknownSession(_))
        ));
        for table in ["sessions", "log", "queued_submissions", "submission_keys"] {
            assert_eq!(
                raw_count(&url, &format!("SELECT count(*) FROM {table}")).await,
                1,
                "{table}"
            );
        }
        assert_eq!(store.load("kept").await.expect("load").expect("kept").queued.len(), 1);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Connecting, migrations, errors
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_newer_schema_is_refused_and_left_unchanged() {
    guarded(async {
        let (store, url) = store_or_skip!();
        create(&store, "s").await;
        store.close().await;
        assert!(matches!(store.load("s").await, Err(StoreError::Closed)));
        assert!(matches!(store.acquire("s").await, Err(StoreError::Closed)));
        raw(&url)
            .await
            .execute("UPDATE keel_schema SET version = 99", &[])
            .await
            .expect("bump");
        let refused = PostgresCheckpoint::connect(&url, PostgresOptions::default()).await;
        assert!(
            matches!(
                refused,
                Err(StoreError::SchemaTooNew { found: 99, supported }) if supported == i64::from(schema::SCHEMA_VERSION)
            ),
            "{refused:?}"
        );
        assert_eq!(raw_count(&url, "SELECT version::bigint FROM keel_schema").await, 99);
        assert_eq!(raw_count(&url, "SELECT count(*) FROM sessions").await, 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opening_one_new_database_at_once_migrate_it_once() {
    guarded(async {
        let Some(url) = database() else { return };
        let opened = join_all((0..4).map(|_| PostgresCheckpoint::connect(&url, PostgresOptions::default()))).await;
        let stores: Vec<PostgresCheckpoint> = opened.into_iter().map(|store| store.expect("connect")).collect();
        assert_eq!(raw_count(&url, "SELECT count(*) FROM keel_schema").await, 1);
        create(&stores[0], "s").await;
        assert!(stores[3].load("s").await.expect("load").is_some());
    })
    .await;
}

#[tokio::test]
async fn a_malformed_url_or_an_unreachable_server_is_a_clear_error() {
    guarded(async {
        for url in [
            "postgres://user@host:notaport/db",
            "postgres://[::1/db",
            "not a url = at all",
        ] {
            let refused = PostgresCheckpoint::connect(url, PostgresOptions::default()).await;
            let Err(StoreError::Invalid(message)) = &refused else {
                panic!("{url}: {refused:?}")
            };
            assert!(message.starts_with("malformed PostgreSQL URL: "), "{message}");
        }
        // A loopback port nothing listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("free port")
            .port();
        let refused = PostgresCheckpoint::connect(
            &format!("postgres://keel@127.0.0.1:{port}/keel"),
            PostgresOptions::default(),
        )
        .await;
        let Err(error) = refused else {
            panic!("connected to nothing")
        };
        assert!(matches!(error, StoreError::Unavailable(_)), "{error:?}");
        let message = error.to_string();
        assert!(!message.contains('\n'), "{message}");
        assert!(message.contains("refused"), "{message}");
        // A database that does not exist on a live server.
        let Some(server) = LocalPostgres::shared() else { return };
        let missing = PostgresCheckpoint::connect(&server.url("no_such_database"), PostgresOptions::default()).await;
        let Err(error) = missing else {
            panic!("connected to a database that does not exist")
        };
        assert!(matches!(error, StoreError::Backend(_)), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("no_such_database") && !message.contains('\n'),
            "{message}"
        );
    })
    .await;
}

#[tokio::test]
async fn the_writer_reconnects_after_its_connection_is_killed() {
    guarded(async {
        let (store, url) = store_or_skip!();
        create(&store, "s").await;
        append(&store, "s", &events("s", 0, 1)).await;
        let killed: i64 = raw(&url)
            .await
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE datname = current_database() AND application_name = 'keel'",
                &[],
            )
            .await
            .expect("terminate")
            .get(0);
        assert!(killed >= 1);
        // A write may find the connection gone (at most one: the writer
        // then reconnects by itself); none is lost once acknowledged.
        let mut acknowledged = 1;
        for n in 1..6 {
            match store.append("s", batch(&events("s", n, 1))).await {
                Ok(_) => acknowledged += 1,
                Err(StoreError::Unavailable(message)) => assert!(!message.contains('\n')),
                Err(other) => panic!("{other:?}"),
            }
        }
        assert!(acknowledged >= 5, "{acknowledged} of 6 acknowledged");
        let log = loop {
            match store.events_after("s", 0, 100).await {
                Ok(log) => break log,
                // A pooled read connection was killed too.
                Err(StoreError::Unavailable(_)) => continue,
                Err(other) => panic!("{other:?}"),
            }
        };
        assert_eq!(log.len(), acknowledged);
        assert_gap_free(&log);
    })
    .await;
}

#[tokio::test]
async fn a_stopped_server_is_unavailable_and_the_store_recovers_once_it_is_back() {
    guarded(async {
        // A server of this test's own: stopping the shared one would fail
        // the tests running beside it.
        let Some(server) = LocalPostgres::own() else { return };
        let url = server.fresh_database();
        let store = another_handle(&url).await;
        create(&store, "s").await;
        let mut written = append(&store, "s", &events("s", 0, 2)).await;
        server.stop();
        let refused = store.append("s", batch(&events("s", 2, 1))).await;
        let Err(StoreError::Unavailable(message)) = refused else {
            panic!("a write with the server down: {refused:?}")
        };
        assert!(!message.contains('\n'), "{message}");
        let unread = store.load("s").await;
        assert!(matches!(unread, Err(StoreError::Unavailable(_))), "{unread:?}");
        let unopened = PostgresCheckpoint::connect(&url, PostgresOptions::default()).await;
        assert!(matches!(unopened, Err(StoreError::Unavailable(_))), "{unopened:?}");
        server.start();
        // The writer and the pool reconnect by themselves; the refused
        // write was not stored.
        written.extend(append(&store, "s", &events("s", 3, 2)).await);
        let log = store.events_after("s", 0, 100).await.expect("read after the restart");
        assert_eq!(log, written);
        assert_gap_free(&log);
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn usage_of_many_sessions_of_one_tenant_in_one_group_is_one_commit() {
    use crate::{AccessStore, BudgetTarget};
    guarded(async {
        let (store, _url) = store_or_skip!();
        let ids: Vec<String> = (0..12).map(|n| format!("s{n}")).collect();
        for id in &ids {
            store
                .save(&crate::conformance::tenant_checkpoint(id, "bot", "acme"), &[], None)
                .await
                .expect("save");
        }
        let before = store.stats();
        // Queued before the writer wakes: one group, one append statement,
        // whose twelve sessions share one ledger row of their tenant.
        let appended = join_all(
            ids.iter()
                .map(|id| store.append(id, batch(&[crate::conformance::used(10, 1)]))),
        )
        .await;
        assert!(appended.iter().all(Result::is_ok), "{appended:?}");
        assert_eq!(
            store.stats().commits - before.commits,
            1,
            "one group, not retried job by job"
        );
        let total = store
            .usage_total(&BudgetTarget::Tenant("acme".into()))
            .await
            .expect("total");
        assert_eq!((total.input_tokens, total.output_tokens), (120, 12));
    })
    .await;
}

#[tokio::test]
async fn the_jobs_of_one_session_in_one_group_apply_in_order() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        create(&store, "old").await;
        let before = store.stats();
        let (first, seed, second) = (checkpoint("new", "bot", 1), [user("seed")], checkpoint("new", "bot", 0));
        let (saved, appended, leased, again, created, deleted, renamed) = futures::join!(
            store.save(&first, &seed, None),
            store.append("new", batch(&events("new", 0, 2))),
            store.acquire("new"),
            store.append(
                "new",
                AppendBatch {
                    lease: Some(1),
                    ..batch(&events("new", 2, 1))
                }
            ),
            store.create(&second, &[], encode(&events("new", 3, 1))),
            store.delete_session("old"),
            store.rename_session("old", "gone by now"),
        );
        saved.expect("save");
        assert_eq!(appended.expect("append").first_sequence, 1);
        assert_eq!(leased.expect("acquire"), 1);
        assert_eq!(again.expect("append with the lease").first_sequence, 3);
        assert!(matches!(created, Err(StoreError::Exists(_))), "{created:?}");
        assert!(deleted.expect("delete"));
        assert!(!renamed.expect("rename"), "renamed after its deletion");
        assert_eq!(store.stats().commits - before.commits, 1, "one group");
        let state = store.load("new").await.expect("load").expect("new");
        assert_eq!((state.last_sequence, state.transcript), (3, vec![user("seed")]));
        assert_eq!(store.load("old").await.expect("load"), None);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Log notifications
// ---------------------------------------------------------------------------

use crate::{CarriedEvents, LogNotice, NoticeListener};

/// The next notice, failing the test if none comes in a generous while;
/// the events a log notice carries are checked to decode and end at its
/// sequence, then left out (see [`next_carrying`]).
async fn next_notice(listener: &mut NoticeListener) -> LogNotice {
    match next_carrying(listener).await {
        LogNotice::Log {
            session_id,
            last_sequence,
            carried: Some(carried),
        } => {
            let events = carried
                .events(&session_id, last_sequence)
                .expect("carried events decode");
            assert_eq!(events.last().map(|event| event.sequence), Some(last_sequence));
            log_notice(&session_id, last_sequence)
        }
        notice => notice,
    }
}

/// The next notice as it came.
async fn next_carrying(listener: &mut NoticeListener) -> LogNotice {
    tokio::time::timeout(Duration::from_secs(30), listener.recv())
        .await
        .expect("a notice in time")
        .expect("the listener runs")
}

fn log_notice(session_id: &str, last_sequence: u64) -> LogNotice {
    LogNotice::Log {
        session_id: session_id.to_owned(),
        last_sequence,
        carried: None,
    }
}

/// A commit's events ride with its notice when they are small enough, and
/// decode to what was appended (sequences and time included); larger ones
/// are announced alone, to be read.
#[tokio::test]
async fn a_log_notice_carries_the_events_of_its_commit_when_they_fit() {
    guarded(async {
        let (writer, url) = store_or_skip!();
        let other = another_handle(&url).await;
        let mut listener = other.listen().await.expect("listen");
        create(&writer, "s").await;
        append(&writer, "s", &events("s", 0, 2)).await;
        let small = append(&writer, "s", &events("s", 2, 3)).await;
        // Text that does not compress: a simple generator's digits.
        let mut state = 7u64;
        let noise: String = (0..12_000)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                char::from(b'0' + u8::try_from((state >> 33) % 10).unwrap_or(0))
            })
            .collect();
        let mut big: Vec<Event> = (0..39).map(|n| event("s", 5 + n)).collect();
        big.push(Event {
            submission_id: None,
            msg: EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
                turn_id: "s-turn-x".to_owned(),
                delta: noise,
            }),
        });
        let big = append(&writer, "s", &big).await;
        let mut carried = Vec::new();
        loop {
            match next_carrying(&mut listener).await {
                LogNotice::Log {
                    session_id,
                    last_sequence,
                    carried: notice_events,
                } if session_id == "s" => {
                    carried.push((
                        last_sequence,
                        notice_events.map(|events| events.events("s", last_sequence)),
                    ));
                    if last_sequence == 45 {
                        break;
                    }
                }
                _ => {}
            }
        }
        assert_eq!(carried.len(), 3, "one notice per commit");
        assert_eq!(carried[1].0, 5);
        assert_eq!(carried[1].1.clone().expect("carried").expect("decodes"), small);
        assert_eq!(big.len(), 40);
        assert!(carried[2].1.is_none(), "too large for a notice: read instead");
        // A damaged payload is an error, not a panic.
        let damaged = CarriedEvents {
            recorded_at_ms: 1,
            encoded: "not base64!".to_owned(),
        };
        assert!(matches!(damaged.events("s", 3), Err(StoreError::Corrupt { .. })));
        other.close().await;
        writer.close().await;
    })
    .await;
}

/// Appends one event to `sentinel` and returns every notice up to and
/// including its own: what was notified since the last check.
async fn notices_until_sentinel(
    store: &PostgresCheckpoint,
    listener: &mut NoticeListener,
    sentinel: &str,
) -> Vec<LogNotice> {
    let receipt = store
        .append(sentinel, batch(&events(sentinel, 0, 1)))
        .await
        .expect("sentinel append");
    let own = log_notice(sentinel, receipt.first_sequence);
    let mut seen = Vec::new();
    loop {
        let notice = next_notice(listener).await;
        let done = notice == own;
        seen.push(notice);
        if done {
            return seen;
        }
    }
}

#[tokio::test]
async fn every_commit_that_appends_is_notified_once_committed_to_listeners_of_any_node() {
    guarded(async {
        let (writer, url) = store_or_skip!();
        // Another handle on the database stands for another node.
        let other = another_handle(&url).await;
        let mut listener = other.listen().await.expect("listen");
        let mut own = writer.listen().await.expect("listen on the writer's node too");
        create(&writer, "s").await;
        create(&writer, "sentinel").await;
        // A save appends no events: no notice.
        assert_eq!(
            notices_until_sentinel(&writer, &mut listener, "sentinel").await,
            [log_notice("sentinel", 1)]
        );
        append(&writer, "s", &events("s", 0, 3)).await;
        assert_eq!(next_notice(&mut listener).await, log_notice("s", 3));
        assert_eq!(next_notice(&mut own).await, log_notice("sentinel", 1));
        assert_eq!(next_notice(&mut own).await, log_notice("s", 3));
        // A group commit: one notice per session, with its newest sequence;
        // a creation with events is notified too.
        create(&writer, "t").await;
        let u = checkpoint("u", "bot", 0);
        let (a, b, c) = futures::join!(
            writer.append("s", batch(&events("s", 3, 2))),
            writer.append("t", batch(&events("t", 0, 4))),
            writer.create(&u, &[], encode(&events("u", 0, 2))),
        );
        a.expect("s");
        b.expect("t");
        c.expect("u");
        let mut seen = notices_until_sentinel(&writer, &mut listener, "sentinel").await;
        seen.sort_by_key(|notice| format!("{notice:?}"));
        assert_eq!(
            seen,
            [
                log_notice("s", 5),
                log_notice("sentinel", 2),
                log_notice("t", 4),
                log_notice("u", 2)
            ]
        );
        // Not before the commit: with the session's row locked by another
        // transaction the append waits, and nothing is notified until it
        // has committed.
        let mut blocker = raw(&url).await;
        let holding = blocker.transaction().await.expect("begin");
        holding
            .execute("SELECT 1 FROM sessions WHERE id = 's' FOR UPDATE", &[])
            .await
            .expect("lock the row");
        let waiting = tokio::spawn({
            let url = url.clone();
            async move {
                let store = another_handle(&url).await;
                let receipt = store.append("s", batch(&events("s", 5, 1))).await.expect("append");
                store.close().await;
                receipt
            }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(listener.try_recv(), None, "nothing notified before the commit");
        holding.commit().await.expect("release the row");
        assert_eq!(waiting.await.expect("append").first_sequence, 6);
        assert_eq!(next_notice(&mut listener).await, log_notice("s", 6));
        // Ids with spaces come through whole.
        create(&writer, "with a space").await;
        append(&writer, "with a space", &events("with a space", 0, 1)).await;
        assert_eq!(next_notice(&mut listener).await, log_notice("with a space", 1));
        other.close().await;
        writer.close().await;
    })
    .await;
}

#[tokio::test]
async fn refused_and_rolled_back_writes_are_not_notified() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        let mut listener = store.listen().await.expect("listen");
        for id in ["fenced", "poisoned", "fine", "sentinel"] {
            create(&store, id).await;
        }
        let old = store.acquire("fenced").await.expect("lease");
        store.acquire("fenced").await.expect("taken over");
        let fenced = store
            .append(
                "fenced",
                AppendBatch {
                    lease: Some(old),
                    ..batch(&events("fenced", 0, 2))
                },
            )
            .await;
        assert!(matches!(fenced, Err(StoreError::Fenced { .. })), "{fenced:?}");
        let unknown = store.append("nobody", batch(&events("nobody", 0, 1))).await;
        assert!(matches!(unknown, Err(StoreError::UnknownSession(_))), "{unknown:?}");
        // A statement that fails rolls the group's transaction back (its
        // notices with it); the group is retried job by job and only the
        // job that succeeds alone is notified.
        let (poisoned, fine) = futures::join!(
            store.append(
                "poisoned",
                AppendBatch {
                    checkpoint: Some(CheckpointWrite {
                        checkpoint: checkpoint("poisoned", "bot\0", 1),
                        transcript_delta: vec![],
                        execution: None,
                        history_cut: None,
                    }),
                    ..batch(&events("poisoned", 0, 3))
                },
            ),
            store.append("fine", batch(&events("fine", 0, 2))),
        );
        assert!(matches!(poisoned, Err(StoreError::Backend(_))), "{poisoned:?}");
        fine.expect("fine");
        assert_eq!(
            notices_until_sentinel(&store, &mut listener, "sentinel").await,
            [log_notice("fine", 2), log_notice("sentinel", 1)]
        );
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn a_listener_resyncs_after_the_server_restarts_then_notices_again() {
    guarded(async {
        // A server of this test's own: stopping the shared one would fail
        // the tests running beside it.
        let Some(server) = LocalPostgres::own() else { return };
        let url = server.fresh_database();
        let store = another_handle(&url).await;
        let mut listener = store.listen().await.expect("listen");
        create(&store, "s").await;
        append(&store, "s", &events("s", 0, 2)).await;
        assert_eq!(next_notice(&mut listener).await, log_notice("s", 2));
        server.stop();
        server.start();
        assert_eq!(next_notice(&mut listener).await, LogNotice::Resync);
        append(&store, "s", &events("s", 2, 1)).await;
        assert_eq!(next_notice(&mut listener).await, log_notice("s", 3));
        drop(listener);
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn a_listener_whose_consumer_fell_behind_resyncs_then_notices_again() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        let mut listener = store.listen_with_capacity(3).await.expect("listen");
        let ids = (0..8).map(|n| format!("s{n}")).collect::<Vec<_>>();
        for id in &ids {
            create(&store, id).await;
        }
        for id in &ids {
            append(&store, id, &events(id, 0, 1)).await;
        }
        // The consumer reads nothing while the eight commits are notified.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for id in &ids[..3] {
            assert_eq!(next_notice(&mut listener).await, log_notice(id, 1));
        }
        assert_eq!(next_notice(&mut listener).await, LogNotice::Resync);
        append(&store, "s0", &events("s0", 1, 1)).await;
        assert_eq!(next_notice(&mut listener).await, log_notice("s0", 2));
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn a_closed_store_refuses_to_listen() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        store.close().await;
        assert!(matches!(store.listen().await, Err(StoreError::Closed)));
    })
    .await;
}

// ---------------------------------------------------------------------------
// Relayed submissions
// ---------------------------------------------------------------------------

use crate::{RelayOutcome, RelayRefusal, RelayState, Relayed, RelayedSubmission};

fn relayed(id: &str, text: &str, key: Option<&str>) -> RelayedSubmission {
    RelayedSubmission {
        traceparent: None,
        relay_id: 0,
        submission_id: id.to_owned(),
        op: Op::UserInput { text: text.to_owned() },
        on_busy: Some(BusyPolicy::Queue),
        idempotency_key: key.map(str::to_owned),
        submitted_by: None,
        seal: None,
    }
}

#[tokio::test]
async fn a_relayed_submission_keeps_who_submitted_it() {
    guarded(async {
        let (store, url) = store_or_skip!();
        let owner = another_handle(&url).await;
        create(&store, "s").await;
        let actor = keel_protocol::Actor {
            tenant: "acme".into(),
            principal_id: "key-1".into(),
            kind: keel_protocol::ActorKind::ApiKey,
            name: Some("ci".into()),
        };
        let mut submission = relayed("r1", "one", Some("k"));
        submission.submitted_by = Some(actor.clone());
        store.relay("s", &submission, 8).await.expect("relay");
        store.relay("s", &relayed("r2", "two", None), 8).await.expect("relay");
        let waiting = owner.relayed("s", 10).await.expect("relayed");
        let by: Vec<(&str, Option<&keel_protocol::Actor>)> = waiting
            .iter()
            .map(|row| (row.submission_id.as_str(), row.submitted_by.as_ref()))
            .collect();
        assert_eq!(by, [("r1", Some(&actor)), ("r2", None)]);
        match store
            .relay("s", &relayed("r3", "again", Some("k")), 8)
            .await
            .expect("relay")
        {
            Relayed::Duplicate(earlier) => assert_eq!(earlier.submitted_by, Some(actor)),
            other => panic!("not a duplicate: {other:?}"),
        }
    })
    .await;
}

/// The next relay notice, skipping log notices.
async fn next_relay_notice(listener: &mut NoticeListener) -> LogNotice {
    loop {
        let notice = next_notice(listener).await;
        if matches!(notice, LogNotice::Relay { .. }) {
            return notice;
        }
    }
}

#[tokio::test]
async fn relayed_submissions_are_stored_announced_deduplicated_by_key_and_taken_up_in_order() {
    guarded(async {
        let (store, url) = store_or_skip!();
        // The accepting node and the owner: two handles on one database.
        let owner = another_handle(&url).await;
        let mut listener = owner.listen().await.expect("listen");
        create(&store, "s").await;
        append(&store, "s", &events("s", 0, 2)).await;
        // A keyed one carries a seal, which the store keeps as it is.
        let relay = |id: &str, text: &str, key: Option<&str>| {
            let mut submission = relayed(id, text, key);
            submission.seal = key.map(|_| format!("seal-{id}"));
            let store = &store;
            async move { store.relay("s", &submission, 8).await }
        };
        let Relayed::New {
            last_sequence: 2,
            relay_id: first,
        } = relay("r1", "one", None).await.expect("relay")
        else {
            panic!("not stored");
        };
        // Nobody owns the session: any node may take it. The row rides
        // with the notice.
        let relay_notice = LogNotice::Relay {
            session_id: "s".to_owned(),
            owner: None,
            carried: Some(Box::new(RelayedSubmission {
                relay_id: first,
                ..relayed("r1", "one", None)
            })),
        };
        assert_eq!(next_relay_notice(&mut listener).await, relay_notice);
        assert!(matches!(
            relay("r2", "two", Some("k")).await.expect("relay"),
            Relayed::New { last_sequence: 2, .. }
        ));
        // The same key again stores nothing and returns the first.
        match relay("r3", "two again", Some("k")).await.expect("relay") {
            Relayed::Duplicate(earlier) => {
                assert_eq!(earlier.submission_id, "r2");
                assert_eq!(earlier.op, Op::UserInput { text: "two".into() });
                assert_eq!(earlier.idempotency_key.as_deref(), Some("k"));
            }
            other => panic!("not a duplicate: {other:?}"),
        }
        assert!(matches!(
            store.relay("nobody", &relayed("x", "x", None), 8).await,
            Err(StoreError::UnknownSession(_))
        ));
        assert!(matches!(
            store.relay("nobody", &relayed("x", "x", Some("k")), 8).await,
            Err(StoreError::UnknownSession(_))
        ));
        // Past the bound on waiting submissions, nothing is stored; a
        // duplicate is still recognized.
        assert_eq!(
            store.relay("s", &relayed("r5", "five", None), 2).await.expect("relay"),
            Relayed::Full
        );
        assert!(matches!(
            store
                .relay("s", &relayed("r6", "two", Some("k")), 2)
                .await
                .expect("relay"),
            Relayed::Duplicate(_)
        ));
        // The owner reads them in order, then forgets them once queued.
        let waiting = owner.relayed("s", 10).await.expect("relayed");
        let ids: Vec<&str> = waiting.iter().map(|r| r.submission_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert!(waiting[0].relay_id < waiting[1].relay_id);
        assert_eq!(waiting[1].on_busy, Some(BusyPolicy::Queue));
        assert_eq!(
            (waiting[0].seal.as_deref(), waiting[1].seal.as_deref()),
            (None, Some("seal-r2"))
        );
        assert_eq!(owner.relayed("s", 1).await.expect("relayed").len(), 1);
        // A node owning the session finds it with relayed work; a session
        // nobody owns is one to take over.
        assert_eq!(
            owner.sessions_with_relayed("node-a").await.expect("owned"),
            Vec::<String>::new()
        );
        assert_eq!(owner.sessions_to_take_over(None, 10).await.expect("take over"), ["s"]);
        let epoch = owner
            .claim("s", "node-a", Duration::from_secs(60))
            .await
            .expect("claim");
        // Relayed to a live owner, the notice names it.
        while listener.try_recv().is_some() {}
        let Relayed::New { relay_id: seventh, .. } = relay("r7", "to the owner", Some("k7")).await.expect("relay")
        else {
            panic!("not stored");
        };
        let mut carried = relayed("r7", "to the owner", Some("k7"));
        carried.relay_id = seventh;
        carried.seal = Some("seal-r7".to_owned());
        assert_eq!(
            next_relay_notice(&mut listener).await,
            LogNotice::Relay {
                session_id: "s".to_owned(),
                owner: Some("node-a".to_owned()),
                carried: Some(Box::new(carried)),
            }
        );
        // One too large for a notice is announced without it.
        while listener.try_recv().is_some() {}
        let Relayed::New { relay_id: eighth, .. } = relay("r8", &"x".repeat(8000), None).await.expect("relay") else {
            panic!("not stored");
        };
        assert_eq!(
            next_relay_notice(&mut listener).await,
            LogNotice::Relay {
                session_id: "s".to_owned(),
                owner: Some("node-a".to_owned()),
                carried: None,
            }
        );
        owner.relay_done("s", &[eighth]).await.expect("done");
        let r7: Vec<u64> = owner
            .relayed("s", 10)
            .await
            .expect("relayed")
            .iter()
            .filter(|relayed| relayed.submission_id == "r7")
            .map(|relayed| relayed.relay_id)
            .collect();
        owner.relay_done("s", &r7).await.expect("done");
        assert_eq!(owner.sessions_with_relayed("node-a").await.expect("owned"), ["s"]);
        assert!(
            owner
                .sessions_to_take_over(None, 10)
                .await
                .expect("take over")
                .is_empty()
        );
        owner.relay_done("s", &[waiting[0].relay_id]).await.expect("done");
        let left = owner.relayed("s", 10).await.expect("relayed");
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].submission_id, "r2");
        // Released with work left, the session is announced so that
        // another node takes it over at once.
        while listener.try_recv().is_some() {}
        owner.release("s", "node-a", epoch).await.expect("release");
        assert_eq!(
            next_relay_notice(&mut listener).await,
            LogNotice::Relay {
                session_id: "s".to_owned(),
                owner: None,
                carried: None,
            }
        );
        owner.relay_done("s", &[left[0].relay_id]).await.expect("done");
        // With the key free again, it may be relayed anew.
        assert!(matches!(
            relay("r4", "three", Some("k")).await.expect("relay"),
            Relayed::New { .. }
        ));
        // Deleting the session deletes what was relayed to it.
        assert!(store.delete_session("s").await.expect("delete"));
        assert_eq!(raw_count(&url, "SELECT count(*) FROM relayed_submissions").await, 0);
        owner.close().await;
        store.close().await;
    })
    .await;
}

/// The owner's answers: recorded with the relayed row (which then waits
/// no more and frees its key), announced on `keel_answer`, read by the
/// row's id; a row forgotten unanswered is gone, and answers older than
/// the time they are kept are forgotten at the next answer.
#[tokio::test]
async fn answers_to_relayed_submissions_are_recorded_announced_and_forgotten() {
    guarded(async {
        let (store, url) = store_or_skip!();
        let owner = another_handle(&url).await;
        let mut listener = store.listen().await.expect("listen");
        create(&store, "s").await;
        let Relayed::New { relay_id: first, .. } = store
            .relay("s", &relayed("a1", "one", Some("k")), 8)
            .await
            .expect("relay")
        else {
            panic!("not stored");
        };
        let Relayed::New { relay_id: second, .. } =
            store.relay("s", &relayed("a2", "two", None), 8).await.expect("relay")
        else {
            panic!("not stored");
        };
        assert_eq!(store.relay_state("s", first).await.expect("state"), RelayState::Waiting);
        let accepted = RelayOutcome::Accepted {
            submission_id: "a1".to_owned(),
            sequence: 3,
            duplicate: false,
        };
        let keep = Duration::from_secs(300);
        owner
            .answer_relayed("s", &[(first, Some(accepted.clone())), (second, None)], keep)
            .await
            .expect("answer");
        loop {
            // The answer comes with the notice; the forgotten row has none.
            if next_notice(&mut listener).await
                == (LogNotice::Answered {
                    session_id: "s".to_owned(),
                    answers: vec![(first, accepted.clone())],
                })
            {
                break;
            }
        }
        assert_eq!(
            store.relay_state("s", first).await.expect("state"),
            RelayState::Answered(accepted)
        );
        assert_eq!(store.relay_state("s", second).await.expect("state"), RelayState::Gone);
        assert!(
            owner.relayed("s", 10).await.expect("relayed").is_empty(),
            "nothing waits"
        );
        assert!(
            owner
                .sessions_to_take_over(None, 10)
                .await
                .expect("take over")
                .is_empty()
        );
        // The key is free again: the store of keys is the session's.
        let Relayed::New { relay_id: third, .. } = store
            .relay("s", &relayed("a3", "one", Some("k")), 8)
            .await
            .expect("relay")
        else {
            panic!("not stored");
        };
        let refused = RelayOutcome::Refused {
            refusal: RelayRefusal::SessionBusy,
            message: "busy".to_owned(),
        };
        // Kept for no time: the earlier answer goes, this one stays.
        owner
            .answer_relayed("s", &[(third, Some(refused.clone()))], Duration::ZERO)
            .await
            .expect("answer");
        assert_eq!(store.relay_state("s", first).await.expect("state"), RelayState::Gone);
        assert_eq!(
            store.relay_state("s", third).await.expect("state"),
            RelayState::Answered(refused)
        );
        // An answer too long for a notice (PostgreSQL's payloads hold
        // 8,000 bytes) is announced without it, and read from its row.
        let Relayed::New { relay_id: fourth, .. } =
            store.relay("s", &relayed("a4", "four", None), 8).await.expect("relay")
        else {
            panic!("not stored");
        };
        let long = RelayOutcome::Refused {
            refusal: RelayRefusal::InvalidRequest,
            message: "x".repeat(9000),
        };
        owner
            .answer_relayed("s", &[(fourth, Some(long.clone()))], Duration::from_secs(300))
            .await
            .expect("a long answer is recorded");
        loop {
            match next_notice(&mut listener).await {
                LogNotice::Answered { session_id, answers } if session_id == "s" => {
                    if answers.iter().any(|(id, _)| *id == third) {
                        continue;
                    }
                    assert!(answers.is_empty(), "{answers:?}");
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(
            store.relay_state("s", fourth).await.expect("state"),
            RelayState::Answered(long)
        );
        owner.close().await;
        store.close().await;
    })
    .await;
}

/// The owner's commit that queues a relayed submission answers it: the
/// answer (accepted at its `submission_queued`'s sequence) is on the row
/// and in a notice at commit, and the owner's own answer call then sends
/// nothing for it, while the rows it did not queue are answered by that
/// call as before.
#[tokio::test]
async fn the_commit_that_queues_a_relayed_submission_answers_it() {
    guarded(async {
        let (store, url) = store_or_skip!();
        // The accepting node (and listener) and the owner.
        let owner = another_handle(&url).await;
        let mut listener = store.listen().await.expect("listen");
        create(&owner, "s").await;
        append(&owner, "s", &events("s", 0, 2)).await;
        let mut ids = Vec::new();
        for id in ["r1", "r2", "r3"] {
            let Relayed::New { relay_id, .. } = store.relay("s", &relayed(id, "hi", None), 8).await.expect("relay")
            else {
                panic!("not stored");
            };
            ids.push(relay_id);
        }
        // Queued before the owner read them: not answered by the commit.
        append(&owner, "s", &[queued("r3", None)]).await;
        assert_eq!(
            store.relay_state("s", ids[2]).await.expect("state"),
            RelayState::Waiting
        );
        let waiting = owner.relayed("s", 10).await.expect("relayed");
        assert_eq!(waiting.len(), 3);
        // r1 and r2 queued in one batch, after two events and r3's.
        let written = append(&owner, "s", &[event("s", 5), queued("r1", None), queued("r2", None)]).await;
        let accepted = |id: &str, sequence| RelayOutcome::Accepted {
            submission_id: id.to_owned(),
            sequence,
            duplicate: false,
        };
        let answers = vec![
            (ids[0], accepted("r1", written[1].sequence)),
            (ids[1], accepted("r2", written[2].sequence)),
        ];
        assert_eq!(written[1].sequence, 5);
        loop {
            match next_notice(&mut listener).await {
                LogNotice::Answered {
                    session_id,
                    answers: carried,
                } if session_id == "s" => {
                    assert_eq!(carried, answers);
                    break;
                }
                _ => {}
            }
        }
        for (relay_id, answer) in &answers {
            assert_eq!(
                store.relay_state("s", *relay_id).await.expect("state"),
                RelayState::Answered(answer.clone())
            );
        }
        assert_eq!(owner.relayed("s", 10).await.expect("relayed").len(), 1, "only r3 waits");
        // The owner answers all three as it does: only r3 needs a statement,
        // and the answers the commit gave stand.
        let stats = |client: tokio_postgres::Client| async move {
            let row = client
                .query_one("SELECT count(*) FROM relayed_submissions WHERE answer IS NOT NULL", &[])
                .await
                .expect("count");
            row.get::<_, i64>(0)
        };
        let own_answers = [
            (ids[0], Some(accepted("r1", 99))),
            (ids[1], Some(accepted("r2", 99))),
            (ids[2], Some(accepted("r3", 3))),
        ];
        owner
            .answer_relayed("s", &own_answers, Duration::from_secs(300))
            .await
            .expect("answer");
        assert_eq!(stats(raw(&url).await).await, 3);
        assert_eq!(
            store.relay_state("s", ids[0]).await.expect("state"),
            RelayState::Answered(answers[0].1.clone()),
            "the commit's answer stands"
        );
        assert_eq!(
            store.relay_state("s", ids[2]).await.expect("state"),
            RelayState::Answered(accepted("r3", 3))
        );
        // The newest relay id counts answered rows too.
        assert_eq!(owner.newest_relay_id("s").await.expect("newest"), ids[2]);
        assert_eq!(owner.newest_relay_id("nobody").await.expect("newest"), 0);
        owner.close().await;
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn a_session_released_without_work_is_not_announced() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        let mut listener = store.listen().await.expect("listen");
        create(&store, "idle").await;
        create(&store, "sentinel").await;
        let epoch = store
            .claim("idle", "node-a", Duration::from_secs(60))
            .await
            .expect("claim");
        store.release("idle", "node-a", epoch).await.expect("release");
        let seen = notices_until_sentinel(&store, &mut listener, "sentinel").await;
        assert_eq!(seen, [log_notice("sentinel", 1)]);
        store.close().await;
    })
    .await;
}

/// Seconds left of the lease of session `id`.
async fn expiry(client: &tokio_postgres::Client, id: &str) -> f64 {
    client
        .query_one(
            "SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8 FROM sessions WHERE id = $1",
            &[&id],
        )
        .await
        .expect("expiry")
        .get::<_, f64>(0)
}

/// A node's leases are renewed by one statement that waits for no row: a
/// session whose row another transaction holds locked (the writer's group,
/// say) is skipped by it and renewed on its own once the lock is gone, while
/// the others are renewed at once.
#[tokio::test]
async fn one_statement_renews_a_node_s_leases_without_waiting_for_a_locked_row() {
    guarded(async {
        let (store, url) = store_or_skip!();
        let mut held = Vec::new();
        for id in ["free", "free-2", "free-3", "locked"] {
            create(&store, id).await;
            held.push((
                id.to_owned(),
                store.claim(id, "node-a", Duration::from_secs(5)).await.expect("claim"),
            ));
        }
        let mut locker = raw(&url).await;
        let watcher = raw(&url).await;
        let lock = locker.transaction().await.expect("begin");
        lock.execute("SELECT 1 FROM sessions WHERE id = 'locked' FOR UPDATE", &[])
            .await
            .expect("lock the row");
        let renewing = {
            let held = held.clone();
            let store = &store;
            async move { store.renew("node-a", Duration::from_secs(600), &held).await }
        };
        tokio::pin!(renewing);
        // The free rows are renewed while the locked one waits.
        let renewed_free = async {
            loop {
                if expiry(&watcher, "free").await > 60.0 && expiry(&watcher, "free-3").await > 60.0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        tokio::select! {
            _ = &mut renewing => panic!("renewed a row still locked by another transaction"),
            () = renewed_free => {}
        }
        assert!(expiry(&watcher, "locked").await < 60.0, "not renewed while locked");
        // One transaction renewed the free rows: they share its xmin.
        let writers: i64 = watcher
            .query_one(
                "SELECT count(DISTINCT xmin::text) FROM sessions WHERE id IN ('free', 'free-2', 'free-3')",
                &[],
            )
            .await
            .expect("xmin")
            .get(0);
        assert_eq!(writers, 1, "renewed by one statement");
        lock.commit().await.expect("release the lock");
        let lost = renewing.await.expect("renew");
        assert!(lost.is_empty(), "{lost:?}");
        assert!(expiry(&watcher, "locked").await > 60.0, "renewed once unlocked");
    })
    .await;
}

/// Relayed submissions are stored on connections whose commits do not wait
/// for the disk (see `relay.rs`), configured on top of the URL's options;
/// every other connection waits.
#[tokio::test]
async fn relays_commit_without_waiting_for_the_disk_and_nothing_else_does() {
    guarded(async {
        let (store, _url) = store_or_skip!();
        let setting = |client: deadpool_postgres::Object| async move {
            client
                .query_one("SHOW synchronous_commit", &[])
                .await
                .expect("show")
                .get::<_, String>(0)
        };
        assert_eq!(
            setting(store.pooled(&store.relays).await.expect("relay connection")).await,
            "off"
        );
        assert_eq!(setting(store.reader().await.expect("reader")).await, "on");
        assert_eq!(setting(store.leaser().await.expect("leaser")).await, "on");
        let mut config = tokio_postgres::Config::new();
        assert_eq!(
            super::without_waiting_for_the_disk(&config).get_options(),
            Some("-c synchronous_commit=off")
        );
        config.options("-c search_path=keel");
        assert_eq!(
            super::without_waiting_for_the_disk(&config).get_options(),
            Some("-c search_path=keel -c synchronous_commit=off")
        );
        store.close().await;
    })
    .await;
}

#[tokio::test]
async fn a_node_s_advertised_url_is_its_last_one() {
    guarded(async {
        let (store, url) = store_or_skip!();
        assert_eq!(store.node_url("node-a").await.expect("read"), None);
        store
            .advertise("node-a", "http://10.0.0.1:7777")
            .await
            .expect("advertise");
        store
            .advertise("node-b", "http://10.0.0.2:7777")
            .await
            .expect("advertise");
        // Restarted elsewhere: the new address replaces the old.
        let other = another_handle(&url).await;
        other
            .advertise("node-a", "http://10.0.0.9:7777")
            .await
            .expect("advertise");
        assert_eq!(
            store.node_url("node-a").await.expect("read").as_deref(),
            Some("http://10.0.0.9:7777")
        );
        assert_eq!(
            store.node_url("node-b").await.expect("read").as_deref(),
            Some("http://10.0.0.2:7777")
        );
        // Restarted where it cannot be reached: none.
        other.advertise("node-b", "").await.expect("advertise");
        assert_eq!(store.node_url("node-b").await.expect("read"), None);
        other.close().await;
        store.close().await;
    })
    .await;
}
