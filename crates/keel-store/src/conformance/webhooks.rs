//! The contract of [`WebhookStore`], as tests that run against any backend
//! that has it: deliveries written with their events and only for the
//! endpoints that want them, claims that hand each session's deliveries
//! out one at a time and in order, and outcomes.
//!
//! A backend's test module runs them with one line,
//! [`webhook_conformance_tests!`].

use std::collections::HashSet;

use futures::future::join_all;

use super::tenants::tenant_checkpoint;
use super::{StoreFactory, batch, events, settle};
use crate::{
    CheckpointStore, CheckpointStoreExt, DeliveryFilter, DeliveryOutcome, DeliveryState, StoreError, WebhookDelivery,
    WebhookEndpoint, WebhookSecret, WebhookStore,
};

/// Expands to one `#[tokio::test]` per webhook conformance test, in a
/// module `webhook_conformance`, each run against the factory `$factory`
/// (whose store must implement [`WebhookStore`]).
macro_rules! webhook_conformance_tests {
    ($factory:expr) => {
        /// The webhook conformance suite (`crate::conformance::webhooks`)
        /// run against this backend.
        mod webhook_conformance {
            #[allow(unused_imports)]
            use super::*;

            $crate::conformance::store_conformance_tests!(@test deliveries_are_written_with_their_events_for_the_endpoints_that_want_them, $factory);
            $crate::conformance::store_conformance_tests!(@test claims_hand_out_each_sessions_oldest_delivery_once_and_in_order, $factory);
            $crate::conformance::store_conformance_tests!(@test endpoints_are_replaced_listed_and_deleted_with_their_deliveries, $factory);
            $crate::conformance::store_conformance_tests!(@test a_turns_end_is_session_idle_too_when_its_transaction_leaves_nothing_queued, $factory);
            $crate::conformance::store_conformance_tests!(@test a_claim_takes_each_sessions_deliveries_in_order_as_a_chain_and_releases_the_rest, $factory);
        }
    };
}
pub(crate) use webhook_conformance_tests;

fn endpoint(id: &str, types: &[&str], bot_id: Option<&str>, tenant: Option<&str>) -> WebhookEndpoint {
    WebhookEndpoint {
        id: id.into(),
        url: format!("https://hooks.example/{id}"),
        secrets: vec![
            WebhookSecret {
                secret: format!("whsec_{id}new"),
                expires_at_ms: None,
            },
            WebhookSecret {
                secret: format!("whsec_{id}old"),
                expires_at_ms: Some(9_000),
            },
        ],
        event_types: types.iter().map(|kind| (*kind).to_owned()).collect(),
        bot_id: bot_id.map(str::to_owned),
        tenant: tenant.map(str::to_owned),
        description: Some(format!("endpoint {id} ✓")),
        created_at_ms: 1_000,
    }
}

async fn all_deliveries(store: &impl WebhookStore, endpoint_id: &str) -> Vec<WebhookDelivery> {
    store
        .webhook_deliveries(
            endpoint_id,
            &DeliveryFilter {
                after_id: None,
                state: None,
                limit: 1_000,
            },
        )
        .await
        .expect("deliveries")
}

/// `(session, sequence, type)` of each delivery.
fn what(deliveries: &[WebhookDelivery]) -> Vec<(String, u64, String)> {
    deliveries
        .iter()
        .map(|delivery| {
            (
                delivery.session_id.clone(),
                delivery.sequence,
                delivery.event_type.clone(),
            )
        })
        .collect()
}

