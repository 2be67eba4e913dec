//! The contract of [`CheckpointStore`], as tests that run against any
//! backend.
//!
//! Each test is a function generic over a [`StoreFactory`], which gives it
//! empty databases and stores on them. A backend's test module runs the
//! whole suite with one line, [`store_conformance_tests!`], which expands to
//! one `#[tokio::test]` per function. Tests of what one backend does beside
//! the contract (SQLite's WAL and codec, PostgreSQL's locking) stay beside
//! that backend.
//!
//! Everything here goes through the trait (and [`StoreError`]'s variants):
//! a test that needs to look at how a backend stores things is not a
//! contract test.

mod access;
mod activity;
mod tenants;
mod webhooks;

pub(crate) use access::{
    a_refused_batch_adds_nothing_to_the_ledger, a_revocation_keeps_its_first_time_and_touches_only_move_forward,
    access_conformance_tests, an_admission_reads_what_each_ledger_read_does_and_takes_the_same_slot,
    budgets_are_set_replaced_and_removed_for_every_handle, concurrent_sessions_of_one_tenant_all_count_in_its_ledger,
    deleting_a_session_drops_its_ledger_and_budget_but_not_its_tenants_spending,
    keys_are_stored_exactly_as_given_unique_by_id_and_by_hash,
    running_turns_counts_the_sessions_of_a_tenant_with_a_turn_in_flight,
    the_ledger_sums_the_usage_of_committed_batches_by_tenant_session_and_hour,
    the_revision_grows_with_every_change_of_keys_or_budgets_and_only_then,
    turn_slots_are_taken_up_to_the_cap_once_per_session_and_given_back_at_rest, used,
};

pub(crate) use activity::{
    a_walk_by_activity_lists_no_session_twice_and_misses_none_left_alone,
    sessions_by_activity_put_the_latest_written_first_page_by_page,
};
pub(crate) use tenants::{
    sessions_keep_the_tenant_they_were_made_for_and_are_listed_by_tenant_page_by_page, tenant_checkpoint,
    usage_is_summed_per_session_of_a_filter,
};
pub(crate) use webhooks::{
    a_claim_takes_each_sessions_deliveries_in_order_as_a_chain_and_releases_the_rest,
    a_turns_end_is_session_idle_too_when_its_transaction_leaves_nothing_queued,
    claims_hand_out_each_sessions_oldest_delivery_once_and_in_order,
    deliveries_are_written_with_their_events_for_the_endpoints_that_want_them,
    endpoints_are_replaced_listed_and_deleted_with_their_deliveries, webhook_conformance_tests,
};

use std::future::Future;
use std::time::Duration;

use futures::future::join_all;

use crate::{
    AppendBatch, AppendReceipt, Checkpoint, CheckpointStore, CheckpointStoreExt, CheckpointWrite, EncodedEvent,
    EventPage, EventPageRequest, LeaseStore, MAX_EVENT_PAGE, SessionContext, SessionListPage, SessionState,
    SessionSummary, StoreError, TurnExecution,
};
use keel_protocol::{
    AbortReason, AssistantContentDeltaEvent, ErrorEvent, Event, EventMsg, ModelStepStartedEvent, RecordedEvent,
    SandboxInfo, SessionStartedEvent, TokenUsage, TranscriptItem, TurnAbortedEvent, TurnStartedEvent, UserMessageEvent,
    WarningEvent, now_ms,
};

// ---------------------------------------------------------------------------
// The backend under test
// ---------------------------------------------------------------------------

/// What a backend provides to run the suite: empty databases, and stores
/// (handles) on them.
///
/// Every call of [`Self::open`] is another handle on the same database, as
/// another process would open it: tests of what two processes see (two
/// creators of one id, a lease taken through another handle) open two.
/// [`Self::close`] then [`Self::open`] is a restart: what was written before
/// must be there. Setup failures panic; these are tests.
pub(crate) trait StoreFactory {
    /// A database of its own for one test; dropping it may delete it (a
    /// temporary directory, a database on a test server).
    type Database;
    /// The store under test.
    type Store: CheckpointStore + LeaseStore;

    /// Whether the backend can be tested here. A backend that needs a
    /// server it cannot start says so (loudly) and returns `false`; its
    /// tests then pass without running, which is why CI makes that a
    /// failure instead (`KEEL_REQUIRE_POSTGRES_TESTS=1`).
    fn available(&self) -> bool {
        true
    }

    /// A new, empty database.
    async fn database(&self) -> Self::Database;

    /// A new store (handle) on `database`.
    async fn open(&self, database: &Self::Database) -> Self::Store;

    /// Closes `store`: the writes it acknowledged stay, and every later
    /// call on it fails with [`StoreError::Closed`]. Closing twice is
    /// harmless.
    async fn close(&self, store: &Self::Store);

    /// A new, empty database and a store on it.
    async fn fresh(&self) -> (Self::Database, Self::Store) {
        let database = self.database().await;
        let store = self.open(&database).await;
        (database, store)
    }
}

/// Expands to one `#[tokio::test]` per conformance test, in a module
/// `conformance`, each running the test against the factory `$factory` (an
/// expression of a type implementing [`StoreFactory`], evaluated once per
/// test, in the scope of the module that invokes the macro):
///
/// ```ignore
/// crate::conformance::store_conformance_tests!(SqliteFactory);
/// ```
macro_rules! store_conformance_tests {
    ($factory:expr) => {
        /// The store conformance suite (`crate::conformance`) run
        /// against this backend.
        mod conformance {
            #[allow(unused_imports)]
            use super::*;

            $crate::conformance::store_conformance_tests!(@test sequences_start_at_one_and_stay_gap_free_per_session_across_interleaved_appends, $factory);
            $crate::conformance::store_conformance_tests!(@test append_to_unknown_session_fails_alone_and_writes_nothing, $factory);
            $crate::conformance::store_conformance_tests!(@test sixty_four_concurrent_sessions_each_keep_a_complete_gap_free_log, $factory);
            $crate::conformance::store_conformance_tests!(@test save_creates_rewrites_and_extends_a_session_and_load_returns_exactly_that, $factory);
            $crate::conformance::store_conformance_tests!(@test append_with_checkpoint_commits_events_checkpoint_and_history_together_or_not_at_all, $factory);
            $crate::conformance::store_conformance_tests!(@test append_refuses_a_checkpoint_of_another_session_and_writes_nothing, $factory);
            $crate::conformance::store_conformance_tests!(@test_multi_thread load_returns_checkpoint_history_and_last_sequence_of_one_commit_while_writes_go_on, $factory);
            $crate::conformance::store_conformance_tests!(@test event_page_reads_newest_first_in_ascending_pages_and_paging_back_visits_each_event_once, $factory);
            $crate::conformance::store_conformance_tests!(@test event_page_handles_limit_zero_empty_logs_unknown_sessions_and_caps_the_limit, $factory);
            $crate::conformance::store_conformance_tests!(@test batches_with_history_but_no_events_are_stored_loaded_and_invisible_to_event_pages, $factory);
            $crate::conformance::store_conformance_tests!(@test reopened_store_has_everything_and_continues_sequences_and_history, $factory);
            $crate::conformance::store_conformance_tests!(@test closed_store_refuses_every_call, $factory);
            $crate::conformance::store_conformance_tests!(@test list_sessions_puts_the_newest_update_first_with_bot_and_running_turn, $factory);
            $crate::conformance::store_conformance_tests!(@test a_newer_lease_fences_off_the_older_holder_and_nothing_it_sends_is_written, $factory);
            $crate::conformance::store_conformance_tests!(@test events_after_reads_forwards_across_batches_from_any_point, $factory);
            $crate::conformance::store_conformance_tests!(@test sessions_page_newest_created_first_with_a_cursor, $factory);
            $crate::conformance::store_conformance_tests!(@test a_queued_submission_stays_stored_until_an_event_settles_it, $factory);
            $crate::conformance::store_conformance_tests!(@test an_idempotency_key_names_one_submission_and_a_second_is_refused_whole, $factory);
            $crate::conformance::store_conformance_tests!(@test sessions_are_listed_by_bot_page_by_page, $factory);
            $crate::conformance::store_conformance_tests!(@test sessions_with_work_lists_queued_messages_and_turns_in_flight_in_pages, $factory);
            $crate::conformance::store_conformance_tests!(@test history_until_takes_the_batches_up_to_a_sequence_and_never_splits_one, $factory);
            $crate::conformance::store_conformance_tests!(@test a_history_cut_drops_the_newest_items_for_loads_and_forks_and_keeps_the_log, $factory);
            $crate::conformance::store_conformance_tests!(@test create_makes_a_session_with_its_first_events_once_even_across_stores, $factory);
            $crate::conformance::store_conformance_tests!(@test a_lease_taken_through_another_handle_fences_this_one, $factory);
            $crate::conformance::store_conformance_tests!(@test titles_come_from_the_first_user_message_until_a_rename, $factory);
            $crate::conformance::store_conformance_tests!(@test sessions_by_activity_put_the_latest_written_first_page_by_page, $factory);
            $crate::conformance::store_conformance_tests!(@test a_walk_by_activity_lists_no_session_twice_and_misses_none_left_alone, $factory);
            $crate::conformance::store_conformance_tests!(@test two_owners_racing_for_one_session_exactly_one_wins, $factory);
            $crate::conformance::store_conformance_tests!(@test an_expired_lease_is_taken_over_with_a_new_epoch_that_fences_the_first_owner, $factory);
            $crate::conformance::store_conformance_tests!(@test renew_extends_the_leases_still_held_and_reports_the_lost_ones, $factory);
            $crate::conformance::store_conformance_tests!(@test release_lets_another_owner_claim_at_once, $factory);
            $crate::conformance::store_conformance_tests!(@test sessions_to_take_over_lists_sessions_with_work_and_no_live_owner, $factory);
            $crate::conformance::store_conformance_tests!(@test sessions_keep_the_tenant_they_were_made_for_and_are_listed_by_tenant_page_by_page, $factory);
            $crate::conformance::store_conformance_tests!(@test usage_is_summed_per_session_of_a_filter, $factory);
        }
    };
    (@test $name:ident, $factory:expr) => {
        #[tokio::test]
        async fn $name() {
            let factory = $factory;
            if !$crate::conformance::StoreFactory::available(&factory) {
                return;
            }
            $crate::conformance::guarded($crate::conformance::$name(&factory)).await;
        }
    };
    (@test_multi_thread $name:ident, $factory:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let factory = $factory;
            if !$crate::conformance::StoreFactory::available(&factory) {
                return;
            }
            $crate::conformance::guarded($crate::conformance::$name(&factory)).await;
        }
    };
}
pub(crate) use store_conformance_tests;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// Runs a test body, failing it if it takes absurdly long. A hang guard only:
/// nothing asserts on how long anything takes.
pub(crate) async fn guarded<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(300), test)
        .await
        .expect("test hung")
}

