//! The contract of [`AccessStore`], as tests that run against any backend
//! that has it: keys as stored, the access revision, budgets, the usage
//! ledger and turns in flight per tenant.
//!
//! A backend's test module runs them with one line,
//! [`access_conformance_tests!`], beside the store suite.

use futures::future::join_all;

use super::tenants::tenant_checkpoint;
use super::{StoreFactory, batch, events, execution};
use crate::{
    AccessStore, ApiKeyRecord, AppendBatch, AppendReceipt, BudgetTarget, CheckpointStore, CheckpointStoreExt,
    EncodedEvent, Ledger, LedgerRead, SessionEdit, SlotClaim, StoreError, TURN_SLOT_GRACE_MS, TurnSlot, UsageBucket,
};
use keel_protocol::{CompactionReason, ContextCompactedEvent, Event, EventMsg, TokenUsage, TokenUsageEvent};

/// Expands to one `#[tokio::test]` per access conformance test, in a
/// module `access_conformance`, each run against the factory `$factory`
/// (whose store must implement [`AccessStore`]).
macro_rules! access_conformance_tests {
    ($factory:expr) => {
        /// The access conformance suite (`crate::conformance::access`)
        /// run against this backend.
        mod access_conformance {
            #[allow(unused_imports)]
            use super::*;

            $crate::conformance::store_conformance_tests!(@test keys_are_stored_exactly_as_given_unique_by_id_and_by_hash, $factory);
            $crate::conformance::store_conformance_tests!(@test a_revocation_keeps_its_first_time_and_touches_only_move_forward, $factory);
            $crate::conformance::store_conformance_tests!(@test the_revision_grows_with_every_change_of_keys_or_budgets_and_only_then, $factory);
            $crate::conformance::store_conformance_tests!(@test budgets_are_set_replaced_and_removed_for_every_handle, $factory);
            $crate::conformance::store_conformance_tests!(@test the_ledger_sums_the_usage_of_committed_batches_by_tenant_session_and_hour, $factory);
            $crate::conformance::store_conformance_tests!(@test concurrent_sessions_of_one_tenant_all_count_in_its_ledger, $factory);
            $crate::conformance::store_conformance_tests!(@test a_refused_batch_adds_nothing_to_the_ledger, $factory);
            $crate::conformance::store_conformance_tests!(@test deleting_a_session_drops_its_ledger_and_budget_but_not_its_tenants_spending, $factory);
            $crate::conformance::store_conformance_tests!(@test running_turns_counts_the_sessions_of_a_tenant_with_a_turn_in_flight, $factory);
            $crate::conformance::store_conformance_tests!(@test turn_slots_are_taken_up_to_the_cap_once_per_session_and_given_back_at_rest, $factory);
            $crate::conformance::store_conformance_tests!(@test an_admission_reads_what_each_ledger_read_does_and_takes_the_same_slot, $factory);
        }
    };
}
pub(crate) use access_conformance_tests;

/// A key record, with every field set to something that tells it apart.
fn key(id: &str, hash: &str, created_at_ms: u64) -> ApiKeyRecord {
    ApiKeyRecord {
        id: id.into(),
        tenant: format!("tenant-of-{id}"),
        name: format!("name of {id} ✓"),
        scopes: vec!["read".into(), "submit".into()],
        hash: hash.into(),
        created_at_ms,
        last_used_at_ms: None,
        expires_at_ms: Some(created_at_ms + 86_400_000),
        revoked_at_ms: None,
    }
}