pub(crate) async fn deliveries_are_written_with_their_events_for_the_endpoints_that_want_them<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: WebhookStore,
{
    let (database, store) = factory.fresh().await;
    store
        .save(&tenant_checkpoint("s", "bot-a", "acme"), &[], None)
        .await
        .expect("create");
    // Events committed before any endpoint exists are delivered to none.
    store.append("s", batch(&events("s", 0, 7))).await.expect("append");
    let wants_errors = endpoint("errors", &["error"], None, None);
    let wants_both = endpoint("both", &["error", "turn_aborted"], Some("bot-a"), Some("acme"));
    let other_bot = endpoint("other-bot", &["error", "turn_aborted"], Some("bot-b"), None);
    let other_tenant = endpoint("other-tenant", &["error"], None, Some("globex"));
    let wants_none = endpoint("approvals", &["approval_requested"], None, None);
    for endpoint in [&wants_errors, &wants_both, &other_bot, &other_tenant, &wants_none] {
        assert!(!store.put_webhook_endpoint(endpoint).await.expect("put"));
    }
    // Events 7..14: an error at 12 (sequence 12), an abort at 14.
    let receipt = store.append("s", batch(&events("s", 7, 7))).await.expect("append");
    assert_eq!(receipt.first_sequence, 8);
    assert_eq!(
        what(&all_deliveries(&store, "errors").await),
        [("s".to_owned(), 12, "error".to_owned())]
    );
    let both = all_deliveries(&store, "both").await;
    assert_eq!(
        what(&both),
        [
            ("s".to_owned(), 12, "error".to_owned()),
            ("s".to_owned(), 14, "turn_aborted".to_owned())
        ]
    );
    assert!(both.iter().all(|delivery| delivery.state == DeliveryState::Pending
        && delivery.attempts == 0
        && delivery.created_at_ms == receipt.recorded_at_ms
        && delivery.next_attempt_at_ms == receipt.recorded_at_ms
        && delivery.finished_at_ms.is_none()));
    for endpoint in ["other-bot", "other-tenant", "approvals"] {
        assert!(all_deliveries(&store, endpoint).await.is_empty(), "{endpoint}");
    }
    // A refused batch (unknown session) writes no delivery.
    let refused = store.append("ghost", batch(&events("ghost", 0, 7))).await;
    assert!(matches!(refused, Err(StoreError::UnknownSession(_))), "{refused:?}");
    assert_eq!(all_deliveries(&store, "errors").await.len(), 1);
    // Another handle (another node) sees them, and its commits queue too.
    let other = factory.open(&database).await;
    other.append("s", batch(&events("s", 14, 7))).await.expect("append");
    assert_eq!(
        what(&all_deliveries(&other, "errors").await),
        [
            ("s".to_owned(), 12, "error".to_owned()),
            ("s".to_owned(), 19, "error".to_owned())
        ]
    );
    // They outlive a restart.
    factory.close(&store).await;
    factory.close(&other).await;
    let reopened = factory.open(&database).await;
    assert_eq!(all_deliveries(&reopened, "both").await.len(), 4);
}