pub(crate) fn context(bot_id: &str) -> SessionContext {
    let mut metadata = serde_json::Map::new();
    metadata.insert("tenant".into(), serde_json::json!({ "name": bot_id, "tier": 3 }));
    SessionContext {
        bot_id: bot_id.into(),
        metadata,
        settings: Some(serde_json::json!({"model": "script:x"})),
        ..SessionContext::default()
    }
}

pub(crate) fn checkpoint(session_id: &str, bot_id: &str, model_calls: u64) -> Checkpoint {
    Checkpoint {
        session_id: session_id.into(),
        session_context: context(bot_id),
        model_calls,
        turns_completed: model_calls / 2,
        usage: TokenUsage {
            input_tokens: model_calls * 100,
            output_tokens: model_calls * 10,
            ..TokenUsage::default()
        },
        approved_tools: ["write_file".to_owned()].into(),
        compaction: None,
        last_turn: None,
        project_instructions: None,
    }
}

pub(crate) fn user(text: &str) -> TranscriptItem {
    TranscriptItem::UserMessage { text: text.into() }
}

pub(crate) fn assistant(text: &str, interrupted: bool) -> TranscriptItem {
    TranscriptItem::AssistantMessage {
        text: text.into(),
        interrupted,
    }
}

/// When the sample execution's client call times out.
const CLIENT_DEADLINE_MS: u64 = 1_764_430_600_000;

pub(crate) fn execution(turn_id: &str) -> TurnExecution {
    TurnExecution {
        turn_id: turn_id.into(),
        submission_ids: vec![format!("{turn_id}-sub-1"), format!("{turn_id}-sub-2")],
        started_at_ms: 1_764_430_000_000,
        step: 2,
        awaiting_approval: vec!["call-7".into()],
        decisions: [("call-6".to_owned(), keel_protocol::ApprovalDecision::Deny)].into(),
        started_calls: Some(vec!["call-5".into()]),
        awaiting_client: vec!["call-8".into(), "call-9".into()],
        // call-9 waits for ever; call-8's deadline is the session's.
        client_deadlines: [("call-8".to_owned(), CLIENT_DEADLINE_MS)].into(),
        trace: None,
    }
}

/// Creates a session with an empty history.
pub(crate) async fn create(store: &dyn CheckpointStore, session_id: &str) {
    store
        .save(&checkpoint(session_id, "bot", 0), &[], None)
        .await
        .expect("create session");
}

/// The `n`th event of a made-up session: the kinds, payloads and submission
/// ids vary so that a mix-up between events or sessions shows.
pub(crate) fn event(session_id: &str, n: usize) -> Event {
    let turn_id = format!("{session_id}-turn-{}", n / 7);
    let msg = match n % 7 {
        0 => EventMsg::TurnStarted(TurnStartedEvent {
            turn_id,
            trace_id: None,
        }),
        1 => EventMsg::UserMessage(UserMessageEvent {
            turn_id,
            text: format!("question {n} of {session_id}: ünïcødé ✓ \"quoted\" \\ \n new line"),
        }),
        2 => EventMsg::ModelStepStarted(ModelStepStartedEvent {
            turn_id,
            step: u32::try_from(n).expect("small n"),
            message_id: None,
        }),
        3 => EventMsg::AssistantContentDelta(AssistantContentDeltaEvent {
            turn_id,
            delta: format!("delta {n} of {session_id}"),
        }),
        4 => EventMsg::Error(ErrorEvent {
            turn_id: None,
            message: format!("error {n}"),
        }),
        5 => EventMsg::SessionStarted(SessionStartedEvent {
            session_id: session_id.into(),
            bot_id: "bot".into(),
            resumed: n.is_multiple_of(2),
            history_items: n as u64,
            pending_approvals: vec![],
            sandbox: n.is_multiple_of(3).then(|| SandboxInfo {
                policy: "workspace-write".into(),
                enforced: true,
                detail: format!("landlock {n}"),
                network_blocked: n.is_multiple_of(2),
            }),
            tools: vec![],
        }),
        _ => EventMsg::TurnAborted(TurnAbortedEvent {
            turn_id,
            reason: AbortReason::Interrupted,
            message: format!("aborted {n}"),
        }),
    };
    Event {
        submission_id: (!n.is_multiple_of(3)).then(|| format!("{session_id}-submission-{n}")),
        msg,
    }
}

/// `count` events of a session, numbered from `from`.
pub(crate) fn events(session_id: &str, from: usize, count: usize) -> Vec<Event> {
    (from..from + count).map(|n| event(session_id, n)).collect()
}

pub(crate) fn encode(events: &[Event]) -> Vec<EncodedEvent> {
    events
        .iter()
        .map(|event| EncodedEvent::encode(event).expect("encode event"))
        .collect()
}

pub(crate) fn batch(events: &[Event]) -> AppendBatch {
    AppendBatch {
        lease: None,
        events: encode(events),
        checkpoint: None,
    }
}

/// What `events`, appended with `receipt`, must read back as.
pub(crate) fn recorded(receipt: AppendReceipt, events: &[Event]) -> Vec<RecordedEvent> {
    (receipt.first_sequence..)
        .zip(events)
        .map(|(sequence, event)| RecordedEvent {
            sequence,
            recorded_at_ms: receipt.recorded_at_ms,
            event: event.clone(),
        })
        .collect()
}

/// Appends `events` and returns how they must read back.
pub(crate) async fn append(store: &dyn CheckpointStore, session_id: &str, events: &[Event]) -> Vec<RecordedEvent> {
    let receipt = store.append(session_id, batch(events)).await.expect("append");
    assert!(receipt.recorded_at_ms > 0, "recorded_at_ms is set");
    recorded(receipt, events)
}

/// Appends one event after `after` marked as settling queued submission
/// `id` (its queue row goes in the same commit).
pub(crate) async fn settle(store: &dyn CheckpointStore, session_id: &str, after: usize, id: &str) {
    let mut settling = encode(&events(session_id, after, 1));
    settling[0].queue = Some(crate::QueueChange::Settled(id.into()));
    let batch = AppendBatch {
        lease: None,
        events: settling,
        checkpoint: None,
    };
    store.append(session_id, batch).await.expect("settle");
}