/// A SHA-256 in hex, made up.
fn hash(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

pub(crate) async fn keys_are_stored_exactly_as_given_unique_by_id_and_by_hash<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    assert!(store.api_keys().await.expect("keys").is_empty());
    let first = key("k1", &hash(1), 2_000);
    store.create_api_key(&first).await.expect("create");
    // The record holds what it was given, and only that: a hash, never a
    // secret the store could have made up or kept.
    assert_eq!(store.api_keys().await.expect("keys"), std::slice::from_ref(&first));

    let same_id = key("k1", &hash(2), 3_000);
    let same_hash = key("k2", &hash(1), 3_000);
    for taken in [&same_id, &same_hash] {
        let refused = store.create_api_key(taken).await;
        assert!(
            matches!(&refused, Err(StoreError::Exists(id)) if *id == taken.id),
            "{refused:?}"
        );
    }
    assert_eq!(store.api_keys().await.expect("keys"), std::slice::from_ref(&first));

    // Oldest first, by when they were made, not by when they were stored.
    let mut older = key("k0", &hash(3), 1_000);
    older.scopes = vec!["admin".into()];
    older.expires_at_ms = None;
    older.last_used_at_ms = Some(1_500);
    store.create_api_key(&older).await.expect("create");
    let expected = [older, first];
    assert_eq!(store.api_keys().await.expect("keys"), expected);
    // Every node sees them.
    let other = factory.open(&database).await;
    assert_eq!(other.api_keys().await.expect("keys"), expected);
}

pub(crate) async fn a_revocation_keeps_its_first_time_and_touches_only_move_forward<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    store.create_api_key(&key("k1", &hash(1), 1_000)).await.expect("create");
    store.create_api_key(&key("k2", &hash(2), 1_001)).await.expect("create");
    assert!(store.revoke_api_key("k1", 5_000).await.expect("revoke"));
    assert!(store.revoke_api_key("k1", 9_000).await.expect("revoke again"));
    assert!(!store.revoke_api_key("nobody", 5_000).await.expect("unknown"));
    let used = |keys: Vec<ApiKeyRecord>| {
        keys.into_iter()
            .map(|key| (key.id, key.last_used_at_ms, key.revoked_at_ms))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        used(store.api_keys().await.expect("keys")),
        [("k1".into(), None, Some(5_000)), ("k2".into(), None, None)]
    );

    let touches = [
        ("k2".to_owned(), 7_000),
        ("k2".to_owned(), 6_000),
        ("ghost".to_owned(), 1),
    ];
    store.touch_api_keys(&touches).await.expect("touch");
    store.touch_api_keys(&[("k1".to_owned(), 4_000)]).await.expect("touch");
    store.touch_api_keys(&[]).await.expect("touch nothing");
    assert_eq!(
        used(store.api_keys().await.expect("keys")),
        [
            ("k1".into(), Some(4_000), Some(5_000)),
            ("k2".into(), Some(7_000), None)
        ]
    );
    // An earlier time, from any node, never moves it back.
    let other = factory.open(&database).await;
    other.touch_api_keys(&[("k2".to_owned(), 6_500)]).await.expect("touch");
    other.touch_api_keys(&[("k1".to_owned(), 8_000)]).await.expect("touch");
    assert_eq!(
        used(store.api_keys().await.expect("keys")),
        [
            ("k1".into(), Some(8_000), Some(5_000)),
            ("k2".into(), Some(7_000), None)
        ]
    );
}