pub(crate) async fn claims_hand_out_each_sessions_oldest_delivery_once_and_in_order<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: WebhookStore,
{
    let (database, store) = factory.fresh().await;
    store
        .put_webhook_endpoint(&endpoint("e", &["error", "turn_aborted"], None, None))
        .await
        .expect("put");
    let sessions: Vec<String> = (0..6).map(|n| format!("s{n}")).collect();
    for session in &sessions {
        super::create(&store, session).await;
        // Three deliveries per session: sequences 5, 7 and 12.
        store
            .append(session, batch(&events(session, 0, 12)))
            .await
            .expect("append");
    }
    let now = keel_protocol::now_ms() + 1;
    // Two claimants at once take each session's oldest delivery, and each
    // only once between them.
    let other = factory.open(&database).await;
    let (a, b) = futures::join!(
        store.claim_webhook_deliveries("a", now, now + 60_000, 4, 1),
        other.claim_webhook_deliveries("b", now, now + 60_000, 4, 1)
    );
    let (a, b) = (a.expect("claim a"), b.expect("claim b"));
    assert!(a.len() <= 4 && b.len() <= 4);
    let claimed: Vec<&WebhookDelivery> = a.iter().chain(&b).collect();
    let ids: HashSet<u64> = claimed.iter().map(|delivery| delivery.id).collect();
    assert_eq!(ids.len(), claimed.len(), "a delivery claimed twice: {claimed:?}");
    let heads: HashSet<&str> = claimed.iter().map(|delivery| delivery.session_id.as_str()).collect();
    assert_eq!(
        heads.len(),
        claimed.len(),
        "two deliveries of one session at once: {claimed:?}"
    );
    assert!(claimed.iter().all(|delivery| delivery.sequence == 5), "{claimed:?}");
    // What is claimed is not claimed again while the claim holds.
    let rest = store
        .claim_webhook_deliveries("c", now, now + 60_000, 100, 1)
        .await
        .expect("claim c");
    assert_eq!(rest.len(), 6 - claimed.len());
    assert!(
        rest.iter()
            .all(|delivery| delivery.sequence == 5 && !ids.contains(&delivery.id))
    );

    // Settling: only by the claimant.
    let first = claimed[0].clone();
    let holder = if a.iter().any(|delivery| delivery.id == first.id) {
        "a"
    } else {
        "b"
    };
    let delivered = DeliveryOutcome::Delivered { status: 204 };
    assert!(
        !store
            .settle_webhook_delivery(first.id, "intruder", now, &delivered)
            .await
            .expect("settle")
    );
    assert!(
        store
            .settle_webhook_delivery(first.id, holder, now, &delivered)
            .await
            .expect("settle")
    );
    assert!(
        !store
            .settle_webhook_delivery(first.id, holder, now, &delivered)
            .await
            .expect("settle twice")
    );
    // Its session's next delivery is now the one due.
    let next = store
        .claim_webhook_deliveries("a", now, now + 60_000, 100, 1)
        .await
        .expect("claim");
    assert_eq!(what(&next), [(first.session_id.clone(), 7, "turn_aborted".to_owned())]);
    // A retry puts it back for later; until then its session waits.
    let retry = DeliveryOutcome::Retry {
        status: Some(503),
        error: "x".repeat(2_000),
        next_attempt_at_ms: now + 1_000,
    };
    assert!(
        store
            .settle_webhook_delivery(next[0].id, "a", now, &retry)
            .await
            .expect("settle")
    );
    assert!(
        store
            .claim_webhook_deliveries("a", now + 999, now + 60_000, 100, 1)
            .await
            .expect("claim")
            .is_empty()
    );
    let again = store
        .claim_webhook_deliveries("b", now + 1_000, now + 60_000, 100, 1)
        .await
        .expect("claim");
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].id, again[0].attempts, again[0].last_status),
        (next[0].id, 1, Some(503))
    );
    assert_eq!(
        again[0].last_error.as_deref().map(str::len),
        Some(500),
        "errors are clipped"
    );
    // A claim that ran out (its claimant died) is taken over.
    let taken_over = store
        .claim_webhook_deliveries("d", now + 60_001, now + 120_000, 100, 1)
        .await
        .expect("claim");
    assert!(
        taken_over.iter().any(|delivery| delivery.id == next[0].id),
        "{taken_over:?}"
    );
    assert!(
        !store
            .settle_webhook_delivery(next[0].id, "b", now, &delivered)
            .await
            .expect("late settle")
    );
    // A failed delivery lets its session's next one go.
    let failed = DeliveryOutcome::Failed {
        status: None,
        error: "connection refused".into(),
    };
    assert!(
        store
            .settle_webhook_delivery(next[0].id, "d", now + 60_002, &failed)
            .await
            .expect("fail")
    );
    let after_failure = store
        .claim_webhook_deliveries("d", now + 60_003, now + 120_000, 100, 1)
        .await
        .expect("claim");
    assert!(
        after_failure
            .iter()
            .any(|delivery| delivery.session_id == first.session_id && delivery.sequence == 12)
    );
    let failures = store
        .webhook_deliveries(
            "e",
            &DeliveryFilter {
                after_id: None,
                state: Some(DeliveryState::Failed),
                limit: 10,
            },
        )
        .await
        .expect("failed");
    assert_eq!(failures.len(), 1);
    assert_eq!(
        (
            failures[0].attempts,
            failures[0].finished_at_ms,
            failures[0].last_error.as_deref()
        ),
        (2, Some(now + 60_002), Some("connection refused"))
    );
    // Paging by id, and pruning what finished.
    let everything = all_deliveries(&store, "e").await;
    assert_eq!(everything.len(), 18);
    let page = store
        .webhook_deliveries(
            "e",
            &DeliveryFilter {
                after_id: Some(everything[9].id),
                state: None,
                limit: 5,
            },
        )
        .await
        .expect("page");
    assert_eq!(page, everything[10..15]);
    assert_eq!(store.prune_webhook_deliveries(now + 60_003).await.expect("prune"), 2);
    assert_eq!(all_deliveries(&store, "e").await.len(), 16);
}