/// A session's whole log, read backwards page by page.
pub(crate) async fn whole_log(store: &dyn CheckpointStore, session_id: &str) -> Vec<RecordedEvent> {
    let mut pages = Vec::new();
    let mut before_sequence = None;
    loop {
        let page = store
            .event_page(
                session_id,
                EventPageRequest {
                    before_sequence,
                    limit: MAX_EVENT_PAGE,
                },
            )
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

pub(crate) fn assert_gap_free(log: &[RecordedEvent]) {
    let sequences: Vec<u64> = log.iter().map(|event| event.sequence).collect();
    let expected: Vec<u64> = (1..=log.len() as u64).collect();
    assert_eq!(sequences, expected, "sequences start at 1 without gaps");
}

pub(crate) async fn last_sequence(store: &dyn CheckpointStore, session_id: &str) -> u64 {
    store
        .load(session_id)
        .await
        .expect("load")
        .expect("session exists")
        .last_sequence
}

/// Waits until the wall clock has passed `ms`, so that the next write gets a
/// later timestamp than any write before this call.
pub(crate) async fn tick_past(ms: u64) {
    while now_ms() <= ms {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(crate) async fn page(
    store: &dyn CheckpointStore,
    session_id: &str,
    before_sequence: Option<u64>,
    limit: usize,
) -> EventPage {
    store
        .event_page(session_id, EventPageRequest { before_sequence, limit })
        .await
        .expect("event page")
}

/// The ids of a page's sessions, in order.
pub(crate) fn page_ids(page: SessionListPage) -> Vec<String> {
    page.sessions.into_iter().map(|summary| summary.session_id).collect()
}

/// Appends `events` with `history` in one batch.
pub(crate) async fn append_with_history(
    store: &dyn CheckpointStore,
    session_id: &str,
    events: &[Event],
    history: &[TranscriptItem],
) {
    append_with_cut(store, session_id, events, None, history)
        .await
        .expect("append");
}

/// Appends `events` in one batch that cuts the history to `cut` items, then
/// adds `history`.
pub(crate) async fn append_with_cut(
    store: &dyn CheckpointStore,
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

/// Creates the sessions `{prefix}-00` to `{prefix}-{count - 1}` and returns
/// their ids.
pub(crate) async fn create_sessions(store: &dyn CheckpointStore, prefix: &str, count: usize) -> Vec<String> {
    let session_ids: Vec<String> = (0..count).map(|n| format!("{prefix}-{n:02}")).collect();
    for session_id in &session_ids {
        create(store, session_id).await;
    }
    session_ids
}

/// Whether a target of [`unknown_session_targets`] names a session that does
/// not exist.
pub(crate) fn is_ghost(session_id: &str) -> bool {
    session_id.starts_with("ghost")
}

/// Creates 14 sessions and returns their ids with one batch for each, and
/// in the middle two batches for sessions that do not exist: one plain, one
/// carrying a checkpoint (which must not create the session either).
pub(crate) async fn unknown_session_targets(store: &dyn CheckpointStore) -> (Vec<String>, Vec<(String, AppendBatch)>) {
    let known = create_sessions(store, "known", 14).await;
    let mut targets: Vec<(String, AppendBatch)> = known
        .iter()
        .enumerate()
        .map(|(n, session_id)| (session_id.clone(), batch(&events(session_id, n, n % 4 + 1))))
        .collect();
    targets.insert(7, ("ghost".into(), batch(&events("ghost", 0, 3))));
    targets.insert(
        8,
        (
            "ghost-with-checkpoint".into(),
            AppendBatch {
                lease: None,
                events: encode(&events("ghost-with-checkpoint", 0, 2)),
                checkpoint: Some(CheckpointWrite {
                    checkpoint: checkpoint("ghost-with-checkpoint", "bot", 1),
                    transcript_delta: vec![user("hello?")],
                    execution: Some(execution("ghost-turn")),
                    history_cut: None,
                }),
            },
        ),
    );
    (known, targets)
}

/// Checks what the store says of one target of [`unknown_session_targets`]:
/// an unknown session is refused and stays unknown, a known one holds
/// exactly its batch's events, which this returns.
pub(crate) async fn check_unknown_session_target(
    store: &dyn CheckpointStore,
    session_id: &str,
    batch: &AppendBatch,
    outcome: Result<AppendReceipt, StoreError>,
) -> Option<Vec<Event>> {
    if is_ghost(session_id) {
        match outcome {
            Err(StoreError::UnknownSession(named)) => assert_eq!(named, session_id),
            other => panic!("append to {session_id}: expected UnknownSession, got {other:?}"),
        }
        assert_eq!(store.load(session_id).await.expect("load"), None);
        match store
            .event_page(
                session_id,
                EventPageRequest {
                    before_sequence: None,
                    limit: 10,
                },
            )
            .await
        {
            Err(StoreError::UnknownSession(named)) => assert_eq!(named, session_id),
            other => panic!("event page of {session_id}: expected UnknownSession, got {other:?}"),
        }
        None
    } else {
        let receipt = outcome.unwrap_or_else(|error| panic!("append to {session_id}: {error}"));
        assert_eq!(receipt.first_sequence, 1);
        let sent: Vec<Event> = batch
            .events
            .iter()
            .map(|encoded| serde_json::from_str(&encoded.json).expect("decode sent event"))
            .collect();
        assert_eq!(whole_log(store, session_id).await, recorded(receipt, &sent));
        assert_eq!(last_sequence(store, session_id).await, sent.len() as u64);
        Some(sent)
    }
}

/// Each of `sessions` appends `batches` batches of one to three events, all
/// sessions at once; the future gives each session's log as its receipts
/// say it must read.
pub(crate) fn append_from_every_session<'a>(
    store: &'a dyn CheckpointStore,
    sessions: &'a [String],
    batches: usize,
) -> impl Future<Output = Vec<Vec<RecordedEvent>>> + 'a {
    join_all(sessions.iter().map(move |session_id| async move {
        let mut expected = Vec::new();
        let mut next = 0;
        for round in 0..batches {
            let count = (round + session_id.len()) % 3 + 1;
            let sent = events(session_id, next, count);
            next += count;
            let receipt = store.append(session_id, batch(&sent)).await.expect("append");
            assert_eq!(receipt.first_sequence, expected.len() as u64 + 1);
            expected.extend(recorded(receipt, &sent));
        }
        expected
    }))
}

/// Asserts that each of `sessions` has exactly its expected log, gap-free.
pub(crate) async fn assert_logs(
    store: &dyn CheckpointStore,
    sessions: &[String],
    expected_logs: &[Vec<RecordedEvent>],
) {
    for (session_id, expected) in sessions.iter().zip(expected_logs) {
        let log = whole_log(store, session_id).await;
        assert_gap_free(&log);
        assert_eq!(&log, expected, "log of {session_id}");
        assert_eq!(last_sequence(store, session_id).await, expected.len() as u64);
    }
}

/// What [`commit_a_turn`] committed.
pub(crate) struct CommittedTurn {
    /// The batch's events.
    pub(crate) sent: Vec<Event>,
    /// The session's log: the batch's events.
    pub(crate) log: Vec<RecordedEvent>,
    /// The session as it must load.
    pub(crate) state: SessionState,
}

/// Creates the session "s" with one history item, then commits a turn's
/// batch: three events, two items and the running turn.
pub(crate) async fn commit_a_turn(store: &dyn CheckpointStore) -> CommittedTurn {
    store
        .save(&checkpoint("s", "bot", 0), &[user("hi")], None)
        .await
        .expect("create");
    let sent = events("s", 0, 3);
    let turn = execution("turn-1");
    let receipt = store
        .append(
            "s",
            AppendBatch {
                lease: None,
                events: encode(&sent),
                checkpoint: Some(CheckpointWrite {
                    checkpoint: checkpoint("s", "bot", 1),
                    transcript_delta: vec![assistant("hello", false), user("again")],
                    execution: Some(turn.clone()),
                    history_cut: None,
                }),
            },
        )
        .await
        .expect("append with checkpoint");
    assert_eq!(receipt.first_sequence, 1);
    let state = SessionState {
        checkpoint: checkpoint("s", "bot", 1),
        transcript: vec![user("hi"), assistant("hello", false), user("again")],
        execution: Some(turn),
        last_sequence: 3,
        queued: Vec::new(),
    };
    let log = recorded(receipt, &sent);
    CommittedTurn { sent, log, state }
}

/// The batch after [`commit_a_turn`]'s that the test makes fail: two
/// events and a warning saying `warning`, one more history item, cut to
/// `history_cut`.
pub(crate) fn doomed_batch(warning: &str, history_cut: Option<u64>) -> AppendBatch {
    let mut doomed = events("s", 3, 2);
    doomed.push(Event {
        submission_id: None,
        msg: EventMsg::Warning(WarningEvent {
            message: warning.into(),
        }),
    });
    AppendBatch {
        lease: None,
        events: encode(&doomed),
        checkpoint: Some(CheckpointWrite {
            checkpoint: checkpoint("s", "bot", 2),
            transcript_delta: vec![assistant("lost", false)],
            execution: None,
            history_cut,
        }),
    }
}

/// After [`doomed_batch`] failed: the next batch continues at sequence 4
/// and the session is `committed` but for it. Returns that batch's events.
pub(crate) async fn assert_no_hole_after_failure(store: &dyn CheckpointStore, committed: &CommittedTurn) -> Vec<Event> {
    let next = events("s", 10, 2);
    let receipt = store.append("s", batch(&next)).await.expect("append after failure");
    assert_eq!(receipt.first_sequence, 4);
    let mut log = committed.log.clone();
    log.extend(recorded(receipt, &next));
    let read = whole_log(store, "s").await;
    assert_gap_free(&read);
    assert_eq!(read, log);
    assert_eq!(
        store.load("s").await.expect("load"),
        Some(SessionState {
            last_sequence: 5,
            ..committed.state.clone()
        })
    );
    next
}

/// Creates the sessions "s" (with two events) and "other", one history item
/// each; returns the log of "s".
pub(crate) async fn create_s_and_other(store: &dyn CheckpointStore) -> Vec<RecordedEvent> {
    store
        .save(&checkpoint("s", "bot", 1), &[user("s history")], None)
        .await
        .expect("create s");
    store
        .save(&checkpoint("other", "bot", 7), &[user("other history")], None)
        .await
        .expect("create other");
    append(store, "s", &events("s", 0, 2)).await
}

/// Appends to "s" a batch whose checkpoint is of the session `foreign`, and
/// asserts that it is refused as invalid.
pub(crate) async fn append_a_foreign_checkpoint(store: &dyn CheckpointStore, foreign: &str) {
    let error = store
        .append(
            "s",
            AppendBatch {
                lease: None,
                events: encode(&events("s", 2, 3)),
                checkpoint: Some(CheckpointWrite {
                    checkpoint: checkpoint(foreign, "bot", 99),
                    transcript_delta: vec![user("misdirected")],
                    execution: Some(execution("turn")),
                    history_cut: None,
                }),
            },
        )
        .await
        .expect_err("a foreign checkpoint is refused");
    assert!(matches!(error, StoreError::Invalid(_)), "{foreign}: {error:?}");
}

/// A batch with no events that adds `delta` to the history of `session_id`.
pub(crate) fn only_history(
    session_id: &str,
    model_calls: u64,
    delta: Vec<TranscriptItem>,
    turn: Option<TurnExecution>,
) -> AppendBatch {
    AppendBatch {
        lease: None,
        events: vec![],
        checkpoint: Some(CheckpointWrite {
            checkpoint: checkpoint(session_id, "bot", model_calls),
            transcript_delta: delta,
            execution: turn,
            history_cut: None,
        }),
    }
}

/// Creates "s" with one history item, appends `first`, then a batch of
/// history alone, whose receipt this returns.
pub(crate) async fn history_then_events_then_history(
    store: &dyn CheckpointStore,
    first: &[Event],
) -> (Vec<RecordedEvent>, AppendReceipt) {
    store
        .save(&checkpoint("s", "bot", 0), &[user("u1")], None)
        .await
        .expect("create with history");
    let log = append(store, "s", first).await;
    let receipt = store
        .append(
            "s",
            only_history(
                "s",
                1,
                vec![assistant("a1", false), user("u2")],
                Some(execution("turn-1")),
            ),
        )
        .await
        .expect("append history alone");
    (log, receipt)
}

/// After [`history_then_events_then_history`]: history from a save, the
/// events `second`, and history alone again, whose receipt this returns.
pub(crate) async fn more_history_and_events(
    store: &dyn CheckpointStore,
    second: &[Event],
) -> (Vec<RecordedEvent>, AppendReceipt) {
    store
        .save(&checkpoint("s", "bot", 2), &[assistant("a2", true)], None)
        .await
        .expect("save history");
    let log = append(store, "s", second).await;
    let receipt = store
        .append("s", only_history("s", 3, vec![user("u3")], Some(execution("turn-2"))))
        .await
        .expect("append history alone");
    (log, receipt)
}

/// Creates the session "quiet", which has history and never has an event.
pub(crate) async fn create_quiet(store: &dyn CheckpointStore) {
    store
        .save(&checkpoint("quiet", "bot", 0), &[user("q1")], None)
        .await
        .expect("create quiet");
    store
        .append("quiet", only_history("quiet", 1, vec![assistant("q2", false)], None))
        .await
        .expect("append history alone");
}

// ---------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------

pub(crate) async fn sequences_start_at_one_and_stay_gap_free_per_session_across_interleaved_appends(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    create(&store, "a").await;
    create(&store, "b").await;

    let mut log_a = Vec::new();
    let mut log_b = Vec::new();
    let mut next_a = 0;
    let mut next_b = 0;
    for (round, (count_a, count_b)) in [(3, 2), (1, 4), (5, 1), (2, 2)].into_iter().enumerate() {
        let sent = events("a", next_a, count_a);
        let receipt = store.append("a", batch(&sent)).await.expect("append a");
        assert_eq!(receipt.first_sequence, log_a.len() as u64 + 1, "round {round}: a");
        assert!(receipt.recorded_at_ms > 0);
        log_a.extend(recorded(receipt, &sent));
        next_a += count_a;

        let sent = events("b", next_b, count_b);
        let receipt = store.append("b", batch(&sent)).await.expect("append b");
        assert_eq!(receipt.first_sequence, log_b.len() as u64 + 1, "round {round}: b");
        log_b.extend(recorded(receipt, &sent));
        next_b += count_b;
    }

    // An empty batch takes no sequence: its receipt names the next one,
    // and the next real batch still gets it.
    let empty = store.append("a", AppendBatch::default()).await.expect("empty append");
    assert_eq!(empty.first_sequence, log_a.len() as u64 + 1);
    log_a.extend(append(&store, "a", &events("a", next_a, 1)).await);
    assert_eq!(log_a.last().map(|event| event.sequence), Some(empty.first_sequence));

    for (session_id, expected) in [("a", &log_a), ("b", &log_b)] {
        let log = whole_log(&store, session_id).await;
        assert_gap_free(&log);
        assert_eq!(&log, expected, "session {session_id} reads back what was written");
        assert!(log.iter().all(|event| event.recorded_at_ms > 0));
        assert_eq!(last_sequence(&store, session_id).await, expected.len() as u64);
    }
    assert_eq!(log_a.len(), 12);
    assert_eq!(log_b.len(), 9);
}

pub(crate) async fn append_to_unknown_session_fails_alone_and_writes_nothing(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    // Two writes to sessions that do not exist, sent together with the
    // others.
    let (known, targets) = unknown_session_targets(&store).await;

    let outcomes = join_all(targets.iter().map(|(session_id, batch)| {
        let store = &store;
        let batch = batch.clone();
        async move { store.append(session_id, batch).await }
    }))
    .await;

    for ((session_id, batch), outcome) in targets.iter().zip(outcomes) {
        if check_unknown_session_target(&store, session_id, batch, outcome)
            .await
            .is_none()
        {
            assert_eq!(
                store.session_summary(session_id).await.expect("summary"),
                None,
                "no session for {session_id}"
            );
        }
    }
    // No history of the refused batches went anywhere.
    for session_id in &known {
        let state = store.load(session_id).await.expect("load").expect("known");
        assert_eq!(state.transcript, vec![], "{session_id}");
    }
    let sessions = store.list_sessions(100).await.expect("list");
    assert_eq!(
        sessions.len(),
        known.len(),
        "no session was created for the unknown ids"
    );
}

pub(crate) async fn sixty_four_concurrent_sessions_each_keep_a_complete_gap_free_log(factory: &impl StoreFactory) {
    const SESSIONS: usize = 64;
    const BATCHES: usize = 20;
    let (_database, store) = factory.fresh().await;
    let sessions = create_sessions(&store, "session", SESSIONS).await;
    let expected_logs = append_from_every_session(&store, &sessions, BATCHES).await;
    assert_logs(&store, &sessions, &expected_logs).await;
}

pub(crate) async fn save_creates_rewrites_and_extends_a_session_and_load_returns_exactly_that(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    assert_eq!(store.load("s").await.expect("load"), None);

    let first = checkpoint("s", "bot-1", 0);
    store.save(&first, &[], None).await.expect("create");
    assert_eq!(
        store.load("s").await.expect("load"),
        Some(SessionState {
            checkpoint: first,
            transcript: vec![],
            execution: None,
            last_sequence: 0,
            queued: Vec::new(),
        })
    );

    let second = checkpoint("s", "bot-1", 3);
    let turn = execution("turn-1");
    store
        .save(&second, &[user("hi"), assistant("hello", false)], Some(&turn))
        .await
        .expect("save with history and a running turn");
    assert_eq!(
        store.load("s").await.expect("load"),
        Some(SessionState {
            checkpoint: second,
            transcript: vec![user("hi"), assistant("hello", false)],
            execution: Some(turn.clone()),
            last_sequence: 0,
            queued: Vec::new(),
        })
    );

    // Events do not disturb the history, and the checkpoint counters are
    // rewritten, not accumulated.
    let logged = append(&store, "s", &events("s", 0, 4)).await;
    let third = checkpoint("s", "bot-1", 5);
    store
        .save(&third, &[user("more"), assistant("cut off", true)], Some(&turn))
        .await
        .expect("save again");
    let fourth = checkpoint("s", "bot-1", 6);
    store.save(&fourth, &[], None).await.expect("clear the running turn");
    let history = vec![
        user("hi"),
        assistant("hello", false),
        user("more"),
        assistant("cut off", true),
    ];
    assert_eq!(
        store.load("s").await.expect("load"),
        Some(SessionState {
            checkpoint: fourth,
            transcript: history,
            execution: None,
            last_sequence: 4,
            queued: Vec::new(),
        })
    );
    assert_eq!(whole_log(&store, "s").await, logged);

    // Another session's save touches nothing of this one.
    store
        .save(&checkpoint("t", "bot-2", 1), &[user("other")], None)
        .await
        .expect("save t");
    assert_eq!(
        store.load("s").await.expect("load"),
        Some(SessionState {
            checkpoint: checkpoint("s", "bot-1", 6),
            transcript: vec![
                user("hi"),
                assistant("hello", false),
                user("more"),
                assistant("cut off", true),
            ],
            execution: None,
            last_sequence: 4,
            queued: Vec::new(),
        })
    );
    assert_eq!(whole_log(&store, "s").await, logged);
    assert_eq!(
        store.load("t").await.expect("load"),
        Some(SessionState {
            checkpoint: checkpoint("t", "bot-2", 1),
            transcript: vec![user("other")],
            execution: None,
            last_sequence: 0,
            queued: Vec::new(),
        })
    );
    assert_eq!(whole_log(&store, "t").await, vec![]);
}

pub(crate) async fn append_with_checkpoint_commits_events_checkpoint_and_history_together_or_not_at_all(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;

    // Success: everything of the batch is there.
    let committed = commit_a_turn(&store).await;
    assert_eq!(store.load("s").await.expect("load"), Some(committed.state.clone()));
    assert_eq!(whole_log(&store, "s").await, committed.log);

    // Failure: a batch the store refuses (its cut is longer than the
    // history) leaves nothing of its events, checkpoint or history.
    let error = store
        .append("s", doomed_batch("refused", Some(4)))
        .await
        .expect_err("a cut past the history is refused");
    assert!(matches!(&error, StoreError::Invalid(_)), "{error:?}");
    assert_eq!(store.load("s").await.expect("load"), Some(committed.state.clone()));
    assert_eq!(whole_log(&store, "s").await, committed.log);

    // The failed batch left no hole: the next one continues at 4.
    assert_no_hole_after_failure(&store, &committed).await;
    // The refused batch's history was not counted: the next items follow
    // the committed ones.
    store
        .save(&checkpoint("s", "bot", 3), &[assistant("after", false)], None)
        .await
        .expect("save after failure");
    let mut transcript = committed.state.transcript;
    transcript.push(assistant("after", false));
    assert_eq!(
        store.load("s").await.expect("load").map(|state| state.transcript),
        Some(transcript)
    );
}

pub(crate) async fn append_refuses_a_checkpoint_of_another_session_and_writes_nothing(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    let log = create_s_and_other(&store).await;
    let s_before = store.load("s").await.expect("load");
    let other_before = store.load("other").await.expect("load");

    for foreign in ["other", "nobody"] {
        append_a_foreign_checkpoint(&store, foreign).await;
        assert_eq!(store.load("s").await.expect("load"), s_before);
        assert_eq!(store.load("other").await.expect("load"), other_before);
        assert_eq!(whole_log(&store, "s").await, log);
    }
    assert_eq!(store.load("nobody").await.expect("load"), None);
    let receipt = store.append("s", batch(&events("s", 9, 1))).await.expect("append");
    assert_eq!(receipt.first_sequence, 3, "the refused batches took no sequences");
}

pub(crate) async fn load_returns_checkpoint_history_and_last_sequence_of_one_commit_while_writes_go_on(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    store.save(&checkpoint("s", "bot", 0), &[], None).await.expect("create");

    // Every commit keeps model_calls == history length == last sequence.
    const WRITES: u64 = 1_500;
    let done = std::sync::atomic::AtomicBool::new(false);
    let writer = async {
        for n in 1..=WRITES {
            store
                .append(
                    "s",
                    AppendBatch {
                        lease: None,
                        events: encode(&events("s", n as usize, 1)),
                        checkpoint: Some(CheckpointWrite {
                            checkpoint: checkpoint("s", "bot", n),
                            transcript_delta: vec![user(&n.to_string())],
                            execution: None,
                            history_cut: None,
                        }),
                    },
                )
                .await
                .expect("append");
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    };
    let reader = async {
        let mut torn = Vec::new();
        while !done.load(std::sync::atomic::Ordering::SeqCst) {
            let state = store.load("s").await.expect("load").expect("session");
            let calls = state.checkpoint.model_calls;
            if state.transcript.len() as u64 != calls || state.last_sequence != calls {
                torn.push((calls, state.transcript.len(), state.last_sequence));
            }
        }
        torn
    };
    let ((), torn) = futures::join!(writer, reader);
    assert_eq!(
        torn,
        vec![],
        "loads mixing commits: (model_calls, history, last_sequence)"
    );

    let state = store.load("s").await.expect("load").expect("session");
    assert_eq!(state.checkpoint.model_calls, WRITES);
    assert_eq!(state.transcript.len() as u64, WRITES);
    assert_eq!(state.last_sequence, WRITES);
}

pub(crate) async fn event_page_reads_newest_first_in_ascending_pages_and_paging_back_visits_each_event_once(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    create(&store, "s").await;
    create(&store, "noise").await;
    let mut log = Vec::new();
    for (n, count) in [4, 1, 7, 3, 10].into_iter().enumerate() {
        log.extend(append(&store, "s", &events("s", log.len(), count)).await);
        append(&store, "noise", &events("noise", n, 2)).await;
    }
    assert_eq!(log.len(), 25);
    let slice = |from: u64, to: u64| log[(from - 1) as usize..to as usize].to_vec();

    assert_eq!(
        page(&store, "s", None, 10).await,
        EventPage {
            events: slice(16, 25),
            has_more: true,
        }
    );
    assert_eq!(
        page(&store, "s", Some(16), 10).await,
        EventPage {
            events: slice(6, 15),
            has_more: true,
        }
    );
    assert_eq!(
        page(&store, "s", Some(6), 10).await,
        EventPage {
            events: slice(1, 5),
            has_more: false,
        }
    );
    // A page that ends exactly at the first event has nothing more.
    assert_eq!(
        page(&store, "s", Some(11), 10).await,
        EventPage {
            events: slice(1, 10),
            has_more: false,
        }
    );
    assert_eq!(
        page(&store, "s", None, 25).await,
        EventPage {
            events: log.clone(),
            has_more: false,
        }
    );
    assert_eq!(
        page(&store, "s", None, 24).await,
        EventPage {
            events: slice(2, 25),
            has_more: true,
        }
    );
    // Before a sequence past the end: the newest.
    assert_eq!(
        page(&store, "s", Some(1_000), 3).await,
        EventPage {
            events: slice(23, 25),
            has_more: true,
        }
    );
    assert_eq!(
        page(&store, "s", Some(u64::MAX), 3).await,
        EventPage {
            events: slice(23, 25),
            has_more: true,
        }
    );
    // Before the first: nothing, and nothing more.
    for before in [1, 0] {
        assert_eq!(
            page(&store, "s", Some(before), 10).await,
            EventPage {
                events: vec![],
                has_more: false,
            }
        );
    }

    for limit in [1, 3, 7, 24, 25, 26] {
        let mut visited = Vec::new();
        let mut before = None;
        loop {
            let page = page(&store, "s", before, limit).await;
            assert!(page.events.len() <= limit);
            assert!(
                page.events
                    .windows(2)
                    .all(|pair| pair[0].sequence + 1 == pair[1].sequence),
                "ascending and contiguous inside a page"
            );
            assert_eq!(
                page.has_more,
                page.events.first().is_some_and(|event| event.sequence > 1)
            );
            before = page.events.first().map(|event| event.sequence);
            let has_more = page.has_more;
            visited.splice(0..0, page.events);
            if !has_more {
                break;
            }
        }
        assert_eq!(visited, log, "limit {limit}: every event exactly once");
    }
}

pub(crate) async fn event_page_handles_limit_zero_empty_logs_unknown_sessions_and_caps_the_limit(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    create(&store, "empty").await;
    create(&store, "big").await;

    // Limit 0: no events, whether or not the log has any; has_more says
    // whether there are events before the requested point.
    assert_eq!(
        page(&store, "empty", None, 0).await,
        EventPage {
            events: vec![],
            has_more: false,
        }
    );
    assert_eq!(
        page(&store, "empty", None, 10).await,
        EventPage {
            events: vec![],
            has_more: false,
        }
    );

    let total = MAX_EVENT_PAGE + 5;
    let log = append(&store, "big", &events("big", 0, total)).await;
    assert_eq!(log.len(), total);
    let zero = page(&store, "big", None, 0).await;
    assert!(zero.events.is_empty());
    assert!(zero.has_more);

    for limit in [MAX_EVENT_PAGE + 1, MAX_EVENT_PAGE * 3, usize::MAX] {
        assert_eq!(
            page(&store, "big", None, limit).await,
            EventPage {
                events: log[5..].to_vec(),
                has_more: true,
            },
            "limit {limit} is capped at MAX_EVENT_PAGE"
        );
    }
    assert_eq!(
        page(&store, "big", Some(6), usize::MAX).await,
        EventPage {
            events: log[..5].to_vec(),
            has_more: false,
        }
    );

    for limit in [0, 10] {
        match store
            .event_page(
                "ghost",
                EventPageRequest {
                    before_sequence: None,
                    limit,
                },
            )
            .await
        {
            Err(StoreError::UnknownSession(named)) => assert_eq!(named, "ghost"),
            other => panic!("limit {limit}: expected UnknownSession, got {other:?}"),
        }
    }
}

pub(crate) async fn batches_with_history_but_no_events_are_stored_loaded_and_invisible_to_event_pages(
    factory: &impl StoreFactory,
) {
    let (database, store) = factory.fresh().await;

    // History before any event, events, then history from an append that
    // carries only a checkpoint write and from a save, more events, and
    // history after the last event.
    let (mut log, receipt) = history_then_events_then_history(&store, &events("s", 0, 5)).await;
    assert_eq!(receipt.first_sequence, 6, "names the next sequence and takes none");
    assert_eq!(last_sequence(&store, "s").await, 5);
    let (second, receipt) = more_history_and_events(&store, &events("s", 5, 3)).await;
    log.extend(second);
    assert_eq!(receipt.first_sequence, 9);

    // A session that has history and never had an event.
    create_quiet(&store).await;

    let state = SessionState {
        checkpoint: checkpoint("s", "bot", 3),
        transcript: vec![
            user("u1"),
            assistant("a1", false),
            user("u2"),
            assistant("a2", true),
            user("u3"),
        ],
        execution: Some(execution("turn-2")),
        last_sequence: 8,
        queued: Vec::new(),
    };
    let quiet = SessionState {
        checkpoint: checkpoint("quiet", "bot", 1),
        transcript: vec![user("q1"), assistant("q2", false)],
        execution: None,
        last_sequence: 0,
        queued: Vec::new(),
    };
    assert_eq!(store.load("s").await.expect("load"), Some(state.clone()));
    assert_eq!(store.load("quiet").await.expect("load"), Some(quiet.clone()));

    // Every page, from every starting point and with every limit, is
    // what the events alone make it: the history rows (before, between
    // and after the events, and sharing a first sequence with them) add
    // no events and never make `has_more` true.
    for limit in 0..=10 {
        for before in (0..=10).map(Some).chain([None]) {
            let older: Vec<RecordedEvent> = log
                .iter()
                .filter(|event| before.is_none_or(|before| event.sequence < before))
                .cloned()
                .collect();
            let from = older.len().saturating_sub(limit);
            assert_eq!(
                page(&store, "s", before, limit).await,
                EventPage {
                    events: older[from..].to_vec(),
                    has_more: from > 0,
                },
                "before {before:?}, limit {limit}"
            );
            assert_eq!(
                page(&store, "quiet", before, limit).await,
                EventPage {
                    events: vec![],
                    has_more: false,
                },
                "quiet: before {before:?}, limit {limit}"
            );
        }
    }
    let read = whole_log(&store, "s").await;
    assert_gap_free(&read);
    assert_eq!(read, log);

    // The same after a reopen, and the next event takes sequence 9.
    factory.close(&store).await;
    let store = factory.open(&database).await;
    assert_eq!(store.load("s").await.expect("load"), Some(state));
    assert_eq!(store.load("quiet").await.expect("load"), Some(quiet));
    assert_eq!(whole_log(&store, "s").await, log);
    let third = events("s", 8, 2);
    log.extend(append(&store, "s", &third).await);
    let read = whole_log(&store, "s").await;
    assert_gap_free(&read);
    assert_eq!(read, log);
    factory.close(&store).await;
}

pub(crate) async fn reopened_store_has_everything_and_continues_sequences_and_history(factory: &impl StoreFactory) {
    let (database, store) = factory.fresh().await;
    let turn = execution("turn-7");
    store
        .save(
            &checkpoint("a", "bot-a", 2),
            &[user("a1"), assistant("a2", true)],
            Some(&turn),
        )
        .await
        .expect("save a");
    store
        .save(&checkpoint("b", "bot-b", 4), &[user("b1")], None)
        .await
        .expect("save b");
    let mut log_a = append(&store, "a", &events("a", 0, 5)).await;
    let mut log_b = append(&store, "b", &events("b", 0, 2)).await;
    log_a.extend(append(&store, "a", &events("a", 5, 3)).await);
    let listed = store.list_sessions(10).await.expect("list");
    factory.close(&store).await;
    drop(store);

    let store = factory.open(&database).await;
    assert_eq!(
        store.load("a").await.expect("load a"),
        Some(SessionState {
            checkpoint: checkpoint("a", "bot-a", 2),
            transcript: vec![user("a1"), assistant("a2", true)],
            execution: Some(turn),
            last_sequence: 8,
            queued: Vec::new(),
        })
    );
    assert_eq!(
        store.load("b").await.expect("load b"),
        Some(SessionState {
            checkpoint: checkpoint("b", "bot-b", 4),
            transcript: vec![user("b1")],
            execution: None,
            last_sequence: 2,
            queued: Vec::new(),
        })
    );
    assert_eq!(whole_log(&store, "a").await, log_a);
    assert_eq!(whole_log(&store, "b").await, log_b);
    assert_eq!(store.list_sessions(10).await.expect("list"), listed);

    // Writing continues where it stopped.
    let receipt = store.append("b", batch(&events("b", 2, 3))).await.expect("append b");
    assert_eq!(receipt.first_sequence, 3);
    log_b.extend(recorded(receipt, &events("b", 2, 3)));
    store
        .save(&checkpoint("a", "bot-a", 3), &[user("a3")], None)
        .await
        .expect("save a");
    assert_eq!(
        store.load("a").await.expect("load").map(|state| state.transcript),
        Some(vec![user("a1"), assistant("a2", true), user("a3")])
    );
    factory.close(&store).await;

    let store = factory.open(&database).await;
    let log = whole_log(&store, "b").await;
    assert_gap_free(&log);
    assert_eq!(log, log_b);
    assert_eq!(
        store.load("a").await.expect("load a"),
        Some(SessionState {
            checkpoint: checkpoint("a", "bot-a", 3),
            transcript: vec![user("a1"), assistant("a2", true), user("a3")],
            execution: None,
            last_sequence: 8,
            queued: Vec::new(),
        })
    );
    factory.close(&store).await;
}

pub(crate) async fn closed_store_refuses_every_call(factory: &impl StoreFactory) {
    let (database, store) = factory.fresh().await;
    create(&store, "s").await;
    append(&store, "s", &events("s", 0, 20)).await;
    // Read first, so that the store has connections open at close.
    let _ = store.load("s").await.expect("load");
    let _ = whole_log(&store, "s").await;
    let _ = store.list_sessions(10).await.expect("list");

    factory.close(&store).await;

    let closed = |outcome: Result<(), StoreError>, call: &str| match outcome {
        Err(StoreError::Closed) => {}
        other => panic!("{call} after close: expected Closed, got {other:?}"),
    };
    closed(store.save(&checkpoint("s", "bot", 1), &[], None).await, "save");
    closed(store.save(&checkpoint("new", "bot", 1), &[], None).await, "save new");
    closed(store.load("s").await.map(drop), "load");
    closed(store.append("s", batch(&events("s", 20, 1))).await.map(drop), "append");
    closed(
        store
            .event_page(
                "s",
                EventPageRequest {
                    before_sequence: None,
                    limit: 10,
                },
            )
            .await
            .map(drop),
        "event_page",
    );
    closed(store.list_sessions(10).await.map(drop), "list_sessions");
    // Closing again is harmless.
    factory.close(&store).await;
    closed(store.load("s").await.map(drop), "load after second close");

    let reopened = factory.open(&database).await;
    assert_eq!(last_sequence(&reopened, "s").await, 20);
    assert_eq!(
        reopened.load("new").await.expect("load"),
        None,
        "nothing was written after close"
    );
    factory.close(&reopened).await;
}

pub(crate) async fn list_sessions_puts_the_newest_update_first_with_bot_and_running_turn(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;

    // Writes one tick apart, so their timestamps are strictly ordered.
    store.save(&checkpoint("a", "bot-a", 0), &[], None).await.expect("a");
    tick_past(now_ms()).await;
    store
        .save(&checkpoint("b", "bot-b", 0), &[], Some(&execution("turn-b")))
        .await
        .expect("b");
    tick_past(now_ms()).await;
    store.save(&checkpoint("c", "bot-c", 0), &[], None).await.expect("c");
    tick_past(now_ms()).await;
    let appended = store.append("a", batch(&events("a", 0, 3))).await.expect("append a");
    tick_past(appended.recorded_at_ms).await;
    // An append carrying a checkpoint sets the running turn too.
    let carried = store
        .append(
            "c",
            AppendBatch {
                lease: None,
                events: encode(&events("c", 0, 1)),
                checkpoint: Some(CheckpointWrite {
                    checkpoint: checkpoint("c", "bot-c", 1),
                    transcript_delta: vec![],
                    execution: Some(execution("turn-c")),
                    history_cut: None,
                }),
            },
        )
        .await
        .expect("append c");

    let listed = store.list_sessions(10).await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|summary| summary.session_id.as_str()).collect();
    assert_eq!(ids, vec!["c", "a", "b"]);
    let summary = |session_id: &str| {
        listed
            .iter()
            .find(|summary| summary.session_id == session_id)
            .cloned()
            .expect("listed")
    };
    let (a, b, c) = (summary("a"), summary("b"), summary("c"));
    assert_eq!(
        c,
        SessionSummary {
            session_id: "c".into(),
            bot_id: "bot-c".into(),
            created_at_ms: c.created_at_ms,
            updated_at_ms: carried.recorded_at_ms,
            last_sequence: 1,
            running_turn_id: Some("turn-c".into()),
            context: context("bot-c"),
            usage: checkpoint("c", "bot-c", 1).usage,
            turns_completed: 0,
            awaiting_approval: vec!["call-7".into()],
            awaiting_client: vec!["call-8".into(), "call-9".into()],
            client_deadline_ms: Some(CLIENT_DEADLINE_MS),
            title: None,
        }
    );
    assert_eq!(
        a,
        SessionSummary {
            session_id: "a".into(),
            bot_id: "bot-a".into(),
            created_at_ms: a.created_at_ms,
            updated_at_ms: appended.recorded_at_ms,
            last_sequence: 3,
            running_turn_id: None,
            context: context("bot-a"),
            usage: TokenUsage::default(),
            turns_completed: 0,
            awaiting_approval: vec![],
            awaiting_client: vec![],
            client_deadline_ms: None,
            // Its first user message titled it.
            title: Some("question 1 of a: ünïcødé ✓ \"quoted\" \\".into()),
        }
    );
    assert_eq!(
        b,
        SessionSummary {
            session_id: "b".into(),
            bot_id: "bot-b".into(),
            created_at_ms: b.created_at_ms,
            updated_at_ms: b.created_at_ms,
            last_sequence: 0,
            running_turn_id: Some("turn-b".into()),
            context: context("bot-b"),
            usage: TokenUsage::default(),
            turns_completed: 0,
            awaiting_approval: vec!["call-7".into()],
            awaiting_client: vec!["call-8".into(), "call-9".into()],
            client_deadline_ms: Some(CLIENT_DEADLINE_MS),
            title: None,
        }
    );
    assert!(a.created_at_ms < b.created_at_ms && b.created_at_ms < c.created_at_ms);
    assert!(c.created_at_ms < a.updated_at_ms && a.updated_at_ms < c.updated_at_ms);

    // The limit keeps the newest.
    let two = store.list_sessions(2).await.expect("list 2");
    assert_eq!(two, listed[..2].to_vec());
    assert_eq!(store.list_sessions(0).await.expect("list 0"), vec![]);
    assert_eq!(store.list_sessions(usize::MAX).await.expect("list all"), listed);

    // Clearing the running turn shows in the listing, and moves b first.
    tick_past(carried.recorded_at_ms).await;
    store
        .save(&checkpoint("b", "bot-b", 1), &[], None)
        .await
        .expect("clear b");
    let listed = store.list_sessions(10).await.expect("list");
    let ids: Vec<&str> = listed.iter().map(|summary| summary.session_id.as_str()).collect();
    assert_eq!(ids, vec!["b", "c", "a"]);
    assert_eq!(listed[0].running_turn_id, None);
    assert_eq!(
        listed[0].created_at_ms, b.created_at_ms,
        "a rewrite keeps the creation time"
    );
}

pub(crate) async fn a_newer_lease_fences_off_the_older_holder_and_nothing_it_sends_is_written(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    assert!(matches!(store.acquire("s").await, Err(StoreError::UnknownSession(_))));
    store.save(&checkpoint("s", "bot", 1), &[], None).await.expect("create");
    let first = store.acquire("s").await.expect("first lease");
    let with_lease = |lease, from| AppendBatch {
        lease: Some(lease),
        ..batch(&events("s", from, 2))
    };
    let kept = store
        .append("s", with_lease(first, 0))
        .await
        .expect("the holder writes");
    let second = store.acquire("s").await.expect("taken over");
    assert!(second > first);
    let refused = store.append("s", with_lease(first, 2)).await;
    assert!(
        matches!(&refused, Err(StoreError::Fenced { session_id, lease }) if session_id == "s" && *lease == second),
        "{refused:?}"
    );
    // Nothing of the refused batch was written; the new holder continues
    // the sequence where the old one stopped.
    assert_eq!(last_sequence(&store, "s").await, 2);
    let next = store
        .append("s", with_lease(second, 2))
        .await
        .expect("the new holder writes");
    assert_eq!((kept.first_sequence, next.first_sequence), (1, 3));
    // Writers without a lease (tools, migrations) are not fenced.
    store
        .append("s", batch(&events("s", 4, 1)))
        .await
        .expect("unleased append");
}

pub(crate) async fn events_after_reads_forwards_across_batches_from_any_point(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    create(&store, "s").await;
    create(&store, "other").await;
    let mut written = Vec::new();
    for (from, count) in [(0, 3), (3, 1), (4, 5)] {
        written.extend(append(&store, "s", &events("s", from, count)).await);
        append(&store, "other", &events("other", from, 1)).await;
    }
    assert_eq!(store.events_after("s", 0, 100).await.expect("all"), written);
    // From the middle of a batch, with a limit that ends in another.
    assert_eq!(
        store.events_after("s", 2, 4).await.expect("middle"),
        written[2..6].to_vec()
    );
    // Every point, the first and last of each batch among them (the read
    // seeks the batch holding `after + 1`).
    for after in 0..written.len() {
        assert_eq!(
            store.events_after("s", after as u64, 100).await.expect("tail"),
            written[after..].to_vec(),
            "after {after}"
        );
    }
    assert_eq!(store.events_after("s", 9, 10).await.expect("end"), vec![]);
    assert_eq!(store.events_after("s", u64::MAX, 10).await.expect("past"), vec![]);
    assert!(matches!(
        store.events_after("missing", 0, 10).await,
        Err(StoreError::UnknownSession(_))
    ));
}

pub(crate) async fn sessions_page_newest_created_first_with_a_cursor(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    for id in ["a", "b", "c", "d", "e"] {
        create(&store, id).await;
    }
    // Updating an old session does not move it: the order is creation.
    append(&store, "a", &events("a", 0, 1)).await;
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_sessions_page(cursor.as_deref(), 2, crate::SessionFilter::bot(None))
            .await
            .expect("page");
        assert!(page.sessions.len() <= 2);
        seen.extend(page.sessions.iter().map(|summary| summary.session_id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["e", "d", "c", "b", "a"]);
    let summary = store.session_summary("a").await.expect("summary").expect("a");
    assert_eq!(summary.last_sequence, 1);
    assert_eq!(summary.context, context("bot"));
    assert_eq!(store.session_summary("zzz").await.expect("summary"), None);
    assert!(matches!(
        store
            .list_sessions_page(Some("not-a-cursor"), 2, crate::SessionFilter::bot(None))
            .await,
        Err(StoreError::Invalid(_))
    ));
}

pub(crate) async fn a_queued_submission_stays_stored_until_an_event_settles_it(factory: &impl StoreFactory) {
    use crate::KeyedSubmission;
    use keel_protocol::{BusyPolicy, Op, SubmissionQueuedEvent};
    let (_database, store) = factory.fresh().await;
    create(&store, "s").await;
    append(&store, "s", &events("s", 0, 2)).await;
    let queued = |id: &str, key: Option<&str>| Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            traceparent: None,
            op: Op::UserInput {
                text: format!("text of {id}"),
            },
            on_busy: BusyPolicy::Steer,
            idempotency_key: key.map(str::to_owned),
            submitted_by: None,
        }),
    };
    append(&store, "s", &[queued("q1", Some("key-1")), queued("q2", None)]).await;
    let state = store.load("s").await.expect("load").expect("s");
    let stored: Vec<(&str, u64, BusyPolicy)> = state
        .queued
        .iter()
        .map(|q| (q.id.as_str(), q.sequence, q.on_busy))
        .collect();
    assert_eq!(stored, [("q1", 3, BusyPolicy::Steer), ("q2", 4, BusyPolicy::Steer)]);
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

    // The event that settles q1 takes it off the queue in its commit.
    settle(&store, "s", 2, "q1").await;
    let state = store.load("s").await.expect("load").expect("s");
    assert_eq!(state.queued.iter().map(|q| q.id.as_str()).collect::<Vec<_>>(), ["q2"]);
    // The key outlives the queue entry: a retry is still recognised.
    assert!(store.keyed_submission("s", "key-1").await.expect("key").is_some());
}

/// An idempotency key names one submission for ever, in the store itself:
/// a write that would queue (or refuse) another submission under a stored
/// key, or two under one key, is refused whole, so no interleaving of
/// nodes, relays and retries stores a key twice; the same submission again
/// changes nothing.
pub(crate) async fn an_idempotency_key_names_one_submission_and_a_second_is_refused_whole(factory: &impl StoreFactory) {
    use crate::KeyedSubmission;
    use keel_protocol::{BusyPolicy, Op, SubmissionQueuedEvent, SubmissionRejectedEvent};
    let (_database, store) = factory.fresh().await;
    create(&store, "s").await;
    let queued = |id: &str, key: &str| Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            traceparent: None,
            op: Op::UserInput {
                text: format!("text of {id}"),
            },
            on_busy: BusyPolicy::Queue,
            idempotency_key: Some(key.to_owned()),
            submitted_by: None,
        }),
    };
    let rejected = |id: &str, key: &str| Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionRejected(SubmissionRejectedEvent {
            reason: "busy".into(),
            idempotency_key: Some(key.to_owned()),
        }),
    };
    append(&store, "s", &[queued("q1", "k1")]).await;
    append(&store, "s", &[rejected("r1", "k2")]).await;
    let before = store.load("s").await.expect("load").expect("s");
    for (what, events) in [
        ("a second submission under a queued one's key", vec![queued("q2", "k1")]),
        ("a submission under a refused one's key", vec![queued("q3", "k2")]),
        (
            "two submissions under one key in one write",
            vec![queued("q4", "k3"), queued("q5", "k3")],
        ),
        ("a refusal under a queued one's key", vec![rejected("r2", "k1")]),
    ] {
        let refused = store.append("s", batch(&events)).await;
        assert!(matches!(refused, Err(StoreError::Invalid(_))), "{what}: {refused:?}");
        let after = store.load("s").await.expect("load").expect("s");
        assert_eq!(
            after.last_sequence, before.last_sequence,
            "{what}: nothing of it stored"
        );
        assert_eq!(after.queued.len(), before.queued.len(), "{what}");
    }
    assert_eq!(
        store.keyed_submission("s", "k1").await.expect("key"),
        Some(KeyedSubmission {
            submission_id: "q1".into(),
            sequence: 1
        })
    );
    assert_eq!(store.keyed_submission("s", "k3").await.expect("key"), None);
    // The session goes on: a new key is taken as before.
    append(&store, "s", &[queued("q6", "k4")]).await;
    assert!(store.keyed_submission("s", "k4").await.expect("key").is_some());
}

