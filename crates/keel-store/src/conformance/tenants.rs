//! Conformance tests of sessions' tenants: stored with the session when it
//! is made, reported by summaries and loads, and filtered on by listings.

use super::{StoreFactory, checkpoint, encode, page_ids};
use crate::{
    Checkpoint, CheckpointStore, CheckpointStoreExt, SessionFilter, SessionListPage, StoreError, session_usage,
};
use keel_protocol::{Event, EventMsg, TokenUsage, TokenUsageEvent};

/// A checkpoint of `session_id` for `bot_id` in `tenant`.
pub(crate) fn tenant_checkpoint(session_id: &str, bot_id: &str, tenant: &str) -> Checkpoint {
    let mut checkpoint = checkpoint(session_id, bot_id, 0);
    checkpoint.session_context.tenant = tenant.into();
    checkpoint
}

/// Every session `filter` admits, walking pages of `limit` by creation or
/// by activity.
async fn walk(store: &dyn CheckpointStore, filter: SessionFilter<'_>, limit: usize, by_activity: bool) -> Vec<String> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page: SessionListPage = if by_activity {
            store.list_sessions_by_activity(cursor.as_deref(), limit, filter).await
        } else {
            store.list_sessions_page(cursor.as_deref(), limit, filter).await
        }
        .expect("page");
        assert!(page.sessions.len() <= limit);
        if let Some(tenant) = filter.tenant {
            assert!(page.sessions.iter().all(|summary| summary.context.tenant == tenant));
        }
        let next = page.next_cursor.clone();
        seen.extend(page_ids(page));
        match next {
            Some(next) => cursor = Some(next),
            None => return seen,
        }
    }
}

fn tenant(tenant: &str) -> SessionFilter<'_> {
    SessionFilter {
        bot_id: None,
        tenant: Some(tenant),
    }
}

pub(crate) async fn sessions_keep_the_tenant_they_were_made_for_and_are_listed_by_tenant_page_by_page(
    factory: &impl StoreFactory,
) {
    let (_database, store) = factory.fresh().await;
    let made = [
        ("a1", "bot-x", "acme"),
        ("b1", "bot-x", "beta"),
        ("a2", "bot-y", "acme"),
        ("d1", "bot-x", keel_protocol::DEFAULT_TENANT),
        ("a3", "bot-x", "acme"),
        ("b2", "bot-y", "beta"),
        ("a4", "bot-x", "acme"),
    ];
    for (id, bot, owner) in made {
        if id == "a2" {
            // Made by `create`, the others by `save`: both store the tenant.
            store
                .create(&tenant_checkpoint(id, bot, owner), &[], Vec::new())
                .await
                .expect("create");
        } else {
            store
                .save(&tenant_checkpoint(id, bot, owner), &[], None)
                .await
                .expect("save");
        }
    }
    for (id, _, owner) in made {
        let summary = store.session_summary(id).await.expect("summary").expect(id);
        assert_eq!(summary.context.tenant, owner, "{id}");
        let state = store.load(id).await.expect("load").expect(id);
        assert_eq!(state.checkpoint.session_context.tenant, owner, "{id}");
    }
    for by_activity in [false, true] {
        assert_eq!(
            walk(&store, tenant("acme"), 2, by_activity).await,
            ["a4", "a3", "a2", "a1"],
            "by activity: {by_activity}"
        );
        assert_eq!(walk(&store, tenant("beta"), 1, by_activity).await, ["b2", "b1"]);
        assert_eq!(
            walk(&store, tenant("nobody"), 2, by_activity).await,
            Vec::<String>::new()
        );
        let acme_x = SessionFilter {
            bot_id: Some("bot-x"),
            tenant: Some("acme"),
        };
        assert_eq!(walk(&store, acme_x, 1, by_activity).await, ["a4", "a3", "a1"]);
        let beta_x = SessionFilter {
            bot_id: Some("bot-x"),
            tenant: Some("beta"),
        };
        assert_eq!(walk(&store, beta_x, 3, by_activity).await, ["b1"]);
        assert_eq!(
            walk(&store, SessionFilter::bot(Some("bot-y")), 1, by_activity).await,
            ["b2", "a2"]
        );
        assert_eq!(walk(&store, SessionFilter::default(), 3, by_activity).await.len(), 7);
    }
    // A page's cursor is a position, not a filter: another tenant's cursor
    // only says where to start.
    let first = store.list_sessions_page(None, 1, tenant("acme")).await.expect("page");
    let cursor = first.next_cursor.expect("more");
    let beta = store
        .list_sessions_page(Some(&cursor), 10, tenant("beta"))
        .await
        .expect("page");
    assert_eq!(page_ids(beta), ["b2", "b1"]);
    assert!(matches!(
        store.list_sessions_page(Some("x"), 2, tenant("acme")).await,
        Err(StoreError::Invalid(_))
    ));

    // A later checkpoint naming another tenant does not move the session.
    store
        .save(&tenant_checkpoint("a1", "bot-x", "beta"), &[], None)
        .await
        .expect("save");
    let summary = store.session_summary("a1").await.expect("summary").expect("a1");
    assert_eq!(summary.context.tenant, "acme");
    let state = store.load("a1").await.expect("load").expect("a1");
    assert_eq!(state.checkpoint.session_context.tenant, "acme");
    assert_eq!(walk(&store, tenant("beta"), 10, false).await, ["b2", "b1"]);
}

pub(crate) async fn usage_is_summed_per_session_of_a_filter(factory: &impl StoreFactory) {
    let (_database, store) = factory.fresh().await;
    for (id, bot, owner) in [("a1", "x", "acme"), ("a2", "y", "acme"), ("b1", "x", "beta")] {
        store
            .save(&tenant_checkpoint(id, bot, owner), &[], None)
            .await
            .expect("save");
        let used = Event {
            submission_id: None,
            msg: EventMsg::TokenUsage(TokenUsageEvent {
                turn_id: format!("{id}-turn"),
                step: 1,
                usage: TokenUsage {
                    input_tokens: 10,
                    output_tokens: 1,
                    ..TokenUsage::default()
                },
                session_total: TokenUsage::default(),
            }),
        };
        store
            .append(
                id,
                crate::AppendBatch {
                    lease: None,
                    events: encode(&[used]),
                    checkpoint: None,
                },
            )
            .await
            .expect("append");
    }
    let ids = |found: Vec<crate::SessionUsage>| found.into_iter().map(|line| line.session_id).collect::<Vec<_>>();
    let acme = session_usage(&store, tenant("acme"), Some(0)).await.expect("usage");
    assert_eq!(ids(acme), ["a2", "a1"]);
    let acme_x = SessionFilter {
        bot_id: Some("x"),
        tenant: Some("acme"),
    };
    assert_eq!(
        ids(session_usage(&store, acme_x, Some(0)).await.expect("usage")),
        ["a1"]
    );
    let bot_x = session_usage(&store, SessionFilter::bot(Some("x")), Some(0))
        .await
        .expect("usage");
    assert_eq!(ids(bot_x), ["b1", "a1"]);
}
