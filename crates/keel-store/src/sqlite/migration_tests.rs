//! Tests of the migrations to version 7 (tenants and access) and 8 (the
//! webhook outbox), beside the other migration tests in `tests.rs`.

use rusqlite::Connection;

use super::tests::{database, open};
use crate::conformance::{checkpoint, guarded};
use crate::{
    AccessStore, CheckpointStore, CheckpointStoreExt, DeliveryFilter, SessionFilter, WebhookEndpoint, WebhookStore,
};
use keel_protocol::DEFAULT_TENANT;

/// Takes a database of version 8 back to what a version 7 build wrote.
const UNDO_VERSION_8: &str = "
    DROP TABLE webhook_deliveries; DROP TABLE webhook_endpoints;
    PRAGMA user_version = 7;
";

/// Takes a database of version 8 back to what a version 6 build wrote.
pub(super) const UNDO_VERSION_7: &str = "
    DROP TABLE webhook_deliveries; DROP TABLE webhook_endpoints;
    DROP INDEX sessions_running_by_tenant; DROP INDEX sessions_by_tenant;
    ALTER TABLE sessions DROP COLUMN tenant;
    DROP TABLE api_keys; DROP TABLE access_revision; DROP TABLE budgets; DROP TABLE usage_hours;
    PRAGMA user_version = 6;
";

#[tokio::test]
async fn a_version_6_database_gets_the_default_tenant_and_empty_access_tables() {
    guarded(async {
        let (_dir, path) = database();
        {
            let store = open(&path).await;
            for id in ["first", "second"] {
                store.save(&checkpoint(id, "bot", 0), &[], None).await.expect("create");
            }
            store.close().await;
        }
        Connection::open(&path)
            .expect("raw")
            .execute_batch(UNDO_VERSION_7)
            .expect("downgrade");
        let store = open(&path).await;
        let filter = SessionFilter {
            bot_id: None,
            tenant: Some(DEFAULT_TENANT),
        };
        let page = store.list_sessions_page(None, 10, filter).await.expect("page");
        let tenants: Vec<(&str, &str)> = page
            .sessions
            .iter()
            .map(|summary| (summary.session_id.as_str(), summary.context.tenant.as_str()))
            .collect();
        assert_eq!(tenants, [("second", DEFAULT_TENANT), ("first", DEFAULT_TENANT)]);
        assert_eq!(store.access_revision().await.expect("revision"), 0);
        assert!(store.api_keys().await.expect("keys").is_empty());
        assert!(store.budgets().await.expect("budgets").is_empty());
        assert_eq!(store.running_turns(DEFAULT_TENANT).await.expect("running"), 0);
        let version: i64 = Connection::open(&path)
            .expect("raw")
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("user_version");
        assert_eq!(version, super::schema::SCHEMA_VERSION);
    })
    .await;
}

#[tokio::test]
async fn a_version_7_database_gets_an_empty_outbox_that_its_next_events_fill() {
    guarded(async {
        let (_dir, path) = database();
        {
            let store = open(&path).await;
            store
                .save(&checkpoint("kept", "bot", 0), &[], None)
                .await
                .expect("create");
            store.close().await;
        }
        Connection::open(&path)
            .expect("raw")
            .execute_batch(UNDO_VERSION_8)
            .expect("downgrade");
        let store = open(&path).await;
        assert!(store.webhook_endpoints().await.expect("endpoints").is_empty());
        let endpoint = WebhookEndpoint {
            id: "after".into(),
            url: "https://hooks.example/after".into(),
            secrets: Vec::new(),
            event_types: vec!["error".into()],
            bot_id: None,
            tenant: None,
            description: None,
            created_at_ms: 1,
        };
        store.put_webhook_endpoint(&endpoint).await.expect("put");
        let events = crate::conformance::events("kept", 0, 7);
        store
            .append("kept", crate::conformance::batch(&events))
            .await
            .expect("append");
        let filter = DeliveryFilter {
            after_id: None,
            state: None,
            limit: 10,
        };
        assert_eq!(
            store
                .webhook_deliveries("after", &filter)
                .await
                .expect("deliveries")
                .len(),
            1
        );
        let version: i64 = Connection::open(&path)
            .expect("raw")
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("user_version");
        assert_eq!(version, super::schema::SCHEMA_VERSION);
    })
    .await;
}