pub(crate) async fn sessions_are_listed_by_bot_page_by_page(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    for (id, bot) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("c1", "c"), ("a3", "a")] {
        store.save(&checkpoint(id, bot, 0), &[], None).await.expect("create");
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_sessions_page(cursor.as_deref(), 2, crate::SessionFilter::bot(Some("a")))
            .await
            .expect("page");
        seen.extend(page.sessions.iter().map(|summary| summary.session_id.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ["a3", "a2", "a1"]);
    let page = store
        .list_sessions_page(None, 10, crate::SessionFilter::bot(Some("b")))
        .await
        .expect("b");
    assert_eq!(page_ids(page), ["b1"]);
    let page = store
        .list_sessions_page(None, 10, crate::SessionFilter::bot(Some("nobody")))
        .await
        .expect("none");
    assert_eq!((page.sessions.len(), page.next_cursor), (0, None));
    let page = store
        .list_sessions_page(None, 10, crate::SessionFilter::bot(None))
        .await
        .expect("all");
    assert_eq!(page_ids(page), ["a3", "c1", "a2", "b1", "a1"]);
}

pub(crate) async fn sessions_with_work_lists_queued_messages_and_turns_in_flight_in_pages(factory: &impl StoreFactory) {
    use keel_protocol::{BusyPolicy, Op, SubmissionQueuedEvent};
    let (_database, store) = factory.fresh().await;
    for id in ["a-idle", "b-queued", "c-running", "d-settled"] {
        create(&store, id).await;
    }
    let queued = |id: &str| Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            traceparent: None,
            op: Op::UserInput { text: "hi".into() },
            on_busy: BusyPolicy::Queue,
            idempotency_key: None,
            submitted_by: None,
        }),
    };
    append(&store, "b-queued", &[queued("q1")]).await;
    append(&store, "d-settled", &[queued("q2")]).await;
    settle(&store, "d-settled", 1, "q2").await;
    store
        .save(&checkpoint("c-running", "bot", 1), &[], Some(&execution("t")))
        .await
        .expect("a turn in flight");

    let all = store.sessions_with_work(None, 10).await.expect("list");
    assert_eq!(all, ["b-queued", "c-running"]);
    let first = store.sessions_with_work(None, 1).await.expect("list");
    assert_eq!(first, ["b-queued"]);
    let rest = store.sessions_with_work(Some("b-queued"), 1).await.expect("list");
    assert_eq!(rest, ["c-running"]);
    assert!(
        store
            .sessions_with_work(Some("c-running"), 1)
            .await
            .expect("list")
            .is_empty()
    );
}