pub(crate) async fn endpoints_are_replaced_listed_and_deleted_with_their_deliveries<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: WebhookStore,
{
    let (_database, store) = factory.fresh().await;
    let first = endpoint("one", &["error"], None, None);
    let second = endpoint("two", &["turn_aborted", "error"], Some("bot"), Some("default"));
    assert!(!store.put_webhook_endpoint(&first).await.expect("put"));
    assert!(!store.put_webhook_endpoint(&second).await.expect("put"));
    assert_eq!(
        store.webhook_endpoints().await.expect("list"),
        [first.clone(), second.clone()]
    );
    let mut rotated = first.clone();
    rotated.secrets.insert(
        0,
        WebhookSecret {
            secret: "whsec_newest".into(),
            expires_at_ms: None,
        },
    );
    rotated.url = "https://hooks.example/moved".into();
    assert!(store.put_webhook_endpoint(&rotated).await.expect("replace"));
    assert_eq!(store.webhook_endpoints().await.expect("list"), [rotated, second]);

    super::create(&store, "s").await;
    super::create(&store, "t").await;
    join_all(["s", "t"].map(|session| store.append(session, batch(&events(session, 0, 7)))))
        .await
        .into_iter()
        .for_each(|appended| {
            appended.expect("append");
        });
    assert_eq!(all_deliveries(&store, "one").await.len(), 2);
    assert_eq!(all_deliveries(&store, "two").await.len(), 4);
    // A deleted session's deliveries go with it.
    store.delete_session("t").await.expect("delete");
    assert_eq!(
        what(&all_deliveries(&store, "one").await),
        [("s".to_owned(), 5, "error".to_owned())]
    );
    // A deleted endpoint's too, and it gets no more.
    assert!(store.delete_webhook_endpoint("one").await.expect("delete"));
    assert!(!store.delete_webhook_endpoint("one").await.expect("delete again"));
    assert!(all_deliveries(&store, "one").await.is_empty());
    store.append("s", batch(&events("s", 7, 7))).await.expect("append");
    assert!(all_deliveries(&store, "one").await.is_empty());
    assert_eq!(all_deliveries(&store, "two").await.len(), 4);
    assert_eq!(store.webhook_endpoints().await.expect("list").len(), 1);
}

pub(crate) async fn a_turns_end_is_session_idle_too_when_its_transaction_leaves_nothing_queued<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: WebhookStore,
{
    use keel_protocol::{BusyPolicy, Event, EventMsg, Op, SubmissionQueuedEvent};
    let (_database, store) = factory.fresh().await;
    store
        .save(&tenant_checkpoint("s", "bot-a", "acme"), &[], None)
        .await
        .expect("create");
    let idle = endpoint("idle", &["turn_aborted", "session_idle"], None, None);
    let aborts = endpoint("aborts", &["turn_aborted"], None, None);
    let other_bot = endpoint("other-bot", &["session_idle"], Some("bot-b"), None);
    for endpoint in [&idle, &aborts, &other_bot] {
        assert!(!store.put_webhook_endpoint(endpoint).await.expect("put"));
    }
    // Events 0..7 end with an abort at sequence 7, nothing queued.
    store.append("s", batch(&events("s", 0, 7))).await.expect("append");
    // q1 is queued at 8; the abort at 15 leaves it queued: not idle.
    let queued = Event {
        submission_id: Some("q1".into()),
        msg: EventMsg::SubmissionQueued(SubmissionQueuedEvent {
            traceparent: None,
            op: Op::UserInput { text: "next".into() },
            on_busy: BusyPolicy::Queue,
            idempotency_key: None,
            submitted_by: None,
        }),
    };
    store.append("s", batch(&[queued])).await.expect("queue");
    store.append("s", batch(&events("s", 7, 7))).await.expect("append");
    // An abort (16) whose own write takes q1 off the queue: idle, as the
    // transaction leaves the queue.
    settle(&store, "s", 13, "q1").await;
    let s = |sequence: u64, kind: &str| ("s".to_owned(), sequence, kind.to_owned());
    assert_eq!(
        what(&all_deliveries(&store, "idle").await),
        [
            s(7, "turn_aborted"),
            s(7, "session_idle"),
            s(15, "turn_aborted"),
            s(16, "turn_aborted"),
            s(16, "session_idle"),
        ]
    );
    assert_eq!(
        what(&all_deliveries(&store, "aborts").await),
        [s(7, "turn_aborted"), s(15, "turn_aborted"), s(16, "turn_aborted")]
    );
    assert!(all_deliveries(&store, "other-bot").await.is_empty());
}