pub(crate) async fn the_revision_grows_with_every_change_of_keys_or_budgets_and_only_then<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let other = factory.open(&database).await;
    let mut last = store.access_revision().await.expect("revision");
    let mut changed = async |store: &F::Store, changed: bool, what: &str| {
        let now = store.access_revision().await.expect("revision");
        if changed {
            assert!(now > last, "{what}: {now} after {last}");
        } else {
            assert_eq!(now, last, "{what}");
        }
        last = now;
    };
    store.create_api_key(&key("k1", &hash(1), 1)).await.expect("create");
    changed(&store, true, "create").await;
    assert!(store.create_api_key(&key("k1", &hash(2), 1)).await.is_err());
    changed(&store, false, "a refused create").await;
    store.touch_api_keys(&[("k1".to_owned(), 5)]).await.expect("touch");
    changed(&store, false, "touch").await;
    other.revoke_api_key("k1", 9).await.expect("revoke");
    changed(&store, true, "revoke on another node").await;
    store.revoke_api_key("k1", 10).await.expect("revoke again");
    changed(&store, false, "a second revocation").await;
    store.revoke_api_key("ghost", 10).await.expect("revoke unknown");
    changed(&store, false, "revoking an unknown key").await;
    let tenant = BudgetTarget::Tenant("acme".into());
    store.set_budget(&tenant, Some("{}")).await.expect("set");
    changed(&other, true, "set a budget").await;
    store.set_budget(&tenant, Some(r#"{"a":1}"#)).await.expect("replace");
    changed(&store, true, "replace a budget").await;
    store.set_budget(&tenant, None).await.expect("remove");
    changed(&store, true, "remove a budget").await;
}

pub(crate) async fn budgets_are_set_replaced_and_removed_for_every_handle<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let other = factory.open(&database).await;
    assert!(store.budgets().await.expect("budgets").is_empty());
    let acme = BudgetTarget::Tenant("acme".into());
    let beta = BudgetTarget::Tenant("beta".into());
    let session = BudgetTarget::Session("acme".into());
    let json = r#"{"day":{"total_tokens":1000},"note":"ünïcødé"}"#;
    store.set_budget(&session, Some("{\"s\":1}")).await.expect("set");
    store.set_budget(&beta, Some("{\"b\":1}")).await.expect("set");
    store.set_budget(&acme, Some("{\"a\":1}")).await.expect("set");
    other.set_budget(&acme, Some(json)).await.expect("replace");
    // A session and a tenant of one name are two targets; by target order.
    let expected = vec![
        (acme.clone(), json.to_owned()),
        (beta.clone(), "{\"b\":1}".to_owned()),
        (session.clone(), "{\"s\":1}".to_owned()),
    ];
    assert_eq!(store.budgets().await.expect("budgets"), expected);
    store.set_budget(&beta, None).await.expect("remove");
    store.set_budget(&beta, None).await.expect("remove again");
    assert_eq!(
        other.budgets().await.expect("budgets"),
        [expected[0].clone(), expected[2].clone()]
    );
}

/// A `token_usage` event of `input` and `output` tokens.
pub(crate) fn used(input: u64, output: u64) -> Event {
    Event {
        submission_id: Some("sub".into()),
        msg: EventMsg::TokenUsage(TokenUsageEvent {
            turn_id: "turn".into(),
            step: 1,
            usage: TokenUsage {
                input_tokens: input,
                cached_input_tokens: input / 2,
                output_tokens: output,
                reasoning_tokens: output / 2,
            },
            // Not what the ledger counts.
            session_total: TokenUsage {
                input_tokens: 1_000_000,
                ..TokenUsage::default()
            },
        }),
    }
}

/// A `context_compacted` event, with the usage of its summary request or
/// without.
fn compacted(usage: Option<TokenUsage>) -> Event {
    Event {
        submission_id: None,
        msg: EventMsg::ContextCompacted(ContextCompactedEvent {
            turn_id: None,
            reason: CompactionReason::Requested,
            summary: "summary".into(),
            replaced_from: 0,
            replaced_to: 0,
            tokens_before: 500,
            tokens_after: 100,
            duration_ms: 3,
            usage,
        }),
    }
}

fn usage(input: u64, output: u64) -> TokenUsage {
    TokenUsage {
        input_tokens: input,
        cached_input_tokens: input / 2,
        output_tokens: output,
        reasoning_tokens: output / 2,
    }
}

/// The usage a session's events report, read back from its log.
async fn logged_usage(store: &dyn CheckpointStore, session_id: &str) -> TokenUsage {
    let mut total = TokenUsage::default();
    for event in store.events_after(session_id, 0, 10_000).await.expect("events") {
        match &event.event.msg {
            EventMsg::TokenUsage(step) => total.add(&step.usage),
            EventMsg::ContextCompacted(compacted) => {
                if let Some(usage) = &compacted.usage {
                    total.add(usage);
                }
            }
            _ => {}
        }
    }
    total
}

fn sum(buckets: &[UsageBucket]) -> TokenUsage {
    let mut total = TokenUsage::default();
    for bucket in buckets {
        total.add(&bucket.usage);
    }
    total
}