pub(crate) async fn history_until_takes_the_batches_up_to_a_sequence_and_never_splits_one(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    // A session created with history (as a fork is): that history counts
    // from the start.
    store
        .save(&checkpoint("s", "bot", 0), &[user("seed")], None)
        .await
        .expect("create");
    append_with_history(&store, "s", &events("s", 1, 2), &[user("one"), assistant("A", false)]).await; // 1-2
    append(&store, "s", &events("s", 3, 1)).await; // 3, no history
    append_with_history(&store, "s", &events("s", 4, 3), &[user("two")]).await; // 4-6

    let until = |at| store.history_until("s", at);
    assert_eq!(until(0).await.expect("read"), Some(vec![user("seed")]));
    let first = Some(vec![user("seed"), user("one"), assistant("A", false)]);
    assert_eq!(until(2).await.expect("read"), first);
    assert_eq!(until(3).await.expect("read"), first);
    assert_eq!(
        until(6).await.expect("read"),
        Some(vec![user("seed"), user("one"), assistant("A", false), user("two")])
    );
    for inside in [1, 4, 5] {
        let refused = until(inside).await;
        assert!(matches!(refused, Err(StoreError::Invalid(_))), "{inside}: {refused:?}");
    }
    assert!(matches!(until(7).await, Err(StoreError::Invalid(_))), "past the log");
    assert_eq!(store.history_until("nobody", 0).await.expect("read"), None);
    // The whole history still loads as before.
    let loaded = store.load("s").await.expect("load").expect("stored");
    assert_eq!(loaded.transcript.len(), 4);
}