pub(crate) async fn a_claim_takes_each_sessions_deliveries_in_order_as_a_chain_and_releases_the_rest<F>(factory: &F)
where
    F: StoreFactory,
    F::Store: WebhookStore,
{
    let (database, store) = factory.fresh().await;
    store
        .put_webhook_endpoint(&endpoint("e", &["error", "turn_aborted"], None, None))
        .await
        .expect("put");
    // Six deliveries per session: sequences 5, 7, 12, 14, 19 and 21.
    for session in ["s0", "s1", "s2"] {
        super::create(&store, session).await;
        store
            .append(session, batch(&events(session, 0, 21)))
            .await
            .expect("append");
    }
    let now = keel_protocol::now_ms() + 1;
    // Two pairs, each its four oldest, in order.
    let claimed = store
        .claim_webhook_deliveries("a", now, now + 60_000, 2, 4)
        .await
        .expect("claim");
    let mut chains: std::collections::BTreeMap<&str, Vec<u64>> = std::collections::BTreeMap::new();
    for delivery in &claimed {
        chains
            .entry(delivery.session_id.as_str())
            .or_default()
            .push(delivery.sequence);
    }
    assert_eq!(chains.len(), 2, "{claimed:?}");
    assert!(chains.values().all(|chain| chain == &[5, 7, 12, 14]), "{chains:?}");
    // Nobody else gets any of a chain, nor the deliveries after it while
    // its head is pending: only the third session's chain is left.
    let other = factory.open(&database).await;
    let rest = other
        .claim_webhook_deliveries("b", now, now + 60_000, 100, 100)
        .await
        .expect("claim");
    let taken: HashSet<&str> = chains.keys().copied().collect();
    assert_eq!(rest.len(), 6, "{rest:?}");
    assert!(
        rest.iter()
            .all(|delivery| !taken.contains(delivery.session_id.as_str()))
    );
    // The first is delivered; the rest of its chain is let go, unattempted.
    let (session, _) = chains.iter().next().expect("a chain");
    let mine: Vec<&WebhookDelivery> = claimed
        .iter()
        .filter(|delivery| delivery.session_id == *session)
        .collect();
    let delivered = DeliveryOutcome::Delivered { status: 200 };
    assert!(
        store
            .settle_webhook_delivery(mine[0].id, "a", now, &delivered)
            .await
            .expect("settle")
    );
    let rest_ids: Vec<u64> = mine[1..].iter().map(|delivery| delivery.id).collect();
    assert_eq!(
        store
            .release_webhook_deliveries(&rest_ids, "intruder")
            .await
            .expect("release"),
        0
    );
    assert_eq!(
        store.release_webhook_deliveries(&rest_ids, "a").await.expect("release"),
        3
    );
    // Released, they are claimed again from the next one, unattempted.
    let again = other
        .claim_webhook_deliveries("b", now, now + 60_000, 100, 100)
        .await
        .expect("claim");
    assert_eq!(
        again.iter().map(|delivery| delivery.sequence).collect::<Vec<_>>(),
        [7, 12, 14, 19, 21]
    );
    assert!(
        again
            .iter()
            .all(|delivery| delivery.session_id == *session && delivery.attempts == 0)
    );
}