/// Checks the buckets are whole hours, oldest first, around `receipts`.
fn check_hours(buckets: &[UsageBucket], receipts: &[AppendReceipt]) {
    assert!(!buckets.is_empty());
    assert!(
        buckets
            .windows(2)
            .all(|pair| pair[0].hour_start_ms < pair[1].hour_start_ms)
    );
    for bucket in buckets {
        assert_eq!(bucket.hour_start_ms % 3_600_000, 0);
        assert!(
            receipts
                .iter()
                .any(|receipt| receipt.recorded_at_ms / 3_600_000 * 3_600_000 == bucket.hour_start_ms),
            "an hour nothing was recorded in: {bucket:?}"
        );
    }
}

async fn append(store: &dyn CheckpointStore, session_id: &str, events: &[Event]) -> AppendReceipt {
    store.append(session_id, batch(events)).await.expect("append")
}

pub(crate) async fn the_ledger_sums_the_usage_of_committed_batches_by_tenant_session_and_hour<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let first_events = [used(7, 3)];
    let encoded: Vec<EncodedEvent> = super::encode(&first_events);
    let mut receipts = vec![
        store
            .create(&tenant_checkpoint("a1", "bot", "acme"), &[], encoded)
            .await
            .expect("create"),
    ];
    for (id, owner) in [("a2", "acme"), ("b1", "beta")] {
        store
            .save(&tenant_checkpoint(id, "bot", owner), &[], None)
            .await
            .expect("save");
    }
    receipts.push(append(&store, "a1", &[used(100, 10), used(200, 20)]).await);
    receipts.push(append(&store, "a1", &events("a1", 0, 5)).await);
    receipts.push(append(&store, "a1", &[compacted(Some(usage(40, 4))), compacted(None)]).await);
    receipts.push(append(&store, "a2", &[used(1_000, 100)]).await);
    receipts.push(append(&store, "b1", &[used(5, 5), compacted(None)]).await);
    // A batch written with a checkpoint counts the same.
    let mut with_checkpoint = batch(&[used(1, 1)]);
    with_checkpoint.checkpoint = Some(crate::CheckpointWrite::new(
        &tenant_checkpoint("a2", "bot", "acme"),
        &[],
        None,
    ));
    receipts.push(store.append("a2", with_checkpoint).await.expect("append"));

    let a1 = usage(7 + 100 + 200 + 40, 3 + 10 + 20 + 4);
    let a2 = usage(1_001, 101);
    let mut acme = a1;
    acme.add(&a2);
    let session = |id: &str| BudgetTarget::Session(id.into());
    let tenant = |id: &str| BudgetTarget::Tenant(id.into());
    for (target, expected) in [
        (session("a1"), a1),
        (session("a2"), a2),
        (session("b1"), usage(5, 5)),
        (tenant("acme"), acme),
        (tenant("beta"), usage(5, 5)),
        (tenant("nobody"), TokenUsage::default()),
        (session("nobody"), TokenUsage::default()),
    ] {
        assert_eq!(store.usage_total(&target).await.expect("total"), expected, "{target:?}");
        let buckets = store.usage_buckets(&target, 0).await.expect("buckets");
        assert_eq!(sum(&buckets), expected, "{target:?}");
        if expected != TokenUsage::default() {
            check_hours(&buckets, &receipts);
        }
    }
    // The ledger agrees with the events committed.
    for id in ["a1", "a2", "b1"] {
        assert_eq!(
            store.usage_total(&session(id)).await.expect("total"),
            logged_usage(&store, id).await,
            "{id}"
        );
    }
    // A window that starts after the last hour has nothing; one that
    // starts in it has that hour.
    let last_hour = receipts
        .iter()
        .map(|receipt| receipt.recorded_at_ms)
        .max()
        .expect("receipts")
        / 3_600_000
        * 3_600_000;
    assert!(
        store
            .usage_buckets(&tenant("acme"), last_hour + 1)
            .await
            .expect("buckets")
            .is_empty()
    );
    let last = store.usage_buckets(&tenant("acme"), last_hour).await.expect("buckets");
    assert_eq!(
        last.iter().map(|bucket| bucket.hour_start_ms).collect::<Vec<_>>(),
        [last_hour]
    );
    // Every node reads the same ledger, and it survives a restart.
    factory.close(&store).await;
    let reopened = factory.open(&database).await;
    assert_eq!(reopened.usage_total(&tenant("acme")).await.expect("total"), acme);
}