pub(crate) async fn a_history_cut_drops_the_newest_items_for_loads_and_forks_and_keeps_the_log(
    factory: &impl StoreFactory,
) {
    let (database, store) = factory.fresh().await;
    store.save(&checkpoint("s", "bot", 0), &[], None).await.expect("create");
    append_with_history(&store, "s", &events("s", 1, 2), &[user("one"), assistant("A", false)]).await; // 1-2
    append_with_history(&store, "s", &events("s", 3, 2), &[user("two"), assistant("B", false)]).await; // 3-4
    // Roll the second turn back and run it again, in one batch.
    append_with_cut(
        &store,
        "s",
        &events("s", 5, 2),
        Some(2),
        &[user("two"), assistant("C", false)],
    )
    .await
    .expect("cut"); // 5-6
    let expected = vec![user("one"), assistant("A", false), user("two"), assistant("C", false)];
    let loaded = store.load("s").await.expect("load").expect("stored");
    assert_eq!(loaded.transcript, expected);
    assert_eq!(loaded.last_sequence, 6);
    let until = |at| store.history_until("s", at);
    assert_eq!(until(4).await.expect("read").map(|items| items.len()), Some(4));
    assert_eq!(until(4).await.expect("read").expect("stored")[3], assistant("B", false));
    assert_eq!(until(6).await.expect("read"), Some(expected.clone()));
    // A cut past the history is refused and writes nothing.
    let refused = append_with_cut(&store, "s", &events("s", 7, 1), Some(5), &[]).await;
    assert!(
        matches!(&refused, Err(StoreError::Invalid(message)) if message.contains("it has 4")),
        "{refused:?}"
    );
    let after = store.load("s").await.expect("load").expect("stored");
    assert_eq!((after.transcript, after.last_sequence), (expected.clone(), 6));
    // A cut with nothing added, then a reopen: the stored length agrees.
    append_with_cut(&store, "s", &events("s", 7, 1), Some(1), &[])
        .await
        .expect("cut");
    drop(store);
    let store = factory.open(&database).await;
    let reopened = store.load("s").await.expect("load").expect("stored");
    assert_eq!(reopened.transcript, vec![user("one")]);
    assert_eq!(store.history_until("s", 6).await.expect("read"), Some(expected));
}