pub(crate) async fn concurrent_sessions_of_one_tenant_all_count_in_its_ledger<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let other = factory.open(&database).await;
    let ids: Vec<String> = (0..16).map(|n| format!("s{n:02}")).collect();
    for id in &ids {
        store
            .save(&tenant_checkpoint(id, "bot", "acme"), &[], None)
            .await
            .expect("save");
    }
    // Batches of many sessions of one tenant, through two handles at once:
    // they meet in group commits, and in one hour's ledger row.
    join_all(ids.iter().enumerate().flat_map(|(n, id)| {
        let store: &dyn CheckpointStore = if n % 2 == 0 { &store } else { &other };
        (0..3).map(move |round| async move {
            append(store, id, &[used(10 + round, 1), events(id, 0, 1).remove(0)]).await;
        })
    }))
    .await;
    let mut per_session = TokenUsage::default();
    for round in 0..3 {
        per_session.add(&usage(10 + round, 1));
    }
    let mut per_tenant = TokenUsage::default();
    for _ in &ids {
        per_tenant.add(&per_session);
    }
    let total = store
        .usage_total(&BudgetTarget::Tenant("acme".into()))
        .await
        .expect("total");
    assert_eq!(total, per_tenant);
    for id in &ids {
        assert_eq!(
            other
                .usage_total(&BudgetTarget::Session(id.clone()))
                .await
                .expect("total"),
            per_session
        );
    }
}

pub(crate) async fn a_refused_batch_adds_nothing_to_the_ledger<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (_database, store) = factory.fresh().await;
    store
        .save(&tenant_checkpoint("s", "bot", "acme"), &[], None)
        .await
        .expect("save");
    let first = store.acquire("s").await.expect("lease");
    store
        .append(
            "s",
            AppendBatch {
                lease: Some(first),
                ..batch(&[used(10, 1)])
            },
        )
        .await
        .expect("the holder writes");
    let second = store.acquire("s").await.expect("taken over");
    let fenced = store
        .append(
            "s",
            AppendBatch {
                lease: Some(first),
                ..batch(&[used(500, 50)])
            },
        )
        .await;
    assert!(matches!(fenced, Err(StoreError::Fenced { .. })), "{fenced:?}");
    let unknown = store.append("ghost", batch(&[used(700, 70)])).await;
    assert!(matches!(unknown, Err(StoreError::UnknownSession(_))), "{unknown:?}");
    // A batch whose checkpoint is another session's is refused whole.
    let mut foreign = batch(&[used(900, 90)]);
    foreign.checkpoint = Some(crate::CheckpointWrite::new(
        &tenant_checkpoint("other", "bot", "acme"),
        &[],
        None,
    ));
    assert!(store.append("s", foreign).await.is_err());
    for target in [BudgetTarget::Tenant("acme".into()), BudgetTarget::Session("s".into())] {
        assert_eq!(
            store.usage_total(&target).await.expect("total"),
            usage(10, 1),
            "{target:?}"
        );
    }
    assert_eq!(
        store
            .usage_total(&BudgetTarget::Session("ghost".into()))
            .await
            .expect("total"),
        TokenUsage::default()
    );
    let _ = second;
}