pub(crate) async fn create_makes_a_session_with_its_first_events_once_even_across_stores(factory: &impl StoreFactory) {
    let database = factory.database().await;
    // Two stores on one database stand for two processes.
    let (first, second) = (factory.open(&database).await, factory.open(&database).await);
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
            Ok(_) => true,
            Err(StoreError::Exists(id)) => id == "new",
            Err(_) => false,
        }),
        "{outcomes:?}"
    );
    let state = first.load("new").await.expect("load").expect("created");
    assert_eq!((state.last_sequence, state.transcript), (2, vec![user("seed")]));
    // Refused over an existing session: nothing written.
    create(&first, "old").await;
    let refused = first
        .create(&checkpoint("old", "other", 0), &history, encode(&events("old", 0, 1)))
        .await;
    assert!(matches!(refused, Err(StoreError::Exists(_))), "{refused:?}");
    let old = first.load("old").await.expect("load").expect("old");
    assert_eq!((old.last_sequence, old.transcript.len()), (0, 0));
}

pub(crate) async fn a_lease_taken_through_another_handle_fences_this_one(factory: &impl StoreFactory) {
    let database = factory.database().await;
    // Two stores on one database stand for two processes.
    let (first, second) = (factory.open(&database).await, factory.open(&database).await);
    first.save(&checkpoint("s", "bot", 1), &[], None).await.expect("create");
    let with_lease = |lease, from| AppendBatch {
        lease: Some(lease),
        ..batch(&events("s", from, 2))
    };
    let old = first.acquire("s").await.expect("first lease");
    let kept = first.append("s", with_lease(old, 0)).await.expect("the holder writes");
    // The other process takes the session over.
    let new = second.acquire("s").await.expect("taken over");
    assert!(new > old);
    let refused = first.append("s", with_lease(old, 2)).await;
    assert!(
        matches!(&refused, Err(StoreError::Fenced { session_id, lease }) if session_id == "s" && *lease == new),
        "{refused:?}"
    );
    assert_eq!(last_sequence(&second, "s").await, 2);
    // The new holder continues, through either handle; the old lease stays
    // refused through either.
    let next = second
        .append("s", with_lease(new, 2))
        .await
        .expect("the new holder writes");
    assert_eq!((kept.first_sequence, next.first_sequence), (1, 3));
    let refused = second.append("s", with_lease(old, 4)).await;
    assert!(matches!(&refused, Err(StoreError::Fenced { .. })), "{refused:?}");
    let next = first
        .append("s", with_lease(new, 4))
        .await
        .expect("the new lease through the first handle");
    assert_eq!(next.first_sequence, 5);
    assert_eq!(last_sequence(&first, "s").await, 6);
}

// ---------------------------------------------------------------------------
// Owned leases
// ---------------------------------------------------------------------------

/// A lease's time to live in the tests that let one expire.
const SHORT_TTL: Duration = Duration::from_millis(1000);

/// A lease's time to live in the tests that need one to stay live.
const LONG_TTL: Duration = Duration::from_secs(60);

/// Waits until a [`SHORT_TTL`] lease taken before the call has expired,
/// with a generous margin (these tests check behaviour, not speed).
async fn past_short_ttl() {
    tokio::time::sleep(SHORT_TTL * 3).await;
}

fn leased(lease: u64, session_id: &str, from: usize) -> AppendBatch {
    AppendBatch {
        lease: Some(lease),
        ..batch(&events(session_id, from, 2))
    }
}