pub(crate) async fn deleting_a_session_drops_its_ledger_and_budget_but_not_its_tenants_spending<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (_database, store) = factory.fresh().await;
    for id in ["gone", "kept"] {
        store
            .save(&tenant_checkpoint(id, "bot", "acme"), &[], None)
            .await
            .expect("save");
        append(&store, id, &[used(100, 10)]).await;
    }
    let gone = BudgetTarget::Session("gone".into());
    let kept = BudgetTarget::Session("kept".into());
    let acme = BudgetTarget::Tenant("acme".into());
    for target in [&gone, &kept, &acme] {
        store.set_budget(target, Some("{}")).await.expect("budget");
    }
    let before = store.access_revision().await.expect("revision");
    assert!(store.edit_session("gone", SessionEdit::Delete).await.expect("delete"));
    assert_eq!(store.usage_total(&gone).await.expect("total"), TokenUsage::default());
    assert!(store.usage_buckets(&gone, 0).await.expect("buckets").is_empty());
    assert_eq!(store.usage_total(&kept).await.expect("total"), usage(100, 10));
    // A budget cannot be reset by deleting sessions.
    assert_eq!(store.usage_total(&acme).await.expect("total"), usage(200, 20));
    let targets: Vec<BudgetTarget> = store
        .budgets()
        .await
        .expect("budgets")
        .into_iter()
        .map(|(target, _)| target)
        .collect();
    assert_eq!(targets, [acme.clone(), kept.clone()]);
    // Nodes that cached the dropped budget reload.
    assert!(store.access_revision().await.expect("revision") > before);

    // A session made again under the id starts from nothing.
    store
        .save(&tenant_checkpoint("gone", "bot", "acme"), &[], None)
        .await
        .expect("save");
    append(&store, "gone", &[used(1, 1)]).await;
    assert_eq!(store.usage_total(&gone).await.expect("total"), usage(1, 1));
    assert_eq!(store.usage_total(&acme).await.expect("total"), usage(201, 21));
}

pub(crate) async fn running_turns_counts_the_sessions_of_a_tenant_with_a_turn_in_flight<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let other = factory.open(&database).await;
    for (id, owner) in [("a1", "acme"), ("a2", "acme"), ("a3", "acme"), ("b1", "beta")] {
        store
            .save(&tenant_checkpoint(id, "bot", owner), &[], None)
            .await
            .expect("save");
    }
    assert_eq!(store.running_turns("acme").await.expect("running"), 0);
    for id in ["a1", "a3"] {
        let turn = execution(&format!("{id}-turn"));
        store
            .save(&tenant_checkpoint(id, "bot", "acme"), &[], Some(&turn))
            .await
            .expect("start");
    }
    let turn = execution("b1-turn");
    other
        .save(&tenant_checkpoint("b1", "bot", "beta"), &[], Some(&turn))
        .await
        .expect("start");
    assert_eq!(other.running_turns("acme").await.expect("running"), 2);
    assert_eq!(store.running_turns("beta").await.expect("running"), 1);
    assert_eq!(store.running_turns("nobody").await.expect("running"), 0);
    store
        .save(&tenant_checkpoint("a1", "bot", "acme"), &[], None)
        .await
        .expect("end");
    assert_eq!(store.running_turns("acme").await.expect("running"), 1);
}

/// A `submission_queued` of `id`: work waiting in the session's queue.
fn queued(id: &str) -> Event {
    Event {
        submission_id: Some(id.into()),
        msg: EventMsg::SubmissionQueued(keel_protocol::SubmissionQueuedEvent {
            traceparent: None,
            op: keel_protocol::Op::UserInput { text: "next".into() },
            on_busy: keel_protocol::BusyPolicy::Queue,
            idempotency_key: None,
            submitted_by: None,
        }),
    }
}

/// An admission's reads at once (`AccessStore::admission`) find what the
/// reads one by one find, and its claim takes, keeps or refuses a slot as
/// `reserve_turn` does.
pub(crate) async fn an_admission_reads_what_each_ledger_read_does_and_takes_the_same_slot<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let other = factory.open(&database).await;
    store
        .create(
            &tenant_checkpoint("a1", "bot", "acme"),
            &[],
            super::encode(&[used(7, 3)]),
        )
        .await
        .expect("create");
    store
        .save(&tenant_checkpoint("a2", "bot", "acme"), &[], None)
        .await
        .expect("save");
    let last = append(&store, "a2", &[used(100, 10)]).await;
    let (a1, acme, nobody) = (
        BudgetTarget::Session("a1".into()),
        BudgetTarget::Tenant("acme".into()),
        BudgetTarget::Tenant("nobody".into()),
    );
    let after_last = last.recorded_at_ms + 1;
    let reads = [
        LedgerRead {
            target: &a1,
            since_ms: 0,
            with_total: true,
        },
        LedgerRead {
            target: &acme,
            since_ms: 0,
            with_total: false,
        },
        LedgerRead {
            target: &acme,
            since_ms: after_last - after_last % 3_600_000 + 3_600_000,
            with_total: true,
        },
        LedgerRead {
            target: &nobody,
            since_ms: 0,
            with_total: true,
        },
    ];
    let now = keel_protocol::now_ms();
    let claim = |id| SlotClaim {
        tenant: "acme",
        session_id: id,
        cap: 1,
        now_ms: now,
    };
    let admitted = store.admission(&reads, Some(claim("a1"))).await.expect("admission");
    let mut expected = Vec::new();
    for read in &reads {
        expected.push(Ledger {
            buckets: store.usage_buckets(read.target, read.since_ms).await.expect("buckets"),
            total: match read.with_total {
                true => Some(store.usage_total(read.target).await.expect("total")),
                false => None,
            },
        });
    }
    assert_eq!(admitted.ledgers, expected);
    assert_eq!(sum(&admitted.ledgers[1].buckets), usage(107, 13));
    assert!(admitted.ledgers[2].buckets.is_empty(), "no hour after the last");
    assert_eq!(admitted.ledgers[3].total, Some(TokenUsage::default()));
    assert_eq!(admitted.slot, Some(TurnSlot::Taken));
    // The same slot rules as `reserve_turn`, on any handle.
    let again = other.admission(&reads[..1], Some(claim("a1"))).await.expect("again");
    assert_eq!(again.slot, Some(TurnSlot::Held));
    let full = other.admission(&[], Some(claim("a2"))).await.expect("full");
    assert_eq!(full.slot, Some(TurnSlot::Full { held: 1 }));
    assert_eq!(store.running_turns("acme").await.expect("running"), 1);
    // Without a claim nothing is taken.
    let read_only = store.admission(&reads, None).await.expect("reads");
    assert_eq!((read_only.ledgers, read_only.slot), (expected, None));
    assert!(matches!(
        store.admission(&reads, Some(claim("ghost"))).await,
        Err(StoreError::UnknownSession(_))
    ));
}