fn assert_owned_by(outcome: &Result<u64, StoreError>, session: &str, holder: &str) {
    assert!(
        matches!(outcome, Err(StoreError::Owned { session_id, owner, expires_in_ms })
            if session_id == session && owner == holder && *expires_in_ms > 0),
        "{outcome:?}"
    );
}

pub(crate) async fn two_owners_racing_for_one_session_exactly_one_wins(factory: &impl StoreFactory) {
    let database = factory.database().await;
    // Two stores on one database stand for two nodes.
    let (first, second) = (factory.open(&database).await, factory.open(&database).await);
    assert!(matches!(
        first.claim("nobody", "node-a", LONG_TTL).await,
        Err(StoreError::UnknownSession(_))
    ));
    let ids = create_sessions(&first, "race", 8).await;
    for id in &ids {
        let (a, b) = futures::join!(
            first.claim(id, "node-a", LONG_TTL),
            second.claim(id, "node-b", LONG_TTL)
        );
        let (winner, epoch, loser) = match (&a, &b) {
            (Ok(epoch), Err(_)) => ("node-a", *epoch, &b),
            (Err(_), Ok(epoch)) => ("node-b", *epoch, &a),
            _ => panic!("exactly one claim of {id} must win: {a:?} / {b:?}"),
        };
        assert_owned_by(loser, id, winner);
        assert!(epoch > 0, "a claim bumps the epoch");
        // The winner renews its live lease by claiming again: same epoch.
        assert_eq!(first.claim(id, winner, LONG_TTL).await.expect("renewed"), epoch);
        // Its appends at that epoch go through, through either handle.
        second.append(id, leased(epoch, id, 0)).await.expect("the owner writes");
    }
}

pub(crate) async fn an_expired_lease_is_taken_over_with_a_new_epoch_that_fences_the_first_owner(
    factory: &impl StoreFactory,
) {
    let database = factory.database().await;
    let (first, second) = (factory.open(&database).await, factory.open(&database).await);
    create(&first, "s").await;
    let old = first.claim("s", "node-a", SHORT_TTL).await.expect("claimed");
    first.append("s", leased(old, "s", 0)).await.expect("the owner writes");
    assert_owned_by(&second.claim("s", "node-b", SHORT_TTL).await, "s", "node-a");
    past_short_ttl().await;
    // node-a paused past its lease; node-b takes the session over.
    let new = second.claim("s", "node-b", LONG_TTL).await.expect("taken over");
    assert!(new > old, "{new} > {old}");
    for store in [&first, &second] {
        let refused = store.append("s", leased(old, "s", 2)).await;
        assert!(
            matches!(&refused, Err(StoreError::Fenced { session_id, lease }) if session_id == "s" && *lease == new),
            "{refused:?}"
        );
    }
    assert_eq!(
        last_sequence(&first, "s").await,
        2,
        "nothing of a fenced batch is written"
    );
    // node-a, resumed, cannot take it back while node-b's lease lives.
    assert_owned_by(&first.claim("s", "node-a", SHORT_TTL).await, "s", "node-b");
    let next = first
        .append("s", leased(new, "s", 2))
        .await
        .expect("the new owner writes");
    assert_eq!(next.first_sequence, 3);

    // An owner claiming again after its own lease expired gets a new
    // epoch too: what it wrote before the expiry may race a taker-over.
    create(&first, "t").await;
    let before = first.claim("t", "node-a", SHORT_TTL).await.expect("claimed");
    past_short_ttl().await;
    let after = first.claim("t", "node-a", SHORT_TTL).await.expect("claimed again");
    assert!(after > before, "{after} > {before}");
    let refused = first.append("t", leased(before, "t", 0)).await;
    assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
}

pub(crate) async fn renew_extends_the_leases_still_held_and_reports_the_lost_ones(factory: &impl StoreFactory) {
    let database = factory.database().await;
    let (first, second) = (factory.open(&database).await, factory.open(&database).await);
    for id in ["kept", "released", "taken", "deleted", "stale"] {
        create(&first, id).await;
    }
    let mut held = Vec::new();
    for id in ["kept", "released", "taken", "deleted", "stale"] {
        let epoch = first.claim(id, "node-a", SHORT_TTL).await.expect("claimed");
        held.push((id.to_owned(), epoch));
    }
    assert!(first.renew("node-a", LONG_TTL, &[]).await.expect("nothing").is_empty());
    first.release("released", "node-a", held[1].1).await.expect("released");
    assert!(first.delete_session("deleted").await.expect("deleted"));
    // "stale" is listed at an epoch node-a no longer holds.
    held[4].1 += 1;
    past_short_ttl().await;
    second.claim("taken", "node-b", LONG_TTL).await.expect("taken over");
    // "kept" expired but nobody claimed it: it is still node-a's.
    let lost = first.renew("node-a", LONG_TTL, &held).await.expect("renewed");
    assert_eq!(lost, ["released", "taken", "deleted", "stale"]);
    assert_owned_by(&second.claim("kept", "node-b", LONG_TTL).await, "kept", "node-a");
    first
        .append("kept", leased(held[0].1, "kept", 0))
        .await
        .expect("the owner writes");
    // Renewed for the long TTL: still held after the short one.
    past_short_ttl().await;
    assert_owned_by(&second.claim("kept", "node-b", LONG_TTL).await, "kept", "node-a");
    // Another owner renews nothing of node-a's.
    let lost = second.renew("node-b", LONG_TTL, &held[..1]).await.expect("renew");
    assert_eq!(lost, ["kept"]);
}

pub(crate) async fn release_lets_another_owner_claim_at_once(factory: &impl StoreFactory) {
    let database = factory.database().await;
    let (first, second) = (factory.open(&database).await, factory.open(&database).await);
    assert!(matches!(
        first.release("nobody", "node-a", 1).await,
        Err(StoreError::UnknownSession(_))
    ));
    create(&first, "s").await;
    let old = first.claim("s", "node-a", LONG_TTL).await.expect("claimed");
    // Releases by someone else, or at another epoch, change nothing.
    second.release("s", "node-b", old).await.expect("not node-b's");
    first.release("s", "node-a", old + 1).await.expect("not that epoch");
    assert_owned_by(&second.claim("s", "node-b", LONG_TTL).await, "s", "node-a");
    // The hand-off: node-a releases, node-b claims at once.
    first.release("s", "node-a", old).await.expect("released");
    let new = second.claim("s", "node-b", LONG_TTL).await.expect("claimed at once");
    assert!(new > old, "{new} > {old}");
    let refused = first.append("s", leased(old, "s", 0)).await;
    assert!(matches!(refused, Err(StoreError::Fenced { .. })), "{refused:?}");
    second
        .append("s", leased(new, "s", 0))
        .await
        .expect("the new owner writes");
    // A released lease that nobody claimed is claimed again with a new epoch.
    second.release("s", "node-b", new).await.expect("released");
    let again = second.claim("s", "node-b", LONG_TTL).await.expect("claimed");
    assert!(again > new, "{again} > {new}");
}

pub(crate) async fn sessions_to_take_over_lists_sessions_with_work_and_no_live_owner(factory: &impl StoreFactory) {
    use keel_protocol::{BusyPolicy, Op, SubmissionQueuedEvent};
    let (_database, store) = factory.fresh().await;
    let ids = [
        "a-idle-unowned",
        "b-queued-unowned",
        "c-running-owned",
        "d-running-expiring",
        "e-queued-released",
        "f-queued-owned",
    ];
    for id in ids {
        create(&store, id).await;
    }
    let queued = |id: &str| Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            traceparent: None,
            op: Op::UserInput { text: "hi".into() },
            on_busy: BusyPolicy::Queue,
            idempotency_key: None,
            submitted_by: None,
        }),
    };
    for id in ["b-queued-unowned", "e-queued-released", "f-queued-owned"] {
        append(&store, id, &[queued(&format!("{id}-q"))]).await;
    }
    for id in ["c-running-owned", "d-running-expiring"] {
        store
            .save(&checkpoint(id, "bot", 1), &[], Some(&execution("t")))
            .await
            .expect("a turn in flight");
    }
    store
        .claim("c-running-owned", "node-a", LONG_TTL)
        .await
        .expect("claimed");
    store
        .claim("f-queued-owned", "node-a", LONG_TTL)
        .await
        .expect("claimed");
    store
        .claim("a-idle-unowned", "node-a", SHORT_TTL)
        .await
        .expect("claimed");
    store
        .claim("d-running-expiring", "node-a", SHORT_TTL)
        .await
        .expect("claimed");
    let epoch = store
        .claim("e-queued-released", "node-a", LONG_TTL)
        .await
        .expect("claimed");
    store
        .release("e-queued-released", "node-a", epoch)
        .await
        .expect("released");
    let now = store.sessions_to_take_over(None, 10).await.expect("list");
    assert_eq!(now, ["b-queued-unowned", "e-queued-released"]);
    past_short_ttl().await;
    let later = store.sessions_to_take_over(None, 10).await.expect("list");
    assert_eq!(later, ["b-queued-unowned", "d-running-expiring", "e-queued-released"]);
    assert_eq!(
        store.sessions_to_take_over(None, 1).await.expect("list"),
        ["b-queued-unowned"]
    );
    assert_eq!(
        store
            .sessions_to_take_over(Some("b-queued-unowned"), 10)
            .await
            .expect("the next page"),
        ["d-running-expiring", "e-queued-released"]
    );
    // Taken over, it leaves the list.
    store
        .claim("d-running-expiring", "node-b", LONG_TTL)
        .await
        .expect("taken over");
    let after = store.sessions_to_take_over(None, 10).await.expect("list");
    assert_eq!(after, ["b-queued-unowned", "e-queued-released"]);
}

pub(crate) async fn titles_come_from_the_first_user_message_until_a_rename(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    create(&store, "s").await;
    let message = |text: &str| Event {
        submission_id: None,
        msg: EventMsg::UserMessage(UserMessageEvent {
            turn_id: "t".into(),
            text: text.into(),
        }),
    };
    let title = |store| async move {
        CheckpointStore::session_summary(store, "s")
            .await
            .expect("summary")
            .expect("s")
            .title
    };
    assert_eq!(title(&store).await, None);
    append(&store, "s", &[message("\n  first line  \nsecond"), message("later")]).await;
    assert_eq!(title(&store).await.as_deref(), Some("first line"));
    append(&store, "s", &[message("another")]).await;
    assert_eq!(title(&store).await.as_deref(), Some("first line"));
    assert!(store.rename_session("s", "Renamed").await.expect("rename"));
    assert_eq!(title(&store).await.as_deref(), Some("Renamed"));
    assert!(!store.rename_session("nobody", "x").await.expect("rename"));
}