pub(crate) async fn turn_slots_are_taken_up_to_the_cap_once_per_session_and_given_back_at_rest<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: AccessStore,
{
    let (database, store) = factory.fresh().await;
    let other = factory.open(&database).await;
    for (id, tenant) in [
        ("a1", "acme"),
        ("a2", "acme"),
        ("a3", "acme"),
        ("a4", "acme"),
        ("b1", "beta"),
    ] {
        store
            .save(&tenant_checkpoint(id, "bot", tenant), &[], None)
            .await
            .expect("save");
    }
    let now = keel_protocol::now_ms();
    let reserve = async |on: &F::Store, tenant: &str, id: &str, cap: u64, at: u64| {
        on.reserve_turn(tenant, id, cap, at).await.expect("reserve")
    };
    assert_eq!(reserve(&store, "acme", "a1", 2, now).await, TurnSlot::Taken);
    assert_eq!(
        reserve(&other, "acme", "a1", 2, now).await,
        TurnSlot::Held,
        "one per session"
    );
    assert_eq!(reserve(&other, "acme", "a2", 2, now).await, TurnSlot::Taken);
    assert_eq!(reserve(&store, "acme", "a3", 2, now).await, TurnSlot::Full { held: 2 });
    assert_eq!(
        reserve(&store, "beta", "b1", 1, now).await,
        TurnSlot::Taken,
        "tenants apart"
    );
    assert_eq!(store.running_turns("acme").await.expect("running"), 2);
    assert!(matches!(
        store.reserve_turn("acme", "nobody", 2, now).await,
        Err(StoreError::UnknownSession(_))
    ));

    // a2 has work queued: a write without a turn keeps its slot; a1 has
    // none: the same write gives its slot back.
    store.append("a2", batch(&[queued("q2")])).await.expect("queue");
    for id in ["a1", "a2"] {
        store
            .save(&tenant_checkpoint(id, "bot", "acme"), &[], None)
            .await
            .expect("rest");
    }
    assert_eq!(store.running_turns("acme").await.expect("running"), 1);
    assert_eq!(reserve(&store, "acme", "a3", 2, now).await, TurnSlot::Taken);
    assert_eq!(reserve(&store, "acme", "a4", 2, now).await, TurnSlot::Full { held: 2 });
    // A turn in flight holds a slot whether or not one was taken for it.
    let turn = execution("a4-turn");
    store
        .save(&tenant_checkpoint("a4", "bot", "acme"), &[], Some(&turn))
        .await
        .expect("start");
    assert_eq!(store.running_turns("acme").await.expect("running"), 3);
    assert_eq!(reserve(&store, "acme", "a4", 2, now).await, TurnSlot::Held);
    // Deleting a session gives its slot back.
    assert!(store.delete_session("a3").await.expect("delete"));
    assert_eq!(store.running_turns("acme").await.expect("running"), 2);

    // A slot whose work never reached the queue (its node died between)
    // stops counting after the grace; one with work queued never does.
    for id in ["g1", "g2", "g3"] {
        store
            .save(&tenant_checkpoint(id, "bot", "gamma"), &[], None)
            .await
            .expect("save");
    }
    assert_eq!(reserve(&store, "gamma", "g1", 2, now).await, TurnSlot::Taken);
    assert_eq!(reserve(&store, "gamma", "g2", 2, now).await, TurnSlot::Taken);
    store.append("g2", batch(&[queued("q-g2")])).await.expect("queue");
    assert_eq!(reserve(&store, "gamma", "g3", 2, now).await, TurnSlot::Full { held: 2 });
    let later = now + TURN_SLOT_GRACE_MS + 1;
    assert_eq!(reserve(&other, "gamma", "g3", 2, later).await, TurnSlot::Taken);
    assert_eq!(
        reserve(&other, "gamma", "g1", 2, later).await,
        TurnSlot::Full { held: 2 }
    );

    // A handle that took no slot itself, told that admissions take them
    // (as a node with a concurrency cap is), gives back one another took.
    let writer = factory.open(&database).await;
    writer.expect_turn_slots();
    writer
        .save(&tenant_checkpoint("d1", "bot", "delta"), &[], None)
        .await
        .expect("save");
    assert_eq!(reserve(&other, "delta", "d1", 1, now).await, TurnSlot::Taken);
    writer
        .save(&tenant_checkpoint("d1", "bot", "delta"), &[], None)
        .await
        .expect("rest");
    assert_eq!(store.running_turns("delta").await.expect("running"), 0);

    // An admission refused after taking a slot gives it back at once, but
    // not one a session with work queued holds.
    assert_eq!(reserve(&other, "delta", "d1", 1, now).await, TurnSlot::Taken);
    store.give_back_turn("d1").await.expect("give back");
    assert_eq!(other.running_turns("delta").await.expect("running"), 0);
    assert_eq!(reserve(&other, "delta", "d1", 1, now).await, TurnSlot::Taken);
    store.append("d1", batch(&[queued("q-d1")])).await.expect("queue");
    store.give_back_turn("d1").await.expect("give back");
    store.give_back_turn("nobody").await.expect("an unknown session");
    assert_eq!(other.running_turns("delta").await.expect("running"), 1);

    // A burst on two handles at once takes exactly the cap.
    let ids: Vec<String> = (0..12).map(|n| format!("burst-{n}")).collect();
    for id in &ids {
        store
            .save(&tenant_checkpoint(id, "bot", "burst"), &[], None)
            .await
            .expect("save");
    }
    let outcomes = join_all(ids.iter().enumerate().map(|(n, id)| {
        let on = if n % 2 == 0 { &store } else { &other };
        on.reserve_turn("burst", id, 3, now)
    }))
    .await;
    let taken = outcomes
        .iter()
        .filter(|outcome| matches!(outcome, Ok(TurnSlot::Taken)))
        .count();
    assert_eq!(taken, 3, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|outcome| matches!(outcome, Ok(TurnSlot::Taken | TurnSlot::Full { held: 3 }))),
        "{outcomes:?}"
    );
}
